//! The object registry's public API: routing to owners, exclusion, monitoring, errors.

mod common;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use corehop_runtime::objects::{ObjectError, ObjectHints, Objects, ObjectsConfig, Placement, Via};
use corehop_runtime::sys;
use corehop_topology::{Cache, CacheKind, CpuId, Machine, OsCpu};

/// This host's usable CPUs with a private 1 MB L2 each and a shared 32 MB L3 (the sizes do not
/// matter to these tests, only that budgets exist).
fn host() -> Machine {
    let mut machine = Machine::uniform("host", &sys::affinity().expect("affinity"), 1);
    let all: Vec<CpuId> = machine.cpus().iter().map(|c| c.id).collect();
    let cache =
        |level, size_bytes, cpus| Cache { level, kind: CacheKind::Unified, size_bytes, line_bytes: 64, cpus };
    machine.caches = all.iter().map(|&cpu| cache(2, 1 << 20, vec![cpu])).collect();
    machine.caches.push(cache(3, 32 << 20, all));
    machine
}

/// [`host`], if it has two CPUs (else a recorded skip).
fn host_with_two_cpus() -> Option<Machine> {
    let machine = host();
    if machine.cpus().len() < 2 {
        common::skip("needs 2 CPUs");
        return None;
    }
    Some(machine)
}

/// A runtime on every CPU of `machine`, its first CPU (the caller's home) and its last (an
/// object's owner).
fn runtime_with_home_and_owner(machine: &Machine) -> (corehop_runtime::Runtime, CpuId, CpuId) {
    let rt = corehop_runtime::Runtime::builder().machine(machine.clone()).build().unwrap();
    let cpus = rt.cpus().to_vec();
    let (home, owner) = (cpus[0], *cpus.last().unwrap());
    (rt, home, owner)
}

fn registry<T: Send + Sync>(machine: &Machine) -> Objects<u32, T> {
    let cpus: Vec<CpuId> = machine.cpus().iter().map(|c| c.id).collect();
    // A long period: placement changes only when a test asks for it.
    // A request is never taken back: operations run where these tests expect them.
    let config = ObjectsConfig {
        period: Duration::from_secs(3600),
        take_back_after: None,
        ..ObjectsConfig::default()
    };
    Objects::new(machine, &cpus, config).unwrap()
}

#[test]
fn operations_run_on_the_pinned_owner() {
    let machine = host();
    if machine.cpus().len() < 2 {
        common::skip(&format!("needs 2 CPUs, this process may use {}", machine.cpus().len()));
        return;
    }
    let objects = Arc::new(registry::<Vec<OsCpu>>(&machine));
    objects.register(1, Vec::new(), 4096).unwrap();
    objects.pin(&1, Some(CpuId(1))).unwrap();
    assert_eq!(objects.placement(&1), Some(Placement::Core { owner: CpuId(1) }));
    let owner_os = machine.cpus()[1].os_id;
    std::thread::spawn(move || {
        sys::pin_current_thread(machine.cpus()[0].os_id).unwrap();
        for _ in 0..50 {
            objects.run(&1, |v| v.push(sys::current_os_cpu().unwrap())).unwrap();
        }
        let seen = objects.read(&1, |v| v.clone()).unwrap();
        assert_eq!(seen.len(), 50);
        assert!(seen.iter().all(|&cpu| cpu == owner_os), "ran on {seen:?}, owner is os cpu {owner_os}");
        // The thread is handed back where it was, like CoreTime after ct_end.
        assert_eq!(sys::affinity().unwrap(), vec![machine.cpus()[0].os_id]);
    })
    .join()
    .unwrap();
}

