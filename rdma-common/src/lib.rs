//! RoCEv2 header layouts, opcode table and constants shared by the XDP program
//! (`rdma-ebpf`) and userspace (`rdma-user`).
//!
//! Every header is `#[repr(C)]` with byte-array fields only, so its alignment is 1:
//! a view can be taken at any offset of a frame (VLAN tags and IPv4 options shift
//! everything by amounts that are not multiples of 4), both with `bytemuck` in
//! userspace and with a plain pointer cast in the verifier-checked XDP program.
//! Multi-byte fields are big-endian on the wire; accessors convert.
#![no_std]

use bytemuck::{Pod, Zeroable};

/// IANA-assigned UDP destination port of RoCEv2.
pub const ROCE_V2_UDP_PORT: u16 = 4791;
/// Lowest UDP source port RoCEv2 may use (IB spec A17.2.3: 0xC000..=0xFFFF).
pub const ROCE_V2_SPORT_MIN: u16 = 0xc000;
pub const ETH_P_IPV4: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
pub const ETH_P_8021Q: u16 = 0x8100;
pub const ETH_P_8021AD: u16 = 0x88a8;
pub const IPPROTO_UDP: u8 = 17;
/// Invariant CRC trailer of every RoCEv2 packet.
pub const ICRC_LEN: usize = 4;
/// Default partition key; rxe and rdma-core use it unless told otherwise.
pub const DEFAULT_PKEY: u16 = 0xffff;
/// The 24-bit PSN / QPN / MSN space.
pub const MASK_24: u32 = 0x00ff_ffff;

macro_rules! be_field {
    ($get:ident, $set:ident, $field:ident, u16) => {
        #[inline(always)]
        pub fn $get(&self) -> u16 {
            u16::from_be_bytes(self.$field)
        }
        #[inline(always)]
        pub fn $set(&mut self, v: u16) {
            self.$field = v.to_be_bytes();
        }
    };
    ($get:ident, $set:ident, $field:ident, u32) => {
        #[inline(always)]
        pub fn $get(&self) -> u32 {
            u32::from_be_bytes(self.$field)
        }
        #[inline(always)]
        pub fn $set(&mut self, v: u32) {
            self.$field = v.to_be_bytes();
        }
    };
    ($get:ident, $set:ident, $field:ident, u64) => {
        #[inline(always)]
        pub fn $get(&self) -> u64 {
            u64::from_be_bytes(self.$field)
        }
        #[inline(always)]
        pub fn $set(&mut self, v: u64) {
            self.$field = v.to_be_bytes();
        }
    };
    ($get:ident, $set:ident, $field:ident, u24) => {
        #[inline(always)]
        pub fn $get(&self) -> u32 {
            let b = self.$field;
            ((b[0] as u32) << 16) | ((b[1] as u32) << 8) | b[2] as u32
        }
        #[inline(always)]
        pub fn $set(&mut self, v: u32) {
            self.$field = [(v >> 16) as u8, (v >> 8) as u8, v as u8];
        }
    };
}

/// Ethernet II header.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct EthHdr {
    pub dst: [u8; 6],
    pub src: [u8; 6],
    pub ethertype: [u8; 2],
}
impl EthHdr {
    pub const LEN: usize = 14;
    be_field!(ethertype, set_ethertype, ethertype, u16);
}

/// 802.1Q tag as it follows the MAC addresses (TCI, then the inner ethertype).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct VlanHdr {
    pub tci: [u8; 2],
    pub ethertype: [u8; 2],
}
impl VlanHdr {
    pub const LEN: usize = 4;
    be_field!(tci, set_tci, tci, u16);
    be_field!(ethertype, set_ethertype, ethertype, u16);
}

/// IPv4 header without options (options follow when IHL > 5).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Ipv4Hdr {
    pub version_ihl: u8,
    pub tos: u8,
    pub total_len: [u8; 2],
    pub id: [u8; 2],
    pub frag_off: [u8; 2],
    pub ttl: u8,
    pub protocol: u8,
    pub checksum: [u8; 2],
    pub src: [u8; 4],
    pub dst: [u8; 4],
}
impl Ipv4Hdr {
    pub const LEN: usize = 20;
    pub const FLAG_DF: u16 = 0x4000;
    pub const FLAG_MF: u16 = 0x2000;
    pub const OFFSET_MASK: u16 = 0x1fff;
    be_field!(total_len, set_total_len, total_len, u16);
    be_field!(id, set_id, id, u16);
    be_field!(frag_off, set_frag_off, frag_off, u16);
    be_field!(checksum, set_checksum, checksum, u16);
    #[inline(always)]
    pub fn version(&self) -> u8 {
        self.version_ihl >> 4
    }
    /// Header length in bytes, options included.
    #[inline(always)]
    pub fn header_len(&self) -> usize {
        ((self.version_ihl & 0x0f) as usize) * 4
    }
}

