//! Prerequisites (toolchains, bpf-linker, Debian packages) and the build of `rdma-xdp`.
//! Installs only what is missing; never touches the machine otherwise.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::root;

pub(crate) fn have(cmd: &str, args: &[&str]) -> Option<String> {
    Command::new(cmd)
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
}

pub(crate) fn sh(cmd: &mut Command) -> Result<()> {
    let st = cmd
        .status()
        .with_context(|| format!("run {:?}", cmd.get_program()))?;
    if !st.success() {
        bail!("{:?} failed ({st})", cmd);
    }
    Ok(())
}

pub(crate) const BPF_LINKER: &str = "0.10.4";

/// How to install one missing prerequisite.
pub(crate) type Installer = Box<dyn Fn() -> Result<()>>;

/// Each missing prerequisite is one line: what is missing and how to get it.
/// With `install`, missing pieces are installed instead.
pub(crate) fn prereqs(install: bool, for_tests: bool) -> Result<()> {
    prereqs_for(install, for_tests, false)
}

/// The demo's prerequisites: the build's, and perftest (the demo runs
/// unmodified `ib_write_lat` over the drop-in libibverbs).
pub(crate) fn demo_prereqs(install: bool) -> Result<()> {
    prereqs_for(install, false, true)
}

fn prereqs_for(install: bool, for_tests: bool, for_demo: bool) -> Result<()> {
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
    // The test command checks formatting and lints: rustfmt and clippy for
    // the host toolchain, clippy for nightly (the eBPF crate).
    if for_tests {
        for (tool, component) in [("fmt", "rustfmt"), ("clippy", "clippy")] {
            if have("cargo", &[tool, "--version"]).is_none() {
                missing.push((
                    format!("{component} (the test command's lint step): rustup component add {component}"),
                    Box::new(move || sh(Command::new("rustup").args(["component", "add", component]))),
                ));
            }
        }
        let installed = have(
            "rustup",
            &["component", "list", "--installed", "--toolchain", "nightly"],
        )
        .unwrap_or_default();
        for (component, why) in [
            ("clippy", "lints the eBPF crate"),
            ("miri", "runs the object and MR tables under Miri"),
        ] {
            if !installed.lines().any(|l| l.starts_with(component)) {
                missing.push((
                    format!("{component} for nightly ({why}): rustup component add {component} --toolchain nightly"),
                    Box::new(move || sh(Command::new("rustup").args(["component", "add", component, "--toolchain", "nightly"]))),
                ));
            }
        }
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
    // The drop-in libibverbs is tested against Debian's own binaries.
    if for_tests && have("sh", &["-c", "command -v ibv_devinfo"]).is_none() {
        debs.push("ibverbs-utils");
    }
    // rdmacm-utils and qperf for the drop-in librdmacm's tests.
    if for_tests && have("sh", &["-c", "command -v rping"]).is_none() {
        debs.push("rdmacm-utils");
    }
    if for_tests && have("sh", &["-c", "command -v qperf"]).is_none() {
        debs.push("qperf");
    }
    if for_tests && have("objdump", &["--version"]).is_none() {
        debs.push("binutils");
    }
    // perftest for the drop-in library's tests and the demo; libibverbs-dev
    // for the C misuse test (headers, and the link-time libibverbs.so).
    if (for_tests || for_demo)
        && have(
            "sh",
            &["-c", "command -v ib_write_bw && command -v ib_write_lat"],
        )
        .is_none()
    {
        debs.push("perftest");
    }
    if for_tests && !std::path::Path::new("/usr/include/infiniband/verbs.h").exists() {
        debs.push("libibverbs-dev");
    }
    // librdmacm-dev for the C connect/disconnect cycle test.
    if for_tests && !std::path::Path::new("/usr/include/rdma/rdma_cma.h").exists() {
        debs.push("librdmacm-dev");
    }
    // The engines run over the drop-in library unmodified: UCX, Open MPI
    // (mpicc builds the checked MPI program), libfabric and pyverbs.
    for (deb, check) in [
        ("ucx-utils", "command -v ucx_perftest"),
        ("openmpi-bin", "command -v mpirun"),
        ("libopenmpi-dev", "command -v mpicc"),
        ("libfabric-bin", "command -v fi_info"),
        ("python3-pyverbs", "/usr/bin/python3 -c 'import pyverbs'"),
    ] {
        if for_tests && have("sh", &["-c", check]).is_none() {
            debs.push(deb);
        }
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

pub(crate) fn build(release: bool) -> Result<PathBuf> {
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

pub(crate) fn run(release: bool, args: &[String]) -> Result<()> {
    let bin = build(release)?;
    let st = Command::new(bin).args(args).status()?;
    std::process::exit(st.code().unwrap_or(1));
}
