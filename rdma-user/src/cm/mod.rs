//! The communication manager (IBA ch. 12) as a sans-IO engine: it takes
//! received CM MADs, calls from its user (listen, connect, accept, reject,
//! establish, disconnect) and the time; it yields MADs to send, events and
//! its next deadline. No sockets, threads or clocks: `rdma-ibverbs`' CM
//! thread moves MADs through QP1 and turns events into rdma_cm's.
//!
//! A connection is named by its local communication id. States follow
//! IBA figure 173, without the alternate path (LAP/APR):
//!
//! ```text
//! active:  Idle -connect-> ReqSent -REP-> RepRcvd -establish-> Established
//! passive: Idle -REQ-> ReqRcvd -accept-> RepSent -RTU-> Established
//! both:    Established -disconnect-> DreqSent -DREP-> TimeWait -> gone
//!          Established -DREQ-> (DREP sent) TimeWait -> gone
//! ```
//!
//! Retransmission: a REQ, REP or DREQ left unanswered is sent again after
//! the response time-out, up to `max_cm_retries` times; then the
//! connection fails (`Unreachable`, or `Disconnected` for a DREQ). An MRA
//! extends the wait by its service time-out. Duplicates are answered as
//! the spec says (a REP again with the RTU, a DREQ again with the DREP),
//! and messages for no connection are counted and dropped.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};

use crate::wire::cm::*;

/// Nanoseconds on the caller's clock.
pub type Nanos = u64;

/// 4.096 µs · 2^exp, the IBA time-out encoding, in nanoseconds.
pub fn timeout_ns(exp: u8) -> Nanos {
    4096u64 << exp.min(31)
}

/// How long a closed connection's id stays reserved, answering late
/// duplicates instead of letting a new connection take them.
pub const TIME_WAIT_NS: Nanos = 1_000_000_000;

#[derive(Debug, Clone, Copy)]
pub struct CmConfig {
    /// This port's CA GUID (EUI-64 of the MAC, as rxe's).
    pub ca_guid: u64,
    /// The response time-out we announce and wait, as 4.096 µs · 2^n
    /// (rdma_cm's CMA_CM_RESPONSE_TIMEOUT is 20: 4.3 s).
    pub response_timeout: u8,
    /// Retransmissions of an unanswered REQ, REP or DREQ (rdma_cm: 15).
    pub max_retries: u8,
    /// The high half of the TIDs we start (the kernel's MAD agent number).
    pub tid_high: u32,
    /// The first local communication id (later ones count up from it).
    pub first_comm_id: u32,
}

impl Default for CmConfig {
    fn default() -> Self {
        CmConfig {
            ca_guid: 0,
            response_timeout: 20,
            max_retries: 15,
            tid_high: 2,
            first_comm_id: 1,
        }
    }
}

/// A connection's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmState {
    ReqSent,
    ReqRcvd,
    RepSent,
    RepRcvd,
    Established,
    DreqSent,
    TimeWait,
    /// SIDR: a SIDR_REQ sent, waiting for the SIDR_REP.
    SidrReqSent,
    /// SIDR: a SIDR_REQ received, waiting for accept or reject.
    SidrReqRcvd,
}

/// What a connection is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ for a listened-to service: a new passive connection `id`.
    ConnectRequest {
        listener: u32,
        id: u32,
        peer: IpAddr,
        req: Box<Req>,
    },
    /// The REP to our REQ: move the QP to RTR and RTS, then `establish`.
    ConnectResponse { id: u32, rep: Box<Rep> },
    /// RTU received (passive) or sent (active).
    Established { id: u32 },
    /// A REJ: the reason and the peer's private data.
    Rejected {
        id: u32,
        reason: u16,
        private_data: Box<[u8; REJ_PRIVATE_LEN]>,
    },
    /// No answer after every retry.
    Unreachable { id: u32 },
    /// The connection is closed (a DREQ or DREP received, or the DREQ's
    /// retries spent).
    Disconnected { id: u32 },
    /// A SIDR_REQ for a listened-to UD service.
    SidrRequest {
        listener: u32,
        id: u32,
        peer: IpAddr,
        req: Box<SidrReq>,
    },
    /// The SIDR_REP to our SIDR_REQ.
    SidrReply { id: u32, rep: Box<SidrRep> },
}

