//! Devices and contexts: the device list, `ibv_open_device` and
//! `ibv_close_device`, and the device, port and GID queries, answered as
//! rxe answers them for the same interface (transport InfiniBand, link
//! layer Ethernet, RoCE v2 GIDs).

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::mem::{offset_of, size_of};
use std::os::unix::ffi::OsStrExt;
use std::ptr;
use std::sync::{Arc, Mutex};

use rdma_user::control::ibdev;
use rdma_user::control::links::{self, Link};
use rdma_user::device::rings::AsyncShared;
use rdma_user::io::hostnet::iface_mac;
use rdma_user::transport::MAX_SGE;

use crate::ffi::*;
use crate::objects::{our_context, CShared, Context, Device, NotClosed, Users, CONTEXTS, DEVICES};
use crate::port::{gid_table, port_attr, PortMonitor, GID_TBL_LEN};
use crate::{guard, set_errno};

/// rxe's vendor id: perftest takes its generic (non-mlx5, non-EFA) path.
pub(crate) const VENDOR_ID: u32 = 0xff_ffff;

fn copy_cstr(dst: &mut [c_char], s: &str) {
    let room = dst.len() - 1;
    for (d, b) in dst.iter_mut().zip(s.bytes().take(room)) {
        *d = b as c_char;
    }
}

/// The device of `link`, the `index`-th of the list: the one made for it
/// before, or a new one.
fn device_for(link: &Link, index: usize) -> &'static Device {
    let mut devs = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = devs.iter().find(|d| d.link == *link) {
        return d;
    }
    let mut dev = Device {
        dev: ibv_device::default(),
        link: link.clone(),
    };
    dev.dev.node_type = IBV_NODE_CA;
    dev.dev.transport_type = IBV_TRANSPORT_IB;
    copy_cstr(&mut dev.dev.name, &link.name);
    // The names of the kernel's uverbs device and its sysfs directory,
    // which `rdma-xdp exec` shows (control::ibdev).
    let uverbs = ibdev::uverbs_name(index);
    copy_cstr(&mut dev.dev.dev_name, &uverbs);
    copy_cstr(
        &mut dev.dev.dev_path,
        &format!("/sys/class/infiniband_verbs/{uverbs}"),
    );
    copy_cstr(
        &mut dev.dev.ibdev_path,
        &format!("/sys/class/infiniband/{}", link.name),
    );
    let d: &'static Device = Box::leak(Box::new(dev));
    devs.push(d);
    d
}

/// # Safety
/// `num` is NULL or points to an int.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    guard(ptr::null_mut(), || {
        let links = match links::effective() {
            Ok(l) => l,
            Err(_) => {
                set_errno(libc::EIO);
                return ptr::null_mut();
            }
        };
        let list: Vec<*mut ibv_device> = links
            .iter()
            .enumerate()
            .map(|(i, l)| device_for(l, i) as *const Device as *mut ibv_device)
            .collect();
        null_terminated(list, num)
    })
}

/// A NULL-terminated array the program frees with `free_null_terminated`
/// (device and context lists); its length, without the NULL, into `num`.
pub(crate) fn null_terminated<T>(mut list: Vec<*mut T>, num: *mut c_int) -> *mut *mut T {
    if !num.is_null() {
        // SAFETY: the caller passes NULL or a valid int.
        unsafe { *num = list.len() as c_int };
    }
    list.push(ptr::null_mut());
    Box::into_raw(list.into_boxed_slice()) as *mut *mut T
}

/// Frees what `null_terminated` made.
///
/// # Safety
/// `list` is NULL or from `null_terminated`, freed once.
pub(crate) unsafe fn free_null_terminated<T>(list: *mut *mut T) {
    if list.is_null() {
        return;
    }
    let mut n = 0;
    // SAFETY: the list is NULL-terminated (we built it so).
    while !unsafe { *list.add(n) }.is_null() {
        n += 1;
    }
    // SAFETY: it was a boxed slice of n+1 pointers.
    drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(list, n + 1)) });
}

