//! The drop-in libibverbs against unmodified Debian binaries (rdma-core 44's
//! ibverbs-utils): its exports and symbol versions cover what they import,
//! and ibv_devices / ibv_devinfo list and describe our devices as rxe's.

mod lab;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use lab::library;

fn which(prog: &str) -> PathBuf {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .output()
        .unwrap();
    let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        !p.is_empty(),
        "{prog} is not installed (Debian's ibverbs-utils; `cargo xtask test` installs it)"
    );
    PathBuf::from(p)
}

/// The version nodes of the libraries our one object stands in for.
const NODES: [&str; 4] = ["IBVERBS_", "MLX5_", "EFA_", "RDMACM_"];

/// (symbol, version) pairs of `objdump -T`: undefined ones (`imports`) or
/// defined ones, for the version nodes of libibverbs and the libraries it
/// stands in for.
fn dynsyms(file: &Path, imports: bool) -> BTreeSet<(String, String)> {
    let out = Command::new("objdump")
        .arg("-T")
        .arg(file)
        .output()
        .expect("objdump (binutils)");
    assert!(out.status.success(), "objdump -T {}", file.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| NODES.iter().any(|n| l.contains(n)))
        .filter(|l| l.contains("*UND*") == imports)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let name = f.last()?.to_string();
            let ver = f
                .get(f.len().checked_sub(2)?)?
                .trim_matches(|c| c == '(' || c == ')')
                .to_string();
            (name != ver).then_some((name, ver))
        })
        .collect()
}

/// The Debian binaries that run over the library.
const TOOLS: [&str; 18] = [
    "ibv_devices",
    "ibv_devinfo",
    "ibv_rc_pingpong",
    "ibv_srq_pingpong",
    "ibv_ud_pingpong",
    "ib_write_lat",
    "ib_read_lat",
    "ib_send_lat",
    "ib_atomic_lat",
    "ib_write_bw",
    "ib_read_bw",
    "ib_send_bw",
    // rdmacm-utils: librdmacm's nodes, from the same object.
    "rping",
    "ucmatose",
    "udaddy",
    "rdma_server",
    "rdma_client",
    "cmtime",
];

#[test]
fn exports_cover_what_the_debian_binaries_import() {
    let so = library().join("libibverbs.so.1");
    let ours = dynsyms(&so, false);
    for tool in TOOLS {
        let need = dynsyms(&which(tool), true);
        assert!(!need.is_empty(), "{tool} imports nothing from libibverbs?");
        let missing: Vec<_> = need.difference(&ours).collect();
        assert!(missing.is_empty(), "{tool} needs {missing:?}");
    }
    let soname = Command::new("readelf").arg("-d").arg(&so).output().unwrap();
    assert!(String::from_utf8_lossy(&soname.stdout).contains("Library soname: [libibverbs.so.1]"));
    for alias in ["librdmacm.so.1", "libmlx5.so.1", "libefa.so.1"] {
        assert_eq!(
            std::fs::read_link(library().join(alias)).unwrap(),
            Path::new("libibverbs.so.1")
        );
    }
}

/// Every `.so` under `dir`, recursively.
fn shared_objects(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        if p.is_dir() {
            shared_objects(&p, out);
        } else if p.extension().is_some_and(|x| x == "so") {
            out.push(p);
        }
    }
}

/// The engines' objects that link libibverbs, libmlx5, libefa or
/// librdmacm: Debian 12's UCX, libfabric, Open MPI verbs components and
/// pyverbs (`cargo xtask test` installs them).
fn engine_objects() -> Vec<PathBuf> {
    let lib = Path::new("/usr/lib/x86_64-linux-gnu");
    let mut v: Vec<PathBuf> = [
        "ucx/libuct_ib.so.0",
        "ucx/libuct_rdmacm.so.0",
        "libfabric.so.1",
        "libmca_common_verbs.so.40",
        "openmpi/lib/openmpi3/mca_btl_openib.so",
    ]
    .iter()
    .map(|p| lib.join(p))
    .collect();
    shared_objects(Path::new("/usr/lib/python3/dist-packages/pyverbs"), &mut v);
    v
}

