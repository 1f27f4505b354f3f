//! Linux soft-RoCE peers for interop tests: small QEMU VMs running Debian's
//! kernel with `rdma_rxe`, rdma-core, perftest, rdmacm-utils, iproute2 and
//! tcpdump, on a bridge inside a private network namespace.
//!
//! - [`image`] builds the kernel + initramfs from Debian packages into a
//!   cache with a version stamp (rebuilt only when a package or the recipe
//!   changes) and unpacks QEMU privately next to it.
//! - [`Lab`] boots VMs on the bridge (KVM where it works, TCG otherwise),
//!   runs commands in them through the QEMU guest agent with time-outs,
//!   captures on the bridge, reads rxe's counters, and removes everything
//!   it made when dropped, on failure too.
//!
//! Nothing here sends traffic outside the namespace; every address lives in
//! it. It never installs QEMU system-wide (Debian's qemu-system-x86 would
//! replace the newer qemu-utils of this machine image).

mod agent;
mod cpio;
pub mod image;
mod lab;
mod proc;

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

pub use agent::{Agent, GuestOutput};
pub use image::Image;
pub use lab::{stop_all, Capture, GuestJob, Lab};
pub use proc::{run_bounded, stop_running, Bounded};

/// For an interrupt (Ctrl-C) handler, where no destructor runs: kills the
/// running host commands' process groups, then every VM and capture of the
/// run directory, and deletes the namespace.
pub fn interrupted(settings: &Settings) {
    stop_running();
    stop_all(settings);
}

/// What went wrong, in one line a user can act on.
#[derive(Debug)]
pub enum Error {
    /// A prerequisite cannot be had here (no apt source for a package, not
    /// root, no /dev/net/tun): the run cannot start.
    Prerequisite(String),
    /// A host command failed.
    Command { what: String, detail: String },
    /// A file or socket operation failed.
    Io { what: String, err: std::io::Error },
    /// The guest agent or a guest did not behave.
    Guest(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Prerequisite(s) => write!(f, "prerequisite missing: {s}"),
            Error::Command { what, detail } => write!(f, "{what}: {detail}"),
            Error::Io { what, err } => write!(f, "{what}: {err}"),
            Error::Guest(s) => write!(f, "{s}"),
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// Wraps an io::Error with what was being done.
pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |err| Error::Io { what, err }
}

/// The private network: one namespace holding the bridge, the VMs' taps and
/// the host's endpoint. Fixed names and addresses so that captures, GIDs and
/// test expectations are the same on every run.
pub mod net {
    /// The namespace everything lives in.
    pub const NETNS: &str = "rxevm";
    /// The bridge joining the VMs and the host endpoint (capture point).
    pub const BRIDGE: &str = "rxebr0";
    /// The host's end of its veth pair: programs under test bind here and
    /// XDP attaches here.
    pub const HOST_IF: &str = "rxehost0";
    /// The other end of `HOST_IF`, a bridge port.
    pub const HOST_PORT: &str = "rxehost0p";
    pub const HOST_IP: &str = "10.99.0.1";
    pub const HOST_IP6: &str = "fd99::1";
    /// The netdev MTU: rxe's active MTU is then 1024.
    pub const MTU: u32 = 1500;
}

/// One VM, `a`..`h`. VM n has 10.99.0.(n+2), fd99::(n+2) and MAC
/// 52:54:00:99:00:0(n+2); its GIDs are therefore fixed too: index 0 the
/// link-local fe80::5054:ff:fe99:(n+2), 1 ::ffff:10.99.0.(n+2), 2 fd99::(n+2),
/// all RoCE v2.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VmId(u8);

impl VmId {
    pub const A: VmId = VmId(0);
    pub const B: VmId = VmId(1);

    pub fn parse(s: &str) -> Option<VmId> {
        match s.as_bytes() {
            [c @ b'a'..=b'h'] => Some(VmId(c - b'a')),
            _ => None,
        }
    }

    pub fn name(self) -> char {
        (b'a' + self.0) as char
    }

    fn host_part(self) -> u8 {
        self.0 + 2
    }

