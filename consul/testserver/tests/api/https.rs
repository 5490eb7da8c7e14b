//! HTTPS on the agents: the plaintext answer Go's HTTP server gives,
//! `verify_incoming`, and gRPC checks that ask for TLS.

use consul_testserver::{Config, HttpsConfig, TestConsul};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::fast_config;

/// A CA, and a server certificate for `localhost` plus a client
/// certificate, both signed by it; PEM (ca, (cert, key), (cert, key)).
#[allow(clippy::type_complexity)]
fn pki() -> (Vec<u8>, (Vec<u8>, Vec<u8>), (Vec<u8>, Vec<u8>)) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(params, ca_key);
    let leaf = |name: &str| {
        let params = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &issuer).unwrap();
        (cert.pem().into_bytes(), key.serialize_pem().into_bytes())
    };
    (ca.pem().into_bytes(), leaf("localhost"), leaf("client"))
}

async fn https_consul(verify_incoming: bool) -> (TestConsul, Vec<u8>, (Vec<u8>, Vec<u8>)) {
    let (ca, server, client) = pki();
    let consul = TestConsul::start(Config {
        https: Some(HttpsConfig {
            cert_pem: server.0,
            key_pem: server.1,
            client_ca_pem: verify_incoming.then(|| ca.clone()),
        }),
        ..fast_config()
    })
    .await
    .unwrap();
    (consul, ca, client)
}

fn client(ca: &[u8], identity: Option<&(Vec<u8>, Vec<u8>)>) -> reqwest::Client {
    let mut b = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca).unwrap());
    if let Some((cert, key)) = identity {
        let mut pem = cert.clone();
        pem.extend_from_slice(key);
        b = b.identity(reqwest::Identity::from_pem(&pem).unwrap());
    }
    b.build().unwrap()
}

#[tokio::test]
async fn a_plaintext_request_gets_gos_400_and_https_works() {
    let (consul, ca, _) = https_consul(false).await;
    let mut tcp = tokio::net::TcpStream::connect(consul.addr()).await.unwrap();
    tcp.write_all(b"GET /v1/agent/self HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut reply = String::new();
    tcp.read_to_string(&mut reply).await.unwrap();
    assert!(reply.starts_with("HTTP/1.0 400 Bad Request"), "{reply}");
    assert!(
        reply.contains("Client sent an HTTP request to an HTTPS server."),
        "{reply}"
    );
    let url = format!("https://localhost:{}/v1/agent/self", consul.addr().port());
    let r = client(&ca, None).get(&url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    consul.shutdown().await;
}

#[tokio::test]
async fn verify_incoming_refuses_a_client_without_a_certificate() {
    let (consul, ca, identity) = https_consul(true).await;
    let url = format!("https://localhost:{}/v1/agent/self", consul.addr().port());
    assert!(client(&ca, None).get(&url).send().await.is_err());
    let r = client(&ca, Some(&identity)).get(&url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    consul.shutdown().await;
}

#[tokio::test]
async fn a_tls_check_that_skips_verification_is_refused_and_one_that_verifies_is_kept() {
    let (consul, ca, _) = https_consul(false).await;
    let http = client(&ca, None);
    let url = format!(
        "https://localhost:{}/v1/agent/service/register",
        consul.addr().port()
    );
    let check = |skip: bool| {
        serde_json::json!({
            "Name": "idgen", "ID": "idgen-a", "Port": 1,
            "Check": {"CheckID": "c", "GRPC": "127.0.0.1:1/x", "Interval": "10s",
                      "GRPCUseTLS": true, "TLSServerName": "idgen.internal",
                      "TLSSkipVerify": skip},
        })
    };
    let r = http.put(&url).json(&check(true)).send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("TLSSkipVerify"));
    let r = http.put(&url).json(&check(false)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let checks: serde_json::Value = http
        .get(format!(
            "https://localhost:{}/v1/agent/checks",
            consul.addr().port()
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(checks["c"]["GRPCUseTLS"], true, "{checks}");
    assert_eq!(checks["c"]["TLSServerName"], "idgen.internal", "{checks}");
    consul.shutdown().await;
}
