//! `cargo xtask bench --cm`: RDMA CM connection setup, measured with
//! unmodified Debian `cmtime` (all connections in flight at once) and with
//! `cm_cycles` (one connection at a time, each timed: p50/p99), for our
//! stack host to host over the drop-in librdmacm, and in one run on the
//! rxe VMs: rxe to rxe, ours to rxe and rxe to ours. Writes
//! `target/bench/cm.json` and `target/bench/cm.md`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rxevm::{Bounded, GuestJob, VmId};
use serde_json::{json, Value};

use crate::{lab::*, root, setup::build};

/// Where one side of a pair runs.
#[derive(Clone, Copy)]
enum Place<'a> {
    /// Ours, in a namespace of the veth pair, over the library on `dev`.
    /// Not pinned: each side's CM thread, data path thread and program
    /// share the two cores as the scheduler sees fit (pinning a side to one
    /// core made its CM thread wait behind the spinning data path).
    Ns { ns: &'a str, dev: &'a str },
    /// Ours, in the VM lab's host namespace, over the library on its tap
    /// bridge end.
    VmHost,
    /// rxe in a VM.
    Guest(VmId),
}

impl Place<'_> {
    fn is_ours(&self) -> bool {
        !matches!(self, Place::Guest(_))
    }
}

/// A server that was started and is stopped once its client is done.
enum Server {
    Host(Bounded),
    Guest(GuestJob),
}

/// The tools and the places they run.
struct Runner<'a> {
    bin: &'a Path,
    vms: Option<&'a rxevm::Lab>,
    /// `cm_cycles` on the host; in a guest it is at [`GUEST_CYCLES`].
    cycles_exe: &'a Path,
}

const GUEST_CYCLES: &str = "/tmp/cm_cycles";

impl Runner<'_> {
    fn host_cmd(&self, at: Place, argv: &[String]) -> Result<Command> {
        let argv: Vec<String> = argv
            .iter()
            .map(|a| {
                if a == "CM_CYCLES" {
                    self.cycles_exe.to_string_lossy().into_owned()
                } else {
                    a.clone()
                }
            })
            .collect();
        Ok(match at {
            Place::Ns { ns, dev } => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns])
                    .arg(self.bin)
                    .args(["--iface", dev, "exec", "--"])
                    .args(&argv);
                c
            }
            Place::VmHost => {
                let mut c = self.vm()?.host(self.bin);
                c.args(["--iface", "rxehost0", "exec", "--"]).args(&argv);
                c
            }
            Place::Guest(_) => unreachable!("guest commands run through the agent"),
        })
    }

    fn vm(&self) -> Result<&rxevm::Lab> {
        self.vms.context("no VMs in this run")
    }

    fn guest_line(argv: &[String]) -> String {
        argv.iter()
            .map(|a| if a == "CM_CYCLES" { GUEST_CYCLES } else { a })
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn start(&self, at: Place, argv: &[String]) -> Result<Server> {
        Ok(match at {
            Place::Guest(id) => Server::Guest(self.vm()?.spawn(id, &Self::guest_line(argv))?),
            _ => Server::Host(Bounded::spawn(&mut self.host_cmd(at, argv)?)?),
        })
    }

    /// Runs a client to its end: (exited 0, stdout, stderr).
    fn run(&self, at: Place, argv: &[String], timeout: Duration) -> Result<(bool, String, String)> {
        Ok(match at {
            Place::Guest(id) => {
                let o = self.vm()?.exec(id, &Self::guest_line(argv), timeout)?;
                (o.success(), o.stdout, o.stderr)
            }
            _ => {
                let (o, timed_out) =
                    Bounded::spawn(&mut self.host_cmd(at, argv)?)?.wait(timeout)?;
                (
                    o.status.success() && !timed_out,
                    String::from_utf8_lossy(&o.stdout).into_owned(),
                    String::from_utf8_lossy(&o.stderr).into_owned(),
                )
            }
        })
    }

    /// Waits up to `timeout` for a server that ends by itself, then stops
    /// it; returns its stdout.
    fn finish(&self, s: Server, timeout: Duration) -> Result<String> {
        Ok(match s {
            Server::Host(b) => String::from_utf8_lossy(&b.wait(timeout)?.0.stdout).into_owned(),
            Server::Guest(job) => self.vm()?.wait(&job, timeout)?.stdout,
        })
    }
}

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

