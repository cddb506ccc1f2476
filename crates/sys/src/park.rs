//! The one park/wake protocol of corehop: how a thread with nothing to do sleeps, and how the
//! thread that gives it something wakes it. Every sleeper uses it: the runtime's workers (their
//! mailbox), service threads and their callers (the hand-off slots), delegation's waiters,
//! component hosts and SMT contexts.
//!
//! A *park word* is a futex word with one sleeper. The sleeper announces itself with the
//! [`SLEEPER`] flag in that very word, set by a read-modify-write from the value it saw
//! ([`sleep`]); every waker changes the word by a read-modify-write that returns the old
//! value, and wakes the futex only if that value had the flag ([`wake`]). The word may carry
//! the work itself (the hand-off's doorbell bits, a completion's sequence number, a `DONE`
//! bit) or, for work that travels elsewhere (a queue, a lane), a token: [`Parker`].
//!
//! ```text
//!  waker                                   sleeper (saw `seen`, which says: nothing to do)
//!  publish the work (in the word, or        CAS word: seen -> seen | SLEEPER
//!    elsewhere before the RMW: Release)       failed: the word changed; look again
//!  old = RMW word (swap, fetch_or, ...)      futex_wait(word, seen | SLEEPER)
//!  old has SLEEPER? futex_wake(word)
//! ```
//!
//! **No lost wake-up.** Every change of the word, by either side, is a read-modify-write, so
//! the changes are totally ordered and each reads the value the one before it wrote; the order
//! of two *different* atomics never matters (no fences, no Dekker). Take a waker's RMW `W`,
//! made after it published its work, and the sleeper's announcing CAS `A` (from `seen`, which
//! it loaded before and judged to mean "nothing to do"):
//! - `W` before `A`: `W` changed the word, and wakers never put back a value a sleeper saw as
//!   "nothing to do" (no ABA: a swap writes a new sequence number, a token or a bit that only
//!   the sleeper clears), so `A` fails and the sleeper looks again. `A` reads `W`'s value or a
//!   later one in `W`'s release sequence, so it sees the work published before `W`.
//! - `A` before `W`: the first waker RMW after `A` returns a value with the flag and wakes the
//!   futex. The kernel checks the word and queues the sleeper under one lock, which the wake
//!   takes too: either the sleeper is queued and woken, or its check finds the word changed
//!   and it does not sleep.
//!
//! A sleep may also end spuriously (a signal, a timeout, another word's wake under loom):
//! every sleeper looks for its work again after [`sleep`] or [`Parker::park`] returns. The
//! models below check both halves under loom, where a lost wake-up is a deadlock.

use core::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, SeqCst};

use crate::model::{futex_wait, futex_wake, AtomicU32};

/// In a park word: its sleeper sleeps, or is about to, on the word.
pub const SLEEPER: u32 = 1 << 31;

/// How a [`sleep`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slept {
    /// Not at all: the word no longer held the value the sleeper saw.
    Changed,
    /// A waker's change (or a spurious wake-up: the sleeper looks again either way).
    Woken,
    /// The timeout passed.
    TimedOut,
}

/// The sleeper's half: announces itself in `word`, which it saw holding `seen` (a value that
/// says there is nothing to do), and sleeps until a waker changes the word, or `timeout_ns`
/// passes. Returns at once if the word no longer holds `seen`. The flag stays set until a
/// waker's RMW or the sleeper clears it.
#[inline]
pub fn sleep(word: &AtomicU32, seen: u32, timeout_ns: Option<u64>) -> Slept {
    let flagged = seen | SLEEPER;
    if seen != flagged && word.compare_exchange(seen, flagged, SeqCst, SeqCst).is_err() {
        return Slept::Changed;
    }
    if futex_wait(word, flagged, timeout_ns) {
        Slept::Woken
    } else {
        Slept::TimedOut
    }
}

/// The waker's half: after its read-modify-write of `word` returned `old` (and changed the
/// word), wakes the sleeper if `old` says it announced itself. Returns whether it did.
#[inline(always)]
pub fn wake(word: &AtomicU32, old: u32) -> bool {
    if old & SLEEPER != 0 {
        futex_wake(word);
        return true;
    }
    false
}

/// Nothing happened since the sleeper last parked.
const EMPTY: u32 = 0;
/// A waker came since the sleeper last parked.
const TOKEN: u32 = 1;

