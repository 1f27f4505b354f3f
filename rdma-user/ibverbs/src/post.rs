//! Posting work requests: `ibv_post_send`, `ibv_post_recv` and
//! `ibv_post_srq_recv`, which programs call inline through `ctx->ops`, and
//! `ibv_wr_complete`'s post of a batch built with `ibv_wr_*`.
//!
//! Posts are lock-free ring operations (`rdma_user::device::rings`) that
//! also try to run a turn of the data path on the calling thread (inline
//! progress, never waiting); a single WR posted while that lock is free
//! and its ring empty goes straight to the engine under it (the same
//! checks, no copies through the ring).

use std::ffi::c_int;

use rdma_user::device::rings::QpRings;
use rdma_user::transport::{RecvWr, SendFlags, SendWr, Sge, UdDest, WrOpcode, MAX_INLINE, MAX_SGE};

use crate::ffi::*;
use crate::guard;
use crate::objects::{Qp, AHS, QPS, SRQS};

/// `ibv_wr_complete`: posts the batch through the post path, in order;
/// the errno of the first WR refused (those before it are posted).
pub(crate) fn post_batch(qpx: *mut ibv_qp_ex) -> c_int {
    let Some(q) = QPS.get(qpx) else {
        return libc::EINVAL;
    };
    let mut b = q.batch.lock().unwrap_or_else(|e| e.into_inner());
    let rings = q.rings.lock().unwrap_or_else(|e| e.into_inner());
    let mut ret = b.error.take().unwrap_or(0);
    let mut posted = 0;
    if ret == 0 {
        for p in b.wrs.iter_mut() {
            let wr = p.as_send_wr();
            if let Err(e) = post_one(&q, &wr, |w| rings.post_send(w).map_err(post_errno)) {
                ret = e;
                break;
            }
            posted += 1;
        }
    }
    b.wrs.clear();
    if posted > 0 {
        moved(&q, &rings);
    }
    ret
}

/// A WR's SGE list (EINVAL for a bad count).
///
/// # Safety
/// `list` is NULL or points to `n` SGEs that stay valid for `'a`.
unsafe fn sges<'a>(list: *mut ibv_sge, n: c_int) -> Result<&'a [ibv_sge], c_int> {
    if n < 0 || n as usize > MAX_SGE || (n > 0 && list.is_null()) {
        return Err(libc::EINVAL);
    }
    if n == 0 {
        return Ok(&[]);
    }
    // SAFETY: the caller's list of n SGEs (this function's contract).
    Ok(unsafe { std::slice::from_raw_parts(list, n as usize) })
}

fn our_sges(list: &[ibv_sge], out: &mut [Sge; MAX_SGE]) -> usize {
    for (o, s) in out.iter_mut().zip(list) {
        *o = Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        };
    }
    list.len()
}

