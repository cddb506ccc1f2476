//! The SMT runtime on a described SMT core: this machine's two CPUs declared siblings of one
//! core, so AMP's reserved context is real CPU 1 and the application context real CPU 0.

mod common;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corehop_policy::smt::SmtLayout;
use corehop_policy::smt::{Mode, ModeError};
use corehop_runtime::smt::{service_call, ContextState, SmtError, SmtRuntime, Step, StepCx};
use corehop_runtime::sys;
use corehop_topology::{CoreClass, Cpu, CpuId, Machine, OsCpu};

/// A machine of `cores` physical cores listed as (kernel CPU ids of its contexts).
fn described(cores: &[&[OsCpu]]) -> Machine {
    let mut cpus = Vec::new();
    for (core, os_ids) in cores.iter().enumerate() {
        for &os_id in *os_ids {
            let id = CpuId(cpus.len());
            cpus.push(Cpu {
                id,
                os_id,
                core,
                package: 0,
                class: CoreClass::Uniform,
                speed: 1.0,
                emulated_speed: None,
            });
        }
    }
    Machine { name: "described".into(), source: "test".into(), cpus, caches: Vec::new(), waitpkg: false }
}

/// The two kernel CPUs to declare siblings, or `None` (with the reason printed) if this
/// process may use fewer than two.
fn two_cpus() -> Option<(OsCpu, OsCpu)> {
    let cpus = sys::affinity().expect("sched_getaffinity");
    if cpus.len() < 2 {
        common::skip(&format!("needs 2 CPUs to map an SMT core onto, this process may use {cpus:?}"));
        return None;
    }
    Some((cpus[0], cpus[1]))
}

fn smt_core(mode: Mode) -> Option<(SmtRuntime, OsCpu, OsCpu)> {
    let (a, b) = two_cpus()?;
    let rt = SmtRuntime::builder().machine(described(&[&[a, b]])).mode(mode).build().expect("runtime starts");
    Some((rt, a, b))
}

const APP: CpuId = CpuId(0);
const RESERVED: CpuId = CpuId(1);

#[test]
fn amp_places_apps_on_the_app_context_and_service_on_the_reserved_one() {
    let Some((rt, app_os, reserved_os)) = smt_core(Mode::Amp) else { return };
    let rt = Arc::new(rt);
    assert_eq!(rt.layout().reserved(), vec![RESERVED]);
    let steps: Arc<Mutex<Vec<(StepCx, OsCpu)>>> = Arc::default();
    let service_cpus: Arc<Mutex<Vec<OsCpu>>> = Arc::default();
    for task in 0..6 {
        let (steps, service_cpus, rt2) = (steps.clone(), service_cpus.clone(), rt.clone());
        let mut left = 50;
        rt.spawn(None, move |cx| {
            steps.lock().unwrap().push((cx, sys::current_os_cpu().unwrap()));
            if left % 10 == task % 10 {
                let service_cpus = service_cpus.clone();
                rt2.submit_service(cx.cpu, move || {
                    service_cpus.lock().unwrap().push(sys::current_os_cpu().unwrap())
                });
            }
            left -= 1;
            if left == 0 {
                Step::Done
            } else {
                Step::Continue
            }
        });
    }
    rt.wait_idle();
    let steps = steps.lock().unwrap();
    assert_eq!(steps.len(), 6 * 50);
    for (cx, os) in steps.iter() {
        assert_eq!((cx.cpu, cx.mode, *os), (APP, Mode::Amp, app_os), "app step off the application context");
    }
    let service_cpus = service_cpus.lock().unwrap();
    assert_eq!(service_cpus.len(), 6 * 5);
    assert!(service_cpus.iter().all(|&os| os == reserved_os), "service ran off the reserved context");
    let stats = rt.stats();
    assert_eq!((stats[1].reserved, stats[1].app_steps), (true, 0));
    assert_eq!(stats[0].service_runs, 0);
}

