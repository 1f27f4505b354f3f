//! The tables behind the handles a program holds, as rxe's object pools
//! (`rxe_pool.c`) are behind the kernel's: which pointers are live objects
//! of a kind, and what keeps each object in memory while a call uses it.
//!
//! - [`Live<T>`]: one table per object kind, holding an `Arc<T>` per live
//!   object under the address the program was given. A lookup returns an
//!   `Arc<T>`: the kind is the table's, and the object stays in memory for
//!   as long as the caller holds it, even if another thread destroys it
//!   meanwhile (it is then out of the table: later lookups miss).
//! - [`Users`] and [`Held`]: a parent that counts the objects made on it
//!   (a context its QPs) and cannot close while any lives.
//! - [`Boxes<T>`]: a set of leaked boxes, for objects that are not
//!   reference counted (rdma_cm's ids and event channels).
//! - [`CShared<T>`]: rdma-core's struct at the head of each object, which
//!   the program reads and writes itself: reached through raw pointers
//!   only, never through a Rust reference.
//!
//! This file depends on nothing but `std`, so that Miri can run its tests
//! without the crate's dependencies (`cargo miri` cannot run the build
//! script of `rdma-user`, which builds the XDP program): in a crate whose
//! `src/lib.rs` is `#[path = "…/objects/live.rs"] mod live;`,
//! `MIRIFLAGS=-Zmiri-strict-provenance cargo +nightly miri test`.

use std::cell::{Cell, UnsafeCell};
use std::collections::{BTreeMap, BTreeSet};
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

/// How many of its last successful lookups a thread remembers (a polling
/// loop uses a CQ, a QP and perhaps an SRQ or an AH).
const SEEN: usize = 4;

/// A remembered lookup: object `addr` was in table `table` while the
/// table's removal count was `removals`.
#[derive(Clone, Copy)]
struct Seen {
    table: u64,
    addr: usize,
    removals: u64,
    /// `Weak::<T>::into_raw` of the object, `T` being table `table`'s
    /// kind: it keeps the allocation (not the object) alive, so that the
    /// address is not reused while remembered, and lets a lookup take the
    /// object without the table's lock if it still exists.
    weak: *const (),
    /// Drops `weak` (as the `Weak<T>` it is).
    drop_weak: unsafe fn(*const ()),
}

/// # Safety
/// `p` is a `Weak::<T>::into_raw`, dropped once.
unsafe fn drop_weak<T>(p: *const ()) {
    // SAFETY: the caller's promise.
    drop(unsafe { Weak::from_raw(p.cast::<T>()) });
}

thread_local! {
    /// This thread's last successful lookups, and the slot the next one
    /// takes. While a table's removal count is unchanged, nothing left it,
    /// so an object remembered with that count is still live: the posts
    /// and polls of a busy loop find their objects without the table's
    /// lock (measured: the locked lookup was 2.8 % of a spinning
    /// `ib_send_lat`). Plain cells without a destructor, so that reading
    /// them is a plain thread-local access; `RELEASE` drops the weak
    /// references when the thread exits.
    static RECENT: ([Cell<Option<Seen>>; SEEN], Cell<usize>) =
        const { ([const { Cell::new(None) }; SEEN], Cell::new(0)) };
    static RELEASE: Release = const { Release };
}

/// Drops this thread's remembered weak references when it exits.
struct Release;

impl Drop for Release {
    fn drop(&mut self) {
        let _ = RECENT.try_with(|(slots, _)| {
            for s in slots {
                if let Some(s) = s.take() {
                    // SAFETY: a slot's own weak reference, taken out of it.
                    unsafe { (s.drop_weak)(s.weak) };
                }
            }
        });
    }
}

/// Table ids, never reused (a table's address could be, by a later table
/// of another kind).
static NEXT_TABLE: AtomicU64 = AtomicU64::new(1);

/// Locks `m`; a panic of another thread while it held the lock leaves the
/// table consistent (every change is one map operation).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The live objects of one kind, by the address the program holds.
pub(crate) struct Live<T> {
    objs: Mutex<BTreeMap<usize, Arc<T>>>,
    /// How many objects left the table (bumped under the lock, after the
    /// removal): the threads' remembered lookups are valid while it is
    /// unchanged.
    removals: AtomicU64,
    /// This table's id in the threads' memory, taken on first use (0:
    /// none yet).
    id: AtomicU64,
}

