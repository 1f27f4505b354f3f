//! A drop-in librdmacm (`librdmacm.so.1` is a link to this library):
//! rdma_cm's C ABI over the sans-IO CM of `rdma_user::cm`, speaking CM
//! MADs on QP1 as the kernel's rdma_cm does over rxe.
//!
//! - One CM per device (interface), opened when an id first needs it: a
//!   verbs context of this library, whose data path hands QP1's MADs to
//!   the CM through `rdma_user::device::gsi`.
//! - One CM thread per process waits on those mailboxes and on the CM's
//!   timers; calls from the program run the CM on their own thread. All
//!   CM state sits behind one lock: the control plane, never the data path.
//! - Event channels are semaphore eventfds, one count per queued event: the fd works
//!   with poll/epoll and O_NONBLOCK, and `rdma_get_cm_event` blocks in
//!   read(2) (EINTR when a signal interrupts it).
//! - An id created without a channel is synchronous, as in librdmacm: its
//!   calls wait for their own events (`rdma_create_ep` and friends).
//! - Multicast is not offered: EOPNOTSUPP.

mod abi;
mod addr;

pub use abi::*;

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void};
use std::net::{IpAddr, SocketAddr};
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use rdma_user::cm::*;
use rdma_user::device::datapath::{entropy, gid_of, Path};
use rdma_user::device::gsi::{Gsi, GsiOut};
use rdma_user::io::hostnet::{iface_addrs, iface_mac, resolve_mac};
use rdma_user::verbs;
use rdma_user::wire::cm::*;
use rdma_user::wire::RoceRepr;

use crate::ffi::*;
use crate::objects::{our_context, Boxes};
use crate::port::gid_table;
use crate::{errno, guard, set_errno};
use addr::*;

/// Returns -1 with errno `e` (librdmacm's convention).
fn err(e: c_int) -> c_int {
    set_errno(e);
    -1
}

// ---------------------------------------------------------------------------
// Event channels

#[repr(C)]
struct Channel {
    ch: rdma_event_channel,
    queue: Mutex<VecDeque<usize>>,
    users: Mutex<Users>,
}

/// The threads inside a call on a channel (`ChannelRef`s), and whether it
/// was destroyed meanwhile: then the last of them frees it.
///
/// rdma_cm's channel is a file: a thread blocked in read(2) on it keeps it
/// open when another thread closes it (rping's CM thread is in
/// rdma_get_cm_event while its main thread tears down). Freed at once, our
/// eventfd would be closed under a thread about to read it: EBADF, or a
/// read of whatever file took its number.
#[derive(Default)]
struct Users {
    n: usize,
    destroyed: bool,
}

/// Channels the program destroyed lately, and by which thread.
///
/// A program's CM thread may loop on rdma_get_cm_event while its main
/// thread destroys the ids and the channel, never stopping it (rping of
/// rdma-core 44 does). Under rdma_cm that thread is nearly always blocked
/// in read(2) by then and stays blocked until the process exits. If it is
/// late (preempted just after acknowledging the last event), it reads a
/// closed fd and the program exits with an error. This library keeps the
/// first behaviour whatever the timing: a call on a channel another thread
/// destroyed blocks as the read would have; the destroying thread itself
/// still gets EINVAL.
static DESTROYED: Mutex<VecDeque<(usize, std::thread::ThreadId)>> = Mutex::new(VecDeque::new());

/// How many destroyed channels `DESTROYED` remembers.
const DESTROYED_KEPT: usize = 64;

fn destroyed_by_another_thread(ch: *mut rdma_event_channel) -> bool {
    let me = std::thread::current().id();
    DESTROYED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .any(|&(p, t)| p == ch as usize && t != me)
}

/// A channel in use by this thread: it stays whole until dropped.
struct ChannelRef(*mut Channel);

impl ChannelRef {
    fn get(ch: *mut rdma_event_channel) -> Option<ChannelRef> {
        CHANNELS.with(ch, |c| {
            c.users.lock().unwrap_or_else(|e| e.into_inner()).n += 1;
            ChannelRef(c as *const Channel as *mut Channel)
        })
    }
}

impl std::ops::Deref for ChannelRef {
    type Target = Channel;
    fn deref(&self) -> &Channel {
        // SAFETY: counted as a user, the channel is not freed before drop.
        unsafe { &*self.0 }
    }
}

impl Drop for ChannelRef {
    fn drop(&mut self) {
        let last = {
            let mut u = self.users.lock().unwrap_or_else(|e| e.into_inner());
            u.n -= 1;
            u.destroyed && u.n == 0
        };
        if last {
            // SAFETY: destroyed (out of the live set) and its last user gone.
            unsafe { release_channel(self.0) };
        }
    }
}

/// An event as handed out: rdma_cm's struct first, then the private data
/// its `param` points to.
#[repr(C)]
struct Event {
    ev: rdma_cm_event,
    data: [u8; MAD_LEN],
}

static CHANNELS: Boxes<Channel> = Boxes::new();

/// Events handed out and acknowledged, per id (rdma_cm counts an event
/// of a connection request on its listener): `rdma_destroy_id` waits for
/// the program to acknowledge every event it was given, as librdmacm's.
static EVENTS_OUT: Mutex<Option<HashMap<usize, u64>>> = Mutex::new(None);
static EVENTS_ACKED: std::sync::Condvar = std::sync::Condvar::new();

fn event_owner(e: &rdma_cm_event) -> usize {
    if e.event == RDMA_CM_EVENT_CONNECT_REQUEST && !e.listen_id.is_null() {
        e.listen_id as usize
    } else {
        e.id as usize
    }
}

fn count_event(owner: usize, handed: bool) {
    let mut g = EVENTS_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let m = g.get_or_insert_with(HashMap::new);
    let n = m.entry(owner).or_insert(0);
    if handed {
        *n += 1;
    } else {
        *n = n.saturating_sub(1);
        if *n == 0 {
            m.remove(&owner);
        }
        EVENTS_ACKED.notify_all();
    }
}

/// Waits (at most two seconds: a program that never acknowledges must not
/// hang here for ever) until `id` has no unacknowledged event.
fn wait_events_acked(id: usize) {
    let deadline = Instant::now() + std::time::Duration::from_secs(2);
    let mut g = EVENTS_OUT.lock().unwrap_or_else(|e| e.into_inner());
    while g.as_ref().is_some_and(|m| m.contains_key(&id)) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        g = EVENTS_ACKED
            .wait_timeout(g, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    if let Some(m) = g.as_mut() {
        m.remove(&id);
    }
}

fn new_channel() -> Result<*mut Channel, c_int> {
    // A semaphore eventfd: each read takes one event's count. Unlike a
    // pipe it has no write end to close, so a thread blocked in
    // rdma_get_cm_event while another destroys the channel stays blocked
    // (as on rdma_cm's device fd) instead of reading an end of file.
    // SAFETY: eventfd takes no pointers.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EMFILE));
    }
    let p = Box::into_raw(Box::new(Channel {
        ch: rdma_event_channel { fd },
        queue: Mutex::new(VecDeque::new()),
        users: Mutex::new(Users::default()),
    }));
    // A new channel at a destroyed one's address is that address's again.
    DESTROYED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|&(d, _)| d != p as usize);
    // SAFETY: a fresh box, the set's from now on (`free_channel` takes it
    // out before `release_channel` frees it).
    unsafe { CHANNELS.add(p) };
    Ok(p)
}

fn channel(ch: *mut rdma_event_channel) -> Option<ChannelRef> {
    ChannelRef::get(ch)
}

fn post(ch: *mut rdma_event_channel, ev: Box<Event>) {
    let Some(c) = channel(ch) else {
        return;
    };
    c.queue
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push_back(Box::into_raw(ev) as usize);
    let one = 1u64;
    // SAFETY: 8 bytes from a local into our eventfd.
    let _ = unsafe { libc::write(c.ch.fd, &one as *const u64 as *const c_void, 8) };
}

/// Takes the next event: blocks in read(2) unless the fd is nonblocking.
fn take(ch: &Channel) -> Result<*mut Event, c_int> {
    loop {
        let mut v = 0u64;
        // SAFETY: 8 bytes into a local from our eventfd.
        let n = unsafe { libc::read(ch.ch.fd, &mut v as *mut u64 as *mut c_void, 8) };
        if n < 0 {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO));
        }
        if n == 0 {
            return Err(libc::EIO);
        }
        // An id destroyed meanwhile took its events with it (their counts
        // stay): read on.
        if let Some(e) = ch
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
        {
            return Ok(e as *mut Event);
        }
    }
}

#[no_mangle]
pub extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    guard(ptr::null_mut(), || match new_channel() {
        // SAFETY: a live Channel, whose first field is the channel.
        Ok(p) => unsafe { ptr::addr_of_mut!((*p).ch) },
        Err(e) => {
            set_errno(e);
            ptr::null_mut()
        }
    })
}

/// Destroys a channel: freed now, or by the last thread still in a call
/// on it.
fn free_channel(ch: *mut rdma_event_channel) -> bool {
    if !CHANNELS.remove(ch) {
        return false;
    }
    let c = ch as *mut Channel;
    // SAFETY: it was live and this call took it out of the set; users
    // count themselves under the set's lock, so none comes after this.
    let idle = unsafe {
        let mut u = (*c).users.lock().unwrap_or_else(|e| e.into_inner());
        u.destroyed = true;
        u.n == 0
    };
    if idle {
        // SAFETY: out of the set, no user.
        unsafe { release_channel(c) };
    }
    true
}

/// # Safety
/// `c` is a channel out of the live set with no user, released once.
unsafe fn release_channel(c: *mut Channel) {
    // SAFETY: the caller's promise: nobody else holds it any more.
    let c = unsafe { Box::from_raw(c) };
    for e in c.queue.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
        // SAFETY: queued events are leaked Boxes, freed once here.
        drop(unsafe { Box::from_raw(e as *mut Event) });
    }
    // SAFETY: our eventfd, closed once (the channel goes).
    unsafe { libc::close(c.ch.fd) };
}

/// # Safety
/// `channel` is NULL or a channel of ours.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    guard((), || {
        // Held across the destroy: a caller that finds the channel gone
        // finds it here.
        let mut d = DESTROYED.lock().unwrap_or_else(|e| e.into_inner());
        if free_channel(channel) {
            if d.len() == DESTROYED_KEPT {
                d.pop_front();
            }
            d.push_back((channel as usize, std::thread::current().id()));
        }
    })
}

/// # Safety
/// `channel` is a channel; `event` points to a pointer to fill.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    guard(-1, || {
        let Some(c) = self::channel(channel) else {
            if destroyed_by_another_thread(channel) {
                // See `DESTROYED`: as a read(2) already under way.
                loop {
                    std::thread::park();
                }
            }
            return err(libc::EINVAL);
        };
        if event.is_null() {
            return err(libc::EINVAL);
        }
        match take(&c) {
            Ok(e) => {
                // SAFETY: a live event; the program's out pointer.
                unsafe {
                    count_event(event_owner(&(*e).ev), true);
                    let id = (*e).ev.id;
                    if !id.is_null() {
                        (*id).event = ptr::addr_of_mut!((*e).ev);
                    }
                    *event = ptr::addr_of_mut!((*e).ev);
                }
                0
            }
            Err(e) => err(e),
        }
    })
}

