//! One component as its host runs it: the service object, its channels, its staged outputs,
//! the message to re-deliver after a crash, and its counters.
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use corehop_policy::components::ComponentId;
use crossbeam_utils::CachePadded;

use super::channel::Chan;
use super::{Component, Outbox};

/// Counters of one component, written by whichever host runs it (one at a time: the hand-over
/// of a moved component orders the writes) and read by samplers.
#[derive(Default)]
pub(crate) struct ComponentStats {
    pub busy_ns: AtomicU64,
    pub handled: AtomicU64,
    pub produced: AtomicU64,
    pub crashes: AtomicU64,
    pub poisoned: AtomicU64,
    pub dead: AtomicBool,
}

/// What the host needs from a component, whatever its message types.
pub(crate) trait Runnable: Send {
    fn id(&self) -> ComponentId;
    /// Handles up to `budget` messages (or one poll of a source); returns how many messages it
    /// handled or produced.
    fn run(&mut self, budget: usize) -> usize;
    /// Whether [`Runnable::run`] would find something to do now. With `sleeping_host`, the
    /// host is about to park: a component blocked on a full output registers that host to be
    /// woken when room appears, then looks again; one with an input lets the next message
    /// ring the host again, then looks at it.
    fn has_work(&self, sleeping_host: Option<usize>) -> bool;
    /// The component now runs on host `host` (or on none while it is handed over).
    fn attach(&self, host: Option<usize>);
    /// Charges `ns` of work (duty-cycle stall included) to the component.
    fn add_busy(&self, ns: u64);
}

pub(crate) struct Slot<C: Component> {
    pub id: ComponentId,
    pub factory: Box<dyn FnMut() -> C + Send>,
    pub comp: Option<C>,
    pub input: Option<Arc<Chan<C::In>>>,
    pub output: Option<Arc<Chan<C::Out>>>,
    pub outbox: Outbox<C::Out>,
    /// The message whose handling panicked, delivered once more to the restarted component.
    pub redeliver: Option<C::In>,
    /// A source whose `poll` said it has nothing more to produce.
    pub exhausted: bool,
    pub stats: Arc<CachePadded<ComponentStats>>,
}

impl<C: Component> Slot<C> {
    fn room(&self) -> usize {
        self.output.as_ref().map_or(usize::MAX, |o| o.capacity() - o.len())
    }

    /// Moves staged outputs into the output channel; false while some stay behind (blocked).
    fn flush(&mut self) -> bool {
        match &self.output {
            Some(out) => out.push_from(&mut self.outbox.staged),
            None => {
                // A sink: what it stages goes nowhere.
                self.outbox.staged.clear();
                true
            }
        }
    }

    /// A panic unwound out of the component: throw away what it staged for the failed message
    /// (from `mark` on) and start a fresh instance. If the factory itself panics, the
    /// component is dead and stops.
    fn restart(&mut self, mark: usize) {
        self.outbox.staged.truncate(mark);
        self.stats.crashes.fetch_add(1, Ordering::Relaxed);
        self.exhausted = false;
        self.comp = None;
        match catch_unwind(AssertUnwindSafe(&mut self.factory)) {
            Ok(fresh) => self.comp = Some(fresh),
            Err(_) => self.stats.dead.store(true, Ordering::Relaxed),
        }
    }
}

/// A blocked producer hears of room every this many messages taken, not only at the end of a
/// batch: it waits for a ring instead of polling the queue (see the host's idle loop), and a
/// whole batch outlasted its spin, so it slept and each wake-up cost the consumer a futex call.
/// Rings more often cost the consumer more than they saved (docs/performance.md).
const ROOM_EVERY: usize = 32;

impl<C: Component> Runnable for Slot<C> {
    fn id(&self) -> ComponentId {
        self.id
    }

