//! The state word of the preload library's start-up stub (`crates/preload-stub`, which
//! includes this file by path): whether the library is loaded, being loaded (and by which
//! process and thread), or will never be, and whether a process sharing the stub's memory may
//! exist.
//!
//! The mark a call leaves before it starts such a child and the load both change this one
//! word by compare-and-swap, so either the mark comes first and the loader sees it (and tells
//! the library), or the load finished first and the call goes to the library's own entry
//! point. The loader's pid and tid enter the word with the same swap: a thread that finds a
//! load in progress knows at once whether it is the loader itself (a call made from inside
//! `dlopen`: it must not wait for itself) or a fork child of a loading process (whose loader
//! is not there: it must not wait either). A loom model below checks the hand-off.
//!
//! Only `core` (and loom's atomics under `--cfg loom`): the stub is `no_std`.

#[cfg(loom)]
use loom::sync::atomic::AtomicU64;

#[cfg(not(loom))]
use core::sync::atomic::AtomicU64;

use core::sync::atomic::Ordering::{self, Acquire, Relaxed, SeqCst};

/// Where the process stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Every call runs on libc; the library is not loaded.
    Plain,
    /// As `Plain`, and a process the library's fork handlers would not see may exist (a
    /// `vfork` or `clone` child sharing this memory, or a copy made without fork handlers).
    PlainWithChild,
    /// Thread `tid` of process `pid` is loading the library.
    Loading {
        /// The loader's process.
        pid: u32,
        /// The loader's thread.
        tid: u32,
    },
    /// The library is loaded and started.
    Loaded,
    /// The library will not be loaded in this process; every call runs on libc.
    Stays,
}

/// Kernel pids and tids fit in 22 bits (`pid_max` is at most 2^22); 30 are kept.
const ID_BITS: u32 = 30;
const ID_MASK: u64 = (1 << ID_BITS) - 1;

impl State {
    /// The word: a tag in the low four bits (0 is `Plain`), the loader's pid and tid above it.
    fn encode(self) -> u64 {
        match self {
            State::Plain => 0,
            State::PlainWithChild => 1,
            State::Loading { pid, tid } => {
                2 | (u64::from(pid) & ID_MASK) << 4 | (u64::from(tid) & ID_MASK) << (4 + ID_BITS)
            }
            State::Loaded => 3,
            State::Stays => 4,
        }
    }

    fn decode(word: u64) -> State {
        match word & 0xf {
            0 => State::Plain,
            1 => State::PlainWithChild,
            2 => State::Loading {
                pid: ((word >> 4) & ID_MASK) as u32,
                tid: ((word >> (4 + ID_BITS)) & ID_MASK) as u32,
            },
            3 => State::Loaded,
            _ => State::Stays,
        }
    }
}

/// A [`State`] in one atomic word (`StateWord(AtomicU64::new(0))` is [`State::Plain`]).
pub struct StateWord(pub AtomicU64);

impl StateWord {
    /// The state now.
    pub fn load(&self, order: Ordering) -> State {
        State::decode(self.0.load(order))
    }

    /// Moves from `from` to `to` if the word still holds `from`.
    fn shift(&self, from: State, to: State) -> bool {
        self.0.compare_exchange(from.encode(), to.encode(), SeqCst, Relaxed).is_ok()
    }

    /// Before a watched call: a process that has not loaded the library moves to `to`
    /// ([`State::PlainWithChild`], before a call that starts a child sharing this memory, with
    /// `mark` run first; or [`State::Stays`]). A load in progress is waited out (`pause`
    /// between looks), unless this thread is the loader or the loader is in another process
    /// (`me`: this process's pid and this thread's tid): so the library either is loaded
    /// before the call returns here, or its loader saw the mark.
    pub fn settle(
        &self,
        to: State,
        me: impl Fn() -> (u32, u32),
        mut mark: impl FnMut(),
        mut pause: impl FnMut(),
    ) {
        loop {
            match self.load(Acquire) {
                state @ (State::Plain | State::PlainWithChild) if state != to => {
                    if to == State::PlainWithChild {
                        mark();
                    }
                    if self.shift(state, to) {
                        return;
                    }
                }
                State::Loading { pid, tid } => {
                    let (my_pid, my_tid) = me();
                    if tid == my_tid || pid != my_pid {
                        return;
                    }
                    pause();
                }
                _ => return,
            }
        }
    }

    /// Loads the library if the word still holds `from` (the state the caller saw, one of the
    /// two plain ones): `load(child_seen)` loads and starts it, and says whether it did.
    pub fn load_once(&self, from: State, me: (u32, u32), load: impl FnOnce(bool) -> bool) {
        let (pid, tid) = me;
        if !self.shift(from, State::Loading { pid, tid }) {
            return;
        }
        let loaded = load(from == State::PlainWithChild);
        self.0.store(if loaded { State::Loaded } else { State::Stays }.encode(), SeqCst);
    }

    /// In a child of glibc's `fork`: its memory is its own, shared with no child of the
    /// parent's.
    pub fn after_fork_child(&self) {
        self.shift(State::PlainWithChild, State::Plain);
    }
}

