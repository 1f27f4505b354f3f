//! The data path's counters: the receive path's drops, and the JSON that
//! `rdma-xdp stats` shows.

use super::DataPath;
use crate::transport::QpStats;
use crate::wire::WireError;

/// Counters of the userspace receive path, one per drop reason.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct DpStats {
    pub rx_frames: u64,
    /// RC requests handed to an engine (they are owed responses).
    pub rx_requests: u64,
    pub tx_frames: u64,
    pub rx_truncated: u64,
    /// Not IPv4/IPv6 (after at most one VLAN tag).
    pub rx_not_ip: u64,
    /// IP, but not UDP.
    pub rx_not_udp: u64,
    /// UDP, but not to port 4791.
    pub rx_not_roce: u64,
    /// A non-first IP fragment.
    pub rx_fragment: u64,
    /// IP header length or version wrong.
    pub rx_bad_ip_header: u64,
    /// IP or UDP length disagrees with the frame.
    pub rx_bad_length: u64,
    pub rx_bad_tver: u64,
    pub rx_unknown_opcode: u64,
    pub rx_bad_pad: u64,
    pub rx_bad_icrc: u64,
    pub rx_bad_ip_checksum: u64,
    pub rx_unknown_qpn: u64,
    pub rx_wrong_source: u64,
    pub tx_ring_full: u64,
    /// UD sends whose address handle was destroyed before they left.
    pub tx_no_ah: u64,
    /// Frames whose network headers or ICRC could not be written (never
    /// expected: the buffer is sized for them).
    pub tx_emit_errors: u64,
    pub cq_overflows: u64,
}

impl DpStats {
    pub(super) fn count(&mut self, e: WireError) {
        match e {
            WireError::Truncated => self.rx_truncated += 1,
            WireError::NotIp => self.rx_not_ip += 1,
            WireError::NotUdp => self.rx_not_udp += 1,
            WireError::NotRoce => self.rx_not_roce += 1,
            WireError::Fragment => self.rx_fragment += 1,
            WireError::BadIpHeader => self.rx_bad_ip_header += 1,
            WireError::BadLength => self.rx_bad_length += 1,
            WireError::BadTver => self.rx_bad_tver += 1,
            WireError::UnknownOpcode => self.rx_unknown_opcode += 1,
            WireError::BadPadCount => self.rx_bad_pad += 1,
            WireError::BadIcrc => self.rx_bad_icrc += 1,
            WireError::BadIpChecksum => self.rx_bad_ip_checksum += 1,
        }
    }
}

impl DataPath {
    /// The counters, as `rdma-xdp stats` shows them: the receive path's,
    /// each AF_XDP socket's (the kernel's drops included) and each QP's.
    pub fn stats_json(&self) -> serde_json::Value {
        let xsk: Vec<serde_json::Value> = self
            .xsks
            .iter()
            .map(|x| {
                let k = x.kernel_stats();
                serde_json::json!({"rx_frames": x.rx_frames, "tx_frames": x.tx_frames,
                    "rx_oversize": x.rx_dropped_oversize, "kernel_rx_dropped": k.rx_dropped,
                    "kernel_rx_ring_full": k.rx_ring_full,
                    "kernel_rx_fill_ring_empty": k.rx_fill_ring_empty_descs,
                    "kernel_tx_invalid": k.tx_invalid_descs,
                    "tx_stalled": x.tx_stalled(),
                    "rings": x.debug_state(), "bind": x.mode.name(),
                    "multi_buffer": x.multi_buffer})
            })
            .collect();
        let mut qps: Vec<(u32, QpStats)> = self
            .core
            .qps
            .iter()
            .map(|(n, s)| (*n, s.qp.stats()))
            .collect();
        qps.sort_by_key(|q| q.0);
        let qps: Vec<serde_json::Value> = qps
            .into_iter()
            .map(|(n, s)| {
                serde_json::json!({"qpn": n, "stats": s,
                    "xdp_responder": self.core.xdp_responder_stats(n)})
            })
            .collect();
        // DCQCN's counters over all QPs, under mlx5's names.
        let mut dp = serde_json::to_value(self.core.stats).unwrap_or_default();
        if let (Some(m), Some(g)) = (dp.as_object_mut(), &self.core.gsi) {
            m.insert(
                "gsi".into(),
                serde_json::to_value(&g.stats).unwrap_or_default(),
            );
        }
        let sum = |f: fn(&QpStats) -> u64| -> u64 {
            self.core.qps.values().map(|s| f(&s.qp.stats())).sum()
        };
        if let Some(m) = dp.as_object_mut() {
            m.insert(
                "np_ecn_marked_roce_packets".into(),
                sum(|s| s.np_ecn_marked_roce_packets).into(),
            );
            m.insert("np_cnp_sent".into(), sum(|s| s.np_cnp_sent).into());
            m.insert("rp_cnp_handled".into(), sum(|s| s.rp_cnp_handled).into());
            m.insert("rp_cnp_ignored".into(), sum(|s| s.rp_cnp_ignored).into());
        }
        if let (Some(m), Some(sh)) = (dp.as_object_mut(), &self.shard) {
            m.insert("rx_wrong_queue".into(), sh.rx_wrong_queue.into());
            m.insert(
                "rx_wrong_queue_dropped".into(),
                sh.rx_wrong_queue_dropped.into(),
            );
        }
        serde_json::json!({"datapath": dp, "xsk": xsk, "qps": qps})
    }
}
