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
