//! Queue pairs (RC and UD): `ibv_create_qp`, `ibv_create_qp_ex` (through
//! `verbs_context.create_qp_ex`), `ibv_modify_qp`, `ibv_query_qp`,
//! `ibv_qp_to_qp_ex` and `ibv_destroy_qp`. Control calls run under the
//! data path's lock on the caller's thread; posting is in `post`, the
//! `ibv_wr_*` calls in `wr`.

use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use rdma_user::device::rings::QpRings;
use rdma_user::memory::Access;
use rdma_user::transport::{QpAttr, QpCap, QpState, QpType, MAX_INLINE, MAX_SGE};

use crate::ffi::*;
use crate::objects::{hold_context, Batch, CShared, Qp, CQS, PDS, QPS, SRQS};
use crate::port::path_of;
use crate::{err_ptr, guard};

/// # Safety
/// `pd` is a PD; `attr` points to an init attr.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    // SAFETY: the same contract.
    unsafe { create_qp(pd, attr, None) }
}

/// The send operations `ibv_wr_*` supports here (an RC QP's).
const SEND_OPS: u64 = (IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD) as u64;

/// `verbs_context.create_qp_ex` (what the inline `ibv_create_qp_ex` calls
/// for more than a PD): an RC QP, with the `ibv_wr_*` send path when
/// send ops are asked for.
pub(crate) unsafe extern "C" fn create_qp_ex(
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guard(ptr::null_mut(), || {
        if attr.is_null() {
            return err_ptr(libc::EINVAL);
        }
        // SAFETY: the caller's init attr.
        let a = unsafe { &*attr };
        let known =
            IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS;
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
            return err_ptr(libc::EINVAL);
        }
        if a.comp_mask & !known != 0
            || (a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0)
        {
            return err_ptr(libc::EOPNOTSUPP);
        }
        let ops = (a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0).then_some(a.send_ops_flags);
        if ops.is_some_and(|o| o & !SEND_OPS != 0) {
            return err_ptr(libc::EOPNOTSUPP);
        }
        match PDS.get(a.pd) {
            Some(p) if p.context() == context => {}
            _ => return err_ptr(libc::EINVAL),
        }
        // SAFETY: ibv_qp_init_attr_ex begins with ibv_qp_init_attr's
        // fields (rdma-core's layout), so the prefix is one.
        unsafe { create_qp(a.pd, attr as *mut ibv_qp_init_attr, ops) }
    })
}

