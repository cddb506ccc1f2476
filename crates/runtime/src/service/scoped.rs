//! Handing a borrowed closure to a service thread and waiting for it: the one unsafe step of
//! service cores.
//!
//! The request travels in a slot of the service thread's lane (`corehop_sys::handoff`: the
//! request one cache line, the completion one line). A small closure travels *in* the request
//! line (its bytes, moved there) and a small result comes back in the completion line, so the
//! service thread touches no line of the caller's but those two; a larger one stays on the
//! caller's stack and its address travels instead.
//!
//! ```text
//!  caller                                     service thread
//!  ──────                                     ──────────────
//!  closure moved into the request (or its address, lifetime erased)
//!                          ── request ──────▶ claim the slot
//!  wait for the completion (spin, then futex) run the closure (panics caught inside),
//!        ⋮                                    its result into the completion (or the
//!        ⋮                                    caller's stack), with the timings
//!  see the completion, take the result ◀────
//! ```
//!
//! The caller does not return, and cannot unwind, between submitting the request and seeing
//! its completion (`Lane::call` never panics, and a request without a stall timeout is never
//! withdrawn), and the service thread touches the closure only between its claim and the
//! completion. So every borrow the closure holds outlives its last use: the same argument as
//! `std::thread::scope`. A request runs exactly once (the lane's claim), so a closure moved
//! into one is moved out exactly once, and its result likewise.

use std::mem::{align_of, size_of, MaybeUninit};
use std::panic::{self, AssertUnwindSafe};
use std::thread::Result as Caught;

use corehop_sys::handoff::{self, Outcome, Waiting};

use crate::sys;

/// A service thread's request slots.
pub(crate) type Lane = handoff::Lane<Request, Completion>;

/// Bytes of closure that travel in the request line.
const ENV_BYTES: usize = 24;
/// Bytes of result (a `std::thread::Result<R>`) that travel in the completion line.
const RESULT_BYTES: usize = 32;

/// Plain bytes with the alignment of a word, for values moved through a slot.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
pub(crate) struct Bytes<const N: usize>([MaybeUninit<u8>; N]);

impl<const N: usize> Bytes<N> {
    fn uninit() -> Self {
        Bytes([MaybeUninit::uninit(); N])
    }

    /// Whether a `T` fits (size and alignment).
    const fn fits<T>() -> bool {
        size_of::<T>() <= N && align_of::<T>() <= 8
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr().cast()
    }
}

/// What to run: a function that knows the closure's type, and the closure's bytes (or its
/// address), and when it was sent.
#[derive(Clone, Copy)]
pub(crate) struct Request {
    /// Runs the closure in `env`, writing its caught result to `out` (inline) or to the
    /// caller's stack (by address).
    run: unsafe fn(env: *mut u8, out: *mut u8),
    env: Bytes<ENV_BYTES>,
    /// Where the closure lives if it stayed on the caller's stack (0: it travels inline).
    job_addr: usize,
    /// `sys::now_ns` when it was sent, to measure the queue wait.
    sent_ns: u64,
}

// SAFETY: the closure in (or behind) `env` is `Send`, and only the service thread that claimed
// the request runs it, once, while the caller waits (module docs).
unsafe impl Send for Request {}

impl Request {
    /// When it was sent (`sys::now_ns`).
    pub(crate) fn sent_ns(&self) -> u64 {
        self.sent_ns
    }

    /// Where the closure lives on its caller's stack (0: it travels in the request line).
    pub(crate) fn job_addr(&self) -> usize {
        self.job_addr
    }
}

/// What the service thread measured, and a small result.
#[derive(Clone, Copy)]
pub(crate) struct Completion {
    /// Ns from sending to the start of the run (queue wait plus wake-up).
    pub(crate) wait_ns: u64,
    /// Ns the closure ran.
    pub(crate) run_ns: u64,
    result: Bytes<RESULT_BYTES>,
}

// Under loom the atomics and cells are larger.
#[cfg(not(loom))]
const _: () = assert!(handoff::fits_one_line::<Request, Completion>(), "one line each way");

