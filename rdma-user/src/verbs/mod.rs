//! A verbs-style library API, shaped like libibverbs: open a [`Context`] on
//! an interface, then protection domains ([`Pd`]), memory regions ([`Mr`]),
//! completion queues ([`Cq`]) and RC queue pairs ([`Qp`]).
//!
//! The data path (XDP program, AF_XDP sockets, the RC engines) is shared
//! by a thread of its own and the program's threads: whoever holds its
//! lock runs it. A control call below takes the lock and runs on the
//! caller's thread between two polls. A post or a poll only tries it
//! ([`Context::progress`]): the program's own busy polling moves its
//! packets with no thread switch, and the data path thread does it
//! whenever the program is away, spinning or, with [`Polling::Adaptive`],
//! sleeping in poll(2) until a frame, a post or a timer needs it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::device::datapath::{CcConfig, Connect, DataPath, Path, Turn};
use crate::device::error::DeviceError;
use crate::device::rings::{AsyncShared, CqShared, Doorbell, OwnedRecvWr, OwnedSendWr, QpRings};
use crate::device::runner::shared_data_path_loop;
use crate::device::standalone::{Attachment, Standalone};
use crate::io::xdp::XdpMode;
use crate::memory::Access;
use crate::transport::{PostError, QpAttr, QpCap, QpState, QpType, RecvWr, SendWr, Sge, Wc};

/// How long a program's polls hold the ACKs they owe back for its next
/// post (see [`Turn::Poll`]): an MPI rank over UCX posts its reply 1-3 us
/// after the turn that received the message. An 8-byte MPI ping-pong over
/// `pml ucx` took 1.9 sendto calls per round trip and 8.9 us without the
/// hold, 1.0 and 6.2 us with it, and 4.8 us once the reply went before
/// the ACK.
const ACK_HOLD_NS: u64 = 5_000;

/// What a verbs call can fail with. [`Error::errno`] is what rdma-core's
/// verbs would return for the same failure.
#[derive(Debug)]
pub enum Error {
    /// The interface could not be opened (XDP attach, AF_XDP sockets,
    /// another owner): the cause, as the I/O layer words it.
    Open(String),
    /// The data path thread is gone (it panicked or the context stopped).
    Stopped,
    /// The device refused the call.
    Device(DeviceError),
    /// A byte range outside the memory region.
    OutOfRange { offset: usize, len: usize },
}

impl Error {
    pub fn errno(&self) -> i32 {
        match self {
            Error::Open(_) => libc::ENODEV,
            Error::Stopped => libc::EIO,
            Error::Device(e) => e.errno(),
            Error::OutOfRange { .. } => libc::EINVAL,
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Open(e) => write!(f, "open the device: {e}"),
            Error::Stopped => f.write_str("data path has stopped"),
            Error::Device(e) => e.fmt(f),
            Error::OutOfRange { offset, len } => {
                write!(f, "{len} bytes at offset {offset} are outside the MR")
            }
        }
    }
}

impl std::error::Error for Error {}

