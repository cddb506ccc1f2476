//! The primitives the lock-free protocols of [`park`](crate::park) and
//! [`handoff`](crate::handoff) are written against: the real ones, or under `--cfg loom`
//! loom's, with the futex modelled by a condition variable so that a lost wake-up shows as a
//! deadlock loom reports. The runtime's models use the same futex through [`park`](crate::park).

#[cfg(not(loom))]
pub use imp::*;
#[cfg(loom)]
pub use loom_imp::*;

#[cfg(not(loom))]
mod imp {
    pub use core::sync::atomic::AtomicU32;

    /// `core::cell::UnsafeCell` with loom's closure API.
    #[derive(Debug, Default)]
    pub struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        /// A cell holding `value`.
        pub const fn new(value: T) -> UnsafeCell<T> {
            UnsafeCell(core::cell::UnsafeCell::new(value))
        }

        /// Calls `f` with a pointer for reading.
        #[inline(always)]
        pub fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }

        /// Calls `f` with a pointer for writing.
        #[inline(always)]
        pub fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }

    /// Sleeps while `word` holds `expected`; false if the timeout ended it.
    pub fn futex_wait(word: &AtomicU32, expected: u32, timeout_ns: Option<u64>) -> bool {
        crate::futex::wait(word, expected, timeout_ns) != crate::futex::FutexWait::TimedOut
    }

    /// Wakes the threads sleeping on `word`.
    pub fn futex_wake(word: &AtomicU32) {
        crate::futex::wake(word, i32::MAX as u32);
    }

    /// `CLOCK_MONOTONIC` in ns (vDSO: no system call, and no function an `LD_PRELOAD`
    /// library interposes).
    pub fn now_ns() -> u64 {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid, writable timespec on this frame.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }
}

#[cfg(loom)]
mod loom_imp {
    pub use loom::cell::UnsafeCell;
    pub use loom::sync::atomic::AtomicU32;
    use loom::sync::{Condvar, Mutex};

    loom::lazy_static! {
        static ref FUTEX: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());
    }

    /// A futex wait: check and sleep atomically (under the mutex) until a wake. Timeouts are
    /// not modelled: a timed wait sleeps until woken like an untimed one. One condition
    /// variable stands for every word: a wake of another word is a spurious wake-up, which
    /// every sleeper tolerates.
    pub fn futex_wait(word: &AtomicU32, expected: u32, _timeout_ns: Option<u64>) -> bool {
        let (lock, wakes) = &*FUTEX;
        let guard = lock.lock().unwrap();
        if word.load(core::sync::atomic::Ordering::SeqCst) == expected {
            drop(wakes.wait(guard).unwrap());
        }
        true
    }

    /// Wakes the threads sleeping on `word` (and, harmlessly, on every other word).
    pub fn futex_wake(_word: &AtomicU32) {
        let (lock, wakes) = &*FUTEX;
        let _guard = lock.lock().unwrap();
        wakes.notify_all();
    }

    /// Time stands still: a zero stall timeout withdraws at once, any other never does.
    pub fn now_ns() -> u64 {
        0
    }
}
