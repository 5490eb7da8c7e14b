//! The config unit tests: defaults, every key's checks naming the key,
//! layering of file, environment and flags, and secrets never shown.

use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::providers::Format;

use super::environment::check_environment;
use super::file::KEY_ALIASES;
use super::*;

const NOW: u64 = 1_790_000_000_000;

#[test]
fn defaults_are_valid() {
    let c = FileConfig::default().validate(NOW).unwrap();
    assert_eq!(c.server.max_batch, 10_000);
    assert_eq!(c.layout.spec().sequence_bits, 12);
    assert_eq!(c.hwm.reserve, Duration::from_secs(3));
    assert_eq!(c.hwm.max_backward, Duration::from_secs(1));
    assert_eq!(c.hwm.max_startup_skew, Duration::from_secs(10));
}

#[test]
fn store_max_unhealthy_defaults_to_three_minutes_and_is_bounded() {
    let c = FileConfig::default().validate(NOW).unwrap();
    assert_eq!(c.store.max_unhealthy, Duration::from_secs(180));
    let mut f = FileConfig::default();
    f.store.max_unhealthy = Duration::from_millis(500);
    assert_eq!(err_key(&f), "store.max_unhealthy");
    f.store.max_unhealthy = Duration::from_secs(2 * 86_400);
    assert_eq!(err_key(&f), "store.max_unhealthy");
    f.store.max_unhealthy = Duration::from_secs(1);
    assert_eq!(
        f.validate(NOW).unwrap().store.max_unhealthy,
        Duration::from_secs(1)
    );
}

fn err_key(f: &FileConfig) -> String {
    match f.validate(NOW) {
        Err(ConfigError::Invalid { key, .. }) => key.to_owned(),
        other => panic!("expected an invalid key, got {other:?}"),
    }
}

#[test]
fn mode_sections_are_checked_and_the_admin_token_is_never_printed() {
    let mut f = FileConfig::default();
    f.lease.enabled = true;
    f.lease.zone = 128;
    assert_eq!(err_key(&f), "lease.zone");
    f.lease.zone = 127;
    f.lease.token = Some(65_536);
    assert_eq!(err_key(&f), "lease.token");
    f.lease.token = Some(63);
    f.lease.block = 0;
    assert_eq!(err_key(&f), "lease.block");
    f.lease.block = 1000;
    let c = f.validate(NOW).unwrap();
    assert_eq!(c.lease.map(|l| (l.zone, l.token)), Some((127, Some(63))));

    // Embedded nodes derive their token range from (datacenter,
    // worker) and refuse a token of another node's range.
    let mut f = FileConfig::default();
    f.lease.enabled = true;
    f.node.datacenter_id = 1;
    f.node.worker_id = 2;
    let c = f.validate(NOW).unwrap();
    assert_eq!(c.lease.as_ref().and_then(|l| l.token), Some(2048 + 128));
    f.lease.token = Some(0);
    let err = f.validate(NOW).unwrap_err().to_string();
    assert!(
        err.contains("lease.token") && err.contains("2176 to 2239"),
        "{err}"
    );
    assert!(err.contains("belongs to datacenter 0, worker 0"), "{err}");
    f.lease.token = Some(2239);
    assert_eq!(
        f.validate(NOW).unwrap().lease.and_then(|l| l.token),
        Some(2239)
    );

    let mut f = FileConfig::default();
    f.strict.enabled = true;
    f.strict.default_step = 0;
    assert_eq!(err_key(&f), "strict.default_step");
    f.strict.default_step = 1_000_001;
    assert_eq!(err_key(&f), "strict.default_step");
    // Disabled sections are not checked.
    f.strict.enabled = false;
    assert!(f.validate(NOW).unwrap().strict.is_none());

    let mut f = FileConfig::default();
    assert!(f.validate(NOW).unwrap().admin.token.is_none());
    f.admin.token = "s3cret-admin".into();
    f.admin.token_file = "/tmp/whatever".into();
    assert_eq!(err_key(&f), "admin.token");
    f.admin.token_file = PathBuf::new();
    let c = f.validate(NOW).unwrap();
    assert_eq!(c.admin.token, Some(AdminToken("s3cret-admin".into())));
    assert!(!format!("{c:?} {f:?}").contains("s3cret-admin"));
    f.admin.token = String::new();
    f.admin.token_file = "/nonexistent/idgen-admin-token".into();
    assert_eq!(err_key(&f), "admin.token_file");
}

