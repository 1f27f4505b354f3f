//! The requester (rxe_req.c): posting send WQEs, turning them into request
//! packets within the PSN window, AckReq pacing and go-back-N rewinds. It
//! does not interpret responses; the completer does and tells it where to
//! resume.

use super::*;

/// rxe's RXE_MAX_PKT_PER_ACK: AckReq at least this often in long messages.
pub const MAX_PKT_PER_ACK: u32 = 64;
/// Packets in flight right after a retransmission (timeout or sequence
/// NAK). Go-back-N resends everything past the gap; at full speed a
/// multi-MiB window that overran a slow receiver once overruns it again,
/// every round, until the retries run out. So the resend starts with this
/// many packets and the window doubles with every ACK that makes progress.
pub const RETRY_WINDOW: u32 = MAX_PKT_PER_ACK;
/// A window this large no longer limits anything: back to unlimited.
pub(super) const WINDOW_OPEN: u32 = 1 << 16;

/// The requester's state: the send queue and where transmission stands.
pub(super) struct Requester {
    pub(super) sq: VecDeque<SendWqe>,
    pub(super) inline_bufs: Vec<[u8; MAX_INLINE]>,
    /// Inline slot of the next posted WQE (counts posts modulo cap_send,
    /// kept as an index: a division per post showed in profiles).
    pub(super) inline_next: usize,
    /// UD: each WQE's destination, at its inline slot (empty for RC, so
    /// RC's WQE stays one cache line).
    pub(super) ud_dests: Vec<UdDest>,
    pub(super) next_psn: u32,
    pub(super) cur: usize,
    pub(super) cur_psn: u32,
    pub(super) noack_pkts: u32,
    /// Packets allowed past the oldest unacknowledged PSN (u32::MAX: no
    /// limit; see RETRY_WINDOW).
    pub(super) window: u32,
    pub(super) rd_atomic_inflight: u8,
    /// Highest PSN ever transmitted + 1, to tell retransmissions apart.
    pub(super) max_sent_psn: u32,
}

impl Requester {
    pub(super) fn new(cap_send: usize, ud: bool) -> Requester {
        Requester {
            sq: VecDeque::with_capacity(cap_send),
            inline_bufs: vec![[0u8; MAX_INLINE]; cap_send],
            inline_next: 0,
            ud_dests: vec![UdDest::default(); if ud { cap_send } else { 0 }],
            next_psn: 0,
            cur: 0,
            cur_psn: 0,
            noack_pkts: 0,
            window: u32::MAX,
            rd_atomic_inflight: 0,
            max_sent_psn: 0,
        }
    }
}

#[derive(Clone, Copy)]
pub(super) struct SendWqe {
    pub(super) wr_id: u64,
    pub(super) opcode: WrOpcode,
    pub(super) flags: SendFlags,
    pub(super) sges: [Sge; MAX_SGE],
    pub(super) num_sge: u8,
    pub(super) inline_len: u16,
    /// Slot of the inline payload in `QpEngine::inline_bufs` (kept out of the
    /// WQE so that the WQE stays small: it is copied per packet sent).
    pub(super) inline_slot: u32,
    pub(super) is_inline: bool,
    pub(super) length: u32,
    pub(super) imm: u32,
    pub(super) remote_addr: u64,
    pub(super) rkey: u32,
    pub(super) compare_add: u64,
    pub(super) swap: u64,
    // Transport state.
    pub(super) started: bool,
    pub(super) first_psn: u32,
    pub(super) npkts: u32,
    /// READ: response packets received in order so far.
    pub(super) resp_pkts: u32,
    pub(super) done: bool,
    pub(super) status: WcStatus,
}

impl SendWqe {
    pub(super) fn last_psn(&self) -> u32 {
        psn_add(self.first_psn, self.npkts - 1)
    }
    pub(super) fn contains(&self, psn: u32) -> bool {
        self.started && {
            let d = psn_diff(psn, self.first_psn);
            d >= 0 && (d as u32) < self.npkts
        }
    }
}

