//! `corehop run --offload` must be safe in front of any program (issue 19): credential
//! changes, a main thread that leaves first, blocking regular files, thread-bound calls, the
//! stats file. Each case runs a small C program plainly and with `--offload --policy always`
//! under a time limit (a hang fails the test instead of stalling it) and compares the two.
//!
//! Tests that need `cc` or root say so and skip.

mod common;

use common::text;

use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use std::time::{Duration, Instant};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/safety");
/// Far longer than any case takes; only a hang reaches it.
const LIMIT: Duration = Duration::from_secs(20);

fn corehop() -> Command {
    common::offload_command()
}

fn have_cc() -> bool {
    common::have("cc")
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        common::skip("needs root (credential changes)");
    }
    root
}

/// Compiles `fixtures/safety/NAME.c` into a fresh directory; `None` (a recorded skip) without
/// a C compiler.
fn fixture(name: &str) -> Option<(tempfile::TempDir, PathBuf)> {
    if !have_cc() {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(name, dir.path());
    Some((dir, exe))
}

/// Compiles `fixtures/safety/NAME.c` into `dir`.
fn compile(name: &str, dir: &Path) -> PathBuf {
    let exe = dir.join(name);
    let built = Command::new("cc")
        .args(["-O1", "-pthread", "-o"])
        .arg(&exe)
        .arg(Path::new(FIXTURES).join(format!("{name}.c")))
        .output()
        .expect("cc");
    assert!(built.status.success(), "cc {name}: {}", text(&built.stderr));
    exe
}

/// Runs `command` to its end, or kills it after [`LIMIT`] and fails: it hung.
fn finish(mut command: Command, what: &str) -> Output {
    // Its own process group, so a hang is ended whole (the program, not only corehop).
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child =
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
            child.stdout.take().unwrap().read_to_end(&mut stdout).unwrap();
            child.stderr.take().unwrap().read_to_end(&mut stderr).unwrap();
            return Output { status, stdout, stderr };
        }
        if start.elapsed() > LIMIT {
            // SAFETY: kill has no memory preconditions; the group is the one made above.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            panic!("{what} hung: still running after {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `argv` plainly and with offload of every call, each in its own fresh directory.
fn pair(argv: &[&str], env: &[(&str, &str)]) -> (Output, Output) {
    let (plain, offload, _) = run_pair(argv, env, false);
    (plain, offload)
}

/// [`pair`], and the offload run's `--stats-json` summary.
fn pair_with_summary(argv: &[&str]) -> (Output, Output, serde_json::Value) {
    run_pair(argv, &[], true)
}

fn run_pair(argv: &[&str], env: &[(&str, &str)], stats: bool) -> (Output, Output, serde_json::Value) {
    let root = tempfile::tempdir().expect("tempdir");
    let json = root.path().join("summary.json");
    let mut outputs = Vec::new();
    for offload in [false, true] {
        let dir = root.path().join(if offload { "offload" } else { "plain" });
        std::fs::create_dir(&dir).unwrap();
        let mut command = corehop();
        command.arg("run");
        if offload {
            command.args(["--offload", "--policy", "always"]);
            if stats {
                command.arg("--stats-json").arg(&json);
            }
        }
        command.arg("--").args(argv).envs(env.iter().copied()).current_dir(&dir);
        outputs.push(finish(command, &format!("{argv:?} (offload: {offload})")));
    }
    let summary = std::fs::read_to_string(&json)
        .map_or(serde_json::Value::Null, |s| serde_json::from_str(&s).expect("summary JSON"));
    let offload = outputs.pop().unwrap();
    (outputs.pop().unwrap(), offload, summary)
}

/// Compiles fixture `name`, runs it without arguments plainly and offloaded, and checks that
/// both runs agree; returns them.
fn same_both_ways(name: &str) -> (Output, Output) {
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(name, dir.path());
    let argv = [exe.to_str().unwrap()];
    let (plain, offload) = pair(&argv, &[]);
    assert_same(&argv, &plain, &offload);
    (plain, offload)
}

fn assert_same(argv: &[&str], plain: &Output, offload: &Output) {
    assert_eq!(text(&plain.stdout), text(&offload.stdout), "{argv:?}: stdout differs");
    assert_eq!(text(&plain.stderr), text(&offload.stderr), "{argv:?}: stderr differs");
    assert_eq!(plain.status.code(), offload.status.code(), "{argv:?}: exit status differs");
}

#[test]
fn glibc_credential_changes_complete_after_calls_went_across() {
    if !have_cc() || !is_root() {
        return;
    }
    let (_, offload) = same_both_ways("setid");
    assert!(text(&offload.stdout).contains("uid 65534 65534 65534 gid 65534"), "{}", text(&offload.stdout));
    assert!(text(&offload.stdout).contains("shadow refused"));
}

#[test]
fn a_process_whose_program_threads_all_left_ends() {
    let Some((_dir, exe)) = fixture("main_exit") else { return };
    for how in ["pthread", "strict"] {
        let argv = [exe.to_str().unwrap(), how];
        let (plain, offload) = pair(&argv, &[]);
        assert_same(&argv, &plain, &offload);
        assert!(text(&offload.stdout).contains("worker done"), "{how}: {}", text(&offload.stdout));
    }
}

#[test]
fn a_thread_that_changed_its_own_credentials_or_filter_is_not_bypassed() {
    let Some((dir, exe)) = fixture("thread_state") else { return };
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "root only\n").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let mut cases = vec![("seccomp", "EPERM", "Operation not permitted")];
    if is_root() {
        cases.push(("setresuid", "EACCES", "Permission denied"));
    }
    for (how, name, message) in cases {
        let argv = [exe.to_str().unwrap(), how, secret.to_str().unwrap()];
        let (plain, offload) = pair(&argv, &[]);
        assert_same(&argv, &plain, &offload);
        assert!(text(&offload.stdout).contains(message), "{how}: expected {name}: {}", text(&offload.stdout));
    }
}

/// A process whose filter kills it at a call the program never makes ends as plainly: the
/// library then makes no call of its own at exit (here, handing on what its predictor learned,
/// under `flock`).
#[test]
fn a_process_that_filtered_its_calls_makes_none_of_the_librarys_at_exit() {
    let Some((dir, exe)) = fixture("thread_state") else { return };
    let target = dir.path().join("target");
    std::fs::write(&target, "x\n").unwrap();
    let out = corehop()
        .args(["run", "--offload", "--policy", "predicted", "--threshold", "1000000", "--stats", "--"])
        .args([exe.to_str().unwrap(), "kill-flock", target.to_str().unwrap()])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?}: {}", out.status, text(&out.stderr));
    assert!(text(&out.stdout).contains("open kill-flock: opened"), "{}", text(&out.stdout));
}

