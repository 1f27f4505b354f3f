//! Unreliable Datagram (IBA 9.8, rxe's UD paths in `rxe_req.c` and
//! `rxe_resp.c`): a UD QP sends each SEND as one packet with a DETH to
//! whatever QP its WR names, and takes any datagram with its Q_Key. There
//! are no ACKs, no PSN checks and no retransmission: a lost datagram is
//! lost, and a datagram that finds no receive WR is dropped and counted.
//!
//! # Receive checks (UD)
//!
//! | check | action | counter |
//! |---|---|---|
//! | a CNP (0x81, or 0x80): DCQCN's reaction point, as for RC | the QP's rate is cut | `qp.rp_cnp_handled` / `rp_cnp_ignored` |
//! | opcode is UD SEND ONLY (with or without immediate) | drop | `qp.wrong_transport` |
//! | P_Key matches | drop | `qp.bad_pkey` |
//! | QP in RTR, RTS or SQD | drop | `qp.dropped` |
//! | DETH Q_Key = the QP's (IBA 10.2.5) | drop | `qp.bad_qkey` |
//! | a receive WR is posted | drop (no RNR on UD) | `qp.no_recv_wqe` |
//! | GRH + payload fit the receive WR | the WR completes LOC_LEN_ERR, nothing past its buffers is written; the QP stays usable | `qp.errors` |
//! | the receive WR's lkeys are valid | the WR completes LOC_PROT_ERR | `qp.errors` |
//!
//! A receive error does not move a UD QP to the error state (rxe's class D
//! errors for UD complete the WQE and go on): a datagram anyone can send
//! must not be able to kill the QP.
//!
//! A CE-marked datagram makes the QP send a CNP to its source (the DETH's
//! QPN, at the frame's source addresses), at most one per
//! `np_min_time_between_cnps`; a UD QP's sends are paced by its DCQCN rate
//! as an RC QP's are.
//!
//! Multicast (`ibv_attach_mcast`) is not offered.

use super::*;

/// The Global Route Header every UD receive buffer starts with.
pub const GRH_LEN: usize = 40;

/// The GRH a UD receive writes for a datagram whose IP header starts
/// `ip`, as rxe writes it for RoCEv2: an IPv6 header as is; for IPv4, 20
/// zero bytes and then the IPv4 header (`ibv_init_ah_from_wc` finds it
/// there).
pub fn grh_of(ip: &[u8]) -> [u8; GRH_LEN] {
    let mut g = [0u8; GRH_LEN];
    match ip.first().map(|b| b >> 4) {
        Some(4) if ip.len() >= 20 => g[20..].copy_from_slice(&ip[..20]),
        Some(6) if ip.len() >= GRH_LEN => g.copy_from_slice(&ip[..GRH_LEN]),
        _ => {}
    }
    g
}

