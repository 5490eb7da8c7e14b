"""What can go wrong when asking for IDs: one exception class per case,
with the wordings of the Rust crate (client/src/error.rs). Every error
has `code` (the gRPC code name closest to it, or CONFIG for a setting
this client refused) and `sent` (whether the request may have reached a
node: a strict call with sent=True may have taken a value)."""

from __future__ import annotations

import json
from typing import Optional


class IdgenError(Exception):
    """Base of every error this client raises."""

    code = "UNKNOWN"

    def __init__(self, message: str, sent: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.sent = sent


class NoNodesError(IdgenError):
    """No node is known: the static list was empty, or Consul lists no
    passing instance."""

    code = "UNAVAILABLE"

    def __init__(self) -> None:
        super().__init__(
            "no idgen node is known: check the endpoint list or the Consul service name, "
            "tag and datacenter"
        )


class DeadlineExceededError(IdgenError):
    """The call's deadline passed before any node answered."""

    code = "DEADLINE_EXCEEDED"

    def __init__(self, deadline: float, last: str, attempts: int, nodes: int,
                 sent: bool = False) -> None:
        tried = ""
        if attempts:
            tried = " after %s on %s" % (_plural(attempts, "attempt"), _plural(nodes, "node"))
        super().__init__(
            "no node answered within the deadline of %s%s (last error: %s)"
            % (seconds_text(deadline), tried, last),
            sent,
        )
        self.deadline, self.last, self.attempts, self.nodes = deadline, last, attempts, nodes


class StatusError(IdgenError):
    """A node answered with an error that another node cannot fix
    (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, ...), or a strict
    call failed in a way that may have reached the node."""

    def __init__(self, code: str, message: str, sent: bool = True) -> None:
        super().__init__("idgen answered %s: %s" % (_camel(code), message), sent)
        self.code = code
        self.details = message


class TransportError(IdgenError):
    """A strict call failed on its way to or from a node (connection broken,
    TLS mismatch) after it may have reached the node: it is not sent again."""

    code = "UNAVAILABLE"

    def __init__(self, node: str, cause: str, sent: bool = True) -> None:
        super().__init__("the call to %s failed in transit: %s" % (node, cause), sent)
        self.node, self.cause = node, cause


class StrictNotPrefetchableError(IdgenError):
    """Strict values must each come from a node: they cannot be prefetched."""

    code = "INVALID_ARGUMENT"

    def __init__(self) -> None:
        super().__init__(
            "strict mode cannot be prefetched (each value must come from a node): use Client.gen_id"
        )


class CrossesDatacentersError(IdgenError):
    """A strict, segment, lease or formatted call while the nodes in use
    are a fallback datacenter's (the local one lists no passing node): its
    value would come from that datacenter's counter, which can hand out a
    value the local cluster also hands out. Never sent; retry once a local
    node passes, or see ConsulDiscovery(counters_may_cross_datacenters=...)."""

    code = "UNAVAILABLE"

    def __init__(self, counter: str, local: str, fallback: str) -> None:
        super().__init__(
            "%s refused: the local Consul datacenter %s has no passing idgen node and the nodes "
            "in use are fallback datacenter %s's, whose counters are not the local cluster's (a "
            "value from there can repeat one issued here); retry once a local node passes, or "
            "opt in with counters_may_cross_datacenters if each datacenter's keys and tags are "
            "its own" % (counter, json.dumps(local), json.dumps(fallback)))
        self.counter, self.local, self.fallback = counter, local, fallback


class ConfigError(IdgenError):
    """The client was configured wrongly (a setting, a TLS file)."""

    code = "CONFIG"

    def __init__(self, what: str) -> None:
        super().__init__("invalid client configuration: %s" % what)


class DiscoveryError(IdgenError):
    """Consul could not be asked for the nodes at start-up (unreachable,
    refused the token, TLS)."""

    code = "UNAVAILABLE"

    def __init__(self, what: str, code: Optional[str] = None) -> None:
        super().__init__("Consul discovery failed: %s" % what)
        if code:
            self.code = code


class BadAnswerError(IdgenError):
    """A node answered something this client cannot read."""

    code = "INTERNAL"

    def __init__(self, what: str) -> None:
        super().__init__("a node's answer makes no sense: %s" % what, True)


class RevealRefusedError(IdgenError):
    """A reveal (the internal value of a hidden ID) without the admin token,
    or with one the node did not accept."""

    code = "PERMISSION_DENIED"


def _plural(n: int, word: str) -> str:
    return "%d %s%s" % (n, word, "" if n == 1 else "s")


def _camel(code: str) -> str:
    # The Rust crate prints tonic's Debug names (InvalidArgument).
    return "".join(p.capitalize() for p in code.split("_"))


def seconds_text(seconds: float) -> str:
    """A duration as the Rust crate prints one (2s, 500ms, 1.5s)."""
    if seconds < 1:
        return "%gms" % round(seconds * 1000, 3)
    return "%gs" % round(seconds, 3)
