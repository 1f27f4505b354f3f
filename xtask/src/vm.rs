//! `cargo xtask vm`: the rxe VMs by hand ("is this rxe or us?"): build the
//! image, boot VMs that stay up, run commands in them, stop them.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use rxevm::{Agent, Image, Lab, Settings, VmId};

/// The image, built or taken from the cache; progress on stderr.
pub(crate) fn image(settings: &Settings) -> Result<Image> {
    rxevm::image::prepare(settings, &|s| eprintln!("rxevm: {s}"))
        .context("prepare the rxe VM image")
}

pub(crate) fn vm_ids(names: &[String]) -> Result<Vec<VmId>> {
    if names.is_empty() {
        return Ok(vec![VmId::A]);
    }
    names
        .iter()
        .map(|n| VmId::parse(n).with_context(|| format!("VM name {n:?}: use a letter a..h")))
        .collect()
}

pub(crate) fn image_cmd() -> Result<()> {
    let s = Settings::from_env()?;
    let img = image(&s)?;
    print!("{}", img.versions);
    println!("cache: {}", s.cache.display());
    Ok(())
}

pub(crate) fn start(names: &[String]) -> Result<()> {
    let s = Settings::from_env()?;
    let img = image(&s)?;
    let ids = vm_ids(names)?;
    let lab = Lab::start(&s, &img, &ids, true)?;
    for id in &ids {
        println!(
            "VM {id}: {} {} MAC {} ({}, ready in {:.1} s)",
            id.ip(),
            id.ip6(),
            id.mac(),
            lab.accel(),
            lab.boot_time(*id).as_secs_f64()
        );
    }
    println!(
        "namespace {}: host {} / {} on {}; `cargo xtask vm exec -- CMD`, `cargo xtask vm stop`",
        rxevm::net::NETNS,
        rxevm::net::HOST_IP,
        rxevm::net::HOST_IP6,
        rxevm::net::HOST_IF
    );
    Ok(())
}

/// The guest agent of a running VM.
fn running_agent(vm: &str) -> Result<Agent> {
    let s = Settings::from_env()?;
    let id = vm_ids(&[vm.to_string()])?[0];
    let socket = s.run.join(format!("{id}.qga"));
    if !socket.exists() {
        bail!("VM {id} is not running: start it with `cargo xtask vm start {id}`");
    }
    Ok(Agent::new(&socket))
}

pub(crate) fn put(vm: &str, host_path: &std::path::Path, guest_path: &str) -> Result<()> {
    let bytes =
        std::fs::read(host_path).with_context(|| format!("read {}", host_path.display()))?;
    running_agent(vm)?.put_file(guest_path, &bytes, 0o755)?;
    println!(
        "{} -> VM {vm}:{guest_path} ({} bytes)",
        host_path.display(),
        bytes.len()
    );
    Ok(())
}

pub(crate) fn exec(vm: &str, timeout: u64, cmd: &[String]) -> Result<()> {
    let out = running_agent(vm)?.exec(&cmd.join(" "), Duration::from_secs(timeout))?;
    print!("{}", out.stdout);
    eprint!("{}", out.stderr);
    if out.timed_out {
        eprintln!("timed out after {timeout} s (its process group was killed)");
    }
    std::process::exit(if out.timed_out { 124 } else { out.code as i32 });
}

pub(crate) fn stop() -> Result<()> {
    rxevm::stop_all(&Settings::from_env()?);
    Ok(())
}