/// # Safety
/// `event` is an event from `rdma_get_cm_event`, acknowledged once.
#[no_mangle]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    guard(-1, || {
        if event.is_null() {
            return err(libc::EINVAL);
        }
        // SAFETY: the event is the first field of a leaked Box<Event>,
        // handed out once and freed here once.
        unsafe {
            count_event(event_owner(&*event), false);
            let id = (*event).id;
            if !id.is_null() && LIVE_IDS.contains(id) && (*id).event == event {
                (*id).event = ptr::null_mut();
            }
            drop(Box::from_raw(event as *mut Event));
        }
        0
    })
}

#[no_mangle]
pub extern "C" fn rdma_event_str(event: c_int) -> *const c_char {
    let s: &'static std::ffi::CStr = match event {
        RDMA_CM_EVENT_ADDR_RESOLVED => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        RDMA_CM_EVENT_ADDR_ERROR => c"RDMA_CM_EVENT_ADDR_ERROR",
        RDMA_CM_EVENT_ROUTE_RESOLVED => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        RDMA_CM_EVENT_ROUTE_ERROR => c"RDMA_CM_EVENT_ROUTE_ERROR",
        RDMA_CM_EVENT_CONNECT_REQUEST => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        RDMA_CM_EVENT_CONNECT_RESPONSE => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        RDMA_CM_EVENT_CONNECT_ERROR => c"RDMA_CM_EVENT_CONNECT_ERROR",
        RDMA_CM_EVENT_UNREACHABLE => c"RDMA_CM_EVENT_UNREACHABLE",
        RDMA_CM_EVENT_REJECTED => c"RDMA_CM_EVENT_REJECTED",
        RDMA_CM_EVENT_ESTABLISHED => c"RDMA_CM_EVENT_ESTABLISHED",
        RDMA_CM_EVENT_DISCONNECTED => c"RDMA_CM_EVENT_DISCONNECTED",
        RDMA_CM_EVENT_DEVICE_REMOVAL => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        RDMA_CM_EVENT_MULTICAST_JOIN => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        RDMA_CM_EVENT_MULTICAST_ERROR => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        RDMA_CM_EVENT_ADDR_CHANGE => c"RDMA_CM_EVENT_ADDR_CHANGE",
        RDMA_CM_EVENT_TIMEWAIT_EXIT => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    };
    s.as_ptr()
}

// ---------------------------------------------------------------------------
// The CM of each device, and the ids

/// One device's CM.
struct CmDev {
    netdev: String,
    /// Our verbs context on it (what `id->verbs` is).
    ctx: *mut ibv_context,
    dp: verbs::Context,
    gsi: Arc<Gsi>,
    agent: CmAgent,
    /// Headers to each peer CM: learnt from its MADs or resolved.
    routes: HashMap<IpAddr, RoceRepr>,
    /// MADs for a peer with no headers yet (counted, then retried).
    no_route: u64,
    /// MADs the full QP1 queue refused, offered again first.
    backlog: VecDeque<GsiOut>,
}

/// What this library keeps of an id beside rdma_cm's struct.
struct IdState {
    sync: bool,
    /// Bound or resolved local address, and the peer's.
    src: Option<SocketAddr>,
    /// The port is this id's (bound by it): a connection a listener
    /// accepted uses the listener's port without holding it.
    holds_port: bool,
    dst: Option<SocketAddr>,
    dev: Option<usize>,
    listens: Vec<(usize, u32)>,
    conn: Option<(usize, u32)>,
    /// Passive: the REQ (or SIDR_REQ's service) this id answers.
    req: Option<Req>,
    sidr_service: u64,
    /// Active: the REP received.
    rep: Option<Rep>,
    /// Active and without a QP: rdma_establish sends the RTU, no event.
    quiet_establish: bool,
    my_psn: u32,
    responder_resources: u8,
    initiator_depth: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    tos: u8,
    reuse: bool,
    /// An IPv6 wildcard listener takes IPv6 only.
    afonly: bool,
    ack_timeout: Option<u8>,
    path_rec: Box<ibv_sa_path_rec>,
    /// rdma_create_ep on a passive id: the QP each request gets.
    ep_init: Option<(ibv_qp_init_attr, *mut ibv_pd)>,
    own_pd: bool,
}

impl IdState {
    /// The peer's QPN, starting PSN and (a REQ's) path MTU code, from the
    /// REQ this passive id answers or the REP this active id got.
    fn peer(&self) -> Result<(u32, u32, u8), c_int> {
        match (&self.req, &self.rep) {
            (Some(req), _) => Ok((req.local_qpn, req.starting_psn, req.path_mtu)),
            (None, Some(rep)) => Ok((rep.local_qpn, rep.starting_psn, 0xff)),
            _ => Err(libc::EINVAL),
        }
    }
}

struct Cm {
    devs: Vec<CmDev>,
    ids: HashMap<usize, IdState>,
    by_conn: HashMap<(usize, u32), usize>,
    by_listener: HashMap<(usize, u32), usize>,
    clock: Instant,
    /// Wakes the CM thread (a new device, a new deadline).
    wake_fd: c_int,
}

// SAFETY: the raw pointers in Cm (contexts, PDs) are this library's
// objects, used only under the CM lock.
unsafe impl Send for Cm {}

static CM: Mutex<Option<Cm>> = Mutex::new(None);
static LIVE_IDS: Boxes<rdma_cm_id> = Boxes::new();

fn lock() -> MutexGuard<'static, Option<Cm>> {
    CM.lock().unwrap_or_else(|e| e.into_inner())
}

fn cm(g: &mut Option<Cm>) -> &mut Cm {
    g.get_or_insert_with(|| {
        // SAFETY: eventfd takes no pointers.
        let wake_fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        std::thread::Builder::new()
            .name("rdma-cm".into())
            .spawn(cm_thread)
            .expect("start the CM thread");
        Cm {
            devs: Vec::new(),
            ids: HashMap::new(),
            by_conn: HashMap::new(),
            by_listener: HashMap::new(),
            clock: Instant::now(),
            wake_fd,
        }
    })
}

impl Cm {
    fn now(&self) -> Nanos {
        self.clock.elapsed().as_nanos() as Nanos
    }

    fn wake(&self) {
        let one = 1u64;
        // SAFETY: 8 bytes from a local to our eventfd.
        let _ = unsafe { libc::write(self.wake_fd, &one as *const u64 as *const c_void, 8) };
    }

