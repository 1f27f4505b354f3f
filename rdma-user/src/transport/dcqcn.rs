//! Congestion control as RoCE NICs do it: DCQCN (Zhu et al., "Congestion
//! Control for Large-Scale RDMA Deployments", SIGCOMM 2015).
//!
//! - **Notification point** ([`Np`]): a CE-marked request or READ response
//!   makes the receiver send a CNP to the sending QP, at most one per
//!   `np_min_time_between_cnps`.
//! - **Reaction point** ([`Dcqcn`]): per QP, the current rate RC and target
//!   rate RT. A CNP cuts RC by α/2 (RT keeps the old RC) and raises α by
//!   the gain g; α decays by (1 - g) every alpha period without a CNP. The
//!   rate recovers in stages driven by a timer and a byte counter: fast
//!   recovery (RC halfway to RT) for the first `rp_threshold` events of
//!   either kind, additive increase (RT += R_AI) once one of them passed it,
//!   hyper increase (RT += i R_HAI) once both did.
//!
//! Time-driven and sans-IO like the rest of the engine: the timers are
//! caught up lazily when the QP next sends or gets a CNP, so an idle QP
//! costs nothing, and a QP at line rate is not paced at all.
//!
//! The tunables carry mlx5's `cc_params` names; defaults follow the paper
//! (see [`CcParams::default`]).

use super::Nanos;

/// DCQCN's tunables (mlx5's names; rates in Mbit/s, times in µs).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct CcParams {
    /// The reaction point: cut the rate on CNPs (off: CNPs are counted as
    /// ignored and nothing is paced).
    pub enabled: bool,
    /// The rate a QP starts at and recovers to (the link's).
    pub line_rate: f64,
    /// R_AI, the additive increase step.
    pub rp_ai_rate: f64,
    /// R_HAI, the hyper increase step.
    pub rp_hai_rate: f64,
    /// The rate never falls below this.
    pub rp_min_rate: f64,
    /// The rate increase timer period.
    pub rp_time_reset: u64,
    /// The byte counter: one increase event per this many bytes sent.
    pub rp_byte_reset: u64,
    /// F: increase events of one kind before additive (and, with both,
    /// hyper) increase.
    pub rp_threshold: u32,
    /// g in 1/1024 units.
    pub rp_dce_tcp_g: u32,
    /// The alpha update period (K).
    pub rp_dce_tcp_rtt: u64,
    /// At most one rate cut per this period.
    pub rp_rate_reduce_monitor_period: u64,
    /// α at the first CNP, in 1/1024 units.
    pub rp_initial_alpha_value: u32,
    /// The notification point sends at most one CNP per QP per this period.
    pub np_min_time_between_cnps: u64,
}

impl Default for CcParams {
    /// The paper's values: g = 1/256, K = 55 µs, a 55 µs timer, a 150 KiB
    /// byte counter, F = 5, R_AI 40 Mbit/s, R_HAI 100 Mbit/s, α starting at
    /// 1 and 50 µs between CNPs; line rate 10 Gbit/s (a veth's) until the
    /// driver knows the link. mlx5's firmware defaults are smaller
    /// (`rp_dce_tcp_g` 1019, a 1 µs alpha period, R_AI 5 Mbit/s): see
    /// docs/congestion.md.
    fn default() -> Self {
        CcParams {
            enabled: true,
            line_rate: 10_000.0,
            rp_ai_rate: 40.0,
            rp_hai_rate: 100.0,
            rp_min_rate: 10.0,
            rp_time_reset: 55,
            rp_byte_reset: 150 * 1024,
            rp_threshold: 5,
            rp_dce_tcp_g: 4,
            rp_dce_tcp_rtt: 55,
            rp_rate_reduce_monitor_period: 4,
            rp_initial_alpha_value: 1024,
            np_min_time_between_cnps: 50,
        }
    }
}

