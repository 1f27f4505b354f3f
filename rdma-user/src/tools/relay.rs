//! The impairment relay: forwards every frame between two interfaces (the
//! middle of host A - relay - host B, or our host - relay - the rxe VM) and
//! applies the seeded faults of an [`Impairer`] to RoCEv2 frames.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::io::packet::{RawSocket, VNET_HDR_LEN};
use crate::tools::impair::{DirStats, ImpairConfig, Impairer};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

#[derive(Debug, Clone, Serialize)]
pub struct RelayReport {
    pub config: ImpairConfig,
    pub a: String,
    pub b: String,
    /// Frames that came from A (and went towards B), and the reverse.
    pub a_to_b: DirStats,
    pub b_to_a: DirStats,
    pub seconds: f64,
}

/// Runs until SIGINT/SIGTERM (or `max` elapses), then returns the counters.
pub fn run(
    a: &str,
    b: &str,
    cfg: ImpairConfig,
    max: Option<Duration>,
    progress: bool,
) -> Result<RelayReport> {
    let socks = [
        RawSocket::bind(a, true).with_context(|| format!("relay side A ({a})"))?,
        RawSocket::bind(b, true).with_context(|| format!("relay side B ({b})"))?,
    ];
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let mut imp = Impairer::new(cfg);
    let start = Instant::now();
    let now = || start.elapsed().as_nanos() as u64;
    // GSO frames from a veth may be up to 64 KiB plus the header.
    let mut buf = vec![0u8; 65536 + VNET_HDR_LEN + 64];
    let mut last_report = Instant::now();
    let mut send_err = None;
    while !STOP.load(Ordering::Relaxed) && max.is_none_or(|m| start.elapsed() < m) {
        let mut got = false;
        for (dir, s) in socks.iter().enumerate() {
            for _ in 0..64 {
                match s.try_recv(&mut buf)? {
                    Some(n) => {
                        got = true;
                        imp.push(now(), dir, &buf[..n], VNET_HDR_LEN);
                    }
                    None => break,
                }
            }
        }
        imp.drain(now(), |dir, f| {
            if let Err(e) = socks[dir ^ 1].send(f) {
                send_err.get_or_insert(e);
            }
        });
        if let Some(e) = send_err.take() {
            return Err(e).context("relay send");
        }
        if progress && last_report.elapsed() > Duration::from_secs(5) {
            last_report = Instant::now();
            eprintln!(
                "relay: A->B {:?}\nrelay: B->A {:?}",
                imp.stats[0], imp.stats[1]
            );
        }
        if got {
            continue;
        }
        // Sleep until a frame arrives or the next frame is due.
        let wait_ns = imp
            .next_deadline()
            .map(|t| t.saturating_sub(now()))
            .unwrap_or(100_000_000)
            .min(100_000_000);
        let mut fds = [
            libc::pollfd {
                fd: socks[0].fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: socks[1].fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let ts = libc::timespec {
            tv_sec: (wait_ns / 1_000_000_000) as i64,
            tv_nsec: (wait_ns % 1_000_000_000) as i64,
        };
        // SAFETY: fds and ts are valid for the call.
        unsafe { libc::ppoll(fds.as_mut_ptr(), 2, &ts, std::ptr::null()) };
    }
    // Whatever is still delayed is delivered, not lost.
    imp.drain(u64::MAX, |dir, f| {
        let _ = socks[dir ^ 1].send(f);
    });
    Ok(RelayReport {
        config: cfg,
        a: a.into(),
        b: b.into(),
        a_to_b: imp.stats[0],
        b_to_a: imp.stats[1],
        seconds: start.elapsed().as_secs_f64(),
    })
}