/// # Safety
/// `list` came from `ibv_get_device_list` and is freed once.
#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: the caller's list from ibv_get_device_list.
    unsafe { free_null_terminated(list) }
}

/// Our device behind a program's pointer, if it is one of ours.
fn our_device(d: *mut ibv_device) -> Option<&'static Device> {
    let devs = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    devs.iter()
        .find(|x| ptr::eq(**x as *const Device, d as *const Device))
        .copied()
}

/// # Safety
/// `device` is NULL or a device pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    match our_device(device) {
        Some(d) => d.dev.name.as_ptr(),
        None => {
            set_errno(libc::EINVAL);
            ptr::null()
        }
    }
}

/// # Safety
/// `device` is NULL or a device pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> __be64 {
    let Some(d) = our_device(device) else {
        set_errno(libc::EINVAL);
        return 0;
    };
    u64::from_ne_bytes(ibdev::node_guid(&d.link.netdev))
}

/// The network interface behind one of our devices.
pub(crate) fn netdev_of(device: *mut ibv_device) -> Option<String> {
    our_device(device).map(|d| d.link.netdev.clone())
}

/// # Safety
/// `device` is NULL or a device pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    guard(ptr::null_mut(), || {
        let Some(dev) = our_device(device) else {
            set_errno(libc::EINVAL);
            return ptr::null_mut();
        };
        if iface_mac(&dev.link.netdev).is_err() {
            set_errno(libc::ENODEV);
            return ptr::null_mut();
        }
        let events = match AsyncShared::new() {
            Ok(e) => Arc::new(e),
            Err(e) => {
                set_errno(e.raw_os_error().unwrap_or(libc::ENOMEM));
                return ptr::null_mut();
            }
        };
        let mut vctx = verbs_context {
            sz: size_of::<verbs_context>(),
            query_port: Some(query_port_ex),
            create_qp_ex: Some(crate::qp::create_qp_ex),
            ..Default::default()
        };
        let ctx = &mut vctx.context;
        set_ops(&mut ctx.ops);
        ctx.device = device;
        ctx.cmd_fd = -1;
        ctx.async_fd = events.fd();
        ctx.num_comp_vectors = 1;
        // verbs_get_ctx() takes the extended layout only with this marker.
        ctx.abi_compat = usize::MAX as *mut c_void;
        let c = Arc::new(Context {
            vctx: CShared::new(vctx),
            dev,
            dp: Mutex::new(None),
            qps: Users::new(),
            monitor: Mutex::new(PortMonitor::start(&dev.link.netdev, events.clone())),
            events,
        });
        let ibv = c.ibv();
        CONTEXTS.add(c);
        ibv
    })
}

/// Fills a new context's ops table: the data-path calls programs make
/// inline.
fn set_ops(ops: &mut ibv_context_ops) {
    ops.poll_cq = Some(crate::cq::poll_cq);
    ops.req_notify_cq = Some(crate::cq::req_notify_cq);
    ops.post_send = Some(crate::post::post_send);
    ops.post_recv = Some(crate::post::post_recv);
    ops.post_srq_recv = Some(crate::post::post_srq_recv);
}

/// Closes a context: EBUSY (also in errno) while a QP made on it is live,
/// and then nothing changes (the program can destroy its QPs and close
/// again). Without QPs it closes: no object can be made on it any more,
/// its port monitor stops, and so does its data path once no object
/// still uses it; objects left on it (perftest's `ib_send_bw` client
/// never destroys its receive CQ) keep its memory and can still be
/// destroyed.
///
/// rdma-core's `ibv_close_device` always returns 0: rxe's `free_context`
/// closes the command fd (the kernel then destroys every object of the
/// context) and frees the context, which the program's objects still
/// point to, so a later call on one (`ibv_modify_qp`, `ibv_destroy_qp`)
/// reads freed memory.
///
/// # Safety
/// `context` is NULL or a context pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    guard(libc::EIO, || {
        let Some(c) = our_context(context) else {
            return libc::EINVAL;
        };
        match c.qps.close() {
            Ok(()) => {}
            Err(NotClosed::Busy(_)) => {
                set_errno(libc::EBUSY);
                return libc::EBUSY;
            }
            // Another thread closed it meanwhile.
            Err(NotClosed::Closed) => return libc::EINVAL,
        }
        // The context's own handle on its data path and the port monitor
        // go now; its memory with the last reference (the table's, an
        // object's, or that of a call of another thread).
        drop(c.dp.lock().unwrap_or_else(|e| e.into_inner()).take());
        drop(c.monitor.lock().unwrap_or_else(|e| e.into_inner()).take());
        drop(CONTEXTS.remove(Arc::as_ptr(&c)));
        0
    })
}

