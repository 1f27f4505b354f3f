//! The user-space half of the XDP responder.
//!
//! - **Pool MRs.** `reg_mr_pool` takes a range of the MR pool (the XDP
//!   program's `MR_POOL` map) and describes it to XDP in `POOL_MRS`.
//! - **Lending.** A connected RC QP has a slot in `RESP_STATE`. When the
//!   engine's responder is quiescent (nothing to answer, no message in
//!   progress but a plain WRITE), the data path writes the responder's
//!   state there and sets the owner to XDP; XDP then places in-order
//!   WRITEs and ACKs them itself.
//! - **Taking back.** XDP gives the QP back by itself when it meets a
//!   request it does not serve, and redirects that request. The data path
//!   takes it back before any request reaches the engine, before the QP
//!   is changed or destroyed, and before a pool MR's memory is freed. It
//!   waits out a packet XDP is in the middle of (BUSY), then reads the
//!   state back into the engine: nothing XDP did is lost, and nothing is
//!   done twice (a request that was already in flight to user space meets
//!   the updated PSN and is a duplicate).
//!
//! The owner word is changed only by atomic compare-and-exchange and
//! exchange on both sides, so every other field of a slot is written by
//! one side at a time.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rdma_common::xdp_responder::{
    owner, PoolMr, RespState, ACK_TMPL_LEN, POOL_MR_SLOTS, RD_ATOMIC_RES, RESP_SLOTS,
};

use super::{Core, QpSlot};
use crate::device::error::DeviceError;
use crate::io::xdp::XdpResponderMaps;
use crate::memory::{Access, Backing, PagePool};
use crate::transport::{Nanos, QpState, QpType, RespSnapshot};
use crate::wire::{opcode, syndrome, AethRepr, BthRepr, IpRepr, RoceRepr, TransportRepr, ICRC_LEN};

type Result<T> = std::result::Result<T, DeviceError>;

/// The XDP responder's maps and the pool's free pages, shared by the data
/// paths of one interface.
#[derive(Clone)]
pub struct XdpResponder {
    pub maps: Arc<XdpResponderMaps>,
    pub pages: Arc<Mutex<PagePool>>,
    /// Pool MRs registered: with none, XDP could serve nothing, and no QP
    /// is lent.
    live: Arc<AtomicUsize>,
    /// The interface: XDP's ACKs leave by `XDP_TX` on it.
    iface: Arc<str>,
    /// Why they would be lost, when they would (last checked at a QP's
    /// connection; then no QP is lent), so that it is said once.
    tx_problem: Arc<Mutex<Option<String>>>,
}

impl XdpResponder {
    pub fn new(maps: XdpResponderMaps, iface: &str) -> XdpResponder {
        let usable = maps.pool.usable();
        XdpResponder {
            maps: Arc::new(maps),
            pages: Arc::new(Mutex::new(PagePool::new(
                usable,
                rdma_common::mr_pool::PAGE,
            ))),
            live: Arc::new(AtomicUsize::new(0)),
            iface: iface.into(),
            tx_problem: Arc::new(Mutex::new(None)),
        }
    }

    /// Whether XDP's ACKs reach the peer: a veth delivers `XDP_TX` frames
    /// only to a peer that runs XDP itself. One rtnetlink query, made when
    /// a QP connects (the peer's program may come and go between QPs);
    /// the first time it fails, it says why.
    fn xdp_tx_reaches_peer(&self) -> bool {
        let why = crate::io::hostnet::xdp_tx_problem(&self.iface);
        let mut last = self.tx_problem.lock().expect("tx_problem lock");
        if why.is_some() && *last != why {
            log::warn!("{}", why.as_deref().unwrap_or_default());
        }
        let ok = why.is_none();
        *last = why;
        ok
    }

    fn state(&self, slot: u32) -> *mut RespState {
        self.maps.state(slot)
    }