#[test]
fn smp_runs_apps_on_both_contexts() {
    let Some((rt, _, _)) = smt_core(Mode::Smp) else { return };
    let seen: Arc<Mutex<std::collections::BTreeSet<CpuId>>> = Arc::default();
    for _ in 0..4 {
        let seen = seen.clone();
        let started = Instant::now();
        // Steps long enough that both contexts must pick tasks up.
        rt.spawn(None, move |cx| {
            seen.lock().unwrap().insert(cx.cpu);
            let t = Instant::now();
            while t.elapsed() < Duration::from_micros(200) {}
            if started.elapsed() > Duration::from_millis(200) && seen.lock().unwrap().len() == 2 {
                Step::Done
            } else {
                Step::Continue
            }
        });
    }
    rt.wait_idle();
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[test]
fn mode_switches_under_load_lose_and_duplicate_nothing() {
    let Some((rt, _, _)) = smt_core(Mode::Smp) else { return };
    const TASKS: usize = 24;
    const STEPS: u64 = 300;
    let counters: Arc<Vec<AtomicU64>> = Arc::new((0..TASKS).map(|_| AtomicU64::new(0)).collect());
    let done: Arc<Vec<AtomicU64>> = Arc::new((0..TASKS).map(|_| AtomicU64::new(0)).collect());
    let amp_on_reserved = Arc::new(AtomicU64::new(0));
    // Tasks may finish only once the modes have switched both ways under their load (a fast
    // machine would otherwise finish the load before the first switch).
    let switched_both_ways = Arc::new(AtomicBool::new(false));
    let homes = [None, Some(Mode::Amp), Some(Mode::Smp)];
    for t in 0..TASKS {
        let (counters, done, bad) = (counters.clone(), done.clone(), amp_on_reserved.clone());
        let may_finish = switched_both_ways.clone();
        rt.spawn(homes[t % 3], move |cx| {
            if cx.mode == Mode::Amp && cx.cpu == RESERVED {
                bad.fetch_add(1, SeqCst);
            }
            let n = counters[t].fetch_add(1, SeqCst) + 1;
            std::hint::black_box((0..200).sum::<u64>());
            if n >= STEPS && may_finish.load(SeqCst) {
                done[t].fetch_add(1, SeqCst);
                Step::Done
            } else {
                Step::Continue
            }
        });
    }
    let service_runs = Arc::new(AtomicU64::new(0));
    let mut submitted = 0;
    let mut switches = 0;
    let mut mode = Mode::Smp;
    while done.iter().any(|d| d.load(SeqCst) == 0) {
        mode = mode.other();
        rt.set_mode(mode).unwrap();
        switches += 1;
        if switches >= 2 {
            switched_both_ways.store(true, SeqCst);
        }
        if mode == Mode::Amp {
            assert_ne!(
                rt.context_state(RESERVED),
                Some(ContextState::RunningApp),
                "app step on reserved after switch"
            );
        }
        for _ in 0..3 {
            let runs = service_runs.clone();
            rt.submit_service(APP, move || {
                runs.fetch_add(1, SeqCst);
            });
            submitted += 1;
        }
        std::thread::sleep(Duration::from_micros(300));
    }
    rt.wait_idle();
    assert!(switches >= 2, "the load outlived at least one switch each way ({switches})");
    for t in 0..TASKS {
        assert!(counters[t].load(SeqCst) >= STEPS, "task {t} finished early");
        assert_eq!(done[t].load(SeqCst), 1, "task {t} finished other than once");
    }
    assert_eq!(service_runs.load(SeqCst), submitted);
    assert_eq!(amp_on_reserved.load(SeqCst), 0, "an app step started on the reserved context under AMP");
    // Every step the tasks counted ran exactly once: the runtime counted the same number.
    let stats = rt.stats();
    let steps: u64 = counters.iter().map(|c| c.load(SeqCst)).sum();
    assert_eq!(stats.iter().map(|s| s.app_steps).sum::<u64>(), steps);
    assert_eq!(stats.iter().map(|s| s.service_runs).sum::<u64>(), submitted);
}

/// utime + stime of a thread of this process, in clock ticks.
fn cpu_ticks(tid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).expect("/proc stat");
    // Fields after the command name (which is in parentheses): utime and stime are the 12th and 13th.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[test]
fn reserved_context_sleeps_without_service_work() {
    let Some((rt, _, reserved_os)) = smt_core(Mode::Amp) else { return };
    let deadline = Instant::now() + Duration::from_secs(5);
    while rt.context_state(RESERVED) != Some(ContextState::Sleeping) {
        assert!(Instant::now() < deadline, "reserved context never went to sleep");
        std::thread::yield_now();
    }
    let tid = rt.stats()[1].tid;
    let before = cpu_ticks(tid);
    let sleeps_before = rt.stats()[1].sleeps;
    // Keep the application context busy for a while; the reserved one has nothing to do.
    let started = Instant::now();
    rt.spawn(
        None,
        move |_| if started.elapsed() < Duration::from_millis(300) { Step::Continue } else { Step::Done },
    );
    rt.wait_idle();
    let spent = cpu_ticks(tid) - before;
    // A spinning context would burn ~30 ticks (at 100 Hz) here; a sleeping one none.
    assert!(spent <= 3, "reserved context used {spent} ticks of CPU while it had no service work");
    assert_eq!(rt.context_state(RESERVED), Some(ContextState::Sleeping));
    let sleeps = rt.stats()[1].sleeps;
    assert_eq!(sleeps, sleeps_before, "the reserved context was woken for application work it may not run");
    // Service work wakes it, runs there, and it sleeps again.
    let ran_on = rt.offload(APP, || sys::current_os_cpu().unwrap());
    assert_eq!(ran_on, reserved_os);
    while rt.context_state(RESERVED) != Some(ContextState::Sleeping) {
        assert!(Instant::now() < deadline + Duration::from_secs(5), "reserved context stayed awake");
        std::thread::yield_now();
    }
    assert!(rt.stats()[1].sleeps > sleeps);
}

#[test]
fn offload_goes_to_the_sibling_in_amp_and_runs_inline_in_smp() {
    let Some((rt, app_os, reserved_os)) = smt_core(Mode::Amp) else { return };
    let rt = Arc::new(rt);
    // One task offloads a call: (its mode, the caller's OS CPU, the call's OS CPU).
    let offload_once = || {
        let result: Arc<Mutex<Option<(Mode, OsCpu, OsCpu)>>> = Arc::default();
        let (rt2, r) = (rt.clone(), result.clone());
        rt.spawn(None, move |cx| {
            let here = sys::current_os_cpu().unwrap();
            let there = rt2.offload(cx.cpu, || sys::current_os_cpu().unwrap());
            *r.lock().unwrap() = Some((cx.mode, here, there));
            Step::Done
        });
        rt.wait_idle();
        let ran = result.lock().unwrap().take();
        ran.expect("the task ran")
    };
    assert_eq!(offload_once(), (Mode::Amp, app_os, reserved_os));
    rt.set_mode(Mode::Smp).unwrap();
    let (mode, here, there) = offload_once();
    assert_eq!((mode, here), (Mode::Smp, there), "SMP runs the call where the caller is");
}

#[test]
fn amp_without_an_smt_core_is_a_typed_error() {
    let Some((a, b)) = two_cpus() else { return };
    let two_cores = described(&[&[a], &[b]]);
    let err = SmtRuntime::builder().machine(two_cores.clone()).mode(Mode::Amp).build().err().unwrap();
    assert!(matches!(err, SmtError::Policy(ModeError::NoSmtCore { .. })), "{err}");
    let rt = SmtRuntime::builder().machine(two_cores).build().unwrap();
    assert!(matches!(rt.set_mode(Mode::Amp), Err(SmtError::Policy(ModeError::NoSmtCore { .. }))));
    assert_eq!(rt.mode(), Mode::Smp);
    assert!(matches!(SmtRuntime::builder().build(), Err(SmtError::NoMachine)));
}

#[test]
fn pinning_to_a_cpu_this_process_cannot_use_is_a_typed_error() {
    let Some((a, _)) = two_cpus() else { return };
    let err = SmtRuntime::builder().machine(described(&[&[a, OsCpu(4000)]])).build().err().unwrap();
    assert!(matches!(err, SmtError::Pin { os_id: OsCpu(4000), .. }), "{err}");
    assert!(err.to_string().contains("kernel CPU 4000"));
}

#[test]
fn set_mode_from_a_task_is_refused_and_panics_are_contained() {
    let Some((rt, _, _)) = smt_core(Mode::Smp) else { return };
    let rt = Arc::new(rt);
    let refused = Arc::new(Mutex::new(None));
    let (rt2, r) = (rt.clone(), refused.clone());
    rt.spawn(None, move |_| {
        *r.lock().unwrap() = Some(matches!(rt2.set_mode(Mode::Amp), Err(SmtError::FromWorker)));
        Step::Done
    });
    rt.spawn(None, |_| panic!("a task that panics"));
    rt.wait_idle();
    assert_eq!(*refused.lock().unwrap(), Some(true));
    assert_eq!(rt.stats().iter().map(|s| s.panics).sum::<u64>(), 1);
    let ran = Arc::new(AtomicU64::new(0));
    let r = ran.clone();
    rt.spawn(None, move |_| {
        r.fetch_add(1, SeqCst);
        Step::Done
    });
    rt.wait_idle();
    assert_eq!(ran.load(SeqCst), 1, "workers survive a panicking task");
}

#[test]
fn hop_runtime_tasks_send_service_calls_to_the_reserved_sibling_in_amp() {
    let Some((a, b)) = two_cpus() else { return };
    let machine = described(&[&[a, b]]);
    let layout = SmtLayout::from_machine(&machine);
    let rt = corehop_runtime::Runtime::builder().machine(machine).build().expect("hop runtime starts");
    let (l1, l2) = (layout.clone(), layout.clone());
    let amp = rt
        .block_on(APP, move || {
            let there = service_call(&l1, Mode::Amp, || {
                (corehop_runtime::current_cpu(), sys::current_os_cpu().unwrap())
            });
            (there.expect("delegated"), corehop_runtime::current_cpu())
        })
        .unwrap();
    assert_eq!(amp, ((RESERVED, b), APP), "ran on the reserved sibling, task came back");
    let smp = rt.block_on(APP, move || service_call(&l2, Mode::Smp, corehop_runtime::current_cpu)).unwrap();
    assert_eq!(smp.unwrap(), APP);
    assert!(matches!(service_call(&layout, Mode::Amp, || ()), Err(corehop_runtime::Error::NotInTask)));
}
