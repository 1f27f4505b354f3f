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
use std::sync::{mpsc, Arc, Mutex};

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

/// What an idle data path waits on in poll(2): its AF_XDP sockets and its
/// doorbell (set up once: no allocation in the loop).
fn wait_fds(dp: &DataPath) -> Vec<libc::pollfd> {
    dp.xsks
        .iter()
        .map(|x| x.fd())
        .chain(dp.core.doorbell.as_ref().map(|d| d.fd()))
        .map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect()
}

/// Makes the calling thread a latency-sensitive normal thread: nice -20
/// and a 100 us slice request (EEVDF's shortest), so that a frame waking
/// it preempts a program thread spinning on the same core at once, as
/// rxe's softirq would, instead of at the scheduler's next tick. It stays
/// a fair-class thread: a long backlog cannot starve the program or the
/// kernel's ksoftirqd, which moves the very frames it sends (SCHED_FIFO
/// did that here, measured: retransmission timeouts in ib_write_bw).
/// Without CAP_SYS_NICE it keeps its nice value and asks only for the
/// slice. Returns whether the nice value took.
pub fn make_latency_sensitive() -> bool {
    // The kernel's struct sched_attr (SCHED_ATTR_SIZE_VER1).
    #[repr(C)]
    struct SchedAttr {
        size: u32,
        policy: u32,
        flags: u64,
        nice: i32,
        priority: u32,
        runtime: u64,
        deadline: u64,
        period: u64,
        util_min: u32,
        util_max: u32,
    }
    let set = |nice: i32| {
        let a = SchedAttr {
            size: std::mem::size_of::<SchedAttr>() as u32,
            policy: libc::SCHED_OTHER as u32,
            flags: 0,
            nice,
            priority: 0,
            runtime: 100_000,
            deadline: 0,
            period: 0,
            util_min: 0,
            util_max: 0,
        };
        // SAFETY: sched_setattr on this thread with a local, fully
        // initialised attr of the size it declares.
        unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &a as *const SchedAttr, 0) == 0 }
    };
    set(-20) || {
        set(0);
        false
    }
}

/// The data path of a verbs program, shared with the program's threads:
/// whoever holds the lock runs it. Program threads only ever try it (a
/// post or a poll that finds it taken leaves the work to the holder), so
/// none waits on the data path; this thread runs it for them whenever they
/// are away (a program spinning on memory for a WRITE), and otherwise
/// sleeps in poll(2) until a frame, a post or a timer needs it.
pub fn shared_data_path_loop(
    dp: Arc<Mutex<DataPath>>,
    stop: Arc<AtomicBool>,
    adaptive: bool,
    cpu: Option<usize>,
    boost: bool,
) {
    if let Some(c) = cpu {
        pin_to_cpu(c);
    }
    // Only a thread that sleeps when idle may preempt the program: a
    // spinning one would take its core.
    if boost && adaptive && !make_latency_sensitive() {
        log::warn!(
            "cannot raise the data path thread's priority ({}); a program spinning on its core delays it",
            std::io::Error::last_os_error()
        );
    }
    // A panic while holding the lock left the engine unusable: stop.
    fn lock(dp: &Mutex<DataPath>) -> Option<std::sync::MutexGuard<'_, DataPath>> {
        dp.lock().ok()
    }
    let (doorbell, mut fds, clock) = match lock(&dp) {
        Some(d) => (d.core.doorbell.clone(), wait_fds(&d), d.clock()),
        None => return,
    };
    let mut backoff = Backoff::eager(adaptive);
    while !stop.load(Ordering::Relaxed) {
        let Some(mut d) = lock(&dp) else { return };
        let (work, next) = d.poll();
        let now = d.now();
        // A program that polls its CQ moves its own frames (inline
        // progress); when XDP answers the peer's remote accesses (or
        // there are none), the frames left end in completions it polls
        // for. Waking for them only preempts
        // it (a cross-CPU wake-up and two context switches, 7-10 us
        // here), so while it polls this thread waits for its doorbell.
        let to_program = adaptive && d.core.frames_can_wait_for_polls(now);
        drop(d);
        match &doorbell {
            Some(bell) => backoff.after_poll_waiting(
                now,
                work,
                next,
                &mut fds,
                bell,
                to_program,
                clock,
                || lock(&dp).is_none_or(|d| d.core.rings_have_work()),
            ),
            None => backoff.after_poll(now, work, next),
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
    let mut backoff = Backoff::new(adaptive);
    let doorbell = dp.core.doorbell.clone();
    let mut fds = wait_fds(&dp);
    while !stop.load(Ordering::Relaxed) {
        while let Ok(job) = jobs.try_recv() {
            job(&mut dp);
            backoff.reset();
        }
        let (work, next) = dp.poll();
        match &doorbell {
            Some(d) => {
                let core = &dp.core;
                backoff.after_poll_waiting(
                    dp.now(),
                    work,
                    next,
                    &mut fds,
                    d,
                    false,
                    dp.clock(),
                    || core.rings_have_work(),
                );
            }
            None => backoff.after_poll(dp.now(), work, next),
        }
    }
    dp
}
