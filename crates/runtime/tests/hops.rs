//! Hops keep a task's stack and know where they are: many random hops, every mechanism and
//! wake-up, delegation with `on`, nested hops, `!Send` values on the stack, `hop_any`.

mod common;

use std::cell::RefCell;
use std::rc::Rc;

use corehop_runtime::{
    current_cpu, in_task, on, sys, yield_now, CpuId, Error, Mechanism, Pick, PickState, Runtime, Wake,
};
use rand::{Rng, SeedableRng};

/// `hop` for these tests: their tasks hold nothing tied to an OS thread across a hop (no
/// thread-local references, no lock guards), which is `corehop_runtime::hop`'s contract. Values
/// that live wholly on the task's stack (the `Rc` test below) are allowed by it.
fn hop(cpu: CpuId) -> Result<(), Error> {
    // SAFETY: see above.
    unsafe { corehop_runtime::hop(cpu) }
}

/// `hop_any` under the same contract as [`hop`].
fn hop_any(cpus: &[CpuId], pick: &Pick, state: &mut PickState) -> Result<CpuId, Error> {
    // SAFETY: as for `hop`.
    unsafe { corehop_runtime::hop_any(cpus, pick, state) }
}

fn runtime(mechanism: Mechanism, wake: Wake) -> Runtime {
    Runtime::builder().mechanism(mechanism).wake(wake).build().expect("runtime on this host")
}