/// A MAD to send to the CM at `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub to: IpAddr,
    pub mad: [u8; MAD_LEN],
}

/// Why a call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmError {
    /// No such connection.
    NoId,
    /// The connection is not in a state that allows the call.
    WrongState(CmState),
    /// Somebody already listens on this service id.
    InUse,
}

impl std::fmt::Display for CmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CmError::NoId => f.write_str("no such CM connection"),
            CmError::WrongState(s) => write!(f, "CM connection is in state {s:?}"),
            CmError::InUse => f.write_str("service id already listened on"),
        }
    }
}
impl std::error::Error for CmError {}

/// Drops and answers, for `rdma-xdp stats` and the tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmStats {
    pub rx_mads: u64,
    pub tx_mads: u64,
    pub retransmits: u64,
    /// Not a CM MAD we take (bad header, unknown attribute).
    pub rx_bad: u64,
    /// A message for no connection, or in a state that has no use for it.
    pub rx_unexpected: u64,
    pub rx_duplicates: u64,
    /// REQs rejected because nobody listens on their service.
    pub rej_no_listener: u64,
}

/// The active side's connection parameters (what rdma_connect puts in
/// the REQ).
#[derive(Debug, Clone, Copy)]
pub struct ConnectParams {
    pub peer: IpAddr,
    pub service_id: u64,
    pub qpn: u32,
    /// The PSN our QP expects to receive first (its RQ PSN): the peer
    /// sends from it.
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub path_mtu: u8,
    pub primary: CmPath,
    pub private_data: [u8; REQ_PRIVATE_LEN],
}

/// rdma_cm's local ACK time-out for RoCE: its packet life time
/// (CMA_IBOE_PACKET_LIFETIME, 16) plus one, as rxe's REQs carry it.
pub const CMA_ACK_TIMEOUT: u8 = 17;

/// What a connecting rdma_cm user chose (`rdma_connect`'s parameters and
/// the QP's).
#[derive(Debug, Clone, Copy)]
pub struct RdmaCmConnect<'a> {
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub port_space: u16,
    pub qpn: u32,
    /// The PSN our QP expects to receive first (its RQ PSN): the peer
    /// sends from it.
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: bool,
    /// IBA MTU code of the path.
    pub path_mtu: u8,
    pub traffic_class: u8,
    /// None: rdma_cm's default ([`CMA_ACK_TIMEOUT`]).
    pub ack_timeout: Option<u8>,
    /// The user's private data (at most 56 bytes after rdma_cm's header).
    pub private_data: &'a [u8],
}

impl ConnectParams {
    /// The REQ rdma_cm sends over RoCE for `c`: permissive LIDs, the
    /// addresses' GIDs, the flow label of the two ports, hop limit 64, and
    /// rdma_cm's header before the user's private data. None if the
    /// private data does not fit.
    pub fn rdma_cm(c: &RdmaCmConnect) -> Option<ConnectParams> {
        let room = REQ_PRIVATE_LEN - CmaHeader::LEN;
        if c.private_data.len() > room {
            return None;
        }
        let mut private_data = [0u8; REQ_PRIVATE_LEN];
        CmaHeader {
            src_port: c.src.port(),
            src: c.src.ip(),
            dst: c.dst.ip(),
        }
        .emit(&mut private_data);
        private_data[CmaHeader::LEN..CmaHeader::LEN + c.private_data.len()]
            .copy_from_slice(c.private_data);
        Some(ConnectParams {
            peer: c.dst.ip(),
            service_id: service_id(c.port_space, c.dst.port()),
            qpn: c.qpn,
            starting_psn: c.starting_psn,
            responder_resources: c.responder_resources,
            initiator_depth: c.initiator_depth,
            retry_count: c.retry_count.min(7),
            rnr_retry_count: c.rnr_retry_count.min(7),
            srq: c.srq,
            path_mtu: c.path_mtu,
            primary: CmPath {
                local_lid: 0xffff,
                remote_lid: 0xffff,
                local_gid: crate::wire::gid_of(c.src.ip()),
                remote_gid: crate::wire::gid_of(c.dst.ip()),
                flow_label: cma_flow_label(c.src.port(), c.dst.port()),
                packet_rate: 0,
                traffic_class: c.traffic_class,
                hop_limit: 64,
                sl: 0,
                subnet_local: false,
                local_ack_timeout: c.ack_timeout.unwrap_or(CMA_ACK_TIMEOUT),
            },
            private_data,
        })
    }
}

