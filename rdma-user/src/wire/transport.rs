//! The InfiniBand transport headers: BTH, the extension headers its
//! opcode selects (RETH, AtomicETH, DETH, AETH, AtomicAckETH, ImmDt, IETH),
//! and the AETH syndrome.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BthRepr {
    pub opcode: u8,
    pub solicited: bool,
    pub mig_req: bool,
    pub pad_count: u8,
    pub tver: u8,
    pub pkey: u16,
    /// Reserved byte 4 (F/B on IB); carried so re-emitting is exact.
    pub resv8a: u8,
    pub dest_qpn: u32,
    pub ack_req: bool,
    /// The seven reserved bits after AckReq.
    pub resv7: u8,
    pub psn: u32,
}

impl BthRepr {
    pub fn parse(h: &Bth) -> Self {
        BthRepr {
            opcode: h.opcode,
            solicited: h.flags & Bth::SE != 0,
            mig_req: h.flags & Bth::MIG_REQ != 0,
            pad_count: h.pad_count(),
            tver: h.tver(),
            pkey: h.pkey(),
            resv8a: h.resv8a,
            dest_qpn: h.dest_qpn(),
            ack_req: h.ack_req & Bth::ACK_REQ != 0,
            resv7: h.ack_req & 0x7f,
            psn: h.psn(),
        }
    }

