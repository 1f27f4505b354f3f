//! The objects a program holds pointers to, their tables and how long
//! they live, as rxe keeps its objects in pools (`rxe_pool.c`).
//!
//! Each object is rdma-core's struct first (in a [`CShared`]: the program
//! reads and writes it), then ours, so the pointer the program holds is
//! the object's address. Every call looks the pointer up in the table of
//! its kind ([`Live`]): a destroyed or foreign object is not found (EINVAL,
//! never a crash), and a found one is an `Arc` that keeps it in memory for
//! the call, whatever other threads destroy meanwhile.
//!
//! Every object made on a context holds it (an `Arc`): the context stays
//! in memory while any of them does, so no object outlives what it
//! points to. Its QPs are also counted ([`Held`]): `ibv_close_device`
//! refuses to close a context (EBUSY) until each of them is destroyed.
//!
//! Devices are never freed (rdma-core's may outlive their list while a
//! context uses them): one per link name, reused by later lists.

mod batch;
mod live;

use std::ffi::c_int;
use std::mem::offset_of;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};

use crossbeam_queue::ArrayQueue;
use rdma_user::control::links::Link;
use rdma_user::device::rings::{AsyncShared, CqShared, QpRings, SrqShared};
use rdma_user::verbs;

use crate::ffi::*;
use crate::port::{port_attr, PortMonitor};

pub(crate) use batch::{Batch, PendingWr};
pub(crate) use live::{Boxes, CShared, Held, Live, NotClosed, Parent, Plain, Users};

// SAFETY: rdma-core's structs (this one and those below), made of
// integers, arrays, function pointers and pointers the program owns
// (handles we never follow through these structs), with no Rust owner
// behind them.
unsafe impl Plain for verbs_context {}
// SAFETY: as above.
unsafe impl Plain for ibv_pd {}
// SAFETY: as above.
unsafe impl Plain for ibv_mr {}
// SAFETY: as above (its mutex and condition are bytes rdma-core owns).
unsafe impl Plain for ibv_cq {}
// SAFETY: as above.
unsafe impl Plain for ibv_comp_channel {}
// SAFETY: as above.
unsafe impl Plain for ibv_qp_ex {}
// SAFETY: as above.
unsafe impl Plain for ibv_srq {}
// SAFETY: as above.
unsafe impl Plain for ibv_ah {}

/// A device: rdma-core's struct first, so that the `*mut ibv_device` the
/// program holds is a `*mut Device`. The program only reads it.
#[repr(C)]
pub(crate) struct Device {
    pub(crate) dev: ibv_device,
    pub(crate) link: Link,
}

/// Every device handed out, leaked: they live for the process.
pub(crate) static DEVICES: Mutex<Vec<&'static Device>> = Mutex::new(Vec::new());

/// An open device: rdma-core's `verbs_context` (which ends with the
/// `ibv_context` the program holds) first, then ours.
#[repr(C)]
pub(crate) struct Context {
    pub(crate) vctx: CShared<verbs_context>,
    pub(crate) dev: &'static Device,
    /// The data path, started by the first PD or CQ; dropped at close.
    pub(crate) dp: Mutex<Option<verbs::Context>>,
    /// Asynchronous events; its eventfd is `async_fd`.
    pub(crate) events: Arc<AsyncShared>,
    /// Its QPs (`ibv_close_device` is EBUSY while any is live), and
    /// whether it is closed (it takes no more objects then).
    pub(crate) qps: Users,
    /// Raises the port events; stopped at close.
    pub(crate) monitor: Mutex<Option<PortMonitor>>,
}

impl Parent for Context {
    fn users(&self) -> &Users {
        &self.qps
    }
}

impl Context {
    /// The `ibv_context` the program holds.
    pub(crate) fn ibv(&self) -> *mut ibv_context {
        self.vctx
            .get()
            .wrapping_byte_add(offset_of!(verbs_context, context))
            .cast()
    }

    pub(crate) fn netdev(&self) -> &str {
        &self.dev.link.netdev
    }

    /// The port's active MTU in bytes (a UD QP's datagram limit).
    pub(crate) fn port_mtu(&self) -> u32 {
        128 << port_attr(self.netdev()).active_mtu
    }

    /// The data path, started on first use (not at `ibv_open_device`:
    /// `ibv_devinfo` must not attach XDP to an interface).
    pub(crate) fn data_path(&self) -> Result<verbs::Context, c_int> {
        let mut dp = self.dp.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = dp.as_ref() {
            return Ok(d.clone());
        }
        // Closed (`ibv_close_device` marks it under this lock before it
        // drops the data path): none is started again.
        if self.qps.is_closed() {
            return Err(libc::EINVAL);
        }
        // RDMA_XDP_POLLING=spin: the data path thread spins on the rings
        // like a NIC (takes a core); adaptive (the default) sleeps in
        // poll(2) when idle, and the program's own posts and polls run the
        // data path.
        let polling = match std::env::var("RDMA_XDP_POLLING").as_deref() {
            Ok("spin") => verbs::Polling::Spin,
            _ => verbs::Polling::Adaptive,
        };
        let cpu = std::env::var("RDMA_XDP_CPU")
            .ok()
            .and_then(|c| c.parse().ok());
        // An adaptive thread runs at nice -20 with a short slice where
        // allowed (RDMA_XDP_BOOST=0: never): it must preempt a program
        // spinning on memory on its core to place a WRITE, as rxe's softirq
        // does.
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
            events: Some(self.events.clone()),
            cc,
        };
        match verbs::Context::open(self.netdev(), opts) {
            Ok(d) => {
                *dp = Some(d.clone());
                Ok(d)
            }
            Err(e) => {
                eprintln!("libibverbs (rdma-xdp): cannot open {}: {e}", self.netdev());
                Err(e.errno())
            }
        }
    }
}