#[test]
fn thread_bound_calls_answer_for_the_calling_thread() {
    if !have_cc() {
        return;
    }
    let (_, offload) = same_both_ways("thread_bound");
    let out = text(&offload.stdout);
    assert!(!out.contains("corehop-svc"), "a call read the service thread:\n{out}");
    assert!(out.contains("stat through symlink: same file"), "{out}");
    assert!(!out.contains("another file") && out.contains("thread-self fd: warm.txt"), "{out}");
    assert!(out.contains("O_PATH|O_CREAT|O_EXCL /proc/thread-self: this thread"), "{out}");
    assert!(out.contains("signalfd: signal 10"), "{out}");
}

/// A poll or select that cannot wait, on a signalfd or an epoll set holding one, answers for
/// the calling thread's pending signals (the service thread has none), while one on regular
/// files alone still goes across.
#[test]
fn a_poll_of_a_signalfd_answers_for_the_calling_thread() {
    if !have_cc() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = compile("polled_signalfd", dir.path());
    let argv = [exe.to_str().unwrap()];
    let (plain, offload, summary) = pair_with_summary(&argv);
    assert_same(&argv, &plain, &offload);
    let out = text(&plain.stdout);
    assert!(out.contains("poll: 2 (file 4, signalfd 1), epoll set: 1 (1), select: 1, read: 128"), "{out}");
    let poll = &summary["calls"]["poll"];
    assert_eq!(poll["offloaded"].as_u64(), Some(3), "the file's own polls: {summary}");
}

/// A thread made by `clone` with CLONE_THREAD but without CLONE_FS and CLONE_FILES has its own
/// directory and descriptors: its calls act on them, also when the library is loaded by the
/// start-up stub after calls went across, not on the process's that a service thread has.
#[test]
fn a_thread_with_files_of_its_own_makes_its_calls_on_them() {
    let Some((_dir, exe)) = fixture("own_files") else { return };
    let exe = exe.to_str().unwrap();
    for mode in ["early", "late"] {
        let argv = [exe, mode];
        let (plain, offload) = pair(&argv, &[]);
        assert_same(&argv, &plain, &offload);
        assert!(text(&plain.stdout).starts_with("thread: fd 3, read 6 'inner!'"), "{}", text(&plain.stdout));
        let files = tempfile::tempdir().unwrap();
        let mut command = Command::new(exe);
        command.arg(mode).current_dir(files.path());
        common::through_the_stub(&mut command, "always");
        let out = finish(command, &format!("own_files {mode} through the stub"));
        assert_eq!(text(&out.stdout), text(&plain.stdout), "{mode} through the stub");
    }
}

