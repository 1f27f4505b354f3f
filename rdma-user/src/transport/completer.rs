//! The completer (rxe_comp.c): ACKs, NAKs and READ/atomic responses from the
//! peer's responder, retiring send WQEs into work completions, retry and RNR
//! budgets, and the retransmit and RNR timers. It decides where the
//! requester resumes; it does not build packets.

use super::*;

/// The completer's state: retry budgets and timers.
pub(super) struct Completer {
    pub(super) retry_left: u8,
    pub(super) rnr_left: u8,
    pub(super) rnr_until: Option<Nanos>,
    pub(super) rto_deadline: Option<Nanos>,
    /// Set when we already went back for a gap in responses; cleared by
    /// progress, so later packets of the same burst do not trigger more.
    pub(super) retry_pending: bool,
    /// PSN we last went back to on a NAK (sequence error or RNR). A second
    /// NAK for the same PSN (the responder's pipeline answering the packets
    /// that followed an RNR NAK, or a duplicated frame) is the same event
    /// and must not consume another retry.
    pub(super) nak_rewind_psn: Option<u32>,
    /// Highest PSN the responder is known to have received (explicitly ACKed
    /// or implied by a NAK or response). Any advance is forward progress and
    /// refills the retry budget, even in the middle of a long message.
    pub(super) acked_psn: u32,
}

impl Completer {
    pub(super) fn new() -> Completer {
        Completer {
            retry_left: 7,
            rnr_left: 7,
            rnr_until: None,
            rto_deadline: None,
            retry_pending: false,
            nak_rewind_psn: None,
            acked_psn: MASK_24,
        }
    }
}

/// `4.096 us * 2^timeout`, the local ACK timeout; 0 means never.
pub fn ack_timeout_ns(timeout: u8) -> Option<Nanos> {
    (timeout != 0).then(|| 4096u64 << timeout.min(31))
}

/// The IBA's 5-bit RNR timer code (table 45) in nanoseconds.
pub fn rnr_timer_ns(code: u8) -> Nanos {
    const US_X100: [u64; 32] = [
        65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
        1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
    ];
    US_X100[(code & 31) as usize] * 10_000
}

/// visibly; errors and `force` always complete).
fn send_wc(cq: &mut VecDeque<Wc>, qpn: u32, w: &SendWqe, status: WcStatus, force: bool) {
    if w.flags.signaled || status != WcStatus::Success || force {
        cq.push_back(Wc {
            wr_id: w.wr_id,
            status,
            opcode: w.opcode.wc_opcode(),
            byte_len: if status == WcStatus::Success {
                w.length
            } else {
                0
            },
            imm: None,
            qp_num: qpn,
            solicited: false,
            src_qp: 0,
            grh: None,
        });
    }
}

impl QpEngine {
    pub(super) fn push_send_wc(&mut self, w: &SendWqe, status: WcStatus, force: bool) {
        send_wc(&mut self.completions, self.qpn, w, status, force);
    }

