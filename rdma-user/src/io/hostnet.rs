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

fn lookup_neigh(iface: &str, ip: IpAddr) -> Option<[u8; 6]> {
    let out = std::process::Command::new("ip")
        .args(["neigh", "show", &ip.to_string(), "dev", iface])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text.split_whitespace();
    while let Some(w) = it.next() {
        if w == "lladdr" {
            return it.next().and_then(|m| parse_mac(m).ok());
        }
    }
    None
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