/// What `post_send` refuses before queueing, for a QP of `qp_type` in
/// `state`: also checked where a WR is posted on another thread than the
/// engine's (the verbs rings), so both refuse the same WRs.
pub fn check_send(qp_type: QpType, state: QpState, wr: &SendWr) -> Result<(), PostError> {
    match state {
        QpState::Rts | QpState::Sqd | QpState::Err => {}
        s => return Err(PostError::BadState(s)),
    }
    if qp_type == QpType::Ud {
        if !matches!(wr.opcode, WrOpcode::Send | WrOpcode::SendWithImm) {
            return Err(PostError::BadOpcode);
        }
        if wr.ud.is_none() {
            return Err(PostError::NoAddress);
        }
    }
    if wr.sg_list.len() > MAX_SGE {
        return Err(PostError::TooManySge);
    }
    let inline = wr.inline.filter(|_| !wr.opcode.is_rd_atomic());
    if inline.is_some_and(|d| d.len() > MAX_INLINE) {
        return Err(PostError::InlineTooLong);
    }
    if wr.opcode.is_atomic() && (send_length(wr) != 8 || wr.sg_list.len() != 1) {
        return Err(PostError::BadAtomicLength);
    }
    Ok(())
}

/// The message length of a send WR: its inline data or its SGEs.
fn send_length(wr: &SendWr) -> u32 {
    match wr.inline.filter(|_| !wr.opcode.is_rd_atomic()) {
        Some(data) => data.len() as u32,
        None => {
            let total: u64 = wr.sg_list.iter().map(|s| s.length as u64).sum();
            total.min(u32::MAX as u64) as u32
        }
    }
}

impl QpEngine {
    pub fn post_send(&mut self, wr: &SendWr) -> Result<(), PostError> {
        check_send(self.qp_type, self.state, wr)?;
        if self.req.sq.len() >= self.cap_send {
            return Err(PostError::QueueFull);
        }
        let inline = wr.inline.filter(|_| !wr.opcode.is_rd_atomic());
        let length = send_length(wr);
        // WQEs retire in order and at most cap_send are queued, so an inline
        // slot is free again by the time the counter wraps to it.
        let slot = self.req.inline_next;
        if let Some(data) = inline {
            self.req.inline_bufs[slot][..data.len()].copy_from_slice(data);
        }
        if let (Some(d), Some(u)) = (self.req.ud_dests.get_mut(slot), wr.ud) {
            *d = u;
        }
        self.req.inline_next = if slot + 1 == self.cap_send {
            0
        } else {
            slot + 1
        };
        let mut sges = [Sge::default(); MAX_SGE];
        if inline.is_none() {
            sges[..wr.sg_list.len()].copy_from_slice(wr.sg_list);
        }
        let w = SendWqe {
            wr_id: wr.wr_id,
            opcode: wr.opcode,
            flags: wr.flags,
            sges,
            num_sge: if inline.is_some() {
                0
            } else {
                wr.sg_list.len() as u8
            },
            inline_len: inline.map_or(0, |d| d.len() as u16),
            inline_slot: slot as u32,
            is_inline: inline.is_some(),
            length,
            imm: wr.imm,
            remote_addr: wr.remote_addr,
            rkey: wr.rkey,
            compare_add: wr.compare_add,
            swap: wr.swap,
            started: false,
            first_psn: 0,
            npkts: 0,
            resp_pkts: 0,
            done: false,
            status: WcStatus::Success,
        };
        if self.state == QpState::Err {
            self.push_send_wc(&w, WcStatus::WrFlushErr, true);
            return Ok(());
        }
        self.req.sq.push_back(w);
        Ok(())
    }

    /// First PSN whose acknowledgement or response is still awaited.
    pub(super) fn oldest_unacked_psn(&self) -> u32 {
        for w in &self.req.sq {
            if !w.started {
                break;
            }
            if !w.done {
                // Inside a multi-packet message, the responder may already
                // have part of it (implied by a NAK's PSN).
                let after_acked = psn_add(self.comp.acked_psn, 1);
                return if !w.opcode.is_rd_atomic() && w.contains(after_acked) {
                    after_acked
                } else {
                    psn_add(w.first_psn, w.resp_pkts)
                };
            }
        }
        self.req.next_psn
    }

