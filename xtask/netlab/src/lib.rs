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
    veth_pair_queues(ns, devs, addrs, mtu, 1)
}

/// [`veth_pair`] with `queues` RX and TX queues on each end. A frame sent
/// on TX queue q of one end arrives on RX queue q of the other (veth keeps
/// the queue mapping), so a sender picks the receiver's queue.
pub fn veth_pair_queues(
    ns: [&str; 2],
    devs: [&str; 2],
    addrs: [&str; 2],
    mtu: Option<u32>,
    queues: u32,
) -> io::Result<()> {
    for n in ns {
        ip(&["netns", "add", n])?;
    }
    let q = queues.max(1).to_string();
    ip(&[
        "link",
        "add",
        devs[0],
        "numtxqueues",
        &q,
        "numrxqueues",
        &q,
        "type",
        "veth",
        "peer",
        "name",
        devs[1],
        "numtxqueues",
        &q,
        "numrxqueues",
        &q,
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
    star_topology(
        &Star {
            hosts: &[ns[0]],
            host_devs: &[devs[0]],
            host_addrs: &[addrs[0]],
            switch: ns[1],
            switch_devs: &[devs[1]],
            sink: ns[2],
            sink_dev: devs[3],
            sink_addr: addrs[1],
            switch_sink_dev: devs[2],
        },
        mtu,
    )
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

/// N hosts - switch - one host: `hosts[i]` reaches the switch namespace
/// over `host_devs[i]` (the switch's end `switch_devs[i]`), and `sink`
/// over `sink_dev` (the switch's end `switch_sink_dev`). The switch's ends
/// have no address; every host is in one /24.
pub struct Star<'a> {
    pub hosts: &'a [&'a str],
    pub host_devs: &'a [&'a str],
    pub host_addrs: &'a [&'a str],
    pub switch: &'a str,
    pub switch_devs: &'a [&'a str],
    pub sink: &'a str,
    pub sink_dev: &'a str,
    pub sink_addr: &'a str,
    pub switch_sink_dev: &'a str,
}

pub fn star_topology(s: &Star, mtu: Option<u32>) -> io::Result<()> {
    for n in s.hosts.iter().chain([&s.switch, &s.sink]) {
        ip(&["netns", "add", n])?;
    }
    let links = (0..s.hosts.len())
        .map(|i| {
            (
                s.hosts[i],
                s.host_devs[i],
                s.switch_devs[i],
                s.host_addrs[i],
            )
        })
        .chain([(s.sink, s.sink_dev, s.switch_sink_dev, s.sink_addr)]);
    for (host, hdev, sdev, addr) in links {
        ip(&["link", "add", hdev, "type", "veth", "peer", "name", sdev])?;
        ip(&["link", "set", hdev, "netns", host])?;
        ip(&["link", "set", sdev, "netns", s.switch])?;
        bring_up(host, hdev, Some(addr), mtu)?;
        bring_up(s.switch, sdev, None, mtu)?;
    }
    Ok(())
}
