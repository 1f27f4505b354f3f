//! One AF_XDP socket on one RX queue, over `xdpilone`.
//!
//! The UMEM lives in a memfd mapping (shared memory another process could map
//! too). Frames cycle through a local free list: the fill ring is topped up
//! from it, TX takes from it, RX and TX completions return to it. Frames that
//! do not fit a ring stay in the list instead of being lost (the kernel
//! publishes consumer progress late). Frames larger than one chunk use
//! multi-buffer descriptors (`XDP_USE_SG`, `XDP_PKT_CONTD`).
//!
//! It moves bytes between rings and UMEM; it does not parse them.

use std::ffi::CString;
use std::num::NonZeroU32;
use std::os::fd::RawFd;
use std::ptr::NonNull;

use anyhow::{anyhow, bail, Context, Result};
use xdpilone::xdp::XdpDesc;
use xdpilone::{DeviceQueue, IfInfo, RingRx, RingTx, Socket, SocketConfig, Umem, UmemConfig, User};

const XDP_COPY: u16 = 1 << 1;
const XDP_ZEROCOPY: u16 = 1 << 2;
const XDP_USE_NEED_WAKEUP: u16 = 1 << 3;
const XDP_USE_SG: u16 = 1 << 4;
/// Descriptor option: more fragments of this packet follow.
pub const XDP_PKT_CONTD: u32 = 1;
/// Most chunks one frame may span.
const MAX_FRAGS: usize = 32;
/// What a `send_with` builder returns for a frame larger than its buffer.
pub const NEEDS_LARGER: usize = usize::MAX;
/// Descriptors waiting for TX ring room before send_with pushes back.
const TX_BACKLOG_LIMIT: usize = 64;
/// Wakeups in a row without a completion that make a socket's TX stalled
/// (`Xsk::tx_stalled`): a retry exhausted (eight transmissions, each with
/// its wakeup) on a stalled queue reaches it.
const TX_STALL_WAKEUPS: u32 = 8;

/// How a socket ended up bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindMode {
    ZeroCopy,
    Copy,
}

impl BindMode {
    /// As `rdma-xdp stats` and the benchmark records say it.
    pub fn name(self) -> &'static str {
        match self {
            BindMode::ZeroCopy => "zero-copy",
            BindMode::Copy => "copy",
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct XskConfig {
    /// UMEM chunk size: 2048 or 4096 (larger fails on this kernel).
    pub frame_size: u32,
    pub frames: u32,
    pub ring_size: u32,
    /// Accept and send frames larger than one chunk.
    pub multi_buffer: bool,
    /// Try zero-copy first (falls back to copy mode).
    pub zero_copy: bool,
}

impl Default for XskConfig {
    fn default() -> Self {
        XskConfig {
            frame_size: 4096,
            frames: 8192,
            ring_size: 2048,
            multi_buffer: true,
            zero_copy: true,
        }
    }
}

/// An anonymous shared mapping backed by a memfd.
pub struct SharedMem {
    ptr: NonNull<u8>,
    len: usize,
    fd: RawFd,
}

// SAFETY: plain memory; access is coordinated by the owner.
unsafe impl Send for SharedMem {}

impl SharedMem {
    pub fn new(name: &str, len: usize) -> Result<SharedMem> {
        let cname = CString::new(name)?;
        // SAFETY: FFI with valid arguments; results are checked.
        unsafe {
            let fd = libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC);
            if fd < 0 {
                bail!("memfd_create: {}", std::io::Error::last_os_error());
            }
            if libc::ftruncate(fd, len as libc::off_t) != 0 {
                let e = std::io::Error::last_os_error();
                libc::close(fd);
                bail!("ftruncate memfd to {len} bytes: {e}");
            }
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                0,
            );
            if p == libc::MAP_FAILED {
                let e = std::io::Error::last_os_error();
                libc::close(fd);
                bail!("mmap {len} bytes: {e}");
            }
            Ok(SharedMem {
                ptr: NonNull::new(p as *mut u8).ok_or_else(|| anyhow!("mmap returned null"))?,
                len,
                fd,
            })
        }
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn fd(&self) -> RawFd {
        self.fd
    }
}

impl Drop for SharedMem {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping once.
        unsafe {
            libc::munmap(self.ptr.as_ptr() as *mut _, self.len);
            libc::close(self.fd);
        }
    }
}

