//! `cargo xtask bench --vs-rxe`: Linux rxe against our stack on the same
//! two VMs and the same link, in one run. perftest between rxe devices,
//! then `rdma-xdp bench` (perftest's protocol and columns) between our
//! stacks on the guests' virtio-net, zero-copy AF_XDP, and in copy mode.
//!
//! CPU per message comes from each guest's `/proc/stat` (all CPUs; user,
//! system, irq and softirq: rxe works in softirq). Each point runs twice,
//! with N and N/5 messages, and the CPU per message is the difference over
//! the difference: program start, connection setup and teardown cancel out,
//! whatever they cost each implementation. Writes `target/bench/vs-rxe.json`
//! and `target/bench/vs-rxe.md`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rxevm::{Lab, Settings, VmId};
use serde_json::{json, Value};

use crate::{root, setup::build};

/// The guest kernel with AF_XDP zero-copy on virtio-net (Debian 12's
/// 6.12.118 refuses it): trixie-backports' 6.16, from Debian's pool.
const ZC_KERNEL: &str = "linux-image-6.16.12+deb13-amd64_6.16.12-1~bpo13+1_amd64.deb";
const ZC_KERNEL_URL: &str = "http://deb.debian.org/debian/pool/main/l/linux-signed-amd64/";
const ZC_KERNEL_BYTES: u64 = 169_667_600;

const GUEST_BIN: &str = "/tmp/rdma-xdp";
/// Clock ticks per second of /proc/stat (USER_HZ on x86).
const USER_HZ: f64 = 100.0;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Impl {
    Rxe,
    /// Ours, with this `--xsk` policy.
    Ours(&'static str),
}

impl Impl {
    fn name(self) -> &'static str {
        match self {
            Impl::Rxe => "rxe",
            Impl::Ours(_) => "ours",
        }
    }
}

/// One point of the matrix: perftest's test name, the size, and for
/// latency tests the iterations of the calibration run.
#[derive(Clone, Copy)]
struct Point {
    test: &'static str,
    bytes: usize,
    iters: u64,
}

fn matrix() -> Vec<Point> {
    let mut v = Vec::new();
    for test in ["write_lat", "read_lat", "send_lat"] {
        for bytes in [2, 64] {
            v.push(Point {
                test,
                bytes,
                iters: 300,
            });
        }
    }
    for test in ["write_bw", "read_bw", "send_bw"] {
        for bytes in [64, 4096, 65536] {
            v.push(Point {
                test,
                bytes,
                iters: 0,
            });
        }
    }
    v
}

/// The zero-copy kernel package: `RXEVM_KERNEL_DEB`, or downloaded once
/// into the VM cache.
fn zc_kernel(settings: &Settings) -> Result<PathBuf> {
    if let Some(p) = &settings.kernel_deb {
        return Ok(p.clone());
    }
    let dir = settings.cache.join("kernels");
    let deb = dir.join(ZC_KERNEL);
    if std::fs::metadata(&deb).map(|m| m.len()).ok() == Some(ZC_KERNEL_BYTES) {
        return Ok(deb);
    }
    std::fs::create_dir_all(&dir)?;
    let part = dir.join(format!("{ZC_KERNEL}.part"));
    let url = format!("{ZC_KERNEL_URL}{}", ZC_KERNEL.replace('+', "%2b"));
    eprintln!("[vs-rxe] downloading {ZC_KERNEL} (170 MB) from deb.debian.org");
    let ok = Command::new("curl")
        .args(["-fsSL", "--retry", "3", "-o"])
        .arg(&part)
        .arg(&url)
        .status()
        .context("run curl")?
        .success();
    let len = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
    if !ok || len != ZC_KERNEL_BYTES {
        let _ = std::fs::remove_file(&part);
        bail!("download {url}: got {len} bytes, want {ZC_KERNEL_BYTES}; or set RXEVM_KERNEL_DEB to a copy");
    }
    std::fs::rename(&part, &deb)?;
    Ok(deb)
}

