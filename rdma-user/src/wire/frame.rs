//! A whole RoCEv2 frame: Ethernet, IP, UDP, transport headers, payload and
//! ICRC, parsed with every check and emitted byte for byte.

use super::*;

/// A whole RoCEv2 frame, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceRepr {
    pub eth: EthernetRepr,
    pub ip: IpRepr,
    pub udp: UdpRepr,
    pub transport: TransportRepr,
}

/// Where the pieces of a parsed frame are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameLayout {
    /// Offset of the IP header.
    pub l3: usize,
    /// Offset of the BTH.
    pub transport: usize,
    /// The payload (without pad).
    pub payload: Range<usize>,
    /// End of the ICRC = end of the IP packet; an Ethernet frame may carry
    /// trailing bytes beyond it (minimum-size padding).
    pub end: usize,
    pub icrc: u32,
}

impl RoceRepr {
    /// Parses and fully validates a frame, ICRC included.
    #[inline]
    pub fn parse(frame: &[u8]) -> Result<(Self, FrameLayout)> {
        // Checked through a reference and returned as is: unwrapping and
        // rewrapping would copy the whole repr per packet.
        let parsed = Self::parse_unchecked_icrc(frame);
        if let Ok((_, layout)) = &parsed {
            if icrc(&frame[layout.l3..layout.end - ICRC_LEN])? != layout.icrc {
                return Err(WireError::BadIcrc);
            }
        }
        parsed
    }

    /// Parses and validates everything but the ICRC (for tools that want to
    /// show a packet whose ICRC is wrong).
    #[inline]
    pub fn parse_unchecked_icrc(frame: &[u8]) -> Result<(Self, FrameLayout)> {
        let (eth, l3) = EthernetRepr::parse(frame)?;
        let (ip, ip_payload) = IpRepr::parse(eth.ethertype, &frame[l3..])?;
        if ip.protocol() != IPPROTO_UDP {
            return Err(WireError::NotUdp);
        }
        let l4 = l3 + ip_payload.start;
        let ip_end = l3 + ip_payload.end;
        let (udp, udp_payload) = UdpRepr::parse(&frame[l4..ip_end])?;
        if udp.dst_port != ROCE_V2_UDP_PORT {
            return Err(WireError::NotRoce);
        }
        if l4 + udp_payload.end != ip_end {
            return Err(WireError::BadLength);
        }
        let tstart = l4 + udp_payload.start;
        let (transport, payload) = TransportRepr::parse(&frame[tstart..ip_end])?;
        let icrc = u32::from_le_bytes(frame[ip_end - ICRC_LEN..ip_end].try_into().unwrap());
        Ok((
            RoceRepr {
                eth,
                ip,
                udp,
                transport,
            },
            FrameLayout {
                l3,
                transport: tstart,
                payload: tstart + payload.start..tstart + payload.end,
                end: ip_end,
                icrc,
            },
        ))
    }

    /// Length of everything before the transport headers.
    pub fn net_header_len(&self) -> usize {
        self.eth.header_len() + self.ip.header_len() + UdpHdr::LEN
    }

    /// Total frame length for a payload of `payload_len` bytes.
    pub fn frame_len(&self, payload_len: usize) -> usize {
        self.net_header_len()
            + self.transport.header_len()
            + payload_len
            + pad_for(payload_len)
            + ICRC_LEN
    }

    /// Emits the frame with `payload`, zero pad bytes and a fresh ICRC.
    /// Returns the frame length.
    pub fn emit(&self, payload: &[u8], buf: &mut [u8]) -> Result<usize> {
        let total = self.frame_len(payload.len());
        if buf.len() < total {
            return Err(WireError::Truncated);
        }
        let tstart = self.net_header_len();
        let mut off = tstart;
        off += self.transport.emit(&mut buf[off..], payload.len())?;
        buf[off..off + payload.len()].copy_from_slice(payload);
        off += payload.len();
        let pad = pad_for(payload.len());
        buf[off..off + pad].fill(0);
        off += pad;
        let tlen = off + ICRC_LEN - tstart;
        self.emit_net_and_icrc(buf, tlen)?;
        Ok(total)
    }

