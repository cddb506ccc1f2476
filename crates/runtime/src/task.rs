//! What a running task can do: hop, delegate, ask where it is.
//!
//! # Hazards of a hop, and what corehop decided
//! A `Handoff` hop continues the task on another OS thread (`Affinity` keeps the thread and
//! moves it). Code that assumes "same thread as a moment ago" needs care:
//!
//! - **Thread-locals.** A `thread_local!` read before a hop is the old thread's. The runtime's
//!   own per-thread state is reached only through `#[inline(never)]` accessors, so
//!   [`current_cpu`] is right after any hop even in release builds (tested with 100 000 hops).
//!   User code should not hold references into thread-locals across a hop.
//! - **`!Send` values on the task's stack** (`Rc`, `RefCell` borrows) move with the whole stack
//!   and stay consistent: only one thread runs a stack at a time. Closures that *start* tasks
//!   must be `Send + 'static`, because they come from another thread. `on`'s closure need not
//!   be `Send`: it runs on the same (moving) stack.
//! - **Locks held across a hop.** Unlocking a pthread mutex (or a `std::sync::MutexGuard`) on
//!   another thread than locked it is undefined behaviour. Rust cannot forbid "holding across
//!   this call", so corehop makes it detectable: hold such guards inside a [`no_hop_zone`], and
//!   any hop there returns [`Error::HopForbidden`] instead of moving the task.
//! - **errno and thread identity.** Nothing here reads `errno`; `sys::syscall` returns it.
//!   `gettid`, signal masks and per-thread settings answer for the *current* thread, which a
//!   hop changes: call them where that is what you mean.
#![forbid(unsafe_code)]

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

/// Moves the calling task to `cpu` and returns there, with its stack intact.
///
/// Errors: [`Error::NotInTask`] outside a task, [`Error::UnknownCpu`] for a CPU without a
/// worker, [`Error::HopForbidden`] inside a [`no_hop_zone`], [`Error::ShutDown`] once the
/// runtime is shutting down (the task stays where it is), [`Error::Pin`] if an `Affinity` hop
/// cannot re-pin the thread. A hop to the current CPU does nothing.
///
/// Always inlined, down to the stack switch: each frame between the switch and the caller
/// costs a mispredicted return on the CPU the task arrives on, and the registers its
/// epilogue restores from the stack come from the CPU the task left (a line transfer the
/// hop is built to avoid: see `fiber`).
#[inline(always)]
pub fn hop(cpu: CpuId) -> Result<(), Error> {
    let Some((ctx, on)) = context::task_at() else {
        return Err(Error::NotInTask);
    };
    match ctx.shared.worker_index(cpu) {
        Some(worker) if ctx.no_hop.get() == 0 && !ctx.shared.shutdown.load(Ordering::Relaxed) => {
            move_to(ctx, on, worker)
        }
        _ => Err(refusal(ctx, cpu)),
    }
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

/// Lets the other tasks waiting for this CPU run first, then continues here.
///
/// Tasks switch only when one hops or ends; a task that never hops keeps its CPU, and tasks
/// that hopped in wait behind it. Call this at natural boundaries (the object registry does
/// after each operation). Under `Handoff` the task goes to the back of its own worker's
/// mailbox; under `Affinity` (one OS thread per task) the OS thread yields. Errors as for
/// [`hop`] (not in a task, inside a [`no_hop_zone`]).
#[inline(always)]
pub fn yield_now() -> Result<(), Error> {
    let (ctx, on) = task_at()?;
    if ctx.no_hop.get() > 0 {
        return Err(Error::HopForbidden { cpu: ctx.shared.cpu_of(on.at()) });
    }
    match ctx.shared.mechanism {
        Mechanism::Handoff => {
            ctx.hop_to(on, on.at());
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
/// task's, so every `ret` between the switch and the caller's code mispredicts. With three
/// frames in between, Handoff+Spin round trips cost 4.0-4.5x the cache-line floor on the
/// development VM; inlined, 3.5-3.7x.
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
/// Inlined, like [`hop`]: a `ret` after the way back would be mispredicted, and the
/// registers restored with it would come from lines the other CPU wrote.
#[inline(always)]
pub fn on<F, R>(cpu: CpuId, f: F) -> Result<R, Error>
where
    F: FnOnce() -> R,
{
    let (ctx, on) = task_at()?;
    let back = on.at();
    hop(cpu)?;
    let result = catch_unwind(AssertUnwindSafe(f));
    let (_, on) = task_at()?;
    move_to(ctx, on, back)?;
    match result {
        Ok(value) => Ok(value),
        Err(payload) => resume_unwind(payload),
    }
}

/// Chooses one of `cpus` with `pick` (the §9.2 settings: work-conserving, affinity,
/// prefer-affinity) from their current load, and hops there; returns the CPU chosen.
pub fn hop_any(cpus: &[CpuId], pick: &Pick, state: &mut PickState) -> Result<CpuId, Error> {
    let ctx = task_ctx()?;
    let candidates = ctx.shared.candidates(cpus)?;
    let cpu = pick.pick(&candidates, state).ok_or(Error::NoCpus)?;
    hop(cpu)?;
    Ok(cpu)
}

/// Starts `f` as a new task on `cpu`, from inside a task of the same runtime.
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
///         matches!(hop(cpu), Err(Error::HopForbidden { .. }))
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
