//! Which signals the program has handlers for. A call that moves holds those back while it is
//! away (`sys::hold_signals`: two system calls, about 0.3 µs here): a handler could leave the
//! wait with `siglongjmp` while the service thread still writes into the program's memory. A
//! program that catches nothing skips the hold.
//!
//! The kernel is asked when the service threads start, before the first call moves (handlers
//! installed before this library was loaded included); after that the library's `sigaction`, `signal`, `sigset` and
//! the raw `syscall(SYS_rt_sigaction)` keep the set current. A handler is noted before it is
//! installed and forgotten only once the kernel says it is gone, so the set errs toward
//! holding. Handlers installed later by other means (glibc's rarer names for `signal`, inline
//! assembly) are not seen.

use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::sys;

/// A bit per signal the program has a handler for (bit `n - 1` for signal `n`), complete once
/// [`ask_the_kernel`] has run.
static CAUGHT: AtomicU64 = AtomicU64::new(0);

/// `SIG_DFL`, `SIG_IGN` and `SIG_HOLD` (`sigset`): no function of the program's.
fn is_function(handler: usize) -> bool {
    handler > 2 && handler != libc::SIG_ERR
}

/// `sig`'s bit in [`CAUGHT`], if the kernel has such a signal.
fn bit(sig: i32) -> Option<u64> {
    (1..=64).contains(&sig).then(|| sys::signal_bit(sig))
}

/// Asks the kernel which signals have handlers now: when the service threads start, before
/// the first call moves (handlers installed before this library was loaded included).
pub fn ask_the_kernel() {
    let caught = (1..=64)
        .filter(|&sig| is_function(sys::handler_of(sig)))
        .fold(0, |set, sig| set | bit(sig).unwrap_or(0));
    CAUGHT.fetch_or(caught, Relaxed);
}

/// The signals a moved call holds back ([`sys::hold_signals`]): those with a handler, but
/// glibc's own and the faults (0: none). A signal without one runs no code of the program's,
/// and one that ends the process must end it as it does plainly, while a call waits on a file
/// system that does not answer.
pub fn to_hold() -> u64 {
    CAUGHT.load(Relaxed) & sys::HOLDABLE
}

/// Runs `call`, which may change the handler of `sig` (`changes`: it may, as far as its
/// arguments tell), and returns its result. The signal counts as caught from before the call
/// until the kernel, asked after it, says it has no handler: no program pointer is read, so a
/// bad one fails in libc or the kernel as it does plainly.
pub fn installing(sig: i32, changes: bool, call: impl FnOnce() -> i64) -> i64 {
    let Some(bit) = bit(sig).filter(|_| changes) else { return call() };
    CAUGHT.fetch_or(bit, Relaxed);
    let result = call();
    if !is_function(sys::handler_of(sig)) {
        CAUGHT.fetch_and(!bit, Relaxed);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" fn handler(_: libc::c_int) {}

    fn handler_address() -> usize {
        handler as *const () as usize
    }

    /// Sets `sig`'s disposition to `to` with libc's `signal`, through [`installing`].
    fn set(sig: i32, to: usize) -> i64 {
        // SAFETY: a valid signal number, and a handler that does nothing or a disposition.
        installing(sig, true, || unsafe { libc::signal(sig, to) } as i64)
    }

    #[test]
    fn a_handler_is_held_for_until_the_kernel_says_it_is_gone() {
        // SIGURG: no other test of this crate touches it.
        let sig = libc::SIGURG;
        let mask = 1u64 << (sig - 1);
        set(sig, handler_address());
        assert_ne!(CAUGHT.load(Relaxed) & mask, 0);
        assert_ne!(to_hold() & mask, 0);
        set(sig, libc::SIG_IGN);
        assert_eq!(CAUGHT.load(Relaxed) & mask, 0);
        set(sig, handler_address());
        set(sig, libc::SIG_DFL);
        assert_eq!(CAUGHT.load(Relaxed) & mask, 0);
        // A call that fails leaves what the kernel has; a number the kernel has no signal
        // for passes the call's own result on.
        set(libc::SIGKILL, handler_address());
        assert_eq!(CAUGHT.load(Relaxed) & 1 << (libc::SIGKILL - 1), 0);
        assert_eq!(installing(65, true, || -1), -1);
    }
}
