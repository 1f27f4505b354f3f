//! Selective repeat between two of our stacks, in the spirit of IRN
//! (Mittal et al., "Revisiting Network Support for RDMA", SIGCOMM 2018).
//!
//! The IBA's RC recovery is go-back-N: the responder drops every packet
//! after a gap and NAKs once, the requester resends everything from the
//! gap. That stays the behaviour with any peer that is not us. When both
//! sides said so in the connection exchange (never guessed from traffic),
//! [`QpEngine::set_selective_repeat`] turns this mode on for one QP:
//!
//! - **Responder.** A request up to [`SR_WINDOW`] PSNs ahead of the
//!   expected one is kept instead of dropped. A WRITE MIDDLE or LAST of the
//!   message in progress is placed at once, at the address its PSN implies
//!   (the RETH came with the FIRST; each earlier packet is one MTU). Any
//!   other request (a SEND, or a packet of a later message, whose place
//!   depends on packets still missing) waits in a preallocated stash of
//!   MTU-sized slots. When the gap fills, the kept packets run through the
//!   normal in-order checks and execution, one by one, so completions,
//!   MSNs, READs and atomics happen in order and exactly once; a placed
//!   packet is checked again but not copied again. Instead of a
//!   sequence-error NAK it sends SR_SACK: the first missing PSN and a
//!   bitmap of the PSNs after it that it holds.
//! - **Requester.** It resends only what a SACK shows missing, once at
//!   least [`DUPTHRESH`] later PSNs arrived (reordering is not loss), or
//!   when its retransmission timer (a few smoothed RTTs, backed off, at
//!   most the QP's ACK timeout) finds it still missing. It keeps at most
//!   one bandwidth-delay product (and never more than the window) in
//!   flight. READ responses are placed as they arrive, in any order; a
//!   missing one is asked for again with a READ of the message's tail.
//!
//! What does not fit the mode is counted and dropped: a sequence-error NAK
//! from a peer that negotiated selective repeat, a SACK to a QP that did
//! not, SACKs naming PSNs before the window or bitmaps claiming packets
//! never sent, requests beyond the window.

use super::*;

/// PSNs a responder keeps ahead of the expected one, and the most a
/// requester has outstanding past its oldest unacknowledged PSN.
pub const SR_WINDOW: u32 = (SACK_BITMAP_LEN * 8) as u32;
/// A missing PSN is resent once this many later PSNs have arrived.
pub const DUPTHRESH: u32 = 3;
/// Bytes of stash per QP (slots of one MTU, at most one per window PSN).
const STASH_BYTES: usize = 256 << 10;
/// Smallest retransmission timer. A software stack's round trip has the
/// scheduler in it: on a busy two-core host one late wakeup of a thread
/// on the path (the peer's, a relay's) takes a millisecond, and a probe
/// timer of 2 x SRTT (256 us samples, a 512 us timer) fired spuriously
/// there. A lone lost packet now waits at least 1 ms for its resend.
const MIN_RTO_NS: Nanos = 1_000_000;
const INITIAL_RTO_NS: Nanos = 1_000_000;
/// Least number of packets allowed in flight, whatever the BDP estimate.
const MIN_INFLIGHT: u32 = 128;

const WORDS: usize = SR_WINDOW as usize / 64;

/// One bit per PSN of a window, indexed by the PSN's low bits.
#[derive(Clone, Copy, Default)]
pub(super) struct PsnBits([u64; WORDS]);

impl PsnBits {
    fn at(psn: u32) -> (usize, u64) {
        let i = (psn & (SR_WINDOW - 1)) as usize;
        (i / 64, 1u64 << (i % 64))
    }
    pub(super) fn get(&self, psn: u32) -> bool {
        let (w, b) = Self::at(psn);
        self.0[w] & b != 0
    }
    pub(super) fn set(&mut self, psn: u32) {
        let (w, b) = Self::at(psn);
        self.0[w] |= b;
    }
    pub(super) fn clear(&mut self, psn: u32) {
        let (w, b) = Self::at(psn);
        self.0[w] &= !b;
    }
    pub(super) fn clear_all(&mut self) {
        self.0 = [0; WORDS];
    }
}

/// A request kept by the responder until the PSNs before it arrive.
#[derive(Clone, Copy)]
pub(super) enum Held {
    /// Its payload is already in place (a WRITE packet of the message in
    /// progress); `plen` bytes.
    Placed { plen: u32 },
    /// Its payload waits in stash slot `slot` (none for READ and atomic
    /// requests, which carry none).
    Stashed { slot: Option<u16>, plen: u32 },
}

#[derive(Clone, Copy)]
pub(super) struct RxEntry {
    pub(super) psn: u32,
    pub(super) held: Option<Held>,
    pub(super) t: TransportRepr,
}

