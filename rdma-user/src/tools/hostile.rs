//! Seeded hostile-packet generator: malformed frames, bad opcode sequences,
//! memory violations, bad PSNs and misaddressed packets aimed at one victim
//! QP. The flood test and the parser+engine fuzzer feed it to a receiver;
//! every packet must be dropped (and counted) or NAKed, never applied.

use serde::Serialize;

use crate::rng::Rng;
use crate::transport::SR_WINDOW;
use crate::wire::*;
use rdma_common::opcode;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// Cut short inside the RoCE headers (IP/UDP lengths claim more).
    Truncated,
    BadIcrc,
    /// Pad count larger than the payload.
    BadPad,
    /// An opcode no RC, UC or UD QP knows (dropped by XDP and the parser).
    UnknownOpcode,
    /// A reserved opcode of the RC range (0x15, 0x18-0x1f) at the expected
    /// PSN: NAK Invalid Request.
    ReservedOpcode,
    /// A valid WRITE whose BTH P_Key does not match the QP's.
    BadPkey,
    MiddleWithoutFirst,
    LastAfterOnly,
    WrongRkey,
    VaOutsideMr,
    /// RETH DMA length beyond the MR, or at/above 2^31.
    DmaLenTooLarge,
    /// READ request longer than the MR or at/above 2^31.
    ReadTooLarge,
    UnalignedAtomic,
    PsnFarAhead,
    PsnFarBehind,
    UnknownQpn,
    /// Right QPN and rkey, wrong source address or UDP port.
    SpoofedSource,
}

pub const CLASSES: [Class; 17] = [
    Class::Truncated,
    Class::BadIcrc,
    Class::BadPad,
    Class::UnknownOpcode,
    Class::ReservedOpcode,
    Class::BadPkey,
    Class::MiddleWithoutFirst,
    Class::LastAfterOnly,
    Class::WrongRkey,
    Class::VaOutsideMr,
    Class::DmaLenTooLarge,
    Class::ReadTooLarge,
    Class::UnalignedAtomic,
    Class::PsnFarAhead,
    Class::PsnFarBehind,
    Class::UnknownQpn,
    Class::SpoofedSource,
];

/// What the attacker knows: everything a legitimate peer would (it sees
/// the traffic), so each packet fails on exactly the check it targets.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// Headers as the connected peer sends them (addresses, UDP port).
    pub net: RoceRepr,
    pub qpn: u32,
    /// The victim's expected PSN.
    pub epsn: u32,
    pub rkey: u32,
    pub va: u64,
    pub mr_len: u32,
    /// A QPN that does not exist on the victim's host.
    pub unknown_qpn: u32,
    /// Path MTU: FIRST and MIDDLE packets must be this long to get past the
    /// length checks to the check they target.
    pub mtu: u32,
}

pub struct Generator {
    t: Target,
    rng: Rng,
    payload: Vec<u8>,
}

/// The seeded generator and the random payload both generators draw from.
/// One of `classes`, uniformly.
fn pick<C: Copy>(rng: &mut Rng, classes: &[C]) -> C {
    classes[rng.below(classes.len() as u64) as usize]
}

fn seeded(seed: u64) -> (Rng, Vec<u8>) {
    let mut rng = Rng(seed);
    let mut payload = vec![0u8; 4096];
    rng.fill(&mut payload);
    (rng, payload)
}

impl Generator {
    pub fn new(t: Target, seed: u64) -> Generator {
        let (rng, payload) = seeded(seed);
        Generator { t, rng, payload }
    }

    /// A random class and its frame in `buf` (room for an MTU-sized packet).
    pub fn next(&mut self, buf: &mut [u8]) -> (Class, usize) {
        let c = pick(&mut self.rng, &CLASSES);
        (c, self.frame(c, buf))
    }

