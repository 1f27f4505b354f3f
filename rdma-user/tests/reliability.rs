//! Reliability in namespaces: the verified soak workload through the seeded
//! impairment relay, hostile-packet floods, UMEM exhaustion. Root only;
//! serialized (two cores: one pair of data paths at a time).

mod lab;

use std::time::Duration;

use lab::{serial, wait_timeout, Lab, BIN};
use serde_json::Value;

/// Kills a helper process if the test fails before waiting for it.
struct Reap(Option<std::process::Child>);

impl Drop for Reap {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The relay's arguments for every kind of fault at once, seeded.
fn every_fault(seed: &str) -> [&str; 12] {
    [
        "--loss",
        "0.05",
        "--reorder",
        "0.05",
        "--dup",
        "0.02",
        "--corrupt",
        "0.005",
        "--jitter-us",
        "20",
        "--seed",
        seed,
    ]
}

/// Runs the soak client on A against a soak server on B; returns the
/// client's report.
fn soak(lab: &Lab, ops: u64, seed: u64) -> Value {
    soak_with(lab, ops, seed, &[])
}

/// As [`soak`], with `extra` arguments for both sides.
fn soak_with(lab: &Lab, ops: u64, seed: u64, extra: &[&str]) -> Value {
    let seed = seed.to_string();
    let mut sargs = vec!["soak", "--dev", &lab.dev[1], "--seed", &seed];
    sargs.extend_from_slice(extra);
    let server = lab.spawn(1, &sargs);
    std::thread::sleep(Duration::from_millis(300));
    let ops = ops.to_string();
    let mut cargs = vec![
        "soak",
        &lab.addr[1],
        "--dev",
        &lab.dev[0],
        "-n",
        &ops,
        "--seed",
        &seed,
        "--stall-timeout",
        "20",
    ];
    cargs.extend_from_slice(extra);
    let client = lab.exec(0, BIN, &cargs);
    let s = wait_timeout(server, Duration::from_secs(10));
    let rep: Value = serde_json::from_slice(&client.stdout).unwrap_or_else(|e| {
        panic!(
            "soak client: {e}\nclient: {}\nserver: {}",
            String::from_utf8_lossy(&client.stderr),
            String::from_utf8_lossy(&s.stderr)
        )
    });
    assert!(
        client.status.success(),
        "soak failed: {}\n{}",
        rep["first_error"],
        String::from_utf8_lossy(&client.stderr)
    );
    rep
}

#[test]
fn soak_through_the_relay_with_every_fault_loses_nothing() {
    let _g = serial();
    let mut lab = Lab::with_relay(1500);
    lab.start_relay(&every_fault("11"));
    let rep = soak(&lab, 3000, 5);
    let r = lab.stop_relay();
    for k in ["lost", "duplicated", "corrupted", "error_wcs"] {
        assert_eq!(rep[k], 0, "{k}: {rep}");
    }
    assert_eq!(rep["completed"], 3000);
    assert_eq!(rep["final_area_checked"], true);
    assert_eq!(rep["server"]["sends_received"], rep["sends"]);
    assert!(rep["retransmits"].as_u64().unwrap() > 0, "{rep}");
    // Every kind of fault really happened, in both directions together.
    for k in ["dropped", "duplicated", "corrupted", "reordered"] {
        let n = r["a_to_b"][k].as_u64().unwrap() + r["b_to_a"][k].as_u64().unwrap();
        assert!(n > 0, "relay never {k}: {r}");
    }
}

/// The same soak with the XDP responder on the server's MR:
/// every fault through the relay, WRITEs placed by XDP between READs,
/// SENDs and atomics that take the QP back to the engine, and nothing
/// lost, duplicated or corrupted.
#[test]
fn soak_with_the_xdp_responder_through_every_fault_loses_nothing() {
    xdp_soak_through_every_fault(false);
}

/// As above, the two sides recovering by selective repeat: XDP serves the
/// QP while nothing is kept ahead of its expected PSN, punts what arrives
/// ahead (the engine keeps it and SACKs), and is lent the QP again once
/// the gap is filled.
#[test]
fn soak_with_the_xdp_responder_under_selective_repeat_loses_nothing() {
    xdp_soak_through_every_fault(true);
}

fn xdp_soak_through_every_fault(selective_repeat: bool) {
    let _g = serial();
    let mut lab = Lab::with_relay(1500);
    lab.start_relay(&every_fault("12"));
    let mut args = vec!["--pool"];
    if !selective_repeat {
        args.push("--no-selective-repeat");
    }
    let rep = soak_with(&lab, 3000, 6, &args);
    lab.stop_relay();
    for k in ["lost", "duplicated", "corrupted", "error_wcs"] {
        assert_eq!(rep[k], 0, "{k}: {rep}");
    }
    assert_eq!(rep["completed"], 3000);
    assert_eq!(rep["final_area_checked"], true);
    assert_eq!(rep["mode"], if selective_repeat { "sr" } else { "gbn" });
    let srv = &rep["server"];
    assert_eq!(srv["sends_received"], rep["sends"]);
    // The QP went back and forth between XDP and the engine hundreds of
    // times (every READ and SEND takes it back), XDP placed the WRITEs
    // and executed the atomics that reached it in order, and the engine
    // replayed duplicates of XDP's atomics with the values XDP found (the
    // soak checks every atomic's result and the counters' final values).
    eprintln!("server: {srv}");
    assert!(srv["xdp_placed"].as_u64().unwrap() > 0, "{srv}");
    assert!(srv["xdp_atomics"].as_u64().unwrap() > 0, "{srv}");
    assert!(srv["xdp_punts"].as_u64().unwrap() > 100, "{srv}");
    // Requests ahead of the expected PSN (the relay's loss and reordering)
    // went to the engine.
    assert!(
        srv["xdp_punt_reasons"]["psn"].as_u64().unwrap() > 0,
        "{srv}"
    );
}

/// WRITEs and atomics only: the QP stays lent to XDP most of the time, so
/// XDP executes most atomics, and the relay's duplicates and go-back-N's
/// resends of them meet the engine after a take-back, which must replay
/// the values XDP found (the soak checks every atomic's original value and
/// the counters' final values).
#[test]
fn soak_of_writes_reads_and_atomics_replays_what_the_xdp_responder_executed() {
    let _g = serial();
    let mut lab = Lab::with_relay(1500);
    // Duplicates, and a little loss for go-back-N's resends: with every
    // fault at once the QP is rarely in order long enough to be lent.
    lab.start_relay(&["--dup", "0.05", "--loss", "0.01", "--seed", "13"]);
    let rep = soak_with(
        &lab,
        3000,
        7,
        &[
            "--pool",
            "--no-selective-repeat",
            "--kinds",
            "write,read,fetch-add,cmp-swap",
        ],
    );
    lab.stop_relay();
    for k in ["lost", "duplicated", "corrupted", "error_wcs"] {
        assert_eq!(rep[k], 0, "{k}: {rep}");
    }
    assert_eq!(rep["completed"], 3000);
    assert_eq!(rep["final_area_checked"], true);
    assert_eq!(rep["sends"], 0, "{rep}");
    let srv = &rep["server"];
    eprintln!("server: {srv}");
    // How many depends on how often the QP is lent (the relay's timing):
    // 84 to 121 atomics and 40 to 55 READs in the runs so far.
    assert!(srv["xdp_atomics"].as_u64().unwrap() > 20, "{srv}");
    assert!(srv["xdp_reads"].as_u64().unwrap() > 10, "{srv}");
    // Duplicates and out-of-order requests went to the engine.
    assert!(
        srv["xdp_punt_reasons"]["psn"].as_u64().unwrap() > 0,
        "{srv}"
    );
}

#[test]
fn relay_passes_other_traffic_untouched_and_counts_roce() {
    let _g = serial();
    let mut lab = Lab::with_relay(1500);
    // 100 % RoCE loss: ping and TCP (the soak's side channel) still pass.
    lab.start_relay(&["--loss", "1.0"]);
    let out = lab.exec(
        0,
        "ping",
        &["-c", "3", "-i", "0.2", "-W", "2", &lab.addr[1]],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let r = lab.stop_relay();
    assert_eq!(r["a_to_b"]["impaired_class"], 0, "{r}");
    assert!(r["a_to_b"]["tx"].as_u64().unwrap() >= 3, "{r}");
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// Sum of the named counters of `stats` (XDP, data path and kernel socket
/// counters) between two snapshots.
fn delta(before: &Value, after: &Value, section: &str, keys: &[&str]) -> u64 {
    keys.iter()
        .map(|k| {
            let get = |v: &Value| -> u64 {
                match section {
                    "xsk" => v["xsk"].as_array().unwrap().iter().map(|x| u(&x[*k])).sum(),
                    s => u(&v[s][*k]),
                }
            };
            get(after) - get(before)
        })
        .sum()
}

fn checksum(lab: &Lab, host: usize, key: u64, len: u64) -> u32 {
    crc32fast::hash(&lab.mr_bytes(host, key, 0, len))
}

#[test]
fn hostile_flood_is_counted_touches_nothing_and_valid_traffic_flows() {
    hostile_flood(false);
}

/// The same flood with the XDP responder on: B's MRs are in the
/// MR pool and its QPs lent to XDP. Every count is as on the user path,
/// no byte of the victim's or another MR changes, XDP placed nothing of
/// the flood, and it placed the valid WRITEs.
#[test]
fn hostile_flood_with_the_xdp_responder_touches_nothing() {
    hostile_flood(true);
}

fn hostile_flood(pool: bool) {
    let _g = serial();
    let mut lab = Lab::new(1500);
    lab.up(0, &[]);
    if pool {
        lab.up(1, &["--firewall", "--no-selective-repeat"]);
    } else {
        lab.up(1, &["--firewall"]);
    }
    let mr_b = |lab: &Lab| -> (u64, u64, u64) {
        let mut args = vec!["mr", "reg", "--len", "65536", "--access", "all"];
        if pool {
            args.push("--pool");
        }
        let v = lab.ok(1, &args);
        let k = |f: &str| v[f].as_u64().unwrap();
        (k("addr"), k("lkey"), k("rkey"))
    };
    let (_, a_l, _) = lab.mr(0, 1 << 16, "all");
    let (b_addr, b_l, b_r) = mr_b(&lab);
    let (v_addr, v_l, v_r) = mr_b(&lab);
    let (_, p_l, _) = mr_b(&lab);
    let (qa, _qb) = lab.connect();
    // The victim: a QP on B connected to a QP on A that nobody runs; the
    // attacker on A knows its QPN, PSN, rkey and address.
    let qv = lab.ok(1, &["qp", "create"])["qpn"].as_u64().unwrap();
    let mac_a = rdma_user::io::hostnet::fmt_mac(&lab.mac(0));
    lab.ok(
        1,
        &[
            "qp",
            "connect",
            &qv.to_string(),
            "--remote-ip",
            &lab.addr[0],
            "--remote-qpn",
            "0x99",
            "--remote-psn",
            "1000",
            "--remote-mac",
            &mac_a,
        ],
    );
    let pattern: Vec<u8> = (0..65536u32).map(|i| (i * 7 + 3) as u8).collect();
    for key in [v_l, p_l] {
        for off in (0..65536).step_by(8192) {
            lab.ok(
                1,
                &[
                    "mr",
                    "write",
                    &key.to_string(),
                    "--offset",
                    &off.to_string(),
                    "--data",
                    &rdma_user::control::proto::hex(&pattern[off..off + 8192]),
                ],
            );
        }
    }
    let sums = [checksum(&lab, 1, v_l, 65536), checksum(&lab, 1, p_l, 65536)];
    let before = lab.ok(1, &["stats"]);

    const N: u64 = 1_000_000;
    let mac_b = rdma_user::io::hostnet::fmt_mac(&lab.mac(1));
    let mut flood = Reap(Some(lab.spawn(
        0,
        &[
            "hostile",
            "--dev",
            &lab.dev[0],
            "--dst-ip",
            &lab.addr[1],
            "--dst-mac",
            &mac_b,
            "--src-ip",
            &lab.addr[0],
            "--peer-qpn",
            "153",
            "--qpn",
            &qv.to_string(),
            "--epsn",
            "1000",
            "--rkey",
            &v_r.to_string(),
            "--va",
            &v_addr.to_string(),
            "--mr-len",
            "65536",
            "--count",
            &N.to_string(),
            "--seed",
            "3",
        ],
    )));
    // Valid WRITE + READ-back rounds on the other QP while the flood runs.
    let mut rounds = 0u32;
    let mut during = 0u32;
    loop {
        let running = flood.0.as_mut().unwrap().try_wait().unwrap().is_none();
        if !running && rounds >= 5 {
            break;
        }
        during += running as u32;
        let data: Vec<u8> = (0..3000u32).map(|i| (i as u8) ^ (rounds as u8)).collect();
        let off = (rounds as u64 % 16) * 4096;
        let w = lab.post_ok(
            "write",
            qa,
            a_l,
            &["--data", &rdma_user::control::proto::hex(&data)],
            b_addr + off,
            b_r,
        );
        assert_eq!(w["wc"]["status"], "success", "{w}");
        let r = lab.post_ok(
            "read",
            qa,
            a_l,
            &["--offset", "32768", "--len", "3000"],
            b_addr + off,
            b_r,
        );
        assert_eq!(r["wc"]["status"], "success", "{r}");
        assert_eq!(lab.mr_bytes(0, a_l, 32768, 3000), data, "round {rounds}");
        assert_eq!(lab.mr_bytes(1, b_l, off, 3000), data, "round {rounds}");
        rounds += 1;
    }
    let out = wait_timeout(flood.0.take().unwrap(), Duration::from_secs(120));
    assert!(
        out.status.success(),
        "flood: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sent: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(u(&sent["sent"]), N);
    assert!(
        during >= 2,
        "valid traffic must run during the flood ({during} rounds)"
    );
    std::thread::sleep(Duration::from_millis(500));
    let after = lab.ok(1, &["stats"]);

    // Classes the XDP firewall drops are counted there one for one.
    let cls = |c: &str| u(&sent["by_class"][c]);
    let x = |k: &str| delta(&before, &after, "xdp", &[k]);
    assert_eq!(x("drop_truncated"), cls("truncated"), "{after}");
    assert_eq!(x("drop_unknown_opcode"), cls("unknown_opcode"), "{after}");
    assert_eq!(x("drop_qpn_not_live"), cls("unknown_qpn"), "{after}");
    assert_eq!(x("drop_spoofed_source"), cls("spoofed_source"), "{after}");
    // Everything else reached userspace: counted by the parser or by the
    // victim QP, or dropped by the kernel for lack of room (counted too).
    let xdp_drops = delta(
        &before,
        &after,
        "xdp",
        &[
            "drop_truncated",
            "drop_bad_tver",
            "drop_unknown_opcode",
            "drop_qpn_not_live",
            "drop_spoofed_source",
        ],
    );
    let parser = delta(
        &before,
        &after,
        "datapath",
        &[
            "rx_truncated",
            "rx_not_ip",
            "rx_not_udp",
            "rx_not_roce",
            "rx_fragment",
            "rx_bad_ip_header",
            "rx_bad_length",
            "rx_bad_tver",
            "rx_unknown_opcode",
            "rx_bad_pad",
            "rx_bad_icrc",
            "rx_bad_ip_checksum",
            "rx_unknown_qpn",
            "rx_wrong_source",
        ],
    );
    let kernel = delta(
        &before,
        &after,
        "xsk",
        &[
            "kernel_rx_dropped",
            "kernel_rx_ring_full",
            "kernel_rx_fill_ring_empty",
        ],
    );
    let qps = lab.ok(1, &["qp", "list"]);
    let victim = qps["qps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| u(&q["qpn"]) == qv)
        .unwrap()["stats"]
        .clone();
    let v_rx = u(&victim["rx"]);
    let v_reasons: u64 = [
        "errors",
        "dropped",
        "out_of_sequence",
        "duplicates",
        "bad_pkey",
    ]
    .iter()
    .map(|k| u(&victim[*k]))
    .sum();
    assert_eq!(
        v_rx, v_reasons,
        "every packet at the victim has a reason: {victim}"
    );
    let counted = xdp_drops + parser + v_rx;
    eprintln!(
        "flood: {N} sent in {:.2} s; XDP dropped {xdp_drops}, parser {parser}, victim QP {v_rx} ({victim}), kernel socket drops {kernel}; {rounds} valid rounds ({during} during the flood)",
        sent["seconds"].as_f64().unwrap()
    );
    assert!(
        counted <= N && counted + kernel >= N,
        "counted {counted} + kernel {kernel} vs {N}: {after}"
    );
    assert!(delta(&before, &after, "datapath", &["rx_bad_icrc"]) <= cls("bad_icrc"));
    // No byte of the victim MR or of an unrelated MR changed.
    assert_eq!(checksum(&lab, 1, v_l, 65536), sums[0]);
    assert_eq!(checksum(&lab, 1, p_l, 65536), sums[1]);
    // The daemon is up and the valid QP still in RTS.
    let qa_state = lab.ok(0, &["qp", "list"])["qps"][0]["state"].clone();
    assert_eq!(qa_state, "RTS");
    if pool {
        let xr = |q: u64| {
            qps["qps"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| u(&x["qpn"]) == q)
                .unwrap()["xdp_responder"]
                .clone()
        };
        let (valid, victim) = (xr(_qb), xr(qv));
        eprintln!("XDP responder: valid QP {valid}; victim {victim}");
        assert_eq!(u(&victim["placed"]), 0, "{victim}");
        assert!(u(&valid["placed"]) > 0, "{valid}");
    }
}

#[test]
fn umem_exhaustion_applies_backpressure_and_loses_nothing() {
    let _g = serial();
    let mut lab = Lab::new(1500);
    // 64 UMEM chunks per socket, shared by RX and TX: a 1 MiB message is
    // 1024 packets, 16 times what either side can hold at once.
    lab.up(0, &["--umem-frames", "64"]);
    lab.up(1, &["--umem-frames", "64"]);
    const LEN: usize = 1 << 20;
    let (_, a_l, _) = lab.mr(0, 2 * LEN, "all");
    let (b_addr, b_l, b_r) = lab.mr(1, LEN, "all");
    let (qa, _) = lab.connect();
    let data: Vec<u8> = (0..LEN as u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let file = std::env::temp_dir().join(format!("rdma-umem-{}.bin", std::process::id()));
    std::fs::write(&file, &data).unwrap();
    lab.ok(
        0,
        &[
            "mr",
            "write",
            &a_l.to_string(),
            "--file",
            file.to_str().unwrap(),
        ],
    );
    let _ = std::fs::remove_file(&file);
    let before = [lab.ok(0, &["stats"]), lab.ok(1, &["stats"])];
    for round in 0..3 {
        let w = lab.post_ok(
            "write",
            qa,
            a_l,
            &["--len", &LEN.to_string(), "--timeout-ms", "30000"],
            b_addr,
            b_r,
        );
        assert_eq!(w["wc"]["status"], "success", "round {round}: {w}");
        let r = lab.post_ok(
            "read",
            qa,
            a_l,
            &[
                "--offset",
                &LEN.to_string(),
                "--len",
                &LEN.to_string(),
                "--timeout-ms",
                "30000",
            ],
            b_addr,
            b_r,
        );
        assert_eq!(r["wc"]["status"], "success", "round {round}: {r}");
    }
    assert!(
        lab.mr_bytes(1, b_l, 0, LEN as u64) == data,
        "B's MR differs from what A wrote"
    );
    assert!(
        lab.mr_bytes(0, a_l, LEN as u64, LEN as u64) == data,
        "what A read back differs"
    );
    let after = [lab.ok(0, &["stats"]), lab.ok(1, &["stats"])];
    // The pressure was real: the kernel ran out of fill-ring chunks or RX
    // ring room somewhere, or TX waited for free chunks.
    let pressure: u64 = (0..2)
        .map(|i| {
            delta(
                &before[i],
                &after[i],
                "xsk",
                &[
                    "kernel_rx_dropped",
                    "kernel_rx_ring_full",
                    "kernel_rx_fill_ring_empty",
                ],
            ) + delta(&before[i], &after[i], "datapath", &["tx_ring_full"])
        })
        .sum();
    eprintln!(
        "umem: pressure events {pressure}; A {}; B {}",
        after[0]["xsk"], after[1]["xsk"]
    );
    assert!(pressure > 0, "no backpressure seen: {after:?}");
}