/// The passive side's answer (what rdma_accept puts in the REP).
#[derive(Debug, Clone, Copy)]
pub struct AcceptParams {
    pub qpn: u32,
    /// The PSN our QP expects to receive first (its RQ PSN).
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub private_data: [u8; REP_PRIVATE_LEN],
}

struct Conn {
    state: CmState,
    peer: IpAddr,
    remote_comm_id: u32,
    remote_qpn: u32,
    /// The TID of the exchange in progress (echoed by the peer).
    tid: u64,
    /// The last REQ, REP or DREQ, kept until answered; and the last RTU or
    /// DREP, to answer a duplicate with.
    pending: Option<[u8; MAD_LEN]>,
    answer: Option<[u8; MAD_LEN]>,
    retries_left: u8,
    deadline: Option<Nanos>,
    /// The wait for an answer: response time-outs (ours, or the peer's for
    /// a REP we wait on), longer after an MRA.
    wait: Nanos,
}

/// The CM of one port.
pub struct CmAgent {
    cfg: CmConfig,
    conns: HashMap<u32, Conn>,
    /// service id -> listener handle.
    listeners: HashMap<u64, u32>,
    next_comm_id: u32,
    next_listener: u32,
    out: VecDeque<Outgoing>,
    events: VecDeque<CmEvent>,
    pub stats: CmStats,
}

impl CmAgent {
    pub fn new(cfg: CmConfig) -> CmAgent {
        CmAgent {
            cfg,
            conns: HashMap::new(),
            listeners: HashMap::new(),
            next_comm_id: cfg.first_comm_id.max(1),
            next_listener: 1,
            out: VecDeque::new(),
            events: VecDeque::new(),
            stats: CmStats::default(),
        }
    }

    pub fn config(&self) -> &CmConfig {
        &self.cfg
    }

