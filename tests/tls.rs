//! TLS on the gRPC and HTTP ports: handshakes and calls, plaintext refused,
//! bad certificate files refused at start, the plaintext-on-the-network rule.

mod common;

use common::tls::{grpc_client, https_get, server_cert};
use common::{metric, test_config, TestServer};
use idgen::config::{FileConfig, TlsSettings};
use idgen::id::{Clock, SystemClock};
use idgen::proto::GenIdRequest;

fn tls_config(dir: &std::path::Path, cert: &common::tls::ServerCert) -> idgen::config::Config {
    let mut config = test_config(dir);
    config.server.tls = Some(TlsSettings {
        cert: cert.cert.clone(),
        key: cert.key.clone(),
        client_ca: None,
        client_required: false,
    });
    config
}

#[tokio::test]
async fn both_ports_serve_tls_and_refuse_plaintext() {
    let dir = tempfile::tempdir().unwrap();
    let cert = server_cert(dir.path(), "server");
    let server = TestServer::start(tls_config(dir.path(), &cert)).await;

    // gRPC over TLS (ALPN h2).
    let mut client = grpc_client(server.grpc, &cert.der)
        .await
        .expect("TLS connect");
    let mut last = 0;
    for _ in 0..20 {
        let id = client
            .gen_id(GenIdRequest::default())
            .await
            .expect("GenId over TLS")
            .into_inner()
            .id;
        assert!(id > last, "IDs increase over one TLS connection");
        last = id;
    }

    // HTTP over TLS.
    let health = https_get(server.http, &cert.der, "/healthz").await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");

    // A plaintext gRPC client gets no answer from a TLS port.
    let plain = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        let mut c =
            idgen::proto::id_gen_client::IdGenClient::connect(format!("http://{}", server.grpc))
                .await?;
        c.gen_id(GenIdRequest::default())
            .await
            .map_err(Into::into)
            .map(|_| ())
    })
    .await
    .expect("plaintext attempt ends in time");
    let plain: Result<(), Box<dyn std::error::Error>> = plain;
    assert!(
        plain.is_err(),
        "plaintext gRPC against a TLS port must fail"
    );

    // A plaintext HTTP request gets no HTTP answer either.
    let res = reqwest::Client::new()
        .get(format!("http://{}/healthz", server.http))
        .timeout(std::time::Duration::from_secs(10))
        .send()
        .await;
    assert!(
        res.is_err(),
        "plaintext HTTP against a TLS port must fail: {res:?}"
    );

    // A client that does not trust the certificate is refused.
    let other = server_cert(dir.path(), "other");
    assert!(grpc_client(server.grpc, &other.der).await.is_err());

    // The server counts a failure when it has read the client's alert,
    // which may be after the client gave up: look again, boundedly.
    let (mut grpc_failures, mut http_failures) = (0.0, 0.0);
    for _ in 0..50 {
        let text = https_get(server.http, &cert.der, "/metrics").await;
        let count = |port: &str| {
            metric(
                &text,
                &format!("idgen_tls_handshake_failures_total{{port=\"{port}\"}}"),
            )
            .unwrap_or(0.0)
        };
        (grpc_failures, http_failures) = (count("grpc"), count("http"));
        if grpc_failures >= 2.0 && http_failures >= 1.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        grpc_failures >= 2.0,
        "plaintext and untrusting clients counted: {grpc_failures}"
    );
    assert!(
        http_failures >= 1.0,
        "plaintext HTTP counted: {http_failures}"
    );
    server.stop().await;
}

