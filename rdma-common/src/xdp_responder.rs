//! The XDP responder: in-order RDMA WRITEs into MRs of the MR pool,
//! placed and ACKed by the XDP program itself; in-order atomics
//! (FETCH_ADD, CMP_SWAP) on them, done with BPF atomics and answered with
//! the atomic ACK; and in-order single-packet READs from them, answered
//! with READ_RESPONSE_ONLY when the response fits the frame.
//!
//! Everything here is shared by the XDP program and user space, so that
//! the decision the program takes is the one the tests check against the
//! engine (`rdma-user/src/transport/responder.rs`): [`check_write`],
//! [`check_atomic`] and [`check_read`] run the responder's checks for the
//! cases the program serves, in the engine's order, and can only say
//! "place" or "punt, for this reason". It never NAKs: every case the
//! engine would answer otherwise is punted to user space, where the
//! engine decides.
//!
//! Written for the verifier: no slices of run-time length, bounded loops,
//! fixed-size buffers.

use bytemuck::{Pod, Zeroable};

use crate::{opcode, AtomicAckEth, Ipv4Hdr, UdpHdr, ICRC_LEN};

/// Who may touch a QP's responder state ([`RespState::owner`]). Changed
/// only by atomic compare-and-swap or exchange.
pub mod owner {
    /// The engine in user space: XDP redirects every request.
    pub const USER: u64 = 0;
    /// Lent to XDP: it serves in-order WRITEs into the pool.
    pub const XDP: u64 = 1;
    /// XDP is in the middle of one packet. User space waits for it to end
    /// (one packet's work) before it takes the state back.
    pub const BUSY: u64 = 2;
}

/// Why XDP left a request to user space (per QP in [`RespState::punts`]).
pub mod punt {
    /// Not a WRITE without immediate, an atomic or a READ (SEND, WRITE
    /// with immediate, reserved...).
    pub const NOT_WRITE: usize = 0;
    /// The P_Key does not match the QP's.
    pub const PKEY: usize = 1;
    /// Not the expected PSN: a duplicate or out of order.
    pub const PSN: usize = 2;
    /// Opcode sequence: MIDDLE/LAST outside a WRITE, FIRST/ONLY inside one.
    pub const SEQUENCE: usize = 3;
    /// Payload length against the MTU or the RETH, or the RETH's DMA
    /// length above 2^31.
    pub const LENGTH: usize = 4;
    /// The R_Key is no MR of the pool.
    pub const NOT_POOL: usize = 5;
    /// PD, access flags (the MR's or the QP's) or the range; an atomic's
    /// address not 8-byte aligned.
    pub const ACCESS: usize = 6;
    /// The pad count is larger than the payload, or the headers are not
    /// the plain ones (IPv4 options).
    pub const MALFORMED: usize = 7;
    /// The ICRC does not match.
    pub const ICRC: usize = 8;
    /// The source is not the connected peer.
    pub const SOURCE: usize = 9;
    /// A payload larger than a page (no MTU allows it), or a READ of
    /// more than one packet.
    pub const TOO_LONG: usize = 10;
    /// The ACK could not be sent by XDP_TX (the frame did not shrink).
    pub const TX: usize = 11;
    /// Marked CE (ECN 11): the engine's notification point decides on a
    /// CNP.
    pub const CE: usize = 12;
    /// A FETCH_ADD lost its compare-and-swap races to the application's
    /// own atomics on the same 8 bytes (nothing was changed).
    pub const CONTENDED: usize = 13;
    /// A READ's response is longer than the frame can grow to (its
    /// tailroom): nothing was changed.
    pub const NO_ROOM: usize = 14;
    pub const COUNT: usize = 15;

    pub const NAMES: [&str; COUNT] = [
        "not_write",
        "pkey",
        "psn",
        "sequence",
        "length",
        "not_pool",
        "access",
        "malformed",
        "icrc",
        "source",
        "too_long",
        "tx",
        "ce",
        "contended",
        "no_room",
    ];
}

/// Room for the longest ACK frame: Ethernet with a VLAN tag, IPv6, UDP,
/// BTH, AETH, ICRC (86 bytes). A power of two, so that masked indices
/// are visibly in bounds (for the verifier).
pub const ACK_TMPL_LEN: usize = 128;
const M: usize = ACK_TMPL_LEN - 1;

/// Where a response's IP header sits in a [`RespBuf`] (and in the
/// template, [`RespState::ack`]): 8-byte aligned, so that the ICRC hashes
/// the headers a 64-bit word at a time. The frame starts `ack_l3` bytes
/// before ([`frame_start`]).
pub const IP_AT: usize = 24;

/// A response frame being built: 128 bytes, 8-byte aligned, the frame at
/// [`frame_start`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct RespBuf(pub [u64; ACK_TMPL_LEN / 8]);

impl Default for RespBuf {
    fn default() -> Self {
        Zeroable::zeroed()
    }
}

impl RespBuf {
    #[inline(always)]
    pub fn bytes(&self) -> &[u8; ACK_TMPL_LEN] {
        // SAFETY: the same 128 bytes; u8 has no alignment or invalid values.
        unsafe { &*(self.0.as_ptr() as *const [u8; ACK_TMPL_LEN]) }
    }

