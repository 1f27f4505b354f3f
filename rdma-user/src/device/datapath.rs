//! The data path: AF_XDP rings -> parser -> RC engines -> memory and
//! completions, and back. A plain struct with [`DataPath::poll`], so that the
//! daemon's pinned thread and the benchmarks drive the same code.
//!
//! Nothing here allocates, locks or logs per packet: frames are parsed in
//! place, completions go into preallocated per-CQ rings, drops are counted.
//!
//! The engine state [`Core`] is one struct; its code is split by the data
//! it works on:
//! - `mr`: protection domains and memory regions;
//! - `cq`: completion queues ([`CqRing`]) and the moves of completions
//!   into them;
//! - `qp`: the QP and AH tables (create, connect, modify, destroy);
//! - `post`: work requests into the engines, direct or from shared rings;
//! - `rxtx`: received frames, timers, and frames to transmit;
//! - `xdp_responder`: the MR pool and the QPs lent to the XDP responder;
//! - `stats`: the counters ([`DpStats`], [`DataPath::stats_json`]);
//! - `backoff`: how the thread waits between turns ([`Backoff`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use crate::device::error::DeviceError;

/// Results of the data path's control calls.
pub type Result<T, E = DeviceError> = std::result::Result<T, E>;

use crate::io::xsk::{SharedMem, Xsk};
use crate::memory::MrTable;
use crate::transport::{Nanos, TxOrder};

use super::rings::{AsyncShared, Doorbell};
use crate::wire::{
    udp_sport_for_qps, EthernetRepr, IpRepr, Ipv4Repr, Ipv6Repr, RoceRepr, TransportRepr, UdpRepr,
    ETH_P_IPV4, ETH_P_IPV6, IPPROTO_UDP, ROCE_V2_UDP_PORT,
};

mod backoff;
mod cq;
mod mr;
mod post;
mod qp;
mod rxtx;
mod stats;
mod xdp_responder;
pub use backoff::Backoff;
pub use cq::CqRing;
use qp::QpSlot;
pub use stats::DpStats;
pub use xdp_responder::{ack_template, snapshot_of, XdpResponder};

/// Frames taken from a receive ring per turn.
const RX_BATCH: u32 = 64;

/// Where a QP's packets go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Path {
    pub local_mac: [u8; 6],
    pub peer_mac: [u8; 6],
    pub local_ip: IpAddr,
    pub peer_ip: IpAddr,
    pub vlan: Option<u16>,
    /// The IP header's DSCP (IPv4 TOS, IPv6 traffic class): the address
    /// handle's `grh.traffic_class`, which rxe puts there too (UCX asks
    /// for 106, DSCP 26). The ECN bits are the engine's (see
    /// `Core::template`).
    pub traffic_class: u8,
}

impl Path {
    /// Network headers for a QP pair, as rxe builds them: DF, TTL/hop limit
    /// 64, UDP checksum 0, source port from the QPNs.
    pub fn template(&self, lqpn: u32, rqpn: u32) -> Result<RoceRepr> {
        let mut ip = match (self.local_ip, self.peer_ip) {
            (IpAddr::V4(l), IpAddr::V4(p)) => IpRepr::V4(Ipv4Repr {
                src: l.octets(),
                dst: p.octets(),
                ..Default::default()
            }),
            (IpAddr::V6(l), IpAddr::V6(p)) => IpRepr::V6(Ipv6Repr {
                src: l.octets(),
                dst: p.octets(),
                traffic_class: 0,
                flow_label: 0,
                hop_limit: 64,
                next_header: IPPROTO_UDP,
            }),
            _ => return Err(DeviceError::MixedFamilies),
        };
        ip.set_traffic_class(self.traffic_class);
        Ok(RoceRepr {
            eth: EthernetRepr {
                dst: self.peer_mac,
                src: self.local_mac,
                vlan_tci: self.vlan,
                ethertype: if matches!(ip, IpRepr::V4(_)) {
                    ETH_P_IPV4
                } else {
                    ETH_P_IPV6
                },
            },
            ip,
            udp: UdpRepr {
                src_port: udp_sport_for_qps(lqpn, rqpn),
                dst_port: ROCE_V2_UDP_PORT,
                checksum: 0,
            },
            transport: TransportRepr::default(),
        })
    }
}

/// What `connect_qp` needs besides the path. `Connect::new` gives
/// perftest's and rc_pingpong's attributes (timeout 14, retry_cnt 7).
#[derive(Debug, Clone, Copy)]
pub struct Connect {
    pub remote_qpn: u32,
    pub remote_psn: u32,
    pub local_psn: u32,
    pub mtu: u32,
    pub max_rd_atomic: u8,
    /// Local ACK timeout exponent: 4.096 us * 2^timeout.
    pub timeout: u8,
    pub retry_cnt: u8,
    /// Selective repeat instead of go-back-N: only when both sides offered
    /// it in the connection exchange (`transport::negotiate_selective_repeat`).
    pub selective_repeat: bool,
}

