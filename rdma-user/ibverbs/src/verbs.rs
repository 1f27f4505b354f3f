//! PDs, MRs, CQs, completion channels and RC QPs over `rdma_user::verbs`,
//! and the data-path calls programs make inline through `ctx->ops`
//! (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`, `ibv_req_notify_cq`).
//!
//! Each object is rdma-core's struct first, then ours, so the pointer the
//! program holds is ours; every call checks it against the live set of its
//! kind, so a destroyed or foreign object is EINVAL, never a crash.
//!
//! Posts and polls are lock-free ring operations (`device::rings`) that
//! also try to run a turn of the data path on the calling thread (inline
//! progress, never waiting); a single WR posted while that lock is free
//! and its ring empty goes straight to the engine under it (the same
//! checks, no copies through the ring); control calls run under the data path's lock
//! on the caller's thread. `ibv_wr_*` lives in `wr`, SRQs in `srq`, async
//! events in `events`.

use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::mem::size_of;
use std::ptr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_queue::ArrayQueue;
use rdma_user::device::rings::{CqShared, QpRings};

use rdma_user::device::datapath::{gid_to_ip, Path};
use rdma_user::io::hostnet::{iface_mac, resolve_mac};
use rdma_user::memory::Access;
use rdma_user::transport::{
    QpAttr, QpCap, QpState, QpType, RecvWr, SendFlags, SendWr, Sge, UdDest, Wc, WcOpcode, WcStatus,
    WrOpcode, MAX_INLINE, MAX_SGE,
};
use rdma_user::verbs;

use crate::device::{gid_table, our_context, Context};
use crate::ffi::*;
use crate::{guard, set_errno};

/// Addresses of the live objects of one kind.
pub(crate) struct Live(Mutex<Option<HashSet<usize>>>, AtomicU64);

/// How many of a thread's last lookups that found an object live it
/// remembers (a polling loop uses a CQ, a QP and perhaps an SRQ).
const SEEN: usize = 4;

/// (set, address, the set's removal count then) of each remembered
/// lookup, and the slot the next one takes.
type Seen = ([(usize, usize, u64); SEEN], usize);

thread_local! {
    /// This thread's last lookups that found an object live: (set,
    /// address, the set's removal count then). While that count is
    /// unchanged the object is still in the set, so the posts and polls
    /// of a busy loop check their objects with one atomic load instead of
    /// a lock and a hash (measured: the lookup was 2.8 % of a spinning
    /// `ib_send_lat`).
    static LAST_SEEN: std::cell::Cell<Seen> =
        const { std::cell::Cell::new(([(0, 0, u64::MAX); SEEN], 0)) };
}

impl Live {
    pub(crate) const fn new() -> Live {
        Live(Mutex::new(None), AtomicU64::new(0))
    }
    pub(crate) fn add<T>(&self, p: *mut T) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(HashSet::new)
            .insert(p as usize);
    }
    pub(crate) fn remove<T>(&self, p: *mut T) -> bool {
        let mut live = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let removed = live.as_mut().is_some_and(|s| s.remove(&(p as usize)));
        if removed {
            // Before the object can be freed: every thread's memory of
            // this set's objects is stale from now on.
            self.1.fetch_add(1, Ordering::AcqRel);
        }
        removed
    }
    /// Ours and live? `T` is the object the pointer's kind belongs to.
    pub(crate) fn get<'a, T, C>(&self, p: *mut C) -> Option<&'a T> {
        let key = (self as *const Live as usize, p as usize);
        // Read before the set is: an entry remembered below then carries
        // a count no later than the lookup it stands for.
        let removals = self.1.load(Ordering::Acquire);
        let (seen, next) = LAST_SEEN.get();
        if seen.iter().any(|&(s, a, r)| (s, a) == key && r == removals) {
            // SAFETY: addresses in the set are leaked boxes of T, removed
            // from it (and the count bumped) before they are freed; an
            // entry remembered with the current count is still in it.
            return Some(unsafe { &*(p as *const T) });
        }
        let live = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !live.as_ref()?.contains(&(p as usize)) {
            return None;
        }
        let mut seen = seen;
        seen[next] = (key.0, key.1, removals);
        LAST_SEEN.set((seen, (next + 1) % SEEN));
        // SAFETY: in the set, so a live leaked box of T (as above).
        Some(unsafe { &*(p as *const T) })
    }

    /// Runs `f` on a live object while no other thread can take it out of
    /// the live set (to count a use of it that a destroy must wait for).
    pub(crate) fn get_with<T, C, R>(&self, p: *mut C, f: impl FnOnce(&T) -> R) -> Option<R> {
        let live = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !live.as_ref()?.contains(&(p as usize)) {
            return None;
        }
        // SAFETY: as in `get`; the lock is held, so it is not freed meanwhile.
        Some(f(unsafe { &*(p as *const T) }))
    }

    /// Destroys a live object: `release` undoes it in the data path (an
    /// errno leaves it as it was); then it leaves the live set and is freed,
    /// once, even if two threads destroy it at the same time.
    pub(crate) fn destroy<T, C>(
        &self,
        p: *mut C,
        release: impl FnOnce(&T) -> Result<(), c_int>,
    ) -> c_int {
        let Some(o) = self.get::<T, C>(p) else {
            return libc::EINVAL;
        };
        if let Err(e) = release(o) {
            return e;
        }
        if !self.remove(p) {
            return libc::EINVAL;
        }
        // SAFETY: it was a live Box<T> and this call took it out of the set.
        drop(unsafe { Box::from_raw(p as *mut T) });
        0
    }
}

pub(crate) static PDS: Live = Live::new();
static MRS: Live = Live::new();
static CQS: Live = Live::new();
static QPS: Live = Live::new();
static CHANNELS: Live = Live::new();

#[repr(C)]
pub(crate) struct Pd {
    pub(crate) pd: ibv_pd,
    pub(crate) inner: verbs::Pd,
}

impl Pd {
    pub(crate) fn context(&self) -> *mut ibv_context {
        self.pd.context
    }
}

#[repr(C)]
struct Mr {
    mr: ibv_mr,
    inner: Mutex<Option<verbs::Mr>>,
}

#[repr(C)]
struct Cq {
    cq: ibv_cq,
    inner: Mutex<Option<verbs::Cq>>,
    /// The completion ring the data path fills; polled without it.
    shared: Arc<CqShared>,
    /// Its data path, which a poll of an empty ring runs a turn of.
    dp: verbs::Context,
}

