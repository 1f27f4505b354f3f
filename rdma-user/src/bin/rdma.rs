//! `rdma`: the daemon (`rdma up`), the CLI that drives it, and tools.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use rdma_user::control::daemon::{self, UpOptions};
use rdma_user::control::proto::{hex, unhex};
use rdma_user::control::proto::{Post, Request};
use rdma_user::device::datapath::Limits;
use rdma_user::io::xdp::XdpMode;
use rdma_user::wire::*;
use serde_json::Value;

#[derive(Parser)]
#[command(
    name = "rdma",
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
    Decode { file: PathBuf },
    /// Memory regions.
    #[command(subcommand)]
    Mr(MrCmd),
    /// Queue pairs.
    #[command(subcommand)]
    Qp(QpCmd),
    /// Post a work request and wait for its completion.
    Post(PostArgs),
    /// Completions of a QP (receives, and any not yet shown).
    Cq {
        #[command(subcommand)]
        cmd: CqCmd,
    },
    /// ibv_rc_pingpong on this stack (same TCP exchange and flags): server
    /// without SERVER, client with it.
    Pingpong {
        server: Option<std::net::IpAddr>,
        #[arg(long = "dev", short = 'd')]
        dev: String,
        #[arg(short = 'p', long, default_value_t = 18515)]
        port: u16,
        #[arg(short = 's', long, default_value_t = 4096)]
        size: usize,
        #[arg(short = 'n', long, default_value_t = 1000)]
        iters: u64,
        #[arg(short = 'm', long, default_value_t = 1024)]
        mtu: u32,
        #[arg(short = 'r', long, default_value_t = 500)]
        rx_depth: u32,
        /// Validate received buffers (rc_pingpong -c).
        #[arg(short = 'c', long)]
        chk: bool,
        /// Use this local address as our GID (IPv4 or IPv6).
        #[arg(long)]
        local_ip: Option<std::net::IpAddr>,
    },
    /// perftest-style benchmark (server without SERVER, client with it);
    /// either side may be perftest itself (ib_write_lat, ...).
    Bench(BenchArgs),
    /// Same-link baselines without RDMA (AF_XDP, UDP, TCP; ping-pong and
    /// stream), and the in-memory engine microbenchmark (`engine`).
    Baseline {
        #[arg(value_enum)]
        kind: Option<rdma_user::tools::baseline::Kind>,
        server: Option<std::net::IpAddr>,
        #[arg(long = "dev", short = 'd', default_value = "")]
        dev: String,
        #[arg(short = 's', long, default_value_t = 64)]
        size: usize,
        #[arg(short = 'n', long, default_value_t = 10000)]
        iters: u64,
        #[arg(long)]
        cpu: Option<usize>,
        /// AF_XDP stream client: copy frames into TX chunks, or chain
        /// descriptors that point at payload already in the UMEM.
        #[arg(long, value_enum, default_value_t)]
        tx: rdma_user::tools::baseline::TxMode,
        /// Run the engine microbenchmark instead (WRITEs of 64 B).
        #[arg(long)]
        engine: bool,
    },
    /// Seeded impairment relay: forward every frame between two interfaces
    /// and apply loss, reordering, duplication, corruption and delay to
    /// RoCEv2 frames. Runs until SIGINT/SIGTERM, then prints its counters.
    Relay(RelayArgs),
    /// Verified mixed workload (WRITE, READ, SEND, atomics) through one RC
    /// QP: server without SERVER, client with it. Every completion, byte
    /// and atomic result is checked; exits non-zero on any loss, duplicate
    /// or corruption.
    Soak(SoakArgs),
    /// Flood a victim QP with seeded hostile packets (test tool).
    #[command(hide = true)]
    Hostile(HostileArgs),
    /// Send raw frames from this namespace (test tool).
    #[command(hide = true)]
    Inject {
        #[arg(long = "dev")]
        dev: String,
        /// Frame as hex; repeat for several.
        #[arg(long = "hex", required = true)]
        frames: Vec<String>,
    },
    /// The verbs library end to end between two interfaces of this
    /// namespace (test tool and usage example of `rdma_user::verbs`).
    #[command(hide = true)]
    VerbsDemo {
        #[arg(long)]
        a: String,
        #[arg(long)]
        b: String,
    },
    /// Attach XDP and one AF_XDP socket, print received frames as hex (test tool).
    #[command(hide = true)]
    XskRecv {
        #[arg(long = "dev")]
        dev: String,
        #[arg(long, default_value_t = 1)]
        count: usize,
        #[arg(long, default_value_t = 5000)]
        timeout_ms: u64,
        #[arg(long, value_enum, default_value_t = XdpMode::Auto)]
        xdp_mode: XdpMode,
        #[arg(long)]
        no_multi_buffer: bool,
    },
}

#[derive(Args)]
struct SoakArgs {
    server: Option<std::net::IpAddr>,
    #[arg(long = "dev", short = 'd')]
    dev: String,
    #[arg(short = 'p', long, default_value_t = 18517)]
    port: u16,
    /// Operations to run (client).
    #[arg(short = 'n', long, default_value_t = 100_000)]
    ops: u64,
    /// Seed of the operation mix and the data (client and server must agree).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Outstanding work requests.
    #[arg(short = 't', long, default_value_t = 16)]
    tx_depth: u32,
    #[arg(short = 'm', long, default_value_t = 1024)]
    mtu: u32,
    /// Local ACK timeout exponent (4.096 us * 2^N).
    #[arg(long, default_value_t = 12)]
    ack_timeout: u8,
    /// Busy-poll instead of sleeping when idle.
    #[arg(long)]
    spin: bool,
    #[arg(long)]
    cpu: Option<usize>,
    /// Seconds to wait for the peer.
    #[arg(long, default_value_t = 10)]
    peer_timeout: u64,
    /// Fail when no operation completes for this many seconds.
    #[arg(long, default_value_t = 30)]
    stall_timeout: u64,
}

