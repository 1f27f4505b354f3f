//! The oracle is Linux rxe: every RoCEv2 frame it sent must parse, verify,
//! and re-emit byte for byte.

use std::path::PathBuf;

use rdma_user::wire::pcap::read_pcap;
use rdma_user::wire::*;

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

fn captures() -> Vec<PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(data_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    v.sort();
    assert!(v.len() >= 14, "test captures missing from {:?}", data_dir());
    v
}

/// Is this frame UDP to 4791 at all (whatever its validity)?
fn is_roce(f: &[u8]) -> bool {
    let Ok((eth, l3)) = EthernetRepr::parse(f) else {
        return false;
    };
    let Ok((ip, r)) = IpRepr::parse(eth.ethertype, &f[l3..]) else {
        return false;
    };
    ip.protocol() == IPPROTO_UDP
        && f.len() >= l3 + r.start + 4
        && u16::from_be_bytes([f[l3 + r.start + 2], f[l3 + r.start + 3]]) == ROCE_V2_UDP_PORT
}

/// Number of RoCE lines in the decoded text beside a capture, each ending in "ok".
fn expected_from_txt(pcap: &std::path::Path) -> usize {
    let txt = std::fs::read_to_string(pcap.with_extension("txt")).unwrap();
    let n = txt.lines().filter(|l| l.contains(" ICRC=0x")).count();
    assert_eq!(
        n,
        txt.lines()
            .filter(|l| l.contains(" ICRC=0x") && l.ends_with(" ok"))
            .count()
    );
    n
}

#[test]
fn every_frame_parses_verifies_and_reemits_exactly() {
    let mut total = 0;
    for path in captures() {
        let frames = read_pcap(&path).unwrap();
        let mut n = 0;
        for f in frames.iter().filter(|f| is_roce(&f.data)) {
            let (repr, layout) = RoceRepr::parse(&f.data)
                .unwrap_or_else(|e| panic!("{}: frame at {}: {e}", path.display(), f.ts));
            // The steering peek reads the same QPN without parsing.
            assert_eq!(
                peek_dest_qpn(&f.data),
                Some(repr.transport.bth.dest_qpn),
                "{}: frame at {}",
                path.display(),
                f.ts
            );
            let payload = &f.data[layout.payload.clone()];
            let mut out = vec![0u8; f.data.len() + 64];
            let len = repr.emit(payload, &mut out).unwrap();
            assert_eq!(len, layout.end);
            assert_eq!(
                &out[..len],
                &f.data[..layout.end],
                "{}: re-emit differs at {}",
                path.display(),
                f.ts
            );
            n += 1;
        }
        assert_eq!(n, expected_from_txt(&path), "{}", path.display());
        total += n;
    }
    assert_eq!(total, 292, "RoCE frames across all captures");
}

#[test]
fn single_byte_flips_break_icrc_except_masked_fields() {
    for path in captures() {
        for f in read_pcap(&path)
            .unwrap()
            .iter()
            .filter(|f| is_roce(&f.data))
        {
            let (repr, layout) = RoceRepr::parse(&f.data).unwrap();
            let l3 = layout.l3;
            let l4 = l3 + repr.ip.header_len();
            let mut masked: Vec<usize> = match repr.ip {
                IpRepr::V4(_) => vec![l3 + 1, l3 + 8, l3 + 10, l3 + 11],
                // Traffic class and flow label span bytes 0 (low nibble) to 3.
                IpRepr::V6(_) => vec![l3 + 1, l3 + 2, l3 + 3, l3 + 7],
            };
            masked.extend([l4 + 6, l4 + 7, layout.transport + 4]);
            let body = layout.end - ICRC_LEN;
            let mut buf = f.data[..layout.end].to_vec();
            for i in l3..layout.end {
                for flip in [0x01u8, 0x80, 0xff] {
                    buf[i] ^= flip;
                    let stored = u32::from_le_bytes(buf[body..layout.end].try_into().unwrap());
                    let ok = icrc(&buf[l3..body]).map(|c| c == stored).unwrap_or(false);
                    // IPv6 byte 0: the low nibble is traffic class (masked), the
                    // high nibble the version (not).
                    let v6_first = matches!(repr.ip, IpRepr::V6(_)) && i == l3;
                    let is_masked = masked.contains(&i) || (v6_first && flip & 0xf0 == 0);
                    assert_eq!(
                        ok,
                        is_masked,
                        "{}: flipping byte {i} ({flip:#x}) of frame at {}",
                        path.display(),
                        f.ts
                    );
                    buf[i] ^= flip;
                }
            }
        }
    }
}