impl CcParams {
    /// The tunables' names, as mlx5's `cc_params` spells them.
    pub const NAMES: [&'static str; 11] = [
        "rp_ai_rate",
        "rp_hai_rate",
        "rp_min_rate",
        "rp_time_reset",
        "rp_byte_reset",
        "rp_threshold",
        "rp_dce_tcp_g",
        "rp_dce_tcp_rtt",
        "rp_rate_reduce_monitor_period",
        "rp_initial_alpha_value",
        "np_min_time_between_cnps",
    ];

    /// Sets one tunable by its mlx5 name from `NAME=VALUE` text (rates in
    /// Mbit/s, times in µs, g and α in 1/1024).
    pub fn set(&mut self, assignment: &str) -> Result<(), String> {
        let (name, value) = assignment
            .split_once('=')
            .ok_or_else(|| format!("'{assignment}': expected NAME=VALUE"))?;
        let (name, value) = (name.trim(), value.trim());
        let bad = |e: &dyn std::fmt::Display| format!("{name}={value}: {e}");
        let int = || value.parse::<u64>().map_err(|e| bad(&e));
        let rate = || match value.parse::<f64>() {
            Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
            Ok(_) => Err(bad(&"a rate must be above 0")),
            Err(e) => Err(bad(&e)),
        };
        let per_1024 = || match int()? {
            v @ 0..=1024 => Ok(v as u32),
            _ => Err(bad(&"at most 1024 (units of 1/1024)")),
        };
        match name {
            "rp_ai_rate" => self.rp_ai_rate = rate()?,
            "rp_hai_rate" => self.rp_hai_rate = rate()?,
            "rp_min_rate" => self.rp_min_rate = rate()?,
            "rp_time_reset" => self.rp_time_reset = int()?.max(1),
            "rp_byte_reset" => self.rp_byte_reset = int()?.max(1),
            "rp_threshold" => self.rp_threshold = int()?.clamp(1, 1 << 16) as u32,
            "rp_dce_tcp_g" => self.rp_dce_tcp_g = per_1024()?,
            "rp_dce_tcp_rtt" => self.rp_dce_tcp_rtt = int()?.max(1),
            "rp_rate_reduce_monitor_period" => self.rp_rate_reduce_monitor_period = int()?,
            "rp_initial_alpha_value" => self.rp_initial_alpha_value = per_1024()?,
            "np_min_time_between_cnps" => self.np_min_time_between_cnps = int()?,
            _ => {
                return Err(format!(
                    "unknown DCQCN tunable '{name}'; known: {}",
                    Self::NAMES.join(", ")
                ))
            }
        }
        Ok(())
    }
}

const US: Nanos = 1000;
/// Timer catch-up is bounded: this many increase events reach line rate
/// from any rate (hyper increase at least doubles the distance covered).
const MAX_CATCH_UP: u64 = 100_000;

/// The notification point of one QP.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Np {
    last_cnp: Option<Nanos>,
    /// A CNP is due (sent before anything else the QP has).
    pub(super) pending: bool,
}

impl Np {
    /// A CE-marked packet arrived: a CNP is due unless one went out less
    /// than `min_gap_us` ago. Returns whether one is now due.
    pub(super) fn on_ce(&mut self, now: Nanos, min_gap_us: u64) -> bool {
        if self
            .last_cnp
            .is_some_and(|t| now.saturating_sub(t) < min_gap_us * US)
        {
            return false;
        }
        self.pending = true;
        self.last_cnp = Some(now);
        true
    }
}

