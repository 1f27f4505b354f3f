//! `rdma-xdp`: the daemon (`rdma-xdp up`), the CLI that drives it, and tools.
//! One module per command group: [`control`] (the daemon and its resources),
//! [`tools`] (benchmarks and reliability), [`testing`] (hidden test tools)
//! and [`decode`].

mod control;
mod decode;
mod testing;
mod tools;
mod top;
mod verbs;

use std::path::PathBuf;

use anyhow::{anyhow, bail, Result};
use clap::{Parser, Subcommand};

use control::{AhCmd, CqCmd, MrCmd, PostArgs, QpCmd, SrqCmd, UpArgs};
use decode::DecodeArgs;
use testing::{HostileArgs, InjectArgs, VerbsDemoArgs, XskRecvArgs};
use tools::{BaselineArgs, BenchArgs, FlowArgs, PingpongArgs, RelayArgs, SoakArgs};

#[derive(Parser)]
#[command(
    name = "rdma-xdp",
    version,
    about = "Software RoCEv2 over XDP/AF_XDP: daemon and CLI"
)]
struct Cli {
    /// Daemon to talk to (by interface); needed only when several run in
    /// this network namespace.
    #[arg(long, global = true)]
    iface: Option<String>,
    /// Print raw JSON; `--json FILE` (bench, baseline, soak) writes the
    /// result records to FILE instead.
    #[arg(long, global = true, num_args = 0..=1, value_name = "FILE")]
    json: Option<Option<PathBuf>>,
    /// How AF_XDP sockets bind: auto (zero-copy if the driver takes it,
    /// else copy mode), zero-copy (or fail; without multi-buffer where the
    /// driver has no multi-buffer zero-copy) or copy. Sets RDMA_XDP_XSK,
    /// which programs run by `exec` inherit.
    #[arg(long, global = true, value_parser = ["auto", "zero-copy", "copy"])]
    xsk: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start the daemon on an interface (attach XDP, open AF_XDP sockets).
    Up(UpArgs),
    /// XDP verdict counters and data path counters.
    Stats,
    /// Print every RoCEv2 packet of a pcap file, one line each.
    Decode(DecodeArgs),
    /// Memory regions.
    #[command(subcommand)]
    Mr(MrCmd),
    /// Queue pairs.
    #[command(subcommand)]
    Qp(QpCmd),
    /// Address handles: where UD sends go.
    #[command(subcommand)]
    Ah(AhCmd),
    /// Shared receive queues.
    #[command(subcommand)]
    Srq(SrqCmd),
    /// Post a work request and wait for its completion.
    Post(PostArgs),
    /// Completions of a QP (receives, and any not yet shown).
    #[command(subcommand)]
    Cq(CqCmd),
    /// ibv_rc_pingpong on this stack (same TCP exchange and flags): server
    /// without SERVER, client with it.
    Pingpong(PingpongArgs),
    /// perftest-style benchmark (server without SERVER, client with it);
    /// either side may be perftest itself (ib_write_lat, ...).
    Bench(BenchArgs),
    /// Same-link baselines without RDMA (AF_XDP, UDP, TCP; ping-pong and
    /// stream), and the in-memory engine microbenchmark (`engine`).
    Baseline(BaselineArgs),
    /// Seeded impairment relay: forward every frame between two interfaces
    /// and apply loss, reordering, duplication, corruption and delay to
    /// RoCEv2 frames. Runs until SIGINT/SIGTERM, then prints its counters.
    Relay(RelayArgs),
    /// Verified mixed workload (WRITE, READ, SEND, atomics) through one RC
    /// QP: server without SERVER, client with it. Every completion, byte
    /// and atomic result is checked; exits non-zero on any loss, duplicate
    /// or corruption.
    Soak(SoakArgs),
    /// A congestion test bed flow: the client streams RDMA WRITEs for
    /// --seconds from --start-at and reports its goodput and DCQCN rate per
    /// time bin; the server takes any number of clients.
    Flow(FlowArgs),
    /// A live view of the daemon's QPs (rates, bytes, retransmits, NAKs,
    /// CNPs, DCQCN rate and alpha); `--once [--json]` prints one sample.
    Top(top::TopArgs),
    /// Give veth ends a pass-through XDP program until SIGINT/SIGTERM, so
    /// that the ACKs our XDP responder sends with XDP_TX from their peers
    /// reach them (veth hands XDP_TX frames only to a peer running XDP).
    /// Run it on the far end of a veth whose other end runs rdma-xdp.
    XdpPass {
        #[arg(required = true, value_name = "IFACE")]
        ifaces: Vec<String>,
    },
    /// Verbs devices: which interfaces programs see (`rdma link` style).
    #[command(subcommand)]
    Link(verbs::LinkCmd),
    /// Run an unmodified verbs program (ibv_*, perftest) over our
    /// libibverbs: `rdma-xdp exec [--iface IF] -- PROGRAM ARGS...`.
    Exec {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        program: Vec<String>,
    },
    /// Flood a victim QP with seeded hostile packets (test tool).
    #[command(hide = true)]
    Hostile(HostileArgs),
    /// Send raw frames from this namespace (test tool).
    #[command(hide = true)]
    Inject(InjectArgs),
    /// The verbs library end to end between two interfaces of this
    /// namespace (test tool and usage example of `rdma_user::verbs`).
    #[command(hide = true)]
    VerbsDemo(VerbsDemoArgs),
    /// Attach XDP and one AF_XDP socket, print received frames as hex (test tool).
    #[command(hide = true)]
    XskRecv(XskRecvArgs),
}

