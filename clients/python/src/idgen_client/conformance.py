"""The conformance driver (clients/conformance in the repository):
`python -m idgen_client.conformance` reads JSON requests, one per line,
on stdin and writes one JSON response per line on stdout; logs go to
stderr. IDs travel as decimal strings."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any, Dict, Optional

from ._client import Client
from ._consul import ConsulDiscovery
from ._errors import IdgenError
from ._nodes import TlsConfig
from ._prefetch import PrefetchConfig


def _text(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return {str(k): _text(v) for k, v in value.items()}
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    return str(value)


_DECODED = (("id", "id"), ("timestamp_ms", "unix_millis"), ("datacenter_id", "datacenter"),
            ("worker_id", "worker"), ("sequence", "sequence"), ("zone", "zone"),
            ("token", "token"), ("hidden", "hidden"), ("key_version", "key_version"),
            ("internal_id", "internal_id"))


def _decoded(raw: Dict[str, Any]) -> Dict[str, str]:
    """DecodeId's fields under the protocol's names; key_version and
    internal_id only when the node sent them."""
    return {ours: str(raw[theirs]) for ours, theirs in _DECODED if theirs in raw}


def _parsed(raw: Dict[str, Any]) -> Dict[str, str]:
    """ParseFormatted's fields as strings, a parameter as param.<name>."""
    out = {k: _text(v) for k, v in raw.items() if k != "params"}
    for name, value in (raw.get("params") or {}).items():
        out["param." + name] = str(value)
    return out


class Driver:
    def __init__(self) -> None:
        self.client: Optional[Client] = None

    def open(self, req: Dict[str, Any]) -> Dict[str, Any]:
        tls = req.get("tls")
        prefetch = req.get("prefetch")
        kwargs: Dict[str, Any] = dict(
            deadline=req["deadline_ms"] / 1000.0,
            attempt_timeout=req["attempt_ms"] / 1000.0,
            admin_token=req.get("admin_token"),
            tls=TlsConfig(ca=tls["ca"], cert=tls.get("cert"), key=tls.get("key"),
                          server_name=tls.get("server_name")) if tls else None,
        )
        if prefetch:
            kwargs["prefetch"] = PrefetchConfig(size=int(prefetch["size"]),
                                                low=int(prefetch["low"]))
        if req["discovery"] == "consul":
            # Optional: other Consul datacenters to fall back to, in order.
            fallbacks = list(req.get("fallback_datacenters") or ())
            self.client = Client(consul=ConsulDiscovery.from_env(fallback_datacenters=fallbacks),
                                 **kwargs)
        else:
            self.client = Client(list(req["nodes"]), **kwargs)
        return {"nodes": self.client.nodes()}

    def handle(self, req: Dict[str, Any]) -> Dict[str, Any]:
        op = req["op"]
        if op == "open":
            return self.open(req)
        c = self.client
        if c is None:
            raise ValueError("the first request must be open")
        if op == "gen":
            ids, node = c.gen_ids_from(int(req["count"]), req["mode"], req.get("tag", ""))
            return {"ids": [str(i) for i in ids], "node": node}
        if op == "next":
            got = []
            try:
                for _ in range(int(req["count"])):
                    got.append(str(c.next_id(req["mode"], req.get("tag", ""))))
            except IdgenError as e:
                return dict(_error(e), ids=got)
            return {"ids": got}
        if op == "formatted":
            return {"ids": c.gen_formatted(req["format"], req.get("params") or {},
                                           int(req["count"]))}
        if op == "parse":
            return {"fields": _parsed(c.parse_formatted(req["format"], req["value"]))}
        if op == "counter":
            return {"counter": _text(c.format_counter(req["format"], req.get("params") or {}))}
        if op == "decode":
            return {"fields": _decoded(c.decode_id(int(req["value"]), req["mode"]))}
        if op == "reveal":
            return {"fields": _decoded(c.reveal(req["tag"], int(req["value"])))}
        if op == "uuid":
            return {"uuids": [str(u) for u in c.gen_uuids(int(req["count"]))]}
        if op == "strict_route":
            return {"node": c.strict_node(req["key"])}
        if op == "nodes":
            return {"nodes": c.nodes()}
        if op == "close":
            c.close()
            return {}
        return {"ok": False, "code": "UNIMPLEMENTED", "message": "unknown op %r" % op,
                "sent": False}


def _error(e: IdgenError) -> Dict[str, Any]:
    return {"ok": False, "code": e.code, "message": str(e), "sent": bool(e.sent)}


def main() -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    driver = Driver()
    for line in sys.stdin:
        if not line.strip():
            continue
        req: Dict[str, Any] = {}
        try:
            req = json.loads(line)
            answer = driver.handle(req)
            answer.setdefault("ok", True)
        except IdgenError as e:
            answer = _error(e)
        except (KeyError, TypeError, ValueError) as e:
            answer = {"ok": False, "code": "INVALID_ARGUMENT",
                      "message": "bad request: %r" % (e,), "sent": False}
        answer["id"] = req.get("id")
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
        if req.get("op") == "close":
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
