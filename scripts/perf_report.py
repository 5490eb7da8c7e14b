#!/usr/bin/env python3
"""Turns scripts/perf-report.sh's measurements into report.md and
report.json, checks a report is well formed, and rewrites docs/PERFORMANCE.md's
Performance table from a report.

  perf_report.py RESULTS OUTDIR --secs S --rounds R --profile P --smoke 0|1
                 --load-before L --load-after L --commit C [--hidden-only 0|1]
  perf_report.py --check REPORT.json
  perf_report.py --update-readme docs/PERFORMANCE.md REPORT.json

RESULTS has one line per measurement: figure, value, unit, p50 us, p99 us
(tab-separated). Figures are reported as medians over the rounds; a ratio
compares a figure's median with its baseline's median from the same run.
Nothing here judges a figure: no thresholds, no timing assertions.
"""

import datetime
import json
import os
import statistics
import sys

# name: (what it is, baselines it is compared with)
FIGURES = {
    "unary-c64": ("Unary GenId, 1 connection x 64 in flight", ["bare-unary-c64"]),
    "bare-unary-c64": ("Bare tonic counter server, same load", []),
    "genids-x1000-c64": ("GenIds x1000 snowflake, 1 x 64 (cap 4.096 M IDs/s)", ["bare-genids-x1000-c64"]),
    "bare-genids-x1000-c64": ("Bare tonic counter, GenIds x1000, 1 x 64", []),
    "uuid-x1000-c64": (
        "GenUuids x1000, UUIDv7 (16 bytes each on the wire), 1 x 64 (target: at least 8.19 M IDs/s, twice the"
        " snowflake cap, and 0.8x genids-x1000-c64 when that is below its cap)",
        ["genids-x1000-c64", "bare-uuid-x1000-c64"],
    ),
    "bare-uuid-x1000-c64": ("Bare tonic counter, GenUuids x1000 (16-byte runs), 1 x 64", []),
    "snowflake-one-in-process": (
        "One snowflake ID in process, `Issuer::gen_id`, cap lifted (criterion median)",
        [],
    ),
    "uuid-one-in-process": (
        "One UUIDv7 in process, `Issuer::gen_uuid` (the `GenUuid` path), same generator (criterion median)",
        ["snowflake-one-in-process"],
    ),
    "uuid-minus-snowflake-one-in-process": (
        "Same: one UUID minus one snowflake ID (target: at most 40 ns)",
        [],
    ),
    "snowflake-x1000-in-process-per-id": ("Per snowflake ID, `Issuer::gen_ids` of 1000, in process", []),
    "uuid-x1000-in-process-per-id": (
        "Per UUID, `Issuer::gen_uuids(1000)`, in process",
        ["snowflake-x1000-in-process-per-id"],
    ),
    "segment-x1000-c64": ("Segment GenIds x1000, 1 x 64", []),
    "lease-x1000-c64": ("Lease GenIds x1000, 1 x 64", []),
    "strict-embedded-c16": (
        "Strict unary, 16 callers, embedded (fsync'd)",
        ["bare-strict-embedded-c16", "postgres-nextval-c16", "postgres-update-c16"],
    ),
    "bare-strict-embedded-c16": ("Bare tonic counter, unary, 16 callers", []),
    "strict-embedded-c64": ("Strict unary, 64 callers, embedded (fsync'd)", ["bare-strict-embedded-c64"]),
    "bare-strict-embedded-c64": ("Bare tonic counter, unary, 64 callers", []),
    "strict-consul-c16": (
        "Strict unary, 16 callers, Consul test server",
        ["postgres-update-c16", "redis-incr-c50-fsync-always"],
    ),
    "postgres-nextval-c16": ("PostgreSQL nextval, pgbench -c 16 (fsync amortised over ~32 calls)", []),
    "postgres-update-c16": (
        "PostgreSQL UPDATE ... RETURNING one row, pgbench -c 16, synchronous_commit = on",
        [],
    ),
    "tls-unary-c64": ("Unary GenId over TLS 1.3, 1 x 64", ["plain-unary-c64"]),
    "plain-unary-c64": ("Unary GenId, plaintext, 1 x 64 (TLS's and formatted's baseline)", []),
    "formatted-c64": ("GenFormatted `orders`, 1 x 64", ["plain-unary-c64"]),
    "client-prefetch-1t": (
        "Client with prefetch, 1 thread as fast as it can, 3 nodes via Consul, steady state",
        ["client-prefetch-1t-one-refill", "redis-incr-c50-fsync-no", "redis-incr-c50-fsync-always"],
    ),
    "client-waits-over-1ms-per-10M": (
        "Same: next_id calls that found the buffer empty and waited over 1 ms, per 10 M IDs",
        [],
    ),
    "client-calls-over-1ms-per-10M": (
        "Same: every next_id call over 1 ms (the OS taking the core included), per 10 M IDs",
        [],
    ),
    "client-prefetch-1t-paced-6M": ("Client, 1 thread paced at 6 M IDs/s (an application's steady load)", []),
    "client-waits-over-1ms-per-10M-paced-6M": (
        "Same: calls that found the buffer empty and waited over 1 ms, per 10 M IDs",
        [],
    ),
    "client-calls-over-1ms-per-10M-paced-6M": ("Same: every call over 1 ms, per 10 M IDs", []),
    "client-prefetch-1t-one-refill": ("Client as fast as it can, one refill at a time (refills_in_flight = 1)", []),
    "client-waits-over-1ms-per-10M-one-refill": ("Same: buffer empty, waited over 1 ms, per 10 M IDs", []),
    "client-calls-over-1ms-per-10M-one-refill": ("Same: every call over 1 ms, per 10 M IDs", []),
    "python-client-prefetch-1t": (
        "Python client `next_id()`, 1 thread, prefetch from 3 nodes (target: at least 1 M IDs/s and 20x"
        " redis-py INCR)",
        ["redis-py-incr-1t"],
    ),
    "redis-py-incr-1t": ("redis-py INCR from the same thread, local redis-server", []),
    "python-client-sigkill-longest": (
        "Python client: the longest `next_id()` while one of the 3 nodes is SIGKILLed under prefetch"
        " (target: under 50 ms)",
        [],
    ),
    "python-client-sigkill-errors": ("Same: calls that failed (target: 0)", []),
    "python-client-sigkill-duplicates": ("Same: IDs handed out twice (target: 0)", []),
    "ts-client-prefetch-1loop": (
        "npm client `await nextId()`, 1 event loop, prefetch from 3 nodes (target: at least 1 M IDs/s"
        " and 20x ioredis INCR)",
        ["ioredis-incr-1loop"],
    ),
    "ioredis-incr-1loop": ("ioredis `await incr()` from the same event loop, local redis-server", []),
    "ts-client-sigkill-longest": (
        "npm client: the longest `nextId()` while one of the 3 nodes is SIGKILLed under prefetch"
        " (target: under 50 ms)",
        [],
    ),
    "ts-client-sigkill-p999": ("Same: p99.9 of the `nextId()` calls through the SIGKILL", []),
    "ts-client-sigkill-longest-core-wait": (
        "Same: of the longest call, the time the loop waited for a core (Linux run queue)",
        [],
    ),
    "ts-client-nokill-longest": ("Same load, no kill (control): the longest `nextId()`", []),
    "ts-client-sigkill-errors": ("Same: calls that failed (target: 0)", []),
    "ts-client-sigkill-duplicates": ("Same: IDs handed out twice (target: 0)", []),
    "redis-incr-c50-fsync-no": ("Redis INCR, redis-benchmark -c 50, no persistence", []),
    "redis-incr-c50-fsync-always": ("Redis INCR, -c 50, appendfsync always", []),
    "seq10-x1000-c64": (
        "GenIds x1000 snowflake, plain, sequence_bits = 10 (cap 1.024 M IDs/s), 1 x 64",
        [],
    ),
    "hidden-sortable-x1000-c64": (
        "GenIds x1000 hidden snowflake (sortable, 2 version bits: cap 1.024 M IDs/s), 1 x 64",
        ["seq10-x1000-c64", "genids-x1000-c64"],
    ),
    "plain-tag-x1000-c64": ("Segment GenIds x1000, plain tag, step 10^6, 1 x 64", []),
    "plain-wide-tag-x1000-c64": (
        "Segment GenIds x1000, plain tag whose IDs start at 2^39 (as wide on the wire as the hidden tag's), 1 x 64",
        [],
    ),
    "hidden-tag-x1000-c64": (
        "Segment GenIds x1000, hidden tag (4 version bits, 40 domain bits), 1 x 64",
        ["plain-tag-x1000-c64", "plain-wide-tag-x1000-c64"],
    ),
}

