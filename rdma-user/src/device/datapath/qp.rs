//! The QP and AH tables: creating, connecting, modifying and destroying
//! QPs, their network headers, and UD address handles.

use std::sync::Arc;

use super::xdp_responder;
use super::{CcConfig, Connect, Core, Path, Result};
use crate::device::error::DeviceError;
use crate::device::rings::{QpRings, SrqShared};
use crate::memory::Access;
use crate::transport::{Nanos, QpAttr, QpCap, QpEngine, QpState, QpType, Wc, WcOpcode};
use crate::wire::gid_of;
use crate::wire::RoceRepr;

pub(super) struct QpSlot {
    pub(super) qp: QpEngine,
    /// Send completions go here, receive completions to `recv_cq`.
    pub(super) cq: u32,
    pub(super) recv_cq: u32,
    pub(super) net: Option<RoceRepr>,
    pub(super) path: Option<Path>,
    /// Work rings shared with posting threads, and how many WRs came from
    /// them into the engine.
    pub(super) rings: Option<Arc<QpRings>>,
    pub(super) moved_send: u64,
    pub(super) moved_recv: u64,
    /// The state the last control call or drain saw (an engine-made
    /// change into the error state raises `AsyncEvent::QpFatal`).
    pub(super) state_seen: QpState,
    /// Receive WRs come from this shared queue instead (one taken when a
    /// message needs it).
    pub(super) srq: Option<Arc<SrqShared>>,
    /// Its part in the XDP responder.
    pub(super) lend: xdp_responder::Lend,
    /// When the engine last answered a remote access on it (a WRITE
    /// without immediate, a READ or an atomic from the peer): see
    /// `frames_can_wait_for_polls`.
    pub(super) last_remote_access: Option<Nanos>,
}

impl QpSlot {
    /// The CQ a completion goes to: receives to the receive CQ.
    pub(super) fn cq_for(&self, wc: &Wc) -> u32 {
        match wc.opcode {
            WcOpcode::Recv | WcOpcode::RecvRdmaWithImm => self.recv_cq,
            _ => self.cq,
        }
    }
}

impl Core {
    pub fn create_qp(&mut self, pd: u32, cq: u32, cap: QpCap) -> Result<u32> {
        self.create_qp_cqs(pd, cq, cq, cap)
    }

    /// An RC QP with its own send and receive CQs (they may be the same).
    pub fn create_qp_cqs(&mut self, pd: u32, cq: u32, recv_cq: u32, cap: QpCap) -> Result<u32> {
        self.create_qp_typed(pd, cq, recv_cq, cap, QpType::Rc, 1024)
    }

    /// A QP of `qp_type`; a UD QP's datagrams are at most `port_mtu` bytes.
    pub fn create_qp_typed(
        &mut self,
        pd: u32,
        cq: u32,
        recv_cq: u32,
        cap: QpCap,
        qp_type: QpType,
        port_mtu: u32,
    ) -> Result<u32> {
        if self.qps.len() >= self.limits.max_qp {
            return Err(DeviceError::QpLimit(self.limits.max_qp));
        }
        for c in [cq, recv_cq] {
            if !self.cqs.contains_key(&c) {
                return Err(DeviceError::NoCq(c));
            }
        }
        let mut qpn = self.next_qpn;
        let (index, count) = self.qpn_class;
        while qpn < 0x11
            || self.qps.contains_key(&qpn)
            || crate::device::shard::owner_of(qpn, count) != index
        {
            qpn = (qpn + 1) & 0xff_ffff;
        }
        self.next_qpn = (qpn + 1) & 0xff_ffff;
        if self.next_qpn < 0x11 {
            self.next_qpn = 0x11;
        }
        self.qps.insert(
            qpn,
            QpSlot {
                qp: {
                    let mut q = QpEngine::with_type(qpn, pd, cap, qp_type, port_mtu);
                    q.set_cc(self.cc.params);
                    q
                },
                cq,
                recv_cq,
                net: None,
                path: None,
                rings: None,
                moved_send: 0,
                moved_recv: 0,
                state_seen: QpState::Reset,
                srq: None,
                lend: Default::default(),
                last_remote_access: None,
            },
        );
        self.qp_order.push(qpn);
        Ok(qpn)
    }

    pub fn destroy_qp(&mut self, qpn: u32) -> Result<()> {
        let mut slot = self.qps.remove(&qpn).ok_or(DeviceError::NoQp(qpn))?;
        self.free_resp_slot(&mut slot);
        self.qp_order.retain(|&q| q != qpn);
        // Outstanding WRs complete with flush errors before the QP goes.
        let _ = slot.qp.modify(&QpAttr {
            qp_state: Some(QpState::Err),
            ..Default::default()
        });
        while let Some(wc) = slot.qp.poll_completion() {
            if let Some(cq) = self.cqs.get_mut(&slot.cq_for(&wc)) {
                cq.push(wc);
            }
        }
        Ok(())
    }

    /// ECN and DCQCN for the QPs and AHs made from now on, with the line
    /// rate DCQCN recovers to taken from `iface`'s link speed (when it has
    /// one).
    pub fn set_cc(&mut self, cc: CcConfig, iface: &str) {
        self.cc = cc;
        if let Some(s) = crate::io::hostnet::iface_speed(iface) {
            self.cc.params.line_rate = s;
        }
    }