    /// The CM of `netdev`, opened on first use.
    fn dev(&mut self, netdev: &str) -> Result<usize, c_int> {
        if let Some(i) = self.devs.iter().position(|d| d.netdev == netdev) {
            return Ok(i);
        }
        let device = device_by_netdev(netdev).ok_or(libc::ENODEV)?;
        // SAFETY: one of our devices.
        let ctx = unsafe { crate::device::ibv_open_device(device) };
        let c = our_context(ctx).ok_or(libc::ENODEV)?;
        let opened = (|| {
            let dp = c.data_path()?;
            let gsi = Arc::new(Gsi::new().map_err(|e| e.raw_os_error().unwrap_or(libc::ENOMEM))?);
            dp.set_gsi(Some(gsi.clone())).map_err(|e| e.errno())?;
            let mac = iface_mac(netdev).map_err(|_| libc::ENODEV)?;
            Ok((dp, gsi, mac))
        })();
        let (dp, gsi, mac) = match opened {
            Ok(x) => x,
            Err(e) => {
                // SAFETY: the context opened above, not handed out.
                unsafe { crate::device::ibv_close_device(ctx) };
                return Err(e);
            }
        };
        let response_timeout = std::env::var("RDMA_XDP_CM_RESPONSE_TIMEOUT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20);
        let agent = CmAgent::new(CmConfig {
            ca_guid: u64::from_be_bytes(crate::port::eui64(mac)),
            response_timeout,
            max_retries: 15,
            tid_high: std::process::id(),
            first_comm_id: entropy() as u32,
        });
        self.devs.push(CmDev {
            netdev: netdev.to_string(),
            ctx,
            dp,
            gsi,
            agent,
            routes: HashMap::new(),
            no_route: 0,
            backlog: VecDeque::new(),
        });
        self.wake();
        Ok(self.devs.len() - 1)
    }

    /// Runs every device's CM: received MADs, timers, events, MADs out.
    fn pump(&mut self) {
        let now = self.now();
        for d in &mut self.devs {
            d.gsi.clear();
            while let Some(m) = d.gsi.recv() {
                d.routes.insert(m.peer, m.reply);
                d.agent.handle_mad(now, m.peer, &m.mad);
            }
            d.agent.handle_timeout(now);
        }
        loop {
            let mut any = false;
            for i in 0..self.devs.len() {
                while let Some(ev) = self.devs[i].agent.poll_event() {
                    any = true;
                    self.on_event(i, ev);
                }
            }
            if !any {
                break;
            }
        }
        for d in &mut self.devs {
            while let Some(o) = d.agent.poll_transmit() {
                match d.routes.get(&o.to) {
                    Some(net) => d.backlog.push_back(GsiOut {
                        net: *net,
                        mad: o.mad,
                    }),
                    None => d.no_route += 1,
                }
            }
            // What QP1's queue has no room for waits for the next turn.
            let mut sent = false;
            while d.gsi.tx_room() {
                let Some(m) = d.backlog.pop_front() else {
                    break;
                };
                sent |= d.gsi.send(m);
            }
            if sent {
                d.dp.wake();
            }
        }
    }

    fn id_of_conn(&self, dev: usize, comm: u32) -> Option<*mut rdma_cm_id> {
        self.by_conn
            .get(&(dev, comm))
            .map(|&p| p as *mut rdma_cm_id)
    }

    fn on_event(&mut self, dev: usize, ev: CmEvent) {
        if trace() {
            eprintln!("rdma-xdp cm {}: {ev:?}", self.devs[dev].netdev);
        }
        match ev {
            CmEvent::ConnectRequest {
                listener,
                id,
                peer,
                req,
            } => self.on_request(dev, listener, id, peer, Request::Conn(*req)),
            CmEvent::SidrRequest {
                listener,
                id,
                peer,
                req,
            } => self.on_request(dev, listener, id, peer, Request::Sidr(*req)),
            CmEvent::ConnectResponse { id, rep } => {
                let Some(p) = self.id_of_conn(dev, id) else {
                    let _ =
                        self.devs[dev]
                            .agent
                            .reject(id, rej::INVALID_COMM_ID, [0; REJ_PRIVATE_LEN]);
                    return;
                };
                let st = self.ids.get_mut(&(p as usize)).unwrap();
                st.rep = Some(*rep);
                // SAFETY: a live id of ours.
                let qp = unsafe { (*p).qp };
                if qp.is_null() {
                    st.quiet_establish = true;
                    let e =
                        conn_event(p, RDMA_CM_EVENT_CONNECT_RESPONSE, 0, |e| rep_param(e, &rep));
                    self.post_to(p, e);
                    return;
                }
                let r = self
                    .modify(p, IBV_QPS_RTR)
                    .and_then(|_| self.modify(p, IBV_QPS_RTS));
                match r {
                    Ok(()) => {
                        let _ = self.devs[dev].agent.establish(id, [0; RTU_PRIVATE_LEN]);
                    }
                    Err(errno) => {
                        let _ = self.devs[dev].agent.reject(
                            id,
                            rej::NO_RESOURCES,
                            [0; REJ_PRIVATE_LEN],
                        );
                        self.by_conn.remove(&(dev, id));
                        let e = conn_event(p, RDMA_CM_EVENT_CONNECT_ERROR, -errno, |_| {});
                        self.post_to(p, e);
                    }
                }
            }
            CmEvent::Established { id } => {
                let Some(p) = self.id_of_conn(dev, id) else {
                    return;
                };
                let st = &self.ids[&(p as usize)];
                if st.quiet_establish {
                    return;
                }
                let rep = st.rep;
                let e = conn_event(p, RDMA_CM_EVENT_ESTABLISHED, 0, |e| {
                    if let Some(rep) = &rep {
                        rep_param(e, rep);
                    }
                });
                self.post_to(p, e);
            }
            CmEvent::Rejected {
                id,
                reason,
                private_data,
            } => {
                let Some(p) = self.by_conn.remove(&(dev, id)) else {
                    return;
                };
                let p = p as *mut rdma_cm_id;
                let e = conn_event(p, RDMA_CM_EVENT_REJECTED, reason as c_int, |e| {
                    e.data[..REJ_PRIVATE_LEN].copy_from_slice(&private_data[..]);
                    e.ev.param.conn = rdma_conn_param {
                        private_data: e.data.as_ptr() as *const c_void,
                        private_data_len: REJ_PRIVATE_LEN as u8,
                        ..zero_conn()
                    };
                });
                self.ids.get_mut(&(p as usize)).unwrap().conn = None;
                self.post_to(p, e);
            }
            CmEvent::Unreachable { id } => {
                let Some(p) = self.by_conn.remove(&(dev, id)) else {
                    return;
                };
                let p = p as *mut rdma_cm_id;
                self.ids.get_mut(&(p as usize)).unwrap().conn = None;
                let e = conn_event(p, RDMA_CM_EVENT_UNREACHABLE, -libc::ETIMEDOUT, |_| {});
                self.post_to(p, e);
            }
            CmEvent::Disconnected { id } => {
                let Some(p) = self.id_of_conn(dev, id) else {
                    return;
                };
                let e = conn_event(p, RDMA_CM_EVENT_DISCONNECTED, 0, |_| {});
                self.post_to(p, e);
            }
            CmEvent::SidrReply { id, rep } => {
                let Some(p) = self.by_conn.remove(&(dev, id)) else {
                    return;
                };
                let p = p as *mut rdma_cm_id;
                let st = self.ids.get_mut(&(p as usize)).unwrap();
                st.conn = None;
                if rep.status != sidr::SUCCESS {
                    let e = conn_event(p, RDMA_CM_EVENT_UNREACHABLE, rep.status as c_int, |_| {});
                    self.post_to(p, e);
                    return;
                }
                let ah = match self.ah_attr(p) {
                    Ok(a) => a,
                    Err(errno) => {
                        let e = conn_event(p, RDMA_CM_EVENT_UNREACHABLE, -errno, |_| {});
                        self.post_to(p, e);
                        return;
                    }
                };
                let e = conn_event(p, RDMA_CM_EVENT_ESTABLISHED, 0, |e| {
                    e.data[..SIDR_REP_PRIVATE_LEN].copy_from_slice(&rep.private_data);
                    e.ev.param.ud = rdma_ud_param {
                        private_data: e.data.as_ptr() as *const c_void,
                        private_data_len: SIDR_REP_PRIVATE_LEN as u8,
                        ah_attr: ah,
                        qp_num: rep.qpn,
                        qkey: rep.qkey,
                    };
                });
                self.post_to(p, e);
            }
        }
    }

    fn on_request(&mut self, dev: usize, listener: u32, comm: u32, peer: IpAddr, r: Request) {
        let reject = |cm: &mut Cm| {
            if trace() {
                eprintln!("rdma-xdp cm: rejecting request {comm} from {peer}");
            }
            match r {
                Request::Conn(_) => {
                    let _ =
                        cm.devs[dev]
                            .agent
                            .reject(comm, rej::CONSUMER_REJECT, [0; REJ_PRIVATE_LEN]);
                }
                Request::Sidr(req) => {
                    let _ = cm.devs[dev].agent.sidr_reply(
                        comm,
                        sidr::REJECT,
                        0,
                        0,
                        req.service_id,
                        [0; SIDR_REP_PRIVATE_LEN],
                    );
                }
            }
        };
        let Some(&lp) = self.by_listener.get(&(dev, listener)) else {
            return reject(self);
        };
        let lp = lp as *mut rdma_cm_id;
        let private: &[u8] = match &r {
            Request::Conn(req) => &req.private_data,
            Request::Sidr(req) => &req.private_data,
        };
        // rdma_cm's peers start their private data with its header.
        let Some(hdr) = CmaHeader::parse(private) else {
            return reject(self);
        };
        let lst = &self.ids[&(lp as usize)];
        let Some(lsrc) = lst.src else {
            return reject(self);
        };
        // rdma_cm's match: an IPv4 listener takes IPv4 only; an IPv6
        // wildcard takes both families unless AFONLY; a bound address must
        // be the one asked for.
        let family_ok = match lsrc.ip() {
            IpAddr::V4(_) => hdr.dst.is_ipv4(),
            IpAddr::V6(a) if a.is_unspecified() => !(lst.afonly && hdr.dst.is_ipv4()),
            IpAddr::V6(_) => hdr.dst.is_ipv6(),
        };
        if hdr.src != peer || !family_ok || (!lsrc.ip().is_unspecified() && lsrc.ip() != hdr.dst) {
            return reject(self);
        }
        let (sync, ep_init) = (lst.sync, lst.ep_init);
        // SAFETY: the listener is a live id of ours.
        let l = unsafe { &*lp };
        let child = new_id(l.ps, l.qp_type, l.context);
        let channel = if sync {
            match new_channel() {
                // SAFETY: a live channel.
                Ok(c) => unsafe { ptr::addr_of_mut!((*c).ch) },
                Err(_) => return reject(self),
            }
        } else {
            l.channel
        };
        let src = SocketAddr::new(hdr.dst, lsrc.port());
        let dst = SocketAddr::new(hdr.src, hdr.src_port);
        // SAFETY: the new id, ours alone so far.
        unsafe {
            (*child).channel = channel;
            (*child).verbs = self.devs[dev].ctx;
            fill_route(&mut (*child).route, src, dst);
        }
        let mut st = id_state(sync);
        st.src = Some(src);
        st.dst = Some(dst);
        st.dev = Some(dev);
        st.conn = Some((dev, comm));
        st.ep_init = ep_init;
        let e = match r {
            Request::Conn(req) => {
                st.req = Some(req);
                st.retry_count = req.retry_count;
                st.rnr_retry_count = req.rnr_retry_count;
                conn_event(child, RDMA_CM_EVENT_CONNECT_REQUEST, 0, |e| {
                    let user = &req.private_data[CmaHeader::LEN..];
                    e.data[..user.len()].copy_from_slice(user);
                    e.ev.param.conn = rdma_conn_param {
                        private_data: e.data.as_ptr() as *const c_void,
                        private_data_len: user.len() as u8,
                        // The peer's view, turned to ours.
                        responder_resources: req.initiator_depth,
                        initiator_depth: req.responder_resources,
                        flow_control: req.end_to_end_flow_control as u8,
                        retry_count: req.retry_count,
                        rnr_retry_count: req.rnr_retry_count,
                        srq: req.srq as u8,
                        qp_num: req.local_qpn,
                    };
                })
            }
            Request::Sidr(req) => {
                st.sidr_service = req.service_id;
                conn_event(child, RDMA_CM_EVENT_CONNECT_REQUEST, 0, |e| {
                    let user = &req.private_data[CmaHeader::LEN..];
                    e.data[..user.len()].copy_from_slice(user);
                    e.ev.param.ud = rdma_ud_param {
                        private_data: e.data.as_ptr() as *const c_void,
                        private_data_len: user.len() as u8,
                        ah_attr: ibv_ah_attr::default(),
                        qp_num: 0,
                        qkey: 0,
                    };
                })
            }
        };
        self.ids.insert(child as usize, st);
        // SAFETY: a fresh box from `new_id`, the set's from now on.
        unsafe { LIVE_IDS.add(child) };
        self.by_conn.insert((dev, comm), child as usize);
        let mut e = e;
        e.ev.listen_id = lp;
        post(if sync { l.channel } else { channel }, e);
    }

    fn post_to(&self, id: *mut rdma_cm_id, e: Box<Event>) {
        // SAFETY: a live id of ours.
        post(unsafe { (*id).channel }, e);
    }

    /// The address vector of an id's peer (for its QP or a UD AH).
    fn ah_attr(&self, id: *mut rdma_cm_id) -> Result<ibv_ah_attr, c_int> {
        let st = &self.ids[&(id as usize)];
        let (Some(src), Some(dst), Some(dev)) = (st.src, st.dst, st.dev) else {
            return Err(libc::EINVAL);
        };
        let sgid_index = gid_table(&self.devs[dev].netdev)
            .iter()
            .position(|g| *g == gid_of(src.ip()))
            .ok_or(libc::EADDRNOTAVAIL)?;
        let mut a = ibv_ah_attr::default();
        a.grh.dgid = ibv_gid {
            raw: gid_of(dst.ip()),
        };
        a.grh.sgid_index = sgid_index as u8;
        a.grh.hop_limit = 64;
        a.grh.traffic_class = st.tos;
        a.grh.flow_label = cma_flow_label(src.port(), dst.port());
        a.is_global = 1;
        a.port_num = 1;
        Ok(a)
    }

    /// The attributes that move an id's QP to `state` (rdma_init_qp_attr).
    fn qp_attr(&self, id: *mut rdma_cm_id, state: u32) -> Result<(ibv_qp_attr, c_int), c_int> {
        let st = &self.ids[&(id as usize)];
        // SAFETY: a live id of ours.
        let (ps, verbs) = unsafe { ((*id).ps, (*id).verbs) };
        let mut a = ibv_qp_attr {
            qp_state: state,
            ..Default::default()
        };
        let ud = ps == RDMA_PS_UDP;
        let mut mask = IBV_QP_STATE;
        match state {
            IBV_QPS_INIT => {
                a.pkey_index = 0;
                a.port_num = 1;
                mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT;
                if ud {
                    a.qkey = RDMA_UDP_QKEY;
                    mask |= IBV_QP_QKEY;
                } else {
                    // Remote reads and atomics only where the peer may
                    // have some outstanding (the kernel CM's rule).
                    let reads = st.req.is_some_and(|r| r.initiator_depth > 0);
                    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE
                        | if reads {
                            IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC
                        } else {
                            0
                        };
                    mask |= IBV_QP_ACCESS_FLAGS;
                }
            }
            IBV_QPS_RTR if ud => {}
            IBV_QPS_RTS if ud => {
                a.sq_psn = 0;
                mask |= IBV_QP_SQ_PSN;
            }
            IBV_QPS_RTR => {
                let (dest, _, peer_mtu) = st.peer()?;
                a.ah_attr = self.ah_attr(id)?;
                let ours = our_context(verbs).map_or(1024, |c| c.port_mtu());
                a.path_mtu = mtu_code(ours).min(peer_mtu as u32);
                a.dest_qp_num = dest;
                // A REQ's or REP's starting PSN is what its sender expects
                // to receive first (IBA 12.7.23, and rxe's capture: each
                // side sends from the PSN the other announced).
                a.rq_psn = st.my_psn;
                a.max_dest_rd_atomic = st.responder_resources;
                a.min_rnr_timer = 0;
                a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE
                    | if st.responder_resources > 0 {
                        IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC
                    } else {
                        0
                    };
                mask |= IBV_QP_AV
                    | IBV_QP_PATH_MTU
                    | IBV_QP_DEST_QPN
                    | IBV_QP_RQ_PSN
                    | IBV_QP_MAX_DEST_RD_ATOMIC
                    | IBV_QP_MIN_RNR_TIMER
                    | IBV_QP_ACCESS_FLAGS;
            }
            IBV_QPS_RTS => {
                a.sq_psn = st.peer()?.1;
                a.timeout = st
                    .ack_timeout
                    .or(st.req.map(|r| r.primary.local_ack_timeout))
                    .unwrap_or(CMA_ACK_TIMEOUT);
                a.retry_cnt = st.retry_count.min(7);
                a.rnr_retry = st.rnr_retry_count.min(7);
                a.max_rd_atomic = st.initiator_depth;
                mask |= IBV_QP_SQ_PSN
                    | IBV_QP_TIMEOUT
                    | IBV_QP_RETRY_CNT
                    | IBV_QP_RNR_RETRY
                    | IBV_QP_MAX_QP_RD_ATOMIC;
            }
            IBV_QPS_ERR => {}
            _ => return Err(libc::EINVAL),
        }
        Ok((a, mask as c_int))
    }

    fn modify(&self, id: *mut rdma_cm_id, state: u32) -> Result<(), c_int> {
        // SAFETY: a live id of ours.
        let qp = unsafe { (*id).qp };
        if qp.is_null() {
            return Err(libc::EINVAL);
        }
        let (mut a, mask) = self.qp_attr(id, state)?;
        // SAFETY: the id's QP (ours) and a local attr.
        match unsafe { crate::qp::ibv_modify_qp(qp, &mut a, mask) } {
            0 => Ok(()),
            e => Err(e),
        }
    }

    /// Forgets an id's connection and listeners in the CMs.
    fn detach(&mut self, id: *mut rdma_cm_id) {
        let now = self.now();
        let Some(st) = self.ids.get_mut(&(id as usize)) else {
            return;
        };
        let listens = std::mem::take(&mut st.listens);
        let conn = st.conn.take();
        for (d, h) in listens {
            self.devs[d].agent.unlisten(h);
            self.by_listener.remove(&(d, h));
        }
        if let Some((d, c)) = conn {
            self.devs[d].agent.destroy(now, c);
            self.by_conn.remove(&(d, c));
        }
    }
}

/// RDMA_XDP_CM_TRACE=1: every CM event and refusal on stderr.
fn trace() -> bool {
    static T: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *T.get_or_init(|| std::env::var_os("RDMA_XDP_CM_TRACE").is_some_and(|v| v != "0"))
}

enum Request {
    Conn(Req),
    Sidr(SidrReq),
}

/// The QPN a REQ or REP names: the id's QP's, or the parameters' for an
/// id without one.
fn qpn_of(qp: *mut ibv_qp, p: &rdma_conn_param) -> u32 {
    if qp.is_null() {
        p.qp_num
    } else {
        // SAFETY: the id's QP, one of ours.
        unsafe { (*qp).qp_num }
    }
}

/// The caller's connection parameters, or librdmacm's for NULL: the
/// resources the device allows (0xff, resolved by the caller against the
/// peer's offer), 7 retries and 7 RNR retries.
fn conn_param_or_default(param: *const rdma_conn_param) -> rdma_conn_param {
    if param.is_null() {
        rdma_conn_param {
            responder_resources: 0xff,
            initiator_depth: 0xff,
            retry_count: 7,
            rnr_retry_count: 7,
            ..zero_conn()
        }
    } else {
        // SAFETY: the caller's parameters.
        unsafe { *param }
    }
}

fn zero_conn() -> rdma_conn_param {
    rdma_conn_param {
        private_data: ptr::null(),
        private_data_len: 0,
        responder_resources: 0,
        initiator_depth: 0,
        flow_control: 0,
        retry_count: 0,
        rnr_retry_count: 0,
        srq: 0,
        qp_num: 0,
    }
}

fn conn_event(
    id: *mut rdma_cm_id,
    kind: c_int,
    status: c_int,
    fill: impl FnOnce(&mut Event),
) -> Box<Event> {
    let mut e = Box::new(Event {
        ev: rdma_cm_event {
            id,
            listen_id: ptr::null_mut(),
            event: kind,
            status,
            param: rdma_cm_event_param { conn: zero_conn() },
        },
        data: [0; MAD_LEN],
    });
    fill(&mut e);
    e
}

/// An event's connection parameters from a REP (the peer's view turned).
fn rep_param(e: &mut Event, rep: &Rep) {
    e.data[..REP_PRIVATE_LEN].copy_from_slice(&rep.private_data);
    e.ev.param.conn = rdma_conn_param {
        private_data: e.data.as_ptr() as *const c_void,
        private_data_len: REP_PRIVATE_LEN as u8,
        responder_resources: rep.initiator_depth,
        initiator_depth: rep.responder_resources,
        flow_control: rep.end_to_end_flow_control as u8,
        retry_count: 0,
        rnr_retry_count: rep.rnr_retry_count,
        srq: rep.srq as u8,
        qp_num: rep.local_qpn,
    };
}

fn mtu_code(bytes: u32) -> u32 {
    match bytes {
        4096.. => 5,
        2048.. => 4,
        1024.. => 3,
        512.. => 2,
        _ => 1,
    }
}

fn id_state(sync: bool) -> IdState {
    IdState {
        sync,
        src: None,
        holds_port: false,
        dst: None,
        dev: None,
        listens: Vec::new(),
        conn: None,
        req: None,
        sidr_service: 0,
        rep: None,
        quiet_establish: false,
        my_psn: 0,
        responder_resources: 0,
        initiator_depth: 0,
        retry_count: 7,
        rnr_retry_count: 7,
        tos: 0,
        reuse: false,
        afonly: false,
        ack_timeout: None,
        path_rec: Box::new(zeroed_path_rec()),
        ep_init: None,
        own_pd: false,
    }
}

fn zeroed_path_rec() -> ibv_sa_path_rec {
    // SAFETY: a plain C struct of integers; all-zero is valid.
    unsafe { std::mem::zeroed() }
}

fn new_id(ps: c_int, qp_type: c_int, context: *mut c_void) -> *mut rdma_cm_id {
    // SAFETY: rdma_cm_id is a C struct of pointers and integers; all-zero
    // is its initial state.
    let mut id: Box<rdma_cm_id> = Box::new(unsafe { std::mem::zeroed() });
    id.ps = ps;
    id.qp_type = qp_type;
    id.context = context;
    id.port_num = 1;
    Box::into_raw(id)
}

fn device_by_netdev(netdev: &str) -> Option<*mut ibv_device> {
    let mut n = 0;
    // SAFETY: our own device list, NULL-terminated, freed below.
    unsafe {
        let list = crate::device::ibv_get_device_list(&mut n);
        if list.is_null() {
            return None;
        }
        let mut found = None;
        for i in 0..n as usize {
            let d = *list.add(i);
            if crate::device::netdev_of(d).as_deref() == Some(netdev) {
                found = Some(d);
            }
        }
        crate::device::ibv_free_device_list(list);
        found
    }
}

/// Every device's interface and its addresses.
fn devices_with_addrs() -> Vec<(String, Vec<IpAddr>)> {
    let mut n = 0;
    let mut v = Vec::new();
    // SAFETY: our own device list, NULL-terminated, freed below.
    unsafe {
        let list = crate::device::ibv_get_device_list(&mut n);
        if list.is_null() {
            return v;
        }
        for i in 0..n as usize {
            if let Some(nd) = crate::device::netdev_of(*list.add(i)) {
                let addrs = iface_addrs(&nd).unwrap_or_default();
                v.push((nd, addrs));
            }
        }
        crate::device::ibv_free_device_list(list);
    }
    v
}

fn netdev_for_ip(ip: IpAddr) -> Option<String> {
    devices_with_addrs()
        .into_iter()
        .find(|(_, a)| a.contains(&ip))
        .map(|(n, _)| n)
}

fn cm_thread() {
    let mut fds: Vec<libc::pollfd> = Vec::new();
    loop {
        let timeout_ms = {
            let mut g = lock();
            let Some(cm) = g.as_mut() else { return };
            cm.pump();
            fds.clear();
            fds.push(libc::pollfd {
                fd: cm.wake_fd,
                events: libc::POLLIN,
                revents: 0,
            });
            for d in &cm.devs {
                fds.push(libc::pollfd {
                    fd: d.gsi.fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            let now = cm.now();
            if cm.devs.iter().any(|d| !d.backlog.is_empty()) {
                // MADs wait for room in QP1's queue: look again soon.
                1
            } else {
                cm.devs
                    .iter()
                    .filter_map(|d| d.agent.poll_timeout())
                    .min()
                    .map_or(1000, |t| {
                        (t.saturating_sub(now) / 1_000_000 + 1).min(1000) as c_int
                    })
            }
        };
        // SAFETY: poll on our own fds, in a local array.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as _, timeout_ms) };
        let mut v = 0u64;
        // SAFETY: 8 bytes into a local from the nonblocking eventfd.
        let _ = unsafe { libc::read(fds[0].fd, &mut v as *mut u64 as *mut c_void, 8) };
    }
}

/// Runs `f` on the CM, then the CM itself (what `f` queued goes out).
fn with_cm<R>(f: impl FnOnce(&mut Cm) -> R) -> R {
    let mut g = lock();
    let cm = cm(&mut g);
    let r = f(cm);
    cm.pump();
    cm.wake();
    r
}

/// A synchronous id's call: waits for its next event, and turns it into
/// 0 or -1 with errno (`ok`: the event kind that means success).
fn wait_sync(id: *mut rdma_cm_id, ok: c_int) -> c_int {
    // SAFETY: a live id of ours.
    let ch = unsafe { (*id).channel };
    let Some(c) = channel(ch) else {
        return err(libc::EINVAL);
    };
    match take(&c) {
        Ok(e) => {
            // SAFETY: the event we just took, freed once here.
            let e = unsafe { Box::from_raw(e) };
            if e.ev.event == ok {
                0
            } else {
                let s = e.ev.status;
                err(match e.ev.event {
                    RDMA_CM_EVENT_REJECTED => libc::ECONNREFUSED,
                    _ if s < 0 => -s,
                    _ => libc::EIO,
                })
            }
        }
        Err(e) => err(e),
    }
}

fn live_id(id: *mut rdma_cm_id) -> bool {
    LIVE_IDS.contains(id)
}

// ---------------------------------------------------------------------------
// The calls

/// # Safety
/// `channel` is NULL or ours; `id` points to a pointer to fill.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    guard(-1, || {
        if id.is_null() {
            return err(libc::EINVAL);
        }
        let qp_type = match ps {
            RDMA_PS_TCP | RDMA_PS_IB => IBV_QPT_RC,
            RDMA_PS_UDP | RDMA_PS_IPOIB => IBV_QPT_UD,
            _ => return err(libc::EINVAL),
        };
        let sync = channel.is_null();
        let ch = if sync {
            match new_channel() {
                // SAFETY: a live channel.
                Ok(c) => unsafe { ptr::addr_of_mut!((*c).ch) },
                Err(e) => return err(e),
            }
        } else if self::channel(channel).is_none() {
            return err(libc::EINVAL);
        } else {
            channel
        };
        let p = new_id(ps, qp_type as c_int, context);
        // SAFETY: the new id.
        unsafe { (*p).channel = ch };
        with_cm(|cm| cm.ids.insert(p as usize, id_state(sync)));
        // SAFETY: a fresh box from `new_id`, the set's from now on.
        unsafe { LIVE_IDS.add(p) };
        // SAFETY: the caller's out pointer.
        unsafe { *id = p };
        0
    })
}

fn destroy_id_inner(id: *mut rdma_cm_id) -> c_int {
    if !live_id(id) {
        return err(libc::EINVAL);
    }
    wait_events_acked(id as usize);
    let st = with_cm(|cm| {
        cm.detach(id);
        cm.ids.remove(&(id as usize))
    });
    // SAFETY: a live id of ours; its queued events go with it.
    let ch = unsafe { (*id).channel };
    if let Some(c) = channel(ch) {
        c.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|&e| {
                // SAFETY: queued events are leaked Boxes.
                let mine = unsafe { (*(e as *mut Event)).ev.id == id };
                if mine {
                    // SAFETY: freed once, here, as it leaves the queue.
                    drop(unsafe { Box::from_raw(e as *mut Event) });
                }
                !mine
            });
    }
    if st.as_ref().is_some_and(|s| s.sync) {
        free_channel(ch);
    }
    LIVE_IDS.destroy(id);
    0
}

