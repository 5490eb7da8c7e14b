//! Hidden IDs on two real `idgen` nodes sharing the Consul test server: a
//! hidden segment tag, a `{seq:N:hidden}` format, a `hide = true` format
//! and a hidden lease zone, called concurrently on both nodes; keys created
//! and rotated through node A are used by node B once its key watch has
//! seen the change; node A is killed with SIGKILL and restarted while B
//! serves. No ID repeats across all of it, and IDs either node showed
//! (before and after the rotation) still reveal through the other node's
//! ParseFormatted for an admin.

mod common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{write_cluster_config, ChildServer};
use idgen::proto::{self, admin_client::AdminClient, id_gen_client::IdGenClient, Mode};
use tonic::Status;

const TOKEN: &str = "hidden-consul-admin-token";
/// 32 bytes, hex: the master key both nodes seal and open data keys with.
const MASTER: &str = "202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f";
const ENV: [(&str, &str); 1] = [("IDGEN_HIDE_MASTER_KEY", MASTER)];
/// The hidden lease zone.
const ZONE: u64 = 9;
/// How long node B may take to use a key created or rotated through node
/// A: its key watch is a Consul blocking query that returns on the change
/// and re-queries at most `WATCH_GAP` (500 ms) later, so a second or two
/// on a quiet machine; the bound is generous for a loaded one.
const KEY_PROPAGATION: Duration = Duration::from_secs(30);

fn admin_req<T>(msg: T) -> tonic::Request<T> {
    common::tonic_req(TOKEN, msg)
}

