//! Regression benchmarks of the hop primitives (criterion): a Handoff round trip between two
//! CPUs under each wake-up, and `on()` delegation. For the side-by-side comparison against
//! the cache-line floor use `corehop bench switch`; this file tracks each primitive over time.

use corehop_runtime::{on, CpuId, Error, Mechanism, Runtime, Wake};
use criterion::{criterion_group, criterion_main, Criterion};

/// `hop` for these tests: their tasks hold nothing tied to an OS thread across a hop (no
/// thread-local references, no lock guards), which is `corehop_runtime::hop`'s contract.
fn hop(cpu: CpuId) -> Result<(), Error> {
    // SAFETY: see above.
    unsafe { corehop_runtime::hop(cpu) }
}

/// Times `iters` operations inside one task on `from` (criterion's `iter_custom`), so task
/// start-up is not part of the figure.
fn in_task(
    rt: &Runtime,
    from: CpuId,
    iters: u64,
    op: impl Fn() + Send + Sync + Clone + 'static,
) -> std::time::Duration {
    rt.block_on(from, move || {
        let t0 = std::time::Instant::now();
        for _ in 0..iters {
            op();
        }
        t0.elapsed()
    })
    .expect("benchmark task")
}

fn hops(c: &mut Criterion) {
    let probe = Runtime::builder().wake(Wake::Park).build().expect("runtime");
    if probe.cpus().len() < 2 {
        println!("skipped: hop benchmarks need two CPUs");
        return;
    }
    let (from, to) = (probe.cpus()[0], probe.cpus()[1]);
    drop(probe);
    let mut group = c.benchmark_group("hop_round_trip");
    for (name, wake) in [("spin", Wake::Spin), ("spin_then_park", Wake::SpinThenPark), ("park", Wake::Park)] {
        let rt = Runtime::builder()
            .cpus([from, to])
            .mechanism(Mechanism::Handoff)
            .wake(wake)
            .build()
            .expect("runtime");
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                in_task(&rt, from, iters, move || {
                    hop(to).expect("hop there");
                    hop(from).expect("hop back");
                })
            })
        });
    }
    group.finish();

    let rt = Runtime::builder().cpus([from, to]).wake(Wake::Spin).build().expect("runtime");
    c.bench_function("on_delegation", |b| {
        b.iter_custom(|iters| {
            in_task(&rt, from, iters, move || {
                std::hint::black_box(on(to, || 1u64).expect("on"));
            })
        })
    });
}

criterion_group!(benches, hops);
criterion_main!(benches);
