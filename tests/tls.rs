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

    let text = https_get(server.http, &cert.der, "/metrics").await;
    let grpc_failures =
        metric(&text, "idgen_tls_handshake_failures_total{port=\"grpc\"}").unwrap_or(0.0);
    let http_failures =
        metric(&text, "idgen_tls_handshake_failures_total{port=\"http\"}").unwrap_or(0.0);
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
        config.server.tls = Some(TlsSettings { cert, key });
        async move {
            match idgen::server::Node::start(config, std::sync::Arc::new(SystemClock)).await {
                Ok(_) => panic!("a node with bad TLS files must not start"),
                Err(e) => e.to_string(),
            }
        }
    };
    let mismatched = start(a.cert.clone(), b.key.clone()).await;
    assert!(mismatched.contains("does not fit"), "{mismatched}");
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
