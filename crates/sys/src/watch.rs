//! The calls the preload library watches without ever moving them: those that start a process
//! its fork handlers do not see, and those that change what the kernel checks for the calling
//! thread alone. The library (`crates/preload`) and its start-up stub (`crates/preload-stub`,
//! which includes this file by path and links nothing) decide with the same functions.
//!
//! It also holds the default policy's first epoch, which the stub waits out, and the check
//! that keeps both out of a process with a memory limit ([`memory_limited`]).
//!
//! Only `core`: the stub is `no_std`. The system-call numbers are the kernel's (a test checks
//! them against `libc`).

/// The default offload policy's first epoch, in which it moves nothing: a process under the
/// start-up stub gets the library no sooner (its stub waits twice as long: `LOAD_AGE_NS`).
pub const FIRST_EPOCH_NS: u64 = 20_000_000;

/// `CLONE_THREAD`: a clone with it makes a thread of ours, not a process.
pub const CLONE_THREAD: i64 = 0x0001_0000;

/// `CLONE_FS` and `CLONE_FILES`: a thread made without them has a directory or a descriptor
/// table of its own.
const CLONE_FS_FILES: i64 = 0x200 | 0x400;

/// Whether a clone with `flags` makes a thread of ours with a directory or descriptors of its
/// own: a service thread, which has the process's, would act on those, so the library treats
/// it as an `unshare` (clone3's flags are in memory: the library reads them).
pub fn thread_with_own_files(flags: i64) -> bool {
    flags & CLONE_THREAD != 0 && flags & CLONE_FS_FILES != CLONE_FS_FILES
}

/// Kernel system-call numbers of this architecture (x86-64 or aarch64).
pub mod nr {
    macro_rules! numbers {
        ($($name:ident: $x86_64:literal, $aarch64:literal;)*) => {
            $(
                #[allow(missing_docs)]
                pub const $name: i64 = if cfg!(target_arch = "x86_64") { $x86_64 } else { $aarch64 };
            )*
        };
    }
    // name: x86-64, aarch64 (-1: no such call there).
    numbers! {
        CLONE: 56, 220;
        FORK: 57, -1;
        VFORK: 58, -1;
        SETUID: 105, 146;
        SETGID: 106, 144;
        SETREUID: 113, 145;
        SETREGID: 114, 143;
        SETGROUPS: 116, 159;
        SETRESUID: 117, 147;
        SETRESGID: 119, 149;
        SETFSUID: 122, 151;
        SETFSGID: 123, 152;
        CAPSET: 126, 91;
        PRCTL: 157, 167;
        UNSHARE: 272, 97;
        SETNS: 308, 268;
        SECCOMP: 317, 277;
        CLONE3: 435, 435;
        LANDLOCK_RESTRICT_SELF: 446, 446;
        GETPID: 39, 172;
        TGKILL: 234, 131;
        SETRLIMIT: 160, -1;
        PRLIMIT64: 302, 261;
        PROCESS_VM_READV: 310, 270;
    }
}

/// Whether a raw system call `nr` changes what the kernel checks for the calling thread only
/// (glibc's own set*id wrappers change every thread; the raw calls do not).
pub fn changes_thread_state(nr: i64) -> bool {
    use nr::*;
    matches!(
        nr,
        SETUID
            | SETGID
            | SETREUID
            | SETREGID
            | SETRESUID
            | SETRESGID
            | SETFSUID
            | SETFSGID
            | SETGROUPS
            | CAPSET
            | PRCTL
            | SECCOMP
            | UNSHARE
            | SETNS
            | LANDLOCK_RESTRICT_SELF
    )
}

/// Whether a `prctl` with this option changes the calling thread's security state:
/// PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_SET_SECUREBITS,
/// PR_SET_KEEPCAPS.
pub fn prctl_changes_thread_state(option: i64) -> bool {
    matches!(option, 22 | 38 | 24 | 47 | 28 | 8)
}

