//! The XDP responder: in-order RDMA WRITEs to a QP lent to XDP, into an
//! MR of the pool, are placed and ACKed here; in-order atomics on such an
//! MR are done with BPF atomics and answered with the atomic ACK;
//! in-order READs of one packet from such an MR are answered with
//! READ_RESPONSE_ONLY when the frame can grow to it. Anything else goes
//! to user space with the QP handed back.
//!
//! The decisions are `rdma_common::xdp_responder`'s (shared with, and
//! tested against, the engine); this file only reads the frame, copies,
//! and sends. Ownership of a QP's state is one u32 changed by atomic
//! compare-and-swap and exchange (fully ordered in BPF), so the state's
//! other fields are never read or written by two sides at once.

use aya_ebpf::{
    bindings::{xdp_action, BPF_F_MMAPABLE},
    helpers::generated::{bpf_loop, bpf_xdp_adjust_tail, bpf_xdp_load_bytes, bpf_xdp_store_bytes},
    macros::map,
    maps::{Array, PerCpuArray},
    programs::XdpContext,
};
use rdma_common::{
    mr_pool, opcode, stat,
    xdp_responder::{
        self, owner, punt, AtomicReq, PoolMr, ReadReq, RespBuf, RespState, WriteReq, ACK_TMPL_LEN,
        FOLD_GROUP, POOL_MR_SLOTS, RESP_SLOTS,
    },
    AtomicEth, Bth, Reth, UdpHdr, ICRC_LEN,
};

use crate::{count, ptr_at, MR_POOL};

/// Per-QP responder state, at `qpn % RESP_SLOTS`; user space maps it.
#[map]
static RESP_STATE: Array<RespState> = Array::with_max_entries(RESP_SLOTS, BPF_F_MMAPABLE);

/// The pool's MRs, at `rkey % POOL_MR_SLOTS`; user space maps it.
#[map]
static POOL_MRS: Array<PoolMr> = Array::with_max_entries(POOL_MR_SLOTS, BPF_F_MMAPABLE);

/// What the classifier found out about a frame that concerns us.
pub struct Frame {
    /// Offset of the IP header.
    pub l3: usize,
    /// IPv4 with a 20-byte header (true), IPv6 (false).
    pub ipv4: bool,
    /// IPv4 with options: never served here.
    pub ip_options: bool,
    pub bth_off: usize,
    /// Length of the extension headers after the BTH.
    pub ext_len: usize,
    pub udp_len: usize,
    /// The whole frame, fragments included.
    pub frame_len: usize,
    pub src_gid: [u8; 16],
    pub src_port: u16,
    /// The IP header's ECN field says CE.
    pub ce: bool,
    /// The opcode's flags (classify looked them up).
    pub flags: rdma_common::OpFlags,
}

/// `Some(verdict, counter)` when XDP served the packet; `None` to redirect
/// it to user space as usual.
#[inline(always)]
pub fn try_serve(ctx: &XdpContext, bth: &Bth, f: &Frame) -> Option<(u32, u32)> {
    let flags = f.flags;
    // Responses, ACKs and CNPs belong to the requester, which the engine
    // runs: only RC requests concern the responder's owner.
    if bth.opcode >= 0x20
        || !flags.any(rdma_common::OpFlags::REQUEST | rdma_common::OpFlags::RESERVED)
    {
        return None;
    }
    let qpn = bth.dest_qpn();
    let st = RESP_STATE.get_ptr_mut(qpn % RESP_SLOTS)?;
    // SAFETY: a map value, valid while the program runs; `owner` is its
    // first field, 8-byte aligned, and only ever accessed atomically.
    let own = unsafe { core::ptr::addr_of_mut!((*st).owner) };
    // A plain read first: most requests meet a QP user space owns, and
    // the exchange below decides anyway. SAFETY: as above.
    if unsafe { own.read_volatile() } != owner::XDP {
        return None;
    }
    if !take(own) {
        return None;
    }
    // SAFETY: BUSY is ours: nobody else reads or writes the state until we
    // give it back below.
    let st = unsafe { &mut *st };
    if st.qpn != qpn {
        give(own, owner::XDP);
        return None;
    }
    match serve(ctx, st, bth, f) {
        Ok(v) => {
            give(own, owner::XDP);
            Some(v)
        }
        Err(reason) => {
            if let Some(c) = st.punts.get_mut(reason) {
                *c += 1;
            }
            // User space takes over from this packet on: it reads the state
            // back before it handles the packet (redirected next), so
            // nothing is lost or reordered.
            give(own, owner::USER);
            count(stat::XDP_PUNTED);
            None
        }
    }
}

