//! Connections: `rdma_listen`, `rdma_connect`, `rdma_accept`,
//! `rdma_reject`, `rdma_establish`, `rdma_disconnect`, `rdma_notify`.

use std::ffi::{c_int, c_void};
use std::net::{IpAddr, SocketAddr};

use rdma_user::cm::*;
use rdma_user::device::datapath::entropy;
use rdma_user::wire::cm::*;

use super::abi::*;
use super::resolve::bind;
use super::service::{id_call, sync_call};
use super::state::{devices_with_addrs, mtu_code, trace, Cm};
use super::translate::zero_conn;
use crate::ffi::*;
use crate::objects::our_context;

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