/// # Safety
/// As `ibv_create_qp`; `send_ops`: the `ibv_wr_*` path is wanted.
unsafe fn create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
    send_ops: Option<u64>,
) -> *mut ibv_qp {
    guard(ptr::null_mut(), || {
        let Some(p) = PDS.get(pd) else {
            return err_ptr(libc::EINVAL);
        };
        if attr.is_null() {
            return err_ptr(libc::EINVAL);
        }
        // SAFETY: the caller's init attr, copied (the granted capabilities
        // are written back below).
        let a = unsafe { attr.read() };
        let qp_type = match a.qp_type {
            IBV_QPT_RC => QpType::Rc,
            IBV_QPT_UD => QpType::Ud,
            // SMI and GSI (0, 1) are the kernel's own: uverbs refuses them
            // with EINVAL (rxe measured); other types this device lacks.
            0 | 1 => return err_ptr(libc::EINVAL),
            _ => return err_ptr(libc::EOPNOTSUPP),
        };
        if qp_type == QpType::Ud && send_ops.is_some() {
            // ibv_wr_* is offered for RC only.
            return err_ptr(libc::EOPNOTSUPP);
        }
        let srq = if a.srq.is_null() {
            None
        } else {
            match SRQS.get(a.srq) {
                Some(sq) if sq.pd == pd as usize => Some(sq),
                _ => return err_ptr(libc::EINVAL),
            }
        };
        let (Some(scq), Some(rcq)) = (CQS.get(a.send_cq), CQS.get(a.recv_cq)) else {
            return err_ptr(libc::EINVAL);
        };
        let cap = a.cap;
        if cap.max_send_sge as usize > MAX_SGE
            || cap.max_recv_sge as usize > MAX_SGE
            || cap.max_send_wr > 16384
            || cap.max_recv_wr > 16384
        {
            return err_ptr(libc::EINVAL);
        }
        let Some(ctx) = hold_context(p.context()) else {
            return err_ptr(libc::EINVAL);
        };
        let scq_guard = scq.inner.lock().unwrap_or_else(|e| e.into_inner());
        let same = Arc::ptr_eq(&scq, &rcq);
        let rcq_guard = (!same).then(|| rcq.inner.lock().unwrap_or_else(|e| e.into_inner()));
        let send = scq_guard.as_ref();
        let recv = match &rcq_guard {
            Some(g) => g.as_ref(),
            None => send,
        };
        let (Some(send), Some(recv)) = (send, recv) else {
            return err_ptr(libc::EINVAL);
        };
        let r = p.inner.create_qp_typed(
            send,
            recv,
            QpCap {
                max_send_wr: cap.max_send_wr.max(1),
                max_recv_wr: cap.max_recv_wr.max(1),
            },
            qp_type,
            ctx.port_mtu(),
        );
        drop(rcq_guard);
        drop(scq_guard);
        match r {
            Ok(inner) => {
                // What we grant: the depths asked for, inline up to 256 B.
                let granted = ibv_qp_cap {
                    max_send_wr: cap.max_send_wr.max(1),
                    max_recv_wr: cap.max_recv_wr.max(1),
                    max_inline_data: cap.max_inline_data.clamp(64, MAX_INLINE as u32),
                    ..cap
                };
                let rings = Arc::new(QpRings::new(
                    qp_type,
                    granted.max_send_wr,
                    granted.max_recv_wr,
                    QpState::Reset,
                ));
                if let Err(e) = inner.share(rings.clone()) {
                    return err_ptr(e.errno());
                }
                if let Some(sq) = &srq {
                    if let Err(e) = inner.attach_srq(sq.shared.clone()) {
                        return err_ptr(e.errno());
                    }
                }
                // SAFETY: the caller's init attr (its out field).
                unsafe { (*attr).cap = granted };
                let mut qpx = ibv_qp_ex {
                    qp_base: ibv_qp {
                        context: p.context(),
                        qp_context: a.qp_context,
                        pd,
                        send_cq: a.send_cq,
                        recv_cq: a.recv_cq,
                        srq: a.srq,
                        handle: inner.qpn,
                        qp_num: inner.qpn,
                        state: IBV_QPS_RESET,
                        qp_type: a.qp_type,
                        ..Default::default()
                    },
                    ..Default::default()
                };
                if send_ops.is_some() {
                    crate::wr::set_ops(&mut qpx);
                }
                if let Some(sq) = &srq {
                    sq.users.fetch_add(1, Ordering::AcqRel);
                }
                QPS.add(Arc::new(Qp {
                    qpx: CShared::new(qpx),
                    qpn: inner.qpn,
                    qp_type: a.qp_type,
                    ex: send_ops.is_some(),
                    batch: Mutex::new(Batch::with_capacity(granted.max_send_wr)),
                    inner: Mutex::new(Some(inner)),
                    rings: Mutex::new(rings),
                    dp: p.inner.context().clone(),
                    cap: granted,
                    sq_sig_all: a.sq_sig_all != 0,
                    ctx,
                    events_reported: AtomicU32::new(0),
                    events_acked: AtomicU32::new(0),
                    srq,
                }))
                .cast()
            }
            Err(e) => err_ptr(e.errno()),
        }
    })
}

/// # Safety
/// `qp` is a QP.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    guard(libc::EIO, || {
        QPS.destroy(qp, libc::EINVAL, |q| {
            // rdma-core blocks until every event reported for the QP was
            // acknowledged (the program may still be reading one).
            while q.events_acked.load(Ordering::Acquire) < q.events_reported.load(Ordering::Acquire)
            {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let inner = q.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
            inner.map_or(Ok(()), |i| i.destroy().map_err(|e| e.errno()))?;
            if let Some(sq) = &q.srq {
                sq.users.fetch_sub(1, Ordering::AcqRel);
            }
            Ok(())
        })
        .map(|o| o.ctx.release())
        .err()
        .unwrap_or(0)
    })
}

