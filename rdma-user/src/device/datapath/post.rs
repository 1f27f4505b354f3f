//! Work requests into the engines: posted directly, or moved from the
//! rings that posting threads share with the data path.

use std::sync::Arc;

use super::qp::QpSlot;
use super::{Core, Result};
use crate::device::error::DeviceError;
use crate::device::rings::QpRings;
use crate::transport::{PostError, QpEngine, RecvWr, SendWr, WcOpcode};

impl Core {
    /// Work waits in a shared ring (checked once more before sleeping).
    pub fn rings_have_work(&self) -> bool {
        self.gsi.as_ref().is_some_and(|g| g.has_tx())
            || self
                .qps
                .values()
                .any(|s| s.rings.as_ref().is_some_and(|r| r.has_work()))
    }

    /// Moves posted WRs from the shared rings into the engines; true if
    /// there were any. A WR the engine still refuses (its state changed
    /// after the poster checked) completes with a local QP operation error.
    pub fn pump_rings(&mut self) -> bool {
        let mut any = false;
        for slot in self.qps.values_mut() {
            let Some(r) = slot.rings.as_deref() else {
                continue;
            };
            let before = (slot.moved_send, slot.moved_recv);
            while let Some(w) = r.pop_recv() {
                if slot.qp.post_recv(&w.as_wr()).is_err() {
                    slot.qp.push_error_wc(w.wr_id, WcOpcode::Recv);
                }
                slot.moved_recv += 1;
            }
            while let Some(w) = r.pop_send() {
                if slot.qp.post_send(&w.as_wr()).is_err() {
                    slot.qp.push_error_wc(w.wr_id, WcOpcode::Send);
                }
                slot.moved_send += 1;
            }
            if (slot.moved_send, slot.moved_recv) != before {
                Self::drain_wcs(
                    slot,
                    &mut self.cqs,
                    &mut self.stats,
                    self.async_events.as_deref(),
                );
                any = true;
            }
        }
        any
    }

    /// Posts a send WR of a program's thread that holds the data path
    /// straight into QP `qpn`'s engine ([`QpRings::post_send_direct`]), as
    /// a push to `rings` followed by [`Core::pump_rings`] would. `None`:
    /// `rings` are not the QP's, or WRs wait in them: push instead, so
    /// that the WR keeps its place.
    pub fn post_send_direct(
        &mut self,
        qpn: u32,
        rings: &Arc<QpRings>,
        wr: &SendWr,
    ) -> Option<std::result::Result<(), PostError>> {
        self.post_direct(qpn, rings, |r, qp, moved_send, _| {
            (!r.send_waiting()).then(|| {
                r.post_send_direct(wr, |w| {
                    if qp.post_send(w).is_err() {
                        qp.push_error_wc(w.wr_id, WcOpcode::Send);
                    }
                    *moved_send += 1;
                })
            })
        })
    }

    /// As [`Core::post_send_direct`], for a receive WR.
    pub fn post_recv_direct(
        &mut self,
        qpn: u32,
        rings: &Arc<QpRings>,
        wr: &RecvWr,
    ) -> Option<std::result::Result<(), PostError>> {
        self.post_direct(qpn, rings, |r, qp, _, moved_recv| {
            (!r.recv_waiting()).then(|| {
                r.post_recv_direct(wr, |w| {
                    if qp.post_recv(w).is_err() {
                        qp.push_error_wc(w.wr_id, WcOpcode::Recv);
                    }
                    *moved_recv += 1;
                })
            })
        })
    }

    /// The QP's slot for a direct post, if `rings` are its own; `post`
    /// gets the rings, the engine and the moved counts (send, receive),
    /// and the completions are drained as [`Core::pump_rings`] drains
    /// them after moving WRs.
    fn post_direct(
        &mut self,
        qpn: u32,
        rings: &Arc<QpRings>,
        post: impl FnOnce(
            &QpRings,
            &mut QpEngine,
            &mut u64,
            &mut u64,
        ) -> Option<std::result::Result<(), PostError>>,
    ) -> Option<std::result::Result<(), PostError>> {
        let slot = self.qps.get_mut(&qpn)?;
        let QpSlot {
            rings: mine,
            qp,
            moved_send,
            moved_recv,
            ..
        } = &mut *slot;
        let r = mine.as_ref().filter(|m| Arc::ptr_eq(m, rings))?;
        let res = post(r, qp, moved_send, moved_recv)?;
        if res.is_ok() {
            Self::drain_wcs(
                slot,
                &mut self.cqs,
                &mut self.stats,
                self.async_events.as_deref(),
            );
        }
        Some(res)
    }
    pub fn post_send(&mut self, qpn: u32, wr: &SendWr) -> Result<()> {
        let slot = self.qps.get_mut(&qpn).ok_or(DeviceError::NoQp(qpn))?;
        slot.qp.post_send(wr)?;
        Ok(())
    }

    pub fn post_recv(&mut self, qpn: u32, wr: &RecvWr) -> Result<()> {
        let slot = self.qps.get_mut(&qpn).ok_or(DeviceError::NoQp(qpn))?;
        slot.qp.post_recv(wr)?;
        Ok(())
    }
}