#[test]
fn exports_cover_what_the_engines_import() {
    let ours = dynsyms(&library().join("libibverbs.so.1"), false);
    let objects = engine_objects();
    // pyverbs alone is 35 modules.
    assert!(objects.len() >= 30, "{objects:?}");
    for o in objects {
        assert!(o.exists(), "{} is not installed", o.display());
        let need = dynsyms(&o, true);
        let missing: Vec<_> = need.difference(&ours).collect();
        assert!(missing.is_empty(), "{} needs {missing:?}", o.display());
    }
}

fn exec(lab: &lab::Lab, i: usize, args: &[&str]) -> String {
    let out = lab.exec(i, lab::BIN, args);
    assert!(
        out.status.success(),
        "rdma-xdp {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn devices_ports_and_gids_as_rxe_reports_them() {
    library();
    let _g = lab::serial();
    let lab = lab::Lab::new(1500);
    let dev = &lab.dev[0];
    let ip = &lab.addr[0];
    let r = lab.exec(
        0,
        "ip",
        &["-6", "addr", "add", "fd66::1/64", "dev", dev, "nodad"],
    );
    assert!(r.status.success());
    // Nothing added: the default device of the interface.
    let list = exec(&lab, 0, &["exec", "--", "ibv_devices"]);
    let want = format!("xdp_{dev}");
    assert!(list.contains(&want), "{list}");
    let info = exec(&lab, 0, &["exec", "--", "ibv_devinfo", "-v"]);
    for want in [
        format!("hca_id:\txdp_{dev}"),
        "transport:\t\t\tInfiniBand (0)".to_string(),
        "vendor_id:\t\t\t0xffffff".to_string(),
        "state:\t\t\tPORT_ACTIVE (4)".to_string(),
        "active_mtu:\t\t1024 (3)".to_string(),
        "link_layer:\t\tEthernet".to_string(),
        "gid_tbl_len:\t\t1024".to_string(),
        format!("GID[  1]:\t\t::ffff:{ip}, RoCE v2"),
        "GID[  2]:\t\tfd66::1, RoCE v2".to_string(),
    ] {
        assert!(
            info.contains(&want),
            "ibv_devinfo -v lacks {want:?}:\n{info}"
        );
    }
    // GID 0 is the EUI-64 link-local GID of the MAC.
    let mac = String::from_utf8_lossy(
        &lab.exec(0, "cat", &[&format!("/sys/class/net/{dev}/address")])
            .stdout,
    )
    .trim()
    .to_string();
    let m: Vec<u8> = mac
        .split(':')
        .map(|h| u8::from_str_radix(h, 16).unwrap())
        .collect();
    let ll = format!(
        "fe80::{:x}:{:x}:{:x}:{:x}",
        u16::from_be_bytes([m[0] ^ 2, m[1]]),
        u16::from_be_bytes([m[2], 0xff]),
        u16::from_be_bytes([0xfe, m[3]]),
        u16::from_be_bytes([m[4], m[5]])
    );
    assert!(
        info.contains(&format!("GID[  0]:\t\t{ll}, RoCE v2")),
        "no {ll} in:\n{info}"
    );
    // A named link replaces the default, as `rdma link add`.
    exec(&lab, 0, &["link", "add", "rxe0", "netdev", dev]);
    let shown = exec(&lab, 0, &["link", "show"]);
    assert!(
        shown.contains(&format!("link rxe0/1 state ACTIVE netdev {dev}")),
        "{shown}"
    );
    let list = exec(&lab, 0, &["exec", "--", "ibv_devices"]);
    assert!(list.contains("rxe0") && !list.contains(&want), "{list}");
    let bad = lab.exec(0, lab::BIN, &["link", "add", "rxe0", "netdev", dev]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("already exists"));
    let missing = lab.exec(
        0,
        "sh",
        &["-c", &format!("{} exec -- ibv_devinfo -d nosuch", lab::BIN)],
    );
    assert!(!missing.status.success());
    exec(&lab, 0, &["link", "del", "rxe0"]);
    let list = exec(&lab, 0, &["exec", "--", "ibv_devices"]);
    assert!(list.contains(&want), "{list}");
}

/// Runs `server` in host 1 and `client` (with host 1's address appended)
/// in host 0, both through `rdma-xdp exec`; returns both outputs.
fn pair(lab: &lab::Lab, server: &[&str], client: &[&str]) -> (String, String) {
    // RDMA_XDP_STATS: each side's data path counters on stderr at close,
    // shown when the pair fails.
    let mut args = vec!["exec", "--", "env", "RDMA_XDP_STATS=1"];
    args.extend_from_slice(server);
    let srv = lab.spawn(1, &args);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let mut cargs = vec!["exec", "--", "env", "RDMA_XDP_STATS=1"];
    cargs.extend_from_slice(client);
    cargs.push(&lab.addr[1]);
    let cli = lab.exec(0, lab::BIN, &cargs);
    let srv = lab::wait_timeout(srv, std::time::Duration::from_secs(60));
    let (c, s) = (
        String::from_utf8_lossy(&cli.stdout).into_owned(),
        String::from_utf8_lossy(&srv.stdout).into_owned(),
    );
    assert!(
        cli.status.success() && srv.status.success(),
        "{client:?}: client {} / server {}\nclient: {c}{}\nserver: {s}{}",
        cli.status,
        srv.status,
        String::from_utf8_lossy(&cli.stderr),
        String::from_utf8_lossy(&srv.stderr)
    );
    (c, s)
}

#[test]
fn unmodified_rc_pingpong_checks_its_data_over_the_library() {
    library();
    let _g = lab::serial();
    let lab = lab::Lab::new(1500);
    for args in [
        &["-s", "64", "-n", "50"][..],
        &["-s", "4096", "-n", "50"],
        &["-s", "65536", "-n", "20"],
        &["-s", "4096", "-n", "50", "-e"],
        // -N: the ibv_wr_* send path (ibv_create_qp_ex, ibv_qp_to_qp_ex).
        &["-s", "4096", "-n", "50", "-N"],
        &["-s", "65536", "-n", "20", "-N", "-e"],
    ] {
        pingpong(&lab, "ibv_rc_pingpong", args);
    }
}

/// `tool -g 1 -c ARGS` on both hosts; both must report all their
/// iterations (`-n`) with every buffer checked.
fn pingpong(lab: &lab::Lab, tool: &str, args: &[&str]) {
    let mut a = vec![tool, "-g", "1", "-c"];
    a.extend_from_slice(args);
    let (c, s) = pair(lab, &a, &a);
    let n = args[args.iter().position(|x| *x == "-n").unwrap() + 1];
    for out in [&c, &s] {
        assert!(
            out.contains(&format!("{n} iters in")),
            "{tool} {args:?}: {out}"
        );
    }
}

#[test]
fn unmodified_srq_pingpong_checks_its_data_over_the_library() {
    library();
    let _g = lab::serial();
    let lab = lab::Lab::new(1500);
    // 16 RC QPs sharing one SRQ on each side; -c checks every buffer.
    for args in [
        &["-q", "16", "-s", "4096", "-n", "50"][..],
        &["-q", "16", "-s", "65536", "-n", "10", "-e"],
        &["-q", "4", "-s", "64", "-n", "200", "-r", "8"],
    ] {
        pingpong(&lab, "ibv_srq_pingpong", args);
    }
}

#[test]
fn unmodified_ud_pingpong_checks_its_data_over_the_library() {
    library();
    let _g = lab::serial();
    let lab = lab::Lab::new(1500);
    // The port MTU is 1024 at a netdev MTU of 1500: datagrams up to it.
    for args in [
        &["-s", "1024", "-n", "50"][..],
        &["-s", "64", "-n", "200", "-e"],
        &["-s", "1", "-n", "50", "-r", "4"],
    ] {
        pingpong(&lab, "ibv_ud_pingpong", args);
    }
}

#[test]
fn unmodified_perftest_runs_over_the_library() {
    library();
    let _g = lab::serial();
    let lab = lab::Lab::new(1500);
    let mut runs: Vec<String> = Vec::new();
    for tool in [
        "ib_write_lat",
        "ib_send_lat",
        "ib_read_lat",
        "ib_write_bw",
        "ib_read_bw",
        "ib_send_bw",
    ] {
        for size in ["2", "5000", "1048576"] {
            runs.push(format!("{tool} -x 1 -n 20 -s {size}"));
        }
    }
    runs.push("ib_atomic_lat -x 1 -n 20".into());
    // Every size from 2 B to 8 MiB; two QPs; Gb/s reporting.
    runs.push("ib_write_lat -x 1 -n 5 -a".into());
    runs.push("ib_write_bw -x 1 -n 5 -a".into());
    runs.push("ib_write_bw -x 1 -n 20 -s 5000 -q 2".into());
    runs.push("ib_send_bw -x 1 -n 20 -s 5000 --report_gbits".into());
    // Event-driven completions (`-e`: the program sleeps in
    // ibv_get_cq_event), in every tool that offers them; send_lat also at
    // a TX depth of 4, where one signaled send covers four.
    for r in [
        "ib_send_lat -x 1 -n 200 -s 2 -e",
        "ib_send_lat -x 1 -n 200 -s 2 -e -t 4",
        "ib_read_lat -x 1 -n 200 -s 2 -e",
        "ib_atomic_lat -x 1 -n 200 -e",
        "ib_send_bw -x 1 -n 200 -s 4096 -e",
        "ib_read_bw -x 1 -n 200 -s 4096 -e",
        "ib_atomic_bw -x 1 -n 200 -e",
    ] {
        runs.push(r.into());
    }
    // UD: datagrams up to the port MTU (1024 B at a netdev MTU of 1500).
    for tool in ["ib_send_lat", "ib_send_bw"] {
        for size in ["2", "1024"] {
            runs.push(format!("{tool} -x 1 -n 20 -c UD -s {size}"));
        }
    }
    let runs: Vec<Vec<&str>> = runs
        .iter()
        .map(|r| r.split_whitespace().collect())
        .collect();
    for a in &runs {
        let (c, _s) = pair(&lab, a, a);
        // perftest counts iterations over all QPs (-q).
        let arg = |k: &str| a.iter().position(|x| *x == k).map(|i| a[i + 1]);
        let qps: u64 = arg("-q").map_or(1, |q| q.parse().unwrap());
        let n = (arg("-n").unwrap().parse::<u64>().unwrap() * qps).to_string();
        let sizes: Vec<u64> = if a.contains(&"-a") {
            (1..=23).map(|k| 1u64 << k).collect()
        } else {
            let s = a.iter().position(|x| *x == "-s");
            vec![s.map_or(8, |i| a[i + 1].parse().unwrap())]
        };
        for bytes in sizes {
            let line = c
                .lines()
                .find(|l| l.split_whitespace().next() == Some(&bytes.to_string()))
                .unwrap_or_else(|| panic!("{a:?}: no result line for {bytes} B:\n{c}"));
            assert_eq!(
                line.split_whitespace().nth(1),
                Some(n.as_str()),
                "{a:?}: {line}"
            );
        }
    }
}

#[test]
fn misuse_gets_rdma_cores_answers() {
    library();
    // Our own C program against Debian's libibverbs-dev headers, linked
    // against the real libibverbs and run on ours (as any program).
    let exe = c_program("misuse");
    let _g = lab::serial();
    let lab = lab::Lab::new(1500);
    // Host 1 runs no RDMA: it never answers, so sends retry out.
    let dev = format!("xdp_{}", lab.dev[0]);
    let out = lab.exec(
        0,
        lab::BIN,
        &["exec", "--", exe.to_str().unwrap(), &dev, &lab.addr[1]],
    );
    let _ = std::fs::remove_file(&exe);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("all ok"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.lines().filter(|l| l.starts_with("ok ")).count() >= 45,
        "{text}"
    );
}

/// Reserves `n` more 2 MiB huge pages for the test's life (restored on
/// drop), so that programs can map them.
struct HugePages(Option<String>);

impl HugePages {
    fn reserve(n: u64) -> HugePages {
        let path = "/proc/sys/vm/nr_hugepages";
        let old =
            std::fs::read_to_string(path).expect("hugetlb support (/proc/sys/vm/nr_hugepages)");
        let want = old.trim().parse::<u64>().unwrap() + n;
        std::fs::write(path, want.to_string()).expect("reserve huge pages");
        let got: u64 = std::fs::read_to_string(path)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(got >= want, "the kernel gave {got} of {want} huge pages");
        HugePages(Some(old))
    }
}

impl Drop for HugePages {
    fn drop(&mut self) {
        if let Some(old) = self.0.take() {
            let _ = std::fs::write("/proc/sys/vm/nr_hugepages", old.trim());
        }
    }
}

/// Builds one of tests/data's C programs against Debian's libibverbs-dev.
fn c_program(name: &str) -> PathBuf {
    let exe = std::env::temp_dir().join(format!("rdma-{name}-{}", std::process::id()));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/{name}.c"));
    let cc = Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-libverbs")
        .output()
        .expect("cc");
    assert!(
        cc.status.success(),
        "cc {name}.c (libibverbs-dev): {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    exe
}

#[test]
fn ud_address_handles_and_answers_from_the_completion_between_two_programs() {
    library();
    let exe = c_program("ud");
    let _g = lab::serial();
    let lab = lab::Lab::new(1500);
    let port = "18517";
    let devs = [format!("xdp_{}", lab.dev[0]), format!("xdp_{}", lab.dev[1])];
    let e = exe.to_str().unwrap();
    let server = lab.spawn(1, &["exec", "--", e, "server", port, &devs[1]]);
    let client = lab.exec(
        0,
        lab::BIN,
        &["exec", "--", e, "client", &lab.addr[1], port, &devs[0]],
    );
    let server = lab::wait_timeout(server, std::time::Duration::from_secs(30));
    let _ = std::fs::remove_file(&exe);
    let (c, s) = (
        String::from_utf8_lossy(&client.stdout),
        String::from_utf8_lossy(&server.stdout),
    );
    let both = format!(
        "client:\n{c}{}\nserver:\n{s}{}",
        String::from_utf8_lossy(&client.stderr),
        String::from_utf8_lossy(&server.stderr)
    );
    assert!(c.contains("all ok") && s.contains("all ok"), "{both}");
    for check in [
        "create_ah to an address nobody answers is EHOSTUNREACH",
        "RDMA WRITE on a UD QP is EINVAL",
        "the answer arrives from the server's QP",
    ] {
        assert!(c.contains(&format!("ok {check}")), "{both}");
    }
    for check in [
        "src_qp is the sender's QP",
        "... back to the sender's GID, from ours at index 1",
        "a datagram larger than the buffer is LOC_LEN_ERR",
        "nothing past the buffer is written",
    ] {
        assert!(s.contains(&format!("ok {check}")), "{both}");
    }
}

#[test]
fn memory_kinds_access_flags_and_events_between_two_programs() {
    library();
    let exe = c_program("features");
    let _g = lab::serial();
    let _huge = HugePages::reserve(4);
    let lab = lab::Lab::new(1500);
    let port = "18515";
    let devs = [format!("xdp_{}", lab.dev[0]), format!("xdp_{}", lab.dev[1])];
    let e = exe.to_str().unwrap();
    let target = lab.spawn(1, &["exec", "--", e, "target", port, &devs[1], &lab.dev[1]]);
    let init = lab.exec(
        0,
        lab::BIN,
        &[
            "exec",
            "--",
            e,
            "initiator",
            &lab.addr[1],
            port,
            &devs[0],
            &lab.dev[0],
        ],
    );
    let target = lab::wait_timeout(target, std::time::Duration::from_secs(30));
    let _ = std::fs::remove_file(&exe);
    let (it, tt) = (
        String::from_utf8_lossy(&init.stdout),
        String::from_utf8_lossy(&target.stdout),
    );
    let both = format!(
        "initiator:\n{it}{}\ntarget:\n{tt}{}",
        String::from_utf8_lossy(&init.stderr),
        String::from_utf8_lossy(&target.stderr)
    );
    assert!(it.contains("all ok") && tt.contains("all ok"), "{both}");
    for kind in ["heap", "memalign", "mmap", "stack", "hugepage", "iova"] {
        assert!(it.contains(&format!("{kind}: read and written")), "{both}");
    }
    for check in [
        "REM_ACCESS_ERR",
        "QP_FATAL on the QP",
        "destroy_qp after the ack",
    ] {
        assert!(it.contains(&format!("ok {check}")), "{both}");
    }
    for check in [
        "no event for an unsolicited SEND",
        "an event for the solicited SEND (epoll)",
        "SRQ_LIMIT_REACHED",
        "the limit disarmed itself",
        "the read-only region was not written",
        "PORT_ERR",
        "PORT_ACTIVE",
    ] {
        assert!(tt.contains(&format!("ok {check}")), "{both}");
    }
}

/// Collects a pipe's lines as they come (a reader thread; the text so far
/// is shared).
fn lines_of(pipe: impl std::io::Read + Send + 'static) -> std::sync::Arc<std::sync::Mutex<String>> {
    let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let t = text.clone();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
            let mut t = t.lock().unwrap();
            t.push_str(&line);
            t.push('\n');
        }
    });
    text
}

