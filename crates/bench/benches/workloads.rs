//! Criterion regression benchmarks of the workloads behind `corehop bench`: the cache-line
//! floor between two CPUs, SQLite TPC-B transactions and the loopback file server, each kept
//! local and offloaded to a service core. `corehop bench …` compares mechanisms side by side in
//! one run; this file tracks each workload over time.

use std::time::Duration;

use corehop_bench::offload::{files, sqlite};
use corehop_bench::switch;
use corehop_policy::offload::OffloadPolicy;
use corehop_runtime::service::{Offloader, ServiceConfig};
use corehop_runtime::OsCpu;
use criterion::{criterion_group, criterion_main, Criterion};

/// The first two CPUs this process may run on, if it may run on two.
fn two_cpus() -> Option<(OsCpu, OsCpu)> {
    let cpus = corehop_runtime::sys::affinity().ok()?;
    (cpus.len() >= 2).then(|| (cpus[0], cpus[1]))
}

fn cache_line_floor(c: &mut Criterion) {
    let Some((a, b)) = two_cpus() else { return };
    c.bench_function("cache-line round trip", |bench| {
        bench.iter_custom(|iters| {
            let ns = switch::floor(a, b, iters.max(1)).expect("floor");
            Duration::from_nanos((ns * iters as f64) as u64)
        })
    });
}

fn offload_workloads(c: &mut Criterion) {
    let Some((app, service)) = two_cpus() else { return };
    let cores = ServiceConfig::on_cpus([service]).build().expect("service core");
    let dir = tempfile::tempdir().expect("temp dir");
    let db = sqlite::create(dir.path()).expect("database");
    files::create(dir.path()).expect("files");
    let mut group = c.benchmark_group("workloads");
    group.sample_size(10);
    for policy in [OffloadPolicy::Never, OffloadPolicy::Always] {
        let name = policy.label();
        group.bench_function(format!("sqlite 20 txns, {name}"), |bench| {
            bench.iter(|| {
                let mut off = Offloader::new(&cores, policy.clone());
                sqlite::run(&db, &mut off, 20, 1).expect("transactions")
            })
        });
        group.bench_function(format!("file server 200 requests, {name}"), |bench| {
            bench.iter(|| {
                files::run(dir.path(), &cores, policy.clone(), false, app.0, 200, 1).expect("server")
            })
        });
    }
    group.finish();
}

criterion_group!(benches, cache_line_floor, offload_workloads);
criterion_main!(benches);
