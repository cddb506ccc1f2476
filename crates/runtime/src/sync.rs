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

const AWAKE: u32 = 0;
const PARKED: u32 = 1;

/// How a pinned thread with nothing to do sleeps and is woken: the doorbell protocol every
/// pool of the runtime uses (component hosts, SMT contexts).
///
/// ```text
///  waker                                  sleeper
///  publish the work                       prepare_park: word = PARKED; fence(SeqCst)
///  fence(SeqCst)                          look for work again
///  ring: word == PARKED?                    found: cancel_park
///        swap AWAKE, futex wake             none:  park (sleep while word == PARKED)
/// ```
///
/// Either the waker's load sees `PARKED` (and wakes the sleeper; a sleeper not yet in the
/// futex finds `AWAKE` and does not sleep), or the sleeper's second look sees the work: the
/// two fences order both stores before both loads, so no wake-up is lost (loom-checked below).
pub(crate) struct Doorbell {
    futex: Futex,
}

impl Doorbell {
    pub(crate) fn new() -> Doorbell {
        Doorbell { futex: Futex::new(AWAKE) }
    }

    /// Wakes the sleeper if it is parked or about to park, running `before_wake` first when it
    /// does (to leave a note the sleeper reads on waking). Callers issue `fence(SeqCst)` after
    /// publishing the work and before ringing.
    pub(crate) fn ring(&self, before_wake: impl FnOnce()) {
        let word = &self.futex.word;
        if word.load(Ordering::Relaxed) == PARKED && word.swap(AWAKE, Ordering::AcqRel) == PARKED {
            before_wake();
            self.futex.wake_one();
        }
    }

    /// First half of parking: announce it. Then look for work again and call
    /// [`Doorbell::cancel_park`] or [`Doorbell::park`].
    pub(crate) fn prepare_park(&self) {
        self.futex.word.store(PARKED, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    pub(crate) fn cancel_park(&self) {
        self.futex.word.store(AWAKE, Ordering::Relaxed);
    }

    /// Sleeps until rung (returns at once if it already was).
    pub(crate) fn park(&self) {
        while self.futex.word.load(Ordering::Acquire) == PARKED {
            self.futex.wait(PARKED);
        }
    }
}

/// Runs the loom model `f` with at most `bound` preemptions per interleaving: a model with
/// three threads and a futex explodes the state space otherwise (tokio bounds its larger
/// models the same way).
#[cfg(all(test, loom))]
pub(crate) fn model_bounded(bound: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(bound);
    model.check(f);
}

#[cfg(all(test, loom))]
mod tests {
    use super::*;
    use loom::sync::atomic::AtomicBool;
    use loom::sync::Arc;
    use std::sync::atomic::AtomicU32 as QueueLength;

    /// A sleeper that parks until it sees work, against a waker that publishes work and
    /// rings, twice over: loom reports a lost wake-up as a deadlock. The work counter is a
    /// `std` atomic, outside loom's memory model, as the pools' queues are (a mutex in the SMT
    /// pool, crossbeam's queue in the components'): loom checks the doorbell around them.
    #[test]
    fn loom_doorbell_loses_no_wakeup() {
        loom::model(|| {
            let bell = Arc::new(Doorbell::new());
            let work = Arc::new(QueueLength::new(0));
            let done = Arc::new(AtomicBool::new(false));
            let sleeper = {
                let (bell, work, done) = (Arc::clone(&bell), Arc::clone(&work), Arc::clone(&done));
                loom::thread::spawn(move || {
                    let mut taken = 0;
                    while taken < 2 {
                        if work.load(std::sync::atomic::Ordering::SeqCst) > taken {
                            taken += 1;
                            continue;
                        }
                        bell.prepare_park();
                        if work.load(std::sync::atomic::Ordering::SeqCst) > taken {
                            bell.cancel_park();
                        } else {
                            bell.park();
                        }
                    }
                    done.store(true, Ordering::Release);
                })
            };
            for _ in 0..2 {
                work.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                fence(Ordering::SeqCst);
                bell.ring(|| ());
            }
            sleeper.join().unwrap();
            assert!(done.load(Ordering::Acquire));
        });
    }
}
