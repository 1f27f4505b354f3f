//! The XDP responder's decisions (`rdma_common::xdp_responder`, which the
//! XDP program runs) against the engine's, on the same packet sequences;
//! they must give exactly the same answers:
//!
//! - where XDP would place a packet, the engine places the same bytes at
//!   the same place, its state moves the same way, and the ACK XDP builds
//!   is byte for byte the frame the engine sends (or neither sends one);
//! - where XDP would execute an atomic, the engine finds the same value,
//!   leaves the same 8 bytes, and sends the same atomic ACK;
//! - where XDP would answer a READ, the engine sends byte for byte the
//!   READ_RESPONSE_ONLY XDP builds (headers, the MR's bytes, pad, ICRC);
//! - where XDP punts, the engine does something else than a silent
//!   placement or single response (a NAK, a drop, a re-ACK, a READ of
//!   several packets), except for requests XDP never serves (SEND);
//! - atomics XDP executed are replayed by the engine after it took the
//!   QP back: a duplicate gets the value XDP found, never a second
//!   execution; a duplicate of a READ XDP answered is executed again;
//! - the masks that let the verifier prove a placement stays inside the
//!   pool never change an offset or length that passed the checks.

mod bench;
mod sim;

use bench::*;
use rdma_common::mr_pool;
use rdma_common::xdp_responder::{
    self, punt, AtomicReq, PoolMr, ReadReq, RespBuf, RespState, WriteReq, RD_ATOMIC_RES,
};
use rdma_user::device::datapath::{ack_template, snapshot_of};
use rdma_user::transport::*;
use rdma_user::wire::*;
use sim::*;

/// XDP's view of the bench's QP, as the data path lends it.
fn lend(b: &Bench) -> Option<RespState> {
    let s = b.n.qp.lendable_responder()?;
    let c = b.n.qp.responder_consts();
    let (ack, ack_len, l3, ipv4) = ack_template(&b.n.net, &b.n.qp)?;
    let ack = xdp_responder::place_ack_template(&ack[..ack_len], l3)?;
    let mut st = RespState {
        qpn: B_QPN,
        epsn: s.epsn,
        msn: s.msn,
        pkey: c.pkey as u32,
        mtu: c.mtu,
        pd: c.pd,
        qp_access: c.access.0,
        ack,
        ack_len: ack_len as u32,
        ack_l3: l3 as u32,
        ack_ipv4: ipv4 as u32,
        ..Default::default()
    };
    if let Some((rkey, va, total, offset)) = s.write {
        st.in_write = 1;
        st.w_rkey = rkey;
        st.w_va = va;
        st.w_total = total;
        st.w_offset = offset;
    }
    // The bench's frames carry IPv4 ID 0: build_ack increments first.
    st.ip_id = 0xffff;
    Some(st)
}

/// What XDP's state says the engine's should be, as the engine's own
/// `lendable_responder` reports it (which carries no READs or atomics:
/// the engine keeps its own in its resources).
fn snapshot(st: &RespState) -> RespSnapshot {
    RespSnapshot {
        res: [(0, None); RD_ATOMIC_RES],
        n_res: 0,
        ..snapshot_of(st)
    }
}

/// One request of the generator: mostly the next packet of a well-formed
/// WRITE stream, sometimes broken in one of the ways the responder checks.
struct Gen {
    rng: Rng,
    psn: u32,
    /// The WRITE in progress: va, total, sent.
    msg: Option<(u64, u32, u32)>,
}

struct Req {
    opcode: u8,
    psn: u32,
    ack_req: bool,
    pkey: u16,
    reth: Option<(u64, u32, u32)>,
    /// va, rkey, swap_add, compare.
    atomic: Option<(u64, u32, u64, u64)>,
    payload: Vec<u8>,
}

