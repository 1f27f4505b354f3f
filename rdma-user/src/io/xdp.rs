//! Loading and attaching the XDP classifier, and reading its maps.
//!
//! It must not decide about packets: the XDP program does, userspace only
//! loads it, fills its maps and reads its counters.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::ptr::NonNull;

use anyhow::{anyhow, bail, Context, Result};
use aya::maps::{Array, HashMap, Map, MapData, PerCpuArray, XskMap};
use aya::programs::{Xdp, XdpMode as AyaMode};
use aya::Ebpf;
use rdma_common::{mr_pool, stat, LiveQp, XdpConfig};

/// Where the program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum XdpMode {
    /// Native (driver) mode, falling back to generic with a warning.
    Auto,
    Native,
    Generic,
}

pub struct XdpProgram {
    ebpf: Ebpf,
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    pub iface: String,
    /// The mode actually attached.
    pub native: bool,
    /// Instructions the kernel's verifier processed to accept the program
    /// (its complexity; the limit is 1 000 000).
    pub verified_insns: Option<u32>,
}

/// The compiled classifier, embedded at build time.
static PROGRAM: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/rdma-xdp"));

impl XdpProgram {
    pub fn attach(iface: &str, mode: XdpMode) -> Result<XdpProgram> {
        let mut ebpf = Ebpf::load(PROGRAM).context("load the XDP program (needs root, BPF)")?;
        let logger = match aya_log::EbpfLogger::init(&mut ebpf) {
            Ok(l) => Some(l),
            Err(e) => {
                log::debug!("aya-log unavailable: {e}");
                None
            }
        };
        let prog = loaded_xdp(&mut ebpf, "rdma_xdp")?;
        let verified_insns = prog
            .info()
            .ok()
            .and_then(|i| i.verified_instruction_count());
        log::debug!("XDP program verified: {verified_insns:?} instructions processed");
        let native = match mode {
            XdpMode::Generic => {
                prog.attach(iface, AyaMode::Skb)
                    .with_context(|| format!("attach XDP (generic) to {iface}"))?;
                false
            }
            XdpMode::Native => {
                prog.attach(iface, AyaMode::Driver)
                    .with_context(|| format!("attach XDP (native) to {iface}"))?;
                true
            }
            XdpMode::Auto => match prog.attach(iface, AyaMode::Driver) {
                Ok(_) => true,
                Err(e) => {
                    log::warn!(
                        "{iface}: native XDP failed ({e}); falling back to generic mode (slower)"
                    );
                    prog.attach(iface, AyaMode::Skb)
                        .with_context(|| format!("attach XDP (generic) to {iface}"))?;
                    false
                }
            },
        };
        Ok(XdpProgram {
            ebpf,
            logger,
            iface: iface.to_string(),
            native,
            verified_insns,
        })
    }

    /// Puts an AF_XDP socket in the XSKMAP slot of its queue.
    pub fn set_socket(&mut self, queue: u32, fd: i32) -> Result<()> {
        let mut m: XskMap<&mut MapData> = self
            .ebpf
            .map_mut("XSKS")
            .ok_or_else(|| anyhow!("XSKS map missing"))?
            .try_into()?;
        // SAFETY: fd is an open AF_XDP socket owned by the caller for as long
        // as the program runs.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        m.set(queue, fd.as_raw_fd(), 0)
            .with_context(|| format!("register AF_XDP socket for queue {queue}"))?;
        Ok(())
    }

    /// Per-reason counters, summed over CPUs.
    /// The counters by name (`rdma-xdp stats`' "xdp" object).
    pub fn stats_map(&self) -> Result<serde_json::Map<String, serde_json::Value>> {
        let names = stat_names();
        Ok(self
            .stats()?
            .iter()
            .enumerate()
            .map(|(i, v)| (names[i].to_string(), (*v).into()))
            .collect())
    }

    pub fn stats(&self) -> Result<[u64; stat::COUNT as usize]> {
        let m: PerCpuArray<&MapData, u64> = self
            .ebpf
            .map("STATS")
            .ok_or_else(|| anyhow!("STATS map missing"))?
            .try_into()?;
        let mut out = [0u64; stat::COUNT as usize];
        for (i, o) in out.iter_mut().enumerate() {
            *o = m.get(&(i as u32), 0)?.iter().sum();
        }
        Ok(out)
    }

    pub fn set_firewall(&mut self, on: bool) -> Result<()> {
        self.update_config(|c| c.firewall = on as u32)
    }

    /// The XDP responder skips the received ICRC check: for the benchmark
    /// that measures the check's cost, nothing else.
    pub fn set_bench_no_icrc(&mut self, on: bool) -> Result<()> {
        self.update_config(|c| c.bench_no_icrc = on as u32)
    }

    fn update_config(&mut self, f: impl FnOnce(&mut XdpConfig)) -> Result<()> {
        let mut m: Array<&mut MapData, XdpConfig> = self
            .ebpf
            .map_mut("CONFIG")
            .ok_or_else(|| anyhow!("CONFIG map missing"))?
            .try_into()?;
        let mut c = m.get(&0, 0).unwrap_or_default();
        f(&mut c);
        m.set(0, c, 0)?;
        Ok(())
    }

