//! `cargo xtask soak`: the verified workload through the impairment relay under
//! each fault profile; losses must be zero.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde_json::{json, Value};

use crate::{lab::*, root, setup::*};

pub(crate) fn soak(ops: u64, seed: u64) -> Result<()> {
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
    let configs: [(&str, &str); 7] = [
        ("clean", ""),
        ("loss 5%", "--loss 0.05"),
        // CE marks: every QP's DCQCN reacts (CNPs, pacing); nothing is lost.
        ("ce 5%", "--ce 0.05"),
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
    // Each fault in both recovery modes, one after the other, so the two
    // are compared within one run: selective repeat (both sides offer it)
    // and go-back-N (the client does not offer it).
    let only = std::env::var("SOAK_ONLY").ok();
    let runs: Vec<(&str, &str, &str)> = configs
        .iter()
        .filter(|(name, _)| only.as_deref().is_none_or(|o| o == *name))
        .flat_map(|&(name, flags)| [(name, flags, "sr"), (name, flags, "gbn")])
        .collect();
    for (k, &(name, flags, mode)) in runs.iter().enumerate() {
        eprintln!(
            "[{}/{}] {name}, {mode}: {ops} operations",
            k + 1,
            runs.len()
        );
        let rj = out_dir.join("relay.json");
        let cj = out_dir.join("client.json");
        let _ = std::fs::remove_file(&rj);
        let _ = std::fs::remove_file(&cj);
        let sl = out_dir.join(format!(
            "server-{}-{mode}.log",
            name.replace([' ', '%'], "")
        ));
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
            .args((mode == "gbn").then_some("--no-selective-repeat"))
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
            Some(r) if client.success() && r["mode"] == mode => rows.push(json!({
                "fault": name, "mode": mode, "relay_flags": flags, "report": r, "relay": relay_rep
            })),
            Some(r) if client.success() => {
                failures.push(format!(
                    "{name}: asked for {mode}, the peers agreed on {}",
                    r["mode"]
                ));
                rows.push(json!({"fault": name, "mode": mode, "relay_flags": flags, "report": Value::Null, "relay": relay_rep}));
            }
            other => {
                failures.push(format!(
                    "{name} ({mode}): client {} {}; server: {}",
                    client,
                    other
                        .map(|r| r["first_error"].to_string())
                        .unwrap_or_default(),
                    std::fs::read_to_string(&sl).unwrap_or_default().trim()
                ));
                rows.push(json!({"fault": name, "mode": mode, "relay_flags": flags, "report": Value::Null, "relay": relay_rep}));
            }
        }
    }
    drop(lab);
    std::fs::write(
        out_dir.join("results.json"),
        serde_json::to_string_pretty(&rows)?,
    )?;
    // Goodput of a fault in a mode, and its ratio to the clean row of the
    // same mode.
    let goodput = |fault: &str, mode: &str| {
        rows.iter()
            .find(|r| r["fault"] == fault && r["mode"] == mode)
            .and_then(|r| r["report"]["goodput_gbps"].as_f64())
    };
    let mut md = String::from(
        "| fault | selective repeat Gb/s | vs clean | go-back-N Gb/s | vs clean | SR / GBN |\n|---|---|---|---|---|---|\n",
    );
    for (name, _) in &configs {
        let cell = |mode: &str| match (goodput(name, mode), goodput("clean", mode)) {
            (Some(g), Some(c)) if c > 0.0 => (format!("{g:.3}"), format!("{:.2}x", g / c)),
            (Some(g), _) => (format!("{g:.3}"), String::new()),
            _ => ("FAILED".into(), String::new()),
        };
        let (sg, sr) = cell("sr");
        let (gg, gr) = cell("gbn");
        let ratio = match (goodput(name, "sr"), goodput(name, "gbn")) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.1}x", a / b),
            _ => String::new(),
        };
        md += &format!("| {name} | {sg} | {sr} | {gg} | {gr} | {ratio} |\n");
    }
    md += "\n| fault | mode | ops | verified | lost | dup | corrupt | s | goodput Gb/s | vs clean | retransmits | timeouts | SACKs | relay drop/dup/corrupt/reorder/CE | CNPs handled |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for r in &rows {
        let mode = r["mode"].as_str().unwrap_or("");
        let clean_gbps = goodput("clean", mode).unwrap_or(0.0);
        let p = &r["report"];
        let rel = |k: &str| {
            r["relay"]["a_to_b"][k].as_u64().unwrap_or(0)
                + r["relay"]["b_to_a"][k].as_u64().unwrap_or(0)
        };
        if p.is_null() {
            md += &format!(
                "| {} | {mode} | FAILED | | | | | | | | | | | | |\n",
                r["fault"].as_str().unwrap_or("")
            );
            continue;
        }
        let g = p["goodput_gbps"].as_f64().unwrap_or(0.0);
        md +=
            &format!(
            "| {} | {mode} | {} | {} | {} | {} | {} | {:.1} | {:.3} | {:+.0} % | {} | {} | {} | {}/{}/{}/{}/{} | {} |\n",
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
            p["sacks_received"],
            rel("dropped"),
            rel("duplicated"),
            rel("corrupted"),
            rel("reordered"),
            rel("ce_marked"),
            p["rp_cnp_handled"],
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
