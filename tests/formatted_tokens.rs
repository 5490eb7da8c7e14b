//! Formatted mode's leased tokens and restarts on Consul: `{token:N:..}`
//! and `uniq64` render a token leased like lease mode's (locked under the
//! worker session in Consul, a disjoint slice per node on the embedded
//! store), their counters are kept per token so a token that passes to
//! another node continues above its last holder, a full token space is
//! RESOURCE_EXHAUSTED naming the format; and on the Consul backend,
//! restarts before and after midnight (manual clock) and kill -9 under
//! load then restart never repeat an ID.

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{test_config, write_cluster_config, ChildServer};
use idgen::config::{Config, FormattedSettings, Overrides};
use idgen::id::format::{FormatDef, PresetName, Reset};
use idgen::id::{Clock, ErrorKind, ManualClock, SystemClock};
use idgen::proto::admin_client::AdminClient;
use idgen::proto::{self, GenFormattedRequest, GetFormatCounterRequest, HolderKind};
use idgen::store::kv_paths::ClusterPaths;

use common::{start_node as start, Running};

impl Running {
    async fn gen(&self, name: &str, count: u64) -> Vec<String> {
        self.try_gen(name, count)
            .await
            .unwrap_or_else(|e| panic!("gen {name}: {e}"))
    }

    async fn try_gen(&self, name: &str, count: u64) -> Result<Vec<String>, idgen::error::Error> {
        let issued = self.issuer.gen_formatted(name, &[], count).await?;
        Ok(issued.ids.into_iter().map(|r| r.text).collect())
    }

    /// The token this node holds for format `name`, as IDs render it.
    async fn token(&self, name: &str) -> String {
        self.issuer
            .format_counter(name, &[], None)
            .await
            .expect("counter")
            .expect("counter used")
            .token
            .expect("a token format")
    }
}

fn ms(rfc3339: &str) -> u64 {
    rfc3339.parse::<jiff::Timestamp>().unwrap().as_millisecond() as u64
}

/// Adds `ids` to `seen`, failing on any repeat.
fn all_new(seen: &mut HashSet<String>, ids: &[String]) {
    for id in ids {
        assert!(seen.insert(id.clone()), "{id} handed out twice");
    }
}

/// The counter part of `id` (its last `width` characters).
fn seq(id: &str, width: usize) -> u64 {
    id[id.len() - width..].parse().unwrap()
}

/// `{yyyy}{MM}{dd}{token:2:alnum}{seq:6}`: the token is at 8..10.
fn token_of(id: &str) -> &str {
    &id[8..10]
}

const TOKEN_FORMATS: &str = r#"
[[formats]]
name = "tok"
template = "{yyyy}{MM}{dd}{token:2:alnum}{seq:6}"
reset = "day"

[[formats]]
name = "u64"
preset = "uniq64"
"#;

/// `count` IDs of format `tok`.
fn tok_request(count: u32) -> GenFormattedRequest {
    GenFormattedRequest {
        format: "tok".into(),
        params: Default::default(),
        count,
    }
}

/// A cluster config file for node `name` with `formats` appended.
fn cluster_file(
    dir: &Path,
    name: &str,
    consul: std::net::SocketAddr,
    set: &[(&str, &str, &str)],
    formats: &str,
) -> std::path::PathBuf {
    let path = write_cluster_config(dir, name, consul, set);
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(formats);
    std::fs::write(&path, text).unwrap();
    path
}

fn load(path: &Path) -> Config {
    Config::load(Some(path), &Overrides::default(), SystemClock.now_millis())
        .expect("cluster config")
}

