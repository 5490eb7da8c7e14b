//! Hidden snowflake layouts end to end against the real `idgen` binary
//! (embedded store): `[layout] hide = "sortable" | "opaque"` keeps every
//! ID unique across kill -9, restarts and a key rotation; sortable IDs
//! keep time order across time units; switching the hiding on a state
//! file that issued IDs is refused, naming `layout.hide`; a missing or
//! retired key refuses with FAILED_PRECONDITION; DecodeId gives the
//! internal parts to an admin (audit-logged) and the public view to
//! anyone else. UUIDv7 follow the layout: sortable hides them (still
//! version 7, unique and time ordered across kill -9 and a rotation,
//! revealed to admins), opaque refuses them.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{write_child_config, ChildServer};
use idgen::proto::{self, id_gen_client::IdGenClient, Mode};
use tonic::transport::Channel;
use tonic::Code;

const TOKEN: &str = "hidden-snowflake-admin-token";
/// 32 bytes, hex: the master key the data keys are wrapped with.
const MASTER: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const ENV: [(&str, &str); 1] = [("IDGEN_HIDE_MASTER_KEY", MASTER)];
/// The hide key of the layout.
const KEY: &str = "ids";

fn admin_req<T>(msg: T) -> tonic::Request<T> {
    common::tonic_req(TOKEN, msg)
}

/// A config in `dir` with `[layout] hide = hide` (empty: plain).
fn config(dir: &Path, hide: &str) -> PathBuf {
    let path = write_child_config(dir, true);
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(&format!("[admin]\ntoken = \"{TOKEN}\"\n"));
    if !hide.is_empty() {
        text.push_str(&format!(
            "[layout]\nhide = \"{hide}\"\nhide_key = \"{KEY}\"\n"
        ));
    }
    std::fs::write(&path, text).unwrap();
    path
}

fn start(config: &Path) -> ChildServer {
    ChildServer::try_start_env(config, &[], &ENV)
        .unwrap_or_else(|log| panic!("idgen did not become ready: {log}"))
}

/// Admin `<verb>HideKey` of [`KEY`] on `node`.
async fn keys(node: &ChildServer, verb: &str) {
    common::hide_key(node, TOKEN, verb, KEY).await;
}

async fn gen_ids(c: &mut IdGenClient<Channel>, n: u32) -> Result<Vec<u64>, tonic::Status> {
    Ok(c.gen_ids(proto::GenIdsRequest {
        mode: Mode::Snowflake as i32,
        tag: String::new(),
        count: n,
    })
    .await?
    .into_inner()
    .ids)
}

async fn gen_id(c: &mut IdGenClient<Channel>) -> Result<u64, tonic::Status> {
    Ok(c.gen_id(proto::GenIdRequest {
        mode: Mode::Snowflake as i32,
        tag: String::new(),
    })
    .await?
    .into_inner()
    .id)
}

/// DecodeId of `id`, as the admin or anonymously.
async fn decode(c: &mut IdGenClient<Channel>, id: u64, admin: bool) -> proto::DecodeIdResponse {
    let msg = proto::DecodeIdRequest {
        id,
        mode: Mode::Snowflake as i32,
        tag: String::new(),
    };
    let req = if admin {
        admin_req(msg)
    } else {
        tonic::Request::new(msg)
    };
    c.decode_id(req).await.expect("DecodeId").into_inner()
}

/// Shown IDs one apart: plain snowflakes of one batch give nearly all.
fn consecutive_pairs(ids: &[u64]) -> usize {
    ids.windows(2).filter(|w| w[1] == w[0] + 1).count()
}

/// Bits below the time field of the twitter layout the tests run.
const NODE_BITS: u32 = 22;

