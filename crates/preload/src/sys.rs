//! The preload's only door to the kernel: raw system calls, the clock, and the real
//! libc symbols behind the ones this library interposes.
//!
//! The system-call instruction and the futexes (inside the lanes) are `corehop_sys`'s, shared
//! with the runtime; the library links nothing of the runtime itself (its worker threads and
//! TLS destructors).
//!
//! Nothing here calls an interposed libc function (`read`, `write`, `open`, ...): inside an
//! `LD_PRELOAD` library those names resolve to our own wrappers, so the library's own I/O uses
//! the raw `syscall` instruction instead. Results come back as the kernel's raw value
//! (`-errno` on failure); errno is set only by the wrapper that returns to the program.

use core::ffi::{c_void, CStr};
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU8, Ordering};

pub use corehop_sys::raw::{getpid, gettid, is_err, syscall as raw};

/// Whether threads here have memory protection-key rights (x86-64 PKU, enabled by the
/// kernel): 0 not asked yet, 1 no, 2 yes.
static PKU: AtomicU8 = AtomicU8::new(0);

#[cfg(target_arch = "x86_64")]
fn pku() -> bool {
    match PKU.load(Ordering::Relaxed) {
        0 => {
            // CPUID leaf 7: ECX bit 4 (OSPKE), set once the kernel enabled the keys.
            #[allow(unused_unsafe)] // safe in newer Rust
            // SAFETY: CPUID leaf 7 exists on every x86-64 CPU that runs this (it reads zeros
            // where it does not); it has no side effects.
            let yes = unsafe { core::arch::x86_64::__cpuid_count(7, 0) }.ecx & (1 << 4) != 0;
            PKU.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
            yes
        }
        known => known == 2,
    }
}

/// The calling thread's protection-key rights register (PKRU), 0 without protection keys. Each
/// thread has its own: a program may let one thread alone write a region (`pkey_set`), and
/// a call the kernel makes for another thread would fail with EFAULT there.
#[cfg(target_arch = "x86_64")]
pub fn pkru() -> u32 {
    if !pku() {
        return 0;
    }
    let pkru: u32;
    // SAFETY: RDPKRU (with ecx 0) reads the register into eax and zeroes edx; the kernel
    // enabled it (OSPKE), so it does not fault. It touches no memory.
    unsafe {
        core::arch::asm!("rdpkru", in("ecx") 0, out("eax") pkru, out("edx") _, options(nomem, nostack));
    }
    pkru
}

