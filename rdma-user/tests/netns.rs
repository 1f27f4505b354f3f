//! Integration tests on a veth pair between two network namespaces, as root.
//! They run one at a time (SERIAL) and remove what they create, even when
//! they fail.

mod lab;

use std::mem::offset_of;
use std::process::Command;
use std::time::Duration;

use lab::{serial, Lab, BIN};
use rdma_user::control::proto::hex;
use rdma_user::wire::*;
use serde_json::Value;

/// Where the headers of an untagged IPv4 frame start.
const L4: usize = EthHdr::LEN + Ipv4Hdr::LEN;
const BTH: usize = L4 + UdpHdr::LEN;

/// A valid RoCEv2 frame from host A to host B.
fn frame(lab: &Lab, v6: bool, vlan: Option<u16>, opc: u8, payload: &[u8]) -> Vec<u8> {
    let ip = if v6 {
        IpRepr::V6(Ipv6Repr {
            src: [0xfd, 0x66, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            dst: [0xfd, 0x66, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
            next_header: IPPROTO_UDP,
        })
    } else {
        IpRepr::V4(Ipv4Repr {
            src: lab.addr[0].parse::<std::net::Ipv4Addr>().unwrap().octets(),
            dst: lab.addr[1].parse::<std::net::Ipv4Addr>().unwrap().octets(),
            ..Default::default()
        })
    };
    let r = RoceRepr {
        eth: EthernetRepr {
            dst: lab.mac(1),
            src: lab.mac(0),
            vlan_tci: vlan,
            ethertype: ip.ethertype(),
        },
        ip,
        udp: UdpRepr {
            src_port: 0xc123,
            dst_port: ROCE_V2_UDP_PORT,
            checksum: 0,
        },
        transport: TransportRepr {
            bth: BthRepr {
                opcode: opc,
                pkey: 0xffff,
                dest_qpn: 0x11,
                ack_req: true,
                psn: 7,
                ..Default::default()
            },
            reth: Some(RethRepr {
                va: 0x1000,
                rkey: 0x1234,
                dma_len: payload.len() as u32,
            }),
            ..Default::default()
        },
    };
    let mut buf = vec![0u8; r.frame_len(payload.len())];
    r.emit(payload, &mut buf).unwrap();
    buf
}

/// Recomputes the IPv4 header checksum after a test edited the header.
fn fix_ip_csum(f: &mut [u8]) {
    f[24] = 0;
    f[25] = 0;
    let c = ipv4_checksum(&f[14..34]);
    f[24..26].copy_from_slice(&c.to_be_bytes());
}

struct Recv {
    frames: Vec<String>,
    stats: Value,
}

/// Runs `rdma-xdp xsk-recv` on host B while `inject` sends from host A.
fn xsk_recv(lab: &Lab, count: usize, frames: &[Vec<u8>], extra: &[&str]) -> Recv {
    let count = count.to_string();
    let mut args = vec![
        "xsk-recv",
        "--dev",
        &lab.dev[1],
        "--count",
        &count,
        "--timeout-ms",
        "3000",
    ];
    args.extend_from_slice(extra);
    let mut child = lab.spawn(1, &args);
    // Wait for "ready" (XDP attached, socket bound).
    use std::io::BufRead;
    let stdout = child.stdout.take().unwrap();
    let mut reader = std::io::BufReader::new(stdout);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "xsk-recv did not start");
    lab.inject(0, frames);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut reader, &mut rest).unwrap();
    let _ = lab::wait_timeout(child, Duration::from_secs(10));
    let mut r = Recv {
        frames: Vec::new(),
        stats: Value::Null,
    };
    for l in rest.lines() {
        if let Some(h) = l.strip_prefix("frame ") {
            r.frames.push(h.to_string());
        } else if let Some(s) = l.strip_prefix("stats ") {
            r.stats = serde_json::from_str(s).unwrap();
        }
    }
    r
}

