"""Consul discovery, configured the consul CLI's way from Consul's own
environment variables (CONSUL_HTTP_ADDR, CONSUL_HTTP_SSL,
CONSUL_HTTP_TOKEN, CONSUL_HTTP_TOKEN_FILE, CONSUL_CACERT,
CONSUL_CLIENT_CERT / CONSUL_CLIENT_KEY, CONSUL_TLS_SERVER_NAME,
CONSUL_HTTP_SSL_VERIFY) with the Rust crate's rules and error wordings
(client/src/consul_env.rs, discovery.rs): settings given explicitly win
over the variables, which win over the defaults; empty values count as
unset; a boolean that is not one is an error naming the variable."""

from __future__ import annotations

import json
import logging
import os
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ._errors import ConfigError, DiscoveryError

log = logging.getLogger("idgen_client")

DEFAULT_CONSUL_ADDR = "http://127.0.0.1:8500"

_VARS = (
    "CONSUL_HTTP_ADDR", "CONSUL_HTTP_SSL", "CONSUL_HTTP_TOKEN", "CONSUL_HTTP_TOKEN_FILE",
    "CONSUL_CACERT", "CONSUL_CLIENT_CERT", "CONSUL_CLIENT_KEY", "CONSUL_TLS_SERVER_NAME",
    "CONSUL_HTTP_SSL_VERIFY",
)
_PLAINTEXT_TO_HTTPS = "Client sent an HTTP request to an HTTPS server"


def _parse_bool(name: str, value: Optional[str]) -> Optional[bool]:
    """Go's strconv.ParseBool, which Consul uses for its booleans."""
    if value is None:
        return None
    if value in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if value in ("0", "f", "F", "false", "FALSE", "False"):
        return False
    raise ValueError("%s=%s is not a boolean: use true or false" % (name, json.dumps(value)))


@dataclass
class ConsulEnv:
    """Consul's client variables as read at one moment (empty = unset)."""

    vars: Dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> "ConsulEnv":
        """From `env` (default: the process environment)."""
        env = os.environ if env is None else env
        return cls({k: env[k] for k in _VARS if env.get(k)})

    def _get(self, name: str) -> Optional[str]:
        return self.vars.get(name) or None

    def address(self) -> str:
        """The agent's URL: CONSUL_HTTP_ADDR with its scheme (http:// unless
        it says https:// or CONSUL_HTTP_SSL is true), else the default."""
        ssl_on = _parse_bool("CONSUL_HTTP_SSL", self._get("CONSUL_HTTP_SSL")) or False
        raw = self._get("CONSUL_HTTP_ADDR") or "127.0.0.1:8500"
        scheme, sep, rest = raw.partition("://")
        if not sep:
            scheme, rest = "http", raw
        elif scheme not in ("http", "https"):
            raise ValueError(
                "CONSUL_HTTP_ADDR=%s: the scheme %s:// is not supported; use host:port, "
                "http:// or https://" % (json.dumps(raw), scheme))
        if not rest:
            raise ValueError("CONSUL_HTTP_ADDR=%s names no host" % json.dumps(raw))
        return "%s://%s" % ("https" if ssl_on else scheme, rest)

    def acl_token(self) -> Optional[str]:
        """CONSUL_HTTP_TOKEN_FILE's content (trimmed) when it holds one, else
        CONSUL_HTTP_TOKEN. An unreadable file is an error naming it."""
        path = self._get("CONSUL_HTTP_TOKEN_FILE")
        if path:
            try:
                with open(path, encoding="utf-8") as f:
                    token = f.read().strip()
            except OSError as e:
                raise ValueError(
                    "CONSUL_HTTP_TOKEN_FILE=%s: cannot read the token file: %s" % (path, e)
                ) from e
            if token:
                return token
        return self._get("CONSUL_HTTP_TOKEN")

    def verify(self) -> bool:
        """Whether certificate checks are on (CONSUL_HTTP_SSL_VERIFY not false)."""
        v = _parse_bool("CONSUL_HTTP_SSL_VERIFY", self._get("CONSUL_HTTP_SSL_VERIFY"))
        return True if v is None else v

    def server_name(self) -> Optional[str]:
        """CONSUL_TLS_SERVER_NAME without a :port suffix (a bare IPv6
        address has no port)."""
        name = self._get("CONSUL_TLS_SERVER_NAME")
        if name is None:
            return None
        host, sep, port = name.rpartition(":")
        if sep and "]" not in port and port.isdigit() and (":" not in host or host.endswith("]")):
            name = host
        return name.lstrip("[").rstrip("]")

    def tls(self) -> ssl.SSLContext:
        """The HTTPS context for an https:// agent. Without a CA and with
        checks on, an error that says what to set (no system roots)."""
        cert, key = self._get("CONSUL_CLIENT_CERT"), self._get("CONSUL_CLIENT_KEY")
        if bool(cert) != bool(key):
            raise ValueError("set both CONSUL_CLIENT_CERT and CONSUL_CLIENT_KEY, or neither")
        ctx = _NamedContext(ssl.PROTOCOL_TLS_CLIENT)
        if not self.verify():
            log.warning("CONSUL_HTTP_SSL_VERIFY=false: the Consul agent's certificate is NOT "
                        "checked; anyone on the path can answer as the agent and list other nodes")
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ca = self._get("CONSUL_CACERT")
            if not ca:
                raise ValueError(
                    "an https:// Consul address needs the CA (PEM) that signed the agent's "
                    "certificate: set CONSUL_CACERT")
            try:
                ctx.load_verify_locations(cafile=ca)
            except (OSError, ssl.SSLError) as e:
                raise ValueError("CONSUL_CACERT/CONSUL_CLIENT_CERT/CONSUL_CLIENT_KEY: %s (CA %s)"
                                 % (e, ca)) from e
            ctx.server_name = self.server_name()
        if cert:
            try:
                ctx.load_cert_chain(cert, key)
            except (OSError, ssl.SSLError) as e:
                raise ValueError("CONSUL_CLIENT_CERT/CONSUL_CLIENT_KEY: %s (certificate %s, key %s)"
                                 % (e, cert, key)) from e
        return ctx


