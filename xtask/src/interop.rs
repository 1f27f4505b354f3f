//! `cargo xtask interop`: our stack against Linux rxe in a VM, perftest and
//! rdma-core tools in both roles, captures checked by tshark, rxe counters read.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rxevm::net::{BRIDGE, HOST_PORT, NETNS};
use rxevm::{run_bounded, Bounded, GuestOutput, Lab, Settings, VmId};
use serde_json::Value;

use crate::{lab::*, setup::*};

/// How long our side and rxe's may take in one case before their process
/// groups are killed.
const OURS_TIMEOUT: Duration = Duration::from_secs(150);
const RXE_TIMEOUT: Duration = Duration::from_secs(120);

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
    /// The server serves until stopped (cmtime, qperf): it is stopped once
    /// the client is done, and only the client's output is judged, which
    /// must not mention a failure either (cmtime reports a failed step on
    /// stderr and still exits 0).
    pub(crate) server_serves_on: bool,
    /// Our side runs with the XDP responder (`RDMA_XDP_POOL=1`): the XDP
    /// program's counters, printed at close (`RDMA_XDP_STATS=1`), must
    /// show this one above zero: `xdp_acked` (WRITEs and atomics it
    /// answered itself) or `xdp_read` (READs it answered).
    pub(crate) ours_xdp: Option<&'static str>,
    /// The case runs with the impairment relay spliced in, holding CM MADs
    /// back this many microseconds (0: direct, no relay). See
    /// [`PERFTEST_MAD_DELAY_US`].
    pub(crate) mad_delay_us: u64,
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

/// What `cargo xtask interop` was asked for.
pub(crate) struct Options<'a> {
    pub(crate) quick: bool,
    pub(crate) keep_vm: bool,
    pub(crate) only: Option<&'a str>,
    /// Write one capture per case into this directory.
    pub(crate) capture_dir: Option<PathBuf>,
}

/// Boots the lab (one VM, or two for `rxe_pair`), with one line of
/// progress, and says how long the image and the boot took.
pub(crate) fn boot(vms: &[VmId], keep: bool) -> Result<(Lab, String)> {
    boot_with(Settings::from_env()?, vms, keep)
}

/// [`boot`] with settings of the caller's (another kernel, more queues).
pub(crate) fn boot_with(settings: Settings, vms: &[VmId], keep: bool) -> Result<(Lab, String)> {
    if !keep {
        on_ctrl_c_stop(&settings)?;
    }
    let t0 = Instant::now();
    let image = crate::vm::image(&settings)?;
    let prepared = t0.elapsed();
    let lab = Lab::start(&settings, &image, vms, keep).context("boot the rxe VMs")?;
    let boot = vms
        .iter()
        .map(|v| format!("{v} {:.1} s", lab.boot_time(*v).as_secs_f64()))
        .collect::<Vec<_>>()
        .join(", ");
    let what = format!(
        "image {} in {:.0} s, {} boot: {boot}",
        if image.rebuilt { "built" } else { "cached" },
        prepared.as_secs_f64(),
        lab.accel()
    );
    Ok((lab, what))
}

/// The settings whose VMs Ctrl-C stops: the latest lab booted. One process
/// may boot several labs in turn (`cargo xtask test` runs the rxe interop and
/// then the guest cases), and a process can install its handler only once.
static CTRL_C_LAB: std::sync::Mutex<Option<Settings>> = std::sync::Mutex::new(None);

/// Ctrl-C: the VMs (same process group) get it too, but our side runs in
/// process groups of its own and the namespace would stay.
fn on_ctrl_c_stop(settings: &Settings) -> Result<()> {
    let first = {
        let mut lab = CTRL_C_LAB.lock().unwrap_or_else(|e| e.into_inner());
        lab.replace(settings.clone()).is_none()
    };
    if first {
        ctrlc::set_handler(|| {
            eprintln!("interrupted: stopping the VMs and removing namespace {NETNS}");
            let lab = CTRL_C_LAB.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some(s) = lab {
                rxevm::interrupted(&s);
            }
            netns_del(RELAY_NS);
            std::process::exit(130);
        })
        .context("install the Ctrl-C handler")?;
    }
    Ok(())
}

/// One capture per case when asked for (removed again on drop).
pub(crate) fn case_capture(lab: &Lab, dir: Option<&Path>, name: &str) -> Option<rxevm::Capture> {
    let dir = dir?;
    let file: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    std::fs::create_dir_all(dir).ok()?;
    lab.capture(&dir.join(format!("{file}.pcap")), &[]).ok()
}

