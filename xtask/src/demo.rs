//! `cargo xtask demo`: two hosts in namespaces, a daemon each, WRITE/READ/SEND/
//! FETCH_ADD between them through the CLI; then A's WRITEs into a pool MR of
//! B's, placed and answered by B's XDP responder without B's data path
//! receiving any of them; then unmodified `ib_write_lat` over the drop-in
//! libibverbs. Every result is checked.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::{lab::*, root, setup::*};

/// One-packet WRITEs (256 B each) into B's pool MR, then one WRITE of
/// `BIG` bytes (16 packets at the QP's MTU of 1024).
const SMALL_WRITES: usize = 256;
const SMALL: usize = 256;
const BIG: usize = 16384;
const MTU: usize = 1024;
/// `ib_write_lat`'s iterations.
const LAT_ITERS: &str = "1000";

pub(crate) fn demo(keep: bool) -> Result<()> {
    let t0 = Instant::now();
    let bin = build(false)?;
    // The drop-in libibverbs.so.1, beside rdma-xdp where `rdma-xdp exec`
    // looks for it.
    ibverbs_so::build(&root(), false).context("build the drop-in libibverbs.so.1")?;
    let ns = ["rdmademo-a".to_string(), "rdmademo-b".to_string()];
    let mut lab = Lab::fresh(&ns, keep);
    let addrs = ["10.88.0.1", "10.88.0.2"];
    let devs = ["rdma-a", "rdma-b"];
    veth_pair(&ns, devs, addrs)?;
    println!(
        "== two hosts: {} ({}) <-veth-> {} ({})",
        ns[0], addrs[0], ns[1], addrs[1]
    );
    let start_daemons = |lab: &mut Lab| -> Result<Vec<Child>> {
        let mut daemons = Vec::new();
        for i in 0..2 {
            let log =
                std::fs::File::create(std::env::temp_dir().join(format!("rdma-demo-{i}.log")))?;
            // `ip netns exec` execs its command: the child's pid is the
            // daemon's.
            let child = Command::new("ip")
                .args(["netns", "exec", &ns[i]])
                .arg(&bin)
                .args(["up", "--iface", devs[i], "--adaptive"])
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()?;
            lab.pids.push(child.id());
            daemons.push(child);
        }
        Ok(daemons)
    };
    let mut daemons = start_daemons(&mut lab)?;
    let pids = [daemons[0].id(), daemons[1].id()];
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
    demo_ops(&cli, &show, addrs[1])?;
    let xdp = xdp_responder_step(&cli, &show, addrs[1], pids)?;

    // The drop-in library opens the interface itself (XDP program and
    // AF_XDP sockets): the daemons give it up first.
    println!("== stopping both daemons (pids {} {})", pids[0], pids[1]);
    for d in &mut daemons {
        terminate(d)?;
    }
    lab.pids.clear();
    let lat = unmodified_program(&bin, &ns, addrs[1])?;

    println!("== summary");
    println!("   CLI: WRITE, READ, SEND/RECV and 3 FETCH_ADDs between A and B, each checked");
    println!("   XDP responder: {xdp}");
    println!("   unmodified ib_write_lat over the drop-in libibverbs: {lat}");
    println!(
        "demo: all checks passed ({:.0} s)",
        t0.elapsed().as_secs_f64()
    );
    if keep {
        let again = start_daemons(&mut lab)?;
        println!(
            "kept: namespaces {} {}; daemons pids {:?} (logs in {})",
            ns[0],
            ns[1],
            again.iter().map(Child::id).collect::<Vec<_>>(),
            std::env::temp_dir().display()
        );
    }
    Ok(())
}