/// Waits (bounded) until the token rendered `rendered` of `space` is no
/// longer locked, then out the test cluster's 2 s lock-delay.
async fn wait_until_free(consul: &consul_testserver::TestConsul, space: &str, rendered: &str) {
    let number = u64::from_str_radix(rendered, 36).expect("an alnum token");
    let key = ClusterPaths::new("idgen", "test").format_token_dir(space) + &number.to_string();
    let mut freed = false;
    for _ in 0..150 {
        if consul.kv_get(&key).is_some_and(|e| e.session.is_none()) {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(freed, "the killed node's token {space}/{rendered} is freed");
    tokio::time::sleep(Duration::from_millis(2_500)).await;
}

/// Holds every token of space `space` under a session of the test's own,
/// as other nodes would; returns the session.
async fn squat(consul: std::net::SocketAddr, space: &str, tokens: std::ops::Range<u64>) -> String {
    let http = reqwest::Client::new();
    let session: serde_json::Value = http
        .put(format!("http://{consul}/v1/session/create"))
        .body(r#"{"Name":"squatter","Behavior":"release","LockDelay":"0s"}"#)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = session["ID"].as_str().expect("session id").to_owned();
    let dir = ClusterPaths::new("idgen", "test").format_token_dir(space);
    for t in tokens {
        let ok: bool = http
            .put(format!("http://{consul}/v1/kv/{dir}{t}?acquire={id}"))
            .body(r#"{"instance":"squatter","address":"","since_ms":0,"reserved":0}"#)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(ok, "token {t} acquired");
    }
    id
}

/// Releases the token lock `key` held by `session`, as `instance` would
/// (the value a holder writes); whether Consul applied it.
async fn release_token(
    consul: std::net::SocketAddr,
    key: &str,
    session: &str,
    instance: &str,
) -> bool {
    reqwest::Client::new()
        .put(format!("http://{consul}/v1/kv/{key}?release={session}"))
        .body(format!(
            r#"{{"instance":"{instance}","address":"","since_ms":0,"reserved":0}}"#
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Three nodes on the Consul test server: each holds its own token of each
/// space, `{token}` and `uniq64` IDs never repeat across nodes, and a space
/// whose every token is held answers RESOURCE_EXHAUSTED naming the format
/// until one is freed, which the next call then takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_consul_nodes_hold_distinct_tokens_and_never_repeat() {
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let squatter = squat(consul.addr(), "digits-1", 0..10).await;
    let formats = format!(
        "{TOKEN_FORMATS}
[[formats]]
name = \"one\"
template = \"{{yyyy}}{{MM}}{{dd}}{{token:1:digits}}{{seq:4}}\"
reset = \"day\"
"
    );
    let mut nodes = Vec::new();
    for i in 0..3 {
        let set = [("formatted", "block", "7")];
        let path = cluster_file(dir.path(), &format!("n{i}"), consul.addr(), &set, &formats);
        nodes.push(start(load(&path), Arc::new(SystemClock)).await);
    }
    // Every token of `one` is held elsewhere.
    let e = nodes[0].try_gen("one", 1).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Exhausted, "{e}");
    assert!(
        e.to_string().contains("\"one\"") && e.to_string().contains("digits-1"),
        "{e}"
    );
    let nodes = Arc::new(nodes);
    let mut tasks = Vec::new();
    for caller in 0..6 {
        let nodes = Arc::clone(&nodes);
        tasks.push(tokio::spawn(async move {
            let node = &nodes[caller % 3];
            let mut got = Vec::new();
            for j in 0..20 {
                let name = if j % 2 == 0 { "tok" } else { "u64" };
                got.extend(node.gen(name, 1 + (j % 4) as u64).await);
            }
            got
        }));
    }
    let mut seen = HashSet::new();
    let mut total = 0;
    for t in tasks {
        let ids = t.await.unwrap();
        total += ids.len();
        all_new(&mut seen, &ids);
    }
    assert!(total >= 200, "{total}");
    let mut tokens = HashSet::new();
    let mut u64_tokens = HashSet::new();
    for n in nodes.iter() {
        let t = n.token("tok").await;
        let mine = n.gen("tok", 3).await;
        assert!(mine.iter().all(|id| token_of(id) == t), "{t}: {mine:?}");
        all_new(&mut seen, &mine);
        assert!(tokens.insert(t.clone()), "token {t} held by two nodes");
        assert!(
            u64_tokens.insert(n.token("u64").await),
            "uniq64 token shared"
        );
    }

    // One token of `one` freed: the next call takes it.
    let key = ClusterPaths::new("idgen", "test").format_token_dir("digits-1") + "3";
    assert!(release_token(consul.addr(), &key, &squatter, "squatter").await);
    let one = nodes[1].gen("one", 2).await;
    assert!(one.iter().all(|id| &id[8..9] == "3"), "{one:?}");
    assert_eq!(nodes[1].token("one").await, "3");
    let e = nodes[2].try_gen("one", 1).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Exhausted, "{e}");

    let nodes = Arc::into_inner(nodes).expect("callers done");
    for n in nodes {
        n.stop().await;
    }
    // A clean stop gives the tokens back.
    let dir = ClusterPaths::new("idgen", "test").format_token_dir("alnum-2");
    for t in 0..3 {
        let entry = consul.kv_get(&format!("{dir}{t}")).expect("token record");
        assert_eq!(entry.session, None, "token {t} released at shutdown");
    }
}

/// Embedded nodes with distinct worker ids take disjoint tokens from
/// their own slices, so their IDs never collide; a worker id with no token
/// in a small space gets RESOURCE_EXHAUSTED naming the format.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_nodes_get_disjoint_tokens() {
    let defs = vec![
        FormatDef::template(
            "tok",
            "{yyyy}{MM}{dd}{token:2:alnum}{seq:6}",
            "UTC",
            Reset::Day,
        ),
        FormatDef::template(
            "dig",
            "{yyyy}{MM}{dd}{token:2:digits}{seq:4}",
            "UTC",
            Reset::Day,
        ),
        FormatDef {
            template: None,
            preset: Some(PresetName::Uniq64),
            reset: None,
            ..FormatDef::template("u64", "", "UTC", Reset::Day)
        },
    ];
    let clock = Arc::new(ManualClock::at_millis(ms("2026-06-15T01:30:00Z")));
    let mut seen = HashSet::new();
    let mut u64_tokens = Vec::new();
    let mut dirs = Vec::new();
    // Node index 200 is datacenter 6, worker 8 (5 + 5 bits).
    for (datacenter, worker) in [(0u64, 0u64), (0, 1), (0, 2), (6, 8)] {
        let dir = tempfile::tempdir().unwrap();
        let mut config = test_config(dir.path());
        config.node.datacenter_id = datacenter;
        config.node.worker_id = worker;
        config.formatted = FormattedSettings {
            block: 50,
            formats: defs.clone(),
            ..FormattedSettings::default()
        };
        let node = start(config, clock.clone()).await;
        let tok = node.gen("tok", 20).await;
        all_new(&mut seen, &tok);
        assert_eq!(node.token("tok").await, token_of(&tok[0]));
        if datacenter == 6 {
            // 1,024 node indexes share 100 two-digit tokens: none for 200.
            let e = node.try_gen("dig", 1).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Exhausted, "{e}");
            assert!(e.to_string().contains("\"dig\""), "{e}");
            assert_eq!(token_of(&tok[0]), "5K", "alnum: token 200");
        } else {
            let dig = node.gen("dig", 20).await;
            assert!(
                dig.iter().all(|id| id[8..10] == format!("{worker:02}")),
                "{dig:?}"
            );
            all_new(&mut seen, &dig);
        }
        let u = node.issuer.gen_formatted("u64", &[], 20).await.unwrap();
        let parsed = node
            .issuer
            .parse_formatted("u64", &u.ids[0].text)
            .await
            .unwrap();
        u64_tokens.push(parsed.token.expect("uniq64 token"));
        all_new(
            &mut seen,
            &u.ids.into_iter().map(|r| r.text).collect::<Vec<_>>(),
        );
        node.stop().await;
        dirs.push(dir);
    }
    // uniq64: 4,096 tokens, 4 per node index.
    assert_eq!(u64_tokens, [0, 4, 8, 800]);
}

/// A node killed with SIGKILL while holding a token: once its session is
/// gone and the lock-delay has passed, another node (another worker id)
/// takes the token and continues above the dead node's counter in the same
/// day, never from the minimum. ListHolders and GetFormatCounter show the
/// token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_taken_over_from_a_killed_node_continues_above_its_counter() {
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let admin_token = "\"s3cret-admin-token\"";
    let set = [("formatted", "block", "5"), ("admin", "token", admin_token)];
    let first = ChildServer::start(&cluster_file(
        dir.path(),
        "first",
        consul.addr(),
        &set,
        TOKEN_FORMATS,
    ));
    let req = tok_request;
    let mut seen = HashSet::new();
    let mut c = first.client().await;
    let mut before = Vec::new();
    for _ in 0..4 {
        before.extend(c.gen_formatted(req(3)).await.unwrap().into_inner().ids);
    }
    all_new(&mut seen, &before);
    let token = token_of(&before[0]).to_owned();
    assert!(before.iter().all(|id| token_of(id) == token), "{before:?}");
    let counter = c
        .get_format_counter(GetFormatCounterRequest {
            format: "tok".into(),
            params: Default::default(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(counter.token, token);
    let mut admin = AdminClient::connect(format!("http://{}", first.grpc))
        .await
        .unwrap();
    let mut list = tonic::Request::new(proto::ListHoldersRequest {});
    list.metadata_mut().insert(
        "authorization",
        "Bearer s3cret-admin-token".parse().unwrap(),
    );
    let holders = admin.list_holders(list).await.unwrap().into_inner().holders;
    let held = holders
        .iter()
        .find(|h| h.kind == HolderKind::FormatToken as i32 && h.space == "alnum-2")
        .expect("the format token is listed");
    assert_eq!(
        (
            held.rendered.as_str(),
            held.instance.as_str(),
            held.state.as_str()
        ),
        (token.as_str(), "first", "alive")
    );
    let max_before = before.iter().map(|id| seq(id, 6)).max().unwrap();

    assert_eq!(u64::from_str_radix(&token, 36).ok(), Some(held.id));
    first.kill();
    // The dead node's session expires, then its lock-delay passes.
    wait_until_free(&consul, "alnum-2", &token).await;

    // Another worker id: a counter kept per node would start again at 0.
    let set = [
        ("formatted", "block", "5"),
        ("consul", "worker", "\"static\""),
        ("node", "worker_id", "9"),
    ];
    let second = ChildServer::start(&cluster_file(
        dir.path(),
        "second",
        consul.addr(),
        &set,
        TOKEN_FORMATS,
    ));
    let mut c = second.client().await;
    let mut after = Vec::new();
    for _ in 0..4 {
        after.extend(c.gen_formatted(req(3)).await.unwrap().into_inner().ids);
    }
    assert!(
        after.iter().all(|id| token_of(id) == token),
        "the freed token is taken: {after:?}"
    );
    all_new(&mut seen, &after);
    assert!(
        after.iter().all(|id| seq(id, 6) > max_before),
        "continues above the dead holder's {max_before}: {after:?}"
    );
    assert!(second.terminate().success());
}

/// On Consul with a manual clock: a clean restart before midnight
/// (Asia/Shanghai) continues above every value reserved before it, on the
/// same token; midnight starts the next day at the minimum; a restart
/// after midnight stays in the new day above its values. Cluster-wide and
/// token counters alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_restarts_before_and_after_midnight_never_repeat() {
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let formats = r#"
[[formats]]
name = "orders"
template = "{yyyy}{MM}{dd}{seq:6}"
time_zone = "Asia/Shanghai"
reset = "day"

[[formats]]
name = "tok"
template = "{yyyy}{MM}{dd}{token:2:alnum}{seq:6}"
time_zone = "Asia/Shanghai"
reset = "day"
"#;
    let set = [("formatted", "block", "100")];
    let path = cluster_file(dir.path(), "n0", consul.addr(), &set, formats);
    let clock = Arc::new(ManualClock::at_millis(ms("2026-03-07T15:59:40Z")));
    let mut seen = HashSet::new();

    let node = start(load(&path), clock.clone()).await;
    for name in ["orders", "tok"] {
        let ids = node.gen(name, 5).await;
        all_new(&mut seen, &ids);
        assert!(ids.iter().all(|id| id.starts_with("20260307")), "{ids:?}");
        assert_eq!(
            ids.iter().map(|id| seq(id, 6)).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4]
        );
    }
    let token = node.token("tok").await;
    node.stop().await;

    // Restart before midnight: the same day, above the reserved blocks.
    clock.advance_millis(5_000);
    let node = start(load(&path), clock.clone()).await;
    for name in ["orders", "tok"] {
        let ids = node.gen(name, 5).await;
        all_new(&mut seen, &ids);
        assert!(ids.iter().all(|id| id.starts_with("20260307")), "{ids:?}");
        assert!(seq(&ids[0], 6) >= 100, "above the block: {ids:?}");
    }
    assert_eq!(node.token("tok").await, token, "a clean restart keeps it");

    // Midnight in Shanghai: the next day from the minimum.
    clock.set_millis(ms("2026-03-07T16:00:00.300Z"));
    for name in ["orders", "tok"] {
        let ids = node.gen(name, 3).await;
        all_new(&mut seen, &ids);
        assert!(ids.iter().all(|id| id.starts_with("20260308")), "{ids:?}");
        assert_eq!(
            ids.iter().map(|id| seq(id, 6)).collect::<Vec<_>>(),
            [0, 1, 2]
        );
    }
    node.stop().await;

    // Restart after midnight: the new day continues above its blocks.
    clock.advance_millis(3_000);
    let node = start(load(&path), clock.clone()).await;
    for name in ["orders", "tok"] {
        let ids = node.gen(name, 3).await;
        all_new(&mut seen, &ids);
        assert!(ids.iter().all(|id| id.starts_with("20260308")), "{ids:?}");
        assert!(seq(&ids[0], 6) >= 100, "{ids:?}");
    }
    node.stop().await;
}

const KILL_FORMATS: &str = r#"
[[formats]]
name = "orders"
template = "{yyyy}{MM}{dd}{param:biz:2:digits}{seq:8}"
time_zone = "Asia/Shanghai"
reset = "day"

[[formats]]
name = "tok"
template = "{yyyy}{MM}{dd}{token:2:alnum}{seq:6}"
reset = "day"
"#;

/// `idgen serve` on Consul killed with SIGKILL while callers take
/// cluster-wide and token IDs over gRPC, then restarted, three times:
/// once right away (its worker id and token are still locked, so it takes
/// others), once after the dead session's lock-delay (it takes its token
/// back and continues above it). Nothing any caller received repeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_kill_9_under_load_then_restart_repeats_nothing() {
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let set = [("formatted", "block", "20")];
    let path = cluster_file(dir.path(), "k", consul.addr(), &set, KILL_FORMATS);
    let req = |format: &str, count| GenFormattedRequest {
        format: format.into(),
        params: if format == "orders" {
            [("biz".to_owned(), "07".to_owned())].into()
        } else {
            Default::default()
        },
        count,
    };
    let mut seen = HashSet::new();
    let mut tokens = Vec::new();
    for round in 0..3 {
        let child = ChildServer::start(&path);
        let mut c = child.client().await;
        let first = c.gen_formatted(req("tok", 3)).await.unwrap().into_inner();
        tokens.push(token_of(&first.ids[0]).to_owned());
        all_new(&mut seen, &first.ids);
        let mut tasks = Vec::new();
        for caller in 0..3 {
            let mut c = child.client().await;
            tasks.push(tokio::spawn(async move {
                let mut got = Vec::new();
                // Bounded: stops at the first failure (the kill).
                for i in 0..2_000u32 {
                    let format = if (i + caller) % 2 == 0 {
                        "orders"
                    } else {
                        "tok"
                    };
                    match c.gen_formatted(req(format, 1 + i % 5)).await {
                        Ok(r) => got.extend(r.into_inner().ids),
                        Err(_) => break,
                    }
                }
                got
            }));
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
        child.kill();
        for t in tasks {
            all_new(&mut seen, &t.await.unwrap());
        }
        if round == 0 {
            // Let the dead session expire and its lock-delay pass: the
            // restart takes the same token back.
            wait_until_free(&consul, "alnum-2", &tokens[0]).await;
        }
    }
    assert_eq!(
        tokens[1], tokens[0],
        "the token comes back after lock-delay"
    );
    assert_ne!(tokens[2], tokens[1], "a locked token is passed over");
    assert!(seen.len() > 100, "{}", seen.len());
}

/// A token whose lock is taken away while the node's session lives (here
/// released and taken by another session) is never used again: the next
/// counter write carries a check of the lock and is refused
/// (UNAVAILABLE), and the node then takes another token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_lock_taken_away_stops_its_counter_and_another_token_is_taken() {
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    // One value per write: every call reaches the store.
    let set = [("formatted", "block", "1")];
    let path = cluster_file(dir.path(), "n0", consul.addr(), &set, TOKEN_FORMATS);
    let node = start(load(&path), Arc::new(SystemClock)).await;
    let mut seen = HashSet::new();
    let before = node.gen("tok", 2).await;
    all_new(&mut seen, &before);
    assert_eq!(token_of(&before[0]), "00");
    let key = ClusterPaths::new("idgen", "test").format_token_dir("alnum-2") + "0";
    let session = consul.kv_get(&key).and_then(|e| e.session).expect("held");
    assert!(release_token(consul.addr(), &key, &session, "n0").await);
    let _squatter = squat(consul.addr(), "alnum-2", 0..1).await;

    let e = node.try_gen("tok", 1).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("token lock"), "{e}");
    let after = node.gen("tok", 2).await;
    all_new(&mut seen, &after);
    assert!(after.iter().all(|id| token_of(id) == "01"), "{after:?}");
    node.stop().await;
}

