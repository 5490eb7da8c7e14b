"""A small idgen client in Python (grpcio): Consul discovery, retry on
another node, prefetching, formatted IDs, TLS.

Consul is reached the way the consul CLI does it, from Consul's own
environment variables (flags win): CONSUL_HTTP_ADDR (host:port, http:// or
https://), CONSUL_HTTP_SSL, CONSUL_HTTP_TOKEN, CONSUL_HTTP_TOKEN_FILE (wins
over CONSUL_HTTP_TOKEN when it holds a token), CONSUL_CACERT,
CONSUL_CLIENT_CERT / CONSUL_CLIENT_KEY, CONSUL_TLS_SERVER_NAME and
CONSUL_HTTP_SSL_VERIFY=false (checks off, with a warning). The token goes
in the X-Consul-Token header.

Stubs are generated from the repository's proto, not committed:

    python -m grpc_tools.protoc -I proto --python_out=gen --grpc_python_out=gen \
        proto/idgen/v1/idgen.proto

then put `gen` on PYTHONPATH (``from idgen.v1 import idgen_pb2``).

Run ``python examples/python/idgen_client.py --help`` for the demo.
"""

import argparse
import collections
import json
import os
import random
import ssl
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import grpc

from idgen.v1 import idgen_pb2, idgen_pb2_grpc

RETRYABLE = {grpc.StatusCode.UNAVAILABLE}

# The demo's --mode names.
MODES = {
    "snowflake": idgen_pb2.MODE_SNOWFLAKE,
    "segment": idgen_pb2.MODE_SEGMENT,
    "lease": idgen_pb2.MODE_LEASE,
    "strict": idgen_pb2.MODE_STRICT,
}


def _env_bool(name, env):
    value = env.get(name, "")
    if value == "":
        return None
    if value in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if value in ("0", "f", "F", "false", "FALSE", "False"):
        return False
    raise ValueError("%s=%r is not a boolean: use true or false" % (name, value))


class _NamedContext(ssl.SSLContext):
    """Checks the agent's certificate against `server_name` instead of the
    URL's host (CONSUL_TLS_SERVER_NAME)."""

    server_name = None

    def wrap_socket(self, sock, *args, server_hostname=None, **kwargs):
        return super().wrap_socket(
            sock, *args, server_hostname=self.server_name or server_hostname, **kwargs)


class ConsulSettings:
    """Where Consul is and how to talk to it, read once from Consul's
    variables (`env`, default os.environ); arguments given win."""

    def __init__(self, address=None, token=None, env=None):
        env = os.environ if env is None else env
        ssl_on = _env_bool("CONSUL_HTTP_SSL", env) or False
        raw = address or env.get("CONSUL_HTTP_ADDR") or "127.0.0.1:8500"
        scheme, sep, rest = raw.partition("://")
        if not sep:
            scheme, rest = "http", raw
        if scheme not in ("http", "https"):
            raise ValueError("Consul address %r: use host:port, http:// or https://" % raw)
        if ssl_on and not address:
            scheme = "https"
        self.address = "%s://%s" % (scheme, rest)
        self.token = token or self._token(env)
        self.context = None
        if scheme == "https":
            self.context = self._tls(env)

    @staticmethod
    def _token(env):
        path = env.get("CONSUL_HTTP_TOKEN_FILE")
        if path:
            with open(path) as f:
                token = f.read().strip()
            if token:
                return token
        return env.get("CONSUL_HTTP_TOKEN") or None

    @staticmethod
    def _tls(env):
        ctx = _NamedContext(ssl.PROTOCOL_TLS_CLIENT)
        name = env.get("CONSUL_TLS_SERVER_NAME")
        if name:
            # Consul drops a :port suffix.
            host, _, port = name.rpartition(":")
            ctx.server_name = host if host and port.isdigit() else name
        if _env_bool("CONSUL_HTTP_SSL_VERIFY", env) is False:
            print("warning: CONSUL_HTTP_SSL_VERIFY=false: the Consul agent's "
                  "certificate is NOT checked", file=sys.stderr)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif env.get("CONSUL_CACERT"):
            ctx.load_verify_locations(cafile=env["CONSUL_CACERT"])
        else:
            ctx.load_default_certs()
        cert, key = env.get("CONSUL_CLIENT_CERT"), env.get("CONSUL_CLIENT_KEY")
        if bool(cert) != bool(key):
            raise ValueError("set both CONSUL_CLIENT_CERT and CONSUL_CLIENT_KEY, or neither")
        if cert:
            ctx.load_cert_chain(cert, key)
        return ctx


