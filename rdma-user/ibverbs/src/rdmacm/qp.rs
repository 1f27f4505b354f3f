//! An id's QP and the CQs rdma_cm makes for it: `rdma_create_qp`,
//! `rdma_create_qp_ex`, `rdma_destroy_qp`, `rdma_init_qp_attr`.

use std::ffi::{c_int, c_void};
use std::ptr;

use super::abi::*;
use super::service::with_cm;
use super::state::{err, live_id, Cm};
use crate::ffi::*;
use crate::{errno, guard};

/// Moves a new QP to INIT (and a UD QP on to RTS), as rdma_create_qp does.
fn init_qp(cm: &Cm, id: *mut rdma_cm_id) -> Result<(), c_int> {
    cm.modify(id, IBV_QPS_INIT)?;
    // SAFETY: a live id of ours.
    if unsafe { (*id).ps } == RDMA_PS_UDP {
        cm.modify(id, IBV_QPS_RTR)?;
        cm.modify(id, IBV_QPS_RTS)?;
    }
    Ok(())
}

pub(super) fn create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    if !live_id(id) || attr.is_null() {
        return err(libc::EINVAL);
    }
    // As librdmacm: the QP is made from a copy of the caller's attributes
    // with the CQs rdma_cm makes filled in, and the copy goes back (so a
    // reused attr carries this QP's CQs, as with rdma-core).
    // SAFETY: a live id of ours; the caller's attr.
    let (verbs, mut local) = unsafe { ((*id).verbs, *attr) };
    if verbs.is_null() {
        return err(libc::EINVAL);
    }
    let a = &mut local;
    let mut own_pd = false;
    let pd = if pd.is_null() {
        // SAFETY: a live id of ours.
        let have = unsafe { (*id).pd };
        if have.is_null() {
            // SAFETY: our context.
            let p = unsafe { crate::pd::ibv_alloc_pd(verbs) };
            if p.is_null() {
                return -1;
            }
            own_pd = true;
            p
        } else {
            have
        }
    } else {
        pd
    };
    // SAFETY: our context and a live id of ours.
    let made = unsafe { fill_id_cqs(verbs, id, (&mut a.send_cq, &mut a.recv_cq), a.cap) };
    // SAFETY: our PD and the local copy of the attributes.
    let qp = made.and_then(|()| made_or_errno(unsafe { crate::qp::ibv_create_qp(pd, a) }));
    let qp = match qp {
        Ok(q) => q,
        Err(e) => {
            // SAFETY: a live id of ours; the PD we made has nothing in it.
            unsafe {
                destroy_id_cqs(id);
                if own_pd {
                    crate::pd::ibv_dealloc_pd(pd);
                }
            }
            return err(e);
        }
    };
    // SAFETY: the caller's attr.
    unsafe { *attr = *a };
    // SAFETY: a live id of ours.
    unsafe {
        (*id).qp = qp;
        (*id).pd = pd;
        (*id).srq = a.srq;
    }
    let r = with_cm(|cm| {
        if let Some(st) = cm.ids.get_mut(&(id as usize)) {
            st.own_pd |= own_pd;
        }
        init_qp(cm, id)
    });
    if let Err(e) = r {
        // SAFETY: the QP we just made, and the id's CQs.
        unsafe {
            crate::qp::ibv_destroy_qp(qp);
            (*id).qp = ptr::null_mut();
            destroy_id_cqs(id);
        }
        return err(e);
    }
    0
}

/// A verb's new object, or the errno it left when it made none.
fn made_or_errno<T>(p: *mut T) -> Result<*mut T, c_int> {
    if p.is_null() {
        Err(errno())
    } else {
        Ok(p)
    }
}

/// rdma_cm makes the CQs (with completion channels) a QP's attributes
/// lack; they are the id's (id->send_cq, id->recv_cq) and go with its QP.
/// Fills them into `cqs` (send, recv).
///
/// # Safety
/// `verbs` is our context and `id` a live id of ours.
unsafe fn fill_id_cqs(
    verbs: *mut ibv_context,
    id: *mut rdma_cm_id,
    cqs: (&mut *mut ibv_cq, &mut *mut ibv_cq),
    cap: ibv_qp_cap,
) -> Result<(), c_int> {
    // SAFETY: as the caller promises.
    unsafe {
        make_id_cq(verbs, id, cqs.0.is_null(), cap.max_send_wr, true)?;
        make_id_cq(verbs, id, cqs.1.is_null(), cap.max_recv_wr, false)?;
        if cqs.0.is_null() {
            *cqs.0 = (*id).send_cq;
        }
        if cqs.1.is_null() {
            *cqs.1 = (*id).recv_cq;
        }
    }
    Ok(())
}

