//! Running a data path: the loop that polls it on a thread of its own and
//! runs control jobs between two polls, CPU pinning, and the per-interface
//! lock that keeps two owners off one interface.
//!
//! Owns nothing protocol-related; it must not parse packets or touch QPs
//! other than through the jobs it is given.

use std::fs::File;
use std::io::Write as _;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use anyhow::{bail, Context, Result};

use crate::device::datapath::{Backoff, DataPath};
use crate::io::hostnet;

/// Work for the data path thread, run between two polls; it carries its
/// own way of answering.
pub type Job = Box<dyn FnOnce(&mut DataPath) + Send>;

fn lock_path(iface: &str) -> PathBuf {
    hostnet::run_dir().join(format!("{iface}.lock"))
}

/// Takes the per-interface lock; refuses while another daemon holds it.
pub fn take_lock(iface: &str) -> Result<File> {
    let dir = hostnet::run_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    let path = lock_path(iface);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("open {}", path.display()))?;
    // SAFETY: flock on an fd we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let pid = std::fs::read_to_string(&path).unwrap_or_default();
        let pid = pid.trim();
        // Name the holder: an `rdma-xdp up` daemon or a verbs program.
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        bail!(
            "{iface} is in use by pid {pid} ({}): one program per interface; stop it first (Ctrl-C or kill {pid})",
            comm.trim()
        );
    }
    f.set_len(0)?;
    write!(f, "{}", std::process::id())?;
    Ok(f)
}

/// After a daemon died by SIGKILL: a program attached through the netlink
/// fallback stays on the interface. We hold the lock, so nothing alive owns
/// it. (The daemon removes its own stale socket file before binding.)
pub fn clean_stale(iface: &str) {
    let out = std::process::Command::new("ip")
        .args(["-d", "link", "show", "dev", iface])
        .output();
    if let Ok(o) = out {
        let text = String::from_utf8_lossy(&o.stdout);
        if text.contains("prog/xdp") || text.contains(" xdp") {
            log::warn!("{iface}: removing an XDP program left behind by a previous daemon");
            for mode in ["xdp", "xdpgeneric", "xdpdrv"] {
                let _ = std::process::Command::new("ip")
                    .args(["link", "set", "dev", iface, mode, "off"])
                    .status();
            }
        }
    }
}

pub fn pin_to_cpu(cpu: usize) {
    // SAFETY: cpu_set_t manipulation on a local value.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            log::warn!(
                "cannot pin the data path to CPU {cpu}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// The data path thread: run control jobs between polls; spin, or back off
/// to short sleeps when idle (adaptive).
pub fn data_path_loop(
    mut dp: DataPath,
    jobs: mpsc::Receiver<Job>,
    stop: Arc<AtomicBool>,
    adaptive: bool,
    cpu: Option<usize>,
) -> DataPath {
    if let Some(c) = cpu {
        pin_to_cpu(c);
    }
    // RDMA_XDP_FIFO=1: the thread runs SCHED_FIFO (priority 1), so a frame
    // or a post that wakes it preempts a program thread spinning on the
    // same core at once instead of at the scheduler's next decision.
    if std::env::var_os("RDMA_XDP_FIFO").is_some() {
        let p = libc::sched_param { sched_priority: 1 };
        // SAFETY: setting this thread's own policy from a local param.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) } != 0 {
            log::warn!(
                "RDMA_XDP_FIFO: cannot make the data path SCHED_FIFO: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    let mut backoff = Backoff::new(adaptive);
    // With a doorbell, an idle thread waits in poll(2) on the sockets and
    // the doorbell (set up once: no allocation in the loop).
    let doorbell = dp.core.doorbell.clone();
    let mut fds: Vec<libc::pollfd> = dp
        .xsks
        .iter()
        .map(|x| x.fd())
        .chain(doorbell.as_ref().map(|d| d.fd()))
        .map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    while !stop.load(Ordering::Relaxed) {
        while let Ok(job) = jobs.try_recv() {
            job(&mut dp);
            backoff.reset();
        }
        let (work, next) = dp.poll();
        match &doorbell {
            Some(d) => {
                let core = &dp.core;
                backoff.after_poll_waiting(dp.now(), work, next, &mut fds, d, || {
                    core.rings_have_work()
                });
            }
            None => backoff.after_poll(dp.now(), work, next),
        }
    }
    dp
}