/// The reaction point of one QP.
#[derive(Debug, Clone, Copy)]
pub struct Dcqcn {
    pub p: CcParams,
    /// Current and target rate, Mbit/s.
    pub rc: f64,
    pub rt: f64,
    pub alpha: f64,
    /// Increase events so far since the last cut: timer (T) and byte
    /// counter (BC).
    t_events: u32,
    bc_events: u32,
    bytes: u64,
    /// When the next timer event and alpha update fall due.
    next_timer: Nanos,
    next_alpha: Nanos,
    last_cut: Option<Nanos>,
    /// Earliest time the next packet may leave (pacing at RC).
    next_tx: Nanos,
    /// The latest time the engine was given.
    now: Nanos,
    /// The rate this QP actually sent at: bytes of the current window
    /// (from `win_start`), and the last `hist_len` full windows (length,
    /// bytes) in a ring at `hist_at`.
    win_start: Nanos,
    win_bytes: u64,
    hist: [(Nanos, u64); RATE_HISTORY],
    hist_len: usize,
    hist_at: usize,
}

/// How far behind its pacing schedule a QP may fall and still catch up:
/// a thread's wake-up comes tens of microseconds late, which would
/// otherwise be lost rate on every packet.
const PACING_SLACK: Nanos = 200_000;

/// The window over which the rate a QP actually sent is measured.
const RATE_WINDOW: Nanos = 1_000_000;

/// The rate a QP sent at is that of its last this many windows together:
/// a window-limited QP sends a burst per round trip at its paced rate and
/// waits, and a window holds a burst or a wait, not both. Eight windows
/// span several round trips of the test bed's queues (8 ms at least).
const RATE_HISTORY: usize = 8;

/// A window stretched by waiting for ACKs still counts up to this long (in
/// the history, and, before a QP's first cut, as the open window): a
/// window-limited flow behind a congested queue sends one burst per round
/// trip, tens of milliseconds apart, and its rate is what those bursts add
/// up to, gaps included.
const RATE_WINDOW_AWAITING: Nanos = 100_000_000;

impl Dcqcn {
    pub fn new(p: CcParams) -> Dcqcn {
        Dcqcn {
            p,
            rc: p.line_rate,
            rt: p.line_rate,
            alpha: p.rp_initial_alpha_value as f64 / 1024.0,
            t_events: 0,
            bc_events: 0,
            bytes: 0,
            next_timer: 0,
            next_alpha: 0,
            last_cut: None,
            next_tx: 0,
            now: 0,
            win_start: 0,
            win_bytes: 0,
            hist: [(0, 0); RATE_HISTORY],
            hist_len: 0,
            hist_at: 0,
        }
    }

    fn g(&self) -> f64 {
        self.p.rp_dce_tcp_g as f64 / 1024.0
    }

    /// Below line rate: packets are paced and the timers run.
    pub fn limiting(&self) -> bool {
        self.p.enabled && self.rc < self.p.line_rate
    }

    /// A CNP arrived. Returns false if it was ignored (the reaction point
    /// is off, or a cut happened within the monitor period).
    pub fn on_cnp(&mut self, now: Nanos) -> bool {
        if !self.p.enabled {
            return false;
        }
        self.catch_up(now);
        if self
            .last_cut
            .is_some_and(|t| now.saturating_sub(t) < self.p.rp_rate_reduce_monitor_period * US)
        {
            return false;
        }
        let g = self.g();
        // A sender that could not fill its rate (a software one, short of
        // CPU or of work) cuts from the rate it sent at: cutting an unused
        // allowance would not slow it down. A NIC always sends at RC, so
        // there this is the paper's cut.
        if let Some(r) = self.measured_rate(now).filter(|&r| r < self.rc) {
            self.rc = r.max(self.p.rp_min_rate);
        }
        self.rt = self.rc;
        self.rc = (self.rc * (1.0 - self.alpha / 2.0)).max(self.p.rp_min_rate);
        self.alpha = (1.0 - g) * self.alpha + g;
        self.t_events = 0;
        self.bc_events = 0;
        self.bytes = 0;
        self.last_cut = Some(now);
        self.next_timer = now + self.p.rp_time_reset * US;
        self.next_alpha = now + self.p.rp_dce_tcp_rtt * US;
        true
    }