/// The first `len` bytes of the UMEM chunk at `addr`, for TX. The mapping
/// is not borrowed from Rust memory, hence `&SharedMem`.
///
/// # Safety
///
/// The chunk must be ours alone for the lifetime of the slice: just taken
/// off the free list, its descriptor not yet queued to the kernel, and no
/// other slice of it alive.
#[allow(clippy::mut_from_ref)]
unsafe fn chunk_mut(mem: &SharedMem, addr: u64, len: usize) -> &mut [u8] {
    assert!(addr as usize + len <= mem.len(), "chunk outside UMEM");
    // SAFETY: inside the mapping (checked above), and by the caller's
    // contract nothing else, the kernel included, reads or writes the chunk
    // while the slice lives.
    unsafe { std::slice::from_raw_parts_mut(mem.as_ptr().add(addr as usize), len) }
}

/// The TX frames the kernel holds: handed over and not completed yet, and
/// the wakeups since it last completed one.
#[derive(Default)]
struct TxInKernel {
    frames: u64,
    unanswered: u32,
    /// The current stall was warned about.
    warned: bool,
}

impl TxInKernel {
    fn queued(&mut self, n: u64) {
        self.frames += n;
    }

    fn completed(&mut self) {
        self.frames = self.frames.saturating_sub(1);
        self.unanswered = 0;
        self.warned = false;
    }

    /// A wakeup was made; true when it shows a stall not warned about yet.
    fn woke(&mut self) -> bool {
        self.unanswered = self.unanswered.saturating_add(1);
        let warn = self.stalled() && !self.warned;
        self.warned |= warn;
        warn
    }

    /// Frames wait and `TX_STALL_WAKEUPS` wakeups in a row brought no
    /// completion (a driver completes a socket's frames on its next TX
    /// poll, which every wakeup starts, so a working one answers the first
    /// or second).
    fn stalled(&self) -> bool {
        self.frames > 0 && self.unanswered >= TX_STALL_WAKEUPS
    }
}

pub struct Xsk {
    // Field order is drop order: rings and sockets before the UMEM and memory.
    rx: RingRx,
    tx: RingTx,
    fq_cq: DeviceQueue,
    user: User,
    _sock: Socket,
    _umem: Umem,
    mem: SharedMem,
    frame_size: u32,
    free: Vec<u64>,
    /// Chunks [0, pinned_end) hold memory that TX descriptors point into
    /// directly (see `pin_chunks`); they never go back to the free list.
    pinned_end: u64,
    /// Frames to keep for the fill ring; TX may not dip below this.
    rx_reserve: usize,
    fill_target: u32,
    pub mode: BindMode,
    pub multi_buffer: bool,
    scratch: Vec<u8>,
    tx_pending_kick: bool,
    /// TX descriptors handed to the kernel and not yet completed, with the
    /// wakeups since its last completion; and the kicks in a row that left
    /// them there without a wakeup (zero-copy).
    tx_in_kernel: TxInKernel,
    tx_unwoken_kicks: u32,
    /// TX wakeups (sendto) made, those the stall rule made, and the last
    /// error one returned other than the busy ones copy mode gives: what a
    /// stalled zero-copy transmit looked like, for `stats`.
    tx_wakeups: u64,
    tx_stall_wakeups: u64,
    tx_wake_errno: i32,
    /// The queue this socket is bound to, for the stall warning.
    queue: u32,
    tx_backlog: std::collections::VecDeque<XdpDesc>,
    pub rx_frames: u64,
    pub tx_frames: u64,
    pub rx_dropped_oversize: u64,
}