/// Waits (60 s at most, then fails with what was printed) until `text`
/// holds `needle`.
fn wait_for_line(text: &std::sync::Mutex<String>, needle: &str, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !text.lock().unwrap().contains(needle) {
        assert!(
            std::time::Instant::now() < deadline,
            "{what} never came: {}",
            text.lock().unwrap()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn a_peer_killed_mid_transfer_ends_in_retry_exceeded() {
    library();
    let _g = lab::serial();
    let lab = lab::Lab::new(1500);
    let perftest = ["ib_write_bw", "-x", "1", "-s", "65536", "-n", "1000000"];
    let server = lab.spawn(1, &[&["exec", "--"][..], &perftest].concat());
    // Until perftest's TCP port listens, a client would be refused.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let ss = lab.exec(1, "ss", &["-Hltn", "sport = :18515"]);
        if !ss.stdout.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the server never listened"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // The client's stdout goes through stdbuf so that its lines arrive as
    // they are printed.
    let cargs = [
        &["exec", "--", "stdbuf", "-oL"][..],
        &perftest,
        &[lab.addr[1].as_str()],
    ]
    .concat();
    let mut client = lab.spawn(0, &cargs);
    // Mid-transfer: the client prints its results header once both QPs
    // are connected and the first WRITEs are posted.
    let client_out = lines_of(client.stdout.take().expect("piped"));
    wait_for_line(&client_out, "#bytes", "the client's results header");
    std::thread::sleep(std::time::Duration::from_millis(500));
    // SIGKILL: no clean-up at all, as a crashed program.
    let _ = Command::new("kill")
        .args(["-KILL", &server.id().to_string()])
        .status();
    let t0 = std::time::Instant::now();
    let out = lab::wait_timeout(client, std::time::Duration::from_secs(60));
    let _ = lab::wait_timeout(server, std::time::Duration::from_secs(5));
    let text = format!(
        "{}{}",
        client_out.lock().unwrap(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(30),
        "the client hung"
    );
    assert!(!out.status.success(), "{text}");
    // perftest's report of a completion with IBV_WC_RETRY_EXC_ERR (12).
    assert!(text.contains("Failed status 12"), "{text}");
}

#[test]
fn a_second_program_on_the_interface_is_told_who_holds_it() {
    library();
    let _g = lab::serial();
    let lab = lab::Lab::new(1500);
    // rc_pingpong's server opens its device and PD, then waits for a client.
    let first = lab.spawn(0, &["exec", "--", "ibv_rc_pingpong", "-g", "1"]);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let pid = first.id();
    let second = lab.exec(
        0,
        lab::BIN,
        &["exec", "--", "ibv_rc_pingpong", "-g", "1", "-p", "18516"],
    );
    let up = lab.exec(0, lab::BIN, &["up", "--dev", &lab.dev[0]]);
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
    let _ = lab::wait_timeout(first, std::time::Duration::from_secs(5));
    for (who, out) in [("a second program", &second), ("a daemon", &up)] {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{who} started");
        assert!(
            err.contains(&format!("in use by pid {pid} (ibv_rc_pingpon")),
            "{who}: {err}"
        );
    }
}

/// With `RDMA_XDP_POOL=1`, the library moves page-aligned
/// regions into the MR pool (same addresses, same bytes), and unmodified
/// perftest's WRITEs are placed and ACKed by the XDP program: both
/// sides' XDP counters show it, and the runs report every iteration.
/// `ib_write_bw -a` also checks that the regions stay usable across
/// sizes up to 8 MiB (those beyond the pool stay in place).
#[test]
fn unmodified_perftest_writes_take_the_xdp_responder_with_rdma_xdp_pool() {
    library();
    let _g = lab::serial();
    let lab = lab::Lab::new(1500);
    for tool in [
        &["ib_write_lat", "-x", "1", "-s", "2", "-n", "500"][..],
        &["ib_write_bw", "-x", "1", "-s", "65536", "-n", "200"],
        &["ib_write_bw", "-x", "1", "-n", "5", "-a"],
    ] {
        let mut args = vec!["exec", "--", "env", "RDMA_XDP_STATS=1", "RDMA_XDP_POOL=1"];
        args.extend_from_slice(tool);
        let srv = lab.spawn(1, &args);
        std::thread::sleep(std::time::Duration::from_millis(1500));
        let mut cargs = args.clone();
        cargs.push(&lab.addr[1]);
        let cli = lab.exec(0, lab::BIN, &cargs);
        let srv = lab::wait_timeout(srv, std::time::Duration::from_secs(60));
        let err = |o: &std::process::Output| String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(
            cli.status.success() && srv.status.success(),
            "{tool:?}\nclient: {}{}\nserver: {}{}",
            String::from_utf8_lossy(&cli.stdout),
            err(&cli),
            String::from_utf8_lossy(&srv.stdout),
            err(&srv)
        );
        // The XDP program's counters, printed at close.
        let placed = |e: &str| -> u64 {
            let line = e
                .lines()
                .find(|l| l.starts_with("rdma-xdp xdp "))
                .unwrap_or_else(|| panic!("no XDP counters: {e}"));
            let v: serde_json::Value =
                serde_json::from_str(&line[line.find('{').unwrap()..]).unwrap();
            v["xdp_placed"].as_u64().unwrap() + v["xdp_acked"].as_u64().unwrap()
        };
        // write_bw: the server is the target; write_lat: both are.
        assert!(placed(&err(&srv)) > 0, "{tool:?}: {}", err(&srv));
        if tool[0] == "ib_write_lat" {
            assert!(placed(&err(&cli)) > 0, "{tool:?}: {}", err(&cli));
        }
    }
}