impl<T: Send + Sync + 'static> Live<T> {
    pub(crate) const fn new() -> Live<T> {
        Live {
            objs: Mutex::new(BTreeMap::new()),
            removals: AtomicU64::new(0),
            id: AtomicU64::new(0),
        }
    }

    fn id(&self) -> u64 {
        let id = self.id.load(Ordering::Acquire);
        if id != 0 {
            return id;
        }
        let new = NEXT_TABLE.fetch_add(1, Ordering::Relaxed);
        match self
            .id
            .compare_exchange(0, new, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => new,
            Err(won) => won,
        }
    }

    /// Makes `obj` live; returns its address, the handle the program gets
    /// (rdma-core's struct is the object's first field).
    pub(crate) fn add(&self, obj: Arc<T>) -> *mut T {
        let p = Arc::as_ptr(&obj).cast_mut();
        lock(&self.objs).insert(p as usize, obj);
        p
    }

    /// The live object at `p`, if there is one: NULL, a destroyed object
    /// or a pointer of another kind is None.
    pub(crate) fn get<C>(&self, p: *const C) -> Option<Arc<T>> {
        let (table, addr) = (self.id(), p as usize);
        // Read before the table is: a lookup remembered below then
        // carries a count no later than the lookup it stands for.
        let removals = self.removals.load(Ordering::Acquire);
        if let Some(o) = recent(table, addr, removals) {
            return Some(o);
        }
        let o = lock(&self.objs).get(&addr)?.clone();
        remember(table, addr, removals, &o);
        Some(o)
    }

    /// Takes the object at `p` out of the table; whoever still holds it
    /// keeps it in memory until they let go.
    pub(crate) fn remove<C>(&self, p: *const C) -> Option<Arc<T>> {
        let mut objs = lock(&self.objs);
        let o = objs.remove(&(p as usize))?;
        // Every thread's memory of this table is stale from now on.
        self.removals.fetch_add(1, Ordering::AcqRel);
        drop(objs);
        Some(o)
    }

    /// Destroys the object at `p`: `release` undoes it in the data path (an
    /// error leaves it live, as it was); then it leaves the table, once,
    /// even if two threads destroy it at the same time, and is returned.
    /// `not_live` is the error for a pointer that is not a live object.
    pub(crate) fn destroy<C, E>(
        &self,
        p: *const C,
        not_live: E,
        release: impl FnOnce(&T) -> Result<(), E>,
    ) -> Result<Arc<T>, E> {
        let Some(o) = self.get(p) else {
            return Err(not_live);
        };
        release(&o)?;
        self.remove(p).ok_or(not_live)
    }

    /// The first live object `pick` chooses; `pick` runs under the table's
    /// lock, so that the object cannot leave the table meanwhile.
    pub(crate) fn find(&self, mut pick: impl FnMut(&T) -> bool) -> Option<Arc<T>> {
        lock(&self.objs).values().find(|o| pick(o)).cloned()
    }

    /// How many objects are live.
    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.objs).len()
    }
}

/// The object this thread remembers finding at `addr` in `table`, if the
/// table's removal count is still `removals` and the object still exists.
/// `T` is table `table`'s kind.
fn recent<T>(table: u64, addr: usize, removals: u64) -> Option<Arc<T>> {
    RECENT
        .try_with(|(slots, _)| {
            let s = slots.iter().find_map(|s| {
                s.get()
                    .filter(|s| (s.table, s.addr, s.removals) == (table, addr, removals))
            })?;
            // SAFETY: a slot of table `table` holds a `Weak<T>` of its
            // kind (table ids are never reused, and each table holds one
            // kind), still owned by the slot: borrowed here, not dropped.
            let weak = ManuallyDrop::new(unsafe { Weak::from_raw(s.weak.cast::<T>()) });
            weak.upgrade()
        })
        .ok()
        .flatten()
}

