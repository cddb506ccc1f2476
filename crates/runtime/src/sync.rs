//! The atomics and the sleep primitive of the runtime's hand-off protocols, behind a `loom`
//! facade: under `--cfg loom` they come from `loom` so that `mailbox`'s hand-off and
//! park/unpark protocol and the components' doorbells can be model-checked; otherwise from
//! `std` and the futex in `sys`.

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};

/// `std::cell::UnsafeCell` with loom's closure API, so that loom can check who touches the
/// cell when.
#[cfg(not(loom))]
#[derive(Debug, Default)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub(crate) fn new(value: T) -> Self {
        UnsafeCell(std::cell::UnsafeCell::new(value))
    }

    /// Calls `f` with a pointer for reading.
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Calls `f` with a pointer for writing.
    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// A 32-bit word a thread can sleep on until it changes (a futex).
///
/// `wait(expected)` sleeps only while the word still holds `expected`, checked atomically with
/// going to sleep; `wake_one` wakes a sleeper. Callers change the word *before* waking, so a
/// wake can never fall between a waiter's check and its sleep.
pub(crate) struct Futex {
    pub(crate) word: AtomicU32,
    #[cfg(loom)]
    sleepers: loom::sync::Mutex<()>,
    #[cfg(loom)]
    changed: loom::sync::Condvar,
}

impl Futex {
    pub(crate) fn new(value: u32) -> Self {
        Futex {
            word: AtomicU32::new(value),
            #[cfg(loom)]
            sleepers: loom::sync::Mutex::new(()),
            #[cfg(loom)]
            changed: loom::sync::Condvar::new(),
        }
    }

    /// Sleeps while the word holds `expected` (may return spuriously; callers re-check).
    #[cfg(not(loom))]
    pub(crate) fn wait(&self, expected: u32) {
        crate::sys::futex_wait(&self.word, expected, None);
    }

    /// Wakes one thread sleeping in [`Futex::wait`].
    #[cfg(not(loom))]
    pub(crate) fn wake_one(&self) {
        crate::sys::futex_wake(&self.word, 1);
    }

    // The loom model of a futex: the kernel's check-and-sleep is atomic under the futex
    // bucket lock; here the lock is a mutex and the sleep a condition variable.
    #[cfg(loom)]
    pub(crate) fn wait(&self, expected: u32) {
        let guard = self.sleepers.lock().unwrap();
        if self.word.load(Ordering::SeqCst) == expected {
            drop(self.changed.wait(guard).unwrap());
        }
    }

    #[cfg(loom)]
    pub(crate) fn wake_one(&self) {
        let _guard = self.sleepers.lock().unwrap();
        self.changed.notify_one();
    }
}
