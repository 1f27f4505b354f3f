//! `cargo xtask bench --engines`: the engines over the drop-in library,
//! each against its reference on the same veth pair, alternated (see
//! [`bench::alternate`]): UCX's UCT latency and bandwidth against
//! `rdma-xdp bench`, an MPI ping-pong over `pml ucx` against the same job
//! over Open MPI's TCP transport, and qperf's event-driven latency against
//! its polled one. Writes target/bench/engines.json and engines.md.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

use crate::bench::{self, alternate, BenchLab, Job, Pair};
use crate::{lab::*, root, setup::*};

/// The device name the engines are told (`rdma-xdp link add`), as rxe's.
const DEV: &str = "rxe0";

struct Engines {
    bl: BenchLab,
    /// The MPI program (tests/data/mpi_check.c) and Open MPI's rsh agent
    /// into the two namespaces.
    mpi_check: PathBuf,
    rsh_agent: PathBuf,
}

impl Engines {
    /// `rdma-xdp exec -- env UCX_NET_DEVICES=rxe0:1 ARGS` in namespace `i`,
    /// on CPU `i` (the data path thread too), as `rdma-xdp bench` runs.
    fn exec(&self, i: usize, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args([
            "netns",
            "exec",
            &self.bl.ns[i],
            "taskset",
            "-c",
            &i.to_string(),
        ])
        .arg(&self.bl.bin)
        .args(["exec", "--", "env", "UCX_NET_DEVICES=rxe0:1"])
        .args(args)
        .env("RDMA_XDP_CPU", i.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        c
    }

    /// A server in namespace 1, then the client in namespace 0 with the
    /// server's address last; the client's output. The server is stopped
    /// if it has not ended when the client has.
    fn client_server(&self, server: &[&str], client: &[&str]) -> Result<Output> {
        let mut srv = self.exec(1, server).spawn()?;
        std::thread::sleep(Duration::from_millis(1500));
        let mut args = vec!["timeout", "60"];
        args.extend_from_slice(client);
        args.push(self.bl.addrs[1]);
        let cli = self.exec(0, &args).output();
        for _ in 0..100 {
            if srv.try_wait()?.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        terminate(&mut srv)?;
        let cli = cli?;
        if !cli.status.success() {
            bail!("{client:?}: {}", text(&cli));
        }
        Ok(cli)
    }

    /// `ucx_perftest` at UCT level over rc_verbs: its "Final:" line's
    /// columns (iterations, median, average and overall latency in us,
    /// average and overall bandwidth in MB/s, message rates).
    fn ucx_perftest(&self, test: &[&str]) -> Result<Vec<f64>> {
        let mut c = vec!["ucx_perftest", "-d", "rxe0:1", "-x", "rc_verbs"];
        c.extend_from_slice(test);
        let out = self.client_server(&["ucx_perftest"], &c)?;
        let s = String::from_utf8_lossy(&out.stdout);
        let line = s
            .lines()
            .find(|l| l.starts_with("Final:"))
            .ok_or_else(|| anyhow!("ucx_perftest {test:?}: no Final line:\n{s}"))?;
        Ok(line
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect())
    }

    fn am_lat_us(&self) -> Result<f64> {
        let f = self.ucx_perftest(&["-t", "am_lat", "-s", "8", "-n", "20000"])?;
        f.get(1).copied().ok_or_else(|| anyhow!("no median"))
    }

    fn put_bw_gbps(&self) -> Result<f64> {
        let f = self.ucx_perftest(&["-t", "put_bw", "-s", "65536", "-D", "zcopy", "-n", "5000"])?;
        // UCX's MB is 2^20 bytes.
        f.get(4)
            .map(|mb| mb * 1048576.0 * 8.0 / 1e9)
            .ok_or_else(|| anyhow!("no bandwidth"))
    }

    /// `rdma-xdp bench ARGS`'s last record's `key`.
    fn ours(&self, args: &str, key: &str) -> Result<f64> {
        let job = Job {
            args: args.split_whitespace().map(String::from).collect(),
            from_server: false,
            threaded_napi: false,
        };
        self.bl
            .run(&job)?
            .iter()
            .rev()
            .find_map(|v| v[key].as_f64())
            .ok_or_else(|| anyhow!("{args}: no {key}"))
    }

    /// Two ranks, one per namespace, launched from namespace 0 through the
    /// rsh agent, each under `rdma-xdp exec`; the program's 8-byte
    /// ping-pong (half a round trip, us) after its checked
    /// point-to-point and collective runs.
    fn mpi_pingpong_us(&self, transport: &[&str]) -> Result<f64> {
        let hosts = format!("{},{}", self.bl.addrs[0], self.bl.addrs[1]);
        let net = format!("{}/24", self.bl.addrs[0]);
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.bl.ns[0], "timeout", "120", "mpirun"])
            .args(["--allow-run-as-root", "-np", "2", "-H", &hosts])
            // Both "hosts" are this machine: bound ranks would share a core.
            .args(["--bind-to", "none", "--mca", "plm_rsh_agent"])
            .arg(&self.rsh_agent)
            .args(["--mca", "oob_tcp_if_include", &net])
            .args(transport)
            .arg(&self.bl.bin)
            .args(["exec", "--"])
            .arg(&self.mpi_check)
            .args(["-l", "20000"]);
        let out = c.output()?;
        let s = text(&out);
        if !out.status.success() || !s.contains("mpi_check: ok") {
            bail!("mpirun {transport:?}: {s}");
        }
        s.lines()
            .find_map(|l| l.strip_prefix("pingpong_8B_us "))
            .and_then(|x| x.trim().parse().ok())
            .ok_or_else(|| anyhow!("no pingpong_8B_us:\n{s}"))
    }

