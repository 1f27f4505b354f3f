//! RoCEv2 wire format: typed views over byte buffers, parsed `Repr`s with
//! `parse`/`emit`, and the ICRC.
//!
//! Layering follows the frame: [`EthernetRepr`] (with one optional 802.1Q tag),
//! [`IpRepr`] (v4 or v6), [`UdpRepr`], then the InfiniBand transport
//! ([`TransportRepr`]: BTH and the extension headers its opcode selects), the
//! payload, 0-3 pad bytes and the 4-byte ICRC. The header layouts themselves
//! live in `rdma_common`, shared with the XDP program.

pub mod cm;
mod ethernet;
mod frame;
mod icrc;
mod ip;
pub mod pcap;
mod transport;
mod udp;

pub use ethernet::*;
pub use frame::*;
pub use icrc::*;
pub use ip::*;
pub use transport::*;
pub use udp::*;

use core::fmt;
use core::ops::Range;

use bytemuck::Pod;
pub use rdma_common::{
    ext_headers_len, opcode, opcode_flags, opcode_name, psn_add, psn_diff, Aeth, AtomicAckEth,
    AtomicEth, Bth, Deth, EthHdr, Ieth, ImmDt, Ipv4Hdr, Ipv6Hdr, Reth, UdpHdr, VlanHdr,
    CNP_RESERVED_LEN, ETH_P_8021AD, ETH_P_8021Q, ETH_P_IPV4, ETH_P_IPV6, ICRC_LEN, IPPROTO_UDP,
    MASK_24, ROCE_V2_SPORT_MIN, ROCE_V2_UDP_PORT, SACK_BITMAP_LEN,
};
pub use rdma_common::{OpFlags, OpcodeInfo, Position, OPCODE_FLAGS, OPCODE_TABLE};

/// Why a frame was not accepted. Each reason is distinct so that drops can be
/// counted under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WireError {
    /// The buffer ends before a header does.
    Truncated,
    /// Ethertype is neither IPv4 nor IPv6 (after at most one VLAN tag).
    NotIp,
    /// IP version field disagrees with the ethertype, or IHL < 5.
    BadIpHeader,
    /// IPv4 header checksum mismatch (the ICRC masks that field, so it must
    /// be checked on its own, as the kernel would before rxe sees a packet).
    BadIpChecksum,
    /// An IPv4 fragment: RoCEv2 is never fragmented.
    Fragment,
    /// IP protocol / next header is not UDP.
    NotUdp,
    /// UDP destination port is not 4791.
    NotRoce,
    /// IP or UDP length fields disagree with each other or with the frame.
    BadLength,
    /// BTH transport header version is not 0.
    BadTver,
    /// Opcode not in the RC/UC/UD/CNP table.
    UnknownOpcode,
    /// PadCnt does not bring the payload to a 4-byte multiple, or a
    /// payload-less opcode carries a payload.
    BadPadCount,
    /// Invariant CRC mismatch.
    BadIcrc,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WireError::Truncated => "truncated header",
            WireError::NotIp => "not IPv4/IPv6",
            WireError::BadIpHeader => "bad IP header",
            WireError::BadIpChecksum => "bad IPv4 header checksum",
            WireError::Fragment => "IP fragment",
            WireError::NotUdp => "not UDP",
            WireError::NotRoce => "not UDP port 4791",
            WireError::BadLength => "inconsistent IP/UDP length",
            WireError::BadTver => "BTH TVer is not 0",
            WireError::UnknownOpcode => "unknown opcode",
            WireError::BadPadCount => "bad pad count",
            WireError::BadIcrc => "bad ICRC",
        })
    }
}
impl std::error::Error for WireError {}

pub type Result<T> = core::result::Result<T, WireError>;

/// A fixed-size header that can be viewed in place inside a byte buffer.
pub trait Header: Pod {
    const SIZE: usize = core::mem::size_of::<Self>();

    /// Checked view of the header at the start of `buf`.
    #[inline]
    fn view(buf: &[u8]) -> Result<&Self> {
        buf.get(..Self::SIZE)
            .map(bytemuck::from_bytes)
            .ok_or(WireError::Truncated)
    }

    /// Checked mutable view of the header at the start of `buf`.
    #[inline]
    fn view_mut(buf: &mut [u8]) -> Result<&mut Self> {
        buf.get_mut(..Self::SIZE)
            .map(bytemuck::from_bytes_mut)
            .ok_or(WireError::Truncated)
    }
}
impl Header for EthHdr {}
impl Header for VlanHdr {}
impl Header for Ipv4Hdr {}
impl Header for Ipv6Hdr {}
impl Header for UdpHdr {}
impl Header for Bth {}
impl Header for Reth {}
impl Header for Aeth {}
impl Header for AtomicEth {}
impl Header for AtomicAckEth {}
impl Header for ImmDt {}
impl Header for Ieth {}
impl Header for Deth {}

#[cfg(test)]
pub(crate) mod tests;
