//! `rdma-xdp decode` must agree with Wireshark's InfiniBand dissector on the
//! opcode, destination QPN and PSN of every RoCEv2 packet in the captures.

use std::path::PathBuf;
use std::process::Command;

fn tshark_fields(pcap: &PathBuf) -> Vec<(u8, u32, u32)> {
    let out = Command::new("tshark")
        .args(["-r"])
        .arg(pcap)
        .args(["-Y", "infiniband", "-T", "fields", "-e", "infiniband.bth.opcode", "-e", "infiniband.bth.destqp", "-e", "infiniband.bth.psn"])
        .output()
        .unwrap_or_else(|e| {
            panic!("tshark is not installed ({e}); install it with `apt-get install tshark` (cargo xtask test does)")
        });
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let opc: u8 = f[0].parse().unwrap();
            let qpn = u32::from_str_radix(f[1].trim_start_matches("0x"), 16).unwrap();
            let psn: u32 = f[2].parse().unwrap();
            (opc, qpn, psn)
        })
        .collect()
}

fn our_fields(pcap: &PathBuf) -> Vec<(u8, u32, u32)> {
    let out = Command::new(env!("CARGO_BIN_EXE_rdma-xdp"))
        .arg("decode")
        .arg(pcap)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let grab = |key: &str| -> u32 {
                let i = l
                    .find(key)
                    .unwrap_or_else(|| panic!("{key} missing in: {l}"))
                    + key.len();
                let end = l[i..].find([' ', ')']).map(|e| i + e).unwrap_or(l.len());
                u32::from_str_radix(&l[i..end], 16).unwrap()
            };
            assert!(l.ends_with("ICRC=ok"), "ICRC not ok: {l}");
            (grab("(0x") as u8, grab("DQP=0x"), grab("PSN=0x"))
        })
        .collect()
}

#[test]
fn decode_matches_tshark_on_every_capture() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    files.sort();
    let mut total = 0;
    for f in &files {
        let ours = our_fields(f);
        let theirs = tshark_fields(f);
        assert_eq!(ours, theirs, "{}", f.display());
        total += ours.len();
    }
    assert_eq!(total, 292, "every RoCEv2 packet of the captures compared");
}