/// # Safety
/// `id` is NULL or an id of ours.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || destroy_id_inner(id))
}

fn pick_port(cm: &Cm, ps: c_int, ip: IpAddr, want: u16, reuse: bool) -> Result<u16, c_int> {
    let used = |port: u16| {
        cm.ids.iter().any(|(&p, st)| {
            // SAFETY: every key of ids is a live id of ours.
            let ops = unsafe { (*(p as *mut rdma_cm_id)).ps };
            st.holds_port
                && st.src.is_some_and(|s| {
                    s.port() == port
                        && ops == ps
                        && (s.ip() == ip || s.ip().is_unspecified() || ip.is_unspecified())
                        && !(reuse && st.reuse)
                })
        })
    };
    if want != 0 {
        return if used(want) {
            Err(libc::EADDRINUSE)
        } else {
            Ok(want)
        };
    }
    for _ in 0..1000 {
        let p = 32768 + (entropy() % 28000) as u16;
        if !used(p) {
            return Ok(p);
        }
    }
    Err(libc::EADDRINUSE)
}

fn bind(cm: &mut Cm, id: *mut rdma_cm_id, a: SocketAddr) -> Result<(), c_int> {
    let st = cm.ids.get(&(id as usize)).ok_or(libc::EINVAL)?;
    if st.src.is_some() {
        return Err(libc::EINVAL);
    }
    let reuse = st.reuse;
    // SAFETY: a live id of ours.
    let ps = unsafe { (*id).ps };
    let dev = if a.ip().is_unspecified() {
        None
    } else {
        let nd = netdev_for_ip(a.ip()).ok_or(libc::EADDRNOTAVAIL)?;
        Some(cm.dev(&nd)?)
    };
    let port = pick_port(cm, ps, a.ip(), a.port(), reuse)?;
    let a = SocketAddr::new(a.ip(), port);
    let st = cm.ids.get_mut(&(id as usize)).unwrap();
    st.src = Some(a);
    st.holds_port = true;
    st.dev = dev;
    // SAFETY: a live id of ours.
    unsafe {
        write_sockaddr(&mut (*id).route.addr.src, a);
        if let Some(d) = dev {
            (*id).verbs = cm.devs[d].ctx;
        }
    }
    Ok(())
}

