//! The drop-in librdmacm against unmodified Debian binaries (rdmacm-utils
//! 44, perftest 4.5), host to host between two namespaces: connections
//! set up with CM MADs on QP1, data checked by the tools themselves.

mod lab;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use lab::library;

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `server` on host 1, then `client` on host 0, both through
/// `rdma-xdp exec`. With `server_exits`, the server must end by itself
/// (successfully); otherwise (cmtime's server serves for ever) it is
/// stopped once the client is done. Returns both outputs.
fn pair(lab: &lab::Lab, server: &[&str], client: &[&str], server_exits: bool) -> (String, String) {
    pair_env(lab, &[], server, client, server_exits)
}

/// `pair` with environment variables (`NAME=VALUE`) for both programs.
///
/// perftest `-R` has a race of its own: its client connects the moment
/// the server has answered the handshake on the control connection, and
/// the server makes its data listener only then. A REQ that comes first
/// gets REJ 8 (invalid service id), as from the kernel's CM, and perftest
/// cannot retry (it reuses the ids it destroyed). Such a run, and only
/// one failing with that signature, is run again, three times at most
/// (as `cargo xtask interop` does against rxe).
fn pair_env(
    lab: &lab::Lab,
    env: &[&str],
    server: &[&str],
    client: &[&str],
    server_exits: bool,
) -> (String, String) {
    let mut attempt = 1;
    loop {
        match pair_once(lab, env, server, client, server_exits) {
            Err(c) if attempt < 3 && c.contains("RDMA_CM_EVENT_REJECTED; error: 8.") => {
                eprintln!("{client:?}: lost perftest's listen race (REJ 8), attempt {attempt}");
                attempt += 1;
            }
            Err(msg) => panic!("{msg}"),
            Ok(r) => return r,
        }
    }
}

/// One run of [`pair_env`]: `Err` with what failed.
fn pair_once(
    lab: &lab::Lab,
    env: &[&str],
    server: &[&str],
    client: &[&str],
    server_exits: bool,
) -> Result<(String, String), String> {
    // The server writes into a file: rping -v prints every ping, more than
    // a pipe holds while nobody reads it.
    let log = std::env::temp_dir().join(format!("rdmacm-server-{}.log", std::process::id()));
    let f = std::fs::File::create(&log).unwrap();
    let srv = Command::new("ip")
        .args(["netns", "exec", &lab.ns[1], "env"])
        .args(env)
        .args([lab::BIN, "exec", "--"])
        .args(server)
        .stdout(Stdio::from(f.try_clone().unwrap()))
        .stderr(Stdio::from(f))
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let mut cargs = vec!["60", "env"];
    cargs.extend_from_slice(env);
    cargs.extend_from_slice(&[lab::BIN, "exec", "--"]);
    cargs.extend_from_slice(client);
    let cli = lab.exec(0, "timeout", &cargs);
    let srv = if server_exits {
        lab::wait_timeout(srv, Duration::from_secs(60))
    } else {
        lab::terminate(srv)
    };
    let s = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    let c = text(&cli);
    if cli.status.success() && (!server_exits || srv.status.success()) {
        Ok((c, s))
    } else {
        Err(format!(
            "{client:?}: client {} / server {}\nclient: {c}\nserver: {s}",
            cli.status, srv.status,
        ))
    }
}

