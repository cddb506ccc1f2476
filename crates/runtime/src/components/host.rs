//! The host: one thread pinned to one CPU that runs the service loops of every component placed
//! there, throttles them to the CPU's emulated speed, and idles by polling, parking or both.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

use corehop_policy::components::{ComponentId, Idle};
use corehop_policy::spin::{SpinBudget, SpinConfig};
use crossbeam_utils::CachePadded;

use super::channel::{set_waker_speed, Signals};
use super::slot::Runnable;
use crate::mailbox::{Letter, Mailbox, Reader};
use crate::sys;
use crate::worker::Started;

/// A request to a host, handled at the top of its loop: between two batches, never while a
/// component is inside its handler (the quiesce point of a move).
pub(crate) enum Control {
    /// Run this component from now on; acknowledge on `done`.
    Adopt {
        slot: Box<dyn Runnable>,
        done: mpsc::Sender<()>,
    },
    /// Hand component `id` over to host `to`, which acknowledges on `done`.
    Evict {
        id: ComponentId,
        to: usize,
        done: mpsc::Sender<()>,
    },
    Stop,
}

/// The reading end of a host's mailbox, which its thread owns.
pub(crate) type Inbox = Reader<Letter<Control>>;

/// Counters of one host (written by its thread, read by samplers).
#[derive(Default)]
pub(crate) struct HostStats {
    pub busy_ns: AtomicU64,
    pub spin_ns: AtomicU64,
    pub parked_ns: AtomicU64,
    pub parks: AtomicU64,
}

pub(crate) struct HostShared {
    /// Where controls arrive. The host parks on its signal, not on the mailbox's own word
    /// (its inputs ring that one too), so the mailbox does not wake it: [`Shared::send`] does.
    mailbox: Arc<Mailbox<Letter<Control>>>,
    /// The emulated speed factor, as `f64` bits.
    pub speed_bits: AtomicU64,
    pub stats: HostStats,
}

/// What every host and the pipeline handle share.
pub(crate) struct Shared {
    pub hosts: Box<[CachePadded<HostShared>]>,
    pub signals: Arc<Signals>,
}

impl Shared {
    /// The hosts' shared state, and each host's inbox (in host order) for its thread.
    pub(crate) fn new(speeds: &[f64], signals: Arc<Signals>) -> (Arc<Shared>, Vec<Inbox>) {
        let (hosts, inboxes): (Vec<_>, Vec<_>) = speeds
            .iter()
            .map(|s| {
                let (mailbox, inbox) = Mailbox::new(false, 0, None);
                let host = CachePadded::new(HostShared {
                    mailbox,
                    speed_bits: AtomicU64::new(s.to_bits()),
                    stats: HostStats::default(),
                });
                (host, inbox)
            })
            .unzip();
        (Arc::new(Shared { hosts: hosts.into(), signals }), inboxes)
    }

    /// Queues `control` for host `host` and wakes it.
    pub(crate) fn send(&self, host: usize, control: Control) {
        let node = Letter::new(control);
        self.hosts[host].mailbox.push(node);
        self.signals.host(host).notify();
    }
}

/// Extra time a CPU running at `speed` (0 < speed <= 1) of full speed spends on work that took
/// `work_ns` at full speed: the cycles a throttled core throws away, `w · (1/s − 1)`.
pub(crate) fn stall_ns(work_ns: u64, speed: f64) -> u64 {
    if speed >= 1.0 || speed <= 0.0 {
        return 0;
    }
    (work_ns as f64 * (1.0 / speed - 1.0)).round() as u64
}

/// Spins until `deadline_ns`, until control mail comes or until the host's speed changes
/// from `speed_bits`, and returns when it stopped: at a very low speed the stall after a batch
/// lasts seconds, and a stop or a new speed must not wait for it.
fn stall_until(deadline_ns: u64, inbox: &Inbox, speed: &AtomicU64, speed_bits: u64) -> u64 {
    loop {
        for _ in 0..64 {
            sys::cpu_relax();
        }
        let now = sys::now_ns();
        if now >= deadline_ns || inbox.has_mail() || speed.load(Ordering::Relaxed) != speed_bits {
            return now;
        }
    }
}

pub(crate) struct HostConfig {
    pub index: usize,
    pub idle: Idle,
    pub spin: SpinConfig,
    pub batch: usize,
}

