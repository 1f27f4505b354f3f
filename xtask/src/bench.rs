//! `cargo xtask bench`: perftest-style tests, same-link baselines and the engine
//! microbenchmark; the table with target ratios and results.json.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::Value;

use crate::{lab::*, root, setup::*};

pub(crate) struct Job {
    /// `bench TEST` or `baseline KIND`.
    pub(crate) args: Vec<String>,
    /// Which side writes the record: the client, or the server (streams).
    pub(crate) from_server: bool,
    /// The target veth's NAPI in a kernel thread on the target's core.
    pub(crate) threaded_napi: bool,
}

/// The namespaces, devices and addresses of a bench run.
pub(crate) const NS: [&str; 2] = ["rdmabench-a", "rdmabench-b"];
pub(crate) const DEVS: [&str; 2] = ["rbench-a", "rbench-b"];
pub(crate) const ADDRS: [&str; 2] = ["10.89.0.1", "10.89.0.2"];

/// `cargo xtask bench --goals`: only the alternated goal ratios.
pub(crate) fn goals(quick: bool) -> Result<()> {
    let bin = build(true)?;
    let ns = NS.map(String::from);
    let lab = Lab::fresh(&ns, false);
    veth_pair(&ns, DEVS, ADDRS)?;
    let out_dir = root().join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    ibverbs_so::build(&root(), true)?;
    let bl = BenchLab {
        bin,
        ns: ns.clone(),
        devs: DEVS,
        addrs: ADDRS,
        out_dir: out_dir.clone(),
    };
    let records = alternated(&bl, quick);
    drop(lab);
    write_out("goals", &records, &alternated_table(&records, GOALS_AGAIN))
}

/// Writes `target/bench/{json}.json` (the records) and `{md}.md` (their
/// table), and prints the table.
pub(crate) fn write_out_as(json: &str, md_name: &str, records: &[Value], md: &str) -> Result<()> {
    let out_dir = root().join("target/bench");
    std::fs::write(
        out_dir.join(format!("{json}.json")),
        serde_json::to_string_pretty(records)?,
    )?;
    std::fs::write(out_dir.join(format!("{md_name}.md")), md)?;
    println!("{md}");
    println!("wrote target/bench/{json}.json and target/bench/{md_name}.md");
    Ok(())
}

/// [`write_out_as`] with one name for both files.
pub(crate) fn write_out(name: &str, records: &[Value], md: &str) -> Result<()> {
    write_out_as(name, name, records, md)
}