    /// One frame of class `c`; returns its length.
    pub fn frame(&mut self, c: Class, buf: &mut [u8]) -> usize {
        let t = self.t;
        let mut r = t.net;
        r.transport = TransportRepr::default();
        let b = &mut r.transport.bth;
        b.opcode = opcode::RC_RDMA_WRITE_ONLY;
        b.dest_qpn = t.qpn;
        b.psn = t.epsn;
        b.pkey = 0xffff;
        b.ack_req = true;
        let mut reth = RethRepr {
            va: t.va,
            rkey: t.rkey,
            dma_len: 0,
        };
        let rnd = self.rng.next_u64();
        let mut len = 1 + (rnd % 64) as usize;
        match c {
            // Emitted as a WRITE_ONLY, patched after emission.
            Class::Truncated | Class::BadIcrc | Class::UnknownOpcode => {}
            Class::ReservedOpcode => {
                const RESERVED: [u8; 9] = [0x15, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f];
                b.opcode = RESERVED[(rnd >> 8) as usize % RESERVED.len()];
            }
            Class::BadPkey => {
                // Another partition, the invalid P_Key 0, or a limited member
                // of another partition.
                const PKEYS: [u16; 4] = [0x8001, 0x0000, 0x7ffe, 0x1234];
                b.pkey = PKEYS[(rnd >> 8) as usize % PKEYS.len()];
            }
            // No payload, so any pad count is larger than it.
            Class::BadPad => len = 0,
            Class::MiddleWithoutFirst => {
                b.opcode = if rnd & 1 == 0 {
                    opcode::RC_SEND_MIDDLE
                } else {
                    opcode::RC_RDMA_WRITE_MIDDLE
                };
                len = t.mtu as usize;
            }
            Class::LastAfterOnly => {
                b.opcode = if rnd & 1 == 0 {
                    opcode::RC_SEND_LAST
                } else {
                    opcode::RC_RDMA_WRITE_LAST
                };
            }
            Class::WrongRkey => reth.rkey ^= 1 + (rnd >> 32) as u32 % 0xffff_fffe,
            Class::VaOutsideMr => {
                reth.va = if rnd & 1 == 0 {
                    t.va + t.mr_len as u64 - (len as u64 / 2).max(1) + 1
                } else {
                    t.va.wrapping_sub(1 + (rnd >> 40))
                };
            }
            Class::DmaLenTooLarge => {
                b.opcode = opcode::RC_RDMA_WRITE_FIRST;
                len = t.mtu as usize;
                reth.dma_len = if rnd & 1 == 0 {
                    t.mr_len + 1 + (rnd >> 48) as u32
                } else {
                    0x8000_0000 | (rnd >> 33) as u32
                };
            }
            Class::ReadTooLarge => {
                b.opcode = opcode::RC_RDMA_READ_REQUEST;
                len = 0;
                reth.dma_len = if rnd & 1 == 0 {
                    t.mr_len + 1 + (rnd >> 48) as u32
                } else {
                    0x8000_0000 | (rnd >> 33) as u32
                };
            }
            Class::UnalignedAtomic => {
                b.opcode = if rnd & 1 == 0 {
                    opcode::RC_FETCH_ADD
                } else {
                    opcode::RC_COMPARE_SWAP
                };
                len = 0;
                r.transport.atomic_eth = Some(AtomicEthRepr {
                    va: t.va + 1 + (rnd >> 8) % 7,
                    rkey: t.rkey,
                    swap_add: 1,
                    compare: 0,
                });
            }
            Class::PsnFarAhead => b.psn = psn_add(t.epsn, (1 << 20) + (rnd >> 44) as u32),
            Class::PsnFarBehind => {
                b.psn = psn_add(t.epsn, (1u32 << 24) - (1 << 20) - (rnd >> 44) as u32)
            }
            Class::UnknownQpn => b.dest_qpn = t.unknown_qpn,
            Class::SpoofedSource => {
                if rnd & 1 == 0 {
                    r.udp.src_port ^= 1 + (rnd >> 16) as u16 % 0xfffe;
                } else {
                    match &mut r.ip {
                        IpRepr::V4(ip) => ip.src[3] ^= 1 + (rnd >> 24) as u8 % 0xfe,
                        IpRepr::V6(ip) => ip.src[15] ^= 1 + (rnd >> 24) as u8 % 0xfe,
                    }
                }
            }
        }
        let flags = rdma_common::opcode_flags(r.transport.bth.opcode);
        if flags.has(OpFlags::RETH) {
            if reth.dma_len == 0 {
                reth.dma_len = len as u32;
            }
            r.transport.reth = Some(reth);
        }
        let payload = &self.payload[..len];
        let n = r.emit(payload, buf).expect("buffer large enough");
        let hl = r.net_header_len();
        match c {
            Class::Truncated => {
                // Keep the UDP header (so it is RoCEv2 to the classifier),
                // cut somewhere before the end.
                return hl + (rnd >> 20) as usize % (n - hl);
            }
            Class::BadIcrc => {
                buf[n - 1 - (rnd >> 8) as usize % 4] ^= 1 << ((rnd >> 16) % 8);
                return n;
            }
            Class::BadPad => buf[hl + 1] |= (1 + (rnd >> 8) as u8 % 3) << 4,
            Class::UnknownOpcode => {
                // Holes of the UC, RD, UD and CNP ranges and a
                // manufacturer-specific opcode (the RC range's holes are
                // ReservedOpcode).
                const UNKNOWN: [u8; 6] = [0x2c, 0x3f, 0x40, 0x60, 0x9f, 0xe0];
                buf[hl] = UNKNOWN[(rnd >> 8) as usize % UNKNOWN.len()];
            }
            _ => return n,
        }
        r.emit_net_and_icrc(buf, n - hl).expect("same length");
        n
    }
}

