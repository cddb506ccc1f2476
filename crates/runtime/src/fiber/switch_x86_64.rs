//! Fibers with our own x86-64 stack switch: entered and left with `jmp`, never `call`/`ret`,
//! so the CPU's return-address predictor stays in step with each side's own calls (see the
//! parent module for why this is ours and not corosensei's).
//!
//! # The switch
//! Both directions run the same few instructions ([`switch`]): push the frame pointer, `rbx`
//! and the address to continue at; store the stack pointer where the other side will look
//! for it; load the other side's; pop its three words and jump to its continuation. The other
//! callee-saved registers (`r12`-`r15`) are declared clobbered, so the compiler saves them
//! in the surrounding frame when they are live; caller-saved registers are clobbered by the
//! ABI anyway. Two words travel in `rdi`/`rsi`, untouched by the switch.
//!
//! # A hop: the fiber sends itself
//! A hop could suspend like that and let the worker send the task on, but then the target
//! resumes it by loading from lines the source wrote just before (the stack pointer, then the
//! popped words): a second line transfer after the message, one after the other. Instead the
//! fiber writes its [`Context`] (stack pointer, continuation, `rbx`, `rbp`, `r12`-`r14`) into
//! the payload of the target's mailbox slot, switches to the worker's stack, and only then
//! publishes the slot with one store ([`Suspender::suspend_into`]). The target loads the
//! context from the slot's line, which it has just received, and jumps (`resume` with a
//! context): nothing on the way into the task waits for another line, and the source
//! publishes without first going back through the worker's code. `r15` is the one
//! callee-saved register left to the compiler (the slot is full).
//!
//! # The stack
//! ```text
//!  base ─┬──────────────────────────┐  (page aligned, highest address)
//!        │ Link: fiber_sp            │  64 bytes
//!        ├──────────────────────────┤  base - 64: 16-aligned, the start trampoline's rsp
//!        │ rbp = entry fn           │
//!        │ rbx = boxed body         │  the first resume pops these three
//!        │ continuation = trampoline│  base - 88: the initial fiber_sp
//!        └───── grows down ─────────┘
//! ```
//! The trampoline calls `entry::<F>(input, link, body)` with a 16-aligned stack and marks
//! itself as the outermost frame (`.cfi_undefined rip`), so unwinders and backtraces stop
//! there instead of walking into the worker's stack.

use std::arch::{asm, global_asm};
use std::cell::Cell;

use corosensei::stack::{DefaultStack, Stack};

use super::{Context, Resume, Step, Suspend};

/// Fibers send themselves on a hop ([`Suspender::suspend_into`]).
pub(crate) const SENDS_ITSELF: bool = true;

/// Where a fiber suspended on its own stack left its stack pointer; at the top of the stack.
#[repr(C)]
struct Link {
    /// The fiber's stack pointer while it is suspended (or not started).
    fiber_sp: usize,
}

thread_local! {
    /// The stack pointer of the worker running a fiber on this thread, while it does. A cell of
    /// the thread's, not of the fiber: a field of the fiber would move between CPUs with every
    /// hop. Fibers do not nest: nothing resumes a fiber from inside another.
    static PARENT_SP: Cell<usize> = const { Cell::new(0) };
}

/// This thread's parent cell, for [`Fiber::resume`] and [`Suspender::suspend_into`] (a worker
/// asks once; a hop finds it in the worker's slot). Never inlined: the address of a
/// thread-local must be computed on the thread that asks (see `context`).
#[inline(never)]
pub(crate) fn parent_cell() -> *mut usize {
    PARENT_SP.with(Cell::as_ptr)
}

/// Bytes reserved for the [`Link`] at the top of the stack: a whole line, and a multiple of
/// 16 so that the trampoline starts on a 16-aligned stack.
const LINK_BYTES: usize = 64;
/// The three words the first resume pops (continuation, rbx, rbp).
const START_FRAME: usize = 3 * 8;

// The codes that travel in `rdi`.
const RUN: usize = 0;
const CANCEL: usize = 1;
const HOP: usize = 0;
const FINISHED: usize = 1;
const SENT: usize = 2;

enum State {
    /// Not resumed yet: the boxed body, and how to drop it if it never is.
    New {
        body: *mut u8,
        drop_body: unsafe fn(*mut u8),
    },
    Suspended,
    Finished,
}

