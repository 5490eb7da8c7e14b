//! Unary GenId over TLS against plaintext, in one run, with the same load
//! generator (`idgen_loadgen`), and the cost of a TLS handshake.
//!
//! Two idgen nodes run in this process, each on its own 2-thread runtime
//! and thread: one plaintext, one serving TLS 1.3 with a certificate made
//! here (rcgen, ECDSA P-256). The load generator has its own runtime.
//!
//! - Throughput: unary GenId, 1 connection x 64 calls in flight; the two
//!   nodes alternate `IDGEN_BENCH_ROUNDS` times (default 3) for
//!   `IDGEN_BENCH_SECS` each (default 5), and the medians are compared.
//! - Handshake: `IDGEN_BENCH_CONNECTS` (default 300) fresh connections one
//!   after the other, each dialled, (TLS-)handshaken, HTTP/2-set-up and
//!   used for one GenId; the median per connection of each, and their
//!   difference, which is what TLS adds to a new connection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use idgen::config::TlsSettings;
use idgen::proto::id_gen_client::IdGenClient;
use idgen::proto::GenIdRequest;
use idgen_loadgen::{self as bench, BenchOptions, BenchReport};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint};

mod common;
use common::IdgenServer;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// A certificate for `localhost`, written under `dir`; the client config
/// that trusts it (ALPN h2).
fn certificate(dir: &std::path::Path) -> (TlsSettings, Arc<ClientConfig>) {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("rcgen");
    let (cert, key) = (dir.join("node.crt"), dir.join("node.key"));
    std::fs::write(&cert, ck.cert.pem()).expect("write cert");
    std::fs::write(&key, ck.signing_key.serialize_pem()).expect("write key");
    let mut roots = RootCertStore::empty();
    roots.add(ck.cert.der().clone()).expect("root");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut client = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![b"h2".to_vec()];
    let settings = TlsSettings {
        cert,
        key,
        client_ca: None,
        client_required: false,
    };
    (settings, Arc::new(client))
}

/// One connection to `addr`, over TLS when `tls` is given.
async fn connect(addr: std::net::SocketAddr, tls: Option<Arc<ClientConfig>>) -> Channel {
    let endpoint = Endpoint::from_static("http://localhost").tcp_nodelay(true);
    match tls {
        None => Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .tcp_nodelay(true)
            .connect()
            .await
            .expect("plaintext connect"),
        Some(config) => endpoint
            .connect_with_connector(tower::service_fn(move |_: tonic::codegen::http::Uri| {
                let config = Arc::clone(&config);
                async move {
                    let tcp = TcpStream::connect(addr).await?;
                    tcp.set_nodelay(true)?;
                    let name = ServerName::try_from("localhost").expect("server name");
                    let tls = TlsConnector::from(config).connect(name, tcp).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(tls))
                }
            }))
            .await
            .expect("TLS connect"),
    }
}

/// One connection, 64 unary GenId calls in flight, for `secs` seconds.
fn unary_options(secs: u64) -> BenchOptions {
    BenchOptions {
        target: String::new(),
        connections: 1,
        concurrency: 64,
        duration: Duration::from_secs(secs),
        warmup: Duration::from_secs(1),
        batch: 1,
        mode: idgen::proto::Mode::Snowflake,
        tag: String::new(),
        format: None,
        format_params: Vec::new(),
        small_callers: 0,
        small_batch: 0,
        uuid: false,
    }
}

fn main() {
    let secs = env("IDGEN_BENCH_SECS", 5);
    let rounds = env("IDGEN_BENCH_ROUNDS", 3).max(1);
    let connects = env("IDGEN_BENCH_CONNECTS", 300).max(1);
    let dir = tempfile::tempdir().expect("tempdir");
    let (settings, client_tls) = certificate(dir.path());
    let plain = IdgenServer::start();
    let tls = IdgenServer::start_with(Some(settings));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("client runtime");

    let opts = unary_options(secs);
    let run = |addr, config: Option<Arc<ClientConfig>>| -> BenchReport {
        rt.block_on(async {
            let channel = connect(addr, config).await;
            bench::run_on(&opts, vec![channel])
                .await
                .expect("bench run")
        })
    };
    println!("== unary GenId, 1 conn x 64 in flight");
    let (mut p_calls, mut t_calls) = (vec![], vec![]);
    for _ in 0..rounds {
        let p = run(plain.addr, None);
        let t = run(tls.addr, Some(Arc::clone(&client_tls)));
        println!("{}", p.summary("plaintext"));
        println!("{}", t.summary("TLS"));
        assert_eq!(
            p.order_violations + t.order_violations,
            0,
            "IDs went backwards"
        );
        assert_eq!(p.errors + t.errors, 0, "calls failed");
        p_calls.push(p.calls_per_sec());
        t_calls.push(t.calls_per_sec());
    }
    let (p, t) = (bench::median(p_calls), bench::median(t_calls));
    println!(
        "medians: plaintext {p:.0} calls/s, TLS {t:.0} calls/s; TLS/plaintext {:.2}x",
        t / p
    );

    println!("== a new connection and its first GenId, {connects} one after the other");
    let time_connects = |addr, config: Option<Arc<ClientConfig>>| -> Vec<f64> {
        rt.block_on(async {
            let mut times = Vec::with_capacity(connects as usize);
            for _ in 0..connects {
                let started = Instant::now();
                let mut client = IdGenClient::new(connect(addr, config.clone()).await);
                client
                    .gen_id(GenIdRequest::default())
                    .await
                    .expect("first GenId");
                times.push(started.elapsed().as_secs_f64() * 1e6);
            }
            times
        })
    };
    // Alternate halves so that drift on the machine hits both alike.
    let (mut p_us, mut t_us) = (vec![], vec![]);
    for _ in 0..2 {
        p_us.extend(time_connects(plain.addr, None));
        t_us.extend(time_connects(tls.addr, Some(Arc::clone(&client_tls))));
    }
    let (p, t) = (bench::median(p_us), bench::median(t_us));
    println!(
        "median per connection: plaintext {p:.0} us, TLS {t:.0} us; the TLS handshake adds {:.0} us",
        t - p
    );
}
