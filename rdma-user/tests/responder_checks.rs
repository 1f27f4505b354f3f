//! One test per receive check of the responder table
//! (`rdma_user::transport::responder`): every NAK, RNR, duplicate and
//! silent-drop path, each with the counter it bumps and what it leaves in
//! memory and in the QP state.

mod bench;
mod sim;

use bench::*;
use rdma_user::memory::Access;
use rdma_user::transport::*;
use rdma_user::wire::*;
use sim::*;

#[test]
fn psn_sequence_error_naks_once_per_gap() {
    let mut b = Bench::new(1024, 0x100, 0x500);
    let rkey = b.mr_rkey();
    let va = b.va(WRITE_AREA);
    // 0x501 and 0x502 arrive before 0x500: one NAK naming 0x500.
    b.req(
        opcode::RC_RDMA_WRITE_ONLY,
        0x501,
        true,
        reth(va, rkey, 4),
        b"abcd",
    );
    b.req(
        opcode::RC_RDMA_WRITE_ONLY,
        0x502,
        true,
        reth(va, rkey, 4),
        b"abcd",
    );
    let out = b.out();
    assert_eq!(out.len(), 1);
    assert_eq!(aeth_of(&out[0].0), (syndrome::NAK_PSN_SEQ, 0x500));
    assert_eq!(
        &b.n.mr()[..4],
        &[0; 4],
        "out-of-sequence data is not applied"
    );
    // The gap closes: 0x500 is applied and ACKed.
    b.req(
        opcode::RC_RDMA_WRITE_ONLY,
        0x500,
        true,
        reth(va, rkey, 4),
        b"wxyz",
    );
    let out = b.out();
    assert_eq!(aeth_of(&out[0].0), (syndrome::ACK_UNLIMITED, 0x500));
    assert_eq!(&b.n.mr()[..4], b"wxyz");
    // A new gap gets a new NAK.
    b.req(
        opcode::RC_RDMA_WRITE_ONLY,
        0x503,
        true,
        reth(va, rkey, 4),
        b"abcd",
    );
    let out = b.out();
    assert_eq!(aeth_of(&out[0].0), (syndrome::NAK_PSN_SEQ, 0x501));
    assert_eq!(b.n.qp.stats().seq_naks_sent, 2);
    assert_eq!(
        b.n.qp.state(),
        QpState::Rts,
        "a sequence error is not fatal"
    );
}

#[test]
fn rnr_nak_when_no_recv_is_posted_then_success() {
    let mut b = Bench::new(1024, 0x100, 0x10);
    b.req(opcode::RC_SEND_ONLY, 0x10, true, none, b"hello");
    let out = b.out();
    assert_eq!(out.len(), 1);
    // RNR NAK carries the 5-bit RNR timer code (min_rnr_timer 12).
    assert_eq!(aeth_of(&out[0].0), (syndrome::RNR_NAK | 12, 0x10));
    assert_eq!(b.n.qp.rq_psn(), 0x10, "the PSN is not consumed");
    let buf = b.recv(7, 64);
    b.req(opcode::RC_SEND_ONLY, 0x10, true, none, b"hello");
    assert_eq!(aeth_of(&b.out()[0].0), (syndrome::ACK_UNLIMITED, 0x10));
    let wc = b.wcs();
    assert_eq!(wc.len(), 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].byte_len),
        (7, WcStatus::Success, 5)
    );
    assert_eq!(b.n.local(buf, 5), b"hello");
}