pub(crate) fn interop(o: &Options) -> Result<()> {
    let (quick, only) = (o.quick, o.only);
    let t0 = Instant::now();
    let bin = build(true)?;
    ibverbs_so::build(&crate::root(), true).context("build the drop-in libibverbs")?;
    let (lab, booted) = boot(&[VmId::A], o.keep_vm)?;
    println!("rxe VM: {booted}");
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
    // perftest servers in the VM against our bench client, then (full
    // matrix) perftest clients in the VM against our bench server.
    let roles: &[bool] = if quick { &[true] } else { &[true, false] };
    for &rxe_server in roles {
        for (tool, ours, sizes) in perf_matrix(quick) {
            for &s in *sizes {
                let n = if s >= 1 << 20 { 5 } else { 20 };
                let size = (*tool != "atomic_lat").then_some(s);
                cases.push(long_timeout(
                    perf_case("", tool, ours, size, n, rxe_server),
                    s,
                ));
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
    // The same tools on our side too, unmodified, over the drop-in
    // libibverbs (`rdma-xdp exec`).
    cases.extend(library_cases(quick));
    cases.extend(xdp_cases(quick));
    cases.extend(cm_cases(quick));
    cases.extend(engine_cases(quick));
    let mut results = Vec::new();
    // The bridge's end of our veth gets a pass-through XDP program, so
    // that the ACKs of the XDP responder (XDP_TX) reach the bridge: veth
    // hands XDP_TX frames only to a peer running XDP. Held for the cases
    // below; the relay, which takes that end away, gives it its own.
    let pass = Running(
        Command::new("ip")
            .args(["netns", "exec", NETNS, &b, "xdp-pass", HOST_PORT])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("start rdma-xdp xdp-pass on the bridge port")?,
    );
    std::thread::sleep(Duration::from_millis(300));
    let mut watch = CounterWatch::new(&lab, &[VmId::A]);
    for c in cases
        .iter()
        .filter(|c| c.mad_delay_us == 0 && only.is_none_or(|o| c.name.contains(o)))
    {
        let cap = case_capture(&lab, o.capture_dir.as_deref(), &c.name);
        watch.case_start();
        let start = Instant::now();
        let r = run_case(&lab, &b, c);
        let secs = start.elapsed().as_secs_f64();
        drop(cap);
        let drops = watch.case_drops();
        let note = watch.case_end(&c.name);
        match &r {
            Ok(()) => println!("PASS  {:<55} {:>6.1} s{note}", c.name, secs),
            Err(e) => println!(
                "FAIL  {:<55} {:>6.1} s  {e:#}{note}{}",
                c.name,
                secs,
                if drops > 0 && note.is_empty() {
                    format!("  [host dropped {drops} frames into the VM]")
                } else {
                    String::new()
                }
            ),
        }
        results.push(r.is_ok());
    }
    let (ok, line) = watch.verdict();
    println!("{line}");
    results.push(ok);
    drop(pass);
    // Loss recovery across implementations: the impairment relay drops 1 %
    // of RoCE frames in both directions between us and rxe.
    let loss_cases = loss_cases(quick);
    let selected: Vec<&Case> = loss_cases
        .iter()
        .filter(|c| only.is_none_or(|o| c.name.contains(o)))
        .collect();
    if let Some(rep) = through_relay(&lab, &b, o, "--loss 0.01 --seed 7", &selected, &mut results) {
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
    // perftest -R against rxe's server, with CM MADs held back on the
    // link (see PERFTEST_MAD_DELAY_US).
    let mad_held: Vec<&Case> = cases
        .iter()
        .filter(|c| c.mad_delay_us > 0 && only.is_none_or(|o| c.name.contains(o)))
        .collect();
    if let Some(d) = mad_held.first().map(|c| c.mad_delay_us) {
        let flags = format!("--mad-delay-us {d}");
        if let Some(rep) = through_relay(&lab, &b, o, &flags, &mad_held, &mut results) {
            let n = |k: &str| rep[k]["mad_delayed"].as_u64().unwrap_or(0);
            println!(
                "note  {:<55} we->rxe {}, rxe->we {}, each {} ms late",
                "CM MADs held back by the relay",
                n("a_to_b"),
                n("b_to_a"),
                d as f64 / 1000.0
            );
        }
    }
    // ECN: the relay marks 10 % of RoCE frames CE both ways. rxe ignores
    // the marks (it has no notification point); we answer rxe's marked
    // packets with CNPs, which rxe must drop without disturbing anything,
    // and which tshark must dissect cleanly.
    let ce: Vec<Case> = ce_cases(quick)
        .into_iter()
        .filter(|c| only.is_none_or(|o| c.name.contains(o)))
        .collect();
    if !ce.is_empty() {
        results.extend(run_ce_cases(&lab, &b, &ce));
    }
    // Our packets must dissect without errors in Wireshark's InfiniBand
    // dissector: capture one more exchange and ask tshark for malformed or
    // error-level expert items.
    let pcap = std::env::temp_dir().join("rdma-interop.pcap");
    let check = lab
        .capture(&pcap, &["udp", "port", "4791"])
        .map_err(anyhow::Error::from)
        .and_then(|cap| {
            let r = run_case(&lab, &b, &pingpong_case("capture: ", 4096, 20, true, false));
            cap.stop();
            r
        });
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
    summary("interop", &results, &booted, t0)
}

/// The CE-marking cases: rc_pingpong with its data check, both roles (one
/// in the quick run); in the full run also ud_pingpong over our library
/// (our UD QPs answer marked datagrams with CNPs too), both roles.
pub(crate) fn ce_cases(quick: bool) -> Vec<Case> {
    let roles: &[bool] = if quick { &[true] } else { &[true, false] };
    let mut v: Vec<Case> = roles
        .iter()
        .map(|&rxe_server| pingpong_case("CE 10%: ", 4096, 100, rxe_server, false))
        .collect();
    if !quick {
        for rxe_server in [true, false] {
            v.push(library_pingpong(
                "CE 10%: ud: ",
                "ibv_ud_pingpong",
                "-g 1 -s 1024 -n 100 -c",
                100,
                rxe_server,
            ));
        }
    }
    v
}

/// Runs `cases` with the impairment relay spliced in (its `flags`),
/// printing a line per case and pushing its result; then removes the
/// relay and returns its counters. None when there is nothing to run, or
/// when the relay could not be inserted (a failure pushed).
fn through_relay(
    lab: &Lab,
    b: &str,
    o: &Options,
    flags: &str,
    cases: &[&Case],
    results: &mut Vec<bool>,
) -> Option<Value> {
    if cases.is_empty() {
        return None;
    }
    let relay = match RxeRelay::insert(b, flags) {
        Ok(r) => r,
        Err(e) => {
            println!("FAIL  {:<55} {e:#}", format!("insert the relay ({flags})"));
            results.push(false);
            return None;
        }
    };
    for c in cases {
        let cap = case_capture(lab, o.capture_dir.as_deref(), &c.name);
        let start = Instant::now();
        let r = run_case(lab, b, c);
        drop(cap);
        let secs = start.elapsed().as_secs_f64();
        match &r {
            Ok(()) => println!("PASS  {:<55} {:>6.1} s", c.name, secs),
            Err(e) => println!("FAIL  {:<55} {:>6.1} s  {e:#}", c.name, secs),
        }
        results.push(r.is_ok());
    }
    Some(relay.remove())
}

/// Runs `cases` behind a relay that marks 10 % of RoCE frames CE, with the
/// rxe counters watched and our packets captured; then checks that CNPs
/// went from us to rxe and that tshark dissects them. One result per case,
/// then one for the CNPs.
fn run_ce_cases(lab: &Lab, b: &str, cases: &[Case]) -> Vec<bool> {
    let mut results = Vec::new();
    let relay = match RxeRelay::insert(b, "--ce 0.1 --seed 7") {
        Ok(r) => r,
        Err(e) => {
            println!("FAIL  {:<55} {e:#}", "insert the CE-marking relay");
            return vec![false];
        }
    };
    let pcap = std::env::temp_dir().join("rdma-interop-ce.pcap");
    let cap = lab.capture(&pcap, &["udp", "port", "4791"]);
    let mut watch = CounterWatch::new(lab, &[VmId::A]);
    for c in cases {
        watch.case_start();
        let start = Instant::now();
        let r = run_case(lab, b, c);
        let note = watch.case_end(&c.name);
        let secs = start.elapsed().as_secs_f64();
        match &r {
            Ok(()) => println!("PASS  {:<55} {:>6.1} s{note}", c.name, secs),
            Err(e) => println!("FAIL  {:<55} {:>6.1} s  {e:#}{note}", c.name, secs),
        }
        results.push(r.is_ok() && note.is_empty());
    }
    if let Ok(c) = cap {
        c.stop();
    }
    let rep = relay.remove();
    let marked = |k: &str| rep[k]["ce_marked"].as_u64().unwrap_or(0);
    let cnps = tshark_count(&pcap, "ip.src == 10.99.0.1 && infiniband.bth.opcode == 129");
    let clean = tshark_clean(&pcap);
    let ok = marked("a_to_b") > 0
        && marked("b_to_a") > 0
        && cnps.as_ref().is_ok_and(|&n| n > 0)
        && clean.is_ok();
    println!(
        "{}  {:<55} marked we->rxe {}, rxe->we {}; CNPs from us {}; tshark {}",
        if ok { "PASS" } else { "FAIL" },
        "CE marks answered with CNPs, rxe undisturbed",
        marked("a_to_b"),
        marked("b_to_a"),
        cnps.map_or_else(|e| format!("{e:#}"), |n| n.to_string()),
        clean.map_or_else(|e| format!("{e:#}"), |n| format!("clean ({n} of ours)"))
    );
    results.push(ok);
    let _ = std::fs::remove_file(&pcap);
    results
}

/// The closing line of a run; an error if any case failed.
pub(crate) fn summary(what: &str, results: &[bool], booted: &str, t0: Instant) -> Result<()> {
    let passed = results.iter().filter(|&&x| x).count();
    println!(
        "{what}: {passed} passed, {} failed ({} cases; {booted}; total {:.0} s)",
        results.len() - passed,
        results.len(),
        t0.elapsed().as_secs_f64()
    );
    if passed != results.len() {
        bail!("{what} failures");
    }
    Ok(())
}

/// perftest tools, our bench's name for each, and the sizes they run at.
type PerfRow = (&'static str, &'static str, &'static [usize]);

pub(crate) fn perf_matrix(quick: bool) -> &'static [PerfRow] {
    if quick {
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
    }
}

/// rxe never stops its retransmit timer once everything is ACKed
/// (rxe_comp.c: "some timeouts are spurious since we do not reset the
/// timer"): it fires one timeout after the last ACK of a message and
/// retries the next message if that one is in flight by then. A 1 MiB
/// ping-pong into the emulated VM takes about 70 ms a message, right at
/// perftest's default 67 ms (-u 14), so rxe would retry without any loss;
/// a longer timeout keeps its counters meaningful.
fn long_timeout(c: Case, size: usize) -> Case {
    if size >= 1 << 20 && c.name.contains("_lat") {
        c.with_rxe_flags("-u 18")
    } else {
        c
    }
}

/// rxe's error counters around each case, in one or more VMs: a clean case
/// that moves one fails, unless the host dropped frames on their way into
/// an emulated VM meanwhile (the guest falls behind line rate), which is
/// reported as the explanation.
pub(crate) struct CounterWatch<'a> {
    lab: &'a Lab,
    vms: Vec<VmId>,
    first: Option<Vec<Counters>>,
    prev: Option<Vec<Counters>>,
    unread: Option<String>,
    drops0: i64,
    explained: Vec<String>,
    unexplained: Vec<String>,
}

fn get(m: &Counters, k: &str) -> i64 {
    m.get(k).copied().unwrap_or(0)
}

impl<'a> CounterWatch<'a> {
    pub(crate) fn new(lab: &'a Lab, vms: &[VmId]) -> Self {
        let mut w = CounterWatch {
            lab,
            vms: vms.to_vec(),
            first: None,
            prev: None,
            unread: None,
            drops0: 0,
            explained: Vec::new(),
            unexplained: Vec::new(),
        };
        w.prev = w.read();
        w.first = w.prev.clone();
        w
    }

    fn read(&mut self) -> Option<Vec<Counters>> {
        let r: Result<Vec<Counters>, _> = self.vms.iter().map(|v| self.lab.counters(*v)).collect();
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.unread.get_or_insert(e.to_string());
                None
            }
        }
    }

    fn drops(&self) -> i64 {
        self.vms.iter().map(|v| self.lab.tap_tx_dropped(*v)).sum()
    }

    pub(crate) fn case_start(&mut self) {
        self.drops0 = self.drops();
    }

    /// Frames the host dropped on their way into the VM since the case
    /// started (a UD datagram lost there is lost for good: the UD tools
    /// then wait forever).
    pub(crate) fn case_drops(&self) -> i64 {
        self.drops() - self.drops0
    }

    /// The counters that moved in the case just run, as a note for its line.
    pub(crate) fn case_end(&mut self, name: &str) -> String {
        let now = self.read();
        let mut moved = Vec::new();
        if let (Some(p), Some(n)) = (&self.prev, &now) {
            for (i, vm) in self.vms.iter().enumerate() {
                for k in RXE_ERROR_COUNTERS {
                    let d = get(&n[i], k) - get(&p[i], k);
                    if d != 0 {
                        let who = if self.vms.len() > 1 {
                            format!("{vm}:")
                        } else {
                            String::new()
                        };
                        moved.push(format!("{who}{k} +{d}"));
                    }
                }
            }
        }
        self.prev = now;
        if moved.is_empty() {
            return String::new();
        }
        let tap = self.drops() - self.drops0;
        let what = format!("{name} ({})", moved.join(", "));
        if tap > 0 {
            self.explained
                .push(format!("{what}, {tap} frames dropped into the VM"));
        } else {
            self.unexplained.push(what);
        }
        format!(
            "  [rxe counters: {}; host dropped {tap} frames into the VM]",
            moved.join(", ")
        )
    }

    /// The closing line and whether it passed.
    pub(crate) fn verdict(&self) -> (bool, String) {
        let (Some(b), Some(a), None) = (&self.first, &self.prev, &self.unread) else {
            return (
                false,
                format!(
                    "FAIL  {:<55} {}",
                    "read rxe's counters",
                    self.unread.as_deref().unwrap_or("unread")
                ),
            );
        };
        let mut line = String::new();
        if !self.explained.is_empty() {
            line.push_str(&format!(
                "note  rxe counters moved where the host dropped frames into the VM: {}\n",
                self.explained.join("; ")
            ));
        }
        let ok = self.unexplained.is_empty();
        let sum = |m: &[Counters], k: &str| m.iter().map(|c| get(c, k)).sum::<i64>();
        line.push_str(&format!(
            "{}  {:<55} {} packets sent, {} received by rxe{}",
            if ok { "PASS" } else { "FAIL" },
            "rxe error counters unchanged by the clean cases",
            sum(a, "sent_pkts") - sum(b, "sent_pkts"),
            sum(a, "rcvd_pkts") - sum(b, "rcvd_pkts"),
            if ok {
                String::new()
            } else {
                format!(": {}", self.unexplained.join("; "))
            }
        ));
        (ok, line)
    }
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

pub(crate) type Counters = std::collections::BTreeMap<String, i64>;

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
        server_serves_on: false,
        ours_xdp: None,
        mad_delay_us: 0,
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
        server_serves_on: false,
        ours_xdp: None,
        mad_delay_us: 0,
    }
}

