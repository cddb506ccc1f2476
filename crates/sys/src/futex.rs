//! Process-private futexes: sleep while a word holds a value, wake the sleepers of a word.

use std::sync::atomic::AtomicU32;

use crate::raw::{check, syscall, Errno};

/// How a [`wait`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FutexWait {
    /// A wake-up arrived (or a spurious one: callers re-check their condition anyway).
    Woken,
    /// The word did not hold `expected`, so the thread did not sleep.
    Mismatch,
    /// The timeout passed.
    TimedOut,
    /// A signal interrupted the wait.
    Interrupted,
}

/// Sleeps while `word` holds `expected`, until [`wake`] on the same word, a signal, or
/// `timeout_ns` (relative; `None`: no limit). The check and the sleep are atomic in the
/// kernel, so a wake that follows a change of `word` is never lost.
pub fn wait(word: &AtomicU32, expected: u32, timeout_ns: Option<u64>) -> FutexWait {
    let ts = timeout_ns.map(|ns| libc::timespec {
        tv_sec: (ns / 1_000_000_000).min(libc::time_t::MAX as u64) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    });
    let ts_ptr = ts.as_ref().map_or(0, |t| t as *const libc::timespec as u64);
    let op = (libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG) as u64;
    // SAFETY: `word` is a live, aligned u32 for the duration of the call; the timeout (a
    // relative timespec) lives on this frame.
    let ret =
        unsafe { syscall(libc::SYS_futex, [word.as_ptr() as u64, op, u64::from(expected), ts_ptr, 0, 0]) };
    match check(ret) {
        Ok(_) => FutexWait::Woken,
        Err(Errno(libc::EAGAIN)) => FutexWait::Mismatch,
        Err(Errno(libc::ETIMEDOUT)) => FutexWait::TimedOut,
        Err(Errno(libc::EINTR)) => FutexWait::Interrupted,
        // EFAULT and EINVAL cannot happen with a valid reference; treat them as a spurious
        // wake-up, which every caller already tolerates.
        Err(_) => FutexWait::Woken,
    }
}

/// Wakes up to `n` threads sleeping in [`wait`] on `word`; returns how many woke.
pub fn wake(word: &AtomicU32, n: u32) -> usize {
    let op = (libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG) as u64;
    let n = n.min(i32::MAX as u32);
    // SAFETY: `word` is a live, aligned u32; FUTEX_WAKE only uses its address.
    let ret = unsafe { syscall(libc::SYS_futex, [word.as_ptr() as u64, op, u64::from(n), 0, 0, 0]) };
    check(ret).map_or(0, |woke| woke as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    #[test]
    fn a_wait_on_a_changed_word_returns_at_once_and_a_wake_is_not_lost() {
        let word = AtomicU32::new(1);
        assert_eq!(wait(&word, 0, None), FutexWait::Mismatch);
        assert_eq!(wait(&word, 1, Some(1_000)), FutexWait::TimedOut);
        let shared = Arc::new(AtomicU32::new(0));
        let sleeper = {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || {
                while shared.load(Ordering::Acquire) == 0 {
                    wait(&shared, 0, None);
                }
            })
        };
        shared.store(1, Ordering::Release);
        wake(&shared, 1);
        sleeper.join().unwrap();
    }
}
