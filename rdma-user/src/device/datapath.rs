//! The data path: AF_XDP rings -> parser -> RC engines -> memory and
//! completions, and back. A plain struct with [`DataPath::poll`], so that the
//! daemon's pinned thread and the benchmarks drive the same code.
//!
//! Nothing here allocates, locks or logs per packet: frames are parsed in
//! place, completions go into preallocated per-CQ rings, drops are counted.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use crate::device::error::DeviceError;

/// Results of the data path's control calls.
pub type Result<T, E = DeviceError> = std::result::Result<T, E>;

use crate::io::xsk::{SharedMem, Xsk};
use crate::memory::{Access, Backing, MrTable};
use crate::transport::{
    grh_of, Nanos, PostError, QpAttr, QpCap, QpEngine, QpState, QpStats, QpType, RecvWr, SendWr,
    Wc, WcOpcode,
};

use super::rings::{AsyncEvent, AsyncShared, CqShared, Doorbell, QpRings, SrqShared};
use crate::wire::{
    udp_sport_for_qps, udp_sport_for_ud, EthernetRepr, IpRepr, Ipv4Repr, Ipv6Repr, RoceRepr,
    TransportRepr, UdpRepr, WireError, ETH_P_IPV4, ETH_P_IPV6, ICRC_LEN, IPPROTO_UDP,
    ROCE_V2_UDP_PORT,
};
use rdma_common::OpFlags;

mod xdp_responder;
pub use xdp_responder::{ack_template, snapshot_of, XdpResponder};

/// Frames taken from a receive ring per turn.
const RX_BATCH: u32 = 64;

/// The longest network header a frame gets: Ethernet, one VLAN tag,
/// IPv6, UDP.
const MAX_NET_HEADER_LEN: usize = 14 + 4 + 40 + 8;

/// Where a QP's packets go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Path {
    pub local_mac: [u8; 6],
    pub peer_mac: [u8; 6],
    pub local_ip: IpAddr,
    pub peer_ip: IpAddr,
    pub vlan: Option<u16>,
}

