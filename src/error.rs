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
    /// A mode's rules refused the request (unknown tag, strict key used
    /// up, bad format parameters...): the one shape every domain refusal
    /// reaches the front ends in, whichever layer found it.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The state store failed (disk, Consul, a lost state file, a rolled
    /// back store); never a domain refusal, which is [`Error::Refused`].
    #[error(transparent)]
    Store(StoreError),
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

/// A refusal by a mode's rules. Stores find many of them in the same
/// transaction that would write (a tag that exists, a counter used up),
/// so they return them inside [`StoreError`]; converting to [`enum@Error`]
/// takes them out, so a front end sees one shape whoever refused.
#[derive(Debug, Error)]
pub enum Refusal {
    /// Segment mode: a tag unknown, deleted, existing, badly named or
    /// used up, or a limit reached.
    #[error(transparent)]
    Segment(#[from] crate::id::segment::SegmentError),
    /// Strict mode: a key, step or request invalid, or the key used up.
    #[error(transparent)]
    Strict(#[from] crate::id::strict::StrictError),
    /// Lease mode: a token's sequence used up, or no token free.
    #[error(transparent)]
    Lease(#[from] crate::id::lease::LeaseError),
    /// Formatted mode: an unknown format, bad parameters, a counter used
    /// up in its period, a Lua rule failing.
    #[error(transparent)]
    Format(#[from] crate::id::format::FormatError),
    /// A hide key operation refused (bad key id, unknown or existing key,
    /// no or wrong master key).
    #[error(transparent)]
    HideKey(#[from] crate::store::hide_keys::HideKeyError),
}

impl Refusal {
    /// What kind of failure this is: the refusing mode's own kind.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Segment(e) => e.kind(),
            Self::Strict(e) => e.kind(),
            Self::Lease(e) => e.kind(),
            Self::Format(e) => e.kind(),
            Self::HideKey(e) => e.kind(),
        }
    }
}

impl From<StoreError> for Error {
    /// Takes a domain refusal out of the store's error
    /// ([`Error::Refused`]); the rest stays a store failure.
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Segment(e) => Self::Refused(e.into()),
            StoreError::Strict(e) => Self::Refused(e.into()),
            StoreError::Lease(e) => Self::Refused(e.into()),
            StoreError::Format(e) => Self::Refused(e.into()),
            StoreError::HideKey(e) => Self::Refused(e.into()),
            e => Self::Store(e),
        }
    }
}

macro_rules! refusal_into_error {
    ($($t:ty),*) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Self {
                Self::Refused(e.into())
            }
        }
    )*};
}

refusal_into_error!(
    crate::id::segment::SegmentError,
    crate::id::strict::StrictError,
    crate::id::lease::LeaseError,
    crate::id::format::FormatError,
    crate::store::hide_keys::HideKeyError
);

impl From<crate::store::hwm::KeeperStartError> for Error {
    fn from(e: crate::store::hwm::KeeperStartError) -> Self {
        use crate::store::hwm::KeeperStartError as K;
        match e {
            K::Store(e) => e.into(),
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
            Self::Refused(e) => e.kind(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::format::FormatError;
    use crate::id::lease::LeaseError;
    use crate::id::segment::SegmentError;
    use crate::id::strict::StrictError;
    use crate::store::hide_keys::HideKeyError;

    /// Issue 34 item 5: a store's domain refusal comes out of the
    /// `StoreError` it travelled in, with its kind (so its gRPC code and
    /// HTTP status) and its text unchanged; a store failure stays one.
    #[test]
    fn domain_refusals_reach_the_front_ends_in_one_shape() {
        let refusals = [
            StoreError::Segment(SegmentError::TagNotFound("t".into())),
            StoreError::Strict(StrictError::BadStep(0)),
            StoreError::Lease(LeaseError::BadZone(200)),
            StoreError::Format(FormatError::NotFound("f".into())),
            StoreError::HideKey(HideKeyError::NotFound("k".into())),
        ];
        for e in refusals {
            let (kind, text) = (e.kind(), e.to_string());
            let error = Error::from(e);
            assert!(matches!(error, Error::Refused(_)), "{error:?}");
            assert_eq!((error.kind(), error.to_string()), (kind, text));
        }
        let failure = Error::from(StoreError::Backend("disk".into()));
        assert!(matches!(failure, Error::Store(_)), "{failure:?}");
        let direct = Error::from(FormatError::NotFound("f".into()));
        assert!(
            matches!(direct, Error::Refused(Refusal::Format(_))),
            "{direct:?}"
        );
    }
}