    /// The owner word of slot `i`.
    fn owner(&self, slot: u32) -> &AtomicU64 {
        // SAFETY: the slot's first field, 8-byte aligned in the mapping,
        // which lives as long as `self`; only ever accessed atomically.
        unsafe { AtomicU64::from_ptr(std::ptr::addr_of_mut!((*self.state(slot)).owner)) }
    }
}

/// A QP's part in the XDP responder.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Lend {
    /// Its slot in `RESP_STATE`.
    pub slot: Option<u32>,
    /// XDP owns (or may own) the responder's state.
    pub lent: bool,
    /// Hand-overs: to XDP, and back to the engine.
    pub lends: u64,
    pub take_backs: u64,
    /// Not lent again before this time (data path clock): the QP's last
    /// lend ended at a request XDP never serves (a SEND), and lending it
    /// again soon would only hand it back at the next one.
    pub lend_after: u64,
    /// How long the last such hold was; doubles with every hold in a row.
    pub hold_ns: u64,
}

/// How long after a QP's last remote access its frames go on waking the
/// data path thread (see `Core::frames_can_wait_for_polls`): several of
/// the longest inline holds, so that a program that waits on memory for a
/// stream of WRITEs (`ib_write_lat`) keeps its wake-ups.
const REMOTE_ACCESS_QUIET_NS: u64 = 10_000_000;
const _: () = assert!(REMOTE_ACCESS_QUIET_NS >= 3 * crate::device::rings::INLINE_HOLD_MAX_NS);

/// The first hold of a QP whose lend a SEND ended, and the longest: a
/// QP that takes only SENDs is then handed over a hundred times a second
/// at most, and one that takes WRITEs again is lent again at once.
const HOLD_MIN_NS: u64 = 10_000;
const HOLD_MAX_NS: u64 = 10_000_000;

impl Lend {
    /// A request reached the engine for this QP at `now`; `xdp_serves`:
    /// one of the kinds XDP serves (WRITE without immediate, READ,
    /// atomic). `was_lent`: XDP held the QP when it came (so it ended a
    /// lend).
    pub(super) fn request_at_engine(&mut self, now: u64, xdp_serves: bool, was_lent: bool) {
        if xdp_serves {
            // XDP would have taken it: lend again as soon as quiescent.
            self.hold_ns = 0;
            self.lend_after = 0;
        } else if was_lent {
            self.hold_ns = (self.hold_ns * 2).clamp(HOLD_MIN_NS, HOLD_MAX_NS);
            self.lend_after = now.saturating_add(self.hold_ns);
        }
    }
}

impl Core {
    /// Lets this device's QPs use the XDP responder.
    pub fn set_xdp_responder(&mut self, xdp_responder: XdpResponder) {
        self.xdp_responder = Some(xdp_responder);
    }

    /// Registers `len` bytes of the MR pool: memory the XDP program can
    /// place WRITEs into. The range is zeroed. Returns the address (peers
    /// use it as the VA), the keys and the range's offset in the pool.
    pub fn reg_mr_pool(
        &mut self,
        pd: u32,
        len: usize,
        access: Access,
    ) -> Result<(u64, u32, u32, usize)> {
        let xdp_responder = self
            .xdp_responder
            .clone()
            .ok_or_else(|| DeviceError::NoPool("the XDP responder is not set up".into()))?;
        self.check_mr_len(len)?;
        let off = xdp_responder
            .pages
            .lock()
            .expect("pool lock")
            .alloc(len)
            .map_err(DeviceError::PoolFull)?;
        let ptr = xdp_responder.maps.pool.as_ptr().wrapping_add(off);
        // SAFETY: the allocator handed out off..off+len (whole pages of the
        // usable part); nothing else uses it.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        let addr = ptr as u64;
        // SAFETY: the pool mapping lives as long as the XDP responder's
        // maps, which outlive every MR registered in it; the range is this
        // MR's alone until it is freed after deregistration.
        let backing = unsafe { Backing::raw(ptr, len) };
        let (lkey, rkey) = match self.mem.register(pd, backing, addr, access) {
            Ok(k) => k,
            Err(e) => {
                xdp_responder.pages.lock().expect("pool lock").free(off);
                return Err(e.into());
            }
        };
        self.publish_pool_mr(&xdp_responder, (lkey, rkey), pd, access, (addr, len), off);
        Ok((addr, lkey, rkey, off))
    }

