//! The impairment relay: forwards every frame between side A and side B (the
//! middle of host A - relay - host B, or our host - relay - the rxe VM) and
//! applies the seeded faults of an [`Impairer`] to RoCEv2 frames.
//!
//! Side A may be several interfaces: the relay is then a switch whose
//! egress port towards B is the shared bottleneck (the congestion test
//! bed's N senders to one receiver). Frames from B go to the A port that
//! their destination MAC was last seen on, or to every A port while it is
//! unknown (ARP). With a timeline file, the relay records per A port and
//! per time bin what crossed the bottleneck: bytes, CE marks, drops, the
//! CNPs coming back, and the queue's depth.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::io::packet::{RawSocket, VNET_HDR_LEN};
use crate::tools::impair::{
    is_ce, roce_payload_offset, DirStats, ImpairConfig, Impairer, IngressLinks,
};

#[derive(Debug, Clone, Serialize)]
pub struct RelayReport {
    pub config: ImpairConfig,
    /// The A ports (one, or a switch's several).
    pub a: Vec<String>,
    pub b: String,
    /// Frames that came from A (and went towards B), and the reverse.
    pub a_to_b: DirStats,
    pub b_to_a: DirStats,
    pub seconds: f64,
}

/// Queue depths are counted in this many buckets up to the queue's limit.
pub const QUEUE_BUCKETS: usize = 64;

/// What crossed the bottleneck (A to B) in one time bin.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Bin {
    /// RoCE bytes (Ethernet frames) that entered the queue, per A port.
    pub bytes: Vec<u64>,
    /// CE-marked frames that left the queue in the bin, per A port.
    pub ce: Vec<u64>,
    /// Dropped at the full queue, per A port.
    pub drops: Vec<u64>,
    /// CNPs from B towards each A port.
    pub cnps: Vec<u64>,
    pub queue_max_bytes: u64,
    /// Arrivals by the queue depth they found (with themselves), in
    /// buckets of `Timeline::queue_bucket_bytes`.
    pub queue_hist: Vec<u32>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Timeline {
    pub bin_ms: f64,
    /// The wall-clock time (Unix, ns) of the start of bin 0.
    pub start_unix_ns: u64,
    pub ports: Vec<String>,
    pub rate_mbit: f64,
    pub queue_bucket_bytes: u64,
    pub bins: Vec<Bin>,
}

impl Timeline {
    fn bin(&mut self, now_ns: u64) -> &mut Bin {
        let i = (now_ns as f64 / (self.bin_ms * 1e6)) as usize;
        let n = self.ports.len();
        while self.bins.len() <= i {
            self.bins.push(Bin {
                bytes: vec![0; n],
                ce: vec![0; n],
                drops: vec![0; n],
                cnps: vec![0; n],
                queue_max_bytes: 0,
                queue_hist: vec![0; QUEUE_BUCKETS],
            });
        }
        &mut self.bins[i]
    }
}

/// Where and how long the relay runs.
pub struct RelayOptions<'a> {
    pub a: &'a [String],
    pub b: &'a str,
    pub max: Option<Duration>,
    pub progress: bool,
    /// Record a [`Timeline`] with bins this long.
    pub timeline_bin: Option<Duration>,
}

/// The BTH opcode of a RoCEv2 frame (`f` from its Ethernet header).
fn roce_opcode(f: &[u8]) -> Option<u8> {
    f.get(roce_payload_offset(f)?).copied()
}

fn mac_at(f: &[u8], off: usize) -> Option<[u8; 6]> {
    f.get(off..off + 6)?.try_into().ok()
}

