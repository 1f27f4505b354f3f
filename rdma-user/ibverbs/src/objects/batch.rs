//! A QP's WRs between `ibv_wr_start` and `ibv_wr_complete`: what the
//! `ibv_wr_*` calls (`wr`) build and `ibv_wr_complete` posts (`post`).
//! Its storage is allocated with the QP (its send queue depth): building
//! and posting allocate nothing.

use std::ffi::c_int;

use rdma_user::transport::{MAX_INLINE, MAX_SGE};

use crate::ffi::*;

/// One WR being built.
pub(crate) struct PendingWr {
    pub(crate) wr_id: u64,
    pub(crate) opcode: ibv_wr_opcode,
    pub(crate) flags: u32,
    pub(crate) imm: u32,
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
    pub(crate) compare_add: u64,
    pub(crate) swap: u64,
    pub(crate) sges: [ibv_sge; MAX_SGE],
    pub(crate) num_sge: usize,
    pub(crate) inline: [u8; MAX_INLINE],
    pub(crate) inline_len: usize,
    /// The SGE over `inline` that `as_send_wr` hands the post path.
    pub(crate) inline_sge: ibv_sge,
}

impl PendingWr {
    /// The WR as `ibv_post_send` takes it (pointing into `self`).
    pub(crate) fn as_send_wr(&mut self) -> ibv_send_wr {
        let mut w = ibv_send_wr {
            wr_id: self.wr_id,
            opcode: self.opcode,
            send_flags: self.flags,
            ..Default::default()
        };
        if self.flags & IBV_SEND_INLINE != 0 {
            self.inline_sge = ibv_sge {
                addr: self.inline.as_ptr() as u64,
                length: self.inline_len as u32,
                lkey: 0,
            };
            w.sg_list = &mut self.inline_sge;
            w.num_sge = 1;
        } else {
            w.sg_list = self.sges.as_mut_ptr();
            w.num_sge = self.num_sge as c_int;
        }
        w.__bindgen_anon_1.imm_data = self.imm;
        match self.opcode {
            IBV_WR_ATOMIC_CMP_AND_SWP | IBV_WR_ATOMIC_FETCH_AND_ADD => {
                w.wr.atomic = ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                    remote_addr: self.remote_addr,
                    compare_add: self.compare_add,
                    swap: self.swap,
                    rkey: self.rkey,
                };
            }
            _ => {
                w.wr.rdma = ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                    remote_addr: self.remote_addr,
                    rkey: self.rkey,
                };
            }
        }
        w
    }
}

/// A QP's WRs between `ibv_wr_start` and `ibv_wr_complete`.
pub(crate) struct Batch {
    pub(crate) wrs: Vec<PendingWr>,
    /// The first misuse (more WRs than the queue holds, too many SGEs or
    /// inline bytes): `ibv_wr_complete` returns it and posts nothing.
    pub(crate) error: Option<c_int>,
}

impl Batch {
    pub(crate) fn with_capacity(depth: u32) -> Batch {
        Batch {
            wrs: Vec::with_capacity(depth as usize),
            error: None,
        }
    }

    /// Starts a WR with the `wr_id` and `wr_flags` the program set in its
    /// `ibv_qp_ex`.
    pub(crate) fn start(
        &mut self,
        wr_id: u64,
        wr_flags: u32,
        opcode: ibv_wr_opcode,
    ) -> Option<&mut PendingWr> {
        if self.wrs.len() == self.wrs.capacity() {
            // Beyond the send queue's depth: refused as a full queue.
            self.error.get_or_insert(libc::ENOMEM);
            return None;
        }
        self.wrs.push(PendingWr {
            wr_id,
            opcode,
            flags: wr_flags,
            imm: 0,
            remote_addr: 0,
            rkey: 0,
            compare_add: 0,
            swap: 0,
            sges: [ibv_sge::default(); MAX_SGE],
            num_sge: 0,
            inline: [0; MAX_INLINE],
            inline_len: 0,
            inline_sge: ibv_sge::default(),
        });
        self.wrs.last_mut()
    }

    /// The WR the data calls fill: the last one started.
    pub(crate) fn current(&mut self) -> Option<&mut PendingWr> {
        if self.wrs.is_empty() {
            self.error.get_or_insert(libc::EINVAL);
        }
        self.wrs.last_mut()
    }

    pub(crate) fn fail(&mut self, e: c_int) {
        self.error.get_or_insert(e);
    }
}
