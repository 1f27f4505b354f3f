//! Packets in and out of the engines: a received frame to its QP (or to
//! the CM for QP1), the engines' timers, and the next frame to transmit
//! with its network headers.

use std::net::IpAddr;

use rdma_common::OpFlags;

use super::xdp_responder;
use super::{Core, Path, Result};
use crate::transport::{grh_of, Nanos, QpState, QpType, TxOrder, WcOpcode};
use crate::wire::gid_of;
use crate::wire::{udp_sport_for_ud, IpRepr, RoceRepr, WireError, ICRC_LEN};

/// The longest network header a frame gets: Ethernet, one VLAN tag,
/// IPv6, UDP.
const MAX_NET_HEADER_LEN: usize = 14 + 4 + 40 + 8;

/// The network headers that answer a received frame: its addresses and
/// its UDP source port (the flow's) reversed, to RoCEv2's port.
fn reply_headers(r: &RoceRepr) -> Option<RoceRepr> {
    let (local_ip, peer_ip) = match r.ip {
        IpRepr::V4(ip) => (IpAddr::from(ip.dst), IpAddr::from(ip.src)),
        IpRepr::V6(ip) => (IpAddr::from(ip.dst), IpAddr::from(ip.src)),
    };
    let path = Path {
        local_mac: r.eth.dst,
        peer_mac: r.eth.src,
        local_ip,
        peer_ip,
        vlan: r.eth.vlan_tci,
        traffic_class: 0,
    };
    let mut net = path.template(0, 0).ok()?;
    net.udp.src_port = r.udp.src_port;
    Some(net)
}

/// Emits a CNP's network headers: the CNP DSCP, Not-ECT; the template's
/// own traffic class is restored after.
fn emit_cnp(net: &mut RoceRepr, dscp: u8, buf: &mut [u8], tl: usize) -> Result<usize, WireError> {
    let saved = net.ip.traffic_class();
    net.ip.set_traffic_class(dscp << 2);
    let r = net.emit_net_and_icrc(buf, tl);
    net.ip.set_traffic_class(saved);
    r
}

impl Core {
    /// One received frame: parse, check it is for a QP we have and from its
    /// peer, hand it to the engine.
    pub fn handle_frame(&mut self, now: Nanos, frame: &[u8]) {
        self.stats.rx_frames += 1;
        // Used in place: moving the repr out of its Result copies it.
        let parsed = RoceRepr::parse(frame);
        let (repr, layout) = match &parsed {
            Ok(x) => x,
            Err(e) => return self.stats.count(*e),
        };
        let qpn = repr.transport.bth.dest_qpn;
        if qpn == 1 {
            // QP1: a MAD for the CM (checked and queued, not run here).
            match &self.gsi {
                Some(g) => g.deliver(repr, &frame[layout.payload.clone()], reply_headers(repr)),
                None => self.stats.rx_unknown_qpn += 1,
            }
            return;
        }
        let Some(slot) = self.qps.get_mut(&qpn) else {
            self.stats.rx_unknown_qpn += 1;
            return;
        };
        if let Some(p) = &slot.path {
            if repr.ip.src_gid() != gid_of(p.peer_ip) {
                self.stats.rx_wrong_source += 1;
                return;
            }
        }
        if let Some(srq) = &slot.srq {
            // A message that consumes a receive WR, for a QP that has none
            // queued (so at most one sits in a QP, and no QP holds WRs
            // another needs): take the SRQ's next. Empty, the engine sends
            // an RNR NAK as for an empty receive queue.
            let f = repr.transport.flags();
            let consumes = f.has(OpFlags::SEND) || (f.has(OpFlags::WRITE) && f.has(OpFlags::IMM));
            let receiving = matches!(slot.qp.state(), QpState::Rtr | QpState::Rts | QpState::Sqd);
            if consumes && receiving && slot.qp.recv_queue_len() == 0 {
                if let Some(w) = srq.take(self.async_events.as_deref()) {
                    if slot.qp.post_recv(&w.as_wr()).is_err() {
                        slot.qp.push_error_wc(w.wr_id, WcOpcode::Recv);
                    }
                }
            }
        }
        let payload = &frame[layout.payload.clone()];
        if repr.ip.traffic_class() & 3 == 3 {
            // CE (ECN 11): the notification point decides on a CNP.
            let decided = slot.qp.handle_ce(now, &repr.transport);
            if decided && slot.qp.qp_type() == QpType::Ud {
                // A UD QP has no path of its own: its CNP answers the
                // marked datagram, over the frame's addresses reversed.
                slot.net = reply_headers(repr);
            }
        }
        if slot.qp.qp_type() == QpType::Ud {
            let grh = grh_of(&frame[layout.l3..]);
            slot.qp
                .handle_datagram(now, &repr.transport, &grh, payload, &mut self.mem);
        } else {
            let f = repr.transport.flags();
            let remote_access = f.has(OpFlags::REQUEST)
                && ((f.has(OpFlags::WRITE) && !f.has(OpFlags::IMM))
                    || f.any(OpFlags::READ_REQUEST | OpFlags::ATOMIC));
            // A WRITE that carries no bytes (UCX's flush is a zero-length
            // WRITE) changes no memory a program could be watching, so
            // it leaves the program's polls in charge of the QP's frames.
            let touches_memory = !payload.is_empty() || !f.has(OpFlags::WRITE);
            if remote_access && touches_memory {
                slot.last_remote_access = Some(now);
            }
            if f.any(OpFlags::REQUEST | OpFlags::RESERVED) {
                self.stats.rx_requests += 1;
                slot.lend
                    .request_at_engine(now, remote_access, slot.lend.lent);
                if slot.lend.lent {
                    // A request XDP left to us (or one already on its way
                    // when the QP was lent): the engine first takes the
                    // responder's state back.
                    if let Some(r) = &self.xdp_responder {
                        xdp_responder::take_back(r, slot);
                    }
                    self.lend_pending = true;
                }
            }
            slot.qp
                .handle_packet(now, &repr.transport, payload, &mut self.mem);
            Self::settle(self.xdp_responder.as_ref(), slot);
        }
        Self::drain_wcs(
            slot,
            &mut self.cqs,
            &mut self.stats,
            self.async_events.as_deref(),
        );
    }
    /// Fires due timers; returns the earliest pending deadline.
    pub fn handle_timers(&mut self, now: Nanos) -> Option<Nanos> {
        let mut next: Option<Nanos> = None;
        for slot in self.qps.values_mut() {
            if let Some(t) = slot.qp.poll_timeout() {
                if t <= now {
                    slot.qp.handle_timeout(now);
                    Self::settle(self.xdp_responder.as_ref(), slot);
                    Self::drain_wcs(
                        slot,
                        &mut self.cqs,
                        &mut self.stats,
                        self.async_events.as_deref(),
                    );
                }
            }
            if let Some(t) = slot.qp.poll_timeout() {
                next = Some(next.map_or(t, |n: Nanos| n.min(t)));
            }
        }
        next
    }
    /// Whether the last [`Core::build_frame`] found a QP with packets
    /// that only DCQCN's pacing holds back.
    pub fn tx_paced(&self) -> bool {
        self.tx_paced
    }

