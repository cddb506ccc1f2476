//! Components: messages survive moves and crashes in order; backpressure and parking never
//! lose a wake-up; bad input is a typed error.
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use corehop_policy::components::Action;
use corehop_runtime::components::{Component, ComponentError, ComponentId, Idle, Outbox, Pipeline};
use corehop_runtime::sys;
use corehop_topology::{CpuId, Machine, OsCpu};
use proptest::prelude::*;

/// This process's CPUs (at most 4) as a machine.
fn machine() -> Machine {
    let os_ids: Vec<OsCpu> = sys::affinity().unwrap().into_iter().take(4).collect();
    Machine::uniform("host", &os_ids, 1)
}

/// Injected panics are expected here: keep them off the test output.
fn quiet_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let injected = info.payload().downcast_ref::<String>().is_some_and(|s| s.starts_with("injected"));
            if !injected {
                default(info);
            }
        }));
    });
}

/// Which (stage, seq) deliveries panic; each panics on its first delivery only, unless poison.
#[derive(Default)]
struct Crashes {
    once: Mutex<HashSet<(usize, u64)>>,
    poison: HashSet<(usize, u64)>,
}

impl Crashes {
    fn maybe_panic(&self, stage: usize, seq: u64) {
        if self.poison.contains(&(stage, seq)) || self.once.lock().unwrap().remove(&(stage, seq)) {
            panic!("injected crash in stage {stage} at {seq}");
        }
    }
}

/// Emits 0..total; its position lives outside (like a NIC ring's head register), so a
/// restarted source resumes where it was.
struct Source {
    next: Arc<AtomicU64>,
    total: u64,
    /// Produce only below this (a test holds the source here, then raises it to `total`).
    allowed: Arc<AtomicU64>,
    crashes: Arc<Crashes>,
}

impl Component for Source {
    type In = ();
    type Out = u64;
    fn handle(&mut self, _: (), _: &mut Outbox<u64>) {}
    fn poll(&mut self, out: &mut Outbox<u64>) -> bool {
        let next = self.next.load(Ordering::Relaxed);
        if next >= self.total {
            return false;
        }
        let n = (out.room() as u64).min(16).min(self.allowed.load(Ordering::Relaxed).saturating_sub(next));
        for seq in next..next + n {
            // A crash half-way through: what was staged is discarded, nothing was committed.
            self.crashes.maybe_panic(0, seq);
            out.push(seq);
        }
        self.next.store(next + n, Ordering::Relaxed);
        true
    }
}

/// Forwards each number, checking its own input is in order.
struct Relay {
    stage: usize,
    last: Option<u64>,
    crashes: Arc<Crashes>,
    disorder: Arc<Mutex<Vec<String>>>,
}

impl Component for Relay {
    type In = u64;
    type Out = u64;
    fn handle(&mut self, seq: u64, out: &mut Outbox<u64>) {
        self.crashes.maybe_panic(self.stage, seq);
        if self.last.is_some_and(|l| seq <= l) {
            self.disorder
                .lock()
                .unwrap()
                .push(format!("stage {} saw {seq} after {:?}", self.stage, self.last));
        }
        self.last = Some(seq);
        out.push(seq);
    }
}

struct Sink {
    stage: usize,
    got: Arc<Mutex<Vec<u64>>>,
    crashes: Arc<Crashes>,
}

impl Component for Sink {
    type In = u64;
    type Out = ();
    fn handle(&mut self, seq: u64, _: &mut Outbox<()>) {
        self.crashes.maybe_panic(self.stage, seq);
        self.got.lock().unwrap().push(seq);
    }
}

struct Chain {
    pipeline: Pipeline,
    /// How many messages the source may produce so far (`total` unless held).
    allowed: Arc<AtomicU64>,
    got: Arc<Mutex<Vec<u64>>>,
    disorder: Arc<Mutex<Vec<String>>>,
    stages: usize,
}

/// source → `relays` relays → sink, component `i` on `cpus[i % len]`.
fn chain(
    relays: usize,
    total: u64,
    capacity: usize,
    idle: Idle,
    cpus: &[CpuId],
    crashes: Crashes,
) -> Result<Chain, ComponentError> {
    held_chain(relays, total, total, capacity, idle, cpus, crashes)
}

