//! Tools built on the stack: perftest-style benchmarks ([`bench`]), same-link
//! baselines ([`baseline`]), rc_pingpong's protocol ([`pingpong`]), the
//! impairment relay ([`impair`], [`relay`]), the soak workload ([`soak`])
//! the hostile-packet generator ([`hostile`]) and the congestion test bed's
//! flows ([`flow`]).
//!
//! The core (every other module of this crate) never imports these.

pub mod baseline;
pub mod bench;
pub mod flow;
pub mod hostile;
pub mod impair;
pub mod pingpong;
pub mod relay;
pub mod soak;

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// SIGINT and SIGTERM ask a long-running tool (the relay, a flow server)
/// to stop and write its report; [`stop_requested`] tells it.
pub(crate) fn stop_on_signals() {
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

pub(crate) fn stop_requested() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// Blocks until SIGINT or SIGTERM.
pub fn wait_for_stop_signal() {
    stop_on_signals();
    while !stop_requested() {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The wall clock, Unix nanoseconds: the one clock that processes in
/// different namespaces (a relay, its flows) share.
pub(crate) fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
