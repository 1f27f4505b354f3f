//! Socket addresses, the addresses of an id's route, and `rdma_getaddrinfo`.

use std::ffi::{c_char, c_int, CStr};
use std::net::{IpAddr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::ptr;

use libc::{sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage, AF_INET, AF_INET6};

use rdma_user::wire::gid_of;

use super::abi::*;
use crate::ffi::{ibv_gid, IBV_QPT_RC, IBV_QPT_UD};
use crate::{guard, set_errno};

/// An IPv4 or IPv6 socket address; None for other families or NULL.
///
/// # Safety
/// `a` is NULL or points to a sockaddr of its family's size.
pub(crate) unsafe fn read_sockaddr(a: *const sockaddr) -> Option<SocketAddr> {
    if a.is_null() {
        return None;
    }
    // SAFETY: the family says which struct it is.
    unsafe {
        match (*a).sa_family as c_int {
            AF_INET => {
                let s = &*(a as *const sockaddr_in);
                Some(SocketAddr::V4(SocketAddrV4::new(
                    u32::from_be(s.sin_addr.s_addr).into(),
                    u16::from_be(s.sin_port),
                )))
            }
            AF_INET6 => {
                let s = &*(a as *const sockaddr_in6);
                Some(SocketAddr::V6(SocketAddrV6::new(
                    s.sin6_addr.s6_addr.into(),
                    u16::from_be(s.sin6_port),
                    s.sin6_flowinfo,
                    s.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

pub(crate) fn write_sockaddr(out: &mut sockaddr_storage, a: SocketAddr) {
    // SAFETY: all-zero is a valid sockaddr_storage; each arm writes a
    // struct that fits in it.
    unsafe {
        *out = std::mem::zeroed();
        match a {
            SocketAddr::V4(v) => {
                let s = &mut *(out as *mut sockaddr_storage as *mut sockaddr_in);
                s.sin_family = AF_INET as u16;
                s.sin_port = v.port().to_be();
                s.sin_addr.s_addr = u32::from(*v.ip()).to_be();
            }
            SocketAddr::V6(v) => {
                let s = &mut *(out as *mut sockaddr_storage as *mut sockaddr_in6);
                s.sin6_family = AF_INET6 as u16;
                s.sin6_port = v.port().to_be();
                s.sin6_addr.s6_addr = v.ip().octets();
                s.sin6_scope_id = v.scope_id();
            }
        }
    }
}

pub(crate) fn port_of(s: &sockaddr_storage) -> u16 {
    // SAFETY: a sockaddr_storage of ours.
    unsafe { read_sockaddr(s as *const sockaddr_storage as *const sockaddr) }
        .map_or(0, |a| a.port())
}

pub(crate) fn fill_route(r: &mut rdma_route, src: SocketAddr, dst: SocketAddr) {
    write_sockaddr(&mut r.addr.src, src);
    write_sockaddr(&mut r.addr.dst, dst);
    r.addr.ibaddr.sgid = ibv_gid {
        raw: gid_of(src.ip()),
    };
    r.addr.ibaddr.dgid = ibv_gid {
        raw: gid_of(dst.ip()),
    };
    r.addr.ibaddr.pkey = 0xffff;
}

/// The source address the kernel's routing table picks for `dst` (a
/// connected UDP socket, which sends nothing).
pub(crate) fn source_for(dst: SocketAddr) -> Option<IpAddr> {
    let any: SocketAddr = if dst.is_ipv4() {
        "0.0.0.0:0".parse().unwrap()
    } else {
        "[::]:0".parse().unwrap()
    };
    let s = UdpSocket::bind(any).ok()?;
    let port = if dst.port() == 0 { 9 } else { dst.port() };
    s.connect(SocketAddr::new(dst.ip(), port)).ok()?;
    s.local_addr().ok().map(|a| a.ip())
}

/// What `rdma_getaddrinfo` returns: the struct first, its addresses after.
#[repr(C)]
struct AddrInfo {
    ai: rdma_addrinfo,
    src: sockaddr_storage,
    dst: sockaddr_storage,
}

fn c_str<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller's NUL-terminated string.
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}

/// # Safety
/// `node`/`service` NULL or strings; `hints` NULL or address info; `res`
/// points to a pointer to fill.
#[no_mangle]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard(-1, || {
        // SAFETY: the caller's hints.
        let h = unsafe { hints.as_ref() };
        if res.is_null() || (node.is_null() && service.is_null() && h.is_none()) {
            set_errno(libc::EINVAL);
            return -1;
        }
        // The hints' own addresses, which rdma-core copies where the name
        // gives none (libfabric passes its peers' addresses this way).
        // SAFETY: the caller's hints point to valid sockaddrs or NULL.
        let hint_src = h.and_then(|h| unsafe { hint_addr(h.ai_src_addr, h.ai_src_len) });
        // SAFETY: as above.
        let hint_dst = h.and_then(|h| unsafe { hint_addr(h.ai_dst_addr, h.ai_dst_len) });
        let flags = h.map_or(0, |h| h.ai_flags);
        let passive = flags & RAI_PASSIVE != 0;
        let family = h.map_or(0, |h| h.ai_family);
        let (src, dst) = if node.is_null() && service.is_null() {
            (hint_src, hint_dst)
        } else {
            let port: u16 = match c_str(service) {
                None => 0,
                Some(s) => match s.parse() {
                    Ok(p) => p,
                    Err(_) => {
                        set_errno(libc::EINVAL);
                        return -1;
                    }
                },
            };
            let ip = match resolve_node(c_str(node), port, family, flags) {
                Ok(ip) => ip,
                Err(e) => {
                    set_errno(e);
                    return -1;
                }
            };
            let addr = SocketAddr::new(ip, port);
            if passive {
                (Some(addr), None)
            } else {
                let src = source_for(addr).map(|s| SocketAddr::new(s, 0));
                (src.or(hint_src), Some(addr))
            }
        };
        let family = match src.or(dst) {
            Some(a) if a.is_ipv4() => AF_INET,
            Some(_) => AF_INET6,
            None => family,
        };
        let ps = h.map_or(0, |h| h.ai_port_space);
        let qp_type = h.map_or(0, |h| h.ai_qp_type);
        let (ps, qp_type) = match (ps, qp_type as u32) {
            (0, 0) | (RDMA_PS_TCP, _) | (0, IBV_QPT_RC) => (RDMA_PS_TCP, IBV_QPT_RC),
            (RDMA_PS_UDP, _) | (0, IBV_QPT_UD) => (RDMA_PS_UDP, IBV_QPT_UD),
            (p, t) => (p, t),
        };
        // SAFETY: all-zero is a valid AddrInfo (pointers NULL).
        let mut b: Box<AddrInfo> = Box::new(unsafe { std::mem::zeroed() });
        b.ai.ai_flags = flags;
        b.ai.ai_family = family;
        b.ai.ai_qp_type = qp_type as c_int;
        b.ai.ai_port_space = ps;
        let len = |a: SocketAddr| {
            let n = if a.is_ipv4() {
                std::mem::size_of::<sockaddr_in>()
            } else {
                std::mem::size_of::<sockaddr_in6>()
            };
            n as libc::socklen_t
        };
        let p = Box::into_raw(b);
        // SAFETY: the AddrInfo just leaked; its address fields point into it.
        unsafe {
            if let Some(a) = src {
                write_sockaddr(&mut (*p).src, a);
                (*p).ai.ai_src_addr = ptr::addr_of_mut!((*p).src) as *mut sockaddr;
                (*p).ai.ai_src_len = len(a);
            }
            if let Some(a) = dst {
                write_sockaddr(&mut (*p).dst, a);
                (*p).ai.ai_dst_addr = ptr::addr_of_mut!((*p).dst) as *mut sockaddr;
                (*p).ai.ai_dst_len = len(a);
            }
            *res = ptr::addr_of_mut!((*p).ai);
        }
        0
    })
}

/// A hint's address, if it has one of a family we know.
///
/// # Safety
/// `a` is NULL or points to `len` bytes of a sockaddr.
unsafe fn hint_addr(a: *const sockaddr, len: libc::socklen_t) -> Option<SocketAddr> {
    if a.is_null() || len == 0 {
        return None;
    }
    // SAFETY: the caller's sockaddr.
    unsafe { read_sockaddr(a) }
}

/// The address a node names: numeric, or resolved by the system's
/// resolver (not with `RAI_NUMERICHOST`); the wildcard when there is none.
fn resolve_node(
    node: Option<&str>,
    port: u16,
    family: c_int,
    flags: c_int,
) -> Result<IpAddr, c_int> {
    let Some(n) = node else {
        return Ok(if family == AF_INET6 {
            IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
        } else {
            IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
        });
    };
    if let Ok(ip) = n.parse() {
        return Ok(ip);
    }
    if flags & RAI_NUMERICHOST != 0 {
        return Err(libc::EINVAL);
    }
    use std::net::ToSocketAddrs;
    (n, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut it| it.find(|a| family == 0 || (family == AF_INET) == a.is_ipv4()))
        .map(|a| a.ip())
        .ok_or(libc::EADDRNOTAVAIL)
}

/// # Safety
/// `res` is NULL or from `rdma_getaddrinfo`.
#[no_mangle]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    if !res.is_null() {
        // SAFETY: the first field of a leaked Box<AddrInfo>, freed once.
        drop(unsafe { Box::from_raw(res as *mut AddrInfo) });
    }
}
