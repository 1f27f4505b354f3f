//! The UDP header and RoCEv2's source port choice.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UdpRepr {
    pub src_port: u16,
    pub dst_port: u16,
    /// rxe sends 0 (no checksum) over IPv4 and IPv6; the ICRC protects the
    /// transport.
    pub checksum: u16,
}

impl UdpRepr {
    /// Parses the UDP header; returns the range of the UDP payload within `buf`.
    #[inline]
    pub fn parse(buf: &[u8]) -> Result<(Self, Range<usize>)> {
        let h = UdpHdr::view(buf)?;
        let len = h.len() as usize;
        if len < UdpHdr::LEN || len > buf.len() {
            return Err(WireError::BadLength);
        }
        Ok((
            UdpRepr {
                src_port: h.src_port(),
                dst_port: h.dst_port(),
                checksum: h.checksum(),
            },
            UdpHdr::LEN..len,
        ))
    }

    pub fn emit(&self, buf: &mut [u8], payload_len: usize) -> Result<usize> {
        let len = u16::try_from(UdpHdr::LEN + payload_len).map_err(|_| WireError::BadLength)?;
        let h = UdpHdr::view_mut(buf)?;
        h.set_src_port(self.src_port);
        h.set_dst_port(self.dst_port);
        h.set_len(len);
        h.set_checksum(self.checksum);
        Ok(UdpHdr::LEN)
    }
}

/// UDP source port for an RC QP pair, as rxe and rdma-core derive it: the GRH
/// flow label from both QPNs (`rdma_calc_flow_label`), folded into
/// 0xC000..=0xFFFF (`rdma_flow_label_to_udp_sport`). Gives ECMP entropy per
/// connection while keeping one connection on one path.
/// The UDP source port of a UD QP's packets, as rxe picks it once per QP
/// (`RXE_ROCE_V2_SPORT + hash_32(qpn, 14)`): UD has no peer QP to hash.
pub fn udp_sport_for_ud(qpn: u32) -> u16 {
    let h = qpn.wrapping_mul(0x61c8_8647) >> (32 - 14);
    (h & 0x3fff) as u16 | ROCE_V2_SPORT_MIN
}

pub fn udp_sport_for_qps(lqpn: u32, rqpn: u32) -> u16 {
    let mut v = lqpn as u64 * rqpn as u64;
    v ^= v >> 20;
    v ^= v >> 40;
    let fl = (v & 0xf_ffff) as u32;
    let fl_low = (fl & 0x3fff) ^ ((fl & 0xf_c000) >> 14);
    (fl_low as u16) | ROCE_V2_SPORT_MIN
}
