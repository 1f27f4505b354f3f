//! Reading pcap files (test vectors, `decode`).
//!
//! Never on the data path.

use std::path::Path;

use anyhow::{Context, Result};

/// One captured frame with its timestamp in seconds since the epoch.
#[derive(Debug, Clone)]
pub struct CapturedFrame {
    pub ts: f64,
    pub data: Vec<u8>,
}

/// Reads every frame of a classic pcap file with Ethernet link type.
pub fn read_pcap(path: &Path) -> Result<Vec<CapturedFrame>> {
    let file = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    let mut reader = pcap_file::pcap::PcapReader::new(file)
        .with_context(|| format!("{} is not a pcap file", path.display()))?;
    let linktype = reader.header().datalink;
    anyhow::ensure!(
        linktype == pcap_file::DataLink::ETHERNET,
        "{}: link type {:?}, only Ethernet captures are supported",
        path.display(),
        linktype
    );
    let mut out = Vec::new();
    while let Some(pkt) = reader.next_packet() {
        let pkt = pkt.with_context(|| format!("{}: bad record", path.display()))?;
        out.push(CapturedFrame {
            ts: pkt.timestamp.as_secs_f64(),
            data: pkt.data.into_owned(),
        });
    }
    Ok(out)
}
