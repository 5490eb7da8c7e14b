//! One call to the cluster: pick a node, send, and on UNAVAILABLE or a
//! transport error try another node with jittered backoff, all inside the
//! call's deadline.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idgen_proto::id_gen_client::IdGenClient;
use tonic::transport::Channel;
use tonic::Code;
use tracing::Instrument;

use crate::metrics as m;
use crate::nodes::{Node, NodeSet, Route};
use crate::Error;

/// Deadline and backoff of calls.
#[derive(Debug, Clone)]
pub(crate) struct CallSettings {
    pub deadline: Duration,
    /// The most one attempt on one node may take: a node that stalls
    /// (SIGSTOP, a full disk) costs this, not the whole deadline.
    pub attempt_timeout: Duration,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
}

/// Sends calls to the node set.
#[derive(Debug)]
pub(crate) struct Caller {
    pub nodes: Arc<NodeSet>,
    pub settings: CallSettings,
}

/// Whether a retry on another node is allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Snowflake, segment, lease and decoding: a request that may have
    /// been served is only a gap when repeated elsewhere.
    Idempotent,
    /// Strict: a request that reached a node may have taken a value, and
    /// sending it again would issue a second value for one logical call;
    /// so it is retried only when it provably never reached a node (the
    /// connection could not be made).
    OnlyIfNotSent,
}

/// Whose counter a call's values come from: calls that count in a
/// cluster's KV (strict keys, segment tags, lease tokens, formats) do not
/// go to a fallback datacenter's nodes unless the user opted in
/// ([`NodeSet::crossing`]); snowflake IDs and UUIDs carry the datacenter
/// id and go anywhere.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Counted<'a> {
    /// Values that carry the datacenter id, or reads.
    No,
    /// `GenId`/`GenIds` of this mode and tag.
    Mode(idgen_proto::Mode, &'a str),
    /// `GenFormatted` of this format.
    Format(&'a str),
}

impl Counted<'_> {
    /// The counter in words (`strict key "a/b"`), or `None` for values
    /// that may come from any datacenter.
    fn counter(self) -> Option<String> {
        use idgen_proto::Mode;
        match self {
            Counted::No | Counted::Mode(Mode::Snowflake | Mode::Unspecified, _) => None,
            Counted::Mode(Mode::Strict, tag) => Some(format!("strict key {tag:?}")),
            Counted::Mode(Mode::Segment, tag) => Some(format!("segment tag {tag:?}")),
            Counted::Mode(mode, _) => Some(format!(
                "{} call",
                mode.as_str_name().to_ascii_lowercase().replace("mode_", "")
            )),
            Counted::Format(format) => Some(format!("format {format:?}")),
        }
    }
}