    #[inline(always)]
    pub fn bytes_mut(&mut self) -> &mut [u8; ACK_TMPL_LEN] {
        // SAFETY: as `bytes`; any bytes are valid u64s.
        unsafe { &mut *(self.0.as_mut_ptr() as *mut [u8; ACK_TMPL_LEN]) }
    }
}

/// Where the frame starts in a [`RespBuf`] built for `st`.
#[inline(always)]
pub fn frame_start(st: &RespState) -> usize {
    IP_AT.wrapping_sub(st.ack_l3 as usize) & 31
}

/// The `n`-byte frame [`build_resp`] or [`build_read_head`] built.
pub fn resp_frame<'a>(st: &RespState, out: &'a RespBuf, n: usize) -> &'a [u8] {
    &out.bytes()[frame_start(st)..frame_start(st) + n]
}

/// The template for [`RespState::ack`]: the engine's ACK `frame` (IP
/// header at `l3`) placed with its IP header at [`IP_AT`]. `None` if it
/// does not fit.
pub fn place_ack_template(frame: &[u8], l3: usize) -> Option<RespBuf> {
    let start = IP_AT.checked_sub(l3)?;
    let mut b = RespBuf::default();
    b.bytes_mut()
        .get_mut(start..start + frame.len())?
        .copy_from_slice(frame);
    Some(b)
}

/// Slots of `RESP_STATE`: QPs that can be lent to XDP at once.
pub const RESP_SLOTS: u32 = 256;

/// Slots of `POOL_MRS`, indexed by an R_Key's low bits.
pub const POOL_MR_SLOTS: u32 = 1024;

/// READs and atomics XDP remembers for duplicates: as many as the
/// engine's ring of READ/atomic resources (`MAX_RD_ATOMIC`), a power of
/// two.
pub const RD_ATOMIC_RES: usize = 16;

/// A READ or an atomic XDP executed (rxe's `resp_res`): its PSN and, for
/// an atomic, the value it found, which a duplicate must get again (never
/// a second execution). A duplicate READ is executed again; the entry
/// says that it was a READ of one packet.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct RdAtomicRes {
    pub psn: u32,
    /// 1: a READ; 0: an atomic.
    pub read: u32,
    pub orig: u64,
}

/// A QP's responder state while XDP may serve it, and its counters. One
/// value of the `BPF_F_MMAPABLE` array `RESP_STATE`, shared with user
/// space by `mmap`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct RespState {
    /// [`owner`]: USER, XDP or BUSY. 64 bits: the BPF target has 64-bit
    /// atomics only.
    pub owner: u64,
    /// The QP this slot belongs to (a slot reused by another QP never
    /// serves the old one's packets).
    pub qpn: u32,
    /// The expected PSN.
    pub epsn: u32,
    /// The message sequence number: messages completed.
    pub msn: u32,
    /// The QP's P_Key.
    pub pkey: u32,
    pub _pad0: u32,
    /// The path MTU in bytes.
    pub mtu: u32,
    pub pd: u32,
    /// The QP's access flags (`ibv_access_flags`).
    pub qp_access: u32,
    /// Non-zero: a multi-packet WRITE is in progress (the `w_` fields).
    pub in_write: u32,
    pub w_rkey: u32,
    pub w_total: u32,
    /// Bytes of the WRITE placed so far.
    pub w_offset: u32,
    pub w_va: u64,
    /// The ACK frame's length with its ICRC, the offset of its IP header,
    /// and 1 for IPv4.
    pub ack_len: u32,
    pub ack_l3: u32,
    pub ack_ipv4: u32,
    /// The IPv4 ID of the last frame (the engine's per-QP counter).
    pub ip_id: u32,
    /// The connected peer: its address as a GID (IPv4 as `::ffff:a.b.c.d`)
    /// and the UDP source port its packets carry. Anything else punts.
    pub peer_gid: [u8; 16],
    pub peer_sport: u32,
    pub _pad: u32,
    /// The ACK frame as the engine emits it, for PSN 0, MSN 0, with its IP
    /// header at [`IP_AT`] ([`place_ack_template`]); XDP patches the PSN,
    /// MSN, IPv4 ID and checksum, and the ICRC.
    pub ack: RespBuf,
    /// Counters, written by XDP only.
    pub placed: u64,
    pub placed_bytes: u64,
    pub acks: u64,
    pub punts: [u64; punt::COUNT],
    /// Atomics executed.
    pub atomics: u64,
    /// READs answered.
    pub reads: u64,
    pub read_bytes: u64,
    /// READs and atomics executed since user space lent the QP (it sets
    /// 0): the last [`RD_ATOMIC_RES`] are in `res`, at `n % RD_ATOMIC_RES`.
    /// User space puts them into the engine's resources when it takes the
    /// QP back.
    pub res_next: u32,
    pub _pad2: u32,
    pub res: [RdAtomicRes; RD_ATOMIC_RES],
}

impl Default for RespState {
    fn default() -> Self {
        Zeroable::zeroed()
    }
}