#[tokio::test]
async fn wrong_or_missing_files_stop_the_node_with_the_key_named() {
    let dir = tempfile::tempdir().unwrap();
    let a = server_cert(dir.path(), "a");
    let b = server_cert(dir.path(), "b");
    let start = |cert: std::path::PathBuf, key: std::path::PathBuf| {
        let mut config = test_config(dir.path());
        config.server.tls = Some(TlsSettings {
            cert,
            key,
            client_ca: None,
            client_required: false,
        });
        async move {
            match idgen::node::Node::start(config, std::sync::Arc::new(SystemClock)).await {
                Ok(_) => panic!("a node with bad TLS files must not start"),
                Err(e) => e.to_string(),
            }
        }
    };
    let mismatched = start(a.cert.clone(), b.key.clone()).await;
    assert!(
        mismatched.contains("the private key is not the key of the (first) certificate"),
        "{mismatched}"
    );
    let missing = start(dir.path().join("nope.crt"), a.key.clone()).await;
    assert!(
        missing.contains("server.tls.cert") && missing.contains("nope.crt"),
        "{missing}"
    );
    let not_a_key = start(a.cert.clone(), a.cert.clone()).await;
    assert!(not_a_key.contains("server.tls.key"), "{not_a_key}");
    let not_a_cert = start(a.key.clone(), a.key.clone()).await;
    assert!(not_a_cert.contains("server.tls.cert"), "{not_a_cert}");
}

#[test]
fn plaintext_beyond_loopback_needs_insecure() {
    let now = SystemClock.now_millis();
    let mut f = FileConfig::default();
    f.server.grpc_listen = "0.0.0.0:50051".into();
    let err = f.validate(now).unwrap_err().to_string();
    assert!(
        err.contains("server.insecure") && err.contains("server.tls.cert"),
        "{err}"
    );

    let mut f = FileConfig::default();
    f.server.http_listen = "[::]:9464".into();
    assert!(f.validate(now).is_err(), "the HTTP port counts too");

    f.server.insecure = true;
    let c = f.validate(now).expect("insecure allows it");
    assert!(c.server.insecure);

    let mut f = FileConfig::default();
    f.server.grpc_listen = "0.0.0.0:50051".into();
    f.server.tls.cert = "/etc/idgen/tls.crt".into();
    f.server.tls.key = "/etc/idgen/tls.key".into();
    let c = f.validate(now).expect("TLS allows it");
    assert!(!c.server.insecure);

    // Loopback stays plaintext by default, and not flagged.
    let c = FileConfig::default().validate(now).unwrap();
    assert!(c.server.tls.is_none() && !c.server.insecure);

    let mut f = FileConfig::default();
    f.server.tls.cert = "/etc/idgen/tls.crt".into();
    let err = f.validate(now).unwrap_err().to_string();
    assert!(err.contains("server.tls.key"), "{err}");
}

#[test]
fn client_certificate_settings_need_a_client_ca() {
    let now = SystemClock.now_millis();
    let with_tls = || {
        let mut f = FileConfig::default();
        f.server.tls.cert = "/etc/idgen/tls.crt".into();
        f.server.tls.key = "/etc/idgen/tls.key".into();
        f
    };
    let mut f = with_tls();
    f.server.tls.client_required = true;
    let err = f.validate(now).unwrap_err().to_string();
    assert!(
        err.contains("server.tls.client_required") && err.contains("client_ca"),
        "{err}"
    );

    let mut f = with_tls();
    f.admin.client_cert_names = vec!["ops-admin".into()];
    let err = f.validate(now).unwrap_err().to_string();
    assert!(err.contains("admin.client_cert_names"), "{err}");

    let mut f = FileConfig::default();
    f.admin.client_cert_names = vec!["ops-admin".into()];
    assert!(f.validate(now).is_err(), "names without TLS are refused");

    let mut f = with_tls();
    f.server.tls.client_ca = "/etc/idgen/clients-ca.crt".into();
    f.admin.client_cert_names = vec!["ops-admin".into(), " ".into()];
    let err = f.validate(now).unwrap_err().to_string();
    assert!(err.contains("empty name"), "{err}");
    f.admin.client_cert_names.pop();
    let c = f.validate(now).expect("valid");
    assert_eq!(c.admin.client_cert_names, vec!["ops-admin".to_owned()]);
    assert!(c.server.tls.unwrap().client_ca.is_some());
}

