//! Accepting and holding client connections, within bounds.
//!
//! Both ports run through [`serve`]: an accept loop that backs off when
//! accepting fails (out of descriptors or memory) instead of spinning, a cap
//! on open connections, and deadlines on every connection, so slow, idle or
//! hostile clients are cut off on time and cannot starve everyone else.
//!
//! - **Accept errors** (EMFILE, ENFILE, ENOBUFS, ENOMEM, ...) pause the
//!   loop for 10 ms, doubling to 1 s, reset by the next success. Each
//!   episode is logged once when it starts and once when it ends (with how
//!   many errors it had); every error counts in `idgen_accept_errors_total`.
//!   Errors about one connection that died in the backlog (reset, aborted)
//!   are skipped at once, as hyper does.
//! - **Per peer and per port, waiting connections give way.** A peer
//!   (an IPv4 address, an IPv6 /64) may hold `server.max_connections_per_peer`
//!   connections on each port. When a new connection would pass that or the
//!   port's maximum, the connection that has waited longest for its request
//!   headers (HTTP/1) or HTTP/2 preface is closed to make room (see
//!   `listener/table.rs`); counted in `idgen_connections_evicted_total`, logged at
//!   most every 10 s. So slow-header floods cannot keep `/healthz` or the
//!   gRPC health check out.
//! - **At the connection limit**, with no waiting connection to close, a
//!   new connection is accepted and closed at
//!   once rather than left in the kernel backlog: a client learns within a
//!   round trip that this node is full and can try another, instead of
//!   hanging until its connect timeout. Counted in
//!   `idgen_connections_refused_total`, logged once per episode.
//! - **gRPC (HTTP/2)**: the client preface must arrive within
//!   `header_timeout`; a connection with no call in progress for
//!   `grpc_idle_timeout` gets a GOAWAY and is closed; HTTP/2 pings check
//!   quiet peers; streams per connection and header size are capped.
//! - **HTTP/1**: each request's headers (and the wait for the next request
//!   on a kept-alive connection) must arrive within `header_timeout`;
//!   header size is capped (431 past it).
//! - **Request bodies** (`listener/body.rs`): a connection whose open
//!   calls all wait for their request bodies counts as waiting (closed
//!   first to make room, as above), and a body not in full
//!   `request_body_timeout` after its headers is answered at once
//!   (DEADLINE_EXCEEDED, or 408 on HTTP/1), so streams held open without
//!   END_STREAM cannot fill the port (rule 34 in docs/SAFETY-RULES-26-ON.md).
//! - **TLS handshakes** (`listener/handshake.rs`) must finish within
//!   `header_timeout`; a refused client certificate is a rate-limited WARN.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulConnection;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tonic::transport::server::TcpConnectInfo;

use super::tls::PeerCertificate;
pub use super::tls::Port;
use crate::config::{AllowList, ConnectionSettings};
use crate::metrics as m;

mod body;
mod handshake;
mod table;

pub use body::RequestBody;
pub(crate) use table::peer_key;
use table::{Admission, ConnectionTable, Limit};

/// First pause after a failed accept.
const BACKOFF_MIN: Duration = Duration::from_millis(10);
/// Longest pause between accept attempts while they keep failing.
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Length of the HTTP/2 client connection preface (RFC 9113 §3.4).
const PREFACE_LEN: usize = 24;

// `Port` is defined beside the TLS settings that pick its ALPN protocol;
// its labels, for the metrics and logs, are the listener's.
impl Port {
    fn label(self) -> &'static str {
        match self {
            Port::Grpc => "grpc",
            Port::Http => "http",
        }
    }

    fn limit_key(self) -> &'static str {
        match self {
            Port::Grpc => "server.grpc_max_connections",
            Port::Http => "server.http_max_connections",
        }
    }
}

