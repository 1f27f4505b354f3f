//! The XDP responder (issue 20): in-order RDMA WRITEs to a QP lent to
//! XDP, into an MR of the pool, are placed and ACKed here; anything else
//! goes to user space with the QP handed back.
//!
//! The decisions are `rdma_common::fastpath`'s (shared with, and tested
//! against, the engine); this file only reads the frame, copies, and
//! sends. Ownership of a QP's state is one u32 changed by atomic
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
    fastpath::{
        self, owner, punt, PoolMr, RespState, WriteReq, ACK_TMPL_LEN, POOL_MR_SLOTS, RESP_SLOTS,
    },
    mr_pool, opcode, stat, Bth, Reth, UdpHdr, ICRC_LEN,
};

use crate::{count, ptr_at, MR_POOL};

/// Per-QP responder state, at `qpn % RESP_SLOTS`; user space maps it.
#[map]
static RESP_STATE: Array<RespState> = Array::with_max_entries(RESP_SLOTS, BPF_F_MMAPABLE as u32);

/// The pool's MRs, at `rkey % POOL_MR_SLOTS`; user space maps it.
#[map]
static POOL_MRS: Array<PoolMr> = Array::with_max_entries(POOL_MR_SLOTS, BPF_F_MMAPABLE as u32);

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
}