/// An MR of the pool as XDP sees it: one value of `POOL_MRS`, at the
/// R_Key's low bits. User space writes it at registration and clears it
/// before the range is freed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct PoolMr {
    pub rkey: u32,
    pub pd: u32,
    /// The MR's access flags (`ibv_access_flags`).
    pub access: u32,
    /// Non-zero when the entry is in use.
    pub valid: u32,
    /// The address peers use for the MR's first byte.
    pub iova: u64,
    pub len: u64,
    /// Where the MR's first byte is in the pool.
    pub pool_off: u64,
}

/// `IBV_ACCESS_REMOTE_WRITE`.
pub const ACCESS_REMOTE_WRITE: u32 = 2;
/// `IBV_ACCESS_REMOTE_READ`.
pub const ACCESS_REMOTE_READ: u32 = 4;
/// `IBV_ACCESS_REMOTE_ATOMIC`.
pub const ACCESS_REMOTE_ATOMIC: u32 = 8;

/// The largest message (IBA C9-92: 2^31 bytes).
pub const MAX_MSG_LEN: u64 = 1 << 31;

const PSN_MASK: u32 = 0x00ff_ffff;

/// Whether a packet's P_Key matches the QP's (IBA 10.9.3): the same low
/// 15 bits, not the invalid key, and one of the two a full member.
#[inline(always)]
pub fn pkey_matches(ours: u16, theirs: u16) -> bool {
    ours & 0x7fff == theirs & 0x7fff && ours & 0x7fff != 0 && (ours | theirs) & 0x8000 != 0
}

/// The fields of an RC WRITE request the XDP responder decides on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteReq {
    pub opcode: u8,
    pub ack_req: bool,
    pub pkey: u16,
    pub psn: u32,
    /// The RETH (FIRST and ONLY only).
    pub va: u64,
    pub rkey: u32,
    pub dma_len: u32,
    /// Payload bytes, the pad excluded.
    pub plen: u32,
}

/// Where a WRITE packet's payload goes, and what follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    /// Pool offset of the first payload byte (only meaningful if `len > 0`).
    pub pool_off: u64,
    pub len: u32,
    /// The last packet of its message.
    pub ends: bool,
    /// AckReq was set: answer with an ACK of this PSN.
    pub ack: bool,
    /// The WRITE in progress after this packet (when it does not end).
    pub rkey: u32,
    pub va: u64,
    pub total: u32,
    pub offset: u32,
}

/// FIRST, MIDDLE, LAST or ONLY of an RC RDMA WRITE without immediate: the
/// only opcodes the XDP responder serves.
#[inline(always)]
pub fn is_served_write(opc: u8) -> bool {
    matches!(
        opc,
        opcode::RC_RDMA_WRITE_FIRST
            | opcode::RC_RDMA_WRITE_MIDDLE
            | opcode::RC_RDMA_WRITE_LAST
            | opcode::RC_RDMA_WRITE_ONLY
    )
}

/// The R_Key whose MR the packet writes into: the RETH's for FIRST and
/// ONLY, the message's for MIDDLE and LAST.
#[inline(always)]
pub fn write_rkey(st: &RespState, p: &WriteReq) -> u32 {
    if st.in_write != 0 {
        st.w_rkey
    } else {
        p.rkey
    }
}

/// Checks `rkey`'s pool MR for a remote access (`need`, an access flag)
/// to `va..va+len` by a QP of protection domain `pd`, as
/// `MrTable::resolve` does; the pool offset of `va` if allowed.
#[inline(always)]
fn resolve(
    mr: Option<&PoolMr>,
    rkey: u32,
    pd: u32,
    va: u64,
    len: u64,
    need: u32,
) -> Result<u64, usize> {
    let Some(mr) = mr else {
        return Err(punt::NOT_POOL);
    };
    if mr.valid == 0 || mr.rkey != rkey {
        return Err(punt::NOT_POOL);
    }
    if mr.pd != pd || mr.access & need == 0 || len > MAX_MSG_LEN {
        return Err(punt::ACCESS);
    }
    let Some(off) = va.checked_sub(mr.iova) else {
        return Err(punt::ACCESS);
    };
    match off.checked_add(len) {
        Some(end) if end <= mr.len => {}
        _ => return Err(punt::ACCESS),
    }
    // The entry itself stays inside the pool (user space writes it so;
    // checked again because the placement must never leave the pool).
    match mr.pool_off.checked_add(mr.len) {
        Some(e) if e <= crate::mr_pool::BYTES as u64 => Ok(mr.pool_off + off),
        _ => Err(punt::NOT_POOL),
    }
}

