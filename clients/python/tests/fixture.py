"""A throwaway cluster for the tests and the benchmark: the Consul
emulator (consul-testserver) and idgen nodes on 127.0.0.1 with ports
from :0, started from the binaries named by IDGEN_BIN and
TEST_CONSUL_TESTSERVER_BIN (default: on PATH). Standard library only."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from typing import Dict, List, Optional, Sequence


def binary(var: str, name: str) -> str:
    path = os.environ.get(var) or shutil.which(name)
    if not path:
        raise RuntimeError("set %s to the %s binary (or put it on PATH)" % (var, name))
    return os.path.abspath(path)


def _no_inherited_descriptors() -> None:
    """Descriptors above 2 that this process itself inherited (a test
    runner's pipes) are made close-on-exec, so the children spawn() starts
    without close_fds get only their standard streams."""
    if not os.path.isdir("/proc/self/fd"):
        return
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:
                os.set_inheritable(fd, False)
            except OSError:
                pass  # the listing's own descriptor, closed by now


_no_inherited_descriptors()


def spawn(argv: Sequence[str], **kw) -> "subprocess.Popen[str]":
    """subprocess.Popen(argv, text=True, **kw) through posix_spawn, never
    fork: grpcio 1.80 to 1.83 runs a fork handler in the child of a process
    with live channels that aborts 1 child in 25 before exec (grpc/grpc#43055;
    docs/CLIENT-PYTHON.md), and these tests start nodes beside live clients.
    CPython takes posix_spawn when close_fds is off and the program is given
    by path; Python and grpcio open descriptors non-inheritable, and the
    ones this process inherited are made so at import."""
    return subprocess.Popen(list(argv), close_fds=False, text=True, **kw)


def node_env(extra: Optional[Dict[str, str]]) -> Dict[str, str]:
    """The environment of a node: this process's without its IDGEN_*
    variables (a node reads every IDGEN_* as a setting and refuses one that
    names no key, e.g. the test runner's IDGEN_CLIENT_PYTHON), plus the
    settings the test gives."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("IDGEN_")}
    return dict(inherited, **(extra or {}))


class Node:
    """One `idgen serve` process; `grpc` is its host:port once ready."""

    def __init__(self, config: str, env: Optional[Dict[str, str]] = None) -> None:
        self.proc = spawn(
            [binary("TEST_IDGEN_BIN", "idgen"), "serve", "--config", config],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env=node_env(env))
        self.log: List[str] = []
        ready = threading.Event()
        self.grpc = ""

        def read() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.log.append(line.rstrip())
                if '"ready"' in line and not self.grpc:
                    self.grpc = json.loads(line)["fields"]["grpc"]
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(30) or not self.grpc:
            self.kill()
            raise RuntimeError("idgen did not become ready:\n" + "\n".join(self.log[-30:]))

    def kill(self) -> None:
        """kill -9."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()


class Cluster:
    """consul-testserver (ACLs on with master token `master` when `acl`)
    and `count` nodes of one cluster; `formats` is TOML appended to each
    node's config; `tls` writes development certificates (idgen tls
    dev-certs) and serves TLS (mTLS when `mtls`)."""

    def __init__(self, count: int = 3, acl: bool = False, formats: str = "",
                 tls: bool = False, mtls: bool = False, admin_token: str = "",
                 datacenters: Sequence[str] = ()) -> None:
        self.dir = tempfile.mkdtemp(prefix="idgen-py-test-")
        self.token = "master" if acl else ""
        self.certs = os.path.join(self.dir, "certs")
        args = [binary("TEST_CONSUL_TESTSERVER_BIN", "consul-testserver"), "--listen",
                "127.0.0.1:0", "--session-ttl-min", "1s", "--check-reap-interval", "1s"]
        if acl:
            args += ["--acl-token", "master"]
        for dc in datacenters:
            # Another Consul datacenter linked with dc1 (the primary).
            args += ["--add-datacenter", "%s=127.0.0.1:0" % dc]
        if tls or mtls:
            certs = spawn([binary("TEST_IDGEN_BIN", "idgen"), "tls", "dev-certs", self.certs],
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
            if certs.wait() != 0:
                raise RuntimeError("idgen tls dev-certs exited with %d" % certs.returncode)
            # The emulator's gRPC health checks of TLS nodes.
            args += ["--check-ca", self.cert("ca.pem"), "--check-cert", self.cert("client.pem"),
                     "--check-key", self.cert("client-key.pem")]
        self.consul = spawn(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL)
        assert self.consul.stdout is not None
        line = self.consul.stdout.readline()
        if not line.startswith("listening on "):
            raise RuntimeError("consul-testserver said %r" % line)
        self.consul_addr = line.split()[-1]
        # Each datacenter's agent: "datacenter NAME listening on ADDR".
        self.agents: Dict[str, str] = {"dc1": self.consul_addr}
        for _ in datacenters:
            words = self.consul.stdout.readline().split()
            self.agents[words[1]] = words[-1]
        self.federated = bool(datacenters)
        self.nodes: List[Node] = []
        try:
            for i in range(count):
                self.nodes.append(Node(self._config("n%d" % i, formats, tls or mtls, mtls,
                                                    admin_token)))
            self.wait_passing(count)
        except BaseException:
            self.close()
            raise

    def cert(self, name: str) -> str:
        return os.path.join(self.certs, name)

    def start_node(self, name: str, dc: str, datacenter_id: int) -> Node:
        """Another node, in Consul datacenter `dc` with `datacenter_id`."""
        node = Node(self._config(name, "", False, False, "", dc, datacenter_id))
        self.nodes.append(node)
        return node

    def _config(self, name: str, formats: str, tls: bool, mtls: bool, admin: str,
                dc: str = "dc1", datacenter_id: int = 0) -> str:
        d = self.dir
        text = """[node]
instance_id = "%(name)s"
datacenter_id = %(dcid)d
[server]
grpc_listen = "127.0.0.1:0"
http_listen = "127.0.0.1:0"
shutdown_grace = "1s"
[store]
backend = "consul"
[consul]
address = "http://%(consul)s"
cluster = "test"
index_file = "%(dir)s/%(name)s.index.json"
session_ttl = "6s"
lock_delay = "2s"
lock_margin = "800ms"
timeout = "2s"
retries = 1
check_interval = "200ms"
check_timeout = "200ms"
deregister_critical_after = "1s"
reclaim_backoff_max = "500ms"
token = "%(token)s"
%(primary)s
[testing]
consul_session_ttl_min = "1s"
[segment]
enabled = true
auto_create = true
[lease]
enabled = true
[strict]
enabled = true
[log]
format = "json"
level = "info"
""" % {"name": name, "consul": self.agents[dc], "dir": d, "token": self.token,
       "dcid": datacenter_id,
       "primary": 'primary_datacenter = "dc1"' if self.federated else ""}
        if admin:
            text += '[admin]\ntoken = "%s"\n' % admin
        if tls:
            text += '[server.tls]\ncert = "%s"\nkey = "%s"\n' % (self.cert("node.pem"),
                                                               self.cert("node-key.pem"))
            if mtls:
                text += 'client_ca = "%s"\nclient_required = true\n' % self.cert("ca.pem")
        text += formats
        path = os.path.join(d, name + ".toml")
        with open(path, "w") as f:
            f.write(text)
        return path

    def env(self) -> Dict[str, str]:
        """Consul's variables for a client of this cluster."""
        env = {"CONSUL_HTTP_ADDR": self.consul_addr}
        if self.token:
            env["CONSUL_HTTP_TOKEN"] = self.token
        return env

    def wait_passing(self, count: int, dc: str = "dc1") -> None:
        url = "http://%s/v1/health/service/idgen?passing" % self.agents[dc]
        listed = -1
        for _ in range(300):
            req = urllib.request.Request(url)
            if self.token:
                req.add_header("X-Consul-Token", self.token)
            with urllib.request.urlopen(req, timeout=5) as r:
                listed = len(json.load(r))
            if listed == count:
                return
            time.sleep(0.05)
        raise RuntimeError("%d of %d nodes passing in Consul" % (listed, count))

    def addrs(self) -> List[str]:
        return [n.grpc for n in self.nodes]

    def close(self) -> None:
        for n in self.nodes:
            n.kill()
        self.consul.kill()
        self.consul.wait()
        if self.consul.stdout is not None:
            self.consul.stdout.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Blackhole:
    """A TCP listener that accepts connections and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.addr = "127.0.0.1:%d" % self.sock.getsockname()[1]
        self.conns: List[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self) -> None:
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        for c in self.conns:
            c.close()


def refusing_addr() -> str:
    """An address where nothing listens (connections are refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    addr = "127.0.0.1:%d" % s.getsockname()[1]
    s.close()
    return addr
