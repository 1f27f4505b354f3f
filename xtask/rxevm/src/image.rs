//! The VM image, from Debian packages only, cached with a version stamp.
//!
//! - QEMU: `apt-get download` of qemu-system-x86 and friends, unpacked into
//!   `CACHE/qemu` (never installed system-wide); only the shared libraries
//!   it links are installed.
//! - The kernel: Debian's linux-image-6.12 (it has `rdma_rxe` as a module;
//!   bookworm's 6.1 metapackage is older), unpacked to take `vmlinuz` and
//!   the modules the guest loads.
//! - User space: Debian's dynamic busybox as init and shell, and the
//!   binaries of rdma-core (libibverbs, librdmacm, the rxe provider),
//!   ibverbs-utils, rdmacm-utils, perftest, qperf, UCX's `ucx_perftest`
//!   (with its verbs transports), iproute2, tcpdump and qemu-guest-agent
//!   with every library `ldd` names, copied from the packages installed on
//!   the host.
//!
//! All of it goes into one initramfs (a RAM disk: nothing persists between
//! boots). The stamp covers the package versions, the module list and the
//! bytes of the user-space tree (so a changed package or a changed guest
//! script rebuilds, nothing else does).

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::cpio::Tree;
use crate::proc::must;
use crate::{io_err, Error, Result, Settings};

/// Bump when the image changes in a way the stamp does not see (none known).
const RECIPE: u32 = 1;

/// The kernel metapackage; resolved to the concrete linux-image-<version>.
const KERNEL_META: &str = "linux-image-6.12-amd64";

/// Installed on the host: the guest's binaries are copied from these, and
/// the host needs depmod (kmod), xz and tcpdump itself.
const HOST_PKGS: [&str; 10] = [
    "kmod",
    "xz-utils",
    "iproute2",
    "tcpdump",
    "ibverbs-utils",
    "ibverbs-providers",
    "rdmacm-utils",
    "perftest",
    "qperf",
    "ucx-utils",
];

/// Every program these packages put in a bin directory goes into the guest.
const GUEST_TOOL_PKGS: [&str; 3] = ["ibverbs-utils", "rdmacm-utils", "perftest"];

/// And these single programs, found in their package's file list.
const GUEST_PROGRAMS: [(&str, &str); 6] = [
    ("iproute2", "ip"),
    ("iproute2", "rdma"),
    ("iproute2", "ss"),
    ("tcpdump", "tcpdump"),
    ("qperf", "qperf"),
    ("ucx-utils", "ucx_perftest"),
];

/// Libraries programs open at run time, which `ldd` cannot see: the rxe
/// verbs provider, libgcc_s that glibc loads for pthread_cancel (rping),
/// and UCX's verbs transports (its modules beside libucs).
const GUEST_DLOPENED: [&str; 3] = [
    "/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so",
    "/usr/lib/x86_64-linux-gnu/libgcc_s.so.1",
    "/usr/lib/x86_64-linux-gnu/ucx/libuct_ib.so.0",
];

/// Unpacked into `CACHE/qemu`. ipxe-qemu is left out: the NIC is started
/// with `romfile=` (no network boot ROM).
const QEMU_PKGS: [&str; 5] = [
    "qemu-system-x86",
    "qemu-system-common",
    "qemu-system-data",
    "seabios",
    "qemu-guest-agent",
];

/// Kernel modules the guest loads, in this order, after their dependencies.
/// crc32: rxe's ICRC; configfs: rdma_cm's; rdma_ucm: librdmacm.
/// (crc32_pclmul is left out: the emulated CPU has no PCLMULQDQ.)
const MODULES: [&str; 7] = [
    "virtio_net",
    "crc32_generic",
    "configfs",
    "rdma_rxe",
    "ib_uverbs",
    "ib_umad",
    "rdma_ucm",
];

/// The guest's busybox init table: the sysinit script sets the VM up, the
/// guest agent is restarted whenever it exits.
const INITTAB: &str = "\
::sysinit:/etc/rxevm/rc
::respawn:/etc/rxevm/agent
::ctrlaltdel:/sbin/poweroff
";

