//! The CM's events (`rdma_user::cm::CmEvent`) turned into `rdma_cm_event`s
//! on the ids' channels; a connection request becomes a new id.

use std::ffi::{c_int, c_void};
use std::net::{IpAddr, SocketAddr};
use std::ptr;

use rdma_user::cm::*;
use rdma_user::wire::cm::*;

use super::abi::*;
use super::addr::fill_route;
use super::channel::{new_channel, post, Event};
use super::state::{id_state, new_id, trace, Cm, LIVE_IDS};
use crate::ffi::*;

enum Request {
    Conn(Req),
    Sidr(SidrReq),
}

impl Cm {
    fn id_of_conn(&self, dev: usize, comm: u32) -> Option<*mut rdma_cm_id> {
        self.by_conn
            .get(&(dev, comm))
            .map(|&p| p as *mut rdma_cm_id)
    }

    pub(super) fn on_event(&mut self, dev: usize, ev: CmEvent) {
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

    pub(super) fn post_to(&self, id: *mut rdma_cm_id, e: Box<Event>) {
        // SAFETY: a live id of ours.
        post(unsafe { (*id).channel }, e);
    }
}

pub(super) fn zero_conn() -> rdma_conn_param {
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

pub(super) fn conn_event(
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
