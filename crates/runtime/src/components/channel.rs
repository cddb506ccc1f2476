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
//! Each host (one pinned thread per CPU, see the module above) sleeps on its own
//! `corehop_sys::park::Parker`, corehop's one park/wake protocol (argued and loom-checked
//! there): whoever gives a host something to do publishes it, then leaves a token in the
//! host's park word; a host that found nothing parks, which consumes a token (and it looks
//! again) or sleeps until one comes.
//!
//! A channel's `rx` word names the host that consumes it and carries a `RUNG` bit: set, it
//! says the consumer has been rung for this channel and will look at it before it parks.
//! Senders set it by an RMW, and only the one that finds it clear rings; so while the
//! consumer is busy a send costs one RMW of a line the sender usually holds, and the
//! consumer's park word is left alone. The consumer clears `RUNG` by an RMW in its last look
//! before it parks, then looks at the queue.
//!
//! ```text
//!   sender                                 host with nothing to do (its last look)
//!   push(msg)                              per input: rx &= !RUNG (RMW), then is it empty?
//!   old = rx |= RUNG (RMW)                 per blocked output: tx_waiters |= me (RMW), then
//!   RUNG was clear: unpark(host in old)      is there room?
//!                                          park (a token: return and look again)
//!   consumer: pop; w = swap(tx_waiters, 0); for h in w: unpark(h)
//! ```
//!
//! No fence orders two different atomics: each decision rests on an RMW of the one word both
//! sides change, so of two RMWs of it the later reads the earlier (and what was published
//! before it). A send's RMW either finds `RUNG` clear and rings the host it reads, or comes
//! before the consumer's next clearing RMW, whose look then sees the message. A move changes
//! `rx` by a swap that sets `RUNG` (the new host looks at the channel first anyway): a sender
//! before it is seen by the new host's look, one after it reads the new host. Room works the
//! same way on `tx_waiters`. A ring that finds the host busy leaves a token: one extra look.
//!
//! Both directions and a move are model-checked with loom (`loom_tests`): the atomics here
//! come from `crate::sync` and the park word from `corehop_sys`, loom's under `--cfg loom`.
use std::marker::PhantomData;
// Statistics, outside the protocol.
use std::sync::atomic::AtomicU64 as StatU64;
use std::sync::Arc;

use corehop_sys::park::Parker;
use crossbeam_queue::ArrayQueue;
use crossbeam_utils::CachePadded;

use crate::sync::{AtomicU64, Ordering};
use crate::sys;

/// In a channel's `rx`: its consumer has been rung for it since the consumer last looked.
const RUNG: u64 = 1 << 63;

/// The park word of one host plus what its wake-ups cost.
pub(crate) struct HostSignal {
    bell: CachePadded<Parker>,
    /// `now_ns` when the last futex wake was issued, to measure wake-up latency.
    notified_at: StatU64,
    /// What the last futex wake cost the thread that issued it, ns of its CPU at full speed.
    waker_ns: StatU64,
    /// Futex wakes issued to this host.
    wakes: StatU64,
}

/// How a sleeping host was woken.
pub(crate) struct Woken {
    /// `now_ns` when the waker issued the wake.
    pub at: u64,
    /// What a wake cost its waker lately (the last one measured), ns.
    pub waker_ns: u64,
}

thread_local! {
    /// The emulated speed of the host on this thread (1.0 on any other thread): a futex wake
    /// it issues takes its CPU the call's time over this.
    static WAKER_SPEED: std::cell::Cell<f64> = const { std::cell::Cell::new(1.0) };
}

/// Tells wakes issued from this thread that it runs at `speed` (a host, at each change).
pub(crate) fn set_waker_speed(speed: f64) {
    WAKER_SPEED.with(|s| s.set(speed.clamp(f64::MIN_POSITIVE, 1.0)));
}

impl HostSignal {
    fn new() -> HostSignal {
        HostSignal {
            bell: CachePadded::new(Parker::new()),
            notified_at: StatU64::new(0),
            waker_ns: StatU64::new(0),
            wakes: StatU64::new(0),
        }
    }