/// The responder's side.
#[derive(Default)]
pub(super) struct SrRx {
    pub(super) entries: Vec<RxEntry>,
    pub(super) stash: Vec<u8>,
    pub(super) slot_len: usize,
    pub(super) free: Vec<u16>,
    /// Entries held.
    pub(super) held: u32,
    /// A SACK should go out (something arrived out of order, or again).
    pub(super) sack_due: bool,
}

/// The requester's side. Bits are valid for PSNs in
/// `[base, base + SR_WINDOW)`.
///
/// Loss is judged by transmission order, as RACK does for TCP: every
/// request packet sent gets the next `tx_seq`, kept per PSN in
/// `sent_seq`. A packet is lost once the responder has a packet sent
/// DUPTHRESH transmissions after it, so a lost resend is found like a lost
/// first transmission, without waiting for the timer.
#[derive(Default)]
pub(super) struct SrTx {
    /// SEND/WRITE packets the responder holds (SACKed).
    pub(super) sacked: PsnBits,
    /// READ and atomic responses received.
    pub(super) resp_rx: PsnBits,
    /// Resent since the last timer expiry (the timer resends each PSN
    /// once).
    pub(super) resent: PsnBits,
    /// Per PSN: the transmission that last carried it (a READ request
    /// stamps all the PSNs of its responses).
    pub(super) sent_seq: Vec<u32>,
    /// Sent more than once: an answer for it may be for any of its
    /// transmissions, so it says nothing about order (Karn's rule).
    pub(super) ambiguous: PsnBits,
    pub(super) tx_seq: u32,
    /// Latest transmission the responder is known to hold (SACKed or
    /// acknowledged), and latest it is known to have executed
    /// (cumulatively acknowledged).
    pub(super) delivered_seq: u32,
    pub(super) acked_seq: u32,
    /// First PSN of the oldest send WQE: where the bits start.
    pub(super) base: u32,
    /// The responder's expected PSN as it last said (ACK PSN + 1, or the
    /// SACK's PSN).
    pub(super) cum: u32,
    /// Highest response PSN received (`base - 1` when none).
    pub(super) high_resp: u32,
    /// After a timer expiry: every unanswered PSN before this is lost.
    pub(super) lost_below: u32,
    /// Timer expiries since the last progress (the timer doubles each).
    pub(super) backoff: u8,
    /// After a timer expiry: resend the oldest unacknowledged PSN even if
    /// SACKed, for an ACK that may have been lost.
    pub(super) probe: bool,
    /// Something changed that can make a PSN lost; cleared by a scan that
    /// finds nothing, so a clean path does not scan per packet.
    pub(super) scan_due: bool,
    pub(super) srtt_ns: Nanos,
    pub(super) rttvar_ns: Nanos,
    pub(super) min_rtt_ns: Nanos,
}

/// `a` is at least `n` transmissions after `b` (sequence numbers wrap).
fn seq_at_least(a: u32, b: u32, n: u32) -> bool {
    (a.wrapping_sub(b) as i32) >= n as i32
}

fn seq_max(a: &mut u32, b: u32) {
    if (b.wrapping_sub(*a) as i32) > 0 {
        *a = b;
    }
}

/// Selective-repeat state of one QP; `on` is false for go-back-N.
#[derive(Default)]
pub(super) struct Selective {
    pub(super) on: bool,
    pub(super) rx: SrRx,
    pub(super) tx: SrTx,
}

/// What the responder's execution gets for a request's payload.
#[derive(Clone, Copy)]
pub(super) enum Body<'a> {
    Bytes(&'a [u8]),
    /// Already placed (selective repeat): this many bytes, not copied again.
    Placed(u32),
}

impl Body<'_> {
    pub(super) fn len(&self) -> u32 {
        match self {
            Body::Bytes(b) => b.len() as u32,
            Body::Placed(n) => *n,
        }
    }
}

/// Whether selective repeat is on for a connection, from what each side
/// said in the exchange: both must have offered it. A peer that said
/// nothing (`None`: rxe, an older stack) gets go-back-N.
pub fn negotiate(ours: bool, theirs: Option<bool>) -> bool {
    ours && theirs == Some(true)
}

impl QpEngine {
    /// Turns selective repeat on or off: only before RTR (RESET or INIT),
    /// when both sides agreed to it in the connection exchange. A reset
    /// turns it off again.
    pub fn set_selective_repeat(&mut self, on: bool) -> Result<(), ModifyError> {
        if self.qp_type != QpType::Rc {
            return Err(ModifyError::BadValue {
                attr: "selective_repeat",
                why: "only RC QPs retransmit",
            });
        }
        if !matches!(self.state, QpState::Reset | QpState::Init) {
            return Err(ModifyError::BadValue {
                attr: "selective_repeat",
                why: "must be chosen before RTR",
            });
        }
        self.sr.on = on;
        Ok(())
    }

