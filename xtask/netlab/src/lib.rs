//! Test hosts in network namespaces, joined by veth pairs directly or
//! through a middle (relay) namespace, and the clean-up of what they ran:
//! the one lab that `cargo xtask` (demo, bench, soak) and rdma-user's
//! namespace tests both build on.
//!
//! It only creates namespaces and links with the names it is given and
//! removes them by those names; processes are stopped by PID.

use std::io;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `ip ARGS`; an error names the command that failed.
pub fn ip(args: &[&str]) -> io::Result<()> {
    let st = Command::new("ip").args(args).status()?;
    if st.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "ip {} failed ({st})",
            args.join(" ")
        )))
    }
}

/// Deletes a namespace if it exists (and the links that live only in it).
pub fn netns_del(ns: &str) {
    let _ = Command::new("ip")
        .args(["netns", "del", ns])
        .stderr(Stdio::null())
        .status();
}

/// One end of a link as a host sees it: its namespace, device and, for a
/// host (not a relay), its address.
fn bring_up(ns: &str, dev: &str, addr: Option<&str>, mtu: Option<u32>) -> io::Result<()> {
    if let Some(m) = mtu {
        ip(&["-n", ns, "link", "set", dev, "mtu", &m.to_string()])?;
    }
    if let Some(a) = addr {
        ip(&["-n", ns, "addr", "add", &format!("{a}/24"), "dev", dev])?;
    }
    ip(&["-n", ns, "link", "set", dev, "up"])?;
    ip(&["-n", ns, "link", "set", "lo", "up"])
}

/// Two namespaces joined by one veth pair, addressed (/24) and up.
pub fn veth_pair(
    ns: [&str; 2],
    devs: [&str; 2],
    addrs: [&str; 2],
    mtu: Option<u32>,
) -> io::Result<()> {
    for n in ns {
        ip(&["netns", "add", n])?;
    }
    ip(&[
        "link", "add", devs[0], "type", "veth", "peer", "name", devs[1],
    ])?;
    for i in 0..2 {
        ip(&["link", "set", devs[i], "netns", ns[i]])?;
        bring_up(ns[i], devs[i], Some(addrs[i]), mtu)?;
    }
    Ok(())
}

/// Host A - relay - host B: `ns` = [A, relay, B], `devs` = [A's device, the
/// relay's towards A, the relay's towards B, B's device]. The relay's ends
/// have no address: a relay forwards frames between them.
pub fn relay_topology(
    ns: [&str; 3],
    devs: [&str; 4],
    addrs: [&str; 2],
    mtu: Option<u32>,
) -> io::Result<()> {
    for n in ns {
        ip(&["netns", "add", n])?;
    }
    for (host, hdev, rdev, addr) in [
        (ns[0], devs[0], devs[1], addrs[0]),
        (ns[2], devs[3], devs[2], addrs[1]),
    ] {
        ip(&["link", "add", hdev, "type", "veth", "peer", "name", rdev])?;
        ip(&["link", "set", hdev, "netns", host])?;
        ip(&["link", "set", rdev, "netns", ns[1]])?;
        bring_up(host, hdev, Some(addr), mtu)?;
        bring_up(ns[1], rdev, None, mtu)?;
    }
    Ok(())
}

/// SIGTERM to every PID, up to `grace` for them to exit, then SIGKILL.
pub fn stop_pids(pids: &[u32], grace: Duration) {
    for pid in pids {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .stderr(Stdio::null())
            .status();
    }
    let deadline = Instant::now() + grace;
    for pid in pids {
        while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .stderr(Stdio::null())
            .status();
    }
}
