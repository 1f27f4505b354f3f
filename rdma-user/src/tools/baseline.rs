//! Same-link baselines for the benchmarks: raw AF_XDP, UDP and TCP
//! ping-pong and stream, with no RDMA protocol, and an in-memory engine
//! microbenchmark. Numbers are reported in the same records as the RDMA
//! tests so that ratios can be taken within one run.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::device::datapath::Path;
use crate::device::standalone::Standalone;
use crate::io::hostnet;
use crate::tools::bench::{lat_record, Record};
use crate::wire::{opcode, BthRepr, DethRepr, RoceRepr, TransportRepr, ICRC_LEN, MASK_24};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    AfxdpPingpong,
    AfxdpStream,
    UdpPingpong,
    UdpStream,
    TcpPingpong,
    TcpStream,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::AfxdpPingpong => "afxdp_pingpong",
            Kind::AfxdpStream => "afxdp_stream",
            Kind::UdpPingpong => "udp_pingpong",
            Kind::UdpStream => "udp_stream",
            Kind::TcpPingpong => "tcp_pingpong",
            Kind::TcpStream => "tcp_stream",
        }
    }
}

const PORT: u16 = 18600;
const IDLE_END: Duration = Duration::from_millis(300);

/// How the AF_XDP stream client puts payload on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum TxMode {
    /// Copy each frame into a TX chunk (what the data path does).
    #[default]
    Copy,
    /// Headers in a fresh chunk, then descriptors that point at payload
    /// already in the UMEM (an MR registered inside the UMEM): no copy.
    Chain,
}

pub struct Options {
    pub kind: Kind,
    pub tx: TxMode,
    pub iface: String,
    pub server: Option<IpAddr>,
    pub size: usize,
    pub iters: u64,
    pub timeout: Duration,
}

/// Runs one baseline; the record comes from the side that can measure it:
/// the client for ping-pong (RTT/2), the receiving server for streams.
pub fn run(o: &Options) -> Result<Option<Record>> {
    match o.kind {
        Kind::UdpPingpong | Kind::UdpStream => udp(o),
        Kind::TcpPingpong | Kind::TcpStream => tcp(o),
        Kind::AfxdpPingpong | Kind::AfxdpStream => afxdp(o),
    }
}

fn stream_record(name: &str, size: usize, n: u64, secs: f64) -> Record {
    let secs = secs.max(1e-9);
    let gbps = n as f64 * size as f64 * 8.0 / secs / 1e9;
    Record {
        test: name.into(),
        bytes: size,
        iters: n,
        bw_peak_gbps: Some(gbps),
        bw_avg_gbps: Some(gbps),
        msg_rate_mpps: Some(n as f64 / secs / 1e6),
        ..Default::default()
    }
}

