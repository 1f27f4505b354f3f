//! Software RoCEv2 over XDP/AF_XDP.
//!
//! Data flows XDP classify -> AF_XDP rings -> [`engine`] -> memory/completions.
//! [`wire`] is the packet format, [`engine`] the sans-IO RC transport.

pub mod capture;
pub mod wire;
