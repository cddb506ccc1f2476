//! Asynchronous delegation: `submit`, `submit_batch`, `Pending` from threads and tasks, order,
//! panics, cancellation, back-pressure and shutdown, every wake-up strategy.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use corehop_runtime::{
    current_cpu, no_hop_zone, spawn_on, submit, submit_batch, yield_now, CpuId, Error, Runtime, Wake,
    MAX_BLOCK_OPS,
};
use proptest::prelude::*;

fn runtime(wake: Wake) -> Runtime {
    Runtime::builder().wake(wake).build().expect("runtime on this host")
}

fn ends(rt: &Runtime) -> (CpuId, CpuId) {
    (rt.cpus()[0], *rt.cpus().last().unwrap())
}

#[test]
fn a_submitted_operation_runs_on_its_cpu_from_a_thread_and_from_a_task() {
    for wake in [Wake::Spin, Wake::Park, Wake::SpinThenPark] {
        let rt = runtime(wake);
        let (a, b) = ends(&rt);
        assert_eq!(rt.submit(b, current_cpu).unwrap().wait().unwrap(), b, "{wake:?}");
        let (ran_on, still_on) = rt
            .block_on(a, move || {
                let pending = submit(b, current_cpu).unwrap();
                // The caller goes on where it is meanwhile.
                let here = current_cpu();
                (pending.wait().unwrap(), here)
            })
            .unwrap();
        assert_eq!((ran_on, still_on), (b, a), "{wake:?}");
    }
}

#[test]
fn a_batch_to_several_cpus_comes_back_in_submission_order() {
    let rt = runtime(Wake::SpinThenPark);
    let cpus = rt.cpus().to_vec();
    // More than one request's worth per CPU, interleaved across CPUs.
    let n = 2 * MAX_BLOCK_OPS + 37;
    let ops = (0..n).map(|i| {
        let cpu = cpus[(i * 7 / 3) % cpus.len()];
        (cpu, move || (i, current_cpu()))
    });
    let batch = rt.submit_batch(ops).unwrap();
    assert_eq!(batch.len(), n);
    let results = batch.wait().unwrap();
    for (i, &(value, ran_on)) in results.iter().enumerate() {
        assert_eq!((value, ran_on), (i, cpus[(i * 7 / 3) % cpus.len()]));
    }
    // The same from inside a task.
    let (a, b) = ends(&rt);
    let inside = rt
        .block_on(a, move || submit_batch((0..300u32).map(|i| (b, move || i * 2))).unwrap().wait().unwrap());
    assert_eq!(inside.unwrap(), (0..300u32).map(|i| i * 2).collect::<Vec<_>>());
    assert!(rt.submit_batch(Vec::<(CpuId, fn() -> u8)>::new()).unwrap().wait().unwrap().is_empty());
}

#[test]
fn operations_to_one_cpu_run_in_submission_order() {
    let rt = runtime(Wake::Spin);
    let (_, b) = ends(&rt);
    let log = Arc::new(Mutex::new(Vec::new()));
    let pendings: Vec<_> = (0..500)
        .map(|i| {
            let log = log.clone();
            rt.submit(b, move || log.lock().unwrap().push(i)).unwrap()
        })
        .collect();
    pendings.into_iter().for_each(|p| p.wait().unwrap());
    assert_eq!(*log.lock().unwrap(), (0..500).collect::<Vec<_>>());
}

#[test]
fn an_unknown_cpu_is_refused_before_anything_is_sent() {
    let rt = runtime(Wake::Park);
    let (a, _) = ends(&rt);
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    let err = rt.submit(CpuId(999), move || r.fetch_add(1, Ordering::SeqCst)).unwrap_err();
    assert!(matches!(err, Error::UnknownCpu { cpu: CpuId(999), .. }), "{err}");
    let ops = [a, a, CpuId(998)].map(|cpu| {
        let ran = ran.clone();
        (cpu, move || ran.fetch_add(1, Ordering::SeqCst))
    });
    assert!(matches!(rt.submit_batch(ops), Err(Error::UnknownCpu { cpu: CpuId(998), .. })));
    // Outside a task the free functions say where to call them from.
    assert!(matches!(submit(a, || ()), Err(Error::NotInTask)));
    drop(rt);
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

#[test]
fn a_panic_in_an_operation_resumes_in_the_waiter_and_the_worker_goes_on() {
    let rt = runtime(Wake::Park);
    let (_, b) = ends(&rt);
    let pending = rt.submit(b, || -> u32 { panic!("delegated boom") }).unwrap();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pending.wait()));
    let payload = caught.unwrap_err();
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"delegated boom"));
    let batch =
        rt.submit_batch((0..4u32).map(|i| (b, move || if i == 2 { panic!("second") } else { i }))).unwrap();
    assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| batch.wait())).is_err());
    assert_eq!(rt.submit(b, || 7).unwrap().wait().unwrap(), 7);
}

/// Counts the closures and results alive, to show that dropped `Pending`s leak nothing.
struct Counted(Arc<AtomicUsize>);

