#!/usr/bin/env python3
"""Offline validation of idgen's Kubernetes manifests (deploy/kubernetes).

Every object is checked against the Kubernetes API types as the PyPI
`kubernetes` client generates them from the API's OpenAPI spec: unknown
fields (a typo such as `readinesProbe` that the API server would drop or
reject), wrong value types, and missing required fields. Then idgen's own
rules: each container probes /healthz (liveness) and /readyz (readiness)
on a declared port, has a preStop hook, the grace period covers the
preStop pause plus the drain, and every ConfigMap's `idgen.toml` passes
`idgen check-config`. And what makes a deployment safe: the config
never sets `server.insecure = true`, serves [server.tls] from files of a
Secret volume mounted where the config looks for them, probes over
HTTPS, sets `admin.allow`; and every workload is a StatefulSet (stable
pod names are stable holder identities in Consul) whose `serviceName`
is a headless Service of the same directory.

Usage: validate_k8s.py IDGEN_BINARY MANIFEST_DIR...
       validate_k8s.py --self-test IDGEN_BINARY  (proves the checks bite)
Prints one line per object and exits non-zero on any problem.
"""

import copy
import os
import re
import subprocess
import sys
import tempfile
import tomllib

import yaml
from kubernetes import client

MODELS = client.models


def model_class(api_version, kind):
    version = api_version.split("/")[-1]
    name = version[0].upper() + version[1:] + kind
    cls = getattr(MODELS, name, None)
    if cls is None:
        raise KeyError(f"no Kubernetes type {name} for apiVersion {api_version}, kind {kind}")
    return cls


def check_type(value, type_name, path, errors):
    """Checks `value` against an OpenAPI type name of the client models."""
    if value is None:
        return
    m = re.fullmatch(r"[lL]ist\[(.+)\]", type_name)
    if m:
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list, got {type(value).__name__}")
            return
        for i, item in enumerate(value):
            check_type(item, m.group(1), f"{path}[{i}]", errors)
        return
    m = re.fullmatch(r"dict\((\w+), (.+)\)", type_name) or re.fullmatch(
        r"Dict\[(\w+), (.+)\]", type_name
    )
    if m:
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a map, got {type(value).__name__}")
            return
        for k, v in value.items():
            if not isinstance(k, str):
                errors.append(f"{path}: key {k!r} is not a string")
            check_type(v, m.group(2), f"{path}.{k}", errors)
        return
    scalar = {
        "str": (str,),
        "int": (int,),
        "float": (int, float),
        "bool": (bool,),
        "datetime": (str,),
        "date": (str,),
        "bytes": (str,),
    }
    if type_name in scalar:
        ok = isinstance(value, scalar[type_name])
        if type_name in ("int", "float") and isinstance(value, bool):
            ok = False
        if not ok:
            errors.append(f"{path}: expected {type_name}, got {type(value).__name__} {value!r}")
        return
    if type_name == "object":  # IntOrString, Quantity and free-form fields
        return
    cls = getattr(MODELS, type_name)
    if not isinstance(value, dict):
        errors.append(f"{path}: expected a {type_name} object, got {type(value).__name__}")
        return
    by_json = {json_name: py for py, json_name in cls.attribute_map.items()}
    for key, v in value.items():
        if key not in by_json:
            errors.append(f"{path}.{key}: unknown field of {type_name}")
            continue
        check_type(v, cls.openapi_types[by_json[key]], f"{path}.{key}", errors)
    # Required fields, as the API's OpenAPI spec marks them.
    present = {by_json[k] for k in value if k in by_json}
    for py, field in getattr(cls, "model_fields", {}).items():
        if field.is_required() and py not in present:
            errors.append(f"{path}.{cls.attribute_map[py]}: required by {type_name}")


def check_schema(doc, where, errors):
    for field in ("apiVersion", "kind", "metadata"):
        if field not in doc:
            errors.append(f"{where}: missing {field}")
            return
    try:
        cls = model_class(doc["apiVersion"], doc["kind"])
    except KeyError as e:
        errors.append(f"{where}: {e}")
        return
    check_type(doc, cls.__name__, where, errors)


def pod_template(doc):
    if doc.get("kind") in ("Deployment", "StatefulSet", "DaemonSet"):
        return doc["spec"]["template"]["spec"]
    return None


