//! Seeded simulation of two RC engines over a faulty wire.
//!
//! Invariants checked on every run:
//! - every posted WR completes exactly once, in order, with the right status;
//! - remote memory holds exactly the expected bytes;
//! - every atomic is applied exactly once;
//! - no request completes before the responder has executed it;
//! - with a clean wire there is no retransmission.
//!
//! Replay one seed: `SIM_SEED=N SIM_PROFILE=name cargo test -p rdma-user --test engine_sim replay -- --nocapture`

mod sim;

use std::collections::VecDeque;

use rdma_user::transport::*;
use rdma_user::wire::{psn_diff, MASK_24};
use sim::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Profile {
    Clean,
    Loss,
    Reorder,
    Duplicate,
    Corrupt,
    Combined,
    Heavy,
    Rnr,
}

const PROFILES: [Profile; 8] = [
    Profile::Clean,
    Profile::Loss,
    Profile::Reorder,
    Profile::Duplicate,
    Profile::Corrupt,
    Profile::Combined,
    Profile::Heavy,
    Profile::Rnr,
];

impl Profile {
    fn name(self) -> &'static str {
        match self {
            Profile::Clean => "clean",
            Profile::Loss => "loss",
            Profile::Reorder => "reorder",
            Profile::Duplicate => "duplicate",
            Profile::Corrupt => "corrupt",
            Profile::Combined => "combined",
            Profile::Heavy => "heavy",
            Profile::Rnr => "rnr",
        }
    }
    fn from_name(s: &str) -> Profile {
        *PROFILES
            .iter()
            .find(|p| p.name() == s)
            .unwrap_or_else(|| panic!("unknown SIM_PROFILE {s}"))
    }
    fn faults(self) -> Faults {
        let base = Faults {
            delay: 2_000,
            jitter: 500,
            ..Default::default()
        };
        match self {
            Profile::Clean | Profile::Rnr => base,
            Profile::Loss => Faults { loss: 0.05, ..base },
            Profile::Reorder => Faults {
                reorder: 0.05,
                ..base
            },
            Profile::Duplicate => Faults {
                duplicate: 0.01,
                ..base
            },
            // 0.1 % per frame is rare in a short run; 2 % exercises the path.
            Profile::Corrupt => Faults {
                corrupt: 0.02,
                ..base
            },
            Profile::Combined => Faults {
                loss: 0.05,
                reorder: 0.05,
                duplicate: 0.01,
                corrupt: 0.001,
                ..base
            },
            Profile::Heavy => Faults {
                loss: 0.15,
                reorder: 0.2,
                duplicate: 0.05,
                corrupt: 0.02,
                jitter: 4_000,
                ..base
            },
        }
    }
}

/// Recovery mode of the pair: go-back-N (what every other peer gets),
/// negotiated selective repeat, or selective repeat on one side only (a
/// peer that did not negotiate, or lies: must still deliver exactly once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Gbn,
    Sr,
    Mixed,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Gbn => "gbn",
            Mode::Sr => "sr",
            Mode::Mixed => "mixed",
        }
    }
    fn from_name(s: &str) -> Mode {
        [Mode::Gbn, Mode::Sr, Mode::Mixed]
            .into_iter()
            .find(|m| m.name() == s)
            .unwrap_or_else(|| panic!("unknown SIM_MODE {s}"))
    }
    fn sides(self) -> [bool; 2] {
        match self {
            Mode::Gbn => [false, false],
            Mode::Sr => [true, true],
            Mode::Mixed => [true, false],
        }
    }
}

#[derive(Debug, Default)]
struct Report {
    wrs: u64,
    retransmits: u64,
    frames: u64,
    /// Runs that ended in RETRY_EXC_ERR (heavy profile only).
    exhausted: u64,
}

struct Side {
    pending: VecDeque<Posted>,
    /// SENDs the peer will receive, in order: (data, imm).
    peer_expects: VecDeque<(Vec<u8>, Option<u32>)>,
    /// Recv buffers posted on this side: (wr_id, addr, len).
    recv_bufs: VecDeque<(u64, u64, u32)>,
    recvs_to_post: usize,
    msgs: u32,
    fetch_adds: u64,
    cmp_swaps: u64,
    /// Expected content of the peer's WRITE_AREA.
    peer_write_area: Vec<u8>,
    peer_msn_base: u32,
    /// A fatal error ended this side's work (allowed in the heavy profile).
    failed: bool,
}