/// A program's send WR as the engine takes it, handed to `submit`.
fn post_one(
    q: &Qp,
    r: &ibv_send_wr,
    submit: impl FnOnce(&SendWr) -> Result<(), c_int>,
) -> Result<(), c_int> {
    // SAFETY: the WR's own list, valid during the post (its contract).
    let list = unsafe { sges(r.sg_list, r.num_sge)? };
    let mut sg = [Sge::default(); MAX_SGE];
    let n = our_sges(list, &mut sg);
    let opcode = match r.opcode {
        IBV_WR_SEND => WrOpcode::Send,
        IBV_WR_SEND_WITH_IMM => WrOpcode::SendWithImm,
        IBV_WR_RDMA_WRITE => WrOpcode::RdmaWrite,
        IBV_WR_RDMA_WRITE_WITH_IMM => WrOpcode::RdmaWriteWithImm,
        IBV_WR_RDMA_READ => WrOpcode::RdmaRead,
        IBV_WR_ATOMIC_CMP_AND_SWP => WrOpcode::CmpSwap,
        IBV_WR_ATOMIC_FETCH_AND_ADD => WrOpcode::FetchAdd,
        _ => return Err(libc::EINVAL),
    };
    let mut w = SendWr::new(r.wr_id, opcode, &sg[..n]);
    w.flags = SendFlags {
        signaled: q.sq_sig_all || r.send_flags & IBV_SEND_SIGNALED != 0,
        solicited: r.send_flags & IBV_SEND_SOLICITED != 0,
        fence: r.send_flags & IBV_SEND_FENCE != 0,
    };
    // SAFETY: the unions are read as the opcode defines them.
    unsafe {
        w.imm = u32::from_be(r.__bindgen_anon_1.imm_data);
        match opcode {
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm | WrOpcode::RdmaRead => {
                w.remote_addr = r.wr.rdma.remote_addr;
                w.rkey = r.wr.rdma.rkey;
            }
            WrOpcode::CmpSwap | WrOpcode::FetchAdd => {
                w.remote_addr = r.wr.atomic.remote_addr;
                w.rkey = r.wr.atomic.rkey;
                w.compare_add = r.wr.atomic.compare_add;
                w.swap = r.wr.atomic.swap;
            }
            _ => {}
        }
    }
    if q.qp_type == IBV_QPT_UD {
        // SAFETY: a UD WR's union member is `ud`.
        let ud = unsafe { r.wr.ud };
        let ah = AHS.get(ud.ah).ok_or(libc::EINVAL)?.inner.handle;
        w.ud = Some(UdDest {
            ah,
            remote_qpn: ud.remote_qpn & 0xff_ffff,
            remote_qkey: ud.remote_qkey,
        });
    }
    let mut inline = [0u8; MAX_INLINE];
    if r.send_flags & IBV_SEND_INLINE != 0 {
        let total: u64 = list.iter().map(|s| s.length as u64).sum();
        if total > q.cap.max_inline_data as u64 {
            return Err(libc::EINVAL);
        }
        let mut at = 0;
        // An empty segment may have a NULL address (UCX's zero-length
        // active messages): nothing to read there.
        for s in list.iter().filter(|s| s.length > 0) {
            // SAFETY: inline data is read from the caller's buffers at
            // post time (no lkey needed, as the spec says); the total was
            // checked to fit.
            let src = unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.length as usize) };
            inline[at..at + src.len()].copy_from_slice(src);
            at += src.len();
        }
        w.inline = Some(&inline[..at]);
    }
    submit(&w)
}

/// rdma-core's errno for a refused post: a full queue is ENOMEM.
fn post_errno(e: rdma_user::transport::PostError) -> c_int {
    rdma_user::device::error::DeviceError::Post(e).errno()
}

/// `ctx->ops.post_send`: checks and pushes onto the QP's send ring.
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    guard(libc::EIO, || {
        let Some(q) = QPS.get(qp) else {
            return libc::EINVAL;
        };
        let rings = q.rings.lock().unwrap_or_else(|e| e.into_inner());
        // One WR: straight into the engine when the data path is free (a
        // turn then sends it); a chain, or a busy data path: the ring.
        // SAFETY: a non-null WR is the head of the caller's chain.
        let single = !wr.is_null() && unsafe { (*wr).next.is_null() };
        let mut ran = false;
        // SAFETY: the caller's WR chain and out pointer.
        let (ret, any) = unsafe {
            post_chain(wr, bad, |r| {
                post_one(&q, r, |w| {
                    if single {
                        if let Some(r) = q.dp.post_send_now(q.qpn, &rings, w) {
                            ran = true;
                            return r.map_err(post_errno);
                        }
                    }
                    rings.post_send(w).map_err(post_errno)
                })
            })
        };
        if any && !ran {
            moved(&q, &rings);
        }
        ret
    })
}

/// A WR of a program's chain (`next` links them).
trait ChainedWr {
    fn next_wr(&self) -> *mut Self;
}