#[test]
fn remote_access_errors_nak_and_leave_memory_untouched() {
    type Case = (&'static str, Box<dyn Fn(&mut Bench)>, u8);
    let cases: Vec<Case> = vec![
        (
            "bad rkey",
            Box::new(|b: &mut Bench| {
                let va = b.va(0);
                let rkey = b.mr_rkey() ^ 0x5a5a;
                b.req(
                    opcode::RC_RDMA_WRITE_ONLY,
                    0x10,
                    true,
                    reth(va, rkey, 4),
                    b"evil",
                )
            }),
            syndrome::NAK_REMOTE_ACCESS,
        ),
        (
            "VA below the MR",
            Box::new(|b: &mut Bench| {
                let va = b.va(0) - 2;
                let rkey = b.mr_rkey();
                b.req(
                    opcode::RC_RDMA_WRITE_ONLY,
                    0x10,
                    true,
                    reth(va, rkey, 4),
                    b"evil",
                )
            }),
            syndrome::NAK_REMOTE_ACCESS,
        ),
        (
            "range past the end",
            Box::new(|b: &mut Bench| {
                let va = b.va(MR_LEN as u64 - 2);
                let rkey = b.mr_rkey();
                b.req(
                    opcode::RC_RDMA_WRITE_ONLY,
                    0x10,
                    true,
                    reth(va, rkey, 4),
                    b"evil",
                )
            }),
            syndrome::NAK_REMOTE_ACCESS,
        ),
        (
            "DMA length above 2^31",
            Box::new(|b: &mut Bench| {
                let va = b.va(0);
                let rkey = b.mr_rkey();
                b.req(
                    opcode::RC_RDMA_READ_REQUEST,
                    0x10,
                    true,
                    reth(va, rkey, 0x8000_0001),
                    b"",
                )
            }),
            // rxe check_length: a length error before any key is looked at.
            syndrome::NAK_INVALID_REQUEST,
        ),
        (
            "READ with a local-only key",
            Box::new(|b: &mut Bench| {
                let va = b.n.local_addr;
                let rkey = b.n.mem.by_lkey(b.n.local_lkey).unwrap().rkey;
                b.req(
                    opcode::RC_RDMA_READ_REQUEST,
                    0x10,
                    true,
                    reth(va, rkey, 8),
                    b"",
                )
            }),
            syndrome::NAK_REMOTE_ACCESS,
        ),
        (
            "atomic with a bad rkey",
            Box::new(|b: &mut Bench| {
                let va = b.va(ATOMIC_AREA);
                b.req(
                    opcode::RC_FETCH_ADD,
                    0x10,
                    true,
                    |t| {
                        t.atomic_eth = Some(AtomicEthRepr {
                            va,
                            rkey: 0x1234,
                            swap_add: 1,
                            compare: 0,
                        })
                    },
                    b"",
                )
            }),
            syndrome::NAK_REMOTE_ACCESS,
        ),
        (
            "unaligned atomic",
            Box::new(|b: &mut Bench| {
                let va = b.va(ATOMIC_AREA + 4);
                let rkey = b.mr_rkey();
                b.req(
                    opcode::RC_FETCH_ADD,
                    0x10,
                    true,
                    atomic_eth(va, rkey, 1, 0),
                    b"",
                )
            }),
            syndrome::NAK_INVALID_REQUEST,
        ),
    ];
    for (name, f, want) in cases {
        let mut b = Bench::new(1024, 0x100, 0x10);
        let before = b.n.mr().to_vec();
        f(&mut b);
        let out = b.out();
        assert_eq!(out.len(), 1, "{name}");
        assert_eq!(aeth_of(&out[0].0), (want, 0x10), "{name}");
        assert_eq!(b.n.mr(), &before[..], "{name}: memory changed");
        assert_eq!(
            b.n.qp.state(),
            QpState::Err,
            "{name}: responder goes to ERR, as rxe"
        );
    }
}

#[test]
fn duplicate_write_is_reacked_not_reapplied() {
    let mut b = Bench::new(1024, 0x100, 0x20);
    let (va, rkey) = (b.va(0), b.mr_rkey());
    b.req(
        opcode::RC_RDMA_WRITE_ONLY,
        0x20,
        true,
        reth(va, rkey, 4),
        b"one!",
    );
    b.req(
        opcode::RC_RDMA_WRITE_ONLY,
        0x21,
        true,
        reth(va, rkey, 4),
        b"two!",
    );
    b.out();
    assert_eq!(&b.n.mr()[..4], b"two!");
    // The first again (its ACK was lost): ACKed, never written again.
    b.req(
        opcode::RC_RDMA_WRITE_ONLY,
        0x20,
        true,
        reth(va, rkey, 4),
        b"one!",
    );
    let out = b.out();
    assert_eq!(aeth_of(&out[0].0), (syndrome::ACK_UNLIMITED, 0x21));
    assert_eq!(&b.n.mr()[..4], b"two!");
    assert_eq!(b.n.qp.stats().duplicates_received, 1);
}

#[test]
fn duplicate_send_is_reacked_not_redelivered() {
    let mut b = Bench::new(1024, 0x100, 0x20);
    for id in 0..2 {
        b.recv(id, 16);
    }
    b.req(opcode::RC_SEND_ONLY, 0x20, true, none, b"msg");
    b.req(opcode::RC_SEND_ONLY, 0x20, true, none, b"msg");
    let out = b.out();
    assert!(out
        .iter()
        .all(|(t, _)| t.aeth.unwrap().syndrome == syndrome::ACK_UNLIMITED));
    assert_eq!(b.wcs().len(), 1, "delivered once");
    assert_eq!(b.n.qp.recv_queue_len(), 1, "second RECV still posted");
}

#[test]
fn duplicate_read_is_reexecuted() {
    let mut b = Bench::new(256, 0x100, 0x30);
    let (va, rkey) = (b.va(WRITE_AREA), b.mr_rkey());
    b.n.set_mr(0, &[1; 600]);
    b.req(
        opcode::RC_RDMA_READ_REQUEST,
        0x30,
        true,
        reth(va, rkey, 600),
        b"",
    );
    let out = b.out();
    let ops: Vec<u8> = out.iter().map(|(t, _)| t.bth.opcode).collect();
    assert_eq!(
        ops,
        [
            opcode::RC_RDMA_READ_RESPONSE_FIRST,
            opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
            opcode::RC_RDMA_READ_RESPONSE_LAST
        ]
    );
    assert_eq!(
        b.n.qp.rq_psn(),
        0x33,
        "a READ consumes one PSN per response"
    );
    // Memory changes, the request is repeated for its tail (from the 2nd
    // response): the responder reads memory again.
    b.n.set_mr(0, &[2; 600]);
    b.req(
        opcode::RC_RDMA_READ_REQUEST,
        0x31,
        true,
        reth(va + 256, rkey, 344),
        b"",
    );
    let out = b.out();
    assert_eq!(out.len(), 2);
    assert_eq!(out[0].0.bth.psn, 0x31);
    assert_eq!(out[0].0.bth.opcode, opcode::RC_RDMA_READ_RESPONSE_FIRST);
    assert!(out.iter().all(|(_, p)| p.iter().all(|&x| x == 2)));
    // A "duplicate" that does not end where the original ended is dropped.
    b.req(
        opcode::RC_RDMA_READ_REQUEST,
        0x31,
        true,
        reth(va + 256, rkey, 100),
        b"",
    );
    assert!(b.out().is_empty());
}

#[test]
fn duplicate_atomic_is_answered_from_its_saved_result() {
    let mut b = Bench::new(1024, 0x100, 0x40);
    let (va, rkey) = (b.va(ATOMIC_AREA), b.mr_rkey());
    let fa = |t: &mut TransportRepr| {
        t.atomic_eth = Some(AtomicEthRepr {
            va,
            rkey,
            swap_add: 5,
            compare: 0,
        })
    };
    b.req(opcode::RC_FETCH_ADD, 0x40, true, fa, b"");
    b.req(opcode::RC_FETCH_ADD, 0x41, true, fa, b"");
    let out = b.out();
    assert_eq!(out[0].0.atomic_ack, Some(0));
    assert_eq!(out[1].0.atomic_ack, Some(5));
    b.req(opcode::RC_FETCH_ADD, 0x40, true, fa, b"");
    let out = b.out();
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].0.bth.psn, out[0].0.atomic_ack), (0x40, Some(0)));
    let v = u64::from_ne_bytes(b.n.mr()[ATOMIC_AREA as usize..][..8].try_into().unwrap());
    assert_eq!(v, 10, "applied exactly twice");
}