    pub fn ip(self) -> String {
        format!("10.99.0.{}", self.host_part())
    }

    pub fn ip6(self) -> String {
        format!("fd99::{:x}", self.host_part())
    }

    pub fn mac(self) -> String {
        format!("52:54:00:99:00:{:02x}", self.host_part())
    }

    /// Its tap device in the namespace.
    pub fn tap(self) -> String {
        format!("rxetap-{}", self.name())
    }
}

impl fmt::Display for VmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name())
    }
}

/// How to run the VMs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accel {
    /// KVM if the image's probe booted under it, else TCG.
    Auto,
    Kvm,
    Tcg,
}

/// Where the cache and the run state live, and the VM's size. Defaults,
/// each overridable by an environment variable: `RXEVM_CACHE`
/// (/var/cache/rdma-xdp/rxevm), `RXEVM_RUN` (/run/rdma-xdp/rxevm),
/// `RXEVM_ACCEL` (auto | kvm | tcg), `RXEVM_MEM` (MiB, 512),
/// `RXEVM_BOOT_TIMEOUT` (seconds, 240).
#[derive(Clone, Debug)]
pub struct Settings {
    pub cache: PathBuf,
    pub run: PathBuf,
    pub accel: Accel,
    pub mem_mib: u32,
    pub boot_timeout: Duration,
    /// virtio-net queue pairs per VM (`RXEVM_QUEUES`, default 1). With 2,
    /// the tap is multi-queue and RSS spreads flows over two queues. The
    /// guest's XDP still shares TX queues with the stack (locked mode:
    /// virtio-net wants one XDP TX queue per CPU beyond the stack's pairs,
    /// and says so in dmesg).
    pub queues: u32,
    /// vCPUs per VM (`RXEVM_CPUS`, default: one per queue pair).
    pub cpus: u32,
    /// Another Debian kernel package for the guests (`RXEVM_KERNEL_DEB`, a
    /// path), e.g. a backports kernel for AF_XDP zero-copy on virtio-net.
    pub kernel_deb: Option<PathBuf>,
}

impl Settings {
    pub fn from_env() -> Result<Settings> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let accel = match var("RXEVM_ACCEL").as_deref() {
            None | Some("auto") => Accel::Auto,
            Some("kvm") => Accel::Kvm,
            Some("tcg") => Accel::Tcg,
            Some(o) => {
                return Err(Error::Prerequisite(format!(
                    "RXEVM_ACCEL={o}: use auto, kvm or tcg"
                )))
            }
        };
        let num = |k: &str, d: u64| -> Result<u64> {
            match var(k) {
                None => Ok(d),
                Some(v) => v
                    .parse()
                    .map_err(|_| Error::Prerequisite(format!("{k}={v}: want a number"))),
            }
        };
        Ok(Settings {
            cache: var("RXEVM_CACHE")
                .unwrap_or_else(|| "/var/cache/rdma-xdp/rxevm".into())
                .into(),
            run: var("RXEVM_RUN")
                .unwrap_or_else(|| "/run/rdma-xdp/rxevm".into())
                .into(),
            accel,
            mem_mib: num("RXEVM_MEM", 512)? as u32,
            boot_timeout: Duration::from_secs(num("RXEVM_BOOT_TIMEOUT", 240)?),
            queues: num("RXEVM_QUEUES", 1)?.clamp(1, 8) as u32,
            cpus: num("RXEVM_CPUS", 0)?.min(8) as u32,
            kernel_deb: var("RXEVM_KERNEL_DEB").map(PathBuf::from),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_addresses_are_fixed() {
        let b = VmId::parse("b").unwrap();
        assert_eq!(b, VmId::B);
        assert_eq!(b.ip(), "10.99.0.3");
        assert_eq!(b.ip6(), "fd99::3");
        assert_eq!(b.mac(), "52:54:00:99:00:03");
        assert_eq!(b.tap(), "rxetap-b");
        assert_eq!(VmId::parse("h").unwrap().ip(), "10.99.0.9");
        assert!(VmId::parse("i").is_none());
        assert!(VmId::parse("ab").is_none());
    }
}
