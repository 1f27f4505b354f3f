//! Asynchronous events: `ibv_get_async_event` and `ibv_ack_async_event`
//! on the context's `async_fd`, and the port monitor that raises port
//! events when the interface's link comes or goes, as rxe raises them
//! from netdev notifications.
//!
//! QP events come from the data path (`AsyncEvent::QpFatal`, raised when
//! the engine moves a QP to the error state by itself).

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use rdma_user::device::rings::{AsyncEvent, AsyncShared};

use crate::device::our_context;
use crate::ffi::*;
use crate::set_errno;

/// Watches one interface's link over rtnetlink and queues PORT_ACTIVE /
/// PORT_ERR on changes. A thread that sleeps in poll(2): no cost while
/// nothing changes.
pub(crate) struct PortMonitor {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PortMonitor {
    /// Starts watching `netdev`; None if rtnetlink cannot be opened (the
    /// device then works without port events).
    pub(crate) fn start(netdev: &str, events: Arc<AsyncShared>) -> Option<PortMonitor> {
        let name = std::ffi::CString::new(netdev).ok()?;
        // SAFETY: a NUL-terminated name.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) } as i32;
        if index == 0 {
            return None;
        }
        let fd = link_socket()?;
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let up = link_running(netdev);
        let thread = std::thread::Builder::new()
            .name(format!("rdma-port-{netdev}"))
            .spawn(move || watch(fd, index, up, &events, &st))
            .ok();
        if thread.is_none() {
            // SAFETY: our socket, not handed to a thread.
            unsafe { libc::close(fd) };
            return None;
        }
        Some(PortMonitor { stop, thread })
    }
}

impl Drop for PortMonitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Whether the link is up with a carrier (rxe's port ACTIVE).
fn link_running(netdev: &str) -> bool {
    let s =
        std::fs::read_to_string(format!("/sys/class/net/{netdev}/operstate")).unwrap_or_default();
    matches!(s.trim(), "up" | "unknown")
}

/// An rtnetlink socket subscribed to link notifications.
fn link_socket() -> Option<i32> {
    // SAFETY: plain socket(2).
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: zeroed sockaddr_nl is valid; we set family and groups.
    let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as u16;
    sa.nl_groups = libc::RTMGRP_LINK as u32;
    // SAFETY: bind with a sockaddr_nl of its own size.
    let r = unsafe {
        libc::bind(
            fd,
            &sa as *const libc::sockaddr_nl as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if r != 0 {
        // SAFETY: our fd.
        unsafe { libc::close(fd) };
        return None;
    }
    Some(fd)
}

/// The monitor loop: waits up to 100 ms at a time (to see `stop`), reads
/// the notifications, and queues an event when our link's running flag
/// changes.
fn watch(fd: i32, index: i32, mut up: bool, events: &AsyncShared, stop: &AtomicBool) {
    let mut buf = [0u8; 8192];
    while !stop.load(Ordering::Relaxed) {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut p, 1, 100) } <= 0 {
            continue;
        }
        loop {
            // SAFETY: recv into our buffer of its length.
            let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n <= 0 {
                break;
            }
            for now_up in link_changes(&buf[..n as usize], index) {
                if now_up != up {
                    up = now_up;
                    events.push(if up {
                        AsyncEvent::PortActive
                    } else {
                        AsyncEvent::PortErr
                    });
                }
            }
        }
    }
    // SAFETY: our socket, closed once, by its only user.
    unsafe { libc::close(fd) };
}

/// The running state of interface `index` in each RTM_NEWLINK message of
/// a netlink datagram (struct nlmsghdr, then struct ifinfomsg).
fn link_changes(mut b: &[u8], index: i32) -> Vec<bool> {
    let mut out = Vec::new();
    const NLMSG_HDR: usize = 16;
    const IFINFO: usize = 16;
    while b.len() >= NLMSG_HDR {
        let len = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize;
        let kind = u16::from_ne_bytes([b[4], b[5]]);
        if len < NLMSG_HDR || len > b.len() {
            break;
        }
        if kind == libc::RTM_NEWLINK && len >= NLMSG_HDR + IFINFO {
            let m = &b[NLMSG_HDR..];
            let idx = i32::from_ne_bytes([m[4], m[5], m[6], m[7]]);
            let flags = u32::from_ne_bytes([m[8], m[9], m[10], m[11]]);
            if idx == index {
                out.push(flags & libc::IFF_RUNNING as u32 != 0);
            }
        }
        // Messages are 4-byte aligned.
        let step = (len + 3) & !3;
        b = &b[step.min(b.len())..];
    }
    out
}

/// The next asynchronous event of `context`: blocks in `read` on its
/// `async_fd` (EINTR on a signal, EAGAIN with O_NONBLOCK), as rdma-core's
/// kernel event file does.
///
/// # Safety
/// `context` is a context; `event` points to an `ibv_async_event`.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    let Some(c) = our_context(context) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    if event.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    loop {
        let mut v: u64 = 0;
        // SAFETY: reading 8 bytes into a local from our eventfd.
        let n = unsafe { libc::read(c.events.fd(), (&mut v as *mut u64).cast(), 8) };
        if n != 8 {
            return -1;
        }
        let Some(ev) = c.events.pop() else {
            continue;
        };
        let mut out = ibv_async_event::default();
        match ev {
            AsyncEvent::PortActive | AsyncEvent::PortErr => {
                out.element.port_num = 1;
                out.event_type = if ev == AsyncEvent::PortActive {
                    IBV_EVENT_PORT_ACTIVE
                } else {
                    IBV_EVENT_PORT_ERR
                };
            }
            AsyncEvent::SrqLimit(token) => {
                // A destroyed SRQ has nobody to tell.
                let Some(srq) = crate::srq::srq_of(token as *mut ibv_srq) else {
                    continue;
                };
                out.element.srq = srq as *const crate::srq::Srq as *mut ibv_srq;
                out.event_type = IBV_EVENT_SRQ_LIMIT_REACHED;
            }
            AsyncEvent::QpFatal(qpn) => {
                // A QP destroyed since has nobody to tell.
                let Some(qp) = crate::verbs::qp_reported(context, qpn) else {
                    continue;
                };
                out.element.qp = qp;
                out.event_type = IBV_EVENT_QP_FATAL;
            }
        }
        // SAFETY: the caller's event.
        unsafe { event.write(out) };
        return 0;
    }
}