/// The responder's checks for one in-order WRITE packet (the table in
/// `transport/responder.rs`, rows 11-22, in that order), for a QP whose
/// state is `st`; `mr` is the pool MR at [`write_rkey`]'s slot, if any.
/// `Ok`: the engine would place the payload there and ACK it if asked.
/// `Err(reason)`: user space decides (it may NAK, drop or RNR).
#[inline(always)]
pub fn check_write(st: &RespState, p: &WriteReq, mr: Option<&PoolMr>) -> Result<Place, usize> {
    if !is_served_write(p.opcode) {
        return Err(punt::NOT_WRITE);
    }
    if !pkey_matches(st.pkey as u16, p.pkey) {
        return Err(punt::PKEY);
    }
    if p.psn != st.epsn {
        return Err(punt::PSN);
    }
    let first = matches!(
        p.opcode,
        opcode::RC_RDMA_WRITE_FIRST | opcode::RC_RDMA_WRITE_ONLY
    );
    let ends = matches!(
        p.opcode,
        opcode::RC_RDMA_WRITE_LAST | opcode::RC_RDMA_WRITE_ONLY
    );
    if first == (st.in_write != 0) {
        return Err(punt::SEQUENCE);
    }
    let len_ok = match p.opcode {
        opcode::RC_RDMA_WRITE_FIRST | opcode::RC_RDMA_WRITE_MIDDLE => p.plen == st.mtu,
        opcode::RC_RDMA_WRITE_LAST => p.plen >= 1 && p.plen <= st.mtu,
        _ => p.plen <= st.mtu,
    };
    if !len_ok {
        return Err(punt::LENGTH);
    }
    if first && p.dma_len as u64 > MAX_MSG_LEN {
        return Err(punt::LENGTH);
    }
    let (rkey, va, total, offset) = if first {
        (p.rkey, p.va, p.dma_len, 0)
    } else {
        (st.w_rkey, st.w_va, st.w_total, st.w_offset)
    };
    let end = offset as u64 + p.plen as u64;
    if end > total as u64 || (ends && end != total as u64) {
        return Err(punt::LENGTH);
    }
    if offset == 0 && total > 0 {
        resolve(mr, rkey, st.pd, va, total as u64, ACCESS_REMOTE_WRITE)?;
        if st.qp_access & ACCESS_REMOTE_WRITE == 0 {
            return Err(punt::ACCESS);
        }
    }
    let pool_off = if p.plen > 0 {
        resolve(
            mr,
            rkey,
            st.pd,
            va.wrapping_add(offset as u64),
            p.plen as u64,
            ACCESS_REMOTE_WRITE,
        )?
    } else {
        0
    };
    if p.plen as usize > crate::mr_pool::PAGE {
        return Err(punt::TOO_LONG);
    }
    Ok(Place {
        pool_off,
        len: p.plen,
        ends,
        ack: p.ack_req,
        rkey,
        va,
        total,
        offset: end as u32,
    })
}

/// The state after `p` was placed as `pl` says (the engine's updates:
/// next PSN, the MSN at a message's end, the WRITE in progress).
#[inline(always)]
pub fn commit(st: &mut RespState, p: &WriteReq, pl: &Place) {
    st.epsn = p.psn.wrapping_add(1) & PSN_MASK;
    if pl.ends {
        st.msn = st.msn.wrapping_add(1) & PSN_MASK;
        st.in_write = 0;
        st.w_rkey = 0;
        st.w_va = 0;
        st.w_total = 0;
        st.w_offset = 0;
    } else {
        st.in_write = 1;
        st.w_rkey = pl.rkey;
        st.w_va = pl.va;
        st.w_total = pl.total;
        st.w_offset = pl.offset;
    }
    st.placed += 1;
    st.placed_bytes += pl.len as u64;
}

/// The fields of an RC atomic request (CMP_SWAP, FETCH_ADD) the XDP
/// responder decides on, host order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AtomicReq {
    pub opcode: u8,
    pub pkey: u16,
    pub psn: u32,
    pub va: u64,
    pub rkey: u32,
    pub swap_add: u64,
    pub compare: u64,
    /// Bytes after the AtomicETH, the pad excluded (an atomic has none).
    pub plen: u32,
}

/// CMP_SWAP or FETCH_ADD on an RC QP.
#[inline(always)]
pub fn is_served_atomic(opc: u8) -> bool {
    matches!(opc, opcode::RC_COMPARE_SWAP | opcode::RC_FETCH_ADD)
}

/// The responder's checks for one in-order atomic (the table in
/// `transport/responder.rs`: rows 11-13, then 23-25, as the engine runs
/// them), for a QP whose state is `st`; `mr` is the pool MR at the
/// R_Key's slot, if any. `Ok`: the pool offset of the 8 bytes the engine
/// would operate on. `Err(reason)`: user space decides (it NAKs a
/// misaligned or forbidden one). The engine's limit on outstanding
/// READ/atomic responses never binds here: a QP is lent only with none.
#[inline(always)]
pub fn check_atomic(st: &RespState, p: &AtomicReq, mr: Option<&PoolMr>) -> Result<u64, usize> {
    if !is_served_atomic(p.opcode) {
        return Err(punt::NOT_WRITE);
    }
    single_packet_request(st, p.pkey, p.psn, p.plen)?;
    if st.qp_access & ACCESS_REMOTE_ATOMIC == 0 {
        return Err(punt::ACCESS);
    }
    // Aligned in the peer's address and in the pool (the engine checks
    // the address it operates on, too).
    if p.va & 7 != 0 {
        return Err(punt::ACCESS);
    }
    let off = resolve(mr, p.rkey, st.pd, p.va, 8, ACCESS_REMOTE_ATOMIC)?;
    if off & 7 != 0 {
        return Err(punt::ACCESS);
    }
    Ok(off)
}