/// Whether a raw system call `nr` with first argument `a` starts a process the fork handlers
/// do not see: one sharing our memory, or a copy of it. clone3's flags are in memory the
/// kernel reads, so any clone3 counts.
pub fn starts_unseen_child(nr: i64, a: i64) -> bool {
    (nr >= 0 && (nr == nr::FORK || nr == nr::VFORK))
        || nr == nr::CLONE3
        || (nr == nr::CLONE && a & CLONE_THREAD == 0)
}

/// `RLIMIT_DATA` and `RLIMIT_AS`: the limits on a process's private writable mappings and on
/// its whole address space, both of which the library's own memory counts toward.
pub const RLIMIT_DATA: i64 = 2;
#[allow(missing_docs)]
pub const RLIMIT_AS: i64 = 9;
const RLIM_INFINITY: u64 = u64::MAX;
const EFAULT: i64 = 14;

/// Whether this process has a finite address-space or data limit (the soft value, which the
/// kernel enforces), or its limits cannot be read. There the room is the program's: the
/// library cannot know what its own later allocations would find, and a failed Rust
/// allocation aborts the program, so the stub stays on libc and the library moves nothing and
/// allocates nothing, for good.
///
/// `raw` makes a system call and returns the kernel's raw result; here `prlimit64` of the
/// caller, which writes into a local of this function.
pub fn memory_limited(raw: impl Fn(i64, [u64; 6]) -> i64) -> bool {
    [RLIMIT_AS, RLIMIT_DATA].into_iter().any(|resource| {
        let mut limit = [0u64; 2];
        let read = raw(nr::PRLIMIT64, [0, resource as u64, 0, limit.as_mut_ptr() as u64, 0, 0]);
        read != 0 || limit[0] != RLIM_INFINITY
    })
}

/// Whether a call that sets limit `resource` of process or thread `pid` (0: the caller) to
/// the `struct rlimit` at address `new` (0: sets none; `None`: not known) may leave this
/// process with a limit [`memory_limited`] stays out under. Asked before the call is made,
/// which then runs as plainly: one that fails leaves the process out for nothing, offload
/// only. Limits are the process's, so any thread of ours names it.
///
/// `raw` as for [`memory_limited`]: `getpid`, `tgkill` with signal 0 (which only checks that
/// the thread is ours), and `process_vm_readv` of our own memory into a local of this
/// function.
pub fn may_limit_memory(
    pid: i64,
    resource: i64,
    new: Option<u64>,
    raw: impl Fn(i64, [u64; 6]) -> i64,
) -> bool {
    // The kernel's arguments are ints.
    let (pid, resource) = (i64::from(pid as i32), i64::from(resource as u32));
    if (resource != RLIMIT_AS && resource != RLIMIT_DATA) || new == Some(0) {
        return false;
    }
    let me = raw(nr::GETPID, [0; 6]) as u64;
    if pid != 0 && pid as u64 != me && raw(nr::TGKILL, [me, pid as u64, 0, 0, 0, 0]) != 0 {
        return false;
    }
    let Some(new) = new else { return true };
    let mut soft = [0u8; 8];
    let local = [soft.as_mut_ptr() as u64, 8];
    let remote = [new, 8];
    match raw(nr::PROCESS_VM_READV, [me, local.as_ptr() as u64, 1, remote.as_ptr() as u64, 1, 0]) {
        8 => u64::from_ne_bytes(soft) != RLIM_INFINITY,
        // Memory the call cannot read either: it fails with EFAULT and changes nothing.
        ret if ret == -EFAULT => false,
        _ => true,
    }
}

