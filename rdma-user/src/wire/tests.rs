//! The wire format on literal and captured bytes: parse, emit, checks and
//! the distinct error of every malformed header.

use core::mem::offset_of;

use super::*;

/// Where the headers of an untagged IPv4 frame start.
const L4: usize = EthHdr::LEN + Ipv4Hdr::LEN;
const BTH: usize = L4 + UdpHdr::LEN;

#[test]
fn sport_matches_rxe_capture() {
    // captures/write_lat_64B: QPNs 0x11 and 0x19 use UDP source port 49577.
    assert_eq!(udp_sport_for_qps(0x11, 0x19), 49577);
    assert_eq!(udp_sport_for_qps(0x19, 0x11), 49577);
    // write_lat_64B_ipv6: 0x1c and 0x24 -> 50160.
    assert_eq!(udp_sport_for_qps(0x1c, 0x24), 50160);
    // Large QPNs exercise the fold of the high flow-label bits.
    let p = udp_sport_for_qps(0xabcdef, 0x123456);
    assert!(p >= 0xc000);
}

#[test]
fn ipv4_checksum_known_header_and_odd_tail() {
    // The textbook header (192.168.0.1 -> 192.168.0.199): checksum b861.
    let mut h = [
        0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8, 0x00,
        0x01, 0xc0, 0xa8, 0x00, 0xc7,
    ];
    assert_eq!(ipv4_checksum(&h), 0xb861);
    h[10..12].copy_from_slice(&0xb861u16.to_be_bytes());
    assert_eq!(ipv4_checksum(&h), 0);
    // RFC 1071: an odd trailing byte is summed as its high half.
    assert_eq!(ipv4_checksum(&[0x12, 0x34, 0x56]), !(0x1234u16 + 0x5600));
}

#[test]
fn syndromes() {
    assert_eq!(Syndrome::decode(0x1f), Syndrome::Ack { credits: 31 });
    assert_eq!(Syndrome::decode(0x2e), Syndrome::RnrNak { timer: 14 });
    assert_eq!(
        Syndrome::decode(0x60),
        Syndrome::Nak(NakCode::PsnSequenceError)
    );
    assert_eq!(
        Syndrome::decode(0x62),
        Syndrome::Nak(NakCode::RemoteAccessError)
    );
    assert_eq!(Syndrome::decode(0x40), Syndrome::Reserved(0x40));
}

/// A WRITE-style frame between 10.0.0.1 and 10.0.0.2 (shared by the
/// crate's unit tests).
pub(crate) fn sample(opc: u8) -> RoceRepr {
    RoceRepr {
        eth: EthernetRepr {
            dst: [2, 0, 0, 0, 0, 2],
            src: [2, 0, 0, 0, 0, 1],
            vlan_tci: None,
            ethertype: ETH_P_IPV4,
        },
        ip: IpRepr::V4(Ipv4Repr {
            src: [10, 0, 0, 1],
            dst: [10, 0, 0, 2],
            ..Default::default()
        }),
        udp: UdpRepr {
            src_port: 0xc001,
            dst_port: ROCE_V2_UDP_PORT,
            checksum: 0,
        },
        transport: TransportRepr {
            bth: BthRepr {
                opcode: opc,
                pkey: 0xffff,
                dest_qpn: 0x11,
                ack_req: true,
                psn: 0xfffffe,
                ..Default::default()
            },
            reth: Some(RethRepr {
                va: 0x1000,
                rkey: 0x1234,
                dma_len: 5,
            }),
            ..Default::default()
        },
    }
}

#[test]
fn emit_parse_round_trip_with_pad() {
    let r = sample(opcode::RC_RDMA_WRITE_ONLY);
    let mut buf = [0u8; 256];
    let n = r.emit(b"hello", &mut buf).unwrap();
    assert_eq!(
        n,
        BTH + Bth::LEN + Reth::LEN + 5 + 3 + ICRC_LEN,
        "headers, RETH, 5 bytes of payload, 3 of pad, ICRC"
    );
    let (p, layout) = RoceRepr::parse(&buf[..n]).unwrap();
    assert_eq!(&buf[layout.payload.clone()], b"hello");
    let mut expect = r;
    expect.transport.bth.pad_count = 3;
    if let IpRepr::V4(_) = p.ip {
    } else {
        panic!("v4 expected")
    }
    assert_eq!(p, expect);
    let mut again = [0u8; 256];
    assert_eq!(p.emit(b"hello", &mut again).unwrap(), n);
    assert_eq!(&buf[..n], &again[..n]);
}

