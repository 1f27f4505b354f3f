//! perftest-compatible benchmarks on an in-process device: `write-lat`,
//! `read-lat`, `send-lat`, `atomic-lat`, `write-bw`, `read-bw`, `send-bw`,
//! with perftest's flags, its TCP exchange (perftest 4.5-0.17, version
//! string "6.06": the key/address records of `perftest_communication.c`)
//! and its output columns, so that either
//! side can be perftest itself.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;

use crate::device::datapath::{Connect, Path};
use crate::device::standalone::{Standalone, NO_WC};
use crate::io::hostnet;
use crate::memory::Access;
use crate::transport::{QpAttr, QpCap, RecvWr, SendWr, Sge, WcOpcode, WcStatus, WrOpcode};
use crate::wire::{gid_of, gid_to_ip};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Test {
    WriteLat,
    ReadLat,
    SendLat,
    AtomicLat,
    WriteBw,
    ReadBw,
    SendBw,
}

impl Test {
    pub fn is_lat(self) -> bool {
        matches!(
            self,
            Test::WriteLat | Test::ReadLat | Test::SendLat | Test::AtomicLat
        )
    }
    pub fn name(self) -> &'static str {
        match self {
            Test::WriteLat => "write_lat",
            Test::ReadLat => "read_lat",
            Test::SendLat => "send_lat",
            Test::AtomicLat => "atomic_lat",
            Test::WriteBw => "write_bw",
            Test::ReadBw => "read_bw",
            Test::SendBw => "send_bw",
        }
    }
    fn uses_reads(self) -> bool {
        matches!(self, Test::ReadLat | Test::AtomicLat | Test::ReadBw)
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    pub test: Test,
    pub iface: String,
    pub server: Option<IpAddr>,
    pub port: u16,
    pub sizes: Vec<usize>,
    pub iters: u64,
    pub duration: Option<f64>,
    pub tx_depth: u32,
    pub mtu: u32,
    pub cpu: Option<usize>,
    /// Seconds to wait for the peer (TCP) before giving up.
    pub connect_timeout: u64,
    /// QPs (-q); bandwidth tests spread the messages over them.
    pub qps: u32,
    /// Our GID's address (IPv4 or IPv6); default: the one facing the peer.
    pub local_ip: Option<IpAddr>,
    pub quiet: bool,
    /// Wait in poll(2) while only waiting for the peer (see `Oob`).
    pub adaptive: bool,
    /// The buffer in the MR pool: the XDP responder serves the peer's
    /// WRITEs to it.
    pub pool: bool,
    /// The XDP responder skips the received ICRC check (to measure its
    /// share of the program's cost; benchmark only).
    pub no_icrc_check: bool,
}

/// One line of results, in perftest's columns (units in the key).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Record {
    pub test: String,
    pub bytes: usize,
    pub iters: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub t_min_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub t_max_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub t_typical_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub t_avg_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub t_stdev_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p999_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bw_peak_gbps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bw_avg_gbps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub msg_rate_mpps: Option<f64>,
    /// Engine microbenchmark: frames/s through the engine alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_only_mpps: Option<f64>,
    /// How this side's AF_XDP sockets were bound: "zero-copy" or "copy".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xsk_bind: Option<&'static str>,
    /// Who answers the peer's WRITEs: "xdp" (the XDP responder, buffer in
    /// the MR pool), "xdp-no-icrc" (the same without the received ICRC
    /// check, benchmark only) or "user" (the engine).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<&'static str>,
    /// write_bw's target: the CPU time (user and system) its process spent
    /// per message, from getrusage over the test.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_user_cpu_us_per_msg: Option<f64>,
    /// This side's XDP program: kernel run-time statistics over the test,
    /// average ns per run (every frame it saw: placed WRITEs, ACKs,
    /// redirects alike), and the runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xdp_ns_per_run: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xdp_runs: Option<u64>,
    /// This side's XDP counters that are not zero (placed, answered,
    /// each punt reason), since its program was attached.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xdp_stats: Option<serde_json::Map<String, serde_json::Value>>,
}

/// This side's XDP counters that are not zero.
fn nonzero_xdp_stats(dev: &Standalone) -> Option<serde_json::Map<String, serde_json::Value>> {
    let m = dev.xdp.stats_map().ok()?;
    Some(
        m.into_iter()
            .filter(|(_, v)| v.as_u64().is_some_and(|n| n > 0))
            .collect(),
    )
}

/// This process's CPU time so far (user and system), in µs.
fn process_cpu_us() -> f64 {
    // SAFETY: getrusage fills the struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    tv(u.ru_utime) + tv(u.ru_stime)
}

