//! The running lab: the namespace with its bridge, the host endpoint, the
//! VMs on it, guest commands, captures and rxe's counters. Everything it
//! starts is recorded under the run directory (PID files checked against
//! the process's command line) and removed on drop, and a new lab first
//! removes whatever an interrupted one left.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use netlab::{ip, netns_del};

use crate::agent::{Agent, GuestOutput};
use crate::image::Image;
use crate::net::*;
use crate::{io_err, Accel, Error, Result, Settings, VmId};

/// A command running in the background in a VM.
#[derive(Debug, Clone)]
pub struct GuestJob {
    pub vm: VmId,
    /// Its guest PID, which is also its process group.
    pub pid: u64,
    /// Its output in the guest; the exit status goes to `LOG.rc`.
    pub log: String,
}

struct Vm {
    id: VmId,
    child: Option<Child>,
    agent: Agent,
    console: PathBuf,
    boot: Duration,
}

/// The lab; see the module docs.
pub struct Lab {
    settings: Settings,
    vms: Vec<Vm>,
    accel: &'static str,
    keep: bool,
}

static JOBS: AtomicU32 = AtomicU32::new(0);

fn ns_sysctl(key: &str, value: &str) {
    // Written through /proc: procps's sysctl may not be installed.
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    let _ = Command::new("ip")
        .args(["netns", "exec", NETNS, "sh", "-c"])
        .arg(format!("echo {value} > {path}"))
        .stderr(Stdio::null())
        .status();
}

/// The PID in `pidfile` if that process is still the one recorded: its
/// command line contains `marker`.
fn live_pid(pidfile: &Path, marker: &str) -> Option<u32> {
    let pid: u32 = fs::read_to_string(pidfile).ok()?.trim().parse().ok()?;
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    cmdline.contains(marker).then_some(pid)
}

fn vm_marker(id: VmId) -> String {
    format!("-name rxevm-{id}")
}

/// Stops every VM and capture recorded under the run directory and deletes
/// the namespace: what an interrupted run (or `--keep`) left behind.
pub fn stop_all(settings: &Settings) {
    if let Ok(dir) = fs::read_dir(&settings.run) {
        for e in dir.filter_map(|e| e.ok()) {
            let name = e.file_name().to_string_lossy().to_string();
            let marker = match name.strip_suffix(".pid") {
                Some("capture") => "tcpdump".to_string(),
                Some(v) => match VmId::parse(v) {
                    Some(id) => vm_marker(id),
                    None => continue,
                },
                None => continue,
            };
            if let Some(pid) = live_pid(&e.path(), &marker) {
                netlab::stop_pids(&[pid], Duration::from_secs(5));
            }
            let _ = fs::remove_file(e.path());
        }
    }
    netns_del(NETNS);
}

fn net_up(vms: &[VmId], queues: u32) -> Result<()> {
    let ipe = |args: &[&str]| {
        ip(args).map_err(|e| Error::Command {
            what: "set up the VM network".into(),
            detail: e.to_string(),
        })
    };
    let mtu = MTU.to_string();
    ipe(&["netns", "add", NETNS])?;
    ipe(&["-n", NETNS, "link", "set", "lo", "up"])?;
    ipe(&[
        "-n",
        NETNS,
        "link",
        "add",
        BRIDGE,
        "type",
        "bridge",
        "stp_state",
        "0",
        "forward_delay",
        "0",
        "mcast_snooping",
        "0",
    ])?;
    ns_sysctl(&format!("net.ipv6.conf.{BRIDGE}.disable_ipv6"), "1");
    // The bridge is a plain wire: with br_netfilter loaded (it is here) it
    // would validate IP headers and drop malformed frames (the hostile
    // generator's truncated ones) before they reach a guest.
    for k in ["iptables", "ip6tables", "arptables"] {
        ns_sysctl(&format!("net.bridge.bridge-nf-call-{k}"), "0");
    }
    // The bridge itself never answers ARP: replies come from the endpoint
    // that owns the address, where XDP sees the traffic that follows.
    ns_sysctl(&format!("net.ipv4.conf.{BRIDGE}.arp_ignore"), "8");
    ipe(&["-n", NETNS, "link", "set", BRIDGE, "mtu", &mtu, "up"])?;
    ipe(&[
        "-n", NETNS, "link", "add", HOST_IF, "mtu", &mtu, "type", "veth", "peer", "name",
        HOST_PORT, "mtu", &mtu,
    ])?;
    for k in ["accept_ra", "accept_dad", "router_solicitations"] {
        ns_sysctl(&format!("net.ipv6.conf.{HOST_IF}.{k}"), "0");
    }
    ns_sysctl(&format!("net.ipv6.conf.{HOST_PORT}.disable_ipv6"), "1");
    ipe(&[
        "-n", NETNS, "link", "set", HOST_PORT, "master", BRIDGE, "up",
    ])?;
    ipe(&[
        "-n",
        NETNS,
        "addr",
        "add",
        &format!("{HOST_IP}/24"),
        "dev",
        HOST_IF,
    ])?;
    ipe(&[
        "-n",
        NETNS,
        "-6",
        "addr",
        "add",
        &format!("{HOST_IP6}/64"),
        "dev",
        HOST_IF,
        "nodad",
    ])?;
    ipe(&["-n", NETNS, "link", "set", HOST_IF, "up"])?;
    for v in vms {
        let tap = v.tap();
        let mut tuntap = vec!["-n", NETNS, "tuntap", "add", "dev", &tap, "mode", "tap"];
        if queues > 1 {
            tuntap.push("multi_queue");
        }
        ipe(&tuntap)?;
        ns_sysctl(&format!("net.ipv6.conf.{tap}.disable_ipv6"), "1");
        ipe(&[
            "-n", NETNS, "link", "set", &tap, "mtu", &mtu, "master", BRIDGE, "up",
        ])?;
    }
    Ok(())
}