pub(crate) fn bench(quick: bool) -> Result<()> {
    let bin = build(true)?;
    let ns = NS.map(String::from);
    let lab = Lab::fresh(&ns, false);
    let (addrs, devs) = (ADDRS, DEVS);
    veth_pair(&ns, devs, addrs)?;
    let out_dir = root().join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    let (lat_n, bw_n) = if quick {
        ("2000", "20000")
    } else {
        ("20000", "200000")
    };
    let mut jobs: Vec<Job> = Vec::new();
    let j = |s: &str, from_server: bool| Job {
        args: s.split_whitespace().map(String::from).collect(),
        from_server,
        threaded_napi: false,
    };
    for t in ["write-lat", "read-lat", "send-lat"] {
        for s in [2, 64, 4096] {
            jobs.push(j(&format!("bench {t} -s {s} -n {lat_n}"), false));
        }
    }
    jobs.push(j(&format!("bench atomic-lat -s 8 -n {lat_n}"), false));
    for t in ["write-bw", "read-bw", "send-bw"] {
        for s in [64, 4096, 65536] {
            let n: u64 = bw_n.parse::<u64>()? / if s >= 65536 { 20 } else { 1 };
            jobs.push(j(&format!("bench {t} -s {s} -n {n}"), false));
        }
    }
    for s in [2, 64] {
        jobs.push(j(
            &format!("baseline afxdp-pingpong -s {s} -n {lat_n}"),
            false,
        ));
        jobs.push(j(
            &format!("baseline udp-pingpong -s {s} -n {lat_n}"),
            false,
        ));
        jobs.push(j(
            &format!("baseline tcp-pingpong -s {s} -n {lat_n}"),
            false,
        ));
    }
    for s in [64, 1024] {
        jobs.push(j(&format!("baseline afxdp-stream -s {s} -n {bw_n}"), true));
        jobs.push(j(&format!("baseline udp-stream -s {s} -n {bw_n}"), true));
    }
    jobs.push(j(
        &format!(
            "baseline tcp-stream -s 65536 -n {}",
            bw_n.parse::<u64>()? / 20
        ),
        true,
    ));
    let mut records: Vec<Value> = Vec::new();
    // The XDP responder beside the user path: latency with the
    // buffers in the MR pool, and write_bw with an adaptive target on each
    // path for the target's CPU per message.
    for s in [2, 64] {
        jobs.push(j(
            &format!("bench write-lat -s {s} -n {lat_n} --pool"),
            false,
        ));
    }
    // Atomics executed and READs answered by the XDP program (beside
    // atomic-lat and read-lat above).
    jobs.push(j(
        &format!("bench atomic-lat -s 8 -n {lat_n} --pool"),
        false,
    ));
    for s in [2, 64] {
        jobs.push(j(
            &format!("bench read-lat -s {s} -n {lat_n} --pool"),
            false,
        ));
    }
    let n64k = bw_n.parse::<u64>()? / 20;
    jobs.push(j(
        &format!("bench write-bw -s 65536 -n {n64k} --adaptive"),
        false,
    ));
    jobs.push(j(
        &format!("bench write-bw -s 65536 -n {n64k} --adaptive --pool"),
        false,
    ));
    // The received ICRC check's share of the XDP program's cost.
    jobs.push(j(
        &format!("bench write-bw -s 65536 -n {n64k} --adaptive --pool --no-icrc-check"),
        false,
    ));
    // On a veth, the receiver's XDP program and AF_XDP copy run in the
    // sender's softirq, on the sender's core: the XDP responder's work
    // (the ICRC in BPF) then competes with the sender. On a NIC it runs
    // on the receiving host. Threaded NAPI on the target's veth, pinned
    // to the target's core, gives that shape: both paths again.
    for pool in ["", " --pool"] {
        let mut job = j(
            &format!("bench write-bw -s 65536 -n {n64k} --adaptive{pool}"),
            false,
        );
        job.threaded_napi = true;
        jobs.push(job);
    }
    let total = jobs.len() + 1;
    let bl = BenchLab {
        bin: bin.clone(),
        ns: ns.clone(),
        devs,
        addrs,
        out_dir: out_dir.clone(),
    };
    for (k, job) in jobs.iter().enumerate() {
        eprintln!("[{}/{total}] {}", k + 1, job.args.join(" "));
        match bl.run(job) {
            Ok(v) => records.extend(v),
            Err(e) => eprintln!("   {e:#}"),
        }
    }
    // Unmodified perftest over the drop-in libibverbs, in the same run:
    // each tool with the library's data path thread spinning and adaptive.
    ibverbs_so::build(&root(), true)?;
    for (tool, size, n) in [
        ("write_lat", 2, lat_n),
        ("send_lat", 2, lat_n),
        ("write_bw", 65536, "2000"),
    ] {
        for polling in ["spin", "adaptive"] {
            eprintln!("[lib] ib_{tool} -s {size} -n {n} (data path {polling})");
            match perftest_over_library(&bin, &ns, &addrs, tool, size, n, polling, false) {
                Ok(v) => records.push(v),
                Err(e) => eprintln!("   failed: {e:#}"),
            }
        }
    }
    // The same tools with their buffers in the MR pool (RDMA_XDP_POOL=1):
    // the peer's WRITEs go to the XDP responder.
    for (tool, size, n) in [
        ("write_lat", 2, lat_n),
        ("send_lat", 2, lat_n),
        ("write_bw", 65536, "2000"),
    ] {
        eprintln!("[lib] ib_{tool} -s {size} -n {n} (data path adaptive, RDMA_XDP_POOL=1)");
        match perftest_over_library(&bin, &ns, &addrs, tool, size, n, "adaptive", true) {
            Ok(v) => records.push(v),
            Err(e) => eprintln!("   failed: {e:#}"),
        }
    }
    // The goals' ratios again, each pair back to back and alternated.
    records.extend(alternated(&bl, quick));
    eprintln!("[{total}/{total}] engine microbenchmark");
    let ej = out_dir.join("engine.json");
    let n = if quick { "200000" } else { "2000000" };
    sh(Command::new(&bin)
        .args(["baseline", "--engine", "-n", n, "--cpu", "0", "--json"])
        .arg(&ej)
        .stdout(Stdio::null()))?;
    records.extend(serde_json::from_str::<Vec<Value>>(
        &std::fs::read_to_string(&ej)?,
    )?);
    drop(lab);
    write_out_as("results", "summary", &records, &summary(&records))
}

