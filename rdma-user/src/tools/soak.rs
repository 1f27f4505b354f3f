//! The soak workload: a client pushes a seeded mix of WRITE, READ, SEND,
//! FETCH_ADD and CMP_SWAP through one RC QP to a server and verifies every
//! completion, every byte read back, every message received and every
//! atomic result; at the end it reads the whole target area back. Run over
//! the impairment relay, it shows that faults cost goodput, never data.
//!
//! The server's MR: `[0, 8)` FETCH_ADD counter, `[8, 16)` CMP_SWAP word,
//! `[4096, 4096 + AREA)` WRITE/READ area, then the RECV buffers.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::device::datapath::{Backoff, Connect, Path};
use crate::device::standalone::{Standalone, NO_WC};
use crate::io::hostnet;
use crate::memory::Access;
use crate::rng::Rng;
use crate::transport::{QpCap, RecvWr, SendWr, Sge, Wc, WcOpcode, WcStatus, WrOpcode};
use crate::wire::gid_of;

/// WRITE/READ target area on the server.
pub const AREA: usize = 1 << 20;
const AREA_OFF: u64 = 4096;
const SLOT: usize = 16 << 10;
const SLOTS: usize = AREA / SLOT;
const MAX_SEND: usize = 4096;
const RECV_DEPTH: usize = 256;

#[derive(Debug, Clone)]
pub struct Options {
    pub iface: String,
    /// Client mode: the server's address.
    pub server: Option<IpAddr>,
    pub port: u16,
    pub ops: u64,
    pub seed: u64,
    pub tx_depth: u32,
    pub mtu: u32,
    /// Local ACK timeout exponent of the QP.
    pub ack_timeout: u8,
    pub adaptive: bool,
    pub cpu: Option<usize>,
    pub connect_timeout: Duration,
    /// Give up when no operation completes for this long.
    pub stall_timeout: Duration,
    pub progress: bool,
    /// DCQCN's reaction point on this side's QP.
    pub dcqcn: bool,
    /// Offer selective repeat in the exchange (used if the peer offers it
    /// too).
    pub selective_repeat: bool,
    /// The MR in the MR pool: the XDP responder serves in-order WRITEs to
    /// it (QPs with selective repeat stay on the user path).
    pub pool: bool,
    /// The operations the client mixes, a [`parse_kinds`] mask (all by
    /// default; the others keep their shares of the mix).
    pub kinds: u8,
}

/// Every operation of the mix.
pub const ALL_KINDS: u8 = 0b1_1111;

