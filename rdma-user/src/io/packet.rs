//! AF_PACKET sockets for test tools: the impairment relay and the packet
//! injectors. Not on the data path (that is AF_XDP).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use anyhow::{bail, Context, Result};

/// `struct virtio_net_hdr`: with PACKET_VNET_HDR the kernel hands us (and
/// takes back) checksum-offload and GSO state, so a relay can forward TCP
/// frames whose checksum the sending veth left to "hardware".
pub const VNET_HDR_LEN: usize = 10;

/// A raw socket bound to one interface, seeing every frame on it.
pub struct RawSocket {
    fd: OwnedFd,
}

fn ifindex(iface: &str) -> Result<i32> {
    let c = std::ffi::CString::new(iface)?;
    // SAFETY: FFI with a valid C string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        bail!("interface {iface} not found; check `ip link` (inside the right namespace)");
    }
    Ok(i as i32)
}

fn setsockopt_int(fd: RawFd, level: i32, opt: i32, v: i32) -> io::Result<()> {
    // SAFETY: passing a valid int of the right size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            &v as *const i32 as *const _,
            std::mem::size_of::<i32>() as u32,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl RawSocket {
    /// Binds to `iface`. `vnet_hdr` prefixes every frame with a virtio-net
    /// header on receive and expects one on send.
    pub fn bind(iface: &str, vnet_hdr: bool) -> Result<RawSocket> {
        let ifindex = ifindex(iface)?;
        let proto = (libc::ETH_P_ALL as u16).to_be() as i32;
        // SAFETY: plain socket syscall; the fd is owned below.
        let raw =
            unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto) };
        if raw < 0 {
            return Err(io::Error::last_os_error()).context("AF_PACKET socket (needs root)");
        }
        // SAFETY: raw is a fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        if vnet_hdr {
            setsockopt_int(raw, libc::SOL_PACKET, libc::PACKET_VNET_HDR, 1)
                .context("PACKET_VNET_HDR")?;
        }
        // Our own transmissions must not come back as receptions.
        setsockopt_int(raw, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, 1)
            .context("PACKET_IGNORE_OUTGOING")?;
        setsockopt_int(raw, libc::SOL_SOCKET, libc::SO_RCVBUF, 8 << 20).ok();
        setsockopt_int(raw, libc::SOL_SOCKET, libc::SO_SNDBUF, 8 << 20).ok();
        // SAFETY: zeroed sockaddr_ll is valid; fields set below.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = ifindex;
        // SAFETY: sll is a valid sockaddr_ll of the given size.
        let r = unsafe {
            libc::bind(
                raw,
                &sll as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error()).with_context(|| format!("bind to {iface}"));
        }
        Ok(RawSocket { fd })
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Non-blocking receive; `Ok(None)` when nothing is queued.
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        // SAFETY: buf is valid for writes of its length.
        let n = unsafe {
            libc::recv(
                self.fd(),
                buf.as_mut_ptr() as *mut _,
                buf.len(),
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                return Ok(None);
            }
            return Err(e);
        }
        Ok(Some((n as usize).min(buf.len())))
    }

    /// Asks the kernel to stamp every received frame with its arrival time
    /// (see [`RawSocket::try_recv_stamped`]).
    pub fn enable_timestamps(&self) -> io::Result<()> {
        setsockopt_int(self.fd(), libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)
    }

    /// Like `try_recv`, and the frame's arrival time (Unix ns, the kernel's
    /// stamp) when timestamps are on: a program that reads frames late and
    /// in batches still knows when each one came.
    pub fn try_recv_stamped(&self, buf: &mut [u8]) -> io::Result<Option<(usize, Option<u64>)>> {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr() as *mut _,
            iov_len: buf.len(),
        };
        // Room for one control message carrying a timespec.
        let mut cbuf = [0u64; 8];
        // SAFETY: an all-zero msghdr is valid; the pointers are set below.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr() as *mut _;
        msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
        // SAFETY: msg points at iov (valid for buf's length) and cbuf, both
        // alive for the call.
        let n = unsafe { libc::recvmsg(self.fd(), &mut msg, libc::MSG_DONTWAIT | libc::MSG_TRUNC) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                return Ok(None);
            }
            return Err(e);
        }
        let mut stamp = None;
        // SAFETY: the CMSG_* helpers walk the control buffer the kernel
        // filled, within msg_controllen; the payload of SCM_TIMESTAMPNS is
        // a timespec, read unaligned.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                    let ts: libc::timespec =
                        std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::timespec);
                    stamp = Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        Ok(Some(((n as usize).min(buf.len()), stamp)))
    }

    /// Sends one frame (with its virtio-net header when bound with one).
    /// Retries briefly when the socket buffer is full, so nothing is lost
    /// that the caller did not mean to lose.
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        loop {
            // SAFETY: frame is valid for reads of its length.
            let n = unsafe { libc::send(self.fd(), frame.as_ptr() as *const _, frame.len(), 0) };
            if n >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::ENOBUFS) | Some(libc::EAGAIN) => std::thread::yield_now(),
                _ => return Err(e),
            }
        }
    }
}