/// The two namespaces of a bench run and where jobs write their JSON.
pub(crate) struct BenchLab {
    pub(crate) bin: std::path::PathBuf,
    pub(crate) ns: [String; 2],
    pub(crate) devs: [&'static str; 2],
    pub(crate) addrs: [&'static str; 2],
    pub(crate) out_dir: std::path::PathBuf,
}

impl BenchLab {
    /// Runs one job (server in namespace 1 on CPU 1, client in namespace 0
    /// on CPU 0) and returns its records.
    pub(crate) fn run(&self, job: &Job) -> Result<Vec<Value>> {
        let (bin, ns, devs, addrs) = (&self.bin, &self.ns, self.devs, self.addrs);
        let sj = self.out_dir.join("server.json");
        let cj = self.out_dir.join("client.json");
        let _ = std::fs::remove_file(&sj);
        let _ = std::fs::remove_file(&cj);
        let mut server = Command::new("ip")
            .args(["netns", "exec", &ns[1]])
            .arg(bin)
            .args(&job.args)
            .args(["--dev", devs[1], "--cpu", "1", "--json"])
            .arg(&sj)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        std::thread::sleep(Duration::from_millis(400));
        if job.threaded_napi {
            if let Err(e) = thread_napi(&ns[1], devs[1], 1) {
                let _ = server.kill();
                let _ = server.wait();
                anyhow::bail!("threaded NAPI: {e:#}");
            }
        }
        let mut cargs = job.args.clone();
        cargs.insert(2, addrs[1].to_string());
        let client = Command::new("ip")
            .args(["netns", "exec", &ns[0]])
            .arg(bin)
            .args(&cargs)
            .args(["--dev", devs[0], "--cpu", "0", "--json"])
            .arg(&cj)
            .output()?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline && server.try_wait()?.is_none() {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = server.kill();
        let sout = server.wait_with_output()?;
        if !client.status.success() {
            anyhow::bail!("failed: {}", String::from_utf8_lossy(&client.stderr).trim());
        }
        let file = if job.from_server { &sj } else { &cj };
        let Some(mut v) = read_json(file).and_then(|v| v.as_array().cloned()) else {
            anyhow::bail!(
                "no result ({})",
                String::from_utf8_lossy(&sout.stderr).trim()
            );
        };
        // write_bw's target reports its own CPU per message and its XDP
        // program's cost.
        let server = read_json(&sj).and_then(|s| s.as_array()?.last().cloned());
        if let (Some(s), Some(last)) = (server, v.last_mut()) {
            if let Some(c) = s.get("target_user_cpu_us_per_msg") {
                last["target_user_cpu_us_per_msg"] = c.clone();
            }
            if job.threaded_napi {
                last["target_napi"] = "threaded".into();
            }
            if last["test"] == "write_bw" {
                for (k, t) in [
                    ("xdp_ns_per_run", "target_xdp_ns_per_run"),
                    ("xdp_runs", "target_xdp_runs"),
                ] {
                    if let Some(x) = s.get(k) {
                        last[t] = x.clone();
                    }
                }
            }
        }
        Ok(v)
    }
}

/// One perftest run (server in namespace 1 on CPU 1, client in namespace 0
/// on CPU 0, both through `rdma-xdp exec`), as a record like bench's:
/// test `lib_<tool>_<polling>`.
#[allow(clippy::too_many_arguments)]
fn perftest_over_library(
    bin: &std::path::Path,
    ns: &[String; 2],
    addrs: &[&str; 2],
    tool: &str,
    size: u64,
    n: &str,
    polling: &str,
    pool: bool,
) -> Result<Value> {
    let run = |i: usize, server: Option<&str>| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &ns[i], "taskset", "-c", &i.to_string()])
            .arg(bin)
            .args(["exec", "--", &format!("ib_{tool}"), "-x", "1", "-s"])
            .arg(size.to_string())
            .args(["-n", n])
            .args(server)
            .env("RDMA_XDP_POLLING", polling)
            .env("RDMA_XDP_CPU", i.to_string())
            .env("RDMA_XDP_POOL", if pool { "1" } else { "0" })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    };
    let mut server = run(1, None).spawn()?;
    std::thread::sleep(Duration::from_millis(1500));
    let client = run(0, Some(addrs[1])).output()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline && server.try_wait()?.is_none() {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = server.kill();
    let _ = server.wait();
    let text = String::from_utf8_lossy(&client.stdout);
    let f: Vec<f64> = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&size.to_string()))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .ok_or_else(|| {
            anyhow::anyhow!(
                "no result line: {}",
                String::from_utf8_lossy(&client.stderr).trim()
            )
        })?;
    let test = format!("lib_{tool}_{polling}");
    let path = if pool { "xdp" } else { "user" };
    Ok(if tool.ends_with("_lat") {
        serde_json::json!({"test": test, "bytes": size, "iters": f.get(1), "path": path,
            "t_typical_us": f.get(4), "t_avg_us": f.get(5), "p99_us": f.get(7)})
    } else {
        // perftest's MB/sec is 2^20 bytes a second.
        let gbps = f.get(3).map(|mb| mb * 1048576.0 * 8.0 / 1e9);
        serde_json::json!({"test": test, "bytes": size, "iters": f.get(1), "path": path,
            "bw_avg_gbps": gbps, "msg_rate_mpps": f.get(4)})
    })
}