/// Our side as a Debian binary over the drop-in libibverbs.
fn library_ours(tool_args: &str, server: Option<&str>) -> Vec<String> {
    let mut v: Vec<String> = ["--iface", "rxehost0", "exec", "--"]
        .iter()
        .map(|s| s.to_string())
        .chain(tool_args.split_whitespace().map(String::from))
        .collect();
    v.extend(server.map(String::from));
    v
}

/// Our side of a perftest case (`c`, from [`perf_case`]) as Debian's
/// `ib_TOOL` over the drop-in library: `{env}ib_{tool} -x 1 [-s S] -n N
/// {args}`, with the server's address when rxe serves. It must print its
/// result, or, as the passive side of read/atomic_lat (perftest's server
/// prints none), the peer it exchanged keys with.
fn library_perf(
    mut c: Case,
    env: &str,
    tool: &str,
    size: Option<usize>,
    n: u32,
    args: &str,
) -> Case {
    let size_arg = size.map(|s| format!(" -s {s}")).unwrap_or_default();
    c.ours = library_ours(
        &format!("{env}ib_{tool} -x 1{size_arg} -n {n}{args}"),
        c.rxe_server.then_some("10.99.0.2"),
    );
    c.ours_ok = if c.ours_print_result {
        "#bytes"
    } else {
        "remote address:"
    }
    .into();
    c
}

