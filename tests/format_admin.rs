//! Formats as durable objects: created, updated, read, listed and deleted
//! through the admin API on both backends (a format created through one
//! Consul node is served by another without a restart), a deleted name
//! never created again, updates that could repeat IDs refused naming the
//! field, config file entries checked against the stored definitions, and
//! atomic reloads: on SIGHUP of a real process, and a Lua rule replaced
//! under load from 8 callers with no failed call and no repeated ID, while
//! a broken rule never replaces the one in use.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{run_idgen, test_config, write_child_config, write_cluster_config, ChildServer};
use idgen::config::{Config, FormattedSettings};
use idgen::id::format::{FormatDef, Reset};
use idgen::id::{Clock, SystemClock};
use idgen::modes::format_catalog::FormatCatalog;
use idgen::modes::Issuer;
use idgen::node::Node;
use idgen::proto::admin_client::AdminClient;
use idgen::proto::{self, id_gen_client::IdGenClient};
use idgen::store::format::catalog::StoredFormat;
use tokio::net::TcpListener;
use tonic::transport::Channel;
use tonic::Code;

const TOKEN: &str = "s3cret-admin-token";

fn ok<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    r
}

async fn admin(node: &ChildServer) -> AdminClient<Channel> {
    AdminClient::connect(format!("http://{}", node.grpc))
        .await
        .expect("connects")
}

async fn gen(node: &ChildServer, format: &str, count: u32) -> Result<Vec<String>, tonic::Status> {
    let mut c: IdGenClient<Channel> = node.client().await;
    let r = c
        .gen_formatted(proto::GenFormattedRequest {
            format: format.into(),
            params: Default::default(),
            count,
        })
        .await?;
    Ok(r.into_inner().ids)
}

fn json(def: &FormatDef) -> String {
    serde_json::to_string(def).unwrap()
}

fn create(def: &FormatDef) -> tonic::Request<proto::CreateFormatRequest> {
    ok(proto::CreateFormatRequest {
        definition_json: json(def),
        fresh: false,
    })
}

fn update(def: &FormatDef) -> tonic::Request<proto::UpdateFormatRequest> {
    ok(proto::UpdateFormatRequest {
        definition_json: json(def),
    })
}

fn orders() -> FormatDef {
    FormatDef::template(
        "orders",
        "{yyyy}{MM}{dd}{seq:6}",
        "Asia/Shanghai",
        Reset::Day,
    )
}

fn embedded_config(dir: &Path, extra: &str) -> PathBuf {
    let path = write_child_config(dir, true);
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(&format!("[admin]\ntoken = \"{TOKEN}\"\n{extra}"));
    std::fs::write(&path, text).unwrap();
    path
}

/// Adds `ids` to `seen`, failing on any repeat.
fn all_new(seen: &mut HashSet<String>, ids: &[String]) {
    for id in ids {
        assert!(seen.insert(id.clone()), "{id} handed out twice");
    }
}

/// Polls `f` every 100 ms for at most `secs`; the last result.
async fn eventually<T>(secs: u64, mut f: impl AsyncFnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Updates of "orders": a change to how IDs render refused naming the
/// field, the description and the widest max allowed (returned).
async fn only_updates_that_keep_the_rendering_pass(
    a: &mut AdminClient<Channel>,
    node: &ChildServer,
    seen: &mut HashSet<String>,
) -> FormatDef {
    // An update that changes how IDs render: refused, naming the field.
    let mut changed = orders();
    changed.template = Some("{yyyy}{MM}{dd}{seq:7}".into());
    let refused = a.update_format(update(&changed)).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("template"), "{refused:?}");
    let mut zone = orders();
    zone.time_zone = "UTC".into();
    let refused = a.update_format(update(&zone)).await.unwrap_err();
    assert!(refused.message().contains("time_zone"), "{refused:?}");
    // A smaller max is refused like any change to the rendering.
    let mut smaller = orders();
    smaller.max = Some(500_000);
    let refused = a.update_format(update(&smaller)).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("max"), "{refused:?}");
    // Allowed: the description, and the field's widest max restated; the
    // counter goes on.
    let mut allowed = orders();
    allowed.description = "order numbers".into();
    allowed.max = Some(999_999);
    let r = a
        .update_format(update(&allowed))
        .await
        .unwrap()
        .into_inner();
    assert!(r.format.unwrap().definition_json.contains("order numbers"));
    assert!(r.previous.unwrap().definition_json.contains("{seq:6}"));
    all_new(seen, &gen(node, "orders", 3).await.unwrap());
    allowed
}