impl Path {
    /// Network headers for a QP pair, as rxe builds them: DF, TTL/hop limit
    /// 64, UDP checksum 0, source port from the QPNs.
    pub fn template(&self, lqpn: u32, rqpn: u32) -> Result<RoceRepr> {
        let ip = match (self.local_ip, self.peer_ip) {
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

// The GID conversions live with the wire formats; the drop-in library
// still reaches them here.
pub use crate::wire::{gid_of, gid_to_ip};

/// A completion queue: a bounded ring. Overflow is counted and reported,
/// never silent.
pub struct CqRing {
    ring: VecDeque<Wc>,
    depth: usize,
    pub overflows: u64,
    /// With a ring shared with polling threads, completions go there.
    shared: Option<Arc<CqShared>>,
}

impl CqRing {
    pub fn new(depth: usize) -> CqRing {
        CqRing {
            ring: VecDeque::with_capacity(depth),
            depth,
            overflows: 0,
            shared: None,
        }
    }
    fn push(&mut self, wc: Wc) {
        if let Some(s) = &self.shared {
            if !s.push(wc) {
                self.overflows += 1;
            }
        } else if self.ring.len() >= self.depth {
            self.overflows += 1;
        } else {
            self.ring.push_back(wc);
        }
    }
    /// Batched poll: moves up to `out.len()` completions into `out`.
    pub fn poll(&mut self, out: &mut [Wc]) -> usize {
        if let Some(s) = &self.shared {
            return s.poll(out);
        }
        let n = out.len().min(self.ring.len());
        for o in out.iter_mut().take(n) {
            *o = self.ring.pop_front().expect("counted");
        }
        n
    }
    pub fn len(&self) -> usize {
        match &self.shared {
            Some(s) => s.len(),
            None => self.ring.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

struct QpSlot {
    qp: QpEngine,
    /// Send completions go here, receive completions to `recv_cq`.
    cq: u32,
    recv_cq: u32,
    net: Option<RoceRepr>,
    path: Option<Path>,
    /// Work rings shared with posting threads, and how many WRs came from
    /// them into the engine.
    rings: Option<Arc<QpRings>>,
    moved_send: u64,
    moved_recv: u64,
    /// The state the last control call or drain saw (an engine-made
    /// change into the error state raises `AsyncEvent::QpFatal`).
    state_seen: QpState,
    /// Receive WRs come from this shared queue instead (one taken when a
    /// message needs it).
    srq: Option<Arc<SrqShared>>,
    /// Its part in the XDP responder.
    lend: xdp_responder::Lend,
    /// The engine answered a remote access on it (a WRITE without
    /// immediate, a READ or an atomic from the peer): see
    /// `frames_can_wait_for_polls`.
    remote_access_seen: bool,
}

impl QpSlot {
    /// The CQ a completion goes to: receives to the receive CQ.
    fn cq_for(&self, wc: &Wc) -> u32 {
        match wc.opcode {
            WcOpcode::Recv | WcOpcode::RecvRdmaWithImm => self.recv_cq,
            _ => self.cq,
        }
    }
}

/// Counters of the userspace receive path, one per drop reason.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct DpStats {
    pub rx_frames: u64,
    pub tx_frames: u64,
    pub rx_truncated: u64,
    /// Not IPv4/IPv6 (after at most one VLAN tag).
    pub rx_not_ip: u64,
    /// IP, but not UDP.
    pub rx_not_udp: u64,
    /// UDP, but not to port 4791.
    pub rx_not_roce: u64,
    /// A non-first IP fragment.
    pub rx_fragment: u64,
    /// IP header length or version wrong.
    pub rx_bad_ip_header: u64,
    /// IP or UDP length disagrees with the frame.
    pub rx_bad_length: u64,
    pub rx_bad_tver: u64,
    pub rx_unknown_opcode: u64,
    pub rx_bad_pad: u64,
    pub rx_bad_icrc: u64,
    pub rx_bad_ip_checksum: u64,
    pub rx_unknown_qpn: u64,
    pub rx_wrong_source: u64,
    pub tx_ring_full: u64,
    /// UD sends whose address handle was destroyed before they left.
    pub tx_no_ah: u64,
    /// Frames whose network headers or ICRC could not be written (never
    /// expected: the buffer is sized for them).
    pub tx_emit_errors: u64,
    pub cq_overflows: u64,
}

impl DpStats {
    fn count(&mut self, e: WireError) {
        match e {
            WireError::Truncated => self.rx_truncated += 1,
            WireError::NotIp => self.rx_not_ip += 1,
            WireError::NotUdp => self.rx_not_udp += 1,
            WireError::NotRoce => self.rx_not_roce += 1,
            WireError::Fragment => self.rx_fragment += 1,
            WireError::BadIpHeader => self.rx_bad_ip_header += 1,
            WireError::BadLength => self.rx_bad_length += 1,
            WireError::BadTver => self.rx_bad_tver += 1,
            WireError::UnknownOpcode => self.rx_unknown_opcode += 1,
            WireError::BadPadCount => self.rx_bad_pad += 1,
            WireError::BadIcrc => self.rx_bad_icrc += 1,
            WireError::BadIpChecksum => self.rx_bad_ip_checksum += 1,
        }
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

/// The network headers that answer a received frame: its addresses and
/// its UDP source port (the flow's) reversed, to RoCEv2's port.
fn reply_headers(r: &RoceRepr) -> Option<RoceRepr> {
    let (local_ip, peer_ip) = match r.ip {
        IpRepr::V4(ip) => (IpAddr::from(ip.dst), IpAddr::from(ip.src)),
        IpRepr::V6(ip) => (IpAddr::from(ip.dst), IpAddr::from(ip.src)),
    };
    let path = Path {
        local_mac: r.eth.dst,
        peer_mac: r.eth.src,
        local_ip,
        peer_ip,
        vlan: r.eth.vlan_tci,
    };
    let mut net = path.template(0, 0).ok()?;
    net.udp.src_port = r.udp.src_port;
    Some(net)
}

/// Emits a CNP's network headers: the CNP DSCP, Not-ECT; the template's
/// own traffic class is restored after.
fn emit_cnp(net: &mut RoceRepr, dscp: u8, buf: &mut [u8], tl: usize) -> Result<usize, WireError> {
    let saved = net.ip.traffic_class();
    net.ip.set_traffic_class(dscp << 2);
    let r = net.emit_net_and_icrc(buf, tl);
    net.ip.set_traffic_class(saved);
    r
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

    pub fn alloc_pd(&mut self) -> u32 {
        let pd = self.next_pd;
        self.next_pd += 1;
        pd
    }

    /// Registers `len` bytes of fresh shared memory (a memfd mapping, which
    /// another process may map too). The VA peers use is the mapping address.
    pub fn reg_mr(&mut self, pd: u32, len: usize, access: Access) -> Result<(u64, u32, u32)> {
        if len == 0 || len > self.limits.max_mr_len {
            return Err(DeviceError::MrLength {
                len,
                max: self.limits.max_mr_len,
            });
        }
        let shm =
            SharedMem::new("rdma-mr", len).map_err(|e| DeviceError::Memory(format!("{e:#}")))?;
        let addr = shm.as_ptr() as u64;
        // SAFETY: the mapping is `len` bytes and lives in `mr_backing`
        // until `dereg_mr` removes the registration first.
        let backing = unsafe { Backing::raw(shm.as_ptr(), len) };
        let (lkey, rkey) = self.mem.register(pd, backing, addr, access)?;
        self.mr_backing.insert(lkey, shm);
        Ok((addr, lkey, rkey))
    }

    /// Registers memory the caller owns (`ibv_reg_mr` on application
    /// memory): the engine reads and writes it in place. Peers address it
    /// by `iova`.
    ///
    /// # Safety
    /// `ptr..ptr+len` stays mapped and writable until `dereg_mr`.
    pub unsafe fn reg_mr_raw(
        &mut self,
        pd: u32,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<(u32, u32)> {
        if len == 0 || len > self.limits.max_mr_len {
            return Err(DeviceError::MrLength {
                len,
                max: self.limits.max_mr_len,
            });
        }
        // SAFETY: the caller promises the range stays mapped and writable
        // until `dereg_mr`.
        let backing = unsafe { Backing::raw(ptr, len) };
        Ok(self.mem.register(pd, backing, iova, access)?)
    }

    /// Registers another data path's MR here, same memory and keys (the
    /// daemon's data paths all see every MR).
    ///
    /// # Safety
    ///
    /// `ptr` must stay valid for `len` bytes until this registration is
    /// removed with [`Core::dereg_mr`]. Two data paths may then copy into
    /// the same bytes at once, as two QPs of a NIC may: what lands there
    /// is the applications' race, as on hardware.
    pub unsafe fn mirror_mr(
        &mut self,
        pd: u32,
        ptr: *mut u8,
        len: usize,
        access: Access,
        lkey: u32,
        rkey: u32,
    ) -> Result<()> {
        // SAFETY: the caller promises `len` valid bytes until `dereg_mr`.
        let backing = unsafe { Backing::raw(ptr, len) };
        Ok(self
            .mem
            .register_at(pd, backing, ptr as u64, access, (lkey, rkey))?)
    }

    /// Removes a CQ no QP uses.
    pub fn destroy_cq(&mut self, cq: u32) -> Result<()> {
        if self.qps.values().any(|s| s.cq == cq || s.recv_cq == cq) {
            return Err(DeviceError::CqBusy(cq));
        }
        self.cqs
            .remove(&cq)
            .map(|_| ())
            .ok_or(DeviceError::NoCq(cq))
    }

    pub fn dereg_mr(&mut self, lkey: u32) -> Result<()> {
        if self.mem.by_lkey(lkey).is_none() {
            return Err(DeviceError::NoMr(lkey));
        }
        self.release_pool_mr(lkey);
        self.mem.deregister(lkey).ok_or(DeviceError::NoMr(lkey))?;
        self.mr_backing.remove(&lkey);
        Ok(())
    }

    pub fn create_cq(&mut self, depth: usize) -> Result<u32> {
        if self.cqs.len() >= self.limits.max_cq {
            return Err(DeviceError::CqLimit(self.limits.max_cq));
        }
        let id = self.next_cq;
        self.next_cq += 1;
        self.cqs.insert(id, CqRing::new(depth.max(1)));
        Ok(id)
    }

    pub fn cq_mut(&mut self, cq: u32) -> Option<&mut CqRing> {
        self.cqs.get_mut(&cq)
    }

    pub fn create_qp(&mut self, pd: u32, cq: u32, cap: QpCap) -> Result<u32> {
        self.create_qp_cqs(pd, cq, cq, cap)
    }

    /// An RC QP with its own send and receive CQs (they may be the same).
    pub fn create_qp_cqs(&mut self, pd: u32, cq: u32, recv_cq: u32, cap: QpCap) -> Result<u32> {
        self.create_qp_typed(pd, cq, recv_cq, cap, QpType::Rc, 1024)
    }

    /// A QP of `qp_type`; a UD QP's datagrams are at most `port_mtu` bytes.
    pub fn create_qp_typed(
        &mut self,
        pd: u32,
        cq: u32,
        recv_cq: u32,
        cap: QpCap,
        qp_type: QpType,
        port_mtu: u32,
    ) -> Result<u32> {
        if self.qps.len() >= self.limits.max_qp {
            return Err(DeviceError::QpLimit(self.limits.max_qp));
        }
        for c in [cq, recv_cq] {
            if !self.cqs.contains_key(&c) {
                return Err(DeviceError::NoCq(c));
            }
        }
        let mut qpn = self.next_qpn;
        let (index, count) = self.qpn_class;
        while qpn < 0x11
            || self.qps.contains_key(&qpn)
            || super::shard::owner_of(qpn, count) != index
        {
            qpn = (qpn + 1) & 0xff_ffff;
        }
        self.next_qpn = (qpn + 1) & 0xff_ffff;
        if self.next_qpn < 0x11 {
            self.next_qpn = 0x11;
        }
        self.qps.insert(
            qpn,
            QpSlot {
                qp: {
                    let mut q = QpEngine::with_type(qpn, pd, cap, qp_type, port_mtu);
                    q.set_cc(self.cc.params);
                    q
                },
                cq,
                recv_cq,
                net: None,
                path: None,
                rings: None,
                moved_send: 0,
                moved_recv: 0,
                state_seen: QpState::Reset,
                srq: None,
                lend: Default::default(),
                remote_access_seen: false,
            },
        );
        self.qp_order.push(qpn);
        Ok(qpn)
    }

    pub fn destroy_qp(&mut self, qpn: u32) -> Result<()> {
        let mut slot = self.qps.remove(&qpn).ok_or(DeviceError::NoQp(qpn))?;
        self.free_resp_slot(&mut slot);
        self.qp_order.retain(|&q| q != qpn);
        // Outstanding WRs complete with flush errors before the QP goes.
        let _ = slot.qp.modify(&QpAttr {
            qp_state: Some(QpState::Err),
            ..Default::default()
        });
        while let Some(wc) = slot.qp.poll_completion() {
            if let Some(cq) = self.cqs.get_mut(&slot.cq_for(&wc)) {
                cq.push(wc);
            }
        }
        Ok(())
    }

    /// ECN and DCQCN for the QPs and AHs made from now on, with the line
    /// rate DCQCN recovers to taken from `iface`'s link speed (when it has
    /// one).
    pub fn set_cc(&mut self, cc: CcConfig, iface: &str) {
        self.cc = cc;
        if let Some(s) = crate::io::hostnet::iface_speed(iface) {
            self.cc.params.line_rate = s;
        }
    }

    /// The network headers of a QP pair's packets on `path`, ECT(0) in
    /// their ECN field when ECN is on.
    fn template(&self, path: &Path, lqpn: u32, rqpn: u32) -> Result<RoceRepr> {
        let mut net = path.template(lqpn, rqpn)?;
        let tc = net.ip.traffic_class() & !3;
        net.ip
            .set_traffic_class(tc | if self.cc.ecn { 0b10 } else { 0 });
        Ok(net)
    }

    /// An address handle for UD sends to the peer of `path`. (Its PD is
    /// the verbs layer's to keep: the engine, as rxe, does not check a UD
    /// WR's AH against the QP's PD.)
    pub fn create_ah(&mut self, path: Path) -> Result<u32> {
        if self.ahs.len() >= self.limits.max_ah {
            return Err(DeviceError::AhLimit(self.limits.max_ah));
        }
        // The QPNs of the template do not matter: a UD packet's UDP source
        // port is its sending QP's, set per packet.
        let net = self.template(&path, 0, 0)?;
        let mut ah = self.next_ah;
        while ah == 0 || self.ahs.contains_key(&ah) {
            ah = ah.wrapping_add(1);
        }
        self.next_ah = ah.wrapping_add(1);
        self.ahs.insert(ah, net);
        Ok(ah)
    }

    pub fn destroy_ah(&mut self, ah: u32) -> Result<()> {
        self.ahs
            .remove(&ah)
            .map(|_| ())
            .ok_or(DeviceError::NoAh(ah))
    }

    pub fn qp(&self, qpn: u32) -> Option<&QpEngine> {
        self.qps.get(&qpn).map(|s| &s.qp)
    }

    pub fn qpns(&self) -> Vec<u32> {
        self.qp_order.clone()
    }

    pub fn qp_path(&self, qpn: u32) -> Option<Path> {
        self.qps.get(&qpn).and_then(|s| s.path)
    }

    pub fn modify_qp(&mut self, qpn: u32, attr: &QpAttr) -> Result<()> {
        // XDP must not serve the QP while its attributes change.
        self.take_back_qp(qpn);
        let slot = self.qps.get_mut(&qpn).ok_or(DeviceError::NoQp(qpn))?;
        let r = slot.qp.modify(attr);
        slot.state_seen = slot.qp.state();
        let connected = matches!(slot.qp.state(), QpState::Rtr | QpState::Rts);
        Self::drain_wcs(
            slot,
            &mut self.cqs,
            &mut self.stats,
            self.async_events.as_deref(),
        );
        r?;
        if connected {
            self.claim_resp_slot(qpn);
        }
        Ok(())
    }

    /// Completions of `cq` go to `shared` from now on (polled without the
    /// data path's help).
    pub fn share_cq(&mut self, cq: u32, shared: Arc<CqShared>) -> Result<()> {
        let c = self.cqs.get_mut(&cq).ok_or(DeviceError::NoCq(cq))?;
        while let Some(w) = c.ring.pop_front() {
            shared.push(w);
        }
        c.shared = Some(shared);
        Ok(())
    }

    /// Receive WRs of `qpn` come from `srq` from now on (before RTR).
    pub fn attach_srq(&mut self, qpn: u32, srq: Arc<SrqShared>) -> Result<()> {
        let slot = self.qps.get_mut(&qpn).ok_or(DeviceError::NoQp(qpn))?;
        slot.srq = Some(srq);
        Ok(())
    }

    /// Work requests of `qpn` come from `rings` from now on.
    pub fn share_qp(&mut self, qpn: u32, rings: Arc<QpRings>) -> Result<()> {
        let slot = self.qps.get_mut(&qpn).ok_or(DeviceError::NoQp(qpn))?;
        rings.publish_state(slot.qp.state());
        if let Some(d) = &self.doorbell {
            rings.set_doorbell(d.clone());
        }
        slot.moved_send = slot.qp.send_queue_len() as u64;
        slot.moved_recv = slot.qp.recv_queue_len() as u64;
        slot.rings = Some(rings);
        Ok(())
    }

    /// Work waits in a shared ring (checked once more before sleeping).
    pub fn rings_have_work(&self) -> bool {
        self.gsi.as_ref().is_some_and(|g| g.has_tx())
            || self
                .qps
                .values()
                .any(|s| s.rings.as_ref().is_some_and(|r| r.has_work()))
    }

    /// Moves posted WRs from the shared rings into the engines; true if
    /// there were any. A WR the engine still refuses (its state changed
    /// after the poster checked) completes with a local QP operation error.
    pub fn pump_rings(&mut self) -> bool {
        let mut any = false;
        for slot in self.qps.values_mut() {
            let Some(r) = slot.rings.as_deref() else {
                continue;
            };
            let before = (slot.moved_send, slot.moved_recv);
            while let Some(w) = r.pop_recv() {
                if slot.qp.post_recv(&w.as_wr()).is_err() {
                    slot.qp.push_error_wc(w.wr_id, WcOpcode::Recv);
                }
                slot.moved_recv += 1;
            }
            while let Some(w) = r.pop_send() {
                if slot.qp.post_send(&w.as_wr()).is_err() {
                    slot.qp.push_error_wc(w.wr_id, WcOpcode::Send);
                }
                slot.moved_send += 1;
            }
            if (slot.moved_send, slot.moved_recv) != before {
                Self::drain_wcs(
                    slot,
                    &mut self.cqs,
                    &mut self.stats,
                    self.async_events.as_deref(),
                );
                any = true;
            }
        }
        any
    }

    /// Posts a send WR of a program's thread that holds the data path
    /// straight into QP `qpn`'s engine ([`QpRings::post_send_direct`]), as
    /// a push to `rings` followed by [`Core::pump_rings`] would. `None`:
    /// `rings` are not the QP's, or WRs wait in them: push instead, so
    /// that the WR keeps its place.
    pub fn post_send_direct(
        &mut self,
        qpn: u32,
        rings: &Arc<QpRings>,
        wr: &SendWr,
    ) -> Option<std::result::Result<(), PostError>> {
        self.post_direct(qpn, rings, |r, qp, moved_send, _| {
            (!r.send_waiting()).then(|| {
                r.post_send_direct(wr, |w| {
                    if qp.post_send(w).is_err() {
                        qp.push_error_wc(w.wr_id, WcOpcode::Send);
                    }
                    *moved_send += 1;
                })
            })
        })
    }

    /// As [`Core::post_send_direct`], for a receive WR.
    pub fn post_recv_direct(
        &mut self,
        qpn: u32,
        rings: &Arc<QpRings>,
        wr: &RecvWr,
    ) -> Option<std::result::Result<(), PostError>> {
        self.post_direct(qpn, rings, |r, qp, _, moved_recv| {
            (!r.recv_waiting()).then(|| {
                r.post_recv_direct(wr, |w| {
                    if qp.post_recv(w).is_err() {
                        qp.push_error_wc(w.wr_id, WcOpcode::Recv);
                    }
                    *moved_recv += 1;
                })
            })
        })
    }

    /// The QP's slot for a direct post, if `rings` are its own; `post`
    /// gets the rings, the engine and the moved counts (send, receive),
    /// and the completions are drained as [`Core::pump_rings`] drains
    /// them after moving WRs.
    fn post_direct(
        &mut self,
        qpn: u32,
        rings: &Arc<QpRings>,
        post: impl FnOnce(
            &QpRings,
            &mut QpEngine,
            &mut u64,
            &mut u64,
        ) -> Option<std::result::Result<(), PostError>>,
    ) -> Option<std::result::Result<(), PostError>> {
        let slot = self.qps.get_mut(&qpn)?;
        let QpSlot {
            rings: mine,
            qp,
            moved_send,
            moved_recv,
            ..
        } = &mut *slot;
        let r = mine.as_ref().filter(|m| Arc::ptr_eq(m, rings))?;
        let res = post(r, qp, moved_send, moved_recv)?;
        if res.is_ok() {
            Self::drain_wcs(
                slot,
                &mut self.cqs,
                &mut self.stats,
                self.async_events.as_deref(),
            );
        }
        Some(res)
    }

    /// Sets the network path of a QP (before RTR).
    pub fn set_path(&mut self, qpn: u32, path: Path) -> Result<()> {
        let rqpn = self.qp(qpn).ok_or(DeviceError::NoQp(qpn))?.dest_qpn();
        let net = self.template(&path, qpn, rqpn)?;
        let slot = self.qps.get_mut(&qpn).ok_or(DeviceError::NoQp(qpn))?;
        slot.net = Some(net);
        slot.path = Some(path);
        if matches!(slot.qp.state(), QpState::Rtr | QpState::Rts) {
            self.claim_resp_slot(qpn);
        }
        Ok(())
    }

    /// RESET -> INIT -> RTR -> RTS against a remote QP.
    pub fn connect_qp(&mut self, qpn: u32, path: Path, c: &Connect) -> Result<()> {
        let slot = self.qps.get_mut(&qpn).ok_or(DeviceError::NoQp(qpn))?;
        let q = &mut slot.qp;
        if q.state() == QpState::Reset {
            q.modify(&QpAttr::init(Access::ALL))?;
        }
        q.set_selective_repeat(c.selective_repeat)?;
        q.modify(&QpAttr {
            qp_state: Some(QpState::Rtr),
            dest_gid: Some(gid_of(path.peer_ip)),
            path_mtu: Some(c.mtu),
            dest_qp_num: Some(c.remote_qpn),
            rq_psn: Some(c.remote_psn),
            max_dest_rd_atomic: Some(c.max_rd_atomic),
            min_rnr_timer: Some(12),
            ..Default::default()
        })?;
        q.modify(&QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(c.local_psn),
            timeout: Some(c.timeout),
            retry_cnt: Some(c.retry_cnt),
            rnr_retry: Some(7),
            max_rd_atomic: Some(c.max_rd_atomic),
            ..Default::default()
        })?;
        // RTR named the peer QP: the headers follow from it (and, the QP
        // being in RTS, its slot for the XDP responder).
        self.set_path(qpn, path)
    }

    pub fn post_send(&mut self, qpn: u32, wr: &SendWr) -> Result<()> {
        let slot = self.qps.get_mut(&qpn).ok_or(DeviceError::NoQp(qpn))?;
        slot.qp.post_send(wr)?;
        Ok(())
    }

    pub fn post_recv(&mut self, qpn: u32, wr: &RecvWr) -> Result<()> {
        let slot = self.qps.get_mut(&qpn).ok_or(DeviceError::NoQp(qpn))?;
        slot.qp.post_recv(wr)?;
        Ok(())
    }

    /// One received frame: parse, check it is for a QP we have and from its
    /// peer, hand it to the engine.
    pub fn handle_frame(&mut self, now: Nanos, frame: &[u8]) {
        self.stats.rx_frames += 1;
        // Used in place: moving the repr out of its Result copies it.
        let parsed = RoceRepr::parse(frame);
        let (repr, layout) = match &parsed {
            Ok(x) => x,
            Err(e) => return self.stats.count(*e),
        };
        let qpn = repr.transport.bth.dest_qpn;
        if qpn == 1 {
            // QP1: a MAD for the CM (checked and queued, not run here).
            match &self.gsi {
                Some(g) => g.deliver(repr, &frame[layout.payload.clone()], reply_headers(repr)),
                None => self.stats.rx_unknown_qpn += 1,
            }
            return;
        }
        let Some(slot) = self.qps.get_mut(&qpn) else {
            self.stats.rx_unknown_qpn += 1;
            return;
        };
        if let Some(p) = &slot.path {
            if repr.ip.src_gid() != gid_of(p.peer_ip) {
                self.stats.rx_wrong_source += 1;
                return;
            }
        }
        if let Some(srq) = &slot.srq {
            // A message that consumes a receive WR, for a QP that has none
            // queued (so at most one sits in a QP, and no QP holds WRs
            // another needs): take the SRQ's next. Empty, the engine sends
            // an RNR NAK as for an empty receive queue.
            let f = repr.transport.flags();
            let consumes = f.has(OpFlags::SEND) || (f.has(OpFlags::WRITE) && f.has(OpFlags::IMM));
            let receiving = matches!(slot.qp.state(), QpState::Rtr | QpState::Rts | QpState::Sqd);
            if consumes && receiving && slot.qp.recv_queue_len() == 0 {
                if let Some(w) = srq.take(self.async_events.as_deref()) {
                    if slot.qp.post_recv(&w.as_wr()).is_err() {
                        slot.qp.push_error_wc(w.wr_id, WcOpcode::Recv);
                    }
                }
            }
        }
        let payload = &frame[layout.payload.clone()];
        if repr.ip.traffic_class() & 3 == 3 {
            // CE (ECN 11): the notification point decides on a CNP.
            let decided = slot.qp.handle_ce(now, &repr.transport);
            if decided && slot.qp.qp_type() == QpType::Ud {
                // A UD QP has no path of its own: its CNP answers the
                // marked datagram, over the frame's addresses reversed.
                slot.net = reply_headers(repr);
            }
        }
        if slot.qp.qp_type() == QpType::Ud {
            let grh = grh_of(&frame[layout.l3..]);
            slot.qp
                .handle_datagram(now, &repr.transport, &grh, payload, &mut self.mem);
        } else {
            let f = repr.transport.flags();
            let remote_access = f.has(OpFlags::REQUEST)
                && ((f.has(OpFlags::WRITE) && !f.has(OpFlags::IMM))
                    || f.any(OpFlags::READ_REQUEST | OpFlags::ATOMIC));
            if remote_access {
                slot.remote_access_seen = true;
            }
            if f.any(OpFlags::REQUEST | OpFlags::RESERVED) {
                slot.lend
                    .request_at_engine(now, remote_access, slot.lend.lent);
                if slot.lend.lent {
                    // A request XDP left to us (or one already on its way
                    // when the QP was lent): the engine first takes the
                    // responder's state back.
                    if let Some(r) = &self.xdp_responder {
                        xdp_responder::take_back(r, slot);
                    }
                    self.lend_pending = true;
                }
            }
            slot.qp
                .handle_packet(now, &repr.transport, payload, &mut self.mem);
            Self::settle(self.xdp_responder.as_ref(), slot);
        }
        Self::drain_wcs(
            slot,
            &mut self.cqs,
            &mut self.stats,
            self.async_events.as_deref(),
        );
    }

    fn drain_wcs(
        slot: &mut QpSlot,
        cqs: &mut crate::memory::KeyMap<CqRing>,
        stats: &mut DpStats,
        events: Option<&AsyncShared>,
    ) {
        let state = slot.qp.state();
        if state != slot.state_seen {
            // modify_qp updates state_seen itself: a change seen here is
            // the engine's own, and one into the error state is fatal.
            if state == QpState::Err {
                if let Some(e) = events {
                    e.push(AsyncEvent::QpFatal(slot.qp.qpn()));
                }
            }
            slot.state_seen = state;
        }
        if let Some(r) = &slot.rings {
            // Before the completions: a poller that sees one sees its WR
            // retired too (queue depth), and the state it left the QP in.
            r.publish_retired(
                slot.moved_send - slot.qp.send_queue_len() as u64,
                // With an SRQ, the queued receive WR is the SRQ's.
                slot.moved_recv
                    .saturating_sub(slot.qp.recv_queue_len() as u64),
            );
            r.publish_state(slot.qp.state());
        }
        while let Some(wc) = slot.qp.poll_completion() {
            match cqs.get_mut(&slot.cq_for(&wc)) {
                Some(cq) => {
                    let before = cq.overflows;
                    cq.push(wc);
                    stats.cq_overflows += cq.overflows - before;
                }
                None => stats.cq_overflows += 1,
            }
        }
    }

    /// Fires due timers; returns the earliest pending deadline.
    pub fn handle_timers(&mut self, now: Nanos) -> Option<Nanos> {
        let mut next: Option<Nanos> = None;
        for slot in self.qps.values_mut() {
            if let Some(t) = slot.qp.poll_timeout() {
                if t <= now {
                    slot.qp.handle_timeout(now);
                    Self::settle(self.xdp_responder.as_ref(), slot);
                    Self::drain_wcs(
                        slot,
                        &mut self.cqs,
                        &mut self.stats,
                        self.async_events.as_deref(),
                    );
                }
            }
            if let Some(t) = slot.qp.poll_timeout() {
                next = Some(next.map_or(t, |n: Nanos| n.min(t)));
            }
        }
        next
    }

    /// Drains completions that posting produced (flushes in ERR, local errors).
    pub fn collect_wcs(&mut self, qpn: u32) {
        if let Some(slot) = self.qps.get_mut(&qpn) {
            Self::drain_wcs(
                slot,
                &mut self.cqs,
                &mut self.stats,
                self.async_events.as_deref(),
            );
        }
    }

    /// Whether the last [`Core::build_frame`] found a QP with packets
    /// that only DCQCN's pacing holds back.
    pub fn tx_paced(&self) -> bool {
        self.tx_paced
    }

    /// The next frame of any QP, round robin, into `buf`: its length, 0 for
    /// nothing, or `xsk::NEEDS_LARGER` when only QPs whose frames do not
    /// fit `buf` may have something.
    pub fn build_frame(&mut self, now: Nanos, buf: &mut [u8]) -> usize {
        if let Some(g) = self.gsi.as_deref().filter(|g| g.has_tx()) {
            // The CM's MADs first: few, and a connection waits on each.
            match g.build_frame(buf) {
                Ok(0) => {}
                Ok(n) => return n,
                Err(_) => self.stats.tx_emit_errors += 1,
            }
        }
        let n = self.qp_order.len();
        let mut too_small = false;
        self.tx_paced = false;
        for i in 0..n {
            let idx = (self.rr + i) % n;
            let qpn = self.qp_order[idx];
            let Some(slot) = self.qps.get_mut(&qpn) else {
                continue;
            };
            // Where the segment goes decides where it starts: after the
            // QP's headers (RC) or its next datagram's address handle's
            // (UD; one destroyed meanwhile: the longest, then dropped).
            let hl = match (slot.qp.qp_type(), &slot.net) {
                (QpType::Rc, Some(net)) => net.net_header_len(),
                (QpType::Rc, None) => continue,
                // A UD QP's CNP goes back the way its marked datagram came.
                (QpType::Ud, Some(net)) if slot.qp.cnp_due() => net.net_header_len(),
                (QpType::Ud, _) => match slot.qp.next_ah() {
                    Some(ah) => self
                        .ahs
                        .get(&ah)
                        .map_or(MAX_NET_HEADER_LEN, |n| n.net_header_len()),
                    None => continue,
                },
            };
            if buf.len() < hl + slot.qp.max_segment_len() + ICRC_LEN {
                too_small = true;
                continue;
            }
            if let Some(tx) = slot.qp.poll_transmit(now, &self.mem, &mut buf[hl..]) {
                let net = match tx.ah {
                    None => slot.net.as_mut(),
                    Some(ah) => {
                        let n = self.ahs.get_mut(&ah);
                        if let Some(n) = n {
                            // A UD packet's UDP port is its sending QP's.
                            n.udp.src_port = udp_sport_for_ud(qpn);
                            Some(n)
                        } else {
                            None
                        }
                    }
                };
                let Some(net) = net else {
                    self.stats.tx_no_ah += 1;
                    Self::drain_wcs(
                        slot,
                        &mut self.cqs,
                        &mut self.stats,
                        self.async_events.as_deref(),
                    );
                    continue;
                };
                if let IpRepr::V4(ip) = &mut net.ip {
                    ip.id = ip.id.wrapping_add(1);
                }
                // The buffer was checked to hold the headers, the largest
                // segment and the ICRC, so emit cannot fail; if it ever did,
                // the segment is lost (and retransmitted) and counted.
                let emitted = if tx.cnp {
                    emit_cnp(net, self.cc.cnp_dscp, buf, tx.len + ICRC_LEN)
                } else {
                    net.emit_net_and_icrc(buf, tx.len + ICRC_LEN)
                };
                let len = match emitted {
                    Ok(n) => n,
                    Err(_) => {
                        self.stats.tx_emit_errors += 1;
                        0
                    }
                };
                Self::drain_wcs(
                    slot,
                    &mut self.cqs,
                    &mut self.stats,
                    self.async_events.as_deref(),
                );
                self.rr = (idx + 1) % n;
                return len;
            }
            self.tx_paced |= slot.qp.pacing_blocked(now);
            Self::drain_wcs(
                slot,
                &mut self.cqs,
                &mut self.stats,
                self.async_events.as_deref(),
            );
        }
        if too_small {
            crate::io::xsk::NEEDS_LARGER
        } else {
            0
        }
    }
}

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
        let mut hold = super::rings::INLINE_HOLD_NS;
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
            hold = (hold * 2).min(super::rings::INLINE_HOLD_MAX_NS);
            (ns, held) = until(now, hold);
            doorbell.going_to_sleep(now.saturating_add(ns));
        }
        doorbell.woke();
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

    /// The counters, as `rdma-xdp stats` shows them: the receive path's,
    /// each AF_XDP socket's (the kernel's drops included) and each QP's.
    pub fn stats_json(&self) -> serde_json::Value {
        let xsk: Vec<serde_json::Value> = self
            .xsks
            .iter()
            .map(|x| {
                let k = x.kernel_stats();
                serde_json::json!({"rx_frames": x.rx_frames, "tx_frames": x.tx_frames,
                    "rx_oversize": x.rx_dropped_oversize, "kernel_rx_dropped": k.rx_dropped,
                    "kernel_rx_ring_full": k.rx_ring_full,
                    "kernel_rx_fill_ring_empty": k.rx_fill_ring_empty_descs,
                    "kernel_tx_invalid": k.tx_invalid_descs,
                    "tx_stalled": x.tx_stalled(),
                    "rings": x.debug_state(), "bind": x.mode.name(),
                    "multi_buffer": x.multi_buffer})
            })
            .collect();
        let mut qps: Vec<(u32, QpStats)> = self
            .core
            .qps
            .iter()
            .map(|(n, s)| (*n, s.qp.stats()))
            .collect();
        qps.sort_by_key(|q| q.0);
        let qps: Vec<serde_json::Value> = qps
            .into_iter()
            .map(|(n, s)| {
                serde_json::json!({"qpn": n, "stats": s,
                    "xdp_responder": self.core.xdp_responder_stats(n)})
            })
            .collect();
        // DCQCN's counters over all QPs, under mlx5's names.
        let mut dp = serde_json::to_value(self.core.stats).unwrap_or_default();
        if let (Some(m), Some(g)) = (dp.as_object_mut(), &self.core.gsi) {
            m.insert(
                "gsi".into(),
                serde_json::to_value(&g.stats).unwrap_or_default(),
            );
        }
        let sum = |f: fn(&QpStats) -> u64| -> u64 {
            self.core.qps.values().map(|s| f(&s.qp.stats())).sum()
        };
        if let Some(m) = dp.as_object_mut() {
            m.insert(
                "np_ecn_marked_roce_packets".into(),
                sum(|s| s.np_ecn_marked_roce_packets).into(),
            );
            m.insert("np_cnp_sent".into(), sum(|s| s.np_cnp_sent).into());
            m.insert("rp_cnp_handled".into(), sum(|s| s.rp_cnp_handled).into());
            m.insert("rp_cnp_ignored".into(), sum(|s| s.rp_cnp_ignored).into());
        }
        if let (Some(m), Some(sh)) = (dp.as_object_mut(), &self.shard) {
            m.insert("rx_wrong_queue".into(), sh.rx_wrong_queue.into());
            m.insert(
                "rx_wrong_queue_dropped".into(),
                sh.rx_wrong_queue_dropped.into(),
            );
        }
        serde_json::json!({"datapath": dp, "xsk": xsk, "qps": qps})
    }

    /// One turn of the loop: receive, timers, transmit. Returns whether any
    /// packet moved (for adaptive polling) and the next timer deadline.
    pub fn poll(&mut self) -> (bool, Option<Nanos>) {
        let now = self.now();
        self.turn_at = now;
        let mut work = self.core.pump_rings();
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
                if !x.send_with(|buf| core.build_frame(now, buf)) {
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
            // and the peer's XDP program on this CPU. When this turn received
            // packets and answered them (ACKs), the application is likely to
            // post its next request right away: wait one turn so that both
            // leave in one syscall instead of two. The next turn always kicks.
            let rx_work = work;
            if sent > 0 && rx_work && !self.kick_deferred {
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
        self.kick_deferred
    }

    /// Does the kick a turn deferred now.
    pub fn flush_kick(&mut self) {
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
