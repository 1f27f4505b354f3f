//! The responder (rxe_resp.c): receive checks on every incoming request,
//! execution into memory and RECV WQEs, ACK/NAK generation, READ responses,
//! atomics, and replay of duplicates. It never touches the send queue.
//!
//! # Receive checks
//!
//! Every check IBA vol. 1 chapter 9 asks of an incoming packet (the header
//! validation of 9.6 and the responder behaviour of 9.7), in the order a
//! packet meets them: where it runs, what we do, the counter, and the test
//! that proves it. "Drop" is silent; "fatal" means NAK, the QP moves to ERR
//! and outstanding work flushes (IBA 9.9.3 classes B-D, as rxe). Tests in
//! `tests/` unless a path is given; counters: `xdp` (the XDP program's),
//! `dp` (`device::datapath::DpStats`), `qp` ([`QpStats`]).
//!
//! | # | check | where | action | counter | test |
//! |---|---|---|---|---|---|
//! | 1 | Ethernet/IP/UDP: IPv4 or IPv6 (one VLAN tag at most), UDP port 4791, not a non-first fragment | XDP, `wire` | not RoCE: to the kernel | `xdp.pass_not_roce`, `pass_fragment`; `dp.rx_not_ip`, `rx_not_udp`, `rx_not_roce`, `rx_fragment` | `netns::crafted_frames_get_the_right_verdict_and_arrive_intact`, `wire::tests::distinct_errors` |
//! | 2 | lengths: IP and UDP lengths agree with the frame, headers complete | XDP, `wire` | drop | `xdp.drop_truncated`; `dp.rx_truncated`, `rx_bad_ip_header`, `rx_bad_length` | `hostile::every_hostile_class_...` (Truncated), `wire::tests::distinct_errors` |
//! | 3 | IPv4 header checksum | `wire` | drop | `dp.rx_bad_ip_checksum` | `wire::tests::distinct_errors` |
//! | 4 | BTH TVer = 0 (9.6.1.2) | XDP, `wire` | drop | `xdp.drop_bad_tver`; `dp.rx_bad_tver` | `netns::crafted_frames_...`, `wire::tests::distinct_errors` |
//! | 5 | opcode known to some transport we serve | XDP, `wire` | drop | `xdp.drop_unknown_opcode`; `dp.rx_unknown_opcode` | `hostile::...` (UnknownOpcode), `netns::crafted_frames_...` |
//! | 6 | pad count within the payload; no payload on payload-less opcodes | `wire` | drop | `dp.rx_bad_pad` | `hostile::...` (BadPad) |
//! | 7 | ICRC (RoCEv2 A17.3.3) | `wire` | drop (rxe: the same) | `dp.rx_bad_icrc` | `hostile::...` (BadIcrc), `captures` |
//! | 8 | destination QP exists (9.6.1.4) | XDP firewall, `device` | drop | `xdp.drop_qpn_not_live`; `dp.rx_unknown_qpn` | `hostile::...` (UnknownQpn), `reliability::hostile_flood_...` |
//! | 9 | source = the connected peer (RC: the address vector, 9.6.1.5) | XDP firewall, `device` | drop | `xdp.drop_spoofed_source`; `dp.rx_wrong_source` | `hostile::...` (SpoofedSource), `netns` firewall test |
//! | 10 | opcode's transport = the QP's (RC) | [`QpEngine::handle_packet`] | drop | `qp.wrong_transport` | `responder_checks::opcodes_of_other_transports_are_dropped_silently` |
//! | 11 | P_Key matches the QP's (9.6.1.1, 10.9.3) | [`QpEngine::handle_packet`] | drop | `qp.bad_pkey` | `responder_checks::pkey_must_match`, `hostile::...` (BadPkey) |
//! | 12 | QP state accepts it: requests from RTR on, responses from RTS on (10.3.1) | [`QpEngine::handle_packet`] | drop | `qp.dropped` | `responder_checks::packets_outside_the_states_that_accept_them_are_dropped` |
//! | 13 | PSN ahead of the expected PSN (9.7.3.1) | responder | NAK PSN sequence error, once per gap | `qp.out_of_sequence_received`, `seq_naks_sent` | `responder_checks::psn_sequence_error_naks_once_per_gap`, `hostile::...` (PsnFarAhead) |
//! | 14 | PSN behind (duplicate, 9.7.4.1.4) | responder | SEND/WRITE: re-ACK, never re-apply (C9-105); READ: execute again; atomic: replay the saved result; unknown: drop | `qp.duplicates_received` | `responder_checks::duplicate_*`, `hostile::...` (PsnFarBehind) |
//! | 15 | replays of duplicates beyond the response queue | responder | drop | `qp.dropped` | `responder_checks::duplicate_replays_are_bounded` |
//! | 16 | reserved opcode of the RC range (0x15, 0x18-0x1f) | responder | fatal, NAK Invalid Request. rxe drops it silently; the spec's responder answers an unsupported opcode with Invalid Request | `qp.reserved_opcodes`, `errors` | `responder_checks::reserved_opcodes_are_invalid_requests`, `hostile::...` (ReservedOpcode), `netns::crafted_frames_...` (XDP lets it through) |
//! | 17 | opcode sequence: MIDDLE/LAST only inside a message of their kind, FIRST/ONLY only outside (9.7.5.1.1) | responder | fatal, NAK Invalid Request | `qp.errors` | `responder_checks::opcode_sequence_errors`, `hostile::...` (MiddleWithoutFirst, LastAfterOnly) |
//! | 18 | payload length: FIRST and MIDDLE exactly one MTU, LAST 1..=MTU, ONLY at most one MTU (9.7.5.1.2) | responder | fatal, NAK Invalid Request | `qp.errors` | `responder_checks::packet_lengths_follow_the_mtu`, `length_errors` |
//! | 19 | RETH DMA length at most 2^31 (C9-92), before any key | responder | fatal, NAK Invalid Request (as rxe's `check_length`) | `qp.errors` | `responder_checks::remote_access_errors_nak_and_leave_memory_untouched`, `hostile::...` (DmaLenTooLarge) |
//! | 20 | WRITE: the message's bytes = the RETH's DMA length | responder | fatal, NAK Invalid Request | `qp.errors` | `responder_checks::length_errors` |
//! | 21 | SEND with invalidate (IETH): no memory windows here | responder | fatal, NAK Invalid Request | `qp.errors` | `responder_checks::send_with_invalidate_is_an_invalid_request` |
//! | 22 | R_Key valid, in the QP's PD, VA range inside the MR, MR grants the access (9.7.5.1.3, 10.6.7) | responder, [`crate::memory`] | fatal, NAK Remote Access Error; memory untouched | `qp.errors` | `responder_checks::remote_access_errors_nak_and_leave_memory_untouched`, `hostile::...` (WrongRkey, VaOutsideMr, ReadTooLarge) |
//! | 23 | QP access flags grant remote WRITE / READ / atomic (10.2.1) | responder | fatal, NAK Remote Access Error | `qp.errors` | `responder_checks::qp_access_flags_gate_remote_operations` |
//! | 24 | atomic VA 8-byte aligned (9.4.5) | responder, [`crate::memory`] | fatal, NAK Invalid Request (rxe: the same) | `qp.errors` | `responder_checks::remote_access_errors_...` (unaligned), `hostile::...` (UnalignedAtomic) |
//! | 25 | resources: a RECV WQE for SEND and WRITE with immediate (9.7.5.1.4) | responder | RNR NAK with min_rnr_timer; the PSN is not consumed | `qp.rnr_naks_sent` | `responder_checks::rnr_nak_when_no_recv_is_posted_then_success` |
//! | 26 | resources: outstanding READ/atomic requests at most max_dest_rd_atomic (9.5.8.1) | responder | fatal, NAK Invalid Request | `qp.errors` | `responder_checks::more_reads_than_max_dest_rd_atomic_is_an_invalid_request` |
//! | 27 | the RECV WQE holds the message (length) | responder | fatal, NAK Invalid Request; the WQE completes with LOC_LEN_ERR | `qp.errors` | `responder_checks::length_errors` |
//! | 28 | the RECV WQE's lkeys are valid (local protection) | responder | fatal, NAK Remote Operational Error; the WQE completes with LOC_QP_OP_ERR | `qp.errors` | `responder_checks::recv_wqe_with_a_bad_lkey_is_a_remote_operational_error` |
//!
//! Not checked, and why: the LRH/GRH fields of native InfiniBand (RoCEv2
//! has IP instead), Q_Key (UD only: see the table in `ud`), and MigReq/APM
//! (no alternate paths). The SE bit needs no check: it is passed on into
//! the receive completion ([`Wc::solicited`]) of a SEND or a WRITE with
//! immediate, where a CQ armed for solicited events fires on it
//! (`device::rings::CqShared`).