/// The user path's record of `test` at `bytes` (the XDP responder's and
/// the adaptive-target runs are found with [`find_path`]).
pub(crate) fn find<'a>(r: &'a [Value], test: &str, bytes: u64) -> Option<&'a Value> {
    r.iter().find(|x| {
        x["test"] == test
            && x["bytes"] == bytes
            && x["path"] != "xdp"
            && x.get("target_user_cpu_us_per_msg").is_none()
    })
}

/// The record of `test` at `bytes` on `path` ("xdp" or "user"), with or
/// without the target's CPU measured (the adaptive write_bw runs).
pub(crate) fn find_path<'a>(
    r: &'a [Value],
    test: &str,
    bytes: u64,
    path: &str,
    target_cpu: bool,
) -> Option<&'a Value> {
    r.iter().find(|x| {
        is_record(x, test, bytes, path)
            && x.get("target_user_cpu_us_per_msg").is_some() == target_cpu
            && x.get("target_napi").is_none()
    })
}

/// The record of a job run with the target's NAPI threaded.
fn find_threaded<'a>(r: &'a [Value], test: &str, bytes: u64, path: &str) -> Option<&'a Value> {
    r.iter()
        .find(|x| is_record(x, test, bytes, path) && x["target_napi"] == "threaded")
}

/// Whether `x` is a record of `test` at `bytes` on `path`.
fn is_record(x: &Value, test: &str, bytes: u64, path: &str) -> bool {
    x["test"] == test && x["bytes"] == bytes && x["path"] == path
}

