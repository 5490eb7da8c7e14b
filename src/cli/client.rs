//! Connecting to a node: `--addr` as `host:port` or a URL, a bound on every
//! wait (`--timeout`), and errors that say which address was tried and
//! what to do.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::bail;
use serde_json::Value;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::{InterceptedService, Interceptor};
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};

use idgen::proto::admin_client::AdminClient;
use idgen::server::status::code_name;

use super::args::TlsArgs;
use super::output::root_cause;

/// The URL for `--addr`: `host:port` gets `http://` in front; a URL is
/// taken as it is.
pub fn url(addr: &str) -> anyhow::Result<String> {
    let addr = addr.trim();
    if addr.is_empty() {
        bail!("--addr is empty: give host:port, e.g. 127.0.0.1:50051");
    }
    let url = if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    };
    let parsed = url::Url::parse(&url).map_err(|e| {
        anyhow::anyhow!(
            "--addr {addr:?} is not host:port or a URL like http://127.0.0.1:50051 ({e})"
        )
    })?;
    match parsed.scheme() {
        "http" | "https" => {}
        other => bail!("--addr {addr:?}: unknown scheme {other:?}; use host:port, http://host:port or https://host:port"),
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        bail!("--addr {addr:?} has no host; give host:port, e.g. 127.0.0.1:50051");
    }
    if parsed.port().is_none() {
        bail!("--addr {addr:?} has no port; give host:port, e.g. 127.0.0.1:50051");
    }
    Ok(url)
}

/// The URL this process dialed, to name it when a call fails later.
static DIALED: OnceLock<String> = OnceLock::new();

/// The plaintext address this process dialed, to explain a failed call
/// when the node turns out to speak TLS.
static PLAINTEXT_DIAL: OnceLock<(String, u16)> = OnceLock::new();

/// Set once a node answered a call of this process: a connection that
/// fails after that is a node that went away mid-run, not a wrong address.
static ANSWERED: OnceLock<()> = OnceLock::new();

/// How this process dialed a node over TLS (with or without `--cert`),
/// to explain a failed call in the client crate's words.
static TLS_DIAL: OnceLock<idgen_client::TlsUse> = OnceLock::new();

/// Connects to `addr`, waiting at most `timeout`; every call made on the
/// channel is bounded by `timeout` as well. `https://` addresses use
/// `tls` (`--ca`, `--cert`, `--key`).
pub async fn channel(addr: &str, timeout: Duration, tls: &TlsArgs) -> anyhow::Result<Channel> {
    let url = url(addr)?;
    let endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| anyhow::anyhow!("--addr {addr:?}: {}", root_cause(&e)))?
        .connect_timeout(timeout)
        .timeout(timeout);
    let hint =
        "is `idgen serve` running there? Start it, or pass --addr with the node's gRPC address";
    let parsed = url::Url::parse(&url)?;
    let _ = DIALED.set(url.clone());
    if parsed.scheme() == "https" {
        let Some(config) = tls.client_tls()? else {
            bail!("an https:// address needs --ca <file>: the CA certificate (PEM) that signed the node's certificate");
        };
        let _ = TLS_DIAL.set(tls.tls_use());
        let host = parsed.host_str().unwrap_or_default();
        let node = format!("{host}:{}", parsed.port().unwrap_or(443));
        let dial = config.connect(&node, endpoint, &super::tls::REMEDIES);
        return match tokio::time::timeout(timeout, dial).await {
            Ok(Ok(channel)) => Ok(channel),
            Ok(Err(idgen_client::Error::Transport { cause, .. })) => {
                bail!("cannot connect to {url}: {cause}")
            }
            Ok(Err(idgen_client::Error::Config(problem))) => {
                bail!("cannot connect to {url}: {problem}")
            }
            Ok(Err(e)) => bail!("cannot connect to {url}: {e}"),
            Err(_) => bail!(
                "cannot connect to {url}: no answer within {} (--timeout); {hint}",
                humantime::format_duration(timeout)
            ),
        };
    }
    if tls.any() {
        bail!(
            "--ca, --cert, --key and --tls-server-name are for TLS: use an https:// address, e.g. https://{}",
            addr.trim().trim_start_matches("http://")
        );
    }
    let host = parsed.host_str().unwrap_or_default().to_owned();
    let _ = PLAINTEXT_DIAL.set((host, parsed.port().unwrap_or(80)));
    match tokio::time::timeout(timeout, endpoint.connect()).await {
        Ok(Ok(channel)) => Ok(channel),
        Ok(Err(e)) => {
            if let Some(tls) = tls_hint() {
                bail!("cannot connect to {url}: {tls}");
            }
            bail!("cannot connect to {url} ({}); {hint}", root_cause(&e))
        }
        Err(_) => bail!(
            "cannot connect to {url}: no answer within {} (--timeout); {hint}",
            humantime::format_duration(timeout)
        ),
    }
}

