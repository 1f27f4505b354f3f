//! The queue pair itself: attributes, the state machine of `ibv_modify_qp`,
//! queue sizes and counters, and the two entry points that hand packets and
//! transmit opportunities to the roles. It must not hold role logic: what a
//! packet does belongs to the requester, responder or completer.

use super::*;
use std::fmt;

pub const MAX_RD_ATOMIC: u8 = 16;

/// The transport service of a QP (`ibv_qp_type`, the two offered here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum QpType {
    /// Reliable Connected.
    #[default]
    Rc,
    /// Unreliable Datagram: one packet per message, to any QP whose Q_Key
    /// is known, never retransmitted.
    Ud,
}

impl fmt::Display for QpType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QpType::Rc => "RC",
            QpType::Ud => "UD",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    Reset,
    Init,
    Rtr,
    Rts,
    Sqd,
    Sqe,
    Err,
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        })
    }
}

/// Which attributes an `ibv_modify_qp` call sets: rdma-core's
/// `enum ibv_qp_attr_mask`, bit for bit (only the bits RC and UD use).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AttrMask(u32);

impl AttrMask {
    pub const NONE: AttrMask = AttrMask(0);
    pub const STATE: AttrMask = AttrMask(1 << 0);
    pub const ACCESS_FLAGS: AttrMask = AttrMask(1 << 3);
    pub const PKEY_INDEX: AttrMask = AttrMask(1 << 4);
    pub const PORT: AttrMask = AttrMask(1 << 5);
    pub const QKEY: AttrMask = AttrMask(1 << 6);
    pub const AV: AttrMask = AttrMask(1 << 7);
    pub const PATH_MTU: AttrMask = AttrMask(1 << 8);
    pub const TIMEOUT: AttrMask = AttrMask(1 << 9);
    pub const RETRY_CNT: AttrMask = AttrMask(1 << 10);
    pub const RNR_RETRY: AttrMask = AttrMask(1 << 11);
    pub const RQ_PSN: AttrMask = AttrMask(1 << 12);
    pub const MAX_QP_RD_ATOMIC: AttrMask = AttrMask(1 << 13);
    pub const MIN_RNR_TIMER: AttrMask = AttrMask(1 << 15);
    pub const SQ_PSN: AttrMask = AttrMask(1 << 16);
    pub const MAX_DEST_RD_ATOMIC: AttrMask = AttrMask(1 << 17);
    pub const DEST_QPN: AttrMask = AttrMask(1 << 20);

    /// Every attribute with the name errors use, in the order errors report
    /// them (the first missing or unexpected one is named).
    const NAMES: [(AttrMask, &'static str); 15] = [
        (AttrMask::PKEY_INDEX, "pkey_index"),
        (AttrMask::PORT, "port_num"),
        (AttrMask::QKEY, "qkey"),
        (AttrMask::ACCESS_FLAGS, "qp_access_flags"),
        (AttrMask::AV, "av"),
        (AttrMask::PATH_MTU, "path_mtu"),
        (AttrMask::DEST_QPN, "dest_qp_num"),
        (AttrMask::RQ_PSN, "rq_psn"),
        (AttrMask::MAX_DEST_RD_ATOMIC, "max_dest_rd_atomic"),
        (AttrMask::MIN_RNR_TIMER, "min_rnr_timer"),
        (AttrMask::SQ_PSN, "sq_psn"),
        (AttrMask::TIMEOUT, "timeout"),
        (AttrMask::RETRY_CNT, "retry_cnt"),
        (AttrMask::RNR_RETRY, "rnr_retry"),
        (AttrMask::MAX_QP_RD_ATOMIC, "max_rd_atomic"),
    ];

    pub const fn bits(self) -> u32 {
        self.0
    }
    pub const fn from_bits(b: u32) -> AttrMask {
        AttrMask(b)
    }
    pub const fn union(self, o: AttrMask) -> AttrMask {
        AttrMask(self.0 | o.0)
    }
    /// The attributes of `self` that are not in `o`.
    pub const fn minus(self, o: AttrMask) -> AttrMask {
        AttrMask(self.0 & !o.0)
    }
    pub const fn contains(self, o: AttrMask) -> bool {
        self.0 & o.0 == o.0
    }
    /// The name of the first attribute set, in [`AttrMask::NAMES`] order.
    pub fn first_name(self) -> Option<&'static str> {
        Self::NAMES
            .iter()
            .find(|(m, _)| self.contains(*m))
            .map(|(_, n)| *n)
    }
}

impl std::ops::BitOr for AttrMask {
    type Output = AttrMask;
    fn bitor(self, o: AttrMask) -> AttrMask {
        self.union(o)
    }
}

