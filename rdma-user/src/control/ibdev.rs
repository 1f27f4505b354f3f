//! A verbs device as rxe shows it for the same interface: its node GUID,
//! its port (state, MTU, link layer Ethernet) and its GID table (RoCE v2),
//! and the sysfs files and device nodes through which programs find it.
//!
//! The drop-in libibverbs answers its queries from here, and `rdma-xdp
//! exec` writes the same facts as files (`write_sysfs`) into a private
//! mount namespace, because engines find devices by reading sysfs and
//! `/dev/infiniband` themselves: UCX lists a device only if
//! `/dev/infiniband/<dev_name>` is a character device it may open, and
//! reads GID types and netdevs from `ports/1/gid_attrs`; hwloc and
//! libfabric read the device directories.

use std::fmt::Write as _;
use std::io;
use std::net::IpAddr;
use std::path::Path;

use crate::control::links::Link;
use crate::io::hostnet::{iface_addrs, iface_mac, iface_mtu, port_mtu};

/// GID table length, as rxe's (`RXE_PORT_GID_TBL_LEN`).
pub const GID_TBL_LEN: usize = 1024;

/// The uverbs ABI rdma-core expects of `/sys/class/infiniband_verbs`.
pub const UVERBS_ABI: u32 = 6;
/// The rdma_cm (ucma) ABI librdmacm expects.
pub const UCMA_ABI: u32 = 4;

/// The node GUID for a MAC: its EUI-64 (as rxe's); also the CM's CA GUID.
pub fn eui64(mac: [u8; 6]) -> [u8; 8] {
    [
        mac[0] ^ 2,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ]
}

/// The node GUID of the device on `netdev` (zero if it has no MAC).
pub fn node_guid(netdev: &str) -> [u8; 8] {
    iface_mac(netdev).map(eui64).unwrap_or_default()
}

/// The GID table: 0 the link-local GID from the MAC, then each IPv4
/// address mapped (::ffff:a.b.c.d), then each global IPv6 address. Every
/// entry is RoCE v2, as rxe's.
pub fn gid_table(netdev: &str) -> Vec<[u8; 16]> {
    let mut v = Vec::new();
    if let Ok(mac) = iface_mac(netdev) {
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        g[8..].copy_from_slice(&eui64(mac));
        v.push(g);
    }
    let addrs = iface_addrs(netdev).unwrap_or_default();
    for a in addrs.iter().filter(|a| a.is_ipv4()) {
        v.push(crate::wire::gid_of(*a));
    }
    for a in &addrs {
        if let IpAddr::V6(a6) = a {
            v.push(a6.octets());
        }
    }
    v
}

/// Whether the port is active: its interface is up (operstate up, or
/// unknown as on some virtual links).
pub fn port_active(netdev: &str) -> bool {
    let s =
        std::fs::read_to_string(format!("/sys/class/net/{netdev}/operstate")).unwrap_or_default();
    matches!(s.trim(), "up" | "unknown")
}

/// The active IB MTU in bytes for the interface's MTU (rxe's rule).
pub fn active_mtu(netdev: &str) -> u32 {
    port_mtu(iface_mtu(netdev))
}

/// The device node name of the `i`-th device (`uverbs0`, ...), as the
/// kernel names uverbs devices; `ibv_device.dev_name`.
pub fn uverbs_name(i: usize) -> String {
    format!("uverbs{i}")
}

/// The kernel's `%pI6` form of a GID: eight groups of four hex digits.
fn gid_text(g: &[u8; 16]) -> String {
    let mut s = String::with_capacity(39);
    for (i, pair) in g.chunks(2).enumerate() {
        if i > 0 {
            s.push(':');
        }
        let _ = write!(s, "{:02x}{:02x}", pair[0], pair[1]);
    }
    s
}

fn guid_text(g: [u8; 8]) -> String {
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]
    )
}

fn put(dir: &Path, name: &str, text: &str) -> io::Result<()> {
    std::fs::write(dir.join(name), format!("{text}\n"))
}