/// A pingpong tool of ibverbs-utils (`tool ARGS`, with `-n n` among them)
/// on both sides: rxe's in the VM, Debian's on ours over the library; both
/// must report their n iterations.
fn library_pingpong(prefix: &str, tool: &str, args: &str, n: u32, rxe_server: bool) -> Case {
    let role = if rxe_server { "server" } else { "client" };
    let mut c = pingpong_case(prefix, 0, n, rxe_server, false);
    c.name = format!("{prefix}{tool} {args}, rxe {role}");
    c.rxe = format!(
        "{tool} -d rxe0 {args}{}",
        if rxe_server { "" } else { " 10.99.0.1" }
    );
    c.ours = library_ours(&format!("{tool} {args}"), rxe_server.then_some("10.99.0.2"));
    c
}

/// rc_pingpong and perftest on both sides: rxe's in the VM, Debian's on
/// our side over the drop-in libibverbs.
pub(crate) fn library_cases(quick: bool) -> Vec<Case> {
    let mut v = Vec::new();
    let pp: &[(usize, &str)] = if quick {
        &[(4096, "")]
    } else {
        &[(64, ""), (4096, ""), (65536, ""), (4096, " -e")]
    };
    for &(s, ev) in pp {
        for rxe_server in [true, false] {
            let mut c = pingpong_case("libibverbs: ", s, 50, rxe_server, false);
            c.name = c.name.replace(" -c,", &format!(" -c{ev},"));
            c.rxe = format!("{}{ev}", c.rxe);
            c.ours = library_ours(
                &format!("ibv_rc_pingpong -g 1 -s {s} -n 50 -c{ev}"),
                rxe_server.then_some("10.99.0.2"),
            );
            v.push(c);
        }
    }
    // ibv_srq_pingpong: 16 RC QPs sharing one SRQ on each side.
    if !quick {
        for rxe_server in [true, false] {
            v.push(library_pingpong(
                "libibverbs: ",
                "ibv_srq_pingpong",
                "-g 1 -q 16 -s 4096 -n 20 -c",
                20,
                rxe_server,
            ));
        }
    }
    v.extend(ud_cases(quick));
    let perf: Vec<(&str, Vec<usize>, &str)> = if quick {
        vec![("write_lat", vec![2], "")]
    } else {
        let sizes = vec![2, 5000, 1 << 20];
        vec![
            ("write_lat", sizes.clone(), ""),
            ("send_lat", sizes.clone(), ""),
            ("read_lat", sizes.clone(), ""),
            ("atomic_lat", vec![8], ""),
            ("write_bw", sizes.clone(), ""),
            ("read_bw", sizes.clone(), ""),
            ("send_bw", vec![2, 5000], ""),
            ("write_bw", vec![5000], " -q 2"),
            ("write_bw", vec![5000], " --report_gbits"),
            // Every size from 2 B to 8 MiB (-a runs them all, -s aside).
            ("write_lat", vec![2], " -a"),
        ]
    };
    let roles: &[bool] = if quick { &[true] } else { &[true, false] };
    for &rxe_server in roles {
        for (tool, sizes, extra) in &perf {
            for &s in sizes {
                let n = if s >= 1 << 20 || extra.contains("-a") {
                    5
                } else {
                    20
                };
                let size = (*tool != "atomic_lat").then_some(s);
                let mut c =
                    long_timeout(perf_case("libibverbs: ", tool, "", size, n, rxe_server), s);
                if !extra.is_empty() {
                    c = c.with_rxe_flags(extra.trim());
                }
                let u = if c.rxe.contains("-u 18") {
                    " -u 18"
                } else {
                    ""
                };
                c = library_perf(c, "", tool, size, n, &format!("{u}{extra}"));
                if extra.contains("-q 2") {
                    c.result = Some((s, 2 * n));
                }
                v.push(c);
            }
        }
    }
    v
}

