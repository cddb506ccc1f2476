//! A block of delegated operations and the protocol that hands its results back.
//!
//! A block is what one request carries: one or more closures bound for one CPU, each with room
//! for its result, and one completion word. The client keeps one `Arc` of it (in a `Pending`),
//! the serving side gets another through the CPU's inbox. Who may touch what:
//!
//! ```text
//!  client (Pending)                         server (whoever popped the block)
//!  ----------------                         ---------------------------------
//!  fills the items, pushes the block ──────▶ runs every item in order (or drops them all,
//!                                            if cancelled), writes each result in place
//!  waits: state has DONE? (Acquire)  ◀────── state |= DONE (AcqRel); then, as the old state
//!    spin, or sleep (park::sleep),           says: park::wake, waker.wake_by_ref()
//!    or store a waker + WAKER                (WAKER)
//!  takes the results
//! ```
//!
//! The items belong to the server from the push until its `DONE`, and to the client after it
//! has seen `DONE`; the release-acquire pair on `state` orders the two. The waker slot belongs
//! to the client while `WAKER` is clear and `DONE` is not set, and is only read while `WAKER`
//! is set: the client clears `WAKER` (seeing `DONE` there means the server may be reading it:
//! leave it), writes, and sets `WAKER` again (seeing `DONE` there means the server did not
//! read it: the result is ready). Every access to `state` by the two sides is a
//! read-modify-write or an acquire load, so the server's `DONE` and the client's `WAKER` and
//! the `SLEEPER` flag are totally ordered: a waiter that registers before the `DONE` is woken, one that
//! registers after sees it. The futex sleep is `corehop_sys::park`'s (the flag `SLEEPER` in this
//! word), which compares the whole word, so a `DONE` between the check and the sleep makes the
//! sleep return.
//!
//! Dropping either side's `Arc` is always sound: the last one frees the block with whatever
//! it holds (closures that never ran, results nobody took), so a dropped `Pending` leaks
//! nothing, and the operation still runs.

use std::any::Any;
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::task::Waker;

use corehop_sys::park;

use crate::sync::{AtomicU32, Ordering, UnsafeCell};

/// The results are in (or the block was cancelled).
const DONE: u32 = 1;
/// The waker slot holds the waker to wake at `DONE`.
const WAKER: u32 = 4;
/// Set with `DONE` when the operations were dropped without running (shutdown).
const CANCELLED: u32 = 8;

/// How a block ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Every operation ran; the results are in.
    Ran,
    /// No operation ran: the CPU's worker had exited (the runtime shut down).
    Cancelled,
}

/// A block's completion word and waker: the hand-back half of the protocol.
pub(crate) struct Completion {
    state: AtomicU32,
    waker: UnsafeCell<Option<Waker>>,
}

impl Completion {
    pub(crate) fn new() -> Self {
        Completion { state: AtomicU32::new(0), waker: UnsafeCell::new(None) }
    }

    /// Server: publishes the end of the block (after writing the results) and wakes whoever
    /// waits. The block is kept alive by the server's own `Arc` meanwhile.
    fn complete(&self, outcome: Outcome) {
        let bits = match outcome {
            Outcome::Ran => DONE,
            Outcome::Cancelled => DONE | CANCELLED,
        };
        // Release: the results; Acquire: the waker the client wrote before setting WAKER.
        let before = self.state.fetch_or(bits, Ordering::AcqRel);
        park::wake(&self.state, before);
        if before & WAKER != 0 {
            // SAFETY: WAKER was set, so the client wrote the slot before setting it and will
            // not write it again now that DONE is set (it only writes after clearing WAKER
            // and seeing no DONE): reads only, here and on its side.
            self.waker.with(|waker| unsafe { (*waker).as_ref() }.map(Waker::wake_by_ref));
        }
    }

    /// How the block ended, if it has (an acquire load: the results are then visible).
    pub(crate) fn outcome(&self) -> Option<Outcome> {
        outcome_of(self.state.load(Ordering::Acquire))
    }

    /// Sleeps until the block has ended (one waiting thread at a time: the `Pending`'s owner).
    pub(crate) fn park_until_done(&self) -> Outcome {
        loop {
            // Acquire: if DONE is there, the results are visible.
            let state = self.state.load(Ordering::Acquire);
            if let Some(outcome) = outcome_of(state) {
                return outcome;
            }
            // Returns at once if the word changed since the load (DONE landed).
            park::sleep(&self.state, state, None);
        }
    }

