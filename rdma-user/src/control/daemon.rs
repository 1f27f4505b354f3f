//! The controller daemon (`rdma-xdp up`): owns the XDP program and AF_XDP
//! sockets of one interface, runs one data path per RX queue, each on its
//! own thread with its own socket and QPs (see `device::shard`), and serves
//! the CLI over a root-only unix socket. tokio runs the control plane only.
//!
//! The control plane talks to a data path by sending it closures to run
//! between two polls: to the QP's owner for QP work, to every data path for
//! MRs and AHs (each sees all of them under the same keys and numbers). A
//! data path never blocks, locks or allocates for a packet.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use crate::control::proto::{hex, unhex, Request, WcJson};
use crate::device::datapath::{Connect, DataPath, Limits, Path};
use crate::device::rings::SrqShared;
use crate::device::runner::{clean_stale, data_path_loop, take_lock, Job};
use crate::device::shard::{owner_of, Shard};
use crate::io::hostnet;
use crate::io::xdp::{XdpMode, XdpProgram};
use crate::io::xsk::{rx_queues, Xsk, XskBind, XskConfig};
use crate::memory::Access;
use crate::transport::{
    QpAttr, QpCap, QpType, RecvWr, SendFlags, SendWr, Sge, UdDest, Wc, WcOpcode, WrOpcode,
};

/// perftest's Q_Key, the default of a UD QP made here.
const DEFAULT_QKEY: u32 = 0x1111_1111;

#[derive(Debug, Clone)]
pub struct UpOptions {
    pub iface: String,
    pub xdp_mode: XdpMode,
    pub queues: Option<u32>,
    pub frame_size: u32,
    /// UMEM chunks per socket (RX and TX share them).
    pub umem_frames: u32,
    pub multi_buffer: bool,
    pub zero_copy: bool,
    /// `--xsk`: zero-copy may drop multi-buffer, and then never falls
    /// back to copy mode.
    pub xsk_bind: XskBind,
    /// Sleep when idle instead of spinning.
    pub adaptive: bool,
    pub cpu: Option<usize>,
    pub cm_port: u16,
    pub limits: Limits,
    pub firewall: bool,
    /// ECN and DCQCN.
    pub cc: crate::device::datapath::CcConfig,
    /// Offer selective repeat in the daemon-to-daemon QP exchange.
    pub selective_repeat: bool,
}

/// Control-plane state shared by the connection handlers.
struct Ctl {
    /// One per data path (per queue with `--queues`).
    jobs: Vec<mpsc::Sender<Job>>,
    /// Where the next QP goes: round robin over the data paths.
    next_shard: std::sync::atomic::AtomicU32,
    xdp: Mutex<XdpProgram>,
    iface: String,
    mac: [u8; 6],
    /// Per QP: its CQ and completions read from it but not yet shown.
    qp_cq: Mutex<HashMap<u32, (u32, VecDeque<Wc>)>>,
    /// SRQs by number (`srq create`), shared with the QPs attached.
    srqs: Mutex<HashMap<u32, Arc<SrqShared>>>,
    next_srq: std::sync::atomic::AtomicU32,
    next_wr_id: std::sync::atomic::AtomicU64,
    firewall: bool,
    /// Whether this daemon offers selective repeat to its peers.
    selective_repeat: bool,
    stop: Arc<AtomicBool>,
    socket_mode: String,
}

impl Ctl {
    /// Runs `f` on the first data path: for what is the same on all of
    /// them (MRs, PSNs).
    async fn run<F>(&self, f: F) -> Result<Value>
    where
        F: FnOnce(&mut DataPath) -> Result<Value> + Send + 'static,
    {
        self.run_on(0, f).await
    }

    /// Runs `f` on data path `i`, between two of its polls.
    async fn run_on<F>(&self, i: u32, f: F) -> Result<Value>
    where
        F: FnOnce(&mut DataPath) -> Result<Value> + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.jobs[i as usize]
            .send(Box::new(move |dp: &mut DataPath| {
                let _ = tx.send(f(dp));
            }))
            .map_err(|_| anyhow!("data path has stopped"))?;
        rx.await.map_err(|_| anyhow!("data path has stopped"))?
    }

    /// Runs `f` on the data path that owns QP `qpn`.
    async fn run_qp<F>(&self, qpn: u32, f: F) -> Result<Value>
    where
        F: FnOnce(&mut DataPath) -> Result<Value> + Send + 'static,
    {
        self.run_on(owner_of(qpn, self.shards()), f).await
    }

    /// Runs `f` on every data path in turn; their answers in order.
    async fn run_all<F>(&self, f: F) -> Result<Vec<Value>>
    where
        F: Fn(&mut DataPath) -> Result<Value> + Clone + Send + 'static,
    {
        let mut out = Vec::with_capacity(self.jobs.len());
        for i in 0..self.shards() {
            out.push(self.run_on(i, f.clone()).await?);
        }
        Ok(out)
    }

    fn shards(&self) -> u32 {
        self.jobs.len() as u32
    }
}

/// The data paths' counters as one: numbers summed, socket lists joined.
fn merge_stats(parts: &[Value]) -> Value {
    let mut dp = serde_json::Map::new();
    let mut xsk = Vec::new();
    // The XDP responder's counters of each QP that has a slot.
    let mut xdp_qps = Vec::new();
    for p in parts {
        if let Some(m) = p["datapath"].as_object() {
            for (k, v) in m {
                match (v.as_u64(), dp.get(k).and_then(Value::as_u64)) {
                    (Some(a), Some(b)) => {
                        dp.insert(k.clone(), json!(a + b));
                    }
                    _ if !dp.contains_key(k) => {
                        dp.insert(k.clone(), v.clone());
                    }
                    _ => {}
                }
            }
        }
        xsk.extend(p["xsk"].as_array().into_iter().flatten().cloned());
        for q in p["qps"].as_array().into_iter().flatten() {
            if !q["xdp_responder"].is_null() {
                xdp_qps.push(json!({"qpn": q["qpn"], "xdp_responder": q["xdp_responder"]}));
            }
        }
    }
    json!({"datapath": dp, "xsk": xsk, "xdp_responder": xdp_qps})
}

