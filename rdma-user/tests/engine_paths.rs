//! One test per protocol path: every NAK, RNR and duplicate path, every
//! opcode sequence error, the requester's error handling, and byte-exact
//! agreement with packets that Linux rxe sent (captures/).

mod sim;

use rdma_user::memory::Access;
use rdma_user::transport::*;
use rdma_user::wire::pcap::read_pcap;
use rdma_user::wire::*;
use sim::*;

const A_QPN: u32 = 0x11;
const B_QPN: u32 = 0x19;

/// A node under test plus a handle to craft what "the peer" sends.
struct Bench {
    n: Node,
    now: u64,
}

impl Bench {
    /// Our QP `B_QPN`, connected to a scripted peer `A_QPN`.
    fn new(mtu: u32, our_psn: u32, peer_psn: u32) -> Bench {
        Self::with(mtu, our_psn, peer_psn, |_| {})
    }

    fn with(mtu: u32, our_psn: u32, peer_psn: u32, tweak: impl Fn(&mut QpAttr)) -> Bench {
        let mut n = Node::new(B_QPN, 0x5000_0000, [10, 0, 0, 2], [10, 0, 0, 1], 9);
        let q = &mut n.qp;
        q.modify(&QpAttr {
            qp_state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            qp_access_flags: Some(Access::ALL),
            ..Default::default()
        })
        .unwrap();
        q.modify(&QpAttr {
            qp_state: Some(QpState::Rtr),
            dest_gid: Some([0; 16]),
            path_mtu: Some(mtu),
            dest_qp_num: Some(A_QPN),
            rq_psn: Some(peer_psn),
            max_dest_rd_atomic: Some(2),
            min_rnr_timer: Some(12),
            ..Default::default()
        })
        .unwrap();
        let mut rts = QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(our_psn),
            timeout: Some(8),
            retry_cnt: Some(2),
            rnr_retry: Some(1),
            max_rd_atomic: Some(1),
            ..Default::default()
        };
        tweak(&mut rts);
        q.modify(&rts).unwrap();
        Bench { n, now: 1000 }
    }

    /// Delivers a request from the scripted peer at PSN `psn`.
    fn req(
        &mut self,
        opc: u8,
        psn: u32,
        ack_req: bool,
        ext: impl FnOnce(&mut TransportRepr),
        payload: &[u8],
    ) {
        let mut t = TransportRepr {
            bth: BthRepr {
                opcode: opc,
                pkey: 0xffff,
                dest_qpn: B_QPN,
                ack_req,
                psn,
                ..Default::default()
            },
            ..Default::default()
        };
        ext(&mut t);
        self.n
            .qp
            .handle_packet(self.now, &t, payload, &mut self.n.mem);
    }

    /// Everything our QP sends now, parsed.
    fn out(&mut self) -> Vec<(TransportRepr, Vec<u8>)> {
        let mut frames = Vec::new();
        self.n.transmit(self.now, &mut frames);
        frames
            .iter()
            .map(|f| {
                let (r, l) = RoceRepr::parse(f).expect("we emit valid frames");
                (r.transport, f[l.payload].to_vec())
            })
            .collect()
    }

    fn mr_rkey(&self) -> u32 {
        self.n.mr_rkey
    }
    fn va(&self, off: u64) -> u64 {
        self.n.mr_addr + off
    }
    fn wcs(&mut self) -> Vec<Wc> {
        std::iter::from_fn(|| self.n.qp.poll_completion()).collect()
    }
}

fn reth(va: u64, rkey: u32, len: u32) -> impl FnOnce(&mut TransportRepr) {
    move |t| {
        t.reth = Some(RethRepr {
            va,
            rkey,
            dma_len: len,
        })
    }
}

fn none(_: &mut TransportRepr) {}

fn aeth_of(t: &TransportRepr) -> (u8, u32) {
    let a = t.aeth.expect("AETH");
    (a.syndrome, t.bth.psn)
}

