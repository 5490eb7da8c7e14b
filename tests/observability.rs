//! What operators' monitoring sees: every series exported from start-up
//! (at zero, before any request), the histogram bucket bounds, the
//! `process_*` series, and that the shipped dashboard
//! (`deploy/grafana/idgen.json`) and alert rules
//! (`deploy/prometheus/alerts.yml`) name only metrics a live node exports;
//! and `/metrics` of a node in this process parses and covers the
//! documented set.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::{
    check_with_promtool, default_layout, metric, test_config, test_consul, wait_for_status,
    write_child_config, write_cluster_config, ChildServer, TestServer,
};
use idgen::proto::GenIdsRequest;

const ALL_MODES: &str = "[segment]\nenabled = true\nauto_create = true\n\
    [lease]\nenabled = true\n[strict]\nenabled = true\n";

/// An embedded node with every mode on, as a child process.
fn embedded_node(dir: &Path) -> ChildServer {
    let config = write_child_config(dir, true);
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(ALL_MODES);
    std::fs::write(&config, text).unwrap();
    ChildServer::start(&config)
}

/// `/metrics` of an embedded node serving TLS (a child process).
async fn scrape_tls_node() -> String {
    let dir = tempfile::tempdir().unwrap();
    let cert = common::tls::server_cert(dir.path(), "node");
    let config = write_child_config(dir.path(), true);
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!(
        "[server.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        cert.cert.display(),
        cert.key.display()
    ));
    std::fs::write(&config, text).unwrap();
    let node = ChildServer::start(&config);
    common::tls::https_get(node.http, &cert.der, "/metrics").await
}

/// The sample names (`name` before `{` or the value) of an exposition.
fn sample_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// Asserts that `series` (name with labels exactly as exported) is
/// present with value `value`.
fn assert_sample(text: &str, series: &str, value: &str) {
    let line = format!("{series} {value}");
    assert!(
        text.lines().any(|l| l == line),
        "missing `{line}` in:\n{text}"
    );
}

fn unix_now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs_f64()
}