/// The same, with the source held after `hold_at` messages until `Chain::allowed` is raised.
fn held_chain(
    relays: usize,
    total: u64,
    hold_at: u64,
    capacity: usize,
    idle: Idle,
    cpus: &[CpuId],
    crashes: Crashes,
) -> Result<Chain, ComponentError> {
    let m = machine();
    let mut b = Pipeline::builder(&m)?;
    b.idle(idle);
    let crashes = Arc::new(crashes);
    let got = Arc::new(Mutex::new(Vec::new()));
    let disorder = Arc::new(Mutex::new(Vec::new()));
    let cpu = |i: usize| cpus[i % cpus.len()];
    let (tx, mut rx) = b.spsc::<u64>(capacity)?;
    let next = Arc::new(AtomicU64::new(0));
    let allowed = Arc::new(AtomicU64::new(hold_at));
    let (c, a) = (crashes.clone(), allowed.clone());
    b.component("source", cpu(0), move || Source {
        next: next.clone(),
        total,
        allowed: a.clone(),
        crashes: c.clone(),
    })
    .output(tx)
    .add()?;
    for stage in 1..=relays {
        let (tx, next_rx) = b.spsc::<u64>(capacity)?;
        let (c, d) = (crashes.clone(), disorder.clone());
        b.component(&format!("relay{stage}"), cpu(stage), move || Relay {
            stage,
            last: None,
            crashes: c.clone(),
            disorder: d.clone(),
        })
        .input(rx)
        .output(tx)
        .add()?;
        rx = next_rx;
    }
    let (g, c) = (got.clone(), crashes.clone());
    let stage = relays + 1;
    b.component("sink", cpu(stage), move || Sink { stage, got: g.clone(), crashes: c.clone() })
        .input(rx)
        .add()?;
    Ok(Chain { pipeline: b.build()?, allowed, got, disorder, stages: relays + 2 })
}

