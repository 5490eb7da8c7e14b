//! Hidden IDs end to end against the real `idgen` binary (embedded
//! store): a hidden segment tag and a hidden `{seq:N:hidden}` format keep
//! every ID unique across kill -9, restarts and a key rotation; the shown
//! values are not consecutive; an admin decodes the internal counter
//! (audit-logged), an anonymous caller never sees it; a retired key
//! refuses before anything is reserved. A format with `hide = true` and a
//! hidden lease zone do the same, and refuse to start plain afterwards.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use common::{lease_ids, write_child_config, ChildServer};
use idgen::proto::{self, admin_client::AdminClient, id_gen_client::IdGenClient, Mode};
use tonic::transport::Channel;
use tonic::Code;

const TOKEN: &str = "hidden-admin-token";
/// 32 bytes, hex: the master key the data keys are wrapped with.
const MASTER: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const ENV: [(&str, &str); 1] = [("IDGEN_HIDE_MASTER_KEY", MASTER)];

/// A request carrying the admin token.
fn admin_req<T>(msg: T) -> tonic::Request<T> {
    common::tonic_req(TOKEN, msg)
}

fn config(dir: &Path) -> PathBuf {
    let path = write_child_config(dir, true);
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(&format!(
        "[segment]\nenabled = true\n[admin]\ntoken = \"{TOKEN}\"\n\
         [[formats]]\nname = \"orders\"\ntemplate = \"ORD{{seq:8:hidden}}\"\n"
    ));
    std::fs::write(&path, text).unwrap();
    path
}

fn start(config: &Path) -> ChildServer {
    ChildServer::try_start_env(config, &[], &ENV)
        .unwrap_or_else(|log| panic!("idgen did not become ready: {log}"))
}

/// Admin `<verb>HideKey` of `key` on `node`.
async fn keys(node: &ChildServer, verb: &str, key: &str) {
    common::hide_key(node, TOKEN, verb, key).await;
}

async fn segment_ids(c: &mut IdGenClient<Channel>, n: u32) -> Result<Vec<u64>, tonic::Status> {
    Ok(c.gen_ids(proto::GenIdsRequest {
        mode: Mode::Segment as i32,
        tag: "orders".into(),
        count: n,
    })
    .await?
    .into_inner()
    .ids)
}

async fn formatted_ids(c: &mut IdGenClient<Channel>, n: u32) -> Result<Vec<String>, tonic::Status> {
    common::formatted_ids(c, "orders", n).await
}

/// ParseFormatted of `id`, as the admin or anonymously.
async fn parse(
    c: &mut IdGenClient<Channel>,
    id: &str,
    admin: bool,
) -> proto::ParseFormattedResponse {
    let msg = proto::ParseFormattedRequest {
        format: "orders".into(),
        id: id.into(),
    };
    let req = if admin {
        admin_req(msg)
    } else {
        tonic::Request::new(msg)
    };
    c.parse_formatted(req).await.expect("parse").into_inner()
}

/// Takes a batch of each kind into the sets, failing on any repeat.
async fn issue(
    node: &ChildServer,
    seg: &mut Vec<u64>,
    fmt: &mut Vec<String>,
    seen_seg: &mut HashSet<u64>,
    seen_fmt: &mut HashSet<String>,
) {
    let mut c = node.client().await;
    for id in segment_ids(&mut c, 500).await.expect("segment GenIds") {
        assert!(seen_seg.insert(id), "segment ID {id} repeated");
        seg.push(id);
    }
    for id in formatted_ids(&mut c, 500).await.expect("GenFormatted") {
        assert!(seen_fmt.insert(id.clone()), "formatted ID {id} repeated");
        fmt.push(id);
    }
}

/// Shown IDs one apart: a plain counter gives all of them.
fn consecutive_pairs(ids: &[u64]) -> usize {
    ids.windows(2).filter(|w| w[1] == w[0] + 1).count()
}

