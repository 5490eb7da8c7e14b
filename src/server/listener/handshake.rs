//! The TLS handshake of one connection, and what a failed one leaves in
//! the log.
//!
//! Every failure counts in `idgen_tls_handshake_failures_total{port}` and
//! is logged at DEBUG. A **refused client certificate** (none sent to a
//! node with `server.tls.client_required`, or one the node's `client_ca`
//! does not verify: unknown issuer, expired, wrong key usage) is what an
//! operator needs to see when a client "cannot connect": it is logged at
//! WARN with the peer's address and rustls's cause, at most once per
//! [`WARN_EVERY`] per port, the next line saying how many were left out
//! meanwhile, so a scanner cannot flood the log. Other failures (a
//! plaintext client, garbage, a timeout) stay at DEBUG: they are what
//! scanners make.

use std::sync::Mutex;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_rustls::rustls;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tonic::transport::server::TcpConnectInfo;

use crate::metrics as m;
use crate::server::tls::PeerCertificate;

/// At most one WARN line about refused client certificates per port in
/// this long.
pub const WARN_EVERY: Duration = Duration::from_secs(10);

/// Runs the handshake within `timeout`; the stream and the client's leaf
/// certificate, or `None` (counted and logged) if it failed. When the
/// server stops first, the connection is dropped at once: no call can be
/// in flight on it, so it must not hold the shutdown until its timeout.
pub(super) async fn accept(
    acceptor: TlsAcceptor,
    stream: TcpStream,
    (timeout, mut stop): (Duration, watch::Receiver<bool>),
    port: &'static str,
    info: &TcpConnectInfo,
) -> Option<(TlsStream<TcpStream>, Option<PeerCertificate>)> {
    let handshake = tokio::time::timeout(timeout, acceptor.accept(stream));
    let outcome = tokio::select! {
        outcome = handshake => outcome,
        _ = stop.wait_for(|s| *s) => {
            tracing::debug!(port, "closing a connection still in its TLS handshake: the server stops");
            return None;
        }
    };
    let failure = match outcome {
        Ok(Ok(tls_stream)) => {
            let peer = tls_stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(<[_]>::first)
                .map(|leaf| PeerCertificate::from_der(leaf));
            return Some((tls_stream, peer));
        }
        Ok(Err(e)) => Failure::from_io(&e),
        Err(_) => Failure::Other("no handshake within server.header_timeout".into()),
    };
    metrics::counter!(m::TLS_HANDSHAKE_FAILURES, "port" => port).increment(1);
    let peer = info
        .remote_addr
        .map_or_else(|| "unknown".to_owned(), |a| a.to_string());
    match failure {
        Failure::ClientCertificate(cause) => {
            if let Some(left_out) = warn_now(port, Instant::now()) {
                tracing::warn!(
                    port,
                    peer,
                    cause,
                    left_out,
                    "refused a client certificate in the TLS handshake (server.tls.client_ca decides; \
                     left_out: refusals on this port not logged since the last such line)"
                );
            } else {
                tracing::debug!(port, peer, cause, "refused a client certificate");
            }
        }
        Failure::Other(reason) => {
            tracing::debug!(port, peer, reason, "TLS handshake failed");
        }
    }
    None
}

/// Why a handshake failed.
#[derive(Debug, PartialEq)]
enum Failure {
    /// The client's certificate was missing or did not verify.
    ClientCertificate(String),
    /// Anything else.
    Other(String),
}

impl Failure {
    fn from_io(e: &std::io::Error) -> Self {
        match e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            Some(tls) => Self::from_rustls(tls),
            None => Self::Other(e.to_string()),
        }
    }

    fn from_rustls(e: &rustls::Error) -> Self {
        match e {
            rustls::Error::NoCertificatesPresented => Self::ClientCertificate(
                "the client sent no certificate (server.tls.client_required is on)".into(),
            ),
            rustls::Error::InvalidCertificate(why) => {
                Self::ClientCertificate(format!("the client's certificate: {why:?}"))
            }
            other => Self::Other(other.to_string()),
        }
    }
}

/// When each port last logged a refusal at WARN, and how many it left
/// out since.
static LAST_WARN: Mutex<Vec<(&'static str, Instant, u64)>> = Mutex::new(Vec::new());

/// Whether a refusal on `port` at `now` is logged at WARN: `Some(left
/// out since the last line)` if so, `None` (counted as left out) if a
/// line was written less than [`WARN_EVERY`] ago.
fn warn_now(port: &'static str, now: Instant) -> Option<u64> {
    let mut last = LAST_WARN.lock().unwrap_or_else(|p| p.into_inner());
    warn_in(&mut last, port, now)
}

fn warn_in(
    last: &mut Vec<(&'static str, Instant, u64)>,
    port: &'static str,
    now: Instant,
) -> Option<u64> {
    match last.iter_mut().find(|(p, _, _)| *p == port) {
        Some((_, at, left_out)) if now.duration_since(*at) < WARN_EVERY => {
            *left_out += 1;
            None
        }
        Some((_, at, left_out)) => {
            *at = now;
            Some(std::mem::take(left_out))
        }
        None => {
            last.push((port, now, 0));
            Some(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_warn_once_per_period_per_port_and_count_the_rest() {
        let mut last = Vec::new();
        let t0 = Instant::now();
        assert_eq!(warn_in(&mut last, "grpc", t0), Some(0));
        for i in 1..=5 {
            assert_eq!(
                warn_in(&mut last, "grpc", t0 + Duration::from_secs(i)),
                None
            );
        }
        // Another port has its own budget.
        assert_eq!(
            warn_in(&mut last, "http", t0 + Duration::from_secs(1)),
            Some(0)
        );
        // The next line after the period says how many were left out.
        assert_eq!(warn_in(&mut last, "grpc", t0 + WARN_EVERY), Some(5));
        assert_eq!(
            warn_in(&mut last, "grpc", t0 + WARN_EVERY + Duration::from_secs(1)),
            None
        );
    }

    #[test]
    fn only_client_certificate_refusals_are_told_apart() {
        assert!(matches!(
            Failure::from_rustls(&rustls::Error::NoCertificatesPresented),
            Failure::ClientCertificate(c) if c.contains("no certificate")
        ));
        assert!(matches!(
            Failure::from_rustls(&rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer
            )),
            Failure::ClientCertificate(c) if c.contains("UnknownIssuer")
        ));
        assert!(matches!(
            Failure::from_rustls(&rustls::Error::DecryptError),
            Failure::Other(_)
        ));
        let wrapped = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::NoCertificatesPresented,
        );
        assert!(matches!(
            Failure::from_io(&wrapped),
            Failure::ClientCertificate(_)
        ));
        let plain = std::io::Error::new(std::io::ErrorKind::InvalidData, "corrupt message");
        assert_eq!(
            Failure::from_io(&plain),
            Failure::Other("corrupt message".into())
        );
    }
}