/// A suspended or not yet started task stack.
pub(crate) struct Fiber {
    /// Always `Some` until `into_stack` takes it.
    stack: Option<DefaultStack>,
    state: State,
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
        debug_assert!(base.is_multiple_of(16) && base - stack.limit().get() > LINK_BYTES + START_FRAME);
        let link = (base - LINK_BYTES) as *mut Link;
        let sp = base - LINK_BYTES - START_FRAME;
        let body = Box::into_raw(Box::new(body));
        let start =
            [corehop_fiber_start as *const () as usize, body as usize, entry::<F> as *const () as usize];
        // SAFETY: `link` and `sp..sp + START_FRAME` lie inside the stack's usable range (just
        // below its base), which nothing else uses before the first resume; both are aligned.
        unsafe {
            link.write(Link { fiber_sp: sp });
            (sp as *mut [usize; 3]).write(start);
        }
        unsafe fn drop_body<F>(body: *mut u8) {
            // SAFETY: `body` came from `Box::into_raw(Box<F>)` and was never resumed.
            drop(unsafe { Box::from_raw(body.cast::<F>()) });
        }
        Fiber { stack: Some(stack), state: State::New { body: body.cast(), drop_body: drop_body::<F> } }
    }

    /// Runs the fiber on the calling thread until it suspends or finishes: from where it last
    /// suspended, or from `from`, the context it sent itself with.
    ///
    /// # Safety
    /// The caller owns the fiber (no other thread touches it) until this returns, except
    /// after a [`Suspend::Sent`], whose fiber belongs to the mailbox it sent itself to from
    /// the moment it did: the caller must not touch it again (hence a pointer, not `&mut`).
    /// `from` must be the context of the fiber's last [`Suspender::suspend_into`] if that is
    /// how it last suspended, and `None` otherwise. `parent` must be [`parent_cell`] of the
    /// calling thread.
    ///
    /// # Panics
    /// If the fiber has finished.
    #[inline(always)]
    pub(crate) unsafe fn resume(
        this: *mut Fiber,
        input: Resume,
        from: Option<&Context>,
        parent: *mut usize,
    ) -> Step {
        // SAFETY: the caller owns the fiber for now; no reference outlives this block.
        unsafe {
            let state = &raw mut (*this).state;
            assert!(!matches!(*state, State::Finished), "resumed a finished fiber");
            // From here on the body belongs to the fiber. Written only when it changes: a hop
            // resumes the fiber on another CPU, and a store would take the line away from the
            // CPU it came from on every hop.
            if !matches!(*state, State::Suspended) {
                *state = State::Suspended;
            }
        }
        let input = match input {
            Resume::Run => RUN,
            Resume::Cancel => CANCEL,
        };
        // SAFETY: the fiber is suspended (or new), so `fiber_sp` is where its last switch (or
        // `new`) left a continuation frame, or (the caller's contract) `from` holds where its
        // last `suspend_into` left off; the fiber switches back here with a code in `rdi` and
        // a worker index in `rsi`. The link travels in `rsi` for a first resume (`entry`).
        let (code, worker) = unsafe {
            match from {
                None => {
                    let link = (*this).link();
                    switch(parent, (*link).fiber_sp, input, link as usize)
                }
                Some(context) => switch_in(parent, context, input, 0),
            }
        };
        match code {
            // SAFETY (both arms): the fiber is back with us, suspended or finished.
            FINISHED => {
                unsafe { (*this).state = State::Finished };
                Step::Finished
            }
            SENT => Step::Suspended(Suspend::Sent { worker }),
            _ => Step::Suspended(Suspend::Hop { worker, stack: unsafe { (*(*this).link()).fiber_sp } }),
        }
    }

    /// Whether the fiber has been resumed at least once.
    pub(crate) fn started(&self) -> bool {
        !matches!(self.state, State::New { .. })
    }

    /// The highest address of the fiber's stack.
    pub(crate) fn base(&self) -> usize {
        match &self.stack {
            Some(stack) => stack.base().get(),
            None => unreachable!("a fiber keeps its stack until `into_stack` consumes it"),
        }
    }

    /// The [`Link`] at the top of the stack (computed, so that a task stays one line).
    fn link(&self) -> *mut Link {
        (self.base() - LINK_BYTES) as *mut Link
    }

    /// The stack of a finished fiber, for reuse; `None` if it has not finished.
    pub(crate) fn into_stack(mut self) -> Option<DefaultStack> {
        match self.state {
            State::Finished => self.stack.take(),
            _ => None,
        }
    }
}

impl Drop for Fiber {
    /// A fiber that never ran drops its body. A suspended one cannot be unwound: what its
    /// stack holds is leaked (the runtime never drops one: it runs every task to the end).
    fn drop(&mut self) {
        if let State::New { body, drop_body } = self.state {
            // SAFETY: the body was never resumed, so it is still ours, and this runs once.
            unsafe { drop_body(body) };
        }
    }
}

