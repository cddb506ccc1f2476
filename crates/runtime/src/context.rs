//! Per-thread runtime state, reached only through accessors that cannot be cached across a hop.
//!
//! A task that hops continues on another OS thread, inside the same Rust function. LLVM treats
//! the address of a thread-local as constant within a function, so a `thread_local!` read,
//! inlined into a function that hops, could be served from the *old* thread's copy after the
//! hop. Every accessor here is `#[inline(never)]`: each call computes the thread-local's
//! address afresh on the thread that makes the call.
//!
//! Two pieces of state:
//! - the **worker** state of a runtime worker thread: which runtime it belongs to and the CPU
//!   it is on now, with that CPU's worker index (its home CPU, or under `Mechanism::Affinity`
//!   the CPU the task moved it to). A running task learns where it is from here rather than
//!   from its own `TaskCtx`: a field there rewritten on every hop would move the context's line
//!   between CPUs with every hop. It also holds what a hop from this worker needs: the
//!   worker's lanes into every mailbox and its parent cell ([`OnWorker`]);
//! - the **current task**: a pointer to the [`TaskCtx`] at the bottom of the running task's
//!   stack, installed by the task itself when it starts and by the worker whenever it resumes
//!   it, and cleared by the worker whenever the task gives the thread back.

use std::cell::Cell;
use std::ptr;
use std::sync::Arc;

use corehop_topology::CpuId;

use crate::fiber::{Resume, Suspender};
use crate::mailbox::LaneSender;
use crate::overflow::Guard;
use crate::runtime::{Shared, Task};

/// The context of one task, living at the bottom of its own stack for its whole life.
pub(crate) struct TaskCtx {
    pub(crate) suspender: Suspender,
    pub(crate) shared: Arc<Shared>,
    /// Depth of nested `no_hop_zone`s: hops are refused while it is not zero.
    pub(crate) no_hop: Cell<u32>,
    /// Object operations until the task's next sampled one (see `objects::sample_now`).
    pub(crate) until_sample: Cell<u32>,
    /// The guard page below the task's stack, to report an overflow as one.
    pub(crate) guard: Guard,
    /// The task's own address (its `Box<Task>`), which a hop hands to the target's mailbox.
    #[cfg_attr(not(corehop_own_switch), allow(dead_code))]
    pub(crate) node: usize,
}

impl TaskCtx {
    /// Suspends the task (it must be the one running on the calling thread, the thread of
    /// worker `at`) and hands it to worker `worker`; returns when that worker resumes it.
    ///
    /// With our own switch the task sends itself through lane `at` of the target's mailbox
    /// (`Suspender::suspend_into`); otherwise, or while that lane is full, its worker sends
    /// it on.
    #[inline(always)]
    pub(crate) fn hop_to(&self, on: OnWorker, worker: usize) -> Resume {
        #[cfg(corehop_own_switch)]
        if let Some(slot) = on.sender_to(worker).reserve() {
            let context = slot.payload().as_ptr().cast::<usize>().cast_mut();
            // SAFETY: the task's own node, sent nowhere else; `suspend_into` makes the store.
            let (word, value) = unsafe { slot.publication(self.node as *mut crate::runtime::Task) };
            // SAFETY: as below; the payload and the word belong to the reserved slot, which no
            // one else writes, of a mailbox that `self.shared` keeps alive; the store of
            // `value` publishes the task, which is in the slot's word; the parent cell is that
            // of the worker whose thread this is.
            return unsafe {
                self.suspender.suspend_into(context, word.as_ptr(), value, worker, on.parent())
            };
        }
        let _ = on;
        // SAFETY: the suspender is this task's, and `self` being reachable means the caller
        // runs on the task's stack (the `TaskCtx` sits at its bottom), i.e. the task runs.
        unsafe { self.suspender.suspend(worker) }
    }
}

/// The worker a task runs on, as [`task_at`] found it: read at once, before the task hops
/// (after a hop it names the worker the task left).
#[derive(Clone, Copy)]
pub(crate) struct OnWorker(*const WorkerState);

impl OnWorker {
    /// The worker's index.
    #[inline(always)]
    pub(crate) fn at(self) -> usize {
        self.state().at
    }

    /// The worker's parent cell (`fiber::parent_cell`), where it keeps its stack pointer while
    /// a task runs.
    #[cfg_attr(not(corehop_own_switch), allow(dead_code))]
    #[inline(always)]
    fn parent(self) -> *const usize {
        self.state().parent
    }

    /// The worker's lane into the mailbox of worker `worker`. A task that uses it runs on the
    /// worker's thread, with the worker switched out until the task has left: the lane's one
    /// producer at that time.
    #[cfg_attr(not(corehop_own_switch), allow(dead_code))]
    #[inline(always)]
    fn sender_to<'a>(self, worker: usize) -> &'a LaneSender<'a, Task> {
        // SAFETY: `enter_worker`'s caller keeps the senders alive while it is a worker, and a
        // task runs only while it is.
        unsafe { &(*self.state().senders)[worker] }
    }

    /// Whether `self` and `other` were found on the same OS thread: each is the address of
    /// that thread's own worker cell, unique among live threads.
    #[inline(always)]
    pub(crate) fn same_thread(self, other: OnWorker) -> bool {
        ptr::eq(self.0, other.0)
    }

    #[inline(always)]
    fn state(self) -> WorkerState {
        // SAFETY: the pointer is to the calling worker thread's own state (`task_at`), alive
        // as long as the thread; nothing holds a reference into it (it is only copied out).
        unsafe { self.0.read() }
    }
}

