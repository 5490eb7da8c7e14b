# Shared by the perf and bench scripts (source it after setting $work):
# child processes recorded in $pids are stopped in reverse order at exit
# (nodes first, so they release their ids in Consul; the Consul server
# last) and $work is removed; start_consul starts the in-repo Consul test
# server and sets $consul to its address.
pids=()
stop_children() {
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[$i]}" 2>/dev/null || true
    wait "${pids[$i]}" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap stop_children EXIT

start_consul() { # [binary directory, default target/release]
  local dir="${1:-target/release}"
  # consul_args (an array, optional): more flags, e.g. the latency model.
  "$dir/consul-testserver" --listen 127.0.0.1:0 ${consul_args[@]+"${consul_args[@]}"} > "$work/consul.out" &
  pids+=($!)
  for _ in $(seq 1 200); do
    grep -q "listening on" "$work/consul.out" 2>/dev/null && break
    sleep 0.02
  done
  consul=$(sed -n 's/^listening on //p' "$work/consul.out" | head -1)
  [ -n "$consul" ] || { echo "consul-testserver did not start" >&2; exit 1; }
}

# wait_passing N: waits (up to 30 s) until Consul lists N passing idgen
# instances; fails the script if they never are.
wait_passing() {
  local n=
  for _ in $(seq 1 300); do
    n=$(curl -fs "http://$consul/v1/health/service/idgen?passing" | python3 -c "import json,sys; print(len(json.load(sys.stdin)))" || true)
    [ "$n" = "$1" ] && return 0
    sleep 0.1
  done
  echo "Consul lists ${n:-no} passing idgen instances, not $1" >&2
  exit 1
}

# The [segment], [lease] and [strict] sections of the perf scripts' nodes
# (large steps and blocks: the store's round trips are not what they time).
perf_mode_sections() {
  cat <<TOML
[segment]
enabled = true
auto_create = true
default_step = 1000000
max_step = 100000000
[lease]
enabled = true
block = 10000000
[strict]
enabled = true
TOML
}
