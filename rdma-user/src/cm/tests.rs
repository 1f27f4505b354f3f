use super::*;
use crate::rng::Rng;

const A: &str = "10.0.0.1";
const B: &str = "10.0.0.2";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn agent(guid: u64, first: u32) -> CmAgent {
    CmAgent::new(CmConfig {
        ca_guid: guid,
        // 4.096 µs · 2^10 ≈ 4.2 ms: short waits keep the tests' clock small.
        response_timeout: 10,
        max_retries: 3,
        tid_high: 2,
        first_comm_id: first,
    })
}

fn params(service: u64) -> ConnectParams {
    ConnectParams {
        peer: ip(B),
        service_id: service,
        qpn: 0x11,
        starting_psn: 0x123456,
        responder_resources: 4,
        initiator_depth: 4,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: false,
        path_mtu: 3,
        primary: CmPath::default(),
        private_data: [7; REQ_PRIVATE_LEN],
    }
}

fn accept_params() -> AcceptParams {
    AcceptParams {
        qpn: 0x12,
        starting_psn: 0x654321,
        responder_resources: 4,
        initiator_depth: 4,
        rnr_retry_count: 7,
        srq: false,
        private_data: [9; REP_PRIVATE_LEN],
    }
}

/// Two agents and a wire that may drop MADs.
struct Pair {
    a: CmAgent,
    b: CmAgent,
    now: Nanos,
    rng: Rng,
    loss: f64,
    dropped: u64,
}

impl Pair {
    fn new(loss: f64, seed: u64) -> Pair {
        Pair {
            a: agent(0xa, 100),
            b: agent(0xb, 200),
            now: 0,
            rng: Rng(seed),
            loss,
            dropped: 0,
        }
    }