use super::*;

/// Responses (READ, atomic, NAK) queued beyond the rd_atomic limit are
/// replays of duplicates; past this many, duplicates are dropped.
const RESP_QUEUE_CAP: usize = 2 * MAX_RD_ATOMIC as usize + 8;

/// The responder's state: the receive queue, the expected PSN, the message
/// in progress and the responses still to send.
pub(super) struct Responder {
    pub(super) rq: VecDeque<RecvWqe>,
    pub(super) epsn: u32,
    pub(super) msn: u32,
    pub(super) in_msg: InMsg,
    pub(super) nak_seq_sent: bool,
    pub(super) pending_ack: Option<u32>,
    pub(super) resp_q: VecDeque<Resp>,
    pub(super) res: [RdAtomicRes; MAX_RD_ATOMIC as usize],
    pub(super) res_next: usize,
}

impl Responder {
    pub(super) fn new(cap_recv: usize) -> Responder {
        Responder {
            rq: VecDeque::with_capacity(cap_recv),
            epsn: 0,
            msn: 0,
            in_msg: InMsg::None,
            nak_seq_sent: false,
            pending_ack: None,
            resp_q: VecDeque::with_capacity(RESP_QUEUE_CAP),
            res: [RdAtomicRes::default(); MAX_RD_ATOMIC as usize],
            res_next: 0,
        }
    }
}