/// Unmodified perftest over the drop-in libibverbs with the XDP
/// responder (`RDMA_XDP_POOL=1`): our side's WRITE targets are placed and
/// ACKed by the XDP program, the ACKs leaving by `XDP_TX` across the
/// bridge to rxe. rxe's counters must not move (no resend), and our XDP
/// counters must show the placements. write_lat targets both sides;
/// write_bw targets ours only as the server (rxe the client), and so do
/// atomic_lat, whose atomics our XDP program executes and answers, and
/// read_lat, whose READs it answers (rxe checks the responses' ICRC).
pub(crate) fn xdp_cases(quick: bool) -> Vec<Case> {
    let mut rows: Vec<(&str, usize, bool)> = vec![
        ("write_lat", 2, true),
        ("write_bw", 65536, false),
        ("atomic_lat", 8, false),
        ("read_lat", 2, false),
    ];
    if !quick {
        rows.extend([
            ("write_lat", 2, false),
            ("write_lat", 5000, true),
            ("write_lat", 5000, false),
            ("write_bw", 5000, false),
            ("read_lat", 64, false),
        ]);
    }
    rows.into_iter()
        .map(|(tool, s, rxe_server)| {
            let n = 200;
            let size = (tool != "atomic_lat").then_some(s);
            let mut c = library_perf(
                perf_case("libibverbs+XDP: ", tool, "", size, n, rxe_server),
                "env RDMA_XDP_STATS=1 RDMA_XDP_POOL=1 ",
                tool,
                size,
                n,
                "",
            );
            c.ours_xdp = Some(if tool == "read_lat" {
                "xdp_read"
            } else {
                "xdp_acked"
            });
            c
        })
        .collect()
}

/// The XDP program's counters on our side, as the library prints them at
/// close with `RDMA_XDP_STATS=1`.
fn xdp_counters(stderr: &str) -> Result<Value> {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("rdma-xdp xdp "))
        .ok_or_else(|| anyhow::anyhow!("ours printed no XDP counters"))?;
    serde_json::from_str(&line[line.find('{').unwrap_or(0)..])
        .context("ours: the XDP counters' JSON")
}

