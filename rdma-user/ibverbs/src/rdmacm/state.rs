//! What the calls share: the id table, the state kept per id, and the CM
//! of each device with the QP attributes an id's state gives.
//!
//! The lowest module but `abi` and `addr`: everything else uses it.

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_void};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use rdma_user::cm::*;
use rdma_user::device::datapath::entropy;
use rdma_user::device::gsi::{Gsi, GsiOut};
use rdma_user::io::hostnet::{iface_addrs, iface_mac};
use rdma_user::verbs;
use rdma_user::wire::cm::*;
use rdma_user::wire::gid_of;
use rdma_user::wire::RoceRepr;

use super::abi::*;
use crate::ffi::*;
use crate::objects::our_context;
use crate::objects::Boxes;
use crate::port::gid_table;
use crate::set_errno;

/// Returns -1 with errno `e` (librdmacm's convention).
pub(super) fn err(e: c_int) -> c_int {
    set_errno(e);
    -1
}

/// RDMA_XDP_CM_TRACE=1: every CM event and refusal on stderr.
pub(super) fn trace() -> bool {
    static T: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *T.get_or_init(|| std::env::var_os("RDMA_XDP_CM_TRACE").is_some_and(|v| v != "0"))
}

/// The ids this library handed out and has not destroyed.
pub(super) static LIVE_IDS: Boxes<rdma_cm_id> = Boxes::new();

pub(super) fn live_id(id: *mut rdma_cm_id) -> bool {
    LIVE_IDS.contains(id)
}

/// What this library keeps of an id beside rdma_cm's struct.
pub(super) struct IdState {
    pub(super) sync: bool,
    /// Bound or resolved local address, and the peer's.
    pub(super) src: Option<SocketAddr>,
    /// The port is this id's (bound by it): a connection a listener
    /// accepted uses the listener's port without holding it.
    pub(super) holds_port: bool,
    pub(super) dst: Option<SocketAddr>,
    pub(super) dev: Option<usize>,
    pub(super) listens: Vec<(usize, u32)>,
    pub(super) conn: Option<(usize, u32)>,
    /// Passive: the REQ (or SIDR_REQ's service) this id answers.
    pub(super) req: Option<Req>,
    pub(super) sidr_service: u64,
    /// Active: the REP received.
    pub(super) rep: Option<Rep>,
    /// Active and without a QP: rdma_establish sends the RTU, no event.
    pub(super) quiet_establish: bool,
    pub(super) my_psn: u32,
    pub(super) responder_resources: u8,
    pub(super) initiator_depth: u8,
    pub(super) retry_count: u8,
    pub(super) rnr_retry_count: u8,
    pub(super) tos: u8,
    pub(super) reuse: bool,
    /// An IPv6 wildcard listener takes IPv6 only.
    pub(super) afonly: bool,
    pub(super) ack_timeout: Option<u8>,
    pub(super) path_rec: Box<ibv_sa_path_rec>,
    /// rdma_create_ep on a passive id: the QP each request gets.
    pub(super) ep_init: Option<(ibv_qp_init_attr, *mut ibv_pd)>,
    pub(super) own_pd: bool,
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

pub(super) fn id_state(sync: bool) -> IdState {
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

pub(super) fn new_id(ps: c_int, qp_type: c_int, context: *mut c_void) -> *mut rdma_cm_id {
    // SAFETY: rdma_cm_id is a C struct of pointers and integers; all-zero
    // is its initial state.
    let mut id: Box<rdma_cm_id> = Box::new(unsafe { std::mem::zeroed() });
    id.ps = ps;
    id.qp_type = qp_type;
    id.context = context;
    id.port_num = 1;
    Box::into_raw(id)
}

/// One device's CM.
pub(super) struct CmDev {
    pub(super) netdev: String,
    /// Our verbs context on it (what `id->verbs` is).
    pub(super) ctx: *mut ibv_context,
    pub(super) dp: verbs::Context,
    pub(super) gsi: Arc<Gsi>,
    pub(super) agent: CmAgent,
    /// Headers to each peer CM: learnt from its MADs or resolved.
    pub(super) routes: HashMap<IpAddr, RoceRepr>,
    /// MADs for a peer with no headers yet (counted, then retried).
    pub(super) no_route: u64,
    /// MADs the full QP1 queue refused, offered again first.
    pub(super) backlog: VecDeque<GsiOut>,
}

pub(super) struct Cm {
    pub(super) devs: Vec<CmDev>,
    pub(super) ids: HashMap<usize, IdState>,
    pub(super) by_conn: HashMap<(usize, u32), usize>,
    pub(super) by_listener: HashMap<(usize, u32), usize>,
    pub(super) clock: Instant,
    /// Wakes the CM thread (a new device, a new deadline).
    pub(super) wake_fd: c_int,
}

// SAFETY: the raw pointers in Cm (contexts, PDs) are this library's
// objects, used only under the CM lock.
unsafe impl Send for Cm {}

impl Cm {
    pub(super) fn now(&self) -> Nanos {
        self.clock.elapsed().as_nanos() as Nanos
    }

    pub(super) fn wake(&self) {
        let one = 1u64;
        // SAFETY: 8 bytes from a local to our eventfd.
        let _ = unsafe { libc::write(self.wake_fd, &one as *const u64 as *const c_void, 8) };
    }

    /// The CM of `netdev`, opened on first use.
    pub(super) fn dev(&mut self, netdev: &str) -> Result<usize, c_int> {
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

    /// The address vector of an id's peer (for its QP or a UD AH).
    pub(super) fn ah_attr(&self, id: *mut rdma_cm_id) -> Result<ibv_ah_attr, c_int> {
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
    pub(super) fn qp_attr(
        &self,
        id: *mut rdma_cm_id,
        state: u32,
    ) -> Result<(ibv_qp_attr, c_int), c_int> {
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

    pub(super) fn modify(&self, id: *mut rdma_cm_id, state: u32) -> Result<(), c_int> {
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
    pub(super) fn detach(&mut self, id: *mut rdma_cm_id) {
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

pub(super) fn mtu_code(bytes: u32) -> u32 {
    match bytes {
        4096.. => 5,
        2048.. => 4,
        1024.. => 3,
        512.. => 2,
        _ => 1,
    }
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
pub(super) fn devices_with_addrs() -> Vec<(String, Vec<IpAddr>)> {
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

pub(super) fn netdev_for_ip(ip: IpAddr) -> Option<String> {
    devices_with_addrs()
        .into_iter()
        .find(|(_, a)| a.contains(&ip))
        .map(|(n, _)| n)
}