/// Waits until the sink has `n` messages; fails (rather than hangs) after a generous deadline.
fn wait_for(got: &Mutex<Vec<u64>>, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.lock().unwrap().len() < n {
        assert!(Instant::now() < deadline, "stuck at {} of {n} messages", got.lock().unwrap().len());
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn cpus_here() -> Vec<CpuId> {
    machine().cpus().iter().map(|c| c.id).collect()
}

#[test]
fn a_chain_delivers_everything_in_order_on_each_idle_mode() {
    let cpus = cpus_here();
    for idle in [Idle::Poll, Idle::Park, Idle::PollThenPark] {
        let c = chain(2, 20_000, 64, idle, &cpus, Crashes::default()).unwrap();
        wait_for(&c.got, 20_000);
        let sample = c.pipeline.stop();
        assert_eq!(*c.got.lock().unwrap(), (0..20_000).collect::<Vec<_>>(), "{idle:?}");
        assert!(c.disorder.lock().unwrap().is_empty());
        assert_eq!(sample.components[3].handled, 20_000);
        assert_eq!(sample.components[0].produced, 20_000);
    }
}

#[test]
fn tiny_channels_lose_no_wake_up_parked_or_polling() {
    // A polling host never sleeps, but it watches its park word, not the channels: a ring
    // lost there would leave it spinning for ever, as a lost wake-up would a parked one.
    let cpus = cpus_here();
    for idle in [Idle::Park, Idle::Poll] {
        let c = chain(3, 5_000, 1, idle, &cpus, Crashes::default()).unwrap();
        wait_for(&c.got, 5_000);
        let s = c.pipeline.stop();
        assert_eq!(*c.got.lock().unwrap(), (0..5_000).collect::<Vec<_>>(), "{idle:?}");
        let parks: u64 = s.hosts.iter().map(|h| h.parks).sum();
        assert_eq!(parks > 0, idle == Idle::Park, "{idle:?}: parking exercised, polling never slept");
    }
}

#[test]
fn a_cpu_emulated_very_slow_still_takes_a_new_speed_and_a_stop() {
    // At a billionth of full speed the stall after a batch of a few µs lasts hours: the new
    // speed, and then the stop, must end it.
    let cpus = cpus_here();
    let c = chain(1, 5_000, 16, Idle::Park, &cpus, Crashes::default()).unwrap();
    c.pipeline.set_speed(cpus[0], 1e-9).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    c.pipeline.set_speed(cpus[0], 1.0).unwrap();
    wait_for(&c.got, 5_000);
    assert_eq!(*c.got.lock().unwrap(), (0..5_000).collect::<Vec<_>>());
    let slow = chain(1, u64::MAX, 16, Idle::Park, &cpus, Crashes::default()).unwrap();
    slow.pipeline.set_speed(cpus[0], 1e-9).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let sample = slow.pipeline.stop();
    assert!(sample.components[0].produced > 0, "the source ran a batch before its stall");
    c.pipeline.stop();
}

#[test]
fn all_on_one_cpu_polling_components_do_not_starve_each_other() {
    let c = chain(2, 10_000, 8, Idle::Poll, &[CpuId(0)], Crashes::default()).unwrap();
    wait_for(&c.got, 10_000);
    c.pipeline.stop();
    assert_eq!(c.got.lock().unwrap().len(), 10_000);
}

#[test]
fn a_poison_message_is_dropped_and_counted_the_rest_flow_in_order() {
    quiet_panics();
    let crashes = Crashes { poison: [(2, 7)].into_iter().collect(), ..Default::default() };
    let c = chain(2, 1_000, 16, Idle::PollThenPark, &cpus_here(), crashes).unwrap();
    wait_for(&c.got, 999);
    let s = c.pipeline.stop();
    let expected: Vec<u64> = (0..1_000).filter(|&x| x != 7).collect();
    assert_eq!(*c.got.lock().unwrap(), expected);
    assert_eq!(s.components[2].crashes, 2, "first delivery and the re-delivery");
    assert_eq!(s.components[2].poisoned, 1);
    assert_eq!(s.components.iter().map(|c| c.poisoned).sum::<u64>(), 1);
}

struct Fragile;
impl Component for Fragile {
    type In = u64;
    type Out = ();
    fn handle(&mut self, _: u64, _: &mut Outbox<()>) {
        panic!("injected: always");
    }
}

#[test]
fn a_factory_that_panics_on_restart_leaves_the_component_dead() {
    quiet_panics();
    let m = machine();
    let mut b = Pipeline::builder(&m).unwrap();
    let (tx, rx) = b.spsc::<u64>(4).unwrap();
    let mut built = 0;
    let id = b
        .component("fragile", CpuId(0), move || {
            built += 1;
            assert!(built == 1, "injected: factory fails on restart");
            Fragile
        })
        .input(rx)
        .add()
        .unwrap();
    let p = b.build().unwrap();
    tx.try_send(1).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !p.sample().components[id.0].dead {
        assert!(Instant::now() < deadline, "component never died");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(p.stop().components[id.0].crashes, 1);
}

#[test]
fn controller_actions_apply_while_messages_flow() {
    let cpus = cpus_here();
    // Held after 1 000 messages until the actions are applied, so that work is left for the
    // window between `before` and the end however fast the run.
    let c = held_chain(1, 30_000, 1_000, 32, Idle::PollThenPark, &[CpuId(0)], Crashes::default()).unwrap();
    wait_for(&c.got, 1_000);
    let before = c.pipeline.sample();
    let last = *cpus.last().unwrap();
    c.pipeline
        .apply(&[
            Action::Move { component: ComponentId(1), from: CpuId(0), to: last },
            Action::SetSpeed { cpu: last, speed: 0.5 },
        ])
        .unwrap();
    let layout = c.pipeline.layout();
    assert_eq!(layout.cpu_of, vec![CpuId(0), last, CpuId(0)]);
    assert_eq!(layout.speed[last.0], 0.5);
    c.allowed.store(30_000, Ordering::Relaxed);
    wait_for(&c.got, 30_000);
    let s = c.pipeline.stop();
    assert_eq!(*c.got.lock().unwrap(), (0..30_000).collect::<Vec<_>>());
    assert_eq!(s.components[1].cpu, last);
    let obs = s.observations_since(&s);
    assert_eq!(obs.len(), 3);
    assert!(obs.iter().all(|o| o.busy_ns == 0 && o.window_ns == 0 && o.done == 0));
    // The work done in between counts every message once per component that finished it.
    let obs = s.observations_since(&before);
    let sink_before = before.components[2].handled;
    assert_eq!(obs[2].done, 30_000 - sink_before, "{obs:?}");
    assert!(obs[0].done > 0 && obs[1].done > 0, "{obs:?}");
}

#[derive(Clone)]
struct Nothing;
impl Component for Nothing {
    type In = u64;
    type Out = u64;
    fn handle(&mut self, m: u64, out: &mut Outbox<u64>) {
        out.push(m);
    }
}

#[test]
fn bad_input_is_a_typed_error() {
    let m = machine();
    let n = m.cpus().len();
    let mut b = Pipeline::builder(&m).unwrap();
    assert!(matches!(b.spsc::<u64>(0), Err(ComponentError::Capacity(0))));
    assert!(matches!(b.mpsc::<u64>(0), Err(ComponentError::Capacity(0))));
    let too_many = corehop_runtime::components::MAX_CHANNEL_CAPACITY + 1;
    assert!(matches!(b.spsc::<u64>(too_many), Err(ComponentError::Capacity(n)) if n == too_many));
    assert!(matches!(b.mpsc::<u64>(usize::MAX), Err(ComponentError::Capacity(usize::MAX))));
    assert!(matches!(b.batch(0), Err(ComponentError::ZeroBatch)));
    assert!(matches!(b.speed(CpuId(0), 0.0), Err(ComponentError::BadSpeed { .. })));
    assert!(matches!(b.speed(CpuId(0), 1.5), Err(ComponentError::BadSpeed { .. })));
    assert!(matches!(b.speed(CpuId(n), 0.5), Err(ComponentError::UnknownCpu { .. })));
    let err = b.component("far", CpuId(n), || Nothing).add().unwrap_err();
    assert!(matches!(err, ComponentError::UnknownCpu { cpu, cpus } if cpu == CpuId(n) && cpus == n));
    let other = Pipeline::builder(&m).unwrap();
    let (_tx, foreign_rx) = other.spsc::<u64>(4).unwrap();
    let err = b.component("x", CpuId(0), || Nothing).input(foreign_rx).add().unwrap_err();
    assert!(matches!(err, ComponentError::ForeignChannel { end: "input", .. }), "{err}");
    let (foreign_tx, _rx) = other.mpsc::<u64>(4).unwrap();
    let err = b.component("y", CpuId(0), || Nothing).output(foreign_tx).add().unwrap_err();
    assert!(matches!(err, ComponentError::ForeignChannel { end: "output", .. }), "{err}");
    quiet_panics();
    let err = b.component("z", CpuId(0), || -> Nothing { panic!("injected: factory") }).add().unwrap_err();
    assert!(matches!(err, ComponentError::FactoryPanicked { ref name } if name == "z"), "{err}");
    let id = b.component("ok", CpuId(0), || Nothing).add().unwrap();
    let p = b.build().unwrap();
    assert!(matches!(p.move_component(ComponentId(9), CpuId(0)), Err(ComponentError::UnknownComponent(_))));
    assert!(matches!(p.move_component(id, CpuId(n)), Err(ComponentError::UnknownCpu { .. })));
    assert!(matches!(p.set_speed(CpuId(0), -1.0), Err(ComponentError::BadSpeed { .. })));
    let msg = p.set_speed(CpuId(0), 2.0).unwrap_err().to_string();
    assert!(msg.contains("speed 2") && msg.contains("cpu0"), "{msg}");
    p.stop();
}

#[test]
fn mpsc_fan_in_keeps_each_producers_order() {
    let m = machine();
    let mut b = Pipeline::builder(&m).unwrap();
    let (tx, rx) = b.mpsc::<u64>(16).unwrap();
    let (out_tx, out_rx) = b.spsc::<u64>(1024).unwrap();
    b.component("merge", CpuId(0), || Nothing).input(rx).output(out_tx).add().unwrap();
    let p = b.build().unwrap();
    let producers: Vec<_> = (0..2u64)
        .map(|k| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for i in 0..2_000u64 {
                    let mut m = k << 32 | i;
                    while let Err(back) = tx.try_send(m) {
                        m = back;
                        std::thread::yield_now();
                    }
                }
            })
        })
        .collect();
    let mut last = [None::<u64>; 2];
    let mut n = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while n < 4_000 {
        assert!(Instant::now() < deadline, "stuck at {n}");
        match out_rx.try_recv() {
            Some(m) => {
                let (k, i) = ((m >> 32) as usize, m & 0xffff_ffff);
                assert!(last[k].is_none_or(|l| i == l + 1), "producer {k}: {i} after {:?}", last[k]);
                last[k] = Some(i);
                n += 1;
            }
            None => std::thread::yield_now(),
        }
    }
    for t in producers {
        t.join().unwrap();
    }
    p.stop();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Random moves while messages flow, random crashes in any stage (source included): every
    /// message reaches the sink exactly once, in order.
    #[test]
    fn no_message_lost_or_reordered_across_moves_and_crashes(
        relays in 1usize..4,
        capacity in 1usize..64,
        idle in prop_oneof![Just(Idle::Poll), Just(Idle::Park), Just(Idle::PollThenPark)],
        crash_points in proptest::collection::vec((0usize..5, 0u64..3_000), 0..12),
        moves in proptest::collection::vec((0u64..3_000, 0usize..5, 0usize..4), 1..10),
    ) {
        quiet_panics();
        let total = 3_000u64;
        let cpus = cpus_here();
        let stages = relays + 2;
        let planned: HashSet<(usize, u64)> = crash_points.iter().map(|&(s, q)| (s % stages, q)).collect();
        let crashes = Crashes { once: Mutex::new(planned.clone()), ..Default::default() };
        let c = chain(relays, total, capacity, idle, &cpus, crashes).unwrap();
        let mut moves = moves;
        moves.sort();
        for (after, component, cpu) in moves {
            wait_for(&c.got, after as usize);
            c.pipeline.move_component(ComponentId(component % c.stages), cpus[cpu % cpus.len()]).unwrap();
        }
        wait_for(&c.got, total as usize);
        let s = c.pipeline.stop();
        prop_assert_eq!(c.got.lock().unwrap().clone(), (0..total).collect::<Vec<_>>());
        prop_assert!(c.disorder.lock().unwrap().is_empty(), "{:?}", c.disorder.lock().unwrap());
        let crashed: u64 = s.components.iter().map(|c| c.crashes).sum();
        prop_assert_eq!(crashed, planned.len() as u64);
        prop_assert!(s.components.iter().all(|c| c.poisoned == 0 && !c.dead));
    }
}

