"""The synchronous client."""

from __future__ import annotations

import json
import threading
import uuid as _uuid
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from . import _hash
from ._call import Caller
from ._consul import ConsulDiscovery, ConsulWatch
from ._errors import (BadAnswerError, ConfigError, RevealRefusedError,
                      StrictNotPrefetchableError)
from ._metrics import Metrics
from ._nodes import NodeSet, TlsConfig
from ._pb import idgen_pb2 as pb
from ._prefetch import PrefetchConfig, Prefetcher

MODES = {
    "snowflake": pb.MODE_SNOWFLAKE,
    "segment": pb.MODE_SEGMENT,
    "lease": pb.MODE_LEASE,
    "strict": pb.MODE_STRICT,
}


def _counter(mode: str, tag: str) -> Optional[str]:
    """Whose counter a call of `mode` takes its values from, in words (as
    the Rust crate's call.rs says it), or None for snowflake IDs, which
    carry the datacenter id and may come from any datacenter."""
    if mode == "snowflake":
        return None
    if mode == "strict":
        return "strict key %s" % json.dumps(tag)
    if mode == "segment":
        return "segment tag %s" % json.dumps(tag)
    return "%s call" % mode


def _mode(mode: str) -> str:
    m = str(mode).lower()
    if m not in MODES:
        raise ConfigError("unknown mode %r: use one of %s" % (mode, ", ".join(MODES)))
    return m


def fields(message: Any) -> Dict[str, Any]:
    """The fields of `message` as the node answers them: every plain
    field, proto3 optional ones only when present, maps as dicts, enums
    by name."""
    out: Dict[str, Any] = {}
    for desc in message.DESCRIPTOR.fields:
        if desc.has_presence and not message.HasField(desc.name):
            continue
        value = getattr(message, desc.name)
        if desc.message_type is not None and desc.message_type.GetOptions().map_entry:
            value = dict(value)
        elif desc.is_repeated:
            value = list(value)
        elif desc.type == desc.TYPE_ENUM:
            value = desc.enum_type.values_by_number[value].name
        out[desc.name] = value
    return out