#[test]
fn distinct_errors() {
    let r = sample(opcode::RC_RDMA_WRITE_ONLY);
    let mut buf = [0u8; 256];
    let n = r.emit(b"hello", &mut buf).unwrap();

    let mut bad = buf;
    bad[n - 1] ^= 1;
    assert_eq!(RoceRepr::parse(&bad[..n]).unwrap_err(), WireError::BadIcrc);

    // PadCnt 3 -> 2: the 8 padded bytes no longer hold a 4-byte multiple
    // of payload... but still parse; so break the multiple-of-4 instead by
    // claiming a pad larger than the padded payload on an empty payload.
    let r0 = sample(opcode::RC_RDMA_WRITE_ONLY);
    let n0 = r0.emit(b"", &mut bad).unwrap();
    let t = BTH;
    bad[t + 1] |= 0x30;
    assert_eq!(
        RoceRepr::parse_unchecked_icrc(&bad[..n0]).unwrap_err(),
        WireError::BadPadCount
    );

    // UDP length larger than the IP payload.
    let mut bad = buf;
    bad[L4 + offset_of!(UdpHdr, len)] = 0x7f;
    assert_eq!(
        RoceRepr::parse(&bad[..n]).unwrap_err(),
        WireError::BadLength
    );

    // IP total length beyond the frame.
    assert_eq!(
        RoceRepr::parse(&buf[..n - 1]).unwrap_err(),
        WireError::Truncated
    );

    let mut bad = buf;
    bad[BTH + offset_of!(Bth, opcode)] = 0xe0;
    assert_eq!(
        RoceRepr::parse(&bad[..n]).unwrap_err(),
        WireError::UnknownOpcode
    );
    // A reserved RC opcode passes the opcode check (the QP NAKs it), so
    // this frame, whose ICRC was not recomputed, fails on the ICRC.
    let mut bad = buf;
    bad[BTH + offset_of!(Bth, opcode)] = 0x15;
    assert_eq!(RoceRepr::parse(&bad[..n]).unwrap_err(), WireError::BadIcrc);
    let mut bad = buf;
    bad[BTH + offset_of!(Bth, flags)] |= 1;
    assert_eq!(RoceRepr::parse(&bad[..n]).unwrap_err(), WireError::BadTver);
    let mut bad = buf;
    bad[L4 + offset_of!(UdpHdr, dst_port)] = 0;
    assert_eq!(RoceRepr::parse(&bad[..n]).unwrap_err(), WireError::NotRoce);
    let mut bad = buf;
    bad[EthHdr::LEN + offset_of!(Ipv4Hdr, frag_off)] = 0x20; // MF
    assert_eq!(
        RoceRepr::parse(&bad[..n]).unwrap_err(),
        WireError::BadIpChecksum
    );
    let c = ipv4_checksum(&{
        let mut h = [0u8; 20];
        h.copy_from_slice(&bad[14..34]);
        h[10] = 0;
        h[11] = 0;
        h
    });
    bad[24..26].copy_from_slice(&c.to_be_bytes());
    assert_eq!(RoceRepr::parse(&bad[..n]).unwrap_err(), WireError::Fragment);

    // An ACK must not carry a payload.
    let mut a = sample(opcode::RC_ACKNOWLEDGE);
    a.transport.reth = None;
    a.transport.aeth = Some(AethRepr {
        syndrome: 0x1f,
        msn: 1,
    });
    let mut ab = [0u8; 128];
    let an = a.emit(b"abcd", &mut ab).unwrap();
    assert_eq!(
        RoceRepr::parse(&ab[..an]).unwrap_err(),
        WireError::BadPadCount
    );
}

#[test]
fn vlan_and_ipv6_round_trip() {
    let mut r = sample(opcode::RC_SEND_ONLY_WITH_IMMEDIATE);
    r.transport.reth = None;
    r.transport.imm = Some(0xdeadbeef);
    r.eth.vlan_tci = Some(0x0064);
    r.eth.ethertype = ETH_P_IPV6;
    r.ip = IpRepr::V6(Ipv6Repr {
        src: [0xfd; 16],
        dst: [0xfe; 16],
        traffic_class: 0,
        flow_label: 0x12345,
        hop_limit: 64,
        next_header: IPPROTO_UDP,
    });
    let mut buf = [0u8; 256];
    let n = r.emit(&[7u8; 9], &mut buf).unwrap();
    let (p, l) = RoceRepr::parse(&buf[..n]).unwrap();
    assert_eq!(p.eth.vlan_tci, Some(0x64));
    assert_eq!(p.transport.imm, Some(0xdeadbeef));
    assert_eq!(l.payload.len(), 9);
    assert_eq!(p.ip, r.ip);
}

#[test]
fn syndrome_encode_is_the_inverse_of_decode() {
    // Every syndrome byte whose bit 7 is clear (bit 7 is reserved).
    for b in 0..0x80u8 {
        assert_eq!(Syndrome::decode(b).encode(), b, "{b:#x}");
    }
    assert_eq!(syndrome::ACK_UNLIMITED, 0x1f);
    assert_eq!(syndrome::RNR_NAK, 0x20);
    assert_eq!(syndrome::NAK_PSN_SEQ, 0x60);
    assert_eq!(syndrome::NAK_INVALID_REQUEST, 0x61);
    assert_eq!(syndrome::NAK_REMOTE_ACCESS, 0x62);
    assert_eq!(syndrome::NAK_REMOTE_OPERATIONAL, 0x63);
}
