//! Seeded network impairment, sans-IO: frames go in with the current time,
//! come out (or not) later, possibly twice, reordered or with a flipped bit.
//! The relay (`relay.rs`) drives it between two interfaces; tests drive it
//! directly. The kernel here has no netem, so this is our netem.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::rng::Rng;
use crate::wire::ROCE_V2_UDP_PORT;

/// Rates are probabilities per frame (0.05 = 5 %); times in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ImpairConfig {
    pub loss: f64,
    pub reorder: f64,
    pub dup: f64,
    pub corrupt: f64,
    /// Mark CE (ECN 11) in the IP header, as a congested switch does (the
    /// ICRC masks the ECN bits; the IPv4 checksum is redone).
    pub ce: f64,
    /// A bottleneck link of this many Mbit/s per direction (0: none): RoCE
    /// frames queue behind it, are CE-marked by the queue's length (RED's
    /// ramp: none below `kmin_bytes`, probability rising to `pmax` at
    /// `kmax_bytes`, all above), and dropped beyond `queue_bytes`.
    pub rate_mbit: f64,
    pub queue_bytes: u64,
    pub kmin_bytes: u64,
    pub kmax_bytes: u64,
    pub pmax: f64,
    /// Decide the bottleneck's CE mark as a frame leaves the queue, by the
    /// depth behind it, instead of as it enters: the mark then reaches the
    /// receiver without waiting out the queue (as CoDel and some switch
    /// ASICs mark), so the feedback is not a queue's delay late.
    #[serde(default)]
    pub mark_on_dequeue: bool,
    /// The line rate of the links into the relay's A side, Mbit/s (0: as
    /// fast as the host can write). A switch port receives no faster than
    /// its link: a burst the sending host wrote at memory speed reaches
    /// the bottleneck's queue spread out at this rate (see
    /// [`IngressLinks`]).
    #[serde(default)]
    pub ingress_mbit: f64,
    /// Lossless Ethernet (PFC, IEEE 802.1Qbb), 0: off. A RoCE frame that
    /// would take the bottleneck's queue past this many bytes is not
    /// dropped: the switch pauses its ingress ports, and the frame waits
    /// in its sender's NIC until the queue has drained enough to take it
    /// (with everything behind it on every port). The pause acts at once
    /// (no headroom: nothing is in flight on a link of no length), so the
    /// queue never passes this and `queue_bytes` never drops.
    #[serde(default)]
    pub pfc_xoff_bytes: u64,
    pub delay_us: u64,
    pub jitter_us: u64,
    /// More one-way delay, microseconds, for CM MADs only (RoCEv2 to
    /// destination QP 1): a management path slower than the data path,
    /// so a MAD can fall behind data frames sent before it.
    pub mad_delay_us: u64,
    /// A reordered frame is held back until this many later frames of the
    /// same direction have passed it ...
    pub reorder_gap: u32,
    /// ... or this long, whichever comes first.
    pub reorder_max_us: u64,
    pub seed: u64,
    /// Impair RoCEv2 (UDP 4791) frames only; everything else (ARP, ND, the
    /// TCP side channels) passes untouched.
    pub roce_only: bool,
}

impl Default for ImpairConfig {
    fn default() -> Self {
        ImpairConfig {
            loss: 0.0,
            reorder: 0.0,
            dup: 0.0,
            corrupt: 0.0,
            ce: 0.0,
            rate_mbit: 0.0,
            queue_bytes: 256 * 1024,
            kmin_bytes: 20 * 1024,
            kmax_bytes: 200 * 1024,
            pmax: 0.2,
            mark_on_dequeue: false,
            ingress_mbit: 0.0,
            pfc_xoff_bytes: 0,
            delay_us: 0,
            jitter_us: 0,
            mad_delay_us: 0,
            reorder_gap: 3,
            reorder_max_us: 1000,
            seed: 1,
            roce_only: true,
        }
    }
}

impl ImpairConfig {
    /// Every rate must be a probability.
    pub fn validate(&self) -> Result<(), String> {
        for (name, p) in [
            ("loss", self.loss),
            ("reorder", self.reorder),
            ("dup", self.dup),
            ("corrupt", self.corrupt),
            ("ce", self.ce),
            ("pmax", self.pmax),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(format!(
                    "--{name} {p}: a probability between 0 and 1 (0.05 = 5 %)"
                ));
            }
        }
        for (name, r) in [
            ("rate-mbit", self.rate_mbit),
            ("ingress-mbit", self.ingress_mbit),
        ] {
            if !(r >= 0.0 && r.is_finite()) {
                return Err(format!(
                    "--{name} {r}: a rate in Mbit/s, 0 or more (0: no limit)"
                ));
            }
        }
        if self.pfc_xoff_bytes > self.queue_bytes {
            return Err(format!(
                "--pfc-xoff-bytes {} is above --queue-bytes {}: the switch must pause its senders before its queue is full",
                self.pfc_xoff_bytes, self.queue_bytes
            ));
        }
        Ok(())
    }

    /// One line for logs: every rate and the seed.
    pub fn describe(&self) -> String {
        format!(
            "loss={} reorder={} dup={} corrupt={} ce={} delay_us={} jitter_us={} mad_delay_us={} seed={}",
            self.loss,
            self.reorder,
            self.dup,
            self.corrupt,
            self.ce,
            self.delay_us,
            self.jitter_us,
            self.mad_delay_us,
            self.seed
        )
    }
}

