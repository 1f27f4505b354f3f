//! Software RoCEv2 over XDP/AF_XDP.
//!
//! Data flows XDP classify -> AF_XDP rings -> [`engine`] -> memory/completions.
//! [`wire`] is the packet format, [`engine`] the sans-IO RC transport, [`mr`]
//! the memory regions it reads and writes.

pub mod baseline;
pub mod bench;
pub mod capture;
pub mod daemon;
pub mod datapath;
pub mod engine;
pub mod hostile;
pub mod hostnet;
pub mod impair;
pub mod mr;
pub mod packet;
pub mod pingpong;
pub mod proto;
pub mod relay;
pub mod rng;
pub mod soak;
pub mod standalone;
pub mod verbs;
pub mod wire;
pub mod xdp;
pub mod xsk;