impl Gen {
    fn next(&mut self, b: &Bench, mtu: u32) -> Req {
        let r = &mut self.rng;
        let rkey = b.mr_rkey();
        let mut q = match self.msg {
            // Between messages, a READ now and then: mostly of one packet,
            // small (what a frame's tailroom takes) or up to the MTU, some
            // of nothing, some of several packets.
            None if r.chance(0.12) => {
                let len = match r.below(5) {
                    0 => 0,
                    1 | 2 => r.below(64) as u32 + 1,
                    3 => r.below(mtu as u64) as u32 + 1,
                    _ => mtu + 1 + r.below(mtu as u64) as u32,
                };
                let va = b.va(r.below(WRITE_AREA_LEN - len as u64));
                Req {
                    opcode: opcode::RC_RDMA_READ_REQUEST,
                    psn: self.psn,
                    ack_req: false,
                    pkey: 0xffff,
                    reth: Some((va, rkey, len)),
                    atomic: None,
                    payload: Vec::new(),
                }
            }
            // Between messages, an atomic now and then: on an 8-byte
            // counter of the WRITE area, compare values that often match.
            None if r.chance(0.15) => {
                let va = b.va(8 * r.below(WRITE_AREA_LEN / 8));
                let compare = if r.chance(0.5) { 0 } else { r.next_u64() };
                Req {
                    opcode: if r.chance(0.5) {
                        opcode::RC_COMPARE_SWAP
                    } else {
                        opcode::RC_FETCH_ADD
                    },
                    psn: self.psn,
                    ack_req: true,
                    pkey: 0xffff,
                    reth: None,
                    atomic: Some((va, rkey, r.next_u64(), compare)),
                    payload: Vec::new(),
                }
            }
            None => {
                let total = match r.below(4) {
                    0 => r.below(mtu as u64 + 1) as u32,
                    1 => 0,
                    _ => r.below(3 * mtu as u64) as u32 + 1,
                };
                let va = b.va(r.below(WRITE_AREA_LEN - total as u64));
                let first = total.min(mtu);
                let opcode = if total <= mtu {
                    opcode::RC_RDMA_WRITE_ONLY
                } else {
                    self.msg = Some((va, total, first));
                    opcode::RC_RDMA_WRITE_FIRST
                };
                Req {
                    opcode,
                    psn: self.psn,
                    ack_req: total <= mtu || r.chance(0.2),
                    pkey: 0xffff,
                    reth: Some((va, rkey, total)),
                    atomic: None,
                    payload: (0..first).map(|_| r.next_u64() as u8).collect(),
                }
            }
            Some((va, total, sent)) => {
                let n = (total - sent).min(mtu);
                let last = sent + n == total;
                self.msg = if last {
                    None
                } else {
                    Some((va, total, sent + n))
                };
                Req {
                    opcode: if last {
                        opcode::RC_RDMA_WRITE_LAST
                    } else {
                        opcode::RC_RDMA_WRITE_MIDDLE
                    },
                    psn: self.psn,
                    ack_req: last || r.chance(0.2),
                    pkey: 0xffff,
                    reth: None,
                    atomic: None,
                    payload: (0..n).map(|_| r.next_u64() as u8).collect(),
                }
            }
        };
        self.psn = (self.psn + 1) & 0xff_ffff;
        // About one packet in seven is broken (the stream goes on as if not).
        match r.below(64) {
            0 => q.psn = (q.psn + 1 + r.below(3) as u32) & 0xff_ffff,
            1 => q.psn = q.psn.wrapping_sub(1 + r.below(3) as u32) & 0xff_ffff,
            2 => q.pkey = 0x1234,
            3 => {
                if let Some(h) = &mut q.reth {
                    h.1 ^= 0x100;
                }
                if let Some(a) = &mut q.atomic {
                    a.1 ^= 0x100;
                }
            }
            4 => {
                if let Some(h) = &mut q.reth {
                    h.0 = b.va(MR_LEN as u64 - 2);
                }
                if let Some(a) = &mut q.atomic {
                    a.0 = b.va(MR_LEN as u64 - 8) + 8;
                }
            }
            // (A READ with payload is not RoCE the wire code accepts.)
            5 if q.atomic.is_none() && q.opcode != opcode::RC_RDMA_READ_REQUEST => {
                q.payload.push(1);
            }
            9 => {
                if let Some(a) = &mut q.atomic {
                    a.0 += 4;
                }
            }
            6 => q.opcode = opcode::RC_RDMA_WRITE_MIDDLE,
            7 => {
                q.opcode = opcode::RC_SEND_ONLY;
                q.reth = None;
            }
            8 => {
                if let Some(h) = &mut q.reth {
                    h.2 = 0x8000_0001;
                }
            }
            _ => {}
        }
        q
    }
}