    /// Writes Ethernet, IP and UDP headers in front of a transport segment of
    /// `transport_len` bytes (BTH through ICRC) that is already in place at
    /// `net_header_len()`, then the ICRC over it. This is the data path's
    /// framing step: the engine writes the transport, this wraps it.
    pub fn emit_net_and_icrc(&self, buf: &mut [u8], transport_len: usize) -> Result<usize> {
        let l3 = self.eth.emit(buf)?;
        let ihl = self.ip.header_len();
        let total = l3 + ihl + UdpHdr::LEN + transport_len;
        if buf.len() < total || transport_len < Bth::LEN + ICRC_LEN {
            return Err(WireError::Truncated);
        }
        self.ip.emit(&mut buf[l3..], UdpHdr::LEN + transport_len)?;
        self.udp.emit(&mut buf[l3 + ihl..], transport_len)?;
        let c = icrc(&buf[l3..total - ICRC_LEN])?;
        buf[total - ICRC_LEN..total].copy_from_slice(&c.to_le_bytes());
        Ok(total)
    }
}

/// The destination QPN of what looks like a RoCEv2 frame, read without
/// validating it (Ethernet with up to two VLAN tags, IPv4 or IPv6, UDP to
/// port 4791, then the BTH's QPN field). For steering a frame to the data
/// path that owns its QP; the owner parses and checks everything.
pub fn peek_dest_qpn(frame: &[u8]) -> Option<u32> {
    let be16 = |o: usize| -> Option<u16> {
        Some(u16::from_be_bytes(frame.get(o..o + 2)?.try_into().ok()?))
    };
    let mut l3 = 12;
    let mut ethertype = be16(l3)?;
    for _ in 0..2 {
        if ethertype == ETH_P_8021Q || ethertype == ETH_P_8021AD {
            l3 += 4;
            ethertype = be16(l3)?;
        }
    }
    l3 += 2;
    let l4 = match ethertype {
        ETH_P_IPV4 => {
            let b = *frame.get(l3)?;
            if *frame.get(l3 + 9)? != IPPROTO_UDP {
                return None;
            }
            l3 + (b as usize & 0x0f) * 4
        }
        ETH_P_IPV6 => {
            if *frame.get(l3 + 6)? != IPPROTO_UDP {
                return None;
            }
            l3 + 40
        }
        _ => return None,
    };
    if be16(l4 + 2)? != ROCE_V2_UDP_PORT {
        return None;
    }
    let q = frame.get(l4 + 8 + 5..l4 + 8 + 8)?;
    Some(u32::from_be_bytes([0, q[0], q[1], q[2]]))
}

#[cfg(test)]
mod peek_tests {
    use super::*;

    #[test]
    fn peek_reads_the_qpn_of_roce_frames_only() {
        // Ethernet, VLAN 7, IPv4 (IHL 5, UDP), UDP to 4791, BTH to QPN 0x123456.
        let mut f = vec![0u8; 14 + 4 + 20 + 8 + 12];
        f[12..14].copy_from_slice(&ETH_P_8021Q.to_be_bytes());
        f[16..18].copy_from_slice(&ETH_P_IPV4.to_be_bytes());
        f[18] = 0x45;
        f[18 + 9] = IPPROTO_UDP;
        f[38 + 2..38 + 4].copy_from_slice(&ROCE_V2_UDP_PORT.to_be_bytes());
        f[46 + 5..46 + 8].copy_from_slice(&[0x12, 0x34, 0x56]);
        assert_eq!(peek_dest_qpn(&f), Some(0x12_3456));
        // Another port, another protocol, or cut short: none.
        let mut g = f.clone();
        g[38 + 3] ^= 1;
        assert_eq!(peek_dest_qpn(&g), None);
        let mut g = f.clone();
        g[18 + 9] = 6;
        assert_eq!(peek_dest_qpn(&g), None);
        assert_eq!(peek_dest_qpn(&f[..f.len() - 5]), None);
        assert_eq!(peek_dest_qpn(&[]), None);
    }
}
