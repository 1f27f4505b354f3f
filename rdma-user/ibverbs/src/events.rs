//! Asynchronous events: `ibv_get_async_event` and `ibv_ack_async_event`
//! on the context's `async_fd`.
//!
//! Port events come from the context's port monitor (`port`); QP events
//! from the data path (`AsyncEvent::QpFatal`, raised when the engine moves
//! a QP to the error state by itself); SRQ limit events from the SRQ's
//! ring.

use std::ffi::c_int;
use std::sync::atomic::Ordering;

use rdma_user::device::rings::AsyncEvent;

use crate::ffi::*;
use crate::objects::{our_context, QPS, SRQS};
use crate::set_errno;

/// The live QP `qpn` of `context`, counted as having one more event out.
fn qp_reported(context: *mut ibv_context, qpn: u32) -> Option<*mut ibv_qp> {
    let q = QPS.find(|q| {
        let ours = q.qpn == qpn && q.ctx.ibv() == context;
        if ours {
            // Counted while the QP cannot leave the table.
            q.events_reported.fetch_add(1, Ordering::AcqRel);
        }
        ours
    })?;
    Some(q.qpx.get().cast())
}

/// `ibv_ack_async_event` of a QP event.
fn qp_event_acked(qp: *mut ibv_qp) {
    if let Some(q) = QPS.get(qp) {
        q.events_acked.fetch_add(1, Ordering::AcqRel);
    }
}

/// The next asynchronous event of `context`: blocks in `read` on its
/// `async_fd` (EINTR on a signal, EAGAIN with O_NONBLOCK), as rdma-core's
/// kernel event file does.
///
/// # Safety
/// `context` is a context; `event` points to an `ibv_async_event`.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    // The events only: a blocked read does not keep the context.
    let Some(events) = our_context(context).map(|c| c.events.clone()) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    if event.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    loop {
        let mut v: u64 = 0;
        // SAFETY: reading 8 bytes into a local from our eventfd.
        let n = unsafe { libc::read(events.fd(), (&mut v as *mut u64).cast(), 8) };
        if n != 8 {
            return -1;
        }
        let Some(ev) = events.pop() else {
            continue;
        };
        let mut out = ibv_async_event::default();
        match ev {
            AsyncEvent::PortActive | AsyncEvent::PortErr => {
                out.element.port_num = 1;
                out.event_type = if ev == AsyncEvent::PortActive {
                    IBV_EVENT_PORT_ACTIVE
                } else {
                    IBV_EVENT_PORT_ERR
                };
            }
            AsyncEvent::SrqLimit(token) => {
                // A destroyed SRQ has nobody to tell.
                let Some(srq) = SRQS.get(token as *mut ibv_srq) else {
                    continue;
                };
                out.element.srq = srq.srq.get();
                out.event_type = IBV_EVENT_SRQ_LIMIT_REACHED;
            }
            AsyncEvent::QpFatal(qpn) => {
                // A QP destroyed since has nobody to tell.
                let Some(qp) = qp_reported(context, qpn) else {
                    continue;
                };
                out.element.qp = qp;
                out.event_type = IBV_EVENT_QP_FATAL;
            }
        }
        // SAFETY: the caller's event.
        unsafe { event.write(out) };
        return 0;
    }
}

/// # Safety
/// `event` is one `ibv_get_async_event` returned.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    if event.is_null() {
        return;
    }
    // SAFETY: the caller's event.
    let e = unsafe { &*event };
    if e.event_type == IBV_EVENT_QP_FATAL {
        // SAFETY: element.qp is the union member a QP event sets.
        qp_event_acked(unsafe { e.element.qp });
    }
}

/// rdma-core's names of the event types.
#[no_mangle]
pub extern "C" fn ibv_event_type_str(event: ibv_event_type) -> *const std::ffi::c_char {
    let s: &'static [u8] = match event {
        IBV_EVENT_CQ_ERR => b"CQ error\0",
        IBV_EVENT_QP_FATAL => b"local work queue catastrophic error\0",
        IBV_EVENT_QP_REQ_ERR => b"invalid request local work queue error\0",
        IBV_EVENT_QP_ACCESS_ERR => b"local access violation work queue error\0",
        IBV_EVENT_COMM_EST => b"communication established\0",
        IBV_EVENT_SQ_DRAINED => b"send queue drained\0",
        IBV_EVENT_PATH_MIG => b"path migrated\0",
        IBV_EVENT_PATH_MIG_ERR => b"path migration request error\0",
        IBV_EVENT_DEVICE_FATAL => b"local catastrophic error\0",
        IBV_EVENT_PORT_ACTIVE => b"port active\0",
        IBV_EVENT_PORT_ERR => b"port error\0",
        IBV_EVENT_LID_CHANGE => b"LID change\0",
        IBV_EVENT_PKEY_CHANGE => b"P_Key change\0",
        IBV_EVENT_SM_CHANGE => b"SM change\0",
        IBV_EVENT_SRQ_ERR => b"SRQ catastrophic error\0",
        IBV_EVENT_SRQ_LIMIT_REACHED => b"SRQ limit reached\0",
        IBV_EVENT_QP_LAST_WQE_REACHED => b"last WQE reached\0",
        IBV_EVENT_CLIENT_REREGISTER => b"client reregistration\0",
        IBV_EVENT_GID_CHANGE => b"GID table change\0",
        IBV_EVENT_WQ_FATAL => b"WQ fatal\0",
        _ => b"unknown\0",
    };
    s.as_ptr().cast()
}
