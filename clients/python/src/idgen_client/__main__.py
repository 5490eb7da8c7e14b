"""`python -m idgen_client`: a demo against a cluster found through
Consul's variables (or --node): snowflake IDs taken one by one and
prefetched from several threads, three IDs of each --mode, formatted IDs
with one parsed; prints one JSON summary line and exits 1 if any ID
repeated."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from typing import Any, Dict, List, Optional

from ._client import Client
from ._consul import ConsulDiscovery
from ._errors import IdgenError
from ._nodes import TlsConfig


def _args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m idgen_client",
                                description="idgen Python client demo")
    p.add_argument("--node", action="append", default=[],
                   help="a node's gRPC host:port (repeat; default: Consul's variables)")
    p.add_argument("--service", default="idgen", help="the Consul service name")
    p.add_argument("--count", type=int, default=5000, help="prefetched IDs to take")
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--mode", action="append", default=[], metavar="MODE[:TAG]",
                   help="also take 3 IDs of this mode: segment:TAG, lease, strict:NAMESPACE/KEY")
    p.add_argument("--format", default=None, help="also take --count IDs of this format")
    p.add_argument("--param", action="append", default=[], help="name=value of --format")
    p.add_argument("--ca", default=None, help="CA (PEM) of the nodes' TLS certificates")
    p.add_argument("--cert", default=None, help="client certificate (PEM) for mTLS nodes")
    p.add_argument("--key", default=None, help="private key (PEM) of --cert")
    p.add_argument("--tls-server-name", default=None,
                   help="name the nodes' certificates carry, when not their address")
    return p.parse_args(argv)


def _demo(client: Client, a: argparse.Namespace) -> Dict[str, Any]:
    single = [client.gen_id() for _ in range(50)]
    prefetch = client.prefetcher("snowflake")
    got: List[int] = []
    lock = threading.Lock()

    def work(n: int) -> None:
        mine = [prefetch.next_id() for _ in range(n)]
        with lock:
            got.extend(mine)

    threads = [threading.Thread(target=work, args=(a.count // a.threads,))
               for _ in range(a.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = single + got
    summary: Dict[str, Any] = {"nodes": len(client.nodes()), "ids": len(every),
                               "distinct": len(set(every))}
    modes: Dict[str, List[int]] = {}
    for spec in a.mode:
        name, _, tag = spec.partition(":")
        # Strict values are one call each (never prefetched).
        modes[spec] = ([client.gen_id(name, tag) for _ in range(3)] if name == "strict"
                       else client.gen_ids(3, name, tag))
    if modes:
        summary["modes"] = modes
    if a.format:
        params = dict(kv.split("=", 1) for kv in a.param)
        formatted: List[str] = []
        while len(formatted) < a.count:
            formatted += client.gen_formatted(a.format, params, min(100, a.count - len(formatted)))
        summary["formatted"] = len(formatted)
        summary["formatted_distinct"] = len(set(formatted))
        summary["formatted_sample"] = formatted[:3]
        summary["parsed_seq"] = client.parse_formatted(a.format, formatted[-1]).get("seq", 0)
        summary["counter_used"] = client.format_counter(a.format, params)["used"]
    return summary


def main(argv: Optional[List[str]] = None) -> int:
    a = _args(argv)
    tls = TlsConfig(a.ca, a.cert, a.key, a.tls_server_name) if a.ca else None
    try:
        if a.node:
            client = Client(a.node, tls=tls)
        else:
            client = Client(consul=ConsulDiscovery.from_env(service=a.service), tls=tls)
        with client:
            summary = _demo(client, a)
    except IdgenError as e:
        print("error (%s): %s" % (e.code, e), file=sys.stderr)
        return 1
    print(json.dumps(summary))
    ok = summary["ids"] == summary["distinct"] and all(
        len(set(v)) == len(v) for v in summary.get("modes", {}).values())
    ok = ok and summary.get("formatted") == summary.get("formatted_distinct")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