/// The state after atomic `p` was executed and found `orig` (the
/// engine's updates: next PSN, next MSN, the result kept for replay).
#[inline(always)]
pub fn commit_atomic(st: &mut RespState, p: &AtomicReq, orig: u64) {
    save_res(st, p.psn, false, orig);
    st.atomics += 1;
}

/// One PSN and one message more, and the request in the resources.
#[inline(always)]
fn save_res(st: &mut RespState, psn: u32, read: bool, orig: u64) {
    st.epsn = psn.wrapping_add(1) & PSN_MASK;
    st.msn = st.msn.wrapping_add(1) & PSN_MASK;
    let i = st.res_next as usize & (RD_ATOMIC_RES - 1);
    st.res[i] = RdAtomicRes {
        psn,
        read: read as u32,
        orig,
    };
    st.res_next = st.res_next.wrapping_add(1);
}

/// The first checks of a READ request or an atomic (a request of one
/// packet with no payload), in the engine's order: P_Key, PSN, no WRITE
/// in progress, no payload.
#[inline(always)]
fn single_packet_request(st: &RespState, pkey: u16, psn: u32, plen: u32) -> Result<(), usize> {
    if !pkey_matches(st.pkey as u16, pkey) {
        return Err(punt::PKEY);
    }
    if psn != st.epsn {
        return Err(punt::PSN);
    }
    if st.in_write != 0 {
        return Err(punt::SEQUENCE);
    }
    if plen != 0 {
        return Err(punt::LENGTH);
    }
    Ok(())
}

/// The fields of an RC READ request the XDP responder decides on, host
/// order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadReq {
    pub pkey: u16,
    pub psn: u32,
    /// The RETH.
    pub va: u64,
    pub rkey: u32,
    pub dma_len: u32,
    /// Bytes after the RETH, the pad excluded (a READ request has none).
    pub plen: u32,
}

/// The responder's checks for one in-order READ request (the table in
/// `transport/responder.rs`: rows 11-13, 17, then 22-23 and 26 as the
/// engine runs them), for a QP whose state is `st`; `mr` is the pool MR
/// at the R_Key's slot, if any. Only READs of one response packet are
/// served. `Ok`: the pool offset of the first byte to send (0 for a READ
/// of nothing). The limit on outstanding READ/atomic responses never
/// binds: a QP is lent only with none, and XDP answers at once.
#[inline(always)]
pub fn check_read(st: &RespState, p: &ReadReq, mr: Option<&PoolMr>) -> Result<u64, usize> {
    single_packet_request(st, p.pkey, p.psn, p.plen)?;
    if p.dma_len > st.mtu || p.dma_len as usize > crate::mr_pool::PAGE {
        return Err(punt::TOO_LONG);
    }
    if p.dma_len == 0 {
        // The engine checks neither key nor access for a READ of nothing.
        return Ok(0);
    }
    if st.qp_access & ACCESS_REMOTE_READ == 0 {
        return Err(punt::ACCESS);
    }
    resolve(
        mr,
        p.rkey,
        st.pd,
        p.va,
        p.dma_len as u64,
        ACCESS_REMOTE_READ,
    )
}

/// The state after READ `p` was answered (the engine's updates: next
/// PSN, next MSN, the READ in the resources for its duplicates).
#[inline(always)]
pub fn commit_read(st: &mut RespState, p: &ReadReq) {
    save_res(st, p.psn, true, 0);
    st.reads += 1;
    st.read_bytes += p.dma_len as u64;
}

/// The pad after `len` payload bytes (to a multiple of 4).
#[inline(always)]
pub fn pad_for(len: u32) -> u32 {
    len.wrapping_neg() & 3
}

/// What an atomic does to the 8 bytes it found (`old`): the new value.
/// The XDP program does the same with BPF atomics; this is the reference.
#[inline(always)]
pub fn atomic_result(p: &AtomicReq, old: u64) -> u64 {
    if p.opcode == opcode::RC_COMPARE_SWAP {
        if old == p.compare {
            p.swap_add
        } else {
            old
        }
    } else {
        old.wrapping_add(p.swap_add)
    }
}

/// CRC-32 (IEEE, reflected: the ICRC's and `crc32fast`'s) by table:
/// `CRC_TABLES[0]` one byte at a time, all eight together eight bytes at
/// a time ("slicing-by-8").
pub static CRC_TABLES: [[u32; 256]; 8] = crc_tables();

const fn crc_tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut s = 1;
    while s < 8 {
        let mut i = 0;
        while i < 256 {
            let prev = t[s - 1][i];
            t[s][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            i += 1;
        }
        s += 1;
    }
    t
}

/// One byte into a running CRC (start with `!0`, finish with `!crc`).
#[inline(always)]
pub fn crc_byte(crc: u32, b: u8) -> u32 {
    CRC_TABLES[0][((crc ^ b as u32) & 0xff) as usize] ^ (crc >> 8)
}

