//! A task's fiber and the one step that makes hops possible: sending a suspended fiber to
//! another worker thread.
//!
//! A fiber is a stack of its own (a guarded `corosensei::stack::DefaultStack` from the
//! runtime's stack pool) with the task's closure at the bottom, and a way to switch to it and
//! back. A suspended stack may hold anything, so fiber libraries make their fibers `!Send`.
//! [`Fiber`] implements `Send` anyway; this is the argument for why that is sound under the
//! rules the rest of the runtime enforces.
//!
//! # Two implementations of the switch
//! - **x86-64: our own** (`switch_x86_64`). A hop resumes a fiber inside `hop`, which it
//!   entered before it suspended, usually on another CPU. corosensei enters a fiber with a
//!   `call` and leaves it with a `ret`, so after every hop the CPU's return-address predictor
//!   holds the worker's return address where the fiber's should be: two mispredicted returns
//!   per switch pair. Our switch enters and leaves with a `jmp` and never touches the return
//!   stack, so the fiber's returns are predicted from its own calls: a `yield_now` costs about
//!   half as much (docs/performance.md, "our own switch"); a hop between CPUs is dominated by
//!   its cache misses and gained little. This is the hot path the runtime exists for, hence
//!   our own code rather than the crate's.
//! - **everywhere else: corosensei** (`portable`), and on x86-64 too when built with
//!   `--cfg corehop_portable_fibers` (the test script runs the hop tests that way, so both stay
//!   tested).
//!
//! # What a hop moves
//! A `Handoff` hop suspends the fiber inside [`crate::hop`]. With our own switch the fiber
//! sends itself: it reserves a slot in the target worker's mailbox, saves its registers into
//! the slot's payload, switches back to its worker's stack and from there publishes the slot
//! with one store (`Suspender::suspend_into`); the target resumes it from the payload. With
//! corosensei (or while the slot ring is full) the switch saves the registers on the fiber's
//! own stack and the worker pushes the task (this fiber, inside its `Box<Task>`) on. Either
//! way what moves is the whole stack, with every local of every frame of the task, and
//! nothing else: the worker threads' own stacks and thread-locals stay where they are.
//!
//! # Soundness
//! 1. **One thread at a time.** A fiber is touched only by the worker that owns its `Box<Task>`:
//!    the worker that popped it runs it. It is handed on only once it is fully switched out
//!    (its registers saved, no frame of it on any CPU): the worker pushes the box after
//!    `resume` returns, and a fiber that sends itself publishes the box's address with its
//!    last instruction on the worker's stack, after which the old worker never touches it
//!    (it holds a raw pointer, not the box, while the fiber runs). Ownership of the box is
//!    the permission to touch the stack; `Box` makes it unique.
//! 2. **Publication.** Sending is a Release store (lane) or CAS (list) and taking an Acquire
//!    load or swap (see `mailbox`); the fiber's own publishing store is a plain `mov`, which
//!    on x86-64 has Release semantics, after an `asm!` block the compiler may not move memory
//!    accesses across. So every write the old worker made to the stack happens-before the
//!    new worker resumes it.
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
//!    no stack ever has to be force-unwound.

#[cfg(not(corehop_own_switch))]
mod portable;
#[cfg(not(corehop_own_switch))]
pub(crate) use portable::{parent_cell, Fiber, Suspender, SENDS_ITSELF};

#[cfg(corehop_own_switch)]
mod switch_x86_64;
#[cfg(corehop_own_switch)]
pub(crate) use switch_x86_64::{parent_cell, Fiber, Suspender, SENDS_ITSELF};

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
    /// at or near the top of the suspended stack, where the target will resume it (a prefetch
    /// hint).
    Hop { worker: usize, stack: usize },
    /// I sent myself to this worker's mailbox (`Suspender::suspend_into`, our own switch
    /// only); I am no longer yours.
    #[cfg_attr(not(corehop_own_switch), allow(dead_code))]
    Sent { worker: usize },
}

