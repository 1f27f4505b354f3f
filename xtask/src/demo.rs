//! `cargo xtask demo`: two hosts in namespaces, a daemon each, WRITE/READ/SEND/
//! FETCH_ADD between them through the CLI, every result checked.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde_json::Value;

use crate::{lab::*, setup::*};

pub(crate) fn demo(keep: bool) -> Result<()> {
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
    demo_ops(&cli, &show, addrs[1])?;
    println!("demo: all checks passed");
    if keep {
        println!(
            "kept: namespaces {} {}; daemons pids {:?}",
            ns[0], ns[1], lab.pids
        );
    }
    Ok(())
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
