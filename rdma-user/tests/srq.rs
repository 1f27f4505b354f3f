//! Shared receive queues on the data path, socket-free: two `Core`s with
//! two RC QP pairs, B's two QPs on one SRQ; frames are handed over in
//! memory, one at a time where the order matters.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use rdma_user::device::datapath::{Connect, Core, Limits, Path};
use rdma_user::device::rings::{AsyncEvent, AsyncShared, SrqShared};
use rdma_user::device::standalone::NO_WC;
use rdma_user::memory::Access;
use rdma_user::transport::{QpCap, RecvWr, SendWr, Sge, Wc, WcStatus, WrOpcode};

const MR_LEN: usize = 1 << 16;

struct Host {
    core: Core,
    qps: [u32; 2],
    cq: u32,
    addr: u64,
    lkey: u32,
    ip: u8,
}

fn host(seed: u64, ip: u8) -> Host {
    let mut core = Core::new(Limits::default(), seed);
    let pd = core.alloc_pd();
    let (addr, lkey, _) = core.reg_mr(pd, MR_LEN, Access::ALL).unwrap();
    let cq = core.create_cq(64).unwrap();
    let cap = QpCap {
        max_send_wr: 8,
        max_recv_wr: 8,
    };
    let qps = [
        core.create_qp(pd, cq, cap).unwrap(),
        core.create_qp(pd, cq, cap).unwrap(),
    ];
    Host {
        core,
        qps,
        cq,
        addr,
        lkey,
        ip,
    }
}

fn connect(x: &mut Host, y: &Host) {
    let ip = |b| IpAddr::V4(Ipv4Addr::new(10, 9, 0, b));
    for k in 0..2 {
        let path = Path {
            local_mac: [2, 0, 0, 0, 0, x.ip],
            peer_mac: [2, 0, 0, 0, 0, y.ip],
            local_ip: ip(x.ip),
            peer_ip: ip(y.ip),
            vlan: None,
            traffic_class: 0,
        };
        // rnr_retry 7 (infinite), min RNR timer 12 (0.64 ms).
        let c = Connect::new(y.qps[k], 5000 + k as u32, 7000 + k as u32, 1024);
        let c = Connect {
            local_psn: if x.ip == 1 { 5000 } else { 7000 } + k as u32,
            remote_psn: if x.ip == 1 { 7000 } else { 5000 } + k as u32,
            ..c
        };
        x.core.connect_qp(x.qps[k], path, &c).unwrap();
    }
}

/// A's QP k SENDs `len` bytes.
fn send(a: &mut Host, k: usize, id: u64, len: u32) {
    let sge = [Sge {
        addr: a.addr,
        length: len,
        lkey: a.lkey,
    }];
    let mut wr = SendWr::new(id, WrOpcode::Send, &sge);
    wr.flags.signaled = true;
    a.core.post_send(a.qps[k], &wr).unwrap();
}

fn post_srq(srq: &SrqShared, b: &Host, id: u64, slot: u64) {
    let sge = [Sge {
        addr: b.addr + slot * 8192,
        length: 8192,
        lkey: b.lkey,
    }];
    srq.post(&RecvWr {
        wr_id: id,
        sg_list: &sge,
    })
    .unwrap();
}

/// All frames `src` has to send now, in order.
fn frames(src: &mut Host, now: u64) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 9000];
    loop {
        let n = src.core.build_frame(now, &mut buf);
        if n == 0 {
            return out;
        }
        out.push(buf[..n].to_vec());
    }
}

/// Hands every frame each way until both are quiet, timers included.
fn settle(a: &mut Host, b: &mut Host, now: &mut u64) {
    for _ in 0..64 {
        *now += 10_000;
        a.core.handle_timers(*now);
        b.core.handle_timers(*now);
        let (fa, fb) = (frames(a, *now), frames(b, *now));
        if fa.is_empty() && fb.is_empty() {
            return;
        }
        for f in &fa {
            b.core.handle_frame(*now, f);
        }
        for f in &fb {
            a.core.handle_frame(*now, f);
        }
    }
}

fn wcs(h: &mut Host) -> Vec<Wc> {
    let mut w = [NO_WC; 64];
    let n = h.core.cq_mut(h.cq).unwrap().poll(&mut w);
    w[..n].to_vec()
}