/// cmtime's step table: `step : total_ms max_ms min_us us_per_conn`.
fn parse_cmtime(out: &str) -> Vec<(String, [f64; 4])> {
    out.lines()
        .filter_map(|l| {
            let (step, nums) = l.split_once(':')?;
            let v: Vec<f64> = nums
                .split_whitespace()
                .map(|x| x.parse().ok())
                .collect::<Option<_>>()?;
            let v: [f64; 4] = v.try_into().ok()?;
            Some((step.trim().to_string(), v))
        })
        .collect()
}

/// `cmtime -c n` between `client` and `server`: the step table as a record.
fn cmtime(r: &Runner, client: Place, server: Place, srv_addr: &str, n: u32) -> Result<Value> {
    let s = r.start(server, &args(&format!("cmtime -c {n}")))?;
    std::thread::sleep(Duration::from_millis(1500));
    let run = r.run(
        client,
        &args(&format!("cmtime -s {srv_addr} -c {n}")),
        Duration::from_secs(300),
    );
    // cmtime's server serves until stopped.
    let _ = r.finish(s, Duration::ZERO);
    let (ok, out, err) = run?;
    if !ok {
        bail!("cmtime client failed: {}", err.trim());
    }
    if let Some(l) = out.lines().chain(err.lines()).find(|l| l.contains("fail")) {
        bail!("cmtime reports {l:?}");
    }
    let steps = parse_cmtime(&out);
    let get = |name: &str| steps.iter().find(|(s, _)| s == name).map(|(_, v)| *v);
    let Some(connect) = get("connect") else {
        bail!("no connect step in cmtime's output:\n{out}");
    };
    // Setup: everything up to an established connection.
    let setup_ms: f64 = [
        "create id",
        "resolve addr",
        "resolve route",
        "create qp",
        "connect",
    ]
    .iter()
    .filter_map(|s| get(s).map(|v| v[0]))
    .sum();
    let mut rec = json!({
        "test": "cmtime",
        "conns": n,
        "connect_total_ms": connect[0],
        "connect_max_ms": connect[1],
        "connect_min_us": connect[2],
        "setup_total_ms": setup_ms,
        "conn_per_s": f64::from(n) * 1000.0 / setup_ms,
    });
    for (step, v) in &steps {
        rec["steps"][step] = json!({"total_ms": v[0], "max_ms": v[1], "min_us": v[2]});
    }
    Ok(rec)
}

/// The numbers after `key` in `line` (whitespace separated words).
fn after(line: &str, key: &str) -> Option<f64> {
    let w: Vec<&str> = line.split_whitespace().collect();
    let i = w.iter().position(|x| *x == key)?;
    w.get(i + 1)?.trim_end_matches(',').parse().ok()
}