    /// Delivers every queued MAD both ways (some dropped), until quiet.
    fn deliver(&mut self) {
        loop {
            let mut moved = false;
            while let Some(o) = self.a.poll_transmit() {
                moved = true;
                assert_eq!(o.to, ip(B));
                if self.rng.chance(self.loss) {
                    self.dropped += 1;
                } else {
                    self.b.handle_mad(self.now, ip(A), &o.mad);
                }
            }
            while let Some(o) = self.b.poll_transmit() {
                moved = true;
                assert_eq!(o.to, ip(A));
                if self.rng.chance(self.loss) {
                    self.dropped += 1;
                } else {
                    self.a.handle_mad(self.now, ip(B), &o.mad);
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// Jumps to the next deadline of either side and fires it.
    fn tick(&mut self) -> bool {
        let next = [self.a.poll_timeout(), self.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let Some(t) = next else { return false };
        self.now = self.now.max(t);
        self.a.handle_timeout(self.now);
        self.b.handle_timeout(self.now);
        true
    }

    /// Runs the CM both ways, reacting to events as rdma_cm's users do
    /// (accept every request, establish every response), until `done`.
    fn run(&mut self, mut done: impl FnMut(&CmEvent) -> bool) -> Vec<CmEvent> {
        let mut seen = Vec::new();
        for _ in 0..1000 {
            self.deliver();
            let mut finished = false;
            while let Some(e) = self.b.poll_event() {
                if let CmEvent::ConnectRequest { id, .. } = e {
                    self.b.accept(self.now, id, &accept_params()).unwrap();
                }
                finished |= done(&e);
                seen.push(e);
            }
            while let Some(e) = self.a.poll_event() {
                if let CmEvent::ConnectResponse { id, .. } = e {
                    self.a.establish(id, [0; RTU_PRIVATE_LEN]).unwrap();
                }
                finished |= done(&e);
                seen.push(e);
            }
            if finished {
                return seen;
            }
            let quiet = self.a.out.is_empty() && self.b.out.is_empty();
            let idle = self.a.events.is_empty() && self.b.events.is_empty();
            if quiet && idle && !self.tick() {
                break;
            }
        }
        seen
    }
}

fn established_both(events: &[CmEvent]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, CmEvent::Established { .. }))
        .count()
}

#[test]
fn connect_accept_establish_disconnect() {
    let mut p = Pair::new(0.0, 1);
    let svc = service_id(port_space::TCP, 7471);
    p.b.listen(svc).unwrap();
    let id = p.a.connect(0, &params(svc));
    // The REQ carries what was asked, under the kernel's TID layout.
    let o = p.a.poll_transmit().unwrap();
    let m = CmMad::parse(&o.mad).unwrap();
    assert_eq!(m.header.tid, 2 << 32 | id.swap_bytes() as u64);
    let CmMessage::Req(req) = m.message else {
        panic!()
    };
    assert_eq!(
        (req.local_comm_id, req.local_qpn, req.starting_psn),
        (id, 0x11, 0x123456)
    );
    assert_eq!(
        (req.service_id, req.local_ca_guid, req.max_cm_retries),
        (svc, 0xa, 3)
    );
    p.b.handle_mad(0, ip(A), &o.mad);
    let mut n = 0;
    let events = p.run(|e| {
        n += matches!(e, CmEvent::Established { .. }) as usize;
        n == 2
    });
    assert_eq!(established_both(&events), 2, "{events:?}");
    // The passive side saw the REQ's private data; the active the REP's.
    assert!(events.iter().any(|e| matches!(e,
        CmEvent::ConnectRequest { req, peer, .. } if req.private_data == [7; REQ_PRIVATE_LEN] && *peer == ip(A))));
    assert!(events.iter().any(|e| matches!(e,
        CmEvent::ConnectResponse { rep, .. } if rep.private_data == [9; REP_PRIVATE_LEN] && rep.local_qpn == 0x12)));
    assert_eq!(p.a.state(id), Some(CmState::Established));

    p.a.disconnect(p.now, id, [0; DREQ_PRIVATE_LEN]).unwrap();
    let events = p.run(|_| false);
    let disc = events
        .iter()
        .filter(|e| matches!(e, CmEvent::Disconnected { .. }))
        .count();
    assert_eq!(disc, 2, "{events:?}");
    // Both sides leave time-wait and forget the connection.
    assert!(p.a.is_empty() && p.b.is_empty());
    assert_eq!(p.a.stats.retransmits + p.b.stats.retransmits, 0);
}

#[test]
fn req_to_a_port_nobody_listens_on_is_rejected() {
    let mut p = Pair::new(0.0, 1);
    let id = p.a.connect(0, &params(service_id(port_space::TCP, 9)));
    let events = p.run(|e| matches!(e, CmEvent::Rejected { .. }));
    assert!(events.iter().any(|e| matches!(e,
        CmEvent::Rejected { id: i, reason: rej::INVALID_SERVICE_ID, .. } if *i == id)));
    assert_eq!(p.b.stats.rej_no_listener, 1);
    assert!(p.a.is_empty() && p.b.is_empty());
}

#[test]
fn consumer_reject_reaches_the_active_side_with_private_data() {
    let mut p = Pair::new(0.0, 1);
    let svc = service_id(port_space::TCP, 1);
    p.b.listen(svc).unwrap();
    let id = p.a.connect(0, &params(svc));
    p.deliver();
    let Some(CmEvent::ConnectRequest { id: bid, .. }) = p.b.poll_event() else {
        panic!()
    };
    p.b.reject(bid, rej::CONSUMER_REJECT, [5; REJ_PRIVATE_LEN])
        .unwrap();
    p.deliver();
    assert_eq!(
        p.a.poll_event(),
        Some(CmEvent::Rejected {
            id,
            reason: rej::CONSUMER_REJECT,
            private_data: Box::new([5; REJ_PRIVATE_LEN])
        })
    );
}

#[test]
fn lost_req_and_lost_rtu_are_recovered_by_retries() {
    let mut p = Pair::new(0.0, 1);
    let svc = service_id(port_space::TCP, 2);
    p.b.listen(svc).unwrap();
    let id = p.a.connect(0, &params(svc));
    // The first REQ is lost: the second, a time-out later, gets through.
    assert!(p.a.poll_transmit().is_some());
    assert!(p.tick());
    assert_eq!(p.a.stats.retransmits, 1);
    p.deliver();
    let Some(CmEvent::ConnectRequest { id: bid, .. }) = p.b.poll_event() else {
        panic!()
    };
    p.b.accept(p.now, bid, &accept_params()).unwrap();
    p.deliver();
    let Some(CmEvent::ConnectResponse { .. }) = p.a.poll_event() else {
        panic!()
    };
    p.a.establish(id, [0; RTU_PRIVATE_LEN]).unwrap();
    // The RTU is lost: the REP comes again and is answered with the RTU.
    assert!(p.a.poll_transmit().is_some());
    assert!(p.tick());
    p.deliver();
    assert_eq!(p.b.poll_event(), Some(CmEvent::Established { id: bid }));
    assert_eq!(p.a.stats.rx_duplicates, 1);
    assert_eq!(p.b.stats.retransmits, 1);
}

#[test]
fn no_answer_after_every_retry_is_unreachable() {
    let mut p = Pair::new(1.0, 1);
    let id = p.a.connect(0, &params(1));
    let events = p.run(|e| matches!(e, CmEvent::Unreachable { .. }));
    assert_eq!(events, [CmEvent::Unreachable { id }]);
    assert_eq!(p.a.stats.tx_mads, 4, "the REQ and its 3 retries");
    // Each wait is 2 · 4.096 µs · 2^10.
    assert_eq!(p.now, 4 * 2 * timeout_ns(10));
    assert!(p.a.is_empty());
}

#[test]
fn mra_extends_the_wait() {
    let mut p = Pair::new(0.0, 1);
    let id = p.a.connect(0, &params(1));
    let _ = p.a.poll_transmit();
    let before = p.a.poll_timeout().unwrap();
    let mra = CmMad::new(
        0,
        CmMessage::Mra(Mra {
            local_comm_id: 77,
            remote_comm_id: id,
            message_mraed: msg::REQ,
            service_timeout: 16,
            private_data: [0; MRA_PRIVATE_LEN],
        }),
    )
    .emit();
    p.a.handle_mad(0, ip(B), &mra);
    assert_eq!(p.a.poll_timeout().unwrap(), before + timeout_ns(16));
}

#[test]
fn malformed_and_unexpected_mads_are_counted_and_leave_connections_alone() {
    let mut p = Pair::new(0.0, 1);
    let svc = service_id(port_space::TCP, 3);
    p.b.listen(svc).unwrap();
    let id = p.a.connect(0, &params(svc));
    let events = p.run(|e| matches!(e, CmEvent::Established { .. }));
    let _ = events;
    p.run(|_| false);
    assert_eq!(p.a.state(id), Some(CmState::Established));
    let good = CmMad::new(
        1,
        CmMessage::Rtu(Rtu {
            local_comm_id: 1,
            remote_comm_id: 2,
            private_data: [0; RTU_PRIVATE_LEN],
        }),
    )
    .emit();
    let mut bad_class = good;
    bad_class[1] = 0x04;
    let mut unknown = good;
    unknown[17] = 0x30;
    let rep_for_nothing = CmMad::new(
        9,
        CmMessage::Rep(Rep {
            local_comm_id: 1,
            remote_comm_id: 0xdead,
            local_qkey: 0,
            local_qpn: 5,
            local_eecn: 0,
            starting_psn: 0,
            responder_resources: 0,
            initiator_depth: 0,
            target_ack_delay: 0,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: 0,
            srq: false,
            local_ca_guid: 0,
            private_data: [0; REP_PRIVATE_LEN],
        }),
    )
    .emit();
    let before = (p.a.stats, p.b.stats);
    for m in [
        &good[..],
        &bad_class,
        &unknown,
        &good[..100],
        &rep_for_nothing,
    ] {
        p.a.handle_mad(p.now, ip(B), m);
        p.b.handle_mad(p.now, ip(A), m);
    }
    assert_eq!(p.a.stats.rx_bad - before.0.rx_bad, 3);
    assert_eq!(p.a.stats.rx_unexpected - before.0.rx_unexpected, 2);
    assert_eq!(p.b.stats.rx_bad - before.1.rx_bad, 3);
    assert!(p.a.poll_transmit().is_none() && p.b.poll_transmit().is_none());
    assert!(p.a.poll_event().is_none() && p.b.poll_event().is_none());
    assert_eq!(p.a.state(id), Some(CmState::Established));
}

#[test]
fn duplicate_req_makes_no_second_connection() {
    let mut p = Pair::new(0.0, 1);
    let svc = service_id(port_space::TCP, 4);
    p.b.listen(svc).unwrap();
    p.a.connect(0, &params(svc));
    let o = p.a.poll_transmit().unwrap();
    p.b.handle_mad(0, ip(A), &o.mad);
    p.b.handle_mad(0, ip(A), &o.mad);
    assert!(matches!(
        p.b.poll_event(),
        Some(CmEvent::ConnectRequest { .. })
    ));
    assert_eq!(p.b.poll_event(), None);
    assert_eq!((p.b.len(), p.b.stats.rx_duplicates), (1, 1));
}

#[test]
fn many_connections_through_five_percent_loss_all_complete() {
    let (mut dropped, mut retransmits) = (0, 0);
    for seed in 0..20 {
        let mut p = Pair::new(0.05, seed);
        let svc = service_id(port_space::TCP, 5);
        p.b.listen(svc).unwrap();
        for i in 0..25u64 {
            let id = p.a.connect(p.now, &params(svc));
            let mut est = 0;
            p.run(|e| {
                est += matches!(e, CmEvent::Established { .. }) as usize;
                est == 2
            });
            assert_eq!(
                p.a.state(id),
                Some(CmState::Established),
                "seed {seed} conn {i}"
            );
            p.a.disconnect(p.now, id, [0; DREQ_PRIVATE_LEN]).unwrap();
            p.run(|e| matches!(e, CmEvent::Disconnected { id: d } if *d == id));
        }
        // Everything ends: both sides empty once time-wait passes.
        while p.tick() {
            p.deliver();
        }
        assert!(p.a.is_empty() && p.b.is_empty(), "seed {seed}");
        dropped += p.dropped;
        retransmits += p.a.stats.retransmits + p.b.stats.retransmits;
    }
    // 20 · 25 connections of 6 MADs each at 5 %: about 150 losses, each
    // recovered by a retry.
    assert!(
        dropped > 50 && retransmits >= dropped / 2,
        "{dropped} {retransmits}"
    );
}

#[test]
fn sidr_resolves_a_ud_service_or_says_unsupported() {
    let mut p = Pair::new(0.0, 1);
    let svc = service_id(port_space::UDP, 7174);
    p.b.listen(svc).unwrap();
    let id = p.a.sidr_request(0, ip(B), svc, [3; SIDR_REQ_PRIVATE_LEN]);
    p.deliver();
    let Some(CmEvent::SidrRequest { id: bid, req, .. }) = p.b.poll_event() else {
        panic!()
    };
    assert_eq!(req.private_data, [3; SIDR_REQ_PRIVATE_LEN]);
    p.b.sidr_reply(
        bid,
        sidr::SUCCESS,
        0x33,
        0x1111_1111,
        svc,
        [0; SIDR_REP_PRIVATE_LEN],
    )
    .unwrap();
    p.deliver();
    let Some(CmEvent::SidrReply { id: aid, rep }) = p.a.poll_event() else {
        panic!()
    };
    assert_eq!(
        (aid, rep.status, rep.qpn, rep.qkey),
        (id, sidr::SUCCESS, 0x33, 0x1111_1111)
    );
    let id = p.a.sidr_request(
        p.now,
        ip(B),
        service_id(port_space::UDP, 1),
        [0; SIDR_REQ_PRIVATE_LEN],
    );
    p.deliver();
    let Some(CmEvent::SidrReply { id: aid, rep }) = p.a.poll_event() else {
        panic!()
    };
    assert_eq!((aid, rep.status), (id, sidr::UNSUPPORTED));
    assert!(p.a.is_empty() && p.b.is_empty());
}