// ------------------------------------------------------------------ responder

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
    let buf = b.n.alloc(64);
    let sg = [Sge {
        addr: buf,
        length: 64,
        lkey: b.n.local_lkey,
    }];
    b.n.qp
        .post_recv(&RecvWr {
            wr_id: 7,
            sg_list: &sg,
        })
        .unwrap();
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
                    |t| {
                        t.atomic_eth = Some(AtomicEthRepr {
                            va,
                            rkey,
                            swap_add: 1,
                            compare: 0,
                        })
                    },
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
        let a = b.n.alloc(16);
        let sg = [Sge {
            addr: a,
            length: 16,
            lkey: b.n.local_lkey,
        }];
        b.n.qp
            .post_recv(&RecvWr {
                wr_id: id,
                sg_list: &sg,
            })
            .unwrap();
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
    b.n.mem.by_lkey_mut(b.n.mr_lkey).unwrap().bytes_mut()[..600].fill(1);
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
    b.n.mem.by_lkey_mut(b.n.mr_lkey).unwrap().bytes_mut()[..600].fill(2);
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
            let a = b.n.alloc(4096);
            let sg = [Sge {
                addr: a,
                length: 4096,
                lkey: b.n.local_lkey,
            }];
            b.n.qp
                .post_recv(&RecvWr {
                    wr_id: id,
                    sg_list: &sg,
                })
                .unwrap();
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
    let a = b.n.alloc(8);
    let sg = [Sge {
        addr: a,
        length: 8,
        lkey: b.n.local_lkey,
    }];
    b.n.qp
        .post_recv(&RecvWr {
            wr_id: 3,
            sg_list: &sg,
        })
        .unwrap();
    b.req(RC_SEND_ONLY, 0x60, true, none, &[1; 9]);
    assert_eq!(aeth_of(&b.out()[0].0).0, syndrome::NAK_INVALID_REQUEST);
    assert_eq!(b.wcs()[0].status, WcStatus::LocLenErr);
}

// ------------------------------------------------------------------ requester

fn post_write(b: &mut Bench, id: u64, len: u32) {
    let src = b.n.alloc(len as u64);
    let sg = [Sge {
        addr: src,
        length: len,
        lkey: b.n.local_lkey,
    }];
    let mut wr = SendWr::new(id, WrOpcode::RdmaWrite, &sg);
    wr.remote_addr = 0x9000;
    wr.rkey = 0x77;
    b.n.qp.post_send(&wr).unwrap();
}

fn ack(b: &mut Bench, psn: u32, syn: u8) {
    b.req(
        opcode::RC_ACKNOWLEDGE,
        psn,
        false,
        |t| {
            t.aeth = Some(AethRepr {
                syndrome: syn,
                msn: 0,
            })
        },
        b"",
    );
}