/// [`may_limit_memory`] for a raw system call `nr` with arguments `a`, `b` and `c` (`None`:
/// not known, as to the start-up stub, which sees three registers of `syscall`'s).
pub fn raw_call_may_limit_memory(
    nr: i64,
    a: i64,
    b: i64,
    c: Option<i64>,
    raw: impl Fn(i64, [u64; 6]) -> i64,
) -> bool {
    if nr >= 0 && nr == nr::SETRLIMIT {
        may_limit_memory(0, a, Some(b as u64), raw)
    } else if nr == nr::PRLIMIT64 {
        may_limit_memory(a, b, c.map(|c| c as u64), raw)
    } else {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_without_the_process_s_files_is_told_apart() {
        let thread = i64::from(libc::CLONE_VM | libc::CLONE_SIGHAND | libc::CLONE_THREAD);
        let files = i64::from(libc::CLONE_FS | libc::CLONE_FILES);
        assert!(!thread_with_own_files(thread | files));
        assert!(thread_with_own_files(thread));
        assert!(thread_with_own_files(thread | i64::from(libc::CLONE_FS)));
        assert!(!thread_with_own_files(i64::from(libc::CLONE_VM)), "a process, not a thread");
    }

    #[test]
    fn the_numbers_are_the_kernels() {
        let pairs = [
            (nr::CLONE, libc::SYS_clone),
            (nr::SETUID, libc::SYS_setuid),
            (nr::SETGID, libc::SYS_setgid),
            (nr::SETREUID, libc::SYS_setreuid),
            (nr::SETREGID, libc::SYS_setregid),
            (nr::SETGROUPS, libc::SYS_setgroups),
            (nr::SETRESUID, libc::SYS_setresuid),
            (nr::SETRESGID, libc::SYS_setresgid),
            (nr::SETFSUID, libc::SYS_setfsuid),
            (nr::SETFSGID, libc::SYS_setfsgid),
            (nr::CAPSET, libc::SYS_capset),
            (nr::PRCTL, libc::SYS_prctl),
            (nr::UNSHARE, libc::SYS_unshare),
            (nr::SETNS, libc::SYS_setns),
            (nr::SECCOMP, libc::SYS_seccomp),
            (nr::CLONE3, libc::SYS_clone3),
            (nr::LANDLOCK_RESTRICT_SELF, libc::SYS_landlock_restrict_self),
            (nr::GETPID, libc::SYS_getpid),
            (nr::TGKILL, libc::SYS_tgkill),
            (nr::PRLIMIT64, libc::SYS_prlimit64),
            (nr::PROCESS_VM_READV, libc::SYS_process_vm_readv),
        ];
        for (ours, kernel) in pairs {
            assert_eq!(ours, kernel);
        }
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            (nr::FORK, nr::VFORK, nr::SETRLIMIT),
            (libc::SYS_fork, libc::SYS_vfork, libc::SYS_setrlimit)
        );
        assert_eq!((RLIMIT_AS, RLIMIT_DATA), (i64::from(libc::RLIMIT_AS), i64::from(libc::RLIMIT_DATA)));
        assert_eq!(RLIM_INFINITY, libc::RLIM_INFINITY);
        assert_eq!(CLONE_THREAD, i64::from(libc::CLONE_THREAD));
        let options = [
            libc::PR_SET_SECCOMP,
            libc::PR_SET_NO_NEW_PRIVS,
            libc::PR_CAPBSET_DROP,
            libc::PR_CAP_AMBIENT,
            libc::PR_SET_SECUREBITS,
            libc::PR_SET_KEEPCAPS,
        ];
        for option in options {
            assert!(prctl_changes_thread_state(i64::from(option)), "{option}");
        }
        assert!(!prctl_changes_thread_state(i64::from(libc::PR_SET_NAME)));
    }

    #[test]
    fn only_processes_count_as_children() {
        assert!(starts_unseen_child(nr::CLONE, 0));
        assert!(!starts_unseen_child(nr::CLONE, CLONE_THREAD | 0x100));
        assert!(starts_unseen_child(nr::CLONE3, 0));
        assert!(!starts_unseen_child(nr::SETUID, 0));
        assert!(changes_thread_state(nr::SETRESUID));
        assert!(!changes_thread_state(nr::CLONE));
    }
}