impl From<DeviceError> for Error {
    fn from(e: DeviceError) -> Self {
        Error::Device(e)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How the data path thread waits for work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Polling {
    /// Spin on the rings (lowest latency; takes a core).
    #[default]
    Spin,
    /// Spin while packets move, back off to short sleeps when idle.
    Adaptive,
}

#[derive(Debug, Clone, Default)]
pub struct ContextOptions {
    pub polling: Polling,
    /// Pin the data path thread to this CPU.
    pub cpu: Option<usize>,
    /// Raise the (adaptive) data path thread's priority when allowed
    /// ([`crate::device::runner::make_latency_sensitive`]).
    pub boost: bool,
    /// Where asynchronous events go (QP fatal); none: dropped.
    pub events: Option<Arc<AsyncShared>>,
    /// ECN and DCQCN (the line rate is the interface's speed when it has
    /// one).
    pub cc: CcConfig,
}

/// An open device: the data path thread and what keeps XDP attached.
#[derive(Clone)]
pub struct Context {
    inner: Arc<Inner>,
}

struct Inner {
    dp: Arc<Mutex<DataPath>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// Dropped after the thread stops: detaches XDP, releases the interface.
    attachment: Option<Attachment>,
    iface: String,
    mac: [u8; 6],
    /// Wakes the data path thread (to stop it, or for posted work).
    doorbell: Arc<Doorbell>,
}

/// Runs the data path while it finds work (64 turns at most): everything
/// due is sent before a QP or the device goes away.
fn flush(dp: &mut DataPath) {
    for _ in 0..64 {
        if !dp.poll_flushed().0 {
            break;
        }
    }
    // Due frames are queued now; they must also leave before the socket
    // can close. A link that takes nothing for 100 ms is not waited for.
    dp.drain_tx(std::time::Duration::from_millis(100));
}

impl Drop for Inner {
    fn drop(&mut self) {
        // No handle is left to post or poll: stop the data path, then
        // detach (field order would drop the attachment first).
        self.stop.store(true, Ordering::Relaxed);
        self.doorbell.ring();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // What the last turns left due (an ACK for the message the program
        // saw last, when it closes without destroying its QPs) still goes.
        if let Ok(mut dp) = self.dp.lock() {
            flush(&mut dp);
        }
        if stats_wanted() {
            self.print_stats();
        }
        drop(self.attachment.take());
    }
}

/// RDMA_XDP_STATS=1: the counters on stderr at close (what `rdma-xdp
/// stats` shows for a daemon), for a program's run.
fn stats_wanted() -> bool {
    std::env::var_os("RDMA_XDP_STATS").is_some()
}

/// The contexts still open, for the `atexit` hook: a program may exit
/// without closing its device (perftest's passive read and atomic latency
/// servers do, and so does `fi_pingpong`). What its data path still owes
/// the peers (the ACK of the last message, held for a reply that never
/// comes) must leave all the same, and with RDMA_XDP_STATS its counters
/// are wanted too.
static OPEN: Mutex<Vec<std::sync::Weak<Inner>>> = Mutex::new(Vec::new());

/// Flushes every context still open, and prints its counters when asked
/// (an `atexit` hook).
extern "C" fn at_exit() {
    let open: Vec<_> = match OPEN.lock() {
        Ok(mut v) => v.drain(..).filter_map(|w| w.upgrade()).collect(),
        Err(_) => return,
    };
    for inner in open {
        // The data path thread lets go between turns; a program thread
        // stuck holding it (it never should) is not waited for long.
        let t0 = std::time::Instant::now();
        while t0.elapsed() < std::time::Duration::from_millis(100) {
            if let Ok(mut dp) = inner.dp.try_lock() {
                flush(&mut dp);
                break;
            }
            std::thread::yield_now();
        }
        if stats_wanted() {
            inner.print_stats();
        }
    }
}

impl Inner {
    fn print_stats(&self) {
        if let Ok(dp) = self.dp.lock() {
            eprintln!("rdma-xdp stats {}: {}", self.iface, dp.stats_json());
        }
        if let Some(Ok(m)) = self.attachment.as_ref().map(|a| a.xdp.stats_map()) {
            let n = |k: &str| m.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
            let (acked, read) = (n("xdp_acked"), n("xdp_read"));
            let served = n("xdp_placed") + acked + read;
            eprintln!(
                "rdma-xdp xdp {}: {}",
                self.iface,
                serde_json::Value::Object(m)
            );
            if served > 0 {
                eprintln!(
                    "rdma-xdp: the XDP responder served {served} packets ({} answered by XDP_TX)",
                    acked + read
                );
            }
        }
    }
}

/// The XDP responder's packets in the XDP program's counters: placed
/// without an answer, and placed and ACKed by XDP.
fn placed_and_acked(m: &serde_json::Map<String, serde_json::Value>) -> (u64, u64) {
    let n = |k: &str| m.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
    (n("xdp_placed"), n("xdp_acked"))
}

const _: () = {
    const fn shareable<T: Send + Sync>() {}
    shareable::<Context>();
};

impl Context {
    /// Opens `iface`: attaches the XDP program, opens an AF_XDP socket per
    /// RX queue and starts the data path thread.
    pub fn open(iface: &str, opts: ContextOptions) -> Result<Context> {
        let dev = Standalone::open(iface, XdpMode::Auto, true)
            .map_err(|e| Error::Open(format!("{e:#}")))?;
        let mac = dev.mac;
        let (mut dp, attachment) = dev.split();
        let doorbell = Arc::new(
            Doorbell::new().map_err(|e| Error::Open(format!("create the doorbell: {e}")))?,
        );
        dp.core.doorbell = Some(doorbell.clone());
        dp.core.async_events = opts.events.clone();
        dp.core.set_cc(opts.cc, iface);
        let stop = Arc::new(AtomicBool::new(false));
        let dp = Arc::new(Mutex::new(dp));
        let thread = {
            let (dp, stop) = (dp.clone(), stop.clone());
            let adaptive = opts.polling == Polling::Adaptive;
            std::thread::Builder::new()
                .name(format!("rdma-dp-{iface}"))
                .spawn(move || shared_data_path_loop(dp, stop, adaptive, opts.cpu, opts.boost))
                .map_err(|e| Error::Open(format!("start the data path thread: {e}")))?
        };
        let inner = Arc::new(Inner {
            dp,
            stop,
            thread: Some(thread),
            attachment: Some(attachment),
            iface: iface.to_string(),
            mac,
            doorbell,
        });
        static HOOK: std::sync::Once = std::sync::Once::new();
        // SAFETY: registers a plain function that takes no argument and
        // touches only our own statics and live contexts.
        HOOK.call_once(|| unsafe {
            libc::atexit(at_exit);
        });
        if let Ok(mut v) = OPEN.lock() {
            v.retain(|w| w.strong_count() > 0);
            v.push(Arc::downgrade(&inner));
        }
        Ok(Context { inner })
    }

    pub fn iface(&self) -> &str {
        &self.inner.iface
    }

    /// The XDP responder's packets on this interface so far: placed
    /// without an answer, and placed and ACKed by XDP (the XDP program's
    /// counters).
    pub fn xdp_stats(&self) -> Option<(u64, u64)> {
        let m = self.inner.attachment.as_ref()?.xdp.stats_map().ok()?;
        Some(placed_and_acked(&m))
    }

    pub fn mac(&self) -> [u8; 6] {
        self.inner.mac
    }

    /// The data path, waiting for whoever runs it; `Stopped` once a
    /// panic inside it left the engine unusable.
    fn lock(&self) -> Result<MutexGuard<'_, DataPath>> {
        self.inner.dp.lock().map_err(|_| Error::Stopped)
    }

    /// Runs `f` on the data path between two of its polls.
    fn call<R, E: Into<Error>>(
        &self,
        f: impl FnOnce(&mut DataPath) -> std::result::Result<R, E>,
    ) -> Result<R> {
        let mut dp = self.lock()?;
        // ACKs the program's polls held back for a reply go before any
        // control call: one that moves the QP to the error state
        // (rdma_disconnect does) or destroys it would lose them, and the
        // peer's last message would retry until RETRY_EXC_ERR.
        if dp.acks_held() {
            dp.flush_kick();
        }
        let r = f(&mut dp).map_err(Into::into);
        drop(dp);
        // The call may have queued work or moved a deadline.
        self.inner.doorbell.ring();
        r
    }

    /// One turn of the data path on the calling thread, if nobody else is
    /// running it (then that one moves the work). Returns whether it ran:
    /// if not, a poster rings [`Context::wake`]. Never waits; for the
    /// post and poll fast paths.
    pub fn progress(&self) -> bool {
        match self.inner.dp.try_lock() {
            Ok(mut dp) => {
                self.turn(
                    &mut dp,
                    Turn::Poll {
                        hold_acks: ACK_HOLD_NS,
                    },
                );
                true
            }
            Err(_) => false,
        }
    }

    /// Posts `wr` to QP `qpn` straight into its engine and takes a turn
    /// ([`Context::progress`]), if nobody else runs the data path and no WR
    /// waits in `rings` (see [`Core::post_send_direct`]). `None`: push it
    /// to `rings` instead.
    pub fn post_send_now(
        &self,
        qpn: u32,
        rings: &Arc<QpRings>,
        wr: &SendWr,
    ) -> Option<std::result::Result<(), PostError>> {
        let mut dp = self.inner.dp.try_lock().ok()?;
        let r = dp.core.post_send_direct(qpn, rings, wr)?;
        if r.is_ok() {
            self.turn(&mut dp, Turn::Post);
        }
        Some(r)
    }

    /// Posts a receive WR straight into QP `qpn`'s engine, as
    /// [`Context::post_send_now`] does, without a turn (a receive WR is
    /// only needed by a message that has arrived, and every turn that
    /// handles arrived messages takes the WRs first).
    pub fn post_recv_now(
        &self,
        qpn: u32,
        rings: &Arc<QpRings>,
        wr: &RecvWr,
    ) -> Option<std::result::Result<(), PostError>> {
        let mut dp = self.inner.dp.try_lock().ok()?;
        dp.core.post_recv_direct(qpn, rings, wr)
    }

    /// One turn of the data path on the calling thread, which holds it.
    fn turn(&self, dp: &mut DataPath, who: Turn) {
        let next = dp.poll_as(who).1;
        let now = dp.turn_at();
        self.inner.doorbell.inline_turn(now);
        // A turn that answered what it received (ACKs) leaves them to
        // the next turns, so that the program's next send takes them
        // along in one syscall: the program's next post or poll, or
        // the data path thread's turn, if that comes within the
        // longest inline hold. Otherwise nobody may take a turn for
        // long: send them now.
        if dp.kick_pending()
            && !self
                .inner
                .doorbell
                .turns_by(now.saturating_add(crate::device::rings::INLINE_HOLD_MAX_NS))
        {
            dp.flush_kick();
        }
        if let Some(t) = next {
            // A new deadline (a retransmission timer) before the
            // sleeping thread's wake-up: it must wake for it.
            self.inner.doorbell.ring_if_before(t);
        }
    }

    /// Gives QP1's MADs to a CM (`None`: QP1 frames are dropped again).
    pub fn set_gsi(&self, gsi: Option<Arc<crate::device::gsi::Gsi>>) -> Result<()> {
        self.call(|dp| {
            dp.core.gsi = gsi;
            Ok::<_, Error>(())
        })
    }

    /// The program will wait for a completion event rather than poll: the
    /// data path thread takes frames again from now on.
    pub fn will_wait_for_events(&self) {
        self.inner.doorbell.end_inline();
    }

    /// Wakes the data path thread if it sleeps (after posting work that
    /// [`Context::progress`] could not move).
    pub fn wake(&self) {
        self.inner.doorbell.ring();
    }

    pub fn alloc_pd(&self) -> Result<Pd> {
        let pdn = self.call(|dp| Ok::<_, Error>(dp.core.alloc_pd()))?;
        Ok(Pd {
            ctx: self.clone(),
            pdn,
        })
    }

    /// A completion queue of `depth` entries.
    pub fn create_cq(&self, depth: usize) -> Result<Cq> {
        let cqn = self.call(move |dp| dp.core.create_cq(depth))?;
        Ok(Cq {
            ctx: self.clone(),
            cqn,
        })
    }
}

/// A protection domain: MRs and QPs of one PD can reach each other only.
pub struct Pd {
    ctx: Context,
    pdn: u32,
}

impl Pd {
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Registers `len` bytes of fresh shared memory with `access`. The
    /// lkey and rkey are random (not guessable).
    pub fn reg_mr(&self, len: usize, access: Access) -> Result<Mr> {
        let pdn = self.pdn;
        let (addr, lkey, rkey) = self.ctx.call(move |dp| dp.core.reg_mr(pdn, len, access))?;
        Ok(Mr {
            ctx: self.ctx.clone(),
            addr,
            len,
            lkey,
            rkey,
        })
    }