pub(crate) static CONTEXTS: Live<Context> = Live::new();

/// Our live context behind a program's `ibv_context`.
pub(crate) fn our_context(ctx: *mut ibv_context) -> Option<Arc<Context>> {
    if ctx.is_null() {
        return None;
    }
    CONTEXTS.get(ctx.wrapping_byte_sub(offset_of!(verbs_context, context)))
}

/// The open context behind `ctx`, for an object made on it; None if it is
/// not a live context or is being closed.
pub(crate) fn open_context(ctx: *mut ibv_context) -> Option<Arc<Context>> {
    our_context(ctx).filter(|c| !c.qps.is_closed())
}

/// A counted hold on the open context behind `ctx`, for a QP made on it;
/// None if it is not a live context or is being closed.
pub(crate) fn hold_context(ctx: *mut ibv_context) -> Option<Held<Context>> {
    Held::new(our_context(ctx)?)
}

#[repr(C)]
pub(crate) struct Pd {
    pub(crate) pd: CShared<ibv_pd>,
    pub(crate) inner: verbs::Pd,
    pub(crate) ctx: Arc<Context>,
}

impl Pd {
    /// The `ibv_context` it was allocated on.
    pub(crate) fn context(&self) -> *mut ibv_context {
        self.ctx.ibv()
    }
}

#[repr(C)]
pub(crate) struct Mr {
    pub(crate) mr: CShared<ibv_mr>,
    pub(crate) inner: Mutex<Option<verbs::Mr>>,
    pub(crate) ctx: Arc<Context>,
}

#[repr(C)]
pub(crate) struct Cq {
    pub(crate) cq: CShared<ibv_cq>,
    pub(crate) inner: Mutex<Option<verbs::Cq>>,
    /// The completion ring the data path fills; polled without it.
    pub(crate) shared: Arc<CqShared>,
    /// Its data path, which a poll of an empty ring runs a turn of.
    pub(crate) dp: verbs::Context,
    /// Its completion channel, if it has one.
    pub(crate) channel: Option<Arc<Channel>>,
    /// Events acknowledged (`ibv_ack_cq_events`), written to
    /// `cq.comp_events_completed` under this lock.
    pub(crate) events_acked: Mutex<u32>,
    pub(crate) ctx: Arc<Context>,
}

#[repr(C)]
pub(crate) struct Channel {
    pub(crate) ch: CShared<ibv_comp_channel>,
    /// Its eventfd (`ch.fd`).
    pub(crate) fd: c_int,
    /// CQs that fired (their addresses), in order.
    pub(crate) fired: Arc<ArrayQueue<usize>>,
    /// CQs using it, written to `ch.refcnt` under this lock:
    /// destroying the channel is EBUSY while there are any.
    pub(crate) cqs: Mutex<c_int>,
    pub(crate) ctx: Arc<Context>,
}

#[repr(C)]
pub(crate) struct Qp {
    /// What the program holds: `ibv_qp` (first, `qp_base`) inside
    /// `ibv_qp_ex`, as rdma-core's `verbs_qp` lays them out.
    pub(crate) qpx: CShared<ibv_qp_ex>,
    /// Its QPN (`qp_num`) and type (`qp_type`), as created.
    pub(crate) qpn: u32,
    pub(crate) qp_type: ibv_qp_type,
    /// Created by `ibv_create_qp_ex` with send ops: `ibv_qp_to_qp_ex`
    /// answers, and the `ibv_wr_*` calls build into `batch`.
    pub(crate) ex: bool,
    pub(crate) batch: Mutex<Batch>,
    pub(crate) inner: Mutex<Option<verbs::Qp>>,
    /// The work rings; the lock serialises this QP's posting threads only
    /// (the data path never takes it).
    pub(crate) rings: Mutex<Arc<QpRings>>,
    /// Its data path, which a post runs a turn of.
    pub(crate) dp: verbs::Context,
    pub(crate) cap: ibv_qp_cap,
    pub(crate) sq_sig_all: bool,
    pub(crate) ctx: Held<Context>,
    /// Asynchronous events handed out for this QP, and acknowledged:
    /// destroying it waits until they are equal, as rdma-core's does.
    pub(crate) events_reported: AtomicU32,
    pub(crate) events_acked: AtomicU32,
    /// The SRQ its receive WRs come from (ibv_post_recv is EINVAL then).
    pub(crate) srq: Option<Arc<Srq>>,
}

#[repr(C)]
pub(crate) struct Srq {
    pub(crate) srq: CShared<ibv_srq>,
    /// The PD it was created on (`srq.pd`), as an address.
    pub(crate) pd: usize,
    pub(crate) shared: Arc<SrqShared>,
    pub(crate) max_wr: u32,
    pub(crate) max_sge: u32,
    /// QPs attached: destroying the SRQ is EBUSY meanwhile.
    pub(crate) users: AtomicU32,
    pub(crate) ctx: Arc<Context>,
}

#[repr(C)]
pub(crate) struct Ah {
    pub(crate) ah: CShared<ibv_ah>,
    pub(crate) inner: verbs::Ah,
    pub(crate) ctx: Arc<Context>,
}

pub(crate) static PDS: Live<Pd> = Live::new();
pub(crate) static MRS: Live<Mr> = Live::new();
pub(crate) static CQS: Live<Cq> = Live::new();
pub(crate) static CHANNELS: Live<Channel> = Live::new();
pub(crate) static QPS: Live<Qp> = Live::new();
pub(crate) static SRQS: Live<Srq> = Live::new();
pub(crate) static AHS: Live<Ah> = Live::new();
