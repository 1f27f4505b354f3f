//! A drop-in `libibverbs.so.1`: rdma-core's C ABI (struct layouts of
//! rdma-core 44, its symbol versions from `libibverbs.map`) over the
//! rdma-xdp stack, so that unmodified verbs programs run on it.
//!
//! This part: devices. `ibv_get_device_list` lists one device per link of
//! the network namespace (`rdma-xdp link add`, or the default of
//! `control::links`); a context answers the device, port and GID queries
//! as rxe does on the same interface.
//!
//! Every exported function checks its pointers for NULL and returns what
//! rdma-core returns for bad arguments (NULL with errno, or an errno
//! value); nothing here panics across the C boundary (`guard`).

mod absent;
mod ah;
mod device;
mod events;
pub mod ffi;
pub mod rdmacm;
mod srq;
mod verbs;
mod wr;

pub use device::*;

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Sets errno.
pub(crate) fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// This thread's errno (what a failed verb of ours left there).
pub(crate) fn errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Runs `f`, turning a panic into `on_panic` (with errno EIO): a Rust panic
/// must not unwind into C.
pub(crate) fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            set_errno(libc::EIO);
            on_panic
        }
    }
}