/// XDP -> BUSY by compare-and-exchange: whether we got the QP.
#[inline(always)]
fn take(own: *mut u64) -> bool {
    #[cfg(target_arch = "bpf")]
    {
        use core::intrinsics::{atomic_cxchg, AtomicOrdering};
        // SAFETY: `own` is the state's owner word (see `try_serve`).
        unsafe {
            atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::Relaxed }>(
                own,
                owner::XDP,
                owner::BUSY,
            )
            .1
        }
    }
    #[cfg(not(target_arch = "bpf"))]
    {
        use core::sync::atomic::{AtomicU64, Ordering};
        // SAFETY: as above.
        unsafe { AtomicU64::from_ptr(own) }
            .compare_exchange(owner::XDP, owner::BUSY, Ordering::SeqCst, Ordering::Relaxed)
            .is_ok()
    }
}

/// Ends BUSY: an atomic exchange, fully ordered, so every write to the
/// state is visible before the new owner is.
#[inline(always)]
fn give(own: *mut u64, to: u64) {
    #[cfg(target_arch = "bpf")]
    {
        use core::intrinsics::{atomic_xchg, AtomicOrdering};
        // SAFETY: `own` is the state's owner word (see `try_serve`).
        unsafe { atomic_xchg::<u64, { AtomicOrdering::SeqCst }>(own, to) };
    }
    #[cfg(not(target_arch = "bpf"))]
    {
        use core::sync::atomic::{AtomicU64, Ordering};
        // SAFETY: as above.
        unsafe { AtomicU64::from_ptr(own) }.swap(to, Ordering::SeqCst);
    }
}

#[inline(always)]
fn serve(ctx: &XdpContext, st: &mut RespState, bth: &Bth, f: &Frame) -> Result<(u32, u32), usize> {
    let atomic = xdp_responder::is_served_atomic(bth.opcode);
    let read = bth.opcode == opcode::RC_RDMA_READ_REQUEST;
    if !atomic && !read && !xdp_responder::is_served_write(bth.opcode) {
        return Err(punt::NOT_WRITE);
    }
    if f.ip_options {
        return Err(punt::MALFORMED);
    }
    if f.ce {
        return Err(punt::CE);
    }
    if f.src_gid != st.peer_gid || f.src_port as u32 != st.peer_sport {
        return Err(punt::SOURCE);
    }
    // The ICRC before the opcode's own checks, at this one call: the
    // verifier walks the CRC code once per path that reaches a call of
    // it, and few paths reach this one. (A packet both corrupt and, say,
    // out of order is punted for its ICRC; user space checks it again.)
    icrc_ok(ctx, f)?;
    if atomic {
        return serve_atomic(ctx, st, bth, f);
    }
    if read {
        return serve_read(ctx, st, bth, f);
    }
    let first = matches!(
        bth.opcode,
        opcode::RC_RDMA_WRITE_FIRST | opcode::RC_RDMA_WRITE_ONLY
    );
    let mut req = WriteReq {
        opcode: bth.opcode,
        ack_req: bth.ack_req & Bth::ACK_REQ != 0,
        pkey: bth.pkey(),
        psn: bth.psn(),
        ..Default::default()
    };
    if first {
        let reth = ptr_at::<Reth>(ctx, f.bth_off + Bth::LEN).ok_or(punt::MALFORMED)?;
        // SAFETY: bounds checked by `ptr_at`; Reth has alignment 1.
        let reth = unsafe { &*reth };
        req.va = reth.va();
        req.rkey = reth.rkey();
        req.dma_len = reth.dma_len();
    }
    req.plen = payload_len(bth, f)?;
    let rkey = xdp_responder::write_rkey(st, &req);
    let mr = POOL_MRS.get(rkey % POOL_MR_SLOTS);
    let place = xdp_responder::check_write(st, &req, mr)?;
    if place.ack && !xdp_responder::ack_template_ok(st) {
        return Err(punt::TX);
    }
    let len = place.len as usize;
    if len > 0 {
        if len > mr_pool::PAGE {
            return Err(punt::TOO_LONG);
        }
        let pool = MR_POOL.get_ptr_mut(0).ok_or(punt::NOT_POOL)? as *mut u8;
        // The real bounds check was `check_write`'s (inside the MR, the MR
        // inside the pool); the mask changes no value that passed it and
        // lets the verifier prove offset + len <= the map value's size.
        let off = (place.pool_off & mr_pool::MASK) as usize;
        let payload = (f.bth_off + Bth::LEN + f.ext_len) as u32;
        // SAFETY: off < BYTES and len <= PAGE = SLACK: inside the value.
        let r = unsafe { bpf_xdp_load_bytes(ctx.ctx, payload, pool.add(off).cast(), len as u32) };
        if r != 0 {
            return Err(punt::MALFORMED);
        }
    }
    xdp_responder::commit(st, &req, &place);
    if !place.ack {
        return Ok((xdp_action::XDP_DROP, stat::XDP_PLACED));
    }
    let v = send_ack(ctx, st, req.psn as u64, 0, f.frame_len);
    Ok(((v >> 32) as u32, v as u32))
}

