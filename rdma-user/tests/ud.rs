//! UD queue pairs on the data path, socket-free: `Core`s with UD QPs and
//! address handles, frames handed over in memory. What a datagram carries
//! (DETH, Q_Key rules, the GRH in the receive buffer, the completion's
//! fields), what is dropped and counted, and that our UD SEND is rxe's,
//! byte for byte, given the same fields.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use rdma_user::device::datapath::{Core, Limits, Path};
use rdma_user::device::rings::SrqShared;
use rdma_user::device::standalone::NO_WC;
use rdma_user::memory::Access;
use rdma_user::transport::{
    NetworkType, QpAttr, QpCap, QpState, QpType, RecvWr, SendWr, Sge, UdDest, Wc, WcStatus,
    WrOpcode, GRH_LEN,
};
use rdma_user::wire::pcap::read_pcap;
use rdma_user::wire::{opcode, udp_sport_for_ud, IpRepr, RoceRepr};

const MR_LEN: usize = 1 << 16;
const QKEY: u32 = 0x1111_1111;

struct Host {
    core: Core,
    qp: u32,
    cq: u32,
    addr: u64,
    lkey: u32,
    ip: Ipv4Addr,
    mac: [u8; 6],
}

/// A host whose UD QP is the `skip + 1`-th QP created (QPNs start at 0x11).
fn host(seed: u64, last: u8, skip: usize) -> Host {
    let mut core = Core::new(Limits::default(), seed);
    let pd = core.alloc_pd();
    let (addr, lkey, _) = core.reg_mr(pd, MR_LEN, Access::ALL).unwrap();
    let cq = core.create_cq(256).unwrap();
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
    };
    for _ in 0..skip {
        core.create_qp(pd, cq, cap).unwrap();
    }
    let qp = core
        .create_qp_typed(pd, cq, cq, cap, QpType::Ud, 1024)
        .unwrap();
    Host {
        core,
        qp,
        cq,
        addr,
        lkey,
        ip: Ipv4Addr::new(10, 99, 0, last),
        mac: [0x52, 0x54, 0, 0x99, 0, last],
    }
}

/// RESET -> INIT (Q_Key) -> RTR -> RTS (SQ PSN), as ibv_ud_pingpong does.
fn bring_up(h: &mut Host, sq_psn: u32) {
    for a in QpAttr::ud_bring_up(QKEY, sq_psn) {
        h.core.modify_qp(h.qp, &a).unwrap();
    }
}

fn ah_to(x: &mut Host, y: &Host) -> u32 {
    let path = Path {
        local_mac: x.mac,
        peer_mac: y.mac,
        local_ip: IpAddr::V4(x.ip),
        peer_ip: IpAddr::V4(y.ip),
        vlan: None,
        traffic_class: 0,
    };
    x.core.create_ah(path).unwrap()
}

fn write(h: &mut Host, off: usize, data: &[u8]) {
    h.core.mem.by_lkey_mut(h.lkey).unwrap().write(off, data);
}

fn read(h: &Host, off: usize, len: usize) -> Vec<u8> {
    h.core.mem.by_lkey(h.lkey).unwrap().read_vec(off, len)
}

fn send(h: &mut Host, id: u64, ah: u32, remote_qpn: u32, qkey: u32, len: u32, imm: Option<u32>) {
    let sge = [Sge {
        addr: h.addr,
        length: len,
        lkey: h.lkey,
    }];
    let op = if imm.is_some() {
        WrOpcode::SendWithImm
    } else {
        WrOpcode::Send
    };
    let mut wr = SendWr::new(id, op, &sge);
    wr.imm = imm.unwrap_or(0);
    wr.ud = Some(UdDest {
        ah,
        remote_qpn,
        remote_qkey: qkey,
    });
    h.core.post_send(h.qp, &wr).unwrap();
}

/// A receive WR of `len` bytes at offset `off` of the host's MR.
fn recv(h: &mut Host, id: u64, off: u64, len: u32) {
    let sge = [Sge {
        addr: h.addr + off,
        length: len,
        lkey: h.lkey,
    }];
    h.core
        .post_recv(
            h.qp,
            &RecvWr {
                wr_id: id,
                sg_list: &sge,
            },
        )
        .unwrap();
}

fn frames(h: &mut Host) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 9000];
    loop {
        let n = h.core.build_frame(0, &mut buf);
        if n == 0 {
            return out;
        }
        out.push(buf[..n].to_vec());
    }
}