// SAFETY: the only non-Send part is xdpilone's Umem, which holds a raw
// pointer to our memfd mapping (owned by this struct) and reference-counted
// fds (Arc, no Rc or Cell inside). The socket is moved to the data path
// thread once and used from that one thread only.
unsafe impl Send for Xsk {}

/// How the tools and the library bind their AF_XDP sockets, from
/// `RDMA_XDP_XSK` (`rdma-xdp --xsk` sets it for itself and the programs it
/// runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum XskBind {
    /// Zero-copy if the driver takes it with the configuration asked for,
    /// else copy mode: multi-buffer stays on, so frames above one chunk
    /// still work.
    #[default]
    Auto,
    /// Zero-copy or fail. A driver without multi-buffer zero-copy
    /// (virtio-net) is bound without multi-buffer: frames then have to fit
    /// one chunk (paths up to MTU 2048 with 4 KiB chunks).
    ZeroCopy,
    /// Copy mode.
    Copy,
}

/// The environment variable behind [`XskBind::from_env`].
pub const XSK_BIND_ENV: &str = "RDMA_XDP_XSK";

impl XskBind {
    pub fn parse(s: &str) -> Option<XskBind> {
        match s {
            "" | "auto" => Some(XskBind::Auto),
            "zero-copy" | "zc" => Some(XskBind::ZeroCopy),
            "copy" => Some(XskBind::Copy),
            _ => None,
        }
    }

    pub fn from_env() -> Result<XskBind> {
        let v = std::env::var(XSK_BIND_ENV).unwrap_or_default();
        XskBind::parse(&v)
            .ok_or_else(|| anyhow!("{XSK_BIND_ENV}={v}: expected auto, zero-copy or copy"))
    }

    /// `cfg` as this policy asks for it.
    pub fn apply(self, mut cfg: XskConfig) -> XskConfig {
        match self {
            XskBind::Auto => {}
            XskBind::ZeroCopy => cfg.zero_copy = true,
            XskBind::Copy => cfg.zero_copy = false,
        }
        cfg
    }
}

impl Xsk {
    /// Binds zero-copy when `cfg.zero_copy` and the driver allows it, else
    /// copy mode.
    pub fn open(ifname: &str, queue: u32, cfg: XskConfig) -> Result<Xsk> {
        Self::open_with(ifname, queue, cfg, XskBind::Auto)
    }

    /// [`Xsk::open`] under a bind policy: with [`XskBind::ZeroCopy`] a
    /// zero-copy bind refused with multi-buffer is retried without it, and
    /// copy mode is never taken.
    pub fn open_with(ifname: &str, queue: u32, cfg: XskConfig, bind: XskBind) -> Result<Xsk> {
        let cfg = bind.apply(cfg);
        if cfg.zero_copy {
            let first = match Self::open_mode(ifname, queue, cfg, BindMode::ZeroCopy) {
                Ok(x) => return Ok(x),
                Err(e) => e,
            };
            if bind != XskBind::ZeroCopy {
                log::debug!(
                    "{ifname} queue {queue}: zero-copy bind failed ({first:#}); using copy mode"
                );
            } else if !cfg.multi_buffer {
                return Err(first.context("zero-copy was asked for (--xsk zero-copy)"));
            } else {
                let single = XskConfig {
                    multi_buffer: false,
                    ..cfg
                };
                return Self::open_mode(ifname, queue, single, BindMode::ZeroCopy).map_err(|e| {
                    e.context(format!(
                        "zero-copy was asked for (--xsk zero-copy); with multi-buffer: {first:#}"
                    ))
                });
            }
        }
        Self::open_mode(ifname, queue, cfg, BindMode::Copy)
    }