/// rping with verification (-V): both sides count `n` pings, and each
/// side's ping data is the other's.
fn rping(lab: &lab::Lab, addr: &str, n: usize, size: &str) {
    let count = n.to_string();
    let (c, s) = pair(
        lab,
        &[
            "rping", "-s", "-a", addr, "-C", &count, "-v", "-V", "-S", size,
        ],
        &[
            "rping", "-c", "-a", addr, "-C", &count, "-v", "-V", "-S", size,
        ],
        true,
    );
    // Each ping's number, in order (a long line may be cut by another
    // thread's output; rping -V compares the data itself).
    let pings = |out: &str, prefix: &str| -> Vec<usize> {
        out.lines()
            .filter_map(|l| {
                let rest = &l[l.find(prefix)? + prefix.len()..];
                rest.strip_prefix("rdma-ping-")?
                    .split(':')
                    .next()?
                    .parse()
                    .ok()
            })
            .collect()
    };
    let want: Vec<usize> = (0..n).collect();
    assert_eq!(pings(&c, "ping data: "), want, "client:\n{c}");
    assert_eq!(pings(&s, "server ping data: "), want, "server:\n{s}");
    assert!(
        !c.contains("mismatch") && !s.contains("mismatch"),
        "{c}\n{s}"
    );
}

#[test]
fn unmodified_rdmacm_tools_connect_over_the_library() {
    library();
    let _g = lab::serial();
    let lab = lab::Lab::new(1500);
    let b = lab.addr[1].clone();

    rping(&lab, &b, 200, "4096");

    // Ten connections at once, ten SENDs each way on every one.
    let (c, s) = pair(
        &lab,
        &["ucmatose", "-c", "10"],
        &["ucmatose", "-s", &b, "-c", "10"],
        true,
    );
    for out in [&c, &s] {
        assert!(
            out.contains("data transfers complete") && out.contains("return status 0"),
            "{out}"
        );
    }

    // UD: the service resolved with SIDR_REQ/SIDR_REP, then datagrams.
    let (c, s) = pair(&lab, &["udaddy"], &["udaddy", "-s", &b], true);
    for out in [&c, &s] {
        assert!(
            out.contains("data transfers complete") && out.contains("return status 0"),
            "{out}"
        );
    }

    // Synchronous ids: rdma_create_ep, rdma_get_request, rdma_reg_msgs.
    let (c, s) = pair(&lab, &["rdma_server"], &["rdma_client", "-s", &b], true);
    assert!(c.contains("rdma_client: end 0"), "{c}");
    assert!(s.contains("rdma_server: end 0"), "{s}");

    // 100 connections through every step; the server serves until stopped.
    let (c, _) = pair(
        &lab,
        &["cmtime", "-c", "100"],
        &["cmtime", "-s", &b, "-c", "100"],
        false,
    );
    // cmtime reports a failed step on stderr and still exits 0.
    assert!(!c.contains("fail"), "{c}");
    for step in [
        "create id",
        "resolve addr",
        "resolve route",
        "create qp",
        "connect",
        "disconnect",
        "destroy",
    ] {
        assert!(
            c.lines().any(|l| l.starts_with(step) && l.contains(':')),
            "{step}:\n{c}"
        );
    }
}