#[test]
fn errors_name_the_key() {
    let mut f = FileConfig::default();
    f.server.grpc_listen = "localhost".into();
    assert_eq!(err_key(&f), "server.grpc_listen");
    let mut f = FileConfig::default();
    f.node.worker_id = 32;
    assert_eq!(err_key(&f), "node.worker_id");
    let mut f = FileConfig::default();
    f.layout.preset = "snowflake".into();
    assert_eq!(err_key(&f), "layout.preset");
    let mut f = FileConfig::default();
    f.layout.time_bits = Some(45);
    assert_eq!(err_key(&f), "layout");
    let mut f = FileConfig::default();
    f.layout.epoch = "yesterday".into();
    assert_eq!(err_key(&f), "layout.epoch");
    let mut f = FileConfig::default();
    f.hwm.reserve = Duration::from_millis(1500);
    assert_eq!(err_key(&f), "hwm.reserve");
    let mut f = FileConfig::default();
    f.clock.max_startup_skew = Duration::from_secs(2);
    assert_eq!(err_key(&f), "clock.max_startup_skew");
    let mut f = FileConfig::default();
    f.clock.max_backward = Duration::from_millis(5);
    assert_eq!(err_key(&f), "clock.max_backward");
    let mut f = FileConfig::default();
    f.hwm.reserve = Duration::from_secs(u64::MAX / 2);
    assert_eq!(err_key(&f), "hwm.reserve");
    let mut f = FileConfig::default();
    f.server.max_batch = 0;
    assert_eq!(err_key(&f), "server.max_batch");
}

/// A file with `text` written into it, read with an environment prefix
/// nothing sets.
fn read(text: &str) -> Result<FileConfig, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, text).unwrap();
    FileConfig::load_with_env_prefix(Some(&path), "IDGENCFGENUM_")
}

#[test]
fn a_wrong_word_for_an_enum_key_names_the_key_and_the_words_to_use() {
    for (text, key, says) in [
        (
            "[store]\nbackend = \"etcd\"\n",
            "store.backend",
            "unknown backend \"etcd\"; use embedded or consul",
        ),
        (
            "[log]\nformat = \"xml\"\n",
            "log.format",
            "\"xml\": use text or json",
        ),
        (
            "[consul]\nworker = \"dynamic\"\n",
            "consul.worker",
            "\"dynamic\": use auto (claim a free id) or static (node.worker_id)",
        ),
    ] {
        let err = read(text).unwrap_err();
        assert_eq!(err.to_string(), format!("config key {key}: {says}"));
        assert!(matches!(err, ConfigError::Invalid { key: k, .. } if k == key));
    }
    // Each word reads back as the value it names, and is written back as
    // the same word.
    let f = read(
        "[store]\nbackend = \"consul\"\n[log]\nformat = \"json\"\n[consul]\nworker = \"static\"\n",
    )
    .unwrap();
    assert_eq!(f.store.backend, BackendKind::Consul);
    assert_eq!(f.log.format, LogFormat::Json);
    assert_eq!(f.consul.worker, WorkerClaim::Static);
    let text = f.redacted_toml().unwrap();
    assert!(text.contains("backend = \"consul\""), "{text}");
    assert!(text.contains("format = \"json\""), "{text}");
    assert!(text.contains("worker = \"static\""), "{text}");
    // Other type errors stay read errors, naming the key.
    let err = read("[node]\nworker_id = \"three\"\n").unwrap_err();
    assert!(matches!(err, ConfigError::Parse(_)), "{err:?}");
    assert!(err.to_string().contains("node.worker_id"), "{err}");
}

/// The default config with the Consul backend.
fn consul() -> FileConfig {
    let mut f = FileConfig::default();
    f.store.backend = BackendKind::Consul;
    f
}