#[derive(Clone, Copy)]
pub(super) struct RecvWqe {
    pub(super) wr_id: u64,
    pub(super) sges: [Sge; MAX_SGE],
    pub(super) num_sge: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum InMsg {
    None,
    /// A multi-packet SEND: bytes placed so far in the head RECV WQE.
    Send {
        offset: u32,
    },
    /// A multi-packet WRITE: its target and progress.
    Write {
        rkey: u32,
        va: u64,
        total: u32,
        offset: u32,
        imm: bool,
    },
}

/// A saved READ or atomic request, for replaying duplicates.
#[derive(Clone, Copy, Default)]
pub(super) struct RdAtomicRes {
    pub(super) valid: bool,
    pub(super) atomic: bool,
    pub(super) first_psn: u32,
    pub(super) npkts: u32,
    pub(super) orig: u64,
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Resp {
    Read {
        psn: u32,
        last_psn: u32,
        va: u64,
        rkey: u32,
        remaining: u32,
        first: bool,
        /// Re-execution of a duplicate; does not count against
        /// max_dest_rd_atomic.
        replay: bool,
    },
    AtomicAck {
        psn: u32,
        orig: u64,
        replay: bool,
    },
    Nak {
        psn: u32,
        syndrome: u8,
    },
}

/// What `post_recv` refuses for a QP in `state` (see `check_send`).
pub fn check_recv(state: QpState, wr: &RecvWr) -> Result<(), PostError> {
    if state == QpState::Reset {
        return Err(PostError::BadState(QpState::Reset));
    }
    if wr.sg_list.len() > MAX_SGE {
        return Err(PostError::TooManySge);
    }
    Ok(())
}

/// The responder's state as the XDP responder takes it over:
/// the expected PSN, the MSN and a WRITE in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RespSnapshot {
    pub epsn: u32,
    pub msn: u32,
    /// rkey, va, total, offset of a multi-packet WRITE in progress.
    pub write: Option<(u32, u64, u32, u32)>,
    /// The READs and atomics XDP executed while it held the QP, oldest
    /// first: the PSN and, for an atomic, the value found (`None`: a READ
    /// of one packet); the first `n_res` (the last `MAX_RD_ATOMIC` at
    /// most: all a duplicate can still ask for).
    pub res: [(u32, Option<u64>); MAX_RD_ATOMIC as usize],
    pub n_res: usize,
}

/// The QP's constants the XDP responder checks with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RespConsts {
    pub pkey: u16,
    pub mtu: u32,
    pub pd: u32,
    pub access: Access,
    pub dest_qpn: u32,
}

impl QpEngine {
    /// The responder's state, if XDP may take the QP's requests from here
    /// on: an RC QP in RTR or RTS with nothing to answer (no ACK, NAK or
    /// response due, no sequence NAK outstanding, no SACK due) and no
    /// message in progress but a plain WRITE. Under selective repeat also
    /// nothing kept ahead of the expected PSN: XDP serves only requests at
    /// the expected PSN, and there the two recoveries answer alike (an ACK
    /// of that PSN when it asks); whatever arrives ahead of it is punted,
    /// and the engine keeps it and SACKs.
    pub fn lendable_responder(&self) -> Option<RespSnapshot> {
        if self.qp_type != QpType::Rc
            || !matches!(self.state, QpState::Rtr | QpState::Rts)
            || (self.sr.on && (self.sr.rx.held > 0 || self.sr.rx.sack_due))
            || !self.resp.resp_q.is_empty()
            || self.resp.pending_ack.is_some()
            || self.resp.nak_seq_sent
        {
            return None;
        }
        let write = match self.resp.in_msg {
            InMsg::None => None,
            InMsg::Write {
                rkey,
                va,
                total,
                offset,
                imm: false,
            } => Some((rkey, va, total, offset)),
            _ => return None,
        };
        Some(RespSnapshot {
            epsn: self.resp.epsn,
            msn: self.resp.msn,
            write,
            res: [(0, None); MAX_RD_ATOMIC as usize],
            n_res: 0,
        })
    }

