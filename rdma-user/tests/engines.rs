//! The engines over the drop-in library, unmodified Debian 12 packages
//! host to host: `rdma-xdp exec` shows our device where they look for it
//! (sysfs, `/dev/infiniband`), pyverbs lists it, UCX runs its UCT and UCP
//! tests over `rc_verbs` and `ud_verbs`, Open MPI runs a checked MPI
//! program with `pml ucx` and with `mtl ofi`, and libfabric's verbs
//! provider runs `fi_pingpong`.

mod lab;

use std::process::Output;
use std::time::Duration;

use lab::library;

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Both hosts' interfaces as device `rxe0`, as `rdma link add` names an
/// rxe device: UCX's perftest server opens the device its client names.
fn lab_with_rxe0() -> lab::Lab {
    let lab = lab::Lab::new(1500);
    for i in 0..2 {
        let out = lab.exec(i, lab::BIN, &["link", "add", "rxe0", "netdev", &lab.dev[i]]);
        assert!(out.status.success(), "{}", text(&out));
    }
    lab
}

/// `rdma-xdp exec -- sh -c SCRIPT` on host i.
fn sh(lab: &lab::Lab, i: usize, script: &str) -> Output {
    lab.exec(i, lab::BIN, &["exec", "--", "sh", "-c", script])
}

#[test]
fn exec_shows_the_device_in_sysfs_and_dev_as_rxe() {
    library();
    let _g = lab::serial();
    let lab = lab_with_rxe0();
    let ip = &lab.addr[0];
    let d = "/sys/class/infiniband/rxe0";
    let out = sh(
        &lab,
        0,
        &format!(
            "cat {d}/node_type {d}/ports/1/state {d}/ports/1/link_layer \
             {d}/ports/1/gids/1 {d}/ports/1/gid_attrs/types/1 \
             {d}/ports/1/gid_attrs/ndevs/1 {d}/ports/1/pkeys/0 \
             /sys/class/infiniband_verbs/uverbs0/ibdev \
             /sys/class/infiniband_verbs/abi_version; \
             test -c /dev/infiniband/uverbs0 && test -r /dev/infiniband/uverbs0 \
             && test -w /dev/infiniband/rdma_cm && echo nodes-ok; \
             test -e /sys/class/net/{}/address && echo net-ok",
            lab.dev[0]
        ),
    );
    assert!(out.status.success(), "{}", text(&out));
    let o: Vec<u8> = ip.split('.').map(|x| x.parse().unwrap()).collect();
    let gid = format!(
        "0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}",
        o[0], o[1], o[2], o[3]
    );
    let want = format!(
        "1: CA\n4: ACTIVE\nEthernet\n{gid}\nRoCE v2\n{}\n0xffff\nrxe0\n6\nnodes-ok\nnet-ok\n",
        lab.dev[0]
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), want);
    // Nothing leaks out of the program's mount namespace.
    let outside = lab.exec(0, "ls", &["/sys/class/infiniband"]);
    assert!(!outside.status.success(), "{}", text(&outside));
}

