//! Handing a borrowed closure to a service thread and waiting for it: the one unsafe step of
//! service cores.
//!
//! The closure stays on the caller's stack; what travels is its address, in a request slot of
//! the service thread's lane (`corehop_sys::handoff`: the request one line, the completion
//! one line, the same discipline as the preload library's service threads).
//!
//! ```text
//!  caller                                     service thread
//!  ──────                                     ──────────────
//!  closure on its stack (borrows the caller's frame)
//!  its address, lifetime erased ── request ─▶ claim the slot
//!  wait for the completion (spin, then futex) run the closure (panics caught inside)
//!        ⋮                                    write the completion (timings)
//!  see the completion, return ◀──────────────
//! ```
//!
//! The caller does not return, and cannot unwind, between submitting the request and seeing
//! its completion (`Lane::call` never panics, and a request without a stall timeout is never
//! withdrawn), and the service thread touches the closure only between its claim and the
//! completion. So every borrow the closure holds outlives its last use: the same argument as
//! `std::thread::scope`.

use std::panic::{self, AssertUnwindSafe};

use corehop_sys::handoff::{self, Outcome, Waiting};

use crate::sys;

/// A service thread's request slots.
pub(crate) type Lane = handoff::Lane<Request, Completion>;

/// A closure to run, by address, and when it was sent.
#[derive(Clone, Copy)]
pub(crate) struct Request {
    job: *mut (dyn FnMut() + Send + 'static),
    /// `sys::now_ns` when it was sent, to measure the queue wait.
    sent_ns: u64,
}

// SAFETY: the closure behind `job` is `Send`, and only the service thread that claimed the
// request calls it, while the caller waits (module docs).
unsafe impl Send for Request {}

impl Request {
    /// When it was sent (`sys::now_ns`).
    pub(crate) fn sent_ns(&self) -> u64 {
        self.sent_ns
    }

    /// Where the closure lives (on its caller's stack).
    pub(crate) fn job_addr(&self) -> usize {
        self.job as *mut u8 as usize
    }
}

/// What the service thread measured.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Completion {
    /// Ns from sending to the start of the run (queue wait plus wake-up).
    pub(crate) wait_ns: u64,
    /// Ns the closure ran.
    pub(crate) run_ns: u64,
}

// Under loom the atomics and cells are larger.
#[cfg(not(loom))]
const _: () = assert!(handoff::fits_one_line::<Request, Completion>(), "one line each way");

/// Runs `f` on the service thread serving `lane` and waits for it, spinning up to `spin_ns`
/// (less when answers came sooner: `handoff::Waiting`) before sleeping. Returns its result (or
/// its panic), what the service thread measured, and how long the caller spun.
pub(crate) fn run_there<R: Send>(
    lane: &Lane,
    hint: usize,
    spin_ns: u64,
    f: impl FnOnce() -> R + Send,
) -> (std::thread::Result<R>, Completion, u64) {
    let mut f = Some(f);
    let mut out = None;
    let mut job = || {
        if let Some(f) = f.take() {
            out = Some(panic::catch_unwind(AssertUnwindSafe(f)));
        }
    };
    let job: &mut (dyn FnMut() + Send + '_) = &mut job;
    // SAFETY: only the lifetime bound changes (same fat pointer). The closure lives on this
    // frame until this function returns, which it does only after the completion (module docs).
    let job = unsafe {
        std::mem::transmute::<*mut (dyn FnMut() + Send + '_), *mut (dyn FnMut() + Send + 'static)>(job)
    };
    let waiting = Waiting { spin_ns, stall_timeout_ns: u64::MAX };
    let (completion, spun_ns) = loop {
        let sent_ns = sys::now_ns();
        match lane.call_spun(Request { job, sent_ns }, hint, waiting) {
            (Outcome::Done(completion), slept_after) => {
                break (completion, slept_after.unwrap_or_else(|| sys::now_ns().saturating_sub(sent_ns)))
            }
            // Every slot taken: as many callers as slots wait for this core already.
            (Outcome::Full, _) => std::thread::yield_now(),
            (Outcome::Withdrawn, _) => unreachable!("a request without a stall timeout is never withdrawn"),
        }
    };
    (out.expect("the service thread ran the closure"), completion, spun_ns)
}

/// Runs a claimed request on the service thread.
pub(crate) fn execute(request: &Request) -> Completion {
    let start = sys::now_ns();
    // SAFETY: the request is claimed: its caller waits in `run_there`, keeping the closure and
    // its borrows alive, and no one else calls it. It catches its own panics.
    unsafe { (*request.job)() };
    let end = sys::now_ns();
    Completion { wait_ns: start.saturating_sub(request.sent_ns), run_ns: end.saturating_sub(start) }
}