/// The VM settings for our stack in the guests: the zero-copy kernel, and
/// two queue pairs and two vCPUs (rxevm sets a multi-queue device up
/// behind the DMA API, which virtio-net's zero-copy needs).
pub(crate) fn zc_settings() -> Result<Settings> {
    let mut settings = Settings::from_env()?;
    settings.kernel_deb = Some(zc_kernel(&settings)?);
    settings.queues = settings.queues.max(2);
    Ok(settings)
}

/// vCPUs per VM for the comparison: one (`RXEVM_CPUS` overrides). The
/// host has two cores; two VMs of two vCPUs each would overcommit them,
/// and rxe, whose requester spins in perftest while its softirq work needs
/// a second vCPU, suffers most from that.
fn bench_cpus() -> u32 {
    std::env::var("RXEVM_CPUS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// The first eight fields of /proc/stat's `cpu` line (all CPUs): user,
/// nice, system, idle, iowait, irq, softirq, steal (guest time is inside
/// user).
fn cpu_fields(stat: &str) -> Option<[u64; 8]> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    f.try_into().ok()
}

/// Busy ticks: everything but idle and iowait.
fn busy(f: &[u64; 8]) -> u64 {
    f[0] + f[1] + f[2] + f[5] + f[6] + f[7]
}

#[cfg(test)]
fn busy_ticks(stat: &str) -> Option<u64> {
    cpu_fields(stat).map(|f| busy(&f))
}

/// CPU µs per message on one side, and where it went.
#[derive(Clone, Copy, Debug, Default)]
struct CpuSplit {
    total: f64,
    /// User space (user + nice): the programs, our data path.
    user: f64,
    /// The kernel on behalf of processes: syscalls, wake-ups.
    system: f64,
    /// Interrupts and softirq: the drivers, XDP, rxe.
    softirq: f64,
}

impl CpuSplit {
    fn from_ticks(d: &[u64; 8], secs: f64, msgs_per_s: f64) -> CpuSplit {
        let us = |t: u64| t as f64 / USER_HZ * 1e6 / (secs * msgs_per_s);
        CpuSplit {
            total: us(busy(d)),
            user: us(d[0] + d[1]),
            system: us(d[2] + d[7]),
            softirq: us(d[5] + d[6]),
        }
    }

    fn json(&self) -> Value {
        json!({"user": self.user, "system": self.system, "softirq": self.softirq})
    }
}

/// A guest's uptime (s) and CPU fields, read in one command.
fn guest_sample(lab: &Lab, id: VmId) -> Result<(f64, [u64; 8])> {
    let o = lab.exec(id, "cat /proc/uptime /proc/stat", Duration::from_secs(30))?;
    let up = o
        .stdout
        .split_whitespace()
        .next()
        .and_then(|x| x.parse().ok())
        .with_context(|| format!("VM {id}'s /proc/uptime"))?;
    let f =
        cpu_fields(&o.stdout).with_context(|| format!("no cpu line in VM {id}'s /proc/stat"))?;
    Ok((up, f))
}

/// What a client reported.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Outcome {
    /// t_typical (latency) or average Gb/s (bandwidth).
    value: f64,
    /// Messages per second, for the CPU window: 1/t_avg for latency tests
    /// (write and send: one message each way per round trip; read: one
    /// READ per round trip), the message rate for bandwidth tests.
    msgs_per_s: f64,
}

/// A perftest result line: latency columns (t_typical 5th, t_avg 6th) or
/// bandwidth columns (average Gb/s 4th with --report_gbits, Mpps 5th).
fn parse_perftest(out: &str, bytes: usize, lat: bool) -> Option<Outcome> {
    out.lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        if w.first()?.parse::<usize>().ok()? != bytes {
            return None;
        }
        let n = |i: usize| w.get(i).and_then(|x| x.parse::<f64>().ok());
        Some(if lat {
            Outcome {
                value: n(4)?,
                msgs_per_s: 1e6 / n(5)?,
            }
        } else {
            Outcome {
                value: n(3)?,
                msgs_per_s: n(4)? * 1e6,
            }
        })
    })
}

/// How long a run lasts: iterations (latency tests, as ours has no -D
/// for them) or seconds (bandwidth tests, perftest's -D).
#[derive(Clone, Copy)]
enum Length {
    Iters(u64),
    Secs(u32),
}