/// What XDP would do with a request.
enum Verdict {
    Write(xdp_responder::Place),
    /// The atomic's pool offset.
    Atomic(u64),
    /// The pool offset of the READ's first byte.
    Read(u64),
}

#[test]
fn xdp_decisions_and_acks_equal_the_engines() {
    let mut placed = 0u32;
    // Placed in XDP on a selective-repeat QP; requests XDP punted as
    // ahead of the expected PSN that such a QP's engine then kept.
    let mut sr_placed = 0u32;
    let mut sr_kept = 0u32;
    let mut acks = 0u32;
    let mut atomics = 0u32;
    let mut reads = 0u32;
    let mut punts = [0u32; punt::COUNT];
    for seed in 0..1000u64 {
        let mtu = [256, 1024, 4096][seed as usize % 3];
        let peer_psn = (seed as u32 * 0x9e37) & 0xff_ffff;
        // Every other stream recovers by selective repeat: XDP serves the
        // same in-order requests of such a QP, and punts what arrives
        // ahead of the expected PSN to the engine, which keeps it.
        let sr = seed % 2 == 1;
        let mut b = if sr {
            Bench::selective(mtu, 0x100, peer_psn)
        } else {
            Bench::new(mtu, 0x100, peer_psn)
        };
        // Every fourth stream over IPv6, every fifth with a VLAN tag: the
        // templates XDP patches come in all four shapes.
        if seed % 4 == 3 {
            b.n.net.eth.ethertype = ETH_P_IPV6;
            b.n.net.ip = IpRepr::V6(Ipv6Repr {
                src: [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
                dst: [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
                traffic_class: 2,
                flow_label: 0x12345,
                hop_limit: 64,
                next_header: 17,
            });
        }
        if seed % 5 == 4 {
            b.n.net.eth.vlan_tci = Some(7);
        }
        let mr = PoolMr {
            rkey: b.mr_rkey(),
            pd: PD,
            access: rdma_user::memory::Access::ALL.0,
            valid: 1,
            iova: b.va(0),
            len: MR_LEN as u64,
            pool_off: 4096,
        };
        let mut g = Gen {
            rng: Rng(seed * 7919 + 1),
            psn: peer_psn,
            msg: None,
        };
        for _ in 0..80 {
            let req = g.next(&b, mtu);
            let st = lend(&b);
            let wr = WriteReq {
                opcode: req.opcode,
                ack_req: req.ack_req,
                pkey: req.pkey,
                psn: req.psn,
                va: req.reth.map_or(0, |r| r.0),
                rkey: req.reth.map_or(0, |r| r.1),
                dma_len: req.reth.map_or(0, |r| r.2),
                plen: req.payload.len() as u32,
            };
            let ar = xdp_responder::is_served_atomic(req.opcode).then(|| {
                let (va, rkey, swap_add, compare) = req.atomic.unwrap_or_default();
                AtomicReq {
                    opcode: req.opcode,
                    pkey: req.pkey,
                    psn: req.psn,
                    va,
                    rkey,
                    swap_add,
                    compare,
                    plen: req.payload.len() as u32,
                }
            });
            let is_read = req.opcode == opcode::RC_RDMA_READ_REQUEST;
            let rr = ReadReq {
                pkey: req.pkey,
                psn: req.psn,
                va: wr.va,
                rkey: wr.rkey,
                dma_len: wr.dma_len,
                plen: wr.plen,
            };
            let verdict = st.as_ref().map(|st| match &ar {
                Some(a) => xdp_responder::check_atomic(st, a, Some(&mr)).map(Verdict::Atomic),
                None if is_read => xdp_responder::check_read(st, &rr, Some(&mr)).map(Verdict::Read),
                None => xdp_responder::check_write(st, &wr, Some(&mr)).map(Verdict::Write),
            });
            let before = b.n.qp.stats();
            let mem_before = b.n.mr().to_vec();
            let (reth, pkey, atomic) = (req.reth, req.pkey, req.atomic);
            b.req(
                req.opcode,
                req.psn,
                req.ack_req,
                move |t| {
                    t.bth.pkey = pkey;
                    if let Some((va, rkey, len)) = reth {
                        t.reth = Some(RethRepr {
                            va,
                            rkey,
                            dma_len: len,
                        });
                    }
                    if let Some((va, rkey, swap_add, compare)) = atomic {
                        t.atomic_eth = Some(AtomicEthRepr {
                            va,
                            rkey,
                            swap_add,
                            compare,
                        });
                    }
                },
                &req.payload,
            );
            let mut frames = Vec::new();
            b.n.transmit(b.now, &mut frames);
            let after = b.n.qp.stats();
            match (st, verdict) {
                (Some(mut st), Some(Ok(Verdict::Atomic(off)))) => {
                    let a = ar.expect("an atomic");
                    atomics += 1;
                    assert_eq!(after.errors, before.errors, "seed {seed}");
                    // The engine found what XDP's BPF atomic would find
                    // and left what it would leave.
                    let at = (off - mr.pool_off) as usize;
                    let old = u64::from_ne_bytes(mem_before[at..at + 8].try_into().unwrap());
                    let mut expect = mem_before;
                    expect[at..at + 8]
                        .copy_from_slice(&xdp_responder::atomic_result(&a, old).to_ne_bytes());
                    assert_eq!(expect, b.n.mr(), "seed {seed}: atomic result differs");
                    xdp_responder::commit_atomic(&mut st, &a, old);
                    assert_eq!(
                        b.n.qp.lendable_responder(),
                        Some(snapshot(&st)),
                        "seed {seed}: state differs"
                    );
                    let mut out = RespBuf::default();
                    let n = xdp_responder::build_resp(&mut st, a.psn, Some(old), &mut out);
                    assert_eq!(frames.len(), 1, "seed {seed}");
                    assert_eq!(
                        xdp_responder::resp_frame(&st, &out, n),
                        &frames[0][..],
                        "seed {seed}: atomic ACK bytes differ"
                    );
                }
                (Some(mut st), Some(Ok(Verdict::Read(off)))) => {
                    reads += 1;
                    assert_eq!(after.errors, before.errors, "seed {seed}");
                    assert_eq!(mem_before, b.n.mr(), "seed {seed}: a READ wrote");
                    xdp_responder::commit_read(&mut st, &rr);
                    assert_eq!(
                        b.n.qp.lendable_responder(),
                        Some(snapshot(&st)),
                        "seed {seed}: state differs"
                    );
                    // The frame XDP writes: the headers, the pool's bytes,
                    // the pad, then the ICRC it computes over them.
                    let mut out = RespBuf::default();
                    let head =
                        xdp_responder::build_read_head(&mut st, rr.psn, rr.dma_len, &mut out);
                    assert!(head > 0);
                    let mut want = xdp_responder::resp_frame(&st, &out, head).to_vec();
                    if rr.dma_len > 0 {
                        let at = (off - mr.pool_off) as usize;
                        want.extend_from_slice(&mem_before[at..at + rr.dma_len as usize]);
                    }
                    want.resize(want.len() + xdp_responder::pad_for(rr.dma_len) as usize, 0);
                    let l3 = st.ack_l3 as usize;
                    let crc = icrc(&want[l3..]).unwrap();
                    want.extend_from_slice(&crc.to_le_bytes());
                    assert_eq!(
                        want.len(),
                        st.ack_len as usize
                            + (rr.dma_len + xdp_responder::pad_for(rr.dma_len)) as usize,
                        "seed {seed}: the length XDP grows the frame to"
                    );
                    assert_eq!(frames.len(), 1, "seed {seed}");
                    assert_eq!(want, frames[0], "seed {seed}: READ response bytes differ");
                }
                (Some(mut st), Some(Ok(Verdict::Write(p)))) => {
                    placed += 1;
                    sr_placed += sr as u32;
                    assert_eq!(after.errors, before.errors, "seed {seed}");
                    // The same bytes at the same place.
                    let mut expect = mem_before;
                    if p.len > 0 {
                        let at = (p.pool_off - mr.pool_off) as usize;
                        expect[at..at + p.len as usize].copy_from_slice(&req.payload);
                    }
                    assert_eq!(expect, b.n.mr(), "seed {seed}: placement differs");
                    xdp_responder::commit(&mut st, &wr, &p);
                    assert_eq!(
                        b.n.qp.lendable_responder(),
                        Some(snapshot(&st)),
                        "seed {seed}: state differs"
                    );
                    if p.ack {
                        acks += 1;
                        let mut out = RespBuf::default();
                        let n = xdp_responder::build_ack(&mut st, wr.psn, &mut out);
                        assert_eq!(frames.len(), 1, "seed {seed}");
                        assert_eq!(
                            xdp_responder::resp_frame(&st, &out, n),
                            &frames[0][..],
                            "seed {seed}: ACK bytes differ"
                        );
                    } else {
                        assert!(frames.is_empty(), "seed {seed}: the engine sent {frames:?}");
                    }
                }
                (Some(_), Some(Err(r))) => {
                    punts[r] += 1;
                    sr_kept += (sr
                        && r == punt::PSN
                        && after.out_of_sequence_received > before.out_of_sequence_received)
                        as u32;
                    // Never a punt where the engine just places silently,
                    // except for what XDP never serves.
                    let mut silent = after.errors == before.errors
                        && after.bad_pkey == before.bad_pkey
                        && after.duplicates_received == before.duplicates_received
                        && after.out_of_sequence_received == before.out_of_sequence_received
                        && after.sr_outside_window == before.sr_outside_window
                        && after.sr_not_kept == before.sr_not_kept;
                    if is_read {
                        // Silent for a READ: one response packet, which
                        // XDP could have sent.
                        let at = b.n.net.net_header_len();
                        silent &= frames.len() == 1
                            && frames[0].get(at) == Some(&opcode::RC_RDMA_READ_RESPONSE_ONLY);
                    }
                    if r != punt::NOT_WRITE {
                        assert!(
                            !silent,
                            "seed {seed}: punt {} but the engine placed it",
                            punt::NAMES[r]
                        );
                    }
                }
                _ => {}
            }
            if b.n.qp.state() == QpState::Err {
                break;
            }
            // Keep the generator on the engine's PSN after a drop or NAK.
            g.psn = b.n.qp.rq_psn();
            if b.n
                .qp
                .lendable_responder()
                .is_some_and(|s| s.write.is_none())
            {
                g.msg = None;
            }
        }
    }
    eprintln!("placed {placed} ({sr_placed} under selective repeat, which kept {sr_kept} punted as ahead), acks {acks}, atomics {atomics}, reads {reads}, punts {punts:?}");
    assert!(
        placed > 8000 && acks > 3000 && atomics > 1000 && reads > 600,
        "placed {placed}, acks {acks}, atomics {atomics}, reads {reads}"
    );
    assert!(
        sr_placed > 3000 && sr_kept > 50,
        "{sr_placed} placed, {sr_kept} kept under selective repeat"
    );
    for r in [
        punt::NOT_WRITE,
        punt::PKEY,
        punt::PSN,
        punt::SEQUENCE,
        punt::LENGTH,
        punt::NOT_POOL,
        punt::ACCESS,
        punt::TOO_LONG,
    ] {
        assert!(
            punts[r] > 10,
            "punt {} seen {} times",
            punt::NAMES[r],
            punts[r]
        );
    }
}

/// Atomics XDP executed while it held the QP: once the engine takes the
/// QP back, a duplicate of one gets the value XDP found (replayed, not
/// executed again), as rxe and the engine do for their own; the oldest
/// beyond the engine's resources (max_dest_rd_atomic) are forgotten, as
/// the engine forgets its own.
#[test]
fn atomics_xdp_executed_are_replayed_after_the_take_back() {
    let peer_psn = 0x500;
    let mut b = Bench::new(1024, 0x100, peer_psn);
    let mut st = lend(&b).expect("a quiescent QP is lendable");
    let va = b.va(64);
    let fetch_add = |psn| AtomicReq {
        opcode: opcode::RC_FETCH_ADD,
        pkey: 0xffff,
        psn,
        va,
        rkey: b.mr_rkey(),
        swap_add: 1,
        compare: 0,
        plen: 0,
    };
    // XDP executes three FETCH_ADDs (played here without touching the
    // memory, so that a second execution would show), finding 7, 8, 9.
    for (k, orig) in [7u64, 8, 9].into_iter().enumerate() {
        xdp_responder::commit_atomic(&mut st, &fetch_add(peer_psn + k as u32), orig);
    }
    // The take-back, as the data path does it.
    let snap = snapshot_of(&st);
    assert_eq!(snap.n_res, 3);
    b.n.qp.restore_responder(&snap);
    let mem = b.n.mr().to_vec();
    let rkey = b.mr_rkey();
    let dup = |b: &mut Bench, psn: u32| {
        b.req(
            opcode::RC_FETCH_ADD,
            psn,
            true,
            atomic_eth(va, rkey, 1, 0),
            &[],
        );
        let mut frames = Vec::new();
        b.n.transmit(b.now, &mut frames);
        frames
            .iter()
            .map(|f| RoceRepr::parse(f).unwrap().0.transport)
            .collect::<Vec<_>>()
    };
    // The two newest fit the engine's resources (max_dest_rd_atomic 2).
    for (psn, orig) in [(peer_psn + 2, 9), (peer_psn + 1, 8)] {
        let t = dup(&mut b, psn);
        assert_eq!(t.len(), 1, "{t:?}");
        assert_eq!(t[0].bth.opcode, opcode::RC_ATOMIC_ACKNOWLEDGE);
        assert_eq!((t[0].bth.psn, t[0].atomic_ack), (psn, Some(orig)));
    }
    // The oldest is forgotten: dropped, as the engine drops a duplicate
    // atomic it has no resource for.
    assert!(dup(&mut b, peer_psn).is_empty());
    assert_eq!(b.n.mr(), &mem[..], "a duplicate was executed again");
    assert_eq!(b.n.qp.stats().errors, 0);
    assert_eq!(b.n.qp.rq_psn(), peer_psn + 3);
}

/// READs XDP answered while it held the QP are in the engine's resources
/// after the take-back, among the atomics, in order: a duplicate READ is
/// executed again (the bytes as they are now), a duplicate atomic gets the
/// value XDP found, and what the resources no longer hold is dropped.
#[test]
fn reads_xdp_answered_are_executed_again_after_the_take_back() {
    let peer_psn = 0x700;
    let mut b = Bench::new(1024, 0x100, peer_psn);
    let mut st = lend(&b).expect("a quiescent QP is lendable");
    let rkey = b.mr_rkey();
    let va = b.va(128);
    let read = |psn, len| ReadReq {
        pkey: 0xffff,
        psn,
        va,
        rkey,
        dma_len: len,
        plen: 0,
    };
    // XDP answers a READ, executes a FETCH_ADD (finding 5), answers
    // another READ.
    xdp_responder::commit_read(&mut st, &read(peer_psn, 16));
    xdp_responder::commit_atomic(
        &mut st,
        &AtomicReq {
            opcode: opcode::RC_FETCH_ADD,
            pkey: 0xffff,
            psn: peer_psn + 1,
            va: b.va(64),
            rkey,
            swap_add: 1,
            compare: 0,
            plen: 0,
        },
        5,
    );
    xdp_responder::commit_read(&mut st, &read(peer_psn + 2, 24));
    assert_eq!((st.reads, st.read_bytes, st.atomics), (2, 40, 1));
    let snap = snapshot_of(&st);
    assert_eq!(snap.n_res, 3);
    assert_eq!(
        &snap.res[..3],
        &[
            (peer_psn, None),
            (peer_psn + 1, Some(5)),
            (peer_psn + 2, None)
        ]
    );
    b.n.qp.restore_responder(&snap);
    assert_eq!(b.n.qp.rq_psn(), peer_psn + 3);
    b.n.set_mr(128, b"the bytes as they are no");
    // The newest READ: executed again, with today's bytes.
    b.req(
        opcode::RC_RDMA_READ_REQUEST,
        peer_psn + 2,
        false,
        reth(va, rkey, 24),
        &[],
    );
    let out = b.out();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].0.bth.opcode, opcode::RC_RDMA_READ_RESPONSE_ONLY);
    assert_eq!(out[0].0.bth.psn, peer_psn + 2);
    assert_eq!(out[0].1, b"the bytes as they are no");
    // The atomic: replayed, never executed again.
    b.req(
        opcode::RC_FETCH_ADD,
        peer_psn + 1,
        true,
        atomic_eth(b.va(64), rkey, 1, 0),
        &[],
    );
    let out = b.out();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].0.atomic_ack, Some(5));
    // The oldest READ is beyond the resources (max_dest_rd_atomic 2):
    // dropped, as the engine drops its own.
    b.req(
        opcode::RC_RDMA_READ_REQUEST,
        peer_psn,
        false,
        reth(va, rkey, 16),
        &[],
    );
    assert!(b.out().is_empty());
    assert_eq!(b.n.qp.stats().errors, 0);
    assert_eq!(b.n.qp.rq_psn(), peer_psn + 3);
}