/// Eight bytes, read as one little-endian u64, into a running CRC
/// ("slicing-by-8"): one aligned load and eight table lookups instead of
/// eight byte steps.
#[inline(always)]
pub fn crc_u64(crc: u32, v: u64) -> u32 {
    let lo = crc ^ (v as u32);
    let hi = (v >> 32) as u32;
    let t = &CRC_TABLES;
    t[7][(lo & 0xff) as usize]
        ^ t[6][((lo >> 8) & 0xff) as usize]
        ^ t[5][((lo >> 16) & 0xff) as usize]
        ^ t[4][(lo >> 24) as usize]
        ^ t[3][(hi & 0xff) as usize]
        ^ t[2][((hi >> 8) & 0xff) as usize]
        ^ t[1][((hi >> 16) & 0xff) as usize]
        ^ t[0][(hi >> 24) as usize]
}

/// Long runs of words are not hashed by table but folded ("Chorba",
/// Russell 2024): `Q(x) = x^300 + x^155 + x^117 + x^89 + 1` is a
/// multiple of the CRC-32 polynomial (a search finds no sparser multiple
/// of degree 448 or less), so a message bit may be replaced by the four
/// bits 145, 183, 211 and 300 positions after it without changing the
/// message modulo the polynomial. Folding a 64-bit word forward costs
/// eight shifts and eight XORs, against eight table lookups, and leaves
/// the CRC of everything as the CRC of the last words only.
///
/// Each word's bits land up to five words on, so all words but the last
/// `FOLD_GROUP` are folded (five at a time where the pending XORs can
/// change roles in turn), and those five, with the pending XORs, are
/// hashed by table with the bytes after them.
pub const FOLD_GROUP: usize = 5;

/// How many of a run of `words` whole words to fold: all but the last
/// `FOLD_GROUP`.
#[inline(always)]
pub fn fold_words(words: usize) -> usize {
    words.saturating_sub(FOLD_GROUP)
}

/// Folds message word `x` (little-endian, with its pending XOR applied)
/// into the pending XORs of the words two, three and four after it, and
/// returns the pending XOR of the word five after it. Its bit j moves to
/// bits j + 145, j + 183, j + 211 and j + 300 of the message.
#[inline(always)]
pub fn fold_step(x: u64, w2: &mut u64, w3: &mut u64, w4: &mut u64) -> u64 {
    // 145 = 2 * 64 + 17 and 183 = 2 * 64 + 55: in word 2, spilling into 3.
    *w2 ^= (x << 17) ^ (x << 55);
    // 211 = 3 * 64 + 19: in word 3, spilling into 4.
    *w3 ^= (x >> 47) ^ (x >> 9) ^ (x << 19);
    // 300 = 4 * 64 + 44: in word 4, spilling into 5.
    *w4 ^= (x >> 45) ^ (x << 44);
    x >> 20
}

/// `data` into a running CRC as the XDP program hashes what the ICRC
/// covers: all whole words but the last five folded (`fold_step`), five
/// at a time with the pending XORs changing roles, then one at a time;
/// those five words with their pending XORs and the last bytes by table.
/// The XDP program keeps the words in its scratch and runs this in
/// `bpf_loop` turns; this is the same order of steps over a slice, for
/// tests.
pub fn crc_folded(crc: u32, data: &[u8]) -> u32 {
    let nw = data.len() / 8;
    let word = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&data[i * 8..i * 8 + 8]);
        u64::from_le_bytes(b)
    };
    let fw = fold_words(nw);
    let mut s = crc;
    let [mut a, mut b, mut c, mut d, mut e] = [0u64; FOLD_GROUP];
    if fw > 0 {
        // The running CRC is the pending XOR of the first word.
        a = crc as u64;
        s = 0;
    }
    let mut i = 0;
    while i + FOLD_GROUP <= fw {
        a = fold_step(word(i) ^ a, &mut c, &mut d, &mut e);
        b = fold_step(word(i + 1) ^ b, &mut d, &mut e, &mut a);
        c = fold_step(word(i + 2) ^ c, &mut e, &mut a, &mut b);
        d = fold_step(word(i + 3) ^ d, &mut a, &mut b, &mut c);
        e = fold_step(word(i + 4) ^ e, &mut b, &mut c, &mut d);
        i += FOLD_GROUP;
    }
    while i < fw {
        let n = fold_step(word(i) ^ a, &mut c, &mut d, &mut e);
        (a, b, c, d, e) = (b, c, d, e, n);
        i += 1;
    }
    for (k, p) in [a, b, c, d, e].into_iter().enumerate().take(nw - fw) {
        s = crc_u64(s, word(fw + k) ^ p);
    }
    crc_update(s, &data[nw * 8..])
}

/// Bytes into a running CRC (user space and tests).
pub fn crc_update(mut crc: u32, data: &[u8]) -> u32 {
    for &b in data {
        crc = crc_byte(crc, b);
    }
    crc
}

/// The ICRC's masks by position from the IP header on: OR byte `j` of
/// the headers with `ICRC_MASK[(ipv4 as usize) << 7 | j]` (ones where the
/// field is variant; zero from the BTH's end on). A table, not
/// comparisons: the verifier then follows no branch per byte.
pub static ICRC_MASK: [u8; 256] = icrc_masks();

