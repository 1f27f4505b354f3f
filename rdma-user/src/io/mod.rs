//! The kernel interfaces: AF_XDP sockets and UMEM ([`xsk`]), the XDP
//! program's loader and maps ([`xdp`]), raw AF_PACKET sockets for the relay
//! ([`packet`]) and facts about the host's network ([`hostnet`]).
//!
//! Nothing here knows RoCE transport semantics: bytes in, bytes out.

pub mod hostnet;
pub mod packet;
pub mod xdp;
pub mod xsk;
