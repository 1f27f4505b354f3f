//! One interface's data path: AF_XDP rings -> parser -> transport -> memory
//! and completions, and back ([`datapath`]); how it is driven: on a thread of
//! its own with jobs between polls ([`runner`]), or by the caller's thread
//! ([`standalone`]).
//!
//! The data path never allocates, locks or logs per packet; control work
//! arrives as jobs between two polls.

pub mod datapath;
pub mod error;
pub mod gsi;
pub mod rings;
pub mod runner;
pub mod shard;
pub mod standalone;