fn wcs(h: &mut Host) -> Vec<Wc> {
    let mut w = [NO_WC; 64];
    let n = h.core.cq_mut(h.cq).unwrap().poll(&mut w);
    w[..n].to_vec()
}

fn pair() -> (Host, Host, u32, u32) {
    let mut a = host(1, 3, 0);
    let mut b = host(2, 2, 1);
    bring_up(&mut a, 100);
    bring_up(&mut b, 200);
    let ab = ah_to(&mut a, &b);
    let ba = ah_to(&mut b, &a);
    (a, b, ab, ba)
}

#[test]
fn our_ud_send_is_rxes_byte_for_byte() {
    // send_lat_UD_64B.pcap, frame 1: QPN 0x1a at 10.99.0.3 sends 64 B to
    // QPN 0x22 at 10.99.0.2, PSN 0x8792c4, Q_Key 0x11111111.
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/send_lat_UD_64B.pcap");
    let cap = read_pcap(&path).unwrap();
    let theirs = cap
        .iter()
        .map(|f| f.data.clone())
        .find(|f| RoceRepr::parse(f).is_ok())
        .unwrap();
    let (r, l) = RoceRepr::parse(&theirs).unwrap();
    assert_eq!(r.transport.bth.opcode, opcode::UD_SEND_ONLY);

    // QPNs 0x11..=0x19 first, so that the UD QP is 0x1a.
    let mut a = host(7, 3, 9);
    assert_eq!(a.qp, 0x1a);
    let b = host(8, 2, 0);
    bring_up(&mut a, 0x8792c4);
    // rxe sends Not-ECT; so do we, for the comparison.
    a.core.cc.ecn = false;
    let ah = ah_to(&mut a, &b);
    let payload = theirs[l.payload.clone()].to_vec();
    write(&mut a, 0, &payload);
    send(&mut a, 1, ah, 0x22, QKEY, payload.len() as u32, None);
    let ours = frames(&mut a);
    assert_eq!(ours.len(), 1);
    let (mut o, _) = RoceRepr::parse(&ours[0]).unwrap();
    assert_eq!(o.udp.src_port, udp_sport_for_ud(0x1a));
    assert_eq!(o.udp.src_port, 64407, "rxe's source port for QPN 0x1a");
    // The one field the kernel picks at random: the IPv4 ID. Everything
    // else, ICRC included, is the same once it is the same.
    let (IpRepr::V4(ip), IpRepr::V4(their_ip)) = (&mut o.ip, &r.ip) else {
        panic!("IPv4 expected");
    };
    ip.id = their_ip.id;
    let mut again = vec![0u8; ours[0].len()];
    let n = o.emit(&payload, &mut again).unwrap();
    assert_eq!(&again[..n], &theirs[..l.end], "UD SEND differs from rxe's");
    // And without re-emitting: only the ID, the IP checksum and the ICRC
    // may differ from the capture.
    let mut diff: Vec<usize> = (0..ours[0].len())
        .filter(|&i| ours[0][i] != theirs[i])
        .collect();
    diff.retain(|&i| !(18..20).contains(&i) && !(24..26).contains(&i) && i < l.end - 4);
    assert!(diff.is_empty(), "bytes {diff:?} differ");
    let w = wcs(&mut a);
    assert_eq!((w[0].wr_id, w[0].status), (1, WcStatus::Success));
}

#[test]
fn a_datagram_lands_after_its_grh_and_completes_with_the_source() {
    let (mut a, mut b, ab, _) = pair();
    write(&mut a, 0, b"hello over UD");
    recv(&mut b, 9, 0, 4096);
    send(&mut a, 1, ab, b.qp, QKEY, 13, Some(0xfeed));
    for f in frames(&mut a) {
        b.core.handle_frame(0, &f);
    }
    let w = wcs(&mut b);
    assert_eq!(w.len(), 1);
    let w = w[0];
    assert_eq!(
        (w.wr_id, w.status, w.byte_len, w.imm, w.src_qp, w.grh),
        (
            9,
            WcStatus::Success,
            40 + 13,
            Some(0xfeed),
            a.qp,
            Some(NetworkType::Ipv4)
        )
    );
    // The GRH: 20 zero bytes, then the IPv4 header as it arrived.
    let grh = read(&b, 0, GRH_LEN);
    assert_eq!(&grh[..20], &[0u8; 20]);
    assert_eq!(grh[20], 0x45);
    assert_eq!(&grh[32..36], &a.ip.octets());
    assert_eq!(&grh[36..40], &b.ip.octets());
    assert_eq!(read(&b, GRH_LEN, 13), b"hello over UD");
    let s = wcs(&mut a);
    assert_eq!(
        (s[0].wr_id, s[0].status, s[0].byte_len),
        (1, WcStatus::Success, 13)
    );
}

