//! Network namespaces, veth pairs and processes of the demo, bench and soak:
//! everything created here is removed on drop, by name and by PID.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use serde_json::Value;

pub(crate) struct Lab {
    pub(crate) ns: Vec<String>,
    pub(crate) pids: Vec<u32>,
    pub(crate) keep: bool,
}

impl Drop for Lab {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        netlab::stop_pids(&self.pids, Duration::from_secs(3));
        for ns in &self.ns {
            netns_del(ns);
        }
    }
}

impl Lab {
    /// Namespaces by these names, removing any a crashed run left behind.
    pub(crate) fn fresh(ns: &[String], keep: bool) -> Lab {
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

pub(crate) use netlab::netns_del;

pub(crate) fn ip(args: &[&str]) -> Result<()> {
    Ok(netlab::ip(args)?)
}

/// Two namespaces joined by a veth pair, addressed and up.
pub(crate) fn veth_pair(ns: &[String; 2], devs: [&str; 2], addrs: [&str; 2]) -> Result<()> {
    Ok(netlab::veth_pair([&ns[0], &ns[1]], devs, addrs, None)?)
}

/// Host A - relay - host B: three namespaces, the relay's two veth ends
/// without addresses.
pub(crate) fn relay_topology(ns: &[String; 3], devs: [&str; 4], addrs: [&str; 2]) -> Result<()> {
    Ok(netlab::relay_topology(
        [&ns[0], &ns[1], &ns[2]],
        devs,
        addrs,
        None,
    )?)
}

pub(crate) fn check(ok: bool, what: &str) -> Result<()> {
    if ok {
        println!("   ok: {what}");
        Ok(())
    } else {
        Err(anyhow!("check failed: {what}"))
    }
}

// ------------------------------------------------------------------ interop

pub(crate) fn terminate(child: &mut std::process::Child) -> Result<()> {
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
pub(crate) fn read_json(path: &Path) -> Option<Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// A helper process that is stopped (SIGTERM, then SIGKILL) when this
/// goes out of scope, also when the run fails half-way.
pub(crate) struct Running(pub(crate) std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = terminate(&mut self.0);
    }
}