#[test]
fn retry_exhaustion_fails_and_flushes() {
    let mut b = Bench::new(1024, 0x100, 0);
    post_write(&mut b, 1, 8);
    post_write(&mut b, 2, 8);
    assert_eq!(b.out().len(), 2);
    // retry_cnt 2: the first timeout and the second retransmit...
    for round in 0..2 {
        b.now = b.n.qp.poll_timeout().expect("timer armed");
        b.n.qp.handle_timeout(b.now);
        let out = b.out();
        assert_eq!(out.len(), 2, "round {round} resends both");
        assert_eq!(out[0].0.bth.psn, 0x100);
    }
    // ...the third gives up.
    b.now = b.n.qp.poll_timeout().unwrap();
    b.n.qp.handle_timeout(b.now);
    let wc = b.wcs();
    assert_eq!(
        wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(b.n.qp.state(), QpState::Err);
    assert!(b.out().is_empty());
    assert_eq!(b.n.qp.stats().timeouts, 3);
    assert_eq!(b.n.qp.stats().retransmits, 4);
}

#[test]
fn retransmission_starts_small_and_doubles_per_ack() {
    let mut b = Bench::new(256, 0x100, 0);
    post_write(&mut b, 1, 256 * 300);
    assert_eq!(b.out().len(), 300, "no loss yet: no window");
    b.now = b.n.qp.poll_timeout().expect("timer armed");
    b.n.qp.handle_timeout(b.now);
    let mut next = 0x100u32;
    for want in [RETRY_WINDOW, 2 * RETRY_WINDOW, 300 - 3 * RETRY_WINDOW] {
        let out = b.out();
        let psns: Vec<u32> = out.iter().map(|(t, _)| t.bth.psn).collect();
        assert_eq!(psns, (next..next + want).collect::<Vec<_>>());
        let last = out.last().unwrap();
        assert!(
            last.0.bth.ack_req,
            "the packet that fills the window asks for an ACK"
        );
        assert!(b.out().is_empty(), "nothing past the window before the ACK");
        next += want;
        ack(&mut b, next - 1, syndrome::ACK_UNLIMITED);
    }
    let wc = b.wcs();
    assert_eq!(wc.len(), 1);
    assert_eq!(wc[0].status, WcStatus::Success);
}

#[test]
fn timeout_is_4_096us_times_2_pow_timeout() {
    let mut b = Bench::new(1024, 0x100, 0);
    post_write(&mut b, 1, 8);
    b.out();
    assert_eq!(b.n.qp.poll_timeout(), Some(b.now + 4096 * 256));
}

#[test]
fn sequence_nak_goes_back_n() {
    let mut b = Bench::new(256, 0x100, 0);
    post_write(&mut b, 1, 256 * 3);
    post_write(&mut b, 2, 8);
    assert_eq!(b.out().len(), 4);
    ack(&mut b, 0x101, syndrome::NAK_PSN_SEQ);
    let out = b.out();
    let psns: Vec<u32> = out.iter().map(|(t, _)| t.bth.psn).collect();
    assert_eq!(psns, [0x101, 0x102, 0x103], "from the NAKed PSN on");
    assert_eq!(out[0].0.bth.opcode, opcode::RC_RDMA_WRITE_MIDDLE);
    ack(&mut b, 0x103, syndrome::ACK_UNLIMITED);
    let ids: Vec<_> = b.wcs().iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(ids, [(1, WcStatus::Success), (2, WcStatus::Success)]);
}

#[test]
fn rnr_nak_waits_then_retries_and_counts() {
    let mut b = Bench::new(1024, 0x100, 0);
    post_write(&mut b, 1, 8);
    b.out();
    // RNR timer code 1 = 10 us.
    ack(&mut b, 0x100, syndrome::RNR_NAK | 1);
    assert!(b.out().is_empty(), "waits out the RNR timer");
    assert_eq!(b.n.qp.poll_timeout(), Some(b.now + 10_000));
    b.now += 10_000;
    b.n.qp.handle_timeout(b.now);
    assert_eq!(b.out().len(), 1);
    // rnr_retry 1 is used up: the next RNR NAK fails the WR.
    ack(&mut b, 0x100, syndrome::RNR_NAK | 1);
    assert_eq!(b.wcs()[0].status, WcStatus::RnrRetryExcErr);
    assert_eq!(b.n.qp.state(), QpState::Err);
}

#[test]
fn rnr_retry_7_is_infinite() {
    let mut b = Bench::with(1024, 0x100, 0, |a| a.rnr_retry = Some(7));
    post_write(&mut b, 1, 8);
    b.out();
    for _ in 0..50 {
        ack(&mut b, 0x100, syndrome::RNR_NAK | 1);
        b.now += 10_000;
        b.n.qp.handle_timeout(b.now);
        assert_eq!(b.out().len(), 1);
    }
    ack(&mut b, 0x100, syndrome::ACK_UNLIMITED);
    assert_eq!(b.wcs()[0].status, WcStatus::Success);
}

#[test]
fn remote_access_nak_fails_wr_and_flushes() {
    let mut b = Bench::new(1024, 0x100, 0);
    post_write(&mut b, 1, 8);
    post_write(&mut b, 2, 8);
    post_write(&mut b, 3, 8);
    b.out();
    ack(&mut b, 0x101, syndrome::NAK_REMOTE_ACCESS);
    let wc: Vec<_> = b.wcs().iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        wc,
        [
            (1, WcStatus::Success),
            (2, WcStatus::RemAccessErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(b.n.qp.state(), QpState::Err);
}

#[test]
fn max_rd_atomic_limits_outstanding_reads() {
    let mut b = Bench::new(1024, 0x100, 0);
    for id in 0..3 {
        let dst = b.n.alloc(8);
        let sg = [Sge {
            addr: dst,
            length: 8,
            lkey: b.n.local_lkey,
        }];
        let mut wr = SendWr::new(id, WrOpcode::RdmaRead, &sg);
        wr.remote_addr = 0x9000;
        wr.rkey = 0x77;
        b.n.qp.post_send(&wr).unwrap();
    }
    assert_eq!(b.out().len(), 1, "max_rd_atomic = 1");
    b.req(
        opcode::RC_RDMA_READ_RESPONSE_ONLY,
        0x100,
        false,
        |t| {
            t.aeth = Some(AethRepr {
                syndrome: 0x1f,
                msn: 1,
            })
        },
        &[5; 8],
    );
    let out = b.out();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0.bth.psn, 0x101);
    assert_eq!(b.wcs()[0].wr_id, 0);
}

#[test]
fn psn_wraps_at_2_pow_24() {
    let mut b = Bench::new(256, MASK_24 - 1, 0);
    post_write(&mut b, 1, 256 * 4);
    let psns: Vec<u32> = b.out().iter().map(|(t, _)| t.bth.psn).collect();
    assert_eq!(psns, [0xfffffe, 0xffffff, 0, 1]);
    ack(&mut b, 1, syndrome::ACK_UNLIMITED);
    assert_eq!(b.wcs()[0].status, WcStatus::Success);
}

#[test]
fn unsignaled_sends_complete_silently() {
    let mut b = Bench::new(1024, 0x100, 0);
    let src = b.n.alloc(8);
    let sg = [Sge {
        addr: src,
        length: 8,
        lkey: b.n.local_lkey,
    }];
    let mut wr = SendWr::new(1, WrOpcode::RdmaWrite, &sg);
    wr.flags.signaled = false;
    b.n.qp.post_send(&wr).unwrap();
    wr.wr_id = 2;
    wr.flags.signaled = true;
    b.n.qp.post_send(&wr).unwrap();
    b.out();
    ack(&mut b, 0x101, syndrome::ACK_UNLIMITED);
    let ids: Vec<_> = b.wcs().iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [2]);
    assert_eq!(b.n.qp.send_queue_len(), 0);
}

#[test]
fn bad_lkey_is_a_local_protection_error() {
    let mut b = Bench::new(1024, 0x100, 0);
    let sg = [Sge {
        addr: 0x1,
        length: 8,
        lkey: 0xbad,
    }];
    let wr = SendWr::new(1, WrOpcode::Send, &sg);
    b.n.qp.post_send(&wr).unwrap();
    assert!(b.out().is_empty(), "nothing leaves");
    assert_eq!(b.wcs()[0].status, WcStatus::LocProtErr);
    assert_eq!(b.n.qp.state(), QpState::Err);
}

// ------------------------------------------------------------------ rxe oracle

fn capture_frames(name: &str) -> Vec<(RoceRepr, Vec<u8>)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    read_pcap(&path)
        .unwrap()
        .into_iter()
        .filter_map(|f| {
            let (r, l) = RoceRepr::parse(&f.data).ok()?;
            Some((r, f.data[l.transport..l.end - ICRC_LEN].to_vec()))
        })
        .collect()
}