#[test]
fn a_qkey_with_the_high_bit_means_the_qps_own() {
    let (mut a, mut b, ab, _) = pair();
    recv(&mut b, 1, 0, 4096);
    send(&mut a, 1, ab, b.qp, 0x8000_0000, 8, None);
    let f = frames(&mut a);
    let (r, _) = RoceRepr::parse(&f[0]).unwrap();
    assert_eq!(r.transport.deth.unwrap().qkey, QKEY);
    assert_eq!(r.transport.deth.unwrap().src_qpn, a.qp);
    assert_eq!(r.transport.bth.psn, 100);
    b.core.handle_frame(0, &f[0]);
    assert_eq!(wcs(&mut b)[0].status, WcStatus::Success);
}

#[test]
fn wrong_qkeys_unknown_qps_and_missing_receives_are_dropped_and_counted() {
    let (mut a, mut b, ab, _) = pair();
    recv(&mut b, 1, 0, 4096);
    send(&mut a, 1, ab, b.qp, 0x2222, 8, None); // wrong Q_Key
    send(&mut a, 2, ab, 0x77_7777, QKEY, 8, None); // no such QP
    for f in frames(&mut a) {
        b.core.handle_frame(0, &f);
    }
    assert!(wcs(&mut b).is_empty());
    let s = b.core.qp(b.qp).unwrap().stats();
    assert_eq!(s.bad_qkey, 1);
    assert_eq!(b.core.stats.rx_unknown_qpn, 1);
    // The receive WR is still there for a good datagram; then none is.
    send(&mut a, 3, ab, b.qp, QKEY, 8, None);
    send(&mut a, 4, ab, b.qp, QKEY, 8, None);
    for f in frames(&mut a) {
        b.core.handle_frame(0, &f);
    }
    let w = wcs(&mut b);
    assert_eq!(w.len(), 1);
    assert_eq!(b.core.qp(b.qp).unwrap().stats().no_recv_wqe, 1);
    // UD retransmits nothing: the sender completed all four, sends no more.
    let ids: Vec<u64> = wcs(&mut a).iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [1, 2, 3, 4]);
    assert!(frames(&mut a).is_empty());
    assert_eq!(a.core.handle_timers(1 << 40), None, "no timers on UD");
}

#[test]
fn a_datagram_larger_than_the_receive_buffer_is_a_local_length_error() {
    let (mut a, mut b, ab, _) = pair();
    write(&mut b, 0, &[0xaa; 256]);
    // 40 + 100 bytes do not fit 100.
    recv(&mut b, 5, 0, 100);
    send(&mut a, 1, ab, b.qp, QKEY, 100, None);
    for f in frames(&mut a) {
        b.core.handle_frame(0, &f);
    }
    let w = wcs(&mut b);
    assert_eq!((w[0].wr_id, w[0].status), (5, WcStatus::LocLenErr));
    assert_eq!(w[0].grh, None);
    assert_eq!(
        read(&b, 100, 156),
        vec![0xaa; 156],
        "nothing past the buffer"
    );
    // The QP goes on: a datagram that fits completes.
    assert_eq!(b.core.qp(b.qp).unwrap().state(), QpState::Rts);
    recv(&mut b, 6, 0, 4096);
    send(&mut a, 2, ab, b.qp, QKEY, 100, None);
    for f in frames(&mut a) {
        b.core.handle_frame(0, &f);
    }
    assert_eq!(wcs(&mut b)[0].status, WcStatus::Success);
}