/// A library opened with `dlopen` whose constructor joins a thread that makes calls: the
/// opener holds the loader's lock meanwhile, so neither the stub's load of corehop's library
/// nor the library's own look-ups (its names, whether a sanitizer is loaded) may wait for it.
#[test]
fn a_constructor_that_joins_a_thread_making_calls_ends_as_plainly() {
    let Some((dir, exe)) = fixture("dlopen_ctor") else { return };
    let library = dir.path().join("libdlopen_ctor.so");
    let built = Command::new("cc")
        .args(["-O1", "-pthread", "-shared", "-fPIC", "-DCTOR_LIBRARY", "-o"])
        .arg(&library)
        .arg(Path::new(FIXTURES).join("dlopen_ctor.c"))
        .output()
        .expect("cc");
    assert!(built.status.success(), "cc: {}", text(&built.stderr));
    let (exe, library) = (exe.to_str().unwrap(), library.to_str().unwrap());
    for mode in ["idle", "busy"] {
        let argv = [exe, library, mode];
        let (plain, offload) = pair(&argv, &[]);
        assert_same(&argv, &plain, &offload);
        let expected = format!("{mode}: main 1, constructor's thread 200 of 200\n");
        assert_eq!(text(&plain.stdout), expected);
        for policy in ["adaptive", "always"] {
            let files = tempfile::tempdir().unwrap();
            let mut command = Command::new(exe);
            command.args([library, mode]).current_dir(files.path());
            common::through_the_stub(&mut command, policy);
            let out = finish(command, &format!("dlopen_ctor {mode} through the stub ({policy})"));
            assert_eq!(text(&out.stdout), expected, "{mode} through the stub ({policy})");
        }
    }
}

/// A moved call's buffer is checked against the calling thread's memory protection-key rights
/// (PKRU, its own): a read into a page that this thread may write, but the service thread
/// could not, succeeds as plainly, and one this thread may not write fails alike.
#[test]
fn a_call_into_memory_of_a_protection_key_has_the_callers_rights() {
    if !have_cc() {
        return;
    }
    let (plain, _) = same_both_ways("pkeys");
    let out = text(&plain.stdout);
    if out.starts_with("no protection keys") {
        common::skip("no memory protection keys on this machine");
        return;
    }
    assert!(out.contains("write allowed: pread 11  'hello pkeys'"), "{out}");
    assert!(out.contains("write denied: pread -1 Bad address"), "{out}");
}

/// A program that makes itself a user namespace after calls went across gets it as plainly
/// (where the kernel allows one at all): the kernel refuses a process of more than one thread,
/// so the service thread must be off its list by then, not only joined.
#[test]
fn a_program_that_unshares_its_user_namespace_gets_it_as_plainly() {
    let Some((_dir, exe)) = fixture("unshare") else { return };
    for how in ["libc", "syscall"] {
        let argv = [exe.to_str().unwrap(), how];
        // The window is microseconds wide; without the wait, three in four runs met it here.
        for _ in 0..2 {
            let (plain, offload) = pair(&argv, &[]);
            assert_same(&argv, &plain, &offload);
            assert!(text(&offload.stdout).contains("after: done"), "{how}: {}", text(&offload.stdout));
        }
    }
}

/// A child sharing its parent's memory (vfork, clone with CLONE_VM, a raw clone through
/// `syscall`) runs its intercepted calls itself, on its own descriptors and directory: none
/// reaches the parent's service thread, and the parent's calls still go across after it,
/// also when the child came before the library had started (`cold`).
#[test]
fn a_child_sharing_the_parents_memory_runs_its_calls_itself() {
    let Some((_dir, exe)) = fixture("shared_vm") else { return };
    for how in ["vfork", "clone", "syscall"] {
        for start in ["warm", "cold"] {
            let argv = [exe.to_str().unwrap(), how, start];
            let (plain, offload, summary) = pair_with_summary(&argv);
            assert_same(&argv, &plain, &offload);
            let out = text(&offload.stdout);
            if out.contains("not on this architecture") {
                continue;
            }
            for line in [
                "child ok",
                "parent cwd: its own",
                "parent fd 100: not open",
                "parent descriptors: +0",
                "parent kept descriptor: outer",
                "parent open: outer",
            ] {
                assert!(out.contains(line), "{how} {start}: missing {line:?}:\n{out}");
            }
            let total = |field: &str| {
                summary["calls"]
                    .as_object()
                    .map_or(0, |c| c.values().map(|v| v[field].as_u64().unwrap_or(0)).sum())
            };
            // The child's eight intercepted calls ran where it made them; the parent's (two
            // before the child unless cold, three after) went across.
            assert_eq!(total("busy"), 8, "{how} {start}: the child's calls: {summary}");
            let parents = if start == "cold" { 3 } else { 5 };
            assert_eq!(total("offloaded") + total("withdrawn"), parents, "{how} {start}: {summary}");
        }
    }
}