/// Attributes for [`QpEngine::modify`]; `Some` means "in the attribute mask", as
/// with `ibv_modify_qp`.
#[derive(Debug, Clone, Default)]
pub struct QpAttr {
    pub qp_state: Option<QpState>,
    pub pkey_index: Option<u16>,
    pub port_num: Option<u8>,
    /// UD: the Q_Key incoming datagrams must carry (and sends use when the
    /// WR's has its high bit set).
    pub qkey: Option<u32>,
    pub qp_access_flags: Option<Access>,
    /// Destination GID of the address vector; the engine keeps it for the
    /// driver, which builds the IP/UDP headers.
    pub dest_gid: Option<[u8; 16]>,
    /// Path MTU in bytes: 256, 512, 1024, 2048 or 4096.
    pub path_mtu: Option<u32>,
    pub dest_qp_num: Option<u32>,
    pub rq_psn: Option<u32>,
    pub max_dest_rd_atomic: Option<u8>,
    pub min_rnr_timer: Option<u8>,
    pub sq_psn: Option<u32>,
    pub timeout: Option<u8>,
    pub retry_cnt: Option<u8>,
    pub rnr_retry: Option<u8>,
    pub max_rd_atomic: Option<u8>,
}

impl QpAttr {
    /// The attribute mask of the attributes that are set (`Some`).
    pub fn mask(&self) -> AttrMask {
        let set = [
            (self.qp_state.is_some(), AttrMask::STATE),
            (self.pkey_index.is_some(), AttrMask::PKEY_INDEX),
            (self.port_num.is_some(), AttrMask::PORT),
            (self.qkey.is_some(), AttrMask::QKEY),
            (self.qp_access_flags.is_some(), AttrMask::ACCESS_FLAGS),
            (self.dest_gid.is_some(), AttrMask::AV),
            (self.path_mtu.is_some(), AttrMask::PATH_MTU),
            (self.dest_qp_num.is_some(), AttrMask::DEST_QPN),
            (self.rq_psn.is_some(), AttrMask::RQ_PSN),
            (
                self.max_dest_rd_atomic.is_some(),
                AttrMask::MAX_DEST_RD_ATOMIC,
            ),
            (self.min_rnr_timer.is_some(), AttrMask::MIN_RNR_TIMER),
            (self.sq_psn.is_some(), AttrMask::SQ_PSN),
            (self.timeout.is_some(), AttrMask::TIMEOUT),
            (self.retry_cnt.is_some(), AttrMask::RETRY_CNT),
            (self.rnr_retry.is_some(), AttrMask::RNR_RETRY),
            (self.max_rd_atomic.is_some(), AttrMask::MAX_QP_RD_ATOMIC),
        ];
        set.iter()
            .filter(|(on, _)| *on)
            .fold(AttrMask::NONE, |m, (_, b)| m | *b)
    }

    /// A UD QP's way to RTS: INIT (P_Key index 0, port 1, `qkey`), RTR,
    /// RTS (`sq_psn`), as `ibv_ud_pingpong` takes it.
    pub fn ud_bring_up(qkey: u32, sq_psn: u32) -> [QpAttr; 3] {
        [
            QpAttr {
                qp_state: Some(QpState::Init),
                pkey_index: Some(0),
                port_num: Some(1),
                qkey: Some(qkey),
                ..Default::default()
            },
            QpAttr {
                qp_state: Some(QpState::Rtr),
                ..Default::default()
            },
            QpAttr {
                qp_state: Some(QpState::Rts),
                sq_psn: Some(sq_psn),
                ..Default::default()
            },
        ]
    }

    /// RESET -> INIT with P_Key index 0 on port 1, the usual first step.
    pub fn init(access: Access) -> QpAttr {
        QpAttr {
            qp_state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            qp_access_flags: Some(access),
            ..Default::default()
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModifyError {
    /// The state machine has no edge from `from` to `to`.
    InvalidTransition { from: QpState, to: QpState },
    /// A required attribute of this transition is missing.
    MissingAttr {
        from: QpState,
        to: QpState,
        attr: &'static str,
    },
    /// An attribute that this transition may not change was given.
    UnexpectedAttr {
        from: QpState,
        to: QpState,
        attr: &'static str,
    },
    /// An attribute value is out of range.
    BadValue {
        attr: &'static str,
        why: &'static str,
    },
}

impl fmt::Display for ModifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModifyError::InvalidTransition { from, to } => {
                write!(f, "invalid QP state transition {from} -> {to}")
            }
            ModifyError::MissingAttr { from, to, attr } => {
                write!(f, "{from} -> {to} requires attribute {attr}")
            }
            ModifyError::UnexpectedAttr { from, to, attr } => {
                write!(f, "{from} -> {to} does not allow attribute {attr}")
            }
            ModifyError::BadValue { attr, why } => write!(f, "bad value for {attr}: {why}"),
        }
    }
}
impl std::error::Error for ModifyError {}