/// The payload's length after the BTH, the extension headers and the
/// pad (none of them fits: malformed).
#[inline(always)]
fn payload_len(bth: &Bth, f: &Frame) -> Result<u32, usize> {
    let pad = bth.pad_count() as usize;
    let body = f
        .udp_len
        .checked_sub(UdpHdr::LEN + Bth::LEN + f.ext_len + ICRC_LEN)
        .ok_or(punt::MALFORMED)?;
    if pad > body {
        return Err(punt::MALFORMED);
    }
    Ok((body - pad) as u32)
}

/// The received ICRC, checked: `Err` with the punt reason if it is wrong
/// (skipped only when the benchmark measures the check's cost).
#[inline(always)]
fn icrc_ok(ctx: &XdpContext, f: &Frame) -> Result<(), usize> {
    let bench_no_icrc = crate::CONFIG.get(0).is_some_and(|c| c.bench_no_icrc != 0);
    if !bench_no_icrc {
        match icrc(ctx, f.l3 as u64, f.ipv4 as u64, f.udp_len as u64, 0) {
            0 => {}
            r => return Err(r as usize - 1),
        }
    }
    Ok(())
}

/// An in-order CMP_SWAP or FETCH_ADD into a pool MR: the engine's checks
/// (`xdp_responder::check_atomic`), the operation as a BPF atomic on the
/// pool's 8 bytes (atomic against the application's own CPU atomics on
/// them), and the atomic ACK. The result is kept in the state for replay.
#[inline(always)]
fn serve_atomic(
    ctx: &XdpContext,
    st: &mut RespState,
    bth: &Bth,
    f: &Frame,
) -> Result<(u32, u32), usize> {
    let a = ptr_at::<AtomicEth>(ctx, f.bth_off + Bth::LEN).ok_or(punt::MALFORMED)?;
    // SAFETY: bounds checked by `ptr_at`; AtomicEth has alignment 1.
    let a = unsafe { &*a };
    let req = AtomicReq {
        opcode: bth.opcode,
        pkey: bth.pkey(),
        psn: bth.psn(),
        va: a.va(),
        rkey: a.rkey(),
        swap_add: a.swap_add(),
        compare: a.compare(),
        plen: payload_len(bth, f)?,
    };
    let mr = POOL_MRS.get(req.rkey % POOL_MR_SLOTS);
    let off = xdp_responder::check_atomic(st, &req, mr)?;
    if !xdp_responder::ack_template_ok(st) {
        return Err(punt::TX);
    }
    let pool = MR_POOL.get_ptr_mut(0).ok_or(punt::NOT_POOL)? as *mut u8;
    // `check_atomic` checked the 8 bytes inside the MR, the MR inside the
    // pool, and the offset 8-byte aligned: the masks change no such value
    // and show the verifier an aligned access inside the map value.
    let off = (off & mr_pool::MASK & !7) as usize;
    // SAFETY: off + 8 <= BYTES + SLACK: inside the value, 8-byte aligned
    // (map values are); BPF atomics, as the application's CPU atomics.
    let orig = unsafe { atomic_op(pool.add(off) as *mut u64, &req) }.ok_or(punt::CONTENDED)?;
    xdp_responder::commit_atomic(st, &req, orig);
    let v = send_ack(ctx, st, req.psn as u64 | ATOMIC_ACK, orig, f.frame_len);
    Ok(((v >> 32) as u32, v as u32))
}

