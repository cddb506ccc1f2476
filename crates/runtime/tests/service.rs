//! Service cores: the same calls with and without offload give the same results (return
//! values, errno, bytes on disk), work runs on the service CPU, and bad configurations are
//! typed errors.

mod common;

use std::ffi::CString;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::RawFd;
use std::path::Path;
use std::time::Duration;

use corehop_policy::offload::OffloadPolicy;
use corehop_runtime::service::{Offloader, ServiceConfig, ServiceCpu, ServiceError};
use corehop_runtime::sys::{self, Errno, OsCpu};
use corehop_runtime::CpuId;

fn service_cpu() -> OsCpu {
    *sys::affinity().unwrap().last().unwrap()
}

/// A scratch directory for one test, removed when it drops.
fn scratch(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("corehop-service-{tag}-")).tempdir().unwrap()
}

fn c(path: &Path) -> CString {
    CString::new(path.to_str().unwrap()).unwrap()
}

/// A fixed script of calls through `off`; returns every result as text and the files made.
fn script(off: &mut Offloader<'_>, dir: &Path) -> (Vec<String>, Vec<(String, Vec<u8>)>) {
    let mut log = vec![];
    let mut note = |what: &str, r: String| log.push(format!("{what}: {r}"));
    let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let a = dir.join("a.bin");
    let flags = libc::O_CREAT | libc::O_RDWR | libc::O_TRUNC | libc::O_CLOEXEC;

    let fd = off.open(&c(&a), flags, 0o644).unwrap();
    note("write small", format!("{:?}", off.write(fd, &data[..10])));
    note("write big", format!("{:?}", off.write(fd, &data[10..])));
    let v = [IoSlice::new(b"head-"), IoSlice::new(b"tail")];
    note("writev", format!("{:?}", off.writev(fd, &v)));
    note("pwrite", format!("{:?}", off.pwrite(fd, b"PATCH", 100)));
    note("fsync", format!("{:?}", off.fsync(fd)));
    note("fdatasync", format!("{:?}", off.fdatasync(fd)));
    let st = off.fstat(fd).unwrap();
    note("fstat size", format!("{}", st.st_size));

    // Reads: positioned, short (near the end), at EOF.
    let mut buf = vec![0u8; 4096];
    note("pread", format!("{:?} {:?}", off.pread(fd, &mut buf, 95), &buf[..12]));
    let end = st.st_size;
    note("pread short", format!("{:?}", off.pread(fd, &mut buf, end - 3).map(|n| buf[..n].to_vec())));
    note("pread eof", format!("{:?}", off.pread(fd, &mut buf, end + 10)));
    note("read at eof", format!("{:?}", off.read(fd, &mut buf)));
    let (mut x, mut y) = ([0u8; 3], [0u8; 5]);
    {
        let mut iov = [IoSliceMut::new(&mut x), IoSliceMut::new(&mut y)];
        note("readv eof", format!("{:?}", off.readv(fd, &mut iov)));
    }
    let ro = off.open(&c(&a), libc::O_RDONLY | libc::O_CLOEXEC, 0).unwrap();
    {
        let mut iov = [IoSliceMut::new(&mut x), IoSliceMut::new(&mut y)];
        note("readv", format!("{:?}", off.readv(ro, &mut iov)));
    }
    note("readv data", format!("{x:?} {y:?}"));
    note("write to read-only", format!("{:?}", off.write(ro, b"nope")));

    // sendfile a.bin → b.bin, with and without an explicit offset.
    let b = dir.join("b.bin");
    let out = off.open(&c(&b), flags, 0o600).unwrap();
    let mut offset = 5i64;
    note("sendfile offset", format!("{:?} {offset}", off.sendfile(out, ro, Some(&mut offset), 1000)));
    note("sendfile pos", format!("{:?}", off.sendfile(out, ro, None, 50_000)));

    // Errors: bad fd, missing file, exclusive create of an existing file, stat family.
    let mut small = [0u8; 8];
    note("read bad fd", format!("{:?}", off.read(-1, &mut small)));
    note("fsync bad fd", format!("{:?}", off.fsync(9999)));
    note("open missing", format!("{:?}", off.open(&c(&dir.join("missing")), libc::O_RDONLY, 0)));
    note(
        "open excl",
        format!("{:?}", off.open(&c(&a), libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o644)),
    );
    note("stat", format!("{:?}", off.stat(&c(&a)).map(|s| (s.st_size, s.st_mode & 0o777))));
    let link = dir.join("link");
    std::os::unix::fs::symlink(&a, &link).unwrap();
    note("lstat link", format!("{:?}", off.lstat(&c(&link)).map(|s| s.st_mode & libc::S_IFMT)));
    note("stat link", format!("{:?}", off.stat(&c(&link)).map(|s| s.st_mode & libc::S_IFMT)));
    let dirfd = off.open(&c(dir), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC, 0).unwrap();
    note("fstatat", format!("{:?}", off.fstatat(dirfd, c"b.bin", 0).map(|s| s.st_size)));
    let cfd = off.openat(dirfd, c"c.txt", flags, 0o644).unwrap();
    note("write c", format!("{:?}", off.write(cfd, b"made with openat\n")));
    note("openat missing", format!("{:?}", off.openat(dirfd, c"nope/x", libc::O_RDONLY, 0)));

    // Sockets: send/recv and poll on a socketpair, including a would-block recv.
    let mut pair = [0 as RawFd; 2];
    // SAFETY: socketpair writes two descriptors into `pair`.
    assert_eq!(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, pair.as_mut_ptr()) }, 0);
    note("recv empty", format!("{:?}", off.recv(pair[1], &mut small, libc::MSG_DONTWAIT)));
    note("send", format!("{:?}", off.send(pair[0], b"hello sock", 0)));
    let mut fds = [libc::pollfd { fd: pair[1], events: libc::POLLIN, revents: 0 }];
    note("poll", format!("{:?} {}", off.poll(&mut fds, 1000), fds[0].revents));
    // SAFETY: fd_set is plain data; FD_ZERO/FD_SET/FD_ISSET only touch the set for fds below
    // FD_SETSIZE (socketpair descriptors of a test process are small).
    let mut set: libc::fd_set = unsafe { std::mem::zeroed() };
    unsafe { libc::FD_SET(pair[1], &mut set) };
    let mut timeout = libc::timeval { tv_sec: 1, tv_usec: 0 };
    let ready = off.select(pair[1] + 1, Some(&mut set), None, None, Some(&mut timeout));
    note("select", format!("{ready:?} {}", unsafe { libc::FD_ISSET(pair[1], &set) }));
    // A descriptor number inside the table that is closed (select ignores numbers beyond it).
    // Not a low number: tests run in parallel threads and the kernel hands out the lowest free
    // number, so another test could reuse a low one between our close and the select. dup2 to
    // a high number grows the table to hold it; closing it leaves a gap nobody will fill.
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into our local struct.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    // Each call takes its own number, as parallel tests run this script too.
    static TAKEN: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(1);
    let top = (limit.rlim_cur.min(libc::FD_SETSIZE as libc::rlim_t) - 1) as i32;
    let high = top - TAKEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: dup2/close of our own socket onto a number we then release; fd_set as above.
    let closed = unsafe { libc::dup2(pair[0], high) };
    assert_eq!(closed, high, "dup2 to fd {high}");
    unsafe { libc::close(closed) };
    let mut bad: libc::fd_set = unsafe { std::mem::zeroed() };
    unsafe { libc::FD_SET(closed, &mut bad) };
    note(
        "select bad fd",
        format!("{:?}", off.select(closed + 1, Some(&mut bad), None, None, Some(&mut timeout))),
    );
    // More descriptors than a set holds: refused before the kernel reads or writes past it.
    let past = off.select(libc::FD_SETSIZE as i32 + 64, Some(&mut bad), None, None, Some(&mut timeout));
    assert_eq!(past.map_err(|e| e.0), Err(libc::EINVAL));
    note("select past FD_SETSIZE", format!("{past:?}"));
    note("recv short", format!("{:?} {:?}", off.recv(pair[1], &mut small, 0), small));
    note("offload closure", format!("{}", off.offload(|| data.iter().map(|&b| b as u64).sum::<u64>())));

    for fd in [fd, ro, out, dirfd, cfd, pair[0], pair[1]] {
        // SAFETY: each descriptor was opened above and is closed once.
        unsafe { libc::close(fd) };
    }
    let files = ["a.bin", "b.bin", "c.txt"]
        .iter()
        .map(|n| (n.to_string(), std::fs::read(dir.join(n)).unwrap()))
        .collect();
    (log, files)
}