/// IPv6 fixed header.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Ipv6Hdr {
    pub ver_tc_flow: [u8; 4],
    pub payload_len: [u8; 2],
    pub next_header: u8,
    pub hop_limit: u8,
    pub src: [u8; 16],
    pub dst: [u8; 16],
}
impl Ipv6Hdr {
    pub const LEN: usize = 40;
    be_field!(ver_tc_flow, set_ver_tc_flow, ver_tc_flow, u32);
    be_field!(payload_len, set_payload_len, payload_len, u16);
    #[inline(always)]
    pub fn version(&self) -> u8 {
        self.ver_tc_flow[0] >> 4
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct UdpHdr {
    pub src_port: [u8; 2],
    pub dst_port: [u8; 2],
    pub len: [u8; 2],
    pub checksum: [u8; 2],
}
// `len` is the UDP length field, not a container length.
#[allow(clippy::len_without_is_empty)]
impl UdpHdr {
    pub const LEN: usize = 8;
    be_field!(src_port, set_src_port, src_port, u16);
    be_field!(dst_port, set_dst_port, dst_port, u16);
    be_field!(len, set_len, len, u16);
    be_field!(checksum, set_checksum, checksum, u16);
}

/// Base Transport Header (IBA 9.2).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Bth {
    pub opcode: u8,
    /// SE (bit 7), MigReq (bit 6), PadCnt (bits 5..4), TVer (bits 3..0).
    pub flags: u8,
    pub pkey: [u8; 2],
    /// Reserved on RoCE (F/B bits on IB); masked out of the ICRC.
    pub resv8a: u8,
    pub dest_qpn: [u8; 3],
    /// AckReq (bit 7), reserved bits 6..0.
    pub ack_req: u8,
    pub psn: [u8; 3],
}
impl Bth {
    pub const LEN: usize = 12;
    pub const SE: u8 = 0x80;
    pub const MIG_REQ: u8 = 0x40;
    pub const ACK_REQ: u8 = 0x80;
    be_field!(pkey, set_pkey, pkey, u16);
    be_field!(dest_qpn, set_dest_qpn, dest_qpn, u24);
    be_field!(psn, set_psn, psn, u24);
    #[inline(always)]
    pub fn pad_count(&self) -> u8 {
        (self.flags >> 4) & 0x3
    }
    #[inline(always)]
    pub fn tver(&self) -> u8 {
        self.flags & 0x0f
    }
}

/// RDMA Extended Transport Header.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Reth {
    pub va: [u8; 8],
    pub rkey: [u8; 4],
    pub dma_len: [u8; 4],
}
impl Reth {
    pub const LEN: usize = 16;
    be_field!(va, set_va, va, u64);
    be_field!(rkey, set_rkey, rkey, u32);
    be_field!(dma_len, set_dma_len, dma_len, u32);
}

/// ACK Extended Transport Header.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Aeth {
    pub syndrome: u8,
    pub msn: [u8; 3],
}
impl Aeth {
    pub const LEN: usize = 4;
    be_field!(msn, set_msn, msn, u24);
}

/// Atomic Extended Transport Header (CMP_SWAP / FETCH_ADD requests).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct AtomicEth {
    pub va: [u8; 8],
    pub rkey: [u8; 4],
    pub swap_add: [u8; 8],
    pub compare: [u8; 8],
}
impl AtomicEth {
    pub const LEN: usize = 28;
    be_field!(va, set_va, va, u64);
    be_field!(rkey, set_rkey, rkey, u32);
    be_field!(swap_add, set_swap_add, swap_add, u64);
    be_field!(compare, set_compare, compare, u64);
}

/// Atomic ACK Extended Transport Header: the value found before the operation.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct AtomicAckEth {
    pub orig: [u8; 8],
}
impl AtomicAckEth {
    pub const LEN: usize = 8;
    be_field!(orig, set_orig, orig, u64);
}

/// Immediate data.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct ImmDt {
    pub imm: [u8; 4],
}
impl ImmDt {
    pub const LEN: usize = 4;
    be_field!(imm, set_imm, imm, u32);
}

/// Invalidate Extended Transport Header.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Ieth {
    pub rkey: [u8; 4],
}
impl Ieth {
    pub const LEN: usize = 4;
    be_field!(rkey, set_rkey, rkey, u32);
}

/// Datagram Extended Transport Header (UD).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Deth {
    pub qkey: [u8; 4],
    pub resv: u8,
    pub src_qpn: [u8; 3],
}
impl Deth {
    pub const LEN: usize = 8;
    be_field!(qkey, set_qkey, qkey, u32);
    be_field!(src_qpn, set_src_qpn, src_qpn, u24);
}

/// The 16 reserved bytes that follow the BTH of a RoCEv2 CNP (Annex A17.9.3).
pub const CNP_RESERVED_LEN: usize = 16;

