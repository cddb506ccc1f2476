//! The default offload policy allocates nothing once built. The preload library decides, learns
//! and ends epochs inside the program's own calls, some of them made from signal handlers,
//! where allocating or freeing could meet a heap that the interrupted code was changing (a
//! program whose handler writes while its main thread allocates crashed that way).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use corehop_policy::offload::{CallCost, CallDesc, CallKind, Decision, OffloadPolicy};

/// The system allocator, counting the calls made on a thread while it says so.
struct Counting;

thread_local! {
    // Const and without destructors: reading them allocates nothing.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static CALLS: Cell<u64> = const { Cell::new(0) };
}

fn note() {
    if COUNTING.with(Cell::get) {
        CALLS.with(|n| n.set(n.get() + 1));
    }
}

// SAFETY: every method forwards to `System` with the caller's own arguments, so `System`'s
// contract is the caller's; counting touches only this thread's cells.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: as above.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note();
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn the_default_policy_decides_learns_and_samples_without_allocating() {
    let mut policy: OffloadPolicy = "adaptive".parse().unwrap();
    COUNTING.with(|c| c.set(true));
    let (mut time, mut epoch_start, mut calls, mut epoch_calls) = (0u64, 0u64, 0u64, 0u64);
    // Phases in which moving pays, then costs, then pays: rounds, trials, switches and
    // switches taken back all happen.
    for phase in 0..6u64 {
        let end = time + 2_000_000_000;
        while time < end {
            let call = CallDesc::new(
                [CallKind::Fstat, CallKind::Read, CallKind::Fsync][(calls % 3) as usize],
                3,
                4096 * (calls % 4),
                calls % 7,
            );
            let moved = policy.decide(&call, 0) == Decision::Offload;
            let caller = match (moved, phase % 2) {
                (false, _) => 20_000,
                (true, 0) => 12_000,
                (true, _) => 40_000,
            };
            let cost = if moved { CallCost::moved(18_000, caller) } else { CallCost::local(caller) };
            policy.observe(&call, cost);
            (time, calls) = (time + caller, calls + 1);
            if policy.epoch_over(time - epoch_start, calls - epoch_calls, 20_000_000) {
                policy.epoch_end((calls - epoch_calls) as f64, time - epoch_start);
                (epoch_start, epoch_calls) = (time, calls);
            }
        }
    }
    COUNTING.with(|c| c.set(false));
    let OffloadPolicy::Adaptive(adaptive) = &policy else { unreachable!() };
    let (rounds, _) = adaptive.sampler().rounds();
    assert!(rounds > 10, "only {rounds} rounds: the test did not exercise the sampler");
    assert_eq!(CALLS.with(Cell::get), 0, "the policy allocated or freed after it was built");
}
