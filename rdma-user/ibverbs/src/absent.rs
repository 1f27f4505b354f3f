//! Symbols the Debian perftest binaries link (they are built with
//! BIND_NOW, so each must exist at load time) for features this library
//! does not offer yet. Each says so the rdma-core way: NULL with errno, -1
//! with errno, or an errno value, never success.
//!
//! - libmlx5 / libefa direct verbs: only used on mlx5 / EFA devices, which
//!   ours are not (vendor id 0xffffff): EOPNOTSUPP.
//! - librdmacm (`-R`): RDMA CM is its own issue: ENOSYS until it lands.
//! - UD multicast (`ibv_attach_mcast`, `ibv_detach_mcast`): EOPNOTSUPP.

use std::ffi::{c_char, c_int, c_void};
use std::ptr;

use crate::set_errno;

/// `fn(...) -> *mut c_void` returning NULL with `errno`.
macro_rules! null_with_errno {
    ($errno:expr => $($name:ident),* $(,)?) => {$(
        /// Not offered (see the module docs): NULL with errno.
        #[no_mangle]
        pub extern "C" fn $name() -> *mut c_void {
            set_errno($errno);
            ptr::null_mut()
        }
    )*};
}

/// `fn(...) -> int` returning -1 with `errno` (librdmacm's convention).
macro_rules! minus_one_with_errno {
    ($errno:expr => $($name:ident),* $(,)?) => {$(
        /// Not offered (see the module docs): -1 with errno.
        #[no_mangle]
        pub extern "C" fn $name() -> c_int {
            set_errno($errno);
            -1
        }
    )*};
}

/// `fn(...) -> int` returning the errno itself (libibverbs' and the
/// direct-verbs convention).
macro_rules! errno_value {
    ($errno:expr => $($name:ident),* $(,)?) => {$(
        /// Not offered (see the module docs): the errno value.
        #[no_mangle]
        pub extern "C" fn $name() -> c_int {
            $errno
        }
    )*};
}

null_with_errno!(libc::EOPNOTSUPP =>
    mlx5dv_create_mkey, mlx5dv_qp_ex_from_ibv_qp_ex,
    mlx5dv_dek_create, mlx5dv_create_qp, mlx5dv_open_device, efadv_create_qp_ex,
);
errno_value!(libc::EOPNOTSUPP =>
    mlx5dv_destroy_mkey, mlx5dv_crypto_login, mlx5dv_dek_destroy, mlx5dv_devx_general_cmd,
    efadv_query_device, ibv_attach_mcast, ibv_detach_mcast,
);
null_with_errno!(libc::ENOSYS => rdma_create_event_channel);
minus_one_with_errno!(libc::ENOSYS =>
    rdma_accept, rdma_ack_cm_event, rdma_bind_addr, rdma_connect, rdma_create_id,
    rdma_create_qp, rdma_create_qp_ex, rdma_destroy_id, rdma_disconnect, rdma_get_cm_event,
    rdma_getaddrinfo, rdma_listen, rdma_reject, rdma_resolve_addr, rdma_resolve_route,
    rdma_set_option,
);

/// librdmacm's `rdma_destroy_event_channel` and `rdma_destroy_qp` return
/// nothing; with nothing created there is nothing to do.
#[no_mangle]
pub extern "C" fn rdma_destroy_event_channel(_channel: *mut c_void) {}

#[no_mangle]
pub extern "C" fn rdma_destroy_qp(_id: *mut c_void) {}

#[no_mangle]
pub extern "C" fn rdma_freeaddrinfo(_res: *mut c_void) {}

#[no_mangle]
pub extern "C" fn rdma_event_str(_event: c_int) -> *const c_char {
    c"UNKNOWN EVENT".as_ptr()
}
