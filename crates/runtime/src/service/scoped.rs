//! Handing a borrowed closure to a service thread and waiting for it: the one unsafe step of
//! service cores.
//!
//! Protocol (who owns what, when):
//!
//! ```text
//!  caller                                     service thread
//!  ──────                                     ──────────────
//!  box closure (borrows caller's stack)
//!  erase its lifetime ── Job ──────────────▶  pop Job
//!  wait on Done (spin, then futex)            run closure (panics caught inside),
//!        ⋮                                    closure and its captures dropped
//!        ⋮                                    record timings, Done.state := 1, futex_wake
//!  see state 1, read timings, return ◀──────
//! ```
//!
//! The caller does not return, and cannot unwind, between sending the job and seeing
//! `state == 1` ([`Done::wait`] never panics), and the service thread drops the closure
//! before it sets `state`. So every borrow the closure holds outlives its last use: the same
//! argument as `std::thread::scope`. `Done` lives in an `Arc`, so the service thread may still
//! touch it (the futex wake) after the caller has returned.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sys;

/// A unit of work for a service thread, with the completion it must signal.
pub(crate) struct Job {
    pub(crate) run: Box<dyn FnOnce() + Send + 'static>,
    pub(crate) done: Arc<Done>,
    /// When it was sent (`sys::now_ns`), to measure the queue wait.
    pub(crate) sent_ns: u64,
}

/// Completion of one job, with what the service thread measured.
#[derive(Default)]
pub(crate) struct Done {
    state: AtomicU32,
    /// Ns from sending to the start of the run (queue wait plus wake-up).
    pub(crate) wait_ns: AtomicU64,
    /// Ns the closure ran.
    pub(crate) run_ns: AtomicU64,
}

impl Done {
    /// Marks the job finished (after its closure was dropped) and wakes the caller.
    pub(crate) fn finish(&self, wait_ns: u64, run_ns: u64) {
        self.wait_ns.store(wait_ns, Ordering::Relaxed);
        self.run_ns.store(run_ns, Ordering::Relaxed);
        self.state.store(1, Ordering::Release);
        sys::futex_wake(&self.state, 1);
    }

    /// Spins for up to `spin`, then sleeps on the futex, until [`Done::finish`]. Never panics.
    pub(crate) fn wait(&self, spin: Duration) {
        let start = Instant::now();
        while self.state.load(Ordering::Acquire) == 0 {
            if start.elapsed() < spin {
                sys::cpu_relax();
            } else {
                // A finish between the load and the wait makes the futex see 1: no lost wake.
                sys::futex_wait(&self.state, 0, None);
            }
        }
    }
}

/// Turns a closure that borrows the caller's stack into a job a service thread can run.
///
/// # Safety
/// The caller must not return or unwind past the borrows `f` holds until the job's
/// [`Done`] has finished (call [`Done::wait`] right after sending; it cannot panic), and
/// must make sure the job is either run by a service thread that finishes `done` after
/// dropping the closure, or dropped unrun before the borrows end.
pub(crate) unsafe fn erase<'a>(f: Box<dyn FnOnce() + Send + 'a>) -> Box<dyn FnOnce() + Send + 'static> {
    // SAFETY: only the lifetime bound changes (same layout: a fat Box of the same trait);
    // the caller's contract keeps every borrow alive for as long as the closure exists.
    unsafe { std::mem::transmute::<Box<dyn FnOnce() + Send + 'a>, Box<dyn FnOnce() + Send + 'static>>(f) }
}