/// An in-order READ of one packet from a pool MR: the engine's checks
/// (`xdp_responder::check_read`), then the frame becomes the
/// READ_RESPONSE_ONLY (`send_read`), if it can grow to it: the kernel gave the frame some
/// tailroom, and a response longer than that goes to user space with
/// nothing changed.
#[inline(always)]
fn serve_read(
    ctx: &XdpContext,
    st: &mut RespState,
    bth: &Bth,
    f: &Frame,
) -> Result<(u32, u32), usize> {
    let reth = ptr_at::<Reth>(ctx, f.bth_off + Bth::LEN).ok_or(punt::MALFORMED)?;
    // SAFETY: bounds checked by `ptr_at`; Reth has alignment 1.
    let reth = unsafe { &*reth };
    let req = ReadReq {
        pkey: bth.pkey(),
        psn: bth.psn(),
        va: reth.va(),
        rkey: reth.rkey(),
        dma_len: reth.dma_len(),
        plen: payload_len(bth, f)?,
    };
    let mr = POOL_MRS.get(req.rkey % POOL_MR_SLOTS);
    let off = xdp_responder::check_read(st, &req, mr)?;
    if !xdp_responder::ack_template_ok(st) {
        return Err(punt::TX);
    }
    let len = req.dma_len;
    let n = st.ack_len as usize + (len + xdp_responder::pad_for(len)) as usize;
    let delta = n as i32 - f.frame_len as i32;
    // SAFETY: the helper only changes the frame the kernel handed us; on
    // failure it changes nothing.
    if delta != 0 && unsafe { bpf_xdp_adjust_tail(ctx.ctx, delta) } != 0 {
        return Err(punt::NO_ROOM);
    }
    // From here on the request is answered: a failure below loses the
    // response, as the wire could, and the duplicate READ the requester
    // sends is executed again by the engine (the READ is in the
    // resources it takes back).
    xdp_responder::commit_read(st, &req);
    let v = send_read(ctx, st, req.psn as u64, off, len as u64);
    let (verdict, counter) = ((v >> 32) as u32, v as u32);
    if verdict != xdp_action::XDP_TX {
        return Ok((verdict, counter));
    }
    // The ICRC last, over the frame as sent; called from here, not from
    // `send_read`, so that the CRC's stack does not add to its frame.
    let l3 = st.ack_l3 as u64;
    let ipv4 = st.ack_ipv4 as u64 & 1;
    let ihl = if ipv4 != 0 { 20 } else { 40 };
    let udp_len = n as u64 - l3 - ihl;
    if icrc(ctx, l3, ipv4, udp_len, 1) != 0 {
        st.punts[punt::TX] += 1;
        return Ok((xdp_action::XDP_DROP, stat::XDP_READ));
    }
    Ok((verdict, counter))
}

/// Writes the READ_RESPONSE_ONLY of `psn` carrying `len` bytes from pool
/// offset `off` into the frame (already `len` + pad + the ACK's length
/// long), all but its ICRC. Not inlined, scalars only (as `send_ack`).
/// The verdict (XDP_TX: ready but for the ICRC) in the high half, the
/// counter in the low one.
#[inline(never)]
fn send_read(ctx: &XdpContext, st: &mut RespState, psn: u64, off: u64, len: u64) -> u64 {
    let (v, c) = read_frame(ctx, st, psn as u32, off, len as u32);
    ((v as u64) << 32) | c as u64
}

#[inline(always)]
fn read_frame(ctx: &XdpContext, st: &mut RespState, psn: u32, off: u64, len: u32) -> (u32, u32) {
    let lost = (xdp_action::XDP_DROP, stat::XDP_READ);
    let Some(out) = ACK_OUT.get_ptr_mut(0) else {
        st.punts[punt::TX] += 1;
        return lost;
    };
    // SAFETY: this CPU's value (see `ack_frame`).
    let out = unsafe { &mut *out };
    let head = xdp_responder::build_read_head(st, psn, len, out);
    let start = xdp_responder::frame_start(st);
    let Some(pool) = MR_POOL.get_ptr_mut(0) else {
        st.punts[punt::TX] += 1;
        return lost;
    };
    let pool = pool as *const u8;
    if head == 0 || start + head > ACK_TMPL_LEN || len as usize > mr_pool::PAGE {
        st.punts[punt::TX] += 1;
        return lost;
    }
    let pad = xdp_responder::pad_for(len);
    let at = head + len as usize;
    let zeros = [0u8; 4];
    // The real bounds check was `check_read`'s; the mask changes no offset
    // that passed it and shows the verifier off + len <= the value's size.
    let off = (off & mr_pool::MASK) as usize;
    // SAFETY: the helpers write only into the frame the kernel handed us
    // (grown to head + len + pad + 4 by the caller); they read our
    // buffer, the pool value (off < BYTES, len <= PAGE = SLACK: inside
    // it) and the zeros.
    let ok = unsafe {
        bpf_xdp_store_bytes(
            ctx.ctx,
            0,
            out.bytes_mut().as_mut_ptr().add(start).cast(),
            head as u32,
        ) == 0
            && (len == 0
                || bpf_xdp_store_bytes(ctx.ctx, head as u32, pool.add(off) as *mut _, len) == 0)
            && (pad == 0
                || bpf_xdp_store_bytes(ctx.ctx, at as u32, zeros.as_ptr() as *mut _, pad) == 0)
    };
    if !ok {
        st.punts[punt::TX] += 1;
        return lost;
    }
    (xdp_action::XDP_TX, stat::XDP_READ)
}