/// Moves `dev`'s NAPI (in namespace `ns`) into kernel threads pinned to
/// `cpu`. A veth has NAPI only while an XDP program is attached: waits up
/// to 3 s for the server's.
fn thread_napi(ns: &str, dev: &str, cpu: u32) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let o = Command::new("ip")
            .args(["-n", ns, "link", "show", "dev", dev])
            .output()?;
        if String::from_utf8_lossy(&o.stdout).contains("prog/xdp") {
            break;
        }
        if Instant::now() > deadline {
            anyhow::bail!("no XDP program on {dev} after 3 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let ok = Command::new("ip")
        .args(["netns", "exec", ns, "sh", "-c"])
        .arg(format!("echo 1 > /sys/class/net/{dev}/threaded"))
        .status()?
        .success();
    if !ok {
        anyhow::bail!("{dev}: writing 1 to threaded failed");
    }
    // The threads are named napi/<dev>-<id> (cut to 15 characters).
    let prefix: String = format!("napi/{dev}-").chars().take(15).collect();
    let mut pinned = 0;
    for e in std::fs::read_dir("/proc")?.flatten() {
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.trim_end().starts_with(&prefix) {
            let pid = e.file_name().to_string_lossy().into_owned();
            if Command::new("taskset")
                .args(["-pc", &cpu.to_string(), &pid])
                .stdout(Stdio::null())
                .status()?
                .success()
            {
                pinned += 1;
            }
        }
    }
    if pinned == 0 {
        anyhow::bail!("no napi/{dev} thread to pin");
    }
    Ok(())
}

pub(crate) fn summary(r: &[Value]) -> String {
    let mut s = String::new();
    s += "| test | bytes | path | iters | t_typical us | t_avg us | p99 us | BW avg Gb/s | Mpps | target CPU us/msg | XDP ns/run |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
    let f = |v: &Value, k: &str| {
        v[k].as_f64()
            .map(|x| format!("{x:.2}"))
            .unwrap_or_else(|| "-".into())
    };
    for x in r.iter().filter(|x| x["test"] != "alternated") {
        s += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            x["test"].as_str().unwrap_or(""),
            x["bytes"],
            match x["target_napi"].as_str() {
                Some(n) => format!("{}, {n} NAPI", x["path"].as_str().unwrap_or("-")),
                None => x["path"].as_str().unwrap_or("-").to_string(),
            },
            x["iters"],
            f(x, "t_typical_us"),
            f(x, "t_avg_us"),
            f(x, "p99_us"),
            f(x, "bw_avg_gbps"),
            f(x, "msg_rate_mpps"),
            f(x, "target_user_cpu_us_per_msg"),
            // write_bw: the target's program (it places); else our own.
            match x.get("target_xdp_ns_per_run") {
                Some(_) => f(x, "target_xdp_ns_per_run"),
                None => f(x, "xdp_ns_per_run"),
            }
        );
    }
    s += "\n| target | measured | ratio | goal |\n|---|---|---|---|\n";
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "-".into(),
    };
    // One row of the target table.
    let row = |name: &str, a: Option<f64>, b: Option<f64>, goal: &str| {
        format!(
            "| {name} | {} / {} | {} | {goal} |\n",
            a.map(|x| format!("{x:.2}")).unwrap_or("-".into()),
            b.map(|x| format!("{x:.2}")).unwrap_or("-".into()),
            ratio(a, b)
        )
    };
    let tt = |t: &str, b: u64| find(r, t, b).and_then(|v| v["t_typical_us"].as_f64());
    let bw = |t: &str, b: u64| find(r, t, b).and_then(|v| v["bw_avg_gbps"].as_f64());
    let pps = |t: &str, b: u64| find(r, t, b).and_then(|v| v["msg_rate_mpps"].as_f64());
    for (name, a, b, goal) in [
        (
            "write_lat 2 B / afxdp_pingpong 2 B (t_typical)",
            tt("write_lat", 2),
            tt("afxdp_pingpong", 2),
            "<= 1.3",
        ),
        (
            "read_lat 2 B / afxdp_pingpong 2 B",
            tt("read_lat", 2),
            tt("afxdp_pingpong", 2),
            "<= 1.5",
        ),
        (
            "send_lat 2 B / afxdp_pingpong 2 B",
            tt("send_lat", 2),
            tt("afxdp_pingpong", 2),
            "<= 1.5",
        ),
        (
            "write_bw 65536 B / afxdp_stream 1024 B (Gb/s, same 1024 MTU)",
            bw("write_bw", 65536),
            bw("afxdp_stream", 1024),
            ">= 0.8",
        ),
        (
            "write_bw 64 B msg rate / afxdp_stream 64 B pps",
            pps("write_bw", 64),
            pps("afxdp_stream", 64),
            ">= 0.7",
        ),
        (
            "write_lat 64 B / tcp_pingpong 64 B",
            tt("write_lat", 64),
            tt("tcp_pingpong", 64),
            "< 1",
        ),
        (
            "send_lat 64 B / tcp_pingpong 64 B",
            tt("send_lat", 64),
            tt("tcp_pingpong", 64),
            "< 1",
        ),
    ] {
        s += &row(name, a, b, goal);
    }
    // The XDP responder, same run.
    let xtt = |b: u64| {
        find_path(r, "write_lat", b, "xdp", false).and_then(|v| v["t_typical_us"].as_f64())
    };
    let abw =
        |p: &str| find_path(r, "write_bw", 65536, p, true).and_then(|v| v["bw_avg_gbps"].as_f64());
    let xns = |p: &str| {
        find_path(r, "write_bw", 65536, p, true).and_then(|v| v["target_xdp_ns_per_run"].as_f64())
    };
    let cpu = |p: &str| {
        find_path(r, "write_bw", 65536, p, true)
            .and_then(|v| v["target_user_cpu_us_per_msg"].as_f64())
    };
    for (name, a, b, goal) in [
        (
            "XDP responder: write_lat 2 B / afxdp_pingpong 2 B",
            xtt(2),
            tt("afxdp_pingpong", 2),
            "<= 1.3 (aim 1.0)",
        ),
        (
            "XDP responder: write_lat 64 B / tcp_pingpong 64 B",
            xtt(64),
            tt("tcp_pingpong", 64),
            "< 1",
        ),
        (
            "XDP responder / user path: write_lat 2 B",
            xtt(2),
            tt("write_lat", 2),
            "-",
        ),
        (
            "XDP responder / user path: atomic_lat 8 B (round trip)",
            find_path(r, "atomic_lat", 8, "xdp", false).and_then(|v| v["t_typical_us"].as_f64()),
            tt("atomic_lat", 8),
            "-",
        ),
        (
            "XDP responder / user path: read_lat 2 B (round trip)",
            find_path(r, "read_lat", 2, "xdp", false).and_then(|v| v["t_typical_us"].as_f64()),
            tt("read_lat", 2),
            "-",
        ),
        (
            "XDP responder / user path: read_lat 64 B (round trip)",
            find_path(r, "read_lat", 64, "xdp", false).and_then(|v| v["t_typical_us"].as_f64()),
            tt("read_lat", 64),
            "-",
        ),
        (
            "XDP responder / user path: write_bw 64 KiB (adaptive targets, Gb/s)",
            abw("xdp"),
            abw("user"),
            ">= 1",
        ),
        (
            "target CPU us per 64 KiB WRITE: XDP responder / user path",
            cpu("xdp"),
            cpu("user"),
            "at or near 0",
        ),
        (
            "unmodified ib_write_lat 2 B over libibverbs (adaptive): RDMA_XDP_POOL=1 / without",
            find_path(r, "lib_write_lat_adaptive", 2, "xdp", false)
                .and_then(|v| v["t_typical_us"].as_f64()),
            tt("lib_write_lat_adaptive", 2),
            "-",
        ),
        (
            "unmodified ib_write_bw 64 KiB over libibverbs (adaptive, Gb/s): RDMA_XDP_POOL=1 / without",
            find_path(r, "lib_write_bw_adaptive", 65536, "xdp", false)
                .and_then(|v| v["bw_avg_gbps"].as_f64()),
            bw("lib_write_bw_adaptive", 65536),
            "-",
        ),
        (
            "XDP responder / user path: write_bw 64 KiB, the target's NAPI threaded on its core (as on a NIC)",
            find_threaded(r, "write_bw", 65536, "xdp").and_then(|v| v["bw_avg_gbps"].as_f64()),
            find_threaded(r, "write_bw", 65536, "user").and_then(|v| v["bw_avg_gbps"].as_f64()),
            ">= 1",
        ),
        (
            "target's XDP ns per run, write_bw 64 KiB: with the ICRC check / without",
            xns("xdp"),
            xns("xdp-no-icrc"),
            "-",
        ),
    ] {
        s += &row(name, a, b, goal);
    }
    // The library with its regions in the pool, against rdma-xdp bench on
    // the same path (write_lat: the XDP responder's; send_lat: SENDs are
    // the engine's either way; write_bw: the XDP responder's, adaptive
    // target, as perftest's server sleeps).
    let pooled = |t: &str, b: u64, k: &str| {
        find_path(r, &format!("lib_{t}_adaptive"), b, "xdp", false).and_then(|v| v[k].as_f64())
    };
    for (name, a, b, goal) in [
        (
            "unmodified ib_write_lat 2 B over libibverbs (adaptive, RDMA_XDP_POOL=1) / rdma-xdp bench write_lat 2 B (XDP responder)",
            pooled("write_lat", 2, "t_typical_us"),
            xtt(2),
            "<= 1.1",
        ),
        (
            "unmodified ib_send_lat 2 B over libibverbs (adaptive, RDMA_XDP_POOL=1) / rdma-xdp bench send_lat 2 B",
            pooled("send_lat", 2, "t_typical_us"),
            tt("send_lat", 2),
            "<= 1.1",
        ),
        (
            "unmodified ib_write_bw 65536 B over libibverbs (adaptive, RDMA_XDP_POOL=1) / rdma-xdp bench write_bw 65536 B (XDP responder)",
            pooled("write_bw", 65536, "bw_avg_gbps"),
            abw("xdp"),
            ">= 0.9",
        ),
    ] {
        s += &row(name, a, b, goal);
    }
    for polling in ["spin", "adaptive"] {
        let lib = |t: &str| format!("lib_{t}_{polling}");
        for (name, a, b, goal) in [
            (
                format!("unmodified ib_write_lat 2 B over libibverbs ({polling}) / rdma-xdp bench write_lat 2 B"),
                tt(&lib("write_lat"), 2),
                tt("write_lat", 2),
                "<= 1.1",
            ),
            (
                format!("unmodified ib_send_lat 2 B over libibverbs ({polling}) / rdma-xdp bench send_lat 2 B"),
                tt(&lib("send_lat"), 2),
                tt("send_lat", 2),
                "<= 1.1",
            ),
            (
                format!("unmodified ib_write_bw 65536 B over libibverbs ({polling}) / rdma-xdp bench write_bw 65536 B"),
                bw(&lib("write_bw"), 65536),
                bw("write_bw", 65536),
                ">= 0.9",
            ),
        ] {
            s += &row(&name, a, b, goal);
        }
    }
    if let Some(e) = find(r, "engine_write_64", 64) {
        let m = |k: &str| {
            e[k].as_f64()
                .map(|x| format!("{x:.2}"))
                .unwrap_or("-".into())
        };
        s += &format!(
            "| engine 64 B WRITEs, M frames/s: engine only / with the data path's framing and ICRC (for reference) | {} / {} | - | >= 5 (engine only) |\n",
            m("engine_only_mpps"),
            m("msg_rate_mpps")
        );
    }
    s += &alternated_table(r, GOALS_AGAIN);
    s
}

