//! Memory regions: registration, lkey/rkey lookup and the access checks that
//! stand between the network and local memory.
//!
//! Every remote access goes through [`MrTable::resolve`], which checks the key,
//! the protection domain, the permission and the range (with overflow-safe
//! arithmetic) before a single byte is touched.
//!
//! It knows nothing of packets or QPs: callers bring the key, the PD, the
//! range and the access they need.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Access flags, with the values of `enum ibv_access_flags`.
#[derive(Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Access(pub u32);

impl Access {
    pub const LOCAL_WRITE: Access = Access(1);
    pub const REMOTE_WRITE: Access = Access(2);
    pub const REMOTE_READ: Access = Access(4);
    pub const REMOTE_ATOMIC: Access = Access(8);
    pub const ALL: Access = Access(15);

    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// Parses a comma-separated list such as `local-write,remote-read`.
    pub fn parse(s: &str) -> Result<Access, String> {
        let mut a = Access(0);
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            a = a | match part.to_ascii_lowercase().replace('_', "-").as_str() {
                "local-write" | "lw" => Access::LOCAL_WRITE,
                "remote-write" | "rw" => Access::REMOTE_WRITE,
                "remote-read" | "rr" => Access::REMOTE_READ,
                "remote-atomic" | "ra" => Access::REMOTE_ATOMIC,
                "all" => Access::ALL,
                other => {
                    return Err(format!(
                        "unknown access flag '{other}' (use local-write, remote-write, remote-read, remote-atomic or all)"
                    ))
                }
            };
        }
        Ok(a)
    }
}

impl core::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, o: Access) -> Access {
        Access(self.0 | o.0)
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names = Vec::new();
        for (flag, name) in [
            (Access::LOCAL_WRITE, "local-write"),
            (Access::REMOTE_WRITE, "remote-write"),
            (Access::REMOTE_READ, "remote-read"),
            (Access::REMOTE_ATOMIC, "remote-atomic"),
        ] {
            if self.contains(flag) {
                names.push(name);
            }
        }
        write!(f, "{}", names.join(","))
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Why an access to a memory region was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessError {
    /// No region has this key (never registered, or deregistered).
    BadKey,
    /// The region belongs to another protection domain.
    WrongPd,
    /// The region was not registered with the needed permission.
    NoPermission,
    /// The range leaves the region (or wraps the address space).
    OutOfRange,
    /// Atomics need an 8-byte aligned address.
    Unaligned,
    /// DMA length above 2^31, the IBA maximum message size.
    TooLong,
}

impl fmt::Display for AccessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AccessError::BadKey => "no memory region with this key",
            AccessError::WrongPd => "memory region is in another protection domain",
            AccessError::NoPermission => "memory region lacks the needed access right",
            AccessError::OutOfRange => "range is outside the memory region",
            AccessError::Unaligned => "atomic address is not 8-byte aligned",
            AccessError::TooLong => "length exceeds 2^31",
        })
    }
}
impl std::error::Error for AccessError {}

