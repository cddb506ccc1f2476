//! LD_PRELOAD system-call offload for unmodified programs.
//!
//! `corehop run --offload -- CMD` loads this library into CMD (and every program CMD starts:
//! `LD_PRELOAD` travels with the environment through `exec`, out of each program's sight:
//! `hidden`). It interposes the calls the
//! papers move to an OS core (fast-core-switching §3.6: read, write, pread/pwrite, readv/writev,
//! open/openat, the stat family, fsync, fdatasync, sendfile, sendto/recvfrom, poll, select) and,
//! when the policy says so, hands each one to a **service thread** pinned on a service CPU,
//! which runs it with the raw `syscall` instruction and hands back the raw result. The caller
//! sets errno from it. Results never change: return value, errno, partial reads and EINTR are
//! those of the same call made locally.
//!
//! # A call's path
//!
//! ```text
//!  program thread (app CPU)                       service thread (service CPU)
//!  read(fd, buf, n) ─▶ interpose::read
//!     ├─ policy keeps all local, no summary or trace, not one of the 1/16 timed
//!     │    (intercept::passes_by: a few loads, no thread-local) ─▶ real libc read
//!     ├─ not started / nested / signal handler ─▶ real libc read
//!     ├─ decide::Shared::try_with(decide) says local ─▶ real libc read
//!     │    (on x86-64 the entry point jumps to it once the library's frames are gone, so
//!     │    libc returns straight to the program; only a timed call runs under them)
//!     └─ Lane::call: slot FREE→FILLING→SUBMITTED ─────▶ claim SUBMITTED→CLAIMED
//!        spin, then futex wait                          must it stay with the caller?
//!                                                         yes ─▶ reply "refused"
//!                                                         no  ─▶ raw syscall, time it
//!        ◀──────────────────────────── DONE + reply ◀──
//!     ├─ refused ─▶ real libc read (caller thread)
//!     ├─ stall: still SUBMITTED after the timeout ─▶ CAS SUBMITTED→CANCELLED ─▶ real libc read
//!     └─ errno ← reply; re-raise SIGPIPE/SIGXFSZ at the caller if the call raised one
//! ```
//!
//! The slot protocol is in [`lane`]; what a service thread refuses (calls that could block
//! until a signal to the *caller* ends them — pipe, socket and terminal I/O without
//! O_NONBLOCK, opening a FIFO, poll/select with a timeout — and calls naming the calling
//! thread, `/proc/thread-self`) is in [`service`].
//!
//! # Rules this library keeps
//!
//! - **Its own I/O is raw** ([`sys`]): inside the process our wrappers *are* `read`, `write`,
//!   `open`, so calling them would recurse. The summary at exit is written with raw syscalls.
//! - **No wait for the loader's lock on a program's call**: a thread running a library's
//!   constructor (inside `dlopen`) holds it, maybe while it joins the thread making the call.
//!   Names are looked up in the objects' tables (`corehop_sys::next_symbol`; `dlsym` only
//!   where they cannot answer, as for an IFUNC), and the start-up stub runs its `dlopen` of this library on a thread of its own
//!   (except where a sanitizer is loaded).
//! - **No allocation on the interposed path** after start-up: slots live in static memory,
//!   counters are static atomics, the policy is allocated once (the default one at the first
//!   sampled call after its first epoch, which a short process never reaches).
//! - **Its memory is its own** ([`heap`]): what the library allocates comes from pages it maps,
//!   not from the program's `malloc`, so the program's heap grows, shrinks and reads
//!   (`mallinfo2`) as it does plainly. glibc's own part stays in that heap: the loader's record
//!   of the library when the start-up stub loads it, and a few hundred bytes of thread-local
//!   bookkeeping for each service thread.
//! - **Re-entry runs locally**: a per-thread flag marks "inside the library"; a nested call (a
//!   signal handler calling `write` while its thread waits for a reply) runs on the caller.
//! - **Thread-bound calls stay**: nothing that depends on the calling thread is offloaded
//!   (gettid, signal masks, credentials, prctl); `/proc/thread-self` by any name, any file on
//!   /proc, and anonymous inodes (a signalfd) stay local, as do regular files whose reads may
//!   wait (tracefs, debugfs, FUSE).
//! - **Same credentials**: glibc's set*id calls reach the service threads (they leave
//!   SIGSETXID open). A call that changes one thread's security state alone (a raw
//!   `syscall(SYS_setresuid)`, `setfsuid`, `capset`, a per-thread seccomp filter or
//!   no_new_privs, Landlock, `unshare`, `setns`, a `clone` of a thread without the process's
//!   directory or descriptors) turns offload off for the whole process
//!   (`intercept::thread_state_changes`), and the service threads are off the kernel's thread
//!   list before the call is made (a new user namespace needs a process of one thread). A
//!   moved call runs with its caller's memory protection-key rights.
//! - **fork**: a `pthread_atfork` child handler forgets the parent's service threads, slots and
//!   counters; the child starts its own service threads at its first offloaded call. A `vfork`
//!   child, or any other child sharing our memory, is recognised by its pid and runs
//!   everything locally. The pid check is a system call, so it is made only once the process
//!   may have such a child: the library interposes `vfork`, `clone`, `_Fork` and the raw
//!   `syscall` forms, and notes each before the child exists (`intercept::CHECK_PID`).
//! - **Stalls**: a request not claimed within `COREHOP_STALL_TIMEOUT_NS` is withdrawn and run
//!   by the caller; a claimed request is always waited for, so no call runs twice.
//! - **Signals wait for the call**: plainly a handler runs once a call to a regular file has
//!   returned (such a call does not stop for one), so while a call is away its thread holds
//!   back the signals the program has handlers for, and takes them once no frame of the
//!   library's holds anything: a handler that leaves with `siglongjmp` finds the call done, as
//!   it does plainly, and nothing written into the program's memory after it ([`caught`]).
//!   Signals without a handler are not held: one that ends the process ends it at once. A
//!   program without handlers pays nothing for this; one with them, two system calls a move
//!   (about 0.3 µs here), which the policy counts.
//! - **Cancellation**: glibc cancels a thread by unwinding its stack, with an unwinder of its
//!   own (libgcc_s), and this library carries another (`build.rs`), which aborts at a frame of
//!   ours with anything to clean up. So every call that stays is made by its entry point once
//!   our frames are gone, and a pending cancellation is acted on, at a cancellation point of
//!   libc's, in the entry point's first frame, which holds nothing
//!   (`intercept::act_on_a_pending_cancellation`).
//!
//! # Known limits
//!
//! Calls glibc makes internally (stdio's `fread`/`fwrite`, `fopen`) use libc-private entry
//! points and are not seen. A thread that changes its own credentials, filters or namespaces
//! with inline-assembly system calls (not through libc's `syscall`, `prctl` or wrappers) is not
//! seen either: its offloaded calls would run with the service thread's state. Nor is a child
//! sharing our memory that a program starts with an inline-assembly `clone` or `vfork` and
//! that then calls libc: its offloaded calls would run in the parent. The program
//! has one more thread per service CPU; it does not keep the process alive (an idle service
//! thread ends a process whose program threads have all left, with the main thread's status,
//! running `atexit` handlers as glibc does after a last `pthread_exit`, also when the last
//! thread left with a raw `exit`, where a plain run would skip them). Start-up (at the first
//! intercepted call), the default policy's build (at a sampled call after 20 ms) and a
//! service thread's start allocate; the policy, once built, does not. The last two wait for a
//! call that does not look like a signal handler's: a call that blocks signals its thread did
//! not block at the first call this library looked at on it (for the process's first thread,
//! at the process's first call: `corehop_sys::stub_state::outside_a_handler`); the start-up
//! stub (`crates/preload-stub`) loads this library only from such a call of that first thread,
//! or, after a while, from another thread. A thread whose first call came from a handler, a
//! handler that blocks nothing more (`SA_NODEFER` with an empty `sa_mask`), and a thread's
//! first access to this library's thread-locals (from `malloc`, once `dlopen`ed) made in a
//! handler are not told apart. Asynchronous thread cancellation while a call is away is not
//! supported (the service thread may still write into the abandoned buffer). A process that ends by a signal
//! or a raw exit system call writes no summary (one that ends with `_exit` writes it there, as
//! `exit` would: not through the start-up stub, of which no summary or trace is asked). A
//! descriptor on which positioned calls (`pread`, `pwrite`) were found safe is checked again
//! only once the library sees its number closed or reassigned ([`memo`]): a number closed
//! behind its back (inline assembly, io_uring, glibc's own `fclose`) and reused for a file on
//! FUSE or tracefs would have its positioned calls go across unchecked.
//!
//! A process with a finite address-space or data limit (`RLIMIT_AS`, `RLIMIT_DATA`: `ulimit -v`,
//! `ulimit -d`), found at its first intercepted call or about to be set by its own
//! `setrlimit`, `prlimit` or raw `syscall` form of them, runs without offload for good, and the
//! library allocates nothing more in it (`intercept::memory_limit_comes`; the start-up stub
//! stays on libc): under such a limit the room is the program's, the library cannot know what
//! its own later allocations would find, and a failed Rust allocation aborts the program. Its
//! image still takes room, so a program that only just fits plainly may fail there as it
//! would plainly under a lower limit; it writes no summary. A limit set by another process
//! (`prlimit` of our pid) or with inline assembly is not seen.
//!
//! Configuration: environment variables, see [`config`]. Summary format: see [`stats`].
#![deny(unsafe_op_in_unsafe_fn)]
// Unit tests build without the exported entry points, so the path behind them looks unused.
#![cfg_attr(test, allow(dead_code))]

#[cfg(not(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))))]
compile_error!("corehop-preload supports Linux on x86-64 and aarch64 only");

pub mod caught;
#[cfg(all(target_arch = "x86_64", not(any(test, loom))))]
mod children;
pub mod config;
pub mod decide;
#[cfg(not(loom))]
pub mod heap;
#[cfg(not(loom))]
mod hidden;
#[cfg(not(loom))]
mod intercept;
#[cfg(not(any(test, loom)))] // a test binary must not interpose its own libc calls
mod interpose;
pub mod lane;
pub mod learned;
pub mod memo;
#[cfg(not(loom))]
pub mod service;
pub mod stats;
pub mod sys;
pub mod trace;

/// Everything the library allocates comes from its own pages, not the program's heap.
#[cfg(not(any(test, loom)))]
#[global_allocator]
static HEAP: heap::Heap = heap::Heap;