    pub fn set_live_qp(&mut self, qpn: u32, v: LiveQp) -> Result<()> {
        let mut m: HashMap<&mut MapData, u32, LiveQp> = self
            .ebpf
            .map_mut("LIVE_QPS")
            .ok_or_else(|| anyhow!("LIVE_QPS map missing"))?
            .try_into()?;
        m.insert(qpn, v, 0)?;
        Ok(())
    }

    pub fn remove_live_qp(&mut self, qpn: u32) -> Result<()> {
        let mut m: HashMap<&mut MapData, u32, LiveQp> = self
            .ebpf
            .map_mut("LIVE_QPS")
            .ok_or_else(|| anyhow!("LIVE_QPS map missing"))?
            .try_into()?;
        let _ = m.remove(&qpn);
        Ok(())
    }

    /// The kernel's run-time statistics of the program: total time and
    /// runs, counted while some process holds [`enable_run_stats`]' fd.
    pub fn run_stats(&self) -> Option<(std::time::Duration, u64)> {
        let p: &Xdp = self.ebpf.program("rdma_xdp")?.try_into().ok()?;
        let i = p.info().ok()?;
        Some((i.run_time(), i.run_count()))
    }

    /// Maps the MR pool (`MR_POOL`, one `BPF_F_MMAPABLE` value) into this
    /// process. The mapping keeps the map alive on its own: it stays valid
    /// after the program is detached.
    pub fn map_pool(&self) -> Result<PoolMapping> {
        let Some(Map::Array(data)) = self.ebpf.map("MR_POOL") else {
            bail!("MR_POOL map missing from the XDP object");
        };
        PoolMapping::new(data.fd().as_fd())
    }

    /// Maps the XDP responder's two arrays, `RESP_STATE` and `POOL_MRS`,
    /// and the MR pool.
    pub fn map_xdp_responder(&self) -> Result<XdpResponderMaps> {
        let arr = |name: &str| -> Result<ArrayMapping> {
            let Some(Map::Array(data)) = self.ebpf.map(name) else {
                bail!("{name} map missing from the XDP object");
            };
            ArrayMapping::new(data)
        };
        Ok(XdpResponderMaps {
            pool: self.map_pool()?,
            states: arr("RESP_STATE")?,
            mrs: arr("POOL_MRS")?,
        })
    }

    /// Forwards log records from the program (debug level, drops only).
    pub fn flush_log(&mut self) {
        if let Some(l) = self.logger.as_mut() {
            l.flush();
        }
    }
}

/// The XDP program `name` of an embedded object, loaded into the kernel
/// (verified), ready to attach.
fn loaded_xdp<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut Xdp> {
    let prog: &mut Xdp = ebpf
        .program_mut(name)
        .ok_or_else(|| anyhow!("program {name} missing from the object"))?
        .try_into()?;
    prog.load()
        .with_context(|| format!("the kernel verifier rejected the XDP program {name}"))?;
    Ok(prog)
}

/// The pass-through program (`rdma-ebpf/src/pass.rs`), embedded at build
/// time.
static PASS_PROGRAM: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp-pass"));

/// A pass-through XDP program on the far end of a veth pair, so that the
/// frames our XDP responder sends with `XDP_TX` reach that end's stack
/// (veth polls a peer's XDP ring only when the peer runs XDP). Attached
/// in native mode (what veth needs) for as long as this value lives.
pub struct XdpPass {
    _ebpf: Ebpf,
    pub iface: String,
}

impl XdpPass {
    pub fn attach(iface: &str) -> Result<XdpPass> {
        let mut ebpf = Ebpf::load(PASS_PROGRAM)
            .context("load the pass-through XDP program (needs root, BPF)")?;
        let prog = loaded_xdp(&mut ebpf, "xdp_pass")?;
        prog.attach(iface, AyaMode::Driver).with_context(|| {
            format!("attach the pass-through XDP program (native) to {iface}; is another XDP program on it?")
        })?;
        Ok(XdpPass {
            _ebpf: ebpf,
            iface: iface.to_string(),
        })
    }
}

/// A pass-through program on `iface` if it is a veth without XDP (else
/// `None`); a failure is logged, not fatal: frames sent with `XDP_TX` from
/// the peer are then lost, and the requester's retransmission covers them.
pub fn pass_through_if_veth(iface: &str) -> Option<XdpPass> {
    match crate::io::hostnet::is_veth_without_xdp(iface) {
        Ok(true) => match XdpPass::attach(iface) {
            Ok(p) => Some(p),
            Err(e) => {
                log::warn!("{iface}: {e:#}; XDP_TX frames from its peer will be lost");
                None
            }
        },
        Ok(false) => None,
        Err(e) => {
            log::warn!("{iface}: {e:#}");
            None
        }
    }
}

pub fn stat_names() -> &'static [&'static str] {
    &stat::NAMES
}