/// RDMA CM against rxe's kernel CM, both roles: rdmacm-utils and perftest
/// `-R` on both sides, Debian's binaries on ours over the drop-in
/// librdmacm. Every name starts with "cm: " (`cargo xtask interop --only
/// cm`).
pub(crate) fn cm_cases(quick: bool) -> Vec<Case> {
    // (name, server command, client command; {srv} is the server's
    // address, ok text, perftest result (bytes, iterations), the server
    // serves until stopped).
    type Tool = (
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        Option<(usize, u32)>,
        bool,
    );
    let tools: Vec<Tool> = if quick {
        vec![(
            "rping -C 100 -V -S 4096",
            "rping -s -a {srv} -C 100 -V -S 4096",
            "rping -c -a {srv} -C 100 -V -S 4096",
            "",
            None,
            false,
        )]
    } else {
        vec![
            (
                "rping -C 200 -V -S 4096",
                "rping -s -a {srv} -C 200 -V -S 4096",
                "rping -c -a {srv} -C 200 -V -S 4096",
                "",
                None,
                false,
            ),
            (
                "ucmatose -c 10",
                "ucmatose -c 10",
                "ucmatose -s {srv} -c 10",
                "return status 0",
                None,
                false,
            ),
            (
                "udaddy",
                "udaddy",
                "udaddy -s {srv}",
                "return status 0",
                None,
                false,
            ),
            (
                "rdma_server/rdma_client",
                "rdma_server",
                "rdma_client -s {srv}",
                "end 0",
                None,
                false,
            ),
            (
                "ib_write_lat -R -s 64 -n 200",
                "ib_write_lat -R -s 64 -n 200",
                "ib_write_lat -R -s 64 -n 200 {srv}",
                "",
                Some((64, 200)),
                false,
            ),
            (
                "ib_read_bw -R -s 65536 -n 100",
                "ib_read_bw -R -s 65536 -n 100",
                "ib_read_bw -R -s 65536 -n 100 {srv}",
                "",
                Some((65536, 100)),
                false,
            ),
            (
                "ib_send_bw -R -s 4096 -n 200",
                "ib_send_bw -R -s 4096 -n 200",
                "ib_send_bw -R -s 4096 -n 200 {srv}",
                "",
                Some((4096, 200)),
                false,
            ),
            (
                "cmtime -c 100",
                "cmtime -c 100",
                "cmtime -s {srv} -c 100",
                "disconnect",
                None,
                true,
            ),
            (
                "qperf -cm1 rc_lat rc_bw",
                "qperf",
                "qperf -cm1 -t 2 {srv} rc_lat rc_bw",
                "rc_bw:",
                None,
                true,
            ),
            // Over IPv6 every tool that takes an IPv6 address: perftest
            // 4.5's -R and qperf 0.4.11 ask getaddrinfo for IPv4 only
            // (qperf against rxe: "Address family for hostname not
            // supported", as against us).
            (
                "IPv6: rping -C 50 -V -S 1024",
                "rping -s -a {srv6} -C 50 -V -S 1024",
                "rping -c -a {srv6} -C 50 -V -S 1024",
                "",
                None,
                false,
            ),
            (
                "IPv6: ucmatose -c 4",
                "ucmatose -b {srv6} -c 4",
                "ucmatose -s {srv6} -c 4",
                "return status 0",
                None,
                false,
            ),
            (
                "IPv6: udaddy",
                "udaddy -b {srv6}",
                "udaddy -s {srv6}",
                "return status 0",
                None,
                false,
            ),
            (
                "IPv6: rdma_server/rdma_client",
                "rdma_server -s {srv6}",
                "rdma_client -s {srv6}",
                "end 0",
                None,
                false,
            ),
            (
                "IPv6: cmtime -c 20",
                "cmtime -b {srv6} -c 20",
                "cmtime -s {srv6} -c 20",
                "disconnect",
                None,
                true,
            ),
        ]
    };
    let mut v = Vec::new();
    for (name, server, client, ok, result, serves_on) in tools {
        for rxe_server in [true, false] {
            let (srv, srv6) = if rxe_server {
                ("10.99.0.2", "fd99::2")
            } else {
                ("10.99.0.1", "fd99::1")
            };
            let fill = |c: &str| c.replace("{srv6}", srv6).replace("{srv}", srv);
            let (rxe, ours) = if rxe_server {
                (fill(server), fill(client))
            } else {
                (fill(client), fill(server))
            };
            v.push(Case {
                name: format!(
                    "cm: {name}, rxe {}",
                    if rxe_server { "server" } else { "client" }
                ),
                rxe,
                ours: library_ours(&ours, None),
                rxe_server,
                ours_ok: ok.into(),
                rxe_ok: ok.into(),
                result,
                ours_print_result: result.is_some(),
                server_serves_on: serves_on,
                ours_xdp: None,
                // perftest's, against rxe's server: see the constant.
                mad_delay_us: if rxe_server && result.is_some() {
                    perftest_mad_delay_us()
                } else {
                    0
                },
            });
        }
    }
    if !quick {
        // A REQ for a port nobody listens on (7999), while a listener runs
        // on rping's port: REJ reason 8, "invalid service id", both ways.
        let rejected = |srv: &str| {
            format!(
                "rping -c -a {srv} -p 7999 -C 1 2>&1 | grep -q 'RDMA_CM_EVENT_REJECTED, error 8' && echo rejected-8"
            )
        };
        for rxe_server in [true, false] {
            let srv = if rxe_server { "10.99.0.2" } else { "10.99.0.1" };
            let listener = format!("rping -s -a {srv} -C 1");
            let (rxe, ours) = if rxe_server {
                (listener, rejected(srv))
            } else {
                (rejected(srv), listener)
            };
            let mut ours_args = library_ours("sh -c", None);
            ours_args.push(ours);
            v.push(Case {
                name: format!(
                    "cm: a REQ to a port nobody listens on gets REJ 8, rxe {}",
                    if rxe_server { "server" } else { "client" }
                ),
                rxe,
                ours: ours_args,
                rxe_server,
                ours_ok: "rejected-8".into(),
                rxe_ok: "rejected-8".into(),
                result: None,
                ours_print_result: false,
                server_serves_on: true,
                ours_xdp: None,
                mad_delay_us: 0,
            });
        }
    }
    v
}

/// UD against rxe, both roles, over the drop-in libibverbs: datagrams up
/// to the port MTU (1024 B at a netdev MTU of 1500). Every name has "ud"
/// in it (`cargo xtask interop --only ud`).
pub(crate) fn ud_cases(quick: bool) -> Vec<Case> {
    let mut v = Vec::new();
    let pp: &[&str] = if quick {
        &["-s 1024 -n 50 -c"]
    } else {
        &["-s 1024 -n 50 -c", "-s 64 -n 50 -c -e"]
    };
    for args in pp {
        for rxe_server in [true, false] {
            let args = format!("-g 1 {args}");
            v.push(library_pingpong(
                "ud: ",
                "ibv_ud_pingpong",
                &args,
                50,
                rxe_server,
            ));
        }
    }
    if quick {
        return v;
    }
    for rxe_server in [true, false] {
        for (tool, s) in [("send_lat", 2), ("send_lat", 1024), ("send_bw", 1024)] {
            let n = 20;
            let c = perf_case("ud: ", tool, "", Some(s), n, rxe_server).with_rxe_flags("-c UD");
            v.push(library_perf(c, "", tool, Some(s), n, " -c UD"));
        }
    }
    v
}

