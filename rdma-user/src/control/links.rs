//! RDMA links: which interfaces of this network namespace are verbs
//! devices, as `rdma link add rxe0 type rxe netdev eth0` makes them for rxe.
//! The table lives in the namespace's run directory (`links.json`), so that
//! `rdma-xdp link add/show/del` and the drop-in libibverbs see the same list.
//!
//! With nothing added, every interface that is up, not loopback and has an
//! Ethernet address is a device named `xdp_<interface>`: a program then runs
//! on a fresh namespace without setup, as on a host with one NIC.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::io::hostnet::run_dir;

/// One device: its verbs name and the interface it runs on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub name: String,
    pub netdev: String,
}

/// rdma-core's limit for a device name (IBV_SYSFS_NAME_MAX, with the NUL).
const NAME_MAX: usize = 63;

fn table() -> PathBuf {
    run_dir().join("links.json")
}

/// The links added in this namespace (empty if none). A link whose
/// interface is gone is gone too, as an rxe link goes with its netdev:
/// the table outlives the interface, and a later namespace may even get
/// the same id (and so the same table).
pub fn added() -> Result<Vec<Link>> {
    let all: Vec<Link> = match std::fs::read_to_string(table()) {
        Ok(s) => {
            serde_json::from_str(&s).with_context(|| format!("{} is damaged", table().display()))?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("read {}", table().display())),
    };
    let live: Vec<Link> = all
        .iter()
        .filter(|l| netdev_exists(&l.netdev))
        .cloned()
        .collect();
    if live.len() != all.len() {
        // Best effort: a reader without write access still sees the truth.
        let _ = save(&live);
    }
    Ok(live)
}

/// Whether this network namespace has an interface `netdev`.
fn netdev_exists(netdev: &str) -> bool {
    std::path::Path::new(&format!("/sys/class/net/{netdev}")).exists()
}

fn save(links: &[Link]) -> Result<()> {
    let p = table();
    std::fs::create_dir_all(run_dir())
        .with_context(|| format!("create {}", run_dir().display()))?;
    let tmp = p.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(links)?)?;
    std::fs::rename(&tmp, &p).with_context(|| format!("write {}", p.display()))
}

/// Interfaces that are up, not loopback, with an Ethernet address.
pub fn default_netdevs() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().to_string())
                .filter(|n| {
                    let attr = |a: &str| {
                        std::fs::read_to_string(format!("/sys/class/net/{n}/{a}"))
                            .unwrap_or_default()
                    };
                    let flags =
                        u32::from_str_radix(attr("flags").trim().trim_start_matches("0x"), 16)
                            .unwrap_or(0);
                    // ARPHRD_ETHER, IFF_UP, not IFF_LOOPBACK.
                    attr("type").trim() == "1" && flags & 1 != 0 && flags & 8 == 0
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Set by `rdma-xdp exec --iface IF`: the program sees only IF's device.
pub const IFACE_ENV: &str = "RDMA_XDP_IFACE";

fn default_link(netdev: String) -> Link {
    Link {
        name: format!("xdp_{netdev}"),
        netdev,
    }
}

/// The devices programs see: the added links, or the default ones; only
/// the one on `RDMA_XDP_IFACE` when that is set.
pub fn effective() -> Result<Vec<Link>> {
    let a = added()?;
    if let Some(i) = std::env::var(IFACE_ENV).ok().filter(|i| !i.is_empty()) {
        return Ok(vec![a
            .into_iter()
            .find(|l| l.netdev == i)
            .unwrap_or_else(|| default_link(i))]);
    }
    if !a.is_empty() {
        return Ok(a);
    }
    Ok(default_netdevs().into_iter().map(default_link).collect())
}

/// Adds a link; the name must be new and the interface must exist.
pub fn add(name: &str, netdev: &str) -> Result<Link> {
    if name.is_empty()
        || name.len() > NAME_MAX
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        bail!("link name {name:?}: use 1 to {NAME_MAX} letters, digits, '_' or '-' (e.g. rxe0)");
    }
    if !netdev_exists(netdev) {
        bail!("interface {netdev} not found in this network namespace; check `ip link`");
    }
    let mut links = added()?;
    if let Some(l) = links.iter().find(|l| l.name == name) {
        bail!(
            "link {name} already exists (on {}); remove it with `rdma-xdp link del {name}`",
            l.netdev
        );
    }
    if let Some(l) = links.iter().find(|l| l.netdev == netdev) {
        bail!("interface {netdev} is already link {}", l.name);
    }
    let l = Link {
        name: name.into(),
        netdev: netdev.into(),
    };
    links.push(l.clone());
    save(&links)?;
    Ok(l)
}

/// Removes a link by name.
pub fn del(name: &str) -> Result<()> {
    let mut links = added()?;
    let before = links.len();
    links.retain(|l| l.name != name);
    if links.len() == before {
        bail!("no link {name}; `rdma-xdp link show` lists them");
    }
    save(&links)
}