/// Remembers that `o` was found at `addr` in `table` (of kind `T`) with the
/// removal count read before the lookup.
fn remember<T>(table: u64, addr: usize, removals: u64, o: &Arc<T>) {
    // Registers the release at thread exit; none once the thread exits.
    if RELEASE.try_with(|_| ()).is_err() {
        return;
    }
    let new = Seen {
        table,
        addr,
        removals,
        weak: Weak::into_raw(Arc::downgrade(o)).cast(),
        drop_weak: drop_weak::<T>,
    };
    let old = RECENT.try_with(|(slots, next)| {
        let at = slots
            .iter()
            .position(|s| s.get().is_some_and(|s| (s.table, s.addr) == (table, addr)));
        let at = at.unwrap_or_else(|| {
            let n = next.get();
            next.set((n + 1) % SEEN);
            n
        });
        slots[at].replace(Some(new))
    });
    let stale = match old {
        Ok(old) => old,
        // The thread is exiting: nothing was stored.
        Err(_) => Some(new),
    };
    if let Some(s) = stale {
        // SAFETY: a weak reference no slot holds any more.
        unsafe { (s.drop_weak)(s.weak) };
    }
}

/// The count of the objects made on a parent (a context's QPs), and
/// whether the parent is closed: a parent with objects does
/// not close, a closed one takes no more.
pub(crate) struct Users(AtomicUsize);

/// The bit of `Users` that says the parent is closed.
const CLOSED: usize = 1 << (usize::BITS - 1);

/// Why a parent did not close.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum NotClosed {
    /// This many objects still use it.
    Busy(usize),
    /// It was closed already.
    Closed,
}

impl Users {
    pub(crate) const fn new() -> Users {
        Users(AtomicUsize::new(0))
    }

    /// One more object; false once the parent is closed.
    fn enter(&self) -> bool {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n & CLOSED == 0).then_some(n + 1)
            })
            .is_ok()
    }

    fn leave(&self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }

    /// Closes the parent if no object uses it.
    pub(crate) fn close(&self) -> Result<(), NotClosed> {
        match self
            .0
            .compare_exchange(0, CLOSED, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ok(()),
            Err(n) if n & CLOSED != 0 => Err(NotClosed::Closed),
            Err(n) => Err(NotClosed::Busy(n)),
        }
    }

    /// Whether the parent is closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.0.load(Ordering::Acquire) & CLOSED != 0
    }

    /// How many objects use the parent now.
    #[cfg(test)]
    fn count(&self) -> usize {
        self.0.load(Ordering::Acquire) & !CLOSED
    }
}

/// What counts its objects.
pub(crate) trait Parent: Send + Sync + 'static {
    fn users(&self) -> &Users;
}

/// An object's hold on its parent: keeps the parent in memory while the
/// object is, and counts the object as a user until it is destroyed
/// (`release`) or dropped.
pub(crate) struct Held<P: Parent> {
    parent: Arc<P>,
    counted: AtomicBool,
}

impl<P: Parent> Held<P> {
    /// A hold on `parent`; None once it is closed.
    pub(crate) fn new(parent: Arc<P>) -> Option<Held<P>> {
        parent.users().enter().then(|| Held {
            parent,
            counted: AtomicBool::new(true),
        })
    }

    /// The object is destroyed: it stops counting (once, however often
    /// this is called); the parent stays in memory while the object does.
    pub(crate) fn release(&self) {
        if self.counted.swap(false, Ordering::AcqRel) {
            self.parent.users().leave();
        }
    }
}

impl<P: Parent> Deref for Held<P> {
    type Target = P;
    fn deref(&self) -> &P {
        &self.parent
    }
}

impl<P: Parent> Drop for Held<P> {
    fn drop(&mut self) {
        self.release();
    }
}

/// Leaked boxes of `T` that the program holds pointers to, for objects
/// that are not reference counted: a pointer in the set is a live box;
/// whoever takes it out owns it.
pub(crate) struct Boxes<T> {
    set: Mutex<BTreeSet<usize>>,
    _owns: PhantomData<Box<T>>,
}

