//! The per-object lock and the cell it guards: the `unsafe` of object scheduling (and the
//! contract of the one `unsafe` block outside it, where `Objects::end` releases the hold its
//! `Objects::start` took).
//!
//! An operation on an object takes the object's lock *after* it has moved to the core it runs
//! on, and releases it before it returns, so the lock is never held across a hop. Exclusive
//! holders get `&mut T`; shared holders (replicated read-only operations) get `&T`. The lock
//! spins briefly and then yields, like the per-directory spin locks of the O² paper: operations
//! are short, and most wait behind an operation running on another core.
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::sys;

const WRITER: u32 = 1 << 31;
/// Spins before yielding the CPU while the lock is held elsewhere.
const SPINS_BEFORE_YIELD: u32 = 128;

/// A reader-writer spin lock with explicit acquire/release (the C API holds it from
/// `ct_start` to `ct_end`, across calls).
///
/// Taking it is safe; giving it back is `unsafe`, as in `lock_api::RawRwLock`: a release by
/// someone who does not hold it would let a second holder in beside the first, and the lock
/// of a registered object guards that object's value. Safe code holds it for the length of a
/// closure with [`OpLock::exclusive`]:
///
/// ```
/// use corehop_runtime::objects::OpLock;
/// let lock = OpLock::default();
/// assert_eq!(lock.exclusive(|| 42), 42);
/// ```
///
/// and cannot release a hold it did not take:
///
/// ```compile_fail,E0133
/// use corehop_runtime::objects::LockedCell;
/// let cell = LockedCell::new(0u64);
/// cell.exclusive(|first| {
///     cell.lock().unlock_exclusive(); // would let the next line alias `first`
///     cell.exclusive(|second| *second += 1);
///     *first += 1;
/// });
/// ```
#[derive(Debug, Default)]
pub struct OpLock {
    state: AtomicU32,
}

impl OpLock {
    #[cold]
    fn wait(spins: &mut u32) {
        *spins += 1;
        if *spins < SPINS_BEFORE_YIELD {
            sys::cpu_relax();
        } else {
            std::thread::yield_now();
        }
    }

    /// Takes the lock exclusively, waiting for every other holder to leave.
    #[inline]
    pub fn lock_exclusive(&self) {
        let mut spins = 0;
        while self.state.compare_exchange_weak(0, WRITER, Ordering::Acquire, Ordering::Relaxed).is_err() {
            Self::wait(&mut spins);
        }
    }

    /// Releases an exclusive hold.
    ///
    /// # Safety
    /// The caller holds the lock exclusively, taken by [`OpLock::lock_exclusive`] and not yet
    /// released, and gives that hold up: nothing it reached under the hold is used after this.
    #[inline]
    pub unsafe fn unlock_exclusive(&self) {
        self.state.store(0, Ordering::Release);
    }

    /// Runs `f` holding the lock exclusively, and releases it after, also when `f` panics.
    #[inline]
    pub fn exclusive<R>(&self, f: impl FnOnce() -> R) -> R {
        self.lock_exclusive();
        let _release = Release(self, true);
        f()
    }

    /// Takes the lock shared with other shared holders.
    #[inline]
    pub fn lock_shared(&self) {
        let mut spins = 0;
        loop {
            let s = self.state.load(Ordering::Relaxed);
            if s & WRITER == 0
                && self.state.compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed).is_ok()
            {
                return;
            }
            Self::wait(&mut spins);
        }
    }

    /// Releases a shared hold.
    ///
    /// # Safety
    /// The caller holds the lock shared, taken by [`OpLock::lock_shared`] and not yet released,
    /// and gives that hold up: nothing it reached under the hold is used after this.
    #[inline]
    pub unsafe fn unlock_shared(&self) {
        self.state.fetch_sub(1, Ordering::Release);
    }
}

/// A value reachable only under its [`OpLock`]. The value starts a cache line after the lock,
/// so in a cell that starts a line (a registered object's does) the lock's line, which every
/// operation writes, holds nothing that operations only read.
#[derive(Debug, Default)]
#[repr(C)]
pub struct LockedCell<T> {
    lock: OpLock,
    _rest_of_line: [u32; (LINE - size_of::<OpLock>()) / size_of::<u32>()],
    value: UnsafeCell<T>,
}

/// Bytes in a cache line.
const LINE: usize = 64;

