//! A worker's inbox: a lock-free multi-producer, single-consumer queue of owned nodes, and the
//! park/unpark protocol of the worker that reads it.
//!
//! ```text
//!  producers (any thread)                    the one consumer (the worker)
//!  ----------------------                    -----------------------------
//!  node.next = head; CAS head -> node  ──┐   swap head -> null (Acquire), reverse the
//!  (Release)                             │   batch into FIFO order, pop from the batch
//!  swap state -> NOTIFIED (AcqRel)       │
//!  if it was PARKED: futex wake    ──────┴─► park: NOTIFIED -> EMPTY returns at once;
//!                                            EMPTY -> PARKED, futex-sleep while PARKED
//! ```
//!
//! Why not `crossbeam_queue::SegQueue`: a hop pushes one node and the consumer takes
//! everything in one `swap`, so a Treiber push plus batch reversal costs one contended cache line
//! per hop and no allocation (the node *is* the task), and it is small enough to model-check
//! with loom, which crossbeam's internals are not.
//!
//! No lost wake-ups: every access to `state` is a read-modify-write, so all of them are totally
//! ordered. If a producer's `swap(NOTIFIED)` comes first, the consumer's next park sees
//! `NOTIFIED` (and, by acquiring it, the pushed node) and does not sleep. If the consumer's
//! `EMPTY -> PARKED` comes first, the producer's swap returns `PARKED` and it wakes the
//! futex, whose kernel-side check (`state == PARKED`) fails once the swap has landed.
//! A stale `NOTIFIED` (the push was already consumed) only costs one extra empty check.

use std::marker::PhantomData;
use std::ptr;
// A statistic outside the protocol, so not modelled by loom.
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::sync::{AtomicPtr, Futex, Ordering};

const EMPTY: u32 = 0;
const PARKED: u32 = 1;
const NOTIFIED: u32 = 2;

/// A node type with an intrusive link, so that pushing it needs no allocation.
///
/// # Safety
/// `link` must return the same field of `self` every time, used by nothing but [`Mailbox`].
pub(crate) unsafe trait Linked: Sized {
    fn link(&self) -> &AtomicPtr<Self>;
}

/// The shared side: producers push, the owner's [`Reader`] pops.
// Aligned to two cache lines (adjacent-line prefetch pairs them) so that producers writing
// `head` and `state` touch one line that no other mailbox shares.
#[repr(align(128))]
pub(crate) struct Mailbox<T: Linked> {
    head: AtomicPtr<T>,
    parker: Futex,
    /// Whether the reader ever parks; a reader that only polls (`Wake::Spin`) needs no
    /// notification, which saves producers a read-modify-write per push.
    reader_parks: bool,
    /// When the last sleeping consumer was woken (`sys::now_ns`), for the wake-cost estimate.
    pub(crate) woken_at_ns: AtomicU64,
    _owns: PhantomData<Box<T>>,
}

// SAFETY: the mailbox owns the nodes in it (pushed as `Box<T>`, popped as `Box<T>`), so it may
// be shared and sent across threads exactly when `Box<T>` may be sent.
unsafe impl<T: Linked + Send> Send for Mailbox<T> {}
// SAFETY: as above; all shared access goes through atomics.
unsafe impl<T: Linked + Send> Sync for Mailbox<T> {}

impl<T: Linked> Mailbox<T> {
    /// A new mailbox and its one reader, which calls [`Reader::park`] only if `reader_parks`.
    pub(crate) fn new(reader_parks: bool) -> (Arc<Self>, Reader<T>) {
        let mailbox = Arc::new(Mailbox {
            head: AtomicPtr::new(ptr::null_mut()),
            parker: Futex::new(EMPTY),
            reader_parks,
            woken_at_ns: AtomicU64::new(0),
            _owns: PhantomData,
        });
        let reader = Reader { mailbox: mailbox.clone(), batch: ptr::null_mut() };
        (mailbox, reader)
    }

    /// Hands `node` to the reader and wakes it if it sleeps.
    pub(crate) fn push(&self, node: Box<T>) {
        let node = Box::into_raw(node);
        // Guess that the inbox is empty (it usually is when a task hops): the CAS then takes
        // the line in one exclusive request instead of a read followed by an upgrade.
        let mut head = ptr::null_mut();
        loop {
            // SAFETY: `node` came from `Box::into_raw` above and is not shared until the CAS
            // below publishes it.
            unsafe { (*node).link().store(head, Ordering::Relaxed) };
            // Release: everything written to the node (for a task: its whole suspended
            // stack) happens-before the reader's Acquire swap that takes it.
            match self.head.compare_exchange_weak(head, node, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => break,
                Err(current) => head = current,
            }
        }
        if self.reader_parks {
            self.unpark();
        }
    }

