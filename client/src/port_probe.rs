//! What a port that failed a gRPC call speaks, to name the likely cause.
//!
//! gRPC runs over HTTP/2. Pointed at an HTTP/1.1 server (idgen's own HTTP
//! port, `server.http_listen`, is the usual one), the HTTP/2 client only
//! sees the connection close under its call ("transport error",
//! "operation was canceled"), the same words a TLS node gives a plaintext
//! client. One plain HTTP/1.1 request tells them apart: an HTTP/1.1
//! server answers it with a status line, a gRPC node with an HTTP/2
//! SETTINGS frame, a TLS node with an alert. A TLS ClientHello tells a
//! TLS node from a plaintext one the same way ([`speaks_tls`]).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// What to do when a node's address turned out to be an HTTP/1.1 port.
pub(crate) const HTTP1_WORDS: &str = "that port speaks HTTP/1.1, not gRPC (HTTP/2): it is probably the node's HTTP port (server.http_listen, 9464 by default); use its gRPC port (server.grpc_listen, 50051 by default)";

/// Whether `addr` (`host:port`, IPv6 hosts in brackets) answers a plain
/// HTTP/1.1 request with an HTTP/1.x status line. For explaining a failed
/// call only: one short connection, bounded by `timeout` per step; any
/// failure of the probe itself is "no". Public so that tools dialling a
/// node themselves (the `idgen` command) give the same explanation.
pub fn speaks_http1(addr: &str, timeout: Duration) -> bool {
    let probe = || -> Option<bool> {
        let sock_addr = addr.to_socket_addrs().ok()?.next()?;
        let mut sock = TcpStream::connect_timeout(&sock_addr, timeout).ok()?;
        sock.set_read_timeout(Some(timeout)).ok()?;
        sock.set_write_timeout(Some(timeout)).ok()?;
        let request = format!("GET / HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        sock.write_all(request.as_bytes()).ok()?;
        let mut head = [0u8; 7];
        sock.read_exact(&mut head).ok()?;
        Some(&head == b"HTTP/1.")
    };
    probe().unwrap_or(false)
}

/// Whether `addr` (`host:port`, IPv6 hosts in brackets) answers a TLS
/// ClientHello in TLS (a plaintext gRPC node closes or answers HTTP/2
/// instead). For explaining a failed plaintext call only: one short
/// connection, bounded by `timeout` per step; any failure of the probe
/// itself is "no".
pub fn speaks_tls(addr: &str, timeout: Duration) -> bool {
    use std::sync::Arc;
    use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
    let probe = || -> Option<bool> {
        let sock_addr = addr.to_socket_addrs().ok()?.next()?;
        let mut sock = TcpStream::connect_timeout(&sock_addr, timeout).ok()?;
        sock.set_read_timeout(Some(timeout)).ok()?;
        sock.set_write_timeout(Some(timeout)).ok()?;
        // No roots: a TLS server's certificate fails verification, which
        // is the proof it speaks TLS.
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .ok()?
            .with_root_certificates(RootCertStore::empty())
            .with_no_client_auth();
        let name = rustls_pki_types::ServerName::try_from("idgen.invalid").ok()?;
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).ok()?;
        for _ in 0..8 {
            match conn.complete_io(&mut sock) {
                Ok(_) if !conn.is_handshaking() => return Some(true),
                Ok(_) => {}
                Err(e) => {
                    let r = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
                    return Some(matches!(
                        r,
                        Some(
                            rustls::Error::InvalidCertificate(_) | rustls::Error::AlertReceived(_)
                        )
                    ));
                }
            }
        }
        None
    };
    probe().unwrap_or(false)
}

/// [`speaks_http1`] off the async runtime's worker threads, bounded by
/// `timeout` in all: [`speaks_http1`] bounds each of its steps (connect,
/// write, read) by `timeout`, so three slow steps took up to three times
/// the call's time left. Past `timeout` the answer is "no" and the blocking
/// probe ends on its own within its per-step bounds.
pub(crate) async fn speaks_http1_async(addr: &str, timeout: Duration) -> bool {
    let addr = addr.to_owned();
    let probe = tokio::task::spawn_blocking(move || speaks_http1(&addr, timeout));
    matches!(tokio::time::timeout(timeout, probe).await, Ok(Ok(true)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that answers every connection with `reply` once.
    fn server(reply: &'static [u8]) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            if let Ok((mut conn, _)) = listener.accept() {
                let mut buf = [0u8; 256];
                let _ = conn.read(&mut buf);
                let _ = conn.write_all(reply);
            }
        });
        addr
    }

    #[tokio::test]
    async fn the_async_probe_says_http1_and_a_port_that_never_answers_is_no() {
        let http1 = server(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n");
        assert!(speaks_http1_async(&http1, Duration::from_secs(2)).await);
        // Accepts, reads, never answers: "no" once the budget is spent.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let silent = listener.local_addr().unwrap().to_string();
        let (done, wait) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            if let Ok((_conn, _)) = listener.accept() {
                let _ = wait.recv();
            }
        });
        assert!(!speaks_http1_async(&silent, Duration::from_millis(200)).await);
        drop(done);
    }

    #[test]
    fn an_http1_status_line_is_http1_and_an_http2_settings_frame_is_not() {
        let http1 = server(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n");
        assert!(speaks_http1(&http1, Duration::from_secs(2)));
        // What a gRPC node answers first: an HTTP/2 SETTINGS frame.
        let grpc = server(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00");
        assert!(!speaks_http1(&grpc, Duration::from_secs(2)));
        // Nothing listening.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let gone = closed.local_addr().unwrap().to_string();
        drop(closed);
        assert!(!speaks_http1(&gone, Duration::from_secs(2)));
    }
}