#[test]
#[cfg_attr(not(target_arch = "x86_64"), ignore = "the start-up stub is built for x86-64 only")]
fn a_child_sharing_memory_while_the_stub_loads_the_library_runs_its_calls_itself() {
    // `corehop run --offload` preloads the start-up stub, which loads the library only after
    // 40 ms: here, while a clone child sharing the parent's memory makes calls. Its calls
    // must keep running in the child (on its own directory), the parent's may go across.
    let Some((dir, exe)) = fixture("shared_vm") else { return };
    let run = |stub: bool| {
        let cwd = dir.path().join(if stub { "stub" } else { "plain" });
        std::fs::create_dir(&cwd).unwrap();
        let mut command = Command::new(&exe);
        command.arg("overlap").current_dir(&cwd);
        if stub {
            common::through_the_stub(&mut command, "always");
        }
        finish(command, &format!("shared_vm overlap (stub: {stub})"))
    };
    let (plain, stub) = (run(false), run(true));
    assert_eq!(text(&plain.stdout), text(&stub.stdout));
    assert!(text(&stub.stdout).contains("overlap: child ok"), "{}", text(&stub.stdout));
    // The child's calls after the load are `busy` (run where they were made), the parent's
    // went across.
    let total = common::summary_on(&stub.stderr).total();
    assert!(total.offloaded > 0, "none of the parent's calls went across: {total:?}");
    assert!(total.busy > 0, "none of the child's calls reached the library: {total:?}");
}

#[test]
#[cfg_attr(not(target_arch = "x86_64"), ignore = "the start-up stub is built for x86-64 only")]
fn a_fork_child_of_a_process_that_vforked_on_the_stub_still_loads_the_library() {
    // After a vfork child only its parent may load the library (the child shared its memory);
    // a child of fork has memory of its own again, and one that outlives 40 ms loads it.
    let Some((dir, exe)) = fixture("shared_vm") else { return };
    let mut command = Command::new(&exe);
    command.arg("fork_after_vfork").current_dir(dir.path());
    common::through_the_stub(&mut command, "adaptive");
    let out = finish(command, "shared_vm fork_after_vfork");
    assert_eq!(text(&out.stdout), "fork child: library loaded\n", "{}", text(&out.stderr));
}

#[test]
#[cfg_attr(not(target_arch = "x86_64"), ignore = "the start-up stub is built for x86-64 only")]
fn calls_from_a_signal_handler_never_load_or_build_anything() {
    // The handler writes while the main thread allocates. `handler`: after start-up only the
    // handler makes calls, so the stub must never load the library (dlopen allocates: it
    // crashed such a program in 10 runs of 20). `both`: the main loop's calls load it, and the
    // handler's then reach it, which must build nothing there either.
    let Some((_dir, exe)) = fixture("signal_calls") else { return };
    let run = |mode: &str, stub: bool| {
        let mut command = Command::new(&exe);
        command.arg(mode);
        if stub {
            common::through_the_stub(&mut command, "adaptive");
        }
        finish(command, &format!("signal_calls {mode} (stub: {stub})"))
    };
    let plain = text(&run("handler", false).stdout);
    assert!(plain.ends_with("ticked yes, library not mapped\n"), "{plain}");
    for _ in 0..3 {
        let out = run("handler", true);
        assert!(out.status.success(), "{:?}: {}", out.status, text(&out.stderr));
        assert_eq!(text(&out.stdout), plain, "the stub loaded the library in the handler");
        let out = run("both", true);
        assert!(out.status.success(), "{:?}: {}", out.status, text(&out.stderr));
        assert_eq!(text(&out.stdout), plain.replace("not mapped", "mapped"));
    }
}

#[test]
#[cfg_attr(not(target_arch = "x86_64"), ignore = "the start-up stub is built for x86-64 only")]
fn a_worker_that_blocks_more_signals_still_gets_the_library() {
    // A worker blocking more than the first call did may be in a handler, or may block more
    // for good: the stub puts the load off for a while only.
    let Some((_dir, exe)) = fixture("blocked_worker") else { return };
    let mut command = Command::new(&exe);
    common::through_the_stub(&mut command, "adaptive");
    let out = finish(command, "blocked_worker");
    assert_eq!(text(&out.stdout), "writes done, library mapped\n", "{}", text(&out.stderr));
}

#[test]
fn a_coroutine_with_a_small_stack_runs_as_it_does_plainly() {
    // Under the start-up stub (which loads the library from the coroutine's calls) and with the
    // library preloaded from the start (which starts up and builds the default policy there).
    // 8 KiB: the deepest call of the default policy takes 4.7 KiB, 10 KiB with the policy built
    // in place. Unoptimized, the library's own path takes 9 KiB.
    let kib = if cfg!(debug_assertions) { "16" } else { "8" };
    same_under_the_default_policy("small_stack", kib, "coroutine wrote: yes\n");
}

/// The library's memory is its own: a program that reads its `malloc` heap after the library
/// started up, built the default policy and learned from 80 ms of calls finds it as it is
/// plainly (the policy's tables once sat in it, and changed when the heap could shrink).
#[test]
fn the_program_s_heap_holds_nothing_of_the_library() {
    let Some((_dir, exe)) = fixture("own_heap") else { return };
    let plain = finish(Command::new(&exe), "own_heap plain");
    assert!(text(&plain.stdout).starts_with("heap grew "), "{}", text(&plain.stderr));
    let mut default = Command::new(&exe);
    default.env("LD_PRELOAD", common::library()).env("COREHOP_POLICY", "adaptive");
    let mut counted = corehop();
    counted.args(["run", "--offload", "--stats", "--"]).arg(&exe);
    for (command, how) in [(default, "preloaded, default policy"), (counted, "corehop run --offload --stats")]
    {
        let out = finish(command, &format!("own_heap {how}"));
        assert!(out.status.success(), "{how}: {:?} {}", out.status, text(&out.stderr));
        assert_eq!(text(&out.stdout), text(&plain.stdout), "{how}");
    }
}