#[repr(C)]
struct Channel {
    ch: ibv_comp_channel,
    /// CQs that fired (their addresses), in order.
    fired: Arc<ArrayQueue<usize>>,
}

#[repr(C)]
struct Qp {
    /// What the program holds: `ibv_qp` (first, `qp_base`) inside
    /// `ibv_qp_ex`, as rdma-core's `verbs_qp` lays them out.
    qpx: ibv_qp_ex,
    /// Created by `ibv_create_qp_ex` with send ops: `ibv_qp_to_qp_ex`
    /// answers, and the `ibv_wr_*` calls build into `batch`.
    ex: bool,
    batch: Mutex<crate::wr::Batch>,
    inner: Mutex<Option<verbs::Qp>>,
    /// The work rings; the lock serialises this QP's posting threads only
    /// (the data path never takes it).
    rings: Mutex<Arc<QpRings>>,
    /// Its data path, which a post runs a turn of.
    dp: verbs::Context,
    cap: ibv_qp_cap,
    sq_sig_all: bool,
    ctx: &'static Context,
    /// Asynchronous events handed out for this QP, and acknowledged:
    /// destroying it waits until they are equal, as rdma-core's does.
    events_reported: AtomicU32,
    events_acked: AtomicU32,
    /// The SRQ its receive WRs come from (ibv_post_recv is EINVAL then).
    srq: Option<&'static crate::srq::Srq>,
}

/// The live QP `qpn` of `context`, counted as having one more event out.
pub(crate) fn qp_reported(context: *mut ibv_context, qpn: u32) -> Option<*mut ibv_qp> {
    let live = QPS.0.lock().unwrap_or_else(|e| e.into_inner());
    live.as_ref()?.iter().find_map(|&p| {
        // SAFETY: addresses in the set are live Qp boxes (see Live::get).
        let q = unsafe { &*(p as *const Qp) };
        (q.qpx.qp_base.qp_num == qpn && q.qpx.qp_base.context == context).then(|| {
            q.events_reported.fetch_add(1, Ordering::AcqRel);
            p as *mut ibv_qp
        })
    })
}

/// `ibv_ack_async_event` of a QP event.
pub(crate) fn qp_event_acked(qp: *mut ibv_qp) {
    if let Some(q) = QPS.get::<Qp, _>(qp) {
        q.events_acked.fetch_add(1, Ordering::AcqRel);
    }
}

/// The data path of a context, started on first use (not at
/// `ibv_open_device`: `ibv_devinfo` must not attach XDP to an interface).
pub(crate) fn data_path(c: &'static Context) -> Result<verbs::Context, c_int> {
    let mut dp = c.dp.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = dp.as_ref() {
        return Ok(d.clone());
    }
    // RDMA_XDP_POLLING=spin: the data path thread spins on the rings like
    // a NIC (takes a core); adaptive (the default) sleeps in poll(2) when
    // idle, and the program's own posts and polls run the data path.
    let polling = match std::env::var("RDMA_XDP_POLLING").as_deref() {
        Ok("spin") => verbs::Polling::Spin,
        _ => verbs::Polling::Adaptive,
    };
    let cpu = std::env::var("RDMA_XDP_CPU")
        .ok()
        .and_then(|c| c.parse().ok());
    // An adaptive thread runs at nice -20 with a short slice where allowed
    // (RDMA_XDP_BOOST=0: never): it must preempt a program spinning on
    // memory on its core to place a WRITE, as rxe's softirq does.
    let boost = std::env::var("RDMA_XDP_BOOST").map_or(true, |v| v != "0");
    // RDMA_XDP_ECN=0: data packets Not-ECT; RDMA_XDP_DCQCN=0: CNPs are
    // counted and ignored, nothing is paced.
    let mut cc = rdma_user::device::datapath::CcConfig {
        ecn: std::env::var("RDMA_XDP_ECN").map_or(true, |v| v != "0"),
        ..Default::default()
    };
    cc.params.enabled = std::env::var("RDMA_XDP_DCQCN").map_or(true, |v| v != "0");
    let opts = verbs::ContextOptions {
        polling,
        cpu,
        boost,
        events: Some(c.events.clone()),
        cc,
    };
    match verbs::Context::open(c.netdev(), opts) {
        Ok(d) => {
            *dp = Some(d.clone());
            Ok(d)
        }
        Err(e) => {
            eprintln!("libibverbs (rdma-xdp): cannot open {}: {e}", c.netdev());
            Err(e.errno())
        }
    }
}

pub(crate) fn err_ptr<T>(e: c_int) -> *mut T {
    set_errno(e);
    ptr::null_mut()
}

/// # Safety
/// `context` is a context pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    guard(ptr::null_mut(), || {
        let Some(c) = our_context(context) else {
            return err_ptr(libc::EINVAL);
        };
        let dp = match data_path(c) {
            Ok(d) => d,
            Err(e) => return err_ptr(e),
        };
        match dp.alloc_pd() {
            Ok(inner) => {
                let p = Box::into_raw(Box::new(Pd {
                    pd: ibv_pd { context, handle: 0 },
                    inner,
                }));
                PDS.add(p);
                p as *mut ibv_pd
            }
            Err(e) => err_ptr(e.errno()),
        }
    })
}

/// # Safety
/// `pd` is a PD pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    PDS.destroy::<Pd, _>(pd, |_| Ok(()))
}

fn access_of(flags: c_int) -> Result<Access, c_int> {
    let known = IBV_ACCESS_LOCAL_WRITE
        | IBV_ACCESS_REMOTE_WRITE
        | IBV_ACCESS_REMOTE_READ
        | IBV_ACCESS_REMOTE_ATOMIC;
    let f = flags as u32;
    // Remote write or atomic access needs local write (IBA 10.6.3.1).
    if f & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) != 0
        && f & IBV_ACCESS_LOCAL_WRITE == 0
    {
        return Err(libc::EINVAL);
    }
    // Optional flags (relaxed ordering and above) may be ignored.
    if f & !known & (IBV_ACCESS_OPTIONAL_FIRST - 1) != 0 {
        return Err(libc::EINVAL);
    }
    Ok(Access(f & known))
}

/// `ibv_reg_mr`, also what the `ibv_reg_mr` macro becomes
/// (`ibv_reg_mr_iova2` with iova = addr).
///
/// # Safety
/// `pd` is a PD; `addr..addr+length` is the caller's memory.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: same contract.
    unsafe { ibv_reg_mr_iova2(pd, addr, length, addr as u64, access as c_uint) }
}