fn state_of(s: ibv_qp_state) -> Result<QpState, c_int> {
    Ok(match s {
        IBV_QPS_RESET => QpState::Reset,
        IBV_QPS_INIT => QpState::Init,
        IBV_QPS_RTR => QpState::Rtr,
        IBV_QPS_RTS => QpState::Rts,
        IBV_QPS_SQD => QpState::Sqd,
        IBV_QPS_SQE => QpState::Sqe,
        IBV_QPS_ERR => QpState::Err,
        _ => return Err(libc::EINVAL),
    })
}

fn ibv_state(s: QpState) -> ibv_qp_state {
    match s {
        QpState::Reset => IBV_QPS_RESET,
        QpState::Init => IBV_QPS_INIT,
        QpState::Rtr => IBV_QPS_RTR,
        QpState::Rts => IBV_QPS_RTS,
        QpState::Sqd => IBV_QPS_SQD,
        QpState::Sqe => IBV_QPS_SQE,
        QpState::Err => IBV_QPS_ERR,
    }
}

/// The mask bits RC takes, plus two that are harmless (current state and
/// SQD notification are only hints).
const RC_MASK: u32 = IBV_QP_STATE
    | IBV_QP_CUR_STATE
    | IBV_QP_EN_SQD_ASYNC_NOTIFY
    | IBV_QP_ACCESS_FLAGS
    | IBV_QP_PKEY_INDEX
    | IBV_QP_PORT
    | IBV_QP_AV
    | IBV_QP_PATH_MTU
    | IBV_QP_TIMEOUT
    | IBV_QP_RETRY_CNT
    | IBV_QP_RNR_RETRY
    | IBV_QP_RQ_PSN
    | IBV_QP_MAX_QP_RD_ATOMIC
    | IBV_QP_MIN_RNR_TIMER
    | IBV_QP_SQ_PSN
    | IBV_QP_MAX_DEST_RD_ATOMIC
    | IBV_QP_DEST_QPN;

/// UD's: no address vector, PSN of the receive side or timers; a Q_Key.
const UD_MASK: u32 = IBV_QP_STATE
    | IBV_QP_CUR_STATE
    | IBV_QP_EN_SQD_ASYNC_NOTIFY
    | IBV_QP_PKEY_INDEX
    | IBV_QP_PORT
    | IBV_QP_QKEY
    | IBV_QP_SQ_PSN;

fn qp_attr_of(a: &ibv_qp_attr, mask: u32, qp_type: ibv_qp_type) -> Result<QpAttr, c_int> {
    let allowed = if qp_type == IBV_QPT_UD {
        UD_MASK
    } else {
        RC_MASK
    };
    if mask & !allowed != 0 {
        return Err(libc::EINVAL);
    }
    let has = |b: u32| mask & b != 0;
    let mut q = QpAttr::default();
    if has(IBV_QP_STATE) {
        q.qp_state = Some(state_of(a.qp_state)?);
    }
    if has(IBV_QP_ACCESS_FLAGS) {
        q.qp_access_flags = Some(Access(a.qp_access_flags & 15));
    }
    if has(IBV_QP_PKEY_INDEX) {
        q.pkey_index = Some(a.pkey_index);
    }
    if has(IBV_QP_PORT) {
        q.port_num = Some(a.port_num);
    }
    if has(IBV_QP_QKEY) {
        q.qkey = Some(a.qkey);
    }
    if has(IBV_QP_AV) {
        // RoCE needs the GRH: its GIDs are the IP addresses.
        if a.ah_attr.is_global == 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: reading the raw bytes of the GID union.
        q.dest_gid = Some(unsafe { a.ah_attr.grh.dgid.raw });
    }
    if has(IBV_QP_PATH_MTU) {
        if !(IBV_MTU_256..=IBV_MTU_4096).contains(&a.path_mtu) {
            return Err(libc::EINVAL);
        }
        q.path_mtu = Some(128 << a.path_mtu);
    }
    if has(IBV_QP_TIMEOUT) {
        q.timeout = Some(a.timeout);
    }
    if has(IBV_QP_RETRY_CNT) {
        q.retry_cnt = Some(a.retry_cnt);
    }
    if has(IBV_QP_RNR_RETRY) {
        q.rnr_retry = Some(a.rnr_retry);
    }
    if has(IBV_QP_RQ_PSN) {
        q.rq_psn = Some(a.rq_psn & 0xff_ffff);
    }
    if has(IBV_QP_MAX_QP_RD_ATOMIC) {
        // Our initiator depth is capped at the engine's limit: issuing fewer
        // READs/atomics at once than the peer would take is always safe
        // (perftest sets the peer's responder depth here, 128 for rxe).
        q.max_rd_atomic = Some(a.max_rd_atomic.min(rdma_user::transport::MAX_RD_ATOMIC));
    }
    if has(IBV_QP_MIN_RNR_TIMER) {
        q.min_rnr_timer = Some(a.min_rnr_timer);
    }
    if has(IBV_QP_SQ_PSN) {
        q.sq_psn = Some(a.sq_psn & 0xff_ffff);
    }
    if has(IBV_QP_MAX_DEST_RD_ATOMIC) {
        q.max_dest_rd_atomic = Some(a.max_dest_rd_atomic);
    }
    if has(IBV_QP_DEST_QPN) {
        q.dest_qp_num = Some(a.dest_qp_num & 0xff_ffff);
    }
    Ok(q)
}

