//! Facts about the host's network: interface MAC and addresses, neighbour
//! (ARP/NDP) resolution, the network namespace we run in.
//!
//! Read-only: it never changes the host's configuration.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

pub fn parse_mac(s: &str) -> Result<[u8; 6]> {
    let parts: Vec<&str> = s.trim().split(':').collect();
    if parts.len() != 6 {
        bail!("'{s}' is not a MAC address (want aa:bb:cc:dd:ee:ff)");
    }
    let mut m = [0u8; 6];
    for (i, p) in parts.iter().enumerate() {
        m[i] = u8::from_str_radix(p, 16).with_context(|| format!("bad MAC address '{s}'"))?;
    }
    Ok(m)
}

pub fn fmt_mac(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// rxe's header allowance: the IB MTU is the largest that fits in the
/// netdev MTU minus this (`RXE_MAX_HDR_LENGTH`).
const MAX_HDR_LENGTH: u32 = 80;

/// The port MTU in bytes (256..=4096) rxe gives a netdev MTU: the
/// largest UD datagram, the `active_mtu` of `ibv_query_port`.
pub fn port_mtu(netdev_mtu: u32) -> u32 {
    let room = netdev_mtu.saturating_sub(MAX_HDR_LENGTH);
    [4096, 2048, 1024, 512]
        .into_iter()
        .find(|&m| room >= m)
        .unwrap_or(256)
}

/// The interface's link speed in Mbit/s (a veth says 10000), if it has one.
pub fn iface_speed(iface: &str) -> Option<f64> {
    std::fs::read_to_string(format!("/sys/class/net/{iface}/speed"))
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|&s| s > 0.0)
}

/// The interface's MTU (1500 if it cannot be read).
pub fn iface_mtu(iface: &str) -> u32 {
    std::fs::read_to_string(format!("/sys/class/net/{iface}/mtu"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1500)
}

pub fn iface_mac(iface: &str) -> Result<[u8; 6]> {
    let p = format!("/sys/class/net/{iface}/address");
    let s = std::fs::read_to_string(&p)
        .with_context(|| format!("interface {iface} not found (no {p}); check `ip link`"))?;
    parse_mac(&s)
}

/// Addresses of an interface (IPv4 and global IPv6).
pub fn iface_addrs(iface: &str) -> Result<Vec<IpAddr>> {
    let mut out = Vec::new();
    // SAFETY: getifaddrs/freeifaddrs pair; each entry is read before free.
    unsafe {
        let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
        if libc::getifaddrs(&mut ifap) != 0 {
            bail!("getifaddrs: {}", std::io::Error::last_os_error());
        }
        let mut p = ifap;
        while !p.is_null() {
            let ifa = &*p;
            p = ifa.ifa_next;
            if ifa.ifa_addr.is_null() {
                continue;
            }
            let name = std::ffi::CStr::from_ptr(ifa.ifa_name).to_string_lossy();
            if name != iface {
                continue;
            }
            match (*ifa.ifa_addr).sa_family as i32 {
                libc::AF_INET => {
                    let sa = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    out.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr))));
                }
                libc::AF_INET6 => {
                    let sa = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    let a = Ipv6Addr::from(sa.sin6_addr.s6_addr);
                    if a.segments()[0] & 0xffc0 != 0xfe80 {
                        out.push(IpAddr::V6(a));
                    }
                }
                _ => {}
            }
        }
        libc::freeifaddrs(ifap);
    }
    Ok(out)
}

/// The interface's address of the same family as `peer`.
pub fn local_addr_for(iface: &str, peer: IpAddr) -> Result<IpAddr> {
    iface_addrs(iface)?
        .into_iter()
        .find(|a| a.is_ipv4() == peer.is_ipv4())
        .ok_or_else(|| {
            anyhow!(
                "interface {iface} has no {} address to reach {peer}",
                if peer.is_ipv4() { "IPv4" } else { "IPv6" }
            )
        })
}

/// The neighbour table's link-layer address for `ip` on `iface`: one
/// RTM_GETNEIGH dump over rtnetlink. No child process: this runs inside
/// applications (the drop-in librdmacm resolves a route per connection),
/// where forking `ip neigh` cost about a millisecond each time.
fn lookup_neigh(iface: &str, ip: IpAddr) -> Option<[u8; 6]> {
    let name = std::ffi::CString::new(iface).ok()?;
    // SAFETY: a NUL-terminated name.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) } as i32;
    if index == 0 {
        return None;
    }
    // SAFETY: plain socket(2).
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return None;
    }
    let found = neigh_dump(fd, index, ip);
    // SAFETY: our socket, closed once.
    unsafe { libc::close(fd) };
    found
}