/// Serves `service` on every connection `listener` accepts, within
/// `settings`, until `shutdown` completes; then stops accepting (closing the
/// listening socket), asks every connection to finish (GOAWAY on HTTP/2,
/// close after the current response on HTTP/1) and returns once all have.
/// Dropping the returned future closes every connection at once. With
/// `tls`, each connection's handshake must finish within `header_timeout`.
pub async fn serve<S, B>(
    listener: TcpListener,
    port: Port,
    settings: ConnectionSettings,
    tls: Option<TlsAcceptor>,
    allow: AllowList,
    service: S,
    shutdown: impl Future<Output = ()>,
) where
    S: tower::Service<Request<RequestBody>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    B: hyper::body::Body<Data = bytes::Bytes> + Default + Unpin + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let protocol = Protocol::new(port, &settings);
    let table = ConnectionTable::new(port, &settings);
    let label = port.label();
    let PortMetrics {
        open,
        refused,
        accept_errors,
    } = PortMetrics::new(label);
    let mut evictions = EvictionLog::default();

    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    let mut failing = AcceptEpisode::default();
    let mut full = LimitEpisode::default();
    let mut retry_at: Option<Instant> = None;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            () = tokio::time::sleep_until(retry_at.unwrap_or_else(Instant::now)), if retry_at.is_some() => {
                retry_at = None;
            }
            accepted = listener.accept(), if retry_at.is_none() => match accepted {
                Ok((stream, peer)) => {
                    failing.succeeded(label);
                    let activity = Arc::new(Activity::new());
                    let Some((slot, evict)) = admit(
                        &table,
                        peer.ip(),
                        &activity,
                        (port, &settings),
                        (&mut full, &mut evictions, &refused),
                    ) else {
                        drop(stream);
                        continue;
                    };
                    // Latency matters more than packet count for small calls.
                    let _ = stream.set_nodelay(true);
                    let info = TcpConnectInfo {
                        local_addr: stream.local_addr().ok(),
                        remote_addr: Some(peer),
                    };
                    // Refused peers are still served, with PERMISSION_DENIED
                    // (or 403) on every call, so they learn why.
                    let refused = !allow.allows(peer.ip());
                    let connection = serve_connection(
                        stream,
                        tls.clone(),
                        (info, refused, activity),
                        protocol.clone(),
                        service.clone(),
                        settings,
                        label,
                        stop_rx.clone(),
                    );
                    conns.spawn(until_evicted(connection, evict, slot));
                }
                Err(e) if is_connection_error(&e) => {}
                Err(e) => {
                    accept_errors.increment(1);
                    retry_at = Some(Instant::now() + failing.failed(label, &e));
                }
            },
        }
        open.set(table.live() as f64);
    }
    drop(listener);
    let _ = stop_tx.send(true);
    while conns.join_next().await.is_some() {
        open.set(conns.len() as f64);
    }
    open.set(0.0);
}

/// Runs `connection` to its end, or drops it (closing it) when it is
/// chosen to make room for a new one while it waited; then gives back its
/// `slot`.
async fn until_evicted(
    connection: impl Future<Output = ()>,
    evict: Arc<tokio::sync::Notify>,
    slot: table::Slot,
) {
    tokio::select! {
        () = connection => {}
        () = evict.notified() => {}
    }
    drop(slot);
}

/// Admits a new connection from `peer` to `table`, or says why not (a
/// log line per episode and a count); `None`: close it.
fn admit(
    table: &Arc<ConnectionTable>,
    peer: std::net::IpAddr,
    activity: &Arc<Activity>,
    (port, settings): (Port, &ConnectionSettings),
    (full, evictions, refused): (&mut LimitEpisode, &mut EvictionLog, &metrics::Counter),
) -> Option<(table::Slot, Arc<tokio::sync::Notify>)> {
    let label = port.label();
    match table.admit(peer, Arc::clone(activity)) {
        Admission::Refused(limit) => {
            refused.increment(1);
            let (max, key) = match (limit, port) {
                (Limit::Peer, _) => (
                    settings.max_connections_per_peer,
                    "server.max_connections_per_peer",
                ),
                (Limit::Port, Port::Grpc) => (settings.grpc_max_connections, port.limit_key()),
                (Limit::Port, Port::Http) => (settings.http_max_connections, port.limit_key()),
            };
            full.refused(label, max, key);
            None
        }
        Admission::Admitted {
            slot,
            evict,
            evicted,
        } => {
            if let Some(limit) = evicted {
                evictions.evicted(label, limit, peer);
            }
            full.accepted(label);
            Some((slot, evict))
        }
    }
}

