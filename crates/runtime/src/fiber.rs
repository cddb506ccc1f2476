//! A task's fiber and the one step that makes hops possible: sending a suspended fiber to
//! another worker thread.
//!
//! A fiber is a [`corosensei`] coroutine: its own stack (from the runtime's stack pool) with
//! the task's closure at the bottom. corosensei makes `Coroutine` `!Send` because in general a
//! suspended stack may hold anything. [`Fiber`] implements `Send` anyway; this is the argument
//! for why that is sound under the rules the rest of the runtime enforces.
//!
//! # What a hop moves
//! A `Handoff` hop suspends the fiber inside [`crate::hop`]: corosensei saves the callee-saved
//! registers on the fiber's own stack and switches back to the worker's stack. The worker then
//! pushes the task (this fiber, inside its `Box<Task>`) into the target worker's mailbox; the
//! target pops it and resumes it. What moves is therefore the whole stack, with every local of
//! every frame of the task, and nothing else: the worker threads' own stacks and thread-locals
//! stay where they are.
//!
//! # Soundness
//! 1. **One thread at a time.** A fiber is touched only by the worker that owns its `Box<Task>`:
//!    the worker that popped it runs it; when `resume` returns, the fiber is fully switched out
//!    (its registers are saved, no frame of it is on any CPU) *before* the worker gives up the
//!    box by pushing it into another mailbox. Ownership of the box is the permission to touch
//!    the stack; `Box` makes it unique.
//! 2. **Publication.** Sending is a Release store (lane) or CAS (list) and taking an Acquire
//!    load or swap (see `mailbox`),
//!    so every write the old worker made to the stack happens-before the new worker resumes it.
//! 3. **What the stack may hold.** The closure that starts a task is `Send + 'static` and its
//!    result is `Send` (enforced by `Runtime::spawn_on`), so everything the task *starts* with
//!    may cross threads. Values created inside the task live on its stack and move with it as
//!    a whole: an `Rc` whose every clone is on the same stack, or a `RefCell` borrow of a
//!    `RefCell` on that stack, stays consistent, because only one thread runs the stack at a
//!    time (point 1) with Acquire/Release between them (point 2). Nothing on the stack can be
//!    shared with another thread except through `Send`/`Sync` types, because the task's
//!    code is ordinary safe Rust.
//! 4. **The hazards this does not cover** (documented on [`crate::hop`], the caller's duty):
//!    a `!Send` value that is tied to the *OS thread* rather than to the stack, held across a
//!    hop: a reference into a `thread_local!`, an `Rc` cloned out of a thread-local, a
//!    `std::sync::MutexGuard` or a pthread mutex locked before the hop and unlocked after it.
//!    Rust cannot express "not across this call", so the runtime offers
//!    [`crate::no_hop_zone`] to turn such a hop into an error, reaches its own per-thread
//!    state only through non-inlined accessors (`context`), and never reads `errno` across a
//!    hop (`sys::syscall` returns it).
//! 5. **Unwinding never crosses the fiber boundary.** The task body catches every panic of the
//!    user's closure and returns normally; a fiber is always run to completion (the runtime
//!    never drops a suspended one: shutdown resumes every started task until it returns), so
//!    corosensei never has to force-unwind a stack on a thread other than its last one.

use corosensei::stack::{DefaultStack, Stack};
use corosensei::{Coroutine, CoroutineResult, Yielder};

/// What a worker passes to a fiber when it resumes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resume {
    /// Run (or keep running).
    Run,
    /// The task never started and the runtime is shutting down: do not run the closure.
    Cancel,
}

/// Why a fiber gave its worker control back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Suspend {
    /// Hand me to this worker (an index into the runtime's workers). `stack` is an address
    /// near the top of the suspended stack, where the target will resume it (a prefetch hint).
    Hop { worker: usize, stack: usize },
}

/// How a resume ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    Suspended(Suspend),
    Finished,
}

pub(crate) type FiberYielder = Yielder<Resume, Suspend>;

/// A suspended or not yet started task stack.
pub(crate) struct Fiber {
    coroutine: Coroutine<Resume, Suspend, (), DefaultStack>,
    /// The highest address of the stack, where corosensei links each resume to its worker.
    base: usize,
}

// SAFETY: see the module documentation: the body is `Send + 'static`, a fiber is only ever
// resumed by the thread that owns it, it is fully switched out before its owner gives it away,
// and the hand-off is a Release/Acquire pair. Thread-bound values held across a hop are the
// documented hazard of `hop`, not of sending a suspended fiber.
unsafe impl Send for Fiber {}

impl Fiber {
    /// A fiber that will run `body` on `stack` when first resumed.
    pub(crate) fn new<F>(stack: DefaultStack, body: F) -> Fiber
    where
        F: FnOnce(&FiberYielder, Resume) + Send + 'static,
    {
        let base = stack.base().get();
        Fiber { coroutine: Coroutine::with_stack(stack, body), base }
    }

    /// Runs the fiber on the calling thread until it suspends or finishes.
    pub(crate) fn resume(&mut self, input: Resume) -> Step {
        match self.coroutine.resume(input) {
            CoroutineResult::Yield(request) => Step::Suspended(request),
            CoroutineResult::Return(()) => Step::Finished,
        }
    }

    /// The highest address of the fiber's stack.
    pub(crate) fn base(&self) -> usize {
        self.base
    }

    /// The stack of a finished fiber, for reuse; `None` if it has not finished.
    pub(crate) fn into_stack(self) -> Option<DefaultStack> {
        self.coroutine.done().then(|| self.coroutine.into_stack())
    }
}
