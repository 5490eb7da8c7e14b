#!/usr/bin/env python3
"""The idgen conformance runner: holds every client (Rust, Python,
TypeScript) to the same scenarios (scenarios.json, data only).

For each scenario it starts a fresh fixture (the Consul emulator with ACLs,
three idgen nodes in Consul mode on 127.0.0.1, TLS certificates when the
scenario asks), starts each language's driver as a child process, sends it
the scenario's requests (JSON lines, docs/CONFORMANCE.md), checks every
answer, and prints a table scenario x language. Exits 1 on any failure.

    python3 clients/conformance/run.py --idgen PATH --consul-testserver PATH \\
        --driver rust=target/debug/examples/conformance [--scenario NAME...] [--json OUT]
    python3 clients/conformance/run.py --idgen PATH --consul-testserver PATH --registry

--registry builds and runs every driver drivers.json lists; one that cannot
be built or found fails the run (CI must not skip a language).

Python 3.9+ standard library only.
"""

import argparse
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# The longest the runner waits for one driver answer: a client that ignores
# its deadline fails the scenario instead of hanging the suite.
ANSWER_TIMEOUT_S = 30.0
# Slack over a deadline for process start-up, pipes and JSON.
DEADLINE_SLACK_MS = 1500
TWO_53 = 2**53
MASK64 = (1 << 64) - 1
UUID_V7 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


class Fail(Exception):
    """A scenario's check failed; the message says what was expected and seen."""


# ---------------------------------------------------------------- strict routing
# The reference of client/src/nodes.rs (key_hash, rendezvous): FNV-1a 64 of
# the key, then splitmix64's finaliser over the key hash and the rotated
# hash of each node address; the highest score serves the key.

def fnv1a64(text):
    h = 0xCBF29CE484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001B3) & MASK64
    return h


def rendezvous_score(key_hash, addr):
    a = fnv1a64(addr)
    z = key_hash ^ (((a << 29) | (a >> 35)) & MASK64)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def strict_node(key, addrs):
    k = fnv1a64(key)
    return max(addrs, key=lambda a: rendezvous_score(k, a))


def self_test():
    """The reference's vectors, the same as client/src/nodes.rs's tests."""
    assert fnv1a64("") == 0xCBF29CE484222325
    assert fnv1a64("a") == 0xAF63DC4C8601EC8C
    assert fnv1a64("foobar") == 0x85944171F73967E8
    nodes = ["10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051"]
    assert strict_node("orders/k7", nodes) == "10.0.0.2:50051"


# ---------------------------------------------------------------- the fixture

def http_get(url, token=None, timeout=2.0):
    req = urllib.request.Request(url)
    if token:
        req.add_header("X-Consul-Token", token)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read().decode())


