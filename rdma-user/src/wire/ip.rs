//! IPv4 and IPv6 headers, the IPv4 checksum, and GIDs from addresses.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Repr {
    pub src: [u8; 4],
    pub dst: [u8; 4],
    pub tos: u8,
    pub id: u16,
    /// Flags and fragment offset, as on the wire (rxe sends DF).
    pub frag_off: u16,
    pub ttl: u8,
    pub protocol: u8,
    /// IP options, kept so that re-emitting reproduces the frame.
    pub options: [u8; 40],
    pub options_len: u8,
}

impl Default for Ipv4Repr {
    fn default() -> Self {
        Ipv4Repr {
            src: [0; 4],
            dst: [0; 4],
            tos: 0,
            id: 0,
            frag_off: Ipv4Hdr::FLAG_DF,
            ttl: 64,
            protocol: IPPROTO_UDP,
            options: [0; 40],
            options_len: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Repr {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub traffic_class: u8,
    pub flow_label: u32,
    pub hop_limit: u8,
    pub next_header: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpRepr {
    V4(Ipv4Repr),
    V6(Ipv6Repr),
}

/// Computes the IPv4 header checksum (RFC 1071) of `hdr`, whose checksum
/// field must be zero or is summed as-is.
pub fn ipv4_checksum(hdr: &[u8]) -> u16 {
    // Summed as 32-bit big-endian words into 64 bits (the one's complement
    // sum is the same folded down): a third of the steps of 16-bit words,
    // and it runs twice per packet.
    let mut sum: u64 = 0;
    let mut words = hdr.chunks_exact(4);
    for w in &mut words {
        sum += u32::from_be_bytes([w[0], w[1], w[2], w[3]]) as u64;
    }
    let mut tail = [0u8; 4];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    sum += u32::from_be_bytes(tail) as u64;
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

impl IpRepr {
    /// Parses the IP header at the start of `buf` (which must start after the
    /// Ethernet header). Returns the header and the range of the IP payload
    /// (bounded by the IP length fields, not by the buffer).
    #[inline]
    pub fn parse(ethertype: u16, buf: &[u8]) -> Result<(Self, Range<usize>)> {
        match ethertype {
            ETH_P_IPV4 => {
                let h = Ipv4Hdr::view(buf)?;
                let hl = h.header_len();
                if h.version() != 4 || hl < Ipv4Hdr::LEN {
                    return Err(WireError::BadIpHeader);
                }
                if buf.len() < hl {
                    return Err(WireError::Truncated);
                }
                let total = h.total_len() as usize;
                if total < hl {
                    return Err(WireError::BadLength);
                }
                if total > buf.len() {
                    return Err(WireError::Truncated);
                }
                if ipv4_checksum(&buf[..hl]) != 0 {
                    return Err(WireError::BadIpChecksum);
                }
                if h.frag_off() & (Ipv4Hdr::FLAG_MF | Ipv4Hdr::OFFSET_MASK) != 0 {
                    return Err(WireError::Fragment);
                }
                let mut options = [0u8; 40];
                options[..hl - Ipv4Hdr::LEN].copy_from_slice(&buf[Ipv4Hdr::LEN..hl]);
                let repr = Ipv4Repr {
                    src: h.src,
                    dst: h.dst,
                    tos: h.tos,
                    id: h.id(),
                    frag_off: h.frag_off(),
                    ttl: h.ttl,
                    protocol: h.protocol,
                    options,
                    options_len: (hl - Ipv4Hdr::LEN) as u8,
                };
                Ok((IpRepr::V4(repr), hl..total))
            }
            ETH_P_IPV6 => {
                let h = Ipv6Hdr::view(buf)?;
                if h.version() != 6 {
                    return Err(WireError::BadIpHeader);
                }
                let end = Ipv6Hdr::LEN + h.payload_len() as usize;
                if end > buf.len() {
                    return Err(WireError::Truncated);
                }
                let w = h.ver_tc_flow();
                let repr = Ipv6Repr {
                    src: h.src,
                    dst: h.dst,
                    traffic_class: (w >> 20) as u8,
                    flow_label: w & 0x000f_ffff,
                    hop_limit: h.hop_limit,
                    next_header: h.next_header,
                };
                Ok((IpRepr::V6(repr), Ipv6Hdr::LEN..end))
            }
            _ => Err(WireError::NotIp),
        }
    }

    pub fn protocol(&self) -> u8 {
        match self {
            IpRepr::V4(r) => r.protocol,
            IpRepr::V6(r) => r.next_header,
        }
    }

    pub fn ethertype(&self) -> u16 {
        match self {
            IpRepr::V4(_) => ETH_P_IPV4,
            IpRepr::V6(_) => ETH_P_IPV6,
        }
    }

    pub fn header_len(&self) -> usize {
        match self {
            IpRepr::V4(r) => Ipv4Hdr::LEN + r.options_len as usize,
            IpRepr::V6(_) => Ipv6Hdr::LEN,
        }
    }

    /// The traffic class byte: IPv4's TOS, IPv6's traffic class (DSCP in
    /// the high six bits, ECN in the low two).
    pub fn traffic_class(&self) -> u8 {
        match self {
            IpRepr::V4(r) => r.tos,
            IpRepr::V6(r) => r.traffic_class,
        }
    }

    pub fn set_traffic_class(&mut self, v: u8) {
        match self {
            IpRepr::V4(r) => r.tos = v,
            IpRepr::V6(r) => r.traffic_class = v,
        }
    }

    /// Source address as a 16-byte GID (IPv4 mapped as `::ffff:a.b.c.d`).
    pub fn src_gid(&self) -> [u8; 16] {
        match self {
            IpRepr::V4(r) => ipv4_mapped_gid(r.src),
            IpRepr::V6(r) => r.src,
        }
    }

    pub fn dst_gid(&self) -> [u8; 16] {
        match self {
            IpRepr::V4(r) => ipv4_mapped_gid(r.dst),
            IpRepr::V6(r) => r.dst,
        }
    }

    /// Emits the header for an IP payload of `payload_len` bytes, checksum
    /// included.
    pub fn emit(&self, buf: &mut [u8], payload_len: usize) -> Result<usize> {
        let hl = self.header_len();
        if buf.len() < hl {
            return Err(WireError::Truncated);
        }
        match self {
            IpRepr::V4(r) => {
                let total = u16::try_from(hl + payload_len).map_err(|_| WireError::BadLength)?;
                let h = Ipv4Hdr::view_mut(buf)?;
                h.version_ihl = 0x40 | (hl / 4) as u8;
                h.tos = r.tos;
                h.set_total_len(total);
                h.set_id(r.id);
                h.set_frag_off(r.frag_off);
                h.ttl = r.ttl;
                h.protocol = r.protocol;
                h.set_checksum(0);
                h.src = r.src;
                h.dst = r.dst;
                if r.options_len > 0 {
                    // Rare; skipping it skips a library call per packet.
                    buf[Ipv4Hdr::LEN..hl].copy_from_slice(&r.options[..r.options_len as usize]);
                }
                let csum = ipv4_checksum(&buf[..hl]);
                Ipv4Hdr::view_mut(buf)?.set_checksum(csum);
            }
            IpRepr::V6(r) => {
                let plen = u16::try_from(payload_len).map_err(|_| WireError::BadLength)?;
                let h = Ipv6Hdr::view_mut(buf)?;
                h.set_ver_tc_flow(
                    (6 << 28) | ((r.traffic_class as u32) << 20) | (r.flow_label & 0xf_ffff),
                );
                h.set_payload_len(plen);
                h.next_header = r.next_header;
                h.hop_limit = r.hop_limit;
                h.src = r.src;
                h.dst = r.dst;
            }
        }
        Ok(hl)
    }
}

/// The RoCEv2 GID of an IPv4 address: `::ffff:a.b.c.d`.
fn ipv4_mapped_gid(a: [u8; 4]) -> [u8; 16] {
    std::net::Ipv4Addr::from(a).to_ipv6_mapped().octets()
}

/// The RoCEv2 GID of an IP address (IPv4 mapped as `::ffff:a.b.c.d`), as
/// GID tables, GRHs and CM paths carry it.
pub fn gid_of(ip: std::net::IpAddr) -> [u8; 16] {
    match ip {
        std::net::IpAddr::V4(a) => ipv4_mapped_gid(a.octets()),
        std::net::IpAddr::V6(a) => a.octets(),
    }
}

/// The address a RoCEv2 GID stands for (IPv4-mapped GIDs give IPv4).
pub fn gid_to_ip(g: &[u8; 16]) -> std::net::IpAddr {
    let v6 = std::net::Ipv6Addr::from(*g);
    match v6.to_ipv4_mapped() {
        Some(v4) => std::net::IpAddr::V4(v4),
        None => std::net::IpAddr::V6(v6),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    #[test]
    fn gids_map_ipv4_and_carry_ipv6() {
        let v4: IpAddr = "10.99.0.2".parse().unwrap();
        let g = gid_of(v4);
        assert_eq!(g[..12], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
        assert_eq!(g[12..], [10, 99, 0, 2]);
        assert_eq!(gid_to_ip(&g), v4);
        let v6: IpAddr = "fd99::2".parse().unwrap();
        assert_eq!(gid_to_ip(&gid_of(v6)), v6);
        let r = IpRepr::V4(Ipv4Repr {
            src: [10, 99, 0, 2],
            dst: [10, 99, 0, 3],
            ..Default::default()
        });
        assert_eq!(r.src_gid(), g);
    }
}
