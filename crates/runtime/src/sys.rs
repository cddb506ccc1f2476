//! The one OS facade of corehop: every libc call and raw system call of the runtime lives here.
//!
//! Other modules (and the other runtime subsystems: service cores, objects, components, SMT)
//! call these small safe functions instead of `libc` directly, so the thread-identity and
//! errno rules of a hopping runtime are kept in one place:
//!
//! - **errno is returned, never read later.** [`syscall`] issues the `syscall` instruction
//!   itself on x86-64 and aarch64 and decodes the kernel's `-errno` return into [`Errno`], so
//!   no thread-local `errno` is involved; a task that hops afterwards cannot read another
//!   thread's errno by mistake.
//! - **Thread-bound calls stay with their thread.** [`gettid`], [`pin_current_thread`] and
//!   [`set_affinity`] act on the *calling OS thread*; inside a task that hops (`Handoff`), the
//!   answer changes with each hop. Call them where the thread identity is what you mean.
//! - **Time.** [`now_ns`] reads the TSC when the CPU has an invariant one (calibrated once
//!   against `CLOCK_MONOTONIC` as the median of several windows) and falls back to
//!   `clock_gettime(CLOCK_MONOTONIC)` otherwise.
//!
//! # Examples
//! ```
//! use corehop_runtime::sys;
//! let cpu = sys::current_os_cpu().unwrap();
//! sys::pin_current_thread(cpu).unwrap();
//! assert_eq!(sys::current_os_cpu().unwrap(), cpu);
//! let t0 = sys::now_ns();
//! assert!(sys::now_ns() >= t0);
//! ```

use std::io;
use std::os::fd::AsRawFd;
use std::sync::OnceLock;

pub use corehop_sys::raw::Errno;
pub use corehop_topology::OsCpu;

/// Issues system call `nr` with six raw arguments and returns the kernel's result, or its
/// error number as an [`Errno`] (the kernel returns `-errno` in `-4095..=-1`).
///
/// # Safety
/// The arguments must be valid for system call `nr`: pointers must point to memory of the
/// size and mutability the call expects, for as long as the call uses it, and the call must
/// not break invariants Rust relies on (e.g. `munmap` of memory still borrowed, `exit` of a
/// thread that owns live stack borrows, `clone` without a new stack).
pub unsafe fn syscall(nr: libc::c_long, args: [usize; 6]) -> Result<isize, Errno> {
    let args = args.map(|a| a as u64);
    // SAFETY: the caller guarantees the arguments are valid for `nr`.
    corehop_sys::raw::check(unsafe { corehop_sys::raw::syscall(nr, args) }).map(|ret| ret as isize)
}

/// The kernel's id of the calling OS thread. After a `Handoff` hop it is a different thread.
pub fn gettid() -> i32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { syscall(libc::SYS_gettid, [0; 6]) }.map_or(-1, |tid| tid as i32)
}

/// The kernel's number of the CPU the calling thread runs on right now (`sched_getcpu`).
///
/// Only a snapshot unless the thread is pinned to one CPU.
pub fn current_os_cpu() -> io::Result<OsCpu> {
    // SAFETY: sched_getcpu takes no arguments; its errno is read immediately on this thread.
    let cpu = unsafe { libc::sched_getcpu() };
    if cpu < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(OsCpu(cpu as usize))
    }
}

/// Restricts the calling OS thread to the CPUs `os_cpus` (kernel numbers). If the thread is
/// running elsewhere, the kernel moves it before this returns.
///
/// Errors: an empty list or a CPU number beyond `CPU_SETSIZE` is `InvalidInput`; CPUs the
/// process may not use give the kernel's `EINVAL`.
pub fn set_affinity(os_cpus: &[OsCpu]) -> io::Result<()> {
    if os_cpus.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty CPU set"));
    }
    // SAFETY: cpu_set_t is a plain bit array; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &OsCpu(cpu) in os_cpus {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("CPU {cpu} is beyond CPU_SETSIZE ({})", libc::CPU_SETSIZE),
            ));
        }
        // SAFETY: `cpu` < CPU_SETSIZE was checked above, so the bit is inside `set`.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    let set_ptr = &set as *const libc::cpu_set_t as usize;
    // SAFETY: pid 0 is the calling thread; the set pointer is valid for its size.
    unsafe { syscall(libc::SYS_sched_setaffinity, [0, std::mem::size_of_val(&set), set_ptr, 0, 0, 0]) }
        .map(drop)
        .map_err(Errno::to_io)
}