    /// Registers memory the caller owns, in place (the engine reads and
    /// writes it directly). Local SGEs and peers address it from `iova`
    /// (`ibv_reg_mr_iova2`; `ibv_reg_mr` passes the virtual address).
    ///
    /// # Safety
    /// `ptr..ptr+len` stays mapped and writable until the region is
    /// deregistered (`Mr::dereg`, which returns once the data path can no
    /// longer touch it).
    pub unsafe fn reg_mr_raw(
        &self,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<Mr> {
        let pdn = self.pdn;
        // Page-aligned regions of private anonymous memory move into the
        // MR pool (same addresses and bytes), where the XDP responder
        // serves the peer's WRITEs; others stay where they are.
        // RDMA_XDP_POOL=0 keeps every region in place.
        let pool = std::env::var_os("RDMA_XDP_POOL").is_none_or(|v| v != "0");
        let ptr_addr = ptr as usize;
        let (lkey, rkey) = self.ctx.call(move |dp| {
            let ptr = ptr_addr as *mut u8;
            if pool {
                // SAFETY: the caller's guarantee, passed on; the pages of
                // an `ibv_reg_mr` region are the program's private memory.
                if let Some(r) = unsafe { dp.core.reg_mr_overlay(pdn, ptr, len, iova, access) } {
                    return r;
                }
            }
            // SAFETY: the caller's guarantee, passed on.
            unsafe { dp.core.reg_mr_raw(pdn, ptr, len, iova, access) }
        })?;
        Ok(Mr {
            ctx: self.ctx.clone(),
            addr: iova,
            len,
            lkey,
            rkey,
        })
    }

    /// An RC QP with send completions on `send_cq` and receive
    /// completions on `recv_cq`.
    pub fn create_qp_cqs(&self, send_cq: &Cq, recv_cq: &Cq, cap: QpCap) -> Result<Qp> {
        let (pdn, scq, rcq) = (self.pdn, send_cq.cqn, recv_cq.cqn);
        let qpn = self
            .ctx
            .call(move |dp| dp.core.create_qp_cqs(pdn, scq, rcq, cap))?;
        Ok(Qp {
            ctx: self.ctx.clone(),
            qpn,
        })
    }

    /// A QP of `qp_type` (a UD QP's datagrams are at most `port_mtu`
    /// bytes, the port's active MTU).
    pub fn create_qp_typed(
        &self,
        send_cq: &Cq,
        recv_cq: &Cq,
        cap: QpCap,
        qp_type: QpType,
        port_mtu: u32,
    ) -> Result<Qp> {
        let (pdn, scq, rcq) = (self.pdn, send_cq.cqn, recv_cq.cqn);
        let qpn = self.ctx.call(move |dp| {
            dp.core
                .create_qp_typed(pdn, scq, rcq, cap, qp_type, port_mtu)
        })?;
        Ok(Qp {
            ctx: self.ctx.clone(),
            qpn,
        })
    }

    /// An address handle: UD sends naming it go to the peer of `path`.
    pub fn create_ah(&self, path: Path) -> Result<Ah> {
        let handle = self.ctx.call(move |dp| dp.core.create_ah(path))?;
        Ok(Ah {
            ctx: self.ctx.clone(),
            handle,
        })
    }

    /// An RC QP whose send and receive completions go to `cq`.
    pub fn create_qp(&self, cq: &Cq, cap: QpCap) -> Result<Qp> {
        let (pdn, cqn) = (self.pdn, cq.cqn);
        let qpn = self.ctx.call(move |dp| dp.core.create_qp(pdn, cqn, cap))?;
        Ok(Qp {
            ctx: self.ctx.clone(),
            qpn,
        })
    }
}

/// An address handle (`ibv_ah`): the destination of UD sends, named by
/// [`Ah::handle`] in a WR's [`crate::transport::UdDest`].
pub struct Ah {
    ctx: Context,
    pub handle: u32,
}

impl Ah {
    pub fn destroy(&self) -> Result<()> {
        let h = self.handle;
        self.ctx.call(move |dp| dp.core.destroy_ah(h))
    }
}

/// A registered memory region.
pub struct Mr {
    ctx: Context,
    pub addr: u64,
    pub len: usize,
    pub lkey: u32,
    pub rkey: u32,
}

impl Mr {
    /// Copies `len` bytes at `offset` out of the region.
    pub fn read(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        let lkey = self.lkey;
        self.ctx.call(move |dp| -> Result<_> {
            let m = dp
                .core
                .mem
                .by_lkey(lkey)
                .ok_or(Error::Device(DeviceError::NoMr(lkey)))?;
            let w = window(m.len(), offset, len)?;
            Ok(m.read_vec(w.start, w.len()))
        })
    }