    fn open_mode(ifname: &str, queue: u32, cfg: XskConfig, mode: BindMode) -> Result<Xsk> {
        let len = cfg.frames as usize * cfg.frame_size as usize;
        let mem = SharedMem::new(&format!("rdma-umem-{ifname}-{queue}"), len)?;
        let area = NonNull::slice_from_raw_parts(mem.ptr, len);
        let ucfg = UmemConfig {
            fill_size: cfg.ring_size,
            complete_size: cfg.ring_size,
            frame_size: cfg.frame_size,
            headroom: 0,
            flags: 0,
        };
        // SAFETY: the area is page aligned (mmap) and outlives the Umem (field order).
        let umem = unsafe { Umem::new(ucfg, area) }.map_err(|e| anyhow!("create UMEM: {e:?}"))?;
        let mut info = IfInfo::invalid();
        let cname = CString::new(ifname)?;
        info.from_name(&cname)
            .map_err(|e| anyhow!("interface {ifname}: {e:?}"))?;
        info.set_queue(queue);
        let sock = Socket::with_shared(&info, &umem)
            .map_err(|e| anyhow!("AF_XDP socket on {ifname}: {e:?} (needs root / CAP_NET_RAW)"))?;
        let fq_cq = umem
            .fq_cq(&sock)
            .map_err(|e| anyhow!("fill/completion rings: {e:?}"))?;
        let mut flags = XDP_USE_NEED_WAKEUP;
        flags |= match mode {
            BindMode::ZeroCopy => XDP_ZEROCOPY,
            BindMode::Copy => XDP_COPY,
        };
        if cfg.multi_buffer {
            flags |= XDP_USE_SG;
        }
        let user = umem
            .rx_tx(
                &sock,
                &SocketConfig {
                    rx_size: NonZeroU32::new(cfg.ring_size),
                    tx_size: NonZeroU32::new(cfg.ring_size),
                    bind_flags: flags,
                },
            )
            .map_err(|e| anyhow!("rx/tx rings: {e:?}"))?;
        let rx = user.map_rx().map_err(|e| anyhow!("map rx ring: {e:?}"))?;
        let tx = user.map_tx().map_err(|e| anyhow!("map tx ring: {e:?}"))?;
        let mut free: Vec<u64> = (0..cfg.frames as u64)
            .map(|i| i * cfg.frame_size as u64)
            .collect();
        // Fill before bind: virtio-net's zero-copy RX takes fill
        // descriptors when the bind resets its queue, and with need-wakeup
        // a queue that found the fill ring empty then has no buffer, so no
        // receive interrupt, and its wakeup schedules only the TX side:
        // nothing would ever be received. Other drivers do not mind.
        let mut fq_cq = fq_cq;
        {
            let want = cfg.ring_size.min(free.len() as u32);
            let mut w = fq_cq.fill(want);
            let n = w.insert(free.iter().rev().take(want as usize).copied());
            w.commit();
            drop(w);
            free.truncate(free.len() - n as usize);
        }
        umem.bind(&user)
            .map_err(|e| anyhow!("bind {ifname} queue {queue} ({mode:?}): {e:?}"))?;
        let mut x = Xsk {
            rx,
            tx,
            fq_cq,
            user,
            _sock: sock,
            _umem: umem,
            mem,
            frame_size: cfg.frame_size,
            free,
            pinned_end: 0,
            rx_reserve: (cfg.frames / 2) as usize,
            fill_target: cfg.ring_size,
            mode,
            multi_buffer: cfg.multi_buffer,
            scratch: vec![
                0u8;
                if cfg.multi_buffer {
                    9216 + 4096
                } else {
                    cfg.frame_size as usize
                }
            ],
            tx_pending_kick: false,
            tx_in_kernel: TxInKernel::default(),
            tx_unwoken_kicks: 0,
            tx_wakeups: 0,
            tx_stall_wakeups: 0,
            tx_wake_errno: 0,
            queue,
            tx_backlog: std::collections::VecDeque::with_capacity(TX_BACKLOG_LIMIT + MAX_FRAGS),
            rx_frames: 0,
            tx_frames: 0,
            rx_dropped_oversize: 0,
        };
        x.refill();
        Ok(x)
    }

    /// The kernel's counters of this socket: frames it dropped because the
    /// RX ring was full or the fill ring empty (UMEM exhausted).
    pub fn kernel_stats(&self) -> xdpilone::xdp::XdpStatisticsV2 {
        self.fq_cq.statistics_v2().unwrap_or_default()
    }