/// Pins the calling OS thread to the one CPU `os_cpu` (kernel number); on return the thread
/// runs there.
pub fn pin_current_thread(os_cpu: OsCpu) -> io::Result<()> {
    set_affinity(&[os_cpu])
}

/// The CPUs (kernel numbers) the calling OS thread may run on, ascending.
pub fn affinity() -> io::Result<Vec<OsCpu>> {
    affinity_of(0)
}

/// The CPUs (kernel numbers) thread `tid` may run on, ascending; `tid` 0 is the calling
/// thread, the process id is the main thread (what the process was started with).
pub fn affinity_of(tid: i32) -> io::Result<Vec<OsCpu>> {
    // SAFETY: all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let set_ptr = &mut set as *mut libc::cpu_set_t as usize;
    // SAFETY: the kernel writes at most `size` bytes into `set`; a bad tid is an error.
    unsafe {
        syscall(
            libc::SYS_sched_getaffinity,
            [tid as isize as usize, std::mem::size_of_val(&set), set_ptr, 0, 0, 0],
        )
    }
    .map_err(Errno::to_io)?;
    // SAFETY: every index is below CPU_SETSIZE, so each bit read is inside `set`.
    Ok((0..libc::CPU_SETSIZE as usize)
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .map(OsCpu)
        .collect())
}

/// Marks the directory `dir` as the top of a hierarchy for ext4's inode allocator (what
/// `chattr +T` sets): each directory made in it then goes to a block group of its own with
/// free inodes, not next to its parent. Errors on file systems that keep no such flag.
pub fn mark_top_directory(dir: &std::fs::File) -> io::Result<()> {
    let flags = inode_flags(dir)?;
    // SAFETY: FS_IOC_SETFLAGS reads one int from the pointer, which points at a local.
    if unsafe { libc::ioctl(dir.as_raw_fd(), libc::FS_IOC_SETFLAGS, &(flags | TOPDIR_FLAG)) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The kernel's `FS_TOPDIR_FL`.
const TOPDIR_FLAG: libc::c_int = 0x0002_0000;

/// A file's inode flags (`lsattr`).
fn inode_flags(file: &std::fs::File) -> io::Result<libc::c_int> {
    let mut flags: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one int (whatever its name says) to `flags`, on this
    // frame; the descriptor is open for as long as `file` is borrowed.
    if unsafe { libc::ioctl(file.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(flags)
}

/// One iteration of a busy-wait loop (`pause` on x86): lets an SMT sibling run and saves power.
#[inline]
pub fn cpu_relax() {
    std::hint::spin_loop();
}

/// Starts fetching the cache line holding `addr` into this CPU's cache, in the state for
/// writing where the CPU can (x86 `PREFETCHW`, Arm `PRFM PSTL1KEEP`), without waiting for it.
///
/// A hint and nothing else: any address is allowed (a prefetch never faults, even of unmapped
/// memory), and the program means the same with or without it. The hand-off uses it to pull
/// in, all at once, the lines a hopping task is about to touch, instead of missing on them one
/// after another.
#[inline]
pub fn prefetch_for_write(addr: usize) {
    prefetch_lines_for_write(addr, 1);
}

/// [`prefetch_for_write`] of `lines` consecutive cache lines from the one holding `first`
/// (the CPU is asked once what it can do, not once per line).
#[inline]
pub fn prefetch_lines_for_write(first: usize, lines: usize) {
    const LINE: usize = 64;
    #[cfg(target_arch = "x86_64")]
    {
        if has_prefetchw() {
            for line in 0..lines {
                // SAFETY: PREFETCHW exists on this CPU (checked above); it reads no data, writes
                // nothing architecturally visible and never faults.
                unsafe {
                    std::arch::asm!("prefetchw byte ptr [{0}]", in(reg) first + line * LINE, options(nostack, preserves_flags, readonly));
                }
            }
        } else {
            // The best there is: other CPUs give the lines up only when this one writes.
            for line in 0..lines {
                prefetch_for_read(first + line * LINE);
            }
        }
    }
    #[cfg(target_arch = "aarch64")]
    for line in 0..lines {
        // SAFETY: PRFM is a hint on every AArch64 CPU; it never faults.
        unsafe {
            std::arch::asm!("prfm pstl1keep, [{0}]", in(reg) first + line * LINE, options(nostack, preserves_flags, readonly))
        };
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = (first, lines);
}

/// Starts fetching the cache line holding `addr` for reading (x86 `PREFETCHT0`, Arm
/// `PRFM PLDL1KEEP`): other CPUs keep their copies. A hint like [`prefetch_for_write`].
#[inline]
pub fn prefetch_for_read(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: SSE (PREFETCHT0) is part of x86-64; a prefetch never faults.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(addr as *const i8) };
    }
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: PRFM is a hint on every AArch64 CPU; it never faults.
        unsafe {
            std::arch::asm!("prfm pldl1keep, [{0}]", in(reg) addr, options(nostack, preserves_flags, readonly))
        };
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = addr;
}

/// Whether the CPU has `PREFETCHW` (CPUID 0x8000_0001 ECX bit 8); older Intel CPUs do not, and
/// the instruction would fault there. Read once.
#[cfg(target_arch = "x86_64")]
#[inline]
fn has_prefetchw() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        // Leaf 0x8000_0001 is read only where the maximum extended leaf reaches it.
        let max_extended = std::arch::x86_64::__cpuid(0x8000_0000).eax;
        max_extended >= 0x8000_0001 && std::arch::x86_64::__cpuid(0x8000_0001).ecx & (1 << 8) != 0
    })
}