/// Compare-and-swap tries of a FETCH_ADD before it goes to user space:
/// only the application's own atomics on the same 8 bytes make one fail.
const FETCH_ADD_TRIES: u32 = 16;

/// FETCH_ADD or CMP_SWAP on `p`; the value found. `None`: a FETCH_ADD lost
/// [`FETCH_ADD_TRIES`] races and did nothing (BPF's fetching add needs a
/// newer instruction set than the one the program is built for, so it is
/// a compare-and-swap loop).
///
/// # Safety
/// `p` must be valid and 8-byte aligned.
#[inline(always)]
unsafe fn atomic_op(p: *mut u64, req: &AtomicReq) -> Option<u64> {
    if req.opcode == opcode::RC_COMPARE_SWAP {
        // Done whether it swapped or not: the value found is its answer.
        // SAFETY: the caller's.
        return Some(unsafe { cas(p, req.compare, req.swap_add) }.0);
    }
    let mut tries = 0;
    while tries < FETCH_ADD_TRIES {
        // SAFETY: the caller's.
        let old = unsafe { core::ptr::read_volatile(p) };
        // SAFETY: the caller's.
        let (found, swapped) = unsafe { cas(p, old, old.wrapping_add(req.swap_add)) };
        if swapped {
            return Some(found);
        }
        tries += 1;
    }
    None
}

/// Compare-and-swap on `p`: the value found, and whether it was `expect`
/// (and is now `new`).
///
/// # Safety
/// `p` must be valid and 8-byte aligned.
#[inline(always)]
unsafe fn cas(p: *mut u64, expect: u64, new: u64) -> (u64, bool) {
    #[cfg(target_arch = "bpf")]
    {
        use core::intrinsics::{atomic_cxchg, AtomicOrdering};
        // SAFETY: the caller's.
        unsafe {
            atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(
                p, expect, new,
            )
        }
    }
    #[cfg(not(target_arch = "bpf"))]
    {
        use core::sync::atomic::{AtomicU64, Ordering};
        // SAFETY: the caller's.
        match unsafe { AtomicU64::from_ptr(p) }.compare_exchange(
            expect,
            new,
            Ordering::SeqCst,
            Ordering::SeqCst,
        ) {
            Ok(v) => (v, true),
            Err(v) => (v, false),
        }
    }
}

/// In `send_ack`'s PSN word: the atomic ACK, not the plain one.
const ATOMIC_ACK: u64 = 1 << 32;

/// Turns the frame into the ACK of the PSN in `psn`'s low half (with
/// [`ATOMIC_ACK`], the atomic ACK carrying `orig`) and sends it back
/// (XDP_TX). Not inlined: its buffers count against the stack only while
/// it runs. Scalars only, five at most: a BPF call passes five registers.
/// The verdict in the high half of the result, the counter in the low one.
#[inline(never)]
fn send_ack(ctx: &XdpContext, st: &mut RespState, psn: u64, orig: u64, frame_len: usize) -> u64 {
    let atomic = (psn & ATOMIC_ACK != 0).then_some(orig);
    let (v, c) = ack_frame(ctx, st, psn as u32, atomic, frame_len);
    ((v as u64) << 32) | c as u64
}