/// The connection metrics of one port, built once and exported at zero.
struct PortMetrics {
    open: metrics::Gauge,
    refused: metrics::Counter,
    accept_errors: metrics::Counter,
}

impl PortMetrics {
    fn new(label: &'static str) -> Self {
        let this = Self {
            open: metrics::gauge!(m::CONNECTIONS_OPEN, "port" => label),
            refused: metrics::counter!(m::CONNECTIONS_REFUSED, "port" => label),
            accept_errors: metrics::counter!(m::ACCEPT_ERRORS, "port" => label),
        };
        this.open.set(0.0);
        this.refused.increment(0);
        this.accept_errors.increment(0);
        metrics::counter!(m::TLS_HANDSHAKE_FAILURES, "port" => label).increment(0);
        for limit in [Limit::Peer, Limit::Port] {
            metrics::counter!(m::CONNECTIONS_EVICTED, "port" => label, "limit" => limit.label())
                .increment(0);
        }
        metrics::counter!(m::ADMIN_AUTH_FAILURES, "port" => label).increment(0);
        metrics::counter!(m::ADMIN_AUTH_THROTTLED, "port" => label).increment(0);
        metrics::counter!(m::PEER_REFUSALS, "port" => label, "list" => "server").increment(0);
        metrics::counter!(m::REQUESTS_STALLED, "port" => label).increment(0);
        for reason in ["preface", "header", "idle", "keepalive"] {
            metrics::counter!(m::CONNECTIONS_TIMED_OUT, "port" => label, "reason" => reason)
                .increment(0);
        }
        this
    }
}

/// An error about one connection (it died while waiting in the backlog),
/// not about the listener: skip it and accept the next.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// A run of failed accepts: logged when it starts and when it ends.
#[derive(Debug, Default)]
struct AcceptEpisode {
    errors: u64,
    started: Option<Instant>,
    delay: Duration,
}

impl AcceptEpisode {
    /// Records a failure; returns how long to wait before the next try.
    fn failed(&mut self, port: &'static str, error: &io::Error) -> Duration {
        self.errors += 1;
        if self.started.is_none() {
            self.started = Some(Instant::now());
            self.delay = BACKOFF_MIN;
            tracing::warn!(
                port,
                error = %error,
                "cannot accept connections; retrying with backoff up to 1s until it works again (is the descriptor limit too low? see ulimit -n)"
            );
        } else {
            self.delay = (self.delay * 2).min(BACKOFF_MAX);
        }
        self.delay
    }

    fn succeeded(&mut self, port: &'static str) {
        if let Some(started) = self.started.take() {
            tracing::warn!(
                port,
                errors = self.errors,
                lasted = %humantime::format_duration(round_ms(started.elapsed())),
                "accepting connections again"
            );
            self.errors = 0;
        }
    }
}

/// A run of connections refused at the limit.
#[derive(Debug, Default)]
struct LimitEpisode {
    refused: u64,
}

impl LimitEpisode {
    fn refused(&mut self, port: &'static str, max: usize, key: &'static str) {
        if self.refused == 0 {
            tracing::warn!(
                port,
                limit = max,
                setting = key,
                "connection limit reached; closing new connections at once until some close"
            );
        }
        self.refused += 1;
    }

    fn accepted(&mut self, port: &'static str) {
        if self.refused > 0 {
            tracing::info!(
                port,
                refused = self.refused,
                "below the connection limit again"
            );
            self.refused = 0;
        }
    }
}

/// Connections closed to make room: counted every time, logged at most
/// every 10 s per port with how many since the last line.
#[derive(Debug, Default)]
struct EvictionLog {
    since_log: u64,
    logged: Option<Instant>,
}

