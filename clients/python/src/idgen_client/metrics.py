"""Prometheus metrics for the client (optional: `pip install
idgen-client[prometheus]`), under the Rust crate's names."""

from __future__ import annotations

from typing import Any, Optional

from ._metrics import Metrics


class PrometheusMetrics(Metrics):
    """Records the client's hooks with prometheus_client in `registry`
    (default: prometheus_client's global one)."""

    def __init__(self, registry: Optional[Any] = None) -> None:
        try:
            from prometheus_client import REGISTRY, Counter, Gauge
        except ImportError as e:  # pragma: no cover - depends on the install
            from ._errors import ConfigError
            raise ConfigError("PrometheusMetrics needs prometheus_client: "
                              "pip install 'idgen-client[prometheus]'") from e
        reg = REGISTRY if registry is None else registry
        # prometheus_client adds _total to counters itself.
        self._calls = Counter("idgen_client_calls", "Calls to idgen nodes, by method and outcome.",
                              ["method", "outcome"], registry=reg)
        self._retries = Counter("idgen_client_retries",
                                "Attempts repeated on another node.", registry=reg)
        self._failovers = Counter("idgen_client_failovers",
                                  "Calls that succeeded on another node than the first tried.",
                                  registry=reg)
        self._aside = Counter("idgen_client_nodes_set_aside",
                              "Times a node was set aside after failing.", registry=reg)
        self._nodes = Gauge("idgen_client_nodes", "Nodes currently known.", registry=reg)
        self._fallback = Gauge("idgen_client_datacenter_fallback",
                               "1 while the nodes in use are a fallback Consul datacenter's (the "
                               "local one lists no passing idgen node), else 0.", registry=reg)
        self._refills = Counter("idgen_client_refills", "Prefetch refills, by mode and outcome.",
                                ["mode", "outcome"], registry=reg)
        self._stalls = Counter("idgen_client_buffer_stalls",
                               "Calls to next_id that found the buffer empty and waited.",
                               registry=reg)
        self._discarded = Counter("idgen_client_ids_discarded",
                                  "Prefetched IDs thrown away unused, by reason; gaps, never "
                                  "repeats.", ["reason"], registry=reg)

    def call(self, method: str, outcome: str) -> None:
        self._calls.labels(method, outcome).inc()

    def retry(self) -> None:
        self._retries.inc()

    def failover(self) -> None:
        self._failovers.inc()

    def set_aside(self) -> None:
        self._aside.inc()

    def nodes(self, count: int) -> None:
        self._nodes.set(count)

    def datacenter_fallback(self, on: bool) -> None:
        self._fallback.set(1 if on else 0)

    def refill(self, mode: str, outcome: str) -> None:
        self._refills.labels(mode, outcome).inc()

    def stall(self) -> None:
        self._stalls.inc()

    def discarded(self, reason: str, count: int) -> None:
        self._discarded.labels(reason).inc(count)