#[derive(Args)]
struct HostileArgs {
    #[arg(long = "dev")]
    dev: String,
    /// The victim host's address and MAC.
    #[arg(long)]
    dst_ip: std::net::IpAddr,
    #[arg(long, value_parser = rdma_user::io::hostnet::parse_mac)]
    dst_mac: [u8; 6],
    /// Our address (the victim QP's connected peer).
    #[arg(long)]
    src_ip: std::net::IpAddr,
    /// The QPN the victim is connected to (sets the UDP source port).
    #[arg(long)]
    peer_qpn: u32,
    #[arg(long)]
    qpn: u32,
    #[arg(long)]
    epsn: u32,
    #[arg(long)]
    rkey: u32,
    #[arg(long)]
    va: u64,
    #[arg(long)]
    mr_len: u32,
    #[arg(long, default_value_t = 1024)]
    mtu: u32,
    #[arg(long, default_value_t = 1_000_000)]
    count: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Args)]
struct RelayArgs {
    /// Side A interface.
    #[arg(long)]
    a: String,
    /// Side B interface.
    #[arg(long)]
    b: String,
    /// Loss probability per frame (0.05 = 5 %).
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Probability that a frame is held back behind later ones.
    #[arg(long, default_value_t = 0.0)]
    reorder: f64,
    /// Frames a reordered frame is held behind.
    #[arg(long, default_value_t = 3)]
    reorder_gap: u32,
    /// Duplication probability.
    #[arg(long, default_value_t = 0.0)]
    dup: f64,
    /// Probability of one flipped bit in the RoCE part of the frame.
    #[arg(long, default_value_t = 0.0)]
    corrupt: f64,
    /// Added one-way delay, microseconds.
    #[arg(long, default_value_t = 0)]
    delay_us: u64,
    /// Random extra delay up to this many microseconds (reorders too).
    #[arg(long, default_value_t = 0)]
    jitter_us: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Impair every frame, not only RoCEv2 (UDP 4791).
    #[arg(long)]
    all_traffic: bool,
    /// Stop after this many seconds.
    #[arg(long)]
    seconds: Option<f64>,
    /// Write the final counters as JSON here.
    #[arg(long)]
    stats_file: Option<PathBuf>,
}

#[derive(Args)]
struct UpArgs {
    /// Interface to attach to (inside the current network namespace).
    #[arg(long = "dev", short = 'd', alias = "interface")]
    dev: Option<String>,
    #[arg(long, value_enum, default_value_t = XdpMode::Auto)]
    xdp_mode: XdpMode,
    /// RX queues to serve (default: all).
    #[arg(long)]
    queues: Option<u32>,
    /// UMEM chunk size (2048 or 4096).
    #[arg(long, default_value_t = 4096)]
    frame_size: u32,
    /// UMEM chunks per AF_XDP socket (RX and TX share them; small values
    /// exercise backpressure).
    #[arg(long, default_value_t = 8192)]
    umem_frames: u32,
    /// Disable multi-buffer (frames larger than a chunk are then dropped).
    #[arg(long)]
    no_multi_buffer: bool,
    /// Do not try zero-copy.
    #[arg(long)]
    copy: bool,
    /// Sleep when idle instead of busy-polling (tests, laptops).
    #[arg(long)]
    adaptive: bool,
    /// Pin the data path thread to this CPU.
    #[arg(long)]
    cpu: Option<usize>,
    /// TCP port for QP exchange with peer daemons.
    #[arg(long, default_value_t = 18516)]
    cm_port: u16,
    #[arg(long, default_value_t = 256)]
    max_qp: usize,
    #[arg(long, default_value_t = 1024)]
    max_mr: usize,
    /// Drop RoCEv2 packets for QPNs that are not live, or from the wrong peer,
    /// in XDP.
    #[arg(long)]
    firewall: bool,
}

#[derive(Args)]
struct BenchArgs {
    #[arg(value_enum)]
    test: rdma_user::tools::bench::Test,
    /// Server address (client mode); none = server mode.
    server: Option<std::net::IpAddr>,
    #[arg(long = "dev", short = 'd')]
    dev: String,
    /// Message size in bytes.
    #[arg(short = 's', long, default_value_t = 2)]
    size: usize,
    /// All sizes from 2 to 2^23.
    #[arg(short = 'a', long)]
    all: bool,
    #[arg(short = 'n', long, default_value_t = 1000)]
    iters: u64,
    /// Run for this many seconds (bandwidth tests).
    #[arg(short = 'D', long)]
    duration: Option<f64>,
    /// Queue pairs (bandwidth tests; `-n` messages on each).
    #[arg(short = 'q', long, default_value_t = 1)]
    qps: u32,
    #[arg(short = 't', long, default_value_t = 128)]
    tx_depth: u32,
    #[arg(short = 'm', long, default_value_t = 1024)]
    mtu: u32,
    #[arg(short = 'p', long, default_value_t = 18515)]
    port: u16,
    /// Pin to this CPU (default: the client CPU 0, the server the last
    /// CPU, so two sides on one machine do not share a core).
    #[arg(long)]
    cpu: Option<usize>,
    /// Seconds to wait for the peer.
    #[arg(long, default_value_t = 10)]
    peer_timeout: u64,
    /// Use this local address as our GID (IPv4 or IPv6; perftest's peer
    /// must use the same family, e.g. `-x 2` for fd99:: in the rxe VM).
    #[arg(long)]
    local_ip: Option<std::net::IpAddr>,
}