/// Runs fixture `name` with `arg` plainly, checks that it printed `expected`, then through the
/// start-up stub and with the library preloaded, both under the default policy, and checks
/// that each ends well with the same output; returns the plain run (`None`: no C compiler).
fn same_under_the_default_policy(name: &str, arg: &str, expected: &str) -> Option<Output> {
    let (_dir, exe) = fixture(name)?;
    let mut plain = Command::new(&exe);
    plain.arg(arg);
    let plain = finish(plain, &format!("{name} plain"));
    assert_eq!(text(&plain.stdout), expected);
    let mut stub = Command::new(&exe);
    common::through_the_stub(stub.arg(arg), "adaptive");
    let mut library = Command::new(&exe);
    library.arg(arg).env("LD_PRELOAD", common::library()).env("COREHOP_POLICY", "adaptive");
    for (command, how) in [(stub, "through the stub"), (library, "preloaded")] {
        let out = finish(command, &format!("{name} {how}"));
        assert!(out.status.success(), "{how}: {:?} {}", out.status, text(&out.stderr));
        assert_eq!(text(&out.stdout), text(&plain.stdout), "{how}");
    }
    Some(plain)
}

#[test]
fn a_handler_on_a_small_alternate_stack_runs_as_it_does_plainly() {
    // The handler's `write` comes to the library while the default policy is due to be
    // built: the call must not take the build's frame (4 KiB) on the way. Its own path takes
    // under 2 KiB beyond a plain `write`'s, 4 KiB unoptimized.
    let spare = if cfg!(debug_assertions) { "8192" } else { "3072" };
    if let Some(plain) = same_under_the_default_policy("alt_stack_handler", spare, "handled: yes\n") {
        assert!(plain.status.success(), "plain: {:?}", plain.status);
    }
}

#[test]
fn a_thread_cancelled_in_a_blocking_call_ends_as_it_does_plainly() {
    let Some((_dir, exe)) = fixture("cancel_blocked") else { return };
    let exe = exe.to_str().unwrap();
    let (plain, offload) = pair(&[exe], &[]);
    assert_eq!(text(&plain.stdout), "cancelled: yes, cleanup ran: yes\n");
    assert_eq!(offload.status.code(), Some(0), "{}", text(&offload.stderr));
    assert_eq!(text(&offload.stdout), text(&plain.stdout));
    // With the library preloaded from the start, the blocking read is the first call some
    // policies see on the library's full path.
    for policy in ["never", "adaptive", "size"] {
        let mut library = Command::new(exe);
        library.env("LD_PRELOAD", common::library()).env("COREHOP_POLICY", policy);
        let out = finish(library, &format!("cancel_blocked under {policy}"));
        assert!(out.status.success(), "{policy}: {:?} {}", out.status, text(&out.stderr));
        assert_eq!(text(&out.stdout), text(&plain.stdout), "{policy}");
    }
    // Recording a trace times every call: the read is made, timed, by the entry point.
    let dir = tempfile::tempdir().unwrap();
    let mut traced = corehop();
    traced.args(["run", "--offload", "--policy", "never", "--record-trace"]).arg(dir.path().join("t.csv"));
    traced.args(["--", exe]);
    let out = finish(traced, "cancel_blocked with a trace");
    assert!(out.status.success(), "traced: {:?} {}", out.status, text(&out.stderr));
    assert_eq!(text(&out.stdout), text(&plain.stdout), "traced");
    let trace = std::fs::read_to_string(dir.path().join("t.csv")).unwrap();
    assert!(trace.lines().any(|l| l.starts_with("read,")), "the timed reads are in the trace: {trace}");
}

#[test]
fn a_thread_cancelled_at_a_call_the_library_handles_ends_as_it_does_plainly() {
    let Some((_dir, exe)) = fixture("cancel_at_calls") else { return };
    let run = |mode: &str, how: &str, set_up: &dyn Fn(&mut Command)| {
        let files = tempfile::tempdir().unwrap();
        let mut command = Command::new(&exe);
        command.arg(mode).arg(files.path());
        set_up(&mut command);
        finish(command, &format!("cancel_at_calls {mode} {how}"))
    };
    for mode in ["moved", "fifo", "pending"] {
        let plain = run(mode, "plain", &|_| {});
        assert_eq!(text(&plain.stdout), format!("{mode}: cancelled: yes, cleanup ran: yes\n"));
        // With the library preloaded from the start every call takes its full path; `always`
        // and `size` move the reads, and the cancellation acts at the start of a moved one.
        for policy in ["never", "adaptive", "always", "size"] {
            let out = run(mode, policy, &|c| {
                c.env("LD_PRELOAD", common::library()).env("COREHOP_POLICY", policy);
            });
            assert!(out.status.success(), "{mode} under {policy}: {:?} {}", out.status, text(&out.stderr));
            assert_eq!(text(&out.stdout), text(&plain.stdout), "{mode} under {policy}");
        }
        let out = run(mode, "through the stub", &|c| {
            common::through_the_stub(c, "adaptive");
        });
        assert!(out.status.success(), "{mode} through the stub: {:?} {}", out.status, text(&out.stderr));
        assert_eq!(text(&out.stdout), text(&plain.stdout), "{mode} through the stub");
    }
}