#[test]
fn offloaded_calls_give_identical_results_and_files() {
    let cores = ServiceConfig::on_cpus([service_cpu()]).build().unwrap();
    let reference = {
        let dir = scratch("never");
        let mut off = Offloader::new(&cores, OffloadPolicy::Never);
        let r = script(&mut off, dir.path());
        assert_eq!(off.stats().offloaded, 0);
        r
    };
    // Sanity of the reference itself: errors carry the kernel's errno.
    let log = reference.0.join("\n");
    for expected in [
        "read bad fd: Err(Errno(9))",
        "open missing: Err(Errno(2))",
        "open excl: Err(Errno(17))",
        "read at eof: Ok(0)",
        "pread short: Ok([",
        "write to read-only: Err(Errno(9))",
        "recv empty: Err(Errno(11))",
        "recv short: Ok(8)",
        "select: Ok(1) true",
        "select bad fd: Err(Errno(9))",
        "openat missing: Err(Errno(2))",
    ] {
        assert!(log.contains(expected), "missing {expected:?} in\n{log}");
    }
    assert_eq!(reference.1[0].1.len(), 20_009);
    for spec in ["always", "size:4096", "predicted:fa:0", "predicted:dm:tuned", "static:read,write,fsync"] {
        let dir = scratch("policy");
        let mut off = Offloader::new(&cores, spec.parse().unwrap());
        let got = script(&mut off, dir.path());
        let got_log: Vec<String> =
            got.0.iter().map(|l| l.replace(dir.path().to_str().unwrap(), "DIR")).collect();
        assert_eq!(got_log, reference.0, "results differ under {spec}");
        assert_eq!(got.1, reference.1, "files differ under {spec}");
        if spec == "always" {
            assert_eq!(off.stats().offloaded, off.stats().calls);
        }
    }
}