impl Connect {
    pub fn new(remote_qpn: u32, remote_psn: u32, local_psn: u32, mtu: u32) -> Connect {
        Connect {
            remote_qpn,
            remote_psn,
            local_psn,
            mtu,
            max_rd_atomic: 1,
            timeout: 14,
            retry_cnt: 7,
            selective_repeat: false,
        }
    }
}

/// Limits of one device.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_qp: usize,
    pub max_ah: usize,
    pub max_mr: usize,
    pub max_cq: usize,
    pub max_mr_len: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            // What the drop-in libibverbs reports as max_qp.
            max_qp: 1024,
            max_ah: 0x3ffe,
            max_mr: 1024,
            // rdma_create_qp without CQs makes two per QP (librdmacm's
            // ucma_create_cqs): room for that at max_qp, and more.
            max_cq: 4096,
            max_mr_len: 1 << 30,
        }
    }
}

/// Congestion control of a device: ECN on the wire and DCQCN per QP.
#[derive(Debug, Clone, Copy)]
pub struct CcConfig {
    /// Data packets go out ECT(0) (CNPs never do).
    pub ecn: bool,
    /// The DSCP of the CNPs we send (mlx5's default, 48).
    pub cnp_dscp: u8,
    /// Every new QP's DCQCN tunables (`params.enabled`: the reaction point).
    pub params: crate::transport::dcqcn::CcParams,
}

impl Default for CcConfig {
    fn default() -> Self {
        CcConfig {
            ecn: true,
            cnp_dscp: 48,
            params: Default::default(),
        }
    }
}

/// Engine state of one device (QPs, MRs, CQs), without the sockets. Split
/// from the sockets so the RX callback can borrow it while a socket is busy.
pub struct Core {
    pub mem: MrTable,
    mr_backing: HashMap<u32, SharedMem>,
    qps: crate::memory::KeyMap<QpSlot>,
    cqs: crate::memory::KeyMap<CqRing>,
    /// Address handles: the network headers of a UD destination.
    ahs: crate::memory::KeyMap<RoceRepr>,
    next_ah: u32,
    next_qpn: u32,
    next_cq: u32,
    next_pd: u32,
    pub stats: DpStats,
    pub limits: Limits,
    rng: u64,
    rr: usize,
    /// The last `build_frame` left a QP's packets to DCQCN's pacing (its
    /// deadline is among the timers).
    tx_paced: bool,
    qp_order: Vec<u32>,
    /// Rung by posters and control calls while the thread waits.
    pub doorbell: Option<Arc<Doorbell>>,
    /// Where the device's asynchronous events go (a verbs context's).
    pub async_events: Option<Arc<AsyncShared>>,
    /// ECN and DCQCN: set before QPs and AHs are made.
    pub cc: CcConfig,
    /// QP1's mailbox to the CM, when a CM runs on this device.
    pub gsi: Option<Arc<super::gsi::Gsi>>,
    /// (index, count): QPNs made here are the ones the data path `index`
    /// of `count` owns (see `shard::owner_of`).
    qpn_class: (u32, u32),
    /// The XDP responder, when the program's maps are mapped.
    xdp_responder: Option<XdpResponder>,
    /// MRs taken from the pool here: lkey -> (pool offset, rkey).
    pool_owned: HashMap<u32, (usize, u32)>,
    /// Pool MRs mapped over application pages: lkey -> (address, bytes).
    overlays: HashMap<u32, (usize, usize)>,
    /// Some QP may be lendable to XDP (see `lend_idle`).
    lend_pending: bool,
}

pub struct DataPath {
    pub xsks: Vec<Xsk>,
    pub core: Core,
    /// Its place among several data paths of one interface (the daemon's
    /// `--queues`): frames for another's QPs are handed over.
    pub shard: Option<super::shard::Shard>,
    clock: Instant,
    /// When the last turn ([`DataPath::poll`]) started, on `clock`.
    turn_at: Nanos,
    /// A TX kick skipped last turn (see `poll`).
    kick_deferred: bool,
    /// Since when a program's turns hold the responses (ACKs) they owe
    /// back (see [`Turn::Poll`]).
    acks_held: Option<Nanos>,
}