#[test]
fn a_handler_that_jumps_out_of_a_moved_read_finds_it_done_as_plainly() {
    // Plainly the handler runs once the read has returned; were it to run while the read was
    // away, the service thread would write into the buffer after the jump. Each way of
    // installing it: three the library sees, and one before its first call that it does not.
    let Some((_dir, exe)) = fixture("jump_from_handler") else { return };
    for how in ["sigaction", "signal", "syscall", "early"] {
        let run = |what: &str, set_up: &dyn Fn(&mut Command)| {
            let files = tempfile::tempdir().unwrap();
            let mut command = Command::new(&exe);
            command.arg(files.path()).arg(how);
            set_up(&mut command);
            let out = finish(command, &format!("jump_from_handler {how} {what}"));
            assert!(out.status.success(), "{how} {what}: {:?} {}", out.status, text(&out.stderr));
            out
        };
        let plain = run("plain", &|_| {});
        if text(&plain.stdout).starts_with("jumped: no") {
            common::skip("the reads ended before the timer: no jump to check");
            return;
        }
        assert_eq!(text(&plain.stdout), "jumped: yes, buffer written after the jump: no\n");
        for policy in ["always", "adaptive"] {
            let out = run(policy, &|c| {
                c.env("LD_PRELOAD", common::library()).env("COREHOP_POLICY", policy);
            });
            assert_eq!(text(&out.stdout), text(&plain.stdout), "{how} under {policy}");
        }
        let out = run("through the stub", &|c| {
            common::through_the_stub(c, "adaptive");
        });
        assert_eq!(text(&out.stdout), text(&plain.stdout), "{how} through the stub");
    }
}

/// A moved write that fails and raises SIGPIPE or SIGXFSZ at its caller: the program's handler
/// runs before libc sets errno, as plainly, so errno is the write's own error whatever the
/// handler left in it (it was the handler's: the library set errno before giving the held
/// signal back).
#[test]
fn errno_after_a_handler_the_call_raised_is_the_call_s() {
    if !have_cc() {
        return;
    }
    let (plain, _) = same_both_ways("handler_errno");
    assert!(
        text(&plain.stdout).contains("pipe: -1 Broken pipe, handler ran 1 times"),
        "{}",
        text(&plain.stdout)
    );
    assert!(text(&plain.stdout).contains("file: -1 File too large"), "{}", text(&plain.stdout));
}

#[test]
fn a_call_the_library_passes_by_returns_straight_to_the_program() {
    // `never`: every call after the first passes the library by (nothing counts or times them).
    let Some((_dir, exe)) = fixture("passing_frames") else { return };
    let plain = finish(Command::new(&exe), "passing_frames plain");
    assert_eq!(text(&plain.stdout), "frames of the library under the read: 0\n");
    let mut library = Command::new(&exe);
    library.env("LD_PRELOAD", common::library()).env("COREHOP_POLICY", "never");
    let out = finish(library, "passing_frames preloaded");
    assert!(out.status.success(), "{:?} {}", out.status, text(&out.stderr));
    assert_eq!(text(&out.stdout), text(&plain.stdout));
}

