//! The start-up stub of corehop's `LD_PRELOAD` library: what `corehop run --offload` preloads
//! under its default policy. It exports every name the library (`crates/preload`) interposes
//! and passes each call straight to libc until the process has lived through twice the default
//! policy's first epoch, in which that policy moves nothing anyway. At the first call after
//! that, it loads the library with `dlopen` and from then on every call of those names jumps to the
//! library's own entry point, with the program's registers, stack and return address.
//!
//! Why: most processes of a shell pipeline end inside that first epoch, and they paid for
//! loading a 600 KB library with the Rust standard library in it (relocations, page faults and
//! constructors: about 75 µs a process here) for nothing. This stub is a few pages with no
//! `std` and one small constructor (docs/performance.md, "Nineteenth session").
//!
//! That constructor takes corehop's variables out of the program's sight before `main`, and
//! the stub's exec wrappers give them back to what the program starts (`corehop_sys::hidden_env`,
//! included by path); the library's settings come from what it hid.
//!
//! Two kinds of call are the library's business even before it is loaded
//! (`corehop_sys::watch`, which this file includes by path and shares with the library):
//!
//! - One that starts a process the library's fork handlers would miss (`vfork`, `clone` of a
//!   process, `_Fork`, the raw `syscall` forms). Such a child may run on this very memory, so
//!   from then on only the process that made it may load the library, and it tells the
//!   library, which then checks its pid before moving a call (its `CHECK_PID`). A child of
//!   glibc's `fork` has memory of its own again, and a fork handler says so.
//! - One that changes a thread's credentials, filters or namespaces alone: the library would
//!   stop moving calls for good, so the stub stays on libc for good.
//! - One that may leave the process with a finite address-space or data limit (`setrlimit`,
//!   `prlimit`, their raw `syscall` forms): the stub stays on libc for good, as it does when
//!   it finds such a limit where it would load the library (`watch::memory_limited`). Under
//!   one the room is the program's: the library's own allocations could not know what they
//!   would find, and a failed one aborts the program.
//!
//! A program whose processes have ended before the stub loaded the library, having started
//! nothing, twice and never otherwise, gets no stub the next times this stub's exec wrappers
//! start it (but one time in 16): it starts as it would plainly (`corehop_sys::lifetimes`,
//! included by path, on a table in a file `corehop run` names in `$COREHOP_LIFETIMES`). The
//! stub cost such a process 80-90 µs of loading and did nothing for it.
//!
//! The library is found at `$COREHOP_LIBRARY` (read with `secure_getenv`). If it cannot be
//! loaded the process runs on without offload, as plainly as it started. The call that loads
//! it runs `dlopen` (on a thread of its own in a process with others: see [`load_once`]),
//! which allocates and takes the dynamic loader's lock, so the load waits for a call that does not look like a signal
//! handler's (`stub_state::outside_a_handler`), and runs with the program's signals blocked.
//!
//! Built by `crates/cli/build.rs` with `panic = abort` (a `no_std` library cannot unwind), and
//! linked with two load segments and no RELRO: each segment and protection change is a system
//! call of the dynamic loader in every process.
#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]

#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
compile_error!(
    "the start-up stub supports Linux on x86-64 only (elsewhere corehop preloads the library itself)"
);

use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use core::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize};

#[path = "../../sys/src/watch.rs"]
mod watch;

#[path = "../../sys/src/stub_state.rs"]
mod stub_state;
use stub_state::{State, StateWord};

#[path = "../../sys/src/next_symbol.rs"]
mod next_symbol;

#[path = "../../sys/src/trampoline.rs"]
#[macro_use]
mod trampoline;

#[path = "../../sys/src/hidden_env.rs"]
#[macro_use]
mod hidden_env;

// Its file's name is `corehop run`'s business.
#[allow(dead_code)]
#[path = "../../sys/src/lifetimes.rs"]
mod lifetimes;