/// Forwards after burning `ns` of CPU: a bottleneck that keeps its input channel full.
struct Slow {
    ns: u64,
}

impl Component for Slow {
    type In = u64;
    type Out = u64;
    fn handle(&mut self, m: u64, out: &mut Outbox<u64>) {
        let t0 = sys::now_ns();
        while sys::now_ns() - t0 < self.ns {
            std::hint::spin_loop();
        }
        out.push(m);
    }
}

/// Regression: a producer blocked on a full channel to another CPU used to register for a
/// wake-up too early; the consumer spent the registration on room the producer had already
/// refilled, and both CPUs slept for good within a few hundred messages.
#[test]
fn a_bottleneck_on_another_cpu_never_strands_a_blocked_producer() {
    let m = machine();
    let far = CpuId(m.cpus().len() - 1);
    for idle in [Idle::Park, Idle::PollThenPark] {
        let mut b = Pipeline::builder(&m).unwrap();
        b.idle(idle);
        let (t1, r1) = b.spsc::<u64>(256).unwrap();
        let (t2, r2) = b.spsc::<u64>(256).unwrap();
        let (t3, r3) = b.spsc::<u64>(256).unwrap();
        let next = Arc::new(AtomicU64::new(0));
        let crashes = Arc::new(Crashes::default());
        let (n, c) = (next.clone(), crashes.clone());
        b.component("source", CpuId(0), move || Source {
            next: n.clone(),
            total: 20_000,
            allowed: Arc::new(AtomicU64::new(20_000)),
            crashes: c.clone(),
        })
        .output(t1)
        .add()
        .unwrap();
        b.component("fast", CpuId(0), || Slow { ns: 0 }).input(r1).output(t2).add().unwrap();
        b.component("slow", far, || Slow { ns: 1_000 }).input(r2).output(t3).add().unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let g = got.clone();
        b.component("sink", far, move || Sink { stage: 9, got: g.clone(), crashes: crashes.clone() })
            .input(r3)
            .add()
            .unwrap();
        let p = b.build().unwrap();
        wait_for(&got, 20_000);
        p.stop();
        assert_eq!(*got.lock().unwrap(), (0..20_000).collect::<Vec<_>>(), "{idle:?}");
    }
}