    /// Resend after a loss (timeout, sequence NAK, missing responses): go
    /// back to `psn` with a small window (RETRY_WINDOW).
    pub(super) fn retransmit_from(&mut self, psn: u32) {
        self.req.window = RETRY_WINDOW;
        self.rewind(psn);
    }

    /// Go-back-N: transmit again from `psn`, or from the oldest PSN still
    /// unanswered if that is earlier (a READ whose responses were lost must
    /// be asked again before anything after it, as rxe's req_retry does).
    pub(super) fn rewind(&mut self, psn: u32) {
        let oldest = self.oldest_unacked_psn();
        let psn = if psn_diff(psn, oldest) > 0 {
            oldest
        } else {
            psn
        };
        for (i, w) in self.req.sq.iter().enumerate() {
            if w.contains(psn) && !w.done {
                self.req.cur = i;
                self.req.cur_psn = psn;
                return;
            }
        }
        // Nothing started contains it: continue with the first unstarted WQE.
        self.req.cur = self
            .req
            .sq
            .iter()
            .position(|w| !w.started)
            .unwrap_or(self.req.sq.len());
        self.req.cur_psn = self.req.next_psn;
    }

    pub(super) fn poll_request(
        &mut self,
        now: Nanos,
        mem: &MrTable,
        buf: &mut [u8],
    ) -> Option<usize> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return None;
        }
        if self.comp.rnr_until.is_some() {
            return None;
        }
        if self.sr.on {
            // Selective repeat: what is known lost goes first, alone.
            if let Some((idx, psn)) = self.sr_next_resend() {
                self.sr_mark_resent(idx, psn);
                let (len, _) = self.build_request(now, idx, psn, false, mem, buf);
                return Some(len);
            }
        }
        self.normalize_cursor();
        let started = self.req.sq.get(self.req.cur)?.started;
        // With a limited window: how far this packet's PSN is past the oldest
        // unacknowledged one (starting a WQE below changes neither).
        // Selective repeat's window is its in-flight cap, from the oldest
        // WQE's first PSN.
        let window = if self.sr.on {
            self.sr_inflight_cap()
        } else {
            self.req.window
        };
        let ahead = (window != u32::MAX).then(|| {
            let psn = if started {
                self.req.cur_psn
            } else {
                self.req.next_psn
            };
            let from = if self.sr.on {
                self.sr.tx.base
            } else {
                self.oldest_unacked_psn()
            };
            psn_diff(psn, from)
        });
        // The oldest packet may always go (a READ request spans many PSNs
        // but is one packet).
        if ahead.is_some_and(|a| a > 0 && a as u32 >= window) {
            return None;
        }
        if !started {
            // The WQE is updated in place: it is as large as a cache line
            // pair, and copying it twice per packet showed in profiles.
            if self.state == QpState::Sqd {
                return None;
            }
            let w = &self.req.sq[self.req.cur];
            let rd_atomic = w.opcode.is_rd_atomic();
            if rd_atomic && self.req.rd_atomic_inflight >= self.max_rd_atomic.max(1) {
                return None;
            }
            if w.flags.fence && self.req.rd_atomic_inflight > 0 {
                return None;
            }
            // Local gather list check before anything is sent: a bad lkey is
            // a local protection error, fatal to the QP as in IBA 10.8.3.
            let local_ok = w.is_inline || self.check_local(w, mem).is_ok();
            let npkts = match w.opcode {
                _ if !local_ok => 1,
                WrOpcode::CmpSwap | WrOpcode::FetchAdd => 1,
                _ => self.packets_for(w.length),
            };
            let first_psn = self.req.next_psn;
            let w = &mut self.req.sq[self.req.cur];
            w.started = true;
            w.first_psn = first_psn;
            w.npkts = npkts;
            if !local_ok {
                w.done = true;
                w.status = WcStatus::LocProtErr;
                self.complete_done();
                return None;
            }
            self.req.next_psn = psn_add(first_psn, npkts);
            self.req.cur_psn = first_psn;
            if rd_atomic {
                self.req.rd_atomic_inflight += 1;
            }
        }
        let psn = self.req.cur_psn;
        // With a limited window the packet that fills it must ask for an
        // ACK, or the window stays shut until a timeout.
        let fills_window = ahead.is_some_and(|a| a >= 0 && a as u32 + 1 >= window);
        let (len, advance_wqe) = self.build_request(now, self.req.cur, psn, fills_window, mem, buf);
        if advance_wqe {
            self.req.cur += 1;
            self.req.cur_psn = match self.req.sq.get(self.req.cur) {
                Some(n) if n.started => n.first_psn,
                _ => self.req.next_psn,
            };
        } else {
            self.req.cur_psn = psn_add(psn, 1);
        }
        Some(len)
    }

    /// Writes the request packet at `psn` of send WQE `idx` (a first
    /// transmission or a resend) and returns its length and whether it was
    /// the WQE's last packet. It does not move the transmit cursor.
    fn build_request(
        &mut self,
        now: Nanos,
        idx: usize,
        psn: u32,
        fills_window: bool,
        mem: &MrTable,
        buf: &mut [u8],
    ) -> (usize, bool) {
        let w = &self.req.sq[idx];
        let k = psn_diff(psn, w.first_psn) as u32;
        let off = k * self.mtu;
        let last = k + 1 == w.npkts;
        let mut t = TransportRepr::new(BthRepr::default());
        let mut plen = 0usize;
        let mut advance_wqe = last;
        match w.opcode {
            WrOpcode::Send
            | WrOpcode::SendWithImm
            | WrOpcode::RdmaWrite
            | WrOpcode::RdmaWriteWithImm => {
                plen = (w.length - off).min(self.mtu) as usize;
                let first = k == 0;
                let imm = matches!(w.opcode, WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm);
                let send = matches!(w.opcode, WrOpcode::Send | WrOpcode::SendWithImm);
                let opc = match (send, first, last, imm) {
                    (true, true, true, false) => opcode::RC_SEND_ONLY,
                    (true, true, true, true) => opcode::RC_SEND_ONLY_WITH_IMMEDIATE,
                    (true, true, false, _) => opcode::RC_SEND_FIRST,
                    (true, false, false, _) => opcode::RC_SEND_MIDDLE,
                    (true, false, true, false) => opcode::RC_SEND_LAST,
                    (true, false, true, true) => opcode::RC_SEND_LAST_WITH_IMMEDIATE,
                    (false, true, true, false) => opcode::RC_RDMA_WRITE_ONLY,
                    (false, true, true, true) => opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
                    (false, true, false, _) => opcode::RC_RDMA_WRITE_FIRST,
                    (false, false, false, _) => opcode::RC_RDMA_WRITE_MIDDLE,
                    (false, false, true, false) => opcode::RC_RDMA_WRITE_LAST,
                    (false, false, true, true) => opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
                };
                self.req.noack_pkts += 1;
                let ack_req = last || self.req.noack_pkts >= MAX_PKT_PER_ACK || fills_window;
                if ack_req {
                    self.req.noack_pkts = 0;
                }
                t.bth = self.bth(opc, psn, ack_req);
                t.bth.solicited = last && w.flags.solicited && send;
                if opcode_flags(opc).has(OpFlags::RETH) {
                    t.reth = Some(RethRepr {
                        va: w.remote_addr,
                        rkey: w.rkey,
                        dma_len: w.length,
                    });
                }
                if opcode_flags(opc).has(OpFlags::IMM) {
                    t.imm = Some(w.imm);
                }
            }
            WrOpcode::RdmaRead => {
                // A retry asks only for what has not arrived yet: the tail
                // (go-back-N), or the missing run (selective repeat).
                let mut dma_len = w.length - off.min(w.length);
                if self.sr.on {
                    let run = psn_diff(self.sr_read_run_end(w, psn), psn) as u32;
                    dma_len = dma_len.min(run * self.mtu);
                }
                t.bth = self.bth(opcode::RC_RDMA_READ_REQUEST, psn, true);
                t.reth = Some(RethRepr {
                    va: w.remote_addr.wrapping_add(off as u64),
                    rkey: w.rkey,
                    dma_len,
                });
                advance_wqe = true;
            }
            WrOpcode::CmpSwap | WrOpcode::FetchAdd => {
                let opc = if w.opcode == WrOpcode::CmpSwap {
                    opcode::RC_COMPARE_SWAP
                } else {
                    opcode::RC_FETCH_ADD
                };
                t.bth = self.bth(opc, psn, true);
                t.atomic_eth = Some(AtomicEthRepr {
                    va: w.remote_addr,
                    rkey: w.rkey,
                    swap_add: if w.opcode == WrOpcode::CmpSwap {
                        w.swap
                    } else {
                        w.compare_add
                    },
                    compare: if w.opcode == WrOpcode::CmpSwap {
                        w.compare_add
                    } else {
                        0
                    },
                });
            }
        }
        let hl = t.header_len();
        if plen > 0 {
            let inline = &self.req.inline_bufs[w.inline_slot as usize][..w.inline_len as usize];
            Self::gather(
                w,
                inline,
                mem,
                self.pd,
                off as usize,
                &mut buf[hl..hl + plen],
            );
        }
        let resend = psn_diff(psn, self.req.max_sent_psn) < 0;
        if resend {
            self.stats.retransmits += 1;
            // Karn: an answer after a resend times neither transmission.
            self.rtt_probe = None;
        } else if self.rtt_probe.is_none() {
            self.rtt_probe = Some((psn, now));
        }
        // A READ request reserves the PSNs of all its responses.
        let end = if w.opcode == WrOpcode::RdmaRead {
            psn_add(w.first_psn, w.npkts)
        } else {
            psn_add(psn, 1)
        };
        if psn_diff(end, self.req.max_sent_psn) > 0 {
            self.req.max_sent_psn = end;
        }
        if self.sr.on {
            self.sr_stamp(idx, psn, resend);
        }
        if self.comp.rto_deadline.is_none() {
            self.arm_rto(now);
        }
        (Self::emit(&t, plen, buf), advance_wqe)
    }

    /// Keeps the transmit cursor on a WQE that still needs sending, with a
    /// PSN inside it: completions can pop or finish WQEs under the cursor.
    pub(super) fn normalize_cursor(&mut self) {
        while let Some(w) = self.req.sq.get(self.req.cur) {
            if !w.started {
                self.req.cur_psn = self.req.next_psn;
                return;
            }
            if !w.done {
                if !w.contains(self.req.cur_psn) {
                    self.req.cur_psn = psn_add(w.first_psn, w.resp_pkts);
                }
                return;
            }
            self.req.cur += 1;
        }
        self.req.cur_psn = self.req.next_psn;
    }

    pub(super) fn check_local(&self, w: &SendWqe, mem: &MrTable) -> Result<(), AccessError> {
        let need = if w.opcode.is_rd_atomic() {
            Access::LOCAL_WRITE
        } else {
            Access(0)
        };
        for s in &w.sges[..w.num_sge as usize] {
            mem.resolve_local(s.lkey, self.pd, s.addr, s.length as u64, need)?;
        }
        Ok(())
    }

    /// Copies `out.len()` bytes of the WQE's payload starting at `off`.
    pub(super) fn gather(
        w: &SendWqe,
        inline: &[u8],
        mem: &MrTable,
        pd: u32,
        mut off: usize,
        out: &mut [u8],
    ) {
        if w.is_inline {
            out.copy_from_slice(&inline[off..off + out.len()]);
            return;
        }
        let mut done = 0;
        for s in &w.sges[..w.num_sge as usize] {
            let len = s.length as usize;
            if off >= len {
                off -= len;
                continue;
            }
            let n = (len - off).min(out.len() - done);
            // Checked in check_local before the first packet; a region
            // deregistered mid-message yields zeros, never a fault.
            match mem.resolve_local(s.lkey, pd, s.addr + off as u64, n as u64, Access(0)) {
                Ok(r) => mem.read(r, &mut out[done..done + n]),
                Err(_) => out[done..done + n].fill(0),
            }
            done += n;
            off = 0;
            if done == out.len() {
                break;
            }
        }
    }
}
