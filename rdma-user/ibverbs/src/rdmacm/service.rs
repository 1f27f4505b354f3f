//! Running the CM: the CM behind its lock, the CM thread (QP1's mailboxes
//! and the CM's timers), and how a call on an id runs the CM and waits for
//! a synchronous id's event.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use rdma_user::device::gsi::GsiOut;

use super::abi::*;
use super::channel::{channel, take};
use super::state::{err, live_id, Cm};
use crate::guard;

static CM: Mutex<Option<Cm>> = Mutex::new(None);

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
pub(super) fn with_cm<R>(f: impl FnOnce(&mut Cm) -> R) -> R {
    let mut g = lock();
    let cm = cm(&mut g);
    let r = f(cm);
    cm.pump();
    cm.wake();
    r
}

/// A synchronous id's call: waits for its next event, and turns it into
/// 0 or -1 with errno (`ok`: the event kind that means success).
pub(super) fn wait_sync(id: *mut rdma_cm_id, ok: c_int) -> c_int {
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

/// A call on a live id: runs `f` on the CM; 0, or -1 with errno. When `f`
/// names an event (a synchronous id), waits for it first (`wait_sync`).
pub(super) fn sync_call(
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
pub(super) fn id_call(id: *mut rdma_cm_id, f: impl FnOnce(&mut Cm) -> Result<(), c_int>) -> c_int {
    sync_call(id, |cm| f(cm).map(|()| None))
}
