"""Unit tests of the installed package (no cluster): the strict-key hash
against the Rust crate's vectors, Consul's variables, error wordings,
configuration errors and the prefetch buffer."""

import ast
import importlib.metadata
import os
import re
import tempfile
import threading
import time
import unittest
from types import SimpleNamespace

import grpc

import idgen_client
from idgen_client import _hash
from idgen_client._call import Caller
from idgen_client._nodes import NodeSet
from idgen_client._prefetch import PrefetchConfig, Prefetcher

NODES = ["10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051"]
# (key, FNV-1a 64, rendezvous score on NODES[0], the key's node), computed
# by client/src/nodes.rs's own functions.
RUST_VECTORS = [
    ("orders/k7", 0xA70E14F6503096D3, 0x4503D92A15B59C20, "10.0.0.2:50051"),
    ("flights/lh400", 0x769730A5AC3E6CA7, 0xCE4FE6009DC8DECC, "10.0.0.3:50051"),
    ("", 0xCBF29CE484222325, 0xF9E8D6C069A7D0B8, "10.0.0.1:50051"),
    ("ns/ü", 0x70505B89D18207EC, 0xAC713D4B514EEC08, "10.0.0.3:50051"),
    ("orders/k0", 0xA70E19F650309F52, 0x0A2279491B9641D9, "10.0.0.3:50051"),
    ("orders/k1", 0xA70E1AF65030A105, 0x9E40D4479670D806, "10.0.0.1:50051"),
    ("orders/k2", 0xA70E17F650309BEC, 0x898CEC55E2716081, "10.0.0.3:50051"),
    ("orders/k3", 0xA70E18F650309D9F, 0x801EFD8593864BAD, "10.0.0.1:50051"),
]


class Installed(unittest.TestCase):
    def test_the_package_under_test_is_the_installed_one(self):
        self.assertIn("site-packages", idgen_client.__file__)
        from idgen_client._pb import idgen_pb2, idgen_pb2_grpc  # shipped in the wheel
        self.assertTrue(hasattr(idgen_pb2_grpc, "IdGenStub"))
        self.assertEqual(idgen_pb2.DESCRIPTOR.name, "idgen/v1/idgen.proto")
        here = os.path.dirname(idgen_client.__file__)
        self.assertTrue(os.path.exists(os.path.join(here, "py.typed")))


# What runs only on a newer Python than the floor without being new
# syntax (so ast.parse with feature_version lets it through): minor
# version -> calls given these keywords, attributes, builtins.
NEWER_KEYWORDS = {10: {"zip": {"strict"}, "dataclass": {"slots", "kw_only"}}}
NEWER_ATTRIBUTES = {11: {("asyncio", "timeout"), ("asyncio", "timeout_at"),
                         ("asyncio", "TaskGroup")}}
NEWER_BUILTINS = {10: {"aiter", "anext"}}


def _name(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def newer_than_floor(tree, minor):
    """Run-time uses of Python 3.(minor+1)+ in a parsed source: `X | Y`
    on a type outside an annotation (or in one without `from __future__
    import annotations`), and the calls and names of the tables above."""
    found = []
    postponed = any(isinstance(n, ast.ImportFrom) and n.module == "__future__"
                    and any(a.name == "annotations" for a in n.names) for n in tree.body)
    annotations = set()
    for node in ast.walk(tree):
        for ann in (getattr(node, "annotation", None), getattr(node, "returns", None)):
            if ann is not None and postponed:
                annotations.update(id(n) for n in ast.walk(ann))
    for node in ast.walk(tree):
        where = "line %d" % getattr(node, "lineno", 0)
        if (minor < 10 and isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr)
                and id(node) not in annotations
                and any((isinstance(s, ast.Constant) and s.value is None)
                        or _name(s) in ("int", "str", "bytes", "float", "bool", "list",
                                        "dict", "tuple", "set", "Optional")
                        or isinstance(s, ast.Subscript) for s in (node.left, node.right))):
            found.append("%s: `X | Y` of types (3.10)" % where)
        if isinstance(node, ast.Call):
            for v, table in NEWER_KEYWORDS.items():
                banned = table.get(_name(node.func), set())
                for kw in node.keywords:
                    if v > minor and kw.arg in banned:
                        found.append("%s: %s(%s=) (3.%d)" % (where, _name(node.func), kw.arg, v))
            for v, names in NEWER_BUILTINS.items():
                if v > minor and isinstance(node.func, ast.Name) and node.func.id in names:
                    found.append("%s: %s() (3.%d)" % (where, node.func.id, v))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            for v, pairs in NEWER_ATTRIBUTES.items():
                if v > minor and (node.value.id, node.attr) in pairs:
                    found.append("%s: %s.%s (3.%d)" % (where, node.value.id, node.attr, v))
    return found