/// The node's session destroyed (as an operator or an expired TTL would):
/// the token goes with it; the node fences, claims again under a new
/// session and takes a token again under that one (the old token is inside
/// its lock-delay, so another), and nothing repeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_takes_the_token_away_and_the_node_takes_one_again() {
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let set = [("formatted", "block", "5")];
    let path = cluster_file(dir.path(), "n0", consul.addr(), &set, TOKEN_FORMATS);
    let node = start(load(&path), Arc::new(SystemClock)).await;
    let mut seen = HashSet::new();
    let before = node.gen("tok", 3).await;
    all_new(&mut seen, &before);
    assert_eq!(token_of(&before[0]), "00");
    let dir_key = ClusterPaths::new("idgen", "test").format_token_dir("alnum-2");
    let old = consul
        .kv_get(&format!("{dir_key}0"))
        .and_then(|e| e.session)
        .expect("held");
    let destroyed: bool = reqwest::Client::new()
        .put(format!("http://{}/v1/session/destroy/{old}", consul.addr()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(destroyed);
    // Bounded: the node notices at its next renew, fences and claims
    // again; calls fail (fenced, or the lock check) until then.
    let mut after = None;
    for _ in 0..150 {
        match node.try_gen("tok", 3).await {
            Ok(ids) if consul.sessions().iter().any(|s| s.id != old) => {
                after = Some(ids);
                break;
            }
            Ok(ids) => panic!("issued {ids:?} under the destroyed session"),
            Err(e) => assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = after.expect("the node serves again under a new session");
    all_new(&mut seen, &after);
    let token = token_of(&after[0]).to_owned();
    assert_ne!(token, "00", "the old token is inside its lock-delay");
    let number = u64::from_str_radix(&token, 36).unwrap();
    let holder = consul
        .kv_get(&format!("{dir_key}{number}"))
        .and_then(|e| e.session)
        .expect("the new token is held");
    assert_ne!(holder, old, "held under the new session");
    node.stop().await;
}

/// `idgen admin release` of format token `number` of space alnum-2: flags
/// of another kind refused, then the forced release itself.
async fn release_from_the_cli(node: &ChildServer, token: &str, number: u64) {
    // The CLI: flags that belong to another kind, a missing --space.
    let addr = format!("http://{}", node.grpc);
    let admin_cli = |extra: &[&str]| {
        let mut a = vec!["admin", "--addr", &addr, "--token", token, "release"];
        a.extend_from_slice(extra);
        a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()
    };
    let run = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            common::run_idgen(&args)
        })
    };
    let (ok, out) = run(admin_cli(&["--kind", "format-token", "--id", "1"]))
        .await
        .unwrap();
    assert!(!ok && out.contains("--space"), "{out}");
    let (ok, out) = run(admin_cli(&[
        "--kind", "worker", "--space", "alnum-2", "--id", "1",
    ]))
    .await
    .unwrap();
    assert!(
        !ok && out.contains("--space is not for --kind worker"),
        "{out}"
    );

    // The release itself, from the CLI.
    let id = number.to_string();
    let (ok, out) = run(admin_cli(&[
        "--kind",
        "format-token",
        "--space",
        "alnum-2",
        "--id",
        &id,
        "--force",
    ]))
    .await
    .unwrap();
    assert!(ok && out.contains("destroyed session"), "{out}");
}

