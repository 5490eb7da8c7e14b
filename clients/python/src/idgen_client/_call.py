"""One call to the cluster (the Rust crate's call.rs): pick a node, send
with the smaller of the time left and the per-attempt budget, and on
UNAVAILABLE, a transport failure, a stalled node or a refusal marked
idgen-retry-elsewhere try another node after a jittered backoff, all
within the call's deadline. A strict call is sent again only when it
provably never left this process (the connection could not be made)."""

from __future__ import annotations

import random
import time
from typing import Any, List, Optional, Set, Tuple

import grpc

from ._errors import (DeadlineExceededError, IdgenError, NoNodesError, StatusError,
                      TransportError)
from ._metrics import Metrics
from ._nodes import Node, NodeSet

RETRY_ELSEWHERE = "idgen-retry-elsewhere"


def never_sent(details: str) -> bool:
    """The request never reached a node: grpc could not make the
    connection (refused, or the TLS handshake failed)."""
    return "failed to connect to all addresses" in details


def is_transport(err: grpc.RpcError) -> bool:
    """The failure came from the connection, not from a node's answer."""
    details = err.details() or ""
    if err.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    marks = ("failed to connect", "Socket closed", "Connection reset", "Broken pipe",
             "GOAWAY", "Ssl", "handshake", "recvmsg", "sendmsg", "Stream removed",
             "Cancelling all calls", "Connection refused")
    return any(m in details for m in marks)


def describe(err: grpc.RpcError, tls: bool, identity: bool) -> str:
    """A transport failure in words that say what to do, then grpc's own."""
    details = err.details() or ""
    low = details.lower()
    if "certificate_required" in low:
        words = ("TLS: the node requires a client certificate and did not take this one: "
                 "check TlsConfig(cert=..., key=...)" if identity else
                 "TLS: the node requires a client certificate: set "
                 "TlsConfig(ca=..., cert=..., key=...)")
    elif identity and any(w in low for w in ("bad_certificate", "unknown_ca", "certificate_unknown",
                                             "certificate_expired", "access_denied")):
        words = ("TLS: the node refused the client certificate: it must be signed by the node's "
                 "server.tls.client_ca, unexpired, X.509 v3 with clientAuth usage")
    elif "certificate" in low:
        words = ("TLS: the node's certificate is not trusted: check the CA and the server name "
                 "of TlsConfig")
    elif tls and ("wrong_version_number" in low or "packet_length_too_long" in low
                  or "record_layer" in low):
        words = "TLS: the node does not speak TLS; it serves plaintext: drop tls="
    elif tls and any(w in low for w in ("handshake", "socket closed", "reset", "unwrap failed",
                                        "tsi_data_corrupted", "secure read failed")):
        words = ("the connection closed during or right after the TLS handshake: if the node "
                 "requires a client certificate (server.tls.client_required), set "
                 "TlsConfig(cert=..., key=...)" if not identity else
                 "the connection closed during or right after the TLS handshake (the node may "
                 "have refused the client certificate)")
    elif not tls and ("reset" in low or "socket closed" in low or "broken pipe" in low):
        words = ("the connection broke; the node may speak TLS (then set "
                 "tls=TlsConfig(ca=...)), or it stopped")
    elif "refused" in low:
        words = ("connection refused: nothing listens there (is idgen serving at this address? "
                 "A node that is shutting down or restarting refuses connections too)")
    elif "deadline" in low or "timed out" in low or "timeout" in low:
        words = "timed out connecting: the node or its network does not answer"
    else:
        words = "the connection failed"
    return "%s (%s)" % (words, details)