/// Pushes a frame from port `i` (direction `dir`) at `t` into the impairer
/// and counts it in the timeline's bin.
fn record(
    tl: &mut Timeline,
    imp: &mut Impairer,
    port_of: &HashMap<[u8; 6], usize>,
    t: u64,
    i: usize,
    dir: usize,
    frame: &[u8],
) {
    let eth = &frame[VNET_HDR_LEN.min(frame.len())..];
    let before = imp.stats[0];
    let op = roce_opcode(eth);
    let cnp_to = (dir == 1 && matches!(op, Some(0x80 | 0x81)))
        .then(|| mac_at(eth, 0).and_then(|m| port_of.get(&m).copied()))
        .flatten();
    imp.push(t, dir, frame, VNET_HDR_LEN);
    let bucket = tl.queue_bucket_bytes;
    let bin = tl.bin(t);
    if let Some(p) = cnp_to {
        bin.cnps[p] += 1;
    }
    if dir == 0 && op.is_some() {
        let after = imp.stats[0];
        if after.bottleneck_drops > before.bottleneck_drops {
            bin.drops[i] += 1;
        } else {
            bin.bytes[i] += eth.len() as u64;
            let q = imp.queued_bytes(0, t);
            bin.queue_max_bytes = bin.queue_max_bytes.max(q);
            bin.queue_hist[((q / bucket) as usize).min(QUEUE_BUCKETS - 1)] += 1;
        }
    }
}

/// A RoCE frame leaving towards B marked CE counts in the bin of its
/// departure, for the A port of its source MAC (marks are decided at the
/// queue's entry or its exit, and counted once, here).
fn count_ce(tl: &mut Timeline, port_of: &HashMap<[u8; 6], usize>, t: u64, dir: usize, f: &[u8]) {
    let eth = &f[VNET_HDR_LEN.min(f.len())..];
    if dir != 0 || roce_opcode(eth).is_none() || !is_ce(eth) {
        return;
    }
    if let Some(&p) = mac_at(eth, 6).and_then(|m| port_of.get(&m)) {
        tl.bin(t).ce[p] += 1;
    }
}

/// Sends a frame from side `dir` on: from A to B (the last socket), from B
/// to the A port of its destination MAC, or to all of them.
fn forward(
    socks: &[RawSocket],
    port_of: &HashMap<[u8; 6], usize>,
    dir: usize,
    f: &[u8],
) -> std::io::Result<()> {
    let nb = socks.len() - 1;
    if dir == 0 {
        return socks[nb].send(f);
    }
    match mac_at(f, VNET_HDR_LEN).and_then(|m| port_of.get(&m)) {
        Some(&p) => socks[p].send(f),
        None => socks[..nb].iter().try_for_each(|s| s.send(f)),
    }
}