class _NamedContext(ssl.SSLContext):
    """Checks the agent's certificate against `server_name`
    (CONSUL_TLS_SERVER_NAME) instead of the URL's host."""

    server_name: Optional[str] = None

    def wrap_socket(self, sock, *args, server_hostname=None, **kwargs):  # type: ignore[override]
        return super().wrap_socket(
            sock, *args, server_hostname=self.server_name or server_hostname, **kwargs)


@dataclass
class ConsulDiscovery:
    """How to find idgen nodes in Consul: /v1/health/service/<service>?passing,
    then watched with blocking queries. `address`/`token` given here win
    over Consul's variables (read from `env`, default the process
    environment, when the value is made)."""

    address: Optional[str] = None
    service: str = "idgen"
    token: Optional[str] = None
    datacenter: Optional[str] = None
    tag: Optional[str] = None
    wait: float = 30.0
    env: Optional[ConsulEnv] = None
    # Consul datacenters to take nodes from, first one first, while the
    # local one (or `datacenter`) lists no passing idgen node; back to the
    # local one as soon as it lists one. Snowflake IDs and UUIDs cross (the
    # datacenter id is part of each, and every datacenter's nodes own
    # their own: safety rule 39); strict, segment, lease and formatted
    # calls are refused there (CrossesDatacentersError) unless
    # counters_may_cross_datacenters: their counters live in each
    # datacenter's own KV, so a value from another datacenter can repeat
    # one issued here.
    fallback_datacenters: Sequence[str] = ()
    counters_may_cross_datacenters: bool = False
    # While a fallback datacenter is in use: how long one blocking query
    # on the local datacenter waits before the fallbacks are read again.
    fallback_recheck: float = 5.0

    @classmethod
    def from_env(cls, **kwargs) -> "ConsulDiscovery":
        """Discovery configured by Consul's variables; keyword arguments win."""
        return cls(**kwargs)

    def _settings(self) -> Tuple[str, Optional[str], Optional[ssl.SSLContext]]:
        env = self.env if self.env is not None else ConsulEnv.from_env()
        try:
            address = self.address or env.address()
            if not address.startswith(("http://", "https://")):
                raise ValueError("the Consul address %s must start with http:// or https://"
                                 % json.dumps(address))
            if not self.service:
                raise ValueError("the Consul service name is empty")
            if self.wait > 600:
                raise ValueError("the blocking-query wait is at most 10 minutes (Consul's limit)")
            if isinstance(self.fallback_datacenters, str):
                raise ValueError("fallback_datacenters is a list of datacenter names, not one "
                                 "string: fallback_datacenters=[%s]"
                                 % json.dumps(self.fallback_datacenters))
            if any(not dc for dc in self.fallback_datacenters):
                raise ValueError("a fallback datacenter name is empty: name each Consul "
                                 "datacenter")
            if self.fallback_recheck <= 0:
                raise ValueError("the fallback recheck period must be above zero")
            token = self.token or env.acl_token()
            ctx = None
            if address.startswith("https://"):
                try:
                    ctx = env.tls()
                except ValueError as e:
                    raise ValueError("the Consul address %s is https://: %s"
                                     % (json.dumps(address), e)) from e
        except ValueError as e:
            raise ConfigError(str(e)) from e
        return address.rstrip("/"), token, ctx