#[test]
fn unmodified_rdmacm_tools_connect_over_ipv6() {
    library();
    let _g = lab::serial();
    let lab = lab::Lab::new(1500);
    let n = lab.addr[0].split('.').nth(2).unwrap().to_string();
    let v6 = [format!("fd66:{n}::1"), format!("fd66:{n}::2")];
    for (i, ip) in v6.iter().enumerate() {
        let a = format!("{ip}/64");
        let o = lab.exec(i, "ip", &["addr", "add", &a, "dev", &lab.dev[i], "nodad"]);
        assert!(o.status.success(), "{}", text(&o));
    }
    rping(&lab, &v6[1], 50, "1024");
    let (c, s) = pair(
        &lab,
        // Bound to the IPv6 address: an IPv4 wildcard takes no IPv6
        // connection (rdma_cm's rule, checked below).
        &["ucmatose", "-b", &v6[1], "-c", "4"],
        &["ucmatose", "-s", &v6[1], "-c", "4"],
        true,
    );
    for out in [&c, &s] {
        assert!(out.contains("return status 0"), "{out}");
    }
    // UD over IPv6: SIDR, then datagrams.
    let (c, s) = pair(
        &lab,
        &["udaddy", "-b", &v6[1]],
        &["udaddy", "-s", &v6[1]],
        true,
    );
    for out in [&c, &s] {
        assert!(
            out.contains("data transfers complete") && out.contains("return status 0"),
            "{out}"
        );
    }
    // Synchronous ids (rdma_getaddrinfo of an IPv6 name).
    let (c, s) = pair(
        &lab,
        &["rdma_server", "-s", &v6[1]],
        &["rdma_client", "-s", &v6[1]],
        true,
    );
    assert!(c.contains("rdma_client: end 0"), "{c}");
    assert!(s.contains("rdma_server: end 0"), "{s}");
    // Many connections at once through every step.
    let (c, _) = pair(
        &lab,
        &["cmtime", "-b", &v6[1], "-c", "20"],
        &["cmtime", "-s", &v6[1], "-c", "20"],
        false,
    );
    assert!(!c.contains("fail"), "{c}");
    assert!(
        c.lines()
            .any(|l| l.starts_with("disconnect") && l.contains(':')),
        "{c}"
    );
    // ucmatose's server binds 0.0.0.0 by default: an IPv6 REQ is refused.
    let srv = lab.spawn(1, &["exec", "--", "ucmatose", "-c", "1"]);
    std::thread::sleep(Duration::from_millis(1500));
    let cli = lab.exec(
        0,
        "timeout",
        &[
            "30",
            lab::BIN,
            "exec",
            "--",
            "ucmatose",
            "-s",
            &v6[1],
            "-c",
            "1",
        ],
    );
    lab::terminate(srv);
    let c = text(&cli);
    assert!(c.contains("RDMA_CM_EVENT_REJECTED"), "{c}");
}

#[test]
fn perftest_connects_with_rdma_cm_over_the_library() {
    library();
    let _g = lab::serial();
    let lab = lab::Lab::new(1500);
    let b = lab.addr[1].clone();
    for (tool, size, iters) in [
        ("ib_write_lat", "64", "1000"),
        ("ib_read_bw", "65536", "500"),
        ("ib_send_bw", "4096", "1000"),
    ] {
        let (c, s) = pair(
            &lab,
            &[tool, "-R", "-s", size, "-n", iters],
            &[tool, "-R", "-s", size, "-n", iters, &b],
            true,
        );
        // perftest's result line: the size, then the iterations.
        for out in [&c, &s] {
            assert!(
                out.lines().any(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    f.len() > 3 && f[0] == size && f[1] == iters
                }),
                "{tool}: no result line\n{out}"
            );
        }
    }
}

/// qperf's RDMA CM mode: its server binds the wildcard address with port
/// 0 and reads the port back (`rdma_get_src_port`), reads the QP's caps
/// with `ibv_query_qp`, waits in `ibv_get_cq_event`, and ends each test
/// with SIGALRM while blocked there.
#[test]
fn qperf_connects_with_rdma_cm_over_the_library() {
    library();
    let _g = lab::serial();
    let lab = lab::Lab::new(1500);
    let b = lab.addr[1].clone();
    let (c, _) = pair(
        &lab,
        &["qperf"],
        &["qperf", "-cm1", "-t", "1", &b, "rc_lat", "rc_bw"],
        false,
    );
    for want in ["rc_lat:", "latency", "rc_bw:", "bw"] {
        assert!(c.contains(want), "{want}:\n{c}");
    }
    assert!(!c.contains("failed") && !c.contains("error"), "{c}");
}

#[test]
fn a_req_to_a_port_nobody_listens_on_is_rejected() {
    library();
    let _g = lab::serial();
    let lab = lab::Lab::new(1500);
    let b = lab.addr[1].clone();
    // A server on rping's port; the client asks for another one.
    let srv = lab.spawn(1, &["exec", "--", "rping", "-s", "-a", &b, "-C", "1"]);
    std::thread::sleep(Duration::from_millis(1500));
    let t = Instant::now();
    let cli = lab.exec(
        0,
        "timeout",
        &[
            "30",
            lab::BIN,
            "exec",
            "--",
            "rping",
            "-c",
            "-a",
            &b,
            "-p",
            "7999",
            "-C",
            "1",
        ],
    );
    let took = t.elapsed();
    lab::terminate(srv);
    let c = text(&cli);
    assert!(!cli.status.success(), "{c}");
    // rdma_cm's answer: REJ with reason 8 (invalid service id), at once.
    assert!(c.contains("RDMA_CM_EVENT_REJECTED, error 8"), "{c}");
    assert!(took < Duration::from_secs(10), "{took:?}");
}

