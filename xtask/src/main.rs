//! `cargo xtask`: set up, build, demo, test, run.
//!
//! - `cargo xtask demo`: install what is missing, build, and run the two-host
//!   demo on a veth pair between two network namespaces, checking its results.
//! - `cargo xtask test`: install what is missing (tshark too), run every test.
//! - `cargo xtask run -- ARGS`: build and run the `rdma` binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Parser, Subcommand};
use serde_json::{json, Value};

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Two namespaces, a daemon in each, RDMA WRITE/READ/SEND/FETCH_ADD between them.
    Demo {
        /// Keep the namespaces and daemons running afterwards.
        #[arg(long)]
        keep: bool,
    },
    /// Run every test (unit, simulation, captures, namespaces).
    Test {
        /// Extra arguments for `cargo test` (e.g. a test name filter).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// Interoperate with Linux rxe (rdma-core, perftest) in a VM: both roles.
    Interop {
        /// Only the quick subset (what `cargo xtask test` runs).
        #[arg(long)]
        quick: bool,
        /// Leave the VM running afterwards.
        #[arg(long)]
        keep_vm: bool,
        /// Run only the cases whose name contains this.
        #[arg(long)]
        only: Option<String>,
    },
    /// perftest-style benchmarks, same-link baselines and the engine
    /// microbenchmark on a veth pair; writes target/bench/results.json.
    Bench {
        /// Fewer iterations (a quick look, noisier numbers).
        #[arg(long)]
        quick: bool,
    },
    /// Verified mixed RDMA workload through the seeded impairment relay:
    /// clean, 5 % loss, 5 % reordering, 1 % duplication, 0.1 % corruption,
    /// and all combined; prints losses (must be 0) and goodput per fault.
    Soak {
        /// Operations per fault configuration.
        #[arg(long, default_value_t = 100_000)]
        ops: u64,
        /// Seed of the relay and of the workload.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Build and run `rdma` with these arguments.
    Run {
        #[arg(long)]
        release: bool,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Check (and with --install, install) the prerequisites.
    Setup {
        #[arg(long)]
        install: bool,
    },
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn main() {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Demo { keep } => prereqs(true, false).and_then(|_| demo(keep)),
        Cmd::Test { args } => prereqs(true, true).and_then(|_| test(&args)),
        Cmd::Interop {
            quick,
            keep_vm,
            only,
        } => prereqs(true, false).and_then(|_| interop(quick, keep_vm, only.as_deref())),
        Cmd::Bench { quick } => prereqs(true, false).and_then(|_| bench(quick)),
        Cmd::Soak { ops, seed } => prereqs(true, false).and_then(|_| soak(ops, seed)),
        Cmd::Run { release, args } => prereqs(false, false).and_then(|_| run(release, &args)),
        Cmd::Setup { install } => prereqs(install, install),
    };
    if let Err(e) = r {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn have(cmd: &str, args: &[&str]) -> Option<String> {
    Command::new(cmd)
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
}

fn sh(cmd: &mut Command) -> Result<()> {
    let st = cmd
        .status()
        .with_context(|| format!("run {:?}", cmd.get_program()))?;
    if !st.success() {
        bail!("{:?} failed ({st})", cmd);
    }
    Ok(())
}

const BPF_LINKER: &str = "0.10.4";

/// How to install one missing prerequisite.
type Installer = Box<dyn Fn() -> Result<()>>;

/// Each missing prerequisite is one line: what is missing and how to get it.
/// With `install`, missing pieces are installed instead.
fn prereqs(install: bool, for_tests: bool) -> Result<()> {
    let mut missing: Vec<(String, Installer)> = Vec::new();
    let is_root = have("id", &["-u"])
        .map(|s| s.trim() == "0")
        .unwrap_or(false);
    if !is_root {
        bail!("must run as root (XDP, AF_XDP and network namespaces need CAP_BPF/CAP_NET_ADMIN): use sudo");
    }
    if have("rustup", &["--version"]).is_none() {
        bail!("rustup is missing: install it from https://rustup.rs, then rerun");
    }
    let nightly = have("rustup", &["toolchain", "list"])
        .map(|s| s.lines().any(|l| l.starts_with("nightly")))
        .unwrap_or(false);
    if !nightly {
        missing.push((
            "the nightly toolchain (builds the eBPF crate): rustup toolchain install nightly --component rust-src".into(),
            Box::new(|| sh(Command::new("rustup").args(["toolchain", "install", "nightly", "--profile", "minimal", "--component", "rust-src"]))),
        ));
    }
    let src = have(
        "rustup",
        &["component", "list", "--installed", "--toolchain", "nightly"],
    )
    .map(|s| s.lines().any(|l| l.starts_with("rust-src")))
    .unwrap_or(false);
    if nightly && !src {
        missing.push((
            "rust-src for nightly (eBPF build-std): rustup component add rust-src --toolchain nightly".into(),
            Box::new(|| sh(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))),
        ));
    }
    let linker = have("bpf-linker", &["--version"]).unwrap_or_default();
    if !linker.contains(BPF_LINKER) {
        missing.push((
            format!("bpf-linker {BPF_LINKER} (links the eBPF object; others fail here): cargo install bpf-linker@{BPF_LINKER} --locked"),
            Box::new(|| sh(Command::new("cargo").args(["install", &format!("bpf-linker@{BPF_LINKER}"), "--locked", "--force"]))),
        ));
    }
    let mut debs: Vec<&str> = Vec::new();
    if have("ip", &["-V"]).is_none() {
        debs.push("iproute2");
    }
    if for_tests && have("tshark", &["--version"]).is_none() {
        debs.push("tshark");
    }
    if for_tests && have("ping", &["-V"]).is_none() {
        debs.push("iputils-ping");
    }
    if !debs.is_empty() {
        let list = debs.join(" ");
        missing.push((
            format!("Debian packages {list}: apt-get install -y {list}"),
            Box::new(move || {
                sh(Command::new("apt-get").arg("update").stdout(Stdio::null()))?;
                sh(Command::new("apt-get")
                    .args(["install", "-y", "--no-install-recommends"])
                    .args(list.split(' '))
                    .env("DEBIAN_FRONTEND", "noninteractive")
                    .stdout(Stdio::null()))
            }),
        ));
    }
    if missing.is_empty() {
        return Ok(());
    }
    if !install {
        for (what, _) in &missing {
            eprintln!("missing: {what}");
        }
        bail!("prerequisites missing; `cargo xtask setup --install` installs them all");
    }
    for (what, f) in &missing {
        eprintln!("installing {}", what.split(':').next().unwrap_or(what));
        f().with_context(|| format!("installing {what}"))?;
    }
    Ok(())
}

fn build(release: bool) -> Result<PathBuf> {
    let mut c = Command::new("cargo");
    c.current_dir(root())
        .args(["build", "--quiet", "-p", "rdma-user", "--bins"]);
    if release {
        c.arg("--release");
    }
    sh(&mut c).context("build rdma-user")?;
    Ok(root()
        .join("target")
        .join(if release { "release" } else { "debug" })
        .join("rdma-xdp"))
}

fn run(release: bool, args: &[String]) -> Result<()> {
    let bin = build(release)?;
    let st = Command::new(bin).args(args).status()?;
    std::process::exit(st.code().unwrap_or(1));
}

fn test(args: &[String]) -> Result<()> {
    // Unit, simulation, capture and namespace tests; the namespace tests
    // serialize themselves (two cores: one data path pair at a time).
    let mut c = Command::new("cargo");
    c.current_dir(root())
        .args(["test", "--workspace", "--exclude", "rdma-ebpf"]);
    c.args(args);
    sh(&mut c).context("tests failed")?;
    if !args.is_empty() {
        return Ok(());
    }
    // Then interoperability with Linux rxe in a VM (the quick subset:
    // rc_pingpong both roles at 64 B and 4 KiB, perftest send_lat and
    // read_bw); `cargo xtask interop` runs the whole matrix.
    println!("interop with Linux rxe (quick subset)");
    interop(true, false, None)
}

/// Namespaces, veth and daemons of the demo; removed on drop, even on error.
struct Lab {
    ns: Vec<String>,
    pids: Vec<u32>,
    keep: bool,
}

impl Drop for Lab {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        for pid in &self.pids {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        for pid in &self.pids {
            while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
        for ns in &self.ns {
            netns_del(ns);
        }
    }
}

impl Lab {
    /// Namespaces by these names, removing any a crashed run left behind.
    fn fresh(ns: &[String], keep: bool) -> Lab {
        for n in ns {
            netns_del(n);
        }
        Lab {
            ns: ns.to_vec(),
            pids: Vec::new(),
            keep,
        }
    }
}

/// Deletes a namespace if it exists (and what lives only in it).
fn netns_del(ns: &str) {
    let _ = Command::new("ip")
        .args(["netns", "del", ns])
        .stderr(Stdio::null())
        .status();
}

fn ip(args: &[&str]) -> Result<()> {
    sh(Command::new("ip").args(args))
}

/// Two namespaces joined by a veth pair, addressed and up.
fn veth_pair(ns: &[String; 2], devs: [&str; 2], addrs: [&str; 2]) -> Result<()> {
    for n in ns {
        ip(&["netns", "add", n])?;
    }
    ip(&[
        "link", "add", devs[0], "type", "veth", "peer", "name", devs[1],
    ])?;
    for i in 0..2 {
        ip(&["link", "set", devs[i], "netns", &ns[i]])?;
        ip(&[
            "-n",
            &ns[i],
            "addr",
            "add",
            &format!("{}/24", addrs[i]),
            "dev",
            devs[i],
        ])?;
        ip(&["-n", &ns[i], "link", "set", devs[i], "up"])?;
        ip(&["-n", &ns[i], "link", "set", "lo", "up"])?;
    }
    Ok(())
}

/// Host A - relay - host B: three namespaces, the relay's two veth ends
/// without addresses.
fn relay_topology(ns: &[String; 3], devs: [&str; 4], addrs: [&str; 2]) -> Result<()> {
    for n in ns {
        ip(&["netns", "add", n])?;
    }
    for (host, (hdev, rdev), addr) in [
        (0, (devs[0], devs[1]), addrs[0]),
        (2, (devs[3], devs[2]), addrs[1]),
    ] {
        ip(&["link", "add", hdev, "type", "veth", "peer", "name", rdev])?;
        ip(&["link", "set", hdev, "netns", &ns[host]])?;
        ip(&["link", "set", rdev, "netns", &ns[1]])?;
        ip(&[
            "-n",
            &ns[host],
            "addr",
            "add",
            &format!("{addr}/24"),
            "dev",
            hdev,
        ])?;
        for (n, d) in [(&ns[host], hdev), (&ns[1], rdev)] {
            ip(&["-n", n, "link", "set", d, "up"])?;
            ip(&["-n", n, "link", "set", "lo", "up"])?;
        }
    }
    Ok(())
}

fn demo(keep: bool) -> Result<()> {
    let bin = build(false)?;
    let ns = ["rdmademo-a".to_string(), "rdmademo-b".to_string()];
    let mut lab = Lab::fresh(&ns, keep);
    let addrs = ["10.88.0.1", "10.88.0.2"];
    let devs = ["rdma-a", "rdma-b"];
    veth_pair(&ns, devs, addrs)?;
    println!(
        "== two hosts: {} ({}) <-veth-> {} ({})",
        ns[0], addrs[0], ns[1], addrs[1]
    );
    for i in 0..2 {
        let log = std::fs::File::create(std::env::temp_dir().join(format!("rdma-demo-{i}.log")))?;
        let child = Command::new("ip")
            .args(["netns", "exec", &ns[i]])
            .arg(&bin)
            .args(["up", "--iface", devs[i], "--adaptive"])
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        lab.pids.push(child.id());
    }
    let cli = |i: usize, args: &[&str]| -> Result<Value> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let out = Command::new("ip")
                .args(["netns", "exec", &ns[i]])
                .arg(&bin)
                .arg("--json")
                .args(args)
                .output()?;
            if out.status.success() {
                return Ok(serde_json::from_slice(&out.stdout)?);
            }
            let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
            if err.contains("no daemon") && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            bail!(
                "host {}: rdma {}: {err}",
                "AB".as_bytes()[i] as char,
                args.join(" ")
            );
        }
    };
    let show = |i: usize, args: &[&str]| -> Result<String> {
        let out = Command::new("ip")
            .args(["netns", "exec", &ns[i]])
            .arg(&bin)
            .args(args)
            .output()?;
        let s = String::from_utf8_lossy(&out.stdout).to_string();
        if !out.status.success() {
            bail!("{}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(s)
    };
    let mr_a = cli(0, &["mr", "reg", "--len", "65536"])?;
    let mr_b = cli(1, &["mr", "reg", "--len", "65536"])?;
    let key = |v: &Value, k: &str| v[k].as_u64().unwrap_or(0).to_string();
    println!(
        "== A registered MR addr 0x{:x} rkey 0x{:x}",
        mr_a["addr"].as_u64().unwrap_or(0),
        mr_a["rkey"].as_u64().unwrap_or(0)
    );
    println!(
        "== B registered MR addr 0x{:x} rkey 0x{:x}",
        mr_b["addr"].as_u64().unwrap_or(0),
        mr_b["rkey"].as_u64().unwrap_or(0)
    );
    let qa = cli(0, &["qp", "create"])?["qpn"].as_u64().unwrap_or(0);
    let qb = cli(1, &["qp", "create"])?["qpn"].as_u64().unwrap_or(0);
    let c = cli(
        0,
        &[
            "qp",
            "connect",
            &qa.to_string(),
            "--peer",
            addrs[1],
            "--remote-qpn",
            &qb.to_string(),
        ],
    )?;
    println!(
        "== connected A qpn 0x{qa:x} <-> B qpn 0x{qb:x} (psn 0x{:x})",
        c["psn"].as_u64().unwrap_or(0)
    );
    let (la, lb) = (key(&mr_a, "lkey"), key(&mr_b, "lkey"));
    let b_addr = mr_b["addr"].as_u64().unwrap_or(0);
    let b_rkey = key(&mr_b, "rkey");
    let qa_s = qa.to_string();
    let qb_s = qb.to_string();

    // 1. WRITE from A lands in B's memory.
    let msg = b"hello from A over RoCEv2 + AF_XDP";
    let hexmsg: String = msg.iter().map(|b| format!("{b:02x}")).collect();
    let w = cli(
        0,
        &[
            "post",
            "write",
            "--qp",
            &qa_s,
            "--key",
            &la,
            "--data",
            &hexmsg,
            "--remote-addr",
            &b_addr.to_string(),
            "--rkey",
            &b_rkey,
        ],
    )?;
    println!(
        "== A: RDMA WRITE {} bytes -> {}",
        msg.len(),
        w["wc"]["status"]
    );
    print!("{}", show(1, &["mr", "read", &lb, "--len", "48"])?);
    let got = cli(1, &["mr", "read", &lb, "--len", &msg.len().to_string()])?;
    check(
        got["data"].as_str() == Some(&hexmsg),
        "B's memory holds what A wrote",
    )?;

    // 2. READ pulls it back into another place of A's memory.
    let r = cli(
        0,
        &[
            "post",
            "read",
            "--qp",
            &qa_s,
            "--key",
            &la,
            "--offset",
            "4096",
            "--len",
            &msg.len().to_string(),
            "--remote-addr",
            &b_addr.to_string(),
            "--rkey",
            &b_rkey,
        ],
    )?;
    println!("== A: RDMA READ -> {}", r["wc"]["status"]);
    let back = cli(
        0,
        &[
            "mr",
            "read",
            &la,
            "--offset",
            "4096",
            "--len",
            &msg.len().to_string(),
        ],
    )?;
    check(
        back["data"].as_str() == Some(&hexmsg),
        "A read back the same bytes",
    )?;

    // 3. SEND/RECV.
    cli(
        1,
        &[
            "post", "recv", "--qp", &qb_s, "--key", &lb, "--offset", "8192", "--len", "256",
        ],
    )?;
    let text = b"a message for B's receive queue";
    let hext: String = text.iter().map(|b| format!("{b:02x}")).collect();
    let s = cli(
        0,
        &[
            "post", "send", "--qp", &qa_s, "--key", &la, "--offset", "12288", "--data", &hext,
        ],
    )?;
    println!("== A: SEND -> {}", s["wc"]["status"]);
    let wcs = cli(1, &["cq", "poll", "--qp", &qb_s, "--wait-ms", "2000"])?;
    let wc = &wcs["wcs"][0];
    println!(
        "== B: completion {} {} byte_len {}",
        wc["opcode"], wc["status"], wc["byte_len"]
    );
    check(
        wc["status"] == "success" && wc["byte_len"] == text.len(),
        "B received the message",
    )?;
    let rx = cli(
        1,
        &[
            "mr",
            "read",
            &lb,
            "--offset",
            "8192",
            "--len",
            &text.len().to_string(),
        ],
    )?;
    check(
        rx["data"].as_str() == Some(&hext),
        "the received bytes are the sent ones",
    )?;

    // 4. FETCH_ADD increments a counter in B.
    let counter = (b_addr + 16384).to_string();
    let mut last = 0;
    for i in 0..3u64 {
        let f = cli(
            0,
            &[
                "post",
                "fetch-add",
                "--qp",
                &qa_s,
                "--key",
                &la,
                "--offset",
                "16384",
                "--remote-addr",
                &counter,
                "--rkey",
                &b_rkey,
                "--add",
                "1",
            ],
        )?;
        let orig = f["original"].as_u64().unwrap_or(u64::MAX);
        check(orig == i, &format!("FETCH_ADD #{} returned {orig}", i + 1))?;
        last = orig;
    }
    let cnt = cli(1, &["mr", "read", &lb, "--offset", "16384", "--len", "8"])?;
    println!(
        "== A: 3x FETCH_ADD(1) returned 0,1,2; B's counter bytes {}",
        cnt["data"]
    );
    check(
        cnt["data"].as_str() == Some("0300000000000000") && last == 2,
        "B's counter is 3",
    )?;

    println!("== stats on A:");
    print!("{}", show(0, &["qp", "list"])?);
    print!("{}", show(0, &["stats"])?);
    println!("demo: all checks passed");
    if keep {
        println!(
            "kept: namespaces {} {}; daemons pids {:?}",
            ns[0], ns[1], lab.pids
        );
    }
    Ok(())
}

fn check(ok: bool, what: &str) -> Result<()> {
    if ok {
        println!("   ok: {what}");
        Ok(())
    } else {
        Err(anyhow!("check failed: {what}"))
    }
}

// ------------------------------------------------------------------ interop

fn rxe_peer() -> Result<PathBuf> {
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

struct Vm {
    script: PathBuf,
    keep: bool,
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
struct Case {
    name: String,
    /// rxe's command line in the VM.
    rxe: String,
    /// Our arguments to `rdma`.
    ours: Vec<String>,
    /// true: rxe is the server (started first, in the background).
    rxe_server: bool,
    /// What our output must contain.
    ours_ok: String,
    /// What rxe's output must contain.
    rxe_ok: String,
    /// perftest's result line: (#bytes, #iterations). Our line must show it
    /// unless we are the passive side of read/atomic_lat (which prints none,
    /// as perftest's server), and rxe's too where rxe prints one.
    result: Option<(usize, u32)>,
    ours_print_result: bool,
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
fn result_iters(out: &str, bytes: usize) -> Vec<u64> {
    out.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            (f.next()? == bytes.to_string()).then_some(())?;
            f.next()?.parse().ok()
        })
        .collect()
}

/// Both sides must report the iteration count that was asked for.
fn check_result_lines(c: &Case, ours: &str, rxe: &str) -> Result<()> {
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

fn interop(quick: bool, keep_vm: bool, only: Option<&str>) -> Result<()> {
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
const RXE_ERROR_COUNTERS: [&str; 9] = [
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
fn tap_tx_dropped() -> i64 {
    Command::new("ip")
        .args(["-n", RXE_NS, "-s", "-j", "link", "show", "rxetap-a"])
        .output()
        .ok()
        .and_then(|o| serde_json::from_slice::<Value>(&o.stdout).ok())
        .and_then(|v| v[0]["stats64"]["tx"]["dropped"].as_i64())
        .unwrap_or(0)
}

type Counters = std::collections::HashMap<String, i64>;

/// `rdma statistic show link rxe0/1` in the VM, as name -> value.
fn rxe_counters(script: &Path) -> Result<Counters> {
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
fn pingpong_case(prefix: &str, s: usize, n: u32, rxe_server: bool, v6: bool) -> Case {
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
fn perf_case(
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
fn loss_cases(quick: bool) -> Vec<Case> {
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
struct RxeRelay {
    child: Option<Running>,
    stats: PathBuf,
}

const RXE_NS: &str = "rxepeer";
const RELAY_NS: &str = "rxerelay";

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

fn run_case(script: &Path, bin: &str, c: &Case) -> Result<()> {
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
fn tshark_clean(pcap: &Path) -> Result<usize> {
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
fn icrc_clean(bin: &str, pcap: &Path) -> Result<()> {
    let out = Command::new(bin).arg("decode").arg(pcap).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let bad = text.lines().filter(|l| l.contains("BAD")).count();
    if !out.status.success() || bad > 0 || text.lines().count() == 0 {
        bail!("{bad} packets with a bad ICRC in {}", pcap.display());
    }
    Ok(())
}

/// The last meaningful line a tool printed (stderr first: errors go there).
fn tail(o: &std::process::Output) -> String {
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

struct Job {
    /// `bench TEST` or `baseline KIND`.
    args: Vec<String>,
    /// Which side writes the record: the client, or the server (streams).
    from_server: bool,
}

fn bench(quick: bool) -> Result<()> {
    let bin = build(true)?;
    let ns = ["rdmabench-a".to_string(), "rdmabench-b".to_string()];
    let lab = Lab::fresh(&ns, false);
    let addrs = ["10.89.0.1", "10.89.0.2"];
    let devs = ["rbench-a", "rbench-b"];
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
    let total = jobs.len() + 1;
    for (k, job) in jobs.iter().enumerate() {
        eprintln!("[{}/{total}] {}", k + 1, job.args.join(" "));
        let sj = out_dir.join("server.json");
        let cj = out_dir.join("client.json");
        let _ = std::fs::remove_file(&sj);
        let _ = std::fs::remove_file(&cj);
        let mut server = Command::new("ip")
            .args(["netns", "exec", &ns[1]])
            .arg(&bin)
            .args(&job.args)
            .args(["--dev", devs[1], "--cpu", "1", "--json"])
            .arg(&sj)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        std::thread::sleep(Duration::from_millis(400));
        let mut cargs = job.args.clone();
        cargs.insert(2, addrs[1].to_string());
        let client = Command::new("ip")
            .args(["netns", "exec", &ns[0]])
            .arg(&bin)
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
            eprintln!(
                "   failed: {}",
                String::from_utf8_lossy(&client.stderr).trim()
            );
            continue;
        }
        let file = if job.from_server { &sj } else { &cj };
        match read_json(file).and_then(|v| v.as_array().cloned()) {
            Some(v) => records.extend(v),
            None => eprintln!(
                "   no result ({})",
                String::from_utf8_lossy(&sout.stderr).trim()
            ),
        }
    }
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
    std::fs::write(
        out_dir.join("results.json"),
        serde_json::to_string_pretty(&records)?,
    )?;
    let md = summary(&records);
    std::fs::write(out_dir.join("summary.md"), &md)?;
    println!("{md}");
    println!("wrote target/bench/results.json and target/bench/summary.md");
    Ok(())
}

/// Stops a child with SIGTERM (so it reports) and waits for it.
fn terminate(child: &mut std::process::Child) -> Result<()> {
    if child.try_wait()?.is_some() {
        return Ok(());
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .stderr(Stdio::null())
        .status();
    let deadline = Instant::now() + Duration::from_secs(5);
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// A JSON file a tool wrote, if it is there and parses.
fn read_json(path: &Path) -> Option<Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// A helper process that is stopped (SIGTERM, then SIGKILL) when this
/// goes out of scope, also when the run fails half-way.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = terminate(&mut self.0);
    }
}

fn soak(ops: u64, seed: u64) -> Result<()> {
    let bin = build(true)?;
    let ns = [
        "rdmasoak-a".to_string(),
        "rdmasoak-r".to_string(),
        "rdmasoak-b".to_string(),
    ];
    let lab = Lab::fresh(&ns, false);
    let devs = ["rsoak-a", "rsoak-ra", "rsoak-rb", "rsoak-b"];
    let addrs = ["10.88.0.1", "10.88.0.2"];
    relay_topology(&ns, devs, addrs)?;
    let out_dir = root().join("target/soak");
    std::fs::create_dir_all(&out_dir)?;
    let configs: [(&str, &str); 6] = [
        ("clean", ""),
        ("loss 5%", "--loss 0.05"),
        ("reorder 5%", "--reorder 0.05"),
        ("dup 1%", "--dup 0.01"),
        ("corrupt 0.1%", "--corrupt 0.001"),
        (
            "combined",
            "--loss 0.05 --reorder 0.05 --dup 0.01 --corrupt 0.001",
        ),
    ];
    let mut rows: Vec<Value> = Vec::new();
    let mut failures = Vec::new();
    for (k, (name, flags)) in configs.iter().enumerate() {
        eprintln!("[{}/{}] {name}: {ops} operations", k + 1, configs.len());
        let rj = out_dir.join("relay.json");
        let cj = out_dir.join("client.json");
        let _ = std::fs::remove_file(&rj);
        let _ = std::fs::remove_file(&cj);
        let sl = out_dir.join("server.log");
        let relay = Running(
            Command::new("ip")
                .args(["netns", "exec", &ns[1]])
                .arg(&bin)
                .args(["--json", "relay", "--a", devs[1], "--b", devs[2]])
                .args(["--seed", &seed.to_string(), "--stats-file"])
                .arg(&rj)
                .args(flags.split_whitespace())
                .stdout(Stdio::null())
                .spawn()?,
        );
        let mut server = Running(
            Command::new("ip")
                .args(["netns", "exec", &ns[2]])
                .arg(&bin)
                .args(["soak", "--dev", devs[3], "--seed", &seed.to_string()])
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&sl)?)
                .spawn()?,
        );
        std::thread::sleep(Duration::from_millis(400));
        let client = Command::new("ip")
            .args(["netns", "exec", &ns[0]])
            .arg(&bin)
            .args(["soak", addrs[1], "--dev", devs[0], "-n", &ops.to_string()])
            .args(["--seed", &seed.to_string(), "--json"])
            .arg(&cj)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .status()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && server.0.try_wait()?.is_none() {
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(server);
        // Stopping the relay makes it write its counters.
        drop(relay);
        let rep = read_json(&cj);
        let relay_rep: Value = read_json(&rj).unwrap_or(Value::Null);
        match rep {
            Some(r) if client.success() => rows.push(json!({
                "fault": name, "relay_flags": flags, "report": r, "relay": relay_rep
            })),
            other => {
                failures.push(format!(
                    "{name}: client {} {}; server: {}",
                    client,
                    other
                        .map(|r| r["first_error"].to_string())
                        .unwrap_or_default(),
                    std::fs::read_to_string(&sl).unwrap_or_default().trim()
                ));
                rows.push(json!({"fault": name, "relay_flags": flags, "report": Value::Null, "relay": relay_rep}));
            }
        }
    }
    drop(lab);
    std::fs::write(
        out_dir.join("results.json"),
        serde_json::to_string_pretty(&rows)?,
    )?;
    let clean_gbps = rows
        .first()
        .and_then(|r| r["report"]["goodput_gbps"].as_f64())
        .unwrap_or(0.0);
    let mut md = String::from(
        "| fault | ops | verified | lost | dup | corrupt | s | goodput Gb/s | vs clean | retransmits | timeouts | relay drop/dup/corrupt/reorder |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in &rows {
        let p = &r["report"];
        let rel = |k: &str| {
            r["relay"]["a_to_b"][k].as_u64().unwrap_or(0)
                + r["relay"]["b_to_a"][k].as_u64().unwrap_or(0)
        };
        if p.is_null() {
            md += &format!(
                "| {} | FAILED | | | | | | | | | | |\n",
                r["fault"].as_str().unwrap_or("")
            );
            continue;
        }
        let g = p["goodput_gbps"].as_f64().unwrap_or(0.0);
        md +=
            &format!(
            "| {} | {} | {} | {} | {} | {} | {:.1} | {:.3} | {:+.0} % | {} | {} | {}/{}/{}/{} |\n",
            r["fault"].as_str().unwrap_or(""),
            p["ops"],
            p["completed"],
            p["lost"],
            p["duplicated"],
            p["corrupted"],
            p["seconds"].as_f64().unwrap_or(0.0),
            g,
            if clean_gbps > 0.0 { (g / clean_gbps - 1.0) * 100.0 } else { 0.0 },
            p["retransmits"],
            p["timeouts"],
            rel("dropped"),
            rel("duplicated"),
            rel("corrupted"),
            rel("reordered"),
        );
    }
    std::fs::write(out_dir.join("summary.md"), &md)?;
    println!("{md}");
    println!("wrote target/soak/results.json and target/soak/summary.md");
    if !failures.is_empty() {
        bail!("soak failed:\n{}", failures.join("\n"));
    }
    Ok(())
}

fn find<'a>(r: &'a [Value], test: &str, bytes: u64) -> Option<&'a Value> {
    r.iter().find(|x| x["test"] == test && x["bytes"] == bytes)
}

fn summary(r: &[Value]) -> String {
    let mut s = String::new();
    s += "| test | bytes | iters | t_typical us | t_avg us | p99 us | BW avg Gb/s | Mpps |\n|---|---|---|---|---|---|---|---|\n";
    let f = |v: &Value, k: &str| {
        v[k].as_f64()
            .map(|x| format!("{x:.2}"))
            .unwrap_or_else(|| "-".into())
    };
    for x in r {
        s += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            x["test"].as_str().unwrap_or(""),
            x["bytes"],
            x["iters"],
            f(x, "t_typical_us"),
            f(x, "t_avg_us"),
            f(x, "p99_us"),
            f(x, "bw_avg_gbps"),
            f(x, "msg_rate_mpps")
        );
    }
    s += "\n| target | measured | ratio | goal |\n|---|---|---|---|\n";
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "-".into(),
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
        s += &format!(
            "| {name} | {} / {} | {} | {goal} |\n",
            a.map(|x| format!("{x:.2}")).unwrap_or("-".into()),
            b.map(|x| format!("{x:.2}")).unwrap_or("-".into()),
            ratio(a, b)
        );
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
    s
}
