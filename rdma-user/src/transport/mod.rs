//! The Reliable Connected transport as a sans-IO state machine, one [`QpEngine`] per
//! queue pair, in the style of `quinn-proto`.
//!
//! Nothing here touches a socket, a thread or a clock. A driver (the AF_XDP
//! loop, or the simulator in the tests) feeds it posted work requests
//! ([`QpEngine::post_send`], [`QpEngine::post_recv`]), received transport segments
//! ([`QpEngine::handle_packet`]) and the time ([`QpEngine::handle_timeout`]); it takes out
//! segments to transmit ([`QpEngine::poll_transmit`]), the next timer deadline
//! ([`QpEngine::poll_timeout`]) and work completions ([`QpEngine::poll_completion`]).
//!
//! Requester, completer and responder follow IBA chapter 9 and, where the spec
//! leaves room, Linux rxe (`drivers/infiniband/sw/rxe`): ACK syndrome 0x1f
//! ("unlimited credits"), one PSN-sequence-error NAK per gap, AckReq on the
//! last packet of a message and every 64 packets of a long one, re-executed
//! duplicate READs and replayed atomic results. One deliberate difference:
//! `retry_cnt = 7` means 7 retries as the spec says (rxe treats it as
//! infinite); only `rnr_retry = 7` is infinite.
//!
//! No allocation happens per packet: queues are preallocated at creation.
//!
//! Split by role, as rxe splits `rxe_req.c`, `rxe_resp.c` and `rxe_comp.c`:
//! [`qp`] holds the attributes, the state machine and the dispatch of
//! packets and transmit opportunities; [`requester`] turns send WQEs into
//! request packets (windows, go-back-N); [`responder`] checks and executes
//! incoming requests and answers them (ACK/NAK, READ and atomic replies,
//! duplicates); [`completer`] handles ACKs, NAKs and READ responses, retires
//! WQEs into completions and runs the timers. [`wr`] holds the work request
//! and completion types they share. A UD QP uses none of the three: [`ud`]
//! sends and receives its datagrams (no ACKs, no retransmission).

mod completer;
pub mod dcqcn;
mod qp;
mod requester;
mod responder;
mod selective;
mod ud;
mod wr;

pub use completer::{ack_timeout_ns, rnr_timer_ns};
pub use qp::{
    pkey_matches, AttrMask, ModifyError, QpAttr, QpCap, QpEngine, QpState, QpStats, QpType,
    Transmit, TxOrder, MAX_RD_ATOMIC,
};
pub use requester::{check_send, MAX_PKT_PER_ACK, RETRY_WINDOW};
pub use responder::{check_recv, RespConsts, RespSnapshot};
pub use selective::{negotiate as negotiate_selective_repeat, DUPTHRESH, SR_WINDOW};
pub use ud::{grh_of, GRH_LEN};
pub use wr::{
    NetworkType, PostError, RecvWr, SendFlags, SendWr, Sge, UdDest, Wc, WcOpcode, WcStatus,
    WrOpcode, MAX_INLINE, MAX_SGE,
};

use std::collections::VecDeque;

use crate::memory::{Access, AccessError, AtomicOp, MrTable};
use crate::wire::{
    opcode, opcode_flags, pad_for, psn_add, psn_diff, syndrome, AethRepr, AtomicEthRepr, BthRepr,
    DethRepr, NakCode, OpFlags, Position, RethRepr, Syndrome, TransportRepr, MASK_24,
    SACK_BITMAP_LEN,
};

use completer::Completer;
use requester::{Requester, SendWqe, WINDOW_OPEN};
use responder::{InMsg, Resp, Responder};
use selective::{Body, Selective};

