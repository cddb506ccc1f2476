//! A worker's inbox, and the park/unpark protocol of the worker that reads it: every pool's
//! worker but the SMT contexts (which share their core's queues) reads one.
//!
//! Three ways in:
//! - **Lanes**, for hops between workers: each worker owns one lane into every mailbox
//!   ([`LaneWriter`]), a single-producer ring of a few slots (Lamport's queue with sequence
//!   numbers). A slot is one line: a word holding the node's address and the send's number,
//!   and a payload of seven words (for a task, where it resumes: see `fiber`). Sending fills
//!   the payload and publishes it with a Release store of the word; taking is an Acquire load
//!   of that word, and the reader never writes the slot. No locked instruction on either side,
//!   and one line moves per hop, as in the cache-line floor. Sending can be split in two
//!   ([`Mailbox::reserve`], then [`Reservation::publication`]) for a producer that must make
//!   the publishing store itself: a task's stack switch, which may publish the task only once
//!   it has left the task's stack.
//! - **The list**, for everything else (spawns from any thread, hops whose lane is still full,
//!   a host's or a service core's orders): a Treiber stack; the reader takes it all with one
//!   `swap` and reverses it.
//! - **The door**, the park word producers ring ([`corehop_sys::park::Door`]): a plain
//!   `Parker` for task workers and component hosts; for a service core, the call slots of
//!   `corehop_sys::handoff`, whose doorbell names the calls that wait, so calls and the list
//!   wake the reader through one futex word ([`Mailbox::with_door`]).
//!
//! ```text
//!  producers                                 the one consumer (the worker)
//!  ---------                                 -----------------------------
//!  lane (its owner only): ring not full?     alternately the lanes (round robin) and the
//!    payload; word = node|n (Release) ──────┐ list: next slot's word says n? take it
//!  list (anyone): node.next = head;         │ (Acquire), taken = n, prefetch, and free
//!    CAS head -> node (Release)             │ the slot at the next pop (Release); or swap
//!  then, if the reader ever parks:          │ head -> null (Acquire), reverse to FIFO
//!  unpark: swap a token into the word;      │
//!  if the sleeper flag was set: futex wake ─┴► park: consume the token and return, or
//!                                              set the flag (CAS) and futex-sleep
//! ```
//!
//! The reader frees a slot only at its next pop (or park), so that the payload can be used
//! where it is, in the line that just arrived, instead of being copied out first. An idle
//! reader polls with [`Reader::poll`], which says where a node waits, and takes that one with
//! [`Reader::take`]: no second search between a hop's arrival and its start.
//!
//! Order: each lane and the list are FIFO; a node sent on a lane may overtake one that the
//! same producer spilled to the list, and nodes from different producers have no order.
//!
//! Why not `crossbeam_queue::SegQueue` or `ArrayQueue`: a hop must cost as few contended lines
//! and locked instructions as possible (here: one line, no lock, no allocation, the node *is*
//! the task), and the whole protocol must be small enough to model-check with loom.
//!
//! No lost wake-ups: the reader sleeps on its door, which follows `corehop_sys::park`, the one
//! park/wake protocol of corehop (argued and loom-checked there): each producer publishes its
//! node, then changes the park word by a read-modify-write (a `Parker` takes a token, call
//! slots a doorbell bit), and wakes the futex if the reader's flag was there. The models below
//! check the mailbox's use of both doors.

use std::cell::Cell;
use std::marker::PhantomData;
use std::ptr;
// A statistic, producer-private counters and the slots' payload words: outside the protocol
// (the payload travels under its slot's word, as the node does), so not modelled by loom. The
// payload must also be plain memory, which a task's stack switch writes directly.
use std::sync::atomic::{AtomicU64, AtomicUsize as StdAtomicUsize, Ordering as StdOrdering};
use std::sync::Arc;

use corehop_sys::park::{Door, Parker};
use crossbeam_utils::CachePadded;

use crate::sync::{AtomicPtr, AtomicUsize, Ordering};

/// A node type with an intrusive link, so that pushing it needs no allocation. Nodes sent on
/// lanes must be aligned to [`NODE_ALIGN`]: a slot's word keeps the send number in the low
/// bits of the node's address.
///
/// # Safety
/// `link` must return the same field of `self` every time, used by nothing but [`Mailbox`].
pub(crate) unsafe trait Linked: Sized {
    fn link(&self) -> &AtomicPtr<Self>;

    /// Where the reader will work once it has taken `node`, sent with `payload` (for a task:
    /// its stack), as addresses to prefetch.
    fn hint(node: &Self, payload: &Payload) -> Hint {
        let _ = (node, payload);
        Hint::default()
    }

    /// Starts fetching the lines the reader will touch once it takes `node`: the node itself
    /// and whatever `hint` locates. Must not dereference `node`: the point is to issue every
    /// fetch before the first one returns, and `node` may be a guess that is gone by now.
    fn prefetch(node: *const Self, hint: Hint) {
        let _ = (node, hint);
    }
}

/// A message boxed with its link, for a mailbox's list: the orders of a worker that gets few
/// and from any thread (a component host's controls, the order to stop).
#[repr(align(64))]
pub(crate) struct Letter<M> {
    link: AtomicPtr<Letter<M>>,
    pub(crate) message: M,
}

impl<M> Letter<M> {
    pub(crate) fn new(message: M) -> Box<Letter<M>> {
        Box::new(Letter { link: AtomicPtr::new(ptr::null_mut()), message })
    }
}

/// The order to stop, for a worker whose mailbox takes nothing else by letter.
pub(crate) struct Stop;

// SAFETY: always the same field, used only by the mailbox.
unsafe impl<M> Linked for Letter<M> {
    fn link(&self) -> &AtomicPtr<Self> {
        &self.link
    }
}

/// Where, besides the node, the reader will work right after taking it (for a task: its
/// stack), as addresses to prefetch. Only a hint: a wrong one costs a wasted fetch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Hint(pub(crate) [usize; 2]);