class ConsulWatch:
    """Asks Consul for the passing instances once (the client does not
    start without an answer), then keeps the node list current from a
    daemon thread with blocking queries; while Consul cannot be reached
    the last known nodes stay in use."""

    def __init__(self, config: ConsulDiscovery) -> None:
        self.config = config
        self.address, self.token, self.context = config._settings()

    def query(self, index: int = 0, dc: Optional[str] = None,
              wait: Optional[float] = None) -> Tuple[List[str], int]:
        """The passing instances of datacenter `dc` (default: the local
        one, or `datacenter`), blocking on `index` when not 0 for at most
        `wait` seconds (default: the configured wait)."""
        c = self.config
        wait = c.wait if wait is None else wait
        dc = dc or c.datacenter
        query = [("passing", "")]
        if dc:
            query.append(("dc", dc))
        if c.tag:
            query.append(("tag", c.tag))
        timeout = 5.0
        if index > 0:
            query += [("index", str(index)), ("wait", "%dms" % int(wait * 1000))]
            timeout += wait + wait / 16
        url = "%s/v1/health/service/%s?%s" % (
            self.address, urllib.parse.quote(c.service, safe=""),
            urllib.parse.urlencode(query).replace("passing=", "passing", 1))
        request = urllib.request.Request(url)
        if self.token:
            # In a header, never in the URL (it would be logged).
            request.add_header("X-Consul-Token", self.token)
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=self.context) as answer:
                entries = json.load(answer)
                new_index = int(answer.headers.get("X-Consul-Index") or 0)
        except urllib.error.HTTPError as e:
            body = e.read().decode("utf-8", "replace").strip()
            raise self._refusal(e.code, body) from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            raise DiscoveryError("cannot reach Consul at %s: %s" % (self.address, reason)) from None
        nodes = []
        for entry in entries:
            host = entry["Service"].get("Address") or entry["Node"].get("Address", "")
            port = entry["Service"]["Port"]
            nodes.append("[%s]:%d" % (host, port) if ":" in host else "%s:%d" % (host, port))
        return nodes, new_index

    def _refusal(self, status: int, body: str) -> DiscoveryError:
        if status == 400 and _PLAINTEXT_TO_HTTPS in body:
            return DiscoveryError(
                "Consul at %s serves HTTPS on this port: use an https:// address with a CA "
                "(CONSUL_CACERT)" % self.address)
        if status == 403:
            whose = ("the token given has no service:read on it" if self.token else
                     "no ACL token was sent: set CONSUL_HTTP_TOKEN or CONSUL_HTTP_TOKEN_FILE "
                     "(or ConsulDiscovery(token=...))")
            return DiscoveryError(
                "Consul refused to list service %s (HTTP 403 %s): %s"
                % (json.dumps(self.config.service), body, whose), code="PERMISSION_DENIED")
        return DiscoveryError("HTTP %d: %s" % (status, body))

    def check_fallback_names(self) -> None:
        """Refuses, at start-up, a fallback datacenter the agent does not
        know (/v1/catalog/datacenters, which needs no ACL), so a misspelt
        name fails here with the names there are instead of leaving the
        client without nodes when the local datacenter has none. An agent
        that does not answer the listing is no reason to refuse: the watch
        reads each fallback anyway. Raises ConfigError (the Rust crate's
        words, client/src/discovery.rs)."""
        request = urllib.request.Request(self.address + "/v1/catalog/datacenters")
        if self.token:
            request.add_header("X-Consul-Token", self.token)
        try:
            with urllib.request.urlopen(request, timeout=5, context=self.context) as answer:
                known = json.load(answer)
        except (urllib.error.URLError, OSError, ValueError):
            return
        if not isinstance(known, list) or not all(isinstance(k, str) for k in known):
            return
        refusal = unknown_fallbacks(self.config.fallback_datacenters, known)
        if refusal is not None:
            raise ConfigError(refusal)

    def local_name(self) -> str:
        """The name of the datacenter asked first: `datacenter`, else the
        agent's own (/v1/agent/self, which needs agent:read; without it,
        the words "the agent's own")."""
        if self.config.datacenter:
            return self.config.datacenter
        request = urllib.request.Request(self.address + "/v1/agent/self")
        if self.token:
            request.add_header("X-Consul-Token", self.token)
        try:
            with urllib.request.urlopen(request, timeout=5, context=self.context) as answer:
                name = json.load(answer).get("Config", {}).get("Datacenter")
        except (urllib.error.URLError, OSError, ValueError, AttributeError):
            name = None
        return name or "the agent's own"

    def fall_back(self, nodes: Any, replace: Callable[..., None]) -> bool:
        """While the local datacenter lists no passing node: puts the first
        fallback datacenter that lists one in use (a WARNING when that
        changes the datacenter in use). False when none lists a node."""
        for dc in self.config.fallback_datacenters:
            try:
                found, _ = self.query(0, dc=dc)
            except DiscoveryError as e:
                log.debug("fallback datacenter %s not readable: %s", dc, e)
                continue
            if not found:
                continue
            if nodes.fallback() != dc:
                log.warning("the local Consul datacenter %s lists no passing idgen node: using "
                            "fallback datacenter %s %s (snowflake and UUID calls only, unless "
                            "counters_may_cross_datacenters)", json.dumps(nodes.local_datacenter),
                            json.dumps(dc), found)
            replace(found, dc)
            return True
        return False

    def _take(self, found: List[str], nodes: Any, replace: Callable[..., None]) -> None:
        """The local datacenter's answer: its nodes when it lists any (back
        from a fallback datacenter, with a WARNING, if one was in use),
        else a fallback datacenter's, else the last known nodes."""
        if not found:
            if self.fall_back(nodes, replace):
                return
            if nodes.addrs():
                log.warning("Consul lists no passing idgen instance: keeping the last known nodes")
                return
        dc = nodes.fallback()
        if dc is not None:
            log.warning("the local Consul datacenter %s lists passing idgen nodes again: back "
                        "from fallback datacenter %s %s", json.dumps(nodes.local_datacenter),
                        json.dumps(dc), found)
        replace(found)

    def run(self, index: int, nodes: Any, replace: Callable[..., None],
            stopped: threading.Event) -> None:
        """The watch loop (a daemon thread); ends when `stopped` is set.
        While a fallback datacenter is in use, each blocking query on the
        local datacenter waits at most `fallback_recheck`, so the fallbacks
        are read again that often and the local one's return ends the
        query at once."""
        down = False
        wait = self.config.wait
        while not stopped.is_set():
            started = time.monotonic()
            try:
                found, new_index = self.query(index, wait=wait)
            except DiscoveryError as e:
                if stopped.is_set():
                    return
                if not down:
                    log.warning("Consul unreachable: keeping the last known idgen nodes (%s)", e)
                    down = True
                index = 0
                stopped.wait(1.0)
                continue
            if down:
                log.info("Consul reachable again: node list current")
                down = False
            index = 0 if new_index < index else new_index
            if stopped.is_set():
                return
            self._take(found, nodes, replace)
            wait = (min(self.config.wait, self.config.fallback_recheck)
                    if nodes.fallback() is not None else self.config.wait)
            stopped.wait(max(0.0, 0.1 - (time.monotonic() - started)))


def _debug_list(names: Sequence[str]) -> str:
    """A list of names as Rust's Debug prints a Vec<String>: ["a", "b"]."""
    return "[%s]" % ", ".join(json.dumps(n, ensure_ascii=False) for n in names)


def unknown_fallbacks(fallbacks: Sequence[str], known: Sequence[str]) -> Optional[str]:
    """The refusal for fallback datacenters not in `known` (the agent's
    /v1/catalog/datacenters), if any, in the Rust crate's words."""
    unknown = [f for f in fallbacks if f not in known]
    if not unknown:
        return None
    return ("fallback datacenter(s) %s unknown to the Consul agent, which knows %s: name Consul "
            "datacenters (case matters)" % (_debug_list(unknown), _debug_list(known)))