/// # Safety
/// `context` is a context; `attr` points to an `ibv_device_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(
    context: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    let Some(c) = our_context(context) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return libc::EINVAL;
    }
    let mut a = ibv_device_attr::default();
    copy_cstr(&mut a.fw_ver, env!("CARGO_PKG_VERSION"));
    let guid = ibdev::node_guid(c.netdev());
    a.node_guid = u64::from_ne_bytes(guid);
    a.sys_image_guid = a.node_guid;
    // What the data path enforces (device::datapath::Limits), not more.
    let limits = rdma_user::device::datapath::Limits::default();
    a.max_mr_size = limits.max_mr_len as u64;
    a.page_size_cap = 0xffff_f000;
    a.vendor_id = VENDOR_ID;
    a.max_qp = limits.max_qp as c_int;
    a.max_qp_wr = 16384;
    a.device_cap_flags = IBV_DEVICE_BAD_PKEY_CNTR
        | IBV_DEVICE_BAD_QKEY_CNTR
        | IBV_DEVICE_RC_RNR_NAK_GEN
        | IBV_DEVICE_PORT_ACTIVE_EVENT
        | IBV_DEVICE_SYS_IMAGE_GUID;
    // What ibv_create_qp and ibv_post_* accept (engines size their WRs
    // from these).
    a.max_sge = MAX_SGE as c_int;
    a.max_sge_rd = MAX_SGE as c_int;
    // SRQs: no count of their own beyond memory; one per QP is the most a
    // program can use.
    a.max_srq = limits.max_qp as c_int;
    a.max_srq_wr = crate::srq::MAX_SRQ_WR as c_int;
    a.max_srq_sge = MAX_SGE as c_int;
    a.max_cq = limits.max_cq as c_int;
    a.max_cqe = crate::cq::MAX_CQE;
    a.max_mr = limits.max_mr as c_int;
    a.max_pd = 0x7ff0;
    // The engine's limit: perftest's READ and atomic tests ask for it.
    a.max_qp_rd_atom = rdma_user::transport::MAX_RD_ATOMIC as c_int;
    a.max_res_rd_atom = a.max_qp_rd_atom * a.max_qp;
    a.max_qp_init_rd_atom = a.max_qp_rd_atom;
    a.atomic_cap = IBV_ATOMIC_HCA;
    a.max_ah = limits.max_ah as c_int;
    a.max_pkeys = 1;
    a.local_ca_ack_delay = 15;
    a.phys_port_cnt = 1;
    // SAFETY: the caller's struct is an ibv_device_attr (this symbol's ABI).
    unsafe { attr.write(a) };
    0
}

/// `verbs_context.query_port`: writes no more than the caller's size.
unsafe extern "C" fn query_port_ex(
    context: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    let Some(c) = our_context(context) else {
        return libc::EINVAL;
    };
    if port != 1 {
        return libc::EINVAL;
    }
    if attr.is_null() {
        return libc::EINVAL;
    }
    let a = port_attr(c.netdev());
    let n = len.min(size_of::<ibv_port_attr>());
    // SAFETY: the caller's buffer holds `len` bytes; we copy at most that.
    unsafe {
        ptr::copy_nonoverlapping(&a as *const ibv_port_attr as *const u8, attr as *mut u8, n)
    };
    0
}