/// The CPU window: from `start` seconds after the client starts, for
/// `len` seconds; the run must outlast it.
#[derive(Clone, Copy)]
struct Window {
    start: f64,
    len: f64,
}

/// CPU per message on each side (requester VM a, target VM b) over the
/// window.
type Cpu = [CpuSplit; 2];

/// Runs one point: the client's outcome, and with a window the CPU per
/// message in it, and how ours bound.
fn run_once(
    lab: &Lab,
    imp: Impl,
    p: Point,
    len: Length,
    window: Option<Window>,
) -> Result<(Outcome, Option<Cpu>, Option<String>)> {
    let lat = p.test.ends_with("_lat");
    let server_ip = VmId::B.ip();
    let length = match len {
        Length::Iters(n) => format!("-n {n}"),
        Length::Secs(s) => format!("-D {s}"),
    };
    let base = match imp {
        Impl::Rxe => format!(
            "ib_{} -d rxe0 -x 1 -m 1024 -F -s {} {length}{}",
            p.test,
            p.bytes,
            if lat { "" } else { " --report_gbits" }
        ),
        // A crash leaves a core in /tmp for gdb on the host (the binary is
        // the host's).
        Impl::Ours(xsk) => format!(
            "ulimit -c unlimited; {GUEST_BIN} --xsk {xsk} --json /tmp/vs.json bench {} -d eth0 -m 1024 --adaptive -s {} {length}",
            p.test.replace('_', "-"),
            p.bytes
        ),
    };
    let server = lab.spawn(VmId::B, &base)?;
    // Our server sets up XDP and its sockets before it listens.
    std::thread::sleep(Duration::from_millis(2500));
    let client = lab.spawn(VmId::A, &format!("{base} {server_ip}"));
    let mut cpu_ticks = None;
    if let (Ok(job), Some(w)) = (&client, window) {
        std::thread::sleep(Duration::from_secs_f64(w.start));
        let before = [guest_sample(lab, VmId::A)?, guest_sample(lab, VmId::B)?];
        std::thread::sleep(Duration::from_secs_f64(w.len));
        let after = [guest_sample(lab, VmId::A)?, guest_sample(lab, VmId::B)?];
        let still = lab.exec(
            VmId::A,
            &format!("[ ! -e {}.rc ]", job.log),
            Duration::from_secs(30),
        )?;
        if !still.success() {
            lab.kill(&server);
            bail!(
                "{} {} {} B: the client ended before the CPU window did",
                imp.name(),
                p.test,
                p.bytes
            );
        }
        cpu_ticks = Some([0, 1].map(|i| {
            let d: [u64; 8] = std::array::from_fn(|k| after[i].1[k] - before[i].1[k]);
            (after[i].0 - before[i].0, d)
        }));
    }
    let c = match &client {
        Ok(job) => lab.wait(job, Duration::from_secs(900)),
        Err(_) => {
            lab.kill(&server);
            return Err(client.err().unwrap().into());
        }
    };
    let s = lab.wait(&server, Duration::from_secs(60))?;
    let c = c?;
    if !c.success() || !s.success() {
        bail!(
            "{} {} {} B: client exit {} ({}), server exit {} ({})",
            imp.name(),
            p.test,
            p.bytes,
            c.code,
            c.stdout.trim().lines().last().unwrap_or(""),
            s.code,
            s.stdout.trim().lines().last().unwrap_or("")
        );
    }
    let (out, bind) = match imp {
        Impl::Rxe => (
            parse_perftest(&c.stdout, p.bytes, lat)
                .with_context(|| format!("no result line in:\n{}", c.stdout))?,
            None,
        ),
        Impl::Ours(_) => {
            let o = lab.exec(VmId::A, "cat /tmp/vs.json", Duration::from_secs(30))?;
            let v: Value = serde_json::from_str(&o.stdout)
                .with_context(|| format!("our client's records: {}", o.stdout))?;
            let rec = v
                .as_array()
                .and_then(|a| a.iter().find(|r| r["bytes"] == json!(p.bytes)))
                .with_context(|| format!("no {} B record in {v}", p.bytes))?;
            let f = |k: &str| rec[k].as_f64().with_context(|| format!("no {k} in {rec}"));
            let out = if lat {
                Outcome {
                    value: f("t_typical_us")?,
                    msgs_per_s: 1e6 / f("t_avg_us")?,
                }
            } else {
                Outcome {
                    value: f("bw_avg_gbps")?,
                    msgs_per_s: f("msg_rate_mpps")? * 1e6,
                }
            };
            (out, rec["xsk_bind"].as_str().map(String::from))
        }
    };
    let cpu = cpu_ticks.map(|t| t.map(|(secs, d)| CpuSplit::from_ticks(&d, secs, out.msgs_per_s)));
    Ok((out, cpu, bind))
}