#[test]
fn operations_on_one_object_never_overlap() {
    let machine = host();
    let objects = Arc::new(registry::<u64>(&machine));
    objects.register(7, 0, 64).unwrap();
    let n = machine.cpus().len().max(2);
    if machine.cpus().len() > 1 {
        objects.pin(&7, Some(CpuId(1))).unwrap();
    }
    let inside = Arc::new(AtomicU32::new(0));
    let overlaps = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..2 * n)
        .map(|t| {
            let (objects, inside, overlaps) =
                (Arc::clone(&objects), Arc::clone(&inside), Arc::clone(&overlaps));
            std::thread::spawn(move || {
                for i in 0..3000 {
                    if i == 1500 && t == 0 {
                        // Halfway, give the object back to the policy: it runs locally again.
                        objects.pin(&7, None).unwrap();
                    }
                    objects
                        .run(&7, |count| {
                            if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                                overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                            *count += 1;
                            std::hint::spin_loop();
                            inside.fetch_sub(1, Ordering::SeqCst);
                        })
                        .unwrap();
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    assert_eq!(objects.read(&7, |c| *c).unwrap(), 3000 * 2 * n as u64);
}

#[test]
fn handles_carry_the_data_address_of_the_value_as_stored() {
    let machine = host();
    let plain = registry::<Vec<u64>>(&machine);
    assert_eq!(plain.register(1, vec![1, 2, 3], 24).unwrap().data_address(), None, "not asked for");

    let objects = registry::<Vec<u64>>(&machine).with_data_address(|v| v.as_ptr().cast());
    let handle = objects.register(1, vec![1, 2, 3], 24).unwrap();
    let stored = objects.read_handle(&handle, |v| v.as_ptr() as usize).unwrap() as *const u8;
    assert_eq!(handle.data_address(), Some(stored));
    assert_eq!(objects.handle(&1).unwrap().data_address(), Some(stored), "every handle of it");
    // A write that moves the data leaves a stale hint, which operations only prefetch.
    objects.run_handle(&handle, |v| v.extend(0..1000)).unwrap();
    assert_eq!(objects.read_handle(&handle, |v| v.len()).unwrap(), 1003);
    let batch = objects.read_batch([(&handle, |v: &Vec<u64>| v[2])]).unwrap();
    assert_eq!(batch, [3]);
}

#[test]
fn c_style_start_and_end_hold_the_lock() {
    let machine = host();
    let objects = Arc::new(registry::<()>(&machine));
    let handle = objects.register(3, (), 64).unwrap();
    let shared = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (objects, handle, shared) = (Arc::clone(&objects), handle.clone(), Arc::clone(&shared));
            std::thread::spawn(move || {
                for _ in 0..2000 {
                    let op = objects.start(&handle).unwrap();
                    // A non-atomic read-modify-write, safe only under the object's lock.
                    let v = shared.load(Ordering::Relaxed);
                    std::hint::spin_loop();
                    shared.store(v + 1, Ordering::Relaxed);
                    objects.end(op);
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    assert_eq!(shared.load(Ordering::Relaxed), 8000);
}

#[test]
fn expensive_objects_get_scheduled_after_monitoring() {
    let Some(machine) = host_with_two_cpus() else { return };
    let objects = registry::<Vec<u64>>(&machine);
    // Operations far longer than a hop: the policy puts them on trial (it does not judge the
    // trial's outcome here, which depends on this machine's caches).
    for key in 0..8 {
        objects.register(key, vec![1; 64 * 1024], 512 * 1024).unwrap();
    }
    // A few monitoring periods (the policy skips the first, cold ones).
    let mut moves = Vec::new();
    for _ in 0..6 {
        for _ in 0..20 {
            for key in 0..8 {
                objects.read(&key, |v| v.iter().sum::<u64>()).unwrap();
            }
        }
        moves.extend(objects.end_period());
    }
    assert!(!moves.is_empty(), "nothing was placed");
    let census = objects.census();
    assert_eq!(census.local + census.core + census.domain + census.replicated, 8);
    assert!(census.core + census.domain > 0, "{census:?}");
}

#[test]
fn tasks_hop_to_the_owner_and_back() {
    let Some(machine) = host_with_two_cpus() else { return };
    let rt = corehop_runtime::Runtime::builder().machine(machine.clone()).build().unwrap();
    let objects = Arc::new(registry::<Vec<CpuId>>(&machine));
    objects.register(1, Vec::new(), 4096).unwrap();
    objects.pin(&1, Some(CpuId(1))).unwrap();
    let tasks: Vec<_> = (0..4)
        .map(|i| {
            let objects = Arc::clone(&objects);
            let home = CpuId(i % 2);
            rt.spawn_on(home, move || {
                for _ in 0..200 {
                    objects.run(&1, |seen| seen.push(corehop_runtime::current_cpu())).unwrap();
                    assert_eq!(corehop_runtime::current_cpu(), home, "the task came back home");
                }
            })
            .unwrap()
        })
        .collect();
    tasks.into_iter().for_each(|t| t.join().unwrap());
    let seen = objects.read(&1, |v| v.clone()).unwrap();
    assert_eq!(seen.len(), 800);
    assert!(seen.iter().all(|&c| c == CpuId(1)));
}

#[test]
fn bad_requests_are_typed_errors() {
    let machine = host();
    let objects = registry::<u8>(&machine);
    let first = objects.register(1, 0, 8).unwrap();
    assert!(matches!(objects.register(1, 0, 8), Err(ObjectError::Duplicate(id)) if id == first.id()));
    assert!(matches!(objects.run(&2, |_| ()), Err(ObjectError::UnknownKey)));
    assert!(matches!(objects.pin(&2, Some(CpuId(0))), Err(ObjectError::UnknownKey)));
    assert!(matches!(objects.pin(&1, Some(CpuId(999))), Err(ObjectError::Policy(_))));
    objects.register_with(4, 0, ObjectHints { bytes: 64 << 30, ..ObjectHints::default() }).unwrap();
    let err = objects.pin(&4, Some(CpuId(0))).unwrap_err();
    assert!(err.to_string().contains("does not fit"), "{err}");
    let cpus = [CpuId(0)];
    let bare = Machine { caches: Vec::new(), ..machine };
    let err = Objects::<u8, u8>::new(&bare, &cpus, ObjectsConfig::default()).unwrap_err();
    assert!(err.to_string().contains("no data caches"), "{err}");
}

#[test]
fn yield_now_lets_a_waiting_task_run() {
    use std::sync::atomic::AtomicBool;
    let machine = host();
    let rt = corehop_runtime::Runtime::builder().machine(machine).build().unwrap();
    let other_ran = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&other_ran);
    // The first task spins (without hopping) until the second one, queued behind it on the
    // same CPU, has run: only yield_now lets it.
    let spinner = rt
        .spawn_on(CpuId(0), move || {
            let mut yields = 0u64;
            while !flag.load(Ordering::SeqCst) {
                corehop_runtime::yield_now().unwrap();
                yields += 1;
            }
            yields
        })
        .unwrap();
    let flag = Arc::clone(&other_ran);
    let other = rt.spawn_on(CpuId(0), move || flag.store(true, Ordering::SeqCst)).unwrap();
    other.join().unwrap();
    assert!(spinner.join().unwrap() >= 1);
    assert!(matches!(corehop_runtime::yield_now(), Err(corehop_runtime::Error::NotInTask)));
}

#[test]
fn a_panicking_operation_in_a_task_resumes_on_the_callers_own_thread() {
    // The op runs on the owner's worker; its panic must unwind the caller's frames only after
    // the task is back on the thread it came from.
    let machine = host();
    let (rt, home, owner) = runtime_with_home_and_owner(&machine);
    let objects = Arc::new(registry::<u64>(&machine));
    objects.register(3, 0, 64).unwrap();
    objects.pin(&3, Some(owner)).unwrap();
    let (same_thread, here, value) = rt
        .block_on(home, move || {
            let before = std::thread::current().id();
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                objects.run(&3, |v| {
                    *v += 1;
                    panic!("inside an operation")
                })
            }));
            assert!(caught.is_err());
            let value = objects.read(&3, |v| *v).unwrap();
            (std::thread::current().id() == before, corehop_runtime::current_cpu(), value)
        })
        .unwrap();
    assert!(same_thread);
    assert_eq!(here, home);
    assert_eq!(value, 1);
}

/// With many objects an end-of-period pass outlasts a short period; operations must not then
/// each run one (every operation would cost O(objects)): passes stay a small share of them.
#[test]
fn end_of_period_passes_do_not_follow_every_operation_when_objects_are_many() {
    let machine = host();
    let cpus: Vec<CpuId> = machine.cpus().iter().map(|c| c.id).collect();
    let config = ObjectsConfig { period: Duration::from_micros(1), ..ObjectsConfig::default() };
    let objects = Objects::<u32, u64>::new(&machine, &cpus, config).unwrap();
    const OBJECTS: u32 = 20_000;
    for key in 0..OBJECTS {
        objects.register(key, 0, 64).unwrap();
    }
    let ops = 20_000;
    for i in 0..ops {
        objects.run(&(i % OBJECTS), |v| *v += 1).unwrap();
    }
    let passes = objects.passes();
    assert!(passes >= 1, "the period never ended");
    // A pass over 20 000 objects takes far longer than an operation on one: at most one
    // pass per PASS_SHARE times its own duration, so passes are a few per cent of the
    // operations at most (before the fix: about one per operation).
    assert!(passes * 20 < ops as u64, "{passes} passes for {ops} operations");
    assert!(objects.period_ns() > 1_000, "the period in force did not grow");
}

/// A batch from a task: each operation runs exactly once, on its object's home CPU (the
/// owner's worker for a pinned object, the caller's CPU for an unplaced one), operations on
/// one object in the order given, and the values come back in the order given.
#[test]
fn batched_operations_run_once_each_on_their_objects_home() {
    let Some(machine) = host_with_two_cpus() else { return };
    let (rt, home, owner) = runtime_with_home_and_owner(&machine);
    let objects = Arc::new(registry::<Vec<(usize, CpuId)>>(&machine));
    let remote = objects.register(1, Vec::new(), 4096).unwrap();
    let local = objects.register(2, Vec::new(), 4096).unwrap();
    objects.pin(&1, Some(owner)).unwrap();
    let ops = 3 * corehop_runtime::objects::MAX_GROUP_OPS + 7;
    let values = {
        let objects = Arc::clone(&objects);
        rt.block_on(home, move || {
            let batch = (0..ops).map(|i| {
                let object = if i % 3 == 0 { &local } else { &remote };
                (object, move |seen: &mut Vec<(usize, CpuId)>| {
                    seen.push((i, corehop_runtime::current_cpu()));
                    i * 10
                })
            });
            let values = objects.run_batch(batch).unwrap();
            assert_eq!(corehop_runtime::current_cpu(), home, "the caller stays where it is");
            values
        })
        .unwrap()
    };
    assert_eq!(values, (0..ops).map(|i| i * 10).collect::<Vec<_>>());
    let remote_seen = objects.read(&1, |v| v.clone()).unwrap();
    let local_seen = objects.read(&2, |v| v.clone()).unwrap();
    let order = |seen: &[(usize, CpuId)]| seen.iter().map(|&(i, _)| i).collect::<Vec<_>>();
    assert_eq!(order(&remote_seen), (0..ops).filter(|i| i % 3 != 0).collect::<Vec<_>>());
    assert_eq!(order(&local_seen), (0..ops).filter(|i| i % 3 == 0).collect::<Vec<_>>());
    assert!(remote_seen.iter().all(|&(_, cpu)| cpu == owner), "{remote_seen:?}");
    assert!(local_seen.iter().all(|&(_, cpu)| cpu == home), "{local_seen:?}");
}

/// An object routed for batches only: a batch's operations on it run on its owner, an
/// operation issued alone runs where its caller is; either way once, in order.
#[test]
fn an_object_routed_for_batches_is_left_alone_by_single_operations() {
    let Some(machine) = host_with_two_cpus() else { return };
    let (rt, home, owner) = runtime_with_home_and_owner(&machine);
    let objects = Arc::new(registry::<Vec<(usize, CpuId)>>(&machine));
    objects.register(1, Vec::new(), 4096).unwrap();
    objects.pin_via(&1, Some(owner), Via::Batches).unwrap();
    let object = objects.handle(&1).unwrap();
    let record =
        |i: usize| move |seen: &mut Vec<(usize, CpuId)>| seen.push((i, corehop_runtime::current_cpu()));
    {
        let objects = Arc::clone(&objects);
        rt.block_on(home, move || {
            objects.run(&1, record(0)).unwrap();
            objects.run_batch((1..40).map(|i| (&object, record(i)))).unwrap();
            objects.run(&1, record(40)).unwrap();
        })
        .unwrap();
    }
    let seen = objects.read(&1, |v| v.clone()).unwrap();
    assert_eq!(seen.iter().map(|&(i, _)| i).collect::<Vec<_>>(), (0..=40).collect::<Vec<_>>());
    for &(i, cpu) in &seen {
        let expected = if i == 0 || i == 40 { home } else { owner };
        assert_eq!(cpu, expected, "operation {i}: {seen:?}");
    }
    // Given back to the policy: every operation runs where it is called again.
    objects.pin(&1, None).unwrap();
    let object = objects.handle(&1).unwrap();
    let objects2 = Arc::clone(&objects);
    let cpus = rt
        .block_on(home, move || {
            objects2.run_batch((0..8).map(|_| (&object, |_: &mut Vec<_>| corehop_runtime::current_cpu())))
        })
        .unwrap()
        .unwrap();
    assert!(cpus.iter().all(|&c| c == home), "{cpus:?}");
}

/// Outside a task a batch runs each operation as `run` does: on the owner, once, in order.
#[test]
fn a_batch_from_a_plain_thread_runs_each_operation_on_the_owner() {
    let machine = host();
    if machine.cpus().len() < 2 {
        common::skip(&format!("needs 2 CPUs, this process may use {}", machine.cpus().len()));
        return;
    }
    let objects = Arc::new(registry::<Vec<(usize, OsCpu)>>(&machine));
    let object = objects.register(1, Vec::new(), 4096).unwrap();
    objects.pin(&1, Some(CpuId(1))).unwrap();
    let owner_os = machine.cpus()[1].os_id;
    let objects_too = Arc::clone(&objects);
    std::thread::spawn(move || {
        sys::pin_current_thread(machine.cpus()[0].os_id).unwrap();
        let batch = (0..20).map(|i| {
            (&object, move |v: &mut Vec<(usize, OsCpu)>| v.push((i, sys::current_os_cpu().unwrap())))
        });
        assert_eq!(objects_too.run_batch(batch).unwrap().len(), 20);
        assert_eq!(sys::affinity().unwrap(), vec![machine.cpus()[0].os_id]);
    })
    .join()
    .unwrap();
    let seen = objects.read(&1, |v| v.clone()).unwrap();
    assert_eq!(seen.iter().map(|&(i, _)| i).collect::<Vec<_>>(), (0..20).collect::<Vec<_>>());
    assert!(seen.iter().all(|&(_, cpu)| cpu == owner_os), "{seen:?}");
}

/// A panic in an operation served on another CPU resumes in the caller, on its own CPU, and
/// the object's lock is free afterwards.
#[test]
fn a_panic_in_a_batched_operation_resumes_in_the_caller() {
    let machine = host();
    let (rt, home, owner) = runtime_with_home_and_owner(&machine);
    let objects = Arc::new(registry::<u64>(&machine));
    let object = objects.register(3, 0, 64).unwrap();
    objects.pin(&3, Some(owner)).unwrap();
    let objects_too = Arc::clone(&objects);
    let here = rt
        .block_on(home, move || {
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                objects_too.run_batch((0..4u64).map(|i| {
                    (&object, move |v: &mut u64| {
                        *v += 1;
                        assert!(i != 2, "inside a batched operation");
                    })
                }))
            }));
            assert!(caught.is_err());
            corehop_runtime::current_cpu()
        })
        .unwrap();
    assert_eq!(here, home);
    // The operations before the one that panicked ran, the lock is free for the next.
    assert_eq!(objects.run(&3, |v| *v).unwrap(), 3);
}

