//! The admin console end to end in headless Chromium: three Consul-mode
//! nodes on the Consul test server; Debian's `chromium`, driven by
//! playwright-core (`tests/console/console.test.js`), logs in with a wrong
//! token (refused) then the right one, sees the three nodes with their
//! worker ids and each one's published status (ready, version, layout,
//! rate, Consul's check), renews a session by hand, SIGKILLs one node,
//! releases its worker id through the confirmation dialog and sees it free
//! and its status row dead; then walks the console's changes (tags, a
//! hidden tag and a refused one, a Lua format, strict steps, the released
//! filter, auto-refresh, the hide keys panel, the nodes table fitting
//! 1280 px; see `tests/console/console.test.js`). Before the page opens,
//! n1 is SIGKILLed and started again: its old session still holds its old
//! worker id, and its row must show only the new one. Last, a deleted
//! strict key is listed as a tombstone on Consul.
//!
//! Needs `node`, `/usr/bin/chromium` and `tests/console/node_modules`
//! (`scripts/setup.sh` installs all three); a missing one fails the test
//! with what to run, never skips it.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{write_cluster_config, ChildServer};
use idgen::proto::admin_client::AdminClient;
use idgen::proto::{self, GenIdsRequest, HolderKind, Mode};

const TOKEN: &str = "console-test-token";

fn console_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/console")
}

fn chromium() -> String {
    std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into())
}

/// Fails (never skips) when a tool the test needs is missing.
fn require_tools() {
    let setup =
        "run scripts/setup.sh (it installs Debian's chromium and `npm ci` in tests/console)";
    assert!(
        Path::new(&chromium()).exists(),
        "{} is missing: {setup}",
        chromium()
    );
    assert!(
        console_dir()
            .join("node_modules/playwright-core/package.json")
            .exists(),
        "tests/console/node_modules/playwright-core is missing: {setup}"
    );
    let node = Command::new("node").arg("--version").output();
    assert!(
        node.is_ok_and(|o| o.status.success()),
        "node is missing: {setup}"
    );
}

const FORMATS: &str = r#"
[[formats]]
name = "orders"
template = "{yyyy}{MM}{dd}{seq:8}"
reset = "day"

[[formats]]
name = "shops"
template = "S{param:shop:3:digits}{seq:6}"
scope_params = ["shop"]
"#;

/// A node whose session outlives a SIGKILL for 60 s (TTL), with a 2 s
/// lock-delay, every mode the console shows, and the admin token.
fn node(dir: &Path, name: &str, consul: std::net::SocketAddr) -> ChildServer {
    // Written afresh each time: a restarted node reads the same file.
    let token = format!("\"{TOKEN}\"");
    let mut set: Vec<(&str, &str, &str)> = vec![
        ("admin", "token", &token),
        ("consul", "session_ttl", "\"60s\""),
        ("lease", "enabled", "true"),
        ("lease", "block", "100"),
        ("segment", "enabled", "true"),
        ("strict", "enabled", "true"),
    ];
    if name == HIDDEN_NODE {
        // A zone's plain or hidden setting is frozen: a zone of its own.
        set.push(("lease", "zone", "1"));
    }
    let path = write_cluster_config(dir, name, consul, &set);
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(FORMATS);
    if name == HIDDEN_NODE {
        text.push_str("[lease.hide]\nkey = \"console-key\"\n");
    }
    std::fs::write(&path, text).unwrap();
    ChildServer::try_start_env(&path, &[], &[("IDGEN_HIDE_MASTER_KEY", MASTER)])
        .unwrap_or_else(|log| panic!("{name} did not become ready: {log}"))
}

/// The node whose lease zone is hidden (with `console-key`): the console
/// shows what it hides with.
const HIDDEN_NODE: &str = "n1";

/// The hide master key the nodes share (hidden tags need one).
const MASTER: &str = "202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f";

fn ok<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    r
}

/// Snowflake and lease IDs from `node` into `seen`; none repeats.
async fn issue(node: &ChildServer, seen: &mut HashSet<u64>) {
    let mut c = node.client().await;
    for mode in [Mode::Snowflake, Mode::Lease] {
        let req = GenIdsRequest {
            mode: mode as i32,
            count: 50,
            ..Default::default()
        };
        for id in c.gen_ids(req).await.unwrap().into_inner().ids {
            assert!(seen.insert(id), "{mode:?} ID {id} handed out twice");
        }
    }
}