/// The selective-repeat ACK's bitmap (see [`opcode::SR_SACK`]): bit `i`
/// (byte `i / 8`, least significant bit first) says the responder holds
/// PSN `BTH.PSN + 1 + i`.
pub const SACK_BITMAP_LEN: usize = 32;

/// IBA opcodes. Bits 7..5 select the transport, bits 4..0 the operation.
pub mod opcode {
    pub const RC_SEND_FIRST: u8 = 0x00;
    pub const RC_SEND_MIDDLE: u8 = 0x01;
    pub const RC_SEND_LAST: u8 = 0x02;
    pub const RC_SEND_LAST_WITH_IMMEDIATE: u8 = 0x03;
    pub const RC_SEND_ONLY: u8 = 0x04;
    pub const RC_SEND_ONLY_WITH_IMMEDIATE: u8 = 0x05;
    pub const RC_RDMA_WRITE_FIRST: u8 = 0x06;
    pub const RC_RDMA_WRITE_MIDDLE: u8 = 0x07;
    pub const RC_RDMA_WRITE_LAST: u8 = 0x08;
    pub const RC_RDMA_WRITE_LAST_WITH_IMMEDIATE: u8 = 0x09;
    pub const RC_RDMA_WRITE_ONLY: u8 = 0x0a;
    pub const RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: u8 = 0x0b;
    pub const RC_RDMA_READ_REQUEST: u8 = 0x0c;
    pub const RC_RDMA_READ_RESPONSE_FIRST: u8 = 0x0d;
    pub const RC_RDMA_READ_RESPONSE_MIDDLE: u8 = 0x0e;
    pub const RC_RDMA_READ_RESPONSE_LAST: u8 = 0x0f;
    pub const RC_RDMA_READ_RESPONSE_ONLY: u8 = 0x10;
    pub const RC_ACKNOWLEDGE: u8 = 0x11;
    pub const RC_ATOMIC_ACKNOWLEDGE: u8 = 0x12;
    pub const RC_COMPARE_SWAP: u8 = 0x13;
    pub const RC_FETCH_ADD: u8 = 0x14;
    pub const RC_SEND_LAST_WITH_INVALIDATE: u8 = 0x16;
    pub const RC_SEND_ONLY_WITH_INVALIDATE: u8 = 0x17;

    pub const UC_SEND_FIRST: u8 = 0x20;
    pub const UC_SEND_MIDDLE: u8 = 0x21;
    pub const UC_SEND_LAST: u8 = 0x22;
    pub const UC_SEND_LAST_WITH_IMMEDIATE: u8 = 0x23;
    pub const UC_SEND_ONLY: u8 = 0x24;
    pub const UC_SEND_ONLY_WITH_IMMEDIATE: u8 = 0x25;
    pub const UC_RDMA_WRITE_FIRST: u8 = 0x26;
    pub const UC_RDMA_WRITE_MIDDLE: u8 = 0x27;
    pub const UC_RDMA_WRITE_LAST: u8 = 0x28;
    pub const UC_RDMA_WRITE_LAST_WITH_IMMEDIATE: u8 = 0x29;
    pub const UC_RDMA_WRITE_ONLY: u8 = 0x2a;
    pub const UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: u8 = 0x2b;

    pub const UD_SEND_ONLY: u8 = 0x64;
    pub const UD_SEND_ONLY_WITH_IMMEDIATE: u8 = 0x65;

    /// RoCEv2 Congestion Notification Packet.
    pub const CNP: u8 = 0x81;
    /// The CNP opcode some implementations send instead, without the 16
    /// reserved bytes (accepted on receive, never sent).
    pub const CNP_LEGACY: u8 = 0x80;

    /// Selective-repeat ACK, only between two of our stacks that negotiated
    /// selective repeat (never sent to any other peer). A manufacturer-
    /// specific opcode (IBA table 38 leaves 0xc0-0xff to vendors): BTH
    /// (PSN = the first PSN the responder still misses), AETH (an ACK
    /// syndrome and the MSN), then a [`SACK_BITMAP_LEN`]-byte bitmap of the
    /// PSNs after it that it already holds.
    pub const SR_SACK: u8 = 0xc0;
}

/// What an opcode implies, as bit flags: which extension headers follow the
/// BTH (in wire order RETH/AtomicETH/DETH ... AETH, AtomicAckETH, ImmDt/IETH),
/// whether a payload may follow, its place in a message and its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct OpFlags(u32);

