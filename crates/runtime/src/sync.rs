//! The atomics of the runtime's hand-off protocols, behind a `loom` facade: under `--cfg loom`
//! they come from `loom` so that `mailbox`'s and `submit`'s hand-offs can be model-checked;
//! otherwise from `std`. Sleeping and waking go through `corehop_sys::park`, whose primitives
//! follow the same switch.

/// `UnsafeCell` with loom's closure API (loom's own under `--cfg loom`).
pub(crate) use corehop_sys::model::UnsafeCell;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};

/// Runs the loom model `f` with at most `bound` preemptions per interleaving: a model with
/// three threads and a futex explodes the state space otherwise (tokio bounds its larger
/// models the same way).
#[cfg(all(test, loom))]
pub(crate) fn model_bounded(bound: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(bound);
    model.check(f);
}