#[test]
fn captured_fields_match_the_decoded_text() {
    // Spot checks against the .txt that rxe's capture tooling wrote.
    let f = read_pcap(&data_dir().join("atomic_lat_fetch_add.pcap")).unwrap();
    let frames: Vec<_> = f.iter().filter(|f| is_roce(&f.data)).collect();
    let (r, _) = RoceRepr::parse(&frames[0].data).unwrap();
    assert_eq!(r.transport.bth.opcode, opcode::RC_FETCH_ADD);
    assert_eq!(r.transport.bth.dest_qpn, 0x20);
    assert_eq!(r.transport.bth.psn, 0x286d71);
    let a = r.transport.atomic_eth.unwrap();
    assert_eq!((a.va, a.rkey, a.swap_add), (0x5619f0a18000, 0x16b7, 1));
    let (r, _) = RoceRepr::parse(&frames[1].data).unwrap();
    assert_eq!(r.transport.atomic_ack, Some(0xf61c0a7dc7e5cb8f));
    assert_eq!(r.transport.aeth.unwrap().syndrome, syndrome::ACK_UNLIMITED);
    assert_eq!(r.udp.src_port, udp_sport_for_qps(0x20, 0x18));

    let f = read_pcap(&data_dir().join("send_lat_UD_64B.pcap")).unwrap();
    let ud = f.iter().find(|f| is_roce(&f.data)).unwrap();
    let (r, l) = RoceRepr::parse(&ud.data).unwrap();
    assert_eq!(r.transport.deth.unwrap().qkey, 0x11111111);
    assert_eq!(r.transport.deth.unwrap().src_qpn, 0x1a);
    assert_eq!(l.payload.len(), 64);
}

/// The CM MADs of rxe's `ib_write_lat -R` capture: QP1 UD SENDs.
fn cm_mads() -> Vec<(RoceRepr, rdma_user::wire::cm::CmMad)> {
    use rdma_user::wire::cm::CmMad;
    read_pcap(&data_dir().join("write_lat_rdma_cm_64B.pcap"))
        .unwrap()
        .iter()
        .filter(|f| is_roce(&f.data))
        .filter_map(|f| {
            let (r, l) = RoceRepr::parse(&f.data).unwrap();
            (r.transport.bth.dest_qpn == 1).then(|| {
                let payload = &f.data[l.payload.clone()];
                let mad = CmMad::parse(payload).unwrap();
                // Every attribute re-emits byte for byte.
                assert_eq!(&mad.emit()[..], payload, "{} re-emits", mad.message.name());
                (r, mad)
            })
        })
        .collect()
}