/// Makes one of the id's CQs with its completion channel, if `want`.
///
/// # Safety
/// `verbs` is our context and `id` a live id of ours.
unsafe fn make_id_cq(
    verbs: *mut ibv_context,
    id: *mut rdma_cm_id,
    want: bool,
    depth: u32,
    send: bool,
) -> Result<(), c_int> {
    if !want {
        return Ok(());
    }
    // SAFETY: as the caller promises.
    unsafe {
        let ch = made_or_errno(crate::cq::ibv_create_comp_channel(verbs))?;
        let (cq_slot, ch_slot) = if send {
            (&mut (*id).send_cq, &mut (*id).send_cq_channel)
        } else {
            (&mut (*id).recv_cq, &mut (*id).recv_cq_channel)
        };
        *ch_slot = ch;
        let cq = crate::cq::ibv_create_cq(verbs, depth.max(1) as c_int, id as *mut c_void, ch, 0);
        *cq_slot = made_or_errno(cq)?;
    }
    Ok(())
}

/// Frees the CQs and channels rdma_create_qp made for the id (librdmacm's
/// ucma_destroy_cqs): the id's CQ fields are set only for those.
///
/// # Safety
/// `id` is a live id of ours whose QP is gone.
unsafe fn destroy_id_cqs(id: *mut rdma_cm_id) {
    // SAFETY: as the caller promises.
    unsafe {
        for cq in [&mut (*id).send_cq, &mut (*id).recv_cq] {
            if !cq.is_null() {
                crate::cq::ibv_destroy_cq(*cq);
                *cq = ptr::null_mut();
            }
        }
        for ch in [&mut (*id).send_cq_channel, &mut (*id).recv_cq_channel] {
            if !ch.is_null() {
                crate::cq::ibv_destroy_comp_channel(*ch);
                *ch = ptr::null_mut();
            }
        }
    }
}

/// # Safety
/// `id` is an id; `pd` NULL or a PD; `attr` a QP init attr.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(-1, || create_qp(id, pd, attr))
}

/// # Safety
/// `id` is an id; `attr` an extended QP init attr.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    guard(-1, || {
        if !live_id(id) || attr.is_null() {
            return err(libc::EINVAL);
        }
        // SAFETY: a live id of ours; the caller's attr.
        let (verbs, a) = unsafe { ((*id).verbs, &mut *attr) };
        if verbs.is_null() {
            return err(libc::EINVAL);
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
            // SAFETY: a live id of ours.
            a.pd = unsafe { (*id).pd };
            a.comp_mask |= IBV_QP_INIT_ATTR_PD;
        }
        // SAFETY: our context and a live id of ours.
        let made = unsafe { fill_id_cqs(verbs, id, (&mut a.send_cq, &mut a.recv_cq), a.cap) };
        let qp =
            // SAFETY: our context and the caller's attr.
            made.and_then(|()| made_or_errno(unsafe { crate::qp::create_qp_ex(verbs, attr) }));
        let qp = match qp {
            Ok(q) => q,
            Err(e) => {
                // SAFETY: a live id of ours.
                unsafe { destroy_id_cqs(id) };
                return err(e);
            }
        };
        // SAFETY: a live id of ours.
        unsafe {
            (*id).qp = qp;
            (*id).pd = a.pd;
            (*id).srq = a.srq;
        }
        match with_cm(|cm| init_qp(cm, id)) {
            Ok(()) => 0,
            Err(e) => {
                // SAFETY: the QP we just made, and the id's CQs.
                unsafe {
                    crate::qp::ibv_destroy_qp(qp);
                    (*id).qp = ptr::null_mut();
                    destroy_id_cqs(id);
                }
                err(e)
            }
        }
    })
}

/// # Safety
/// `id` is NULL or an id.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard((), || {
        if !live_id(id) {
            return;
        }
        // SAFETY: a live id of ours, its QP and the CQs made for it.
        unsafe {
            if !(*id).qp.is_null() {
                crate::qp::ibv_destroy_qp((*id).qp);
                (*id).qp = ptr::null_mut();
            }
            destroy_id_cqs(id);
        }
    })
}

/// # Safety
/// `id` is an id; `attr` and `mask` point to what to fill.
#[no_mangle]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    guard(-1, || {
        if !live_id(id) || attr.is_null() || mask.is_null() {
            return err(libc::EINVAL);
        }
        // SAFETY: the caller's attr: its qp_state says which attributes.
        let state = unsafe { (*attr).qp_state };
        match with_cm(|cm| cm.qp_attr(id, state)) {
            Ok((a, m)) => {
                // SAFETY: the caller's out pointers.
                unsafe {
                    *attr = a;
                    *mask = m;
                }
                0
            }
            Err(e) => err(e),
        }
    })
}
