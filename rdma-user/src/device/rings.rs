//! Work and completion rings between the threads that post and poll (a
//! verbs program) and the data path thread, as a NIC's queues are: a post
//! is a check and a push, a poll is a pop. No channel round trip, no lock
//! shared with the data path, no syscall and no allocation per call.
//!
//! - [`QpRings`]: a QP's send and receive queues. The poster checks the
//!   WR (the engine's own rules, `check_send`/`check_recv`, against the
//!   state the data path last published) and the queue depth: WRs posted
//!   minus WRs the engine has retired, which the data path publishes before
//!   it pushes the completions that retired them.
//! - [`CqShared`]: a CQ's completions, and its notification: armed by
//!   `ibv_req_notify_cq`, fired by the data path with one eventfd write to
//!   the completion channel when the next completion arrives.
//!
//! The rings are crossbeam's bounded lock-free queues.

use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

use crossbeam_queue::ArrayQueue;

use crate::transport::{
    check_recv, check_send, PostError, QpState, QpType, RecvWr, SendFlags, SendWr, Sge, UdDest, Wc,
    WcStatus, WrOpcode, MAX_INLINE, MAX_SGE,
};

/// A close-on-exec eventfd with `flags` besides.
pub(crate) fn eventfd(flags: i32) -> std::io::Result<i32> {
    // SAFETY: eventfd takes no pointers.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

/// How long after a program's last inline turn the library's data path
/// thread first leaves frames to it (when they can wait for its polls:
/// `Core::frames_can_wait_for_polls`): longer than the program spends
/// away between two polls, short enough that a program gone elsewhere is
/// served soon.
pub const INLINE_HOLD_NS: u64 = 200_000;

/// The longest the hold grows to while the program keeps polling: the
/// data path thread finds it still polling at the end of each hold and
/// sleeps twice as long the next time (see `Backoff::after_poll_waiting`).
/// A program that stops polling without arming a completion event is
/// served this long after its last poll at worst.
pub const INLINE_HOLD_MAX_NS: u64 = 16 * INLINE_HOLD_NS;

/// Wakes the data path thread when it waits for work (adaptive polling):
/// an eventfd it polls beside its AF_XDP sockets. Posters ring it only
/// while the thread says it sleeps, so a busy data path costs no syscall.
pub struct Doorbell {
    fd: i32,
    sleeping: AtomicBool,
    /// When the sleeping thread wakes by itself (data path clock, ns).
    wake_at: AtomicU64,
    /// When a program thread last ran the data path itself (data path
    /// clock, ns; 0: not since it said it would wait for an event).
    inline_at: AtomicU64,
}

impl Doorbell {
    pub fn new() -> std::io::Result<Doorbell> {
        Ok(Doorbell {
            fd: eventfd(libc::EFD_NONBLOCK)?,
            sleeping: AtomicBool::new(false),
            wake_at: AtomicU64::new(u64::MAX),
            inline_at: AtomicU64::new(0),
        })
    }

    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// After new work was published: wake the thread if it sleeps. The
    /// fence pairs with the one in `going_to_sleep` (either the thread
    /// sees the work, or we see it sleeping).
    pub fn ring(&self) {
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) {
            let one: u64 = 1;
            // SAFETY: 8 bytes from a local to our eventfd.
            let _ = unsafe { libc::write(self.fd, &one as *const u64 as *const libc::c_void, 8) };
        }
    }

    /// After another thread ran the data path: ring if it left a deadline
    /// (data path clock) before the sleeping thread's own wake-up.
    pub fn ring_if_before(&self, deadline: u64) {
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) && deadline < self.wake_at.load(Ordering::Relaxed)
        {
            self.ring();
        }
    }

    /// The thread is about to wait until `wake_at` at the latest; it must
    /// check for work once more after this and before waiting.
    pub fn going_to_sleep(&self, wake_at: u64) {
        self.wake_at.store(wake_at, Ordering::Relaxed);
        self.sleeping.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// A program thread ran a turn of the data path at `now`.
    pub fn inline_turn(&self, now: u64) {
        self.inline_at.store(now.max(1), Ordering::Relaxed);
    }

    /// The program is about to wait for a completion event instead of
    /// polling: the thread must take frames again at once.
    pub fn end_inline(&self) {
        if self.inline_at.swap(0, Ordering::Relaxed) != 0 {
            self.ring();
        }
    }

    /// Until when a program that polls (its last inline turn less than
    /// `hold` ns ago: [`INLINE_HOLD_NS`] at first) is taken to move its
    /// own frames.
    pub fn inline_hold_until(&self, hold: u64) -> Option<u64> {
        match self.inline_at.load(Ordering::Relaxed) {
            0 => None,
            t => Some(t + hold),
        }
    }

    /// Whether the data path thread takes a turn by `t` (data path clock)
    /// without being rung: it is awake, or sleeps until then at most.
    pub fn turns_by(&self, t: u64) -> bool {
        fence(Ordering::SeqCst);
        !self.sleeping.load(Ordering::Relaxed) || self.wake_at.load(Ordering::Relaxed) <= t
    }

    /// The thread is awake again; clears a pending ring.
    pub fn woke(&self) {
        self.sleeping.store(false, Ordering::Relaxed);
        let mut v: u64 = 0;
        // SAFETY: reading 8 bytes into a local from our non-blocking eventfd.
        let _ = unsafe { libc::read(self.fd, &mut v as *mut u64 as *mut libc::c_void, 8) };
    }
}

