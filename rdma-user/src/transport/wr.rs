//! Work requests and work completions as the verbs define them
//! (`ibv_send_wr`, `ibv_recv_wr`, `ibv_wc`): what is posted to a QP and what
//! comes back. Plain data; the roles of [`super::QpEngine`] give it meaning.

use std::fmt;

use super::QpState;

pub const MAX_SGE: usize = 8;
pub const MAX_INLINE: usize = 256;

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
    /// READ or atomic: the responder answers with data (and inline data
    /// does not apply).
    pub fn is_rd_atomic(self) -> bool {
        matches!(
            self,
            WrOpcode::RdmaRead | WrOpcode::CmpSwap | WrOpcode::FetchAdd
        )
    }
    pub(super) fn is_atomic(self) -> bool {
        matches!(self, WrOpcode::CmpSwap | WrOpcode::FetchAdd)
    }
    pub(super) fn wc_opcode(self) -> WcOpcode {
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

/// Where a UD send goes (`ibv_send_wr.wr.ud`): an address handle of the
/// device, the destination QP and its Q_Key. A Q_Key with the high bit set
/// means "the sending QP's own" (IBA 10.2.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UdDest {
    pub ah: u32,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
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
    /// UD only: the destination.
    pub ud: Option<UdDest>,
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
            ud: None,
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
    /// The QP's transport has no such operation (UD: only SEND).
    BadOpcode,
    /// A UD send without a destination.
    NoAddress,
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PostError::BadState(s) => write!(f, "QP is in state {s}"),
            PostError::QueueFull => f.write_str("work queue is full"),
            PostError::TooManySge => write!(f, "more than {MAX_SGE} scatter/gather entries"),
            PostError::InlineTooLong => write!(f, "inline data longer than {MAX_INLINE} bytes"),
            PostError::BadAtomicLength => f.write_str("atomic operations need one 8-byte SGE"),
            PostError::BadOpcode => f.write_str("a UD QP sends only SEND and SEND_WITH_IMM"),
            PostError::NoAddress => f.write_str("a UD send needs an address handle"),
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
    /// Every status with its `IBV_WC_*` name (without the prefix) and the
    /// text rdma-core's `ibv_wc_status_str` prints: the one table of names.
    pub(super) const TABLE: [(WcStatus, &'static str, &'static str); 10] = [
        (WcStatus::Success, "success", "success"),
        (WcStatus::LocLenErr, "LOC_LEN_ERR", "local length error"),
        (
            WcStatus::LocQpOpErr,
            "LOC_QP_OP_ERR",
            "local QP operation error",
        ),
        (
            WcStatus::LocProtErr,
            "LOC_PROT_ERR",
            "local protection error",
        ),
        (
            WcStatus::WrFlushErr,
            "WR_FLUSH_ERR",
            "Work Request Flushed Error",
        ),
        (
            WcStatus::RemInvReqErr,
            "REM_INV_REQ_ERR",
            "remote invalid request error",
        ),
        (
            WcStatus::RemAccessErr,
            "REM_ACCESS_ERR",
            "remote access error",
        ),
        (WcStatus::RemOpErr, "REM_OP_ERR", "remote operation error"),
        (
            WcStatus::RetryExcErr,
            "RETRY_EXC_ERR",
            "transport retry counter exceeded",
        ),
        (
            WcStatus::RnrRetryExcErr,
            "RNR_RETRY_EXC_ERR",
            "RNR retry counter exceeded",
        ),
    ];

    fn row(self) -> &'static (WcStatus, &'static str, &'static str) {
        Self::TABLE
            .iter()
            .find(|r| r.0 == self)
            .expect("every status has a row")
    }

    /// The `IBV_WC_*` name without its prefix ("success" for success), as
    /// the CLI and the daemon's JSON spell it.
    pub fn name(self) -> &'static str {
        self.row().1
    }

    /// The text rdma-core's `ibv_wc_status_str` prints.
    pub fn as_str(self) -> &'static str {
        self.row().2
    }

    /// The status of a [`WcStatus::name`]; None for a name that is none.
    pub fn from_name(name: &str) -> Option<WcStatus> {
        Self::TABLE.iter().find(|r| r.1 == name).map(|r| r.0)
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

impl WcOpcode {
    /// Every opcode with its `IBV_WC_*` name without the prefix.
    pub(super) const TABLE: [(WcOpcode, &'static str); 7] = [
        (WcOpcode::Send, "SEND"),
        (WcOpcode::RdmaWrite, "RDMA_WRITE"),
        (WcOpcode::RdmaRead, "RDMA_READ"),
        (WcOpcode::CompSwap, "COMP_SWAP"),
        (WcOpcode::FetchAdd, "FETCH_ADD"),
        (WcOpcode::Recv, "RECV"),
        (WcOpcode::RecvRdmaWithImm, "RECV_RDMA_WITH_IMM"),
    ];

    pub fn name(self) -> &'static str {
        Self::TABLE
            .iter()
            .find(|r| r.0 == self)
            .map(|r| r.1)
            .expect("every opcode has a row")
    }

    pub fn from_name(name: &str) -> Option<WcOpcode> {
        Self::TABLE.iter().find(|r| r.1 == name).map(|r| r.0)
    }
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
    /// A receive completion of a message with the Solicited Event bit
    /// (what `ibv_req_notify_cq(cq, 1)` waits for).
    pub solicited: bool,
    /// UD receives: the sender's QPN (DETH), and a GRH in the buffer's
    /// first 40 bytes (`IBV_WC_GRH`) from a packet of this network type.
    pub src_qp: u32,
    pub grh: Option<NetworkType>,
}

/// The network header a RoCEv2 packet came with (the kernel's
/// `rdma_network_type`): it decides where the receive buffer's 40 GRH
/// bytes hold the destination address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkType {
    Ipv4,
    Ipv6,
}