class Process:
    """A child whose output lines are collected by a thread."""

    def __init__(self, argv, name, env=None, stream="stderr"):
        self.name = name
        self.lines = []
        self.ready = threading.Event()
        kw = {"stdin": subprocess.DEVNULL}
        if stream == "stderr":
            kw.update(stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        else:
            kw.update(stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.proc = subprocess.Popen(argv, env=env, text=True, **kw)
        pipe = self.proc.stderr if stream == "stderr" else self.proc.stdout
        threading.Thread(target=self._read, args=(pipe,), daemon=True).start()

    def _read(self, pipe):
        for line in pipe:
            self.lines.append(line.rstrip("\n"))
        self.ready.set()

    def wait_line(self, predicate, what, timeout=20.0):
        end = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < end:
            while seen < len(self.lines):
                line = self.lines[seen]
                seen += 1
                if predicate(line):
                    return line
            if self.proc.poll() is not None and seen >= len(self.lines):
                break
            time.sleep(0.02)
        tail = "\n".join(self.lines[-20:])
        raise Fail(f"{self.name} did not log {what} (exit {self.proc.poll()}):\n{tail}")

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGCONT)
                self.proc.send_signal(sig)
                self.proc.wait(timeout=10)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                self.proc.kill()
                self.proc.wait()


class Fixture:
    """Consul (ACLs on), three idgen nodes, certificates and a blackhole,
    as one scenario's `fixture` asks."""

    def __init__(self, args, spec, workdir):
        self.args = args
        self.spec = spec
        self.dir = workdir
        self.consul_token = "conf-" + secrets.token_hex(8)
        self.admin_token = "admin-" + secrets.token_hex(8)
        self.procs = []
        self.nodes = []  # (name, Process, grpc addr)
        self.vars = {"consul_token": self.consul_token, "admin_token": self.admin_token}
        self.blackhole = None

    # -- start-up

    def start(self):
        tls = self.spec.get("tls")
        if tls:
            self._certs()
        self._consul(tls)
        master_key = os.path.join(self.dir, "hide-master-key")
        with open(master_key, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        os.chmod(master_key, 0o600)
        for name in ("n0", "n1", "n2"):
            self._node(name, tls, master_key)
        for i, (_, _, addr) in enumerate(self.nodes):
            self.vars[f"node{i}"] = addr
        self.vars["nodes"] = [addr for _, _, addr in self.nodes]
        self._wait_passing(len(self.nodes))
        if self.spec.get("fallback_datacenter"):
            # One node of Consul datacenter dc2 (datacenter id 2; dc1's
            # nodes have 1): a client's fallback datacenter.
            self._node("d0", tls, master_key, dc="dc2")
            self.vars["dc2_nodes"] = [self.nodes[-1][2]]
            self._wait_passing(1, dc="dc2")
            # dc1's nodes again: a check that failed while d0 started (200 ms
            # check timeout on a loaded machine) would leave the scenario's
            # first discovery short of a node.
            self._wait_passing(len(self.nodes) - 1)
        self.blackhole = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.blackhole.bind(("127.0.0.1", 0))
        self.blackhole.listen(64)  # accepts (in the kernel), never answers
        self.vars["blackhole"] = "127.0.0.1:%d" % self.blackhole.getsockname()[1]
        token_file = os.path.join(self.dir, "consul.token")
        with open(token_file, "w") as f:
            f.write(self.consul_token + "\n")
        self.vars["consul_token_file"] = token_file

    def _certs(self):
        for sub in ("pki", "other-pki"):
            out = subprocess.run(
                [self.args.idgen, "tls", "dev-certs", os.path.join(self.dir, sub)],
                capture_output=True, text=True, timeout=30)
            if out.returncode != 0:
                raise Fail(f"idgen tls dev-certs failed: {out.stderr}")
        pki = os.path.join(self.dir, "pki")
        self.vars.update({
            "ca": os.path.join(pki, "ca.pem"),
            "client_cert": os.path.join(pki, "client.pem"),
            "client_key": os.path.join(pki, "client-key.pem"),
            "wrong_ca": os.path.join(self.dir, "other-pki", "ca.pem"),
        })

    def _consul(self, tls):
        argv = [self.args.consul_testserver, "--listen", "127.0.0.1:0",
                "--acl-token", self.consul_token,
                "--session-ttl-min", "1s", "--check-reap-interval", "1s"]
        if tls:
            argv += ["--check-ca", self.vars["ca"],
                     "--check-cert", self.vars["client_cert"],
                     "--check-key", self.vars["client_key"]]
        if self.spec.get("fallback_datacenter"):
            argv += ["--add-datacenter", "dc2=127.0.0.1:0"]
        p = Process(argv, "consul-testserver", stream="stdout")
        self.procs.append(p)
        line = p.wait_line(lambda l: l.startswith("listening on "), "listening on")
        self.consul_addr = line[len("listening on "):].strip()
        self.vars["consul_addr"] = self.consul_addr
        self.agents = {"dc1": self.consul_addr}
        if self.spec.get("fallback_datacenter"):
            line = p.wait_line(lambda l: l.startswith("datacenter dc2 listening on "),
                               "datacenter dc2 listening on")
            self.agents["dc2"] = line.split()[-1]

    def _node(self, name, tls, master_key, dc=None):
        q = json.dumps
        node = {"instance_id": q(name)}
        consul = {}
        if self.spec.get("fallback_datacenter"):
            node["datacenter_id"] = "2" if dc == "dc2" else "1"
            consul["primary_datacenter"] = q("dc1")
        sections = [
            ("node", node),
            ("server", {"grpc_listen": q("127.0.0.1:0"), "http_listen": q("127.0.0.1:0"),
                        "shutdown_grace": q("2s")}),
            ("store", {"backend": q("consul")}),
            ("consul", {
                **consul,
                "address": q("http://" + self.agents[dc or "dc1"]), "token": q(self.consul_token),
                "cluster": q("conformance"),
                "index_file": q(os.path.join(self.dir, name + ".index.json")),
                "session_ttl": q("2s"), "lock_delay": q("2s"), "lock_margin": q("800ms"),
                "timeout": q("500ms"), "retries": "1", "check_interval": q("200ms"),
                "check_timeout": q("200ms"), "deregister_critical_after": q("1s"),
                "reclaim_backoff_max": q("500ms")}),
            ("testing", {"consul_session_ttl_min": q("1s")}),
            ("segment", {"enabled": "true", "auto_create": "true", "default_step": "100"}),
            ("lease", {"enabled": "true", "block": "1000"}),
            ("strict", {"enabled": "true"}),
            ("admin", {"token": q(self.admin_token)}),
            ("hide", {"master_key_file": q(master_key)}),
            ("log", {"format": q("json"), "level": q("info")}),
        ]
        if tls:
            pki = os.path.join(self.dir, "pki")
            t = {"cert": q(os.path.join(pki, "node.pem")),
                 "key": q(os.path.join(pki, "node-key.pem"))}
            if tls == "mtls":
                t.update(client_ca=q(self.vars["ca"]), client_required="true")
            sections.append(("server.tls", t))
        text = ""
        for section, keys in sections:
            text += f"[{section}]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items())
        for fmt in self.spec.get("formats", []):
            text += "\n[[formats]]\n" + "".join(f"{k} = {q(v)}\n" for k, v in fmt.items())
        path = os.path.join(self.dir, name + ".toml")
        with open(path, "w") as f:
            f.write(text)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("IDGEN_", "CONSUL_", "RUST_LOG"))}
        p = Process([self.args.idgen, "serve", "--config", path], "idgen " + name, env=env)
        self.procs.append(p)
        line = p.wait_line(lambda l: '"ready"' in l, "ready")
        grpc = json.loads(line)["fields"]["grpc"]
        self.nodes.append((name, p, grpc))

    def _wait_passing(self, n, timeout=30.0, dc=None):
        url = f"http://{self.consul_addr}/v1/health/service/idgen?passing"
        if dc:
            url += "&dc=" + dc
        end = time.monotonic() + timeout
        listed = []
        while time.monotonic() < end:
            try:
                listed = http_get(url, self.consul_token)
            except (urllib.error.URLError, OSError, ValueError):
                listed = []
            if len(listed) == n:
                return
            time.sleep(0.1)
        raise Fail(f"Consul lists {len(listed)} passing idgen nodes, not {n}")

    # -- actions on the fixture

    def node_process(self, ref):
        addr = self.resolve(ref)
        for _, p, a in self.nodes:
            if a == addr:
                return p
        raise Fail(f"no node {ref}")

    def idgen_cli(self, argv, node):
        """`idgen <argv> --addr node` (admin commands get the admin token);
        returns (succeeded, stderr)."""
        cmd = [self.args.idgen] + [self.resolve(a) for a in argv]
        addr = node
        if self.spec.get("tls"):
            cmd += ["--ca", self.vars["ca"], "--cert", self.vars["client_cert"],
                    "--key", self.vars["client_key"]]
            addr = "https://" + node
        cmd += ["--addr", addr]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("IDGEN_", "CONSUL_"))}
        if argv[0] == "admin":
            env["IDGEN_ADMIN__TOKEN"] = self.admin_token
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, env=env)
        return out.returncode == 0, out.stderr.strip()

    def setup(self, action):
        """One `setup` entry: `admin` runs once on node0; `each_node_until_ok`
        runs on every node until it succeeds there (within 15 s), e.g. until
        each node has loaded a hide key made on another one."""
        if "admin" in action:
            ok, err = self.idgen_cli(["admin"] + action["admin"], self.vars["node0"])
            if not ok:
                raise Fail(f"idgen admin {' '.join(action['admin'])} failed: {err}")
            return
        argv = action["each_node_until_ok"]
        for _, _, node in self.nodes:
            end = time.monotonic() + 15
            while True:
                ok, err = self.idgen_cli(argv, node)
                if ok:
                    break
                if time.monotonic() > end:
                    raise Fail(f"idgen {' '.join(argv)} on {node} failed for 15 s: {err}")
                time.sleep(0.2)

    def resolve(self, value, extra=None):
        """`$name` placeholders (whole strings) replaced by fixture values."""
        env = dict(self.vars, **(extra or {}))
        if isinstance(value, str) and value.startswith("$"):
            if value[1:] not in env:
                raise Fail(f"scenario names unknown placeholder {value}")
            return env[value[1:]]
        if isinstance(value, list):
            return [self.resolve(v, extra) for v in value]
        if isinstance(value, dict):
            return {k: self.resolve(v, extra) for k, v in value.items()}
        return value

    def close(self):
        if self.blackhole:
            self.blackhole.close()
        for p in reversed(self.procs):
            p.stop()


