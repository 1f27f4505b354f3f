//! `cargo xtask congestion`: N senders through a switch with a bottleneck
//! to one receiver, with DCQCN on and off, in four scenarios; writes
//! `target/congestion/results.json`, `summary.md` and one plot per scenario.
//!
//! The switch is the relay in switch mode (`rdma-xdp relay --a S0 --a S1
//! ... --b R`): its port towards the receiver is the bottleneck, a queue
//! drained at `--rate-mbit` that CE-marks as RED does (none below Kmin,
//! up to Pmax at Kmax, all above) and drops when full. This kernel has no
//! RED or netem qdisc and copy-mode AF_XDP TX bypasses the senders' qdiscs,
//! so the queue lives on the forwarding hop, in the relay. Every number
//! below is read from the relay's timeline: one clock, every frame.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use crate::{lab::*, root, setup::*};

#[derive(clap::Args)]
pub(crate) struct Options {
    /// Half-length scenarios.
    #[arg(long)]
    pub(crate) quick: bool,
    /// The bottleneck, Mbit/s.
    #[arg(long, default_value_t = 400.0)]
    pub(crate) rate_mbit: f64,
    /// Seed of the bottleneck's marking.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// A DCQCN tunable on top of the test bed's (mlx5 name=value). Repeatable.
    #[arg(long = "cc", value_name = "NAME=VALUE")]
    pub(crate) cc: Vec<String>,
    /// The paper's timers and increase steps instead of the test bed's.
    #[arg(long)]
    pub(crate) paper: bool,
    /// Only the scenarios whose name contains this.
    #[arg(long)]
    pub(crate) only: Option<String>,
    /// The bottleneck marks no frame while its queue is below this.
    #[arg(long, default_value_t = 32768)]
    pub(crate) kmin_bytes: u64,
    /// ... marks with probability --pmax at this depth, every frame beyond.
    #[arg(long, default_value_t = 131072)]
    pub(crate) kmax_bytes: u64,
    #[arg(long, default_value_t = 0.1)]
    pub(crate) pmax: f64,
    /// Leave the processes to the scheduler instead of the relay (the
    /// switch) on core 0 and the hosts on core 1.
    #[arg(long)]
    pub(crate) no_pin: bool,
    /// Decide marks as frames enter the queue (RED's way), not as they
    /// leave it.
    #[arg(long)]
    pub(crate) mark_on_enqueue: bool,
    /// The senders' line rate, Mbit/s: the switch receives each sender's
    /// frames no faster than this (a veth's reported speed; 0: as fast as
    /// the sender writes its AF_XDP batches).
    #[arg(long, default_value_t = 10_000.0)]
    pub(crate) ingress_mbit: f64,
    /// Lossless Ethernet: the switch pauses its senders (PFC) when its
    /// queue is full instead of dropping; the records count the pauses
    /// and their time.
    #[arg(long)]
    pub(crate) pfc: bool,
}

/// One flow: when it starts and stops (seconds from the scenario's start).
#[derive(Clone, Copy)]
struct FlowSpec {
    start: f64,
    stop: f64,
}

struct Scenario {
    name: &'static str,
    what: &'static str,
    flows: Vec<FlowSpec>,
    /// Where fairness and utilisation are measured (s): a steady state with
    /// a constant set of flows.
    steady: (f64, f64),
    /// Convergence is timed from this event (s): a flow joining or leaving.
    event: Option<f64>,
    /// The bottleneck's rate, if not the test bed's (Mbit/s).
    rate: Option<f64>,
}