class PythonFloor(unittest.TestCase):
    def floor_and_sources(self):
        # The suite runs on a newer Python than the floor users may have:
        # newer syntax (except*, match, ...) or library calls would
        # install there and fail at import or at run time. The floor is
        # the wheel's own Requires-Python.
        floor = importlib.metadata.metadata("idgen-client")["Requires-Python"]
        m = re.fullmatch(r">=\s*3\.(\d+)", floor.strip())
        self.assertIsNotNone(m, "Requires-Python %r is not >=3.N" % floor)
        root = os.path.dirname(idgen_client.__file__)
        sources = [os.path.join(d, f) for d, _, files in os.walk(root) for f in files
                   if f.endswith(".py")]
        self.assertGreater(len(sources), 10)
        return int(m.group(1)), sources

    def test_every_source_parses_as_the_oldest_python_the_package_accepts(self):
        minor, sources = self.floor_and_sources()
        for path in sources:
            with open(path, encoding="utf-8") as f:
                text = f.read()
            try:
                ast.parse(text, path, feature_version=(3, minor))
            except SyntaxError as e:
                self.fail("%s is not Python 3.%d syntax: %s" % (path, minor, e))

    def test_no_source_uses_at_run_time_what_the_oldest_python_lacks(self):
        minor, sources = self.floor_and_sources()
        for path in sources:
            with open(path, encoding="utf-8") as f:
                found = newer_than_floor(ast.parse(f.read(), path), minor)
            self.assertEqual(found, [], "%s needs a newer Python than 3.%d" % (path, minor))

    def test_the_run_time_check_sees_what_it_looks_for(self):
        newer = ("x: int | None = None\nT = int | None\nisinstance(1, (int | str))\n"
                 "zip(a, b, strict=True)\n@dataclass(slots=True)\nclass C: pass\n"
                 "async def f():\n    async with asyncio.timeout(1): await anext(g)\n")
        self.assertEqual(len(newer_than_floor(ast.parse(newer), 9)), 7)
        self.assertEqual(newer_than_floor(ast.parse(newer), 11), [])
        fine = "from __future__ import annotations\nx: int | None = None\nflags = 1 | 2\n"
        self.assertEqual(newer_than_floor(ast.parse(fine), 9), [])


class StrictKeyHash(unittest.TestCase):
    def test_the_key_hash_is_fnv_1a(self):
        # Published FNV-1a 64 vectors, as client/src/nodes.rs tests them.
        self.assertEqual(_hash.key_hash(""), 0xCBF29CE484222325)
        self.assertEqual(_hash.key_hash("a"), 0xAF63DC4C8601EC8C)
        self.assertEqual(_hash.key_hash("foobar"), 0x85944171F73967E8)

    def test_scores_and_routes_match_the_rust_crate_bit_for_bit(self):
        for key, h, score, node in RUST_VECTORS:
            self.assertEqual(_hash.key_hash(key), h, key)
            self.assertEqual(_hash.rendezvous(h, NODES[0]), score, key)
            self.assertEqual(_hash.route(key, NODES), node, key)
            # No seed, no order: the same node from a list in another order.
            self.assertEqual(_hash.route(key, list(reversed(NODES))), node, key)

    def test_only_the_leaving_nodes_keys_move(self):
        moved = 0
        for i in range(200):
            key = "k%d" % i
            before = _hash.route(key, NODES)
            after = _hash.route(key, NODES[1:])
            if before != NODES[0]:
                self.assertEqual(before, after, key)
            else:
                moved += 1
        self.assertGreater(moved, 30)


