//! The Reliable Connected transport as a sans-IO state machine, one [`Qp`] per
//! queue pair, in the style of `quinn-proto`.
//!
//! Nothing here touches a socket, a thread or a clock. A driver (the AF_XDP
//! loop, or the simulator in the tests) feeds it posted work requests
//! ([`Qp::post_send`], [`Qp::post_recv`]), received transport segments
//! ([`Qp::handle_packet`]) and the time ([`Qp::handle_timeout`]); it takes out
//! segments to transmit ([`Qp::poll_transmit`]), the next timer deadline
//! ([`Qp::poll_timeout`]) and work completions ([`Qp::poll_completion`]).
//!
//! Requester, completer and responder follow IBA chapter 9 and, where the spec
//! leaves room, Linux rxe (`drivers/infiniband/sw/rxe`): ACK syndrome 0x1f
//! ("unlimited credits"), one PSN-sequence-error NAK per gap, AckReq on the
//! last packet of a message and every 64 packets of a long one, re-executed
//! duplicate READs and replayed atomic results. One deliberate difference:
//! `retry_cnt = 7` means 7 retries as the spec says (rxe treats it as
//! infinite); only `rnr_retry = 7` is infinite.
//!
//! No allocation happens per packet: queues are preallocated at creation.

use std::collections::VecDeque;
use std::fmt;

use crate::memory::{Access, AccessError, AtomicOp, MrTable};
use crate::wire::{
    flags_of, op, opcode, pad_for, psn_add, psn_diff, syndrome, AethRepr, AtomicEthRepr, BthRepr,
    NakCode, RethRepr, Syndrome, TransportRepr, MASK_24,
};

/// Time in nanoseconds on the driver's monotonic clock.
pub type Nanos = u64;

pub const MAX_SGE: usize = 4;
pub const MAX_INLINE: usize = 256;
pub const MAX_RD_ATOMIC: u8 = 16;
/// rxe's RXE_MAX_PKT_PER_ACK: AckReq at least this often in long messages.
pub const MAX_PKT_PER_ACK: u32 = 64;
/// Packets in flight right after a retransmission (timeout or sequence
/// NAK). Go-back-N resends everything past the gap; at full speed a
/// multi-MiB window that overran a slow receiver once overruns it again,
/// every round, until the retries run out. So the resend starts with this
/// many packets and the window doubles with every ACK that makes progress.
pub const RETRY_WINDOW: u32 = MAX_PKT_PER_ACK;
/// A window this large no longer limits anything: back to unlimited.
const WINDOW_OPEN: u32 = 1 << 16;
/// Responses (READ, atomic, NAK) queued beyond the rd_atomic limit are
/// replays of duplicates; past this many, duplicates are dropped.
const RESP_QUEUE_CAP: usize = 2 * MAX_RD_ATOMIC as usize + 8;

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

/// Attributes for [`Qp::modify`]; `Some` means "in the attribute mask", as
/// with `ibv_modify_qp`.
#[derive(Debug, Clone, Default)]
pub struct QpAttr {
    pub qp_state: Option<QpState>,
    pub pkey_index: Option<u16>,
    pub port_num: Option<u8>,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WrOpcode {
    Send,
    SendWithImm,
    RdmaWrite,
    RdmaWriteWithImm,
    RdmaRead,
    CmpSwap,
    FetchAdd,
}

impl WrOpcode {
    fn is_rd_atomic(self) -> bool {
        matches!(
            self,
            WrOpcode::RdmaRead | WrOpcode::CmpSwap | WrOpcode::FetchAdd
        )
    }
    fn is_atomic(self) -> bool {
        matches!(self, WrOpcode::CmpSwap | WrOpcode::FetchAdd)
    }
    fn wc_opcode(self) -> WcOpcode {
        match self {
            WrOpcode::Send | WrOpcode::SendWithImm => WcOpcode::Send,
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => WcOpcode::RdmaWrite,
            WrOpcode::RdmaRead => WcOpcode::RdmaRead,
            WrOpcode::CmpSwap => WcOpcode::CompSwap,
            WrOpcode::FetchAdd => WcOpcode::FetchAdd,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendFlags {
    pub signaled: bool,
    pub solicited: bool,
    pub fence: bool,
}

/// A send work request (`struct ibv_send_wr`).
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    pub wr_id: u64,
    pub opcode: WrOpcode,
    pub sg_list: &'a [Sge],
    /// Inline payload, copied at post time (IBV_SEND_INLINE); replaces `sg_list`.
    pub inline: Option<&'a [u8]>,
    pub flags: SendFlags,
    pub imm: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    pub compare_add: u64,
    pub swap: u64,
}

impl<'a> SendWr<'a> {
    pub fn new(wr_id: u64, opcode: WrOpcode, sg_list: &'a [Sge]) -> Self {
        SendWr {
            wr_id,
            opcode,
            sg_list,
            inline: None,
            flags: SendFlags {
                signaled: true,
                ..Default::default()
            },
            imm: 0,
            remote_addr: 0,
            rkey: 0,
            compare_add: 0,
            swap: 0,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct RecvWr<'a> {
    pub wr_id: u64,
    pub sg_list: &'a [Sge],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostError {
    /// The QP is not in a state that accepts this queue's work requests.
    BadState(QpState),
    QueueFull,
    TooManySge,
    InlineTooLong,
    /// Atomics move exactly 8 bytes.
    BadAtomicLength,
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PostError::BadState(s) => write!(f, "QP is in state {s}"),
            PostError::QueueFull => f.write_str("work queue is full"),
            PostError::TooManySge => write!(f, "more than {MAX_SGE} scatter/gather entries"),
            PostError::InlineTooLong => write!(f, "inline data longer than {MAX_INLINE} bytes"),
            PostError::BadAtomicLength => f.write_str("atomic operations need one 8-byte SGE"),
        }
    }
}
impl std::error::Error for PostError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcStatus {
    Success,
    LocLenErr,
    LocQpOpErr,
    LocProtErr,
    WrFlushErr,
    RemInvReqErr,
    RemAccessErr,
    RemOpErr,
    RetryExcErr,
    RnrRetryExcErr,
}

impl WcStatus {
    /// The name rdma-core's `ibv_wc_status_str` would print.
    pub fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcOpcode {
    Send,
    RdmaWrite,
    RdmaRead,
    CompSwap,
    FetchAdd,
    Recv,
    RecvRdmaWithImm,
}

/// A work completion (`struct ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wc {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    pub byte_len: u32,
    pub imm: Option<u32>,
    pub qp_num: u32,
}

/// Per-QP counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpStats {
    pub tx_packets: u64,
    pub rx_packets: u64,
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
}

/// `4.096 us * 2^timeout`, the local ACK timeout; 0 means never.
pub fn ack_timeout_ns(timeout: u8) -> Option<Nanos> {
    (timeout != 0).then(|| 4096u64 << timeout.min(31))
}

/// The IBA's 5-bit RNR timer code (table 45) in nanoseconds.
pub fn rnr_timer_ns(code: u8) -> Nanos {
    const US_X100: [u64; 32] = [
        65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
        1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
    ];
    US_X100[(code & 31) as usize] * 10_000
}

#[derive(Clone, Copy)]
struct SendWqe {
    wr_id: u64,
    opcode: WrOpcode,
    flags: SendFlags,
    sges: [Sge; MAX_SGE],
    num_sge: u8,
    inline_len: u16,
    /// Slot of the inline payload in `Qp::inline_bufs` (kept out of the
    /// WQE so that the WQE stays small: it is copied per packet sent).
    inline_slot: u32,
    is_inline: bool,
    length: u32,
    imm: u32,
    remote_addr: u64,
    rkey: u32,
    compare_add: u64,
    swap: u64,
    // Transport state.
    started: bool,
    first_psn: u32,
    npkts: u32,
    /// READ: response packets received in order so far.
    resp_pkts: u32,
    done: bool,
    status: WcStatus,
}

impl SendWqe {
    fn last_psn(&self) -> u32 {
        psn_add(self.first_psn, self.npkts - 1)
    }
    fn contains(&self, psn: u32) -> bool {
        self.started && {
            let d = psn_diff(psn, self.first_psn);
            d >= 0 && (d as u32) < self.npkts
        }
    }
}

/// Queues the WC of a finished send WQE (only signaled ones succeed
/// visibly; errors and `force` always complete).
fn send_wc(cq: &mut VecDeque<Wc>, qpn: u32, w: &SendWqe, status: WcStatus, force: bool) {
    if w.flags.signaled || status != WcStatus::Success || force {
        cq.push_back(Wc {
            wr_id: w.wr_id,
            status,
            opcode: w.opcode.wc_opcode(),
            byte_len: if status == WcStatus::Success {
                w.length
            } else {
                0
            },
            imm: None,
            qp_num: qpn,
        });
    }
}

#[derive(Clone, Copy)]
struct RecvWqe {
    wr_id: u64,
    sges: [Sge; MAX_SGE],
    num_sge: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum InMsg {
    None,
    /// A multi-packet SEND: bytes placed so far in the head RECV WQE.
    Send {
        offset: u32,
    },
    /// A multi-packet WRITE: its target and progress.
    Write {
        rkey: u32,
        va: u64,
        total: u32,
        offset: u32,
        imm: bool,
    },
}

/// A saved READ or atomic request, for replaying duplicates.
#[derive(Clone, Copy, Default)]
struct RdAtomicRes {
    valid: bool,
    atomic: bool,
    first_psn: u32,
    npkts: u32,
    orig: u64,
}

#[derive(Clone, Copy, Debug)]
enum Resp {
    Read {
        psn: u32,
        last_psn: u32,
        va: u64,
        rkey: u32,
        remaining: u32,
        first: bool,
        /// Re-execution of a duplicate; does not count against
        /// max_dest_rd_atomic.
        replay: bool,
    },
    AtomicAck {
        psn: u32,
        orig: u64,
        replay: bool,
    },
    Nak {
        psn: u32,
        syndrome: u8,
    },
}

/// One RC queue pair.
pub struct Qp {
    qpn: u32,
    pd: u32,
    state: QpState,
    cap_send: usize,
    cap_recv: usize,
    // Attributes.
    pkey: u16,
    access: Access,
    dest_gid: [u8; 16],
    mtu: u32,
    dest_qpn: u32,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    min_rnr_timer: u8,
    max_rd_atomic: u8,
    max_dest_rd_atomic: u8,
    // Requester / completer.
    sq: VecDeque<SendWqe>,
    inline_bufs: Vec<[u8; MAX_INLINE]>,
    /// Inline slot of the next posted WQE (counts posts modulo cap_send,
    /// kept as an index: a division per post showed in profiles).
    inline_next: usize,
    next_psn: u32,
    cur: usize,
    cur_psn: u32,
    noack_pkts: u32,
    /// Packets allowed past the oldest unacknowledged PSN (u32::MAX: no
    /// limit; see RETRY_WINDOW).
    window: u32,
    rd_atomic_inflight: u8,
    retry_left: u8,
    rnr_left: u8,
    rnr_until: Option<Nanos>,
    rto_deadline: Option<Nanos>,
    /// Highest PSN ever transmitted + 1, to tell retransmissions apart.
    max_sent_psn: u32,
    /// Set when we already went back for a gap in responses; cleared by
    /// progress, so later packets of the same burst do not trigger more.
    retry_pending: bool,
    /// PSN we last went back to on a NAK (sequence error or RNR). A second
    /// NAK for the same PSN (the responder's pipeline answering the packets
    /// that followed an RNR NAK, or a duplicated frame) is the same event
    /// and must not consume another retry.
    nak_rewind_psn: Option<u32>,
    /// Highest PSN the responder is known to have received (explicitly ACKed
    /// or implied by a NAK or response). Any advance is forward progress and
    /// refills the retry budget, even in the middle of a long message.
    acked_psn: u32,
    // Responder.
    rq: VecDeque<RecvWqe>,
    epsn: u32,
    msn: u32,
    in_msg: InMsg,
    nak_seq_sent: bool,
    pending_ack: Option<u32>,
    resp_q: VecDeque<Resp>,
    res: [RdAtomicRes; MAX_RD_ATOMIC as usize],
    res_next: usize,
    // Output.
    completions: VecDeque<Wc>,
    stats: QpStats,
}

/// Queue sizes of a new QP (`struct ibv_qp_cap`).
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

fn mtu_ok(m: u32) -> bool {
    matches!(m, 256 | 512 | 1024 | 2048 | 4096)
}

impl Qp {
    pub fn new(qpn: u32, pd: u32, cap: QpCap) -> Qp {
        let cap_send = cap.max_send_wr.max(1) as usize;
        let cap_recv = cap.max_recv_wr.max(1) as usize;
        Qp {
            qpn: qpn & MASK_24,
            pd,
            state: QpState::Reset,
            cap_send,
            cap_recv,
            pkey: 0xffff,
            access: Access(0),
            dest_gid: [0; 16],
            mtu: 1024,
            dest_qpn: 0,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            sq: VecDeque::with_capacity(cap_send),
            inline_bufs: vec![[0u8; MAX_INLINE]; cap_send],
            inline_next: 0,
            next_psn: 0,
            cur: 0,
            cur_psn: 0,
            noack_pkts: 0,
            window: u32::MAX,
            rd_atomic_inflight: 0,
            retry_left: 7,
            rnr_left: 7,
            rnr_until: None,
            rto_deadline: None,
            max_sent_psn: 0,
            retry_pending: false,
            nak_rewind_psn: None,
            acked_psn: MASK_24,
            rq: VecDeque::with_capacity(cap_recv),
            epsn: 0,
            msn: 0,
            in_msg: InMsg::None,
            nak_seq_sent: false,
            pending_ack: None,
            resp_q: VecDeque::with_capacity(RESP_QUEUE_CAP),
            res: [RdAtomicRes::default(); MAX_RD_ATOMIC as usize],
            res_next: 0,
            completions: VecDeque::with_capacity(cap_send + cap_recv),
            stats: QpStats::default(),
        }
    }