fn scenarios(quick: bool) -> Vec<Scenario> {
    let k = if quick { 0.5 } else { 1.0 };
    let f = |start: f64, stop: f64| FlowSpec {
        start: start * k,
        stop: stop * k,
    };
    vec![
        Scenario {
            name: "stagger",
            what: "two flows, the second joining 3 s after the first",
            flows: vec![f(0.0, 10.0), f(3.0, 10.0)],
            steady: (6.0 * k, 10.0 * k),
            event: Some(3.0 * k),
            rate: None,
        },
        Scenario {
            name: "incast",
            what: "four flows starting together into one receiver",
            flows: vec![f(0.0, 8.0); 4],
            steady: (3.0 * k, 8.0 * k),
            event: Some(0.0),
            rate: None,
        },
        Scenario {
            name: "departure",
            what: "two flows, one leaving after 5 s",
            flows: vec![f(0.0, 10.0), f(0.0, 5.0)],
            steady: (2.0 * k, 5.0 * k),
            event: Some(5.0 * k),
            rate: None,
        },
        Scenario {
            name: "no_congestion",
            what: "one flow, the switch at the senders' line rate",
            flows: vec![f(0.0, 5.0)],
            steady: (1.0 * k, 5.0 * k),
            event: None,
            // A veth's speed, the line rate DCQCN starts from: the network
            // is as fast as the senders' links.
            rate: Some(10_000.0),
        },
    ]
}

/// The test bed's DCQCN tunables. The paper's timers (55 µs) and steps
/// (40/100 Mbit/s) are sized for a 40 Gbit/s NIC whose feedback loop is
/// tens of microseconds. Here the loop is a queue of a few hundred Mbit/s
/// and processes sharing two cores, milliseconds long: the timers run 18x
/// slower, at most one cut per millisecond (about a round trip; with
/// mlx5's 4 µs every CNP of a burst halves the rate again), and both steps
/// are an 80th of the bottleneck, so recovery does not outrun the
/// feedback. Hyper increase adds i steps per event, i growing by one per
/// event: with a step of a 20th, a lone flow climbed past the bottleneck
/// faster than the CNPs of a millisecond-long loop could stop it, the
/// queue passed Kmax, and the cuts that followed emptied it (departure's
/// remaining flow averaged about 325 Mbit/s of 400; with an 80th, 360:
/// docs/benchmarks.md).
fn testbed_cc(rate_mbit: f64) -> Vec<String> {
    vec![
        "rp_time_reset=1000".into(),
        "rp_dce_tcp_rtt=1000".into(),
        "rp_rate_reduce_monitor_period=1000".into(),
        format!("rp_ai_rate={}", rate_mbit / 80.0),
        format!("rp_hai_rate={}", rate_mbit / 80.0),
    ]
}

/// The bottleneck's queue: 1 MiB (see `run_one`). With `--pfc` the
/// switch pauses its senders when it is full.
const QUEUE_BYTES: u64 = 1 << 20;
const BIN_MS: f64 = 10.0;
const WINDOW_MS: f64 = 100.0;
/// Convergence: the first 100 ms window after the event from which the
/// next this many windows have a mean Jain index of at least 0.9 (or, after
/// a departure, the flow left carries a mean of 90 % of the bottleneck).
const CONVERGED_WINDOWS: usize = 5;

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub(crate) fn jain(x: &[f64]) -> f64 {
    let s: f64 = x.iter().sum();
    let q: f64 = x.iter().map(|v| v * v).sum();
    if q == 0.0 {
        return 1.0;
    }
    s * s / (x.len() as f64 * q)
}