const VERSION: &[u8; 4] = b"6.06";
/// `--adaptive`: idle data path turns before a wait in poll(2). Few: a
/// waiting side's next frame is usually a round trip away, and spinning
/// until then is CPU spent on nothing.
const ADAPTIVE_SPIN: u32 = 8;
/// Gb/s (10^9 bit) to perftest's MB/sec (2^20 bytes).
const GBPS_TO_MBPS: f64 = 1e9 / 8.0 / 1_048_576.0;
const KEY_LEN: usize = 108;

fn mtu_enum(m: u32) -> u8 {
    match m {
        256 => 1,
        512 => 2,
        1024 => 3,
        2048 => 4,
        _ => 5,
    }
}
fn enum_mtu(e: u8) -> u32 {
    match e {
        1 => 256,
        2 => 512,
        3 => 1024,
        4 => 2048,
        _ => 4096,
    }
}

/// The peer's values from a key message.
#[derive(Debug, Clone, Copy)]
struct Keys {
    out_reads: u32,
    qpn: u32,
    psn: u32,
    rkey: u32,
    vaddr: u64,
    gid: [u8; 16],
}

fn fmt_keys(k: &Keys) -> [u8; KEY_LEN] {
    let mut s = format!(
        "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
        0, k.out_reads, k.qpn, k.psn, k.rkey, k.vaddr
    );
    for b in k.gid {
        s += &format!("{b:02x}:");
    }
    s += &format!("{:08x}:", 0);
    let mut out = [0u8; KEY_LEN];
    out[..s.len()].copy_from_slice(s.as_bytes());
    out
}

fn parse_keys(b: &[u8]) -> Result<Keys> {
    let s = std::str::from_utf8(b.split(|&c| c == 0).next().unwrap_or(&[]))
        .map_err(|_| anyhow!("peer's key message is not text"))?;
    let f: Vec<&str> = s.split(':').collect();
    if f.len() < 23 {
        bail!(
            "peer's key message '{s}' has {} fields, want 23 (is it perftest with a GID, -x?)",
            f.len()
        );
    }
    let h = |i: usize| u64::from_str_radix(f[i], 16).map_err(|_| anyhow!("bad field {i} in '{s}'"));
    let mut gid = [0u8; 16];
    for (i, g) in gid.iter_mut().enumerate() {
        *g = h(6 + i)? as u8;
    }
    Ok(Keys {
        out_reads: h(1)? as u32,
        qpn: h(2)? as u32,
        psn: h(3)? as u32,
        rkey: h(4)? as u32,
        vaddr: h(5)?,
        gid,
    })
}

/// The TCP side channel. Reads keep the data path polled, so a peer waiting
/// on us for packets is answered while we wait on it for bytes.
struct Oob {
    s: TcpStream,
    client: bool,
    /// Waiting for the peer's next message, sleep in poll(2) on the AF_XDP
    /// sockets and this connection once the data path has been idle a
    /// while (at most 1 ms, never past its next timer), instead of
    /// spinning: a bandwidth test's target then spends CPU on its work only.
    adaptive: bool,
}