#[link(name = "c")]
extern "C" {
    fn dlopen(path: *const c_char, flags: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void;
    fn secure_getenv(name: *const c_char) -> *const c_char;
    fn getauxval(kind: u64) -> u64;
    fn __errno_location() -> *mut c_int;
    fn __register_atfork(
        prepare: Option<extern "C" fn()>,
        parent: Option<extern "C" fn()>,
        child: Option<extern "C" fn()>,
        dso_handle: *mut c_void,
    ) -> c_int;
}

const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;
const RTLD_NOW: c_int = 2;
const CLOCK_MONOTONIC: i64 = 1;
const ENOSYS: c_int = 38;

static STATE: StateWord = StateWord(AtomicU64::new(0));
/// When this process (or the one it was forked from) made its first intercepted call (ns).
static FIRST_CALL_NS: AtomicU64 = AtomicU64::new(0);
/// The process that made that first call: a child forked after it starts its own first epoch
/// (see [`tick`]).
static FIRST_CALL_PID: AtomicI64 = AtomicI64::new(0);
/// The thread that made that first call, and the signals it had blocked then (see
/// [`stub_state::outside_a_handler`]).
static FIRST_CALL_TID: AtomicI64 = AtomicI64::new(0);
static FIRST_CALL_BLOCKED: AtomicU64 = AtomicU64::new(0);
/// The process that first started a child the fork handlers do not see (0: none yet).
static OWNER_PID: AtomicI64 = AtomicI64::new(0);
/// Whether [`after_fork_child`] is registered (at the first such child: a process that
/// never starts one pays nothing for it).
static FORK_HANDLER: AtomicBool = AtomicBool::new(false);
/// corehop's variables, out of the program's sight from before `main` (see `hidden_env`):
/// the library's settings come from here, and the programs this process starts get them back.
static HIDDEN: hidden_env::Hidden = hidden_env::Hidden::new();

hide_at_start!(crate::HIDDEN);
exec_wrappers!(crate::HIDDEN, crate::next_function, crate::starts_plainly);

/// When this process's program started (the monotonic clock, ns).
static STARTED_NS: AtomicU64 = AtomicU64::new(0);
/// Whether this process, or the one it was forked from, has started a program or a process.
static STARTED_ANOTHER: AtomicBool = AtomicBool::new(false);
/// Where the lifetimes table is mapped: 0 not yet looked for, [`NO_TABLE`] none to be had.
static TABLE: AtomicUsize = AtomicUsize::new(0);
const NO_TABLE: usize = 1;
/// This program's key in the table (`lifetimes::key`): 0 not yet read, [`NO_KEY`] none.
static OWN_KEY: AtomicU64 = AtomicU64::new(0);
const NO_KEY: u64 = u64::MAX;

/// The stub's own constructor: notes the time, and asks to hear of every `fork`.
#[used]
#[link_section = ".init_array"]
static AT_START: extern "C" fn() = at_start;

/// At the end of a process (`exit`, not `_exit` or a signal: such a one notes nothing).
#[used]
#[link_section = ".fini_array"]
static AT_EXIT: extern "C" fn() = at_exit;

extern "C" fn at_start() {
    STARTED_NS.store(now_ns(), Relaxed);
    // SAFETY: `before_fork` makes raw calls and touches this stub's atomics and the table. No
    // DSO handle: the stub is preloaded, so never unloaded.
    unsafe { __register_atfork(Some(before_fork), None, None, core::ptr::null_mut()) };
}

/// Before glibc's `fork`, in the parent: a process that forks is a starter, and its children
/// find the table mapped and libc's exec functions looked up already (once for a shell's
/// hundreds of commands, not in each).
extern "C" fn before_fork() {
    note_started();
    exec_wrappers::look_up_before_fork(function_before_fork);
}

/// libc's function `name` from the scope as recorded already, or else, in a process of one
/// thread, as [`next_function`] finds it; 0 if neither. A `fork` handler takes no lock of the
/// loader's (as `dlsym` or a first walk would) where another thread may hold it.
fn function_before_fork(name: &'static [u8]) -> usize {
    // SAFETY: only `record` fills the scope, in this process or the one it was forked from.
    match unsafe { SCOPE.lookup(name) } {
        Some(next_symbol::Next::Function(address)) => address,
        _ if WALK_BEFORE_FORK.load(Relaxed) && single_threaded() => next_function(name),
        _ => {
            // Threads seldom all end: the count is not read again at every fork.
            WALK_BEFORE_FORK.store(false, Relaxed);
            0
        }
    }
}

/// Whether [`function_before_fork`] may still walk (it found other threads once).
static WALK_BEFORE_FORK: AtomicBool = AtomicBool::new(true);

/// Notes that this process starts a program or a process (once, with the table).
fn note_started() {
    let table = table(may_map());
    // Looked at first: a child of a shell that writes here copies the page for nothing.
    if !STARTED_ANOTHER.load(Relaxed) && !STARTED_ANOTHER.swap(true, Relaxed) {
        if let (Some(table), Some(key)) = (table, own_key()) {
            write_slot(table.note(key, lifetimes::End::Starter), may_map());
        }
    }
}

/// How this process ended, into the table: short if it ended within [`LOAD_AGE_NS`] of its
/// start, having started nothing. One that began to load the library was noted long then.
extern "C" fn at_exit() {
    if STARTED_ANOTHER.load(Relaxed) || !may_map() {
        return;
    }
    let short = now_ns().saturating_sub(STARTED_NS.load(Relaxed)) < LOAD_AGE_NS;
    note(if short { lifetimes::End::Short } else { lifetimes::End::Long });
}

/// Notes how this process ends (mapping the table if need be: see [`may_map`]).
fn note(end: lifetimes::End) {
    if let (Some(table), Some(key)) = (table(true), own_key()) {
        write_slot(table.note(key, end), true);
    }
}

/// Makes a write the table asked for, with `pwrite` on its file, if `allowed` (see
/// [`may_map`]) and the process's file-size limit lets it (a write past that limit raises
/// SIGXFSZ); whether it was made. A store into a shared mapping of the file would raise
/// SIGBUS on a full disk where the file system allocates at each write (btrfs): a failed
/// `pwrite` only returns an error, and the write is lost, as the table allows.
fn write_slot(write: Option<lifetimes::Write>, allowed: bool) -> bool {
    let Some(lifetimes::Write { index, word }) = write else { return true };
    let Some(path) = HIDDEN.setting_c(b"COREHOP_LIFETIMES").filter(|_| allowed) else { return false };
    let mut limit = [0u64; 2];
    let limited = raw_syscall6(SYS_PRLIMIT64, [0, RLIMIT_FSIZE, 0, limit.as_mut_ptr() as i64, 0, 0]) != 0
        || limit[0] < lifetimes::TABLE_BYTES as u64;
    if limited {
        return false;
    }
    let fd = raw_syscall6(SYS_OPEN, [path as i64, O_WRONLY | O_CLOEXEC, 0, 0, 0, 0]);
    if fd < 0 {
        return false;
    }
    let offset = (index * 8) as i64;
    let written = raw_syscall6(SYS_PWRITE64, [fd, &word as *const u64 as i64, 8, offset, 0, 0]) == 8;
    raw_syscall6(SYS_CLOSE, [fd, 0, 0, 0, 0, 0]);
    written
}

/// Whether the stub may make the system calls that map the table: only while it runs the
/// process on libc, having seen nothing that keeps it there for good (a filter on system
/// calls, which such calls could break, a credential change or a memory limit), with no load
/// begun (the library watches those calls then). Once mapped, the table takes no calls.
fn may_map() -> bool {
    matches!(STATE.load(Acquire), State::Plain | State::PlainWithChild) && LOADER.load(Relaxed) == NO_LOADER
}

/// Told of every program the exec wrappers start (`program`: its path or file name, or
/// null): whether to start it plainly, as the table says.
///
/// # Safety
/// `program` is null or NUL-terminated.
unsafe fn starts_plainly(program: *const c_char) -> bool {
    note_started();
    // SAFETY: the contract.
    let key = unsafe { c_bytes(program) }.and_then(lifetimes::key);
    let (Some(table), Some(key)) = (table(may_map()), key) else { return false };
    let (plainly, count) = table.starts_plainly(key);
    // A start that could not be counted (the library is loaded, the disk is full) is checked
    // one time in 16 by chance instead.
    let counted = write_slot(count, may_map());
    plainly && (counted || !one_in_16())
}

/// This program's key: that of the file name it was started as (`AT_EXECFN`).
fn own_key() -> Option<u64> {
    let mut key = OWN_KEY.load(Relaxed);
    if key == 0 {
        // SAFETY: getauxval reads the auxiliary vector; AT_EXECFN's value is null or the
        // address of the NUL-terminated file name on the process's first stack, which lives
        // as long as the process.
        let name = keeping_errno(|| unsafe { getauxval(AT_EXECFN) }) as *const c_char;
        // SAFETY: as above.
        key = unsafe { c_bytes(name) }.and_then(lifetimes::key).filter(|&k| k != 0).unwrap_or(NO_KEY);
        OWN_KEY.store(key, Relaxed);
    }
    (key != NO_KEY).then_some(key)
}

/// The lifetimes table, mapped at its first use if `map`; `None` if it is not mapped,
/// `corehop run` named none, it cannot be opened or is short, or the process has a memory
/// limit (the room is its own).
fn table(map: bool) -> Option<lifetimes::Table<'static>> {
    let mut at = TABLE.load(Acquire);
    if at == 0 && !map {
        return None;
    }
    if at == 0 {
        let mapped = map_table();
        at = match TABLE.compare_exchange(0, mapped, AcqRel, Acquire) {
            Ok(_) => mapped,
            Err(first) => {
                if mapped != NO_TABLE {
                    unmap(mapped, lifetimes::TABLE_BYTES);
                }
                first
            }
        };
    }
    if at == NO_TABLE {
        return None;
    }
    // SAFETY: `at` is a read-only shared mapping of TABLE_BYTES, page-aligned (so aligned for
    // AtomicU64), made by `map_table` and never unmapped once published here. `lifetimes`
    // only loads from it (relaxed loads of a native size, which read-only memory allows), and
    // any bit pattern is valid; other processes change the file with `pwrite`. Nothing shrinks
    // the file under the mapping (a read past its end would raise SIGBUS): `corehop run` only
    // creates it or makes it longer, in the user's own cache directory, mode 0600.
    let slots = unsafe { core::slice::from_raw_parts(at as *const AtomicU64, lifetimes::SLOT_COUNT) };
    lifetimes::Table::new(slots)
}

/// Maps the file `$COREHOP_LIFETIMES` names, shared and read-only; its address, or
/// [`NO_TABLE`].
fn map_table() -> usize {
    let Some(path) = HIDDEN.setting_c(b"COREHOP_LIFETIMES") else { return NO_TABLE };
    if watch::memory_limited(raw_for_limits) {
        return NO_TABLE;
    }
    let fd = raw_syscall6(SYS_OPEN, [path as i64, O_RDONLY | O_CLOEXEC, 0, 0, 0, 0]);
    if fd < 0 {
        return NO_TABLE;
    }
    // x86-64's `struct stat`: 144 bytes, `st_mode` (u32) at byte 24, `st_size` at 48.
    let mut stat = [0u64; 18];
    let fits = raw_syscall6(SYS_FSTAT, [fd, stat.as_mut_ptr() as i64, 0, 0, 0, 0]) == 0
        && stat[3] as u32 & S_IFMT == S_IFREG
        && stat[6] >= lifetimes::TABLE_BYTES as u64;
    let addr = if fits {
        let bytes = lifetimes::TABLE_BYTES as i64;
        raw_syscall6(SYS_MMAP, [0, bytes, PROT_READ, MAP_SHARED, fd, 0])
    } else {
        -1
    };
    raw_syscall6(SYS_CLOSE, [fd, 0, 0, 0, 0, 0]);
    if (-4095..0).contains(&addr) {
        NO_TABLE
    } else {
        addr as usize
    }
}