# ---------------------------------------------------------------- the driver

class Driver:
    """One driver process: requests on stdin, answers on stdout."""

    def __init__(self, argv, env, lang):
        self.lang = lang
        self.next_id = 1
        self.proc = subprocess.Popen(argv, env=env, text=True, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     cwd=ROOT)
        self.answers = []
        self.cond = threading.Condition()
        self.stderr = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            with self.cond:
                self.answers.append(line)
                self.cond.notify_all()
        with self.cond:
            self.answers.append(None)
            self.cond.notify_all()

    def _read_err(self):
        for line in self.proc.stderr:
            self.stderr.append(line.rstrip("\n"))

    def call(self, request):
        rid = self.next_id
        self.next_id += 1
        msg = dict(request, id=rid)
        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise Fail(f"{self.lang} driver closed its stdin ({e}); stderr: {self.err_tail()}")
        end = time.monotonic() + ANSWER_TIMEOUT_S
        with self.cond:
            while not self.answers:
                left = end - time.monotonic()
                if left <= 0:
                    raise Fail(f"no answer to {request['op']} within {ANSWER_TIMEOUT_S:.0f} s")
                self.cond.wait(left)
            line = self.answers.pop(0)
        if line is None:
            raise Fail(f"{self.lang} driver exited ({self.proc.poll()}) during "
                       f"{request['op']}; stderr: {self.err_tail()}")
        try:
            answer = json.loads(line)
        except ValueError:
            raise Fail(f"driver answered a line that is not JSON: {line.strip()[:200]}")
        if answer.get("id") != rid:
            raise Fail(f"answer id {answer.get('id')!r}, not {rid}")
        if not isinstance(answer.get("ok"), bool):
            raise Fail(f"answer without a boolean ok: {line.strip()[:200]}")
        return answer

    def err_tail(self):
        return " | ".join(self.stderr[-5:])

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ---------------------------------------------------------------- checks