pub fn socket_path(iface: &str) -> PathBuf {
    hostnet::run_dir().join(format!("{iface}.sock"))
}

pub fn run(opts: UpOptions) -> Result<()> {
    let iface = opts.iface.clone();
    if !std::path::Path::new(&format!("/sys/class/net/{iface}")).exists() {
        bail!("interface {iface} not found; check `ip link` (inside the right namespace)");
    }
    let lock = take_lock(&iface)?;
    clean_stale(&iface);
    let mut xdp = XdpProgram::attach(&iface, opts.xdp_mode)?;
    xdp.set_firewall(opts.firewall)?;
    // The XDP responder's maps and the MR pool, shared by the data paths.
    let xdp_responder = match xdp.map_xdp_responder() {
        Ok(m) => Some(crate::device::datapath::XdpResponder::new(m, &iface)),
        Err(e) => {
            log::warn!("{iface}: no MR pool ({e:#}); `mr reg --pool` will fail");
            None
        }
    };
    let queues = match opts.queues {
        Some(q) => q,
        None => rx_queues(&iface)?,
    };
    let mut xsks = Vec::new();
    for q in 0..queues {
        let x = Xsk::open_with(
            &iface,
            q,
            XskConfig {
                frame_size: opts.frame_size,
                frames: opts.umem_frames,
                ring_size: (opts.umem_frames / 4).clamp(16, 2048).next_power_of_two(),
                multi_buffer: opts.multi_buffer,
                zero_copy: opts.zero_copy,
            },
            opts.xsk_bind,
        )
        .with_context(|| format!("AF_XDP socket on {iface} queue {q}"))?;
        xdp.set_socket(q, x.fd())?;
        xsks.push(x);
    }
    let socket_mode = format!(
        "{} XDP, {} AF_XDP x{}{}",
        if xdp.native { "native" } else { "generic" },
        match xsks[0].mode {
            crate::io::xsk::BindMode::ZeroCopy => "zero-copy",
            crate::io::xsk::BindMode::Copy => "copy-mode",
        },
        queues,
        if xsks[0].multi_buffer {
            ", multi-buffer"
        } else {
            ""
        }
    );
    let mac = hostnet::iface_mac(&iface)?;
    // One data path per queue, each with its socket and its QPs, on a
    // thread of its own (pinned to --cpu + its index when --cpu is given).
    let dps: Vec<DataPath> = if xsks.len() > 1 {
        xsks.into_iter()
            .zip(Shard::mesh(queues))
            .map(|(x, sh)| DataPath::new_shard(x, opts.limits, sh))
            .collect()
    } else {
        vec![DataPath::new(xsks, opts.limits)]
    };
    let stop = Arc::new(AtomicBool::new(false));
    let mut jobs = Vec::new();
    let mut dp_threads = Vec::new();
    for (i, mut dp) in dps.into_iter().enumerate() {
        dp.core.set_cc(opts.cc, &iface);
        if let Some(r) = &xdp_responder {
            dp.core.set_xdp_responder(r.clone());
        }
        let (jtx, jrx) = mpsc::channel::<Job>();
        jobs.push(jtx);
        let stop = stop.clone();
        let (adaptive, cpu) = (opts.adaptive, opts.cpu.map(|c| c + i));
        dp_threads.push(
            std::thread::Builder::new()
                .name(format!("rdma-datapath-{i}"))
                .spawn(move || data_path_loop(dp, jrx, stop, adaptive, cpu))?,
        );
    }
    let ctl = Arc::new(Ctl {
        jobs,
        next_shard: std::sync::atomic::AtomicU32::new(0),
        xdp: Mutex::new(xdp),
        iface: iface.clone(),
        mac,
        qp_cq: Mutex::new(HashMap::new()),
        srqs: Mutex::new(HashMap::new()),
        next_srq: std::sync::atomic::AtomicU32::new(1),
        next_wr_id: std::sync::atomic::AtomicU64::new(1),
        firewall: opts.firewall,
        selective_repeat: opts.selective_repeat,
        stop: stop.clone(),
        socket_mode: socket_mode.clone(),
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let sock = socket_path(&iface);
    let result = rt.block_on(control_plane(ctl.clone(), sock.clone(), opts.cm_port));
    stop.store(true, Ordering::Relaxed);
    // Flush outstanding work: every QP goes to ERR, its WRs complete with
    // WR_FLUSH_ERR, then the program and sockets go.
    let mut dps = Vec::new();
    for t in dp_threads {
        dps.push(t.join().map_err(|_| anyhow!("data path thread panicked"))?);
    }
    let mut flushed = 0;
    let mut buf = [crate::device::standalone::NO_WC; 64];
    for dp in dps.iter_mut() {
        for qpn in dp.core.qpns() {
            let _ = dp.core.destroy_qp(qpn);
        }
        if let Ok(map) = ctl.qp_cq.lock() {
            for (qpn, (cq, _)) in map.iter() {
                if owner_of(*qpn, queues) != dp.shard.as_ref().map_or(0, |s| s.index) {
                    continue;
                }
                if let Some(c) = dp.core.cq_mut(*cq) {
                    loop {
                        let n = c.poll(&mut buf);
                        if n == 0 {
                            break;
                        }
                        flushed += buf[..n]
                            .iter()
                            .filter(|w| w.status == crate::transport::WcStatus::WrFlushErr)
                            .count();
                    }
                }
            }
        }
    }
    // The mirrors of the MRs before the data path that owns their memory.
    while let Some(dp) = dps.pop() {
        drop(dp);
    }
    drop(ctl);
    let _ = std::fs::remove_file(&sock);
    drop(lock);
    eprintln!("{iface}: stopped; {flushed} outstanding work requests flushed (WR_FLUSH_ERR); XDP detached");
    result
}

async fn control_plane(ctl: Arc<Ctl>, sock: PathBuf, cm_port: u16) -> Result<()> {
    let _ = std::fs::remove_file(&sock);
    let listener = UnixListener::bind(&sock).with_context(|| format!("bind {}", sock.display()))?;
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600))?;
    let cm = TcpListener::bind(("0.0.0.0", cm_port))
        .await
        .with_context(|| {
            format!("listen on TCP port {cm_port} for peer QP exchange (--cm-port)")
        })?;
    eprintln!(
        "{}: up ({}); control socket {}; QP exchange on TCP {}",
        ctl.iface,
        ctl.socket_mode,
        sock.display(),
        cm_port
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut log_tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
            _ = log_tick.tick() => {
                if let Ok(mut x) = ctl.xdp.lock() { x.flush_log(); }
                if ctl.stop.load(Ordering::Relaxed) { break; }
            }
            c = listener.accept() => {
                let (stream, _) = c?;
                let ctl = ctl.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve_cli(ctl, stream).await {
                        log::debug!("control connection: {e:#}");
                    }
                });
            }
            c = cm.accept() => {
                let (stream, peer) = c?;
                let ctl = ctl.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve_peer(ctl, stream, peer).await {
                        log::warn!("QP exchange with {peer}: {e:#}");
                    }
                });
            }
        }
    }
    Ok(())
}