class ConsulVariables(unittest.TestCase):
    def env(self, **v):
        return idgen_client.ConsulEnv.from_env(v)

    def test_the_address_follows_consuls_rules_for_schemes(self):
        self.assertEqual(self.env().address(), "http://127.0.0.1:8500")
        self.assertEqual(self.env(CONSUL_HTTP_ADDR="10.0.0.1:8500").address(),
                         "http://10.0.0.1:8500")
        self.assertEqual(self.env(CONSUL_HTTP_ADDR="https://c:8501").address(), "https://c:8501")
        # CONSUL_HTTP_SSL=true is never undone by an http:// address.
        self.assertEqual(self.env(CONSUL_HTTP_ADDR="http://c:8501",
                                  CONSUL_HTTP_SSL="true").address(), "https://c:8501")
        self.assertEqual(self.env(CONSUL_HTTP_SSL="1").address(), "https://127.0.0.1:8500")
        self.assertEqual(self.env(CONSUL_HTTP_ADDR="").address(), "http://127.0.0.1:8500")
        with self.assertRaisesRegex(ValueError, "unix://.*not supported"):
            self.env(CONSUL_HTTP_ADDR="unix:///run/consul.sock").address()
        with self.assertRaisesRegex(ValueError, "CONSUL_HTTP_SSL.*true or false"):
            self.env(CONSUL_HTTP_SSL="yes").address()

    def test_a_token_file_wins_over_the_token_unless_it_is_empty(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "token")
            with open(path, "w") as f:
                f.write(" from-file \n")
            both = self.env(CONSUL_HTTP_TOKEN="plain", CONSUL_HTTP_TOKEN_FILE=path)
            self.assertEqual(both.acl_token(), "from-file")
            with open(path, "w") as f:
                f.write("\n")
            self.assertEqual(both.acl_token(), "plain")
        self.assertIsNone(self.env().acl_token())
        with self.assertRaisesRegex(ValueError, "CONSUL_HTTP_TOKEN_FILE=/nonexistent/t"):
            self.env(CONSUL_HTTP_TOKEN_FILE="/nonexistent/t").acl_token()

    def test_tls_settings_say_what_is_missing(self):
        with self.assertRaisesRegex(ValueError, "CONSUL_CACERT"):
            self.env().tls()
        with self.assertRaisesRegex(ValueError, "CONSUL_CLIENT_KEY"):
            self.env(CONSUL_CLIENT_CERT="/c.pem").tls()
        with self.assertRaisesRegex(ValueError, "CONSUL_HTTP_SSL_VERIFY"):
            self.env(CONSUL_HTTP_SSL_VERIFY="nope").tls()
        self.env(CONSUL_HTTP_SSL_VERIFY="false").tls()  # checks off: no CA needed
        with self.assertRaisesRegex(ValueError, "/nonexistent/ca.pem"):
            self.env(CONSUL_CACERT="/nonexistent/ca.pem").tls()

    def test_the_server_name_loses_its_port(self):
        def name(v):
            return self.env(CONSUL_TLS_SERVER_NAME=v).server_name()
        self.assertEqual(name("consul.internal:8501"), "consul.internal")
        self.assertEqual(name("consul.internal"), "consul.internal")
        self.assertEqual(name("[::1]:8501"), "::1")
        self.assertEqual(name("::1"), "::1")
        self.assertEqual(name("fd00::8501"), "fd00::8501")
        self.assertEqual(name("[fd00::1]"), "fd00::1")
        self.assertIsNone(self.env().server_name())

    def test_an_https_address_without_a_ca_is_a_config_error(self):
        d = idgen_client.ConsulDiscovery(env=self.env(CONSUL_HTTP_ADDR="https://c:8501"))
        with self.assertRaises(idgen_client.ConfigError) as e:
            idgen_client.Client(consul=d)
        self.assertEqual(e.exception.code, "CONFIG")
        self.assertIn("CONSUL_CACERT", str(e.exception))


