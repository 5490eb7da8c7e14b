//! Hide keys (issue 23): created, rotated, retired and listed through the
//! admin API and `idgen admin keys` on the embedded store; two admins
//! rotating at once on Consul get distinct versions and one active; a
//! Consul node sees another's rotation; a missing, malformed or wrong
//! master key is a clear error, and a Consul node with the wrong one can
//! neither change keys nor restart (both master key fingerprints named); key material never appears in replies,
//! logs or /metrics; a backup and restore keep every version.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::{run_idgen_with_env, write_child_config, ChildServer};
use idgen::modes::hide_keys::HideKeyRings;
use idgen::proto::admin_client::AdminClient;
use idgen::proto::{self};
use idgen::store::hide_keys::{
    ConsulHideKeyRecords, HideKeyState, HideKeyStore, HideKeys, MasterKey,
};
use idgen::store::kv_paths::ClusterPaths;
use tonic::transport::Channel;
use tonic::Code;

const TOKEN: &str = "hide-keys-admin-token";
const MASTER: [u8; 32] = [0x5a; 32];

fn master_text() -> String {
    base64::engine::general_purpose::STANDARD.encode(MASTER)
}

fn ok<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    r
}

/// An embedded node's config with the admin token and, when given, a
/// master key file (mode 600).
fn config(dir: &Path, key: Option<&str>) -> PathBuf {
    let path = write_child_config(dir, true);
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(&format!("[admin]\ntoken = \"{TOKEN}\"\n"));
    if let Some(key) = key {
        let file = dir.join("hide-master-key");
        std::fs::write(&file, key).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        text.push_str(&format!(
            "[hide]\nmaster_key_file = \"{}\"\n",
            file.display()
        ));
    }
    std::fs::write(&path, text).unwrap();
    path
}

async fn admin(node: &ChildServer) -> AdminClient<Channel> {
    AdminClient::connect(format!("http://{}", node.grpc))
        .await
        .expect("connects")
}

fn states(key: &proto::HideKey) -> Vec<(u32, String)> {
    key.versions
        .iter()
        .map(|v| (v.version, v.state.clone()))
        .collect()
}