/// Gives the calling (service) thread the rights `pkru` of the thread whose call it makes.
#[cfg(target_arch = "x86_64")]
pub fn set_pkru(pkru: u32) {
    if pku() && self::pkru() != pkru {
        // SAFETY: WRPKRU (ecx and edx 0) sets this thread's rights; a service thread's own
        // memory (its stack, the lanes, the library's statics) has key 0, whose rights a
        // program thread that can run at all has too.
        unsafe {
            core::arch::asm!("wrpkru", in("eax") pkru, in("ecx") 0, in("edx") 0, options(nostack));
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub fn pkru() -> u32 {
    0
}

#[cfg(not(target_arch = "x86_64"))]
pub fn set_pkru(_: u32) {}

/// Sends `sig` to thread `tid` of this process (0: only checks that the thread exists); the
/// kernel's result (`-ESRCH`: no such thread).
pub fn tgkill_self(tid: i32, sig: i32) -> i64 {
    // SAFETY: plain integers.
    unsafe { raw(libc::SYS_tgkill, [getpid() as u64, tid as u64, sig as u64, 0, 0, 0]) }
}

/// `CLOCK_MONOTONIC` in nanoseconds (vDSO: no system call, and not an interposed symbol).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec on this frame.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// True about once in `n` calls (`n` ≥ 1). A count-down per region of stack (eight,
/// one line each, picked by a hash of the stack's address, as in the start-up stub) costs a
/// load and a store: a thread-local one would cost the `__tls_get_addr` call this exists to
/// avoid, a shared one would bounce its line between the program's threads, and reading the
/// cycle counter on every call cost 9.5 ns here. Each count-down restarts at a random length
/// (mean `n`, from the cycle counter), so the calls picked do not lock onto the phase of a
/// periodic pattern (a reader of "x\n" lines, one byte a read, would otherwise time only the
/// reads that did not wait).
#[inline]
pub fn one_in(n: u32) -> bool {
    // The address of a byte never written: a written one made the entry point's `pop` of the
    // slot it shares wait for the store (a failed store-to-load forward, most of the fast
    // path's cost in `perf annotate`).
    let here = core::mem::MaybeUninit::<u8>::uninit();
    let stack = here.as_ptr() as usize;
    // Threads' stacks lie at least 64 KiB apart; the multiplier spreads the region numbers.
    let slot = ((stack >> 16) as u32).wrapping_mul(0x9e37_79b1) >> (32 - COUNTDOWN_SLOTS.trailing_zeros());
    let countdown = &COUNTDOWNS[slot as usize].0;
    // A relaxed load and store, not a read-modify-write: threads that share a slot can only
    // lose a count, which shifts the sampling a little and nothing else.
    let left = countdown.load(Ordering::Relaxed);
    if left > 1 {
        countdown.store(left - 1, Ordering::Relaxed);
        return false;
    }
    countdown.store(random_below(2 * n.max(1) - 1) + 1, Ordering::Relaxed);
    true
}

const COUNTDOWN_SLOTS: u32 = 8;

#[repr(align(64))]
struct Countdown(AtomicU32);

static COUNTDOWNS: [Countdown; COUNTDOWN_SLOTS as usize] =
    [const { Countdown(AtomicU32::new(0)) }; COUNTDOWN_SLOTS as usize];

/// A number in `0..bound` (`bound` > 0) from the cycle counter, for choices that need to be
/// spread, not secret.
fn random_below(bound: u32) -> u32 {
    let ticks: u64;
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc reads the time-stamp counter; it touches no memory.
        unsafe {
            core::arch::asm!("rdtsc", "shl rdx, 32", "or rax, rdx", out("rax") ticks, out("rdx") _, options(nomem, nostack))
        };
    }
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: reads the virtual counter register, which user space may read on Linux.
        unsafe { core::arch::asm!("mrs {t}, cntvct_el0", t = out(reg) ticks, options(nomem, nostack)) };
    }
    // A multiplicative hash spreads every bit of the counter into the top ones, so a counter
    // that ticks in steps of 2^k is as spread as one that ticks by one.
    (((ticks.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) * u64::from(bound)) >> 32) as u32
}

/// Sleeps `ns` nanoseconds (restarting after signals).
pub fn sleep_ns(ns: u64) {
    let mut req =
        libc::timespec { tv_sec: (ns / 1_000_000_000) as i64, tv_nsec: (ns % 1_000_000_000) as i64 };
    loop {
        let mut rem = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        let req_ptr = &req as *const libc::timespec as u64;
        let rem_ptr = &mut rem as *mut libc::timespec as u64;
        // SAFETY: both timespecs live on this frame for the call.
        let ret = unsafe { raw(libc::SYS_nanosleep, [req_ptr, rem_ptr, 0, 0, 0, 0]) };
        if ret != -(libc::EINTR as i64) {
            return;
        }
        req = rem;
    }
}

/// Maps `bytes` of fresh zeroed, readable and writable memory at an address the kernel picks
/// (`flags`: more `MAP_*` flags, such as `MAP_NORESERVE`); `None` if the kernel refused.
pub fn map_anonymous(bytes: usize, flags: i32) -> Option<*mut u8> {
    let prot = (libc::PROT_READ | libc::PROT_WRITE) as u64;
    let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags) as u64;
    // SAFETY: an anonymous private mapping at an address the kernel picks touches no memory
    // of ours; the result is checked before use.
    let addr = unsafe { raw(libc::SYS_mmap, [0, bytes as u64, prot, flags, u64::MAX, 0]) };
    (!is_err(addr)).then_some(addr as *mut u8)
}

