//! A task that overflows its stack is reported by name, not as a bare segmentation fault.
//!
//! Every task stack has a guard page below it; running into it raises `SIGSEGV`. Rust's own
//! handler recognises only the guard pages of thread stacks, so for a task the process would
//! just die with "Segmentation fault". This handler, installed once (chained in front of the
//! one that was there, Rust's), checks whether the fault hit the guard page of the task
//! running on this thread. If so it writes one line to stderr, naming the CPU and the stack
//! size and what to change, then lets the fault kill the process as before (`SIGSEGV`,
//! default action). Any other fault goes to the previous handler unchanged.
//!
//! The handler runs on the thread's alternate signal stack (Rust gives every thread one; the
//! task's own stack has no room left), and does only async-signal-safe things: reads a
//! thread-local pointer and the task's context, formats into a buffer on its stack, `write`s.

use std::cell::UnsafeCell;
use std::sync::Once;

use crate::context;

/// The handlers that were installed before ours, for `SIGSEGV` and `SIGBUS`.
struct Previous(UnsafeCell<[libc::sigaction; 2]>);

// SAFETY: written once inside `Once::call_once`, before our handler is installed (so before it
// can read it), and only read afterwards.
unsafe impl Sync for Previous {}

static PREVIOUS: Previous = Previous(UnsafeCell::new(unsafe { std::mem::zeroed() }));
const SIGNALS: [libc::c_int; 2] = [libc::SIGSEGV, libc::SIGBUS];

/// Installs the handler (once per process). Best effort: if `sigaction` fails, overflows
/// stay plain segmentation faults.
pub(crate) fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for (i, &signal) in SIGNALS.iter().enumerate() {
            // SAFETY: `sigaction` with a zeroed, then filled, struct; `PREVIOUS` is written
            // before our handler is installed for `signal`, so the handler never reads it
            // half-written.
            unsafe {
                let previous = &mut (*PREVIOUS.0.get())[i];
                if libc::sigaction(signal, std::ptr::null(), previous) != 0 {
                    continue;
                }
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = handler as *const () as usize;
                action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(signal, &action, std::ptr::null_mut());
            }
        }
    });
}

/// The guard page below a task's stack, for the handler to recognise.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Guard {
    /// The guard page, `start..end` (the start of the stack's mapping, one page).
    start: usize,
    end: usize,
    /// Usable bytes of the stack above it.
    stack_bytes: usize,
}

impl Guard {
    /// The guard of a stack whose mapping (guard page included) starts at `limit` and ends
    /// at `base`. Computed when the task is made, so the handler need not ask the OS.
    pub(crate) fn of(limit: usize, base: usize) -> Guard {
        let page = page_size();
        Guard { start: limit, end: limit + page, stack_bytes: base - limit - page }
    }

    fn contains(&self, addr: usize) -> bool {
        (self.start..self.end).contains(&addr)
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

extern "C" fn handler(signal: libc::c_int, info: *mut libc::siginfo_t, ucontext: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers of fault signals.
    let addr = unsafe { (*info).si_addr() } as usize;
    if let (Some(ctx), Some(cpu)) = (context::task(), context::here()) {
        if ctx.guard.contains(addr) {
            report(cpu.0, ctx.guard.stack_bytes);
            // Die of the fault as before: the default action, when the instruction re-runs.
            // SAFETY: resetting a signal to its default action.
            unsafe { libc::signal(signal, libc::SIG_DFL) };
            return;
        }
    }
    let index = SIGNALS.iter().position(|&s| s == signal).unwrap_or(0);
    // SAFETY: written before this handler was installed (see `install`).
    let previous = unsafe { &(*PREVIOUS.0.get())[index] };
    match previous.sa_sigaction {
        libc::SIG_DFL | libc::SIG_IGN => {
            // SAFETY: as above; the faulting instruction re-runs and takes the default action.
            unsafe { libc::signal(signal, libc::SIG_DFL) };
        }
        f if previous.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: the previous handler was installed with SA_SIGINFO, so this is its type.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(f) };
            f(signal, info, ucontext);
        }
        f => {
            // SAFETY: a plain `sa_handler` (no SA_SIGINFO).
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(f) };
            f(signal);
        }
    }
}

/// Writes the report line to stderr without allocating.
fn report(cpu: usize, stack_bytes: usize) {
    let mut line = Line { buf: [0; 200], len: 0 };
    line.push(b"corehop: a task on cpu");
    line.number(cpu);
    line.push(b" overflowed its stack of ");
    line.number(stack_bytes / 1024);
    line.push(b" KiB; give tasks more with Builder::stack_size\n");
    // SAFETY: writing an initialised buffer to fd 2; async-signal-safe.
    unsafe { libc::write(2, line.buf.as_ptr().cast(), line.len) };
}

struct Line {
    buf: [u8; 200],
    len: usize,
}

impl Line {
    fn push(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    fn number(&mut self, mut n: usize) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_line_formats_numbers_without_allocating() {
        let mut line = Line { buf: [0; 200], len: 0 };
        line.push(b"cpu");
        line.number(0);
        line.push(b" ");
        line.number(262_144);
        assert_eq!(&line.buf[..line.len], b"cpu0 262144");
    }

    #[test]
    fn a_guard_covers_one_page_below_the_stack() {
        let page = page_size();
        let guard = Guard::of(0x10_0000, 0x10_0000 + page + 64 * 1024);
        assert_eq!(guard.stack_bytes, 64 * 1024);
        assert!(guard.contains(0x10_0000) && guard.contains(0x10_0000 + page - 1));
        assert!(!guard.contains(0x10_0000 + page) && !guard.contains(0x10_0000 - 1));
    }
}