#[derive(Subcommand)]
enum MrCmd {
    /// Register a new memory region.
    Reg {
        #[arg(long)]
        len: usize,
        /// Comma-separated: local-write, remote-write, remote-read, remote-atomic, all.
        #[arg(
            long,
            default_value = "local-write,remote-write,remote-read,remote-atomic"
        )]
        access: String,
    },
    List,
    Dereg {
        key: String,
    },
    /// Hexdump part of a region.
    Read {
        key: String,
        #[arg(long, default_value_t = 0)]
        offset: u64,
        #[arg(long, default_value_t = 64)]
        len: u64,
    },
    /// Write bytes into a region.
    Write {
        key: String,
        #[arg(long, default_value_t = 0)]
        offset: u64,
        #[arg(long, conflicts_with = "file")]
        data: Option<String>,
        #[arg(long)]
        file: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum QpCmd {
    /// Create an RC QP (and its CQ).
    Create {
        #[arg(long)]
        depth: Option<u32>,
    },
    /// Connect a QP: through the peer's daemon (--peer), or with known values.
    Connect {
        qpn: String,
        /// Peer daemon address (IP or IP:PORT) to exchange QP details with.
        #[arg(long, conflicts_with_all = ["remote_ip", "remote_psn"])]
        peer: Option<String>,
        #[arg(long)]
        remote_qpn: String,
        #[arg(long)]
        remote_ip: Option<String>,
        #[arg(long)]
        remote_psn: Option<String>,
        #[arg(long)]
        remote_mac: Option<String>,
        /// Our initial PSN (default random).
        #[arg(long)]
        psn: Option<String>,
        #[arg(long, default_value_t = 1024)]
        mtu: u32,
    },
    List,
    Destroy {
        qpn: String,
    },
}

#[derive(Args)]
struct PostArgs {
    /// write, read, send, recv, cmp-swap or fetch-add
    op: String,
    #[arg(long)]
    qp: String,
    /// Local memory region (lkey or rkey).
    #[arg(long)]
    key: String,
    #[arg(long, default_value_t = 0)]
    offset: u64,
    #[arg(long)]
    len: Option<u64>,
    /// Bytes (hex) to place in the local region first.
    #[arg(long)]
    data: Option<String>,
    #[arg(long)]
    remote_addr: Option<String>,
    #[arg(long)]
    rkey: Option<String>,
    #[arg(long)]
    imm: Option<String>,
    #[arg(long)]
    compare: Option<String>,
    #[arg(long)]
    swap: Option<String>,
    #[arg(long)]
    add: Option<String>,
    #[arg(long, default_value_t = 5000)]
    timeout_ms: u64,
}

#[derive(Subcommand)]
enum CqCmd {
    Poll {
        #[arg(long)]
        qp: String,
        #[arg(long, default_value_t = 16)]
        max: usize,
        #[arg(long, default_value_t = 0)]
        wait_ms: u64,
    },
}

fn num(s: &str) -> Result<u64> {
    let t = s.trim();
    let r = if let Some(h) = t.strip_prefix("0x") {
        u64::from_str_radix(h, 16)
    } else {
        t.parse()
    };
    r.map_err(|_| anyhow!("'{s}' is not a number (decimal or 0x-hex)"))
}

fn main() {
    // Exit quietly when stdout is a closed pipe (`rdma decode x | head`).
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
    let json = cli.json.is_some();
    let json_file = cli.json.clone().flatten();
    if json_file.is_some()
        && !matches!(cli.cmd, Cmd::Bench(_) | Cmd::Baseline { .. } | Cmd::Soak(_))
    {
        bail!("--json FILE writes the results of bench, baseline and soak; other commands take --json alone");
    }
    match cli.cmd {
        Cmd::Up(a) => {
            let iface = a
                .dev
                .or(cli.iface)
                .ok_or_else(|| anyhow!("which interface? pass --dev IF (see `ip link`)"))?;
            daemon::run(UpOptions {
                iface,
                xdp_mode: a.xdp_mode,
                queues: a.queues,
                frame_size: a.frame_size,
                umem_frames: a.umem_frames,
                multi_buffer: !a.no_multi_buffer,
                zero_copy: !a.copy,
                adaptive: a.adaptive,
                cpu: a.cpu,
                cm_port: a.cm_port,
                limits: Limits {
                    max_qp: a.max_qp,
                    max_mr: a.max_mr,
                    ..Default::default()
                },
                firewall: a.firewall,
            })
        }
        Cmd::Decode { file } => decode(&file),
        Cmd::Baseline {
            kind,
            server,
            dev,
            size,
            iters,
            cpu,
            tx,
            engine,
        } => {
            if let Some(c) = cpu {
                rdma_user::device::runner::pin_to_cpu(c);
            }
            let rec = if engine {
                // The engine alone, then with the wire layer around it.
                let (_, eng) = rdma_user::tools::baseline::engine_pps(iters, false)?;
                let (mps, fps) = rdma_user::tools::baseline::engine_pps(iters, true)?;
                println!(
                    "engine: {:.2} M frames/s engine only (transport headers, no framing or ICRC); \
                     with full frames and ICRC both sides: {:.2} M WRITE/s, {:.2} M frames/s (64 B WRITEs, one core)",
                    eng / 1e6,
                    mps / 1e6,
                    fps / 1e6
                );
                Some(rdma_user::tools::bench::Record {
                    test: "engine_write_64".into(),
                    bytes: 64,
                    iters,
                    msg_rate_mpps: Some(fps / 1e6),
                    engine_only_mpps: Some(eng / 1e6),
                    ..Default::default()
                })
            } else {
                let kind = kind
                    .ok_or_else(|| anyhow!("which baseline? (afxdp-pingpong, udp-stream, ...)"))?;
                rdma_user::tools::baseline::run(&rdma_user::tools::baseline::Options {
                    kind,
                    tx,
                    iface: dev,
                    server,
                    size,
                    iters,
                    timeout: Duration::from_secs(10),
                })?
            };
            if let Some(r) = rec {
                rdma_user::tools::bench::print_record(&r);
                if let Some(f) = json_file {
                    std::fs::write(&f, serde_json::to_string_pretty(&vec![r])?)?;
                }
            }
            Ok(())
        }
        Cmd::Bench(b) => {
            if b.qps == 0 {
                bail!("-q 0: a test needs at least one QP");
            }
            let sizes = if b.all {
                (1..=23).map(|e| 1usize << e).collect()
            } else {
                vec![b.size]
            };
            let recs = rdma_user::tools::bench::run(rdma_user::tools::bench::Options {
                test: b.test,
                iface: b.dev,
                server: b.server,
                port: b.port,
                sizes,
                iters: b.iters,
                duration: b.duration,
                tx_depth: b.tx_depth,
                mtu: b.mtu,
                cpu: b.cpu.or_else(|| {
                    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
                    Some(if b.server.is_some() { 0 } else { n - 1 })
                }),
                connect_timeout: b.peer_timeout,
                qps: b.qps,
                local_ip: b.local_ip,
                quiet: false,
            })?;
            if let Some(f) = json_file {
                std::fs::write(&f, serde_json::to_string_pretty(&recs)?)
                    .with_context(|| format!("write {}", f.display()))?;
            }
            Ok(())
        }
        Cmd::Pingpong {
            server,
            dev,
            port,
            size,
            iters,
            mtu,
            rx_depth,
            chk,
            local_ip,
        } => rdma_user::tools::pingpong::run(rdma_user::tools::pingpong::Options {
            iface: dev,
            server,
            port,
            size,
            iters,
            mtu,
            rx_depth,
            validate: chk,
            local_ip,
        }),
        Cmd::Inject { dev, frames } => inject(&dev, &frames),
        Cmd::VerbsDemo { a, b } => verbs_demo(&a, &b),
        Cmd::Soak(a) => soak(a, json_file),
        Cmd::Hostile(h) => hostile(h),
        Cmd::Relay(r) => {
            let cfg = rdma_user::tools::impair::ImpairConfig {
                loss: r.loss,
                reorder: r.reorder,
                dup: r.dup,
                corrupt: r.corrupt,
                delay_us: r.delay_us,
                jitter_us: r.jitter_us,
                reorder_gap: r.reorder_gap,
                seed: r.seed,
                roce_only: !r.all_traffic,
                ..Default::default()
            };
            cfg.validate().map_err(|e| anyhow!(e))?;
            eprintln!("relay {} <-> {}: {}", r.a, r.b, cfg.describe());
            let rep = rdma_user::tools::relay::run(
                &r.a,
                &r.b,
                cfg,
                r.seconds.map(Duration::from_secs_f64),
                !json,
            )?;
            let out = serde_json::to_string_pretty(&rep)?;
            if let Some(f) = r.stats_file {
                std::fs::write(&f, &out).with_context(|| format!("write {}", f.display()))?;
            }
            println!("{out}");
            Ok(())
        }
        Cmd::XskRecv {
            dev,
            count,
            timeout_ms,
            xdp_mode,
            no_multi_buffer,
        } => xsk_recv(&dev, count, timeout_ms, xdp_mode, !no_multi_buffer),
        Cmd::Stats => {
            let v = call(&cli.iface, &Request::Stats)?;
            if json {
                println!("{v}");
            } else {
                println!(
                    "{} ({})",
                    v["iface"].as_str().unwrap_or("?"),
                    v["mode"].as_str().unwrap_or("?")
                );
                println!("XDP verdicts:");
                for (k, n) in v["xdp"].as_object().into_iter().flatten() {
                    println!("  {k:<22} {n}");
                }
                println!("data path:");
                for (k, n) in v["datapath"].as_object().into_iter().flatten() {
                    println!("  {k:<22} {n}");
                }
            }
            Ok(())
        }
        Cmd::Mr(m) => {
            let req = match m {
                MrCmd::Reg { len, access } => Request::MrReg { len, access },
                MrCmd::List => Request::MrList,
                MrCmd::Dereg { key } => Request::MrDereg { key },
                MrCmd::Read { key, offset, len } => Request::MrRead { key, offset, len },
                MrCmd::Write {
                    key,
                    offset,
                    data,
                    file,
                } => {
                    let data =
                        match (data, file) {
                            (Some(d), _) => {
                                unhex(&d)?;
                                d
                            }
                            (None, Some(f)) => hex(&std::fs::read(&f)
                                .with_context(|| format!("read {}", f.display()))?),
                            (None, None) => bail!("give --data HEX or --file PATH"),
                        };
                    Request::MrWrite { key, offset, data }
                }
            };
            let v = call(&cli.iface, &req)?;
            if json {
                println!("{v}");
                return Ok(());
            }
            match &req {
                Request::MrReg { .. } => println!(
                    "addr 0x{:x} len {} lkey 0x{:08x} rkey 0x{:08x} access {}",
                    v["addr"].as_u64().unwrap_or(0),
                    v["len"],
                    v["lkey"].as_u64().unwrap_or(0),
                    v["rkey"].as_u64().unwrap_or(0),
                    v["access"].as_str().unwrap_or("")
                ),
                Request::MrList => {
                    println!(
                        "{:<18} {:>10} {:>10} {:>10}  access",
                        "addr", "len", "lkey", "rkey"
                    );
                    for m in v["mrs"].as_array().into_iter().flatten() {
                        println!(
                            "0x{:<16x} {:>10} 0x{:08x} 0x{:08x}  {}",
                            m["addr"].as_u64().unwrap_or(0),
                            m["len"],
                            m["lkey"].as_u64().unwrap_or(0),
                            m["rkey"].as_u64().unwrap_or(0),
                            m["access"].as_str().unwrap_or("")
                        );
                    }
                }
                Request::MrRead { offset, .. } => {
                    let bytes = unhex(v["data"].as_str().unwrap_or(""))?;
                    hexdump(*offset, &bytes);
                }
                Request::MrDereg { .. } => println!(
                    "deregistered lkey 0x{:08x}",
                    v["lkey"].as_u64().unwrap_or(0)
                ),
                Request::MrWrite { .. } => println!("wrote {} bytes", v["written"]),
                _ => {}
            }
            Ok(())
        }
        Cmd::Qp(q) => {
            let req = match q {
                QpCmd::Create { depth } => Request::QpCreate { depth },
                QpCmd::List => Request::QpList,
                QpCmd::Destroy { qpn } => Request::QpDestroy {
                    qpn: num(&qpn)? as u32,
                },
                QpCmd::Connect {
                    qpn,
                    peer,
                    remote_qpn,
                    remote_ip,
                    remote_psn,
                    remote_mac,
                    psn,
                    mtu,
                } => {
                    let qpn = num(&qpn)? as u32;
                    let remote_qpn = num(&remote_qpn)? as u32;
                    match peer {
                        Some(peer) => Request::QpPeer {
                            qpn,
                            peer,
                            remote_qpn,
                            mtu: Some(mtu),
                        },
                        None => Request::QpConnect {
                            qpn,
                            remote_ip: remote_ip.ok_or_else(|| {
                                anyhow!("give --peer ADDR, or --remote-ip, --remote-qpn and --remote-psn")
                            })?,
                            remote_qpn,
                            remote_psn: num(remote_psn.as_deref().ok_or_else(|| anyhow!("--remote-psn is required with --remote-ip"))?)? as u32,
                            remote_mac,
                            psn: psn.as_deref().map(num).transpose()?.map(|p| p as u32),
                            mtu: Some(mtu),
                        },
                    }
                }
            };
            let v = call(&cli.iface, &req)?;
            if json {
                println!("{v}");
                return Ok(());
            }
            match &req {
                Request::QpCreate { .. } => {
                    println!("qpn 0x{:06x}", v["qpn"].as_u64().unwrap_or(0))
                }
                Request::QpList => {
                    println!(
                        "{:<8} {:<5} {:<8} {:<8} {:<8} {:>5} {:<16} counters",
                        "qpn", "state", "dest", "sq_psn", "rq_psn", "mtu", "peer"
                    );
                    for q in v["qps"].as_array().into_iter().flatten() {
                        println!(
                            "0x{:06x} {:<5} 0x{:06x} 0x{:06x} 0x{:06x} {:>5} {:<16} {}",
                            q["qpn"].as_u64().unwrap_or(0),
                            q["state"].as_str().unwrap_or(""),
                            q["dest_qpn"].as_u64().unwrap_or(0),
                            q["sq_psn"].as_u64().unwrap_or(0),
                            q["rq_psn"].as_u64().unwrap_or(0),
                            q["mtu"],
                            q["peer"].as_str().unwrap_or("-"),
                            q["stats"]
                        );
                    }
                }
                Request::QpDestroy { qpn } => println!("destroyed qpn 0x{qpn:06x}"),
                _ => println!(
                    "qpn 0x{:06x} connected to {} qpn 0x{:06x} (our psn 0x{:06x}, mtu {})",
                    v["qpn"].as_u64().unwrap_or(0),
                    v["peer_ip"].as_str().unwrap_or("?"),
                    v["remote_qpn"].as_u64().unwrap_or(0),
                    v["psn"].as_u64().unwrap_or(0),
                    v["mtu"]
                ),
            }
            Ok(())
        }
        Cmd::Post(p) => {
            let req = Request::Post(Post {
                op: p.op.clone(),
                qpn: num(&p.qp)? as u32,
                key: p.key,
                offset: p.offset,
                len: p.len,
                data: p.data,
                remote_addr: p.remote_addr.as_deref().map(num).transpose()?,
                rkey: p.rkey,
                imm: p.imm.as_deref().map(num).transpose()?.map(|v| v as u32),
                compare: p.compare.as_deref().map(num).transpose()?,
                swap: p.swap.as_deref().map(num).transpose()?,
                add: p.add.as_deref().map(num).transpose()?,
                timeout_ms: Some(p.timeout_ms),
                no_wait: false,
            });
            let v = call(&cli.iface, &req)?;
            if json {
                println!("{v}");
            } else if p.op == "recv" {
                println!("posted recv wr_id {}", v["wr_id"]);
            } else {
                let wc = &v["wc"];
                print!(
                    "wr_id {} {} {} byte_len {}",
                    wc["wr_id"],
                    wc["opcode"].as_str().unwrap_or(""),
                    wc["status"].as_str().unwrap_or(""),
                    wc["byte_len"]
                );
                if let Some(o) = v["original"].as_u64() {
                    print!(" original 0x{o:x} ({o})");
                }
                println!();
            }
            let status = v["wc"]["status"].as_str().unwrap_or("success");
            if status != "success" {
                bail!("work request failed: {status}");
            }
            Ok(())
        }
        Cmd::Cq {
            cmd: CqCmd::Poll { qp, max, wait_ms },
        } => {
            let v = call(
                &cli.iface,
                &Request::CqPoll {
                    qpn: num(&qp)? as u32,
                    max: Some(max),
                    wait_ms: Some(wait_ms),
                },
            )?;
            if json {
                println!("{v}");
            } else {
                for wc in v["wcs"].as_array().into_iter().flatten() {
                    println!(
                        "wr_id {} {} {} byte_len {}{}",
                        wc["wr_id"],
                        wc["opcode"].as_str().unwrap_or(""),
                        wc["status"].as_str().unwrap_or(""),
                        wc["byte_len"],
                        wc["imm"]
                            .as_u64()
                            .map(|i| format!(" imm 0x{i:x}"))
                            .unwrap_or_default()
                    );
                }
            }
            Ok(())
        }
    }
}

fn find_socket(iface: &Option<String>) -> Result<PathBuf> {
    if let Some(i) = iface {
        return Ok(daemon::socket_path(i));
    }
    let dir = rdma_user::io::hostnet::run_dir();
    let socks: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "sock"))
                .collect()
        })
        .unwrap_or_default();
    match socks.len() {
        0 => bail!(
            "no daemon is running in this network namespace; start one with `rdma up --dev IF`"
        ),
        1 => Ok(socks[0].clone()),
        _ => bail!(
            "several daemons run here ({}); say which with --iface IF",
            socks
                .iter()
                .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().to_string()))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// One request to the daemon; errors come back as one clear line.
