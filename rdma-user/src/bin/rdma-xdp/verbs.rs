//! `rdma-xdp link` (which interfaces are verbs devices) and `rdma-xdp exec`
//! (run an unmodified verbs program over the drop-in libibverbs).

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use rdma_user::control::{ibdev, links};

use crate::Global;

#[derive(Subcommand)]
pub enum LinkCmd {
    /// Make an interface a verbs device, as `rdma link add NAME type rxe
    /// netdev IF` does for rxe.
    Add {
        name: String,
        /// The interface (`netdev IF`, as iproute2's `rdma link add`).
        #[arg(value_parser = ["netdev"])]
        netdev_kw: String,
        netdev: String,
    },
    /// The devices programs see (the added links, or the default ones).
    Show,
    /// Remove a link.
    Del { name: String },
}

pub fn link(c: LinkCmd, g: &Global) -> Result<()> {
    match c {
        LinkCmd::Add { name, netdev, .. } => {
            let l = links::add(&name, &netdev)?;
            println!("link {} netdev {}", l.name, l.netdev);
        }
        LinkCmd::Show => {
            let added = !links::added()?.is_empty();
            let all = links::effective()?;
            if g.json {
                println!("{}", serde_json::to_string(&all)?);
            } else if all.is_empty() {
                println!("no devices: no interface is up (add one with `rdma-xdp link add rxe0 netdev IF`)");
            }
            for l in &all {
                println!(
                    "link {}/1 state {} netdev {}{}",
                    l.name,
                    if links::default_netdevs().contains(&l.netdev) {
                        "ACTIVE"
                    } else {
                        "DOWN"
                    },
                    l.netdev,
                    if added { "" } else { " (default)" }
                );
            }
        }
        LinkCmd::Del { name } => links::del(&name)?,
    }
    Ok(())
}

/// Where the drop-in library is: `ibverbs/` beside this binary (what
/// `cargo xtask verbs` builds).
fn library_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locate rdma-xdp")?;
    let dir = exe
        .parent()
        .map(|d| d.join("ibverbs"))
        .context("rdma-xdp has no directory")?;
    if !dir.join("libibverbs.so.1").exists() {
        bail!(
            "{} is missing: build it with `cargo xtask verbs{}`",
            dir.join("libibverbs.so.1").display(),
            if exe.to_string_lossy().contains("/release/") {
                " --release"
            } else {
                ""
            }
        );
    }
    Ok(dir)
}

/// Replaces this process with `program` over the drop-in libibverbs.
///
/// As root it first gives the program a private mount namespace in which
/// our devices are found as kernel ones are (`show_devices`); otherwise the
/// program still runs over the library, but engines that look for
/// `/dev/infiniband` (UCX) do not see the devices.
pub fn exec(program: &[String], g: &Global) -> Result<()> {
    let Some((prog, args)) = program.split_first() else {
        bail!("usage: rdma-xdp exec [--iface IF] -- PROGRAM ARGS...");
    };
    let dir = library_dir()?;
    let mut path = dir.into_os_string();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|o| !o.is_empty()) {
        path.push(":");
        path.push(old);
    }
    if let Some(i) = &g.iface {
        // SAFETY: single-threaded here (before exec); nothing reads the
        // environment concurrently.
        unsafe { std::env::set_var(links::IFACE_ENV, i) };
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let devs = links::effective()?;
        show_devices(&devs).context("show the verbs devices in a private mount namespace")?;
    }
    let mut c = std::process::Command::new(prog);
    c.args(args).env("LD_LIBRARY_PATH", path);
    let e = c.exec();
    bail!("cannot run {prog}: {e}")
}

fn cstr(s: &str) -> Result<CString> {
    CString::new(s).with_context(|| format!("path {s:?} holds a NUL"))
}

/// mount(2), with the path in the error.
fn mount(src: &str, target: &str, fstype: Option<&str>, flags: libc::c_ulong) -> Result<()> {
    let (s, t) = (cstr(src)?, cstr(target)?);
    let f = fstype.map(cstr).transpose()?;
    // SAFETY: valid C strings (or NULL for the type); no data argument.
    let r = unsafe {
        libc::mount(
            s.as_ptr(),
            t.as_ptr(),
            f.as_ref().map_or(std::ptr::null(), |f| f.as_ptr()),
            flags,
            std::ptr::null(),
        )
    };
    if r != 0 {
        bail!(
            "mount {src} on {target}: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Shows `devs` to the programs of a new private mount namespace the way
/// the kernel shows rxe devices, because engines look for them there
/// rather than ask libibverbs (docs/verbs-abi.md):
/// - `/sys/class` becomes a tmpfs holding every class of the real one (each
///   bind-mounted back at its own path, so that their relative links to
///   `/sys/devices` still resolve) plus `infiniband`, `infiniband_verbs`
///   and `infiniband_ucma` with our devices' files (`control::ibdev`);
/// - `/dev/infiniband` becomes a tmpfs with `uverbsN` and `rdma_cm`, each a
///   bind mount of `/dev/null`: a character device any user may open, which
///   is what UCX checks; nobody sends it commands, since our library is
///   the one loaded.
///
/// Nothing outside the namespace changes, except that an empty
/// `/dev/infiniband` directory is created where none exists (a mount
/// needs a mount point; devtmpfs directories are global).
fn show_devices(devs: &[links::Link]) -> Result<()> {
    // SAFETY: unshare only changes this (single-threaded) process.
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        bail!("unshare(CLONE_NEWNS): {}", std::io::Error::last_os_error());
    }
    // Mounts made here must not reach the parent namespace.
    mount("none", "/", None, libc::MS_REC | libc::MS_PRIVATE)?;
    // The real classes stay reachable through this descriptor once the
    // tmpfs covers them (it closes at exec).
    let real_dir = std::fs::File::open("/sys/class").context("open /sys/class")?;
    let real = format!("/proc/self/fd/{}", real_dir.as_raw_fd());
    let classes: Vec<String> = std::fs::read_dir("/sys/class")
        .context("read /sys/class")?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    mount(
        "tmpfs",
        "/sys/class",
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
    )?;
    for c in &classes {
        let at = format!("/sys/class/{c}");
        std::fs::create_dir(&at).with_context(|| format!("mkdir {at}"))?;
        mount(
            &format!("{real}/{c}"),
            &at,
            None,
            libc::MS_BIND | libc::MS_REC,
        )?;
    }
    ibdev::write_sysfs(
        std::path::Path::new("/sys/class"),
        devs,
        env!("CARGO_PKG_VERSION"),
    )
    .context("write the devices' sysfs files")?;
    mount(
        "none",
        "/sys/class",
        None,
        libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
    )?;
    let dev = "/dev/infiniband";
    std::fs::create_dir_all(dev).with_context(|| format!("mkdir {dev}"))?;
    mount(
        "tmpfs",
        dev,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
    )?;
    std::fs::set_permissions(dev, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .with_context(|| format!("chmod {dev}"))?;
    let nodes = (0..devs.len())
        .map(ibdev::uverbs_name)
        .chain(std::iter::once("rdma_cm".to_string()));
    for n in nodes {
        let at = format!("{dev}/{n}");
        std::fs::File::create(&at).with_context(|| format!("create {at}"))?;
        mount("/dev/null", &at, None, libc::MS_BIND)?;
    }
    drop(real_dir);
    Ok(())
}