/// Hasher for u32 keys that are random already (rkeys, lkeys) or small
/// (QPNs): one multiply instead of SipHash on every packet's lookup. Not
/// exposed to untrusted key *choice* beyond lookups, which cannot grow a map.
#[derive(Default, Clone, Copy)]
pub struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = (v as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

pub type KeyMap<V> = HashMap<u32, V, std::hash::BuildHasherDefault<KeyHasher>>;

/// Where the bytes of a region live.
///
/// A region's memory is shared: the application writes and reads it
/// through its own pointers, and the XDP responder writes pool MRs from the
/// kernel, while the data path reads and writes it. So no Rust reference
/// (`&[u8]` or `&mut [u8]`) to it is ever made; every access copies through
/// raw pointers ([`MemoryRegion::read`], [`MemoryRegion::write`]) or is an
/// atomic ([`MrTable::atomic`]). Bytes that another party writes at the
/// same time may be seen torn, as on hardware: RDMA makes no promise for
/// concurrent non-atomic access.
pub enum Backing {
    /// Heap memory owned by the region (tests, simulation).
    Heap(HeapBuf),
    /// Memory owned elsewhere (a shared mapping), made by [`Backing::raw`].
    Raw(RawBuf),
}

/// A zero-filled heap allocation of whole `u64`s (so that the region's
/// start is 8-byte aligned, as atomics need and as a mapping's pages are),
/// reached only through its raw pointer (never through the `Box` it came
/// from), freed on drop.
pub struct HeapBuf {
    ptr: std::ptr::NonNull<u64>,
    words: usize,
    len: usize,
}

impl Drop for HeapBuf {
    fn drop(&mut self) {
        let slice = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.words);
        // SAFETY: `ptr` and `words` come from `Box::into_raw` of a `[u64]`
        // of `words` elements in `Backing::heap`, and this is the only
        // place that frees it (`HeapBuf` is neither `Clone` nor `Copy`).
        drop(unsafe { Box::from_raw(slice) });
    }
}

/// Memory that another owner maps, with the promise given to
/// [`Backing::raw`].
pub struct RawBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: both backings are plain memory reached through raw pointers; the
// table that holds them is used by one data-path thread at a time (it is
// moved, never shared), and the bytes themselves are only ever copied or
// accessed atomically (see above).
unsafe impl Send for Backing {}

impl Backing {
    /// `len` zero bytes on the heap.
    pub fn heap(len: usize) -> Backing {
        let words = len.div_ceil(8);
        let b: Box<[u64]> = vec![0u64; words].into_boxed_slice();
        let ptr = Box::into_raw(b).cast::<u64>();
        Backing::Heap(HeapBuf {
            // A boxed slice's pointer is never null (dangling but non-null
            // when empty).
            ptr: std::ptr::NonNull::new(ptr).expect("Box pointer is non-null"),
            words,
            len,
        })
    }

    /// Memory mapped by someone else.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes for as long
    /// as the backing is registered, and nobody may hold a Rust reference
    /// to those bytes meanwhile (other parties write them through pointers
    /// of their own, as the application and the kernel do).
    pub unsafe fn raw(ptr: *mut u8, len: usize) -> Backing {
        Backing::Raw(RawBuf { ptr, len })
    }

    fn as_ptr(&self) -> *mut u8 {
        match self {
            Backing::Heap(h) => h.ptr.as_ptr().cast::<u8>(),
            Backing::Raw(r) => r.ptr,
        }
    }
    fn len(&self) -> usize {
        match self {
            Backing::Heap(h) => h.len,
            Backing::Raw(r) => r.len,
        }
    }
}

pub struct MemoryRegion {
    pub pd: u32,
    /// The virtual address peers use for byte 0 of the region.
    pub addr: u64,
    pub access: Access,
    pub lkey: u32,
    pub rkey: u32,
    backing: Backing,
}