/// Sysinit: file systems, modules, eth0's addresses (from the kernel command
/// line), then rxe0 on eth0. Prints markers the host waits for.
const RC: &str = r#"#!/bin/sh
export PATH=/usr/local/bin:/usr/sbin:/usr/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=755 tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /tmp
NAME=x IP= IP6= MTU=1500 PROBE=
for kv in $(cat /proc/cmdline); do
  case "$kv" in
    rxevm.name=*) NAME=${kv#*=} ;;
    rxevm.ip=*) IP=${kv#*=} ;;
    rxevm.ip6=*) IP6=${kv#*=} ;;
    rxevm.mtu=*) MTU=${kv#*=} ;;
    rxevm.probe=*) PROBE=1 ;;
  esac
done
hostname "rxevm-$NAME"
KV=$(uname -r)
for m in $(cat /etc/rxevm/modules); do
  insmod "/lib/modules/$KV/$m" || echo "rxevm: insmod $m failed"
done
mount -t configfs configfs /sys/kernel/config 2>/dev/null
if [ -n "$PROBE" ]; then
  echo "RXEVM-PROBE-OK"
  poweroff -f
fi
ip link set lo up
for k in accept_ra router_solicitations accept_dad; do
  echo 0 >/proc/sys/net/ipv6/conf/default/$k
  echo 0 >/proc/sys/net/ipv6/conf/eth0/$k
done
ip link set eth0 mtu "$MTU" up
[ -n "$IP" ] && ip addr add "$IP" dev eth0
[ -n "$IP6" ] && ip -6 addr add "$IP6" dev eth0 nodad
rdma link add rxe0 type rxe netdev eth0 || echo "rxevm: rdma link add failed"
echo "RXEVM-READY $NAME $(cut -d' ' -f1 /proc/uptime)"
"#;

/// Runs qemu-ga on the virtio-serial port named for it.
const AGENT: &str = r#"#!/bin/sh
export PATH=/usr/local/bin:/usr/sbin:/usr/bin HOME=/root
dev=
for d in /sys/class/virtio-ports/*; do
  [ "$(cat "$d/name" 2>/dev/null)" = org.qemu.guest_agent.0 ] && dev=/dev/${d##*/}
done
[ -n "$dev" ] && [ -e "$dev" ] || { sleep 1; exit 1; }
mkdir -p /run/qga
cd /root
exec /usr/sbin/qemu-ga -m virtio-serial -p "$dev" -t /run/qga </dev/null >>/run/qga/log 2>&1
"#;

/// The non-empty GIDs of rxe0 port 1: INDEX GID TYPE (builtins only: the
/// table has many entries and a fork each is slow under emulation).
const RXE_GIDS: &str = r#"#!/bin/sh
d=/sys/class/infiniband/${1:-rxe0}/ports/1
i=0
while [ -e "$d/gids/$i" ]; do
  read -r gid <"$d/gids/$i" 2>/dev/null || gid=
  if [ -n "$gid" ] && [ "$gid" != 0000:0000:0000:0000:0000:0000:0000:0000 ]; then
    read -r typ <"$d/gid_attrs/types/$i" 2>/dev/null || typ=?
    echo "$i $gid $typ"
  fi
  i=$((i + 1))
done
"#;

const ETC: [(&str, &str); 6] = [
    ("/etc/passwd", "root:x:0:0:root:/root:/bin/sh\ntcpdump:x:100:100::/nonexistent:/bin/false\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"),
    ("/etc/group", "root:x:0:\ntcpdump:x:100:\nnogroup:x:65534:\n"),
    ("/etc/nsswitch.conf", "passwd: files\ngroup: files\nhosts: files\nservices: files\nprotocols: files\n"),
    ("/etc/hosts", "127.0.0.1 localhost\n10.99.0.1 host\n10.99.0.2 rxevm-a\n10.99.0.3 rxevm-b\n"),
    ("/etc/profile", "export PATH=/usr/local/bin:/usr/sbin:/usr/bin HOME=/root\n"),
    ("/etc/libibverbs.d/rxe.driver", "driver rxe\n"),
];

/// The private QEMU.
#[derive(Clone, Debug)]
pub struct Qemu {
    root: PathBuf,
}

impl Qemu {
    pub fn bin(&self) -> PathBuf {
        self.root.join("usr/bin/qemu-system-x86_64")
    }