/// An object's CPU without a worker in the caller's runtime: a typed error, and nothing ran.
#[test]
fn a_batch_to_a_cpu_without_a_worker_runs_nothing() {
    let Some(machine) = host_with_two_cpus() else { return };
    let cpus: Vec<CpuId> = machine.cpus().iter().map(|c| c.id).collect();
    let rt = corehop_runtime::Runtime::builder().machine(machine.clone()).cpus([cpus[0]]).build().unwrap();
    let objects = Arc::new(registry::<u64>(&machine));
    let (here, there) = (objects.register(1, 0, 64).unwrap(), objects.register(2, 0, 64).unwrap());
    objects.pin(&2, Some(cpus[1])).unwrap();
    let objects_too = Arc::clone(&objects);
    let err = rt
        .block_on(cpus[0], move || {
            objects_too.run_batch([&here, &there].map(|o| (o, |v: &mut u64| *v += 1))).unwrap_err()
        })
        .unwrap();
    assert!(matches!(err, ObjectError::Hop { cpu, .. } if cpu == cpus[1]), "{err}");
    assert_eq!((objects.read(&1, |v| *v).unwrap(), objects.read(&2, |v| *v).unwrap()), (0, 0));
}

/// Random batches over objects placed at random (where the caller is, on either CPU): every
/// operation runs exactly once, on its object's home, operations on one object in the order
/// given, and the values come back in the order given.
#[test]
fn random_batches_run_every_operation_once_at_its_home() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let machine = host();
    let rt = corehop_runtime::Runtime::builder().machine(machine.clone()).build().unwrap();
    let cpus = rt.cpus().to_vec();
    let objects = Arc::new(registry::<Vec<(u32, CpuId)>>(&machine));
    let handles: Vec<_> = (0..4).map(|k| objects.register(k, Vec::new(), 4096).unwrap()).collect();
    let cases = (
        proptest::collection::vec(proptest::option::of(0..cpus.len()), 4),
        proptest::collection::vec(0..4usize, 0..700),
        0..cpus.len(),
    );
    let mut runner = TestRunner::new(Config { cases: 24, ..Config::default() });
    runner
        .run(&cases, |(homes, targets, caller)| {
            for (k, home) in homes.iter().enumerate() {
                objects.pin(&(k as u32), home.map(|i| cpus[i])).unwrap();
                objects.run(&(k as u32), Vec::clear).unwrap();
            }
            let (objects_too, handles_too, targets_too) =
                (Arc::clone(&objects), handles.clone(), targets.clone());
            let values = rt
                .block_on(cpus[caller], move || {
                    let batch = targets_too.iter().enumerate().map(|(i, &k)| {
                        (&handles_too[k], move |seen: &mut Vec<(u32, CpuId)>| {
                            seen.push((i as u32, corehop_runtime::current_cpu()));
                            i as u32
                        })
                    });
                    objects_too.run_batch(batch).unwrap()
                })
                .unwrap();
            prop_assert_eq!(values, (0..targets.len() as u32).collect::<Vec<_>>());
            for (k, home) in homes.iter().enumerate() {
                let seen = objects.read(&(k as u32), Vec::clone).unwrap();
                let expected: Vec<u32> =
                    targets.iter().enumerate().filter(|&(_, &t)| t == k).map(|(i, _)| i as u32).collect();
                prop_assert_eq!(seen.iter().map(|&(i, _)| i).collect::<Vec<_>>(), expected);
                let at = cpus[home.unwrap_or(caller)];
                prop_assert!(
                    seen.iter().all(|&(_, cpu)| cpu == at),
                    "object {} homed {:?}: {:?}",
                    k,
                    home,
                    seen
                );
            }
            Ok(())
        })
        .unwrap();
}