/// Runs the CLI off the runtime's threads.
async fn cli(args: Vec<String>) -> (bool, String) {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        common::run_idgen(&args)
    })
    .await
    .unwrap()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// `--tls-server-name`: a node whose certificate names only a host, dialled
/// by IP address as discovery dials it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_checks_a_named_certificate_with_tls_server_name() {
    let dir = tempfile::tempdir().unwrap();
    let cert = common::tls::self_signed_cert(dir.path(), "named", &["idgen.test"]);
    let node = TestServer::start(tls_config(dir.path(), &cert)).await;
    let addr = format!("https://127.0.0.1:{}", node.grpc.port());
    let ca = cert.cert.to_str().unwrap().to_owned();
    let gen = |extra: &[&str]| {
        let mut a = args(&["gen", "--addr", &addr, "--ca", &ca, "-n", "3"]);
        a.extend(args(extra));
        cli(a)
    };

    let (ok, out) = gen(&[]).await;
    assert!(!ok, "127.0.0.1 is not in the certificate: {out}");
    assert!(
        out.contains("not trusted") && out.contains("--tls-server-name"),
        "the error names the flag that fixes it: {out}"
    );

    let (ok, out) = gen(&["--tls-server-name", "idgen.test"]).await;
    assert!(ok, "--tls-server-name idgen.test: {out}");
    let ids: Vec<u64> = out
        .lines()
        .map(|l| l.trim().parse().expect("an ID per line"))
        .collect();
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");

    // A name the certificate does not carry is checked, not ignored.
    let (ok, out) = gen(&["--tls-server-name", "other.test"]).await;
    assert!(!ok && out.contains("not trusted"), "{out}");

    let (ok, out) = gen(&["--tls-server-name", "not a name!"]).await;
    assert!(
        !ok && out.contains("--tls-server-name") && out.contains("not a DNS name"),
        "a name that cannot be one is refused, naming the flag: {out}"
    );

    // Without --ca the flag has nothing to check with.
    let (ok, out) = cli(args(&[
        "gen",
        "--addr",
        &addr,
        "--tls-server-name",
        "idgen.test",
    ]))
    .await;
    assert!(!ok && out.contains("--ca"), "{out}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_speaks_tls_and_names_the_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let cert = server_cert(dir.path(), "server");
    let ca = cert.cert.to_str().unwrap().to_owned();
    let mut config = tls_config(dir.path(), &cert);
    config.admin.token = Some(idgen::config::AdminToken("s3cret-admin-token".into()));
    let tls = TestServer::start(config).await;
    let plain_dir = tempfile::tempdir().unwrap();
    let plain = TestServer::start(test_config(plain_dir.path())).await;
    let https = format!("https://localhost:{}", tls.grpc.port());

    // gen and admin over TLS.
    let (ok, out) = cli(args(&["gen", "--addr", &https, "--ca", &ca, "-n", "3"])).await;
    assert!(ok, "{out}");
    let ids: Vec<u64> = out
        .lines()
        .map(|l| l.trim().parse().expect("an ID per line"))
        .collect();
    assert_eq!(ids.len(), 3);
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    let (ok, out) = cli(args(&[
        "admin",
        "--addr",
        &https,
        "--ca",
        &ca,
        "--token",
        "s3cret-admin-token",
        "holders",
    ]))
    .await;
    assert!(ok, "{out}");

    // https:// without --ca says what to give.
    let (ok, out) = cli(args(&["gen", "--addr", &https])).await;
    assert!(!ok && out.contains("--ca"), "{out}");

    // https:// against a plaintext node: fails, saying it serves plaintext.
    let to_plain = format!("https://localhost:{}", plain.grpc.port());
    let (ok, out) = cli(args(&["gen", "--addr", &to_plain, "--ca", &ca])).await;
    assert!(!ok, "https:// against plaintext must fail: {out}");
    assert!(
        out.contains("does not speak TLS") && out.contains("http://"),
        "{out}"
    );

    // http:// against a TLS node: fails, saying the node speaks TLS.
    let http = format!("http://127.0.0.1:{}", tls.grpc.port());
    let (ok, out) = cli(args(&["gen", "--addr", &http])).await;
    assert!(!ok, "plaintext against TLS must fail: {out}");
    assert!(
        out.contains("speaks TLS") && out.contains("https://"),
        "{out}"
    );

    // A CA that did not sign the node's certificate.
    let other = server_cert(dir.path(), "other");
    let (ok, out) = cli(args(&[
        "gen",
        "--addr",
        &https,
        "--ca",
        other.cert.to_str().unwrap(),
    ]))
    .await;
    assert!(!ok && out.contains("not trusted"), "{out}");

    tls.stop().await;
    plain.stop().await;
}