#[test]
fn consul_section_is_checked_key_by_key() {
    let c = consul().validate(NOW).unwrap();
    let Backend::Consul(cluster) = &c.store.backend else {
        panic!("consul backend expected");
    };
    assert_eq!(cluster.lock.ttl, Duration::from_secs(15));
    assert!(!cluster.static_worker);
    assert_eq!(cluster.client.acl_token, None);
    type Edit = fn(&mut FileConfig);
    let cases: [(Edit, &str); 15] = [
        (
            |f| f.consul.address = "127.0.0.1:8500".into(),
            "consul.address",
        ),
        // HTTPS needs the CA of the agent's certificate...
        (
            |f| f.consul.address = "https://consul:8501".into(),
            "consul.ca_file",
        ),
        // ...and a plaintext address takes no TLS settings.
        (
            |f| f.consul.ca_file = "/etc/consul/ca.pem".into(),
            "consul.address",
        ),
        (
            |f| f.consul.tls_server_name = "server.dc1.consul".into(),
            "consul.address",
        ),
        (
            |f| f.consul.address = "ftp://consul:8500".into(),
            "consul.address",
        ),
        (
            |f| {
                f.consul.address = "https://consul:8501".into();
                f.consul.ca_file = "/nonexistent/ca.pem".into();
            },
            "consul.ca_file",
        ),
        (
            |f| f.consul.check_tls_server_name = "idgen.internal".into(),
            "consul.check_tls_server_name",
        ),
        (|f| f.consul.cluster = "Prod!".into(), "consul.cluster"),
        (|f| f.consul.prefix = "/".into(), "consul.prefix"),
        (
            |f| f.consul.session_ttl = Duration::from_millis(1500),
            "consul.session_ttl",
        ),
        (
            |f| f.consul.lock_margin = Duration::from_secs(8),
            "consul.lock_margin",
        ),
        (
            |f| f.consul.lock_delay = Duration::from_secs(61),
            "consul.lock_delay",
        ),
        (
            |f| f.consul.timeout = Duration::from_secs(6),
            "consul.timeout",
        ),
        (|f| f.node.instance_id = "a b".into(), "node.instance_id"),
        (
            |f| f.node.advertise = "0.0.0.0:50051".into(),
            "node.advertise",
        ),
    ];
    for (edit, key) in cases {
        let mut f = consul();
        edit(&mut f);
        assert_eq!(err_key(&f), key);
    }
}

#[test]
fn consul_session_ttl_is_held_to_consuls_minimum_unless_a_test_lowers_it() {
    // Consul's 10 s minimum, named in the message; the test-only
    // setting lowers it, within 1 s..=10 s.
    let mut f = consul();
    f.consul.session_ttl = Duration::from_secs(9);
    let msg = f.validate(NOW).unwrap_err().to_string();
    assert!(msg.contains("consul.session_ttl"), "{msg}");
    assert!(msg.contains("Consul's minimum session TTL"), "{msg}");
    assert!(msg.contains("10s"), "{msg}");
    f.consul.session_ttl = Duration::from_secs(10);
    f.consul.lock_margin = Duration::from_secs(2);
    f.validate(NOW).unwrap();
    f.consul.session_ttl = Duration::from_secs(2);
    f.consul.lock_delay = Duration::from_secs(2);
    f.consul.lock_margin = Duration::from_millis(800);
    f.consul.timeout = Duration::from_millis(500);
    assert_eq!(err_key(&f), "consul.session_ttl");
    f.testing.consul_session_ttl_min = Duration::from_secs(1);
    f.validate(NOW).unwrap();
    f.consul.session_ttl = Duration::from_secs(1);
    f.testing.consul_session_ttl_min = Duration::from_secs(2);
    let msg = f.validate(NOW).unwrap_err().to_string();
    assert!(msg.contains("testing.consul_session_ttl_min"), "{msg}");
    for bad in [Duration::from_millis(500), Duration::from_secs(11)] {
        f.testing.consul_session_ttl_min = bad;
        assert_eq!(err_key(&f), "testing.consul_session_ttl_min");
    }
}

