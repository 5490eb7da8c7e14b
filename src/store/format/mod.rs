//! Formatted mode's durable state: the counters IDs are rendered from
//! ([`counters`]), the catalog of format definitions every node serves
//! ([`catalog`]), the tokens some formats render ([`tokens`]), and the
//! margins a restored state file moves counters by ([`restore`]).

pub mod catalog;
pub mod counters;
pub mod restore;
pub mod tokens;
