//! Formatted mode end to end through in-process nodes: resets at local
//! midnight (Asia/Shanghai, America/New_York on a DST day) on a manual
//! clock, restarts before and after midnight, the wall clock stepped back
//! across midnight, counter exhaustion, parameter checks, the presets and a
//! daily Lua rule; and uniqueness across three nodes on the Consul test
//! server for cluster-wide and per-node formats.

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use common::{test_config, write_cluster_config};
use idgen::config::{Config, FormattedSettings, Overrides};
use idgen::id::format::{FormatDef, PresetName, Reset};
use idgen::id::{Clock, ErrorKind, ManualClock, SystemClock};

use common::{start_node as start, Running};

impl Running {
    async fn gen(&self, name: &str, params: &[(&str, &str)], count: u64) -> Vec<String> {
        self.try_gen(name, params, count)
            .await
            .unwrap_or_else(|e| panic!("gen {name}: {e}"))
    }

    async fn try_gen(
        &self,
        name: &str,
        params: &[(&str, &str)],
        count: u64,
    ) -> Result<Vec<String>, idgen::error::Error> {
        let params: Vec<(String, String)> = params
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let issued = self.issuer.gen_formatted(name, &params, count).await?;
        Ok(issued.ids.into_iter().map(|r| r.text).collect())
    }
}

fn ms(rfc3339: &str) -> u64 {
    rfc3339.parse::<jiff::Timestamp>().unwrap().as_millisecond() as u64
}

fn config_with(dir: &Path, block: u64, formats: Vec<FormatDef>) -> Config {
    let mut c = test_config(dir);
    c.formatted = FormattedSettings {
        block,
        formats,
        ..FormattedSettings::default()
    };
    c
}

/// The counter part of `id` (its last `width` characters).
fn seq(id: &str, width: usize) -> u64 {
    id[id.len() - width..].parse().unwrap()
}

/// Adds `ids` to `seen`, failing on any repeat.
fn all_new(seen: &mut HashSet<String>, ids: &[String]) {
    for id in ids {
        assert!(seen.insert(id.clone()), "{id} handed out twice");
    }
}

/// Daily order numbers in Asia/Shanghai: a restart before midnight
/// continues above every value reserved before it; midnight (16:00 UTC)
/// starts the next day at the minimum; a restart after midnight stays in
/// the new day above its values (CosId#748: the stored period decides, not
/// the clock alone); a wall clock stepped back across midnight stays in the
/// new day, and beyond clock.max_backward is refused with UNAVAILABLE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daily_counters_reset_at_local_midnight_and_survive_restarts_and_step_backs() {
    let dir = tempfile::tempdir().unwrap();
    let def = FormatDef::template(
        "orders",
        "{yyyy}{MM}{dd}{seq:6}",
        "Asia/Shanghai",
        Reset::Day,
    );
    let config = || config_with(dir.path(), 100, vec![def.clone()]);
    let clock = Arc::new(ManualClock::at_millis(ms("2026-03-07T15:59:40Z")));
    let mut seen = HashSet::new();

    let node = start(config(), clock.clone()).await;
    let day1 = node.gen("orders", &[], 5).await;
    all_new(&mut seen, &day1);
    assert!(day1.iter().all(|id| id.starts_with("20260307")), "{day1:?}");
    assert_eq!(
        day1.iter().map(|id| seq(id, 6)).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4]
    );
    node.stop().await;

    // Restart before midnight: the same day, above the whole reserved block.
    clock.advance_millis(5_000);
    let node = start(config(), clock.clone()).await;
    let again = node.gen("orders", &[], 5).await;
    all_new(&mut seen, &again);
    assert!(
        again.iter().all(|id| id.starts_with("20260307")),
        "{again:?}"
    );
    assert!(
        seq(&again[0], 6) >= 100,
        "continues above the reserved block: {again:?}"
    );

    // Midnight in Shanghai (16:00 UTC): the next day from the minimum.
    clock.set_millis(ms("2026-03-07T16:00:00.300Z"));
    let day2 = node.gen("orders", &[], 3).await;
    all_new(&mut seen, &day2);
    assert_eq!(day2, ["20260308000000", "20260308000001", "20260308000002"]);

    // Stepped back 500 ms across midnight (within clock.max_backward):
    // still the new day, counter continuing.
    clock.step_back_millis(500);
    let held = node.gen("orders", &[], 2).await;
    all_new(&mut seen, &held);
    assert_eq!(held, ["20260308000003", "20260308000004"]);

    // Stepped back 5 s: refused, never back in the finished day.
    clock.set_millis(ms("2026-03-07T15:59:55Z"));
    let e = node.try_gen("orders", &[], 1).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("behind"), "{e}");
    clock.set_millis(ms("2026-03-07T16:00:01Z"));
    let caught_up = node.gen("orders", &[], 1).await;
    all_new(&mut seen, &caught_up);
    assert_eq!(caught_up, ["20260308000005"]);
    node.stop().await;

    // Restart after midnight: the new day continues above its block.
    clock.advance_millis(3_000);
    let node = start(config(), clock.clone()).await;
    let after = node.gen("orders", &[], 3).await;
    all_new(&mut seen, &after);
    assert!(
        after.iter().all(|id| id.starts_with("20260308")),
        "{after:?}"
    );
    assert!(seq(&after[0], 6) >= 100, "{after:?}");
    node.stop().await;
}

