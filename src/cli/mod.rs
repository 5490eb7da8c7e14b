//! Pieces every client command shares: where to connect, how long to wait,
//! how errors and output read.

pub mod client;
pub mod output;