    pub fn emit(&self, h: &mut Bth) {
        h.opcode = self.opcode;
        h.flags = (if self.solicited { Bth::SE } else { 0 })
            | (if self.mig_req { Bth::MIG_REQ } else { 0 })
            | ((self.pad_count & 3) << 4)
            | (self.tver & 0xf);
        h.set_pkey(self.pkey);
        h.resv8a = self.resv8a;
        h.set_dest_qpn(self.dest_qpn);
        h.ack_req = (if self.ack_req { Bth::ACK_REQ } else { 0 }) | (self.resv7 & 0x7f);
        h.set_psn(self.psn);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RethRepr {
    pub va: u64,
    pub rkey: u32,
    pub dma_len: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtomicEthRepr {
    pub va: u64,
    pub rkey: u32,
    pub swap_add: u64,
    pub compare: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DethRepr {
    pub qkey: u32,
    pub src_qpn: u32,
}

/// NAK codes of the AETH syndrome (IBA table 45).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NakCode {
    PsnSequenceError,
    InvalidRequest,
    RemoteAccessError,
    RemoteOperationalError,
    InvalidRdRequest,
    Reserved(u8),
}

/// Decoded AETH syndrome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syndrome {
    /// ACK with a credit count (31 = "invalid", i.e. no end-to-end flow
    /// control, which is what rxe sends).
    Ack {
        credits: u8,
    },
    /// RNR NAK with the 5-bit RNR timer code.
    RnrNak {
        timer: u8,
    },
    Nak(NakCode),
    Reserved(u8),
}

/// The syndromes the engine sends, as bytes ([`Syndrome::encode`] of each).
pub mod syndrome {
    use super::{NakCode, Syndrome};
    pub const ACK_UNLIMITED: u8 = Syndrome::Ack { credits: 0x1f }.encode();
    /// An RNR NAK with timer code 0; the code goes in the low 5 bits.
    pub const RNR_NAK: u8 = Syndrome::RnrNak { timer: 0 }.encode();
    pub const NAK_PSN_SEQ: u8 = Syndrome::Nak(NakCode::PsnSequenceError).encode();
    pub const NAK_INVALID_REQUEST: u8 = Syndrome::Nak(NakCode::InvalidRequest).encode();
    pub const NAK_REMOTE_ACCESS: u8 = Syndrome::Nak(NakCode::RemoteAccessError).encode();
    pub const NAK_REMOTE_OPERATIONAL: u8 = Syndrome::Nak(NakCode::RemoteOperationalError).encode();
}

impl Syndrome {
    /// The AETH syndrome byte (IBA 9.7.5.2.1: bits 6-5 the kind, 4-0 the
    /// credit count, RNR timer or NAK code). The inverse of [`Syndrome::decode`].
    pub const fn encode(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => credits & 0x1f,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            Syndrome::Nak(code) => {
                0x60 | match code {
                    NakCode::PsnSequenceError => 0,
                    NakCode::InvalidRequest => 1,
                    NakCode::RemoteAccessError => 2,
                    NakCode::RemoteOperationalError => 3,
                    NakCode::InvalidRdRequest => 4,
                    NakCode::Reserved(x) => x & 0x1f,
                }
            }
            Syndrome::Reserved(s) => s,
        }
    }

    pub fn decode(s: u8) -> Syndrome {
        let v = s & 0x1f;
        match (s >> 5) & 0x3 {
            0 => Syndrome::Ack { credits: v },
            1 => Syndrome::RnrNak { timer: v },
            3 => Syndrome::Nak(match v {
                0 => NakCode::PsnSequenceError,
                1 => NakCode::InvalidRequest,
                2 => NakCode::RemoteAccessError,
                3 => NakCode::RemoteOperationalError,
                4 => NakCode::InvalidRdRequest,
                x => NakCode::Reserved(x),
            }),
            _ => Syndrome::Reserved(s),
        }
    }
}

impl fmt::Display for Syndrome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Syndrome::Ack { credits } => write!(f, "ACK credits={credits}"),
            Syndrome::RnrNak { timer } => write!(f, "RNR NAK timer={timer}"),
            Syndrome::Nak(NakCode::PsnSequenceError) => f.write_str("NAK PSN sequence error"),
            Syndrome::Nak(NakCode::InvalidRequest) => f.write_str("NAK invalid request"),
            Syndrome::Nak(NakCode::RemoteAccessError) => f.write_str("NAK remote access error"),
            Syndrome::Nak(NakCode::RemoteOperationalError) => {
                f.write_str("NAK remote operational error")
            }
            Syndrome::Nak(NakCode::InvalidRdRequest) => f.write_str("NAK invalid RD request"),
            Syndrome::Nak(NakCode::Reserved(c)) => write!(f, "NAK reserved code {c}"),
            Syndrome::Reserved(s) => write!(f, "reserved syndrome {s:#x}"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AethRepr {
    pub syndrome: u8,
    pub msn: u32,
}

/// The extension header `present` at `*off` if `flags` has it (advancing
/// `*off` past it).
#[inline(always)]
pub(super) fn ext_header<'a>(
    buf: &'a [u8],
    flags: OpFlags,
    present: OpFlags,
    len: usize,
    off: &mut usize,
) -> Option<&'a [u8]> {
    let at = *off;
    if !flags.has(present) {
        return None;
    }
    *off += len;
    Some(&buf[at..])
}

/// BTH plus the extension headers its opcode selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TransportRepr {
    pub bth: BthRepr,
    pub reth: Option<RethRepr>,
    pub atomic_eth: Option<AtomicEthRepr>,
    pub deth: Option<DethRepr>,
    pub aeth: Option<AethRepr>,
    pub atomic_ack: Option<u64>,
    pub imm: Option<u32>,
    pub ieth: Option<u32>,
    /// The CNP's 16 reserved bytes (zero when sent by a conforming peer).
    pub cnp_reserved: Option<[u8; CNP_RESERVED_LEN]>,
    /// SR_SACK: the bitmap of PSNs held after BTH.PSN.
    pub sack: Option<[u8; SACK_BITMAP_LEN]>,
}

impl TransportRepr {
    /// A BTH without extension headers, to fill in. Cheaper than
    /// `Default` on the per-packet path: only the option tags are written.
    #[inline]
    pub fn new(bth: BthRepr) -> Self {
        TransportRepr {
            bth,
            reth: None,
            atomic_eth: None,
            deth: None,
            aeth: None,
            atomic_ack: None,
            imm: None,
            ieth: None,
            cnp_reserved: None,
            sack: None,
        }
    }