// SAFETY: the set holds addresses only; the boxes behind them are shared
// and dropped by any thread, which `add`'s caller allows (its contract).
unsafe impl<T> Send for Boxes<T> {}
// SAFETY: as above; every access to the set is under its lock.
unsafe impl<T> Sync for Boxes<T> {}

impl<T> Boxes<T> {
    pub(crate) const fn new() -> Boxes<T> {
        Boxes {
            set: Mutex::new(BTreeSet::new()),
            _owns: PhantomData,
        }
    }

    /// Makes the box at `p` live.
    ///
    /// # Safety
    /// `p` comes from `Box::<T>::into_raw`; the set owns it from now on
    /// (nobody frees it while it is in the set), and its `T` may be used
    /// and dropped by any thread.
    pub(crate) unsafe fn add(&self, p: *mut T) {
        lock(&self.set).insert(p as usize);
    }

    /// Whether `p` is a live box.
    pub(crate) fn contains<C>(&self, p: *const C) -> bool {
        lock(&self.set).contains(&(p as usize))
    }

    /// Runs `f` on the live box at `p` while no other thread can take it
    /// out of the set.
    pub(crate) fn with<C, R>(&self, p: *const C, f: impl FnOnce(&T) -> R) -> Option<R> {
        let set = lock(&self.set);
        if !set.contains(&(p as usize)) {
            return None;
        }
        // SAFETY: in the set, so a live box of T (`add`'s contract), and
        // it cannot leave the set while we hold the lock.
        Some(f(unsafe { &*(p as *const T) }))
    }

    /// Takes the box at `p` out of the set: the caller owns it now (true),
    /// or it was not live (false).
    pub(crate) fn remove<C>(&self, p: *const C) -> bool {
        lock(&self.set).remove(&(p as usize))
    }

    /// Takes the box at `p` out of the set and drops it; false if it was
    /// not live.
    pub(crate) fn destroy<C>(&self, p: *const C) -> bool {
        if !self.remove(p) {
            return false;
        }
        // SAFETY: it was a live box (`add`'s contract) and this call took
        // it out of the set, so nobody else frees it.
        drop(unsafe { Box::from_raw(p as *mut T) });
        true
    }
}

/// Plain C data that rdma-core's structs are made of: integers, arrays,
/// function pointers and pointers that are handles, with no Rust owner
/// behind them.
///
/// # Safety
/// Implemented only for types whose every field is such data, so that
/// moving or sharing one between threads cannot break a Rust invariant.
pub(crate) unsafe trait Plain {}

/// Memory the program reads and writes itself: rdma-core's struct at the
/// head of an object. It is reached through [`CShared::get`]'s raw pointer
/// only, a field at a time, and never through a reference that a write by
/// the program could invalidate. Races on it are the program's, as with
/// rdma-core (which shares the same memory with the program).
#[repr(transparent)]
pub(crate) struct CShared<T>(UnsafeCell<T>);

// SAFETY: T is plain C data (`Plain`), reached through raw pointers only.
unsafe impl<T: Plain> Send for CShared<T> {}
// SAFETY: as above; no `&T` or `&mut T` to it is handed out.
unsafe impl<T: Plain> Sync for CShared<T> {}

impl<T> CShared<T> {
    pub(crate) const fn new(v: T) -> CShared<T> {
        CShared(UnsafeCell::new(v))
    }

