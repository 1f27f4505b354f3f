//! The kernel interfaces: AF_XDP sockets and UMEM ([`xsk`]), the XDP
//! program's loader and maps ([`xdp`]), raw AF_PACKET sockets for the relay
//! ([`packet`]) and facts about the host's network ([`hostnet`]).
//!
//! Nothing here knows RoCE transport semantics: bytes in, bytes out.

pub mod hostnet;
pub mod packet;
pub mod xdp;
pub mod xsk;

/// Waits in ppoll(2) until one of `fds` is ready or `ns` nanoseconds pass
/// (what the data path and the relay do when idle). Returns whether one
/// was ready (false: the time ran out, or a signal came).
pub fn ppoll_ns(fds: &mut [libc::pollfd], ns: u64) -> bool {
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: fds is a valid array of pollfd for its length; ts is a local;
    // no signal mask change.
    unsafe {
        libc::ppoll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        ) > 0
    }
}