/// # Safety
/// As `ibv_reg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    guard(ptr::null_mut(), || {
        let Some(p) = PDS.get::<Pd, _>(pd) else {
            return err_ptr(libc::EINVAL);
        };
        if addr.is_null() || length == 0 {
            return err_ptr(libc::EINVAL);
        }
        if iova.checked_add(length as u64).is_none() {
            return err_ptr(libc::EINVAL);
        }
        let acc = match access_of(access as c_int) {
            Ok(a) => a,
            Err(e) => return err_ptr(e),
        };
        // SAFETY: ibv_reg_mr's contract: the memory stays the caller's and
        // mapped until ibv_dereg_mr, which deregisters it first.
        match unsafe { p.inner.reg_mr_raw(addr as *mut u8, length, iova, acc) } {
            Ok(m) => {
                let b = Box::into_raw(Box::new(Mr {
                    mr: ibv_mr {
                        context: p.pd.context,
                        pd,
                        addr,
                        length,
                        handle: m.lkey,
                        lkey: m.lkey,
                        rkey: m.rkey,
                    },
                    inner: Mutex::new(Some(m)),
                }));
                MRS.add(b);
                b as *mut ibv_mr
            }
            Err(e) => err_ptr(e.errno()),
        }
    })
}

/// Returns once the data path has dropped the region (the deregistration
/// runs under its lock, between two turns: no packet can touch it after).
///
/// # Safety
/// `mr` is an MR pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    guard(libc::EIO, || {
        MRS.destroy::<Mr, _>(mr, |m| {
            let inner = m.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
            inner.map_or(Ok(()), |i| i.dereg().map_err(|e| e.errno()))
        })
    })
}

/// # Safety
/// `context` is a context.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    if our_context(context).is_none() {
        return err_ptr(libc::EINVAL);
    }
    // SAFETY: eventfd has no memory arguments.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return ptr::null_mut();
    }
    let b = Box::into_raw(Box::new(Channel {
        ch: ibv_comp_channel {
            context,
            fd,
            refcnt: 0,
        },
        fired: Arc::new(ArrayQueue::new(4096)),
    }));
    CHANNELS.add(b);
    b as *mut ibv_comp_channel
}

/// # Safety
/// `channel` is a channel pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    CHANNELS.destroy::<Channel, _>(channel, |ch| {
        if ch.ch.refcnt > 0 {
            return Err(libc::EBUSY);
        }
        // SAFETY: our eventfd, closed once (the channel goes with it).
        unsafe { libc::close(ch.ch.fd) };
        Ok(())
    })
}

/// # Safety
/// `context` is a context; `channel` NULL or a channel.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    _comp_vector: c_int,
) -> *mut ibv_cq {
    guard(ptr::null_mut(), || {
        let Some(c) = our_context(context) else {
            return err_ptr(libc::EINVAL);
        };
        if !(1..=32767).contains(&cqe) {
            return err_ptr(libc::EINVAL);
        }
        let ch = if channel.is_null() {
            None
        } else {
            match CHANNELS.get::<Channel, _>(channel) {
                Some(c) => Some(c),
                None => return err_ptr(libc::EINVAL),
            }
        };
        let dp = match data_path(c) {
            Ok(d) => d,
            Err(e) => return err_ptr(e),
        };
        let inner = match dp.create_cq(cqe as usize) {
            Ok(i) => i,
            Err(e) => return err_ptr(e.errno()),
        };
        // The CQ's address is its token in the channel's fired queue; the
        // box is allocated first so that the ring can know it.
        let mut b = Box::new(Cq {
            cq: ibv_cq {
                context,
                channel,
                cq_context,
                cqe,
                ..Default::default()
            },
            inner: Mutex::new(None),
            shared: Arc::new(CqShared::new(1, None, 0)),
            dp: dp.clone(),
        });
        let token = &*b as *const Cq as usize;
        let shared = Arc::new(CqShared::new(
            cqe as usize,
            ch.map(|c| (c.ch.fd, c.fired.clone())),
            token,
        ));
        if let Err(e) = inner.share(shared.clone()) {
            return err_ptr(e.errno());
        }
        b.shared = shared;
        *b.inner.lock().unwrap_or_else(|e| e.into_inner()) = Some(inner);
        let b = Box::into_raw(b);
        if !channel.is_null() {
            // SAFETY: checked live above.
            unsafe { (*channel).refcnt += 1 };
        }
        CQS.add(b);
        b as *mut ibv_cq
    })
}

/// # Safety
/// `cq` is a CQ pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard(libc::EIO, || {
        CQS.destroy::<Cq, _>(cq, |c| {
            let mut inner = c.inner.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = inner.as_ref() {
                // On EBUSY the CQ stays as it was.
                i.destroy().map_err(|e| e.errno())?;
            }
            inner.take();
            if !c.cq.channel.is_null() {
                // SAFETY: a channel with CQs cannot be destroyed (refcnt).
                unsafe { (*c.cq.channel).refcnt -= 1 };
            }
            Ok(())
        })
    })
}

fn ibv_status(s: WcStatus) -> ibv_wc_status {
    match s {
        WcStatus::Success => IBV_WC_SUCCESS,
        WcStatus::LocLenErr => IBV_WC_LOC_LEN_ERR,
        WcStatus::LocQpOpErr => IBV_WC_LOC_QP_OP_ERR,
        WcStatus::LocProtErr => IBV_WC_LOC_PROT_ERR,
        WcStatus::WrFlushErr => IBV_WC_WR_FLUSH_ERR,
        WcStatus::RemInvReqErr => IBV_WC_REM_INV_REQ_ERR,
        WcStatus::RemAccessErr => IBV_WC_REM_ACCESS_ERR,
        WcStatus::RemOpErr => IBV_WC_REM_OP_ERR,
        WcStatus::RetryExcErr => IBV_WC_RETRY_EXC_ERR,
        WcStatus::RnrRetryExcErr => IBV_WC_RNR_RETRY_EXC_ERR,
    }
}