/// How long the measured runs are.
#[derive(Clone, Copy)]
struct Timing {
    /// Seconds of traffic a run aims at.
    run: f64,
    window: Window,
}

/// One point: latency tests are calibrated by a short run first (the
/// iteration count that lasts `run` seconds); bandwidth tests run for
/// `run` seconds. CPU is read in a window inside the traffic.
fn measure(lab: &Lab, imp: Impl, p: Point, t: Timing) -> Result<Value> {
    let len = if p.test.ends_with("_lat") {
        let (cal, _, _) = run_once(lab, imp, p, Length::Iters(p.iters), None)?;
        // From the typical latency (the calibration's average carries the
        // warm-up's outliers): write and send_lat report half a round
        // trip, read_lat a whole one.
        let round_trip_us = if p.test == "read_lat" {
            cal.value
        } else {
            2.0 * cal.value
        };
        Length::Iters(((t.run * 1e6 / round_trip_us) as u64).clamp(100, 2_000_000))
    } else {
        // -D counts from the first message: the window's end, the
        // client's setup (up to ~3 s under TCG) and a margin.
        Length::Secs((t.window.start + t.window.len + 3.0).ceil() as u32)
    };
    let (out, cpu, bind) = run_once(lab, imp, p, len, Some(t.window))?;
    let [req, tgt] = cpu.context("no CPU window")?;
    let mut r = json!({
        "impl": imp.name(),
        "test": p.test,
        "bytes": p.bytes,
        "cpu_us_per_msg": req.total + tgt.total,
        "cpu_us_per_msg_requester": req.total,
        "cpu_us_per_msg_target": tgt.total,
        "cpu_split_requester": req.json(),
        "cpu_split_target": tgt.json(),
        "msgs_per_s": out.msgs_per_s,
    });
    match len {
        Length::Iters(n) => r["iters"] = json!(n),
        Length::Secs(s) => r["duration_s"] = json!(s),
    }
    if p.test.ends_with("_lat") {
        r["t_typical_us"] = json!(out.value);
    } else {
        r["bw_avg_gbps"] = json!(out.value);
    }
    if let Some(b) = bind {
        r["xsk_bind"] = json!(b);
    }
    Ok(r)
}