/// Our engine, put in rxe's place in a captured exchange, must emit the
/// same transport bytes that rxe did.
#[test]
fn same_bytes_as_rxe_for_write_and_its_ack() {
    let frames = capture_frames("write_lat_64B.pcap");
    // Frame 0: RC_RDMA_WRITE_ONLY from QPN 0x19 (PSN 0x83c942) to QPN 0x11.
    let (w, w_bytes) = &frames[0];
    let reth = w.transport.reth.unwrap();
    let mut b = Bench::with(1024, w.transport.bth.psn, 0x4e022a, |_| {});
    // Re-point our QP at the captured peer and replay the WRITE as requester.
    let src = b.n.alloc(64);
    let captured_payload = &w_bytes[w_bytes.len() - 64..];
    b.n.local_mut(src, 64).copy_from_slice(captured_payload);
    let sg = [Sge {
        addr: src,
        length: 64,
        lkey: b.n.local_lkey,
    }];
    let mut wr = SendWr::new(1, WrOpcode::RdmaWrite, &sg);
    wr.remote_addr = reth.va;
    wr.rkey = reth.rkey;
    b.n.qp.post_send(&wr).unwrap();
    let mut frames_out = Vec::new();
    b.n.transmit(b.now, &mut frames_out);
    let (r, l) = RoceRepr::parse(&frames_out[0]).unwrap();
    let ours = &frames_out[0][l.transport..l.end - ICRC_LEN];
    // Our QP talks to A_QPN (0x11), which is the captured destination.
    assert_eq!(r.transport.bth.dest_qpn, 0x11);
    assert_eq!(ours, &w_bytes[..], "WRITE_ONLY differs from rxe's");

    // Frame 3: rxe's ACK of the WRITE it received (PSN 0x4e022a, MSN 1).
    let (a, a_bytes) = &frames[3];
    assert_eq!(a.transport.bth.opcode, opcode::RC_ACKNOWLEDGE);
    let va = b.va(0);
    let rkey = b.mr_rkey();
    b.req(
        opcode::RC_RDMA_WRITE_ONLY,
        0x4e022a,
        true,
        reth_fn(va, rkey, 64),
        &[0; 64],
    );
    let mut acks = Vec::new();
    b.n.transmit(b.now, &mut acks);
    let (_, l) = RoceRepr::parse(&acks[0]).unwrap();
    assert_eq!(
        &acks[0][l.transport..l.end - ICRC_LEN],
        &a_bytes[..],
        "ACK differs from rxe's"
    );
}

