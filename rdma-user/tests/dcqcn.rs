//! ECN and DCQCN on the data path, socket-free: two `Core`s with one RC QP
//! each, frames handed over in memory. A CE mark makes the receiver send a
//! CNP of the Annex A17.9.3 format (spaced by np_min_time_between_cnps);
//! the sender's rate drops and its packets are paced; CNPs touch no PSN or
//! ACK state; data packets go out ECT(0) unless ECN is off.

mod cores;

use std::net::{IpAddr, Ipv4Addr};

use rdma_user::device::datapath::{Connect, Core, Path};
use rdma_user::device::standalone::NO_WC;
use rdma_user::transport::{QpCap, QpStats, SendWr, Sge, WcStatus, WrOpcode};
use rdma_user::wire::{opcode, udp_sport_for_qps, IpRepr, RoceRepr, TransportRepr};

const MR_LEN: usize = 1 << 20;

struct Host {
    core: Core,
    qp: u32,
    cq: u32,
    addr: u64,
    lkey: u32,
    rkey: u32,
    last: u8,
}

fn host(seed: u64, last: u8, ecn: bool) -> Host {
    let mut s = cores::side(seed, MR_LEN, 256, 64);
    s.core.cc.ecn = ecn;
    Host {
        core: s.core,
        qp: s.qpn,
        cq: s.cq,
        addr: s.addr,
        lkey: s.lkey,
        rkey: s.rkey,
        last,
    }
}

fn connect(x: &mut Host, y: &Host) {
    let ip = |b| IpAddr::V4(Ipv4Addr::new(10, 9, 0, b));
    let path = Path {
        local_mac: [2, 0, 0, 0, 0, x.last],
        peer_mac: [2, 0, 0, 0, 0, y.last],
        local_ip: ip(x.last),
        peer_ip: ip(y.last),
        vlan: None,
        traffic_class: 0,
    };
    let psn = |h: &Host| 1000 * h.last as u32;
    x.core
        .connect_qp(x.qp, path, &Connect::new(y.qp, psn(y), psn(x), 1024))
        .unwrap();
}

fn pair(ecn: bool) -> (Host, Host) {
    let mut a = host(1, 1, ecn);
    let mut b = host(2, 2, ecn);
    connect(&mut a, &b);
    connect(&mut b, &a);
    (a, b)
}

fn frames(h: &mut Host, now: u64) -> Vec<Vec<u8>> {
    cores::frames(&mut h.core, now)
}

fn write(a: &mut Host, b: &Host, id: u64, len: u32) {
    let sge = [Sge {
        addr: a.addr,
        length: len,
        lkey: a.lkey,
    }];
    let mut wr = SendWr::new(id, WrOpcode::RdmaWrite, &sge);
    wr.remote_addr = b.addr;
    wr.rkey = b.rkey;
    a.core.post_send(a.qp, &wr).unwrap();
}

/// Marks a frame CE, as a congested switch does (the ICRC masks the TOS;
/// the IPv4 checksum is redone).
fn mark_ce(f: &[u8]) -> Vec<u8> {
    let (mut r, l) = RoceRepr::parse(f).unwrap();
    assert!(matches!(r.ip, IpRepr::V4(_)));
    r.ip.set_traffic_class(r.ip.traffic_class() | 3);
    let mut out = vec![0u8; f.len()];
    let n = r.emit(&f[l.payload.clone()], &mut out).unwrap();
    out.truncate(n);
    assert!(RoceRepr::parse(&out).is_ok());
    out
}

fn ecn_of(f: &[u8]) -> u8 {
    RoceRepr::parse(f).unwrap().0.ip.traffic_class()
}