pub(crate) fn bench_vs_rxe(quick: bool, copy_too: bool, only: Option<&str>) -> Result<()> {
    let bin = build(true)?;
    let mut settings = zc_settings()?;
    settings.cpus = bench_cpus();
    let (lab, booted) = crate::interop::boot_with(settings.clone(), &[VmId::A, VmId::B], false)?;
    eprintln!(
        "[vs-rxe] VMs: {booted}; {} vCPU(s) and a {}-queue virtio-net each",
        settings.cpus, settings.queues
    );
    for id in [VmId::A, VmId::B] {
        lab.put_file(id, &bin, GUEST_BIN, 0o755)
            .with_context(|| format!("copy rdma-xdp into VM {id}"))?;
    }
    let mut impls = vec![Impl::Rxe, Impl::Ours("zero-copy")];
    if copy_too {
        impls.push(Impl::Ours("copy"));
    }
    // The client's setup (XDP, sockets, the exchange) takes up to ~3 s
    // under TCG: the window starts after it and ends before the traffic.
    // A latency run's length comes from a short calibration run, whose
    // latency is often higher than the steady state's (TCG translates the
    // code paths on first use): twice the window's end leaves room.
    let timing = if quick {
        Timing {
            run: 14.0,
            window: Window {
                start: 4.0,
                len: 3.0,
            },
        }
    } else {
        Timing {
            run: 20.0,
            window: Window {
                start: 4.5,
                len: 6.0,
            },
        }
    };
    let mut records = Vec::new();
    // --only: points whose "test bytes" contains one of the comma-separated
    // words ("read_lat", "write_bw 65536").
    let wanted = |p: &Point| {
        only.is_none_or(|o| {
            let name = format!("{} {}", p.test, p.bytes);
            o.split(',').any(|w| name.contains(w.trim()))
        })
    };
    for id in [VmId::A, VmId::B] {
        lab.exec(
            id,
            "echo /tmp/core.%e.%p > /proc/sys/kernel/core_pattern",
            Duration::from_secs(30),
        )?;
    }
    'points: for p in matrix().into_iter().filter(wanted) {
        // Alternate within a point: the machine drifts over minutes.
        for &imp in &impls {
            // A link a failed run left broken would fail every later
            // point: stop with what was measured.
            let ping = lab.exec(
                VmId::A,
                &format!("ping -c 2 -W 2 {}", VmId::B.ip()),
                Duration::from_secs(30),
            )?;
            if !ping.success() {
                eprintln!(
                    "   the link between the VMs is down before {} {} {} B: stopping here",
                    imp.name(),
                    p.test,
                    p.bytes
                );
                break 'points;
            }
            match measure(&lab, imp, p, timing) {
                Ok(mut r) => {
                    r["vcpus"] = json!(settings.cpus);
                    eprintln!("   {r}");
                    records.push(r);
                }
                Err(e) => {
                    eprintln!("   {} {} {} B failed: {e:#}", imp.name(), p.test, p.bytes);
                    // A crash's trace: the kernel's segfault line gives the
                    // instruction's offset in the binary (addr2line -f -C -e
                    // target/release/rdma-xdp OFFSET).
                    for id in [VmId::A, VmId::B] {
                        if let Ok(o) = lab.exec(
                            id,
                            "dmesg | grep -E 'segfault|general protection|trap' | tail -3",
                            Duration::from_secs(30),
                        ) {
                            for l in o.stdout.lines() {
                                eprintln!("     VM {id}: {l}");
                            }
                        }
                    }
                }
            }
        }
    }
    drop(lab);
    let out_dir = root().join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    if only.is_some() {
        // Points measured again replace their records of an earlier run;
        // the others stay, so the table stays whole.
        let earlier: Vec<Value> = std::fs::read(out_dir.join("vs-rxe.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        records = merge_records(earlier, records);
    }
    crate::bench::write_out("vs-rxe", &records, &table(&records))
}

fn table(records: &[Value]) -> String {
    let find = |imp: &str, bind: Option<&str>, test: &str, bytes: &Value| {
        records.iter().find(|r| {
            r["impl"] == imp
                && r["test"] == test
                && &r["bytes"] == bytes
                && bind.is_none_or(|b| r["xsk_bind"] == b)
        })
    };
    let num = |r: Option<&Value>, k: &str| r.and_then(|r| r[k].as_f64());
    let fmt = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.3}"));
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "-".into(),
    };
    let mut s = String::from(
        "| test | bytes | rxe | ours (zero-copy) | ours/rxe | ours (copy) | rxe CPU µs/msg (req + target) | ours zero-copy CPU µs/msg (req + target) | target CPU ours/rxe |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut seen = Vec::new();
    for r in records {
        let key = (r["test"].clone(), r["bytes"].clone());
        if seen.contains(&key) {
            continue;
        }
        seen.push(key.clone());
        let (test, bytes) = (key.0.as_str().unwrap_or(""), &key.1);
        let k = if test.ends_with("_lat") {
            "t_typical_us"
        } else {
            "bw_avg_gbps"
        };
        let unit = if k == "t_typical_us" { "µs" } else { "Gb/s" };
        let rxe = find("rxe", None, test, bytes);
        let zc = find("ours", Some("zero-copy"), test, bytes);
        let cp = find("ours", Some("copy"), test, bytes);
        let cpu = |r: Option<&Value>| match r {
            Some(r) => format!(
                "{} + {}",
                fmt(r["cpu_us_per_msg_requester"].as_f64()),
                fmt(r["cpu_us_per_msg_target"].as_f64())
            ),
            None => "-".into(),
        };
        s.push_str(&format!(
            "| {test} | {bytes} | {} {unit} | {} {unit} | {} | {} | {} | {} | {} |\n",
            fmt(num(rxe, k)),
            fmt(num(zc, k)),
            ratio(num(zc, k), num(rxe, k)),
            fmt(num(cp, k)),
            cpu(rxe),
            cpu(zc),
            ratio(
                num(zc, "cpu_us_per_msg_target"),
                num(rxe, "cpu_us_per_msg_target")
            ),
        ));
    }
    // Where each side's CPU went (µs per message: user space, kernel on a
    // process's behalf, interrupts and softirq).
    s.push_str("\n| test | bytes | side | rxe user / sys / softirq | ours zero-copy user / sys / softirq |\n|---|---|---|---|---|\n");
    let split = |r: Option<&Value>, side: &str| match r.map(|r| &r[format!("cpu_split_{side}")]) {
        Some(v) if v.is_object() => format!(
            "{} / {} / {}",
            fmt(v["user"].as_f64()),
            fmt(v["system"].as_f64()),
            fmt(v["softirq"].as_f64())
        ),
        _ => "-".into(),
    };
    for (test, bytes) in &seen {
        let test = test.as_str().unwrap_or("");
        let rxe = find("rxe", None, test, bytes);
        let zc = find("ours", Some("zero-copy"), test, bytes);
        for side in ["requester", "target"] {
            s.push_str(&format!(
                "| {test} | {bytes} | {side} | {} | {} |\n",
                split(rxe, side),
                split(zc, side)
            ));
        }
    }
    s
}

