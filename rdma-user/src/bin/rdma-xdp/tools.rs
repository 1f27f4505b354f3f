//! The perftest-style tools and the reliability tools: `bench`, `baseline`,
//! `pingpong`, `relay` and `soak`. They drive an in-process data path, no
//! daemon.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;

use crate::Global;

#[derive(Args)]
pub struct BenchArgs {
    #[arg(value_enum)]
    pub test: rdma_user::tools::bench::Test,
    /// Server address (client mode); none = server mode.
    pub server: Option<std::net::IpAddr>,
    #[arg(long = "dev", short = 'd')]
    pub dev: String,
    /// Message size in bytes.
    #[arg(short = 's', long, default_value_t = 2)]
    pub size: usize,
    /// All sizes from 2 to 2^23.
    #[arg(short = 'a', long)]
    pub all: bool,
    #[arg(short = 'n', long, default_value_t = 1000)]
    pub iters: u64,
    /// Run for this many seconds (bandwidth tests).
    #[arg(short = 'D', long)]
    pub duration: Option<f64>,
    /// Queue pairs (bandwidth tests; `-n` messages on each).
    #[arg(short = 'q', long, default_value_t = 1)]
    pub qps: u32,
    #[arg(short = 't', long, default_value_t = 128)]
    pub tx_depth: u32,
    #[arg(short = 'm', long, default_value_t = 1024)]
    pub mtu: u32,
    #[arg(short = 'p', long, default_value_t = 18515)]
    pub port: u16,
    /// Pin to this CPU (default: the client CPU 0, the server the last
    /// CPU, so two sides on one machine do not share a core).
    #[arg(long)]
    pub cpu: Option<usize>,
    /// Seconds to wait for the peer.
    #[arg(long, default_value_t = 10)]
    pub peer_timeout: u64,
    /// Use this local address as our GID (IPv4 or IPv6; perftest's peer
    /// must use the same family, e.g. `-x 2` for fd99:: in the rxe VM).
    #[arg(long)]
    pub local_ip: Option<std::net::IpAddr>,
    /// While it only waits for its peer (a bandwidth test's target, the
    /// exchanges), sleep in poll(2) on the sockets instead of spinning, as
    /// perftest's server sleeps in read(): its CPU time is then the work.
    #[arg(long)]
    pub adaptive: bool,
    /// Register the buffer in the MR pool, so that the XDP responder
    /// places and ACKs the peer's WRITEs (`path: "xdp"` in the records).
    #[arg(long)]
    pub pool: bool,
    /// Benchmark only: the XDP responder skips the received ICRC check,
    /// to measure the check's share of its cost.
    #[arg(long, hide = true)]
    pub no_icrc_check: bool,
}
#[derive(Args)]
pub struct BaselineArgs {
    #[arg(value_enum)]
    pub kind: Option<rdma_user::tools::baseline::Kind>,
    pub server: Option<std::net::IpAddr>,
    #[arg(long = "dev", short = 'd', default_value = "")]
    pub dev: String,
    #[arg(short = 's', long, default_value_t = 64)]
    pub size: usize,
    #[arg(short = 'n', long, default_value_t = 10000)]
    pub iters: u64,
    #[arg(long)]
    pub cpu: Option<usize>,
    /// AF_XDP stream client: copy frames into TX chunks, or chain
    /// descriptors that point at payload already in the UMEM.
    #[arg(long, value_enum, default_value_t)]
    pub tx: rdma_user::tools::baseline::TxMode,
    /// Run the engine microbenchmark instead (WRITEs of 64 B).
    #[arg(long)]
    pub engine: bool,
}

#[derive(Args)]
pub struct PingpongArgs {
    pub server: Option<std::net::IpAddr>,
    #[arg(long = "dev", short = 'd')]
    pub dev: String,
    #[arg(short = 'p', long, default_value_t = 18515)]
    pub port: u16,
    #[arg(short = 's', long, default_value_t = 4096)]
    pub size: usize,
    #[arg(short = 'n', long, default_value_t = 1000)]
    pub iters: u64,
    #[arg(short = 'm', long, default_value_t = 1024)]
    pub mtu: u32,
    #[arg(short = 'r', long, default_value_t = 500)]
    pub rx_depth: u32,
    /// Validate received buffers (rc_pingpong -c).
    #[arg(short = 'c', long)]
    pub chk: bool,
    /// Use this local address as our GID (IPv4 or IPv6).
    #[arg(long)]
    pub local_ip: Option<std::net::IpAddr>,
}