impl Drop for Doorbell {
    fn drop(&mut self) {
        // SAFETY: our fd, closed once.
        unsafe { libc::close(self.fd) };
    }
}

/// A send WR as it crosses to the data path: everything owned.
#[derive(Clone, Copy)]
pub struct OwnedSendWr {
    pub wr_id: u64,
    pub opcode: WrOpcode,
    pub flags: SendFlags,
    pub sges: [Sge; MAX_SGE],
    pub num_sge: u8,
    pub imm: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    pub compare_add: u64,
    pub swap: u64,
    /// Inline data (copied at post time, as IBV_SEND_INLINE promises).
    pub inline: Option<(u16, [u8; MAX_INLINE])>,
    pub ud: Option<UdDest>,
}

impl OwnedSendWr {
    /// What an owned copy refuses (more SGEs or inline bytes than a WR
    /// carries), as the engine would.
    fn check(wr: &SendWr) -> Result<(), PostError> {
        if wr.sg_list.len() > MAX_SGE {
            return Err(PostError::TooManySge);
        }
        // The engine ignores inline data on READs and atomics; so does the copy.
        if !wr.opcode.is_rd_atomic() && wr.inline.is_some_and(|d| d.len() > MAX_INLINE) {
            return Err(PostError::InlineTooLong);
        }
        Ok(())
    }

    /// An owned copy; refuses what does not fit (see `check`).
    pub fn new(wr: &SendWr) -> Result<OwnedSendWr, PostError> {
        Self::check(wr)?;
        Ok(Self::copy(wr))
    }

    /// The copy of a WR that passed `check`.
    fn copy(wr: &SendWr) -> OwnedSendWr {
        let inline = wr.inline.filter(|_| !wr.opcode.is_rd_atomic());
        let mut sges = [Sge::default(); MAX_SGE];
        sges[..wr.sg_list.len()].copy_from_slice(wr.sg_list);
        let inline = inline.map(|d| {
            let mut b = [0u8; MAX_INLINE];
            b[..d.len()].copy_from_slice(d);
            (d.len() as u16, b)
        });
        OwnedSendWr {
            wr_id: wr.wr_id,
            opcode: wr.opcode,
            flags: wr.flags,
            sges,
            num_sge: wr.sg_list.len() as u8,
            imm: wr.imm,
            remote_addr: wr.remote_addr,
            rkey: wr.rkey,
            compare_add: wr.compare_add,
            swap: wr.swap,
            inline,
            ud: wr.ud,
        }
    }