/// Hostile datagrams for a UD QP: each fails one UD receive check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UdClass {
    /// The right QPN, a Q_Key other than the QP's (IBA 10.2.5).
    WrongQkey,
    /// A UD SEND to a QPN the host does not have.
    UnknownQpn,
    /// More than the posted receive buffer holds after its 40-byte GRH.
    TooLarge,
    /// An RC opcode aimed at the UD QP.
    RcOpcode,
    /// A BTH P_Key other than the QP's.
    BadPkey,
}

pub const UD_CLASSES: [UdClass; 5] = [
    UdClass::WrongQkey,
    UdClass::UnknownQpn,
    UdClass::TooLarge,
    UdClass::RcOpcode,
    UdClass::BadPkey,
];

/// A UD victim, as any sender on the network sees it.
#[derive(Debug, Clone, Copy)]
pub struct UdTarget {
    /// Headers from the attacker to the victim's host.
    pub net: RoceRepr,
    pub qpn: u32,
    pub qkey: u32,
    pub unknown_qpn: u32,
    /// Bytes of the victim's posted receive buffers (GRH included).
    pub recv_len: u32,
    /// The port MTU (TooLarge stays within it when the buffer is smaller).
    pub mtu: u32,
}

pub struct UdGenerator {
    t: UdTarget,
    rng: Rng,
    payload: Vec<u8>,
}

impl UdGenerator {
    pub fn new(t: UdTarget, seed: u64) -> UdGenerator {
        let (rng, payload) = seeded(seed);
        UdGenerator { t, rng, payload }
    }

    /// A random class and its frame in `buf`.
    pub fn next(&mut self, buf: &mut [u8]) -> (UdClass, usize) {
        let c = pick(&mut self.rng, &UD_CLASSES);
        (c, self.frame(c, buf))
    }

