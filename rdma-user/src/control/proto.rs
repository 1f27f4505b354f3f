//! The control protocol between the CLI and the daemon: one JSON object per
//! line each way. Unknown fields and malformed lines are rejected.
//!
//! Types and names only; nothing here touches the data path.

use serde::{Deserialize, Serialize};

use anyhow::{anyhow, bail, Result};

use crate::transport::{NetworkType, Wc, WcOpcode, WcStatus};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    Stats,
    MrReg {
        len: usize,
        access: String,
        /// In the MR pool, where the XDP program can place WRITEs.
        #[serde(default)]
        pool: bool,
    },
    MrList,
    MrDereg {
        key: String,
    },
    MrRead {
        key: String,
        offset: u64,
        len: u64,
    },
    MrWrite {
        key: String,
        offset: u64,
        data: String,
    },
    QpCreate {
        depth: Option<u32>,
        /// "rc" (the default) or "ud".
        qp_type: Option<String>,
        /// UD: the QP's Q_Key (default 0x11111111, perftest's).
        qkey: Option<u32>,
        /// Receive WRs come from this SRQ.
        srq: Option<u32>,
    },
    /// An address handle for UD sends to `remote_ip`.
    AhCreate {
        remote_ip: String,
        remote_mac: Option<String>,
    },
    AhDestroy {
        ah: u32,
    },
    SrqCreate {
        depth: Option<u32>,
        /// Raise the limit event below this many WRs (0: never).
        limit: Option<u32>,
    },
    /// A receive buffer for the SRQ: `len` bytes at `offset` of MR `key`.
    SrqPost {
        srq: u32,
        key: String,
        offset: u64,
        len: u64,
    },
    SrqDestroy {
        srq: u32,
    },
    QpDestroy {
        qpn: u32,
    },
    /// Connect with known remote values.
    QpConnect {
        qpn: u32,
        remote_ip: String,
        remote_qpn: u32,
        remote_psn: u32,
        remote_mac: Option<String>,
        psn: Option<u32>,
        mtu: Option<u32>,
    },
    /// Connect by exchanging details with the peer's daemon over TCP.
    QpPeer {
        qpn: u32,
        peer: String,
        remote_qpn: u32,
        mtu: Option<u32>,
    },
    QpList,
    Post(Post),
    CqPoll {
        qpn: u32,
        max: Option<usize>,
        wait_ms: Option<u64>,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Post {
    pub op: String,
    pub qpn: u32,
    /// Local MR (lkey or rkey).
    pub key: String,
    pub offset: u64,
    pub len: Option<u64>,
    /// Bytes to place at `offset` first (then `len` is their length).
    pub data: Option<String>,
    pub remote_addr: Option<u64>,
    pub rkey: Option<String>,
    pub imm: Option<u32>,
    pub compare: Option<u64>,
    pub swap: Option<u64>,
    pub add: Option<u64>,
    pub timeout_ms: Option<u64>,
    #[serde(default)]
    pub no_wait: bool,
    /// UD sends: the address handle, destination QP and its Q_Key
    /// (default: the sending QP's own).
    pub ah: Option<u32>,
    pub remote_qpn: Option<u32>,
    pub remote_qkey: Option<u32>,
}

/// A work completion as the CLI shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct WcJson {
    pub wr_id: u64,
    pub status: String,
    pub opcode: String,
    pub byte_len: u32,
    pub imm: Option<u32>,
    pub qp_num: u32,
    /// UD receives: the sender's QPN; the buffer starts with a 40-byte GRH.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src_qp: Option<u32>,
    /// UD receives: the network header of the packet (ipv4 or ipv6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkType>,
}

impl From<&Wc> for WcJson {
    fn from(w: &Wc) -> Self {
        WcJson {
            wr_id: w.wr_id,
            status: w.status.name().into(),
            opcode: w.opcode.name().into(),
            byte_len: w.byte_len,
            imm: w.imm,
            qp_num: w.qp_num,
            src_qp: w.grh.map(|_| w.src_qp),
            network: w.grh,
        }
    }
}

impl WcJson {
    /// The completion back; an unknown status or opcode name is an error,
    /// never a guess.
    pub fn to_wc(&self) -> Result<Wc> {
        Ok(Wc {
            wr_id: self.wr_id,
            status: WcStatus::from_name(&self.status)
                .ok_or_else(|| anyhow!("unknown completion status '{}'", self.status))?,
            opcode: WcOpcode::from_name(&self.opcode)
                .ok_or_else(|| anyhow!("unknown completion opcode '{}'", self.opcode))?,
            byte_len: self.byte_len,
            imm: self.imm,
            qp_num: self.qp_num,
            solicited: false,
            src_qp: self.src_qp.unwrap_or(0),
            grh: self.network,
        })
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn unhex(s: &str) -> Result<Vec<u8>> {
    let t: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    let t = t.strip_prefix("0x").unwrap_or(&t);
    if !t.len().is_multiple_of(2) {
        bail!("hex data has an odd number of digits");
    }
    (0..t.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&t[i..i + 2], 16)
                .map_err(|_| anyhow!("'{}' is not hex", &t[i..i + 2]))
        })
        .collect()
}