/// What every command may need of the global flags.
pub struct Global {
    pub iface: Option<String>,
    pub json: bool,
    pub json_file: Option<PathBuf>,
}

pub fn num(s: &str) -> Result<u64> {
    let t = s.trim();
    let r = if let Some(h) = t.strip_prefix("0x") {
        u64::from_str_radix(h, 16)
    } else {
        t.parse()
    };
    r.map_err(|_| anyhow!("'{s}' is not a number (decimal or 0x-hex)"))
}

fn main() {
    // Exit quietly when stdout is a closed pipe (`rdma-xdp decode x | head`).
    // SAFETY: resetting a signal disposition at startup.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse_from(json_flag_last(std::env::args_os().collect()));
    if let Err(e) = run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// `--json` takes an optional FILE, so `rdma --json mr list` would read
/// `mr` as the file: a `--json` right before a subcommand's name moves to
/// the end, where it means the same.
fn json_flag_last(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    use clap::CommandFactory;
    let cmd = Cli::command();
    let is_sub = |a: &std::ffi::OsString| {
        cmd.get_subcommands()
            .any(|c| a.to_str() == Some(c.get_name()))
    };
    if let Some(i) = args.iter().position(|a| a == "--json") {
        if args.get(i + 1).is_some_and(is_sub) {
            let flag = args.remove(i);
            args.push(flag);
        }
    }
    args
}

fn run(cli: Cli) -> Result<()> {
    if let Some(x) = &cli.xsk {
        // Before any thread starts: the data path and the tools read it
        // when they open their sockets, and `exec` passes it on.
        std::env::set_var(rdma_user::io::xsk::XSK_BIND_ENV, x);
    }
    let json_file = cli.json.clone().flatten();
    if json_file.is_some()
        && !matches!(
            cli.cmd,
            Cmd::Bench(_) | Cmd::Baseline(_) | Cmd::Soak(_) | Cmd::Flow(_)
        )
    {
        bail!("--json FILE writes the results of bench, baseline, soak and flow; other commands take --json alone");
    }
    let g = Global {
        iface: cli.iface,
        json: cli.json.is_some(),
        json_file,
    };
    match cli.cmd {
        Cmd::Up(a) => control::up(a, &g),
        Cmd::Stats => control::stats(&g),
        Cmd::Mr(m) => control::mr(m, &g),
        Cmd::Qp(q) => control::qp(q, &g),
        Cmd::Ah(a) => control::ah(a, &g),
        Cmd::Srq(q) => control::srq(q, &g),
        Cmd::Post(p) => control::post(p, &g),
        Cmd::Cq(c) => control::cq(c, &g),
        Cmd::Decode(d) => decode::decode(&d.file),
        Cmd::Bench(b) => tools::bench(b, &g),
        Cmd::Baseline(b) => tools::baseline(b, &g),
        Cmd::Pingpong(p) => tools::pingpong(p),
        Cmd::Relay(r) => tools::relay(r, &g),
        Cmd::Soak(a) => tools::soak(a, g.json_file),
        Cmd::Flow(a) => tools::flow(a, g.json_file),
        Cmd::Top(a) => top::top(a, &g),
        Cmd::XdpPass { ifaces } => tools::xdp_pass(&ifaces),
        Cmd::Link(l) => verbs::link(l, &g),
        Cmd::Exec { program } => verbs::exec(&program, &g),
        Cmd::Hostile(h) => testing::hostile(h),
        Cmd::Inject(i) => testing::inject(&i.dev, &i.frames),
        Cmd::VerbsDemo(v) => testing::verbs_demo(&v.a, &v.b, v.pooled_twice),
        Cmd::XskRecv(x) => testing::xsk_recv(
            &x.dev,
            x.count,
            x.timeout_ms,
            x.xdp_mode,
            !x.no_multi_buffer,
        ),
    }
}