    pub fn selective_repeat(&self) -> bool {
        self.sr.on
    }

    /// At RTR, with the path MTU known: the window and stash, allocated
    /// once per connection (control path, never per packet).
    pub(super) fn sr_allocate(&mut self) {
        if !self.sr.on {
            return;
        }
        let mtu = self.mtu as usize;
        let slots = (STASH_BYTES / mtu).min(SR_WINDOW as usize);
        let rx = &mut self.sr.rx;
        rx.entries = vec![
            RxEntry {
                psn: 0,
                held: None,
                t: TransportRepr::new(BthRepr::default()),
            };
            SR_WINDOW as usize
        ];
        rx.stash = vec![0; slots * mtu];
        rx.slot_len = mtu;
        rx.free = (0..slots as u16).rev().collect();
        rx.held = 0;
        rx.sack_due = false;
        self.sr.tx.sent_seq = vec![0; SR_WINDOW as usize];
    }

    /// The requester's PSNs start over at `psn` (RTS).
    pub(super) fn sr_start(&mut self, psn: u32) {
        let t = &mut self.sr.tx;
        t.sacked.clear_all();
        t.resp_rx.clear_all();
        t.resent.clear_all();
        t.ambiguous.clear_all();
        t.base = psn;
        t.cum = psn;
        t.high_resp = psn_add(psn, MASK_24);
        t.lost_below = psn;
        t.backoff = 0;
        t.probe = false;
        t.scan_due = false;
    }

    // ---- Responder ----

    /// A request `d` PSNs ahead of the expected one: keep it (placed or
    /// stashed) if it is inside the window.
    pub(super) fn sr_out_of_order(
        &mut self,
        t: &TransportRepr,
        flags: OpFlags,
        payload: &[u8],
        mem: &mut MrTable,
        d: u32,
    ) {
        let psn = t.bth.psn;
        if d >= SR_WINDOW {
            self.stats.sr_outside_window += 1;
            return;
        }
        let i = (psn & (SR_WINDOW - 1)) as usize;
        if self.sr.rx.entries[i].held.is_some() && self.sr.rx.entries[i].psn == psn {
            self.stats.duplicates_received += 1;
            self.sr.rx.sack_due = true;
            return;
        }
        let held = if self.sr_try_place(flags, payload, mem, d) {
            Held::Placed {
                plen: payload.len() as u32,
            }
        } else if payload.is_empty() {
            Held::Stashed {
                slot: None,
                plen: 0,
            }
        } else if payload.len() > self.sr.rx.slot_len {
            // Longer than any request may be: in order it is a fatal
            // length error; it must come again to meet that check.
            self.stats.sr_not_kept += 1;
            return;
        } else {
            let Some(slot) = self.sr.rx.free.pop() else {
                self.stats.sr_not_kept += 1;
                self.sr.rx.sack_due = true;
                return;
            };
            let at = slot as usize * self.sr.rx.slot_len;
            self.sr.rx.stash[at..at + payload.len()].copy_from_slice(payload);
            Held::Stashed {
                slot: Some(slot),
                plen: payload.len() as u32,
            }
        };
        self.stats.out_of_sequence_received += 1;
        let rx = &mut self.sr.rx;
        rx.entries[i] = RxEntry {
            psn,
            held: Some(held),
            t: *t,
        };
        rx.held += 1;
        rx.sack_due = true;
    }

    /// A WRITE MIDDLE or LAST of the message in progress, `d` PSNs past
    /// the expected one, goes straight to memory if the in-order checks
    /// would pass: it is the message's `k`-th packet, every earlier one is
    /// one MTU, and it lies inside what the RETH announced. Anything else
    /// (SENDs: their RECV offset depends on where missing packets end a
    /// message) waits for its turn.
    fn sr_try_place(&mut self, flags: OpFlags, payload: &[u8], mem: &mut MrTable, d: u32) -> bool {
        let InMsg::Write {
            rkey,
            va,
            total,
            offset,
            ..
        } = self.resp.in_msg
        else {
            return false;
        };
        let pos = flags.position();
        if !flags.has(OpFlags::WRITE) || !pos.continues() {
            return false;
        }
        let plen = payload.len() as u64;
        let mtu = self.mtu as u64;
        let last = pos == Position::Last;
        let len_ok = if last {
            plen >= 1 && plen <= mtu
        } else {
            plen == mtu
        };
        let off = offset as u64 + d as u64 * mtu;
        let end = off + plen;
        if !len_ok || end > total as u64 || last != (end == total as u64) {
            return false;
        }
        // A LAST with immediate needs a RECV when its turn comes; nothing
        // else takes one before then.
        if last && flags.has(OpFlags::IMM) && self.resp.rq.is_empty() {
            return false;
        }
        match mem.resolve(rkey, self.pd, va + off, plen, Access::REMOTE_WRITE) {
            Ok(r) => {
                mem.write(r, payload);
                true
            }
            Err(_) => false,
        }
    }

