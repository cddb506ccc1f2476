//! The calls the preload library watches without ever moving them: those that start a process
//! its fork handlers do not see, and those that change what the kernel checks for the calling
//! thread alone. The library (`crates/preload`) and its start-up stub (`crates/preload-stub`,
//! which includes this file by path and links nothing) decide with the same functions.
//!
//! It also holds the default policy's first epoch, which the stub waits out.
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
        ];
        for (ours, kernel) in pairs {
            assert_eq!(ours, kernel);
        }
        #[cfg(target_arch = "x86_64")]
        assert_eq!((nr::FORK, nr::VFORK), (libc::SYS_fork, libc::SYS_vfork));
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
