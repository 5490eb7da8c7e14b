//! CORS on the HTTP API (`server.http.cors_allow_origins`, off by
//! default): preflights answered for listed origins and refused naming the
//! setting otherwise, the allowed origin echoed (or `*`), credentials
//! never allowed, the console's `/admin/` API never opened; then a real
//! page on another origin calls two nodes from headless Chromium
//! (`tests/console/cors.test.js`): the node listing the page's origin
//! answers, the node with CORS off is refused by the browser.
//!
//! Needs `node`, `/usr/bin/chromium` and `tests/console/node_modules`
//! (`scripts/setup.sh` installs all three); a missing one fails the test.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{test_config, TestServer};
use idgen::config::CorsOrigins;

/// A node whose browser origins are `origins`.
async fn node(dir: &Path, origins: &[&str]) -> TestServer {
    std::fs::create_dir_all(dir).unwrap();
    let mut config = test_config(dir);
    config.server.cors =
        CorsOrigins::parse(&origins.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap_or_else(|e| panic!("{e}"));
    TestServer::start(config).await
}

fn preflight(url: &str, origin: &str) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .request(reqwest::Method::OPTIONS, url)
        .header("Origin", origin)
        .header("Access-Control-Request-Method", "GET")
        .header("Access-Control-Request-Headers", "x-request-id")
}

fn header(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflights_and_answers_carry_cors_only_for_listed_origins() {
    let dir = tempfile::tempdir().unwrap();
    let page = "http://app.example.test:3000";
    let listed = node(dir.path(), &[page]).await;
    let off = node(&dir.path().join("off"), &[]).await;
    let any = node(&dir.path().join("any"), &["*"]).await;

    // A listed origin: 204 with the origin, GET, the asked header.
    let r = preflight(&listed.url("/v1/ids"), page)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    assert_eq!(
        header(&r, "access-control-allow-origin").as_deref(),
        Some(page)
    );
    assert_eq!(
        header(&r, "access-control-allow-methods").as_deref(),
        Some("GET")
    );
    assert_eq!(
        header(&r, "access-control-allow-headers").as_deref(),
        Some("x-request-id")
    );
    assert_eq!(header(&r, "access-control-allow-credentials"), None);
    let r = reqwest::Client::new()
        .get(listed.url("/v1/ids?count=2"))
        .header("Origin", page)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(
        header(&r, "access-control-allow-origin").as_deref(),
        Some(page)
    );
    assert!(header(&r, "vary").is_some_and(|v| v.contains("Origin")));
    assert_eq!(header(&r, "access-control-allow-credentials"), None);

    // Another origin: refused naming the setting, no CORS header.
    let r = preflight(&listed.url("/v1/id"), "http://evil.example.test")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    assert_eq!(header(&r, "access-control-allow-origin"), None);
    let text = r.text().await.unwrap();
    assert!(
        text.contains("http://evil.example.test")
            && text.contains("server.http.cors_allow_origins"),
        "{text}"
    );
    let r = reqwest::Client::new()
        .get(listed.url("/v1/id"))
        .header("Origin", "http://evil.example.test")
        .send()
        .await
        .unwrap();
    assert_eq!(header(&r, "access-control-allow-origin"), None);

    // Off (the default): a preflight says how to turn it on.
    let r = preflight(&off.url("/v1/ids"), page).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 403);
    let text = r.text().await.unwrap();
    assert!(text.contains("cross-origin calls are off"), "{text}");

    // "*": any origin, still without credentials.
    let r = preflight(&any.url("/v1/decode"), "http://anything.test")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    assert_eq!(
        header(&r, "access-control-allow-origin").as_deref(),
        Some("*")
    );
    assert_eq!(header(&r, "access-control-allow-credentials"), None);

    // The console's API is never opened to other origins.
    for server in [&listed, &any] {
        let r = preflight(&server.url("/admin/api/cluster"), page)
            .send()
            .await
            .unwrap();
        assert_eq!(header(&r, "access-control-allow-origin"), None);
        assert_ne!(r.status().as_u16(), 204);
    }
    for server in [listed, off, any] {
        server.stop().await;
    }
}

fn console_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/console")
}

/// A free port for the page (held until the script binds it itself).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_on_a_listed_origin_calls_the_api_from_chromium_and_others_are_refused() {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let setup =
        "run scripts/setup.sh (it installs Debian's chromium and `npm ci` in tests/console)";
    assert!(
        Path::new(&chromium).exists(),
        "{chromium} is missing: {setup}"
    );
    assert!(
        console_dir()
            .join("node_modules/playwright-core/package.json")
            .exists(),
        "tests/console/node_modules/playwright-core is missing: {setup}"
    );
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let origin = format!("http://127.0.0.1:{port}");
    let open = node(dir.path(), &[origin.as_str()]).await;
    let closed = node(&dir.path().join("closed"), &[]).await;
    let (open_url, closed_url) = (open.url(""), closed.url(""));
    let out = tokio::task::spawn_blocking(move || {
        let mut child = Command::new("node")
            .arg("cors.test.js")
            .current_dir(console_dir())
            .env("IDGEN_OPEN", open_url)
            .env("IDGEN_CLOSED", closed_url)
            .env("IDGEN_PAGE_PORT", port.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run node");
        let deadline = Instant::now() + Duration::from_secs(120);
        while child.try_wait().expect("wait").is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("the browser script ran for over 120 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        child.wait_with_output().expect("output")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "cors.test.js failed: {stdout}");
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("result: "))
        .unwrap_or_else(|| panic!("no result line: {stdout}"));
    let r: serde_json::Value = serde_json::from_str(line).unwrap();
    for (name, count) in [("open", 3), ("open_preflight", 2)] {
        assert_eq!(r[name]["status"], 200, "{name}: {r}");
        let body: serde_json::Value =
            serde_json::from_str(r[name]["body"].as_str().unwrap_or("")).unwrap();
        assert_eq!(
            body["ids"].as_array().map(Vec::len),
            Some(count),
            "{name}: {r}"
        );
    }
    for name in ["closed", "closed_preflight"] {
        assert!(
            r[name]["error"]
                .as_str()
                .is_some_and(|e| e.contains("Failed to fetch")),
            "{name}: the browser let the page read a node with CORS off: {r}"
        );
    }
    open.stop().await;
    closed.stop().await;
}