/// Unmaps `bytes` at `addr`; whether the kernel did.
///
/// # Safety
/// `addr..addr + bytes` is (a page-aligned part of) a mapping made by [`map_anonymous`] that
/// nothing uses any more.
pub unsafe fn unmap(addr: *mut u8, bytes: usize) -> bool {
    // SAFETY: the caller's promise.
    !is_err(unsafe { raw(libc::SYS_munmap, [addr as u64, bytes as u64, 0, 0, 0, 0]) })
}

/// The raw calls `corehop_sys::watch`'s limit checks make, each of which writes only into a
/// local of the check that asks (`prlimit64`'s old limits, `process_vm_readv`'s copy) or into
/// nothing (`getpid`, `tgkill` with signal 0).
fn raw_for_limits(nr: i64, args: [u64; 6]) -> i64 {
    // SAFETY: the calls above, with the arguments `watch` gives (its locals' addresses, live
    // for the call).
    unsafe { raw(nr, args) }
}

/// Whether this process has a finite address-space or data limit ([`corehop_sys::watch::memory_limited`]):
/// two system calls, no allocation.
pub fn memory_limited() -> bool {
    corehop_sys::watch::memory_limited(raw_for_limits)
}

/// Whether a call setting limit `resource` of `pid` to the limits at `new` may leave this
/// process with a memory limit ([`corehop_sys::watch::may_limit_memory`]).
pub fn may_limit_memory(pid: i64, resource: i64, new: u64) -> bool {
    corehop_sys::watch::may_limit_memory(pid, resource, Some(new), raw_for_limits)
}

/// [`may_limit_memory`] for a raw `syscall(nr, a, b, c)`.
pub fn raw_call_may_limit_memory(nr: i64, a: i64, b: i64, c: i64) -> bool {
    corehop_sys::watch::raw_call_may_limit_memory(nr, a, b, Some(c), raw_for_limits)
}

/// Restricts the calling thread to kernel CPU `cpu`. Returns the raw result.
pub fn pin_self(cpu: usize) -> i64 {
    if cpu >= libc::CPU_SETSIZE as usize {
        return -(libc::EINVAL as i64);
    }
    // SAFETY: cpu_set_t is a plain bit array; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { core::mem::zeroed() };
    // SAFETY: `cpu` < CPU_SETSIZE, so the bit lies inside `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    let size = core::mem::size_of::<libc::cpu_set_t>() as u64;
    // SAFETY: pid 0 is the calling thread; `set` is valid for `size` bytes.
    unsafe { raw(libc::SYS_sched_setaffinity, [0, size, &set as *const _ as u64, 0, 0, 0]) }
}

/// Blocks every signal in the calling thread, so that process-directed signals go to the
/// program's own threads, as they would without this library.
pub fn block_all_signals() {
    // glibc's own signals stay open (see `GLIBC_SIGNALS`): blocking them hangs a program
    // that calls a set*id function.
    sigprocmask(libc::SIG_SETMASK, Some(!corehop_sys::stub_state::GLIBC_SIGNALS));
}

/// `rt_sigprocmask(how, set)` for the calling thread (no new set: only asks); returns the mask
/// it had before (a kernel sigset: bit `n - 1` for signal `n`).
fn sigprocmask(how: i32, set: Option<u64>) -> u64 {
    let new = set.as_ref().map_or(0, |set| set as *const u64 as u64);
    let mut old = 0u64;
    // SAFETY: the new set, if any, and the old one are valid 8-byte kernel sigsets.
    unsafe { raw(libc::SYS_rt_sigprocmask, [how as u64, new, &mut old as *mut u64 as u64, 8, 0, 0]) };
    old
}

/// Signals a thread raises at itself by faulting: left open while a caller waits for a call,
/// since the kernel kills a thread that faults with its signal blocked.
const FAULTS: u64 = signal_bit(libc::SIGSEGV)
    | signal_bit(libc::SIGBUS)
    | signal_bit(libc::SIGFPE)
    | signal_bit(libc::SIGILL)
    | signal_bit(libc::SIGTRAP)
    | signal_bit(libc::SIGSYS);

/// Signal `sig`'s bit in a kernel sigset.
pub const fn signal_bit(sig: i32) -> u64 {
    1 << (sig - 1)
}