    /// The socket's fd, for the XSKMAP.
    pub fn fd(&self) -> RawFd {
        self.user.as_raw_fd()
    }

    pub fn frame_size(&self) -> u32 {
        self.frame_size
    }

    /// Largest frame this socket can send or receive.
    pub fn max_frame(&self) -> usize {
        if self.multi_buffer {
            self.scratch.len()
        } else {
            self.frame_size as usize
        }
    }

    /// Tops up the fill ring from the free list; what does not fit stays.
    pub fn refill(&mut self) {
        let want = self.fill_target.min(self.free.len() as u32);
        if want == 0 {
            return;
        }
        let mut w = self.fq_cq.fill(want);
        // The ring may take fewer than offered: offer from the tail and
        // remove exactly the n that went in (the last n of the list).
        let n = w.insert(self.free.iter().rev().take(want as usize).copied());
        w.commit();
        drop(w);
        self.free.truncate(self.free.len() - n as usize);
        if n > 0 && self.fq_cq.needs_wakeup() {
            self.fq_cq.wake();
        }
    }

    /// A zero-copy driver takes fill descriptors only when it runs: once it
    /// has run dry it sets the ring's need-wakeup flag and drops what
    /// arrives until a poll() makes it take what is already in the ring.
    /// `refill` wakes it only when it adds descriptors, and a full fill
    /// ring adds none, so an idle receive turn checks too (a flag read;
    /// the syscall only while the flag is up).
    fn wake_fill(&mut self) {
        if self.fq_cq.pending() > 0 && self.fq_cq.needs_wakeup() {
            self.fq_cq.wake();
        }
    }

    /// Returns TX frames the kernel has finished with to the free list.
    pub fn reap(&mut self) {
        let mut c = self.fq_cq.complete(self.fill_target);
        while let Some(addr) = c.read() {
            self.tx_in_kernel.completed();
            if addr >= self.pinned_end {
                self.free.push(addr & !(self.frame_size as u64 - 1));
            }
        }
        c.release();
    }

    /// Delivers up to `budget` received frames to `f` as contiguous bytes
    /// (multi-buffer frames are gathered), then recycles their chunks.
    pub fn recv(&mut self, budget: u32, mut f: impl FnMut(&[u8])) -> u32 {
        let mut delivered = 0;
        let avail = self.rx.available();
        if avail == 0 {
            self.wake_fill();
            return 0;
        }
        let mut chunks: [u64; 32] = [0; 32];
        let mut r = self.rx.receive(avail.min(budget * 4));
        let mut len = 0usize;
        let mut nchunks = 0usize;
        let mut oversize = false;
        while let Some(d) = r.read() {
            let base = d.addr & !(self.frame_size as u64 - 1);
            if nchunks < chunks.len() {
                chunks[nchunks] = base;
                nchunks += 1;
            } else {
                self.free.push(base);
                oversize = true;
            }
            let piece_len = d.len as usize;
            if len + piece_len <= self.scratch.len() {
                let off = d.addr as usize;
                assert!(off + piece_len <= self.mem.len(), "descriptor outside UMEM");
                // SAFETY: the kernel handed us this descriptor (it no longer
                // writes the chunk until we give it back), and the bounds are
                // checked against the mapping just above.
                let src =
                    unsafe { std::slice::from_raw_parts(self.mem.as_ptr().add(off), piece_len) };
                self.scratch[len..len + piece_len].copy_from_slice(src);
                len += piece_len;
            } else {
                oversize = true;
            }
            if d.options & XDP_PKT_CONTD != 0 {
                continue;
            }
            if oversize {
                self.rx_dropped_oversize += 1;
            } else {
                f(&self.scratch[..len]);
                delivered += 1;
            }
            self.rx_frames += 1;
            self.free.extend_from_slice(&chunks[..nchunks]);
            nchunks = 0;
            len = 0;
            oversize = false;
            if delivered >= budget {
                break;
            }
        }
        // A packet cut off by the batch end keeps its chunks; they are rare
        // and returned here rather than leaked.
        self.free.extend_from_slice(&chunks[..nchunks]);
        r.release();
        drop(r);
        self.refill();
        delivered
    }

