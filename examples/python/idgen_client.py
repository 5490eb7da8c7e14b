"""A small idgen client in Python (grpcio): Consul discovery, retry on
another node, and prefetching.

Stubs are generated from the repository's proto, not committed:

    python -m grpc_tools.protoc -I proto --python_out=gen --grpc_python_out=gen \
        proto/idgen/v1/idgen.proto

then put `gen` on PYTHONPATH (``from idgen.v1 import idgen_pb2``).

Run ``python examples/python/idgen_client.py --help`` for the demo.
"""

import argparse
import collections
import json
import random
import sys
import threading
import time
import urllib.parse
import urllib.request

import grpc

from idgen.v1 import idgen_pb2, idgen_pb2_grpc

RETRYABLE = {grpc.StatusCode.UNAVAILABLE}


def discover(consul, service="idgen", token=None, datacenter=None, tag=None, timeout=5.0):
    """The passing instances of `service` as "host:port" strings, from
    Consul's /v1/health/service/<service>?passing."""
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
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        entries = json.load(answer)
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

    def __init__(self, nodes, deadline=2.0, set_aside=1.0):
        if not nodes:
            raise ValueError("no idgen nodes: check the Consul service name")
        self.deadline = deadline
        self.set_aside = set_aside
        self._lock = threading.Lock()
        self._aside = {}
        self._stubs = {
            n: idgen_pb2_grpc.IdGenStub(grpc.insecure_channel(n)) for n in nodes
        }

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
    p.add_argument("--consul", required=True, help="Consul HTTP address, e.g. http://127.0.0.1:8500")
    p.add_argument("--service", default="idgen")
    p.add_argument("--token", default=None)
    p.add_argument("--also", action="append", default=[],
                   help="extra node addresses tried too (e.g. one that is down)")
    p.add_argument("--count", type=int, default=5000, help="prefetched IDs to take")
    p.add_argument("--threads", type=int, default=4)
    a = p.parse_args()

    nodes = discover(a.consul, a.service, a.token)
    client = Client(a.also + nodes)
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
    print(json.dumps({
        "nodes": len(nodes),
        "ids": len(every),
        "distinct": len(set(every)),
        "workers": workers,
    }))
    return 0 if len(set(every)) == len(every) else 1


if __name__ == "__main__":
    sys.exit(main())