#[test]
fn sends_longer_than_the_mtu_complete_without_a_packet() {
    // IBA C10-93.1.1, as rxe: no packet, no error.
    let (mut a, _b, ab, _) = pair();
    send(&mut a, 1, ab, 0x33, QKEY, 1025, None);
    send(&mut a, 2, ab, 0x33, QKEY, 1024, None);
    let f = frames(&mut a);
    assert_eq!(f.len(), 1, "only the 1024-byte one leaves");
    let (r, l) = RoceRepr::parse(&f[0]).unwrap();
    assert_eq!(l.payload.len(), 1024);
    assert_eq!(r.transport.bth.psn, 101, "the oversize one took a PSN");
    let w = wcs(&mut a);
    assert_eq!(
        w.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(a.core.qp(a.qp).unwrap().stats().oversize_sends, 1);
}

#[test]
fn only_sends_with_an_address_are_posted() {
    let (mut a, _b, ab, _) = pair();
    let sge = [Sge {
        addr: a.addr,
        length: 8,
        lkey: a.lkey,
    }];
    let mut wr = SendWr::new(1, WrOpcode::RdmaWrite, &sge);
    wr.ud = Some(UdDest {
        ah: ab,
        remote_qpn: 1,
        remote_qkey: QKEY,
    });
    assert!(a.core.post_send(a.qp, &wr).is_err());
    let wr = SendWr::new(1, WrOpcode::Send, &sge);
    let e = a.core.post_send(a.qp, &wr).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    // A destroyed AH: the send completes, nothing leaves, it is counted.
    send(&mut a, 3, ab, 0x33, QKEY, 8, None);
    a.core.destroy_ah(ab).unwrap();
    assert!(frames(&mut a).is_empty());
    assert_eq!(a.core.stats.tx_no_ah, 1);
    assert!(a.core.destroy_ah(ab).is_err());
}

#[test]
fn ud_qps_share_an_srq() {
    let (mut a, mut b, ab, _) = pair();
    let srq = Arc::new(SrqShared::new(4, 1));
    b.core.attach_srq(b.qp, srq.clone()).unwrap();
    for k in 0..2u64 {
        let sge = [Sge {
            addr: b.addr + k * 4096,
            length: 4096,
            lkey: b.lkey,
        }];
        srq.post(&RecvWr {
            wr_id: 50 + k,
            sg_list: &sge,
        })
        .unwrap();
    }
    for id in 0..3 {
        send(&mut a, id, ab, b.qp, QKEY, 16, None);
    }
    for f in frames(&mut a) {
        b.core.handle_frame(0, &f);
    }
    let ids: Vec<u64> = wcs(&mut b).iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [50, 51]);
    assert_eq!(b.core.qp(b.qp).unwrap().stats().no_recv_wqe, 1);
}

