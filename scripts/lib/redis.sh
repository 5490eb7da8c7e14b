# Redis peers for the bench scripts (source it after scripts/lib/cluster.sh
# and setting $work): Debian's redis-server and redis-benchmark, installed
# if missing, a throw-away server per run on a free loopback port.
redis_installed() {
  command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null
}

redis_install() {
  redis_installed && return 0
  local sudo=""; [ "$(id -u)" != 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends redis-server redis-tools >/dev/null
}

# redis_incr_bench FSYNC CLIENTS REQUESTS: requests/s of `redis-benchmark
# -t incr`. FSYNC `no`: no persistence (plain INCR); `always`: the
# append-only file with appendfsync always, so every write is fsync'd
# before the reply (durable per call, like strict mode), in $work (on disk).
redis_incr_bench() {
  local fsync=$1 clients=$2 requests=$3 port pid rps
  redis_install
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
  local dir="$work/redis-$fsync"
  mkdir -p "$dir"
  if [ "$fsync" = always ]; then
    set -- --appendonly yes --appendfsync always
  else
    set -- --appendonly no
  fi
  redis-server --port "$port" --bind 127.0.0.1 --save "" --dir "$dir" --daemonize no "$@" > "$dir/redis.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 200); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.05
  done
  rps=$(redis-benchmark -p "$port" -t incr -c "$clients" -n "$requests" -q 2>&1 | tr "\r" "\n" \
    | sed -n 's/^INCR: \([0-9.]*\) requests per second.*/\1/p' | tail -1)
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  echo "${rps:-0}"
}