impl MemoryRegion {
    pub fn len(&self) -> usize {
        self.backing.len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The region's first byte, for address arithmetic only.
    pub fn as_ptr(&self) -> *const u8 {
        self.backing.as_ptr()
    }

    /// The region's bytes `offset..offset + len`, checked against its length.
    fn range_ptr(&self, offset: usize, len: usize) -> *mut u8 {
        let end = offset.checked_add(len);
        assert!(
            end.is_some_and(|e| e <= self.len()),
            "range {offset}+{len} outside a region of {} bytes",
            self.len()
        );
        // SAFETY: `offset + len <= len()` (asserted), so the result stays
        // inside (or one past) the backing's allocation.
        unsafe { self.backing.as_ptr().add(offset) }
    }

    /// Copies the bytes at `offset..offset + dst.len()` into `dst`. Panics
    /// if the range leaves the region.
    pub fn read(&self, offset: usize, dst: &mut [u8]) {
        let src = self.range_ptr(offset, dst.len());
        // SAFETY: `src` is valid for `dst.len()` bytes (checked by
        // `range_ptr`; the backing's promise keeps it mapped), `dst` is a
        // distinct Rust buffer, and no reference to the region's bytes is
        // made (see `Backing`).
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) }
    }

    /// The bytes at `offset..offset + len`, copied out.
    pub fn read_vec(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.read(offset, &mut v);
        v
    }

    /// Copies `src` into the region at `offset`. Panics if the range
    /// leaves the region.
    pub fn write(&mut self, offset: usize, src: &[u8]) {
        let dst = self.range_ptr(offset, src.len());
        // SAFETY: as in `read`, with the roles swapped; `src` is a Rust
        // buffer, so it cannot overlap the region (no reference to the
        // region's bytes exists).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) }
    }

    /// Sets `len` bytes at `offset` to `byte`. Panics if the range leaves
    /// the region.
    pub fn fill(&mut self, offset: usize, len: usize, byte: u8) {
        let dst = self.range_ptr(offset, len);
        // SAFETY: `dst` is valid for `len` bytes (checked by `range_ptr`).
        unsafe { std::ptr::write_bytes(dst, byte, len) }
    }
}

/// A checked window into one region. Only [`MrTable::resolve`] makes one
/// (the fields are private), so a window is always inside its region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolved {
    slot: usize,
    offset: usize,
    len: usize,
}

impl Resolved {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Offset of the window within its region.
    pub fn offset(&self) -> usize {
        self.offset
    }
}

/// The target of a remote atomic: 8 bytes, 8-byte aligned in memory. Only
/// [`MrTable::resolve_atomic`] makes one, after checking both, so safe code
/// cannot hand [`MrTable::atomic`] a window it may not treat as an
/// `AtomicU64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicTarget(Resolved);

impl AtomicTarget {
    /// The 8-byte window, to read it as bytes.
    pub fn window(&self) -> Resolved {
        self.0
    }
}

/// All memory regions of one device.
///
/// A key's low `slot_bits` bits are the region's slot and the rest are
/// random: a lookup is one index and one compare, no hashing on the
/// packet path (rxe does the same with 8 random bits; here at least 16 of
/// the 32 bits are random, 22 with the default 1024 regions). A freed
/// slot's next keys differ from its previous ones.
pub struct MrTable {
    slots: Vec<Option<MemoryRegion>>,
    /// The last (lkey, rkey) of each slot, never handed out again for it.
    last_keys: Vec<(u32, u32)>,
    slot_bits: u32,
    max_mr: usize,
    rng: crate::rng::Rng,
}

/// Largest message the IBA allows.
pub const MAX_MSG_LEN: u64 = 1 << 31;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegError {
    /// The device's MR limit is reached.
    TooMany {
        max: usize,
    },
    ZeroLength,
    /// `register_at`: the keys' slot is in use, or the keys name two slots.
    KeysTaken,
}

impl fmt::Display for RegError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegError::TooMany { max } => write!(
                f,
                "memory region limit reached ({max}); deregister one or raise --max-mr"
            ),
            RegError::ZeroLength => f.write_str("memory region length must be > 0"),
            RegError::KeysTaken => f.write_str("these memory region keys are taken here"),
        }
    }
}
impl std::error::Error for RegError {}

impl MrTable {
    /// `seed` drives key generation: pass real entropy in production and a
    /// fixed value in simulation, so runs reproduce.
    pub fn new(max_mr: usize, seed: u64) -> MrTable {
        // At most 2^16 regions: at least 16 random bits per key.
        let max_mr = max_mr.clamp(1, 1 << 16);
        MrTable {
            slots: Vec::new(),
            last_keys: Vec::new(),
            slot_bits: (max_mr.max(2) - 1).ilog2() + 1,
            max_mr,
            rng: crate::rng::Rng(seed ^ 0x9e37_79b9_7f4a_7c15),
        }
    }