    /// The engine's view of it, borrowing from `self`.
    pub fn as_wr(&self) -> SendWr<'_> {
        let mut w = SendWr::new(self.wr_id, self.opcode, &self.sges[..self.num_sge as usize]);
        w.flags = self.flags;
        w.imm = self.imm;
        w.remote_addr = self.remote_addr;
        w.rkey = self.rkey;
        w.compare_add = self.compare_add;
        w.swap = self.swap;
        w.ud = self.ud;
        w.inline = self.inline.as_ref().map(|(n, b)| &b[..*n as usize]);
        w
    }
}

/// A receive WR as it crosses to the data path.
#[derive(Clone, Copy)]
pub struct OwnedRecvWr {
    pub wr_id: u64,
    pub sges: [Sge; MAX_SGE],
    pub num_sge: u8,
}

impl OwnedRecvWr {
    /// What an owned copy refuses: more SGEs than a WR carries.
    fn check(wr: &RecvWr) -> Result<(), PostError> {
        if wr.sg_list.len() > MAX_SGE {
            return Err(PostError::TooManySge);
        }
        Ok(())
    }

    pub fn new(wr: &RecvWr) -> Result<OwnedRecvWr, PostError> {
        Self::check(wr)?;
        Ok(Self::copy(wr))
    }

    /// The copy of a WR that passed `check`.
    fn copy(wr: &RecvWr) -> OwnedRecvWr {
        let mut sges = [Sge::default(); MAX_SGE];
        sges[..wr.sg_list.len()].copy_from_slice(wr.sg_list);
        OwnedRecvWr {
            wr_id: wr.wr_id,
            sges,
            num_sge: wr.sg_list.len() as u8,
        }
    }

    pub fn as_wr(&self) -> RecvWr<'_> {
        RecvWr {
            wr_id: self.wr_id,
            sg_list: &self.sges[..self.num_sge as usize],
        }
    }
}

/// The QP states as one byte, for publishing across threads.
const STATES: [QpState; 7] = [
    QpState::Reset,
    QpState::Init,
    QpState::Rtr,
    QpState::Rts,
    QpState::Sqd,
    QpState::Sqe,
    QpState::Err,
];

/// One work queue's depth accounting.
struct Depth {
    cap: u64,
    /// WRs pushed by posters, counted once each push has completed.
    posted: AtomicU64,
    /// WRs the engine has retired (published by the data path).
    retired: AtomicU64,
    /// WRs the data path has popped (its side only: it pops under the
    /// data path's lock).
    popped: AtomicU64,
}

impl Depth {
    fn new(cap: u32) -> Depth {
        Depth {
            cap: cap as u64,
            posted: AtomicU64::new(0),
            retired: AtomicU64::new(0),
            popped: AtomicU64::new(0),
        }
    }

    fn has_room(&self) -> bool {
        let posted = self.posted.load(Ordering::Relaxed);
        posted - self.retired.load(Ordering::Acquire) < self.cap
    }

    /// A WR handed to the engine by a poster that holds the data path's
    /// lock (it alone pops): counted as pushed and popped at once, so
    /// `waiting` stays false.
    fn pushed_and_popped(&self) {
        self.posted.fetch_add(1, Ordering::Release);
        self.popped.fetch_add(1, Ordering::Relaxed);
    }

    /// Pushed WRs not yet popped.
    fn waiting(&self) -> bool {
        self.posted.load(Ordering::Acquire) != self.popped.load(Ordering::Relaxed)
    }

    /// Pops from `q` only a WR whose push has completed. An `ArrayQueue`
    /// pop that meets a push still in progress spins until it ends; a
    /// poster that the data path thread preempted in mid-push (both on
    /// one core, the thread at a higher priority) ends it only when the
    /// thread's time slice does. Measured with unmodified `ib_send_lat`
    /// over the library: the data path threads ran 26 to 80 % of their
    /// cores, 75 % of it in that pop.
    fn pop<T>(&self, q: &ArrayQueue<T>) -> Option<T> {
        let popped = self.popped.load(Ordering::Relaxed);
        if self.posted.load(Ordering::Acquire) == popped {
            return None;
        }
        let w = q.pop();
        if w.is_some() {
            self.popped.store(popped + 1, Ordering::Relaxed);
        }
        w
    }
}