impl OpFlags {
    /// An opcode this stack does not know (RD, XRC, holes of the UC/UD/CNP
    /// ranges, manufacturer-specific): dropped as soon as it is seen.
    pub const UNKNOWN: OpFlags = OpFlags(0);
    pub const RETH: OpFlags = OpFlags(1 << 0);
    pub const AETH: OpFlags = OpFlags(1 << 1);
    pub const ATOMIC_ETH: OpFlags = OpFlags(1 << 2);
    pub const ATOMIC_ACK_ETH: OpFlags = OpFlags(1 << 3);
    pub const IMM: OpFlags = OpFlags(1 << 4);
    pub const IETH: OpFlags = OpFlags(1 << 5);
    pub const DETH: OpFlags = OpFlags(1 << 6);
    pub const CNP_RESERVED: OpFlags = OpFlags(1 << 7);
    pub const PAYLOAD: OpFlags = OpFlags(1 << 8);
    pub const FIRST: OpFlags = OpFlags(1 << 9);
    pub const MIDDLE: OpFlags = OpFlags(1 << 10);
    pub const LAST: OpFlags = OpFlags(1 << 11);
    pub const ONLY: OpFlags = OpFlags(Self::FIRST.0 | Self::LAST.0);
    pub const SEND: OpFlags = OpFlags(1 << 12);
    pub const WRITE: OpFlags = OpFlags(1 << 13);
    pub const READ_REQUEST: OpFlags = OpFlags(1 << 14);
    pub const READ_RESPONSE: OpFlags = OpFlags(1 << 15);
    pub const ACK: OpFlags = OpFlags(1 << 16);
    pub const ATOMIC_ACK: OpFlags = OpFlags(1 << 17);
    pub const ATOMIC: OpFlags = OpFlags(1 << 18);
    pub const CNP: OpFlags = OpFlags(1 << 19);
    /// Sent by a requester (as opposed to a responder's ACK or READ response).
    pub const REQUEST: OpFlags = OpFlags(1 << 20);
    /// A reserved opcode of the RC range (0x15, 0x18-0x1f). The responder's
    /// opcode check (IBA vol. 1 9.7) answers an opcode it does not support
    /// with NAK Invalid Request, so such a packet must reach the QP: no
    /// extension headers are assumed, the rest is payload. (rxe drops it.)
    pub const RESERVED: OpFlags = OpFlags(1 << 21);
    /// A selective ACK (opcode SR_SACK).
    pub const SACK: OpFlags = OpFlags(1 << 22);
    /// The SACK bitmap header ([`SACK_BITMAP_LEN`] bytes, after the AETH).
    pub const SACK_BITMAP: OpFlags = OpFlags(1 << 23);

    #[inline(always)]
    pub const fn bits(self) -> u32 {
        self.0
    }
    /// All of `f` are set.
    #[inline(always)]
    pub const fn has(self, f: OpFlags) -> bool {
        self.0 & f.0 == f.0
    }
    /// Any of `f` is set.
    #[inline(always)]
    pub const fn any(self, f: OpFlags) -> bool {
        self.0 & f.0 != 0
    }
    #[inline(always)]
    pub const fn union(self, f: OpFlags) -> OpFlags {
        OpFlags(self.0 | f.0)
    }
    #[inline(always)]
    pub const fn is_known(self) -> bool {
        self.0 != 0
    }
    /// The packet's place in its message.
    #[inline(always)]
    pub const fn position(self) -> Position {
        let first = self.0 & Self::FIRST.0 != 0;
        let last = self.0 & Self::LAST.0 != 0;
        match (first, last) {
            (true, true) => Position::Only,
            (true, false) => Position::First,
            (false, true) => Position::Last,
            (false, false) => Position::Middle,
        }
    }
}

impl core::ops::BitOr for OpFlags {
    type Output = OpFlags;
    #[inline(always)]
    fn bitor(self, o: OpFlags) -> OpFlags {
        self.union(o)
    }
}

/// A packet's place in a multi-packet message (IBA 9.2.3: FIRST, MIDDLE,
/// LAST, ONLY). Opcodes without MIDDLE/FIRST/LAST flags (RESERVED, unknown)
/// count as MIDDLE, which no message may start with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    First,
    Middle,
    Last,
    Only,
}

impl Position {
    /// MIDDLE or LAST: continues a message already in progress.
    #[inline(always)]
    pub const fn continues(self) -> bool {
        matches!(self, Position::Middle | Position::Last)
    }
    /// LAST or ONLY: ends the message.
    #[inline(always)]
    pub const fn ends(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }
}

/// One row of the opcode table: the name the IBA and Wireshark use, the
/// flags, and the length of the extension headers between BTH and payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpcodeInfo {
    pub name: &'static str,
    pub flags: OpFlags,
    pub ext_len: u8,
}