    /// Copies `data` into the region at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        let (lkey, data) = (self.lkey, data.to_vec());
        self.ctx.call(move |dp| -> Result<_> {
            let m = dp
                .core
                .mem
                .by_lkey_mut(lkey)
                .ok_or(Error::Device(DeviceError::NoMr(lkey)))?;
            let w = window(m.len(), offset, data.len())?;
            m.write(w.start, &data);
            Ok(())
        })
    }

    /// An SGE covering `len` bytes at `offset`.
    pub fn sge(&self, offset: u64, len: u32) -> Sge {
        Sge {
            addr: self.addr + offset,
            length: len,
            lkey: self.lkey,
        }
    }

    /// Deregisters the region; remote accesses with its rkey then fail.
    pub fn dereg(self) -> Result<()> {
        let lkey = self.lkey;
        self.ctx.call(move |dp| dp.core.dereg_mr(lkey))
    }
}

/// `len` bytes at `offset` of a region of `mr_len` bytes, if inside.
fn window(mr_len: usize, offset: usize, len: usize) -> Result<std::ops::Range<usize>> {
    offset
        .checked_add(len)
        .filter(|&e| e <= mr_len)
        .map(|end| offset..end)
        .ok_or(Error::OutOfRange { offset, len })
}

/// A completion queue.
pub struct Cq {
    ctx: Context,
    cqn: u32,
}

impl Cq {
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Removes the CQ (EBUSY while a QP uses it; the handle stays usable).
    pub fn destroy(&self) -> Result<()> {
        let cqn = self.cqn;
        self.ctx.call(move |dp| dp.core.destroy_cq(cqn))
    }