#[test]
fn ud_modify_takes_udss_attributes() {
    let mut a = host(3, 3, 0);
    // RESET -> INIT takes a Q_Key and no access flags; RTR needs no
    // address, PSN or MTU (bring_up gives none).
    let e = a
        .core
        .modify_qp(a.qp, &QpAttr::init(Access::ALL))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "RESET -> INIT does not allow attribute qp_access_flags"
    );
    let e = a
        .core
        .modify_qp(
            a.qp,
            &QpAttr {
                qp_state: Some(QpState::Init),
                pkey_index: Some(0),
                port_num: Some(1),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert_eq!(e.to_string(), "RESET -> INIT requires attribute qkey");
    bring_up(&mut a, 5);
    let q = a.core.qp(a.qp).unwrap();
    assert_eq!((q.state(), q.qkey(), q.sq_psn()), (QpState::Rts, QKEY, 5));
}

#[test]
fn a_lossy_link_loses_datagrams_and_the_counters_say_so() {
    // Seeded: 200 datagrams, 10 % dropped on the way; nothing is sent
    // twice, every send completes, every datagram that arrives completes
    // a receive in order, and the counters add up.
    let (mut a, mut b, ab, _) = pair();
    let mut rng = rdma_user::rng::Rng(42);
    let (mut lost, mut arrived) = (0u64, Vec::new());
    for id in 0..200u64 {
        if b.core.qp(b.qp).unwrap().recv_queue_len() < 8 {
            for k in 0..8 {
                recv(&mut b, 1000 + id * 8 + k, 0, 4096);
            }
        }
        write(&mut a, 0, &id.to_le_bytes());
        send(&mut a, id, ab, b.qp, QKEY, 8, None);
        for f in frames(&mut a) {
            if rng.below(10) == 0 {
                lost += 1;
            } else {
                b.core.handle_frame(0, &f);
                arrived.push(id);
            }
        }
        for w in wcs(&mut b) {
            assert_eq!(w.status, WcStatus::Success);
            let got = u64::from_le_bytes(read(&b, GRH_LEN, 8).try_into().unwrap());
            assert_eq!(got, *arrived.last().unwrap(), "{w:?}");
        }
    }
    let mut sent = Vec::new();
    loop {
        let w = wcs(&mut a);
        if w.is_empty() {
            break;
        }
        sent.extend(w);
    }
    assert_eq!(sent.len(), 200, "every send completes, lost or not");
    assert!(sent.iter().all(|w| w.status == WcStatus::Success));
    let (sa, sb) = (
        a.core.qp(a.qp).unwrap().stats(),
        b.core.qp(b.qp).unwrap().stats(),
    );
    assert!(lost > 0 && (lost as usize) < 200, "{lost}");
    assert_eq!(sa.tx_packets, 200, "nothing retransmitted");
    assert_eq!(
        sb.rx_packets,
        200 - lost,
        "the receiver counts what arrived"
    );
    assert_eq!(arrived.len() as u64, 200 - lost);
    assert_eq!(a.core.handle_timers(1 << 40), None);
}

/// ECN and DCQCN on UD: a CE-marked datagram brings its sender a CNP (to
/// the DETH's source QPN, back over the frame's addresses), and the
/// sender's datagrams are then paced.
#[test]
fn a_marked_datagram_brings_its_sender_a_cnp_and_slows_it() {
    use rdma_user::tools::impair::mark_ce;
    let (mut a, mut b, ab, _) = pair();
    recv(&mut b, 1, 0, 4096);
    recv(&mut b, 2, 0, 4096);
    send(&mut a, 1, ab, b.qp, QKEY, 100, None);
    send(&mut a, 2, ab, b.qp, QKEY, 100, None);
    let f = frames(&mut a);
    assert_eq!(f.len(), 2);
    let ecn = |f: &[u8]| RoceRepr::parse(f).unwrap().0.ip.traffic_class() & 3;
    assert_eq!(ecn(&f[0]), 0b10, "datagrams go out ECT(0)");
    let marked: Vec<Vec<u8>> = f
        .iter()
        .map(|x| {
            let mut m = x.clone();
            assert!(mark_ce(&mut m));
            m
        })
        .collect();
    b.core.handle_frame(1_000, &marked[0]);
    let out = frames(&mut b);
    assert_eq!(out.len(), 1, "one CNP");
    let (cnp, l) = RoceRepr::parse(&out[0]).unwrap();
    let t = cnp.transport;
    assert_eq!(t.bth.opcode, opcode::CNP);
    assert_eq!(
        (t.bth.dest_qpn, t.bth.resv8a, t.bth.pkey, t.bth.psn),
        (a.qp, 0x40, 0xffff, 0)
    );
    assert_eq!(t.cnp_reserved, Some([0; 16]));
    assert!(l.payload.is_empty());
    assert_eq!((cnp.eth.src, cnp.eth.dst), (b.mac, a.mac));
    match cnp.ip {
        IpRepr::V4(ip) => assert_eq!((ip.src, ip.dst), (b.ip.octets(), a.ip.octets())),
        IpRepr::V6(_) => panic!("IPv4 in, IPv4 out"),
    }
    assert_eq!(cnp.ip.traffic_class(), 48 << 2, "DSCP 48, Not-ECT");
    assert_eq!(cnp.udp.src_port, udp_sport_for_ud(a.qp), "the flow's port");
    // The second mark, 1 µs later: delivered, counted, no second CNP.
    b.core.handle_frame(2_000, &marked[1]);
    assert!(frames(&mut b).is_empty());
    let sb = b.core.qp(b.qp).unwrap().stats();
    assert_eq!((sb.np_ecn_marked_roce_packets, sb.np_cnp_sent), (2, 1));
    assert_eq!(wcs(&mut b).len(), 2, "both datagrams were received");

    // The reaction point: each CNP (more than the monitor period apart)
    // halves A's rate, down to the floor; then its datagrams are paced.
    for k in 0..12u64 {
        a.core.handle_frame(3_000 + k * 10_000, &out[0]);
    }
    let q = a.core.qp(a.qp).unwrap();
    assert_eq!(q.stats().rp_cnp_handled, 12);
    let rate = q.cc().rc;
    assert!(rate <= 10.0, "{rate}");
    wcs(&mut a);
    send(&mut a, 3, ab, b.qp, QKEY, 1000, None);
    send(&mut a, 4, ab, b.qp, QKEY, 1000, None);
    // 7 µs after the last cut: before the first increase event.
    let now = 120_000;
    let mut buf = vec![0u8; 9000];
    assert!(a.core.build_frame(now, &mut buf) > 0, "the first leaves");
    assert_eq!(a.core.build_frame(now, &mut buf), 0, "the second waits");
    let next = a.core.handle_timers(now).expect("a pacing deadline");
    assert!(next > now + 500_000, "{}", next - now);
    assert!(a.core.build_frame(next, &mut buf) > 0);
}