#[test]
fn a_ce_mark_brings_a_cnp_of_the_annex_format_and_the_sender_slows_down() {
    let (mut a, mut b) = pair(true);
    write(&mut a, &b, 1, 512);
    let f = frames(&mut a, 1_000);
    assert_eq!(f.len(), 1);
    assert!(!a.core.tx_paced(), "at line rate nothing is paced");
    assert_eq!(ecn_of(&f[0]) & 3, 0b10, "data goes out ECT(0)");
    b.core.handle_frame(1_000, &mark_ce(&f[0]));
    let out = frames(&mut b, 1_000);
    // The CNP first, then the ACK of the WRITE (unchanged by it).
    assert_eq!(out.len(), 2, "a CNP and the ACK");
    let (cnp, l) = RoceRepr::parse(&out[0]).unwrap();
    let t = cnp.transport;
    assert_eq!(t.bth.opcode, opcode::CNP);
    assert_eq!(t.bth.resv8a, 0x40, "BECN");
    assert_eq!((t.bth.pkey, t.bth.psn, t.bth.dest_qpn), (0xffff, 0, a.qp));
    assert_eq!(t.cnp_reserved, Some([0; 16]));
    assert!(l.payload.is_empty());
    assert_eq!(
        cnp.udp.src_port,
        udp_sport_for_qps(b.qp, a.qp),
        "the flow's port"
    );
    assert_eq!(ecn_of(&out[0]), 48 << 2, "DSCP 48, Not-ECT");
    let ack = RoceRepr::parse(&out[1]).unwrap().0.transport;
    assert_eq!(ack.bth.opcode, opcode::RC_ACKNOWLEDGE);
    let s = b.core.qp(b.qp).unwrap().stats();
    assert_eq!((s.np_ecn_marked_roce_packets, s.np_cnp_sent), (1, 1));

    // A second mark within 50 µs: counted, no CNP.
    write(&mut a, &b, 2, 512);
    let f2 = frames(&mut a, 2_000);
    b.core.handle_frame(20_000, &mark_ce(&f2[0]));
    let out2 = frames(&mut b, 20_000);
    assert!(out2
        .iter()
        .all(|f| RoceRepr::parse(f).unwrap().0.transport.bth.opcode != opcode::CNP));
    assert_eq!(b.core.qp(b.qp).unwrap().stats().np_cnp_sent, 1);

    // The CNP reaches A: the rate halves (α starts at 1), no PSN moves.
    let psn = a.core.qp(a.qp).unwrap().sq_psn();
    a.core.handle_frame(21_000, &out[0]);
    for f in out[1..].iter().chain(&out2) {
        a.core.handle_frame(21_000, f);
    }
    let q = a.core.qp(a.qp).unwrap();
    assert_eq!(q.stats().rp_cnp_handled, 1);
    assert_eq!(q.sq_psn(), psn);
    let line = q.cc().p.line_rate;
    assert!((q.cc().rc - line / 2.0).abs() < 1e-6, "{}", q.cc().rc);
    let mut w = [NO_WC; 8];
    let n = a.core.cq_mut(a.cq).unwrap().poll(&mut w);
    assert!(w[..n].iter().all(|w| w.status == WcStatus::Success) && n == 2);

    // Paced: at 5 Gbit/s a 1 KiB packet takes about 1.7 µs. Idle since
    // time 0, the QP may catch up on the 30 µs since (pacing's slack is
    // 200 µs): about 17 packets of a 48-packet WRITE leave at once, then
    // one per 1.7 µs, and the data path is told when the next may go.
    write(&mut a, &b, 3, 48 * 1024);
    let now = 30_000;
    // The data path learns that what is left waits for pacing, not for
    // a full ring: it may sleep until the deadline instead of spinning.
    let burst = frames(&mut a, now).len();
    assert!((15..=19).contains(&burst), "{burst}");
    assert!(a.core.tx_paced());
    let next = a.core.handle_timers(now).expect("a pacing deadline");
    assert!(next > now && next < now + 5_000, "{}", next - now);
    assert!(frames(&mut a, next - 1).is_empty());
    assert_eq!(frames(&mut a, next).len(), 1);
    assert!(a.core.tx_paced());
}

/// A CNP of `opc` from host `from_last` to QP `qpn` at host `to_last`.
fn cnp_frame(opc: u8, from_last: u8, to_last: u8, qpn: u32) -> Vec<u8> {
    let ip = |b| IpAddr::V4(Ipv4Addr::new(10, 9, 0, b));
    let path = Path {
        local_mac: [2, 0, 0, 0, 0, from_last],
        peer_mac: [2, 0, 0, 0, 0, to_last],
        local_ip: ip(from_last),
        peer_ip: ip(to_last),
        vlan: None,
        traffic_class: 0,
    };
    let mut r = path.template(0, qpn).unwrap();
    r.transport = TransportRepr::default();
    r.transport.bth.opcode = opc;
    r.transport.bth.pkey = 0xffff;
    r.transport.bth.dest_qpn = qpn;
    let mut buf = vec![0u8; 256];
    let n = r.emit(&[], &mut buf).unwrap();
    buf.truncate(n);
    buf
}

