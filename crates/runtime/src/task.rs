//! What a running task can do: hop, delegate, ask where it is.
//!
//! # Hazards of a hop, and what corehop decided
//! A `Handoff` hop continues the task on another OS thread (`Affinity` keeps the thread and
//! moves it). Code that assumes "same thread as a moment ago" needs care:
//!
//! - **Thread-locals.** A `thread_local!` read before a hop is the old thread's. The runtime's
//!   own per-thread state is reached only through `#[inline(never)]` accessors, so
//!   [`current_cpu`] is right after any hop even in release builds (tested with 100 000 hops).
//! - **`!Send` values on the task's stack** (`Rc`, `RefCell` borrows) move with the whole stack
//!   and stay consistent: only one thread runs a stack at a time. Closures that *start* tasks
//!   or run elsewhere ([`on`], [`spawn_on`], `Objects::run`) must be `Send`, because they run
//!   on another thread, and so must what they return.
//! - **Locks held across a hop.** Unlocking a pthread mutex (or a `std::sync::MutexGuard`) on
//!   another thread than locked it is undefined behaviour.
//! - **errno and thread identity.** Nothing here reads `errno`; `sys::syscall` returns it.
//!   `gettid`, signal masks and per-thread settings answer for the *current* thread, which a
//!   hop changes: call them where that is what you mean.
//!
//! # What is safe and what is not
//! Rust cannot say "this value must not live across that call", so the one call that leaves
//! the caller's frames on another OS thread, [`hop`] (and [`hop_any`], which calls it), is an
//! `unsafe fn` whose contract is the list above. Everything else is safe by construction:
//! - [`on`] runs its `Send` closure elsewhere and always brings the task back to the worker
//!   (the OS thread) it came from before the caller's code runs again, even during shutdown
//!   and even when the closure panics (the panic resumes after the way back). The caller's
//!   frames, with whatever guards or thread-local references they hold, never run or unwind
//!   on another thread.
//! - [`yield_now`] requeues the task on its *own* worker: the same OS thread resumes it.
//!   Other tasks may run on that thread meanwhile, as in any cooperative scheduler; that is
//!   what `RefCell` and `Mutex` already guard against.
//!
//! ```compile_fail,E0133
//! // A bare hop is unsafe: the caller promises it holds nothing tied to this thread.
//! # let cpu = corehop_runtime::CpuId(0);
//! corehop_runtime::hop(cpu).unwrap();
//! ```
//!
//! ```compile_fail,E0277
//! // `on` runs its closure on another thread: an `Rc` may not go along.
//! # let cpu = corehop_runtime::CpuId(0);
//! let shared = std::rc::Rc::new(1);
//! let _ = corehop_runtime::on(cpu, move || *shared + 1);
//! ```
//!
//! ```compile_fail,E0277
//! // Nor may a result that is not `Send` come back.
//! # let cpu = corehop_runtime::CpuId(0);
//! let _ = corehop_runtime::on(cpu, || std::rc::Rc::new(1));
//! ```
// `hop` is declared `unsafe` (its contract is the caller's); nothing here *does* anything
// unsafe, and `unsafe` blocks stay forbidden.
#![deny(unsafe_code)]

use std::marker::PhantomData;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;

use corehop_policy::pick::{Pick, PickState};
use corehop_topology::CpuId;

use crate::context::{self, OnWorker, TaskCtx};
use crate::error::Error;
use crate::runtime::{JoinHandle, Mechanism};
use crate::sys;

/// Whether the caller runs inside a corehop task.
pub fn in_task() -> bool {
    context::task().is_some()
}

/// The CPU the calling task (or worker thread) runs on now; never cached across a hop.
///
/// # Panics
/// Outside the runtime's worker threads (use [`try_current_cpu`] there).
pub fn current_cpu() -> CpuId {
    match context::here() {
        Some(cpu) => cpu,
        None => panic!("corehop_runtime::current_cpu called outside a corehop worker thread"),
    }
}

/// The CPU the calling task or worker thread runs on, or `None` on any other thread.
pub fn try_current_cpu() -> Option<CpuId> {
    context::here()
}