/// `CLOCK_MONOTONIC` in nanoseconds (vDSO, no system call on Linux).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The CPU's time-stamp counter, or `None` where there is no usable one.
#[inline]
pub fn rdtsc() -> Option<u64> {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC exists on every x86-64 CPU and has no side effects.
        Some(unsafe { std::arch::x86_64::_rdtsc() })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// How [`now_ns`] tells time on this machine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ClockSource {
    /// The invariant TSC (calibrated against `CLOCK_MONOTONIC` at first use).
    Tsc {
        /// TSC ticks per nanosecond.
        ticks_per_ns: f64,
    },
    /// `clock_gettime(CLOCK_MONOTONIC)`: no invariant TSC.
    Monotonic,
}

struct TscCalibration {
    source: ClockSource,
    /// TSC value and monotonic ns at calibration, so `now_ns` shares CLOCK_MONOTONIC's origin.
    tsc0: u64,
    ns0: u64,
}

/// Calibration windows and their length: the median of several short windows ignores the
/// one a preemption or VM exit lands in, where a single window would keep its skew for good.
const CALIBRATION_WINDOWS: usize = 5;
const CALIBRATION_WINDOW_NS: u64 = 1_000_000;
/// Tries per paired reading; the tightest is kept (an interrupt only ever widens a pair).
const PAIR_TRIES: usize = 8;