/// The bytes of the NUL-terminated string at `s`, without the NUL; `None` if `s` is null.
///
/// # Safety
/// `s` is null or a NUL-terminated string that outlives `'a`.
unsafe fn c_bytes<'a>(s: *const c_char) -> Option<&'a [u8]> {
    // SAFETY: the contract.
    (!s.is_null()).then(|| unsafe { hidden_env::c_bytes(s) })
}

macro_rules! stub {
    (counted: $($counted:ident)* ; watched: $($watched:ident)*) => {
        /// The names, in the order of [`SLOTS`] and [`NEXT`]: first those whose calls count
        /// toward the first epoch on the way to libc, then those [`resolve`] sees every time.
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        #[repr(usize)]
        #[derive(Clone, Copy, PartialEq, Eq)]
        enum Name { $($counted,)* $($watched),* }

        const COUNT: usize = [$(stringify!($counted),)* $(stringify!($watched)),*].len();
        const NAMES: [&[u8]; COUNT] =
            [$(concat!(stringify!($counted), "\0").as_bytes(),)* $(concat!(stringify!($watched), "\0").as_bytes()),*];
        /// Names from this one on are watched: [`resolve`] inspects each of their calls.
        const FIRST_WATCHED: usize = [$(stringify!($counted)),*].len();

        $(
            /// Jumps to the library's entry point of this name once it is loaded; before, to
            /// libc's function, except about one call in 64, which goes through [`resolve`].
            ///
            /// # Safety
            ///
            /// The contract of libc's function of this name.
            #[no_mangle]
            #[unsafe(naked)]
            pub unsafe extern "C" fn $counted() {
                // SAFETY: as in the watched entry points below, plus the countdown: the slot
                // of [`COUNTDOWNS`] that this stack's address picks is decremented with a
                // plain `sub` (an aligned 8-byte load, then store: a relaxed atomic load and
                // store, so threads sharing a slot can only lose a count) and, once it goes
                // below zero, set back to [`COUNTDOWN`] before the slow path. r10 and r11
                // carry no argument, nor do the flags. The stack is not touched before the slow
                // path.
                call_then_jump!(
                    [
                        "mov r11, qword ptr [rip + {slots} + {offset}]",
                        "test r11, r11",
                        "jz 2f",
                        "jmp r11",
                        "2:",
                        "mov r11, rsp",
                        "shr r11, 16",
                        "imul r11d, r11d, {mix}",
                        "shr r11d, {slot_shift}",
                        "shl r11d, 6",
                        "lea r10, [rip + {countdowns}]",
                        "sub qword ptr [r10 + r11], 1",
                        "js 3f",
                        "mov r11, qword ptr [rip + {next} + {offset}]",
                        "test r11, r11",
                        "jz 4f",
                        "jmp r11",
                        "3:",
                        "mov qword ptr [r10 + r11], {countdown}",
                        "4:"
                    ]
                    ["mov rcx, rdx", "mov rdx, rsi", "mov rsi, rdi", "mov edi, {index}"]
                    slots = sym SLOTS,
                    next = sym NEXT,
                    countdowns = sym COUNTDOWNS,
                    offset = const Name::$counted as usize * 8,
                    index = const Name::$counted as usize,
                    mix = const MIX,
                    slot_shift = const 32 - COUNTDOWN_SLOTS.trailing_zeros(),
                    countdown = const COUNTDOWN,
                    helper = sym resolve,
                );
            }
        )*

        $(
            /// Jumps to the library's entry point of this name once it is loaded, else to the
            /// address [`resolve`] gives.
            ///
            /// # Safety
            ///
            /// The contract of libc's function of this name.
            #[no_mangle]
            #[unsafe(naked)]
            pub unsafe extern "C" fn $watched() {
                // SAFETY: the slot is read with a plain load (an aligned 8-byte load is
                // atomic on x86-64; a stale 0 only takes the slow path). A slot that is set
                // was stored after the library started up (`load`), and x86-64 keeps one
                // thread's stores, and another's loads, in order: whoever sees the slot sees
                // the library ready. r11 carries no argument. The slow path keeps every register and the stack as the program
                // left them (`call_then_jump`), passing the index and the first three arguments
                // to `resolve`.
                call_then_jump!(
                    [
                        "mov r11, qword ptr [rip + {slots} + {offset}]",
                        "test r11, r11",
                        "jz 2f",
                        "jmp r11",
                        "2:"
                    ]
                    ["mov rcx, rdx", "mov rdx, rsi", "mov rsi, rdi", "mov edi, {index}"]
                    slots = sym SLOTS,
                    offset = const Name::$watched as usize * 8,
                    index = const Name::$watched as usize,
                    helper = sym resolve,
                );
            }
        )*
    };
}

// The names `crates/preload` exports (a test in crates/cli/tests/run.rs checks the two lists).
// Counted names go straight to libc until the library is loaded; watched ones start children
// or change a thread's state, which `resolve` must see (`kind`).
stub! {
    counted:
    read write pread pread64 pwrite pwrite64 readv writev
    open open64 openat openat64 __open_2 __open64_2 __openat_2 __openat64_2
    stat stat64 lstat lstat64 fstat fstat64 fstatat fstatat64 statx
    __xstat __xstat64 __lxstat __lxstat64 __fxstat __fxstat64 __fxstatat __fxstatat64
    fsync fdatasync sendfile sendfile64 sendto recvfrom poll select
    __read_chk __pread_chk __pread64_chk __poll_chk
    close dup2 dup3 close_range sigaction signal sigset;
    watched:
    vfork __vfork clone __clone _Fork syscall
    prctl setfsuid setfsgid unshare setns capset
    setrlimit setrlimit64 prlimit prlimit64
}

/// Calls of counted names before the library is loaded: about one in this many plus one goes
/// through [`resolve`], which reads the clock by a system call. The rest jump to libc at the
/// cost of a few instructions. Through `resolve` every call cost 24 ns here, more than the
/// library's own decision once loaded; one in 16 still cost 12 ns a call, most of it the
/// clock's system call (docs/performance.md, "Twenty-seventh session").
const COUNTDOWN: usize = 63;

/// A count-down per region of stack (64 KiB, hashed): threads of a program mostly count apart,
/// so the line of one is not pulled between CPUs at every call (the stack picks the slot: no
/// thread-local storage, which a `no_std` stub cannot declare). One line each, and few: with
/// the rest of the stub's writable data they fit one page, so loading the stub maps no more.
#[repr(C, align(64))]
struct Countdown(AtomicI64);

const COUNTDOWN_SLOTS: u32 = 8;

static COUNTDOWNS: [Countdown; COUNTDOWN_SLOTS as usize] =
    [const { Countdown(AtomicI64::new(0)) }; COUNTDOWN_SLOTS as usize];

/// The multiplier (Fibonacci hashing: the top bits of the 32-bit product) that spreads stack
/// regions over [`COUNTDOWNS`].
const MIX: i32 = 0x9E37_79B1_u32 as i32;

/// The library's entry points, set once it is loaded (0 until then).
static SLOTS: [AtomicUsize; COUNT] = [const { AtomicUsize::new(0) }; COUNT];
/// libc's functions (what `dlsym(RTLD_NEXT)` gives), resolved at first use (0: not yet).
static NEXT: [AtomicUsize; COUNT] = [const { AtomicUsize::new(0) }; COUNT];