/// rdma-core 1.1's `ibv_query_port`: the old struct, which ends at
/// `link_layer` plus a reserved byte.
///
/// # Safety
/// `context` is a context; `attr` points to the old `ibv_port_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    context: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: forwarded with the compat size.
    unsafe { query_port_ex(context, port, attr, offset_of!(ibv_port_attr, flags) + 1) }
}

fn gid_at(context: *mut ibv_context, port: u8, index: c_int) -> Result<Option<[u8; 16]>, c_int> {
    let c = our_context(context).ok_or(libc::EINVAL)?;
    if port != 1 || !(0..GID_TBL_LEN).contains(&index) {
        return Err(libc::EINVAL);
    }
    Ok(gid_table(c.netdev()).get(index as usize).copied())
}

/// # Safety
/// `context` is a context; `gid` points to a GID.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    if gid.is_null() {
        return -1;
    }
    match gid_at(context, port, index) {
        Ok(g) => {
            // SAFETY: the caller's GID; a zero GID where the entry is empty
            // (as rdma-core reads an empty sysfs entry).
            unsafe { (*gid).raw = g.unwrap_or([0; 16]) };
            0
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// rdma-core's private `ibv_query_gid_type` (ibv_devinfo uses it): every
/// GID is RoCE v2 (`IBV_GID_TYPE_SYSFS_ROCE_V2` = 1).
///
/// # Safety
/// `context` is a context; `ty` points to an int.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    context: *mut ibv_context,
    port: u8,
    index: c_uint,
    ty: *mut c_int,
) -> c_int {
    if ty.is_null() {
        return libc::EINVAL;
    }
    match gid_at(context, port, index as c_int) {
        Ok(_) => {
            // SAFETY: the caller's int.
            unsafe { *ty = 1 };
            0
        }
        Err(e) => e,
    }
}

/// Port 1's valid GID entries, in table order (one read of the
/// interface's addresses and ifindex for all of them).
fn gid_entries(c: &Context) -> Vec<ibv_gid_entry> {
    let ifindex = std::fs::read_to_string(format!("/sys/class/net/{}/ifindex", c.netdev()))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    gid_table(c.netdev())
        .into_iter()
        .take(GID_TBL_LEN as usize)
        .zip(0u32..)
        .map(|(g, index)| ibv_gid_entry {
            gid: ibv_gid { raw: g },
            gid_index: index,
            port_num: 1,
            gid_type: IBV_GID_TYPE_ROCE_V2,
            ndev_ifindex: ifindex,
        })
        .collect()
}

/// `ibv_query_gid_ex`: ENODATA for an empty entry, as rdma-core.
///
/// # Safety
/// `context` is a context; `entry` points to `entry_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    if entry.is_null() || flags != 0 || entry_size < size_of::<ibv_gid_entry>() {
        return libc::EINVAL;
    }
    let Some(c) = our_context(context) else {
        return libc::EINVAL;
    };
    if port != 1 || index >= GID_TBL_LEN as u32 {
        return libc::EINVAL;
    }
    match gid_entries(&c).get(index as usize) {
        Some(&e) => {
            // SAFETY: the caller's entry is at least this big (checked).
            unsafe { entry.write(e) };
            0
        }
        None => libc::ENODATA,
    }
}

/// `ibv_query_gid_table`: every valid GID of every port, `entry_size`
/// bytes apart; their number, or a negative errno (EINVAL for bad
/// arguments or too small an array, as rdma-core).
///
/// # Safety
/// `context` is a context; `entries` holds `max_entries` entries of
/// `entry_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    if entries.is_null() || flags != 0 || entry_size < size_of::<ibv_gid_entry>() {
        return -(libc::EINVAL as isize);
    }
    let Some(c) = our_context(context) else {
        return -(libc::EINVAL as isize);
    };
    let table = gid_entries(&c);
    if table.len() > max_entries {
        return -(libc::EINVAL as isize);
    }
    for (i, e) in table.iter().enumerate() {
        // SAFETY: entry i lies within the caller's array (i < max_entries,
        // each entry_size bytes); written unaligned since entry_size may
        // exceed our struct's size.
        unsafe {
            entries
                .cast::<u8>()
                .add(i * entry_size)
                .cast::<ibv_gid_entry>()
                .write_unaligned(*e)
        };
    }
    table.len() as isize
}