REQUIRED = ["date", "commit", "machine", "secs", "rounds", "profile", "smoke", "figures"]


def read_results(path):
    rows = {}
    order = []
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 3 or not parts[0]:
                continue
            name, value, unit = parts[0], parts[1], parts[2]
            p50 = parts[3] if len(parts) > 3 else ""
            p99 = parts[4] if len(parts) > 4 else ""
            try:
                v = float(value)
            except ValueError:
                raise SystemExit(f"perf_report: figure {name}: value {value!r} is not a number")
            if name not in rows:
                rows[name] = {"unit": unit, "values": [], "p50": [], "p99": []}
                order.append(name)
            rows[name]["values"].append(v)
            if p50:
                rows[name]["p50"].append(float(p50))
            if p99:
                rows[name]["p99"].append(float(p99))
    return order, rows


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def build(args):
    order, rows = read_results(args["results"])
    medians = {n: statistics.median(r["values"]) for n, r in rows.items()}
    figures = []
    for name in order:
        r = rows[name]
        what, baselines = FIGURES.get(name, (name, []))
        ratios = {}
        for b in baselines:
            if medians.get(b):
                ratios[b] = round(medians[name] / medians[b], 4)
        figures.append(
            {
                "name": name,
                "what": what,
                "unit": r["unit"],
                "median": medians[name],
                "values": r["values"],
                "p50_us": statistics.median(r["p50"]) if r["p50"] else None,
                "p99_us": statistics.median(r["p99"]) if r["p99"] else None,
                "ratios": ratios,
            }
        )
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": args["commit"],
        "machine": {
            "nproc": os.cpu_count(),
            "cpu_model": cpu_model(),
            "load_before": args["load_before"],
            "load_after": args["load_after"],
        },
        "secs": int(args["secs"]),
        "rounds": int(args["rounds"]),
        "profile": args["profile"],
        "smoke": args["smoke"] == "1",
        "hidden_only": args.get("hidden_only", "0") == "1",
        "figures": figures,
    }