impl EvictionLog {
    fn evicted(&mut self, port: &'static str, limit: Limit, peer: std::net::IpAddr) {
        metrics::counter!(m::CONNECTIONS_EVICTED, "port" => port, "limit" => limit.label())
            .increment(1);
        self.since_log += 1;
        if self
            .logged
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(10))
        {
            let setting = match limit {
                Limit::Peer => "server.max_connections_per_peer",
                Limit::Port => "the port's connection limit",
            };
            tracing::warn!(
                port,
                peer = %peer,
                limit = setting,
                closed = self.since_log,
                "closed connections that had not sent their request headers or bodies to make room for new ones (a slow-header or held-stream flood? logged at most every 10 s; see idgen_connections_evicted_total)"
            );
            self.since_log = 0;
            self.logged = Some(Instant::now());
        }
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

/// The HTTP server of one port, configured once and cloned per connection.
#[derive(Clone)]
enum Protocol {
    Http2(http2::Builder<TokioExecutor>),
    Http1(http1::Builder),
}

impl Protocol {
    fn new(port: Port, s: &ConnectionSettings) -> Self {
        match port {
            Port::Grpc => {
                let mut b = http2::Builder::new(TokioExecutor::new());
                b.timer(TokioTimer::new())
                    .keep_alive_interval(s.grpc_keepalive_interval)
                    .keep_alive_timeout(s.grpc_keepalive_timeout)
                    .max_concurrent_streams(s.grpc_max_concurrent_streams)
                    .max_header_list_size(u32::try_from(s.max_header_size).unwrap_or(u32::MAX));
                Protocol::Http2(b)
            }
            Port::Http => {
                let mut b = http1::Builder::new();
                b.timer(TokioTimer::new())
                    .header_read_timeout(s.header_timeout)
                    .max_header_size(s.max_header_size)
                    .keep_alive(true);
                Protocol::Http1(b)
            }
        }
    }
}

/// Runs the TLS handshake (if any), then serves the connection.
#[allow(clippy::too_many_arguments)]
async fn serve_connection<S, B>(
    stream: TcpStream,
    tls: Option<TlsAcceptor>,
    (info, refused, activity): (TcpConnectInfo, bool, Arc<Activity>),
    protocol: Protocol,
    service: S,
    settings: ConnectionSettings,
    port: &'static str,
    stop: watch::Receiver<bool>,
) where
    S: tower::Service<Request<RequestBody>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: hyper::body::Body<Data = bytes::Bytes> + Default + Unpin + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let Some(acceptor) = tls else {
        let info = (info, None, refused);
        return serve_io(
            stream, info, activity, protocol, service, settings, port, stop,
        )
        .await;
    };
    let timeout = settings.header_timeout;
    if let Some((tls_stream, peer)) =
        handshake::accept(acceptor, stream, (timeout, stop.clone()), port, &info).await
    {
        let info = (info, peer, refused);
        serve_io(
            tls_stream, info, activity, protocol, service, settings, port, stop,
        )
        .await;
    }
}

#[allow(clippy::too_many_arguments)]
async fn serve_io<I, S, B>(
    stream: I,
    (info, peer, refused): (TcpConnectInfo, Option<PeerCertificate>, bool),
    activity: Arc<Activity>,
    protocol: Protocol,
    service: S,
    settings: ConnectionSettings,
    port: &'static str,
    stop: watch::Receiver<bool>,
) where
    S: tower::Service<Request<RequestBody>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: hyper::body::Body<Data = bytes::Bytes> + Default + Unpin + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    match protocol {
        Protocol::Http2(builder) => {
            let io = TokioIo::new(PrefaceWatch {
                inner: stream,
                activity: Arc::clone(&activity),
                seen: 0,
            });
            let service = TowerToHyperService::new(Tracked {
                inner: service,
                activity: Arc::clone(&activity),
                info,
                peer,
                refused,
                body_timeout: settings.request_body_timeout,
            });
            let conn = builder.serve_connection(io, service);
            let deadlines = Deadlines {
                activity,
                header: settings.header_timeout,
                idle: settings.grpc_idle_timeout,
            };
            drive(conn, Some(deadlines), port, stop).await;
        }
        Protocol::Http1(builder) => {
            let service = TowerToHyperService::new(WithConnectInfo {
                inner: service,
                activity,
                info,
                peer,
                refused,
                body_timeout: settings.request_body_timeout,
            });
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            drive(conn, None, port, stop).await;
        }
    }
}

