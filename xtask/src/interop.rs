//! `cargo xtask interop`: our stack against Linux rxe in a VM, perftest and
//! rdma-core tools in both roles, captures checked by tshark, rxe counters read.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use crate::{lab::*, root, setup::*};

pub(crate) fn rxe_peer() -> Result<PathBuf> {
    let p = root()
        .parent()
        .map(|d| d.join("shared/rxe-peer/rxe-peer.sh"))
        .ok_or_else(|| anyhow!("no parent directory"))?;
    if !p.exists() {
        bail!(
            "{} is missing: the rxe peer VM scripts live in ../shared/rxe-peer",
            p.display()
        );
    }
    Ok(p)
}

pub(crate) struct Vm {
    pub(crate) script: PathBuf,
    pub(crate) keep: bool,
}

impl Drop for Vm {
    fn drop(&mut self) {
        if !self.keep {
            let _ = Command::new(&self.script)
                .arg("stop")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// One interop case: our side in the namespace, rxe's tool in the VM.
pub(crate) struct Case {
    pub(crate) name: String,
    /// rxe's command line in the VM.
    pub(crate) rxe: String,
    /// Our arguments to `rdma`.
    pub(crate) ours: Vec<String>,
    /// true: rxe is the server (started first, in the background).
    pub(crate) rxe_server: bool,
    /// What our output must contain.
    pub(crate) ours_ok: String,
    /// What rxe's output must contain.
    pub(crate) rxe_ok: String,
    /// perftest's result line: (#bytes, #iterations). Our line must show it
    /// unless we are the passive side of read/atomic_lat (which prints none,
    /// as perftest's server), and rxe's too where rxe prints one.
    pub(crate) result: Option<(usize, u32)>,
    pub(crate) ours_print_result: bool,
}

impl Case {
    /// Extra perftest flags for rxe's side, shown in the case's name.
    fn with_rxe_flags(self, flags: &str) -> Case {
        self.with_flags(flags, "")
    }

    /// Extra flags for rxe's command and for ours; rxe's are shown in the
    /// case's name.
    fn with_flags(mut self, rxe: &str, ours: &str) -> Case {
        self.rxe = format!("{} {rxe}", self.rxe);
        self.ours.extend(ours.split_whitespace().map(String::from));
        self.name = match self.name.split_once(',') {
            Some((a, b)) => format!("{a} {rxe},{b}"),
            None => format!("{} {rxe}", self.name),
        };
        self
    }
}

/// The #iterations of the result lines in `out` for `bytes`: lines whose
/// first two fields are the byte count and an integer.
pub(crate) fn result_iters(out: &str, bytes: usize) -> Vec<u64> {
    out.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            (f.next()? == bytes.to_string()).then_some(())?;
            f.next()?.parse().ok()
        })
        .collect()
}

/// Both sides must report the iteration count that was asked for.
pub(crate) fn check_result_lines(c: &Case, ours: &str, rxe: &str) -> Result<()> {
    let Some((bytes, n)) = c.result else {
        return Ok(());
    };
    let o = result_iters(ours, bytes);
    let r = result_iters(rxe, bytes);
    if (o.is_empty() && c.ours_print_result) || o.iter().any(|&i| i != n as u64) {
        bail!("ours: result line for {bytes} B shows iterations {o:?}, want {n}");
    }
    if r.iter().any(|&i| i != n as u64) {
        bail!("rxe: result line for {bytes} B shows iterations {r:?}, want {n}");
    }
    Ok(())
}

pub(crate) fn interop(quick: bool, keep_vm: bool, only: Option<&str>) -> Result<()> {
    let t0 = Instant::now();
    let script = rxe_peer()?;
    let bin = build(true)?;
    sh(Command::new(&script).arg("setup").stdout(Stdio::null())).context("rxe-peer setup")?;
    let _ = Command::new(&script)
        .arg("stop")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    sh(Command::new(&script)
        .args(["start", "a"])
        .stdout(Stdio::null()))
    .context("boot the rxe VM")?;
    let _vm = Vm {
        script: script.clone(),
        keep: keep_vm,
    };
    let boot = t0.elapsed();
    let b = bin.to_string_lossy().to_string();
    let mut cases = Vec::new();
    let sizes: &[usize] = if quick {
        &[64, 4096]
    } else {
        &[64, 4096, 65536]
    };
    for &s in sizes {
        for rxe_server in [true, false] {
            cases.push(pingpong_case("", s, 50, rxe_server, false));
        }
    }
    if !quick {
        for rxe_server in [true, false] {
            cases.push(pingpong_case("IPv6 GID: ", 4096, 50, rxe_server, true));
        }
    }
    let perf: &[(&str, &str, &[usize])] = if quick {
        &[
            ("write_lat", "write-lat", &[2]),
            ("send_lat", "send-lat", &[2]),
            ("read_bw", "read-bw", &[65536]),
        ]
    } else {
        &[
            ("write_lat", "write-lat", &[2, 5000, 1 << 20]),
            ("send_lat", "send-lat", &[2, 5000, 1 << 20]),
            ("read_lat", "read-lat", &[2, 5000, 1 << 20]),
            ("atomic_lat", "atomic-lat", &[8]),
            ("write_bw", "write-bw", &[2, 5000, 1 << 20]),
            ("read_bw", "read-bw", &[2, 5000, 1 << 20]),
            ("send_bw", "send-bw", &[2, 5000]),
        ]
    };
    // perftest servers in the VM against our bench client, then (full
    // matrix) perftest clients in the VM against our bench server.
    let roles: &[bool] = if quick { &[true] } else { &[true, false] };
    for &rxe_server in roles {
        for (tool, ours, sizes) in perf {
            for &s in *sizes {
                let n = if s >= 1 << 20 { 5 } else { 20 };
                let size = (*tool != "atomic_lat").then_some(s);
                let c = perf_case("", tool, ours, size, n, rxe_server);
                // rxe never stops its retransmit timer once everything is
                // ACKed (rxe_comp.c: "some timeouts are spurious since we do
                // not reset the timer"): it fires one timeout after the last
                // ACK of a message and retries the next message if that one
                // is in flight by then. A 1 MiB ping-pong into the emulated
                // VM takes about 70 ms a message, right at perftest's
                // default 67 ms (-u 14), so rxe would retry without any
                // loss; a longer timeout keeps its counters meaningful.
                cases.push(if s >= 1 << 20 && tool.ends_with("_lat") {
                    c.with_rxe_flags("-u 18")
                } else {
                    c
                });
            }
        }
    }
    if !quick {
        // Several QPs (-q 2), both roles.
        for (tool, ours, size, rxe_server) in [
            ("write_bw", "write-bw", 5000usize, true),
            ("read_bw", "read-bw", 5000, true),
            ("send_bw", "send-bw", 5000, true),
            ("write_bw", "write-bw", 5000, false),
        ] {
            let mut c =
                perf_case("", tool, ours, Some(size), 20, rxe_server).with_flags("-q 2", "-q 2");
            // perftest counts the iterations of all QPs together.
            c.result = Some((size, 40));
            cases.push(c);
        }
        // IPv6 GIDs (fd99::, rxe's GID index 2), both roles: as the client
        // we are told our GID address, as the server we take the family of
        // the client's GID.
        for (tool, ours, rxe_server) in [
            ("write_bw", "write-bw", true),
            ("read_lat", "read-lat", true),
            ("send_lat", "send-lat", false),
            ("write_bw", "write-bw", false),
        ] {
            let mut c = perf_case("IPv6 GID: ", tool, ours, Some(5000), 20, rxe_server);
            c.rxe = c.rxe.replace("-x 1", "-x 2");
            if rxe_server {
                c.ours.extend(["--local-ip", "fd99::1"].map(String::from));
            }
            cases.push(c);
        }
        // All sizes, 2 B to 8 MiB; perftest's server prints the last.
        let mut c = perf_case("", "write_bw", "write-bw", None, 5, true).with_flags("-a", "-a");
        c.result = Some((1 << 23, 5));
        cases.push(c);
    }
    let mut results = Vec::new();
    // rxe's error counters are read around every clean case: a case that
    // moves one fails the check below, unless the host dropped frames on
    // their way into the emulated VM meanwhile (the guest falls behind line
    // rate), which is reported as the explanation.
    let counters_before = rxe_counters(&script);
    let mut prev = counters_before.as_ref().ok().cloned();
    let mut counters_unread = prev.is_none();
    let mut explained: Vec<String> = Vec::new();
    let mut unexplained: Vec<String> = Vec::new();
    let get = |m: &Counters, k: &str| m.get(k).copied().unwrap_or(0);
    for c in cases
        .iter()
        .filter(|c| only.is_none_or(|o| c.name.contains(o)))
    {
        let tap0 = tap_tx_dropped();
        let start = Instant::now();
        let r = run_case(&script, &b, c);
        let secs = start.elapsed().as_secs_f64();
        let now = rxe_counters(&script).ok();
        let moved: Vec<String> = match (&prev, &now) {
            (Some(p), Some(n)) => RXE_ERROR_COUNTERS
                .iter()
                .map(|k| (k, get(n, k) - get(p, k)))
                .filter(|(_, d)| *d != 0)
                .map(|(k, d)| format!("{k} +{d}"))
                .collect(),
            _ => {
                counters_unread = true;
                Vec::new()
            }
        };
        prev = now;
        let tap = tap_tx_dropped() - tap0;
        let note = if moved.is_empty() {
            String::new()
        } else {
            let what = format!("{} ({})", c.name, moved.join(", "));
            if tap > 0 {
                explained.push(format!("{what}, {tap} frames dropped into the VM"));
            } else {
                unexplained.push(what);
            }
            format!(
                "  [rxe counters: {}; host dropped {tap} frames into the VM]",
                moved.join(", ")
            )
        };
        match &r {
            Ok(()) => println!("PASS  {:<55} {:>6.1} s{note}", c.name, secs),
            Err(e) => println!("FAIL  {:<55} {:>6.1} s  {e:#}{note}", c.name, secs),
        }
        results.push(r.is_ok());
    }
    match (&counters_before, &prev) {
        (Ok(b), Some(a)) if !counters_unread => {
            if !explained.is_empty() {
                println!(
                    "note  rxe counters moved where the host dropped frames into the VM: {}",
                    explained.join("; ")
                );
            }
            let ok = unexplained.is_empty();
            println!(
                "{}  {:<55} {} packets sent, {} received by rxe{}",
                if ok { "PASS" } else { "FAIL" },
                "rxe error counters unchanged by the clean cases",
                get(a, "sent_pkts") - get(b, "sent_pkts"),
                get(a, "rcvd_pkts") - get(b, "rcvd_pkts"),
                if ok {
                    String::new()
                } else {
                    format!(": {}", unexplained.join("; "))
                }
            );
            results.push(ok);
        }
        _ => {
            println!(
                "FAIL  {:<55} {:?}",
                "read rxe's counters",
                counters_before.as_ref().err()
            );
            results.push(false);
        }
    }
    // Loss recovery across implementations: the impairment relay drops 1 %
    // of RoCE frames in both directions between us and rxe.
    let loss_cases = loss_cases(quick);
    let selected: Vec<&Case> = loss_cases
        .iter()
        .filter(|c| only.is_none_or(|o| c.name.contains(o)))
        .collect();
    if !selected.is_empty() {
        let relay = RxeRelay::insert(&b, "--loss 0.01 --seed 7");
        match relay {
            Err(e) => {
                println!("FAIL  {:<55} {e:#}", "insert the impairment relay");
                results.push(false);
            }
            Ok(relay) => {
                for c in selected {
                    let start = Instant::now();
                    let r = run_case(&script, &b, c);
                    let secs = start.elapsed().as_secs_f64();
                    match &r {
                        Ok(()) => println!("PASS  {:<55} {:>6.1} s", c.name, secs),
                        Err(e) => println!("FAIL  {:<55} {:>6.1} s  {e:#}", c.name, secs),
                    }
                    results.push(r.is_ok());
                }
                let rep = relay.remove();
                let d = |k: &str| rep[k]["dropped"].as_u64().unwrap_or(0);
                let ok = d("a_to_b") > 0 && d("b_to_a") > 0;
                println!(
                    "{}  {:<55} we->rxe {} of {} dropped, rxe->we {} of {}",
                    if ok { "PASS" } else { "FAIL" },
                    "relay dropped frames both ways (1 %)",
                    d("a_to_b"),
                    rep["a_to_b"]["impaired_class"],
                    d("b_to_a"),
                    rep["b_to_a"]["impaired_class"]
                );
                results.push(ok);
            }
        }
    }
    // Our packets must dissect without errors in Wireshark's InfiniBand
    // dissector: capture one more exchange and ask tshark for malformed or
    // error-level expert items.
    let pcap = std::env::temp_dir().join("rdma-interop.pcap");
    let _ = sh(Command::new(&script)
        .args(["capture", "start"])
        .arg(&pcap)
        .args(["udp", "port", "4791"])
        .stdout(Stdio::null()));
    std::thread::sleep(Duration::from_millis(800));
    let check = run_case(
        &script,
        &b,
        &pingpong_case("capture: ", 4096, 20, true, false),
    );
    std::thread::sleep(Duration::from_millis(500));
    let _ = sh(Command::new(&script)
        .args(["capture", "stop"])
        .stdout(Stdio::null()));
    let tshark = check
        .and_then(|_| tshark_clean(&pcap))
        .and_then(|n| icrc_clean(&b, &pcap).map(|_| n));
    match &tshark {
        Ok(n) => println!(
            "PASS  {:<55} {n} packets from us, 0 malformed/errors",
            "tshark dissects our packets cleanly, ICRCs good"
        ),
        Err(e) => println!(
            "FAIL  {:<55} {e:#}",
            "tshark dissects our packets cleanly, ICRCs good"
        ),
    }
    results.push(tshark.is_ok());
    let passed = results.iter().filter(|&&x| x).count();
    println!(
        "interop: {} passed, {} failed ({} cases; VM boot {:.0} s, total {:.0} s)",
        passed,
        results.len() - passed,
        results.len(),
        boot.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    if passed != results.len() {
        bail!("interop failures");
    }
    Ok(())
}

/// rxe's hw counters that a clean exchange must not move (rxe has no ICRC
/// counter: it drops such packets silently; our ICRCs are checked on the
/// capture instead).
pub(crate) const RXE_ERROR_COUNTERS: [&str; 9] = [
    "duplicate_request",
    "out_of_seq_request",
    "rcvd_seq_err",
    "rcvd_rnr_err",
    "retry_exceeded_err",
    "retry_rnr_exceeded_err",
    "completer_retry_err",
    "send_err",
    "link_downed",
];

/// Frames the host dropped on their way into the VM (its tap's TX queue
/// overflows when the emulated guest falls behind).
pub(crate) fn tap_tx_dropped() -> i64 {
    Command::new("ip")
        .args(["-n", RXE_NS, "-s", "-j", "link", "show", "rxetap-a"])
        .output()
        .ok()
        .and_then(|o| serde_json::from_slice::<Value>(&o.stdout).ok())
        .and_then(|v| v[0]["stats64"]["tx"]["dropped"].as_i64())
        .unwrap_or(0)
}

pub(crate) type Counters = std::collections::HashMap<String, i64>;

/// `rdma statistic show link rxe0/1` in the VM, as name -> value.
pub(crate) fn rxe_counters(script: &Path) -> Result<Counters> {
    let out = Command::new(script)
        .args([
            "exec",
            "-v",
            "a",
            "--",
            "rdma",
            "statistic",
            "show",
            "link",
            "rxe0/1",
        ])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let words: Vec<&str> = text.split_whitespace().skip(2).collect();
    let m: Counters = words
        .chunks(2)
        .filter_map(|p| Some((p.first()?.to_string(), p.get(1)?.parse().ok()?)))
        .collect();
    if m.is_empty() {
        bail!("no counters in: {}", text.trim());
    }
    Ok(m)
}

/// ibv_rc_pingpong with its data check against our `rdma-xdp pingpong`, over
/// the IPv4 GIDs or the IPv6 ones.
pub(crate) fn pingpong_case(prefix: &str, s: usize, n: u32, rxe_server: bool, v6: bool) -> Case {
    let role = if rxe_server { "server" } else { "client" };
    let (gid, our_ip, local) = if v6 {
        // rc_pingpong's server listens on IPv4 only: TCP over IPv4, RoCE
        // over the IPv6 GIDs.
        (2, "fd99::1", " --local-ip fd99::1")
    } else {
        (1, "10.99.0.1", "")
    };
    Case {
        name: format!("{prefix}ibv_rc_pingpong -s {s} -n {n} -c, rxe {role}"),
        rxe: format!(
            "ibv_rc_pingpong -d rxe0 -g {gid} -s {s} -n {n} -c{}",
            if rxe_server {
                String::new()
            } else {
                format!(" {our_ip}")
            }
        ),
        ours: format!(
            "pingpong{} --dev rxehost0 -s {s} -n {n} -c{local}",
            if rxe_server { " 10.99.0.2" } else { "" }
        )
        .split_whitespace()
        .map(String::from)
        .collect(),
        rxe_server,
        ours_ok: format!("{n} iters in"),
        rxe_ok: format!("{n} iters in"),
        result: None,
        ours_print_result: false,
    }
}

/// A perftest tool in the VM against our `rdma-xdp bench`: rxe as the server
/// (our client must print its result) or as the client (both must).
pub(crate) fn perf_case(
    prefix: &str,
    tool: &str,
    ours: &str,
    size: Option<usize>,
    n: u32,
    rxe_server: bool,
) -> Case {
    let size_arg = size.map(|s| format!(" -s {s}")).unwrap_or_default();
    let lat = tool.contains("lat");
    let (role, server_arg, our_server) = if rxe_server {
        ("server", "", " 10.99.0.2")
    } else {
        ("client", " 10.99.0.1", "")
    };
    Case {
        name: format!("{prefix}ib_{tool}{size_arg} -n {n}, rxe {role}"),
        rxe: format!("ib_{tool} -d rxe0 -x 1{size_arg} -n {n}{server_arg}"),
        ours: format!("bench {ours}{our_server} --dev rxehost0{size_arg} -n {n} --peer-timeout 60")
            .split_whitespace()
            .map(String::from)
            .collect(),
        rxe_server,
        ours_ok: if lat { "[usec]" } else { "[Gb/sec]" }.into(),
        rxe_ok: match (rxe_server, lat) {
            (true, _) => "",
            (false, true) => "usec",
            (false, false) => "MsgRate",
        }
        .into(),
        result: Some((size.unwrap_or(8), n)),
        ours_print_result: rxe_server || !matches!(tool, "read_lat" | "atomic_lat"),
    }
}

/// Interop cases that run with 1 % loss between us and rxe: data checked
/// by rc_pingpong on both sides, completion counts by perftest.
pub(crate) fn loss_cases(quick: bool) -> Vec<Case> {
    let mut v = Vec::new();
    let sizes: &[usize] = if quick { &[4096] } else { &[4096, 65536] };
    for &s in sizes {
        for rxe_server in [true, false] {
            v.push(pingpong_case("1% loss: ", s, 100, rxe_server, false));
        }
    }
    if !quick {
        v.push(perf_case(
            "1% loss: ",
            "read_bw",
            "read-bw",
            Some(65536),
            50,
            true,
        ));
        v.push(perf_case(
            "1% loss: ",
            "write_bw",
            "write-bw",
            Some(65536),
            50,
            false,
        ));
    }
    v
}

/// The impairment relay spliced between our host and the rxe bridge:
/// rxehost0's veth peer moves into a middle namespace, and a new veth pair
/// joins that namespace to the bridge. Removed (and the original wiring
/// restored) on `remove` or drop.
pub(crate) struct RxeRelay {
    pub(crate) child: Option<Running>,
    pub(crate) stats: PathBuf,
}

pub(crate) const RXE_NS: &str = "rxepeer";
pub(crate) const RELAY_NS: &str = "rxerelay";

impl RxeRelay {
    fn insert(bin: &str, flags: &str) -> Result<RxeRelay> {
        netns_del(RELAY_NS);
        let stats = std::env::temp_dir().join("rdma-rxe-relay.json");
        let _ = std::fs::remove_file(&stats);
        let mut r = RxeRelay { child: None, stats };
        ip(&["netns", "add", RELAY_NS])?;
        ip(&["-n", RXE_NS, "link", "set", "rxehost0p", "nomaster"])?;
        ip(&["-n", RXE_NS, "link", "set", "rxehost0p", "netns", RELAY_NS])?;
        ip(&[
            "-n", RXE_NS, "link", "add", "rxrly1", "type", "veth", "peer", "name", "rxrly0",
            "netns", RELAY_NS,
        ])?;
        ip(&[
            "-n", RXE_NS, "link", "set", "rxrly1", "master", "rxebr0", "up",
        ])?;
        ip(&["-n", RELAY_NS, "link", "set", "rxehost0p", "up"])?;
        ip(&["-n", RELAY_NS, "link", "set", "rxrly0", "up"])?;
        r.child = Some(Running(
            Command::new("ip")
                .args(["netns", "exec", RELAY_NS, bin, "--json", "relay"])
                .args(["--a", "rxehost0p", "--b", "rxrly0", "--stats-file"])
                .arg(&r.stats)
                .args(flags.split_whitespace())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?,
        ));
        std::thread::sleep(Duration::from_millis(300));
        Ok(r)
    }

    /// Stops the relay, restores the wiring, returns the relay's counters.
    fn remove(mut self) -> Value {
        self.restore();
        read_json(&self.stats).unwrap_or(Value::Null)
    }

    fn restore(&mut self) {
        // Stopping the relay makes it write its counters.
        self.child = None;
        let q = |args: &[&str]| {
            let _ = Command::new("ip").args(args).stderr(Stdio::null()).status();
        };
        q(&["-n", RELAY_NS, "link", "set", "rxehost0p", "netns", RXE_NS]);
        q(&[
            "-n",
            RXE_NS,
            "link",
            "set",
            "rxehost0p",
            "master",
            "rxebr0",
            "up",
        ]);
        q(&["-n", RXE_NS, "link", "del", "rxrly1"]);
        netns_del(RELAY_NS);
    }
}

impl Drop for RxeRelay {
    fn drop(&mut self) {
        // Also after a half-done insert; every step tolerates "already so".
        self.restore();
    }
}

pub(crate) fn run_case(script: &Path, bin: &str, c: &Case) -> Result<()> {
    let ns = |args: &[String]| -> Result<std::process::Output> {
        Ok(Command::new("timeout")
            .arg("150")
            .arg(script)
            .arg("ns")
            .arg(bin)
            .args(args)
            .output()?)
    };
    if c.rxe_server {
        let out = Command::new(script)
            .args(["bg", "-v", "a", "--"])
            .args(c.rxe.split_whitespace())
            .output()?;
        let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let (pid, log) = line
            .split_once(' ')
            .ok_or_else(|| anyhow!("rxe-peer bg: {line}"))?;
        std::thread::sleep(Duration::from_secs(2));
        let ours = ns(&c.ours)?;
        let rxe = Command::new(script)
            .args(["wait", "-v", "a", "-t", "120", pid, log])
            .output()?;
        let (o, r) = (
            String::from_utf8_lossy(&ours.stdout),
            String::from_utf8_lossy(&rxe.stdout),
        );
        if !ours.status.success() || !o.contains(&c.ours_ok) {
            let _ = Command::new(script)
                .args(["exec", "-v", "a", "--", &format!("kill {pid}")])
                .output();
            bail!("ours: {}", tail(&ours));
        }
        if !rxe.status.success() || !r.contains(&c.rxe_ok) {
            bail!("rxe: {}", tail(&rxe));
        }
        check_result_lines(c, &o, &r)?;
    } else {
        let mut child = Command::new("timeout")
            .arg("150")
            .arg(script)
            .arg("ns")
            .arg(bin)
            .args(&c.ours)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        std::thread::sleep(Duration::from_millis(1500));
        let rxe = Command::new(script)
            .args(["exec", "-v", "a", "-t", "120", "--"])
            .args(c.rxe.split_whitespace())
            .output()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if child.try_wait()?.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let ours = child.wait_with_output()?;
        let (o, r) = (
            String::from_utf8_lossy(&ours.stdout),
            String::from_utf8_lossy(&rxe.stdout),
        );
        if !rxe.status.success() || !r.contains(&c.rxe_ok) {
            bail!("rxe: {}", tail(&rxe));
        }
        if !ours.status.success() || !o.contains(&c.ours_ok) {
            bail!("ours: {}", tail(&ours));
        }
        check_result_lines(c, &o, &r)?;
    }
    Ok(())
}

/// Counts our RoCEv2 packets in a capture and fails on any malformed packet
/// or error-level expert item tshark reports.
pub(crate) fn tshark_clean(pcap: &Path) -> Result<usize> {
    let count = |filter: &str| -> Result<usize> {
        let out = Command::new("tshark")
            .arg("-r")
            .arg(pcap)
            .args(["-Y", filter])
            .stderr(Stdio::null())
            .output()
            .context("tshark is not installed: apt-get install tshark")?;
        Ok(String::from_utf8_lossy(&out.stdout).lines().count())
    };
    let ours = count("ip.src == 10.99.0.1 && infiniband")?;
    if ours == 0 {
        bail!("no packets from us in the capture");
    }
    let bad = count("ip.src == 10.99.0.1 && (_ws.malformed || _ws.expert.severity >= error)")?;
    if bad > 0 {
        bail!("{bad} of our {ours} packets are malformed or carry errors in tshark");
    }
    Ok(ours)
}

/// Every RoCE packet of the capture (ours and rxe's) has a good ICRC.
pub(crate) fn icrc_clean(bin: &str, pcap: &Path) -> Result<()> {
    let out = Command::new(bin).arg("decode").arg(pcap).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let bad = text.lines().filter(|l| l.contains("BAD")).count();
    if !out.status.success() || bad > 0 || text.lines().count() == 0 {
        bail!("{bad} packets with a bad ICRC in {}", pcap.display());
    }
    Ok(())
}

/// The last meaningful line a tool printed (stderr first: errors go there).
pub(crate) fn tail(o: &std::process::Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    let out = String::from_utf8_lossy(&o.stdout);
    err.lines()
        .chain(out.lines())
        .rfind(|l| !l.trim().is_empty() && !l.contains("[rxe-peer]"))
        .unwrap_or("failed")
        .trim()
        .to_string()
}

// ------------------------------------------------------------------ bench