    fn alloc_comm_id(&mut self) -> u32 {
        loop {
            let id = self.next_comm_id;
            self.next_comm_id = self.next_comm_id.wrapping_add(1).max(1);
            if !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    /// The TID of an exchange this side starts: the kernel's layout.
    fn own_tid(&self, comm_id: u32) -> u64 {
        (self.cfg.tid_high as u64) << 32 | comm_id.swap_bytes() as u64
    }

    pub fn state(&self, id: u32) -> Option<CmState> {
        self.conns.get(&id).map(|c| c.state)
    }

    /// Connections in any state (time-wait included).
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    pub fn listen(&mut self, service_id: u64) -> Result<u32, CmError> {
        if self.listeners.contains_key(&service_id) {
            return Err(CmError::InUse);
        }
        let h = self.next_listener;
        self.next_listener += 1;
        self.listeners.insert(service_id, h);
        Ok(h)
    }

    pub fn unlisten(&mut self, listener: u32) {
        self.listeners.retain(|_, h| *h != listener);
    }

    fn send(&mut self, to: IpAddr, mad: [u8; MAD_LEN]) {
        self.stats.tx_mads += 1;
        self.out.push_back(Outgoing { to, mad });
    }

    /// Sends `mad` and waits `wait` for its answer, retrying.
    fn send_and_wait(&mut self, now: Nanos, id: u32, mad: [u8; MAD_LEN], wait: Nanos) {
        let retries = self.cfg.max_retries;
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.pending = Some(mad);
        c.retries_left = retries;
        c.wait = wait;
        c.deadline = Some(now + wait);
        let to = c.peer;
        self.send(to, mad);
    }

    fn our_wait(&self) -> Nanos {
        timeout_ns(self.cfg.response_timeout)
    }

    /// Starts a connection: sends the REQ. Returns its id.
    pub fn connect(&mut self, now: Nanos, p: &ConnectParams) -> u32 {
        let id = self.alloc_comm_id();
        let tid = self.own_tid(id);
        let req = Req {
            local_comm_id: id,
            service_id: p.service_id,
            local_ca_guid: self.cfg.ca_guid,
            local_qkey: 0,
            local_qpn: p.qpn,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: self.cfg.response_timeout,
            transport_type: 0,
            end_to_end_flow_control: false,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: self.cfg.response_timeout,
            retry_count: p.retry_count,
            pkey: 0xffff,
            path_mtu: p.path_mtu,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: self.cfg.max_retries,
            srq: p.srq,
            extended_transport: 0,
            primary: p.primary,
            alternate: CmPath::default(),
            private_data: p.private_data,
        };
        self.conns.insert(
            id,
            Conn {
                state: CmState::ReqSent,
                peer: p.peer,
                remote_comm_id: 0,
                remote_qpn: 0,
                tid,
                pending: None,
                answer: None,
                retries_left: 0,
                deadline: None,
                wait: 0,
            },
        );
        let mad = CmMad::new(tid, CmMessage::Req(req)).emit();
        // The peer's REP may take its response time-out plus the path's
        // round trip; rdma_cm announces the same 2^20 both ways.
        let wait = self.our_wait() * 2;
        self.send_and_wait(now, id, mad, wait);
        id
    }

    /// Resolves a UD service: sends a SIDR_REQ. Returns its id.
    pub fn sidr_request(
        &mut self,
        now: Nanos,
        peer: IpAddr,
        service_id: u64,
        private_data: [u8; SIDR_REQ_PRIVATE_LEN],
    ) -> u32 {
        let id = self.alloc_comm_id();
        let tid = self.own_tid(id);
        self.conns.insert(
            id,
            Conn {
                state: CmState::SidrReqSent,
                peer,
                remote_comm_id: 0,
                remote_qpn: 0,
                tid,
                pending: None,
                answer: None,
                retries_left: 0,
                deadline: None,
                wait: 0,
            },
        );
        let m = SidrReq {
            request_id: id,
            pkey: 0xffff,
            service_id,
            private_data,
        };
        let mad = CmMad::new(tid, CmMessage::SidrReq(m)).emit();
        let wait = self.our_wait();
        self.send_and_wait(now, id, mad, wait);
        id
    }

    /// Answers a SIDR_REQ: the QP and Q_Key (status SUCCESS), or a reject.
    pub fn sidr_reply(
        &mut self,
        id: u32,
        status: u8,
        qpn: u32,
        qkey: u32,
        service_id: u64,
        private_data: [u8; SIDR_REP_PRIVATE_LEN],
    ) -> Result<(), CmError> {
        let c = self.conns.get(&id).ok_or(CmError::NoId)?;
        if c.state != CmState::SidrReqRcvd {
            return Err(CmError::WrongState(c.state));
        }
        let (peer, tid, rid) = (c.peer, c.tid, c.remote_comm_id);
        let m = SidrRep {
            request_id: rid,
            status,
            add_info_length: 0,
            qpn,
            service_id,
            qkey,
            class_port_info: [0; 72],
            private_data,
        };
        self.send(peer, CmMad::new(tid, CmMessage::SidrRep(m)).emit());
        self.conns.remove(&id);
        Ok(())
    }

    /// The passive side accepts: sends the REP.
    pub fn accept(&mut self, now: Nanos, id: u32, p: &AcceptParams) -> Result<(), CmError> {
        let c = self.conns.get(&id).ok_or(CmError::NoId)?;
        if c.state != CmState::ReqRcvd {
            return Err(CmError::WrongState(c.state));
        }
        let rep = Rep {
            local_comm_id: id,
            remote_comm_id: c.remote_comm_id,
            local_qkey: 0,
            local_qpn: p.qpn,
            local_eecn: 0,
            starting_psn: p.starting_psn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            // rxe's (and the kernel's default) target ACK delay.
            target_ack_delay: 15,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            local_ca_guid: self.cfg.ca_guid,
            private_data: p.private_data,
        };
        let mad = CmMad::new(c.tid, CmMessage::Rep(rep)).emit();
        let wait = c.wait;
        self.conns.get_mut(&id).unwrap().state = CmState::RepSent;
        self.send_and_wait(now, id, mad, wait);
        Ok(())
    }

    /// Refuses a REQ (or SIDR_REQ) or a REP: sends a REJ with `reason`.
    pub fn reject(
        &mut self,
        id: u32,
        reason: u16,
        private_data: [u8; REJ_PRIVATE_LEN],
    ) -> Result<(), CmError> {
        let c = self.conns.get(&id).ok_or(CmError::NoId)?;
        let rejected = match c.state {
            CmState::ReqRcvd => msg::REQ,
            CmState::RepRcvd => msg::REP,
            CmState::SidrReqRcvd => {
                return self.sidr_reply(id, sidr::REJECT, 0, 0, 0, [0; SIDR_REP_PRIVATE_LEN]);
            }
            s => return Err(CmError::WrongState(s)),
        };
        let rej = Rej {
            local_comm_id: id,
            remote_comm_id: c.remote_comm_id,
            message_rejected: rejected,
            reject_info_length: 0,
            reason,
            ari: [0; REJ_ARI_LEN],
            private_data,
        };
        let (peer, tid) = (c.peer, c.tid);
        self.send(peer, CmMad::new(tid, CmMessage::Rej(rej)).emit());
        self.conns.remove(&id);
        Ok(())
    }

    /// The active side's QP is ready: sends the RTU; established.
    pub fn establish(
        &mut self,
        id: u32,
        private_data: [u8; RTU_PRIVATE_LEN],
    ) -> Result<(), CmError> {
        let c = self.conns.get_mut(&id).ok_or(CmError::NoId)?;
        if c.state != CmState::RepRcvd {
            return Err(CmError::WrongState(c.state));
        }
        let rtu = Rtu {
            local_comm_id: id,
            remote_comm_id: c.remote_comm_id,
            private_data,
        };
        let mad = CmMad::new(c.tid, CmMessage::Rtu(rtu)).emit();
        c.state = CmState::Established;
        c.answer = Some(mad);
        let peer = c.peer;
        self.send(peer, mad);
        self.events.push_back(CmEvent::Established { id });
        Ok(())
    }

    /// The passive side saw traffic on its QP before the RTU (a lost RTU):
    /// established all the same (`rdma_notify`, IBV_EVENT_COMM_EST).
    pub fn notify_established(&mut self, id: u32) -> Result<(), CmError> {
        let c = self.conns.get_mut(&id).ok_or(CmError::NoId)?;
        match c.state {
            CmState::RepSent => {
                c.state = CmState::Established;
                c.pending = None;
                c.deadline = None;
                self.events.push_back(CmEvent::Established { id });
                Ok(())
            }
            CmState::Established => Ok(()),
            s => Err(CmError::WrongState(s)),
        }
    }

    /// Closes an established connection: sends the DREQ.
    pub fn disconnect(
        &mut self,
        now: Nanos,
        id: u32,
        private_data: [u8; DREQ_PRIVATE_LEN],
    ) -> Result<(), CmError> {
        let own_tid = self.own_tid(id);
        let c = self.conns.get_mut(&id).ok_or(CmError::NoId)?;
        match c.state {
            CmState::Established | CmState::RepSent => {}
            // A REQ or REP still unanswered: the connection never was;
            // stop retrying, as rdma_disconnect before ESTABLISHED does.
            CmState::ReqSent | CmState::RepRcvd | CmState::ReqRcvd => {
                self.conns.remove(&id);
                return Ok(());
            }
            s => return Err(CmError::WrongState(s)),
        }
        let dreq = Dreq {
            local_comm_id: id,
            remote_comm_id: c.remote_comm_id,
            remote_qpn: c.remote_qpn,
            private_data,
        };
        c.state = CmState::DreqSent;
        c.tid = own_tid;
        let mad = CmMad::new(own_tid, CmMessage::Dreq(dreq)).emit();
        let wait = self.our_wait();
        self.send_and_wait(now, id, mad, wait);
        Ok(())
    }

    /// Forgets a connection at once (rdma_destroy_id); an established one
    /// is disconnected first.
    pub fn destroy(&mut self, now: Nanos, id: u32) {
        if self.state(id) == Some(CmState::Established) {
            let _ = self.disconnect(now, id, [0; DREQ_PRIVATE_LEN]);
            // Its DREQ keeps retrying; the DREP or the retries end it.
            return;
        }
        if matches!(self.state(id), Some(CmState::DreqSent | CmState::TimeWait)) {
            return;
        }
        self.conns.remove(&id);
    }

    fn enter_time_wait(&mut self, now: Nanos, id: u32) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = CmState::TimeWait;
            c.pending = None;
            c.deadline = Some(now + TIME_WAIT_NS);
        }
    }

