//! Event channels (semaphore eventfds, one count per queued event) and the
//! events queued on them: `rdma_create_event_channel`,
//! `rdma_destroy_event_channel`, `rdma_get_cm_event`, `rdma_ack_cm_event`,
//! `rdma_event_str`.

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void};
use std::ptr;
use std::sync::Mutex;
use std::time::Instant;

use rdma_user::wire::cm::*;

use super::abi::*;
use super::state::{err, LIVE_IDS};
use crate::objects::Boxes;
use crate::{guard, set_errno};

#[repr(C)]
pub(super) struct Channel {
    pub(super) ch: rdma_event_channel,
    pub(super) queue: Mutex<VecDeque<usize>>,
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
pub(super) struct ChannelRef(*mut Channel);

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
pub(super) struct Event {
    pub(super) ev: rdma_cm_event,
    pub(super) data: [u8; MAD_LEN],
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
pub(super) fn wait_events_acked(id: usize) {
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

pub(super) fn new_channel() -> Result<*mut Channel, c_int> {
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

pub(super) fn channel(ch: *mut rdma_event_channel) -> Option<ChannelRef> {
    ChannelRef::get(ch)
}

pub(super) fn post(ch: *mut rdma_event_channel, ev: Box<Event>) {
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
pub(super) fn take(ch: &Channel) -> Result<*mut Event, c_int> {
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
pub(super) fn free_channel(ch: *mut rdma_event_channel) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errno;

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