/// Hops `hops` times to random CPUs, checking after each hop that the stack is intact and
/// that `current_cpu()` and the kernel agree on where the task is.
fn random_hops(rt: &Runtime, hops: usize, seed: u64) -> usize {
    let cpus = rt.cpus().to_vec();
    let os_ids: Vec<_> = cpus.iter().map(|&c| rt.machine().cpu(c).unwrap().os_id).collect();
    rt.block_on(cpus[0], move || {
        let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
        let mut stack_array = [0u64; 256];
        for (i, x) in stack_array.iter_mut().enumerate() {
            *x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
        let mut checksum: u64 = stack_array.iter().fold(0, |a, &x| a.wrapping_add(x));
        let mut moved = 0;
        for i in 0..hops {
            let k = rng.gen_range(0..cpus.len());
            let before = current_cpu();
            hop(cpus[k]).unwrap();
            moved += usize::from(before != cpus[k]);
            assert_eq!(current_cpu(), cpus[k], "current_cpu wrong after hop {i}");
            assert_eq!(sys::current_os_cpu().unwrap(), os_ids[k], "kernel disagrees after hop {i}");
            // Stack state: the array and the running checksum survive the move.
            assert_eq!(
                stack_array.iter().fold(0u64, |a, &x| a.wrapping_add(x)),
                checksum,
                "stack changed at hop {i}"
            );
            let slot = i % stack_array.len();
            checksum = checksum.wrapping_sub(stack_array[slot]).wrapping_add(i as u64);
            stack_array[slot] = i as u64;
        }
        moved
    })
    .unwrap()
}

#[test]
fn one_hundred_thousand_random_hops_keep_the_stack_and_the_cpu() {
    // Full count in release (CI runs `cargo test --release`); a tenth in debug to keep the
    // debug suite fast on two shared vCPUs.
    let hops = if cfg!(debug_assertions) { 10_000 } else { 100_000 };
    let rt = runtime(Mechanism::Handoff, Wake::SpinThenPark);
    let moved = random_hops(&rt, hops, 42);
    if rt.cpus().len() > 1 {
        assert!(moved > hops / 4, "only {moved} of {hops} hops changed CPU");
    } else {
        println!("only one CPU available: hops stay on it");
    }
}

#[test]
fn many_tasks_hopping_at_once_each_keep_their_own_stack() {
    // More tasks than a lane has slots, so hand-offs also spill to the shared list, and
    // yields mix with hops.
    let (tasks, hops) = (24u64, if cfg!(debug_assertions) { 300 } else { 3_000 });
    for wake in [Wake::Spin, Wake::Park] {
        let rt = runtime(Mechanism::Handoff, wake);
        let cpus = rt.cpus().to_vec();
        let handles: Vec<_> = (0..tasks)
            .map(|t| {
                let cpus = cpus.clone();
                rt.spawn_on(cpus[t as usize % cpus.len()], move || {
                    let mut rng = rand_pcg::Pcg64::seed_from_u64(t);
                    let mut mine = [t; 64];
                    for i in 0..hops {
                        let k = rng.gen_range(0..cpus.len());
                        if rng.gen_bool(0.2) {
                            yield_now().unwrap();
                        } else {
                            hop(cpus[k]).unwrap();
                            assert_eq!(current_cpu(), cpus[k]);
                        }
                        assert!(mine.iter().all(|&x| x == t + i), "task {t}'s stack changed at step {i}");
                        mine.iter_mut().for_each(|x| *x += 1);
                    }
                    t
                })
                .unwrap()
            })
            .collect();
        let done: Vec<u64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(done, (0..tasks).collect::<Vec<_>>(), "{wake:?}");
    }
}

#[test]
fn every_wake_up_and_mechanism_hops_correctly() {
    for (mechanism, wake) in [
        (Mechanism::Handoff, Wake::Spin),
        (Mechanism::Handoff, Wake::Park),
        (Mechanism::Handoff, Wake::SpinThenPark),
        (Mechanism::Affinity, Wake::Park),
    ] {
        let rt = runtime(mechanism, wake);
        random_hops(&rt, 500, 7);
        assert_eq!(rt.mechanism(), mechanism);
        assert_eq!(rt.wake(), wake);
    }
}

#[test]
fn handoff_changes_thread_affinity_keeps_it() {
    for (mechanism, same_thread) in [(Mechanism::Handoff, false), (Mechanism::Affinity, true)] {
        let rt = runtime(mechanism, Wake::Park);
        let cpus = rt.cpus().to_vec();
        if cpus.len() < 2 {
            common::skip("needs two CPUs");
            return;
        }
        let (a, b) = (cpus[0], cpus[1]);
        let (tid_a, tid_b) = rt
            .block_on(a, move || {
                let before = sys::gettid();
                hop(b).unwrap();
                (before, sys::gettid())
            })
            .unwrap();
        assert_eq!(tid_a == tid_b, same_thread, "{mechanism:?}");
    }
}

#[test]
fn on_returns_values_and_comes_back() {
    let rt = runtime(Mechanism::Handoff, Wake::SpinThenPark);
    let cpus = rt.cpus().to_vec();
    let (a, b) = (cpus[0], *cpus.last().unwrap());
    let result = rt
        .block_on(a, move || {
            let local = [1, 2, 3];
            // The closure borrows a local: it runs on the same (moving) stack.
            let (there, sum) = on(b, || (current_cpu(), local.iter().sum::<i32>())).unwrap();
            (there, sum, current_cpu())
        })
        .unwrap();
    assert_eq!(result, (b, 6, a));
    // From a plain thread, `Runtime::on` runs a task.
    assert_eq!(rt.on(b, current_cpu).unwrap(), b);
}

#[test]
fn nested_hops_inside_on_return_to_the_caller() {
    let rt = runtime(Mechanism::Handoff, Wake::SpinThenPark);
    let cpus = rt.cpus().to_vec();
    let (a, b) = (cpus[0], *cpus.last().unwrap());
    let seen = rt
        .block_on(a, move || {
            let inner = on(b, || {
                hop(a).unwrap(); // wander off inside the delegated call...
                let deeper = on(b, current_cpu).unwrap();
                (current_cpu(), deeper)
            })
            .unwrap();
            (inner, current_cpu()) // ...and still come back to where `on` was called
        })
        .unwrap();
    assert_eq!(seen, ((a, b), a));
}

#[test]
fn a_panic_inside_on_resumes_in_the_caller_at_home() {
    let rt = runtime(Mechanism::Handoff, Wake::Park);
    let cpus = rt.cpus().to_vec();
    let (a, b) = (cpus[0], *cpus.last().unwrap());
    let (caught, here) = rt
        .block_on(a, move || {
            let r = std::panic::catch_unwind(|| on(b, || panic!("inside on")));
            (r.is_err(), current_cpu())
        })
        .unwrap();
    assert!(caught);
    assert_eq!(here, a);
}

#[test]
fn non_send_values_on_the_stack_travel_with_it() {
    let rt = runtime(Mechanism::Handoff, Wake::SpinThenPark);
    let cpus = rt.cpus().to_vec();
    let total = rt
        .block_on(cpus[0], move || {
            let shared = Rc::new(RefCell::new(Vec::new()));
            let alias = shared.clone();
            for (i, &cpu) in cpus.iter().cycle().take(50).enumerate() {
                let mut borrow = alias.borrow_mut(); // a RefCell borrow held across the hop
                hop(cpu).unwrap();
                borrow.push(i);
            }
            let total: usize = shared.borrow().iter().sum();
            (total, Rc::strong_count(&shared))
        })
        .unwrap();
    assert_eq!(total, ((0..50).sum(), 2));
}

#[test]
fn hop_any_prefers_an_idle_cpu_when_work_conserving() {
    let rt = runtime(Mechanism::Handoff, Wake::Park);
    let cpus = rt.cpus().to_vec();
    if cpus.len() < 2 {
        common::skip("needs two CPUs");
        return;
    }
    let (a, b) = (cpus[0], cpus[1]);
    let chosen = rt
        .block_on(a, move || {
            let pick = Pick { work_conserving: true, affinity: true, prefer_affinity: false };
            // Previous choice `a` is where we run now (and we do not count against it), so
            // both are idle: affinity keeps `a`.
            let mut state = PickState { previous: Some(a), cursor: 0 };
            let first = hop_any(&[a, b], &pick, &mut state).unwrap();
            let round_robin: Vec<CpuId> =
                (0..4).map(|_| hop_any(&[a, b], &Pick::ROUND_ROBIN, &mut state).unwrap()).collect();
            (first, round_robin, current_cpu())
        })
        .unwrap();
    assert_eq!(chosen.0, a);
    let mut rr = chosen.1.clone();
    rr.dedup();
    assert_eq!(rr.len(), 4, "round robin alternates: {:?}", chosen.1);
    assert_eq!(chosen.2, *chosen.1.last().unwrap());
}

#[test]
fn in_task_is_true_only_inside_tasks() {
    assert!(!in_task());
    assert_eq!(corehop_runtime::try_current_cpu(), None);
    let rt = runtime(Mechanism::Handoff, Wake::Park);
    assert!(rt.block_on(rt.cpus()[0], in_task).unwrap());
}

#[test]
fn yield_now_resumes_on_the_same_os_thread() {
    // `yield_now` is safe because the task goes back to its own worker: a thread-bound value
    // (here the thread id) held across it stays right, with other tasks yielding meanwhile.
    let rt = runtime(Mechanism::Handoff, Wake::SpinThenPark);
    let cpu = rt.cpus()[0];
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            rt.spawn_on(cpu, move || {
                let mut moved = 0;
                for _ in 0..1000 {
                    let before = std::thread::current().id();
                    yield_now().unwrap();
                    moved += usize::from(std::thread::current().id() != before);
                }
                moved
            })
            .unwrap()
        })
        .collect();
    for t in tasks {
        assert_eq!(t.join().unwrap(), 0);
    }
}