impl Caller {
    /// Runs `op` against one node after another until it succeeds, fails
    /// with an error another node cannot fix, or the deadline passes.
    /// `op` gets a client for the chosen node and the time left.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        method: &'static str,
        retry: Retry,
        op: F,
    ) -> Result<T, Error>
    where
        F: FnMut(IdGenClient<Channel>, Duration) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        self.call_routed(method, retry, Route::Spread, Counted::No, op)
            .await
    }

    /// [`Caller::call`], choosing each node by `route`, and refusing a
    /// fallback datacenter's node for a call whose values are `counted`
    /// there.
    pub(crate) async fn call_routed<T, F, Fut>(
        &self,
        method: &'static str,
        retry: Retry,
        route: Route,
        counted: Counted<'_>,
        op: F,
    ) -> Result<T, Error>
    where
        F: FnMut(IdGenClient<Channel>, Duration) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        self.call_routed_from(method, retry, route, counted, op)
            .await
            .map(|(value, _)| value)
    }

    /// [`Caller::call_routed`], with the address of the node that
    /// answered: which node served a call is otherwise invisible (a
    /// strict call that went to another node than its key's shows only
    /// here).
    pub(crate) async fn call_routed_from<T, F, Fut>(
        &self,
        method: &'static str,
        retry: Retry,
        route: Route,
        counted: Counted<'_>,
        mut op: F,
    ) -> Result<(T, String), Error>
    where
        F: FnMut(IdGenClient<Channel>, Duration) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        let span = tracing::debug_span!("idgen.call", method, attempts = tracing::field::Empty);
        let counter = counted.counter();
        let result = self
            .attempts(retry, route, counter.as_deref(), &mut op)
            .instrument(span)
            .await;
        let outcome = if result.is_ok() { "ok" } else { "error" };
        metrics::counter!(m::CALLS, "method" => method, "outcome" => outcome).increment(1);
        result
    }

    /// The loop of [`Caller::call`]: one attempt after another, inside the
    /// span that records how many it took.
    async fn attempts<T, F, Fut>(
        &self,
        retry: Retry,
        route: Route,
        counter: Option<&str>,
        op: &mut F,
    ) -> Result<(T, String), Error>
    where
        F: FnMut(IdGenClient<Channel>, Duration) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        let deadline = self.settings.deadline;
        let started = Instant::now();
        let mut tried: Vec<Arc<Node>> = Vec::new();
        let mut tally = Tally::default();
        let mut last = String::from("none");
        let mut attempt: u32 = 0;
        loop {
            let left = deadline.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(tally.deadline_exceeded(deadline, last));
            }
            let (node, in_flight) = match self.nodes.pick(&tried, route) {
                Some(picked) => picked,
                None if tried.is_empty() => return Err(Error::NoNodes),
                None => {
                    // Every node was tried once: start over after a
                    // pause (a node may be back).
                    tried.clear();
                    self.backoff(attempt, left).await;
                    attempt += 1;
                    continue;
                }
            };
            if let Some(counter) = counter {
                // Checked on the node about to be sent to, so a switch of
                // datacenter between two attempts cannot slip past it.
                self.nodes.crossing(&node, counter)?;
            }
            let client = IdGenClient::new(node.channel.clone());
            let budget = left.min(self.settings.attempt_timeout);
            tally.sent(&node);
            let outcome = tokio::time::timeout(budget, op(client, budget)).await;
            drop(in_flight);
            let status = match outcome {
                Ok(Ok(value)) => {
                    if !tried.is_empty() {
                        metrics::counter!(m::FAILOVERS).increment(1);
                    }
                    tracing::Span::current().record("attempts", attempt + 1);
                    return Ok((value, node.addr.clone()));
                }
                Ok(Err(status)) if !out_of_time(&status) => status,
                // The attempt's time ran out: this timeout, or tonic's own
                // for the grpc-timeout sent with the request (the same
                // budget, so either may fire first). Not a transport error.
                _ if budget < left => {
                    last = self.stalled(&node, budget, retry, &tally)?;
                    tried.push(node);
                    attempt += 1;
                    continue;
                }
                _ => {
                    // An attempt cut short by the deadline says less
                    // than the failure before it (often the reason, such
                    // as a TLS mismatch): keep both.
                    let timed_out = format!("{} did not answer in time", node.addr);
                    return Err(tally.deadline_exceeded(
                        deadline,
                        if tried.is_empty() && attempt == 0 {
                            timed_out
                        } else {
                            format!("{timed_out}; before that, {last}")
                        },
                    ));
                }
            };
            let left = deadline.saturating_sub(started.elapsed());
            let http1 = self.speaks_http1(&node, &status, &mut tally, left).await;
            last = self.refused(&node, status, retry, http1)?;
            tried.push(node);
            let left = deadline.saturating_sub(started.elapsed());
            self.backoff(attempt, left).await;
            attempt += 1;
        }
    }

    /// Whether `node` failed with `status` because its address is an
    /// HTTP/1.1 port: asked of a plaintext connection that broke under the
    /// call (a refused one never reached a server), once per node and call,
    /// within the time `left`.
    async fn speaks_http1(
        &self,
        node: &Node,
        status: &tonic::Status,
        tally: &mut Tally,
        left: Duration,
    ) -> bool {
        let plaintext = matches!(self.nodes.tls_use(), crate::tls::TlsUse::Plaintext);
        if !plaintext || !is_transport(status) || never_sent(status) {
            return false;
        }
        if let Some((_, known)) = tally.http1.iter().find(|(addr, _)| *addr == node.addr) {
            return *known;
        }
        let timeout = left.min(Duration::from_secs(1));
        let http1 = crate::port_probe::speaks_http1_async(&node.addr, timeout).await;
        tally.http1.push((node.addr.clone(), http1));
        http1
    }

    /// The attempt's share ran out, not the deadline: the node stalled.
    /// Another node may answer; an idempotent call goes there (`Ok`: what
    /// to report if none does), a strict one may have taken a value and is
    /// not sent again (`Err`).
    fn stalled(
        &self,
        node: &Arc<Node>,
        budget: Duration,
        retry: Retry,
        tally: &Tally,
    ) -> Result<String, Error> {
        let status = tonic::Status::deadline_exceeded(format!(
            "{} did not answer within the attempt timeout of {budget:?}",
            node.addr
        ));
        Arc::clone(&self.nodes).set_aside(node);
        if retry == Retry::OnlyIfNotSent {
            return Err(tally.deadline_exceeded(
                self.settings.deadline,
                format!(
                    "{}; a strict call is not sent twice (the node may have taken a value)",
                    status.message()
                ),
            ));
        }
        metrics::counter!(m::RETRIES).increment(1);
        Ok(status.message().to_owned())
    }

    /// A node answered `status` (or the connection failed with it): `Ok`
    /// with what to report if no node succeeds when another node may be
    /// tried, the call's error otherwise.
    fn refused(
        &self,
        node: &Arc<Node>,
        status: tonic::Status,
        retry: Retry,
        http1: bool,
    ) -> Result<String, Error> {
        let transport = is_transport(&status);
        let elsewhere = status.code() == Code::Unavailable || transport || retry_elsewhere(&status);
        if elsewhere {
            Arc::clone(&self.nodes).set_aside(node);
        }
        let retryable = match retry {
            Retry::Idempotent => elsewhere,
            Retry::OnlyIfNotSent => never_sent(&status),
        };
        if !retryable {
            return Err(if transport {
                Error::Transport {
                    node: node.addr.clone(),
                    cause: describe(&status, self.nodes.tls_use(), http1),
                }
            } else {
                status.into()
            });
        }
        tracing::debug!(node = %node.addr, code = ?status.code(), error = %status.message(), "retrying on another node");
        metrics::counter!(m::RETRIES).increment(1);
        Ok(format!(
            "{}: {}",
            node.addr,
            describe(&status, self.nodes.tls_use(), http1)
        ))
    }

    /// Sleeps a random time up to `base * 2^attempt` (capped at
    /// `backoff_max` and at the time left): full jitter, so callers that
    /// failed together do not retry together.
    async fn backoff(&self, attempt: u32, left: Duration) {
        let cap = self
            .settings
            .backoff_base
            .saturating_mul(1 << attempt.min(16))
            .min(self.settings.backoff_max)
            .min(left);
        tokio::time::sleep(cap.mul_f64(fastrand::f64())).await;
    }
}