/// # Safety
/// `id` is an id; `addr` a socket address.
#[no_mangle]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    id_call(id, |cm| {
        // SAFETY: the caller's sockaddr.
        let a = unsafe { read_sockaddr(addr) }.ok_or(libc::EAFNOSUPPORT)?;
        bind(cm, id, a)
    })
}

fn fill_route(r: &mut rdma_route, src: SocketAddr, dst: SocketAddr) {
    write_sockaddr(&mut r.addr.src, src);
    write_sockaddr(&mut r.addr.dst, dst);
    r.addr.ibaddr.sgid = ibv_gid {
        raw: gid_of(src.ip()),
    };
    r.addr.ibaddr.dgid = ibv_gid {
        raw: gid_of(dst.ip()),
    };
    r.addr.ibaddr.pkey = 0xffff;
}

/// # Safety
/// `id` is an id; `src` NULL or and `dst` socket addresses.
#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    // SAFETY: the caller's sockaddrs.
    let (s, d) = unsafe { (read_sockaddr(src), read_sockaddr(dst)) };
    sync_call(id, |cm| {
        let d = d.ok_or(libc::EINVAL)?;
        let st = &cm.ids[&(id as usize)];
        if st.src.is_none() {
            let local = match s {
                Some(s) if !s.ip().is_unspecified() => s,
                _ => SocketAddr::new(
                    source_for(d).ok_or(libc::ENETUNREACH)?,
                    s.map_or(0, |s| s.port()),
                ),
            };
            bind(cm, id, local)?;
        }
        let st = cm.ids.get_mut(&(id as usize)).unwrap();
        let mut src = st.src.unwrap();
        if src.ip().is_unspecified() {
            src.set_ip(source_for(d).ok_or(libc::ENETUNREACH)?);
        }
        st.dst = Some(d);
        // SAFETY: a live id of ours.
        let ok = unsafe {
            fill_route(&mut (*id).route, src, d);
            match netdev_for_ip(src.ip()).map(|n| cm.dev(&n)) {
                Some(Ok(dev)) => {
                    (*id).verbs = cm.devs[dev].ctx;
                    let st = cm.ids.get_mut(&(id as usize)).unwrap();
                    st.src = Some(src);
                    st.dev = Some(dev);
                    true
                }
                _ => false,
            }
        };
        let e = if ok {
            conn_event(id, RDMA_CM_EVENT_ADDR_RESOLVED, 0, |_| {})
        } else {
            conn_event(id, RDMA_CM_EVENT_ADDR_ERROR, -libc::ENODEV, |_| {})
        };
        cm.post_to(id, e);
        Ok(cm.ids[&(id as usize)]
            .sync
            .then_some(RDMA_CM_EVENT_ADDR_RESOLVED))
    })
}

/// # Safety
/// `id` is an id.
#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int {
    guard(-1, || {
        if !live_id(id) {
            return err(libc::EINVAL);
        }
        let Some((netdev, src, dst, sync)) = with_cm(|cm| {
            let st = &cm.ids[&(id as usize)];
            Some((cm.devs[st.dev?].netdev.clone(), st.src?, st.dst?, st.sync))
        }) else {
            return err(libc::EINVAL);
        };
        // The neighbour lookup may take a while: not under the CM lock.
        let wait = std::time::Duration::from_millis(timeout_ms.clamp(100, 10_000) as u64);
        let mac = resolve_mac(&netdev, dst.ip(), wait);
        with_cm(|cm| {
            let st = cm.ids.get_mut(&(id as usize)).unwrap();
            let dev = st.dev.unwrap();
            let e = match (mac, iface_mac(&netdev)) {
                (Ok(peer_mac), Ok(local_mac)) => {
                    let path = Path {
                        local_mac,
                        peer_mac,
                        local_ip: src.ip(),
                        peer_ip: dst.ip(),
                        vlan: None,
                    };
                    if let Ok(net) = path.template(1, 1) {
                        cm.devs[dev].routes.insert(dst.ip(), net);
                    }
                    let pr = &mut st.path_rec;
                    pr.dgid = ibv_gid {
                        raw: gid_of(dst.ip()),
                    };
                    pr.sgid = ibv_gid {
                        raw: gid_of(src.ip()),
                    };
                    pr.flow_label = cma_flow_label(src.port(), dst.port()).to_be();
                    pr.hop_limit = 64;
                    pr.traffic_class = st.tos;
                    pr.reversible = 1;
                    pr.numb_path = 1;
                    pr.pkey = 0xffffu16.to_be();
                    pr.mtu = 3;
                    pr.packet_life_time = CMA_ACK_TIMEOUT - 1;
                    // SAFETY: a live id of ours; the path record lives in
                    // its state until it goes.
                    unsafe {
                        (*id).route.path_rec = &mut **pr as *mut ibv_sa_path_rec as *mut c_void;
                        (*id).route.num_paths = 1;
                    }
                    conn_event(id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0, |_| {})
                }
                _ => conn_event(id, RDMA_CM_EVENT_ROUTE_ERROR, -libc::EHOSTUNREACH, |_| {}),
            };
            cm.post_to(id, e);
        });
        if sync {
            wait_sync(id, RDMA_CM_EVENT_ROUTE_RESOLVED)
        } else {
            0
        }
    })
}

/// Moves a new QP to INIT (and a UD QP on to RTS), as rdma_create_qp does.
fn init_qp(cm: &Cm, id: *mut rdma_cm_id) -> Result<(), c_int> {
    cm.modify(id, IBV_QPS_INIT)?;
    // SAFETY: a live id of ours.
    if unsafe { (*id).ps } == RDMA_PS_UDP {
        cm.modify(id, IBV_QPS_RTR)?;
        cm.modify(id, IBV_QPS_RTS)?;
    }
    Ok(())
}