#[test]
fn on_brings_the_caller_back_to_its_own_os_thread() {
    let rt = runtime(Mechanism::Handoff, Wake::SpinThenPark);
    let cpus = rt.cpus().to_vec();
    let (a, b) = (cpus[0], *cpus.last().unwrap());
    let same = rt
        .block_on(a, move || {
            (0..200).all(|_| {
                let before = std::thread::current().id();
                let there = on(b, || std::thread::current().id()).unwrap();
                let _ = there;
                std::thread::current().id() == before
            })
        })
        .unwrap();
    assert!(same);
}

#[test]
fn others_waiting_sees_work_queued_for_the_calling_tasks_cpu() {
    assert!(!corehop_runtime::others_waiting(), "outside a task");
    let rt = runtime(Mechanism::Handoff, Wake::Spin);
    let cpu = rt.cpus()[0];
    assert!(!rt.block_on(cpu, corehop_runtime::others_waiting).unwrap(), "nothing else on this CPU");
    let seen = rt
        .block_on(cpu, move || {
            // A task spawned here waits while this one runs.
            let other = corehop_runtime::spawn_on(cpu, || ()).unwrap();
            let seen = corehop_runtime::others_waiting();
            while !other.is_finished() {
                yield_now().unwrap();
            }
            seen
        })
        .unwrap();
    assert!(seen, "the spawned task was queued");
}