/// The status's code and message, with the innermost cause of a transport
/// failure and what it likely means: an HTTP/1.1 port when `http1` (the
/// probe said so), else a TLS mismatch or a refused connection.
fn describe(status: &tonic::Status, tls: crate::tls::TlsUse, http1: bool) -> String {
    let mut cause = None;
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        cause = Some(e.to_string());
        source = e.source();
    }
    let Some(cause) = cause else {
        return format!("{:?} {}", status.code(), status.message());
    };
    let words = if http1 {
        crate::port_probe::HTTP1_WORDS.to_owned()
    } else {
        crate::tls::failure_words(&cause, tls)
    };
    format!("{words} ({cause})")
}

/// What one call tried, for the error that ends it.
#[derive(Default)]
struct Tally {
    /// Attempts sent to a node.
    attempts: u32,
    /// The distinct nodes they went to.
    nodes: Vec<String>,
    /// Nodes probed for HTTP/1.1 in this call, and the answer.
    http1: Vec<(String, bool)>,
}

impl Tally {
    /// An attempt goes to `node`.
    fn sent(&mut self, node: &Node) {
        self.attempts += 1;
        if !self.nodes.contains(&node.addr) {
            self.nodes.push(node.addr.clone());
        }
    }

    /// The call ran out of time, with `last` as what went wrong before.
    fn deadline_exceeded(&self, deadline: Duration, last: String) -> Error {
        Error::DeadlineExceeded {
            deadline,
            last,
            attempts: self.attempts,
            nodes: self.nodes.len(),
        }
    }
}