/// Whether thread `tid`, with the signals `blocked` blocked, may allocate (load the library,
/// build the default policy, start a service thread), given the thread that made the
/// process's first call and what it had blocked then.
///
/// Each allocates. Done in a signal handler that interrupted `malloc` on the same thread, it
/// ran on a heap caught half-changed: a program whose handler writes while its main thread
/// allocates crashed in 10 of 20 runs under the default policy (heap corruption). A handler
/// runs with its signal blocked (and its `sa_mask`), so a thread that blocks more now than at
/// its first call is taken to be in one, and the step waits for a later call. Only the first
/// call's thread is known; another thread goes ahead whatever it blocks.
pub fn outside_a_handler(tid: i64, blocked: u64, first_tid: i64, first_blocked: u64) -> bool {
    tid != first_tid || !blocks_more(blocked, first_blocked)
}

/// Whether the signals `blocked` include one that `reference` does not.
pub fn blocks_more(blocked: u64, reference: u64) -> bool {
    blocked & !reference != 0
}

/// glibc's own signals, which no thread may keep blocked while it waits for anything:
/// SIGSETXID (33) carries a process-wide set*id call to every thread and waits until each
/// has made it, holding a lock that `dlopen` and `pthread_create` take; SIGCANCEL (32) is
/// `pthread_cancel`'s.
pub const GLIBC_SIGNALS: u64 = (1 << (32 - 1)) | (1 << (33 - 1));

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_thread_blocking_more_than_at_its_first_call_waits_to_load() {
        const SIGALRM: u64 = 1 << (14 - 1);
        const SIGCHLD: u64 = 1 << (17 - 1);
        // The first call's thread, as it was then: goes ahead.
        assert!(outside_a_handler(10, SIGCHLD, 10, SIGCHLD));
        // The same thread in a handler of SIGALRM: waits.
        assert!(!outside_a_handler(10, SIGCHLD | SIGALRM, 10, SIGCHLD));
        // Blocking less is no handler's doing.
        assert!(outside_a_handler(10, 0, 10, SIGCHLD));
        // Another thread goes ahead whatever it blocks.
        assert!(outside_a_handler(11, u64::MAX, 10, 0));
    }

    #[test]
    fn every_state_survives_its_word() {
        let states = [
            State::Plain,
            State::PlainWithChild,
            State::Loading { pid: 4_194_303, tid: 17 },
            State::Loading { pid: 1, tid: 4_194_303 },
            State::Loaded,
            State::Stays,
        ];
        for state in states {
            assert_eq!(State::decode(state.encode()), state);
        }
    }

    #[test]
    fn the_loader_and_a_fork_child_of_it_do_not_wait_for_the_load() {
        let word = StateWord(AtomicU64::new(0));
        let mut loads = 0;
        word.load_once(State::Plain, (10, 11), |child_seen| {
            assert!(!child_seen);
            // From inside the load: the loader itself, and a process with another pid.
            word.settle(State::PlainWithChild, || (10, 11), || {}, || panic!("the loader waited"));
            word.settle(State::Stays, || (12, 12), || {}, || panic!("a fork child waited"));
            loads += 1;
            true
        });
        assert_eq!((loads, word.load(Relaxed)), (1, State::Loaded));
        // Loaded: a second load does nothing, and marks no longer change the word.
        word.load_once(State::Plain, (10, 11), |_| unreachable!());
        word.settle(State::Stays, || (10, 11), || {}, || {});
        assert_eq!(word.load(Relaxed), State::Loaded);
    }

    #[test]
    fn a_fork_child_may_load_again_and_a_thread_state_change_stays_for_good() {
        let word = StateWord(AtomicU64::new(0));
        let mut marked = false;
        word.settle(State::PlainWithChild, || (1, 1), || marked = true, || {});
        assert!(marked);
        assert_eq!(word.load(Relaxed), State::PlainWithChild);
        word.after_fork_child();
        assert_eq!(word.load(Relaxed), State::Plain);
        word.settle(State::Stays, || (1, 1), || {}, || {});
        word.load_once(State::Plain, (1, 1), |_| unreachable!());
        assert_eq!(word.load(Relaxed), State::Stays);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicBool;
    use loom::sync::Arc;

    /// A thread about to start a child that shares its memory, and a thread of the same
    /// process loading the library: the library learns of the child, or the child's start
    /// finds the library loaded (and goes to its entry point, which notes it).
    #[test]
    fn loom_a_child_is_never_unseen_by_the_library() {
        loom::model(|| {
            let word = Arc::new(StateWord(AtomicU64::new(0)));
            let told = Arc::new(AtomicBool::new(false));
            let forker = {
                let word = Arc::clone(&word);
                loom::thread::spawn(move || {
                    word.settle(State::PlainWithChild, || (1, 2), || {}, loom::thread::yield_now);
                    word.load(Acquire) == State::Loaded
                })
            };
            let (loader_word, loader_told) = (Arc::clone(&word), Arc::clone(&told));
            let state = word.load(Relaxed);
            if matches!(state, State::Plain | State::PlainWithChild) {
                loader_word.load_once(state, (1, 1), |child_seen| {
                    loader_told.store(child_seen, Relaxed);
                    true
                });
            }
            let went_to_library = forker.join().unwrap();
            if word.load(Acquire) == State::Loaded {
                assert!(told.load(Relaxed) || went_to_library, "a child the library never heard of");
            }
        });
    }
}