/// One side of a goal's ratio.
enum Side {
    Job(Job),
    /// Unmodified perftest over the library, adaptive, its buffers in the
    /// MR pool: (tool, bytes, iterations).
    Lib(&'static str, u64, String),
}

/// The goals' ratios measured again, each pair's two sides back to back
/// for `rounds` rounds, the order flipped every round. This machine
/// drifts by up to 1.5x within minutes, so the ratios of the table above,
/// whose sides ran minutes apart, move with its phase; these do not.
/// One record per pair: both sides' values, the ratio of each round and
/// their median.
///
/// Latency runs take 20 000 iterations even with `quick` (2 000 are 10 ms
/// of measurement here, less than the machine's own jitter). Whole runs
/// fall into a fast or a slow mode here (the raw AF_XDP ping-pong, 200 000
/// iterations each: 2.17 or 3.15 us), so there are many short rounds and
/// the median of their ratios: 5 with `quick`, else 9.
fn alternated(bl: &BenchLab, quick: bool) -> Vec<Value> {
    let rounds = if quick { 5 } else { 9 };
    let lat_n = "20000";
    let n64k = 2000;
    let job = |s: String| {
        Side::Job(Job {
            args: s.split_whitespace().map(String::from).collect(),
            from_server: false,
            threaded_napi: false,
        })
    };
    let pairs = [
        (
            "XDP responder write_lat 2 B / raw AF_XDP ping-pong 2 B",
            "<= 1.3",
            "t_typical_us",
            job(format!("bench write-lat -s 2 -n {lat_n} --pool")),
            job(format!("baseline afxdp-pingpong -s 2 -n {lat_n}")),
        ),
        (
            "XDP responder write_lat 64 B / TCP_NODELAY ping-pong 64 B",
            "< 1",
            "t_typical_us",
            job(format!("bench write-lat -s 64 -n {lat_n} --pool")),
            job(format!("baseline tcp-pingpong -s 64 -n {lat_n}")),
        ),
        (
            "write_bw 64 KiB, adaptive target: XDP responder / user path",
            ">= 1",
            "bw_avg_gbps",
            job(format!("bench write-bw -s 65536 -n {n64k} --adaptive --pool")),
            job(format!("bench write-bw -s 65536 -n {n64k} --adaptive")),
        ),
        (
            "unmodified ib_write_lat 2 B over the library (pool) / rdma-xdp bench write_lat 2 B (XDP responder)",
            "<= 1.1",
            "t_typical_us",
            Side::Lib("write_lat", 2, lat_n.to_string()),
            job(format!("bench write-lat -s 2 -n {lat_n} --pool")),
        ),
        (
            "unmodified ib_send_lat 2 B over the library (pool) / rdma-xdp bench send_lat 2 B",
            "<= 1.1",
            "t_typical_us",
            Side::Lib("send_lat", 2, lat_n.to_string()),
            job(format!("bench send-lat -s 2 -n {lat_n}")),
        ),
        (
            "unmodified ib_write_bw 64 KiB over the library (pool) / rdma-xdp bench write_bw 64 KiB (XDP responder, adaptive)",
            ">= 0.9",
            "bw_avg_gbps",
            Side::Lib("write_bw", 65536, "2000".to_string()),
            job(format!("bench write-bw -s 65536 -n {n64k} --adaptive --pool")),
        ),
    ];
    let measure = |side: &Side, key: &str| -> Result<f64> {
        let v = match side {
            Side::Job(j) => bl
                .run(j)?
                .into_iter()
                .rev()
                .find(|x| x[key].is_number())
                .ok_or_else(|| anyhow::anyhow!("no {key} in the records"))?,
            Side::Lib(tool, size, n) => {
                perftest_over_library(&bl.bin, &bl.ns, &bl.addrs, tool, *size, n, "adaptive", true)?
            }
        };
        v[key]
            .as_f64()
            .ok_or_else(|| anyhow::anyhow!("no {key} in the record"))
    };
    let pairs: Vec<Pair> = pairs
        .iter()
        .map(|(name, goal, key, a, b)| Pair {
            name,
            goal,
            metric: key,
            a: Box::new(move || measure(a, key)),
            b: Box::new(move || measure(b, key)),
        })
        .collect();
    alternate(&pairs, rounds)
}

/// A goal's ratio A / B, each side a measurement that returns the metric.
pub(crate) struct Pair<'a> {
    pub(crate) name: &'a str,
    pub(crate) goal: &'a str,
    pub(crate) metric: &'a str,
    pub(crate) a: Box<dyn Fn() -> Result<f64> + 'a>,
    pub(crate) b: Box<dyn Fn() -> Result<f64> + 'a>,
}

