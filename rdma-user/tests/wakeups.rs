//! Which frames may wait for the program's next poll of its CQ instead of
//! waking the library's data path thread (`Core::frames_can_wait_for_polls`):
//! those that end in a completion the program polls for, and, a while
//! after the last one, remote accesses, which a program waits for spinning
//! on memory.

mod cores;
use cores::{connect, frames, side, Side};
use rdma_user::transport::{RecvWr, SendWr, Sge, WrOpcode};

const MS: u64 = 1_000_000;

fn pair() -> (Side, Side) {
    let mut a = side(1, 1 << 16, 64, 16);
    let mut b = side(2, 1 << 16, 64, 16);
    connect(&mut a, &b, (1, 2));
    connect(&mut b, &a, (2, 1));
    (a, b)
}

/// A posts `op` of `len` bytes to B; the frames cross both ways at `now`.
fn op(a: &mut Side, b: &mut Side, op: WrOpcode, len: u32, now: u64) {
    let sge = [Sge {
        addr: a.addr,
        length: len,
        lkey: a.lkey,
    }];
    let mut wr = SendWr::new(1, op, &sge);
    wr.rkey = b.rkey;
    wr.remote_addr = b.addr + 4096;
    if matches!(op, WrOpcode::Send | WrOpcode::RdmaWriteWithImm) {
        let rsge = [Sge {
            addr: b.addr,
            length: 4096,
            lkey: b.lkey,
        }];
        let recv = RecvWr {
            wr_id: 1,
            sg_list: &rsge,
        };
        b.core.post_recv(b.qpn, &recv).unwrap();
    }
    a.core.post_send(a.qpn, &wr).unwrap();
    for f in frames(&mut a.core, now) {
        b.core.handle_frame(now, &f);
    }
    for f in frames(&mut b.core, now) {
        a.core.handle_frame(now, &f);
    }
}

#[test]
fn sends_and_answers_wait_for_polls() {
    let (mut a, mut b) = pair();
    op(&mut a, &mut b, WrOpcode::Send, 64, MS);
    op(&mut a, &mut b, WrOpcode::RdmaWriteWithImm, 64, MS);
    // A's READ is answered by B's engine: a remote access on B, an
    // answer (ending in A's completion) on A.
    op(&mut a, &mut b, WrOpcode::RdmaRead, 64, MS);
    assert!(a.core.frames_can_wait_for_polls(MS));
    assert!(!b.core.frames_can_wait_for_polls(MS));
}

#[test]
fn a_remote_access_wakes_the_thread_until_a_quiet_spell() {
    let (mut a, mut b) = pair();
    assert!(b.core.frames_can_wait_for_polls(MS));
    op(&mut a, &mut b, WrOpcode::RdmaWrite, 64, MS);
    assert!(!b.core.frames_can_wait_for_polls(MS));
    assert!(!b.core.frames_can_wait_for_polls(5 * MS));
    // SENDs meanwhile do not renew it (an MPI rank's eager messages
    // between its rendezvous READs).
    op(&mut a, &mut b, WrOpcode::Send, 64, 8 * MS);
    assert!(b.core.frames_can_wait_for_polls(11 * MS));
    // Another WRITE starts a new spell.
    op(&mut a, &mut b, WrOpcode::RdmaWrite, 64, 12 * MS);
    assert!(!b.core.frames_can_wait_for_polls(12 * MS + 1));
    assert!(b.core.frames_can_wait_for_polls(22 * MS));
}

#[test]
fn a_zero_length_write_is_no_remote_access() {
    // UCX's flush: it changes no memory anyone could be watching.
    let (mut a, mut b) = pair();
    op(&mut a, &mut b, WrOpcode::RdmaWrite, 0, MS);
    assert!(b.core.frames_can_wait_for_polls(MS));
}