/// Where sysfs is: `$SYSFS_PATH` without its trailing slashes, or `/sys`
/// (rdma-core's rule; the variable is ignored in a setuid program).
#[no_mangle]
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    static PATH: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        // SAFETY: getuid/geteuid have no preconditions.
        let setuid = unsafe { libc::getuid() != libc::geteuid() };
        let p = std::env::var("SYSFS_PATH")
            .ok()
            .filter(|_| !setuid)
            .map(|p| p.trim_end_matches('/').to_string())
            .filter(|p| !p.is_empty() && !p.contains('\0'))
            .unwrap_or_else(|| "/sys".into());
        std::ffi::CString::new(p).unwrap_or_default()
    })
    .as_ptr()
}

/// Reads `dir/file` into `buf` as rdma-core does: at most `size` bytes,
/// the trailing newline replaced by a NUL; the length read, or -1 with
/// errno. (Under `rdma-xdp exec` the files of our devices exist.)
///
/// # Safety
/// `dir` and `file` are C strings; `buf` holds `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller's C strings.
    let (d, f) = unsafe {
        (
            std::ffi::CStr::from_ptr(dir),
            std::ffi::CStr::from_ptr(file),
        )
    };
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(d.to_bytes()))
        .join(std::ffi::OsStr::from_bytes(f.to_bytes()));
    let data = match std::fs::read(&path) {
        Ok(d) => d,
        Err(e) => {
            set_errno(e.raw_os_error().unwrap_or(libc::EIO));
            return -1;
        }
    };
    let n = data.len().min(size);
    // SAFETY: `buf` holds `size` bytes and n <= size.
    let out = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), size) };
    out[..n].copy_from_slice(&data[..n]);
    if n < size {
        out[n] = 0;
    }
    if n > 0 && out[n - 1] == b'\n' {
        out[n - 1] = 0;
    }
    n as c_int
}

/// The P_Key table: one entry, the default full-member P_Key 0xffff.
///
/// # Safety
/// `context` is a context; `pkey` points to a `__be16`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    context: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    if our_context(context).is_none() || port != 1 || index != 0 || pkey.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller's __be16.
    unsafe { *pkey = 0xffffu16.to_be() };
    0
}

/// rdma-core's node type names.
#[no_mangle]
pub extern "C" fn ibv_node_type_str(t: ibv_node_type) -> *const c_char {
    let s: &'static [u8] = match t {
        IBV_NODE_CA => b"InfiniBand channel adapter\0",
        IBV_NODE_SWITCH => b"InfiniBand switch\0",
        IBV_NODE_ROUTER => b"InfiniBand router\0",
        IBV_NODE_RNIC => b"iWARP NIC\0",
        IBV_NODE_USNIC => b"usNIC\0",
        IBV_NODE_USNIC_UDP => b"usNIC UDP\0",
        IBV_NODE_UNSPECIFIED => b"unspecified\0",
        _ => b"unknown\0",
    };
    s.as_ptr().cast()
}

/// rdma-core's port state names.
#[no_mangle]
pub extern "C" fn ibv_port_state_str(s: ibv_port_state) -> *const c_char {
    let s: &'static [u8] = match s {
        IBV_PORT_NOP => b"no state change (NOP)\0",
        IBV_PORT_DOWN => b"down\0",
        IBV_PORT_INIT => b"init\0",
        IBV_PORT_ARMED => b"armed\0",
        IBV_PORT_ACTIVE => b"active\0",
        IBV_PORT_ACTIVE_DEFER => b"active defer\0",
        _ => b"unknown\0",
    };
    s.as_ptr().cast()
}