#[tokio::test]
async fn hidden_tag_and_format_never_repeat_across_kill_9_and_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let node = start(&config);
    keys(&node, "create", "orders").await;
    let mut admin = AdminClient::connect(format!("http://{}", node.grpc))
        .await
        .unwrap();
    admin
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
        .expect("create hidden tag");
    let (mut seg, mut fmt) = (Vec::new(), Vec::new());
    let (mut seen_seg, mut seen_fmt) = (HashSet::new(), HashSet::new());
    issue(&node, &mut seg, &mut fmt, &mut seen_seg, &mut seen_fmt).await;
    // Volume hidden: a plain tag would give 499 consecutive pairs.
    assert!(consecutive_pairs(&seg) < 5, "segment IDs look consecutive");
    let shown: Vec<u64> = fmt.iter().map(|s| s[3..].parse().unwrap()).collect();
    assert!(
        consecutive_pairs(&shown) < 5,
        "formatted IDs look consecutive"
    );
    // Every shown ID is the right width: version digit 0, 7 permuted.
    assert!(fmt.iter().all(|s| s.len() == 11 && s.starts_with("ORD0")));
    // The admin sees the internal counter: the first batch is 0..500.
    let mut c = node.client().await;
    let mut internal = Vec::new();
    for id in &fmt {
        let p = parse(&mut c, id, true).await;
        assert_eq!(p.key_version, Some(0));
        internal.push(p.internal_seq.expect("admin sees the internal counter"));
    }
    assert_eq!(internal, (0..500).collect::<Vec<u64>>());
    // Anonymous: the shown value and the key version, never the internal.
    let anon = parse(&mut c, &fmt[7], false).await;
    assert_eq!((anon.internal_seq, anon.key_version), (None, Some(0)));
    assert_eq!(anon.seq, shown[7]);
    // Each admin decode is audit-logged (who and what), never the token.
    let log = node.log_text();
    assert!(
        log.contains("idgen::audit") && log.contains("hidden ID decoded"),
        "no audit line: {log}"
    );
    assert!(!log.contains(TOKEN), "the admin token was logged");

    // kill -9, restart, more; then rotate and more; then once more.
    node.kill();
    let node = start(&config);
    issue(&node, &mut seg, &mut fmt, &mut seen_seg, &mut seen_fmt).await;
    keys(&node, "rotate", "orders").await;
    // The ring is republished in-process at once (embedded); bounded wait
    // for the first ID of version 1.
    let mut rotated = false;
    for _ in 0..50 {
        issue(&node, &mut seg, &mut fmt, &mut seen_seg, &mut seen_fmt).await;
        if fmt.last().is_some_and(|s| s.starts_with("ORD1")) {
            rotated = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(rotated, "no ID of key version 1 after the rotation");
    node.kill();
    let node = start(&config);
    issue(&node, &mut seg, &mut fmt, &mut seen_seg, &mut seen_fmt).await;
    // Old IDs still decode (version 0) after the rotation, to their
    // counters: internal counters never repeat either.
    let mut c = node.client().await;
    let old = parse(&mut c, &fmt[3], true).await;
    assert_eq!((old.key_version, old.internal_seq), (Some(0), Some(3)));
    let mut all_internal = HashSet::new();
    for id in fmt.iter().step_by(7) {
        let p = parse(&mut c, id, true).await;
        assert!(all_internal.insert(p.internal_seq.unwrap()), "{id}");
    }
    assert!(seg.len() >= 2000 && fmt.len() >= 2000);
}

#[tokio::test]
async fn a_retired_key_refuses_and_reserves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let node = start(&config);
    let mut c = node.client().await;
    // No key yet: refused with the fix named, nothing taken.
    let err = formatted_ids(&mut c, 1).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("admin keys create orders"),
        "{}",
        err.message()
    );
    keys(&node, "create", "orders").await;
    let first = formatted_ids(&mut c, 3).await.unwrap();
    keys(&node, "retire", "orders").await;
    for _ in 0..3 {
        let err = formatted_ids(&mut c, 5).await.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
        assert!(err.message().contains("rotate"), "{}", err.message());
    }
    keys(&node, "rotate", "orders").await;
    let after = formatted_ids(&mut c, 1).await.unwrap();
    // The refused calls took nothing: the counter goes on at 3.
    let p = parse(&mut c, &after[0], true).await;
    assert_eq!((p.key_version, p.internal_seq), (Some(1), Some(3)));
    let p0 = parse(&mut c, &first[2], true).await;
    assert_eq!((p0.key_version, p0.internal_seq), (Some(0), Some(2)));
    // Old IDs of the retired version still decode; a wrong token is
    // refused rather than answered anonymously.
    let mut bad = tonic::Request::new(proto::ParseFormattedRequest {
        format: "orders".into(),
        id: first[0].clone(),
    });
    bad.metadata_mut()
        .insert("authorization", "Bearer wrong".parse().unwrap());
    let err = c.parse_formatted(bad).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
}

/// The base config plus `extra` (TOML appended).
fn config_with(dir: &Path, extra: &str) -> PathBuf {
    let path = config(dir);
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(extra);
    std::fs::write(&path, text).unwrap();
    path
}

async fn ids_of(c: &mut IdGenClient<Channel>, format: &str, n: u32) -> Vec<String> {
    common::formatted_ids(c, format, n)
        .await
        .unwrap_or_else(|e| panic!("GenFormatted {format}: {e:?}"))
}

const TICKETS: &str = "[[formats]]\nname = \"tickets\"\ntemplate = \"T{seq:9}\"\nhide = true\n";