fn udp(o: &Options) -> Result<Option<Record>> {
    let ping = o.kind == Kind::UdpPingpong;
    let mut buf = vec![0u8; o.size.max(8)];
    match o.server {
        None => {
            let s = UdpSocket::bind(("0.0.0.0", PORT))?;
            s.set_nonblocking(true)?;
            let start = Instant::now();
            let (mut n, mut first, mut last) = (0u64, None::<Instant>, Instant::now());
            loop {
                match s.recv_from(&mut buf) {
                    Ok((len, from)) => {
                        if len == 1 {
                            break; // end marker
                        }
                        if ping {
                            s.send_to(&buf[..len], from)?;
                        }
                        first.get_or_insert_with(Instant::now);
                        last = Instant::now();
                        n += 1;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        if first.is_some_and(|_| last.elapsed() > IDLE_END) && !ping {
                            break;
                        }
                        if first.is_none() && start.elapsed() > o.timeout {
                            bail!("no UDP datagram within {:?}", o.timeout);
                        }
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            let secs = first
                .map(|f| last.duration_since(f).as_secs_f64())
                .unwrap_or(0.0);
            Ok((!ping).then(|| stream_record(o.kind.name(), o.size, n, secs)))
        }
        Some(ip) => {
            let s = UdpSocket::bind(("0.0.0.0", 0))?;
            s.connect(SocketAddr::new(ip, PORT))?;
            s.set_nonblocking(true)?;
            let mut us = Vec::with_capacity(o.iters as usize);
            for _ in 0..o.iters {
                let t = Instant::now();
                loop {
                    match s.send(&buf[..o.size.max(8)]) {
                        Ok(_) => break,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
                if ping {
                    loop {
                        match s.recv(&mut buf) {
                            Ok(_) => break,
                            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                                if t.elapsed() > Duration::from_secs(2) {
                                    bail!("UDP reply lost (no answer in 2 s)");
                                }
                            }
                            Err(e) => return Err(e.into()),
                        }
                    }
                    us.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
                }
            }
            for _ in 0..5 {
                let _ = s.send(&[0u8]);
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(ping.then(|| lat_record(o.kind.name(), o.size, us)))
        }
    }
}

fn tcp(o: &Options) -> Result<Option<Record>> {
    let ping = o.kind == Kind::TcpPingpong;
    let mut buf = vec![0u8; o.size.max(1)];
    match o.server {
        None => {
            let l = TcpListener::bind(("0.0.0.0", PORT))?;
            let (mut s, _) = l.accept()?;
            s.set_nodelay(true)?;
            if ping {
                s.set_nonblocking(true)?;
                loop {
                    let mut got = 0;
                    while got < buf.len() {
                        match s.read(&mut buf[got..]) {
                            Ok(0) => return Ok(None),
                            Ok(k) => got += k,
                            Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
                            Err(e) => return Err(e.into()),
                        }
                    }
                    write_all_spin(&mut s, &buf)?;
                }
            }
            let mut total = 0u64;
            let mut first = None;
            let mut big = vec![0u8; 1 << 16];
            loop {
                let k = s.read(&mut big)?;
                if k == 0 {
                    break;
                }
                first.get_or_insert_with(Instant::now);
                total += k as u64;
            }
            let secs = first
                .map(|f: Instant| f.elapsed().as_secs_f64())
                .unwrap_or(0.0);
            Ok(Some(stream_record(
                o.kind.name(),
                o.size,
                total / o.size.max(1) as u64,
                secs,
            )))
        }
        Some(ip) => {
            let mut s = TcpStream::connect_timeout(&SocketAddr::new(ip, PORT), o.timeout)
                .with_context(|| format!("connect to {ip}:{PORT}"))?;
            s.set_nodelay(true)?;
            if !ping {
                for _ in 0..o.iters {
                    s.write_all(&buf)?;
                }
                return Ok(None);
            }
            s.set_nonblocking(true)?;
            let mut us = Vec::with_capacity(o.iters as usize);
            for _ in 0..o.iters {
                let t = Instant::now();
                write_all_spin(&mut s, &buf)?;
                let mut got = 0;
                while got < buf.len() {
                    match s.read(&mut buf[got..]) {
                        Ok(0) => bail!("server closed"),
                        Ok(k) => got += k,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
                us.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
            }
            Ok(Some(lat_record(o.kind.name(), o.size, us)))
        }
    }
}

fn write_all_spin(s: &mut TcpStream, mut b: &[u8]) -> Result<()> {
    while !b.is_empty() {
        match s.write(b) {
            Ok(k) => b = &b[k..],
            Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// A RoCEv2-shaped frame (UD SEND to QP1) so the XDP program steers it to
/// AF_XDP; nobody runs the RDMA protocol on it.
fn raw_frame(path: &Path, size: usize, psn: u32) -> Result<Vec<u8>> {
    let mut r: RoceRepr = path.template(1, 1)?;
    r.transport = TransportRepr {
        bth: BthRepr {
            opcode: opcode::UD_SEND_ONLY,
            pkey: 0xffff,
            dest_qpn: 1,
            psn: psn & MASK_24,
            ..Default::default()
        },
        deth: Some(DethRepr {
            qkey: 0x8001_0000,
            src_qpn: 1,
        }),
        ..Default::default()
    };
    let payload = vec![0x5au8; size];
    let mut f = vec![0u8; r.frame_len(size)];
    r.emit(&payload, &mut f)?;
    Ok(f)
}

fn afxdp(o: &Options) -> Result<Option<Record>> {
    let ping = o.kind == Kind::AfxdpPingpong;
    let mut dev = Standalone::open(&o.iface, crate::io::xdp::XdpMode::Auto, true)?;
    let local_mac = dev.mac;
    let x = &mut dev.dp.xsks[0];
    match o.server {
        None => {
            // Learn the client from its first frame, then answer (ping) or
            // count (stream).
            let start = Instant::now();
            let (mut n, mut first, mut last) = (0u64, None::<Instant>, Instant::now());
            let mut reply: Option<Vec<u8>> = None;
            loop {
                let mut got = 0u32;
                let mut end = false;
                let k = x.recv(64, |f| {
                    if f.len() < 60 {
                        return;
                    }
                    got += 1;
                    if reply.is_none() {
                        let mut r = f.to_vec();
                        // Swap MACs and IPv4 addresses: a reflection.
                        let (a, b) = (r[0..6].to_vec(), r[6..12].to_vec());
                        r[0..6].copy_from_slice(&b);
                        r[6..12].copy_from_slice(&a);
                        let (sa, da) = (r[26..30].to_vec(), r[30..34].to_vec());
                        r[26..30].copy_from_slice(&da);
                        r[30..34].copy_from_slice(&sa);
                        reply = Some(r);
                    }
                    // A 61-byte frame marks the end of a stream.
                    if f.len() == 61 {
                        end = true;
                    }
                });
                if k > 0 {
                    if end {
                        break;
                    }
                    first.get_or_insert_with(Instant::now);
                    last = Instant::now();
                    n += got as u64;
                    if ping {
                        if let Some(r) = &reply {
                            for _ in 0..got {
                                while !x.send(r) {
                                    x.kick();
                                }
                            }
                            x.kick();
                        }
                    }
                } else {
                    if first.is_some() && last.elapsed() > IDLE_END {
                        break;
                    }
                    if first.is_none() && start.elapsed() > o.timeout {
                        bail!("no AF_XDP frame within {:?}", o.timeout);
                    }
                    x.kick();
                }
            }
            let secs = first
                .map(|f| last.duration_since(f).as_secs_f64())
                .unwrap_or(0.0);
            Ok((!ping).then(|| stream_record(o.kind.name(), o.size, n, secs)))
        }
        Some(ip) => {
            let path = Path {
                local_mac,
                peer_mac: hostnet::resolve_mac(&o.iface, ip, Duration::from_secs(3))?,
                local_ip: hostnet::local_addr_for(&o.iface, ip)?,
                peer_ip: ip,
                vlan: None,
                traffic_class: 0,
            };
            let frame = raw_frame(&path, o.size, 1)?;
            let chain = o.tx == TxMode::Chain && !ping;
            let (head, tail) = if chain {
                // Payload and ICRC live in pinned chunks; each descriptor
                // stays inside one chunk.
                let hdr = frame.len() - o.size - ICRC_LEN;
                let body = &frame[hdr..];
                let fs = x.frame_size() as usize;
                let n = body.len().div_ceil(fs);
                x.pin_chunks(n)?[..body.len()].copy_from_slice(body);
                let tail: Vec<(u64, u32)> = (0..n)
                    .map(|i| ((i * fs) as u64, (body.len() - i * fs).min(fs) as u32))
                    .collect();
                (&frame[..hdr], tail)
            } else {
                (&frame[..], Vec::new())
            };
            let mut us = Vec::with_capacity(o.iters as usize);
            let mut sent = 0u64;
            while sent < o.iters {
                let t = Instant::now();
                let ok = if chain {
                    x.send_chain(head, &tail)
                } else {
                    x.send(&frame)
                };
                if !ok {
                    x.kick();
                    continue;
                }
                sent += 1;
                x.kick();
                if ping {
                    loop {
                        if x.recv(1, |_| {}) > 0 {
                            break;
                        }
                        x.kick();
                        if t.elapsed() > Duration::from_secs(2) {
                            bail!("AF_XDP reply lost (no answer in 2 s)");
                        }
                    }
                    us.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
                }
            }
            // End marker: a 61-byte frame.
            let mut end = frame[..61.min(frame.len())].to_vec();
            end.resize(61, 0);
            for _ in 0..5 {
                x.send(&end);
                x.kick();
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(ping.then(|| lat_record(o.kind.name(), o.size, us)))
        }
    }
}

/// In-memory engine throughput: 64-byte WRITEs from a requester to a
/// responder and their ACKs back, full frames with ICRC both ways.
/// Returns (WRITE messages per second, frames per second).
/// With `framing` false only the engine runs: the requester's transport
/// headers and payload go through `TransportRepr::parse` into the
/// responder, without Ethernet/IP/UDP and without ICRC (the wire layer's
/// share, measured by the framed run).
pub fn engine_pps(writes: u64, framing: bool) -> Result<(f64, f64)> {
    use crate::memory::{Access, MrTable};
    use crate::transport::*;
    use std::net::Ipv4Addr;
    let mk = |qpn: u32, rqpn: u32, seed: u64| -> Result<(QpEngine, MrTable, RoceRepr)> {
        let mut mem = MrTable::new(4, seed);
        mem.register_heap(1, 1 << 16, 0x10000, Access::ALL)?;
        let mut q = QpEngine::new(
            qpn,
            1,
            QpCap {
                max_send_wr: 4096,
                max_recv_wr: 16,
            },
        );
        q.modify(&QpAttr::init(Access::ALL))?;
        q.modify(&QpAttr {
            qp_state: Some(QpState::Rtr),
            dest_gid: Some([0; 16]),
            path_mtu: Some(1024),
            dest_qp_num: Some(rqpn),
            rq_psn: Some(0),
            max_dest_rd_atomic: Some(1),
            min_rnr_timer: Some(12),
            ..Default::default()
        })?;
        q.modify(&QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(0),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(1),
            ..Default::default()
        })?;
        let path = Path {
            local_mac: [2, 0, 0, 0, 0, 1],
            peer_mac: [2, 0, 0, 0, 0, 2],
            local_ip: Ipv4Addr::new(10, 0, 0, 1).into(),
            peer_ip: Ipv4Addr::new(10, 0, 0, 2).into(),
            vlan: None,
            traffic_class: 0,
        };
        Ok((q, mem, path.template(qpn, rqpn)?))
    };
    let (mut a, mut amem, anet) = mk(0x11, 0x12, 1)?;
    let (mut b, mut bmem, bnet) = mk(0x12, 0x11, 2)?;
    let (lkey, rkey) = {
        let m = amem.iter().next().expect("mr");
        (m.lkey, bmem.iter().next().expect("mr").rkey)
    };
    let sg = [Sge {
        addr: 0x10000,
        length: 64,
        lkey,
    }];
    let mut frame = vec![0u8; 9000];
    let mut frames = 0u64;
    let mut done = 0u64;
    let mut posted = 0u64;
    let start = Instant::now();
    let mut now = 0u64;
    while done < writes {
        while posted < writes && posted - done < 1024 {
            let mut wr = SendWr::new(posted, WrOpcode::RdmaWrite, &sg);
            wr.remote_addr = 0x10000;
            wr.rkey = rkey;
            wr.flags.signaled = posted % 64 == 63 || posted + 1 == writes;
            a.post_send(&wr)?;
            posted += 1;
        }
        now += 100;
        let (an, bn) = if framing {
            (Some(&anet), Some(&bnet))
        } else {
            (None, None)
        };
        frames += pump(now, &mut a, &amem, an, &mut b, &mut bmem, &mut frame)?;
        frames += pump(now, &mut b, &bmem, bn, &mut a, &mut amem, &mut frame)?;
        while let Some(wc) = a.poll_completion() {
            if wc.status != WcStatus::Success {
                bail!("engine benchmark: {:?}", wc.status);
            }
            done = wc.wr_id + 1;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    Ok((writes as f64 / secs, frames as f64 / secs))
}

/// Moves every segment `src` wants to send through framing (if `snet`),
/// the parser and into `dst`; returns how many.
fn pump(
    now: u64,
    src: &mut crate::transport::QpEngine,
    smem: &crate::memory::MrTable,
    snet: Option<&RoceRepr>,
    dst: &mut crate::transport::QpEngine,
    dmem: &mut crate::memory::MrTable,
    frame: &mut [u8],
) -> Result<u64> {
    let hl = snet.map_or(0, |n| n.net_header_len());
    let mut n = 0;
    while let Some(tx) = src.poll_transmit(now, smem, &mut frame[hl..]) {
        let tl = tx.len;
        match snet {
            // Parsed results are used in place: moving a repr out of its
            // Result is a copy per packet the data path does not make.
            Some(net) => {
                let len = net.emit_net_and_icrc(frame, tl + ICRC_LEN)?;
                let parsed = RoceRepr::parse(&frame[..len]);
                let (r, l) = parsed.as_ref().map_err(|e| *e)?;
                dst.handle_packet(now, &r.transport, &frame[l.payload.clone()], dmem);
            }
            None => {
                let parsed = TransportRepr::parse(&frame[..tl + ICRC_LEN]);
                let (t, payload) = parsed.as_ref().map_err(|e| *e)?;
                dst.handle_packet(now, t, &frame[payload.clone()], dmem);
            }
        }
        n += 1;
    }
    Ok(n)
}
