"""The known nodes: one gRPC channel each, calls in flight, and which
ones are set aside after failing (the Rust crate's nodes.rs, without the
health probe: a node is set aside for one period)."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Set, Tuple

import grpc

from . import _hash
from ._pb import idgen_pb2_grpc


@dataclass(frozen=True)
class TlsConfig:
    """TLS to the nodes: the CA (PEM file) that signed their certificates,
    a client certificate and key (PEM files) for nodes with
    server.tls.client_required (mTLS), and the name their certificates
    carry when it is not the address's host."""

    ca: str
    cert: Optional[str] = None
    key: Optional[str] = None
    server_name: Optional[str] = None

    def credentials(self) -> grpc.ChannelCredentials:
        """grpc credentials; a missing file or half an identity is a
        ConfigError naming it."""
        from ._errors import ConfigError

        if bool(self.cert) != bool(self.key):
            raise ConfigError("TLS: give both the client certificate and its key, or neither")

        def read(what: str, path: str) -> bytes:
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as e:
                raise ConfigError("TLS: cannot read the %s %s: %s" % (what, path, e)) from e
            if b"-----BEGIN" not in data:
                raise ConfigError("TLS: the %s %s is not PEM" % (what, path))
            return data

        return grpc.ssl_channel_credentials(
            root_certificates=read("CA", self.ca),
            private_key=read("client key", self.key) if self.key else None,
            certificate_chain=read("client certificate", self.cert) if self.cert else None,
        )


class Node:
    """One idgen node."""

    __slots__ = ("addr", "channel", "stub", "outstanding", "aside_until", "fallback", "retired",
                 "closed")

    def __init__(self, addr: str, channel: grpc.Channel, fallback: Optional[str] = None) -> None:
        self.addr = addr
        self.channel = channel
        self.stub = idgen_pb2_grpc.IdGenStub(channel)
        self.outstanding = 0
        self.aside_until = 0.0
        # The fallback Consul datacenter that listed this node (None: the
        # local one, or a static list).
        self.fallback = fallback
        # Left the set (its channel is closed once no call is in flight on
        # it), and closed.
        self.retired = False
        self.closed = False


class NodeSet:
    """The current nodes, replaced as a whole when discovery changes them
    (channels of nodes that stay are kept)."""

    def __init__(self, tls: Optional[TlsConfig], set_aside: float,
                 counters_may_cross: bool = False) -> None:
        self._lock = threading.Lock()
        self.counters_may_cross = counters_may_cross
        # The local datacenter's name, for the words of a refusal.
        self.local_datacenter = "local"
        self._nodes: List[Node] = []
        self._set_aside = set_aside
        self._tls = tls
        self._credentials = tls.credentials() if tls else None
        self._options: List[Tuple[str, object]] = [
            # Fail fast while a node is down, and come back soon after.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
        ]
        if tls and tls.server_name:
            self._options.append(("grpc.ssl_target_name_override", tls.server_name))

    @property
    def tls(self) -> Optional[TlsConfig]:
        return self._tls

    def addrs(self) -> List[str]:
        return [n.addr for n in self._nodes]

    def fallback(self) -> Optional[str]:
        """The fallback datacenter whose nodes are in use, or None."""
        nodes = self._nodes
        return nodes[0].fallback if nodes else None

    def crossing(self, node: Node, counter: str) -> None:
        """Raises CrossesDatacentersError when a call whose values come
        from `counter` (a strict key, a segment tag...) would go to a
        fallback datacenter's node without the user's opt-in: that
        datacenter's cluster counts the same keys in its own KV."""
        if node.fallback is not None and not self.counters_may_cross:
            from ._errors import CrossesDatacentersError
            raise CrossesDatacentersError(counter, self.local_datacenter, node.fallback)

    def replace(self, addrs: Sequence[str], fallback: Optional[str] = None) -> None:
        """The nodes are now `addrs`, listed by fallback datacenter
        `fallback` (None: the local one)."""
        with self._lock:
            old: Dict[str, Node] = {n.addr: n for n in self._nodes if n.fallback == fallback}
            nodes: List[Node] = []
            for addr in addrs:
                if any(n.addr == addr for n in nodes):
                    continue
                node = old.pop(addr, None) or Node(addr, self._channel(addr), fallback)
                nodes.append(node)
            kept = set(map(id, nodes))
            gone = []
            for n in self._nodes:
                if id(n) in kept:
                    continue
                # A node that left may still be answering calls (a live
                # fallback datacenter's, when the local one is back):
                # its channel closes after the last of them.
                n.retired = True
                if n.outstanding == 0:
                    n.closed = True
                    gone.append(n)
            self._nodes = nodes
        for n in gone:
            n.channel.close()

    def acquire(self, node: Node) -> bool:
        """Counts a call in flight on `node`; False when the node left the
        set and its channel is closed (pick another)."""
        with self._lock:
            if node.closed:
                return False
            node.outstanding += 1
            return True

    def release(self, node: Node) -> None:
        """The call on `node` ended; the channel of a node that left the
        set closes with its last call."""
        with self._lock:
            node.outstanding -= 1
            close = node.retired and node.outstanding == 0 and not node.closed
            if close:
                node.closed = True
        if close:
            node.channel.close()

    def _channel(self, addr: str) -> grpc.Channel:
        if self._credentials is None:
            return grpc.insecure_channel(addr, options=self._options)
        return grpc.secure_channel(addr, self._credentials, options=self._options)

    def pick(self, tried: Sequence[Node], key: Optional[int] = None,
             avoid: Optional[Set[str]] = None) -> Optional[Node]:
        """A node not in `tried`, not set aside (unless no other is left):
        the key's own node by rendezvous hashing for a strict key, else
        power of two choices on calls in flight, preferring nodes not in
        `avoid` (those a prefetch buffer already has a refill on)."""
        nodes = self._nodes
        now = time.monotonic()
        fresh = [n for n in nodes if n not in tried]
        candidates = [n for n in fresh if n.aside_until <= now] or fresh
        if not candidates:
            return None
        if key is not None:
            best, score = candidates[0], -1
            for n in candidates:
                s = _hash.rendezvous(key, n.addr)
                if s >= score:
                    best, score = n, s
            return best
        if avoid:
            candidates = [n for n in candidates if n.addr not in avoid] or candidates
        if len(candidates) == 1:
            return candidates[0]
        a, b = random.sample(candidates, 2)
        return b if b.outstanding < a.outstanding else a

    def set_aside(self, node: Node) -> None:
        """No calls to `node` (unless no other is left) for one period."""
        node.aside_until = time.monotonic() + self._set_aside

    def close(self) -> None:
        with self._lock:
            nodes, self._nodes = self._nodes, []
            for n in nodes:
                n.closed = True
        for n in nodes:
            n.channel.close()