/// Measures each pair's two sides back to back for `rounds` rounds, the
/// order flipped every round; one record per pair (see [`alternated`]).
pub(crate) fn alternate(pairs: &[Pair], rounds: usize) -> Vec<Value> {
    let mut out = Vec::new();
    for (k, p) in pairs.iter().enumerate() {
        eprintln!(
            "[alternated {}/{}] {}, {rounds} rounds",
            k + 1,
            pairs.len(),
            p.name
        );
        let (mut va, mut vb, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            // A then B, then B then A: a drift within a round weighs on
            // both sides alike over the rounds.
            let first_a = round % 2 == 0;
            let sides = if first_a { [&p.a, &p.b] } else { [&p.b, &p.a] };
            let mut got = [None, None];
            for (i, side) in sides.iter().enumerate() {
                match side() {
                    Ok(x) => got[i] = Some(x),
                    Err(e) => eprintln!("   {e:#}"),
                }
            }
            let (x, y) = if first_a {
                (got[0], got[1])
            } else {
                (got[1], got[0])
            };
            if let (Some(x), Some(y)) = (x, y) {
                if y > 0.0 {
                    va.push(x);
                    vb.push(y);
                    ratios.push(x / y);
                }
            }
        }
        out.push(serde_json::json!({
            "test": "alternated", "name": p.name, "goal": p.goal, "metric": p.metric,
            "a": va, "b": vb, "ratios": ratios, "median_ratio": median(&ratios),
        }));
    }
    out
}

fn median(x: &[f64]) -> Option<f64> {
    let mut v = x.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[n / 2]),
        n => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

const GOALS_AGAIN: &str =
    "The goals again, each pair's sides back to back, the order flipped every round:";

/// The alternated records as a table, after `intro`.
pub(crate) fn alternated_table(r: &[Value], intro: &str) -> String {
    let rows: Vec<&Value> = r.iter().filter(|x| x["test"] == "alternated").collect();
    if rows.is_empty() {
        return String::new();
    }
    let list = |v: &Value| {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_f64)
                    .map(|x| format!("{x:.2}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    };
    let mut s = format!(
        "\n{intro}\n\n| target | A | B | ratio per round | median | goal |\n|---|---|---|---|---|---|\n"
    );
    for x in rows {
        s += &format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            x["name"].as_str().unwrap_or(""),
            list(&x["a"]),
            list(&x["b"]),
            list(&x["ratios"]),
            x["median_ratio"]
                .as_f64()
                .map(|m| format!("{m:.2}"))
                .unwrap_or("-".into()),
            x["goal"].as_str().unwrap_or(""),
        );
    }
    s
}