// Why the TSC at all: on this 2-vCPU KVM guest a TSC read costs ~20 ns and a vDSO
// CLOCK_MONOTONIC read ~53 ns (measured side by side, rustc -O, 5 M reads each). Hot paths
// take two timestamps per hop or call, so the TSC is kept, made safe by the calibration below.
fn calibration() -> &'static TscCalibration {
    static CAL: OnceLock<TscCalibration> = OnceLock::new();
    CAL.get_or_init(|| {
        let fallback = TscCalibration { source: ClockSource::Monotonic, tsc0: 0, ns0: 0 };
        if !invariant_tsc() {
            return fallback;
        }
        let mut readings = Vec::with_capacity(CALIBRATION_WINDOWS + 1);
        for _ in 0..=CALIBRATION_WINDOWS {
            if let Some(&(_, last_ns)) = readings.last() {
                while monotonic_ns() - last_ns < CALIBRATION_WINDOW_NS {
                    cpu_relax();
                }
            }
            let Some(reading) = paired_reading() else { return fallback };
            readings.push(reading);
        }
        let ticks_per_ns = median_ticks_per_ns(&readings);
        if !(ticks_per_ns.is_finite() && ticks_per_ns > 0.0) {
            return fallback;
        }
        let (tsc0, ns0) = readings[CALIBRATION_WINDOWS];
        TscCalibration { source: ClockSource::Tsc { ticks_per_ns }, tsc0, ns0 }
    })
}

/// The median TSC rate over the windows between consecutive (TSC, ns) readings.
fn median_ticks_per_ns(readings: &[(u64, u64)]) -> f64 {
    let mut ratios: Vec<f64> = readings
        .windows(2)
        .map(|w| w[1].0.wrapping_sub(w[0].0) as f64 / w[1].1.saturating_sub(w[0].1) as f64)
        .collect();
    ratios.sort_by(f64::total_cmp);
    ratios.get(ratios.len() / 2).copied().unwrap_or(f64::NAN)
}

/// A (TSC, CLOCK_MONOTONIC ns) pair taken at one instant: the monotonic read bracketed by two
/// TSC reads, the TSC taken as their midpoint, the tightest bracket of [`PAIR_TRIES`] kept.
fn paired_reading() -> Option<(u64, u64)> {
    let mut best: Option<(u64, u64, u64)> = None;
    for _ in 0..PAIR_TRIES {
        let before = rdtsc()?;
        let ns = monotonic_ns();
        let gap = rdtsc()?.wrapping_sub(before);
        if best.is_none_or(|(best_gap, _, _)| gap < best_gap) {
            best = Some((gap, before + gap / 2, ns));
        }
    }
    best.map(|(_, tsc, ns)| (tsc, ns))
}

/// Whether the CPU's TSC ticks at a constant rate in all power states (CPUID 0x8000_0007
/// EDX bit 8), which makes it a clock comparable across cores.
fn invariant_tsc() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid;
        // Leaf 0x8000_0000 reports the highest extended leaf; 0x8000_0007 is only read if present.
        let max_ext = __cpuid(0x8000_0000).eax;
        max_ext >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Which clock [`now_ns`] uses here (calibrates on first call, ~5 ms).
pub fn clock_source() -> ClockSource {
    calibration().source
}

