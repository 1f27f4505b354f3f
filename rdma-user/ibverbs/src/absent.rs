//! Symbols the Debian binaries link (perftest, UCX's `libuct_ib`,
//! libfabric, Open MPI's verbs components, pyverbs) for features this
//! library does not offer. A program built with BIND_NOW needs each at load
//! time, and glibc refuses a library that lacks a version node a program
//! names. Each answers as rdma-core answers for a device without the
//! feature: NULL with errno, -1 with errno, or an errno value; never
//! success.
//!
//! - libmlx5 / libefa direct verbs: only for mlx5 / EFA devices, which ours
//!   are not (vendor id 0xffffff). `mlx5dv_is_supported` is false, the
//!   rest EOPNOTSUPP (what libmlx5 answers for a device of another driver).
//! - libibverbs calls that a kernel provider implements and ours does not
//!   (rdma-core's `dummy_ops` answers): importing objects of another
//!   process's context, dmabuf MRs, device memory, ECE, re-registering an
//!   MR, resizing a CQ, UD multicast.

use std::ffi::{c_int, c_void};
use std::ptr;

use crate::set_errno;

/// `fn(...) -> *mut c_void` returning NULL with `errno`.
macro_rules! null_with_errno {
    ($errno:expr => $($name:ident),* $(,)?) => {$(
        /// Not offered (see the module docs): NULL with errno.
        #[no_mangle]
        pub extern "C" fn $name() -> *mut c_void {
            set_errno($errno);
            ptr::null_mut()
        }
    )*};
}

/// `fn(...) -> int` returning the errno itself (libibverbs' and the
/// direct-verbs convention).
macro_rules! errno_value {
    ($errno:expr => $($name:ident),* $(,)?) => {$(
        /// Not offered (see the module docs): the errno value.
        #[no_mangle]
        pub extern "C" fn $name() -> c_int {
            $errno
        }
    )*};
}

/// `fn(...) -> int` or `ssize_t` returning -1 with `errno` (calls that
/// return a file descriptor or a length).
macro_rules! minus_one_with_errno {
    ($errno:expr => $($name:ident),* $(,)?) => {$(
        /// Not offered (see the module docs): -1 with errno.
        #[no_mangle]
        pub extern "C" fn $name() -> isize {
            set_errno($errno);
            -1
        }
    )*};
}

/// `fn(...)` returning nothing: frees of objects that cannot exist here.
macro_rules! nothing {
    ($($name:ident),* $(,)?) => {$(
        /// Not offered (see the module docs): nothing to free.
        #[no_mangle]
        pub extern "C" fn $name() {}
    )*};
}

/// Not an mlx5 device: the check UCX, libfabric and NCCL make before any
/// other direct verb.
#[no_mangle]
pub extern "C" fn mlx5dv_is_supported() -> bool {
    false
}