def check_idgen_rules(doc, where, errors):
    pod = pod_template(doc)
    if pod is None:
        return
    grace = pod.get("terminationGracePeriodSeconds", 30)
    for c in pod.get("containers", []):
        cw = f"{where}.containers[{c.get('name')}]"
        ports = {p.get("name") for p in c.get("ports", [])} | {
            p.get("containerPort") for p in c.get("ports", [])
        }
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            get = (c.get(probe) or {}).get("httpGet") or {}
            if get.get("path") != path:
                errors.append(f"{cw}.{probe}: must be an httpGet of {path}, got {get.get('path')!r}")
            if get.get("port") not in ports:
                errors.append(f"{cw}.{probe}: port {get.get('port')!r} is not a declared container port")
        pre = ((c.get("lifecycle") or {}).get("preStop")) or {}
        pause = (pre.get("sleep") or {}).get("seconds")
        if not pre:
            errors.append(f"{cw}: no preStop hook (the Service must drop the pod before SIGTERM)")
        elif pause is not None and grace < pause + 15:
            errors.append(
                f"{cw}: terminationGracePeriodSeconds {grace} does not cover the preStop pause {pause}s plus the drain"
            )
        env = {e.get("name") for e in c.get("env", [])}
        if "IDGEN_CONFIG" not in env:
            errors.append(f"{cw}: IDGEN_CONFIG is not set")