#[test]
fn opcode_sequence_errors() {
    use opcode::*;
    // (name, packets before, offending opcode)
    let cases: &[(&str, &[u8], u8)] = &[
        ("SEND MIDDLE without FIRST", &[], RC_SEND_MIDDLE),
        ("SEND LAST without FIRST", &[], RC_SEND_LAST),
        ("WRITE MIDDLE without FIRST", &[], RC_RDMA_WRITE_MIDDLE),
        (
            "WRITE LAST without FIRST",
            &[],
            RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
        ),
        ("SEND FIRST inside a SEND", &[RC_SEND_FIRST], RC_SEND_FIRST),
        ("SEND ONLY inside a SEND", &[RC_SEND_FIRST], RC_SEND_ONLY),
        (
            "WRITE MIDDLE inside a SEND",
            &[RC_SEND_FIRST],
            RC_RDMA_WRITE_MIDDLE,
        ),
        (
            "SEND LAST inside a WRITE",
            &[RC_RDMA_WRITE_FIRST],
            RC_SEND_LAST,
        ),
        (
            "READ inside a WRITE",
            &[RC_RDMA_WRITE_FIRST],
            RC_RDMA_READ_REQUEST,
        ),
        ("LAST after ONLY", &[RC_SEND_ONLY], RC_SEND_LAST),
    ];
    for (name, before, bad) in cases {
        let mut b = Bench::new(256, 0x100, 0x50);
        let (va, rkey) = (b.va(WRITE_AREA), b.mr_rkey());
        for id in 0..2 {
            b.recv(id, 4096);
        }
        let mut psn = 0x50;
        for &op in before.iter() {
            let len = if op == RC_SEND_ONLY { 10 } else { 256 };
            b.req(op, psn, false, reth(va, rkey, 1024), &vec![1u8; len]);
            psn += 1;
        }
        b.out();
        let payload = vec![
            9u8;
            if opcode_flags(*bad).has(OpFlags::PAYLOAD) {
                256
            } else {
                0
            }
        ];
        b.req(*bad, psn, true, reth(va, rkey, 1024), &payload);
        let out = b.out();
        assert_eq!(out.len(), 1, "{name}");
        assert_eq!(
            aeth_of(&out[0].0),
            (syndrome::NAK_INVALID_REQUEST, psn),
            "{name}"
        );
        assert_eq!(b.n.qp.state(), QpState::Err, "{name}");
    }
}