    /// A key for `slot`: splitmix64 bits above the slot index, so a peer
    /// who has seen other keys cannot guess this one's random part.
    fn next_key(&mut self, slot: usize, avoid: [u32; 3]) -> u32 {
        loop {
            let k = ((self.rng.next_u64() as u32) << self.slot_bits) | slot as u32;
            if k != 0 && !avoid.contains(&k) {
                return k;
            }
        }
    }

    fn slot_of(&self, key: u32) -> usize {
        (key & ((1u32 << self.slot_bits) - 1)) as usize
    }

    pub fn register(
        &mut self,
        pd: u32,
        backing: Backing,
        addr: u64,
        access: Access,
    ) -> Result<(u32, u32), RegError> {
        if backing.len() == 0 {
            return Err(RegError::ZeroLength);
        }
        if self.len() >= self.max_mr {
            return Err(RegError::TooMany { max: self.max_mr });
        }
        let slot = match self.slots.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.last_keys.push((0, 0));
                self.slots.len() - 1
            }
        };
        let (old_l, old_r) = self.last_keys[slot];
        let lkey = self.next_key(slot, [old_l, old_r, 0]);
        let rkey = self.next_key(slot, [old_l, old_r, lkey]);
        self.last_keys[slot] = (lkey, rkey);
        self.slots[slot] = Some(MemoryRegion {
            pd,
            addr,
            access,
            lkey,
            rkey,
            backing,
        });
        Ok((lkey, rkey))
    }

    /// Registers `backing` under keys another table gave it (the same MR
    /// seen by several data paths). The keys' slot must be free here.
    pub fn register_at(
        &mut self,
        pd: u32,
        backing: Backing,
        addr: u64,
        access: Access,
        (lkey, rkey): (u32, u32),
    ) -> Result<(), RegError> {
        if backing.len() == 0 {
            return Err(RegError::ZeroLength);
        }
        if self.len() >= self.max_mr {
            return Err(RegError::TooMany { max: self.max_mr });
        }
        let slot = self.slot_of(lkey);
        if self.slot_of(rkey) != slot || self.slots.get(slot).is_some_and(Option::is_some) {
            return Err(RegError::KeysTaken);
        }
        while self.slots.len() <= slot {
            self.slots.push(None);
            self.last_keys.push((0, 0));
        }
        self.last_keys[slot] = (lkey, rkey);
        self.slots[slot] = Some(MemoryRegion {
            pd,
            addr,
            access,
            lkey,
            rkey,
            backing,
        });
        Ok(())
    }

    /// Registers a zero-filled heap region.
    pub fn register_heap(
        &mut self,
        pd: u32,
        len: usize,
        addr: u64,
        access: Access,
    ) -> Result<(u32, u32), RegError> {
        self.register(pd, Backing::heap(len), addr, access)
    }

    /// Removes a region by its lkey; returns its backing so the owner can free it.
    pub fn deregister(&mut self, lkey: u32) -> Option<Backing> {
        let slot = self.slot_by_lkey(lkey)?;
        Some(self.slots[slot].take()?.backing)
    }

    pub fn len(&self) -> usize {
        self.slots.iter().flatten().count()
    }
    pub fn is_empty(&self) -> bool {
        self.slots.iter().all(Option::is_none)
    }

    pub fn iter(&self) -> impl Iterator<Item = &MemoryRegion> {
        self.slots.iter().flatten()
    }

    pub fn by_lkey(&self, lkey: u32) -> Option<&MemoryRegion> {
        self.slot_by_lkey(lkey).and_then(|s| self.slots[s].as_ref())
    }
    pub fn by_lkey_mut(&mut self, lkey: u32) -> Option<&mut MemoryRegion> {
        let s = self.slot_by_lkey(lkey)?;
        self.slots[s].as_mut()
    }
    pub fn by_rkey(&self, rkey: u32) -> Option<&MemoryRegion> {
        self.slot_by_rkey(rkey).and_then(|s| self.slots[s].as_ref())
    }

    fn slot_by_lkey(&self, lkey: u32) -> Option<usize> {
        let s = self.slot_of(lkey);
        (self.slots.get(s)?.as_ref()?.lkey == lkey).then_some(s)
    }
    fn slot_by_rkey(&self, rkey: u32) -> Option<usize> {
        let s = self.slot_of(rkey);
        (self.slots.get(s)?.as_ref()?.rkey == rkey).then_some(s)
    }

    fn check(
        mr: &MemoryRegion,
        pd: u32,
        va: u64,
        len: u64,
        need: Access,
    ) -> Result<usize, AccessError> {
        if mr.pd != pd {
            return Err(AccessError::WrongPd);
        }
        if !mr.access.contains(need) {
            return Err(AccessError::NoPermission);
        }
        if len > MAX_MSG_LEN {
            return Err(AccessError::TooLong);
        }
        let off = va.checked_sub(mr.addr).ok_or(AccessError::OutOfRange)?;
        let end = off.checked_add(len).ok_or(AccessError::OutOfRange)?;
        if end > mr.len() as u64 {
            return Err(AccessError::OutOfRange);
        }
        Ok(off as usize)
    }

    /// Checks a remote access (by rkey).
    pub fn resolve(
        &self,
        rkey: u32,
        pd: u32,
        va: u64,
        len: u64,
        need: Access,
    ) -> Result<Resolved, AccessError> {
        let slot = self.slot_by_rkey(rkey).ok_or(AccessError::BadKey)?;
        let mr = self.slots[slot].as_ref().ok_or(AccessError::BadKey)?;
        let offset = Self::check(mr, pd, va, len, need)?;
        Ok(Resolved {
            slot,
            offset,
            len: len as usize,
        })
    }

    /// Checks a local access (by lkey). Local reads need no flag; local writes
    /// (RECV, READ responses, atomic results) need LOCAL_WRITE.
    pub fn resolve_local(
        &self,
        lkey: u32,
        pd: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<Resolved, AccessError> {
        let slot = self.slot_by_lkey(lkey).ok_or(AccessError::BadKey)?;
        let mr = self.slots[slot].as_ref().ok_or(AccessError::BadKey)?;
        let offset = Self::check(mr, pd, addr, len, need)?;
        Ok(Resolved {
            slot,
            offset,
            len: len as usize,
        })
    }

    /// Copies a resolved window into `dst` (`dst.len()` must be the
    /// window's). Panics only on a `Resolved` that this table did not
    /// produce or a wrong length (programming errors, never input-driven).
    pub fn read(&self, r: Resolved, dst: &mut [u8]) {
        assert_eq!(dst.len(), r.len, "window and buffer lengths differ");
        self.slots[r.slot]
            .as_ref()
            .expect("resolved slot")
            .read(r.offset, dst);
    }

    /// Copies `src` into a resolved window (`src.len()` must be the
    /// window's).
    pub fn write(&mut self, r: Resolved, src: &[u8]) {
        assert_eq!(src.len(), r.len, "window and buffer lengths differ");
        self.slots[r.slot]
            .as_mut()
            .expect("resolved slot")
            .write(r.offset, src);
    }

    /// The address of a resolved window's first byte.
    fn window_ptr(&self, r: Resolved) -> *mut u8 {
        self.slots[r.slot]
            .as_ref()
            .expect("resolved slot")
            .range_ptr(r.offset, r.len)
    }

    /// Executes an 8-byte atomic at a resolved, aligned window. The value is in
    /// host byte order in memory, as on hardware and rxe. Returns the original.
    pub fn atomic(&mut self, t: AtomicTarget, op: AtomicOp) -> u64 {
        let p = self.window_ptr(t.0);
        assert!(t.0.len == 8 && (p as usize).is_multiple_of(8));
        // SAFETY: the window is 8 bytes inside a registered region, 8-byte
        // aligned (checked by `resolve_atomic`, the only maker of an
        // AtomicTarget, and asserted above). Other parties may access the
        // same bytes; an `AtomicU64` is the sound way to share them.
        let a = unsafe { AtomicU64::from_ptr(p.cast::<u64>()) };
        match op {
            AtomicOp::FetchAdd(add) => a.fetch_add(add, Ordering::SeqCst),
            AtomicOp::CmpSwap { compare, swap } => {
                match a.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(v) | Err(v) => v,
                }
            }
        }
    }

    /// Resolves the target of a remote atomic: REMOTE_ATOMIC permission, 8
    /// bytes, 8-byte aligned both in the peer's VA and in our memory.
    pub fn resolve_atomic(&self, rkey: u32, pd: u32, va: u64) -> Result<AtomicTarget, AccessError> {
        if !va.is_multiple_of(8) {
            return Err(AccessError::Unaligned);
        }
        let r = self.resolve(rkey, pd, va, 8, Access::REMOTE_ATOMIC)?;
        if !(self.window_ptr(r) as usize).is_multiple_of(8) {
            return Err(AccessError::Unaligned);
        }
        Ok(AtomicTarget(r))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicOp {
    FetchAdd(u64),
    CmpSwap { compare: u64, swap: u64 },
}

/// Hands out page-aligned ranges of the MR pool (first fit; freed ranges
/// merge with their neighbours). Offsets only: the memory is the caller's.
#[derive(Debug)]
pub struct PagePool {
    page: usize,
    /// Free ranges, start -> length.
    free: BTreeMap<usize, usize>,
    /// Ranges handed out, start -> length.
    used: HashMap<usize, usize>,
}

/// No free range is large enough.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolFull {
    pub wanted: usize,
    /// The largest free range.
    pub largest: usize,
    pub free: usize,
}