def discover(consul=None, service="idgen", token=None, datacenter=None, tag=None,
             timeout=5.0):
    """The passing instances of `service` as "host:port" strings, from
    Consul's /v1/health/service/<service>?passing. `consul` is an address
    or a ConsulSettings (default: from Consul's variables)."""
    settings = consul if isinstance(consul, ConsulSettings) else ConsulSettings(consul, token)
    consul, token = settings.address, settings.token
    query = [("passing", "")]
    if datacenter:
        query.append(("dc", datacenter))
    if tag:
        query.append(("tag", tag))
    url = "%s/v1/health/service/%s?%s" % (
        consul.rstrip("/"),
        urllib.parse.quote(service, safe=""),
        urllib.parse.urlencode(query).replace("passing=", "passing"),
    )
    request = urllib.request.Request(url)
    if token:
        # The token goes in a header, never in the URL (it would be logged).
        request.add_header("X-Consul-Token", token)
    try:
        with urllib.request.urlopen(request, timeout=timeout,
                                    context=settings.context) as answer:
            entries = json.load(answer)
    except urllib.error.HTTPError as e:
        if e.code == 403:
            hint = ("the token has no service:read" if token else
                    "no ACL token: set CONSUL_HTTP_TOKEN or CONSUL_HTTP_TOKEN_FILE")
            raise PermissionError("Consul refused to list %r (403): %s" % (service, hint))
        raise
    nodes = []
    for e in entries:
        host = e["Service"].get("Address") or e["Node"]["Address"]
        nodes.append("%s:%d" % (host, e["Service"]["Port"]))
    return nodes


class Client:
    """Spreads calls over `nodes`; on UNAVAILABLE (or a node that cannot be
    reached) sets the node aside and retries another one, within
    `deadline` seconds. Strict calls are not retried once sent: a strict
    value must be issued once per logical call."""

    def __init__(self, nodes, deadline=2.0, set_aside=1.0, credentials=None,
                 server_name=None):
        """`credentials`: grpc.ssl_channel_credentials(...) to dial the
        nodes over TLS (see tls_credentials); `server_name`: the name
        their certificates carry when discovery gives IP addresses."""
        if not nodes:
            raise ValueError("no idgen nodes: check the Consul service name")
        self.deadline = deadline
        self.set_aside = set_aside
        self._lock = threading.Lock()
        self._aside = {}
        options = [("grpc.ssl_target_name_override", server_name)] if server_name else []

        def channel(n):
            if credentials is None:
                return grpc.insecure_channel(n)
            return grpc.secure_channel(n, credentials, options=options)

        self._stubs = {n: idgen_pb2_grpc.IdGenStub(channel(n)) for n in nodes}

    def _order(self):
        now = time.monotonic()
        with self._lock:
            nodes = list(self._stubs)
            random.shuffle(nodes)
            # Nodes set aside go last, not away: better than failing.
            nodes.sort(key=lambda n: self._aside.get(n, 0) > now)
        return nodes

    def _call(self, method, request, strict=False):
        end = time.monotonic() + self.deadline
        last = None
        attempt = 0
        while time.monotonic() < end:
            for node in self._order():
                left = end - time.monotonic()
                if left <= 0:
                    break
                try:
                    return getattr(self._stubs[node], method)(request, timeout=left)
                except grpc.RpcError as e:
                    last = e
                    if e.code() not in RETRYABLE:
                        raise
                    with self._lock:
                        self._aside[node] = time.monotonic() + self.set_aside
                    # A strict request may have reached the node: only a
                    # refused connection is safe to send again.
                    if strict and "connect" not in (e.details() or "").lower():
                        raise
                attempt += 1
                time.sleep(min(0.1, 0.005 * 2 ** attempt) * random.random())
        raise last or TimeoutError("no idgen node answered within the deadline")

    def gen_id(self, mode=idgen_pb2.MODE_SNOWFLAKE, tag=""):
        req = idgen_pb2.GenIdRequest(mode=mode, tag=tag)
        return self._call("GenId", req, strict=mode == idgen_pb2.MODE_STRICT).id

    def gen_ids(self, count, mode=idgen_pb2.MODE_SNOWFLAKE, tag=""):
        req = idgen_pb2.GenIdsRequest(mode=mode, tag=tag, count=count)
        return list(self._call("GenIds", req, strict=mode == idgen_pb2.MODE_STRICT).ids)


    def gen_formatted(self, format_name, params=None, count=1):
        """`count` formatted IDs (strings) of a format defined on the nodes.
        Never prefetched: periods and rules decide each ID when it is
        taken. Retried on another node like gen_ids: an answer lost on
        the way is a gap, never a repeat."""
        req = idgen_pb2.GenFormattedRequest(format=format_name, params=params or {},
                                            count=count)
        return list(self._call("GenFormatted", req).ids)

    def parse_formatted(self, format_name, formatted_id):
        """The fields of a formatted ID (a ParseFormattedResponse)."""
        req = idgen_pb2.ParseFormattedRequest(format=format_name, id=formatted_id)
        return self._call("ParseFormatted", req)

    def format_counter(self, format_name, params=None):
        """A counter's durable record (GetFormatCounterResponse): `period`
        is the period's START (seconds on the format zone's wall clock
        since 1970-01-01T00:00), `last` the last value any node may have
        used in it."""
        req = idgen_pb2.GetFormatCounterRequest(format=format_name, params=params or {})
        return self._call("GetFormatCounter", req)