    /// Takes the responder's state back from XDP: what it placed and
    /// answered is as if this engine had done it.
    pub fn restore_responder(&mut self, s: &RespSnapshot) {
        self.resp.epsn = s.epsn & MASK_24;
        self.resp.msn = s.msn & MASK_24;
        self.resp.in_msg = match s.write {
            None => InMsg::None,
            Some((rkey, va, total, offset)) => InMsg::Write {
                rkey,
                va,
                total,
                offset,
                imm: false,
            },
        };
        // As if the engine had executed them: a duplicate atomic gets the
        // value XDP found, never a second execution; a duplicate READ is
        // executed again.
        for &(psn, orig) in &s.res[..s.n_res.min(MAX_RD_ATOMIC as usize)] {
            self.save_res(RdAtomicRes {
                valid: true,
                atomic: orig.is_some(),
                first_psn: psn & MASK_24,
                npkts: 1,
                orig: orig.unwrap_or(0),
            });
        }
    }

    pub fn responder_consts(&self) -> RespConsts {
        RespConsts {
            pkey: self.pkey,
            mtu: self.mtu,
            pd: self.pd,
            access: self.access,
            dest_qpn: self.dest_qpn,
        }
    }
}

impl QpEngine {
    pub fn post_recv(&mut self, wr: &RecvWr) -> Result<(), PostError> {
        check_recv(self.state, wr)?;
        if self.state == QpState::Err {
            self.push_wc_error(wr.wr_id, WcOpcode::Recv, WcStatus::WrFlushErr);
            return Ok(());
        }
        if self.resp.rq.len() >= self.cap_recv {
            return Err(PostError::QueueFull);
        }
        let mut r = RecvWqe {
            wr_id: wr.wr_id,
            sges: [Sge::default(); MAX_SGE],
            num_sge: wr.sg_list.len() as u8,
        };
        r.sges[..wr.sg_list.len()].copy_from_slice(wr.sg_list);
        self.resp.rq.push_back(r);
        Ok(())
    }

    pub(super) fn poll_response(&mut self, mem: &MrTable, buf: &mut [u8]) -> Option<usize> {
        if matches!(self.state, QpState::Reset | QpState::Init) {
            return None;
        }
        if let Some(r) = self.resp.resp_q.front_mut() {
            let mtu = self.mtu;
            let msn = self.resp.msn;
            let (t, payload, psn, finished) = match *r {
                Resp::Nak { psn, syndrome } => {
                    let mut t = TransportRepr::new(self.bth(opcode::RC_ACKNOWLEDGE, psn, false));
                    t.aeth = Some(AethRepr { syndrome, msn });
                    (t, None, psn, true)
                }
                Resp::AtomicAck { psn, orig, .. } => {
                    let mut t =
                        TransportRepr::new(self.bth(opcode::RC_ATOMIC_ACKNOWLEDGE, psn, false));
                    t.aeth = Some(AethRepr {
                        syndrome: syndrome::ACK_UNLIMITED,
                        msn,
                    });
                    t.atomic_ack = Some(orig);
                    (t, None, psn, true)
                }
                Resp::Read {
                    ref mut psn,
                    last_psn,
                    ref mut va,
                    rkey,
                    ref mut remaining,
                    ref mut first,
                    ..
                } => {
                    let len = (*remaining).min(mtu);
                    let last = *psn == last_psn;
                    let opc = match (*first, last) {
                        (true, true) => opcode::RC_RDMA_READ_RESPONSE_ONLY,
                        (true, false) => opcode::RC_RDMA_READ_RESPONSE_FIRST,
                        (false, true) => opcode::RC_RDMA_READ_RESPONSE_LAST,
                        (false, false) => opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                    };
                    let this_psn = *psn;
                    let src = (*va, rkey, len);
                    *psn = psn_add(*psn, 1);
                    *va = va.wrapping_add(len as u64);
                    *remaining -= len;
                    *first = false;
                    let mut t = TransportRepr::new(self.bth(opc, this_psn, false));
                    if opcode_flags(opc).has(OpFlags::AETH) {
                        t.aeth = Some(AethRepr {
                            syndrome: syndrome::ACK_UNLIMITED,
                            msn,
                        });
                    }
                    (t, Some(src), this_psn, last)
                }
            };
            if finished {
                self.resp.resp_q.pop_front();
            }
            let hl = t.header_len();
            let plen = match payload {
                Some((va, rkey, len)) => {
                    // Checked when the request arrived; the MR can have been
                    // deregistered since, so check again and send zeros rather
                    // than touch memory that is gone.
                    match mem.resolve(rkey, self.pd, va, len as u64, Access::REMOTE_READ) {
                        Ok(r) => mem.read(r, &mut buf[hl..hl + len as usize]),
                        Err(_) => buf[hl..hl + len as usize].fill(0),
                    }
                    len as usize
                }
                None => 0,
            };
            if self.resp.pending_ack.is_some_and(|a| psn_diff(a, psn) <= 0) {
                self.resp.pending_ack = None;
            }
            return Some(Self::emit(&t, plen, buf));
        }
        if self.state == QpState::Err {
            return None;
        }
        if self.sr.on && (self.resp.pending_ack.is_some() || self.sr.rx.sack_due) {
            if let Some(t) = self.sr_sack() {
                self.resp.pending_ack = None;
                return Some(Self::emit(&t, 0, buf));
            }
            // Nothing kept any more: a plain ACK of everything executed.
            self.resp.pending_ack = Some(psn_add(self.resp.epsn, MASK_24));
        }
        let psn = self.resp.pending_ack.take()?;
        self.stats.acks_sent += 1;
        let mut t = TransportRepr::new(self.bth(opcode::RC_ACKNOWLEDGE, psn, false));
        t.aeth = Some(AethRepr {
            syndrome: syndrome::ACK_UNLIMITED,
            msn: self.resp.msn,
        });
        Some(Self::emit(&t, 0, buf))
    }