/// `Some(verdict, counter)` when XDP served the packet; `None` to redirect
/// it to user space as usual.
#[inline(always)]
pub fn try_serve(ctx: &XdpContext, bth: &Bth, f: &Frame) -> Option<(u32, u32)> {
    let (flags, _) = rdma_common::OPCODE_FLAGS[bth.opcode as usize];
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
    if !fastpath::is_fast_write(bth.opcode) {
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
    let pad = bth.pad_count() as usize;
    let body = f
        .udp_len
        .checked_sub(UdpHdr::LEN + Bth::LEN + f.ext_len + ICRC_LEN)
        .ok_or(punt::MALFORMED)?;
    if pad > body {
        return Err(punt::MALFORMED);
    }
    req.plen = (body - pad) as u32;
    let rkey = fastpath::write_rkey(st, &req);
    let mr = POOL_MRS.get(rkey % POOL_MR_SLOTS);
    let place = fastpath::fast_write(st, &req, mr)?;
    if place.ack && !fastpath::ack_template_ok(st) {
        return Err(punt::TX);
    }
    // 0: the ICRC matches; otherwise the punt reason plus one. (Skipped
    // only when the benchmark measures the check's cost.)
    let bench_no_icrc = crate::CONFIG.get(0).is_some_and(|c| c.bench_no_icrc != 0);
    if !bench_no_icrc {
        match check_icrc(ctx, f) {
            0 => {}
            r => return Err(r as usize - 1),
        }
    }
    let len = place.len as usize;
    if len > 0 {
        if len > mr_pool::PAGE {
            return Err(punt::TOO_LONG);
        }
        let pool = MR_POOL.get_ptr_mut(0).ok_or(punt::NOT_POOL)? as *mut u8;
        // The real bounds check was `fast_write`'s (inside the MR, the MR
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
    fastpath::commit(st, &req, &place);
    if !place.ack {
        return Ok((xdp_action::XDP_DROP, stat::XDP_PLACED));
    }
    let v = send_ack(ctx, st, req.psn, f.frame_len);
    Ok(((v >> 32) as u32, v as u32))
}

/// Turns the frame into the ACK of `psn` and sends it back (XDP_TX). Not
/// inlined: its buffers count against the stack only while it runs. The
/// verdict in the high half of the result, the counter in the low one.
#[inline(never)]
fn send_ack(ctx: &XdpContext, st: &mut RespState, psn: u32, frame_len: usize) -> u64 {
    let (v, c) = ack_frame(ctx, st, psn, frame_len);
    ((v as u64) << 32) | c as u64
}

#[inline(always)]
fn ack_frame(ctx: &XdpContext, st: &mut RespState, psn: u32, frame_len: usize) -> (u32, u32) {
    let mut out = [0u8; ACK_TMPL_LEN];
    let n = fastpath::build_ack(st, psn, &mut out);
    if n == 0 || n > ACK_TMPL_LEN || n > frame_len {
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
        if bpf_xdp_store_bytes(ctx.ctx, 0, out.as_mut_ptr().cast(), n as u32) != 0 {
            st.punts[punt::TX] += 1;
            return (xdp_action::XDP_DROP, stat::XDP_PLACED);
        }
    }
    (xdp_action::XDP_TX, stat::XDP_ACKED)
}

/// Bytes hashed per `bpf_xdp_load_bytes` call. Every call reads exactly
/// this many (the verifier then needs no precise lengths, and checks the
/// loop's body in a few passes); the last chunk ends at the ICRC and
/// skips what the one before it hashed. Every RoCE frame has at least
/// this many bytes before its ICRC.
const CHUNK: usize = 32;
/// Chunks after the headers: enough for a page of payload, the RETH and
/// the pad.
const MAX_CHUNKS: u32 = ((mr_pool::PAGE + 64) / CHUNK + 1) as u32;

/// The running CRC over the frame, for `bpf_loop`'s callback. In a
/// per-CPU map rather than on the stack: values read from a map are
/// unknown to the verifier, so it sees every turn of the callback alike
/// and checks its body a few times, not once per turn. (XDP runs to the
/// end on its CPU: nothing else uses the slot meanwhile.)
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CrcWalk {
    off: u64,
    end: u64,
    /// Where the IP header starts and the BTH ends: bytes between are
    /// masked.
    l3: u64,
    hdr_end: u64,
    crc: u32,
    err: u32,
    ipv4: u32,
    _pad: u32,
}

#[map]
static CRC_WALK: PerCpuArray<CrcWalk> = PerCpuArray::with_max_entries(1, 0);

/// Checks the received ICRC, as the engine does before it uses a packet
/// (rxe does the same). The frame may continue into fragments, so it is
/// read with `bpf_xdp_load_bytes` in chunks, one `bpf_loop` turn each:
/// the verifier checks the loop body once instead of every turn.
/// Not inlined: its stack adds to the caller's only while it runs. A
/// scalar result (0, or the punt reason plus one): a BPF function must
/// not leave a stack pointer in R0, as Rust's `Result` returns can.
#[inline(never)]
fn check_icrc(ctx: &XdpContext, f: &Frame) -> u32 {
    match icrc_walk(ctx, f) {
        Ok(()) => 0,
        Err(r) => r as u32 + 1,
    }
}

#[inline(always)]
fn icrc_walk(ctx: &XdpContext, f: &Frame) -> Result<(), usize> {
    let hl = if f.ipv4 { 20 } else { 40 } + UdpHdr::LEN + Bth::LEN;
    // The 64 bits of ones that stand for the LRH.
    let mut crc = !0u32;
    let mut i = 0;
    while i < 8 {
        crc = fastpath::crc_byte(crc, 0xff);
        i += 1;
    }
    let start = f.l3;
    let end = start + hl + (f.udp_len - UdpHdr::LEN - Bth::LEN - ICRC_LEN);
    let chunks = (end - start).div_ceil(CHUNK) as u32;
    if chunks > MAX_CHUNKS {
        return Err(punt::TOO_LONG);
    }
    let w = CRC_WALK.get_ptr_mut(0).ok_or(punt::MALFORMED)?;
    // SAFETY: this CPU's slot; only this invocation uses it (see CrcWalk).
    unsafe {
        *w = CrcWalk {
            off: start as u64,
            end: end as u64,
            l3: start as u64,
            hdr_end: (start + hl) as u64,
            crc,
            err: 0,
            ipv4: f.ipv4 as u32,
            _pad: 0,
        }
    };
    let mut cb_ctx = ctx.ctx;
    // SAFETY: the callback is a function of this program; `cb_ctx` lives
    // on our stack for the whole call.
    let turns = unsafe {
        bpf_loop(
            chunks,
            crc_chunk as *mut core::ffi::c_void,
            (&mut cb_ctx as *mut *mut aya_ebpf::bindings::xdp_md).cast(),
            0,
        )
    };
    // SAFETY: as above.
    let w = unsafe { *w };
    if turns != chunks as i64 || w.err != 0 || w.off != end as u64 {
        return Err(punt::MALFORMED);
    }
    let mut got = [0u8; 4];
    // SAFETY: four bytes into a four-byte stack buffer.
    let r = unsafe { bpf_xdp_load_bytes(ctx.ctx, end as u32, got.as_mut_ptr().cast(), 4) };
    if r != 0 {
        return Err(punt::MALFORMED);
    }
    if u32::from_le_bytes(got) != !w.crc {
        return Err(punt::ICRC);
    }
    Ok(())
}

/// One `bpf_loop` turn: up to [`CHUNK`] more bytes into the CRC. The
/// headers (IP, UDP, BTH) go in masked, as the ICRC wants them.
#[inline(never)]
extern "C" fn crc_chunk(_turn: u64, cb_ctx: *mut core::ffi::c_void) -> i64 {
    // SAFETY: `check_icrc` passes a pointer to the frame's context.
    let xdp = unsafe { *(cb_ctx as *mut *mut aya_ebpf::bindings::xdp_md) };
    let Some(w) = CRC_WALK.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: this CPU's slot, set up by `check_icrc`.
    let w = unsafe { &mut *w };
    if w.off >= w.end {
        return 1;
    }
    let left = w.end - w.off;
    let (at, skip) = if left >= CHUNK as u64 {
        (w.off, 0)
    } else if w.end >= CHUNK as u64 {
        (w.end - CHUNK as u64, CHUNK as u64 - left)
    } else {
        w.err = 1;
        return 1;
    };
    let mut buf = [0u8; CHUNK];
    // SAFETY: CHUNK bytes into a CHUNK-byte stack buffer.
    let r = unsafe { bpf_xdp_load_bytes(xdp, at as u32, buf.as_mut_ptr().cast(), CHUNK as u32) };
    if r != 0 {
        w.err = 1;
        return 1;
    }
    let mut crc = w.crc;
    // The chunk holds header bytes: those are masked.
    let masked = at < w.hdr_end;
    if skip == 0 && !masked {
        let mut i = 0;
        while i < CHUNK / 8 {
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[i * 8..i * 8 + 8]);
            crc = fastpath::crc_8(crc, &b);
            i += 1;
        }
    } else {
        // Under 96 when masked: the headers end at most 60 bytes after
        // the IP header, and chunks start at it or later.
        let rel = at.wrapping_sub(w.l3) as usize;
        let base = ((w.ipv4 & 1) as usize) << 7;
        let mut i = 0;
        while i < CHUNK {
            let mut b = buf[i];
            if masked {
                b |= fastpath::ICRC_MASK[base | ((rel + i) & 127)];
            }
            if i as u64 >= skip {
                crc = fastpath::crc_byte(crc, b);
            }
            i += 1;
        }
    }
    w.off = at + CHUNK as u64;
    w.crc = crc;
    0
}