    /// After an in-order request: run every kept request that is now in
    /// order, through the same checks and execution.
    pub(super) fn sr_commit(&mut self, mem: &mut MrTable) {
        while self.sr.rx.held > 0 {
            if !matches!(
                self.state,
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
            ) {
                break;
            }
            let epsn = self.resp.epsn;
            let i = (epsn & (SR_WINDOW - 1)) as usize;
            let e = self.sr.rx.entries[i];
            let Some(held) = e.held.filter(|_| e.psn == epsn) else {
                return;
            };
            self.sr.rx.entries[i].held = None;
            self.sr.rx.held -= 1;
            let flags = e.t.flags();
            match held {
                Held::Placed { plen } => {
                    self.execute_request(&e.t, flags, Body::Placed(plen), mem);
                }
                Held::Stashed { slot, plen } => {
                    // The stash leaves its field while the request runs
                    // (it borrows the engine): a move, no allocation.
                    let stash = std::mem::take(&mut self.sr.rx.stash);
                    let at = slot.map_or(0, |s| s as usize * self.sr.rx.slot_len);
                    self.execute_request(
                        &e.t,
                        flags,
                        Body::Bytes(&stash[at..at + plen as usize]),
                        mem,
                    );
                    self.sr.rx.stash = stash;
                    if let Some(s) = slot {
                        self.sr.rx.free.push(s);
                    }
                }
            }
            if self.resp.epsn == epsn {
                // Not consumed (RNR, or a fatal error): the requester
                // starts over from here, so nothing kept still counts.
                self.sr_forget();
                return;
            }
            // A READ moved the expected PSN past its responses' PSNs:
            // nothing kept there is a request.
            let mut p = psn_add(epsn, 1);
            while p != self.resp.epsn && self.sr.rx.held > 0 {
                self.sr_drop_entry(p);
                p = psn_add(p, 1);
            }
        }
    }

    fn sr_drop_entry(&mut self, psn: u32) {
        let rx = &mut self.sr.rx;
        let i = (psn & (SR_WINDOW - 1)) as usize;
        if rx.entries[i].psn == psn {
            if let Some(h) = rx.entries[i].held.take() {
                rx.held -= 1;
                if let Held::Stashed { slot: Some(s), .. } = h {
                    rx.free.push(s);
                }
            }
        }
    }

    /// Drops everything kept (RNR NAK, error, reset of the sequence).
    pub(super) fn sr_forget(&mut self) {
        if !self.sr.on || self.sr.rx.held == 0 {
            return;
        }
        let rx = &mut self.sr.rx;
        for e in rx.entries.iter_mut() {
            if let Some(Held::Stashed { slot: Some(s), .. }) = e.held.take() {
                rx.free.push(s);
            }
        }
        rx.held = 0;
    }

    /// The SACK to send, if one is due and something is kept: BTH PSN =
    /// the expected PSN, the bitmap of kept PSNs after it.
    pub(super) fn sr_sack(&mut self) -> Option<TransportRepr> {
        if !self.sr.on || self.sr.rx.held == 0 {
            self.sr.rx.sack_due = false;
            return None;
        }
        self.sr.rx.sack_due = false;
        let epsn = self.resp.epsn;
        let mut bits = [0u8; SACK_BITMAP_LEN];
        for (i, e) in self.sr.rx.entries.iter().enumerate() {
            if e.held.is_none() {
                continue;
            }
            let d = psn_diff(e.psn, epsn);
            if d >= 1 && (d as u32) < SR_WINDOW && (e.psn & (SR_WINDOW - 1)) as usize == i {
                let b = d as usize - 1;
                bits[b / 8] |= 1 << (b % 8);
            }
        }
        let mut t = TransportRepr::new(self.bth(opcode::SR_SACK, epsn, false));
        t.aeth = Some(AethRepr {
            syndrome: syndrome::ACK_UNLIMITED,
            msn: self.resp.msn,
        });
        t.sack = Some(bits);
        self.stats.sacks_sent += 1;
        Some(t)
    }

    // ---- Requester and completer ----

