//! Facts about the host's network: interface MAC and addresses, neighbour
//! (ARP/NDP) resolution, the network namespace we run in.
//!
//! Read-only: it never changes the host's configuration.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
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
    let fd = nl_socket()?;
    neigh_dump(fd.as_raw_fd(), index, ip)
}

const NLMSG_HDR: usize = 16;
/// struct ndmsg: family, pad, pad, ifindex, state, flags, type.
const NDMSG: usize = 12;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;

fn neigh_dump(fd: i32, index: i32, ip: IpAddr) -> Option<[u8; 6]> {
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
            for (akind, data) in nl_attrs(&m[NDMSG..]) {
                match akind {
                    NDA_DST => dst = Some(data),
                    NDA_LLADDR if data.len() == 6 => mac = data.try_into().ok(),
                    _ => {}
                }
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

/// A NETLINK_ROUTE socket with a receive timeout: the kernel always
/// answers, but a reply lost to ENOBUFS must not hang us.
fn nl_socket() -> Option<OwnedFd> {
    // SAFETY: plain socket(2); the fd is owned by the OwnedFd from here.
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
    // SAFETY: a fresh fd nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let tv = libc::timeval {
        tv_sec: 1,
        tv_usec: 0,
    };
    // SAFETY: a timeval of its own size for SO_RCVTIMEO.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        )
    };
    Some(fd)
}

/// The (type, payload) pairs of a run of netlink attributes (struct
/// rtattr / nlattr: length, type, payload, padded to 4 bytes). A
/// malformed length ends the run.
fn nl_attrs(mut a: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if a.len() < 4 {
            return None;
        }
        let alen = u16::from_ne_bytes([a[0], a[1]]) as usize;
        // NLA_F_NESTED and NLA_F_NET_BYTEORDER are flags, not the type.
        let akind = u16::from_ne_bytes([a[2], a[3]]) & 0x3fff;
        if alen < 4 || alen > a.len() {
            return None;
        }
        let data = &a[4..alen];
        a = &a[((alen + 3) & !3).min(a.len())..];
        Some((akind, data))
    })
}

/// struct ifinfomsg: family, pad, type, index, flags, change.
const IFINFOMSG: usize = 16;
const IFLA_LINK: u16 = 5;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_LINK_NETNSID: u16 = 37;
const IFLA_XDP: u16 = 43;
const IFLA_XDP_ATTACHED: u16 = 2;
const IFLA_TARGET_NETNSID: u16 = 46;

/// What an interface's veth peer does with the frames our XDP program
/// sends back out with `XDP_TX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VethPeer {
    /// Not a veth: `XDP_TX` goes out of the NIC like any frame.
    NotVeth,
    /// The peer runs an XDP program, so veth polls its XDP ring.
    Xdp,
    /// The peer runs none: veth drops `XDP_TX` frames (counted as the
    /// sender's `xdp_tx_errors`) or leaves them in the peer's ring.
    NoXdp {
        /// The peer's ifindex, in its own namespace.
        ifindex: u32,
        /// Its namespace's id as seen from ours; `None`: this namespace.
        netnsid: Option<i32>,
    },
}

impl VethPeer {
    /// Why `XDP_TX` from our end would be lost, and what to do about it.
    pub fn why_no_xdp_tx(&self, iface: &str) -> Option<String> {
        let VethPeer::NoXdp { ifindex, netnsid } = self else {
            return None;
        };
        let ns = match netnsid {
            Some(id) => format!("in the namespace with id {id} (`ip netns list-id`)"),
            None => "in this namespace".into(),
        };
        Some(format!(
            "{iface} is a veth whose peer (ifindex {ifindex} {ns}) runs no XDP program, so \
             the ACKs the XDP responder sends with XDP_TX would be lost; WRITEs take the \
             user path. Give the peer one: `rdma-xdp xdp-pass PEER` in its namespace"
        ))
    }
}

/// Reads `iface`'s link: is it a veth, and does its peer run XDP? Two
/// RTM_GETLINK requests (ours, then the peer's, in its namespace through
/// IFLA_TARGET_NETNSID).
pub fn veth_peer(iface: &str) -> Result<VethPeer> {
    let (fd, me) = own_link(iface)?;
    if me.kind.as_deref() != Some("veth") {
        return Ok(VethPeer::NotVeth);
    }
    let Some(peer) = me.link else {
        bail!("{iface}: veth without IFLA_LINK");
    };
    let other = get_link(fd.as_raw_fd(), peer, me.link_netnsid)
        .with_context(|| format!("RTM_GETLINK of {iface}'s peer (ifindex {peer})"))?;
    Ok(if other.xdp_attached {
        VethPeer::Xdp
    } else {
        VethPeer::NoXdp {
            ifindex: peer,
            netnsid: me.link_netnsid,
        }
    })
}