    /// One received MAD from the CM at `peer`.
    pub fn handle_mad(&mut self, now: Nanos, peer: IpAddr, mad: &[u8]) {
        self.stats.rx_mads += 1;
        let m = match CmMad::parse(mad) {
            Ok(m) => m,
            Err(_) => {
                self.stats.rx_bad += 1;
                return;
            }
        };
        let tid = m.header.tid;
        match m.message {
            CmMessage::Req(req) => self.on_req(peer, tid, req),
            CmMessage::Rep(rep) => self.on_rep(peer, rep),
            CmMessage::Rtu(rtu) => {
                let ok = self.conns.get(&rtu.remote_comm_id).is_some_and(|c| {
                    c.state == CmState::RepSent && c.remote_comm_id == rtu.local_comm_id
                });
                if ok {
                    let c = self.conns.get_mut(&rtu.remote_comm_id).unwrap();
                    c.state = CmState::Established;
                    c.pending = None;
                    c.deadline = None;
                    self.events.push_back(CmEvent::Established {
                        id: rtu.remote_comm_id,
                    });
                } else if self.conns.get(&rtu.remote_comm_id).is_some_and(|c| {
                    c.state == CmState::Established && c.remote_comm_id == rtu.local_comm_id
                }) {
                    self.stats.rx_duplicates += 1;
                } else {
                    self.stats.rx_unexpected += 1;
                }
            }
            CmMessage::Rej(rej) => self.on_rej(rej),
            CmMessage::Mra(mra) => {
                let Some(c) = self.conns.get_mut(&mra.remote_comm_id) else {
                    self.stats.rx_unexpected += 1;
                    return;
                };
                let waits = match mra.message_mraed {
                    msg::REQ => c.state == CmState::ReqSent,
                    msg::REP => c.state == CmState::RepSent,
                    _ => false,
                };
                if !waits {
                    self.stats.rx_unexpected += 1;
                    return;
                }
                // The peer is working on it: one more full wait.
                c.wait += timeout_ns(mra.service_timeout);
                c.deadline = Some(now + c.wait);
            }
            CmMessage::Dreq(dreq) => self.on_dreq(now, peer, tid, dreq),
            CmMessage::Drep(drep) => {
                let id = drep.remote_comm_id;
                match self.state(id) {
                    Some(CmState::DreqSent) => {
                        self.enter_time_wait(now, id);
                        self.events.push_back(CmEvent::Disconnected { id });
                    }
                    Some(CmState::TimeWait) => self.stats.rx_duplicates += 1,
                    _ => self.stats.rx_unexpected += 1,
                }
            }
            CmMessage::SidrReq(req) => self.on_sidr_req(peer, tid, req),
            CmMessage::SidrRep(rep) => {
                let id = rep.request_id;
                if self.state(id) == Some(CmState::SidrReqSent) {
                    self.conns.remove(&id);
                    self.events.push_back(CmEvent::SidrReply {
                        id,
                        rep: Box::new(rep),
                    });
                } else {
                    self.stats.rx_unexpected += 1;
                }
            }
        }
    }