    /// Free chunks available for transmission (keeping the RX reserve).
    pub fn tx_room(&self) -> usize {
        self.free.len().saturating_sub(self.rx_reserve)
    }

    /// Sends one frame built by `build`, which gets a buffer and returns the
    /// frame length: 0 for nothing to send, [`NEEDS_LARGER`] for a frame
    /// that does not fit this buffer. `build` first gets one UMEM chunk to
    /// write into directly, so a frame that fits a chunk is copied once
    /// (payload from the MR into the chunk); only when it asks for more and
    /// the socket is multi-buffer does it get a `max_frame()` scratch
    /// buffer, whose frame goes out as several chunks. Chunks for the
    /// largest frame are secured *before* `build` runs, and descriptors that
    /// do not fit the TX ring wait in a local backlog, so a frame the caller
    /// produced is never dropped here. Returns false when nothing was sent
    /// (no chunks, or the backlog is long: backpressure).
    pub fn send_with(&mut self, mut build: impl FnMut(&mut [u8]) -> usize) -> bool {
        let fs = self.frame_size as usize;
        let max = self.max_frame();
        if !self.tx_reserve(max.div_ceil(fs).min(MAX_FRAGS)) {
            return false;
        }
        let addr = self.free.pop().expect("room checked");
        // SAFETY: `addr` was just popped off the free list: no descriptor
        // for it is queued, and no other slice of it exists.
        let len = build(unsafe { chunk_mut(&self.mem, addr, fs) });
        if len > 0 && len <= fs {
            self.tx_backlog.push_back(XdpDesc {
                addr,
                len: len as u32,
                options: 0,
            });
            return self.sent_one();
        }
        self.free.push(addr);
        if len != NEEDS_LARGER || !self.multi_buffer {
            return false;
        }
        let len = build(&mut self.scratch[..max]);
        if len == 0 || len > max {
            return false;
        }
        let nchunks = len.div_ceil(fs);
        for i in 0..nchunks {
            let addr = self.free.pop().expect("room checked");
            let piece = (len - i * fs).min(fs);
            // SAFETY: popped off the free list just now, not yet queued.
            unsafe { chunk_mut(&self.mem, addr, piece) }
                .copy_from_slice(&self.scratch[i * fs..i * fs + piece]);
            self.tx_backlog.push_back(XdpDesc {
                addr,
                len: piece as u32,
                options: if i + 1 < nchunks { XDP_PKT_CONTD } else { 0 },
            });
        }
        self.sent_one()
    }

    /// Room for a frame of `chunks` chunks: the backlog is not full, and
    /// that many chunks are free (after reaping completions if needed).
    fn tx_reserve(&mut self, chunks: usize) -> bool {
        self.flush_backlog();
        if self.tx_backlog.len() >= TX_BACKLOG_LIMIT {
            return false;
        }
        if self.tx_room() < chunks {
            self.reap();
        }
        self.tx_room() >= chunks
    }

    fn sent_one(&mut self) -> bool {
        self.flush_backlog();
        self.tx_frames += 1;
        self.tx_pending_kick = true;
        true
    }

    /// Takes the first `n` chunks out of circulation, for memory that TX
    /// descriptors will point into without a copy (memory registered inside
    /// the UMEM). Only before any traffic: those chunks must still be free.
    pub fn pin_chunks(&mut self, n: usize) -> Result<&mut [u8]> {
        let fs = self.frame_size as u64;
        let want: Vec<u64> = (0..n as u64).map(|i| i * fs).collect();
        if self.pinned_end != 0 || self.free.len() < n || self.free[..n] != want[..] {
            bail!("pin_chunks: the first {n} chunks are not free");
        }
        self.free.drain(..n);
        self.pinned_end = n as u64 * fs;
        // SAFETY: the pinned chunks are inside the mapping and no longer
        // handed to the kernel for RX.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.mem.as_ptr(), self.pinned_end as usize) })
    }