/// The host thread's body (on its pinned worker): attaches its components, reports that it
/// started, then serves until `Stop`.
pub(crate) fn run(
    cfg: HostConfig,
    shared: Arc<Shared>,
    mut inbox: Inbox,
    mut slots: Vec<Box<dyn Runnable>>,
    started: Started,
) {
    for slot in &slots {
        slot.attach(Some(cfg.index));
    }
    started.report();
    let me = &shared.hosts[cfg.index];
    let signal = shared.signals.host(cfg.index);
    let mut budget = SpinBudget::new(cfg.spin);
    let mut waker_speed = 1.0;
    loop {
        if inbox.has_mail() && !handle_controls(&cfg, &shared, &mut inbox, &mut slots) {
            return;
        }
        let speed_bits = me.speed_bits.load(Ordering::Relaxed);
        let speed = f64::from_bits(speed_bits);
        if speed != waker_speed {
            waker_speed = speed;
            set_waker_speed(speed);
        }
        let mut did = 0;
        for slot in slots.iter_mut() {
            let t0 = sys::now_ns();
            let n = slot.run(cfg.batch);
            if n > 0 {
                let t1 = sys::now_ns();
                let work = t1.saturating_sub(t0);
                let stall = match stall_ns(work, speed) {
                    0 => 0,
                    stall => stall_until(t1.saturating_add(stall), &inbox, &me.speed_bits, speed_bits)
                        .saturating_sub(t1),
                };
                slot.add_busy(work + stall);
                me.stats.busy_ns.fetch_add(work + stall, Ordering::Relaxed);
                did += n;
            }
        }
        if did > 0 {
            continue;
        }

        // Idle. The last look comes first: it registers this host with its inputs and blocked
        // outputs, whose next message or room then leaves a token in its park word. The host
        // spins on that word, a line only its wakers write, and not on the channels: a look at
        // a queue's indices pulls the line from the CPU working on it, and a saturated consumer
        // paid a transfer per message to a producer polling it for room (docs/performance.md,
        // twenty-fifth session). A host with nothing placed on it always sleeps.
        let idle_start = sys::now_ns();
        // A token from a ring while the host was busy would end the spin at once, for nothing.
        signal.forget();
        if inbox.has_mail() || slots.iter().any(|s| s.has_work(Some(cfg.index))) {
            continue;
        }
        let spin_for = match (cfg.idle, slots.is_empty()) {
            (_, true) | (Idle::Park, _) => Some(0),
            (Idle::Poll, false) => None,
            (Idle::PollThenPark, false) => Some(budget.budget_ns()),
        };
        let mut now = idle_start;
        'spin: loop {
            for _ in 0..16 {
                if signal.has_token() {
                    break 'spin;
                }
                sys::cpu_relax();
            }
            now = sys::now_ns();
            if spin_for.is_some_and(|b| now >= idle_start + b) {
                break;
            }
        }
        me.stats.spin_ns.fetch_add(now.saturating_sub(idle_start), Ordering::Relaxed);
        // Returns at once, consuming the token, if one came while spinning.
        let slept = sys::now_ns();
        let mut work_came = slept;
        if let Some(woken) = signal.park() {
            let woke = sys::now_ns();
            work_came = woke;
            me.stats.parks.fetch_add(1, Ordering::Relaxed);
            me.stats.parked_ns.fetch_add(woke.saturating_sub(slept), Ordering::Relaxed);
            if let Some(w) = woken.filter(|w| w.at >= slept) {
                // A sleep costs this host its wake-up and the waker its futex call (on a slowed
                // CPU, slowed too): the waker is often the stage the pipeline waits for, so the
                // spin is weighed against both.
                budget.observe_wake_cost(woke.saturating_sub(w.at) + w.waker_ns);
                // The gap ended when the waker rang, not when this host was back: counting the
                // wake-up in it made every gap after a sleep look too long to spin for, so a
                // host that slept once went on sleeping.
                work_came = w.at;
            }
        }
        budget.observe_idle_gap(work_came.saturating_sub(idle_start));
    }
}

/// Takes the queued controls; false when the host must stop.
fn handle_controls(
    cfg: &HostConfig,
    shared: &Shared,
    inbox: &mut Inbox,
    slots: &mut Vec<Box<dyn Runnable>>,
) -> bool {
    while let Some(node) = inbox.pop().map(|taken| taken.node) {
        match node.message {
            Control::Adopt { slot, done } => {
                slot.attach(Some(cfg.index));
                // In the pipeline's order, however the components got here: a layout then runs
                // the same whichever moves led to it (a stage after its consumer left frames
                // waiting in every queue after a move there and back).
                let at = slots.partition_point(|s| s.id() < slot.id());
                slots.insert(at, slot);
                let _ = done.send(());
            }
            Control::Evict { id, to, done } => {
                // Dropping `done` unanswered tells the mover the component was not here.
                if let Some(pos) = slots.iter().position(|s| s.id() == id) {
                    let slot = slots.remove(pos);
                    slot.attach(None);
                    shared.send(to, Control::Adopt { slot, done });
                }
            }
            Control::Stop => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::components::channel::Signals;

    /// A component that only has an id.
    struct Named(ComponentId);

    impl Runnable for Named {
        fn id(&self) -> ComponentId {
            self.0
        }
        fn run(&mut self, _: usize) -> usize {
            0
        }
        fn has_work(&self, _: Option<usize>) -> bool {
            false
        }
        fn attach(&self, _: Option<usize>) {}
        fn add_busy(&self, _: u64) {}
    }

    #[test]
    fn a_host_runs_its_components_in_pipeline_order_whatever_moved_in_when() {
        let (shared, mut inboxes) = Shared::new(&[1.0, 1.0], Signals::new(2));
        let cfg = |index| HostConfig { index, idle: Idle::Park, spin: SpinConfig::default(), batch: 1 };
        let named = |i| Box::new(Named(ComponentId(i))) as Box<dyn Runnable>;
        let mut slots = vec![named(0), named(3)];
        for i in [2, 1] {
            let (done, _) = mpsc::channel();
            shared.send(0, Control::Adopt { slot: named(i), done });
        }
        assert!(handle_controls(&cfg(0), &shared, &mut inboxes[0], &mut slots));
        let ids: Vec<usize> = slots.iter().map(|s| s.id().0).collect();
        assert_eq!(ids, [0, 1, 2, 3]);
    }

    #[test]
    fn a_slow_core_stalls_in_proportion() {
        assert_eq!(stall_ns(1000, 1.0), 0);
        assert_eq!(stall_ns(1000, 0.5), 1000);
        assert_eq!(stall_ns(1000, 0.25), 3000);
        assert_eq!(stall_ns(800, 0.125), 5600);
        assert_eq!(stall_ns(1000, 0.0), 0, "no speed is no emulation, not infinite stall");
    }
}