/// Who takes a turn of the data path, which decides when its frames go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// The data path thread, or a tool's own loop: frames go at once, but
    /// a turn that received and answered (ACKs) leaves its kick to the
    /// next turn, so that a request posted meanwhile goes in the same
    /// syscall.
    Thread,
    /// A program that polls its CQ. What a turn that received requests
    /// owes (ACKs) is held back for up to `hold_acks` ns of its turns that
    /// receive no more requests, waiting for the program's next post;
    /// requests go. A program that answers a message (an MPI
    /// rank's ping-pong, `ib_send_lat`) reads the completion, matches it
    /// and posts its reply a few microseconds after the turn that received
    /// it; its polls of other CQs meanwhile (UCX polls four) are turns
    /// too, and sending the ACK on the first of them took a sendto of its
    /// own, whose veth transmit and the peer's XDP run on this CPU before
    /// the reply can go.
    Poll { hold_acks: Nanos },
    /// A program's post: everything goes at once, requests before the
    /// ACKs held for them (`QpEngine::poll_transmit_ordered`), so that the
    /// peer, spinning, takes the request while this CPU still moves the ACK.
    Post,
}

/// Fresh entropy for keys and PSNs.
pub fn entropy() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom into a local buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr() as *mut _, 8, 0) };
    if n == 8 {
        u64::from_ne_bytes(b)
    } else {
        Instant::now().elapsed().as_nanos() as u64 ^ std::process::id() as u64
    }
}

impl Core {
    pub fn new(limits: Limits, seed: u64) -> Core {
        Core {
            mem: MrTable::new(limits.max_mr, seed),
            mr_backing: HashMap::new(),
            qps: crate::memory::KeyMap::default(),
            cqs: crate::memory::KeyMap::default(),
            ahs: crate::memory::KeyMap::default(),
            next_ah: 1,
            // rxe starts QPNs at 17; so do we (QP0/QP1 are special).
            next_qpn: 0x11,
            qpn_class: (0, 1),
            next_cq: 1,
            next_pd: 1,
            stats: DpStats::default(),
            limits,
            rng: seed,
            rr: 0,
            tx_paced: false,
            qp_order: Vec::new(),
            doorbell: None,
            async_events: None,
            cc: CcConfig::default(),
            gsi: None,
            xdp_responder: None,
            pool_owned: HashMap::new(),
            overlays: HashMap::new(),
            lend_pending: false,
        }
    }

    pub fn random_psn(&mut self) -> u32 {
        self.rng = self
            .rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.rng >> 33) as u32) & 0xff_ffff
    }
}

impl DataPath {
    pub fn new(xsks: Vec<Xsk>, limits: Limits) -> DataPath {
        DataPath {
            xsks,
            core: Core::new(limits, entropy()),
            shard: None,
            clock: Instant::now(),
            turn_at: 0,
            kick_deferred: false,
            acks_held: None,
        }
    }

    /// One of several data paths of an interface: its own socket, and the
    /// QPs whose QPNs `shard` owns.
    pub fn new_shard(xsk: Xsk, limits: Limits, shard: super::shard::Shard) -> DataPath {
        let mut dp = DataPath::new(vec![xsk], limits);
        dp.core.qpn_class = (shard.index, shard.count);
        dp.shard = Some(shard);
        dp
    }

    pub fn now(&self) -> Nanos {
        self.clock.elapsed().as_nanos() as Nanos
    }

