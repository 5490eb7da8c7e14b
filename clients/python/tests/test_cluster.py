"""The installed package against real nodes (tests/fixture.py starts the
Consul emulator and idgen nodes from TEST_IDGEN_BIN and
TEST_CONSUL_TESTSERVER_BIN): discovery with Consul's variables, prefetch
over three nodes, failover past a node killed -9, strict keys (routing,
never sent twice), formatted IDs, UUIDs, TLS and mTLS, asyncio, metrics
and the conformance driver."""

import asyncio
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest
from unittest import mock

import grpc

import idgen_client
from idgen_client import PrefetchConfig, TlsConfig

import fixture

FORMATS = """
[[formats]]
name = "orders-py"
template = "{yyyy}{MM}{dd}-{node:4}-{seq:6}"
reset = "day"
"""
WORKER = lambda i: (i >> 12) & 0x3FF  # noqa: E731 (the default layout's worker bits)


def consul_env(cluster, **extra):
    """The process environment with only this cluster's Consul variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONSUL_")}
    env.update(cluster.env())
    env.update(extra)
    return mock.patch.dict(os.environ, env, clear=True)


class ThreeNodes(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = fixture.Cluster(3, acl=True, formats=FORMATS)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()

    def client(self, **kwargs):
        # Generous: a loaded CI machine makes a strict write (a Consul
        # compare-and-set) slow; the deadline tests set their own.
        kwargs.setdefault("deadline", 10.0)
        with consul_env(self.cluster):
            return idgen_client.Client.from_env(**kwargs)

    def test_discovery_uses_consuls_token_variables_and_names_the_missing_token(self):
        c = self.cluster
        with self.client() as client:
            self.assertEqual(sorted(client.nodes()), sorted(c.addrs()))
        with consul_env(c, CONSUL_HTTP_TOKEN=""):
            with self.assertRaises(idgen_client.DiscoveryError) as e:
                idgen_client.Client.from_env()
        self.assertIn("403", str(e.exception))
        self.assertIn("CONSUL_HTTP_TOKEN", str(e.exception))
        self.assertEqual(e.exception.code, "PERMISSION_DENIED")
        with tempfile.NamedTemporaryFile("w", suffix=".token") as f:
            f.write("master\n")
            f.flush()
            # The token file wins over a wrong token, as in Consul.
            with consul_env(c, CONSUL_HTTP_TOKEN="wrong", CONSUL_HTTP_TOKEN_FILE=f.name):
                with idgen_client.Client.from_env() as client:
                    self.assertEqual(len(client.nodes()), 3)

    def test_prefetch_spreads_over_three_nodes_in_order_per_node_without_repeats(self):
        with self.client(prefetch=PrefetchConfig(size=2000, low=1000)) as client:
            got = [client.next_id() for _ in range(30000)]
            self.assertEqual(len(set(got)), len(got))
            per_worker = {}
            for i in got:
                per_worker.setdefault(WORKER(i), []).append(i)
            self.assertEqual(len(per_worker), 3, sorted(per_worker))
            for worker, ids in per_worker.items():
                self.assertEqual(ids, sorted(ids), "worker %d out of order" % worker)
            segment = [client.next_id("segment", "py-orders") for _ in range(3000)]
            lease = [client.next_id("lease") for _ in range(3000)]
            self.assertEqual(len(set(segment)), 3000)
            self.assertEqual(len(set(lease)), 3000)

    def test_a_strict_key_goes_to_its_node_and_values_increase(self):
        with self.client() as client:
            for i in range(12):
                key = "py/k%d" % i
                ids, node = client.gen_ids_from(1, "strict", key)
                self.assertEqual(node, client.strict_node(key), key)
            values = [client.gen_id("strict", "py/seq") for _ in range(20)]
            self.assertEqual(values, sorted(set(values)))

    def test_a_strict_call_that_may_have_been_sent_is_not_sent_again(self):
        hole = fixture.Blackhole()
        try:
            nodes = [hole.addr] + self.cluster.addrs()
            key = next("py/hole%d" % i for i in range(1000)
                       if idgen_client._hash.route("py/hole%d" % i, nodes) == hole.addr)
            with idgen_client.Client(nodes, deadline=10.0, attempt_timeout=1.0) as client:
                with self.assertRaises(idgen_client.DeadlineExceededError) as e:
                    client.gen_id("strict", key)
                self.assertTrue(e.exception.sent)
                self.assertEqual(e.exception.attempts, 1, str(e.exception))
                self.assertIn("not sent twice", str(e.exception))
                # An idempotent call moves on within its per-attempt budget.
                for _ in range(5):
                    self.assertGreater(client.gen_id("snowflake"), 0)
        finally:
            hole.close()

    def test_a_strict_call_that_could_not_connect_goes_to_the_next_node(self):
        refusing = fixture.refusing_addr()
        nodes = [refusing] + self.cluster.addrs()
        key = next("py/refused%d" % i for i in range(1000)
                   if idgen_client._hash.route("py/refused%d" % i, nodes) == refusing)
        with idgen_client.Client(nodes, deadline=10.0) as client:
            self.assertGreater(client.gen_id("strict", key), 0)

    def test_formatted_ids_parse_and_counter(self):
        with self.client() as client:
            ids = client.gen_formatted("orders-py", {}, 50)
            self.assertEqual(len(set(ids)), 50)
            fields = client.parse_formatted("orders-py", ids[-1])
            self.assertGreater(fields["seq"], 0)
            self.assertIn("year", fields)
            counter = client.format_counter("orders-py")
            self.assertIn("used", counter)
            with self.assertRaises(idgen_client.StatusError) as e:
                client.gen_formatted("no-such-format")
            self.assertEqual(e.exception.code, "NOT_FOUND")

    def test_decode_and_uuids(self):
        with self.client() as client:
            ids, node = client.gen_ids_from(1)
            fields = client.decode_id(ids[0])
            self.assertEqual(fields["id"], ids[0])
            self.assertEqual(fields["worker"], WORKER(ids[0]))
            uuids = client.gen_uuids(50)
            self.assertEqual([u.version for u in uuids], [7] * 50)
            self.assertEqual(uuids, sorted(uuids))
            prefetched = [client.next_uuid() for _ in range(3000)]
            self.assertEqual(len(set(prefetched + uuids)), 3050)
            self.assertEqual({u.version for u in prefetched}, {7})

    def test_asyncio_api(self):
        async def run():
            with consul_env(self.cluster):
                client = await idgen_client.AsyncClient.from_env(deadline=10.0)
            async with client:
                ids = [await client.next_id() for _ in range(2000)]
                strict = await client.gen_id("strict", "py/async")
                formatted = await client.gen_formatted("orders-py", {}, 2)
                uuids = [await client.next_uuid() for _ in range(1500)]
                self.assertEqual(len(set(uuids)), 1500)
                return ids, strict, formatted
        ids, strict, formatted = asyncio.run(run())
        self.assertEqual(len(set(ids)), 2000)
        self.assertGreater(strict, 0)
        self.assertEqual(len(formatted), 2)

    def test_prometheus_metrics_hooks(self):
        from prometheus_client import CollectorRegistry
        from idgen_client.metrics import PrometheusMetrics
        registry = CollectorRegistry()
        with self.client(metrics=PrometheusMetrics(registry)) as client:
            client.gen_ids(3)
            [client.next_id() for _ in range(10)]
        calls = registry.get_sample_value("idgen_client_calls_total",
                                          {"method": "GenIds", "outcome": "ok"})
        self.assertGreaterEqual(calls, 2)
        self.assertEqual(registry.get_sample_value("idgen_client_nodes"), 3)

    def test_the_conformance_driver_speaks_the_protocol(self):
        c = self.cluster
        requests = [
            {"op": "open", "discovery": "consul", "tls": None, "deadline_ms": 10000,
             "attempt_ms": 3000, "prefetch": {"size": 100, "low": 50}, "admin_token": None},
            {"op": "gen", "mode": "snowflake", "tag": "", "count": 3},
            {"op": "next", "mode": "lease", "tag": "", "count": 250},
            {"op": "strict_route", "key": "orders/k7"},
            {"op": "formatted", "format": "orders-py", "count": 2},
            {"op": "uuid", "count": 2},
            {"op": "reveal", "tag": "t", "value": "1"},
            {"op": "gen", "mode": "snowflake", "tag": "", "count": 0},
            {"op": "decode", "value": str(2**62 + (5 << 12) + 7), "mode": "snowflake"},
            {"op": "close"},
        ]
        text = "".join(json.dumps(dict(r, id=i)) + "\n" for i, r in enumerate(requests))
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONSUL_")}
        env.update(c.env())
        # close_fds=False: posix_spawn, not fork (why: fixture.spawn).
        out = subprocess.run([sys.executable, "-m", "idgen_client.conformance"], input=text,
                             capture_output=True, text=True, env=env, timeout=60, check=True,
                             close_fds=False)
        answers = [json.loads(line) for line in out.stdout.splitlines()]
        self.assertEqual([a["id"] for a in answers], list(range(len(requests))), out.stderr)
        opened, gen, nxt, route, formatted, uuids, reveal, bad, decoded, closed = answers
        self.assertEqual(sorted(opened["nodes"]), sorted(c.addrs()))
        self.assertEqual(len(gen["ids"]), 3)
        self.assertTrue(all(isinstance(i, str) for i in gen["ids"]))
        self.assertIn(gen["node"], c.addrs())
        self.assertEqual(len(set(nxt["ids"])), 250, nxt)
        self.assertEqual(route["node"], idgen_client._hash.route("orders/k7", c.addrs()))
        self.assertEqual(len(formatted["ids"]), 2)
        self.assertEqual(len(uuids["uuids"]), 2)
        self.assertEqual((reveal["ok"], reveal["code"], reveal["sent"]),
                         (False, "PERMISSION_DENIED", False))
        self.assertEqual((bad["ok"], bad["code"]), (False, "INVALID_ARGUMENT"), bad)
        fields = decoded["fields"]
        self.assertEqual(fields["id"], str(2**62 + (5 << 12) + 7), decoded)  # above 2^53, exact
        self.assertEqual((fields["worker_id"], fields["sequence"]), ("5", "7"), decoded)
        self.assertNotIn("internal_id", fields)
        self.assertEqual(closed, {"id": 9, "ok": True})


    def test_the_applications_subprocesses_all_start_beside_busy_channels(self):
        """subprocess.Popen with its defaults (fork on 3.9, vfork on 3.10 and
        later) while channels are busy: every child runs. With grpcio 1.80.1
        on 3.9, 1 child in 25 was killed by SIGABRT before exec (grpc's fork
        handler; why pyproject.toml excludes 1.80 on 3.9)."""
        echo = shutil.which("echo") or "/bin/echo"
        stop = threading.Event()
        errors = []
        with self.client() as client:
            def load():
                while not stop.is_set():
                    try:
                        client.gen_ids(10)
                    except idgen_client.IdgenError as e:
                        errors.append(str(e))

            threads = [threading.Thread(target=load) for _ in range(2)]
            for t in threads:
                t.start()
            outcomes = collections.Counter()
            try:
                for _ in range(300):
                    child = subprocess.Popen([echo, "ran"], stdin=subprocess.DEVNULL,
                                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
                    try:
                        out, _ = child.communicate(timeout=30)
                        outcomes[(child.returncode, out)] += 1
                    except subprocess.TimeoutExpired:
                        child.kill()
                        child.communicate()
                        outcomes["hung"] += 1
            finally:
                stop.set()
                for t in threads:
                    t.join()
        self.assertEqual(errors, [])
        self.assertEqual(dict(outcomes), {(0, b"ran\n"): 300},
                         "children beside grpcio %s on Python %s (returncode, output)"
                         % (grpc.__version__, sys.version.split()[0]))


class KilledNode(unittest.TestCase):
    def test_prefetch_keeps_going_without_error_or_repeat_when_a_node_is_killed(self):
        cluster = fixture.Cluster(3)
        try:
            with idgen_client.Client(cluster.addrs(), deadline=10.0, attempt_timeout=1.0,
                                     prefetch=PrefetchConfig(size=500, low=250)) as client:
                got = [client.next_id("lease") for _ in range(2000)]
                killer = threading.Timer(0.05, cluster.nodes[0].kill)
                killer.start()
                for _ in range(200):
                    got += [client.next_id("lease") for _ in range(100)]
                    got += client.gen_ids(20)
                killer.join()
                got += [client.next_id("lease") for _ in range(5000)]
            self.assertEqual(len(set(got)), len(got))
        finally:
            cluster.close()


class ClosedWithRefillsInFlight(unittest.TestCase):
    def test_closing_a_client_with_refills_in_flight_leaves_every_node_serving(self):
        """A client closed while its refills wait on the nodes' stores
        cancels those calls; each node's fetch still lands (rule 46). Before,
        the cancelled call dropped the fetch it had claimed and the node's
        lease mode answered nothing again until restarted (round 1 or 2 of
        10, 3 runs in 3)."""
        cluster = fixture.Cluster(3)
        try:
            for _ in range(10):
                with idgen_client.Client(cluster.addrs(), deadline=10.0,
                                         prefetch=PrefetchConfig(size=2000, low=1000)) as client:
                    lease = [client.next_id("lease") for _ in range(3000)]
                    segment = [client.next_id("segment", "closed") for _ in range(3000)]
                self.assertEqual(len(set(lease)), 3000)
                self.assertEqual(len(set(segment)), 3000)
                for addr in cluster.addrs():
                    with idgen_client.Client([addr], deadline=5.0) as one:
                        self.assertEqual(len(set(one.gen_ids(5, "lease"))), 5, addr)
                        self.assertEqual(len(set(one.gen_ids(5, "segment", "closed"))), 5, addr)
        finally:
            cluster.close()


class Tls(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = fixture.Cluster(1, mtls=True)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()

    def test_mtls_with_the_client_certificate(self):
        c = self.cluster
        tls = TlsConfig(ca=c.cert("ca.pem"), cert=c.cert("client.pem"), key=c.cert("client-key.pem"))
        with idgen_client.Client(c.addrs(), tls=tls, deadline=10.0) as client:
            self.assertEqual(len(set(client.gen_ids(10))), 10)

    def test_refusals_say_what_to_fix(self):
        c = self.cluster
        no_cert = TlsConfig(ca=c.cert("ca.pem"))
        with idgen_client.Client(c.addrs(), tls=no_cert, deadline=1.0) as client:
            with self.assertRaises(idgen_client.IdgenError) as e:
                client.gen_id()
        self.assertIn("client certificate", str(e.exception))
        # The client's own certificate is no CA: the node is not trusted.
        wrong_ca = TlsConfig(ca=c.cert("client.pem"), cert=c.cert("client.pem"),
                             key=c.cert("client-key.pem"))
        with idgen_client.Client(c.addrs(), tls=wrong_ca, deadline=1.0) as client:
            with self.assertRaises(idgen_client.IdgenError) as e:
                client.gen_id()
        self.assertIn("not trusted", str(e.exception))
        with idgen_client.Client(c.addrs(), deadline=1.0) as client:
            with self.assertRaises(idgen_client.IdgenError) as e:
                client.gen_id()
        self.assertIn("TLS", str(e.exception))


if __name__ == "__main__":
    unittest.main()