#[test]
fn ping_and_tcp_still_work_with_xdp_attached() {
    let _g = serial();
    let mut lab = Lab::new(1500);
    lab.up(0, &[]);
    lab.up(1, &[]);
    assert!(lab.xdp_attached(0) && lab.xdp_attached(1));
    let out = lab.exec(0, "ping", &["-c", "2", "-W", "2", &lab.addr[1]]);
    assert!(
        out.status.success(),
        "ping failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    // TCP: a listener in B, a client in A, through the XDP-attached veths.
    use std::io::{Read, Write};
    let server = lab::in_netns(&lab.ns[1], || {
        let l = std::net::TcpListener::bind("0.0.0.0:9400").unwrap();
        let (mut c, _) = l.accept().unwrap();
        let mut buf = [0u8; 9];
        c.read_exact(&mut buf).unwrap();
        c.write_all(&buf.to_ascii_uppercase()).unwrap();
    });
    let peer = format!("{}:9400", lab.addr[1]);
    let reply = lab::in_netns(&lab.ns[0], move || {
        let mut s = (0..50)
            .find_map(|_| {
                std::net::TcpStream::connect_timeout(&peer.parse().unwrap(), Duration::from_secs(1))
                    .map_err(|_| std::thread::sleep(Duration::from_millis(100)))
                    .ok()
            })
            .expect("TCP connect");
        s.set_nodelay(true).unwrap();
        s.write_all(b"hello tcp").unwrap();
        let mut buf = [0u8; 9];
        s.read_exact(&mut buf).unwrap();
        buf
    })
    .join()
    .unwrap();
    server.join().unwrap();
    assert_eq!(&reply, b"HELLO TCP");
    let s = lab.ok(1, &["stats"]);
    assert!(
        s["xdp"]["pass_not_roce"].as_u64().unwrap() > 0,
        "TCP went through XDP as pass"
    );
}

#[test]
fn crafted_frames_get_the_right_verdict_and_arrive_intact() {
    let _g = serial();
    let lab = Lab::new(1500);
    let payload: Vec<u8> = (0..1024).map(|i| (i * 7) as u8).collect();
    let valid = frame(&lab, false, None, opcode::RC_RDMA_WRITE_ONLY, &payload);
    let v6 = frame(&lab, true, None, opcode::RC_RDMA_WRITE_ONLY, &payload[..64]);
    let vlan = frame(
        &lab,
        false,
        Some(100),
        opcode::RC_RDMA_WRITE_ONLY,
        &payload[..64],
    );
    // Truncated: IP and UDP say more than the frame holds.
    let truncated = valid[..BTH + 6].to_vec();
    // Wrong UDP port.
    let mut wrong_port = valid.clone();
    wrong_port[L4 + offset_of!(UdpHdr, dst_port)..L4 + offset_of!(UdpHdr, len)]
        .copy_from_slice(&4792u16.to_be_bytes());
    // A non-first IPv4 fragment (offset 185*8).
    let mut frag = valid.clone();
    frag[EthHdr::LEN + offset_of!(Ipv4Hdr, frag_off)..EthHdr::LEN + offset_of!(Ipv4Hdr, ttl)]
        .copy_from_slice(&185u16.to_be_bytes());
    fix_ip_csum(&mut frag);
    let mut bad_tver = valid.clone();
    bad_tver[BTH + offset_of!(Bth, flags)] |= 0x01;
    // Manufacturer-specific: no QP type knows it.
    let mut bad_opcode = valid.clone();
    bad_opcode[BTH + offset_of!(Bth, opcode)] = 0xe0;
    // A reserved opcode of the RC range goes on to the QP, which NAKs it.
    let reserved = frame(&lab, false, None, 0x15, &payload[..64]);
    let frames = vec![
        valid.clone(),
        truncated,
        wrong_port,
        v6.clone(),
        vlan.clone(),
        frag,
        bad_tver,
        bad_opcode,
        reserved.clone(),
    ];
    let r = xsk_recv(&lab, 4, &frames, &[]);
    let st = &r.stats;
    assert_eq!(st["redirect"], 4, "{st}");
    assert_eq!(st["drop_truncated"], 1, "{st}");
    assert_eq!(st["drop_bad_tver"], 1, "{st}");
    assert_eq!(st["drop_unknown_opcode"], 1, "{st}");
    assert!(st["pass_not_roce"].as_u64().unwrap() >= 1, "{st}");
    assert_eq!(st["pass_fragment"], 1, "{st}");
    // The redirected frames arrive in AF_XDP byte for byte.
    let want: Vec<String> = [valid, v6, vlan, reserved].iter().map(|f| hex(f)).collect();
    assert_eq!(r.frames, want);
}

#[test]
fn multi_buffer_frame_at_mtu_9000_arrives_intact() {
    let _g = serial();
    let lab = Lab::new(9000);
    // 4 KiB payload: ~4154-byte frame, more than one 4 KiB UMEM chunk.
    let payload: Vec<u8> = (0..4096u32).map(|i| (i ^ (i >> 8)) as u8).collect();
    let big = frame(&lab, false, None, opcode::RC_RDMA_WRITE_ONLY, &payload);
    assert!(big.len() > 4096);
    let r = xsk_recv(&lab, 1, std::slice::from_ref(&big), &[]);
    assert_eq!(r.stats["redirect"], 1, "{}", r.stats);
    assert_eq!(r.frames, vec![hex(&big)]);
}

#[test]
fn second_up_refuses_and_sigterm_detaches() {
    let _g = serial();
    let mut lab = Lab::new(1500);
    lab.up(0, &[]);
    let out = lab.exec(0, BIN, &["up", "--iface", &lab.dev[0].clone()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is in use by pid") && err.contains("(rdma-xdp)"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one clear line: {err}");
    assert!(lab.xdp_attached(0));
    let log = lab.stop(0);
    assert!(log.contains("XDP detached"), "{log}");
    assert!(!lab.xdp_attached(0), "program left behind");
    let sock = lab.exec(0, "sh", &["-c", "ls /run/rdma-xdp/ns-*/ 2>/dev/null"]);
    assert!(!String::from_utf8_lossy(&sock.stdout).contains(&format!("{}.sock", lab.dev[0])));
}

#[test]
fn up_after_sigkill_starts_cleanly() {
    let _g = serial();
    let mut lab = Lab::new(1500);
    lab.up(0, &[]);
    lab.kill9(0);
    lab.up(0, &[]);
    assert!(lab.xdp_attached(0));
    lab.ok(0, &["mr", "list"]);
}

#[test]
fn rdma_write_read_send_atomics_between_namespaces() {
    let _g = serial();
    let mut lab = Lab::new(1500);
    lab.up(0, &[]);
    lab.up(1, &[]);
    let (a_addr, a_l, _) = lab.mr(0, 1 << 16, "all");
    let (b_addr, b_l, b_r) = lab.mr(1, 1 << 16, "all");
    let _ = a_addr;
    // Both daemons offer selective repeat by default.
    let (qa, qb, recovery) = lab.connect_recovery();
    assert_eq!(recovery, "selective-repeat");
    let (qa, qb) = (qa.to_string(), qb.to_string());
    // A 10000-byte WRITE: ten packets at MTU 1024.
    let data: Vec<u8> = (0..10000u32).map(|i| (i * 13 + 5) as u8).collect();
    let v = lab.post_ok(
        "write",
        &qa,
        a_l,
        &["--data", &hex(&data)],
        b_addr + 100,
        b_r,
    );
    assert_eq!(v["wc"]["status"], "success");
    assert_eq!(lab.mr_bytes(1, b_l, 100, 10000), data);
    let v = lab.post_ok(
        "read",
        &qa,
        a_l,
        &["--offset", "20000", "--len", "10000"],
        b_addr + 100,
        b_r,
    );
    assert_eq!(v["wc"]["status"], "success");
    assert_eq!(lab.mr_bytes(0, a_l, 20000, 10000), data);
    // SEND with immediate into a posted RECV.
    lab.ok(
        1,
        &[
            "post",
            "recv",
            "--qp",
            &qb,
            "--key",
            &b_l.to_string(),
            "--offset",
            "40000",
            "--len",
            "3000",
        ],
    );
    lab.ok(
        0,
        &[
            "post",
            "send",
            "--qp",
            &qa,
            "--key",
            &a_l.to_string(),
            "--offset",
            "50000",
            "--data",
            &hex(&data[..2500]),
            "--imm",
            "0x1234",
        ],
    );
    let w = lab.ok(1, &["cq", "poll", "--qp", &qb, "--wait-ms", "2000"]);
    assert_eq!(w["wcs"][0]["status"], "success");
    assert_eq!(w["wcs"][0]["byte_len"], 2500);
    assert_eq!(w["wcs"][0]["imm"], 0x1234);
    assert_eq!(lab.mr_bytes(1, b_l, 40000, 2500), &data[..2500]);
    // CMP_SWAP then FETCH_ADD on one counter.
    let ctr = (b_addr + 60000).to_string();
    let v = lab.ok(
        0,
        &[
            "post",
            "cmp-swap",
            "--qp",
            &qa,
            "--key",
            &a_l.to_string(),
            "--offset",
            "60000",
            "--remote-addr",
            &ctr,
            "--rkey",
            &b_r.to_string(),
            "--compare",
            "0",
            "--swap",
            "40",
        ],
    );
    assert_eq!(v["original"], 0);
    let v = lab.ok(
        0,
        &[
            "post",
            "fetch-add",
            "--qp",
            &qa,
            "--key",
            &a_l.to_string(),
            "--offset",
            "60000",
            "--remote-addr",
            &ctr,
            "--rkey",
            &b_r.to_string(),
            "--add",
            "2",
        ],
    );
    assert_eq!(v["original"], 40);
    assert_eq!(lab.mr_bytes(1, b_l, 60000, 8), 42u64.to_ne_bytes());
    let q = lab.ok(0, &["qp", "list"]);
    assert_eq!(q["qps"][0]["stats"]["retransmits"], 0, "{q}");
}

/// `mr reg --pool` takes its memory from the XDP program's MR pool map:
/// a peer's WRITE lands there, the pool says when it is full, and a
/// deregistration gives the range back.
/// veth hands a frame sent with XDP_TX only to a peer that runs XDP: the
/// daemon says so while its peer has none (and then lends no QP), and
/// stops saying it once the peer has a program.
#[test]
fn a_veth_peer_without_xdp_is_named_in_stats() {
    let _g = serial();
    let mut lab = Lab::new(1500);
    lab.up(1, &["--no-selective-repeat"]);
    let tx = |lab: &Lab| lab.ok(1, &["stats"])["xdp"]["xdp_tx"].clone();
    let v = tx(&lab);
    let why = v.as_str().unwrap_or_default();
    assert!(
        why.contains("runs no XDP program") && why.contains("xdp-pass"),
        "{v}"
    );
    lab.up(0, &[]);
    assert_eq!(tx(&lab), "ok");
}

/// Host A - relay - host B, the relay on packet sockets: its veths get a
/// pass-through XDP program, so the ACKs B's XDP responder sends with
/// XDP_TX reach A. Before, every WRITE into B's pool MR completed only
/// after A's retransmission timeout (the engine's ACK of the duplicate).
/// The two daemons agree on selective repeat (their default): XDP serves
/// such a QP's in-order WRITEs as it serves a go-back-N QP's.
#[test]
fn xdp_acks_cross_a_relay_without_retransmission() {
    let _g = serial();
    let mut lab = Lab::with_relay(1500);
    lab.start_relay(&[]);
    lab.up(0, &[]);
    lab.up(1, &[]);
    let (_, a_l, _) = lab.mr(0, 1 << 16, "all");
    let b = lab.ok(
        1,
        &["mr", "reg", "--len", "65536", "--access", "all", "--pool"],
    );
    let (b_addr, b_l, b_r) = (
        b["addr"].as_u64().unwrap(),
        b["lkey"].as_u64().unwrap(),
        b["rkey"].as_u64().unwrap(),
    );
    let (qa, _, recovery) = lab.connect_recovery();
    assert_eq!(recovery, "selective-repeat");
    for k in 0..3u64 {
        let data: Vec<u8> = (0..200u32).map(|i| (i as u64 * 13 + k) as u8).collect();
        let v = lab.post_ok(
            "write",
            qa,
            a_l,
            &["--data", &hex(&data)],
            b_addr + k * 1000,
            b_r,
        );
        assert_eq!(v["wc"]["status"], "success");
        assert_eq!(lab.mr_bytes(1, b_l, k * 1000, 200), data);
    }
    let x = lab.ok(1, &["qp", "list"])["qps"][0]["xdp_responder"].clone();
    assert_eq!(
        (x["placed"].as_u64(), x["acks"].as_u64()),
        (Some(3), Some(3)),
        "{x}"
    );
    let a = lab.ok(0, &["qp", "list"])["qps"][0]["stats"].clone();
    assert_eq!(
        (a["retransmits"].as_u64(), a["timeouts"].as_u64()),
        (Some(0), Some(0)),
        "{a}"
    );
    let r = lab.stop_relay();
    assert!(r.to_string().contains("roce"), "{r}");
}

#[test]
fn pool_mrs_take_writes_say_when_full_and_free_on_dereg() {
    let _g = serial();
    let mut lab = Lab::new(1500);
    // Go-back-N (selective repeat: `xdp_acks_cross_a_relay_...`).
    lab.up(0, &[]);
    lab.up(1, &["--no-selective-repeat"]);
    let (_, a_l, _) = lab.mr(0, 1 << 16, "all");
    let reg = |len: usize| {
        lab.rdma(
            1,
            &[
                "mr",
                "reg",
                "--len",
                &len.to_string(),
                "--access",
                "all",
                "--pool",
            ],
        )
    };
    let first = reg(5000).unwrap();
    let second = reg(1 << 16).unwrap();
    assert_eq!(first["pool_offset"], 0, "{first}");
    // 5000 bytes take two pages.
    assert_eq!(second["pool_offset"], 8192, "{second}");
    let (b_addr, b_l, b_r) = (
        second["addr"].as_u64().unwrap(),
        second["lkey"].as_u64().unwrap(),
        second["rkey"].as_u64().unwrap(),
    );
    let (qa, _) = lab.connect();
    let data: Vec<u8> = (0..10000u32).map(|i| (i * 7 + 3) as u8).collect();
    let v = lab.post_ok(
        "write",
        qa,
        a_l,
        &["--data", &hex(&data)],
        b_addr + 300,
        b_r,
    );
    assert_eq!(v["wc"]["status"], "success");
    assert_eq!(lab.mr_bytes(1, b_l, 300, 10000), data);
    assert_eq!(lab.mr_bytes(1, b_l, 0, 300), vec![0u8; 300]);
    // The XDP program placed the WRITE's ten packets and sent the one ACK
    // (the last packet's AckReq) itself.
    let x = |lab: &Lab| lab.ok(1, &["qp", "list"])["qps"][0]["xdp_responder"].clone();
    let v = x(&lab);
    assert_eq!(
        (v["placed"].as_u64(), v["acks"].as_u64()),
        (Some(10), Some(1)),
        "{v}"
    );
    assert_eq!(v["placed_bytes"], 10000, "{v}");
    // A READ of more than one packet is the engine's: XDP hands the QP
    // back with it, and the engine answers from the state XDP left (PSNs
    // continue).
    let v = lab.post_ok(
        "read",
        qa,
        a_l,
        &["--offset", "20000", "--len", "10000"],
        b_addr + 300,
        b_r,
    );
    assert_eq!(v["wc"]["status"], "success");
    assert_eq!(lab.mr_bytes(0, a_l, 20000, 10000), data);
    let v = x(&lab);
    assert_eq!(v["punts"]["too_long"], 1, "{v}");
    // Idle again, the QP goes back to XDP: the next WRITE is placed there.
    let two: Vec<u8> = (0..3000u32).map(|i| (i * 11 + 9) as u8).collect();
    let w = lab.post_ok(
        "write",
        qa,
        a_l,
        &["--data", &hex(&two)],
        b_addr + 20000,
        b_r,
    );
    assert_eq!(w["wc"]["status"], "success");
    assert_eq!(lab.mr_bytes(1, b_l, 20000, 3000), two);
    let v = x(&lab);
    assert_eq!(v["placed"], 13, "{v}");
    assert_eq!(v["acks"], 2, "{v}");
    // Atomics on the pool MR are XDP's too: a CMP_SWAP that swaps, one
    // that does not, and FETCH_ADDs, each answered with the value found.
    let ctr = b_addr + 40000;
    let atomic = |op: &str, args: &[&str]| {
        let v = lab.post_ok(op, qa, a_l, args, ctr, b_r);
        assert_eq!(v["wc"]["status"], "success", "{v}");
        v["original"].as_u64().unwrap()
    };
    assert_eq!(atomic("cmp-swap", &["--compare", "0", "--swap", "40"]), 0);
    assert_eq!(atomic("cmp-swap", &["--compare", "0", "--swap", "99"]), 40);
    for k in 0..5u64 {
        assert_eq!(atomic("fetch-add", &["--add", "2"]), 40 + 2 * k);
    }
    assert_eq!(lab.mr_bytes(1, b_l, 40000, 8), 50u64.to_ne_bytes());
    let v = x(&lab);
    assert_eq!(v["atomics"], 7, "{v}");
    assert_eq!(v["acks"], 9, "{v}");
    assert_eq!(v["placed"], 13, "{v}");
    // Small READs are answered by XDP, with the bytes WRITEs and atomics
    // left (the requester checks the response's ICRC); a READ whose
    // response the frame cannot grow to goes to the engine, which
    // answers it.
    for (off, len) in [(20000u64, 2u64), (20001, 61), (40000, 8), (300, 1000)] {
        let v = lab.post_ok(
            "read",
            qa,
            a_l,
            &["--offset", "30000", "--len", &len.to_string()],
            b_addr + off,
            b_r,
        );
        assert_eq!(v["wc"]["status"], "success", "{v}");
        assert_eq!(
            lab.mr_bytes(0, a_l, 30000, len),
            lab.mr_bytes(1, b_l, off, len),
            "READ of {len} at {off}"
        );
    }
    let v = x(&lab);
    eprintln!("{v}");
    assert!(v["reads"].as_u64().unwrap() >= 3, "{v}");
    assert_eq!(
        v["reads"].as_u64().unwrap() + v["punts"]["no_room"].as_u64().unwrap(),
        4,
        "{v}"
    );
    let q = lab.ok(1, &["qp", "list"]);
    assert_eq!(q["qps"][0]["stats"]["errors"], 0, "{q}");
    let list = lab.ok(1, &["mr", "list"]);
    let pooled: Vec<_> = list["mrs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["pool_offset"].as_u64())
        .collect();
    assert_eq!(pooled.len(), 2, "{list}");
    // 64 MiB do not fit beside what is taken: a clear error, nothing leaks.
    let e = reg(64 << 20).unwrap_err();
    assert!(e.contains("MR pool has no free range"), "{e}");
    // Freed ranges are handed out again, zeroed.
    lab.ok(1, &["mr", "dereg", &b_r.to_string()]);
    lab.ok(1, &["mr", "dereg", &first["lkey"].to_string()]);
    let again = reg((64 << 20) - 4096).unwrap();
    assert_eq!(again["pool_offset"], 0, "{again}");
    let k = again["lkey"].as_u64().unwrap();
    assert_eq!(lab.mr_bytes(1, k, 8192 + 300, 64), vec![0u8; 64]);
}

/// A daemon that does not offer selective repeat gets go-back-N, whoever
/// connects, and the QP still works.
#[test]
fn selective_repeat_only_when_both_daemons_offer_it() {
    let _g = serial();
    let mut lab = Lab::new(1500);
    lab.up(0, &[]);
    lab.up(1, &["--no-selective-repeat"]);
    let (_, a_l, _) = lab.mr(0, 1 << 16, "all");
    let (b_addr, b_l, b_r) = lab.mr(1, 1 << 16, "all");
    let (qa, _, recovery) = lab.connect_recovery();
    assert_eq!(recovery, "go-back-N");
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 1) as u8).collect();
    let v = lab.post_ok(
        "write",
        qa.to_string(),
        a_l,
        &["--data", &hex(&data)],
        b_addr,
        b_r,
    );
    assert_eq!(v["wc"]["status"], "success");
    assert_eq!(lab.mr_bytes(1, b_l, 0, 5000), data);
}

#[test]
fn ud_datagrams_and_an_srq_from_the_cli() {
    let _g = serial();
    let mut lab = Lab::new(1500);
    lab.up(0, &[]);
    lab.up(1, &[]);
    let (_, a_l, _) = lab.mr(0, 1 << 16, "all");
    let (_, b_l, _) = lab.mr(1, 1 << 16, "all");
    let srq = lab.ok(1, &["srq", "create", "--depth", "4"])["srq"].to_string();
    let qa = lab.ok(0, &["qp", "create", "--type", "ud"]);
    assert_eq!(qa["type"], "UD");
    let qa = qa["qpn"].to_string();
    let qb = lab.ok(1, &["qp", "create", "--type", "ud", "--srq", &srq])["qpn"].to_string();
    let ah = lab.ok(0, &["ah", "create", "--remote-ip", &lab.addr[1]])["ah"].to_string();
    let bk = b_l.to_string();
    for (off, len) in [("0", "1064"), ("2000", "1064")] {
        lab.ok(
            1,
            &[
                "srq", "post", "--srq", &srq, "--key", &bk, "--offset", off, "--len", len,
            ],
        );
    }
    let data: Vec<u8> = (0..1024u32).map(|i| (i * 7 + 1) as u8).collect();
    let send = |lab: &Lab, d: &[u8]| {
        lab.ok(
            0,
            &[
                "post",
                "send",
                "--qp",
                &qa,
                "--key",
                &a_l.to_string(),
                "--data",
                &hex(d),
                "--ah",
                &ah,
                "--remote-qpn",
                &qb,
            ],
        )
    };
    assert_eq!(send(&lab, &data)["wc"]["status"], "success");
    let w = lab.ok(1, &["cq", "poll", "--qp", &qb, "--wait-ms", "2000"]);
    assert_eq!(w["wcs"][0]["status"], "success", "{w}");
    assert_eq!(w["wcs"][0]["byte_len"], 40 + 1024);
    assert_eq!(w["wcs"][0]["src_qp"].to_string(), qa);
    assert_eq!(lab.mr_bytes(1, b_l, 40, 1024), data);
    // The IPv4 header of the datagram in the GRH's last 20 bytes.
    assert_eq!(lab.mr_bytes(1, b_l, 20, 1)[0], 0x45);
    // Larger than the port MTU (1024 at a netdev MTU of 1500): completes,
    // but no packet leaves (IBA C10-93.1.1).
    assert_eq!(send(&lab, &[1u8; 1025])["wc"]["status"], "success");
    let w = lab.ok(1, &["cq", "poll", "--qp", &qb, "--wait-ms", "300"]);
    assert_eq!(w["wcs"].as_array().unwrap().len(), 0, "{w}");
    // An SRQ in use cannot go; past its depth a post is refused.
    let e = lab.rdma(1, &["srq", "destroy", &srq]).unwrap_err();
    assert!(e.contains("still used by a QP"), "{e}");
    for _ in 0..3 {
        lab.ok(
            1,
            &["srq", "post", "--srq", &srq, "--key", &bk, "--len", "64"],
        );
    }
    let e = lab
        .rdma(
            1,
            &["srq", "post", "--srq", &srq, "--key", &bk, "--len", "64"],
        )
        .unwrap_err();
    assert!(e.contains("full"), "{e}");
    let q = lab.ok(0, &["qp", "list"]);
    assert_eq!(q["qps"][0]["stats"]["oversize_sends"], 1, "{q}");
}

#[test]
fn access_violations_fail_with_rem_access_err_and_touch_nothing() {
    let _g = serial();
    let mut lab = Lab::new(1500);
    lab.up(0, &[]);
    lab.up(1, &[]);
    let (_, a_l, _) = lab.mr(0, 4096, "all");
    let (ro_addr, ro_l, ro_r) = lab.mr(1, 4096, "local-write,remote-read");
    let (rw_addr, rw_l, rw_r) = lab.mr(1, 4096, "all");
    let (gone_addr, gone_l, gone_r) = lab.mr(1, 4096, "all");
    lab.ok(1, &["mr", "dereg", &gone_l.to_string()]);
    let cases: Vec<(&str, u64, u64)> = vec![
        ("WRITE to a read-only MR", ro_addr, ro_r),
        ("VA out of bounds", rw_addr + 4090, rw_r),
        ("wrong rkey", rw_addr, rw_r ^ 0x5a5a5a),
        ("deregistered MR", gone_addr, gone_r),
    ];
    let before_ro = lab.mr_bytes(1, ro_l, 0, 4096);
    let before_rw = lab.mr_bytes(1, rw_l, 0, 4096);
    for (name, va, rkey) in cases {
        // An access error is fatal to the connection: a fresh QP pair each.
        let (qa, _) = lab.connect();
        let r = lab.post("write", qa, a_l, &["--data", "deadbeefdeadbeef"], va, rkey);
        let err = r.expect_err(name);
        assert!(err.contains("REM_ACCESS_ERR"), "{name}: {err}");
        assert_eq!(lab.mr_bytes(1, ro_l, 0, 4096), before_ro, "{name}");
        assert_eq!(lab.mr_bytes(1, rw_l, 0, 4096), before_rw, "{name}");
        let q = lab.ok(0, &["qp", "list"]);
        let st = q["qps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["qpn"] == qa)
            .unwrap()["state"]
            .clone();
        assert_eq!(st, "ERR", "{name}");
    }
}

#[test]
fn stopping_a_daemon_flushes_outstanding_work() {
    let _g = serial();
    let mut lab = Lab::new(1500);
    lab.up(0, &[]);
    lab.up(1, &[]);
    let (_, b_l, _) = lab.mr(1, 4096, "all");
    let (_, qb) = lab.connect();
    for k in 0..3 {
        lab.ok(
            1,
            &[
                "post",
                "recv",
                "--qp",
                &qb.to_string(),
                "--key",
                &b_l.to_string(),
                "--offset",
                &(k * 100).to_string(),
                "--len",
                "100",
            ],
        );
    }
    let log = lab.stop(1);
    assert!(
        log.contains("3 outstanding work requests flushed (WR_FLUSH_ERR)"),
        "{log}"
    );
    assert!(!lab.xdp_attached(1));
}

#[test]
fn cli_errors_are_one_clear_line() {
    let _g = serial();
    let mut lab = Lab::new(1500);
    // No daemon yet.
    let e = lab.rdma(0, &["mr", "list"]).unwrap_err();
    assert!(e.contains("no daemon"), "{e}");
    // Interface missing.
    let out = lab.exec(0, BIN, &["up", "--iface", "nosuchif0"]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && e.contains("interface nosuchif0 not found"),
        "{e}"
    );
    lab.up(0, &[]);
    let (_, l, _) = lab.mr(0, 4096, "all");
    let e = lab
        .rdma(0, &["mr", "read", "0x1234", "--len", "4"])
        .unwrap_err();
    assert!(e.contains("unknown memory region key"), "{e}");
    let e = lab
        .rdma(
            0,
            &[
                "mr",
                "read",
                &l.to_string(),
                "--offset",
                "4000",
                "--len",
                "200",
            ],
        )
        .unwrap_err();
    assert!(e.contains("out of range"), "{e}");
    let e = lab
        .rdma(
            0,
            &["mr", "reg", "--len", "10", "--access", "remote-teleport"],
        )
        .unwrap_err();
    assert!(e.contains("unknown access flag"), "{e}");
    // Not root: the control socket refuses.
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &lab.ns[0],
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            BIN,
            "--iface",
            &lab.dev[0],
            "mr",
            "list",
        ])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && e.contains("permission denied"),
        "{e}"
    );
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    // Malformed control requests are rejected, the daemon stays up.
    let sock = lab.exec(0, "sh", &["-c", "ls /run/rdma-xdp/ns-*/*.sock"]);
    let path = String::from_utf8_lossy(&sock.stdout).trim().to_string();
    assert!(!path.is_empty() && !path.contains('\n'), "socket {path}");
    {
        use std::io::{BufRead, Write};
        let mut s = std::os::unix::net::UnixStream::connect(&path).unwrap();
        s.write_all(b"{\"cmd\":\"mr-reg\",\"len\":\"x\"}\nnot json at all\n")
            .unwrap();
        let mut r = std::io::BufReader::new(s);
        for _ in 0..2 {
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            assert!(
                line.contains("\"ok\":false") && line.contains("malformed request"),
                "{line}"
            );
        }
    }
    lab.ok(0, &["mr", "list"]);
}

