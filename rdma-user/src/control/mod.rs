//! The control plane: the daemon (`up`) that owns one interface and serves
//! the CLI over a unix socket, and the JSON protocol between them.
//!
//! It reaches the data path only by sending jobs to its thread; nothing here
//! runs per packet.

pub mod daemon;
pub mod ibdev;
pub mod links;
pub mod proto;