    /// Registers application memory in the pool (the drop-in library's
    /// `ibv_reg_mr` with `RDMA_XDP_POOL=1`): its pages are copied into a
    /// pool range and that range is mapped over them (`MAP_FIXED`), so the
    /// application keeps its addresses and contents while XDP can place
    /// WRITEs into them. Deregistration copies them back onto fresh
    /// anonymous pages. `None` where it cannot apply (no pool, not
    /// page-aligned, pool full): the caller registers in place instead.
    ///
    /// # Safety
    /// `ptr..ptr+len` is the caller's memory, mapped until
    /// `dereg_mr`; the whole pages it spans are ordinary private memory of
    /// this process whose backing may change (same addresses, same bytes).
    pub unsafe fn reg_mr_overlay(
        &mut self,
        pd: u32,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Option<Result<(u32, u32)>> {
        let xdp_responder = self.xdp_responder.clone()?;
        let page = rdma_common::mr_pool::PAGE;
        if len == 0 || len > self.limits.max_mr_len || !(ptr as usize).is_multiple_of(page) {
            return None;
        }
        let span = len.div_ceil(page) * page;
        // Only the program's own private, writable, anonymous pages: file
        // and shared mappings are seen by others (a pool range would cut
        // them off), and read-only pages would become writable. That
        // also leaves pages another MR already moved where they are (they
        // are a shared mapping of the pool): moving them again would leave
        // that MR's pool range, where XDP places its WRITEs, no longer
        // mapped at its addresses.
        if !private_anon_rw(ptr as usize, ptr as usize + span) {
            return None;
        }
        let off = xdp_responder
            .pages
            .lock()
            .expect("pool lock")
            .alloc(span)
            .ok()?;
        let dst = xdp_responder.maps.pool.as_ptr().wrapping_add(off);
        // SAFETY: the caller's pages (readable) into a pool range the
        // allocator just gave us; then the range over the pages.
        let mapped = unsafe {
            std::ptr::copy_nonoverlapping(ptr, dst, span);
            xdp_responder.maps.pool.map_over(ptr, off, span)
        };
        if let Err(e) = mapped {
            log::debug!("MR pool overlay at {ptr:p}: {e}");
            xdp_responder.pages.lock().expect("pool lock").free(off);
            return None;
        }
        // SAFETY: the pool range is now mapped over the caller's pages,
        // which the caller keeps mapped until deregistration, as for any
        // MR over application memory.
        let backing = unsafe { Backing::raw(ptr, len) };
        let keys = match self.mem.register(pd, backing, iova, access) {
            Ok(k) => k,
            Err(e) => {
                // SAFETY: our overlay of the caller's pages, undone.
                unsafe { unmap_overlay(ptr, dst, span) };
                xdp_responder.pages.lock().expect("pool lock").free(off);
                return Some(Err(e.into()));
            }
        };
        self.publish_pool_mr(&xdp_responder, keys, pd, access, (iova, len), off);
        self.overlays.insert(keys.0, (ptr as usize, span));
        fork_copies::add(ptr as usize, dst as usize, span);
        Some(Ok(keys))
    }

    /// Describes a pool MR to XDP (`POOL_MRS` at the rkey's slot) and
    /// remembers its range for deregistration. A slot another live MR
    /// holds stays as it is: that MR keeps the XDP path, this one gets the
    /// user path.
    fn publish_pool_mr(
        &mut self,
        xdp_responder: &XdpResponder,
        (lkey, rkey): (u32, u32),
        pd: u32,
        access: Access,
        (iova, len): (u64, usize),
        off: usize,
    ) {
        let e = xdp_responder.maps.mr(rkey % POOL_MR_SLOTS);
        // SAFETY: a slot of the POOL_MRS mapping; XDP only reads it.
        unsafe {
            if (*e).valid == 0 {
                e.write(PoolMr {
                    rkey,
                    pd,
                    access: access.0,
                    valid: 1,
                    iova,
                    len: len as u64,
                    pool_off: off as u64,
                });
            }
        }
        self.pool_owned.insert(lkey, (off, rkey));
        xdp_responder.live.fetch_add(1, Ordering::Relaxed);
        self.lend_pending = true;
    }

    /// The pool offset of an MR this device took from the pool.
    pub fn pool_offset(&self, lkey: u32) -> Option<usize> {
        self.pool_owned.get(&lkey).map(|&(off, _)| off)
    }

    /// Before a pool MR's registration goes: XDP forgets it, a placement
    /// into it still under way ends, then the range is free.
    pub(super) fn release_pool_mr(&mut self, lkey: u32) {
        let Some((off, rkey)) = self.pool_owned.remove(&lkey) else {
            return;
        };
        let Some(xdp_responder) = self.xdp_responder.clone() else {
            return;
        };
        let e = xdp_responder.maps.mr(rkey % POOL_MR_SLOTS);
        // SAFETY: a slot of the POOL_MRS mapping.
        unsafe {
            if (*e).valid != 0 && (*e).rkey == rkey {
                (*e).valid = 0;
            }
        }
        // XDP checks the entry while it holds a QP BUSY: once every slot
        // was seen out of BUSY after the entry was cleared, no placement
        // into the range is under way, on any data path's QPs.
        std::sync::atomic::fence(Ordering::SeqCst);
        for i in 0..RESP_SLOTS {
            while xdp_responder.owner(i).load(Ordering::SeqCst) == owner::BUSY {
                std::hint::spin_loop();
            }
        }
        xdp_responder.live.fetch_sub(1, Ordering::Relaxed);
        if let Some((at, span)) = self.overlays.remove(&lkey) {
            fork_copies::remove(at);
            // SAFETY: our overlay (reg_mr_overlay), no longer placed into.
            unsafe {
                unmap_overlay(
                    at as *mut u8,
                    xdp_responder.maps.pool.as_ptr().wrapping_add(off),
                    span,
                )
            };
        }
        xdp_responder.pages.lock().expect("pool lock").free(off);
    }

    /// After an RC QP connected: its slot in `RESP_STATE`, with the QP's
    /// constants and its ACK frame. (Another QP in the same slot keeps it;
    /// this one then stays on the user path.)
    pub(super) fn claim_resp_slot(&mut self, qpn: u32) {
        let Some(xdp_responder) = self.xdp_responder.clone() else {
            return;
        };
        let Some(slot) = self.qps.get_mut(&qpn) else {
            return;
        };
        if slot.qp.qp_type() != QpType::Rc || slot.lend.slot.is_some() {
            return;
        }
        let (Some(net), Some(path)) = (slot.net.as_ref(), slot.path) else {
            return;
        };
        let Some((ack, ack_len, l3, ipv4)) = ack_template(net, &slot.qp) else {
            return;
        };
        let Some(ack) = rdma_common::xdp_responder::place_ack_template(&ack[..ack_len], l3) else {
            return;
        };
        if !xdp_responder.xdp_tx_reaches_peer() {
            return;
        }
        let i = qpn % RESP_SLOTS;
        let st = xdp_responder.state(i);
        // SAFETY: the slot's `qpn` field, 4-byte aligned; claimed by
        // compare-and-exchange so that two data paths never share a slot.
        let claim = unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*st).qpn)) };
        if claim
            .compare_exchange(0, qpn, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return;
        }
        let c = slot.qp.responder_consts();
        let peer_sport = crate::wire::udp_sport_for_qps(c.dest_qpn, qpn);
        // SAFETY: we own the slot (claimed above, owner USER): XDP does not
        // touch it until the owner says XDP.
        unsafe {
            let st = &mut *st;
            st.pkey = c.pkey as u32;
            st.mtu = c.mtu;
            st.pd = c.pd;
            st.qp_access = c.access.0;
            st.ack = ack;
            st.ack_len = ack_len as u32;
            st.ack_l3 = l3 as u32;
            st.ack_ipv4 = ipv4 as u32;
            st.peer_gid = crate::wire::gid_of(path.peer_ip);
            st.peer_sport = peer_sport as u32;
            st.placed = 0;
            st.placed_bytes = 0;
            st.acks = 0;
            st.atomics = 0;
            st.reads = 0;
            st.read_bytes = 0;
            st.punts = Default::default();
        }
        slot.lend.slot = Some(i);
        self.lend_pending = true;
    }

    /// Gives the slot of a QP that goes away back.
    pub(super) fn free_resp_slot(&mut self, slot: &mut QpSlot) {
        let Some(xdp_responder) = self.xdp_responder.clone() else {
            return;
        };
        take_back(&xdp_responder, slot);
        if let Some(i) = slot.lend.slot.take() {
            // SAFETY: owner USER (taken back above): ours to clear.
            unsafe { (*xdp_responder.state(i)).qpn = 0 };
        }
    }

    /// Takes QP `qpn`'s responder state back from XDP, if lent.
    pub(super) fn take_back_qp(&mut self, qpn: u32) {
        if let (Some(xdp_responder), Some(slot)) =
            (self.xdp_responder.as_ref(), self.qps.get_mut(&qpn))
        {
            if slot.lend.lent {
                take_back(xdp_responder, slot);
                self.lend_pending = true;
            }
        }
    }

    /// Whether the frames the peers send can wait for the program's next
    /// poll of its CQ (inline progress) instead of waking the library's
    /// data path thread: for every QP, either XDP holds its responder, or
    /// the engine has not had to answer a remote access (WRITE without
    /// immediate, READ, atomic) on it for `REMOTE_ACCESS_QUIET_NS`. Such
    /// requests complete nothing here, and a program waits for them
    /// spinning on memory, not polling (`ib_write_lat`'s passive side);
    /// everything else a peer sends (SENDs, WRITEs with immediate, the
    /// answers to our own requests) ends in a completion the program polls
    /// for. (A QP's first remote access after a quiet spell can thus wait
    /// for the program's next poll, at most `INLINE_HOLD_MAX_NS`; while
    /// they keep coming the thread takes its frames. An MPI rank's
    /// rendezvous READs come now and then, between long runs of SENDs its
    /// progress loop polls for.)
    pub fn frames_can_wait_for_polls(&self, now: Nanos) -> bool {
        !self.qps.is_empty()
            && self.qps.values().all(|s| {
                (s.qp.qp_type() == QpType::Rc && s.lend.lent)
                    || s.last_remote_access
                        .is_none_or(|t| now.saturating_sub(t) >= REMOTE_ACCESS_QUIET_NS)
            })
    }

    /// Lends the QPs whose responders are quiescent to XDP. Run on a turn
    /// that read every receive ring empty: a frame still queued for a QP
    /// would meet a state XDP moved on (harmless: the engine takes the QP
    /// back first, and the frame is a duplicate or out of order for it,
    /// but a wasted hand-over).
    pub fn lend_idle(&mut self, now: u64) {
        if !self.lend_pending {
            return;
        }
        // Borrowed, not cloned: this runs on every turn of the data path
        // (five reference counts up and down, measured at 12 % of an idle
        // polling loop's time).
        let Some(xdp_responder) = self.xdp_responder.as_ref() else {
            return;
        };
        if xdp_responder.live.load(Ordering::Relaxed) == 0 {
            return;
        }
        self.lend_pending = false;
        for slot in self.qps.values_mut() {
            let Some(i) = slot.lend.slot else {
                continue;
            };
            if slot.lend.lent {
                continue;
            }
            if now < slot.lend.lend_after {
                self.lend_pending = true;
                continue;
            }
            let Some(s) = slot.qp.lendable_responder() else {
                self.lend_pending = true;
                continue;
            };
            let st = xdp_responder.state(i);
            // SAFETY: owner USER: the slot is ours until the exchange below.
            unsafe {
                let st = &mut *st;
                st.epsn = s.epsn;
                st.msn = s.msn;
                st.res_next = 0;
                match s.write {
                    Some((rkey, va, total, offset)) => {
                        st.in_write = 1;
                        st.w_rkey = rkey;
                        st.w_va = va;
                        st.w_total = total;
                        st.w_offset = offset;
                    }
                    None => {
                        st.in_write = 0;
                        st.w_rkey = 0;
                        st.w_va = 0;
                        st.w_total = 0;
                        st.w_offset = 0;
                    }
                }
                if let Some(RoceRepr {
                    ip: IpRepr::V4(ip), ..
                }) = &slot.net
                {
                    st.ip_id = ip.id as u32;
                }
            }
            xdp_responder.owner(i).swap(owner::XDP, Ordering::SeqCst);
            slot.lend.lent = true;
            slot.lend.lends += 1;
        }
    }

    /// After the engine ran for a lent QP (a response it took, a timer):
    /// a QP that left RTR/RTS comes back from XDP.
    pub(super) fn settle(xdp_responder: Option<&XdpResponder>, slot: &mut QpSlot) {
        if let Some(xdp_responder) = xdp_responder {
            if slot.lend.lent && !matches!(slot.qp.state(), QpState::Rtr | QpState::Rts) {
                take_back(xdp_responder, slot);
            }
        }
    }

    /// Whether QP `qpn`'s responder is lent to XDP now.
    pub fn lent_to_xdp(&self, qpn: u32) -> bool {
        self.qps.get(&qpn).is_some_and(|s| s.lend.lent)
    }

    /// The XDP responder's counters of QP `qpn`, if it has a slot.
    pub fn xdp_responder_stats(&self, qpn: u32) -> Option<serde_json::Value> {
        let xdp_responder = self.xdp_responder.as_ref()?;
        let slot = self.qps.get(&qpn)?;
        let i = slot.lend.slot?;
        // SAFETY: counters XDP writes; a racy read shows a slightly old value.
        let st = unsafe { std::ptr::read_volatile(xdp_responder.state(i)) };
        let mut punts = serde_json::Map::new();
        for (n, v) in rdma_common::xdp_responder::punt::NAMES.iter().zip(st.punts) {
            punts.insert((*n).into(), v.into());
        }
        Some(serde_json::json!({
            "slot": i, "lent": slot.lend.lent, "lends": slot.lend.lends,
            "take_backs": slot.lend.take_backs, "placed": st.placed,
            "placed_bytes": st.placed_bytes, "acks": st.acks, "atomics": st.atomics,
            "reads": st.reads, "read_bytes": st.read_bytes,
            "punts": punts,
        }))
    }
}