/// UCX against rxe, both roles: Debian's `ucx_perftest` at UCP level over
/// RC (`UCX_TLS=rc_v`: rc_verbs, with ud_verbs for the wire-up), ours over
/// the drop-in library under `rdma-xdp exec`. (At UCT level the server
/// opens the device its client names, and rxe's is rxe0, ours rxehost0.)
/// rxe's side runs with `UCX_UD_ETH_DGID_CHECK=n`: UCX 1.13's ud_verbs
/// reads the packet's type from a UD completion's `sl`, which rxe leaves
/// 0, so it takes an IPv4 packet's header for an IPv6 GRH and drops every
/// datagram, rxe's own too (rxe to rxe fails the same way without it). Our
/// side needs no flag: our completions carry the type, as mlx5's. Every
/// name starts with "engines: " (`cargo xtask interop --only engines`).
pub(crate) fn engine_cases(quick: bool) -> Vec<Case> {
    let tests: &[&str] = if quick {
        &["tag_lat"]
    } else {
        &["tag_lat", "tag_bw", "ucp_put_bw", "stream_lat"]
    };
    let mut v = Vec::new();
    for t in tests {
        for rxe_server in [true, false] {
            if quick && !rxe_server {
                continue;
            }
            let n = "-n 1000 -w 100";
            let env = "env UCX_TLS=rc_v UCX_WARN_UNUSED_ENV_VARS=n";
            let rxe_env = format!("{env} UCX_UD_ETH_DGID_CHECK=n");
            let test = format!("ucx_perftest -t {t} {n}");
            let (rxe, ours) = if rxe_server {
                (
                    format!("{rxe_env} ucx_perftest"),
                    library_ours(&format!("{env} {test}"), Some("10.99.0.2")),
                )
            } else {
                (
                    format!("{rxe_env} {test} 10.99.0.1"),
                    library_ours(&format!("{env} ucx_perftest"), None),
                )
            };
            v.push(Case {
                name: format!(
                    "engines: ucx_perftest {t} rc_v, rxe {}",
                    if rxe_server { "server" } else { "client" }
                ),
                rxe,
                ours,
                rxe_server,
                ours_ok: if rxe_server { "Final:" } else { "" }.into(),
                rxe_ok: if rxe_server { "" } else { "Final:" }.into(),
                result: None,
                ours_print_result: false,
                server_serves_on: false,
                ours_xdp: None,
                mad_delay_us: 0,
            });
        }
    }
    v
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

pub(crate) const RELAY_NS: &str = "rxerelay";

impl RxeRelay {
    fn insert(bin: &str, flags: &str) -> Result<RxeRelay> {
        netns_del(RELAY_NS);
        let stats = std::env::temp_dir().join("rdma-rxe-relay.json");
        let _ = std::fs::remove_file(&stats);
        let mut r = RxeRelay { child: None, stats };
        ip(&["netns", "add", RELAY_NS])?;
        ip(&["-n", NETNS, "link", "set", HOST_PORT, "nomaster"])?;
        ip(&["-n", NETNS, "link", "set", HOST_PORT, "netns", RELAY_NS])?;
        ip(&[
            "-n", NETNS, "link", "add", "rxrly1", "type", "veth", "peer", "name", "rxrly0",
            "netns", RELAY_NS,
        ])?;
        ip(&["-n", NETNS, "link", "set", "rxrly1", "master", BRIDGE, "up"])?;
        ip(&["-n", RELAY_NS, "link", "set", HOST_PORT, "up"])?;
        ip(&["-n", RELAY_NS, "link", "set", "rxrly0", "up"])?;
        r.child = Some(Running(
            Command::new("ip")
                .args(["netns", "exec", RELAY_NS, bin, "--json", "relay"])
                .args(["--a", HOST_PORT, "--b", "rxrly0", "--stats-file"])
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
        q(&["-n", RELAY_NS, "link", "set", HOST_PORT, "netns", NETNS]);
        q(&[
            "-n", NETNS, "link", "set", HOST_PORT, "master", BRIDGE, "up",
        ]);
        q(&["-n", NETNS, "link", "del", "rxrly1"]);
        netns_del(RELAY_NS);
    }
}

impl Drop for RxeRelay {
    fn drop(&mut self) {
        // Also after a half-done insert; every step tolerates "already so".
        self.restore();
    }
}

/// One case: rxe's tool in VM a, ours in the namespace, each bounded by a
/// time-out that kills its process group.
pub(crate) fn run_case(lab: &Lab, bin: &str, c: &Case) -> Result<()> {
    let mut ours_cmd = lab.host(bin);
    ours_cmd.args(&c.ours);
    let (ours, rxe) = if c.rxe_server {
        let mut attempt = 1;
        let (job, ours) = loop {
            let job = lab.spawn(VmId::A, &c.rxe)?;
            // perftest's server listens after its device setup.
            std::thread::sleep(Duration::from_secs(2));
            let (ours, _) = run_bounded(&mut ours_cmd, OURS_TIMEOUT)?;
            if ours.status.success() || attempt == 3 || !lost_perftest_listen_race(&ours) {
                break (job, ours);
            }
            lab.kill(&job);
            println!(
                "note  {}: the server was not listening yet (REJ 8), attempt {attempt} of 3",
                c.name
            );
            attempt += 1;
        };
        if !ours.status.success() || c.server_serves_on {
            lab.kill(&job);
        }
        if c.server_serves_on {
            return serving_client_ok(ours.status.success(), &ours.stdout, &ours.stderr, c)
                .map_err(|e| e.context(format!("ours: {}", tail(&ours))));
        }
        (ours, lab.wait(&job, RXE_TIMEOUT)?)
    } else {
        let ours = Bounded::spawn(&mut ours_cmd)?;
        std::thread::sleep(Duration::from_millis(1500));
        let rxe = lab.exec(VmId::A, &c.rxe, RXE_TIMEOUT)?;
        if c.server_serves_on {
            // Stopped at once: only the client is judged.
            let _ = ours.wait(Duration::ZERO);
            return serving_client_ok(
                rxe.success(),
                rxe.stdout.as_bytes(),
                rxe.stderr.as_bytes(),
                c,
            )
            .map_err(|e| e.context(format!("rxe: {}", guest_tail(&rxe))));
        }
        (ours.wait(Duration::from_secs(30))?.0, rxe)
    };
    let o = String::from_utf8_lossy(&ours.stdout);
    let ours_ok = ours.status.success() && o.contains(&c.ours_ok);
    let rxe_ok = rxe.success() && rxe.stdout.contains(&c.rxe_ok);
    // The side that failed first is the one to name: a server waits for
    // its client, so when both fail the client's error comes first.
    match (ours_ok, rxe_ok, c.rxe_server) {
        (false, _, true) | (false, true, false) => bail!("ours: {}", tail(&ours)),
        (_, false, _) => bail!("rxe: {}", guest_tail(&rxe)),
        _ => {}
    }
    check_result_lines(c, &o, &rxe.stdout)?;
    if let Some(counter) = c.ours_xdp {
        // Each packet counts once: placed and dropped, placed and turned
        // into its ACK, or turned into its READ response.
        let v = xdp_counters(&String::from_utf8_lossy(&ours.stderr))?;
        if v[counter].as_u64().unwrap_or(0) == 0 {
            bail!("ours: the XDP program's {counter} is 0 ({v})");
        }
    }
    Ok(())
}

/// perftest `-R` (4.5) opens its data connection as soon as its last
/// handshake message on the control connection (itself an rdma_cm
/// connection) has been received, while the server makes its data listener
/// (`rdma_cm_server_connection`) only when that message's send completes,
/// that is when our ACK of it arrives. Our REQ leaves about 0.5 ms after
/// that ACK, on its heels: rxe's server under TCG then has not yet listened
/// and answers REJ 8 (invalid service id). Measured 2026-12-06: all three
/// attempts of each of the three cases lost; delaying every frame by 20 or
/// 150 ms changed nothing, as the ACK and the REQ travel together. A real
/// rdma_cm refuses the same way, and perftest 4.5's retry then reuses the
/// ids it has just destroyed and cannot recover (upstream fixed that retry
/// in commit 3d9d8d0, 2025-12, perftest 26.04; Debian 12 ships 4.5). So
/// these cases run with the impairment relay holding CM MADs back (both
/// ways) this long: the REQ reaches the server after the ACK by that
/// margin, as it would behind a slower management path, and the data path,
/// the MADs' contents and everything else of the case are unchanged.
/// `XTASK_MAD_DELAY_US` overrides it.
pub(crate) const PERFTEST_MAD_DELAY_US: u64 = 20_000;

fn perftest_mad_delay_us() -> u64 {
    std::env::var("XTASK_MAD_DELAY_US")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(PERFTEST_MAD_DELAY_US)
}

/// What is left of the race above still shows as REJ 8 at once; the
/// harness gives such a case, and only for this signature, three attempts.
fn lost_perftest_listen_race(ours: &std::process::Output) -> bool {
    String::from_utf8_lossy(&ours.stdout).contains("Event: RDMA_CM_EVENT_REJECTED; error: 8.")
        || String::from_utf8_lossy(&ours.stderr)
            .contains("Event: RDMA_CM_EVENT_REJECTED; error: 8.")
}

/// The client of a server that serves on: it exited 0, printed its ok
/// text and mentioned no failure.
fn serving_client_ok(exited_0: bool, stdout: &[u8], stderr: &[u8], c: &Case) -> Result<()> {
    let out = String::from_utf8_lossy(stdout);
    let err = String::from_utf8_lossy(stderr);
    let ok = if c.rxe_server { &c.ours_ok } else { &c.rxe_ok };
    if !exited_0 {
        bail!("the client failed");
    }
    if !out.contains(ok.as_str()) {
        bail!("the client's output lacks {ok:?}");
    }
    if let Some(l) = out.lines().chain(err.lines()).find(|l| l.contains("fail")) {
        bail!("the client reports {l:?}");
    }
    Ok(())
}

/// The last meaningful line a guest command printed (stderr first).
pub(crate) fn guest_tail(o: &GuestOutput) -> String {
    let last = o
        .stderr
        .lines()
        .chain(o.stdout.lines())
        .rfind(|l| !l.trim().is_empty())
        .unwrap_or("failed")
        .trim()
        .to_string();
    if o.timed_out {
        format!("timed out ({last})")
    } else {
        format!("{last} (exit {})", o.code)
    }
}

/// Counts our RoCEv2 packets in a capture and fails on any malformed packet
/// or error-level expert item tshark reports.
/// Packets of `pcap` that match a display filter.
pub(crate) fn tshark_count(pcap: &Path, filter: &str) -> Result<usize> {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(pcap)
        .args(["-Y", filter])
        .stderr(Stdio::null())
        .output()
        .context("tshark is not installed: apt-get install tshark")?;
    Ok(String::from_utf8_lossy(&out.stdout).lines().count())
}

pub(crate) fn tshark_clean(pcap: &Path) -> Result<usize> {
    let count = |filter: &str| tshark_count(pcap, filter);
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
        .rfind(|l| !l.trim().is_empty())
        .unwrap_or("failed")
        .trim()
        .to_string()
}

// ------------------------------------------------------------------ bench