/// The words a lane slot carries besides its node.
pub(crate) const PAYLOAD_WORDS: usize = 7;
/// A slot's payload, as the reader finds it (plain words: a stack switch writes them).
pub(crate) type Payload = [StdAtomicUsize; PAYLOAD_WORDS];

/// The alignment lane nodes need: the low bits of their address carry the send number.
pub(crate) const NODE_ALIGN: usize = 64;
const SEQ_MASK: usize = NODE_ALIGN - 1;

/// Whether a slot's `word` holds send `n + 1`, the one a reader that took `n` waits for.
#[inline(always)]
fn is_send_after(word: usize, n: usize) -> bool {
    word & SEQ_MASK == (n + 1) & SEQ_MASK
}

/// Where [`Reader::mail`] found a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mail {
    /// In the next slot of this lane.
    Lane(usize),
    /// In the list.
    List,
}

/// A node taken from the mailbox, with the payload it came with if it came on a lane: still
/// in its slot, which the reader frees at its next pop.
pub(crate) struct Taken<'a, T> {
    pub(crate) node: Box<T>,
    pub(crate) payload: Option<&'a Payload>,
}

/// The right to send on lane `index` of every mailbox. One exists per lane (the runtime gives
/// worker `i` lane `i`), and it is not `Sync`, so a lane has one producer at a time: the
/// single-producer slot relies on that.
#[derive(Debug)]
pub(crate) struct LaneWriter {
    index: usize,
    _not_sync: PhantomData<Cell<()>>,
}

impl LaneWriter {
    /// The writers of lanes `0..lanes`, one each.
    ///
    /// # Safety
    /// Called once per set of mailboxes: a second writer of a lane would be a second producer
    /// of a single-producer ring.
    pub(crate) unsafe fn all(lanes: usize) -> Vec<LaneWriter> {
        (0..lanes).map(|index| LaneWriter { index, _not_sync: PhantomData }).collect()
    }
}

/// A producer's hold on its lane of one mailbox, for reserving slots there directly: a hop
/// finds it in its worker's table, two loads fewer than through the mailbox (those loads are
/// a chain on the hop's way to its first store).
pub(crate) struct LaneSender<'a, T> {
    #[cfg_attr(not(corehop_own_switch), allow(dead_code))]
    lane: &'a Lane<T>,
    _not_sync: PhantomData<Cell<()>>,
}

impl<'a, T> LaneSender<'a, T> {
    /// The next slot of the lane, or `None` while all are full (see [`Mailbox::reserve`]).
    #[cfg_attr(not(corehop_own_switch), allow(dead_code))]
    #[inline(always)]
    pub(crate) fn reserve(&self) -> Option<Reservation<'a, T>> {
        self.lane.reserve()
    }
}

/// Nodes a lane holds before its producer spills to the list (a hop leaves one in flight).
#[cfg(not(loom))]
const LANE_SLOTS: usize = 8;
/// Small under loom, so that the models reach a full ring.
#[cfg(loom)]
const LANE_SLOTS: usize = 2;

/// The reader's park word (its door), and when a producer last woke it.
struct Bell<D> {
    door: D,
    /// When the last sleeping reader was woken (`sys::now_ns`), for the wake-cost estimate.
    woken_at_ns: AtomicU64,
}

/// One entry of a lane, one line: the node and its send number in one word, and the payload.
#[repr(C, align(64))]
struct Slot<T> {
    /// The node's address, its low bits the number (1, 2, ...) of the send that filled the
    /// slot, mod 64; the reader, having taken `n` nodes from the lane, waits for `n + 1`. The
    /// producer is at most `LANE_SLOTS` sends ahead, so the number it finds there is always
    /// `n + 1 - LANE_SLOTS`, never the one awaited. Release/Acquire publishes the payload.
    word: AtomicUsize,
    payload: [StdAtomicUsize; PAYLOAD_WORDS],
    _node: PhantomData<*mut T>,
}

/// One producer's single-producer ring into a mailbox (Lamport's queue with sequence
/// numbers and a cached read index): the producer writes slots only, the reader reads slots
/// only, so a send moves one line from the reader to the producer and a take moves it back,
/// as in the floor's round trip; each side's counters live on lines of their own.
#[repr(align(128))]
struct Lane<T> {
    slots: [Slot<T>; LANE_SLOTS],
    /// Producer only: sends so far, and `freed` as it last read it.
    sent: CachePadded<(StdAtomicUsize, StdAtomicUsize)>,
    /// Reader only writes: nodes taken so far (for [`Mailbox::has_mail`]).
    taken: CachePadded<StdAtomicUsize>,
    /// Reader only writes: slots it is done with, one fewer than `taken` while it still uses
    /// the last one taken. The producer reads it when the ring is half used; a line apart from
    /// `taken`, so that those reads do not make every take wait for the line to come back.
    freed: CachePadded<AtomicUsize>,
}

impl<T> Lane<T> {
    fn new() -> Self {
        Lane {
            slots: std::array::from_fn(|_| Slot {
                word: AtomicUsize::new(0),
                payload: Default::default(),
                _node: PhantomData,
            }),
            sent: Default::default(),
            taken: CachePadded::new(StdAtomicUsize::new(0)),
            freed: CachePadded::new(AtomicUsize::new(0)),
        }
    }

    /// The next free slot, or `None` while all are full. Producer only.
    #[inline(always)]
    fn reserve(&self) -> Option<Reservation<'_, T>> {
        let (sent, freed_seen) = &*self.sent;
        let n = sent.load(StdOrdering::Relaxed);
        if n - freed_seen.load(StdOrdering::Relaxed) >= LANE_SLOTS && n - self.refresh_freed() >= LANE_SLOTS {
            return None;
        }
        Some(Reservation { lane: self, slot: &self.slots[n % LANE_SLOTS], n })
    }

    /// The producer's look at how many slots the reader has freed, kept as its copy; returns
    /// it. A read of the reader's line, so a miss.
    fn refresh_freed(&self) -> usize {
        // Acquire: the reader has finished with the slots it counts as freed.
        let freed = self.freed.load(Ordering::Acquire);
        self.sent.1.store(freed, StdOrdering::Relaxed);
        freed
    }
}