def fmt(v, unit):
    if unit in ("IDs/s", "calls/s"):
        if v >= 1e6:
            return f"{v / 1e6:.2f} M {unit}"
        if v >= 1e4:
            return f"{v / 1e3:.1f} k {unit}"
        return f"{v:,.0f} {unit}"
    if unit == "ns":
        return f"{v:.1f} ns" if abs(v) >= 10 else f"{v:.2f} ns"
    if unit == "ms":
        return f"{v:.1f} ms"
    if unit == "us":
        return f"{v:.1f} us"
    return f"{v:g}"


def table(report):
    lines = ["| What | Median | p50 / p99 | Against (same run) |", "|---|---|---|---|"]
    for f in report["figures"]:
        lat = ""
        if f["p50_us"] is not None and f["p99_us"] is not None:
            lat = f"{f['p50_us']:g} / {f['p99_us']:g} us"
        against = ", ".join(f"{ratio:.2f}x {b}" for b, ratio in f["ratios"].items())
        lines.append(f"| {f['what']} (`{f['name']}`) | {fmt(f['median'], f['unit'])} | {lat} | {against} |")
    m = report["machine"]
    lines.append("")
    lines.append(
        f"`scripts/perf-report.sh {report['secs']} {report['rounds']}`"
        f"{' --smoke' if report['smoke'] else ''}{' --hidden-only' if report.get('hidden_only') else ''}"
        f", {report['profile']} build, commit {report['commit']}, "
        f"{report['date']}; {m['nproc']} x {m['cpu_model']}, load average {m['load_before']} before, "
        f"{m['load_after']} after; medians of {report['rounds']} round(s)."
    )
    return "\n".join(lines) + "\n"


