//! `ct_start`/`ct_end` cost per operation as the number of registered objects grows (issue 19
//! item 11): 1 k, 10 k, 100 k and 1 M objects, each with operations on 64 hot objects and
//! round-robin over all of them. The 1 k row is the same-run baseline of the others.
//!
//! cargo run --release -p corehop-capi --example scaling [-- OPS REPS]
use std::ffi::c_void;
use std::time::Instant;

use corehop::*;

fn per_op_ns(objects: usize, spread: usize, ops: usize) -> f64 {
    let start = Instant::now();
    for i in 0..ops {
        // Addresses are only names: the C API never dereferences them.
        let obj = (0x1000 + (i % spread) * 64) as *const c_void;
        assert_eq!(ct_start(obj), 0);
        assert_eq!(ct_end(), 0);
    }
    let _ = objects;
    start.elapsed().as_nanos() as f64 / ops as f64
}

fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

fn main() {
    let mut args = std::env::args().skip(1);
    let ops: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let reps: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    println!("ct_start+ct_end, ns per operation ({ops} operations x {reps} repetitions; min / median / max)");
    println!(
        "{:>9}  {:>28}  {:>8}  {:>28}  {:>8}",
        "objects", "64 hot objects", "vs 1k", "round-robin over all", "vs 1k"
    );
    let mut baseline = None;
    for objects in [1_000usize, 10_000, 100_000, 1_000_000] {
        assert_eq!(corehop_init(), 0);
        for i in 0..objects {
            assert_eq!(ct_object((0x1000 + i * 64) as *const c_void, 64), 0);
        }
        let hot = stats((0..reps).map(|_| per_op_ns(objects, 64, ops)).collect());
        let all = stats((0..reps).map(|_| per_op_ns(objects, objects, ops)).collect());
        let (base_hot, base_all) = *baseline.get_or_insert((hot.1, all.1));
        println!(
            "{objects:>9}  {:>8.0} / {:>7.0} / {:>7.0}  {:>7.2}x  {:>8.0} / {:>7.0} / {:>7.0}  {:>7.2}x",
            hot.0,
            hot.1,
            hot.2,
            hot.1 / base_hot,
            all.0,
            all.1,
            all.2,
            all.1 / base_all
        );
        assert_eq!(corehop_shutdown(), 0);
    }
}