#[test]
fn length_errors() {
    use opcode::*;
    // FIRST shorter than the MTU; WRITE longer than its RETH; LAST short of it.
    let mut b = Bench::new(256, 0x100, 0x60);
    let (va, rkey) = (b.va(WRITE_AREA), b.mr_rkey());
    b.req(
        RC_RDMA_WRITE_FIRST,
        0x60,
        false,
        reth(va, rkey, 1024),
        &[1; 200],
    );
    assert_eq!(aeth_of(&b.out()[0].0).0, syndrome::NAK_INVALID_REQUEST);

    let mut b = Bench::new(256, 0x100, 0x60);
    b.req(RC_RDMA_WRITE_ONLY, 0x60, true, reth(va, rkey, 10), &[1; 11]);
    assert_eq!(aeth_of(&b.out()[0].0).0, syndrome::NAK_INVALID_REQUEST);
    assert_eq!(b.n.mr()[0], 0);

    let mut b = Bench::new(256, 0x100, 0x60);
    b.req(
        RC_RDMA_WRITE_FIRST,
        0x60,
        false,
        reth(va, rkey, 600),
        &[1; 256],
    );
    b.req(RC_RDMA_WRITE_LAST, 0x61, true, none, &[1; 100]);
    assert_eq!(
        aeth_of(&b.out()[0].0),
        (syndrome::NAK_INVALID_REQUEST, 0x61)
    );

    // SEND longer than the RECV buffer: invalid request, RECV completes with
    // a local length error.
    let mut b = Bench::new(256, 0x100, 0x60);
    b.recv(3, 8);
    b.req(RC_SEND_ONLY, 0x60, true, none, &[1; 9]);
    assert_eq!(aeth_of(&b.out()[0].0).0, syndrome::NAK_INVALID_REQUEST);
    assert_eq!(b.wcs()[0].status, WcStatus::LocLenErr);
}

// ------------------------------------------------ header checks (IBA 9.6)

/// A request whose transport header fails a check before the responder
/// runs: nothing is sent, nothing is written, the QP stays in RTS, and
/// exactly the check's counter moves.
fn assert_dropped(b: &mut Bench, name: &str, before: &[u8], counter: fn(&QpStats) -> u64) {
    assert!(b.out().is_empty(), "{name}: dropped silently");
    assert_eq!(b.n.mr(), before, "{name}: memory changed");
    assert_eq!(b.n.qp.state(), QpState::Rts, "{name}");
    assert_eq!(b.n.qp.rq_psn(), 0x10, "{name}: the PSN is not consumed");
    assert_eq!(counter(&b.n.qp.stats()), 1, "{name}");
}