fn call(iface: &Option<String>, req: &Request) -> Result<Value> {
    let path = find_socket(iface)?;
    let mut s = UnixStream::connect(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => anyhow!(
            "no daemon on {} ({}); start one with `rdma up --dev IF`",
            iface.as_deref().unwrap_or("this interface"),
            path.display()
        ),
        std::io::ErrorKind::PermissionDenied => {
            anyhow!(
                "permission denied on {}: only root may use the daemon",
                path.display()
            )
        }
        _ => anyhow!("connect {}: {e}", path.display()),
    })?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    writeln!(s, "{}", serde_json::to_string(req)?)?;
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line)?;
    let v: Value = serde_json::from_str(&line).context("bad reply from the daemon")?;
    if v["ok"] != Value::Bool(true) {
        bail!("{}", v["error"].as_str().unwrap_or("daemon error"));
    }
    Ok(v)
}

fn hexdump(base: u64, b: &[u8]) {
    for (i, chunk) in b.chunks(16).enumerate() {
        let hexs: Vec<String> = chunk.iter().map(|x| format!("{x:02x}")).collect();
        let ascii: String = chunk
            .iter()
            .map(|&c| {
                if (0x20..0x7f).contains(&c) {
                    c as char
                } else {
                    '.'
                }
            })
            .collect();
        println!(
            "{:08x}  {:<47}  |{}|",
            base + (i * 16) as u64,
            hexs.join(" "),
            ascii
        );
    }
}