    /// Copies `data` into an SGE list at byte offset `off`.
    pub(super) fn scatter(
        sges: &[Sge],
        mem: &mut MrTable,
        pd: u32,
        mut off: usize,
        data: &[u8],
    ) -> Result<(), WcStatus> {
        let mut done = 0;
        for s in sges {
            if done == data.len() {
                break;
            }
            let len = s.length as usize;
            if off >= len {
                off -= len;
                continue;
            }
            let n = (len - off).min(data.len() - done);
            let r = mem
                .resolve_local(
                    s.lkey,
                    pd,
                    s.addr + off as u64,
                    n as u64,
                    Access::LOCAL_WRITE,
                )
                .map_err(|_| WcStatus::LocProtErr)?;
            mem.write(r, &data[done..done + n]);
            done += n;
            off = 0;
        }
        if done < data.len() {
            return Err(WcStatus::LocLenErr);
        }
        Ok(())
    }

    /// Queues a response. New READ/atomic requests are bounded by
    /// max_dest_rd_atomic before they get here; replays of duplicates are
    /// dropped once the queue is long, so a peer cannot grow it.
    pub(super) fn queue_resp(&mut self, r: Resp) {
        let replay = matches!(
            r,
            Resp::Read { replay: true, .. } | Resp::AtomicAck { replay: true, .. }
        );
        if replay && self.resp.resp_q.len() >= RESP_QUEUE_CAP {
            self.stats.dropped += 1;
            return;
        }
        self.resp.resp_q.push_back(r);
    }

    /// A fatal responder error: NAK, then ERR (IBA 9.9.3 classes B-D, as rxe).
    pub(super) fn responder_fatal(&mut self, psn: u32, code: u8, wc: Option<(u64, WcStatus)>) {
        self.stats.errors += 1;
        self.resp.resp_q.clear();
        self.resp.resp_q.push_back(Resp::Nak {
            psn,
            syndrome: code,
        });
        if let Some((wr_id, status)) = wc {
            // The RECV WQE that took the error completes with it.
            self.resp.rq.pop_front();
            self.push_wc_error(wr_id, WcOpcode::Recv, status);
        }
        self.enter_error();
    }

    pub(super) fn handle_request(
        &mut self,
        t: &TransportRepr,
        flags: OpFlags,
        payload: &[u8],
        mem: &mut MrTable,
    ) {
        let psn = t.bth.psn;
        let d = psn_diff(psn, self.resp.epsn);
        if d > 0 && self.sr.on {
            return self.sr_out_of_order(t, flags, payload, mem, d as u32);
        }
        if d > 0 {
            self.stats.out_of_sequence_received += 1;
            if !self.resp.nak_seq_sent {
                self.resp.nak_seq_sent = true;
                self.stats.seq_naks_sent += 1;
                let epsn = self.resp.epsn;
                self.queue_resp(Resp::Nak {
                    psn: epsn,
                    syndrome: syndrome::NAK_PSN_SEQ,
                });
            }
            return;
        }
        if d < 0 {
            self.handle_duplicate(t, flags, psn, mem);
            return;
        }
        self.execute_request(t, flags, Body::Bytes(payload), mem);
        if self.sr.on {
            self.sr_commit(mem);
        }
    }