/// Connections through the impairment relay at 5 % loss each way: lost
/// MADs are sent again after the response time-out (here 4.096 us * 2^12,
/// 17 ms, instead of rdma_cm's 4.3 s), and every connection is made and
/// closed.
#[test]
fn connections_through_five_percent_loss_complete_by_mad_retries() {
    library();
    let _g = lab::serial();
    let mut lab = lab::Lab::with_relay(1500);
    lab.start_relay(&["--loss", "0.05", "--seed", "7"]);
    let b = lab.addr[1].clone();
    let env = ["RDMA_XDP_CM_RESPONSE_TIMEOUT=12"];
    let (c, _) = pair_env(
        &lab,
        &env,
        &["cmtime", "-c", "100"],
        &["cmtime", "-s", &b, "-c", "100"],
        false,
    );
    assert!(c.lines().any(|l| l.starts_with("connect")), "{c}");
    assert!(!c.contains("fail"), "{c}");
    let (c, s) = pair_env(
        &lab,
        &env,
        &["ucmatose", "-c", "10"],
        &["ucmatose", "-s", &b, "-c", "10"],
        true,
    );
    for out in [&c, &s] {
        assert!(out.contains("return status 0"), "{out}");
    }
    let relay = lab.stop_relay();
    let dropped = |dir: &str| relay[dir]["dropped"].as_u64().unwrap_or(0);
    assert!(
        dropped("a_to_b") > 0 && dropped("b_to_a") > 0,
        "the relay dropped nothing: {relay}"
    );
}

/// 1500 connect/disconnect cycles, each with its own id, QP and synchronous
/// channel (a C program against Debian's librdmacm-dev, `data/cm_cycles.c`;
/// every other cycle through rdma_create_id and rdma_create_qp without CQs,
/// which rdma_destroy_qp must free):
/// the descriptors the program holds do not grow, and a leaked QP would
/// have hit the device's limit of 1024 before the end.
#[test]
fn connect_disconnect_cycles_leak_nothing() {
    library();
    let exe = std::env::temp_dir().join(format!("rdma-cm_cycles-{}", std::process::id()));
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/cm_cycles.c");
    let cc = Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-lrdmacm")
        .output()
        .expect("cc");
    assert!(
        cc.status.success(),
        "cc cm_cycles.c (librdmacm-dev): {}",
        text(&cc)
    );
    let _g = lab::serial();
    let lab = lab::Lab::new(1500);
    let b = lab.addr[1].clone();
    let exe = exe.to_string_lossy().to_string();
    let (c, s) = pair(
        &lab,
        &[&exe, "server", &b, "7500", "1500"],
        &[&exe, "client", &b, "7500", "1500"],
        true,
    );
    let _ = std::fs::remove_file(&exe);
    for out in [&c, &s] {
        let line = out
            .lines()
            .find(|l| l.starts_with("cycles 1500 in"))
            .unwrap_or_else(|| panic!("no result line:\n{out}"));
        let fds: Vec<&str> = line.split_whitespace().collect();
        // "... descriptors after 10 N, at the end M"
        let num = |w: &str| w.trim_end_matches(',').parse::<usize>().unwrap();
        let (early, end) = (num(fds[fds.len() - 5]), num(fds[fds.len() - 1]));
        // A leak per cycle would add 1500. One or two may be open for a
        // moment at either sample (the CM thread's netlink socket while it
        // looks up a neighbour).
        assert!(end <= early + 2, "descriptors grew: {line}");
    }
}
