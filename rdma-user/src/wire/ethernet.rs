//! Ethernet II with at most one 802.1Q/802.1ad tag.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EthernetRepr {
    pub dst: [u8; 6],
    pub src: [u8; 6],
    /// 802.1Q TCI when the frame carries one tag.
    pub vlan_tci: Option<u16>,
    /// Ethertype of the payload (after the tag, if any).
    pub ethertype: u16,
}

impl EthernetRepr {
    /// Parses the Ethernet header (and one 802.1Q/802.1ad tag); returns the
    /// header length.
    #[inline]
    pub fn parse(buf: &[u8]) -> Result<(Self, usize)> {
        let eth = EthHdr::view(buf)?;
        let mut repr = EthernetRepr {
            dst: eth.dst,
            src: eth.src,
            vlan_tci: None,
            ethertype: eth.ethertype(),
        };
        let mut len = EthHdr::LEN;
        if repr.ethertype == ETH_P_8021Q || repr.ethertype == ETH_P_8021AD {
            let tag = VlanHdr::view(&buf[len..])?;
            repr.vlan_tci = Some(tag.tci());
            repr.ethertype = tag.ethertype();
            len += VlanHdr::LEN;
        }
        Ok((repr, len))
    }

    pub fn header_len(&self) -> usize {
        EthHdr::LEN
            + if self.vlan_tci.is_some() {
                VlanHdr::LEN
            } else {
                0
            }
    }

    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let eth = EthHdr::view_mut(buf)?;
        eth.dst = self.dst;
        eth.src = self.src;
        match self.vlan_tci {
            None => {
                eth.set_ethertype(self.ethertype);
                Ok(EthHdr::LEN)
            }
            Some(tci) => {
                eth.set_ethertype(ETH_P_8021Q);
                let tag = VlanHdr::view_mut(&mut buf[EthHdr::LEN..])?;
                tag.set_tci(tci);
                tag.set_ethertype(self.ethertype);
                Ok(EthHdr::LEN + VlanHdr::LEN)
            }
        }
    }
}
