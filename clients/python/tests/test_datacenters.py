"""Falling back to another Consul datacenter
(ConsulDiscovery(fallback_datacenters=[...])), against real nodes: the
Consul emulator with two linked datacenters, dc1 (the client's own, the
primary) and dc2, a node in each with its own node.datacenter_id. The node
of dc1 killed -9 under load: snowflake IDs go on through dc2 with no error
and no duplicate; strict and segment calls are refused there (their
counters are per datacenter) unless the client opted in; dc1's node back:
calls return to it. The Rust crate's tests/client_datacenters.rs does the
same."""

import threading
import time
import unittest

import idgen_client
from idgen_client import ConsulDiscovery, PrefetchConfig

import fixture

DATACENTER = lambda i: (i >> 17) & 0x1F  # noqa: E731 (the default layout's datacenter bits)


def wait_nodes(client, node):
    """Waits (at most 20 s) until the client uses exactly `node`."""
    for _ in range(400):
        if client.nodes() == [node]:
            return
        time.sleep(0.05)
    raise AssertionError("the client uses %s, not [%s]" % (client.nodes(), node))


class TwoDatacenters(unittest.TestCase):
    def setUp(self):
        self.cluster = fixture.Cluster(0, datacenters=["dc2"])
        self.addCleanup(self.cluster.close)

    def client(self, counters_may_cross=False):
        consul = ConsulDiscovery(
            address="http://" + self.cluster.agents["dc1"], env=idgen_client.ConsulEnv(),
            wait=5.0, fallback_datacenters=["dc2"], fallback_recheck=0.5,
            counters_may_cross_datacenters=counters_may_cross)
        client = idgen_client.Client(consul=consul, deadline=8.0, set_aside=0.3,
                                     prefetch=PrefetchConfig(size=200, low=100))
        self.addCleanup(client.close)
        return client

    def assert_refused(self, call, counter):
        with self.assertRaises(idgen_client.CrossesDatacentersError) as e:
            call()
        err = e.exception
        self.assertEqual(err.code, "UNAVAILABLE")
        self.assertFalse(err.sent, "refused before sending")
        for words in (counter, 'the local Consul datacenter "dc1" has no passing idgen node',
                      'fallback datacenter "dc2"', "counters_may_cross_datacenters"):
            self.assertIn(words, str(err))

    def test_with_the_local_datacenter_gone_snowflake_goes_on_through_the_fallback(self):
        c = self.cluster
        a = c.start_node("a", "dc1", 1)
        b = c.start_node("b", "dc2", 2)
        c.wait_passing(1, "dc1")
        c.wait_passing(1, "dc2")
        client = self.client()
        crossing = self.client(counters_may_cross=True)
        self.assertEqual(client.nodes(), [a.grpc], "local first")
        strict_before = client.gen_id("strict", "seats/a1")

        stop = threading.Event()
        got, errors = [], []

        def load(prefetched):
            while not stop.is_set():
                try:
                    got.append(client.next_id() if prefetched else client.gen_id())
                except idgen_client.IdgenError as e:
                    errors.append(str(e))
                time.sleep(0.001)

        threads = [threading.Thread(target=load, args=(t % 2 == 0,)) for t in range(4)]
        for t in threads:
            t.start()
        try:
            time.sleep(0.5)
            a.kill()
            wait_nodes(client, b.grpc)
            time.sleep(0.7)
            self.assert_refused(lambda: client.gen_id("strict", "seats/a1"),
                                'strict key "seats/a1"')
            self.assert_refused(lambda: client.gen_ids(3, "segment", "orders"),
                                'segment tag "orders"')
            self.assert_refused(lambda: client.next_id("segment", "orders"),
                                'segment tag "orders"')
            wait_nodes(crossing, b.grpc)
            crossing.gen_id("strict", "seats/a1")  # the user opted in

            a = c.start_node("a", "dc1", 1)
            wait_nodes(client, a.grpc)
            time.sleep(0.3)
        finally:
            stop.set()
            for t in threads:
                t.join()
        self.assertEqual(errors, [], "the application saw errors")
        self.assertEqual(len(set(got)), len(got), "an ID was handed out twice")
        self.assertEqual({DATACENTER(i) for i in got}, {1, 2}, "IDs from both datacenters")
        for _ in range(20):
            i = client.gen_id()
            self.assertEqual(DATACENTER(i), 1, "back on the local datacenter")
            self.assertNotIn(i, got)
        self.assertGreater(client.gen_id("strict", "seats/a1"), strict_before)


class FallbackSettings(unittest.TestCase):
    def test_a_single_string_or_an_empty_name_is_refused(self):
        for bad in ("dc2", ["dc2", ""]):
            consul = ConsulDiscovery(address="http://127.0.0.1:1", env=idgen_client.ConsulEnv(),
                                     fallback_datacenters=bad)
            with self.assertRaises(idgen_client.ConfigError):
                idgen_client.Client(consul=consul)


if __name__ == "__main__":
    unittest.main()