#[test]
fn work_runs_on_the_service_cpu_and_panics_come_back() {
    let cpu = service_cpu();
    let cores = ServiceConfig::on_cpus([cpu]).build().unwrap();
    assert_eq!(cores.run(|| sys::current_os_cpu().unwrap()), cpu);
    let caller_tid = sys::gettid();
    assert_ne!(cores.run(sys::gettid), caller_tid, "the work ran on the service thread");
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cores.run(|| panic!("boom"))));
    let payload = caught.unwrap_err();
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"boom"));
    // Still serving after the panic, and nested sends run inline instead of deadlocking.
    assert_eq!(cores.run(|| cores.run(|| 41) + 1), 42);
    let stats = cores.stats();
    assert_eq!(stats[0].cpu, ServiceCpu::Thread(cpu));
    assert!(stats[0].jobs >= 4);
    assert!(cores.round_trip_ns(20) > 0);
}

#[test]
fn predicted_policy_learns_which_work_is_long() {
    let cores = ServiceConfig::on_cpus([service_cpu()]).build().unwrap();
    // N = 500 µs: a 20 ms sleep is long, an empty closure is short. (N never sits below the
    // measured cost of a move: with 2 ms sleeps, a hand-off slowed by a busy machine once
    // made them not worth moving.)
    let mut off = Offloader::new(&cores, "predicted:fa:500000".parse().unwrap());
    let long = || std::thread::sleep(Duration::from_millis(20));
    for _ in 0..4 {
        off.offload(long);
    }
    let after_long = off.stats();
    assert_eq!(
        after_long.offloaded, 3,
        "the first is predicted cold (0 ns) and runs locally; then offloaded"
    );
    let short = |off: &mut Offloader<'_>| off.offload(|| 1 + 1);
    // A new call site starts from the global mean of the last three runs (long ones), so
    // the first few short calls may still go out; once the history is short, they stay.
    for _ in 0..3 {
        short(&mut off);
    }
    let settled = off.stats().offloaded;
    for _ in 0..10 {
        short(&mut off);
    }
    assert_eq!(off.stats().offloaded, settled, "short work stays local");
    assert!(off.stats().remote_run_ns >= 3 * 20_000_000);
}

#[test]
fn a_profiling_run_chooses_the_static_set() {
    use corehop_policy::offload::{CallKind, StaticProfile};
    let cores = ServiceConfig::on_cpus([service_cpu()]).build().unwrap();
    let mut off = Offloader::new(&cores, OffloadPolicy::Never).with_profile();
    let dir = scratch("profile");
    let fd =
        off.open(&c(&dir.path().join("p")), libc::O_CREAT | libc::O_RDWR | libc::O_CLOEXEC, 0o644).unwrap();
    for _ in 0..3 {
        off.write(fd, b"x").unwrap();
        off.offload(|| std::thread::sleep(Duration::from_millis(20)));
    }
    // SAFETY: opened above, closed once.
    unsafe { libc::close(fd) };
    let profile = off.take_profile();
    assert_eq!(profile.len(), 7);
    assert!(off.take_profile().is_empty());
    // Hop cost 5 ms: only the 20 ms closures (an `Other` kind) are worth moving. The margin is
    // wide because a first `open` on a busy disk once took 0.4 ms, more than 2× a small hop cost.
    let chosen = StaticProfile::from_profile(profile.iter().map(|(call, run)| (call.kind, *run)), 5_000_000);
    assert_eq!(chosen.kinds.len(), 1, "{chosen:?}");
    assert!(chosen.kinds.keys().all(|k| k.starts_with("other:")));
    assert!(!chosen.kinds.contains_key(CallKind::Write.name().unwrap()));
}