fn decode(file: &std::path::Path) -> Result<()> {
    let frames = rdma_user::wire::pcap::read_pcap(file)?;
    let t0 = frames.first().map(|f| f.ts).unwrap_or(0.0);
    for f in &frames {
        let Ok((r, l)) = RoceRepr::parse_unchecked_icrc(&f.data) else {
            continue;
        };
        let icrc_ok = icrc(&f.data[l.l3..l.end - ICRC_LEN])
            .map(|c| c == l.icrc)
            .unwrap_or(false);
        let (src, dst) = match r.ip {
            IpRepr::V4(ip) => (
                std::net::Ipv4Addr::from(ip.src).to_string(),
                std::net::Ipv4Addr::from(ip.dst).to_string(),
            ),
            IpRepr::V6(ip) => (
                std::net::Ipv6Addr::from(ip.src).to_string(),
                std::net::Ipv6Addr::from(ip.dst).to_string(),
            ),
        };
        let t = r.transport;
        let mut line = format!(
            "{:10.6} {} > {} {}(0x{:02x}) DQP=0x{:06x} PSN=0x{:06x} A={}",
            f.ts - t0,
            src,
            dst,
            opcode_name(t.bth.opcode),
            t.bth.opcode,
            t.bth.dest_qpn,
            t.bth.psn,
            t.bth.ack_req as u8
        );
        if let Some(x) = t.reth {
            line += &format!(
                " RETH[VA=0x{:x} R_Key=0x{:x} DMALen={}]",
                x.va, x.rkey, x.dma_len
            );
        }
        if let Some(x) = t.atomic_eth {
            line += &format!(
                " AtomicETH[VA=0x{:x} R_Key=0x{:x} SwapAdd=0x{:x} Cmp=0x{:x}]",
                x.va, x.rkey, x.swap_add, x.compare
            );
        }
        if let Some(x) = t.deth {
            line += &format!(" DETH[Q_Key=0x{:x} SrcQP=0x{:06x}]", x.qkey, x.src_qpn);
        }
        if let Some(x) = t.aeth {
            line += &format!(
                " AETH[syndrome=0x{:02x} {} MSN={}]",
                x.syndrome,
                Syndrome::decode(x.syndrome),
                x.msn
            );
        }
        if let Some(x) = t.atomic_ack {
            line += &format!(" AtomicAckETH[orig=0x{x:x}]");
        }
        if let Some(x) = t.imm {
            line += &format!(" ImmDt=0x{x:08x}");
        }
        if let Some(x) = t.ieth {
            line += &format!(" IETH[R_Key=0x{x:x}]");
        }
        line += &format!(
            " payload={} ICRC={}",
            l.payload.len(),
            if icrc_ok { "ok" } else { "BAD" }
        );
        println!("{line}");
    }
    Ok(())
}

