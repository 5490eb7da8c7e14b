//! The pure core: ID layouts, the snowflake generator, segment ranges,
//! lease blocks, the double buffer both serve from, strict counters, UUIDv7
//! bits and text, the
//! formatted-ID rules (templates, periods, presets, sandboxed Lua) and the
//! clock trait.
//!
//! Nothing here does I/O, spawns, sleeps or awaits; time comes in through
//! [`clock::Clock`] and durability is the caller's job (see `store`). That
//! keeps every rule about uniqueness testable with a manual clock.

pub mod buffer;
pub mod clock;
pub mod deadline;
pub mod decode;
pub mod format;
pub mod hide;
pub mod kind;
pub mod layout;
pub mod lease;
pub mod mode;
pub mod segment;
pub mod snowflake;
pub mod strict;
pub mod uuid;

pub use clock::{Clock, ManualClock, OffsetClock, SystemClock};
pub use deadline::Deadline;
pub use kind::{ErrorKind, LimitReached};
pub use layout::{
    epoch_text, DecodeError, IdParts, Layout, LayoutDifference, LayoutError, LayoutSpec, Preset,
    DEFAULT_EPOCH_MS,
};
pub use mode::{check_count, Mode, RequestError};
pub use snowflake::{
    GenError, Reservation, Snowflake, StartError, StartPlan, StepBackStats, UuidReservation,
};
pub use uuid::{Uuid, UuidError, UuidLayout, UuidParts};