/// Only root may drive the daemon (the socket is 0600 too; this also
/// refuses a root-owned fd passed to someone else).
fn peer_is_root(stream: &UnixStream) -> bool {
    // SAFETY: ucred is plain integers; all zeroes is a valid value.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt into a local struct of the right size.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    r == 0 && cred.uid == 0
}

const MAX_REQUEST: usize = 64 << 20;

async fn serve_cli(ctl: Arc<Ctl>, stream: UnixStream) -> Result<()> {
    if !peer_is_root(&stream) {
        let (_, mut w) = stream.into_split();
        w.write_all(b"{\"ok\":false,\"error\":\"permission denied: only root may use the control socket\"}\n")
            .await?;
        return Ok(());
    }
    let (r, mut w) = stream.into_split();
    let mut lines = BufReader::new(r).lines();
    while let Some(line) = lines.next_line().await? {
        // Hex data of `mr write` makes the longest requests.
        let resp = if line.len() > MAX_REQUEST {
            json!({"ok": false, "error": format!(
                "request too long ({} bytes, limit {MAX_REQUEST}); write large data in pieces with --offset",
                line.len()
            )})
        } else {
            match serde_json::from_str::<Request>(&line) {
                Ok(req) => match handle(&ctl, req).await {
                    Ok(mut v) => {
                        if let Value::Object(m) = &mut v {
                            m.insert("ok".into(), Value::Bool(true));
                        }
                        v
                    }
                    Err(e) => json!({"ok": false, "error": format!("{e:#}")}),
                },
                Err(e) => json!({"ok": false, "error": format!("malformed request: {e}")}),
            }
        };
        w.write_all(format!("{resp}\n").as_bytes()).await?;
    }
    Ok(())
}

fn parse_key(s: &str) -> Result<u32> {
    let t = s.trim();
    let v = if let Some(h) = t.strip_prefix("0x") {
        u32::from_str_radix(h, 16)
    } else {
        t.parse()
    };
    v.map_err(|_| anyhow!("'{s}' is not a key (decimal or 0x-hex)"))
}

/// A local MR by lkey or rkey; returns (lkey, addr, len).
fn find_mr(dp: &DataPath, key: u32) -> Result<(u32, u64, usize)> {
    let mr = dp
        .core
        .mem
        .by_lkey(key)
        .or_else(|| dp.core.mem.by_rkey(key))
        .ok_or_else(|| anyhow!("unknown memory region key {key:#x}; see `rdma-xdp mr list`"))?;
    Ok((mr.lkey, mr.addr, mr.len()))
}

fn check_range(offset: u64, len: u64, mr_len: usize) -> Result<()> {
    if offset.checked_add(len).is_none_or(|e| e > mr_len as u64) {
        bail!(
            "offset {offset} + length {len} is out of range: the memory region has {mr_len} bytes"
        );
    }
    Ok(())
}