def tls_credentials(ca_file, cert_file=None, key_file=None):
    """Credentials to dial idgen nodes over TLS: the CA that signed their
    certificates, and a client certificate and key for nodes with
    server.tls.client_required."""
    def read(path):
        with open(path, "rb") as f:
            return f.read()
    if bool(cert_file) != bool(key_file):
        raise ValueError("give both the client certificate and its key, or neither")
    return grpc.ssl_channel_credentials(
        root_certificates=read(ca_file),
        private_key=read(key_file) if key_file else None,
        certificate_chain=read(cert_file) if cert_file else None,
    )


class Prefetcher:
    """IDs of one (mode, tag) served from a local buffer, refilled in the
    background when fewer than `low_water` remain (one refill at a time).
    Never for strict mode. Snowflake IDs older than `max_age` seconds are
    dropped (gaps, never repeats)."""

    def __init__(self, client, mode=idgen_pb2.MODE_SNOWFLAKE, tag="", batch=1000,
                 low_water=500, max_age=5.0):
        if mode == idgen_pb2.MODE_STRICT:
            raise ValueError("strict values cannot be prefetched")
        self.client, self.mode, self.tag = client, mode, tag
        self.batch, self.low_water, self.max_age = batch, low_water, max_age
        self._ids = collections.deque()
        self._fetched = 0.0
        self._cond = threading.Condition()
        self._refilling = False
        self._error = None

    def _refill(self):
        try:
            ids = self.client.gen_ids(self.batch, self.mode, self.tag)
            error = None
        except Exception as e:  # handed to the waiting callers
            ids, error = [], e
        with self._cond:
            if self.mode == idgen_pb2.MODE_SNOWFLAKE and self._ids and \
                    time.monotonic() - self._fetched > self.max_age:
                self._ids.clear()
            self._ids.extend(ids)
            if ids:
                self._fetched = time.monotonic()
            self._error = error
            self._refilling = False
            self._cond.notify_all()

    def _start_refill(self):
        if not self._refilling:
            self._refilling = True
            threading.Thread(target=self._refill, daemon=True).start()

    def next_id(self):
        end = time.monotonic() + self.client.deadline
        with self._cond:
            while True:
                if self._ids and self.mode == idgen_pb2.MODE_SNOWFLAKE and \
                        time.monotonic() - self._fetched > self.max_age:
                    self._ids.clear()
                if self._ids:
                    value = self._ids.popleft()
                    if len(self._ids) < self.low_water:
                        self._start_refill()
                    return value
                self._error = None
                self._start_refill()
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError("no IDs within the deadline")
                self._cond.wait(left)
                if not self._ids and self._error is not None:
                    raise self._error