fn create_qp(id: *mut rdma_cm_id, pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> c_int {
    if !live_id(id) || attr.is_null() {
        return err(libc::EINVAL);
    }
    // As librdmacm: the QP is made from a copy of the caller's attributes
    // with the CQs rdma_cm makes filled in, and the copy goes back (so a
    // reused attr carries this QP's CQs, as with rdma-core).
    // SAFETY: a live id of ours; the caller's attr.
    let (verbs, mut local) = unsafe { ((*id).verbs, *attr) };
    if verbs.is_null() {
        return err(libc::EINVAL);
    }
    let a = &mut local;
    let mut own_pd = false;
    let pd = if pd.is_null() {
        // SAFETY: a live id of ours.
        let have = unsafe { (*id).pd };
        if have.is_null() {
            // SAFETY: our context.
            let p = unsafe { crate::pd::ibv_alloc_pd(verbs) };
            if p.is_null() {
                return -1;
            }
            own_pd = true;
            p
        } else {
            have
        }
    } else {
        pd
    };
    // SAFETY: our context and a live id of ours.
    let made = unsafe { fill_id_cqs(verbs, id, (&mut a.send_cq, &mut a.recv_cq), a.cap) };
    // SAFETY: our PD and the local copy of the attributes.
    let qp = made.and_then(|()| made_or_errno(unsafe { crate::qp::ibv_create_qp(pd, a) }));
    let qp = match qp {
        Ok(q) => q,
        Err(e) => {
            // SAFETY: a live id of ours; the PD we made has nothing in it.
            unsafe {
                destroy_id_cqs(id);
                if own_pd {
                    crate::pd::ibv_dealloc_pd(pd);
                }
            }
            return err(e);
        }
    };
    // SAFETY: the caller's attr.
    unsafe { *attr = *a };
    // SAFETY: a live id of ours.
    unsafe {
        (*id).qp = qp;
        (*id).pd = pd;
        (*id).srq = a.srq;
    }
    let r = with_cm(|cm| {
        if let Some(st) = cm.ids.get_mut(&(id as usize)) {
            st.own_pd |= own_pd;
        }
        init_qp(cm, id)
    });
    if let Err(e) = r {
        // SAFETY: the QP we just made, and the id's CQs.
        unsafe {
            crate::qp::ibv_destroy_qp(qp);
            (*id).qp = ptr::null_mut();
            destroy_id_cqs(id);
        }
        return err(e);
    }
    0
}

/// A verb's new object, or the errno it left when it made none.
fn made_or_errno<T>(p: *mut T) -> Result<*mut T, c_int> {
    if p.is_null() {
        Err(errno())
    } else {
        Ok(p)
    }
}

/// rdma_cm makes the CQs (with completion channels) a QP's attributes
/// lack; they are the id's (id->send_cq, id->recv_cq) and go with its QP.
/// Fills them into `cqs` (send, recv).
///
/// # Safety
/// `verbs` is our context and `id` a live id of ours.
unsafe fn fill_id_cqs(
    verbs: *mut ibv_context,
    id: *mut rdma_cm_id,
    cqs: (&mut *mut ibv_cq, &mut *mut ibv_cq),
    cap: ibv_qp_cap,
) -> Result<(), c_int> {
    // SAFETY: as the caller promises.
    unsafe {
        make_id_cq(verbs, id, cqs.0.is_null(), cap.max_send_wr, true)?;
        make_id_cq(verbs, id, cqs.1.is_null(), cap.max_recv_wr, false)?;
        if cqs.0.is_null() {
            *cqs.0 = (*id).send_cq;
        }
        if cqs.1.is_null() {
            *cqs.1 = (*id).recv_cq;
        }
    }
    Ok(())
}

/// Makes one of the id's CQs with its completion channel, if `want`.
///
/// # Safety
/// `verbs` is our context and `id` a live id of ours.
unsafe fn make_id_cq(
    verbs: *mut ibv_context,
    id: *mut rdma_cm_id,
    want: bool,
    depth: u32,
    send: bool,
) -> Result<(), c_int> {
    if !want {
        return Ok(());
    }
    // SAFETY: as the caller promises.
    unsafe {
        let ch = made_or_errno(crate::cq::ibv_create_comp_channel(verbs))?;
        let (cq_slot, ch_slot) = if send {
            (&mut (*id).send_cq, &mut (*id).send_cq_channel)
        } else {
            (&mut (*id).recv_cq, &mut (*id).recv_cq_channel)
        };
        *ch_slot = ch;
        let cq = crate::cq::ibv_create_cq(verbs, depth.max(1) as c_int, id as *mut c_void, ch, 0);
        *cq_slot = made_or_errno(cq)?;
    }
    Ok(())
}

/// Frees the CQs and channels rdma_create_qp made for the id (librdmacm's
/// ucma_destroy_cqs): the id's CQ fields are set only for those.
///
/// # Safety
/// `id` is a live id of ours whose QP is gone.
unsafe fn destroy_id_cqs(id: *mut rdma_cm_id) {
    // SAFETY: as the caller promises.
    unsafe {
        for cq in [&mut (*id).send_cq, &mut (*id).recv_cq] {
            if !cq.is_null() {
                crate::cq::ibv_destroy_cq(*cq);
                *cq = ptr::null_mut();
            }
        }
        for ch in [&mut (*id).send_cq_channel, &mut (*id).recv_cq_channel] {
            if !ch.is_null() {
                crate::cq::ibv_destroy_comp_channel(*ch);
                *ch = ptr::null_mut();
            }
        }
    }
}

/// # Safety
/// `id` is an id; `pd` NULL or a PD; `attr` a QP init attr.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(-1, || create_qp(id, pd, attr))
}

/// # Safety
/// `id` is an id; `attr` an extended QP init attr.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    guard(-1, || {
        if !live_id(id) || attr.is_null() {
            return err(libc::EINVAL);
        }
        // SAFETY: a live id of ours; the caller's attr.
        let (verbs, a) = unsafe { ((*id).verbs, &mut *attr) };
        if verbs.is_null() {
            return err(libc::EINVAL);
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
            // SAFETY: a live id of ours.
            a.pd = unsafe { (*id).pd };
            a.comp_mask |= IBV_QP_INIT_ATTR_PD;
        }
        // SAFETY: our context and a live id of ours.
        let made = unsafe { fill_id_cqs(verbs, id, (&mut a.send_cq, &mut a.recv_cq), a.cap) };
        let qp =
            // SAFETY: our context and the caller's attr.
            made.and_then(|()| made_or_errno(unsafe { crate::qp::create_qp_ex(verbs, attr) }));
        let qp = match qp {
            Ok(q) => q,
            Err(e) => {
                // SAFETY: a live id of ours.
                unsafe { destroy_id_cqs(id) };
                return err(e);
            }
        };
        // SAFETY: a live id of ours.
        unsafe {
            (*id).qp = qp;
            (*id).pd = a.pd;
            (*id).srq = a.srq;
        }
        match with_cm(|cm| init_qp(cm, id)) {
            Ok(()) => 0,
            Err(e) => {
                // SAFETY: the QP we just made, and the id's CQs.
                unsafe {
                    crate::qp::ibv_destroy_qp(qp);
                    (*id).qp = ptr::null_mut();
                    destroy_id_cqs(id);
                }
                err(e)
            }
        }
    })
}

/// # Safety
/// `id` is NULL or an id.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard((), || {
        if !live_id(id) {
            return;
        }
        // SAFETY: a live id of ours, its QP and the CQs made for it.
        unsafe {
            if !(*id).qp.is_null() {
                crate::qp::ibv_destroy_qp((*id).qp);
                (*id).qp = ptr::null_mut();
            }
            destroy_id_cqs(id);
        }
    })
}

/// The user's private data, checked against what fits.
fn private(p: *const c_void, len: u8, room: usize) -> Result<Vec<u8>, c_int> {
    if len as usize > room || (len > 0 && p.is_null()) {
        return Err(libc::EINVAL);
    }
    if len == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: the caller's buffer of `len` bytes.
    Ok(unsafe { std::slice::from_raw_parts(p as *const u8, len as usize) }.to_vec())
}

/// # Safety
/// `id` is an id; `param` NULL or connection parameters.
#[no_mangle]
pub unsafe extern "C" fn rdma_connect(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    let p = conn_param_or_default(param);
    sync_call(id, |cm| {
        // SAFETY: a live id of ours (sync_call checked).
        let (ps, qp) = unsafe { ((*id).ps, (*id).qp) };
        // A synchronous id waits for ESTABLISHED, or without a QP for the
        // CONNECT_RESPONSE that its rdma_establish answers.
        let done = if qp.is_null() && ps != RDMA_PS_UDP {
            RDMA_CM_EVENT_CONNECT_RESPONSE
        } else {
            RDMA_CM_EVENT_ESTABLISHED
        };
        let now = cm.now();
        let st = &cm.ids[&(id as usize)];
        let (Some(src), Some(dst), Some(dev)) = (st.src, st.dst, st.dev) else {
            return Err(libc::EINVAL);
        };
        if st.conn.is_some() || !cm.devs[dev].routes.contains_key(&dst.ip()) {
            return Err(libc::EINVAL);
        }
        let sync = st.sync;
        let hdr = CmaHeader {
            src_port: src.port(),
            src: src.ip(),
            dst: dst.ip(),
        };
        if ps == RDMA_PS_UDP {
            let user = private(
                p.private_data,
                p.private_data_len,
                SIDR_REQ_PRIVATE_LEN - CmaHeader::LEN,
            )?;
            let mut pd = [0u8; SIDR_REQ_PRIVATE_LEN];
            hdr.emit(&mut pd);
            pd[CmaHeader::LEN..CmaHeader::LEN + user.len()].copy_from_slice(&user);
            let svc = service_id(ps as u16, dst.port());
            let comm = cm.devs[dev].agent.sidr_request(now, dst.ip(), svc, pd);
            cm.by_conn.insert((dev, comm), id as usize);
            cm.ids.get_mut(&(id as usize)).unwrap().conn = Some((dev, comm));
            return Ok(sync.then_some(done));
        }
        let user = private(
            p.private_data,
            p.private_data_len,
            REQ_PRIVATE_LEN - CmaHeader::LEN,
        )?;
        let qpn = qpn_of(qp, &p);
        let mtu = our_context(cm.devs[dev].ctx).map_or(1024, |c| c.port_mtu());
        let st = cm.ids.get_mut(&(id as usize)).unwrap();
        st.my_psn = (entropy() & 0xff_ffff) as u32;
        // RDMA_MAX_RESP_RES / RDMA_MAX_INIT_DEPTH (0xff): the device's.
        st.responder_resources = p.responder_resources.min(MAX_RD_ATOMIC);
        st.initiator_depth = p.initiator_depth.min(MAX_RD_ATOMIC);
        st.retry_count = p.retry_count.min(7);
        st.rnr_retry_count = p.rnr_retry_count.min(7);
        let params = ConnectParams::rdma_cm(&RdmaCmConnect {
            src,
            dst,
            port_space: ps as u16,
            qpn,
            starting_psn: st.my_psn,
            responder_resources: st.responder_resources,
            initiator_depth: st.initiator_depth,
            retry_count: st.retry_count,
            rnr_retry_count: st.rnr_retry_count,
            srq: p.srq != 0,
            path_mtu: mtu_code(mtu) as u8,
            traffic_class: st.tos,
            ack_timeout: st.ack_timeout,
            private_data: &user,
        })
        .ok_or(libc::EINVAL)?;
        let comm = cm.devs[dev].agent.connect(now, &params);
        cm.by_conn.insert((dev, comm), id as usize);
        cm.ids.get_mut(&(id as usize)).unwrap().conn = Some((dev, comm));
        Ok(sync.then_some(done))
    })
}

