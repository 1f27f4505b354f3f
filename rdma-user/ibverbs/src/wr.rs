//! The `ibv_wr_*` send path of `ibv_qp_ex`: `ibv_wr_start`, one builder
//! call per WR (`ibv_wr_rdma_write`, `ibv_wr_send`, ...) taking `wr_id`
//! and `wr_flags` from the `ibv_qp_ex`, its data (`ibv_wr_set_sge`,
//! `ibv_wr_set_inline_data`, ...), then `ibv_wr_complete` posts the batch
//! through the same checks and rings as `ibv_post_send`, or
//! `ibv_wr_abort` drops it.
//!
//! The batch (`objects::Batch`) is allocated with the QP (its send queue
//! depth): building and posting allocate nothing.

use std::ffi::{c_int, c_void};

use rdma_user::transport::{MAX_INLINE, MAX_SGE};

use crate::ffi::*;
use crate::objects::{Batch, PendingWr, QPS};
use crate::post::post_batch;

/// The `ibv_wr_*` calls' way in: `f` on the batch of the live QP behind
/// `qpx`, with the `wr_id` and `wr_flags` the program set in it.
fn with_batch<R>(qpx: *mut ibv_qp_ex, f: impl FnOnce(&mut Batch, u64, u32) -> R) -> Option<R> {
    let q = QPS.get(qpx)?;
    // SAFETY: fields of the live QP's own struct, which the program sets
    // before each builder call (on this thread, by the ibv_wr_* contract).
    let (wr_id, wr_flags) = unsafe { ((*q.qpx.get()).wr_id, (*q.qpx.get()).wr_flags) };
    let mut b = q.batch.lock().unwrap_or_else(|e| e.into_inner());
    Some(f(&mut b, wr_id, wr_flags))
}

/// Starts a WR of `opcode` on `qpx` and lets `f` fill its remote part.
fn begin(qpx: *mut ibv_qp_ex, opcode: ibv_wr_opcode, f: impl FnOnce(&mut PendingWr)) {
    with_batch(qpx, |b, wr_id, wr_flags| {
        if let Some(w) = b.start(wr_id, wr_flags, opcode) {
            f(w);
        }
    });
}

unsafe extern "C" fn wr_start(qpx: *mut ibv_qp_ex) {
    with_batch(qpx, |b, _, _| {
        b.wrs.clear();
        b.error = None;
    });
}

unsafe extern "C" fn wr_complete(qpx: *mut ibv_qp_ex) -> c_int {
    crate::guard(libc::EIO, || post_batch(qpx))
}

unsafe extern "C" fn wr_abort(qpx: *mut ibv_qp_ex) {
    with_batch(qpx, |b, _, _| {
        b.wrs.clear();
        b.error = None;
    });
}

unsafe extern "C" fn wr_send(qpx: *mut ibv_qp_ex) {
    begin(qpx, IBV_WR_SEND, |_| {});
}

unsafe extern "C" fn wr_send_imm(qpx: *mut ibv_qp_ex, imm: __be32) {
    begin(qpx, IBV_WR_SEND_WITH_IMM, |w| w.imm = imm);
}

/// Starts a WR of `opcode` aimed at `remote_addr` under `rkey`; `f` sets
/// the rest.
fn begin_remote(
    qpx: *mut ibv_qp_ex,
    opcode: ibv_wr_opcode,
    rkey: u32,
    remote_addr: u64,
    f: impl FnOnce(&mut PendingWr),
) {
    begin(qpx, opcode, |w| {
        w.rkey = rkey;
        w.remote_addr = remote_addr;
        f(w);
    });
}

unsafe extern "C" fn wr_rdma_write(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    begin_remote(qpx, IBV_WR_RDMA_WRITE, rkey, remote_addr, |_| {});
}

unsafe extern "C" fn wr_rdma_write_imm(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    imm: __be32,
) {
    begin_remote(qpx, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, remote_addr, |w| {
        w.imm = imm
    });
}

unsafe extern "C" fn wr_rdma_read(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    begin_remote(qpx, IBV_WR_RDMA_READ, rkey, remote_addr, |_| {});
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    begin_remote(qpx, IBV_WR_ATOMIC_CMP_AND_SWP, rkey, remote_addr, |w| {
        w.compare_add = compare;
        w.swap = swap;
    });
}

unsafe extern "C" fn wr_atomic_fetch_add(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    begin_remote(qpx, IBV_WR_ATOMIC_FETCH_AND_ADD, rkey, remote_addr, |w| {
        w.compare_add = add
    });
}

unsafe extern "C" fn wr_set_sge(qpx: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    with_batch(qpx, |b, _, _| {
        if let Some(w) = b.current() {
            w.sges[0] = ibv_sge { addr, length, lkey };
            w.num_sge = 1;
            w.flags &= !IBV_SEND_INLINE;
        }
    });
}