/// # Safety
/// `qp` is a QP; `attr` points to a QP attr.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    guard(libc::EIO, || {
        let Some(q) = QPS.get(qp) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: the caller's attr.
        let a = unsafe { &*attr };
        let m = mask as u32;
        let qa = match qp_attr_of(a, m, q.qp_type) {
            Ok(x) => x,
            Err(e) => return e,
        };
        let path = if m & IBV_QP_AV != 0 {
            match path_of(q.ctx.netdev(), &a.ah_attr) {
                Ok(p) => Some(p),
                Err(e) => return e,
            }
        } else {
            None
        };
        let inner = q.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(i) = inner.as_ref() else {
            return libc::EINVAL;
        };
        if let Err(e) = i.modify(&qa) {
            return e.errno();
        }
        if let Some(p) = path {
            if let Err(e) = i.set_path(p) {
                return e.errno();
            }
        }
        if let Ok(s) = i.state() {
            // SAFETY: the live QP's own struct, written under its `inner`
            // lock (so no two of our writes race); the program reads it.
            unsafe { (*q.qpx.get()).qp_base.state = ibv_state(s) };
        }
        0
    })
}

/// The QP's state and capabilities (what programs ask: `IBV_QP_CAP` for
/// max_inline_data, the state).
///
/// # Safety
/// `qp` is a QP; `attr` and `init_attr` point to their structs.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    let Some(q) = QPS.get(qp) else {
        return libc::EINVAL;
    };
    if attr.is_null() || init_attr.is_null() {
        return libc::EINVAL;
    }
    let inner = q.inner.lock().unwrap_or_else(|e| e.into_inner());
    let state = inner
        .as_ref()
        .and_then(|i| i.state().ok())
        .map(ibv_state)
        .unwrap_or(IBV_QPS_ERR);
    let qkey = inner.as_ref().and_then(|i| i.qkey().ok()).unwrap_or(0);
    drop(inner);
    let a = ibv_qp_attr {
        qp_state: state,
        cur_qp_state: state,
        cap: q.cap,
        port_num: 1,
        qkey,
        ..Default::default()
    };
    // SAFETY: the live QP's own struct, read a field at a time.
    let (qp_context, send_cq, recv_cq, srq) = unsafe {
        let b = &raw const (*q.qpx.get()).qp_base;
        ((*b).qp_context, (*b).send_cq, (*b).recv_cq, (*b).srq)
    };
    let ia = ibv_qp_init_attr {
        qp_context,
        send_cq,
        recv_cq,
        srq,
        cap: q.cap,
        qp_type: q.qp_type,
        sq_sig_all: q.sq_sig_all as c_int,
    };
    // SAFETY: the caller's structs.
    unsafe {
        attr.write(a);
        init_attr.write(ia);
    }
    0
}

/// The new-style QP (`ibv_wr_*`) is not offered yet: NULL, as rdma-core
/// returns for a provider without it.
///
/// # Safety
/// Any pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut c_void {
    match QPS.get(qp) {
        Some(q) if q.ex => qp as *mut c_void,
        _ => ptr::null_mut(),
    }
}
