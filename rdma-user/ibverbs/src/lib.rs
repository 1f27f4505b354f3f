//! A drop-in `libibverbs.so.1`: rdma-core's C ABI (struct layouts of
//! rdma-core 44, its symbol versions from `libibverbs.map`) over the
//! rdma-xdp stack, so that unmodified verbs programs run on it.
//!
//! `ibv_get_device_list` lists one device per link of the network
//! namespace (`rdma-xdp link add`, or the default of `control::links`); a
//! context answers the device, port and GID queries as rxe does on the
//! same interface, and its objects run on the data path of that interface
//! (`rdma_user::verbs`).
//!
//! Every exported function checks its pointers for NULL and returns what
//! rdma-core returns for bad arguments (NULL with errno, or an errno
//! value); nothing here panics across the C boundary (`guard`).
//!
//! # Layers
//!
//! Modules import only modules of a lower rank (`tests/layering.rs` in
//! `rdma-user` checks it), so there is no import cycle:
//!
//! | rank | modules | what |
//! |------|---------|------|
//! | 0 | `ffi`, this file's helpers | rdma-core's structs (generated); errno, `guard` |
//! | 1 | `absent`, `port` | symbols not offered; a device's port: attributes, GIDs, paths, link monitor |
//! | 2 | `objects` | the objects' structs, their tables and lifetimes |
//! | 3 | `pd`, `cq`, `srq`, `ah`, `post`, `events` | PDs and MRs; CQs and channels; SRQs; AHs; posting; async events |
//! | 4 | `wr` | the `ibv_wr_*` calls (post through `post`) |
//! | 5 | `qp` | QPs (an extended QP gets `wr`'s calls) |
//! | 6 | `device` | the device list, open (which fills `ctx->ops` from `cq`, `post`, `qp`), close, queries |
//! | 7 | `rdmacm` | the drop-in `librdmacm.so.1` |

mod absent;
mod ah;
mod cq;
mod device;
mod events;
pub mod ffi;
mod objects;
mod pd;
mod port;
mod post;
mod qp;
pub mod rdmacm;
mod srq;
mod wr;

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

/// NULL with errno `e` (how rdma-core's calls that return objects fail).
pub(crate) fn err_ptr<T>(e: i32) -> *mut T {
    set_errno(e);
    std::ptr::null_mut()
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