#[test]
fn the_consul_token_comes_inline_or_from_a_file_and_is_never_shown() {
    let mut f = consul();
    f.consul.token = "t".into();
    f.consul.token_file = "/tmp/t".into();
    assert_eq!(err_key(&f), "consul.token");
    let mut f = consul();
    f.consul.token_file = "/nonexistent/idgen-token".into();
    assert_eq!(err_key(&f), "consul.token_file");
    // The token is read from the file and never shown.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("token");
    std::fs::write(&path, "  s3cret\n").unwrap();
    let mut f = consul();
    f.consul.token_file = path;
    f.consul.worker = WorkerClaim::Static;
    f.node.worker_id = 4;
    let c = f.validate(NOW).unwrap();
    let Backend::Consul(cluster) = &c.store.backend else {
        panic!("consul backend expected");
    };
    assert_eq!(cluster.client.acl_token.as_deref(), Some("s3cret"));
    assert!(cluster.static_worker);
    assert!(!format!("{c:?}").contains("s3cret"));
    f.consul.token = "inline-secret".into();
    f.consul.token_file = PathBuf::new();
    assert!(!format!("{f:?}").contains("inline-secret"));
}

#[test]
fn state_directory_takes_the_first_absolute_entry_and_refuses_a_relative_one() {
    use std::ffi::OsString;
    let dir = |v: &str| state_directory(Some(OsString::from(v)));
    assert_eq!(state_directory(None).unwrap(), None);
    assert_eq!(dir("").unwrap(), None);
    assert_eq!(
        dir("/var/lib/idgen").unwrap(),
        Some(PathBuf::from("/var/lib/idgen"))
    );
    assert_eq!(
        dir("/var/lib/idgen:/var/lib/other").unwrap(),
        Some(PathBuf::from("/var/lib/idgen"))
    );
    let e = dir("idgen").unwrap_err().to_string();
    assert!(
        e.contains("STATE_DIRECTORY") && e.contains("absolute"),
        "{e}"
    );
    assert!(Path::new(DEFAULT_STATE_PATH).is_absolute());
}

#[test]
fn the_example_config_lists_every_default() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/idgen.example.toml");
    let f = FileConfig::load_with_env_prefix(Some(&path), "IDGEN_EXAMPLE_UNUSED_").unwrap();
    f.validate(NOW).unwrap();
    assert_eq!(
        serde_json::to_value(&f).unwrap(),
        serde_json::to_value(FileConfig::default()).unwrap()
    );
    // Every key is written out, except the test-only [testing] section,
    // which must stay out of the example.
    let written: serde_json::Value = figment::Figment::from(figment::providers::Toml::file(&path))
        .extract()
        .unwrap();
    let keys = |v: &serde_json::Value| -> Vec<String> {
        let mut out = Vec::new();
        for (section, table) in v.as_object().into_iter().flatten() {
            for key in table.as_object().into_iter().flatten().map(|(k, _)| k) {
                out.push(format!("{section}.{key}"));
            }
        }
        out.sort();
        out
    };
    let mut defaults = serde_json::to_value(FileConfig::default()).unwrap();
    defaults.as_object_mut().unwrap().remove("testing");
    assert_eq!(keys(&written), keys(&defaults));
    assert!(written.get("testing").is_none());
}

#[test]
fn connection_bounds_are_checked_and_name_their_key() {
    let c = FileConfig::default()
        .validate(NOW)
        .unwrap()
        .server
        .connections;
    assert_eq!(c.grpc_max_connections, 768);
    assert_eq!(c.header_timeout, Duration::from_secs(10));
    assert_eq!(c.request_body_timeout, Duration::from_secs(5));
    assert_eq!(c.max_connections_per_peer, 64);
    type Break = fn(&mut ServerSection);
    let cases: [(&str, Break); 8] = [
        ("server.grpc_max_connections", |s| {
            s.grpc_max_connections = 0
        }),
        ("server.http_max_connections", |s| {
            s.http_max_connections = 2_000_000
        }),
        ("server.header_timeout", |s| {
            s.header_timeout = Duration::from_millis(10)
        }),
        ("server.request_body_timeout", |s| {
            s.request_body_timeout = Duration::ZERO
        }),
        ("server.grpc_keepalive_timeout", |s| {
            s.grpc_keepalive_timeout = Duration::from_secs(3600)
        }),
        ("server.grpc_max_concurrent_streams", |s| {
            s.grpc_max_concurrent_streams = 0
        }),
        ("server.max_header_size", |s| s.max_header_size = 100),
        ("server.max_connections_per_peer", |s| {
            s.max_connections_per_peer = 0
        }),
    ];
    for (key, break_it) in cases {
        let mut f = FileConfig::default();
        break_it(&mut f.server);
        assert_eq!(err_key(&f), key);
    }
}