class Errors(unittest.TestCase):
    def test_wordings_match_the_rust_crate(self):
        e = idgen_client.DeadlineExceededError(2.0, "x", 3, 1)
        self.assertEqual(str(e), "no node answered within the deadline of 2s after 3 attempts "
                                 "on 1 node (last error: x)")
        e = idgen_client.DeadlineExceededError(0.5, "none", 0, 0)
        self.assertEqual(str(e), "no node answered within the deadline of 500ms "
                                 "(last error: none)")
        e = idgen_client.StatusError("INVALID_ARGUMENT", "count 0")
        self.assertEqual(str(e), "idgen answered InvalidArgument: count 0")
        self.assertEqual(e.code, "INVALID_ARGUMENT")
        self.assertTrue(str(idgen_client.NoNodesError()).startswith("no idgen node is known"))

    def test_a_tls_refusal_names_the_client_certificate_in_each_grpcio_wording(self):
        # grpcio 1.80 and later name the alert; 1.78 (what pip picks on
        # Python 3.9) says only that the secure read failed.
        from idgen_client._call import describe
        for details in ("failed to connect to all addresses; last error: UNKNOWN: "
                        "ipv4:127.0.0.1:1: Ssl handshake failed: CERTIFICATE_REQUIRED",
                        "failed to connect to all addresses; last error: UNAVAILABLE: "
                        "ipv4:127.0.0.1:1: Secure read failed"):
            text = describe(_Refusal(grpc.StatusCode.UNAVAILABLE, details), True, False)
            self.assertIn("client certificate", text)
            self.assertIn("TlsConfig(", text)

    def test_configuration_is_checked_before_any_call(self):
        cases = [
            dict(nodes=[], consul=idgen_client.ConsulDiscovery()),
            dict(nodes=["a:1"], admin_token="line\nbreak"),
            dict(nodes=["a:1"], admin_token=" "),
            dict(nodes=["a:1"], deadline=0),
            dict(nodes=["a:1"], prefetch=PrefetchConfig(size=10, low=10)),
            dict(nodes=["a:1"], tls=idgen_client.TlsConfig(ca="/nonexistent/ca.pem")),
            dict(nodes=["a:1"], tls=idgen_client.TlsConfig(ca="/etc/hostname", cert="c.pem")),
        ]
        for kwargs in cases:
            nodes = kwargs.pop("nodes")
            with self.assertRaises(idgen_client.ConfigError, msg=repr(kwargs)):
                idgen_client.Client(nodes, **kwargs)

    def test_strict_is_never_prefetched_and_an_empty_list_has_no_nodes(self):
        with idgen_client.Client([]) as c:
            with self.assertRaises(idgen_client.StrictNotPrefetchableError):
                c.prefetcher("strict", "ns/k")
            with self.assertRaises(idgen_client.NoNodesError):
                c.gen_id()
            with self.assertRaises(idgen_client.RevealRefusedError) as e:
                c.reveal("t", 1)
            self.assertEqual(e.exception.code, "PERMISSION_DENIED")
            self.assertFalse(e.exception.sent)


class _FakeConsul:
    """An HTTP server on 127.0.0.1:0 that answers Consul's health query
    with one node and /v1/catalog/datacenters with `datacenters` (None:
    404, as an agent that does not answer the listing); records the
    token each listing request carried."""

    def __init__(self, datacenters):
        import http.server
        import json

        tokens = self.tokens = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                if self.path.startswith("/v1/catalog/datacenters"):
                    tokens.append(self.headers.get("X-Consul-Token"))
                    if datacenters is None:
                        return self._send(404, b"no such endpoint")
                    return self._send(200, json.dumps(datacenters).encode())
                if self.path.startswith("/v1/health/service/"):
                    entry = {"Node": {"Address": "127.0.0.1"},
                             "Service": {"Address": "127.0.0.1", "Port": 1}}
                    return self._send(200, json.dumps([entry]).encode())
                return self._send(404, b"")

            def _send(self, status, body):
                self.send_response(status)
                self.send_header("X-Consul-Index", "7")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class FallbackNames(unittest.TestCase):
    """A fallback datacenter the agent does not list is refused at start-up
    with the Rust crate's words; an agent that does not answer the
    listing is not refused."""

    def _client(self, consul, fallbacks):
        return idgen_client.Client(consul=idgen_client.ConsulDiscovery(
            address=consul.address, token="t0k", wait=1.0, fallback_datacenters=fallbacks))

    def test_an_unknown_fallback_datacenter_is_refused_naming_the_known_ones(self):
        consul = _FakeConsul(["dc1", "dc2"])
        self.addCleanup(consul.close)
        with self.assertRaises(idgen_client.ConfigError) as e:
            self._client(consul, ["DC2"])
        self.assertEqual(str(e.exception),
                         'invalid client configuration: fallback datacenter(s) ["DC2"] unknown '
                         'to the Consul agent, which knows ["dc1", "dc2"]: name Consul '
                         'datacenters (case matters)')
        self.assertEqual(e.exception.code, "CONFIG")
        self.assertEqual(consul.tokens, ["t0k"])
        with self._client(consul, ["dc2"]) as c:
            self.assertEqual(c.nodes(), ["127.0.0.1:1"])

    def test_an_agent_that_does_not_answer_the_listing_is_not_refused(self):
        consul = _FakeConsul(None)
        self.addCleanup(consul.close)
        with self._client(consul, ["DC2"]) as c:
            self.assertEqual(c.nodes(), ["127.0.0.1:1"])
        self.assertEqual(consul.tokens, ["t0k"])