async fn handle(ctl: &Arc<Ctl>, req: Request) -> Result<Value> {
    match req {
        Request::Stats => {
            let xdp = {
                let x = ctl.xdp.lock().map_err(|_| anyhow!("lock"))?;
                let mut m = x.stats_map()?;
                m.insert("verified_insns".into(), json!(x.verified_insns));
                // Where the XDP responder's ACKs go: "ok", or why they
                // would be lost (then it lends no QP).
                let tx = crate::io::hostnet::xdp_tx_problem(&ctl.iface);
                m.insert("xdp_tx".into(), json!(tx.as_deref().unwrap_or("ok")));
                Value::Object(m)
            };
            let dp = merge_stats(&ctl.run_all(|dp| Ok(dp.stats_json())).await?);
            Ok(json!({"iface": ctl.iface, "mode": ctl.socket_mode, "xdp": xdp, "datapath": dp["datapath"], "xsk": dp["xsk"], "xdp_responder": dp["xdp_responder"]}))
        }
        Request::MrReg { len, access, pool } => {
            let access = Access::parse(&access).map_err(|e| anyhow!(e))?;
            let v = if pool {
                ctl.run(move |dp| {
                    let (addr, lkey, rkey, off) = dp.core.reg_mr_pool(1, len, access)?;
                    Ok(json!({"addr": addr, "len": len, "lkey": lkey, "rkey": rkey, "access": access.to_string(), "pool_offset": off}))
                })
                .await?
            } else {
                ctl.run(move |dp| {
                    let pd = 1;
                    let (addr, lkey, rkey) = dp.core.reg_mr(pd, len, access)?;
                    Ok(json!({"addr": addr, "len": len, "lkey": lkey, "rkey": rkey, "access": access.to_string()}))
                })
                .await?
            };
            // The other data paths see the same memory under the same keys.
            let (addr, lkey, rkey) = (
                v["addr"].as_u64().unwrap_or(0),
                v["lkey"].as_u64().unwrap_or(0) as u32,
                v["rkey"].as_u64().unwrap_or(0) as u32,
            );
            for i in 1..ctl.shards() {
                ctl.run_on(i, move |dp| {
                    // SAFETY: the first data path (or the pool) owns the
                    // memory and frees it only after every other data path
                    // has dropped this registration (`MrDereg` goes last
                    // to the first).
                    unsafe { dp.core.mirror_mr(1, addr as *mut u8, len, access, lkey, rkey)? };
                    Ok(json!({}))
                })
                .await?;
            }
            Ok(v)
        }
        Request::MrList => {
            ctl.run(|dp| {
                let v: Vec<Value> = dp
                    .core
                    .mem
                    .iter()
                    .map(|m| {
                        let mut v = json!({"addr": m.addr, "len": m.len(), "lkey": m.lkey, "rkey": m.rkey, "access": m.access.to_string()});
                        if let Some(off) = dp.core.pool_offset(m.lkey) {
                            v["pool_offset"] = json!(off);
                        }
                        v
                    })
                    .collect();
                Ok(json!({"mrs": v}))
            })
            .await
        }
        Request::MrDereg { key } => {
            let key = parse_key(&key)?;
            // The mirrors first, the owner of the memory last.
            let mut lkey = key;
            for i in (0..ctl.shards()).rev() {
                let v = ctl
                    .run_on(i, move |dp| {
                        let (lkey, _, _) = find_mr(dp, key)?;
                        dp.core.dereg_mr(lkey)?;
                        Ok(json!({"lkey": lkey}))
                    })
                    .await?;
                lkey = v["lkey"].as_u64().unwrap_or(0) as u32;
            }
            Ok(json!({"lkey": lkey}))
        }
        Request::MrRead { key, offset, len } => {
            let key = parse_key(&key)?;
            ctl.run(move |dp| {
                let (lkey, _, mr_len) = find_mr(dp, key)?;
                check_range(offset, len, mr_len)?;
                let mr = dp.core.mem.by_lkey(lkey).expect("found");
                let bytes = mr.read_vec(offset as usize, len as usize);
                Ok(json!({"offset": offset, "data": hex(&bytes)}))
            })
            .await
        }
        Request::MrWrite { key, offset, data } => {
            let key = parse_key(&key)?;
            let bytes = unhex(&data)?;
            ctl.run(move |dp| {
                let (lkey, _, mr_len) = find_mr(dp, key)?;
                check_range(offset, bytes.len() as u64, mr_len)?;
                let mr = dp.core.mem.by_lkey_mut(lkey).expect("found");
                mr.write(offset as usize, &bytes);
                Ok(json!({"written": bytes.len()}))
            })
            .await
        }
        Request::QpCreate { depth, qp_type, qkey, srq } => {
            let depth = depth.unwrap_or(256);
            let qp_type = match qp_type.as_deref().unwrap_or("rc") {
                "rc" => QpType::Rc,
                "ud" => QpType::Ud,
                t => bail!("unknown QP type '{t}' (rc or ud)"),
            };
            let srq = srq
                .map(|n| {
                    ctl.srqs.lock().map_err(|_| anyhow!("lock"))?.get(&n).cloned().ok_or_else(|| {
                        anyhow!("no SRQ {n}; create one with `rdma-xdp srq create`")
                    })
                })
                .transpose()?;
            let port_mtu = hostnet::port_mtu(hostnet::iface_mtu(&ctl.iface));
            let shard = ctl.next_shard.fetch_add(1, Ordering::Relaxed) % ctl.shards();
            let (qpn, cq) = ctl
                .run_on(shard, move |dp| {
                    let cq = dp.core.create_cq(depth as usize * 2)?;
                    let cap = QpCap {
                        max_send_wr: depth,
                        max_recv_wr: depth,
                    };
                    let qpn = dp.core.create_qp_typed(1, cq, cq, cap, qp_type, port_mtu)?;
                    if let Some(s) = srq {
                        dp.core.attach_srq(qpn, s)?;
                    }
                    if qp_type == QpType::Ud {
                        // A UD QP needs no peer: straight to RTS.
                        let psn = dp.core.random_psn();
                        for a in QpAttr::ud_bring_up(qkey.unwrap_or(DEFAULT_QKEY), psn) {
                            dp.core.modify_qp(qpn, &a)?;
                        }
                    }
                    Ok(json!([qpn, cq]))
                })
                .await
                .map(|v| (v[0].as_u64().unwrap_or(0) as u32, v[1].as_u64().unwrap_or(0) as u32))?;
            ctl.qp_cq
                .lock()
                .map_err(|_| anyhow!("lock"))?
                .insert(qpn, (cq, VecDeque::new()));
            if ctl.firewall {
                let mut x = ctl.xdp.lock().map_err(|_| anyhow!("lock"))?;
                x.set_live_qp(qpn, rdma_common::LiveQp::default())?;
            }
            Ok(json!({"qpn": qpn, "type": qp_type.to_string()}))
        }
        Request::AhCreate { remote_ip, remote_mac } => {
            let peer: IpAddr = remote_ip
                .parse()
                .map_err(|_| anyhow!("--remote-ip '{remote_ip}' is not an IP address"))?;
            let path = resolve_path(ctl, peer, remote_mac).await?;
            // Every data path has every AH, under one number: AHs are made
            // and destroyed on all of them in the same order.
            let all = ctl
                .run_all(move |dp| {
                    let ah = dp.core.create_ah(path)?;
                    Ok(json!({"ah": ah, "peer_ip": peer.to_string(), "peer_mac": hostnet::fmt_mac(&path.peer_mac)}))
                })
                .await?;
            if all.iter().any(|v| v["ah"] != all[0]["ah"]) {
                bail!("the data paths disagree on the new AH's number: {all:?}");
            }
            Ok(all[0].clone())
        }
        Request::AhDestroy { ah } => {
            ctl.run_all(move |dp| {
                dp.core.destroy_ah(ah)?;
                Ok(json!({"ah": ah}))
            })
            .await?;
            Ok(json!({"ah": ah}))
        }
        Request::SrqCreate { depth, limit } => {
            let n = ctl.next_srq.fetch_add(1, Ordering::Relaxed);
            let srq = Arc::new(SrqShared::new(depth.unwrap_or(256).max(1), n as usize));
            srq.set_limit(limit.unwrap_or(0));
            ctl.srqs.lock().map_err(|_| anyhow!("lock"))?.insert(n, srq);
            Ok(json!({"srq": n}))
        }
        Request::SrqPost { srq, key, offset, len } => {
            let s = ctl
                .srqs
                .lock()
                .map_err(|_| anyhow!("lock"))?
                .get(&srq)
                .cloned()
                .ok_or_else(|| anyhow!("no SRQ {srq}; see `rdma-xdp srq create`"))?;
            let key = parse_key(&key)?;
            let wr_id = ctl.next_wr_id.fetch_add(1, Ordering::Relaxed);
            ctl.run(move |dp| {
                let (lkey, addr, mr_len) = find_mr(dp, key)?;
                check_range(offset, len, mr_len)?;
                let sg = [Sge {
                    addr: addr + offset,
                    length: len as u32,
                    lkey,
                }];
                s.post(&RecvWr {
                    wr_id,
                    sg_list: &sg,
                })
                .map_err(|e| anyhow!("SRQ {srq}: {e} (its depth is fixed at creation)"))?;
                Ok(json!({"wr_id": wr_id, "queued": s.len()}))
            })
            .await
        }
        Request::SrqDestroy { srq } => {
            let mut m = ctl.srqs.lock().map_err(|_| anyhow!("lock"))?;
            let s = m.get(&srq).ok_or_else(|| anyhow!("no SRQ {srq}"))?;
            // One reference here; more are QPs attached to it (rdma-core: EBUSY).
            if Arc::strong_count(s) > 1 {
                bail!("SRQ {srq} is still used by a QP; destroy its QPs first");
            }
            m.remove(&srq);
            Ok(json!({"srq": srq}))
        }
        Request::QpDestroy { qpn } => {
            ctl.run_qp(qpn, move |dp| {
                dp.core.destroy_qp(qpn)?;
                Ok(json!({}))
            })
            .await?;
            ctl.qp_cq.lock().map_err(|_| anyhow!("lock"))?.remove(&qpn);
            if ctl.firewall {
                ctl.xdp.lock().map_err(|_| anyhow!("lock"))?.remove_live_qp(qpn)?;
            }
            Ok(json!({"qpn": qpn}))
        }
        Request::QpConnect {
            qpn,
            remote_ip,
            remote_qpn,
            remote_psn,
            remote_mac,
            psn,
            mtu,
        } => {
            let peer: IpAddr = remote_ip
                .parse()
                .map_err(|_| anyhow!("--remote-ip '{remote_ip}' is not an IP address"))?;
            let path = resolve_path(ctl, peer, remote_mac).await?;
            // Known remote values, no exchange: nothing was negotiated.
            let v = connect_local(ctl, qpn, path, remote_qpn, remote_psn, psn, mtu.unwrap_or(1024), false).await?;
            Ok(v)
        }
        Request::QpPeer { qpn, peer, remote_qpn, mtu } => {
            connect_via_peer(ctl, qpn, &peer, remote_qpn, mtu.unwrap_or(1024)).await
        }
        Request::QpList => {
            let parts = ctl.run_all(|dp| {
                let v: Vec<Value> = dp
                    .core
                    .qpns()
                    .into_iter()
                    .filter_map(|q| {
                        let qp = dp.core.qp(q)?;
                        let s = qp.stats();
                        let path = dp.core.qp_path(q);
                        Some(json!({
                            "qpn": q, "type": qp.qp_type().to_string(), "qkey": qp.qkey(),
                            "state": qp.state().to_string(), "dest_qpn": qp.dest_qpn(),
                            "sq_psn": qp.sq_psn(), "rq_psn": qp.rq_psn(), "mtu": qp.path_mtu(),
                            "peer": path.map(|p| p.peer_ip.to_string()),
                            "sq": qp.send_queue_len(), "rq": qp.recv_queue_len(),
                            "stats": {
                                "tx": s.tx_packets, "rx": s.rx_packets,
                                "tx_bytes": s.tx_bytes, "rx_bytes": s.rx_bytes,
                                "retransmits": s.retransmits,
                                "seq_naks_received": s.seq_naks_received,
                                "rnr_naks_received": s.rnr_naks_received,
                                "timeouts": s.timeouts, "seq_naks_sent": s.seq_naks_sent,
                                "rnr_naks_sent": s.rnr_naks_sent, "duplicates": s.duplicates_received,
                                "out_of_sequence": s.out_of_sequence_received,
                                "errors": s.errors, "dropped": s.dropped,
                                "bad_pkey": s.bad_pkey, "wrong_transport": s.wrong_transport,
                                "reserved_opcodes": s.reserved_opcodes,
                                "bad_qkey": s.bad_qkey, "no_recv_wqe": s.no_recv_wqe,
                                "oversize_sends": s.oversize_sends,
                                "np_ecn_marked_roce_packets": s.np_ecn_marked_roce_packets,
                                "np_cnp_sent": s.np_cnp_sent, "rp_cnp_handled": s.rp_cnp_handled,
                                "rp_cnp_ignored": s.rp_cnp_ignored
                            },
                            "rtt_us": {
                                "p50": s.rtt_quantile_us(0.5), "p99": s.rtt_quantile_us(0.99),
                                "samples": s.rtt_log2_us.iter().sum::<u64>()
                            },
                            "dcqcn": {
                                "rate_mbps": qp.cc().rc, "target_mbps": qp.cc().rt,
                                "alpha": qp.cc().alpha, "limiting": qp.cc().limiting()
                            },
                            "xdp_responder": dp.core.xdp_responder_stats(q)
                        }))
                    })
                    .collect();
                Ok(json!({"qps": v}))
            })
            .await?;
            let mut qps: Vec<Value> = parts
                .iter()
                .flat_map(|p| p["qps"].as_array().cloned().unwrap_or_default())
                .collect();
            qps.sort_by_key(|q| q["qpn"].as_u64());
            Ok(json!({"qps": qps}))
        }
        Request::Post(p) => post(ctl, p).await,
        Request::CqPoll { qpn, max, wait_ms } => {
            let wcs = wait_wcs(ctl, qpn, None, max.unwrap_or(16), wait_ms.unwrap_or(0)).await?;
            Ok(json!({"wcs": wcs}))
        }
    }
}