fn setup() -> (Host, Host, Arc<SrqShared>, Arc<AsyncShared>) {
    let mut a = host(1, 1);
    let mut b = host(2, 2);
    connect(&mut a, &b);
    connect(&mut b, &a);
    let srq = Arc::new(SrqShared::new(4, 0x5a));
    for q in b.qps {
        b.core.attach_srq(q, srq.clone()).unwrap();
    }
    let events = Arc::new(AsyncShared::new().unwrap());
    b.core.async_events = Some(events.clone());
    (a, b, srq, events)
}

#[test]
fn an_empty_srq_rnr_naks_and_a_later_post_completes() {
    let (mut a, mut b, srq, _) = setup();
    let mut now = 0;
    send(&mut a, 0, 1, 100);
    settle(&mut a, &mut b, &mut now);
    assert!(wcs(&mut a).is_empty(), "no receive WR: nothing completes");
    let q = b.core.qp(b.qps[0]).unwrap().stats();
    assert!(q.rnr_naks_sent >= 1, "{q:?}");
    post_srq(&srq, &b, 77, 0);
    // The requester retries after the RNR timer (0.64 ms here).
    for _ in 0..4 {
        now += 1_000_000;
        settle(&mut a, &mut b, &mut now);
    }
    let got = wcs(&mut b);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (got[0].wr_id, got[0].qp_num, got[0].status),
        (77, b.qps[0], WcStatus::Success)
    );
    assert_eq!(got[0].byte_len, 100);
    let sent = wcs(&mut a);
    assert!(
        sent.iter()
            .any(|w| w.wr_id == 1 && w.status == WcStatus::Success),
        "{sent:?}"
    );
    assert!(srq.is_empty());
}

#[test]
fn a_message_in_progress_on_one_qp_does_not_block_the_other() {
    let (mut a, mut b, srq, _) = setup();
    post_srq(&srq, &b, 10, 0);
    post_srq(&srq, &b, 11, 1);
    let mut now = 1_000;
    // QP 0 starts a 3-packet SEND: only its first packet arrives yet.
    send(&mut a, 0, 1, 3000);
    let f0 = frames(&mut a, now);
    assert_eq!(f0.len(), 3);
    b.core.handle_frame(now, &f0[0]);
    assert_eq!(srq.len(), 1, "QP 0 took one WR for its message");
    // QP 1's whole SEND arrives and completes with the other WR.
    send(&mut a, 1, 2, 200);
    for f in frames(&mut a, now) {
        b.core.handle_frame(now, &f);
    }
    let got = wcs(&mut b);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((got[0].wr_id, got[0].qp_num), (11, b.qps[1]));
    // QP 0's message completes when the rest arrives.
    now += 1_000;
    for f in &f0[1..] {
        b.core.handle_frame(now, f);
    }
    let got = wcs(&mut b);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (got[0].wr_id, got[0].qp_num, got[0].byte_len),
        (10, b.qps[0], 3000)
    );
    settle(&mut a, &mut b, &mut now);
    assert_eq!(wcs(&mut a).len(), 2);
}

#[test]
fn the_limit_event_fires_once_below_the_limit() {
    let (mut a, mut b, srq, events) = setup();
    for k in 0..3 {
        post_srq(&srq, &b, 20 + k, k);
    }
    srq.set_limit(2);
    let mut now = 0;
    send(&mut a, 0, 1, 64);
    settle(&mut a, &mut b, &mut now);
    assert_eq!(srq.len(), 2);
    assert_eq!(events.pop(), None, "2 left: not below the limit yet");
    send(&mut a, 1, 2, 64);
    settle(&mut a, &mut b, &mut now);
    assert_eq!(events.pop(), Some(AsyncEvent::SrqLimit(0x5a)));
    assert_eq!(srq.limit(), 0, "the limit disarms itself");
    send(&mut a, 0, 3, 64);
    settle(&mut a, &mut b, &mut now);
    assert_eq!(events.pop(), None, "once only");
    assert_eq!(wcs(&mut b).len(), 3);
}

#[test]
fn an_srq_refuses_beyond_its_depth() {
    let srq = SrqShared::new(2, 0);
    let sge = [Sge::default()];
    let w = RecvWr {
        wr_id: 1,
        sg_list: &sge,
    };
    assert!(srq.post(&w).is_ok() && srq.post(&w).is_ok());
    assert!(srq.post(&w).is_err());
}