    /// One frame of class `c`; returns its length.
    pub fn frame(&mut self, c: UdClass, buf: &mut [u8]) -> usize {
        let t = self.t;
        let rnd = self.rng.next_u64();
        let mut r = t.net;
        r.transport = TransportRepr::default();
        let b = &mut r.transport.bth;
        b.opcode = opcode::UD_SEND_ONLY;
        b.dest_qpn = t.qpn;
        b.psn = (rnd >> 40) as u32 & MASK_24;
        b.pkey = 0xffff;
        let mut deth = DethRepr {
            qkey: t.qkey,
            src_qpn: 0x11 + (rnd >> 8) as u32 % 0x1000,
        };
        // Fits the receive buffer after the GRH.
        let mut len = 1 + (rnd >> 16) as usize % (t.recv_len as usize - 40).min(64);
        match c {
            UdClass::WrongQkey => deth.qkey ^= 1 + (rnd >> 32) as u32 % 0xffff_fffe,
            UdClass::UnknownQpn => b.dest_qpn = t.unknown_qpn,
            UdClass::TooLarge => {
                let room = t.recv_len as usize - 40;
                len = (room + 1 + (rnd >> 24) as usize % 64).min(t.mtu as usize);
            }
            UdClass::RcOpcode => {
                b.opcode = opcode::RC_SEND_ONLY;
                b.ack_req = true;
            }
            UdClass::BadPkey => {
                const PKEYS: [u16; 3] = [0x8001, 0x0000, 0x7ffe];
                b.pkey = PKEYS[(rnd >> 8) as usize % PKEYS.len()];
            }
        }
        if rdma_common::opcode_flags(r.transport.bth.opcode).has(OpFlags::DETH) {
            r.transport.deth = Some(deth);
        }
        r.emit(&self.payload[..len], buf)
            .expect("buffer large enough")
    }
}

/// Hostile frames against selective repeat (issue: loss recovery): SACKs
/// that lie, and traffic of the other recovery mode. Each is counted and
/// dropped; none moves the victim's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SrClass {
    /// A SACK whose PSN is before the victim's oldest unacknowledged PSN
    /// (stale, or forged): nothing new in it (`dropped`).
    SackBeforeWindow,
    /// A SACK expecting a PSN the victim never sent (`sr_bad_sacks`).
    SackBeyondSent,
    /// A SACK at the right PSN whose bitmap claims PSNs never sent
    /// (`sr_bad_sacks`).
    SackClaimsUnsent,
    /// A SACK carrying a NAK syndrome (`sr_bad_sacks`).
    SackNakSyndrome,
    /// Go-back-N's sequence-error NAK to a QP that negotiated selective
    /// repeat (`sr_wrong_mode`).
    SeqNakToSr,
    /// A SACK to a go-back-N QP (`sr_wrong_mode`; the victim must be one).
    SackToGbn,
    /// A WRITE beyond the responder's window (`sr_outside_window`).
    RequestBeyondWindow,
}

pub const SR_CLASSES: [SrClass; 7] = [
    SrClass::SackBeforeWindow,
    SrClass::SackBeyondSent,
    SrClass::SackClaimsUnsent,
    SrClass::SackNakSyndrome,
    SrClass::SeqNakToSr,
    SrClass::SackToGbn,
    SrClass::RequestBeyondWindow,
];

/// A victim QP that has `sent` request PSNs outstanding from `sq_psn`,
/// and expects `epsn` as a responder.
#[derive(Debug, Clone, Copy)]
pub struct SrTarget {
    /// Headers as the connected peer sends them.
    pub net: RoceRepr,
    pub qpn: u32,
    pub sq_psn: u32,
    pub sent: u32,
    pub epsn: u32,
    pub rkey: u32,
    pub va: u64,
}

pub struct SrGenerator {
    t: SrTarget,
    rng: Rng,
    payload: Vec<u8>,
}

impl SrGenerator {
    pub fn new(t: SrTarget, seed: u64) -> SrGenerator {
        let (rng, payload) = seeded(seed);
        SrGenerator { t, rng, payload }
    }

    /// A random class and its frame in `buf`.
    pub fn next(&mut self, buf: &mut [u8]) -> (SrClass, usize) {
        let c = pick(&mut self.rng, &SR_CLASSES);
        (c, self.frame(c, buf))
    }