impl fmt::Display for PoolFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the MR pool has no free range of {} bytes ({} bytes free, the largest range {})",
            self.wanted, self.free, self.largest
        )
    }
}

impl std::error::Error for PoolFull {}

impl PagePool {
    /// A pool of `bytes` (a multiple of `page`).
    pub fn new(bytes: usize, page: usize) -> PagePool {
        assert!(page.is_power_of_two() && bytes.is_multiple_of(page));
        let mut free = BTreeMap::new();
        if bytes > 0 {
            free.insert(0, bytes);
        }
        PagePool {
            page,
            free,
            used: HashMap::new(),
        }
    }

    /// The start of a free range of at least `len` bytes (whole pages).
    pub fn alloc(&mut self, len: usize) -> Result<usize, PoolFull> {
        let want = len.max(1).div_ceil(self.page) * self.page;
        let Some((&start, &have)) = self.free.iter().find(|(_, &l)| l >= want) else {
            return Err(PoolFull {
                wanted: want,
                largest: self.free.values().copied().max().unwrap_or(0),
                free: self.free_bytes(),
            });
        };
        self.free.remove(&start);
        if have > want {
            self.free.insert(start + want, have - want);
        }
        self.used.insert(start, want);
        Ok(start)
    }

    /// Gives back the range that starts at `start`; false if none does.
    pub fn free(&mut self, start: usize) -> bool {
        let Some(len) = self.used.remove(&start) else {
            return false;
        };
        let (mut lo, mut hi) = (start, start + len);
        if let Some((&prev, &plen)) = self.free.range(..start).next_back() {
            if prev + plen == start {
                self.free.remove(&prev);
                lo = prev;
            }
        }
        if let Some(nlen) = self.free.remove(&hi) {
            hi += nlen;
        }
        self.free.insert(lo, hi - lo);
        true
    }