fn soak(a: SoakArgs, json_file: Option<PathBuf>) -> Result<()> {
    let o = rdma_user::tools::soak::Options {
        iface: a.dev,
        server: a.server,
        port: a.port,
        ops: a.ops,
        seed: a.seed,
        tx_depth: a.tx_depth,
        mtu: a.mtu,
        ack_timeout: a.ack_timeout,
        adaptive: !a.spin,
        cpu: a.cpu,
        connect_timeout: Duration::from_secs(a.peer_timeout),
        stall_timeout: Duration::from_secs(a.stall_timeout),
        progress: true,
    };
    let (out, clean) = if o.server.is_some() {
        let r = rdma_user::tools::soak::run(&o)?;
        eprintln!(
            "soak: {} of {} operations in {:.2} s, {:.3} Gb/s goodput, {:.0} ops/s; lost {}, duplicated {}, corrupted {}, error WCs {}; {} retransmits, {} timeouts",
            r.completed, r.ops, r.seconds, r.goodput_gbps, r.ops_per_sec, r.lost, r.duplicated, r.corrupted, r.error_wcs, r.retransmits, r.timeouts
        );
        if let Some(e) = &r.first_error {
            eprintln!("soak: first error: {e}");
        }
        (serde_json::to_string_pretty(&r)?, r.clean())
    } else {
        let r = rdma_user::tools::soak::serve(&o)?;
        (serde_json::to_string_pretty(&r)?, r.clean())
    };
    if let Some(f) = json_file {
        std::fs::write(&f, &out).with_context(|| format!("write {}", f.display()))?;
    }
    println!("{out}");
    if !clean {
        bail!("the soak found lost, duplicated or corrupted operations (see above)");
    }
    Ok(())
}

