//! A deterministic two-node simulator for the RC engine: the engines exchange
//! complete RoCEv2 frames (headers, ICRC) over a simulated wire with seeded
//! loss, reordering, duplication, corruption and delay.

#![allow(dead_code)]

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use rdma_user::memory::{Access, MrTable};
use rdma_user::transport::*;
use rdma_user::wire::*;

pub use rdma_user::rng::Rng;

#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    pub loss: f64,
    pub reorder: f64,
    pub duplicate: f64,
    pub corrupt: f64,
    /// Base one-way delay and jitter, ns.
    pub delay: u64,
    pub jitter: u64,
}

impl Faults {
    pub fn none() -> Faults {
        Faults {
            delay: 2_000,
            ..Default::default()
        }
    }
    pub fn is_clean(&self) -> bool {
        self.loss == 0.0 && self.reorder == 0.0 && self.duplicate == 0.0 && self.corrupt == 0.0
    }
}

pub const PD: u32 = 1;
/// Layout of each node's MR: peers write into WRITE_AREA, read READ_AREA
/// (a fixed pattern nobody writes) and run atomics on ATOMIC_AREA.
pub const WRITE_AREA: u64 = 0;
pub const WRITE_AREA_LEN: u64 = 16 * 1024;
pub const READ_AREA: u64 = 16 * 1024;
pub const READ_AREA_LEN: u64 = 16 * 1024;
pub const ATOMIC_AREA: u64 = 32 * 1024;
pub const MR_LEN: usize = 32 * 1024 + 64;
pub const LOCAL_LEN: usize = 2 * 1024 * 1024;

pub struct Node {
    pub qp: QpEngine,
    pub mem: MrTable,
    pub mr_lkey: u32,
    pub mr_rkey: u32,
    pub mr_addr: u64,
    pub local_lkey: u32,
    pub local_addr: u64,
    pub net: RoceRepr,
    local_next: u64,
}

pub fn read_pattern(i: u64) -> u8 {
    (i.wrapping_mul(31) ^ (i >> 7)) as u8
}

impl Node {
    pub fn new(qpn: u32, addr_base: u64, ip: [u8; 4], peer_ip: [u8; 4], seed: u64) -> Node {
        let mut mem = MrTable::new(16, seed);
        let mr_addr = addr_base;
        let (mr_lkey, mr_rkey) = mem.register_heap(PD, MR_LEN, mr_addr, Access::ALL).unwrap();
        let local_addr = addr_base + 0x100_0000;
        let (local_lkey, _) = mem
            .register_heap(PD, LOCAL_LEN, local_addr, Access::LOCAL_WRITE)
            .unwrap();
        {
            let pattern: Vec<u8> = (0..READ_AREA_LEN).map(read_pattern).collect();
            mem.by_lkey_mut(mr_lkey)
                .unwrap()
                .write(READ_AREA as usize, &pattern);
        }
        let net = RoceRepr {
            eth: EthernetRepr {
                dst: [2, 0, 0, 0, 0, peer_ip[3]],
                src: [2, 0, 0, 0, 0, ip[3]],
                vlan_tci: None,
                ethertype: ETH_P_IPV4,
            },
            ip: IpRepr::V4(Ipv4Repr {
                src: ip,
                dst: peer_ip,
                ..Default::default()
            }),
            udp: UdpRepr {
                src_port: 0xc000,
                dst_port: ROCE_V2_UDP_PORT,
                checksum: 0,
            },
            transport: TransportRepr::default(),
        };
        Node {
            qp: QpEngine::new(
                qpn,
                PD,
                QpCap {
                    max_send_wr: 512,
                    max_recv_wr: 512,
                },
            ),
            mem,
            mr_lkey,
            mr_rkey,
            mr_addr,
            local_lkey,
            local_addr,
            net,
            local_next: 0,
        }
    }

    /// A fresh slice of local memory (never reused within a run).
    pub fn alloc(&mut self, len: u64) -> u64 {
        let a = self.local_addr + self.local_next;
        self.local_next += len.div_ceil(8) * 8 + 8;
        assert!(
            self.local_next <= LOCAL_LEN as u64,
            "sim ran out of local memory"
        );
        a
    }

    /// A copy of `len` bytes of the local buffer at `addr`.
    pub fn local(&self, addr: u64, len: usize) -> Vec<u8> {
        let off = (addr - self.local_addr) as usize;
        self.mem
            .by_lkey(self.local_lkey)
            .unwrap()
            .read_vec(off, len)
    }

    /// Writes `data` into the local buffer at `addr`.
    pub fn set_local(&mut self, addr: u64, data: &[u8]) {
        let off = (addr - self.local_addr) as usize;
        self.mem
            .by_lkey_mut(self.local_lkey)
            .unwrap()
            .write(off, data);
    }

    /// A copy of the whole target MR.
    pub fn mr(&self) -> Vec<u8> {
        let m = self.mem.by_lkey(self.mr_lkey).unwrap();
        m.read_vec(0, m.len())
    }

    /// Writes `data` into the target MR at `offset`.
    pub fn set_mr(&mut self, offset: usize, data: &[u8]) {
        self.mem
            .by_lkey_mut(self.mr_lkey)
            .unwrap()
            .write(offset, data);
    }

    /// Drains everything the QP wants to send, as complete frames.
    pub fn transmit(&mut self, now: Nanos, out: &mut Vec<Vec<u8>>) {
        let hl = self.net.net_header_len();
        loop {
            let mut buf = vec![0u8; hl + self.qp.max_segment_len() + ICRC_LEN];
            let Some(tx) = self.qp.poll_transmit(now, &self.mem, &mut buf[hl..]) else {
                break;
            };
            let len = self
                .net
                .emit_net_and_icrc(&mut buf, tx.len + ICRC_LEN)
                .unwrap();
            buf.truncate(len);
            out.push(buf);
        }
    }