#[derive(Clone, Copy)]
struct WorkerState {
    /// Identifies the runtime (the address of its `Shared`).
    runtime: *const Shared,
    here: CpuId,
    /// The worker index of `here`.
    at: usize,
    /// The worker's parent cell (`fiber::parent_cell`).
    parent: *const usize,
    /// Per target worker index, the worker's lane into that worker's mailbox (lifetime erased:
    /// see `enter_worker`).
    senders: *const [LaneSender<'static, Task>],
}

impl WorkerState {
    /// The state of a thread that is no worker (a null runtime).
    const NONE: WorkerState = WorkerState {
        runtime: ptr::null(),
        here: CpuId(0),
        at: 0,
        parent: ptr::null(),
        senders: ptr::slice_from_raw_parts(ptr::null(), 0),
    };

    /// This state, if it is a worker's.
    fn of_worker(self) -> Option<WorkerState> {
        (!self.runtime.is_null()).then_some(self)
    }
}

thread_local! {
    static WORKER: Cell<WorkerState> = const { Cell::new(WorkerState::NONE) };
    static TASK: Cell<*const TaskCtx> = const { Cell::new(ptr::null()) };
}

/// Marks the calling thread as the worker of `shared` on `cpu`, worker index `worker`, with
/// its parent cell and its lanes into every worker's mailbox, by worker index.
///
/// # Safety
/// `senders` must stay alive, and the thread must use none of those lanes otherwise while a
/// task of this worker uses them, until [`leave_worker`].
#[inline(never)]
pub(crate) unsafe fn enter_worker(
    shared: &Shared,
    cpu: CpuId,
    worker: usize,
    parent: *const usize,
    senders: &[LaneSender<'_, Task>],
) {
    // Erases the lifetime (see the safety contract); clippy sees only the same type.
    #[allow(clippy::unnecessary_cast)]
    let senders = senders as *const [LaneSender<'_, Task>] as *const [LaneSender<'static, Task>];
    WORKER.with(|w| w.set(WorkerState { runtime: shared, here: cpu, at: worker, parent, senders }));
}

/// Marks the calling thread as no longer a worker.
#[inline(never)]
pub(crate) fn leave_worker() {
    WORKER.with(|w| w.set(WorkerState::NONE));
}

/// Records that the calling worker thread now runs on `cpu`, the CPU of worker `worker` (an
/// `Affinity` hop).
#[inline(never)]
pub(crate) fn set_here(cpu: CpuId, worker: usize) {
    WORKER.with(|w| {
        if let Some(s) = w.get().of_worker() {
            w.set(WorkerState { here: cpu, at: worker, ..s });
        }
    });
}

/// The CPU the calling worker thread is on, if it is a worker.
#[inline(never)]
pub(crate) fn here() -> Option<CpuId> {
    WORKER.with(|w| w.get().of_worker().map(|s| s.here))
}

/// Whether the calling thread is a worker of the runtime `shared`.
#[inline(never)]
pub(crate) fn is_worker_of(shared: &Shared) -> bool {
    WORKER.with(|w| ptr::eq(w.get().runtime, shared))
}

/// Installs `ctx` as the task running on the calling thread.
#[inline(never)]
pub(crate) fn set_task(ctx: &TaskCtx) {
    TASK.with(|t| t.set(ctx));
}

/// Installs `ctx` (or none, if null) as the task the calling worker thread is about to run
/// or has just stopped running. For the worker's own loop only, which never changes threads:
/// inlined there, unlike the accessors a task calls.
#[inline]
pub(crate) fn install_task(ctx: *const TaskCtx) {
    TASK.with(|t| t.set(ctx));
}

/// The task running on the calling thread and the worker it runs on, if a task runs there:
/// what a hop needs, in one call.
#[inline(never)]
pub(crate) fn task_at<'a>() -> Option<(&'a TaskCtx, OnWorker)> {
    // A pointer to this thread's cell, read through `OnWorker` (copied out each time).
    let on = WORKER.with(|w| w.get().of_worker().map(|_| OnWorker(w.as_ptr())))?;
    let ptr = TASK.with(|t| t.get());
    // SAFETY: as in `task` (read here, not called: one call per hop is enough).
    unsafe { ptr.as_ref() }.map(|ctx| (ctx, on))
}

/// The task running on the calling thread, if any.
///
/// The reference is valid for as long as the caller runs on that task's stack: the `TaskCtx`
/// sits at the bottom of the stack, below every frame that can call this, and the pointer is
/// cleared by the worker whenever the task stops running on this thread.
#[inline(never)]
pub(crate) fn task<'a>() -> Option<&'a TaskCtx> {
    let ptr = TASK.with(|t| t.get());
    // SAFETY: a non-null pointer was installed by the running task from a `TaskCtx` at the
    // bottom of its stack, which outlives every frame above it; code that is not running on
    // that stack finds the pointer cleared (the worker clears it when `resume` returns).
    unsafe { ptr.as_ref() }
}