/// The most RDMA READs and atomics in flight each way (the device's
/// max_qp_rd_atom).
const MAX_RD_ATOMIC: u8 = 16;

/// # Safety
/// `id` is an id.
#[no_mangle]
pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, _backlog: c_int) -> c_int {
    id_call(id, |cm| {
        listen(cm, id).inspect_err(|&e| {
            if trace() {
                let e = std::io::Error::from_raw_os_error(e);
                eprintln!("rdma-xdp cm: rdma_listen: {e}");
            }
        })
    })
}

/// Listens on the id's address: its device, or every device for a
/// wildcard (bound to an ephemeral port first if it is not bound).
fn listen(cm: &mut Cm, id: *mut rdma_cm_id) -> Result<(), c_int> {
    // SAFETY: a live id of ours.
    let ps = unsafe { (*id).ps };
    if cm.ids[&(id as usize)].src.is_none() {
        bind(cm, id, SocketAddr::new(IpAddr::from([0u8; 4]), 0))?;
    }
    let st = &cm.ids[&(id as usize)];
    let src = st.src.unwrap();
    if !st.listens.is_empty() {
        return Ok(());
    }
    let devs: Vec<usize> = match st.dev {
        Some(d) => vec![d],
        None => {
            let mut v = Vec::new();
            for (nd, addrs) in devices_with_addrs() {
                if !addrs.is_empty() {
                    v.push(cm.dev(&nd)?);
                }
            }
            v
        }
    };
    if devs.is_empty() {
        return Err(libc::ENODEV);
    }
    let svc = service_id(ps as u16, src.port());
    let mut got = Vec::new();
    for d in devs {
        match cm.devs[d].agent.listen(svc) {
            Ok(h) => got.push((d, h)),
            Err(_) => {
                for (d, h) in got {
                    cm.devs[d].agent.unlisten(h);
                }
                return Err(libc::EADDRINUSE);
            }
        }
    }
    for &(d, h) in &got {
        cm.by_listener.insert((d, h), id as usize);
    }
    cm.ids.get_mut(&(id as usize)).unwrap().listens = got;
    Ok(())
}

/// # Safety
/// `id` is an id from a CONNECT_REQUEST; `param` NULL or parameters.
#[no_mangle]
pub unsafe extern "C" fn rdma_accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    let p = conn_param_or_default(param);
    sync_call(id, |cm| {
        // SAFETY: a live id of ours (sync_call checked).
        let (ps, qp) = unsafe { ((*id).ps, (*id).qp) };
        let now = cm.now();
        let st = &cm.ids[&(id as usize)];
        let Some((dev, comm)) = st.conn else {
            return Err(libc::EINVAL);
        };
        let sync = st.sync;
        let qpn = qpn_of(qp, &p);
        if ps == RDMA_PS_UDP {
            let user = private(p.private_data, p.private_data_len, SIDR_REP_PRIVATE_LEN)?;
            let mut pd = [0u8; SIDR_REP_PRIVATE_LEN];
            pd[..user.len()].copy_from_slice(&user);
            let svc = st.sidr_service;
            cm.devs[dev]
                .agent
                .sidr_reply(comm, sidr::SUCCESS, qpn, RDMA_UDP_QKEY, svc, pd)
                .map_err(|_| libc::EINVAL)?;
            cm.by_conn.remove(&(dev, comm));
            cm.ids.get_mut(&(id as usize)).unwrap().conn = None;
            return Ok(None);
        }
        let Some(req) = st.req else {
            return Err(libc::EINVAL);
        };
        let user = private(p.private_data, p.private_data_len, REP_PRIVATE_LEN)?;
        let st = cm.ids.get_mut(&(id as usize)).unwrap();
        st.my_psn = (entropy() & 0xff_ffff) as u32;
        // As librdmacm: without parameters, or with RDMA_MAX_RESP_RES /
        // RDMA_MAX_INIT_DEPTH (0xff), what the request offered (within
        // the device's limit); else the program's values.
        st.responder_resources = match p.responder_resources {
            0xff => req.initiator_depth,
            r => r,
        }
        .min(MAX_RD_ATOMIC);
        st.initiator_depth = match p.initiator_depth {
            0xff => req.responder_resources,
            d => d,
        }
        .min(MAX_RD_ATOMIC);
        let (psn, rr, id_) = (st.my_psn, st.responder_resources, st.initiator_depth);
        if !qp.is_null() {
            cm.modify(id, IBV_QPS_RTR)?;
            cm.modify(id, IBV_QPS_RTS)?;
        }
        let mut pd = [0u8; REP_PRIVATE_LEN];
        pd[..user.len()].copy_from_slice(&user);
        let a = AcceptParams {
            qpn,
            starting_psn: psn,
            responder_resources: rr,
            initiator_depth: id_,
            rnr_retry_count: p.rnr_retry_count.min(7),
            // SAFETY: a live id of ours.
            srq: p.srq != 0 || !unsafe { (*id).srq }.is_null(),
            private_data: pd,
        };
        cm.devs[dev]
            .agent
            .accept(now, comm, &a)
            .map_err(|_| libc::EINVAL)?;
        Ok(sync.then_some(RDMA_CM_EVENT_ESTABLISHED))
    })
}

/// A call on a live id: runs `f` on the CM; 0, or -1 with errno. When `f`
/// names an event (a synchronous id), waits for it first (`wait_sync`).
fn sync_call(
    id: *mut rdma_cm_id,
    f: impl FnOnce(&mut Cm) -> Result<Option<c_int>, c_int>,
) -> c_int {
    guard(-1, || {
        if !live_id(id) {
            return err(libc::EINVAL);
        }
        match with_cm(f) {
            Ok(Some(ok)) => wait_sync(id, ok),
            Ok(None) => 0,
            Err(e) => err(e),
        }
    })
}

/// A call on a live id that changes CM state only: 0, or -1 with errno.
fn id_call(id: *mut rdma_cm_id, f: impl FnOnce(&mut Cm) -> Result<(), c_int>) -> c_int {
    sync_call(id, |cm| f(cm).map(|()| None))
}

/// The id's connection: (device, comm id).
fn conn_of(cm: &Cm, id: *mut rdma_cm_id) -> Result<(usize, u32), c_int> {
    cm.ids[&(id as usize)].conn.ok_or(libc::EINVAL)
}

/// # Safety
/// `id` is an id from a CONNECT_REQUEST; `data` NULL or `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn rdma_reject(id: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    id_call(id, |cm| {
        let user = private(data, len, REJ_PRIVATE_LEN)?;
        let (dev, comm) = conn_of(cm, id)?;
        cm.ids.get_mut(&(id as usize)).unwrap().conn = None;
        cm.by_conn.remove(&(dev, comm));
        let mut pd = [0u8; REJ_PRIVATE_LEN];
        pd[..user.len()].copy_from_slice(&user);
        cm.devs[dev]
            .agent
            .reject(comm, rej::CONSUMER_REJECT, pd)
            .map_err(|_| libc::EINVAL)
    })
}

/// # Safety
/// `id` is an id that got a CONNECT_RESPONSE.
#[no_mangle]
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    id_call(id, |cm| {
        // SAFETY: a live id of ours (id_call checked).
        if !unsafe { (*id).qp }.is_null() {
            return Err(libc::EINVAL);
        }
        let (dev, comm) = conn_of(cm, id)?;
        cm.devs[dev]
            .agent
            .establish(comm, [0; RTU_PRIVATE_LEN])
            .map_err(|_| libc::EINVAL)
    })
}

/// # Safety
/// `id` is an id.
#[no_mangle]
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    id_call(id, |cm| {
        let now = cm.now();
        // SAFETY: a live id of ours (id_call checked).
        if !unsafe { (*id).qp }.is_null() {
            // The QP stops first, as rdma_cm's does: posted work flushes.
            let _ = cm.modify(id, IBV_QPS_ERR);
        }
        let (dev, comm) = conn_of(cm, id)?;
        match cm.devs[dev]
            .agent
            .disconnect(now, comm, [0; DREQ_PRIVATE_LEN])
        {
            // A DREQ received (or sent) already: nothing more to say.
            Ok(()) | Err(CmError::WrongState(CmState::TimeWait | CmState::DreqSent)) => Ok(()),
            Err(_) => Err(libc::EINVAL),
        }
    })
}

/// # Safety
/// `id` is an id.
#[no_mangle]
pub unsafe extern "C" fn rdma_notify(id: *mut rdma_cm_id, event: c_int) -> c_int {
    id_call(id, |cm| {
        if event as u32 != IBV_EVENT_COMM_EST {
            return Ok(());
        }
        let (dev, comm) = conn_of(cm, id)?;
        cm.devs[dev]
            .agent
            .notify_established(comm)
            .map_err(|_| libc::EINVAL)
    })
}

/// # Safety
/// `id` is an id; `attr` and `mask` point to what to fill.
#[no_mangle]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    guard(-1, || {
        if !live_id(id) || attr.is_null() || mask.is_null() {
            return err(libc::EINVAL);
        }
        // SAFETY: the caller's attr: its qp_state says which attributes.
        let state = unsafe { (*attr).qp_state };
        match with_cm(|cm| cm.qp_attr(id, state)) {
            Ok((a, m)) => {
                // SAFETY: the caller's out pointers.
                unsafe {
                    *attr = a;
                    *mask = m;
                }
                0
            }
            Err(e) => err(e),
        }
    })
}

/// # Safety
/// `id` is an id; `optval` points to `optlen` bytes.
#[no_mangle]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    id_call(id, |cm| {
        if optval.is_null() {
            return Err(libc::EINVAL);
        }
        if level != RDMA_OPTION_ID {
            return Err(libc::ENOSYS);
        }
        let st = cm.ids.get_mut(&(id as usize)).unwrap();
        // SAFETY: the caller's option value of optlen bytes.
        unsafe {
            match (optname, optlen) {
                (RDMA_OPTION_ID_TOS, 1..) => st.tos = *(optval as *const u8),
                (RDMA_OPTION_ID_REUSEADDR, 4..) => st.reuse = *(optval as *const c_int) != 0,
                (RDMA_OPTION_ID_AFONLY, 4..) => st.afonly = *(optval as *const c_int) != 0,
                (RDMA_OPTION_ID_ACK_TIMEOUT, 1..) => {
                    st.ack_timeout = Some(*(optval as *const u8) & 0x1f)
                }
                _ => return Err(libc::EINVAL),
            }
        }
        Ok(())
    })
}