/// The MR pool mapped `MAP_SHARED`: the same pages the XDP program writes
/// into. Only the usable [`mr_pool::BYTES`] are handed out; the slack page
/// behind them is the verifier's, never an MR's.
pub struct PoolMapping {
    ptr: NonNull<u8>,
    len: usize,
    /// The map, to map ranges of it elsewhere (over an application's
    /// pages: `Core::reg_mr_overlay`).
    fd: std::os::fd::OwnedFd,
}

// SAFETY: plain shared memory; who may touch which range is decided by the
// pool allocator and the MR table that own it.
unsafe impl Send for PoolMapping {}
// SAFETY: as above; the mapping itself is never changed after creation.
unsafe impl Sync for PoolMapping {}

impl PoolMapping {
    fn new(fd: BorrowedFd<'_>) -> Result<PoolMapping> {
        let len = mr_pool::VALUE_BYTES;
        let ptr = mmap_map(fd, len).context("the MR pool map")?;
        Ok(PoolMapping {
            ptr,
            len,
            fd: fd
                .try_clone_to_owned()
                .context("dup the MR pool map's fd")?,
        })
    }

    /// Maps the pool's pages `off..off+len` at `at` instead of what was
    /// there (`MAP_FIXED`).
    ///
    /// # Safety
    /// `at..at+len` is page-aligned memory of this process that nothing
    /// else maps or relies on the backing of; `off` and `len` are whole
    /// pages inside the pool.
    pub unsafe fn map_over(&self, at: *mut u8, off: usize, len: usize) -> std::io::Result<()> {
        // SAFETY: the caller's guarantee; the result is checked.
        let p = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                self.fd.as_raw_fd(),
                off as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED || p as *mut u8 != at {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// The first byte of the pool.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes MRs may use (the slack excluded).
    pub fn usable(&self) -> usize {
        mr_pool::BYTES
    }
}

impl Drop for PoolMapping {
    fn drop(&mut self) {
        // SAFETY: exactly the range mmap returned; nothing borrows it any
        // more (its owner drops it after the MRs inside are gone).
        unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.len) };
    }
}

/// The XDP responder's maps, mapped into this process.
pub struct XdpResponderMaps {
    pub pool: PoolMapping,
    /// `RESP_STATE`: one `RespState` per slot.
    pub states: ArrayMapping,
    /// `POOL_MRS`: one `PoolMr` per slot.
    pub mrs: ArrayMapping,
}

impl XdpResponderMaps {
    /// Slot `i` of `RESP_STATE`.
    pub fn state(&self, i: u32) -> *mut rdma_common::xdp_responder::RespState {
        self.states.slot(i)
    }

    /// Slot `i` of `POOL_MRS`.
    pub fn mr(&self, i: u32) -> *mut rdma_common::xdp_responder::PoolMr {
        self.mrs.slot(i)
    }
}

/// A `BPF_F_MMAPABLE` array map mapped `MAP_SHARED`: its values, one
/// after the other at 8-byte-rounded strides.
pub struct ArrayMapping {
    ptr: NonNull<u8>,
    len: usize,
    stride: usize,
    entries: u32,
}

// SAFETY: shared memory with the XDP program; the slots' users coordinate
// through each value's own protocol (the owner word of a RespState).
unsafe impl Send for ArrayMapping {}
// SAFETY: as above.
unsafe impl Sync for ArrayMapping {}

impl ArrayMapping {
    fn new(data: &MapData) -> Result<ArrayMapping> {
        let info = data.info().context("map info")?;
        let stride = (info.value_size() as usize).div_ceil(8) * 8;
        let entries = info.max_entries();
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let len = (stride * entries as usize).div_ceil(page) * page;
        let ptr = mmap_map(data.fd().as_fd(), len).context("an array map")?;
        Ok(ArrayMapping {
            ptr,
            len,
            stride,
            entries,
        })
    }

    /// Value `i` (wrapping at the map's size) as a `T`. The caller picks
    /// `T` as the map's value type.
    fn slot<T>(&self, i: u32) -> *mut T {
        let i = (i % self.entries) as usize;
        debug_assert!(std::mem::size_of::<T>() <= self.stride);
        self.ptr.as_ptr().wrapping_add(i * self.stride) as *mut T
    }
}

impl Drop for ArrayMapping {
    fn drop(&mut self) {
        // SAFETY: exactly the range mmap returned.
        unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.len) };
    }
}

/// Turns on the kernel's BPF run-time statistics (`BPF_ENABLE_STATS`) for
/// as long as the returned fd is open.
pub fn enable_run_stats() -> Result<std::os::fd::OwnedFd> {
    Ok(aya::sys::enable_stats(aya::sys::Stats::RunTime)?)
}

/// Maps `len` bytes of a `BPF_F_MMAPABLE` map (its values from the first)
/// `MAP_SHARED`, read-write.
fn mmap_map(fd: BorrowedFd<'_>, len: usize) -> Result<NonNull<u8>> {
    // SAFETY: FFI with a valid fd and a length within the map's values
    // (the callers round to pages the map covers); checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        bail!("mmap {len} bytes: {}", std::io::Error::last_os_error());
    }
    NonNull::new(p as *mut u8).ok_or_else(|| anyhow!("mmap returned null"))
}