#[test]
fn opcodes_of_other_transports_are_dropped_silently() {
    for (name, opc) in [
        ("UC SEND_ONLY", opcode::UC_SEND_ONLY),
        ("UC RDMA_WRITE_ONLY", opcode::UC_RDMA_WRITE_ONLY),
        ("UD SEND_ONLY", opcode::UD_SEND_ONLY),
    ] {
        let mut b = Bench::new(1024, 0x100, 0x10);
        let (va, rkey) = (b.va(0), b.mr_rkey());
        let before = b.n.mr().to_vec();
        b.req(opc, 0x10, true, reth(va, rkey, 4), b"evil");
        assert_dropped(&mut b, name, &before, |s| s.wrong_transport);
    }
    // A CNP goes to the reaction point (DCQCN), never to PSN or ACK state.
    for (name, opc) in [("CNP", opcode::CNP), ("CNP 0x80", opcode::CNP_LEGACY)] {
        let mut b = Bench::new(1024, 0x100, 0x10);
        let before = b.n.mr().to_vec();
        b.req(opc, 0x10, true, none, b"");
        assert_dropped(&mut b, name, &before, |s| s.rp_cnp_handled);
    }
}

#[test]
fn pkey_must_match() {
    // Ours is the default partition, full member (0xffff).
    for (pkey, ok) in [
        (0xffff, true),
        (0x7fff, true), // limited member of the same partition
        (0x8001, false),
        (0x7ffe, false),
        (0x0000, false), // the invalid P_Key
        (0x8000, false),
    ] {
        assert_eq!(pkey_matches(0xffff, pkey), ok, "{pkey:#x}");
        let mut b = Bench::new(1024, 0x100, 0x10);
        let (va, rkey) = (b.va(0), b.mr_rkey());
        let before = b.n.mr().to_vec();
        b.req(
            opcode::RC_RDMA_WRITE_ONLY,
            0x10,
            true,
            |t| {
                t.bth.pkey = pkey;
                reth(va, rkey, 4)(t)
            },
            b"data",
        );
        if ok {
            assert_eq!(aeth_of(&b.out()[0].0), (syndrome::ACK_UNLIMITED, 0x10));
            assert_eq!(&b.n.mr()[..4], b"data");
        } else {
            assert_dropped(&mut b, &format!("P_Key {pkey:#x}"), &before, |s| s.bad_pkey);
        }
    }
    // Two limited members never talk.
    assert!(!pkey_matches(0x7fff, 0x7fff));
}

#[test]
fn packets_outside_the_states_that_accept_them_are_dropped() {
    // A request to a QP in INIT (not yet RTR) and a response to one in RTR
    // (not yet RTS): IBA 10.3.1, silently dropped.
    let mut n = Node::new(B_QPN, 0x5000_0000, [10, 0, 0, 2], [10, 0, 0, 1], 9);
    n.qp.modify(&QpAttr::init(Access::ALL)).unwrap();
    let write = TransportRepr {
        bth: BthRepr {
            opcode: opcode::RC_RDMA_WRITE_ONLY,
            pkey: 0xffff,
            dest_qpn: B_QPN,
            psn: 0,
            ack_req: true,
            ..Default::default()
        },
        reth: Some(RethRepr {
            va: n.mr_addr,
            rkey: n.mr_rkey,
            dma_len: 4,
        }),
        ..Default::default()
    };
    n.qp.handle_packet(1, &write, b"evil", &mut n.mem);
    assert_eq!(n.qp.stats().dropped, 1);
    assert_eq!(&n.mr()[..4], &[0; 4]);
    n.qp.modify(&QpAttr {
        qp_state: Some(QpState::Rtr),
        dest_gid: Some([0; 16]),
        path_mtu: Some(1024),
        dest_qp_num: Some(A_QPN),
        rq_psn: Some(0),
        max_dest_rd_atomic: Some(1),
        min_rnr_timer: Some(12),
        ..Default::default()
    })
    .unwrap();
    let ack = TransportRepr {
        bth: BthRepr {
            opcode: opcode::RC_ACKNOWLEDGE,
            pkey: 0xffff,
            dest_qpn: B_QPN,
            psn: 0,
            ..Default::default()
        },
        aeth: Some(AethRepr {
            syndrome: syndrome::ACK_UNLIMITED,
            msn: 0,
        }),
        ..Default::default()
    };
    n.qp.handle_packet(2, &ack, b"", &mut n.mem);
    assert_eq!(n.qp.stats().dropped, 2);
    let mut out = Vec::new();
    n.transmit(3, &mut out);
    assert!(out.is_empty());
}