/// `cm_cycles` for `n` cycles: per-connection setup percentiles and the
/// cycle rate from the client, descriptors from both sides.
fn cycles(r: &Runner, client: Place, server: Place, srv_addr: &str, n: u32) -> Result<Value> {
    let s = r.start(
        server,
        &args(&format!("CM_CYCLES server {srv_addr} 7500 {n}")),
    )?;
    std::thread::sleep(Duration::from_millis(1500));
    let run = r.run(
        client,
        &args(&format!("CM_CYCLES client {srv_addr} 7500 {n}")),
        Duration::from_secs(1800),
    );
    let sout = r.finish(s, Duration::from_secs(30))?;
    let (ok, out, err) = run?;
    if !ok {
        bail!("cm_cycles client failed: {}", err.trim());
    }
    let line = |o: &str, p: &str| o.lines().find(|l| l.starts_with(p)).map(String::from);
    let (Some(c), Some(t)) = (line(&out, "cycles "), line(&out, "setup_us ")) else {
        bail!("no result lines from cm_cycles:\n{out}{err}");
    };
    let fds = |l: &str| {
        let w: Vec<&str> = l.split_whitespace().collect();
        // "... descriptors after 10 A, at the end B"
        let a = w
            .get(w.len().saturating_sub(5))?
            .trim_end_matches(',')
            .parse::<u64>()
            .ok()?;
        Some((a, w.last()?.parse::<u64>().ok()?))
    };
    let server_fds = line(&sout, "cycles ").as_deref().and_then(fds);
    Ok(json!({
        "test": "cycles",
        "conns": n,
        "setup_p50_us": after(&t, "p50"),
        "setup_p99_us": after(&t, "p99"),
        "setup_max_us": after(&t, "max"),
        "cycles_per_s": after(&t, "cycles_per_s"),
        "client_fds": fds(&c),
        "server_fds": server_fds,
    }))
}