def as_ids(answer, key="ids"):
    """The answer's IDs as exact integers: each must be a decimal string."""
    ids = answer.get(key)
    if not isinstance(ids, list):
        raise Fail(f"{key} is not a list: {str(answer)[:200]}")
    out = []
    for v in ids:
        if not isinstance(v, str) or not v.isdigit() or (len(v) > 1 and v[0] == "0"):
            raise Fail(f"ID {v!r} is not a decimal string (IDs must be exact above 2^53)")
        out.append(int(v))
    return out


def snowflake_node(i):
    """(datacenter, worker) of an ID in the default layout (41 | 5 | 5 | 12)."""
    return (i >> 17) & 31, (i >> 12) & 31


def check(expect, answer, elapsed_ms, st):
    """Checks one answer against the step's `expect` (a small vocabulary of
    named checks, docs/CONFORMANCE.md), recording IDs in the scenario state."""
    ok = expect.get("ok", True)
    if expect.get("or_refused") and not answer["ok"]:
        # An admin-only answer may be refused outright instead of hiding fields.
        if answer.get("code") in ("PERMISSION_DENIED", "UNAUTHENTICATED"):
            return
        raise Fail(f"expected the public view or PERMISSION_DENIED/UNAUTHENTICATED, got "
                   f"{answer.get('code')}: {answer.get('message')}")
    if answer["ok"] != ok:
        what = (f"{answer.get('code')}: {answer.get('message')}" if not answer["ok"]
                else json.dumps(answer)[:300])
        raise Fail(f"expected ok={str(ok).lower()}, got {what}")
    if not answer["ok"]:
        if "code_in" in expect and answer.get("code") not in expect["code_in"]:
            raise Fail(f"code {answer.get('code')}, expected one of {expect['code_in']}: "
                       f"{answer.get('message')}")
        if "sent" in expect and answer.get("sent") is not expect["sent"]:
            raise Fail(f"sent={answer.get('sent')}, expected {expect['sent']} "
                       f"({answer.get('code')}: {answer.get('message')})")
        msg = str(answer.get("message", "")).lower()
        words = expect.get("message_has_any")
        if words and not any(w.lower() in msg for w in words):
            raise Fail(f"message does not name any of {words}: {answer.get('message')}")
    ids = None
    if "ids" in answer and "formatted_match" not in expect and (ok or "ids_count" in expect):
        ids = as_ids(answer)
        st["all_ids"].setdefault(expect.get("pool", "default"), []).extend(ids)
    if "ids_count" in expect and (ids is None or len(ids) != expect["ids_count"]):
        raise Fail(f"{0 if ids is None else len(ids)} IDs, expected {expect['ids_count']}")
    if expect.get("ids_above_2_53") and not all(i > TWO_53 for i in ids):
        raise Fail(f"an ID is not above 2^53: {ids[:5]}")
    if expect.get("consecutive"):
        for a, b in zip(ids, ids[1:]):
            if b != a + 1:
                raise Fail(f"IDs {a} then {b} are not consecutive (precision lost?)")
    if "min_run" in expect:
        check_runs(ids, expect["min_run"])
    if "save_ids" in expect:
        st["saved"][expect["save_ids"]] = [str(i) for i in ids]
        if ids:
            st["vars"][expect["save_ids"] + "_0"] = str(ids[0])
    if "nodes_equal" in expect:
        want = sorted(expect["nodes_equal"])
        if sorted(answer.get("nodes") or []) != want:
            raise Fail(f"nodes {answer.get('nodes')}, expected {want}")
    if "node_equal" in expect and answer.get("node") != expect["node_equal"]:
        raise Fail(f"node {answer.get('node')}, expected {expect['node_equal']}")
    if "elapsed_below_ms" in expect and elapsed_ms > expect["elapsed_below_ms"] + DEADLINE_SLACK_MS:
        raise Fail(f"took {elapsed_ms:.0f} ms, over the {expect['elapsed_below_ms']} ms deadline")
    check_fields(expect, answer, st)
    check_texts(expect, answer, st)


