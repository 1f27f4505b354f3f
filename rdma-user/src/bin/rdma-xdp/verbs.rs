//! `rdma-xdp link` (which interfaces are verbs devices) and `rdma-xdp exec`
//! (run an unmodified verbs program over the drop-in libibverbs).

use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use rdma_user::control::links;

use crate::Global;

#[derive(Subcommand)]
pub enum LinkCmd {
    /// Make an interface a verbs device, as `rdma link add NAME type rxe
    /// netdev IF` does for rxe.
    Add {
        name: String,
        /// The interface (`netdev IF`, as iproute2's `rdma link add`).
        #[arg(value_parser = ["netdev"])]
        netdev_kw: String,
        netdev: String,
    },
    /// The devices programs see (the added links, or the default ones).
    Show,
    /// Remove a link.
    Del { name: String },
}

pub fn link(c: LinkCmd, g: &Global) -> Result<()> {
    match c {
        LinkCmd::Add { name, netdev, .. } => {
            let l = links::add(&name, &netdev)?;
            println!("link {} netdev {}", l.name, l.netdev);
        }
        LinkCmd::Show => {
            let added = !links::added()?.is_empty();
            let all = links::effective()?;
            if g.json {
                println!("{}", serde_json::to_string(&all)?);
            } else if all.is_empty() {
                println!("no devices: no interface is up (add one with `rdma-xdp link add rxe0 netdev IF`)");
            }
            for l in &all {
                println!(
                    "link {}/1 state {} netdev {}{}",
                    l.name,
                    if links::default_netdevs().contains(&l.netdev) {
                        "ACTIVE"
                    } else {
                        "DOWN"
                    },
                    l.netdev,
                    if added { "" } else { " (default)" }
                );
            }
        }
        LinkCmd::Del { name } => links::del(&name)?,
    }
    Ok(())
}

/// Where the drop-in library is: `ibverbs/` beside this binary (what
/// `cargo xtask verbs` builds).
fn library_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locate rdma-xdp")?;
    let dir = exe
        .parent()
        .map(|d| d.join("ibverbs"))
        .context("rdma-xdp has no directory")?;
    if !dir.join("libibverbs.so.1").exists() {
        bail!(
            "{} is missing: build it with `cargo xtask verbs{}`",
            dir.join("libibverbs.so.1").display(),
            if exe.to_string_lossy().contains("/release/") {
                " --release"
            } else {
                ""
            }
        );
    }
    Ok(dir)
}

/// Replaces this process with `program` over the drop-in libibverbs.
pub fn exec(program: &[String], g: &Global) -> Result<()> {
    let Some((prog, args)) = program.split_first() else {
        bail!("usage: rdma-xdp exec [--iface IF] -- PROGRAM ARGS...");
    };
    let dir = library_dir()?;
    let mut path = dir.into_os_string();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|o| !o.is_empty()) {
        path.push(":");
        path.push(old);
    }
    let mut c = std::process::Command::new(prog);
    c.args(args).env("LD_LIBRARY_PATH", path);
    if let Some(i) = &g.iface {
        c.env(links::IFACE_ENV, i);
    }
    let e = c.exec();
    bail!("cannot run {prog}: {e}")
}