/// Takes a QP's responder state back from XDP: waits out a packet XDP is
/// in the middle of, then reads the state into the engine.
pub(super) fn take_back(xdp_responder: &XdpResponder, slot: &mut QpSlot) {
    let Some(i) = slot.lend.slot else {
        return;
    };
    if !slot.lend.lent {
        return;
    }
    let own = xdp_responder.owner(i);
    loop {
        match own.compare_exchange(owner::XDP, owner::USER, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) | Err(owner::USER) => break,
            // One packet's work: placement and an ACK.
            Err(_) => std::hint::spin_loop(),
        }
    }
    // SAFETY: owner USER: XDP no longer touches the slot.
    let st = unsafe { &*xdp_responder.state(i) };
    slot.qp.restore_responder(&snapshot_of(st));
    if let Some(RoceRepr {
        ip: IpRepr::V4(ip), ..
    }) = &mut slot.net
    {
        ip.id = st.ip_id as u16;
    }
    slot.lend.lent = false;
    slot.lend.take_backs += 1;
}

// XDP keeps as many READs and atomics for duplicates as the engine's
// resources hold.
const _: () = assert!(RD_ATOMIC_RES == crate::transport::MAX_RD_ATOMIC as usize);

/// What XDP's state says the engine's responder now is: the expected PSN,
/// the MSN, the WRITE in progress, and the READs and atomics XDP executed
/// since the QP was lent, oldest first (at most the last
/// [`RD_ATOMIC_RES`]).
pub fn snapshot_of(st: &RespState) -> RespSnapshot {
    let n = st.res_next as usize;
    let keep = n.min(RD_ATOMIC_RES);
    let mut res = [(0, None); RD_ATOMIC_RES];
    for (k, a) in res[..keep].iter_mut().enumerate() {
        let r = st.res[(n - keep + k) % RD_ATOMIC_RES];
        *a = (r.psn, (r.read == 0).then_some(r.orig));
    }
    RespSnapshot {
        epsn: st.epsn,
        msn: st.msn,
        write: (st.in_write != 0).then_some((st.w_rkey, st.w_va, st.w_total, st.w_offset)),
        res,
        n_res: keep,
    }
}

