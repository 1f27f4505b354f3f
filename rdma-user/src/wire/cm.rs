//! Communication Management MADs (IBA vol. 1 ch. 12, ch. 13.4) as RoCEv2
//! carries them: a 256-byte MAD in a UD SEND_ONLY to QP 1.
//!
//! [`MadHeader`] is the common 24-byte management header; [`CmMessage`]
//! is one of the CM attributes (REQ, MRA, REJ, REP, RTU, DREQ, DREP,
//! SIDR_REQ, SIDR_REP) in the 232 bytes after it. Each attribute's
//! `parse`/`emit` place every field at its IBA offset, so a message
//! received re-emits byte for byte ([`CmMad::parse`] then
//! [`CmMad::emit`]), reserved bits included where the spec gives them a
//! value. [`CmaHeader`] is the rdma_cm header at the start of a REQ's
//! (or SIDR_REQ's) private data.

use core::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A MAD is 256 bytes on the wire.
pub const MAD_LEN: usize = 256;
/// The common header before the attribute data.
pub const MAD_HEADER_LEN: usize = 24;
/// The attribute data: what follows the header.
pub const CM_DATA_LEN: usize = MAD_LEN - MAD_HEADER_LEN;

/// The Q_Key every QP1 datagram carries (GSI, C9-50.1.1).
pub const GSI_QKEY: u32 = 0x8001_0000;
/// Base version 1, management class CM (0x07), class version 2.
pub const MAD_BASE_VERSION: u8 = 1;
pub const MGMT_CLASS_CM: u8 = 0x07;
pub const CM_CLASS_VERSION: u8 = 2;
/// The CM sends everything with method Send.
pub const METHOD_SEND: u8 = 0x03;

/// CM attribute ids.
pub mod attr {
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    pub const REQ: u16 = 0x0010;
    pub const MRA: u16 = 0x0011;
    pub const REJ: u16 = 0x0012;
    pub const REP: u16 = 0x0013;
    pub const RTU: u16 = 0x0014;
    pub const DREQ: u16 = 0x0015;
    pub const DREP: u16 = 0x0016;
    pub const SIDR_REQ: u16 = 0x0017;
    pub const SIDR_REP: u16 = 0x0018;
    pub const LAP: u16 = 0x0019;
    pub const APR: u16 = 0x001a;
}

/// Private data lengths (IBA table 99 and its neighbours).
pub const REQ_PRIVATE_LEN: usize = 92;
pub const MRA_PRIVATE_LEN: usize = 222;
pub const REJ_PRIVATE_LEN: usize = 148;
pub const REP_PRIVATE_LEN: usize = 196;
pub const RTU_PRIVATE_LEN: usize = 224;
pub const DREQ_PRIVATE_LEN: usize = 220;
pub const DREP_PRIVATE_LEN: usize = 224;
pub const SIDR_REQ_PRIVATE_LEN: usize = 216;
pub const SIDR_REP_PRIVATE_LEN: usize = 136;
/// REJ's Additional Rejection Information.
pub const REJ_ARI_LEN: usize = 72;

/// Why a MAD was not accepted as a CM message. Each is counted apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MadError {
    /// Not 256 bytes.
    BadLength,
    /// Base version is not 1.
    BadBaseVersion,
    /// Management class is not CM (0x07).
    NotCm,
    /// CM class version is not 2.
    BadClassVersion,
    /// A method other than Send (the CM uses no other).
    BadMethod,
    /// An attribute id the CM does not know (or LAP/APR, not offered).
    UnknownAttribute,
}

impl fmt::Display for MadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MadError::BadLength => "MAD is not 256 bytes",
            MadError::BadBaseVersion => "MAD base version is not 1",
            MadError::NotCm => "management class is not CM",
            MadError::BadClassVersion => "CM class version is not 2",
            MadError::BadMethod => "CM method is not Send",
            MadError::UnknownAttribute => "unknown CM attribute",
        })
    }
}
impl std::error::Error for MadError {}