    fn run(&mut self, budget: usize) -> usize {
        if self.comp.is_none() || !self.flush() {
            return 0;
        }
        let room = self.room();
        if room == 0 {
            return 0;
        }
        // A backlog (left by a move, or a burst) would otherwise stand for good: each stage
        // handles per turn what the one before it feeds in, so every message waits a whole
        // queue long, and what it points to has left the cache before it is read. Twice the
        // batch while more than a batch waits drains it and still bounds a turn.
        let budget = match &self.input {
            Some(input) if input.len() > budget => budget.saturating_mul(2),
            _ => budget,
        };
        let mut did = 0;
        let mut pops = 0usize;
        while did < budget && self.outbox.staged.len() < room {
            let Some(comp) = self.comp.as_mut() else { break };
            let (msg, redelivery) = match self.redeliver.take() {
                Some(m) => (m, true),
                None => match self.input.as_ref().and_then(|i| i.pop()) {
                    Some(m) => {
                        pops += 1;
                        if pops.is_multiple_of(ROOM_EVERY) {
                            if let Some(i) = &self.input {
                                i.after_pop();
                            }
                        }
                        (m, false)
                    }
                    None => {
                        // No input: a source produces spontaneously.
                        if self.input.is_none() && !self.exhausted {
                            let mark = self.outbox.staged.len();
                            self.outbox.room = room;
                            match catch_unwind(AssertUnwindSafe(|| comp.poll(&mut self.outbox))) {
                                Ok(true) => {
                                    let n = self.outbox.staged.len() - mark;
                                    self.stats.produced.fetch_add(n as u64, Ordering::Relaxed);
                                    did += n;
                                }
                                Ok(false) => self.exhausted = true,
                                Err(_) => self.restart(mark),
                            }
                        }
                        break;
                    }
                },
            };
            let copy = msg.clone();
            let mark = self.outbox.staged.len();
            self.outbox.room = room;
            did += 1;
            match catch_unwind(AssertUnwindSafe(|| comp.handle(msg, &mut self.outbox))) {
                Ok(()) => {
                    self.stats.handled.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {
                    self.restart(mark);
                    if redelivery {
                        // It crashed a fresh instance too: a poison message, dropped and counted.
                        self.stats.poisoned.fetch_add(1, Ordering::Relaxed);
                    } else {
                        self.redeliver = Some(copy);
                    }
                }
            }
        }
        if pops > 0 {
            if let Some(i) = &self.input {
                i.after_pop();
            }
        }
        self.flush();
        did
    }

    fn has_work(&self, sleeping_host: Option<usize>) -> bool {
        if self.comp.is_none() {
            return false;
        }
        // Nothing moves while the output is full. Registered only here, right before the host
        // parks: a registration made earlier may be spent on room this host has since filled
        // again (its token then only costs the host one more look).
        if let Some(out) = &self.output {
            if out.is_full() {
                match sleeping_host {
                    Some(h) if out.wait_for_room(h) => {}
                    _ => return false,
                }
            }
        }
        if !self.outbox.staged.is_empty() || self.redeliver.is_some() {
            return true;
        }
        match (&self.input, sleeping_host) {
            (Some(i), Some(_)) => i.rearm_and_has_messages(),
            (Some(i), None) => !i.is_empty(),
            (None, _) => !self.exhausted,
        }
    }

    fn attach(&self, host: Option<usize>) {
        if let Some(i) = &self.input {
            i.set_consumer(host);
        }
    }

    fn add_busy(&self, ns: u64) {
        self.stats.busy_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::super::channel::Signals;
    use super::*;

    struct Sink;

    impl Component for Sink {
        type In = u32;
        type Out = ();
        fn handle(&mut self, _: u32, _: &mut Outbox<()>) {}
    }

    fn sink_with(waiting: u32) -> Slot<Sink> {
        let input = Chan::new(256, Signals::new(1));
        assert!(input.push_from(&mut (0..waiting).collect::<VecDeque<u32>>()));
        Slot {
            id: ComponentId(0),
            factory: Box::new(|| Sink),
            comp: Some(Sink),
            input: Some(input),
            output: None,
            outbox: Outbox::default(),
            redeliver: None,
            exhausted: false,
            stats: Arc::default(),
        }
    }

    #[test]
    fn a_backlog_drains_a_batch_per_turn_faster_than_it_is_fed() {
        let mut slot = sink_with(200);
        assert_eq!(slot.run(32), 64, "more than a batch waits: twice the batch");
        assert_eq!(slot.run(32), 64);
        let mut slot = sink_with(20);
        assert_eq!(slot.run(32), 20, "a batch or less: all of it");
        let mut slot = sink_with(33);
        assert_eq!(slot.run(32), 33);
    }
}