/// Whether other work waits to run on the calling task's CPU: a task or a delegated request
/// queued for its worker. A task that moves a call to another CPU can weigh the move by it:
/// while others wait, its CPU keeps working while it is away, and the move costs that CPU the
/// hop, not the wait. False outside a task.
pub fn others_waiting() -> bool {
    let (Some(ctx), Some(cpu)) = (context::task(), context::here()) else { return false };
    ctx.shared.worker_index(cpu).is_some_and(|w| {
        let slot = &ctx.shared.workers[w];
        slot.mailbox.has_mail() || slot.inbox.has_requests()
    })
}

/// Whether a task from another worker waits to run on the calling task's worker: one that
/// hopped here, or one of this worker's coming back (not this worker's own tasks that yielded).
/// False outside a task.
pub(crate) fn visitors_waiting() -> bool {
    let Some((ctx, on)) = context::task_at() else { return false };
    let worker = on.at();
    ctx.shared.workers[worker].mailbox.has_mail_from_others(worker)
}

/// Moves the calling task to `cpu` and returns there, with its stack intact.
///
/// Errors: [`Error::NotInTask`] outside a task, [`Error::UnknownCpu`] for a CPU without a
/// worker, [`Error::HopForbidden`] inside a [`no_hop_zone`], [`Error::ShutDown`] once the
/// runtime is shutting down (the task stays where it is), [`Error::Pin`] if an `Affinity` hop
/// cannot re-pin the thread. A hop to the current CPU does nothing.
///
/// Prefer [`on`], which is safe: it runs a closure on `cpu` and comes back.
///
/// # Safety
/// After an `Ok` the caller's code runs on another OS thread. Until the task is back on the
/// CPU it hopped from (or for good, if it never goes back), nothing live in the calling task
/// may depend on the OS thread it left:
/// - no reference into, or value cloned out of, a `thread_local!` (an `Rc` whose other clone
///   sits in a thread-local, a `&` into a `LocalKey::with` closure's value);
/// - no lock that must be released by the thread that took it (`std::sync::MutexGuard`,
///   `RwLock` guards, pthread mutexes, `flock`-style per-thread state), and no other
///   `!Send` value whose `Drop` or methods touch per-thread state;
/// - no per-thread OS state the code goes on to rely on (signal mask, `prctl` settings,
///   credentials changed with raw per-thread syscalls, `errno` read after the hop).
///
/// Values that live wholly on the task's own stack (an `Rc` all of whose clones are on it, a
/// `RefCell` borrow of a local) are fine: the stack moves as a whole. A [`no_hop_zone`] turns
/// a hop into [`Error::HopForbidden`] where the caller wants a check rather than a promise.
///
/// # Performance
/// Always inlined, down to the stack switch: each frame between the switch and the caller
/// costs a mispredicted return on the CPU the task arrives on, and the registers its
/// epilogue restores from the stack come from the CPU the task left (see `fiber`).
#[inline(always)]
#[allow(unsafe_code)]
pub unsafe fn hop(cpu: CpuId) -> Result<(), Error> {
    go(cpu).map(|_| ())
}

/// Moves the calling task to `cpu`; returns the worker it left, for the way back. The body of
/// [`hop`], for the callers in this crate that always come back before their caller runs.
#[inline(always)]
pub(crate) fn go(cpu: CpuId) -> Result<usize, Error> {
    let Some((ctx, on)) = context::task_at() else {
        return Err(Error::NotInTask);
    };
    match ctx.shared.worker_index(cpu) {
        Some(worker) if ctx.no_hop.get() == 0 && !ctx.shared.shutdown.load(Ordering::Relaxed) => {
            let back = on.at();
            move_to(ctx, on, worker)?;
            Ok(back)
        }
        _ => Err(refusal(ctx, cpu)),
    }
}

/// Brings the calling task back to worker `back` (as [`go`] returned it), whatever the
/// runtime's state: the caller's frames must not run on another thread.
#[inline(always)]
pub(crate) fn come_back(back: usize) -> Result<(), Error> {
    let (ctx, on) = task_at()?;
    move_to(ctx, on, back)
}

/// Why [`hop`] refuses to move the task to `cpu` (kept off the hop's fast path).
#[cold]
#[inline(never)]
fn refusal(ctx: &TaskCtx, cpu: CpuId) -> Error {
    if let Err(unknown) = ctx.shared.worker_of(cpu) {
        unknown
    } else if ctx.no_hop.get() > 0 {
        Error::HopForbidden { cpu }
    } else {
        Error::ShutDown
    }
}