/// The path to `peer`: its MAC as given, or from the neighbour table
/// (resolved if missing, an error after 3 s).
async fn resolve_path(ctl: &Arc<Ctl>, peer: IpAddr, remote_mac: Option<String>) -> Result<Path> {
    let peer_mac = match remote_mac {
        Some(m) => hostnet::parse_mac(&m)?,
        None => {
            let iface = ctl.iface.clone();
            tokio::task::spawn_blocking(move || {
                hostnet::resolve_mac(&iface, peer, Duration::from_secs(3))
            })
            .await??
        }
    };
    Ok(Path {
        local_mac: ctl.mac,
        peer_mac,
        local_ip: hostnet::local_addr_for(&ctl.iface, peer)?,
        peer_ip: peer,
        vlan: None,
        traffic_class: 0,
    })
}

#[allow(clippy::too_many_arguments)]
async fn connect_local(
    ctl: &Arc<Ctl>,
    qpn: u32,
    path: Path,
    remote_qpn: u32,
    remote_psn: u32,
    psn: Option<u32>,
    mtu: u32,
    selective_repeat: bool,
) -> Result<Value> {
    let v = ctl
        .run_qp(qpn, move |dp| {
            let local_psn = psn.unwrap_or_else(|| dp.core.random_psn());
            dp.core
                .connect_qp(
                    qpn,
                    path,
                    &Connect {
                        max_rd_atomic: 16,
                        selective_repeat,
                        ..Connect::new(remote_qpn, remote_psn, local_psn, mtu)
                    },
                )?;
            Ok(json!({"qpn": qpn, "psn": local_psn, "remote_qpn": remote_qpn, "remote_psn": remote_psn,
                      "local_ip": path.local_ip.to_string(), "peer_ip": path.peer_ip.to_string(), "mtu": mtu,
                      "recovery": if selective_repeat { "selective-repeat" } else { "go-back-N" }}))
        })
        .await?;
    if ctl.firewall {
        let mut x = ctl.xdp.lock().map_err(|_| anyhow!("lock"))?;
        x.set_live_qp(
            qpn,
            rdma_common::LiveQp {
                peer_gid: crate::wire::gid_of(path.peer_ip),
                peer_sport: crate::wire::udp_sport_for_qps(remote_qpn, qpn).to_be_bytes(),
                connected: 1,
                _pad: 0,
            },
        )?;
    }
    Ok(v)
}

