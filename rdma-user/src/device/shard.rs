//! Several data paths on one interface: one per RX queue, each with its
//! own AF_XDP socket, its own engine and its own QPs, as a NIC's queues
//! are. A QP belongs to the data path its QPN names (`qpn % count`), so
//! finding the owner takes no table and no lock.
//!
//! The sender's UDP source port is the RSS entropy that picks the queue a
//! frame arrives on, and the peer chose it: a frame may land on another
//! queue than its QP's. That data path hands it over through a
//! [`Handoff`], a pair of lock-free queues of preallocated buffers (full
//! ones one way, empty ones back), and counts it. Nothing is allocated or
//! locked per frame; when the owner has fallen behind and no buffer is
//! free, the frame is dropped and counted, as a full RX ring drops it.

use std::sync::Arc;

use crossbeam_queue::ArrayQueue;

/// Buffers per direction between two data paths.
const HANDOFF_SLOTS: usize = 256;
/// Largest frame handed over (jumbo frame plus a multi-buffer tail).
pub const HANDOFF_FRAME: usize = 9216 + 4096;

/// Which data path owns `qpn` among `count`.
pub fn owner_of(qpn: u32, count: u32) -> u32 {
    if count <= 1 {
        0
    } else {
        qpn % count
    }
}

/// Frames from one data path to another.
pub struct Handoff {
    full: ArrayQueue<(usize, Box<[u8]>)>,
    free: ArrayQueue<Box<[u8]>>,
}

impl Handoff {
    fn new() -> Handoff {
        let free = ArrayQueue::new(HANDOFF_SLOTS);
        for _ in 0..HANDOFF_SLOTS {
            let _ = free.push(vec![0u8; HANDOFF_FRAME].into_boxed_slice());
        }
        Handoff {
            full: ArrayQueue::new(HANDOFF_SLOTS),
            free,
        }
    }

    /// Copies `frame` into a free buffer and queues it; false when none is
    /// free or the frame is too long (the frame is then dropped).
    pub fn push(&self, frame: &[u8]) -> bool {
        if frame.len() > HANDOFF_FRAME {
            return false;
        }
        let Some(mut b) = self.free.pop() else {
            return false;
        };
        b[..frame.len()].copy_from_slice(frame);
        // Cannot fail: there are as many full slots as buffers.
        let _ = self.full.push((frame.len(), b));
        true
    }

    /// Hands up to `max` queued frames to `f`, then returns their buffers.
    pub fn drain(&self, max: usize, mut f: impl FnMut(&[u8])) -> usize {
        let mut n = 0;
        while n < max {
            let Some((len, b)) = self.full.pop() else {
                break;
            };
            f(&b[..len]);
            let _ = self.free.push(b);
            n += 1;
        }
        n
    }

    pub fn is_empty(&self) -> bool {
        self.full.is_empty()
    }
}

/// One data path's place among its interface's data paths.
pub struct Shard {
    pub index: u32,
    pub count: u32,
    /// To each other data path (None at our own index).
    out: Vec<Option<Arc<Handoff>>>,
    /// From each other data path.
    inbound: Vec<Arc<Handoff>>,
    /// Frames this data path received for another's QP and handed over.
    pub rx_wrong_queue: u64,
    /// Of those, dropped because the owner had no free buffer.
    pub rx_wrong_queue_dropped: u64,
}

impl Shard {
    /// The places of `count` data paths, each with a handoff to every
    /// other.
    pub fn mesh(count: u32) -> Vec<Shard> {
        let n = count.max(1) as usize;
        // links[from][to]
        let links: Vec<Vec<Option<Arc<Handoff>>>> = (0..n)
            .map(|from| {
                (0..n)
                    .map(|to| (from != to).then(|| Arc::new(Handoff::new())))
                    .collect()
            })
            .collect();
        (0..n)
            .map(|i| Shard {
                index: i as u32,
                count: n as u32,
                out: links[i].clone(),
                inbound: (0..n).filter_map(|from| links[from][i].clone()).collect(),
                rx_wrong_queue: 0,
                rx_wrong_queue_dropped: 0,
            })
            .collect()
    }

    /// The data path that must handle a frame for `qpn`, when it is not
    /// this one. QP1 (the CM's MADs) belongs to the first.
    pub fn elsewhere(&self, qpn: u32) -> Option<u32> {
        let o = owner_of(qpn, self.count);
        (o != self.index).then_some(o)
    }

    /// Hands a frame to data path `to`, counting it.
    pub fn hand_over(&mut self, to: u32, frame: &[u8]) {
        self.rx_wrong_queue += 1;
        let ok = self.out[to as usize]
            .as_ref()
            .is_some_and(|h| h.push(frame));
        if !ok {
            self.rx_wrong_queue_dropped += 1;
        }
    }

    /// Frames other data paths handed to this one, up to `max` from each.
    pub fn drain(&self, max: usize, mut f: impl FnMut(&[u8])) -> usize {
        self.inbound.iter().map(|h| h.drain(max, &mut f)).sum()
    }

    pub fn has_inbound(&self) -> bool {
        self.inbound.iter().any(|h| !h.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_follow_the_qpn() {
        assert_eq!(owner_of(0x11, 1), 0);
        assert_eq!(owner_of(0x11, 2), 1);
        assert_eq!(owner_of(0x12, 2), 0);
        assert_eq!(owner_of(1, 2), 1);
    }

    #[test]
    fn frames_cross_in_order_and_buffers_come_back() {
        let mut s = Shard::mesh(2);
        let (a, b) = s.split_at_mut(1);
        let (a, b) = (&mut a[0], &b[0]);
        for round in 0..3 {
            for i in 0..HANDOFF_SLOTS {
                a.hand_over(1, &[i as u8, round as u8, 7]);
            }
            // Full: the next one is dropped and counted.
            a.hand_over(1, &[0xff]);
            let mut got = Vec::new();
            assert_eq!(b.drain(usize::MAX, |f| got.push(f.to_vec())), HANDOFF_SLOTS);
            assert_eq!(got.len(), HANDOFF_SLOTS);
            assert!(got
                .iter()
                .enumerate()
                .all(|(i, f)| f == &[i as u8, round as u8, 7]));
        }
        assert_eq!(a.rx_wrong_queue, 3 * (HANDOFF_SLOTS as u64 + 1));
        assert_eq!(a.rx_wrong_queue_dropped, 3);
        assert!(!b.has_inbound());
        // Too long for a buffer: dropped, not truncated.
        a.hand_over(1, &vec![0u8; HANDOFF_FRAME + 1]);
        assert_eq!(a.rx_wrong_queue_dropped, 4);
        assert_eq!(b.drain(8, |_| panic!("nothing queued")), 0);
    }
}