fn be16(b: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([b[o], b[o + 1]])
}
fn be24(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([0, b[o], b[o + 1], b[o + 2]])
}
fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes(b[o..o + 4].try_into().unwrap())
}
fn be64(b: &[u8], o: usize) -> u64 {
    u64::from_be_bytes(b[o..o + 8].try_into().unwrap())
}
fn put16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_be_bytes());
}
fn put24(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}
fn put32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_be_bytes());
}
fn put64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_be_bytes());
}
fn gid(b: &[u8], o: usize) -> [u8; 16] {
    b[o..o + 16].try_into().unwrap()
}
fn private<const N: usize>(b: &[u8], o: usize) -> [u8; N] {
    b[o..o + N].try_into().unwrap()
}

/// The common MAD header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MadHeader {
    pub base_version: u8,
    pub mgmt_class: u8,
    pub class_version: u8,
    pub method: u8,
    pub status: u16,
    pub class_specific: u16,
    /// Opaque to the receiver: a reply echoes it.
    pub tid: u64,
    pub attr_id: u16,
    pub attr_mod: u32,
}

impl MadHeader {
    /// A CM Send header.
    pub fn cm(attr_id: u16, tid: u64) -> MadHeader {
        MadHeader {
            base_version: MAD_BASE_VERSION,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            status: 0,
            class_specific: 0,
            tid,
            attr_id,
            attr_mod: 0,
        }
    }

    pub fn parse(b: &[u8]) -> Result<MadHeader, MadError> {
        if b.len() < MAD_HEADER_LEN {
            return Err(MadError::BadLength);
        }
        Ok(MadHeader {
            base_version: b[0],
            mgmt_class: b[1],
            class_version: b[2],
            method: b[3],
            status: be16(b, 4),
            class_specific: be16(b, 6),
            tid: be64(b, 8),
            attr_id: be16(b, 16),
            attr_mod: be32(b, 20),
        })
    }

    pub fn emit(&self, b: &mut [u8]) {
        b[0] = self.base_version;
        b[1] = self.mgmt_class;
        b[2] = self.class_version;
        b[3] = self.method;
        put16(b, 4, self.status);
        put16(b, 6, self.class_specific);
        put64(b, 8, self.tid);
        put16(b, 16, self.attr_id);
        put16(b, 18, 0);
        put32(b, 20, self.attr_mod);
    }
}

/// A REQ's primary (or alternate) path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmPath {
    pub local_lid: u16,
    pub remote_lid: u16,
    pub local_gid: [u8; 16],
    pub remote_gid: [u8; 16],
    pub flow_label: u32,
    pub packet_rate: u8,
    pub traffic_class: u8,
    pub hop_limit: u8,
    pub sl: u8,
    pub subnet_local: bool,
    /// 4.096 µs · 2^n.
    pub local_ack_timeout: u8,
}

impl CmPath {
    const LEN: usize = 44;

    fn parse(b: &[u8]) -> CmPath {
        let w = be32(b, 36);
        CmPath {
            local_lid: be16(b, 0),
            remote_lid: be16(b, 2),
            local_gid: gid(b, 4),
            remote_gid: gid(b, 20),
            flow_label: w >> 12,
            packet_rate: (w & 0x3f) as u8,
            traffic_class: b[40],
            hop_limit: b[41],
            sl: b[42] >> 4,
            subnet_local: b[42] & 0x08 != 0,
            local_ack_timeout: b[43] >> 3,
        }
    }

    fn emit(&self, b: &mut [u8]) {
        put16(b, 0, self.local_lid);
        put16(b, 2, self.remote_lid);
        b[4..20].copy_from_slice(&self.local_gid);
        b[20..36].copy_from_slice(&self.remote_gid);
        put32(
            b,
            36,
            (self.flow_label & 0xf_ffff) << 12 | (self.packet_rate & 0x3f) as u32,
        );
        b[40] = self.traffic_class;
        b[41] = self.hop_limit;
        b[42] = (self.sl & 0xf) << 4 | (self.subnet_local as u8) << 3;
        b[43] = (self.local_ack_timeout & 0x1f) << 3;
    }
}