/// The one definition of every opcode (IBA table 38 and RoCEv2 annex A17).
/// Everything else (the XDP program's [`OPCODE_FLAGS`], the parser, the
/// engine, the decoder's names) reads it.
const fn opcode_def(opc: u8) -> (&'static str, OpFlags) {
    const SND: OpFlags = OpFlags(OpFlags::SEND.0 | OpFlags::PAYLOAD.0 | OpFlags::REQUEST.0);
    const WR: OpFlags = OpFlags(OpFlags::WRITE.0 | OpFlags::PAYLOAD.0 | OpFlags::REQUEST.0);
    const RR: OpFlags = OpFlags(OpFlags::READ_RESPONSE.0 | OpFlags::PAYLOAD.0);
    const fn f(parts: &[OpFlags]) -> OpFlags {
        let mut v = 0;
        let mut i = 0;
        while i < parts.len() {
            v |= parts[i].0;
            i += 1;
        }
        OpFlags(v)
    }
    use OpFlags as F;
    match opc {
        0x00 => ("RC_SEND_FIRST", f(&[SND, F::FIRST])),
        0x01 => ("RC_SEND_MIDDLE", f(&[SND, F::MIDDLE])),
        0x02 => ("RC_SEND_LAST", f(&[SND, F::LAST])),
        0x03 => ("RC_SEND_LAST_WITH_IMMEDIATE", f(&[SND, F::LAST, F::IMM])),
        0x04 => ("RC_SEND_ONLY", f(&[SND, F::ONLY])),
        0x05 => ("RC_SEND_ONLY_WITH_IMMEDIATE", f(&[SND, F::ONLY, F::IMM])),
        0x06 => ("RC_RDMA_WRITE_FIRST", f(&[WR, F::FIRST, F::RETH])),
        0x07 => ("RC_RDMA_WRITE_MIDDLE", f(&[WR, F::MIDDLE])),
        0x08 => ("RC_RDMA_WRITE_LAST", f(&[WR, F::LAST])),
        0x09 => (
            "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
            f(&[WR, F::LAST, F::IMM]),
        ),
        0x0a => ("RC_RDMA_WRITE_ONLY", f(&[WR, F::ONLY, F::RETH])),
        0x0b => (
            "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
            f(&[WR, F::ONLY, F::RETH, F::IMM]),
        ),
        0x0c => (
            "RC_RDMA_READ_REQUEST",
            f(&[F::READ_REQUEST, F::ONLY, F::RETH, F::REQUEST]),
        ),
        0x0d => ("RC_RDMA_READ_RESPONSE_FIRST", f(&[RR, F::FIRST, F::AETH])),
        0x0e => ("RC_RDMA_READ_RESPONSE_MIDDLE", f(&[RR, F::MIDDLE])),
        0x0f => ("RC_RDMA_READ_RESPONSE_LAST", f(&[RR, F::LAST, F::AETH])),
        0x10 => ("RC_RDMA_READ_RESPONSE_ONLY", f(&[RR, F::ONLY, F::AETH])),
        0x11 => ("RC_ACKNOWLEDGE", f(&[F::ACK, F::ONLY, F::AETH])),
        0x12 => (
            "RC_ATOMIC_ACKNOWLEDGE",
            f(&[F::ATOMIC_ACK, F::ONLY, F::AETH, F::ATOMIC_ACK_ETH]),
        ),
        0x13 => (
            "RC_CMP_SWAP",
            f(&[F::ATOMIC, F::ONLY, F::ATOMIC_ETH, F::REQUEST]),
        ),
        0x14 => (
            "RC_FETCH_ADD",
            f(&[F::ATOMIC, F::ONLY, F::ATOMIC_ETH, F::REQUEST]),
        ),
        0x16 => ("RC_SEND_LAST_WITH_INVALIDATE", f(&[SND, F::LAST, F::IETH])),
        0x17 => ("RC_SEND_ONLY_WITH_INVALIDATE", f(&[SND, F::ONLY, F::IETH])),
        0x15 | 0x18..=0x1f => ("RC_RESERVED", F::RESERVED),
        0x20 => ("UC_SEND_FIRST", f(&[SND, F::FIRST])),
        0x21 => ("UC_SEND_MIDDLE", f(&[SND, F::MIDDLE])),
        0x22 => ("UC_SEND_LAST", f(&[SND, F::LAST])),
        0x23 => ("UC_SEND_LAST_WITH_IMMEDIATE", f(&[SND, F::LAST, F::IMM])),
        0x24 => ("UC_SEND_ONLY", f(&[SND, F::ONLY])),
        0x25 => ("UC_SEND_ONLY_WITH_IMMEDIATE", f(&[SND, F::ONLY, F::IMM])),
        0x26 => ("UC_RDMA_WRITE_FIRST", f(&[WR, F::FIRST, F::RETH])),
        0x27 => ("UC_RDMA_WRITE_MIDDLE", f(&[WR, F::MIDDLE])),
        0x28 => ("UC_RDMA_WRITE_LAST", f(&[WR, F::LAST])),
        0x29 => (
            "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
            f(&[WR, F::LAST, F::IMM]),
        ),
        0x2a => ("UC_RDMA_WRITE_ONLY", f(&[WR, F::ONLY, F::RETH])),
        0x2b => (
            "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
            f(&[WR, F::ONLY, F::RETH, F::IMM]),
        ),
        0x64 => ("UD_SEND_ONLY", f(&[SND, F::ONLY, F::DETH])),
        0x65 => (
            "UD_SEND_ONLY_WITH_IMMEDIATE",
            f(&[SND, F::ONLY, F::DETH, F::IMM]),
        ),
        opcode::CNP => ("CNP", f(&[F::CNP, F::ONLY, F::CNP_RESERVED])),
        opcode::CNP_LEGACY => ("CNP_LEGACY", f(&[F::CNP, F::ONLY])),
        opcode::SR_SACK => ("SR_SACK", f(&[F::SACK, F::ONLY, F::AETH, F::SACK_BITMAP])),
        _ => ("UNKNOWN", F::UNKNOWN),
    }
}