#[test]
fn a_blocking_regular_file_read_is_interrupted_by_the_callers_signal() {
    if !have_cc() || !is_root() {
        return;
    }
    let found = ["unshare", "mount"].iter().all(|t| {
        Command::new("sh").args(["-c", &format!("command -v {t}")]).status().is_ok_and(|s| s.success())
    });
    if !found {
        common::skip("needs unshare and mount (util-linux) for a private tracefs");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = compile("blocking_file", dir.path());
    let tracefs = dir.path().join("tracefs");
    std::fs::create_dir(&tracefs).unwrap();
    let corehop_bin = env!("CARGO_BIN_EXE_corehop");
    common::library();
    let mut outputs = Vec::new();
    for offload in [false, true] {
        // A private mount namespace, so the tracefs mount leaves no trace on the machine.
        let script = format!(
            "mount --make-rprivate / && mount -t tracefs nodev '{t}' || exit 77; \
             exec '{c}' run {o} -- '{e}' '{t}/trace_pipe'",
            t = tracefs.display(),
            c = corehop_bin,
            o = if offload { "--offload --policy always" } else { "" },
            e = exe.display(),
        );
        let mut command = Command::new("unshare");
        command.args(["-m", "sh", "-c", &script]).env_remove("LD_PRELOAD");
        outputs.push(finish(command, &format!("trace_pipe read (offload: {offload})")));
    }
    if outputs[0].status.code() == Some(77) {
        common::skip(&format!("tracefs cannot be mounted here: {}", text(&outputs[0].stderr)));
        return;
    }
    if !text(&outputs[0].stdout).contains("read: Interrupted system call") {
        // The ring buffer is the machine's: something traced meanwhile, so the read did not block.
        eprintln!("skipped: trace_pipe had data, the plain read did not block: {}", text(&outputs[0].stdout));
        return;
    }
    assert_same(&["blocking_file"], &outputs[0], &outputs[1]);
    assert!(
        text(&outputs[1].stdout).contains("read: Interrupted system call"),
        "{}",
        text(&outputs[1].stdout)
    );
}

/// Runs `argv` with the library preloaded directly (no `corehop run`), with `env`.
fn preloaded(argv: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Output {
    let mut command = Command::new(argv[0]);
    command.args(&argv[1..]).env("LD_PRELOAD", common::library()).env("COREHOP_POLICY", "always");
    for (k, v) in env {
        command.env(k, v);
    }
    finish(command, &format!("{argv:?} preloaded"))
}

#[test]
fn the_stats_file_is_never_a_fifo_nor_reached_through_a_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    let c_fifo = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o600) }, 0);
    let out = preloaded(&["cat", "/etc/hostname"], &[("COREHOP_STATS_FILE", fifo.as_os_str())]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let target = dir.path().join("target");
    std::fs::write(&target, "").unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let out = preloaded(&["cat", "/etc/hostname"], &[("COREHOP_STATS_FILE", link.as_os_str())]);
    assert!(out.status.success());
    assert_eq!(std::fs::read(&target).unwrap(), b"", "the summary went through the symlink");
}

#[test]
fn the_summary_survives_a_relative_or_missing_tmpdir() {
    let dir = tempfile::tempdir().unwrap();
    for tmpdir in ["relative", "/no/such/directory"] {
        let mut command = corehop();
        command
            .args(["run", "--offload", "--policy", "always", "--stats", "--", "cat", "/etc/hostname"])
            .env("TMPDIR", tmpdir)
            .current_dir(dir.path());
        let out = finish(command, "corehop run --stats");
        assert!(out.status.success());
        assert!(
            text(&out.stderr).contains("offloaded"),
            "TMPDIR={tmpdir}: no summary: {}",
            text(&out.stderr)
        );
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "a stray file in the program's directory"
        );
    }
}

