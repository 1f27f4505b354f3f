//! XDP classifier for RoCEv2.
//!
//! Every frame is parsed just far enough to decide: RoCEv2 packets that pass
//! basic sanity go to the AF_XDP socket of their RX queue (payloads land in
//! UMEM, no kernel stack), malformed RoCEv2 is dropped, everything else passes
//! to the kernel untouched. Each verdict bumps a per-CPU counter so that every
//! drop says why. Header layouts come from `rdma-common`, shared with
//! userspace.
#![no_std]
#![no_main]
// BPF's atomic compare-and-exchange and exchange: the bpfel target
// declares no CAS, so core's atomics lack them; the intrinsics emit the
// instructions (BPF_CMPXCHG, BPF_XCHG) directly. (The eBPF build is on
// nightly; a host build of this crate, as `cargo test --workspace` makes
// one, uses core's atomics instead.)
#![cfg_attr(target_arch = "bpf", allow(internal_features))]
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]

use core::mem::size_of;

mod xdp_responder;

use aya_ebpf::{
    bindings::{xdp_action, BPF_F_MMAPABLE},
    helpers::bpf_xdp_get_buff_len,
    macros::{map, xdp},
    maps::{Array, HashMap, PerCpuArray, XskMap},
    programs::XdpContext,
};
use aya_log_ebpf::debug;
use rdma_common::{
    mr_pool, stat, Bth, EthHdr, Ipv4Hdr, Ipv6Hdr, LiveQp, UdpHdr, VlanHdr, XdpConfig, ETH_P_8021AD,
    ETH_P_8021Q, ETH_P_IPV4, ETH_P_IPV6, ICRC_LEN, IPPROTO_UDP, OPCODE_FLAGS, ROCE_V2_UDP_PORT,
};

/// One AF_XDP socket per RX queue, indexed by queue id.
#[map]
static XSKS: XskMap = XskMap::with_max_entries(64, 0);

#[map]
static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stat::COUNT, 0);

/// Local QPNs that may receive traffic (the firewall), kept by userspace.
#[map]
static LIVE_QPS: HashMap<u32, LiveQp> = HashMap::with_max_entries(4096, 0);

#[map]
static CONFIG: Array<XdpConfig> = Array::with_max_entries(1, 0);

/// The MR pool: registered memory this program may place payloads into.
/// User space maps the one value `MAP_SHARED` and registers MRs inside it.
#[map]
static MR_POOL: Array<[u8; mr_pool::VALUE_BYTES]> = Array::with_max_entries(1, BPF_F_MMAPABLE);

#[xdp(frags)]
pub fn rdma_xdp(ctx: XdpContext) -> u32 {
    let (verdict, reason) = classify(&ctx);
    count(reason);
    if stat::is_drop(reason) {
        // Only drops log, and only at debug level: logging the frames the
        // XDP responder serves or redirects would write a ring buffer
        // record per packet.
        debug!(&ctx, "drop reason {}", reason);
    }
    verdict
}

#[inline(always)]
fn count(reason: u32) {
    if let Some(c) = STATS.get_ptr_mut(reason) {
        // SAFETY: a per-CPU array slot: only this CPU's program touches it,
        // and the map outlives the program.
        unsafe { *c += 1 };
    }
}

/// Bounds-checked pointer into the linear part of the frame. Headers always
/// live there; only payload may continue into fragments.
#[inline(always)]
fn ptr_at<T>(ctx: &XdpContext, off: usize) -> Option<*const T> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + off + size_of::<T>() > end {
        return None;
    }
    Some((start + off) as *const T)
}

const PASS: u32 = xdp_action::XDP_PASS;
const DROP: u32 = xdp_action::XDP_DROP;