/// Lets the other tasks waiting for this CPU run first, then continues here, on the same OS
/// thread (the task goes to the back of its own worker's queue, never to another worker).
///
/// Tasks switch only when one hops or ends; a task that never hops keeps its CPU, and tasks
/// that hopped in wait behind it. Call this at natural boundaries (the object registry does
/// after each operation). Under `Handoff` the task goes to the back of its own worker's
/// mailbox; under `Affinity` (one OS thread per task) the OS thread yields. Errors as for
/// [`hop`] (not in a task, inside a [`no_hop_zone`]).
///
/// # Why this is safe when [`hop`] is not
///
/// A worker is one OS thread for its whole life, and the task is queued on the worker it
/// runs on, so the caller's frames continue on the thread they started on: thread-locals,
/// `!Send` values and lock guards stay with their thread. Other tasks run on that thread in
/// between, as other futures do at an `.await`: what they share with the caller is shared
/// through `Sync` or thread-local types, which already allow it.
#[inline(always)]
pub fn yield_now() -> Result<(), Error> {
    let (ctx, on) = task_at()?;
    if ctx.no_hop.get() > 0 {
        return Err(Error::HopForbidden { cpu: ctx.shared.cpu_of(on.at()) });
    }
    match ctx.shared.mechanism {
        Mechanism::Handoff => {
            ctx.hop_to(on, on.at());
            // The argument above, checked in every build: a caller's frames that went on on
            // another thread could touch its `!Send` state, and unwinding them there would too,
            // so the only sound answer to a broken invariant is to stop the process.
            if !task_at().is_ok_and(|(_, now)| now.same_thread(on)) {
                eprintln!("corehop: yield_now resumed a task on another OS thread; aborting");
                std::process::abort();
            }
        }
        Mechanism::Affinity => std::thread::yield_now(),
    }
    Ok(())
}

/// The running task's context, or [`Error::NotInTask`]. A `match`, not `ok_or(Error::..)`:
/// an eagerly built error must be dropped again, which costs every hop a few instructions.
fn task_ctx<'a>() -> Result<&'a TaskCtx, Error> {
    match context::task() {
        Some(ctx) => Ok(ctx),
        None => Err(Error::NotInTask),
    }
}

/// The running task's context and the worker it runs on, or [`Error::NotInTask`]. Inlined
/// into `on`: a `Result` this size comes back through memory.
#[inline(always)]
fn task_at<'a>() -> Result<(&'a TaskCtx, OnWorker), Error> {
    match context::task_at() {
        Some(found) => Ok(found),
        None => Err(Error::NotInTask),
    }
}

/// Moves the task from the worker it runs `on` to worker `worker` without the policy checks
/// of [`hop`].
///
/// Inlined, with `TaskCtx::hop_to`, into [`hop`], and `hop` into its caller: the task
/// resumes on a CPU whose return predictor holds that worker's return addresses, not the
/// task's, so every `ret` between the switch and the caller's code mispredicts
/// (docs/performance.md, "inlining the hop").
#[inline(always)]
fn move_to(ctx: &TaskCtx, on: OnWorker, worker: usize) -> Result<(), Error> {
    if on.at() == worker {
        return Ok(());
    }
    match ctx.shared.mechanism {
        Mechanism::Handoff => {
            ctx.hop_to(on, worker);
        }
        Mechanism::Affinity => repin(ctx, worker)?,
    }
    Ok(())
}

/// An `Affinity` hop: the thread re-pins itself.
#[inline(never)]
fn repin(ctx: &TaskCtx, worker: usize) -> Result<(), Error> {
    let (cpu, os_id) = (ctx.shared.cpu_of(worker), ctx.shared.workers[worker].os_id);
    sys::pin_current_thread(os_id).map_err(|source| Error::Pin { cpu, os_id, source })?;
    context::set_here(cpu, worker);
    Ok(())
}