/// `idgen admin formats`: list, create from flags, a refused update from a
/// file, get as JSON.
fn the_cli_manages_formats(node: &ChildServer, dir: &Path) {
    // The CLI lists it.
    let addr = node.grpc.to_string();
    let (fine, out) = run_idgen(&[
        "admin", "--addr", &addr, "--token", TOKEN, "formats", "list",
    ]);
    assert!(
        fine && out.contains("orders") && out.contains("served here"),
        "{out}"
    );
    // Created from flags, refused update printed with the field, from a
    // TOML file.
    let cli = |args: &[&str]| {
        let mut all = vec!["admin", "--addr", &addr, "--token", TOKEN, "formats"];
        all.extend_from_slice(args);
        run_idgen(&all)
    };
    let (fine, out) = cli(&[
        "create",
        "cli-made",
        "--template",
        "{yyyy}{MM}{dd}{seq:4}",
        "--reset",
        "day",
        "--description",
        "from flags",
    ]);
    assert!(fine && out.contains("created cli-made"), "{out}");
    let file = dir.join("cli-made.toml");
    std::fs::write(
        &file,
        "[[formats]]\nname = \"cli-made\"\ntemplate = \"{yyyy}{MM}{dd}{seq:5}\"\nreset = \"day\"\n",
    )
    .unwrap();
    let (fine, out) = cli(&["update", "--file", file.to_str().unwrap()]);
    assert!(
        !fine && out.contains("INVALID_ARGUMENT") && out.contains("template"),
        "{out}"
    );
    let (fine, out) = cli(&["get", "cli-made", "--json"]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect(&out);
    assert!(
        fine && v["format"]["definition"]["description"] == "from flags",
        "{out}"
    );
}

/// docs/FORMATTED.md's Lua rule `o2o` as a reader saves it ("the keys of a
/// `[[formats]]` entry ... without its `[[formats]]` line"): the page's
/// own TOML block, so the page and the test cannot drift apart.
fn the_docs_o2o_rule() -> String {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/FORMATTED.md"))
        .expect("docs/FORMATTED.md");
    let start = page
        .find("```toml\n[[formats]]\nname = \"o2o\"\n")
        .expect("docs/FORMATTED.md shows the o2o rule as a TOML block");
    let block = &page[start + "```toml\n".len()..];
    let block = &block[..block.find("```").expect("the block ends")];
    block.replacen("[[formats]]\n", "", 1)
}

/// docs/FORMATTED.md's `idgen admin formats create o2o --file o2o.toml`
/// then `update o2o --file o2o.toml` with a description added (an allowed
/// change), as written there; the Lua rule then issues.
async fn the_cli_creates_and_updates_the_docs_o2o_rule(node: &ChildServer, dir: &Path) {
    let addr = node.grpc.to_string();
    let file = dir.join("o2o.toml");
    let file_arg = file.to_str().expect("a UTF-8 temp path").to_owned();
    let cli = |verb: &str| {
        let all = [
            "admin", "--addr", &addr, "--token", TOKEN, "formats", verb, "o2o", "--file", &file_arg,
        ];
        run_idgen(&all)
    };
    std::fs::write(&file, the_docs_o2o_rule()).unwrap();
    let (fine, out) = cli("create");
    assert!(fine && out.contains("created o2o"), "{out}");
    let ids = gen(node, "o2o", 3).await.expect("the o2o rule issues");
    assert_eq!(ids.len(), 3, "{ids:?}");
    let described = the_docs_o2o_rule() + "description = \"order numbers, daily\"\n";
    std::fs::write(&file, described).unwrap();
    let (fine, out) = cli("update");
    assert!(fine && out.contains("updated o2o"), "{out}");
    let (fine, out) = run_idgen(&[
        "admin", "--addr", &addr, "--token", TOKEN, "formats", "get", "o2o", "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect(&out);
    assert!(
        fine && v["format"]["definition"]["description"] == "order numbers, daily",
        "{out}"
    );
}

/// Create, read, list, update (allowed and refused), delete and the
/// tombstone, on the embedded store of a real process, across a restart;
/// and the CLI's `admin formats`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_formats_are_durable_admin_objects_and_a_deleted_name_stays_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let config = embedded_config(dir.path(), "");
    let node = ChildServer::start(&config);
    let mut a = admin(&node).await;
    let mut seen = HashSet::new();

    let unknown = gen(&node, "orders", 1).await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");
    let created = a
        .create_format(create(&orders()))
        .await
        .unwrap()
        .into_inner();
    let f = created.format.unwrap();
    assert!(f.served && !f.deleted && f.source == "admin", "{f:?}");
    assert!(f.definition_json.contains("origin_year"), "stamped: {f:?}");
    assert_eq!(created.reload.unwrap().formats, ["orders"]);
    let first = gen(&node, "orders", 3).await.unwrap();
    all_new(&mut seen, &first);

    let again = a.create_format(create(&orders())).await.unwrap_err();
    assert_eq!(again.code(), Code::AlreadyExists, "{again:?}");
    let bad = a
        .create_format(ok(proto::CreateFormatRequest {
            fresh: false,
            definition_json: json(&FormatDef::template(
                "short",
                "{yyyy}{MM}{seq:4}",
                "UTC",
                Reset::Day,
            )),
        }))
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument, "{bad:?}");
    assert!(bad.message().contains("short"), "{bad:?}");

    let allowed = only_updates_that_keep_the_rendering_pass(&mut a, &node, &mut seen).await;

    let got = a
        .get_format(ok(proto::GetFormatRequest {
            name: "orders".into(),
        }))
        .await
        .unwrap()
        .into_inner()
        .format
        .unwrap();
    assert!(got.definition_json.contains("999999"), "{got:?}");
    let missing = a
        .get_format(ok(proto::GetFormatRequest {
            name: "nope".into(),
        }))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);

    the_cli_manages_formats(&node, dir.path());
    the_cli_creates_and_updates_the_docs_o2o_rule(&node, dir.path()).await;

    // Delete: NOT_FOUND for calls; the name is never created again.
    let deleted = a
        .delete_format(ok(proto::DeleteFormatRequest {
            name: "orders".into(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(deleted.format.unwrap().deleted);
    assert!(deleted.note.contains("never"), "{}", deleted.note);
    assert_eq!(
        gen(&node, "orders", 1).await.unwrap_err().code(),
        Code::NotFound
    );
    let recreate = a.create_format(create(&orders())).await.unwrap_err();
    assert_eq!(recreate.code(), Code::FailedPrecondition, "{recreate:?}");
    assert!(recreate.message().contains("deleted"), "{recreate:?}");
    let upd = a.update_format(update(&allowed)).await.unwrap_err();
    assert_eq!(upd.code(), Code::FailedPrecondition, "{upd:?}");

    // Durable: after a restart the tombstone holds and a live format is
    // served from the store alone (no config entry).
    let mut other = orders();
    other.name = "invoices".into();
    a.create_format(create(&other)).await.unwrap();
    // IDs of different formats may coincide: each format its own set.
    let mut invoices = HashSet::new();
    all_new(&mut invoices, &gen(&node, "invoices", 2).await.unwrap());
    assert_eq!(node.terminate().code(), Some(0));
    let node = ChildServer::start(&config);
    let mut a = admin(&node).await;
    all_new(&mut invoices, &gen(&node, "invoices", 2).await.unwrap());
    let recreate = a.create_format(create(&orders())).await.unwrap_err();
    assert_eq!(recreate.code(), Code::FailedPrecondition, "{recreate:?}");
    let listed = a
        .list_formats(ok(proto::ListFormatsRequest {}))
        .await
        .unwrap()
        .into_inner();
    let names: Vec<(&str, bool)> = listed
        .formats
        .iter()
        .map(|f| (f.name.as_str(), f.deleted))
        .collect();
    assert_eq!(
        names,
        [
            ("cli-made", false),
            ("invoices", false),
            ("o2o", false),
            ("orders", true)
        ]
    );
    assert_eq!(node.terminate().code(), Some(0));
}

/// SIGHUP on a real process reads the config file's [[formats]] again:
/// a new entry is served; an entry changed in a way that could repeat IDs
/// (a Lua rule's code, a template) is refused naming the entry and the
/// field, and the formats in use keep serving, their counters going on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_config_files_formats_and_a_refused_reload_keeps_the_old_ones() {
    let dir = tempfile::tempdir().unwrap();
    let lua = |prefix: &str| {
        format!(
            "[[formats]]\nname = \"o2o\"\nlua = \"\"\"\nfunction min_counter() return 0 end\nfunction max_counter() return 9999 end\nfunction reset_seconds() return 0 end\nfunction create_id(counter, now, salt) return string.format(\"{prefix}%08d\", counter) end\n\"\"\"\n"
        )
    };
    let config = embedded_config(dir.path(), &lua("A"));
    let node = ChildServer::start(&config);
    let mut seen = HashSet::new();
    let first = gen(&node, "o2o", 3).await.unwrap();
    assert!(first.iter().all(|id| id.starts_with('A')), "{first:?}");
    all_new(&mut seen, &first);
    let base = std::fs::read_to_string(&config).unwrap();
    let hup = || {
        let status = std::process::Command::new("kill")
            .args(["-HUP", &node.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    };
    // Waits until `n` reloads have failed; the log.
    let failed = async |n: usize| {
        eventually(10, async || {
            let log = node.log_text();
            (log.matches("formats reload failed").count() >= n).then_some(log)
        })
        .await
        .expect("the refused reload is logged")
    };

    let with_daily = base.clone()
        + "[[formats]]\nname = \"daily\"\ntemplate = \"{yyyy}{MM}{dd}{seq:4}\"\nreset = \"day\"\n";
    std::fs::write(&config, &with_daily).unwrap();
    hup();
    let daily = eventually(10, async || gen(&node, "daily", 1).await.ok()).await;
    assert!(
        daily.is_some(),
        "new entry served after SIGHUP: {}",
        node.log_text()
    );

    // The Lua rule's code changed in the file: refused, naming the entry
    // and the field; the rule in use goes on without a repeat.
    std::fs::write(&config, with_daily.replace(&lua("A"), &lua("B"))).unwrap();
    hup();
    let logged = failed(1).await;
    assert!(
        logged.contains("entry 1")
            && logged.contains("o2o")
            && logged.contains("lua cannot change"),
        "{logged}"
    );
    let after = gen(&node, "o2o", 3).await.unwrap();
    assert!(after.iter().all(|id| id.starts_with('A')), "{after:?}");
    all_new(&mut seen, &after);

    // The template of a stored format changed in the file: refused.
    std::fs::write(&config, with_daily.replace("{seq:4}", "{seq:5}")).unwrap();
    hup();
    let logged = failed(2).await;
    assert!(
        logged.contains("daily") && logged.contains("template"),
        "{logged}"
    );
    assert!(gen(&node, "daily", 1).await.is_ok());
    all_new(&mut seen, &gen(&node, "o2o", 1).await.unwrap());
    let metrics = reqwest::get(format!("http://{}/metrics", node.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("idgen_format_reloads_total{trigger=\"sighup\",result=\"error\"} 2")
            || metrics
                .contains("idgen_format_reloads_total{result=\"error\",trigger=\"sighup\"} 2"),
        "{metrics}"
    );
    assert_eq!(node.terminate().code(), Some(0));

    // A restart with the refused entry still in the file does not start,
    // naming the format, the field and both definitions.
    let refused = ChildServer::try_start(&config, &[]).err().expect("refused");
    assert!(
        refused.contains("daily") && refused.contains("template") && refused.contains("Stored"),
        "{refused}"
    );
}

/// The reported case, on the embedded store through the admin API: a Lua
/// rule rendering `L%06d` issues 200 IDs; an update to `counter - 150`
/// (which would hand 150 of them out again) is refused naming the field
/// and the way out, and 200 more IDs repeat none. A description change
/// and a larger max pass; a smaller max does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lua_code_update_is_refused_and_the_counter_goes_on_without_repeats() {
    let dir = tempfile::tempdir().unwrap();
    let node = ChildServer::start(&embedded_config(dir.path(), ""));
    let mut a = admin(&node).await;
    let rule = l_rule("l", 0);
    a.create_format(create(&rule)).await.unwrap();
    let mut seen = HashSet::new();
    all_new(&mut seen, &gen(&node, "l", 200).await.unwrap());
    let refused = a
        .update_format(update(&l_rule("l", 150)))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("lua cannot change")
            && refused
                .message()
                .contains("create a new format (e.g. l-v2)"),
        "{refused:?}"
    );
    let more = gen(&node, "l", 200).await.unwrap();
    assert!(more.iter().all(|id| id.starts_with("L00")), "{more:?}");
    all_new(&mut seen, &more);
    let mut described = rule.clone();
    described.description = "order letters".into();
    a.update_format(update(&described)).await.unwrap();
    all_new(&mut seen, &gen(&node, "l", 10).await.unwrap());

    let mut small = FormatDef::template("grow", "{yyyy}{MM}{dd}{seq:6}", "UTC", Reset::Day);
    small.max = Some(1000);
    a.create_format(create(&small)).await.unwrap();
    let mut grown = HashSet::new();
    all_new(&mut grown, &gen(&node, "grow", 5).await.unwrap());
    let larger = FormatDef {
        max: Some(5000),
        ..small.clone()
    };
    a.update_format(update(&larger)).await.unwrap();
    all_new(&mut grown, &gen(&node, "grow", 5).await.unwrap());
    let shrunk = a
        .update_format(update(&FormatDef {
            max: Some(4000),
            ..small
        }))
        .await
        .unwrap_err();
    assert_eq!(shrunk.code(), Code::InvalidArgument, "{shrunk:?}");
    assert!(shrunk.message().contains("max may only grow"), "{shrunk:?}");
    all_new(&mut grown, &gen(&node, "grow", 5).await.unwrap());
    assert_eq!(node.terminate().code(), Some(0));
}

/// The rule of the reported case: `L` and the counter moved back by
/// `back`, never resetting.
fn l_rule(name: &str, back: u64) -> FormatDef {
    let mut def = FormatDef::template(name, "", "UTC", Reset::Never);
    def.template = None;
    def.reset = None;
    def.lua = Some(format!(
        "function min_counter() return 0 end\nfunction max_counter() return 9999 end\nfunction reset_seconds() return 0 end\nfunction create_id(counter, now, salt) return string.format(\"L%06d\", counter - {back}) end\n"
    ));
    def
}

/// Consul: a format created through node 1 is served by node 2 within a
/// few seconds without a restart, both nodes' IDs are distinct, and a
/// delete through node 2 stops node 1 serving it; the name is then refused
/// on either node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_a_format_created_on_one_node_is_served_by_another() {
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let token = format!("\"{TOKEN}\"");
    let nodes: Vec<ChildServer> = (0..2)
        .map(|i| {
            let path = write_cluster_config(
                dir.path(),
                &format!("n{i}"),
                consul.addr(),
                &[("admin", "token", &token), ("formatted", "block", "5")],
            );
            ChildServer::start(&path)
        })
        .collect();
    let mut a1 = admin(&nodes[0]).await;
    let mut a2 = admin(&nodes[1]).await;
    let shared = FormatDef::template("shared", "{yyyy}{MM}{dd}{seq:8}", "UTC", Reset::Day);
    a1.create_format(create(&shared)).await.unwrap();
    let mut seen = HashSet::new();
    // At once, before node 2's watch can have reloaded: a call naming a
    // format a node does not know has its catalog reload first.
    let on_two = gen(&nodes[1], "shared", 4).await;
    all_new(
        &mut seen,
        &on_two.expect("node 2 serves a format node 1 just created"),
    );
    all_new(&mut seen, &gen(&nodes[0], "shared", 4).await.unwrap());
    for _ in 0..5 {
        for n in &nodes {
            all_new(&mut seen, &gen(n, "shared", 3).await.unwrap());
        }
    }
    let again = a2.create_format(create(&shared)).await.unwrap_err();
    assert_eq!(again.code(), Code::AlreadyExists);

    // The reported case on Consul: a Lua rule's code update through node
    // 2 is refused, and both nodes go on without a repeat.
    a1.create_format(create(&l_rule("crule", 0))).await.unwrap();
    let mut lua_ids = HashSet::new();
    let on_two = gen(&nodes[1], "crule", 100).await;
    all_new(
        &mut lua_ids,
        &on_two.expect("node 2 serves the rule at once"),
    );
    all_new(&mut lua_ids, &gen(&nodes[0], "crule", 100).await.unwrap());
    let refused = a2
        .update_format(update(&l_rule("crule", 150)))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("lua"), "{refused:?}");
    for n in &nodes {
        all_new(&mut lua_ids, &gen(n, "crule", 100).await.unwrap());
    }

    a2.delete_format(ok(proto::DeleteFormatRequest {
        name: "shared".into(),
    }))
    .await
    .unwrap();
    let gone = eventually(10, async || {
        (gen(&nodes[0], "shared", 1).await.err()?.code() == Code::NotFound).then_some(())
    })
    .await;
    assert!(gone.is_some(), "node 1 stops serving the deleted format");
    let recreate = a1.create_format(create(&shared)).await.unwrap_err();
    assert_eq!(recreate.code(), Code::FailedPrecondition, "{recreate:?}");
    for n in nodes {
        assert_eq!(n.terminate().code(), Some(0));
    }
}

fn lua_def(prefix: &str) -> FormatDef {
    let mut def = FormatDef::template("rule", "", "UTC", Reset::Never);
    def.template = None;
    def.reset = None;
    def.lua = Some(format!(
        "function min_counter() return 0 end\nfunction max_counter() return 9999 end\nfunction reset_seconds() return 0 end\nfunction create_id(counter, now, salt) return string.format(\"{prefix}%09d\", counter) end\n"
    ));
    def
}

/// A serving in-process node, its catalog, and what stops it.
struct InProcess {
    issuer: Arc<Issuer>,
    catalog: Arc<FormatCatalog>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

async fn start_in_process(mut config: Config) -> Result<InProcess, String> {
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    config.node.advertise = Some(grpc.local_addr().unwrap());
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let node = Node::start(config, clock)
        .await
        .map_err(|e| e.to_string())?;
    let issuer = Arc::clone(node.issuer());
    let catalog = Arc::clone(node.format_catalog().expect("formatted mode"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        node.serve(grpc, http, async {
            let _ = stopped.await;
        })
        .await
        .expect("clean stop");
    });
    Ok(InProcess {
        issuer,
        catalog,
        stop,
        task,
    })
}

impl InProcess {
    /// A clean stop; the state file is closed when this returns.
    async fn stop(self) {
        drop(self.issuer);
        drop(self.catalog);
        let _ = self.stop.send(());
        self.task.await.unwrap();
    }
}

fn config_with(dir: &Path, def: FormatDef) -> Config {
    let mut c = test_config(dir);
    c.formatted = FormattedSettings {
        block: 10,
        formats: vec![def],
        ..FormattedSettings::default()
    };
    c
}

async fn one(issuer: &Issuer) -> Result<String, idgen::error::Error> {
    Ok(issuer
        .gen_formatted("rule", &[], 1)
        .await?
        .ids
        .remove(0)
        .text)
}

/// A Lua rule reloaded (UpdateFormat's path: a new description, so a new
/// Lua state) while 8 callers draw IDs: no call fails, no counter value
/// repeats, and every call started after the update returned uses the new
/// definition. Then new code, refused at the update; a broken rule, refused
/// at the update, and one put straight into the store and reloaded: the
/// rule in use keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lua_rule_reloaded_under_load_fails_no_call_and_repeats_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_in_process(config_with(dir.path(), lua_def("A")))
        .await
        .unwrap();
    let (issuer, catalog) = (Arc::clone(&node.issuer), Arc::clone(&node.catalog));
    let running = Arc::new(AtomicBool::new(true));
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let (issuer, running) = (Arc::clone(&issuer), Arc::clone(&running));
            tokio::spawn(async move {
                let mut got = Vec::new();
                // Bounded: at most 1,200 calls per caller, inside the
                // rule's 10,000 counter values.
                for _ in 0..1_200 {
                    if !running.load(Ordering::Relaxed) {
                        break;
                    }
                    got.push(one(&issuer).await.expect("no call fails during the reload"));
                }
                got
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let mut described = lua_def("A");
    described.description = "reloaded".into();
    let (_, reloaded) = catalog.update(described).await.expect("update");
    assert_eq!(reloaded.changed, ["rule"]);
    // Every call after the update returned uses the new definition.
    let served = catalog.formats().get("rule").unwrap();
    assert_eq!(served.def().description, "reloaded");
    tokio::time::sleep(Duration::from_millis(150)).await;
    running.store(false, Ordering::Relaxed);
    let mut values = HashSet::new();
    let mut calls = 0;
    for c in callers {
        for id in c.await.unwrap() {
            assert!(id.starts_with('A'), "{id}");
            assert!(values.insert(id[1..].to_owned()), "counter {id} repeated");
            calls += 1;
        }
    }
    assert!(calls > 0, "calls were made around the reload");

    // New code would render other IDs for the stored counters: refused,
    // naming the field.
    let e = catalog.update(lua_def("B")).await.unwrap_err();
    assert_eq!(e.kind(), idgen::id::ErrorKind::BadRequest, "{e}");
    assert!(e.to_string().contains("lua cannot change"), "{e}");
    assert!(one(&issuer).await.unwrap().starts_with('A'));

    // A broken rule is refused at the update and never served.
    let mut broken = lua_def("B");
    broken.lua = Some("function min_counter() return 0 end\nfunction create_id(".into());
    let e = catalog.update(broken.clone()).await.unwrap_err();
    assert_eq!(e.kind(), idgen::id::ErrorKind::BadRequest, "{e}");
    assert!(one(&issuer).await.unwrap().starts_with('A'));
    // Definitions that reached the store anyway (written by another build
    // or node...): new code that compiles is refused by the same rule when
    // the reload compares it with the one served; broken code fails to
    // compile. Each reload fails naming the format, and the rule in use
    // keeps serving.
    for (written, why) in [(lua_def("B"), "lua cannot change"), (broken, "")] {
        catalog
            .store()
            .change(
                "rule",
                Arc::new(move |r: &StoredFormat| {
                    Ok(StoredFormat {
                        def: written.clone(),
                        ..r.clone()
                    })
                }),
            )
            .await
            .unwrap();
        let failed = catalog.reload("admin").await.unwrap_err();
        assert_eq!(failed.format.as_deref(), Some("rule"), "{failed}");
        assert!(failed.to_string().contains(why), "{failed}");
        assert!(one(&issuer).await.unwrap().starts_with('A'));
    }
    let after = one(&issuer).await.expect("the old rule still serves");
    assert!(after.starts_with('A'), "{after}");
    assert!(values.insert(after[1..].to_owned()), "{after} repeated");
    drop((issuer, catalog));
    node.stop().await;
}

/// A config file entry that differs from the stored definition in a way
/// that could repeat IDs stops the start, naming the entry, the field and
/// both definitions; one that differs only in what may change updates the
/// stored definition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_entry_must_agree_with_the_stored_definition() {
    let dir = tempfile::tempdir().unwrap();
    let with = |def: FormatDef| config_with(dir.path(), def);
    let node = start_in_process(with(orders())).await.unwrap();
    let stored = node.catalog.store().get("orders").await.unwrap();
    assert_eq!(stored.unwrap().source.as_str(), "config");
    node.stop().await;
    let mut wider = orders();
    wider.template = Some("{yyyy}{MM}{dd}{seq:8}".into());
    let e = match start_in_process(with(wider)).await {
        Err(e) => e,
        Ok(_) => panic!("a changed template must be refused"),
    };
    assert!(
        e.contains("entry 1")
            && e.contains("template")
            && e.contains("{seq:6}")
            && e.contains("{seq:8}"),
        "{e}"
    );
    let mut described = orders();
    described.description = "now with a description".into();
    // A failed in-process start drops its store on its own threads a
    // moment later (a real process exits): wait for the file to be free.
    let mut node = None;
    for _ in 0..50 {
        match start_in_process(with(described.clone())).await {
            Ok(n) => {
                node = Some(n);
                break;
            }
            Err(e) if e.contains("open in another idgen process") => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    let node = node.expect("the state file is free within 5 s");
    let stored = node.catalog.store().get("orders").await.unwrap().unwrap();
    assert_eq!(stored.def.description, "now with a description");
    node.stop().await;
}

/// A client that gives up while its `CreateFormat` is still compiling (a
/// Lua rule's load-time checks run it thousands of times) does not leave
/// the format stored but unserved: the change runs to its end on its own
/// task, and the node serves the format without a reload or a restart.
///
/// The client gives up only once the node is compiling the rule (a new
/// compile thread shows in `/proc`): a deadline the client sets may run out
/// before the node even reads the request on a loaded machine, and the
/// start-up table's compile thread can still be there after "ready"; in
/// either case there is no create to finish.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_caller_gave_up_is_still_served() {
    let dir = tempfile::tempdir().unwrap();
    let config = embedded_config(dir.path(), "");
    let node = ChildServer::start(&config);
    let mut a = admin(&node).await;
    // A rule that costs a few hundred instructions a call, so that its
    // load-time checks keep the compile thread busy long enough to be seen.
    let mut def = l_rule("gaveup", 0);
    def.lua = def.lua.map(|l| {
        l.replace(
            "function create_id(counter, now, salt) return",
            "function create_id(counter, now, salt) local x = 0 for i = 1, 300 do x = x + i end return",
        )
    });
    // The thread that compiled the (empty) start-up table can outlive the
    // "ready" line on a loaded machine: only a compile thread started after
    // this moment is the create's.
    let pid = node.child.id();
    let before = compile_threads(pid);
    let call = tokio::spawn(async move { a.create_format(create(&def)).await });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if call.is_finished() || !compile_threads(pid).is_subset(&before) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the node did not start compiling the rule within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Dropping the call resets the stream: the node drops the handler.
    call.abort();
    let gave_up = call.await;
    assert!(
        gave_up.as_ref().is_err_and(|e| e.is_cancelled()),
        "the create finished before its caller gave up: the test proves nothing; {gave_up:?}"
    );
    // The create compiles the rule twice (checked, then installed): the
    // bound is generous, the assertion is only that it ends served.
    let mut last = None;
    let served = eventually(120, async || match gen(&node, "gaveup", 2).await {
        Ok(ids) => Some(ids),
        Err(e) => {
            last = Some(e);
            None
        }
    })
    .await;
    let ids = served.unwrap_or_else(|| {
        panic!(
            "the created format was never served; last answer {last:?}; node log:\n{}",
            node.log_text()
        )
    });
    assert_eq!(ids.len(), 2, "{ids:?}");
}

/// The thread ids of process `pid`'s threads compiling formats.
#[cfg(target_os = "linux")]
fn compile_threads(pid: u32) -> HashSet<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return HashSet::new();
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.trim() == idgen::modes::formatted::COMPILE_THREAD)
        })
        .map(|t| t.file_name().to_string_lossy().into_owned())
        .collect()
}