#[test]
fn progress_feeds_the_threshold_tuner() {
    let cores = ServiceConfig::on_cpus([service_cpu()]).build().unwrap();
    let mut off =
        Offloader::new(&cores, "predicted:fa:tuned".parse().unwrap()).with_epochs(Duration::from_millis(1));
    let start = std::time::Instant::now();
    while off.stats().epochs < 5 && start.elapsed() < Duration::from_secs(10) {
        off.offload(|| std::thread::sleep(Duration::from_micros(300)));
        off.progress(1);
    }
    assert!(off.stats().epochs >= 5);
    let OffloadPolicy::Predicted(p) = off.policy() else { panic!("not predicted") };
    assert!(p.tuner().unwrap().rounds() >= 1, "three epochs make a sampling round");
}

/// An epoch spans whole units of progress: it ends where the application reports one, never
/// inside a call. An epoch that ended mid-transaction scored a trial of a few transactions with
/// a part of one more in its time but not in its count (a quarter of a 4-unit trial).
#[test]
fn an_epoch_ends_only_where_progress_is_reported() {
    let cores = ServiceConfig::on_cpus([service_cpu()]).build().unwrap();
    let mut off = Offloader::new(&cores, "adaptive".parse().unwrap()).with_epochs(Duration::from_millis(2));
    for _ in 0..10 {
        // Enough units for an epoch, quickly; then a unit whose call outlasts the epoch.
        for _ in 0..2 * corehop_policy::offload::MIN_EPOCH_UNITS {
            off.progress(1);
        }
        let before = off.stats().epochs;
        off.offload(|| std::thread::sleep(Duration::from_millis(3)));
        assert_eq!(off.stats().epochs, before, "an epoch ended inside a unit of progress");
        off.progress(1);
    }
    assert!(off.stats().epochs > 0, "epochs end at progress reports");
}

#[test]
fn several_service_cores_share_the_work() {
    let cpus = sys::affinity().unwrap();
    if cpus.len() < 2 {
        common::skip(&format!("needs 2 CPUs, this process may use {cpus:?}"));
        return;
    }
    let mut config = ServiceConfig::on_cpus(cpus[..2].to_vec());
    config.pick = corehop_policy::pick::Pick::ROUND_ROBIN;
    let cores = config.build().unwrap();
    let ran_on: Vec<OsCpu> = (0..6).map(|_| cores.run(|| sys::current_os_cpu().unwrap())).collect();
    assert_eq!(ran_on, [cpus[0], cpus[1], cpus[0], cpus[1], cpus[0], cpus[1]]);
    assert!(cores.stats().iter().all(|s| s.jobs == 3));
}

#[test]
fn bad_configurations_are_typed_errors() {
    assert!(matches!(ServiceConfig::<OsCpu>::on_cpus([]).build(), Err(ServiceError::NoCpus)));
    let cpu = service_cpu();
    assert!(
        matches!(ServiceConfig::on_cpus([cpu, cpu]).build(), Err(ServiceError::Duplicate { cpu: c }) if c == ServiceCpu::Thread(cpu))
    );
    match ServiceConfig::on_cpus([OsCpu(4000)]).build() {
        Err(e @ ServiceError::CpuNotAllowed { cpu: OsCpu(4000), .. }) => {
            assert!(e.to_string().contains("not one this process may run on"))
        }
        other => panic!("expected CpuNotAllowed, got {:?}", other.err()),
    }
    // Errno formatting names the error.
    assert!(Errno(libc::EBADF).to_string().contains("errno 9"));
}