/// The deadlines the node keeps itself on an HTTP/2 connection (hyper has
/// none for the preface or for idleness).
struct Deadlines {
    activity: Arc<Activity>,
    header: Duration,
    idle: Duration,
}

impl Deadlines {
    /// What is due next, and when.
    fn next(&self, now: Instant) -> (Instant, Due) {
        let a = &self.activity;
        if !a.preface.load(Ordering::Acquire) {
            return (a.accepted + self.header, Due::Preface);
        }
        if a.open.load(Ordering::Acquire) == 0 {
            return (a.idle_since() + self.idle, Due::Idle);
        }
        // Calls in progress: look again later.
        (now + self.idle, Due::Idle)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    Preface,
    Idle,
}

/// Runs one connection to its end, closing it on its deadlines or when the
/// server stops.
async fn drive<C>(
    conn: C,
    deadlines: Option<Deadlines>,
    port: &'static str,
    mut stop: watch::Receiver<bool>,
) where
    C: GracefulConnection<Error = hyper::Error>,
{
    tokio::pin!(conn);
    let mut closing = false;
    // After a GOAWAY for idleness, a peer that keeps the connection open
    // anyway is dropped at this instant.
    let mut hard_close: Option<Instant> = None;
    let far = || Instant::now() + Duration::from_secs(86_400);
    loop {
        let (wake, due) = match (&deadlines, hard_close) {
            (_, Some(at)) => (at, None),
            (Some(d), None) if !closing => {
                let (at, due) = d.next(Instant::now());
                // The preface may come before its deadline; look again by
                // the time an idle connection would be due.
                let at = match due {
                    Due::Preface => at.min(d.activity.accepted + d.idle),
                    Due::Idle => at,
                };
                (at, Some(due))
            }
            _ => (far(), None),
        };
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    if e.is_timeout() {
                        // hyper's own deadlines: HTTP/1 headers, HTTP/2 pings.
                        let reason = if deadlines.is_some() { "keepalive" } else { "header" };
                        metrics::counter!(m::CONNECTIONS_TIMED_OUT, "port" => port, "reason" => reason).increment(1);
                    }
                    tracing::debug!(port, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = stop.wait_for(|s| *s), if !closing => {
                // No HTTP/2 preface yet: no call to drain, and hyper cannot
                // send a GOAWAY before it (it would wait for the preface,
                // holding the stop for the whole grace period).
                if deadlines.as_ref().is_some_and(|d| !d.activity.preface.load(Ordering::Acquire)) {
                    return;
                }
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            () = tokio::time::sleep_until(wake) => {
                let now = Instant::now();
                if hard_close.is_some_and(|at| now >= at) {
                    return;
                }
                let Some(d) = &deadlines else { continue };
                // Re-check: the connection may have moved on since `wake`
                // was computed.
                let (at, now_due) = d.next(now);
                if at > now || Some(now_due) != due {
                    continue;
                }
                match now_due {
                    Due::Preface => {
                        metrics::counter!(m::CONNECTIONS_TIMED_OUT, "port" => port, "reason" => m::label::REASON_PREFACE).increment(1);
                        tracing::debug!(port, "closing a connection that sent no HTTP/2 preface in time");
                        return;
                    }
                    Due::Idle => {
                        metrics::counter!(m::CONNECTIONS_TIMED_OUT, "port" => port, "reason" => m::label::REASON_IDLE).increment(1);
                        conn.as_mut().graceful_shutdown();
                        closing = true;
                        hard_close = Some(now + d.header);
                    }
                }
            }
        }
    }
}

/// What the deadlines and the connection table watch on one connection:
/// whether the HTTP/2 preface has arrived, the calls in progress, and
/// which of them still wait for their request body (`listener/body.rs`).
struct Activity {
    accepted: Instant,
    preface: AtomicBool,
    open: AtomicUsize,
    /// Milliseconds after `accepted` when the last call ended.
    idle_since_ms: AtomicU64,
    /// Open calls whose request body has not arrived in full.
    pending: AtomicUsize,
    /// Milliseconds after `accepted` since when some call has waited for
    /// its body (set when `pending` rises from 0).
    pending_since_ms: AtomicU64,
    /// One more than the milliseconds after `accepted` of the first call
    /// whose body stalled; 0: none has.
    stalled_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            accepted: Instant::now(),
            preface: AtomicBool::new(false),
            open: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
            pending: AtomicUsize::new(0),
            pending_since_ms: AtomicU64::new(0),
            stalled_ms: AtomicU64::new(0),
        }
    }