    /// Sends one frame as a descriptor chain: `head` copied into a fresh
    /// chunk, then `tail` (UMEM address, length) descriptors that point
    /// into pinned chunks, each within one chunk. Needs multi-buffer.
    pub fn send_chain(&mut self, head: &[u8], tail: &[(u64, u32)]) -> bool {
        let fs = self.frame_size as u64;
        debug_assert!(tail
            .iter()
            .all(|&(a, l)| a + l as u64 <= self.pinned_end && a / fs == (a + l as u64 - 1) / fs));
        if !self.multi_buffer || head.len() > fs as usize || tail.len() + 1 > MAX_FRAGS {
            return false;
        }
        if !self.tx_reserve(1) {
            return false;
        }
        let addr = self.free.pop().expect("room checked");
        // SAFETY: popped off the free list just now, not yet queued.
        unsafe { chunk_mut(&self.mem, addr, head.len()) }.copy_from_slice(head);
        self.tx_backlog.push_back(XdpDesc {
            addr,
            len: head.len() as u32,
            options: if tail.is_empty() { 0 } else { XDP_PKT_CONTD },
        });
        for (i, &(a, l)) in tail.iter().enumerate() {
            self.tx_backlog.push_back(XdpDesc {
                addr: a,
                len: l,
                options: if i + 1 < tail.len() { XDP_PKT_CONTD } else { 0 },
            });
        }
        self.sent_one()
    }

    /// Moves backlogged descriptors into the TX ring, as many as fit. A
    /// multi-buffer packet may be split across calls: the kernel keeps a
    /// partial packet until its last fragment arrives. Inserting what fits
    /// (rather than waiting for room for a whole packet) also lets xdpilone
    /// refresh its cached view of the ring, which it does only when the
    /// cached free count reaches zero.
    fn flush_backlog(&mut self) {
        if self.tx_backlog.is_empty() {
            return;
        }
        let mut w = self.tx.transmit(self.tx_backlog.len() as u32);
        let n = w.insert(self.tx_backlog.iter().copied());
        w.commit();
        drop(w);
        self.tx_backlog.drain(..n as usize);
        if n > 0 {
            self.tx_pending_kick = true;
            self.tx_in_kernel.queued(n as u64);
        }
    }

    /// Sends `frame` (copied into UMEM).
    pub fn send(&mut self, frame: &[u8]) -> bool {
        self.send_with(|buf| {
            if frame.len() > buf.len() {
                return NEEDS_LARGER;
            }
            buf[..frame.len()].copy_from_slice(frame);
            frame.len()
        })
    }

    /// Tells the kernel about queued TX descriptors (needed in copy mode and
    /// whenever the kernel asks for a wakeup).
    pub fn kick(&mut self) {
        const STALL_KICKS: u32 = 256;
        self.flush_backlog();
        // Copy mode transmits at most 32 descriptors per wakeup (the
        // kernel's xsk_generic_xmit batch): keep waking while the kernel has
        // not consumed everything, not only when new frames were queued.
        let pending = self.tx_pending_kick || self.tx.pending() > 0;
        self.tx_pending_kick = false;
        if pending && (self.tx.needs_wakeup() || self.mode == BindMode::Copy) {
            self.tx_wake();
            self.tx_unwoken_kicks = 0;
        } else if self.tx_in_kernel.frames > 0 {
            // Zero-copy: the driver said it needs no wakeup, yet frames
            // stay uncompleted. Once (TCG guests, virtio-net) none of the
            // 14 frames a responder queued reached its peer, which ran
            // into RETRY_EXC_ERR: most likely a driver that stopped
            // without asking for a wakeup (not proven). A wakeup after
            // this many kicks in a row costs one syscall and restarts
            // such a driver.
            self.tx_unwoken_kicks += 1;
            if self.tx_unwoken_kicks >= STALL_KICKS {
                self.tx_wake();
                self.tx_stall_wakeups += 1;
                self.tx_unwoken_kicks = 0;
            }
        } else {
            self.tx_unwoken_kicks = 0;
        }
        self.reap();
    }