/// America/New_York on 2026-03-08, the day clocks spring forward (a 23-hour
/// day): the day continues across 02:00 EST -> 03:00 EDT, and the next
/// day starts at midnight EDT (04:00 UTC, not 05:00 UTC).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_york_day_with_a_dst_change_resets_at_local_midnight() {
    let dir = tempfile::tempdir().unwrap();
    let def = FormatDef::template(
        "ny",
        "{yyyy}{MM}{dd}{HH}-{seq:5}",
        "America/New_York",
        Reset::Day,
    );
    let clock = Arc::new(ManualClock::at_millis(ms("2026-03-08T06:59:00Z")));
    let node = start(config_with(dir.path(), 10, vec![def]), clock.clone()).await;
    assert_eq!(
        node.gen("ny", &[], 2).await,
        ["2026030801-00000", "2026030801-00001"]
    );
    // 02:00 EST is 03:00 EDT: the same day, counter going on.
    clock.set_millis(ms("2026-03-08T07:01:00Z"));
    assert_eq!(node.gen("ny", &[], 1).await, ["2026030803-00002"]);
    clock.set_millis(ms("2026-03-09T03:59:59Z"));
    assert_eq!(node.gen("ny", &[], 1).await, ["2026030823-00003"]);
    clock.set_millis(ms("2026-03-09T04:00:01Z"));
    assert_eq!(node.gen("ny", &[], 1).await, ["2026030900-00000"]);
    node.stop().await;
}

/// A counter used up within its period answers RESOURCE_EXHAUSTED naming
/// the format and when the next period starts; the next period serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_counter_names_the_format_and_the_next_period() {
    let dir = tempfile::tempdir().unwrap();
    let def = FormatDef::template("tiny", "{yyyy}{MM}{dd}{seq:1}", "UTC", Reset::Day);
    let clock = Arc::new(ManualClock::at_millis(ms("2026-05-01T10:00:00Z")));
    let node = start(config_with(dir.path(), 100, vec![def]), clock.clone()).await;
    let ids = node.gen("tiny", &[], 10).await;
    assert_eq!(ids.len(), 10);
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 10);
    let e = node.try_gen("tiny", &[], 1).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Exhausted, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("\"tiny\""), "{msg}");
    assert!(msg.contains("2026-05-02T00:00:00Z"), "{msg}");
    clock.set_millis(ms("2026-05-02T00:00:01Z"));
    assert_eq!(node.gen("tiny", &[], 1).await, ["202605020"]);
    node.stop().await;
}

/// Parameters are checked for presence, length and charset, and the error
/// names the parameter; an unknown format is NOT_FOUND.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parameters_are_validated_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let def = FormatDef::template(
        "policy",
        "{yyyy}{MM}{dd}{param:biz:3:digits}{node:2}{seq:4}",
        "UTC",
        Reset::Day,
    );
    let clock = Arc::new(ManualClock::at_millis(SystemClock.now_millis()));
    let node = start(config_with(dir.path(), 100, vec![def]), clock).await;
    let ok = node.gen("policy", &[("biz", "042")], 2).await;
    assert!(ok[0][8..].starts_with("04200"), "{ok:?}");
    for (params, want) in [
        (vec![("biz", "42")], "biz"),
        (vec![("biz", "04a")], "biz"),
        (vec![], "biz"),
        (vec![("biz", "042"), ("zone", "1")], "zone"),
    ] {
        let e = node.try_gen("policy", &params, 1).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BadRequest, "{e}");
        assert!(e.to_string().contains(want), "{params:?}: {e}");
    }
    let e = node.try_gen("nope", &[], 1).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    node.stop().await;
}