/// Per-QP counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct QpStats {
    pub tx_packets: u64,
    pub rx_packets: u64,
    /// Bytes sent (transport segments, BTH to pad) and payload bytes
    /// received: the rates `top` shows.
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    /// Request packets sent again (go-back-N after a timeout or NAK).
    pub retransmits: u64,
    pub timeouts: u64,
    pub seq_naks_sent: u64,
    pub seq_naks_received: u64,
    pub rnr_naks_sent: u64,
    pub rnr_naks_received: u64,
    pub duplicates_received: u64,
    pub out_of_sequence_received: u64,
    pub acks_sent: u64,
    /// Protocol violations that made us NAK or drop (bad opcode sequence,
    /// bad lengths, access errors).
    pub errors: u64,
    /// Packets dropped without an answer (wrong state, ghost ACKs, stale
    /// responses).
    pub dropped: u64,
    /// Dropped: the BTH P_Key does not match the QP's (IBA 9.6.1.1).
    pub bad_pkey: u64,
    /// Dropped: an opcode of another transport (UC, UD, CNP) for an RC QP.
    pub wrong_transport: u64,
    /// NAKed Invalid Request: a reserved opcode of the RC range.
    pub reserved_opcodes: u64,
    /// UD: datagrams dropped for a Q_Key other than the QP's (IBA 10.2.5).
    pub bad_qkey: u64,
    /// UD: datagrams dropped because no receive WR was posted (UD never
    /// sends RNR NAKs: the datagram is lost).
    pub no_recv_wqe: u64,
    /// UD: sends longer than the path MTU, completed without a packet as
    /// IBA C10-93.1.1 and rxe do.
    pub oversize_sends: u64,
    /// DCQCN, mlx5's names: CE-marked packets received, CNPs sent, CNPs
    /// received and acted on, CNPs received and ignored (reaction point
    /// off, or within the rate-reduce monitor period).
    pub np_ecn_marked_roce_packets: u64,
    pub np_cnp_sent: u64,
    pub rp_cnp_handled: u64,
    pub rp_cnp_ignored: u64,
    /// Round-trip times, one sample per round trip (a request packet's
    /// first transmission to the ACK or response that covers it; none
    /// across a retransmission, as Karn's rule says): bucket 0 counts
    /// samples under 1 µs, bucket `i` those in [2^(i-1), 2^i) µs.
    pub rtt_log2_us: [u64; RTT_BUCKETS],
    /// Selective repeat: SACKs sent and received; SACKs dropped for naming
    /// PSNs never sent or a bad syndrome; requests dropped for lying past
    /// the window, or not kept (no stash slot, impossible length);
    /// packets of the other mode (a sequence-error NAK to a selective QP,
    /// a SACK to a go-back-N one), dropped.
    pub sacks_sent: u64,
    pub sacks_received: u64,
    pub sr_bad_sacks: u64,
    pub sr_outside_window: u64,
    pub sr_not_kept: u64,
    pub sr_wrong_mode: u64,
}

/// Buckets of [`QpStats::rtt_log2_us`]: up to 2^24 µs (16 s).
pub const RTT_BUCKETS: usize = 24;

impl QpStats {
    pub(super) fn record_rtt(&mut self, ns: Nanos) {
        let us = ns / 1000;
        let i = (u64::BITS - us.leading_zeros()) as usize;
        self.rtt_log2_us[i.min(RTT_BUCKETS - 1)] += 1;
    }

    /// The `q`-quantile (0..=1) of the round-trip times, µs: the upper
    /// bound of the bucket it falls in. None before the first sample.
    pub fn rtt_quantile_us(&self, q: f64) -> Option<u64> {
        let n: u64 = self.rtt_log2_us.iter().sum();
        if n == 0 {
            return None;
        }
        let want = ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.rtt_log2_us.iter().enumerate() {
            seen += c;
            if seen >= want {
                return Some(1 << i);
            }
        }
        Some(1 << (RTT_BUCKETS - 1))
    }
}

/// One queue pair: its attributes and state machine here, and the state of
/// each role beside it, as rxe keeps `qp->req`, `qp->resp` and `qp->comp`.
pub struct QpEngine {
    pub(super) qpn: u32,
    pub(super) pd: u32,
    pub(super) qp_type: QpType,
    /// The MTU the QP was created with (UD's message limit; an RC QP's
    /// path MTU until RTR sets one). A reset returns to it.
    pub(super) port_mtu: u32,
    pub(super) qkey: u32,
    pub(super) state: QpState,
    pub(super) cap_send: usize,
    pub(super) cap_recv: usize,
    // Attributes.
    pub(super) pkey: u16,
    pub(super) access: Access,
    pub(super) dest_gid: [u8; 16],
    pub(super) mtu: u32,
    pub(super) dest_qpn: u32,
    pub(super) timeout: u8,
    pub(super) retry_cnt: u8,
    pub(super) rnr_retry: u8,
    pub(super) min_rnr_timer: u8,
    pub(super) max_rd_atomic: u8,
    pub(super) max_dest_rd_atomic: u8,
    pub(super) req: Requester,
    pub(super) comp: Completer,
    pub(super) resp: Responder,
    // Output.
    pub(super) completions: VecDeque<Wc>,
    pub(super) stats: QpStats,
    // Congestion control (RC): notification and reaction point.
    pub(super) np: dcqcn::Np,
    pub(super) cc: dcqcn::Dcqcn,
    /// The request packet being timed for an RTT sample: its PSN and when
    /// it first left.
    pub(super) rtt_probe: Option<(u32, Nanos)>,
    /// UD: the QPN the due CNP goes to (the marked datagram's source).
    pub(super) np_ud_dest: u32,
    /// Selective repeat (off: go-back-N).
    pub(super) sr: Selective,
}

