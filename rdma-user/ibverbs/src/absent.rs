//! Symbols the Debian perftest binaries link (they are built with
//! BIND_NOW, so each must exist at load time) for features this library
//! does not offer yet. Each says so the rdma-core way: NULL with errno, -1
//! with errno, or an errno value, never success.
//!
//! - libmlx5 / libefa direct verbs: only used on mlx5 / EFA devices, which
//!   ours are not (vendor id 0xffffff): EOPNOTSUPP.
//! - UD multicast (`ibv_attach_mcast`, `ibv_detach_mcast`): EOPNOTSUPP.

use std::ffi::{c_int, c_void};
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