/// A QP's send and receive rings; see the module docs.
pub struct QpRings {
    sq: ArrayQueue<OwnedSendWr>,
    rq: ArrayQueue<OwnedRecvWr>,
    send: Depth,
    recv: Depth,
    state: AtomicU8,
    qp_type: QpType,
    /// The data path's, set when the rings are handed to it.
    doorbell: OnceLock<Arc<Doorbell>>,
}

impl QpRings {
    pub fn new(qp_type: QpType, max_send_wr: u32, max_recv_wr: u32, state: QpState) -> QpRings {
        let r = QpRings {
            qp_type,
            sq: ArrayQueue::new(max_send_wr.max(1) as usize),
            rq: ArrayQueue::new(max_recv_wr.max(1) as usize),
            send: Depth::new(max_send_wr.max(1)),
            recv: Depth::new(max_recv_wr.max(1)),
            state: AtomicU8::new(0),
            doorbell: OnceLock::new(),
        };
        r.publish_state(state);
        r
    }

    /// The state the data path last published.
    pub fn state(&self) -> QpState {
        STATES[self.state.load(Ordering::Acquire) as usize % STATES.len()]
    }

    /// Posts a send WR (one poster at a time per QP: the caller serialises
    /// its posters, as a provider's per-QP lock does).
    pub fn post_send(&self, wr: &SendWr) -> Result<(), PostError> {
        self.admit_send(wr)?;
        self.sq
            .push(OwnedSendWr::copy(wr))
            .map_err(|_| PostError::QueueFull)?;
        // Release: a pop that sees the count finds the pushed WR whole.
        self.send.posted.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Posts a send WR straight into the engine with `post`, for a poster
    /// that holds the data path's lock and found nothing waiting in this
    /// ring (so the WR keeps its place in order): the checks and the depth
    /// accounting of a push and the data path's pop, without the two
    /// copies through the ring (measured: a third of what `ibv_post_send`
    /// cost beside the turn it runs).
    pub fn post_send_direct(
        &self,
        wr: &SendWr,
        post: impl FnOnce(&SendWr),
    ) -> Result<(), PostError> {
        debug_assert!(!self.send.waiting());
        self.admit_send(wr)?;
        self.send.pushed_and_popped();
        post(wr);
        Ok(())
    }

    /// What a send WR must pass to be posted, either way: the engine's
    /// own rules against the published state, the queue depth, and what
    /// an owned copy holds.
    fn admit_send(&self, wr: &SendWr) -> Result<(), PostError> {
        check_send(self.qp_type, self.state(), wr)?;
        if !self.send.has_room() {
            return Err(PostError::QueueFull);
        }
        OwnedSendWr::check(wr)
    }

    /// As [`QpRings::post_send_direct`], for a receive WR.
    pub fn post_recv_direct(
        &self,
        wr: &RecvWr,
        post: impl FnOnce(&RecvWr),
    ) -> Result<(), PostError> {
        debug_assert!(!self.recv.waiting());
        self.admit_recv(wr)?;
        self.recv.pushed_and_popped();
        post(wr);
        Ok(())
    }

    /// As [`QpRings::admit_send`], for a receive WR.
    fn admit_recv(&self, wr: &RecvWr) -> Result<(), PostError> {
        check_recv(self.state(), wr)?;
        if !self.recv.has_room() {
            return Err(PostError::QueueFull);
        }
        OwnedRecvWr::check(wr)
    }

    /// WRs pushed to the send ring wait for the data path.
    pub fn send_waiting(&self) -> bool {
        self.send.waiting()
    }

    /// WRs pushed to the receive ring wait for the data path.
    pub fn recv_waiting(&self) -> bool {
        self.recv.waiting()
    }

    /// After posting: wakes the data path thread if it sleeps (a poster
    /// that ran the data path itself since it pushed need not).
    pub fn wake(&self) {
        if let Some(d) = self.doorbell.get() {
            d.ring();
        }
    }

    /// Work waits in a ring (the data path's last check before it sleeps).
    pub fn has_work(&self) -> bool {
        // Pushes completed, as `Depth::pop` sees them (a push in progress
        // is not yet work: waiting for it would spin as that pop would).
        self.send.waiting() || self.recv.waiting()
    }

    pub fn set_doorbell(&self, d: Arc<Doorbell>) {
        let _ = self.doorbell.set(d);
    }

    pub fn post_recv(&self, wr: &RecvWr) -> Result<(), PostError> {
        self.admit_recv(wr)?;
        self.rq
            .push(OwnedRecvWr::copy(wr))
            .map_err(|_| PostError::QueueFull)?;
        self.recv.posted.fetch_add(1, Ordering::Release);
        Ok(())
    }

    // ---- the data path's side

    pub fn publish_state(&self, s: QpState) {
        let i = STATES.iter().position(|&x| x == s).unwrap_or(0);
        self.state.store(i as u8, Ordering::Release);
    }

    /// Retired counts: WRs moved into the engine minus those still queued
    /// there. Published before the completions are pushed.
    pub fn publish_retired(&self, send: u64, recv: u64) {
        self.send.retired.store(send, Ordering::Release);
        self.recv.retired.store(recv, Ordering::Release);
    }

    pub fn pop_send(&self) -> Option<OwnedSendWr> {
        self.send.pop(&self.sq)
    }

    pub fn pop_recv(&self) -> Option<OwnedRecvWr> {
        self.recv.pop(&self.rq)
    }
}

const DISARMED: u8 = 0;
const ARMED_ANY: u8 = 1;
const ARMED_SOLICITED: u8 = 2;

/// A CQ's completions and notification; see the module docs.
pub struct CqShared {
    ring: ArrayQueue<Wc>,
    /// Completions lost because the ring was full (a CQ overrun).
    pub overflows: AtomicU64,
    /// Armed for the next completion (`ARMED_ANY`) or the next solicited
    /// or unsuccessful one (`ARMED_SOLICITED`); `DISARMED` once fired.
    armed: AtomicU8,
    /// The completion channel's eventfd, or -1.
    event_fd: i32,
    /// Which CQs fired, for the channel's `ibv_get_cq_event`.
    fired: Option<Arc<ArrayQueue<usize>>>,
    /// The poster's handle for this CQ in `fired`.
    token: usize,
}

impl CqShared {
    /// A CQ ring of `depth`; with a channel, its eventfd and fired queue.
    pub fn new(
        depth: usize,
        channel: Option<(i32, Arc<ArrayQueue<usize>>)>,
        token: usize,
    ) -> CqShared {
        let (fd, fired) = match channel {
            Some((fd, q)) => (fd, Some(q)),
            None => (-1, None),
        };
        CqShared {
            ring: ArrayQueue::new(depth.max(1)),
            overflows: AtomicU64::new(0),
            armed: AtomicU8::new(DISARMED),
            event_fd: fd,
            fired,
            token,
        }
    }