    fn find_remote(&self, peer: IpAddr, remote_comm_id: u32) -> Option<u32> {
        self.conns
            .iter()
            .find(|(_, c)| c.peer == peer && c.remote_comm_id == remote_comm_id)
            .map(|(id, _)| *id)
    }

    fn on_req(&mut self, peer: IpAddr, tid: u64, req: Req) {
        if let Some(id) = self.find_remote(peer, req.local_comm_id) {
            // A duplicate: our REP (if sent) retries on its own timer.
            self.stats.rx_duplicates += 1;
            if let Some(c) = self.conns.get(&id) {
                if c.state == CmState::TimeWait {
                    // An old connection's REQ: stale (IBA 12.9.8.3.1).
                    self.send_rej(peer, tid, 0, req.local_comm_id, msg::REQ, rej::STALE_CONN);
                }
            }
            return;
        }
        let Some(&listener) = self.listeners.get(&req.service_id) else {
            self.stats.rej_no_listener += 1;
            self.send_rej(
                peer,
                tid,
                0,
                req.local_comm_id,
                msg::REQ,
                rej::INVALID_SERVICE_ID,
            );
            return;
        };
        let id = self.alloc_comm_id();
        // The active side waits on our REP for its announced time-out.
        let wait = timeout_ns(
            req.remote_cm_response_timeout
                .max(self.cfg.response_timeout),
        ) * 2;
        self.conns.insert(
            id,
            Conn {
                state: CmState::ReqRcvd,
                peer,
                remote_comm_id: req.local_comm_id,
                remote_qpn: req.local_qpn,
                tid,
                pending: None,
                answer: None,
                retries_left: 0,
                deadline: None,
                wait,
            },
        );
        self.events.push_back(CmEvent::ConnectRequest {
            listener,
            id,
            peer,
            req: Box::new(req),
        });
    }

