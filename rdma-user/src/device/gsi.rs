//! QP1, the general services interface: where CM MADs enter and leave.
//!
//! The data path does not run the CM. It checks a QP1 datagram (UD
//! SEND_ONLY, the GSI Q_Key, one 256-byte MAD), queues it with the headers
//! to answer it over, and rings an eventfd; the CM's own thread
//! (`rdma-ibverbs`' librdmacm) takes it from there. MADs to send come
//! back the same way and leave between two of the QPs' frames, from QP1
//! with QP1's PSN. Both queues are bounded and lock-free; when one is
//! full, the MAD is dropped and counted, and the CM's retries recover it
//! as they would a loss on the wire.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crossbeam_queue::ArrayQueue;

use super::rings::eventfd;
use crate::wire::cm::{GSI_QKEY, MAD_LEN};
use crate::wire::{opcode, BthRepr, DethRepr, IpRepr, RoceRepr, TransportRepr, WireError};

/// MADs waiting each way: a few per connection, and programs open a
/// thousand connections at once (cmtime -c 1000).
pub const GSI_QUEUE: usize = 2048;

/// A MAD received on QP1.
#[derive(Clone)]
pub struct GsiIn {
    /// The sender's address (its GID as an IP address).
    pub peer: IpAddr,
    /// Headers that answer it: the frame's addresses reversed.
    pub reply: RoceRepr,
    pub mad: [u8; MAD_LEN],
}

/// A MAD to send from QP1 to QP1 over `net`'s headers.
#[derive(Clone)]
pub struct GsiOut {
    pub net: RoceRepr,
    pub mad: [u8; MAD_LEN],
}

/// Counters of QP1's traffic.
#[derive(Debug, Default, serde::Serialize)]
pub struct GsiStats {
    pub rx_mads: AtomicU64,
    pub tx_mads: AtomicU64,
    /// Not a UD SEND_ONLY with the GSI Q_Key and a 256-byte payload.
    pub rx_malformed: AtomicU64,
    /// The CM thread had not taken the earlier ones (queue full).
    pub rx_overflow: AtomicU64,
    pub tx_overflow: AtomicU64,
}

/// The mailbox between the data path and the CM thread.
pub struct Gsi {
    rx: ArrayQueue<GsiIn>,
    tx: ArrayQueue<GsiOut>,
    /// Readable when `rx` has MADs (the CM thread polls it).
    fd: i32,
    psn: AtomicU32,
    pub stats: GsiStats,
}

impl Drop for Gsi {
    fn drop(&mut self) {
        // SAFETY: our eventfd, closed once.
        unsafe { libc::close(self.fd) };
    }
}

impl Gsi {
    pub fn new() -> std::io::Result<Gsi> {
        Ok(Gsi {
            rx: ArrayQueue::new(GSI_QUEUE),
            tx: ArrayQueue::new(GSI_QUEUE),
            fd: eventfd(libc::EFD_NONBLOCK)?,
            psn: AtomicU32::new(0),
            stats: GsiStats::default(),
        })
    }

    /// Readable while received MADs wait; read it to rearm.
    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// Clears the fd's readiness (before draining `recv`).
    pub fn clear(&self) {
        let mut v = 0u64;
        // SAFETY: 8 bytes into a local from our nonblocking eventfd.
        let _ = unsafe { libc::read(self.fd, &mut v as *mut u64 as *mut libc::c_void, 8) };
    }

    /// The next received MAD.
    pub fn recv(&self) -> Option<GsiIn> {
        self.rx.pop()
    }

    /// Queues a MAD to send; false (and counted) when the queue is full.
    /// A CM (the only sender) asks `tx_room` first and keeps what does not
    /// fit for later.
    pub fn send(&self, out: GsiOut) -> bool {
        let ok = self.tx.push(out).is_ok();
        if !ok {
            self.stats.tx_overflow.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    /// Whether `send` has room (the data path only ever makes more).
    pub fn tx_room(&self) -> bool {
        !self.tx.is_full()
    }

    pub fn has_tx(&self) -> bool {
        !self.tx.is_empty()
    }

    /// The data path's side: a QP1 frame. Checks it is a MAD datagram
    /// and queues it.
    pub fn deliver(&self, repr: &RoceRepr, payload: &[u8], reply: Option<RoceRepr>) {
        let t = &repr.transport;
        let ok = t.bth.opcode == opcode::UD_SEND_ONLY
            && t.deth.is_some_and(|d| d.qkey == GSI_QKEY)
            && payload.len() == MAD_LEN;
        let (Some(reply), true) = (reply, ok) else {
            self.stats.rx_malformed.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let peer = match repr.ip {
            IpRepr::V4(ip) => IpAddr::from(ip.src),
            IpRepr::V6(ip) => IpAddr::from(ip.src),
        };
        let m = GsiIn {
            peer,
            reply,
            mad: payload.try_into().unwrap(),
        };
        if self.rx.push(m).is_err() {
            self.stats.rx_overflow.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.stats.rx_mads.fetch_add(1, Ordering::Relaxed);
        let one: u64 = 1;
        // SAFETY: 8 bytes from a local to our eventfd.
        let _ = unsafe { libc::write(self.fd, &one as *const u64 as *const libc::c_void, 8) };
    }

    /// The data path's side: the next MAD as a frame in `buf`; 0 for none.
    pub fn build_frame(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let Some(out) = self.tx.pop() else {
            return Ok(0);
        };
        let mut net = out.net;
        net.udp.src_port = crate::wire::udp_sport_for_ud(1);
        let mut t = TransportRepr::new(BthRepr {
            opcode: opcode::UD_SEND_ONLY,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: 0xffff,
            resv8a: 0,
            dest_qpn: 1,
            ack_req: true,
            resv7: 0,
            psn: self.psn.fetch_add(1, Ordering::Relaxed) & 0xff_ffff,
        });
        t.deth = Some(DethRepr {
            qkey: GSI_QKEY,
            src_qpn: 1,
        });
        net.transport = t;
        let n = net.emit(&out.mad, buf)?;
        self.stats.tx_mads.fetch_add(1, Ordering::Relaxed);
        Ok(n)
    }
}