// ------------------------------------------------ responder checks (IBA 9.7)

#[test]
fn reserved_opcodes_are_invalid_requests() {
    for opc in [0x15u8, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f] {
        let mut b = Bench::new(1024, 0x100, 0x10);
        let before = b.n.mr().to_vec();
        // Ahead of the expected PSN the PSN check answers first.
        b.req(opc, 0x12, true, none, &[7; 8]);
        assert_eq!(aeth_of(&b.out()[0].0), (syndrome::NAK_PSN_SEQ, 0x10));
        assert_eq!(b.n.qp.state(), QpState::Rts);
        // At the expected PSN: NAK Invalid Request, the QP goes to ERR.
        b.req(opc, 0x10, true, none, &[7; 8]);
        let out = b.out();
        assert_eq!(out.len(), 1, "{opc:#x}");
        assert_eq!(
            aeth_of(&out[0].0),
            (syndrome::NAK_INVALID_REQUEST, 0x10),
            "{opc:#x}"
        );
        let s = b.n.qp.stats();
        assert_eq!((s.reserved_opcodes, s.errors), (1, 1), "{opc:#x}");
        assert_eq!(b.n.qp.state(), QpState::Err, "{opc:#x}");
        assert_eq!(b.n.mr(), &before[..]);
    }
}

#[test]
fn send_with_invalidate_is_an_invalid_request() {
    // No memory windows or remote invalidation here (IBA 9.4.6, 10.6.7).
    for opc in [
        opcode::RC_SEND_ONLY_WITH_INVALIDATE,
        opcode::RC_SEND_LAST_WITH_INVALIDATE,
    ] {
        let mut b = Bench::new(1024, 0x100, 0x10);
        b.recv(1, 64);
        let rkey = b.mr_rkey();
        b.req(opc, 0x10, true, |t| t.ieth = Some(rkey), b"x");
        let out = b.out();
        assert_eq!(
            aeth_of(&out[0].0),
            (syndrome::NAK_INVALID_REQUEST, 0x10),
            "{opc:#x}"
        );
        assert_eq!(b.n.qp.state(), QpState::Err);
    }
}

#[test]
fn qp_access_flags_gate_remote_operations() {
    // The MR allows everything; the QP allows only what its access flags say.
    let cases: [(&str, Access, u8); 3] = [
        (
            "WRITE",
            Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            opcode::RC_RDMA_WRITE_ONLY,
        ),
        (
            "READ",
            Access::REMOTE_WRITE | Access::REMOTE_ATOMIC,
            opcode::RC_RDMA_READ_REQUEST,
        ),
        (
            "ATOMIC",
            Access::REMOTE_WRITE | Access::REMOTE_READ,
            opcode::RC_FETCH_ADD,
        ),
    ];
    for (name, access, opc) in cases {
        let mut b = Bench::with(1024, 0x100, 0x10, |rts| rts.qp_access_flags = Some(access));
        let (va, rkey) = (b.va(ATOMIC_AREA), b.mr_rkey());
        let before = b.n.mr().to_vec();
        let payload: &[u8] = if opc == opcode::RC_RDMA_WRITE_ONLY {
            b"evil0000"
        } else {
            b""
        };
        b.req(
            opc,
            0x10,
            true,
            |t| {
                if opc == opcode::RC_FETCH_ADD {
                    t.atomic_eth = Some(AtomicEthRepr {
                        va,
                        rkey,
                        swap_add: 1,
                        compare: 0,
                    })
                } else {
                    reth(va, rkey, 8)(t)
                }
            },
            payload,
        );
        let out = b.out();
        assert_eq!(out.len(), 1, "{name}");
        assert_eq!(
            aeth_of(&out[0].0),
            (syndrome::NAK_REMOTE_ACCESS, 0x10),
            "{name}"
        );
        assert_eq!(b.n.mr(), &before[..], "{name}: memory changed");
        assert_eq!(b.n.qp.state(), QpState::Err, "{name}");
    }
}