const MAX_MSG: u32 = 3 * 4096 + 17;

/// Posts `n` random WRs on `me`; records what each must produce.
#[allow(clippy::too_many_arguments)]
fn post_ops(
    rng: &mut Rng,
    me: &mut Node,
    peer_mr_addr: u64,
    peer_rkey: u32,
    side: &mut Side,
    n: usize,
    mtu: u32,
    wr_base: u64,
) {
    for i in 0..n {
        let wr_id = wr_base + i as u64;
        let kind = rng.below(100);
        let max_len = (rng.below(4) as u32 * mtu + rng.below(mtu as u64 + 20) as u32).min(MAX_MSG);
        let signaled = i + 1 == n || rng.below(4) != 0;
        let mut flags = SendFlags {
            signaled,
            solicited: false,
            fence: rng.below(20) == 0,
        };
        let op;
        let mut sges: Vec<Sge> = Vec::new();
        let mut inline: Option<Vec<u8>> = None;
        let mut wr = SendWr::new(wr_id, WrOpcode::Send, &[]);
        if kind < 35 {
            // WRITE (maybe with immediate) into the peer's write area.
            let len = max_len.min(WRITE_AREA_LEN as u32);
            let off = rng.below(WRITE_AREA_LEN - len as u64 + 1);
            let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            let imm = (rng.below(5) == 0).then(|| rng.next_u64() as u32);
            wr.opcode = if imm.is_some() {
                WrOpcode::RdmaWriteWithImm
            } else {
                WrOpcode::RdmaWrite
            };
            wr.remote_addr = peer_mr_addr + WRITE_AREA + off;
            wr.rkey = peer_rkey;
            wr.imm = imm.unwrap_or(0);
            if len as usize <= MAX_INLINE && rng.below(3) == 0 {
                inline = Some(data.clone());
            } else {
                sges = stage(rng, me, &data);
            }
            let end = off as usize + len as usize;
            side.peer_write_area[off as usize..end].copy_from_slice(&data);
            if let Some(imm) = imm {
                side.peer_expects.push_back((Vec::new(), Some(imm)));
                side.recvs_to_post += 1;
            }
            op = Op::Write { off, data, imm };
        } else if kind < 55 {
            let len = max_len.min(READ_AREA_LEN as u32);
            let off = rng.below(READ_AREA_LEN - len as u64 + 1);
            let local = me.alloc(len as u64);
            wr.opcode = WrOpcode::RdmaRead;
            wr.remote_addr = peer_mr_addr + READ_AREA + off;
            wr.rkey = peer_rkey;
            sges = split(rng, local, len, me.local_lkey);
            op = Op::Read { off, len, local };
        } else if kind < 85 {
            let data: Vec<u8> = (0..max_len).map(|_| rng.next_u64() as u8).collect();
            let imm = (rng.below(4) == 0).then(|| rng.next_u64() as u32);
            wr.opcode = if imm.is_some() {
                WrOpcode::SendWithImm
            } else {
                WrOpcode::Send
            };
            wr.imm = imm.unwrap_or(0);
            flags.solicited = rng.below(2) == 0;
            if data.len() <= MAX_INLINE && rng.below(3) == 0 {
                inline = Some(data.clone());
            } else {
                sges = stage(rng, me, &data);
            }
            side.peer_expects.push_back((data.clone(), imm));
            side.recvs_to_post += 1;
            op = Op::Send { data, imm };
        } else {
            let local = me.alloc(8);
            sges = vec![Sge {
                addr: local,
                length: 8,
                lkey: me.local_lkey,
            }];
            wr.rkey = peer_rkey;
            if kind < 93 {
                wr.opcode = WrOpcode::FetchAdd;
                wr.remote_addr = peer_mr_addr + ATOMIC_AREA;
                wr.compare_add = 1;
                op = Op::FetchAdd {
                    local,
                    expect: side.fetch_adds,
                };
                side.fetch_adds += 1;
            } else {
                wr.opcode = WrOpcode::CmpSwap;
                wr.remote_addr = peer_mr_addr + ATOMIC_AREA + 8;
                wr.compare_add = side.cmp_swaps;
                wr.swap = side.cmp_swaps + 1;
                op = Op::CmpSwap {
                    local,
                    expect: side.cmp_swaps,
                };
                side.cmp_swaps += 1;
            }
        }
        wr.flags = flags;
        wr.sg_list = &[];
        let wr = SendWr {
            sg_list: &sges,
            inline: inline.as_deref(),
            ..wr
        };
        me.qp
            .post_send(&wr)
            .unwrap_or_else(|e| panic!("post_send: {e}"));
        side.msgs += 1;
        side.pending.push_back(Posted {
            wr_id,
            op,
            signaled,
            msg_index: side.msgs,
        });
    }
}