    /// `qemu-system-x86_64` with its firmware and module directories set,
    /// run through `prefix` (e.g. `ip netns exec NS`).
    pub fn command(&self, prefix: &[&str]) -> Command {
        let mut c = match prefix.split_first() {
            Some((p, rest)) => {
                let mut c = Command::new(p);
                c.args(rest).arg(self.bin());
                c
            }
            None => Command::new(self.bin()),
        };
        c.env(
            "QEMU_MODULE_DIR",
            self.root.join("usr/lib/x86_64-linux-gnu/qemu"),
        )
        .arg("-L")
        .arg(self.root.join("usr/share/seabios"))
        .arg("-L")
        .arg(self.root.join("usr/share/qemu"));
        c
    }
}

/// A built image: what to boot, with what, and how.
#[derive(Clone, Debug)]
pub struct Image {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub qemu: Qemu,
    /// The probe booted this image under KVM.
    pub kvm_works: bool,
    /// Package versions and sizes, one per line.
    pub versions: String,
    /// Built (or rebuilt) by this call rather than taken from the cache.
    pub rebuilt: bool,
}

fn dpkg_version(pkg: &str) -> Option<String> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f", "${db:Status-Status} ${Version}", pkg])
        .output()
        .ok()?;
    let s = String::from_utf8_lossy(&out.stdout).to_string();
    s.strip_prefix("installed ").map(str::to_string)
}

/// apt's candidate version of each package (one `apt-cache policy` call:
/// it takes most of a second per call).
fn candidates(pkgs: &[String]) -> Vec<(String, Option<String>)> {
    let text = Command::new("apt-cache")
        .arg("policy")
        .args(pkgs)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let mut found = std::collections::BTreeMap::new();
    let mut current = None;
    for l in text.lines() {
        if let Some(name) = l.strip_suffix(':').filter(|_| !l.starts_with(' ')) {
            current = Some(name.to_string());
        } else if let (Some(c), Some(v)) = (&current, l.trim().strip_prefix("Candidate: ")) {
            if v != "(none)" {
                found.insert(c.clone(), v.to_string());
            }
        }
    }
    pkgs.iter()
        .map(|p| (p.clone(), found.get(p).cloned()))
        .collect()
}

fn apt_update() -> Result<()> {
    must(
        Command::new("apt-get").args(["update", "-q"]),
        "apt-get update",
    )?;
    Ok(())
}

/// Installs whichever of `pkgs` is missing (apt lists refreshed once if the
/// first try fails).
fn ensure_installed(pkgs: &[String], log: &dyn Fn(&str)) -> Result<()> {
    let missing: Vec<&String> = pkgs.iter().filter(|p| dpkg_version(p).is_none()).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let list: Vec<&str> = missing.iter().map(|s| s.as_str()).collect();
    log(&format!("installing {}", list.join(" ")));
    let install = || {
        must(
            Command::new("apt-get")
                .args(["install", "-y", "-q", "--no-install-recommends"])
                .args(&list)
                .env("DEBIAN_FRONTEND", "noninteractive"),
            &format!("apt-get install {}", list.join(" ")),
        )
    };
    if install().is_err() {
        apt_update()?;
        install()?;
    }
    Ok(())
}

/// The .deb of `pkg` at `version` in `dir`, downloaded if not there yet.
fn deb(dir: &Path, pkg: &str, version: &str) -> Result<PathBuf> {
    let file = dir.join(format!("{pkg}_{}.deb", version.replace(':', "%3a")));
    if file.exists() {
        return Ok(file);
    }
    let tmp = dir.join(format!(".download-{pkg}"));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp).map_err(io_err(format!("create {}", tmp.display())))?;
    must(
        Command::new("apt-get").current_dir(&tmp).args([
            "download",
            "-q",
            &format!("{pkg}={version}"),
        ]),
        &format!("apt-get download {pkg}={version}"),
    )?;
    let got = fs::read_dir(&tmp)
        .map_err(io_err("list the download"))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or_else(|| Error::Command {
            what: format!("apt-get download {pkg}"),
            detail: "no .deb arrived".into(),
        })?;
    fs::rename(&got, &file).map_err(io_err("keep the .deb"))?;
    let _ = fs::remove_dir_all(&tmp);
    Ok(file)
}

fn unpack(deb: &Path, into: &Path) -> Result<()> {
    must(
        Command::new("dpkg-deb").arg("-x").arg(deb).arg(into),
        &format!("unpack {}", deb.display()),
    )?;
    Ok(())
}

