"""Replacement for the root conftest.py of PyPI's py-consul sdist.

Upstream's conftest starts `hashicorp/consul` containers with Docker; this
one starts the in-repo consul-testserver instead (the binary named by
$CONSUL_TESTSERVER_BIN), one fresh server per test as upstream does, and
provides the same fixtures (`consul_instance`, `acl_consul_instance`,
`consul_port`) with the same shapes, so the upstream test modules run
unchanged. Used by scripts/py-consul-upstream.sh; nothing else of the sdist
is modified.
"""

from __future__ import annotations

import collections
import os
import subprocess
import time
import uuid

import pytest
import requests

ConsulInstance = collections.namedtuple("ConsulInstance", ["container", "port", "version"])


@pytest.fixture(scope="session", autouse=True)
def _unset_consul_token():
    if "CONSUL_HTTP_TOKEN" in os.environ:
        del os.environ["CONSUL_HTTP_TOKEN"]


def start_testserver(acl_master_token: str | None = None):
    """Starts consul-testserver on 127.0.0.1:<free port>; returns (process, port)."""
    args = [os.environ["CONSUL_TESTSERVER_BIN"], "--listen", "127.0.0.1:0"]
    if acl_master_token:
        args += ["--acl-token", acl_master_token]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("listening on "):
        proc.kill()
        _, err = proc.communicate(timeout=10)
        raise RuntimeError(f"consul-testserver did not start: {line!r} {err}")
    port = int(line.rsplit(":", 1)[1])
    # Same readiness check as upstream: a leader is known.
    deadline = time.time() + 10
    while True:
        try:
            response = requests.get(f"http://127.0.0.1:{port}/v1/status/leader", timeout=2)
            if response.status_code == 200 and response.json():
                return proc, port
        except requests.RequestException:
            pass
        if time.time() > deadline:
            proc.kill()
            raise TimeoutError("consul-testserver never reported a leader")
        time.sleep(0.05)


def get_consul_version(port: int) -> str:
    response = requests.get(f"http://127.0.0.1:{port}/v1/agent/self", timeout=10)
    return response.json()["Config"]["Version"].strip()


def setup_and_teardown(acl_master_token: str | None = None):
    proc, port = start_testserver(acl_master_token)
    try:
        instance = ConsulInstance(None, port, get_consul_version(port))
        yield instance if acl_master_token is None else (instance, acl_master_token)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def consul_instance():
    yield from setup_and_teardown()


@pytest.fixture
def acl_consul_instance():
    yield from setup_and_teardown(acl_master_token=uuid.uuid4().hex)


@pytest.fixture
def consul_port(consul_instance):
    return consul_instance.port, consul_instance.version
