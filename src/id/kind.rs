//! What kind of failure an error is, said once by each error type
//! (quickwit's pattern): the caller's mistake, something missing or
//! already there, a precondition, a limit, or a passing failure. The
//! server maps kinds to gRPC codes and HTTP statuses in one place
//! (`server::status`).

/// The kind of a failure, independent of any transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request is malformed: fix it (INVALID_ARGUMENT, 400).
    BadRequest,
    /// What the request names does not exist (NOT_FOUND, 404).
    NotFound,
    /// What the request would create exists already (ALREADY_EXISTS, 409).
    AlreadyExists,
    /// The node or the cluster is not in a state to do it, and retrying
    /// will not help until an operator acts (FAILED_PRECONDITION, 400).
    Precondition,
    /// A counter, a space or a configured limit is used up
    /// (RESOURCE_EXHAUSTED, 429).
    Exhausted,
    /// Lost a race with a concurrent change; read again and retry
    /// (ABORTED, 409).
    Conflict,
    /// A passing failure: retry, here later or on another node
    /// (UNAVAILABLE, 503).
    Unavailable,
    /// The caller did not say who it is (UNAUTHENTICATED, 401).
    Unauthenticated,
    /// The caller may not do this (PERMISSION_DENIED, 403).
    Denied,
    /// A bug or a broken set-up (INTERNAL, 500).
    Internal,
}

/// Creating one more tag, key or namespace would pass a configured limit
/// on how many may exist (`segment.max_tags`, `strict.max_namespaces`,
/// `strict.max_keys_per_namespace`); nothing was created or reserved.
/// Segment and strict refusals carry it (`SegmentError::LimitReached`,
/// `StrictError::LimitReached`); its kind is [`ErrorKind::Exhausted`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: the limit of {limit} set by {setting} is reached, so nothing was created; delete unused ones with the admin API (`idgen admin`), or raise {setting}")]
pub struct LimitReached {
    /// What could not be created (`segment tag "x"`, ...).
    pub what: String,
    /// The limit.
    pub limit: u64,
    /// The config key that sets it, also the metric label.
    pub setting: &'static str,
}