#[test]
fn the_legacy_cnp_opcode_is_accepted_and_the_reaction_point_can_be_off() {
    let (mut a, b) = pair(false);
    write(&mut a, &b, 1, 8);
    let f = frames(&mut a, 0);
    assert_eq!(ecn_of(&f[0]) & 3, 0, "ECN off: Not-ECT");
    // 0x80, without the 16 reserved bytes.
    a.core
        .handle_frame(10, &cnp_frame(opcode::CNP_LEGACY, 2, 1, a.qp));
    let q = a.core.qp(a.qp).unwrap();
    assert_eq!(q.stats().rp_cnp_handled, 1);
    assert!(q.cc().limiting());

    // With the reaction point off, CNPs are counted as ignored.
    let mut x = host(5, 1, true);
    x.core.cc.params.enabled = false;
    x.qp = x.core.create_qp(1, x.cq, QpCap::default()).unwrap();
    let mut y = host(6, 2, true);
    connect(&mut x, &y);
    connect(&mut y, &x);
    x.core.handle_frame(10, &cnp_frame(opcode::CNP, 2, 1, x.qp));
    let q = x.core.qp(x.qp).unwrap();
    let s = q.stats();
    assert_eq!((s.rp_cnp_handled, s.rp_cnp_ignored), (0, 1));
    assert!(!q.cc().limiting());
}

/// `rdma-xdp top` shows RTT percentiles: one sample per round trip, never
/// across a resend (Karn's rule).
#[test]
fn round_trip_times_are_sampled_and_never_across_a_resend() {
    let (mut a, mut b) = pair(true);
    write(&mut a, &b, 1, 512);
    let f = frames(&mut a, 1_000);
    b.core.handle_frame(5_000, &f[0]);
    for x in frames(&mut b, 5_000) {
        a.core.handle_frame(11_000, &x);
    }
    let s = a.core.qp(a.qp).unwrap().stats();
    // 10 µs: the bucket [8, 16) µs.
    assert_eq!(s.rtt_log2_us.iter().sum::<u64>(), 1);
    assert_eq!(s.rtt_log2_us[4], 1);
    assert_eq!(
        (s.rtt_quantile_us(0.5), s.rtt_quantile_us(0.99)),
        (Some(16), Some(16))
    );

    // A WRITE whose first transmission is lost is resent after the ACK
    // timeout; the ACK of the resend is no sample.
    write(&mut a, &b, 2, 512);
    assert_eq!(frames(&mut a, 20_000).len(), 1);
    let late = 20_000_000_000;
    a.core.handle_timers(late);
    let resent = frames(&mut a, late);
    assert_eq!(resent.len(), 1, "the resend");
    assert_eq!(a.core.qp(a.qp).unwrap().stats().retransmits, 1);
    b.core.handle_frame(late, &resent[0]);
    for x in frames(&mut b, late) {
        a.core.handle_frame(late + 10_000, &x);
    }
    let mut w = [NO_WC; 4];
    let n = a.core.cq_mut(a.cq).unwrap().poll(&mut w);
    assert!(n == 2 && w[..n].iter().all(|w| w.status == WcStatus::Success));
    let s = a.core.qp(a.qp).unwrap().stats();
    assert_eq!(
        s.rtt_log2_us.iter().sum::<u64>(),
        1,
        "no sample across the resend"
    );
    assert_eq!(QpStats::default().rtt_quantile_us(0.5), None);
}

#[test]
fn a_window_limited_sender_is_first_cut_from_the_rate_it_sent() {
    let (mut a, mut b) = pair(true);
    // A window of four 64 KiB WRITEs leaves at once (64 frames each at
    // MTU 1024), then waits behind a queue.
    for id in 1..=4 {
        write(&mut a, &b, id, 65536);
    }
    let f = frames(&mut a, 1_000);
    assert_eq!(f.len(), 256);
    // As the engine counts them (its own headers, as the wire sees them).
    let window_bytes = a.core.qp(a.qp).unwrap().stats().tx_bytes;
    // The first WRITE reaches B; its ACK is back 5 ms later, and the
    // freed slot sends a fifth WRITE while three are still in flight.
    for x in &f[..64] {
        b.core.handle_frame(1_000, x);
    }
    for x in frames(&mut b, 1_000) {
        a.core.handle_frame(5_001_000, &x);
    }
    write(&mut a, &b, 5, 65536);
    assert_eq!(frames(&mut a, 5_001_000).len(), 64);
    // A CNP: the first cut starts from the window per 5 ms the QP sent
    // (~450 Mbit/s), not from the 10 Gbit/s line rate it never reached
    // (the paper's cut, to 5 Gbit/s, would not slow it down at all).
    a.core
        .handle_frame(5_100_000, &cnp_frame(opcode::CNP, 2, 1, a.qp));
    let cc = *a.core.qp(a.qp).unwrap().cc();
    let sent = window_bytes as f64 * 8000.0 / 5_000_000.0;
    assert!(
        (cc.rt - sent).abs() < 0.01 * sent,
        "rt {} sent {sent}",
        cc.rt
    );
    assert!((cc.rc - cc.rt / 2.0).abs() < 1e-6, "rc {}", cc.rc);
    assert_eq!(a.core.qp(a.qp).unwrap().stats().rp_cnp_handled, 1);
}