impl QpEngine {
    /// UD: the address handle the next datagram goes to, if one can go now
    /// (the driver builds its network headers in front of the segment).
    pub fn next_ah(&self) -> Option<u32> {
        if self.qp_type != QpType::Ud || !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return None;
        }
        let w = self.req.sq.front()?;
        Some(self.req.ud_dests[w.inline_slot as usize].ah)
    }

    /// The next UD send: one packet, and the WR completes as it leaves
    /// (UD waits for no answer). Returns its length and address handle.
    pub(super) fn poll_datagram(&mut self, mem: &MrTable, buf: &mut [u8]) -> Option<(usize, u32)> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return None;
        }
        loop {
            let w = self.req.sq.pop_front()?;
            let dest = self.req.ud_dests[w.inline_slot as usize];
            let psn = self.req.next_psn;
            self.req.next_psn = psn_add(psn, 1);
            if w.length > self.mtu {
                // C10-93.1.1: no packet, and no error either (rxe fakes a
                // successful send the same way).
                self.stats.oversize_sends += 1;
                self.push_send_wc(&w, WcStatus::Success, false);
                continue;
            }
            let with_imm = w.opcode == WrOpcode::SendWithImm;
            let opc = if with_imm {
                opcode::UD_SEND_ONLY_WITH_IMMEDIATE
            } else {
                opcode::UD_SEND_ONLY
            };
            let mut t = TransportRepr::new(BthRepr {
                opcode: opc,
                solicited: w.flags.solicited,
                pad_count: pad_for(w.length as usize) as u8,
                pkey: self.pkey,
                dest_qpn: dest.remote_qpn & MASK_24,
                psn,
                ..Default::default()
            });
            // IBA 10.2.5: a WR Q_Key with the high bit set means the QP's.
            let qkey = if dest.remote_qkey & 0x8000_0000 != 0 {
                self.qkey
            } else {
                dest.remote_qkey
            };
            t.deth = Some(DethRepr {
                qkey,
                src_qpn: self.qpn,
            });
            if with_imm {
                t.imm = Some(w.imm);
            }
            let hl = t.header_len();
            let len = w.length as usize;
            let inline = &self.req.inline_bufs[w.inline_slot as usize][..w.inline_len as usize];
            Self::gather(&w, inline, mem, self.pd, 0, &mut buf[hl..hl + len]);
            let n = Self::emit(&t, len, buf);
            self.push_send_wc(&w, WcStatus::Success, false);
            return Some((n, dest.ah));
        }
    }

    /// One received datagram for this UD QP, with the GRH its receive
    /// buffer starts with ([`grh_of`] its IP header). The frame's ICRC and
    /// lengths have been checked by the parser.
    pub fn handle_datagram(
        &mut self,
        now: Nanos,
        t: &TransportRepr,
        grh: &[u8; GRH_LEN],
        payload: &[u8],
        mem: &mut MrTable,
    ) {
        self.stats.rx_packets += 1;
        self.stats.rx_bytes += payload.len() as u64;
        let opc = t.bth.opcode;
        if self.qp_type == QpType::Ud && matches!(opc, opcode::CNP | opcode::CNP_LEGACY) {
            // The reaction point, as for RC: the QP's datagrams slow down.
            self.handle_cnp(now);
            return;
        }
        if self.qp_type != QpType::Ud
            || !(opc == opcode::UD_SEND_ONLY || opc == opcode::UD_SEND_ONLY_WITH_IMMEDIATE)
        {
            self.stats.wrong_transport += 1;
            return;
        }
        if !pkey_matches(self.pkey, t.bth.pkey) {
            self.stats.bad_pkey += 1;
            return;
        }
        if !matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
            self.stats.dropped += 1;
            return;
        }
        let Some(deth) = t.deth else {
            self.stats.wrong_transport += 1;
            return;
        };
        if deth.qkey != self.qkey {
            self.stats.bad_qkey += 1;
            return;
        }
        let Some(r) = self.resp.rq.pop_front() else {
            self.stats.no_recv_wqe += 1;
            return;
        };
        let sges = &r.sges[..r.num_sge as usize];
        let placed = Self::scatter(sges, mem, self.pd, 0, grh)
            .and_then(|()| Self::scatter(sges, mem, self.pd, GRH_LEN, payload));
        let status = match placed {
            Ok(()) => WcStatus::Success,
            Err(st) => {
                self.stats.errors += 1;
                st
            }
        };
        let ok = status == WcStatus::Success;
        self.completions.push_back(Wc {
            wr_id: r.wr_id,
            status,
            opcode: WcOpcode::Recv,
            byte_len: if ok {
                (GRH_LEN + payload.len()) as u32
            } else {
                0
            },
            imm: if ok { t.imm } else { None },
            qp_num: self.qpn,
            solicited: t.bth.solicited,
            src_qp: deth.src_qpn,
            grh: ok.then_some(if grh[0] >> 4 == 6 {
                NetworkType::Ipv6
            } else {
                NetworkType::Ipv4
            }),
        });
    }
}