/// Runs until SIGINT/SIGTERM (or `max` elapses), then returns the counters
/// (and the timeline, if one was asked for).
pub fn run(o: RelayOptions, cfg: ImpairConfig) -> Result<(RelayReport, Option<Timeline>)> {
    if o.a.is_empty() {
        bail!("the relay needs at least one side A interface");
    }
    let mut socks = Vec::with_capacity(o.a.len() + 1);
    for a in o.a {
        socks.push(RawSocket::bind(a, true).with_context(|| format!("relay side A ({a})"))?);
    }
    socks.push(RawSocket::bind(o.b, true).with_context(|| format!("relay side B ({})", o.b))?);
    let nb = o.a.len();
    // The hosts beside the relay may run the XDP responder, whose ACKs
    // leave by XDP_TX: a veth delivers those only to a peer with XDP.
    let _pass: Vec<_> =
        o.a.iter()
            .map(String::as_str)
            .chain([o.b])
            .filter_map(crate::io::xdp::pass_through_if_veth)
            .collect();
    super::stop_on_signals();
    for sock in &socks {
        sock.enable_timestamps().context("SO_TIMESTAMPNS")?;
    }
    let mut imp = Impairer::new(cfg);
    let mut ingress = IngressLinks::new(cfg.ingress_mbit);
    let start = Instant::now();
    let start_unix_ns = super::unix_ns();
    let mut timeline = o.timeline_bin.map(|b| Timeline {
        bin_ms: b.as_secs_f64() * 1e3,
        start_unix_ns,
        ports: o.a.to_vec(),
        rate_mbit: cfg.rate_mbit,
        queue_bucket_bytes: cfg.queue_bytes.div_ceil(QUEUE_BUCKETS as u64).max(1),
        bins: Vec::new(),
    });
    // The relay's clock is the kernel's receive stamps' (wall clock, from
    // the start): a frame read late, in a batch, entered the queue when it
    // arrived, not when the relay got to it.
    let now = || super::unix_ns().saturating_sub(start_unix_ns);
    // Which A port each source MAC was seen on.
    let mut port_of: HashMap<[u8; 6], usize> = HashMap::new();
    // Frames read in one round, from every port, put in arrival order:
    // (arrival, port, frame); buffers are reused.
    let mut batch: Vec<(u64, usize, Vec<u8>)> = Vec::new();
    let mut pool: Vec<Vec<u8>> = Vec::new();
    let mut last_report = Instant::now();
    let mut send_err = None;
    let mut fds: Vec<libc::pollfd> = socks
        .iter()
        .map(|s| libc::pollfd {
            fd: s.fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    while !super::stop_requested() && o.max.is_none_or(|m| start.elapsed() < m) {
        for (i, s) in socks.iter().enumerate() {
            for _ in 0..64 {
                // GSO frames from a veth may be up to 64 KiB plus the header.
                let mut buf = pool
                    .pop()
                    .unwrap_or_else(|| vec![0u8; 65536 + VNET_HDR_LEN + 64]);
                let Some((n, stamp)) = s.try_recv_stamped(&mut buf)? else {
                    pool.push(buf);
                    break;
                };
                let t = now();
                let at = stamp.map_or(t, |x| x.saturating_sub(start_unix_ns).min(t));
                buf.truncate(n);
                batch.push((at, i, buf));
            }
        }
        let got = !batch.is_empty();
        batch.sort_by_key(|b| b.0);
        // Frames from the A ports arrive as their links deliver them (a
        // port's frames keep their order: the sort is stable).
        for (t, i, buf) in batch.iter_mut() {
            if *i != nb {
                let len = buf.len().saturating_sub(VNET_HDR_LEN) as u64;
                *t = ingress.arrival(*i, *t, len);
            }
        }
        for (t, i, mut buf) in batch.drain(..) {
            let dir = usize::from(i == nb);
            let eth = &buf[VNET_HDR_LEN.min(buf.len())..];
            if dir == 0 {
                if let Some(m) = mac_at(eth, 6) {
                    port_of.insert(m, i);
                }
            }
            match timeline.as_mut() {
                None => imp.push(t, dir, &buf, VNET_HDR_LEN),
                Some(tl) => record(tl, &mut imp, &port_of, t, i, dir, &buf),
            }
            buf.resize(65536 + VNET_HDR_LEN + 64, 0);
            pool.push(buf);
        }
        let t = now();
        imp.drain(t, |dir, f| {
            if let Some(tl) = timeline.as_mut() {
                count_ce(tl, &port_of, t, dir, f);
            }
            if let Err(e) = forward(&socks, &port_of, dir, f) {
                send_err.get_or_insert(e);
            }
        });
        if let Some(e) = send_err.take() {
            return Err(e).context("relay send");
        }
        if o.progress && last_report.elapsed() > Duration::from_secs(5) {
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
        crate::io::ppoll_ns(&mut fds, wait_ns);
    }
    // Whatever is still delayed is delivered, not lost.
    let t = now();
    imp.drain(u64::MAX, |dir, f| {
        if let Some(tl) = timeline.as_mut() {
            count_ce(tl, &port_of, t, dir, f);
        }
        let _ = forward(&socks, &port_of, dir, f);
    });
    Ok((
        RelayReport {
            config: cfg,
            a: o.a.to_vec(),
            b: o.b.into(),
            a_to_b: imp.stats[0],
            b_to_a: imp.stats[1],
            seconds: start.elapsed().as_secs_f64(),
        },
        timeline,
    ))
}