/// A park word for a sleeper whose work travels elsewhere (a mailbox's lanes, queues): a
/// waker publishes its work, then leaves a token in the word; the sleeper consumes the token
/// or sleeps until one comes. One RMW per wake-up on the waker's side, none per look on the
/// sleeper's: it touches the word only to park.
///
/// Use: look for work; none: [`Parker::park`]; look again. A token left by a waker whose work
/// the sleeper already took makes one park return at once: one extra look.
#[derive(Debug)]
pub struct Parker {
    word: AtomicU32,
}

impl Parker {
    /// A parker with no token.
    #[cfg(not(loom))]
    #[allow(clippy::new_without_default)] // const, for statics; Default is not
    pub const fn new() -> Parker {
        Parker { word: AtomicU32::new(EMPTY) }
    }

    /// A parker with no token.
    #[cfg(loom)]
    #[allow(clippy::new_without_default)]
    pub fn new() -> Parker {
        Parker { word: AtomicU32::new(EMPTY) }
    }

    /// Makes the sleeper's current or next [`Parker::park`] return; call after publishing the
    /// work. Returns whether the sleeper was asleep (or about to be), and so was woken.
    #[inline(always)]
    pub fn unpark(&self) -> bool {
        self.unpark_with(|| ())
    }

    /// [`Parker::unpark`], running `before_wake` first if the sleeper is to be woken (to leave
    /// a note it reads on waking, such as when the wake was issued).
    #[inline(always)]
    pub fn unpark_with(&self, before_wake: impl FnOnce()) -> bool {
        // Release: the work published before; Acquire: nothing, but a swap is one instruction.
        let old = self.word.swap(TOKEN, AcqRel);
        if old & SLEEPER != 0 {
            before_wake();
        }
        wake(&self.word, old)
    }

    /// Whether an unpark came since the last park: a load of the word, which stays in the
    /// sleeper's cache until a waker writes it, so a sleeper may spin on this before it parks
    /// without touching the lines its wakers work on. [`Parker::park`] consumes the token.
    #[inline(always)]
    pub fn has_token(&self) -> bool {
        self.word.load(Relaxed) == TOKEN
    }

    /// Consumes a token left since the last park, without sleeping: for a sleeper about to
    /// look for its work, so that [`Parker::has_token`] then tells only of wakers after that
    /// look. Returns whether there was one.
    #[inline(always)]
    pub fn take_token(&self) -> bool {
        // Acquire: the work of the waker whose token this consumes, seen by the look to come.
        self.word.swap(EMPTY, Acquire) == TOKEN
    }

    /// Sleeps until an unpark after the last park returned; returns at once if one came
    /// already. May return spuriously: the caller looks for its work again either way. One
    /// sleeper at a time. Returns whether it slept (on the futex).
    pub fn park(&self) -> bool {
        if self.take_token() {
            return false;
        }
        let slept = sleep(&self.word, EMPTY, None) != Slept::Changed;
        // Consume the token that ended the sleep (or clear the flag after a spurious end), so
        // that the next park sleeps: a stale token would cost an extra look.
        self.word.swap(EMPTY, Acquire);
        slept
    }
}

/// The park word of a worker's mailbox: what producers ring after they publish work, and what
/// the worker sleeps on when it finds none. A [`Parker`] carries a token for work that travels
/// elsewhere; the call slots of [`crate::handoff::Lane`] are a door too, whose doorbell names
/// the calls that wait, so a worker whose mailbox takes calls sleeps on one word for both.
pub trait Door {
    /// Makes the sleeper's current or next [`Door::park`] return; call after publishing the
    /// work. Runs `before_wake` first if the sleeper is to be woken (to leave a note it reads on
    /// waking), and returns whether it was.
    fn ring_with(&self, before_wake: impl FnOnce()) -> bool;

    /// Sleeps until a ring after the last park; returns at once if one came already. May return
    /// spuriously: the caller looks for its work again either way. One sleeper at a time.
    /// Returns whether it slept.
    fn park(&self) -> bool;
}

impl Door for Parker {
    #[inline(always)]
    fn ring_with(&self, before_wake: impl FnOnce()) -> bool {
        self.unpark_with(before_wake)
    }

    fn park(&self) -> bool {
        Parker::park(self)
    }
}