#[test]
fn rxe_cm_mads_parse_and_reemit_exactly() {
    use rdma_user::wire::cm::*;
    let mads = cm_mads();
    let names: Vec<_> = mads.iter().map(|(_, m)| m.message.name()).collect();
    assert_eq!(
        names,
        ["REQ", "REP", "RTU", "REQ", "REP", "RTU", "DREQ", "DREP", "DREQ", "DREP"]
    );
    for (r, m) in &mads {
        // GSI datagrams: UD SEND_ONLY from QP1 to QP1 under the GSI Q_Key,
        // from the UDP port rxe gives QP1.
        assert_eq!(r.transport.bth.opcode, opcode::UD_SEND_ONLY);
        let d = r.transport.deth.unwrap();
        assert_eq!((d.qkey, d.src_qpn), (GSI_QKEY, 1));
        assert_eq!(r.udp.src_port, udp_sport_for_ud(1));
        // The kernel's TID: its agent's high word, then the byte-swapped
        // local comm id of the side that started the exchange.
        assert_eq!(m.header.tid >> 32, 2);
    }
    let CmMessage::Req(req) = mads[0].1.message else {
        panic!()
    };
    assert_eq!(req.local_comm_id, 0x07440f15);
    assert_eq!(mads[0].1.header.tid as u32, req.local_comm_id.swap_bytes());
    assert_eq!(req.service_id, service_id(port_space::TCP, 0x4853));
    assert_eq!(req.local_ca_guid, 0x505400fffe990003);
    assert_eq!((req.local_qpn, req.starting_psn), (0x1d, 0x05de45));
    assert_eq!((req.responder_resources, req.initiator_depth), (0, 0));
    assert_eq!(
        (
            req.remote_cm_response_timeout,
            req.local_cm_response_timeout
        ),
        (20, 20)
    );
    assert_eq!(
        (req.retry_count, req.rnr_retry_count, req.max_cm_retries),
        (7, 7, 15)
    );
    assert_eq!((req.pkey, req.path_mtu, req.transport_type), (0xffff, 3, 0));
    let p = req.primary;
    assert_eq!((p.local_lid, p.remote_lid), (0xffff, 0xffff));
    assert_eq!(p.local_gid[12..], [10, 99, 0, 3]);
    assert_eq!(p.remote_gid[12..], [10, 99, 0, 2]);
    assert_eq!(
        (p.hop_limit, p.local_ack_timeout, p.packet_rate),
        (64, 17, 0)
    );
    let cma = CmaHeader::parse(&req.private_data).unwrap();
    assert_eq!(p.flow_label, cma_flow_label(cma.src_port, 0x4853));
    assert_eq!(cma.dst.to_string(), "10.99.0.2");
    let CmMessage::Rep(rep) = mads[1].1.message else {
        panic!()
    };
    assert_eq!((rep.remote_comm_id, rep.local_qpn), (0x07440f15, 0x25));
    assert_eq!(
        (rep.starting_psn, rep.target_ack_delay, rep.rnr_retry_count),
        (0xa96c31, 15, 7)
    );
    assert_eq!(rep.local_ca_guid, 0x505400fffe990002);
    assert_eq!(
        mads[1].1.header.tid, mads[0].1.header.tid,
        "the REP echoes the TID"
    );
    let CmMessage::Rtu(rtu) = mads[2].1.message else {
        panic!()
    };
    assert_eq!(
        (rtu.local_comm_id, rtu.remote_comm_id),
        (0x07440f15, 0x520ddd59)
    );
    let CmMessage::Dreq(dreq) = mads[6].1.message else {
        panic!()
    };
    assert_eq!(dreq.remote_qpn, 0x26);
}

