//! Start-up errors, panics, joins and the shutdown protocol.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use corehop_runtime::{no_hop_zone, on, CpuId, Error, JoinError, Mechanism, Runtime, Wake};
use corehop_topology::{Machine, OsCpu};

/// `hop` for these tests: their tasks hold nothing tied to an OS thread across a hop (no
/// thread-local references, no lock guards), which is `corehop_runtime::hop`'s contract.
fn hop(cpu: CpuId) -> Result<(), Error> {
    // SAFETY: see above.
    unsafe { corehop_runtime::hop(cpu) }
}

fn park_runtime() -> Runtime {
    Runtime::builder().wake(Wake::Park).build().unwrap()
}

fn machine_with_os_ids(os_ids: &[OsCpu]) -> Machine {
    Machine::uniform("test", os_ids, 1)
}

#[test]
fn bad_cpus_are_typed_errors_naming_the_problem() {
    let err = Runtime::builder().cpus([CpuId(999)]).build().unwrap_err();
    assert!(matches!(err, Error::UnknownCpu { cpu: CpuId(999), .. }), "{err}");
    assert!(err.to_string().contains("cpu999"));

    let err = Runtime::builder().cpus([CpuId(0), CpuId(0)]).build().unwrap_err();
    assert!(matches!(err, Error::DuplicateCpu { cpu: CpuId(0) }), "{err}");

    let err = Runtime::builder().cpus([]).build().unwrap_err();
    assert!(matches!(err, Error::NoCpus), "{err}");

    let err = Runtime::builder().stack_size(100).build().unwrap_err();
    assert!(matches!(err, Error::StackTooSmall { size: 100, .. }), "{err}");
    assert!(err.to_string().contains("100 bytes is too small"), "{err}");
    for size in [corehop_runtime::MAX_STACK_SIZE + 1, usize::MAX] {
        let err = Runtime::builder().stack_size(size).build().unwrap_err();
        assert!(matches!(err, Error::StackTooLarge { size: s, .. } if s == size), "{err}");
    }
    // The smallest accepted stack runs a task that hops.
    let rt = Runtime::builder().wake(Wake::Park).stack_size(corehop_runtime::MIN_STACK_SIZE).build().unwrap();
    let (a, b) = (rt.cpus()[0], *rt.cpus().last().unwrap());
    assert_eq!(rt.block_on(a, move || on(b, || 40 + 2).unwrap()).unwrap(), 42);

    // A machine description whose CPU this process may not run on.
    let err = Runtime::builder().machine(machine_with_os_ids(&[OsCpu(1000)])).build().unwrap_err();
    assert!(matches!(err, Error::CpuNotAllowed { cpu: CpuId(0), os_id: OsCpu(1000), .. }), "{err}");
    assert!(err.to_string().contains("kernel CPU 1000"));

    let rt = Runtime::builder().cpus([CpuId(0)]).wake(Wake::Park).build().unwrap();
    let err = rt.spawn_on(CpuId(5), || ()).unwrap_err();
    assert!(
        matches!(&err, Error::UnknownCpu { cpu: CpuId(5), available } if available == &[CpuId(0)]),
        "{err}"
    );
    let inside =
        rt.block_on(CpuId(0), || (hop(CpuId(5)).unwrap_err().to_string(), on(CpuId(7), || 1).is_err()));
    let (msg, on_failed) = inside.unwrap();
    assert!(msg.contains("cpu5") && on_failed, "{msg}");
}

#[test]
fn hop_and_on_outside_a_task_are_errors() {
    assert!(matches!(hop(CpuId(0)), Err(Error::NotInTask)));
    assert!(matches!(on(CpuId(0), || 1), Err(Error::NotInTask)));
    assert!(matches!(corehop_runtime::spawn_on(CpuId(0), || 1), Err(Error::NotInTask)));
}