/// A free slot of a lane, reserved by the lane's producer: fill the payload, then publish.
pub(crate) struct Reservation<'a, T> {
    lane: &'a Lane<T>,
    slot: &'a Slot<T>,
    /// Sends on the lane before this one.
    n: usize,
}

impl<'a, T> Reservation<'a, T> {
    /// The payload words, for the producer to fill before publishing.
    pub(crate) fn payload(&self) -> &'a Payload {
        &self.slot.payload
    }

    /// Publishes `node` with the payload as filled.
    pub(crate) fn publish(self, node: Box<T>) {
        // SAFETY: a node of our own, published by the store right below.
        let (word, value) = unsafe { self.publication(Box::into_raw(node)) };
        // Release: the node, the payload and everything written to the node (for a task: its
        // whole suspended stack) happen-before the reader's Acquire load of the word.
        word.store(value, Ordering::Release);
    }

    /// For a producer that makes the publishing store itself: the word, and the value whose
    /// Release store into it hands `node` to the reader. Counts the send.
    ///
    /// # Safety
    /// `node` comes from `Box::into_raw`, is [`NODE_ALIGN`]-aligned and is sent nowhere else,
    /// and the caller makes that Release store before it reserves on this lane again: the
    /// count says the slot holds a node, which the reader (or the mailbox's drop) takes.
    pub(crate) unsafe fn publication(self, node: *mut T) -> (&'a AtomicUsize, usize) {
        debug_assert_eq!(node as usize & SEQ_MASK, 0, "lane nodes must be {NODE_ALIGN}-aligned");
        self.lane.sent.0.store(self.n + 1, StdOrdering::Relaxed);
        (&self.slot.word, node as usize | ((self.n + 1) & SEQ_MASK))
    }
}

/// The shared side: producers push, the owner's [`Reader`] pops.
// Each part on lines of its own (two-line padding: adjacent-line prefetch pairs them): the
// reader polls `head` while it spins, and producers notify through `bell` on every send, so
// sharing a line would make each send steal the line the reader polls.
#[repr(align(128))]
pub(crate) struct Mailbox<T: Linked, D: Door = Parker> {
    head: CachePadded<AtomicPtr<T>>,
    bell: CachePadded<Bell<D>>,
    /// Whether the reader ever parks; a reader that only polls (`Wake::Spin`) needs no
    /// notification, which saves producers a read-modify-write per push.
    reader_parks: bool,
    lanes: Box<[Lane<T>]>,
    _owns: PhantomData<Box<T>>,
}

// SAFETY: the mailbox owns the nodes in it (pushed as `Box<T>`, popped as `Box<T>`), so it may
// be shared and sent across threads exactly when `Box<T>` may be sent.
unsafe impl<T: Linked + Send, D: Door + Send> Send for Mailbox<T, D> {}
// SAFETY: as above; all shared access goes through atomics.
unsafe impl<T: Linked + Send, D: Door + Sync> Sync for Mailbox<T, D> {}

impl<T: Linked> Mailbox<T> {
    /// A new mailbox with `lanes` lanes and a plain park word, and its one reader, which calls
    /// [`Reader::park`] only if `reader_parks`. `own_lane` is the lane the reader itself sends
    /// on, if any: what comes that way is already in its cache, so it is not prefetched.
    pub(crate) fn new(reader_parks: bool, lanes: usize, own_lane: Option<usize>) -> (Arc<Self>, Reader<T>) {
        Mailbox::with_door(Parker::new(), reader_parks, lanes, own_lane)
    }
}

impl<T: Linked, D: Door> Mailbox<T, D> {
    /// [`Mailbox::new`] with `door` as the park word: a worker that also takes work through
    /// the door itself (the call slots of a service core) sleeps on one word for all of it.
    pub(crate) fn with_door(
        door: D,
        reader_parks: bool,
        lanes: usize,
        own_lane: Option<usize>,
    ) -> (Arc<Self>, Reader<T, D>) {
        const { assert!(align_of::<T>() >= NODE_ALIGN, "lane nodes must be NODE_ALIGN-aligned") };
        let mailbox = Arc::new(Mailbox {
            head: CachePadded::new(AtomicPtr::new(ptr::null_mut())),
            bell: CachePadded::new(Bell { door, woken_at_ns: AtomicU64::new(0) }),
            reader_parks,
            lanes: (0..lanes).map(|_| Lane::new()).collect(),
            _owns: PhantomData,
        });
        let reader = Reader {
            mailbox: mailbox.clone(),
            batch: ptr::null_mut(),
            taken: vec![0; lanes],
            held: None,
            own_lane,
            next_lane: 0,
            lanes_first: false,
            expected: Expected { node: ptr::null(), hint: Hint::default(), fetched: false },
        };
        (mailbox, reader)
    }

    /// Hands `node` to the reader through `writer`'s lane with `payload` (or through the list,
    /// without it, while the lane is still full), and wakes the reader if it sleeps.
    pub(crate) fn send(&self, writer: &LaneWriter, node: Box<T>, payload: [usize; PAYLOAD_WORDS]) {
        match self.reserve(writer) {
            Some(slot) => {
                for (word, value) in slot.payload().iter().zip(payload) {
                    word.store(value, StdOrdering::Relaxed);
                }
                slot.publish(node);
            }
            None => self.push_to_list(node),
        }
        self.notify();
    }