    /// From now on completions go to `shared`, which threads poll without
    /// the data path's help (the verbs ABI's CQ ring).
    pub fn share(&self, shared: Arc<CqShared>) -> Result<()> {
        let cqn = self.cqn;
        self.ctx.call(move |dp| dp.core.share_cq(cqn, shared))
    }

    /// How many completions wait to be polled.
    pub fn pending(&self) -> Result<usize> {
        let cqn = self.cqn;
        self.ctx.call(move |dp| -> Result<_> {
            Ok(dp
                .core
                .cq_mut(cqn)
                .ok_or(Error::Device(DeviceError::NoCq(cqn)))?
                .len())
        })
    }

    /// Takes up to `wcs.len()` completions in one call; returns how many.
    pub fn poll(&self, wcs: &mut [Wc]) -> Result<usize> {
        let (cqn, max) = (self.cqn, wcs.len());
        let got = self.ctx.call(move |dp| -> Result<_> {
            let cq = dp
                .core
                .cq_mut(cqn)
                .ok_or(Error::Device(DeviceError::NoCq(cqn)))?;
            let mut v = vec![crate::device::standalone::NO_WC; max];
            let n = cq.poll(&mut v);
            v.truncate(n);
            Ok(v)
        })?;
        wcs[..got.len()].copy_from_slice(&got);
        Ok(got.len())
    }
}

/// An RC queue pair.
pub struct Qp {
    ctx: Context,
    pub qpn: u32,
}

impl Qp {
    /// `ibv_modify_qp`: attribute checks and state transitions as the
    /// engine defines them; an invalid transition is an error naming the
    /// state and the attribute.
    pub fn modify(&self, attr: &QpAttr) -> Result<()> {
        let (qpn, attr) = (self.qpn, attr.clone());
        self.ctx.call(move |dp| dp.core.modify_qp(qpn, &attr))
    }