/// Runs the browser script; its output is printed, its exit code returned.
fn run_script(env: &[(&str, String)]) -> std::process::ExitStatus {
    let mut cmd = Command::new("node");
    cmd.arg("console.test.js")
        .current_dir(console_dir())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("run node");
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        if let Some(status) = child.try_wait().expect("wait for node") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the browser script ran for over 180 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_releases_a_dead_nodes_worker_id_in_chromium() {
    require_tools();
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let names = ["n0", "n1", "n2"];
    let nodes: Vec<ChildServer> = names
        .iter()
        .map(|n| node(dir.path(), n, consul.addr()))
        .collect();
    // Before any lease ID: the hidden node's zone needs its key.
    common::hide_key(&nodes[0], TOKEN, "create", "console-key").await;
    let mut seen = HashSet::new();
    for n in &nodes {
        issue(n, &mut seen).await;
    }
    let mut admin = AdminClient::connect(format!("http://{}", nodes[0].grpc))
        .await
        .unwrap();
    admin
        .create_tag(ok(proto::CreateTagRequest {
            tag: "orders".into(),
            step: 10,
            ..Default::default()
        }))
        .await
        .unwrap();
    admin
        .set_strict_step(ok(proto::SetStrictStepRequest {
            namespace: "invoices".into(),
            step: 5,
        }))
        .await
        .unwrap();
    // A namespace with keys and no stored step (the console lists it).
    let mut c = nodes[0].client().await;
    let req = GenIdsRequest {
        mode: Mode::Strict as i32,
        tag: "nostep/k1".into(),
        count: 1,
    };
    c.gen_ids(req).await.unwrap();
    let (nodes, old_n1) = restart_n1(nodes, dir.path(), consul.addr(), &mut admin).await;
    issue(&nodes[1], &mut seen).await;
    let before = admin
        .list_holders(ok(proto::ListHoldersRequest {}))
        .await
        .unwrap()
        .into_inner()
        .holders;
    let n2_session = before
        .iter()
        .find(|h| h.instance == "n2")
        .map(|h| h.session.clone())
        .expect("n2 holds its worker id");
    assert!(consul.sessions().iter().any(|s| s.id == n2_session));
    let victim = &nodes[2];
    let status = run_script(&[
        (
            "IDGEN_CONSOLE_URL",
            format!("http://{}/admin/", nodes[0].http),
        ),
        ("IDGEN_TOKEN", TOKEN.into()),
        ("IDGEN_NODES", names.join(",")),
        ("IDGEN_KILL", format!("n2:{}", victim.child.id())),
        ("IDGEN_RENEW", "n1".into()),
        ("IDGEN_HIDE_KEY", "console-key".into()),
        ("IDGEN_HIDDEN_NODE", HIDDEN_NODE.into()),
        ("CHROMIUM", chromium()),
    ]);
    assert!(status.success(), "the browser script failed: {status}");

    // What the page showed is what Consul holds: n2's worker id is free
    // (no session), the others are alive and still issue without repeats.
    let holders = admin
        .list_holders(ok(proto::ListHoldersRequest {}))
        .await
        .unwrap()
        .into_inner()
        .holders;
    let n2_worker = holders
        .iter()
        .find(|h| h.instance == "n2" && h.kind == HolderKind::Worker as i32)
        .expect("n2's worker key");
    assert_eq!(n2_worker.state, "released", "{holders:?}");
    assert!(n2_worker.session.is_empty(), "{n2_worker:?}");
    // n1's first session may have run out meanwhile (its TTL is 60 s).
    for h in holders
        .iter()
        .filter(|h| h.instance != "n2" && !old_n1.contains(&(h.kind, h.datacenter, h.zone, h.id)))
    {
        assert_eq!(h.state, "alive", "{h:?}");
    }
    assert!(
        !consul.sessions().iter().any(|s| s.id == n2_session),
        "n2's session is gone"
    );
    for n in &nodes[..2] {
        issue(n, &mut seen).await;
    }
    strict_tombstones_are_listed(&mut admin, &nodes[0]).await;
}

/// What a holder holds: kind, datacenter, zone, id.
type Held = (i32, u64, u64, u64);

/// SIGKILLs n1 and starts it again while its first session lives on (60 s
/// TTL): the new process claims another worker id and lease token. Returns
/// the nodes and what n1's first session holds.
async fn restart_n1(
    mut nodes: Vec<ChildServer>,
    dir: &Path,
    consul: std::net::SocketAddr,
    admin: &mut AdminClient<tonic::transport::Channel>,
) -> (Vec<ChildServer>, Vec<Held>) {
    let list = admin
        .list_holders(ok(proto::ListHoldersRequest {}))
        .await
        .unwrap()
        .into_inner()
        .holders;
    let old: Vec<Held> = list
        .iter()
        .filter(|h| h.instance == "n1")
        .map(|h| (h.kind, h.datacenter, h.zone, h.id))
        .collect();
    assert!(!old.is_empty(), "{list:?}");
    nodes.remove(1).kill();
    nodes.insert(1, node(dir, "n1", consul));
    let now = admin
        .list_holders(ok(proto::ListHoldersRequest {}))
        .await
        .unwrap()
        .into_inner()
        .holders;
    let workers: Vec<&proto::Holder> = now
        .iter()
        .filter(|h| h.instance == "n1" && h.kind == HolderKind::Worker as i32 && h.state == "alive")
        .collect();
    assert_eq!(
        workers.len(),
        2,
        "old and new worker ids both held: {now:?}"
    );
    (nodes, old)
}

/// On Consul, a deleted strict key is listed as a tombstone with its last
/// value (the console shows it), and the key used again continues above.
async fn strict_tombstones_are_listed(
    admin: &mut AdminClient<tonic::transport::Channel>,
    node: &ChildServer,
) {
    let mut c = node.client().await;
    let take = || GenIdsRequest {
        mode: Mode::Strict as i32,
        tag: "invoices/a".into(),
        count: 2,
    };
    let first = c.gen_ids(take()).await.unwrap().into_inner().ids;
    admin
        .delete_strict_key(ok(proto::DeleteStrictKeyRequest {
            key: "invoices/a".into(),
        }))
        .await
        .unwrap();
    let listed = admin
        .list_strict_keys(ok(proto::ListStrictKeysRequest {
            namespace: "invoices".into(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(listed.keys.is_empty(), "{listed:?}");
    assert_eq!(
        listed
            .tombstones
            .iter()
            .map(|k| (k.key.as_str(), k.value))
            .collect::<Vec<_>>(),
        vec![("invoices/a", first[1])],
        "{listed:?}"
    );
    let again = c.gen_ids(take()).await.unwrap().into_inner().ids;
    assert!(again[0] > first[1], "{again:?} after {first:?}");
}