/// Why frames our XDP program sends with `XDP_TX` on `iface` would be
/// lost (a veth whose peer runs no XDP), or `None` when they leave (a NIC,
/// a peer with XDP, or a link we could not read: then we assume a NIC).
pub fn xdp_tx_problem(iface: &str) -> Option<String> {
    match veth_peer(iface) {
        Ok(p) => p.why_no_xdp_tx(iface),
        Err(e) => {
            log::debug!("{iface}: cannot tell where XDP_TX goes: {e:#}");
            None
        }
    }
}

/// Whether `iface` is a veth with no XDP program of its own: where a
/// pass-through program ([`crate::io::xdp::XdpPass`]) lets `XDP_TX`
/// frames from its peer in.
pub fn is_veth_without_xdp(iface: &str) -> Result<bool> {
    let (_, me) = own_link(iface)?;
    Ok(me.kind.as_deref() == Some("veth") && !me.xdp_attached)
}

/// `iface`'s own link facts, and the rtnetlink socket that read them.
fn own_link(iface: &str) -> Result<(OwnedFd, LinkFacts)> {
    let name = std::ffi::CString::new(iface).context("interface name")?;
    // SAFETY: a NUL-terminated name.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        bail!("interface {iface} not found");
    }
    let fd = nl_socket()
        .ok_or_else(|| anyhow!("rtnetlink socket: {}", std::io::Error::last_os_error()))?;
    let me =
        get_link(fd.as_raw_fd(), index, None).with_context(|| format!("RTM_GETLINK {iface}"))?;
    Ok((fd, me))
}

/// The attributes of an RTM_NEWLINK answer we use.
#[derive(Debug, Default, PartialEq)]
struct LinkFacts {
    kind: Option<String>,
    link: Option<u32>,
    link_netnsid: Option<i32>,
    xdp_attached: bool,
}

fn get_link(fd: i32, index: u32, netnsid: Option<i32>) -> Result<LinkFacts> {
    let mut req = vec![0u8; NLMSG_HDR + IFINFOMSG];
    req[4..6].copy_from_slice(&libc::RTM_GETLINK.to_ne_bytes());
    req[6..8].copy_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    req[8..12].copy_from_slice(&2u32.to_ne_bytes());
    req[NLMSG_HDR] = libc::AF_UNSPEC as u8;
    req[NLMSG_HDR + 4..NLMSG_HDR + 8].copy_from_slice(&index.to_ne_bytes());
    if let Some(id) = netnsid {
        req.extend_from_slice(&8u16.to_ne_bytes());
        req.extend_from_slice(&IFLA_TARGET_NETNSID.to_ne_bytes());
        req.extend_from_slice(&id.to_ne_bytes());
    }
    let len = req.len() as u32;
    req[0..4].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: send our request buffer of its length.
    if unsafe { libc::send(fd, req.as_ptr().cast(), req.len(), 0) } != req.len() as isize {
        bail!("send: {}", std::io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 32 << 10];
    // SAFETY: recv into our buffer of its length.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n <= 0 {
        bail!("recv: {}", std::io::Error::last_os_error());
    }
    parse_newlink(&buf[..n as usize])
}