/// What a call is to the library.
enum Kind {
    /// Moves or stays as the policy says: counts toward the first epoch.
    Plain,
    /// Starts a process the library's fork handlers will not see: marks the process
    /// ([`State::PlainWithChild`]) before the child exists.
    Child,
    /// Changes the calling thread's credentials, filters or namespaces alone.
    ThreadState,
    /// May leave the process with a finite address-space or data limit
    /// (`watch::may_limit_memory`).
    MemoryLimit,
}

/// The kind of call `name` with its first three integer arguments (as the registers hold them).
fn kind(name: Name, a0: i64, a1: i64, a2: i64) -> Kind {
    match name {
        Name::vfork | Name::__vfork | Name::_Fork => Kind::Child,
        // clone's flags are its third argument, an int.
        Name::clone | Name::__clone if i64::from(a2 as i32) & watch::CLONE_THREAD == 0 => Kind::Child,
        Name::clone | Name::__clone if watch::thread_with_own_files(i64::from(a2 as i32)) => {
            Kind::ThreadState
        }
        Name::syscall if a0 == watch::nr::CLONE && watch::thread_with_own_files(a1) => Kind::ThreadState,
        Name::syscall if watch::starts_unseen_child(a0, a1) => Kind::Child,
        Name::syscall if watch::changes_thread_state(a0) => Kind::ThreadState,
        Name::prctl if watch::prctl_changes_thread_state(i64::from(a0 as i32)) => Kind::ThreadState,
        Name::setfsuid | Name::setfsgid | Name::unshare | Name::setns | Name::capset => Kind::ThreadState,
        // syscall's third argument, prlimit64's new limits, is not among those passed here.
        Name::syscall if watch::raw_call_may_limit_memory(a0, a1, a2, None, raw_for_limits) => {
            Kind::MemoryLimit
        }
        Name::setrlimit | Name::setrlimit64
            if watch::may_limit_memory(0, a0, Some(a1 as u64), raw_for_limits) =>
        {
            Kind::MemoryLimit
        }
        Name::prlimit | Name::prlimit64
            if watch::may_limit_memory(a0, a1, Some(a2 as u64), raw_for_limits) =>
        {
            Kind::MemoryLimit
        }
        _ => Kind::Plain,
    }
}

/// Where call `index` continues: the library's entry point once it is loaded, else libc's
/// function. Called by the entry points' slow path with their first three arguments.
///
/// # Safety
/// `index` is below `COUNT`: the entry points pass their own.
unsafe extern "C" fn resolve(index: usize, a0: i64, a1: i64, a2: i64) -> usize {
    // SAFETY: `index` is below COUNT (this function's contract); `Name` is repr(usize) with
    // variants 0..COUNT.
    let name = unsafe { core::mem::transmute::<usize, Name>(index) };
    match kind(name, a0, a1, a2) {
        // A counted name's entry point sends about one call in 64 here, and the first of each
        // name (to resolve libc's function): already sampled, or rare.
        Kind::Plain => tick(index < FIRST_WATCHED),
        Kind::Child => settle(State::PlainWithChild),
        Kind::ThreadState | Kind::MemoryLimit => settle(State::Stays),
    }
    if STATE.load(Acquire) == State::Loaded {
        return SLOTS[index].load(Relaxed);
    }
    next(name)
}

/// How long a process runs on libc before the stub loads the library: twice the default
/// policy's first epoch. Loading costs about 100-200 µs here (`dlopen` 65-150 µs, the library's
/// start 20-40 µs), and a process that ends just after it has lost that for nothing; at 40 ms
/// it is at most half a per cent of such a process's life (about one per cent at 20 ms). A
/// process that lives on starts its policy at once, past that epoch.
const LOAD_AGE_NS: u64 = 2 * watch::FIRST_EPOCH_NS;

/// A call that counts toward the first epoch: about one in 16 reads the clock (every one if
/// `sampled`: its entry point sent only one in 64 here), and one after the epoch loads the
/// library.
fn tick(sampled: bool) {
    let state = STATE.load(Relaxed);
    if state != State::Plain && state != State::PlainWithChild {
        return;
    }
    let first = FIRST_CALL_NS.load(Relaxed);
    if first != 0 && !sampled && !one_in_16() {
        return;
    }
    let now = now_ns();
    if first == 0 {
        if FIRST_CALL_NS.compare_exchange(0, now, Relaxed, Relaxed).is_ok() {
            note_first_call(raw_syscall(SYS_GETPID));
        }
    } else if now.saturating_sub(first) >= LOAD_AGE_NS {
        let pid = raw_syscall(SYS_GETPID);
        if state == State::PlainWithChild && pid != OWNER_PID.load(Relaxed) {
            return;
        }
        // A child forked after the first call inherits its time, but most such children (a
        // shell's, before each command of a pipeline or with a redirection) make a few calls
        // and exec: loading the library there cost each one its load for nothing. Such a
        // child starts a first epoch of its own instead. Its memory is its own: in `Plain` no
        // child shares ours, and in `PlainWithChild` only the owner gets here.
        if pid != FIRST_CALL_PID.load(Relaxed) {
            FIRST_CALL_NS.store(now, Relaxed);
            note_first_call(pid);
            return;
        }
        let (tid, blocked) = (raw_syscall(SYS_GETTID), blocked_signals());
        let (first_tid, first_blocked) = (FIRST_CALL_TID.load(Relaxed), FIRST_CALL_BLOCKED.load(Relaxed));
        if !stub_state::outside_a_handler(tid, blocked, first_tid, first_blocked) {
            return;
        }
        // Another thread that blocks more than the first call's did may be in a handler too,
        // or may block more for good (a server's workers often do): with no first call of its
        // own to go by, it leaves the load for a while to a thread that blocks no more.
        if stub_state::blocks_more(blocked, first_blocked)
            && LOADS_PUT_OFF.fetch_add(1, Relaxed) < MAX_LOADS_PUT_OFF
        {
            return;
        }
        load_once(state);
    }
}

/// Loads put off on threads other than the first call's that blocked more than it did (see
/// [`tick`]), and how many at most: about 64 sampled calls, some thousands of calls.
static LOADS_PUT_OFF: AtomicU32 = AtomicU32::new(0);
const MAX_LOADS_PUT_OFF: u32 = 64;

/// Notes which process and thread made the first call, and the signals that thread blocked.
fn note_first_call(pid: i64) {
    FIRST_CALL_PID.store(pid, Relaxed);
    FIRST_CALL_TID.store(raw_syscall(SYS_GETTID), Relaxed);
    FIRST_CALL_BLOCKED.store(blocked_signals(), Relaxed);
}

/// Before a watched call (see [`StateWord::settle`]): marks the process before a child that
/// shares its memory, or gives the library up for good.
fn settle(to: State) {
    let mark = || {
        if !FORK_HANDLER.swap(true, Relaxed) {
            // SAFETY: `after_fork_child` touches only this stub's atomics. No DSO handle: the
            // stub is preloaded, so never unloaded.
            unsafe { __register_atfork(None, None, Some(after_fork_child), core::ptr::null_mut()) };
        }
        // Before the child exists: it would read its own pid here.
        let _ = OWNER_PID.compare_exchange(0, raw_syscall(SYS_GETPID), Relaxed, Relaxed);
    };
    STATE.settle(to, me, mark, || {
        raw_syscall(SYS_SCHED_YIELD);
    });
}

/// This process's pid and this thread's tid.
fn me() -> (u32, u32) {
    (raw_syscall(SYS_GETPID) as u32, raw_syscall(SYS_GETTID) as u32)
}