def check(report):
    missing = [k for k in REQUIRED if k not in report]
    if missing:
        raise SystemExit(f"perf_report: report lacks {missing}")
    for k in ("nproc", "cpu_model", "load_before", "load_after"):
        if k not in report["machine"]:
            raise SystemExit(f"perf_report: report.machine lacks {k}")
    if not report["figures"]:
        raise SystemExit("perf_report: the report has no figures")
    names = {f["name"] for f in report["figures"]}
    for f in report["figures"]:
        for k in ("name", "what", "unit", "median", "values", "ratios"):
            if k not in f:
                raise SystemExit(f"perf_report: figure {f.get('name')} lacks {k}")
        # A difference ("a-minus-b") may fall below 0; nothing else may.
        negative_ok = "-minus-" in f["name"]
        if not isinstance(f["median"], (int, float)) or (f["median"] < 0 and not negative_ok):
            raise SystemExit(f"perf_report: figure {f['name']}: median {f['median']!r} is not a number >= 0")
        if len(f["values"]) != report["rounds"]:
            raise SystemExit(
                f"perf_report: figure {f['name']} has {len(f['values'])} values for {report['rounds']} rounds"
            )
        for b in FIGURES.get(f["name"], ("", []))[1]:
            if b in names and b not in f["ratios"] and any(
                g["name"] == b and g["median"] > 0 for g in report["figures"]
            ):
                raise SystemExit(f"perf_report: figure {f['name']} lacks its ratio against {b}")
    needed = ["genids-x1000-c64", "hidden-sortable-x1000-c64", "hidden-tag-x1000-c64"]
    if not report.get("hidden_only"):
        needed += [
            "uuid-x1000-c64",
            "unary-c64",
            "bare-unary-c64",
            "strict-embedded-c16",
            "client-prefetch-1t",
            "client-waits-over-1ms-per-10M-paced-6M",
        ]
    if not report.get("hidden_only") and not report["smoke"]:
        # The Python and npm clients' benches (scripts/bench-*-client.sh) run in full reports only.
        needed += ["python-client-prefetch-1t", "ts-client-prefetch-1loop"]
    for need in needed:
        if need not in names:
            raise SystemExit(f"perf_report: the report lacks figure {need}")


BEGIN = "<!-- perf-table:begin -->"
END = "<!-- perf-table:end -->"


def update_readme(readme, report):
    text = open(readme).read()
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise SystemExit(f"perf_report: {readme} needs exactly one {BEGIN} ... {END} region")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    body = "\n<!-- generated by scripts/perf-report.sh --update-readme; edit the script, not this table -->\n"
    open(readme, "w").write(head + BEGIN + body + table(report) + END + tail)


def main(argv):
    if argv[:1] == ["--check"]:
        check(json.load(open(argv[1])))
        print(f"perf_report: {argv[1]} is well formed")
        return
    if argv[:1] == ["--update-readme"]:
        report = json.load(open(argv[2]))
        check(report)
        if report.get("hidden_only"):
            raise SystemExit(
                "perf_report: a --hidden-only report has only the hiding figures; run the whole "
                "scripts/perf-report.sh [secs] [rounds] --update-readme for docs/PERFORMANCE.md's table"
            )
        if report["smoke"]:
            raise SystemExit(
                "perf_report: a --smoke report (one second, one round, debug build) is not for docs/PERFORMANCE.md: "
                "run scripts/perf-report.sh [secs] [rounds] --update-readme on a quiet machine"
            )
        update_readme(argv[1], report)
        return
    args = {"results": argv[0], "out": argv[1]}
    it = iter(argv[2:])
    for k in it:
        args[k.lstrip("-").replace("-", "_")] = next(it)
    report = build(args)
    check(report)
    with open(os.path.join(args["out"], "report.json"), "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    with open(os.path.join(args["out"], "report.md"), "w") as f:
        f.write("# idgen performance report\n\n" + table(report))


if __name__ == "__main__":
    main(sys.argv[1:])