#[test]
fn corehop_run_passes_termination_on_and_dies_by_the_same_signal() {
    let dir = tempfile::tempdir().unwrap();
    // Killed by a signal: corehop is killed by the same one.
    let mut command = corehop();
    command.args(["run", "--", "sh", "-c", "kill -TERM $$"]);
    let out = finish(command, "corehop run of a program killed by SIGTERM");
    assert_eq!(out.status.signal(), Some(libc::SIGTERM), "{:?}", out.status);

    // corehop itself is sent SIGTERM or SIGINT: the program gets it and nothing is left.
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let pid_file = dir.path().join("pid");
        let _ = std::fs::remove_file(&pid_file);
        let mut command = corehop();
        command
            .args(["run", "--offload", "--policy", "always", "--stats", "--", "sh", "-c"])
            .arg(format!("echo $$ > '{}'; exec sleep 30", pid_file.display()))
            .env("TMPDIR", dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // corehop keeps a signal it was started ignoring ignored, as a shell does; a test run
        // started in the background (`cmd &` without job control) ignores SIGINT.
        // SAFETY: signal() is async-signal-safe, and nothing else runs in the forked child.
        unsafe {
            command.pre_exec(move || {
                libc::signal(signal, libc::SIG_DFL);
                Ok(())
            });
        }
        let mut child = command.spawn().unwrap();
        let start = Instant::now();
        while std::fs::read_to_string(&pid_file).map_or(true, |s| !s.ends_with('\n')) {
            assert!(start.elapsed() < LIMIT, "the program never started");
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(100)); // the shell execs sleep
        let program: i32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
        // SAFETY: kill has no memory preconditions.
        unsafe { libc::kill(child.id() as i32, signal) };
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if start.elapsed() > LIMIT {
                let _ = child.kill();
                // SAFETY: as above.
                unsafe { libc::kill(program, libc::SIGKILL) };
                panic!("signal {signal}: corehop did not end");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(status.signal(), Some(signal), "signal {signal}: {status:?}");
        // SAFETY: as above; signal 0 only asks whether the process exists.
        let alive = unsafe { libc::kill(program, 0) } == 0;
        if alive {
            // SAFETY: as above.
            unsafe { libc::kill(program, libc::SIGKILL) };
        }
        assert!(!alive, "signal {signal}: the program outlived corehop");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .filter(|name| name.starts_with("corehop-offload"))
            .collect();
        assert!(left.is_empty(), "signal {signal}: left behind {left:?}");
    }
}

#[test]
fn credential_tools_give_the_same_identity() {
    if !is_root() {
        return;
    }
    // setpriv keeps capabilities on its own thread (PR_SET_KEEPCAPS, capset) between set*id
    // calls; glibc aborts if another thread's set*id result differs from them.
    let tools: [&[&str]; 3] = [
        &["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "id"],
        &["runuser", "-u", "nobody", "--", "id"],
        &["su", "nobody", "-s", "/bin/sh", "-c", "id"],
    ];
    for argv in tools {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {}", argv[0])])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            eprintln!("skipped: {} is not installed", argv[0]);
            continue;
        }
        let (plain, offload) = pair(argv, &[]);
        assert_same(argv, &plain, &offload);
        assert!(text(&offload.stdout).contains("uid=65534"), "{argv:?}: {}", text(&offload.stdout));
    }
}

#[test]
fn a_descriptor_is_checked_once_per_file_for_positioned_calls() {
    if !have_cc() || !common::have("strace") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let exe = compile("positioned", tmp.path());
    let argv = [exe.to_str().unwrap()];
    let (plain, offload) = pair(&argv, &[]);
    assert_same(&argv, &plain, &offload);
    assert!(
        text(&plain.stdout).contains("total 3000 fifo pread -1 (Illegal seek)"),
        "{}",
        text(&plain.stdout)
    );
    // The service thread asks the kernel what the descriptor is (fstat) before a positioned
    // call only while nothing is known of the file it names: once for the file, once after
    // it was closed and the number reused, once after dup2 put a FIFO there. Not 300 times.
    let dir = tmp.path().join("traced");
    std::fs::create_dir(&dir).unwrap();
    let log = tmp.path().join("strace.log");
    let mut command = Command::new("strace");
    command
        .args(["-f", "-e", "trace=fstat", "-o"])
        .arg(&log)
        .arg(&exe)
        .env("LD_PRELOAD", common::library())
        .env("COREHOP_POLICY", "always")
        .current_dir(&dir);
    let traced = finish(command, "positioned under strace");
    assert!(traced.status.success(), "{}", text(&traced.stderr));
    let out = text(&traced.stdout);
    let fd: i32 = out.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("fd in the output");
    let checks = std::fs::read_to_string(&log).unwrap().matches(&format!("fstat({fd},")).count();
    assert!((2..=6).contains(&checks), "{checks} fstat calls on fd {fd}; output: {out}");
}

#[test]
fn ldd_lists_the_libraries_it_lists_plainly() {
    if !common::have("ldd") {
        return;
    }
    // The loader prints where it mapped each library; only that differs from run to run.
    fn listed(out: &Output) -> String {
        text(&out.stdout).lines().map(|l| l.split(" (0x").next().unwrap_or(l)).collect::<Vec<_>>().join("\n")
    }
    let true_path = ["/bin/true", "/usr/bin/true"].into_iter().find(|p| Path::new(p).exists()).unwrap();
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)]);
    let cases: [Case; 3] = [
        (&["ldd", true_path], &[]),
        (&["sh", "-c", &format!("ldd {true_path}")], &[]),
        // `corehop run` itself starting a program the loader only lists.
        (&[true_path], &[("LD_TRACE_LOADED_OBJECTS", "1")]),
    ];
    for (argv, env) in cases {
        let (plain, offload) = pair(argv, env);
        assert!(plain.status.success(), "{argv:?} plain: {}", text(&plain.stderr));
        assert!(listed(&plain).contains("libc"), "{argv:?}: {}", listed(&plain));
        assert_eq!(listed(&plain), listed(&offload), "{argv:?} {env:?}");
        assert_eq!(plain.status.code(), offload.status.code());
    }
    // Under the default policy, through the start-up stub.
    let mut default = corehop();
    default.args(["run", "--offload", "--", "sh", "-c", &format!("ldd {true_path}")]);
    let out = finish(default, "ldd under the default policy");
    let (plain, _) = pair(&["ldd", true_path], &[]);
    assert_eq!(listed(&out), listed(&plain));
    // The loader asked itself (`ld.so --list`), started by corehop, by a shell under the
    // library, and by one under the stub.
    let Some(loader) =
        ["/usr/bin/ld.so", "/lib64/ld-linux-x86-64.so.2"].into_iter().find(|p| Path::new(p).exists())
    else {
        return common::skip("no dynamic loader at a known path");
    };
    let line = format!("{loader} --list {true_path}");
    let cases: [&[&str]; 2] = [&[loader, "--list", true_path], &["sh", "-c", &line]];
    for argv in cases {
        let (plain, offload) = pair(argv, &[]);
        assert!(listed(&plain).contains("libc"), "{argv:?}: {}", listed(&plain));
        assert_eq!(listed(&plain), listed(&offload), "{argv:?}");
    }
    let mut default = corehop();
    default.args(["run", "--offload", "--", "sh", "-c", &line]);
    let out = finish(default, "ld.so --list under the default policy");
    assert_eq!(listed(&out), listed(&pair(&[loader, "--list", true_path], &[]).0));
}