/// Copies `data` into fresh local memory and returns a 1-3 entry SGE list.
fn stage(rng: &mut Rng, me: &mut Node, data: &[u8]) -> Vec<Sge> {
    let a = me.alloc(data.len() as u64);
    me.set_local(a, data);
    split(rng, a, data.len() as u32, me.local_lkey)
}

fn split(rng: &mut Rng, addr: u64, len: u32, lkey: u32) -> Vec<Sge> {
    let parts = 1 + rng.below(3) as u32;
    let mut v = Vec::new();
    let mut done = 0;
    for p in 0..parts {
        let n = if p + 1 == parts {
            len - done
        } else {
            rng.below((len - done) as u64 + 1) as u32
        };
        v.push(Sge {
            addr: addr + done as u64,
            length: n,
            lkey,
        });
        done += n;
    }
    v
}

fn post_recv(me: &mut Node, side: &mut Side, wr_id: u64) {
    let a = me.alloc(MAX_MSG as u64);
    let sg = [
        Sge {
            addr: a,
            length: 100,
            lkey: me.local_lkey,
        },
        Sge {
            addr: a + 100,
            length: MAX_MSG - 100,
            lkey: me.local_lkey,
        },
    ];
    me.qp
        .post_recv(&RecvWr {
            wr_id,
            sg_list: &sg,
        })
        .unwrap();
    side.recv_bufs.push_back((wr_id, a, MAX_MSG));
}