    fn send_rej(
        &mut self,
        peer: IpAddr,
        tid: u64,
        local: u32,
        remote: u32,
        rejected: u8,
        reason: u16,
    ) {
        let rej = Rej {
            local_comm_id: local,
            remote_comm_id: remote,
            message_rejected: rejected,
            reject_info_length: 0,
            reason,
            ari: [0; REJ_ARI_LEN],
            private_data: [0; REJ_PRIVATE_LEN],
        };
        self.send(peer, CmMad::new(tid, CmMessage::Rej(rej)).emit());
    }

    fn on_rep(&mut self, peer: IpAddr, rep: Rep) {
        let id = rep.remote_comm_id;
        let Some(c) = self.conns.get_mut(&id) else {
            self.stats.rx_unexpected += 1;
            return;
        };
        if c.peer != peer {
            self.stats.rx_unexpected += 1;
            return;
        }
        match c.state {
            CmState::ReqSent => {
                c.state = CmState::RepRcvd;
                c.remote_comm_id = rep.local_comm_id;
                c.remote_qpn = rep.local_qpn;
                c.pending = None;
                c.deadline = None;
                self.events.push_back(CmEvent::ConnectResponse {
                    id,
                    rep: Box::new(rep),
                });
            }
            CmState::Established if c.remote_comm_id == rep.local_comm_id => {
                // Our RTU was lost: send it again.
                self.stats.rx_duplicates += 1;
                if let Some(rtu) = c.answer {
                    let to = c.peer;
                    self.send(to, rtu);
                }
            }
            CmState::RepRcvd => self.stats.rx_duplicates += 1,
            _ => self.stats.rx_unexpected += 1,
        }
    }

    fn on_rej(&mut self, rej: Rej) {
        let id = rej.remote_comm_id;
        let Some(c) = self.conns.get(&id) else {
            self.stats.rx_unexpected += 1;
            return;
        };
        let applies = match c.state {
            CmState::ReqSent => true,
            CmState::RepSent | CmState::RepRcvd | CmState::ReqRcvd => {
                c.remote_comm_id == rej.local_comm_id
            }
            _ => false,
        };
        if !applies {
            self.stats.rx_unexpected += 1;
            return;
        }
        self.conns.remove(&id);
        self.events.push_back(CmEvent::Rejected {
            id,
            reason: rej.reason,
            private_data: Box::new(rej.private_data),
        });
    }

