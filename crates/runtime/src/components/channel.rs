//! Bounded channels between components, in shared memory, and the doorbells that wake a parked
//! host.
//!
//! The queue is crossbeam's `ArrayQueue` for both kinds. It is multi-producer multi-consumer, so
//! an SPSC channel pays one compare-and-swap per operation more than a hand-written SPSC ring
//! would (a few ns next to the tens to hundreds of ns a component spends on a message), and in
//! return needs no unsafe code here. The kinds differ in who may hold a sender: an
//! [`Spsc`] sender cannot be cloned, an [`Mpsc`] one can. Every channel has one receiver.
//!
//! # Wake-up protocol (no lost wake-ups)
//!
//! Each host (one pinned thread per CPU, see the module above) has a futex word, `AWAKE` or
//! `PARKED`. A channel knows, as a bit mask of host indexes, which host consumes it (`rx`) and
//! which hosts have a producer blocked on it being full (`tx_waiters`).
//!
//! ```text
//!   sender                               host about to sleep
//!   push(msg)                            word = PARKED
//!   fence(SeqCst)                        fence(SeqCst)
//!   for h in rx: if word[h] == PARKED    if any input non-empty (or control): word = AWAKE
//!       word[h] = AWAKE; futex_wake      else futex_wait(word, PARKED)
//! ```
//!
//! Either the sender's load sees `PARKED` (and wakes the host; a host not yet in `futex_wait`
//! returns at once because the word is no longer `PARKED`), or the host's check sees the
//! message: the two `SeqCst` fences order one before the other. A host that adopts a moved
//! component sets its bit in `rx` before it next checks for work, so a sender that still read
//! the old mask has its message seen by that check.
//!
//! Room works the other way round. A consumer, after popping, takes (swaps to zero) the
//! `tx_waiters` mask and wakes those hosts. A host registers there only inside its final
//! check, after its word says `PARKED`: register, fence, look at the queue again. Registering
//! any earlier is a lost wake-up waiting to happen: a consumer may spend the registration on
//! room it made *before* the registration, which the host has since filled again, and the
//! host would then sleep on a full queue with nobody left to wake it.
//!
//! Both directions are model-checked with loom (`loom_doorbells_lose_no_wakeup`): the
//! atomics, fences and futex here come from `crate::sync`, loom's under `--cfg loom`.
use std::marker::PhantomData;
// Statistics, outside the protocol.
use std::sync::atomic::AtomicU64 as StatU64;
use std::sync::Arc;

use crossbeam_queue::ArrayQueue;
use crossbeam_utils::CachePadded;

use crate::sync::{fence, AtomicU64, Doorbell, Ordering};
use crate::sys;

/// The doorbell of one host plus what its wake-ups cost.
pub(crate) struct HostSignal {
    bell: CachePadded<Doorbell>,
    /// `now_ns` when the last futex wake was issued, to measure wake-up latency.
    notified_at: StatU64,
    /// Futex wakes issued to this host.
    wakes: StatU64,
}

impl HostSignal {
    fn new() -> HostSignal {
        HostSignal {
            bell: CachePadded::new(Doorbell::new()),
            notified_at: StatU64::new(0),
            wakes: StatU64::new(0),
        }
    }

    /// Wakes the host if it is parked (or about to park). Callers issue `fence(SeqCst)` after
    /// publishing what the host should see and before calling this.
    pub(crate) fn notify(&self) {
        self.bell.ring(|| {
            self.notified_at.store(sys::now_ns(), std::sync::atomic::Ordering::Relaxed);
            self.wakes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        });
    }

    /// First half of parking: announce it. The caller must then re-check for work and call
    /// [`HostSignal::cancel_park`] or [`HostSignal::park`].
    pub(crate) fn prepare_park(&self) {
        self.bell.prepare_park();
    }

    pub(crate) fn cancel_park(&self) {
        self.bell.cancel_park();
    }

    /// Sleeps until notified (returns at once if already notified). Returns the `now_ns` at
    /// which the notifier issued its wake, if it did.
    pub(crate) fn park(&self) -> Option<u64> {
        self.bell.park();
        let at = self.notified_at.swap(0, std::sync::atomic::Ordering::Relaxed);
        (at != 0).then_some(at)
    }

