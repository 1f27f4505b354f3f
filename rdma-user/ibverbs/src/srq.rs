//! Shared receive queues: `ibv_create_srq`, `ibv_modify_srq` (the limit
//! event), `ibv_query_srq`, `ibv_post_srq_recv` (`ctx->ops`) and
//! `ibv_destroy_srq`. RC QPs created with `srq` set take their receive
//! WRs from it (see `SrqShared`).

use std::ffi::c_int;
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use rdma_user::device::rings::SrqShared;
use rdma_user::transport::MAX_SGE;

use crate::ffi::*;
use crate::guard;
use crate::verbs::{err_ptr, post_chain, post_errno, with_recv_wr, Live, PDS};

pub(crate) static SRQS: Live = Live::new();

#[repr(C)]
pub(crate) struct Srq {
    srq: ibv_srq,
    pub(crate) shared: Arc<SrqShared>,
    max_wr: u32,
    max_sge: u32,
    /// QPs attached: destroying the SRQ is EBUSY meanwhile.
    pub(crate) users: AtomicU32,
}

impl Srq {
    pub(crate) fn srq_pd(&self) -> *mut ibv_pd {
        self.srq.pd
    }
}

/// The live SRQ behind a program's pointer.
pub(crate) fn srq_of<'a>(p: *mut ibv_srq) -> Option<&'a Srq> {
    SRQS.get::<Srq, _>(p)
}

/// # Safety
/// `pd` is a PD; `attr` points to an `ibv_srq_init_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    guard(ptr::null_mut(), || {
        let Some(p) = PDS.get::<crate::verbs::Pd, _>(pd) else {
            return err_ptr(libc::EINVAL);
        };
        if attr.is_null() {
            return err_ptr(libc::EINVAL);
        }
        // SAFETY: the caller's init attr.
        let a = unsafe { &mut *attr };
        let want = a.attr;
        if want.max_wr == 0 || want.max_wr > 16384 || want.max_sge as usize > MAX_SGE {
            return err_ptr(libc::EINVAL);
        }
        let mut b = Box::new(Srq {
            srq: ibv_srq {
                context: p.context(),
                srq_context: a.srq_context,
                pd,
                ..Default::default()
            },
            shared: Arc::new(SrqShared::new(1, 0)),
            max_wr: want.max_wr,
            max_sge: want.max_sge.max(1),
            users: AtomicU32::new(0),
        });
        // Its address is its token in async events.
        let token = &*b as *const Srq as usize;
        b.shared = Arc::new(SrqShared::new(want.max_wr, token));
        b.shared.set_limit(want.srq_limit);
        a.attr = ibv_srq_attr {
            max_wr: b.max_wr,
            max_sge: b.max_sge,
            srq_limit: want.srq_limit,
        };
        let b = Box::into_raw(b);
        SRQS.add(b);
        b as *mut ibv_srq
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
    let Some(s) = srq_of(srq) else {
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
    let Some(s) = srq_of(srq) else {
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
        SRQS.destroy::<Srq, _>(srq, |s| {
            if s.users.load(Ordering::Acquire) > 0 {
                Err(libc::EBUSY)
            } else {
                Ok(())
            }
        })
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
        let Some(s) = srq_of(srq) else {
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