#[derive(Debug, Clone, Copy)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
}

impl Default for QpCap {
    fn default() -> Self {
        QpCap {
            max_send_wr: 256,
            max_recv_wr: 256,
        }
    }
}

// P_Key matching (IBA 10.9.3), shared with the XDP responder.
pub use rdma_common::xdp_responder::pkey_matches;

fn mtu_ok(m: u32) -> bool {
    matches!(m, 256 | 512 | 1024 | 2048 | 4096)
}

/// Which of a QP's packets [`QpEngine::poll_transmit_ordered`] takes first.
/// CNPs always go first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxOrder {
    /// Responses (ACKs, READ responses, atomic answers) before requests,
    /// so that the peer's requests are never starved.
    ResponsesFirst,
    /// A program's post: its request before the ACKs it owes, so that the
    /// peer, spinning, takes the request while this CPU still moves the
    /// ACK (copy mode on a veth runs the peer's receive in the sender's
    /// syscall).
    RequestsFirst,
    /// Requests only: the responses wait for the program's next post.
    RequestsOnly,
}

/// What [`QpEngine::poll_transmit`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Bytes of the segment (BTH through pad).
    pub len: usize,
    /// UD: the address handle it goes to (an RC QP's go to its path).
    pub ah: Option<u32>,
    /// A CNP (the driver gives it the CNP DSCP and no ECT).
    pub cnp: bool,
}

impl QpEngine {
    /// An RC QP.
    pub fn new(qpn: u32, pd: u32, cap: QpCap) -> QpEngine {
        Self::with_type(qpn, pd, cap, QpType::Rc, 1024)
    }

    /// A QP of `qp_type`; a UD QP's messages are at most `port_mtu` bytes
    /// (UD has no path MTU attribute: the port's active MTU applies).
    pub fn with_type(qpn: u32, pd: u32, cap: QpCap, qp_type: QpType, port_mtu: u32) -> QpEngine {
        let cap_send = cap.max_send_wr.max(1) as usize;
        let cap_recv = cap.max_recv_wr.max(1) as usize;
        let ud = qp_type == QpType::Ud;
        let port_mtu = if mtu_ok(port_mtu) { port_mtu } else { 1024 };
        QpEngine {
            qpn: qpn & MASK_24,
            pd,
            qp_type,
            port_mtu,
            qkey: 0,
            state: QpState::Reset,
            cap_send,
            cap_recv,
            pkey: 0xffff,
            access: Access(0),
            dest_gid: [0; 16],
            mtu: port_mtu,
            dest_qpn: 0,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            req: Requester::new(cap_send, ud),
            comp: Completer::new(),
            resp: Responder::new(cap_recv),
            completions: VecDeque::with_capacity(cap_send + cap_recv),
            stats: QpStats::default(),
            np: dcqcn::Np::default(),
            cc: dcqcn::Dcqcn::new(dcqcn::CcParams::default()),
            rtt_probe: None,
            np_ud_dest: 0,
            sr: Selective::default(),
        }
    }

    /// Packets a message of `len` bytes takes (at least one). The MTU is a
    /// power of two: a shift, not a division, per message.
    pub(super) fn packets_for(&self, len: u32) -> u32 {
        let shift = self.mtu.trailing_zeros();
        (((len as u64 + self.mtu as u64 - 1) >> shift) as u32).max(1)
    }

    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    pub fn pd(&self) -> u32 {
        self.pd
    }

    /// DCQCN's tunables for this QP (its rate state starts over).
    pub fn set_cc(&mut self, p: dcqcn::CcParams) {
        self.cc = dcqcn::Dcqcn::new(p);
    }

    /// The reaction point's state (current and target rate, α).
    pub fn cc(&self) -> &dcqcn::Dcqcn {
        &self.cc
    }

    /// The notification point: the IP header of this packet for the QP
    /// carried CE. An RC request or READ response, or a UD SEND, makes a
    /// CNP due (at most one per `np_min_time_between_cnps`). Returns
    /// whether this packet made one due (a UD QP's then goes to its
    /// sender).
    pub fn handle_ce(&mut self, now: Nanos, t: &TransportRepr) -> bool {
        let opc = t.bth.opcode;
        let data = t.flags().has(OpFlags::REQUEST)
            || (opcode::RC_RDMA_READ_RESPONSE_FIRST..=opcode::RC_RDMA_READ_RESPONSE_ONLY)
                .contains(&opc);
        let ud_send = matches!(
            opc,
            opcode::UD_SEND_ONLY | opcode::UD_SEND_ONLY_WITH_IMMEDIATE
        );
        match self.qp_type {
            QpType::Rc if opc >> 5 == 0 && data => {}
            // UD: the CNP goes to the datagram's sender, named by its DETH.
            QpType::Ud if ud_send && t.deth.is_some() => {}
            _ => return false,
        }
        self.stats.np_ecn_marked_roce_packets += 1;
        if !self.np.on_ce(now, self.cc.p.np_min_time_between_cnps) {
            return false;
        }
        if self.qp_type == QpType::Ud {
            self.np_ud_dest = t.deth.map_or(0, |d| d.src_qpn);
        }
        true
    }

