//! The port of a device, from its interface: its attributes and GID
//! table as rxe reports them (link layer Ethernet, RoCE v2 GIDs), the
//! network path to a GID, and the monitor that raises port events when the
//! link comes or goes, as rxe raises them from netdev notifications.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use rdma_user::control::ibdev;
use rdma_user::device::datapath::Path;
use rdma_user::device::rings::{AsyncEvent, AsyncShared};
use rdma_user::io::hostnet::{iface_mac, resolve_mac};
use rdma_user::wire::gid_to_ip;

use crate::ffi::*;

/// GID table length, as rxe's (`RXE_PORT_GID_TBL_LEN`).
pub(crate) const GID_TBL_LEN: c_int = ibdev::GID_TBL_LEN as c_int;

pub(crate) use rdma_user::control::ibdev::{eui64, gid_table};

/// The IB MTU enum for an MTU in bytes.
fn mtu_enum(bytes: u32) -> ibv_mtu {
    match bytes {
        4096 => IBV_MTU_4096,
        2048 => IBV_MTU_2048,
        1024 => IBV_MTU_1024,
        512 => IBV_MTU_512,
        _ => IBV_MTU_256,
    }
}

/// The port's attributes, as rxe reports them for `netdev`.
pub(crate) fn port_attr(netdev: &str) -> ibv_port_attr {
    let up = ibdev::port_active(netdev);
    let mut a = ibv_port_attr {
        state: if up { IBV_PORT_ACTIVE } else { IBV_PORT_DOWN },
        max_mtu: IBV_MTU_4096,
        active_mtu: mtu_enum(ibdev::active_mtu(netdev)),
        gid_tbl_len: GID_TBL_LEN,
        port_cap_flags: IBV_PORT_CM_SUP,
        max_msg_sz: 1 << 31,
        pkey_tbl_len: 1,
        max_vl_num: 1,
        active_width: 1,
        active_speed: 1,
        ..Default::default()
    };
    // phys_state: 5 LinkUp, 3 Disabled.
    a.phys_state = if up { 5 } else { 3 };
    a.link_layer = IBV_LINK_LAYER_ETHERNET as u8;
    a
}

/// The network path to the GID in `ah`, from our GID at its source index:
/// the peer's MAC from the kernel's neighbour table (resolved if missing).
pub(crate) fn path_of(netdev: &str, a: &ibv_ah_attr) -> Result<Path, c_int> {
    let gids = gid_table(netdev);
    let local = gids.get(a.grh.sgid_index as usize).ok_or(libc::EINVAL)?;
    // SAFETY: reading the raw bytes of the GID union.
    let dgid = unsafe { a.grh.dgid.raw };
    let (local_ip, peer_ip) = (gid_to_ip(local), gid_to_ip(&dgid));
    if local_ip.is_ipv4() != peer_ip.is_ipv4() {
        return Err(libc::EINVAL);
    }
    if dgid == [0; 16] {
        return Err(libc::EINVAL);
    }
    let local_mac = iface_mac(netdev).map_err(|_| libc::ENODEV)?;
    // A GID of our own is reached through our own MAC, as the kernel
    // resolves a local address (UCX probes each GID this way).
    let peer_mac = if gids.contains(&dgid) {
        local_mac
    } else {
        resolve_mac(netdev, peer_ip, Duration::from_secs(3)).map_err(|e| {
            eprintln!("libibverbs (rdma-xdp): {e:#}");
            libc::EHOSTUNREACH
        })?
    };
    Ok(Path {
        local_mac,
        peer_mac,
        local_ip,
        peer_ip,
        vlan: None,
        traffic_class: a.grh.traffic_class,
    })
}

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
        let up = ibdev::port_active(netdev);
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
    fn mtu_and_guid_as_rxe() {
        let port = rdma_user::io::hostnet::port_mtu;
        assert_eq!(mtu_enum(port(1500)), IBV_MTU_1024);
        assert_eq!(mtu_enum(port(9000)), IBV_MTU_4096);
        assert_eq!(mtu_enum(port(4000)), IBV_MTU_2048);
        assert_eq!(mtu_enum(port(576)), IBV_MTU_256);
        // rxe's node_guid for 52:54:00:99:00:02 is 5054:00ff:fe99:0002.
        assert_eq!(
            eui64([0x52, 0x54, 0, 0x99, 0, 2]),
            [0x50, 0x54, 0, 0xff, 0xfe, 0x99, 0, 2]
        );
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
