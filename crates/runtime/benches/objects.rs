//! What O² adds to an operation that stays where it is called (criterion): a read of a small
//! object through [`Objects::read_handle`] with nothing placed, against the same read under
//! the object's lock taken directly, in a plain thread and in a corehop task. For the
//! side-by-side comparison on real lookups use `corehop bench o2`; this file tracks the path.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corehop_runtime::objects::{Handle, Objects, ObjectsConfig, OpLock};
use corehop_runtime::Runtime;
use criterion::{criterion_group, criterion_main, Criterion};
use crossbeam_utils::CachePadded;

/// Objects read in turn: more than one, so the path's loads are not all of one line.
const OBJECTS: usize = 64;

/// An object's words.
type Words = [u64; 8];

/// The same words under a lock of their own, as plain threads keep them.
type Locked = CachePadded<(OpLock, Words)>;

/// The operation: sums an object's eight words.
fn sum(words: &Words) -> u64 {
    words.iter().sum()
}

fn stay(c: &mut Criterion) {
    let rt = Runtime::builder().build().expect("runtime");
    let cpu = rt.cpus()[0];
    // Placement is never revisited within a run: every operation stays.
    let config = ObjectsConfig { period: Duration::from_secs(3600), ..ObjectsConfig::default() };
    let objects = Arc::new(Objects::new(rt.machine(), rt.cpus(), config).expect("registry"));
    let handles: Arc<Vec<Handle<Words>>> =
        Arc::new((0..OBJECTS).map(|i| objects.register(i, [i as u64; 8], 64).expect("register")).collect());
    let locks: Arc<Vec<Locked>> =
        Arc::new((0..OBJECTS).map(|i| CachePadded::new((OpLock::default(), [i as u64; 8]))).collect());

    let mut group = c.benchmark_group("object_op_that_stays");
    group.bench_function("lock_thread", |b| {
        b.iter_custom(|iters| {
            let t0 = Instant::now();
            for i in 0..iters as usize {
                let (lock, words) = &*locks[i % OBJECTS];
                black_box(lock.exclusive(|| sum(words)));
            }
            t0.elapsed()
        })
    });
    group.bench_function("objects_thread", |b| {
        b.iter_custom(|iters| {
            let t0 = Instant::now();
            for i in 0..iters as usize {
                black_box(objects.read_handle(&handles[i % OBJECTS], sum).expect("read"));
            }
            t0.elapsed()
        })
    });
    group.bench_function("lock_task", |b| {
        b.iter_custom(|iters| {
            let locks = Arc::clone(&locks);
            rt.block_on(cpu, move || {
                let t0 = Instant::now();
                for i in 0..iters as usize {
                    let (lock, words) = &*locks[i % OBJECTS];
                    black_box(lock.exclusive(|| sum(words)));
                }
                t0.elapsed()
            })
            .expect("task")
        })
    });
    group.bench_function("objects_task", |b| {
        b.iter_custom(|iters| {
            let (objects, handles) = (Arc::clone(&objects), Arc::clone(&handles));
            rt.block_on(cpu, move || {
                let t0 = Instant::now();
                for i in 0..iters as usize {
                    black_box(objects.read_handle(&handles[i % OBJECTS], sum).expect("read"));
                }
                t0.elapsed()
            })
            .expect("task")
        })
    });
    group.finish();
}

criterion_group!(benches, stay);
criterion_main!(benches);