/// Time in nanoseconds on the driver's monotonic clock.
pub type Nanos = u64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_names_round_trip() {
        for (st, name, text) in WcStatus::TABLE {
            assert_eq!((st.name(), st.as_str()), (name, text));
            assert_eq!(WcStatus::from_name(name), Some(st));
        }
        assert_eq!(WcStatus::from_name("REM_OPP_ERR"), None);
        for (op, name) in WcOpcode::TABLE {
            assert_eq!(op.name(), name);
            assert_eq!(WcOpcode::from_name(name), Some(op));
        }
        assert_eq!(WcOpcode::from_name("?"), None);
    }

    #[test]
    fn attr_mask_is_rdma_cores() {
        // enum ibv_qp_attr_mask in rdma-core's verbs.h.
        let want = [
            (AttrMask::STATE, 1),
            (AttrMask::ACCESS_FLAGS, 8),
            (AttrMask::PKEY_INDEX, 16),
            (AttrMask::PORT, 32),
            (AttrMask::AV, 128),
            (AttrMask::PATH_MTU, 256),
            (AttrMask::TIMEOUT, 512),
            (AttrMask::RETRY_CNT, 1024),
            (AttrMask::RNR_RETRY, 2048),
            (AttrMask::RQ_PSN, 4096),
            (AttrMask::MAX_QP_RD_ATOMIC, 8192),
            (AttrMask::MIN_RNR_TIMER, 32768),
            (AttrMask::SQ_PSN, 65536),
            (AttrMask::MAX_DEST_RD_ATOMIC, 131072),
            (AttrMask::DEST_QPN, 1048576),
        ];
        for (m, bits) in want {
            assert_eq!(m.bits(), bits);
        }
        let a = QpAttr::init(Access::ALL);
        assert_eq!(
            a.mask(),
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS
        );
        assert_eq!(
            (AttrMask::SQ_PSN | AttrMask::PORT).first_name(),
            Some("port_num")
        );
    }

    #[test]
    fn timers() {
        assert_eq!(ack_timeout_ns(0), None);
        assert_eq!(ack_timeout_ns(14), Some(67_108_864));
        assert_eq!(rnr_timer_ns(0), 655_360_000);
        assert_eq!(rnr_timer_ns(1), 10_000);
        assert_eq!(rnr_timer_ns(12), 640_000);
        assert_eq!(rnr_timer_ns(31), 491_520_000);
    }

    #[test]
    fn state_machine_checks_attributes() {
        let mut qp = QpEngine::new(0x11, 1, QpCap::default());
        let e = qp
            .modify(&QpAttr {
                qp_state: Some(QpState::Rtr),
                ..Default::default()
            })
            .unwrap_err();
        assert_eq!(
            e,
            ModifyError::InvalidTransition {
                from: QpState::Reset,
                to: QpState::Rtr
            }
        );
        let e = qp
            .modify(&QpAttr {
                qp_state: Some(QpState::Init),
                pkey_index: Some(0),
                port_num: Some(1),
                ..Default::default()
            })
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "RESET -> INIT requires attribute qp_access_flags"
        );
        let e = qp
            .modify(&QpAttr {
                qp_state: Some(QpState::Init),
                pkey_index: Some(0),
                port_num: Some(1),
                qp_access_flags: Some(Access::ALL),
                sq_psn: Some(1),
                ..Default::default()
            })
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "RESET -> INIT does not allow attribute sq_psn"
        );
        qp.modify(&QpAttr {
            qp_state: Some(QpState::Init),
            pkey_index: Some(0),
            port_num: Some(1),
            qp_access_flags: Some(Access::ALL),
            ..Default::default()
        })
        .unwrap();
        let e = qp
            .modify(&QpAttr {
                qp_state: Some(QpState::Rtr),
                dest_gid: Some([0; 16]),
                path_mtu: Some(1000),
                dest_qp_num: Some(1),
                rq_psn: Some(0),
                max_dest_rd_atomic: Some(1),
                min_rnr_timer: Some(12),
                ..Default::default()
            })
            .unwrap_err();
        assert!(matches!(
            e,
            ModifyError::BadValue {
                attr: "path_mtu",
                ..
            }
        ));
        assert_eq!(
            qp.state(),
            QpState::Init,
            "a refused modify changes nothing"
        );
        assert_eq!(
            qp.post_send(&SendWr::new(1, WrOpcode::Send, &[])),
            Err(PostError::BadState(QpState::Init))
        );
    }
}