/// Where a fiber that sent itself continues: the payload of the mailbox slot it sent itself
/// in (on x86-64: stack pointer, continuation, `rbx`, `rbp`, `r12`-`r14`).
pub(crate) type Context = crate::mailbox::Payload;

/// How a resume ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    Suspended(Suspend),
    Finished,
}

#[cfg(test)]
mod tests {
    use super::*;
    use corosensei::stack::DefaultStack;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    fn fiber<F: FnOnce(&Suspender, Resume) + Send + 'static>(body: F) -> Fiber {
        Fiber::new(DefaultStack::new(64 * 1024).unwrap(), body)
    }

    /// Resumes a fiber that suspended through `suspend` (or never ran).
    fn run(f: &mut Fiber, input: Resume) -> Step {
        // SAFETY: the test owns `f`, and it never suspends into a slot.
        unsafe { Fiber::resume(f, input, None, parent_cell()) }
    }

    #[test]
    fn a_fiber_runs_suspends_resumes_with_its_stack_intact_and_finishes() {
        let seen = Arc::new(AtomicUsize::new(0));
        let seen_in = seen.clone();
        let mut f = fiber(move |s, input| {
            assert_eq!(input, Resume::Run);
            let local = [7u64; 32];
            for worker in 0..3 {
                // SAFETY: called on this fiber's own stack, while it runs.
                assert_eq!(unsafe { s.suspend(worker) }, Resume::Run);
                assert_eq!(local.iter().sum::<u64>(), 7 * 32, "the stack survives a switch");
                seen_in.fetch_add(1, Ordering::Relaxed);
            }
        });
        let base = f.base();
        for worker in 0..3 {
            match run(&mut f, Resume::Run) {
                Step::Suspended(Suspend::Hop { worker: w, stack }) => {
                    assert_eq!(w, worker);
                    assert!(stack < base && base - stack < 64 * 1024, "the hint points into the stack");
                }
                other => panic!("expected a hop, got {other:?}"),
            }
        }
        assert_eq!(run(&mut f, Resume::Run), Step::Finished);
        assert_eq!(seen.load(Ordering::Relaxed), 3);
        assert!(f.into_stack().is_some(), "a finished fiber gives its stack back");
    }

    #[test]
    fn a_fiber_moves_to_another_thread_between_switches() {
        let mut f = fiber(|s, _| {
            let before = std::thread::current().id();
            // SAFETY: on this fiber's stack, while it runs.
            unsafe { s.suspend(1) };
            assert_ne!(std::thread::current().id(), before);
        });
        assert!(matches!(run(&mut f, Resume::Run), Step::Suspended(_)));
        let step = std::thread::spawn(move || {
            let step = run(&mut f, Resume::Run);
            (step, f.into_stack().is_some())
        })
        .join()
        .unwrap();
        assert_eq!(step, (Step::Finished, true));
    }

    #[test]
    fn the_first_input_reaches_the_body_and_unstarted_fibers_drop_their_closure() {
        let mut f = fiber(|_, input| assert_eq!(input, Resume::Cancel));
        assert!(!f.started());
        assert_eq!(run(&mut f, Resume::Cancel), Step::Finished);
        assert!(f.started());
        let captured = Arc::new(());
        let held = captured.clone();
        drop(fiber(move |_, _| drop(held)));
        assert_eq!(Arc::strong_count(&captured), 1, "the closure of a fiber never resumed is dropped");
        assert!(fiber(|_, _| {}).into_stack().is_none(), "an unfinished fiber keeps its stack");
    }

    #[test]
    fn a_backtrace_inside_a_fiber_ends_at_its_first_frame() {
        let mut f = fiber(|s, _| {
            // SAFETY: on this fiber's stack, while it runs.
            unsafe { s.suspend(0) };
            let trace = std::backtrace::Backtrace::force_capture().to_string();
            // Walking the stack must not crash; ours must also stop at the fiber's first frame
            // (corosensei's continues into the resuming thread's stack).
            assert!(trace.contains("a_backtrace_inside_a_fiber"), "{trace}");
            #[cfg(corehop_own_switch)]
            assert!(trace.trim_end().ends_with("corehop_fiber_start"), "{trace}");
        });
        assert!(matches!(run(&mut f, Resume::Run), Step::Suspended(_)));
        // Resumed from another thread, as after a hop.
        let step = std::thread::spawn(move || run(&mut f, Resume::Run)).join().unwrap();
        assert_eq!(step, Step::Finished);
    }

    #[test]
    fn floating_point_and_callee_saved_state_survive_a_switch() {
        let mut f = fiber(|s, _| {
            let mut x = 1.5f64;
            let mut acc = 0u64;
            for i in 0..100u64 {
                x = std::hint::black_box(x) * 1.000_001;
                acc = acc.wrapping_mul(31).wrapping_add(i);
                // SAFETY: on this fiber's stack, while it runs.
                unsafe { s.suspend(0) };
            }
            assert!((x - 1.5 * 1.000_001f64.powi(100)).abs() < 1e-9);
            assert_eq!(acc, (0..100u64).fold(0u64, |a, i| a.wrapping_mul(31).wrapping_add(i)));
        });
        // The worker side keeps live values across resumes too.
        let (mut y, mut steps) = (2.5f64, 0u32);
        while run(&mut f, Resume::Run) != Step::Finished {
            y = std::hint::black_box(y) + 1.0;
            steps += 1;
        }
        assert_eq!((y, steps), (102.5, 100));
    }

    /// A fiber that sends itself: its context lands in the slot, the publishing store comes
    /// after it (from the worker's stack), and a resume from that context on another thread
    /// continues it with its stack and registers intact.
    #[cfg(corehop_own_switch)]
    #[test]
    fn a_fiber_sends_itself_and_resumes_from_its_context_elsewhere() {
        use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
        struct Slot {
            context: [AtomicUsize; 7],
            word: AtomicUsize,
        }
        let slot: &'static Slot =
            Box::leak(Box::new(Slot { context: Default::default(), word: AtomicUsize::new(0) }));
        let checks = std::sync::Arc::new(AtomicU64::new(0));
        let seen = checks.clone();
        let mut f = fiber(move |s, _| {
            let local = [3u64; 40];
            let (mut a, mut b, mut c) = (std::hint::black_box(1u64), std::hint::black_box(2u64), 0u64);
            for round in 1..=4usize {
                // SAFETY: on this fiber's stack, while it runs; both addresses outlive it.
                let input = unsafe {
                    s.suspend_into(
                        slot.context.as_ptr().cast_mut().cast(),
                        slot.word.as_ptr(),
                        round,
                        round,
                        parent_cell(),
                    )
                };
                assert_eq!(input, Resume::Run);
                (a, b, c) = (b, a + b, c + a * b);
                assert_eq!(local.iter().sum::<u64>(), 3 * 40, "the stack survives");
                seen.store(a << 32 | b << 16 | c, Ordering::Relaxed);
            }
        });
        let mut step = run(&mut f, Resume::Run);
        let mut fiber_ptr = &raw mut f as usize;
        for round in 1..=4usize {
            assert_eq!(step, Step::Suspended(Suspend::Sent { worker: round }));
            assert_eq!(slot.word.load(Ordering::Acquire), round, "published after the context");
            // Another thread takes it, as a target worker does.
            (step, fiber_ptr) = std::thread::spawn(move || {
                // SAFETY: the fiber sent itself with this context and nothing else touches it.
                (
                    unsafe {
                        Fiber::resume(
                            fiber_ptr as *mut Fiber,
                            Resume::Run,
                            Some(&slot.context),
                            parent_cell(),
                        )
                    },
                    fiber_ptr,
                )
            })
            .join()
            .unwrap();
        }
        assert_eq!(step, Step::Finished);
        // a, b, c after four rounds of (b, a + b, c + a * b) from (1, 2, 0).
        let (mut a, mut b, mut c) = (1u64, 2u64, 0u64);
        for _ in 0..4 {
            (a, b, c) = (b, a + b, c + a * b);
        }
        assert_eq!(checks.load(Ordering::Relaxed), a << 32 | b << 16 | c);
        assert!(f.into_stack().is_some());
    }
}