/// The signals [`hold_signals`] may hold back.
pub const HOLDABLE: u64 = !(corehop_sys::stub_state::GLIBC_SIGNALS | FAULTS);

/// Holds back `signals` (a kernel sigset, within [`HOLDABLE`]) in the calling thread while a
/// call it handed to a service thread runs, returning the mask to give back with
/// [`release_signals`]. Without a library a handler runs only once such a call has returned (a
/// regular file's read or an `fsync` does not stop for one); one run in the middle of the wait
/// could leave it with `siglongjmp`, and the service thread would go on writing into memory
/// the program has moved on from. glibc's own signals stay open, as for the service threads.
pub fn hold_signals(signals: u64) -> u64 {
    sigprocmask(libc::SIG_BLOCK, Some(signals & HOLDABLE))
}

/// Gives the calling thread back the mask [`hold_signals`] returned: a signal that came
/// meanwhile is handled now, as it would have been on the call's return.
pub fn release_signals(mask: u64) {
    sigprocmask(libc::SIG_SETMASK, Some(mask));
}

/// The handler of signal `sig` (`SIG_DFL` for a signal that has none or does not exist).
pub fn handler_of(sig: i32) -> usize {
    // The kernel's struct sigaction: the handler first, then flags, restorer and an 8-byte mask.
    let mut old = [0usize; 4];
    // SAFETY: rt_sigaction with no new action writes at most 32 bytes of the old one to `old`.
    let ret = unsafe { raw(libc::SYS_rt_sigaction, [sig as u64, 0, old.as_mut_ptr() as u64, 8, 0, 0]) };
    if ret == 0 {
        old[0]
    } else {
        libc::SIG_DFL
    }
}

/// The calling thread's blocked signals (a kernel sigset: bit `n - 1` for signal `n`).
pub fn blocked_signals() -> u64 {
    sigprocmask(libc::SIG_BLOCK, None)
}

/// `fstat` of `fd`, by the raw call; `None` if it failed.
pub fn fstat(fd: i32) -> Option<libc::stat> {
    let mut st = core::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes one struct stat into `st`.
    let ret = unsafe { raw(libc::SYS_fstat, [fd as u64, st.as_mut_ptr() as u64, 0, 0, 0, 0]) };
    // SAFETY: on success the kernel filled `st`.
    (ret == 0).then(|| unsafe { st.assume_init() })
}

/// Whether `fd` names a regular file.
pub fn is_regular(fd: i32) -> bool {
    fstat(fd).is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG)
}

/// Opens `path` (NUL-terminated) with raw calls, with `flags` (and `mode` if it creates the
/// file), runs `f` on the descriptor and closes it; `None` if it could not be opened.
fn with_open<R>(path: &CStr, flags: i32, mode: u32, f: impl FnOnce(i32) -> R) -> Option<R> {
    // SAFETY: openat reads the NUL-terminated path only.
    let fd = unsafe {
        raw(
            libc::SYS_openat,
            [libc::AT_FDCWD as u64, path.as_ptr() as u64, flags as u64, u64::from(mode), 0, 0],
        )
    };
    if fd < 0 {
        return None;
    }
    let result = f(fd as i32);
    // SAFETY: closes the descriptor opened above (and with it any lock `f` took).
    unsafe { raw(libc::SYS_close, [fd as u64, 0, 0, 0, 0, 0]) };
    Some(result)
}

/// Reads at most `out.len()` bytes of the file at `path` (NUL-terminated) with raw calls;
/// returns how many, or `None` if it could not be opened or read.
pub fn read_file(path: &CStr, out: &mut [u8]) -> Option<usize> {
    let n = with_open(path, libc::O_RDONLY | libc::O_CLOEXEC, 0, |fd| {
        // SAFETY: read writes at most out.len() bytes into `out`.
        unsafe { raw(libc::SYS_read, [fd as u64, out.as_mut_ptr() as u64, out.len() as u64, 0, 0, 0]) }
    })?;
    usize::try_from(n).ok()
}