/// An operator force-releases a live node's format token (gRPC, the CLI
/// and the console's JSON API name it by space and number): a live holder
/// needs `force`, bad requests are refused naming what is wrong, the
/// release destroys the node's session, and the node takes a token again
/// under a new one; nothing repeats, and a token taken again continues
/// above its last value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_force_releases_a_live_nodes_format_token_and_nothing_repeats() {
    const TOKEN: &str = "s3cret-admin-token";
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let set = [
        ("formatted", "block", "5"),
        ("admin", "token", "\"s3cret-admin-token\""),
    ];
    let node = ChildServer::start(&cluster_file(
        dir.path(),
        "n0",
        consul.addr(),
        &set,
        TOKEN_FORMATS,
    ));
    let req = tok_request;
    let authed = |msg| {
        let mut r = tonic::Request::new(msg);
        r.metadata_mut()
            .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
        r
    };
    let mut c = node.client().await;
    let mut seen = HashSet::new();
    let mut before = Vec::new();
    for _ in 0..4 {
        before.extend(c.gen_formatted(req(3)).await.unwrap().into_inner().ids);
    }
    all_new(&mut seen, &before);
    let token = token_of(&before[0]).to_owned();
    let number = u64::from_str_radix(&token, 36).unwrap();
    let max_before = before.iter().map(|id| seq(id, 6)).max().unwrap();

    // The console lists it as a format token, by space and rendering.
    let holders = common::admin_json(node.http, "/admin/api/holders", TOKEN).await;
    let listed = holders["holders"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["kind"] == "format_token" && h["space"] == "alnum-2")
        .unwrap_or_else(|| panic!("the format token is listed: {holders}"));
    assert_eq!(
        (&listed["rendered"], &listed["id"], &listed["state"]),
        (
            &serde_json::json!(token),
            &serde_json::json!(number),
            &serde_json::json!("alive")
        ),
        "{listed}"
    );

    let mut admin = AdminClient::connect(format!("http://{}", node.grpc))
        .await
        .unwrap();
    let release = |space: &str, id, force| proto::ForceReleaseRequest {
        kind: HolderKind::FormatToken as i32,
        space: space.into(),
        id,
        force,
        ..Default::default()
    };
    let alive = admin
        .force_release(authed(release("alnum-2", number, false)))
        .await
        .unwrap_err();
    assert_eq!(alive.code(), tonic::Code::FailedPrecondition, "{alive:?}");
    assert!(alive.message().contains("force"), "{alive:?}");
    for (bad, what) in [
        (release("alnum-9", 1, true), "is not a format token space"),
        (release("alnum-2", 1296, true), "is outside space alnum-2"),
        (release("", 1, true), "is not a format token space"),
    ] {
        let e = admin.force_release(authed(bad)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains(what), "{what}: {e:?}");
    }
    let e = admin
        .force_release(authed(release("alnum-2", 1295, true)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "never claimed: {e:?}");
    let r = reqwest::Client::new()
        .post(format!("http://{}/admin/api/release", node.http))
        .bearer_auth(TOKEN)
        .json(&serde_json::json!({"kind": "format_token", "space": "digits-7", "id": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400, "the console refuses a bad space");

    release_from_the_cli(&node, TOKEN, number).await;

    // Bounded: the node notices, fences, claims again and takes a token.
    let mut after = Vec::new();
    for _ in 0..200 {
        if let Ok(r) = c.gen_formatted(req(3)).await {
            after.extend(r.into_inner().ids);
            if after.len() >= 12 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(after.len() >= 12, "the node serves again: {after:?}");
    all_new(&mut seen, &after);
    for id in after.iter().filter(|id| token_of(id) == token) {
        assert!(
            seq(id, 6) > max_before,
            "{id}: the token taken again continues above {max_before}"
        );
    }
    assert!(node.terminate().success());
}