#[test]
fn files_and_overrides_layer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(
        &path,
        "[node]\nworker_id = 3\n[layout]\npreset = \"sonyflake\"\n[hwm]\nreserve = \"5s\"\n",
    )
    .unwrap();
    let o = Overrides {
        worker_id: Some(4),
        ..Overrides::default()
    };
    let c = Config::load(Some(&path), &o, NOW).unwrap();
    assert_eq!(c.node.worker_id, 4);
    assert_eq!(c.layout.time_unit_ms(), 10);
    assert_eq!(c.hwm.reserve, Duration::from_secs(5));
}

#[test]
fn environment_overrides_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, "[node]\nworker_id = 3\n").unwrap();
    // A prefix of its own, so no other test or shell variable interferes.
    std::env::set_var("IDGENCFGTEST_NODE__WORKER_ID", "7");
    std::env::set_var("IDGENCFGTEST_HWM__RESERVE", "4s");
    let f = FileConfig::load_with_env_prefix(Some(&path), "IDGENCFGTEST_").unwrap();
    assert_eq!(f.node.worker_id, 7);
    assert_eq!(f.hwm.reserve, Duration::from_secs(4));
    std::env::set_var("IDGENCFGTEST_NODE__WORKER_ID", "seven");
    let err = FileConfig::load_with_env_prefix(Some(&path), "IDGENCFGTEST_").unwrap_err();
    assert!(
        err.to_string().to_lowercase().contains("worker_id"),
        "{err}"
    );
}

#[test]
fn the_old_lease_margin_key_still_sets_the_lock_margin() {
    let f = read("[consul]\nlease_margin = \"3s\"\n").unwrap();
    assert_eq!(f.consul.lock_margin, Duration::from_secs(3));
    let f = read("[consul]\nlock_margin = \"4s\"\n").unwrap();
    assert_eq!(f.consul.lock_margin, Duration::from_secs(4));
    // The environment's old name too.
    std::env::set_var("IDGENCFGALIAS_CONSUL__LEASE_MARGIN", "5s");
    let f = FileConfig::load_with_env_prefix(None, "IDGENCFGALIAS_").unwrap();
    std::env::remove_var("IDGENCFGALIAS_CONSUL__LEASE_MARGIN");
    assert_eq!(f.consul.lock_margin, Duration::from_secs(5));
    let err = read("[consul]\nlease_margin = \"3s\"\nlock_margin = \"4s\"\n").unwrap_err();
    assert!(err.to_string().contains("consul.lease_margin"), "{err}");
    assert!(err.to_string().contains("keep only lock_margin"), "{err}");
}

#[test]
fn unknown_keys_and_missing_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, "[node]\nworkerid = 3\n").unwrap();
    let msg = FileConfig::load(Some(&path)).unwrap_err().to_string();
    assert!(msg.contains("workerid"), "{msg}");
    let missing = dir.path().join("nope.toml");
    assert!(FileConfig::load(Some(&missing)).is_err());
}

/// An unknown key in the file is named as the user wrote it (file and
/// dotted key, no `default.` profile prefix), with the nearest known key
/// of that section, as the environment's typos are (issue 33: it read
/// `unknown field ... for key "default.server.grpc_listn"`, no suggestion).
#[test]
fn an_unknown_file_key_is_named_as_written_with_the_nearest_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    for (text, key, nearest) in [
        (
            "[server]\ngrpc_listn = \"127.0.0.1:1\"\n",
            "server.grpc_listn",
            "server.grpc_listen",
        ),
        ("[node]\nworkerid = 3\n", "node.workerid", "node.worker_id"),
        (
            "[server.http]\ncors_allow_origin = []\n",
            "server.http.cors_allow_origin",
            "server.http.cors_allow_origins",
        ),
        ("[nod]\nworker_id = 3\n", "nod", "node"),
    ] {
        std::fs::write(&path, text).unwrap();
        let msg = FileConfig::load(Some(&path)).unwrap_err().to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(msg.contains(&format!("unknown key {key};")), "{msg}");
        assert!(msg.contains(&format!("did you mean {nearest}?")), "{msg}");
        assert!(!msg.contains("default."), "{msg}");
    }
}