/// Checks one completion against the expectations; `me` is the side whose
/// CQ produced it, `peer` the other node.
fn check_wc(
    wc: Wc,
    me: &Node,
    mine: &mut Side,
    peer_side: &mut Side,
    peer: &Node,
    may_exhaust: bool,
) -> Result<(), String> {
    if mine.failed {
        // After a fatal error, everything left flushes, in order.
        if wc.status != WcStatus::WrFlushErr {
            return Err(format!(
                "WC {} after a fatal error has status {:?}, want WR_FLUSH_ERR",
                wc.wr_id, wc.status
            ));
        }
        if !matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
            let p = mine
                .pending
                .pop_front()
                .ok_or("flush for a WR never posted")?;
            if p.wr_id != wc.wr_id {
                return Err(format!(
                    "flushed {} out of order (expected {})",
                    wc.wr_id, p.wr_id
                ));
            }
        }
        return Ok(());
    }
    if may_exhaust && wc.status == WcStatus::RetryExcErr {
        // Legitimate when the wire loses more than retry_cnt rounds: the WR
        // must be the oldest outstanding one and the QP must be in ERR.
        loop {
            let p = mine
                .pending
                .pop_front()
                .ok_or("RETRY_EXC_ERR for a WR never posted")?;
            if p.wr_id == wc.wr_id {
                break;
            }
            if p.signaled {
                return Err(format!(
                    "RETRY_EXC_ERR for {} before signaled {} completed",
                    wc.wr_id, p.wr_id
                ));
            }
        }
        if me.qp.state() != QpState::Err {
            return Err("retry exhausted but the QP is not in ERR".into());
        }
        mine.failed = true;
        return Ok(());
    }
    if wc.status != WcStatus::Success {
        return Err(format!(
            "QP {:#x}: WC {:?} failed: {}",
            wc.qp_num,
            wc.wr_id,
            wc.status.as_str()
        ));
    }
    if matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
        let (wr_id, addr, _) = mine
            .recv_bufs
            .pop_front()
            .ok_or("receive completion with no RECV posted")?;
        if wr_id != wc.wr_id {
            return Err(format!(
                "RECV completed out of order: got {} want {}",
                wc.wr_id, wr_id
            ));
        }
        let (data, imm) = peer_side
            .peer_expects
            .pop_front()
            .ok_or("unexpected receive")?;
        if wc.imm != imm {
            return Err(format!("RECV {wr_id}: imm {:?} want {imm:?}", wc.imm));
        }
        if wc.opcode == WcOpcode::Recv
            && (wc.byte_len as usize != data.len() || me.local(addr, data.len()) != data[..])
        {
            {
                return Err(format!(
                    "RECV {wr_id}: {} bytes, data mismatch={}",
                    wc.byte_len,
                    wc.byte_len as usize == data.len()
                ));
            }
        }
        return Ok(());
    }
    // In order: unsignaled WRs before it completed silently.
    loop {
        let p = mine.pending.pop_front().ok_or_else(|| {
            format!(
                "completion for {} that was never posted (or twice)",
                wc.wr_id
            )
        })?;
        if p.wr_id != wc.wr_id {
            if p.signaled {
                return Err(format!(
                    "completion for {} before signaled {}",
                    wc.wr_id, p.wr_id
                ));
            }
            continue;
        }
        // The responder must have executed the message already.
        let done = peer.qp.msn().wrapping_sub(mine.peer_msn_base) & MASK_24;
        if done < p.msg_index {
            return Err(format!(
                "WR {} completed before the responder executed it (msn {done} < {})",
                p.wr_id, p.msg_index
            ));
        }
        match p.op {
            Op::Read { off, len, local } => {
                let got = me.local(local, len as usize);
                if (0..len as u64).any(|i| got[i as usize] != read_pattern(off + i)) {
                    return Err(format!("READ {} returned wrong bytes", p.wr_id));
                }
            }
            Op::FetchAdd { local, expect } | Op::CmpSwap { local, expect } => {
                let got = u64::from_ne_bytes(me.local(local, 8).try_into().unwrap());
                if got != expect {
                    return Err(format!(
                        "atomic {} returned {got}, want {expect} (applied twice or lost)",
                        p.wr_id
                    ));
                }
            }
            _ => {}
        }
        return Ok(());
    }
}