/// In the child of a `fork` (glibc's, which runs fork handlers): this copy of the memory is
/// its own, shared with no child of the parent, so it may load the library as a process that
/// never started such a child, once it has lived through a first epoch of its own.
extern "C" fn after_fork_child() {
    OWNER_PID.store(0, Relaxed);
    FIRST_CALL_NS.store(0, Relaxed);
    STATE.after_fork_child();
}

/// Loads the library if no thread has begun to (`from`: the state the caller saw): in a
/// process with other threads, on a thread of the stub's own that this call waits for at most
/// [`LOAD_WAIT_NS`].
///
/// Why a thread: `dlopen` takes the dynamic loader's lock. A library whose constructor starts
/// a thread that makes calls and then joins it holds that lock while it waits; had that
/// thread's call loaded the library itself, neither would ever go on. The loader thread waits
/// for the lock instead, and the call goes on to libc once the wait is up; the library takes
/// the calls over when the constructor has returned.
#[cold]
fn load_once(from: State) {
    // Under a memory limit the room is the program's (`watch::memory_limited`): no loader
    // thread, no `dlopen`, on libc for good.
    if watch::memory_limited(raw_for_limits) {
        settle(State::Stays);
        return;
    }
    if LOADER.compare_exchange(NO_LOADER, LOADER_RUNNING, Relaxed, Relaxed).is_err() {
        return;
    }
    // Past the stub's wait, this process is long, whatever the load gives.
    note(lifetimes::End::Long);
    keeping_errno(|| {
        // The loader starts with this mask: no handler of the program runs in `dlopen`.
        let before = set_blocked_signals(!stub_state::GLIBC_SIGNALS);
        // Here, where no other thread may hold the loader's lock (the process has one), where
        // a sanitizer's runtime may hold its threads' lock around this call
        // (`next_symbol::SANITIZER_INITS`), or where no thread is to be had (a limit on
        // threads, a filter on `clone`). A loader thread adds about 250 µs to the load here.
        if single_threaded() || next_symbol::sanitizer_loaded() != Some(false) || !load_on_a_thread() {
            STATE.load_once(from, me(), load);
        }
        set_blocked_signals(before);
    });
}

/// Whether the process has one thread, by the kernel's count (`/proc/self/stat`); false if
/// that cannot be read.
fn single_threaded() -> bool {
    let mut stat = [0u8; 512];
    let Some(line) = read_start(b"/proc/self/stat\0", &mut stat) else { return false };
    // After the name in parentheses (which may hold spaces and parentheses itself): the
    // state, field 3, then the others; the thread count is field 20.
    let Some(rest) = line.iter().rposition(|&b| b == b')').and_then(|end| line.get(end + 1..)) else {
        return false;
    };
    let mut fields = rest.split(|&b| b == b' ').filter(|f| !f.is_empty());
    fields.nth(17) == Some(b"1".as_slice())
}

/// [`LOADER`]: no load begun, one begun (on the caller or on a loader thread), the loader
/// thread has finished.
static LOADER: AtomicU32 = AtomicU32::new(NO_LOADER);
const NO_LOADER: u32 = 0;
const LOADER_RUNNING: u32 = 1;
const LOADER_DONE: u32 = 2;
/// The loader thread's kernel id, once it runs.
static LOADER_TID: AtomicI64 = AtomicI64::new(0);
/// How long the call that started the loader waits for it: a load takes 100-200 µs here
/// (a few ms while the host stalls), and one that waits for the loader's lock as long as the
/// lock's holder, which may be waiting for this call's thread. Long enough that a load goes
/// on after the call only then: a `fork` made while the loader is inside `dlopen` would leave
/// the child the loader's data half-changed.
const LOAD_WAIT_NS: u64 = 20_000_000;
/// How long, after joining the loader, the call waits for the kernel to take the thread off
/// the process's list (as the library does for its service threads: an `unshare` of a user
/// namespace made right after needs a process of one thread).
const LOADER_GONE_NS: u64 = 2_000_000;

/// Starts the loader thread and waits for it (bounded); false if no thread could be started
/// (nothing was loaded then).
fn load_on_a_thread() -> bool {
    let Some(pthread) = Pthread::look_up() else { return false };
    let mut attr = PthreadAttr([0; 56]);
    let mut thread = 0u64;
    // SAFETY: libc's functions of these types; `attr` is a `pthread_attr_t`'s size and
    // alignment, initialized before use and destroyed after; `loader_main` reads no argument.
    let started = unsafe {
        (pthread.attr_init)(&mut attr) == 0 && {
            // Twice the load stack: glibc keeps the thread's own block and static TLS at its top.
            let ok = (pthread.attr_setstacksize)(&mut attr, 2 * LOAD_STACK_BYTES) == 0
                && (pthread.create)(&mut thread, &attr, loader_main, core::ptr::null_mut()) == 0;
            (pthread.attr_destroy)(&mut attr);
            ok
        }
    };
    if !started {
        return false;
    }
    let deadline = now_ns() + LOAD_WAIT_NS;
    let (mut next_look, mut looks_waiting) = (now_ns() + LOOK_EVERY_NS, 0);
    loop {
        if LOADER.load(Acquire) == LOADER_DONE {
            // SAFETY: `thread` is the loader, joined once, and it has returned (or is about to).
            unsafe { (pthread.join)(thread, core::ptr::null_mut()) };
            wait_gone(LOADER_TID.load(Relaxed));
            return true;
        }
        let now = now_ns();
        if now >= next_look {
            next_look = now + LOOK_EVERY_NS;
            looks_waiting = if waits_in_futex(LOADER_TID.load(Relaxed)) { looks_waiting + 1 } else { 0 };
        }
        if now >= deadline || looks_waiting >= 2 {
            // It waits for a lock, the loader's as like as not, whose holder may be this
            // thread or wait for it: it finishes on its own, after this call.
            // SAFETY: `thread` is the loader, not joined.
            unsafe { (pthread.detach)(thread) };
            return true;
        }
        futex_wait(&LOADER, LOADER_RUNNING, deadline.min(next_look) - now);
    }
}

/// How often the call that waits for the loader looks at what the loader is doing: twice in
/// a row in a `futex` wait, and it stops waiting (a dlopen'd constructor that makes calls
/// would otherwise hold it up for all of [`LOAD_WAIT_NS`]).
const LOOK_EVERY_NS: u64 = 1_000_000;

/// Whether thread `tid` of this process is in a `futex` call (`/proc/self/task/TID/syscall`
/// starts with its number); false if that cannot be read.
fn waits_in_futex(tid: i64) -> bool {
    const HEAD: &[u8] = b"/proc/self/task/";
    const TAIL: &[u8] = b"/syscall\0";
    if tid <= 0 {
        return false;
    }
    let mut path = [0u8; 48];
    let mut digits = [0u8; 20];
    let (mut n, mut count) = (tid as u64, 0);
    while let (true, Some(digit)) = (n > 0, digits.get_mut(count)) {
        *digit = b'0' + (n % 10) as u8;
        (n, count) = (n / 10, count + 1);
    }
    let mut at = 0;
    let reversed = digits.iter().take(count).rev();
    for &byte in HEAD.iter().chain(reversed).chain(TAIL) {
        let Some(slot) = path.get_mut(at) else { return false };
        (*slot, at) = (byte, at + 1);
    }
    let mut text = [0u8; 8];
    path.get(..at).and_then(|path| read_start(path, &mut text)).is_some_and(|t| t.starts_with(b"202 "))
}