/// ConnectRequest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Req {
    pub local_comm_id: u32,
    pub service_id: u64,
    pub local_ca_guid: u64,
    pub local_qkey: u32,
    pub local_qpn: u32,
    pub responder_resources: u8,
    pub local_eecn: u32,
    pub initiator_depth: u8,
    pub remote_eecn: u32,
    /// 4.096 µs · 2^n, how long the remote CM may take to answer.
    pub remote_cm_response_timeout: u8,
    /// 0 RC, 1 UC, 3 RD.
    pub transport_type: u8,
    pub end_to_end_flow_control: bool,
    pub starting_psn: u32,
    pub local_cm_response_timeout: u8,
    pub retry_count: u8,
    pub pkey: u16,
    /// IBA MTU code (1 = 256 .. 5 = 4096).
    pub path_mtu: u8,
    pub rdc_exists: bool,
    pub rnr_retry_count: u8,
    pub max_cm_retries: u8,
    pub srq: bool,
    pub extended_transport: u8,
    pub primary: CmPath,
    pub alternate: CmPath,
    pub private_data: [u8; REQ_PRIVATE_LEN],
}

impl Req {
    fn parse(b: &[u8]) -> Req {
        Req {
            local_comm_id: be32(b, 0),
            service_id: be64(b, 8),
            local_ca_guid: be64(b, 16),
            local_qkey: be32(b, 28),
            local_qpn: be24(b, 32),
            responder_resources: b[35],
            local_eecn: be24(b, 36),
            initiator_depth: b[39],
            remote_eecn: be24(b, 40),
            remote_cm_response_timeout: b[43] >> 3,
            transport_type: (b[43] >> 1) & 3,
            end_to_end_flow_control: b[43] & 1 != 0,
            starting_psn: be24(b, 44),
            local_cm_response_timeout: b[47] >> 3,
            retry_count: b[47] & 7,
            pkey: be16(b, 48),
            path_mtu: b[50] >> 4,
            rdc_exists: b[50] & 8 != 0,
            rnr_retry_count: b[50] & 7,
            max_cm_retries: b[51] >> 4,
            srq: b[51] & 8 != 0,
            extended_transport: b[51] & 7,
            primary: CmPath::parse(&b[52..52 + CmPath::LEN]),
            alternate: CmPath::parse(&b[96..96 + CmPath::LEN]),
            private_data: private(b, 140),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        put32(b, 0, self.local_comm_id);
        put64(b, 8, self.service_id);
        put64(b, 16, self.local_ca_guid);
        put32(b, 28, self.local_qkey);
        put24(b, 32, self.local_qpn);
        b[35] = self.responder_resources;
        put24(b, 36, self.local_eecn);
        b[39] = self.initiator_depth;
        put24(b, 40, self.remote_eecn);
        b[43] = (self.remote_cm_response_timeout & 0x1f) << 3
            | (self.transport_type & 3) << 1
            | self.end_to_end_flow_control as u8;
        put24(b, 44, self.starting_psn);
        b[47] = (self.local_cm_response_timeout & 0x1f) << 3 | (self.retry_count & 7);
        put16(b, 48, self.pkey);
        b[50] =
            (self.path_mtu & 0xf) << 4 | (self.rdc_exists as u8) << 3 | (self.rnr_retry_count & 7);
        b[51] = (self.max_cm_retries & 0xf) << 4
            | (self.srq as u8) << 3
            | (self.extended_transport & 7);
        self.primary.emit(&mut b[52..52 + CmPath::LEN]);
        self.alternate.emit(&mut b[96..96 + CmPath::LEN]);
        b[140..].copy_from_slice(&self.private_data);
    }
}

/// ConnectReply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rep {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub local_qkey: u32,
    pub local_qpn: u32,
    pub local_eecn: u32,
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub target_ack_delay: u8,
    pub failover_accepted: u8,
    pub end_to_end_flow_control: bool,
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub local_ca_guid: u64,
    pub private_data: [u8; REP_PRIVATE_LEN],
}