// Both nodes and both sides are indexed in step; a range loop says that best.
#[allow(clippy::needless_range_loop)]
fn run(seed: u64, profile: Profile, mode: Mode) -> Result<Report, String> {
    let mut rng = Rng(seed);
    let mtu = [256u32, 512, 1024, 2048, 4096][rng.below(5) as usize];
    let mut psn = || {
        if rng.below(3) == 0 {
            MASK_24 - rng.below(40) as u32
        } else {
            rng.below(1 << 24) as u32
        }
    };
    let (psn_a, psn_b) = (psn(), psn());
    let mut nodes = [
        Node::new(0x11, 0x5500_0000_0000, [10, 0, 0, 1], [10, 0, 0, 2], seed),
        Node::new(
            0x22,
            0x7700_0000_0000,
            [10, 0, 0, 2],
            [10, 0, 0, 1],
            seed + 1,
        ),
    ];
    let rnr_code = if profile == Profile::Rnr { 1 } else { 12 };
    {
        let [a, b] = &mut nodes;
        connect_with(a, b, mtu, psn_a, psn_b, rnr_code, mode.sides());
    }
    let mk_side = || Side {
        pending: VecDeque::new(),
        peer_expects: VecDeque::new(),
        recv_bufs: VecDeque::new(),
        recvs_to_post: 0,
        msgs: 0,
        fetch_adds: 0,
        cmp_swaps: 0,
        peer_write_area: vec![0; WRITE_AREA_LEN as usize],
        peer_msn_base: 0,
        failed: false,
    };
    let mut sides = [mk_side(), mk_side()];
    let counts = [10 + rng.below(40) as usize, rng.below(25) as usize];
    for i in 0..2 {
        let (peer_addr, peer_rkey) = (nodes[1 - i].mr_addr, nodes[1 - i].mr_rkey);
        sides[i].peer_msn_base = nodes[1 - i].qp.msn();
        post_ops(
            &mut rng,
            &mut nodes[i],
            peer_addr,
            peer_rkey,
            &mut sides[i],
            counts[i],
            mtu,
            (i as u64 + 1) << 32,
        );
    }
    // RECVs for the peer's SENDs: all up front, or trickled in to force RNR.
    let mut recv_plan: [VecDeque<u64>; 2] = [VecDeque::new(), VecDeque::new()];
    for i in 0..2 {
        for k in 0..sides[1 - i].recvs_to_post {
            recv_plan[i].push_back(0xf000_0000 + k as u64);
        }
        if profile != Profile::Rnr {
            while let Some(id) = recv_plan[i].pop_front() {
                let (a, b) = sides.split_at_mut(1);
                let side = if i == 0 { &mut a[0] } else { &mut b[0] };
                post_recv(&mut nodes[i], side, id);
            }
        }
    }
    let mut wire = Wire::new(seed, profile.faults());
    let mut now: u64 = 0;
    let mut next_recv_post: u64 = 150_000;
    let limit = 60_000_000_000u64;
    let mut frames = Vec::new();
    let mut steps = 0u64;
    let trace = std::env::var("SIM_TRACE").is_ok();
    let trace_tx = std::env::var("SIM_TRACE").is_ok_and(|v| v == "tx");
    loop {
        steps += 1;
        if steps > 5_000_000 {
            return Err("no end after 5M steps".into());
        }
        while let Some((to, f)) = wire.pop_due(now) {
            if trace {
                trace_frame(now, to, &f);
            }
            nodes[to].receive(now, &f);
            if trace {
                let q = &nodes[to].qp;
                eprintln!(
                    "{:>14} epsn={:06x} msn={} state={} {}",
                    "",
                    q.rq_psn(),
                    q.msn(),
                    q.state(),
                    q.debug_state()
                );
            }
        }
        for (i, n) in nodes.iter_mut().enumerate() {
            if n.qp.poll_timeout().is_some_and(|t| t <= now) {
                n.qp.handle_timeout(now);
                if trace {
                    eprintln!("{now:>10} timeout {} {}", i, n.qp.debug_state());
                }
            }
        }
        if profile == Profile::Rnr && now >= next_recv_post {
            for i in 0..2 {
                if let Some(id) = recv_plan[i].pop_front() {
                    let (a, b) = sides.split_at_mut(1);
                    let side = if i == 0 { &mut a[0] } else { &mut b[0] };
                    post_recv(&mut nodes[i], side, id);
                }
            }
            next_recv_post = now + 60_000;
        }
        for i in 0..2 {
            frames.clear();
            nodes[i].transmit(now, &mut frames);
            for f in frames.drain(..) {
                if trace_tx {
                    eprint!("TX ");
                    trace_frame(now, 1 - i, &f);
                }
                wire.send(now, 1 - i, f);
            }
        }
        for i in 0..2 {
            while let Some(wc) = nodes[i].qp.poll_completion() {
                let (a, b) = sides.split_at_mut(1);
                let (mine, peer_side) = if i == 0 {
                    (&mut a[0], &mut b[0])
                } else {
                    (&mut b[0], &mut a[0])
                };
                check_wc(
                    wc,
                    &nodes[i],
                    mine,
                    peer_side,
                    &nodes[1 - i],
                    profile == Profile::Heavy,
                )?;
            }
        }
        let all_done = if sides.iter().any(|s| s.failed) {
            // After a fatal error: every WR on both sides accounted for
            // (completed or flushed); a peer with nothing outstanding may
            // stay in RTS.
            sides.iter().all(|s| s.pending.iter().all(|p| !p.signaled))
                && nodes.iter().all(|n| n.qp.send_queue_len() == 0)
        } else {
            sides
                .iter()
                .all(|s| s.pending.iter().all(|p| !p.signaled) && s.peer_expects.is_empty())
        };
        if all_done {
            break;
        }
        if now > limit {
            return Err(format!(
                "not done after {} s of simulated time",
                limit / 1_000_000_000
            ));
        }
        let mut next = [
            wire.next_time(),
            nodes[0].qp.poll_timeout(),
            nodes[1].qp.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min();
        if profile == Profile::Rnr && recv_plan.iter().any(|p| !p.is_empty()) {
            next = Some(next.map_or(next_recv_post, |n| n.min(next_recv_post)));
        }
        match next {
            Some(t) => now = t.max(now),
            None => {
                return Err(format!(
                    "stalled: nothing in flight, no timer; pending A={:?} B={:?} states {} {}",
                    queue_of(&sides[0].pending),
                    queue_of(&sides[1].pending),
                    nodes[0].qp.state(),
                    nodes[1].qp.state()
                ))
            }
        }
    }
    if sides.iter().any(|s| s.failed) {
        return Ok(Report {
            wrs: (counts[0] + counts[1]) as u64,
            retransmits: nodes[0].qp.stats().retransmits + nodes[1].qp.stats().retransmits,
            frames: wire.sent,
            exhausted: 1,
        });
    }
    // Final memory: exactly the writes, in order, nothing else.
    for i in 0..2 {
        let peer = &nodes[1 - i];
        let area = &peer.mr()[WRITE_AREA as usize..(WRITE_AREA + WRITE_AREA_LEN) as usize];
        if area != &sides[i].peer_write_area[..] {
            let at = area
                .iter()
                .zip(&sides[i].peer_write_area)
                .position(|(a, b)| a != b)
                .unwrap();
            return Err(format!(
                "node {i}'s writes: peer memory differs at offset {at}"
            ));
        }
        let counters = &peer.mr()[ATOMIC_AREA as usize..ATOMIC_AREA as usize + 16];
        let fa = u64::from_ne_bytes(counters[..8].try_into().unwrap());
        let cs = u64::from_ne_bytes(counters[8..].try_into().unwrap());
        if fa != sides[i].fetch_adds || cs != sides[i].cmp_swaps {
            return Err(format!(
                "atomics applied {fa}/{cs} times, want {}/{}",
                sides[i].fetch_adds, sides[i].cmp_swaps
            ));
        }
        let read_area = &peer.mr()[READ_AREA as usize..(READ_AREA + READ_AREA_LEN) as usize];
        if read_area
            .iter()
            .enumerate()
            .any(|(k, &b)| b != read_pattern(k as u64))
        {
            return Err("a READ changed the memory it read".into());
        }
        if nodes[i].qp.state() != QpState::Rts {
            return Err(format!("node {i} ended in {}", nodes[i].qp.state()));
        }
    }
    let retransmits = nodes[0].qp.stats().retransmits + nodes[1].qp.stats().retransmits;
    let timeouts = nodes[0].qp.stats().timeouts + nodes[1].qp.stats().timeouts;
    if profile.faults().is_clean() && profile != Profile::Rnr && (retransmits > 0 || timeouts > 0) {
        return Err(format!(
            "clean wire but {retransmits} retransmits, {timeouts} timeouts"
        ));
    }
    let _ = psn_diff(0, 0);
    Ok(Report {
        wrs: (counts[0] + counts[1]) as u64,
        retransmits,
        frames: wire.sent,
        exhausted: 0,
    })
}

fn trace_frame(now: u64, to: usize, f: &[u8]) {
    use rdma_user::wire::*;
    match RoceRepr::parse(f) {
        Ok((r, l)) => {
            let t = r.transport;
            eprintln!(
                "{:>10} ->{} {:<34} psn={:06x} ack={} len={} aeth={:?} reth={:?}",
                now,
                if to == 0 { "A" } else { "B" },
                opcode_name(t.bth.opcode),
                t.bth.psn,
                t.bth.ack_req as u8,
                l.payload.len(),
                t.aeth.map(|a| (format!("{:#x}", a.syndrome), a.msn)),
                t.reth.map(|r| r.dma_len)
            )
        }
        Err(e) => eprintln!("{now:>10} ->{to} dropped: {e}"),
    }
}

fn repro(seed: u64, p: Profile, mode: Mode) -> String {
    format!(
        "reproduce with: SIM_SEED={seed} SIM_PROFILE={} SIM_MODE={} cargo test -p rdma-user --test engine_sim replay -- --nocapture",
        p.name(),
        mode.name()
    )
}

/// `SIM_SEEDS=N` runs N seeds per profile instead of the default (a soak).
fn sweep(profile: Profile, default_seeds: u64) {
    sweep_mode(profile, Mode::Gbn, default_seeds)
}

fn sweep_mode(profile: Profile, mode: Mode, default_seeds: u64) {
    let seeds = std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_seeds);
    let mut total = Report::default();
    for seed in 0..seeds {
        match run(seed, profile, mode) {
            Ok(r) => {
                total.wrs += r.wrs;
                total.retransmits += r.retransmits;
                total.frames += r.frames;
                total.exhausted += r.exhausted;
            }
            Err(e) => panic!(
                "seed {seed} profile {} mode {}: {e}\n{}",
                profile.name(),
                mode.name(),
                repro(seed, profile, mode)
            ),
        }
    }
    eprintln!(
        "{:>9} {:>5}: {seeds} seeds, {} WRs, {} frames, {} retransmits, {} runs ended in RETRY_EXC_ERR",
        profile.name(),
        mode.name(),
        total.wrs,
        total.frames,
        total.retransmits,
        total.exhausted
    );
    // Exhaustion is the spec's answer to a wire that loses too many rounds
    // in a row; at these rates it must stay rare.
    assert!(
        total.exhausted * 200 <= seeds,
        "{} of {seeds} runs exhausted retries",
        total.exhausted
    );
    assert!(total.wrs > seeds * 10);
    if profile != Profile::Clean && profile != Profile::Rnr && profile != Profile::Duplicate {
        assert!(
            total.retransmits > 0,
            "{} never retransmitted: faults not exercised",
            profile.name()
        );
    }
}

