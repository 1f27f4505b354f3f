//! Commands that start the daemon (`up`) or talk to it over its control
//! socket: `stats`, `mr`, `qp`, `post`, `cq`. Each builds one request,
//! prints the answer, and fails with the daemon's error text.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use rdma_user::control::daemon::{self, UpOptions};
use rdma_user::control::proto::{hex, unhex, Post, Request};
use rdma_user::device::datapath::Limits;
use rdma_user::io::xdp::XdpMode;
use rdma_user::io::xsk::XskBind;
use serde_json::Value;

use crate::{num, Global};

#[derive(Args)]
pub struct UpArgs {
    /// Interface to attach to (inside the current network namespace).
    #[arg(long = "dev", short = 'd', alias = "interface")]
    pub dev: Option<String>,
    #[arg(long, value_enum, default_value_t = XdpMode::Auto)]
    pub xdp_mode: XdpMode,
    /// RX queues to serve (default: all).
    #[arg(long)]
    pub queues: Option<u32>,
    /// UMEM chunk size (2048 or 4096).
    #[arg(long, default_value_t = 4096)]
    pub frame_size: u32,
    /// UMEM chunks per AF_XDP socket (RX and TX share them; small values
    /// exercise backpressure).
    #[arg(long, default_value_t = 8192)]
    pub umem_frames: u32,
    /// Disable multi-buffer (frames larger than a chunk are then dropped).
    #[arg(long)]
    pub no_multi_buffer: bool,
    /// Do not try zero-copy.
    #[arg(long)]
    pub copy: bool,
    /// Sleep when idle instead of busy-polling (tests, laptops).
    #[arg(long)]
    pub adaptive: bool,
    /// Pin the data path thread to this CPU.
    #[arg(long)]
    pub cpu: Option<usize>,
    /// TCP port for QP exchange with peer daemons.
    #[arg(long, default_value_t = 18516)]
    pub cm_port: u16,
    #[arg(long, default_value_t = 256)]
    pub max_qp: usize,
    #[arg(long, default_value_t = 1024)]
    pub max_mr: usize,
    /// Drop RoCEv2 packets for QPNs that are not live, or from the wrong peer,
    /// in XDP.
    #[arg(long)]
    pub firewall: bool,
    /// Do not offer selective repeat in the QP exchange with peer daemons
    /// (their QPs then recover by go-back-N, as with any other peer).
    #[arg(long)]
    pub no_selective_repeat: bool,
    #[command(flatten)]
    pub cc: CcArgs,
}

/// ECN and DCQCN of a device (the daemon's, a flow tool's).
#[derive(Args)]
pub struct CcArgs {
    /// Send data packets Not-ECT (default: ECT(0), as RoCE NICs do).
    #[arg(long)]
    pub no_ecn: bool,
    /// Turn DCQCN's reaction point off: CNPs are counted and ignored.
    #[arg(long)]
    pub no_dcqcn: bool,
    /// DSCP of the CNPs this host sends.
    #[arg(long, default_value_t = 48)]
    pub cnp_dscp: u8,
    /// A DCQCN tunable, by its mlx5 cc_params name (rp_ai_rate=5,
    /// rp_time_reset=300, ...; rates in Mbit/s, times in µs). Repeatable.
    #[arg(long = "cc", value_name = "NAME=VALUE")]
    pub cc: Vec<String>,
}