/// An owner whose worker does not serve (a task holds it without yielding, as a descheduled
/// vCPU would): the caller takes its request back after `take_back_after` and runs it itself,
/// once; the owner's worker, when it gets to the request, runs nothing.
#[test]
fn a_request_its_cpu_does_not_start_is_taken_back_and_run_once() {
    use std::sync::atomic::AtomicBool;
    let Some(machine) = host_with_two_cpus() else { return };
    let (rt, home, owner) = runtime_with_home_and_owner(&machine);
    let config = ObjectsConfig {
        period: Duration::from_secs(3600),
        take_back_after: Some(Duration::from_millis(2)),
        ..ObjectsConfig::default()
    };
    let objects = Arc::new(Objects::<u32, Vec<CpuId>>::new(&machine, rt.cpus(), config).unwrap());
    let object = objects.register(1, Vec::new(), 4096).unwrap();
    objects.pin(&1, Some(owner)).unwrap();
    let (holding, release) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let hog = {
        let (holding, release) = (Arc::clone(&holding), Arc::clone(&release));
        rt.spawn_on(owner, move || {
            holding.store(true, Ordering::SeqCst);
            while !release.load(Ordering::SeqCst) {
                std::hint::spin_loop();
            }
        })
        .unwrap()
    };
    while !holding.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    let objects_too = Arc::clone(&objects);
    let values = rt
        .block_on(home, move || {
            let batch = (0..10u32).map(|i| {
                (&object, move |seen: &mut Vec<CpuId>| {
                    seen.push(corehop_runtime::current_cpu());
                    i
                })
            });
            objects_too.run_batch(batch).unwrap()
        })
        .unwrap();
    release.store(true, Ordering::SeqCst);
    hog.join().unwrap();
    assert_eq!(values, (0..10).collect::<Vec<_>>());
    // The owner has served the request by now (the hog is gone): it must not have run it.
    rt.block_on(owner, || ()).unwrap();
    let seen = objects.read(&1, Vec::clone).unwrap();
    assert_eq!(seen, vec![home; 10]);
}