null_with_errno!(libc::EOPNOTSUPP =>
    // libmlx5
    mlx5dv_create_mkey, mlx5dv_qp_ex_from_ibv_qp_ex, mlx5dv_dek_create, mlx5dv_create_qp,
    mlx5dv_open_device, mlx5dv_create_cq, mlx5dv_dr_action_create_dest_ibv_qp,
    mlx5dv_dr_action_create_dest_table, mlx5dv_dr_action_create_dest_vport,
    mlx5dv_dr_action_create_drop, mlx5dv_dr_action_create_flow_counter,
    mlx5dv_dr_action_create_modify_header, mlx5dv_dr_action_create_packet_reformat,
    mlx5dv_dr_action_create_tag, mlx5dv_dr_domain_create, mlx5dv_dr_matcher_create,
    mlx5dv_dr_rule_create, mlx5dv_dr_table_create, mlx5dv_devx_create_event_channel,
    mlx5dv_alloc_var, mlx5dv_pp_alloc, mlx5dv_dr_action_create_default_miss,
    mlx5dv_dr_action_create_dest_devx_tir, mlx5dv_dr_action_create_dest_array,
    mlx5dv_dr_action_create_flow_sampler, mlx5dv_dr_action_create_pop_vlan,
    mlx5dv_dr_action_create_push_vlan, mlx5dv_sched_leaf_create, mlx5dv_sched_node_create,
    mlx5dv_devx_umem_reg_ex, mlx5dv_dm_map_op_addr, mlx5dv_dr_action_create_dest_ib_port,
    mlx5dv_get_vfio_device_list, mlx5dv_devx_alloc_msi_vector, mlx5dv_devx_create_eq,
    mlx5dv_crypto_login_create, mlx5dv_create_flow, mlx5dv_create_flow_matcher,
    mlx5dv_create_flow_action_packet_reformat, mlx5dv_devx_alloc_uar, mlx5dv_devx_obj_create,
    mlx5dv_devx_umem_reg,
    // libefa
    efadv_create_qp_ex, efadv_create_driver_qp, efadv_cq_from_ibv_cq_ex, efadv_create_cq,
    // libibverbs: another process's objects, dmabuf MRs, device memory
    ibv_import_device, ibv_import_pd, ibv_import_mr, ibv_import_dm, ibv_reg_dmabuf_mr,
);
errno_value!(libc::EOPNOTSUPP =>
    // libmlx5
    mlx5dv_destroy_mkey, mlx5dv_crypto_login, mlx5dv_dek_destroy, mlx5dv_devx_general_cmd,
    mlx5dv_query_device, mlx5dv_init_obj, mlx5dv_dr_action_destroy, mlx5dv_dr_domain_destroy,
    mlx5dv_dr_domain_sync, mlx5dv_dr_matcher_destroy, mlx5dv_dr_rule_destroy,
    mlx5dv_dr_table_destroy, mlx5dv_devx_subscribe_devx_event, mlx5dv_dump_dr_domain,
    mlx5dv_modify_qp_lag_port, mlx5dv_query_qp_lag_port, mlx5dv_modify_qp_sched_elem,
    mlx5dv_modify_qp_udp_sport, mlx5dv_sched_leaf_destroy, mlx5dv_sched_leaf_modify,
    mlx5dv_sched_node_destroy, mlx5dv_sched_node_modify, mlx5dv_reserved_qpn_alloc,
    mlx5dv_reserved_qpn_dealloc, _mlx5dv_query_port, _mlx5dv_mkey_check, mlx5dv_map_ah_to_qp,
    mlx5dv_qp_cancel_posted_send_wrs, mlx5dv_crypto_login_query_state, mlx5dv_crypto_logout,
    mlx5dv_dci_stream_id_reset, mlx5dv_dek_query, mlx5dv_dr_matcher_set_layout,
    mlx5dv_vfio_process_events, mlx5dv_devx_destroy_eq, mlx5dv_devx_free_msi_vector,
    mlx5dv_crypto_login_destroy, mlx5dv_crypto_login_query, mlx5dv_get_clock_info,
    mlx5dv_destroy_flow_matcher, mlx5dv_devx_obj_destroy, mlx5dv_devx_obj_modify,
    mlx5dv_devx_obj_query, mlx5dv_devx_query_eqn, mlx5dv_devx_umem_dereg, mlx5dv_devx_qp_modify,
    mlx5dv_devx_qp_query,
    // libefa
    efadv_query_device, efadv_query_ah,
    // libibverbs: UD multicast, ECE, resizing a CQ
    ibv_attach_mcast, ibv_detach_mcast, ibv_query_ece, ibv_set_ece, ibv_resize_cq,
);
minus_one_with_errno!(libc::EOPNOTSUPP =>
    mlx5dv_devx_get_event, mlx5dv_vfio_get_events_fd,
);
nothing!(
    mlx5dv_devx_destroy_event_channel,
    mlx5dv_free_var,
    mlx5dv_pp_free,
    mlx5dv_dr_domain_allow_duplicate_rules,
    mlx5dv_devx_free_uar,
    ibv_unimport_pd,
    ibv_unimport_mr,
    ibv_unimport_dm,
);

/// `IBV_REREG_MR_ERR_INPUT` with errno EOPNOTSUPP: the MR stays as it was
/// (rdma-core's answer for a provider without `rereg_mr`).
#[no_mangle]
pub extern "C" fn ibv_rereg_mr() -> c_int {
    set_errno(libc::EOPNOTSUPP);
    -1
}

/// No promise of in-order data placement: 0, rdma-core's answer for a
/// provider that does not say.
#[no_mangle]
pub extern "C" fn ibv_query_qp_data_in_order() -> c_int {
    0
}
