//! `decode`: every RoCEv2 packet of a pcap file, one line each, as
//! Wireshark's InfiniBand dissector names it.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use rdma_user::wire::*;

#[derive(Args)]
pub struct DecodeArgs {
    pub file: PathBuf,
}

pub fn decode(file: &std::path::Path) -> Result<()> {
    let frames = rdma_user::wire::pcap::read_pcap(file)?;
    let t0 = frames.first().map(|f| f.ts).unwrap_or(0.0);
    for f in &frames {
        let Ok((r, l)) = RoceRepr::parse_unchecked_icrc(&f.data) else {
            continue;
        };
        let icrc_ok = icrc(&f.data[l.l3..l.end - ICRC_LEN])
            .map(|c| c == l.icrc)
            .unwrap_or(false);
        let (src, dst) = match r.ip {
            IpRepr::V4(ip) => (
                std::net::Ipv4Addr::from(ip.src).to_string(),
                std::net::Ipv4Addr::from(ip.dst).to_string(),
            ),
            IpRepr::V6(ip) => (
                std::net::Ipv6Addr::from(ip.src).to_string(),
                std::net::Ipv6Addr::from(ip.dst).to_string(),
            ),
        };
        let t = r.transport;
        let mut line = format!(
            "{:10.6} {} > {} {}(0x{:02x}) DQP=0x{:06x} PSN=0x{:06x} A={}",
            f.ts - t0,
            src,
            dst,
            opcode_name(t.bth.opcode),
            t.bth.opcode,
            t.bth.dest_qpn,
            t.bth.psn,
            t.bth.ack_req as u8
        );
        if let Some(x) = t.reth {
            line += &format!(
                " RETH[VA=0x{:x} R_Key=0x{:x} DMALen={}]",
                x.va, x.rkey, x.dma_len
            );
        }
        if let Some(x) = t.atomic_eth {
            line += &format!(
                " AtomicETH[VA=0x{:x} R_Key=0x{:x} SwapAdd=0x{:x} Cmp=0x{:x}]",
                x.va, x.rkey, x.swap_add, x.compare
            );
        }
        if let Some(x) = t.deth {
            line += &format!(" DETH[Q_Key=0x{:x} SrcQP=0x{:06x}]", x.qkey, x.src_qpn);
        }
        if let Some(x) = t.aeth {
            line += &format!(
                " AETH[syndrome=0x{:02x} {} MSN={}]",
                x.syndrome,
                Syndrome::decode(x.syndrome),
                x.msn
            );
        }
        if let Some(x) = t.atomic_ack {
            line += &format!(" AtomicAckETH[orig=0x{x:x}]");
        }
        if let Some(x) = t.imm {
            line += &format!(" ImmDt=0x{x:08x}");
        }
        if let Some(x) = t.ieth {
            line += &format!(" IETH[R_Key=0x{x:x}]");
        }
        line += &format!(
            " payload={} ICRC={}",
            l.payload.len(),
            if icrc_ok { "ok" } else { "BAD" }
        );
        println!("{line}");
    }
    Ok(())
}