#[inline(always)]
fn classify(ctx: &XdpContext) -> (u32, u32) {
    let Some(eth) = ptr_at::<EthHdr>(ctx, 0) else {
        return (PASS, stat::PASS_NOT_IP);
    };
    let mut l3 = EthHdr::LEN;
    // SAFETY: `ptr_at` checked the header lies inside the linear frame data;
    // EthHdr is packed bytes (alignment 1).
    let mut ethertype = unsafe { (*eth).ethertype() };
    if ethertype == ETH_P_8021Q || ethertype == ETH_P_8021AD {
        let Some(tag) = ptr_at::<VlanHdr>(ctx, l3) else {
            return (PASS, stat::PASS_NOT_IP);
        };
        // SAFETY: bounds checked by `ptr_at`; VlanHdr has alignment 1.
        ethertype = unsafe { (*tag).ethertype() };
        l3 += VlanHdr::LEN;
    }
    // Total frame length, fragments included (multi-buffer frames).
    // SAFETY: the helper only reads the context the kernel handed us.
    let frame_len = unsafe { bpf_xdp_get_buff_len(ctx.ctx) } as usize;

    let (l4, ip_end, src, ipv4, ip_options, ecn) = match ethertype {
        ETH_P_IPV4 => {
            let Some(ip) = ptr_at::<Ipv4Hdr>(ctx, l3) else {
                return (PASS, stat::PASS_NOT_IP);
            };
            // SAFETY: bounds checked by `ptr_at`; Ipv4Hdr has alignment 1.
            let ip = unsafe { &*ip };
            if ip.protocol != IPPROTO_UDP {
                return (PASS, stat::PASS_NOT_ROCE);
            }
            if ip.frag_off() & (Ipv4Hdr::FLAG_MF | Ipv4Hdr::OFFSET_MASK) != 0 {
                // The kernel reassembles; RoCEv2 never fragments.
                return (PASS, stat::PASS_FRAGMENT);
            }
            let ihl = ip.header_len();
            if ihl < Ipv4Hdr::LEN {
                return (PASS, stat::PASS_NOT_IP);
            }
            let mut gid = [0u8; 16];
            gid[10] = 0xff;
            gid[11] = 0xff;
            gid[12] = ip.src[0];
            gid[13] = ip.src[1];
            gid[14] = ip.src[2];
            gid[15] = ip.src[3];
            (
                l3 + ihl,
                l3 + ip.total_len() as usize,
                gid,
                true,
                ihl != Ipv4Hdr::LEN,
                ip.tos & 3,
            )
        }
        ETH_P_IPV6 => {
            let Some(ip) = ptr_at::<Ipv6Hdr>(ctx, l3) else {
                return (PASS, stat::PASS_NOT_IP);
            };
            // SAFETY: bounds checked by `ptr_at`; Ipv6Hdr has alignment 1.
            let ip = unsafe { &*ip };
            if ip.next_header != IPPROTO_UDP {
                return (PASS, stat::PASS_NOT_ROCE);
            }
            (
                l3 + Ipv6Hdr::LEN,
                l3 + Ipv6Hdr::LEN + ip.payload_len() as usize,
                ip.src,
                false,
                false,
                // The traffic class's low two bits.
                (ip.ver_tc_flow[1] >> 4) & 3,
            )
        }
        _ => return (PASS, stat::PASS_NOT_IP),
    };
    let Some(udp) = ptr_at::<UdpHdr>(ctx, l4) else {
        return (PASS, stat::PASS_NOT_ROCE);
    };
    // SAFETY: bounds checked by `ptr_at`; UdpHdr has alignment 1.
    let udp = unsafe { &*udp };
    if udp.dst_port() != ROCE_V2_UDP_PORT {
        return (PASS, stat::PASS_NOT_ROCE);
    }
    // From here on it claims to be RoCEv2: anything wrong is dropped.
    let bth_off = l4 + UdpHdr::LEN;
    let Some(bth) = ptr_at::<Bth>(ctx, bth_off) else {
        return (DROP, stat::DROP_TRUNCATED);
    };
    // SAFETY: bounds checked by `ptr_at`; Bth has alignment 1.
    let bth = unsafe { &*bth };
    if bth.tver() != 0 {
        return (DROP, stat::DROP_BAD_TVER);
    }
    // The shared opcode table: flags and extension header length in one
    // lookup. RC's reserved opcodes are known (RESERVED) and go on to the QP,
    // which NAKs them; anything else unknown ends here.
    let (flags, ext_len) = OPCODE_FLAGS[bth.opcode as usize];
    if !flags.is_known() {
        return (DROP, stat::DROP_UNKNOWN_OPCODE);
    }
    let need = UdpHdr::LEN + Bth::LEN + ext_len as usize + ICRC_LEN;
    let udp_len = udp.len() as usize;
    if udp_len < need || l4 + udp_len != ip_end || ip_end > frame_len {
        return (DROP, stat::DROP_TRUNCATED);
    }

    let firewall = CONFIG.get(0).map(|c| c.firewall != 0).unwrap_or(false);
    let qpn = bth.dest_qpn();
    // QP1 (GSI, RDMA CM) is always let through to userspace.
    if firewall && qpn != 1 {
        // SAFETY: userspace may update the entry concurrently; we copy out
        // plain bytes and a torn read only misjudges this one packet.
        match unsafe { LIVE_QPS.get(qpn) } {
            None => return (DROP, stat::DROP_QPN_NOT_LIVE),
            Some(live) => {
                if live.connected != 0
                    && (live.peer_gid != src
                        || (live.peer_sport != [0, 0] && live.peer_sport != udp.src_port))
                {
                    return (DROP, stat::DROP_SPOOFED_SOURCE);
                }
            }
        }
    }

    // The XDP responder: WRITEs to QPs lent to it never leave the kernel.
    let frame = xdp_responder::Frame {
        l3,
        ipv4,
        ip_options,
        bth_off,
        ext_len: ext_len as usize,
        udp_len,
        frame_len,
        src_gid: src,
        src_port: udp.src_port(),
        ce: ecn == 3,
        flags,
    };
    if let Some(v) = xdp_responder::try_serve(ctx, bth, &frame) {
        return v;
    }

    let queue = ctx.rx_queue_index();
    if XSKS.get(queue).is_none() {
        return (PASS, stat::PASS_NO_SOCKET);
    }
    match XSKS.redirect(queue, 0) {
        Ok(v) => (v, stat::REDIRECT),
        Err(_) => (PASS, stat::PASS_NO_SOCKET),
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