    /// qperf's `rc_lat` over RDMA CM for 2 s: with its default
    /// event-driven wait, or `-cp1` (polling).
    fn qperf_rc_lat_us(&self, poll: bool) -> Result<f64> {
        let mut args = vec!["timeout", "30", "qperf", "-cm1", "-t", "2"];
        if poll {
            args.push("-cp1");
        }
        // qperf's client names the server before the tests.
        args.extend_from_slice(&[self.bl.addrs[1], "rc_lat"]);
        let mut srv = self.exec(1, &["qperf"]).spawn()?;
        std::thread::sleep(Duration::from_millis(1000));
        let cli = self.exec(0, &args).output();
        terminate(&mut srv)?;
        let cli = cli?;
        let s = text(&cli);
        // "    latency  =  6.06 us"
        let l = s
            .lines()
            .find(|l| l.trim_start().starts_with("latency"))
            .ok_or_else(|| anyhow!("qperf {args:?}: no latency:\n{s}"))?;
        let f: Vec<&str> = l.split_whitespace().collect();
        let v: f64 = f
            .get(2)
            .and_then(|x| x.parse().ok())
            .ok_or_else(|| anyhow!("{l}"))?;
        Ok(match f.get(3).copied() {
            Some("ns") => v / 1000.0,
            Some("ms") => v * 1000.0,
            _ => v,
        })
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// An rsh agent for mpirun: the "host" is one namespace's address; the
/// command runs in that namespace.
fn write_rsh_agent(dir: &Path, ns: &[String; 2], addrs: [&str; 2]) -> Result<PathBuf> {
    let p = dir.join("nsrsh");
    let script = format!(
        "#!/bin/sh\nhost=$1; shift\ncase \"$host\" in\n  {}) ns={} ;;\n  {}) ns={} ;;\n  \
         *) echo \"unknown host $host\" >&2; exit 1 ;;\nesac\nexec ip netns exec \"$ns\" sh -c \"$*\"\n",
        addrs[0], ns[0], addrs[1], ns[1]
    );
    std::fs::write(&p, script)?;
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    Ok(p)
}

pub(crate) fn bench_engines(quick: bool) -> Result<()> {
    let bin = build(true)?;
    ibverbs_so::build(&root(), true)?;
    let out_dir = root().join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    let mpi_check = out_dir.join("mpi_check");
    sh(Command::new("mpicc")
        .args(["-O2", "-o"])
        .arg(&mpi_check)
        .arg(root().join("rdma-user/tests/data/mpi_check.c")))
    .context("mpicc (libopenmpi-dev)")?;
    let ns = bench::NS.map(String::from);
    let lab = Lab::fresh(&ns, false);
    veth_pair(&ns, bench::DEVS, bench::ADDRS)?;
    for (n, dev) in ns.iter().zip(bench::DEVS) {
        sh(Command::new("ip")
            .args(["netns", "exec", n])
            .arg(&bin)
            .args(["link", "add", DEV, "netdev", dev])
            .stdout(Stdio::null()))?;
    }
    let e = Engines {
        rsh_agent: write_rsh_agent(&out_dir, &ns, bench::ADDRS)?,
        mpi_check,
        bl: BenchLab {
            bin,
            ns: ns.clone(),
            devs: bench::DEVS,
            addrs: bench::ADDRS,
            out_dir,
        },
    };
    let ucx = ["--mca", "pml", "ucx"];
    let net = format!("{}/24", bench::ADDRS[0]);
    let tcp = [
        "--mca",
        "pml",
        "ob1",
        "--mca",
        "btl",
        "tcp,self",
        "--mca",
        "btl_tcp_if_include",
        &net,
    ];
    let pairs = [
        Pair {
            name: "ucx_perftest am_lat rc_verbs 8 B / rdma-xdp bench send_lat 8 B (median us)",
            goal: "<= 1.2",
            metric: "t_typical_us",
            a: Box::new(|| e.am_lat_us()),
            b: Box::new(|| e.ours("bench send-lat -s 8 -n 20000", "t_typical_us")),
        },
        Pair {
            name: "MPI ping-pong 8 B, pml ucx over us / pml ob1 btl tcp (half round trip us)",
            goal: "< 1",
            metric: "pingpong_8B_us",
            a: Box::new(|| e.mpi_pingpong_us(&ucx)),
            b: Box::new(|| e.mpi_pingpong_us(&tcp)),
        },
        Pair {
            name: "ucx_perftest put_bw rc_verbs 64 KiB / rdma-xdp bench write_bw 64 KiB, adaptive target (Gb/s)",
            goal: ">= 0.8",
            metric: "bw_avg_gbps",
            a: Box::new(|| e.put_bw_gbps()),
            b: Box::new(|| e.ours("bench write-bw -s 65536 -n 2000 --adaptive", "bw_avg_gbps")),
        },
        Pair {
            name: "qperf -cm1 rc_lat, event-driven / polled (-cp1) (us)",
            goal: "<= 3",
            metric: "latency_us",
            a: Box::new(|| e.qperf_rc_lat_us(false)),
            b: Box::new(|| e.qperf_rc_lat_us(true)),
        },
    ];
    let records = alternate(&pairs, if quick { 3 } else { 7 });
    drop(pairs);
    let _ = std::fs::remove_file(&e.rsh_agent);
    drop(lab);
    let md = bench::alternated_table(
        &records,
        "The engines over the drop-in library on a veth pair, each against its reference; each pair's sides back to back, the order flipped every round:",
    );
    bench::write_out("engines", &records, &md)
}
