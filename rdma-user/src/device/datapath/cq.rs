//! Completion queues: the rings, their table in [`Core`], and the moves of
//! a QP's completions into them.

use std::collections::VecDeque;
use std::sync::Arc;

use super::qp::QpSlot;
use super::{Core, DpStats, Result};
use crate::device::error::DeviceError;
use crate::device::rings::{AsyncEvent, AsyncShared, CqShared};
use crate::transport::{QpState, Wc};

/// A completion queue: a bounded ring. Overflow is counted and reported,
/// never silent.
pub struct CqRing {
    ring: VecDeque<Wc>,
    depth: usize,
    pub overflows: u64,
    /// With a ring shared with polling threads, completions go there.
    shared: Option<Arc<CqShared>>,
}

impl CqRing {
    pub fn new(depth: usize) -> CqRing {
        CqRing {
            ring: VecDeque::with_capacity(depth),
            depth,
            overflows: 0,
            shared: None,
        }
    }
    pub(super) fn push(&mut self, wc: Wc) {
        if let Some(s) = &self.shared {
            if !s.push(wc) {
                self.overflows += 1;
            }
        } else if self.ring.len() >= self.depth {
            self.overflows += 1;
        } else {
            self.ring.push_back(wc);
        }
    }
    /// Batched poll: moves up to `out.len()` completions into `out`.
    pub fn poll(&mut self, out: &mut [Wc]) -> usize {
        if let Some(s) = &self.shared {
            return s.poll(out);
        }
        let n = out.len().min(self.ring.len());
        for o in out.iter_mut().take(n) {
            *o = self.ring.pop_front().expect("counted");
        }
        n
    }
    pub fn len(&self) -> usize {
        match &self.shared {
            Some(s) => s.len(),
            None => self.ring.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Core {
    /// Removes a CQ no QP uses.
    pub fn destroy_cq(&mut self, cq: u32) -> Result<()> {
        if self.qps.values().any(|s| s.cq == cq || s.recv_cq == cq) {
            return Err(DeviceError::CqBusy(cq));
        }
        self.cqs
            .remove(&cq)
            .map(|_| ())
            .ok_or(DeviceError::NoCq(cq))
    }
    pub fn create_cq(&mut self, depth: usize) -> Result<u32> {
        if self.cqs.len() >= self.limits.max_cq {
            return Err(DeviceError::CqLimit(self.limits.max_cq));
        }
        let id = self.next_cq;
        self.next_cq += 1;
        self.cqs.insert(id, CqRing::new(depth.max(1)));
        Ok(id)
    }

    pub fn cq_mut(&mut self, cq: u32) -> Option<&mut CqRing> {
        self.cqs.get_mut(&cq)
    }
    /// Completions of `cq` go to `shared` from now on (polled without the
    /// data path's help).
    pub fn share_cq(&mut self, cq: u32, shared: Arc<CqShared>) -> Result<()> {
        let c = self.cqs.get_mut(&cq).ok_or(DeviceError::NoCq(cq))?;
        while let Some(w) = c.ring.pop_front() {
            shared.push(w);
        }
        c.shared = Some(shared);
        Ok(())
    }
    /// Drains completions that posting produced (flushes in ERR, local errors).
    pub fn collect_wcs(&mut self, qpn: u32) {
        if let Some(slot) = self.qps.get_mut(&qpn) {
            Self::drain_wcs(
                slot,
                &mut self.cqs,
                &mut self.stats,
                self.async_events.as_deref(),
            );
        }
    }
    pub(super) fn drain_wcs(
        slot: &mut QpSlot,
        cqs: &mut crate::memory::KeyMap<CqRing>,
        stats: &mut DpStats,
        events: Option<&AsyncShared>,
    ) {
        let state = slot.qp.state();
        if state != slot.state_seen {
            // modify_qp updates state_seen itself: a change seen here is
            // the engine's own, and one into the error state is fatal.
            if state == QpState::Err {
                if let Some(e) = events {
                    e.push(AsyncEvent::QpFatal(slot.qp.qpn()));
                }
            }
            slot.state_seen = state;
        }
        if let Some(r) = &slot.rings {
            // Before the completions: a poller that sees one sees its WR
            // retired too (queue depth), and the state it left the QP in.
            r.publish_retired(
                slot.moved_send - slot.qp.send_queue_len() as u64,
                // With an SRQ, the queued receive WR is the SRQ's.
                slot.moved_recv
                    .saturating_sub(slot.qp.recv_queue_len() as u64),
            );
            r.publish_state(slot.qp.state());
        }
        while let Some(wc) = slot.qp.poll_completion() {
            match cqs.get_mut(&slot.cq_for(&wc)) {
                Some(cq) => {
                    let before = cq.overflows;
                    cq.push(wc);
                    stats.cq_overflows += cq.overflows - before;
                }
                None => stats.cq_overflows += 1,
            }
        }
    }
}
