//! Two hosts in network namespaces joined by a veth pair, with daemons.
//! Everything is removed on drop, also when a test fails; tests hold the
//! SERIAL lock so that only one pair of data paths runs at a time.

#![allow(dead_code)]

use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;

pub static SERIAL: Mutex<()> = Mutex::new(());
static NEXT: AtomicU32 = AtomicU32::new(0);

pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

pub const BIN: &str = env!("CARGO_BIN_EXE_rdma-xdp");

/// Builds the drop-in libibverbs.so.1 (and its librdmacm.so.1 link) once,
/// beside rdma-xdp, where `rdma-xdp exec` looks.
pub fn library() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let ws = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .to_path_buf();
        ibverbs_so::build(&ws, false).expect("build libibverbs.so.1")
    })
}

pub struct Lab {
    pub ns: [String; 2],
    pub dev: [String; 2],
    pub addr: [String; 2],
    pub daemons: [Option<Child>; 2],
    pub relay: Option<Relay>,
}

/// The middle namespace of a relayed lab.
pub struct Relay {
    pub ns: String,
    /// Its interfaces towards A and towards B.
    pub dev: [String; 2],
    /// The running `rdma-xdp relay`, killed with the lab if a test fails.
    proc: Option<Child>,
}

impl Lab {
    pub fn new(mtu: u32) -> Lab {
        Self::build(Lab::new_empty(), mtu)
    }

    /// Two hosts on a veth pair with `queues` queues each way.
    pub fn with_queues(mtu: u32, queues: u32) -> Lab {
        let lab = Lab::new_empty();
        let (ns, dev, addr) = (&lab.ns, &lab.dev, &lab.addr);
        if let Err(e) = netlab::veth_pair_queues(
            [&ns[0], &ns[1]],
            [&dev[0], &dev[1]],
            [&addr[0], &addr[1]],
            Some(mtu),
            queues,
        ) {
            panic!("build the lab: {e}");
        }
        lab
    }

    /// Host A - relay namespace - host B; frames between A and B pass the
    /// relay's two interfaces (see `start_relay`).
    pub fn with_relay(mtu: u32) -> Lab {
        let mut lab = Lab::new_empty();
        let tag = lab.ns[0].trim_end_matches("-a").to_string();
        let rdev = [format!("{}ra", lab.dev[0]), format!("{}rb", lab.dev[0])];
        lab.relay = Some(Relay {
            ns: format!("{tag}-r"),
            dev: rdev,
            proc: None,
        });
        Self::build(lab, mtu)
    }

    fn new_empty() -> Lab {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id() % 100000;
        let tag = format!("{pid}x{n}");
        Lab {
            ns: [format!("rt-{tag}-a"), format!("rt-{tag}-b")],
            dev: [format!("rt{tag}a"), format!("rt{tag}b")],
            addr: [format!("10.66.{n}.1"), format!("10.66.{n}.2")],
            daemons: [None, None],
            relay: None,
        }
    }

    fn build(lab: Lab, mtu: u32) -> Lab {
        let (ns, dev, addr) = (&lab.ns, &lab.dev, &lab.addr);
        let addrs = [addr[0].as_str(), addr[1].as_str()];
        let r = match &lab.relay {
            Some(Relay {
                ns: rns, dev: rdev, ..
            }) => netlab::relay_topology(
                [&ns[0], rns, &ns[1]],
                [&dev[0], &rdev[0], &rdev[1], &dev[1]],
                addrs,
                Some(mtu),
            ),
            None => netlab::veth_pair([&ns[0], &ns[1]], [&dev[0], &dev[1]], addrs, Some(mtu)),
        };
        if let Err(e) = r {
            panic!("build the lab: {e}");
        }
        lab
    }

    /// Starts `rdma-xdp relay` between A and B with these impairment flags;
    /// `stop_relay` reads its counters.
    pub fn start_relay(&mut self, flags: &[&str]) {
        let r = self.relay.as_mut().expect("a lab with a relay");
        let c = Command::new("ip")
            .args(["netns", "exec", &r.ns, BIN, "--json", "relay"])
            .args(["--a", &r.dev[0], "--b", &r.dev[1]])
            .args(flags)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start relay");
        r.proc = Some(c);
        std::thread::sleep(Duration::from_millis(200));
    }