/// Length of the extension headers selected by `flags`.
pub const fn ext_headers_len(flags: OpFlags) -> usize {
    const LENS: [(OpFlags, usize); 9] = [
        (OpFlags::RETH, Reth::LEN),
        (OpFlags::ATOMIC_ETH, AtomicEth::LEN),
        (OpFlags::DETH, Deth::LEN),
        (OpFlags::AETH, Aeth::LEN),
        (OpFlags::ATOMIC_ACK_ETH, AtomicAckEth::LEN),
        (OpFlags::IMM, ImmDt::LEN),
        (OpFlags::IETH, Ieth::LEN),
        (OpFlags::CNP_RESERVED, CNP_RESERVED_LEN),
        (OpFlags::SACK_BITMAP, SACK_BITMAP_LEN),
    ];
    let mut n = 0;
    let mut i = 0;
    while i < LENS.len() {
        if flags.any(LENS[i].0) {
            n += LENS[i].1;
        }
        i += 1;
    }
    n
}

/// The opcode table, built at compile time from [`opcode_def`]. A `const`,
/// so that the XDP program (which reads only [`OPCODE_FLAGS`]) carries no
/// names.
pub const OPCODE_TABLE: [OpcodeInfo; 256] = {
    let mut t = [OpcodeInfo {
        name: "",
        flags: OpFlags::UNKNOWN,
        ext_len: 0,
    }; 256];
    let mut i = 0;
    while i < 256 {
        let (name, flags) = opcode_def(i as u8);
        t[i] = OpcodeInfo {
            name,
            flags,
            ext_len: ext_headers_len(flags) as u8,
        };
        i += 1;
    }
    t
};

/// Flags and extension header length per opcode, for per-packet lookups
/// (the XDP program and the parser): one index, no decoding.
pub static OPCODE_FLAGS: [(OpFlags, u8); 256] = {
    let mut t = [(OpFlags::UNKNOWN, 0u8); 256];
    let mut i = 0;
    while i < 256 {
        t[i] = (OPCODE_TABLE[i].flags, OPCODE_TABLE[i].ext_len);
        i += 1;
    }
    t
};

/// Flags of an opcode ([`OpFlags::UNKNOWN`] for one this stack drops).
#[inline(always)]
pub fn opcode_flags(opc: u8) -> OpFlags {
    OPCODE_FLAGS[opc as usize].0
}

/// Name of an opcode as the IBA and Wireshark spell it.
pub fn opcode_name(opc: u8) -> &'static str {
    OPCODE_TABLE[opc as usize].name
}

/// 24-bit PSN arithmetic: `a + n` modulo 2^24.
#[inline(always)]
pub const fn psn_add(a: u32, n: u32) -> u32 {
    a.wrapping_add(n) & MASK_24
}

/// Signed distance `a - b` in the 24-bit PSN space, in `-2^23 ..= 2^23 - 1`:
/// positive when `a` is after `b`, across the wrap too.
#[inline(always)]
pub const fn psn_diff(a: u32, b: u32) -> i32 {
    ((a.wrapping_sub(b) << 8) as i32) >> 8
}

/// Per-CPU XDP counters: index into the `STATS` array map. One per verdict and
/// reason, so a dropped packet always says why.
pub mod stat {
    /// RoCEv2 packet redirected into the AF_XDP socket of its RX queue.
    pub const REDIRECT: u32 = 0;
    /// Not IPv4/IPv6 (ARP, LLDP, ...): to the kernel.
    pub const PASS_NOT_IP: u32 = 1;
    /// IP but not UDP to port 4791: to the kernel.
    pub const PASS_NOT_ROCE: u32 = 2;
    /// An IPv4 fragment: the kernel reassembles, so it passes.
    pub const PASS_FRAGMENT: u32 = 3;
    /// RoCEv2 packet but no AF_XDP socket is bound on this queue.
    pub const PASS_NO_SOCKET: u32 = 4;
    /// Frame shorter than its headers plus ICRC (or shorter than IP/UDP say).
    pub const DROP_TRUNCATED: u32 = 5;
    /// BTH TVer is not 0.
    pub const DROP_BAD_TVER: u32 = 6;
    /// Opcode not in the RC/UC/UD/CNP table.
    pub const DROP_UNKNOWN_OPCODE: u32 = 7;
    /// Destination QPN is not live in the firewall map.
    pub const DROP_QPN_NOT_LIVE: u32 = 8;
    /// Source address or UDP port does not match the connected QP's peer.
    pub const DROP_SPOOFED_SOURCE: u32 = 9;
    /// An RDMA WRITE placed into the MR pool by XDP itself, no ACK asked.
    pub const XDP_PLACED: u32 = 10;
    /// An RDMA WRITE placed by XDP and answered with an ACK by XDP_TX.
    pub const XDP_ACKED: u32 = 11;
    /// A request to a QP lent to XDP that XDP left to user space (the
    /// per-QP counters say why); it was redirected.
    pub const XDP_PUNTED: u32 = 12;
    /// A READ answered by XDP with READ_RESPONSE_ONLY by XDP_TX.
    pub const XDP_READ: u32 = 13;
    pub const COUNT: u32 = 14;