impl Rep {
    fn parse(b: &[u8]) -> Rep {
        Rep {
            local_comm_id: be32(b, 0),
            remote_comm_id: be32(b, 4),
            local_qkey: be32(b, 8),
            local_qpn: be24(b, 12),
            local_eecn: be24(b, 16),
            starting_psn: be24(b, 20),
            responder_resources: b[24],
            initiator_depth: b[25],
            target_ack_delay: b[26] >> 3,
            failover_accepted: (b[26] >> 1) & 3,
            end_to_end_flow_control: b[26] & 1 != 0,
            rnr_retry_count: b[27] >> 5,
            srq: b[27] & 0x10 != 0,
            local_ca_guid: be64(b, 28),
            private_data: private(b, 36),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        put32(b, 0, self.local_comm_id);
        put32(b, 4, self.remote_comm_id);
        put32(b, 8, self.local_qkey);
        put24(b, 12, self.local_qpn);
        put24(b, 16, self.local_eecn);
        put24(b, 20, self.starting_psn);
        b[24] = self.responder_resources;
        b[25] = self.initiator_depth;
        b[26] = (self.target_ack_delay & 0x1f) << 3
            | (self.failover_accepted & 3) << 1
            | self.end_to_end_flow_control as u8;
        b[27] = (self.rnr_retry_count & 7) << 5 | (self.srq as u8) << 4;
        put64(b, 28, self.local_ca_guid);
        b[36..].copy_from_slice(&self.private_data);
    }
}

/// Which message a REJ or MRA refers to.
pub mod msg {
    pub const REQ: u8 = 0;
    pub const REP: u8 = 1;
    pub const OTHER: u8 = 2;
}

/// REJ reasons (IBA table 112) that this stack sends or acts on.
pub mod rej {
    pub const NO_QP: u16 = 1;
    pub const NO_RESOURCES: u16 = 4;
    pub const TIMEOUT: u16 = 3;
    pub const STALE_CONN: u16 = 10;
    pub const INVALID_SERVICE_ID: u16 = 8;
    pub const INVALID_COMM_ID: u16 = 5;
    pub const CONSUMER_REJECT: u16 = 28;
    /// rdma_cm's "port unreachable": the service id nobody listens on.
    pub const PORT_UNREACHABLE: u16 = 2;
}

/// ConnectReject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rej {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub message_rejected: u8,
    pub reject_info_length: u8,
    pub reason: u16,
    pub ari: [u8; REJ_ARI_LEN],
    pub private_data: [u8; REJ_PRIVATE_LEN],
}

impl Rej {
    fn parse(b: &[u8]) -> Rej {
        Rej {
            local_comm_id: be32(b, 0),
            remote_comm_id: be32(b, 4),
            message_rejected: b[8] >> 6,
            reject_info_length: b[9] >> 1,
            reason: be16(b, 10),
            ari: private(b, 12),
            private_data: private(b, 84),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        put32(b, 0, self.local_comm_id);
        put32(b, 4, self.remote_comm_id);
        b[8] = (self.message_rejected & 3) << 6;
        b[9] = (self.reject_info_length & 0x7f) << 1;
        put16(b, 10, self.reason);
        b[12..84].copy_from_slice(&self.ari);
        b[84..].copy_from_slice(&self.private_data);
    }
}

/// MessageReceiptAcknowledgement: "wait longer for my answer".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mra {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub message_mraed: u8,
    /// 4.096 µs · 2^n.
    pub service_timeout: u8,
    pub private_data: [u8; MRA_PRIVATE_LEN],
}

impl Mra {
    fn parse(b: &[u8]) -> Mra {
        Mra {
            local_comm_id: be32(b, 0),
            remote_comm_id: be32(b, 4),
            message_mraed: b[8] >> 6,
            service_timeout: b[9] >> 3,
            private_data: private(b, 10),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        put32(b, 0, self.local_comm_id);
        put32(b, 4, self.remote_comm_id);
        b[8] = (self.message_mraed & 3) << 6;
        b[9] = (self.service_timeout & 0x1f) << 3;
        b[10..].copy_from_slice(&self.private_data);
    }
}

/// ReadyToUse, DisconnectReply: two comm ids and private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ids<const N: usize> {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub private_data: [u8; N],
}