const fn icrc_masks() -> [u8; 256] {
    let mut m = [0u8; 256];
    // IPv6 (index 0..128): traffic class and flow label, hop limit.
    m[0] = 0x0f;
    m[1] = 0xff;
    m[2] = 0xff;
    m[3] = 0xff;
    m[7] = 0xff;
    m[40 + 6] = 0xff; // UDP checksum
    m[40 + 7] = 0xff;
    m[40 + 8 + 4] = 0xff; // BTH resv8a
                          // IPv4 (index 128..256): TOS, TTL, header checksum.
    let v4 = 128;
    m[v4 + 1] = 0xff;
    m[v4 + 8] = 0xff;
    m[v4 + 10] = 0xff;
    m[v4 + 11] = 0xff;
    m[v4 + 20 + 6] = 0xff;
    m[v4 + 20 + 7] = 0xff;
    m[v4 + 20 + 8 + 4] = 0xff;
    m
}

/// [`ICRC_MASK`] as little-endian 64-bit words: OR word `w` of the
/// headers (from the IP header on) with `ICRC_MASK64[(ipv4 as usize) << 4
/// | w]`.
pub static ICRC_MASK64: [u64; 32] = icrc_masks64();

const fn icrc_masks64() -> [u64; 32] {
    let m = icrc_masks();
    let mut w = [0u64; 32];
    let mut i = 0;
    while i < 256 {
        w[i / 8] |= (m[i] as u64) << ((i % 8) * 8);
        i += 1;
    }
    w
}

/// Byte `i` of the ICRC's masked prefix (RoCEv2 annex A17.3.3: 64 bits of
/// ones for the absent LRH, then the IP, UDP and BTH headers with their
/// variant fields set to ones); `b` is the header byte at `i - 8`.
#[inline(always)]
pub fn icrc_prefix_byte(i: usize, b: u8, ipv4: bool) -> u8 {
    if i < 8 {
        return 0xff;
    }
    b | ICRC_MASK[((ipv4 as usize) << 7) | ((i - 8) & 127)]
}

/// Whether the state's ACK template has the shape [`build_ack`] patches:
/// Ethernet (with at most one VLAN tag), IP, UDP, BTH, AETH, ICRC.
#[inline(always)]
pub fn ack_template_ok(st: &RespState) -> bool {
    let ihl = if st.ack_ipv4 != 0 { Ipv4Hdr::LEN } else { 40 };
    let len = st.ack_len as usize;
    let l3 = st.ack_l3 as usize;
    // Room for the atomic ACK's 8 bytes more, from the frame's start.
    len + IP_AT + AtomicAckEth::LEN <= ACK_TMPL_LEN + l3
        && l3 <= 18
        && l3 + ihl + UdpHdr::LEN + 12 + 4 + ICRC_LEN == len
}

/// Builds the ACK of `psn` with `msn` from the state's template into
/// `out` (at [`frame_start`]): the IPv4 ID (incremented, as the engine
/// does per frame) and checksum, the BTH PSN, the AETH MSN, and the ICRC.
/// Returns the frame's length, or 0 if the template is unusable.
#[inline(always)]
pub fn build_ack(st: &mut RespState, psn: u32, out: &mut RespBuf) -> usize {
    build_resp(st, psn, None, out)
}

/// [`build_ack`], or with `atomic_orig` the atomic ACK of `psn`: opcode
/// ATOMIC_ACKNOWLEDGE, the IP and UDP lengths 8 bytes longer, and the
/// AtomicAckETH (the value found, big-endian) after the AETH.
#[inline(always)]
pub fn build_resp(
    st: &mut RespState,
    psn: u32,
    atomic_orig: Option<u64>,
    out: &mut RespBuf,
) -> usize {
    let ext = if atomic_orig.is_some() {
        AtomicAckEth::LEN
    } else {
        0
    };
    let opc = if atomic_orig.is_some() {
        opcode::RC_ATOMIC_ACKNOWLEDGE
    } else {
        opcode::RC_ACKNOWLEDGE
    };
    let bth = head(st, psn, opc, ext as u32, 0, out);
    if bth == 0 {
        return 0;
    }
    let ipv4 = st.ack_ipv4 != 0;
    let ihl = if ipv4 { Ipv4Hdr::LEN } else { 40 };
    if let Some(orig) = atomic_orig {
        let b = orig.to_be_bytes();
        let o = out.bytes_mut();
        let mut i = 0;
        while i < 8 {
            o[(bth + 16 + i) & M] = b[i];
            i += 1;
        }
    }
    // ICRC: 64 bits of ones, then IP, UDP and BTH masked, the AETH and
    // the AtomicAckETH, a word at a time from the aligned IP header.
    let n = ihl + UdpHdr::LEN + 12 + 4 + ext;
    let v4 = ipv4 as usize;
    let full = n / 8;
    let mut crc = crc_u64(!0, !0);
    let mut w = 0;
    while w < 10 {
        if w < full {
            let word = u64::from_le(out.0[(IP_AT / 8 + w) & 15]);
            crc = crc_u64(crc, word | ICRC_MASK64[(v4 << 4) | (w & 15)]);
        }
        w += 1;
    }
    let o = out.bytes_mut();
    let mut k = 0;
    while k < 8 {
        let i = full * 8 + k;
        if i < n {
            crc = crc_byte(crc, o[(IP_AT + i) & M] | ICRC_MASK[(v4 << 7) | (i & 127)]);
        }
        k += 1;
    }
    let crc = !crc;
    let end = IP_AT + n;
    o[end & M] = crc as u8;
    o[(end + 1) & M] = (crc >> 8) as u8;
    o[(end + 2) & M] = (crc >> 16) as u8;
    o[(end + 3) & M] = (crc >> 24) as u8;
    st.acks += 1;
    st.ack_len as usize + ext
}

