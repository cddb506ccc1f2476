//! Events per second of the simulation engine (target: at least 5 M/s on one core).
//!
//! - `engine/queue`: the bare engine. A model keeps 1 024 events in flight; each event
//!   schedules the next one a pseudo-random distance ahead (so the heap really reorders), and
//!   draws from the seeded RNG, as models do. What is measured is the queue, the clock and the
//!   dispatch loop.
//! - `engine/switch-model`: a real model, the core-switching micro-benchmark (six events per
//!   hopped call, run queues, busy/idle ledger, hop timing, `policy::pick`), on `switch-cs`.
//!
//! Criterion reports the throughput in elements (= events) per second of wall-clock time. On a
//! shared machine that understates the engine; for CPU time, run one iteration under `time`:
//! `/usr/bin/time -f %U target/release/deps/engine-* --test engine/queue` (10⁶ events).

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use rand::Rng;

use corehop_sim::{models, run, Limits, Model, ModelReport, Ps, ScenarioDoc, Sim};

/// Keeps `in_flight` events pending until `total` have been delivered.
struct Churn {
    in_flight: u32,
    remaining: u64,
}

impl Model for Churn {
    type Event = u32;

    fn start(&mut self, sim: &mut Sim<u32>) {
        for i in 0..self.in_flight {
            sim.schedule_in(Ps::from(i), i);
        }
    }

    fn on_event(&mut self, id: u32, sim: &mut Sim<u32>) {
        if self.remaining > 0 {
            self.remaining -= 1;
            let delay = sim.rng().gen_range(1..10_000);
            sim.schedule_in(delay, id);
        }
    }

    fn report(&self, _: &Sim<u32>) -> ModelReport {
        ModelReport::default()
    }
}

fn machine() -> corehop_sim::SimMachine {
    let m = corehop_topology::presets::by_name("switch-cs").expect("preset exists");
    corehop_sim::SimMachine::new(m, corehop_sim::CostModel::for_preset("switch-cs"))
}

fn bench_engine(c: &mut Criterion) {
    const EVENTS: u64 = 1_000_000;
    let mut g = c.benchmark_group("engine");
    g.sample_size(10);
    g.throughput(Throughput::Elements(EVENTS));
    g.bench_function("queue", |b| {
        b.iter(|| {
            let mut sim = Sim::new(machine(), 1);
            let mut model = Churn { in_flight: 1024, remaining: EVENTS - 1024 };
            run(&mut model, &mut sim, Limits::default(), &mut |_| {});
            black_box(sim.events_delivered())
        })
    });

    let text = "[machine]\npreset = \"switch-cs\"\n[workload]\nkind = \"switch\"\nmechanism = \"spin\"\n\
                iterations = 100000\n";
    let scenario = ScenarioDoc::parse("bench.toml", text).unwrap().validate().unwrap();
    let events = models::run_scenario(&scenario, &mut |_| {}).unwrap().events;
    g.throughput(Throughput::Elements(events));
    g.bench_function("switch-model", |b| {
        b.iter(|| black_box(models::run_scenario(&scenario, &mut |_| {}).unwrap().events))
    });
    g.finish();
}

criterion_group!(benches, bench_engine);
criterion_main!(benches);