#[inline(always)]
fn ack_frame(
    ctx: &XdpContext,
    st: &mut RespState,
    psn: u32,
    atomic_orig: Option<u64>,
    frame_len: usize,
) -> (u32, u32) {
    // The frame is built in a per-CPU map value, not on the stack: the
    // stack is 512 bytes for the whole call chain.
    let Some(out) = ACK_OUT.get_ptr_mut(0) else {
        st.punts[punt::TX] += 1;
        return (xdp_action::XDP_DROP, stat::XDP_PLACED);
    };
    // SAFETY: this CPU's value: XDP runs to its end on one CPU, nobody
    // else uses it.
    let out = unsafe { &mut *out };
    let n = xdp_responder::build_resp(st, psn, atomic_orig, out);
    let start = xdp_responder::frame_start(st);
    if n == 0 || start + n > ACK_TMPL_LEN || n > frame_len {
        // Checked before placing; an ACK lost here is an ACK lost on the
        // wire: the requester resends and the duplicate is re-ACKed.
        st.punts[punt::TX] += 1;
        return (xdp_action::XDP_DROP, stat::XDP_PLACED);
    }
    let delta = n as i32 - frame_len as i32;
    // SAFETY: the helpers only touch the frame the kernel handed us.
    unsafe {
        if delta != 0 && bpf_xdp_adjust_tail(ctx.ctx, delta) != 0 {
            st.punts[punt::TX] += 1;
            return (xdp_action::XDP_DROP, stat::XDP_PLACED);
        }
        let frame = out.bytes_mut().as_mut_ptr().add(start);
        if bpf_xdp_store_bytes(ctx.ctx, 0, frame.cast(), n as u32) != 0 {
            st.punts[punt::TX] += 1;
            return (xdp_action::XDP_DROP, stat::XDP_PLACED);
        }
    }
    (xdp_action::XDP_TX, stat::XDP_ACKED)
}

/// Where `ack_frame` builds the frame it sends.
#[map]
static ACK_OUT: PerCpuArray<RespBuf> = PerCpuArray::with_max_entries(1, 0);

/// What the ICRC covers (64 bits of ones, then the frame from the IP
/// header to the ICRC) is copied once into this per-CPU scratch value,
/// masked and hashed there: one helper call per packet, then plain loads.
/// 8 KiB: room for a page of payload with its headers and pad, and a
/// power of two for the masks.
const SCRATCH: usize = 8192;
/// Words folded per `bpf_loop` turn (8 groups of `FOLD_GROUP`).
const FOLD_TURN: usize = 40;

#[map]
static ICRC_SCRATCH: PerCpuArray<[u8; SCRATCH]> = PerCpuArray::with_max_entries(1, 0);

/// What `bpf_loop`'s callback works on, in this CPU's `ICRC_WALK`, not
/// on the caller's stack: read from a map, its fields are unknown to the
/// verifier, so it walks the callback once, not once per caller's bounds
/// on them (on the stack: 658 607 instructions processed, in the map
/// 113 915).
#[repr(C)]
struct CrcWalk {
    /// Bytes of the scratch to hash.
    len: u64,
    /// Its first words, folded (`xdp_responder::fold_words`), FOLD_TURN a
    /// turn; the last turn hashes the rest by table.
    fold: u64,
    crc: u32,
    _pad: u32,
}

#[map]
static ICRC_WALK: PerCpuArray<CrcWalk> = PerCpuArray::with_max_entries(1, 0);

/// The ICRC of the frame whose IP header is at `l3` (IPv4 if `ipv4` is
/// 1, else IPv6) and whose UDP datagram is `udp_len` bytes: with `store`
/// 0, checked against the one the frame carries, as the engine checks it
/// before it uses a packet (rxe does the same); with `store` 1, written
/// into the frame's last four bytes (a response XDP built). Not inlined:
/// one copy for both uses, and its stack adds to the caller's only while
/// it runs. A scalar result (0, or the punt reason plus one): a BPF
/// function must not leave a stack pointer in R0, as Rust's `Result`
/// returns can.
#[inline(never)]
fn icrc(ctx: &XdpContext, l3: u64, ipv4: u64, udp_len: u64, store: u64) -> u32 {
    match icrc_walk(ctx, l3 as usize, ipv4 != 0, udp_len as usize, store != 0) {
        Ok(()) => 0,
        Err(r) => r as u32 + 1,
    }
}

