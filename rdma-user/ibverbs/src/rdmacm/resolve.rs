//! Binding, and address and route resolution: `rdma_bind_addr`,
//! `rdma_resolve_addr`, `rdma_resolve_route`.

use std::ffi::{c_int, c_void};
use std::net::{IpAddr, SocketAddr};

use rdma_user::cm::*;
use rdma_user::device::datapath::{entropy, Path};
use rdma_user::io::hostnet::{iface_mac, resolve_mac};
use rdma_user::wire::cm::*;
use rdma_user::wire::gid_of;

use super::abi::*;
use super::addr::*;
use super::service::{id_call, sync_call, wait_sync, with_cm};
use super::state::{err, live_id, netdev_for_ip, Cm};
use super::translate::conn_event;
use crate::ffi::*;
use crate::guard;

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

pub(super) fn bind(cm: &mut Cm, id: *mut rdma_cm_id, a: SocketAddr) -> Result<(), c_int> {
    let st = cm.ids.get(&(id as usize)).ok_or(libc::EINVAL)?;
    if st.src.is_some() {
        return Err(libc::EINVAL);
    }
    let reuse = st.reuse;
    // SAFETY: a live id of ours.
    let ps = unsafe { (*id).ps };
    // Loopback as the wildcard: no device, `id->verbs` stays NULL (a
    // program that binds 127.0.0.1, as libfabric's passive probe does,
    // learns the devices' addresses elsewhere).
    let dev = if a.ip().is_unspecified() || a.ip().is_loopback() {
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
                        traffic_class: 0,
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
