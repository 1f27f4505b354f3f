//! The invariant CRC of RoCEv2 (annex A17.3.3): the masked fields and the
//! CRC-32 over them.

use core::mem::offset_of;

use super::*;

/// Computes the ICRC of a RoCEv2 packet. `l3` starts at the IP header and ends
/// right before the ICRC. The variant fields are replaced by ones as the IBA
/// (Annex A17.3.3) requires: IPv4 TOS, TTL and header checksum; IPv6 traffic
/// class, flow label and hop limit; the UDP checksum; BTH byte 4 (resv8a).
/// 64 bits of ones stand in for the absent LRH.
pub fn icrc(l3: &[u8]) -> Result<u32> {
    // crc32fast folds with PCLMULQDQ only from 128 bytes on and runs a
    // table loop below that; a small packet's masked copy is therefore
    // hashed whole in one call (a 64 B WRITE is exactly 128 bytes) rather
    // than as masked part plus rest.
    const SMALL: usize = 256;
    let mut buf = [0u8; SMALL];
    if 8 + l3.len() <= SMALL {
        let n = mask_invariant(l3, &mut buf)?;
        buf[n..8 + l3.len()].copy_from_slice(&l3[n - 8..]);
        let mut h = crc_hasher();
        h.update(&buf[..8 + l3.len()]);
        return Ok(h.finalize());
    }
    let n = mask_invariant(l3, &mut buf)?;
    let mut h = crc_hasher();
    h.update(&buf[..n]);
    h.update(&l3[n - 8..]);
    Ok(h.finalize())
}

/// A fresh CRC-32 hasher. `Hasher::new` detects CPU features on every call
/// (measurable twice per packet); the detected prototype is cloned instead.
pub(super) fn crc_hasher() -> crc32fast::Hasher {
    static PROTO: std::sync::LazyLock<crc32fast::Hasher> =
        std::sync::LazyLock::new(crc32fast::Hasher::new);
    PROTO.clone()
}

/// Writes the ICRC's masked view of the headers up to the end of the BTH
/// into `out`: 64 bits of ones, then IP, UDP and BTH with the variant
/// fields set to ones. Returns the length written.
pub(super) fn mask_invariant(l3: &[u8], out: &mut [u8]) -> Result<usize> {
    out[..8].fill(0xff);
    let ihl = match l3.first().map(|b| b >> 4) {
        Some(4) => {
            let ihl = ((l3[0] & 0xf) as usize) * 4;
            if ihl < Ipv4Hdr::LEN || l3.len() < ihl {
                return Err(WireError::Truncated);
            }
            ihl
        }
        Some(6) => Ipv6Hdr::LEN,
        _ => return Err(WireError::BadIpHeader),
    };
    let n = ihl + UdpHdr::LEN + Bth::LEN;
    if l3.len() < n {
        return Err(WireError::Truncated);
    }
    let h = &mut out[8..8 + n];
    h.copy_from_slice(&l3[..n]);
    if l3[0] >> 4 == 6 {
        // Traffic class and flow label: all of ver_tc_flow but the version.
        let f = offset_of!(Ipv6Hdr, ver_tc_flow);
        h[f] |= 0x0f;
        h[f + 1..f + 4].fill(0xff);
        h[offset_of!(Ipv6Hdr, hop_limit)] = 0xff;
    } else {
        h[offset_of!(Ipv4Hdr, tos)] = 0xff;
        h[offset_of!(Ipv4Hdr, ttl)] = 0xff;
        let c = offset_of!(Ipv4Hdr, checksum);
        h[c..c + 2].fill(0xff);
    }
    let t = &mut h[ihl..];
    let c = offset_of!(UdpHdr, checksum);
    t[c..c + 2].fill(0xff);
    t[UdpHdr::LEN + offset_of!(Bth, resv8a)] = 0xff;
    Ok(8 + n)
}