class _Refusal(grpc.RpcError):
    def __init__(self, code, details):
        super().__init__()
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return ()


class _OneNode:
    """A node set of one node whose stub refuses with a TLS error, then
    stalls until the call's deadline."""

    tls = idgen_client.TlsConfig(ca="/etc/hostname")

    def __init__(self):
        self.answers = [
            _Refusal(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; "
                     "last error: UNKNOWN: Ssl handshake failed: CERTIFICATE_REQUIRED"),
        ]
        self.node = SimpleNamespace(addr="127.0.0.1:1", outstanding=0, aside_until=0.0,
                                    stub=SimpleNamespace(GenId=self._answer))

    def _answer(self, request, timeout, metadata):
        if self.answers:
            raise self.answers.pop(0)
        time.sleep(timeout)
        raise _Refusal(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def pick(self, tried, key=None, avoid=None):
        return None if tried else self.node

    def acquire(self, node):
        node.outstanding += 1
        return True

    def release(self, node):
        node.outstanding -= 1

    def set_aside(self, node):
        pass


class Deadline(unittest.TestCase):
    def test_a_call_that_runs_out_of_time_keeps_what_the_attempt_before_said(self):
        # The last attempt's timeout says less than the refusal before it
        # (the reason): the error keeps both, as the Rust crate's does.
        caller = Caller(_OneNode(), deadline=0.3, attempt_timeout=5.0,
                        metrics=idgen_client.Metrics(), backoff_base=0.0001, backoff_max=0.001)
        with self.assertRaises(idgen_client.DeadlineExceededError) as e:
            caller.call("GenId", None)
        text = str(e.exception)
        self.assertIn("127.0.0.1:1 did not answer in time; before that, 127.0.0.1:1: TLS: the "
                      "node requires a client certificate", text)


class RetiredNodes(unittest.TestCase):
    def test_a_node_that_left_keeps_its_channel_until_its_last_call_ends(self):
        # Back from a fallback datacenter, its nodes leave the set while
        # they still answer calls: closing their channels then would
        # cancel those calls (seen as "Cancelled: Channel closed!").
        nodes = NodeSet(None, 1.0)
        self.addCleanup(nodes.close)
        nodes.replace(["127.0.0.1:1"], "dc2")
        node = nodes.pick([])
        self.assertTrue(nodes.acquire(node))
        nodes.replace(["127.0.0.1:2"])
        self.assertFalse(node.closed, "a call is still in flight on it")
        nodes.release(node)
        self.assertTrue(node.closed, "closed with its last call")
        self.assertFalse(nodes.acquire(node), "a closed node takes no call")


class _FakeClient:
    deadline = 2.0
    _metrics = idgen_client.Metrics()


class PrefetchBuffer(unittest.TestCase):
    def test_every_id_is_handed_out_once_across_threads_and_refills(self):
        lock = threading.Lock()
        counter = [0]
        calls = [0]

        def fetch(n, busy):
            with lock:
                start = counter[0]
                counter[0] += n
                calls[0] += 1
            time.sleep(0.001)
            return list(range(start, start + n))

        p = Prefetcher(_FakeClient(), "segment", "t", PrefetchConfig(size=500, low=200), fetch)
        got = []

        def work():
            mine = [p.next_id() for _ in range(5000)]
            with lock:
                got.extend(mine)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(len(got), 20000)
        self.assertEqual(len(set(got)), 20000)
        self.assertNotIn(None, got)
        self.assertGreaterEqual(calls[0], 40)
        p.close()

    def test_one_thread_gets_ids_in_batch_order(self):
        counter = [0]

        def fetch(n, busy):
            counter[0] += n
            return list(range(counter[0] - n, counter[0]))

        p = Prefetcher(_FakeClient(), "lease", "", PrefetchConfig(size=100, low=50,
                                                                  max_refills=1), fetch)
        got = [p.next_id() for _ in range(1000)]
        self.assertEqual(got, sorted(got))
        self.assertEqual(len(set(got)), 1000)
        p.close()

    def test_snowflake_ids_that_aged_are_thrown_away(self):
        counter = [0]

        def fetch(n, busy):
            counter[0] += n
            return list(range(counter[0] - n, counter[0]))

        config = PrefetchConfig(size=100, low=10, max_snowflake_age=0.2, max_refills=1)
        p = Prefetcher(_FakeClient(), "snowflake", "", config, fetch)
        first = p.next_id()
        self.assertEqual(first, 0)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if p.next_id() >= 100:
                break
            time.sleep(0.1)
        # The rest of the first batch aged out: the next ID is from a later batch.
        self.assertGreaterEqual(p.next_id(), 100)
        p.close()

    def test_after_a_caller_waited_more_refills_stay_in_flight_at_the_low_water_mark(self):
        # A refill costs a round trip plus, in Python, the wait for the GIL
        # (up to the 5 ms switch interval while the reader runs): one refill
        # started at the low-water mark lands after a fast reader emptied
        # the buffer. Each caller that waited adds a refill lane; the buffer
        # then keeps `low` plus one batch per lane ahead, counting those in
        # flight.
        gate = threading.Event()
        counter = [0]

        def fetch(n, busy):
            gate.wait(10)
            counter[0] += n
            return list(range(counter[0] - n, counter[0]))

        config = PrefetchConfig(size=100, low=50, max_refills=3)
        p = Prefetcher(_FakeClient(), "lease", "", config, fetch)
        try:
            with p._cond:
                p._lanes = 2  # as after one caller waited
                p._ids.extend(range(-50, 0))  # at the low-water mark
                p._start_refills()
                self.assertEqual(p._inflight, 2)
        finally:
            gate.set()
            p.close()

    def test_refills_run_on_threads_kept_for_the_buffers_life(self):
        # Starting a thread per refill made the caller that reached the
        # low-water mark wait for the new thread to start (tens of ms on a
        # loaded machine): refills reuse at most max_refills threads.
        counter = [0]
        threads = []

        def fetch(n, busy):
            threads.append(threading.current_thread())
            counter[0] += n
            return list(range(counter[0] - n, counter[0]))

        config = PrefetchConfig(size=100, low=50, max_refills=2)
        p = Prefetcher(_FakeClient(), "lease", "", config, fetch)
        got = [p.next_id() for _ in range(5000)]
        p.close()
        self.assertEqual(len(set(got)), 5000)
        self.assertLessEqual(len(set(threads)), 2)
        # And only the refills the buffer asked for: the 5,000 taken plus
        # at most low + max_refills * size (250) ahead, 100 a refill.
        self.assertGreaterEqual(len(threads), 50)
        self.assertLessEqual(len(threads), 55)

    def test_a_refill_error_reaches_the_waiting_caller(self):
        def fetch(n, busy):
            raise idgen_client.NoNodesError()

        p = Prefetcher(_FakeClient(), "lease", "", PrefetchConfig(), fetch)
        with self.assertRaises(idgen_client.NoNodesError):
            p.next_id()
        p.close()


if __name__ == "__main__":
    unittest.main()