/// Nothing to prepare: registered memory is the program's own, read and
/// written by a thread of this process, so a fork cannot break it the way
/// it breaks pinned DMA pages. Succeeds, as rdma-core does with
/// fork-safe kernels.
#[no_mangle]
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `IBV_FORK_UNNEEDED`: a fork never breaks this library's memory (see
/// `ibv_fork_init`), so a program need not prepare for it.
#[no_mangle]
pub extern "C" fn ibv_is_fork_initialized() -> c_int {
    2
}

/// The device's index: its place in the device list, from 1 (the kernel
/// numbers its RDMA devices from 1 too); -1 for a pointer not ours.
///
/// # Safety
/// `device` is NULL or a device pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    let devs = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    devs.iter()
        .position(|x| ptr::eq(*x as *const Device, device as *const Device))
        .map_or(-1, |i| i as c_int + 1)
}

/// (rate, link-width multiple of 2.5 Gb/s, Mb/s), as rdma-core's tables.
const RATES: [(ibv_rate, c_int, c_int); 22] = [
    (IBV_RATE_2_5_GBPS, 1, 2500),
    (IBV_RATE_5_GBPS, 2, 5000),
    (IBV_RATE_10_GBPS, 4, 10000),
    (IBV_RATE_20_GBPS, 8, 20000),
    (IBV_RATE_30_GBPS, 12, 30000),
    (IBV_RATE_40_GBPS, 16, 40000),
    (IBV_RATE_60_GBPS, 24, 60000),
    (IBV_RATE_80_GBPS, 32, 80000),
    (IBV_RATE_120_GBPS, 48, 120000),
    (IBV_RATE_14_GBPS, -1, 14062),
    (IBV_RATE_56_GBPS, -1, 56250),
    (IBV_RATE_112_GBPS, -1, 112500),
    (IBV_RATE_168_GBPS, -1, 168750),
    (IBV_RATE_25_GBPS, -1, 25781),
    (IBV_RATE_100_GBPS, -1, 103125),
    (IBV_RATE_200_GBPS, -1, 206250),
    (IBV_RATE_300_GBPS, -1, 309375),
    (IBV_RATE_28_GBPS, -1, 28125),
    (IBV_RATE_50_GBPS, -1, 53125),
    (IBV_RATE_400_GBPS, -1, 425000),
    (IBV_RATE_600_GBPS, -1, 637500),
    (IBV_RATE_800_GBPS, -1, 850000),
];

#[no_mangle]
pub extern "C" fn ibv_rate_to_mult(rate: ibv_rate) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
}

#[no_mangle]
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> ibv_rate {
    RATES
        .iter()
        .find(|r| r.1 == mult && mult > 0)
        .map_or(IBV_RATE_MAX, |r| r.0)
}

#[no_mangle]
pub extern "C" fn ibv_rate_to_mbps(rate: ibv_rate) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}

#[no_mangle]
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> ibv_rate {
    RATES
        .iter()
        .find(|r| r.2 == mbps)
        .map_or(IBV_RATE_MAX, |r| r.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_port_attr_ends_after_link_layer() {
        // rdma-core's _compat_ibv_port_attr: up to link_layer and a
        // reserved byte, 48 bytes.
        assert_eq!(offset_of!(ibv_port_attr, flags) + 1, 48);
    }

    #[test]
    fn bad_pointers_are_errors() {
        // SAFETY: NULL and a foreign pointer are what is tested; none is
        // dereferenced by the functions.
        unsafe {
            assert!(ibv_get_device_name(ptr::null_mut()).is_null());
            assert_eq!(ibv_close_device(ptr::null_mut()), libc::EINVAL);
            let mut x = 0u64;
            assert_eq!(
                ibv_close_device(&mut x as *mut u64 as *mut ibv_context),
                libc::EINVAL
            );
            assert!(ibv_open_device(&mut x as *mut u64 as *mut ibv_device).is_null());
            ibv_free_device_list(ptr::null_mut());
        }
    }
}