    fn on_dreq(&mut self, now: Nanos, peer: IpAddr, tid: u64, dreq: Dreq) {
        let id = dreq.remote_comm_id;
        let known = self
            .conns
            .get(&id)
            .is_some_and(|c| c.peer == peer && c.remote_comm_id == dreq.local_comm_id);
        let drep = |me: u32| {
            CmMad::new(
                tid,
                CmMessage::Drep(Drep {
                    local_comm_id: me,
                    remote_comm_id: dreq.local_comm_id,
                    private_data: [0; DREP_PRIVATE_LEN],
                }),
            )
            .emit()
        };
        if !known {
            // IBA 12.9.8.6: a DREQ for no connection still gets a DREP,
            // so that the peer stops retrying.
            self.stats.rx_unexpected += 1;
            self.send(peer, drep(id));
            return;
        }
        let state = self.conns[&id].state;
        match state {
            // RepSent: the DREQ proves the RTU was sent (and lost).
            CmState::Established | CmState::RepSent | CmState::DreqSent => {
                let m = drep(id);
                self.send(peer, m);
                self.conns.get_mut(&id).unwrap().answer = Some(m);
                self.enter_time_wait(now, id);
                self.events.push_back(CmEvent::Disconnected { id });
            }
            CmState::TimeWait => {
                self.stats.rx_duplicates += 1;
                self.send(peer, drep(id));
            }
            _ => self.stats.rx_unexpected += 1,
        }
    }

    fn on_sidr_req(&mut self, peer: IpAddr, tid: u64, req: SidrReq) {
        let dup = self.conns.values().any(|c| {
            c.state == CmState::SidrReqRcvd && c.peer == peer && c.remote_comm_id == req.request_id
        });
        if dup {
            self.stats.rx_duplicates += 1;
            return;
        }
        let Some(&listener) = self.listeners.get(&req.service_id) else {
            self.stats.rej_no_listener += 1;
            let m = SidrRep {
                request_id: req.request_id,
                status: sidr::UNSUPPORTED,
                add_info_length: 0,
                qpn: 0,
                service_id: req.service_id,
                qkey: 0,
                class_port_info: [0; 72],
                private_data: [0; SIDR_REP_PRIVATE_LEN],
            };
            self.send(peer, CmMad::new(tid, CmMessage::SidrRep(m)).emit());
            return;
        };
        let id = self.alloc_comm_id();
        self.conns.insert(
            id,
            Conn {
                state: CmState::SidrReqRcvd,
                peer,
                remote_comm_id: req.request_id,
                remote_qpn: 0,
                tid,
                pending: None,
                answer: None,
                retries_left: 0,
                deadline: None,
                wait: 0,
            },
        );
        self.events.push_back(CmEvent::SidrRequest {
            listener,
            id,
            peer,
            req: Box::new(req),
        });
    }

    /// Fires due timers: retransmissions, give-ups, the end of time-wait.
    pub fn handle_timeout(&mut self, now: Nanos) {
        let due: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let c = self.conns.get_mut(&id).unwrap();
            if c.state == CmState::TimeWait {
                self.conns.remove(&id);
                continue;
            }
            if c.retries_left > 0 {
                if let Some(m) = c.pending {
                    c.retries_left -= 1;
                    c.deadline = Some(now + c.wait);
                    let to = c.peer;
                    self.stats.retransmits += 1;
                    self.send(to, m);
                    continue;
                }
            }
            let state = c.state;
            match state {
                CmState::DreqSent => {
                    self.enter_time_wait(now, id);
                    self.events.push_back(CmEvent::Disconnected { id });
                }
                CmState::RepSent => {
                    // No RTU after every retry: tell the peer, give up.
                    let (peer, tid, rid) = (c.peer, c.tid, c.remote_comm_id);
                    self.conns.remove(&id);
                    self.send_rej(peer, tid, id, rid, msg::REP, rej::TIMEOUT);
                    self.events.push_back(CmEvent::Unreachable { id });
                }
                _ => {
                    self.conns.remove(&id);
                    self.events.push_back(CmEvent::Unreachable { id });
                }
            }
        }
    }

    /// The earliest deadline.
    pub fn poll_timeout(&self) -> Option<Nanos> {
        self.conns.values().filter_map(|c| c.deadline).min()
    }

    /// The next MAD to send.
    pub fn poll_transmit(&mut self) -> Option<Outgoing> {
        self.out.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }
}

#[cfg(test)]
mod tests;