/// An operation cannot hop while it holds its object's lock, alone or in a batch, and hops
/// are allowed again once it is over.
#[test]
fn an_operation_cannot_hop_while_it_holds_its_object() {
    let Some(machine) = host_with_two_cpus() else { return };
    let (rt, home, owner) = runtime_with_home_and_owner(&machine);
    let objects = Arc::new(registry::<u32>(&machine));
    let object = objects.register(1, 0, 64).unwrap();
    let refused = move |_: &u32| {
        // SAFETY: the hop is refused (the zone), so nothing here ever runs on another thread.
        matches!(unsafe { corehop_runtime::hop(owner) }, Err(corehop_runtime::Error::HopForbidden { .. }))
    };
    let (single, batched, after) = rt
        .block_on(home, move || {
            // Several: the first of a thread is sampled (timed), the next ones are not.
            let single = (0..3).all(|_| objects.read(&1, refused).unwrap());
            let batched = objects.read_batch([(&object, refused), (&object, refused)]).unwrap();
            // SAFETY: nothing thread-bound is live here; the task comes straight back.
            let after = unsafe { corehop_runtime::hop(owner) }.is_ok()
                && unsafe { corehop_runtime::hop(home) }.is_ok();
            (single, batched, after)
        })
        .unwrap();
    assert!(single && batched.iter().all(|&r| r), "{single} {batched:?}");
    assert!(after, "hops are allowed after the operations");
}

#[test]
fn objects_of_any_declared_size_are_counted_without_overflow() {
    // A size no cache holds stays where it is called; its byte counts must not overflow.
    let machine = host();
    let objects = registry::<u64>(&machine);
    for key in 0..4 {
        objects.register(key, 0, u64::MAX).unwrap();
    }
    for _ in 0..5 {
        for _ in 0..500 {
            for key in 0..4 {
                objects.run(&key, |n| *n += 1).unwrap();
            }
        }
        objects.end_period();
    }
    assert_eq!(objects.census().local, 4);
    assert_eq!(objects.read(&3, |n| *n).unwrap(), 2500);
}