/// The first bytes of the file at `path` (NUL-terminated), as many as fit in `buf`, read with
/// raw calls (`open` and `read` are this stub's own names); `None` if it cannot be read.
fn read_start<'b>(path: &[u8], buf: &'b mut [u8]) -> Option<&'b [u8]> {
    if path.last() != Some(&0) {
        return None;
    }
    let fd = raw_syscall6(SYS_OPEN, [path.as_ptr() as i64, O_RDONLY | O_CLOEXEC, 0, 0, 0, 0]);
    if fd < 0 {
        return None;
    }
    let len = raw_syscall6(SYS_READ, [fd, buf.as_mut_ptr() as i64, buf.len() as i64, 0, 0, 0]);
    raw_syscall6(SYS_CLOSE, [fd, 0, 0, 0, 0, 0]);
    buf.get(..usize::try_from(len).ok()?)
}

/// The loader thread: loads the library once, says so and ends.
extern "C" fn loader_main(_: *mut c_void) -> *mut c_void {
    LOADER_TID.store(raw_syscall(SYS_GETTID), Relaxed);
    // The state now, not its starter's: a child sharing this memory may have started since.
    if let from @ (State::Plain | State::PlainWithChild) = STATE.load(Acquire) {
        STATE.load_once(from, me(), |child_seen| {
            // Its own stack is the size the library's start-up may take (`handover`'s flag bit 1).
            LOAD_STACK_MAPPED.store(true, Relaxed);
            load_blocked(child_seen)
        });
    }
    LOADER.store(LOADER_DONE, Release);
    futex_wake(&LOADER);
    core::ptr::null_mut()
}

/// Waits until thread `tid` of this process is gone, at most [`LOADER_GONE_NS`].
fn wait_gone(tid: i64) {
    if tid <= 0 {
        return;
    }
    let (pid, deadline) = (raw_syscall(SYS_GETPID), now_ns() + LOADER_GONE_NS);
    while raw_syscall6(SYS_TGKILL, [pid, tid, 0, 0, 0, 0]) == 0 && now_ns() < deadline {
        raw_syscall(SYS_SCHED_YIELD);
    }
}

/// Sleeps while `word` holds `expected`, at most `ns`.
fn futex_wait(word: &AtomicU32, expected: u32, ns: u64) {
    let timeout = [(ns / 1_000_000_000) as i64, (ns % 1_000_000_000) as i64];
    let args = [word.as_ptr() as i64, FUTEX_WAIT_PRIVATE, i64::from(expected), timeout.as_ptr() as i64, 0, 0];
    raw_syscall6(SYS_FUTEX, args);
}

/// Wakes every thread waiting on `word`.
fn futex_wake(word: &AtomicU32) {
    raw_syscall6(SYS_FUTEX, [word.as_ptr() as i64, FUTEX_WAKE_PRIVATE, i64::from(i32::MAX), 0, 0, 0]);
}

/// libc's thread functions the loader needs, looked up when a load first needs them: bound
/// when the stub is loaded, as its other names are, each cost every process a look-up.
struct Pthread {
    attr_init: AttrFn,
    attr_setstacksize: unsafe extern "C" fn(*mut PthreadAttr, usize) -> c_int,
    attr_destroy: AttrFn,
    create: CreateFn,
    join: unsafe extern "C" fn(u64, *mut *mut c_void) -> c_int,
    detach: unsafe extern "C" fn(u64) -> c_int,
}

type AttrFn = unsafe extern "C" fn(*mut PthreadAttr) -> c_int;
type CreateFn = unsafe extern "C" fn(
    *mut u64,
    *const PthreadAttr,
    extern "C" fn(*mut c_void) -> *mut c_void,
    *mut c_void,
) -> c_int;

impl Pthread {
    /// The functions after this stub (libc's), or `None` if one is missing.
    fn look_up() -> Option<Pthread> {
        let find = |name: &[u8]| Some(next_function(name)).filter(|&address| address != 0);
        let (attr_init, attr_setstacksize, attr_destroy) = (
            find(b"pthread_attr_init\0")?,
            find(b"pthread_attr_setstacksize\0")?,
            find(b"pthread_attr_destroy\0")?,
        );
        let (create, join, detach) =
            (find(b"pthread_create\0")?, find(b"pthread_join\0")?, find(b"pthread_detach\0")?);
        // SAFETY: each address is the function of that name, whose C type each field has.
        unsafe {
            Some(Pthread {
                attr_init: core::mem::transmute::<usize, AttrFn>(attr_init),
                attr_setstacksize: core::mem::transmute::<
                    usize,
                    unsafe extern "C" fn(*mut PthreadAttr, usize) -> c_int,
                >(attr_setstacksize),
                attr_destroy: core::mem::transmute::<usize, AttrFn>(attr_destroy),
                create: core::mem::transmute::<usize, CreateFn>(create),
                join: core::mem::transmute::<usize, unsafe extern "C" fn(u64, *mut *mut c_void) -> c_int>(
                    join,
                ),
                detach: core::mem::transmute::<usize, unsafe extern "C" fn(u64) -> c_int>(detach),
            })
        }
    }
}

/// A `pthread_attr_t` of glibc on x86-64: 56 bytes, aligned as a pointer.
#[repr(C, align(8))]
struct PthreadAttr([u8; 56]);

/// [`load_blocked`] with every signal but glibc's own blocked (a handler that ran in the
/// middle of `dlopen` would find the loader's lock held by its own thread and its data
/// half-changed), on a stack of its own: the call that loads may come from a coroutine with a
/// few KiB of stack, where `dlopen` (about 3 KiB deeper than a plain `write`) overflowed it.
fn load(child_seen: bool) -> bool {
    let before = set_blocked_signals(!stub_state::GLIBC_SIGNALS);
    LOAD_CHILD_SEEN.store(child_seen, Relaxed);
    let stack = map_load_stack();
    LOAD_STACK_MAPPED.store(stack != 0, Relaxed);
    if stack == 0 {
        load_on_this_stack();
    } else {
        // SAFETY: the stack is LOAD_STACK_BYTES of fresh anonymous memory above a guard page,
        // used by this thread only (one load at a time: `StateWord::load_once`) with signals
        // blocked, so nothing else runs on it. Its top is 16-byte aligned, as `call` needs;
        // r12, callee-saved, keeps the caller's stack pointer across the call, and the C
        // clobbers cover what the callee may change. The asm may push (no `nostack`), so no
        // data of the caller is left below its stack pointer.
        unsafe {
            core::arch::asm!(
                "mov r12, rsp",
                "mov rsp, {top}",
                "call {load}",
                "mov rsp, r12",
                top = in(reg) stack + LOAD_GUARD_BYTES + LOAD_STACK_BYTES,
                load = sym load_on_this_stack,
                out("r12") _,
                clobber_abi("C"),
            );
        }
        unmap(stack, LOAD_GUARD_BYTES + LOAD_STACK_BYTES);
    }
    set_blocked_signals(before);
    LOADED.load(Relaxed)
}

/// What [`load`] passes to, and gets back from, [`load_on_this_stack`].
static LOAD_CHILD_SEEN: AtomicBool = AtomicBool::new(false);
static LOAD_STACK_MAPPED: AtomicBool = AtomicBool::new(false);
static LOADED: AtomicBool = AtomicBool::new(false);

/// The stack `dlopen` runs on, above a guard page. The library's start-up runs on it too
/// (`handover`'s flag bit 1), as on the stack of this size it would take otherwise.
const LOAD_STACK_BYTES: usize = 256 * 1024;
const LOAD_GUARD_BYTES: usize = 4096;

extern "C" fn load_on_this_stack() {
    LOADED.store(load_blocked(LOAD_CHILD_SEEN.load(Relaxed)), Relaxed);
}

