use corehop_runtime::{hop, spawn_on, sys, Runtime, Wake};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
#[repr(align(128))]
struct Line(AtomicU64);
fn main() {
    let rt = Runtime::builder().wake(Wake::Spin).build().unwrap();
    let (a, b) = (rt.cpus()[0], rt.cpus()[1]);
    let (ratios, hops, floors) = rt
        .block_on(a, move || {
            let (mut ratios, mut hops, mut floors) = (vec![], vec![], vec![]);
            let n = 5000u64;
            for _ in 0..n {
                hop(b).unwrap();
                hop(a).unwrap();
            }
            for _ in 0..60 {
                let line = Arc::new(Line(AtomicU64::new(0)));
                let l2 = line.clone();
                let responder = spawn_on(b, move || {
                    for i in 0..n {
                        while l2.0.load(Ordering::Acquire) != 2 * i + 1 {
                            sys::cpu_relax();
                        }
                        l2.0.store(2 * i + 2, Ordering::Release);
                    }
                })
                .unwrap();
                let t0 = sys::now_ns();
                for i in 0..n {
                    line.0.store(2 * i + 1, Ordering::Release);
                    while line.0.load(Ordering::Acquire) != 2 * i + 2 {
                        sys::cpu_relax();
                    }
                }
                let f = (sys::now_ns() - t0) as f64 / n as f64;
                // wait for the responder task to finish without blocking the worker
                while !responder.is_finished() {
                    sys::cpu_relax();
                }
                let t0 = sys::now_ns();
                for _ in 0..n {
                    hop(b).unwrap();
                    hop(a).unwrap();
                }
                let h = (sys::now_ns() - t0) as f64 / n as f64;
                ratios.push(h / f);
                hops.push(h);
                floors.push(f);
            }
            (ratios, hops, floors)
        })
        .unwrap();
    let med = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[0], v[v.len() / 2])
    };
    let (rmin, rmed) = med(ratios);
    let (hmin, hmed) = med(hops);
    let (fmin, fmed) = med(floors);
    println!("floor {fmin:.0}/{fmed:.0}  hop {hmin:.0}/{hmed:.0}  paired ratio min {rmin:.2} med {rmed:.2}");
}