/// Runs `f` on the regular file at `path` opened with `access` (`O_RDONLY`, `O_WRONLY`),
/// holding its lock `lock` (`LOCK_SH`, `LOCK_EX`), taken without waiting; `None` if any of that
/// could not be had. Follows links (`/proc/PID/fd/N` is one); never waits on a FIFO.
pub fn with_locked_file<R>(path: &CStr, access: i32, lock: i32, f: impl FnOnce(i32) -> R) -> Option<R> {
    with_open(path, access | libc::O_CLOEXEC | libc::O_NONBLOCK, 0, |fd| {
        // SAFETY: flock takes plain integers.
        let locked = is_regular(fd)
            && unsafe { raw(libc::SYS_flock, [fd as u64, (lock | libc::LOCK_NB) as u64, 0, 0, 0, 0]) } == 0;
        locked.then(|| f(fd))
    })
    .flatten()
}

/// Reads the start of the file `fd` into `out` (`pread` at offset 0): the bytes read, or
/// `-errno`.
pub fn read_start(fd: i32, out: &mut [u8]) -> i64 {
    // SAFETY: pread writes at most `out.len()` bytes into `out`.
    unsafe { raw(libc::SYS_pread64, [fd as u64, out.as_mut_ptr() as u64, out.len() as u64, 0, 0, 0]) }
}

/// Writes `bytes` at the start of the file `fd` (`pwrite` at offset 0): the bytes written, or
/// `-errno`.
pub fn write_start(fd: i32, bytes: &[u8]) -> i64 {
    // SAFETY: pwrite reads `bytes.len()` bytes from `bytes`.
    unsafe { raw(libc::SYS_pwrite64, [fd as u64, bytes.as_ptr() as u64, bytes.len() as u64, 0, 0, 0]) }
}

/// Takes a pending SIGPIPE or SIGXFSZ off the calling thread (where it is blocked) and returns
/// its number, or 0. The kernel raises these at the thread that made the failing write; the
/// service thread hands them on to the caller.
pub fn take_write_signal() -> i32 {
    let set: u64 = (1 << (libc::SIGPIPE - 1)) | (1 << (libc::SIGXFSZ - 1));
    let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid 8-byte sigset and timespec on this frame; no siginfo wanted.
    let ret = unsafe {
        raw(libc::SYS_rt_sigtimedwait, [&set as *const u64 as u64, 0, &zero as *const _ as u64, 8, 0, 0])
    };
    if ret > 0 {
        ret as i32
    } else {
        0
    }
}