    /// PSNs are in the requester's window when within SR_WINDOW of base.
    pub(super) fn sr_in_window(&self, psn: u32) -> bool {
        let d = psn_diff(psn, self.sr.tx.base);
        d >= 0 && (d as u32) < SR_WINDOW
    }

    /// The oldest send WQE moved on, or the responder's expected PSN did:
    /// the bits before the oldest PSN still needed are free again. That is
    /// the responder's expected PSN (everything before it was executed),
    /// but never past the first missing response of a READ or atomic still
    /// waiting for them. Following the expected PSN, not the oldest WQE,
    /// lets a message longer than the window slide through it.
    pub(super) fn sr_advance_base(&mut self) {
        let mut new = match self.req.sq.front() {
            Some(w) if w.started => w.first_psn,
            _ => self.req.next_psn,
        };
        let cum = self.sr.tx.cum;
        if psn_diff(cum, new) > 0 {
            let mut lim = cum;
            for w in self.req.sq.iter() {
                if !w.started || psn_diff(w.first_psn, cum) >= 0 {
                    break;
                }
                if w.opcode.is_rd_atomic() && !w.done {
                    let m = psn_add(w.first_psn, w.resp_pkts);
                    if psn_diff(m, lim) < 0 {
                        lim = m;
                    }
                    break;
                }
            }
            if psn_diff(lim, new) > 0 {
                new = lim;
            }
        }
        let t = &mut self.sr.tx;
        let d = psn_diff(new, t.base);
        if d <= 0 {
            return;
        }
        if d as u32 >= SR_WINDOW {
            t.sacked.clear_all();
            t.resp_rx.clear_all();
            t.resent.clear_all();
            t.ambiguous.clear_all();
        } else {
            let mut p = t.base;
            while p != new {
                t.sacked.clear(p);
                t.resp_rx.clear(p);
                t.resent.clear(p);
                t.ambiguous.clear(p);
                p = psn_add(p, 1);
            }
        }
        t.base = new;
        let floor = psn_add(new, MASK_24);
        if psn_diff(t.high_resp, floor) < 0 {
            t.high_resp = floor;
        }
        if psn_diff(t.cum, new) < 0 {
            t.cum = new;
        }
        if psn_diff(t.lost_below, new) < 0 {
            t.lost_below = new;
        }
    }

    /// The responder's cumulative position: it has executed everything
    /// before `epsn`.
    pub(super) fn sr_note_cum(&mut self, epsn: u32) {
        let d = psn_diff(epsn, self.sr.tx.cum);
        if d <= 0 {
            return;
        }
        let mut p = self.sr.tx.cum;
        for _ in 0..(d as u32).min(SR_WINDOW) {
            if self.sr_in_window(p) {
                self.sr_delivered(p, true);
            }
            p = psn_add(p, 1);
        }
        self.sr.tx.cum = epsn;
        self.sr.tx.scan_due = true;
        self.sr_advance_base();
    }

    /// An SR_SACK: everything before its PSN is acknowledged; its bitmap
    /// names what the responder holds beyond. Checked whole before any of
    /// it is believed.
    pub(super) fn handle_sack(&mut self, now: Nanos, t: &TransportRepr) {
        let psn = t.bth.psn;
        let (Some(aeth), Some(bits)) = (t.aeth, t.sack) else {
            self.stats.sr_bad_sacks += 1;
            return;
        };
        if !matches!(Syndrome::decode(aeth.syndrome), Syndrome::Ack { .. }) {
            self.stats.sr_bad_sacks += 1;
            return;
        }
        if !self.has_outstanding() || psn_diff(psn, self.sr.tx.base) < 0 {
            // Overtaken by a later ACK: nothing new in it.
            self.stats.dropped += 1;
            return;
        }
        // The responder cannot expect, or hold, what was never sent.
        let max = self.req.max_sent_psn;
        let mut highest = None;
        for (b, byte) in bits.iter().enumerate() {
            if *byte != 0 {
                let top = 7 - byte.leading_zeros() as usize;
                highest = Some(psn_add(psn, (b * 8 + top) as u32 + 1));
            }
        }
        if psn_diff(psn, max) >= 0 || highest.is_some_and(|h| psn_diff(h, max) >= 0) {
            self.stats.sr_bad_sacks += 1;
            return;
        }
        self.stats.sacks_received += 1;
        self.sr_note_cum(psn);
        let cum_ack = psn_add(psn, MASK_24);
        self.note_received(cum_ack);
        let mut news = self.ack_through(cum_ack, now);
        for (b, byte) in bits.iter().enumerate() {
            let mut v = *byte;
            while v != 0 {
                let bit = v.trailing_zeros() as usize;
                v &= v - 1;
                let p = psn_add(psn, (b * 8 + bit) as u32 + 1);
                if !self.sr_in_window(p) || self.sr.tx.sacked.get(p) {
                    continue;
                }
                self.sr.tx.sacked.set(p);
                self.sr.tx.scan_due = true;
                self.sr_delivered(p, false);
                news = true;
            }
        }
        if news {
            self.progress(now);
        }
        self.complete_done();
    }

