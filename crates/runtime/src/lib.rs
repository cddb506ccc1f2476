//! The live corehop runtime on Linux: pinned workers, stackful tasks that hop between CPUs.
//!
//! A [`Runtime`] runs one worker thread pinned to each chosen CPU. Work runs as *tasks*:
//! stackful fibers that can move to another CPU in the middle of a function and come back,
//! with everything on their stack intact.
//!
//! ```
//! use corehop_runtime::{current_cpu, hop, on, Runtime, Wake};
//! let rt = Runtime::builder().wake(Wake::Park).build().unwrap();
//! let (a, b) = (rt.cpus()[0], *rt.cpus().last().unwrap());
//! let answer = rt
//!     .block_on(a, move || {
//!         let local = [1u64, 2, 3];
//!         // SAFETY: nothing here is tied to a's thread: `local` lives on the task's stack.
//!         unsafe { hop(b) }.unwrap(); // now running on b's worker, same stack
//!         assert_eq!(current_cpu(), b);
//!         let there = on(a, current_cpu).unwrap(); // delegate a call to a, come back to b
//!         (local.iter().sum::<u64>(), there)
//!     })
//!     .unwrap();
//! assert_eq!(answer, (6, a));
//! ```
//!
//! # Map of the crate
//! - [`sys`]: the OS facade (pinning, gettid, futex, raw syscalls with explicit errno, TSC).
//! - `runtime`: [`Builder`], [`Runtime`], workers, [`JoinHandle`], shutdown protocol.
//! - `task`: what a task can do: [`hop`], [`on`], [`hop_any`], [`current_cpu`],
//!   [`no_hop_zone`], and the hop hazards with what corehop decided about each.
//! - [`submit`](mod@submit): asynchronous, batched delegation: [`submit`](fn@submit),
//!   [`submit_batch`], [`Pending`] (a `Future` too), served by each worker between its tasks.
//! - `fiber`: the stack switch (our own on x86-64, corosensei's elsewhere) and the one unsafe
//!   step, sending a suspended fiber to another thread, with its soundness argument. `mailbox`: the lock-free hand-off and park/unpark protocol
//!   (model-checked with loom). `context`: per-thread state behind non-inlinable accessors.
//!   `overflow`: a task that runs off its stack is reported as such, not as a bare segfault.
//! - [`service`], [`objects`], [`components`], [`smt`]: the subsystems built on hops.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod context;
mod error;
mod fiber;
mod mailbox;
mod overflow;
mod runtime;
pub mod submit;
mod sync;
pub mod sys;
mod task;
mod worker;

pub use corehop_policy::pick::{Candidate, Pick, PickState};
pub use corehop_topology::{CpuId, OsCpu};
pub use error::{Error, JoinError};
pub use runtime::{
    Builder, JoinHandle, Mechanism, Runtime, Wake, DEFAULT_STACK_SIZE, MAX_STACK_SIZE, MIN_STACK_SIZE,
};
pub use submit::{submit, submit_batch, Pending, PendingBatch, MAX_BLOCK_OPS};
pub use task::{
    current_cpu, hop, hop_any, in_task, no_hop_zone, on, others_waiting, spawn_on, try_current_cpu,
    yield_now, NoHopZone,
};

// Subsystems built on hops: system-call offload, O² objects, components, SMT modes.
pub mod components;
pub mod objects;
pub mod service;
pub mod smt;