fn tail(path: &Path, n: usize) -> String {
    let text = fs::read(path)
        .map(|d| String::from_utf8_lossy(&d).into_owned())
        .unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// The crash a kernel console shows, in one line: its first "Oops:",
/// "BUG:" or "Kernel panic" line without the timestamp, the RIP, and up to
/// eight call trace frames the unwinder is sure of (no leading `?`).
fn panic_summary(console: &str) -> Option<String> {
    let body = |l: &str| match l.find("] ") {
        Some(i) if l.starts_with('[') => l[i + 2..].trim().to_string(),
        _ => l.trim().to_string(),
    };
    let lines: Vec<String> = console.lines().map(body).collect();
    let first = lines.iter().position(|l| {
        l.starts_with("Oops:") || l.starts_with("BUG:") || l.starts_with("Kernel panic")
    })?;
    let mut out = vec![lines[first].clone()];
    let rest = &lines[first..];
    if let Some(rip) = rest.iter().find(|l| l.starts_with("RIP: 0010:")) {
        out.push(rip.clone());
    }
    if let Some(at) = rest.iter().position(|l| l == "Call Trace:") {
        let frames: Vec<&str> = rest[at + 1..]
            .iter()
            .take_while(|l| *l != "</TASK>")
            .filter(|l| !l.starts_with('?') && *l != "<TASK>")
            .map(|l| l.split('+').next().unwrap_or(l))
            .take(8)
            .collect();
        out.push(format!("called from {}", frames.join(" < ")));
    }
    Some(out.join("; "))
}

impl Lab {
    /// Boots `vms` on a fresh network (removing a previous lab's leftovers
    /// first) and waits until rxe0 exists in each and its agent answers.
    /// With `keep`, the VMs outlive this process (own process group, not
    /// stopped on drop: `stop_all` removes them).
    pub fn start(settings: &Settings, image: &Image, vms: &[VmId], keep: bool) -> Result<Lab> {
        stop_all(settings);
        fs::create_dir_all(&settings.run)
            .map_err(io_err(format!("create {}", settings.run.display())))?;
        let accel = match settings.accel {
            Accel::Kvm => true,
            Accel::Tcg => false,
            Accel::Auto => image.kvm_works,
        };
        let mut lab = Lab {
            settings: settings.clone(),
            vms: Vec::new(),
            accel: if accel { "kvm" } else { "tcg" },
            keep,
        };
        net_up(vms, settings.queues)?;
        let t0 = Instant::now();
        for &id in vms {
            let vm = lab.spawn_vm(image, id, accel)?;
            lab.vms.push(vm);
        }
        for i in 0..lab.vms.len() {
            lab.wait_ready(i, t0)?;
        }
        Ok(lab)
    }

    fn spawn_vm(&self, image: &Image, id: VmId, kvm: bool) -> Result<Vm> {
        let run = &self.settings.run;
        let file = |ext: &str| run.join(format!("{id}.{ext}"));
        for ext in ["pid", "qga", "console", "qemu.log"] {
            let _ = fs::remove_file(file(ext));
        }
        let qemu_log = fs::File::create(file("qemu.log")).map_err(io_err("create the QEMU log"))?;
        let mut c = image.qemu.command(&["ip", "netns", "exec", NETNS]);
        c.args(["-name", &format!("rxevm-{id}"), "-machine", "pc"]);
        // By default one vCPU per queue pair, so each queue's interrupts
        // and data path can have a CPU of their own in the guest.
        let cpus = match self.settings.cpus {
            0 => self.settings.queues,
            n => n,
        };
        if kvm {
            c.args(["-accel", "kvm", "-cpu", "host"]);
        } else {
            // qemu64: "max" once crashed the guest kernel under TCG; a
            // 256 MiB code cache keeps QEMU's memory bounded. Several vCPUs
            // share one translation thread: with a thread each, a vCPU
            // executed a breakpoint the kernel had already patched away
            // (an int3 Oops in a static branch, text_poke racing between
            // vCPUs), which panicked the guest.
            let tcg = if cpus > 1 {
                "tcg,thread=single,tb-size=256"
            } else {
                "tcg,thread=multi,tb-size=256"
            };
            c.args(["-accel", tcg, "-cpu", "qemu64"]);
        }
        let smp = cpus.to_string();
        c.args(["-smp", &smp, "-m", &self.settings.mem_mib.to_string()])
            .args(["-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"])
            .arg("-kernel")
            .arg(&image.kernel)
            .arg("-initrd")
            .arg(&image.initrd)
            .arg("-append")
            .arg(format!(
                "console=ttyS0 quiet panic=-1 mitigations=off rxevm.name={id} rxevm.ip={}/24 rxevm.ip6={}/64 rxevm.mtu={MTU}",
                id.ip(),
                id.ip6()
            ))
            .arg("-serial")
            .arg(format!("file:{}", file("console").display()))
            .arg("-netdev")
            .arg(format!(
                "tap,id=net0,ifname={},script=no,downscript=no,queues={}",
                id.tap(),
                self.settings.queues
            ))
            .arg("-device")
            .arg(format!(
                "virtio-net-pci,netdev=net0,mac={},romfile={}",
                id.mac(),
                if self.settings.queues > 1 {
                    // One MSI-X vector per queue each way, config and
                    // control. A modern-only device behind the DMA API
                    // (iommu_platform): virtio-net's AF_XDP zero-copy needs
                    // a DMA device for its queues.
                    format!(
                        ",mq=on,vectors={},disable-legacy=on,iommu_platform=on",
                        2 * self.settings.queues + 2
                    )
                } else {
                    String::new()
                }
            ))
            .args(["-device", "virtio-serial-pci", "-chardev"])
            .arg(format!("socket,id=qga0,path={},server=on,wait=off", file("qga").display()))
            .args(["-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0"])
            .arg("-pidfile")
            .arg(file("pid"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(qemu_log);
        if self.keep {
            c.process_group(0);
        }
        let child = c.spawn().map_err(io_err("start QEMU"))?;
        Ok(Vm {
            id,
            child: Some(child),
            agent: Agent::new(&file("qga")),
            console: file("console"),
            boot: Duration::ZERO,
        })
    }

    fn wait_ready(&mut self, i: usize, t0: Instant) -> Result<()> {
        let timeout = self.settings.boot_timeout;
        let log = self
            .settings
            .run
            .join(format!("{}.qemu.log", self.vms[i].id));
        let vm = &mut self.vms[i];
        loop {
            if let Some(c) = &mut vm.child {
                if !matches!(c.try_wait(), Ok(None)) {
                    return Err(Error::Guest(format!(
                        "VM {} exited while booting: {} {}",
                        vm.id,
                        tail(&log, 3),
                        tail(&vm.console, 5)
                    )));
                }
            }
            let console = fs::read(&vm.console).unwrap_or_default();
            if String::from_utf8_lossy(&console).contains("RXEVM-READY")
                && vm.agent.ping(Duration::from_secs(3))
            {
                vm.boot = t0.elapsed();
                return Ok(());
            }
            if t0.elapsed() > timeout {
                return Err(Error::Guest(format!(
                    "VM {} not ready after {} s: {}",
                    vm.id,
                    timeout.as_secs(),
                    tail(&vm.console, 5)
                )));
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    fn vm(&self, id: VmId) -> Result<&Vm> {
        self.vms
            .iter()
            .find(|v| v.id == id)
            .ok_or_else(|| Error::Guest(format!("VM {id} is not part of this lab")))
    }

    /// "kvm" or "tcg".
    pub fn accel(&self) -> &'static str {
        self.accel
    }

    /// Seconds from starting QEMU until the VM was ready.
    pub fn boot_time(&self, id: VmId) -> Duration {
        self.vm(id).map(|v| v.boot).unwrap_or_default()
    }

    /// If VM `id`'s kernel crashed (its console shows an Oops or a
    /// panic; the VM then exits, `panic=-1`), a one-line summary: the
    /// crash, where, and the call trace's certain frames.
    pub fn kernel_panic(&self, id: VmId) -> Option<String> {
        let text = fs::read(&self.vm(id).ok()?.console).ok()?;
        panic_summary(&String::from_utf8_lossy(&text))
    }

    pub fn agent(&self, id: VmId) -> Result<&Agent> {
        Ok(&self.vm(id)?.agent)
    }

    /// Runs `cmd` (a shell command line) in VM `id`, killed after `timeout`.
    pub fn exec(&self, id: VmId, cmd: &str, timeout: Duration) -> Result<GuestOutput> {
        self.vm(id)?.agent.exec(cmd, timeout)
    }

    /// Copies a host file into VM `id` at `guest_path`, with `mode`.
    pub fn put_file(&self, id: VmId, host_path: &Path, guest_path: &str, mode: u32) -> Result<()> {
        let bytes = fs::read(host_path).map_err(io_err(format!("read {}", host_path.display())))?;
        self.vm(id)?.agent.put_file(guest_path, &bytes, mode)
    }

    /// Starts `cmd` in the background in VM `id`, in a session of its own.
    pub fn spawn(&self, id: VmId, cmd: &str) -> Result<GuestJob> {
        let log = format!("/tmp/job-{}.log", JOBS.fetch_add(1, Ordering::Relaxed));
        let esc = cmd.replace('\'', r"'\''");
        let line = format!(
            "rm -f {log}.rc; setsid /bin/sh -c '/bin/sh -c \"$1\" </dev/null >{log} 2>&1; echo $? >{log}.rc' sh '{esc}' >/dev/null 2>&1 & echo $!"
        );
        let out = self.exec(id, &line, Duration::from_secs(30))?;
        let pid = out.stdout.trim().parse().map_err(|_| {
            Error::Guest(format!(
                "starting `{cmd}` in VM {id}: {}",
                out.stderr.trim()
            ))
        })?;
        Ok(GuestJob { vm: id, pid, log })
    }

    /// Waits for a background command; one still running after `timeout`
    /// is killed (its output so far is returned, with `timed_out`).
    pub fn wait(&self, job: &GuestJob, timeout: Duration) -> Result<GuestOutput> {
        let log = &job.log;
        let cmd =
            format!("while [ ! -e {log}.rc ]; do sleep 0.1; done; cat {log}; exit $(cat {log}.rc)");
        let out = self.exec(job.vm, &cmd, timeout)?;
        if !out.timed_out {
            return Ok(out);
        }
        self.kill(job);
        let log = self.exec(job.vm, &format!("cat {log}"), Duration::from_secs(10))?;
        Ok(GuestOutput {
            stdout: log.stdout,
            stderr: "timed out".into(),
            code: 124,
            timed_out: true,
        })
    }

    /// Stops a background command and everything it started.
    pub fn kill(&self, job: &GuestJob) {
        let pid = job.pid;
        let _ = self.exec(
            job.vm,
            &format!("kill -TERM -{pid} 2>/dev/null; sleep 1; kill -KILL -{pid} 2>/dev/null; true"),
            Duration::from_secs(10),
        );
    }

    /// A host command run inside the namespace (where 10.99.0.1 and the VMs
    /// are reachable).
    pub fn host(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", NETNS]).arg(program);
        c
    }

    /// rxe0's hardware counters in VM `id` (rdma_rxe's `hw_counters`).
    pub fn counters(&self, id: VmId) -> Result<BTreeMap<String, i64>> {
        let out = self.exec(
            id,
            "cd /sys/class/infiniband/rxe0/ports/1/hw_counters && grep . *",
            Duration::from_secs(20),
        )?;
        let m: BTreeMap<String, i64> = out
            .stdout
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(':')?;
                Some((k.to_string(), v.trim().parse().ok()?))
            })
            .collect();
        if m.is_empty() {
            return Err(Error::Guest(format!(
                "no rxe counters in VM {id}: {}",
                out.stderr.trim()
            )));
        }
        Ok(m)
    }

    /// Frames the host dropped on their way into VM `id` (its tap's TX queue
    /// overflows when an emulated guest falls behind).
    pub fn tap_tx_dropped(&self, id: VmId) -> i64 {
        let f = format!("/sys/class/net/{}/statistics/tx_dropped", id.tap());
        self.host("cat")
            .arg(f)
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(0)
    }

    /// Starts tcpdump on the bridge, writing `file` (all host<->VM and
    /// VM<->VM traffic; loopback inside a VM never reaches it).
    pub fn capture(&self, file: &Path, filter: &[&str]) -> Result<Capture> {
        let log = self.settings.run.join("capture.log");
        let pidfile = self.settings.run.join("capture.pid");
        let err = fs::File::create(&log).map_err(io_err("create the capture log"))?;
        let child = self
            .host("tcpdump")
            // --immediate-mode: every packet reaches tcpdump at once. By
            // default the kernel hands them over a buffer block (or a
            // second) at a time, and a capture stopped right after a short
            // exchange wrote nothing (measured: "200 packets received by
            // filter, 0 captured").
            .args([
                "-Z",
                "root",
                "-i",
                BRIDGE,
                "-s",
                "0",
                "-U",
                "--immediate-mode",
                "-n",
                "-w",
            ])
            .arg(file)
            .args(filter)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .map_err(io_err("start tcpdump"))?;
        let _ = fs::write(&pidfile, child.id().to_string());
        let mut cap = Capture {
            child: Some(child),
            pidfile,
        };
        let t0 = Instant::now();
        loop {
            if tail(&log, 5).contains("listening on") {
                return Ok(cap);
            }
            if let Some(c) = &mut cap.child {
                if !matches!(c.try_wait(), Ok(None)) || t0.elapsed() > Duration::from_secs(10) {
                    return Err(Error::Guest(format!(
                        "tcpdump did not start: {}",
                        tail(&log, 3)
                    )));
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        for vm in &mut self.vms {
            if let Some(mut c) = vm.child.take() {
                // QEMU quits on SIGTERM; `ip netns exec` exec'd it, so the
                // child is QEMU itself.
                netlab::stop_pids(&[c.id()], Duration::from_secs(5));
                let _ = c.wait();
            }
            let _ = fs::remove_file(self.settings.run.join(format!("{}.pid", vm.id)));
            let _ = fs::remove_file(self.settings.run.join(format!("{}.qga", vm.id)));
        }
        netns_del(NETNS);
    }
}

/// A running tcpdump; stopped (SIGINT, so it flushes the file) by `stop`
/// or on drop.
pub struct Capture {
    child: Option<Child>,
    pidfile: PathBuf,
}

impl Capture {
    pub fn stop(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        // Give the last packets time to be written.
        std::thread::sleep(Duration::from_millis(300));
        let _ = Command::new("kill")
            .args(["-INT", &c.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        let _ = c.wait();
        let _ = fs::remove_file(&self.pidfile);
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod panic_tests {
    use super::panic_summary;

    #[test]
    fn a_console_with_a_crash_gives_it_in_one_line() {
        // From a TCG guest of 2026-12-06 (trimmed).
        let console = "RXEVM-READY b 6.04
[   84.508476] traps: PANIC: double fault, error_code: 0x0
[   84.511848] Oops: double fault: 0000 [#1] SMP NOPTI
[   84.512781] CPU: 0 UID: 0 PID: 340 Comm: rdma-xdp Not tainted 6.16.12+deb13-amd64 #1
[   84.513150] RIP: 0010:kmem_cache_alloc_node_noprof+0x70/0x400
[   84.514994] Call Trace:
[   84.516410]  <TASK>
[   84.517164]  ? kmalloc_reserve+0x93/0x100
[   84.517252]  kmalloc_reserve+0x93/0x100
[   84.517475]  __alloc_skb+0x89/0x1a0
[   84.517585]  __xsk_generic_xmit+0x778/0xb70
[   84.517669]  xsk_sendmsg+0xda/0x1c0
[   84.517779]  ? psi_task_switch+0x131/0x390
[   84.517395]  </TASK>
[   84.521534] Kernel panic - not syncing: Fatal exception in interrupt
";
        assert_eq!(
            panic_summary(console).unwrap(),
            "Oops: double fault: 0000 [#1] SMP NOPTI; \
             RIP: 0010:kmem_cache_alloc_node_noprof+0x70/0x400; \
             called from kmalloc_reserve < __alloc_skb < __xsk_generic_xmit < xsk_sendmsg"
        );
        assert_eq!(panic_summary("RXEVM-READY a 5.1\n[ 1.0] eth0: up\n"), None);
    }
}
