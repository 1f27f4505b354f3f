//! `cargo xtask`: set up, build, demo, test, run.
//!
//! - `cargo xtask demo`: install what is missing (perftest too), build, and
//!   run the two-host demo on a veth pair between two network namespaces,
//!   checking its results.
//! - `cargo xtask test`: install what is missing (tshark too), run every test.
//! - `cargo xtask run -- ARGS`: build and run the `rdma-xdp` binary.
//! - `cargo xtask interop [--rxe-pair]`, `cargo xtask vm ...`: against Linux
//!   rxe in VMs of the project's own (`rxevm`, beside this crate).
//!
//! One module per command (demo, test, interop, pair, vm, bench, soak,
//! congestion, setup) and the shared lab helpers (`lab`); the namespaces come from
//! `netlab`, the rxe VMs from `rxevm`.

mod bench;
mod cmbench;
mod congestion;
mod demo;
mod enginesbench;
mod guest;
mod interop;
mod lab;
mod pair;
mod setup;
mod soak;
mod test;
mod vm;
mod vsrxe;

use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};

use bench::bench;
use demo::demo;
use interop::interop;
use setup::{prereqs, run};
use soak::soak;
use test::test;

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Two namespaces, a daemon in each, RDMA WRITE/READ/SEND/FETCH_ADD between
    /// them; WRITEs the XDP responder places; unmodified ib_write_lat over the
    /// drop-in libibverbs.
    Demo {
        /// Keep the namespaces and daemons running afterwards.
        #[arg(long)]
        keep: bool,
    },
    /// Run every test (unit, simulation, captures, namespaces).
    Test {
        /// Extra arguments for `cargo test` (e.g. a test name filter).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// Interoperate with Linux rxe (rdma-core, perftest) in a VM: both roles.
    Interop {
        /// Only the quick subset (what `cargo xtask test` runs).
        #[arg(long)]
        quick: bool,
        /// Leave the VM running afterwards.
        #[arg(long)]
        keep_vm: bool,
        /// Run only the cases whose name contains this.
        #[arg(long)]
        only: Option<String>,
        /// The reference instead: perftest between two rxe VMs.
        #[arg(long, conflicts_with = "quick")]
        rxe_pair: bool,
        /// Write a capture of each case (on the VM bridge) into this directory.
        #[arg(long, value_name = "DIR")]
        capture: Option<std::path::PathBuf>,
        /// Instead: our stack inside both VMs (virtio-net, two queues, a
        /// guest kernel with AF_XDP zero-copy), zero-copy and copy mode: the
        /// demo's operations, a short soak, a short hostile flood.
        #[arg(long, conflicts_with = "rxe_pair")]
        guest: bool,
    },
    /// perftest-style benchmarks, same-link baselines and the engine
    /// microbenchmark on a veth pair; writes target/bench/results.json.
    Bench {
        /// Fewer iterations (a quick look, noisier numbers).
        #[arg(long)]
        quick: bool,
        /// Instead: RDMA CM connection setup (cmtime, and cm_cycles'
        /// per-connection percentiles), ours host to host and, on the rxe
        /// VMs, rxe to rxe, ours to rxe and rxe to ours; writes
        /// target/bench/cm.json and cm.md.
        #[arg(long)]
        cm: bool,
        /// With --cm: connect/disconnect cycles per pair (default 2000,
        /// 300 with --quick).
        #[arg(long, requires = "cm")]
        cycles: Option<u32>,
        /// With --cm: host to host only, no VMs.
        #[arg(long, requires = "cm")]
        no_vm: bool,
        /// Instead: Linux rxe against our stack on the same two VMs
        /// (2-queue virtio-net, a guest kernel with AF_XDP zero-copy):
        /// perftest rxe to rxe, then `rdma-xdp bench` ours to ours, with
        /// the CPU time per message on each side; writes
        /// target/bench/vs-rxe.json and vs-rxe.md.
        #[arg(long, conflicts_with = "cm")]
        vs_rxe: bool,
        /// Instead: only the goals' ratios, each pair's two sides back to
        /// back over alternated rounds (the last stage of a full run);
        /// writes target/bench/goals.json and goals.md.
        #[arg(long, conflicts_with_all = ["cm", "vs_rxe"])]
        goals: bool,
        /// Instead: the engines over the drop-in library (UCX, Open MPI,
        /// qperf), each against its reference on the same veth pair,
        /// alternated; writes target/bench/engines.json and engines.md.
        #[arg(long, conflicts_with_all = ["cm", "vs_rxe", "goals"])]
        engines: bool,
        /// With --vs-rxe: ours in copy mode too.
        #[arg(long, requires = "vs_rxe")]
        copy_too: bool,
        /// With --vs-rxe: only the points whose "test bytes" contains one
        /// of these comma-separated words (e.g. "read_lat,write_bw 65536").
        #[arg(long, requires = "vs_rxe")]
        only: Option<String>,
    },
    /// Verified mixed RDMA workload through the seeded impairment relay:
    /// clean, 5 % loss, 5 % CE marks, 5 % reordering, 1 % duplication, 0.1 % corruption,
    /// and all combined; prints losses (must be 0) and goodput per fault.
    Soak {
        /// Operations per fault configuration.
        #[arg(long, default_value_t = 100_000)]
        ops: u64,
        /// Seed of the relay and of the workload.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Congestion test bed: N senders, a switch whose port to one receiver
    /// is a CE-marking bottleneck, DCQCN on and off, in four scenarios
    /// (stagger, incast, departure, no_congestion); writes
    /// target/congestion/results.json, summary.md and a plot per scenario.
    Congestion(congestion::Options),
    /// Build and run `rdma-xdp` with these arguments.
    Run {
        #[arg(long)]
        release: bool,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build the drop-in libibverbs.so.1 (and its aliases); prints its directory.
    Verbs {
        #[arg(long)]
        release: bool,
    },
    /// The rxe VMs by hand: build the image, boot, run commands, stop.
    Vm {
        #[command(subcommand)]
        cmd: VmCmd,
    },
    /// Check (and with --install, install) the prerequisites.
    Setup {
        #[arg(long)]
        install: bool,
    },
}

#[derive(Subcommand)]
enum VmCmd {
    /// Build the image (or check the cache) and print its versions.
    Image,
    /// Boot VMs (default a) that stay up after this command.
    Start { vms: Vec<String> },
    /// Run a shell command in a running VM.
    Exec {
        #[arg(short, long, default_value = "a")]
        vm: String,
        /// Seconds before the command's process group is killed.
        #[arg(short, long, default_value_t = 60)]
        timeout: u64,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        cmd: Vec<String>,
    },
    /// Copy a host file into a running VM (executable: mode 755), e.g. a
    /// program built on the host (the guest's libraries are the host's).
    Put {
        #[arg(short, long, default_value = "a")]
        vm: String,
        host_path: std::path::PathBuf,
        guest_path: String,
    },
    /// Stop every VM and remove the namespace.
    Stop,
}

pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn main() {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Demo { keep } => setup::demo_prereqs(true).and_then(|_| demo(keep)),
        Cmd::Test { args } => prereqs(true, true).and_then(|_| test(&args)),
        Cmd::Interop {
            quick,
            keep_vm,
            only,
            rxe_pair,
            capture,
            guest,
        } => prereqs(true, true).and_then(|_| {
            if guest {
                guest::guest(quick, keep_vm, only.as_deref(), capture.as_deref())
            } else if rxe_pair {
                pair::rxe_pair(only.as_deref(), keep_vm, capture.as_deref())
            } else {
                interop(&interop::Options {
                    quick,
                    keep_vm,
                    only: only.as_deref(),
                    capture_dir: capture,
                })
            }
        }),
        Cmd::Bench {
            quick,
            vs_rxe: true,
            copy_too,
            only,
            ..
        } => {
            prereqs(true, true).and_then(|_| vsrxe::bench_vs_rxe(quick, copy_too, only.as_deref()))
        }
        Cmd::Bench {
            quick,
            cm: true,
            cycles,
            no_vm,
            ..
        } => prereqs(true, true).and_then(|_| cmbench::bench_cm(quick, cycles, !no_vm)),
        Cmd::Bench {
            quick, goals: true, ..
        } => prereqs(true, false).and_then(|_| bench::goals(quick)),
        Cmd::Bench {
            quick,
            engines: true,
            ..
        } => prereqs(true, true).and_then(|_| enginesbench::bench_engines(quick)),
        Cmd::Bench { quick, .. } => prereqs(true, false).and_then(|_| bench(quick)),
        Cmd::Soak { ops, seed } => prereqs(true, false).and_then(|_| soak(ops, seed)),
        Cmd::Congestion(o) => prereqs(true, false).and_then(|_| congestion::congestion(&o)),
        Cmd::Run { release, args } => prereqs(false, false).and_then(|_| run(release, &args)),
        Cmd::Verbs { release } => ibverbs_so::build(&root(), release)
            .map(|d| println!("{}", d.display()))
            .map_err(anyhow::Error::from),
        Cmd::Vm { cmd } => match cmd {
            VmCmd::Image => vm::image_cmd(),
            VmCmd::Start { vms } => vm::start(&vms),
            VmCmd::Exec { vm, timeout, cmd } => vm::exec(&vm, timeout, &cmd),
            VmCmd::Put {
                vm,
                host_path,
                guest_path,
            } => vm::put(&vm, &host_path, &guest_path),
            VmCmd::Stop => vm::stop(),
        },
        Cmd::Setup { install } => prereqs(install, install),
    };
    if let Err(e) = r {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