def check_runs(ids, min_run):
    """Snowflake IDs through a prefetch buffer come in runs, each from one
    node and increasing (a node's answer keeps its order), and a run never
    ends before `min_run` IDs (no answer is smaller than the refill
    threshold), except the last one, which the request's count may cut."""
    runs, start = [], 0
    for k in range(1, len(ids) + 1):
        if (k == len(ids) or snowflake_node(ids[k]) != snowflake_node(ids[k - 1])
                or ids[k] <= ids[k - 1]):
            runs.append((start, k))
            start = k
    for a, b in runs[:-1]:
        if b - a < min_run:
            raise Fail(f"IDs {a} to {b - 1} ({ids[a]}...) are a run of {b - a} from node "
                       f"{snowflake_node(ids[a])} before ID {ids[b]} from node "
                       f"{snowflake_node(ids[b])}: out of order (each answer keeps its order "
                       f"and holds at least {min_run} IDs)")


def check_fields(expect, answer, st):
    fields = answer.get("fields")
    for k, v in expect.get("fields_equal", {}).items():
        if not isinstance(fields, dict) or fields.get(k) != v:
            raise Fail(f"field {k} = {None if fields is None else fields.get(k)!r}, expected {v!r}")
    for k in expect.get("fields_absent", []):
        if isinstance(fields, dict) and k in fields:
            raise Fail(f"field {k} = {fields[k]!r} shown, expected it hidden")
    if expect.get("decodes_snowflake"):
        i = int(answer["fields"]["id"])
        dc, worker = snowflake_node(i)
        want = {"datacenter_id": str(dc), "worker_id": str(worker), "sequence": str(i & 4095)}
        for k, v in want.items():
            if fields.get(k) != v:
                raise Fail(f"decode {k} = {fields.get(k)!r}, the ID's bits say {v!r}")
        st["decoded_ms"] = int(fields["timestamp_ms"])
    if "internal_in" in expect:
        got = fields.get("internal_id") if isinstance(fields, dict) else None
        if got is None or not got.isdigit() or not (0 < int(got) <= expect["internal_in"]):
            raise Fail(f"internal_id {got!r}, expected the tag's counter (1 to {expect['internal_in']})")
        st["internal"].append(int(got))
    if "counter_last_at_least" in expect:
        c = answer.get("counter") or {}
        if not str(c.get("last", "")).isdigit() or int(c["last"]) < expect["counter_last_at_least"]:
            raise Fail(f"counter {c}, expected last >= {expect['counter_last_at_least']}")