    /// A request at the expected PSN: the checks of the table above, then
    /// execution. Under selective repeat a kept request comes here when
    /// its turn comes, its payload possibly already placed.
    pub(super) fn execute_request(
        &mut self,
        t: &TransportRepr,
        flags: OpFlags,
        body: Body,
        mem: &mut MrTable,
    ) {
        let psn = t.bth.psn;
        self.resp.nak_seq_sent = false;
        let plen = body.len();
        // A reserved opcode of the RC range at the expected PSN: the spec's
        // Invalid Request (rxe drops it silently).
        if flags.has(OpFlags::RESERVED) {
            self.stats.reserved_opcodes += 1;
            return self.responder_fatal(psn, syndrome::NAK_INVALID_REQUEST, None);
        }
        let pos = flags.position();

        // Opcode sequence: a message in progress must continue with its own
        // kind; otherwise only a FIRST or ONLY may start one.
        let continues = pos.continues();
        let seq_ok = match self.resp.in_msg {
            InMsg::None => !continues,
            InMsg::Send { .. } => continues && flags.has(OpFlags::SEND),
            InMsg::Write { .. } => continues && flags.has(OpFlags::WRITE),
        };
        if !seq_ok {
            return self.responder_fatal(psn, syndrome::NAK_INVALID_REQUEST, None);
        }
        // Payload sizes: FIRST and MIDDLE carry exactly one MTU, LAST and
        // ONLY at most one (LAST at least one byte).
        let len_ok = match pos {
            Position::First | Position::Middle => plen == self.mtu,
            Position::Last => plen >= 1 && plen <= self.mtu,
            Position::Only => plen <= self.mtu,
        };
        if !len_ok {
            return self.responder_fatal(psn, syndrome::NAK_INVALID_REQUEST, None);
        }
        // A message longer than 2^31 is a length error before any key is
        // looked at (IBA C9-92; rxe's check_length).
        if t.reth
            .is_some_and(|r| r.dma_len as u64 > crate::memory::MAX_MSG_LEN)
        {
            return self.responder_fatal(psn, syndrome::NAK_INVALID_REQUEST, None);
        }

        if flags.has(OpFlags::SEND) {
            if t.ieth.is_some() {
                // No memory windows or invalidation here.
                return self.responder_fatal(psn, syndrome::NAK_INVALID_REQUEST, None);
            }
            let offset = match self.resp.in_msg {
                InMsg::Send { offset } => offset,
                _ => 0,
            };
            let Some(r) = self.resp.rq.front().copied() else {
                return self.rnr_nak(psn);
            };
            let placed = match body {
                Body::Bytes(payload) => Self::scatter(
                    &r.sges[..r.num_sge as usize],
                    mem,
                    self.pd,
                    offset as usize,
                    payload,
                ),
                Body::Placed(_) => Ok(()),
            };
            if let Err(st) = placed {
                let code = if st == WcStatus::LocLenErr {
                    syndrome::NAK_INVALID_REQUEST
                } else {
                    syndrome::NAK_REMOTE_OPERATIONAL
                };
                let st = if st == WcStatus::LocProtErr {
                    WcStatus::LocQpOpErr
                } else {
                    st
                };
                return self.responder_fatal(psn, code, Some((r.wr_id, st)));
            }
            if flags.has(OpFlags::LAST) {
                self.resp.rq.pop_front();
                self.completions.push_back(Wc {
                    wr_id: r.wr_id,
                    status: WcStatus::Success,
                    opcode: WcOpcode::Recv,
                    byte_len: offset + plen,
                    imm: t.imm,
                    qp_num: self.qpn,
                    solicited: t.bth.solicited,
                    src_qp: 0,
                    grh: None,
                });
                self.resp.in_msg = InMsg::None;
                self.resp.msn = psn_add(self.resp.msn, 1);
            } else {
                self.resp.in_msg = InMsg::Send {
                    offset: offset + plen,
                };
            }
        } else if flags.has(OpFlags::WRITE) {
            let (rkey, va, total, offset, imm_expected) = match self.resp.in_msg {
                InMsg::Write {
                    rkey,
                    va,
                    total,
                    offset,
                    ..
                } => (rkey, va, total, offset, flags.has(OpFlags::IMM)),
                _ => {
                    let Some(reth) = t.reth else {
                        return self.responder_fatal(psn, syndrome::NAK_INVALID_REQUEST, None);
                    };
                    (reth.rkey, reth.va, reth.dma_len, 0, flags.has(OpFlags::IMM))
                }
            };
            // The whole message must fit what the RETH announced, and a
            // FIRST must announce more than one packet's worth.
            let end = offset as u64 + plen as u64;
            let last = flags.has(OpFlags::LAST);
            if end > total as u64 || (last && end != total as u64) {
                return self.responder_fatal(psn, syndrome::NAK_INVALID_REQUEST, None);
            }
            if offset == 0 && total > 0 {
                if let Err(e) = mem.resolve(rkey, self.pd, va, total as u64, Access::REMOTE_WRITE) {
                    let _ = e;
                    return self.responder_fatal(psn, syndrome::NAK_REMOTE_ACCESS, None);
                }
                if !self.access.contains(Access::REMOTE_WRITE) {
                    return self.responder_fatal(psn, syndrome::NAK_REMOTE_ACCESS, None);
                }
            }
            // WRITE with immediate consumes a RECV: check before touching memory.
            if last && imm_expected && self.resp.rq.is_empty() {
                return self.rnr_nak(psn);
            }
            if let (Body::Bytes(payload), true) = (body, plen > 0) {
                match mem.resolve(
                    rkey,
                    self.pd,
                    va + offset as u64,
                    plen as u64,
                    Access::REMOTE_WRITE,
                ) {
                    Ok(r) => mem.write(r, payload),
                    Err(_) => {
                        // Deregistered mid-message.
                        return self.responder_fatal(psn, syndrome::NAK_REMOTE_ACCESS, None);
                    }
                }
            }
            if last {
                if imm_expected {
                    let r = self.resp.rq.pop_front().expect("checked above");
                    self.completions.push_back(Wc {
                        wr_id: r.wr_id,
                        status: WcStatus::Success,
                        opcode: WcOpcode::RecvRdmaWithImm,
                        byte_len: total,
                        imm: t.imm,
                        qp_num: self.qpn,
                        solicited: t.bth.solicited,
                        src_qp: 0,
                        grh: None,
                    });
                }
                self.resp.in_msg = InMsg::None;
                self.resp.msn = psn_add(self.resp.msn, 1);
            } else {
                self.resp.in_msg = InMsg::Write {
                    rkey,
                    va,
                    total,
                    offset: end as u32,
                    imm: imm_expected,
                };
            }
        } else if flags.has(OpFlags::READ_REQUEST) {
            let Some(reth) = t.reth else {
                return self.responder_fatal(psn, syndrome::NAK_INVALID_REQUEST, None);
            };
            if self.outstanding_reads() >= self.max_dest_rd_atomic.max(1) as usize {
                return self.responder_fatal(psn, syndrome::NAK_INVALID_REQUEST, None);
            }
            if reth.dma_len > 0 {
                let ok = self.access.contains(Access::REMOTE_READ)
                    && mem
                        .resolve(
                            reth.rkey,
                            self.pd,
                            reth.va,
                            reth.dma_len as u64,
                            Access::REMOTE_READ,
                        )
                        .is_ok();
                if !ok {
                    return self.responder_fatal(psn, syndrome::NAK_REMOTE_ACCESS, None);
                }
            }
            let npkts = self.packets_for(reth.dma_len);
            self.save_res(RdAtomicRes {
                valid: true,
                atomic: false,
                first_psn: psn,
                npkts,
                orig: 0,
            });
            self.queue_resp(Resp::Read {
                psn,
                last_psn: psn_add(psn, npkts - 1),
                va: reth.va,
                rkey: reth.rkey,
                remaining: reth.dma_len,
                first: true,
                replay: false,
            });
            self.resp.epsn = psn_add(self.resp.epsn, npkts);
            self.resp.msn = psn_add(self.resp.msn, 1);
            return;
        } else if flags.has(OpFlags::ATOMIC) {
            let Some(a) = t.atomic_eth else {
                return self.responder_fatal(psn, syndrome::NAK_INVALID_REQUEST, None);
            };
            if self.outstanding_reads() >= self.max_dest_rd_atomic.max(1) as usize {
                return self.responder_fatal(psn, syndrome::NAK_INVALID_REQUEST, None);
            }
            if !self.access.contains(Access::REMOTE_ATOMIC) {
                return self.responder_fatal(psn, syndrome::NAK_REMOTE_ACCESS, None);
            }
            let r = match mem.resolve_atomic(a.rkey, self.pd, a.va) {
                Ok(r) => r,
                Err(AccessError::Unaligned) => {
                    return self.responder_fatal(psn, syndrome::NAK_INVALID_REQUEST, None)
                }
                Err(_) => return self.responder_fatal(psn, syndrome::NAK_REMOTE_ACCESS, None),
            };
            let opn = if t.bth.opcode == opcode::RC_COMPARE_SWAP {
                AtomicOp::CmpSwap {
                    compare: a.compare,
                    swap: a.swap_add,
                }
            } else {
                AtomicOp::FetchAdd(a.swap_add)
            };
            let orig = mem.atomic(r, opn);
            self.save_res(RdAtomicRes {
                valid: true,
                atomic: true,
                first_psn: psn,
                npkts: 1,
                orig,
            });
            self.queue_resp(Resp::AtomicAck {
                psn,
                orig,
                replay: false,
            });
            self.resp.epsn = psn_add(self.resp.epsn, 1);
            self.resp.msn = psn_add(self.resp.msn, 1);
            return;
        } else {
            self.stats.dropped += 1;
            return;
        }
        self.resp.epsn = psn_add(self.resp.epsn, 1);
        if t.bth.ack_req {
            self.resp.pending_ack = Some(psn);
        }
    }