impl<const N: usize> Ids<N> {
    fn parse(b: &[u8]) -> Self {
        Ids {
            local_comm_id: be32(b, 0),
            remote_comm_id: be32(b, 4),
            private_data: private(b, 8),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        put32(b, 0, self.local_comm_id);
        put32(b, 4, self.remote_comm_id);
        b[8..8 + N].copy_from_slice(&self.private_data);
    }
}

pub type Rtu = Ids<RTU_PRIVATE_LEN>;
pub type Drep = Ids<DREP_PRIVATE_LEN>;

/// DisconnectRequest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dreq {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub remote_qpn: u32,
    pub private_data: [u8; DREQ_PRIVATE_LEN],
}

impl Dreq {
    fn parse(b: &[u8]) -> Dreq {
        Dreq {
            local_comm_id: be32(b, 0),
            remote_comm_id: be32(b, 4),
            remote_qpn: be24(b, 8),
            private_data: private(b, 12),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        put32(b, 0, self.local_comm_id);
        put32(b, 4, self.remote_comm_id);
        put24(b, 8, self.remote_qpn);
        b[12..].copy_from_slice(&self.private_data);
    }
}

/// ServiceIDResolutionRequest (UD: "which QPN and Q_Key serve this?").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrReq {
    pub request_id: u32,
    pub pkey: u16,
    pub service_id: u64,
    pub private_data: [u8; SIDR_REQ_PRIVATE_LEN],
}

impl SidrReq {
    fn parse(b: &[u8]) -> SidrReq {
        SidrReq {
            request_id: be32(b, 0),
            pkey: be16(b, 4),
            service_id: be64(b, 8),
            private_data: private(b, 16),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        put32(b, 0, self.request_id);
        put16(b, 4, self.pkey);
        put64(b, 8, self.service_id);
        b[16..].copy_from_slice(&self.private_data);
    }
}

/// SIDR_REP status values.
pub mod sidr {
    pub const SUCCESS: u8 = 0;
    pub const UNSUPPORTED: u8 = 1;
    pub const REJECT: u8 = 2;
}

/// ServiceIDResolutionResponse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrRep {
    pub request_id: u32,
    pub status: u8,
    pub add_info_length: u8,
    pub qpn: u32,
    pub service_id: u64,
    pub qkey: u32,
    pub class_port_info: [u8; 72],
    pub private_data: [u8; SIDR_REP_PRIVATE_LEN],
}

impl SidrRep {
    fn parse(b: &[u8]) -> SidrRep {
        SidrRep {
            request_id: be32(b, 0),
            status: b[4],
            add_info_length: b[5],
            qpn: be24(b, 8),
            service_id: be64(b, 12),
            qkey: be32(b, 20),
            class_port_info: private(b, 24),
            private_data: private(b, 96),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        put32(b, 0, self.request_id);
        b[4] = self.status;
        b[5] = self.add_info_length;
        put24(b, 8, self.qpn);
        put64(b, 12, self.service_id);
        put32(b, 20, self.qkey);
        b[24..96].copy_from_slice(&self.class_port_info);
        b[96..].copy_from_slice(&self.private_data);
    }
}

/// One CM attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmMessage {
    Req(Req),
    Mra(Mra),
    Rej(Rej),
    Rep(Rep),
    Rtu(Rtu),
    Dreq(Dreq),
    Drep(Drep),
    SidrReq(SidrReq),
    SidrRep(SidrRep),
}

impl CmMessage {
    pub fn attr_id(&self) -> u16 {
        match self {
            CmMessage::Req(_) => attr::REQ,
            CmMessage::Mra(_) => attr::MRA,
            CmMessage::Rej(_) => attr::REJ,
            CmMessage::Rep(_) => attr::REP,
            CmMessage::Rtu(_) => attr::RTU,
            CmMessage::Dreq(_) => attr::DREQ,
            CmMessage::Drep(_) => attr::DREP,
            CmMessage::SidrReq(_) => attr::SIDR_REQ,
            CmMessage::SidrRep(_) => attr::SIDR_REP,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            CmMessage::Req(_) => "REQ",
            CmMessage::Mra(_) => "MRA",
            CmMessage::Rej(_) => "REJ",
            CmMessage::Rep(_) => "REP",
            CmMessage::Rtu(_) => "RTU",
            CmMessage::Dreq(_) => "DREQ",
            CmMessage::Drep(_) => "DREP",
            CmMessage::SidrReq(_) => "SIDR_REQ",
            CmMessage::SidrRep(_) => "SIDR_REP",
        }
    }
}