/// The status came from the connection (reset, refused, closed), not
/// from a node's answer: the client builds those with a source error,
/// while a node's answer is decoded from its trailers and has none.
fn is_transport(status: &tonic::Status) -> bool {
    std::error::Error::source(status).is_some()
}

/// Whether the call ended because its own time ran out: tonic ends a call
/// at the `grpc-timeout` it sends ([`tonic::TimeoutExpired`], as CANCELLED
/// with that error as its source), which [`Caller::attempts`] sets to the
/// attempt's budget. It says nothing about the connection (the node
/// stalled, or is slow), so it is the attempt timeout, not a transport
/// error: a transport error would cost an HTTP/1.1 probe of the stalled
/// node on top of the budget and end a strict call with UNAVAILABLE.
fn out_of_time(status: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if e.is::<tonic::TimeoutExpired>() {
            return true;
        }
        source = e.source();
    }
    false
}

/// Whether the node said another node may serve what it refused (a node
/// fenced by a cluster layout change while others run the new layout):
/// the [`idgen_proto::RETRY_ELSEWHERE`] metadata.
fn retry_elsewhere(status: &tonic::Status) -> bool {
    status
        .metadata()
        .get(idgen_proto::RETRY_ELSEWHERE)
        .is_some()
}

/// The request provably never left this process: the connection to the
/// node could not be made (refused, or no answer to the handshake), so
/// nothing was sent.
pub(crate) fn never_sent(status: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::ConnectionRefused {
                return true;
            }
        }
        let text = e.to_string();
        if text.starts_with("tcp connect error") || text.contains("error trying to connect") {
            return true;
        }
        source = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_refusal_marked_retry_elsewhere_moves_on_and_a_plain_one_does_not() {
        let mut fenced = tonic::Status::failed_precondition("the cluster layout changed");
        assert!(!super::retry_elsewhere(&fenced));
        fenced.metadata_mut().insert(
            idgen_proto::RETRY_ELSEWHERE,
            tonic::metadata::MetadataValue::from_static("layout-changed"),
        );
        assert!(super::retry_elsewhere(&fenced));
    }

    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn caller(nodes: &[&str]) -> Caller {
        Caller {
            nodes: Arc::new(crate::nodes::test_set(nodes)),
            settings: CallSettings {
                deadline: Duration::from_secs(2),
                attempt_timeout: Duration::from_secs(2),
                backoff_base: Duration::from_millis(1),
                backoff_max: Duration::from_millis(5),
            },
        }
    }

    fn refused() -> tonic::Status {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        tonic::Status::from_error(Box::new(io))
    }

    fn reset_after_send() -> tonic::Status {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        tonic::Status::from_error(Box::new(io))
    }

    #[test]
    fn only_a_refused_connection_counts_as_never_sent() {
        assert!(never_sent(&refused()));
        assert!(!never_sent(&reset_after_send()), "reset after sending");
        assert!(
            !never_sent(&tonic::Status::unavailable("fenced")),
            "a node's own answer: it received the call"
        );
        assert!(!never_sent(&tonic::Status::deadline_exceeded("slow")));
    }

    /// Runs one call whose every attempt fails with `status`; returns how
    /// many attempts were made.
    async fn attempts(retry: Retry, status: fn() -> tonic::Status) -> usize {
        let caller = caller(&["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]);
        let count = AtomicUsize::new(0);
        let result: Result<(), Error> = caller
            .call("GenId", retry, |_, _| {
                count.fetch_add(1, Ordering::SeqCst);
                let status = status();
                async move { Err(status) }
            })
            .await;
        assert!(result.is_err());
        count.load(Ordering::SeqCst)
    }

    /// The first attempt fails with a cause (here a TLS client meeting a
    /// plaintext node), the next one is cut short by the deadline: the
    /// error keeps the cause.
    #[tokio::test]
    async fn a_deadline_keeps_the_failure_before_the_attempt_it_cut_short() {
        let caller = caller(&["127.0.0.1:1"]);
        let count = AtomicUsize::new(0);
        let result: Result<(), Error> = caller
            .call("GenId", Retry::Idempotent, |_, _| {
                let first = count.fetch_add(1, Ordering::SeqCst) == 0;
                async move {
                    if first {
                        let io = std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            "received corrupt message of type InvalidContentType",
                        );
                        return Err(tonic::Status::from_error(Box::new(io)));
                    }
                    std::future::pending().await
                }
            })
            .await;
        let e = result.expect_err("the deadline passed");
        let text = e.to_string();
        let Error::DeadlineExceeded {
            last,
            attempts,
            nodes,
            ..
        } = e
        else {
            panic!("the deadline passed: {text}");
        };
        assert_eq!(nodes, 1, "{text}");
        assert!(
            text.contains(&format!("after {attempts} attempts on 1 node ")) && attempts >= 2,
            "the error says what was tried: {text}"
        );
        assert!(last.contains("did not answer in time"), "{last}");
        assert!(
            last.contains("does not speak TLS"),
            "the cause is kept: {last}"
        );
        assert!(
            count.load(Ordering::SeqCst) >= 2,
            "a second attempt was made"
        );
    }

    /// The first node stalls (stopped with SIGSTOP: connected, never
    /// answers); the second answers. With an attempt timeout below the
    /// deadline the call fails over; a strict call does not.
    #[tokio::test]
    async fn a_stalled_node_costs_one_attempt_not_the_deadline() {
        let mut c = caller(&["127.0.0.1:1", "127.0.0.1:2"]);
        c.settings.deadline = Duration::from_secs(30);
        c.settings.attempt_timeout = Duration::from_millis(200);
        let run = |retry| {
            let count = AtomicUsize::new(0);
            let c = &c;
            async move {
                let result: Result<usize, Error> = c
                    .call("GenId", retry, |_, budget| {
                        let n = count.fetch_add(1, Ordering::SeqCst);
                        async move {
                            assert!(budget <= Duration::from_millis(200), "{budget:?}");
                            if n == 0 {
                                std::future::pending().await
                            }
                            Ok(n)
                        }
                    })
                    .await;
                result
            }
        };
        assert_eq!(
            run(Retry::Idempotent)
                .await
                .expect("the second node answers"),
            1,
            "answered by the second attempt"
        );
        match run(Retry::OnlyIfNotSent).await {
            Err(Error::DeadlineExceeded { last, .. }) => {
                assert!(
                    last.contains("attempt timeout") && last.contains("not sent twice"),
                    "{last}"
                );
            }
            other => panic!("a strict call was sent again: {other:?}"),
        }
    }

    /// What tonic answers when it ends a call at the `grpc-timeout` the
    /// request carries (the attempt's budget): CANCELLED with its
    /// TimeoutExpired as the source, like a transport error.
    fn tonic_timeout() -> tonic::Status {
        tonic::Status::from_error(Box::new(tonic::TimeoutExpired(())))
    }

    /// tonic's own timeout of an attempt (it fires with the attempt
    /// timeout, often first) is the attempt timeout: a strict call ends
    /// with DEADLINE_EXCEEDED naming the attempt timeout, not as a
    /// transport failure (UNAVAILABLE, after an HTTP/1.1 probe of the
    /// stalled node on top of the budget); another call moves on.
    #[tokio::test]
    async fn tonics_own_timeout_of_an_attempt_is_the_attempt_timeout() {
        assert!(out_of_time(&tonic_timeout()));
        assert!(!out_of_time(&reset_after_send()));
        assert!(!out_of_time(&tonic::Status::cancelled("Timeout expired")));
        let mut c = caller(&["127.0.0.1:1", "127.0.0.1:2"]);
        c.settings.deadline = Duration::from_secs(30);
        c.settings.attempt_timeout = Duration::from_millis(200);
        let count = AtomicUsize::new(0);
        let strict: Result<(), Error> = c
            .call("GenIds", Retry::OnlyIfNotSent, |_, _| {
                count.fetch_add(1, Ordering::SeqCst);
                async { Err(tonic_timeout()) }
            })
            .await;
        match strict {
            Err(Error::DeadlineExceeded { last, attempts, .. }) => {
                assert_eq!(attempts, 1, "{last}");
                assert!(
                    last.contains("attempt timeout of 200ms") && last.contains("not sent twice"),
                    "{last}"
                );
            }
            other => panic!("a strict call whose attempt timed out: {other:?}"),
        }
        assert_eq!(count.load(Ordering::SeqCst), 1, "sent once");
        let count = AtomicUsize::new(0);
        let idempotent: Result<usize, Error> = c
            .call("GenIds", Retry::Idempotent, |_, _| {
                let n = count.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n == 0 {
                        return Err(tonic_timeout());
                    }
                    Ok(n)
                }
            })
            .await;
        assert_eq!(idempotent.expect("the second node answers"), 1);
        // The last attempt cut short by the deadline: DEADLINE_EXCEEDED.
        let c = caller(&["127.0.0.1:1"]);
        let last: Result<(), Error> = c
            .call("GenIds", Retry::OnlyIfNotSent, |_, _| async {
                Err(tonic_timeout())
            })
            .await;
        match last {
            Err(Error::DeadlineExceeded { last, .. }) => {
                assert!(last.contains("did not answer in time"), "{last}");
            }
            other => panic!("an attempt cut short by the deadline: {other:?}"),
        }
    }

    #[test]
    fn transport_failures_are_told_in_words() {
        let text = describe(&refused(), crate::tls::TlsUse::Plaintext, false);
        assert!(text.starts_with("connection refused"), "{text}");
        assert!(!text.contains("Unknown"), "{text}");
        let e = Error::Transport {
            node: "10.0.0.1:50051".into(),
            cause: describe(&reset_after_send(), crate::tls::TlsUse::Plaintext, false),
        };
        let text = e.to_string();
        assert!(
            text.contains("10.0.0.1:50051") && text.contains("connection broke"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_strict_call_that_reached_a_node_is_never_sent_again() {
        // A node answered (UNAVAILABLE) or the connection broke after the
        // request left: the node may have taken a value, so no retry.
        assert_eq!(
            attempts(Retry::OnlyIfNotSent, || tonic::Status::unavailable("x")).await,
            1
        );
        assert_eq!(attempts(Retry::OnlyIfNotSent, reset_after_send).await, 1);
        // Never sent: another node is tried.
        assert!(attempts(Retry::OnlyIfNotSent, refused).await > 1);
        // Other modes retry UNAVAILABLE on another node.
        assert!(attempts(Retry::Idempotent, || tonic::Status::unavailable("x")).await > 1);
    }
}