fn ibv_wc_of(w: &Wc) -> ibv_wc {
    let opcode = match w.opcode {
        WcOpcode::Send => IBV_WC_SEND,
        WcOpcode::RdmaWrite => IBV_WC_RDMA_WRITE,
        WcOpcode::RdmaRead => IBV_WC_RDMA_READ,
        WcOpcode::CompSwap => IBV_WC_COMP_SWAP,
        WcOpcode::FetchAdd => IBV_WC_FETCH_ADD,
        WcOpcode::Recv => IBV_WC_RECV,
        WcOpcode::RecvRdmaWithImm => IBV_WC_RECV_RDMA_WITH_IMM,
    };
    let mut wc = ibv_wc {
        wr_id: w.wr_id,
        status: ibv_status(w.status),
        opcode,
        byte_len: w.byte_len,
        qp_num: w.qp_num,
        ..Default::default()
    };
    if let Some(imm) = w.imm {
        wc.__bindgen_anon_1.imm_data = imm.to_be();
        wc.wc_flags = IBV_WC_WITH_IMM;
    }
    if w.grh {
        // UD: RoCE has no LIDs or SLs (slid, sl, dlid_path_bits stay 0,
        // as rxe reports them).
        wc.wc_flags |= IBV_WC_GRH;
        wc.src_qp = w.src_qp;
    }
    wc
}

/// `ctx->ops.poll_cq`: pops the CQ ring (no lock, no syscall).
unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    guard(-1, || {
        let Some(c) = CQS.get::<Cq, _>(cq) else {
            return -1;
        };
        if n <= 0 {
            return 0;
        }
        if wc.is_null() {
            return -1;
        }
        let mut buf = [rdma_user::device::standalone::NO_WC; 16];
        let mut total = 0usize;
        // An empty ring: run a turn of the data path here (a busy poller
        // moves its own packets), then look again.
        if c.shared.is_empty() && c.dp.progress() && c.shared.is_empty() {
            return 0;
        }
        while total < n as usize {
            let want = (n as usize - total).min(buf.len());
            let got = c.shared.poll(&mut buf[..want]);
            for (k, w) in buf[..got].iter().enumerate() {
                // SAFETY: the caller's array holds n entries; total+k < n.
                unsafe { wc.add(total + k).write(ibv_wc_of(w)) };
            }
            total += got;
            if got < want {
                break;
            }
        }
        total as c_int
    })
}

/// `ctx->ops.req_notify_cq`: the next completion raises an event on the
/// CQ's channel; with `solicited_only`, the next solicited or
/// unsuccessful one.
unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    let Some(c) = CQS.get::<Cq, _>(cq) else {
        return libc::EINVAL;
    };
    if c.cq.channel.is_null() {
        return libc::EINVAL;
    }
    c.shared.arm(solicited_only != 0);
    // It will block for the event, not poll: its frames are the data
    // path thread's to move again.
    c.dp.will_wait_for_events();
    0
}

/// The next event of `channel`: blocks in `read` on its eventfd (so a
/// signal interrupts it with EINTR, and O_NONBLOCK gives EAGAIN, as with
/// rdma-core's kernel channel).
///
/// # Safety
/// `channel` is a channel; `cq` and `cq_context` point to pointers.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    let Some(ch) = CHANNELS.get::<Channel, _>(channel) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    if cq.is_null() || cq_context.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    loop {
        while let Some(tok) = ch.fired.pop() {
            let p = tok as *mut ibv_cq;
            if let Some(c) = CQS.get::<Cq, _>(p) {
                // SAFETY: the caller's out pointers (checked non-NULL).
                unsafe {
                    *cq = p;
                    *cq_context = c.cq.cq_context;
                }
                return 0;
            }
        }
        let mut v: u64 = 0;
        // SAFETY: reading 8 bytes into a local from our eventfd.
        let r = unsafe { libc::read(ch.ch.fd, &mut v as *mut u64 as *mut c_void, 8) };
        if r < 0 {
            return -1;
        }
    }
}

/// # Safety
/// `cq` is a CQ.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
    if CQS.get::<Cq, _>(cq).is_some() {
        // SAFETY: a live CQ of ours; the counter is the program's view.
        unsafe { (*cq).comp_events_completed = (*cq).comp_events_completed.wrapping_add(nevents) };
    }
}

/// # Safety
/// `pd` is a PD; `attr` points to an init attr.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    // SAFETY: the same contract.
    unsafe { create_qp(pd, attr, None) }
}

/// The send operations `ibv_wr_*` supports here (an RC QP's).
const SEND_OPS: u64 = (IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD) as u64;

/// `verbs_context.create_qp_ex` (what the inline `ibv_create_qp_ex` calls
/// for more than a PD): an RC QP, with the `ibv_wr_*` send path when
/// send ops are asked for.
pub(crate) unsafe extern "C" fn create_qp_ex(
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guard(ptr::null_mut(), || {
        if attr.is_null() {
            return err_ptr(libc::EINVAL);
        }
        // SAFETY: the caller's init attr.
        let a = unsafe { &*attr };
        let known =
            IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS;
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
            return err_ptr(libc::EINVAL);
        }
        if a.comp_mask & !known != 0
            || (a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0)
        {
            return err_ptr(libc::EOPNOTSUPP);
        }
        let ops = (a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0).then_some(a.send_ops_flags);
        if ops.is_some_and(|o| o & !SEND_OPS != 0) {
            return err_ptr(libc::EOPNOTSUPP);
        }
        match PDS.get::<Pd, _>(a.pd) {
            Some(p) if p.pd.context == context => {}
            _ => return err_ptr(libc::EINVAL),
        }
        // SAFETY: ibv_qp_init_attr_ex begins with ibv_qp_init_attr's
        // fields (rdma-core's layout), so the prefix is one.
        unsafe { create_qp(a.pd, attr as *mut ibv_qp_init_attr, ops) }
    })
}