    pub fn free_bytes(&self) -> usize {
        self.free.values().sum()
    }

    /// The length handed out at `start`, if any.
    pub fn allocated(&self, start: usize) -> Option<usize> {
        self.used.get(&start).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks() {
        let mut t = MrTable::new(4, 1);
        let (lkey, rkey) = t
            .register_heap(1, 4096, 0x10000, Access::REMOTE_READ | Access::LOCAL_WRITE)
            .unwrap();
        assert_ne!(lkey, rkey);
        assert!(t
            .resolve(rkey, 1, 0x10000, 4096, Access::REMOTE_READ)
            .is_ok());
        assert_eq!(
            t.resolve(rkey, 1, 0x10000, 4097, Access::REMOTE_READ),
            Err(AccessError::OutOfRange)
        );
        assert_eq!(
            t.resolve(rkey, 1, 0xffff, 1, Access::REMOTE_READ),
            Err(AccessError::OutOfRange)
        );
        assert_eq!(
            t.resolve(rkey, 1, u64::MAX, 2, Access::REMOTE_READ),
            Err(AccessError::OutOfRange)
        );
        assert_eq!(
            t.resolve(rkey, 1, 0x10000, 8, Access::REMOTE_WRITE),
            Err(AccessError::NoPermission)
        );
        assert_eq!(
            t.resolve(rkey, 2, 0x10000, 8, Access::REMOTE_READ),
            Err(AccessError::WrongPd)
        );
        assert_eq!(
            t.resolve(rkey ^ 1, 1, 0x10000, 8, Access::REMOTE_READ),
            Err(AccessError::BadKey)
        );
        assert_eq!(
            t.resolve(rkey, 1, 0x10000, 1 << 32, Access::REMOTE_READ),
            Err(AccessError::TooLong)
        );
        assert!(t.deregister(lkey).is_some());
        assert_eq!(
            t.resolve(rkey, 1, 0x10000, 8, Access::REMOTE_READ),
            Err(AccessError::BadKey)
        );
    }

    #[test]
    fn limit_and_unguessable_keys() {
        let mut t = MrTable::new(3, 7);
        let mut keys = Vec::new();
        for _ in 0..3 {
            let (l, r) = t.register_heap(1, 64, 0, Access::ALL).unwrap();
            keys.push(l);
            keys.push(r);
        }
        assert_eq!(
            t.register_heap(1, 64, 0, Access::ALL),
            Err(RegError::TooMany { max: 3 })
        );
        // No two consecutive keys differ by a small constant.
        for w in keys.windows(2) {
            assert!(w[0].abs_diff(w[1]) > 0x1000, "{keys:x?}");
        }
    }

    #[test]
    fn keys_index_directly_and_are_not_reused() {
        let mut t = MrTable::new(1024, 11);
        let (l, r) = t.register_heap(1, 64, 0x1000, Access::ALL).unwrap();
        // 10 slot bits, 22 random ones: the same slot with another random
        // part is a bad key, for lkeys and rkeys alike.
        for bit in [10, 20, 31] {
            assert!(t.by_lkey(l ^ (1 << bit)).is_none());
            assert_eq!(
                t.resolve(r ^ (1 << bit), 1, 0x1000, 8, Access::REMOTE_READ),
                Err(AccessError::BadKey)
            );
        }
        assert!(t.by_rkey(r).is_some() && t.by_lkey(r).is_none() && t.by_rkey(l).is_none());
        // The freed slot's next region gets new keys: the old ones stay bad.
        t.deregister(l).unwrap();
        let (l2, r2) = t.register_heap(1, 64, 0x1000, Access::ALL).unwrap();
        assert_eq!(l2 & 0x3ff, l & 0x3ff, "same slot");
        assert!(l2 != l && r2 != r && l2 != r && r2 != l);
        assert!(t.by_lkey(l).is_none() && t.by_rkey(r).is_none());
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn page_pool_first_fit_merges_and_reports_full() {
        let mut p = PagePool::new(16 * 4096, 4096);
        let a = p.alloc(1).unwrap();
        let b = p.alloc(4097).unwrap();
        let c = p.alloc(4096).unwrap();
        assert_eq!((a, b, c), (0, 4096, 3 * 4096));
        assert_eq!(p.allocated(b), Some(8192));
        assert_eq!(p.free_bytes(), 12 * 4096);
        // A hole of two pages is reused first fit, the rest stays free.
        assert!(p.free(b));
        assert!(!p.free(b), "a second free is refused");
        assert_eq!(p.alloc(4096).unwrap(), 4096);
        let e = p.alloc(13 * 4096).unwrap_err();
        assert_eq!(e.wanted, 13 * 4096);
        assert_eq!(e.largest, 12 * 4096);
        assert_eq!(e.free, 13 * 4096);
        // Freeing everything merges back into one range.
        for s in [0, 4096, 3 * 4096] {
            assert!(p.free(s));
        }
        assert_eq!(p.free_bytes(), 16 * 4096);
        assert_eq!(p.alloc(16 * 4096).unwrap(), 0);
    }

    #[test]
    fn atomics() {
        let mut t = MrTable::new(4, 1);
        let (_, rkey) = t.register_heap(1, 64, 0x1000, Access::ALL).unwrap();
        assert_eq!(
            t.resolve_atomic(rkey, 1, 0x1004),
            Err(AccessError::Unaligned)
        );
        let r = t.resolve_atomic(rkey, 1, 0x1008).unwrap();
        assert_eq!(t.atomic(r, AtomicOp::FetchAdd(5)), 0);
        assert_eq!(
            t.atomic(
                r,
                AtomicOp::CmpSwap {
                    compare: 5,
                    swap: 9
                }
            ),
            5
        );
        assert_eq!(t.atomic(r, AtomicOp::FetchAdd(1)), 9);
        let mut got = [0u8; 8];
        t.read(r.window(), &mut got);
        assert_eq!(got, 10u64.to_ne_bytes());
    }

    /// An application's buffer registered in place: the application keeps
    /// writing and reading it through its own pointer between the table's
    /// copies and atomics, as a verbs program does with its MR while the
    /// data path serves peers. Run under Miri, this also checks that no
    /// access of the table invalidates the application's pointer (no
    /// reference to the shared bytes is ever made).
    #[test]
    fn the_application_and_the_table_share_bytes_through_pointers() {
        let mut app = vec![0u64; 4];
        let p = app.as_mut_ptr().cast::<u8>();
        let mut t = MrTable::new(4, 1);
        // SAFETY: `app` stays allocated until after the deregistration
        // below, and from here on only `p` touches its bytes.
        let backing = unsafe { Backing::raw(p, 32) };
        let (lkey, rkey) = t.register(1, backing, p as u64, Access::ALL).unwrap();
        // SAFETY: inside the 32 bytes of `app`, which only `p` touches.
        unsafe { p.add(8).write(7) };
        let r = t
            .resolve(rkey, 1, p as u64 + 8, 8, Access::REMOTE_READ)
            .unwrap();
        let mut got = [0u8; 8];
        t.read(r, &mut got);
        assert_eq!(got[0], 7);
        t.write(r, &[1; 8]);
        // SAFETY: as above.
        assert_eq!(unsafe { p.add(15).read() }, 1);
        let a = t.resolve_atomic(rkey, 1, p as u64 + 16).unwrap();
        // SAFETY: as above; 8-byte aligned (a u64 of `app`).
        unsafe { p.add(16).cast::<u64>().write(40) };
        assert_eq!(t.atomic(a, AtomicOp::FetchAdd(2)), 40);
        // SAFETY: as above.
        assert_eq!(unsafe { p.add(16).cast::<u64>().read() }, 42);
        let m = t.by_lkey_mut(lkey).unwrap();
        m.fill(24, 8, 0xee);
        assert_eq!(m.read_vec(22, 4), [0, 0, 0xee, 0xee]);
        assert!(t.deregister(lkey).is_some());
        drop(app);
    }

    #[test]
    #[should_panic(expected = "outside a region")]
    fn a_copy_past_the_region_panics_before_touching_memory() {
        let mut t = MrTable::new(4, 1);
        let (lkey, _) = t.register_heap(1, 16, 0x1000, Access::ALL).unwrap();
        t.by_lkey_mut(lkey).unwrap().write(10, &[0; 7]);
    }
}