/// The one RTM_NEWLINK message (or error) answering an RTM_GETLINK.
fn parse_newlink(b: &[u8]) -> Result<LinkFacts> {
    if b.len() < NLMSG_HDR {
        bail!("short netlink answer");
    }
    let len = (u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize).min(b.len());
    let kind = u16::from_ne_bytes([b[4], b[5]]);
    if kind == libc::NLMSG_ERROR as u16 && len >= NLMSG_HDR + 4 {
        let e = i32::from_ne_bytes([b[16], b[17], b[18], b[19]]);
        return Err(std::io::Error::from_raw_os_error(-e).into());
    }
    if kind != libc::RTM_NEWLINK || len < NLMSG_HDR + IFINFOMSG {
        bail!("unexpected netlink answer type {kind}");
    }
    let mut f = LinkFacts::default();
    for (t, d) in nl_attrs(&b[NLMSG_HDR + IFINFOMSG..len]) {
        match t {
            IFLA_LINK if d.len() >= 4 => {
                f.link = Some(u32::from_ne_bytes([d[0], d[1], d[2], d[3]]))
            }
            IFLA_LINK_NETNSID if d.len() >= 4 => {
                f.link_netnsid = Some(i32::from_ne_bytes([d[0], d[1], d[2], d[3]]))
            }
            IFLA_LINKINFO => {
                for (it, id) in nl_attrs(d) {
                    if it == IFLA_INFO_KIND {
                        let s = id.split(|&c| c == 0).next().unwrap_or_default();
                        f.kind = Some(String::from_utf8_lossy(s).into_owned());
                    }
                }
            }
            IFLA_XDP => {
                f.xdp_attached = nl_attrs(d)
                    .any(|(xt, xd)| xt == IFLA_XDP_ATTACHED && xd.first().is_some_and(|&m| m != 0))
            }
            _ => {}
        }
    }
    Ok(f)
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

    fn attr(kind: u16, data: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
        a.extend_from_slice(&kind.to_ne_bytes());
        a.extend_from_slice(data);
        a.resize((a.len() + 3) & !3, 0);
        a
    }

    /// An RTM_NEWLINK as the kernel answers RTM_GETLINK for a veth in
    /// another namespace: nlmsghdr, ifinfomsg, then the attributes
    /// (nested ones flagged NLA_F_NESTED, as the kernel sends IFLA_XDP).
    fn newlink(attrs: &[Vec<u8>]) -> Vec<u8> {
        let mut m = vec![0u8; NLMSG_HDR + IFINFOMSG];
        m[4..6].copy_from_slice(&libc::RTM_NEWLINK.to_ne_bytes());
        for a in attrs {
            m.extend_from_slice(a);
        }
        let len = m.len() as u32;
        m[0..4].copy_from_slice(&len.to_ne_bytes());
        m
    }

    #[test]
    fn a_veths_link_facts_come_from_its_newlink() {
        let info = attr(IFLA_LINKINFO, &attr(IFLA_INFO_KIND, b"veth\0"));
        let m = newlink(&[
            attr(3, b"rt0a\0"),
            attr(IFLA_LINK, &7u32.to_ne_bytes()),
            info.clone(),
            attr(IFLA_LINK_NETNSID, &2i32.to_ne_bytes()),
            attr(IFLA_XDP | 0x8000, &attr(IFLA_XDP_ATTACHED, &[0])),
        ]);
        assert_eq!(
            parse_newlink(&m).unwrap(),
            LinkFacts {
                kind: Some("veth".into()),
                link: Some(7),
                link_netnsid: Some(2),
                xdp_attached: false,
            }
        );
        // XDP_ATTACHED_DRV (1): a program in native mode.
        let m = newlink(&[
            info,
            attr(IFLA_XDP | 0x8000, &attr(IFLA_XDP_ATTACHED, &[1])),
        ]);
        assert!(parse_newlink(&m).unwrap().xdp_attached);
        // A truncated attribute ends the run; nothing past it is read.
        let mut m = newlink(&[attr(IFLA_LINK, &7u32.to_ne_bytes())]);
        m[NLMSG_HDR + IFINFOMSG] = 200;
        assert_eq!(parse_newlink(&m).unwrap(), LinkFacts::default());
    }

    #[test]
    fn a_netlink_error_answer_is_its_errno() {
        let mut m = vec![0u8; NLMSG_HDR + 4];
        m[0..4].copy_from_slice(&20u32.to_ne_bytes());
        m[4..6].copy_from_slice(&(libc::NLMSG_ERROR as u16).to_ne_bytes());
        m[16..20].copy_from_slice(&(-libc::ENODEV).to_ne_bytes());
        let e = parse_newlink(&m).unwrap_err();
        assert_eq!(
            e.downcast_ref::<std::io::Error>()
                .and_then(|e| e.raw_os_error()),
            Some(libc::ENODEV)
        );
        assert!(parse_newlink(&m[..10]).is_err());
    }

    #[test]
    fn a_loopback_is_not_a_veth() {
        // Every namespace has lo; no XDP_TX question arises there.
        assert_eq!(veth_peer("lo").unwrap(), VethPeer::NotVeth);
        assert!(veth_peer("no-such-if0").is_err());
    }
}