    /// The network headers of a QP pair's packets on `path`, ECT(0) in
    /// their ECN field when ECN is on.
    fn template(&self, path: &Path, lqpn: u32, rqpn: u32) -> Result<RoceRepr> {
        let mut net = path.template(lqpn, rqpn)?;
        let tc = net.ip.traffic_class() & !3;
        net.ip
            .set_traffic_class(tc | if self.cc.ecn { 0b10 } else { 0 });
        Ok(net)
    }

    /// An address handle for UD sends to the peer of `path`. (Its PD is
    /// the verbs layer's to keep: the engine, as rxe, does not check a UD
    /// WR's AH against the QP's PD.)
    pub fn create_ah(&mut self, path: Path) -> Result<u32> {
        if self.ahs.len() >= self.limits.max_ah {
            return Err(DeviceError::AhLimit(self.limits.max_ah));
        }
        // The QPNs of the template do not matter: a UD packet's UDP source
        // port is its sending QP's, set per packet.
        let net = self.template(&path, 0, 0)?;
        let mut ah = self.next_ah;
        while ah == 0 || self.ahs.contains_key(&ah) {
            ah = ah.wrapping_add(1);
        }
        self.next_ah = ah.wrapping_add(1);
        self.ahs.insert(ah, net);
        Ok(ah)
    }

    pub fn destroy_ah(&mut self, ah: u32) -> Result<()> {
        self.ahs
            .remove(&ah)
            .map(|_| ())
            .ok_or(DeviceError::NoAh(ah))
    }

    pub fn qp(&self, qpn: u32) -> Option<&QpEngine> {
        self.qps.get(&qpn).map(|s| &s.qp)
    }

    pub fn qpns(&self) -> Vec<u32> {
        self.qp_order.clone()
    }

    pub fn qp_path(&self, qpn: u32) -> Option<Path> {
        self.qps.get(&qpn).and_then(|s| s.path)
    }

    pub fn modify_qp(&mut self, qpn: u32, attr: &QpAttr) -> Result<()> {
        // XDP must not serve the QP while its attributes change.
        self.take_back_qp(qpn);
        let slot = self.qps.get_mut(&qpn).ok_or(DeviceError::NoQp(qpn))?;
        let r = slot.qp.modify(attr);
        slot.state_seen = slot.qp.state();
        let connected = matches!(slot.qp.state(), QpState::Rtr | QpState::Rts);
        Self::drain_wcs(
            slot,
            &mut self.cqs,
            &mut self.stats,
            self.async_events.as_deref(),
        );
        r?;
        if connected {
            self.claim_resp_slot(qpn);
        }
        Ok(())
    }
    /// Receive WRs of `qpn` come from `srq` from now on (before RTR).
    pub fn attach_srq(&mut self, qpn: u32, srq: Arc<SrqShared>) -> Result<()> {
        let slot = self.qps.get_mut(&qpn).ok_or(DeviceError::NoQp(qpn))?;
        slot.srq = Some(srq);
        Ok(())
    }

    /// Work requests of `qpn` come from `rings` from now on.
    pub fn share_qp(&mut self, qpn: u32, rings: Arc<QpRings>) -> Result<()> {
        let slot = self.qps.get_mut(&qpn).ok_or(DeviceError::NoQp(qpn))?;
        rings.publish_state(slot.qp.state());
        if let Some(d) = &self.doorbell {
            rings.set_doorbell(d.clone());
        }
        slot.moved_send = slot.qp.send_queue_len() as u64;
        slot.moved_recv = slot.qp.recv_queue_len() as u64;
        slot.rings = Some(rings);
        Ok(())
    }
    /// Sets the network path of a QP (before RTR).
    pub fn set_path(&mut self, qpn: u32, path: Path) -> Result<()> {
        let rqpn = self.qp(qpn).ok_or(DeviceError::NoQp(qpn))?.dest_qpn();
        let net = self.template(&path, qpn, rqpn)?;
        let slot = self.qps.get_mut(&qpn).ok_or(DeviceError::NoQp(qpn))?;
        slot.net = Some(net);
        slot.path = Some(path);
        if matches!(slot.qp.state(), QpState::Rtr | QpState::Rts) {
            self.claim_resp_slot(qpn);
        }
        Ok(())
    }

    /// RESET -> INIT -> RTR -> RTS against a remote QP.
    pub fn connect_qp(&mut self, qpn: u32, path: Path, c: &Connect) -> Result<()> {
        let slot = self.qps.get_mut(&qpn).ok_or(DeviceError::NoQp(qpn))?;
        let q = &mut slot.qp;
        if q.state() == QpState::Reset {
            q.modify(&QpAttr::init(Access::ALL))?;
        }
        q.set_selective_repeat(c.selective_repeat)?;
        q.modify(&QpAttr {
            qp_state: Some(QpState::Rtr),
            dest_gid: Some(gid_of(path.peer_ip)),
            path_mtu: Some(c.mtu),
            dest_qp_num: Some(c.remote_qpn),
            rq_psn: Some(c.remote_psn),
            max_dest_rd_atomic: Some(c.max_rd_atomic),
            min_rnr_timer: Some(12),
            ..Default::default()
        })?;
        q.modify(&QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(c.local_psn),
            timeout: Some(c.timeout),
            retry_cnt: Some(c.retry_cnt),
            rnr_retry: Some(7),
            max_rd_atomic: Some(c.max_rd_atomic),
            ..Default::default()
        })?;
        // RTR named the peer QP: the headers follow from it (and, the QP
        // being in RTS, its slot for the XDP responder).
        self.set_path(qpn, path)
    }
}