    /// The next frame of any QP, round robin, into `buf`: its length, 0 for
    /// nothing, or `xsk::NEEDS_LARGER` when only QPs whose frames do not
    /// fit `buf` may have something.
    pub fn build_frame(&mut self, now: Nanos, buf: &mut [u8]) -> usize {
        self.build_frame_ordered(now, buf, TxOrder::ResponsesFirst)
    }

    /// [`Core::build_frame`], each QP's packets taken in the order `order`
    /// says (see `datapath::Turn`).
    pub fn build_frame_ordered(&mut self, now: Nanos, buf: &mut [u8], order: TxOrder) -> usize {
        if let Some(g) = self.gsi.as_deref().filter(|g| g.has_tx()) {
            // The CM's MADs first: few, and a connection waits on each.
            match g.build_frame(buf) {
                Ok(0) => {}
                Ok(n) => return n,
                Err(_) => self.stats.tx_emit_errors += 1,
            }
        }
        let n = self.qp_order.len();
        let mut too_small = false;
        self.tx_paced = false;
        for i in 0..n {
            let idx = (self.rr + i) % n;
            let qpn = self.qp_order[idx];
            let Some(slot) = self.qps.get_mut(&qpn) else {
                continue;
            };
            // Where the segment goes decides where it starts: after the
            // QP's headers (RC) or its next datagram's address handle's
            // (UD; one destroyed meanwhile: the longest, then dropped).
            let hl = match (slot.qp.qp_type(), &slot.net) {
                (QpType::Rc, Some(net)) => net.net_header_len(),
                (QpType::Rc, None) => continue,
                // A UD QP's CNP goes back the way its marked datagram came.
                (QpType::Ud, Some(net)) if slot.qp.cnp_due() => net.net_header_len(),
                (QpType::Ud, _) => match slot.qp.next_ah() {
                    Some(ah) => self
                        .ahs
                        .get(&ah)
                        .map_or(MAX_NET_HEADER_LEN, |n| n.net_header_len()),
                    None => continue,
                },
            };
            if buf.len() < hl + slot.qp.max_segment_len() + ICRC_LEN {
                too_small = true;
                continue;
            }
            if let Some(tx) = slot
                .qp
                .poll_transmit_ordered(now, &self.mem, &mut buf[hl..], order)
            {
                let net = match tx.ah {
                    None => slot.net.as_mut(),
                    Some(ah) => {
                        let n = self.ahs.get_mut(&ah);
                        if let Some(n) = n {
                            // A UD packet's UDP port is its sending QP's.
                            n.udp.src_port = udp_sport_for_ud(qpn);
                            Some(n)
                        } else {
                            None
                        }
                    }
                };
                let Some(net) = net else {
                    self.stats.tx_no_ah += 1;
                    Self::drain_wcs(
                        slot,
                        &mut self.cqs,
                        &mut self.stats,
                        self.async_events.as_deref(),
                    );
                    continue;
                };
                if let IpRepr::V4(ip) = &mut net.ip {
                    ip.id = ip.id.wrapping_add(1);
                }
                // The buffer was checked to hold the headers, the largest
                // segment and the ICRC, so emit cannot fail; if it ever did,
                // the segment is lost (and retransmitted) and counted.
                let emitted = if tx.cnp {
                    emit_cnp(net, self.cc.cnp_dscp, buf, tx.len + ICRC_LEN)
                } else {
                    net.emit_net_and_icrc(buf, tx.len + ICRC_LEN)
                };
                let len = match emitted {
                    Ok(n) => n,
                    Err(_) => {
                        self.stats.tx_emit_errors += 1;
                        0
                    }
                };
                Self::drain_wcs(
                    slot,
                    &mut self.cqs,
                    &mut self.stats,
                    self.async_events.as_deref(),
                );
                self.rr = (idx + 1) % n;
                return len;
            }
            self.tx_paced |= slot.qp.pacing_blocked(now);
            Self::drain_wcs(
                slot,
                &mut self.cqs,
                &mut self.stats,
                self.async_events.as_deref(),
            );
        }
        if too_small {
            crate::io::xsk::NEEDS_LARGER
        } else {
            0
        }
    }
}