/// # Safety
/// As `ibv_create_qp`; `send_ops`: the `ibv_wr_*` path is wanted.
unsafe fn create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
    send_ops: Option<u64>,
) -> *mut ibv_qp {
    guard(ptr::null_mut(), || {
        let Some(p) = PDS.get::<Pd, _>(pd) else {
            return err_ptr(libc::EINVAL);
        };
        if attr.is_null() {
            return err_ptr(libc::EINVAL);
        }
        // SAFETY: the caller's init attr.
        let a = unsafe { &mut *attr };
        let qp_type = match a.qp_type {
            IBV_QPT_RC => QpType::Rc,
            IBV_QPT_UD => QpType::Ud,
            // SMI and GSI (0, 1) are the kernel's own: uverbs refuses them
            // with EINVAL (rxe measured); other types this device lacks.
            0 | 1 => return err_ptr(libc::EINVAL),
            _ => return err_ptr(libc::EOPNOTSUPP),
        };
        if qp_type == QpType::Ud && send_ops.is_some() {
            // ibv_wr_* is offered for RC only.
            return err_ptr(libc::EOPNOTSUPP);
        }
        let srq = if a.srq.is_null() {
            None
        } else {
            match crate::srq::srq_of(a.srq) {
                Some(sq) if sq.srq_pd() == pd => Some(sq),
                _ => return err_ptr(libc::EINVAL),
            }
        };
        let (Some(scq), Some(rcq)) = (CQS.get::<Cq, _>(a.send_cq), CQS.get::<Cq, _>(a.recv_cq))
        else {
            return err_ptr(libc::EINVAL);
        };
        let cap = a.cap;
        if cap.max_send_sge as usize > MAX_SGE
            || cap.max_recv_sge as usize > MAX_SGE
            || cap.max_send_wr > 16384
            || cap.max_recv_wr > 16384
        {
            return err_ptr(libc::EINVAL);
        }
        let Some(ctx) = our_context(p.pd.context) else {
            return err_ptr(libc::EINVAL);
        };
        let scq_guard = scq.inner.lock().unwrap_or_else(|e| e.into_inner());
        let same = ptr::eq(scq, rcq);
        let rcq_guard = (!same).then(|| rcq.inner.lock().unwrap_or_else(|e| e.into_inner()));
        let send = scq_guard.as_ref();
        let recv = match &rcq_guard {
            Some(g) => g.as_ref(),
            None => send,
        };
        let (Some(send), Some(recv)) = (send, recv) else {
            return err_ptr(libc::EINVAL);
        };
        let r = p.inner.create_qp_typed(
            send,
            recv,
            QpCap {
                max_send_wr: cap.max_send_wr.max(1),
                max_recv_wr: cap.max_recv_wr.max(1),
            },
            qp_type,
            ctx.port_mtu(),
        );
        drop(rcq_guard);
        drop(scq_guard);
        match r {
            Ok(inner) => {
                // What we grant: the depths asked for, inline up to 256 B.
                let granted = ibv_qp_cap {
                    max_send_wr: cap.max_send_wr.max(1),
                    max_recv_wr: cap.max_recv_wr.max(1),
                    max_inline_data: cap.max_inline_data.clamp(64, MAX_INLINE as u32),
                    ..cap
                };
                let rings = Arc::new(QpRings::new(
                    qp_type,
                    granted.max_send_wr,
                    granted.max_recv_wr,
                    QpState::Reset,
                ));
                if let Err(e) = inner.share(rings.clone()) {
                    return err_ptr(e.errno());
                }
                if let Some(sq) = srq {
                    if let Err(e) = inner.attach_srq(sq.shared.clone()) {
                        return err_ptr(e.errno());
                    }
                }
                a.cap = granted;
                let mut qpx = ibv_qp_ex {
                    qp_base: ibv_qp {
                        context: p.pd.context,
                        qp_context: a.qp_context,
                        pd,
                        send_cq: a.send_cq,
                        recv_cq: a.recv_cq,
                        srq: a.srq,
                        handle: inner.qpn,
                        qp_num: inner.qpn,
                        state: IBV_QPS_RESET,
                        qp_type: a.qp_type,
                        ..Default::default()
                    },
                    ..Default::default()
                };
                if send_ops.is_some() {
                    crate::wr::set_ops(&mut qpx);
                }
                let b = Box::into_raw(Box::new(Qp {
                    qpx,
                    ex: send_ops.is_some(),
                    batch: Mutex::new(crate::wr::Batch::with_capacity(granted.max_send_wr)),
                    inner: Mutex::new(Some(inner)),
                    rings: Mutex::new(rings),
                    dp: p.inner.context().clone(),
                    cap: granted,
                    sq_sig_all: a.sq_sig_all != 0,
                    ctx,
                    events_reported: AtomicU32::new(0),
                    events_acked: AtomicU32::new(0),
                    srq,
                }));
                if let Some(sq) = srq {
                    sq.users.fetch_add(1, Ordering::AcqRel);
                }
                QPS.add(b);
                b as *mut ibv_qp
            }
            Err(e) => err_ptr(e.errno()),
        }
    })
}

/// # Safety
/// `qp` is a QP.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    guard(libc::EIO, || {
        QPS.destroy::<Qp, _>(qp, |q| {
            // rdma-core blocks until every event reported for the QP was
            // acknowledged (the program may still be reading one).
            while q.events_acked.load(Ordering::Acquire) < q.events_reported.load(Ordering::Acquire)
            {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let inner = q.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
            inner.map_or(Ok(()), |i| i.destroy().map_err(|e| e.errno()))?;
            if let Some(sq) = q.srq {
                sq.users.fetch_sub(1, Ordering::AcqRel);
            }
            Ok(())
        })
    })
}

fn state_of(s: ibv_qp_state) -> Result<QpState, c_int> {
    Ok(match s {
        IBV_QPS_RESET => QpState::Reset,
        IBV_QPS_INIT => QpState::Init,
        IBV_QPS_RTR => QpState::Rtr,
        IBV_QPS_RTS => QpState::Rts,
        IBV_QPS_SQD => QpState::Sqd,
        IBV_QPS_SQE => QpState::Sqe,
        IBV_QPS_ERR => QpState::Err,
        _ => return Err(libc::EINVAL),
    })
}

fn ibv_state(s: QpState) -> ibv_qp_state {
    match s {
        QpState::Reset => IBV_QPS_RESET,
        QpState::Init => IBV_QPS_INIT,
        QpState::Rtr => IBV_QPS_RTR,
        QpState::Rts => IBV_QPS_RTS,
        QpState::Sqd => IBV_QPS_SQD,
        QpState::Sqe => IBV_QPS_SQE,
        QpState::Err => IBV_QPS_ERR,
    }
}

/// The mask bits RC takes, plus two that are harmless (current state and
/// SQD notification are only hints).
const RC_MASK: u32 = IBV_QP_STATE
    | IBV_QP_CUR_STATE
    | IBV_QP_EN_SQD_ASYNC_NOTIFY
    | IBV_QP_ACCESS_FLAGS
    | IBV_QP_PKEY_INDEX
    | IBV_QP_PORT
    | IBV_QP_AV
    | IBV_QP_PATH_MTU
    | IBV_QP_TIMEOUT
    | IBV_QP_RETRY_CNT
    | IBV_QP_RNR_RETRY
    | IBV_QP_RQ_PSN
    | IBV_QP_MAX_QP_RD_ATOMIC
    | IBV_QP_MIN_RNR_TIMER
    | IBV_QP_SQ_PSN
    | IBV_QP_MAX_DEST_RD_ATOMIC
    | IBV_QP_DEST_QPN;

