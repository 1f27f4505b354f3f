//! What is not offered: multicast and enhanced connection establishment
//! (ECE), EOPNOTSUPP; and rsocket's `rpoll`, which is poll(2).

use std::ffi::{c_int, c_void};

use super::abi::*;
use super::state::err;

/// rsocket's poll: there are no rsockets here, so it is poll(2).
///
/// # Safety
/// As poll(2).
#[no_mangle]
pub unsafe extern "C" fn rpoll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout: c_int,
) -> c_int {
    // SAFETY: the caller's poll array, as poll(2) takes it.
    unsafe { libc::poll(fds, nfds, timeout) }
}

/// Multicast is not offered.
#[no_mangle]
pub extern "C" fn rdma_join_multicast(
    _id: *mut rdma_cm_id,
    _addr: *mut c_void,
    _ctx: *mut c_void,
) -> c_int {
    err(libc::EOPNOTSUPP)
}

#[no_mangle]
pub extern "C" fn rdma_join_multicast_ex(
    _id: *mut rdma_cm_id,
    _attr: *mut c_void,
    _ctx: *mut c_void,
) -> c_int {
    err(libc::EOPNOTSUPP)
}

#[no_mangle]
pub extern "C" fn rdma_leave_multicast(_id: *mut rdma_cm_id, _addr: *mut c_void) -> c_int {
    err(libc::EOPNOTSUPP)
}

/// Enhanced connection establishment (ECE) is not offered.
#[no_mangle]
pub extern "C" fn rdma_set_local_ece(_id: *mut rdma_cm_id, _ece: *mut c_void) -> c_int {
    err(libc::EOPNOTSUPP)
}

#[no_mangle]
pub extern "C" fn rdma_get_remote_ece(_id: *mut rdma_cm_id, _ece: *mut c_void) -> c_int {
    err(libc::EOPNOTSUPP)
}

#[no_mangle]
pub extern "C" fn rdma_reject_ece(_id: *mut rdma_cm_id, _data: *const c_void, _len: u8) -> c_int {
    err(libc::EOPNOTSUPP)
}