// SAFETY: the value is only reached through `exclusive` (one holder, `&mut T`: needs `T: Send`
// because the holder may be any thread) and `shared` (many holders on many threads, `&T`: needs
// `T: Sync`). The lock's acquire/release orderings order every access after the previous
// holder's accesses.
unsafe impl<T: Send + Sync> Sync for LockedCell<T> {}

/// Releases the hold when dropped, also when the operation panics. Made only right after its
/// lock was taken (exclusively if the flag says so), and not handed out.
struct Release<'a>(&'a OpLock, bool);

impl Drop for Release<'_> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: the guard was made right after taking the hold it names, and is dropped once,
        // after the last use of what the hold guarded (the closure it outlives has returned or
        // unwound).
        unsafe {
            if self.1 {
                self.0.unlock_exclusive();
            } else {
                self.0.unlock_shared();
            }
        }
    }
}

impl<T> LockedCell<T> {
    /// `value` behind a fresh, unlocked lock.
    pub fn new(value: T) -> LockedCell<T> {
        LockedCell {
            lock: OpLock::default(),
            _rest_of_line: Default::default(),
            value: UnsafeCell::new(value),
        }
    }

    /// Where the value is (only to prefetch it: reading through it needs the lock).
    pub(crate) fn value_address(&self) -> usize {
        self.value.get() as usize
    }

    /// The lock alone, for operations whose data lives outside the cell (the C API).
    pub fn lock(&self) -> &OpLock {
        &self.lock
    }

    /// Runs `f` with the value, no other holder at the same time.
    pub fn exclusive<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        self.lock.lock_exclusive();
        let _release = Release(&self.lock, true);
        // SAFETY: the exclusive hold (released by `_release` after `f`, even on unwind) means
        // no other reference to the value exists while `f` runs.
        f(unsafe { &mut *self.value.get() })
    }

    /// Runs `f` with the value, alongside other shared holders only.
    pub fn shared<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        self.lock.lock_shared();
        let _release = Release(&self.lock, false);
        // SAFETY: while any shared hold exists no exclusive holder can enter, so only `&T`
        // references exist.
        f(unsafe { &*self.value.get() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn exclusive_holders_never_overlap() {
        let cell = Arc::new(LockedCell::new((0u64, 0u32)));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let cell = Arc::clone(&cell);
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        cell.exclusive(|(count, inside)| {
                            *inside += 1;
                            assert_eq!(*inside, 1);
                            *count += 1;
                            *inside -= 1;
                        });
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(cell.shared(|v| v.0), 80_000);
    }

    #[test]
    fn shared_holders_never_overlap_an_exclusive_one() {
        let cell = Arc::new(LockedCell::new(std::sync::atomic::AtomicI64::new(0)));
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let cell = Arc::clone(&cell);
                std::thread::spawn(move || {
                    for n in 0..20_000 {
                        if (n + i) % 8 == 0 {
                            // A writer marks the value for as long as it holds the lock.
                            cell.exclusive(|inside| {
                                assert_eq!(inside.swap(-1, Ordering::Relaxed), 0);
                                inside.store(0, Ordering::Relaxed);
                            });
                        } else {
                            cell.shared(|inside| {
                                assert!(inside.fetch_add(1, Ordering::Relaxed) >= 0, "a reader met a writer");
                                inside.fetch_sub(1, Ordering::Relaxed);
                            });
                        }
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(cell.lock().state.load(Ordering::Relaxed), 0, "every hold was given back");
    }

    #[test]
    fn a_lock_held_for_a_closure_is_released_after_it_also_on_panic() {
        let lock = OpLock::default();
        assert_eq!(lock.exclusive(|| 7), 7);
        let r = std::panic::catch_unwind(|| lock.exclusive(|| panic!("boom")));
        assert!(r.is_err());
        lock.lock_shared();
        // SAFETY: taken shared on the line above; nothing is reached under it.
        unsafe { lock.unlock_shared() };
        assert_eq!(lock.exclusive(|| 8), 8);
    }

    #[test]
    fn a_panicking_holder_releases_the_lock() {
        let cell = LockedCell::new(1);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cell.exclusive(|_| panic!("boom"))));
        assert!(r.is_err());
        assert_eq!(cell.exclusive(|v| *v), 1);
        assert_eq!(cell.shared(|v| *v), 1);
    }
}