/// `write,read,send,fetch-add,cmp-swap` (any of them, or `all`) as a mask
/// of the operations the soak mixes.
pub fn parse_kinds(s: &str) -> Result<u8, String> {
    let mut m = 0;
    for k in s.split(',').map(str::trim) {
        m |= match k {
            "all" => ALL_KINDS,
            "write" => 1 << Kind::Write as u8,
            "read" => 1 << Kind::Read as u8,
            "send" => 1 << Kind::Send as u8,
            "fetch-add" => 1 << Kind::FetchAdd as u8,
            "cmp-swap" => 1 << Kind::CmpSwap as u8,
            _ => {
                return Err(format!(
                    "unknown operation '{k}'; known: write, read, send, fetch-add, cmp-swap, all"
                ))
            }
        };
    }
    Ok(m)
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ServerReport {
    pub sends_received: u64,
    pub sends_out_of_order: u64,
    pub sends_corrupted: u64,
    pub recv_errors: u64,
    /// The XDP responder on the server's QP (`--pool`): packets it placed,
    /// atomics it executed, READs it answered, ACKs it sent, requests it
    /// left to the engine.
    #[serde(default)]
    pub xdp_placed: u64,
    #[serde(default)]
    pub xdp_atomics: u64,
    #[serde(default)]
    pub xdp_reads: u64,
    #[serde(default)]
    pub xdp_acks: u64,
    #[serde(default)]
    pub xdp_punts: u64,
    /// The punts by reason (`rdma_common::xdp_responder::punt::NAMES`).
    #[serde(default)]
    pub xdp_punt_reasons: std::collections::BTreeMap<String, u64>,
    /// Each AF_XDP socket's rings at the end, and whether its transmit
    /// stalled (`Xsk::tx_stalled`): where the server's answers waited.
    #[serde(default)]
    pub sockets: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    /// Loss recovery the two sides agreed on: "sr" (selective repeat) or
    /// "gbn" (go-back-N).
    #[serde(default)]
    pub mode: String,
    pub seed: u64,
    pub ops: u64,
    pub completed: u64,
    pub writes: u64,
    pub reads: u64,
    pub sends: u64,
    pub fetch_adds: u64,
    pub cmp_swaps: u64,
    /// Payload bytes moved by completed operations.
    pub bytes: u64,
    pub seconds: f64,
    pub goodput_gbps: f64,
    pub ops_per_sec: f64,
    /// Operations posted but never completed (or completed in error).
    pub lost: u64,
    /// Completions that arrived twice or for an operation not outstanding.
    pub duplicated: u64,
    /// READ data, atomic results, received messages or final memory that
    /// differ from what was written.
    pub corrupted: u64,
    pub error_wcs: u64,
    pub first_error: Option<String>,
    pub final_area_checked: bool,
    pub retransmits: u64,
    pub timeouts: u64,
    pub seq_naks_received: u64,
    /// DCQCN on the client's QP: CNPs it acted on, and its rate at the end
    /// (Mbit/s).
    #[serde(default)]
    pub rp_cnp_handled: u64,
    #[serde(default)]
    pub dcqcn_rate_mbps: f64,
    /// Selective ACKs the client's QP received.
    #[serde(default)]
    pub sacks_received: u64,
    pub server: ServerReport,
}

impl Report {
    pub fn clean(&self) -> bool {
        self.lost == 0
            && self.duplicated == 0
            && self.corrupted == 0
            && self.error_wcs == 0
            && self.completed == self.ops
            && self.final_area_checked
            && self.server.sends_received == self.sends
            && self.server.clean()
    }
}

impl ServerReport {
    pub fn clean(&self) -> bool {
        self.sends_out_of_order == 0 && self.sends_corrupted == 0 && self.recv_errors == 0
    }
}

/// One side's connection details on the side channel (soak and flow).
#[derive(Serialize, Deserialize)]
pub(crate) struct Hello {
    pub(crate) qpn: u32,
    pub(crate) psn: u32,
    pub(crate) ip: IpAddr,
    pub(crate) rkey: u32,
    pub(crate) vaddr: u64,
    /// Offers selective repeat; absent from older peers (go-back-N).
    #[serde(default)]
    pub(crate) selective_repeat: Option<bool>,
}

/// Lines from the (non-blocking) side channel, assembled across reads.
#[derive(Default)]
pub(crate) struct LineReader {
    buf: Vec<u8>,
}

impl LineReader {
    /// One complete line if one has arrived; never blocks.
    pub(crate) fn poll(&mut self, s: &mut TcpStream) -> Result<Option<String>> {
        loop {
            if let Some(i) = self.buf.iter().position(|&c| c == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).take(i).collect();
                return Ok(Some(String::from_utf8(line)?));
            }
            let mut b = [0u8; 256];
            match s.read(&mut b) {
                Ok(0) => bail!("the peer closed the side channel"),
                Ok(k) => self.buf.extend_from_slice(&b[..k]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// A JSON line over the side channel, read while the data path keeps
/// running (the peer may need our ACKs to finish).
pub(crate) fn read_line_polling(
    s: &mut TcpStream,
    lines: &mut LineReader,
    dev: &mut Standalone,
    backoff: &mut Backoff,
    timeout: Duration,
) -> Result<String> {
    let start = Instant::now();
    loop {
        if let Some(l) = lines.poll(s)? {
            return Ok(l);
        }
        let (work, next) = dev.dp.poll();
        backoff.after_poll(dev.dp.now(), work, next);
        if start.elapsed() > timeout {
            bail!("the peer sent nothing for {timeout:?}");
        }
    }
}

/// Writes one JSON line. The socket is non-blocking, but lines are a few
/// hundred bytes, far below the send buffer.
pub(crate) fn send_line<T: Serialize>(s: &mut TcpStream, v: &T) -> Result<()> {
    let mut l = serde_json::to_vec(v)?;
    l.push(b'\n');
    s.write_all(&l)?;
    Ok(())
}

/// The side channel to the peer (connected as a client, or the first
/// client accepted), non-blocking, and our address facing the peer on
/// `iface`.
pub(crate) fn side_channel(
    iface: &str,
    server: Option<IpAddr>,
    port: u16,
    timeout: Duration,
) -> Result<(TcpStream, IpAddr)> {
    let tcp = crate::tools::bench::oob_connect(server, port, timeout)?;
    tcp.set_nodelay(true)?;
    tcp.set_nonblocking(true)?;
    let peer = tcp.peer_addr()?.ip().to_canonical();
    let local_ip = hostnet::local_addr_for(iface, peer)?;
    Ok((tcp, local_ip))
}

/// Sends our connection details and reads the peer's, the data path
/// running meanwhile.
pub(crate) fn exchange_hello(
    tcp: &mut TcpStream,
    lines: &mut LineReader,
    dev: &mut Standalone,
    backoff: &mut Backoff,
    ours: &Hello,
    timeout: Duration,
) -> Result<Hello> {
    send_line(tcp, ours)?;
    let l = read_line_polling(tcp, lines, dev, backoff, timeout)?;
    serde_json::from_str(&l).context("the peer's connection details")
}

/// The bytes of SEND number `seq`: its number, then seeded filler.
fn send_payload(seed: u64, seq: u64, out: &mut [u8]) {
    let n = out.len().min(8);
    out[..n].copy_from_slice(&seq.to_le_bytes()[..n]);
    Rng(seed ^ seq.wrapping_mul(0x2545_f491_4f6c_dd1d)).fill(&mut out[n..]);
}

/// The path from `dev` to `peer_ip` (its MAC from the neighbour table,
/// resolved if missing); refused if the peer's address is our own.
pub(crate) fn path_to(dev: &Standalone, local_ip: IpAddr, peer_ip: IpAddr) -> Result<Path> {
    if gid_of(local_ip) == gid_of(peer_ip) {
        bail!("peer address {peer_ip} is our own");
    }
    Ok(Path {
        local_mac: dev.mac,
        peer_mac: hostnet::resolve_mac(&dev.iface, peer_ip, Duration::from_secs(3))?,
        local_ip,
        peer_ip,
        vlan: None,
        traffic_class: 0,
    })
}

struct Setup {
    dev: Standalone,
    qpn: u32,
    cq: u32,
    addr: u64,
    lkey: u32,
    /// The side channel, non-blocking.
    tcp: TcpStream,
    lines: LineReader,
    peer: Hello,
    backoff: Backoff,
}

/// Opens the device, registers one MR, creates the QP and connects it with
/// the peer over the side channel. `prepare(dev, qpn, addr, lkey)` runs
/// before the QP is connected (to post RECVs in time).
fn setup(
    o: &Options,
    mr_len: usize,
    cap: QpCap,
    prepare: impl FnOnce(&mut Standalone, u32, u64, u32) -> Result<()>,
) -> Result<Setup> {
    if let Some(c) = o.cpu {
        crate::device::runner::pin_to_cpu(c);
    }
    let mut dev = Standalone::open(&o.iface, crate::io::xdp::XdpMode::Auto, true)?;
    let mut cc = crate::device::datapath::CcConfig::default();
    cc.params.enabled = o.dcqcn;
    dev.dp.core.set_cc(cc, &o.iface);
    let pd = dev.dp.core.alloc_pd();
    let (addr, lkey, rkey) = if o.pool {
        let (a, l, r, _) = dev.dp.core.reg_mr_pool(pd, mr_len, Access::ALL)?;
        (a, l, r)
    } else {
        dev.dp.core.reg_mr(pd, mr_len, Access::ALL)?
    };
    let cq = dev.dp.core.create_cq(8192)?;
    let qpn = dev.dp.core.create_qp(pd, cq, cap)?;
    let psn = dev.dp.core.random_psn();
    let (mut tcp, local_ip) = side_channel(&o.iface, o.server, o.port, o.connect_timeout)?;
    let mut lines = LineReader::default();
    let mut backoff = Backoff::new(o.adaptive);
    let ours = Hello {
        qpn,
        psn,
        ip: local_ip,
        rkey,
        vaddr: addr,
        selective_repeat: Some(o.selective_repeat),
    };
    let peer = exchange_hello(
        &mut tcp,
        &mut lines,
        &mut dev,
        &mut backoff,
        &ours,
        o.connect_timeout,
    )?;
    let path = path_to(&dev, local_ip, peer.ip)?;
    dev.dp
        .core
        .modify_qp(qpn, &crate::transport::QpAttr::init(Access::ALL))?;
    prepare(&mut dev, qpn, addr, lkey)?;
    dev.dp.core.connect_qp(
        qpn,
        path,
        &Connect {
            max_rd_atomic: 16,
            timeout: o.ack_timeout,
            selective_repeat: crate::transport::negotiate_selective_repeat(
                o.selective_repeat,
                peer.selective_repeat,
            ),
            ..Connect::new(peer.qpn, peer.psn, psn, o.mtu)
        },
    )?;
    // Both QPs are ready before either side sends.
    send_line(&mut tcp, &"ready")?;
    read_line_polling(
        &mut tcp,
        &mut lines,
        &mut dev,
        &mut backoff,
        o.connect_timeout,
    )?;
    Ok(Setup {
        dev,
        qpn,
        cq,
        addr,
        lkey,
        tcp,
        lines,
        peer,
        backoff,
    })
}

/// A socket's rings, and "TX stalled" when its transmit stalled.
fn socket_state(x: &crate::io::xsk::Xsk) -> String {
    format!(
        "[{}{}]",
        x.debug_state(),
        if x.tx_stalled() { ", TX stalled" } else { "" }
    )
}

/// Server: keep RECVs posted, check every message, answer the final report.
pub fn serve(o: &Options) -> Result<ServerReport> {
    let recv_off = AREA_OFF as usize + AREA;
    let mr_len = recv_off + RECV_DEPTH * MAX_SEND;
    let sge = move |addr: u64, lkey: u32, i: u64| Sge {
        addr: addr + (recv_off + i as usize * MAX_SEND) as u64,
        length: MAX_SEND as u32,
        lkey,
    };
    let mut s = setup(
        o,
        mr_len,
        QpCap {
            max_send_wr: 16,
            max_recv_wr: RECV_DEPTH as u32,
        },
        |dev, qpn, addr, lkey| {
            for i in 0..RECV_DEPTH as u64 {
                dev.dp.core.post_recv(
                    qpn,
                    &RecvWr {
                        wr_id: i,
                        sg_list: &[sge(addr, lkey, i)],
                    },
                )?;
            }
            Ok(())
        },
    )?;
    // SAFETY: the MR mapping lives as long as the device; nothing else
    // writes the RECV area while we read completed buffers.
    let mem = unsafe { std::slice::from_raw_parts(s.addr as *const u8, mr_len) };
    let mut rep = ServerReport::default();
    let mut expect_seq = 0u64;
    let mut want = vec![0u8; MAX_SEND];
    let mut wcs = [NO_WC; 32];
    let mut turn = 0u32;
    let seed = o.seed;
    loop {
        let (work, next) = s.dev.dp.poll();
        let n = s.dev.dp.core.cq_mut(s.cq).map_or(0, |c| c.poll(&mut wcs));
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success || wc.opcode != WcOpcode::Recv {
                rep.recv_errors += 1;
                continue;
            }
            let slot = wc.wr_id as usize;
            let off = recv_off + slot * MAX_SEND;
            let got = &mem[off..off + wc.byte_len as usize];
            rep.sends_received += 1;
            let seq = got
                .get(..8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
                .unwrap_or(u64::MAX);
            if got.len() >= 8 && seq != expect_seq {
                rep.sends_out_of_order += 1;
            }
            let w = &mut want[..got.len()];
            send_payload(seed, expect_seq, w);
            if got != w {
                rep.sends_corrupted += 1;
            }
            expect_seq += 1;
            s.dev.dp.core.post_recv(
                s.qpn,
                &RecvWr {
                    wr_id: wc.wr_id,
                    sg_list: &[sge(s.addr, s.lkey, wc.wr_id)],
                },
            )?;
        }
        s.backoff.after_poll(s.dev.dp.now(), work || n > 0, next);
        // The side channel only matters at the end: look at it rarely.
        turn = turn.wrapping_add(1);
        if !turn.is_multiple_of(1024) {
            continue;
        }
        if s.lines.poll(&mut s.tcp)?.is_some() {
            break;
        }
    }
    if let Some(x) = s.dev.dp.core.xdp_responder_stats(s.qpn) {
        let n = |k: &str| x[k].as_u64().unwrap_or(0);
        rep.xdp_placed = n("placed");
        rep.xdp_atomics = n("atomics");
        rep.xdp_reads = n("reads");
        rep.xdp_acks = n("acks");
        rep.xdp_punts = x["punts"]
            .as_object()
            .map_or(0, |m| m.values().filter_map(|v| v.as_u64()).sum());
        for (k, v) in x["punts"].as_object().into_iter().flatten() {
            if let Some(v) = v.as_u64().filter(|&v| v > 0) {
                rep.xdp_punt_reasons.insert(k.clone(), v);
            }
        }
    }
    rep.sockets = s.dev.dp.xsks.iter().map(socket_state).collect();
    send_line(&mut s.tcp, &rep)?;
    // Let the last ACKs leave.
    s.dev.poll_for(Duration::from_millis(100));
    Ok(rep)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Write,
    Read,
    Send,
    FetchAdd,
    CmpSwap,
}

struct Outstanding {
    wr_id: u64,
    kind: Kind,
    len: usize,
    local_slot: usize,
    /// READ: CRC of the bytes the target held when the READ was posted.
    /// Atomics: the original value they must return.
    expect: u64,
    area_slot: usize,
}

/// Client: post `ops` seeded operations, verify each, then read back the
/// whole area.
pub fn run(o: &Options) -> Result<Report> {
    let depth = o.tx_depth.clamp(1, 64) as usize;
    // Local buffers: one per outstanding WR, then room for the final
    // read-back of the whole area.
    let final_off = depth * SLOT;
    let mr_len = final_off + AREA;
    let mut s = setup(
        o,
        mr_len,
        QpCap {
            max_send_wr: depth as u32,
            max_recv_wr: 1,
        },
        |_, _, _, _| Ok(()),
    )?;
    // SAFETY: the MR mapping lives as long as the device; the engine writes
    // only buffers of completed READs/atomics, which we read after their WC.
    let local = unsafe { std::slice::from_raw_parts_mut(s.addr as *mut u8, mr_len) };
    let remote = s.peer.vaddr;
    let rkey = s.peer.rkey;
    let mut rng = Rng(o.seed);
    let mut shadow = vec![0u8; AREA];
    let mut counter = 0u64;
    let mut swap_word = 0u64;
    let mut reads_on_slot = [0u32; SLOTS];
    let mut outstanding: VecDeque<Outstanding> = VecDeque::with_capacity(depth);
    let mut free_local: Vec<usize> = (0..depth).rev().collect();
    let mut rep = Report {
        seed: o.seed,
        ops: o.ops,
        ..Default::default()
    };
    let mut send_seq = 0u64;
    let mut next_wr = 1u64;
    let mut posted = 0u64;
    let start = Instant::now();
    let mut last_progress = Instant::now();
    let mut last_completion = Instant::now();
    let mut wcs = [NO_WC; 32];
    let mut failed = false;

    let note = |rep: &mut Report, what: String| {
        if rep.first_error.is_none() {
            rep.first_error = Some(what);
        }
    };
    while rep.completed + rep.lost < o.ops && !failed {
        // Post while there is room.
        while posted < o.ops && outstanding.len() < depth {
            let Some(ls) = free_local.pop() else { break };
            let lbuf = ls * SLOT;
            // Drawn again until allowed (`kinds`): the allowed ones keep
            // their shares of the mix.
            let mut kind = loop {
                let kind = match rng.below(100) {
                    0..=34 => Kind::Write,
                    35..=59 => Kind::Read,
                    60..=84 => Kind::Send,
                    85..=94 => Kind::FetchAdd,
                    _ => Kind::CmpSwap,
                };
                if o.kinds & (1 << kind as u8) != 0 || o.kinds & ALL_KINDS == 0 {
                    break kind;
                }
            };
            let mut area_slot = rng.below(SLOTS as u64) as usize;
            if kind == Kind::Write && reads_on_slot[area_slot] > 0 {
                // A retried READ re-reads memory, so it must not overlap a
                // later WRITE: write elsewhere, or READ instead.
                match (0..SLOTS).find(|&i| reads_on_slot[(area_slot + i) % SLOTS] == 0) {
                    Some(i) => area_slot = (area_slot + i) % SLOTS,
                    None => kind = Kind::Read,
                }
            }
            let len = match kind {
                // One in four small: a small READ's response fits the frame
                // the XDP responder turns it into; the rest up to a slot.
                Kind::Write | Kind::Read if rng.below(4) == 0 => 1 + rng.below(64) as usize,
                Kind::Write | Kind::Read => 1 + rng.below(SLOT as u64) as usize,
                Kind::Send => 8 + rng.below((MAX_SEND - 8) as u64 + 1) as usize,
                _ => 8,
            };
            let in_slot = rng.below((SLOT - len) as u64 + 1) as usize;
            let aoff = area_slot * SLOT + in_slot;
            let wr_id = next_wr;
            next_wr += 1;
            let sge = [Sge {
                addr: s.addr + lbuf as u64,
                length: len as u32,
                lkey: s.lkey,
            }];
            let mut wr = SendWr::new(wr_id, WrOpcode::Send, &sge);
            let mut expect = 0u64;
            match kind {
                Kind::Write => {
                    rng.fill(&mut local[lbuf..lbuf + len]);
                    shadow[aoff..aoff + len].copy_from_slice(&local[lbuf..lbuf + len]);
                    wr.opcode = WrOpcode::RdmaWrite;
                    wr.remote_addr = remote + AREA_OFF + aoff as u64;
                    rep.writes += 1;
                }
                Kind::Read => {
                    local[lbuf..lbuf + len].fill(0xee);
                    expect = crc32fast::hash(&shadow[aoff..aoff + len]) as u64;
                    reads_on_slot[area_slot] += 1;
                    wr.opcode = WrOpcode::RdmaRead;
                    wr.remote_addr = remote + AREA_OFF + aoff as u64;
                    rep.reads += 1;
                }
                Kind::Send => {
                    send_payload(o.seed, send_seq, &mut local[lbuf..lbuf + len]);
                    send_seq += 1;
                    rep.sends += 1;
                }
                Kind::FetchAdd => {
                    let add = 1 + rng.below(1000);
                    expect = counter;
                    counter = counter.wrapping_add(add);
                    wr.opcode = WrOpcode::FetchAdd;
                    wr.remote_addr = remote;
                    wr.compare_add = add;
                    rep.fetch_adds += 1;
                }
                Kind::CmpSwap => {
                    let new = rng.next_u64();
                    expect = swap_word;
                    wr.opcode = WrOpcode::CmpSwap;
                    wr.remote_addr = remote + 8;
                    wr.compare_add = swap_word;
                    wr.swap = new;
                    swap_word = new;
                    rep.cmp_swaps += 1;
                }
            }
            wr.rkey = rkey;
            s.dev
                .dp
                .core
                .post_send(s.qpn, &wr)
                .with_context(|| format!("post {kind:?} #{posted}"))?;
            outstanding.push_back(Outstanding {
                wr_id,
                kind,
                len,
                local_slot: ls,
                expect,
                area_slot,
            });
            posted += 1;
        }
        let (work, next) = s.dev.dp.poll();
        let n = s.dev.dp.core.cq_mut(s.cq).map_or(0, |c| c.poll(&mut wcs));
        for wc in &wcs[..n] {
            last_completion = Instant::now();
            let Some(front) = outstanding.front() else {
                rep.duplicated += 1;
                note(
                    &mut rep,
                    format!("completion {} with nothing outstanding", wc.wr_id),
                );
                continue;
            };
            if wc.wr_id != front.wr_id {
                rep.duplicated += 1;
                note(
                    &mut rep,
                    format!(
                        "completion for WR {} while WR {} was next",
                        wc.wr_id, front.wr_id
                    ),
                );
                continue;
            }
            let op = outstanding.pop_front().expect("front exists");
            free_local.push(op.local_slot);
            if op.kind == Kind::Read {
                reads_on_slot[op.area_slot] -= 1;
            }
            if wc.status != WcStatus::Success {
                rep.error_wcs += 1;
                rep.lost += 1;
                note(
                    &mut rep,
                    format!(
                        "{:?} WR {} completed with {}",
                        op.kind,
                        op.wr_id,
                        wc.status.as_str()
                    ),
                );
                failed = true;
                continue;
            }
            let lbuf = op.local_slot * SLOT;
            let ok = match op.kind {
                Kind::Read => crc32fast::hash(&local[lbuf..lbuf + op.len]) as u64 == op.expect,
                Kind::FetchAdd | Kind::CmpSwap => {
                    u64::from_ne_bytes(local[lbuf..lbuf + 8].try_into().expect("8 bytes"))
                        == op.expect
                }
                _ => true,
            };
            if !ok {
                rep.corrupted += 1;
                note(
                    &mut rep,
                    format!("{:?} WR {} returned wrong data", op.kind, op.wr_id),
                );
            }
            rep.completed += 1;
            rep.bytes += op.len as u64;
        }
        s.backoff.after_poll(s.dev.dp.now(), work || n > 0, next);
        if !outstanding.is_empty() && last_completion.elapsed() > o.stall_timeout {
            note(
                &mut rep,
                format!(
                    "no completion for {:?} with {} operations outstanding; QP: {}; sockets: {}",
                    o.stall_timeout,
                    outstanding.len(),
                    s.dev
                        .dp
                        .core
                        .qp(s.qpn)
                        .map(|q| q.debug_state())
                        .unwrap_or_default(),
                    s.dev
                        .dp
                        .xsks
                        .iter()
                        .map(socket_state)
                        .collect::<Vec<_>>()
                        .join(" ")
                ),
            );
            failed = true;
        }
        if o.progress && last_progress.elapsed() > Duration::from_secs(2) {
            last_progress = Instant::now();
            let t = start.elapsed().as_secs_f64();
            eprintln!(
                "soak: {}/{} operations, {:.3} Gb/s goodput, {} retransmits",
                rep.completed,
                o.ops,
                rep.bytes as f64 * 8.0 / t / 1e9,
                s.dev.dp.core.qp(s.qpn).map_or(0, |q| q.stats().retransmits)
            );
        }
    }
    rep.lost += outstanding.len() as u64;
    rep.seconds = start.elapsed().as_secs_f64();
    rep.goodput_gbps = rep.bytes as f64 * 8.0 / rep.seconds / 1e9;
    rep.ops_per_sec = rep.completed as f64 / rep.seconds;

    if !failed {
        // Read the whole area and both atomic words back.
        let chunk = 64 << 10;
        let mut ok = true;
        for (i, off) in (0..AREA).step_by(chunk).enumerate() {
            let sge = [Sge {
                addr: s.addr + (final_off + off) as u64,
                length: chunk as u32,
                lkey: s.lkey,
            }];
            let mut wr = SendWr::new(1 << 40 | i as u64, WrOpcode::RdmaRead, &sge);
            wr.remote_addr = remote + AREA_OFF + off as u64;
            wr.rkey = rkey;
            s.dev.dp.core.post_send(s.qpn, &wr)?;
            ok &= wait_ok(&mut s.dev, s.cq, o.stall_timeout)?;
        }
        let got = &local[final_off..final_off + AREA];
        let bad = got
            .chunks(4096)
            .zip(shadow.chunks(4096))
            .filter(|(a, b)| a != b)
            .count() as u64;
        if bad > 0 {
            note(
                &mut rep,
                format!("{bad} pages of the target area differ after the run"),
            );
        }
        rep.corrupted += bad;
        let mut words = [0u64; 2];
        for (i, w) in words.iter_mut().enumerate() {
            let sge = [Sge {
                addr: s.addr + final_off as u64,
                length: 8,
                lkey: s.lkey,
            }];
            let mut wr = SendWr::new(2 << 40 | i as u64, WrOpcode::RdmaRead, &sge);
            wr.remote_addr = remote + 8 * i as u64;
            wr.rkey = rkey;
            s.dev.dp.core.post_send(s.qpn, &wr)?;
            ok &= wait_ok(&mut s.dev, s.cq, o.stall_timeout)?;
            *w = u64::from_ne_bytes(local[final_off..final_off + 8].try_into().expect("8"));
        }
        if words != [counter, swap_word] {
            rep.corrupted += 1;
            note(
                &mut rep,
                format!(
                    "atomic words are {words:?}, expected {:?}",
                    [counter, swap_word]
                ),
            );
        }
        rep.final_area_checked = ok;
    }
    if let Some(q) = s.dev.dp.core.qp(s.qpn) {
        let st = q.stats();
        rep.retransmits = st.retransmits;
        rep.timeouts = st.timeouts;
        rep.seq_naks_received = st.seq_naks_received;
        rep.rp_cnp_handled = st.rp_cnp_handled;
        rep.dcqcn_rate_mbps = q.cc().rc;
        rep.sacks_received = st.sacks_received;
        rep.mode = if q.selective_repeat() { "sr" } else { "gbn" }.into();
    }
    send_line(&mut s.tcp, &"done")?;
    let l = read_line_polling(
        &mut s.tcp,
        &mut s.lines,
        &mut s.dev,
        &mut s.backoff,
        o.connect_timeout,
    )?;
    rep.server = serde_json::from_str(&l).context("the server's report")?;
    Ok(rep)
}

fn wait_ok(dev: &mut Standalone, cq: u32, timeout: Duration) -> Result<bool> {
    let wc: Wc = dev
        .wait_wc(cq, timeout)
        .map_err(|e| anyhow!("final read-back: {e}"))?;
    Ok(wc.status == WcStatus::Success)
}
