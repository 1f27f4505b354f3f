//! The control protocol between the CLI and the daemon: one JSON object per
//! line each way. Unknown fields and malformed lines are rejected.
//!
//! Types and names only; nothing here touches the data path.

use serde::{Deserialize, Serialize};

use anyhow::{anyhow, bail, Result};

use crate::transport::{Wc, WcOpcode, WcStatus};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    Stats,
    MrReg {
        len: usize,
        access: String,
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
            src_qp: 0,
            grh: false,
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