#[derive(Args)]
pub struct RelayArgs {
    /// Side A interface. Given more than once, the relay is a switch: every
    /// A port shares the bottleneck towards B.
    #[arg(long, required = true)]
    pub a: Vec<String>,
    /// Side B interface.
    #[arg(long)]
    pub b: String,
    /// Loss probability per frame (0.05 = 5 %).
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Probability that a frame is held back behind later ones.
    #[arg(long, default_value_t = 0.0)]
    pub reorder: f64,
    /// Frames a reordered frame is held behind.
    #[arg(long, default_value_t = 3)]
    pub reorder_gap: u32,
    /// Duplication probability.
    #[arg(long, default_value_t = 0.0)]
    pub dup: f64,
    /// Probability of one flipped bit in the RoCE part of the frame.
    #[arg(long, default_value_t = 0.0)]
    pub corrupt: f64,
    /// Probability of a CE mark (ECN congestion experienced) in the IP header.
    #[arg(long, default_value_t = 0.0)]
    pub ce: f64,
    /// A bottleneck of this many Mbit/s per direction (0: none): RoCE
    /// frames queue behind it, are CE-marked as the queue passes
    /// --kmin-bytes (probability up to --pmax at --kmax-bytes, all beyond)
    /// and dropped beyond --queue-bytes.
    #[arg(long, default_value_t = 0.0)]
    pub rate_mbit: f64,
    #[arg(long, default_value_t = 256 * 1024)]
    pub queue_bytes: u64,
    #[arg(long, default_value_t = 20 * 1024)]
    pub kmin_bytes: u64,
    #[arg(long, default_value_t = 200 * 1024)]
    pub kmax_bytes: u64,
    #[arg(long, default_value_t = 0.2)]
    pub pmax: f64,
    /// Decide the bottleneck's marks as frames leave its queue (by the
    /// depth behind them), not as they enter.
    #[arg(long)]
    pub mark_on_dequeue: bool,
    /// The line rate of the links into the A ports, Mbit/s (0: none): a
    /// frame enters the bottleneck's queue when a link of this rate would
    /// have delivered it, not in the burst its host wrote.
    #[arg(long, default_value_t = 0.0)]
    pub ingress_mbit: f64,
    /// Lossless Ethernet (PFC): instead of dropping, pause the A ports
    /// while the bottleneck's queue holds this many bytes (0: off, frames
    /// beyond --queue-bytes are dropped). At most --queue-bytes.
    #[arg(long, default_value_t = 0)]
    pub pfc_xoff_bytes: u64,
    /// Added one-way delay, microseconds.
    #[arg(long, default_value_t = 0)]
    pub delay_us: u64,
    /// Random extra delay up to this many microseconds (reorders too).
    #[arg(long, default_value_t = 0)]
    pub jitter_us: u64,
    /// More delay for CM MADs (RoCEv2 to QP 1) only, microseconds: a
    /// slower management path, so a MAD falls behind data sent before it.
    #[arg(long, default_value_t = 0)]
    pub mad_delay_us: u64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Impair every frame, not only RoCEv2 (UDP 4791).
    #[arg(long)]
    pub all_traffic: bool,
    /// Stop after this many seconds.
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Write the final counters as JSON here.
    #[arg(long)]
    pub stats_file: Option<PathBuf>,
    /// Write what crossed the bottleneck per A port and time bin (bytes, CE
    /// marks, drops, CNPs back, queue depth) as JSON here.
    #[arg(long)]
    pub timeline: Option<PathBuf>,
    /// The timeline's bin, milliseconds.
    #[arg(long, default_value_t = 10.0)]
    pub bin_ms: f64,
}
#[derive(Args)]
pub struct SoakArgs {
    pub server: Option<std::net::IpAddr>,
    #[arg(long = "dev", short = 'd')]
    pub dev: String,
    #[arg(short = 'p', long, default_value_t = 18517)]
    pub port: u16,
    /// Operations to run (client).
    #[arg(short = 'n', long, default_value_t = 100_000)]
    pub ops: u64,
    /// Seed of the operation mix and the data (client and server must agree).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Outstanding work requests.
    #[arg(short = 't', long, default_value_t = 16)]
    pub tx_depth: u32,
    #[arg(short = 'm', long, default_value_t = 1024)]
    pub mtu: u32,
    /// Local ACK timeout exponent (4.096 us * 2^N).
    #[arg(long, default_value_t = 12)]
    pub ack_timeout: u8,
    #[command(flatten)]
    pub run: RunArgs,
    /// Fail when no operation completes for this many seconds.
    #[arg(long, default_value_t = 30)]
    pub stall_timeout: u64,
    /// Turn DCQCN's reaction point off (CNPs are counted and ignored).
    #[arg(long)]
    pub no_dcqcn: bool,
    /// Do not offer selective repeat to the peer: the QP recovers by
    /// go-back-N (selective repeat needs both sides to offer it).
    #[arg(long)]
    pub no_selective_repeat: bool,
    /// Register the MR in the MR pool: the XDP responder places in-order
    /// WRITEs to it (under either recovery).
    #[arg(long)]
    pub pool: bool,
    /// The operations the client mixes: any of write, read, send,
    /// fetch-add, cmp-swap, comma-separated (the others keep their shares).
    #[arg(long, default_value = "all", value_parser = rdma_user::tools::soak::parse_kinds)]
    pub kinds: u8,
}