    /// A READ response or atomic ACK under selective repeat: placed by its
    /// PSN whatever the order, once.
    pub(super) fn sr_handle_rd_atomic_response(
        &mut self,
        now: Nanos,
        t: &TransportRepr,
        flags: OpFlags,
        payload: &[u8],
        mem: &mut MrTable,
    ) {
        let psn = t.bth.psn;
        let Some(idx) = self.req.sq.iter().position(|w| w.contains(psn)) else {
            self.stats.duplicates_received += 1;
            return;
        };
        let w = self.req.sq[idx];
        let is_read = flags.has(OpFlags::READ_RESPONSE);
        if w.done
            || (is_read && w.opcode != WrOpcode::RdmaRead)
            || (!is_read && !w.opcode.is_atomic())
        {
            if w.done {
                self.stats.duplicates_received += 1;
            } else {
                self.stats.dropped += 1;
            }
            return;
        }
        let k = psn_diff(psn, w.first_psn) as u32;
        let in_window = self.sr_in_window(psn);
        // Beyond the bits (a READ longer than the window): in order only.
        if (in_window && self.sr.tx.resp_rx.get(psn)) || (!in_window && k != w.resp_pkts) {
            self.stats.duplicates_received += 1;
            return;
        }
        // A response means its request was executed, and everything
        // before it: the responder expects the PSN after its responses'
        // (completions can pop WQEs: find this one again after).
        self.sr_note_cum(psn_add(w.first_psn, w.npkts));
        if self.ack_through(psn_add(w.first_psn, MASK_24), now) {
            self.progress(now);
        }
        let Some(idx) = self.req.sq.iter().position(|w| w.contains(psn)) else {
            return;
        };
        let data: [u8; 8];
        let (off, bytes) = if is_read {
            let last = k + 1 == w.npkts;
            let off = k * self.mtu;
            let want = if last { w.length - off } else { self.mtu };
            // A re-read of a missing run ends with a LAST before the READ
            // does; only the READ's own end must be one.
            if payload.len() as u32 != want || (last && !flags.has(OpFlags::LAST)) {
                self.stats.errors += 1;
                self.stats.dropped += 1;
                return;
            }
            (off, payload)
        } else {
            data = t.atomic_ack.unwrap_or(0).to_ne_bytes();
            (0, &data[..])
        };
        if let Err(st) = Self::scatter(
            &w.sges[..w.num_sge as usize],
            mem,
            self.pd,
            off as usize,
            bytes,
        ) {
            let w = &mut self.req.sq[idx];
            w.done = true;
            w.status = st;
            self.complete_done();
            return;
        }
        if in_window {
            let t = &mut self.sr.tx;
            t.resp_rx.set(psn);
            if psn_diff(psn, t.high_resp) > 0 {
                t.high_resp = psn;
            }
            t.scan_due = true;
            self.sr_delivered(psn, true);
        }
        // Count the responses received in order from the first.
        let mut n = w.resp_pkts;
        while n < w.npkts {
            let p = psn_add(w.first_psn, n);
            let have = if self.sr_in_window(p) {
                self.sr.tx.resp_rx.get(p)
            } else {
                p == psn
            };
            if !have {
                break;
            }
            n += 1;
        }
        self.req.sq[idx].resp_pkts = n;
        self.note_received(psn);
        self.rtt_answered(psn, now);
        if n == w.npkts {
            // Still counted in rd_atomic_inflight until it retires in
            // order: the responder keeps only the last max_dest_rd_atomic
            // requests to replay, and an older one may yet need it.
            self.req.sq[idx].done = true;
            // WQEs after it that the responder already acknowledged can
            // complete now.
            let cum = psn_add(self.sr.tx.cum, MASK_24);
            self.ack_through(cum, now);
        }
        self.progress(now);
        self.complete_done();
    }

    /// The retransmission timer: a few smoothed RTTs, doubled per expiry
    /// without progress, never longer than the ACK timeout.
    pub(super) fn sr_rto(&self) -> Option<Nanos> {
        let t = &self.sr.tx;
        let rto = if t.srtt_ns == 0 {
            INITIAL_RTO_NS << t.backoff.min(20)
        } else if t.backoff == 0 {
            // First a probe, after two smoothed RTTs (RACK-TLP's PTO), or
            // SRTT + 4 RTTVAR if the RTT varies more than that.
            (2 * t.srtt_ns)
                .max(t.srtt_ns + 4 * t.rttvar_ns)
                .max(MIN_RTO_NS)
        } else {
            // Then RFC 6298's SRTT + 4 RTTVAR, doubled per expiry.
            (t.srtt_ns + 4 * t.rttvar_ns).max(MIN_RTO_NS) << (t.backoff - 1).min(20)
        };
        Some(match ack_timeout_ns(self.timeout) {
            Some(a) => rto.min(a),
            None => rto,
        })
    }