    /// Parses a frame as the data path would, and hands it to the QP.
    pub fn receive(&mut self, now: Nanos, frame: &[u8]) -> bool {
        match RoceRepr::parse(frame) {
            Ok((repr, layout)) => {
                if repr.transport.bth.dest_qpn != self.qp.qpn() {
                    return false;
                }
                self.qp.handle_packet(
                    now,
                    &repr.transport,
                    &frame[layout.payload.clone()],
                    &mut self.mem,
                );
                true
            }
            Err(_) => false,
        }
    }
}

/// Moves both QPs to RTS, connected to each other.
pub fn connect(a: &mut Node, b: &mut Node, mtu: u32, psn_a: u32, psn_b: u32, rnr_timer: u8) {
    connect_with(a, b, mtu, psn_a, psn_b, rnr_timer, [false, false]);
}

/// As [`connect`], with selective repeat on for the sides `sr` names (both
/// for a negotiated pair; one alone is a misconfigured or lying peer).
pub fn connect_with(
    a: &mut Node,
    b: &mut Node,
    mtu: u32,
    psn_a: u32,
    psn_b: u32,
    rnr_timer: u8,
    sr: [bool; 2],
) {
    let (qa, qb) = (a.qp.qpn(), b.qp.qpn());
    for (n, peer_qpn, sq, rq, sr) in [
        (&mut *a, qb, psn_a, psn_b, sr[0]),
        (&mut *b, qa, psn_b, psn_a, sr[1]),
    ] {
        n.qp.modify(&QpAttr {
            qp_state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            qp_access_flags: Some(Access::ALL),
            ..Default::default()
        })
        .unwrap();
        n.qp.set_selective_repeat(sr).unwrap();
        n.qp.modify(&QpAttr {
            qp_state: Some(QpState::Rtr),
            dest_gid: Some([0; 16]),
            path_mtu: Some(mtu),
            dest_qp_num: Some(peer_qpn),
            rq_psn: Some(rq),
            max_dest_rd_atomic: Some(4),
            min_rnr_timer: Some(rnr_timer),
            ..Default::default()
        })
        .unwrap();
        n.qp.modify(&QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(sq),
            // 4.096 us * 2^8 = 1 ms
            timeout: Some(8),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(4),
            ..Default::default()
        })
        .unwrap();
    }
}

/// (delivery time, sequence number, destination node, frame)
type InFlight = (u64, u64, usize, Vec<u8>);

/// Frames in flight, ordered by delivery time, then by a sequence number so
/// that ties resolve the same way every run.
pub struct Wire {
    pub rng: Rng,
    pub faults: Faults,
    heap: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    /// Latest in-order delivery time per destination: a link is FIFO, so
    /// jitter delays but never reorders; only the reorder fault does.
    last: [u64; 2],
    pub sent: u64,
    pub lost: u64,
    pub corrupted: u64,
    pub duplicated: u64,
    pub reordered: u64,
}

impl Wire {
    pub fn new(seed: u64, faults: Faults) -> Wire {
        Wire {
            rng: Rng(seed ^ 0xdead_beef),
            faults,
            heap: BinaryHeap::new(),
            seq: 0,
            last: [0; 2],
            sent: 0,
            lost: 0,
            corrupted: 0,
            duplicated: 0,
            reordered: 0,
        }
    }

    pub fn send(&mut self, now: u64, to: usize, mut frame: Vec<u8>) {
        self.sent += 1;
        let f = self.faults;
        if self.rng.chance(f.loss) {
            self.lost += 1;
            return;
        }
        if self.rng.chance(f.corrupt) {
            let i = self.rng.below(frame.len() as u64) as usize;
            frame[i] ^= 1 << self.rng.below(8);
            self.corrupted += 1;
        }
        let copies = if self.rng.chance(f.duplicate) {
            self.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut t = now + f.delay + self.rng.below(f.jitter + 1);
            if self.rng.chance(f.reorder) {
                self.reordered += 1;
                t += f.delay * (2 + self.rng.below(8));
            } else {
                t = t.max(self.last[to]);
                self.last[to] = t;
            }
            self.seq += 1;
            self.heap.push(Reverse((t, self.seq, to, frame.clone())));
        }
    }

    pub fn next_time(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse((t, ..))| *t)
    }

    pub fn pop_due(&mut self, now: u64) -> Option<(usize, Vec<u8>)> {
        if self.next_time()? <= now {
            let Reverse((_, _, to, f)) = self.heap.pop()?;
            Some((to, f))
        } else {
            None
        }
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

/// One operation of the workload and what it must produce.
#[derive(Clone, Debug)]
pub enum Op {
    Write {
        off: u64,
        data: Vec<u8>,
        imm: Option<u32>,
    },
    Read {
        off: u64,
        len: u32,
        local: u64,
    },
    Send {
        data: Vec<u8>,
        imm: Option<u32>,
    },
    FetchAdd {
        local: u64,
        expect: u64,
    },
    CmpSwap {
        local: u64,
        expect: u64,
    },
}

#[derive(Clone, Debug)]
pub struct Posted {
    pub wr_id: u64,
    pub op: Op,
    pub signaled: bool,
    /// The peer's message count (MSN) this WR's completion implies.
    pub msg_index: u32,
}

pub fn queue_of(v: &VecDeque<Posted>) -> Vec<u64> {
    v.iter().map(|p| p.wr_id).collect()
}