/// When a plaintext connection failed: whether the node speaks TLS, said
/// as what to do.
fn tls_hint() -> Option<String> {
    let (host, port) = PLAINTEXT_DIAL.get()?;
    let shown = bracketed(host);
    idgen_client::speaks_tls(&format!("{shown}:{port}"), Duration::from_secs(2)).then(|| {
        format!("the node speaks TLS and this client spoke plaintext; use https://{shown}:{port} with --ca <file>")
    })
}

/// An IPv6 host in brackets, for `host:port`.
fn bracketed(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

/// When a plaintext call broke under way (the connection was made, so
/// something listens): whether that port is an HTTP/1.1 server, said as
/// what to do. gRPC needs HTTP/2, and hyper only reports the HTTP/1.1
/// server's reply as a connection that closed ("transport error",
/// "operation was canceled"), so the port is asked (one short request).
fn http1_hint() -> Option<String> {
    let (host, port) = PLAINTEXT_DIAL.get()?;
    let addr = format!("{}:{port}", bracketed(host));
    idgen_client::speaks_http1(&addr, Duration::from_secs(2)).then(|| {
        format!("{addr} speaks HTTP/1.1, not gRPC (HTTP/2): --addr is probably the node's HTTP port (server.http_listen, 9464 by default); pass its gRPC port (server.grpc_listen, 50051 by default)")
    })
}

/// A connection that failed after the node had answered this process:
/// the node went away during the run (shut down, draining, restarting),
/// said with the one attempt on the one node `--addr` names.
fn gone_hint(s: &tonic::Status) -> Option<String> {
    ANSWERED.get()?;
    let url = DIALED.get()?;
    Some(format!(
        "the node at {url} went away during the run ({}): it is shutting down (draining) or restarting; 1 attempt on 1 node (--addr); run again once it is back, or use --discover consul to move to another node",
        root_cause(s)
    ))
}

/// A gRPC status as every command prints it: `CODE: message`, and for a
/// failed connection its cause and the likely reason (a TLS node, an
/// HTTP/1.1 port, a node that went away).
pub fn status_error(s: tonic::Status) -> anyhow::Error {
    // A transport failure on a plaintext connection may be a TLS node
    // (the connection closed under the call: UNAVAILABLE, UNKNOWN,
    // INTERNAL, or CANCELLED when the close raced the request).
    let transport = match s.code() {
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Internal => true,
        tonic::Code::Cancelled => !s.message().contains("Timeout expired"),
        _ => false,
    };
    // Once a node answered, a connection that fails is a node that went
    // away (gone_hint), not a TLS refusal.
    let tls = TLS_DIAL.get().copied().filter(|_| ANSWERED.get().is_none());
    if let Some(words) = tls_refusal(&s, tls) {
        return anyhow::anyhow!("UNAVAILABLE: {words}");
    }
    let connection = std::error::Error::source(&s).is_some();
    if transport {
        if let Some(tls) = tls_hint() {
            return anyhow::anyhow!("UNAVAILABLE: {tls}");
        }
    }
    if transport && connection {
        if let Some(words) = http1_hint().or_else(|| gone_hint(&s)) {
            return anyhow::anyhow!("UNAVAILABLE: {words}");
        }
    }
    // What tonic answers when the channel's own timeout fires.
    if s.code() == tonic::Code::Cancelled && s.message().contains("Timeout expired") {
        return anyhow::anyhow!("DEADLINE_EXCEEDED: no answer within the --timeout");
    }
    if connection {
        return anyhow::anyhow!(
            "{}: {} ({})",
            code_name(s.code()),
            s.message(),
            root_cause(&s)
        );
    }
    anyhow::anyhow!("{}: {}", code_name(s.code()), s.message())
}

/// A call that failed over TLS (`tls`: how this process dialed; `None`
/// for plaintext), in the client crate's words naming the flags, when
/// the failure is about TLS: the node wanted or refused the client
/// certificate (TLS 1.3 tells the client only after the handshake, so
/// the call fails, not the connect), or closed the connection right after
/// the handshake (the alert can lose the race with the request).
fn tls_refusal(s: &tonic::Status, tls: Option<idgen_client::TlsUse>) -> Option<String> {
    let tls = tls?;
    let mut cause = String::new();
    let mut source = std::error::Error::source(s);
    while let Some(e) = source {
        cause.push_str(&format!(" {e:?} {e}"));
        source = e.source();
    }
    // hyper reports a connection that closed under a call in flight as
    // CANCELLED "operation was canceled", sometimes with no source at all.
    let timeout = s.message().contains("Timeout expired");
    if s.code() == tonic::Code::Cancelled && !timeout {
        cause.push_str(" operation was canceled");
    }
    idgen_client::tls_refusal(&cause, tls, &super::tls::REMEDIES)
}

/// Runs one call, bounded by `timeout`, with the status printed the same
/// way everywhere.
pub async fn call<T>(
    timeout: Duration,
    fut: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> anyhow::Result<T> {
    call_status(timeout, fut).await?.map_err(status_error)
}

/// [`call`] that hands the node's refusal back as it is, for a caller
/// that acts on it (a smaller batch); only the deadline is an error.
pub async fn call_status<T>(
    timeout: Duration,
    fut: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> anyhow::Result<Result<T, tonic::Status>> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(response)) => {
            let _ = ANSWERED.set(());
            Ok(Ok(response.into_inner()))
        }
        Ok(Err(status)) => Ok(Err(status)),
        Err(_) => bail!(
            "DEADLINE_EXCEEDED: no answer within {} (--timeout)",
            humantime::format_duration(timeout)
        ),
    }
}