fn vars(names: &[&str]) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    names.iter().map(|n| (n.into(), "1".into())).collect()
}

#[test]
fn an_environment_variable_that_names_no_key_is_refused_with_the_nearest_key() {
    // One underscore instead of two: the old build ran as worker 0.
    let err = check_environment(
        "IDGEN_",
        vars(&["IDGEN_NODE_WORKER_ID"]),
        &FileConfig::keys(),
        KEY_ALIASES,
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("IDGEN_NODE_WORKER_ID maps to no config key"),
        "{msg}"
    );
    assert!(
        msg.contains("IDGEN_NODE__WORKER_ID (node.worker_id)"),
        "{msg}"
    );
    let msg = check_environment(
        "IDGEN_",
        vars(&["IDGEN_HWM__RESERV"]),
        &FileConfig::keys(),
        KEY_ALIASES,
    )
    .unwrap_err()
    .to_string();
    assert!(msg.contains("IDGEN_HWM__RESERVE (hwm.reserve)"), "{msg}");
    let msg = check_environment(
        "IDGEN_",
        vars(&["IDGEN_NOPE__WORKER_ID"]),
        &FileConfig::keys(),
        KEY_ALIASES,
    )
    .unwrap_err()
    .to_string();
    assert!(msg.contains("node.worker_id"), "{msg}");
}

#[test]
fn every_key_and_the_cli_variables_are_accepted_and_other_prefixes_ignored() {
    let mut names: Vec<String> = FileConfig::keys()
        .iter()
        .map(|(s, k)| format!("IDGEN_{}__{}", s.to_uppercase(), k.to_uppercase()))
        .collect();
    assert!(names.contains(&"IDGEN_LAYOUT__SEQUENCE_BITS".to_string()));
    assert!(names.contains(&"IDGEN_CONSUL__TOKEN".to_string()));
    names.extend(NON_CONFIG_VARIABLES.iter().map(|s| s.to_string()));
    names.extend([
        "IDGENX".into(),
        "PATH".into(),
        "XIDGEN_NODE_WORKER_ID".into(),
    ]);
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    check_environment("IDGEN_", vars(&refs), &FileConfig::keys(), KEY_ALIASES).unwrap();
}