/// # Safety
/// `id` is an id; `channel` NULL or a channel.
#[no_mangle]
pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    guard(-1, || {
        if !live_id(id) || (!channel.is_null() && self::channel(channel).is_none()) {
            return err(libc::EINVAL);
        }
        let (ch, sync) = if channel.is_null() {
            match new_channel() {
                // SAFETY: a live channel.
                Ok(c) => (unsafe { ptr::addr_of_mut!((*c).ch) }, true),
                Err(e) => return err(e),
            }
        } else {
            (channel, false)
        };
        let old_sync = with_cm(|cm| {
            let st = cm.ids.get_mut(&(id as usize)).unwrap();
            std::mem::replace(&mut st.sync, sync)
        });
        // SAFETY: a live id of ours.
        let old = unsafe { std::mem::replace(&mut (*id).channel, ch) };
        // Its queued events move with it.
        if let (Some(o), Some(n)) = (self::channel(old), self::channel(ch)) {
            let mine: Vec<usize> = {
                let mut q = o.queue.lock().unwrap_or_else(|e| e.into_inner());
                let (m, rest): (Vec<usize>, Vec<usize>) =
                    // SAFETY: queued events are live leaked Boxes.
                    q.drain(..).partition(|&e| unsafe { (*(e as *mut Event)).ev.id } == id);
                q.extend(rest);
                m
            };
            for e in mine {
                // SAFETY: moved from one queue to the other, still owned once.
                post(ch, unsafe { Box::from_raw(e as *mut Event) });
            }
            let _ = n;
        }
        if old_sync {
            free_channel(old);
        }
        0
    })
}

/// # Safety
/// `id` is an id.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    if !live_id(id) {
        return 0;
    }
    // SAFETY: a live id of ours.
    port_of(unsafe { &(*id).route.addr.src }).to_be()
}

/// # Safety
/// `id` is an id.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    if !live_id(id) {
        return 0;
    }
    // SAFETY: a live id of ours.
    port_of(unsafe { &(*id).route.addr.dst }).to_be()
}

/// # Safety
/// `listen` is a synchronous listening id; `id` points to a pointer.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    guard(-1, || {
        if !live_id(listen) || id.is_null() {
            return err(libc::EINVAL);
        }
        // SAFETY: a live id of ours.
        let Some(c) = channel(unsafe { (*listen).channel }) else {
            return err(libc::EINVAL);
        };
        loop {
            let e = match take(&c) {
                // SAFETY: the event just taken, freed once here.
                Ok(e) => unsafe { Box::from_raw(e) },
                Err(e) => return err(e),
            };
            if e.ev.event != RDMA_CM_EVENT_CONNECT_REQUEST {
                continue;
            }
            let child = e.ev.id;
            let ep = with_cm(|cm| cm.ids.get(&(child as usize)).and_then(|s| s.ep_init));
            if let Some((mut init, pd)) = ep {
                if create_qp(child, pd, &mut init) != 0 {
                    // SAFETY: the id just handed to us.
                    unsafe { rdma_reject(child, ptr::null(), 0) };
                    destroy_id_inner(child);
                    return -1;
                }
            }
            // SAFETY: the caller's out pointer.
            unsafe { *id = child };
            return 0;
        }
    })
}

/// # Safety
/// `id` points to a pointer; `res` is address info; `pd` and `attr` may
/// be NULL.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(-1, || {
        if id.is_null() || res.is_null() {
            return err(libc::EINVAL);
        }
        // SAFETY: the caller's address info.
        let r = unsafe { &*res };
        let mut new = ptr::null_mut();
        // SAFETY: a synchronous id (no channel).
        if unsafe { rdma_create_id(ptr::null_mut(), &mut new, ptr::null_mut(), r.ai_port_space) }
            != 0
        {
            return -1;
        }
        if !attr.is_null() {
            // rdma_create_ep takes the QP type from the address info.
            // SAFETY: the caller's attr.
            unsafe { (*attr).qp_type = r.ai_qp_type as u32 };
        }
        let fail = |new| {
            destroy_id_inner(new);
            -1
        };
        if r.ai_flags & RAI_PASSIVE != 0 {
            // SAFETY: a live id and the caller's address.
            if unsafe { rdma_bind_addr(new, r.ai_src_addr) } != 0 {
                return fail(new);
            }
            if !attr.is_null() {
                // SAFETY: the caller's attr, kept for each request.
                let init = unsafe { *attr };
                with_cm(|cm| cm.ids.get_mut(&(new as usize)).unwrap().ep_init = Some((init, pd)));
            }
        } else {
            // SAFETY: a live id and the caller's addresses.
            unsafe {
                if rdma_resolve_addr(new, r.ai_src_addr, r.ai_dst_addr, 2000) != 0
                    || rdma_resolve_route(new, 2000) != 0
                {
                    return fail(new);
                }
            }
            if !attr.is_null() && create_qp(new, pd, attr) != 0 {
                return fail(new);
            }
        }
        // SAFETY: the caller's out pointer.
        unsafe { *id = new };
        0
    })
}

/// # Safety
/// `id` is an id from `rdma_create_ep` (or any id).
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    guard((), || {
        if !live_id(id) {
            return;
        }
        let own_pd = with_cm(|cm| cm.ids[&(id as usize)].own_pd);
        // SAFETY: a live id of ours and what it owns (rdma_destroy_qp
        // frees the CQs made for it).
        unsafe {
            rdma_destroy_qp(id);
            if own_pd && !(*id).pd.is_null() {
                crate::pd::ibv_dealloc_pd((*id).pd);
            }
        }
        destroy_id_inner(id);
    })
}

/// # Safety
/// `num` is NULL or points to an int.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    guard(ptr::null_mut(), || {
        let ctxs: Vec<*mut ibv_context> = with_cm(|cm| {
            devices_with_addrs()
                .into_iter()
                .filter_map(|(nd, _)| cm.dev(&nd).ok().map(|d| cm.devs[d].ctx))
                .collect()
        });
        crate::device::null_terminated(ctxs, num)
    })
}

/// # Safety
/// `list` is NULL or from `rdma_get_devices`.
#[no_mangle]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: the caller's list from rdma_get_devices.
    unsafe { crate::device::free_null_terminated(list) }
}

/// rsocket's poll: there are no rsockets here, so it is poll(2).
///
/// # Safety
/// As poll(2).
#[no_mangle]
pub unsafe extern "C" fn rpoll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout: c_int,
) -> c_int {
    // SAFETY: the caller's poll array, as poll(2) takes it.
    unsafe { libc::poll(fds, nfds, timeout) }
}

/// Multicast is not offered.
#[no_mangle]
pub extern "C" fn rdma_join_multicast(
    _id: *mut rdma_cm_id,
    _addr: *mut c_void,
    _ctx: *mut c_void,
) -> c_int {
    err(libc::EOPNOTSUPP)
}

#[no_mangle]
pub extern "C" fn rdma_join_multicast_ex(
    _id: *mut rdma_cm_id,
    _attr: *mut c_void,
    _ctx: *mut c_void,
) -> c_int {
    err(libc::EOPNOTSUPP)
}

#[no_mangle]
pub extern "C" fn rdma_leave_multicast(_id: *mut rdma_cm_id, _addr: *mut c_void) -> c_int {
    err(libc::EOPNOTSUPP)
}

/// Enhanced connection establishment (ECE) is not offered.
#[no_mangle]
pub extern "C" fn rdma_set_local_ece(_id: *mut rdma_cm_id, _ece: *mut c_void) -> c_int {
    err(libc::EOPNOTSUPP)
}

#[no_mangle]
pub extern "C" fn rdma_get_remote_ece(_id: *mut rdma_cm_id, _ece: *mut c_void) -> c_int {
    err(libc::EOPNOTSUPP)
}

#[no_mangle]
pub extern "C" fn rdma_reject_ece(_id: *mut rdma_cm_id, _data: *const c_void, _len: u8) -> c_int {
    err(libc::EOPNOTSUPP)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(fd: c_int) -> bool {
        // SAFETY: F_GETFD reads a flag of a number, open or not.
        unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
    }

    /// A channel destroyed while a thread is in a call on it (rping's CM
    /// thread entering rdma_get_cm_event as its main thread tears down)
    /// keeps its eventfd until that thread is out; later calls see EINVAL.
    #[test]
    fn a_channel_in_use_outlives_its_destroy() {
        let ch = rdma_create_event_channel();
        assert!(!ch.is_null());
        // SAFETY: a live channel of ours.
        let fd = unsafe { (*ch).fd };
        let inside = channel(ch).expect("live");
        // SAFETY: our channel, destroyed once.
        unsafe { rdma_destroy_event_channel(ch) };
        assert!(channel(ch).is_none(), "destroyed for new callers");
        let mut ev = ptr::null_mut();
        // SAFETY: a pointer that is no live channel is refused, not read.
        assert_eq!(unsafe { rdma_get_cm_event(ch, &mut ev) }, -1);
        assert_eq!(errno(), libc::EINVAL);
        assert!(open(fd), "the thread inside still reads an open eventfd");
        // An event posted before the destroy still reaches it.
        inside
            .queue
            .lock()
            .unwrap()
            .push_back(Box::into_raw(Box::new(Event {
                // SAFETY: a C struct of integers and pointers: zero is valid.
                ev: unsafe { std::mem::zeroed() },
                data: [0; MAD_LEN],
            })) as usize);
        let one = 1u64;
        // SAFETY: 8 bytes from a local into the open eventfd.
        let n = unsafe { libc::write(fd, &one as *const u64 as *const c_void, 8) };
        assert_eq!(n, 8);
        let e = take(&inside).expect("the queued event");
        // SAFETY: the event just taken, freed once.
        drop(unsafe { Box::from_raw(e) });
        drop(inside);
        assert!(!open(fd), "the last user closed it");
    }

    /// Destroyed by one thread, a channel blocks the calls of the others
    /// (as rdma_cm's read(2) already under way) and fails the destroyer's.
    #[test]
    fn a_channel_destroyed_by_another_thread_blocks_its_readers() {
        let ch = rdma_create_event_channel() as usize;
        let in_destroyer = std::thread::spawn(move || {
            let ch = ch as *mut rdma_event_channel;
            // SAFETY: our channel, destroyed once.
            unsafe { rdma_destroy_event_channel(ch) };
            destroyed_by_another_thread(ch)
        })
        .join()
        .unwrap();
        assert!(!in_destroyer);
        assert!(destroyed_by_another_thread(ch as *mut _));
        // A new channel at that address is not destroyed.
        let fresh = rdma_create_event_channel();
        if fresh as usize == ch {
            assert!(!destroyed_by_another_thread(fresh));
        }
        // SAFETY: our channel, destroyed once.
        unsafe { rdma_destroy_event_channel(fresh) };
    }
}