const DAILY_LUA_RULE: &str = r#"
function min_counter() return 0 end
function max_counter() return 9999 end
function reset_seconds() return 86400 end
function create_id(counter, now, salt)
    local seq = counter:generate_counter()
    return string.format("%04d%02d%02d%04d", now:year(), now:month(), now:day(), seq)
end
"#;

/// The presets and a daily Lua rule are served; preset IDs come back as
/// numbers and parse back into their fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presets_and_a_lua_rule_are_served_and_presets_parse_back() {
    let dir = tempfile::tempdir().unwrap();
    let lua = FormatDef {
        template: None,
        lua: Some(DAILY_LUA_RULE.into()),
        reset: None,
        ..FormatDef::template("o2o", "", "Asia/Shanghai", Reset::Day)
    };
    let preset = |name: &str, p: PresetName| FormatDef {
        template: None,
        preset: Some(p),
        ..FormatDef::template(name, "", "UTC", Reset::Day)
    };
    let defs = vec![
        lua,
        FormatDef {
            reset: None,
            ..preset("u64", PresetName::Uniq64)
        },
        FormatDef {
            reset: None,
            ..preset("idc", PresetName::Idc)
        },
    ];
    let clock = Arc::new(ManualClock::at_millis(ms("2026-06-15T01:30:00Z")));
    let node = start(config_with(dir.path(), 100, defs), clock).await;

    let ids = node.gen("o2o", &[("salt", "x")], 3).await;
    assert_eq!(
        ids,
        [
            "20260615".to_owned() + "0000",
            "202606150001".into(),
            "202606150002".into()
        ]
    );

    let params: Vec<(String, String)> = vec![];
    let u = node.issuer.gen_formatted("u64", &params, 2).await.unwrap();
    assert!(u.numeric);
    let n = u.ids[1].number.expect("uniq64 is a number");
    assert_eq!(u.ids[1].text, n.to_string());
    let parsed = node
        .issuer
        .parse_formatted("u64", &u.ids[1].text)
        .await
        .unwrap();
    assert_eq!(
        (
            parsed.year,
            parsed.month,
            parsed.day,
            parsed.hour,
            parsed.token,
            parsed.seq
        ),
        (Some(2026), Some(6), Some(15), Some(1), Some(0), 1)
    );

    let p: Vec<(String, String)> = vec![("type".into(), "1".into()), ("route".into(), "07".into())];
    let i = node.issuer.gen_formatted("idc", &p, 2).await.unwrap();
    let text = &i.ids[0].text;
    assert_eq!(i.ids[0].number, Some(text.parse().unwrap()));
    let parsed = node.issuer.parse_formatted("idc", text).await.unwrap();
    assert_eq!(parsed.unix_s, Some(ms("2026-06-15T01:30:00Z") / 1000));
    assert_eq!((parsed.node, parsed.seq), (Some(0), 0));
    assert!(
        parsed.params.contains(&("route".into(), "07".into())),
        "{parsed:?}"
    );
    node.stop().await;
}

/// Three nodes on the Consul test server, callers on every node at once:
/// a cluster-wide counter and a per-node one never repeat across nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_consul_nodes_never_repeat_cluster_or_per_node_ids() {
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let formats = r#"
[[formats]]
name = "shared"
template = "{yyyy}{MM}{dd}{seq:8}"
reset = "day"

