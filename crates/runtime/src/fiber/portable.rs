//! Fibers as [`corosensei`] coroutines: any architecture corosensei supports.

use corosensei::stack::{DefaultStack, Stack};
use corosensei::{Coroutine, CoroutineResult, Yielder};

use super::{Context, Resume, Step, Suspend};

/// A corosensei fiber cannot publish itself after leaving its stack: its worker sends it.
pub(crate) const SENDS_ITSELF: bool = false;

/// Where our own switch keeps a worker's stack pointer; corosensei needs none.
pub(crate) fn parent_cell() -> *mut usize {
    std::ptr::null_mut()
}

/// A suspended or not yet started task stack.
pub(crate) struct Fiber {
    coroutine: Coroutine<Resume, Suspend, (), DefaultStack>,
    /// The highest address of the stack, where corosensei links each resume to its worker.
    base: usize,
}

// SAFETY: see the module documentation of `fiber`.
unsafe impl Send for Fiber {}

impl Fiber {
    /// A fiber that will run `body` on `stack` when first resumed.
    pub(crate) fn new<F>(stack: DefaultStack, body: F) -> Fiber
    where
        F: FnOnce(&Suspender, Resume) + Send + 'static,
    {
        let base = stack.base().get();
        let coroutine = Coroutine::with_stack(stack, move |yielder: &Yielder<Resume, Suspend>, input| {
            body(&Suspender { yielder }, input)
        });
        Fiber { coroutine, base }
    }

    /// Runs the fiber on the calling thread until it suspends or finishes. These fibers never
    /// send themselves, so `from` is always `None`.
    ///
    /// # Safety
    /// The caller owns the fiber (no other thread touches it) until this returns.
    #[inline(always)]
    pub(crate) unsafe fn resume(
        this: *mut Fiber,
        input: Resume,
        from: Option<&Context>,
        parent: *mut usize,
    ) -> Step {
        debug_assert!(from.is_none(), "a corosensei fiber never sends itself");
        // corosensei keeps its own link to the resuming thread.
        let _ = parent;
        // SAFETY: the caller owns the fiber until this returns.
        let fiber = unsafe { &mut *this };
        match fiber.coroutine.resume(input) {
            CoroutineResult::Yield(request) => Step::Suspended(request),
            CoroutineResult::Return(()) => Step::Finished,
        }
    }

    /// Whether the fiber has been resumed at least once.
    pub(crate) fn started(&self) -> bool {
        self.coroutine.started()
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

/// The running fiber's way back to its worker.
#[derive(Clone, Copy)]
pub(crate) struct Suspender {
    yielder: *const Yielder<Resume, Suspend>,
}

impl Suspender {
    /// Suspends the running fiber and asks its worker to hand it to worker `worker`; returns
    /// what the next resume passes in.
    ///
    /// # Safety
    /// Only on the stack of the fiber this suspender was given to, while that fiber runs.
    #[inline(always)]
    pub(crate) unsafe fn suspend(&self, worker: usize) -> Resume {
        let marker = 0u8;
        // The address of a local of this frame: corosensei saves the registers just below.
        let stack = std::hint::black_box(&raw const marker) as usize;
        // SAFETY: the caller runs on this fiber, inside its body, which is where the yielder
        // corosensei passed lives.
        unsafe { &*self.yielder }.suspend(Suspend::Hop { worker, stack })
    }
}
