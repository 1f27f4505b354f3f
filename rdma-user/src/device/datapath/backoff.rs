//! How the data path's thread waits between turns.

use crate::device::rings::Doorbell;
use crate::transport::Nanos;

/// Adaptive polling: spin while packets move; once idle for a while, sleep
/// in growing steps, never past the next engine timer and never long (a
/// packet arriving meanwhile waits in the RX ring).
pub struct Backoff {
    adaptive: bool,
    idle: u32,
    /// Idle polls spun before sleeping.
    spin: u32,
}

impl Backoff {
    /// Spins 256 idle polls before it sleeps: for a data path that owns
    /// its core (the daemon, the tools).
    pub fn new(adaptive: bool) -> Backoff {
        Backoff {
            adaptive,
            idle: 0,
            spin: 256,
        }
    }

    /// Sleeps at the first idle poll: for a data path that shares its
    /// core with the program it serves (the verbs library, where the
    /// program's own polls run the data path while it is busy). Spinning
    /// there only takes the core from the program.
    pub fn eager(adaptive: bool) -> Backoff {
        Backoff {
            adaptive,
            idle: 0,
            spin: 0,
        }
    }

    pub fn reset(&mut self) {
        self.idle = 0;
    }

    /// Call after each `DataPath::poll` with its result.
    pub fn after_poll(&mut self, now: Nanos, work: bool, next: Option<Nanos>) {
        if work {
            self.idle = 0;
            return;
        }
        self.idle = self.idle.saturating_add(1);
        if self.adaptive && self.idle > self.spin {
            let mut d = std::time::Duration::from_micros(50u64 << (self.idle / 1024).min(4));
            if let Some(t) = next {
                d = d.min(std::time::Duration::from_nanos(t.saturating_sub(now)));
            }
            std::thread::sleep(d);
        } else {
            std::hint::spin_loop();
        }
    }

    /// Like `after_poll`, but an idle thread waits in poll(2) on `fds` (the
    /// AF_XDP sockets and the doorbell) instead of sleeping blind: a frame
    /// or a post wakes it at once, and the next timer deadline bounds the
    /// wait to the nanosecond. `work_waiting` is the last check after the
    /// doorbell knows we sleep.
    /// `fds` ends with the doorbell's. With `frames_to_program` (the
    /// program polls: its frames are its own to move while its inline hold
    /// lasts) the wait is for the doorbell and the clock only, until the
    /// hold ends; `clock` reads the data path's clock then.
    #[allow(clippy::too_many_arguments)]
    pub fn after_poll_waiting(
        &mut self,
        now: Nanos,
        work: bool,
        next: Option<Nanos>,
        fds: &mut [libc::pollfd],
        doorbell: &Doorbell,
        frames_to_program: bool,
        clock: impl Fn() -> Nanos,
        work_waiting: impl FnOnce() -> bool,
    ) {
        if work || !self.adaptive || self.idle < self.spin {
            return self.after_poll(now, work, next);
        }
        self.idle = self.idle.saturating_add(1);
        // Idle for long: wait up to 16 ms between checks of the stop flag.
        const MAX_WAIT: Nanos = 16_000_000;
        let cap: u64 = (1_000_000 << (self.idle / 1024).min(4)).min(MAX_WAIT);
        let has_fds = !fds.is_empty();
        let until = |now: Nanos, hold: Nanos| {
            let mut ns = cap;
            if let Some(t) = next {
                ns = ns.min(t.saturating_sub(now));
            }
            match doorbell
                .inline_hold_until(hold)
                .filter(|_| frames_to_program)
            {
                Some(t) if t > now && has_fds => (ns.min(t - now), true),
                _ => (ns, false),
            }
        };
        let mut hold = crate::device::rings::INLINE_HOLD_NS;
        let (mut ns, mut held) = until(now, hold);
        doorbell.going_to_sleep(now.saturating_add(ns));
        if work_waiting() {
            doorbell.woke();
            return;
        }
        let last = fds.len().saturating_sub(1);
        let slept_from = now;
        while ns > 0 {
            let fds = if held { &mut fds[last..] } else { &mut fds[..] };
            if crate::io::ppoll_ns(fds, ns) || !held {
                break;
            }
            // The hold ran out. If the program has polled since, it still
            // moves its own frames: sleep on, without a turn, and twice as
            // long (up to INLINE_HOLD_MAX_NS). Waking every 200 us instead
            // costs unmodified ib_send_lat dearly: 14 432 context switches
            // in a 50 000-iteration run against 2 353 with this sleep, and
            // alternated runs against a hold that never ends gave 0.74 and
            // 0.85 of the latency. Posts and control calls ring the
            // doorbell (still told that we sleep), so none goes unseen; the
            // stop flag is looked at every MAX_WAIT at the latest.
            let now = clock();
            let polled_since = doorbell.inline_hold_until(hold).is_some_and(|t| t > now);
            if !polled_since
                || next.is_some_and(|t| t <= now)
                || now >= slept_from.saturating_add(MAX_WAIT)
            {
                break;
            }
            // Still held: the longer hold ends after the one just found
            // running.
            hold = (hold * 2).min(crate::device::rings::INLINE_HOLD_MAX_NS);
            (ns, held) = until(now, hold);
            doorbell.going_to_sleep(now.saturating_add(ns));
        }
        doorbell.woke();
    }
}