    /// Packets a message of `len` bytes takes (at least one). The MTU is a
    /// power of two: a shift, not a division, per message.
    fn packets_for(&self, len: u32) -> u32 {
        let shift = self.mtu.trailing_zeros();
        (((len as u64 + self.mtu as u64 - 1) >> shift) as u32).max(1)
    }

    pub fn qpn(&self) -> u32 {
        self.qpn
    }
    pub fn pd(&self) -> u32 {
        self.pd
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
        self.next_psn
    }
    /// PSN the responder expects next.
    pub fn rq_psn(&self) -> u32 {
        self.epsn
    }
    /// One line of requester/responder internals, for traces.
    pub fn debug_state(&self) -> String {
        let head: Vec<String> = self
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
            "cur={} cur_psn={:06x} next={:06x} max_sent={:06x} inflight={} retry={} rnr_until={:?} rto={:?} nak_rw={:?} sq=[{}] resp_q={}",
            self.cur,
            self.cur_psn,
            self.next_psn,
            self.max_sent_psn,
            self.rd_atomic_inflight,
            self.retry_left,
            self.rnr_until,
            self.rto_deadline,
            self.nak_rewind_psn,
            head.join(" "),
            self.resp_q.len()
        )
    }

    /// Messages the responder has completed (24-bit, wraps).
    pub fn msn(&self) -> u32 {
        self.msn
    }
    pub fn send_queue_len(&self) -> usize {
        self.sq.len()
    }
    pub fn recv_queue_len(&self) -> usize {
        self.rq.len()
    }
    /// Largest transport segment (BTH through pad, without ICRC) this QP
    /// emits: the buffer handed to [`Qp::poll_transmit`] must be this long.
    pub fn max_segment_len(&self) -> usize {
        12 + 28 + 4096 + 4
    }

    // ------------------------------------------------------------ modify