    /// The struct, as the program's pointer reaches it.
    pub(crate) fn get(&self) -> *mut T {
        self.0.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// An object that counts its drops.
    struct Obj {
        v: u32,
        drops: Arc<AtomicUsize>,
    }

    impl Drop for Obj {
        fn drop(&mut self) {
            self.drops.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn obj(v: u32, drops: &Arc<AtomicUsize>) -> Arc<Obj> {
        Arc::new(Obj {
            v,
            drops: drops.clone(),
        })
    }

    #[test]
    fn add_get_remove() {
        let t: Live<Obj> = Live::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let a = t.add(obj(1, &drops));
        let b = t.add(obj(2, &drops));
        assert_eq!(t.len(), 2);
        assert_eq!(t.get(a).unwrap().v, 1);
        assert_eq!(t.get(b).unwrap().v, 2);
        // Again: from this thread's memory of the lookup.
        assert_eq!(t.get(a).unwrap().v, 1);
        assert!(t.remove(a).is_some());
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert!(t.get(a).is_none());
        assert!(t.remove(a).is_none());
        assert_eq!(t.get(b).unwrap().v, 2);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn stale_null_and_foreign_pointers_are_none() {
        let t: Live<Obj> = Live::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let a = t.add(obj(1, &drops));
        assert!(t.get(a).is_some());
        assert!(t.remove(a).is_some());
        // Stale, though this thread remembers finding it.
        assert!(t.get(a).is_none());
        assert!(t.get(std::ptr::null::<u8>()).is_none());
        let foreign = 7u64;
        assert!(t.get(&foreign as *const u64).is_none());
        // A live object of another kind is not one of this table's.
        let other: Live<u64> = Live::new();
        let o = other.add(Arc::new(5u64));
        assert!(t.get(o).is_none());
        assert_eq!(*other.get(o).unwrap(), 5);
    }

    #[test]
    fn a_removed_object_lives_while_held() {
        let t: Live<Obj> = Live::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let a = t.add(obj(9, &drops));
        let held = t.get(a).unwrap();
        assert!(t.remove(a).is_some());
        assert!(t.get(a).is_none());
        // Out of the table, not freed: the holder still reads it.
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        assert_eq!(held.v, 9);
        drop(held);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn remembered_lookups_do_not_keep_objects() {
        let t: Live<Obj> = Live::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let a = t.add(obj(1, &drops));
        assert!(t.get(a).is_some());
        assert!(t.remove(a).is_some());
        // Dropped with the table's reference, although remembered.
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        // More lookups than slots: the memory wraps around.
        let ps: Vec<_> = (0..2 * SEEN as u32)
            .map(|v| t.add(obj(v, &drops)))
            .collect();
        for (v, &p) in ps.iter().enumerate() {
            assert_eq!(t.get(p).unwrap().v, v as u32);
        }
        for (v, &p) in ps.iter().enumerate().rev() {
            assert_eq!(t.get(p).unwrap().v, v as u32);
        }
    }

    #[test]
    fn an_exiting_thread_lets_go_of_what_it_remembers() {
        static T: Live<Obj> = Live::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let p = T.add(obj(3, &drops)) as usize;
        // Found without being remembered.
        let held = T.find(|o| o.v == 3).unwrap();
        std::thread::spawn(move || {
            let p = std::ptr::without_provenance::<Obj>(p);
            assert_eq!(T.get(p).unwrap().v, 3);
            assert_eq!(T.get(p).unwrap().v, 3);
        })
        .join()
        .unwrap();
        assert_eq!(Arc::weak_count(&held), 0);
        assert!(T.remove(std::ptr::without_provenance::<Obj>(p)).is_some());
    }

    #[test]
    fn destroy_releases_once() {
        let t: Live<Obj> = Live::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let a = t.add(obj(1, &drops));
        assert_eq!(
            t.destroy(a, "not live", |_| Err("busy")).err(),
            Some("busy")
        );
        assert!(t.get(a).is_some());
        let mut released = 0;
        let gone = t.destroy(a, "not live", |o| {
            released += o.v;
            Ok(())
        });
        assert_eq!(released, 1);
        assert_eq!(gone.map(|o| o.v), Ok(1));
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert_eq!(t.destroy(a, "not live", |_| Ok(())).err(), Some("not live"));
    }

    #[test]
    fn find_picks_under_the_lock() {
        let t: Live<Obj> = Live::new();
        let drops = Arc::new(AtomicUsize::new(0));
        t.add(obj(1, &drops));
        let b = t.add(obj(2, &drops));
        let found = t.find(|o| o.v == 2).unwrap();
        assert_eq!(Arc::as_ptr(&found).cast_mut(), b);
        assert!(t.find(|o| o.v == 3).is_none());
    }

    #[test]
    fn concurrent_get_and_remove() {
        static T: Live<Obj> = Live::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let rounds = if cfg!(miri) { 20 } else { 300 };
        for r in 0..rounds {
            let a = T.add(obj(r, &drops));
            let stop = Arc::new(AtomicBool::new(false));
            let (addr, st) = (a as usize, stop.clone());
            let reader = std::thread::spawn(move || {
                let mut seen = 0;
                while !st.load(Ordering::Acquire) {
                    // The address alone: a lookup never follows it.
                    let p = std::ptr::without_provenance::<Obj>(addr);
                    if let Some(o) = T.get(p) {
                        // Whatever the other thread does meanwhile, the
                        // object is whole while held.
                        assert_eq!(o.v, r);
                        seen += 1;
                    } else {
                        break;
                    }
                }
                seen
            });
            std::thread::yield_now();
            let removed = T.remove(a);
            assert!(removed.is_some());
            drop(removed);
            stop.store(true, Ordering::Release);
            reader.join().unwrap();
            assert!(T.get(a).is_none());
        }
        assert_eq!(T.len(), 0);
        assert_eq!(drops.load(Ordering::SeqCst), rounds as usize);
    }

    #[test]
    fn a_parent_with_users_does_not_close() {
        struct P(Users);
        impl Parent for P {
            fn users(&self) -> &Users {
                &self.0
            }
        }
        let p = Arc::new(P(Users::new()));
        let a = Held::new(p.clone()).unwrap();
        let b = Held::new(p.clone()).unwrap();
        assert_eq!(p.0.count(), 2);
        assert_eq!(p.0.close(), Err(NotClosed::Busy(2)));
        drop(a);
        assert_eq!(p.0.close(), Err(NotClosed::Busy(1)));
        // Destroyed while something still holds it: counted no more.
        b.release();
        b.release();
        assert_eq!(p.0.count(), 0);
        assert_eq!(Arc::strong_count(&p), 2);
        drop(b);
        assert_eq!(Arc::strong_count(&p), 1);
        assert!(!p.0.is_closed());
        assert_eq!(p.0.close(), Ok(()));
        assert!(p.0.is_closed());
        assert_eq!(p.0.close(), Err(NotClosed::Closed));
        assert!(Held::new(p.clone()).is_none());
        assert_eq!(p.0.count(), 0);
    }

    #[test]
    fn boxes_own_what_they_hold() {
        let s: Boxes<Obj> = Boxes::new();
        let drops = Arc::new(AtomicUsize::new(0));
        let p = Box::into_raw(Box::new(Obj {
            v: 4,
            drops: drops.clone(),
        }));
        // SAFETY: a fresh box, owned by the set from here on.
        unsafe { s.add(p) };
        assert!(s.contains(p));
        assert_eq!(s.with(p, |o| o.v), Some(4));
        assert!(s.destroy(p));
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert!(!s.contains(p));
        assert_eq!(s.with(p, |o| o.v), None);
        assert!(!s.destroy(p));
        assert!(!s.remove(p));
    }

    #[test]
    fn c_shared_memory_is_written_through_its_pointer() {
        #[derive(Clone, Copy)]
        struct S {
            a: u32,
            b: u32,
        }
        // SAFETY: two integers.
        unsafe impl Plain for S {}
        let drops = Arc::new(AtomicUsize::new(0));
        #[repr(C)]
        struct O {
            c: CShared<S>,
            _o: Obj,
        }
        let t: Live<O> = Live::new();
        let p = t.add(Arc::new(O {
            c: CShared::new(S { a: 1, b: 2 }),
            _o: Obj {
                v: 0,
                drops: drops.clone(),
            },
        }));
        // The program's pointer is the struct's (first field, transparent).
        let prog = p as *mut S;
        // SAFETY: the program writes its struct through its pointer.
        unsafe { (*prog).b = 7 };
        let o = t.get(p).unwrap();
        // SAFETY: a field read through the object's own pointer.
        assert_eq!(unsafe { ((*o.c.get()).a, (*o.c.get()).b) }, (1, 7));
        // SAFETY: as above, a write.
        unsafe { (*o.c.get()).a = 3 };
        // SAFETY: the program reads it.
        assert_eq!(unsafe { (*prog).a }, 3);
    }
}