/// Maps the load stack with its guard page (0 if that fails: the load then runs where it is).
fn map_load_stack() -> usize {
    let bytes = LOAD_GUARD_BYTES + LOAD_STACK_BYTES;
    let flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK;
    let addr = raw_syscall6(SYS_MMAP, [0, bytes as i64, PROT_READ | PROT_WRITE, flags, -1, 0]);
    if (-4095..0).contains(&addr) {
        return 0;
    }
    if raw_syscall6(SYS_MPROTECT, [addr, LOAD_GUARD_BYTES as i64, PROT_NONE, 0, 0, 0]) != 0 {
        unmap(addr as usize, bytes);
        return 0;
    }
    addr as usize
}

fn unmap(addr: usize, bytes: usize) {
    raw_syscall6(SYS_MUNMAP, [addr as i64, bytes as i64, 0, 0, 0, 0]);
}

/// Loads the library, hands it the first call's time and whether an unseen child may exist,
/// and fills [`SLOTS`]; false if any step fails (nothing is routed to the library then).
fn load_blocked(child_seen: bool) -> bool {
    // The path `corehop run` hid, or else the environment's.
    let path = match HIDDEN.setting_c(b"COREHOP_LIBRARY") {
        Some(path) => path,
        // SAFETY: the name is NUL-terminated; secure_getenv returns null (unset, or a
        // set-user-ID process) or a NUL-terminated string of the environment.
        None => unsafe { secure_getenv(c"COREHOP_LIBRARY".as_ptr()) },
    };
    if path.is_null() {
        return false;
    }
    // SAFETY: `path` is a NUL-terminated string. RTLD_LOCAL (0): the library's symbols do not
    // join the global scope, so the program's calls keep reaching this stub, which routes them.
    let handle = unsafe { dlopen(path, RTLD_NOW) };
    if handle.is_null() {
        // Silently: `corehop run` found the library, so what fails here is this process's own
        // doing (a chroot, its descriptors all in use, a mount namespace), and a plain run
        // would print nothing.
        return false;
    }
    let mut targets = [0usize; COUNT];
    for (target, name) in targets.iter_mut().zip(NAMES) {
        // SAFETY: `handle` is the library's; the name is NUL-terminated.
        *target = unsafe { dlsym(handle, name.as_ptr() as *const c_char) } as usize;
        if *target == 0 {
            complain(b"$COREHOP_LIBRARY lacks an entry point this stub routes");
            return false;
        }
    }
    // SAFETY: as above.
    let (next_after_stub, handover) = unsafe {
        (
            dlsym(handle, c"corehop_preload_next_after_stub".as_ptr()),
            dlsym(handle, c"corehop_preload_handover".as_ptr()),
        )
    };
    if next_after_stub.is_null() || handover.is_null() {
        complain(b"$COREHOP_LIBRARY is not corehop's preload library");
        return false;
    }
    // SAFETY: the library defines `corehop_preload_next_after_stub` with this type.
    let next_after_stub = unsafe {
        core::mem::transmute::<*mut c_void, extern "C" fn(unsafe extern "C" fn(*const c_char) -> *mut c_void)>(
            next_after_stub,
        )
    };
    // Before anything in the library looks a function up.
    next_after_stub(next_for_library);
    // SAFETY: the library defines `corehop_preload_handover` with this type.
    let handover = unsafe {
        core::mem::transmute::<
            *mut c_void,
            extern "C" fn(u64, u32, i64, u64, *const hidden_env::Hidden) -> bool,
        >(handover)
    };
    let first = FIRST_CALL_NS.load(Relaxed);
    let (tid, blocked) = (FIRST_CALL_TID.load(Relaxed), FIRST_CALL_BLOCKED.load(Relaxed));
    let flags = u32::from(child_seen) | u32::from(LOAD_STACK_MAPPED.load(Relaxed)) << 1;
    if !handover(if first == 0 { now_ns() } else { first }, flags, tid, blocked, &HIDDEN) {
        return false;
    }
    for (slot, target) in SLOTS.iter().zip(targets) {
        slot.store(target, Release);
    }
    true
}

/// libc's function for calls of `name` (cached), or [`unsupported`].
fn next(name: Name) -> usize {
    let index = name as usize;
    let cached = NEXT[index].load(Relaxed);
    if cached != 0 {
        return cached;
    }
    let found = next_function(NAMES[index]);
    let found = if found == 0 { unsupported as *const () as usize } else { found };
    // Another thread may have stored the same answer meanwhile.
    NEXT[index].store(found, Relaxed);
    found
}

/// The function `name` (NUL-terminated) binds to after this stub: from the tables of the
/// objects after it if they answer, else from `dlsym(RTLD_NEXT)`; 0 if nothing defines it.
fn next_function(name: &[u8]) -> usize {
    if !WALKED.swap(true, Relaxed) {
        SCOPE.record();
    }
    // SAFETY: only `record` above fills the scope, in this process or the one it was forked
    // from.
    if let Some(next_symbol::Next::Function(address)) = unsafe { SCOPE.lookup(name) } {
        return address;
    }
    // SAFETY: the name is NUL-terminated; dlsym calls no function this stub exports.
    keeping_errno(|| unsafe { dlsym(RTLD_NEXT, name.as_ptr() as *const c_char) }) as usize
}

/// What `name` binds to after this stub, for the library this stub loaded (null if nothing
/// does): opened with `dlopen`, its own `dlsym(RTLD_NEXT)` would skip what is preloaded after
/// the stub. One of this stub's names gets [`next`]'s answer, another [`next_function`]'s.
///
/// # Safety
/// `name` is NUL-terminated.
unsafe extern "C" fn next_for_library(name: *const c_char) -> *mut c_void {
    let mine = NAMES.iter().position(|known| {
        let known = known.strip_suffix(b"\0").unwrap_or(known);
        // SAFETY: `name` is NUL-terminated (this function's contract); `known` without its NUL
        // holds none.
        unsafe { next_symbol::c_str_is(name.cast(), known) }
    });
    let found = match mine {
        // SAFETY: a position in NAMES, below COUNT; `Name` is repr(usize) with variants
        // 0..COUNT.
        Some(index) => next(unsafe { core::mem::transmute::<usize, Name>(index) }),
        // SAFETY: a NUL-terminated name (this function's contract).
        None => unsafe { with_nul(name) }.map_or(0, next_function),
    };
    if found == unsupported as *const () as usize {
        core::ptr::null_mut()
    } else {
        found as *mut c_void
    }
}

/// The bytes of the NUL-terminated `name`, its NUL included; `None` past 255 bytes (no name
/// of libc's is that long). Not `CStr::from_ptr`: its `strlen` would be one more name bound
/// when the stub is loaded, in every process.
///
/// # Safety
/// `name` is NUL-terminated.
unsafe fn with_nul<'a>(name: *const c_char) -> Option<&'a [u8]> {
    // SAFETY: bytes up to and including the first NUL are the string's (the contract).
    let len = (0..256).find(|&i| unsafe { *name.add(i) } == 0)?;
    // SAFETY: as above: `len + 1` bytes of the string, its NUL last.
    Some(unsafe { core::slice::from_raw_parts(name.cast::<u8>(), len + 1) })
}

/// Whether a thread of this process (or of the one it was forked from) has begun to record
/// [`SCOPE`]: it is recorded once, at a process's first call, and a child forked after that
/// looks its names up in its parent's scope.
static WALKED: AtomicBool = AtomicBool::new(false);

/// The objects a name binds to after this stub, up to libc, with where their tables are: each
/// name is looked up there at its first call. Looking every name up at the first call read
/// the tables' lines for all of the stub's names, about 10 µs a process that makes calls
/// (docs/performance.md, "Fifty-fourth session"). Static, not on the stack: the first call
/// may be a signal handler's, on a small alternate stack.
static SCOPE: next_symbol::Scope = next_symbol::Scope::new();