    /// `ibv_modify_qp` for an RC QP, with the IBA's per-transition required
    /// and optional attributes.
    pub fn modify(&mut self, a: &QpAttr) -> Result<(), ModifyError> {
        use QpState::{Init, Reset, Rtr, Rts, Sqd, Sqe};
        let from = self.state;
        let to = a.qp_state.unwrap_or(from);
        // (name, present) of every attribute, for the required/allowed checks.
        let present: [(&'static str, bool); 14] = [
            ("pkey_index", a.pkey_index.is_some()),
            ("port_num", a.port_num.is_some()),
            ("qp_access_flags", a.qp_access_flags.is_some()),
            ("av", a.dest_gid.is_some()),
            ("path_mtu", a.path_mtu.is_some()),
            ("dest_qp_num", a.dest_qp_num.is_some()),
            ("rq_psn", a.rq_psn.is_some()),
            ("max_dest_rd_atomic", a.max_dest_rd_atomic.is_some()),
            ("min_rnr_timer", a.min_rnr_timer.is_some()),
            ("sq_psn", a.sq_psn.is_some()),
            ("timeout", a.timeout.is_some()),
            ("retry_cnt", a.retry_cnt.is_some()),
            ("rnr_retry", a.rnr_retry.is_some()),
            ("max_rd_atomic", a.max_rd_atomic.is_some()),
        ];
        let (required, optional): (&[&str], &[&str]) = match (from, to) {
            (_, Reset) | (_, QpState::Err) => (&[], &[]),
            (Reset, Init) => (&["pkey_index", "port_num", "qp_access_flags"], &[]),
            (Init, Init) => (&[], &["pkey_index", "port_num", "qp_access_flags"]),
            (Init, Rtr) => (
                &[
                    "av",
                    "path_mtu",
                    "dest_qp_num",
                    "rq_psn",
                    "max_dest_rd_atomic",
                    "min_rnr_timer",
                ],
                &["pkey_index", "qp_access_flags"],
            ),
            (Rtr, Rts) => (
                &[
                    "sq_psn",
                    "timeout",
                    "retry_cnt",
                    "rnr_retry",
                    "max_rd_atomic",
                ],
                &["qp_access_flags", "min_rnr_timer"],
            ),
            (Rts, Rts) | (Sqd, Rts) | (Sqe, Rts) => (&[], &["qp_access_flags", "min_rnr_timer"]),
            (Rts, Sqd) => (&[], &[]),
            (Sqd, Sqd) => (
                &[],
                &[
                    "qp_access_flags",
                    "min_rnr_timer",
                    "av",
                    "path_mtu",
                    "timeout",
                    "retry_cnt",
                    "rnr_retry",
                    "max_rd_atomic",
                    "max_dest_rd_atomic",
                ],
            ),
            _ => return Err(ModifyError::InvalidTransition { from, to }),
        };
        for &(name, set) in &present {
            if set && !required.contains(&name) && !optional.contains(&name) {
                return Err(ModifyError::UnexpectedAttr {
                    from,
                    to,
                    attr: name,
                });
            }
            if !set && required.contains(&name) {
                return Err(ModifyError::MissingAttr {
                    from,
                    to,
                    attr: name,
                });
            }
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
            self.epsn = v;
        }
        if let Some(v) = a.max_dest_rd_atomic {
            self.max_dest_rd_atomic = v;
        }
        if let Some(v) = a.min_rnr_timer {
            self.min_rnr_timer = v;
        }
        if let Some(v) = a.sq_psn {
            self.acked_psn = psn_add(v, MASK_24);
            self.next_psn = v;
            self.cur_psn = v;
            self.max_sent_psn = v;
        }
        if let Some(v) = a.timeout {
            self.timeout = v;
        }
        if let Some(v) = a.retry_cnt {
            self.retry_cnt = v;
            self.retry_left = v;
        }
        if let Some(v) = a.rnr_retry {
            self.rnr_retry = v;
            self.rnr_left = v;
        }
        if let Some(v) = a.max_rd_atomic {
            self.max_rd_atomic = v;
        }
        match to {
            Reset => self.reset(),
            QpState::Err => self.enter_error(),
            _ => self.state = to,
        }
        Ok(())
    }

    fn reset(&mut self) {
        let (qpn, pd) = (self.qpn, self.pd);
        let cap = QpCap {
            max_send_wr: self.cap_send as u32,
            max_recv_wr: self.cap_recv as u32,
        };
        *self = Qp::new(qpn, pd, cap);
    }

    /// Moves to ERR and flushes every outstanding work request.
    fn enter_error(&mut self) {
        self.state = QpState::Err;
        while let Some(w) = self.sq.pop_front() {
            let status = if w.done {
                w.status
            } else {
                WcStatus::WrFlushErr
            };
            self.push_send_wc(&w, status, true);
        }
        while let Some(r) = self.rq.pop_front() {
            self.completions.push_back(Wc {
                wr_id: r.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: WcOpcode::Recv,
                byte_len: 0,
                imm: None,
                qp_num: self.qpn,
            });
        }
        self.cur = 0;
        self.rd_atomic_inflight = 0;
        self.rto_deadline = None;
        self.rnr_until = None;
        self.pending_ack = None;
        // A fatal NAK already queued still goes out, so the peer learns why.
        self.resp_q.retain(|r| matches!(r, Resp::Nak { .. }));
        self.in_msg = InMsg::None;
    }

    // ------------------------------------------------------------ posting

    pub fn post_send(&mut self, wr: &SendWr) -> Result<(), PostError> {
        match self.state {
            QpState::Rts | QpState::Sqd | QpState::Err => {}
            s => return Err(PostError::BadState(s)),
        }
        if self.sq.len() >= self.cap_send {
            return Err(PostError::QueueFull);
        }
        if wr.sg_list.len() > MAX_SGE {
            return Err(PostError::TooManySge);
        }
        let inline = match wr.inline {
            Some(data) if !wr.opcode.is_rd_atomic() => {
                if data.len() > MAX_INLINE {
                    return Err(PostError::InlineTooLong);
                }
                Some(data)
            }
            _ => None,
        };
        let length = match inline {
            Some(data) => data.len() as u32,
            None => {
                let total: u64 = wr.sg_list.iter().map(|s| s.length as u64).sum();
                total.min(u32::MAX as u64) as u32
            }
        };
        if wr.opcode.is_atomic() && (length != 8 || wr.sg_list.len() != 1) {
            return Err(PostError::BadAtomicLength);
        }
        // WQEs retire in order and at most cap_send are queued, so an inline
        // slot is free again by the time the counter wraps to it.
        let slot = self.inline_next;
        if let Some(data) = inline {
            self.inline_bufs[slot][..data.len()].copy_from_slice(data);
        }
        self.inline_next = if slot + 1 == self.cap_send {
            0
        } else {
            slot + 1
        };
        let mut sges = [Sge::default(); MAX_SGE];
        if inline.is_none() {
            sges[..wr.sg_list.len()].copy_from_slice(wr.sg_list);
        }
        let w = SendWqe {
            wr_id: wr.wr_id,
            opcode: wr.opcode,
            flags: wr.flags,
            sges,
            num_sge: if inline.is_some() {
                0
            } else {
                wr.sg_list.len() as u8
            },
            inline_len: inline.map_or(0, |d| d.len() as u16),
            inline_slot: slot as u32,
            is_inline: inline.is_some(),
            length,
            imm: wr.imm,
            remote_addr: wr.remote_addr,
            rkey: wr.rkey,
            compare_add: wr.compare_add,
            swap: wr.swap,
            started: false,
            first_psn: 0,
            npkts: 0,
            resp_pkts: 0,
            done: false,
            status: WcStatus::Success,
        };
        if self.state == QpState::Err {
            self.push_send_wc(&w, WcStatus::WrFlushErr, true);
            return Ok(());
        }
        self.sq.push_back(w);
        Ok(())
    }

    pub fn post_recv(&mut self, wr: &RecvWr) -> Result<(), PostError> {
        match self.state {
            QpState::Reset => return Err(PostError::BadState(QpState::Reset)),
            QpState::Err => {
                self.completions.push_back(Wc {
                    wr_id: wr.wr_id,
                    status: WcStatus::WrFlushErr,
                    opcode: WcOpcode::Recv,
                    byte_len: 0,
                    imm: None,
                    qp_num: self.qpn,
                });
                return Ok(());
            }
            _ => {}
        }
        if self.rq.len() >= self.cap_recv {
            return Err(PostError::QueueFull);
        }
        if wr.sg_list.len() > MAX_SGE {
            return Err(PostError::TooManySge);
        }
        let mut r = RecvWqe {
            wr_id: wr.wr_id,
            sges: [Sge::default(); MAX_SGE],
            num_sge: wr.sg_list.len() as u8,
        };
        r.sges[..wr.sg_list.len()].copy_from_slice(wr.sg_list);
        self.rq.push_back(r);
        Ok(())
    }

    pub fn poll_completion(&mut self) -> Option<Wc> {
        self.completions.pop_front()
    }

    pub fn pending_completions(&self) -> usize {
        self.completions.len()
    }

    fn push_send_wc(&mut self, w: &SendWqe, status: WcStatus, force: bool) {
        send_wc(&mut self.completions, self.qpn, w, status, force);
    }

    // ------------------------------------------------------------ timers

    /// Earliest time at which [`Qp::handle_timeout`] has work to do.
    pub fn poll_timeout(&self) -> Option<Nanos> {
        match (self.rto_deadline, self.rnr_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn handle_timeout(&mut self, now: Nanos) {
        if self.rnr_until.is_some_and(|t| t <= now) {
            self.rnr_until = None;
            self.arm_rto(now);
        }
        if self.rto_deadline.is_some_and(|t| t <= now) {
            self.rto_deadline = None;
            if !self.has_outstanding() {
                return;
            }
            self.stats.timeouts += 1;
            if self.retry_left == 0 {
                self.fail_front(WcStatus::RetryExcErr);
                return;
            }
            self.retry_left -= 1;
            let psn = self.oldest_unacked_psn();
            self.retransmit_from(psn);
            self.arm_rto(now);
        }
    }

    fn has_outstanding(&self) -> bool {
        self.sq.front().is_some_and(|w| w.started && !w.done)
    }

    fn arm_rto(&mut self, now: Nanos) {
        self.rto_deadline = if self.has_outstanding() {
            ack_timeout_ns(self.timeout).map(|t| now + t)
        } else {
            None
        };
    }

    /// First PSN whose acknowledgement or response is still awaited.
    fn oldest_unacked_psn(&self) -> u32 {
        for w in &self.sq {
            if !w.started {
                break;
            }
            if !w.done {
                // Inside a multi-packet message, the responder may already
                // have part of it (implied by a NAK's PSN).
                let after_acked = psn_add(self.acked_psn, 1);
                return if !w.opcode.is_rd_atomic() && w.contains(after_acked) {
                    after_acked
                } else {
                    psn_add(w.first_psn, w.resp_pkts)
                };
            }
        }
        self.next_psn
    }

    /// Resend after a loss (timeout, sequence NAK, missing responses): go
    /// back to `psn` with a small window (RETRY_WINDOW).
    fn retransmit_from(&mut self, psn: u32) {
        self.window = RETRY_WINDOW;
        self.rewind(psn);
    }

    /// Go-back-N: transmit again from `psn`, or from the oldest PSN still
    /// unanswered if that is earlier (a READ whose responses were lost must
    /// be asked again before anything after it, as rxe's req_retry does).
    fn rewind(&mut self, psn: u32) {
        let oldest = self.oldest_unacked_psn();
        let psn = if psn_diff(psn, oldest) > 0 {
            oldest
        } else {
            psn
        };
        for (i, w) in self.sq.iter().enumerate() {
            if w.contains(psn) && !w.done {
                self.cur = i;
                self.cur_psn = psn;
                return;
            }
        }
        // Nothing started contains it: continue with the first unstarted WQE.
        self.cur = self
            .sq
            .iter()
            .position(|w| !w.started)
            .unwrap_or(self.sq.len());
        self.cur_psn = self.next_psn;
    }

    // ------------------------------------------------------------ transmit

    /// Writes the next segment to send (BTH, extension headers, payload, pad;
    /// the driver adds the network headers and ICRC) and returns its length.
    /// Responses go first so the peer's requests are never starved.
    pub fn poll_transmit(&mut self, now: Nanos, mem: &MrTable, buf: &mut [u8]) -> Option<usize> {
        if buf.len() < self.max_segment_len() {
            return None;
        }
        if let Some(n) = self.poll_response(mem, buf) {
            self.stats.tx_packets += 1;
            return Some(n);
        }
        let n = self.poll_request(now, mem, buf)?;
        self.stats.tx_packets += 1;
        Some(n)
    }

    fn bth(&self, opc: u8, psn: u32, ack_req: bool) -> BthRepr {
        BthRepr {
            opcode: opc,
            pkey: self.pkey,
            dest_qpn: self.dest_qpn,
            ack_req,
            psn,
            ..Default::default()
        }
    }

    fn emit(t: &TransportRepr, payload_len: usize, buf: &mut [u8]) -> usize {
        // Cannot fail: buf is at least max_segment_len().
        let hl = t.emit(buf, payload_len).unwrap_or(0);
        let end = hl + payload_len;
        let pad = pad_for(payload_len);
        buf[end..end + pad].fill(0);
        end + pad
    }

    fn poll_response(&mut self, mem: &MrTable, buf: &mut [u8]) -> Option<usize> {
        if matches!(self.state, QpState::Reset | QpState::Init) {
            return None;
        }
        if let Some(r) = self.resp_q.front_mut() {
            let mtu = self.mtu;
            let msn = self.msn;
            let (t, payload, psn, finished) = match *r {
                Resp::Nak { psn, syndrome } => {
                    let mut t = TransportRepr::new(self.bth(opcode::RC_ACKNOWLEDGE, psn, false));
                    t.aeth = Some(AethRepr { syndrome, msn });
                    (t, None, psn, true)
                }
                Resp::AtomicAck { psn, orig, .. } => {
                    let mut t =
                        TransportRepr::new(self.bth(opcode::RC_ATOMIC_ACKNOWLEDGE, psn, false));
                    t.aeth = Some(AethRepr {
                        syndrome: syndrome::ACK_UNLIMITED,
                        msn,
                    });
                    t.atomic_ack = Some(orig);
                    (t, None, psn, true)
                }
                Resp::Read {
                    ref mut psn,
                    last_psn,
                    ref mut va,
                    rkey,
                    ref mut remaining,
                    ref mut first,
                    ..
                } => {
                    let len = (*remaining).min(mtu);
                    let last = *psn == last_psn;
                    let opc = match (*first, last) {
                        (true, true) => opcode::RC_RDMA_READ_RESPONSE_ONLY,
                        (true, false) => opcode::RC_RDMA_READ_RESPONSE_FIRST,
                        (false, true) => opcode::RC_RDMA_READ_RESPONSE_LAST,
                        (false, false) => opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                    };
                    let this_psn = *psn;
                    let src = (*va, rkey, len);
                    *psn = psn_add(*psn, 1);
                    *va = va.wrapping_add(len as u64);
                    *remaining -= len;
                    *first = false;
                    let mut t = TransportRepr::new(self.bth(opc, this_psn, false));
                    if flags_of(opc) & op::AETH != 0 {
                        t.aeth = Some(AethRepr {
                            syndrome: syndrome::ACK_UNLIMITED,
                            msn,
                        });
                    }
                    (t, Some(src), this_psn, last)
                }
            };
            if finished {
                self.resp_q.pop_front();
            }
            let hl = t.header_len();
            let plen = match payload {
                Some((va, rkey, len)) => {
                    // Checked when the request arrived; the MR can have been
                    // deregistered since, so check again and send zeros rather
                    // than touch memory that is gone.
                    match mem.resolve(rkey, self.pd, va, len as u64, Access::REMOTE_READ) {
                        Ok(r) => buf[hl..hl + len as usize].copy_from_slice(mem.slice(r)),
                        Err(_) => buf[hl..hl + len as usize].fill(0),
                    }
                    len as usize
                }
                None => 0,
            };
            if self.pending_ack.is_some_and(|a| psn_diff(a, psn) <= 0) {
                self.pending_ack = None;
            }
            return Some(Self::emit(&t, plen, buf));
        }
        if self.state == QpState::Err {
            return None;
        }
        let psn = self.pending_ack.take()?;
        self.stats.acks_sent += 1;
        let mut t = TransportRepr::new(self.bth(opcode::RC_ACKNOWLEDGE, psn, false));
        t.aeth = Some(AethRepr {
            syndrome: syndrome::ACK_UNLIMITED,
            msn: self.msn,
        });
        Some(Self::emit(&t, 0, buf))
    }

    fn poll_request(&mut self, now: Nanos, mem: &MrTable, buf: &mut [u8]) -> Option<usize> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return None;
        }
        if self.rnr_until.is_some() {
            return None;
        }
        self.normalize_cursor();
        let started = self.sq.get(self.cur)?.started;
        // With a limited window: how far this packet's PSN is past the oldest
        // unacknowledged one (starting a WQE below changes neither).
        let ahead = (self.window != u32::MAX).then(|| {
            let psn = if started { self.cur_psn } else { self.next_psn };
            psn_diff(psn, self.oldest_unacked_psn())
        });
        // The oldest packet may always go (a READ request spans many PSNs
        // but is one packet).
        if ahead.is_some_and(|a| a > 0 && a as u32 >= self.window) {
            return None;
        }
        if !started {
            // The WQE is updated in place: it is as large as a cache line
            // pair, and copying it twice per packet showed in profiles.
            if self.state == QpState::Sqd {
                return None;
            }
            let w = &self.sq[self.cur];
            let rd_atomic = w.opcode.is_rd_atomic();
            if rd_atomic && self.rd_atomic_inflight >= self.max_rd_atomic.max(1) {
                return None;
            }
            if w.flags.fence && self.rd_atomic_inflight > 0 {
                return None;
            }
            // Local gather list check before anything is sent: a bad lkey is
            // a local protection error, fatal to the QP as in IBA 10.8.3.
            let local_ok = w.is_inline || self.check_local(w, mem).is_ok();
            let npkts = match w.opcode {
                _ if !local_ok => 1,
                WrOpcode::CmpSwap | WrOpcode::FetchAdd => 1,
                _ => self.packets_for(w.length),
            };
            let first_psn = self.next_psn;
            let w = &mut self.sq[self.cur];
            w.started = true;
            w.first_psn = first_psn;
            w.npkts = npkts;
            if !local_ok {
                w.done = true;
                w.status = WcStatus::LocProtErr;
                self.complete_done();
                return None;
            }
            self.next_psn = psn_add(first_psn, npkts);
            self.cur_psn = first_psn;
            if rd_atomic {
                self.rd_atomic_inflight += 1;
            }
        }
        let w = &self.sq[self.cur];
        let psn = self.cur_psn;
        let k = psn_diff(psn, w.first_psn) as u32;
        let off = k * self.mtu;
        let last = k + 1 == w.npkts;
        let mut t = TransportRepr::new(BthRepr::default());
        let mut plen = 0usize;
        let mut advance_wqe = last;
        match w.opcode {
            WrOpcode::Send
            | WrOpcode::SendWithImm
            | WrOpcode::RdmaWrite
            | WrOpcode::RdmaWriteWithImm => {
                plen = (w.length - off).min(self.mtu) as usize;
                let first = k == 0;
                let imm = matches!(w.opcode, WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm);
                let send = matches!(w.opcode, WrOpcode::Send | WrOpcode::SendWithImm);
                let opc = match (send, first, last, imm) {
                    (true, true, true, false) => opcode::RC_SEND_ONLY,
                    (true, true, true, true) => opcode::RC_SEND_ONLY_WITH_IMMEDIATE,
                    (true, true, false, _) => opcode::RC_SEND_FIRST,
                    (true, false, false, _) => opcode::RC_SEND_MIDDLE,
                    (true, false, true, false) => opcode::RC_SEND_LAST,
                    (true, false, true, true) => opcode::RC_SEND_LAST_WITH_IMMEDIATE,
                    (false, true, true, false) => opcode::RC_RDMA_WRITE_ONLY,
                    (false, true, true, true) => opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
                    (false, true, false, _) => opcode::RC_RDMA_WRITE_FIRST,
                    (false, false, false, _) => opcode::RC_RDMA_WRITE_MIDDLE,
                    (false, false, true, false) => opcode::RC_RDMA_WRITE_LAST,
                    (false, false, true, true) => opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
                };
                self.noack_pkts += 1;
                // With a limited window the packet that fills it must ask
                // for an ACK, or the window stays shut until a timeout.
                let fills_window = ahead.is_some_and(|a| a >= 0 && a as u32 + 1 >= self.window);
                let ack_req = last || self.noack_pkts >= MAX_PKT_PER_ACK || fills_window;
                if ack_req {
                    self.noack_pkts = 0;
                }
                t.bth = self.bth(opc, psn, ack_req);
                t.bth.solicited = last && w.flags.solicited && send;
                if flags_of(opc) & op::RETH != 0 {
                    t.reth = Some(RethRepr {
                        va: w.remote_addr,
                        rkey: w.rkey,
                        dma_len: w.length,
                    });
                }
                if flags_of(opc) & op::IMM != 0 {
                    t.imm = Some(w.imm);
                }
            }
            WrOpcode::RdmaRead => {
                // A retry asks only for what has not arrived yet.
                t.bth = self.bth(opcode::RC_RDMA_READ_REQUEST, psn, true);
                t.reth = Some(RethRepr {
                    va: w.remote_addr.wrapping_add(off as u64),
                    rkey: w.rkey,
                    dma_len: w.length - off.min(w.length),
                });
                advance_wqe = true;
            }
            WrOpcode::CmpSwap | WrOpcode::FetchAdd => {
                let opc = if w.opcode == WrOpcode::CmpSwap {
                    opcode::RC_COMPARE_SWAP
                } else {
                    opcode::RC_FETCH_ADD
                };
                t.bth = self.bth(opc, psn, true);
                t.atomic_eth = Some(AtomicEthRepr {
                    va: w.remote_addr,
                    rkey: w.rkey,
                    swap_add: if w.opcode == WrOpcode::CmpSwap {
                        w.swap
                    } else {
                        w.compare_add
                    },
                    compare: if w.opcode == WrOpcode::CmpSwap {
                        w.compare_add
                    } else {
                        0
                    },
                });
            }
        }
        let hl = t.header_len();
        if plen > 0 {
            let inline = &self.inline_bufs[w.inline_slot as usize][..w.inline_len as usize];
            Self::gather(
                w,
                inline,
                mem,
                self.pd,
                off as usize,
                &mut buf[hl..hl + plen],
            );
        }
        if psn_diff(psn, self.max_sent_psn) < 0 {
            self.stats.retransmits += 1;
        }
        // A READ request reserves the PSNs of all its responses.
        let end = if w.opcode == WrOpcode::RdmaRead {
            psn_add(w.first_psn, w.npkts)
        } else {
            psn_add(psn, 1)
        };
        if psn_diff(end, self.max_sent_psn) > 0 {
            self.max_sent_psn = end;
        }
        if advance_wqe {
            self.cur += 1;
            self.cur_psn = match self.sq.get(self.cur) {
                Some(n) if n.started => n.first_psn,
                _ => self.next_psn,
            };
        } else {
            self.cur_psn = psn_add(psn, 1);
        }
        if self.rto_deadline.is_none() {
            self.arm_rto(now);
        }
        Some(Self::emit(&t, plen, buf))
    }

    /// Keeps the transmit cursor on a WQE that still needs sending, with a
    /// PSN inside it: completions can pop or finish WQEs under the cursor.
    fn normalize_cursor(&mut self) {
        while let Some(w) = self.sq.get(self.cur) {
            if !w.started {
                self.cur_psn = self.next_psn;
                return;
            }
            if !w.done {
                if !w.contains(self.cur_psn) {
                    self.cur_psn = psn_add(w.first_psn, w.resp_pkts);
                }
                return;
            }
            self.cur += 1;
        }
        self.cur_psn = self.next_psn;
    }

    fn check_local(&self, w: &SendWqe, mem: &MrTable) -> Result<(), AccessError> {
        let need = if w.opcode.is_rd_atomic() {
            Access::LOCAL_WRITE
        } else {
            Access(0)
        };
        for s in &w.sges[..w.num_sge as usize] {
            mem.resolve_local(s.lkey, self.pd, s.addr, s.length as u64, need)?;
        }
        Ok(())
    }

    /// Copies `out.len()` bytes of the WQE's payload starting at `off`.
    fn gather(w: &SendWqe, inline: &[u8], mem: &MrTable, pd: u32, mut off: usize, out: &mut [u8]) {
        if w.is_inline {
            out.copy_from_slice(&inline[off..off + out.len()]);
            return;
        }
        let mut done = 0;
        for s in &w.sges[..w.num_sge as usize] {
            let len = s.length as usize;
            if off >= len {
                off -= len;
                continue;
            }
            let n = (len - off).min(out.len() - done);
            // Checked in check_local before the first packet; a region
            // deregistered mid-message yields zeros, never a fault.
            match mem.resolve_local(s.lkey, pd, s.addr + off as u64, n as u64, Access(0)) {
                Ok(r) => out[done..done + n].copy_from_slice(mem.slice(r)),
                Err(_) => out[done..done + n].fill(0),
            }
            done += n;
            off = 0;
            if done == out.len() {
                break;
            }
        }
    }

    /// Copies `data` into an SGE list at byte offset `off`.
    fn scatter(
        sges: &[Sge],
        mem: &mut MrTable,
        pd: u32,
        mut off: usize,
        data: &[u8],
    ) -> Result<(), WcStatus> {
        let mut done = 0;
        for s in sges {
            if done == data.len() {
                break;
            }
            let len = s.length as usize;
            if off >= len {
                off -= len;
                continue;
            }
            let n = (len - off).min(data.len() - done);
            let r = mem
                .resolve_local(
                    s.lkey,
                    pd,
                    s.addr + off as u64,
                    n as u64,
                    Access::LOCAL_WRITE,
                )
                .map_err(|_| WcStatus::LocProtErr)?;
            mem.slice_mut(r).copy_from_slice(&data[done..done + n]);
            done += n;
            off = 0;
        }
        if done < data.len() {
            return Err(WcStatus::LocLenErr);
        }
        Ok(())
    }

    // ------------------------------------------------------------ receive

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
        self.stats.rx_packets += 1;
        let flags = t.flags();
        // RC only: UC/UD/CNP opcodes never reach an RC QP's state machine.
        if t.bth.opcode >> 5 != 0 {
            self.stats.dropped += 1;
            return;
        }
        if flags & op::REQUEST != 0 {
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

    /// Queues a response. New READ/atomic requests are bounded by
    /// max_dest_rd_atomic before they get here; replays of duplicates are
    /// dropped once the queue is long, so a peer cannot grow it.
    fn queue_resp(&mut self, r: Resp) {
        let replay = matches!(
            r,
            Resp::Read { replay: true, .. } | Resp::AtomicAck { replay: true, .. }
        );
        if replay && self.resp_q.len() >= RESP_QUEUE_CAP {
            self.stats.dropped += 1;
            return;
        }
        self.resp_q.push_back(r);
    }

    /// A fatal responder error: NAK, then ERR (IBA 9.9.3 classes B-D, as rxe).
    fn responder_fatal(&mut self, psn: u32, code: u8, wc: Option<(u64, WcStatus)>) {
        self.stats.errors += 1;
        self.resp_q.clear();
        self.resp_q.push_back(Resp::Nak {
            psn,
            syndrome: code,
        });
        if let Some((wr_id, status)) = wc {
            // The RECV WQE that took the error completes with it.
            self.rq.pop_front();
            self.completions.push_back(Wc {
                wr_id,
                status,
                opcode: WcOpcode::Recv,
                byte_len: 0,
                imm: None,
                qp_num: self.qpn,
            });
        }
        self.enter_error();
    }

    fn handle_request(&mut self, t: &TransportRepr, flags: u32, payload: &[u8], mem: &mut MrTable) {
        let psn = t.bth.psn;
        let d = psn_diff(psn, self.epsn);
        if d > 0 {
            self.stats.out_of_sequence_received += 1;
            if !self.nak_seq_sent {
                self.nak_seq_sent = true;
                self.stats.seq_naks_sent += 1;
                let epsn = self.epsn;
                self.queue_resp(Resp::Nak {
                    psn: epsn,
                    syndrome: syndrome::NAK_PSN_SEQ,
                });
            }
            return;
        }
        if d < 0 {
            self.handle_duplicate(t, flags, psn, mem);
            return;
        }
        self.nak_seq_sent = false;
        let plen = payload.len() as u32;
        let pos = flags & (op::FIRST | op::MIDDLE | op::LAST);

        // Opcode sequence: a message in progress must continue with its own
        // kind; otherwise only a FIRST or ONLY may start one.
        let continues = pos == op::MIDDLE || pos == op::LAST;
        let seq_ok = match self.in_msg {
            InMsg::None => !continues,
            InMsg::Send { .. } => continues && flags & op::SEND != 0,
            InMsg::Write { .. } => continues && flags & op::WRITE != 0,
        };
        if !seq_ok {
            return self.responder_fatal(psn, syndrome::NAK_INVALID_REQUEST, None);
        }
        // Payload sizes: FIRST and MIDDLE carry exactly one MTU, LAST and
        // ONLY at most one (LAST at least one byte).
        let len_ok = match pos {
            p if p == op::FIRST || p == op::MIDDLE => plen == self.mtu,
            p if p == op::LAST => plen >= 1 && plen <= self.mtu,
            _ => plen <= self.mtu,
        };
        if !len_ok {
            return self.responder_fatal(psn, syndrome::NAK_INVALID_REQUEST, None);
        }
        // A message longer than 2^31 is a length error before any key is
        // looked at (IBA C9-92; rxe's check_length).
        if t.reth
            .is_some_and(|r| r.dma_len as u64 > crate::memory::MAX_MSG_LEN)
        {
            return self.responder_fatal(psn, syndrome::NAK_INVALID_REQUEST, None);
        }

        if flags & op::SEND != 0 {
            if t.ieth.is_some() {
                // No memory windows or invalidation here.
                return self.responder_fatal(psn, syndrome::NAK_INVALID_REQUEST, None);
            }
            let offset = match self.in_msg {
                InMsg::Send { offset } => offset,
                _ => 0,
            };
            let Some(r) = self.rq.front().copied() else {
                return self.rnr_nak(psn);
            };
            if let Err(st) = Self::scatter(
                &r.sges[..r.num_sge as usize],
                mem,
                self.pd,
                offset as usize,
                payload,
            ) {
                let code = if st == WcStatus::LocLenErr {
                    syndrome::NAK_INVALID_REQUEST
                } else {
                    syndrome::NAK_REMOTE_OPERATIONAL
                };
                let st = if st == WcStatus::LocProtErr {
                    WcStatus::LocQpOpErr
                } else {
                    st
                };
                return self.responder_fatal(psn, code, Some((r.wr_id, st)));
            }
            if flags & op::LAST != 0 {
                self.rq.pop_front();
                self.completions.push_back(Wc {
                    wr_id: r.wr_id,
                    status: WcStatus::Success,
                    opcode: WcOpcode::Recv,
                    byte_len: offset + plen,
                    imm: t.imm,
                    qp_num: self.qpn,
                });
                self.in_msg = InMsg::None;
                self.msn = psn_add(self.msn, 1);
            } else {
                self.in_msg = InMsg::Send {
                    offset: offset + plen,
                };
            }
        } else if flags & op::WRITE != 0 {
            let (rkey, va, total, offset, imm_expected) = match self.in_msg {
                InMsg::Write {
                    rkey,
                    va,
                    total,
                    offset,
                    ..
                } => (rkey, va, total, offset, flags & op::IMM != 0),
                _ => {
                    let Some(reth) = t.reth else {
                        return self.responder_fatal(psn, syndrome::NAK_INVALID_REQUEST, None);
                    };
                    (reth.rkey, reth.va, reth.dma_len, 0, flags & op::IMM != 0)
                }
            };
            // The whole message must fit what the RETH announced, and a
            // FIRST must announce more than one packet's worth.
            let end = offset as u64 + plen as u64;
            let last = flags & op::LAST != 0;
            if end > total as u64 || (last && end != total as u64) {
                return self.responder_fatal(psn, syndrome::NAK_INVALID_REQUEST, None);
            }
            if offset == 0 && total > 0 {
                if let Err(e) = mem.resolve(rkey, self.pd, va, total as u64, Access::REMOTE_WRITE) {
                    let _ = e;
                    return self.responder_fatal(psn, syndrome::NAK_REMOTE_ACCESS, None);
                }
                if !self.access.contains(Access::REMOTE_WRITE) {
                    return self.responder_fatal(psn, syndrome::NAK_REMOTE_ACCESS, None);
                }
            }
            // WRITE with immediate consumes a RECV: check before touching memory.
            if last && imm_expected && self.rq.is_empty() {
                return self.rnr_nak(psn);
            }
            if plen > 0 {
                match mem.resolve(
                    rkey,
                    self.pd,
                    va + offset as u64,
                    plen as u64,
                    Access::REMOTE_WRITE,
                ) {
                    Ok(r) => mem.slice_mut(r).copy_from_slice(payload),
                    Err(_) => {
                        // Deregistered mid-message.
                        return self.responder_fatal(psn, syndrome::NAK_REMOTE_ACCESS, None);
                    }
                }
            }
            if last {
                if imm_expected {
                    let r = self.rq.pop_front().expect("checked above");
                    self.completions.push_back(Wc {
                        wr_id: r.wr_id,
                        status: WcStatus::Success,
                        opcode: WcOpcode::RecvRdmaWithImm,
                        byte_len: total,
                        imm: t.imm,
                        qp_num: self.qpn,
                    });
                }
                self.in_msg = InMsg::None;
                self.msn = psn_add(self.msn, 1);
            } else {
                self.in_msg = InMsg::Write {
                    rkey,
                    va,
                    total,
                    offset: end as u32,
                    imm: imm_expected,
                };
            }
        } else if flags & op::READ_REQUEST != 0 {
            let Some(reth) = t.reth else {
                return self.responder_fatal(psn, syndrome::NAK_INVALID_REQUEST, None);
            };
            if self.outstanding_reads() >= self.max_dest_rd_atomic.max(1) as usize {
                return self.responder_fatal(psn, syndrome::NAK_INVALID_REQUEST, None);
            }
            if reth.dma_len > 0 {
                let ok = self.access.contains(Access::REMOTE_READ)
                    && mem
                        .resolve(
                            reth.rkey,
                            self.pd,
                            reth.va,
                            reth.dma_len as u64,
                            Access::REMOTE_READ,
                        )
                        .is_ok();
                if !ok {
                    return self.responder_fatal(psn, syndrome::NAK_REMOTE_ACCESS, None);
                }
            }
            let npkts = self.packets_for(reth.dma_len);
            self.save_res(RdAtomicRes {
                valid: true,
                atomic: false,
                first_psn: psn,
                npkts,
                orig: 0,
            });
            self.queue_resp(Resp::Read {
                psn,
                last_psn: psn_add(psn, npkts - 1),
                va: reth.va,
                rkey: reth.rkey,
                remaining: reth.dma_len,
                first: true,
                replay: false,
            });
            self.epsn = psn_add(self.epsn, npkts);
            self.msn = psn_add(self.msn, 1);
            return;
        } else if flags & op::ATOMIC != 0 {
            let Some(a) = t.atomic_eth else {
                return self.responder_fatal(psn, syndrome::NAK_INVALID_REQUEST, None);
            };
            if self.outstanding_reads() >= self.max_dest_rd_atomic.max(1) as usize {
                return self.responder_fatal(psn, syndrome::NAK_INVALID_REQUEST, None);
            }
            if !self.access.contains(Access::REMOTE_ATOMIC) {
                return self.responder_fatal(psn, syndrome::NAK_REMOTE_ACCESS, None);
            }
            let r = match mem.resolve_atomic(a.rkey, self.pd, a.va) {
                Ok(r) => r,
                Err(AccessError::Unaligned) => {
                    return self.responder_fatal(psn, syndrome::NAK_INVALID_REQUEST, None)
                }
                Err(_) => return self.responder_fatal(psn, syndrome::NAK_REMOTE_ACCESS, None),
            };
            let opn = if t.bth.opcode == opcode::RC_COMPARE_SWAP {
                AtomicOp::CmpSwap {
                    compare: a.compare,
                    swap: a.swap_add,
                }
            } else {
                AtomicOp::FetchAdd(a.swap_add)
            };
            let orig = mem.atomic(r, opn);
            self.save_res(RdAtomicRes {
                valid: true,
                atomic: true,
                first_psn: psn,
                npkts: 1,
                orig,
            });
            self.queue_resp(Resp::AtomicAck {
                psn,
                orig,
                replay: false,
            });
            self.epsn = psn_add(self.epsn, 1);
            self.msn = psn_add(self.msn, 1);
            return;
        } else {
            self.stats.dropped += 1;
            return;
        }
        self.epsn = psn_add(self.epsn, 1);
        if t.bth.ack_req {
            self.pending_ack = Some(psn);
        }
    }

    fn outstanding_reads(&self) -> usize {
        self.resp_q
            .iter()
            .filter(|r| {
                matches!(
                    r,
                    Resp::Read { replay: false, .. } | Resp::AtomicAck { replay: false, .. }
                )
            })
            .count()
    }

    fn save_res(&mut self, r: RdAtomicRes) {
        let n = self.max_dest_rd_atomic.max(1) as usize;
        self.res[self.res_next % n] = r;
        self.res_next = (self.res_next + 1) % n;
    }

    fn rnr_nak(&mut self, psn: u32) {
        self.stats.rnr_naks_sent += 1;
        let code = syndrome::RNR_NAK | (self.min_rnr_timer & 0x1f);
        // An RNR NAK is not sticky: the requester retries this very PSN.
        self.pending_ack = None;
        self.queue_resp(Resp::Nak {
            psn,
            syndrome: code,
        });
    }

    fn handle_duplicate(&mut self, t: &TransportRepr, flags: u32, psn: u32, mem: &MrTable) {
        self.stats.duplicates_received += 1;
        if flags & (op::SEND | op::WRITE) != 0 {
            // Already applied: never apply twice, but answer every duplicate
            // (IBA C9-105, as rxe's duplicate_request() does, AckReq or not)
            // so that a requester whose ACKs were lost learns how far we are.
            // ACKs coalesce, so a retransmitted burst costs one ACK.
            self.pending_ack = Some(psn_add(self.epsn, MASK_24));
            return;
        }
        let n = self.max_dest_rd_atomic.max(1) as usize;
        let found = self.res[..n].iter().copied().find(|r| {
            r.valid && {
                let d = psn_diff(psn, r.first_psn);
                d >= 0 && (d as u32) < r.npkts
            }
        });
        let Some(res) = found else {
            self.stats.dropped += 1;
            return;
        };
        if flags & op::ATOMIC != 0 {
            if res.atomic && res.first_psn == psn {
                // Replay the saved result; never execute twice.
                self.queue_resp(Resp::AtomicAck {
                    psn,
                    orig: res.orig,
                    replay: true,
                });
            } else {
                self.stats.dropped += 1;
            }
            return;
        }
        let Some(reth) = t.reth else {
            self.stats.dropped += 1;
            return;
        };
        // A duplicate READ is executed again, possibly for the tail of the
        // original: it must end where the original ended.
        let npkts = self.packets_for(reth.dma_len);
        let ends = psn_add(psn, npkts) == psn_add(res.first_psn, res.npkts);
        let allowed = self.access.contains(Access::REMOTE_READ)
            && (reth.dma_len == 0
                || mem
                    .resolve(
                        reth.rkey,
                        self.pd,
                        reth.va,
                        reth.dma_len as u64,
                        Access::REMOTE_READ,
                    )
                    .is_ok());
        if res.atomic || !ends || !allowed {
            self.stats.dropped += 1;
            return;
        }
        self.queue_resp(Resp::Read {
            psn,
            last_psn: psn_add(psn, npkts - 1),
            va: reth.va,
            rkey: reth.rkey,
            remaining: reth.dma_len,
            first: true,
            replay: true,
        });
    }

    // ------------------------------------------------------------ completer

    fn handle_response(
        &mut self,
        now: Nanos,
        t: &TransportRepr,
        flags: u32,
        payload: &[u8],
        mem: &mut MrTable,
    ) {
        let psn = t.bth.psn;
        // Only PSNs we have sent and not yet seen answered are meaningful.
        let oldest = self.oldest_unacked_psn();
        if !self.has_outstanding()
            || psn_diff(psn, self.max_sent_psn) >= 0
            || psn_diff(psn, oldest) < -1
        {
            self.stats.dropped += 1;
            return;
        }
        if flags & op::ACK != 0 {
            let Some(aeth) = t.aeth else {
                self.stats.dropped += 1;
                return;
            };
            let received = match Syndrome::decode(aeth.syndrome) {
                Syndrome::Ack { .. } => psn,
                _ => psn_add(psn, MASK_24),
            };
            self.note_received(received);
            match Syndrome::decode(aeth.syndrome) {
                Syndrome::Ack { .. } => {
                    if self.ack_through(psn, now) {
                        self.progress(now);
                    }
                }
                Syndrome::RnrNak { timer } => {
                    self.stats.rnr_naks_received += 1;
                    if self.ack_through(psn_add(psn, MASK_24), now) {
                        self.progress(now);
                    }
                    if self.rnr_until.is_some() && self.nak_rewind_psn == Some(psn) {
                        // Already waiting to resend this PSN.
                    } else if self.rnr_left == 0 {
                        self.fail_front(WcStatus::RnrRetryExcErr);
                    } else {
                        if self.rnr_left != 7 {
                            self.rnr_left -= 1;
                        }
                        self.rewind(psn);
                        self.nak_rewind_psn = Some(psn);
                        self.rnr_until = Some(now + rnr_timer_ns(timer));
                        self.rto_deadline = None;
                    }
                }
                Syndrome::Nak(NakCode::PsnSequenceError) => {
                    self.stats.seq_naks_received += 1;
                    if self.ack_through(psn_add(psn, MASK_24), now) {
                        self.progress(now);
                    }
                    if self.nak_rewind_psn == Some(psn) {
                        // Same gap, already handled.
                    } else if self.retry_left == 0 {
                        self.fail_front(WcStatus::RetryExcErr);
                    } else {
                        self.retry_left -= 1;
                        self.retransmit_from(psn);
                        self.nak_rewind_psn = Some(psn);
                        self.arm_rto(now);
                    }
                }
                Syndrome::Nak(code) => {
                    self.ack_through(psn_add(psn, MASK_24), now);
                    let status = match code {
                        NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                        NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                        _ => WcStatus::RemInvReqErr,
                    };
                    self.fail_front(status);
                }
                Syndrome::Reserved(_) => self.stats.dropped += 1,
            }
        } else if flags & op::READ_RESPONSE != 0 {
            if self.ack_through(psn_add(psn, MASK_24), now) {
                self.progress(now);
            }
            let Some(idx) = self.sq.iter().position(|w| !w.done) else {
                self.stats.dropped += 1;
                return;
            };
            let w = self.sq[idx];
            if !w.started || w.opcode != WrOpcode::RdmaRead {
                self.stats.dropped += 1;
                return;
            }
            let expected = psn_add(w.first_psn, w.resp_pkts);
            let d = psn_diff(psn, expected);
            if d < 0 {
                self.stats.duplicates_received += 1;
                return;
            }
            if d > 0 {
                // A response went missing: ask again from it, once per gap.
                self.stats.out_of_sequence_received += 1;
                self.go_back(expected, now);
                return;
            }
            let k = w.resp_pkts;
            let last = k + 1 == w.npkts;
            let off = k * self.mtu;
            let want = if last { w.length - off } else { self.mtu };
            let last_opc = flags & op::LAST != 0;
            if payload.len() as u32 != want || last_opc != last {
                self.stats.errors += 1;
                self.stats.dropped += 1;
                return;
            }
            if let Err(st) = Self::scatter(
                &w.sges[..w.num_sge as usize],
                mem,
                self.pd,
                off as usize,
                payload,
            ) {
                self.sq[idx].done = true;
                self.sq[idx].status = st;
                self.complete_done();
                return;
            }
            self.sq[idx].resp_pkts += 1;
            self.note_received(psn);
            if last {
                self.sq[idx].done = true;
                self.rd_atomic_inflight = self.rd_atomic_inflight.saturating_sub(1);
            }
            self.progress(now);
        } else if flags & op::ATOMIC_ACK != 0 {
            if self.ack_through(psn_add(psn, MASK_24), now) {
                self.progress(now);
            }
            let Some(idx) = self.sq.iter().position(|w| !w.done) else {
                self.stats.dropped += 1;
                return;
            };
            let w = self.sq[idx];
            if !w.started || !w.opcode.is_atomic() {
                self.stats.dropped += 1;
                return;
            }
            let d = psn_diff(psn, w.first_psn);
            if d < 0 {
                self.stats.duplicates_received += 1;
                return;
            }
            if d > 0 {
                self.go_back(w.first_psn, now);
                return;
            }
            let orig = t.atomic_ack.unwrap_or(0);
            if let Err(st) = Self::scatter(
                &w.sges[..w.num_sge as usize],
                mem,
                self.pd,
                0,
                &orig.to_ne_bytes(),
            ) {
                self.sq[idx].done = true;
                self.sq[idx].status = st;
                self.complete_done();
                return;
            }
            self.sq[idx].resp_pkts = 1;
            self.note_received(psn);
            self.sq[idx].done = true;
            self.rd_atomic_inflight = self.rd_atomic_inflight.saturating_sub(1);
            self.progress(now);
        } else {
            self.stats.dropped += 1;
        }
        self.complete_done();
    }

    fn note_received(&mut self, psn: u32) {
        if psn_diff(psn, self.acked_psn) > 0 && psn_diff(psn, self.max_sent_psn) < 0 {
            self.acked_psn = psn;
            self.retry_left = self.retry_cnt;
            self.rnr_left = self.rnr_retry;
            if self.window != u32::MAX {
                self.window = self.window.saturating_mul(2);
                if self.window >= WINDOW_OPEN {
                    self.window = u32::MAX;
                }
            }
        }
    }

    /// Retransmit from `psn` after a gap in responses, once per gap.
    fn go_back(&mut self, psn: u32, now: Nanos) {
        if self.retry_pending {
            return;
        }
        self.retry_pending = true;
        if self.retry_left == 0 {
            self.fail_front(WcStatus::RetryExcErr);
            return;
        }
        self.retry_left -= 1;
        self.retransmit_from(psn);
        self.arm_rto(now);
    }

    fn progress(&mut self, now: Nanos) {
        self.retry_left = self.retry_cnt;
        self.rnr_left = self.rnr_retry;
        self.retry_pending = false;
        self.complete_done();
        if self
            .nak_rewind_psn
            .is_some_and(|p| psn_diff(self.oldest_unacked_psn(), p) > 0)
        {
            self.nak_rewind_psn = None;
        }
        self.rto_deadline = None;
        self.arm_rto(now);
    }

    /// Marks SEND/WRITE WQEs whose last PSN is at or before `psn` done.
    /// A READ or atomic that the ACK passes without its response having
    /// arrived lost that response: go back for it. Returns whether anything
    /// new was acknowledged.
    fn ack_through(&mut self, psn: u32, now: Nanos) -> bool {
        let mut any = false;
        let mut go_back_to = None;
        for w in self.sq.iter_mut() {
            if !w.started {
                break;
            }
            if w.done {
                continue;
            }
            if psn_diff(w.last_psn(), psn) > 0 {
                break;
            }
            if w.opcode.is_rd_atomic() {
                go_back_to = Some(psn_add(w.first_psn, w.resp_pkts));
                break;
            }
            w.done = true;
            any = true;
        }
        if any {
            // Skip the transmit cursor past what the peer already has.
            let next = psn_add(psn, 1);
            let cur_started = self.sq.get(self.cur).is_some_and(|w| w.started);
            if cur_started && psn_diff(self.cur_psn, next) < 0 {
                self.rewind(next);
            }
        }
        if let Some(p) = go_back_to {
            self.go_back(p, now);
        }
        any
    }

    /// Pops finished WQEs off the head of the send queue, in order.
    fn complete_done(&mut self) {
        while let Some(w) = self.sq.front() {
            if !w.done {
                break;
            }
            let status = w.status;
            send_wc(&mut self.completions, self.qpn, w, status, false);
            self.sq.pop_front();
            self.cur = self.cur.saturating_sub(1);
            if status != WcStatus::Success {
                self.enter_error();
                return;
            }
        }
    }

    /// The oldest outstanding WQE fails with `status`; the QP goes to ERR and
    /// the rest are flushed.
    fn fail_front(&mut self, status: WcStatus) {
        self.stats.errors += 1;
        if let Some(w) = self.sq.iter_mut().find(|w| !w.done) {
            w.done = true;
            w.status = status;
        }
        self.complete_done();
        if self.state != QpState::Err {
            self.enter_error();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers() {
        assert_eq!(ack_timeout_ns(0), None);
        assert_eq!(ack_timeout_ns(14), Some(67_108_864));
        assert_eq!(rnr_timer_ns(0), 655_360_000);
        assert_eq!(rnr_timer_ns(1), 10_000);
        assert_eq!(rnr_timer_ns(12), 640_000);
        assert_eq!(rnr_timer_ns(31), 491_520_000);
    }

    #[test]
    fn state_machine_checks_attributes() {
        let mut qp = Qp::new(0x11, 1, QpCap::default());
        let e = qp
            .modify(&QpAttr {
                qp_state: Some(QpState::Rtr),
                ..Default::default()
            })
            .unwrap_err();
        assert_eq!(
            e,
            ModifyError::InvalidTransition {
                from: QpState::Reset,
                to: QpState::Rtr
            }
        );
        let e = qp
            .modify(&QpAttr {
                qp_state: Some(QpState::Init),
                pkey_index: Some(0),
                port_num: Some(1),
                ..Default::default()
            })
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "RESET -> INIT requires attribute qp_access_flags"
        );
        let e = qp
            .modify(&QpAttr {
                qp_state: Some(QpState::Init),
                pkey_index: Some(0),
                port_num: Some(1),
                qp_access_flags: Some(Access::ALL),
                sq_psn: Some(1),
                ..Default::default()
            })
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "RESET -> INIT does not allow attribute sq_psn"
        );
        qp.modify(&QpAttr {
            qp_state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            qp_access_flags: Some(Access::ALL),
            ..Default::default()
        })
        .unwrap();
        let e = qp
            .modify(&QpAttr {
                qp_state: Some(QpState::Rtr),
                dest_gid: Some([0; 16]),
                path_mtu: Some(1000),
                dest_qp_num: Some(1),
                rq_psn: Some(0),
                max_dest_rd_atomic: Some(1),
                min_rnr_timer: Some(12),
                ..Default::default()
            })
            .unwrap_err();
        assert!(matches!(
            e,
            ModifyError::BadValue {
                attr: "path_mtu",
                ..
            }
        ));
        assert_eq!(
            qp.state(),
            QpState::Init,
            "a refused modify changes nothing"
        );
        assert_eq!(
            qp.post_send(&SendWr::new(1, WrOpcode::Send, &[])),
            Err(PostError::BadState(QpState::Init))
        );
    }
}