fn mtls_config(
    dir: &std::path::Path,
    cert: &common::tls::ServerCert,
    ca: &common::tls::Ca,
    required: bool,
) -> idgen::config::Config {
    let mut config = test_config(dir);
    config.server.tls = Some(TlsSettings {
        cert: cert.cert.clone(),
        key: cert.key.clone(),
        client_ca: Some(ca.cert.clone()),
        client_required: required,
    });
    config
}

/// A GenId over a fresh connection, or why it failed.
async fn gen_once(
    connected: Result<
        idgen::proto::id_gen_client::IdGenClient<tonic::transport::Channel>,
        tonic::transport::Error,
    >,
) -> Result<u64, String> {
    let mut c = connected.map_err(|e| format!("connect: {e:?}"))?;
    c.gen_id(GenIdRequest::default())
        .await
        .map(|r| r.into_inner().id)
        .map_err(|s| format!("call: {s:?}"))
}

#[tokio::test]
async fn mtls_required_refuses_a_missing_or_wrong_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let cert = server_cert(dir.path(), "server");
    let ca = common::tls::ca(dir.path(), "clients");
    let rogue = common::tls::ca(dir.path(), "rogue");
    let good = common::tls::client_cert(dir.path(), &ca, "app-1", &[]);
    let bad = common::tls::client_cert(dir.path(), &rogue, "app-2", &[]);
    let server = TestServer::start(mtls_config(dir.path(), &cert, &ca, true)).await;

    let ok = gen_once(
        common::tls::grpc_client_with_cert(server.grpc, &cert.der, (&good.0, &good.1)).await,
    )
    .await;
    assert!(
        ok.is_ok(),
        "a certificate from client_ca is accepted: {ok:?}"
    );
    let none = gen_once(grpc_client(server.grpc, &cert.der).await).await;
    assert!(none.is_err(), "no client certificate must be refused");
    let wrong = gen_once(
        common::tls::grpc_client_with_cert(server.grpc, &cert.der, (&bad.0, &bad.1)).await,
    )
    .await;
    assert!(
        wrong.is_err(),
        "a certificate from another CA must be refused"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_needs_an_allowed_client_certificate_and_the_token_when_set() {
    let dir = tempfile::tempdir().unwrap();
    let cert = server_cert(dir.path(), "server");
    let ca = common::tls::ca(dir.path(), "clients");
    let (ops_c, ops_k) = common::tls::client_cert(dir.path(), &ca, "ops-admin", &[]);
    let (san_c, san_k) = common::tls::client_cert(dir.path(), &ca, "someone", &["ops.example.org"]);
    let (app_c, app_k) = common::tls::client_cert(dir.path(), &ca, "app-1", &["app.example.org"]);
    let names = vec!["ops-admin".to_owned(), "ops.example.org".to_owned()];
    let server_ca = cert.cert.to_str().unwrap().to_owned();
    let p = |p: &std::path::PathBuf| p.to_str().unwrap().to_owned();

    // Certificate only: no token configured.
    let mut config = mtls_config(dir.path(), &cert, &ca, false);
    config.admin.client_cert_names = names.clone();
    let only_cert = TestServer::start(config).await;
    let addr = format!("https://localhost:{}", only_cert.grpc.port());
    let admin = |extra: &[String]| {
        let mut a = args(&["admin", "--addr", &addr, "--ca", &server_ca]);
        a.extend_from_slice(extra);
        a.push("holders".into());
        a
    };
    let (ok, out) = cli(admin(&[
        "--cert".into(),
        p(&ops_c),
        "--key".into(),
        p(&ops_k),
    ]))
    .await;
    assert!(ok, "CN in the list: {out}");
    let (ok, out) = cli(admin(&[
        "--cert".into(),
        p(&san_c),
        "--key".into(),
        p(&san_k),
    ]))
    .await;
    assert!(ok, "SAN in the list: {out}");
    let (ok, out) = cli(admin(&[
        "--cert".into(),
        p(&app_c),
        "--key".into(),
        p(&app_k),
    ]))
    .await;
    assert!(
        !ok && out.contains("PERMISSION_DENIED") && out.contains("admin.client_cert_names"),
        "{out}"
    );
    let (ok, out) = cli(admin(&[])).await;
    assert!(
        !ok && out.contains("UNAUTHENTICATED") && out.contains("client certificate"),
        "{out}"
    );
    // ID calls need no certificate when it is optional.
    let plain_tls = gen_once(grpc_client(only_cert.grpc, &cert.der).await).await;
    assert!(plain_tls.is_ok(), "{plain_tls:?}");
    only_cert.stop().await;

    // Certificate and token: both needed.
    let dir2 = tempfile::tempdir().unwrap();
    let mut config = mtls_config(dir2.path(), &cert, &ca, false);
    config.admin.client_cert_names = names;
    config.admin.token = Some(idgen::config::AdminToken("t0ken-for-admin".into()));
    let both = TestServer::start(config).await;
    let addr = format!("https://localhost:{}", both.grpc.port());
    let admin = |extra: &[String]| {
        let mut a = args(&["admin", "--addr", &addr, "--ca", &server_ca]);
        a.extend_from_slice(extra);
        a.push("holders".into());
        a
    };
    let cert_args = ["--cert".to_owned(), p(&ops_c), "--key".into(), p(&ops_k)];
    let token_args = ["--token".to_owned(), "t0ken-for-admin".into()];
    let (ok, out) = cli(admin(&cert_args)).await;
    assert!(
        !ok && out.contains("UNAUTHENTICATED"),
        "certificate without token: {out}"
    );
    let (ok, out) = cli(admin(&token_args)).await;
    assert!(
        !ok && out.contains("UNAUTHENTICATED"),
        "token without certificate: {out}"
    );
    let (ok, out) = cli(admin(&[cert_args.to_vec(), token_args.to_vec()].concat())).await;
    assert!(ok, "certificate and token: {out}");
    both.stop().await;
}

/// Replaces `dst`'s certificate files by `src`'s, each by an atomic rename.
fn install(src: &common::tls::ServerCert, dst: &common::tls::ServerCert) {
    for (from, to) in [(&src.key, &dst.key), (&src.cert, &dst.cert)] {
        let tmp = to.with_extension("tmp");
        std::fs::copy(from, &tmp).unwrap();
        std::fs::rename(&tmp, to).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_reload_keeps_open_connections_and_serves_the_new_one() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let live = server_cert(dir.path(), "live");
    let old = server_cert(dir.path(), "old");
    let new = server_cert(dir.path(), "new");
    install(&old, &live);
    let server = TestServer::start(tls_config(dir.path(), &live)).await;

    // One connection trusting both certificates; the connector counts how
    // often it dials, so a dropped connection would show.
    let dials = Arc::new(AtomicUsize::new(0));
    let config = common::tls::client_config(&[old.der.clone(), new.der.clone()], &[b"h2"]);
    let addr = server.grpc;
    let counter = Arc::clone(&dials);
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: hyper::Uri| {
            let config = Arc::clone(&config);
            counter.fetch_add(1, Ordering::SeqCst);
            async move {
                common::tls::connect(addr, config)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await
        .unwrap();
    let mut kept = idgen::proto::id_gen_client::IdGenClient::new(channel);
    let mut last = 0;
    let mut call = async |kept: &mut idgen::proto::id_gen_client::IdGenClient<_>| {
        let id = kept
            .gen_id(GenIdRequest::default())
            .await
            .expect("call on the kept connection")
            .into_inner()
            .id;
        assert!(id > last);
        last = id;
    };
    call(&mut kept).await;

    install(&new, &live);
    // New connections get the new certificate within a bounded wait,
    // while the kept connection goes on calling.
    let mut switched = false;
    for _ in 0..100 {
        call(&mut kept).await;
        if gen_once(grpc_client(server.grpc, &new.der).await)
            .await
            .is_ok()
        {
            switched = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        switched,
        "no new connection saw the new certificate within 10 s"
    );
    assert!(
        gen_once(grpc_client(server.grpc, &old.der).await)
            .await
            .is_err(),
        "the old certificate is no longer served"
    );
    for _ in 0..5 {
        call(&mut kept).await;
    }
    assert_eq!(
        dials.load(Ordering::SeqCst),
        1,
        "the kept connection was never dropped"
    );

    // A broken file: the reload fails, is counted, and the new certificate
    // stays in use.
    std::fs::write(&live.cert, "not a certificate").unwrap();
    let mut counted = false;
    for _ in 0..100 {
        let text = https_get(server.http, &new.der, "/metrics").await;
        if metric(&text, "idgen_tls_reloads_total{result=\"error\"}").unwrap_or(0.0) >= 1.0 {
            assert!(metric(&text, "idgen_tls_reloads_total{result=\"ok\"}").unwrap_or(0.0) >= 1.0);
            counted = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(counted, "the failed reload was not counted within 10 s");
    let still = gen_once(grpc_client(server.grpc, &new.der).await).await;
    assert!(
        still.is_ok(),
        "a failed reload keeps the certificate in use: {still:?}"
    );
    call(&mut kept).await;
    assert_eq!(dials.load(Ordering::SeqCst), 1);
    server.stop().await;
}

#[tokio::test]
async fn allow_lists_refuse_other_peers_on_both_ports_and_admin() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    config.server.allow =
        idgen::config::AllowList::parse(&["10.0.0.0/8".into(), "fd00::/8".into()]).unwrap();
    let server = TestServer::start(config).await;
    let mut c = server.client().await;
    let s = c.gen_id(GenIdRequest::default()).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::PermissionDenied);
    assert!(
        s.message().contains("127.0.0.1") && s.message().contains("server.allow"),
        "{s:?}"
    );
    let r = reqwest::get(server.url("/healthz")).await.unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.headers()["x-idgen-error"]
        .to_str()
        .unwrap()
        .contains("server.allow"));
    // /metrics is refused too: the counts are read from the next node.
    server.stop().await;

    // Loopback allowed on the ports, but not for admin calls.
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    config.server.allow =
        idgen::config::AllowList::parse(&["127.0.0.0/8".into(), "::1".into()]).unwrap();
    config.admin.allow = idgen::config::AllowList::parse(&["::1/128".into()]).unwrap();
    config.admin.token = Some(idgen::config::AdminToken("tok".into()));
    let server = TestServer::start(config).await;
    let mut c = server.client().await;
    c.gen_id(GenIdRequest::default())
        .await
        .expect("127.0.0.1 is in server.allow");
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut admin = idgen::proto::admin_client::AdminClient::new(channel);
    let mut req = tonic::Request::new(idgen::proto::ListHoldersRequest::default());
    req.metadata_mut()
        .insert("authorization", "Bearer tok".parse().unwrap());
    let s = admin.list_holders(req).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::PermissionDenied);
    assert!(
        s.message().contains("admin.allow") && s.message().contains("127.0.0.1"),
        "{s:?}"
    );
    let text = reqwest::get(server.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        metric(
            &text,
            "idgen_peer_refusals_total{port=\"grpc\",list=\"admin\"}"
        ),
        Some(1.0)
    );
    // The first node's refusals, in this process's one metrics registry.
    for port in ["grpc", "http"] {
        let n = metric(
            &text,
            &format!("idgen_peer_refusals_total{{port=\"{port}\",list=\"server\"}}"),
        );
        assert!(n.unwrap_or(0.0) >= 1.0, "{port}: {n:?}");
    }
    server.stop().await;
}

#[test]
fn allow_lists_must_be_networks() {
    let now = SystemClock.now_millis();
    let mut f = FileConfig::default();
    f.server.allow = vec!["10.0.0.0/33".into()];
    let err = f.validate(now).unwrap_err().to_string();
    assert!(
        err.contains("server.allow") && err.contains("prefix"),
        "{err}"
    );
    let mut f = FileConfig::default();
    f.admin.allow = vec!["office".into()];
    let err = f.validate(now).unwrap_err().to_string();
    assert!(err.contains("admin.allow"), "{err}");
}

/// A self-signed certificate for localhost valid until midnight UTC of
/// `year`-01-01, written over `cert`/`key`; returns its DER.
fn cert_until(
    year: i32,
    cert: &std::path::Path,
    key: &std::path::Path,
) -> tokio_rustls::rustls::pki_types::CertificateDer<'static> {
    let mut params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .unwrap();
    params.not_after = rcgen::date_time_ymd(year, 1, 1);
    let pair = rcgen::KeyPair::generate().unwrap();
    let c = params.self_signed(&pair).unwrap();
    for (path, text) in [(key, pair.serialize_pem()), (cert, c.pem())] {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }
    c.der().clone()
}

/// `idgen_tls_cert_not_after_seconds{listener}` is the served
/// certificate's not-after on both ports from the start, and follows a
/// reload (a child process: the gauge is process-wide).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_certificate_expiry_gauge_follows_a_reload() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("node.pem"), dir.path().join("node-key.pem"));
    let first = cert_until(2030, &cert, &key);
    let config = common::write_child_config(dir.path(), true);
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!(
        "[server.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        cert.display(),
        key.display()
    ));
    std::fs::write(&config, text).unwrap();
    let node = common::ChildServer::start(&config);
    const Y2030: f64 = 1_893_456_000.0;
    const Y2031: f64 = 1_924_992_000.0;
    let scraped = https_get(node.http, &first, "/metrics").await;
    for listener in ["grpc", "http"] {
        let series = format!("idgen_tls_cert_not_after_seconds{{listener=\"{listener}\"}}");
        assert_eq!(
            metric(&scraped, &series),
            Some(Y2030),
            "{series}:\n{scraped}"
        );
    }

    let second = cert_until(2031, &cert, &key);
    let mut seen = None;
    for _ in 0..100 {
        // Trust both: the node may still serve the first certificate.
        let Some(body) = metrics_over_tls(node.http, &[first.clone(), second.clone()]).await else {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        };
        seen = metric(&body, "idgen_tls_cert_not_after_seconds{listener=\"grpc\"}");
        if seen == Some(Y2031) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        seen,
        Some(Y2031),
        "the gauge follows the reloaded certificate"
    );
}

/// GET /metrics over TLS trusting `roots`; `None` if the connection or
/// the request fails (bounded by 5 s).
async fn metrics_over_tls(
    addr: std::net::SocketAddr,
    roots: &[tokio_rustls::rustls::pki_types::CertificateDer<'static>],
) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let config = common::tls::client_config(roots, &[b"http/1.1"]);
    let get = async {
        let mut s = common::tls::connect(addr, config).await.ok()?;
        let req = "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
        s.write_all(req.as_bytes()).await.ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        Some(out)
    };
    tokio::time::timeout(std::time::Duration::from_secs(5), get)
        .await
        .ok()
        .flatten()
}