    /// Makes `waker` the one to wake at the end, unless the block has ended: then its outcome.
    pub(crate) fn register(&self, waker: &Waker) -> Option<Outcome> {
        let state = self.state.load(Ordering::Acquire);
        if let Some(outcome) = outcome_of(state) {
            return Some(outcome);
        }
        if state & WAKER != 0 {
            // SAFETY: WAKER is set: neither side writes the slot now, both may read.
            let same =
                self.waker.with(|slot| unsafe { (*slot).as_ref() }.is_some_and(|w| w.will_wake(waker)));
            if same {
                return None;
            }
            // Take the slot back; DONE there means the server may be reading it.
            let before = self.state.fetch_and(!WAKER, Ordering::AcqRel);
            if let Some(outcome) = outcome_of(before) {
                return Some(outcome);
            }
        }
        // SAFETY: WAKER is clear and DONE was not set when we cleared it (or looked): the
        // server reads the slot only if its DONE finds WAKER set, which needs the store below.
        self.waker.with_mut(|slot| unsafe { *slot = Some(waker.clone()) });
        // Release: the waker; Acquire: the results, if DONE came first.
        let before = self.state.fetch_or(WAKER, Ordering::AcqRel);
        outcome_of(before)
    }
}

fn outcome_of(state: u32) -> Option<Outcome> {
    match (state & DONE != 0, state & CANCELLED != 0) {
        (false, _) => None,
        (true, false) => Some(Outcome::Ran),
        (true, true) => Some(Outcome::Cancelled),
    }
}

/// One operation of a block, as it goes from closure to result.
pub(crate) enum Item<F, T> {
    Op(F),
    Ran(T),
    Panicked(Box<dyn Any + Send + 'static>),
    Gone,
}

/// What the serving side does with a block it popped: exactly one of the two, once.
pub(crate) trait Job: Send + Sync {
    /// Runs every operation in order, each under `catch_unwind`, then completes the block.
    fn run(&self);
    /// Drops the operations unrun and completes the block as cancelled.
    fn cancel(&self);
}

/// What the client does with a block: wait for it and take its results.
pub(crate) trait Results<T>: Job {
    fn completion(&self) -> &Completion;

    /// Moves the results (in order) into `out`; an operation that panicked gives its payload.
    ///
    /// # Safety
    /// Only the block's client may call this, once, after [`Completion::outcome`] (or
    /// another acquire of the state) said [`Outcome::Ran`].
    unsafe fn take(&self, out: &mut dyn FnMut(std::thread::Result<T>));
}

/// Operations of type `F` bound for one CPU, their results and their completion. `S` holds the
/// items: an array for a single operation (one allocation), a `Vec` for a batch.
pub(crate) struct Block<F, T, S> {
    completion: Completion,
    items: UnsafeCell<S>,
    _items_of: PhantomData<fn() -> (F, T)>,
}

// SAFETY: the items move between the client and the server thread, so `S` must be `Send`; they
// are never accessed from two threads at once (see the module docs), so sharing the block
// needs nothing more. The waker is `Send + Sync`.
unsafe impl<F, T, S: Send> Sync for Block<F, T, S> {}

impl<F, T, S> Block<F, T, S> {
    pub(crate) fn new(items: S) -> Self {
        Block { completion: Completion::new(), items: UnsafeCell::new(items), _items_of: PhantomData }
    }
}

impl<F, T, S> Job for Block<F, T, S>
where
    F: FnOnce() -> T + Send,
    T: Send,
    S: AsMut<[Item<F, T>]> + Send,
{
    fn run(&self) {
        // SAFETY: the server that popped the block owns the items until it sets DONE, below.
        self.items.with_mut(|items| {
            for item in unsafe { &mut *items }.as_mut() {
                if let Item::Op(op) = std::mem::replace(item, Item::Gone) {
                    *item = match catch_unwind(AssertUnwindSafe(op)) {
                        Ok(value) => Item::Ran(value),
                        Err(payload) => Item::Panicked(payload),
                    };
                }
            }
        });
        self.completion.complete(Outcome::Ran);
    }

    fn cancel(&self) {
        // SAFETY: as in `run`.
        self.items
            .with_mut(|items| unsafe { &mut *items }.as_mut().iter_mut().for_each(|item| *item = Item::Gone));
        self.completion.complete(Outcome::Cancelled);
    }
}

impl<F, T, S> Results<T> for Block<F, T, S>
where
    F: FnOnce() -> T + Send,
    T: Send,
    S: AsMut<[Item<F, T>]> + Send,
{
    fn completion(&self) -> &Completion {
        &self.completion
    }

    unsafe fn take(&self, out: &mut dyn FnMut(std::thread::Result<T>)) {
        // SAFETY: the caller saw DONE with acquire, so the server is done with the items, and
        // it is the block's only client.
        self.items.with_mut(|items| {
            for item in unsafe { &mut *items }.as_mut() {
                match std::mem::replace(item, Item::Gone) {
                    Item::Ran(value) => out(Ok(value)),
                    Item::Panicked(payload) => out(Err(payload)),
                    Item::Op(_) | Item::Gone => unreachable!("a completed block holds every result once"),
                }
            }
        });
    }
}