/// Sets the calling thread's errno.
pub fn set_errno(e: i32) {
    // SAFETY: __errno_location returns the calling thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// Writes all of `bytes` to `fd` with raw `write` (the library's own output), within the
/// program's file size limit: a program that lowered `RLIMIT_FSIZE` below what a report file
/// has reached must not be killed by SIGXFSZ for corehop's line. The soft limit is raised to
/// the hard one for the write and put back; past the hard one nothing is written.
pub fn write_all(fd: i32, bytes: &[u8]) {
    let mut limit = libc::rlimit64 { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: prlimit64 of this process writes the old limit into `limit` only.
    let got = unsafe {
        raw(libc::SYS_prlimit64, [0, libc::RLIMIT_FSIZE as u64, 0, &mut limit as *mut _ as u64, 0, 0])
    };
    if got < 0 || limit.rlim_cur == libc::RLIM64_INFINITY {
        return write_through(fd, bytes);
    }
    // The limit binds regular files only; O_APPEND writes at their end.
    let end = match fstat(fd) {
        Some(st) if st.st_mode & libc::S_IFMT == libc::S_IFREG => {
            u64::try_from(st.st_size).unwrap_or(0).saturating_add(bytes.len() as u64)
        }
        _ => 0,
    };
    if end <= limit.rlim_cur {
        return write_through(fd, bytes);
    }
    if limit.rlim_max != libc::RLIM64_INFINITY && end > limit.rlim_max {
        return;
    }
    let raised = libc::rlimit64 { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
    let set = |to: &libc::rlimit64| {
        // SAFETY: prlimit64 of this process reads `to` only.
        unsafe { raw(libc::SYS_prlimit64, [0, libc::RLIMIT_FSIZE as u64, to as *const _ as u64, 0, 0, 0]) }
    };
    if set(&raised) == 0 {
        write_through(fd, bytes);
        set(&limit);
    }
}

/// [`write_all`] with no look at the file size limit.
fn write_through(fd: i32, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is a live slice for the call.
        let ret =
            unsafe { raw(libc::SYS_write, [fd as u64, bytes.as_ptr() as u64, bytes.len() as u64, 0, 0, 0]) };
        if ret == -(libc::EINTR as i64) {
            continue;
        }
        if ret <= 0 {
            return;
        }
        bytes = &bytes[ret as usize..];
    }
}

/// What finds the function a libc name (NUL-terminated) binds to after the start-up stub,
/// handed over by the stub that loaded this library ([`look_up_through`]); null if nothing
/// does. Unsafe: it reads the name.
pub type NextAfterStub = unsafe extern "C" fn(*const core::ffi::c_char) -> *mut c_void;

/// Set when the start-up stub loaded this library. Opened by `dlopen`, this library's
/// `dlsym(RTLD_NEXT)` searches its own scope, which holds libc but not what is preloaded
/// after the stub: another library's `close` (a `fakeroot`, an `eatmydata`) would be skipped
/// once this library took the calls over. The stub's lookup starts where the program's calls
/// reach it.
static NEXT_AFTER_STUB: std::sync::OnceLock<NextAfterStub> = std::sync::OnceLock::new();

/// Makes every [`Real`] look its function up through `resolve` (the stub's), from now on.
pub fn look_up_through(resolve: NextAfterStub) {
    let _ = NEXT_AFTER_STUB.set(resolve);
}

/// A lazily resolved pointer to the next definition of a libc symbol (`dlsym(RTLD_NEXT)`, or
/// the stub's lookup: [`look_up_through`]), i.e. the function the program would have called
/// without this library.
pub struct Real {
    name: &'static CStr,
    ptr: AtomicPtr<c_void>,
}

impl Real {
    /// The function `name`, looked up on first use.
    pub const fn new(name: &'static CStr) -> Real {
        Real { name, ptr: AtomicPtr::new(core::ptr::null_mut()) }
    }

    /// The address of the real function, or null if libc has none.
    #[inline(always)]
    pub fn get(&self) -> *mut c_void {
        let p = self.ptr.load(Ordering::Acquire);
        if !p.is_null() {
            return p;
        }
        self.look_up()
    }

    /// The first use: looks the function up. Out of line, so that a call that passes the
    /// library by needs no frame for it.
    #[cold]
    #[inline(never)]
    fn look_up(&self) -> *mut c_void {
        let p = next_function(self.name);
        self.ptr.store(p, Ordering::Release);
        p
    }
}

/// The function the program would have called for `name` without this library (null if
/// nothing defines it): through the stub's lookup if it loaded this library.
pub fn next_function(name: &CStr) -> *mut c_void {
    match NEXT_AFTER_STUB.get() {
        // SAFETY: `name` is NUL-terminated.
        Some(resolve) => unsafe { resolve(name.as_ptr()) },
        None => next_after_this_library(name),
    }
}

/// The objects after this library up to libc, where a preloaded library looks its names up
/// (`corehop_sys::next_symbol`): `dlsym` waits for the loader's lock, which a thread running
/// a library's constructor holds while it may wait for the thread that asks. (Its atomics
/// are loom's in a loom build, which has no such statics and makes no calls.)
#[cfg(not(loom))]
static SCOPE: corehop_sys::next_symbol::Scope = corehop_sys::next_symbol::Scope::new();

/// What `name` binds to after this library (null if nothing does).
fn next_after_this_library(name: &CStr) -> *mut c_void {
    #[cfg(not(loom))]
    {
        SCOPE.record();
        // SAFETY: only `record` fills the scope, in this process or the one it was forked from.
        if let Some(corehop_sys::next_symbol::Next::Function(address)) =
            unsafe { SCOPE.lookup(name.to_bytes()) }
        {
            return address as *mut c_void;
        }
    }
    // SAFETY: `name` is NUL-terminated; dlsym is thread-safe and does not call any interposed
    // function.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) }
}

/// The next `_exit` (a sanitizer's, else libc's; `_Exit` is the same function), which the
/// library's own `_exit` goes on to.
pub static REAL_EXIT: Real = Real::new(c"_exit");

/// Whether a sanitizer's runtime is in the process ([`corehop_sys::wire::SANITIZER_INITS`]),
/// linked into the program or loaded with it (or, to be safe, opened by it), read from the
/// objects' tables where they answer: not with `dlsym` (see `SCOPE`).
pub fn sanitizer_loaded() -> bool {
    if let Some(found) = corehop_sys::next_symbol::sanitizer_loaded() {
        return found;
    }
    corehop_sys::wire::SANITIZER_INITS.iter().any(|name| {
        // SAFETY: `name` is NUL-terminated; dlsym is thread-safe and does not call any
        // interposed function.
        !unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }.is_null()
    })
}

/// The highest kernel CPU number the calling thread may run on (0 if that cannot be read).
pub fn last_allowed_cpu() -> usize {
    let mut set = [0u64; 16];
    // SAFETY: the kernel writes at most 128 bytes into `set`; pid 0 is the calling thread.
    let ret = unsafe { raw(libc::SYS_sched_getaffinity, [0, 128, set.as_mut_ptr() as u64, 0, 0, 0]) };
    if ret <= 0 {
        return 0;
    }
    (0..1024).rev().find(|&cpu| set[cpu / 64] & (1 << (cpu % 64)) != 0).unwrap_or(0)
}

/// Copies `out.len()` bytes from the program's memory at `addr` through the kernel, so a bad
/// pointer is a `false` here instead of a fault (the real call then fails with EFAULT).
pub fn read_user(addr: u64, out: &mut [u8]) -> bool {
    read_user_of(getpid(), addr, out)
}

/// [`read_user`] for a caller that knows its process id (`pid` must be this process's: a
/// service thread, whose process never changes, asks the kernel once).
pub fn read_user_of(pid: i32, addr: u64, out: &mut [u8]) -> bool {
    let local = libc::iovec { iov_base: out.as_mut_ptr() as *mut c_void, iov_len: out.len() };
    let remote = libc::iovec { iov_base: addr as *mut c_void, iov_len: out.len() };
    // SAFETY: process_vm_readv on our own pid writes at most out.len() bytes into `out` and
    // reports unreadable remote memory as an error.
    let got = unsafe {
        raw(
            libc::SYS_process_vm_readv,
            [pid as u64, &local as *const _ as u64, 1, &remote as *const _ as u64, 1, 0],
        )
    };
    got == out.len() as i64
}

/// Total bytes of an iovec array in the program's memory (0 if it cannot be read).
pub fn iov_total(iov: u64, count: i32) -> u64 {
    let mut total = 0u64;
    let count = count.clamp(0, 1024) as u64;
    let mut chunk = [0u8; 16 * 32];
    let mut done = 0;
    while done < count {
        let n = (count - done).min(32);
        let bytes = &mut chunk[..n as usize * 16];
        if !read_user(iov + done * 16, bytes) {
            return 0;
        }
        for entry in bytes.chunks_exact(16) {
            let len = u64::from_ne_bytes(entry[8..16].try_into().unwrap_or([0; 8]));
            total = total.saturating_add(len);
        }
        done += n;
    }
    total
}

/// A fixed buffer of `N` bytes that formats without allocating (the library's own output).
pub struct Text<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> Text<N> {
    pub const fn new() -> Text<N> {
        Text { buf: [0; N], len: 0 }
    }

    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keeps the first `len` bytes.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}

impl<const N: usize> Default for Text<N> {
    fn default() -> Text<N> {
        Text::new()
    }
}

impl<const N: usize> core::fmt::Write for Text<N> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let end = self.len + s.len();
        if end > N {
            return Err(core::fmt::Error);
        }
        self.buf[self.len..end].copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Opens `path` for appending, creating it private, and hands the descriptor to `write`: never
/// through a symlink, never waiting on a FIFO, and only into a regular file.
pub fn append_to(path: &CStr, write: impl FnOnce(i32)) {
    let flags = libc::O_WRONLY
        | libc::O_APPEND
        | libc::O_CREAT
        | libc::O_CLOEXEC
        | libc::O_NOFOLLOW
        | libc::O_NONBLOCK;
    with_open(path, flags, 0o600, |fd| {
        if is_regular(fd) {
            write(fd);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_in_samples_about_one_call_in_n_at_uneven_gaps() {
        let calls = 1 << 16;
        let hits: Vec<usize> = (0..calls).filter(|_| one_in(16)).collect();
        // Expected 4096 (gaps uniform in 1..=31); other tests' threads may share the slot.
        assert!((2048..=8192).contains(&hits.len()), "{} of {calls}", hits.len());
        let gaps: std::collections::BTreeSet<usize> = hits.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.len() > 8, "the picked calls fall at a fixed period: gaps {gaps:?}");
        // Once the count-down left from the rule before has run out, one in one is every call.
        (0..32).for_each(|_| {
            let _ = one_in(1);
        });
        assert!((0..1000).all(|_| one_in(1)));
    }

    /// The limit checks on this process's real limits, in a child (the limit it sets is its
    /// own), which reports by its exit status which check went wrong.
    #[test]
    fn a_memory_limit_is_seen_and_so_is_a_call_that_would_set_one() {
        let infinite = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
        let finite = libc::rlimit { rlim_cur: 1 << 40, rlim_max: libc::RLIM_INFINITY };
        let (at_infinite, at_finite) = (&infinite as *const _ as u64, &finite as *const _ as u64);
        let (as_, data, nofile) =
            (i64::from(libc::RLIMIT_AS), i64::from(libc::RLIMIT_DATA), i64::from(libc::RLIMIT_NOFILE));
        let limited_by_libc = || {
            [libc::RLIMIT_AS, libc::RLIMIT_DATA].into_iter().any(|resource| {
                let mut limit = infinite;
                // SAFETY: getrlimit writes into a live struct.
                unsafe { libc::getrlimit(resource, &mut limit) != 0 || limit.rlim_cur != libc::RLIM_INFINITY }
            })
        };
        let checks = || -> i32 {
            let me = i64::from(getpid());
            let cases = [
                // As libc reads the limits; a call that asks for a finite one may set one.
                memory_limited() == limited_by_libc(),
                may_limit_memory(0, as_, at_finite),
                may_limit_memory(me, data, at_finite),
                may_limit_memory(i64::from(gettid()), as_, at_finite),
                // Not a memory limit, none set, an infinite one, another process, memory the call
                // cannot read either.
                !may_limit_memory(0, nofile, at_finite),
                !may_limit_memory(0, as_, 0),
                !may_limit_memory(0, as_, at_infinite),
                !may_limit_memory(1, as_, at_finite) || me == 1,
                !may_limit_memory(0, as_, 8),
                raw_call_may_limit_memory(libc::SYS_prlimit64, 0, as_, at_finite as i64),
                !raw_call_may_limit_memory(libc::SYS_prlimit64, 0, as_, 0),
                // The stub, which does not see prlimit64's third argument, takes it as finite.
                corehop_sys::watch::raw_call_may_limit_memory(
                    libc::SYS_prlimit64,
                    0,
                    as_,
                    None,
                    raw_for_limits,
                ),
            ];
            if let Some(wrong) = cases.iter().position(|ok| !ok) {
                return 10 + wrong as i32;
            }
            // SAFETY: sets this child's own limit from a live struct.
            unsafe { libc::setrlimit(libc::RLIMIT_DATA, &finite) };
            if !memory_limited() {
                return 2;
            }
            0
        };
        // SAFETY: the child runs the checks (raw calls and setrlimit, no allocation) and leaves
        // with `_exit`.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let status = checks();
            unsafe { libc::_exit(status) };
        }
        let mut status = 0;
        // SAFETY: waits for the child made above.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "{status:#x}");
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "a check failed (2: the limit set was not seen, 10 + n: case n)"
        );
    }
}