    /// The rate this QP sent at, for a cut at `now`: its last full
    /// windows' ([`RATE_HISTORY`]), or, before the QP's first cut, the
    /// open window's once that is a window long. A first CNP usually comes
    /// before the first window closes: the QP sent its whole window at
    /// once and awaits the ACKs behind the queue the CNP speaks of. The
    /// CNP says packets are in flight, so the open window's gap is that
    /// wait, not an idle application.
    fn measured_rate(&self, now: Nanos) -> Option<f64> {
        let open = now.saturating_sub(self.win_start);
        if self.last_cut.is_none() && (RATE_WINDOW..RATE_WINDOW_AWAITING).contains(&open) {
            return Some(self.win_bytes as f64 * 8000.0 / open as f64);
        }
        let (mut t, mut b) = (0, 0);
        for &(dt, db) in &self.hist[..self.hist_len] {
            t += dt;
            b += db;
        }
        (t > 0).then(|| b as f64 * 8000.0 / t as f64)
    }

    /// Runs the alpha and rate-increase timers up to `now`.
    fn catch_up(&mut self, now: Nanos) {
        self.now = self.now.max(now);
        if !self.limiting() {
            return;
        }
        let g = self.g();
        let mut n = 0;
        while self.next_alpha <= now && n < MAX_CATCH_UP {
            self.alpha *= 1.0 - g;
            self.next_alpha += self.p.rp_dce_tcp_rtt.max(1) * US;
            n += 1;
        }
        if n == MAX_CATCH_UP {
            self.next_alpha = now + self.p.rp_dce_tcp_rtt * US;
        }
        let mut n = 0;
        while self.limiting() && self.next_timer <= now && n < MAX_CATCH_UP {
            self.t_events += 1;
            self.increase();
            self.next_timer += self.p.rp_time_reset.max(1) * US;
            n += 1;
        }
        if n == MAX_CATCH_UP || !self.limiting() {
            // Long idle: back at line rate (DCQCN's state resets).
            self.rc = self.p.line_rate;
            self.rt = self.p.line_rate;
        }
    }

    /// One increase event (timer or byte counter).
    fn increase(&mut self) {
        let f = self.p.rp_threshold;
        let (t, bc) = (self.t_events, self.bc_events);
        if t.max(bc) < f {
            // Fast recovery: RT stays.
        } else if t.min(bc) > f {
            let i = (t.min(bc) - f) as f64;
            self.rt += i * self.p.rp_hai_rate;
        } else {
            self.rt += self.p.rp_ai_rate;
        }
        self.rt = self.rt.min(self.p.line_rate);
        self.rc = ((self.rt + self.rc) / 2.0).min(self.p.line_rate);
        // Within a hair of line rate is line rate (the halving never
        // closes the gap exactly).
        if self.p.line_rate - self.rc < 0.01 {
            self.rc = self.p.line_rate;
        }
    }

    /// The time before which no packet may leave, if pacing holds it back.
    pub fn blocked_until(&mut self, now: Nanos) -> Option<Nanos> {
        self.catch_up(now);
        (self.limiting() && self.next_tx > now).then_some(self.next_tx)
    }

    /// Time moves on (the timers catch up; a pacing deadline reached is
    /// no longer one).
    pub fn advance(&mut self, now: Nanos) {
        self.catch_up(now);
    }

    /// The pacing deadline, if one is ahead of the latest time seen.
    pub fn deadline(&self) -> Option<Nanos> {
        (self.limiting() && self.next_tx > self.now).then_some(self.next_tx)
    }

    /// Whether the next [`Dcqcn::sent`] ends a rate window (and so wants to
    /// know whether the QP was awaiting ACKs: only then is the question
    /// worth its cost).
    pub fn rate_window_ends(&self, now: Nanos) -> bool {
        now.saturating_sub(self.win_start) >= RATE_WINDOW
    }