/// Writes, under `class` (a directory standing for `/sys/class`), the
/// files of the `infiniband`, `infiniband_verbs` and `infiniband_ucma`
/// classes for `links`, with the values rxe shows for the same interfaces.
/// The `i`-th link is `uverbs<i>`.
pub fn write_sysfs(class: &Path, links: &[Link], fw_ver: &str) -> io::Result<()> {
    let ib = class.join("infiniband");
    let verbs = class.join("infiniband_verbs");
    let ucma = class.join("infiniband_ucma");
    for d in [&ib, &verbs, &ucma] {
        std::fs::create_dir_all(d)?;
    }
    put(&verbs, "abi_version", &UVERBS_ABI.to_string())?;
    put(&ucma, "abi_version", &UCMA_ABI.to_string())?;
    for (i, l) in links.iter().enumerate() {
        let u = verbs.join(uverbs_name(i));
        std::fs::create_dir_all(&u)?;
        put(&u, "ibdev", &l.name)?;
        put(&u, "abi_version", "1")?;
        // The uverbs major and its first minor (231:192).
        put(&u, "dev", &format!("231:{}", 192 + i))?;
        write_device(&ib.join(&l.name), l, fw_ver)?;
    }
    Ok(())
}

/// One device's directory: node attributes and port 1.
fn write_device(dir: &Path, l: &Link, fw_ver: &str) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let guid = guid_text(node_guid(&l.netdev));
    put(dir, "node_type", "1: CA")?;
    put(dir, "node_guid", &guid)?;
    put(dir, "sys_image_guid", &guid)?;
    put(dir, "fw_ver", fw_ver)?;
    put(dir, "node_desc", &format!("rdma-xdp {}", l.netdev))?;
    let port = dir.join("ports/1");
    for sub in ["gids", "gid_attrs/types", "gid_attrs/ndevs", "pkeys"] {
        std::fs::create_dir_all(port.join(sub))?;
    }
    let up = port_active(&l.netdev);
    put(&port, "state", if up { "4: ACTIVE" } else { "1: DOWN" })?;
    put(
        &port,
        "phys_state",
        if up { "5: LinkUp" } else { "3: Disabled" },
    )?;
    // What ibv_query_port says: width 1X, speed SDR.
    put(&port, "rate", "2.5 Gb/sec (1X SDR)")?;
    put(&port, "lid", "0x0")?;
    put(&port, "sm_lid", "0x0")?;
    put(&port, "sm_sl", "0")?;
    put(&port, "lid_mask_count", "0")?;
    // IB_PORT_CM_SUP, as ibv_query_port's port_cap_flags.
    put(&port, "cap_mask", "0x00010000")?;
    put(&port, "link_layer", "Ethernet")?;
    put(&port.join("pkeys"), "0", "0xffff")?;
    let gids = gid_table(&l.netdev);
    let zero = gid_text(&[0; 16]);
    for i in 0..GID_TBL_LEN {
        let name = i.to_string();
        match gids.get(i) {
            Some(g) => {
                put(&port.join("gids"), &name, &gid_text(g))?;
                put(&port.join("gid_attrs/types"), &name, "RoCE v2")?;
                put(&port.join("gid_attrs/ndevs"), &name, &l.netdev)?;
            }
            // The kernel shows an empty entry as zeros and refuses to
            // read its attributes; a missing file is the nearest.
            None => put(&port.join("gids"), &name, &zero)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_and_guid_text_as_the_kernel_prints_them() {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[10, 0, 0, 1]);
        assert_eq!(gid_text(&g), "0000:0000:0000:0000:0000:ffff:0a00:0001");
        assert_eq!(
            guid_text(eui64([0x02, 0x11, 0x22, 0x33, 0x44, 0x55])),
            "0011:22ff:fe33:4455"
        );
    }

    #[test]
    fn sysfs_tree_of_a_missing_interface() {
        // An interface that does not exist: the tree is still complete,
        // with the port down and only zero GIDs.
        let dir = std::env::temp_dir().join(format!("ibdev-test-{}", std::process::id()));
        let links = [Link {
            name: "rxe0".into(),
            netdev: "nosuch0".into(),
        }];
        write_sysfs(&dir, &links, "1.2.3").unwrap();
        let read = |p: &str| std::fs::read_to_string(dir.join(p)).unwrap();
        assert_eq!(read("infiniband_verbs/abi_version"), "6\n");
        assert_eq!(read("infiniband_verbs/uverbs0/ibdev"), "rxe0\n");
        assert_eq!(read("infiniband_ucma/abi_version"), "4\n");
        assert_eq!(read("infiniband/rxe0/node_type"), "1: CA\n");
        assert_eq!(read("infiniband/rxe0/fw_ver"), "1.2.3\n");
        assert_eq!(read("infiniband/rxe0/ports/1/state"), "1: DOWN\n");
        assert_eq!(read("infiniband/rxe0/ports/1/link_layer"), "Ethernet\n");
        assert_eq!(
            read("infiniband/rxe0/ports/1/gids/1023"),
            "0000:0000:0000:0000:0000:0000:0000:0000\n"
        );
        assert!(!dir
            .join("infiniband/rxe0/ports/1/gid_attrs/types/0")
            .exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