#[test]
fn a_panic_reaches_the_joiner_and_the_worker_survives() {
    let rt = park_runtime();
    let cpu = rt.cpus()[0];
    let err = rt.spawn_on(cpu, || -> u32 { panic!("task failed on purpose") }).unwrap().join().unwrap_err();
    assert!(err.is_panic());
    assert!(err.to_string().contains("task failed on purpose"), "{err}");
    let payload = err.into_panic().unwrap();
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"task failed on purpose"));
    // The same worker runs the next task.
    assert_eq!(rt.spawn_on(cpu, || 41 + 1).unwrap().join().unwrap(), 42);
    // block_on re-raises the panic in the caller.
    let caught =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.block_on(cpu, || panic!("again"))));
    assert!(caught.is_err());
    assert_eq!(rt.block_on(cpu, || 7).unwrap(), 7);
}

#[test]
fn many_tasks_all_finish_with_their_values() {
    let rt = park_runtime();
    let cpus = rt.cpus().to_vec();
    let handles: Vec<_> = (0..200u64)
        .map(|i| {
            let cpus = cpus.clone();
            rt.spawn_on(cpus[i as usize % cpus.len()], move || {
                hop(cpus[(i as usize + 1) % cpus.len()]).unwrap();
                i * 2
            })
            .unwrap()
        })
        .collect();
    let total: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(total, (0..200u64).map(|i| i * 2).sum());
}

#[test]
fn shutdown_cancels_unstarted_tasks_and_lets_running_ones_finish() {
    // One worker, so queued tasks cannot start while the first one runs.
    let rt = Runtime::builder().cpus([CpuId(0)]).wake(Wake::Park).build().unwrap();
    let started = Arc::new(AtomicBool::new(false));
    let queued_ran = Arc::new(AtomicUsize::new(0));
    let running = {
        let started = started.clone();
        rt.spawn_on(CpuId(0), move || {
            started.store(true, Ordering::SeqCst);
            let mut hops = 0u64;
            // A service loop: runs until its hop is refused by the shutdown.
            loop {
                match hop(CpuId(0)) {
                    Ok(()) => hops += 1,
                    Err(Error::ShutDown) => return hops,
                    Err(e) => panic!("unexpected {e}"),
                }
            }
        })
        .unwrap()
    };
    let queued: Vec<_> = (0..5)
        .map(|_| {
            let ran = queued_ran.clone();
            rt.spawn_on(CpuId(0), move || ran.fetch_add(1, Ordering::SeqCst)).unwrap()
        })
        .collect();
    while !started.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    rt.shutdown();
    assert!(rt.is_shut_down());
    assert!(running.join().is_ok(), "the running task finishes with its value");
    for q in queued {
        assert!(q.join().unwrap_err().is_cancelled());
    }
    assert_eq!(queued_ran.load(Ordering::SeqCst), 0, "cancelled closures never ran");
    assert!(matches!(rt.spawn_on(CpuId(0), || ()), Err(Error::ShutDown)));
    assert!(matches!(rt.block_on(CpuId(0), || ()), Err(Error::ShutDown)));
    rt.shutdown(); // idempotent
}

#[test]
fn on_under_way_at_shutdown_comes_back_with_its_value() {
    let rt = park_runtime();
    let cpus = rt.cpus().to_vec();
    let (a, b) = (cpus[0], *cpus.last().unwrap());
    let inside = Arc::new(AtomicBool::new(false));
    let release = Arc::new(AtomicBool::new(false));
    let task = {
        let (inside, release) = (inside.clone(), release.clone());
        rt.spawn_on(a, move || {
            let v = on(b, || {
                inside.store(true, Ordering::SeqCst);
                while !release.load(Ordering::SeqCst) {
                    std::hint::spin_loop();
                }
                5
            });
            (v.ok(), corehop_runtime::current_cpu(), hop(b).is_err())
        })
        .unwrap()
    };
    while !inside.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    let shutter = std::thread::spawn(move || rt.shutdown());
    std::thread::sleep(std::time::Duration::from_millis(20));
    release.store(true, Ordering::SeqCst);
    let (value, home, later_hop_refused) = task.join().unwrap();
    shutter.join().unwrap();
    assert_eq!(value, Some(5));
    assert_eq!(home, a);
    assert!(later_hop_refused || a == b);
}

#[test]
fn dropping_the_runtime_shuts_it_down() {
    let rt = park_runtime();
    let h = rt.spawn_on(rt.cpus()[0], || 3).unwrap();
    assert_eq!(h.join().unwrap(), 3);
    drop(rt);
}