def main():
    p = argparse.ArgumentParser(description="idgen Python example client")
    p.add_argument("--consul", default=None,
                   help="Consul HTTP address [default: CONSUL_HTTP_ADDR, else 127.0.0.1:8500]")
    p.add_argument("--service", default="idgen")
    p.add_argument("--token", default=None,
                   help="Consul ACL token [default: CONSUL_HTTP_TOKEN_FILE, CONSUL_HTTP_TOKEN]")
    p.add_argument("--also", action="append", default=[],
                   help="extra node addresses tried too (e.g. one that is down)")
    p.add_argument("--count", type=int, default=5000, help="prefetched IDs to take")
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--mode", action="append", default=[], metavar="MODE[:TAG]",
                   help="also take 3 IDs of this mode: segment:TAG, lease, strict:NAMESPACE/KEY "
                        "(repeat for several)")
    p.add_argument("--format", default=None,
                   help="also take --count formatted IDs of this format (and parse one)")
    p.add_argument("--param", action="append", default=[],
                   help="a parameter of --format, name=value (repeat for several)")
    p.add_argument("--ca", default=None, help="CA (PEM) of the nodes' TLS certificates")
    p.add_argument("--cert", default=None, help="client certificate (PEM) for the nodes")
    p.add_argument("--key", default=None, help="private key (PEM) of --cert")
    p.add_argument("--tls-server-name", default=None,
                   help="name the nodes' certificates carry, when not their address")
    a = p.parse_args()

    nodes = discover(ConsulSettings(a.consul, a.token), a.service)
    credentials = tls_credentials(a.ca, a.cert, a.key) if a.ca else None
    client = Client(a.also + nodes, credentials=credentials, server_name=a.tls_server_name)
    single = [client.gen_id() for _ in range(50)]
    prefetch = Prefetcher(client, batch=500, low_water=250)
    got = []
    lock = threading.Lock()

    def work(n):
        mine = [prefetch.next_id() for _ in range(n)]
        with lock:
            got.extend(mine)

    threads = [threading.Thread(target=work, args=(a.count // a.threads,)) for _ in range(a.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = single + got
    workers = sorted({(i >> 12) & 0x1F for i in every})
    summary = {
        "nodes": len(nodes),
        "ids": len(every),
        "distinct": len(set(every)),
        "workers": workers,
    }
    ok = len(set(every)) == len(every)
    if a.mode:
        summary["modes"] = {}
    for spec in a.mode:
        name, _, tag = spec.partition(":")
        mode = MODES.get(name)
        if mode is None:
            p.error(f"--mode {spec}: the mode is one of {', '.join(sorted(MODES))}")
        # Strict values are one call each (never batched ahead of use).
        if mode == idgen_pb2.MODE_STRICT:
            ids = [client.gen_id(mode, tag) for _ in range(3)]
        else:
            ids = client.gen_ids(3, mode, tag)
        summary["modes"][spec] = ids
        ok = ok and len(set(ids)) == len(ids)
    if a.format:
        params = dict(kv.split("=", 1) for kv in a.param)
        formatted = []
        while len(formatted) < a.count:
            formatted += client.gen_formatted(a.format, params, min(100, a.count - len(formatted)))
        parsed = client.parse_formatted(a.format, formatted[-1])
        counter = client.format_counter(a.format, params)
        summary["formatted"] = len(formatted)
        summary["formatted_distinct"] = len(set(formatted))
        summary["formatted_sample"] = formatted[:3]
        summary["parsed_seq"] = parsed.seq
        summary["counter_used"] = counter.used
        ok = ok and len(set(formatted)) == len(formatted)
    print(json.dumps(summary))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