/// Adds `authorization: Bearer <admin token>` to every call (when one
/// was given; without one the server answers UNAUTHENTICATED).
#[derive(Clone)]
pub struct Bearer(pub(super) Option<MetadataValue<Ascii>>);

impl Interceptor for Bearer {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(h) = &self.0 {
            req.metadata_mut().insert("authorization", h.clone());
        }
        Ok(req)
    }
}

/// An admin client that sends the admin token with every call.
pub type Client = AdminClient<InterceptedService<Channel, Bearer>>;

/// The gRPC code and message, for the error line.
pub fn failed(s: Status) -> anyhow::Error {
    status_error(s)
}

/// What a command prints: its JSON form and its text form.
pub type Out = (Value, String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_canceled_by_the_closing_connection_names_the_missing_certificate() {
        // What hyper reports when the node's CertificateRequired alert
        // closes the connection under the call: no source to read.
        let canceled = tonic::Status::cancelled("operation was canceled");
        let bare = idgen_client::TlsUse::Tls { identity: false };
        let words = tls_refusal(&canceled, Some(bare)).unwrap_or_default();
        assert!(words.contains("--cert"), "{words}");
        assert_eq!(tls_refusal(&canceled, None), None);
        let expired = tonic::Status::cancelled("Timeout expired");
        assert_eq!(tls_refusal(&expired, Some(bare)), None);
    }

    #[test]
    fn host_port_and_urls_are_accepted() {
        assert_eq!(url("127.0.0.1:50051").unwrap(), "http://127.0.0.1:50051");
        assert_eq!(url("localhost:1").unwrap(), "http://localhost:1");
        assert_eq!(url("[::1]:50051").unwrap(), "http://[::1]:50051");
        assert_eq!(
            url("https://localhost:50051").unwrap(),
            "https://localhost:50051"
        );
        assert_eq!(
            url("http://127.0.0.1:50051").unwrap(),
            "http://127.0.0.1:50051"
        );
    }

    #[test]
    fn unusable_addresses_are_refused_with_the_form_to_use() {
        for (addr, says) in [
            ("", "empty"),
            ("127.0.0.1", "no port"),
            ("ftp://x:1", "unknown scheme"),
            ("http://:5", "host:port"),
        ] {
            let msg = url(addr).unwrap_err().to_string();
            assert!(msg.contains(says), "{addr:?}: {msg}");
        }
    }
}