const NLMSG_HDR: usize = 16;
/// struct ndmsg: family, pad, pad, ifindex, state, flags, type.
const NDMSG: usize = 12;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;

fn neigh_dump(fd: i32, index: i32, ip: IpAddr) -> Option<[u8; 6]> {
    let tv = libc::timeval {
        tv_sec: 1,
        tv_usec: 0,
    };
    // SAFETY: a timeval of its own size for SO_RCVTIMEO: the kernel always
    // answers a dump, but a reply lost to ENOBUFS must not hang us.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        )
    };
    let mut req = [0u8; NLMSG_HDR + NDMSG];
    req[0..4].copy_from_slice(&((NLMSG_HDR + NDMSG) as u32).to_ne_bytes());
    req[4..6].copy_from_slice(&libc::RTM_GETNEIGH.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    req[6..8].copy_from_slice(&flags.to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    req[NLMSG_HDR] = if ip.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    } as u8;
    req[NLMSG_HDR + 4..NLMSG_HDR + 8].copy_from_slice(&index.to_ne_bytes());
    // SAFETY: send our request buffer of its length.
    if unsafe { libc::send(fd, req.as_ptr().cast(), req.len(), 0) } != req.len() as isize {
        return None;
    }
    let mut buf = vec![0u8; 32 << 10];
    let mut found = None;
    loop {
        // SAFETY: recv into our buffer of its length.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n <= 0 {
            return found;
        }
        let (m, done) = neigh_in(&buf[..n as usize], index, ip);
        found = found.or(m);
        if done {
            return found;
        }
    }
}

/// One datagram of an RTM_GETNEIGH dump: the MAC of `ip` on interface
/// `index`, from an entry that has one (an INCOMPLETE or FAILED entry has
/// none), and whether the dump ended (NLMSG_DONE or an error; the last
/// entries may share the datagram with it).
fn neigh_in(mut b: &[u8], index: i32, ip: IpAddr) -> (Option<[u8; 6]>, bool) {
    let want: Vec<u8> = match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    let mut found = None;
    while b.len() >= NLMSG_HDR {
        let len = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize;
        let kind = u16::from_ne_bytes([b[4], b[5]]);
        if len < NLMSG_HDR || len > b.len() {
            break;
        }
        if kind == libc::NLMSG_DONE as u16 || kind == libc::NLMSG_ERROR as u16 {
            return (found, true);
        }
        if kind == libc::RTM_NEWNEIGH && len >= NLMSG_HDR + NDMSG {
            let m = &b[NLMSG_HDR..len];
            let idx = i32::from_ne_bytes([m[4], m[5], m[6], m[7]]);
            let (mut dst, mut mac) = (None, None);
            let mut a = &m[NDMSG..];
            while a.len() >= 4 {
                let alen = u16::from_ne_bytes([a[0], a[1]]) as usize;
                let akind = u16::from_ne_bytes([a[2], a[3]]);
                if alen < 4 || alen > a.len() {
                    break;
                }
                let data = &a[4..alen];
                match akind {
                    NDA_DST => dst = Some(data),
                    NDA_LLADDR if data.len() == 6 => mac = data.try_into().ok(),
                    _ => {}
                }
                a = &a[((alen + 3) & !3).min(a.len())..];
            }
            if idx == index && dst == Some(&want[..]) {
                found = found.or(mac);
            }
        }
        // Messages are 4-byte aligned.
        b = &b[((len + 3) & !3).min(b.len())..];
    }
    (found, false)
}

/// MAC of a neighbour, asking the kernel to resolve it (ARP/NDP pass through
/// the XDP program untouched) when it is not known yet.
pub fn resolve_mac(iface: &str, ip: IpAddr, timeout: Duration) -> Result<[u8; 6]> {
    if let Some(m) = lookup_neigh(iface, ip) {
        return Ok(m);
    }
    let start = Instant::now();
    let bind: IpAddr = if ip.is_ipv4() {
        Ipv4Addr::UNSPECIFIED.into()
    } else {
        Ipv6Addr::UNSPECIFIED.into()
    };
    let sock = UdpSocket::bind((bind, 0))?;
    while start.elapsed() < timeout {
        // Discard port: nobody answers, but the kernel resolves the neighbour.
        let _ = sock.send_to(b"arp", (ip, 9));
        std::thread::sleep(Duration::from_millis(20));
        if let Some(m) = lookup_neigh(iface, ip) {
            return Ok(m);
        }
    }
    bail!("cannot resolve the MAC address of {ip} on {iface} (no ARP/NDP answer); is the peer up and on this link? Pass --remote-mac to skip resolution")
}

