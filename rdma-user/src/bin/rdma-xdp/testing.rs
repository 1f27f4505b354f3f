//! Hidden test tools the test suites drive: `hostile` (a seeded flood),
//! `inject` (raw frames), `xsk-recv` (what the XDP program redirects) and
//! `verbs-demo` (the verbs library end to end).

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use std::io::Write;

use rdma_user::control::proto::{hex, unhex};
use rdma_user::io::xdp::XdpMode;
use serde_json::Value;

#[derive(Args)]
pub struct HostileArgs {
    #[arg(long = "dev")]
    pub dev: String,
    /// The victim host's address and MAC.
    #[arg(long)]
    pub dst_ip: std::net::IpAddr,
    #[arg(long, value_parser = rdma_user::io::hostnet::parse_mac)]
    pub dst_mac: [u8; 6],
    /// Our address (the victim QP's connected peer).
    #[arg(long)]
    pub src_ip: std::net::IpAddr,
    /// The QPN the victim is connected to (sets the UDP source port).
    #[arg(long)]
    pub peer_qpn: u32,
    #[arg(long)]
    pub qpn: u32,
    #[arg(long)]
    pub epsn: u32,
    #[arg(long)]
    pub rkey: u32,
    #[arg(long)]
    pub va: u64,
    #[arg(long)]
    pub mr_len: u32,
    #[arg(long, default_value_t = 1024)]
    pub mtu: u32,
    #[arg(long, default_value_t = 1_000_000)]
    pub count: u64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}
#[derive(Args)]
pub struct InjectArgs {
    #[arg(long = "dev")]
    pub dev: String,
    /// Frame as hex; repeat for several.
    #[arg(long = "hex", required = true)]
    pub frames: Vec<String>,
}

#[derive(Args)]
pub struct VerbsDemoArgs {
    #[arg(long)]
    pub a: String,
    #[arg(long)]
    pub b: String,
    /// Instead of the demo: B registers one page-aligned buffer twice
    /// (with RDMA_XDP_POOL=1 the first MR moves it into the MR pool), and
    /// A WRITEs through each MR; B must see every byte at its addresses.
    #[arg(long)]
    pub pooled_twice: bool,
}

#[derive(Args)]
pub struct XskRecvArgs {
    #[arg(long = "dev")]
    pub dev: String,
    #[arg(long, default_value_t = 1)]
    pub count: usize,
    #[arg(long, default_value_t = 5000)]
    pub timeout_ms: u64,
    #[arg(long, value_enum, default_value_t = XdpMode::Auto)]
    pub xdp_mode: XdpMode,
    #[arg(long)]
    pub no_multi_buffer: bool,
}

/// Sends `count` hostile frames as fast as the socket takes them; prints
/// how many of each class went out.
pub fn hostile(h: HostileArgs) -> Result<()> {
    use rdma_user::tools::hostile::{Generator, Target, CLASSES};
    let sock = rdma_user::io::packet::RawSocket::bind(&h.dev, false)?;
    let path = rdma_user::device::datapath::Path {
        local_mac: rdma_user::io::hostnet::iface_mac(&h.dev)?,
        peer_mac: h.dst_mac,
        local_ip: h.src_ip,
        peer_ip: h.dst_ip,
        vlan: None,
        traffic_class: 0,
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
pub fn inject(dev: &str, frames: &[String]) -> Result<()> {
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
pub fn xsk_recv(
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
    println!("stats {}", Value::Object(prog.stats_map()?));
    Ok(())
}
/// Two verbs contexts in one process, one per interface: WRITE, READ,
/// SEND/RECV, FETCH_ADD, then a WRITE to a read-only MR. Every result is
/// checked; any mismatch is an error.
pub fn verbs_demo(a: &str, b: &str, pooled_twice: bool) -> Result<()> {
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
        boost: false,
        events: None,
        cc: Default::default(),
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
        traffic_class: 0,
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

    if pooled_twice {
        let len = 8192usize;
        // SAFETY: a fresh private anonymous mapping, unmapped below.
        let buf = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if buf == libc::MAP_FAILED {
            bail!("mmap: {}", std::io::Error::last_os_error());
        }
        let buf = buf as *mut u8;
        // SAFETY: the mapping stays until both MRs are deregistered.
        let m1 = unsafe { pb.reg_mr_raw(buf, len, buf as u64, Access::ALL)? };
        // SAFETY: the same mapping's first page, as long.
        let m2 = unsafe { pb.reg_mr_raw(buf, 4096, buf as u64, Access::ALL)? };
        for (k, (rkey, off)) in [(m1.rkey, 5000usize), (m2.rkey, 100), (m1.rkey, 300)]
            .into_iter()
            .enumerate()
        {
            let data: Vec<u8> = (0..700u32)
                .map(|i| (i * 3 + k as u32 * 50 + 1) as u8)
                .collect();
            ma.write(0, &data)?;
            if rkey == m1.rkey {
                // The first MR's WRITEs are for XDP to place: wait until B
                // lent the QP to it again (asynchronously, on a turn of
                // its data path after the last request), or the WRITE
                // would go to the engine and prove nothing about the pool.
                let start = Instant::now();
                while !qb.lent_to_xdp()? {
                    if start.elapsed() > Duration::from_secs(5) {
                        bail!("B's QP was not lent to XDP within 5 s");
                    }
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
            let w = one_sided(
                10 + k as u64,
                WrOpcode::RdmaWrite,
                ma.sge(0, 700),
                buf as u64 + off as u64,
                rkey,
                0,
            )?;
            // SAFETY: inside the mapping; the WRITE completed.
            let seen = unsafe { std::slice::from_raw_parts(buf.add(off), 700) };
            if w.status != WcStatus::Success || seen != &data[..] {
                bail!(
                    "pooled WRITE {k} through rkey 0x{rkey:x}: {:?}, or the bytes differ",
                    w.status
                );
            }
            println!("pooled WRITE {k}: ok");
        }
        // fork: the child gets its own copy of the pooled pages, as with
        // an ordinary fork (not the pool range shared with us).
        // SAFETY: inside the mapping.
        let before = unsafe { std::slice::from_raw_parts(buf, len) }.to_vec();
        // SAFETY: fork; the child only compares, writes its own memory
        // and calls _exit.
        match unsafe { libc::fork() } {
            -1 => bail!("fork: {}", std::io::Error::last_os_error()),
            0 => {
                // SAFETY: the child's copy of the mapping.
                let mine = unsafe { std::slice::from_raw_parts_mut(buf, len) };
                let same = mine == &before[..];
                mine.fill(0xee);
                // SAFETY: leaving the child without running the parent's
                // destructors.
                unsafe { libc::_exit(if same { 0 } else { 3 }) }
            }
            pid => {
                let mut st = 0;
                // SAFETY: waiting for our child.
                unsafe { libc::waitpid(pid, &mut st, 0) };
                // SAFETY: inside the mapping.
                let after = unsafe { std::slice::from_raw_parts(buf, len) };
                if !libc::WIFEXITED(st) || libc::WEXITSTATUS(st) != 0 || after != &before[..] {
                    bail!(
                        "fork: the child saw other bytes (status {st}), or its writes reached us"
                    );
                }
                println!("fork: the child has its own copy: ok");
            }
        }
        m2.dereg()?;
        m1.dereg()?;
        // SAFETY: our mapping; no MR covers it any more.
        unsafe { libc::munmap(buf.cast(), len) };
        if let Some(st) = cb.xdp_stats() {
            println!("xdp placed {} acked {}", st.0, st.1);
        }
        return Ok(());
    }

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
