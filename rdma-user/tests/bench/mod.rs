//! A QP under test against a scripted peer: deliver crafted requests and
//! responses, look at what our QP sends and completes.

#![allow(dead_code)]

use rdma_user::memory::Access;
use rdma_user::transport::*;
use rdma_user::wire::*;

use crate::sim::*;

pub const A_QPN: u32 = 0x11;
pub const B_QPN: u32 = 0x19;

/// A node under test plus a handle to craft what "the peer" sends.
pub struct Bench {
    pub n: Node,
    pub now: u64,
}

impl Bench {
    /// Our QP `B_QPN`, connected to a scripted peer `A_QPN`.
    pub fn new(mtu: u32, our_psn: u32, peer_psn: u32) -> Bench {
        Self::with(mtu, our_psn, peer_psn, |_| {})
    }

    pub fn with(mtu: u32, our_psn: u32, peer_psn: u32, tweak: impl Fn(&mut QpAttr)) -> Bench {
        Self::build(mtu, our_psn, peer_psn, false, tweak)
    }

    /// As [`Bench::new`], recovering by selective repeat (as if both
    /// sides had offered it in the connection exchange).
    pub fn selective(mtu: u32, our_psn: u32, peer_psn: u32) -> Bench {
        Self::build(mtu, our_psn, peer_psn, true, |_| {})
    }

    fn build(
        mtu: u32,
        our_psn: u32,
        peer_psn: u32,
        selective_repeat: bool,
        tweak: impl Fn(&mut QpAttr),
    ) -> Bench {
        let mut n = Node::new(B_QPN, 0x5000_0000, [10, 0, 0, 2], [10, 0, 0, 1], 9);
        let q = &mut n.qp;
        q.modify(&QpAttr::init(Access::ALL)).unwrap();
        q.set_selective_repeat(selective_repeat).unwrap();
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
    pub fn req(
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
    pub fn out(&mut self) -> Vec<(TransportRepr, Vec<u8>)> {
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

    pub fn mr_rkey(&self) -> u32 {
        self.n.mr_rkey
    }
    pub fn va(&self, off: u64) -> u64 {
        self.n.mr_addr + off
    }
    /// Posts a RECV of a fresh `len`-byte local buffer; returns its address.
    pub fn recv(&mut self, wr_id: u64, len: u32) -> u64 {
        let addr = self.n.alloc(len as u64);
        let sg = [Sge {
            addr,
            length: len,
            lkey: self.n.local_lkey,
        }];
        self.n
            .qp
            .post_recv(&RecvWr {
                wr_id,
                sg_list: &sg,
            })
            .unwrap();
        addr
    }

    pub fn wcs(&mut self) -> Vec<Wc> {
        std::iter::from_fn(|| self.n.qp.poll_completion()).collect()
    }
}

pub fn reth(va: u64, rkey: u32, len: u32) -> impl FnOnce(&mut TransportRepr) {
    move |t| {
        t.reth = Some(RethRepr {
            va,
            rkey,
            dma_len: len,
        })
    }
}

pub fn atomic_eth(
    va: u64,
    rkey: u32,
    swap_add: u64,
    compare: u64,
) -> impl FnOnce(&mut TransportRepr) {
    move |t| {
        t.atomic_eth = Some(AtomicEthRepr {
            va,
            rkey,
            swap_add,
            compare,
        })
    }
}

pub fn none(_: &mut TransportRepr) {}

pub fn aeth_of(t: &TransportRepr) -> (u8, u32) {
    let a = t.aeth.expect("AETH");
    (a.syndrome, t.bth.psn)
}