/// UD's: no address vector, PSN of the receive side or timers; a Q_Key.
const UD_MASK: u32 = IBV_QP_STATE
    | IBV_QP_CUR_STATE
    | IBV_QP_EN_SQD_ASYNC_NOTIFY
    | IBV_QP_PKEY_INDEX
    | IBV_QP_PORT
    | IBV_QP_QKEY
    | IBV_QP_SQ_PSN;

fn qp_attr_of(a: &ibv_qp_attr, mask: u32, qp_type: ibv_qp_type) -> Result<QpAttr, c_int> {
    let allowed = if qp_type == IBV_QPT_UD {
        UD_MASK
    } else {
        RC_MASK
    };
    if mask & !allowed != 0 {
        return Err(libc::EINVAL);
    }
    let has = |b: u32| mask & b != 0;
    let mut q = QpAttr::default();
    if has(IBV_QP_STATE) {
        q.qp_state = Some(state_of(a.qp_state)?);
    }
    if has(IBV_QP_ACCESS_FLAGS) {
        q.qp_access_flags = Some(Access(a.qp_access_flags & 15));
    }
    if has(IBV_QP_PKEY_INDEX) {
        q.pkey_index = Some(a.pkey_index);
    }
    if has(IBV_QP_PORT) {
        q.port_num = Some(a.port_num);
    }
    if has(IBV_QP_QKEY) {
        q.qkey = Some(a.qkey);
    }
    if has(IBV_QP_AV) {
        // RoCE needs the GRH: its GIDs are the IP addresses.
        if a.ah_attr.is_global == 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: reading the raw bytes of the GID union.
        q.dest_gid = Some(unsafe { a.ah_attr.grh.dgid.raw });
    }
    if has(IBV_QP_PATH_MTU) {
        if !(IBV_MTU_256..=IBV_MTU_4096).contains(&a.path_mtu) {
            return Err(libc::EINVAL);
        }
        q.path_mtu = Some(128 << a.path_mtu);
    }
    if has(IBV_QP_TIMEOUT) {
        q.timeout = Some(a.timeout);
    }
    if has(IBV_QP_RETRY_CNT) {
        q.retry_cnt = Some(a.retry_cnt);
    }
    if has(IBV_QP_RNR_RETRY) {
        q.rnr_retry = Some(a.rnr_retry);
    }
    if has(IBV_QP_RQ_PSN) {
        q.rq_psn = Some(a.rq_psn & 0xff_ffff);
    }
    if has(IBV_QP_MAX_QP_RD_ATOMIC) {
        // Our initiator depth is capped at the engine's limit: issuing fewer
        // READs/atomics at once than the peer would take is always safe
        // (perftest sets the peer's responder depth here, 128 for rxe).
        q.max_rd_atomic = Some(a.max_rd_atomic.min(rdma_user::transport::MAX_RD_ATOMIC));
    }
    if has(IBV_QP_MIN_RNR_TIMER) {
        q.min_rnr_timer = Some(a.min_rnr_timer);
    }
    if has(IBV_QP_SQ_PSN) {
        q.sq_psn = Some(a.sq_psn & 0xff_ffff);
    }
    if has(IBV_QP_MAX_DEST_RD_ATOMIC) {
        q.max_dest_rd_atomic = Some(a.max_dest_rd_atomic);
    }
    if has(IBV_QP_DEST_QPN) {
        q.dest_qp_num = Some(a.dest_qp_num & 0xff_ffff);
    }
    Ok(q)
}

/// The network path to the GID in `ah`, from our GID at its source index:
/// the peer's MAC from the kernel's neighbour table (resolved if missing).
pub(crate) fn path_of(ctx: &Context, a: &ibv_ah_attr) -> Result<Path, c_int> {
    let netdev = ctx.netdev();
    let gids = gid_table(netdev);
    let local = gids.get(a.grh.sgid_index as usize).ok_or(libc::EINVAL)?;
    // SAFETY: reading the raw bytes of the GID union.
    let dgid = unsafe { a.grh.dgid.raw };
    let (local_ip, peer_ip) = (gid_to_ip(local), gid_to_ip(&dgid));
    if local_ip.is_ipv4() != peer_ip.is_ipv4() {
        return Err(libc::EINVAL);
    }
    let local_mac = iface_mac(netdev).map_err(|_| libc::ENODEV)?;
    let peer_mac = resolve_mac(netdev, peer_ip, Duration::from_secs(3)).map_err(|e| {
        eprintln!("libibverbs (rdma-xdp): {e:#}");
        libc::EHOSTUNREACH
    })?;
    Ok(Path {
        local_mac,
        peer_mac,
        local_ip,
        peer_ip,
        vlan: None,
    })
}

/// # Safety
/// `qp` is a QP; `attr` points to a QP attr.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    guard(libc::EIO, || {
        let Some(q) = QPS.get::<Qp, _>(qp) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: the caller's attr.
        let a = unsafe { &*attr };
        let m = mask as u32;
        let qa = match qp_attr_of(a, m, q.qpx.qp_base.qp_type) {
            Ok(x) => x,
            Err(e) => return e,
        };
        let path = if m & IBV_QP_AV != 0 {
            match path_of(q.ctx, &a.ah_attr) {
                Ok(p) => Some(p),
                Err(e) => return e,
            }
        } else {
            None
        };
        let inner = q.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(i) = inner.as_ref() else {
            return libc::EINVAL;
        };
        if let Err(e) = i.modify(&qa) {
            return e.errno();
        }
        if let Some(p) = path {
            if let Err(e) = i.set_path(p) {
                return e.errno();
            }
        }
        if let Ok(s) = i.state() {
            // SAFETY: our live QP; the program reads qp->state.
            unsafe { (*qp).state = ibv_state(s) };
        }
        0
    })
}

/// The QP's state and capabilities (what programs ask: `IBV_QP_CAP` for
/// max_inline_data, the state).
///
/// # Safety
/// `qp` is a QP; `attr` and `init_attr` point to their structs.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    let Some(q) = QPS.get::<Qp, _>(qp) else {
        return libc::EINVAL;
    };
    if attr.is_null() || init_attr.is_null() {
        return libc::EINVAL;
    }
    let inner = q.inner.lock().unwrap_or_else(|e| e.into_inner());
    let state = inner
        .as_ref()
        .and_then(|i| i.state().ok())
        .map(ibv_state)
        .unwrap_or(IBV_QPS_ERR);
    let qkey = inner.as_ref().and_then(|i| i.qkey().ok()).unwrap_or(0);
    drop(inner);
    let a = ibv_qp_attr {
        qp_state: state,
        cur_qp_state: state,
        cap: q.cap,
        port_num: 1,
        qkey,
        ..Default::default()
    };
    let ia = ibv_qp_init_attr {
        qp_context: q.qpx.qp_base.qp_context,
        send_cq: q.qpx.qp_base.send_cq,
        recv_cq: q.qpx.qp_base.recv_cq,
        srq: q.qpx.qp_base.srq,
        cap: q.cap,
        qp_type: q.qpx.qp_base.qp_type,
        sq_sig_all: q.sq_sig_all as c_int,
    };
    // SAFETY: the caller's structs.
    unsafe {
        attr.write(a);
        init_attr.write(ia);
    }
    0
}