/// Nanoseconds on a clock shared by all CPUs (same origin as `CLOCK_MONOTONIC`): the
/// invariant TSC scaled by its calibrated rate, or `CLOCK_MONOTONIC` where there is none.
/// The first call calibrates (~5 ms).
#[inline]
pub fn now_ns() -> u64 {
    let cal = calibration();
    match (cal.source, rdtsc()) {
        (ClockSource::Tsc { ticks_per_ns }, Some(tsc)) => {
            let delta = tsc.wrapping_sub(cal.tsc0) as i64 as f64 / ticks_per_ns;
            (cal.ns0 as f64 + delta) as u64
        }
        _ => monotonic_ns(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_directory_marked_top_keeps_the_flag_where_the_file_system_has_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::File::open(dir.path()).unwrap();
        let before = inode_flags(&file);
        match mark_top_directory(&file) {
            Ok(()) => {
                assert_eq!(before.unwrap() & TOPDIR_FLAG, 0, "a new directory came marked");
                assert_ne!(inode_flags(&file).unwrap() & TOPDIR_FLAG, 0);
            }
            // tmpfs and others keep no inode flags (or not this one).
            Err(e) => assert!(
                [libc::ENOTTY, libc::EOPNOTSUPP, libc::EINVAL].contains(&e.raw_os_error().unwrap_or(0)),
                "{e}"
            ),
        }
    }

    #[test]
    fn syscall_returns_errno_explicitly() {
        // close(-1) fails with EBADF.
        // SAFETY: close of an invalid descriptor touches no memory.
        let r = unsafe { syscall(libc::SYS_close, [usize::MAX, 0, 0, 0, 0, 0]) };
        assert_eq!(r, Err(Errno(libc::EBADF)));
        assert!(Errno(libc::EBADF).to_string().contains("errno 9"));
    }

    #[test]
    fn gettid_matches_libc_and_differs_between_threads() {
        // SAFETY: gettid has no preconditions.
        let libc_tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
        assert_eq!(gettid(), libc_tid);
        let other = std::thread::spawn(gettid).join().unwrap();
        assert_ne!(other, gettid());
    }

    #[test]
    fn pinning_moves_the_thread_and_affinity_reports_it() {
        let allowed = affinity().unwrap();
        assert!(!allowed.is_empty());
        std::thread::spawn(move || {
            for &cpu in &allowed {
                pin_current_thread(cpu).unwrap();
                assert_eq!(current_os_cpu().unwrap(), cpu);
                assert_eq!(affinity().unwrap(), vec![cpu]);
            }
            set_affinity(&allowed).unwrap();
            assert_eq!(affinity().unwrap(), allowed);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn bad_affinity_is_an_error() {
        assert_eq!(set_affinity(&[]).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        assert_eq!(pin_current_thread(OsCpu(1 << 20)).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        // A CPU number inside CPU_SETSIZE that this machine does not have.
        let missing = OsCpu(libc::CPU_SETSIZE as usize - 1);
        if !affinity().unwrap().contains(&missing) {
            assert!(std::thread::spawn(move || pin_current_thread(missing)).join().unwrap().is_err());
        }
    }

    #[test]
    fn now_ns_is_monotonic_and_tracks_the_monotonic_clock() {
        let (a, m0) = (now_ns(), monotonic_ns());
        std::thread::sleep(Duration::from_millis(20));
        let (b, m1) = (now_ns(), monotonic_ns());
        assert!(b > a);
        // Same origin and rate as CLOCK_MONOTONIC within a loose 1 ms (calibration error
        // over 20 ms is far below that).
        let drift = (b as i64 - a as i64) - (m1 as i64 - m0 as i64);
        assert!(drift.abs() < 1_000_000, "drift {drift} ns");
        assert!((a as i64 - m0 as i64).abs() < 1_000_000);
        if let ClockSource::Tsc { ticks_per_ns } = clock_source() {
            assert!(ticks_per_ns > 0.01 && ticks_per_ns < 100.0);
        }
    }

    #[test]
    fn calibrated_clock_agrees_with_the_monotonic_clock_over_50_ms() {
        let (a, m0) = (now_ns(), monotonic_ns());
        // Busy and sleeping halves: the TSC must keep its rate whether the thread runs or not.
        while monotonic_ns() - m0 < 25_000_000 {
            cpu_relax();
        }
        std::thread::sleep(Duration::from_millis(25));
        let (b, m1) = (now_ns(), monotonic_ns());
        let elapsed = (m1 - m0) as f64;
        // Generous: a 1 % rate error (the skew a preempted single window gave) fails this.
        let drift = (b as f64 - a as f64 - elapsed).abs();
        assert!(drift < elapsed * 0.002 + 100_000.0, "drift {drift} ns over {elapsed} ns");
    }

    #[test]
    fn one_preempted_window_does_not_skew_the_calibrated_rate() {
        // 3 ticks/ns, 1 ms windows; the third reading's monotonic read came 400 µs late.
        let mut readings: Vec<(u64, u64)> = (0..6).map(|i| (i * 3_000_000, i * 1_000_000)).collect();
        readings[2].1 += 400_000;
        assert_eq!(median_ticks_per_ns(&readings), 3.0);
        assert!(median_ticks_per_ns(&readings[..1]).is_nan());
    }
}