/// Sends `count` hostile frames as fast as the socket takes them; prints
/// how many of each class went out.
fn hostile(h: HostileArgs) -> Result<()> {
    use rdma_user::tools::hostile::{Generator, Target, CLASSES};
    let sock = rdma_user::io::packet::RawSocket::bind(&h.dev, false)?;
    let path = rdma_user::device::datapath::Path {
        local_mac: rdma_user::io::hostnet::iface_mac(&h.dev)?,
        peer_mac: h.dst_mac,
        local_ip: h.src_ip,
        peer_ip: h.dst_ip,
        vlan: None,
    };
    let mut g = Generator::new(
        Target {
            net: path.template(h.peer_qpn, h.qpn)?,
            qpn: h.qpn,
            epsn: h.epsn,
            rkey: h.rkey,
            va: h.va,
            mr_len: h.mr_len,
            unknown_qpn: 0x00ab_cdef,
            mtu: h.mtu,
        },
        h.seed,
    );
    let mut sent = std::collections::HashMap::new();
    let mut buf = vec![0u8; 9216];
    let start = Instant::now();
    for _ in 0..h.count {
        let (c, n) = g.next(&mut buf);
        sock.send(&buf[..n]).context("send")?;
        *sent.entry(c).or_insert(0u64) += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    let by_class: serde_json::Map<String, Value> = CLASSES
        .iter()
        .map(|c| {
            (
                serde_json::to_value(c)
                    .unwrap()
                    .as_str()
                    .unwrap()
                    .to_string(),
                Value::from(*sent.get(c).unwrap_or(&0)),
            )
        })
        .collect();
    println!(
        "{}",
        serde_json::json!({"sent": h.count, "seconds": secs, "pps": h.count as f64 / secs, "by_class": by_class})
    );
    Ok(())
}

/// Sends raw Ethernet frames through an AF_PACKET socket.
fn inject(dev: &str, frames: &[String]) -> Result<()> {
    let sock = rdma_user::io::packet::RawSocket::bind(dev, false)?;
    for h in frames {
        let f = unhex(h)?;
        sock.send(&f)
            .with_context(|| format!("send {} bytes on {dev}", f.len()))?;
    }
    Ok(())
}

/// Attaches the classifier and one AF_XDP socket, prints each received frame
/// as hex, then the XDP counters as JSON.
fn xsk_recv(
    dev: &str,
    count: usize,
    timeout_ms: u64,
    mode: XdpMode,
    multi_buffer: bool,
) -> Result<()> {
    let mut prog = rdma_user::io::xdp::XdpProgram::attach(dev, mode)?;
    let mut x = rdma_user::io::xsk::Xsk::open(
        dev,
        0,
        rdma_user::io::xsk::XskConfig {
            multi_buffer,
            frames: 1024,
            ring_size: 512,
            ..Default::default()
        },
    )?;
    prog.set_socket(0, x.fd())?;
    println!("ready");
    std::io::stdout().flush()?;
    let start = Instant::now();
    let mut got = 0;
    while got < count && start.elapsed() < Duration::from_millis(timeout_ms) {
        let n = x.recv(16, |f| println!("frame {}", hex(f)));
        got += n as usize;
        if n == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
        std::io::stdout().flush()?;
    }
    let s = prog.stats()?;
    let names = rdma_user::io::xdp::stat_names();
    let m: serde_json::Map<String, Value> = s
        .iter()
        .enumerate()
        .map(|(i, v)| (names[i].to_string(), Value::from(*v)))
        .collect();
    println!("stats {}", Value::Object(m));
    Ok(())
}

/// Two verbs contexts in one process, one per interface: WRITE, READ,
/// SEND/RECV, FETCH_ADD, then a WRITE to a read-only MR. Every result is
/// checked; any mismatch is an error.
fn verbs_demo(a: &str, b: &str) -> Result<()> {
    use rdma_user::device::datapath::{Connect, Path};
    use rdma_user::device::standalone::NO_WC;
    use rdma_user::memory::Access;
    use rdma_user::transport::{
        QpAttr, QpCap, RecvWr, SendWr, Sge, Wc, WcOpcode, WcStatus, WrOpcode,
    };
    use rdma_user::verbs::{Context, ContextOptions, Cq, Polling};

    fn wait(cq: &Cq, want: WcOpcode) -> Result<Wc> {
        let start = Instant::now();
        let mut wcs = [NO_WC; 16];
        loop {
            let n = cq.poll(&mut wcs)?;
            if let Some(w) = wcs[..n]
                .iter()
                .find(|w| w.opcode == want || w.status != WcStatus::Success)
            {
                return Ok(*w);
            }
            if start.elapsed() > Duration::from_secs(5) {
                bail!("no {want:?} completion within 5 s");
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    fn addr(iface: &str) -> Result<std::net::IpAddr> {
        rdma_user::io::hostnet::iface_addrs(iface)?
            .into_iter()
            .find(|a| a.is_ipv4())
            .ok_or_else(|| anyhow!("{iface} has no IPv4 address"))
    }

    let opts = ContextOptions {
        polling: Polling::Adaptive,
        cpu: None,
    };
    let (ca, cb) = (Context::open(a, opts.clone())?, Context::open(b, opts)?);
    let (pa, pb) = (ca.alloc_pd()?, cb.alloc_pd()?);
    let (cqa, cqb) = (ca.create_cq(64)?, cb.create_cq(64)?);
    let ma = pa.reg_mr(8192, Access::ALL)?;
    let mb = pb.reg_mr(8192, Access::ALL)?;
    let ro = pb.reg_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_READ)?;
    println!(
        "MRs: A addr 0x{:x} lkey 0x{:08x} rkey 0x{:08x}; B rkey 0x{:08x}; read-only rkey 0x{:08x}",
        ma.addr, ma.lkey, ma.rkey, mb.rkey, ro.rkey
    );
    let cap = QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
    };
    let (qa, qb) = (pa.create_qp(&cqa, cap)?, pb.create_qp(&cqb, cap)?);
    qa.modify(&QpAttr::init(Access::ALL))?;
    qb.modify(&QpAttr::init(Access::ALL))?;
    let (ip_a, ip_b) = (addr(a)?, addr(b)?);
    let path = |local_mac, peer_mac, local_ip, peer_ip| Path {
        local_mac,
        peer_mac,
        local_ip,
        peer_ip,
        vlan: None,
    };
    let (psn_a, psn_b) = (0x1234, 0xabcdef);
    qa.connect(
        path(ca.mac(), cb.mac(), ip_a, ip_b),
        &Connect::new(qb.qpn, psn_b, psn_a, 1024),
    )?;
    qb.connect(
        path(cb.mac(), ca.mac(), ip_b, ip_a),
        &Connect::new(qa.qpn, psn_a, psn_b, 1024),
    )?;

    // One-sided operations from A: post, then wait for the completion.
    let one_sided = |id: u64, op: WrOpcode, local: Sge, remote_addr: u64, rkey: u32, add: u64| {
        let sg = [local];
        let mut wr = SendWr::new(id, op, &sg);
        wr.remote_addr = remote_addr;
        wr.rkey = rkey;
        wr.compare_add = add;
        qa.post_send(&wr)?;
        let want = match op {
            WrOpcode::RdmaRead => WcOpcode::RdmaRead,
            WrOpcode::FetchAdd => WcOpcode::FetchAdd,
            _ => WcOpcode::RdmaWrite,
        };
        wait(&cqa, want)
    };

    // WRITE: 3000 bytes (3 packets) from A into B.
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 3) as u8).collect();
    ma.write(0, &data)?;
    let w = one_sided(1, WrOpcode::RdmaWrite, ma.sge(0, 3000), mb.addr, mb.rkey, 0)?;
    if w.status != WcStatus::Success || mb.read(0, 3000)? != data {
        bail!("WRITE: {:?}, or B's MR does not hold the bytes", w.status);
    }
    println!("WRITE 3000 B: ok");

    // READ it back into A at 4096.
    let w = one_sided(
        2,
        WrOpcode::RdmaRead,
        ma.sge(4096, 3000),
        mb.addr,
        mb.rkey,
        0,
    )?;
    if w.status != WcStatus::Success || ma.read(4096, 3000)? != data {
        bail!("READ: {:?}, or the bytes differ", w.status);
    }
    println!("READ 3000 B: ok");

    // SEND/RECV.
    let rsg = [mb.sge(4096, 256)];
    qb.post_recv(&RecvWr {
        wr_id: 7,
        sg_list: &rsg,
    })?;
    let msg = b"a message through the verbs API";
    ma.write(0, msg)?;
    let sg = [ma.sge(0, msg.len() as u32)];
    qa.post_send(&SendWr::new(3, WrOpcode::Send, &sg))?;
    let s = wait(&cqa, WcOpcode::Send)?;
    let r = wait(&cqb, WcOpcode::Recv)?;
    if s.status != WcStatus::Success
        || r.status != WcStatus::Success
        || r.wr_id != 7
        || r.byte_len as usize != msg.len()
        || mb.read(4096, msg.len())? != msg
    {
        bail!("SEND/RECV: send {:?}, recv {:?}", s.status, r);
    }
    println!("SEND/RECV {} B: ok", msg.len());

    // FETCH_ADD on a counter in B; the old value lands in A.
    mb.write(8000, &41u64.to_le_bytes())?;
    let w = one_sided(
        4,
        WrOpcode::FetchAdd,
        ma.sge(8000, 8),
        mb.addr + 8000,
        mb.rkey,
        1,
    )?;
    let old = u64::from_le_bytes(ma.read(8000, 8)?.try_into().unwrap());
    let now = u64::from_le_bytes(mb.read(8000, 8)?.try_into().unwrap());
    if w.status != WcStatus::Success || old != 41 || now != 42 {
        bail!("FETCH_ADD: {:?}, returned {old}, counter {now}", w.status);
    }
    println!("FETCH_ADD: returned 41, counter now 42: ok");

    // A WRITE to a read-only MR: remote access error, MR untouched, QP in ERR.
    let before = ro.read(0, 4096)?;
    let w = one_sided(5, WrOpcode::RdmaWrite, ma.sge(0, 64), ro.addr, ro.rkey, 0)?;
    if w.status != WcStatus::RemAccessErr || ro.read(0, 4096)? != before {
        bail!(
            "WRITE to a read-only MR: {:?} (want RemAccessErr), or the MR changed",
            w.status
        );
    }
    println!(
        "WRITE to read-only MR: REM_ACCESS_ERR, MR untouched, QP {:?}: ok",
        qa.state()?
    );
    Ok(())
}