    fn at(&self, ms: u64) -> Instant {
        self.accepted + Duration::from_millis(ms)
    }

    fn now_ms(&self) -> u64 {
        self.accepted.elapsed().as_millis() as u64
    }

    fn idle_since(&self) -> Instant {
        self.at(self.idle_since_ms.load(Ordering::Acquire))
    }

    /// A call began whose body is still to come.
    fn body_pending(&self) {
        if self.pending.fetch_add(1, Ordering::AcqRel) == 0 {
            self.pending_since_ms
                .store(self.now_ms(), Ordering::Release);
        }
    }

    /// A body counted by [`body_pending`](Self::body_pending) ended (or
    /// was dropped).
    fn body_arrived(&self) {
        self.pending.fetch_sub(1, Ordering::AcqRel);
    }

    /// A call's body stalled: from now on the connection counts as
    /// waiting whenever it serves no call.
    fn body_stalled(&self) {
        let _ = self.stalled_ms.compare_exchange(
            0,
            self.now_ms() + 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// Since when the connection has waited without being served: for its
    /// HTTP/2 preface (gRPC), its request headers (HTTP/1: no request in
    /// progress, whether before the first or between two), or the bodies
    /// of all its open calls; a gRPC connection whose call once stalled
    /// waits from that stall whenever it serves no call. `None` while it
    /// serves a call (or, on gRPC, is merely idle). What
    /// `listener/table.rs` closes first to make room (rule 34).
    fn waiting_since(&self, port: Port) -> Option<Instant> {
        let open = self.open.load(Ordering::Acquire);
        let pending = self.pending.load(Ordering::Acquire);
        if open > pending {
            return None;
        }
        let body = (pending > 0).then(|| self.at(self.pending_since_ms.load(Ordering::Acquire)));
        match port {
            Port::Grpc if !self.preface.load(Ordering::Acquire) => Some(self.accepted),
            Port::Grpc => {
                let stalled = match self.stalled_ms.load(Ordering::Acquire) {
                    0 => None,
                    ms => Some(self.at(ms - 1)),
                };
                body.into_iter().chain(stalled).min()
            }
            Port::Http if open == 0 => Some(self.idle_since()),
            Port::Http => body,
        }
    }
}

/// Counts the first bytes a connection reads, to notice the preface.
struct PrefaceWatch<I> {
    inner: I,
    activity: Arc<Activity>,
    seen: usize,
}

impl<I: AsyncRead + Unpin> AsyncRead for PrefaceWatch<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if self.seen < PREFACE_LEN {
            self.seen += buf.filled().len() - before;
            if self.seen >= PREFACE_LEN {
                self.activity.preface.store(true, Ordering::Release);
            }
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for PrefaceWatch<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Ends a call's presence in [`Activity`] however the call ends.
struct CallGuard(Arc<Activity>);

impl CallGuard {
    fn new(activity: &Arc<Activity>) -> Self {
        activity.open.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(activity))
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        let a = &self.0;
        let ms = a.accepted.elapsed().as_millis() as u64;
        a.idle_since_ms.fetch_max(ms, Ordering::AcqRel);
        a.open.fetch_sub(1, Ordering::AcqRel);
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The gRPC service of one connection: counts calls in progress (until
/// their response body is sent, so a streaming call keeps the connection
/// busy), gives handlers the peer address (as tonic's own server does),
/// honours the caller's `grpc-timeout` and answers a call whose request
/// stalls (`listener/body.rs`) with DEADLINE_EXCEEDED.
#[derive(Clone)]
struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
    info: TcpConnectInfo,
    peer: Option<PeerCertificate>,
    /// The peer is not in `server.allow`.
    refused: bool,
    /// `server.request_body_timeout`.
    body_timeout: Duration,
}

impl<S, B> tower::Service<Request<Incoming>> for Tracked<S>
where
    S: tower::Service<Request<RequestBody>, Response = Response<B>, Error = Infallible>,
    S::Future: Send + 'static,
    B: Default + Send + 'static,
{
    type Response = Response<TrackedBody<B>>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Response<TrackedBody<B>>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<Incoming>) -> Self::Future {
        let call = CallGuard::new(&self.activity);
        if self.refused {
            let status = tonic::Status::permission_denied(refuse_peer(&self.info, "grpc"));
            let response = status
                .into_http()
                .map(|inner| TrackedBody { inner, _call: call });
            return Box::pin(async move { Ok(response) });
        }
        let deadline = grpc_timeout(request.headers());
        request.extensions_mut().insert(self.info.clone());
        if let Some(peer) = &self.peer {
            request.extensions_mut().insert(peer.clone());
        }
        let (request, arrived) = watch_body(request, &self.activity);
        let response = self.inner.call(request);
        let answer = async move {
            Ok::<Response<B>, Infallible>(match deadline {
                None => response.await?,
                Some(d) => match tokio::time::timeout(d, response).await {
                    Ok(response) => response?,
                    Err(_) => tonic::Status::deadline_exceeded(format!(
                        "the call did not finish within its deadline (grpc-timeout {})",
                        humantime::format_duration(d)
                    ))
                    .into_http(),
                },
            })
        };
        let (activity, limit) = (Arc::clone(&self.activity), self.body_timeout);
        Box::pin(async move {
            let response = match arrived {
                None => answer.await?,
                Some(arrived) => tokio::select! {
                    biased;
                    response = answer => response?,
                    () = body::stalled(arrived, limit) => {
                        count_stall(&activity, "grpc");
                        tonic::Status::deadline_exceeded(body::stalled_message(limit)).into_http()
                    }
                },
            };
            Ok(response.map(|inner| TrackedBody { inner, _call: call }))
        })
    }
}

/// `request` with its body watched for its end (`listener/body.rs`), and
/// the flag that end sets unless the body came with the headers.
fn watch_body(
    request: Request<Incoming>,
    activity: &Arc<Activity>,
) -> (Request<RequestBody>, Option<body::Arrived>) {
    let (parts, incoming) = request.into_parts();
    let (body, arrived) = RequestBody::watch(incoming, activity);
    (Request::from_parts(parts, body), arrived)
}

/// A call's request stalled: its connection is marked, the stall counted
/// in `idgen_requests_stalled_total{port}`.
fn count_stall(activity: &Activity, port: &'static str) {
    activity.body_stalled();
    metrics::counter!(m::REQUESTS_STALLED, "port" => port).increment(1);
    tracing::debug!(
        port,
        "answered a call whose request did not arrive in full in time"
    );
}

/// A response body that keeps its call counted until it is sent (or
/// dropped).
struct TrackedBody<B> {
    inner: B,
    _call: CallGuard,
}

impl<B> hyper::body::Body for TrackedBody<B>
where
    B: hyper::body::Body + Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// The caller's deadline from a `grpc-timeout` header (gRPC over HTTP/2
/// spec: 1 to 8 digits and a unit); malformed values are ignored, as
/// tonic's own server does.
fn grpc_timeout(headers: &hyper::HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The HTTP service of one connection: handlers may read the peer
/// address; requests in progress (until their response is sent) are
/// counted, so a connection serving one is never closed to make room; a
/// request whose body stalls (`listener/body.rs`) is answered 408.
#[derive(Clone)]
struct WithConnectInfo<S> {
    inner: S,
    activity: Arc<Activity>,
    info: TcpConnectInfo,
    peer: Option<PeerCertificate>,
    /// The peer is not in `server.allow`: 403 to every request.
    refused: bool,
    /// `server.request_body_timeout`.
    body_timeout: Duration,
}

impl<S, B> tower::Service<Request<Incoming>> for WithConnectInfo<S>
where
    S: tower::Service<Request<RequestBody>, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Default + Send + 'static,
{
    type Response = Response<TrackedBody<B>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<TrackedBody<B>>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<Incoming>) -> Self::Future {
        let call = CallGuard::new(&self.activity);
        if self.refused {
            let message = refuse_peer(&self.info, "http");
            let mut response = Response::new(TrackedBody {
                inner: B::default(),
                _call: call,
            });
            *response.status_mut() = hyper::StatusCode::FORBIDDEN;
            if let Ok(v) = hyper::header::HeaderValue::from_str(&message) {
                response.headers_mut().insert("x-idgen-error", v);
            }
            return Box::pin(async move { Ok(response) });
        }
        request.extensions_mut().insert(self.info.clone());
        if let Some(peer) = &self.peer {
            request.extensions_mut().insert(peer.clone());
        }
        let (request, arrived) = watch_body(request, &self.activity);
        let response = self.inner.call(request);
        let (activity, limit) = (Arc::clone(&self.activity), self.body_timeout);
        Box::pin(async move {
            let response = match arrived {
                None => response.await?,
                Some(arrived) => tokio::select! {
                    biased;
                    response = response => response?,
                    () = body::stalled(arrived, limit) => {
                        count_stall(&activity, "http");
                        let mut response = Response::new(B::default());
                        *response.status_mut() = hyper::StatusCode::REQUEST_TIMEOUT;
                        if let Ok(v) = hyper::header::HeaderValue::from_str(&body::stalled_message(limit)) {
                            response.headers_mut().insert("x-idgen-error", v);
                        }
                        response
                    }
                },
            };
            Ok(response.map(|inner| TrackedBody { inner, _call: call }))
        })
    }
}

/// Counts a call refused by `server.allow`, logs it (at most every 10 s),
/// and returns what the peer is told.
fn refuse_peer(info: &TcpConnectInfo, port: &'static str) -> String {
    let addr = info
        .remote_addr
        .map(|a| a.ip().to_string())
        .unwrap_or_default();
    count_refusal(port, "server", &addr);
    format!("peer {addr} is not in this node's server.allow")
}

/// Counts a refusal in `idgen_peer_refusals_total{port,list}` and logs
/// it with the peer's address, at most once every 10 s per list.
pub fn count_refusal(port: &'static str, list: &'static str, addr: &str) {
    static LAST_LOG_S: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];
    metrics::counter!(m::PEER_REFUSALS, "port" => port, "list" => list).increment(1);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let slot = &LAST_LOG_S[usize::from(list == "admin")];
    let last = slot.load(Ordering::Relaxed);
    if now >= last + 10
        && slot
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        let key = if list == "admin" {
            "admin.allow"
        } else {
            "server.allow"
        };
        tracing::warn!(port, peer = addr, list = key, "refused a peer not in the allow-list (logged at most every 10 s; see idgen_peer_refusals_total)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeout_follows_the_spec() {
        let h = |v: &str| {
            let mut m = hyper::HeaderMap::new();
            m.insert("grpc-timeout", v.parse().unwrap());
            grpc_timeout(&m)
        };
        assert_eq!(h("3S"), Some(Duration::from_secs(3)));
        assert_eq!(h("250m"), Some(Duration::from_millis(250)));
        assert_eq!(h("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(h("99999999u"), Some(Duration::from_micros(99_999_999)));
        assert_eq!(h("123456789S"), None, "more than 8 digits");
        assert_eq!(h("5x"), None);
        assert_eq!(h("S"), None);
        assert_eq!(grpc_timeout(&hyper::HeaderMap::new()), None);
    }

    #[tokio::test]
    async fn accept_backoff_doubles_to_a_second_and_resets() {
        let mut e = AcceptEpisode::default();
        let err = io::Error::from_raw_os_error(24); // EMFILE
        let delays: Vec<Duration> = (0..10).map(|_| e.failed("grpc", &err)).collect();
        assert_eq!(delays[0], Duration::from_millis(10));
        assert_eq!(delays[1], Duration::from_millis(20));
        assert_eq!(delays[6], Duration::from_millis(640));
        assert_eq!(delays[7], BACKOFF_MAX);
        assert_eq!(delays[9], BACKOFF_MAX);
        assert_eq!(e.errors, 10);
        e.succeeded("grpc");
        assert_eq!(e.errors, 0);
        assert!(e.started.is_none());
        assert_eq!(e.failed("grpc", &err), BACKOFF_MIN);
    }
}