    pub(crate) fn wakes(&self) -> u64 {
        self.wakes.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The signals of every host of one pipeline, indexed by host (= dense CPU id).
pub(crate) struct Signals(Box<[HostSignal]>);

impl Signals {
    pub(crate) fn new(hosts: usize) -> Arc<Signals> {
        Arc::new(Signals((0..hosts).map(|_| HostSignal::new()).collect()))
    }

    pub(crate) fn host(&self, index: usize) -> &HostSignal {
        &self.0[index]
    }

    /// Notifies every host whose bit is set in `mask`.
    fn ring(&self, mut mask: u64) {
        while mask != 0 {
            let h = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            if let Some(signal) = self.0.get(h) {
                signal.notify();
            }
        }
    }
}

/// Marker: a channel with exactly one sender (not `Clone`).
pub struct Spsc;
/// Marker: a channel whose sender may be cloned for several producers.
pub struct Mpsc;

/// The shared state of one channel.
pub(crate) struct Chan<M> {
    queue: ArrayQueue<M>,
    signals: Arc<Signals>,
    rx: CachePadded<AtomicU64>,
    tx_waiters: CachePadded<AtomicU64>,
}

impl<M> Chan<M> {
    pub(crate) fn new(capacity: usize, signals: Arc<Signals>) -> Arc<Chan<M>> {
        Arc::new(Chan {
            queue: ArrayQueue::new(capacity),
            signals,
            rx: CachePadded::new(AtomicU64::new(0)),
            tx_waiters: CachePadded::new(AtomicU64::new(0)),
        })
    }

    pub(crate) fn signals(&self) -> &Arc<Signals> {
        &self.signals
    }

    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    pub(crate) fn capacity(&self) -> usize {
        self.queue.capacity()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub(crate) fn is_full(&self) -> bool {
        self.queue.is_full()
    }

    /// The consumer's host is now `host` (or none). Followed, on the host, by its next check
    /// for work, which is preceded by the fence of `prepare_park` or finds the work directly.
    pub(crate) fn set_consumer(&self, host: Option<usize>) {
        let mask = host.map_or(0, |h| 1u64 << h);
        self.rx.store(mask, Ordering::SeqCst);
    }

    /// Registers host `host` (already marked as about to park) to be woken when room appears,
    /// then looks again: true if there is room after all.
    pub(crate) fn wait_for_room(&self, host: usize) -> bool {
        self.tx_waiters.fetch_or(1u64 << host, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        !self.queue.is_full()
    }

    pub(crate) fn pop(&self) -> Option<M> {
        self.queue.pop()
    }

    /// Tells blocked producers there is room again; call after popping (once per batch).
    pub(crate) fn after_pop(&self) {
        fence(Ordering::SeqCst);
        if self.tx_waiters.load(Ordering::Relaxed) != 0 {
            let waiters = self.tx_waiters.swap(0, Ordering::AcqRel);
            self.signals.ring(waiters);
        }
    }

    /// Pushes from the front of `staged` until the queue is full; wakes the consumer once if
    /// anything went in. Returns whether `staged` is now empty.
    pub(crate) fn push_from(&self, staged: &mut std::collections::VecDeque<M>) -> bool {
        let mut pushed = false;
        while let Some(m) = staged.pop_front() {
            match self.queue.push(m) {
                Ok(()) => pushed = true,
                Err(m) => {
                    staged.push_front(m);
                    break;
                }
            }
        }
        if pushed {
            fence(Ordering::SeqCst);
            self.signals.ring(self.rx.load(Ordering::Relaxed));
        }
        staged.is_empty()
    }
}

/// `len`, `is_empty` and `capacity`: what either end can ask of the channel.
macro_rules! channel_state {
    () => {
        /// Messages waiting in the channel.
        pub fn len(&self) -> usize {
            self.chan.len()
        }

        /// Whether no message is waiting in the channel.
        pub fn is_empty(&self) -> bool {
            self.chan.is_empty()
        }

        /// How many messages the channel holds at most.
        pub fn capacity(&self) -> usize {
            self.chan.capacity()
        }
    };
}

/// The sending end of a channel. Give it to a component (its output) or send from any thread.
pub struct Sender<M, K = Spsc> {
    pub(crate) chan: Arc<Chan<M>>,
    kind: PhantomData<K>,
}

impl<M, K> Sender<M, K> {
    pub(crate) fn new(chan: Arc<Chan<M>>) -> Self {
        Sender { chan, kind: PhantomData }
    }

    /// Sends `msg` unless the channel is full, in which case it is handed back.
    pub fn try_send(&self, msg: M) -> Result<(), M> {
        self.chan.queue.push(msg)?;
        fence(Ordering::SeqCst);
        self.chan.signals.ring(self.chan.rx.load(Ordering::Relaxed));
        Ok(())
    }

    channel_state!();
}

impl<M> Clone for Sender<M, Mpsc> {
    fn clone(&self) -> Self {
        Sender::new(self.chan.clone())
    }
}

/// The receiving end of a channel. Give it to a component (its input) or receive from any
/// thread with [`Receiver::try_recv`].
pub struct Receiver<M> {
    pub(crate) chan: Arc<Chan<M>>,
}

impl<M> Receiver<M> {
    /// The oldest message, if any; wakes producers blocked on a full channel.
    pub fn try_recv(&self) -> Option<M> {
        let m = self.chan.pop()?;
        self.chan.after_pop();
        Some(m)
    }

    channel_state!();
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;

    /// Host 0 consumes a channel of capacity 1 and parks whenever it finds nothing; host 1
    /// sends two messages and parks while the channel is full, each side following the
    /// host's park sequence (announce, look again, sleep). Every interleaving delivers both
    /// messages in order and leaves nobody asleep: loom reports a lost wake-up as a deadlock.
    /// (The queue is crossbeam's, not loom-aware: loom checks the doorbells around it.)
    #[test]
    fn loom_doorbells_lose_no_wakeup() {
        crate::sync::model_bounded(2, || {
            let signals = Signals::new(2);
            let chan = Chan::<u32>::new(1, signals.clone());
            chan.set_consumer(Some(0));
            let producer = {
                let tx = Sender::<u32, Spsc>::new(chan.clone());
                loom::thread::spawn(move || {
                    for mut msg in 1..=2 {
                        while let Err(back) = tx.try_send(msg) {
                            msg = back;
                            let me = tx.chan.signals().host(1);
                            me.prepare_park();
                            if tx.chan.wait_for_room(1) {
                                me.cancel_park();
                            } else {
                                me.park();
                            }
                        }
                    }
                })
            };
            let rx = Receiver { chan: chan.clone() };
            let me = signals.host(0);
            let mut got = Vec::new();
            while got.len() < 2 {
                if let Some(m) = rx.try_recv() {
                    got.push(m);
                    continue;
                }
                me.prepare_park();
                if chan.is_empty() {
                    me.park();
                } else {
                    me.cancel_park();
                }
            }
            assert_eq!(got, [1, 2]);
            producer.join().unwrap();
        });
    }
}
