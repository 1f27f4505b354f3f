//! `ibv_rc_pingpong`, both roles, on our stack: the same out-of-band TCP
//! exchange (rdma-core 44: `"%04x:%06x:%06x:%s"` + NUL, 52 bytes, then
//! `"done"`), the same ping-pong of SENDs and receive refills, the same
//! optional data check and the same result lines.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use crate::device::datapath::{Connect, Path};
use crate::device::standalone::{Standalone, NO_WC};
use crate::io::hostnet;
use crate::memory::Access;
use crate::transport::{QpAttr, QpCap, RecvWr, SendWr, Sge, WcStatus, WrOpcode};
use crate::wire::{gid_of, gid_to_ip};

pub struct Options {
    pub iface: String,
    /// Client mode: the server's address.
    pub server: Option<IpAddr>,
    pub port: u16,
    pub size: usize,
    pub iters: u64,
    pub mtu: u32,
    pub rx_depth: u32,
    pub validate: bool,
    /// Our GID's address (default: the interface's address facing the peer).
    pub local_ip: Option<IpAddr>,
}

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
const MSG_LEN: usize = 52;

fn wire_gid(g: &[u8; 16]) -> String {
    g.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_dest(msg: &[u8]) -> Result<(u32, u32, [u8; 16])> {
    let s = std::str::from_utf8(msg.split(|&b| b == 0).next().unwrap_or(&[]))
        .map_err(|_| anyhow!("peer's QP message is not text"))?;
    let f: Vec<&str> = s.split(':').collect();
    if f.len() != 4 || f[3].len() != 32 {
        bail!("peer's QP message '{s}' is not lid:qpn:psn:gid");
    }
    let qpn = u32::from_str_radix(f[1], 16)?;
    let psn = u32::from_str_radix(f[2], 16)?;
    let mut gid = [0u8; 16];
    for (i, g) in gid.iter_mut().enumerate() {
        *g = u8::from_str_radix(&f[3][2 * i..2 * i + 2], 16)?;
    }
    Ok((qpn, psn, gid))
}

fn diag(dev: &Standalone, qpn: u32) -> String {
    format!(
        "{}; {:?}; {}; {:?}",
        dev.dp.xsks[0].debug_state(),
        dev.dp.core.stats,
        dev.dp
            .core
            .qp(qpn)
            .map(|q| q.debug_state())
            .unwrap_or_default(),
        dev.dp.core.qp(qpn).map(|q| q.stats())
    )
}

pub fn run(o: Options) -> Result<()> {
    let mut dev = Standalone::open(&o.iface, crate::io::xdp::XdpMode::Auto, true)?;
    let pd = dev.dp.core.alloc_pd();
    let (addr, lkey, _) = dev.dp.core.reg_mr(pd, o.size.max(1), Access::LOCAL_WRITE)?;
    {
        let mr = dev.dp.core.mem.by_lkey_mut(lkey).expect("just registered");
        let len = mr.len();
        mr.fill(0, len, 0x7b);
    }
    let cq = dev.dp.core.create_cq(o.rx_depth as usize + 1)?;
    let qpn = dev.dp.core.create_qp(
        pd,
        cq,
        QpCap {
            max_send_wr: 1,
            max_recv_wr: o.rx_depth,
        },
    )?;
    // RECVs may be posted from INIT on; rc_pingpong posts them before
    // connecting.
    dev.dp.core.modify_qp(qpn, &QpAttr::init(Access(0)))?;
    let sg = [Sge {
        addr,
        length: o.size as u32,
        lkey,
    }];
    // rc_pingpong keeps rx_depth receives posted, refilling when one is left.
    let refill = |dev: &mut Standalone, routs: &mut u32| -> Result<()> {
        while *routs < o.rx_depth {
            dev.dp.core.post_recv(
                qpn,
                &RecvWr {
                    wr_id: RECV_WRID,
                    sg_list: &sg,
                },
            )?;
            *routs += 1;
        }
        Ok(())
    };
    let mut routs = 0u32;
    refill(&mut dev, &mut routs)?;
    let my_psn = dev.dp.core.random_psn();

    // Out-of-band exchange.
    let (mut tcp, peer_addr) = match o.server {
        Some(ip) => {
            let s =
                TcpStream::connect_timeout(&SocketAddr::new(ip, o.port), Duration::from_secs(5))
                    .with_context(|| format!("couldn't connect to {ip}:{}", o.port))?;
            (s, ip)
        }
        None => {
            let l = TcpListener::bind(("::", o.port))
                .with_context(|| format!("listen on port {}", o.port))?;
            let (s, a) = l.accept()?;
            (s, a.ip())
        }
    };
    let mut peer = [0u8; MSG_LEN];
    let out;
    let my_msg = |local_ip: IpAddr| {
        let m = format!(
            "{:04x}:{:06x}:{:06x}:{}",
            0,
            qpn,
            my_psn,
            wire_gid(&gid_of(local_ip))
        );
        let mut out = [0u8; MSG_LEN];
        out[..m.len()].copy_from_slice(m.as_bytes());
        out
    };
    // Our GID takes the family of the peer's: the client knows only the
    // server's address when it speaks first; the server reads first.
    let local_ip = if o.server.is_some() {
        let ip = match o.local_ip {
            Some(ip) => ip,
            None => hostnet::local_addr_for(&o.iface, peer_addr.to_canonical())?,
        };
        out = my_msg(ip);
        tcp.write_all(&out)?;
        tcp.read_exact(&mut peer)
            .context("read the server's QP details")?;
        ip
    } else {
        tcp.read_exact(&mut peer)
            .context("read the client's QP details")?;
        let (_, _, g) = parse_dest(&peer)?;
        let ip = match o.local_ip {
            Some(ip) => ip,
            None => hostnet::local_addr_for(&o.iface, gid_to_ip(&g))?,
        };
        out = my_msg(ip);
        ip
    };
    let (rqpn, rpsn, rgid) = parse_dest(&peer)?;
    let peer_ip = gid_to_ip(&rgid);
    let peer_mac = hostnet::resolve_mac(&o.iface, peer_ip, Duration::from_secs(3))?;
    let path = Path {
        local_mac: dev.mac,
        peer_mac,
        local_ip,
        peer_ip,
        vlan: None,
        traffic_class: 0,
    };
    dev.dp
        .core
        .connect_qp(qpn, path, &Connect::new(rqpn, rpsn, my_psn, o.mtu))?;
    if o.server.is_some() {
        // The client writes "done" after the server's reply.
        tcp.write_all(b"done\0")?;
    } else {
        tcp.write_all(&out)?;
        let mut done = [0u8; MSG_LEN];
        let n = tcp.read(&mut done)?;
        if n != 5 {
            bail!("client did not confirm the connection (read {n} bytes, want \"done\")");
        }
    }
    println!(
        "  local address:  LID 0x0000, QPN 0x{qpn:06x}, PSN 0x{my_psn:06x}, GID {}",
        local_ip
    );
    println!(
        "  remote address: LID 0x0000, QPN 0x{rqpn:06x}, PSN 0x{rpsn:06x}, GID {}",
        peer_ip
    );

    let start = Instant::now();
    let mut pending = RECV_WRID;
    let post_send = |dev: &mut Standalone| -> Result<()> {
        let mut wr = SendWr::new(SEND_WRID, WrOpcode::Send, &sg);
        wr.flags.signaled = true;
        Ok(dev.dp.core.post_send(qpn, &wr)?)
    };
    if o.server.is_some() {
        if o.validate {
            let mr = dev.dp.core.mem.by_lkey_mut(lkey).expect("mr");
            for i in (0..o.size).step_by(4096) {
                mr.write(i, &[0]);
            }
        }
        post_send(&mut dev)?;
        pending |= SEND_WRID;
    }
    let (mut rcnt, mut scnt) = (0u64, 0u64);
    let mut last_progress = Instant::now();
    while rcnt < o.iters || scnt < o.iters {
        dev.dp.poll();
        let mut wcs = [NO_WC; 16];
        let n = dev
            .dp
            .core
            .cq_mut(cq)
            .map(|c| c.poll(&mut wcs))
            .unwrap_or(0);
        if n == 0 {
            if last_progress.elapsed() > Duration::from_secs(10) {
                bail!(
                    "no completion for 10 s (sent {scnt}, received {rcnt} of {}); {}",
                    o.iters,
                    diag(&dev, qpn)
                );
            }
            continue;
        }
        last_progress = Instant::now();
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                bail!(
                    "Failed status {} for wr_id {} (after {scnt} sends, {rcnt} receives; {})",
                    wc.status.name(),
                    wc.wr_id,
                    diag(&dev, qpn)
                );
            }
            match wc.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    routs -= 1;
                    if routs <= 1 {
                        refill(&mut dev, &mut routs)?;
                    }
                    rcnt += 1;
                }
                other => bail!("completion for unknown wr_id {other}"),
            }
            pending &= !wc.wr_id;
            if scnt < o.iters && pending == 0 {
                post_send(&mut dev)?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let bytes = o.size as u64 * o.iters * 2;
    println!(
        "{} bytes in {:.2} seconds = {:.2} Mbit/sec",
        bytes,
        secs,
        bytes as f64 * 8.0 / secs / 1e6
    );
    println!(
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        o.iters,
        secs,
        secs * 1e6 / o.iters as f64
    );
    if o.server.is_none() && o.validate {
        let mr = dev.dp.core.mem.by_lkey(lkey).expect("mr");
        for i in (0..o.size).step_by(4096) {
            let mut b = [0u8];
            mr.read(i, &mut b);
            if b[0] != 0 {
                bail!("invalid data in page {}", i / 4096);
            }
        }
        println!("data check passed");
    }
    // Let the last ACKs leave before the socket closes.
    dev.poll_for(Duration::from_millis(50));
    Ok(())
}