def check_texts(expect, answer, st):
    if "formatted_match" in expect:
        texts = answer.get("ids") or []
        pattern = re.compile(expect["formatted_match"])
        for t in texts:
            if not isinstance(t, str) or not pattern.match(t):
                raise Fail(f"formatted ID {t!r} does not match {expect['formatted_match']}")
        st["texts"].extend(texts)
        if texts:
            st["vars"]["formatted_0"] = texts[0]
            st["vars"]["formatted_0_seq"] = str(int(texts[0].rsplit("-", 1)[1]))
    if expect.get("uuids_v7"):
        uuids = answer.get("uuids") or []
        if len(uuids) != expect.get("uuids_count", len(uuids)):
            raise Fail(f"{len(uuids)} UUIDs, expected {expect.get('uuids_count')}")
        for u in uuids:
            if not isinstance(u, str) or not UUID_V7.match(u):
                raise Fail(f"{u!r} is not a canonical UUIDv7")
        for a, b in zip(uuids, uuids[1:]):
            if b <= a:
                raise Fail(f"UUID {b} after {a}: not increasing within a call (one node)")
        st["texts"].extend(uuids)


def final_checks(final, st):
    for pool, ids in st["all_ids"].items():
        if final.get("all_ids_distinct") and len(set(ids)) != len(ids):
            seen, dup = set(), []
            for i in ids:
                if i in seen:
                    dup.append(i)
                seen.add(i)
            raise Fail(f"{len(dup)} duplicate {pool} IDs across the scenario, e.g. {dup[:3]}")
    total = sum(len(ids) for ids in st["all_ids"].values())
    if final.get("min_ids") and total < final["min_ids"]:
        raise Fail(f"only {total} IDs, expected at least {final['min_ids']}")
    if final.get("texts_distinct") and len(set(st["texts"])) != len(st["texts"]):
        raise Fail("a formatted ID or UUID came twice")
    if final.get("internal_distinct") and len(set(st["internal"])) != len(st["internal"]):
        raise Fail(f"revealed counters repeat: {st['internal']}")


# ---------------------------------------------------------------- scenarios

def driver_env(fixture, scenario_env, lang_env):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONSUL_")}
    env.update(lang_env)
    for k, v in (scenario_env or {}).items():
        env[k] = str(fixture.resolve(v))
    return env