    /// One frame of class `c`; returns its length.
    pub fn frame(&mut self, c: SrClass, buf: &mut [u8]) -> usize {
        let t = self.t;
        let rnd = self.rng.next_u64();
        let mut r = t.net;
        r.transport = TransportRepr::default();
        let b = &mut r.transport.bth;
        b.opcode = opcode::SR_SACK;
        b.dest_qpn = t.qpn;
        b.psn = t.sq_psn;
        b.pkey = 0xffff;
        let mut aeth = AethRepr {
            syndrome: syndrome::ACK_UNLIMITED,
            msn: (rnd >> 40) as u32 & MASK_24,
        };
        let mut bits = [0u8; SACK_BITMAP_LEN];
        let window = SR_WINDOW;
        // A bit for PSN `sq_psn + 1 + i`.
        let mut set = |i: u32| bits[i as usize / 8] |= 1 << (i % 8);
        let mut len = 0;
        match c {
            SrClass::SackBeforeWindow => {
                b.psn = psn_add(t.sq_psn, MASK_24 - (rnd as u32 % 1000));
                set((rnd >> 16) as u32 % window);
            }
            SrClass::SackBeyondSent => {
                b.psn = psn_add(t.sq_psn, t.sent + 1 + (rnd as u32 % 1000));
            }
            SrClass::SackClaimsUnsent => {
                // Bit i names PSN sq_psn + 1 + i: from i = sent - 1 on,
                // never sent.
                let from = t.sent.saturating_sub(1);
                set(from + (rnd as u32 % (window - from)));
            }
            SrClass::SackNakSyndrome => {
                const NAKS: [u8; 4] = [
                    syndrome::NAK_PSN_SEQ,
                    syndrome::NAK_INVALID_REQUEST,
                    syndrome::NAK_REMOTE_ACCESS,
                    syndrome::NAK_REMOTE_OPERATIONAL,
                ];
                aeth.syndrome = NAKS[rnd as usize % NAKS.len()];
            }
            SrClass::SeqNakToSr => {
                b.opcode = opcode::RC_ACKNOWLEDGE;
                aeth.syndrome = syndrome::NAK_PSN_SEQ;
            }
            SrClass::SackToGbn => {}
            SrClass::RequestBeyondWindow => {
                b.opcode = opcode::RC_RDMA_WRITE_ONLY;
                b.psn = psn_add(t.epsn, window + (rnd as u32 % 1000));
                b.ack_req = true;
                len = 1 + (rnd >> 20) as usize % 64;
                r.transport.reth = Some(RethRepr {
                    va: t.va,
                    rkey: t.rkey,
                    dma_len: len as u32,
                });
            }
        }
        let flags = rdma_common::opcode_flags(r.transport.bth.opcode);
        if flags.has(OpFlags::AETH) {
            r.transport.aeth = Some(aeth);
        }
        if flags.has(OpFlags::SACK_BITMAP) {
            r.transport.sack = Some(bits);
        }
        r.emit(&self.payload[..len], buf)
            .expect("buffer large enough")
    }
}

/// Hostile MADs for QP1, the CM's: each is malformed or unexpected for a
/// host with one established connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CmClass {
    /// A datagram to QP1 whose MAD is cut short.
    Truncated,
    /// A QP1 datagram with a Q_Key other than the GSI's.
    WrongQkey,
    /// An RC opcode aimed at QP1.
    RcOpcode,
    /// A MAD of another management class (SubnAdm).
    WrongClass,
    /// A CM MAD with an attribute the CM does not take (LAP, or unknown).
    UnknownAttribute,
    /// A REP for a REQ nobody sent.
    RepForNoReq,
    /// The live connection's REQ again.
    DuplicateReq,
    /// An RTU or REJ naming the live connection with the wrong peer id.
    WrongPeerId,
}

pub const CM_CLASSES: [CmClass; 8] = [
    CmClass::Truncated,
    CmClass::WrongQkey,
    CmClass::RcOpcode,
    CmClass::WrongClass,
    CmClass::UnknownAttribute,
    CmClass::RepForNoReq,
    CmClass::DuplicateReq,
    CmClass::WrongPeerId,
];

/// A host with one established connection, as its peer sees it.
#[derive(Debug, Clone, Copy)]
pub struct CmTarget {
    /// Headers from the peer's QP1 to the victim's (UD, DETH filled in by
    /// the generator).
    pub net: RoceRepr,
    /// The connection's REQ as the peer sent it.
    pub req: [u8; crate::wire::cm::MAD_LEN],
    /// The victim's comm id, and the peer's.
    pub local_comm_id: u32,
    pub peer_comm_id: u32,
}

pub struct CmGenerator {
    t: CmTarget,
    rng: Rng,
}