/// The running fiber's way back to its worker.
#[derive(Clone, Copy)]
pub(crate) struct Suspender {
    link: *mut Link,
}

impl Suspender {
    /// Suspends the running fiber into a mailbox slot: saves its [`Context`] at `context`
    /// (the slot's payload), switches to its worker's stack and only then stores `word` at
    /// `publish`, which hands the fiber to the slot's reader. Its worker sees
    /// [`Suspend::Sent`] with `worker`; the reader resumes it with that context. Returns what
    /// that resume passes in.
    ///
    /// # Safety
    /// As for [`Suspender::suspend`]; `context` must be valid for writing the context's words,
    /// and `publish` for a store, which must publish the context to whoever resumes the fiber
    /// (a plain store is a Release store on x86-64). `parent` must be [`parent_cell`] of the
    /// calling thread (passed in, so that a hop makes no thread-local call for it).
    #[inline(always)]
    pub(crate) unsafe fn suspend_into(
        &self,
        context: *mut usize,
        publish: *mut usize,
        word: usize,
        worker: usize,
        parent: *const usize,
    ) -> Resume {
        // SAFETY: the caller's contract; we run on the fiber, so the parent cell is where the
        // worker that resumed us left its continuation. Nothing touches the fiber's stack
        // after the publishing store.
        let code = unsafe { switch_out(context, parent, publish, word, worker) };
        if code == CANCEL {
            Resume::Cancel
        } else {
            Resume::Run
        }
    }

    /// Suspends the running fiber and asks its worker to hand it to worker `worker`; returns
    /// what the next resume passes in.
    ///
    /// # Safety
    /// Only on the stack of the fiber this suspender was given to, while that fiber runs.
    #[inline(always)]
    pub(crate) unsafe fn suspend(&self, worker: usize) -> Resume {
        let link = self.link;
        // SAFETY: we run on the fiber, so this thread's parent cell is where the worker that
        // resumed us left its continuation, and `fiber_sp` is ours to write.
        let (code, _) = unsafe { switch(&raw mut (*link).fiber_sp, parent_cell().read(), HOP, worker) };
        if code == CANCEL {
            Resume::Cancel
        } else {
            Resume::Run
        }
    }
}

/// The first frame of every fiber: runs the body, then leaves for good.
///
/// # Safety
/// Reached only through the trampoline from a fiber's first resume, with `body` from
/// `Fiber::new::<F>` and `link` that fiber's link.
unsafe extern "C" fn entry<F>(input: usize, link: usize, body: *mut F) -> !
where
    F: FnOnce(&Suspender, Resume),
{
    let link = link as *mut Link;
    {
        // SAFETY: `Fiber::new::<F>` boxed the body and handed it over at the first resume.
        let body = unsafe { Box::from_raw(body) };
        let input = if input == CANCEL { Resume::Cancel } else { Resume::Run };
        // A panic cannot leave this `extern "C"` frame (it aborts): the runtime's bodies
        // catch every panic of the task's closure.
        body(&Suspender { link }, input);
    }
    // Everything the body owned is dropped; tell the worker, and never come back.
    let mut unused = 0;
    // SAFETY: we run on the fiber, as in `Suspender::suspend`; nothing resumes a finished
    // fiber (`Fiber::resume` asserts it), so `unused` is never read.
    unsafe { switch(&raw mut unused, parent_cell().read(), FINISHED, 0) };
    unreachable!("a finished fiber was resumed")
}

/// Saves this side's continuation, stores its stack pointer at `save`, and continues the
/// side whose stack pointer is `load`, passing it `(a, b)`; returns what that (or another)
/// side passes when it switches back here.
///
/// # Safety
/// `load` must be a stack pointer left by a `switch` (or `Fiber::new`) that has not been
/// continued since, and `save` must stay valid until the other side reads it.
#[inline(always)]
unsafe fn switch(save: *mut usize, load: usize, a: usize, b: usize) -> (usize, usize) {
    let (ra, rb);
    // SAFETY: the caller's contract; the asm pushes only on the current stack (no
    // `nostack`, so the compiler keeps the red zone free), and every register the other
    // side may change is an output or clobbered.
    unsafe {
        asm!(
            "lea rax, [rip + 2f]",
            "push rbp",
            "push rbx",
            "push rax",
            "mov [rcx], rsp",
            "mov rsp, rdx",
            "pop rax",
            "pop rbx",
            "pop rbp",
            "jmp rax",
            "2:",
            in("rcx") save,
            in("rdx") load,
            inout("rdi") a => ra,
            inout("rsi") b => rb,
            out("r12") _,
            out("r13") _,
            out("r14") _,
            out("r15") _,
            clobber_abi("C"),
        );
    }
    (ra, rb)
}

