//! Shared receive queues: `ibv_create_srq`, `ibv_modify_srq` (the limit
//! event), `ibv_query_srq` and `ibv_destroy_srq` (`ibv_post_srq_recv` is
//! in `post`). RC QPs created with `srq` set take their receive WRs from
//! it (see `SrqShared`).

use std::ffi::c_int;
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use rdma_user::device::rings::SrqShared;
use rdma_user::transport::MAX_SGE;

use crate::ffi::*;
use crate::objects::{open_context, CShared, Srq, PDS, SRQS};
use crate::{err_ptr, guard};

/// The most WRs an SRQ holds (`max_srq_wr`).
pub(crate) const MAX_SRQ_WR: u32 = 16384;

/// # Safety
/// `pd` is a PD; `attr` points to an `ibv_srq_init_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    guard(ptr::null_mut(), || {
        let Some(p) = PDS.get(pd) else {
            return err_ptr(libc::EINVAL);
        };
        if attr.is_null() {
            return err_ptr(libc::EINVAL);
        }
        // SAFETY: the caller's init attr, copied (what is granted is
        // written back below).
        let a = unsafe { attr.read() };
        let want = a.attr;
        if want.max_wr == 0 || want.max_wr > MAX_SRQ_WR || want.max_sge as usize > MAX_SGE {
            return err_ptr(libc::EINVAL);
        }
        let Some(ctx) = open_context(p.context()) else {
            return err_ptr(libc::EINVAL);
        };
        // Its address is its token in async events.
        let s = Arc::new_cyclic(|me| Srq {
            srq: CShared::new(ibv_srq {
                context: p.context(),
                srq_context: a.srq_context,
                pd,
                ..Default::default()
            }),
            pd: pd as usize,
            shared: Arc::new(SrqShared::new(want.max_wr, me.as_ptr() as usize)),
            max_wr: want.max_wr,
            max_sge: want.max_sge.max(1),
            users: AtomicU32::new(0),
            ctx,
        });
        s.shared.set_limit(want.srq_limit);
        // SAFETY: the caller's init attr (its in/out field).
        unsafe {
            (*attr).attr = ibv_srq_attr {
                max_wr: s.max_wr,
                max_sge: s.max_sge,
                srq_limit: want.srq_limit,
            }
        };
        SRQS.add(s).cast()
    })
}

/// Only the limit can change (`IBV_SRQ_MAX_WR`, a resize, is
/// EOPNOTSUPP); a limit beyond the depth is EINVAL.
///
/// # Safety
/// `srq` is an SRQ; `attr` points to an `ibv_srq_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    let Some(s) = SRQS.get(srq) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller's attr.
    let a = unsafe { &*attr };
    let mask = mask as u32;
    if mask & !(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) != 0 {
        return libc::EINVAL;
    }
    if mask & IBV_SRQ_MAX_WR != 0 {
        return libc::EOPNOTSUPP;
    }
    if mask & IBV_SRQ_LIMIT != 0 {
        if a.srq_limit > s.max_wr {
            return libc::EINVAL;
        }
        s.shared.set_limit(a.srq_limit);
    }
    0
}

/// # Safety
/// `srq` is an SRQ; `attr` points to an `ibv_srq_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    let Some(s) = SRQS.get(srq) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller's attr.
    unsafe {
        attr.write(ibv_srq_attr {
            max_wr: s.max_wr,
            max_sge: s.max_sge,
            srq_limit: s.shared.limit(),
        })
    };
    0
}

/// EBUSY while a QP uses it, as the kernel answers.
///
/// # Safety
/// `srq` is an SRQ.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    guard(libc::EIO, || {
        SRQS.destroy(srq, libc::EINVAL, |s| {
            if s.users.load(Ordering::Acquire) > 0 {
                Err(libc::EBUSY)
            } else {
                Ok(())
            }
        })
        .err()
        .unwrap_or(0)
    })
}
