//! Completion queues and completion channels: `ibv_create_cq`,
//! `ibv_destroy_cq`, `ibv_create_comp_channel`, `ibv_destroy_comp_channel`,
//! `ibv_get_cq_event`, `ibv_ack_cq_events`, and the calls programs make
//! inline through `ctx->ops`: `ibv_poll_cq` (a lock-free pop of the CQ's
//! ring, which also tries a turn of the data path on the calling thread
//! when the ring is empty) and `ibv_req_notify_cq`.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::mem::size_of;
use std::ptr;
use std::sync::{Arc, Mutex};

use crossbeam_queue::ArrayQueue;
use rdma_user::device::rings::CqShared;
use rdma_user::transport::{NetworkType, Wc, WcOpcode, WcStatus};

use crate::ffi::*;
use crate::objects::{open_context, CShared, Channel, Cq, CHANNELS, CQS};
use crate::{err_ptr, guard, set_errno};

/// # Safety
/// `context` is a context.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    guard(ptr::null_mut(), || {
        let Some(ctx) = open_context(context) else {
            return err_ptr(libc::EINVAL);
        };
        // SAFETY: eventfd has no memory arguments.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return ptr::null_mut();
        }
        CHANNELS
            .add(Arc::new(Channel {
                ch: CShared::new(ibv_comp_channel {
                    context,
                    fd,
                    refcnt: 0,
                }),
                fd,
                fired: Arc::new(ArrayQueue::new(4096)),
                cqs: Mutex::new(0),
                ctx,
            }))
            .cast()
    })
}

/// EBUSY while a CQ uses the channel.
///
/// # Safety
/// `channel` is a channel pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    guard(libc::EIO, || {
        CHANNELS
            .destroy(channel, libc::EINVAL, |ch| {
                let mut cqs = ch.cqs.lock().unwrap_or_else(|e| e.into_inner());
                match *cqs {
                    0 => {}
                    // Another thread destroyed it meanwhile.
                    DESTROYED => return Err(libc::EINVAL),
                    _ => return Err(libc::EBUSY),
                }
                // No CQ takes it from now on (`count_cq`).
                *cqs = DESTROYED;
                // SAFETY: our eventfd, closed once (under the lock, which
                // only this call finds at 0).
                unsafe { libc::close(ch.fd) };
                Ok(())
            })
            .err()
            .unwrap_or(0)
    })
}

/// `Channel::cqs` of a destroyed channel.
const DESTROYED: c_int = -1;

/// Counts one CQ more (`by` 1) or less (-1) on `ch`; false if it is
/// destroyed.
fn count_cq(ch: &Channel, by: c_int) -> bool {
    let mut cqs = ch.cqs.lock().unwrap_or_else(|e| e.into_inner());
    if *cqs == DESTROYED {
        return false;
    }
    *cqs += by;
    // SAFETY: the channel's own struct, written under `cqs`'s lock (so no
    // two of our writes race); the program only reads `refcnt`.
    unsafe { (*ch.ch.get()).refcnt = *cqs };
    true
}

/// The most entries a CQ holds (`max_cqe`). Above rxe's 32767: libfabric's
/// `ofi_rxm` sizes its CQ for its whole universe (262 144 entries by
/// default), and a CQ's ring costs only memory (some 64 bytes an entry).
pub(crate) const MAX_CQE: c_int = 1 << 20;

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
        let Some(ctx) = open_context(context) else {
            return err_ptr(libc::EINVAL);
        };
        if !(1..=MAX_CQE).contains(&cqe) {
            return err_ptr(libc::EINVAL);
        }
        let ch = if channel.is_null() {
            None
        } else {
            match CHANNELS.get(channel) {
                Some(c) => Some(c),
                None => return err_ptr(libc::EINVAL),
            }
        };
        let dp = match ctx.data_path() {
            Ok(d) => d,
            Err(e) => return err_ptr(e),
        };
        let inner = match dp.create_cq(cqe as usize) {
            Ok(i) => i,
            Err(e) => return err_ptr(e.errno()),
        };
        if ch.as_ref().is_some_and(|ch| !count_cq(ch, 1)) {
            return err_ptr(libc::EINVAL);
        }
        // The CQ's address is its token in the channel's fired queue.
        let c = Arc::new_cyclic(|me| Cq {
            cq: CShared::new(ibv_cq {
                context,
                channel,
                cq_context,
                cqe,
                ..Default::default()
            }),
            inner: Mutex::new(None),
            shared: Arc::new(CqShared::new(
                cqe as usize,
                ch.as_ref().map(|c| (c.fd, c.fired.clone())),
                me.as_ptr() as usize,
            )),
            dp: dp.clone(),
            channel: ch,
            events_acked: Mutex::new(0),
            ctx,
        });
        if let Err(e) = inner.share(c.shared.clone()) {
            if let Some(ch) = &c.channel {
                count_cq(ch, -1);
            }
            return err_ptr(e.errno());
        }
        *c.inner.lock().unwrap_or_else(|e| e.into_inner()) = Some(inner);
        CQS.add(c).cast()
    })
}