/// The package names a .deb depends on (first alternative of each).
fn depends(deb: &Path) -> Result<Vec<String>> {
    let out = must(
        Command::new("dpkg-deb")
            .args(["-f"])
            .arg(deb)
            .arg("Depends"),
        "read Depends",
    )?;
    Ok(String::from_utf8_lossy(&out)
        .split(',')
        .filter_map(|d| d.split('|').next())
        .filter_map(|d| d.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

/// Absolute symlinks inside an unpacked tree point into the host's /usr:
/// re-point them into the tree.
fn relink_absolute(root: &Path) -> Result<()> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).map_err(io_err(format!("read {}", d.display())))? {
            let p = e.map_err(io_err("read dir"))?.path();
            let m = fs::symlink_metadata(&p).map_err(io_err("stat"))?;
            if m.is_dir() {
                stack.push(p);
            } else if m.file_type().is_symlink() {
                let t = fs::read_link(&p).map_err(io_err("readlink"))?;
                if t.is_absolute() {
                    let inside = root.join(t.strip_prefix("/").unwrap_or(&t));
                    fs::remove_file(&p).map_err(io_err("relink"))?;
                    std::os::unix::fs::symlink(inside, &p).map_err(io_err("relink"))?;
                }
            }
        }
    }
    Ok(())
}

/// Guest path for a host path: Debian merged /bin, /sbin and /lib into
/// /usr, and so does the guest (its /bin, /sbin, /lib, /lib64 are links).
fn guest_path(host: &str) -> String {
    for d in ["/bin/", "/sbin/", "/lib/", "/lib64/"] {
        if let Some(rest) = host.strip_prefix(d) {
            return format!("/usr{d}{rest}");
        }
    }
    host.to_string()
}