pub(crate) fn congestion(o: &Options) -> Result<()> {
    let bin = build(true)?;
    let n = 4;
    let senders: Vec<String> = (0..n).map(|i| format!("rdmacg-s{i}")).collect();
    let (switch, sink) = ("rdmacg-w".to_string(), "rdmacg-r".to_string());
    let all: Vec<String> = senders
        .iter()
        .cloned()
        .chain([switch.clone(), sink.clone()])
        .collect();
    let lab = Lab::fresh(&all, false);
    let sdevs: Vec<String> = (0..n).map(|i| format!("rcg-s{i}")).collect();
    let wdevs: Vec<String> = (0..n).map(|i| format!("rcg-w{i}")).collect();
    let addrs: Vec<String> = (0..n).map(|i| format!("10.89.0.{}", i + 1)).collect();
    fn refs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    let sink_addr = "10.89.0.100";
    netlab::star_topology(
        &netlab::Star {
            hosts: &refs(&senders),
            host_devs: &refs(&sdevs),
            host_addrs: &refs(&addrs),
            switch: &switch,
            switch_devs: &refs(&wdevs),
            sink: &sink,
            sink_dev: "rcg-r",
            sink_addr,
            switch_sink_dev: "rcg-wr",
        },
        None,
    )?;
    let out = root().join("target/congestion");
    std::fs::create_dir_all(&out)?;
    let mut cc = if o.paper {
        Vec::new()
    } else {
        testbed_cc(o.rate_mbit)
    };
    cc.extend(o.cc.iter().cloned());
    let mut records = Vec::new();
    let mut runs = Vec::new();
    for sc in scenarios(o.quick) {
        if o.only.as_deref().is_some_and(|f| !sc.name.contains(f)) {
            continue;
        }
        let mut pair = Vec::new();
        for dcqcn in [true, false] {
            eprintln!(
                "{} (DCQCN {}): {}",
                sc.name,
                if dcqcn { "on" } else { "off" },
                sc.what
            );
            let run = run_one(
                o, &bin, &sc, dcqcn, &cc, &senders, &switch, &sink, &sdevs, &wdevs, sink_addr, &out,
            )
            .with_context(|| {
                format!(
                    "{} with DCQCN {}",
                    sc.name,
                    if dcqcn { "on" } else { "off" }
                )
            })?;
            let rec = metrics(o, &sc, dcqcn, &run);
            eprintln!("   {rec}");
            records.push(rec);
            pair.push((dcqcn, run));
        }
        plot(&out.join(format!("{}.png", sc.name)), &sc, o, &pair)?;
        runs.push(sc.name);
    }
    drop(lab);
    if records.is_empty() {
        bail!("no scenario matches --only");
    }
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&json!({
            "rate_mbit": o.rate_mbit,
            "kmin_bytes": o.kmin_bytes,
            "kmax_bytes": o.kmax_bytes,
            "pmax": o.pmax,
            "mark_on_dequeue": !o.mark_on_enqueue,
            "ingress_mbit": o.ingress_mbit,
            "pfc": o.pfc,
            "cc": cc,
            "quick": o.quick,
            "records": records,
        }))?,
    )?;
    let md = summary(&records);
    std::fs::write(out.join("summary.md"), &md)?;
    println!("{md}");
    println!(
        "wrote target/congestion/results.json, summary.md and {}",
        runs.iter()
            .map(|r| format!("{r}.png"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

/// What one run left: the relay's timeline and counters, each flow's
/// report, the server's.
struct Run {
    timeline: Value,
    relay: Value,
    flows: Vec<Value>,
    server: Value,
    /// The scenario's start (Unix ms).
    t0_ms: u64,
    rate_mbit: f64,
}

#[allow(clippy::too_many_arguments)]
fn run_one(
    o: &Options,
    bin: &Path,
    sc: &Scenario,
    dcqcn: bool,
    cc: &[String],
    senders: &[String],
    switch: &str,
    sink: &str,
    sdevs: &[String],
    wdevs: &[String],
    sink_addr: &str,
    out: &Path,
) -> Result<Run> {
    let rate = sc.rate.unwrap_or(o.rate_mbit);
    let tag = format!("{}-{}", sc.name, if dcqcn { "on" } else { "off" });
    let f = |s: &str| out.join(format!("{tag}.{s}"));
    for s in ["timeline.json", "relay.json", "server.json"] {
        let _ = std::fs::remove_file(f(s));
    }
    let mut relay = Command::new("ip");
    // The senders compete on equal terms: all of them on core 1, the
    // relay (the switch) and the receiver on core 0. Left to the
    // scheduler, the flows can switch mid-run from sharing fairly to
    // swinging against each other (most likely a sender moved onto the
    // relay's core), and stagger's Jain index falls from about 0.99 to
    // about 0.9 (measured, see docs/benchmarks.md). With the receiver on the
    // senders' core, its turns delayed their pacing into bursts.
    let pin = |who: &str| -> Vec<String> {
        if o.no_pin {
            return Vec::new();
        }
        let core = if who == "flow" { "1" } else { "0" };
        vec!["taskset".into(), "-c".into(), core.into()]
    };
    relay
        .args(["netns", "exec", switch])
        .args(pin("relay"))
        .arg(bin)
        .args(["--json", "relay"]);
    for w in wdevs.iter().take(sc.flows.len()) {
        relay.args(["--a", w]);
    }
    // The queue holds 1 MiB: four flows' windows (4 WRITEs of 64 KiB
    // each, 1.09 MiB with headers) overflow it only if all arrive at
    // once, as incast's first burst does before any CNP can. Marking
    // follows the ramp (the DCQCN paper's shape: none below Kmin, Pmax at
    // Kmax, every frame beyond), decided as a frame leaves the queue by
    // the depth behind it (see `--mark-on-dequeue`). With --pfc nothing
    // overflows: the switch pauses its senders (at once, no headroom
    // needed) while the queue is full, as lossless RoCE fabrics do; DCQCN
    // is then what keeps the pauses few.
    relay
        .args(["--b", "rcg-wr", "--rate-mbit", &rate.to_string()])
        .args(["--ingress-mbit", &o.ingress_mbit.to_string()])
        .args(["--queue-bytes", &QUEUE_BYTES.to_string()])
        .args(if o.pfc {
            vec!["--pfc-xoff-bytes".to_string(), QUEUE_BYTES.to_string()]
        } else {
            vec![]
        })
        .args(["--kmin-bytes", &o.kmin_bytes.to_string()])
        .args(["--kmax-bytes", &o.kmax_bytes.to_string()])
        .args(["--pmax", &o.pmax.to_string()])
        .args(if o.mark_on_enqueue {
            &[][..]
        } else {
            &["--mark-on-dequeue"][..]
        })
        .args([
            "--seed",
            &o.seed.to_string(),
            "--bin-ms",
            &BIN_MS.to_string(),
        ])
        .arg("--timeline")
        .arg(f("timeline.json"))
        .arg("--stats-file")
        .arg(f("relay.json"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(f("relay.log"))?);
    let relay = Running(relay.spawn()?);
    let cc_args: Vec<String> = cc.iter().flat_map(|c| ["--cc".into(), c.clone()]).collect();
    let onoff: &[&str] = if dcqcn { &[] } else { &["--no-dcqcn"] };
    let server = Running(
        Command::new("ip")
            .args(["netns", "exec", sink])
            .args(pin("sink"))
            .arg(bin)
            .arg("--json")
            .arg(f("server.json"))
            .args(["flow", "--dev", "rcg-r"])
            .args(&cc_args)
            .args(onoff)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(f("server.log"))?)
            .spawn()?,
    );
    std::thread::sleep(Duration::from_millis(300));
    // Every flow comes up, connects and waits for its start time.
    let t0_ms = unix_ms() + 2500;
    let mut clients = Vec::new();
    for (i, fl) in sc.flows.iter().enumerate() {
        let fj = f(&format!("flow{i}.json"));
        let _ = std::fs::remove_file(&fj);
        let c = Command::new("ip")
            .args(["netns", "exec", &senders[i]])
            .args(pin("flow"))
            .arg(bin)
            .arg("--json")
            .arg(&fj)
            .args([
                "flow", sink_addr, "--dev", &sdevs[i], "-s", "65536", "-t", "4",
            ])
            .args(["--start-at", &(t0_ms + (fl.start * 1e3) as u64).to_string()])
            .args(["--seconds", &(fl.stop - fl.start).to_string()])
            .args(&cc_args)
            .args(onoff)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(f(&format!("flow{i}.log")))?)
            .spawn()?;
        clients.push((Running(c), fj));
    }
    let end = sc.flows.iter().map(|f| f.stop).fold(0.0, f64::max);
    let deadline = Instant::now() + Duration::from_secs_f64(end + 15.0);
    let mut flows = Vec::new();
    for (i, (mut c, fj)) in clients.into_iter().enumerate() {
        loop {
            if let Some(st) = c.0.try_wait()? {
                if !st.success() {
                    let log =
                        std::fs::read_to_string(f(&format!("flow{i}.log"))).unwrap_or_default();
                    bail!("flow {i} failed ({st}): {}", log.trim());
                }
                break;
            }
            if Instant::now() > deadline {
                bail!("flow {i} did not finish in time");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        flows.push(read_json(&fj).ok_or_else(|| anyhow!("flow {i} wrote no report"))?);
    }
    drop(server);
    drop(relay);
    let need = |name: &str| {
        read_json(&f(name)).ok_or_else(|| anyhow!("no {name} from this run (see {tag}.*.log)"))
    };
    Ok(Run {
        timeline: need("timeline.json")?,
        relay: need("relay.json")?,
        server: need("server.json")?,
        flows,
        t0_ms,
        rate_mbit: rate,
    })
}

/// The timeline's bins as per-flow Mbit/s per 100 ms window from the
/// scenario's start, the queue depth and the CNPs.
struct Series {
    /// [window][flow] Mbit/s.
    windows: Vec<Vec<f64>>,
    /// Per bin, from the scenario's start: (t_ms, [flow] Mbit/s), queue
    /// max bytes, CNPs.
    bins: Vec<(f64, Vec<f64>, f64, f64)>,
    queue_hist: Vec<Vec<f64>>,
    bucket: f64,
}

fn series(run: &Run, nflows: usize) -> Series {
    let tl = &run.timeline;
    let bin_ms = tl["bin_ms"].as_f64().unwrap_or(BIN_MS);
    let start_ns = tl["start_unix_ns"].as_u64().unwrap_or(0) as f64;
    let off = ((run.t0_ms as f64 * 1e6 - start_ns) / 1e6 / bin_ms).round() as i64;
    let empty = vec![];
    let bins = tl["bins"].as_array().unwrap_or(&empty);
    let per_window = (WINDOW_MS / bin_ms).round() as usize;
    let mut out = Series {
        windows: Vec::new(),
        bins: Vec::new(),
        queue_hist: Vec::new(),
        bucket: tl["queue_bucket_bytes"].as_f64().unwrap_or(1.0),
    };
    for (i, b) in bins.iter().enumerate() {
        let k = i as i64 - off;
        if k < 0 {
            continue;
        }
        let mbps: Vec<f64> = (0..nflows)
            .map(|p| b["bytes"][p].as_f64().unwrap_or(0.0) * 8.0 / (bin_ms * 1e3))
            .collect();
        let cnps: f64 = (0..nflows)
            .map(|p| b["cnps"][p].as_f64().unwrap_or(0.0))
            .sum();
        out.bins.push((
            k as f64 * bin_ms,
            mbps,
            b["queue_max_bytes"].as_f64().unwrap_or(0.0),
            cnps,
        ));
        out.queue_hist.push(
            b["queue_hist"]
                .as_array()
                .map(|h| h.iter().map(|v| v.as_f64().unwrap_or(0.0)).collect())
                .unwrap_or_default(),
        );
    }
    for w in out.bins.chunks(per_window) {
        out.windows.push(
            (0..nflows)
                .map(|p| w.iter().map(|b| b.1[p]).sum::<f64>() / per_window as f64)
                .collect(),
        );
    }
    out
}

fn metrics(o: &Options, sc: &Scenario, dcqcn: bool, run: &Run) -> Value {
    let nf = sc.flows.len();
    let s = series(run, nf);
    let wsec = WINDOW_MS / 1e3;
    let active = |w: usize, i: usize| {
        let (t0, t1) = (w as f64 * wsec, (w + 1) as f64 * wsec);
        sc.flows[i].start <= t0 && t1 <= sc.flows[i].stop
    };
    let (a, b) = (
        (sc.steady.0 / wsec).round() as usize,
        (sc.steady.1 / wsec).round() as usize,
    );
    let steady: Vec<usize> = (a..b.min(s.windows.len())).collect();
    let jain_of = |w: usize| {
        let x: Vec<f64> = (0..nf)
            .filter(|&i| active(w, i))
            .map(|i| s.windows[w][i])
            .collect();
        jain(&x)
    };
    let jains: Vec<f64> = steady.iter().map(|&w| jain_of(w)).collect();
    let mean = |v: &[f64]| {
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let total = |w: usize| s.windows[w].iter().sum::<f64>();
    let utilisation = mean(&steady.iter().map(|&w| total(w)).collect::<Vec<_>>()) / run.rate_mbit;
    // After a join, fairness returns; after a departure, the flow left
    // takes the bottleneck.
    let converged = |w: usize| {
        let span = w..w + CONVERGED_WINDOWS;
        if sc.name == "departure" {
            mean(&span.map(total).collect::<Vec<_>>()) >= 0.9 * run.rate_mbit
        } else {
            mean(&span.map(jain_of).collect::<Vec<_>>()) >= 0.9
        }
    };
    let convergence_ms = sc.event.and_then(|ev| {
        let first = (ev / wsec).round() as usize;
        let last = s.windows.len().saturating_sub(CONVERGED_WINDOWS);
        (first..=last)
            .find(|&w| converged(w))
            .map(|w| (w as f64 * wsec - ev) * 1e3)
    });
    // The queue's 99th percentile over the steady state's arrivals.
    let per_window = (WINDOW_MS / BIN_MS).round() as usize;
    let mut hist = vec![0.0; s.queue_hist.first().map_or(0, |h| h.len())];
    for &w in &steady {
        for h in s.queue_hist.iter().skip(w * per_window).take(per_window) {
            for (acc, v) in hist.iter_mut().zip(h) {
                *acc += v;
            }
        }
    }
    let n: f64 = hist.iter().sum();
    let mut seen = 0.0;
    let p99_bucket = hist
        .iter()
        .position(|v| {
            seen += v;
            n > 0.0 && seen >= 0.99 * n
        })
        .unwrap_or(0);
    let flows: Vec<Value> = run
        .flows
        .iter()
        .map(|f| {
            json!({
                "goodput_mbps": f["goodput_mbps"],
                "rp_cnp_handled": f["stats"]["rp_cnp_handled"],
                "retransmits": f["stats"]["retransmits"],
                "timeouts": f["stats"]["timeouts"],
            })
        })
        .collect();
    // Goodput in the steady state, from the senders' own completions.
    let goodput_mbps: f64 = run
        .flows
        .iter()
        .zip(&sc.flows)
        .map(|(f, spec)| {
            let bin_s = f["bin_ms"].as_f64().unwrap_or(BIN_MS) / 1e3;
            let (a, b) = (
                ((sc.steady.0 - spec.start) / bin_s).round().max(0.0) as usize,
                ((sc.steady.1.min(spec.stop) - spec.start) / bin_s)
                    .round()
                    .max(0.0) as usize,
            );
            let bytes: f64 = f["bins"]
                .as_array()
                .map(|v| {
                    v.iter()
                        .skip(a)
                        .take(b.saturating_sub(a))
                        .map(|x| x["bytes"].as_f64().unwrap_or(0.0))
                        .sum()
                })
                .unwrap_or(0.0);
            bytes * 8.0 / 1e6 / (sc.steady.1 - sc.steady.0)
        })
        .sum();
    let r3 = |v: f64| (v * 1000.0).round() / 1000.0;
    json!({
        "scenario": sc.name,
        "dcqcn": dcqcn,
        "flows": nf,
        "bottleneck_mbit": run.rate_mbit,
        "jain": r3(mean(&jains)),
        "jain_min": r3(jains.iter().cloned().fold(f64::INFINITY, f64::min).min(1.0)),
        "utilisation": r3(utilisation),
        "goodput_utilisation": r3(goodput_mbps / run.rate_mbit),
        "convergence_ms": convergence_ms,
        "event_s": sc.event,
        "bottleneck_drops": run.relay["a_to_b"]["bottleneck_drops"],
        "pfc": o.pfc,
        "pfc_pauses": run.relay["a_to_b"]["pfc_pauses"],
        "pfc_paused_ms": r3(run.relay["a_to_b"]["pfc_paused_ns"].as_f64().unwrap_or(0.0) / 1e6),
        "ce_marked": run.relay["a_to_b"]["ce_marked"],
        "cnps_sent": run.server["np_cnp_sent"],
        "queue_p99_bytes": ((p99_bucket + 1) as f64 * s.bucket) as u64,
        "queue_max_bytes": run.relay["a_to_b"]["queue_max_bytes"],
        "steady_s": [sc.steady.0, sc.steady.1],
        "seed": o.seed,
        "per_flow": flows,
    })
}

fn summary(records: &[Value]) -> String {
    let mut md = String::from(
        "| scenario | DCQCN | flows | Jain (mean / min) | utilisation (wire / goodput) | convergence ms | drops | PFC pauses (ms) | CE marks | CNPs | queue p99 KiB | per-flow Mbit/s | retransmits |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in records {
        let pf = r["per_flow"].as_array().cloned().unwrap_or_default();
        md += &format!(
            "| {} | {} | {} | {:.3} / {:.3} | {:.3} / {:.3} | {} | {} | {} | {} | {} | {:.0} | {} | {} |\n",
            r["scenario"].as_str().unwrap_or(""),
            if r["dcqcn"].as_bool() == Some(true) { "on" } else { "off" },
            r["flows"],
            r["jain"].as_f64().unwrap_or(0.0),
            r["jain_min"].as_f64().unwrap_or(0.0),
            r["utilisation"].as_f64().unwrap_or(0.0),
            r["goodput_utilisation"].as_f64().unwrap_or(0.0),
            match (r["event_s"].is_null(), r["convergence_ms"].as_f64()) {
                (true, _) => "-".to_string(),
                (false, None) => "never".to_string(),
                (false, Some(v)) => format!("{v:.0}"),
            },
            r["bottleneck_drops"],
            if r["pfc"].as_bool() == Some(true) {
                format!(
                    "{} ({:.1})",
                    r["pfc_pauses"],
                    r["pfc_paused_ms"].as_f64().unwrap_or(0.0)
                )
            } else {
                "off".to_string()
            },
            r["ce_marked"],
            r["cnps_sent"],
            r["queue_p99_bytes"].as_f64().unwrap_or(0.0) / 1024.0,
            pf.iter()
                .map(|f| format!("{:.0}", f["goodput_mbps"].as_f64().unwrap_or(0.0)))
                .collect::<Vec<_>>()
                .join(" / "),
            pf.iter().map(|f| f["retransmits"].as_u64().unwrap_or(0)).sum::<u64>(),
        );
    }
    md
}

static FONT: &[u8] = include_bytes!("../assets/DejaVuSansMono.ttf");

/// One PNG per scenario: DCQCN on (left) and off (right); per-flow rate
/// (50 ms averages), the queue's depth and the CNPs per 10 ms.
fn plot(path: &Path, sc: &Scenario, o: &Options, pair: &[(bool, Run)]) -> Result<()> {
    use plotters::prelude::*;
    let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    let e = |e: &dyn std::fmt::Display| anyhow!("plot {}: {e}", path.display());
    let root = BitMapBackend::new(path, (1400, 900)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let root = root
        .titled(
            &format!(
                "{}: {} (bottleneck {} Mbit/s)",
                sc.name,
                sc.what,
                sc.rate.unwrap_or(o.rate_mbit)
            ),
            ("sans-serif", 22),
        )
        .map_err(|x| e(&x))?;
    let cols = root.split_evenly((1, pair.len().max(1)));
    let end_s = sc.flows.iter().map(|f| f.stop).fold(0.0, f64::max) + 0.3;
    let colors = [RED, BLUE, GREEN, MAGENTA];
    for ((dcqcn, run), col) in pair.iter().zip(cols) {
        let s = series(run, sc.flows.len());
        let rows = col.split_evenly((3, 1));
        let label = if *dcqcn { "DCQCN on" } else { "DCQCN off" };
        let smooth = 5;
        let ymax = run.rate_mbit * 1.1;
        let mut c = ChartBuilder::on(&rows[0])
            .caption(
                format!("{label}: rate per flow (Mbit/s, 50 ms)"),
                ("sans-serif", 16),
            )
            .margin(8)
            .x_label_area_size(24)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..end_s, 0f64..ymax)
            .map_err(|x| e(&x))?;
        c.configure_mesh().draw().map_err(|x| e(&x))?;
        for fl in 0..sc.flows.len() {
            let pts: Vec<(f64, f64)> = s
                .bins
                .chunks(smooth)
                .map(|w| {
                    (
                        w[0].0 / 1e3,
                        w.iter().map(|b| b.1[fl]).sum::<f64>() / w.len() as f64,
                    )
                })
                .collect();
            c.draw_series(LineSeries::new(
                pts,
                colors[fl % colors.len()].stroke_width(2),
            ))
            .map_err(|x| e(&x))?
            .label(format!("flow {fl}"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], colors[fl % colors.len()])
            });
        }
        c.configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|x| e(&x))?;
        let qmax = s.bins.iter().map(|b| b.2).fold(1.0, f64::max) / 1024.0;
        let mut q = ChartBuilder::on(&rows[1])
            .caption("bottleneck queue (KiB, max per 10 ms)", ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(24)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..end_s, 0f64..qmax * 1.1)
            .map_err(|x| e(&x))?;
        q.configure_mesh().draw().map_err(|x| e(&x))?;
        q.draw_series(LineSeries::new(
            s.bins.iter().map(|b| (b.0 / 1e3, b.2 / 1024.0)),
            BLACK,
        ))
        .map_err(|x| e(&x))?;
        let cmax = s.bins.iter().map(|b| b.3).fold(1.0, f64::max);
        let mut k = ChartBuilder::on(&rows[2])
            .caption("CNPs to the senders (per 10 ms)", ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..end_s, 0f64..cmax * 1.1)
            .map_err(|x| e(&x))?;
        k.configure_mesh()
            .x_desc("seconds")
            .draw()
            .map_err(|x| e(&x))?;
        k.draw_series(LineSeries::new(
            s.bins.iter().map(|b| (b.0 / 1e3, b.3)),
            RGBColor(200, 120, 0),
        ))
        .map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::jain;

    #[test]
    fn jain_is_one_when_fair_and_one_over_n_when_one_takes_all() {
        assert!((jain(&[5.0, 5.0, 5.0]) - 1.0).abs() < 1e-12);
        assert!((jain(&[9.0, 0.0, 0.0]) - 1.0 / 3.0).abs() < 1e-12);
        assert!((jain(&[3.0, 1.0]) - 0.8).abs() < 1e-12);
    }
}
