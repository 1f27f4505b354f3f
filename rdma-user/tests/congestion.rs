//! The congestion test bed's parts in namespaces: two `rdma-xdp flow`
//! senders through the relay in switch mode (a 200 Mbit/s CE-marking
//! bottleneck) into one flow server. Root only. What `cargo xtask
//! congestion` measures rests on these counts adding up.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_rdma-xdp");

/// The namespaces of one run, removed on drop (also when a test fails),
/// with the processes started in them.
struct Star {
    ns: Vec<String>,
    procs: Vec<Child>,
    dir: PathBuf,
}

impl Drop for Star {
    fn drop(&mut self) {
        for c in &mut self.procs {
            let _ = c.kill();
            let _ = c.wait();
        }
        for n in &self.ns {
            netlab::netns_del(n);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn exec(ns: &str, args: &[&str], log: &Path) -> Child {
    Command::new("ip")
        .args(["netns", "exec", ns, BIN])
        .args(args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("spawn rdma-xdp")
}

fn json(p: &Path) -> Value {
    let t = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&t).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn sigterm(c: &Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &c.id().to_string()])
        .status();
}

fn wait(c: &mut Child, t: Duration, what: &str, log: &Path) {
    let deadline = Instant::now() + t;
    loop {
        if let Some(st) = c.try_wait().unwrap() {
            assert!(
                st.success(),
                "{what}: {st}: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
            return;
        }
        assert!(Instant::now() < deadline, "{what} did not finish in {t:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn two_flows_through_the_switch_are_counted_per_port_and_their_cnps_come_back() {
    let tag = format!("rc{}", std::process::id() % 100000);
    let ns: Vec<String> = ["s0", "s1", "w", "r"]
        .iter()
        .map(|s| format!("{tag}-{s}"))
        .collect();
    let dir = std::env::temp_dir().join(format!("{tag}-congestion"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut star = Star {
        ns: ns.clone(),
        procs: Vec::new(),
        dir: dir.clone(),
    };
    let d = |s: &str| format!("{tag}{s}");
    let (s0, s1, w0, w1, wr, r) = (d("s0"), d("s1"), d("w0"), d("w1"), d("wr"), d("r"));
    netlab::star_topology(
        &netlab::Star {
            hosts: &[&ns[0], &ns[1]],
            host_devs: &[&s0, &s1],
            host_addrs: &["10.67.0.1", "10.67.0.2"],
            switch: &ns[2],
            switch_devs: &[&w0, &w1],
            sink: &ns[3],
            sink_dev: &r,
            sink_addr: "10.67.0.100",
            switch_sink_dev: &wr,
        },
        None,
    )
    .expect("the star");
    let f = |n: &str| dir.join(n);
    let (tl, rj, sj) = (f("timeline.json"), f("relay.json"), f("server.json"));
    let p = |x: &Path| x.to_str().unwrap().to_string();
    let relay_args = [
        "--json",
        "relay",
        "--a",
        &w0,
        "--a",
        &w1,
        "--b",
        &wr,
        "--rate-mbit",
        "200",
        "--queue-bytes",
        "1048576",
        "--kmin-bytes",
        "16384",
        "--kmax-bytes",
        "131072",
        "--pmax",
        "0.2",
        "--timeline",
        &p(&tl),
        "--stats-file",
        &p(&rj),
    ];
    star.procs.push(exec(&ns[2], &relay_args, &f("relay.log")));
    star.procs.push(exec(
        &ns[3],
        &["--json", &p(&sj), "flow", "--dev", &r],
        &f("server.log"),
    ));
    std::thread::sleep(Duration::from_millis(300));
    let start = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 1500;
    let mut clients = Vec::new();
    for (i, dev) in [&s0, &s1].into_iter().enumerate() {
        let out = f(&format!("flow{i}.json"));
        let args = [
            "--json",
            &p(&out),
            "flow",
            "10.67.0.100",
            "--dev",
            dev,
            "-t",
            "4",
            "--start-at",
            &start.to_string(),
            "--seconds",
            "1",
        ];
        clients.push((exec(&ns[i], &args, &f(&format!("flow{i}.log"))), out, i));
    }
    let mut flows = Vec::new();
    for (mut c, out, i) in clients {
        wait(
            &mut c,
            Duration::from_secs(30),
            "a flow client",
            &f(&format!("flow{i}.log")),
        );
        flows.push(json(&out));
    }
    // The server, then the relay, write their reports on SIGTERM.
    for (k, log) in [(1, "server.log"), (0, "relay.log")] {
        sigterm(&star.procs[k]);
        wait(&mut star.procs[k], Duration::from_secs(10), log, &f(log));
    }
    let (timeline, relay, server) = (json(&tl), json(&rj), json(&sj));

    let bins = timeline["bins"].as_array().unwrap();
    let sum =
        |k: &str, port: usize| -> u64 { bins.iter().map(|b| b[k][port].as_u64().unwrap()).sum() };
    assert_eq!(timeline["ports"].as_array().unwrap().len(), 2);
    for (i, fl) in flows.iter().enumerate() {
        assert!(
            fl["bytes"].as_u64().unwrap() > 0,
            "flow {i} moved nothing: {fl}"
        );
        assert!(
            sum("bytes", i) > fl["bytes"].as_u64().unwrap(),
            "flow {i}'s frames (headers too) crossed port {i}"
        );
        // Both flows met the marking queue; their CNPs came back through
        // their own port, and each one's reaction point saw them.
        assert!(sum("cnps", i) > 0, "no CNP back to port {i}");
        let st = &fl["stats"];
        assert!(
            st["rp_cnp_handled"].as_u64().unwrap() + st["rp_cnp_ignored"].as_u64().unwrap()
                <= sum("cnps", i),
            "flow {i} handled more CNPs than crossed its port"
        );
        assert!(st["rp_cnp_handled"].as_u64().unwrap() > 0, "flow {i}: {st}");
    }
    let a_to_b = &relay["a_to_b"];
    let total = |k: &str| sum(k, 0) + sum(k, 1);
    // The timeline counts every mark and drop the relay counted.
    assert_eq!(
        total("ce"),
        a_to_b["ce_marked"].as_u64().unwrap(),
        "{relay}"
    );
    assert_eq!(
        total("drops"),
        a_to_b["bottleneck_drops"].as_u64().unwrap(),
        "{relay}"
    );
    assert!(total("ce") > 0);
    // Every CNP the receiver sent crossed the switch once, and was seen.
    assert_eq!(
        server["np_cnp_sent"].as_u64().unwrap(),
        total("cnps"),
        "{server}"
    );
    assert!(server["np_ecn_marked_roce_packets"].as_u64().unwrap() <= total("ce"));
    assert_eq!(server["qps"].as_array().unwrap().len(), 2);
    // The queue never holds more than its limit, and nothing leaves faster
    // than the bottleneck: the bytes of the busy bins fit in its rate plus
    // one full queue.
    let bin_s = timeline["bin_ms"].as_f64().unwrap() / 1e3;
    assert!(bins
        .iter()
        .all(|b| b["queue_max_bytes"].as_u64().unwrap() <= 1 << 20));
    let busy: Vec<usize> = (0..bins.len())
        .filter(|&k| {
            bins[k]["bytes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v.as_u64() > Some(0))
        })
        .collect();
    let span = (busy.last().unwrap() - busy.first().unwrap() + 1) as f64 * bin_s;
    assert!(
        (total("bytes") as f64) <= 200e6 / 8.0 * span + (1 << 20) as f64,
        "{} bytes in {span} s",
        total("bytes")
    );
}
