//! Protection domains and memory regions: `ibv_alloc_pd`,
//! `ibv_dealloc_pd`, `ibv_reg_mr` (and `ibv_reg_mr_iova2`, what the
//! `ibv_reg_mr` macro becomes) and `ibv_dereg_mr`.

use std::ffi::{c_int, c_uint, c_void};
use std::ptr;
use std::sync::{Arc, Mutex};

use rdma_user::memory::Access;

use crate::ffi::*;
use crate::objects::{open_context, CShared, Mr, Pd, MRS, PDS};
use crate::{err_ptr, guard};

/// # Safety
/// `context` is a context pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    guard(ptr::null_mut(), || {
        let Some(ctx) = open_context(context) else {
            return err_ptr(libc::EINVAL);
        };
        let dp = match ctx.data_path() {
            Ok(d) => d,
            Err(e) => return err_ptr(e),
        };
        match dp.alloc_pd() {
            Ok(inner) => PDS
                .add(Arc::new(Pd {
                    pd: CShared::new(ibv_pd { context, handle: 0 }),
                    inner,
                    ctx,
                }))
                .cast(),
            Err(e) => err_ptr(e.errno()),
        }
    })
}

/// # Safety
/// `pd` is a PD pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    guard(libc::EIO, || {
        PDS.destroy(pd, libc::EINVAL, |_| Ok(())).err().unwrap_or(0)
    })
}

fn access_of(flags: c_int) -> Result<Access, c_int> {
    let known = IBV_ACCESS_LOCAL_WRITE
        | IBV_ACCESS_REMOTE_WRITE
        | IBV_ACCESS_REMOTE_READ
        | IBV_ACCESS_REMOTE_ATOMIC;
    let f = flags as u32;
    // Remote write or atomic access needs local write (IBA 10.6.3.1).
    if f & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) != 0
        && f & IBV_ACCESS_LOCAL_WRITE == 0
    {
        return Err(libc::EINVAL);
    }
    // Optional flags (relaxed ordering and above) may be ignored.
    if f & !known & (IBV_ACCESS_OPTIONAL_FIRST - 1) != 0 {
        return Err(libc::EINVAL);
    }
    Ok(Access(f & known))
}

/// `ibv_reg_mr`, also what the `ibv_reg_mr` macro becomes
/// (`ibv_reg_mr_iova2` with iova = addr).
///
/// # Safety
/// `pd` is a PD; `addr..addr+length` is the caller's memory.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: same contract.
    unsafe { ibv_reg_mr_iova2(pd, addr, length, addr as u64, access as c_uint) }
}

/// # Safety
/// As `ibv_reg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    guard(ptr::null_mut(), || {
        let Some(p) = PDS.get(pd) else {
            return err_ptr(libc::EINVAL);
        };
        if addr.is_null() || length == 0 {
            return err_ptr(libc::EINVAL);
        }
        if iova.checked_add(length as u64).is_none() {
            return err_ptr(libc::EINVAL);
        }
        let acc = match access_of(access as c_int) {
            Ok(a) => a,
            Err(e) => return err_ptr(e),
        };
        let Some(ctx) = open_context(p.context()) else {
            return err_ptr(libc::EINVAL);
        };
        // SAFETY: ibv_reg_mr's contract: the memory stays the caller's and
        // mapped until ibv_dereg_mr, which deregisters it first.
        match unsafe { p.inner.reg_mr_raw(addr as *mut u8, length, iova, acc) } {
            Ok(m) => MRS
                .add(Arc::new(Mr {
                    mr: CShared::new(ibv_mr {
                        context: p.context(),
                        pd,
                        addr,
                        length,
                        handle: m.lkey,
                        lkey: m.lkey,
                        rkey: m.rkey,
                    }),
                    inner: Mutex::new(Some(m)),
                    ctx,
                }))
                .cast(),
            Err(e) => err_ptr(e.errno()),
        }
    })
}

/// Returns once the data path has dropped the region (the deregistration
/// runs under its lock, between two turns: no packet can touch it after).
///
/// # Safety
/// `mr` is an MR pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    guard(libc::EIO, || {
        MRS.destroy(mr, libc::EINVAL, |m| {
            let inner = m.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
            inner.map_or(Ok(()), |i| i.dereg().map_err(|e| e.errno()))
        })
        .err()
        .unwrap_or(0)
    })
}