fn reth_fn(va: u64, rkey: u32, len: u32) -> impl FnOnce(&mut TransportRepr) {
    reth(va, rkey, len)
}

#[test]
fn same_bytes_as_rxe_for_multi_packet_read_responses() {
    let frames = capture_frames("read_lat_2500B.pcap");
    // The first READ request and rxe's three responses to it.
    let (req, _) = &frames[0];
    assert_eq!(req.transport.bth.opcode, opcode::RC_RDMA_READ_REQUEST);
    let resp: Vec<_> = frames[1..4].to_vec();
    let r = req.transport.reth.unwrap();
    // Our responder holds the bytes rxe returned, at the offset requested.
    let mut b = Bench::with(1024, 0x100, req.transport.bth.psn, |_| {});
    let data: Vec<u8> = resp
        .iter()
        .flat_map(|(rr, bytes)| {
            let hl = rr.transport.header_len();
            bytes[hl..hl + (bytes.len() - hl - rr.transport.bth.pad_count as usize)].to_vec()
        })
        .collect();
    assert_eq!(data.len(), 2500);
    b.n.mem.by_lkey_mut(b.n.mr_lkey).unwrap().bytes_mut()[..2500].copy_from_slice(&data);
    let va = b.va(0);
    let rkey = b.mr_rkey();
    b.req(
        opcode::RC_RDMA_READ_REQUEST,
        req.transport.bth.psn,
        true,
        reth(va, rkey, r.dma_len),
        b"",
    );
    let mut out = Vec::new();
    b.n.transmit(b.now, &mut out);
    assert_eq!(out.len(), 3);
    for (i, f) in out.iter().enumerate() {
        let (ours, l) = RoceRepr::parse(f).unwrap();
        assert_eq!(ours.transport.bth.dest_qpn, A_QPN);
        // Same bytes but for the destination QPN (ours talks to 0x11 as the
        // capture does) — compare all of it.
        let mut theirs = resp[i].1.clone();
        theirs[5..8].copy_from_slice(&A_QPN.to_be_bytes()[1..]);
        assert_eq!(
            &f[l.transport..l.end - ICRC_LEN],
            &theirs[..],
            "response {i}"
        );
    }
}