    /// The next slot of `writer`'s lane, or `None` while all are full. Publish through it,
    /// then [`Mailbox::notify`].
    pub(crate) fn reserve(&self, writer: &LaneWriter) -> Option<Reservation<'_, T>> {
        self.lanes[writer.index].reserve()
    }

    /// A second hold on `writer`'s lane of this mailbox, for code that the lane's owner runs
    /// and waits for (a task sending itself from its worker's thread while the worker is
    /// switched out).
    ///
    /// # Safety
    /// The sender must be used only while the owner of the lane uses neither its writer nor
    /// another sender of the same lane: a lane has one producer at a time.
    pub(crate) unsafe fn sender(&self, writer: &LaneWriter) -> LaneSender<'_, T> {
        LaneSender { lane: &self.lanes[writer.index], _not_sync: PhantomData }
    }

    /// Wakes the reader if it sleeps (after a publish through a [`Reservation`]).
    pub(crate) fn notify(&self) {
        if self.reader_parks {
            self.unpark();
        }
    }

    /// After a publish through a reservation of `writer`'s lane: [`Mailbox::notify`], and
    /// once half the ring is in use, refreshes the producer's copy of how far the reader got.
    /// That read misses (the reader writes the line), so it is made here, after the hop, and
    /// not by the next reservation, on a task's way out.
    pub(crate) fn sent(&self, writer: &LaneWriter) {
        self.notify();
        let lane = &self.lanes[writer.index];
        let (sent, freed_seen) = &*lane.sent;
        if sent.load(StdOrdering::Relaxed) - freed_seen.load(StdOrdering::Relaxed) >= LANE_SLOTS / 2 {
            lane.refresh_freed();
        }
    }

    /// Hands `node` to the reader (from any thread) and wakes it if it sleeps.
    pub(crate) fn push(&self, node: Box<T>) {
        self.push_to_list(node);
        self.notify();
    }

    fn push_to_list(&self, node: Box<T>) {
        let node = Box::into_raw(node);
        // Guess that the list is empty (it usually is): the CAS then takes the line in one
        // exclusive request instead of a read followed by an upgrade.
        let mut head = ptr::null_mut();
        loop {
            // SAFETY: `node` came from `Box::into_raw` above and is not shared until the CAS
            // below publishes it.
            unsafe { (*node).link().store(head, Ordering::Relaxed) };
            // Release: as in `send`.
            match self.head.compare_exchange_weak(head, node, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => break,
                Err(current) => head = current,
            }
        }
    }

    /// Makes the reader's next (or current) park return.
    pub(crate) fn unpark(&self) {
        let woken_at_ns = &self.bell.woken_at_ns;
        self.bell.door.ring_with(|| woken_at_ns.store(crate::sys::now_ns(), StdOrdering::Relaxed));
    }

    /// The park word, for what comes through the door itself (a service core's call slots).
    pub(crate) fn door(&self) -> &D {
        &self.bell.door
    }

    /// When a producer last woke the sleeping reader (`sys::now_ns`).
    pub(crate) fn woken_at_ns(&self) -> u64 {
        self.bell.woken_at_ns.load(StdOrdering::Relaxed)
    }

    /// Whether something the reader has not taken yet came from elsewhere than lane `own`
    /// (the reader's own worker: its tasks that yield), as seen from any thread: a task that
    /// hopped here from another worker, or a spawn.
    pub(crate) fn has_mail_from_others(&self, own: usize) -> bool {
        self.has_mail_besides(Some(own))
    }

    /// Whether something was sent that the reader has not taken yet, as seen from any thread.
    pub(crate) fn has_mail(&self) -> bool {
        self.has_mail_besides(None)
    }

    /// Whether the list, or any lane but `skip`, holds what the reader has not taken yet.
    fn has_mail_besides(&self, skip: Option<usize>) -> bool {
        !self.head.load(Ordering::Relaxed).is_null()
            || self.lanes.iter().enumerate().any(|(i, lane)| {
                Some(i) != skip
                    && lane.sent.0.load(StdOrdering::Relaxed) != lane.taken.load(StdOrdering::Relaxed)
            })
    }
}

impl<T: Linked, D: Door> Drop for Mailbox<T, D> {
    fn drop(&mut self) {
        let mut node = self.head.load(Ordering::Relaxed);
        while !node.is_null() {
            // SAFETY: with `&mut self` no producer is left; every node in the list came from
            // `Box::into_raw` and is owned by the list.
            let boxed = unsafe { Box::from_raw(node) };
            node = boxed.link().load(Ordering::Relaxed);
        }
        for lane in self.lanes.iter() {
            for n in lane.taken.load(StdOrdering::Relaxed)..lane.sent.0.load(StdOrdering::Relaxed) {
                let node = (lane.slots[n % LANE_SLOTS].word.load(Ordering::Relaxed) & !SEQ_MASK) as *mut T;
                // SAFETY: as above, for the nodes sent on a lane and not taken.
                drop(unsafe { Box::from_raw(node) });
            }
        }
    }
}

/// The consumer side of a [`Mailbox`]; exactly one exists per mailbox.
pub(crate) struct Reader<T: Linked, D: Door = Parker> {
    mailbox: Arc<Mailbox<T, D>>,
    /// Nodes taken from the list, oldest first; only this reader touches them.
    batch: *mut T,
    /// Per lane, the nodes taken from it (the reader's own copy of `Lane::taken`).
    taken: Vec<usize>,
    /// The lane whose last slot taken is still in use (its payload), freed at the next pop.
    held: Option<usize>,
    own_lane: Option<usize>,
    /// The lane to look at first next time (round robin, so no producer starves another).
    next_lane: usize,
    /// Whether the last pop looked at the lanes first; pops alternate, so neither way in
    /// starves the other.
    lanes_first: bool,
    /// The node last taken from another worker's lane, as a guess at the next one.
    expected: Expected<T>,
}

/// A reader's guess at the next node from another worker's lane: the last one, where it was.
/// In a round trip (a task hopping there and back, `on`) that guess is right. Prefetching it
/// from addresses the reader already holds, as its poll finds mail, lets the CPU start those
/// fetches speculatively while the slot's line is still on its way; the slot's own hint can
/// only be read once the line is here (docs/performance.md, "expected node"). A wrong guess
/// wastes a few prefetches.
struct Expected<T> {
    node: *const T,
    hint: Hint,
    /// Whether the guess has been prefetched since the last take (then a right guess is not
    /// prefetched again).
    fetched: bool,
}

impl<T> Expected<T> {
    /// Makes `node`, found at `hint`, the next guess; returns whether it still needs a
    /// prefetch (not if it was the guess, already prefetched).
    fn replace(&mut self, node: *const T, hint: Hint) -> bool {
        let fetched = self.fetched && self.node == node && self.hint == hint;
        *self = Expected { node, hint, fetched: false };
        !fetched
    }
}