    /// A CNP arrived for this QP (RC or UD): DCQCN's reaction point acts
    /// on it or counts it ignored.
    pub(super) fn handle_cnp(&mut self, now: Nanos) {
        if self.cc.on_cnp(now) {
            self.stats.rp_cnp_handled += 1;
        } else {
            self.stats.rp_cnp_ignored += 1;
        }
    }

    /// A CNP is due: the driver sends it before anything else of this QP
    /// (for a UD QP, to the source of the marked datagram).
    pub fn cnp_due(&self) -> bool {
        self.np.pending
    }

    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    pub fn qkey(&self) -> u32 {
        self.qkey
    }

    pub fn state(&self) -> QpState {
        self.state
    }

    pub fn stats(&self) -> QpStats {
        self.stats
    }

    pub fn dest_qpn(&self) -> u32 {
        self.dest_qpn
    }

    pub fn dest_gid(&self) -> [u8; 16] {
        self.dest_gid
    }

    pub fn path_mtu(&self) -> u32 {
        self.mtu
    }

    /// Next PSN the requester will assign.
    pub fn sq_psn(&self) -> u32 {
        self.req.next_psn
    }

    /// PSN the responder expects next.
    pub fn rq_psn(&self) -> u32 {
        self.resp.epsn
    }

    /// One line of requester/responder internals, for traces.
    pub fn debug_state(&self) -> String {
        let head: Vec<String> = self
            .req
            .sq
            .iter()
            .take(4)
            .map(|w| {
                format!(
                    "{:?}@{:06x}+{}{}{}",
                    w.opcode,
                    w.first_psn,
                    w.npkts,
                    if w.started { "s" } else { "" },
                    if w.done { "d" } else { "" }
                )
            })
            .collect();
        format!(
            "cur={} cur_psn={:06x} next={:06x} max_sent={:06x} inflight={} retry={} rnr_until={:?} rto={:?} nak_rw={:?} sq=[{}] resp_q={}{}",
            self.req.cur,
            self.req.cur_psn,
            self.req.next_psn,
            self.req.max_sent_psn,
            self.req.rd_atomic_inflight,
            self.comp.retry_left,
            self.comp.rnr_until,
            self.comp.rto_deadline,
            self.comp.nak_rewind_psn,
            head.join(" "),
            self.resp.resp_q.len(),
            if self.sr.on {
                let t = &self.sr.tx;
                format!(
                    " sr: base={:06x} cum={:06x} tx_seq={} delivered={} acked={} high_resp={:06x} lost_below={:06x} backoff={} held={}",
                    t.base, t.cum, t.tx_seq, t.delivered_seq, t.acked_seq, t.high_resp, t.lost_below, t.backoff, self.sr.rx.held
                )
            } else {
                String::new()
            }
        )
    }

    /// Messages the responder has completed (24-bit, wraps).
    pub fn msn(&self) -> u32 {
        self.resp.msn
    }

    pub fn send_queue_len(&self) -> usize {
        self.req.sq.len()
    }

    pub fn recv_queue_len(&self) -> usize {
        self.resp.rq.len()
    }

    /// Largest transport segment (BTH through pad, without ICRC) this QP
    /// emits: the buffer handed to [`QpEngine::poll_transmit`] must be this long.
    /// BTH, the longest extension headers (AtomicETH), one path MTU of
    /// payload (requests and READ responses are cut at it; a UD message is
    /// at most the port MTU, which `mtu` is for UD) and the pad. From the
    /// MTU rather than 4096, so that a 1024-MTU QP fits one 2 KiB or 4 KiB
    /// UMEM chunk on a socket without multi-buffer.
    pub fn max_segment_len(&self) -> usize {
        12 + 28 + self.mtu as usize + 4
    }

