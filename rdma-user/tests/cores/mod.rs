//! One side of a socket-free test connection: a data path `Core` with one
//! PD, one MR, one CQ and one RC QP, and raw access to MR memory.

#![allow(dead_code)]

use rdma_user::device::datapath::{Core, Limits};
use rdma_user::memory::Access;
use rdma_user::transport::QpCap;

pub struct Side {
    pub core: Core,
    pub pd: u32,
    pub qpn: u32,
    pub cq: u32,
    pub addr: u64,
    pub lkey: u32,
    pub rkey: u32,
}

/// A core with an MR of `mr_len` bytes (all access), a CQ of `cq_depth`
/// and a QP of `qp_depth` send and receive WRs.
pub fn side(seed: u64, mr_len: usize, cq_depth: usize, qp_depth: u32) -> Side {
    let mut core = Core::new(Limits::default(), seed);
    let pd = core.alloc_pd();
    let (addr, lkey, rkey) = core.reg_mr(pd, mr_len, Access::ALL).unwrap();
    let cq = core.create_cq(cq_depth).unwrap();
    let cap = QpCap {
        max_send_wr: qp_depth,
        max_recv_wr: qp_depth,
    };
    let qpn = core.create_qp(pd, cq, cap).unwrap();
    Side {
        core,
        pd,
        qpn,
        cq,
        addr,
        lkey,
        rkey,
    }
}

pub fn mem(addr: u64, len: usize) -> &'static [u8] {
    // SAFETY: MR mappings live until their Core is dropped, after the test's
    // last look at them.
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }
}

pub fn mem_mut(addr: u64, len: usize) -> &'static mut [u8] {
    // SAFETY: as above; the engine does not run while the test writes.
    unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) }
}

/// Every frame a core sends at `now`, as bytes.
pub fn frames(core: &mut Core, now: u64) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 9000];
    loop {
        let n = core.build_frame(now, &mut buf);
        if n == 0 {
            return out;
        }
        out.push(buf[..n].to_vec());
    }
}

/// Connects `x`'s QP to `y`'s over 10.9.0.0/24 (the sides' `last` bytes
/// make their MACs and addresses), PSNs 1000 * `last`, path MTU 1024, 4
/// READs or atomics outstanding.
pub fn connect(x: &mut Side, y: &Side, last: (u8, u8)) {
    let psns = (1000 * last.0 as u32, 1000 * last.1 as u32);
    connect_with(x, y, last, psns, |_| {});
}

/// [`connect`] with the PSNs `psns` (x's, y's) and `tweak` applied to the
/// connection's attributes.
pub fn connect_with(
    x: &mut Side,
    y: &Side,
    last: (u8, u8),
    psns: (u32, u32),
    tweak: impl FnOnce(&mut rdma_user::device::datapath::Connect),
) {
    use rdma_user::device::datapath::{Connect, Path};
    use std::net::{IpAddr, Ipv4Addr};
    let ip = |b| IpAddr::V4(Ipv4Addr::new(10, 9, 0, b));
    let path = Path {
        local_mac: [2, 0, 0, 0, 0, last.0],
        peer_mac: [2, 0, 0, 0, 0, last.1],
        local_ip: ip(last.0),
        peer_ip: ip(last.1),
        vlan: None,
        traffic_class: 0,
    };
    let mut c = Connect {
        max_rd_atomic: 4,
        ..Connect::new(y.qpn, psns.1, psns.0, 1024)
    };
    tweak(&mut c);
    x.core.connect_qp(x.qpn, path, &c).unwrap();
}