    /// INIT -> RTR -> RTS towards the peer at `path` in one step.
    pub fn connect(&self, path: Path, c: &Connect) -> Result<()> {
        let (qpn, c) = (self.qpn, *c);
        self.ctx.call(move |dp| dp.core.connect_qp(qpn, path, &c))
    }

    /// From now on work requests come from `rings` (the verbs ABI's work
    /// queues, posted to without the data path's help).
    pub fn share(&self, rings: Arc<QpRings>) -> Result<()> {
        let qpn = self.qpn;
        self.ctx.call(move |dp| dp.core.share_qp(qpn, rings))
    }

    /// From now on receive WRs come from `srq` (shared with other QPs;
    /// the data path takes one when a message needs it).
    pub fn attach_srq(&self, srq: Arc<crate::device::rings::SrqShared>) -> Result<()> {
        let qpn = self.qpn;
        self.ctx.call(move |dp| dp.core.attach_srq(qpn, srq))
    }

    /// Sets the network path (after RTR named the peer QP).
    pub fn set_path(&self, path: Path) -> Result<()> {
        let qpn = self.qpn;
        self.ctx.call(move |dp| dp.core.set_path(qpn, path))
    }

    /// Destroys the QP; its outstanding WRs complete with flush errors.
    pub fn destroy(self) -> Result<()> {
        let qpn = self.qpn;
        self.ctx.call(move |dp| {
            // A program may see a receive complete before the data path
            // has sent that message's ACK (a NIC sends it first) and
            // destroy the QP at once, as rc_pingpong does after its last
            // iteration: one turn of the data path sends what is due, or
            // the peer's SEND would retry until RETRY_EXC_ERR. Turns run
            // while they find work (a full TX ring takes more than one),
            // 64 at most.
            flush(dp);
            dp.core.destroy_qp(qpn)
        })
    }

