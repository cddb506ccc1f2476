//! Which calls go across: the offload policy, shared by all threads of the process.
//!
//! The policy is one value behind a try-lock. The interposed path never waits for the lock:
//! when another thread (or a signal handler interrupting this one) holds it, the call simply
//! runs on the caller, which never changes a result.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, Ordering};

use corehop_policy::offload::{CallDesc, Decision, OffloadPolicy};

use corehop_policy::offload::CallKind;

/// One call as the policy sees it.
#[derive(Clone, Copy, Debug)]
pub struct Desc {
    pub kind: CallKind,
    /// The descriptor, or -1 for path calls.
    pub fd: i32,
    /// Bytes asked for; 0 for calls that move no buffer.
    pub size: u64,
}

impl Desc {
    /// The policy crate's description. The call site is not known to an interposer (no
    /// portable return address without frame pointers), so the predictor key is the call,
    /// its descriptor and its size.
    fn to_policy(self) -> CallDesc {
        CallDesc::new(self.kind, self.fd, self.size, 0)
    }
}

/// Length of a tuning epoch for `predicted:…:tuned` (wall time between feedback reports).
pub const EPOCH_NS: u64 = 20_000_000;

/// An offload policy from `corehop_policy` (`never`, `always`, `size[:BYTES]`,
/// `static:CALL,…`, `predicted[:fa|dm][:N|tuned]`, N in ns), plus the epoch bookkeeping that
/// feeds a tuned predictor: the feedback is the program's rate of completed intercepted
/// calls, the only progress signal an unmodified program offers.
///
/// `corehop run` asks for the direct-mapped predictor (`predicted:dm:…`): its table is one
/// vector allocated at start-up, whereas the fully associative form's key index (a hash map)
/// may grow once, and an allocation inside an interposed call can deadlock a program that
/// calls `write` from a signal handler that interrupted `malloc`.
#[derive(Debug)]
pub struct Policy {
    inner: OffloadPolicy,
    epoch_start_ns: u64,
    epoch_calls: u64,
}

impl Policy {
    pub fn parse(spec: &str) -> Result<Policy, String> {
        let inner: OffloadPolicy =
            spec.parse().map_err(|e: corehop_policy::offload::OffloadError| e.to_string())?;
        Ok(Policy { inner, epoch_start_ns: 0, epoch_calls: 0 })
    }

    /// Whether no call can ever go across (then no service thread is started).
    pub fn offloads_nothing(&self) -> bool {
        matches!(self.inner, OffloadPolicy::Never)
    }

    /// Whether to offload. The queue delay is taken as 0: each caller waits for its own
    /// call, and a service thread serves callers in turn.
    pub fn decide(&self, call: &Desc) -> bool {
        self.inner.decide(&call.to_policy(), 0) == Decision::Offload
    }

    /// The call ran for `run_ns` (wherever it ran) and finished at `now_ns`.
    pub fn observe(&mut self, call: &Desc, run_ns: u64, now_ns: u64) {
        self.inner.observe(&call.to_policy(), run_ns);
        self.epoch_calls += 1;
        if self.epoch_start_ns == 0 {
            self.epoch_start_ns = now_ns;
        }
        let elapsed = now_ns.saturating_sub(self.epoch_start_ns);
        if elapsed >= EPOCH_NS {
            self.inner.epoch_end(self.epoch_calls as f64 * 1e9 / elapsed as f64);
            self.epoch_start_ns = now_ns;
            self.epoch_calls = 0;
        }
    }

    /// Whether `observe` is worth the clock reads.
    pub fn learns(&self) -> bool {
        self.inner.learns()
    }
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
    #[allow(clippy::new_without_default)] // used in a static, where Default is not const
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

    fn call(kind: CallKind, size: u64) -> Desc {
        Desc { kind, fd: 3, size }
    }

    #[test]
    fn policies_decide_as_documented() {
        let size = Policy::parse("size").unwrap();
        assert!(!size.decide(&call(CallKind::Read, 4095)));
        assert!(size.decide(&call(CallKind::Read, 4096)));
        assert!(size.decide(&call(CallKind::Fsync, 0)));
        assert!(size.decide(&call(CallKind::Open, 0)));
        assert!(Policy::parse("size:10").unwrap().decide(&call(CallKind::Write, 10)));
        assert!(Policy::parse("always").unwrap().decide(&call(CallKind::Read, 0)));
        assert!(!Policy::parse("never").unwrap().decide(&call(CallKind::Fsync, 0)));
        assert!(Policy::parse("never").unwrap().offloads_nothing());
        assert!(!Policy::parse("size").unwrap().learns());
    }

    #[test]
    fn predicted_learns_from_observed_runs() {
        let mut p = Policy::parse("predicted:fa:5000").unwrap();
        assert!(p.learns());
        let fsync = call(CallKind::Fsync, 0);
        assert!(!p.decide(&fsync), "nothing learnt yet");
        p.observe(&fsync, 80_000, 1);
        assert!(p.decide(&fsync), "last run 80 us > N = 5 us");
        let small = call(CallKind::Read, 10);
        p.observe(&small, 100, 2);
        assert!(!p.decide(&small));
    }

    #[test]
    fn bad_specs_are_errors() {
        for spec in ["", "sometimes", "size:big", "always:1", "predicted:xx:yy"] {
            assert!(Policy::parse(spec).is_err(), "{spec}");
        }
    }

    #[test]
    fn try_lock_refuses_while_held_and_fork_handshake_releases() {
        let shared = Shared::new();
        assert_eq!(shared.try_with(|_| ()), None, "no policy yet");
        shared.install(Policy::parse("always").unwrap());
        assert_eq!(shared.try_with(|p| p.decide(&call(CallKind::Read, 0))), Some(true));
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