/// Our side of the daemon-to-daemon exchange: send our QP's details, get the
/// peer's, connect.
async fn connect_via_peer(
    ctl: &Arc<Ctl>,
    qpn: u32,
    peer: &str,
    remote_qpn: u32,
    mtu: u32,
) -> Result<Value> {
    let addr: SocketAddr =
        if peer.contains(':') && !peer.starts_with('[') && peer.matches(':').count() == 1 {
            peer.parse()?
        } else if let Ok(ip) = peer.parse::<IpAddr>() {
            SocketAddr::new(ip, 18516)
        } else {
            peer.parse()
                .map_err(|_| anyhow!("--peer '{peer}' is not IP or IP:PORT"))?
        };
    let local_ip = hostnet::local_addr_for(&ctl.iface, addr.ip())?;
    let psn = ctl
        .run(|dp| Ok(json!(dp.core.random_psn())))
        .await?
        .as_u64()
        .unwrap_or(0) as u32;
    let mut s = tokio::time::timeout(Duration::from_secs(3), TcpStream::connect(addr))
        .await
        .map_err(|_| anyhow!("peer daemon at {addr} did not answer within 3 s"))?
        .with_context(|| {
            format!("connect to the peer daemon at {addr}; is `rdma-xdp up` running there?")
        })?;
    let hello = json!({"qpn": qpn, "psn": psn, "mac": hostnet::fmt_mac(&ctl.mac), "ip": local_ip.to_string(), "target_qpn": remote_qpn, "mtu": mtu, "selective_repeat": ctl.selective_repeat});
    s.write_all(format!("{hello}\n").as_bytes()).await?;
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(5),
        BufReader::new(&mut s).read_line(&mut line),
    )
    .await
    .map_err(|_| anyhow!("peer daemon at {addr} did not reply within 5 s"))??;
    let r: Value = serde_json::from_str(&line).context("bad reply from the peer daemon")?;
    if r["ok"] != json!(true) {
        bail!("peer refused: {}", r["error"].as_str().unwrap_or("?"));
    }
    let path = Path {
        local_mac: ctl.mac,
        peer_mac: hostnet::parse_mac(r["mac"].as_str().unwrap_or(""))?,
        local_ip,
        peer_ip: addr.ip(),
        vlan: None,
        traffic_class: 0,
    };
    connect_local(
        ctl,
        qpn,
        path,
        r["qpn"].as_u64().unwrap_or(0) as u32,
        r["psn"].as_u64().unwrap_or(0) as u32,
        Some(psn),
        mtu,
        // The peer's answer says what it agreed to; an older daemon says
        // nothing and gets go-back-N.
        crate::transport::negotiate_selective_repeat(
            ctl.selective_repeat,
            r["selective_repeat"].as_bool(),
        ),
    )
    .await
}