def run_scenario(args, lang, argv, lang_env, sc):
    """Runs one scenario against one driver; returns (passed, why)."""
    workdir = tempfile.mkdtemp(prefix="idgen-conf-")
    fixture = Fixture(args, sc.get("fixture", {}), workdir)
    driver = None
    st = {"all_ids": {}, "texts": [], "internal": [], "saved": {}, "vars": {}}
    step_no = 0
    try:
        fixture.start()
        for action in sc.get("setup", []):
            fixture.setup(action)
        timer = None
        for step_no, step in enumerate(sc["steps"], 1):
            if "driver" in step:
                if driver:
                    driver.close()
                driver = Driver(argv, driver_env(fixture, step["driver"].get("env"), lang_env), lang)
                continue
            if "action" in step:
                timer = do_action(fixture, driver, step, st) or timer
                continue
            request = fixture.resolve(step["send"], st["vars"])
            started = time.monotonic()
            answer = driver.call(request)
            elapsed = (time.monotonic() - started) * 1000
            if timer:
                timer.join()
                timer = None
            check(fixture.resolve(step.get("expect", {}), st["vars"]), answer, elapsed, st)
        step_no = "final"
        final_checks(sc.get("final", {}), st)
        return True, ""
    except Fail as e:
        where = "fixture: " if not step_no else (
            "after the last step: " if step_no == "final" else f"step {step_no}: ")
        return False, where + str(e)
    finally:
        if driver:
            driver.close()
        fixture.close()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def wait_signalled(proc, name, stop, timeout=10.0):
    """Returns once the kernel reports `proc` stopped (`stop`) or dead.
    kill() returns before either: one thread of a multi-threaded node takes
    the signal and stops the others when it next runs, so on a loaded
    machine the node's other threads went on serving for milliseconds and
    answered the next request (strict_not_retried_after_sent got an ID from
    the node it had just stopped). WNOWAIT leaves the report, and Popen's
    exit status, untouched."""
    end = time.monotonic() + timeout
    while True:
        info = os.waitid(os.P_PID, proc.pid, os.WSTOPPED | os.WEXITED | os.WNOHANG | os.WNOWAIT)
        stopped = info is not None and info.si_code == os.CLD_STOPPED
        if info is not None and stopped == stop:
            return
        if info is not None and stop:
            raise Fail(f"node {name} exited instead of stopping (si_code {info.si_code})")
        if time.monotonic() > end:
            raise Fail(f"node {name} did not {'stop' if stop else 'die'} within {timeout:.0f} s "
                       "of the signal")
        time.sleep(0.002)


def do_action(fixture, driver, step, st):
    """Runs a fixture action; returns a timer thread for actions that fire
    during the next request."""
    action = step["action"]
    if action == "kill9_during":
        proc = fixture.node_process(step["node"]).proc
        delay = step.get("after_ms", 0) / 1000

        def fire():
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
        t = threading.Thread(target=fire)
        t.start()
        return t
    if action in ("kill9", "sigstop", "sigcont"):
        sig = {"kill9": signal.SIGKILL, "sigstop": signal.SIGSTOP, "sigcont": signal.SIGCONT}[action]
        proc = fixture.node_process(step["node"]).proc
        proc.send_signal(sig)
        if action != "sigcont":
            wait_signalled(proc, fixture.resolve(step["node"]), stop=action == "sigstop")
        return None
    if action == "key_on_node":
        # A key whose strict node (by the reference hash over `among`) is `node`.
        node = fixture.resolve(step["node"])
        among = fixture.resolve(step["among"])
        for i in range(10000):
            key = f"{step['prefix']}{i}"
            if strict_node(key, among) == node:
                st["vars"][step["as"]] = key
                return None
        raise Fail(f"no key routes to {node}")
    if action == "routes_match_reference":
        # The driver's strict node for `count` keys equals the reference's.
        among = fixture.resolve(step["among"])
        for i in range(step["count"]):
            key = f"{step['prefix']}{i}"
            answer = driver.call({"op": "strict_route", "key": key})
            want = strict_node(key, among)
            if not answer["ok"] or answer.get("node") != want:
                raise Fail(f"strict_route {key!r}: {answer.get('node') or answer.get('message')}, "
                           f"the rendezvous hash says {want}")
        return None
    raise Fail(f"unknown action {action}")


# ---------------------------------------------------------------- main

def load_registry(path):
    with open(path) as f:
        return json.load(f)