    /// Takes up to `out.len()` completions.
    pub fn poll(&self, out: &mut [Wc]) -> usize {
        let mut n = 0;
        while n < out.len() {
            match self.ring.pop() {
                Some(w) => {
                    out[n] = w;
                    n += 1;
                }
                None => break,
            }
        }
        n
    }

    pub fn len(&self) -> usize {
        self.ring.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// `ibv_req_notify_cq`: the next completion raises an event, or with
    /// `solicited_only` the next solicited or unsuccessful one. One already
    /// in the CQ raises none, as with rxe: programs (perftest, qperf) arm
    /// again right after an event and before they poll, and an event for
    /// the completions they are about to poll would be a stale duplicate
    /// that their next wait takes for a new one. A program that may have
    /// missed a completion polls again after arming, as the verbs
    /// require.
    pub fn arm(&self, solicited_only: bool) {
        if solicited_only {
            // Only a new solicited completion may fire (as on a NIC); one
            // already queued is the program's to poll.
            let _ = self.armed.compare_exchange(
                DISARMED,
                ARMED_SOLICITED,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
            return;
        }
        // Arming for any completion widens a solicited-only arm.
        self.armed.store(ARMED_ANY, Ordering::SeqCst);
    }

    fn fire(&self) {
        if self.armed.swap(DISARMED, Ordering::SeqCst) == DISARMED {
            return;
        }
        let fd = self.event_fd;
        if let (Some(q), true) = (&self.fired, fd >= 0) {
            let _ = q.push(self.token);
            let one: u64 = 1;
            // SAFETY: writing 8 bytes from a local to our eventfd.
            let _ = unsafe { libc::write(fd, &one as *const u64 as *const libc::c_void, 8) };
        }
    }

    /// The data path's push; fires an armed notification.
    pub fn push(&self, wc: Wc) -> bool {
        let ok = self.ring.push(wc).is_ok();
        if !ok {
            self.overflows.fetch_add(1, Ordering::Relaxed);
        }
        match self.armed.load(Ordering::SeqCst) {
            DISARMED => {}
            ARMED_SOLICITED if wc.solicited || wc.status != WcStatus::Success => self.fire(),
            ARMED_SOLICITED => {}
            _ => self.fire(),
        }
        ok
    }
}

/// An asynchronous event of a device, as `ibv_get_async_event` reports
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEvent {
    /// The engine moved this QP to the error state by itself (retries or
    /// RNR retries exhausted, a NAK, a protocol violation): its WRs
    /// complete with errors, and nothing more will move on it.
    QpFatal(u32),
    /// The port's link came up.
    PortActive,
    /// The port's link went down.
    PortErr,
    /// An SRQ (its `SrqShared::token`) fell below its limit.
    SrqLimit(usize),
}

/// A device's asynchronous events: a queue and the eventfd that is the
/// context's `async_fd` (a semaphore eventfd: one count per event, so a
/// blocking read waits for exactly the next one, and it works in
/// poll/epoll with O_NONBLOCK).
#[derive(Debug)]
pub struct AsyncShared {
    ring: ArrayQueue<AsyncEvent>,
    fd: i32,
    /// Events dropped because nobody read the queue (it holds 256).
    pub lost: AtomicU64,
}

impl AsyncShared {
    pub fn new() -> std::io::Result<AsyncShared> {
        Ok(AsyncShared {
            ring: ArrayQueue::new(256),
            fd: eventfd(libc::EFD_SEMAPHORE)?,
            lost: AtomicU64::new(0),
        })
    }

    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// Queues an event and counts it on the eventfd (a rare, control-path
    /// syscall: an event is a state change, never per packet).
    pub fn push(&self, ev: AsyncEvent) {
        if self.ring.push(ev).is_err() {
            self.lost.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let one: u64 = 1;
        // SAFETY: 8 bytes from a local to our eventfd.
        let _ = unsafe { libc::write(self.fd, &one as *const u64 as *const libc::c_void, 8) };
    }

    /// The next event, after a read of the eventfd took its count.
    pub fn pop(&self) -> Option<AsyncEvent> {
        self.ring.pop()
    }
}

impl Drop for AsyncShared {
    fn drop(&mut self) {
        // SAFETY: our fd, closed once.
        unsafe { libc::close(self.fd) };
    }
}

/// A shared receive queue: receive WRs posted by any thread, taken by the
/// data path one at a time for whichever attached QP receives a message
/// that needs one (so no QP waits behind another's messages).
pub struct SrqShared {
    ring: ArrayQueue<OwnedRecvWr>,
    /// `srq_limit`: armed while non-zero; when the queue drops below it,
    /// `IBV_EVENT_SRQ_LIMIT_REACHED` is raised once and the limit disarms
    /// (set to 0), as the verbs spec says.
    limit: AtomicU64,
    /// The poster's handle for this SRQ in its async events.
    pub token: usize,
}

impl SrqShared {
    pub fn new(depth: u32, token: usize) -> SrqShared {
        SrqShared {
            ring: ArrayQueue::new(depth.max(1) as usize),
            limit: AtomicU64::new(0),
            token,
        }
    }

    /// `ibv_post_srq_recv` of one WR (QueueFull beyond the depth).
    pub fn post(&self, wr: &RecvWr) -> Result<(), PostError> {
        if wr.sg_list.len() > MAX_SGE {
            return Err(PostError::TooManySge);
        }
        self.ring
            .push(OwnedRecvWr::new(wr)?)
            .map_err(|_| PostError::QueueFull)
    }

    /// The data path's take, for a QP that needs a receive WR now; raises
    /// the limit event on `events` when the queue falls below it.
    pub fn take(&self, events: Option<&AsyncShared>) -> Option<OwnedRecvWr> {
        let w = self.ring.pop()?;
        let limit = self.limit.load(Ordering::Acquire);
        if limit > 0
            && (self.ring.len() as u64) < limit
            && self
                .limit
                .compare_exchange(limit, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            if let Some(e) = events {
                e.push(AsyncEvent::SrqLimit(self.token));
            }
        }
        Some(w)
    }

    /// Arms (`limit` > 0) or disarms the limit event.
    pub fn set_limit(&self, limit: u32) {
        self.limit.store(limit as u64, Ordering::Release);
    }

    pub fn limit(&self) -> u32 {
        self.limit.load(Ordering::Acquire) as u32
    }

    pub fn len(&self) -> usize {
        self.ring.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The data path thread sleeps through the ends of the inline hold
    /// while the program keeps polling, and wakes once it stopped. Checked
    /// against what the thread could see, so that it holds however the
    /// two threads are scheduled: every poll published before the thread's
    /// last look at the clock lies a whole hold before that look (a poll
    /// within the hold would have kept it asleep), and it looked at least
    /// once (it slept through the first hold's end).
    #[test]
    fn the_data_path_thread_sleeps_on_while_the_program_polls() {
        use crate::device::datapath::Backoff;
        use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
        let bell = Arc::new(Doorbell::new().unwrap());
        let origin = std::time::Instant::now();
        let clock = move || origin.elapsed().as_nanos() as u64;
        let polls_for = 3 * INLINE_HOLD_NS;
        // Each poll as (its time, a time after it was published).
        let poll = move |bell: &Doorbell| {
            let t = clock();
            bell.inline_turn(t);
            (t, clock())
        };
        let first = poll(&bell);
        let program = {
            let bell = bell.clone();
            std::thread::spawn(move || {
                let mut polls = Vec::new();
                while clock() < polls_for {
                    polls.push(poll(&bell));
                    std::thread::sleep(std::time::Duration::from_micros(20));
                }
                polls
            })
        };
        let mut fds = [libc::pollfd {
            fd: bell.fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        // The thread's looks at the clock after a hold ran out.
        let looked = Arc::new(AtomicU64::new(0));
        let seen = {
            let looked = looked.clone();
            move || {
                let t = clock();
                looked.store(t, SeqCst);
                t
            }
        };
        let mut backoff = Backoff::eager(true);
        // The thread's turn ends as the first poll is published: a turn
        // that starts later (this thread preempted under load) must not
        // find the hold already over before it could look.
        backoff.after_poll_waiting(first.1, false, None, &mut fds, &bell, true, seen, || false);
        let mut polls = program.join().unwrap();
        polls.push(first);
        let last_look = looked.load(SeqCst);
        assert!(
            last_look >= INLINE_HOLD_NS,
            "woke before the first hold ended ({last_look} ns)"
        );
        for (t, published) in polls {
            if published <= last_look {
                assert!(
                    t + INLINE_HOLD_NS <= last_look,
                    "woke at {last_look} ns though the program polled at {t} ns"
                );
            }
        }
    }
    use crate::transport::RecvWr;

    #[test]
    fn the_data_path_pops_only_pushes_that_completed() {
        let r = QpRings::new(QpType::Rc, 4, 4, QpState::Rtr);
        // A push the poster has not finished (its count not yet raised):
        // neither popped nor reported as work, so nobody spins on it.
        r.rq.push(
            OwnedRecvWr::new(&RecvWr {
                wr_id: 7,
                sg_list: &[],
            })
            .unwrap(),
        )
        .map_err(|_| ())
        .unwrap();
        assert!(r.pop_recv().is_none());
        assert!(!r.has_work());
        r.recv.posted.fetch_add(1, Ordering::Release);
        assert!(r.has_work());
        assert_eq!(r.pop_recv().map(|w| w.wr_id), Some(7));
        assert!(!r.has_work());
        // The ordinary post: counted once pushed, popped in order.
        for id in [1, 2] {
            r.post_recv(&RecvWr {
                wr_id: id,
                sg_list: &[],
            })
            .unwrap();
        }
        assert_eq!(r.pop_recv().map(|w| w.wr_id), Some(1));
        assert_eq!(r.pop_recv().map(|w| w.wr_id), Some(2));
        assert!(r.pop_recv().is_none());
    }

    /// A WR handed straight to the engine counts against the queue depth
    /// as a pushed one does, is never seen as work in the ring, and gets
    /// the same refusals (state, depth, SGEs, inline length) before the
    /// engine sees it.
    #[test]
    fn a_direct_post_is_checked_and_counted_as_a_push() {
        use crate::transport::{SendWr, WrOpcode};
        let r = QpRings::new(QpType::Rc, 2, 2, QpState::Rts);
        let mut engine = Vec::new();
        for id in [1, 2] {
            let w = SendWr::new(id, WrOpcode::Send, &[]);
            r.post_send_direct(&w, |w| engine.push(w.wr_id)).unwrap();
        }
        assert_eq!(engine, [1, 2]);
        assert!(!r.has_work() && !r.send_waiting());
        // Two outstanding of two: full, as two pushes would be.
        let w = SendWr::new(3, WrOpcode::Send, &[]);
        assert_eq!(
            r.post_send_direct(&w, |_| panic!("refused WRs never reach the engine")),
            Err(PostError::QueueFull)
        );
        assert_eq!(r.post_send(&w).err(), Some(PostError::QueueFull));
        // One retired: room for one, through either path.
        r.publish_retired(1, 0);
        r.post_send_direct(&w, |w| engine.push(w.wr_id)).unwrap();
        r.publish_retired(2, 0);
        let long = [0u8; MAX_INLINE + 1];
        let mut w = SendWr::new(4, WrOpcode::Send, &[]);
        w.inline = Some(&long);
        assert_eq!(
            r.post_send_direct(&w, |_| panic!("refused WRs never reach the engine")),
            Err(PostError::InlineTooLong)
        );
        // A push waits in the ring: the data path pops it as before.
        r.post_send(&SendWr::new(5, WrOpcode::Send, &[])).unwrap();
        assert!(r.send_waiting());
        assert_eq!(r.pop_send().map(|w| w.wr_id), Some(5));
        assert!(!r.send_waiting());
        assert_eq!(engine, [1, 2, 3]);
        // Receive WRs: the same depth, and the state's refusal.
        for id in [1, 2] {
            let w = RecvWr {
                wr_id: id,
                sg_list: &[],
            };
            r.post_recv_direct(&w, |_| {}).unwrap();
        }
        let w = RecvWr {
            wr_id: 3,
            sg_list: &[],
        };
        assert_eq!(
            r.post_recv_direct(&w, |_| panic!("refused")),
            Err(PostError::QueueFull)
        );
        assert!(!r.recv_waiting());
        r.publish_state(QpState::Reset);
        r.publish_retired(3, 2);
        assert!(r.post_recv_direct(&w, |_| panic!("refused")).is_err());
        assert!(r
            .post_send_direct(&SendWr::new(6, WrOpcode::Send, &[]), |_| panic!("refused"))
            .is_err());
    }
}