/// The ACK frame the engine would send on this QP's path, for PSN 0 and
/// MSN 0 (XDP patches them, the IPv4 ID and checksum, and the ICRC):
/// bytes, length, IP header offset, IPv4.
pub fn ack_template(
    net: &RoceRepr,
    qp: &crate::transport::QpEngine,
) -> Option<([u8; ACK_TMPL_LEN], usize, usize, bool)> {
    let c = qp.responder_consts();
    let mut t = TransportRepr::new(BthRepr {
        opcode: opcode::RC_ACKNOWLEDGE,
        pkey: c.pkey,
        dest_qpn: c.dest_qpn,
        psn: 0,
        ..Default::default()
    });
    t.aeth = Some(AethRepr {
        syndrome: syndrome::ACK_UNLIMITED,
        msn: 0,
    });
    let mut net = *net;
    if let IpRepr::V4(ip) = &mut net.ip {
        ip.id = 0;
    }
    let mut buf = [0u8; ACK_TMPL_LEN];
    let hl = net.net_header_len();
    let tl = t.emit(&mut buf[hl..], 0).ok()?;
    let n = net.emit_net_and_icrc(&mut buf, tl + ICRC_LEN).ok()?;
    let l3 = net.eth.header_len();
    Some((buf, n, l3, matches!(net.ip, IpRepr::V4(_))))
}