#[inline(always)]
fn icrc_walk(
    ctx: &XdpContext,
    l3: usize,
    ipv4: bool,
    udp_len: usize,
    store: bool,
) -> Result<(), usize> {
    let hl = if ipv4 { 20 } else { 40 } + UdpHdr::LEN + Bth::LEN;
    // Everything the ICRC covers goes into this CPU's scratch in one
    // piece (one helper call): 64 bits of ones, then the frame from the
    // IP header to the ICRC, the variant header fields masked to ones.
    let len = udp_len
        .checked_sub(UdpHdr::LEN + Bth::LEN + ICRC_LEN)
        .ok_or(punt::MALFORMED)?;
    // Volatile: LLVM knows `body` >= 40 and would drop a check that it
    // is not zero, which the verifier needs for the helper's length.
    let body = hl + len;
    // SAFETY: reading a live local.
    let body = unsafe { core::ptr::read_volatile(&body) };
    if body == 0 {
        return Err(punt::MALFORMED);
    }
    if body > SCRATCH - 8 {
        return Err(punt::TOO_LONG);
    }
    let end = l3 + body;
    let buf = ICRC_SCRATCH.get_ptr_mut(0).ok_or(punt::MALFORMED)? as *mut u8;
    let words = buf as *mut u64;
    // SAFETY: the first word of this CPU's scratch (XDP runs to its end
    // on one CPU: nobody else uses it), then `body` <= SCRATCH - 8 bytes
    // of the frame after it: its headers (checked present by the
    // classifier) and what follows them up to the ICRC.
    let r = unsafe {
        *words = !0;
        bpf_xdp_load_bytes(ctx.ctx, l3 as u32, buf.add(8).cast(), body as u32)
    };
    if r != 0 {
        return Err(punt::MALFORMED);
    }
    // Read as a plain byte: LLVM takes a bool for 0 or 1 and would drop
    // the mask, which the verifier needs to bound the table index.
    // SAFETY: reading a field of a live struct.
    let v4 = unsafe { core::ptr::read_volatile(core::ptr::addr_of!(ipv4) as *const u8) };
    let base = ((v4 & 1) as usize) << 4;
    // The masks a word at a time, from byte 8 (ones on the variant
    // fields, zero from the BTH's end on: the payload after the headers
    // is left as it is).
    let mut w = 0;
    while w < 8 {
        // SAFETY: word 1 + w < 9 of the scratch.
        unsafe { *words.add(1 + w) |= u64::from_le(xdp_responder::ICRC_MASK64[base | w]) };
        w += 1;
    }
    let total = 8 + body;
    // All words but the last five are folded (`xdp_responder::fold_words`;
    // there are at least six); the CRC's start value is the first
    // word's pending XOR, and the fold starts from 0.
    let fold = xdp_responder::fold_words(total / 8);
    // SAFETY: the scratch's first word.
    unsafe { *words ^= (!0u32 as u64).to_le() };
    let walk = ICRC_WALK.get_ptr_mut(0).ok_or(punt::MALFORMED)?;
    // SAFETY: this CPU's walk value, ours until the program ends.
    unsafe {
        (*walk).len = total as u64;
        (*walk).fold = fold as u64;
        (*walk).crc = 0;
    }
    let turns = (fold.div_ceil(FOLD_TURN) + 1) as u32;
    // SAFETY: the callback is a function of this program; it finds its
    // walk in the map.
    let done = unsafe {
        bpf_loop(
            turns,
            crc_turn as *mut core::ffi::c_void,
            core::ptr::null_mut(),
            0,
        )
    };
    if done != turns as i64 {
        return Err(punt::MALFORMED);
    }
    // SAFETY: as above.
    let crc = unsafe { (*walk).crc };
    let mut got = [0u8; 4];
    if store {
        got = (!crc).to_le_bytes();
        // SAFETY: four bytes of a stack buffer into the frame.
        let r = unsafe { bpf_xdp_store_bytes(ctx.ctx, end as u32, got.as_mut_ptr().cast(), 4) };
        return if r != 0 { Err(punt::TX) } else { Ok(()) };
    }
    // SAFETY: four bytes into a four-byte stack buffer.
    let r = unsafe { bpf_xdp_load_bytes(ctx.ctx, end as u32, got.as_mut_ptr().cast(), 4) };
    if r != 0 {
        return Err(punt::MALFORMED);
    }
    if u32::from_le_bytes(got) != !crc {
        return Err(punt::ICRC);
    }
    Ok(())
}