/// # Safety
/// `event` is one `ibv_get_async_event` returned.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    if event.is_null() {
        return;
    }
    // SAFETY: the caller's event.
    let e = unsafe { &*event };
    if e.event_type == IBV_EVENT_QP_FATAL {
        // SAFETY: element.qp is the union member a QP event sets.
        crate::verbs::qp_event_acked(unsafe { e.element.qp });
    }
}

/// rdma-core's names of the event types.
#[no_mangle]
pub extern "C" fn ibv_event_type_str(event: ibv_event_type) -> *const std::ffi::c_char {
    let s: &'static [u8] = match event {
        IBV_EVENT_CQ_ERR => b"CQ error\0",
        IBV_EVENT_QP_FATAL => b"local work queue catastrophic error\0",
        IBV_EVENT_QP_REQ_ERR => b"invalid request local work queue error\0",
        IBV_EVENT_QP_ACCESS_ERR => b"local access violation work queue error\0",
        IBV_EVENT_COMM_EST => b"communication established\0",
        IBV_EVENT_SQ_DRAINED => b"send queue drained\0",
        IBV_EVENT_PATH_MIG => b"path migrated\0",
        IBV_EVENT_PATH_MIG_ERR => b"path migration request error\0",
        IBV_EVENT_DEVICE_FATAL => b"local catastrophic error\0",
        IBV_EVENT_PORT_ACTIVE => b"port active\0",
        IBV_EVENT_PORT_ERR => b"port error\0",
        IBV_EVENT_LID_CHANGE => b"LID change\0",
        IBV_EVENT_PKEY_CHANGE => b"P_Key change\0",
        IBV_EVENT_SM_CHANGE => b"SM change\0",
        IBV_EVENT_SRQ_ERR => b"SRQ catastrophic error\0",
        IBV_EVENT_SRQ_LIMIT_REACHED => b"SRQ limit reached\0",
        IBV_EVENT_QP_LAST_WQE_REACHED => b"last WQE reached\0",
        IBV_EVENT_CLIENT_REREGISTER => b"client reregistration\0",
        IBV_EVENT_GID_CHANGE => b"GID table change\0",
        IBV_EVENT_WQ_FATAL => b"WQ fatal\0",
        _ => b"unknown\0",
    };
    s.as_ptr().cast()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An RTM_NEWLINK as the kernel sends it: nlmsghdr, ifinfomsg, and
    /// attributes we skip.
    fn newlink(index: i32, flags: u32) -> Vec<u8> {
        let mut m = Vec::new();
        let len: u32 = 16 + 16 + 8;
        m.extend_from_slice(&len.to_ne_bytes());
        m.extend_from_slice(&libc::RTM_NEWLINK.to_ne_bytes());
        m.extend_from_slice(&0u16.to_ne_bytes());
        m.extend_from_slice(&[0; 8]);
        m.extend_from_slice(&[0, 0, 1, 0]);
        m.extend_from_slice(&index.to_ne_bytes());
        m.extend_from_slice(&flags.to_ne_bytes());
        m.extend_from_slice(&0xffff_ffffu32.to_ne_bytes());
        m.extend_from_slice(&[8, 0, 3, 0, b'e', b't', b'h', 0]);
        m
    }

    #[test]
    fn link_changes_reads_our_interface_only() {
        let running = (libc::IFF_UP | libc::IFF_RUNNING) as u32;
        let mut d = newlink(7, running);
        d.extend(newlink(3, 0));
        d.extend(newlink(7, libc::IFF_UP as u32));
        assert_eq!(link_changes(&d, 7), vec![true, false]);
        assert_eq!(link_changes(&d, 3), vec![false]);
        // Truncated or garbage input yields nothing, never a panic.
        assert!(link_changes(&d[..20], 7).is_empty());
        assert!(link_changes(&[0xff; 40], 7).is_empty());
    }
}