#[test]
fn hop_based_service_cores_give_the_same_results() {
    use corehop_runtime::{current_cpu, no_hop_zone, Runtime, Wake};
    let rt = Runtime::builder().wake(Wake::Park).build().unwrap();
    if rt.cpus().len() < 2 {
        common::skip(&format!("hop-based service cores need a runtime on 2 CPUs, got {:?}", rt.cpus()));
        return;
    }
    let (app, service) = (rt.cpus()[0], *rt.cpus().last().unwrap());
    let reference = {
        let thread_cores = ServiceConfig::on_cpus([service_cpu()]).build().unwrap();
        let dir = scratch("hop-ref");
        script(&mut Offloader::new(&thread_cores, OffloadPolicy::Never), dir.path())
    };
    let dir = scratch("hop");
    let path = dir.path().to_path_buf();
    let (got, stats, ran_on, fallbacks) = rt
        .block_on(app, move || {
            let cores = ServiceConfig::on_cpus([service]).build().unwrap();
            let mut off = Offloader::new(&cores, OffloadPolicy::Always);
            let got = script(&mut off, &path);
            let ran_on = off.offload(current_cpu);
            assert_eq!(current_cpu(), app, "the task came back");
            // Inside a no-hop zone the work runs here instead, and is counted.
            let here = {
                let _zone = no_hop_zone();
                off.offload(current_cpu)
            };
            assert_eq!(here, app);
            (got, off.stats(), ran_on, cores.stats()[0].fallbacks)
        })
        .unwrap();
    assert_eq!(got, reference, "hop-based offload changed a result or a file");
    assert_eq!(ran_on, service);
    assert_eq!(stats.offloaded, stats.calls);
    assert_eq!(fallbacks, 1);
    // Outside any task there is nothing to hop: the work runs locally.
    let cores = ServiceConfig::on_cpus([service]).build().unwrap();
    assert_eq!(cores.run(|| 7), 7);
    assert_eq!(cores.stats()[0].fallbacks, 1);
    assert!(matches!(
        ServiceConfig::on_cpus([CpuId(1), CpuId(1)]).build(),
        Err(ServiceError::Duplicate { cpu: ServiceCpu::Hop(CpuId(1)) })
    ));
}

/// While its caller sleeps, an idle service thread must not burn its CPU: after a busy phase
/// that taught it to poll, its CPU time (the kernel's count, not wall time) over a quiet
/// stretch stays a small part of that stretch, and the time it says it polled stays small too.
#[test]
fn an_idle_service_thread_does_not_burn_its_cpu_while_the_caller_sleeps() {
    let cores = ServiceConfig::on_cpus([service_cpu()]).build().unwrap();
    for _ in 0..20_000 {
        cores.run(|| ());
    }
    let before = cores.stats()[0];
    let Some(cpu_before) = before.thread_cpu_ns else {
        common::skip("no /proc/self/task/*/schedstat here: the thread's CPU time cannot be read");
        return;
    };
    let quiet = Duration::from_millis(400);
    std::thread::sleep(quiet);
    let after = cores.stats()[0];
    let cpu = after.thread_cpu_ns.unwrap() - cpu_before;
    let polled = after.polled_ns.unwrap() - before.polled_ns.unwrap();
    // Generous: the thread may poll for a budget of a few wake-up costs, then sleeps.
    let bound = quiet.as_nanos() as u64 / 10;
    eprintln!("quiet {quiet:?}: service thread CPU {cpu} ns, polled {polled} ns");
    assert!(cpu < bound, "the idle service thread used {cpu} ns of CPU in a {quiet:?} sleep of its caller");
    assert!(polled < bound, "the idle service thread polled {polled} ns in a {quiet:?} sleep of its caller");
    assert!(before.caller_spun_ns.unwrap() > 0, "callers' spinning is counted");
}

/// Small closures and results travel in the slot's lines, large ones stay on the caller's
/// stack: both come back right, borrows and panics included.
#[test]
fn small_and_large_closures_and_results_come_back_alike() {
    let cores = ServiceConfig::on_cpus([service_cpu()]).build().unwrap();
    let mut counter = 5u64;
    let small = cores.run(|| {
        counter += 1;
        counter * 2
    });
    assert_eq!((small, counter), (12, 6));
    let big_in = [3u64; 16];
    let big_out = cores.run(move || big_in.map(|x| x * 7));
    assert_eq!(big_out, [21u64; 16]);
    let text = String::from("borrowed");
    assert_eq!(cores.run(|| text.len()), 8);
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        cores.run(move || -> [u64; 16] { panic!("big {}", big_in[0]) })
    }));
    assert_eq!(caught.unwrap_err().downcast_ref::<String>().map(String::as_str), Some("big 3"));
}