/// A lent QP in PD 1 that takes remote WRITEs, MTU 4096, at PSN 0.
fn writable_qp() -> RespState {
    RespState {
        pkey: 0xffff,
        mtu: 4096,
        pd: 1,
        qp_access: xdp_responder::ACCESS_REMOTE_WRITE,
        ..Default::default()
    }
}

/// The verifier proves a placement stays inside the pool from the masks
/// alone; they must never change a value that passed `check_write`.
#[test]
fn pool_masks_change_nothing_that_passed_the_checks() {
    let mut rng = Rng(42);
    for _ in 0..100_000 {
        let len = rng.below(mr_pool::BYTES as u64) + 1;
        let pool_off = rng.below(mr_pool::BYTES as u64 - len + 1);
        let mr = PoolMr {
            rkey: 7,
            pd: 1,
            access: xdp_responder::ACCESS_REMOTE_WRITE,
            valid: 1,
            iova: rng.next_u64() >> 1,
            len,
            pool_off,
        };
        let st = writable_qp();
        let plen = rng.below(4097) as u32;
        let va = mr.iova + rng.below(len + 8192);
        let wr = WriteReq {
            opcode: opcode::RC_RDMA_WRITE_ONLY,
            ack_req: true,
            pkey: 0xffff,
            psn: 0,
            va,
            rkey: 7,
            dma_len: plen,
            plen,
        };
        if let Ok(p) = xdp_responder::check_write(&st, &wr, Some(&mr)) {
            if p.len > 0 {
                // Inside the MR, the MR inside the pool.
                assert!(p.pool_off >= pool_off && p.pool_off + p.len as u64 <= pool_off + len);
                assert_eq!(p.pool_off & mr_pool::MASK, p.pool_off);
                assert!(p.len as usize <= mr_pool::PAGE);
                assert!(p.pool_off as usize + p.len as usize <= mr_pool::VALUE_BYTES);
            }
        }
    }
    // An entry that claims more than the pool is refused, whatever the packet.
    let mr = PoolMr {
        rkey: 7,
        pd: 1,
        access: xdp_responder::ACCESS_REMOTE_WRITE,
        valid: 1,
        iova: 0,
        len: 8192,
        pool_off: mr_pool::BYTES as u64 - 4096,
    };
    let st = writable_qp();
    let wr = WriteReq {
        opcode: opcode::RC_RDMA_WRITE_ONLY,
        pkey: 0xffff,
        va: 4096,
        rkey: 7,
        dma_len: 16,
        plen: 16,
        ..Default::default()
    };
    assert_eq!(
        xdp_responder::check_write(&st, &wr, Some(&mr)),
        Err(punt::NOT_POOL)
    );
}

