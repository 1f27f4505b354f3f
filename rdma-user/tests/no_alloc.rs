//! The data path allocates nothing per packet: two connected `Core`s (parser,
//! engine, memory, CQs; no sockets) run a steady mix of WRITE, READ, SEND,
//! FETCH_ADD and CMP_SWAP with multi-packet messages, lost frames,
//! go-back-N and timeouts, under a global allocator that counts every
//! allocation made on this thread while armed. The count must stay at zero,
//! and the work must really have happened (completions, bytes, retries).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use rdma_user::device::standalone::NO_WC;
use rdma_user::transport::{RecvWr, SendWr, Sge, WcStatus, WrOpcode};

mod cores;
use cores::{mem, mem_mut, side, Side};

struct Counting;

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn note() {
    // try_with: the allocator also runs while thread locals are torn down.
    let _ = ARMED.try_with(|a| {
        if a.get() {
            let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
        }
    });
}

// SAFETY: forwards to the system allocator; the counter touches no heap.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller upholds GlobalAlloc's contract, which we
        // pass on unchanged.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller upholds GlobalAlloc's contract, which we
        // pass on unchanged.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        note();
        // SAFETY: the caller upholds GlobalAlloc's contract, which we
        // pass on unchanged.
        unsafe { System.realloc(p, l, n) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: the caller upholds GlobalAlloc's contract, which we
        // pass on unchanged.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const MR_LEN: usize = 1 << 20;
const DEPTH: u32 = 32;

fn connect(x: &mut Side, y: &Side, ips: (u8, u8), psns: (u32, u32)) {
    // 4.096 us * 2^6: timeouts fire within the simulated milliseconds.
    cores::connect_with(x, y, ips, psns, |c| c.timeout = 6);
}

/// Counters of one run of `ops` work requests, posted by A.
#[derive(Debug, Default)]
struct Run {
    completed: u64,
    frames: u64,
    dropped: u64,
    errors: u64,
}

/// Runs `ops` work requests from A to B, dropping every 97th frame; every
/// buffer is created before the first op.
fn run(a: &mut Side, b: &mut Side, ops: u64, frame: &mut [u8], r: &mut Run) {
    let mut wcs = [NO_WC; 64];
    let (mut posted, mut now) = (0u64, 0u64);
    let ops_end = r.completed + ops;
    while r.completed < ops_end {
        while posted < ops && a.core.qp(a.qpn).unwrap().send_queue_len() < DEPTH as usize {
            let k = posted % 5;
            let (op, len) = match k {
                0 => (WrOpcode::RdmaWrite, 3000),
                1 => (WrOpcode::RdmaRead, 5000),
                2 => (WrOpcode::Send, 2500),
                3 => (WrOpcode::FetchAdd, 8),
                _ => (WrOpcode::CmpSwap, 8),
            };
            // Regions (see the test): WRITE and SEND from A's first quarter,
            // READ from B's third quarter into A's second, atomics apart.
            let off = (posted % 16) * 16384;
            let q = MR_LEN as u64 / 4;
            let (local, remote) = match op {
                WrOpcode::RdmaRead => (q + off, 2 * q + off),
                WrOpcode::FetchAdd | WrOpcode::CmpSwap => (3 * q + 8 * k, 3 * q + 64 + 8 * k),
                _ => (off, off),
            };
            let sge = [Sge {
                addr: a.addr + local,
                length: len,
                lkey: a.lkey,
            }];
            let mut wr = SendWr::new(posted, op, &sge);
            wr.rkey = b.rkey;
            wr.remote_addr = b.addr + remote;
            wr.compare_add = 1;
            wr.flags.signaled = true;
            if op == WrOpcode::Send {
                let rsge = [Sge {
                    addr: b.addr + 3 * (MR_LEN / 4) as u64 + 4096,
                    length: 4096,
                    lkey: b.lkey,
                }];
                let recv = RecvWr {
                    wr_id: posted,
                    sg_list: &rsge,
                };
                b.core.post_recv(b.qpn, &recv).unwrap();
            }
            a.core.post_send(a.qpn, &wr).unwrap();
            posted += 1;
        }
        now += 20_000;
        for dir in 0..2 {
            let (src, dst) = if dir == 0 {
                (&mut *a, &mut *b)
            } else {
                (&mut *b, &mut *a)
            };
            loop {
                let n = src.core.build_frame(now, frame);
                if n == 0 {
                    break;
                }
                r.frames += 1;
                if r.frames.is_multiple_of(97) {
                    r.dropped += 1;
                    continue;
                }
                dst.core.handle_frame(now, &frame[..n]);
            }
        }
        a.core.handle_timers(now);
        b.core.handle_timers(now);
        let n = a.core.cq_mut(a.cq).unwrap().poll(&mut wcs);
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                r.errors += 1;
            }
        }
        r.completed += n as u64;
        b.core.cq_mut(b.cq).unwrap().poll(&mut wcs);
    }
}

#[test]
fn steady_traffic_with_loss_allocates_nothing() {
    let mut a = side(1, MR_LEN, 4096, DEPTH);
    let mut b = side(2, MR_LEN, 4096, DEPTH);
    connect(&mut a, &b, (1, 2), (100, 9000));
    connect(&mut b, &a, (2, 1), (9000, 100));
    for (i, x) in mem_mut(a.addr, MR_LEN).iter_mut().enumerate() {
        *x = (i * 7 + 3) as u8;
    }
    let q = MR_LEN / 4;
    for (i, x) in mem_mut(b.addr + 2 * q as u64, q).iter_mut().enumerate() {
        *x = (i * 13 + 5) as u8;
    }
    let mut frame = vec![0u8; 9000];
    let mut r = Run::default();
    // Warm-up: lazily initialised statics (the CRC's CPU detection) and
    // anything sized on first use are allowed to allocate once.
    run(&mut a, &mut b, 200, &mut frame, &mut r);
    let retransmits_before = a.core.qp(a.qpn).unwrap().stats().retransmits;

    ARMED.with(|x| x.set(true));
    run(&mut a, &mut b, 5000, &mut frame, &mut r);
    ARMED.with(|x| x.set(false));
    let allocs = ALLOCS.with(|n| n.get());

    let stats = a.core.qp(a.qpn).unwrap().stats();
    eprintln!(
        "{r:?}, retransmits {}, timeouts {}",
        stats.retransmits, stats.timeouts
    );
    assert_eq!(r.completed, 5200, "every WR completes once");
    assert_eq!(r.errors, 0);
    assert!(r.dropped > 100, "losses happened ({})", r.dropped);
    assert!(
        stats.retransmits > retransmits_before,
        "go-back-N ran while counting"
    );
    // Every WRITE window of B holds A's bytes, every READ window of A
    // holds B's.
    for w in 0..16u64 {
        let off = w * 16384;
        assert_eq!(
            mem(b.addr + off, 3000),
            mem(a.addr + off, 3000),
            "WRITE {w}"
        );
        assert_eq!(
            mem(a.addr + (q as u64) + off, 5000),
            mem(b.addr + 2 * q as u64 + off, 5000),
            "READ {w}"
        );
    }
    assert_eq!(
        allocs, 0,
        "heap allocations during {} frames of steady traffic",
        r.frames
    );
}
