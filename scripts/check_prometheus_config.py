"""Checks consul/prometheus.yml: promtool accepts it, and its relabelling
turns a Consul registration of idgen into a scrape of the node's metrics
port.

Usage: python scripts/check_prometheus_config.py consul/prometheus.yml

Debian's promtool is built without consul_sd_configs and rejects the
field; then the file is checked with its consul_sd_configs replaced by
static_configs (everything else, relabel regexes included, is checked by
promtool as written). The relabel rules are then applied, with
Prometheus' semantics (anchored regexes, `;` separator), to the labels
consul_sd_configs gives an idgen registration (gRPC port in the service
port, HTTP port in Meta.metrics_port, as src/server/registration.rs
registers it), and the resulting target must be <address>:<metrics_port>.
"""

import copy
import os
import re
import subprocess
import sys
import tempfile

import yaml


def promtool_check(path):
    out = subprocess.run(["promtool", "check", "config", path], capture_output=True, text=True)
    return out.returncode == 0, out.stdout + out.stderr


def relabel(labels, rules):
    """Prometheus relabelling for the actions the config uses. Returns None
    when the target is dropped."""
    labels = dict(labels)
    for r in rules:
        action = r.get("action", "replace")
        sep = r.get("separator", ";")
        value = sep.join(labels.get(l, "") for l in r.get("source_labels", []))
        regex = re.compile("^(?:%s)$" % r.get("regex", "(.*)"))
        m = regex.match(value)
        if action == "keep":
            if not m:
                return None
        elif action == "drop":
            if m:
                return None
        elif action == "replace":
            if m:
                repl = r.get("replacement", "$1")
                result = re.sub(r"\$\{(\w+)\}|\$(\w+)",
                                lambda g: m.group(int(g.group(1) or g.group(2))) or "", repl)
                labels[r["target_label"]] = result
        else:
            raise SystemExit("check_prometheus_config: action %r not modelled" % action)
    return labels


def main(path):
    with open(path) as f:
        config = yaml.safe_load(f)
    ok, out = promtool_check(path)
    if not ok:
        if "consul_sd_configs" not in out:
            sys.exit("promtool check config failed:\n" + out)
        # Debian's build: check the rest of the file with static targets.
        variant = copy.deepcopy(config)
        for job in variant["scrape_configs"]:
            if job.pop("consul_sd_configs", None) is not None:
                job["static_configs"] = [{"targets": ["127.0.0.1:9090"]}]
        with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as tmp:
            yaml.safe_dump(variant, tmp)
        try:
            ok, out2 = promtool_check(tmp.name)
        finally:
            os.unlink(tmp.name)
        if not ok:
            sys.exit("promtool check config failed:\n" + out2)
        print("prometheus config: promtool has no consul_sd_configs (Debian build); the rest passes promtool")
    else:
        print("prometheus config: promtool check config passes")

    job = next(j for j in config["scrape_configs"] if j["job_name"] == "idgen")
    assert job["consul_sd_configs"][0]["services"] == ["idgen"], "scrapes service idgen"
    registered = {
        "__address__": "10.0.0.7:50051",
        "__meta_consul_address": "10.0.0.7",
        "__meta_consul_service_address": "10.0.0.7",
        "__meta_consul_service_port": "50051",
        "__meta_consul_service_metadata_metrics_port": "9464",
        "__meta_consul_service_metadata_instance": "node-a",
        "__meta_consul_service_metadata_datacenter": "0",
        "__meta_consul_service_metadata_worker": "3",
        "__meta_consul_dc": "dc1",
    }
    got = relabel(registered, job["relabel_configs"])
    assert got is not None, "an idgen registration with a metrics port is kept"
    assert got["__address__"] == "10.0.0.7:9464", got["__address__"]
    assert got["instance"] == "node-a" and got["idgen_worker"] == "3", got
    without = {k: v for k, v in registered.items() if "metrics_port" not in k}
    assert relabel(without, job["relabel_configs"]) is None, "no metrics port: not scraped"
    print("prometheus config: a registration is scraped at <address>:<Meta.metrics_port>")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "consul/prometheus.yml")