#[derive(Args)]
pub struct FlowArgs {
    /// The server's address (client mode); without it, serve any number of
    /// clients until SIGINT/SIGTERM (or --seconds).
    pub server: Option<std::net::IpAddr>,
    #[arg(long = "dev", short = 'd')]
    pub dev: String,
    #[arg(short = 'p', long, default_value_t = 18600)]
    pub port: u16,
    /// Bytes per RDMA WRITE.
    #[arg(short = 's', long, default_value_t = 65536)]
    pub size: usize,
    /// WRITEs outstanding.
    #[arg(short = 't', long, default_value_t = 16)]
    pub tx_depth: u32,
    /// The path MTU (RoCE's 256..4096; the interface's must hold it).
    #[arg(short = 'm', long, default_value_t = 1024)]
    pub mtu: u32,
    /// Start sending at this Unix time, in milliseconds (default: at once).
    #[arg(long)]
    pub start_at: Option<u64>,
    /// Client: seconds of traffic. Server: seconds to serve (0: until a
    /// signal).
    #[arg(long, default_value_t = 0.0)]
    pub seconds: f64,
    /// The client's time bins, milliseconds.
    #[arg(long, default_value_t = 10.0)]
    pub bin_ms: f64,
    #[command(flatten)]
    pub cc: crate::control::CcArgs,
    #[command(flatten)]
    pub run: RunArgs,
}

/// How a tool's data path runs and how long it waits for its peer.
#[derive(Args)]
pub struct RunArgs {
    /// Busy-poll instead of sleeping when idle.
    #[arg(long)]
    pub spin: bool,
    #[arg(long)]
    pub cpu: Option<usize>,
    /// Seconds to wait for the peer.
    #[arg(long, default_value_t = 10)]
    pub peer_timeout: u64,
}

pub fn flow(a: FlowArgs, json_file: Option<PathBuf>) -> Result<()> {
    let cc = a.cc.config()?;
    let o = rdma_user::tools::flow::Options {
        iface: a.dev,
        server: a.server,
        port: a.port,
        size: a.size,
        depth: a.tx_depth.max(1),
        mtu: a.mtu,
        start_at: a.start_at,
        seconds: a.seconds,
        bin_ms: a.bin_ms,
        cc,
        cpu: a.run.cpu,
        adaptive: !a.run.spin,
        connect_timeout: Duration::from_secs(a.run.peer_timeout),
    };
    let out =
        if o.server.is_some() {
            let r = rdma_user::tools::flow::run(&o)?;
            eprintln!(
            "flow: {:.1} Mbit/s goodput over {:.2} s; {} CNPs handled, {} retransmits, {} timeouts",
            r.goodput_mbps, r.seconds, r.stats.rp_cnp_handled, r.stats.retransmits, r.stats.timeouts
        );
            serde_json::to_string(&r)?
        } else {
            serde_json::to_string_pretty(&rdma_user::tools::flow::serve(&o)?)?
        };
    match json_file {
        Some(f) => std::fs::write(&f, &out).with_context(|| format!("write {}", f.display()))?,
        None => println!("{out}"),
    }
    Ok(())
}

pub fn bench(b: BenchArgs, g: &Global) -> Result<()> {
    let json_file = g.json_file.clone();
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
        adaptive: b.adaptive,
        pool: b.pool,
        no_icrc_check: b.no_icrc_check,
    })?;
    if let Some(f) = json_file {
        std::fs::write(&f, serde_json::to_string_pretty(&recs)?)
            .with_context(|| format!("write {}", f.display()))?;
    }
    Ok(())
}