impl CmGenerator {
    pub fn new(t: CmTarget, seed: u64) -> CmGenerator {
        CmGenerator { t, rng: Rng(seed) }
    }

    /// A random class and its frame in `buf`.
    pub fn next(&mut self, buf: &mut [u8]) -> (CmClass, usize) {
        let c = pick(&mut self.rng, &CM_CLASSES);
        (c, self.frame(c, buf))
    }

    /// One frame of class `c`; returns its length.
    pub fn frame(&mut self, c: CmClass, buf: &mut [u8]) -> usize {
        use crate::wire::cm::*;
        let t = self.t;
        let rnd = self.rng.next_u64();
        let mut r = t.net;
        r.transport = TransportRepr::default();
        let b = &mut r.transport.bth;
        b.opcode = opcode::UD_SEND_ONLY;
        b.dest_qpn = 1;
        b.pkey = 0xffff;
        b.psn = rnd as u32 & MASK_24;
        let mut deth = DethRepr {
            qkey: GSI_QKEY,
            src_qpn: 1,
        };
        let ids = |local, remote| Rtu {
            local_comm_id: local,
            remote_comm_id: remote,
            private_data: [0; RTU_PRIVATE_LEN],
        };
        let mut mad = match c {
            CmClass::RepForNoReq => CmMad::new(
                rnd,
                CmMessage::Rep(Rep {
                    local_comm_id: (rnd >> 32) as u32,
                    remote_comm_id: (rnd as u32) | 1,
                    local_qkey: 0,
                    local_qpn: 0x99,
                    local_eecn: 0,
                    starting_psn: 0,
                    responder_resources: 0,
                    initiator_depth: 0,
                    target_ack_delay: 0,
                    failover_accepted: 0,
                    end_to_end_flow_control: false,
                    rnr_retry_count: 7,
                    srq: false,
                    local_ca_guid: rnd,
                    private_data: [0; REP_PRIVATE_LEN],
                }),
            )
            .emit(),
            CmClass::DuplicateReq => t.req,
            CmClass::WrongPeerId if rnd & 1 == 0 => CmMad::new(
                rnd,
                CmMessage::Rtu(ids(t.peer_comm_id ^ 0x5a5a_0001, t.local_comm_id)),
            )
            .emit(),
            CmClass::WrongPeerId => CmMad::new(
                rnd,
                CmMessage::Rej(Rej {
                    local_comm_id: t.peer_comm_id ^ 0x5a5a_0001,
                    remote_comm_id: t.local_comm_id,
                    message_rejected: msg::OTHER,
                    reject_info_length: 0,
                    reason: rej::CONSUMER_REJECT,
                    ari: [0; REJ_ARI_LEN],
                    private_data: [0; REJ_PRIVATE_LEN],
                }),
            )
            .emit(),
            _ => CmMad::new(rnd, CmMessage::Rtu(ids(t.peer_comm_id, t.local_comm_id))).emit(),
        };
        let mut len = MAD_LEN;
        match c {
            CmClass::Truncated => len = 24 + (rnd >> 8) as usize % (MAD_LEN - 24),
            CmClass::WrongQkey => deth.qkey = (rnd >> 32) as u32 & !GSI_QKEY | 1,
            CmClass::RcOpcode => r.transport.bth.opcode = opcode::RC_SEND_ONLY,
            CmClass::WrongClass => mad[1] = 0x03,
            CmClass::UnknownAttribute => {
                let attr = if rnd & 1 == 0 {
                    attr::LAP
                } else {
                    0x20 + (rnd >> 8) as u16 % 0x100
                };
                mad[16..18].copy_from_slice(&attr.to_be_bytes());
            }
            _ => {}
        }
        // Truncated MADs are padded to a multiple of 4 as RoCE requires.
        len = len.next_multiple_of(4).min(MAD_LEN);
        if rdma_common::opcode_flags(r.transport.bth.opcode).has(OpFlags::DETH) {
            r.transport.deth = Some(deth);
        }
        r.emit(&mad[..len], buf).expect("buffer large enough")
    }
}