/// The shared libraries `ldd` lists for `file` (the loader included).
fn ldd(file: &Path) -> Result<Vec<String>> {
    let out = Command::new("ldd")
        .arg(file)
        .output()
        .map_err(io_err("run ldd"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut libs = Vec::new();
    for l in text.lines() {
        if l.contains("not found") {
            return Err(Error::Command {
                what: format!("ldd {}", file.display()),
                detail: l.trim().into(),
            });
        }
        let path = match l.split_once("=>") {
            Some((_, r)) => r.split_whitespace().next(),
            None => l.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(p.to_string());
        }
    }
    Ok(libs)
}

/// Copies a host program or library (dereferenced) and every library it
/// needs into the tree.
fn add_with_libs(tree: &mut Tree, host: &Path, guest: &str) -> Result<()> {
    let data = fs::read(host).map_err(io_err(format!("read {}", host.display())))?;
    let mode = fs::metadata(host).map_err(io_err("stat"))?.mode() & 0o777;
    tree.file(guest, data, mode);
    for lib in ldd(host)? {
        let g = guest_path(&lib);
        if !tree.contains(&g) {
            let data = fs::read(&lib).map_err(io_err(format!("read {lib}")))?;
            tree.file(&g, data, 0o755);
        }
    }
    Ok(())
}

fn dpkg_files(pkg: &str) -> Result<Vec<String>> {
    let out = must(Command::new("dpkg").args(["-L", pkg]), "dpkg -L")?;
    Ok(String::from_utf8_lossy(&out)
        .lines()
        .map(str::to_string)
        .collect())
}

fn is_bin(p: &str) -> bool {
    ["/usr/bin/", "/usr/sbin/", "/bin/", "/sbin/"]
        .iter()
        .any(|d| p.strip_prefix(d).is_some_and(|n| !n.contains('/')))
}

/// The user-space part of the guest: everything but kernel modules.
fn userspace(busybox: &Path, qemu: &Path) -> Result<Tree> {
    let mut t = Tree::default();
    for d in [
        "/usr/bin",
        "/usr/sbin",
        "/usr/lib",
        "/usr/lib64",
        "/proc",
        "/sys",
        "/dev",
        "/run",
        "/tmp",
        "/root",
        "/var",
        "/usr/local/bin",
    ] {
        t.dir(d);
    }
    for (l, target) in [
        ("/bin", "usr/bin"),
        ("/sbin", "usr/sbin"),
        ("/lib", "usr/lib"),
        ("/lib64", "usr/lib64"),
        ("/var/run", "/run"),
    ] {
        t.symlink(l, target);
    }
    // Real programs first, so that busybox applets do not shadow them.
    add_with_libs(&mut t, &qemu.join("usr/sbin/qemu-ga"), "/usr/sbin/qemu-ga")?;
    for pkg in GUEST_TOOL_PKGS {
        for f in dpkg_files(pkg)?.into_iter().filter(|f| is_bin(f)) {
            let p = Path::new(&f);
            if p.is_file() {
                add_with_libs(&mut t, p, &guest_path(&f))?;
            }
        }
    }
    for (pkg, name) in GUEST_PROGRAMS {
        let f = dpkg_files(pkg)?
            .into_iter()
            .find(|f| is_bin(f) && f.rsplit('/').next() == Some(name))
            .ok_or_else(|| Error::Prerequisite(format!("{pkg} has no program {name}")))?;
        add_with_libs(&mut t, Path::new(&f), &guest_path(&f))?;
    }
    for f in GUEST_DLOPENED {
        add_with_libs(&mut t, Path::new(f), f)?;
    }
    let bb = busybox.join("bin/busybox");
    add_with_libs(&mut t, &bb, "/usr/bin/busybox")?;
    let list = must(Command::new(&bb).arg("--list-full"), "busybox --list-full")?;
    for applet in String::from_utf8_lossy(&list).lines() {
        let name = applet.rsplit('/').next().unwrap_or(applet);
        let real = ["/usr/bin/", "/usr/sbin/"]
            .iter()
            .any(|d| t.contains(&format!("{d}{name}")));
        if !real {
            t.symlink(&guest_path(&format!("/{applet}")), "/usr/bin/busybox");
        }
    }
    t.symlink("/init", "/usr/bin/busybox");
    t.file("/etc/inittab", INITTAB.into(), 0o644);
    t.file("/etc/rxevm/rc", RC.into(), 0o755);
    t.file("/etc/rxevm/agent", AGENT.into(), 0o755);
    t.file("/usr/local/bin/rxe-gids", RXE_GIDS.into(), 0o755);
    for (p, text) in ETC {
        t.file(p, text.into(), 0o644);
    }
    for f in ["/etc/services", "/etc/protocols"] {
        if let Ok(d) = fs::read(f) {
            t.file(f, d, 0o644);
        }
    }
    Ok(t)
}

/// Adds the kernel modules (decompressed: busybox's insmod reads plain
/// ELF) and their load order to the tree.
fn add_modules(tree: &mut Tree, kroot: &Path, kver: &str) -> Result<()> {
    must(
        Command::new("depmod").arg("-b").arg(kroot).arg(kver),
        "depmod",
    )?;
    let mdir = kroot.join("lib/modules").join(kver);
    let dep = fs::read_to_string(mdir.join("modules.dep")).map_err(io_err("read modules.dep"))?;
    let builtin = fs::read_to_string(mdir.join("modules.builtin")).unwrap_or_default();
    let stem = |p: &str| {
        p.rsplit('/')
            .next()
            .unwrap_or(p)
            .split('.')
            .next()
            .unwrap_or(p)
            .replace('-', "_")
    };
    let mut order: Vec<String> = Vec::new();
    let mut seen = BTreeSet::new();
    for m in MODULES {
        if builtin.lines().any(|l| stem(l) == m) {
            continue;
        }
        let Some(line) = dep
            .lines()
            .find(|l| l.split(':').next().is_some_and(|p| stem(p) == m))
        else {
            // rxe's ICRC took crc32 from the crypto API up to 6.12; later
            // kernels call the crc32 library, and crc32_generic is gone.
            if m == "crc32_generic" {
                continue;
            }
            return Err(Error::Prerequisite(format!(
                "module {m} is not in the kernel package"
            )));
        };
        let (path, deps) = line.split_once(':').unwrap_or((line, ""));
        // modules.dep lists the dependencies so that the last loads first.
        for p in deps.split_whitespace().rev().chain([path]) {
            if seen.insert(p.to_string()) {
                order.push(p.to_string());
            }
        }
    }
    let mut list = String::new();
    for rel in &order {
        let src = mdir.join(rel);
        let data = if rel.ends_with(".xz") {
            must(Command::new("xz").arg("-dc").arg(&src), "xz -d a module")?
        } else if rel.ends_with(".zst") {
            must(
                Command::new("zstd").arg("-dc").arg(&src),
                "zstd -d a module",
            )?
        } else {
            fs::read(&src).map_err(io_err("read a module"))?
        };
        let plain = rel.trim_end_matches(".xz").trim_end_matches(".zst");
        tree.file(
            &guest_path(&format!("/lib/modules/{kver}/{plain}")),
            data,
            0o644,
        );
        list.push_str(plain);
        list.push('\n');
    }
    tree.file("/etc/rxevm/modules", list.into_bytes(), 0o644);
    Ok(())
}

fn crc_hex(data: &[u8]) -> String {
    format!("{:08x}", crc32fast::hash(data))
}

fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = fs::File::create(&tmp).map_err(io_err(format!("create {}", tmp.display())))?;
    f.write_all(data).map_err(io_err("write"))?;
    drop(f);
    fs::rename(&tmp, path).map_err(io_err(format!("write {}", path.display())))
}

/// Builds (or takes from the cache) the image; `log` hears about slow steps.
pub fn prepare(s: &Settings, log: &dyn Fn(&str)) -> Result<Image> {
    let t0 = Instant::now();
    if fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(1) != 0 {
        return Err(Error::Prerequisite(
            "the rxe VMs need root (network namespaces, taps): use sudo".into(),
        ));
    }
    if !Path::new("/dev/net/tun").exists() {
        return Err(Error::Prerequisite(
            "/dev/net/tun is missing: the VMs' NICs are taps".into(),
        ));
    }
    let cache = &s.cache;
    let debs = cache.join("debs");
    fs::create_dir_all(&debs).map_err(io_err(format!("create {}", debs.display())))?;
    ensure_installed(&HOST_PKGS.map(String::from), log)?;

    // Versions of what is downloaded; refresh apt's lists once if one is
    // unknown (a fresh machine may have none).
    let mut wanted: Vec<String> = QEMU_PKGS.iter().map(|p| p.to_string()).collect();
    wanted.push("busybox".into());
    let resolve = |wanted: &[String]| -> Option<(String, Vec<(String, String)>)> {
        let out = Command::new("apt-cache")
            .args(["depends", KERNEL_META])
            .output()
            .ok()?;
        let kpkg = String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.trim().strip_prefix("Depends: ").map(str::to_string))
            .filter(|p| p.starts_with("linux-image-6"))?;
        let mut all = wanted.to_vec();
        all.push(kpkg.clone());
        let v = candidates(&all)
            .into_iter()
            .map(|(p, v)| Some((p, v?)))
            .collect::<Option<Vec<_>>>()?;
        Some((kpkg, v))
    };
    let (kpkg, versions) = match resolve(&wanted) {
        Some(r) => r,
        None => {
            apt_update()?;
            resolve(&wanted).ok_or_else(|| {
                Error::Prerequisite(format!(
                    "apt offers no {KERNEL_META}, busybox or QEMU packages (Debian bookworm's main and security sources are needed)"
                ))
            })?
        }
    };
    let ver = |p: &str| {
        versions
            .iter()
            .find(|(n, _)| n == p)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };

    // QEMU, unpacked privately.
    let qroot = cache.join("qemu");
    let qstamp: String = QEMU_PKGS
        .iter()
        .map(|p| format!("{p}={}\n", ver(p)))
        .collect();
    let qdebs: Vec<PathBuf> = QEMU_PKGS
        .iter()
        .map(|p| deb(&debs, p, &ver(p)))
        .collect::<Result<_>>()?;
    if fs::read_to_string(qroot.join(".stamp")).ok().as_deref() != Some(qstamp.as_str()) {
        log("unpacking QEMU");
        let _ = fs::remove_dir_all(&qroot);
        for d in &qdebs {
            unpack(d, &qroot)?;
        }
        relink_absolute(&qroot)?;
        fs::write(qroot.join(".stamp"), &qstamp).map_err(io_err("write the QEMU stamp"))?;
    }
    // The libraries of the two programs we run (the emulator and the
    // guest agent); the other packages hold firmware and modules.
    let mut libs: Vec<String> = Vec::new();
    for (pkg, d) in QEMU_PKGS.iter().zip(&qdebs) {
        if !matches!(*pkg, "qemu-system-x86" | "qemu-guest-agent") {
            continue;
        }
        libs.extend(
            depends(d)?
                .into_iter()
                .filter(|p| p.starts_with("lib") || p.starts_with("zlib")),
        );
    }
    ensure_installed(&libs, log)?;
    let qemu = Qemu {
        root: qroot.clone(),
    };
    let qv = must(
        Command::new(qemu.bin()).arg("--version"),
        "run the unpacked QEMU",
    )?;

    // Busybox, unpacked next to the debs.
    let bbdeb = deb(&debs, "busybox", &ver("busybox"))?;
    let bbroot = cache.join("busybox");
    let _ = fs::remove_dir_all(&bbroot);
    unpack(&bbdeb, &bbroot)?;

    let mut tree = userspace(&bbroot, &qroot)?;
    let mut user_bytes = Vec::new();
    tree.write(&mut user_bytes)
        .map_err(io_err("pack the user space"))?;
    // RXEVM_KERNEL_DEB: another Debian kernel package, by path (e.g. a
    // backports kernel for AF_XDP zero-copy on virtio-net); the stamp
    // names it, so the image is rebuilt when it changes.
    let kernel_deb = s.kernel_deb.clone();
    let (kpkg, kver_pkg) = match &kernel_deb {
        Some(p) => (
            p.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            fs::metadata(p)
                .map(|m| format!("local, {} bytes", m.len()))
                .map_err(io_err(format!("RXEVM_KERNEL_DEB={}", p.display())))?,
        ),
        None => {
            let v = ver(&kpkg);
            (kpkg, v)
        }
    };
    let stamp = format!(
        "recipe {RECIPE}\nkernel {kpkg}={kver_pkg}\nmodules {}\nuserspace {} bytes crc {}\n{qstamp}busybox={}\n",
        MODULES.join(","),
        user_bytes.len(),
        crc_hex(&user_bytes),
        ver("busybox"),
    );
    drop(user_bytes);
    // Another kernel's image sits beside the default one, so that runs on
    // either do not rebuild the other's.
    let tag = if kernel_deb.is_some() { "-alt" } else { "" };
    let kernel = cache.join(format!("vmlinuz{tag}"));
    let initrd = cache.join(format!("initrd{tag}.img"));
    let stamp_file = cache.join(format!("stamp{tag}"));
    let fresh = fs::read_to_string(&stamp_file).ok().as_deref() == Some(stamp.as_str())
        && kernel.exists()
        && initrd.exists();
    if !fresh {
        log(&format!("building the guest image ({kpkg} {kver_pkg})"));
        let kdeb = match &kernel_deb {
            Some(p) => p.clone(),
            None => deb(&debs, &kpkg, &kver_pkg)?,
        };
        let kroot = cache.join("kernel");
        let _ = fs::remove_dir_all(&kroot);
        unpack(&kdeb, &kroot)?;
        // Newer packages (trixie's, merged /usr) keep the modules in
        // /usr/lib/modules.
        let mroot = if kroot.join("lib/modules").exists() {
            kroot.clone()
        } else {
            kroot.join("usr")
        };
        let kver = fs::read_dir(mroot.join("lib/modules"))
            .map_err(io_err("list the kernel's modules"))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().to_string())
            .next()
            .ok_or_else(|| Error::Prerequisite(format!("{kpkg} has no modules")))?;
        add_modules(&mut tree, &mroot, &kver)?;
        let mut img = Vec::new();
        tree.write(&mut img).map_err(io_err("pack the initramfs"))?;
        write_atomic(&initrd, &img)?;
        let vmlinuz =
            fs::read(kroot.join(format!("boot/vmlinuz-{kver}"))).map_err(io_err("read vmlinuz"))?;
        write_atomic(&kernel, &vmlinuz)?;
        let _ = fs::remove_dir_all(&kroot);
        let _ = fs::remove_file(cache.join("kvm"));
        write_atomic(&stamp_file, stamp.as_bytes())?;
    }
    let _ = fs::remove_dir_all(&bbroot);
    let kvm_works = kvm_probe(&qemu, &kernel, &initrd, cache, &stamp, log);
    let mb = |p: &Path| {
        fs::metadata(p)
            .map(|m| m.len() as f64 / 1048576.0)
            .unwrap_or(0.0)
    };
    let mut report = String::new();
    report.push_str(&format!("kernel: {kpkg} {kver_pkg}\n"));
    report.push_str(&format!(
        "qemu: {} (unpacked in {})\n",
        String::from_utf8_lossy(&qv).lines().next().unwrap_or("?"),
        qroot.display()
    ));
    for p in HOST_PKGS
        .iter()
        .chain(&["libibverbs1", "librdmacm1", "busybox"])
    {
        let v = if *p == "busybox" {
            ver(p)
        } else {
            dpkg_version(p).unwrap_or_default()
        };
        report.push_str(&format!("{p}: {v}\n"));
    }
    report.push_str(&format!(
        "initramfs: {:.0} MiB, vmlinuz: {:.0} MiB, KVM usable: {}, prepared in {:.0} s\n",
        mb(&initrd),
        mb(&kernel),
        if kvm_works { "yes" } else { "no" },
        t0.elapsed().as_secs_f64()
    ));
    Ok(Image {
        kernel,
        initrd,
        qemu,
        kvm_works,
        versions: report,
        rebuilt: !fresh,
    })
}