    /// The data path's clock, to read without the data path (what `now`
    /// reads).
    pub fn clock(&self) -> impl Fn() -> Nanos + Copy + Send + 'static {
        let origin = self.clock;
        move || origin.elapsed().as_nanos() as Nanos
    }

    /// When the last turn started: the time a caller of [`DataPath::poll`]
    /// needs right after it, without reading the clock again.
    pub fn turn_at(&self) -> Nanos {
        self.turn_at
    }

    /// One turn of the loop: receive, timers, transmit. Returns whether any
    /// packet moved (for adaptive polling) and the next timer deadline.
    pub fn poll(&mut self) -> (bool, Option<Nanos>) {
        self.poll_as(Turn::Thread)
    }

    /// [`DataPath::poll`] as `who` takes it.
    pub fn poll_as(&mut self, who: Turn) -> (bool, Option<Nanos>) {
        let now = self.now();
        self.turn_at = now;
        let mut work = self.core.pump_rings();
        let requests_before = self.core.stats.rx_requests;
        let core = &mut self.core;
        let mut received = false;
        // Every receive ring was read empty this turn.
        let mut drained = true;
        match &mut self.shard {
            None => {
                for x in self.xsks.iter_mut() {
                    let n = x.recv(RX_BATCH, |f| core.handle_frame(now, f));
                    received |= n > 0;
                    drained &= n < RX_BATCH;
                }
            }
            Some(shard) => {
                for x in self.xsks.iter_mut() {
                    let n = x.recv(RX_BATCH, |f| {
                        match crate::wire::peek_dest_qpn(f).and_then(|q| shard.elsewhere(q)) {
                            Some(owner) => shard.hand_over(owner, f),
                            None => core.handle_frame(now, f),
                        }
                    });
                    received |= n > 0;
                    drained &= n < RX_BATCH;
                }
                let n = shard.drain(RX_BATCH as usize, |f| core.handle_frame(now, f));
                received |= n > 0;
                drained &= n < RX_BATCH as usize;
            }
        }
        work |= received;
        if drained {
            // Nothing waits in the rings: quiescent QPs go (back) to XDP.
            core.lend_idle(now);
        }
        let next = core.handle_timers(now);
        let order = match who {
            Turn::Thread => TxOrder::ResponsesFirst,
            Turn::Post => TxOrder::RequestsFirst,
            Turn::Poll { hold_acks } => {
                // More requests before the program's post: a stream,
                // whose sender waits for the ACKs, not a message to answer.
                let requests = core.stats.rx_requests != requests_before;
                let hold = match self.acks_held {
                    None => requests,
                    Some(t0) => !requests && now.saturating_sub(t0) < hold_acks,
                };
                if hold {
                    self.acks_held.get_or_insert(now);
                    TxOrder::RequestsOnly
                } else {
                    TxOrder::ResponsesFirst
                }
            }
        };
        if order != TxOrder::RequestsOnly {
            self.acks_held = None;
        }
        if let Some(x) = self.xsks.first_mut() {
            let mut sent = 0;
            let mut emptied = false;
            loop {
                if x.tx_room() == 0 {
                    x.reap();
                    if x.tx_room() == 0 {
                        core.stats.tx_ring_full += 1;
                        break;
                    }
                }
                if !x.send_with(|buf| core.build_frame_ordered(now, buf, order)) {
                    emptied = true;
                    break;
                }
                sent += 1;
                if sent >= 64 {
                    break;
                }
            }
            core.stats.tx_frames += sent;
            // In copy mode every kick is a sendto that runs the veth transmit
            // and the peer's XDP program on this CPU. When a turn received
            // packets and sent (ACKs, or a stream's next requests as its
            // ACKs come in), more is likely to follow right away (the
            // program's next post): wait one turn so that both leave in
            // one syscall instead of two. The next turn always kicks.
            if sent > 0 && work && !self.kick_deferred {
                self.kick_deferred = true;
            } else {
                self.kick_deferred = false;
                x.kick();
            }
            // Packets sent that leave the rest to DCQCN's pacing are not a
            // reason to spin: nothing more can go before the pacing
            // deadline, which the next turn's timers report, so the thread
            // may sleep until then (or a frame). Spinning after each
            // paced packet kept four paced senders on one core busy, and
            // each woke a scheduler tick (4 ms) or more late.
            work |= sent > 0 && !(emptied && core.tx_paced);
        }
        (work, next)
    }

    /// Kicks every socket until the kernel has taken all frames queued for
    /// transmission, for at most `limit`; whether it did. Closing a socket
    /// discards what its TX ring still holds, and copy mode transmits only
    /// 32 frames per wakeup: the last ACK of a program that exits at once
    /// would be lost, and its peer's SEND would retry until RETRY_EXC_ERR.
    pub fn drain_tx(&mut self, limit: std::time::Duration) -> bool {
        let t0 = std::time::Instant::now();
        loop {
            for x in &mut self.xsks {
                x.kick();
            }
            if self.xsks.iter().all(|x| x.tx_drained()) {
                return true;
            }
            if t0.elapsed() >= limit {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }

    /// A kick this turn deferred (to send an ACK with the next request in
    /// one syscall) is still to come.
    pub fn kick_pending(&self) -> bool {
        self.kick_deferred || self.acks_held.is_some()
    }

    /// A program's polls hold ACKs back (see [`Turn::Poll`]).
    pub fn acks_held(&self) -> bool {
        self.acks_held.is_some()
    }

    /// Does the kick a turn deferred now, and sends the ACKs held back.
    pub fn flush_kick(&mut self) {
        if self.acks_held.take().is_some() {
            self.poll();
        }
        if std::mem::take(&mut self.kick_deferred) {
            if let Some(x) = self.xsks.first_mut() {
                x.kick();
            }
        }
    }

    /// One turn that leaves nothing queued behind it: a kick the turn
    /// deferred (to send an ACK and the next request in one syscall) goes
    /// now. For a caller that may not take the next turn.
    pub fn poll_flushed(&mut self) -> (bool, Option<Nanos>) {
        let r = self.poll();
        self.flush_kick();
        r
    }
}