/// A few batches and single IDs, each call a time unit or more after the
/// last; every ID must be new. For sortable, the time field stays in
/// clear: no call's IDs lie in an earlier time unit than the previous
/// call's (after a restart the node may borrow units ahead, so two calls
/// can share a unit, whose IDs are permuted among themselves).
async fn issue(node: &ChildServer, sortable: bool, seen: &mut HashSet<u64>, all: &mut Vec<u64>) {
    let mut c = node.client().await;
    let mut last_unit = 0;
    let mut units_seen = HashSet::new();
    for _ in 0..4 {
        let mut ids = gen_ids(&mut c, 400).await.expect("GenIds");
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "a batch is increasing");
        assert!(consecutive_pairs(&ids) < 5, "hidden IDs look consecutive");
        ids.push(gen_id(&mut c).await.expect("GenId"));
        if sortable {
            let min = ids.iter().map(|id| id >> NODE_BITS).min().unwrap_or(0);
            assert!(
                min >= last_unit,
                "sortable IDs went back in time: {min} < {last_unit}"
            );
            last_unit = ids.iter().map(|id| id >> NODE_BITS).max().unwrap_or(0);
        }
        for id in ids {
            units_seen.insert(id >> NODE_BITS);
            assert!(seen.insert(id), "ID {id} repeated");
            all.push(id);
        }
        // Past the time unit (1 ms), so the next call is a later unit.
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    if !sortable {
        // Opaque hides the time: the top bits are spread, not one unit.
        assert!(units_seen.len() > 100, "opaque IDs share their top bits");
    }
}

/// The key version `id` was shown with (the admin view knows it for both
/// variants).
async fn version_of(c: &mut IdGenClient<Channel>, id: u64) -> u32 {
    decode(c, id, true)
        .await
        .key_version
        .expect("admin sees the key version")
}