/// A master key made with docs/HIDING.md's commands ("Hide keys"): `umask
/// 077`, then 32 random bytes in base64 (with `base64`'s newline) into a
/// file. Returns the file's text, once the file is checked to be the
/// owner's alone.
fn doc_made_master_key(dir: &Path) -> String {
    let file = dir.join("doc-made-master-key");
    let made = std::process::Command::new("bash")
        .args([
            "-euo",
            "pipefail",
            "-c",
            "umask 077\nhead -c 32 /dev/urandom | base64 > \"$1\"",
            "doc-made-master-key",
        ])
        .arg(&file)
        .output()
        .expect("bash runs");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let mode = std::fs::metadata(&file)
        .expect("key file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "umask 077 keeps the key the owner's");
    std::fs::read_to_string(&file).expect("key text")
}

fn cli(node: &ChildServer, args: &[&str]) -> (bool, String) {
    let addr = format!("http://{}", node.grpc);
    let mut all = vec!["admin", "keys"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--addr", &addr]);
    run_idgen_with_env(&all, &[("IDGEN_ADMIN__TOKEN", TOKEN)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_keys_through_grpc_and_cli_show_no_material() {
    let dir = tempfile::tempdir().unwrap();
    let master = doc_made_master_key(dir.path());
    let node = ChildServer::start(&config(dir.path(), Some(&master)));
    let mut c = admin(&node).await;

    // docs/HIDING.md's `idgen admin keys` commands, in its order.
    let (done, out) = cli(&node, &["create", "orders"]);
    assert!(
        done && out.contains("created orders: active version 0")
            && out.contains("version 0 active"),
        "{out}"
    );
    let again = c
        .create_hide_key(ok(proto::CreateHideKeyRequest {
            key_id: "orders".into(),
        }))
        .await
        .expect_err("exists");
    assert_eq!(again.code(), Code::AlreadyExists, "{again:?}");
    let bad = c
        .create_hide_key(ok(proto::CreateHideKeyRequest {
            key_id: "Orders/1".into(),
        }))
        .await
        .expect_err("bad id");
    assert_eq!(bad.code(), Code::InvalidArgument, "{bad:?}");
    let unknown = c
        .rotate_hide_key(ok(proto::RotateHideKeyRequest {
            key_id: "nope".into(),
            force: false,
        }))
        .await
        .expect_err("unknown");
    assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");
    let anonymous = c
        .rotate_hide_key(proto::RotateHideKeyRequest {
            key_id: "orders".into(),
            force: false,
        })
        .await
        .expect_err("no token");
    assert_eq!(anonymous.code(), Code::Unauthenticated, "{anonymous:?}");

    // Through the CLI: rotate (the old version stays, decode-only), list,
    // retire, rotate again, list as JSON.
    let (done, out) = cli(&node, &["rotate", "orders"]);
    assert!(
        done && out.contains("active version 1") && out.contains("version 0 retired"),
        "{out}"
    );
    let (done, plain_list) = cli(&node, &["list"]);
    assert!(
        done && plain_list.contains("orders: active version 1")
            && plain_list.contains("version 0 retired")
            && plain_list.contains("version 1 active"),
        "{plain_list}"
    );
    let (done, out) = cli(&node, &["retire", "orders"]);
    assert!(done && out.contains("active version none"), "{out}");
    let (done, out) = cli(&node, &["rotate", "orders"]);
    assert!(done && out.contains("active version 2"), "{out}");
    // The console's JSON API: the same call, the same rules.
    let http = reqwest::Client::new();
    let url = format!("http://{}/admin/api/hide-keys", node.http);
    let body = |action: &str| serde_json::json!({"action": action, "key_id": "orders"});
    let r = http
        .post(&url)
        .bearer_auth(TOKEN)
        .json(&body("rotate"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["key"]["active"], 3, "{v}");
    let r = http.post(&url).json(&body("rotate")).send().await.unwrap();
    assert_eq!(r.status(), 401, "no token, no change");
    let r = http
        .post(&url)
        .bearer_auth(TOKEN)
        .json(&body("delete"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let (done, listed) = cli(&node, &["list", "--json"]);
    assert!(done, "{listed}");
    let v: serde_json::Value = serde_json::from_str(listed.trim()).expect("json list");
    let versions = &v["keys"][0]["versions"];
    let got: Vec<(u64, &str)> = versions
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["version"].as_u64().unwrap(), v["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        got,
        vec![
            (0, "retired"),
            (1, "retired"),
            (2, "retired"),
            (3, "active")
        ]
    );

    let metrics = reqwest::get(format!("http://{}/metrics", node.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("idgen_hide_key_rotations_total{key_id=\"orders\"} 3"),
        "{metrics}"
    );
    let log = node.log_text();
    assert!(
        log.contains("idgen::audit") && log.contains("hide key rotate"),
        "every change is audited: {log}"
    );
    // The sealed records as stored, read back from the state file.
    node.terminate();
    let sealed = sealed_records(&dir.path().join("state.redb"));
    assert_eq!(sealed.len(), 4, "four sealed versions");
    let key = master.trim();
    for text in [&plain_list, &listed, &metrics, &log] {
        assert!(!text.contains(key), "the master key leaked");
        for s in &sealed {
            assert!(!text.contains(s.as_str()), "a sealed key leaked");
        }
    }
}

/// Every sealed version in a state file.
fn sealed_records(state: &Path) -> Vec<String> {
    use redb::{ReadableDatabase, ReadableTable, TableDefinition};
    const T: TableDefinition<&str, &[u8]> = TableDefinition::new("hide_keys");
    let db = redb::Database::open(state).expect("state file");
    let txn = db.begin_read().unwrap();
    let table = txn.open_table(T).unwrap();
    let mut out = Vec::new();
    for item in table.iter().unwrap() {
        let (_, v) = item.unwrap();
        let record: serde_json::Value = serde_json::from_slice(v.value()).unwrap();
        for version in record["versions"].as_array().unwrap() {
            out.push(version["wrapped"].as_str().unwrap().to_owned());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_malformed_and_wrong_master_keys_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    // No master key: the node runs; key changes say what to set.
    let node = ChildServer::start(&config(dir.path(), None));
    let e = admin(&node)
        .await
        .create_hide_key(ok(proto::CreateHideKeyRequest {
            key_id: "orders".into(),
        }))
        .await
        .expect_err("no master key");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message()
            .contains("set hide.master_key_file or IDGEN_HIDE_MASTER_KEY"),
        "{e:?}"
    );
    node.terminate();

    // A key of the wrong length stops the node at start.
    let short = base64::engine::general_purpose::STANDARD.encode([1u8; 16]);
    let short_cfg = config(dir.path(), Some(&short));
    let (done, out) = run_idgen_with_env(
        &["check-config", "--config", short_cfg.to_str().unwrap()],
        &[],
    );
    assert!(
        !done && out.contains("16 bytes"),
        "check-config says it too: {out}"
    );
    let log = ChildServer::try_start(&short_cfg, &[])
        .err()
        .expect("a 16-byte master key is refused");
    assert!(log.contains("16 bytes"), "{log}");

    // Keys made with one master key, then the node started with another.
    let node = ChildServer::start(&config(dir.path(), Some(&master_text())));
    admin(&node)
        .await
        .create_hide_key(ok(proto::CreateHideKeyRequest {
            key_id: "orders".into(),
        }))
        .await
        .expect("create");
    node.terminate();
    let other = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
    let log = ChildServer::try_start(&config(dir.path(), Some(&other)), &[])
        .err()
        .expect("a wrong master key stops the node");
    // Named by both fingerprints: the one stored with the keys, its own.
    for fingerprint in [MASTER, [7u8; 32]].map(|k| MasterKey::from_bytes(k).fingerprint()) {
        assert!(log.contains(&fingerprint), "{fingerprint}: {log}");
    }
    // A key file others can read: check-config warns.
    let cfg = config(dir.path(), Some(&master_text()));
    let file = dir.path().join("hide-master-key");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (done, out) = run_idgen_with_env(&["check-config", "--config", cfg.to_str().unwrap()], &[]);
    assert!(done && out.contains("chmod 600"), "{out}");
    assert!(
        !out.contains(&master_text()),
        "check-config never prints the key"
    );
    // The environment variable works as the file does.
    let cfg = config(dir.path(), None);
    let node = ChildServer::try_start_env(&cfg, &[], &[("IDGEN_HIDE_MASTER_KEY", &master_text())])
        .expect("the right key from the environment");
    node.terminate();
}

fn consul_keys(consul: &consul_testserver::TestConsul) -> (HideKeys, ConsulHideKeyRecords) {
    let records = ConsulHideKeyRecords::new(
        common::consul::default_client(consul),
        ClusterPaths::new("idgen", "hide-test"),
    );
    let keys = HideKeys::new(
        Arc::new(records.clone()),
        Some(Arc::new(MasterKey::from_bytes(MASTER))),
    );
    (keys, records)
}

/// A Consul node's config with the admin token; its master key comes
/// from the environment.
fn consul_config(dir: &Path, name: &str, consul: std::net::SocketAddr) -> PathBuf {
    let token = format!("\"{TOKEN}\"");
    common::write_cluster_config(dir, name, consul, &[("admin", "token", &token)])
}

/// Issue 32, item 5: node W holds the wrong master key and starts on a
/// fresh Consul cluster before any key exists, beside node R with the
/// right one. Once R made the first key, W can neither create a key nor
/// rotate or retire R's (FAILED_PRECONDITION naming both fingerprints),
/// nothing it tried is stored, and W does not start again, naming both
/// fingerprints in its log; R starts again and its key rotates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consul_node_with_the_wrong_master_key_cannot_manage_keys_or_restart() {
    let consul = common::consul::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let wrong_key = [0x33u8; 32];
    let env = |key: [u8; 32]| base64::engine::general_purpose::STANDARD.encode(key);
    let (right_env, wrong_env) = (env(MASTER), env(wrong_key));
    let ours = MasterKey::from_bytes(MASTER).fingerprint();
    let theirs = MasterKey::from_bytes(wrong_key).fingerprint();
    let (r_cfg, w_cfg) = (
        consul_config(dir.path(), "r", consul.addr()),
        consul_config(dir.path(), "w", consul.addr()),
    );
    let start = |cfg: &Path, key: &str| {
        ChildServer::try_start_env(cfg, &[], &[("IDGEN_HIDE_MASTER_KEY", key)])
    };
    let w = start(&w_cfg, &wrong_env).expect("no key yet: W starts");
    let r = start(&r_cfg, &right_env).expect("R starts");
    admin(&r)
        .await
        .create_hide_key(ok(proto::CreateHideKeyRequest {
            key_id: "bkey".into(),
        }))
        .await
        .expect("R makes the first key");
    let mut wa = admin(&w).await;
    let refusals = [
        wa.create_hide_key(ok(proto::CreateHideKeyRequest {
            key_id: "ckey".into(),
        }))
        .await
        .map(drop),
        wa.rotate_hide_key(ok(proto::RotateHideKeyRequest {
            key_id: "bkey".into(),
            force: false,
        }))
        .await
        .map(drop),
        wa.retire_hide_key(ok(proto::RetireHideKeyRequest {
            key_id: "bkey".into(),
        }))
        .await
        .map(drop),
    ];
    for refused in refusals {
        let e = refused.expect_err("W changes no key");
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        for part in [&ours, &theirs] {
            assert!(e.message().contains(part.as_str()), "{part}: {e:?}");
        }
    }
    let listed = admin(&r)
        .await
        .list_hide_keys(ok(proto::ListHideKeysRequest {}))
        .await
        .expect("list")
        .into_inner()
        .keys;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(states(&listed[0]), vec![(0, "active".to_owned())]);

    w.kill();
    let log = start(&w_cfg, &wrong_env)
        .err()
        .expect("W with the wrong master key does not start");
    for part in [&ours, &theirs] {
        assert!(log.contains(part.as_str()), "{part}: {log}");
    }
    r.kill();
    let r = start(&r_cfg, &right_env).expect("R starts again");
    admin(&r)
        .await
        .rotate_hide_key(ok(proto::RotateHideKeyRequest {
            key_id: "bkey".into(),
            force: false,
        }))
        .await
        .expect("R rotates");
    r.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_rotates_on_consul_make_distinct_versions_and_one_active() {
    let consul = common::consul::test_consul().await;
    let (keys, _) = consul_keys(&consul);
    keys.create("orders").await.expect("create");
    // Eight admins on eight clients rotate at once, three rounds.
    let mut won = Vec::new();
    for _ in 0..3 {
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (k, _) = consul_keys(&consul);
            tasks.push(tokio::spawn(async move { k.rotate("orders").await }));
        }
        for t in tasks {
            match t.await.expect("task") {
                Ok(info) => won.push(info.active().expect("an active version")),
                Err(e) => assert!(e.to_string().contains("retry"), "{e}"),
            }
        }
    }
    let info = keys
        .list()
        .await
        .expect("list")
        .into_iter()
        .next()
        .expect("the key");
    let active: Vec<_> = info
        .versions
        .iter()
        .filter(|v| v.state == HideKeyState::Active)
        .collect();
    assert_eq!(active.len(), 1, "exactly one active: {info:?}");
    let mut distinct = won.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        won.len(),
        "two rotates got one version: {won:?}"
    );
    assert_eq!(
        info.versions.len(),
        won.len() + 1,
        "every won rotate is stored, none lost: {info:?}"
    );
    let ring = keys.ring("orders").await.expect("ring").expect("exists");
    assert_eq!(ring.keys.len(), info.versions.len(), "every version opens");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consul_node_sees_another_nodes_rotation() {
    let consul = common::consul::test_consul().await;
    let (a, _) = consul_keys(&consul);
    let (b, _) = consul_keys(&consul);
    a.create("orders").await.expect("create");
    let ring_a = HideKeyRings::load(Arc::new(a)).await.expect("a");
    let ring_b = HideKeyRings::load(Arc::new(b)).await.expect("b");
    assert_eq!(ring_b.current("orders").expect("b has it").active, Some(0));
    let mut changes = ring_b.subscribe();
    let watch = tokio::spawn(ring_b.clone().watch());
    let info = ring_a.rotate("orders", "test").await.expect("rotate");
    assert_eq!(info.active(), Some(1));
    assert_eq!(
        ring_a.current("orders").unwrap().active,
        Some(1),
        "at once here"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while ring_b.current("orders").and_then(|r| r.active) != Some(1) {
        assert!(Instant::now() < deadline, "node b never saw version 1");
        let _ = tokio::time::timeout(Duration::from_millis(500), changes.changed()).await;
    }
    assert_eq!(ring_b.current("orders").unwrap().keys.len(), 2);
    watch.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_and_restore_keep_every_hide_key_version() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), Some(&master_text()));
    let node = ChildServer::start(&cfg);
    let mut c = admin(&node).await;
    for key_id in ["orders", "users"] {
        c.create_hide_key(ok(proto::CreateHideKeyRequest {
            key_id: key_id.into(),
        }))
        .await
        .expect("create");
    }
    c.rotate_hide_key(ok(proto::RotateHideKeyRequest {
        key_id: "orders".into(),
        force: false,
    }))
    .await
    .expect("rotate");
    c.retire_hide_key(ok(proto::RetireHideKeyRequest {
        key_id: "users".into(),
    }))
    .await
    .expect("retire");
    let before = c
        .list_hide_keys(ok(proto::ListHideKeysRequest {}))
        .await
        .expect("list")
        .into_inner()
        .keys;
    let backup = dir.path().join("state.snapshot");
    let addr = format!("http://{}", node.grpc);
    let (done, out) = run_idgen_with_env(
        &["state", "backup", "--addr", &addr, backup.to_str().unwrap()],
        &[("IDGEN_ADMIN__TOKEN", TOKEN)],
    );
    assert!(done, "{out}");
    node.terminate();
    std::fs::remove_file(dir.path().join("state.redb")).unwrap();
    let (done, out) = run_idgen_with_env(
        &[
            "state",
            "restore",
            backup.to_str().unwrap(),
            "--config",
            cfg.to_str().unwrap(),
            "--skip-ahead",
            "1000",
        ],
        &[],
    );
    assert!(done, "{out}");
    let node = ChildServer::start(&cfg);
    let after = admin(&node)
        .await
        .list_hide_keys(ok(proto::ListHideKeysRequest {}))
        .await
        .expect("list")
        .into_inner()
        .keys;
    let shape = |keys: &[proto::HideKey]| -> Vec<(String, Vec<(u32, String)>)> {
        keys.iter().map(|k| (k.key_id.clone(), states(k))).collect()
    };
    assert_eq!(shape(&after), shape(&before), "every version, every state");
    assert_eq!(
        shape(&after),
        vec![
            (
                "orders".to_owned(),
                vec![(0, "retired".to_owned()), (1, "active".to_owned())]
            ),
            ("users".to_owned(), vec![(0, "retired".to_owned())]),
        ]
    );
    // The restored keys still open with the master key: rotating works.
    let r = admin(&node)
        .await
        .rotate_hide_key(ok(proto::RotateHideKeyRequest {
            key_id: "orders".into(),
            force: false,
        }))
        .await
        .expect("rotate after restore")
        .into_inner();
    assert_eq!(
        r.key.unwrap().active,
        Some(2),
        "a restored number is never reused"
    );
    node.terminate();
}