#[test]
fn block_on_from_a_worker_is_refused() {
    let rt = Arc::new(park_runtime());
    let cpu = rt.cpus()[0];
    let inner = rt.clone();
    let err =
        rt.block_on(cpu, move || matches!(inner.block_on(cpu, || 1), Err(Error::BlockingInTask))).unwrap();
    assert!(err);
    // Runtime::on inside a task delegates by hopping instead.
    let inner = rt.clone();
    assert_eq!(rt.block_on(cpu, move || inner.on(cpu, || 9).unwrap()).unwrap(), 9);
}

#[test]
fn hops_inside_a_no_hop_zone_are_refused() {
    let rt = Runtime::builder().mechanism(Mechanism::Handoff).wake(Wake::Park).build().unwrap();
    let cpus = rt.cpus().to_vec();
    let (a, b) = (cpus[0], *cpus.last().unwrap());
    let outcome = rt
        .block_on(a, move || {
            let lock = std::sync::Mutex::new(1);
            let refused = {
                let _zone = no_hop_zone();
                let _guard = lock.lock().unwrap();
                let nested = {
                    let _inner = no_hop_zone();
                    matches!(hop(b), Err(Error::HopForbidden { .. }))
                };
                nested && matches!(on(b, || ()), Err(Error::HopForbidden { .. }))
            };
            (refused, hop(b).is_ok())
        })
        .unwrap();
    assert_eq!(outcome, (true, true));
}

#[test]
fn join_error_messages() {
    let rt = park_runtime();
    let handle = rt.spawn_on(rt.cpus()[0], || -> () { panic!("{}", String::from("formatted")) }).unwrap();
    let e: JoinError = handle.join().unwrap_err();
    assert_eq!(e.to_string(), "task panicked: formatted");
}

/// Recurses until the stack runs out; the array keeps each frame large and alive.
fn deeper(n: u64) -> u64 {
    let frame = std::hint::black_box([n; 64]);
    if frame[0] == u64::MAX {
        return 0;
    }
    frame[0] + deeper(n + 1) + frame[63]
}

/// Set in the child process a crash test runs itself in.
const CRASH_CHILD: &str = "COREHOP_CRASH_CHILD";

/// Whether this is the child process of the crash test `test`; if not, runs `test` again in
/// a child and returns its exit status and stderr.
fn crash_in_child(test: &str) -> Option<(std::process::ExitStatus, String)> {
    if std::env::var_os(CRASH_CHILD).is_some() {
        return None;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture"])
        .env(CRASH_CHILD, "1")
        .output()
        .unwrap();
    Some((out.status, String::from_utf8_lossy(&out.stderr).into_owned()))
}

#[test]
fn a_task_that_overflows_its_stack_is_reported_as_such() {
    let Some((status, stderr)) = crash_in_child("a_task_that_overflows_its_stack_is_reported_as_such") else {
        let rt = Runtime::builder().wake(Wake::Park).stack_size(64 * 1024).build().unwrap();
        let cpu = rt.cpus()[0];
        let _ = rt.block_on(cpu, || deeper(0));
        unreachable!("the task's stack overflowed, which ends the process");
    };
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGSEGV), "{status:?}\n{stderr}");
    assert!(
        stderr.contains("corehop: a task on cpu") && stderr.contains("overflowed its stack of 64 KiB"),
        "{stderr}"
    );
    assert!(stderr.contains("Builder::stack_size"), "{stderr}");
}

#[test]
fn faults_that_are_not_task_overflows_still_reach_rust_s_handler() {
    let Some((status, stderr)) =
        crash_in_child("faults_that_are_not_task_overflows_still_reach_rust_s_handler")
    else {
        let _rt = park_runtime(); // installs corehop's handler in front of Rust's
        std::thread::Builder::new().stack_size(64 * 1024).spawn(|| deeper(0)).unwrap().join().ok();
        unreachable!("the thread's stack overflowed, which ends the process");
    };
    assert!(!status.success());
    assert!(stderr.contains("has overflowed its stack") && !stderr.contains("corehop: a task"), "{stderr}");
}
