"""Metrics hooks: the Client reports calls, retries, failovers, set-aside
nodes, refills, stalls and discarded IDs to a Metrics object. The default
records nothing; metrics.PrometheusMetrics records them with
prometheus_client under the Rust crate's names (idgen_client_...)."""

from __future__ import annotations


class Metrics:
    """The hooks, each a no-op here: subclass to record them elsewhere."""

    def call(self, method: str, outcome: str) -> None:
        """A call to the cluster ended (`outcome`: ok or error)."""

    def retry(self) -> None:
        """An attempt is repeated on another node."""

    def failover(self) -> None:
        """A call succeeded on another node than the one first tried."""

    def set_aside(self) -> None:
        """A node was set aside after failing."""

    def nodes(self, count: int) -> None:
        """The number of known nodes changed."""

    def datacenter_fallback(self, on: bool) -> None:
        """The nodes in use are a fallback datacenter's (True) or the local
        one's again (False)."""

    def refill(self, mode: str, outcome: str) -> None:
        """A prefetch refill ended."""

    def stall(self) -> None:
        """next_id found its buffer empty and waited for a refill."""

    def discarded(self, reason: str, count: int) -> None:
        """Prefetched IDs were thrown away unused (gaps, never repeats)."""
