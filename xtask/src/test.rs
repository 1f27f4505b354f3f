//! `cargo xtask test`: formatting and lints, every cargo test, then the
//! quick rxe interop subset and the quick cases of our stack inside the VMs.

use std::process::Command;

use anyhow::{Context, Result};

use crate::{interop::*, root, setup::*};

pub(crate) fn test(args: &[String]) -> Result<()> {
    if args.is_empty() {
        lint()?;
    }
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
    interop(&Options {
        quick: true,
        keep_vm: false,
        only: None,
        capture_dir: None,
    })?;
    // And our stack inside the VMs on virtio-net, zero-copy and copy mode
    // (`cargo xtask interop --guest --quick`).
    println!("our stack inside the VMs (quick)");
    crate::guest::guest(true, false, None, None)
}

/// `cargo fmt --check` for every crate, clippy with warnings as errors for
/// the host crates (the workspace's default members) and for the eBPF
/// crate on its BPF target, built as aya-build builds it.
pub(crate) fn lint() -> Result<()> {
    println!("formatting and lints");
    sh(Command::new("cargo")
        .current_dir(root())
        .args(["fmt", "--all", "--check"]))
    .context("cargo fmt --check: run `cargo fmt --all`")?;
    sh(Command::new("cargo").current_dir(root()).args([
        "clippy",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))
    .context("cargo clippy (host crates)")?;
    sh(Command::new("cargo")
        .current_dir(root().join("rdma-ebpf"))
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            format!("--cfg=bpf_target_arch=\"{}\"", std::env::consts::ARCH),
        )
        .args([
            "+nightly",
            "clippy",
            "--release",
            "--bins",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
            "--target-dir",
        ])
        .arg(root().join("target").join("ebpf-clippy"))
        .args(["--", "-D", "warnings"]))
    .context("cargo clippy (the eBPF crate, bpfel-unknown-none)")
}