    /// A packet of `len` bytes left at `now`. `awaiting_acks`: the QP had
    /// requests in flight before it (asked only when
    /// [`Dcqcn::rate_window_ends`]).
    pub fn sent(&mut self, now: Nanos, len: usize, awaiting_acks: bool) {
        let elapsed = now.saturating_sub(self.win_start);
        if elapsed >= RATE_WINDOW {
            // A gap the application left (nothing in flight) says little
            // about the rate now: the history starts again after it. A QP
            // awaiting ACKs is limited by its window: it sends a burst per
            // round trip, its rate is what those bursts add up to, gaps
            // included. Cutting the RC it is paced at instead cuts a rate
            // it does not use: its packets still leave in bursts, so CNPs
            // come in clusters, one cut per cluster, which the timer's
            // recovery undoes before the next; α settles at the share of
            // alpha periods with a CNP (about 0.1), and the queue fills
            // with the windows (incast's p99 was 944 of 1024 KiB).
            let limit = if awaiting_acks {
                RATE_WINDOW_AWAITING
            } else {
                2 * RATE_WINDOW
            };
            if elapsed < limit {
                self.hist[self.hist_at] = (elapsed, self.win_bytes);
                self.hist_at = (self.hist_at + 1) % RATE_HISTORY;
                self.hist_len = (self.hist_len + 1).min(RATE_HISTORY);
            } else {
                self.hist_len = 0;
            }
            self.win_start = now;
            self.win_bytes = 0;
        }
        self.win_bytes += len as u64;
        if !self.limiting() {
            return;
        }
        let gap = (len as f64 * 8000.0 / self.rc) as Nanos;
        // A sender woken late may catch up on up to PACING_SLACK of its
        // rate (a short burst, as a NIC's pacer allows), not more.
        self.next_tx = self.next_tx.max(now.saturating_sub(PACING_SLACK)) + gap;
        self.bytes += len as u64;
        while self.limiting() && self.bytes >= self.p.rp_byte_reset.max(1) {
            self.bytes -= self.p.rp_byte_reset.max(1);
            self.bc_events += 1;
            self.increase();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6 * b.abs().max(1.0)
    }

    #[test]
    fn tunables_are_set_by_their_mlx5_names() {
        let mut p = CcParams::default();
        p.set("rp_ai_rate=0.5").unwrap();
        p.set(" rp_time_reset = 300").unwrap();
        p.set("rp_dce_tcp_g=16").unwrap();
        assert_eq!(
            (p.rp_ai_rate, p.rp_time_reset, p.rp_dce_tcp_g),
            (0.5, 300, 16)
        );
        assert!(p.set("rp_dce_tcp_g=2000").unwrap_err().contains("1024"));
        assert!(p.set("rp_ai_rate=0").is_err());
        assert!(p.set("rp_ai_rate").unwrap_err().contains("NAME=VALUE"));
        assert!(p.set("ai=1").unwrap_err().contains("rp_hai_rate"));
        for n in CcParams::NAMES {
            let v = if n.starts_with("rp_dce_tcp_g") || n.contains("alpha") {
                "7"
            } else {
                "9"
            };
            p.set(&format!("{n}={v}")).unwrap();
        }
    }

    #[test]
    fn a_sender_below_its_rate_is_cut_from_what_it_sent() {
        let mut d = Dcqcn::new(CcParams::default());
        // 1 KiB every 20 µs is ~410 Mbit/s, far below the 10 Gbit/s line
        // rate: the first cut starts from the measured rate.
        let mut t = 0;
        while t < 3 * RATE_WINDOW {
            d.sent(t, 1024, false);
            t += 20 * US;
        }
        let sent = 1024.0 * 8000.0 / (20.0 * US as f64);
        assert!(d.on_cnp(t));
        assert!(close(d.rt, sent), "rt {} sent {sent}", d.rt);
        assert!(close(d.rc, sent / 2.0), "rc {}", d.rc);
        // A sender that used its rate is cut from RC, as the paper says.
        let mut d = Dcqcn::new(CcParams {
            line_rate: 100.0,
            ..Default::default()
        });
        let mut t = 0;
        while t < 3 * RATE_WINDOW {
            d.sent(t, 1250, false);
            t += 100 * US;
        }
        assert!(d.on_cnp(t));
        assert!(close(d.rt, 100.0) && close(d.rc, 50.0), "{} {}", d.rt, d.rc);
    }

    #[test]
    fn a_first_cut_starts_from_what_a_window_limited_sender_sent() {
        // 64 KiB in 16 packets at once, then 5 ms awaiting ACKs (a window
        // behind a queue): ~105 Mbit/s, though each burst leaves at line
        // rate and every window ends in a gap.
        let burst = |d: &mut Dcqcn, t: Nanos, awaiting: bool| {
            for k in 0..16 {
                let now = t + k * 400;
                let ends = d.rate_window_ends(now);
                d.sent(now, 4096, awaiting && ends);
            }
        };
        let mut d = Dcqcn::new(CcParams::default());
        let mut t = 0;
        while t < 50 * RATE_WINDOW {
            burst(&mut d, t, true);
            t += 5 * RATE_WINDOW;
        }
        // The CNP comes 0.5 ms after the last burst: the open window is
        // too young, the last closed one counts.
        let cnp_at = t - 5 * RATE_WINDOW + RATE_WINDOW / 2;
        let rate = 65536.0 * 8000.0 / (5.0 * RATE_WINDOW as f64);
        assert!(d.on_cnp(cnp_at));
        assert!((d.rt - rate).abs() < 1.0, "rt {} rate {rate}", d.rt);
        assert!(close(d.rc, d.rt / 2.0));
        // The first CNP usually comes before the first window closes (the
        // whole window left at once; the ACKs wait behind the queue): the
        // open window is the measure.
        let mut d = Dcqcn::new(CcParams {
            // Slow increase: the QP stays paced below.
            rp_time_reset: 1 << 30,
            rp_byte_reset: 1 << 40,
            ..CcParams::default()
        });
        burst(&mut d, 0, false);
        assert!(d.on_cnp(4 * RATE_WINDOW));
        assert!((d.rt - 65536.0 * 8000.0 / (4.0 * RATE_WINDOW as f64)).abs() < 1.0);
        // Later cuts too: the window the next burst closed (20 ms awaiting
        // ACKs, 64 KiB) is what the QP sent at, below its RC.
        let rc = d.rc;
        burst(&mut d, 20 * RATE_WINDOW, true);
        assert!(d.on_cnp(30 * RATE_WINDOW));
        let sent = 65536.0 * 8000.0 / (20.0 * RATE_WINDOW as f64);
        assert!(sent < rc && close(d.rt, sent), "rt {} sent {sent}", d.rt);
        // Back at line rate after a cut (a second without CNPs), the next
        // cut is the paper's again.
        let mut d = Dcqcn::new(CcParams::default());
        burst(&mut d, 0, false);
        assert!(d.on_cnp(4 * RATE_WINDOW));
        assert!(d.rc < 100.0);
        d.advance(1_000 * RATE_WINDOW);
        assert!(!d.limiting());
        burst(&mut d, 1_000 * RATE_WINDOW, true);
        let a = d.alpha;
        assert!(d.on_cnp(1_004 * RATE_WINDOW));
        assert!(close(d.rt, 10_000.0) && close(d.rc, 10_000.0 * (1.0 - a / 2.0)));
        // The same bursts with the QP idle in between (the application's
        // gap): the paper's cut from RC.
        let mut d = Dcqcn::new(CcParams::default());
        let mut t = 0;
        while t < 50 * RATE_WINDOW {
            burst(&mut d, t, false);
            t += 5 * RATE_WINDOW;
        }
        assert!(d.on_cnp(t - 5 * RATE_WINDOW + RATE_WINDOW / 2));
        assert!(close(d.rt, 10_000.0) && close(d.rc, 5_000.0), "{}", d.rc);
        // Awaiting ACKs for longer than RATE_WINDOW_AWAITING (a peer gone
        // quiet): no measurement, the cut is the paper's.
        let mut d = Dcqcn::new(CcParams::default());
        burst(&mut d, 0, true);
        burst(&mut d, RATE_WINDOW_AWAITING + RATE_WINDOW, true);
        assert!(d.on_cnp(RATE_WINDOW_AWAITING + RATE_WINDOW + RATE_WINDOW / 2));
        assert!(close(d.rc, 5_000.0), "{}", d.rc);
    }

    #[test]
    fn a_window_limited_sender_is_cut_from_its_bursts_and_gaps_together() {
        // After a first cut the QP recovers far above what it sends (the
        // paper's timers), but its window lets it send only 64 KiB per 5 ms
        // round trip, in a burst at its rate: each window holds a burst
        // or a wait. The next cut starts from the eight windows together,
        // ~105 Mbit/s, not from the RC it never used.
        let burst = |d: &mut Dcqcn, t: Nanos| {
            for k in 0..16 {
                let now = t + k * 400;
                let ends = d.rate_window_ends(now);
                d.sent(now, 4096, ends);
            }
        };
        // A first cut, then a burst every 5 ms up to `last` ms.
        let cut_then_bursts = |last: u64| {
            let mut d = Dcqcn::new(CcParams::default());
            burst(&mut d, 0);
            assert!(d.on_cnp(RATE_WINDOW + RATE_WINDOW / 2));
            for ms in (5..=last).step_by(5) {
                burst(&mut d, ms * RATE_WINDOW);
            }
            d
        };
        let mut d = cut_then_bursts(95);
        let rc = d.rc;
        assert!(rc > 300.0, "recovered: {rc}");
        assert!(d.on_cnp(95 * RATE_WINDOW + RATE_WINDOW / 2));
        let sent = 65536.0 * 8000.0 / (5.0 * RATE_WINDOW as f64);
        assert!((d.rt - sent).abs() < 0.01 * sent, "rt {} sent {sent}", d.rt);
        // An idle gap (nothing in flight) longer than two windows starts
        // the history again: the cut after it is from RC.
        let mut d = cut_then_bursts(50);
        for k in 0..16 {
            d.sent(60 * RATE_WINDOW + k * 400, 4096, false);
        }
        let rc = d.rc;
        assert!(d.on_cnp(60 * RATE_WINDOW + RATE_WINDOW / 2));
        // (RC went on recovering until the CNP: at least what it was.)
        assert!(d.rt >= rc && d.rt > 300.0, "rt {} rc {rc}", d.rt);
    }

    #[test]
    fn a_cnp_cuts_by_alpha_half_and_raises_alpha() {
        let mut d = Dcqcn::new(CcParams::default());
        assert!(!d.limiting());
        assert!(d.on_cnp(1_000));
        // α = 1 at first: RC halves, RT keeps the old rate, α = (1-g)·1 + g.
        assert!(close(d.rc, 5_000.0) && close(d.rt, 10_000.0));
        assert!(close(d.alpha, 1.0));
        // Within the monitor period (4 µs): ignored.
        assert!(!d.on_cnp(3_000));
        // α decays by (1 - g) per 55 µs without a CNP.
        let g: f64 = 4.0 / 1024.0;
        d.catch_up(1_000 + 3 * 55_000);
        assert!(close(d.alpha, (1.0 - g).powi(3)), "{}", d.alpha);
        let (rc, a) = (d.rc, d.alpha);
        assert!(d.on_cnp(1_000 + 3 * 55_000));
        assert!(close(d.rc, rc * (1.0 - a / 2.0)));
        assert!(close(d.alpha, (1.0 - g) * a + g));
    }

    #[test]
    fn recovery_is_fast_then_additive_then_hyper() {
        let p = CcParams::default();
        let mut d = Dcqcn::new(p);
        d.on_cnp(0);
        let (rt, mut rc) = (d.rt, d.rc);
        // Fast recovery: F timer events, each halfway to RT.
        for k in 1..=4u64 {
            d.catch_up(k * 55_000);
            rc = (rt + rc) / 2.0;
            assert!(close(d.rc, rc) && close(d.rt, rt), "event {k}");
        }
        // Another cut, then the byte counter passes F as well as the timer.
        let mut d = Dcqcn::new(p);
        d.on_cnp(0);
        d.rt = 1_000.0;
        d.rc = 500.0;
        for _ in 0..6 {
            d.sent(0, p.rp_byte_reset as usize, false);
        }
        // BC = 6 > F, T = 0: additive on the sixth event.
        assert_eq!((d.t_events, d.bc_events), (0, 6));
        let rt = d.rt;
        d.catch_up(55_000 * 6);
        // T reaches 6 too: the first timer events are additive (T < F
        // while BC > F), the sixth hyper: RT + 1·R_HAI.
        assert_eq!(d.t_events, 6);
        assert!(close(d.rt, rt + 5.0 * 40.0 + 100.0), "{} vs {rt}", d.rt);
    }

    #[test]
    fn the_rate_floors_and_returns_to_line_rate_when_left_alone() {
        let p = CcParams {
            rp_rate_reduce_monitor_period: 0,
            ..CcParams::default()
        };
        let mut d = Dcqcn::new(p);
        for k in 0..200 {
            d.on_cnp(k);
        }
        assert!(close(d.rc, p.rp_min_rate), "{}", d.rc);
        // Idle for a second: the timers catch up, bounded, to line rate.
        assert_eq!(d.blocked_until(1_000_000_000), None);
        assert!(!d.limiting() && close(d.rc, p.line_rate));
    }

    #[test]
    fn pacing_spaces_packets_at_the_current_rate() {
        let mut d = Dcqcn::new(CcParams::default());
        assert_eq!(d.blocked_until(0), None);
        d.sent(0, 1000, false);
        assert_eq!(d.blocked_until(0), None, "line rate: no pacing");
        d.on_cnp(0);
        // 5 Gbit/s: 1000 bytes every 1.6 µs.
        d.sent(10, 1000, false);
        assert_eq!(d.blocked_until(10), Some(1600));
        assert_eq!(d.deadline(), Some(1600));
        d.sent(1600, 1000, false);
        assert_eq!(d.blocked_until(1700), Some(3200));
        // Woken late, a sender catches up on at most PACING_SLACK of its
        // rate: 125 packets in a burst, then the schedule holds it again
        // (the increase timers are slowed so that the rate stays put).
        let mut d = Dcqcn::new(CcParams {
            rp_time_reset: 1 << 30,
            rp_byte_reset: 1 << 40,
            ..CcParams::default()
        });
        d.on_cnp(0);
        let late = 10 * PACING_SLACK;
        let mut burst = 0;
        while d.blocked_until(late).is_none() && burst < 1000 {
            d.sent(late, 1000, false);
            burst += 1;
        }
        assert_eq!(burst, PACING_SLACK / 1600 + 1);
        assert_eq!(d.blocked_until(late), Some(late + 1600));
        // Off: never paced, CNPs ignored.
        let mut d = Dcqcn::new(CcParams {
            enabled: false,
            ..CcParams::default()
        });
        assert!(!d.on_cnp(0));
        assert_eq!(d.blocked_until(0), None);
    }

    #[test]
    fn cnps_are_spaced_by_the_notification_point() {
        let mut np = Np::default();
        assert!(np.on_ce(0, 50));
        assert!(!np.on_ce(49_999, 50));
        assert!(np.on_ce(50_000, 50));
    }
}