/// Runs an `F` moved into `env`, writing its caught result to `out`.
///
/// # Safety
/// `env` holds an `F` that nothing else will read or drop; `out` has room for a
/// `Caught<R>` (size and alignment) and is not read before this returns.
unsafe fn run_inline<F: FnOnce() -> R, R>(env: *mut u8, out: *mut u8) {
    // SAFETY: the caller's contract: `env` holds an `F` read once, here.
    let f = unsafe { std::ptr::read(env.cast::<F>()) };
    let result: Caught<R> = panic::catch_unwind(AssertUnwindSafe(f));
    // SAFETY: the caller's contract: `out` has room for it.
    unsafe { std::ptr::write(out.cast::<Caught<R>>(), result) };
}

/// Runs the closure whose address is in `env` (it writes its result on its caller's stack).
///
/// # Safety
/// `env` holds a live `*mut (dyn FnMut() + Send)` that no one else calls meanwhile.
unsafe fn run_indirect(env: *mut u8, _out: *mut u8) {
    // SAFETY: the caller's contract.
    unsafe {
        let job = std::ptr::read(env.cast::<*mut (dyn FnMut() + Send + 'static)>());
        (*job)()
    }
}

/// Runs `f` on the service thread serving `lane` and waits for it, spinning up to `spin_ns`
/// (less when answers came sooner: `handoff::Waiting`) before sleeping. Returns its result (or
/// its panic), what the service thread measured, and how long the caller spun.
pub(crate) fn run_there<R: Send, F: FnOnce() -> R + Send>(
    lane: &Lane,
    hint: usize,
    spin_ns: u64,
    f: F,
) -> (Caught<R>, Completion, u64) {
    let waiting = Waiting { spin_ns, stall_timeout_ns: u64::MAX };
    if Bytes::<ENV_BYTES>::fits::<F>() && Bytes::<RESULT_BYTES>::fits::<Caught<R>>() {
        let mut env = Bytes::<ENV_BYTES>::uninit();
        // SAFETY: `env` has room for an `F` (checked above). From here the closure lives in
        // the request's bytes; the service thread moves it out once (`run_inline`).
        unsafe { std::ptr::write(env.as_mut_ptr().cast::<F>(), f) };
        let request = Request { run: run_inline::<F, R>, env, job_addr: 0, sent_ns: 0 };
        let (mut completion, spun) = submit(lane, hint, waiting, request);
        // SAFETY: the service thread wrote a `Caught<R>` there (`run_inline`), read once here.
        let result = unsafe { std::ptr::read(completion.result.as_mut_ptr().cast::<Caught<R>>()) };
        return (result, completion, spun);
    }
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
    let mut env = Bytes::<ENV_BYTES>::uninit();
    // SAFETY: a fat pointer (two words) fits the bytes.
    unsafe { std::ptr::write(env.as_mut_ptr().cast::<*mut (dyn FnMut() + Send + 'static)>(), job) };
    let request = Request { run: run_indirect, env, job_addr: job as *mut u8 as usize, sent_ns: 0 };
    let (completion, spun) = submit(lane, hint, waiting, request);
    (out.expect("the service thread ran the closure"), completion, spun)
}

/// Submits `request` until a slot takes it and waits for its completion; returns it and how
/// long the caller spun.
fn submit(lane: &Lane, hint: usize, waiting: Waiting, request: Request) -> (Completion, u64) {
    loop {
        let sent_ns = sys::now_ns();
        match lane.call_spun(Request { sent_ns, ..request }, hint, waiting) {
            (Outcome::Done(completion), slept_after) => {
                let spun = slept_after.unwrap_or(completion.wait_ns + completion.run_ns);
                return (completion, spun);
            }
            // Every slot taken: as many callers as slots wait for this core already. The
            // request was not submitted, so the closure in it is still unread.
            (Outcome::Full, _) => std::thread::yield_now(),
            (Outcome::Withdrawn, _) => unreachable!("a request without a stall timeout is never withdrawn"),
        }
    }
}

/// Runs a claimed request on the service thread.
pub(crate) fn execute(request: &Request) -> Completion {
    let mut env = request.env;
    let mut result = Bytes::<RESULT_BYTES>::uninit();
    let start = sys::now_ns();
    // SAFETY: the request is claimed: its caller waits in `run_there`, keeping the closure
    // (moved into `env`, or on its stack) and its borrows alive, and this is the request's
    // only run. `result` has room for an inline result (`run_there` checked). It catches
    // its own panics.
    unsafe { (request.run)(env.as_mut_ptr(), result.as_mut_ptr()) };
    let end = sys::now_ns();
    Completion { wait_ns: start.saturating_sub(request.sent_ns), run_ns: end.saturating_sub(start), result }
}
