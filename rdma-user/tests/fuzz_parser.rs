//! The parser must never panic or read out of bounds, whatever the bytes.

use proptest::prelude::*;
use rdma_user::wire::pcap::read_pcap;
use rdma_user::wire::*;

fn seeds() -> &'static [Vec<u8>] {
    static SEEDS: std::sync::OnceLock<Vec<Vec<u8>>> = std::sync::OnceLock::new();
    SEEDS.get_or_init(load_seeds)
}

fn load_seeds() -> Vec<Vec<u8>> {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut v = Vec::new();
    for name in [
        "write_lat_2500B.pcap",
        "read_lat_64B.pcap",
        "write_lat_64B_ipv6.pcap",
        "send_lat_UD_64B.pcap",
    ] {
        for f in read_pcap(&dir.join(name)).unwrap() {
            if f.data.len() > 42 {
                v.push(f.data);
            }
        }
    }
    v
}

fn check(bytes: &[u8]) {
    if let Ok((repr, layout)) = RoceRepr::parse(bytes) {
        // Whatever parses must be in bounds and re-emit to the same bytes.
        assert!(layout.payload.end <= layout.end && layout.end <= bytes.len());
        let mut out = vec![0u8; layout.end];
        let n = repr.emit(&bytes[layout.payload.clone()], &mut out).unwrap();
        assert_eq!(&out[..n], &bytes[..n]);
    }
    let _ = TransportRepr::parse(bytes);
    let _ = icrc(bytes);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 20_000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        check(&bytes);
    }

    #[test]
    fn mutated_real_frames(idx in any::<prop::sample::Index>(),
                           edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
                           cut in any::<prop::sample::Index>()) {
        let seeds = seeds();
        let mut f = seeds[idx.index(seeds.len())].clone();
        for (at, b) in edits {
            let i = at.index(f.len());
            f[i] = b;
        }
        let keep = cut.index(f.len() + 1);
        if keep % 3 == 0 { f.truncate(keep); }
        check(&f);
    }
}