    /// The frame was dropped as bad (the reasons `DROP_TRUNCATED` to
    /// `DROP_SPOOFED_SOURCE`), not served by the XDP responder.
    pub const fn is_drop(reason: u32) -> bool {
        reason >= DROP_TRUNCATED && reason <= DROP_SPOOFED_SOURCE
    }

    pub const NAMES: [&str; COUNT as usize] = [
        "redirect",
        "pass_not_ip",
        "pass_not_roce",
        "pass_fragment",
        "pass_no_socket",
        "drop_truncated",
        "drop_bad_tver",
        "drop_unknown_opcode",
        "drop_qpn_not_live",
        "drop_spoofed_source",
        "xdp_placed",
        "xdp_acked",
        "xdp_punted",
        "xdp_read",
    ];
}

pub mod xdp_responder;

/// The MR pool: memory the XDP responder places RDMA WRITE payloads
/// into, does atomics on and answers READs from. One `BPF_F_MMAPABLE`
/// array map of one value, mapped by user space with `MAP_SHARED`; MRs
/// registered "in the pool" are ranges of that value.
pub mod mr_pool {
    /// Usable bytes. A power of two, so that XDP can mask an offset into
    /// it: the verifier only accepts a variable offset into a map value it
    /// can bound (and below 2^29).
    pub const BYTES: usize = 64 << 20;
    /// Mask of an offset inside the pool.
    pub const MASK: u64 = BYTES as u64 - 1;
    /// Pool ranges are whole pages, so that a range can be mapped over an
    /// application's pages.
    pub const PAGE: usize = 4096;
    /// Past the usable bytes: a copy of at most one page at a masked
    /// offset stays inside the value (the verifier proves `offset + len <=
    /// value size` from the masks alone).
    pub const SLACK: usize = PAGE;
    /// The map value's size.
    pub const VALUE_BYTES: usize = BYTES + SLACK;
}

/// Global switches written by userspace into the `CONFIG` array map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct XdpConfig {
    /// Non-zero: drop RoCEv2 packets whose QPN is not in `LIVE_QPS` (QP1, the
    /// GSI QP used by RDMA CM, always passes through to userspace).
    pub firewall: u32,
    /// Non-zero: the XDP responder skips the received ICRC check. For the
    /// benchmark only (`rdma-xdp bench --no-icrc-check`, to measure the
    /// check's share of the program's cost); nothing else sets it.
    pub bench_no_icrc: u32,
}

/// Value of the `LIVE_QPS` hash map, keyed by local QPN. For a connected RC QP
/// the packet's source must match; an unconnected (INIT/RTR-less) QP accepts any.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct LiveQp {
    /// Peer IP address; IPv4 as `::ffff:a.b.c.d` (the RoCEv2 GID form).
    pub peer_gid: [u8; 16],
    /// Peer UDP source port, network order; 0 = any.
    pub peer_sport: [u8; 2],
    /// 1 = connected (check the source), 0 = accept any source.
    pub connected: u8,
    pub _pad: u8,
}