/// # Safety
/// `cq` is a CQ pointer.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard(libc::EIO, || {
        CQS.destroy(cq, libc::EINVAL, |c| {
            let mut inner = c.inner.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = inner.as_ref() {
                // On EBUSY the CQ stays as it was.
                i.destroy().map_err(|e| e.errno())?;
            }
            if inner.take().is_some() {
                if let Some(ch) = &c.channel {
                    count_cq(ch, -1);
                }
            }
            Ok(())
        })
        .err()
        .unwrap_or(0)
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
    if let Some(net) = w.grh {
        // UD: RoCE has no LIDs (slid and dlid_path_bits stay 0). `sl`
        // carries the packet type as mlx5 reports it for RoCE (bit 3 UDP,
        // bits 2..0 the L3 header: 2 IPv4, 1 IPv6); UCX's ud_verbs reads it
        // to find the destination address in the GRH bytes, and drops the
        // datagram if it is 0 (RoCE v1's GRH). rxe leaves it 0.
        wc.wc_flags |= IBV_WC_GRH;
        wc.src_qp = w.src_qp;
        wc.sl = match net {
            NetworkType::Ipv4 => 0x8 | 0x2,
            NetworkType::Ipv6 => 0x8 | 0x1,
        };
    }
    wc
}

/// `ctx->ops.poll_cq`: pops the CQ ring (no lock, no syscall).
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    guard(-1, || {
        let Some(c) = CQS.get(cq) else {
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
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    let Some(c) = CQS.get(cq) else {
        return libc::EINVAL;
    };
    if c.channel.is_none() {
        return libc::EINVAL;
    }
    c.shared.arm(solicited_only != 0);
    // A program that waits on the channel's descriptor itself (O_NONBLOCK,
    // with poll or epoll) stops polling now: its frames are the data path
    // thread's to move again. One that blocks in `ibv_get_cq_event` says
    // so there, after it has moved them itself for a while; waking the
    // thread here, on every arm, would only have it race the program.
    // A solicited-only arm watches for rare control traffic (UCX's UD
    // transport arms its receive CQ so, again and again, while its main
    // thread keeps polling): the program's polls still move its frames.
    if solicited_only == 0 && c.channel.as_ref().is_some_and(|ch| nonblocking(ch.fd)) {
        c.dp.will_wait_for_events();
    }
    0
}

/// Whether the program made a channel's descriptor non-blocking (it may
/// do so at any time, so this is asked, not remembered).
fn nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL on a channel's eventfd reads its flags only.
    (unsafe { libc::fcntl(fd, libc::F_GETFL) }) & libc::O_NONBLOCK != 0
}

/// How long `ibv_get_cq_event` runs the data path itself before it sleeps:
/// `RDMA_XDP_EVENT_SPIN_US` microseconds (default 50; 0 sleeps at once).
fn event_spin() -> std::time::Duration {
    static SPIN: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| {
        let us = std::env::var("RDMA_XDP_EVENT_SPIN_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(50);
        std::time::Duration::from_micros(us)
    })
}

/// The next event of `channel`: blocks in `read` on its eventfd (so a
/// signal interrupts it with EINTR, and O_NONBLOCK gives EAGAIN, as with
/// rdma-core's kernel channel).
///
/// A blocking call first moves the data path itself for a short while
/// (`event_spin`): the answer a program waits for usually comes within a
/// round trip, and a thread that sleeps has it only after the data path
/// thread woke, took it in and wrote the eventfd, and the kernel woke the
/// program: two wakeups on the way, which on two cores cost more than the
/// round trip (qperf's `rc_lat` with events: 65 to 73 us, against 7.4 to
/// 7.9 us polled). Before it sleeps, it tells the data path thread that
/// frames are the thread's to move again.
///
/// # Safety
/// `channel` is a channel; `cq` and `cq_context` point to pointers.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    let Some(ch) = CHANNELS.get(channel) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    if cq.is_null() || cq_context.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    let blocking = !nonblocking(ch.fd);
    let dp = ch.ctx.dp.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let spin_until = std::time::Instant::now() + event_spin();
    loop {
        while let Some(tok) = ch.fired.pop() {
            let p = tok as *mut ibv_cq;
            if let Some(c) = CQS.get(p) {
                // SAFETY: the caller's out pointers (checked non-NULL), and
                // a field of the live CQ's struct (the program's to set).
                unsafe {
                    *cq = p;
                    *cq_context = (*c.cq.get()).cq_context;
                }
                return 0;
            }
        }
        if let Some(dp) = dp.as_ref().filter(|_| blocking) {
            if std::time::Instant::now() < spin_until {
                dp.progress();
                std::hint::spin_loop();
                continue;
            }
            dp.will_wait_for_events();
        }
        let mut v: u64 = 0;
        // SAFETY: reading 8 bytes into a local from our eventfd.
        let r = unsafe { libc::read(ch.fd, &mut v as *mut u64 as *mut c_void, 8) };
        if r < 0 {
            return -1;
        }
    }
}

/// # Safety
/// `cq` is a CQ.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
    if let Some(c) = CQS.get(cq) {
        let mut acked = c.events_acked.lock().unwrap_or_else(|e| e.into_inner());
        *acked = acked.wrapping_add(nevents);
        // SAFETY: the CQ's own struct, written under `events_acked`'s lock
        // (so no two of our writes race); the program only reads it.
        unsafe { (*c.cq.get()).comp_events_completed = *acked };
    }
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