/// Histogram bucket bounds, the layout's time left and the `process_*`
/// series of a first scrape.
fn histograms_layout_and_process_series(text: &str) {
    // A histogram, not a summary: it aggregates across nodes.
    assert!(
        text.contains("# TYPE idgen_strict_commit_batch histogram"),
        "{text}"
    );
    assert!(
        !text.contains("idgen_strict_commit_batch{quantile"),
        "{text}"
    );

    // Request buckets start at 5 us.
    let les: Vec<&str> = text
        .lines()
        .filter_map(|l| {
            l.strip_prefix("idgen_request_duration_seconds_bucket{rpc=\"GenId\",code=\"OK\",le=\"")
        })
        .filter_map(|rest| rest.split('"').next())
        .collect();
    assert_eq!(
        les,
        [
            "0.000005", "0.00001", "0.000025", "0.00005", "0.0001", "0.00025", "0.0005", "0.001",
            "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "+Inf"
        ],
        "{text}"
    );
    let batch_les: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("idgen_strict_commit_batch_bucket{le=\""))
        .filter_map(|rest| rest.split('"').next())
        .collect();
    assert_eq!(
        batch_les,
        [
            "1", "2", "4", "8", "16", "32", "64", "128", "256", "512", "1024", "2048", "4096",
            "+Inf"
        ]
    );

    // The layout's time left, in seconds (the years gauge is gone).
    assert!(!text.contains("idgen_layout_years_left"), "{text}");
    let left = metric(text, "idgen_layout_time_left_seconds").expect("time left");
    let expected = default_layout().end_ms() as f64 / 1000.0 - unix_now_secs();
    assert!(
        (left - expected).abs() < 120.0,
        "time left {left} s, expected about {expected} s"
    );

    // Process series, read from /proc.
    let rss = metric(text, "process_resident_memory_bytes").expect("RSS");
    assert!(rss > 1_000_000.0, "RSS {rss}");
    let fds = metric(text, "process_open_fds").expect("open fds");
    assert!(fds >= 5.0, "listeners, state file, stdio: {fds}");
    assert!(metric(text, "process_max_fds").expect("max fds") >= fds);
    assert!(metric(text, "process_cpu_seconds_total").expect("CPU") >= 0.0);
    let start = metric(text, "process_start_time_seconds").expect("start time");
    assert!(
        (unix_now_secs() - start).abs() < 120.0,
        "started {start}, now {}",
        unix_now_secs()
    );
    assert!(text.contains("# TYPE process_cpu_seconds_total counter"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_node_exports_every_series_at_zero_before_any_request() {
    let dir = tempfile::tempdir().unwrap();
    let node = embedded_node(dir.path());
    let text = common::metrics_text(&node).await;
    check_with_promtool(&text);

    for mode in ["snowflake", "segment", "lease", "strict"] {
        assert_sample(
            &text,
            &format!("idgen_ids_issued_total{{mode=\"{mode}\"}}"),
            "0",
        );
    }
    // Runway, read at the scrape: no tag in memory yet; the first lease
    // block (lease.block) reserved before serving.
    assert_sample(&text, "idgen_segment_tags_without_runway", "0");
    let lease_block = idgen::config::LeaseModeSettings::default()
        .block
        .to_string();
    assert_sample(&text, "idgen_lease_runway_ids", &lease_block);
    for rpc in [
        "GenId",
        "GenIds",
        "DecodeId",
        "http_id",
        "http_ids",
        "http_decode",
    ] {
        assert_sample(
            &text,
            &format!("idgen_request_duration_seconds_count{{rpc=\"{rpc}\",code=\"OK\"}}"),
            "0",
        );
    }
    for kind in ["tolerated", "refused"] {
        assert_sample(
            &text,
            &format!("idgen_clock_step_back_events_total{{kind=\"{kind}\"}}"),
            "0",
        );
    }
    for port in ["grpc", "http"] {
        for limit in ["peer", "port"] {
            assert_sample(
                &text,
                &format!("idgen_connections_evicted_total{{port=\"{port}\",limit=\"{limit}\"}}"),
                "0",
            );
        }
        for name in [
            "idgen_admin_auth_failures_total",
            "idgen_admin_auth_throttled_total",
            "idgen_requests_stalled_total",
        ] {
            assert_sample(&text, &format!("{name}{{port=\"{port}\"}}"), "0");
        }
    }
    for (backend, op) in [
        ("embedded", "store_hwm"),
        ("segment", "take_range"),
        ("lease", "reserve_block"),
    ] {
        assert_sample(
            &text,
            &format!("idgen_store_errors_total{{backend=\"{backend}\",op=\"{op}\"}}"),
            "0",
        );
    }
    for result in ["ok", "failed"] {
        assert_sample(
            &text,
            &format!("idgen_store_reopens_total{{result=\"{result}\"}}"),
            "0",
        );
    }
    for reason in ["idle", "deleted"] {
        assert_sample(
            &text,
            &format!("idgen_segment_buffers_released_total{{reason=\"{reason}\"}}"),
            "0",
        );
    }
    for limit in [
        "segment.max_tags",
        "strict.max_keys_per_namespace",
        "strict.max_namespaces",
    ] {
        assert_sample(
            &text,
            &format!("idgen_limit_refusals_total{{limit=\"{limit}\"}}"),
            "0",
        );
    }
    for series in [
        "idgen_clock_step_back_size_seconds_count",
        "idgen_sequence_exhausted_waits_total",
        "idgen_store_write_faults_total",
        "idgen_state_file_lost",
        "idgen_unable_to_issue_seconds",
        "idgen_strict_commit_batch_count",
        "idgen_segment_tags",
        "idgen_segment_tag_buffers",
        "idgen_strict_keys",
        "idgen_strict_namespaces",
    ] {
        assert_sample(&text, series, "0");
    }
    assert_sample(&text, "idgen_store_healthy", "1");
    // Present from the start (0 until the monitor's first check), then 1.
    assert!(metric(&text, "idgen_serving").is_some(), "{text}");
    assert!(metric(&text, "idgen_hwm_lead_seconds").is_some(), "{text}");
    assert!(wait_for_status(&format!("http://{}/readyz", node.http), 200).await);
    assert_sample(&common::metrics_text(&node).await, "idgen_serving", "1");
    assert_sample(&text, "idgen_layout_worker_ids", "32");

    histograms_layout_and_process_series(&text);
}

/// A Consul-mode node with every mode on, and the test server it uses.
async fn consul_node(dir: &Path) -> (consul_testserver::TestConsul, ChildServer) {
    let consul = test_consul().await;
    let config = write_cluster_config(
        dir,
        "obs",
        consul.addr(),
        &[
            ("segment", "enabled", "true"),
            ("segment", "auto_create", "true"),
            ("lease", "enabled", "true"),
            ("strict", "enabled", "true"),
        ],
    );
    let node = ChildServer::start(&config);
    (consul, node)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consul_node_exports_its_cluster_series_at_zero() {
    let dir = tempfile::tempdir().unwrap();
    let (_consul, node) = consul_node(dir.path()).await;
    let text = common::metrics_text(&node).await;
    check_with_promtool(&text);
    for endpoint in idgen::metrics::CONSUL_ENDPOINTS {
        assert_sample(
            &text,
            &format!("idgen_consul_errors_total{{endpoint=\"{endpoint}\"}}"),
            "0",
        );
    }
    for series in [
        "idgen_fenced",
        "idgen_fencings_total",
        "idgen_worker_ids_skipped_total",
        "idgen_strict_conflicts_total",
        "idgen_store_errors_total{backend=\"consul\",op=\"store_hwm\"}",
    ] {
        assert_sample(&text, series, "0");
    }
    assert!(
        metric(&text, "idgen_consul_session_renew_age_seconds").is_some(),
        "{text}"
    );
}

/// Every `idgen_*` and `process_*` identifier in `text`.
fn metric_names_in(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut i = 0;
    while i < bytes.len() {
        if is_ident(bytes[i]) && (i == 0 || !is_ident(bytes[i - 1])) {
            let start = i;
            while i < bytes.len() && is_ident(bytes[i]) {
                i += 1;
            }
            let word = &text[start..i];
            if word.starts_with("idgen_") || word.starts_with("process_") {
                out.push(word.to_string());
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Every PromQL query string in a Grafana dashboard: targets' `expr` and
/// template variables' `query`/`definition`.
fn dashboard_queries(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        // The data source variable's query is a plugin type, not PromQL.
        serde_json::Value::Object(map) if map.get("type") == Some(&"datasource".into()) => {}
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr" | "definition", serde_json::Value::String(s)) => out.push(s.clone()),
                    ("query", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => dashboard_queries(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|i| dashboard_queries(i, out)),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_the_alert_rules_name_only_metrics_a_node_exports() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Every series exists on one of the two backends, all modes on.
    let embedded_dir = tempfile::tempdir().unwrap();
    let embedded = embedded_node(embedded_dir.path());
    let consul_dir = tempfile::tempdir().unwrap();
    let (_consul, cluster) = consul_node(consul_dir.path()).await;
    let mut exported = sample_names(&common::metrics_text(&embedded).await);
    exported.extend(sample_names(&common::metrics_text(&cluster).await));
    // The TLS series (reloads, certificate expiry) exist on a TLS node.
    exported.extend(sample_names(&scrape_tls_node().await));

    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("deploy/grafana/idgen.json")).expect("dashboard"),
    )
    .expect("the dashboard is JSON");
    let mut queries = Vec::new();
    dashboard_queries(&dashboard, &mut queries);
    let panels = dashboard["panels"].as_array().expect("panels");
    let graphs = panels.iter().filter(|p| p["type"] != "row").count();
    for p in panels.iter().filter(|p| p["type"] != "row") {
        let targets = p["targets"].as_array().map_or(0, Vec::len);
        assert!(targets > 0, "panel {} has no query", p["title"]);
    }

    // Alert rules: one `expr:` per rule, each on one line.
    let rules = std::fs::read_to_string(root.join("deploy/prometheus/alerts.yml")).expect("rules");
    let alerts = rules
        .lines()
        .filter(|l| l.trim_start().starts_with("- alert:"))
        .count();
    let exprs: Vec<String> = rules
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("expr:"))
        .map(|e| e.trim().to_string())
        .collect();
    assert_eq!(exprs.len(), alerts, "one expression per alert");
    assert!(
        exprs.iter().all(|e| !e.is_empty() && e != "|" && e != ">-"),
        "expressions stay on one line: {exprs:?}"
    );

    let mut missing = Vec::new();
    let mut checked = BTreeSet::new();
    for (source, query) in queries
        .iter()
        .map(|q| ("dashboard", q))
        .chain(exprs.iter().map(|e| ("alerts.yml", e)))
    {
        let names = metric_names_in(query);
        assert!(!names.is_empty(), "{source}: no idgen metric in `{query}`");
        for name in names {
            if !exported.contains(&name) {
                missing.push(format!("{source}: {name} in `{query}`"));
            }
            checked.insert(name);
        }
    }
    assert!(
        missing.is_empty(),
        "metrics that no node exports:\n{}",
        missing.join("\n")
    );
    // Not vacuous: the files cover most of what a node exports.
    assert!(graphs >= 30, "{graphs} panels");
    assert!(alerts >= 20, "{alerts} alerts");
    assert!(
        checked.len() >= 40,
        "only {} names checked: {checked:?}",
        checked.len()
    );
}

#[test]
fn the_metric_name_scanner_finds_names_and_skips_labels_and_functions() {
    let names = metric_names_in(
        "histogram_quantile(0.99, sum by (le) (rate(idgen_request_duration_seconds_bucket{code!=\"OK\",instance=~\"$instance\"}[5m]))) / process_open_fds",
    );
    assert_eq!(
        names,
        ["idgen_request_duration_seconds_bucket", "process_open_fds"]
    );
    assert!(metric_names_in("{{instance}} sum(rate(x[1m]))").is_empty());
}

#[test]
fn every_admin_rpc_has_its_series_registered_at_start() {
    let proto = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("proto/idgen/v1/idgen.proto"),
    )
    .expect("proto");
    let admin = &proto[proto.find("service Admin {").expect("Admin service")..];
    let admin = &admin[..admin.find("\n}").expect("end of service")];
    let rpcs: BTreeSet<&str> = admin
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("rpc "))
        .filter_map(|l| l.split('(').next())
        .collect();
    let registered: BTreeSet<&str> = idgen::metrics::ADMIN_METHODS.iter().copied().collect();
    assert_eq!(rpcs, registered);
}

/// Every sample line of a Prometheus text exposition: `name{labels} value`.
fn parse_exposition(text: &str) -> Vec<(String, f64)> {
    let mut samples = Vec::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("sample has a value");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        let name = series.split('{').next().unwrap();
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name in {line:?}"
        );
        samples.push((name.to_owned(), value));
    }
    samples
}

#[tokio::test]
async fn metrics_parse_and_cover_the_documented_set() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(test_config(dir.path())).await;
    let mut c = server.client().await;
    // Enough IDs to run out of a millisecond's sequence at least once.
    for _ in 0..4 {
        c.gen_ids(GenIdsRequest {
            count: 10_000,
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let _ = c
        .gen_ids(GenIdsRequest {
            count: 0,
            ..Default::default()
        })
        .await;
    // Let the monitor and the renewal task tick.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let text = reqwest::get(server.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let samples = parse_exposition(&text);
    let has = |name: &str| samples.iter().any(|(n, _)| n == name);
    for name in [
        "idgen_ids_issued_total",
        "idgen_request_duration_seconds_bucket",
        "idgen_request_duration_seconds_count",
        "idgen_hwm_lead_seconds",
        "idgen_sequence_exhausted_waits_total",
        "idgen_store_write_duration_seconds_bucket",
        "idgen_layout_time_left_seconds",
        "idgen_serving",
        "idgen_build_info",
    ] {
        assert!(has(name), "missing {name} in:\n{text}");
    }
    // Counters exported from the start (at zero until the first event), so
    // rate() works. Values are process-wide: another test steps a clock.
    for series in [
        "idgen_clock_step_back_events_total{kind=\"tolerated\"} ",
        "idgen_clock_step_back_events_total{kind=\"refused\"} ",
        "idgen_store_errors_total{backend=\"embedded\",op=\"store_hwm\"} 0",
    ] {
        assert!(text.contains(series), "missing {series} in:\n{text}");
    }
    assert!(
        text.contains("code=\"INVALID_ARGUMENT\""),
        "error codes are labelled"
    );
    let issued: f64 = samples
        .iter()
        .filter(|(n, _)| n == "idgen_ids_issued_total")
        .map(|(_, v)| v)
        .sum();
    assert!(issued >= 40_000.0, "issued {issued}");
    // The mark is kept hwm.reserve (3 s) ahead and renewed every second.
    // How far ahead it is at one instant depends on when the last fsync'd
    // renewal finished (seconds, on a loaded disk) and the gauge is
    // process-wide (other tests' nodes set it too), so look for a reading
    // in the renewed range within a bounded time rather than at one instant.
    let lead_of = |text: &str| {
        parse_exposition(text)
            .into_iter()
            .find(|(n, _)| n == "idgen_hwm_lead_seconds")
            .map(|(_, v)| v)
    };
    let mut leads = vec![lead_of(&text)];
    for _ in 0..40 {
        if leads.iter().flatten().any(|l| *l > 1.0 && *l <= 3.5) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        let text = reqwest::get(server.url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        leads.push(lead_of(&text));
    }
    assert!(
        leads.iter().flatten().any(|l| *l > 1.0 && *l <= 3.5),
        "hwm lead never in (1 s, 3.5 s]: {leads:?}"
    );

    common::check_with_promtool(&text);
    server.stop().await;
}