/// `earlier` with each record of `newer` in place of the one for the same
/// implementation, bind mode, test and size (appended where there was none).
fn merge_records(earlier: Vec<Value>, newer: Vec<Value>) -> Vec<Value> {
    let key = |r: &Value| {
        (
            r["impl"].to_string(),
            r["xsk_bind"].to_string(),
            r["test"].to_string(),
            r["bytes"].to_string(),
        )
    };
    let mut out = earlier;
    for r in newer {
        match out.iter_mut().find(|e| key(e) == key(&r)) {
            Some(e) => *e = r,
            None => out.push(r),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_busy_leaves_out_idle_and_iowait() {
        let s = "cpu  100 5 50 1000 7 3 2 1 0 0\ncpu0 50 2 25 500 3 1 1 0 0 0\n";
        assert_eq!(busy_ticks(s), Some(100 + 5 + 50 + 3 + 2 + 1));
        assert_eq!(busy_ticks("intr 1 2\n"), None);
    }

    #[test]
    fn perftest_result_lines_parse() {
        let lat = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]\n 2       2000          222.07         17797.51      766.32   \t       2500.00\n";
        let o = parse_perftest(lat, 2, true).unwrap();
        assert_eq!(o.value, 766.32);
        assert_eq!(o.msgs_per_s, 400.0);
        assert_eq!(parse_perftest(lat, 64, true), None);
        let bw = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n 65536      1000             0.43               0.41   \t\t   0.000790\n";
        let o = parse_perftest(bw, 65536, false).unwrap();
        assert_eq!(o.value, 0.41);
        assert!((o.msgs_per_s - 790.0).abs() < 1e-6);
    }

    #[test]
    fn records_measured_again_replace_their_point_only() {
        let r = |imp: &str, bytes: u64, v: f64| json!({"impl": imp, "test": "read_bw", "bytes": bytes, "bw_avg_gbps": v});
        let earlier = vec![r("rxe", 64, 1.0), r("ours", 64, 2.0), r("rxe", 65536, 3.0)];
        let merged = merge_records(earlier, vec![r("ours", 64, 5.0), r("ours", 65536, 6.0)]);
        assert_eq!(
            merged,
            vec![
                r("rxe", 64, 1.0),
                r("ours", 64, 5.0),
                r("rxe", 65536, 3.0),
                r("ours", 65536, 6.0)
            ]
        );
    }
}