/// The peer's side: connect the QP it names to it and answer with ours.
async fn serve_peer(ctl: Arc<Ctl>, mut s: TcpStream, peer: SocketAddr) -> Result<()> {
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(5),
        BufReader::new(&mut s).read_line(&mut line),
    )
    .await
    .map_err(|_| anyhow!("no request within 5 s"))??;
    let result: Result<Value> = async {
        let h: Value = serde_json::from_str(&line).context("malformed QP exchange request")?;
        let target = h["target_qpn"]
            .as_u64()
            .ok_or_else(|| anyhow!("target_qpn missing"))? as u32;
        let peer_ip: IpAddr = h["ip"].as_str().unwrap_or("").parse().unwrap_or(peer.ip());
        let sr = crate::transport::negotiate_selective_repeat(
            ctl.selective_repeat,
            h["selective_repeat"].as_bool(),
        );
        let path = Path {
            local_mac: ctl.mac,
            peer_mac: hostnet::parse_mac(h["mac"].as_str().unwrap_or(""))?,
            local_ip: hostnet::local_addr_for(&ctl.iface, peer_ip)?,
            peer_ip,
            vlan: None,
            traffic_class: 0,
        };
        let v = connect_local(
            &ctl,
            target,
            path,
            h["qpn"].as_u64().unwrap_or(0) as u32,
            h["psn"].as_u64().unwrap_or(0) as u32,
            None,
            h["mtu"].as_u64().unwrap_or(1024) as u32,
            sr,
        )
        .await?;
        Ok(json!({"ok": true, "qpn": target, "psn": v["psn"], "mac": hostnet::fmt_mac(&ctl.mac), "selective_repeat": sr}))
    }
    .await;
    let resp = match result {
        Ok(v) => v,
        Err(e) => json!({"ok": false, "error": format!("{e:#}")}),
    };
    s.write_all(format!("{resp}\n").as_bytes()).await?;
    Ok(())
}

