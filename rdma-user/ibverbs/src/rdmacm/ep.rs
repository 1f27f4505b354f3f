//! Endpoints, librdmacm's synchronous helpers (`rdma_create_ep`,
//! `rdma_destroy_ep`, `rdma_get_request`), and the device list
//! (`rdma_get_devices`, `rdma_free_devices`).

use std::ffi::c_int;
use std::ptr;

use super::abi::*;
use super::channel::{channel, take};
use super::connect::rdma_reject;
use super::id::{destroy_id_inner, rdma_create_id};
use super::qp::{create_qp, rdma_destroy_qp};
use super::resolve::{rdma_bind_addr, rdma_resolve_addr, rdma_resolve_route};
use super::service::with_cm;
use super::state::{devices_with_addrs, err, live_id};
use crate::ffi::*;
use crate::guard;

/// # Safety
/// `listen` is a synchronous listening id; `id` points to a pointer.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    guard(-1, || {
        if !live_id(listen) || id.is_null() {
            return err(libc::EINVAL);
        }
        // SAFETY: a live id of ours.
        let Some(c) = channel(unsafe { (*listen).channel }) else {
            return err(libc::EINVAL);
        };
        loop {
            let e = match take(&c) {
                // SAFETY: the event just taken, freed once here.
                Ok(e) => unsafe { Box::from_raw(e) },
                Err(e) => return err(e),
            };
            if e.ev.event != RDMA_CM_EVENT_CONNECT_REQUEST {
                continue;
            }
            let child = e.ev.id;
            let ep = with_cm(|cm| cm.ids.get(&(child as usize)).and_then(|s| s.ep_init));
            if let Some((mut init, pd)) = ep {
                if create_qp(child, pd, &mut init) != 0 {
                    // SAFETY: the id just handed to us.
                    unsafe { rdma_reject(child, ptr::null(), 0) };
                    destroy_id_inner(child);
                    return -1;
                }
            }
            // SAFETY: the caller's out pointer.
            unsafe { *id = child };
            return 0;
        }
    })
}

/// # Safety
/// `id` points to a pointer; `res` is address info; `pd` and `attr` may
/// be NULL.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(-1, || {
        if id.is_null() || res.is_null() {
            return err(libc::EINVAL);
        }
        // SAFETY: the caller's address info.
        let r = unsafe { &*res };
        let mut new = ptr::null_mut();
        // SAFETY: a synchronous id (no channel).
        if unsafe { rdma_create_id(ptr::null_mut(), &mut new, ptr::null_mut(), r.ai_port_space) }
            != 0
        {
            return -1;
        }
        if !attr.is_null() {
            // rdma_create_ep takes the QP type from the address info.
            // SAFETY: the caller's attr.
            unsafe { (*attr).qp_type = r.ai_qp_type as u32 };
        }
        let fail = |new| {
            destroy_id_inner(new);
            -1
        };
        if r.ai_flags & RAI_PASSIVE != 0 {
            // SAFETY: a live id and the caller's address.
            if unsafe { rdma_bind_addr(new, r.ai_src_addr) } != 0 {
                return fail(new);
            }
            if !attr.is_null() {
                // SAFETY: the caller's attr, kept for each request.
                let init = unsafe { *attr };
                with_cm(|cm| cm.ids.get_mut(&(new as usize)).unwrap().ep_init = Some((init, pd)));
            }
        } else {
            // SAFETY: a live id and the caller's addresses.
            unsafe {
                if rdma_resolve_addr(new, r.ai_src_addr, r.ai_dst_addr, 2000) != 0
                    || rdma_resolve_route(new, 2000) != 0
                {
                    return fail(new);
                }
            }
            if !attr.is_null() && create_qp(new, pd, attr) != 0 {
                return fail(new);
            }
        }
        // SAFETY: the caller's out pointer.
        unsafe { *id = new };
        0
    })
}

/// # Safety
/// `id` is an id from `rdma_create_ep` (or any id).
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    guard((), || {
        if !live_id(id) {
            return;
        }
        let own_pd = with_cm(|cm| cm.ids[&(id as usize)].own_pd);
        // SAFETY: a live id of ours and what it owns (rdma_destroy_qp
        // frees the CQs made for it).
        unsafe {
            rdma_destroy_qp(id);
            if own_pd && !(*id).pd.is_null() {
                crate::pd::ibv_dealloc_pd((*id).pd);
            }
        }
        destroy_id_inner(id);
    })
}

/// # Safety
/// `num` is NULL or points to an int.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    guard(ptr::null_mut(), || {
        let ctxs: Vec<*mut ibv_context> = with_cm(|cm| {
            devices_with_addrs()
                .into_iter()
                .filter_map(|(nd, _)| cm.dev(&nd).ok().map(|d| cm.devs[d].ctx))
                .collect()
        });
        crate::device::null_terminated(ctxs, num)
    })
}

/// # Safety
/// `list` is NULL or from `rdma_get_devices`.
#[no_mangle]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: the caller's list from rdma_get_devices.
    unsafe { crate::device::free_null_terminated(list) }
}