impl Oob {
    fn read_polling(
        &mut self,
        dev: &mut Standalone,
        buf: &mut [u8],
        timeout: Duration,
    ) -> Result<()> {
        self.s.set_nonblocking(true)?;
        let start = Instant::now();
        let mut got = 0;
        let mut idle = 0u32;
        let mut fds: Vec<libc::pollfd> = if self.adaptive {
            dev.dp
                .xsks
                .iter()
                .map(|x| x.fd())
                .chain([self.s.as_raw_fd()])
                .map(|fd| libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect()
        } else {
            Vec::new()
        };
        while got < buf.len() {
            match self.s.read(&mut buf[got..]) {
                Ok(0) => bail!("the peer closed the connection"),
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    // A turn that may be followed by a sleep leaves no
                    // deferred TX kick behind.
                    let (work, next) = if self.adaptive {
                        dev.dp.poll_flushed()
                    } else {
                        dev.dp.poll()
                    };
                    if start.elapsed() > timeout {
                        bail!("the peer sent nothing for {timeout:?}");
                    }
                    idle = if work { 0 } else { idle.saturating_add(1) };
                    if self.adaptive && idle > ADAPTIVE_SPIN {
                        let now = dev.dp.now();
                        let ns = next.map_or(1_000_000, |t| t.saturating_sub(now).min(1_000_000));
                        crate::io::ppoll_ns(&mut fds, ns);
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.s.set_nonblocking(false)?;
        Ok(())
    }

    /// One symmetric exchange: the client writes first, the server reads first.
    fn xchg(&mut self, dev: &mut Standalone, ours: &[u8], timeout: Duration) -> Result<Vec<u8>> {
        let mut theirs = vec![0u8; ours.len()];
        if self.client {
            self.s.write_all(ours)?;
            self.read_polling(dev, &mut theirs, timeout)?;
        } else {
            self.read_polling(dev, &mut theirs, timeout)?;
            self.s.write_all(ours)?;
        }
        Ok(theirs)
    }
}

/// The side channel's TCP connection: connect to `server` (retrying until
/// `timeout`), or accept one client on `port`.
pub fn oob_connect(server: Option<IpAddr>, port: u16, timeout: Duration) -> Result<TcpStream> {
    Ok(match server {
        Some(ip) => {
            let sa = SocketAddr::new(ip, port);
            let start = Instant::now();
            loop {
                match TcpStream::connect_timeout(&sa, Duration::from_secs(1)) {
                    Ok(s) => break s,
                    Err(e) if start.elapsed() < timeout => {
                        log::debug!("connect {sa}: {e}");
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    Err(e) => bail!("no perftest-style server at {sa} within {timeout:?}: {e}"),
                }
            }
        }
        None => {
            let l = TcpListener::bind(("0.0.0.0", port))
                .with_context(|| format!("listen on TCP port {port}"))?;
            l.set_nonblocking(true)?;
            let start = Instant::now();
            loop {
                match l.accept() {
                    Ok((s, _)) => break s,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        if start.elapsed() > timeout {
                            bail!("no client connected within {timeout:?}");
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
    })
}

pub fn run(o: Options) -> Result<Vec<Record>> {
    if o.test.is_lat() && o.duration.is_some() {
        bail!("-D applies to bandwidth tests; use -n ITERS for latency tests");
    }
    if let Some(c) = o.cpu {
        crate::device::runner::pin_to_cpu(c);
    }
    let max_size = *o
        .sizes
        .iter()
        .max()
        .ok_or_else(|| anyhow!("no message size"))?;
    let nqp = o.qps.max(1) as usize;
    if nqp > 1 && o.test.is_lat() {
        bail!("-q {nqp}: latency tests run on one QP (as perftest's do); use -q with *-bw tests");
    }
    let mut dev = Standalone::open(&o.iface, crate::io::xdp::XdpMode::Auto, true)?;
    if o.no_icrc_check {
        dev.xdp.set_bench_no_icrc(true)?;
    }
    let timeout = Duration::from_secs(o.connect_timeout);
    // perftest's buffer: one slot per QP to send from, then one per QP for
    // the peer to target (BUFF_SIZE each).
    let slot = max_size.max(64).div_ceil(4096) * 4096;
    let pd = dev.dp.core.alloc_pd();
    let (addr, lkey, rkey) = if o.pool {
        let (a, l, r, _) = dev.dp.core.reg_mr_pool(pd, slot * 2 * nqp, Access::ALL)?;
        (a, l, r)
    } else {
        dev.dp.core.reg_mr(pd, slot * 2 * nqp, Access::ALL)?
    };
    let rx_depth = if o.test == Test::SendBw {
        512
    } else {
        o.tx_depth.max(16)
    };
    let cq = dev.dp.core.create_cq(4096 * nqp)?;
    let out_reads = if o.test.uses_reads() { 16 } else { 1 };
    let mut qps = Vec::with_capacity(nqp);
    for i in 0..nqp {
        let qpn = dev.dp.core.create_qp(
            pd,
            cq,
            QpCap {
                max_send_wr: o.tx_depth.max(1),
                max_recv_wr: rx_depth,
            },
        )?;
        dev.dp.core.modify_qp(qpn, &QpAttr::init(Access::ALL))?;
        let target_off = (nqp + i) * slot;
        qps.push(QpCtx {
            qpn,
            psn: dev.dp.core.random_psn(),
            local: addr + (i * slot) as u64,
            target_off,
            peer: None,
            recv_sg: [Sge {
                addr: addr + target_off as u64,
                length: max_size as u32,
                lkey,
            }],
        });
    }

    let s = oob_connect(o.server, o.port, timeout)?;
    s.set_nodelay(true)?;
    let peer_addr = s.peer_addr()?.ip().to_canonical();
    let mut oob = Oob {
        s,
        client: o.server.is_some(),
        adaptive: o.adaptive,
    };
    let mut v = [0u8; 16];
    v[..4].copy_from_slice(VERSION);
    let theirs = oob.xchg(&mut dev, &v, timeout)?;
    let their_ver =
        std::str::from_utf8(theirs.split(|&c| c == 0).next().unwrap_or(&[])).unwrap_or("?");
    if their_ver.parse::<f64>().unwrap_or(0.0) < 5.70 {
        bail!("peer speaks perftest version '{their_ver}', need >= 5.70");
    }
    oob.xchg(&mut dev, &4096i32.to_be_bytes(), timeout)?;
    oob.xchg(&mut dev, &64i32.to_be_bytes(), timeout)?;
    let m = oob.xchg(&mut dev, &[b'0' + mtu_enum(o.mtu), 0], timeout)?;
    let mtu = enum_mtu(m[0].wrapping_sub(b'0')).min(o.mtu);
    // Our GID: --local-ip, or the address facing the peer. A server without
    // --local-ip reads the client's first key message before answering (it
    // reads first anyway) and takes an address of the same family, as
    // perftest's peers must use GIDs of one family.
    let mut first_theirs = None;
    let local_ip = match (o.local_ip, oob.client) {
        (Some(ip), _) => ip,
        (None, true) => hostnet::local_addr_for(&o.iface, peer_addr)?,
        (None, false) => {
            let mut b = vec![0u8; KEY_LEN];
            oob.read_polling(&mut dev, &mut b, timeout)?;
            let k = parse_keys(&b)?;
            first_theirs = Some(b);
            hostnet::local_addr_for(&o.iface, gid_to_ip(&k.gid))?
        }
    };
    let keys = |q: &QpCtx| Keys {
        out_reads,
        qpn: q.qpn,
        psn: q.psn,
        rkey,
        vaddr: addr + q.target_off as u64,
        gid: gid_of(local_ip),
    };
    // Latency tests exchange keys 4 times; write/read_bw 3 times; send_bw
    // a 4th time once the receiver has posted its receives (before traffic;
    // seen between two rxe hosts). The first two exchanges are one message
    // per QP (before and after perftest's ctx_connect), the later ones carry
    // QP 0's keys.
    let rounds = if o.test.is_lat() || o.test == Test::SendBw {
        4
    } else {
        3
    };
    // SEND tests need receives posted before the peer may send.
    if matches!(o.test, Test::SendLat | Test::SendBw) {
        for q in &qps {
            for _ in 0..rx_depth {
                q.post_recv(&mut dev)?;
            }
        }
    }
    let mut peer_mac = None;
    for q in qps.iter_mut() {
        let theirs = match first_theirs.take() {
            // The server already read this one: answer it.
            Some(b) => {
                oob.s.write_all(&fmt_keys(&keys(q)))?;
                b
            }
            None => oob.xchg(&mut dev, &fmt_keys(&keys(q)), timeout)?,
        };
        let k = parse_keys(&theirs)?;
        let peer_ip = gid_to_ip(&k.gid);
        let mac = match peer_mac {
            Some(m) => m,
            None => *peer_mac.insert(hostnet::resolve_mac(
                &o.iface,
                peer_ip,
                Duration::from_secs(3),
            )?),
        };
        dev.dp.core.connect_qp(
            q.qpn,
            Path {
                local_mac: dev.mac,
                peer_mac: mac,
                local_ip,
                peer_ip,
                vlan: None,
                traffic_class: 0,
            },
            &Connect {
                max_rd_atomic: k.out_reads.clamp(1, 16) as u8,
                ..Connect::new(k.qpn, k.psn, q.psn, mtu)
            },
        )?;
        q.peer = Some(k);
    }
    for q in &qps {
        oob.xchg(&mut dev, &fmt_keys(&keys(q)), timeout)?;
    }
    let ours = keys(&qps[0]);
    for _ in 2..rounds {
        oob.xchg(&mut dev, &fmt_keys(&ours), timeout)?;
    }
    if !o.quiet {
        for q in &qps {
            let (k, peer) = (keys(q), q.peer());
            eprintln!(
                " local address: QPN 0x{:04x} PSN 0x{:06x} RKey 0x{rkey:08x} VAddr 0x{:016x} GID {local_ip}",
                k.qpn, k.psn, k.vaddr
            );
            eprintln!(
                " remote address: QPN 0x{:04x} PSN 0x{:06x} RKey 0x{:08x} VAddr 0x{:016x} GID {}",
                peer.qpn,
                peer.psn,
                peer.rkey,
                peer.vaddr,
                gid_to_ip(&peer.gid)
            );
        }
        if o.test.is_lat() {
            println!(" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]");
        } else {
            println!(
                " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
            );
        }
    }
    let ctx = Ctx { cq, lkey, qps };
    let mut records = Vec::new();
    let path = Some(match (o.pool, o.no_icrc_check) {
        (true, false) => "xdp",
        (true, true) => "xdp-no-icrc",
        _ => "user",
    });
    let cpu0 = process_cpu_us();
    // The XDP program's own cost: the kernel's run-time statistics.
    let _stats = crate::io::xdp::enable_run_stats().ok();
    let xdp0 = dev.xdp.run_stats();
    for &size in &o.sizes {
        let rec = match o.test {
            Test::WriteLat | Test::SendLat => pingpong(&mut dev, &ctx, &o, size)?,
            Test::ReadLat | Test::AtomicLat => {
                if oob.client {
                    one_sided_lat(&mut dev, &ctx, &o, size)?
                } else {
                    Record::default()
                }
            }
            // send_bw: both sides measure their own side.
            _ if oob.client || o.test == Test::SendBw => {
                stream(&mut dev, &ctx, &o, size, oob.client)?
            }
            _ => Record::default(),
        };
        if !rec.test.is_empty() && !o.quiet {
            print_record(&rec);
        }
        let (xdp_ns_per_run, xdp_runs) = match (xdp0, dev.xdp.run_stats()) {
            (Some((t0, n0)), Some((t1, n1))) if n1 > n0 => (
                Some((t1 - t0).as_nanos() as f64 / (n1 - n0) as f64),
                Some(n1 - n0),
            ),
            _ => (None, None),
        };
        records.push(Record {
            xsk_bind: Some(dev.dp.xsks[0].mode.name()),
            path,
            xdp_ns_per_run,
            xdp_runs,
            xdp_stats: nonzero_xdp_stats(&dev),
            ..rec
        });
    }
    if matches!(o.test, Test::WriteBw | Test::ReadBw) {
        // Once after all sizes (also with -a): the "client finished"
        // barrier, then the client's report of its last size; the server
        // prints that, as perftest's does.
        oob.xchg(&mut dev, &fmt_keys(&ours), Duration::from_secs(3600))?;
        let cpu_us = process_cpu_us() - cpu0;
        let xdp_cost = match (xdp0, dev.xdp.run_stats()) {
            (Some((t0, n0)), Some((t1, n1))) if n1 > n0 => {
                Some(((t1 - t0).as_nanos() as f64 / (n1 - n0) as f64, n1 - n0))
            }
            _ => None,
        };
        let r = records.last().cloned().unwrap_or_default();
        let mut rep = Vec::new();
        rep.extend_from_slice(&(r.bytes as u64).to_be_bytes());
        rep.extend_from_slice(&r.iters.to_be_bytes());
        // perftest reports bandwidth in its default unit, MB/sec (2^20
        // bytes), and prints the peer's numbers in that unit.
        let bw = |g: Option<f64>| g.unwrap_or(0.0) * GBPS_TO_MBPS;
        for x in [
            bw(r.bw_peak_gbps),
            bw(r.bw_avg_gbps),
            r.msg_rate_mpps.unwrap_or(0.0),
        ] {
            rep.extend_from_slice(&x.to_bits().to_be_bytes());
        }
        let mut peer_rep = Vec::new();
        for chunk in rep.chunks(8) {
            peer_rep.extend(oob.xchg(&mut dev, chunk, timeout)?);
        }
        if !oob.client {
            let word =
                |i: usize| u64::from_be_bytes(peer_rep[i * 8..i * 8 + 8].try_into().unwrap());
            let f = |i: usize| f64::from_bits(word(i));
            let rec = Record {
                test: o.test.name().into(),
                bytes: word(0) as usize,
                iters: word(1),
                bw_peak_gbps: Some(f(2) / GBPS_TO_MBPS),
                bw_avg_gbps: Some(f(3) / GBPS_TO_MBPS),
                msg_rate_mpps: Some(f(4)),
                path,
                // The target's own cost: it only waits (adaptive: asleep
                // unless frames reach it) while the peer writes.
                // (Only when it sleeps while waiting: spinning, it spends
                // all of its time, whatever the work.)
                target_user_cpu_us_per_msg: (o.test == Test::WriteBw && o.adaptive && word(1) > 0)
                    .then(|| cpu_us / (word(1) * ctx.qps.len() as u64) as f64),
                xdp_ns_per_run: xdp_cost.map(|c| c.0),
                xdp_runs: xdp_cost.map(|c| c.1),
                xdp_stats: nonzero_xdp_stats(&dev),
                ..Default::default()
            };
            if !o.quiet {
                print_record(&rec);
            }
            records.push(rec);
        }
    }
    // Closing: every test but write_lat exchanges keys once more, then both
    // write "done".
    if o.test != Test::WriteLat {
        oob.xchg(&mut dev, &fmt_keys(&ours), Duration::from_secs(3600))?;
        let _ = oob.s.write_all(b"done\0");
    }
    // Let the last ACKs leave.
    dev.poll_for(Duration::from_millis(100));
    Ok(records.into_iter().filter(|r| !r.test.is_empty()).collect())
}

pub fn print_record(r: &Record) {
    if r.t_typical_us.is_some() {
        println!(
            " {:<6} {:<10}   {:<13.2}  {:<13.2}  {:<15.2}  {:<13.2}  {:<14.2}  {:<21.2}  {:.2}",
            r.bytes,
            r.iters,
            r.t_min_us.unwrap_or(0.0),
            r.t_max_us.unwrap_or(0.0),
            r.t_typical_us.unwrap_or(0.0),
            r.t_avg_us.unwrap_or(0.0),
            r.t_stdev_us.unwrap_or(0.0),
            r.p99_us.unwrap_or(0.0),
            r.p999_us.unwrap_or(0.0)
        );
    } else {
        println!(
            " {:<10} {:<14} {:<18.6} {:<20.6} {:.6}",
            r.bytes,
            r.iters,
            r.bw_peak_gbps.unwrap_or(0.0),
            r.bw_avg_gbps.unwrap_or(0.0),
            r.msg_rate_mpps.unwrap_or(0.0)
        );
    }
}

struct Ctx {
    cq: u32,
    lkey: u32,
    qps: Vec<QpCtx>,
}

/// One of the test's QPs: where it sends from, where the peer writes to.
struct QpCtx {
    qpn: u32,
    psn: u32,
    local: u64,
    /// Offset in the MR of the slot the peer targets.
    target_off: usize,
    peer: Option<Keys>,
    recv_sg: [Sge; 1],
}

impl QpCtx {
    fn peer(&self) -> &Keys {
        self.peer.as_ref().expect("connected before use")
    }

    /// One receive into the slot the peer targets.
    fn post_recv(&self, dev: &mut Standalone) -> Result<()> {
        Ok(dev.dp.core.post_recv(
            self.qpn,
            &RecvWr {
                wr_id: 0,
                sg_list: &self.recv_sg,
            },
        )?)
    }
}

/// Latency statistics the way perftest reports them: per-iteration times,
/// t_typical the median.
pub fn lat_record(test: &str, bytes: usize, mut us: Vec<f64>) -> Record {
    us.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = us.len().max(1);
    let avg = us.iter().sum::<f64>() / n as f64;
    let var = us.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n as f64;
    let pct = |p: f64| us[(((n as f64) * p).ceil() as usize).clamp(1, n) - 1];
    Record {
        test: test.into(),
        bytes,
        iters: us.len() as u64,
        t_min_us: us.first().copied(),
        t_max_us: us.last().copied(),
        t_typical_us: Some(us[n / 2]),
        t_avg_us: Some(avg),
        t_stdev_us: Some(var.sqrt()),
        p99_us: Some(pct(0.99)),
        p999_us: Some(pct(0.999)),
        ..Default::default()
    }
}

fn wait_wc(
    dev: &mut Standalone,
    cq: u32,
    want: WcOpcode,
    early: &mut Early,
    timeout: Duration,
) -> Result<()> {
    if early.take(want) {
        return Ok(());
    }
    let start = Instant::now();
    loop {
        dev.dp.poll();
        let mut b = [NO_WC; 1];
        if dev.dp.core.cq_mut(cq).map(|c| c.poll(&mut b)).unwrap_or(0) == 1 {
            if b[0].status != WcStatus::Success {
                bail!("completion error: {}", b[0].status.name());
            }
            if b[0].opcode == want {
                return Ok(());
            }
            early.put(b[0].opcode);
            continue;
        }
        if start.elapsed() > timeout {
            bail!("the peer stopped answering (no completion for {timeout:?})");
        }
    }
}

/// Completions that came before the one awaited, for a later wait: the
/// peer's answer (a RECV) can complete before our SEND's ACK arrives.
#[derive(Default)]
struct Early {
    recv: u64,
    other: u64,
}

impl Early {
    fn put(&mut self, op: WcOpcode) {
        if op == WcOpcode::Recv {
            self.recv += 1;
        } else {
            self.other += 1;
        }
    }

    /// Takes a banked completion of `want` (RECV, or any other kind: one
    /// wait is for one kind at a time).
    fn take(&mut self, want: WcOpcode) -> bool {
        let n = if want == WcOpcode::Recv {
            &mut self.recv
        } else {
            &mut self.other
        };
        if *n > 0 {
            *n -= 1;
            true
        } else {
            false
        }
    }
}

/// A progress line on stderr every few seconds of a long run (stdout keeps
/// perftest's result lines only). Looks at the clock once per 256 calls.
struct Progress {
    start: Instant,
    next: Duration,
    calls: u32,
    quiet: bool,
}

impl Progress {
    const EVERY: Duration = Duration::from_secs(3);

    fn new(quiet: bool) -> Progress {
        Progress {
            start: Instant::now(),
            next: Self::EVERY,
            calls: 0,
            quiet,
        }
    }

    fn tick(&mut self, o: &Options, size: usize, done: u64) {
        self.calls = self.calls.wrapping_add(1);
        if self.quiet || !self.calls.is_multiple_of(256) {
            return;
        }
        let t = self.start.elapsed();
        if t < self.next {
            return;
        }
        self.next = t + Self::EVERY;
        let mut line = match o.duration {
            Some(d) => format!("{:.0} of {d:.0} s, {done} done", t.as_secs_f64()),
            None => format!("{done} of {} iterations", o.iters * o.qps.max(1) as u64),
        };
        if !o.test.is_lat() {
            let gbps = done as f64 * size as f64 * 8.0 / t.as_secs_f64() / 1e9;
            line += &format!(", {gbps:.3} Gb/s so far");
        }
        eprintln!("  {} {size} B: {line}", o.test.name());
    }
}

fn done(o: &Options, n: u64, start: Instant) -> bool {
    match o.duration {
        Some(d) => start.elapsed().as_secs_f64() >= d,
        None => n >= o.iters,
    }
}

/// write_lat / send_lat: both sides ping-pong, in perftest's loop order;
/// latency is half the time between one's consecutive sends (RTT/2), as
/// perftest defines it.
fn pingpong(dev: &mut Standalone, c: &Ctx, o: &Options, size: usize) -> Result<Record> {
    // perftest's send_lat lets the client send first (the server waits for
    // a RECV), but its write_lat lets the server write first
    // (run_iter_lat_write skips the first poll on the SERVER). Both sides
    // sending first deadlocks at iteration 2: each then waits for the
    // value 1 while the peer's second WRITE has already made it 2.
    let sends_first = (o.server.is_some()) == (o.test == Test::SendLat);
    let iters = o.iters;
    let q = &c.qps[0];
    let post_at = size.max(1) - 1;
    let sg = [Sge {
        addr: q.local,
        length: size as u32,
        lkey: c.lkey,
    }];
    let (op, want) = if o.test == Test::WriteLat {
        (WrOpcode::RdmaWrite, WcOpcode::RdmaWrite)
    } else {
        (WrOpcode::Send, WcOpcode::Send)
    };
    let mut times = Vec::with_capacity(iters as usize + 1);
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    let poll_off = q.target_off + post_at;
    let mut progress = Progress::new(o.quiet);
    let mut early = Early::default();
    while scnt < iters || rcnt < iters {
        progress.tick(o, size, scnt);
        if rcnt < iters && !(scnt < 1 && sends_first) {
            rcnt += 1;
            if o.test == Test::WriteLat {
                // The peer's WRITE carries the iteration in its last byte.
                let t0 = Instant::now();
                loop {
                    dev.dp.poll();
                    let mr = dev.dp.core.mem.by_lkey(c.lkey).expect("mr");
                    let mut b = [0u8];
                    mr.read(poll_off, &mut b);
                    if b[0] == rcnt as u8 {
                        break;
                    }
                    if t0.elapsed() > Duration::from_secs(o.connect_timeout) {
                        bail!("the peer stopped writing (iteration {rcnt})");
                    }
                }
            } else {
                wait_wc(
                    dev,
                    c.cq,
                    WcOpcode::Recv,
                    &mut early,
                    Duration::from_secs(o.connect_timeout),
                )?;
                q.post_recv(dev)?;
            }
        }
        if scnt < iters {
            scnt += 1;
            dev.dp
                .core
                .mem
                .by_lkey_mut(c.lkey)
                .expect("mr")
                .write(post_at, &[scnt as u8]);
            times.push(Instant::now());
            let mut wr = SendWr::new(scnt, op, &sg);
            wr.remote_addr = q.peer().vaddr;
            wr.rkey = q.peer().rkey;
            dev.dp.core.post_send(q.qpn, &wr)?;
            wait_wc(
                dev,
                c.cq,
                want,
                &mut early,
                Duration::from_secs(o.connect_timeout),
            )?;
        }
    }
    let us: Vec<f64> = times
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).as_secs_f64() * 1e6 / 2.0)
        .collect();
    // n sends give n - 1 round trips; perftest still reports n iterations.
    Ok(Record {
        iters,
        ..lat_record(o.test.name(), size, us)
    })
}

/// read_lat / atomic_lat (client): one operation at a time, full round trip.
fn one_sided_lat(dev: &mut Standalone, c: &Ctx, o: &Options, size: usize) -> Result<Record> {
    let atomic = o.test == Test::AtomicLat;
    let len = if atomic { 8 } else { size as u32 };
    let q = &c.qps[0];
    let sg = [Sge {
        addr: q.local,
        length: len,
        lkey: c.lkey,
    }];
    let mut us = Vec::with_capacity(o.iters as usize);
    let start = Instant::now();
    let mut n = 0u64;
    let mut progress = Progress::new(o.quiet);
    while !done(o, n, start) {
        progress.tick(o, len as usize, n);
        let mut wr = SendWr::new(
            n,
            if atomic {
                WrOpcode::FetchAdd
            } else {
                WrOpcode::RdmaRead
            },
            &sg,
        );
        wr.remote_addr = q.peer().vaddr;
        wr.rkey = q.peer().rkey;
        wr.compare_add = 1;
        let t = Instant::now();
        dev.dp.core.post_send(q.qpn, &wr)?;
        wait_wc(
            dev,
            c.cq,
            if atomic {
                WcOpcode::FetchAdd
            } else {
                WcOpcode::RdmaRead
            },
            &mut Early::default(),
            Duration::from_secs(o.connect_timeout),
        )?;
        us.push(t.elapsed().as_secs_f64() * 1e6);
        n += 1;
    }
    // Atomics move 8 bytes whatever -s says; perftest prints 8.
    Ok(lat_record(o.test.name(), len as usize, us))
}

/// write_bw / read_bw / send_bw: keep `tx_depth` operations outstanding on
/// every QP (`iters` messages each, as perftest's -q). The receiving side of
/// send_bw counts receives instead.
fn stream(dev: &mut Standalone, c: &Ctx, o: &Options, size: usize, client: bool) -> Result<Record> {
    let nqp = c.qps.len();
    let sgs: Vec<[Sge; 1]> = c
        .qps
        .iter()
        .map(|q| {
            [Sge {
                addr: q.local,
                length: size as u32,
                lkey: c.lkey,
            }]
        })
        .collect();
    let depth = |q: &QpCtx| -> u64 {
        let d = if o.test == Test::ReadBw {
            o.tx_depth.min(q.peer().out_reads.max(1)).min(16)
        } else {
            o.tx_depth
        };
        d.into()
    };
    let op = match o.test {
        Test::WriteBw => WrOpcode::RdmaWrite,
        Test::ReadBw => WrOpcode::RdmaRead,
        _ => WrOpcode::Send,
    };
    let start = Instant::now();
    let mut posted = vec![0u64; nqp];
    let mut done_per_qp = vec![0u64; nqp];
    let mut completed = 0u64;
    let mut peak = 0f64;
    let mut window = (Instant::now(), 0u64);
    let peak_span = c.qps.iter().map(depth).sum::<u64>() * 4;
    let mut last_progress = Instant::now();
    let mut progress = Progress::new(o.quiet);
    let mut wcs = [NO_WC; 64];
    let target_done = |n: u64| done(o, n, start);
    loop {
        if client {
            for (i, q) in c.qps.iter().enumerate() {
                while posted[i] - done_per_qp[i] < depth(q) && !target_done(posted[i]) {
                    let mut wr = SendWr::new(posted[i], op, &sgs[i]);
                    wr.remote_addr = q.peer().vaddr;
                    wr.rkey = q.peer().rkey;
                    dev.dp.core.post_send(q.qpn, &wr)?;
                    posted[i] += 1;
                }
            }
        }
        dev.dp.poll();
        let n = dev
            .dp
            .core
            .cq_mut(c.cq)
            .map(|q| q.poll(&mut wcs))
            .unwrap_or(0);
        for w in &wcs[..n] {
            if w.status != WcStatus::Success {
                bail!("completion error: {}", w.status.name());
            }
            let Some(i) = c.qps.iter().position(|q| q.qpn == w.qp_num) else {
                bail!("completion for unknown QP 0x{:x}", w.qp_num);
            };
            done_per_qp[i] += 1;
            if !client {
                c.qps[i].post_recv(dev)?;
            }
        }
        progress.tick(o, size, completed);
        if n > 0 {
            completed += n as u64;
            last_progress = Instant::now();
            // Peak: the best rate over any stretch of 4 x tx_depth messages.
            if completed - window.1 >= peak_span {
                let dt = window.0.elapsed().as_secs_f64();
                peak = peak.max((completed - window.1) as f64 * size as f64 * 8.0 / dt / 1e9);
                window = (Instant::now(), completed);
            }
        } else if last_progress.elapsed() > Duration::from_secs(5) {
            bail!(
                "no completion for 5 s ({completed} of {} done)",
                posted.iter().sum::<u64>()
            );
        }
        let finished = if client {
            (0..nqp).all(|i| target_done(posted[i]) && done_per_qp[i] == posted[i])
        } else {
            match o.duration {
                Some(_) => target_done(0) && last_progress.elapsed() > Duration::from_millis(200),
                None => done_per_qp.iter().all(|&d| d >= o.iters),
            }
        };
        if finished {
            break;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let avg = completed as f64 * size as f64 * 8.0 / secs / 1e9;
    Ok(Record {
        test: o.test.name().into(),
        bytes: size,
        // All QPs together, as perftest prints it.
        iters: completed,
        bw_peak_gbps: Some(peak.max(avg)),
        bw_avg_gbps: Some(avg),
        msg_rate_mpps: Some(completed as f64 / secs / 1e6),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The peer's answer may complete before our SEND's ACK: the wait for
    /// the SEND keeps the RECV for the next wait instead of dropping it.
    #[test]
    fn a_completion_ahead_of_the_awaited_one_is_kept() {
        let mut early = Early::default();
        assert!(!early.take(WcOpcode::Recv));
        early.put(WcOpcode::Recv);
        assert!(!early.take(WcOpcode::Send), "a RECV is no SEND");
        assert!(early.take(WcOpcode::Recv));
        assert!(!early.take(WcOpcode::Recv), "taken once");
        early.put(WcOpcode::Send);
        assert!(early.take(WcOpcode::Send));
    }
}
