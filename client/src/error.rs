//! What can go wrong when asking for IDs.

use std::time::Duration;

/// A failed client call.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// No node is known: the static list was empty, or Consul has not
    /// listed a passing instance yet.
    #[error("no idgen node is known: check the endpoint list or the Consul service name, tag and datacenter")]
    NoNodes,
    /// The call's deadline passed before any node answered.
    #[error("no node answered within the deadline of {deadline:?}{} (last error: {last})", tried(*attempts, *nodes))]
    DeadlineExceeded {
        /// The configured per-call deadline.
        deadline: Duration,
        /// The last error seen, or `none` if no attempt finished.
        last: String,
        /// How many attempts were made (0: the wait was for something
        /// else, such as a prefetch refill). Said with the error because
        /// "one attempt on one node" and "40 attempts on 3 nodes" call for
        /// different fixes (the address, or the cluster).
        attempts: u32,
        /// How many distinct nodes those attempts went to.
        nodes: usize,
    },
    /// A node answered with an error that retrying on another node cannot
    /// fix (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, ...), or a
    /// strict call failed in a way that may have reached the node.
    #[error("idgen answered {code:?}: {message}")]
    Status {
        /// The gRPC code.
        code: tonic::Code,
        /// The server's message (it says what to do).
        message: String,
    },
    /// A call failed on its way to or from a node (connection refused or
    /// broken, TLS mismatch) and cannot be retried elsewhere (a strict
    /// call that may have reached the node).
    #[error("the call to {node} failed in transit: {cause}")]
    Transport {
        /// The node's address.
        node: String,
        /// What happened, in words, with the underlying error.
        cause: String,
    },
    /// Strict values are linearizable only when every call goes to a
    /// node; they cannot be prefetched.
    #[error(
        "strict mode cannot be prefetched (each value must come from a node): use Client::gen_id"
    )]
    StrictNotPrefetchable,
    /// A strict, segment, lease or formatted call while the nodes in use
    /// are a fallback datacenter's (the local one lists no passing node):
    /// its value would come from that datacenter's counter, which can
    /// hand out a value the local cluster also hands out. Never sent;
    /// retry once a local node passes, or see
    /// `ConsulDiscovery::counters_may_cross_datacenters`.
    #[error("{counter} refused: the local Consul datacenter {local:?} has no passing idgen node and the nodes in use are fallback datacenter {fallback:?}'s, whose counters are not the local cluster's (a value from there can repeat one issued here); retry once a local node passes, or opt in with counters_may_cross_datacenters if each datacenter's keys and tags are its own")]
    CrossesDatacenters {
        /// What the call counts, e.g. `strict key "flights/lh400"`.
        counter: String,
        /// The local (first asked) Consul datacenter.
        local: String,
        /// The fallback datacenter whose nodes are in use.
        fallback: String,
    },
    /// The client was configured wrongly.
    #[error("invalid client configuration: {0}")]
    Config(String),
    /// Consul could not be asked for the nodes at start-up.
    #[error("Consul discovery failed: {0}")]
    Discovery(String),
    /// A node answered something this client cannot read (a node of
    /// another version, or a proxy in between).
    #[error("a node's answer makes no sense: {what}")]
    BadAnswer {
        /// What was wrong with it.
        what: String,
    },
}

/// " after N attempts on M nodes", or nothing when no attempt was made.
fn tried(attempts: u32, nodes: usize) -> String {
    if attempts == 0 {
        return String::new();
    }
    let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
    format!(
        " after {} on {}",
        plural(attempts as usize, "attempt"),
        plural(nodes, "node")
    )
}

impl Error {
    /// The gRPC code closest to this error.
    pub fn code(&self) -> tonic::Code {
        match self {
            Error::NoNodes
            | Error::Discovery(_)
            | Error::Transport { .. }
            | Error::CrossesDatacenters { .. } => tonic::Code::Unavailable,
            Error::DeadlineExceeded { .. } => tonic::Code::DeadlineExceeded,
            Error::Status { code, .. } => *code,
            Error::StrictNotPrefetchable | Error::Config(_) => tonic::Code::InvalidArgument,
            Error::BadAnswer { .. } => tonic::Code::Internal,
        }
    }
}

impl From<tonic::Status> for Error {
    fn from(s: tonic::Status) -> Self {
        Error::Status {
            code: s.code(),
            message: s.message().to_owned(),
        }
    }
}