#[test]
fn pyverbs_lists_our_device() {
    library();
    let _g = lab::serial();
    let lab = lab_with_rxe0();
    let out = lab.exec(
        0,
        lab::BIN,
        &[
            "exec",
            "--",
            "/usr/bin/python3",
            "-c",
            "import pyverbs.device as d\n\
             for dev in d.get_device_list():\n\
             \x20   ctx = d.Context(name=dev.name.decode())\n\
             \x20   a = ctx.query_device()\n\
             \x20   print(dev.name.decode(), a.max_sge, a.max_srq > 0)",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "rxe0 8 True\n");
}

#[test]
fn ucx_finds_rc_verbs_and_ud_verbs() {
    library();
    let _g = lab::serial();
    let lab = lab_with_rxe0();
    let out = lab.exec(0, lab::BIN, &["exec", "--", "ucx_info", "-d"]);
    assert!(out.status.success(), "{}", text(&out));
    let info = String::from_utf8_lossy(&out.stdout);
    for tl in ["rc_verbs", "ud_verbs"] {
        let block = info
            .split("#      Transport: ")
            .find(|b| b.starts_with(tl))
            .unwrap_or_else(|| panic!("no {tl}:\n{info}"));
        assert!(block.contains("Device: rxe0:1"), "{block}");
        assert!(!block.contains("failed to open"), "{block}");
    }
}

/// A client-server pair through `rdma-xdp exec`: `server` on host 1,
/// `client` with host 1's address appended on host 0, both under `env`;
/// both must succeed. Returns the client's output.
fn pair(lab: &lab::Lab, env: &[&str], server: &[&str], client: &[&str]) -> String {
    let mut s = vec!["exec", "--", "env"];
    s.extend_from_slice(env);
    let mut c = s.clone();
    s.extend_from_slice(server);
    let srv = lab.spawn(1, &s);
    std::thread::sleep(Duration::from_millis(1500));
    c.extend_from_slice(&["timeout", "60"]);
    c.extend_from_slice(client);
    c.push(&lab.addr[1]);
    let cli = lab.exec(0, lab::BIN, &c);
    let srv = lab::wait_timeout(srv, Duration::from_secs(10));
    assert!(
        cli.status.success() && srv.status.success(),
        "{client:?} {env:?}:\nclient: {}\nserver: {}",
        text(&cli),
        text(&srv)
    );
    String::from_utf8_lossy(&cli.stdout).into_owned()
}

/// One `ucx_perftest` run; the client's "Final:" line. (GNU getopt lets
/// the server's address come last.)
fn ucx_perftest(lab: &lab::Lab, env: &[&str], args: &[&str]) -> String {
    let mut e = vec!["UCX_NET_DEVICES=rxe0:1"];
    e.extend_from_slice(env);
    let mut c = vec!["ucx_perftest"];
    c.extend_from_slice(args);
    let out = pair(lab, &e, &["ucx_perftest"], &c);
    out.lines()
        .find(|l| l.starts_with("Final:"))
        .unwrap_or_else(|| panic!("no result:\n{out}"))
        .to_string()
}

#[test]
fn ucx_perftest_runs_uct_and_ucp_tests_host_to_host() {
    library();
    let _g = lab::serial();
    let lab = lab_with_rxe0();
    let n = ["-n", "2000", "-w", "100"];
    let uct: [(&str, &[&str]); 6] = [
        ("rc_verbs", &["-t", "am_lat"]),
        ("rc_verbs", &["-t", "am_bw", "-s", "4096", "-D", "bcopy"]),
        ("rc_verbs", &["-t", "put_lat"]),
        ("rc_verbs", &["-t", "put_bw", "-s", "65536", "-D", "zcopy"]),
        ("rc_verbs", &["-t", "get", "-s", "65536", "-D", "zcopy"]),
        ("ud_verbs", &["-t", "am_lat"]),
    ];
    for (tl, test) in uct {
        let mut a = vec!["-d", "rxe0:1", "-x", tl];
        a.extend_from_slice(test);
        a.extend_from_slice(&n);
        let r = ucx_perftest(&lab, &[], &a);
        eprintln!("UCT {tl} {test:?}: {r}");
    }
    for tls in ["UCX_TLS=rc_v", "UCX_TLS=ud_v"] {
        for t in ["tag_lat", "tag_bw", "ucp_put_bw", "stream_lat"] {
            let mut a = vec!["-t", t];
            a.extend_from_slice(&n);
            let r = ucx_perftest(&lab, &[tls], &a);
            eprintln!("UCP {tls} {t}: {r}");
        }
    }
}

/// Open MPI's rsh agent for the lab: the "host" is an address of one of
/// its namespaces; the command runs there.
fn rsh_agent(lab: &lab::Lab) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("engines-nsrsh-{}", std::process::id()));
    let script = format!(
        "#!/bin/sh\nhost=$1; shift\ncase \"$host\" in\n  {}) ns={} ;;\n  {}) ns={} ;;\n  \
         *) echo \"unknown host $host\" >&2; exit 1 ;;\nesac\nexec ip netns exec \"$ns\" sh -c \"$*\"\n",
        lab.addr[0], lab.ns[0], lab.addr[1], lab.ns[1]
    );
    std::fs::write(&p, script).unwrap();
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    p
}