/// Given the inputs rxe's connections had (comm ids, QPNs, PSNs, ports,
/// addresses, GUIDs, the TID's agent word), our CM sends rxe's REQ, REP,
/// RTU, DREQ and DREP byte for byte: every other field (time-outs,
/// retries, path, flags, reserved bits, rdma_cm's header) is ours.
#[test]
fn our_cm_sends_rxes_mads_byte_for_byte() {
    use rdma_user::cm::*;
    use rdma_user::wire::cm::*;
    use std::net::SocketAddr;
    let mads = cm_mads();
    let raw = |i: usize| mads[i].1.emit();
    let agent = |guid: u64, comm: u32| {
        CmAgent::new(CmConfig {
            ca_guid: guid,
            response_timeout: 20,
            max_retries: 15,
            tid_high: 2,
            first_comm_id: comm,
        })
    };
    let (a_ip, b_ip): (std::net::IpAddr, std::net::IpAddr) =
        ("10.99.0.3".parse().unwrap(), "10.99.0.2".parse().unwrap());
    // Connections 1 and 2 of the capture: (REQ, REP, RTU) frame indexes.
    let mut actives = Vec::new();
    let mut passives = Vec::new();
    for (req_i, rep_i, rtu_i) in [(0, 1, 2), (3, 4, 5)] {
        let CmMessage::Req(req) = mads[req_i].1.message else {
            panic!()
        };
        let CmMessage::Rep(rep) = mads[rep_i].1.message else {
            panic!()
        };
        let cma = CmaHeader::parse(&req.private_data).unwrap();
        let mut a = agent(req.local_ca_guid, req.local_comm_id);
        let params = ConnectParams::rdma_cm(&RdmaCmConnect {
            src: SocketAddr::new(a_ip, cma.src_port),
            dst: SocketAddr::new(b_ip, req.service_id as u16),
            port_space: port_space::TCP,
            qpn: req.local_qpn,
            starting_psn: req.starting_psn,
            responder_resources: 0,
            initiator_depth: 0,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            path_mtu: 3,
            traffic_class: 0,
            ack_timeout: None,
            private_data: &[],
        })
        .unwrap();
        let id = a.connect(0, &params);
        let sent = a.poll_transmit().unwrap();
        assert_eq!(sent.to, b_ip);
        assert_eq!(sent.mad, raw(req_i), "REQ {req_i}");

        let mut b = agent(rep.local_ca_guid, rep.local_comm_id);
        b.listen(req.service_id).unwrap();
        b.handle_mad(0, a_ip, &sent.mad);
        let Some(CmEvent::ConnectRequest { id: bid, .. }) = b.poll_event() else {
            panic!()
        };
        b.accept(
            0,
            bid,
            &AcceptParams {
                qpn: rep.local_qpn,
                starting_psn: rep.starting_psn,
                responder_resources: 0,
                initiator_depth: 0,
                rnr_retry_count: 7,
                srq: false,
                private_data: [0; REP_PRIVATE_LEN],
            },
        )
        .unwrap();
        let sent = b.poll_transmit().unwrap();
        assert_eq!(sent.mad, raw(rep_i), "REP {rep_i}");

        a.handle_mad(0, b_ip, &sent.mad);
        assert!(matches!(
            a.poll_event(),
            Some(CmEvent::ConnectResponse { .. })
        ));
        a.establish(id, [0; RTU_PRIVATE_LEN]).unwrap();
        let sent = a.poll_transmit().unwrap();
        assert_eq!(sent.mad, raw(rtu_i), "RTU {rtu_i}");
        b.handle_mad(0, a_ip, &sent.mad);
        assert_eq!(b.poll_event(), Some(CmEvent::Established { id: bid }));
        actives.push((a, id));
        passives.push((b, bid));
    }
    // Frames 6-7: the active side closes connection 2; its DREP.
    let (a2, id2) = &mut actives[1];
    a2.disconnect(0, *id2, [0; DREQ_PRIVATE_LEN]).unwrap();
    let dreq = a2.poll_transmit().unwrap();
    assert_eq!(dreq.mad, raw(6), "DREQ");
    let (b2, _) = &mut passives[1];
    b2.handle_mad(0, a_ip, &dreq.mad);
    assert_eq!(b2.poll_transmit().unwrap().mad, raw(7), "DREP");
    // Frames 8-9: the passive side closes connection 1.
    let (b1, bid1) = &mut passives[0];
    b1.disconnect(0, *bid1, [0; DREQ_PRIVATE_LEN]).unwrap();
    let dreq = b1.poll_transmit().unwrap();
    assert_eq!(dreq.mad, raw(8), "DREQ from the passive side");
    let (a1, _) = &mut actives[0];
    a1.handle_mad(0, b_ip, &dreq.mad);
    assert_eq!(a1.poll_transmit().unwrap().mad, raw(9), "DREP to it");
}