unsafe extern "C" fn wr_set_sge_list(qpx: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    with_batch(qpx, |b, _, _| {
        if n > MAX_SGE || (n > 0 && list.is_null()) {
            return b.fail(libc::EINVAL);
        }
        if let Some(w) = b.current() {
            if n > 0 {
                // SAFETY: the caller's list of n SGEs, copied now (the
                // builder owns its WR's data from here on).
                let l = unsafe { std::slice::from_raw_parts(list, n) };
                w.sges[..n].copy_from_slice(l);
            }
            w.num_sge = n;
            w.flags &= !IBV_SEND_INLINE;
        }
    });
}

/// Appends `bufs` to the current WR's inline data.
fn set_inline(qpx: *mut ibv_qp_ex, bufs: &[(*const u8, usize)]) {
    with_batch(qpx, |b, _, _| {
        let total: usize = bufs.iter().map(|x| x.1).sum();
        if total > MAX_INLINE || bufs.iter().any(|x| x.0.is_null() && x.1 > 0) {
            return b.fail(libc::EINVAL);
        }
        if let Some(w) = b.current() {
            let mut at = 0;
            for &(p, n) in bufs {
                if n > 0 {
                    // SAFETY: the caller's buffer of n bytes, copied now as
                    // inline data is.
                    let src = unsafe { std::slice::from_raw_parts(p, n) };
                    w.inline[at..at + n].copy_from_slice(src);
                    at += n;
                }
            }
            w.inline_len = at;
            w.flags |= IBV_SEND_INLINE;
        }
    });
}

unsafe extern "C" fn wr_set_inline_data(qpx: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    set_inline(qpx, &[(addr as *const u8, length)]);
}

unsafe extern "C" fn wr_set_inline_data_list(
    qpx: *mut ibv_qp_ex,
    n: usize,
    list: *const ibv_data_buf,
) {
    if n > MAX_SGE || (n > 0 && list.is_null()) {
        with_batch(qpx, |b, _, _| b.fail(libc::EINVAL));
        return;
    }
    let mut bufs = [(std::ptr::null::<u8>(), 0usize); MAX_SGE];
    if n > 0 {
        // SAFETY: the caller's list of n buffers.
        let l = unsafe { std::slice::from_raw_parts(list, n) };
        for (o, d) in bufs.iter_mut().zip(l) {
            *o = (d.addr as *const u8, d.length);
        }
    }
    set_inline(qpx, &bufs[..n]);
}

/// What an RC QP cannot do here (memory windows, invalidation, TSO, UD
/// addressing, XRC, atomic write): the batch fails with EOPNOTSUPP
/// (`ibv_create_qp_ex` refuses to promise these send ops anyway).
fn unsupported(qpx: *mut ibv_qp_ex) {
    with_batch(qpx, |b, _, _| b.fail(libc::EOPNOTSUPP));
}

unsafe extern "C" fn wr_unsupported_inv(qpx: *mut ibv_qp_ex, _rkey: u32) {
    unsupported(qpx)
}

unsafe extern "C" fn wr_unsupported_bind(
    qpx: *mut ibv_qp_ex,
    _mw: *mut ibv_mw,
    _rkey: u32,
    _info: *const ibv_mw_bind_info,
) {
    unsupported(qpx)
}

unsafe extern "C" fn wr_unsupported_tso(qpx: *mut ibv_qp_ex, _h: *mut c_void, _sz: u16, _mss: u16) {
    unsupported(qpx)
}

unsafe extern "C" fn wr_unsupported_ud(
    qpx: *mut ibv_qp_ex,
    _ah: *mut ibv_ah,
    _qpn: u32,
    _qkey: u32,
) {
    with_batch(qpx, |b, _, _| b.fail(libc::EOPNOTSUPP));
}

unsafe extern "C" fn wr_unsupported_atomic_write(
    qpx: *mut ibv_qp_ex,
    _rkey: u32,
    _addr: u64,
    _data: *const c_void,
) {
    unsupported(qpx)
}

/// Fills a new QP's `ibv_qp_ex` operation table.
pub(crate) fn set_ops(q: &mut ibv_qp_ex) {
    q.wr_start = Some(wr_start);
    q.wr_complete = Some(wr_complete);
    q.wr_abort = Some(wr_abort);
    q.wr_send = Some(wr_send);
    q.wr_send_imm = Some(wr_send_imm);
    q.wr_rdma_write = Some(wr_rdma_write);
    q.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    q.wr_rdma_read = Some(wr_rdma_read);
    q.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    q.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    q.wr_set_sge = Some(wr_set_sge);
    q.wr_set_sge_list = Some(wr_set_sge_list);
    q.wr_set_inline_data = Some(wr_set_inline_data);
    q.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    q.wr_send_inv = Some(wr_unsupported_inv);
    q.wr_local_inv = Some(wr_unsupported_inv);
    q.wr_set_xrc_srqn = Some(wr_unsupported_inv);
    q.wr_bind_mw = Some(wr_unsupported_bind);
    q.wr_send_tso = Some(wr_unsupported_tso);
    q.wr_set_ud_addr = Some(wr_unsupported_ud);
    q.wr_atomic_write = Some(wr_unsupported_atomic_write);
}