// Map values the userspace loader reads and writes through aya.
// SAFETY: bytemuck's Pod derive above already proved it: repr(C), only
// integer and byte-array fields, no padding, every bit pattern valid.
#[cfg(feature = "user")]
unsafe impl aya::Pod for LiveQp {}
// SAFETY: as for LiveQp (bytemuck's Pod derive: repr(C), no padding).
#[cfg(feature = "user")]
unsafe impl aya::Pod for XdpConfig {}
// SAFETY: as for LiveQp (bytemuck's Pod derive: repr(C), no padding).
#[cfg(feature = "user")]
unsafe impl aya::Pod for xdp_responder::PoolMr {}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn only_bad_frames_count_as_drops() {
        let drops: std::vec::Vec<&str> = (0..stat::COUNT)
            .filter(|&r| stat::is_drop(r))
            .map(|r| stat::NAMES[r as usize])
            .collect();
        assert_eq!(
            drops,
            [
                "drop_truncated",
                "drop_bad_tver",
                "drop_unknown_opcode",
                "drop_qpn_not_live",
                "drop_spoofed_source"
            ]
        );
    }

    #[test]
    fn psn_wraps() {
        assert_eq!(psn_add(MASK_24, 1), 0);
        assert_eq!(psn_diff(0, MASK_24), 1);
        assert_eq!(psn_diff(MASK_24, 0), -1);
        assert_eq!(psn_diff(5, 5), 0);
        assert_eq!(psn_diff(0x80_0000, 0), -0x80_0000);
        assert_eq!(psn_diff(0x7f_ffff, 0), 0x7f_ffff);
    }

    #[test]
    fn header_sizes_match_the_spec() {
        assert_eq!(core::mem::size_of::<EthHdr>(), EthHdr::LEN);
        assert_eq!(core::mem::size_of::<VlanHdr>(), VlanHdr::LEN);
        assert_eq!(core::mem::size_of::<Ipv4Hdr>(), Ipv4Hdr::LEN);
        assert_eq!(core::mem::size_of::<Ipv6Hdr>(), Ipv6Hdr::LEN);
        assert_eq!(core::mem::size_of::<UdpHdr>(), UdpHdr::LEN);
        assert_eq!(core::mem::size_of::<Bth>(), Bth::LEN);
        assert_eq!(core::mem::size_of::<Reth>(), Reth::LEN);
        assert_eq!(core::mem::size_of::<Aeth>(), Aeth::LEN);
        assert_eq!(core::mem::size_of::<AtomicEth>(), AtomicEth::LEN);
        assert_eq!(core::mem::size_of::<AtomicAckEth>(), AtomicAckEth::LEN);
        assert_eq!(core::mem::size_of::<Deth>(), Deth::LEN);
        // The XDP program reads headers in place at any offset: alignment 1.
        assert_eq!(core::mem::align_of::<Bth>(), 1);
        assert_eq!(core::mem::align_of::<EthHdr>(), 1);
        assert_eq!(core::mem::align_of::<VlanHdr>(), 1);
        assert_eq!(core::mem::align_of::<Ipv4Hdr>(), 1);
        assert_eq!(core::mem::align_of::<Ipv6Hdr>(), 1);
        assert_eq!(core::mem::align_of::<UdpHdr>(), 1);
        assert_eq!(core::mem::size_of::<LiveQp>(), 20);
    }

    #[test]
    fn opcode_table() {
        assert!(opcode_flags(opcode::RC_RDMA_WRITE_ONLY).has(OpFlags::RETH));
        assert_eq!(
            ext_headers_len(opcode_flags(opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE)),
            20
        );
        assert_eq!(
            ext_headers_len(opcode_flags(opcode::RC_ATOMIC_ACKNOWLEDGE)),
            12
        );
        assert_eq!(
            ext_headers_len(opcode_flags(opcode::UD_SEND_ONLY_WITH_IMMEDIATE)),
            12
        );
        assert_eq!(ext_headers_len(opcode_flags(opcode::CNP)), 16);
        assert_eq!(opcode_flags(0x15), OpFlags::RESERVED);
        assert_eq!(opcode_flags(0x1f), OpFlags::RESERVED);
        assert_eq!(opcode_flags(0x2c), OpFlags::UNKNOWN, "UC has no READ");
        assert_eq!(opcode_flags(0x40), OpFlags::UNKNOWN, "RD is not supported");
        assert_eq!(
            opcode_flags(0x60),
            OpFlags::UNKNOWN,
            "UD has only SEND_ONLY"
        );
        assert_eq!(opcode_flags(0x82), OpFlags::UNKNOWN);
        assert_eq!(opcode_name(opcode::RC_COMPARE_SWAP), "RC_CMP_SWAP");
        assert_eq!(opcode_name(0xe0), "UNKNOWN");
        assert_eq!(OpFlags::FIRST.position(), Position::First);
        assert_eq!(OpFlags::ONLY.position(), Position::Only);
        assert_eq!(OpFlags::RESERVED.position(), Position::Middle);
        let mut known = 0;
        let mut reserved = 0;
        for o in 0..=255u8 {
            let f = opcode_flags(o);
            if f == OpFlags::RESERVED {
                reserved += 1;
            } else if f.is_known() {
                known += 1;
                assert_ne!(opcode_name(o), "UNKNOWN", "{o:#x}");
            }
        }
        // 23 RC (0x00-0x14, 0x16, 0x17) + 12 UC + 2 UD + 2 CNP + our
        // SR_SACK (0xc0, manufacturer-specific range); 9 RC holes
        assert_eq!(opcode_name(opcode::SR_SACK), "SR_SACK");
        assert_eq!(known, 23 + 12 + 2 + 2 + 1);
        assert_eq!(reserved, 9);
    }
}