def build_drivers(registry):
    """Builds every registered driver; returns {lang: (argv, env)}; a driver
    that cannot be built or found is an error, never a skip."""
    drivers = {}
    for lang, spec in registry["drivers"].items():
        for build in spec.get("build", []):
            print(f"[{lang}] {' '.join(build)}", file=sys.stderr, flush=True)
            res = subprocess.run(build, cwd=ROOT)
            if res.returncode != 0:
                sys.exit(f"conformance: building the {lang} driver failed: {' '.join(build)}")
        # {target}: cargo's target directory (CARGO_TARGET_DIR, else target/).
        target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
        argv = shlex.split(spec["command"].replace("{target}", target))
        exe = argv[0] if os.path.isabs(argv[0]) else os.path.join(ROOT, argv[0])
        if not (shutil.which(argv[0]) or os.access(exe, os.X_OK)):
            sys.exit(f"conformance: the {lang} driver {argv[0]} is missing after its build")
        if not os.path.isabs(argv[0]) and os.path.exists(exe):
            argv[0] = exe
        drivers[lang] = (argv, spec.get("env", {}))
    return drivers


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--idgen", required=True, help="the idgen binary")
    ap.add_argument("--consul-testserver", required=True, help="the Consul emulator binary")
    ap.add_argument("--driver", action="append", default=[], metavar="LANG=CMD",
                    help="a driver: language and shell-split command (repeatable)")
    ap.add_argument("--registry", nargs="?", const=os.path.join(HERE, "drivers.json"),
                    help="build and run every driver the registry lists (default drivers.json)")
    ap.add_argument("--scenario", action="append", default=[], help="run only these (repeatable)")
    ap.add_argument("--scenarios", default=os.path.join(HERE, "scenarios.json"))
    ap.add_argument("--json", metavar="OUT", help="also write the results as JSON to OUT")
    ap.add_argument("--keep", action="store_true", help="keep each fixture's directory")
    args = ap.parse_args()
    self_test()
    for attr in ("idgen", "consul_testserver"):
        setattr(args, attr, os.path.abspath(getattr(args, attr)))
        if not os.access(getattr(args, attr), os.X_OK):
            sys.exit(f"conformance: {getattr(args, attr)} is not an executable")

    drivers = build_drivers(load_registry(args.registry)) if args.registry else {}
    for d in args.driver:
        lang, _, cmd = d.partition("=")
        if not cmd:
            sys.exit(f"conformance: --driver {d!r}: expected LANG=CMD")
        drivers[lang] = (shlex.split(cmd), {})
    if not drivers:
        sys.exit("conformance: no driver: give --driver LANG=CMD or --registry")

    with open(args.scenarios) as f:
        scenarios = json.load(f)["scenarios"]
    names = [s["name"] for s in scenarios]
    unknown = [n for n in args.scenario if n not in names]
    if unknown:
        sys.exit(f"conformance: unknown scenario(s) {unknown}; known: {names}")
    if args.scenario:
        scenarios = [s for s in scenarios if s["name"] in args.scenario]

    results = {}
    started = time.monotonic()
    for lang, (argv, env) in drivers.items():
        lang_started = time.monotonic()
        for sc in scenarios:
            t0 = time.monotonic()
            passed, why = run_scenario(args, lang, argv, env, sc)
            results.setdefault(sc["name"], {})[lang] = {
                "pass": passed, "why": why, "seconds": round(time.monotonic() - t0, 2)}
            mark = "PASS" if passed else "FAIL"
            print(f"[{lang}] {sc['name']}: {mark} {why}".rstrip(), file=sys.stderr, flush=True)
        print(f"[{lang}] {len(scenarios)} scenarios in {time.monotonic() - lang_started:.1f} s",
              file=sys.stderr, flush=True)
    print_table(scenarios, list(drivers), results)
    failed = sum(not r["pass"] for per in results.values() for r in per.values())
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"languages": list(drivers), "results": results, "failed": failed,
                       "seconds": round(time.monotonic() - started, 1)}, f, indent=2)
    sys.exit(1 if failed else 0)


def print_table(scenarios, langs, results):
    width = max(len(s["name"]) for s in scenarios)
    print(f"{'scenario':<{width}}  " + "  ".join(f"{l:<8}" for l in langs))
    whys = []
    for s in scenarios:
        cells = []
        for l in langs:
            r = results[s["name"]][l]
            cells.append(f"{'pass' if r['pass'] else 'FAIL':<8}")
            if not r["pass"]:
                whys.append(f"  {s['name']} [{l}]: {r['why']}")
        print(f"{s['name']:<{width}}  " + "  ".join(cells))
    if whys:
        print("\nwhy:\n" + "\n".join(whys))


if __name__ == "__main__":
    main()