    /// The TX wakeup: an empty non-blocking sendto, as xdpilone's
    /// `RingTx::wake` makes it, but with its error kept. EAGAIN, EBUSY and
    /// ENOBUFS are copy mode's "try again" and not errors here.
    fn tx_wake(&mut self) {
        self.tx_wakeups += 1;
        if self.tx_in_kernel.woke() {
            log::warn!(
                "AF_XDP queue {} ({:?}): {} TX frames wait for the kernel to complete them and {} wakeups in a row brought no completion; its transmit looks stalled",
                self.queue,
                self.mode,
                self.tx_in_kernel.frames,
                TX_STALL_WAKEUPS
            );
        }
        // SAFETY: a zero-length sendto with no buffer and no address on
        // the socket's own fd, which lives as long as `self.tx`.
        let r = unsafe {
            libc::sendto(
                self.tx.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
        if r < 0 {
            let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            if e != libc::EAGAIN && e != libc::EBUSY && e != libc::ENOBUFS {
                self.tx_wake_errno = e;
            }
        }
    }

    /// Whether the kernel stopped transmitting for this socket: frames it
    /// holds stay uncompleted through `TX_STALL_WAKEUPS` wakeups in a row.
    pub fn tx_stalled(&self) -> bool {
        self.tx_in_kernel.stalled()
    }

    /// Whether every frame handed to this socket has left: nothing waits
    /// in the backlog or in the TX ring for the kernel.
    pub fn tx_drained(&self) -> bool {
        self.tx_backlog.is_empty() && self.tx.pending() == 0
    }

    /// One line of ring and pool state, for diagnostics.
    pub fn debug_state(&self) -> String {
        format!(
            "free={} tx_backlog={} tx_pending={} tx_uncompleted={} wakeups={} stall_wakeups={} unanswered={} wake_errno={} fill_pending={} rx_avail={} rx={} tx={}",
            self.free.len(),
            self.tx_backlog.len(),
            self.tx.pending(),
            self.tx_in_kernel.frames,
            self.tx_wakeups,
            self.tx_stall_wakeups,
            self.tx_in_kernel.unanswered,
            self.tx_wake_errno,
            self.fq_cq.pending(),
            self.rx.available(),
            self.rx_frames,
            self.tx_frames
        )
    }
}

/// Number of RX queues of an interface (from sysfs).
pub fn rx_queues(ifname: &str) -> Result<u32> {
    let dir = format!("/sys/class/net/{ifname}/queues");
    let n = std::fs::read_dir(&dir)
        .with_context(|| format!("interface {ifname} not found (no {dir})"))?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
        .count();
    Ok(n.max(1) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transmit_is_stalled_after_eight_unanswered_wakeups_and_warned_once() {
        let mut t = TxInKernel::default();
        t.queued(3);
        // A working driver: a completion after each wakeup or two.
        for _ in 0..20 {
            assert!(!t.woke());
            assert!(!t.woke());
            t.completed();
            t.queued(1);
        }
        assert!(!t.stalled());
        // A stalled one: the eighth unanswered wakeup warns, later ones not.
        let warned: Vec<bool> = (0..12).map(|_| t.woke()).collect();
        assert_eq!(warned.iter().filter(|w| **w).count(), 1);
        assert!(warned[TX_STALL_WAKEUPS as usize - 1]);
        assert!(t.stalled());
        // A completion ends it; a new stall warns again.
        t.completed();
        assert!(!t.stalled());
        assert_eq!((0..TX_STALL_WAKEUPS).filter(|_| t.woke()).count(), 1);
        // Wakeups with nothing held are no stall.
        let mut idle = TxInKernel::default();
        assert_eq!((0..20).filter(|_| idle.woke()).count(), 0);
        assert!(!idle.stalled());
    }
}