/// Puts fresh anonymous pages back under an overlay at `at` and copies the
/// bytes from the pool range `src` onto them.
///
/// # Safety
/// `at..at+span` is an overlay made by `reg_mr_overlay` and `src` its pool
/// range; nothing writes either meanwhile.
unsafe fn unmap_overlay(at: *mut u8, src: *const u8, span: usize) {
    // SAFETY: the caller's guarantee; replacing our own overlay mapping.
    let p = unsafe {
        libc::mmap(
            at as *mut libc::c_void,
            span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if p != libc::MAP_FAILED {
        // SAFETY: both ranges are span bytes, mapped, and distinct.
        unsafe { std::ptr::copy_nonoverlapping(src, at, span) };
    } else {
        log::warn!(
            "could not restore the pages under a pool MR at {at:p}: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Whether every page of `start..end` is private, writable, anonymous
/// memory of this process (heap, `mmap(MAP_PRIVATE|MAP_ANONYMOUS)`,
/// `memalign`): what `/proc/self/maps` says, read at registration.
fn private_anon_rw(start: usize, end: usize) -> bool {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return false;
    };
    let mut at = start;
    for l in maps.lines() {
        let mut f = l.split_whitespace();
        let (Some(range), Some(perms), Some(_), Some(_), Some(inode)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let path = f.next().unwrap_or("");
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else {
            continue;
        };
        if b <= at || a > at {
            continue;
        }
        let ok = perms.starts_with("rw") && perms.ends_with('p') && inode == "0";
        if !ok || !(path.is_empty() || path == "[heap]") {
            return false;
        }
        at = b;
        if at >= end {
            return true;
        }
    }
    false
}

/// The pool overlays of this process, for a child made by `fork`: it
/// would share them with the parent (they are `MAP_SHARED`), so a handler
/// run in the child gives it private copies instead, as an ordinary
/// `fork` would (copy-on-write). Lock-free: the handler runs in the child
/// of a multi-threaded parent, where a lock may be held by a thread that
/// no longer exists.
mod fork_copies {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Once;

    const SLOTS: usize = 1024;
    /// (address, pool address, length); address 0: free.
    static AT: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
    static SRC: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
    static LEN: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
    static HANDLER: Once = Once::new();

    pub(super) fn add(at: usize, src: usize, len: usize) {
        HANDLER.call_once(|| {
            // SAFETY: registering a child handler that only maps and
            // copies (async-signal-safe work).
            unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
        });
        for i in 0..SLOTS {
            if AT[i].load(Ordering::Acquire) == 0 {
                SRC[i].store(src, Ordering::Relaxed);
                LEN[i].store(len, Ordering::Relaxed);
                if AT[i]
                    .compare_exchange(0, at, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    return;
                }
            }
        }
        log::warn!("more than {SLOTS} pool overlays: a forked child shares the newest with us");
    }

    pub(super) fn remove(at: usize) {
        for a in &AT {
            if a.compare_exchange(at, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }

    extern "C" fn in_child() {
        for i in 0..SLOTS {
            let at = AT[i].load(Ordering::Acquire);
            if at != 0 {
                let (src, len) = (
                    SRC[i].load(Ordering::Relaxed),
                    LEN[i].load(Ordering::Relaxed),
                );
                // SAFETY: an overlay of the parent's, inherited; its pool
                // range is inherited too. The child gets anonymous pages
                // with the same bytes at the same addresses.
                unsafe { super::unmap_overlay(at as *mut u8, src as *const u8, len) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A QP whose lends SENDs keep ending is held back longer each time,
    /// up to HOLD_MAX_NS; a request XDP would serve lends it again at
    /// once; a SEND that meets the QP already on the user path changes
    /// nothing.
    #[test]
    fn sends_that_end_lends_hold_the_qp_back_longer_each_time() {
        let mut l = Lend::default();
        l.request_at_engine(1_000, false, true);
        assert_eq!(
            (l.hold_ns, l.lend_after),
            (HOLD_MIN_NS, 1_000 + HOLD_MIN_NS)
        );
        l.request_at_engine(50_000, false, false);
        assert_eq!(
            (l.hold_ns, l.lend_after),
            (HOLD_MIN_NS, 1_000 + HOLD_MIN_NS)
        );
        l.request_at_engine(60_000, false, true);
        assert_eq!(
            (l.hold_ns, l.lend_after),
            (2 * HOLD_MIN_NS, 60_000 + 2 * HOLD_MIN_NS)
        );
        for _ in 0..20 {
            l.request_at_engine(70_000, false, true);
        }
        assert_eq!(
            (l.hold_ns, l.lend_after),
            (HOLD_MAX_NS, 70_000 + HOLD_MAX_NS)
        );
        l.request_at_engine(80_000, true, false);
        assert_eq!((l.hold_ns, l.lend_after), (0, 0));
    }
}