[[formats]]
name = "mine"
template = "{yyyy}{MM}{dd}{node:4}{seq:6}"
reset = "day"
"#;
    let mut nodes = Vec::new();
    for i in 0..3 {
        let path = write_cluster_config(
            dir.path(),
            &format!("n{i}"),
            consul.addr(),
            &[("formatted", "block", "7")],
        );
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(formats);
        std::fs::write(&path, text).unwrap();
        let config = Config::load(Some(&path), &Overrides::default(), SystemClock.now_millis())
            .expect("cluster config");
        nodes.push(start(config, Arc::new(SystemClock)).await);
    }
    let nodes = Arc::new(nodes);
    let mut tasks = Vec::new();
    for caller in 0..6 {
        let nodes = Arc::clone(&nodes);
        tasks.push(tokio::spawn(async move {
            let node = &nodes[caller % 3];
            let mut got = Vec::new();
            for j in 0..25 {
                let name = if j % 2 == 0 { "shared" } else { "mine" };
                got.extend(node.gen(name, &[], 1 + (j % 4) as u64).await);
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
    assert_eq!(seen.len(), total);
    assert!(total > 200, "{total}");
    let nodes = Arc::into_inner(nodes).expect("callers done");
    for n in nodes {
        n.stop().await;
    }
}

/// A state file restored from a backup: every counter the lost node may
/// have moved after the backup (the same period above the snapshot, and a
/// period begun after it) continues above the restore's skip-ahead, never
/// from the snapshot's values or the minimum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_state_file_never_repeats_counters_used_after_the_backup() {
    use idgen::store::snapshot;
    let dir = tempfile::tempdir().unwrap();
    let def = FormatDef::template(
        "orders",
        "{yyyy}{MM}{dd}{seq:6}",
        "Asia/Shanghai",
        Reset::Day,
    );
    let clock = Arc::new(ManualClock::at_millis(ms("2026-03-07T10:00:00Z")));
    let config = config_with(dir.path(), 100, vec![def.clone()]);
    let layout = config.layout.to_string();
    let mut seen = HashSet::new();

    let node = start(config.clone(), clock.clone()).await;
    all_new(&mut seen, &node.gen("orders", &[], 5).await);
    node.stop().await;
    let backup = dir.path().join("backup.redb");
    let bytes = snapshot::take_offline(&dir.path().join("state.redb"), clock.now_millis()).unwrap();
    snapshot::write_snapshot_file(&backup, &bytes).unwrap();

    // After the backup: more of the same day, then the next day.
    let node = start(config.clone(), clock.clone()).await;
    all_new(&mut seen, &node.gen("orders", &[], 150).await);
    clock.set_millis(ms("2026-03-07T16:00:05Z"));
    all_new(&mut seen, &node.gen("orders", &[], 150).await);
    node.stop().await;

    // The file is lost; restore the backup with a margin of 1000.
    clock.advance_millis(60_000);
    let restored = dir.path().join("restored.redb");
    let report = snapshot::restore(
        &backup,
        &restored,
        &layout,
        1000,
        clock.now_millis() + 5_000,
    )
    .unwrap();
    assert_eq!(report.format_counters, 1);
    let mut config = config_with(dir.path(), 100, vec![def]);
    config.store.backend = idgen::config::Backend::Embedded {
        path: restored,
        init_if_missing: false,
        mirror_path: None,
    };
    let node = start(config, clock.clone()).await;
    let after = node.gen("orders", &[], 150).await;
    all_new(&mut seen, &after);
    assert!(
        after.iter().all(|id| id.starts_with("20260308")),
        "{after:?}"
    );
    node.stop().await;
}

const CHILD_FORMATS: &str = r#"
[formatted]
block = 20

[[formats]]
name = "orders"
template = "{yyyy}{MM}{dd}{param:biz:2:digits}{seq:8}"
time_zone = "Asia/Shanghai"
reset = "day"

[[formats]]
name = "idc"
preset = "idc"
"#;

/// `idgen serve` processes killed with SIGKILL while callers are taking
/// IDs over gRPC, then restarted on the same state file, three times:
/// nothing any caller received repeats. Also the HTTP and gRPC surface:
/// numbers for the numeric preset, ParseFormatted, GetFormatCounter, and
/// an unknown parameter refused as INVALID_ARGUMENT / 400 naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_under_load_then_restart_repeats_nothing() {
    use idgen::proto::{GenFormattedRequest, GetFormatCounterRequest, ParseFormattedRequest};
    let dir = tempfile::tempdir().unwrap();
    let path = common::write_child_config(dir.path(), true);
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(CHILD_FORMATS);
    std::fs::write(&path, text).unwrap();
    let req = |count| GenFormattedRequest {
        format: "orders".into(),
        params: [("biz".to_owned(), "07".to_owned())].into(),
        count,
    };
    let mut seen = HashSet::new();
    for round in 0..3 {
        let child = common::ChildServer::start(&path);
        // One call answered before the load, so every round issues
        // something whatever the machine's load.
        let first = child.client().await.gen_formatted(req(3)).await.unwrap();
        all_new(&mut seen, &first.into_inner().ids);
        let mut tasks = Vec::new();
        for _ in 0..3 {
            let mut c = child.client().await;
            tasks.push(tokio::spawn(async move {
                let mut got = Vec::new();
                // Bounded: stops at the first failure (the kill).
                for i in 0..2_000u32 {
                    match c.gen_formatted(req(1 + i % 5)).await {
                        Ok(r) => got.extend(r.into_inner().ids),
                        Err(_) => break,
                    }
                }
                got
            }));
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        if round == 2 {
            // The API surface, on the last live process.
            let mut c = child.client().await;
            let idc = c
                .gen_formatted(GenFormattedRequest {
                    format: "idc".into(),
                    params: [
                        ("type".to_owned(), "1".to_owned()),
                        ("route".to_owned(), "42".to_owned()),
                    ]
                    .into(),
                    count: 2,
                })
                .await
                .unwrap()
                .into_inner();
            assert!(idc.numeric);
            assert_eq!(idc.numbers.len(), 2);
            assert_eq!(idc.ids[1], idc.numbers[1].to_string());
            let parsed = c
                .parse_formatted(ParseFormattedRequest {
                    format: "idc".into(),
                    id: idc.ids[1].clone(),
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(parsed.params.get("route").map(String::as_str), Some("42"));
            let counter = c
                .get_format_counter(GetFormatCounterRequest {
                    format: "orders".into(),
                    params: [("biz".to_owned(), "07".to_owned())].into(),
                })
                .await
                .unwrap()
                .into_inner();
            assert!(counter.used && counter.last > 0, "{counter:?}");
            let e = c
                .gen_formatted(GenFormattedRequest {
                    format: "orders".into(),
                    params: [
                        ("biz".to_owned(), "07".to_owned()),
                        ("bogus".to_owned(), "1".to_owned()),
                    ]
                    .into(),
                    count: 1,
                })
                .await
                .unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().contains("bogus"), "{}", e.message());
            let http = format!("http://{}/v1/formatted/orders", child.http);
            let r = reqwest::get(format!("{http}?count=3&param.biz=07"))
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let body: serde_json::Value = r.json().await.unwrap();
            let ids: Vec<String> = body["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_owned())
                .collect();
            assert_eq!(ids.len(), 3);
            all_new(&mut seen, &ids);
            let r = reqwest::get(format!("{http}?param.biz=7")).await.unwrap();
            assert_eq!(r.status(), 400);
            assert!(r.text().await.unwrap().contains("biz"));
            let r = reqwest::get(format!("{http}/parse?id={}", ids[0]))
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let body: serde_json::Value = r.json().await.unwrap();
            assert_eq!(body["params"]["biz"], "07");
            // The CLI.
            let addr = child.grpc.to_string();
            let args = [
                "gen", "--addr", &addr, "--format", "orders", "--param", "biz=07", "-n", "3",
            ];
            let (ok, out) = tokio::task::block_in_place(|| common::run_idgen(&args));
            assert!(ok, "{out}");
            let cli: Vec<String> = out.lines().map(str::to_owned).collect();
            assert_eq!(cli.len(), 3, "{out}");
            assert!(
                cli.iter().all(|id| id.len() == 18 && id[8..10] == *"07"),
                "{out}"
            );
            all_new(&mut seen, &cli);
        }
        child.kill();
        for t in tasks {
            all_new(&mut seen, &t.await.unwrap());
        }
    }
}

/// A Lua rule that loops for one caller's salt is stopped by its budget
/// and answers FAILED_PRECONDITION naming the rule and line; one that calls
/// `os.execute` for a salt is refused the same way; the node keeps serving
/// the rule for other callers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_lua_rule_answers_a_status_naming_rule_and_line_and_the_node_serves_on() {
    let dir = tempfile::tempdir().unwrap();
    let rule = r#"function min_counter() return 0 end
function max_counter() return 9999 end
function reset_seconds() return 86400 end
function create_id(counter, now, salt)
  while salt == "loop" do end
  if salt == "exec" then os.execute("true") end
  return string.format("%d%02d%02d%04d", now:year(), now:month(), now:day(), counter)
end
"#;
    let def = FormatDef {
        template: None,
        lua: Some(rule.into()),
        reset: None,
        ..FormatDef::template("rule", "", "UTC", Reset::Day)
    };
    let clock = Arc::new(ManualClock::at_millis(ms("2026-06-15T01:30:00Z")));
    let node = start(config_with(dir.path(), 100, vec![def]), clock).await;
    for (salt, line) in [("loop", "line 5"), ("exec", "line 6")] {
        let e = node
            .try_gen("rule", &[("salt", salt)], 1)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Precondition, "{e}");
        let msg = e.to_string();
        assert!(msg.contains("rule") && msg.contains(line), "{salt}: {msg}");
    }
    let ok = node.gen("rule", &[("salt", "x")], 2).await;
    assert_eq!(ok.len(), 2);
    assert_ne!(ok[0], ok[1]);
    node.stop().await;
}