#[test]
fn log_levels_must_be_levels_or_target_directives() {
    for ok in [
        "info",
        "WARN",
        "idgen=debug,info",
        "off",
        "idgen::server=trace",
    ] {
        check_log_filter(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    for bad in ["verbose", "warning", "", " , ", "idgen=loud", "=debug"] {
        assert!(check_log_filter(bad).is_err(), "{bad:?} was accepted");
    }
    let mut f = FileConfig::default();
    f.log.level = "verbose".into();
    let msg = f.validate(NOW).unwrap_err().to_string();
    assert!(
        msg.contains("log.level") && msg.contains("verbose"),
        "{msg}"
    );
}

#[test]
fn check_config_output_redacts_secrets_and_reads_back() {
    let mut f = FileConfig::default();
    f.admin.token = "inline-admin-secret".into();
    f.consul.token = "inline-consul-secret".into();
    f.node.worker_id = 9;
    let text = f.redacted_toml().unwrap();
    assert!(!text.contains("inline-admin-secret"), "{text}");
    assert!(!text.contains("inline-consul-secret"), "{text}");
    assert!(text.contains("<redacted>"), "{text}");
    let back: FileConfig = toml::from_str(&text).unwrap();
    assert_eq!(back.node.worker_id, 9);
}

#[test]
fn formats_are_compiled_at_load_and_refusals_name_the_format_and_entry() {
    let toml_text = r#"
[formatted]
block = 10

[[formats]]
name = "orders"
template = "{yyyy}{MM}{dd}{seq:6}"
reset = "day"
"#;
    let f: FileConfig = figment::Figment::from(figment::providers::Toml::string(toml_text))
        .extract()
        .unwrap();
    let c = f.validate(NOW).unwrap();
    assert_eq!(c.formatted.block, 10);
    assert_eq!(c.formatted.formats[0].name, "orders");

    // A daily counter without the day in the template could repeat.
    let mut bad = f.clone();
    bad.formats[0].template = Some("{yyyy}{MM}{seq:6}".into());
    let e = bad.validate(NOW).unwrap_err().to_string();
    assert!(
        e.contains("formats") && e.contains("entry 1") && e.contains("\"orders\""),
        "{e}"
    );

    let mut twice = f.clone();
    twice.formats.push(f.formats[0].clone());
    let e = twice.validate(NOW).unwrap_err().to_string();
    assert!(e.contains("entry 2 redefines format \"orders\""), "{e}");

    let mut scopes = f.clone();
    assert_eq!(
        scopes.validate(NOW).unwrap().formatted.max_scope_values,
        10_000
    );
    scopes.formatted.max_scope_values = 0;
    assert_eq!(err_key(&scopes), "formatted.max_scope_values");

    let mut block = f.clone();
    block.formatted.block = 0;
    assert_eq!(err_key(&block), "formatted.block");
}

#[test]
fn the_lua_deadline_and_workers_default_and_are_range_checked() {
    let toml_text = "[formatted]\nlua_deadline = \"200ms\"\nlua_workers = 2\n";
    let f: FileConfig = figment::Figment::from(figment::providers::Toml::string(toml_text))
        .extract()
        .unwrap();
    let c = f.validate(NOW).unwrap();
    assert_eq!(c.formatted.lua_deadline, Duration::from_millis(200));
    assert_eq!(c.formatted.lua_workers, 2);
    let d: FileConfig = figment::Figment::from(figment::providers::Toml::string(""))
        .extract()
        .unwrap();
    let d = d.validate(NOW).unwrap();
    assert_eq!(d.formatted.lua_deadline, Duration::from_millis(50));
    assert_eq!(d.formatted.lua_workers, 4);
    for bad in [Duration::ZERO, Duration::from_secs(11)] {
        let mut g = f.clone();
        g.formatted.lua_deadline = bad;
        assert_eq!(err_key(&g), "formatted.lua_deadline");
    }
    for bad in [0, 65] {
        let mut g = f.clone();
        g.formatted.lua_workers = bad;
        assert_eq!(err_key(&g), "formatted.lua_workers");
    }
}

#[test]
fn the_lua_check_budget_defaults_and_is_range_checked() {
    let toml_text = "[formatted]\nlua_check_budget = \"2s\"\n";
    let f: FileConfig = figment::Figment::from(figment::providers::Toml::string(toml_text))
        .extract()
        .unwrap();
    assert_eq!(
        f.validate(NOW).unwrap().formatted.lua_check_budget,
        Duration::from_secs(2)
    );
    let d: FileConfig = figment::Figment::from(figment::providers::Toml::string(""))
        .extract()
        .unwrap();
    assert_eq!(
        d.validate(NOW).unwrap().formatted.lua_check_budget,
        crate::id::format::lua::DEFAULT_CHECK_BUDGET
    );
    for bad in [Duration::from_millis(99), Duration::from_secs(601)] {
        let mut g = f.clone();
        g.formatted.lua_check_budget = bad;
        assert_eq!(err_key(&g), "formatted.lua_check_budget");
    }
}

#[test]
fn hide_on_strict_is_refused_with_what_to_use_instead() {
    let f = read("[strict]\nenabled = true\nhide = { key = \"k\" }\n").unwrap();
    let err = f.validate(NOW).unwrap_err().to_string();
    assert!(err.contains("strict.hide"), "{err}");
    assert!(err.contains("consecutive by contract"), "{err}");
    assert!(err.contains("{seq:N:hidden}"), "{err}");
    // Refused even with strict mode off: the key would do nothing.
    let off = read("[strict]\nhide = true\n").unwrap();
    assert!(off.validate(NOW).is_err());
}