/// Identity of our network namespace (its inode), so that daemons in
/// different namespaces with the same interface name do not collide.
pub fn netns_id() -> String {
    std::fs::read_link("/proc/self/ns/net")
        .map(|p| {
            p.to_string_lossy()
                .trim_start_matches("net:[")
                .trim_end_matches(']')
                .to_string()
        })
        .unwrap_or_else(|_| "default".into())
}

/// Directory for this namespace's control sockets and locks (root only).
pub fn run_dir() -> std::path::PathBuf {
    let base = std::env::var_os("RDMA_RUN_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/run/rdma-xdp".into());
    base.join(format!("ns-{}", netns_id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An RTM_NEWNEIGH message as the kernel sends it: nlmsghdr, ndmsg,
    /// then NDA_DST and (when known) NDA_LLADDR.
    fn newneigh(index: i32, dst: &[u8], mac: Option<[u8; 6]>) -> Vec<u8> {
        let mut m = vec![0u8; NLMSG_HDR + NDMSG];
        m[4..6].copy_from_slice(&libc::RTM_NEWNEIGH.to_ne_bytes());
        m[NLMSG_HDR] = if dst.len() == 4 { 2 } else { 10 };
        m[NLMSG_HDR + 4..NLMSG_HDR + 8].copy_from_slice(&index.to_ne_bytes());
        let mut attr = |kind: u16, data: &[u8]| {
            m.extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
            m.extend_from_slice(&kind.to_ne_bytes());
            m.extend_from_slice(data);
            while !m.len().is_multiple_of(4) {
                m.push(0);
            }
        };
        attr(NDA_DST, dst);
        if let Some(mac) = mac {
            attr(NDA_LLADDR, &mac);
        }
        let len = m.len() as u32;
        m[0..4].copy_from_slice(&len.to_ne_bytes());
        m
    }

    #[test]
    fn a_neighbour_dump_yields_the_mac_of_the_address_on_the_interface() {
        let mac = [0x02, 0, 0, 0, 0, 0x22];
        let ip: IpAddr = "10.0.0.2".parse().unwrap();
        let mut dg = newneigh(7, &[10, 0, 0, 3], Some([9; 6]));
        dg.extend(newneigh(8, &[10, 0, 0, 2], Some([8; 6])));
        dg.extend(newneigh(7, &[10, 0, 0, 2], Some(mac)));
        assert_eq!(neigh_in(&dg, 7, ip), (Some(mac), false));
        // An INCOMPLETE entry has no link-layer address.
        let dg = newneigh(7, &[10, 0, 0, 2], None);
        assert_eq!(neigh_in(&dg, 7, ip), (None, false));
        let v6: std::net::Ipv6Addr = "fd00::2".parse().unwrap();
        let dg = newneigh(7, &v6.octets(), Some(mac));
        assert_eq!(neigh_in(&dg, 7, v6.into()), (Some(mac), false));
        // The end of the dump in the same datagram as the entry (as the
        // kernel sends a short dump), and a truncated message.
        let mut dg = newneigh(7, &[10, 0, 0, 2], Some(mac));
        let mut done = vec![0u8; NLMSG_HDR];
        done[0..4].copy_from_slice(&(NLMSG_HDR as u32).to_ne_bytes());
        done[4..6].copy_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes());
        dg.extend(&done);
        assert_eq!(neigh_in(&dg, 7, ip), (Some(mac), true));
        assert_eq!(neigh_in(&done, 7, ip), (None, true));
        assert_eq!(neigh_in(&dg[..20], 7, ip), (None, false));
    }

    #[test]
    fn the_kernel_answers_a_neighbour_dump() {
        // Loopback has no neighbours: the dump must end, empty. (A found
        // neighbour is seen end to end by every test that connects.)
        assert_eq!(lookup_neigh("lo", "127.0.0.2".parse().unwrap()), None);
        assert_eq!(
            lookup_neigh("no-such-if0", "10.0.0.1".parse().unwrap()),
            None
        );
    }
}