/// Many 64 KiB ping-pongs between two of our stacks: every ring (fill, RX,
/// TX, completion) wraps many times. Catches chunk leaks, double use of a
/// chunk and TX stalls (all seen once).
#[test]
fn rc_pingpong_64k_wraps_every_ring() {
    let _g = serial();
    let lab = Lab::new(1500);
    let server = lab.spawn(
        1,
        &[
            "pingpong",
            "--dev",
            &lab.dev[1],
            "-s",
            "65536",
            "-n",
            "200",
            "-c",
        ],
    );
    std::thread::sleep(Duration::from_millis(700));
    let client = lab.exec(
        0,
        BIN,
        &[
            "pingpong",
            &lab.addr[1],
            "--dev",
            &lab.dev[0],
            "-s",
            "65536",
            "-n",
            "200",
            "-c",
        ],
    );
    let s = lab::wait_timeout(server, Duration::from_secs(30));
    let (cout, sout) = (
        String::from_utf8_lossy(&client.stdout),
        String::from_utf8_lossy(&s.stdout),
    );
    assert!(
        client.status.success(),
        "client: {cout}{}",
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(
        s.status.success(),
        "server: {sout}{}",
        String::from_utf8_lossy(&s.stderr)
    );
    assert!(cout.contains("200 iters in"), "{cout}");
    assert!(sout.contains("data check passed"), "{sout}");
}

/// The XDP firewall (`up --firewall`) drops RoCEv2 for QPNs that are not
/// live and for a connected QP's packets from anyone but its peer, each
/// under its own counter, while the connection keeps working.
#[test]
fn xdp_firewall_drops_dead_qpns_and_spoofed_sources() {
    let _g = serial();
    let mut lab = Lab::new(1500);
    lab.up(0, &[]);
    lab.up(1, &["--firewall"]);
    let (_, a_l, _) = lab.mr(0, 4096, "all");
    let (b_addr, b_l, b_r) = lab.mr(1, 4096, "all");
    let (qa, qb) = lab.connect();
    let set_qpn = |f: &mut Vec<u8>, qpn: u32| {
        f[BTH + offset_of!(Bth, dest_qpn)..BTH + offset_of!(Bth, ack_req)]
            .copy_from_slice(&qpn.to_be_bytes()[1..])
    };
    let before = lab.ok(1, &["stats"]);
    // A QPN nobody created.
    let mut dead = frame(&lab, false, None, opcode::RC_RDMA_WRITE_ONLY, b"xxxxxxxx");
    set_qpn(&mut dead, 0x7777);
    // The live QP, but from a spoofed source address.
    let mut spoofed = frame(&lab, false, None, opcode::RC_RDMA_WRITE_ONLY, b"xxxxxxxx");
    set_qpn(&mut spoofed, qb as u32);
    spoofed[14 + 15] = 0x63; // 10.66.n.99
    fix_ip_csum(&mut spoofed);
    // The live QP from the right address but another UDP source port.
    let mut wrong_port = frame(&lab, false, None, opcode::RC_RDMA_WRITE_ONLY, b"xxxxxxxx");
    set_qpn(&mut wrong_port, qb as u32);
    lab.inject(0, &[dead.clone(), dead, spoofed, wrong_port]);
    std::thread::sleep(Duration::from_millis(300));
    let after = lab.ok(1, &["stats"]);
    let d = |k: &str| after["xdp"][k].as_u64().unwrap() - before["xdp"][k].as_u64().unwrap();
    assert_eq!(d("drop_qpn_not_live"), 2, "{after}");
    assert_eq!(d("drop_spoofed_source"), 2, "{after}");
    // Nothing of it reached the QP; real traffic still flows.
    let v = lab.post_ok(
        "write",
        qa,
        a_l,
        &["--data", "0102030405060708"],
        b_addr,
        b_r,
    );
    assert_eq!(v["wc"]["status"], "success");
    assert_eq!(lab.mr_bytes(1, b_l, 0, 8), [1, 2, 3, 4, 5, 6, 7, 8]);
    let q = lab.ok(1, &["qp", "list"]);
    assert_eq!(q["qps"][0]["stats"]["errors"], 0, "{q}");
}

/// The library moves a page-aligned region into the MR pool; a second
/// MR over the same pages must not move them again (the first MR's pool
/// range, where XDP places its WRITEs, would no longer be mapped there).
/// WRITEs through either MR land where the program reads (`rdma-xdp
/// verbs-demo --pooled-twice`, both veth ends in one namespace).
#[test]
fn a_second_mr_over_pooled_pages_keeps_both_mrs_writable() {
    let _g = serial();
    let lab = Lab::new(1500);
    lab.both_ends_in_a();
    let dev = &lab.dev;
    let out = lab.exec(
        0,
        "env",
        &[
            "RDMA_XDP_POOL=1",
            "timeout",
            "60",
            BIN,
            "verbs-demo",
            "--a",
            &dev[0],
            "--b",
            &dev[1],
            "--pooled-twice",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "verbs-demo --pooled-twice failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for k in 0..3 {
        assert!(text.contains(&format!("pooled WRITE {k}: ok")), "{text}");
    }
    assert!(
        text.contains("fork: the child has its own copy: ok"),
        "{text}"
    );
    // The first MR's WRITEs (single packets, AckReq) were the XDP
    // responder's: placed and ACKed there.
    let acked: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("xdp placed "))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no XDP counters: {text}"));
    assert!(acked >= 2, "{text}");
}

#[test]
fn verbs_library_end_to_end_and_detach_on_drop() {
    let _g = serial();
    let lab = Lab::new(1500);
    // Both ends of the veth pair in one namespace: one process, two
    // verbs contexts (each with its data path thread), one per end.
    lab.both_ends_in_a();
    let (ns, dev) = (&lab.ns, &lab.dev);
    let out = lab.exec(
        0,
        "timeout",
        &["60", BIN, "verbs-demo", "--a", &dev[0], "--b", &dev[1]],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "verbs-demo failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "WRITE 3000 B: ok",
        "READ 3000 B: ok",
        "SEND/RECV 31 B: ok",
        "FETCH_ADD: returned 41, counter now 42: ok",
        "WRITE to read-only MR: REM_ACCESS_ERR, MR untouched, QP Err: ok",
    ] {
        assert!(text.contains(line), "missing '{line}' in:\n{text}");
    }
    // Dropping the contexts detached XDP from both interfaces.
    for d in dev {
        let show = Command::new("ip")
            .args(["-n", &ns[0], "-d", "link", "show", "dev", d])
            .output()
            .expect("ip link show");
        let s = String::from_utf8_lossy(&show.stdout);
        assert!(
            show.status.success() && !s.contains("prog/xdp"),
            "{d} still has XDP: {s}"
        );
    }
}

#[test]
fn two_queues_spread_qps_and_hand_over_frames_that_arrive_on_the_other() {
    let _g = serial();
    let mut lab = Lab::with_queues(1500, 2);
    lab.up(0, &["--queues", "2"]);
    lab.up(1, &["--queues", "2"]);
    for i in 0..2 {
        let mode = lab.ok(i, &["stats"])["mode"].as_str().unwrap().to_string();
        assert!(mode.contains("AF_XDP x2"), "{mode}");
    }
    let (_, a_l, _) = lab.mr(0, 1 << 16, "all");
    let (b_addr, b_l, b_r) = lab.mr(1, 1 << 16, "all");
    // Round robin over the data paths: QPNs 0x12 and 0x14 on the first,
    // 0x11 and 0x13 on the second (a QP's data path is its QPN mod 2).
    let create = |i: usize| -> Vec<u64> {
        (0..4)
            .map(|_| lab.ok(i, &["qp", "create"])["qpn"].as_u64().unwrap())
            .collect()
    };
    let (qa, qb) = (create(0), create(1));
    assert_eq!(qa, [0x12, 0x11, 0x14, 0x13]);
    assert_eq!(qb, qa);
    // Two pairs on the same data path index and two across: veth delivers
    // a frame on the queue it was sent from, so the crossed pairs' frames
    // arrive at the other data path and are handed over, both ways.
    let pairs = [
        (qa[0], qb[0]),
        (qa[1], qb[1]),
        (qa[2], qb[3]),
        (qa[3], qb[2]),
    ];
    for (a, b) in pairs {
        lab.ok(
            0,
            &[
                "qp",
                "connect",
                &a.to_string(),
                "--peer",
                &lab.addr[1],
                "--remote-qpn",
                &b.to_string(),
            ],
        );
    }
    for round in 0..3u64 {
        for (i, (a, _)) in pairs.iter().enumerate() {
            let off = (i as u64) * 8192;
            let data: Vec<u8> = (0..5000u32)
                .map(|k| (k as u8) ^ (i as u8 * 31) ^ (round as u8 * 7))
                .collect();
            let w = lab.post_ok("write", a, a_l, &["--data", &hex(&data)], b_addr + off, b_r);
            assert_eq!(w["wc"]["status"], "success", "{w}");
            assert_eq!(
                lab.mr_bytes(1, b_l, off, 5000),
                data,
                "QP {a:#x} round {round}"
            );
            let back = (32768 + off).to_string();
            let r = lab.post_ok(
                "read",
                a,
                a_l,
                &["--offset", &back, "--len", "5000"],
                b_addr + off,
                b_r,
            );
            assert_eq!(r["wc"]["status"], "success", "{r}");
            assert_eq!(
                lab.mr_bytes(0, a_l, 32768 + off, 5000),
                data,
                "QP {a:#x} round {round}"
            );
        }
    }
    // SEND/RECV across: B's QP 0x13 (second data path) gets A's 0x14's.
    lab.ok(
        1,
        &[
            "post",
            "recv",
            "--qp",
            &qb[3].to_string(),
            "--key",
            &b_l.to_string(),
            "--offset",
            "60000",
            "--len",
            "64",
        ],
    );
    let s = lab.ok(
        0,
        &[
            "post",
            "send",
            "--qp",
            &qa[2].to_string(),
            "--key",
            &a_l.to_string(),
            "--data",
            "c0ffee",
        ],
    );
    assert_eq!(s["wc"]["status"], "success", "{s}");
    let wcs = lab.ok(
        1,
        &[
            "cq",
            "poll",
            "--qp",
            &qb[3].to_string(),
            "--wait-ms",
            "2000",
        ],
    );
    assert_eq!(wcs["wcs"][0]["byte_len"], 3, "{wcs}");
    assert_eq!(lab.mr_bytes(1, b_l, 60000, 3), [0xc0, 0xff, 0xee]);
    for i in 0..2 {
        let st = lab.ok(i, &["stats"]);
        let dp = &st["datapath"];
        assert!(dp["rx_wrong_queue"].as_u64().unwrap() > 0, "host {i}: {dp}");
        assert_eq!(dp["rx_wrong_queue_dropped"], 0, "host {i}: {dp}");
        let xsk = st["xsk"].as_array().unwrap();
        assert_eq!(xsk.len(), 2);
        for (q, x) in xsk.iter().enumerate() {
            assert!(
                x["rx_frames"].as_u64().unwrap() > 0,
                "host {i} queue {q}: {x}"
            );
            assert!(
                x["tx_frames"].as_u64().unwrap() > 0,
                "host {i} queue {q}: {x}"
            );
        }
        let qps = lab.ok(i, &["qp", "list"]);
        let list = qps["qps"].as_array().unwrap();
        assert_eq!(list.len(), 4);
        assert!(list.iter().all(|q| q["state"] == "RTS"), "{qps}");
        assert!(list.iter().all(|q| q["stats"]["errors"] == 0), "{qps}");
    }
}
