//! Which calls go across: the offload policy, shared by all threads of the process.
//!
//! The policy is one value behind a try-lock. The interposed path never waits for the lock:
//! when another thread (or a signal handler interrupting this one) holds it, the call simply
//! runs on the caller, which never changes a result.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, Ordering};

use crate::calls::Kind;

/// One call as the policy sees it.
#[derive(Clone, Copy, Debug)]
pub struct Desc {
    pub kind: Kind,
    /// The descriptor, or -1 for path calls.
    pub fd: i32,
    /// Bytes asked for; 0 for calls that move no buffer.
    pub size: u64,
}

/// An offload policy: `never`, `always`, or `size[:BYTES]` (offload byte-moving calls of at
/// least BYTES, default 4096 — the 4 KB rule of fast-core-switching §3.6 — and the other
/// intercepted calls always).
#[derive(Clone, Debug, PartialEq)]
pub enum Policy {
    Never,
    Always,
    Size { bytes: u64 },
}

impl Policy {
    pub fn parse(spec: &str) -> Result<Policy, String> {
        let (name, arg) = match spec.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (spec, None),
        };
        match (name, arg) {
            ("never", None) => Ok(Policy::Never),
            ("always", None) => Ok(Policy::Always),
            ("size", None) => Ok(Policy::Size { bytes: 4096 }),
            ("size", Some(bytes)) => bytes
                .parse()
                .map(|bytes| Policy::Size { bytes })
                .map_err(|_| format!("size threshold {bytes:?} is not a number of bytes")),
            _ => Err(format!("unknown policy {spec:?} (expected never, always or size[:BYTES])")),
        }
    }

    /// Whether no call can ever go across (then no service thread is started).
    pub fn offloads_nothing(&self) -> bool {
        *self == Policy::Never
    }

    pub fn decide(&self, call: &Desc) -> bool {
        match self {
            Policy::Never => false,
            Policy::Always => true,
            Policy::Size { bytes } => !moves_bytes(call.kind) || call.size >= *bytes,
        }
    }

    /// The call ran for `run_ns` (wherever it ran).
    pub fn observe(&mut self, _call: &Desc, _run_ns: u64) {}

    /// Whether `observe` is worth the clock reads.
    pub fn learns(&self) -> bool {
        false
    }
}

fn moves_bytes(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Read
            | Kind::Write
            | Kind::Pread
            | Kind::Pwrite
            | Kind::Readv
            | Kind::Writev
            | Kind::Sendfile
            | Kind::Sendto
            | Kind::Recvfrom
    )
}

/// The process-wide policy behind a try-lock.
pub struct Shared {
    locked: AtomicBool,
    policy: UnsafeCell<Option<Policy>>,
}

// SAFETY: `policy` is only touched by the holder of `locked` (acquired with a CAS, released
// with a Release store), or during start-up before any other thread can reach it.
unsafe impl Sync for Shared {}

impl Shared {
    pub const fn new() -> Shared {
        Shared { locked: AtomicBool::new(false), policy: UnsafeCell::new(None) }
    }

    /// Runs `f` on the policy if the lock is free and a policy is installed.
    pub fn try_with<R>(&self, f: impl FnOnce(&mut Policy) -> R) -> Option<R> {
        if self.locked.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            return None;
        }
        // SAFETY: we hold the lock.
        let result = unsafe { (*self.policy.get()).as_mut().map(f) };
        self.locked.store(false, Ordering::Release);
        result
    }

    /// Installs the policy (start-up).
    pub fn install(&self, policy: Policy) {
        while self.locked.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            core::hint::spin_loop();
        }
        // SAFETY: we hold the lock.
        unsafe { *self.policy.get() = Some(policy) };
        self.locked.store(false, Ordering::Release);
    }

    /// Before `fork`: takes the lock so the child does not inherit a half-updated policy.
    /// Gives up after `spins` attempts (the forking thread may itself hold it, from a signal
    /// handler); returns whether it got the lock.
    pub fn lock_for_fork(&self, spins: u32) -> bool {
        for _ in 0..spins {
            if self.locked.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                return true;
            }
            core::hint::spin_loop();
        }
        false
    }

    /// After `fork`, in parent and child: releases what `lock_for_fork` took. In a child whose
    /// parent could not take the lock, the policy is dropped (every call then runs locally):
    /// its state may be half-updated.
    pub fn after_fork(&self, had_lock: bool, in_child: bool) {
        if had_lock {
            self.locked.store(false, Ordering::Release);
        } else if in_child {
            // SAFETY: the child has one thread; no one else can hold or take the lock. The old
            // value is leaked, not dropped, as it may be inconsistent.
            unsafe { core::mem::forget((*self.policy.get()).take()) };
            self.locked.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(kind: Kind, size: u64) -> Desc {
        Desc { kind, fd: 3, size }
    }

    #[test]
    fn policies_decide_as_documented() {
        let size = Policy::parse("size").unwrap();
        assert!(!size.decide(&call(Kind::Read, 4095)));
        assert!(size.decide(&call(Kind::Read, 4096)));
        assert!(size.decide(&call(Kind::Fsync, 0)));
        assert!(size.decide(&call(Kind::Open, 0)));
        assert!(Policy::parse("size:10").unwrap().decide(&call(Kind::Write, 10)));
        assert!(Policy::parse("always").unwrap().decide(&call(Kind::Read, 0)));
        assert!(!Policy::parse("never").unwrap().decide(&call(Kind::Fsync, 0)));
        assert!(Policy::parse("never").unwrap().offloads_nothing());
    }

    #[test]
    fn bad_specs_are_errors() {
        for spec in ["", "sometimes", "size:big", "always:1"] {
            assert!(Policy::parse(spec).is_err(), "{spec}");
        }
    }

    #[test]
    fn try_lock_refuses_while_held_and_fork_handshake_releases() {
        let shared = Shared::new();
        assert_eq!(shared.try_with(|_| ()), None, "no policy yet");
        shared.install(Policy::Always);
        assert_eq!(shared.try_with(|p| p.clone()), Some(Policy::Always));
        assert!(shared.lock_for_fork(1));
        assert_eq!(shared.try_with(|_| ()), None, "held across fork");
        assert!(!shared.lock_for_fork(3));
        shared.after_fork(true, false);
        assert!(shared.try_with(|_| ()).is_some());
        // A child whose parent could not take the lock drops the policy.
        shared.after_fork(false, true);
        assert_eq!(shared.try_with(|_| ()), None);
    }
}