/// A whole CM MAD: header and attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmMad {
    pub header: MadHeader,
    pub message: CmMessage,
}

impl CmMad {
    /// A CM Send MAD carrying `message` under `tid`.
    pub fn new(tid: u64, message: CmMessage) -> CmMad {
        CmMad {
            header: MadHeader::cm(message.attr_id(), tid),
            message,
        }
    }

    pub fn parse(b: &[u8]) -> Result<CmMad, MadError> {
        if b.len() != MAD_LEN {
            return Err(MadError::BadLength);
        }
        let header = MadHeader::parse(b)?;
        if header.base_version != MAD_BASE_VERSION {
            return Err(MadError::BadBaseVersion);
        }
        if header.mgmt_class != MGMT_CLASS_CM {
            return Err(MadError::NotCm);
        }
        if header.class_version != CM_CLASS_VERSION {
            return Err(MadError::BadClassVersion);
        }
        if header.method != METHOD_SEND {
            return Err(MadError::BadMethod);
        }
        let d = &b[MAD_HEADER_LEN..];
        let message = match header.attr_id {
            attr::REQ => CmMessage::Req(Req::parse(d)),
            attr::MRA => CmMessage::Mra(Mra::parse(d)),
            attr::REJ => CmMessage::Rej(Rej::parse(d)),
            attr::REP => CmMessage::Rep(Rep::parse(d)),
            attr::RTU => CmMessage::Rtu(Rtu::parse(d)),
            attr::DREQ => CmMessage::Dreq(Dreq::parse(d)),
            attr::DREP => CmMessage::Drep(Drep::parse(d)),
            attr::SIDR_REQ => CmMessage::SidrReq(SidrReq::parse(d)),
            attr::SIDR_REP => CmMessage::SidrRep(SidrRep::parse(d)),
            _ => return Err(MadError::UnknownAttribute),
        };
        Ok(CmMad { header, message })
    }

    pub fn emit(&self) -> [u8; MAD_LEN] {
        let mut b = [0u8; MAD_LEN];
        self.header.emit(&mut b);
        let d = &mut b[MAD_HEADER_LEN..];
        match &self.message {
            CmMessage::Req(m) => m.emit(d),
            CmMessage::Mra(m) => m.emit(d),
            CmMessage::Rej(m) => m.emit(d),
            CmMessage::Rep(m) => m.emit(d),
            CmMessage::Rtu(m) => m.emit(d),
            CmMessage::Dreq(m) => m.emit(d),
            CmMessage::Drep(m) => m.emit(d),
            CmMessage::SidrReq(m) => m.emit(d),
            CmMessage::SidrRep(m) => m.emit(d),
        }
        b
    }
}

/// rdma_cm's port spaces (the high bits of a service id).
pub mod port_space {
    pub const IPOIB: u16 = 0x0002;
    pub const TCP: u16 = 0x0106;
    pub const UDP: u16 = 0x0111;
    pub const IB: u16 = 0x013f;
}

/// The IP-based service id of rdma_cm: `(port_space << 16) | port`.
pub fn service_id(port_space: u16, port: u16) -> u64 {
    (port_space as u64) << 16 | port as u64
}

/// The rdma_cm header at the start of a REQ's private data (`cma_hdr`):
/// version, IP version, the active side's port and both addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmaHeader {
    pub src_port: u16,
    pub src: IpAddr,
    pub dst: IpAddr,
}

impl CmaHeader {
    pub const LEN: usize = 36;