    /// The timer ran out: every PSN still unanswered is lost. Only a full
    /// ACK timeout without progress spends one of `retry_cnt`'s retries.
    /// Returns false when the retries are exhausted.
    pub(super) fn sr_timeout(&mut self) -> bool {
        let full = match (self.sr_rto(), ack_timeout_ns(self.timeout)) {
            (Some(r), Some(a)) => r >= a,
            _ => false,
        };
        if full {
            if self.comp.retry_left == 0 {
                return false;
            }
            self.comp.retry_left -= 1;
        }
        let t = &mut self.sr.tx;
        if t.backoff > 0 {
            // The probe did not help: everything unanswered is lost.
            t.lost_below = self.req.max_sent_psn;
            t.resent.clear_all();
        }
        t.backoff = t.backoff.saturating_add(1);
        t.probe = true;
        t.scan_due = true;
        // Karn: nothing sent before now times an RTT any more.
        self.rtt_probe = None;
        true
    }

    pub(super) fn sr_rtt_sample(&mut self, ns: Nanos) {
        let t = &mut self.sr.tx;
        if t.srtt_ns == 0 {
            t.srtt_ns = ns;
            t.rttvar_ns = ns / 2;
        } else {
            t.rttvar_ns = (3 * t.rttvar_ns + t.srtt_ns.abs_diff(ns)) / 4;
            t.srtt_ns = (7 * t.srtt_ns + ns) / 8;
        }
        if t.min_rtt_ns == 0 || ns < t.min_rtt_ns {
            t.min_rtt_ns = ns;
        }
    }

    /// Packets allowed past the oldest send WQE's first PSN: a
    /// bandwidth-delay product (line rate times the least RTT seen), at
    /// least MIN_INFLIGHT, at most the responder's window.
    pub(super) fn sr_inflight_cap(&self) -> u32 {
        let t = &self.sr.tx;
        let bdp_bytes = self.cc.p.line_rate * 1e6 / 8.0 * t.min_rtt_ns as f64 / 1e9;
        let pkts = (bdp_bytes / self.mtu as f64) as u32;
        pkts.clamp(MIN_INFLIGHT, SR_WINDOW - 1)
    }

    /// The next PSN to send again, if any, with its WQE's index: the first
    /// unanswered one that is lost, by transmission order (the responder
    /// has something sent DUPTHRESH transmissions later) or by the timer
    /// (once per expiry).
    pub(super) fn sr_next_resend(&mut self) -> Option<(usize, u32)> {
        if !self.sr.tx.scan_due {
            return None;
        }
        let found = self.sr_scan();
        if found.is_none() {
            self.sr.tx.scan_due = false;
        }
        found
    }

    fn sr_scan(&self) -> Option<(usize, u32)> {
        let t = &self.sr.tx;
        let max = self.req.max_sent_psn;
        let seq = |p: u32| t.sent_seq[(p & (SR_WINDOW - 1)) as usize];
        let timed_out = |p: u32| psn_diff(p, t.lost_below) < 0 && !t.resent.get(p);
        for (idx, w) in self.req.sq.iter().enumerate() {
            if !w.started || psn_diff(w.first_psn, max) >= 0 {
                break;
            }
            if psn_diff(psn_add(w.first_psn, w.npkts), t.base) <= 0 {
                // Wholly before the window: nothing of it is missing.
                continue;
            }
            if psn_diff(w.first_psn, t.base) > 0 && !self.sr_in_window(w.first_psn) {
                break;
            }
            if w.done {
                continue;
            }
            if w.opcode.is_rd_atomic() {
                let m = psn_add(w.first_psn, w.resp_pkts);
                if !self.sr_in_window(m) {
                    continue;
                }
                if t.probe {
                    // The oldest thing unanswered: ask again.
                    return Some((idx, m));
                }
                let s = seq(m);
                let executed = psn_diff(t.cum, w.first_psn) > 0;
                let held = !executed && t.sacked.get(w.first_psn);
                // The request is lost if the responder has later
                // transmissions but not it; its responses are, once later
                // requests were executed (their ACKs come after the
                // responses) or later responses came. The timer asks
                // again even for a request the responder held: its answer
                // may be what was lost.
                let lost = timed_out(m)
                    || (!executed && !held && seq_at_least(t.delivered_seq, s, DUPTHRESH))
                    || (executed && seq_at_least(t.acked_seq, s, DUPTHRESH))
                    || (executed
                        && !t.resent.get(m)
                        && psn_diff(t.high_resp, m) >= DUPTHRESH as i32);
                if lost {
                    return Some((idx, m));
                }
                continue;
            }
            // From the first PSN the responder has not executed.
            let from = psn_diff(t.cum, w.first_psn).max(0) as u32;
            for k in from..w.npkts {
                let p = psn_add(w.first_psn, k);
                if psn_diff(p, max) >= 0 || !self.sr_in_window(p) {
                    return None;
                }
                if t.probe {
                    // The oldest PSN unacknowledged, even if the responder
                    // holds it (its ACK may be what was lost): sent again,
                    // it makes the responder say where it is.
                    return Some((idx, p));
                }
                if t.sacked.get(p) {
                    continue;
                }
                if timed_out(p) || seq_at_least(t.delivered_seq, seq(p), DUPTHRESH) {
                    return Some((idx, p));
                }
            }
        }
        None
    }