    pub fn state(&self) -> Result<QpState> {
        self.query(|q| q.state())
    }

    /// Whether the XDP program serves this QP's responder now (its
    /// state is lent to XDP; lending happens on a data path turn that
    /// found the receive rings empty, after the QP's last request).
    pub fn lent_to_xdp(&self) -> Result<bool> {
        let qpn = self.qpn;
        self.ctx
            .call(move |dp| -> Result<_> { Ok(dp.core.lent_to_xdp(qpn)) })
    }

    /// UD: the Q_Key datagrams must carry.
    pub fn qkey(&self) -> Result<u32> {
        self.query(|q| q.qkey())
    }

    fn query<R: Send + 'static>(&self, f: fn(&crate::transport::QpEngine) -> R) -> Result<R> {
        let qpn = self.qpn;
        self.ctx.call(move |dp| -> Result<_> {
            dp.core
                .qp(qpn)
                .map(f)
                .ok_or(Error::Device(DeviceError::NoQp(qpn)))
        })
    }

    /// Posts a send-queue work request (the SGEs and inline data are
    /// copied at post time, as they cross to the data path thread).
    pub fn post_send(&self, wr: &SendWr) -> Result<()> {
        let qpn = self.qpn;
        let w = OwnedSendWr::new(wr).map_err(DeviceError::Post)?;
        self.ctx.call(move |dp| dp.core.post_send(qpn, &w.as_wr()))
    }

    /// Posts a receive buffer.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<()> {
        let qpn = self.qpn;
        let w = OwnedRecvWr::new(wr).map_err(DeviceError::Post)?;
        self.ctx.call(move |dp| dp.core.post_recv(qpn, &w.as_wr()))
    }
}