const SEEDS: u64 = 1000;

#[test]
fn clean() {
    sweep(Profile::Clean, SEEDS);
}
#[test]
fn loss() {
    sweep(Profile::Loss, SEEDS);
}
#[test]
fn reorder() {
    sweep(Profile::Reorder, SEEDS);
}
#[test]
fn duplicate() {
    sweep(Profile::Duplicate, SEEDS);
}
#[test]
fn corrupt() {
    sweep(Profile::Corrupt, SEEDS);
}
#[test]
fn combined() {
    sweep(Profile::Combined, SEEDS);
}
#[test]
fn heavy() {
    sweep(Profile::Heavy, SEEDS / 2);
}
#[test]
fn rnr() {
    sweep(Profile::Rnr, SEEDS / 4);
}

/// Runs the single seed named by SIM_SEED / SIM_PROFILE (see the module doc).
#[test]
fn replay() {
    let (Ok(seed), Ok(p)) = (std::env::var("SIM_SEED"), std::env::var("SIM_PROFILE")) else {
        return;
    };
    let seed: u64 = seed.parse().expect("SIM_SEED is a number");
    let p = Profile::from_name(&p);
    let mode = Mode::from_name(&std::env::var("SIM_MODE").unwrap_or_else(|_| "gbn".into()));
    match run(seed, p, mode) {
        Ok(r) => eprintln!("seed {seed} {} {}: ok {r:?}", p.name(), mode.name()),
        Err(e) => panic!("seed {seed} {} {}: {e}", p.name(), mode.name()),
    }
}

/// Selective repeat between a negotiated pair: every profile, the same
/// invariants.
#[test]
fn selective_repeat_every_profile() {
    for p in PROFILES {
        let seeds = match p {
            Profile::Heavy => SEEDS / 2,
            Profile::Rnr => SEEDS / 4,
            _ => SEEDS,
        };
        sweep_mode(p, Mode::Sr, seeds);
    }
}

/// One side selective, the other go-back-N (a peer that never negotiated,
/// or one that lies about it): slower, still exactly once.
#[test]
fn selective_repeat_against_go_back_n() {
    for p in PROFILES {
        sweep_mode(p, Mode::Mixed, SEEDS / 4);
    }
}
