#!/usr/bin/env python3
"""Exercise the Consul test server with py-consul, a real Consul client.

Usage: consul_interop.py HOST:PORT

Each check prints "ok   <name>" or "FAIL <name>: <why>"; the last line is
"N passed, M failed", and the exit status is non-zero if anything failed.
Run it through scripts/consul-interop.sh, which starts the server.
"""

from __future__ import annotations

import base64
import sys
import time
import traceback

import consul
import consul.exceptions

passed = 0
failed = 0


def check(name: str):
    """Run the decorated function now as one named check."""

    def run(fn):
        global passed, failed
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - report every failure the same way
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
            traceback.print_exc(limit=2, file=sys.stderr)
        else:
            passed += 1
            print(f"ok   {name}")
        return fn

    return run


def expect(actual, wanted, what: str = "value") -> None:
    if actual != wanted:
        raise AssertionError(f"{what}: got {actual!r}, want {wanted!r}")


def main() -> int:
    if len(sys.argv) != 2 or ":" not in sys.argv[1]:
        print(__doc__, file=sys.stderr)
        return 2
    host, port = sys.argv[1].rsplit(":", 1)
    c = consul.Consul(host=host, port=int(port))
    state: dict = {}

    @check("kv put and get")
    def _():
        expect(c.kv.put("interop/a", "one"), True, "put")
        index, entry = c.kv.get("interop/a")
        expect(entry["Value"], b"one", "Value")
        expect(int(index), entry["ModifyIndex"], "X-Consul-Index of a single key")
        expect(c.kv.get("interop/missing")[1], None, "missing key")
        state["modify"] = entry["ModifyIndex"]

    @check("kv cas=0 creates only")
    def _():
        expect(c.kv.put("interop/b", "first", cas=0), True, "create")
        expect(c.kv.put("interop/b", "second", cas=0), False, "second create")
        expect(c.kv.get("interop/b")[1]["Value"], b"first", "Value")

    @check("kv cas=N fails on a stale index and succeeds on the current one")
    def _():
        modify = state["modify"]
        expect(c.kv.put("interop/a", "stale", cas=modify + 1000), False, "stale cas")
        expect(c.kv.put("interop/a", "two", cas=modify), True, "current cas")
        expect(c.kv.get("interop/a")[1]["Value"], b"two", "Value")

    @check("kv recurse and keys")
    def _():
        _, entries = c.kv.get("interop/", recurse=True)
        expect(sorted(e["Key"] for e in entries), ["interop/a", "interop/b"], "recurse")
        expect(c.kv.get("interop/", keys=True)[1], ["interop/a", "interop/b"], "keys")

    @check("blocking kv query waits and keeps the index")
    def _():
        index, _ = c.kv.get("interop/a")
        started = time.monotonic()
        again, _ = c.kv.get("interop/a", index=index, wait="500ms")
        took = time.monotonic() - started
        expect(again, index, "index after timeout")
        if not 0.45 <= took < 2.0:
            raise AssertionError(f"blocking query took {took:.2f}s")

    @check("session create, renew and info")
    def _():
        sid = c.session.create(name="interop", ttl=10, lock_delay=0)
        renewed = c.session.renew(sid)
        expect(renewed["ID"], sid, "renewed ID")
        expect(renewed["TTL"], "10s", "TTL")
        _, info = c.session.info(sid)
        expect(info["Name"], "interop", "Name")
        state["session"] = sid

    @check("kv acquire and release with a session")
    def _():
        sid = state["session"]
        other = c.session.create(name="other")
        expect(c.kv.put("interop/lock", "mine", acquire=sid), True, "acquire")
        _, entry = c.kv.get("interop/lock")
        expect(entry["Session"], sid, "Session")
        expect(entry["LockIndex"], 1, "LockIndex")
        expect(c.kv.put("interop/lock", "theirs", acquire=other), False, "acquire held lock")
        expect(c.kv.put("interop/lock", "x", release=other), False, "release by non-holder")
        expect(c.kv.put("interop/lock", "released", release=sid), True, "release")
        _, entry = c.kv.get("interop/lock")
        expect(entry.get("Session"), None, "Session after release")
        expect(entry["Value"], b"released", "Value after release")
        expect(c.session.destroy(other), True, "destroy other")

    @check("session destroy")
    def _():
        sid = state["session"]
        expect(c.session.destroy(sid), True, "destroy")
        expect(c.session.destroy(sid), True, "destroy again")
        expect(c.session.info(sid)[1], None, "info after destroy")
        try:
            c.session.renew(sid)
        except consul.NotFound:
            pass
        else:
            raise AssertionError("renew of a destroyed session did not 404")

    @check("txn succeeds and returns new ModifyIndex values")
    def _():
        b64 = lambda s: base64.b64encode(s.encode()).decode()  # noqa: E731
        result = c.txn.put([
            {"KV": {"Verb": "set", "Key": "interop/t1", "Value": b64("1")}},
            {"KV": {"Verb": "cas", "Key": "interop/t2", "Value": b64("2"), "Index": 0}},
            {"KV": {"Verb": "get", "Key": "interop/a"}},
        ])
        expect(result["Errors"], None, "Errors")
        expect(len(result["Results"]), 3, "result count")
        _, t2 = c.kv.get("interop/t2")
        expect(result["Results"][1]["KV"]["ModifyIndex"], t2["ModifyIndex"], "cas ModifyIndex")
        expect(base64.b64decode(result["Results"][2]["KV"]["Value"]), b"two", "get Value")

    @check("txn fails as a whole")
    def _():
        b64 = lambda s: base64.b64encode(s.encode()).decode()  # noqa: E731
        try:
            c.txn.put([
                {"KV": {"Verb": "set", "Key": "interop/t3", "Value": b64("3")}},
                {"KV": {"Verb": "cas", "Key": "interop/t1", "Value": b64("x"), "Index": 1}},
            ])
        except consul.exceptions.ClientError as e:
            if not str(e).startswith("409") or '"OpIndex":1' not in str(e):
                raise AssertionError(f"unexpected error: {e}") from e
        else:
            raise AssertionError("a stale cas in a txn did not fail")
        expect(c.kv.get("interop/t3")[1], None, "rolled-back set")

    @check("agent service register with a TTL check")
    def _():
        ttl_check = consul.Check.ttl("10s")
        ttl_check["CheckID"] = "idgen-1:ttl"
        ok = c.agent.service.register(
            "idgen", service_id="idgen-1", port=50051, tags=["v1"], meta={"worker": "1"}, check=ttl_check
        )
        expect(ok, True, "register")
        expect(c.agent.services()["idgen-1"]["Service"], "idgen", "agent services")
        expect(c.agent.checks()["idgen-1:ttl"]["Status"], "critical", "new check status")
        expect(c.health.service("idgen", passing=True)[1], [], "passing before the first pass")

    @check("check pass makes the service show in health.service(passing=True)")
    def _():
        expect(c.agent.check.ttl_pass("idgen-1:ttl", notes="ready"), True, "ttl_pass")
        _, nodes = c.health.service("idgen", passing=True)
        expect(len(nodes), 1, "passing instances")
        expect(nodes[0]["Service"]["ID"], "idgen-1", "Service.ID")
        expect(nodes[0]["Service"]["Port"], 50051, "Service.Port")
        expect(nodes[0]["Node"]["Address"], "127.0.0.1", "Node.Address")
        _, services = c.catalog.services()
        expect(services.get("idgen"), ["v1"], "catalog tags")

    @check("check fail hides it, deregister removes it")
    def _():
        expect(c.agent.check.ttl_fail("idgen-1:ttl"), True, "ttl_fail")
        expect(c.health.service("idgen", passing=True)[1], [], "after fail")
        expect(c.agent.service.deregister("idgen-1"), True, "deregister")
        expect(c.health.service("idgen")[1], [], "after deregister")

    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