/// `mpirun` with one rank in each namespace, launched from host 0 through
/// the rsh agent, each rank under `rdma-xdp exec`: the checked MPI program
/// over the transport `mca` selects (plus `env`, exported to the ranks).
/// Returns mpirun's output after checking the program's results.
fn mpi_check(lab: &lab::Lab, mca: &[&str], env: &[&str]) -> String {
    let prog = std::env::temp_dir().join(format!("mpi_check-{}", std::process::id()));
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/mpi_check.c");
    let cc = std::process::Command::new("mpicc")
        .args(["-O2", "-o"])
        .arg(&prog)
        .arg(src)
        .output()
        .expect("mpicc (libopenmpi-dev)");
    assert!(cc.status.success(), "mpicc: {}", text(&cc));
    let agent = rsh_agent(lab);
    let hosts = format!("{},{}", lab.addr[0], lab.addr[1]);
    let net = format!("{}/24", lab.addr[0]);
    let mut args = vec![
        "120",
        "mpirun",
        "--allow-run-as-root",
        // Both "hosts" are this machine: bound ranks would share a core.
        "--bind-to",
        "none",
        "-np",
        "2",
        "-H",
        &hosts,
        "--mca",
        "plm_rsh_agent",
        agent.to_str().unwrap(),
        "--mca",
        "oob_tcp_if_include",
        &net,
    ];
    args.extend_from_slice(mca);
    for e in env {
        args.extend_from_slice(&["-x", e]);
    }
    args.extend_from_slice(&[lab::BIN, "exec", "--", prog.to_str().unwrap()]);
    let out = lab.exec(0, "timeout", &args);
    let _ = std::fs::remove_file(&agent);
    let _ = std::fs::remove_file(&prog);
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    for want in [
        "pingpong 1048576 B x 4: ok",
        "allreduce 131072 x int64: ok",
        "alltoall 65536 B per rank: ok",
        "mpi_check: ok",
    ] {
        assert!(all.contains(want), "no {want:?}:\n{all}");
    }
    all
}

#[test]
fn open_mpi_runs_a_checked_program_over_pml_ucx() {
    library();
    let _g = lab::serial();
    let lab = lab_with_rxe0();
    let all = mpi_check(
        &lab,
        &["--mca", "pml", "ucx", "--mca", "pml_ucx_verbose", "10"],
        &["UCX_NET_DEVICES=rxe0:1"],
    );
    // pml ucx found our device's transports.
    assert!(
        all.contains("rc_verbs/rxe0:1: matched transport list"),
        "{all}"
    );
}

/// Open MPI's `mtl ofi` over libfabric's verbs provider (RDM endpoints
/// through `ofi_rxm`).
#[test]
fn open_mpi_runs_a_checked_program_over_mtl_ofi() {
    library();
    let _g = lab::serial();
    let lab = lab_with_rxe0();
    let all = mpi_check(
        &lab,
        &[
            "--mca",
            "pml",
            "cm",
            "--mca",
            "mtl",
            "ofi",
            "--mca",
            "mtl_base_verbose",
            "100",
        ],
        &["FI_PROVIDER=verbs;ofi_rxm"],
    );
    // The provider libfabric chose is our device's domain.
    assert!(all.contains("mtl:ofi:provider: rxe0"), "{all}");
}

#[test]
fn libfabric_finds_the_device_and_runs_fi_pingpong() {
    library();
    let _g = lab::serial();
    let lab = lab_with_rxe0();
    let out = lab.exec(0, lab::BIN, &["exec", "--", "fi_info", "-p", "verbs"]);
    assert!(out.status.success(), "{}", text(&out));
    let info = String::from_utf8_lossy(&out.stdout);
    for ep in ["FI_EP_MSG", "FI_EP_DGRAM", "FI_EP_RDM"] {
        assert!(info.contains(&format!("type: {ep}")), "no {ep}:\n{info}");
    }
    for (prov, ep) in [
        ("verbs", "msg"),
        ("verbs", "dgram"),
        ("verbs;ofi_rxm", "rdm"),
    ] {
        let a = ["fi_pingpong", "-p", prov, "-e", ep, "-I", "100"];
        let out = pair(&lab, &[], &a, &a);
        // A result row for each message size: "bytes iters total time ...".
        assert!(
            out.lines()
                .any(|l| l.starts_with("64 ") || l.starts_with("64\t")),
            "fi_pingpong {prov} {ep}:\n{out}"
        );
    }
}