    /// Makes the reader's next (or current) park return.
    pub(crate) fn unpark(&self) {
        if self.parker.word.swap(NOTIFIED, Ordering::AcqRel) == PARKED {
            self.woken_at_ns.store(crate::sys::now_ns(), std::sync::atomic::Ordering::Relaxed);
            self.parker.wake_one();
        }
    }

    /// Whether something was pushed that the reader has not taken yet (a hint for spinning).
    pub(crate) fn has_mail(&self) -> bool {
        !self.head.load(Ordering::Relaxed).is_null()
    }
}

impl<T: Linked> Drop for Mailbox<T> {
    fn drop(&mut self) {
        let mut node = self.head.load(Ordering::Relaxed);
        while !node.is_null() {
            // SAFETY: with `&mut self` no producer is left; every node in the list came from
            // `Box::into_raw` and is owned by the list.
            let boxed = unsafe { Box::from_raw(node) };
            node = boxed.link().load(Ordering::Relaxed);
        }
    }
}

/// The consumer side of a [`Mailbox`]; exactly one exists per mailbox.
pub(crate) struct Reader<T: Linked> {
    mailbox: Arc<Mailbox<T>>,
    /// Nodes taken from `head`, oldest first; only this reader touches them.
    batch: *mut T,
}

// SAFETY: the reader owns the nodes in `batch` (taken out of the mailbox) and is the only
// consumer; moving it to another thread moves that ownership, which is fine for `T: Send`.
unsafe impl<T: Linked + Send> Send for Reader<T> {}

impl<T: Linked> Reader<T> {
    pub(crate) fn mailbox(&self) -> &Mailbox<T> {
        &self.mailbox
    }

    /// The oldest node not yet taken, if any.
    pub(crate) fn pop(&mut self) -> Option<Box<T>> {
        if self.batch.is_null() {
            // Acquire: pairs with the producers' Release CAS.
            let mut node = self.mailbox.head.swap(ptr::null_mut(), Ordering::Acquire);
            // The stack hands out newest first; reverse into FIFO order.
            let mut fifo = ptr::null_mut();
            while !node.is_null() {
                // SAFETY: nodes taken by the swap are owned by this reader alone.
                let next = unsafe { (*node).link().load(Ordering::Relaxed) };
                // SAFETY: as above.
                unsafe { (*node).link().store(fifo, Ordering::Relaxed) };
                fifo = node;
                node = next;
            }
            self.batch = fifo;
        }
        if self.batch.is_null() {
            return None;
        }
        let node = self.batch;
        // SAFETY: `node` is the first of this reader's batch and came from `Box::into_raw`.
        let node = unsafe { Box::from_raw(node) };
        self.batch = node.link().load(Ordering::Relaxed);
        Some(node)
    }

    /// Whether `pop` would return a node now.
    pub(crate) fn has_mail(&self) -> bool {
        !self.batch.is_null() || self.mailbox.has_mail()
    }

    /// Sleeps until a push or [`Mailbox::unpark`] after the last park; returns at once if one
    /// already happened. May return spuriously: callers re-check what they wait for.
    pub(crate) fn park(&mut self) {
        let state = &self.mailbox.parker.word;
        if state.compare_exchange(NOTIFIED, EMPTY, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            return;
        }
        if state.compare_exchange(EMPTY, PARKED, Ordering::AcqRel, Ordering::Acquire).is_err() {
            // A notification arrived in between: consume it (acquiring the push) and return.
            state.swap(EMPTY, Ordering::AcqRel);
            return;
        }
        loop {
            self.mailbox.parker.wait(PARKED);
            if state.compare_exchange(NOTIFIED, EMPTY, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                return;
            }
        }
    }
}

impl<T: Linked> Drop for Reader<T> {
    fn drop(&mut self) {
        while self.pop().is_some() {}
    }
}

#[cfg(test)]
pub(crate) mod test_node {
    use super::*;

    /// A minimal node for the mailbox tests.
    pub(crate) struct Node {
        pub(crate) value: u32,
        link: AtomicPtr<Node>,
    }

    impl Node {
        pub(crate) fn boxed(value: u32) -> Box<Node> {
            Box::new(Node { value, link: AtomicPtr::new(ptr::null_mut()) })
        }
    }