/// The shared CRC (one byte and eight bytes at a time) and masks equal
/// the ICRC the wire code computes, on a captured rxe frame.
#[test]
fn shared_crc_and_masks_match_the_wire_icrc() {
    let data: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let mut h = crc32fast::Hasher::new();
    h.update(&data);
    let want = h.finalize();
    assert_eq!(!xdp_responder::crc_update(!0, &data), want);
    let mut c = !0u32;
    for ch in data.chunks(8) {
        c = xdp_responder::crc_u64(c, u64::from_le_bytes(ch.try_into().unwrap()));
    }
    assert_eq!(!c, want);
    // A WRITE frame the engine emits: the masked prefix plus the rest.
    let mut b = Bench::new(1024, 0x100, 0x10);
    b.req(
        opcode::RC_RDMA_WRITE_ONLY,
        0x10,
        true,
        reth(b.va(0), b.mr_rkey(), 4),
        b"abcd",
    );
    let mut frames = Vec::new();
    b.n.transmit(b.now, &mut frames);
    let f = &frames[0];
    let l3 = 14;
    let mut crc = !0u32;
    for i in 0..(f.len() - l3 - 4 + 8) {
        let byte = if i < 8 { 0xff } else { f[l3 + i - 8] };
        crc = xdp_responder::crc_byte(crc, xdp_responder::icrc_prefix_byte(i, byte, true));
    }
    assert_eq!(
        !crc,
        u32::from_le_bytes(f[f.len() - 4..].try_into().unwrap())
    );
}