impl Counted {
    fn new(alive: &Arc<AtomicUsize>) -> Counted {
        alive.fetch_add(1, Ordering::SeqCst);
        Counted(alive.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[test]
fn a_dropped_pending_still_runs_its_operation_and_frees_its_result() {
    let rt = runtime(Wake::SpinThenPark);
    let (_, b) = ends(&rt);
    let alive = Arc::new(AtomicUsize::new(0));
    let ran = Arc::new(AtomicUsize::new(0));
    for _ in 0..200 {
        let (captured, alive2, ran2) = (Counted::new(&alive), alive.clone(), ran.clone());
        drop(rt.submit(b, move || {
            let _keep = &captured;
            ran2.fetch_add(1, Ordering::SeqCst);
            Counted::new(&alive2)
        }));
    }
    // Everything sent before this one has been served when it is.
    rt.submit(b, || ()).unwrap().wait().unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 200);
    assert_eq!(alive.load(Ordering::SeqCst), 0, "closures and results all dropped");
}

#[test]
fn waiting_inside_a_task_lets_the_other_tasks_of_its_cpu_run() {
    let rt = runtime(Wake::Park);
    let (a, b) = ends(&rt);
    // The operation waits for a second task on the waiter's own CPU: it can only finish if
    // waiting yields that CPU.
    let flag = Arc::new(AtomicBool::new(false));
    let (f1, f2) = (flag.clone(), flag.clone());
    let waited = rt
        .block_on(a, move || {
            let pending = submit(b, move || {
                while !f1.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                current_cpu()
            })
            .unwrap();
            let other = spawn_on(a, move || f2.store(true, Ordering::Release)).unwrap();
            let got = pending.wait().unwrap();
            drop(other);
            got
        })
        .unwrap();
    assert_eq!(waited, b);
}

#[test]
fn a_task_can_wait_for_its_own_cpu_even_where_it_may_not_yield() {
    let rt = runtime(Wake::Park);
    let (a, _) = ends(&rt);
    let got = rt
        .block_on(a, move || {
            let first = submit(a, current_cpu).unwrap().wait().unwrap();
            let _zone = no_hop_zone();
            assert!(yield_now().is_err());
            (first, submit(a, || 5).unwrap().wait().unwrap())
        })
        .unwrap();
    assert_eq!(got, (a, 5));
}

#[test]
fn waiting_inside_an_operation_is_an_error_not_a_deadlock() {
    let rt = Arc::new(runtime(Wake::Park));
    let (a, b) = ends(&rt);
    let inner_rt = rt.clone();
    let result = rt.submit(b, move || inner_rt.submit(a, || 1).unwrap().wait().map_err(|e| e.to_string()));
    let message = result.unwrap().wait().unwrap().unwrap_err();
    assert!(message.contains("inside a delegated operation"), "{message}");
}

#[test]
fn a_full_inbox_makes_submitters_wait_and_loses_nothing() {
    let rt = runtime(Wake::SpinThenPark);
    let (a, b) = ends(&rt);
    // Hold b's worker in a task so that its inbox fills up, from two threads at once.
    let (held, release) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let (h, hold) = (held.clone(), release.clone());
    let holder = rt
        .spawn_on(b, move || {
            h.store(true, Ordering::Release);
            while !hold.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
        })
        .unwrap();
    while !held.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
    let sent = Arc::new(AtomicUsize::new(0));
    let total = 3000;
    let rt = Arc::new(rt);
    let submitters: Vec<_> = (0..2)
        .map(|t| {
            let (rt, sent) = (rt.clone(), sent.clone());
            std::thread::spawn(move || {
                let pendings: Vec<_> = (0..total / 2)
                    .map(|i| {
                        let p = rt.submit(b, move || t * total + i).unwrap();
                        sent.fetch_add(1, Ordering::SeqCst);
                        p
                    })
                    .collect();
                pendings.into_iter().map(|p| p.wait().unwrap()).collect::<Vec<_>>()
            })
        })
        .collect();
    // Submitters get stuck at the bound while the holder runs (never past it).
    while sent.load(Ordering::SeqCst) < 1024 {
        std::thread::yield_now();
    }
    // Give them time to run past the bound, if they could.
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(sent.load(Ordering::SeqCst), 1024, "the inbox holds 1024 requests, and no more");
    release.store(true, Ordering::Release);
    holder.join().unwrap();
    for (t, handle) in submitters.into_iter().enumerate() {
        assert_eq!(handle.join().unwrap(), (0..total / 2).map(|i| t * total + i).collect::<Vec<_>>());
    }
    let _ = a;
}

#[test]
fn after_shutdown_a_submission_is_cancelled_unrun() {
    let rt = runtime(Wake::Park);
    let (_, b) = ends(&rt);
    rt.shutdown();
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    let pending = rt.submit(b, move || r.store(true, Ordering::SeqCst)).unwrap();
    assert!(pending.is_done());
    assert!(matches!(pending.wait(), Err(Error::ShutDown)));
    let batch = rt.submit_batch([1, 2].map(|v| (b, move || v))).unwrap();
    assert!(matches!(batch.wait(), Err(Error::ShutDown)));
    assert!(!ran.load(Ordering::SeqCst));
}

#[test]
fn tasks_finishing_during_shutdown_still_get_their_operations_served() {
    let rt = runtime(Wake::SpinThenPark);
    let (a, b) = ends(&rt);
    let (started, go) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let (s, g) = (started.clone(), go.clone());
    let task = rt
        .spawn_on(a, move || {
            s.store(true, Ordering::Release);
            while !g.load(Ordering::Acquire) {
                let _ = yield_now();
            }
            submit_batch((0..100u32).map(|i| (b, move || i))).unwrap().wait()
        })
        .unwrap();
    // Started, so shutdown lets it finish rather than cancelling it.
    while !started.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
    let rt = Arc::new(rt);
    let stopper = {
        let rt = rt.clone();
        std::thread::spawn(move || rt.shutdown())
    };
    while !rt.is_shut_down() {
        std::thread::yield_now();
    }
    go.store(true, Ordering::Release);
    assert_eq!(task.join().unwrap().unwrap(), (0..100).collect::<Vec<_>>());
    stopper.join().unwrap();
}

/// What one random scenario does with each submission.
#[derive(Debug, Clone)]
enum Fate {
    Wait,
    Drop,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random batches (sizes 1..300, to random CPUs) from two threads, some waited for, some
    /// dropped, and a shutdown at a random point: every operation runs at most once; one
    /// whose wait said `Ok` ran exactly once with its own value; one whose wait said
    /// `ShutDown` never ran; before shutdown nothing is cancelled; and every closure and
    /// result is freed.
    #[test]
    fn no_operation_is_lost_or_run_twice(
        batches in prop::collection::vec((1usize..300, any::<u64>(), prop::bool::ANY), 1..12),
        shutdown_after in 0usize..12,
        wake in prop::sample::select(vec![Wake::Spin, Wake::Park, Wake::SpinThenPark]),
    ) {
        let rt = Arc::new(runtime(wake));
        let cpus = rt.cpus().to_vec();
        let total: usize = batches.iter().map(|b| b.0).sum();
        let runs: Arc<Vec<AtomicUsize>> = Arc::new((0..total).map(|_| AtomicUsize::new(0)).collect());
        let alive = Arc::new(AtomicUsize::new(0));
        let mut first = 0;
        let mut plans = Vec::new();
        for (i, &(size, seed, waited)) in batches.iter().enumerate() {
            plans.push((i, first, size, seed, if waited { Fate::Wait } else { Fate::Drop }));
            first += size;
        }
        let (early, late): (Vec<_>, Vec<_>) = plans.into_iter().partition(|p| p.0 < shutdown_after);
        let run_plans = |plans: Vec<(usize, usize, usize, u64, Fate)>, before_shutdown: bool| {
            let threads = [0, 1].map(|t| {
                let (rt, cpus, runs, alive) = (rt.clone(), cpus.clone(), runs.clone(), alive.clone());
                let mine: Vec<_> = plans.iter().filter(|p| p.0 % 2 == t).cloned().collect();
                std::thread::spawn(move || {
                    for (_, first, size, seed, fate) in mine {
                        let ops = (first..first + size).map(|id| {
                            let cpu = cpus[(seed as usize).wrapping_add(id * 31) % cpus.len()];
                            let (runs, alive, captured) = (runs.clone(), alive.clone(), Counted::new(&alive));
                            (cpu, move || {
                                let _keep = &captured;
                                runs[id].fetch_add(1, Ordering::SeqCst);
                                (id, Counted::new(&alive))
                            })
                        });
                        let batch = rt.submit_batch(ops).unwrap();
                        match fate {
                            Fate::Drop => drop(batch),
                            Fate::Wait => match batch.wait() {
                                Ok(values) => {
                                    let ids: Vec<usize> = values.iter().map(|v| v.0).collect();
                                    assert_eq!(ids, (first..first + size).collect::<Vec<_>>());
                                    for id in ids {
                                        assert_eq!(runs[id].load(Ordering::SeqCst), 1);
                                    }
                                }
                                Err(Error::ShutDown) => assert!(!before_shutdown, "cancelled while running"),
                                Err(e) => panic!("{e}"),
                            },
                        }
                    }
                })
            });
            threads.into_iter().for_each(|t| t.join().unwrap());
        };
        run_plans(early, true);
        // Served before shutdown: a last operation behind everything sent so far.
        for &cpu in &cpus {
            rt.submit(cpu, || ()).unwrap().wait().unwrap();
        }
        let stopper = {
            let rt = rt.clone();
            std::thread::spawn(move || rt.shutdown())
        };
        run_plans(late, false);
        stopper.join().unwrap();
        rt.shutdown();
        for (id, r) in runs.iter().enumerate() {
            prop_assert!(r.load(Ordering::SeqCst) <= 1, "operation {id} ran twice");
        }
        let early_total: usize = batches.iter().take(shutdown_after).map(|b| b.0).sum();
        prop_assert!(runs[..early_total].iter().all(|r| r.load(Ordering::SeqCst) == 1), "an operation sent before shutdown was lost");
        drop(rt);
        prop_assert_eq!(alive.load(Ordering::SeqCst), 0, "a closure or result leaked");
    }
}