    // SAFETY: always the same field, used only by the mailbox.
    unsafe impl Linked for Node {
        fn link(&self) -> &AtomicPtr<Self> {
            &self.link
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::test_node::Node;
    use super::*;

    #[test]
    fn fifo_within_and_across_batches() {
        let (mb, mut reader) = Mailbox::<Node>::new(true);
        assert!(reader.pop().is_none());
        for v in 0..3 {
            mb.push(Node::boxed(v));
        }
        assert_eq!(reader.pop().unwrap().value, 0);
        mb.push(Node::boxed(3));
        let rest: Vec<_> = std::iter::from_fn(|| reader.pop().map(|n| n.value)).collect();
        assert_eq!(rest, [1, 2, 3]);
    }

    #[test]
    fn notification_before_park_is_not_lost() {
        let (mb, mut reader) = Mailbox::<Node>::new(true);
        mb.unpark();
        reader.park(); // returns at once: the token was there
        mb.push(Node::boxed(1));
        reader.park();
        assert_eq!(reader.pop().unwrap().value, 1);
    }

    #[test]
    fn many_producers_nothing_lost_order_kept_per_producer() {
        let (mb, mut reader) = Mailbox::<Node>::new(true);
        let producers: Vec<_> = (0..4u32)
            .map(|p| {
                let mb = mb.clone();
                std::thread::spawn(move || (0..2000u32).for_each(|i| mb.push(Node::boxed(p << 16 | i))))
            })
            .collect();
        let mut next = [0u32; 4];
        let mut got = 0;
        while got < 8000 {
            match reader.pop() {
                Some(n) => {
                    let (p, i) = ((n.value >> 16) as usize, n.value & 0xffff);
                    assert_eq!(i, next[p], "producer {p} out of order");
                    next[p] += 1;
                    got += 1;
                }
                None => reader.park(),
            }
        }
        producers.into_iter().for_each(|p| p.join().unwrap());
    }

    #[test]
    fn dropping_frees_queued_nodes() {
        let (mb, reader) = Mailbox::<Node>::new(true);
        mb.push(Node::boxed(1));
        mb.push(Node::boxed(2));
        drop(reader);
        drop(mb);
    }
}

#[cfg(loom)]
mod loom_tests {
    use super::test_node::Node;
    use super::*;

    /// Two producers hand one node each to a consumer that parks whenever its inbox is empty:
    /// every interleaving delivers both (a lost wake-up would leave the consumer asleep, which
    /// loom reports as a deadlock). Three threads with a futex model explode the state space,
    /// so preemptions are bounded to two, as tokio does for its larger models.
    #[test]
    fn loom_handoff_two_producers_no_lost_wakeup() {
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(2);
        model.check(|| {
            let (mb, mut reader) = Mailbox::<Node>::new(true);
            let producers: Vec<_> = (1..=2)
                .map(|v| {
                    let mb = mb.clone();
                    loom::thread::spawn(move || mb.push(Node::boxed(v)))
                })
                .collect();
            let mut sum = 0;
            let mut got = 0;
            while got < 2 {
                match reader.pop() {
                    Some(n) => {
                        sum += n.value;
                        got += 1;
                    }
                    None => reader.park(),
                }
            }
            assert_eq!(sum, 3);
            producers.into_iter().for_each(|p| p.join().unwrap());
        });
    }

    /// One producer pushes two nodes; the consumer sees them in order, parking in between.
    #[test]
    fn loom_handoff_fifo_with_park() {
        loom::model(|| {
            let (mb, mut reader) = Mailbox::<Node>::new(true);
            let producer = {
                let mb = mb.clone();
                loom::thread::spawn(move || {
                    mb.push(Node::boxed(1));
                    mb.push(Node::boxed(2));
                })
            };
            let mut seen = Vec::new();
            while seen.len() < 2 {
                match reader.pop() {
                    Some(n) => seen.push(n.value),
                    None => reader.park(),
                }
            }
            assert_eq!(seen, [1, 2]);
            producer.join().unwrap();
        });
    }

    /// A bare unpark (the shutdown signal) wakes a consumer that parks concurrently.
    #[test]
    fn loom_unpark_wakes_parked_consumer() {
        loom::model(|| {
            let (mb, mut reader) = Mailbox::<Node>::new(true);
            let flag = Arc::new(loom::sync::atomic::AtomicBool::new(false));
            let waker = {
                let (mb, flag) = (mb.clone(), flag.clone());
                loom::thread::spawn(move || {
                    flag.store(true, Ordering::Release);
                    mb.unpark();
                })
            };
            while !flag.load(Ordering::Acquire) {
                reader.park();
            }
            waker.join().unwrap();
        });
    }
}