/// Does KVM run this image? `/dev/kvm` may exist and still be unusable (here
/// it is a nested PVM that runs only PVM guest kernels). Boots the image
/// once under KVM with `rxevm.probe=1`; the answer is cached with the stamp.
fn kvm_probe(
    qemu: &Qemu,
    kernel: &Path,
    initrd: &Path,
    cache: &Path,
    stamp: &str,
    log: &dyn Fn(&str),
) -> bool {
    let file = cache.join("kvm");
    let key = crc_hex(stamp.as_bytes());
    if let Ok(s) = fs::read_to_string(&file) {
        if let Some((k, v)) = s.trim().split_once(' ') {
            if k == key {
                return v == "yes";
            }
        }
    }
    let ok = Path::new("/dev/kvm").exists() && {
        log("probing KVM");
        let serial = cache.join("kvm-probe.log");
        let errors = cache.join("kvm-probe.qemu.log");
        let _ = fs::remove_file(&serial);
        let mut c = qemu.command(&[]);
        c.args(["-accel", "kvm", "-cpu", "host", "-m", "256", "-smp", "1"])
            .args([
                "-nodefaults",
                "-no-user-config",
                "-display",
                "none",
                "-no-reboot",
            ])
            .arg("-kernel")
            .arg(kernel)
            .arg("-initrd")
            .arg(initrd)
            .args(["-append", "console=ttyS0 panic=-1 rxevm.probe=1"])
            .arg("-serial")
            .arg(format!("file:{}", serial.display()));
        probe_boot(&mut c, &serial, &errors)
    };
    let _ = fs::write(&file, format!("{key} {}\n", if ok { "yes" } else { "no" }));
    let _ = fs::set_permissions(&file, fs::Permissions::from_mode(0o644));
    ok
}