    /// SIGTERMs the relay and returns its final counters.
    pub fn stop_relay(&mut self) -> Value {
        let c = self
            .relay
            .as_mut()
            .and_then(|r| r.proc.take())
            .expect("a running relay");
        let out = terminate(c);
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "relay report: {e}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    /// Moves B's end of the veth pair into A's namespace, addressed and
    /// up: one process can then open both ends.
    pub fn both_ends_in_a(&self) {
        let run = |args: &[&str]| {
            let st = Command::new("ip").args(args).status().expect("ip");
            assert!(st.success(), "ip {}", args.join(" "));
        };
        let (ns, dev) = (&self.ns, &self.dev);
        run(&["-n", &ns[1], "link", "set", &dev[1], "netns", &ns[0]]);
        let cidr = format!("{}/24", self.addr[1]);
        run(&["-n", &ns[0], "addr", "add", &cidr, "dev", &dev[1]]);
        run(&["-n", &ns[0], "link", "set", &dev[1], "up"]);
    }

    pub fn exec(&self, i: usize, prog: &str, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.ns[i], prog])
            .args(args)
            .output()
            .expect("ip netns exec")
    }

    /// Starts `BIN ARGS` in host i's namespace with stdout and stderr piped
    /// (the long-running twin of `exec`).
    pub fn spawn(&self, i: usize, args: &[&str]) -> Child {
        Command::new("ip")
            .args(["netns", "exec", &self.ns[i], BIN])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {} on host {i}: {e}", args.join(" ")))
    }

    /// `rdma --json ARGS` on host i; Ok(json) or Err(stderr line).
    pub fn rdma(&self, i: usize, args: &[&str]) -> Result<Value, String> {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        let out = self.exec(i, BIN, &a);
        if out.status.success() {
            serde_json::from_slice(&out.stdout).map_err(|e| format!("bad JSON: {e}"))
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }

    /// `post write|read` on host 0's QP `qp` against the peer's memory at
    /// `remote_addr`/`rkey`; `args` names the local side (`--data HEX`,
    /// `--len N`, `--offset O`) and any extra flags.
    pub fn post(
        &self,
        op: &str,
        qp: impl std::fmt::Display,
        lkey: u64,
        args: &[&str],
        remote_addr: u64,
        rkey: u64,
    ) -> Result<Value, String> {
        let (qp, lkey, ra, rkey) = (
            qp.to_string(),
            lkey.to_string(),
            remote_addr.to_string(),
            rkey.to_string(),
        );
        let mut a = vec!["post", op, "--qp", &qp, "--key", &lkey];
        a.extend_from_slice(args);
        a.extend_from_slice(&["--remote-addr", &ra, "--rkey", &rkey]);
        self.rdma(0, &a)
    }

    /// `post` that must succeed.
    pub fn post_ok(
        &self,
        op: &str,
        qp: impl std::fmt::Display,
        lkey: u64,
        args: &[&str],
        remote_addr: u64,
        rkey: u64,
    ) -> Value {
        self.post(op, qp, lkey, args, remote_addr, rkey)
            .unwrap_or_else(|e| panic!("post {op} on host 0: {e}"))
    }

    pub fn ok(&self, i: usize, args: &[&str]) -> Value {
        self.rdma(i, args)
            .unwrap_or_else(|e| panic!("rdma {} on host {i}: {e}", args.join(" ")))
    }

    /// Starts the daemon on host i (adaptive polling) and waits until it serves.
    pub fn up(&mut self, i: usize, extra: &[&str]) {
        let mut args = vec!["up", "--iface", &self.dev[i], "--adaptive"];
        args.extend_from_slice(extra);
        let child = self.spawn(i, &args);
        self.daemons[i] = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.rdma(i, &["mr", "list"]).is_ok() {
                return;
            }
            if let Some(c) = self.daemons[i].as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    let out = self.daemons[i].take().unwrap().wait_with_output().unwrap();
                    panic!(
                        "daemon exited ({st}): {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("daemon on host {i} did not come up");
    }

    /// SIGTERM the daemon and return what it printed.
    pub fn stop(&mut self, i: usize) -> String {
        let Some(c) = self.daemons[i].take() else {
            return String::new();
        };
        let out = terminate(c);
        String::from_utf8_lossy(&out.stderr).to_string()
    }

    pub fn kill9(&mut self, i: usize) {
        if let Some(mut c) = self.daemons[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn xdp_attached(&self, i: usize) -> bool {
        let out = self.exec(i, "ip", &["-d", "link", "show", "dev", &self.dev[i]]);
        String::from_utf8_lossy(&out.stdout).contains("prog/xdp")
    }

    pub fn mac(&self, i: usize) -> [u8; 6] {
        let out = self.exec(
            i,
            "cat",
            &[&format!("/sys/class/net/{}/address", self.dev[i])],
        );
        rdma_user::io::hostnet::parse_mac(&String::from_utf8_lossy(&out.stdout)).unwrap()
    }

    /// Registers an MR on host i; returns (addr, lkey, rkey).
    pub fn mr(&self, i: usize, len: usize, access: &str) -> (u64, u64, u64) {
        let v = self.ok(
            i,
            &["mr", "reg", "--len", &len.to_string(), "--access", access],
        );
        (
            v["addr"].as_u64().unwrap(),
            v["lkey"].as_u64().unwrap(),
            v["rkey"].as_u64().unwrap(),
        )
    }

    /// Creates a QP on each host and connects them; returns (qpn A, qpn B).
    pub fn connect(&self) -> (u64, u64) {
        let (qa, qb, _) = self.connect_recovery();
        (qa, qb)
    }

    /// As [`Lab::connect`], with the loss recovery the two daemons agreed
    /// on ("selective-repeat" or "go-back-N").
    pub fn connect_recovery(&self) -> (u64, u64, String) {
        let qa = self.ok(0, &["qp", "create"])["qpn"].as_u64().unwrap();
        let qb = self.ok(1, &["qp", "create"])["qpn"].as_u64().unwrap();
        let v = self.ok(
            0,
            &[
                "qp",
                "connect",
                &qa.to_string(),
                "--peer",
                &self.addr[1],
                "--remote-qpn",
                &qb.to_string(),
            ],
        );
        (qa, qb, v["recovery"].as_str().unwrap_or("").to_string())
    }

    /// Sends raw frames from host i's interface (AF_PACKET).
    pub fn inject(&self, i: usize, frames: &[Vec<u8>]) {
        let hexes: Vec<String> = frames
            .iter()
            .map(|f| rdma_user::control::proto::hex(f))
            .collect();
        let mut args = vec!["inject", "--dev", &self.dev[i]];
        for h in &hexes {
            args.push("--hex");
            args.push(h);
        }
        let out = self.exec(i, BIN, &args);
        assert!(
            out.status.success(),
            "inject: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn mr_bytes(&self, i: usize, key: u64, off: u64, len: u64) -> Vec<u8> {
        let v = self.ok(
            i,
            &[
                "mr",
                "read",
                &key.to_string(),
                "--offset",
                &off.to_string(),
                "--len",
                &len.to_string(),
            ],
        );
        rdma_user::control::proto::unhex(v["data"].as_str().unwrap()).unwrap()
    }
}

/// Runs `f` on a thread that has entered network namespace `ns`: sockets it
/// opens live there.
pub fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let fd = std::fs::File::open(&path).expect("netns file");
        // SAFETY: setns on this thread only, with a valid namespace fd.
        let r = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&fd), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    })
}

/// SIGTERM (so it cleans up and reports), then wait up to 10 s and kill.
/// `ip netns exec` execs its command, so the child's pid is the tool's.
pub fn terminate(c: Child) -> Output {
    let _ = Command::new("kill")
        .args(["-TERM", &c.id().to_string()])
        .status();
    wait_timeout(c, Duration::from_secs(10))
}

pub fn wait_timeout(mut c: Child, t: Duration) -> Output {
    let deadline = Instant::now() + t;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = c.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = c.kill();
    c.wait_with_output().expect("wait")
}

impl Drop for Lab {
    fn drop(&mut self) {
        for i in 0..2 {
            if let Some(c) = self.daemons[i].take() {
                terminate(c);
            }
        }
        let relay_ns = self.relay.as_mut().map(|r| {
            if let Some(c) = r.proc.take() {
                terminate(c);
            }
            r.ns.clone()
        });
        for s in self.ns.iter().chain(relay_ns.iter()) {
            netlab::netns_del(s);
        }
    }
}