    /// Earliest time at which [`QpEngine::handle_timeout`] has work to do.
    pub fn poll_timeout(&self) -> Option<Nanos> {
        [
            self.comp.rto_deadline,
            self.comp.rnr_until,
            self.pace_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    pub fn handle_timeout(&mut self, now: Nanos) {
        self.cc.advance(now);
        if self.comp.rnr_until.is_some_and(|t| t <= now) {
            self.comp.rnr_until = None;
            self.arm_rto(now);
        }
        if self.comp.rto_deadline.is_some_and(|t| t <= now) {
            self.comp.rto_deadline = None;
            if !self.has_outstanding() {
                return;
            }
            self.stats.timeouts += 1;
            if self.sr.on {
                // Selective repeat: resend what is still unanswered, no more.
                if !self.sr_timeout() {
                    self.fail_front(WcStatus::RetryExcErr);
                    return;
                }
                self.arm_rto(now);
                return;
            }
            if self.comp.retry_left == 0 {
                self.fail_front(WcStatus::RetryExcErr);
                return;
            }
            self.comp.retry_left -= 1;
            let psn = self.oldest_unacked_psn();
            self.retransmit_from(psn);
            self.arm_rto(now);
        }
    }

    pub(super) fn has_outstanding(&self) -> bool {
        self.req.sq.front().is_some_and(|w| w.started && !w.done)
    }

    pub(super) fn arm_rto(&mut self, now: Nanos) {
        let rto = if self.sr.on {
            self.sr_rto()
        } else {
            ack_timeout_ns(self.timeout)
        };
        self.comp.rto_deadline = if self.has_outstanding() {
            rto.map(|t| now + t)
        } else {
            None
        };
    }

    pub(super) fn handle_response(
        &mut self,
        now: Nanos,
        t: &TransportRepr,
        flags: OpFlags,
        payload: &[u8],
        mem: &mut MrTable,
    ) {
        let psn = t.bth.psn;
        // Only PSNs we have sent and not yet seen answered are meaningful.
        let oldest = self.oldest_unacked_psn();
        if !self.has_outstanding()
            || psn_diff(psn, self.req.max_sent_psn) >= 0
            || psn_diff(psn, oldest) < -1
        {
            self.stats.dropped += 1;
            return;
        }
        if self.sr.on && flags.any(OpFlags::READ_RESPONSE | OpFlags::ATOMIC_ACK) {
            return self.sr_handle_rd_atomic_response(now, t, flags, payload, mem);
        }
        if flags.has(OpFlags::ACK) {
            let Some(aeth) = t.aeth else {
                self.stats.dropped += 1;
                return;
            };
            if self.sr.on {
                match Syndrome::decode(aeth.syndrome) {
                    // Go-back-N's NAK from a peer that negotiated selective
                    // repeat: not the mode agreed.
                    Syndrome::Nak(NakCode::PsnSequenceError) => {
                        self.stats.sr_wrong_mode += 1;
                        return;
                    }
                    Syndrome::Ack { .. } => self.sr_note_cum(psn_add(psn, 1)),
                    _ => {}
                }
            }
            let received = match Syndrome::decode(aeth.syndrome) {
                Syndrome::Ack { .. } => psn,
                _ => psn_add(psn, MASK_24),
            };
            self.note_received(received);
            match Syndrome::decode(aeth.syndrome) {
                Syndrome::Ack { .. } => {
                    if self.ack_through(psn, now) {
                        self.progress(now);
                    }
                }
                Syndrome::RnrNak { timer } => {
                    self.stats.rnr_naks_received += 1;
                    if self.ack_through(psn_add(psn, MASK_24), now) {
                        self.progress(now);
                    }
                    if self.comp.rnr_until.is_some() && self.comp.nak_rewind_psn == Some(psn) {
                        // Already waiting to resend this PSN.
                    } else if self.comp.rnr_left == 0 {
                        self.fail_front(WcStatus::RnrRetryExcErr);
                    } else {
                        if self.comp.rnr_left != 7 {
                            self.comp.rnr_left -= 1;
                        }
                        self.rewind(psn);
                        if self.sr.on {
                            self.sr_rewound();
                        }
                        self.comp.nak_rewind_psn = Some(psn);
                        self.comp.rnr_until = Some(now + rnr_timer_ns(timer));
                        self.comp.rto_deadline = None;
                    }
                }
                Syndrome::Nak(NakCode::PsnSequenceError) => {
                    self.stats.seq_naks_received += 1;
                    if self.ack_through(psn_add(psn, MASK_24), now) {
                        self.progress(now);
                    }
                    if self.comp.nak_rewind_psn == Some(psn) {
                        // Same gap, already handled.
                    } else if self.comp.retry_left == 0 {
                        self.fail_front(WcStatus::RetryExcErr);
                    } else {
                        self.comp.retry_left -= 1;
                        self.retransmit_from(psn);
                        self.comp.nak_rewind_psn = Some(psn);
                        self.arm_rto(now);
                    }
                }
                Syndrome::Nak(code) => {
                    self.ack_through(psn_add(psn, MASK_24), now);
                    let status = match code {
                        NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                        NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                        _ => WcStatus::RemInvReqErr,
                    };
                    self.fail_front(status);
                }
                Syndrome::Reserved(_) => self.stats.dropped += 1,
            }
        } else if flags.has(OpFlags::READ_RESPONSE) {
            if self.ack_through(psn_add(psn, MASK_24), now) {
                self.progress(now);
            }
            let Some(idx) = self.req.sq.iter().position(|w| !w.done) else {
                self.stats.dropped += 1;
                return;
            };
            let w = self.req.sq[idx];
            if !w.started || w.opcode != WrOpcode::RdmaRead {
                self.stats.dropped += 1;
                return;
            }
            let expected = psn_add(w.first_psn, w.resp_pkts);
            let d = psn_diff(psn, expected);
            if d < 0 {
                self.stats.duplicates_received += 1;
                return;
            }
            if d > 0 {
                // A response went missing: ask again from it, once per gap.
                self.stats.out_of_sequence_received += 1;
                self.go_back(expected, now);
                return;
            }
            let k = w.resp_pkts;
            let last = k + 1 == w.npkts;
            let off = k * self.mtu;
            let want = if last { w.length - off } else { self.mtu };
            let last_opc = flags.has(OpFlags::LAST);
            if payload.len() as u32 != want || last_opc != last {
                self.stats.errors += 1;
                self.stats.dropped += 1;
                return;
            }
            if let Err(st) = Self::scatter(
                &w.sges[..w.num_sge as usize],
                mem,
                self.pd,
                off as usize,
                payload,
            ) {
                self.req.sq[idx].done = true;
                self.req.sq[idx].status = st;
                self.complete_done();
                return;
            }
            self.req.sq[idx].resp_pkts += 1;
            self.note_received(psn);
            self.rtt_answered(psn, now);
            if last {
                self.req.sq[idx].done = true;
                self.req.rd_atomic_inflight = self.req.rd_atomic_inflight.saturating_sub(1);
            }
            self.progress(now);
        } else if flags.has(OpFlags::ATOMIC_ACK) {
            if self.ack_through(psn_add(psn, MASK_24), now) {
                self.progress(now);
            }
            let Some(idx) = self.req.sq.iter().position(|w| !w.done) else {
                self.stats.dropped += 1;
                return;
            };
            let w = self.req.sq[idx];
            if !w.started || !w.opcode.is_atomic() {
                self.stats.dropped += 1;
                return;
            }
            let d = psn_diff(psn, w.first_psn);
            if d < 0 {
                self.stats.duplicates_received += 1;
                return;
            }
            if d > 0 {
                self.go_back(w.first_psn, now);
                return;
            }
            let orig = t.atomic_ack.unwrap_or(0);
            if let Err(st) = Self::scatter(
                &w.sges[..w.num_sge as usize],
                mem,
                self.pd,
                0,
                &orig.to_ne_bytes(),
            ) {
                self.req.sq[idx].done = true;
                self.req.sq[idx].status = st;
                self.complete_done();
                return;
            }
            self.req.sq[idx].resp_pkts = 1;
            self.note_received(psn);
            self.rtt_answered(psn, now);
            self.req.sq[idx].done = true;
            self.req.rd_atomic_inflight = self.req.rd_atomic_inflight.saturating_sub(1);
            self.progress(now);
        } else {
            self.stats.dropped += 1;
        }
        self.complete_done();
    }

    pub(super) fn note_received(&mut self, psn: u32) {
        if psn_diff(psn, self.comp.acked_psn) > 0 && psn_diff(psn, self.req.max_sent_psn) < 0 {
            self.comp.acked_psn = psn;
            self.comp.retry_left = self.retry_cnt;
            self.comp.rnr_left = self.rnr_retry;
            if self.req.window != u32::MAX {
                self.req.window = self.req.window.saturating_mul(2);
                if self.req.window >= WINDOW_OPEN {
                    self.req.window = u32::MAX;
                }
            }
        }
    }

    /// Retransmit from `psn` after a gap in responses, once per gap.
    pub(super) fn go_back(&mut self, psn: u32, now: Nanos) {
        self.rtt_probe = None;
        if self.comp.retry_pending {
            return;
        }
        self.comp.retry_pending = true;
        if self.comp.retry_left == 0 {
            self.fail_front(WcStatus::RetryExcErr);
            return;
        }
        self.comp.retry_left -= 1;
        self.retransmit_from(psn);
        self.arm_rto(now);
    }

    pub(super) fn progress(&mut self, now: Nanos) {
        self.sr.tx.backoff = 0;
        self.comp.retry_left = self.retry_cnt;
        self.comp.rnr_left = self.rnr_retry;
        self.comp.retry_pending = false;
        self.complete_done();
        if self
            .comp
            .nak_rewind_psn
            .is_some_and(|p| psn_diff(self.oldest_unacked_psn(), p) > 0)
        {
            self.comp.nak_rewind_psn = None;
        }
        self.comp.rto_deadline = None;
        self.arm_rto(now);
    }

    /// Marks SEND/WRITE WQEs whose last PSN is at or before `psn` done.
    /// A READ or atomic that the ACK passes without its response having
    /// arrived lost that response: go back for it. Returns whether anything
    /// new was acknowledged.
    /// The peer has every request packet through `psn`: the timed one, if
    /// covered, gives an RTT sample.
    pub(super) fn rtt_answered(&mut self, psn: u32, now: Nanos) {
        if let Some((p, sent)) = self.rtt_probe {
            if psn_diff(psn, p) >= 0 {
                let ns = now.saturating_sub(sent);
                self.stats.record_rtt(ns);
                if self.sr.on {
                    self.sr_rtt_sample(ns);
                }
                self.rtt_probe = None;
            }
        }
    }

    pub(super) fn ack_through(&mut self, psn: u32, now: Nanos) -> bool {
        self.rtt_answered(psn, now);
        let mut any = false;
        let mut go_back_to = None;
        for w in self.req.sq.iter_mut() {
            if !w.started {
                break;
            }
            if w.done {
                continue;
            }
            if psn_diff(w.last_psn(), psn) > 0 {
                break;
            }
            if w.opcode.is_rd_atomic() {
                // Its responses are missing. Go-back-N asks again now;
                // selective repeat waits for evidence or its timer.
                if !self.sr.on {
                    go_back_to = Some(psn_add(w.first_psn, w.resp_pkts));
                }
                break;
            }
            w.done = true;
            any = true;
        }
        if any {
            // Skip the transmit cursor past what the peer already has.
            let next = psn_add(psn, 1);
            let cur_started = self.req.sq.get(self.req.cur).is_some_and(|w| w.started);
            if cur_started && psn_diff(self.req.cur_psn, next) < 0 {
                self.rewind(next);
            }
        }
        if let Some(p) = go_back_to {
            self.go_back(p, now);
        }
        any
    }

    /// Pops finished WQEs off the head of the send queue, in order.
    pub(super) fn complete_done(&mut self) {
        while let Some(w) = self.req.sq.front() {
            if !w.done {
                break;
            }
            let status = w.status;
            if self.sr.on && w.opcode.is_rd_atomic() {
                self.req.rd_atomic_inflight = self.req.rd_atomic_inflight.saturating_sub(1);
            }
            send_wc(&mut self.completions, self.qpn, w, status, false);
            self.req.sq.pop_front();
            self.req.cur = self.req.cur.saturating_sub(1);
            if status != WcStatus::Success {
                self.enter_error();
                return;
            }
        }
        if self.sr.on {
            self.sr_advance_base();
        }
    }

    /// The oldest outstanding WQE fails with `status`; the QP goes to ERR and
    /// the rest are flushed.
    pub(super) fn fail_front(&mut self, status: WcStatus) {
        self.stats.errors += 1;
        if let Some(w) = self.req.sq.iter_mut().find(|w| !w.done) {
            w.done = true;
            w.status = status;
        }
        self.complete_done();
        if self.state != QpState::Err {
            self.enter_error();
        }
    }
}
