//! The congestion test bed's flows. A client streams RDMA WRITEs to a server
//! over one RC QP for a set wall-clock interval and records, per time bin,
//! the bytes completed and its DCQCN state; one server takes any number of
//! clients, a QP each, and reports its notification points (CE marks seen,
//! CNPs sent) per client.
//!
//! Start times are wall-clock (Unix) instants, so flows in different
//! namespaces start when the test bed says, however long each took to come
//! up, and their bins line up with the relay's timeline.

use std::io::ErrorKind;
use std::net::{IpAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::device::datapath::{Backoff, CcConfig, Connect};
use crate::device::standalone::{Standalone, NO_WC};
use crate::io::hostnet;
use crate::memory::Access;
use crate::tools::soak::{exchange_hello, path_to, send_line, side_channel, Hello, LineReader};
use crate::transport::{QpAttr, QpCap, QpStats, SendWr, Sge, WcStatus, WrOpcode};

/// The server's WRITE target: every client writes its messages here.
pub const AREA: usize = 1 << 20;

#[derive(Debug, Clone)]
pub struct Options {
    pub iface: String,
    /// Client mode: the server's address.
    pub server: Option<IpAddr>,
    pub port: u16,
    /// Bytes per WRITE, and WRITEs outstanding.
    pub size: usize,
    pub depth: u32,
    pub mtu: u32,
    /// Client: when traffic starts (Unix time, ms); None: at once.
    pub start_at: Option<u64>,
    /// Client: how long traffic runs. Server: how long it serves (0: until
    /// SIGINT/SIGTERM).
    pub seconds: f64,
    pub bin_ms: f64,
    pub cc: CcConfig,
    pub cpu: Option<usize>,
    pub adaptive: bool,
    pub connect_timeout: Duration,
}

/// One time bin of a client.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct FlowBin {
    /// WRITE bytes completed in the bin.
    pub bytes: u64,
    /// DCQCN's current rate (Mbit/s) and α at the bin's last poll.
    pub rate_mbps: f64,
    pub alpha: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct FlowReport {
    pub qpn: u32,
    /// The wall-clock time (Unix, ns) of the start of bin 0.
    pub start_unix_ns: u64,
    pub bin_ms: f64,
    pub size: usize,
    pub depth: u32,
    pub dcqcn: bool,
    pub bytes: u64,
    pub seconds: f64,
    pub goodput_mbps: f64,
    pub bins: Vec<FlowBin>,
    pub stats: QpStats,
}

/// A client's QP as the server saw it.
#[derive(Debug, Clone, Serialize)]
pub struct ServedQp {
    pub peer: IpAddr,
    pub qpn: u32,
    pub stats: QpStats,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ServerReport {
    pub qps: Vec<ServedQp>,
    pub np_ecn_marked_roce_packets: u64,
    pub np_cnp_sent: u64,
    pub seconds: f64,
}

fn open(o: &Options) -> Result<Standalone> {
    if o.size == 0 || o.size > AREA {
        bail!("--size {}: a WRITE is 1 to {AREA} bytes", o.size);
    }
    if !(o.bin_ms > 0.0 && o.bin_ms.is_finite()) {
        bail!(
            "--bin-ms {}: give a positive number of milliseconds",
            o.bin_ms
        );
    }
    if let Some(c) = o.cpu {
        crate::device::runner::pin_to_cpu(c);
    }
    let mut dev = Standalone::open(&o.iface, crate::io::xdp::XdpMode::Auto, true)?;
    dev.dp.core.set_cc(o.cc, &o.iface);
    Ok(dev)
}

/// Connects `qpn` to the peer of `hello` over the path towards it.
fn connect(dev: &mut Standalone, o: &Options, qpn: u32, psn: u32, peer: &Hello) -> Result<()> {
    let local_ip = hostnet::local_addr_for(&o.iface, peer.ip)?;
    let path = path_to(dev, local_ip, peer.ip)?;
    dev.dp.core.modify_qp(qpn, &QpAttr::init(Access::ALL))?;
    dev.dp
        .core
        .connect_qp(qpn, path, &Connect::new(peer.qpn, peer.psn, psn, o.mtu))?;
    Ok(())
}

/// Client: connect, wait for the start time, stream WRITEs for
/// `o.seconds`, then let the outstanding ones complete.
pub fn run(o: &Options) -> Result<FlowReport> {
    let mut dev = open(o)?;
    let pd = dev.dp.core.alloc_pd();
    let (addr, lkey, _) = dev.dp.core.reg_mr(pd, o.size, Access::ALL)?;
    let cq = dev.dp.core.create_cq(o.depth as usize * 2 + 16)?;
    let qpn = dev.dp.core.create_qp(
        pd,
        cq,
        QpCap {
            max_send_wr: o.depth.max(1),
            max_recv_wr: 1,
        },
    )?;
    let psn = dev.dp.core.random_psn();
    let (mut tcp, ip) = side_channel(&o.iface, o.server, o.port, o.connect_timeout)?;
    let mut backoff = Backoff::new(o.adaptive);
    let mut lines = LineReader::default();
    let ours = Hello {
        qpn,
        psn,
        ip,
        rkey: 0,
        vaddr: 0,
        selective_repeat: None,
    };
    let peer = exchange_hello(
        &mut tcp,
        &mut lines,
        &mut dev,
        &mut backoff,
        &ours,
        o.connect_timeout,
    )?;
    // The server's QP was ready before it answered.
    connect(&mut dev, o, qpn, psn, &peer)?;

    let start_ns = match o.start_at {
        Some(ms) => {
            let at = ms * 1_000_000;
            while super::unix_ns() < at {
                let (work, next) = dev.dp.poll();
                backoff.after_poll(dev.dp.now(), work, next);
            }
            at
        }
        None => super::unix_ns(),
    };
    let start = Instant::now();
    let bin_ns = o.bin_ms * 1e6;
    let run_for = Duration::from_secs_f64(o.seconds.max(0.0));
    let sge = [Sge {
        addr,
        length: o.size as u32,
        lkey,
    }];
    let mut rep = FlowReport {
        qpn,
        start_unix_ns: start_ns,
        bin_ms: o.bin_ms,
        size: o.size,
        depth: o.depth,
        dcqcn: o.cc.params.enabled,
        ..Default::default()
    };
    let (mut posted, mut done) = (0u64, 0u64);
    let mut last_done = Instant::now();
    let mut wcs = [NO_WC; 64];
    loop {
        let sending = start.elapsed() < run_for;
        if !sending && done == posted {
            break;
        }
        while sending && posted - done < o.depth as u64 {
            let mut wr = SendWr::new(posted, WrOpcode::RdmaWrite, &sge);
            wr.remote_addr = peer.vaddr;
            wr.rkey = peer.rkey;
            dev.dp.core.post_send(qpn, &wr)?;
            posted += 1;
        }
        let (work, next) = dev.dp.poll();
        let n = dev.dp.core.cq_mut(cq).map_or(0, |c| c.poll(&mut wcs));
        let bin = (start.elapsed().as_nanos() as f64 / bin_ns) as usize;
        if rep.bins.len() <= bin {
            rep.bins.resize(bin + 1, FlowBin::default());
        }
        for w in &wcs[..n] {
            if w.status != WcStatus::Success {
                bail!(
                    "WRITE {} completed with {} after {done} completions",
                    w.wr_id,
                    w.status.name()
                );
            }
            rep.bins[bin].bytes += o.size as u64;
            rep.bytes += o.size as u64;
            done += 1;
            last_done = Instant::now();
        }
        if let Some(q) = dev.dp.core.qp(qpn) {
            rep.bins[bin].rate_mbps = q.cc().rc;
            rep.bins[bin].alpha = q.cc().alpha;
        }
        if last_done.elapsed() > Duration::from_secs(5) {
            bail!("no WRITE completed for 5 s ({done} of {posted} done)");
        }
        backoff.after_poll(dev.dp.now(), work || n > 0, next);
    }
    rep.seconds = start.elapsed().as_secs_f64();
    rep.goodput_mbps = rep.bytes as f64 * 8.0 / rep.seconds.max(1e-9) / 1e6;
    if let Some(q) = dev.dp.core.qp(qpn) {
        rep.stats = q.stats();
    }
    send_line(&mut tcp, &"done")?;
    // The last ACKs and the server's reading of "done" need no more from
    // us; a short grace keeps our side of the wire answering meanwhile.
    dev.poll_for(Duration::from_millis(20));
    Ok(rep)
}

struct Conn {
    tcp: TcpStream,
    lines: LineReader,
    qp: Option<(u32, IpAddr)>,
}

/// Server: one QP per client, until SIGINT/SIGTERM or `o.seconds`.
pub fn serve(o: &Options) -> Result<ServerReport> {
    let mut dev = open(o)?;
    let pd = dev.dp.core.alloc_pd();
    let (addr, _, rkey) = dev.dp.core.reg_mr(pd, AREA, Access::ALL)?;
    let cq = dev.dp.core.create_cq(1024)?;
    let l = TcpListener::bind(("0.0.0.0", o.port))
        .with_context(|| format!("listen on TCP port {}", o.port))?;
    l.set_nonblocking(true)?;
    super::stop_on_signals();
    let start = Instant::now();
    let mut backoff = Backoff::new(o.adaptive);
    let mut conns: Vec<Conn> = Vec::new();
    let mut rep = ServerReport::default();
    let retire = |dev: &mut Standalone, rep: &mut ServerReport, qp: Option<(u32, IpAddr)>| {
        let Some((qpn, peer)) = qp else { return };
        if let Some(q) = dev.dp.core.qp(qpn) {
            let stats = q.stats();
            rep.np_ecn_marked_roce_packets += stats.np_ecn_marked_roce_packets;
            rep.np_cnp_sent += stats.np_cnp_sent;
            rep.qps.push(ServedQp { peer, qpn, stats });
        }
        let _ = dev.dp.core.destroy_qp(qpn);
    };
    while !super::stop_requested()
        && (o.seconds <= 0.0 || start.elapsed().as_secs_f64() < o.seconds)
    {
        let (work, next) = dev.dp.poll();
        backoff.after_poll(dev.dp.now(), work, next);
        match l.accept() {
            Ok((s, _)) => {
                s.set_nodelay(true)?;
                s.set_nonblocking(true)?;
                conns.push(Conn {
                    tcp: s,
                    lines: LineReader::default(),
                    qp: None,
                });
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => return Err(e).context("accept a flow client"),
        }
        let mut i = 0;
        while i < conns.len() {
            let c = &mut conns[i];
            match c.lines.poll(&mut c.tcp) {
                Ok(Some(line)) if c.qp.is_none() => {
                    let peer: Hello =
                        serde_json::from_str(&line).context("a client's connection details")?;
                    let qpn = dev.dp.core.create_qp(
                        pd,
                        cq,
                        QpCap {
                            max_send_wr: 1,
                            max_recv_wr: 1,
                        },
                    )?;
                    let psn = dev.dp.core.random_psn();
                    connect(&mut dev, o, qpn, psn, &peer)?;
                    let ip = hostnet::local_addr_for(&o.iface, peer.ip)?;
                    send_line(
                        &mut c.tcp,
                        &Hello {
                            qpn,
                            psn,
                            ip,
                            rkey,
                            vaddr: addr,
                            selective_repeat: None,
                        },
                    )?;
                    c.qp = Some((qpn, peer.ip));
                    i += 1;
                }
                // "done", or the client went away: its QP's counters are
                // final.
                Ok(Some(_)) | Err(_) => {
                    let c = conns.swap_remove(i);
                    retire(&mut dev, &mut rep, c.qp);
                }
                Ok(None) => i += 1,
            }
        }
    }
    for c in conns {
        retire(&mut dev, &mut rep, c.qp);
    }
    rep.seconds = start.elapsed().as_secs_f64();
    Ok(rep)
}