/// A process's CPU time: utime + stime of /proc/PID/stat in ms (clock
/// ticks, 10 ms each at the usual 100 Hz), and the on-CPU time of its
/// threads from /proc/PID/task/*/schedstat in ns.
fn cpu_of(pid: u32) -> Result<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("read /proc/{pid}/stat"))?;
    // The fields after "(comm)": state is field 3, utime 14, stime 15.
    let f: Vec<&str> = stat[stat.rfind(')').unwrap_or(0) + 1..]
        .split_whitespace()
        .collect();
    let field = |n: usize| -> u64 { f.get(n - 3).and_then(|v| v.parse().ok()).unwrap_or(0) };
    let hz: u64 = have("getconf", &["CLK_TCK"])
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100);
    let ms = (field(14) + field(15)) * 1000 / hz.max(1);
    let mut ns = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let s = std::fs::read_to_string(t?.path().join("schedstat")).unwrap_or_default();
        ns += s
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok((ms, ns))
}

/// Bytes that say where they belong: every 256 B block starts with its
/// name, the rest is a pseudo-random pattern.
fn pattern() -> Vec<u8> {
    let mut v: Vec<u8> = (0..SMALL_WRITES * SMALL + BIG)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    for (k, block) in v.chunks_mut(SMALL).enumerate() {
        let tag = if k < SMALL_WRITES {
            format!("WRITE #{k} of A. ")
        } else {
            format!(
                "{} KiB WRITE +{:#06x} ",
                BIG / 1024,
                (k - SMALL_WRITES) * SMALL
            )
        };
        block[..tag.len()].copy_from_slice(tag.as_bytes());
    }
    v
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// B registers a pool MR; over a QP pair of their own, A writes into it
/// `SMALL_WRITES` times one packet and once `BIG` bytes. B's XDP program
/// places every packet and answers with the ACKs itself: B's counters
/// (XDP's placed and answered, the data path's RX frames) before and
/// after show that B's data path received none of them, and the daemons'
/// CPU time over the WRITEs what each side spent. Returns the summary line.
fn xdp_responder_step(
    cli: &dyn Fn(usize, &[&str]) -> Result<Value>,
    show: &dyn Fn(usize, &[&str]) -> Result<String>,
    peer_b: &str,
    pids: [u32; 2],
) -> Result<String> {
    let u = |v: &Value| v.as_u64().unwrap_or(0);
    let total = SMALL_WRITES * SMALL + BIG;
    let mr_b = cli(1, &["mr", "reg", "--len", &total.to_string(), "--pool"])?;
    let mr_a = cli(0, &["mr", "reg", "--len", &total.to_string()])?;
    let (b_addr, b_rkey, b_lkey) = (u(&mr_b["addr"]), u(&mr_b["rkey"]), u(&mr_b["lkey"]));
    let la = u(&mr_a["lkey"]).to_string();
    println!(
        "== B registered a pool MR: addr 0x{b_addr:x} rkey 0x{b_rkey:x}, {} KiB at MR pool +0x{:x}",
        total / 1024,
        u(&mr_b["pool_offset"])
    );
    // What A will write, in A's memory first.
    let data = pattern();
    let file = std::env::temp_dir().join("rdma-demo-pattern.bin");
    std::fs::write(&file, &data)?;
    let filled = cli(0, &["mr", "write", &la, "--file", &file.to_string_lossy()]);
    let _ = std::fs::remove_file(&file);
    filled?;
    let qa = u(&cli(0, &["qp", "create"])?["qpn"]);
    let qb = u(&cli(1, &["qp", "create"])?["qpn"]);
    cli(
        0,
        &[
            "qp",
            "connect",
            &qa.to_string(),
            "--peer",
            peer_b,
            "--remote-qpn",
            &qb.to_string(),
            "--mtu",
            &MTU.to_string(),
        ],
    )?;
    // B's data path lends the QP's responder to XDP once it is idle.
    let of_qp = |st: &Value| -> Value {
        st["xdp_responder"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|q| u(&q["qpn"]) == qb)
            .map(|q| q["xdp_responder"].clone())
            .unwrap_or(Value::Null)
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let before = loop {
        let st = cli(1, &["stats"])?;
        if of_qp(&st)["lent"] == true {
            break st;
        }
        if Instant::now() > deadline {
            bail!(
                "B's QP 0x{qb:x} was not lent to the XDP responder: {}; B's XDP: {}",
                of_qp(&st),
                st["xdp"]
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    println!("== connected A qpn 0x{qa:x} <-> B qpn 0x{qb:x}; B's data path lent the QP to XDP");
    // A's QP's retransmissions: a WRITE A sends again is a duplicate that
    // XDP rightly leaves to B's engine.
    let retransmits = || -> Result<u64> {
        let l = cli(0, &["qp", "list"])?;
        Ok(l["qps"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|q| u(&q["qpn"]) == qa)
            .map_or(0, |q| u(&q["stats"]["retransmits"])))
    };
    let retx0 = retransmits()?;
    let cpu0 = [cpu_of(pids[0])?, cpu_of(pids[1])?];
    let t = Instant::now();
    let b_rkey_s = b_rkey.to_string();
    let qa_s = qa.to_string();
    let write = |off: usize, len: usize| -> Result<()> {
        let w = cli(
            0,
            &[
                "post",
                "write",
                "--qp",
                &qa_s,
                "--key",
                &la,
                "--offset",
                &off.to_string(),
                "--len",
                &len.to_string(),
                "--remote-addr",
                &(b_addr + off as u64).to_string(),
                "--rkey",
                &b_rkey_s,
            ],
        )?;
        if w["wc"]["status"] != "success" {
            bail!("WRITE at +{off}: {}", w["wc"]);
        }
        Ok(())
    };
    for k in 0..SMALL_WRITES {
        write(k * SMALL, SMALL)?;
    }
    write(SMALL_WRITES * SMALL, BIG)?;
    let took = t.elapsed().as_secs_f64();
    let cpu1 = [cpu_of(pids[0])?, cpu_of(pids[1])?];
    let after = cli(1, &["stats"])?;
    let retx = retransmits()? - retx0;
    let packets = (SMALL_WRITES + BIG / MTU) as u64;
    println!(
        "== A: {SMALL_WRITES} RDMA WRITEs of {SMALL} B, then one of {} KiB ({packets} packets), \
         each completed successfully, in {took:.1} s (one CLI call each)",
        BIG / 1024,
    );
    let x = |st: &Value, k: &str| u(&st["xdp"][k]);
    let placed = |st: &Value| x(st, "xdp_placed") + x(st, "xdp_acked");
    let answered = |st: &Value| x(st, "xdp_acked");
    let rx = |st: &Value| u(&st["datapath"]["rx_frames"]);
    let (q0, q1) = (of_qp(&before), of_qp(&after));
    println!("   on B                           before     after     delta");
    let row = |what: &str, a: u64, b: u64| {
        println!(
            "   {what:<29} {a:>7} {b:>9} {:>9}",
            format!("{:+}", b as i64 - a as i64)
        )
    };
    row("XDP placed (packets)", placed(&before), placed(&after));
    row(
        "XDP answered (ACKs by XDP_TX)",
        answered(&before),
        answered(&after),
    );
    row(
        "XDP left to user space",
        x(&before, "xdp_punted"),
        x(&after, "xdp_punted"),
    );
    row("data path RX frames", rx(&before), rx(&after));
    // CPU: utime+stime in ms, and the threads' on-CPU time per second.
    let rate = |i: usize| (cpu1[i].1 - cpu0[i].1) as f64 / 1e6 / took;
    let cpu_row = |who: &str, i: usize| {
        println!(
            "   {who:<29} {:>4} ms {:>6} ms {:>+6} ms   (threads on CPU {:.1} ms/s)",
            cpu0[i].0,
            cpu1[i].0,
            cpu1[i].0 as i64 - cpu0[i].0 as i64,
            rate(i)
        )
    };
    cpu_row("B's daemon CPU (utime+stime)", 1);
    cpu_row("A's daemon CPU, for contrast", 0);
    let d_placed = placed(&after) - placed(&before);
    let d_answered = answered(&after) - answered(&before);
    let d_rx = rx(&after) - rx(&before);
    let d_punted = x(&after, "xdp_punted") - x(&before, "xdp_punted");
    check(
        d_placed == packets
            && u(&q1["placed"]) - u(&q0["placed"]) == packets
            && u(&q1["placed_bytes"]) - u(&q0["placed_bytes"]) == total as u64,
        &format!("XDP placed all {packets} WRITE packets, {total} bytes, for B's QP 0x{qb:x}"),
    )?;
    check(
        d_answered > SMALL_WRITES as u64 && u(&q1["acks"]) - u(&q0["acks"]) == d_answered,
        &format!("XDP answered them itself: {d_answered} ACKs by XDP_TX"),
    )?;
    check(
        d_rx == retx && d_punted == retx,
        &if retx == 0 {
            "B's data path received none of them (RX frames +0)".to_string()
        } else {
            format!(
                "B's data path received none of them, only {retx} retransmission(s) of A \
                 (duplicates XDP left to it)"
            )
        },
    )?;
    print!(
        "{}",
        show(1, &["mr", "read", &b_lkey.to_string(), "--len", "32"])?
    );
    let got = cli(
        1,
        &[
            "mr",
            "read",
            &b_lkey.to_string(),
            "--len",
            &total.to_string(),
        ],
    )?;
    check(
        got["data"].as_str() == Some(hex(&data).as_str()),
        &format!("B's pool MR holds the {total} bytes A wrote"),
    )?;
    Ok(format!(
        "{packets} WRITE packets into B's pool MR, placed and answered ({d_answered} ACKs) by XDP; \
         B's data path received {d_rx} frames; B's daemon {:.1} ms/s on CPU, A's {:.1} ms/s",
        rate(1),
        rate(0)
    ))
}

/// Waits for a program started as `Running` (stopped if it overstays
/// `limit`): its exit status, stdout and stderr.
fn finish(mut r: Running, limit: Duration, what: &str) -> Result<(bool, String, String)> {
    let deadline = Instant::now() + limit;
    let st = loop {
        if let Some(st) = r.0.try_wait()? {
            break st;
        }
        if Instant::now() > deadline {
            bail!("{what} did not finish within {} s", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (mut out, mut err) = (String::new(), String::new());
    if let Some(mut o) = r.0.stdout.take() {
        o.read_to_string(&mut out)?;
    }
    if let Some(mut e) = r.0.stderr.take() {
        e.read_to_string(&mut err)?;
    }
    Ok((st.success(), out, err))
}

/// Unmodified Debian `ib_write_lat` (perftest) between the namespaces over
/// the drop-in libibverbs, through `rdma-xdp exec`: server in B, client
/// in A. With RDMA_XDP_POOL=1 the library moves its buffers into the MR
/// pool, so both sides' XDP responders place the other's WRITEs;
/// RDMA_XDP_STATS=1 prints their counters at exit. Returns the summary
/// line.
fn unmodified_program(bin: &std::path::Path, ns: &[String; 2], peer_b: &str) -> Result<String> {
    let tool = ["ib_write_lat", "-x", "1", "-s", "2", "-n", LAT_ITERS];
    println!(
        "== unmodified {} over the drop-in libibverbs: `rdma-xdp exec -- {}` in B, the same with {peer_b} in A",
        which("ib_write_lat"),
        tool.join(" ")
    );
    let run = |i: usize, extra: Option<&str>| -> Result<Running> {
        let c = Command::new("ip")
            .args(["netns", "exec", &ns[i]])
            .arg(bin)
            .args(["exec", "--", "env", "RDMA_XDP_STATS=1", "RDMA_XDP_POOL=1"])
            .args(tool)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("start ib_write_lat")?;
        Ok(Running(c))
    };
    let mut server = run(1, None)?;
    // perftest's server listens on TCP port 18515 for the client's QP
    // details.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = Command::new("ip")
            .args(["netns", "exec", &ns[1], "ss", "-Hltn", "sport = :18515"])
            .output()?;
        if !String::from_utf8_lossy(&out.stdout).trim().is_empty() {
            break;
        }
        if let Some(st) = server.0.try_wait()? {
            let (_, o, e) = finish(server, Duration::from_secs(1), "server")?;
            bail!("the ib_write_lat server exited ({st}):\n{o}{e}");
        }
        if Instant::now() > deadline {
            bail!("the ib_write_lat server did not listen on port 18515 within 10 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let t = Instant::now();
    let client = run(0, Some(peer_b))?;
    let (c_ok, c_out, c_err) = finish(client, Duration::from_secs(60), "the ib_write_lat client")?;
    let (s_ok, s_out, s_err) = finish(server, Duration::from_secs(10), "the ib_write_lat server")?;
    let took = t.elapsed();
    if !(c_ok && s_ok) {
        bail!(
            "ib_write_lat failed: client ok {c_ok}, server ok {s_ok}\nclient:\n{c_out}{c_err}\nserver:\n{s_out}{s_err}"
        );
    }
    // perftest's table: a header line, then "#bytes #iterations t_min
    // t_max t_typical t_avg t_stdev 99% 99.9%".
    let header = c_out
        .lines()
        .find(|l| l.trim_start().starts_with("#bytes"))
        .unwrap_or("");
    let result = c_out
        .lines()
        .find(|l| l.split_whitespace().next() == Some("2"))
        .unwrap_or("");
    let squeeze = |l: &str| l.split_whitespace().collect::<Vec<_>>().join(" ");
    println!("   {}", squeeze(header));
    println!("   {}", squeeze(result));
    let col: Vec<&str> = result.split_whitespace().collect();
    check(
        col.len() >= 7 && col[1] == LAT_ITERS,
        &format!("ib_write_lat exited 0 on both sides and reported {LAT_ITERS} iterations of 2 B"),
    )?;
    let served = |err: &str| -> u64 {
        err.lines()
            .find_map(|l| l.strip_prefix("rdma-xdp: the XDP responder served "))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let (sa, sb) = (served(&c_err), served(&s_err));
    for (who, err) in [("A", &c_err), ("B", &s_err)] {
        if let Some(l) = err
            .lines()
            .find(|l| l.starts_with("rdma-xdp: the XDP responder served "))
        {
            println!("   {who}: {}", l.trim_start_matches("rdma-xdp: "));
        }
    }
    check(
        sa > 0 && sb > 0,
        "the XDP responder served the other side's WRITEs on both hosts",
    )?;
    Ok(format!(
        "{LAT_ITERS} iterations of 2 B, typical {} us, average {} us ({:.1} s); \
         the XDP responder served {sb} packets on B and {sa} on A",
        col[4],
        col[5],
        took.as_secs_f64()
    ))
}

fn which(prog: &str) -> String {
    have("sh", &["-c", &format!("command -v {prog}")])
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| prog.to_string())
}

/// The demo's operations between host 0 (A) and host 1 (B), each through
/// the CLI (`cli` with --json, `show` as printed), every result checked:
/// WRITE, READ back, SEND/RECV, three FETCH_ADDs. Also run inside the VMs
/// (`cargo xtask interop --guest`). `peer_b` is B's address.
pub(crate) fn demo_ops(
    cli: &dyn Fn(usize, &[&str]) -> Result<Value>,
    show: &dyn Fn(usize, &[&str]) -> Result<String>,
    peer_b: &str,
) -> Result<()> {
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
            peer_b,
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
    Ok(())
}