impl CcArgs {
    pub fn config(&self) -> Result<rdma_user::device::datapath::CcConfig> {
        let mut cc = rdma_user::device::datapath::CcConfig {
            ecn: !self.no_ecn,
            cnp_dscp: self.cnp_dscp.min(63),
            ..Default::default()
        };
        cc.params.enabled = !self.no_dcqcn;
        for kv in &self.cc {
            cc.params.set(kv).map_err(|e| anyhow!("--cc {e}"))?;
        }
        Ok(cc)
    }
}
#[derive(Subcommand)]
pub enum MrCmd {
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
        /// Take the memory from the MR pool: the map the XDP program can
        /// place RDMA WRITE payloads into (64 MiB per daemon).
        #[arg(long)]
        pool: bool,
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
pub enum QpCmd {
    /// Create a QP (and its CQ). An RC QP is then connected; a UD QP is
    /// ready at once (RTS) and sends to address handles (`ah create`).
    Create {
        #[arg(long)]
        depth: Option<u32>,
        /// rc or ud.
        #[arg(long = "type", default_value = "rc")]
        qp_type: String,
        /// UD: the QP's Q_Key (default 0x11111111).
        #[arg(long)]
        qkey: Option<String>,
        /// Take receive buffers from this SRQ (`srq create`).
        #[arg(long)]
        srq: Option<u32>,
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
#[derive(Subcommand)]
pub enum AhCmd {
    /// An address handle to a peer (its MAC from the neighbour table unless
    /// given).
    Create {
        #[arg(long)]
        remote_ip: String,
        #[arg(long)]
        remote_mac: Option<String>,
    },
    Destroy {
        ah: u32,
    },
}
#[derive(Subcommand)]
pub enum SrqCmd {
    /// A shared receive queue of `depth` WRs.
    Create {
        #[arg(long, default_value_t = 256)]
        depth: u32,
        /// Raise the SRQ limit event below this many WRs.
        #[arg(long)]
        limit: Option<u32>,
    },
    /// Post a receive buffer: `len` bytes at `offset` of a memory region.
    Post {
        #[arg(long)]
        srq: u32,
        #[arg(long)]
        key: String,
        #[arg(long, default_value_t = 0)]
        offset: u64,
        #[arg(long)]
        len: u64,
    },
    Destroy {
        srq: u32,
    },
}
#[derive(Args)]
pub struct PostArgs {
    /// write, read, send, recv, cmp-swap or fetch-add
    pub op: String,
    #[arg(long)]
    pub qp: String,
    /// Local memory region (lkey or rkey).
    #[arg(long)]
    pub key: String,
    #[arg(long, default_value_t = 0)]
    pub offset: u64,
    #[arg(long)]
    pub len: Option<u64>,
    /// Bytes (hex) to place in the local region first.
    #[arg(long)]
    pub data: Option<String>,
    #[arg(long)]
    pub remote_addr: Option<String>,
    #[arg(long)]
    pub rkey: Option<String>,
    #[arg(long)]
    pub imm: Option<String>,
    #[arg(long)]
    pub compare: Option<String>,
    #[arg(long)]
    pub swap: Option<String>,
    #[arg(long)]
    pub add: Option<String>,
    #[arg(long, default_value_t = 5000)]
    pub timeout_ms: u64,
    /// UD send: the address handle (`ah create`).
    #[arg(long)]
    pub ah: Option<u32>,
    /// UD send: the destination QP.
    #[arg(long)]
    pub remote_qpn: Option<String>,
    /// UD send: the destination's Q_Key (default: our QP's).
    #[arg(long)]
    pub remote_qkey: Option<String>,
}
#[derive(Subcommand)]
pub enum CqCmd {
    Poll {
        #[arg(long)]
        qp: String,
        #[arg(long, default_value_t = 16)]
        max: usize,
        #[arg(long, default_value_t = 0)]
        wait_ms: u64,
    },
}

pub fn up(a: UpArgs, g: &Global) -> Result<()> {
    let iface = a
        .dev
        .or(g.iface.clone())
        .ok_or_else(|| anyhow!("which interface? pass --dev IF (see `ip link`)"))?;
    daemon::run(UpOptions {
        iface,
        xdp_mode: a.xdp_mode,
        queues: a.queues,
        frame_size: a.frame_size,
        umem_frames: a.umem_frames,
        multi_buffer: !a.no_multi_buffer,
        zero_copy: !a.copy,
        xsk_bind: if a.copy {
            XskBind::Copy
        } else {
            XskBind::from_env()?
        },
        adaptive: a.adaptive,
        cpu: a.cpu,
        cm_port: a.cm_port,
        limits: Limits {
            max_qp: a.max_qp,
            max_mr: a.max_mr,
            ..Default::default()
        },
        firewall: a.firewall,
        cc: a.cc.config()?,
        selective_repeat: !a.no_selective_repeat,
    })
}

pub fn stats(g: &Global) -> Result<()> {
    let json = g.json;
    let v = call(&g.iface, &Request::Stats)?;
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
        if let Some(qs) = v["xdp_responder"].as_array().filter(|a| !a.is_empty()) {
            println!("XDP responder (per QP):");
            for q in qs {
                let x = &q["xdp_responder"];
                let punts: Vec<String> = x["punts"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter(|(_, n)| n.as_u64().unwrap_or(0) > 0)
                    .map(|(k, n)| format!("{k} {n}"))
                    .collect();
                println!(
                    "  QP {:#x}: {} placed ({} bytes), {} ACKs; lent {} times, taken back {}; {}; punts: {}",
                    q["qpn"].as_u64().unwrap_or(0),
                    x["placed"],
                    x["placed_bytes"],
                    x["acks"],
                    x["lends"],
                    x["take_backs"],
                    if x["lent"] == true { "lent now" } else { "with the engine" },
                    if punts.is_empty() { "none".into() } else { punts.join(", ") }
                );
            }
        }
        println!("AF_XDP sockets (one per queue):");
        for (q, x) in v["xsk"].as_array().into_iter().flatten().enumerate() {
            println!(
                "  queue {q}: {}{}, rx {} tx {} frames, kernel drops {} (ring full {}, fill ring empty {})",
                x["bind"].as_str().unwrap_or("?"),
                if x["multi_buffer"] == true { ", multi-buffer" } else { "" },
                x["rx_frames"],
                x["tx_frames"],
                x["kernel_rx_dropped"],
                x["kernel_rx_ring_full"],
                x["kernel_rx_fill_ring_empty"]
            );
            // The rings' state says where frames wait when a queue stalls.
            println!(
                "    rings: {}, kernel tx invalid {}",
                x["rings"].as_str().unwrap_or("?"),
                x["kernel_tx_invalid"]
            );
        }
    }
    Ok(())
}

/// " pool +OFFSET" for an MR in the MR pool.
fn pool_note(v: &serde_json::Value) -> String {
    v["pool_offset"]
        .as_u64()
        .map(|o| format!(" pool +0x{o:x}"))
        .unwrap_or_default()
}

pub fn mr(m: MrCmd, g: &Global) -> Result<()> {
    let json = g.json;
    let req = match m {
        MrCmd::Reg { len, access, pool } => Request::MrReg { len, access, pool },
        MrCmd::List => Request::MrList,
        MrCmd::Dereg { key } => Request::MrDereg { key },
        MrCmd::Read { key, offset, len } => Request::MrRead { key, offset, len },
        MrCmd::Write {
            key,
            offset,
            data,
            file,
        } => {
            let data = match (data, file) {
                (Some(d), _) => {
                    unhex(&d)?;
                    d
                }
                (None, Some(f)) => {
                    hex(&std::fs::read(&f).with_context(|| format!("read {}", f.display()))?)
                }
                (None, None) => bail!("give --data HEX or --file PATH"),
            };
            Request::MrWrite { key, offset, data }
        }
    };
    let v = call(&g.iface, &req)?;
    if json {
        println!("{v}");
        return Ok(());
    }
    match &req {
        Request::MrReg { .. } => println!(
            "addr 0x{:x} len {} lkey 0x{:08x} rkey 0x{:08x} access {}{}",
            v["addr"].as_u64().unwrap_or(0),
            v["len"],
            v["lkey"].as_u64().unwrap_or(0),
            v["rkey"].as_u64().unwrap_or(0),
            v["access"].as_str().unwrap_or(""),
            pool_note(&v)
        ),
        Request::MrList => {
            println!(
                "{:<18} {:>10} {:>10} {:>10}  access",
                "addr", "len", "lkey", "rkey"
            );
            for m in v["mrs"].as_array().into_iter().flatten() {
                println!(
                    "0x{:<16x} {:>10} 0x{:08x} 0x{:08x}  {}{}",
                    m["addr"].as_u64().unwrap_or(0),
                    m["len"],
                    m["lkey"].as_u64().unwrap_or(0),
                    m["rkey"].as_u64().unwrap_or(0),
                    m["access"].as_str().unwrap_or(""),
                    pool_note(m)
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

pub fn qp(q: QpCmd, g: &Global) -> Result<()> {
    let json = g.json;
    let req = match q {
        QpCmd::Create {
            depth,
            qp_type,
            qkey,
            srq,
        } => Request::QpCreate {
            depth,
            qp_type: Some(qp_type),
            qkey: qkey.as_deref().map(num).transpose()?.map(|k| k as u32),
            srq,
        },
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
                    remote_psn: num(remote_psn
                        .as_deref()
                        .ok_or_else(|| anyhow!("--remote-psn is required with --remote-ip"))?)?
                        as u32,
                    remote_mac,
                    psn: psn.as_deref().map(num).transpose()?.map(|p| p as u32),
                    mtu: Some(mtu),
                },
            }
        }
    };
    let v = call(&g.iface, &req)?;
    if json {
        println!("{v}");
        return Ok(());
    }
    match &req {
        Request::QpCreate { .. } => println!(
            "qpn 0x{:06x} ({})",
            v["qpn"].as_u64().unwrap_or(0),
            v["type"].as_str().unwrap_or("")
        ),
        Request::QpList => {
            println!(
                "{:<8} {:<4} {:<5} {:<8} {:<8} {:<8} {:>5} {:<16} counters",
                "qpn", "type", "state", "dest", "sq_psn", "rq_psn", "mtu", "peer"
            );
            for q in v["qps"].as_array().into_iter().flatten() {
                println!(
                    "0x{:06x} {:<4} {:<5} 0x{:06x} 0x{:06x} 0x{:06x} {:>5} {:<16} {}",
                    q["qpn"].as_u64().unwrap_or(0),
                    q["type"].as_str().unwrap_or(""),
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
            "qpn 0x{:06x} connected to {} qpn 0x{:06x} (our psn 0x{:06x}, mtu {}, recovery {})",
            v["qpn"].as_u64().unwrap_or(0),
            v["peer_ip"].as_str().unwrap_or("?"),
            v["remote_qpn"].as_u64().unwrap_or(0),
            v["psn"].as_u64().unwrap_or(0),
            v["mtu"],
            v["recovery"].as_str().unwrap_or("go-back-N")
        ),
    }
    Ok(())
}

pub fn post(p: PostArgs, g: &Global) -> Result<()> {
    let json = g.json;
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
        ah: p.ah,
        remote_qpn: p
            .remote_qpn
            .as_deref()
            .map(num)
            .transpose()?
            .map(|v| v as u32),
        remote_qkey: p
            .remote_qkey
            .as_deref()
            .map(num)
            .transpose()?
            .map(|v| v as u32),
    });
    let v = call(&g.iface, &req)?;
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

pub fn ah(cmd: AhCmd, g: &Global) -> Result<()> {
    let req = match cmd {
        AhCmd::Create {
            remote_ip,
            remote_mac,
        } => Request::AhCreate {
            remote_ip,
            remote_mac,
        },
        AhCmd::Destroy { ah } => Request::AhDestroy { ah },
    };
    let v = call(&g.iface, &req)?;
    if g.json {
        println!("{v}");
    } else if let Request::AhCreate { .. } = req {
        println!(
            "ah {} to {} ({})",
            v["ah"],
            v["peer_ip"].as_str().unwrap_or("?"),
            v["peer_mac"].as_str().unwrap_or("?")
        );
    } else {
        println!("destroyed ah {}", v["ah"]);
    }
    Ok(())
}

pub fn srq(cmd: SrqCmd, g: &Global) -> Result<()> {
    let req = match cmd {
        SrqCmd::Create { depth, limit } => Request::SrqCreate {
            depth: Some(depth),
            limit,
        },
        SrqCmd::Post {
            srq,
            key,
            offset,
            len,
        } => Request::SrqPost {
            srq,
            key,
            offset,
            len,
        },
        SrqCmd::Destroy { srq } => Request::SrqDestroy { srq },
    };
    let v = call(&g.iface, &req)?;
    if g.json {
        println!("{v}");
        return Ok(());
    }
    match req {
        Request::SrqCreate { .. } => println!("srq {}", v["srq"]),
        Request::SrqPost { srq, .. } => println!(
            "posted wr_id {} to srq {srq} ({} queued)",
            v["wr_id"], v["queued"]
        ),
        _ => println!("destroyed srq {}", v["srq"]),
    }
    Ok(())
}

pub fn cq(cmd: CqCmd, g: &Global) -> Result<()> {
    let json = g.json;
    let CqCmd::Poll { qp, max, wait_ms } = cmd;
    let v = call(
        &g.iface,
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
                "wr_id {} {} {} byte_len {}{}{}",
                wc["wr_id"],
                wc["opcode"].as_str().unwrap_or(""),
                wc["status"].as_str().unwrap_or(""),
                wc["byte_len"],
                wc["imm"]
                    .as_u64()
                    .map(|i| format!(" imm 0x{i:x}"))
                    .unwrap_or_default(),
                wc["src_qp"]
                    .as_u64()
                    .map(|q| format!(" src_qp 0x{q:06x} (40-byte GRH first)"))
                    .unwrap_or_default()
            );
        }
    }
    Ok(())
}

pub fn find_socket(iface: &Option<String>) -> Result<PathBuf> {
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
            "no daemon is running in this network namespace; start one with `rdma-xdp up --dev IF`"
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
pub fn call(iface: &Option<String>, req: &Request) -> Result<Value> {
    let path = find_socket(iface)?;
    let mut s = UnixStream::connect(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => anyhow!(
            "no daemon on {} ({}); start one with `rdma-xdp up --dev IF`",
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
pub fn hexdump(base: u64, b: &[u8]) {
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