/// The new-style QP (`ibv_wr_*`) is not offered yet: NULL, as rdma-core
/// returns for a provider without it.
///
/// # Safety
/// Any pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut c_void {
    match QPS.get::<Qp, _>(qp) {
        Some(q) if q.ex => qp as *mut c_void,
        _ => ptr::null_mut(),
    }
}

/// The `ibv_wr_*` calls' way in: the QP behind `qpx` and its batch, and
/// what posts it.
pub(crate) fn with_batch<R>(
    qpx: *mut ibv_qp_ex,
    f: impl FnOnce(&mut crate::wr::Batch) -> R,
) -> Option<R> {
    let q = QPS.get::<Qp, _>(qpx as *mut ibv_qp)?;
    let mut b = q.batch.lock().unwrap_or_else(|e| e.into_inner());
    Some(f(&mut b))
}

/// `ibv_wr_complete`: posts the batch through the post path, in order;
/// the errno of the first WR refused (those before it are posted).
pub(crate) fn post_batch(qpx: *mut ibv_qp_ex) -> c_int {
    let Some(q) = QPS.get::<Qp, _>(qpx as *mut ibv_qp) else {
        return libc::EINVAL;
    };
    let mut b = q.batch.lock().unwrap_or_else(|e| e.into_inner());
    let rings = q.rings.lock().unwrap_or_else(|e| e.into_inner());
    let mut ret = b.error.take().unwrap_or(0);
    let mut posted = 0;
    if ret == 0 {
        for p in b.wrs.iter_mut() {
            let wr = p.as_send_wr();
            if let Err(e) = post_one(q, &wr, |w| rings.post_send(w).map_err(post_errno)) {
                ret = e;
                break;
            }
            posted += 1;
        }
    }
    b.wrs.clear();
    if posted > 0 {
        moved(q, &rings);
    }
    ret
}

pub(crate) fn sges<'a>(list: *mut ibv_sge, n: c_int) -> Result<&'a [ibv_sge], c_int> {
    if n < 0 || n as usize > MAX_SGE || (n > 0 && list.is_null()) {
        return Err(libc::EINVAL);
    }
    if n == 0 {
        return Ok(&[]);
    }
    // SAFETY: the caller's list of n SGEs.
    Ok(unsafe { std::slice::from_raw_parts(list, n as usize) })
}

pub(crate) fn our_sges(list: &[ibv_sge], out: &mut [Sge; MAX_SGE]) -> usize {
    for (o, s) in out.iter_mut().zip(list) {
        *o = Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        };
    }
    list.len()
}

/// A program's send WR as the engine takes it, handed to `submit`.
fn post_one(
    q: &Qp,
    r: &ibv_send_wr,
    submit: impl FnOnce(&SendWr) -> Result<(), c_int>,
) -> Result<(), c_int> {
    let list = sges(r.sg_list, r.num_sge)?;
    let mut sg = [Sge::default(); MAX_SGE];
    let n = our_sges(list, &mut sg);
    let opcode = match r.opcode {
        IBV_WR_SEND => WrOpcode::Send,
        IBV_WR_SEND_WITH_IMM => WrOpcode::SendWithImm,
        IBV_WR_RDMA_WRITE => WrOpcode::RdmaWrite,
        IBV_WR_RDMA_WRITE_WITH_IMM => WrOpcode::RdmaWriteWithImm,
        IBV_WR_RDMA_READ => WrOpcode::RdmaRead,
        IBV_WR_ATOMIC_CMP_AND_SWP => WrOpcode::CmpSwap,
        IBV_WR_ATOMIC_FETCH_AND_ADD => WrOpcode::FetchAdd,
        _ => return Err(libc::EINVAL),
    };
    let mut w = SendWr::new(r.wr_id, opcode, &sg[..n]);
    w.flags = SendFlags {
        signaled: q.sq_sig_all || r.send_flags & IBV_SEND_SIGNALED != 0,
        solicited: r.send_flags & IBV_SEND_SOLICITED != 0,
        fence: r.send_flags & IBV_SEND_FENCE != 0,
    };
    // SAFETY: the unions are read as the opcode defines them.
    unsafe {
        w.imm = u32::from_be(r.__bindgen_anon_1.imm_data);
        match opcode {
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm | WrOpcode::RdmaRead => {
                w.remote_addr = r.wr.rdma.remote_addr;
                w.rkey = r.wr.rdma.rkey;
            }
            WrOpcode::CmpSwap | WrOpcode::FetchAdd => {
                w.remote_addr = r.wr.atomic.remote_addr;
                w.rkey = r.wr.atomic.rkey;
                w.compare_add = r.wr.atomic.compare_add;
                w.swap = r.wr.atomic.swap;
            }
            _ => {}
        }
    }
    if q.qpx.qp_base.qp_type == IBV_QPT_UD {
        // SAFETY: a UD WR's union member is `ud`.
        let ud = unsafe { r.wr.ud };
        let ah = crate::ah::ah_handle(ud.ah).ok_or(libc::EINVAL)?;
        w.ud = Some(UdDest {
            ah,
            remote_qpn: ud.remote_qpn & 0xff_ffff,
            remote_qkey: ud.remote_qkey,
        });
    }
    let mut inline = [0u8; MAX_INLINE];
    if r.send_flags & IBV_SEND_INLINE != 0 {
        let total: u64 = list.iter().map(|s| s.length as u64).sum();
        if total > q.cap.max_inline_data as u64 {
            return Err(libc::EINVAL);
        }
        let mut at = 0;
        for s in list {
            // SAFETY: inline data is read from the caller's buffers at
            // post time (no lkey needed, as the spec says); the total was
            // checked to fit.
            let src = unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.length as usize) };
            inline[at..at + src.len()].copy_from_slice(src);
            at += src.len();
        }
        w.inline = Some(&inline[..at]);
    }
    submit(&w)
}