async fn post(ctl: &Arc<Ctl>, p: crate::control::proto::Post) -> Result<Value> {
    let wr_id = ctl.next_wr_id.fetch_add(1, Ordering::Relaxed);
    let op = p.op.clone();
    let local_key = parse_key(&p.key)?;
    let rkey = p.rkey.as_deref().map(parse_key).transpose()?;
    let data = p.data.as_deref().map(unhex).transpose()?;
    let qpn = p.qpn;
    let v = ctl
        .run_qp(qpn, move |dp| {
            let (lkey, addr, mr_len) = find_mr(dp, local_key)?;
            let mut len = p.len.unwrap_or(0);
            if let Some(d) = &data {
                check_range(p.offset, d.len() as u64, mr_len)?;
                let mr = dp.core.mem.by_lkey_mut(lkey).expect("found");
                mr.write(p.offset as usize, d);
                len = d.len() as u64;
            }
            let opcode = match op.as_str() {
                "write" if p.imm.is_some() => WrOpcode::RdmaWriteWithImm,
                "write" => WrOpcode::RdmaWrite,
                "read" => WrOpcode::RdmaRead,
                "send" if p.imm.is_some() => WrOpcode::SendWithImm,
                "send" => WrOpcode::Send,
                "cmp-swap" => WrOpcode::CmpSwap,
                "fetch-add" => WrOpcode::FetchAdd,
                "recv" => {
                    check_range(p.offset, len, mr_len)?;
                    let sg = [Sge {
                        addr: addr + p.offset,
                        length: len as u32,
                        lkey,
                    }];
                    dp.core.post_recv(
                        qpn,
                        &RecvWr {
                            wr_id,
                            sg_list: &sg,
                        },
                    )?;
                    return Ok(json!({"wr_id": wr_id}));
                }
                other => bail!(
                    "unknown operation '{other}' (write, read, send, recv, cmp-swap, fetch-add)"
                ),
            };
            if matches!(opcode, WrOpcode::CmpSwap | WrOpcode::FetchAdd) {
                len = 8;
            }
            check_range(p.offset, len, mr_len)?;
            let needs_remote = !matches!(opcode, WrOpcode::Send | WrOpcode::SendWithImm);
            let rkey = match (needs_remote, rkey) {
                (true, None) => bail!("{op} needs --rkey and --remote-addr"),
                (_, r) => r.unwrap_or(0),
            };
            let sg = [Sge {
                addr: addr + p.offset,
                length: len as u32,
                lkey,
            }];
            let mut wr = SendWr::new(wr_id, opcode, &sg);
            wr.flags = SendFlags {
                signaled: true,
                ..Default::default()
            };
            wr.remote_addr = p.remote_addr.unwrap_or(0);
            wr.rkey = rkey;
            wr.imm = p.imm.unwrap_or(0);
            wr.compare_add = if opcode == WrOpcode::FetchAdd {
                p.add.unwrap_or(1)
            } else {
                p.compare.unwrap_or(0)
            };
            wr.swap = p.swap.unwrap_or(0);
            if let Some(ah) = p.ah {
                let remote_qpn = p
                    .remote_qpn
                    .ok_or_else(|| anyhow!("a UD send needs --remote-qpn with --ah"))?;
                // The high bit: the sending QP's own Q_Key (IBA 10.2.5).
                let remote_qkey = p.remote_qkey.unwrap_or(0x8000_0000);
                wr.ud = Some(UdDest {
                    ah,
                    remote_qpn,
                    remote_qkey,
                });
            }
            dp.core.post_send(qpn, &wr)?;
            dp.core.collect_wcs(qpn);
            Ok(json!({"wr_id": wr_id, "lkey": lkey, "addr": addr + p.offset}))
        })
        .await?;
    if p.op == "recv" || p.no_wait {
        return Ok(v);
    }
    let wcs = wait_wcs(ctl, qpn, Some(wr_id), 1, p.timeout_ms.unwrap_or(5000)).await?;
    let wc = wcs.into_iter().next().ok_or_else(|| {
        anyhow!(
            "no completion for work request {wr_id} within {} ms",
            p.timeout_ms.unwrap_or(5000)
        )
    })?;
    let mut out = json!({"wc": wc});
    if matches!(p.op.as_str(), "cmp-swap" | "fetch-add") && wc.status == "success" {
        let key = local_key;
        let off = p.offset;
        let orig = ctl
            .run(move |dp| {
                let (lkey, _, _) = find_mr(dp, key)?;
                let mut b = [0u8; 8];
                dp.core
                    .mem
                    .by_lkey(lkey)
                    .expect("found")
                    .read(off as usize, &mut b);
                Ok(json!(u64::from_ne_bytes(b)))
            })
            .await?;
        out["original"] = orig;
    }
    Ok(out)
}

/// Completions of a QP: all of them (up to `max`), or the one for `wr_id`
/// (others are kept for later `cq poll`).
async fn wait_wcs(
    ctl: &Arc<Ctl>,
    qpn: u32,
    wr_id: Option<u64>,
    max: usize,
    wait_ms: u64,
) -> Result<Vec<WcJson>> {
    let cq = ctl
        .qp_cq
        .lock()
        .map_err(|_| anyhow!("lock"))?
        .get(&qpn)
        .map(|e| e.0)
        .ok_or_else(|| anyhow!("no QP {qpn:#x}; see `rdma-xdp qp list`"))?;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
    loop {
        let fresh: Vec<Wc> = ctl
            .run_qp(qpn, move |dp| {
                let c = dp.core.cq_mut(cq).ok_or_else(|| anyhow!("CQ gone"))?;
                let mut buf = [crate::device::standalone::NO_WC; 64];
                let n = c.poll(&mut buf);
                Ok(serde_json::to_value(
                    buf[..n].iter().map(WcJson::from).collect::<Vec<_>>(),
                )?)
            })
            .await
            .and_then(|v| Ok(serde_json::from_value::<Vec<WcJson>>(v)?))?
            .iter()
            .map(WcJson::to_wc)
            .collect::<Result<_>>()?;
        let mut out = Vec::new();
        {
            let mut map = ctl.qp_cq.lock().map_err(|_| anyhow!("lock"))?;
            let backlog = &mut map.get_mut(&qpn).ok_or_else(|| anyhow!("QP destroyed"))?.1;
            backlog.extend(fresh);
            match wr_id {
                Some(id) => {
                    if let Some(i) = backlog.iter().position(|w| {
                        w.wr_id == id
                            && !matches!(w.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
                    }) {
                        out.push(WcJson::from(&backlog.remove(i).expect("index")));
                    }
                }
                None => {
                    while out.len() < max {
                        match backlog.pop_front() {
                            Some(w) => out.push(WcJson::from(&w)),
                            None => break,
                        }
                    }
                }
            }
        }
        if !out.is_empty() || tokio::time::Instant::now() >= deadline {
            return Ok(out);
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_path_counters_add_up_and_sockets_join() {
        let a = json!({"datapath": {"rx_frames": 3, "rx_wrong_queue": 1, "gsi": {"x": 1}},
                       "xsk": [{"rx_frames": 3}]});
        let b = json!({"datapath": {"rx_frames": 4, "rx_wrong_queue": 2, "gsi": {"x": 2}},
                       "xsk": [{"rx_frames": 4}]});
        let m = merge_stats(&[a, b]);
        assert_eq!(m["datapath"]["rx_frames"], 7);
        assert_eq!(m["datapath"]["rx_wrong_queue"], 3);
        // Not a number: the first data path's.
        assert_eq!(m["datapath"]["gsi"]["x"], 1);
        assert_eq!(m["xsk"].as_array().unwrap().len(), 2);
        assert_eq!(m["xsk"][1]["rx_frames"], 4);
    }
}