/// Counters of one direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirStats {
    /// Frames received from this side.
    pub rx: u64,
    /// Frames that were eligible for impairment (RoCEv2 with roce_only).
    pub impaired_class: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub corrupted: u64,
    /// Frames marked CE.
    #[serde(default)]
    pub ce_marked: u64,
    /// The bottleneck: frames dropped at its full queue, and the longest
    /// queue seen (bytes).
    #[serde(default)]
    pub bottleneck_drops: u64,
    #[serde(default)]
    pub queue_max_bytes: u64,
    /// With PFC: the pauses the bottleneck's queue caused (a pause begins
    /// when a frame has to wait while the ingress is running), how long
    /// the ingress stood paused in all (ns, overlapping pauses once), and
    /// the frames that had to wait.
    #[serde(default)]
    pub pfc_pauses: u64,
    #[serde(default)]
    pub pfc_paused_ns: u64,
    #[serde(default)]
    pub pfc_held_frames: u64,
    /// CM MADs held back by `mad_delay_us`.
    #[serde(default)]
    pub mad_delayed: u64,
    pub reordered: u64,
    /// Frames handed to the other side (duplicates count twice).
    pub tx: u64,
}

/// Marks a frame CE (ECN field 11) in its IPv4 or IPv6 header, with the
/// IPv4 header checksum redone. `f` starts at the Ethernet header.
pub fn mark_ce(f: &mut [u8]) -> bool {
    let Some((et, off)) = ip_header(f) else {
        return false;
    };
    match et {
        0x0800 if f.len() >= off + 20 => {
            let ihl = (f[off] & 0x0f) as usize * 4;
            if ihl < 20 || f.len() < off + ihl {
                return false;
            }
            f[off + 1] |= 3;
            f[off + 10] = 0;
            f[off + 11] = 0;
            let mut sum: u32 = 0;
            for w in f[off..off + ihl].chunks(2) {
                sum += u16::from_be_bytes([w[0], w[1]]) as u32;
            }
            while sum > 0xffff {
                sum = (sum & 0xffff) + (sum >> 16);
            }
            f[off + 10..off + 12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
            true
        }
        // The traffic class straddles bytes 0 and 1: ECN is bits 4-5 of byte 1.
        0x86dd if f.len() >= off + 40 => {
            f[off + 1] |= 0x30;
            true
        }
        _ => false,
    }
}

/// The EtherType past any VLAN tags, and where its header starts.
fn ip_header(f: &[u8]) -> Option<(u16, usize)> {
    let mut off = 12;
    let mut et = u16::from_be_bytes(f.get(off..off + 2)?.try_into().ok()?);
    off += 2;
    while et == 0x8100 || et == 0x88a8 {
        et = u16::from_be_bytes(f.get(off + 2..off + 4)?.try_into().ok()?);
        off += 4;
    }
    Some((et, off))
}

/// Whether an IPv4 or IPv6 frame is marked CE (ECN 11).
pub fn is_ce(f: &[u8]) -> bool {
    match ip_header(f) {
        Some((0x0800, off)) => f.get(off + 1).is_some_and(|t| t & 3 == 3),
        Some((0x86dd, off)) => f.get(off + 1).is_some_and(|t| (t >> 4) & 3 == 3),
        _ => false,
    }
}

/// Where the UDP payload of a RoCEv2 frame starts, or None for other
/// frames. `f` starts at the Ethernet header.
pub fn roce_payload_offset(f: &[u8]) -> Option<usize> {
    let (et, off) = ip_header(f)?;
    let udp = match et {
        0x0800 => {
            let ihl = (*f.get(off)? & 0x0f) as usize * 4;
            if *f.get(off + 9)? != 17 || ihl < 20 {
                return None;
            }
            off + ihl
        }
        0x86dd => {
            if *f.get(off + 6)? != 17 {
                return None;
            }
            off + 40
        }
        _ => return None,
    };
    let dport = u16::from_be_bytes(f.get(udp + 2..udp + 4)?.try_into().ok()?);
    (dport == ROCE_V2_UDP_PORT && f.len() > udp + 8).then_some(udp + 8)
}

/// A link that carries one frame at a time at `bytes_per_ns`, busy until
/// `free_at`: a frame of `len` bytes handed to it at `now` is through when
/// this returns (the bottleneck's egress and the switch's ingress links
/// alike, so that equal rates time frames alike).
fn carry(free_at: &mut u64, now: u64, len: u64, bytes_per_ns: f64) -> u64 {
    *free_at = (*free_at).max(now) + (len as f64 / bytes_per_ns) as u64;
    *free_at
}

/// The links into a switch's ports, each at a line rate: a frame has
/// arrived when its last byte has, no earlier than the link's previous
/// frame plus its own time on the wire. A veth has no line rate (a host
/// writes a burst at memory speed), so without this one flow at the
/// bottleneck's own rate would still build a queue out of the bursts of
/// its sender's AF_XDP batches, which no link of that rate could carry.
#[derive(Debug, Clone, Default)]
pub struct IngressLinks {
    bytes_per_ns: f64,
    /// Per port: when its link has carried everything sent so far (ns).
    free_at: Vec<u64>,
    /// The latest arrival handed out: arrivals never go back in time, so
    /// the bottleneck sees its frames in order across ports.
    last: u64,
}

impl IngressLinks {
    /// Links of `rate_mbit` each (0: none; frames arrive at their stamp).
    pub fn new(rate_mbit: f64) -> IngressLinks {
        IngressLinks {
            bytes_per_ns: rate_mbit.max(0.0) / 8000.0,
            ..Default::default()
        }
    }

    /// When a frame of `len` bytes that the host sent at `stamp` on `port`
    /// has arrived in the switch.
    pub fn arrival(&mut self, port: usize, stamp: u64, len: u64) -> u64 {
        let mut t = stamp;
        if self.bytes_per_ns > 0.0 {
            if self.free_at.len() <= port {
                self.free_at.resize(port + 1, 0);
            }
            t = carry(&mut self.free_at[port], stamp, len, self.bytes_per_ns);
        }
        self.last = self.last.max(t);
        self.last
    }
}

struct Held {
    buf: usize,
    dir: usize,
    remaining: u32,
    deadline: u64,
}

/// The impairment state machine. Times are nanoseconds of any monotonic
/// clock the caller chooses.
pub struct Impairer {
    cfg: ImpairConfig,
    rng: Rng,
    bufs: Vec<Vec<u8>>,
    free: Vec<usize>,
    /// (release time, sequence, buffer, direction).
    due: BinaryHeap<Reverse<(u64, u64, usize, usize)>>,
    held: VecDeque<Held>,
    seq: u64,
    /// The bottleneck of each direction is busy until then (ns).
    link_free_at: [u64; 2],
    /// With PFC, per direction: the latest time a frame entered the queue
    /// (entries keep their order). Later than now, it is until when the
    /// ingress stands paused: the last frame to enter was held.
    entered_at: [u64; 2],
    /// Per buffer: a bottleneck mark to decide as it leaves, with
    /// `mark_on_dequeue`: the frame's prefix length, and the bytes that had
    /// entered its direction's queue up to and with it.
    mark_at_exit: Vec<Option<(usize, u64)>>,
    /// Per direction, with `mark_on_dequeue`: the frames in the queue in
    /// order, as (arrival, bytes entered up to and with it), and the bytes
    /// entered so far. The depth behind a leaving frame is what arrived
    /// before it left.
    in_queue: [VecDeque<(u64, u64)>; 2],
    entered: [u64; 2],
    pub stats: [DirStats; 2],
}

impl Impairer {
    pub fn new(cfg: ImpairConfig) -> Impairer {
        Impairer {
            cfg,
            rng: Rng(cfg.seed),
            bufs: Vec::new(),
            free: Vec::new(),
            due: BinaryHeap::new(),
            held: VecDeque::new(),
            seq: 0,
            link_free_at: [0; 2],
            entered_at: [0; 2],
            mark_at_exit: Vec::new(),
            in_queue: [VecDeque::new(), VecDeque::new()],
            entered: [0; 2],
            stats: [DirStats::default(); 2],
        }
    }

    pub fn config(&self) -> &ImpairConfig {
        &self.cfg
    }

    fn alloc_buf(&mut self) -> usize {
        let i = self.free.pop().unwrap_or_else(|| {
            self.bufs.push(Vec::new());
            self.mark_at_exit.push(None);
            self.bufs.len() - 1
        });
        self.mark_at_exit[i] = None;
        i
    }

    fn copy_in(&mut self, frame: &[u8]) -> usize {
        let i = self.alloc_buf();
        self.bufs[i].clear();
        self.bufs[i].extend_from_slice(frame);
        i
    }

    /// A second buffer with the bytes of buffer `b` (a duplicate).
    fn copy_of(&mut self, b: usize) -> usize {
        let i = self.alloc_buf();
        let mut v = std::mem::take(&mut self.bufs[i]);
        v.clear();
        v.extend_from_slice(&self.bufs[b]);
        self.bufs[i] = v;
        self.mark_at_exit[i] = self.mark_at_exit[b];
        i
    }

    fn schedule(&mut self, at: u64, buf: usize, dir: usize) {
        self.seq += 1;
        self.due.push(Reverse((at, self.seq, buf, dir)));
    }

    /// A frame arrived from side `dir` (0 or 1) at `now`. `prefix` bytes
    /// (a virtio-net header) precede the Ethernet header and are kept as is.
    pub fn push(&mut self, now: u64, dir: usize, frame: &[u8], prefix: usize) {
        let dir = dir & 1;
        self.stats[dir].rx += 1;
        let eth = frame.get(prefix..).unwrap_or(&[]);
        let payload = roce_payload_offset(eth);
        if self.cfg.roce_only && payload.is_none() {
            let b = self.copy_in(frame);
            self.schedule(now, b, dir);
            self.stats[dir].tx += 1;
            return;
        }
        self.stats[dir].impaired_class += 1;
        if self.rng.chance(self.cfg.loss) {
            self.stats[dir].dropped += 1;
            return;
        }
        let b = self.copy_in(frame);
        if self.rng.chance(self.cfg.corrupt) {
            // A bit in the RoCE part (BTH..ICRC), where only the ICRC can
            // catch it; IP/UDP damage would just look like loss.
            let start = prefix + payload.unwrap_or(14);
            let len = self.bufs[b].len();
            if len > start {
                let at = start + self.rng.below((len - start) as u64) as usize;
                let bit = self.rng.below(8) as u8;
                self.bufs[b][at] ^= 1 << bit;
                self.stats[dir].corrupted += 1;
            }
        }
        if self.rng.chance(self.cfg.ce) && mark_ce(&mut self.bufs[b][prefix..]) {
            self.stats[dir].ce_marked += 1;
        }
        let mut at = now + self.cfg.delay_us * 1000;
        if self.cfg.rate_mbit > 0.0 {
            // Bytes still queued ahead of this frame at the bottleneck.
            let bytes_per_ns = self.cfg.rate_mbit / 8000.0;
            let len = frame.len().saturating_sub(prefix) as u64;
            let mut enter = now;
            let mut queued = self.backlog_bytes(dir, now);
            let xoff = self.cfg.pfc_xoff_bytes;
            if xoff > 0 {
                // Lossless: the frame enters once the queue ahead of it
                // has drained to `xoff - len` (the queue drains at the
                // link's rate until `link_free_at`), and not before the
                // frame ahead of it entered.
                let room = xoff.saturating_sub(len);
                if queued > room {
                    let drain_ns = ((queued - room) as f64 / bytes_per_ns).ceil() as u64;
                    enter = now + drain_ns;
                }
                let paused_until = self.entered_at[dir];
                enter = enter.max(paused_until);
                self.entered_at[dir] = enter;
                if enter > now {
                    let st = &mut self.stats[dir];
                    st.pfc_held_frames += 1;
                    if now >= paused_until {
                        st.pfc_pauses += 1;
                    }
                    st.pfc_paused_ns += enter - now.max(paused_until);
                }
                queued = self.backlog_bytes(dir, enter);
            } else if queued + len > self.cfg.queue_bytes {
                self.stats[dir].bottleneck_drops += 1;
                self.free.push(b);
                return;
            }
            self.stats[dir].queue_max_bytes = self.stats[dir].queue_max_bytes.max(queued + len);
            if self.cfg.mark_on_dequeue {
                self.entered[dir] += len;
                self.in_queue[dir].push_back((enter, self.entered[dir]));
                self.mark_at_exit[b] = Some((prefix, self.entered[dir]));
            } else {
                self.ramp_mark(dir, b, prefix, queued);
            }
            let done = carry(&mut self.link_free_at[dir], enter, len, bytes_per_ns);
            at = done + self.cfg.delay_us * 1000;
        }
        if self.cfg.jitter_us > 0 {
            at += self.rng.below(self.cfg.jitter_us * 1000 + 1);
        }
        if self.cfg.mad_delay_us > 0 && crate::wire::peek_dest_qpn(eth) == Some(1) {
            at += self.cfg.mad_delay_us * 1000;
            self.stats[dir].mad_delayed += 1;
        }
        if self.rng.chance(self.cfg.dup) {
            self.stats[dir].duplicated += 1;
            let b2 = self.copy_of(b);
            self.schedule(at, b2, dir);
            self.stats[dir].tx += 1;
        }
        self.stats[dir].tx += 1;
        if self.rng.chance(self.cfg.reorder) {
            self.stats[dir].reordered += 1;
            self.held.push_back(Held {
                buf: b,
                dir,
                remaining: self.cfg.reorder_gap.max(1),
                deadline: at + self.cfg.reorder_max_us * 1000,
            });
            return;
        }
        self.schedule(at, b, dir);
        // Frames held back in this direction have now been overtaken once.
        let mut i = 0;
        while i < self.held.len() {
            if self.held[i].dir == dir {
                self.held[i].remaining -= 1;
                if self.held[i].remaining == 0 {
                    let h = self.held.remove(i).expect("in range");
                    self.schedule(at, h.buf, h.dir);
                    continue;
                }
            }
            i += 1;
        }
    }

    /// RED's ramp on a queue of `queued` bytes: no mark below Kmin,
    /// probability rising to Pmax at Kmax, a mark beyond.
    fn ramp_mark(&mut self, dir: usize, b: usize, prefix: usize, queued: u64) {
        let (kmin, kmax) = (
            self.cfg.kmin_bytes,
            self.cfg.kmax_bytes.max(self.cfg.kmin_bytes + 1),
        );
        let p = if queued <= kmin {
            0.0
        } else if queued >= kmax {
            1.0
        } else {
            self.cfg.pmax * (queued - kmin) as f64 / (kmax - kmin) as f64
        };
        if p > 0.0 && self.rng.chance(p) && mark_ce(&mut self.bufs[b][prefix..]) {
            self.stats[dir].ce_marked += 1;
        }
    }

    /// Bytes queued at the bottleneck of direction `dir` at `now`: with
    /// PFC, the frames that have entered it (not those still held in
    /// their senders' NICs by a pause).
    pub fn queued_bytes(&self, dir: usize, now: u64) -> u64 {
        let q = self.backlog_bytes(dir, now);
        match self.cfg.pfc_xoff_bytes {
            0 => q,
            xoff => q.min(xoff),
        }
    }

    /// Bytes the bottleneck of direction `dir` still has to send at `now`,
    /// including frames a pause holds before it.
    fn backlog_bytes(&self, dir: usize, now: u64) -> u64 {
        let free = self.link_free_at[dir & 1];
        if self.cfg.rate_mbit <= 0.0 || free <= now {
            return 0;
        }
        ((free - now) as f64 * self.cfg.rate_mbit / 8000.0) as u64
    }

    /// The earliest time something is due.
    pub fn next_deadline(&self) -> Option<u64> {
        let d = self.due.peek().map(|Reverse((t, ..))| *t);
        let h = self.held.iter().map(|h| h.deadline).min();
        match (d, h) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Hands every frame due at `now` to `out(direction, frame)`; the
    /// direction is the side it came from.
    pub fn drain(&mut self, now: u64, mut out: impl FnMut(usize, &[u8])) {
        let mut i = 0;
        while i < self.held.len() {
            if self.held[i].deadline <= now {
                let h = self.held.remove(i).expect("in range");
                self.schedule(h.deadline, h.buf, h.dir);
            } else {
                i += 1;
            }
        }
        while let Some(Reverse((t, _, b, dir))) = self.due.peek().copied() {
            if t > now {
                break;
            }
            self.due.pop();
            if let Some((prefix, upto)) = self.mark_at_exit[b].take() {
                // The depth this frame leaves behind it: the bytes that
                // entered after it and had arrived by the time it left.
                let q = &mut self.in_queue[dir];
                while q.front().is_some_and(|e| e.1 <= upto) {
                    q.pop_front();
                }
                let arrived = q.partition_point(|e| e.0 <= t);
                let behind = arrived
                    .checked_sub(1)
                    .map_or(0, |i| q[i].1.saturating_sub(upto));
                self.ramp_mark(dir, b, prefix, behind);
            }
            out(dir, &self.bufs[b]);
            self.free.push(b);
        }
    }

    /// Frames inside the impairer (scheduled or held).
    pub fn in_flight(&self) -> usize {
        self.due.len() + self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::*;

    fn roce_frame(psn: u32) -> Vec<u8> {
        let mut repr = crate::wire::tests::sample(rdma_common::opcode::RC_RDMA_WRITE_ONLY);
        repr.transport.bth.psn = psn;
        let mut buf = vec![0u8; 256];
        let n = repr.emit(&[7u8; 5], &mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    #[test]
    fn ce_marks_keep_the_frame_valid() {
        let (out, imp) = run(
            ImpairConfig {
                ce: 0.5,
                ..Default::default()
            },
            200,
        );
        let marked = out
            .iter()
            .filter(|f| {
                let (r, _) = RoceRepr::parse(f).expect("checksum and ICRC still good");
                r.ip.traffic_class() & 3 == 3
            })
            .count() as u64;
        assert_eq!(marked, imp.stats[0].ce_marked);
        assert!(marked > 50 && marked < 150, "{marked}");
    }

    #[test]
    fn marks_are_decided_at_the_queues_entry_or_at_its_exit() {
        // A burst of 100 frames into an idle 100 Mbit/s link: frame k finds
        // k frames ahead of it and leaves 99 - k behind it.
        let run = |mark_on_dequeue: bool| {
            let f = roce_frame(0);
            let len = f.len() as u64;
            let mut imp = Impairer::new(ImpairConfig {
                rate_mbit: 100.0,
                queue_bytes: 1 << 20,
                kmin_bytes: 10 * len,
                kmax_bytes: 50 * len,
                pmax: 0.5,
                mark_on_dequeue,
                ..Default::default()
            });
            for _ in 0..100 {
                imp.push(0, 0, &f, 0);
            }
            let mut marks = Vec::new();
            imp.drain(u64::MAX, |_, x| {
                marks.push(RoceRepr::parse(x).unwrap().0.ip.traffic_class() & 3 == 3)
            });
            assert_eq!(
                marks.iter().filter(|&&m| m).count() as u64,
                imp.stats[0].ce_marked
            );
            assert!(is_ce(&{
                let mut g = f.clone();
                mark_ce(&mut g);
                g
            }));
            assert!(!is_ce(&f));
            marks
        };
        let enq = run(false);
        assert!(enq[..11].iter().all(|m| !m), "the first find a short queue");
        assert!(enq[51..].iter().all(|&m| m), "beyond Kmax every frame");
        let deq = run(true);
        assert!(
            deq[..49].iter().all(|&m| m),
            "the first leave a long queue behind"
        );
        assert!(deq[89..].iter().all(|m| !m), "the last leave an idle link");
    }

    /// A 100 Mbit/s bottleneck (queue 20 000 bytes, marks from 2 000 to
    /// 10 000) overloaded: frames of ~85 B, PSN k, every 1 µs (680
    /// Mbit/s) for 2 ms, drained as they go; with `pfc_xoff_bytes`. The
    /// frames out, with the µs they left in, and the deepest queue seen.
    fn overload(pfc_xoff_bytes: u64) -> (Impairer, Vec<(u64, Vec<u8>)>, u64) {
        let mut imp = Impairer::new(ImpairConfig {
            rate_mbit: 100.0,
            queue_bytes: 20_000,
            kmin_bytes: 2_000,
            kmax_bytes: 10_000,
            pmax: 0.5,
            pfc_xoff_bytes,
            ..Default::default()
        });
        let mut out = Vec::new();
        let mut queue_max = 0;
        for k in 0..2000u64 {
            imp.push(k * 1000, 0, &roce_frame(k as u32), 0);
            queue_max = queue_max.max(imp.queued_bytes(0, k * 1000));
            imp.drain(k * 1000, |_, x| out.push((k, x.to_vec())));
        }
        (imp, out, queue_max)
    }

    #[test]
    fn a_bottleneck_queues_marks_by_its_length_and_drops_when_full() {
        let (mut imp, mut out, _) = overload(0);
        let f = roce_frame(0);
        let st = imp.stats[0];
        assert!(st.queue_max_bytes <= 20_000, "{st:?}");
        assert!(st.bottleneck_drops > 0 && st.ce_marked > 0, "{st:?}");
        // Frames leave at the bottleneck's rate: 100 Mbit/s is one frame
        // of f.len() bytes every f.len() * 80 ns.
        let per = f.len() as u64 * 80;
        let n = out.len() as u64;
        assert!(
            (n as i64 - (2_000_000 / per) as i64).abs() <= 2,
            "{n} frames out"
        );
        // Marks only once the queue passed kmin: the first frames are clean.
        let marked = |x: &Vec<u8>| RoceRepr::parse(x).unwrap().0.ip.traffic_class() & 3 == 3;
        assert!(out.iter().take(20).all(|(_, x)| !marked(x)));
        // Every mark is on a frame that leaves (the rest of the queue too).
        imp.drain(u64::MAX, |_, x| out.push((0, x.to_vec())));
        let all_marked = out.iter().filter(|(_, x)| marked(x)).count() as u64;
        assert_eq!(all_marked, st.ce_marked);
        assert_eq!(out.len() as u64 + st.bottleneck_drops, 2000);
    }

    #[test]
    fn with_pfc_a_full_queue_pauses_its_senders_and_loses_nothing() {
        // The overload above, lossless: pause at 15 000 bytes.
        let (mut imp, mut out, queue_max) = overload(15_000);
        let st = imp.stats[0];
        assert_eq!(st.bottleneck_drops, 0, "{st:?}");
        assert!(
            st.queue_max_bytes <= 15_000 && queue_max <= 15_000,
            "{st:?}"
        );
        // The link never idles once the queue built: frames leave at its
        // rate, as without PFC.
        let per = roce_frame(0).len() as u64 * 80;
        let n = out.len() as u64;
        assert!(
            (n as i64 - (2_000_000 / per) as i64).abs() <= 2,
            "{n} frames out"
        );
        // One pause that lasts: the arrivals outrun the link all along.
        // It begins once the queue reached 15 000 bytes (frames of ~80
        // bytes come every µs and leave every ~6.5 µs: after ~220 µs; every
        // frame from then on waits) and
        // ends when the last frame enters, 15 000 bytes' time (1.2 ms)
        // before the link has sent everything.
        assert_eq!(st.pfc_pauses, 1, "{st:?}");
        assert!(st.pfc_held_frames > 1700, "{st:?}");
        let last_entry = 2000 * per - 15_000 * 80;
        assert!(
            st.pfc_paused_ns <= last_entry && st.pfc_paused_ns > last_entry - 400_000,
            "{st:?}, last entry at {last_entry} ns"
        );
        // Everything comes out, in order, and the marks stay on the ramp.
        imp.drain(u64::MAX, |_, x| out.push((0, x.to_vec())));
        assert_eq!(out.len(), 2000);
        for (k, (_, x)) in out.iter().enumerate() {
            assert_eq!(RoceRepr::parse(x).unwrap().0.transport.bth.psn, k as u32);
        }
        let marked = |x: &Vec<u8>| RoceRepr::parse(x).unwrap().0.ip.traffic_class() & 3 == 3;
        assert!(out.iter().take(20).all(|(_, x)| !marked(x)));
        assert_eq!(
            out.iter().filter(|(_, x)| marked(x)).count() as u64,
            st.ce_marked
        );
        // A queue that drains between bursts pauses once per burst.
        let mut imp = Impairer::new(ImpairConfig {
            rate_mbit: 100.0,
            queue_bytes: 20_000,
            pfc_xoff_bytes: 15_000,
            ..Default::default()
        });
        for burst in 0..3u64 {
            for k in 0..400u64 {
                imp.push(burst * 100_000_000 + k, 0, &roce_frame(0), 0);
            }
        }
        assert_eq!(imp.stats[0].pfc_pauses, 3, "{:?}", imp.stats[0]);
        assert_eq!(imp.stats[0].bottleneck_drops, 0);
    }

    #[test]
    fn pfc_must_pause_before_the_queue_is_full() {
        let cfg = ImpairConfig {
            queue_bytes: 1000,
            pfc_xoff_bytes: 1001,
            ..Default::default()
        };
        assert!(cfg.validate().unwrap_err().contains("--pfc-xoff-bytes"));
        let cfg = ImpairConfig {
            pfc_xoff_bytes: 1000,
            ..cfg
        };
        assert!(cfg.validate().is_ok());
    }

    #[test]
    fn a_burst_over_a_link_as_fast_as_the_bottleneck_builds_no_queue() {
        // 10 Gbit/s in and out, Kmin one frame: a host writes 64 frames at
        // once (one AF_XDP batch), and then the same from two ports.
        let f = roce_frame(0);
        let len = f.len() as u64;
        let cfg = ImpairConfig {
            rate_mbit: 10_000.0,
            queue_bytes: 1 << 20,
            kmin_bytes: len,
            kmax_bytes: 4 * len,
            pmax: 1.0,
            ..Default::default()
        };
        let run = |ports: usize, ingress_mbit: f64| {
            let mut imp = Impairer::new(cfg);
            let mut links = IngressLinks::new(ingress_mbit);
            let mut last = 0;
            for k in 0..64 {
                let t = links.arrival(k % ports, 1000, len);
                assert!(t >= last, "arrivals go back in time");
                last = t;
                imp.push(t, 0, &f, 0);
            }
            imp.drain(u64::MAX, |_, _| {});
            (imp.stats[0], last)
        };
        // Without a line rate the burst queues and is marked.
        let (st, _) = run(1, 0.0);
        assert!(st.queue_max_bytes >= 32 * len && st.ce_marked > 0, "{st:?}");
        // One 10 Gbit/s link: each frame finds the last one just gone.
        let (st, last) = run(1, 10_000.0);
        assert_eq!(st.ce_marked, 0, "{st:?}");
        assert!(st.queue_max_bytes <= len + 1, "{st:?}");
        // The 64 frames took their time on the wire: len bytes at 1.25 B/ns.
        let wire = (len as f64 / 1.25) as u64;
        assert_eq!(last, 1000 + 64 * wire);
        // Two such links into one: the queue grows by half the arrivals.
        let (st, _) = run(2, 10_000.0);
        assert!(st.queue_max_bytes >= 16 * len && st.ce_marked > 0, "{st:?}");
    }

    #[test]
    fn rates_must_be_finite_and_not_negative() {
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            let cfg = ImpairConfig {
                ingress_mbit: bad,
                ..Default::default()
            };
            assert!(cfg.validate().unwrap_err().contains("--ingress-mbit"));
        }
        assert!(ImpairConfig::default().validate().is_ok());
    }

    fn run(cfg: ImpairConfig, n: u32) -> (Vec<Vec<u8>>, Impairer) {
        let mut imp = Impairer::new(cfg);
        let mut out = Vec::new();
        let mut now = 0;
        for psn in 0..n {
            imp.push(now, 0, &roce_frame(psn), 0);
            now += 1000;
            imp.drain(now, |_, f| out.push(f.to_vec()));
        }
        now += 10_000_000;
        imp.drain(now, |_, f| out.push(f.to_vec()));
        assert_eq!(imp.in_flight(), 0);
        (out, imp)
    }

    fn psn_of(f: &[u8]) -> Option<u32> {
        RoceRepr::parse(f).ok().map(|(r, _)| r.transport.bth.psn)
    }

    #[test]
    fn mads_alone_take_the_extra_delay_and_fall_behind_later_data() {
        let mut imp = Impairer::new(ImpairConfig {
            mad_delay_us: 50,
            ..Default::default()
        });
        let mut mad = crate::wire::tests::sample(rdma_common::opcode::UD_SEND_ONLY);
        mad.transport.bth.dest_qpn = 1;
        let mut buf = vec![0u8; 512];
        let n = mad.emit(&[0u8; 256], &mut buf).unwrap();
        buf.truncate(n);
        imp.push(0, 0, &buf, 0);
        imp.push(1000, 0, &roce_frame(7), 0);
        let mut out = Vec::new();
        imp.drain(49_999, |_, f| out.push(f.to_vec()));
        assert_eq!(out, vec![roce_frame(7)], "the data frame passes at once");
        imp.drain(50_000, |_, f| out.push(f.to_vec()));
        assert_eq!(out, vec![roce_frame(7), buf], "the MAD 50 us late");
        assert_eq!(imp.stats[0].mad_delayed, 1);
        assert_eq!(imp.stats[0].tx, 2);
    }

    #[test]
    fn clean_config_passes_everything_in_order() {
        let (out, imp) = run(ImpairConfig::default(), 1000);
        let psns: Vec<u32> = out.iter().map(|f| psn_of(f).unwrap()).collect();
        assert_eq!(psns, (0..1000).collect::<Vec<_>>());
        assert_eq!(imp.stats[0].tx, 1000);
    }

    #[test]
    fn each_fault_happens_at_about_its_rate_and_is_counted() {
        let cfg = ImpairConfig {
            loss: 0.05,
            reorder: 0.05,
            dup: 0.01,
            corrupt: 0.001,
            seed: 42,
            ..Default::default()
        };
        let n = 100_000;
        let (out, imp) = run(cfg, n);
        let s = imp.stats[0];
        let near = |x: u64, p: f64| (x as f64 - p * n as f64).abs() < 0.15 * p * n as f64 + 10.0;
        assert!(near(s.dropped, 0.05), "{s:?}");
        assert!(near(s.reordered, 0.05 * 0.95), "{s:?}");
        assert!(near(s.duplicated, 0.01 * 0.95), "{s:?}");
        assert!(near(s.corrupted, 0.001 * 0.95), "{s:?}");
        assert_eq!(out.len() as u64, s.tx);
        assert_eq!(s.tx, n as u64 - s.dropped + s.duplicated);
        // Corrupted frames fail the ICRC (a flip in BTH byte 4, which the
        // ICRC masks, goes unnoticed: 1 bit in ~100), all others parse.
        let bad = out.iter().filter(|f| psn_of(f).is_none()).count() as u64;
        assert!(
            bad <= s.corrupted * 2 && bad >= s.corrupted * 9 / 10,
            "{bad} {s:?}"
        );
        let psns: Vec<u32> = out.iter().filter_map(|f| psn_of(f)).collect();
        let inversions = psns.windows(2).filter(|w| w[1] < w[0]).count() as u64;
        assert!(inversions > s.reordered / 2, "{inversions} {s:?}");
    }

    #[test]
    fn a_seed_replays_exactly() {
        let cfg = ImpairConfig {
            loss: 0.1,
            reorder: 0.1,
            dup: 0.1,
            corrupt: 0.1,
            jitter_us: 5,
            seed: 9,
            ..Default::default()
        };
        let (a, _) = run(cfg, 2000);
        let (b, _) = run(cfg, 2000);
        assert_eq!(a, b);
        let (c, _) = run(ImpairConfig { seed: 10, ..cfg }, 2000);
        assert_ne!(a, c);
    }

    #[test]
    fn non_roce_frames_pass_untouched_and_delay_holds_frames() {
        let mut imp = Impairer::new(ImpairConfig {
            loss: 1.0,
            delay_us: 100,
            ..Default::default()
        });
        let arp = vec![0xffu8; 60];
        let mut out = Vec::new();
        imp.push(0, 1, &arp, 0);
        imp.push(0, 1, &roce_frame(1), 0);
        imp.drain(0, |d, f| out.push((d, f.to_vec())));
        assert_eq!(out, vec![(1, arp)]);
        assert_eq!(imp.stats[1].dropped, 1);

        let mut imp = Impairer::new(ImpairConfig {
            delay_us: 100,
            ..Default::default()
        });
        imp.push(0, 0, &roce_frame(1), 0);
        let mut n = 0;
        imp.drain(99_999, |_, _| n += 1);
        assert_eq!((n, imp.next_deadline()), (0, Some(100_000)));
        imp.drain(100_000, |_, _| n += 1);
        assert_eq!(n, 1);
    }
}