/// rdma-core's errno for a refused post: a full queue is ENOMEM.
pub(crate) fn post_errno(e: rdma_user::transport::PostError) -> c_int {
    rdma_user::device::error::DeviceError::Post(e).errno()
}

/// `ctx->ops.post_send`: checks and pushes onto the QP's send ring.
unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    guard(libc::EIO, || {
        let Some(q) = QPS.get::<Qp, _>(qp) else {
            return libc::EINVAL;
        };
        let rings = q.rings.lock().unwrap_or_else(|e| e.into_inner());
        // One WR: straight into the engine when the data path is free (a
        // turn then sends it); a chain, or a busy data path: the ring.
        // SAFETY: a non-null WR is the head of the caller's chain.
        let single = !wr.is_null() && unsafe { (*wr).next.is_null() };
        let mut ran = false;
        // SAFETY: the caller's WR chain and out pointer.
        let (ret, any) = unsafe {
            post_chain(wr, bad, |r| {
                post_one(q, r, |w| {
                    if single {
                        if let Some(r) = q.dp.post_send_now(qpn_of(q), &rings, w) {
                            ran = true;
                            return r.map_err(post_errno);
                        }
                    }
                    rings.post_send(w).map_err(post_errno)
                })
            })
        };
        if any && !ran {
            moved(q, &rings);
        }
        ret
    })
}

/// The QPN the data path knows `q` by.
fn qpn_of(q: &Qp) -> u32 {
    q.qpx.qp_base.qp_num
}

/// A WR of a program's chain (`next` links them).
pub(crate) trait ChainedWr {
    fn next_wr(&self) -> *mut Self;
}

impl ChainedWr for ibv_send_wr {
    fn next_wr(&self) -> *mut Self {
        self.next
    }
}

impl ChainedWr for ibv_recv_wr {
    fn next_wr(&self) -> *mut Self {
        self.next
    }
}

/// Posts a program's WR chain with `post`, in order, until one is refused:
/// that one goes to `*bad` (if given) and its errno is returned, as
/// rdma-core's post calls do. Also returns whether any was posted.
///
/// # Safety
/// `wr` is NULL or the head of a valid chain; `bad` is NULL or writable.
pub(crate) unsafe fn post_chain<W: ChainedWr>(
    wr: *mut W,
    bad: *mut *mut W,
    mut post: impl FnMut(&W) -> Result<(), c_int>,
) -> (c_int, bool) {
    let mut w = wr;
    while !w.is_null() {
        // SAFETY: the caller's chain.
        let r = unsafe { &*w };
        if let Err(e) = post(r) {
            if !bad.is_null() {
                // SAFETY: the caller's out pointer.
                unsafe { *bad = w };
            }
            return (e, w != wr);
        }
        w = r.next_wr();
    }
    (0, w != wr)
}

/// A program's receive WR as the engine takes it (at most `max_sge` SGEs,
/// else EINVAL), handed to `f`.
pub(crate) fn with_recv_wr(
    r: &ibv_recv_wr,
    max_sge: usize,
    f: impl FnOnce(&RecvWr) -> Result<(), c_int>,
) -> Result<(), c_int> {
    let list = sges(r.sg_list, r.num_sge)?;
    if list.len() > max_sge {
        return Err(libc::EINVAL);
    }
    let mut sg = [Sge::default(); MAX_SGE];
    let n = our_sges(list, &mut sg);
    f(&RecvWr {
        wr_id: r.wr_id,
        sg_list: &sg[..n],
    })
}

/// After WRs were pushed: a turn of the data path on this thread takes
/// them at once (a send leaves now, with no thread switch); if another
/// thread is running it, that one will, woken if it sleeps.
fn moved(q: &Qp, rings: &QpRings) {
    if !q.dp.progress() {
        rings.wake();
    }
}

/// `ctx->ops.post_recv`: checks and pushes onto the QP's receive ring.
unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        let Some(q) = QPS.get::<Qp, _>(qp) else {
            return libc::EINVAL;
        };
        if q.srq.is_some() {
            // Its receive WRs go to the SRQ (rdma-core: EINVAL).
            if !bad.is_null() {
                // SAFETY: the caller's out pointer.
                unsafe { *bad = wr };
            }
            return libc::EINVAL;
        }
        let rings = q.rings.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the caller's WR chain and out pointer.
        let (ret, _) = unsafe {
            post_chain(wr, bad, |r| {
                with_recv_wr(r, MAX_SGE, |w| {
                    // Straight into the engine when the data path is free.
                    match q.dp.post_recv_now(qpn_of(q), &rings, w) {
                        Some(r) => r.map_err(post_errno),
                        None => rings.post_recv(w).map_err(post_errno),
                    }
                })
            })
        };
        // No turn of the data path here: a receive WR is only needed by a
        // message that has arrived, and every turn that handles arrived
        // messages first takes the WRs from the rings. (A turn here would
        // flush the ACK of the message just polled on its own, one syscall
        // before the program's next send would have taken it along.)
        ret
    })
}

/// Fills a new context's ops table.
pub(crate) fn set_ops(ops: &mut ibv_context_ops) {
    ops.poll_cq = Some(poll_cq);
    ops.req_notify_cq = Some(req_notify_cq);
    ops.post_send = Some(post_send);
    ops.post_recv = Some(post_recv);
    ops.post_srq_recv = Some(crate::srq::post_srq_recv);
}

/// rdma-core's texts for `enum ibv_wc_status`.
const WC_STATUS_STR: [&[u8]; 22] = [
    b"success\0",
    b"local length error\0",
    b"local QP operation error\0",
    b"local EE context operation error\0",
    b"local protection error\0",
    b"Work Request Flushed Error\0",
    b"memory management operation error\0",
    b"bad response error\0",
    b"local access error\0",
    b"remote invalid request error\0",
    b"remote access error\0",
    b"remote operation error\0",
    b"transport retry counter exceeded\0",
    b"RNR retry counter exceeded\0",
    b"local RDD violation error\0",
    b"remote invalid RD request\0",
    b"aborted error\0",
    b"invalid EE context number\0",
    b"invalid EE context state\0",
    b"fatal error\0",
    b"response timeout error\0",
    b"general error\0",
];

#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: ibv_wc_status) -> *const c_char {
    WC_STATUS_STR
        .get(status as usize)
        .copied()
        .unwrap_or(b"unknown\0")
        .as_ptr() as *const c_char
}

const _: () = assert!(size_of::<ibv_wc>() == 48);