/// Runs the probe VM until its serial log shows the marker, QEMU reports a
/// KVM failure (it pauses the guest rather than exiting), or 60 s pass.
fn probe_boot(c: &mut Command, serial: &Path, errors: &Path) -> bool {
    let Ok(err) = fs::File::create(errors) else {
        return false;
    };
    let Ok(mut child) = c
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(err)
        .spawn()
    else {
        return false;
    };
    let t0 = Instant::now();
    let read = |p: &Path| {
        fs::read(p)
            .map(|d| String::from_utf8_lossy(&d).into_owned())
            .unwrap_or_default()
    };
    let ok = loop {
        if read(serial).contains("RXEVM-PROBE-OK") {
            break true;
        }
        let e = read(errors);
        let exited = !matches!(child.try_wait(), Ok(None));
        if exited
            || e.contains("KVM internal error")
            || e.contains("failed")
            || t0.elapsed() > Duration::from_secs(60)
        {
            break read(serial).contains("RXEVM-PROBE-OK");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = child.kill();
    let _ = child.wait();
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_paths_follow_the_usr_merge() {
        assert_eq!(
            guest_path("/lib/x86_64-linux-gnu/libc.so.6"),
            "/usr/lib/x86_64-linux-gnu/libc.so.6"
        );
        assert_eq!(
            guest_path("/lib64/ld-linux-x86-64.so.2"),
            "/usr/lib64/ld-linux-x86-64.so.2"
        );
        assert_eq!(guest_path("/sbin/ip"), "/usr/sbin/ip");
        assert_eq!(guest_path("/usr/bin/rdma"), "/usr/bin/rdma");
        assert!(is_bin("/usr/bin/ib_write_bw"));
        assert!(is_bin("/sbin/ip"));
        assert!(!is_bin("/usr/bin/x/y"));
        assert!(!is_bin("/usr/share/doc/perftest"));
    }
}