async fn kill_restart_rotate(hide: &str) {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), hide);
    let sortable = hide == "sortable";
    let node = start(&config);
    keys(&node, "create").await;
    let (mut seen, mut all) = (HashSet::new(), Vec::new());
    issue(&node, sortable, &mut seen, &mut all).await;
    node.kill();
    let node = start(&config);
    issue(&node, sortable, &mut seen, &mut all).await;
    keys(&node, "rotate").await;
    let mut c = node.client().await;
    // The ring is republished in-process at once (embedded); bounded wait
    // for the first ID of version 1.
    let mut rotated = false;
    for _ in 0..50 {
        let id = gen_id(&mut c).await.expect("GenId");
        assert!(seen.insert(id), "ID {id} repeated");
        all.push(id);
        if version_of(&mut c, id).await == 1 {
            rotated = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(rotated, "{hide}: no ID of key version 1 after the rotation");
    issue(&node, sortable, &mut seen, &mut all).await;
    node.kill();
    let node = start(&config);
    issue(&node, sortable, &mut seen, &mut all).await;
    // Old IDs still decode (version 0), and the internal IDs behind a
    // sample never repeat either.
    let mut c = node.client().await;
    assert_eq!(version_of(&mut c, all[0]).await, 0);
    let mut internal = HashSet::new();
    for id in all.iter().step_by(13) {
        let d = decode(&mut c, *id, true).await;
        assert!(
            internal.insert(d.internal_id.expect("admin")),
            "{hide}: internal of {id} repeated"
        );
    }
    assert!(all.len() >= 6000, "{}", all.len());
}

#[tokio::test]
async fn hidden_snowflakes_never_repeat_across_kill_9_and_rotation() {
    kill_restart_rotate("sortable").await;
    kill_restart_rotate("opaque").await;
}

/// `n` UUIDs (GenUuids) of `node`, as 128-bit numbers.
async fn gen_uuids(c: &mut IdGenClient<Channel>, n: u32) -> Result<Vec<u128>, tonic::Status> {
    let r = c
        .gen_uuids(proto::GenUuidsRequest {
            count: n,
            with_text: false,
        })
        .await?
        .into_inner();
    Ok(r.uuids
        .chunks_exact(16)
        .map(|b| u128::from_be_bytes(b.try_into().expect("16 bytes")))
        .collect())
}

/// DecodeUuid of `u`, as the admin or anonymously.
async fn decode_uuid(
    c: &mut IdGenClient<Channel>,
    u: u128,
    admin: bool,
) -> proto::DecodeUuidResponse {
    let msg = proto::DecodeUuidRequest {
        text: String::new(),
        uuid: u.to_be_bytes().to_vec(),
    };
    let req = if admin {
        admin_req(msg)
    } else {
        tonic::Request::new(msg)
    };
    c.decode_uuid(req).await.expect("DecodeUuid").into_inner()
}

/// Four batches of hidden UUIDs from `node`: each valid version 7 and
/// variant 10, each batch increasing, none seen before, none in an
/// earlier millisecond than the previous batch's latest; every one
/// reveals (admin) to an internal UUID of worker 0 with a 24-bit counter
/// and key version `version`, and the internal positions of a batch all
/// lie above the previous batch's. Anonymous decode shows the time and
/// key version only.
async fn issue_uuids(
    node: &ChildServer,
    version: u32,
    seen: &mut HashSet<u128>,
    last: &mut (u64, u128),
) {
    let mut c = node.client().await;
    for _ in 0..4 {
        let batch = gen_uuids(&mut c, 200).await.expect("GenUuids");
        assert!(
            batch.windows(2).all(|w| w[0] < w[1]),
            "a batch is increasing"
        );
        let min_ms = batch.iter().map(|u| (u >> 80) as u64).min().unwrap_or(0);
        assert!(
            min_ms >= last.0,
            "hidden UUIDs went back in time: {min_ms} < {}",
            last.0
        );
        last.0 = batch.iter().map(|u| (u >> 80) as u64).max().unwrap_or(0);
        let mut internal = Vec::new();
        for &u in &batch {
            assert_eq!(((u >> 76) & 0xf, (u >> 62) & 0b11), (7, 0b10), "{u:032x}");
            assert!(seen.insert(u), "UUID {u:032x} repeated");
            let d = decode_uuid(&mut c, u, true).await;
            assert_eq!(
                (d.hidden.as_str(), d.key_version),
                ("sortable", Some(version))
            );
            assert!(d.counter < 1 << 24 && d.worker == 0, "{d:?}");
            let i = u128::from_str_radix(&d.internal_uuid.replace('-', ""), 16).expect("internal");
            assert_eq!(i >> 80, u >> 80, "the internal UUID has the shown time");
            internal.push(i);
        }
        let public = decode_uuid(&mut c, batch[0], false).await;
        assert_eq!(
            (
                public.hidden.as_str(),
                public.key_version,
                public.counter,
                public.internal_uuid.as_str()
            ),
            ("sortable", Some(version), 0, "")
        );
        internal.sort_unstable();
        assert!(internal[0] > last.1, "internal positions went back");
        last.1 = internal[internal.len() - 1];
    }
}

/// A sortable layout's UUIDs across kill -9, a restart and a key
/// rotation: see [`issue_uuids`]; an opaque layout refuses UUID calls
/// with FAILED_PRECONDITION naming why.
#[tokio::test]
async fn hidden_uuids_stay_v7_unique_and_time_ordered_across_kill_9_and_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let sortable = config(dir.path(), "sortable");
    let node = start(&sortable);
    keys(&node, "create").await;
    let (mut seen, mut last) = (HashSet::new(), (0, 0));
    issue_uuids(&node, 0, &mut seen, &mut last).await;
    node.kill();
    let node = start(&sortable);
    issue_uuids(&node, 0, &mut seen, &mut last).await;
    keys(&node, "rotate").await;
    // The ring is republished in-process at once (embedded); bounded wait
    // for the first UUID of version 1.
    let mut c = node.client().await;
    let mut rotated = false;
    for _ in 0..50 {
        let u = gen_uuids(&mut c, 1).await.expect("GenUuids")[0];
        assert!(seen.insert(u), "UUID {u:032x} repeated");
        if decode_uuid(&mut c, u, false).await.key_version == Some(1) {
            rotated = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(rotated, "no UUID of key version 1 after the rotation");
    issue_uuids(&node, 1, &mut seen, &mut last).await;
    node.kill();

    let dir = tempfile::tempdir().unwrap();
    let node = start(&config(dir.path(), "opaque"));
    let err = gen_uuids(&mut node.client().await, 1)
        .await
        .expect_err("opaque refuses");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("layout.hide"), "{}", err.message());
    node.kill();
}

/// Starts on `config`, expecting a refusal naming `layout.hide`.
fn refused(config: &Path) -> String {
    match ChildServer::try_start_env(config, &[], &ENV) {
        Ok(node) => {
            node.kill();
            panic!("a node whose layout.hide differs from its state file started");
        }
        Err(log) => {
            assert!(
                log.contains("layout.hide"),
                "the reason is not named: {log}"
            );
            log
        }
    }
}

#[tokio::test]
async fn switching_hide_on_a_node_with_state_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // Plain first: IDs issued, then hiding switched on.
    let plain = config(dir.path(), "");
    let node = start(&plain);
    gen_ids(&mut node.client().await, 10)
        .await
        .expect("plain IDs");
    node.kill();
    let log = refused(&config(dir.path(), "sortable"));
    assert!(log.contains("off") && log.contains("sortable"), "{log}");
    refused(&config(dir.path(), "opaque"));
    // The plain layout still starts on its state file.
    start(&config(dir.path(), "")).kill();

    // Sortable first: switching to opaque, or off, is refused too.
    let dir = tempfile::tempdir().unwrap();
    let node = start(&config(dir.path(), "sortable"));
    keys(&node, "create").await;
    gen_ids(&mut node.client().await, 10)
        .await
        .expect("hidden IDs");
    node.kill();
    refused(&config(dir.path(), "opaque"));
    refused(&config(dir.path(), ""));
    start(&config(dir.path(), "sortable")).kill();
}