/// Runs `f` on `cpu` and returns its value, with the caller back where it was (delegation).
///
/// The task hops to `cpu`, runs `f` and hops back. A panic in `f` resumes in the caller after
/// the way back. Errors as for [`hop`], for the way there; the way back is always taken, even
/// once shutdown has begun, so `Ok` means `f` ran and `Err` means it did not (or, under
/// `Affinity`, that re-pinning for the way back failed).
///
/// Safe, unlike [`hop`]: `f` and its result are `Send`, and the caller's own frames never run
/// on `cpu`'s thread (see the module docs).
///
/// Inlined, like [`hop`]: a `ret` after the way back would be mispredicted, and the
/// registers restored with it would come from lines the other CPU wrote.
///
/// # Examples
/// ```
/// use corehop_runtime::{current_cpu, on, Error, Runtime, Wake};
/// let rt = Runtime::builder().wake(Wake::Park).build().unwrap();
/// let (home, other) = (rt.cpus()[0], *rt.cpus().last().unwrap());
/// let (ran_on, back_on) = rt
///     .block_on(home, move || {
///         let ran_on = on(other, current_cpu).unwrap();
///         (ran_on, current_cpu())
///     })
///     .unwrap();
/// assert_eq!((ran_on, back_on), (other, home));
/// // Outside a task there is nothing to move.
/// assert!(matches!(on(other, || ()), Err(Error::NotInTask)));
/// ```
#[inline(always)]
pub fn on<F, R>(cpu: CpuId, f: F) -> Result<R, Error>
where
    F: FnOnce() -> R + Send,
    R: Send,
{
    let back = go(cpu)?;
    let result = catch_unwind(AssertUnwindSafe(f));
    come_back(back)?;
    match result {
        Ok(value) => Ok(value),
        Err(payload) => resume_unwind(payload),
    }
}

/// Chooses one of `cpus` with `pick` (the §9.2 settings: work-conserving, affinity,
/// prefer-affinity) from their current load, and hops there; returns the CPU chosen.
///
/// # Safety
/// As for [`hop`]: the caller's code continues on another OS thread.
#[allow(unsafe_code)]
pub unsafe fn hop_any(cpus: &[CpuId], pick: &Pick, state: &mut PickState) -> Result<CpuId, Error> {
    let ctx = task_ctx()?;
    let candidates = ctx.shared.candidates(cpus)?;
    let cpu = pick.pick(&candidates, state).ok_or(Error::NoCpus)?;
    go(cpu)?;
    Ok(cpu)
}

/// Starts `f` as a new task on `cpu`, from inside a task of the same runtime.
///
/// # Examples
/// ```
/// use corehop_runtime::{current_cpu, spawn_on, Runtime, Wake};
/// let rt = Runtime::builder().wake(Wake::Park).build().unwrap();
/// let (first, last) = (rt.cpus()[0], *rt.cpus().last().unwrap());
/// // Spawned from a task on `first`, joined from this (non-worker) thread.
/// let handle = rt.block_on(first, move || spawn_on(last, current_cpu)).unwrap().unwrap();
/// assert_eq!(handle.cpu(), last);
/// assert_eq!(handle.join().unwrap(), last);
/// ```
pub fn spawn_on<F, T>(cpu: CpuId, f: F) -> Result<JoinHandle<T>, Error>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let ctx = task_ctx()?;
    ctx.shared.spawn_on(cpu, f)
}

/// A region of a task in which hops fail with [`Error::HopForbidden`]: hold thread-bound
/// things (a pthread or `std` mutex guard, a reference into a thread-local) inside one.
/// Zones nest; outside a task the guard does nothing.
///
/// # Examples
/// ```
/// use corehop_runtime::{hop, no_hop_zone, Error, Runtime, Wake};
/// let rt = Runtime::builder().wake(Wake::Park).build().unwrap();
/// let cpu = rt.cpus()[0];
/// let refused = rt
///     .block_on(cpu, move || {
///         let lock = std::sync::Mutex::new(0);
///         let _zone = no_hop_zone();
///         let _guard = lock.lock().unwrap();
///         // SAFETY: inside the zone the hop is refused, so the guard never leaves this thread.
///         matches!(unsafe { hop(cpu) }, Err(Error::HopForbidden { .. }))
///     })
///     .unwrap();
/// assert!(refused);
/// ```
pub fn no_hop_zone() -> NoHopZone {
    let active = context::task().map(|ctx| ctx.no_hop.set(ctx.no_hop.get() + 1)).is_some();
    NoHopZone { active, _not_send: PhantomData }
}

/// The guard of a [`no_hop_zone`]; hops are allowed again when the last one is dropped.
#[must_use = "the zone ends when this guard is dropped"]
pub struct NoHopZone {
    active: bool,
    _not_send: PhantomData<*const ()>,
}

impl Drop for NoHopZone {
    fn drop(&mut self) {
        if self.active {
            if let Some(ctx) = context::task() {
                ctx.no_hop.set(ctx.no_hop.get().saturating_sub(1));
            }
        }
    }
}