    /// Parses a UDP payload (BTH through ICRC). Checks TVer, the opcode, the
    /// pad count and that payload-less opcodes carry none; does not check the
    /// ICRC (that needs the IP header, see [`RoceRepr::parse`]). Returns the
    /// range of the payload within `buf`.
    #[inline(always)]
    pub fn parse(buf: &[u8]) -> Result<(Self, Range<usize>)> {
        let bth = BthRepr::parse(Bth::view(buf)?);
        if bth.tver != 0 {
            return Err(WireError::BadTver);
        }
        let (flags, ext_len) = OPCODE_FLAGS[bth.opcode as usize];
        if !flags.is_known() {
            return Err(WireError::UnknownOpcode);
        }
        let hdr_len = Bth::LEN + ext_len as usize;
        if buf.len() < hdr_len + ICRC_LEN {
            return Err(WireError::Truncated);
        }
        // Wire order: RETH | AtomicETH | DETH, then AETH, AtomicAckETH,
        // ImmDt | IETH. Each field is parsed into a local and the repr built
        // in one expression at the end, so it is written straight into the
        // caller's slot instead of being copied there.
        let mut off = Bth::LEN;
        let mut next =
            |present: OpFlags, len: usize| ext_header(buf, flags, present, len, &mut off);
        let reth = next(OpFlags::RETH, Reth::LEN)
            .map(|b| {
                Reth::view(b).map(|h| RethRepr {
                    va: h.va(),
                    rkey: h.rkey(),
                    dma_len: h.dma_len(),
                })
            })
            .transpose()?;
        let atomic_eth = next(OpFlags::ATOMIC_ETH, AtomicEth::LEN)
            .map(|b| {
                AtomicEth::view(b).map(|h| AtomicEthRepr {
                    va: h.va(),
                    rkey: h.rkey(),
                    swap_add: h.swap_add(),
                    compare: h.compare(),
                })
            })
            .transpose()?;
        let deth = next(OpFlags::DETH, Deth::LEN)
            .map(|b| {
                Deth::view(b).map(|h| DethRepr {
                    qkey: h.qkey(),
                    src_qpn: h.src_qpn(),
                })
            })
            .transpose()?;
        let aeth = next(OpFlags::AETH, Aeth::LEN)
            .map(|b| {
                Aeth::view(b).map(|h| AethRepr {
                    syndrome: h.syndrome,
                    msn: h.msn(),
                })
            })
            .transpose()?;
        let atomic_ack = next(OpFlags::ATOMIC_ACK_ETH, AtomicAckEth::LEN)
            .map(|b| AtomicAckEth::view(b).map(|h| h.orig()))
            .transpose()?;
        let imm = next(OpFlags::IMM, ImmDt::LEN)
            .map(|b| ImmDt::view(b).map(|h| h.imm()))
            .transpose()?;
        let ieth = next(OpFlags::IETH, Ieth::LEN)
            .map(|b| Ieth::view(b).map(|h| h.rkey()))
            .transpose()?;
        let cnp_reserved = next(OpFlags::CNP_RESERVED, CNP_RESERVED_LEN).map(|b| {
            let mut r = [0u8; CNP_RESERVED_LEN];
            r.copy_from_slice(&b[..CNP_RESERVED_LEN]);
            r
        });
        let sack = next(OpFlags::SACK_BITMAP, SACK_BITMAP_LEN).map(|b| {
            let mut r = [0u8; SACK_BITMAP_LEN];
            r.copy_from_slice(&b[..SACK_BITMAP_LEN]);
            r
        });
        debug_assert_eq!(off, hdr_len);
        let padded = buf.len() - hdr_len - ICRC_LEN;
        let pad = bth.pad_count as usize;
        if !padded.is_multiple_of(4) || pad > padded {
            return Err(WireError::BadPadCount);
        }
        if !flags.any(OpFlags::PAYLOAD | OpFlags::RESERVED) && padded != 0 {
            return Err(WireError::BadPadCount);
        }
        Ok((
            TransportRepr {
                bth,
                reth,
                atomic_eth,
                deth,
                aeth,
                atomic_ack,
                imm,
                ieth,
                cnp_reserved,
                sack,
            },
            hdr_len..hdr_len + padded - pad,
        ))
    }