    pub(super) fn outstanding_reads(&self) -> usize {
        self.resp
            .resp_q
            .iter()
            .filter(|r| {
                matches!(
                    r,
                    Resp::Read { replay: false, .. } | Resp::AtomicAck { replay: false, .. }
                )
            })
            .count()
    }

    pub(super) fn save_res(&mut self, r: RdAtomicRes) {
        let n = self.max_dest_rd_atomic.max(1) as usize;
        self.resp.res[self.resp.res_next % n] = r;
        self.resp.res_next = (self.resp.res_next + 1) % n;
    }

    pub(super) fn rnr_nak(&mut self, psn: u32) {
        self.stats.rnr_naks_sent += 1;
        let code = syndrome::RNR_NAK | (self.min_rnr_timer & 0x1f);
        // An RNR NAK is not sticky: the requester retries this very PSN,
        // and everything after it (selective repeat forgets what it kept).
        self.resp.pending_ack = None;
        self.sr_forget();
        self.queue_resp(Resp::Nak {
            psn,
            syndrome: code,
        });
    }

    pub(super) fn handle_duplicate(
        &mut self,
        t: &TransportRepr,
        flags: OpFlags,
        psn: u32,
        mem: &MrTable,
    ) {
        self.stats.duplicates_received += 1;
        if flags.any(OpFlags::SEND | OpFlags::WRITE) {
            // Already applied: never apply twice, but answer every duplicate
            // (IBA C9-105, as rxe's duplicate_request() does, AckReq or not)
            // so that a requester whose ACKs were lost learns how far we are.
            // ACKs coalesce, so a retransmitted burst costs one ACK.
            self.resp.pending_ack = Some(psn_add(self.resp.epsn, MASK_24));
            return;
        }
        let n = self.max_dest_rd_atomic.max(1) as usize;
        let found = self.resp.res[..n].iter().copied().find(|r| {
            r.valid && {
                let d = psn_diff(psn, r.first_psn);
                d >= 0 && (d as u32) < r.npkts
            }
        });
        let Some(res) = found else {
            self.stats.dropped += 1;
            return;
        };
        if flags.has(OpFlags::ATOMIC) {
            if res.atomic && res.first_psn == psn {
                // Replay the saved result; never execute twice.
                self.queue_resp(Resp::AtomicAck {
                    psn,
                    orig: res.orig,
                    replay: true,
                });
            } else {
                self.stats.dropped += 1;
            }
            return;
        }
        let Some(reth) = t.reth else {
            self.stats.dropped += 1;
            return;
        };
        // A duplicate READ is executed again, possibly for the tail of the
        // original: it must end where the original ended.
        let npkts = self.packets_for(reth.dma_len);
        // Go-back-N asks again for a tail; selective repeat for any run
        // inside the original.
        let end = psn_add(psn, npkts);
        let orig_end = psn_add(res.first_psn, res.npkts);
        let ends = if self.sr.on {
            psn_diff(end, orig_end) <= 0
        } else {
            end == orig_end
        };
        let allowed = self.access.contains(Access::REMOTE_READ)
            && (reth.dma_len == 0
                || mem
                    .resolve(
                        reth.rkey,
                        self.pd,
                        reth.va,
                        reth.dma_len as u64,
                        Access::REMOTE_READ,
                    )
                    .is_ok());
        if res.atomic || !ends || !allowed {
            self.stats.dropped += 1;
            return;
        }
        self.queue_resp(Resp::Read {
            psn,
            last_psn: psn_add(psn, npkts - 1),
            va: reth.va,
            rkey: reth.rkey,
            remaining: reth.dma_len,
            first: true,
            replay: true,
        });
    }
}