/// The ICRC as the XDP program computes it since it folds (64 bits of
/// ones and the frame from the IP header in one buffer, the variant
/// fields masked a word at a time, then `crc_folded`) equals the ICRC rxe
/// put on every RoCE frame of the captures: IPv4 and IPv6, one-packet and
/// 1 KiB packets, requests and responses.
#[test]
fn folded_icrc_matches_the_captured_frames() {
    use rdma_user::wire::pcap::read_pcap;
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut seen = [0usize; 2];
    for name in [
        "write_lat_2500B.pcap",
        "read_lat_2500B.pcap",
        "write_lat_64B_ipv6.pcap",
        "atomic_lat_fetch_add.pcap",
    ] {
        for f in read_pcap(&dir.join(name)).unwrap() {
            let d = &f.data;
            let (l3, ipv4) = match u16::from_be_bytes([d[12], d[13]]) {
                0x0800 => (14, true),
                0x86dd => (14, false),
                _ => continue,
            };
            let udp = l3 + if ipv4 { 20 } else { 40 };
            if d.len() < udp + 8 + 12 + 4 || u16::from_be_bytes([d[udp + 2], d[udp + 3]]) != 4791 {
                continue;
            }
            let end = udp + u16::from_be_bytes([d[udp + 4], d[udp + 5]]) as usize;
            let mut s = vec![0xffu8; 8];
            s.extend_from_slice(&d[l3..end - 4]);
            s.resize(s.len().max(72), 0);
            for w in 0..8 {
                let m = xdp_responder::ICRC_MASK64[((ipv4 as usize) << 4) | w].to_le_bytes();
                for (b, m) in s[8 + w * 8..16 + w * 8].iter_mut().zip(m) {
                    *b |= m;
                }
            }
            let n = 8 + end - 4 - l3;
            let want = u32::from_le_bytes(d[end - 4..end].try_into().unwrap());
            assert_eq!(!xdp_responder::crc_folded(!0, &s[..n]), want, "{name}");
            seen[ipv4 as usize] += 1;
        }
    }
    assert!(
        seen[0] > 10 && seen[1] > 50,
        "frames checked (IPv6, IPv4): {seen:?}"
    );
}
