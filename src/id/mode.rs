//! ID modes and the checks every request passes before it reaches a
//! generator.

use super::kind::ErrorKind;
use std::fmt;

use thiserror::Error;

/// How an ID is produced (README: the modes and what each guarantees).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Time-ordered IDs: time | datacenter | worker | sequence.
    Snowflake,
    /// Dense per-tag numbers from reserved ranges.
    Segment,
    /// Clock-free IDs from a leased token's sequence.
    Lease,
    /// Cluster-wide strictly increasing counter per key.
    Strict,
}

impl Mode {
    /// Every mode, in the order they appear in the proto.
    pub const ALL: [Mode; 4] = [Mode::Snowflake, Mode::Segment, Mode::Lease, Mode::Strict];

    /// The lower-case name used in config, the JSON API and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Snowflake => "snowflake",
            Mode::Segment => "segment",
            Mode::Lease => "lease",
            Mode::Strict => "strict",
        }
    }

    /// Parses a mode name; the error lists the valid ones.
    pub fn parse(name: &str) -> Result<Self, RequestError> {
        Self::ALL
            .into_iter()
            .find(|m| m.as_str() == name)
            .ok_or_else(|| RequestError::UnknownMode(name.to_owned()))
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A request that is wrong in itself, whatever the server's state.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RequestError {
    /// `count` outside `1..=max`.
    #[error(
        "count must be between 1 and {max}, got {got}; split larger batches into several calls"
    )]
    BadCount {
        /// What was asked for.
        got: u64,
        /// The server's `server.max_batch`.
        max: u32,
    },
    /// A mode name or number that does not exist.
    #[error("unknown mode {0:?}; use snowflake, segment, lease or strict")]
    UnknownMode(String),
    /// The mode exists but this server does not serve it.
    #[error("mode {0} is not enabled on this server (see its config section, e.g. [segment] enabled = true); use mode snowflake")]
    ModeNotEnabled(Mode),
    /// The mode needs a tag and none was given.
    #[error("mode {0} needs a tag (the name of the sequence, a-z 0-9 _ -)")]
    MissingTag(Mode),
    /// Strict mode needs a key and none was given.
    #[error("mode strict needs a key in `tag`: <namespace>/<key>, e.g. books/moby-dick")]
    MissingKey,
    /// IDs of this mode carry no fields.
    #[error("mode {0} IDs are plain numbers with no fields to decode{hint}", hint = if *.0 == Mode::Segment { "; an ID of a hidden tag decodes with its tag (tag=NAME, idgen decode ID --mode segment --tag NAME --addr NODE)" } else { "" })]
    NothingToDecode(Mode),
    /// A hidden tag's ID that its key cannot undo (a key version the key
    /// never had): not an ID the tag showed.
    #[error("{id} cannot be revealed as an ID of segment tag {tag:?} (hide key {key:?}): {why}")]
    NotRevealed {
        /// The ID.
        id: u64,
        /// The tag.
        tag: String,
        /// Its hide key id.
        key: String,
        /// What the hider said.
        why: String,
    },
    /// A segment tag named for a decode is not hidden.
    #[error("segment tag {0:?} is not hidden: its IDs are the plain values themselves, with no fields to decode")]
    PlainTag(String),
    /// An ID that a hidden segment tag cannot have shown.
    #[error("{id} is not an ID of hidden segment tag {tag:?}: its IDs are below 2^{bits}; check the ID and the tag")]
    NotTagId {
        /// The ID.
        id: u64,
        /// The tag.
        tag: String,
        /// Its version and domain bits together.
        bits: u32,
    },
    /// A tag was given where the mode takes none.
    #[error("mode {0} takes no tag; leave tag empty")]
    UnexpectedTag(Mode),
    /// A malformed query string or parameter in the HTTP API.
    #[error("bad request: {0}")]
    BadQuery(String),
}

impl RequestError {
    /// What kind of failure this is (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::ModeNotEnabled(_) => ErrorKind::Precondition,
            _ => ErrorKind::BadRequest,
        }
    }
}

/// Checks a batch size against the server's maximum.
pub fn check_count(count: u64, max: u32) -> Result<u32, RequestError> {
    if count == 0 || count > u64::from(max) {
        return Err(RequestError::BadCount { got: count, max });
    }
    // In range of a u32 because max is one.
    Ok(count as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_round_trip_by_name() {
        for m in Mode::ALL {
            assert_eq!(Mode::parse(m.as_str()), Ok(m));
        }
        assert_eq!(
            Mode::parse("uuid"),
            Err(RequestError::UnknownMode("uuid".into()))
        );
    }

    #[test]
    fn counts_are_bounded() {
        assert_eq!(check_count(1, 10), Ok(1));
        assert_eq!(check_count(10, 10), Ok(10));
        assert!(check_count(0, 10).is_err());
        assert!(check_count(11, 10).is_err());
        assert!(check_count(u64::MAX, 10).is_err());
        let msg = check_count(0, 10_000).unwrap_err().to_string();
        assert!(msg.contains("between 1 and 10000"), "{msg}");
    }
}
