//! What the corehop runtime, its `LD_PRELOAD` library and its command share, kept in one small
//! crate so that the preload library links nothing of the runtime (no worker threads, no
//! thread-local destructors) and the two sides of the preload protocol cannot drift apart:
//!
//! - [`raw`]: the system-call instruction itself, with the kernel's raw result (`-errno`),
//!   so no caller ever reads a thread-local `errno` (a task that hops may be on another
//!   thread by then, and inside an `LD_PRELOAD` library libc's own wrappers are ours);
//! - [`futex`]: process-private futex wait and wake on top of it;
//! - [`park`]: the one park/wake protocol every sleeping thread of corehop uses, on a futex
//!   word (loom-checked; [`model`] holds the primitives it and `handoff` are checked with);
//! - [`handoff`]: request slots between calling threads and a service thread, a request line
//!   and a completion line each (the preload library's service threads and the runtime's
//!   service cores both hand off through it);
//! - [`wire`]: the preload library's settings (environment variables) and the one-line
//!   summary it appends at exit, written by the library and parsed by `corehop run`;
//! - [`watch`]: the calls the preload library watches without moving them, `trampoline`
//!   (x86-64): the register-preserving way into a libc function, and [`stub_state`]: the
//!   loom-checked state word of the library's `no_std` start-up stub, and [`next_symbol`]:
//!   the stub's way to libc's functions without `dlsym` (all four shared by path with the
//!   stub);
//! - [`hidden_env`]: corehop's variables, hidden from the program and given back to the
//!   programs it starts (shared by path with the stub too), and [`lifetimes`]: which
//!   programs end before the stub could do anything for them, so are started plainly;
//! - `testing` (feature `testing`): the checks every lane built on `handoff` must pass.
//!
//! Only `raw`, `futex`, `model`, `handoff`, `hidden_env` and `next_symbol` contain `unsafe`; each block carries
//! its argument.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod futex;
pub mod handoff;
#[cfg(target_os = "linux")]
pub mod hidden_env;
pub mod lifetimes;
pub mod model;
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
pub mod next_symbol;
pub mod park;
pub mod raw;
pub mod stub_state;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(target_arch = "x86_64")]
pub mod trampoline;
pub mod watch;
pub mod wire;