/// The headers of READ_RESPONSE_ONLY for `psn` carrying `len` bytes (the
/// engine's frame up to its AETH, at [`frame_start`]), from the state's
/// ACK template: their length. The payload, its pad and the ICRC follow,
/// in a frame of that length + `len` + [`pad_for`]`(len)` + 4 bytes. 0 if
/// the template is unusable.
#[inline(always)]
pub fn build_read_head(st: &mut RespState, psn: u32, len: u32, out: &mut RespBuf) -> usize {
    let pad = pad_for(len);
    let bth = head(
        st,
        psn,
        opcode::RC_RDMA_READ_RESPONSE_ONLY,
        len + pad,
        pad as u8,
        out,
    );
    if bth == 0 {
        return 0;
    }
    bth + 12 + 4 - frame_start(st)
}

/// The template into `out` as a response of `opc` to `psn` with `more`
/// bytes after the AETH (`pad` of them the pad): opcode, pad count, the
/// IP and UDP lengths, the IPv4 ID (incremented, as the engine does per
/// frame) and checksum, the PSN and the MSN. The BTH's offset in `out`,
/// or 0 if the template is unusable.
#[inline(always)]
fn head(st: &mut RespState, psn: u32, opc: u8, more: u32, pad: u8, out: &mut RespBuf) -> usize {
    let l3 = IP_AT;
    let ipv4 = st.ack_ipv4 != 0;
    let ihl = if ipv4 { Ipv4Hdr::LEN } else { 40 };
    let bth = l3 + ihl + UdpHdr::LEN;
    // The template is the engine's: headers, BTH, AETH, ICRC.
    if !ack_template_ok(st) {
        return 0;
    }
    *out = st.ack;
    let out = out.bytes_mut();
    out[bth & M] = opc;
    // SE, M, pad count (bits 5-4), TVer.
    out[(bth + 1) & M] = (out[(bth + 1) & M] & !0x30) | ((pad & 3) << 4);
    if more != 0 {
        // IPv4 total length (bytes 2-3) or IPv6 payload length (4-5),
        // and the UDP length: each `more` bytes more.
        let ip_len_at = if ipv4 { l3 + 2 } else { l3 + 4 };
        for at in [ip_len_at, l3 + ihl + 4] {
            let v =
                (((out[at & M] as u16) << 8) | out[(at + 1) & M] as u16).wrapping_add(more as u16);
            out[at & M] = (v >> 8) as u8;
            out[(at + 1) & M] = v as u8;
        }
    }
    if ipv4 {
        st.ip_id = st.ip_id.wrapping_add(1) & 0xffff;
        out[(l3 + 4) & M] = (st.ip_id >> 8) as u8;
        out[(l3 + 5) & M] = st.ip_id as u8;
        let mut sum = 0u32;
        let mut i = 0;
        while i < 20 {
            if i != 10 {
                sum += ((out[(l3 + i) & M] as u32) << 8) | out[(l3 + i + 1) & M] as u32;
            }
            i += 2;
        }
        sum = (sum & 0xffff) + (sum >> 16);
        sum = (sum & 0xffff) + (sum >> 16);
        let c = !(sum as u16);
        out[(l3 + 10) & M] = (c >> 8) as u8;
        out[(l3 + 11) & M] = c as u8;
    }
    out[(bth + 9) & M] = (psn >> 16) as u8;
    out[(bth + 10) & M] = (psn >> 8) as u8;
    out[(bth + 11) & M] = psn as u8;
    out[(bth + 13) & M] = (st.msn >> 16) as u8;
    out[(bth + 14) & M] = (st.msn >> 8) as u8;
    out[(bth + 15) & M] = st.msn as u8;
    bth
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folding_gives_the_tables_crc() {
        // Every length to 2 KiB and past a page, from several states.
        let mut data = [0u8; 5000];
        for (i, b) in data.iter_mut().enumerate() {
            *b = ((i as u32).wrapping_mul(2_654_435_761) >> 11) as u8;
        }
        for len in (0..2100).chain(4090..4200).chain([4096 + 16, 4999]) {
            for crc in [!0u32, 0, 0x1234_5678] {
                let d = &data[5000 - len..];
                assert_eq!(crc_folded(crc, d), crc_update(crc, d), "len {len}");
            }
        }
        assert_eq!(fold_words(5), 0);
        assert_eq!(fold_words(6), 1);
        assert_eq!(fold_words(136), 131);
    }
}