fn node_config(dir: &Path, name: &str, consul: SocketAddr) -> PathBuf {
    let token = format!("\"{TOKEN}\"");
    let zone = ZONE.to_string();
    let path = write_cluster_config(
        dir,
        name,
        consul,
        &[
            ("admin", "token", &token),
            ("segment", "enabled", "true"),
            ("lease", "enabled", "true"),
            ("lease", "zone", &zone),
            ("lease", "block", "100"),
        ],
    );
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(
        "[lease.hide]\nkey = \"tickets\"\n\
         [[formats]]\nname = \"orders\"\ntemplate = \"ORD{seq:8:hidden}\"\n\
         [[formats]]\nname = \"tickets\"\ntemplate = \"T{seq:9}\"\nhide = true\n",
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn start(config: &Path) -> ChildServer {
    ChildServer::try_start_env(config, &[], &ENV)
        .unwrap_or_else(|log| panic!("idgen did not become ready: {log}"))
}

async fn admin(node: SocketAddr) -> AdminClient<tonic::transport::Channel> {
    AdminClient::connect(format!("http://{node}"))
        .await
        .unwrap()
}

async fn client(node: SocketAddr) -> IdGenClient<tonic::transport::Channel> {
    IdGenClient::connect(format!("http://{node}"))
        .await
        .unwrap()
}

/// Admin create or rotate of hide key `key` through `node`.
async fn key(node: SocketAddr, verb: &str, key: &str) {
    let mut a = admin(node).await;
    let key_id = key.to_owned();
    let done = match verb {
        "create" => a
            .create_hide_key(admin_req(proto::CreateHideKeyRequest { key_id }))
            .await
            .map(drop),
        _ => a
            .rotate_hide_key(admin_req(proto::RotateHideKeyRequest {
                key_id,
                force: false,
            }))
            .await
            .map(drop),
    };
    done.unwrap_or_else(|e| panic!("{verb} hide key {key}: {e:?}"));
}

/// IDs of every hidden namespace from one node.
#[derive(Default, Debug)]
struct Batch {
    segment: Vec<u64>,
    lease: Vec<u64>,
    orders: Vec<String>,
    tickets: Vec<String>,
}

async fn formatted(
    c: &mut IdGenClient<tonic::transport::Channel>,
    format: &str,
    count: u32,
) -> Result<Vec<String>, Status> {
    let r = c
        .gen_formatted(proto::GenFormattedRequest {
            format: format.into(),
            params: Default::default(),
            count,
        })
        .await?;
    Ok(r.into_inner().ids)
}

async fn numeric(
    c: &mut IdGenClient<tonic::transport::Channel>,
    mode: Mode,
    count: u32,
) -> Result<Vec<u64>, Status> {
    let tag = if mode == Mode::Segment { "orders" } else { "" };
    let r = c
        .gen_ids(proto::GenIdsRequest {
            mode: mode as i32,
            tag: tag.into(),
            count,
        })
        .await?;
    Ok(r.into_inner().ids)
}

/// `rounds` batches of `count` of each namespace from `node`.
async fn issue(node: SocketAddr, rounds: usize, count: u32) -> Result<Batch, Status> {
    let mut c = client(node).await;
    let mut b = Batch::default();
    for _ in 0..rounds {
        b.segment
            .extend(numeric(&mut c, Mode::Segment, count).await?);
        b.lease.extend(numeric(&mut c, Mode::Lease, count).await?);
        b.orders.extend(formatted(&mut c, "orders", count).await?);
        b.tickets.extend(formatted(&mut c, "tickets", count).await?);
    }
    Ok(b)
}

/// Rounds on both nodes at once.
async fn both(a: SocketAddr, b: SocketAddr, rounds: usize) -> (Batch, Batch) {
    let ta = tokio::spawn(issue(a, rounds, 100));
    let tb = tokio::spawn(issue(b, rounds, 100));
    let (ra, rb) = (ta.await.unwrap(), tb.await.unwrap());
    (ra.expect("node A issues"), rb.expect("node B issues"))
}

/// Every ID seen, failing on the first repeat.
#[derive(Default)]
struct Seen {
    segment: HashSet<u64>,
    lease: HashSet<u64>,
    orders: HashSet<String>,
    tickets: HashSet<String>,
}

impl Seen {
    fn add(&mut self, b: &Batch) {
        for id in &b.segment {
            assert!(self.segment.insert(*id), "segment ID {id} repeated");
        }
        for id in &b.lease {
            assert!(self.lease.insert(*id), "lease ID {id} repeated");
            assert_eq!(id >> 56, ZONE, "lease ID {id} left its zone");
        }
        for id in &b.orders {
            assert!(self.orders.insert(id.clone()), "orders ID {id} repeated");
        }
        for id in &b.tickets {
            assert!(self.tickets.insert(id.clone()), "ticket {id} repeated");
        }
    }
}

/// Key versions of a batch: segment (top 4 of 44 bits), lease (4 bits
/// under the zone), orders and tickets (the first digit).
fn versions(b: &Batch) -> [HashSet<u64>; 4] {
    let digit = |s: &str, at: usize| u64::from(s.as_bytes()[at] - b'0');
    [
        b.segment.iter().map(|id| id >> 40).collect(),
        b.lease.iter().map(|id| (id >> 52) & 0xF).collect(),
        b.orders.iter().map(|s| digit(s, 3)).collect(),
        b.tickets.iter().map(|s| digit(s, 1)).collect(),
    ]
}

/// Polls `node` (bounded by [`KEY_PROPAGATION`]) until one batch of every
/// namespace comes out under key version `want`, keeping every ID issued
/// meanwhile in `seen`.
async fn until_version(node: SocketAddr, want: u64, seen: &mut Seen) {
    let deadline = tokio::time::Instant::now() + KEY_PROPAGATION;
    let mut last = String::new();
    while tokio::time::Instant::now() < deadline {
        match issue(node, 1, 5).await {
            Ok(b) => {
                seen.add(&b);
                let v = versions(&b);
                if v.iter().all(|s| s.len() == 1 && s.contains(&want)) {
                    return;
                }
                last = format!("{v:?}");
            }
            // Before the key reaches it: refused, nothing reserved.
            Err(e) if e.code() == tonic::Code::FailedPrecondition => last = e.to_string(),
            Err(e) => panic!("unexpected failure on {node}: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{node} did not issue under key version {want} within {KEY_PROPAGATION:?}: {last}");
}

/// ParseFormatted of `id` of `format` through `node` as the admin: the
/// key version and the internal counter.
async fn reveal(node: SocketAddr, format: &str, id: &str) -> (Option<u32>, Option<u64>) {
    let r = client(node)
        .await
        .parse_formatted(admin_req(proto::ParseFormattedRequest {
            format: format.into(),
            id: id.into(),
        }))
        .await
        .unwrap_or_else(|e| panic!("parse {format} {id} on {node}: {e:?}"))
        .into_inner();
    (r.key_version, r.internal_seq)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consul_nodes_share_hidden_namespaces_through_rotation_and_kill_9() {
    let consul = common::consul::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let (a_config, b_config) = (
        node_config(dir.path(), "a", consul.addr()),
        node_config(dir.path(), "b", consul.addr()),
    );
    let a = start(&a_config);
    let b = start(&b_config);
    key(a.grpc, "create", "orders").await;
    key(a.grpc, "create", "tickets").await;
    admin(a.grpc)
        .await
        .create_tag(admin_req(proto::CreateTagRequest {
            tag: "orders".into(),
            step: 100,
            hide: Some(proto::TagHide {
                key: "orders".into(),
                version_bits: 4,
                domain_bits: 40,
            }),
            ..Default::default()
        }))
        .await
        .expect("create the hidden tag");
    let mut seen = Seen::default();
    // B learns the keys A created through its watch.
    until_version(b.grpc, 0, &mut seen).await;
    let (from_a, from_b) = both(a.grpc, b.grpc, 4).await;
    seen.add(&from_a);
    seen.add(&from_b);
    let before_rotation = (from_a.orders[10].clone(), from_b.tickets[20].clone());

    // Rotate through A; B uses the new versions after its watch refresh.
    key(a.grpc, "rotate", "orders").await;
    key(a.grpc, "rotate", "tickets").await;
    until_version(b.grpc, 1, &mut seen).await;
    until_version(a.grpc, 1, &mut seen).await;

    // kill -9 A mid-run: B goes on alone; A comes back above everything.
    a.kill();
    seen.add(
        &issue(b.grpc, 3, 50)
            .await
            .expect("B serves while A is down"),
    );
    let a = start(&a_config);
    let (from_a, from_b) = both(a.grpc, b.grpc, 4).await;
    seen.add(&from_a);
    seen.add(&from_b);
    for batch in [&from_a, &from_b] {
        let v = versions(batch);
        assert!(v.iter().all(|s| s == &HashSet::from([1])), "{v:?}");
    }

    // Old IDs reveal on the other node: A's on B, B's on A.
    let (v, orders_internal) = reveal(b.grpc, "orders", &before_rotation.0).await;
    assert_eq!(v, Some(0));
    let (v, tickets_internal) = reveal(a.grpc, "tickets", &before_rotation.1).await;
    assert_eq!(v, Some(0));
    let (v, _) = reveal(a.grpc, "orders", &from_b.orders[0]).await;
    assert_eq!(v, Some(1));
    // Internal counters never repeat either (a sample across the run).
    assert!(orders_internal.is_some());
    let mut internal = HashSet::new();
    for id in seen.orders.iter().step_by(23) {
        let (_, i) = reveal(b.grpc, "orders", id).await;
        assert!(internal.insert(i.expect("admin sees the counter")), "{id}");
    }
    assert!(tickets_internal.is_some());
    assert!(seen.segment.len() >= 1500 && seen.lease.len() >= 1500);
    assert!(seen.orders.len() >= 1500 && seen.tickets.len() >= 1500);
}

/// A rotation through one node is refused when another node's hidden
/// lease zone, set only in that node's config file, cannot hold the new
/// version: the zone's node publishes it in its status record, and the
/// refusal names the zone, the node and `--force`; `force` rotates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_past_another_nodes_hidden_lease_zone_is_refused_unless_forced() {
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let token = format!("\"{TOKEN}\"");
    let zone = ZONE.to_string();
    // Node A: a hidden lease zone on key `narrow` with one version bit
    // (versions 0 and 1). Node B: no hidden namespace of its own.
    let a_path = write_cluster_config(
        dir.path(),
        "a",
        consul.addr(),
        &[
            ("admin", "token", &token),
            ("lease", "enabled", "true"),
            ("lease", "zone", &zone),
            ("lease", "block", "100"),
        ],
    );
    let mut text = std::fs::read_to_string(&a_path).unwrap();
    text.push_str("[lease.hide]\nkey = \"narrow\"\nversion_bits = 1\n");
    std::fs::write(&a_path, text).unwrap();
    let b_path = write_cluster_config(
        dir.path(),
        "b",
        consul.addr(),
        &[("admin", "token", &token)],
    );
    let a = start(&a_path);
    let b = start(&b_path);
    common::hide_key(&b, TOKEN, "create", "narrow").await;
    // A's record names its zone (written at start, then every 5 s).
    let mut published = false;
    for _ in 0..300 {
        let view = common::admin_json(b.http, "/admin/api/cluster", TOKEN).await;
        published = view["nodes"].as_array().is_some_and(|rows| {
            rows.iter().any(|r| {
                r["hides"].as_array().is_some_and(|h| {
                    h.iter().any(|u| {
                        u["key"] == "narrow" && u["namespace"] == format!("lease zone {ZONE}")
                    })
                })
            })
        });
        if published {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(published, "node A never published its hidden lease zone");
    let rotate = async |force: bool| {
        admin(b.grpc)
            .await
            .rotate_hide_key(admin_req(proto::RotateHideKeyRequest {
                key_id: "narrow".into(),
                force,
            }))
            .await
            .map(|r| r.into_inner().key.and_then(|k| k.active))
    };
    assert_eq!(
        rotate(false).await.unwrap(),
        Some(1),
        "version 1 fits one bit"
    );
    let err = rotate(false).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    for part in [
        "version 2",
        &format!("lease zone {ZONE} of node "),
        "versions 0 to 1",
        "--force",
    ] {
        assert!(err.message().contains(part), "{part:?}: {}", err.message());
    }
    // Node A issues under version 1 once its key watch has seen it (the
    // version bit sits just under the zone's 8 bits).
    let mut c = client(a.grpc).await;
    let deadline = std::time::Instant::now() + KEY_PROPAGATION;
    loop {
        // Refused until A's key watch has seen the key at all.
        let ids = numeric(&mut c, Mode::Lease, 3).await;
        if ids
            .as_ref()
            .is_ok_and(|ids| ids.iter().all(|id| (id >> 55) & 1 == 1))
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "node A never used version 1: {ids:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Forced: version 2, which zone A cannot show, so its calls are
    // refused (rule 19) instead of issuing under a version it cannot hold.
    assert_eq!(rotate(true).await.unwrap(), Some(2), "force rotates");
    let deadline = std::time::Instant::now() + KEY_PROPAGATION;
    let refused = loop {
        match numeric(&mut c, Mode::Lease, 3).await {
            Err(e) => break e,
            Ok(ids) => assert!(
                std::time::Instant::now() < deadline,
                "zone A went on issuing after version 2: {ids:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    drop((a, b));
}