pub fn baseline(a: BaselineArgs, g: &Global) -> Result<()> {
    let json_file = g.json_file.clone();
    let BaselineArgs {
        kind,
        server,
        dev,
        size,
        iters,
        cpu,
        tx,
        engine,
    } = a;
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
        let kind =
            kind.ok_or_else(|| anyhow!("which baseline? (afxdp-pingpong, udp-stream, ...)"))?;
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

pub fn pingpong(a: PingpongArgs) -> Result<()> {
    rdma_user::tools::pingpong::run(rdma_user::tools::pingpong::Options {
        iface: a.dev,
        server: a.server,
        port: a.port,
        size: a.size,
        iters: a.iters,
        mtu: a.mtu,
        rx_depth: a.rx_depth,
        validate: a.chk,
        local_ip: a.local_ip,
    })
}

/// `rdma-xdp xdp-pass IFACE...`: holds a pass-through XDP program on each
/// until SIGINT/SIGTERM.
pub fn xdp_pass(ifaces: &[String]) -> Result<()> {
    let mut held = Vec::new();
    for i in ifaces {
        held.push(rdma_user::io::xdp::XdpPass::attach(i)?);
    }
    rdma_user::tools::wait_for_stop_signal();
    eprintln!("xdp-pass: detached from {}", ifaces.join(", "));
    Ok(())
}

pub fn relay(r: RelayArgs, g: &Global) -> Result<()> {
    let json = g.json;
    let cfg = rdma_user::tools::impair::ImpairConfig {
        loss: r.loss,
        reorder: r.reorder,
        dup: r.dup,
        corrupt: r.corrupt,
        ce: r.ce,
        rate_mbit: r.rate_mbit,
        queue_bytes: r.queue_bytes,
        kmin_bytes: r.kmin_bytes,
        kmax_bytes: r.kmax_bytes,
        pmax: r.pmax,
        mark_on_dequeue: r.mark_on_dequeue,
        ingress_mbit: r.ingress_mbit,
        pfc_xoff_bytes: r.pfc_xoff_bytes,
        delay_us: r.delay_us,
        jitter_us: r.jitter_us,
        mad_delay_us: r.mad_delay_us,
        reorder_gap: r.reorder_gap,
        seed: r.seed,
        roce_only: !r.all_traffic,
        ..Default::default()
    };
    cfg.validate().map_err(|e| anyhow!(e))?;
    if !(r.bin_ms > 0.0 && r.bin_ms.is_finite()) {
        bail!(
            "--bin-ms {}: give a positive number of milliseconds",
            r.bin_ms
        );
    }
    eprintln!("relay {} <-> {}: {}", r.a.join(","), r.b, cfg.describe());
    let (rep, timeline) = rdma_user::tools::relay::run(
        rdma_user::tools::relay::RelayOptions {
            a: &r.a,
            b: &r.b,
            max: r.seconds.map(Duration::from_secs_f64),
            progress: !json,
            timeline_bin: r
                .timeline
                .is_some()
                .then(|| Duration::from_secs_f64(r.bin_ms / 1e3)),
        },
        cfg,
    )?;
    if let (Some(f), Some(t)) = (&r.timeline, &timeline) {
        std::fs::write(f, serde_json::to_vec(t)?)
            .with_context(|| format!("write {}", f.display()))?;
    }
    let out = serde_json::to_string_pretty(&rep)?;
    if let Some(f) = r.stats_file {
        std::fs::write(&f, &out).with_context(|| format!("write {}", f.display()))?;
    }
    println!("{out}");
    Ok(())
}

pub fn soak(a: SoakArgs, json_file: Option<PathBuf>) -> Result<()> {
    let o = rdma_user::tools::soak::Options {
        iface: a.dev,
        server: a.server,
        port: a.port,
        ops: a.ops,
        seed: a.seed,
        tx_depth: a.tx_depth,
        mtu: a.mtu,
        ack_timeout: a.ack_timeout,
        adaptive: !a.run.spin,
        cpu: a.run.cpu,
        connect_timeout: Duration::from_secs(a.run.peer_timeout),
        stall_timeout: Duration::from_secs(a.stall_timeout),
        progress: true,
        dcqcn: !a.no_dcqcn,
        selective_repeat: !a.no_selective_repeat,
        pool: a.pool,
        kinds: a.kinds,
    };
    let (out, clean) = if o.server.is_some() {
        let r = rdma_user::tools::soak::run(&o)?;
        eprintln!(
            "soak ({}): {} of {} operations in {:.2} s, {:.3} Gb/s goodput, {:.0} ops/s; lost {}, duplicated {}, corrupted {}, error WCs {}; {} retransmits, {} timeouts",
            r.mode, r.completed, r.ops, r.seconds, r.goodput_gbps, r.ops_per_sec, r.lost, r.duplicated, r.corrupted, r.error_wcs, r.retransmits, r.timeouts
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