#[test]
fn more_reads_than_max_dest_rd_atomic_is_an_invalid_request() {
    // Bench's responder allows 2 outstanding READ/atomic requests.
    let mut b = Bench::new(1024, 0x100, 0x10);
    let (va, rkey) = (b.va(0), b.mr_rkey());
    for psn in 0x10..0x12 {
        b.req(
            opcode::RC_RDMA_READ_REQUEST,
            psn,
            true,
            reth(va, rkey, 8),
            b"",
        );
    }
    assert_eq!(b.n.qp.state(), QpState::Rts);
    b.req(
        opcode::RC_RDMA_READ_REQUEST,
        0x12,
        true,
        reth(va, rkey, 8),
        b"",
    );
    let out = b.out();
    assert_eq!(out.len(), 1, "the queued responses are discarded");
    assert_eq!(aeth_of(&out[0].0), (syndrome::NAK_INVALID_REQUEST, 0x12));
    assert_eq!(b.n.qp.state(), QpState::Err);
}

#[test]
fn recv_wqe_with_a_bad_lkey_is_a_remote_operational_error() {
    let mut b = Bench::new(1024, 0x100, 0x10);
    let a = b.n.alloc(64);
    let sg = [Sge {
        addr: a,
        length: 64,
        lkey: b.n.local_lkey ^ 0x0f00,
    }];
    b.n.qp
        .post_recv(&RecvWr {
            wr_id: 4,
            sg_list: &sg,
        })
        .unwrap();
    b.req(opcode::RC_SEND_ONLY, 0x10, true, none, b"hello");
    let out = b.out();
    assert_eq!(aeth_of(&out[0].0), (syndrome::NAK_REMOTE_OPERATIONAL, 0x10));
    let wc = b.wcs();
    assert_eq!((wc[0].wr_id, wc[0].status), (4, WcStatus::LocQpOpErr));
    assert_eq!(b.n.qp.state(), QpState::Err);
}

#[test]
fn packet_lengths_follow_the_mtu() {
    use opcode::*;
    // (name, packets before with their lengths, offending opcode and length)
    /// An opcode and its payload length.
    type Pkt = (u8, usize);
    let cases: &[(&str, &[Pkt], Pkt)] = &[
        ("ONLY longer than the MTU", &[], (RC_SEND_ONLY, 257)),
        (
            "MIDDLE shorter than the MTU",
            &[(RC_SEND_FIRST, 256)],
            (RC_SEND_MIDDLE, 255),
        ),
        (
            "MIDDLE longer than the MTU",
            &[(RC_SEND_FIRST, 256)],
            (RC_SEND_MIDDLE, 260),
        ),
        (
            "LAST without a byte",
            &[(RC_SEND_FIRST, 256)],
            (RC_SEND_LAST, 0),
        ),
        (
            "LAST longer than the MTU",
            &[(RC_SEND_FIRST, 256)],
            (RC_SEND_LAST, 260),
        ),
    ];
    for (name, before, (bad, len)) in cases {
        let mut b = Bench::new(256, 0x100, 0x60);
        b.recv(1, 4096);
        let mut psn = 0x60;
        for &(op, l) in before.iter() {
            b.req(op, psn, false, none, &vec![1u8; l]);
            psn += 1;
        }
        b.req(*bad, psn, true, none, &vec![2u8; *len]);
        let out = b.out();
        assert_eq!(out.len(), 1, "{name}");
        assert_eq!(
            aeth_of(&out[0].0),
            (syndrome::NAK_INVALID_REQUEST, psn),
            "{name}"
        );
        assert_eq!(b.n.qp.state(), QpState::Err, "{name}");
    }
}

#[test]
fn duplicate_replays_are_bounded() {
    // A peer resending one READ over and over cannot grow the response
    // queue: past its cap, duplicates are dropped and counted.
    let mut b = Bench::new(1024, 0x100, 0x10);
    let (va, rkey) = (b.va(0), b.mr_rkey());
    b.req(
        opcode::RC_RDMA_READ_REQUEST,
        0x10,
        true,
        reth(va, rkey, 8),
        b"",
    );
    for _ in 0..1000 {
        b.req(
            opcode::RC_RDMA_READ_REQUEST,
            0x10,
            true,
            reth(va, rkey, 8),
            b"",
        );
    }
    let sent = b.out().len();
    let s = b.n.qp.stats();
    assert_eq!(s.duplicates_received, 1000);
    assert!(sent < 100, "{sent} responses queued");
    assert_eq!(s.dropped as usize, 1001 - sent);
    assert_eq!(b.n.qp.state(), QpState::Rts);
}