// SAFETY: the reader owns the nodes in `batch` (taken out of the mailbox) and is the only
// consumer; moving it to another thread moves that ownership, which is fine for `T: Send`.
unsafe impl<T: Linked + Send, D: Door + Send + Sync> Send for Reader<T, D> {}

impl<T: Linked, D: Door> Reader<T, D> {
    pub(crate) fn mailbox(&self) -> &Mailbox<T, D> {
        &self.mailbox
    }

    /// The next node, if any: alternately from the lanes and from the list. Frees the slot
    /// of the last one (the `Taken` borrows the reader until then).
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<Taken<'_, T>> {
        self.free_held();
        self.lanes_first = !self.lanes_first;
        let node = if self.lanes_first {
            self.pop_lane().or_else(|| self.pop_list())
        } else {
            self.pop_list().or_else(|| self.pop_lane())
        }?;
        Some(self.taken(node))
    }

    /// Takes what [`Reader::mail`] (or [`Reader::poll`]) found, skipping `pop`'s search and its turns between lanes
    /// and list: for a worker that was idle, whose first mail is the one to run, with as
    /// little as possible between its arrival and its start. Frees the slot of the last one.
    #[inline(always)]
    pub(crate) fn take(&mut self, mail: Mail) -> Option<Taken<'_, T>> {
        self.free_held();
        let node = match mail {
            Mail::Lane(i) => self.take_lane(i),
            Mail::List => self.pop_list(),
        }?;
        Some(self.taken(node))
    }

    /// `node`, just taken, with its payload if it came on a lane (whose slot is held).
    #[inline(always)]
    fn taken(&self, node: Box<T>) -> Taken<'_, T> {
        let payload =
            self.held.map(|i| &self.mailbox.lanes[i].slots[(self.taken[i] - 1) % LANE_SLOTS].payload);
        Taken { node, payload }
    }

    /// Frees the slot still held, if any: its producer may fill it again.
    fn free_held(&mut self) {
        if let Some(i) = self.held.take() {
            // Release: done with the slot's payload.
            self.mailbox.lanes[i].freed.store(self.taken[i], Ordering::Release);
        }
    }

    fn pop_lane(&mut self) -> Option<Box<T>> {
        let lanes = self.mailbox.lanes.len();
        let mut i = self.next_lane;
        for _ in 0..lanes {
            if let Some(node) = self.take_lane(i) {
                return Some(node);
            }
            i = if i + 1 == lanes { 0 } else { i + 1 };
        }
        None
    }

    /// The node in lane `i`'s next slot, if it has arrived.
    #[inline(always)]
    fn take_lane(&mut self, i: usize) -> Option<Box<T>> {
        let lanes = &self.mailbox.lanes;
        let (lane, n) = (&lanes[i], self.taken[i]);
        let slot = &lane.slots[n % LANE_SLOTS];
        // Acquire: pairs with the producer's Release store of the word.
        let word = slot.word.load(Ordering::Acquire);
        if !is_send_after(word, n) {
            return None;
        }
        self.taken[i] = n + 1;
        lane.taken.store(n + 1, StdOrdering::Relaxed);
        self.held = Some(i);
        self.next_lane = if i + 1 == lanes.len() { 0 } else { i + 1 };
        // SAFETY: the word holds a node from `Box::into_raw` (`publish`, or the producer's own
        // store of a `publication`), and each send is taken once: this reader is now its only
        // owner.
        let node = unsafe { Box::from_raw((word & !SEQ_MASK) as *mut T) };
        if self.own_lane != Some(i) {
            let hint = T::hint(&node, &slot.payload);
            if self.expected.replace(&*node, hint) {
                T::prefetch(&*node, hint);
            }
        }
        Some(node)
    }

    fn pop_list(&mut self) -> Option<Box<T>> {
        if self.batch.is_null() {
            // Look before taking: an empty list costs no locked instruction.
            if self.mailbox.head.load(Ordering::Relaxed).is_null() {
                return None;
            }
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

    /// Prefetches the node the reader expects next (see [`Expected`]); call it the moment a
    /// poll finds mail, before `pop`.
    pub(crate) fn prefetch_expected(&mut self) {
        let expected = &mut self.expected;
        if !expected.node.is_null() && !expected.fetched {
            T::prefetch(expected.node, expected.hint);
            expected.fetched = true;
        }
    }

    /// Whether `pop` would return a node now.
    pub(crate) fn has_mail(&self) -> bool {
        self.mail().is_some()
    }

    /// Where a node waits now, if anywhere, for [`Reader::take`].
    #[inline(always)]
    pub(crate) fn mail(&self) -> Option<Mail> {
        if !self.batch.is_null() || !self.mailbox.head.load(Ordering::Relaxed).is_null() {
            return Some(Mail::List);
        }
        self.mailbox
            .lanes
            .iter()
            .zip(&self.taken)
            .position(|(lane, &n)| is_send_after(lane.slots[n % LANE_SLOTS].word.load(Ordering::Relaxed), n))
            .map(Mail::Lane)
    }

    /// [`Reader::mail`], with the node the reader expects prefetched the moment mail is seen
    /// (see [`Expected`]): what an idle worker polls.
    #[inline(always)]
    pub(crate) fn poll(&mut self) -> Option<Mail> {
        let mail = self.mail();
        if mail.is_some() {
            self.prefetch_expected();
        }
        mail
    }

    /// Sleeps until a push or [`Mailbox::unpark`] after the last park; returns at once if one
    /// already happened. May return spuriously: callers re-check what they wait for. Returns
    /// whether it slept.
    pub(crate) fn park(&mut self) -> bool {
        self.free_held();
        self.mailbox.bell.door.park()
    }
}

impl<T: Linked, D: Door> Drop for Reader<T, D> {
    fn drop(&mut self) {
        // Each pop frees the slot of the one before; the last, finding nothing, holds none.
        while self.pop().is_some() {}
    }
}

#[cfg(test)]
pub(crate) mod test_node {
    use super::*;

    /// A minimal node for the mailbox tests.
    #[repr(align(64))]
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
        let (mb, mut reader) = Mailbox::<Node>::new(true, 2, None);
        assert!(reader.pop().is_none());
        for v in 0..3 {
            mb.push(Node::boxed(v));
        }
        assert_eq!(reader.pop().unwrap().node.value, 0);
        mb.push(Node::boxed(3));
        let rest: Vec<_> = std::iter::from_fn(|| reader.pop().map(|t| t.node.value)).collect();
        assert_eq!(rest, [1, 2, 3]);
    }

    #[test]
    fn notification_before_park_is_not_lost() {
        let (mb, mut reader) = Mailbox::<Node>::new(true, 2, None);
        mb.unpark();
        reader.park(); // returns at once: the token was there
        mb.push(Node::boxed(1));
        reader.park();
        assert_eq!(reader.pop().unwrap().node.value, 1);
    }

    #[test]
    fn many_producers_nothing_lost_order_kept_per_producer() {
        let (mb, mut reader) = Mailbox::<Node>::new(true, 2, None);
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
                Some(t) => {
                    let (p, i) = ((t.node.value >> 16) as usize, t.node.value & 0xffff);
                    assert_eq!(i, next[p], "producer {p} out of order");
                    next[p] += 1;
                    got += 1;
                }
                None => {
                    reader.park();
                }
            }
        }
        producers.into_iter().for_each(|p| p.join().unwrap());
    }

    #[test]
    fn lane_keeps_order_and_spills_to_the_list_when_full() {
        let (mb, mut reader) = Mailbox::<Node>::new(false, 3, Some(0));
        // SAFETY: the only writers of this test's mailboxes.
        let writers = unsafe { LaneWriter::all(3) };
        for v in 0..20 {
            mb.send(&writers[2], Node::boxed(v), [0; PAYLOAD_WORDS]);
        }
        assert!(mb.has_mail() && reader.has_mail());
        let mut got: Vec<u32> = std::iter::from_fn(|| reader.pop().map(|t| t.node.value)).collect();
        // The first LANE_SLOTS went through the ring, in order; the rest spilled.
        let ring: Vec<u32> = got.iter().copied().filter(|&v| (v as usize) < LANE_SLOTS).collect();
        assert_eq!(ring, (0..LANE_SLOTS as u32).collect::<Vec<_>>());
        got.sort_unstable();
        assert_eq!(got, (0..20).collect::<Vec<_>>());
        assert!(!mb.has_mail() && !reader.has_mail());
        // The ring is free again: the next sends go through it.
        mb.send(&writers[2], Node::boxed(7), [0; PAYLOAD_WORDS]);
        assert_eq!(reader.pop().unwrap().node.value, 7);
    }

    #[test]
    fn mail_from_others_is_what_did_not_come_on_the_readers_own_lane() {
        let (mb, mut reader) = Mailbox::<Node>::new(false, 2, Some(0));
        // SAFETY: the only writers of this test's mailboxes.
        let writers = unsafe { LaneWriter::all(2) };
        mb.send(&writers[0], Node::boxed(1), [0; PAYLOAD_WORDS]);
        assert!(mb.has_mail() && !mb.has_mail_from_others(0), "its own tasks, yielding");
        mb.send(&writers[1], Node::boxed(2), [0; PAYLOAD_WORDS]);
        assert!(mb.has_mail_from_others(0), "a task that hopped here");
        while reader.pop().is_some() {}
        assert!(!mb.has_mail_from_others(0));
        mb.push(Node::boxed(3));
        assert!(mb.has_mail_from_others(0), "a spawn");
    }

    #[test]
    fn lanes_and_list_alternate_so_neither_starves() {
        let (mb, mut reader) = Mailbox::<Node>::new(false, 2, None);
        // SAFETY: the only writers of this test's mailboxes.
        let writers = unsafe { LaneWriter::all(2) };
        for v in 0..4 {
            mb.push(Node::boxed(100 + v));
            mb.send(&writers[v as usize % 2], Node::boxed(v), [0; PAYLOAD_WORDS]);
        }
        let got: Vec<u32> = std::iter::from_fn(|| reader.pop().map(|t| t.node.value)).take(4).collect();
        assert_eq!(got.iter().filter(|&&v| v >= 100).count(), 2, "{got:?}");
    }

    #[test]
    fn take_takes_what_mail_found_and_nothing_else() {
        let (mb, mut reader) = Mailbox::<Node>::new(false, 3, Some(0));
        // SAFETY: the only writers of this test's mailboxes.
        let writers = unsafe { LaneWriter::all(3) };
        assert_eq!(reader.mail(), None);
        mb.send(&writers[2], Node::boxed(1), [7; PAYLOAD_WORDS]);
        assert_eq!(reader.mail(), Some(Mail::Lane(2)));
        assert!(reader.take(Mail::Lane(1)).is_none(), "a lane with nothing in it gives nothing");
        let taken = reader.take(Mail::Lane(2)).unwrap();
        assert_eq!(taken.node.value, 1);
        assert!(taken.payload.unwrap().iter().all(|w| w.load(StdOrdering::Relaxed) == 7));
        mb.push(Node::boxed(2));
        assert_eq!(reader.mail(), Some(Mail::List), "the list is looked at first");
        assert_eq!(reader.take(Mail::List).unwrap().node.value, 2);
        assert_eq!(reader.mail(), None);
        // Each take frees the slot of the one before, as `pop` does: the ring goes round.
        for v in 0..3 * LANE_SLOTS as u32 {
            mb.send(&writers[1], Node::boxed(v), [0; PAYLOAD_WORDS]);
            let mail = reader.mail().unwrap();
            assert_eq!(reader.take(mail).unwrap().node.value, v);
        }
        assert!(reader.pop().is_none());
    }

    /// A node that records the prefetches made for it; its hint is the payload's first words.
    #[repr(align(64))]
    struct Probe {
        link: AtomicPtr<Probe>,
    }

    thread_local! {
        static PREFETCHED: std::cell::RefCell<Vec<(usize, Hint)>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    // SAFETY: always the same field, used only by the mailbox.
    unsafe impl Linked for Probe {
        fn link(&self) -> &AtomicPtr<Self> {
            &self.link
        }

        fn hint(_: &Self, payload: &Payload) -> Hint {
            Hint([payload[0].load(StdOrdering::Relaxed), payload[1].load(StdOrdering::Relaxed)])
        }

        fn prefetch(node: *const Self, hint: Hint) {
            PREFETCHED.with(|p| p.borrow_mut().push((node as usize, hint)));
        }
    }

    fn payload(hint: Hint) -> [usize; PAYLOAD_WORDS] {
        let mut payload = [0; PAYLOAD_WORDS];
        payload[..2].copy_from_slice(&hint.0);
        payload
    }

    fn prefetched() -> Vec<(usize, Hint)> {
        PREFETCHED.with(|p| std::mem::take(&mut *p.borrow_mut()))
    }

    #[test]
    fn the_node_that_comes_back_is_prefetched_once_and_a_stranger_as_it_is_taken() {
        let (mb, mut reader) = Mailbox::<Probe>::new(false, 2, Some(0));
        // SAFETY: the only writers of this test's mailboxes.
        let writers = unsafe { LaneWriter::all(2) };
        let hint = Hint([0x1000, 0x2000]);
        reader.prefetch_expected();
        assert!(prefetched().is_empty(), "nothing taken yet, so nothing expected");

        let node = Box::new(Probe { link: AtomicPtr::new(ptr::null_mut()) });
        let addr = &*node as *const Probe as usize;
        mb.send(&writers[1], node, payload(hint));
        let node = reader.pop().unwrap().node;
        assert_eq!(prefetched(), [(addr, hint)], "taken from another worker: prefetched from the slot");

        // The same node comes back to the same place (a round trip): prefetched as the poll
        // finds it, once, and not again as it is taken.
        mb.send(&writers[1], node, payload(hint));
        reader.prefetch_expected();
        reader.prefetch_expected();
        assert_eq!(prefetched(), [(addr, hint)]);
        let node = reader.pop().unwrap().node;
        assert!(prefetched().is_empty());

        // The guess is wrong (the node moved on): the one taken is still prefetched from the slot.
        let moved = Hint([0x1040, 0x2000]);
        mb.send(&writers[1], node, payload(moved));
        reader.prefetch_expected();
        assert_eq!(prefetched(), [(addr, hint)]);
        let node = reader.pop().unwrap().node;
        assert_eq!(prefetched(), [(addr, moved)]);

        // What comes on the reader's own lane is in its cache already: neither prefetched nor
        // a guess.
        mb.send(&writers[0], node, payload(Hint([0x3000, 0x4000])));
        drop(reader.pop().unwrap());
        assert!(prefetched().is_empty());
        // The guess outlives the node it names: prefetching it is harmless, and nothing else
        // changes.
        reader.prefetch_expected();
        assert_eq!(prefetched(), [(addr, moved)]);
        assert!(reader.pop().is_none());
    }

    #[test]
    fn a_lane_carries_each_payload_with_its_node_and_the_list_none() {
        let (mb, mut reader) = Mailbox::<Node>::new(false, 2, None);
        // SAFETY: the only writers of this test's mailboxes.
        let writers = unsafe { LaneWriter::all(2) };
        let words = |payload: &Payload| payload.each_ref().map(|w| w.load(StdOrdering::Relaxed));
        for round in 0..3 * LANE_SLOTS as u32 {
            let payload: [usize; PAYLOAD_WORDS] = std::array::from_fn(|w| (round as usize) << 8 | w);
            mb.send(&writers[1], Node::boxed(round), payload);
            let taken = reader.pop().unwrap();
            assert_eq!((taken.node.value, taken.payload.map(words)), (round, Some(payload)));
        }
        mb.push(Node::boxed(99));
        let taken = reader.pop().unwrap();
        assert_eq!((taken.node.value, taken.payload.map(words)), (99, None));
    }

    #[test]
    fn a_reservation_is_published_by_the_producers_own_store() {
        let (mb, mut reader) = Mailbox::<Node>::new(false, 2, None);
        // SAFETY: the only writers of this test's mailboxes.
        let writers = unsafe { LaneWriter::all(2) };
        for v in 0..2 * LANE_SLOTS as u32 {
            let slot = mb.reserve(&writers[0]).expect("the reader keeps up, so a slot is free");
            slot.payload()[6].store(v as usize + 1, StdOrdering::Relaxed);
            // SAFETY: a fresh node, published by the store right below.
            let (word, value) = unsafe { slot.publication(Box::into_raw(Node::boxed(v))) };
            assert!(!reader.has_mail(), "nothing arrives before the store");
            // What the fiber switch does in assembly, once off the task's stack.
            word.store(value, Ordering::Release);
            let taken = reader.pop().unwrap();
            assert_eq!(
                (taken.node.value, taken.payload.unwrap()[6].load(StdOrdering::Relaxed)),
                (v, v as usize + 1)
            );
        }
        // A full ring reserves nothing until the reader is done with a slot: at its next pop,
        // since it uses a payload where it is.
        assert!(reader.pop().is_none(), "all taken; this frees the last slot");
        for v in 0..LANE_SLOTS as u32 {
            mb.send(&writers[0], Node::boxed(v), [0; PAYLOAD_WORDS]);
        }
        assert!(mb.reserve(&writers[0]).is_none());
        // The reader uses a payload where it is: its slot is free only at the next pop.
        assert_eq!(reader.pop().unwrap().node.value, 0);
        assert!(mb.reserve(&writers[0]).is_none());
        assert!(mb.has_mail(), "seven still wait");
        assert_eq!(reader.pop().unwrap().node.value, 1);
        assert!(mb.reserve(&writers[0]).is_some());
    }

    #[test]
    fn dropping_frees_queued_nodes() {
        let (mb, reader) = Mailbox::<Node>::new(true, 2, None);
        mb.push(Node::boxed(1));
        mb.push(Node::boxed(2));
        drop(reader);
        // Sent after the reader is gone: the mailbox itself frees it.
        // SAFETY: the only writers of this test's mailbox.
        mb.send(&unsafe { LaneWriter::all(2) }[1], Node::boxed(3), [0; PAYLOAD_WORDS]);
        drop(mb);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::test_node::Node;
    use super::*;

    /// Two producers hand one node each to a consumer that parks whenever its inbox is empty:
    /// every interleaving delivers both (a lost wake-up would leave the consumer asleep, which
    /// loom reports as a deadlock). Preemptions are bounded to two (`model_bounded`).
    #[test]
    fn loom_handoff_two_producers_no_lost_wakeup() {
        crate::sync::model_bounded(2, || {
            let (mb, mut reader) = Mailbox::<Node>::new(true, 2, None);
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
                    Some(t) => {
                        sum += t.node.value;
                        got += 1;
                    }
                    None => {
                        reader.park();
                    }
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
            let (mb, mut reader) = Mailbox::<Node>::new(true, 2, None);
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
                    Some(t) => seen.push(t.node.value),
                    None => {
                        reader.park();
                    }
                }
            }
            assert_eq!(seen, [1, 2]);
            producer.join().unwrap();
        });
    }

    /// A lane producer sends three nodes through a two-lane mailbox while a list producer
    /// pushes one, and the consumer parks whenever it sees nothing: all four arrive (none lost
    /// to a reused slot, no lost wake-up), and the lane's three in order even when the ring
    /// fills and the rest spill to the list.
    #[test]
    fn loom_lane_and_list_no_lost_node_or_wakeup() {
        crate::sync::model_bounded(2, || {
            let (mb, mut reader) = Mailbox::<Node>::new(true, 2, None);
            // SAFETY: the only writers of this model's mailbox.
            let writer = unsafe { LaneWriter::all(2) }.pop().unwrap();
            let lane_producer = {
                let mb = mb.clone();
                loom::thread::spawn(move || {
                    for v in 1..=3 {
                        mb.send(&writer, Node::boxed(v), [0; PAYLOAD_WORDS]);
                    }
                })
            };
            let list_producer = {
                let mb = mb.clone();
                loom::thread::spawn(move || mb.push(Node::boxed(10)))
            };
            let mut seen = Vec::new();
            while seen.len() < 4 {
                match reader.pop() {
                    Some(t) => seen.push(t.node.value),
                    None => {
                        reader.park();
                    }
                }
            }
            let at = |v| seen.iter().position(|&s| s == v).unwrap();
            assert_eq!(seen.iter().sum::<u32>(), 16);
            // 1 and 2 always fit the ring; 3 may spill to the list and overtake them.
            assert!(at(1) < at(2), "lane order broken: {seen:?}");
            lane_producer.join().unwrap();
            list_producer.join().unwrap();
        });
    }

    /// A producer that publishes with its own store (as a task's stack switch does) after
    /// filling the payload: the consumer, parking when it sees nothing, gets every node with
    /// its payload, and the producer reuses slots only once the consumer is done with them
    /// (it frees a slot at its next pop; with two slots the third send waits or spills).
    #[test]
    fn loom_publication_by_the_producers_store_carries_the_payload() {
        loom::model(|| {
            let (mb, mut reader) = Mailbox::<Node>::new(true, 2, None);
            // SAFETY: the only writers of this model's mailbox.
            let writer = unsafe { LaneWriter::all(2) }.pop().unwrap();
            let producer = {
                let mb = mb.clone();
                loom::thread::spawn(move || {
                    for v in 1..=3u32 {
                        match mb.reserve(&writer) {
                            Some(slot) => {
                                slot.payload()[0].store(v as usize * 10, StdOrdering::Relaxed);
                                // SAFETY: a fresh node, published by the store right below.
                                let (word, value) =
                                    unsafe { slot.publication(Box::into_raw(Node::boxed(v))) };
                                word.store(value, Ordering::Release);
                            }
                            None => mb.push(Node::boxed(v)),
                        }
                        mb.notify();
                    }
                })
            };
            let mut seen = Vec::new();
            while seen.len() < 3 {
                match reader.pop() {
                    Some(t) => {
                        if let Some(payload) = t.payload {
                            assert_eq!(payload[0].load(StdOrdering::Relaxed), t.node.value as usize * 10);
                        }
                        seen.push(t.node.value);
                    }
                    None => {
                        reader.park();
                    }
                }
            }
            seen.sort_unstable();
            assert_eq!(seen, [1, 2, 3]);
            producer.join().unwrap();
        });
    }

    /// A mailbox whose door is a service core's call slots: a caller's call through the door
    /// and a node pushed to the list (the order to stop) race a reader that serves the calls,
    /// takes the node and parks whenever it sees neither. The call is answered and the node
    /// taken in every interleaving: the ring of the push and the caller's doorbell share one
    /// futex word, so neither wake-up is lost.
    #[test]
    fn loom_a_door_of_call_slots_wakes_the_reader_for_calls_and_list() {
        use corehop_sys::handoff::{Lane as Calls, Outcome, Waiting};
        crate::sync::model_bounded(2, || {
            let (mb, mut reader) = Mailbox::<Node, Calls<u64, u64>>::with_door(Calls::new(), true, 0, None);
            let caller = {
                let mb = mb.clone();
                loom::thread::spawn(move || {
                    let patient = Waiting { spin_ns: 0, stall_timeout_ns: u64::MAX };
                    assert_eq!(mb.door().call(7, 0, patient), Outcome::Done(8));
                })
            };
            let pusher = {
                let mb = mb.clone();
                loom::thread::spawn(move || mb.push(Node::boxed(1)))
            };
            let (mut answered, mut taken) = (0, 0);
            while answered < 1 || taken < 1 {
                let door = reader.mailbox().door();
                if door.has_work() {
                    answered += door.serve(|_| {}, |_, request| request + 1);
                } else if let Some(t) = reader.pop() {
                    taken += t.node.value;
                } else {
                    reader.park();
                }
            }
            caller.join().unwrap();
            pusher.join().unwrap();
        });
    }

    /// A bare unpark (the shutdown signal) wakes a consumer that parks concurrently.
    #[test]
    fn loom_unpark_wakes_parked_consumer() {
        loom::model(|| {
            let (mb, mut reader) = Mailbox::<Node>::new(true, 2, None);
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