/// The fiber half of a hop: saves this side's [`Context`] at `context`, continues the worker
/// whose stack pointer is at `parent`, passing it `(SENT, worker)`, and from the worker's
/// stack stores `word` at `publish`. Returns the code passed by the [`switch_in`] that
/// resumes this context.
///
/// # Safety
/// As for [`switch`], with `context` valid for writing seven words and `publish` for one.
#[inline(always)]
unsafe fn switch_out(
    context: *mut usize,
    parent: *const usize,
    publish: *mut usize,
    word: usize,
    worker: usize,
) -> usize {
    let code;
    // SAFETY: the caller's contract. The registers the context holds are restored by
    // `switch_in`, so to the compiler they are preserved; everything else is an output or
    // clobbered. The inputs sit in caller-saved registers, which stay ours until the jump.
    unsafe {
        asm!(
            "lea rax, [rip + 2f]",
            "mov [rdx], rsp",
            "mov [rdx + 8], rax",
            "mov [rdx + 16], rbx",
            "mov [rdx + 24], rbp",
            "mov [rdx + 32], r12",
            "mov [rdx + 40], r13",
            "mov [rdx + 48], r14",
            "mov rsp, [rcx]",
            // Off the fiber's stack: the fiber may go.
            "mov [r8], r9",
            "pop rax",
            "pop rbx",
            "pop rbp",
            "jmp rax",
            "2:",
            in("rdx") context,
            in("rcx") parent,
            in("r8") publish,
            in("r9") word,
            inout("rdi") SENT => code,
            inout("rsi") worker => _,
            out("r15") _,
            clobber_abi("C"),
        );
    }
    code
}

/// The worker half: saves the worker's continuation and stores its stack pointer at `save`
/// (as [`switch`] does), then continues the fiber from `context`, passing it `(a, b)`;
/// returns what the fiber passes when it switches back.
///
/// # Safety
/// `context` must be the context of a [`switch_out`] not continued since, and `save` must
/// stay valid until the fiber reads it.
#[inline(always)]
unsafe fn switch_in(save: *mut usize, context: &Context, a: usize, b: usize) -> (usize, usize) {
    let (ra, rb);
    // SAFETY: the caller's contract; as for `switch`, every register the fiber may change is
    // an output or clobbered.
    unsafe {
        asm!(
            "lea rax, [rip + 2f]",
            "push rbp",
            "push rbx",
            "push rax",
            "mov [rcx], rsp",
            "mov rbx, [rdx + 16]",
            "mov rbp, [rdx + 24]",
            "mov r12, [rdx + 32]",
            "mov r13, [rdx + 40]",
            "mov r14, [rdx + 48]",
            "mov rax, [rdx + 8]",
            "mov rsp, [rdx]",
            "jmp rax",
            "2:",
            in("rcx") save,
            in("rdx") context.as_ptr().cast::<usize>(),
            inout("rdi") a => ra,
            inout("rsi") b => rb,
            out("r12") _,
            out("r13") _,
            out("r14") _,
            out("r15") _,
            clobber_abi("C"),
        );
    }
    (ra, rb)
}

extern "C" {
    /// The start trampoline below: `entry(rdi, rsi, rbx)` through `rbp`.
    fn corehop_fiber_start();
}

// The continuation of a fiber's first resume. The resume's `rdi`/`rsi` (input, link) pass
// through; `rbx` holds the boxed body and `rbp` the entry function (see `Fiber::new`). The
// stack is 16-aligned here, so the call meets the ABI. `.cfi_undefined rip` makes this the
// outermost frame for unwinders, and a zero `rbp` for frame-pointer walkers.
global_asm!(
    ".pushsection .text.corehop_fiber_start,\"ax\",@progbits",
    ".globl corehop_fiber_start",
    ".hidden corehop_fiber_start",
    ".type corehop_fiber_start,@function",
    ".p2align 4",
    "corehop_fiber_start:",
    ".cfi_startproc",
    ".cfi_undefined rip",
    "mov rdx, rbx",
    "mov rax, rbp",
    "xor ebp, ebp",
    "call rax",
    "ud2",
    ".cfi_endproc",
    ".size corehop_fiber_start, . - corehop_fiber_start",
    ".popsection",
);