#[tokio::test]
async fn a_retired_layout_key_refuses_and_decode_is_for_admins() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&config(dir.path(), "sortable"));
    let mut c = node.client().await;
    // No key yet: refused with the fix named.
    let err = gen_id(&mut c).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("admin keys create ids"),
        "{}",
        err.message()
    );
    keys(&node, "create").await;
    let first = gen_ids(&mut c, 3).await.unwrap();
    keys(&node, "retire").await;
    for _ in 0..3 {
        let err = gen_ids(&mut c, 5).await.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
        assert!(err.message().contains("rotate"), "{}", err.message());
        let err = gen_id(&mut c).await.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    }
    keys(&node, "rotate").await;
    let after = gen_id(&mut c).await.unwrap();

    // Admin: the internal parts, the key version, audit-logged.
    let admin = decode(&mut c, first[0], true).await;
    assert_eq!(
        (admin.hidden.as_str(), admin.key_version),
        ("sortable", Some(0))
    );
    let internal = admin.internal_id.expect("admin sees the internal ID");
    assert_ne!(internal, first[0]);
    assert!(!admin.time.is_empty());
    let later = decode(&mut c, after, true).await;
    assert_eq!(later.key_version, Some(1));
    assert!(
        later.internal_id.unwrap() > internal,
        "internal IDs move on"
    );
    // Anonymous: the time and key version of a sortable ID, nothing else.
    let anon = decode(&mut c, first[0], false).await;
    assert_eq!(anon.hidden, "sortable");
    assert_eq!((anon.internal_id, anon.key_version), (None, Some(0)));
    assert_eq!((anon.datacenter, anon.worker, anon.sequence), (0, 0, 0));
    assert_eq!(
        anon.unix_millis, admin.unix_millis,
        "sortable shows the time"
    );
    let log = node.log_text();
    assert!(
        log.contains("idgen::audit") && log.contains("hidden snowflake ID decoded"),
        "no audit line: {log}"
    );
    assert!(!log.contains(TOKEN), "the admin token was logged");
    // A wrong token is refused, not answered anonymously.
    let mut bad = tonic::Request::new(proto::DecodeIdRequest {
        id: first[0],
        mode: Mode::Snowflake as i32,
        tag: String::new(),
    });
    bad.metadata_mut()
        .insert("authorization", "Bearer wrong".parse().unwrap());
    assert_eq!(
        c.decode_id(bad).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    node.kill();

    // Opaque: an anonymous caller learns nothing but that it is hidden.
    let dir = tempfile::tempdir().unwrap();
    let node = start(&config(dir.path(), "opaque"));
    keys(&node, "create").await;
    let mut c = node.client().await;
    let id = gen_id(&mut c).await.unwrap();
    let anon = decode(&mut c, id, false).await;
    assert_eq!(anon.hidden, "opaque");
    assert_eq!(
        (anon.time.as_str(), anon.unix_millis, anon.key_version),
        ("", 0, None)
    );
    assert_eq!(
        (
            anon.datacenter,
            anon.worker,
            anon.sequence,
            anon.internal_id
        ),
        (0, 0, 0, None)
    );
    let admin = decode(&mut c, id, true).await;
    assert!(admin.internal_id.is_some() && admin.unix_millis > 0);
    node.kill();
}