/// Stands in for a function libc lacks: fails with ENOSYS, as the library does.
extern "C" fn unsupported() -> c_int {
    // SAFETY: __errno_location returns this thread's errno.
    unsafe { *__errno_location() = ENOSYS };
    -1
}

/// Runs `f` and puts errno back as it was: the program's call, not ours, sets it (a program
/// may read it after a call that succeeded).
fn keeping_errno<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: __errno_location returns this thread's errno, valid for the thread's life.
    let errno = unsafe { __errno_location() };
    // SAFETY: as above.
    let saved = unsafe { *errno };
    let result = f();
    // SAFETY: as above.
    unsafe { *errno = saved };
    result
}

/// The monotonic clock, by the system call rather than libc's vDSO path: in a short process
/// that reads no clock itself, the vDSO's data page and libc's `clock_gettime` are two page
/// faults, dearer than the system call once in 16 calls of a first epoch.
fn now_ns() -> u64 {
    let mut ts = [0i64; 2];
    // SAFETY: clock_gettime writes a timespec (two i64 on x86-64 Linux) to `ts`, which lives
    // on this frame; the syscall instruction clobbers rcx and r11.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") SYS_CLOCK_GETTIME => _,
            in("rdi") CLOCK_MONOTONIC,
            in("rsi") ts.as_mut_ptr(),
            out("rcx") _,
            out("r11") _,
            options(nostack),
        );
    }
    ts[0] as u64 * 1_000_000_000 + ts[1] as u64
}

/// True about once in 16 calls, by the cycle counter (no shared counter to bounce between
/// the program's threads; the library samples the same way).
fn one_in_16() -> bool {
    // SAFETY: reads the time-stamp counter; touches no memory.
    let ticks = unsafe { core::arch::x86_64::_rdtsc() };
    (ticks.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) & 15 == 0
}

const SYS_READ: i64 = 0;
const SYS_WRITE: i64 = 1;
const SYS_OPEN: i64 = 2;
const SYS_CLOSE: i64 = 3;
const O_RDONLY: i64 = 0;
const O_WRONLY: i64 = 1;
const SYS_PWRITE64: i64 = 18;
const SYS_PRLIMIT64: i64 = 302;
const RLIMIT_FSIZE: i64 = 1;
const SYS_FSTAT: i64 = 5;
const S_IFMT: u32 = 0o170_000;
const S_IFREG: u32 = 0o100_000;
const AT_EXECFN: u64 = 31;
const MAP_SHARED: i64 = 0x01;
const O_CLOEXEC: i64 = 0o2_000_000;
const SYS_SCHED_YIELD: i64 = 24;
const SYS_GETPID: i64 = 39;
const SYS_GETTID: i64 = 186;
const SYS_CLOCK_GETTIME: i64 = 228;
const SYS_RT_SIGPROCMASK: i64 = 14;
const SYS_MMAP: i64 = 9;
const SYS_MPROTECT: i64 = 10;
const SYS_MUNMAP: i64 = 11;
const SYS_FUTEX: i64 = 202;
const SYS_TGKILL: i64 = 234;
const FUTEX_WAIT_PRIVATE: i64 = 128;
const FUTEX_WAKE_PRIVATE: i64 = 129;
const PROT_NONE: i64 = 0;
const PROT_READ: i64 = 1;
const PROT_WRITE: i64 = 2;
const MAP_PRIVATE: i64 = 0x02;
const MAP_ANONYMOUS: i64 = 0x20;
const MAP_NORESERVE: i64 = 0x4000;
const MAP_STACK: i64 = 0x20000;

/// The raw calls of `watch`'s limit checks (`prlimit64`, `getpid`, `tgkill` with signal 0,
/// `process_vm_readv` of our own memory), which write only into the checks' locals.
fn raw_for_limits(nr: i64, args: [u64; 6]) -> i64 {
    raw_syscall6(nr, args.map(|a| a as i64))
}

/// A system call with six arguments (mmap and friends: libc's `mmap` is not this stub's, but
/// a raw call sets no errno).
fn raw_syscall6(nr: i64, args: [i64; 6]) -> i64 {
    let ret: i64;
    // SAFETY: the calls made through this (mmap, mprotect, munmap) touch only the memory they
    // map or unmap, which no Rust reference covers until `table` makes one to the shared
    // mapping of a file; futex reads the word and the timeout it is given, open the path,
    // fstat writes a `struct stat` into the 144 bytes it is given, read writes at most the
    // length it is given into the buffer, pwrite reads the 8 bytes it is given, all of which
    // live for the call; tgkill with signal 0 sends nothing; prlimit64 and process_vm_readv
    // write only into the locals they are given (`raw_for_limits`, `write`). The syscall
    // instruction clobbers rcx and r11.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") nr => ret,
            in("rdi") args[0],
            in("rsi") args[1],
            in("rdx") args[2],
            in("r10") args[3],
            in("r8") args[4],
            in("r9") args[5],
            out("rcx") _,
            out("r11") _,
            options(nostack),
        );
    }
    ret
}
const SIG_BLOCK: i64 = 0;
const SIG_SETMASK: i64 = 2;

/// The calling thread's blocked signals (a kernel sigset: bit `n - 1` for signal `n`).
fn blocked_signals() -> u64 {
    sigprocmask(SIG_BLOCK, None)
}

/// Blocks exactly `set` in the calling thread; returns what it blocked before.
fn set_blocked_signals(set: u64) -> u64 {
    sigprocmask(SIG_SETMASK, Some(&set))
}

/// `rt_sigprocmask(how, set, &old, 8)`; returns `old`.
fn sigprocmask(how: i64, set: Option<&u64>) -> u64 {
    let mut old = 0u64;
    let set = set.map_or(core::ptr::null(), |s| s as *const u64);
    // SAFETY: rt_sigprocmask reads an 8-byte set from `set` (null: none) and writes the old
    // one to `old`, both live for the call; the syscall instruction clobbers rcx and r11.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") SYS_RT_SIGPROCMASK => _,
            in("rdi") how,
            in("rsi") set,
            in("rdx") &mut old as *mut u64,
            in("r10") 8,
            out("rcx") _,
            out("r11") _,
            options(nostack),
        );
    }
    old
}

/// A system call without arguments (libc's wrappers are this stub's own names, or touch errno).
fn raw_syscall(nr: i64) -> i64 {
    let ret: i64;
    // SAFETY: getpid, gettid and sched_yield take no arguments and touch no memory of ours;
    // the syscall instruction clobbers rcx and r11.
    unsafe {
        core::arch::asm!("syscall", inlateout("rax") nr => ret, out("rcx") _, out("r11") _, options(nostack));
    }
    ret
}

/// Says on stderr why offload is off (raw `write`: `write` is one of this stub's names).
fn complain(what: &[u8]) {
    for part in [b"corehop-preload-stub: ".as_slice(), what, b"; system-call offload is off\n"] {
        let ret: i64;
        // SAFETY: writes `part`, which lives for the call, to descriptor 2.
        unsafe {
            core::arch::asm!(
                "syscall",
                inlateout("rax") SYS_WRITE => ret,
                in("rdi") 2,
                in("rsi") part.as_ptr(),
                in("rdx") part.len(),
                out("rcx") _,
                out("r11") _,
                options(nostack),
            );
        }
        if ret < 0 {
            return;
        }
    }
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // Nothing here can panic (no indexing past COUNT, no arithmetic that overflows); were it
    // to, ending the process is all a library without unwinding may do.
    // SAFETY: ud2 raises SIGILL; it never returns.
    unsafe { core::arch::asm!("ud2", options(noreturn, nomem, nostack)) }
}