impl ChainedWr for ibv_send_wr {
    fn next_wr(&self) -> *mut Self {
        self.next
    }
}

impl ChainedWr for ibv_recv_wr {
    fn next_wr(&self) -> *mut Self {
        self.next
    }
}

/// Posts a program's WR chain with `post`, in order, until one is refused:
/// that one goes to `*bad` (if given) and its errno is returned, as
/// rdma-core's post calls do. Also returns whether any was posted.
///
/// # Safety
/// `wr` is NULL or the head of a valid chain; `bad` is NULL or writable.
unsafe fn post_chain<W: ChainedWr>(
    wr: *mut W,
    bad: *mut *mut W,
    mut post: impl FnMut(&W) -> Result<(), c_int>,
) -> (c_int, bool) {
    let mut w = wr;
    while !w.is_null() {
        // SAFETY: the caller's chain.
        let r = unsafe { &*w };
        if let Err(e) = post(r) {
            if !bad.is_null() {
                // SAFETY: the caller's out pointer.
                unsafe { *bad = w };
            }
            return (e, w != wr);
        }
        w = r.next_wr();
    }
    (0, w != wr)
}

/// A program's receive WR as the engine takes it (at most `max_sge` SGEs,
/// else EINVAL), handed to `f`.
fn with_recv_wr(
    r: &ibv_recv_wr,
    max_sge: usize,
    f: impl FnOnce(&RecvWr) -> Result<(), c_int>,
) -> Result<(), c_int> {
    // SAFETY: the WR's own list, valid during the post (its contract).
    let list = unsafe { sges(r.sg_list, r.num_sge)? };
    if list.len() > max_sge {
        return Err(libc::EINVAL);
    }
    let mut sg = [Sge::default(); MAX_SGE];
    let n = our_sges(list, &mut sg);
    f(&RecvWr {
        wr_id: r.wr_id,
        sg_list: &sg[..n],
    })
}

/// After WRs were pushed: a turn of the data path on this thread takes
/// them at once (a send leaves now, with no thread switch); if another
/// thread is running it, that one will, woken if it sleeps.
fn moved(q: &Qp, rings: &QpRings) {
    if !q.dp.progress() {
        rings.wake();
    }
}

/// `ctx->ops.post_recv`: checks and pushes onto the QP's receive ring.
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        let Some(q) = QPS.get(qp) else {
            return libc::EINVAL;
        };
        if q.srq.is_some() {
            // Its receive WRs go to the SRQ (rdma-core: EINVAL).
            if !bad.is_null() {
                // SAFETY: the caller's out pointer.
                unsafe { *bad = wr };
            }
            return libc::EINVAL;
        }
        let rings = q.rings.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the caller's WR chain and out pointer.
        let (ret, _) = unsafe {
            post_chain(wr, bad, |r| {
                with_recv_wr(r, MAX_SGE, |w| {
                    // Straight into the engine when the data path is free.
                    match q.dp.post_recv_now(q.qpn, &rings, w) {
                        Some(r) => r.map_err(post_errno),
                        None => rings.post_recv(w).map_err(post_errno),
                    }
                })
            })
        };
        // No turn of the data path here: a receive WR is only needed by a
        // message that has arrived, and every turn that handles arrived
        // messages first takes the WRs from the rings. (A turn here would
        // flush the ACK of the message just polled on its own, one syscall
        // before the program's next send would have taken it along.)
        ret
    })
}

/// `ctx->ops.post_srq_recv`: checks and pushes onto the SRQ's ring
/// (ENOMEM beyond its depth).
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        let Some(s) = SRQS.get(srq) else {
            return libc::EINVAL;
        };
        // SAFETY: the caller's WR chain and out pointer.
        let (ret, _) = unsafe {
            post_chain(wr, bad, |r| {
                with_recv_wr(r, s.max_sge as usize, |w| {
                    s.shared.post(w).map_err(post_errno)
                })
            })
        };
        ret
    })
}