/// One `bpf_loop` turn over the scratch: the turn's `FOLD_TURN` words
/// folded forward (`xdp_responder::fold_step`), five at a time and the
/// last few one at a time, their pending XORs then written into the five
/// words after them; or in the last turn those five words and the last
/// bytes, by table. The pending XORs go through the scratch, not the
/// walk: loaded from a map they are unknown to the verifier, which would
/// otherwise walk the callback again for each new set of their known
/// bits.
#[inline(never)]
extern "C" fn crc_turn(turn: u64, _cb_ctx: *mut core::ffi::c_void) -> i64 {
    let Some(w) = ICRC_WALK.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: this CPU's walk value, which `icrc_walk` filled.
    let w = unsafe { &mut *w };
    let Some(buf) = ICRC_SCRATCH.get_ptr_mut(0) else {
        return 1;
    };
    let buf = buf as *mut u8;
    let word = |o: usize| {
        // SAFETY: o is a multiple of 8, masked below SCRATCH - 8, and map
        // values are 8-byte aligned: one aligned word of this CPU's
        // scratch.
        u64::from_le(unsafe { *(buf.add(o & (SCRATCH - 8)) as *const u64) })
    };
    let xor_word = |o: usize, v: u64| {
        // SAFETY: as in `word`.
        unsafe { *(buf.add(o & (SCRATCH - 8)) as *mut u64) ^= v.to_le() }
    };
    let fold = w.fold as usize;
    let first = turn as usize * FOLD_TURN;
    if first < fold {
        let end = if fold - first < FOLD_TURN {
            fold
        } else {
            first + FOLD_TURN
        };
        let (mut a, mut b, mut c, mut d, mut e) = (0, 0, 0, 0, 0);
        let mut k = first;
        let mut g = 0;
        while g < FOLD_TURN / FOLD_GROUP {
            if k + FOLD_GROUP > end {
                break;
            }
            // One bound for the group's five words (never hit: `fold`
            // words fit the scratch), then loads at constant offsets.
            let o = k * 8;
            if o > SCRATCH - 8 * FOLD_GROUP {
                return 1;
            }
            // SAFETY: five words of this CPU's scratch, bounded just
            // above; o is a multiple of 8 and map values are 8-byte
            // aligned.
            let g5 = unsafe { core::slice::from_raw_parts(buf.add(o) as *const u64, FOLD_GROUP) };
            // The five pending XORs change roles word by word (a is the
            // current word's, then the new fifth's), as in the test of
            // `fold_step`.
            a = xdp_responder::fold_step(u64::from_le(g5[0]) ^ a, &mut c, &mut d, &mut e);
            b = xdp_responder::fold_step(u64::from_le(g5[1]) ^ b, &mut d, &mut e, &mut a);
            c = xdp_responder::fold_step(u64::from_le(g5[2]) ^ c, &mut e, &mut a, &mut b);
            d = xdp_responder::fold_step(u64::from_le(g5[3]) ^ d, &mut a, &mut b, &mut c);
            e = xdp_responder::fold_step(u64::from_le(g5[4]) ^ e, &mut b, &mut c, &mut d);
            k += FOLD_GROUP;
            g += 1;
        }
        let o = k * 8;
        xor_word(o, a);
        xor_word(o + 8, b);
        xor_word(o + 16, c);
        xor_word(o + 24, d);
        xor_word(o + 32, e);
        // The last 0..=4 words one at a time, their pending XORs kept in
        // the scratch (turning the five roles by hand made the verifier
        // walk a state for every pattern of known zeros).
        let mut r = 0;
        while r < FOLD_GROUP - 1 {
            if k >= end {
                break;
            }
            let o = k * 8;
            let (mut w2, mut w3, mut w4) = (0, 0, 0);
            let w5 = xdp_responder::fold_step(word(o), &mut w2, &mut w3, &mut w4);
            xor_word(o + 16, w2);
            xor_word(o + 24, w3);
            xor_word(o + 32, w4);
            xor_word(o + 40, w5);
            k += 1;
            r += 1;
        }
        return 0;
    }
    // The last turn: the five words after the folded ones, and 0..=7
    // bytes.
    let len = w.len as usize;
    let at = fold * 8;
    let mut crc = w.crc;
    let mut i = 0;
    while i <= FOLD_GROUP {
        let o = at + i * 8;
        if o + 8 <= len {
            crc = xdp_responder::crc_u64(crc, word(o));
        } else {
            let mut k = 0;
            while k < 8 {
                if o + k < len {
                    // SAFETY: below len <= SCRATCH (masked).
                    let b = unsafe { *buf.add((o + k) & (SCRATCH - 1)) };
                    crc = xdp_responder::crc_byte(crc, b);
                }
                k += 1;
            }
            break;
        }
        i += 1;
    }
    w.crc = crc;
    0
}