    /// None unless version 0 with IPv4 or IPv6 addresses.
    pub fn parse(b: &[u8]) -> Option<CmaHeader> {
        if b.len() < Self::LEN || b[0] != 0 {
            return None;
        }
        let addr = |o: usize| -> Option<IpAddr> {
            match b[1] >> 4 {
                4 => Some(IpAddr::V4(Ipv4Addr::new(
                    b[o + 12],
                    b[o + 13],
                    b[o + 14],
                    b[o + 15],
                ))),
                6 => Some(IpAddr::V6(Ipv6Addr::from(gid(b, o)))),
                _ => None,
            }
        };
        Some(CmaHeader {
            src_port: be16(b, 2),
            src: addr(4)?,
            dst: addr(20)?,
        })
    }

    pub fn emit(&self, b: &mut [u8]) {
        b[..Self::LEN].fill(0);
        let v6 = self.src.is_ipv6();
        b[1] = if v6 { 6 << 4 } else { 4 << 4 };
        put16(b, 2, self.src_port);
        for (o, a) in [(4, self.src), (20, self.dst)] {
            match a {
                IpAddr::V4(a) => b[o + 12..o + 16].copy_from_slice(&a.octets()),
                IpAddr::V6(a) => b[o..o + 16].copy_from_slice(&a.octets()),
            }
        }
    }
}

/// rdma_cm's flow label for a connection between two ports
/// (`cma_get_roce_udp_flow_label`).
pub fn cma_flow_label(src_port: u16, dst_port: u16) -> u32 {
    (src_port as u32 * 31 + dst_port as u32) & 0xf_ffff
}

/// The UDP source port a flow label selects (`rdma_flow_label_to_udp_sport`).
pub fn flow_label_to_udp_sport(fl: u32) -> u16 {
    (((fl & 0x3fff) ^ ((fl & 0xf_c000) >> 14)) as u16) | super::ROCE_V2_SPORT_MIN
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn flow_label_and_port_as_rxe() {
        // The capture's first REQ: ports 0xb525 -> 0x4853 give flow label
        // 0x637ce, and the connection's RC packets leave from port 63446.
        assert_eq!(cma_flow_label(0xb525, 0x4853), 0x637ce);
        assert_eq!(flow_label_to_udp_sport(0x637ce), 63446);
    }

    #[test]
    fn bad_mads_are_typed_errors() {
        let mut m = CmMad::new(
            7,
            CmMessage::Rtu(Rtu {
                local_comm_id: 1,
                remote_comm_id: 2,
                private_data: [0; RTU_PRIVATE_LEN],
            }),
        )
        .emit();
        assert!(CmMad::parse(&m).is_ok());
        assert_eq!(CmMad::parse(&m[..255]), Err(MadError::BadLength));
        m[1] = 0x04;
        assert_eq!(CmMad::parse(&m), Err(MadError::NotCm));
        m[1] = MGMT_CLASS_CM;
        m[2] = 1;
        assert_eq!(CmMad::parse(&m), Err(MadError::BadClassVersion));
        m[2] = 2;
        m[3] = 0x81;
        assert_eq!(CmMad::parse(&m), Err(MadError::BadMethod));
        m[3] = 3;
        m[17] = 0x19;
        assert_eq!(CmMad::parse(&m), Err(MadError::UnknownAttribute));
        m[0] = 2;
        assert_eq!(CmMad::parse(&m), Err(MadError::BadBaseVersion));
    }

    #[test]
    fn cma_header_round_trip() {
        let b = hex("0040b5250000000000000000000000000a6300030000000000000000000000000a630002");
        let h = CmaHeader::parse(&b).unwrap();
        assert_eq!(h.src_port, 0xb525);
        assert_eq!(h.src, "10.99.0.3".parse::<IpAddr>().unwrap());
        assert_eq!(h.dst, "10.99.0.2".parse::<IpAddr>().unwrap());
        let mut out = [0u8; 36];
        h.emit(&mut out);
        assert_eq!(&out[..], &b[..]);
        let v6 = CmaHeader {
            src_port: 1,
            src: "fd99::3".parse().unwrap(),
            dst: "fd99::2".parse().unwrap(),
        };
        v6.emit(&mut out);
        assert_eq!(CmaHeader::parse(&out), Some(v6));
    }
}