    /// `ibv_modify_qp` for an RC QP, with the IBA's per-transition required
    /// and optional attributes.
    pub fn modify(&mut self, a: &QpAttr) -> Result<(), ModifyError> {
        use QpState::{Init, Reset, Rtr, Rts, Sqd, Sqe};
        let from = self.state;
        let to = a.qp_state.unwrap_or(from);
        use AttrMask as M;
        let present = a.mask().minus(M::STATE);
        // The IBA's required and optional attributes per transition (IBA
        // 11.2.4.2, table 91 for RC; the same masks rdma-core checks).
        let (required, optional) = if self.qp_type == QpType::Ud {
            // IBA 11.2.4.2 for UD: no address vector, PSNs or timers, a
            // Q_Key from INIT on (rdma-core checks the same masks).
            match (from, to) {
                (_, Reset) | (_, QpState::Err) => (M::NONE, M::NONE),
                (Reset, Init) => (M::PKEY_INDEX | M::PORT | M::QKEY, M::NONE),
                (Init, Init) => (M::NONE, M::PKEY_INDEX | M::PORT | M::QKEY),
                (Init, Rtr) => (M::NONE, M::PKEY_INDEX | M::QKEY),
                (Rtr, Rts) => (M::SQ_PSN, M::QKEY),
                (Rts, Rts) | (Sqd, Rts) | (Sqe, Rts) => (M::NONE, M::QKEY),
                (Rts, Sqd) => (M::NONE, M::NONE),
                (Sqd, Sqd) => (M::NONE, M::PKEY_INDEX | M::QKEY),
                _ => return Err(ModifyError::InvalidTransition { from, to }),
            }
        } else {
            match (from, to) {
                (_, Reset) | (_, QpState::Err) => (M::NONE, M::NONE),
                (Reset, Init) => (M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS, M::NONE),
                (Init, Init) => (M::NONE, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
                (Init, Rtr) => (
                    M::AV
                        | M::PATH_MTU
                        | M::DEST_QPN
                        | M::RQ_PSN
                        | M::MAX_DEST_RD_ATOMIC
                        | M::MIN_RNR_TIMER,
                    M::PKEY_INDEX | M::ACCESS_FLAGS,
                ),
                (Rtr, Rts) => (
                    M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
                    M::ACCESS_FLAGS | M::MIN_RNR_TIMER,
                ),
                (Rts, Rts) | (Sqd, Rts) | (Sqe, Rts) => {
                    (M::NONE, M::ACCESS_FLAGS | M::MIN_RNR_TIMER)
                }
                (Rts, Sqd) => (M::NONE, M::NONE),
                (Sqd, Sqd) => (
                    M::NONE,
                    M::ACCESS_FLAGS
                        | M::MIN_RNR_TIMER
                        | M::AV
                        | M::PATH_MTU
                        | M::TIMEOUT
                        | M::RETRY_CNT
                        | M::RNR_RETRY
                        | M::MAX_QP_RD_ATOMIC
                        | M::MAX_DEST_RD_ATOMIC,
                ),
                _ => return Err(ModifyError::InvalidTransition { from, to }),
            }
        };
        if let Some(attr) = present.minus(required.union(optional)).first_name() {
            return Err(ModifyError::UnexpectedAttr { from, to, attr });
        }
        if let Some(attr) = required.minus(present).first_name() {
            return Err(ModifyError::MissingAttr { from, to, attr });
        }
        // Values.
        let bad = |attr, why| Err(ModifyError::BadValue { attr, why });
        if a.path_mtu.is_some_and(|m| !mtu_ok(m)) {
            return bad("path_mtu", "must be 256, 512, 1024, 2048 or 4096");
        }
        if a.dest_qp_num.is_some_and(|q| q > MASK_24) {
            return bad("dest_qp_num", "must fit in 24 bits");
        }
        if a.rq_psn.is_some_and(|p| p > MASK_24) {
            return bad("rq_psn", "must fit in 24 bits");
        }
        if a.sq_psn.is_some_and(|p| p > MASK_24) {
            return bad("sq_psn", "must fit in 24 bits");
        }
        if a.timeout.is_some_and(|t| t > 31) {
            return bad("timeout", "must be 0..=31");
        }
        if a.min_rnr_timer.is_some_and(|t| t > 31) {
            return bad("min_rnr_timer", "must be 0..=31");
        }
        if a.retry_cnt.is_some_and(|t| t > 7) {
            return bad("retry_cnt", "must be 0..=7");
        }
        if a.rnr_retry.is_some_and(|t| t > 7) {
            return bad("rnr_retry", "must be 0..=7");
        }
        if a.max_rd_atomic.is_some_and(|t| t > MAX_RD_ATOMIC) {
            return bad("max_rd_atomic", "must be 0..=16");
        }
        if a.max_dest_rd_atomic.is_some_and(|t| t > MAX_RD_ATOMIC) {
            return bad("max_dest_rd_atomic", "must be 0..=16");
        }
        if a.pkey_index.is_some_and(|i| i != 0) {
            return bad("pkey_index", "only index 0 (P_Key 0xffff) exists");
        }

        if let Some(v) = a.qp_access_flags {
            self.access = v;
        }
        if let Some(v) = a.qkey {
            self.qkey = v;
        }
        if let Some(v) = a.dest_gid {
            self.dest_gid = v;
        }
        if let Some(v) = a.path_mtu {
            self.mtu = v;
        }
        if let Some(v) = a.dest_qp_num {
            self.dest_qpn = v;
        }
        if let Some(v) = a.rq_psn {
            self.resp.epsn = v;
        }
        if let Some(v) = a.max_dest_rd_atomic {
            self.max_dest_rd_atomic = v;
        }
        if let Some(v) = a.min_rnr_timer {
            self.min_rnr_timer = v;
        }
        if let Some(v) = a.sq_psn {
            self.comp.acked_psn = psn_add(v, MASK_24);
            self.req.next_psn = v;
            self.req.cur_psn = v;
            self.req.max_sent_psn = v;
            self.sr_start(v);
        }
        if let Some(v) = a.timeout {
            self.timeout = v;
        }
        if let Some(v) = a.retry_cnt {
            self.retry_cnt = v;
            self.comp.retry_left = v;
        }
        if let Some(v) = a.rnr_retry {
            self.rnr_retry = v;
            self.comp.rnr_left = v;
        }
        if let Some(v) = a.max_rd_atomic {
            self.max_rd_atomic = v;
        }
        if from == Init && to == Rtr {
            self.sr_allocate();
        }
        match to {
            Reset => self.reset(),
            QpState::Err => self.enter_error(),
            _ => self.state = to,
        }
        Ok(())
    }

    pub(super) fn reset(&mut self) {
        let (qpn, pd) = (self.qpn, self.pd);
        let cap = QpCap {
            max_send_wr: self.cap_send as u32,
            max_recv_wr: self.cap_recv as u32,
        };
        let cc = self.cc.p;
        *self = QpEngine::with_type(qpn, pd, cap, self.qp_type, self.port_mtu);
        self.cc = dcqcn::Dcqcn::new(cc);
    }

    /// Moves to ERR and flushes every outstanding work request.
    pub(super) fn enter_error(&mut self) {
        self.state = QpState::Err;
        while let Some(w) = self.req.sq.pop_front() {
            let status = if w.done {
                w.status
            } else {
                WcStatus::WrFlushErr
            };
            self.push_send_wc(&w, status, true);
        }
        while let Some(r) = self.resp.rq.pop_front() {
            self.push_wc_error(r.wr_id, WcOpcode::Recv, WcStatus::WrFlushErr);
        }
        self.req.cur = 0;
        self.req.rd_atomic_inflight = 0;
        self.comp.rto_deadline = None;
        self.comp.rnr_until = None;
        self.resp.pending_ack = None;
        // A fatal NAK already queued still goes out, so the peer learns why.
        self.resp.resp_q.retain(|r| matches!(r, Resp::Nak { .. }));
        self.resp.in_msg = InMsg::None;
        self.sr_forget();
    }

    pub fn poll_completion(&mut self) -> Option<Wc> {
        self.completions.pop_front()
    }

    /// Completes a WR the engine refused after it was accepted elsewhere
    /// (posted on another thread, then the QP's state changed).
    pub fn push_error_wc(&mut self, wr_id: u64, opcode: WcOpcode) {
        self.push_wc_error(wr_id, opcode, WcStatus::LocQpOpErr);
    }

    /// A completion of `wr_id` that moved no data: an error or a flush.
    pub(super) fn push_wc_error(&mut self, wr_id: u64, opcode: WcOpcode, status: WcStatus) {
        self.completions.push_back(Wc {
            wr_id,
            status,
            opcode,
            byte_len: 0,
            imm: None,
            qp_num: self.qpn,
            solicited: false,
            src_qp: 0,
            grh: None,
        });
    }

    pub fn pending_completions(&self) -> usize {
        self.completions.len()
    }

    /// Writes the next segment to send (BTH, extension headers, payload, pad;
    /// the driver adds the network headers and ICRC) and returns its length.
    /// Responses go first so the peer's requests are never starved.
    pub fn poll_transmit(&mut self, now: Nanos, mem: &MrTable, buf: &mut [u8]) -> Option<Transmit> {
        self.poll_transmit_ordered(now, mem, buf, TxOrder::ResponsesFirst)
    }

    /// [`QpEngine::poll_transmit`] in the order `order` says.
    pub fn poll_transmit_ordered(
        &mut self,
        now: Nanos,
        mem: &MrTable,
        buf: &mut [u8],
        order: TxOrder,
    ) -> Option<Transmit> {
        if buf.len() < self.max_segment_len() {
            return None;
        }
        if self.np.pending && !matches!(self.state, QpState::Reset | QpState::Init) {
            // CNPs go first and are not paced; they touch no PSN or ACK
            // state (Annex A17.9.3: BECN set, P_Key 0xffff, PSN 0).
            self.np.pending = false;
            let mut t = TransportRepr::new(BthRepr {
                opcode: opcode::CNP,
                pkey: 0xffff,
                resv8a: 0x40,
                dest_qpn: if self.qp_type == QpType::Ud {
                    self.np_ud_dest
                } else {
                    self.dest_qpn
                },
                ..Default::default()
            });
            t.cnp_reserved = Some([0; 16]);
            let len = Self::emit(&t, 0, buf);
            self.stats.np_cnp_sent += 1;
            self.stats.tx_packets += 1;
            self.stats.tx_bytes += len as u64;
            return Some(Transmit {
                len,
                ah: None,
                cnp: true,
            });
        }
        // DCQCN below line rate: the QP's packets are spaced at its rate.
        if self.cc.blocked_until(now).is_some() {
            return None;
        }
        // Whether the QP was awaiting ACKs before this packet, asked once
        // per DCQCN rate window (it walks the send queue).
        let awaiting_acks = self.qp_type != QpType::Ud
            && self.cc.rate_window_ends(now)
            && self.oldest_unacked_psn() != self.req.next_psn;
        let (len, ah) = if self.qp_type == QpType::Ud {
            let (len, ah) = self.poll_datagram(mem, buf)?;
            (len, Some(ah))
        } else {
            let len = match order {
                TxOrder::ResponsesFirst => match self.poll_response(mem, buf) {
                    Some(n) => n,
                    None => self.poll_request(now, mem, buf)?,
                },
                TxOrder::RequestsFirst => match self.poll_request(now, mem, buf) {
                    Some(n) => n,
                    None => self.poll_response(mem, buf)?,
                },
                TxOrder::RequestsOnly => self.poll_request(now, mem, buf)?,
            };
            (len, None)
        };
        self.cc.sent(now, len, awaiting_acks);
        self.stats.tx_packets += 1;
        self.stats.tx_bytes += len as u64;
        Some(Transmit {
            len,
            ah,
            cnp: false,
        })
    }

    /// When DCQCN's pacing lets the next packet go: only while something
    /// waits to go.
    pub(super) fn pace_deadline(&self) -> Option<Nanos> {
        self.cc.deadline().filter(|_| self.has_tx_work())
    }

    /// Something waits to be sent and only DCQCN's pacing holds it back
    /// (until [`QpEngine::pace_deadline`], among `poll_timeout`'s).
    pub fn pacing_blocked(&self, now: Nanos) -> bool {
        self.pace_deadline().is_some_and(|t| t > now)
    }

    /// Something is waiting to be sent (for the pacing deadline).
    pub(super) fn has_tx_work(&self) -> bool {
        !self.resp.resp_q.is_empty()
            || self.resp.pending_ack.is_some()
            || self.sr.rx.sack_due
            || self.req.cur < self.req.sq.len()
    }

    pub(super) fn bth(&self, opc: u8, psn: u32, ack_req: bool) -> BthRepr {
        BthRepr {
            opcode: opc,
            pkey: self.pkey,
            dest_qpn: self.dest_qpn,
            ack_req,
            psn,
            ..Default::default()
        }
    }

    pub(super) fn emit(t: &TransportRepr, payload_len: usize, buf: &mut [u8]) -> usize {
        // Cannot fail: buf is at least max_segment_len().
        let hl = t.emit(buf, payload_len).unwrap_or(0);
        let end = hl + payload_len;
        let pad = pad_for(payload_len);
        buf[end..end + pad].fill(0);
        end + pad
    }

    /// Processes one received transport segment addressed to this QP. The
    /// frame's ICRC and lengths have been checked by the parser; everything
    /// the peer controls is checked here.
    pub fn handle_packet(
        &mut self,
        now: Nanos,
        t: &TransportRepr,
        payload: &[u8],
        mem: &mut MrTable,
    ) {
        if self.qp_type == QpType::Ud {
            // A datagram needs its GRH: the driver calls handle_datagram.
            self.stats.wrong_transport += 1;
            return;
        }
        self.stats.rx_packets += 1;
        self.stats.rx_bytes += payload.len() as u64;
        if matches!(t.bth.opcode, opcode::CNP | opcode::CNP_LEGACY) {
            // The reaction point; never PSN or ACK state.
            self.handle_cnp(now);
            return;
        }
        let flags = t.flags();
        if flags.has(OpFlags::SACK) {
            // Only a QP that negotiated selective repeat takes SACKs.
            if !self.sr.on {
                self.stats.sr_wrong_mode += 1;
            } else if !pkey_matches(self.pkey, t.bth.pkey) {
                self.stats.bad_pkey += 1;
            } else if matches!(self.state, QpState::Rts | QpState::Sqd | QpState::Sqe) {
                self.handle_sack(now, t);
            } else {
                self.stats.dropped += 1;
            }
            return;
        }
        // Header checks every packet passes before a role sees it (IBA 9.6;
        // the table in `responder` lists them all). The transport: RC only,
        // UC/UD/CNP opcodes never reach an RC QP's state machine.
        if t.bth.opcode >> 5 != 0 {
            self.stats.wrong_transport += 1;
            return;
        }
        // P_Key (IBA 9.6.1.1): the packet's must match ours.
        if !pkey_matches(self.pkey, t.bth.pkey) {
            self.stats.bad_pkey += 1;
            return;
        }
        if flags.any(OpFlags::REQUEST | OpFlags::RESERVED) {
            match self.state {
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe => {
                    self.handle_request(t, flags, payload, mem)
                }
                _ => self.stats.dropped += 1,
            }
        } else {
            match self.state {
                QpState::Rts | QpState::Sqd | QpState::Sqe => {
                    self.handle_response(now, t, flags, payload, mem)
                }
                _ => self.stats.dropped += 1,
            }
        }
    }
}