/// Builds `cm_cycles` (Debian's librdmacm-dev) into target/bench.
fn build_cycles(out_dir: &Path) -> Result<PathBuf> {
    let exe = out_dir.join("cm_cycles");
    let src = root().join("rdma-user/tests/data/cm_cycles.c");
    let o = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-lrdmacm")
        .output()
        .context("cc")?;
    if !o.status.success() {
        bail!(
            "cc cm_cycles.c (needs librdmacm-dev: cargo xtask setup): {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(exe)
}

/// One pair's two measurements, labelled; a failure is printed and kept.
fn measure(
    r: &Runner,
    label: &str,
    link: &str,
    (client, server, addr): (Place, Place, &str),
    (cm_n, cycles_n): (u32, u32),
    records: &mut Vec<Value>,
) {
    let implm = match (client.is_ours(), server.is_ours()) {
        (true, true) => "ours",
        (false, false) => "rxe",
        (true, false) => "ours->rxe",
        (false, true) => "rxe->ours",
    };
    for (what, res) in [
        ("cmtime", cmtime(r, client, server, addr, cm_n)),
        ("cycles", cycles(r, client, server, addr, cycles_n)),
    ] {
        match res {
            Ok(mut v) => {
                v["pair"] = json!(label);
                v["impl"] = json!(implm);
                v["link"] = json!(link);
                eprintln!("   {label} {what}: {v}");
                records.push(v);
            }
            Err(e) => eprintln!("   {label} {what} failed: {e:#}"),
        }
    }
}

pub(crate) fn bench_cm(quick: bool, cycles_n: Option<u32>, vms: bool) -> Result<()> {
    let bin = build(true)?;
    ibverbs_so::build(&root(), true).context("build the drop-in librdmacm")?;
    let out_dir = root().join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    let exe = build_cycles(&out_dir)?;
    let cycles_n = cycles_n.unwrap_or(if quick { 300 } else { 2000 });
    let (host_cm, vm_cm) = if quick { (200, 50) } else { (1000, 100) };
    let mut records = Vec::new();

    // Host to host, ours on both sides.
    let ns = ["rdmacm-a".to_string(), "rdmacm-b".to_string()];
    let lab = Lab::fresh(&ns, false);
    let devs = ["rcm-a", "rcm-b"];
    let addrs = ["10.88.0.1", "10.88.0.2"];
    veth_pair(&ns, devs, addrs)?;
    let r = Runner {
        bin: &bin,
        vms: None,
        cycles_exe: &exe,
    };
    let a = Place::Ns {
        ns: &ns[0],
        dev: devs[0],
    };
    let b = Place::Ns {
        ns: &ns[1],
        dev: devs[1],
    };
    eprintln!("[cm] ours <-> ours, veth: cmtime -c {host_cm}, {cycles_n} cycles");
    measure(
        &r,
        "ours -> ours",
        "veth",
        (a, b, addrs[1]),
        (host_cm, cycles_n),
        &mut records,
    );
    drop(lab);

    if vms {
        let (vlab, booted) = crate::interop::boot(&[VmId::A, VmId::B], false)?;
        eprintln!("[cm] rxe VMs: {booted}");
        for id in [VmId::A, VmId::B] {
            vlab.put_file(id, &exe, GUEST_CYCLES, 0o755)
                .with_context(|| format!("copy cm_cycles into VM {id}"))?;
        }
        let r = Runner {
            bin: &bin,
            vms: Some(&vlab),
            cycles_exe: &exe,
        };
        let (ga, gb) = (Place::Guest(VmId::A), Place::Guest(VmId::B));
        let (ip_a, host) = (VmId::A.ip().to_string(), rxevm::net::HOST_IP);
        for (label, pair) in [
            ("rxe b -> rxe a", (gb, ga, ip_a.as_str())),
            ("ours (host) -> rxe a", (Place::VmHost, ga, ip_a.as_str())),
            ("rxe a -> ours (host)", (ga, Place::VmHost, host)),
        ] {
            eprintln!("[cm] {label}: cmtime -c {vm_cm}, {cycles_n} cycles");
            measure(&r, label, "vm", pair, (vm_cm, cycles_n), &mut records);
        }
    }
    crate::bench::write_out("cm", &records, &table(&records))
}

fn table(records: &[Value]) -> String {
    let f = |v: &Value, k: &str, prec: usize| {
        v[k].as_f64()
            .map(|x| format!("{x:.prec$}"))
            .unwrap_or_else(|| "-".into())
    };
    let fds = |v: &Value| match (&v["client_fds"], &v["server_fds"]) {
        (Value::Array(c), Value::Array(s)) => format!("{}/{}, {}/{}", c[0], c[1], s[0], s[1]),
        (Value::Array(c), _) => format!("{}/{}, -", c[0], c[1]),
        _ => "-".into(),
    };
    let mut s = String::from(
        "| client -> server | link | cmtime conns | connect total ms | setup conn/s | cycles | setup p50 us | p99 us | max us | cycles/s | fds after 10/end (client, server) |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut pairs: Vec<&str> = records.iter().filter_map(|v| v["pair"].as_str()).collect();
    pairs.dedup();
    for p in pairs {
        let of = |t: &str| records.iter().find(|v| v["pair"] == p && v["test"] == t);
        let (cm, cy) = (of("cmtime"), of("cycles"));
        let link = cm.or(cy).and_then(|v| v["link"].as_str()).unwrap_or("-");
        let cm_cols = cm.map_or("- | - | -".into(), |v| {
            format!(
                "{} | {} | {}",
                v["conns"],
                f(v, "connect_total_ms", 1),
                f(v, "conn_per_s", 0)
            )
        });
        let cy_cols = cy.map_or("- | - | - | - | - | -".into(), |v| {
            format!(
                "{} | {} | {} | {} | {} | {}",
                v["conns"],
                f(v, "setup_p50_us", 0),
                f(v, "setup_p99_us", 0),
                f(v, "setup_max_us", 0),
                f(v, "cycles_per_s", 1),
                fds(v)
            )
        });
        s.push_str(&format!("| {p} | {link} | {cm_cols} | {cy_cols} |\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmtimes_step_table_parses() {
        let out = "step              total ms     max ms     min us  us / conn\ncreate id    :       1.91       0.55       0.00       1.91\nconnect      :    2810.10    2780.00    6705.00    2810.10\n";
        let s = parse_cmtime(out);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].0, "create id");
        assert_eq!(s[1].1, [2810.10, 2780.00, 6705.00, 2810.10]);
    }

    #[test]
    fn cycle_lines_parse() {
        let t = "setup_us p50 812 p99 2301 max 9100 cycles_per_s 221.5";
        assert_eq!(after(t, "p50"), Some(812.0));
        assert_eq!(after(t, "cycles_per_s"), Some(221.5));
        assert_eq!(after(t, "p95"), None);
    }
}