    /// Marks what a resend of `psn` in WQE `idx` covers: the one packet,
    /// or for a READ every response from `psn` on.
    pub(super) fn sr_mark_resent(&mut self, idx: usize, psn: u32) {
        self.sr.tx.probe = false;
        let w = self.req.sq[idx];
        let end = if w.opcode == WrOpcode::RdmaRead {
            self.sr_read_run_end(&w, psn)
        } else {
            psn_add(psn, 1)
        };
        let mut p = psn;
        while p != end && self.sr_in_window(p) {
            self.sr.tx.resent.set(p);
            p = psn_add(p, 1);
        }
    }

    /// The READ responses asked for from `psn`: up to the next one that
    /// has arrived, or the end of the READ.
    pub(super) fn sr_read_run_end(&self, w: &SendWqe, psn: u32) -> u32 {
        let end = psn_add(w.first_psn, w.npkts);
        if psn_diff(psn, self.sr.tx.lost_below) < 0 {
            // After a timer expiry, the whole tail, as go-back-N asks: a
            // responder that replays only tails still answers it.
            return end;
        }
        let mut p = psn_add(psn, 1);
        while p != end {
            if self.sr_in_window(p) && self.sr.tx.resp_rx.get(p) {
                return p;
            }
            p = psn_add(p, 1);
        }
        end
    }

    /// RNR NAK: the responder dropped what it kept; the requester goes
    /// back to the NAK's PSN and forgets what was SACKed.
    pub(super) fn sr_rewound(&mut self) {
        let t = &mut self.sr.tx;
        t.sacked.clear_all();
        t.resent.clear_all();
        t.lost_below = t.base;
        t.probe = false;
    }

    /// A request packet at `psn` of WQE `idx` goes out (first time or
    /// again): it is the newest transmission for its PSNs.
    pub(super) fn sr_stamp(&mut self, idx: usize, psn: u32, resend: bool) {
        let w = &self.req.sq[idx];
        let end = if w.opcode == WrOpcode::RdmaRead {
            self.sr_read_run_end(w, psn)
        } else {
            psn_add(psn, 1)
        };
        let t = &mut self.sr.tx;
        t.tx_seq = t.tx_seq.wrapping_add(1);
        let mut p = psn;
        while p != end && psn_diff(p, t.base) >= 0 && (psn_diff(p, t.base) as u32) < SR_WINDOW {
            t.sent_seq[(p & (SR_WINDOW - 1)) as usize] = t.tx_seq;
            if resend {
                t.ambiguous.set(p);
            }
            p = psn_add(p, 1);
        }
    }

    /// The responder holds (or executed) PSN `p`: unless `p` went out more
    /// than once, everything sent before it should have arrived too.
    fn sr_delivered(&mut self, p: u32, executed: bool) {
        let t = &mut self.sr.tx;
        if t.ambiguous.get(p) {
            return;
        }
        let s = t.sent_seq[(p & (SR_WINDOW - 1)) as usize];
        seq_max(&mut t.delivered_seq, s);
        if executed {
            seq_max(&mut t.acked_seq, s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::negotiate;

    #[test]
    fn selective_repeat_only_when_both_offer_it() {
        assert!(negotiate(true, Some(true)));
        // A peer that offers nothing (rxe, an older stack, a peer that never
        // answers the question) or declines gets go-back-N.
        assert!(!negotiate(true, None));
        assert!(!negotiate(true, Some(false)));
        assert!(!negotiate(false, Some(true)));
        assert!(!negotiate(false, None));
    }
}
