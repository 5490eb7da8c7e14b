//! The crate-wide error: every way a request can fail, and the start-up
//! failures of the layers below the cluster. A worker id that cannot be
//! claimed is the cluster's own error (`cluster::membership::JoinError`).
//!
//! Core errors stay typed all the way up; `server::status` is the one place
//! they become gRPC codes and HTTP statuses.

pub use crate::id::ErrorKind;
use thiserror::Error;

use crate::id::{DecodeError, GenError, LayoutError, RequestError, StartError};
use crate::store::StoreError;

/// Anything that can go wrong serving a request or starting a node.
#[derive(Debug, Error)]
pub enum Error {
    /// The request is malformed or asks for something not served.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// The generator refused to issue.
    #[error(transparent)]
    Gen(#[from] GenError),
    /// An ID does not decode under the configured layout.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// The layout or node id is invalid.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// UUID text that does not read, or a layout too wide for UUIDs.
    #[error(transparent)]
    Uuid(#[from] crate::id::UuidError),
    /// The node may not start (clock behind the stored mark).
    #[error(transparent)]
    Start(#[from] StartError),
    /// The state store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Consul failed.
    #[error(transparent)]
    Consul(#[from] crate::consul::ConsulError),
    /// The cluster's recorded layout refused this node's, or a change.
    #[error(transparent)]
    ClusterLayout(#[from] crate::store::cluster_layout::ClusterLayoutError),
    /// The process could not set itself up (metrics recorder, threads).
    #[error("setup failed: {0}")]
    Setup(String),
    /// The node lost its worker lock and has not claimed one again.
    #[error("this node lost its worker lock in Consul (Consul unreachable or session expired) and stopped issuing; it is claiming an id again; retry on another node")]
    Fenced,
    /// The node is fenced because an operator changed the cluster's layout:
    /// it stays fenced until restarted with the new one (the text says
    /// from what to what, when and by whom).
    #[error("{0}")]
    LayoutChanged(String),
    /// Segment mode has no IDs in memory for a tag and cannot get more.
    #[error("segment tag {tag:?} has no IDs left in memory and no new range could be taken ({reason}); retry later or on another node")]
    SegmentUnavailable {
        /// The tag.
        tag: String,
        /// Why the store did not deliver.
        reason: String,
    },
    /// Lease mode has no block in memory and cannot reserve one.
    #[error("lease mode has no reserved block left and cannot reserve one ({reason}); retry later or on another node")]
    LeaseUnavailable {
        /// Why the store did not deliver.
        reason: String,
    },
    /// A strict call could not be made durable; nothing was handed out.
    #[error("strict key {key:?}: no value was reserved ({reason}); nothing was handed out, retry (on another node if it persists)")]
    StrictUnavailable {
        /// The key.
        key: String,
        /// Why the store did not deliver.
        reason: String,
    },
    /// A hidden namespace cannot show IDs now (its key is missing or
    /// retired, or its active version does not fit the version field);
    /// the check comes before any value is taken, so nothing was reserved.
    #[error("{namespace} hides its IDs with key {key:?} and cannot issue: {reason}; nothing was handed out")]
    Hidden {
        /// The namespace (`segment tag "orders"`, `format "orders"`).
        namespace: String,
        /// The hide key id.
        key: String,
        /// What is wrong and the fix.
        reason: String,
    },
    /// A value that tells how many IDs a hidden namespace issued (a hidden
    /// format's counter) was asked for without admin credentials.
    #[error("{what} is shown only to admin callers, since it tells how many IDs were issued: call with the node's admin token (`authorization: Bearer <token>`; idgen format counter --admin-token-file FILE or IDGEN_ADMIN__TOKEN) or a client certificate named in its admin.client_cert_names")]
    AdminOnly {
        /// What was asked for (`the counter of hidden format "inv"`).
        what: String,
    },
    /// A call waited too long for the sequence to free up.
    #[error("waited {waited_ms} ms for a free sequence number without success; the node is overloaded or its high-water mark is stuck, retry on another node")]
    WaitTimeout {
        /// How long it waited.
        waited_ms: u64,
    },
}

impl From<crate::store::hwm::KeeperStartError> for Error {
    fn from(e: crate::store::hwm::KeeperStartError) -> Self {
        use crate::store::hwm::KeeperStartError as K;
        match e {
            K::Store(e) => Self::Store(e),
            K::Start(e) => Self::Start(e),
        }
    }
}

impl Error {
    /// What kind of failure this is (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Request(e) => e.kind(),
            Self::Gen(e) => e.kind(),
            Self::Decode(_) => ErrorKind::BadRequest,
            Self::Layout(e) => e.kind(),
            Self::Uuid(e) => e.kind(),
            Self::Start(e) => e.kind(),
            Self::Store(e) => e.kind(),
            Self::ClusterLayout(e) => e.kind(),
            Self::Setup(_) => ErrorKind::Internal,
            Self::LayoutChanged(_) => ErrorKind::Precondition,
            Self::Hidden { .. } => ErrorKind::Precondition,
            Self::AdminOnly { .. } => ErrorKind::Unauthenticated,
            Self::Consul(_)
            | Self::Fenced
            | Self::SegmentUnavailable { .. }
            | Self::LeaseUnavailable { .. }
            | Self::StrictUnavailable { .. }
            | Self::WaitTimeout { .. } => ErrorKind::Unavailable,
        }
    }
}