    /// Makes the host's current or next park return; call after publishing what it should see.
    pub(crate) fn notify(&self) {
        let mut issued = 0;
        let woke = self.bell.unpark_with(|| {
            issued = sys::now_ns();
            self.notified_at.store(issued, std::sync::atomic::Ordering::Relaxed);
            self.wakes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        });
        if woke {
            let spent = sys::now_ns().saturating_sub(issued) as f64 / WAKER_SPEED.with(|s| s.get());
            self.waker_ns.store(spent as u64, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Sleeps until notified (returns at once if notified since the last park); the host looks
    /// for work again either way. Returns `None` if it did not sleep, else how it was woken, if
    /// by a notification.
    pub(crate) fn park(&self) -> Option<Option<Woken>> {
        if !self.bell.park() {
            return None;
        }
        let at = self.notified_at.swap(0, std::sync::atomic::Ordering::Relaxed);
        let waker_ns = self.waker_ns.load(std::sync::atomic::Ordering::Relaxed);
        Some((at != 0).then_some(Woken { at, waker_ns }))
    }

    /// Whether a notification came since the last park or [`HostSignal::forget`] (a load of
    /// the park word only).
    pub(crate) fn has_token(&self) -> bool {
        self.bell.has_token()
    }

    /// Drops a notification that came while the host was busy; call before its last look. A
    /// load first: the idle loop calls this every time, and mostly there is nothing to drop.
    pub(crate) fn forget(&self) {
        if self.bell.has_token() {
            self.bell.take_token();
        }
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
    /// The consumer's host index plus one (0: none), and `RUNG`.
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

    /// The consumer's host is now `host` (or none). A swap that sets `RUNG`, so that a
    /// sender's RMW of `rx` either reads it or is seen by it, and the new host looks at the
    /// channel before it parks (module docs).
    pub(crate) fn set_consumer(&self, host: Option<usize>) {
        self.rx.swap(host.map_or(0, |h| h as u64 + 1) | RUNG, Ordering::AcqRel);
    }

    /// After a push: rings the consumer's host unless it has been rung for this channel since
    /// its last look (module docs).
    fn notify_consumer(&self) {
        // Release: the message; Acquire: the host index the consumer's side wrote.
        let old = self.rx.fetch_or(RUNG, Ordering::AcqRel);
        if old & RUNG == 0 {
            if let Some(signal) = (old as usize).checked_sub(1).and_then(|h| self.signals.0.get(h)) {
                signal.notify();
            }
        }
    }

    /// The consumer's last look before it parks: lets the next send ring it again, then says
    /// whether a message waits (module docs).
    pub(crate) fn rearm_and_has_messages(&self) -> bool {
        // Acquire: every message whose send set RUNG before this.
        self.rx.fetch_and(!RUNG, Ordering::AcqRel);
        !self.queue.is_empty()
    }

    /// Registers host `host`, which found nothing else to do, to be woken when room appears,
    /// then looks again: true if there is room after all.
    pub(crate) fn wait_for_room(&self, host: usize) -> bool {
        // AcqRel: reads the consumer's last swap, so the room it made is seen below.
        self.tx_waiters.fetch_or(1u64 << host, Ordering::AcqRel);
        !self.queue.is_full()
    }

    pub(crate) fn pop(&self) -> Option<M> {
        self.queue.pop()
    }

    /// Tells blocked producers there is room again; call after popping (once per batch). A
    /// swap even when nobody waits: a load could miss a registration made meanwhile (module
    /// docs), and the line is usually the consumer's own.
    pub(crate) fn after_pop(&self) {
        let waiters = self.tx_waiters.swap(0, Ordering::AcqRel);
        if waiters != 0 {
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
            self.notify_consumer();
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
        self.chan.notify_consumer();
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

    /// `n` messages received on `host`, which idles whenever the channel is empty.
    fn receive(chan: &Arc<Chan<u32>>, host: usize, n: usize) -> Vec<u32> {
        let rx = Receiver { chan: chan.clone() };
        let mut got = Vec::new();
        while got.len() < n {
            match rx.try_recv() {
                Some(m) => got.push(m),
                None => idle(chan, host, false),
            }
        }
        got
    }

    /// A thread on host 1 that sends `msgs`, parking while the channel is full.
    fn send_from_host_1(chan: &Arc<Chan<u32>>, msgs: &[u32]) -> loom::thread::JoinHandle<()> {
        let (tx, msgs) = (Sender::<u32, Spsc>::new(chan.clone()), msgs.to_vec());
        loom::thread::spawn(move || {
            for mut msg in msgs {
                while let Err(back) = tx.try_send(msg) {
                    msg = back;
                    idle(&tx.chan, 1, true);
                }
            }
        })
    }

    /// Two hosts and a channel of capacity 1 that host 0 consumes.
    fn channel() -> Arc<Chan<u32>> {
        let chan = Chan::<u32>::new(1, Signals::new(2));
        chan.set_consumer(Some(0));
        chan
    }

    /// A host's turn with nothing to do, as `host::run` takes it: the last look (registering
    /// for room if `blocked`), then a park.
    fn idle(chan: &Chan<u32>, host: usize, blocked: bool) {
        let ready = if blocked { chan.wait_for_room(host) } else { chan.rearm_and_has_messages() };
        if !ready {
            chan.signals().host(host).park();
        }
    }

    /// Host 0 consumes a channel of capacity 1 and parks whenever it finds nothing; host 1
    /// sends two messages and parks while the channel is full. Every interleaving delivers
    /// both messages in order and leaves nobody asleep: loom reports a lost wake-up as a
    /// deadlock. (The queue is crossbeam's, not loom-aware: loom checks the wake-ups around
    /// it.)
    #[test]
    fn loom_doorbells_lose_no_wakeup() {
        crate::sync::model_bounded(2, || {
            let chan = channel();
            let producer = send_from_host_1(&chan, &[1, 2]);
            assert_eq!(receive(&chan, 0, 2), [1, 2]);
            producer.join().unwrap();
        });
    }

    /// The channel's consumer moves from host 0 to host 1 (as an eviction and an adoption do)
    /// while a message is sent: host 1, which parks whenever it finds nothing, gets it.
    #[test]
    fn loom_a_message_sent_during_a_move_reaches_the_new_host() {
        crate::sync::model_bounded(3, || {
            let chan = channel();
            let producer = send_from_host_1(&chan, &[7]);
            chan.set_consumer(None);
            let new_host = {
                let chan = chan.clone();
                loom::thread::spawn(move || {
                    chan.set_consumer(Some(1));
                    receive(&chan, 1, 1)
                })
            };
            assert_eq!(new_host.join().unwrap(), [7]);
            producer.join().unwrap();
        });
    }
}