/// A sleeper's loop: takes `n` pieces of work, one at a time as `available` shows them,
/// parking whenever it has taken all it sees.
#[cfg(test)]
fn take(parker: &Parker, n: u32, available: impl Fn() -> u32) {
    let mut taken = 0;
    while taken < n {
        if available() > taken {
            taken += 1;
        } else {
            parker.park();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    use std::sync::Arc;

    #[test]
    fn a_token_left_before_the_park_makes_it_return_and_is_consumed() {
        let parker = Parker::new();
        assert!(!parker.unpark(), "nobody sleeps");
        assert!(!parker.park(), "returns at once: the token was there");
        assert_eq!(parker.word.load(Relaxed), EMPTY, "consumed");
    }

    #[test]
    fn a_token_can_be_watched_and_dropped_without_sleeping() {
        let parker = Parker::new();
        assert!(!parker.has_token() && !parker.take_token());
        parker.unpark();
        assert!(parker.has_token(), "seen by a load");
        assert!(parker.has_token(), "and still there");
        assert!(parker.take_token(), "taken");
        assert!(!parker.has_token());
        parker.unpark();
        assert!(!parker.park(), "a token after the take still ends the next park at once");
    }

    #[test]
    fn sleep_returns_at_once_when_the_word_moved_on() {
        let word = AtomicU32::new(5);
        assert_eq!(sleep(&word, 4, None), Slept::Changed);
        assert_eq!(word.load(Relaxed), 5, "no flag set on a word that changed");
        assert_eq!(sleep(&word, 5, Some(1_000)), Slept::TimedOut, "on an unchanged word");
        assert_eq!(word.load(Relaxed), 5 | SLEEPER, "the flag stays for the waker to see");
        assert!(wake(&word, word.swap(6, SeqCst)));
        assert!(!wake(&word, word.swap(7, SeqCst)), "the flag went with the first waker's swap");
    }

    /// A sleeper parked on a real futex is woken by each unpark, round after round.
    #[test]
    fn every_unpark_reaches_a_parked_thread() {
        let parker = Arc::new(Parker::new());
        let work = Arc::new(AtomicU32::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let sleeper = {
            let (parker, work, done) = (parker.clone(), work.clone(), done.clone());
            std::thread::spawn(move || {
                take(&parker, 200, || work.load(Acquire));
                done.store(true, Relaxed);
            })
        };
        for _ in 0..200 {
            work.fetch_add(1, SeqCst);
            parker.unpark();
            std::thread::yield_now();
        }
        sleeper.join().unwrap();
        assert!(done.load(Relaxed));
    }
}

/// Model checks (`RUSTFLAGS="--cfg loom" cargo test --release -p corehop-sys --lib
/// --target-dir target/loom -- loom`): the futex is modelled so that a lost wake-up is a
/// deadlock loom reports.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use core::sync::atomic::Ordering::{Relaxed, Release};
    use loom::sync::atomic::AtomicU32 as Work;
    use loom::sync::Arc;

    /// Two wakers each publish one piece of work elsewhere (a counter, Release) and unpark; the
    /// sleeper parks whenever it sees less than it has taken: it gets both, in every
    /// interleaving.
    #[test]
    fn loom_parker_two_wakers_no_lost_wakeup() {
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(3);
        model.check(|| {
            let parker = Arc::new(Parker::new());
            let work = Arc::new(Work::new(0));
            let wakers: Vec<_> = (0..2)
                .map(|_| {
                    let (parker, work) = (parker.clone(), work.clone());
                    loom::thread::spawn(move || {
                        work.fetch_add(1, Release);
                        parker.unpark();
                    })
                })
                .collect();
            take(&parker, 2, || work.load(Acquire));
            wakers.into_iter().for_each(|w| w.join().unwrap());
        });
    }

    /// Work carried in the word itself, as the hand-off's doorbell and completion words carry
    /// it: two wakers each add one with a `fetch_add` and wake on the flag; the sleeper sleeps
    /// on each value it sees short of two, and clears the flag when it wakes. It sees two.
    #[test]
    fn loom_sleep_on_a_word_that_carries_the_work() {
        loom::model(|| {
            let word = Arc::new(AtomicU32::new(0));
            let wakers: Vec<_> = (0..2)
                .map(|_| {
                    let word = word.clone();
                    loom::thread::spawn(move || {
                        wake(&word, word.fetch_add(1, SeqCst));
                    })
                })
                .collect();
            loop {
                let seen = word.load(Acquire) & !SLEEPER;
                if seen == 2 {
                    break;
                }
                sleep(&word, seen, None);
                word.fetch_and(!SLEEPER, Relaxed);
            }
            wakers.into_iter().for_each(|w| w.join().unwrap());
        });
    }
}