class Caller:
    """Sends calls to the node set with failover."""

    def __init__(self, nodes: NodeSet, deadline: float, attempt_timeout: float,
                 metrics: Metrics, backoff_base: float = 0.005, backoff_max: float = 0.1) -> None:
        self.nodes = nodes
        self.deadline = deadline
        self.attempt_timeout = attempt_timeout
        self.metrics = metrics
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max

    def call(self, method: str, request: Any, *, strict: bool = False, key: Optional[int] = None,
             metadata: Optional[List[Tuple[str, str]]] = None,
             avoid: Optional[Set[str]] = None, counter: Optional[str] = None) -> Tuple[Any, str]:
        """The answer of `method` and the node that gave it. `counter`
        (e.g. 'strict key "a/b"'): the call's values come from a cluster's
        counter, so a fallback datacenter's node is refused
        (NodeSet.crossing)."""
        try:
            result = self._attempts(method, request, strict, key, metadata, avoid, counter)
        except IdgenError:
            self.metrics.call(method, "error")
            raise
        self.metrics.call(method, "ok")
        return result

    def _attempts(self, method, request, strict, key, metadata, avoid, counter):
        started = time.monotonic()
        tried: List[Node] = []
        attempts, nodes_tried = 0, set()
        last, backoff = "none", 0
        sent = False
        while True:
            left = self.deadline - (time.monotonic() - started)
            if left <= 0:
                raise DeadlineExceededError(self.deadline, last, attempts, len(nodes_tried), sent)
            node = self.nodes.pick(tried, key, avoid)
            if node is None:
                if not tried:
                    raise NoNodesError()
                # Every node was tried once: start over after a pause.
                tried.clear()
                self._backoff(backoff, left)
                backoff += 1
                continue
            if counter is not None:
                # Checked on the node about to be sent to, so a switch of
                # datacenter between two attempts cannot slip past it.
                self.nodes.crossing(node, counter)
            if not self.nodes.acquire(node):
                # It left the set (discovery replaced it) since the pick.
                tried.append(node)
                continue
            budget = min(left, self.attempt_timeout)
            attempts += 1
            nodes_tried.add(node.addr)
            if avoid is not None:
                avoid.add(node.addr)
            try:
                answer = getattr(node.stub, method)(request, timeout=budget, metadata=metadata)
            except grpc.RpcError as err:
                last, sent = self._failed(node, err, strict, budget, left, attempts,
                                          len(nodes_tried), sent, last)
            else:
                if len(tried) > 0:
                    self.metrics.failover()
                return answer, node.addr
            finally:
                self.nodes.release(node)
                if avoid is not None:
                    avoid.discard(node.addr)
            tried.append(node)
            self._backoff(backoff, self.deadline - (time.monotonic() - started))
            backoff += 1

    def _failed(self, node: Node, err: grpc.RpcError, strict: bool, budget: float, left: float,
                attempts: int, nodes: int, sent_before: bool,
                last: str) -> Tuple[str, bool]:
        """What to report if no node succeeds (and whether a request may
        have reached a node), or raises the call's error. `last` is what the
        attempts before this one said."""
        code = err.code()
        details = err.details() or ""
        tls = self.nodes.tls
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            what = "%s did not answer within the attempt timeout of %s" % (
                node.addr, _secs(budget))
            if budget >= left - 1e-3:
                # The call's own deadline, not the attempt's share. A timeout
                # says less than the failure before it (often the reason, a
                # TLS refusal say): keep both, as the Rust crate does.
                timed_out = "%s did not answer in time" % node.addr
                if last != "none":
                    timed_out = "%s; before that, %s" % (timed_out, last)
                raise DeadlineExceededError(
                    self.deadline, timed_out, attempts, nodes,
                    sent_before or not never_sent(details)) from None
            self.nodes.set_aside(node)
            self.metrics.set_aside()
            if strict:
                raise DeadlineExceededError(
                    self.deadline, "%s; a strict call is not sent twice (the node may have taken "
                    "a value)" % what, attempts, nodes, True) from None
            self.metrics.retry()
            return what, True
        transport = is_transport(err)
        trailing = dict(err.trailing_metadata() or ()) if hasattr(err, "trailing_metadata") else {}
        elsewhere = code == grpc.StatusCode.UNAVAILABLE or RETRY_ELSEWHERE in trailing
        if elsewhere:
            self.nodes.set_aside(node)
            self.metrics.set_aside()
        unsent = transport and never_sent(details)
        retryable = unsent if strict else elsewhere
        text = describe(err, tls is not None, bool(tls and tls.cert)) if transport else \
            "%s %s" % (code.name, details)
        if not retryable:
            if transport:
                raise TransportError(node.addr, text, sent=not unsent) from None
            raise StatusError(code.name, details, sent=True) from None
        self.metrics.retry()
        return "%s: %s" % (node.addr, text), sent_before or not unsent

    def _backoff(self, attempt: int, left: float) -> None:
        """Full jitter up to base * 2^attempt (capped), so callers that
        failed together do not retry together."""
        cap = min(self.backoff_base * (1 << min(attempt, 16)), self.backoff_max, max(left, 0))
        time.sleep(cap * random.random())


def _secs(s: float) -> str:
    from ._errors import seconds_text
    return seconds_text(s)