    pub fn flags(&self) -> OpFlags {
        opcode_flags(self.bth.opcode)
    }

    pub fn header_len(&self) -> usize {
        Bth::LEN + OPCODE_FLAGS[self.bth.opcode as usize].1 as usize
    }

    /// Writes the BTH and extension headers; the BTH pad count is taken from
    /// `payload_len`. Returns the header length.
    pub fn emit(&self, buf: &mut [u8], payload_len: usize) -> Result<usize> {
        let (flags, ext_len) = OPCODE_FLAGS[self.bth.opcode as usize];
        let hl = Bth::LEN + ext_len as usize;
        if buf.len() < hl {
            return Err(WireError::Truncated);
        }
        let mut bth = self.bth;
        bth.pad_count = pad_for(payload_len) as u8;
        bth.emit(Bth::view_mut(buf)?);
        let mut off = Bth::LEN;
        if flags.has(OpFlags::RETH) {
            let r = self.reth.unwrap_or_default();
            let h = Reth::view_mut(&mut buf[off..])?;
            h.set_va(r.va);
            h.set_rkey(r.rkey);
            h.set_dma_len(r.dma_len);
            off += Reth::LEN;
        }
        if flags.has(OpFlags::ATOMIC_ETH) {
            let r = self.atomic_eth.unwrap_or_default();
            let h = AtomicEth::view_mut(&mut buf[off..])?;
            h.set_va(r.va);
            h.set_rkey(r.rkey);
            h.set_swap_add(r.swap_add);
            h.set_compare(r.compare);
            off += AtomicEth::LEN;
        }
        if flags.has(OpFlags::DETH) {
            let r = self.deth.unwrap_or_default();
            let h = Deth::view_mut(&mut buf[off..])?;
            h.set_qkey(r.qkey);
            h.resv = 0;
            h.set_src_qpn(r.src_qpn);
            off += Deth::LEN;
        }
        if flags.has(OpFlags::AETH) {
            let r = self.aeth.unwrap_or_default();
            let h = Aeth::view_mut(&mut buf[off..])?;
            h.syndrome = r.syndrome;
            h.set_msn(r.msn);
            off += Aeth::LEN;
        }
        if flags.has(OpFlags::ATOMIC_ACK_ETH) {
            AtomicAckEth::view_mut(&mut buf[off..])?.set_orig(self.atomic_ack.unwrap_or(0));
            off += AtomicAckEth::LEN;
        }
        if flags.has(OpFlags::IMM) {
            ImmDt::view_mut(&mut buf[off..])?.set_imm(self.imm.unwrap_or(0));
            off += ImmDt::LEN;
        }
        if flags.has(OpFlags::IETH) {
            Ieth::view_mut(&mut buf[off..])?.set_rkey(self.ieth.unwrap_or(0));
            off += Ieth::LEN;
        }
        if flags.has(OpFlags::CNP_RESERVED) {
            buf[off..off + CNP_RESERVED_LEN].copy_from_slice(&self.cnp_reserved.unwrap_or([0; 16]));
            off += CNP_RESERVED_LEN;
        }
        if flags.has(OpFlags::SACK_BITMAP) {
            buf[off..off + SACK_BITMAP_LEN].copy_from_slice(&self.sack.unwrap_or([0; 32]));
            off += SACK_BITMAP_LEN;
        }
        Ok(off)
    }
}

/// Pad bytes that bring a payload of `len` bytes to a multiple of 4.
#[inline]
pub fn pad_for(len: usize) -> usize {
    (4 - (len & 3)) & 3
}