/// `hide = true` shows `{seq:9}` as a version digit and 8 permuted digits,
/// through kill -9, a rotation and restarts, never repeating; the admin
/// reveals the counters; a restart that drops `hide` is refused.
#[tokio::test]
async fn a_format_with_hide_true_never_repeats_across_kill_9_and_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_with(dir.path(), TICKETS);
    let node = start(&config);
    keys(&node, "create", "tickets").await;
    let mut c = node.client().await;
    let mut all: Vec<String> = ids_of(&mut c, "tickets", 500).await;
    assert!(all.iter().all(|s| s.len() == 10 && s.starts_with("T0")));
    let shown: Vec<u64> = all.iter().map(|s| s[1..].parse().unwrap()).collect();
    assert!(consecutive_pairs(&shown) < 5, "tickets look consecutive");
    let p = c
        .parse_formatted(admin_req(proto::ParseFormattedRequest {
            format: "tickets".into(),
            id: all[41].clone(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((p.key_version, p.internal_seq), (Some(0), Some(41)));
    node.kill();
    let node = start(&config);
    let mut c = node.client().await;
    all.extend(ids_of(&mut c, "tickets", 500).await);
    keys(&node, "rotate", "tickets").await;
    let mut rotated = false;
    for _ in 0..50 {
        let batch = ids_of(&mut c, "tickets", 100).await;
        rotated = batch.last().is_some_and(|s| s.starts_with("T1"));
        all.extend(batch);
        if rotated {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(rotated, "no ticket of key version 1 after the rotation");
    node.kill();
    // `hide` is frozen: the same format without it does not start.
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace("hide = true\n", "")).unwrap();
    let log = ChildServer::try_start_env(&config, &[], &ENV)
        .err()
        .expect("a node that drops hide = true must not start");
    assert!(log.contains("hide"), "{log}");
    std::fs::write(&config, text).unwrap();
    let node = start(&config);
    let mut c = node.client().await;
    all.extend(ids_of(&mut c, "tickets", 500).await);
    let mut seen = HashSet::new();
    for id in &all {
        assert!(seen.insert(id), "ticket {id} repeated");
    }
    let old = c
        .parse_formatted(admin_req(proto::ParseFormattedRequest {
            format: "tickets".into(),
            id: all[7].clone(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((old.key_version, old.internal_seq), (Some(0), Some(7)));
}

const HIDDEN_ZONE: &str =
    "[lease]\nenabled = true\nzone = 5\nblock = 100\n[lease.hide]\nkey = \"tickets\"\n";

/// A hidden lease zone: refused before anything is reserved while its key
/// is missing; then IDs that keep zone 5, carry the key version and are
/// not consecutive, through kill -9 and a rotation, never repeating; a
/// node that states the zone plain refuses to start.
#[tokio::test]
async fn a_hidden_lease_zone_never_repeats_across_kill_9_and_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_with(dir.path(), HIDDEN_ZONE);
    let node = start(&config);
    let mut c = node.client().await;
    let err = lease_ids(&mut c, 3).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("admin keys create tickets"),
        "{err:?}"
    );
    keys(&node, "create", "tickets").await;
    let mut all = lease_ids(&mut c, 500).await.unwrap();
    let version = |id: u64| (id >> 52) & 0xF;
    assert!(all.iter().all(|id| id >> 56 == 5 && version(*id) == 0));
    let mut sorted = all.clone();
    sorted.sort_unstable();
    assert!(consecutive_pairs(&sorted) < 5, "lease IDs look consecutive");
    node.kill();
    let node = start(&config);
    let mut c = node.client().await;
    all.extend(lease_ids(&mut c, 500).await.unwrap());
    keys(&node, "rotate", "tickets").await;
    // Bounded wait for the rotation to reach the hider (embedded: at once).
    let mut rotated = false;
    for _ in 0..50 {
        let batch = lease_ids(&mut c, 100).await.unwrap();
        assert!(batch.iter().all(|id| id >> 56 == 5 && version(*id) <= 1));
        rotated = batch.last().is_some_and(|id| version(*id) == 1);
        all.extend(batch);
        if rotated {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(rotated, "no lease ID of key version 1 after the rotation");
    node.kill();
    // The zone is recorded hidden: stating it plain is refused.
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("[lease.hide]\nkey = \"tickets\"\n", ""),
    )
    .unwrap();
    let log = ChildServer::try_start_env(&config, &[], &ENV)
        .err()
        .expect("a plain node of a hidden zone must not start");
    assert!(log.contains("lease zone 5 is recorded as hidden"), "{log}");
    std::fs::write(&config, text).unwrap();
    let node = start(&config);
    let mut c = node.client().await;
    all.extend(lease_ids(&mut c, 500).await.unwrap());
    let mut seen = HashSet::new();
    for id in &all {
        assert!(seen.insert(*id), "lease ID {id} repeated");
    }
    assert!(seen.len() >= 1600, "{} lease IDs", seen.len());
}