class Client:
    """A client of an idgen cluster. Thread-safe; create one per process
    and close it (or use it as a context manager).

    `nodes`: static `host:port` gRPC addresses; or `consul`: a
    ConsulDiscovery (Client.from_env() reads Consul's variables).
    `deadline`: seconds a call may take in all, failover included;
    `attempt_timeout`: the most one attempt on one node may take (default
    deadline/3), so a stalled node costs that, not the deadline.
    `set_aside`: seconds a failed node gets no calls (unless no other is
    left). `tls`: TlsConfig for TLS/mTLS. `prefetch`: PrefetchConfig of
    the next_id buffers. `admin_token`: sent as `authorization: Bearer`
    on reveal, parse and counter calls. `metrics`: a Metrics (e.g.
    idgen_client.metrics.PrometheusMetrics())."""

    def __init__(self, nodes: Optional[Sequence[str]] = None, *,
                 consul: Optional[ConsulDiscovery] = None, deadline: float = 2.0,
                 attempt_timeout: Optional[float] = None, set_aside: float = 1.0,
                 tls: Optional[TlsConfig] = None, prefetch: Optional[PrefetchConfig] = None,
                 admin_token: Optional[str] = None, metrics: Optional[Metrics] = None) -> None:
        if (nodes is None) == (consul is None):
            raise ConfigError("give either nodes (a static list) or consul (ConsulDiscovery)")
        if deadline <= 0:
            raise ConfigError("the deadline must be above zero, got %r" % deadline)
        attempt = deadline / 3 if attempt_timeout is None else attempt_timeout
        if attempt <= 0:
            raise ConfigError("the attempt timeout must be above zero, got %r" % attempt)
        self._admin: Optional[List[Tuple[str, str]]] = None
        if admin_token is not None:
            if not admin_token.strip():
                raise ConfigError("the admin token is empty")
            if not all(33 <= ord(c) < 127 or c == " " for c in admin_token):
                raise ConfigError("the admin token cannot be sent in a header: it must be "
                                  "visible ASCII (no line breaks or control characters)")
            self._admin = [("authorization", "Bearer " + admin_token)]
        self._prefetch_config = prefetch or PrefetchConfig()
        self._prefetch_config.validate()
        self._metrics = metrics or Metrics()
        self.deadline = deadline
        self._nodes = NodeSet(tls, set_aside,
                              consul is not None and consul.counters_may_cross_datacenters)
        self._caller = Caller(self._nodes, deadline, attempt, self._metrics)
        self._prefetchers: Dict[Tuple[str, str], Prefetcher] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        if consul is not None:
            watch = ConsulWatch(consul)
            found, index = watch.query(0)
            if consul.fallback_datacenters:
                watch.check_fallback_names()
                self._nodes.local_datacenter = watch.local_name()
            self._metrics.datacenter_fallback(False)
            if found or not watch.fall_back(self._nodes, self._replace):
                self._replace(found)
            threading.Thread(target=watch.run,
                             args=(index, self._nodes, self._replace, self._stopped),
                             name="idgen-consul-watch", daemon=True).start()
        else:
            self._replace(list(nodes or ()))

    @classmethod
    def from_env(cls, **kwargs: Any) -> "Client":
        """A client that finds the nodes through Consul, configured by
        Consul's own variables (CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN, ...);
        keyword arguments as for Client()."""
        return cls(consul=ConsulDiscovery.from_env(), **kwargs)

    def _replace(self, addrs: List[str], fallback: Optional[str] = None) -> None:
        self._nodes.replace(addrs, fallback)
        self._metrics.nodes(len(addrs))
        self._metrics.datacenter_fallback(fallback is not None)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stops discovery and refills and closes the channels. Prefetched
        IDs not handed out are gaps, never repeats."""
        self._stopped.set()
        with self._lock:
            prefetchers = list(self._prefetchers.values())
        for p in prefetchers:
            p.close()
        self._nodes.close()

    def nodes(self) -> List[str]:
        """The gRPC addresses of the nodes known now."""
        return self._nodes.addrs()

    def strict_node(self, key: str) -> Optional[str]:
        """The node a strict call on `key` goes to while every node is up
        (rendezvous hashing, as every idgen client does it)."""
        return _hash.route(key, self._nodes.addrs())

    def gen_id(self, mode: str = "snowflake", tag: str = "") -> int:
        """One ID from a node (GenId). `tag`: the segment tag or the strict
        key (`<namespace>/<key>`); empty for snowflake and lease."""
        m = _mode(mode)
        req = pb.GenIdRequest(mode=MODES[m], tag=tag)
        answer, _ = self._caller.call("GenId", req, strict=m == "strict",
                                      key=_hash.key_hash(tag) if m == "strict" else None,
                                      counter=_counter(m, tag))
        return int(answer.id)

    def gen_ids(self, count: int, mode: str = "snowflake", tag: str = "") -> List[int]:
        """`count` IDs from a node in one call (GenIds)."""
        return self.gen_ids_from(count, mode, tag)[0]

    def gen_ids_from(self, count: int, mode: str = "snowflake",
                     tag: str = "") -> Tuple[List[int], str]:
        """gen_ids, and the node that answered."""
        m = _mode(mode)
        req = pb.GenIdsRequest(mode=MODES[m], tag=tag, count=count)
        answer, node = self._caller.call("GenIds", req, strict=m == "strict",
                                         key=_hash.key_hash(tag) if m == "strict" else None,
                                         counter=_counter(m, tag))
        return list(answer.ids), node

    def prefetcher(self, mode: str = "snowflake", tag: str = "") -> Prefetcher:
        """The prefetch buffer of (mode, tag), made on first use; keep it
        for the fastest path (`p.next_id()`). Strict mode is refused."""
        m = _mode(mode)
        if m == "strict":
            raise StrictNotPrefetchableError()
        with self._lock:
            p = self._prefetchers.get((m, tag))
            if p is None:
                req_mode, counter = MODES[m], _counter(m, tag)

                def fetch(count: int, busy: set) -> List[int]:
                    req = pb.GenIdsRequest(mode=req_mode, tag=tag, count=count)
                    return list(self._caller.call("GenIds", req, avoid=busy,
                                                  counter=counter)[0].ids)

                p = Prefetcher(self, m, tag, self._prefetch_config, fetch)
                self._prefetchers[(m, tag)] = p
        return p

    def next_id(self, mode: str = "snowflake", tag: str = "") -> int:
        """The next ID of (mode, tag) from its prefetch buffer; a strict
        value comes from a node on every call."""
        if str(mode).lower() == "strict":
            return self.gen_id("strict", tag)
        p = self._prefetchers.get((mode, tag)) or self.prefetcher(mode, tag)
        return p.next_id()

    def gen_formatted(self, format: str, params: Optional[Mapping[str, str]] = None,
                      count: int = 1) -> List[str]:
        """`count` formatted IDs of `format` (GenFormatted). Never
        prefetched; retried on another node (an answer lost on the way is
        a gap, never a repeat)."""
        req = pb.GenFormattedRequest(format=format, params=dict(params or {}), count=count)
        return list(self._caller.call("GenFormatted", req,
                                      counter="format %s" % json.dumps(format))[0].ids)

    def parse_formatted(self, format: str, formatted_id: str) -> Dict[str, Any]:
        """The fields of a formatted ID (ParseFormatted), as the node sets them."""
        req = pb.ParseFormattedRequest(format=format, id=formatted_id)
        return fields(self._caller.call("ParseFormatted", req, metadata=self._admin)[0])

    def format_counter(self, format: str, params: Optional[Mapping[str, str]] = None
                       ) -> Dict[str, Any]:
        """A counter's durable record (GetFormatCounter): used, period,
        last, next_period_start_ms (token for a per-token format)."""
        req = pb.GetFormatCounterRequest(format=format, params=dict(params or {}))
        return fields(self._caller.call("GetFormatCounter", req, metadata=self._admin)[0])

    def decode_id(self, id: int, mode: str = "snowflake", tag: str = "") -> Dict[str, Any]:
        """The parts of `id` made in `mode` (DecodeId), under the answering
        node's layout."""
        req = pb.DecodeIdRequest(id=int(id), mode=MODES[_mode(mode)], tag=tag)
        return fields(self._caller.call("DecodeId", req, metadata=self._admin)[0])

    def reveal(self, tag: str, id: int) -> Dict[str, Any]:
        """The internal value of an ID of hidden segment tag `tag`: admin
        only (the client's admin_token; the node audit-logs it)."""
        if self._admin is None:
            raise RevealRefusedError(
                "revealing a hidden ID needs the admin token: give Client(admin_token=...)")
        out = self.decode_id(id, "segment", tag)
        if "internal_id" not in out:
            raise RevealRefusedError(
                "the node did not reveal the internal value of %s: the admin token was not "
                "accepted, or tag %r is not hidden" % (id, tag), True)
        return out

    def gen_uuids(self, count: int) -> List[_uuid.UUID]:
        """`count` UUIDv7 (GenUuids), strictly increasing."""
        answer = self._caller.call("GenUuids", pb.GenUuidsRequest(count=count))[0]
        raw = answer.uuids
        if len(raw) != 16 * count:
            raise BadAnswerError("GenUuids for %d UUIDs answered %d bytes, not %d"
                                 % (count, len(raw), 16 * count))
        return [_uuid.UUID(bytes=raw[i:i + 16]) for i in range(0, len(raw), 16)]

    def next_uuid(self) -> _uuid.UUID:
        """The next UUIDv7 from a prefetch buffer (refilled with GenUuids
        like next_id's buffers; UUIDs still buffered at close are never
        handed out)."""
        p = self._prefetchers.get(("uuid", ""))
        if p is None:
            with self._lock:
                p = self._prefetchers.get(("uuid", ""))
                if p is None:
                    def fetch(count: int, busy: set) -> List[_uuid.UUID]:
                        answer = self._caller.call("GenUuids", pb.GenUuidsRequest(count=count),
                                                   avoid=busy)[0]
                        raw = answer.uuids
                        if len(raw) != 16 * count:
                            raise BadAnswerError("GenUuids for %d UUIDs answered %d bytes, not %d"
                                                 % (count, len(raw), 16 * count))
                        return [_uuid.UUID(bytes=raw[i:i + 16]) for i in range(0, len(raw), 16)]

                    p = Prefetcher(self, "uuid", "", self._prefetch_config, fetch)
                    self._prefetchers[("uuid", "")] = p
        return p.next_id()

    def gen_uuid(self) -> _uuid.UUID:
        """One UUIDv7 (GenUuid)."""
        raw = self._caller.call("GenUuid", pb.GenUuidRequest())[0].uuid
        if len(raw) != 16:
            raise BadAnswerError("GenUuid answered %d bytes, not 16" % len(raw))
        return _uuid.UUID(bytes=raw)

