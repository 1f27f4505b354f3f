//! A drop-in librdmacm (`librdmacm.so.1` is a link to this library):
//! rdma_cm's C ABI over the sans-IO CM of `rdma_user::cm`, speaking CM
//! MADs on QP1 as the kernel's rdma_cm does over rxe.
//!
//! - One CM per device (interface), opened when an id first needs it: a
//!   verbs context of this library, whose data path hands QP1's MADs to
//!   the CM through `rdma_user::device::gsi`.
//! - One CM thread per process waits on those mailboxes and on the CM's
//!   timers; calls from the program run the CM on their own thread. All
//!   CM state sits behind one lock: the control plane, never the data path.
//! - Event channels are semaphore eventfds, one count per queued event: the fd works
//!   with poll/epoll and O_NONBLOCK, and `rdma_get_cm_event` blocks in
//!   read(2) (EINTR when a signal interrupts it).
//! - An id created without a channel is synchronous, as in librdmacm: its
//!   calls wait for their own events (`rdma_create_ep` and friends).
//! - Multicast is not offered: EOPNOTSUPP.
//!
//! # Modules
//!
//! Each module uses only those above it in this list (no cycles):
//!
//! 1. `abi`: librdmacm's C structs and constants.
//! 2. `addr`: socket addresses, an id's route addresses, `rdma_getaddrinfo`.
//! 3. `state`: what the calls share: the id table (`LIVE_IDS`), the state
//!    kept per id (`IdState`), the CM of each device (`CmDev`) and the CM
//!    (`Cm`: devices, ids, the QP attributes an id's state gives).
//! 4. `channel`: event channels and the events queued on them
//!    (`rdma_create_event_channel`, `rdma_get_cm_event`, `rdma_ack_cm_event`...).
//! 5. `translate`: the CM's events (`rdma_user::cm::CmEvent`) turned into
//!    `rdma_cm_event`s, and the connection requests turned into new ids.
//! 6. `service`: running the CM: the CM lock, the CM thread (QP1's mailboxes
//!    and the CM's timers), and how a call runs the CM and waits for a
//!    synchronous id's event.
//! 7. `id`: `rdma_create_id`, `rdma_destroy_id`, `rdma_migrate_id`,
//!    `rdma_set_option`, the port getters.
//! 8. `resolve`: binding and address and route resolution (`rdma_bind_addr`,
//!    `rdma_resolve_addr`, `rdma_resolve_route`).
//! 9. `qp`: an id's QP and CQs (`rdma_create_qp[_ex]`, `rdma_destroy_qp`,
//!    `rdma_init_qp_attr`).
//! 10. `connect`: `rdma_listen`, `rdma_connect`, `rdma_accept`,
//!     `rdma_reject`, `rdma_establish`, `rdma_disconnect`, `rdma_notify`.
//! 11. `ep`: endpoints (`rdma_create_ep`, `rdma_destroy_ep`,
//!     `rdma_get_request`) and the device list (`rdma_get_devices`).
//! 12. `absent`: what is not offered (multicast, ECE) and `rpoll`.
//!
//! This file only declares the modules and re-exports the C ABI.

mod abi;
mod absent;
mod addr;
mod channel;
mod connect;
mod ep;
mod id;
mod qp;
mod resolve;
mod service;
mod state;
mod translate;

pub use abi::*;
pub use absent::{
    rdma_get_remote_ece, rdma_join_multicast, rdma_join_multicast_ex, rdma_leave_multicast,
    rdma_reject_ece, rdma_set_local_ece, rpoll,
};
pub use channel::{
    rdma_ack_cm_event, rdma_create_event_channel, rdma_destroy_event_channel, rdma_event_str,
    rdma_get_cm_event,
};
pub use connect::{
    rdma_accept, rdma_connect, rdma_disconnect, rdma_establish, rdma_listen, rdma_notify,
    rdma_reject,
};
pub use ep::{
    rdma_create_ep, rdma_destroy_ep, rdma_free_devices, rdma_get_devices, rdma_get_request,
};
pub use id::{
    rdma_create_id, rdma_destroy_id, rdma_get_dst_port, rdma_get_src_port, rdma_migrate_id,
    rdma_set_option,
};
pub use qp::{rdma_create_qp, rdma_create_qp_ex, rdma_destroy_qp, rdma_init_qp_attr};
pub use resolve::{rdma_bind_addr, rdma_resolve_addr, rdma_resolve_route};