def check_configmap(doc, where, idgen, errors):
    if doc.get("kind") != "ConfigMap" or "idgen.toml" not in doc.get("data", {}):
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "idgen.toml")
        with open(path, "w") as f:
            f.write(doc["data"]["idgen.toml"])
        env = {k: v for k, v in os.environ.items() if not k.startswith("IDGEN_")}
        env.pop("STATE_DIRECTORY", None)
        r = subprocess.run(
            [idgen, "check-config", "--config", path],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        if r.returncode != 0:
            errors.append(f"{where}: idgen.toml fails idgen check-config: {r.stderr.strip()}")


def idgen_toml(docs):
    """The parsed idgen.toml of the ConfigMap among `docs`, or None."""
    for _, doc in docs:
        if doc.get("kind") == "ConfigMap" and "idgen.toml" in doc.get("data", {}):
            return tomllib.loads(doc["data"]["idgen.toml"])
    return None


def check_safety(docs, errors):
    """Cross-object rules of one manifest directory (see the module doc)."""
    config = idgen_toml(docs)
    services = {d.get("metadata", {}).get("name"): d for _, d in docs if d.get("kind") == "Service"}
    for where, doc in docs:
        if doc.get("kind") == "Deployment":
            errors.append(f"{where}: a Deployment: use a StatefulSet (random pod names leave a new holder record in Consul on every rollout)")
        if doc.get("kind") != "StatefulSet":
            continue
        svc = services.get(doc["spec"].get("serviceName"))
        if svc is None or svc["spec"].get("clusterIP") != "None":
            errors.append(f"{where}: serviceName {doc['spec'].get('serviceName')!r} is not a headless Service (clusterIP: None) of this directory")
        if config is None:
            errors.append(f"{where}: no ConfigMap with idgen.toml beside it")
            continue
        check_tls_mounted(doc, where, config, errors)
    if config is None:
        return
    server = config.get("server", {})
    if server.get("insecure") is True:
        errors.append("idgen.toml: server.insecure = true (admin token and IDs in clear text): serve [server.tls] from a Secret")
    if not config.get("admin", {}).get("allow"):
        errors.append("idgen.toml: admin.allow is empty: allow admin calls from the cluster network only")


def check_tls_mounted(doc, where, config, errors):
    """[server.tls] files come from a mounted Secret; probes use HTTPS."""
    tls = config.get("server", {}).get("tls", {})
    files = [tls.get(k) for k in ("cert", "key", "client_ca") if tls.get(k)]
    if not tls.get("cert") or not tls.get("key"):
        errors.append(f"{where}: idgen.toml has no [server.tls] cert and key")
    pod = pod_template(doc)
    secrets = {v["name"] for v in pod.get("volumes", []) if v.get("secret")}
    for c in pod.get("containers", []):
        cw = f"{where}.containers[{c.get('name')}]"
        mounts = [m["mountPath"].rstrip("/") for m in c.get("volumeMounts", []) if m.get("name") in secrets]
        for f in files:
            if os.path.dirname(f) not in mounts:
                errors.append(f"{cw}: {f} (server.tls) is not in a mounted Secret volume {mounts}")
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            get = (c.get(probe) or {}).get("httpGet")
            if get is not None and files and get.get("scheme") != "HTTPS":
                errors.append(f"{cw}.{probe}: the node serves TLS: set scheme: HTTPS")


def validate_docs(docs, idgen):
    """[(where, doc)] -> list of problems."""
    errors = []
    for where, doc in docs:
        check_schema(doc, where, errors)
        check_idgen_rules(doc, where, errors)
        check_configmap(doc, where, idgen, errors)
    by_dir = {}
    # Objects read from files (`path#index ...`), grouped by directory.
    for where, doc in (x for x in docs if "#" in x[0]):
        by_dir.setdefault(os.path.dirname(where.split("#")[0]), []).append((where, doc))
    for group in by_dir.values():
        check_safety(group, errors)
    return errors


def load(dirs):
    docs = []
    for d in dirs:
        for name in sorted(os.listdir(d)):
            if not name.endswith((".yaml", ".yml")):
                continue
            path = os.path.join(d, name)
            with open(path) as f:
                for i, doc in enumerate(yaml.safe_load_all(f)):
                    if doc is not None:
                        docs.append((f"{path}#{i} {doc.get('kind')}/{doc.get('metadata', {}).get('name')}", doc))
    return docs


def self_test(idgen, dirs):
    """Each deliberate break must be caught."""
    docs = load(dirs)
    sts = next(d for w, d in docs if d.get("kind") == "StatefulSet")
    cm = next(d for w, d in docs if d.get("kind") == "ConfigMap")

    def container(d):
        return d["spec"]["template"]["spec"]["containers"][0]

    breaks = {
        "unknown field": lambda d: container(d).__setitem__("readinesProbe", {}),
        "wrong type": lambda d: d["spec"].__setitem__("replicas", "one"),
        "missing required field": lambda d: container(d).pop("name"),
        "liveness on the wrong path": lambda d: container(d)["livenessProbe"]["httpGet"].__setitem__("path", "/readyz"),
        "probe on an undeclared port": lambda d: container(d)["readinessProbe"]["httpGet"].__setitem__("port", "metrics"),
        "no preStop": lambda d: container(d).pop("lifecycle"),
        "unknown kind": lambda d: d.__setitem__("kind", "StatefulSett"),
    }
    failed = 0
    for what, brk in breaks.items():
        d = copy.deepcopy(sts)
        brk(d)
        errs = validate_docs([("self-test", d)], idgen)
        print(f"self-test {what}: {'caught: ' + errs[0] if errs else 'NOT CAUGHT'}")
        failed += not errs
    d = copy.deepcopy(cm)
    d["data"]["idgen.toml"] += "\n[node]\nworker_idd = 3\n"
    errs = validate_docs([("self-test", d)], idgen)
    print(f"self-test bad idgen.toml: {'caught' if errs else 'NOT CAUGHT'}")
    failed += not errs
    clean = validate_docs([("self-test", copy.deepcopy(sts))], idgen)
    if clean:
        print(f"self-test: the unbroken StatefulSet fails: {clean}")
        failed += 1
    failed += self_test_safety(idgen, docs)
    return failed


def self_test_safety(idgen, docs):
    """Each deliberate break of the directory's safety rules is caught."""

    def first(ds, kind):
        return next(d for _, d in ds if d.get("kind") == kind)

    def pod(ds):
        return first(ds, "StatefulSet")["spec"]["template"]["spec"]

    def edit_toml(ds, old, new):
        cm = first(ds, "ConfigMap")
        assert old in cm["data"]["idgen.toml"], old
        cm["data"]["idgen.toml"] = cm["data"]["idgen.toml"].replace(old, new)

    def as_deployment(ds):
        first(ds, "StatefulSet")["kind"] = "Deployment"

    # Each break, and words the error it causes must contain (so that it
    # is this rule, not another, that catches it).
    breaks = {
        "server.insecure = true": (lambda ds: edit_toml(ds, "[server.tls]", "insecure = true\n[server.tls]"), "server.insecure"),
        "no [server.tls] files": (lambda ds: edit_toml(ds, 'cert = "/etc/idgen-tls/tls.crt"', ""), "no [server.tls] cert and key"),
        "empty admin.allow": (lambda ds: edit_toml(ds, 'allow = ["10.0.0.0/8"]', "allow = []"), "admin.allow is empty"),
        "TLS Secret not mounted": (
            lambda ds: pod(ds).__setitem__("volumes", [v for v in pod(ds)["volumes"] if not v.get("secret")]),
            "is not in a mounted Secret volume",
        ),
        "probe over plaintext": (lambda ds: pod(ds)["containers"][0]["readinessProbe"]["httpGet"].pop("scheme"), "scheme: HTTPS"),
        "a Deployment": (as_deployment, "use a StatefulSet"),
        "serviceName not headless": (lambda ds: first(ds, "StatefulSet")["spec"].__setitem__("serviceName", "idgen"), "not a headless Service"),
    }
    failed = 0
    for what, (brk, words) in breaks.items():
        ds = copy.deepcopy(docs)
        brk(ds)
        errs = [e for e in validate_docs(ds, idgen) if words in e]
        print(f"self-test {what}: {'caught: ' + errs[0] if errs else 'NOT CAUGHT'}")
        failed += not errs
    return failed


def main(argv):
    if len(argv) >= 2 and argv[1] == "--self-test":
        idgen, dirs = argv[2], argv[3:]
        failed = self_test(idgen, dirs)
        print(f"self-test: {failed} break(s) not caught")
        return 1 if failed else 0
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    idgen, dirs = argv[1], argv[2:]
    docs = load(dirs)
    if not docs:
        print("no manifests found", file=sys.stderr)
        return 1
    errors = validate_docs(docs, idgen)
    for where, _ in docs:
        bad = [e for e in errors if e.startswith(where)]
        print(f"{'FAIL' if bad else 'ok  '} {where}")
    for e in errors:
        print(f"  {e}")
    print(f"{len(docs)} objects, {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
