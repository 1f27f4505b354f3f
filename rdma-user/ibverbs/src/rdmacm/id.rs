//! Ids: `rdma_create_id`, `rdma_destroy_id`, `rdma_migrate_id`,
//! `rdma_set_option`, `rdma_get_src_port`, `rdma_get_dst_port`.

use std::ffi::{c_int, c_void};
use std::ptr;

use super::abi::*;
use super::addr::port_of;
use super::channel::{channel, free_channel, new_channel, post, wait_events_acked, Event};
use super::service::{id_call, with_cm};
use super::state::{err, id_state, live_id, new_id, LIVE_IDS};
use crate::ffi::*;
use crate::guard;

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

pub(super) fn destroy_id_inner(id: *mut rdma_cm_id) -> c_int {
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
