//! The library's own memory: everything its Rust code allocates comes from pages it maps
//! itself, never from the program's `malloc`.
//!
//! The program's heap is the program's. glibc's `malloc` gives the top of its heap back to the
//! kernel (`brk`) once enough of it is free, and takes it again at the next allocation: where
//! a table of ours sat in that heap decided when the program's heap could shrink. `git add -A`
//! of 3 000 headers made 135 more `brk` calls with the default policy's tables in its heap and
//! ran about 1 % slower (docs/performance.md, "Fifty-sixth session"); a program that reads its
//! own heap (`mallinfo2`, `malloc_stats`) saw our allocations as its own.
//!
//! - Small allocations: the `dlmalloc` crate (Rust's own allocator for wasm) over pages mapped
//!   64 KiB at a time (`Pages`), behind one lock.
//! - Large ones ([`LARGE`] bytes and up: the policy's tables): a mapping each, which the kernel
//!   hands out zeroed and maps on first touch, so a table built zeroed costs only the pages
//!   its keys use (the policy counts on it: `offload::measured`, `offload::predictor`);
//!   unmapped when freed.
//!
//! Every mapping is made with the raw system call, as all of this library's own calls are
//! ([`crate::sys`]). The lock is held across `fork` (`pthread_atfork`, registered before the
//! first allocation), so that a child never starts with it taken by a thread it does not
//! have. Like `malloc`, this is not for signal handlers: the library allocates only at
//! start-up, at the default policy's build and when a service thread starts, none of which
//! runs in a handler, and never in a process with a memory limit, where a failed allocation
//! would abort the program (lib.rs, "Known limits").

use core::alloc::{GlobalAlloc, Layout};
use core::cell::UnsafeCell;
use core::ptr;
use core::sync::atomic::{AtomicU8, Ordering};

use crate::sys;

/// Allocations of this many bytes and more get a mapping of their own: two pages, so that the
/// measured policy's 12 KiB table is mapped on first touch too. The library makes a handful
/// of such allocations in a process, a system call each.
pub const LARGE: usize = 8 << 10;

/// The allocator of the library's Rust code (installed as the global allocator of the
/// shared library, not of its unit tests).
pub struct Heap;

/// dlmalloc's state and the lock that guards it.
struct Small {
    lock: UnsafeCell<libc::pthread_mutex_t>,
    dlmalloc: UnsafeCell<dlmalloc::Dlmalloc<Pages>>,
}

// SAFETY: `dlmalloc` is reached only through `Small::with`, under `lock`; the mutex itself is
// made for sharing between threads.
unsafe impl Sync for Small {}

static SMALL: Small = Small {
    lock: UnsafeCell::new(libc::PTHREAD_MUTEX_INITIALIZER),
    dlmalloc: UnsafeCell::new(dlmalloc::Dlmalloc::new_with_allocator(Pages)),
};

/// Whether the fork handlers are registered: [`UNREGISTERED`], [`REGISTERING`] or
/// [`REGISTERED`].
static FORK_HANDLERS: AtomicU8 = AtomicU8::new(UNREGISTERED);
const UNREGISTERED: u8 = 0;
const REGISTERING: u8 = 1;
const REGISTERED: u8 = 2;

impl Small {
    /// Runs `f` on dlmalloc's state under the lock.
    fn with<R>(&self, f: impl FnOnce(&mut dlmalloc::Dlmalloc<Pages>) -> R) -> R {
        fork_handlers();
        self.lock();
        // SAFETY: the lock is held until `unlock` below, so no other thread reaches the state
        // meanwhile, and `f` cannot allocate through us (dlmalloc maps pages with `Pages`,
        // which does not allocate).
        let out = f(unsafe { &mut *self.dlmalloc.get() });
        self.unlock();
        out
    }

    fn lock(&self) {
        // SAFETY: a valid, initialised mutex that lives for the whole process.
        let ret = unsafe { libc::pthread_mutex_lock(self.lock.get()) };
        debug_assert_eq!(ret, 0);
    }

    fn unlock(&self) {
        // SAFETY: as in `lock`; called only by the thread that locked it (or, in a fork child,
        // for the thread that forked, which the child is).
        let ret = unsafe { libc::pthread_mutex_unlock(self.lock.get()) };
        debug_assert_eq!(ret, 0);
    }
}

/// Registers the fork handlers once, before the first allocation goes on; a thread that comes
/// while another registers waits for it (`pthread_atfork` takes glibc's own memory, not ours).
fn fork_handlers() {
    if FORK_HANDLERS.load(Ordering::Acquire) == REGISTERED {
        return;
    }
    if FORK_HANDLERS.compare_exchange(UNREGISTERED, REGISTERING, Ordering::AcqRel, Ordering::Acquire).is_ok()
    {
        // SAFETY: three plain functions that only lock or unlock the heap's mutex.
        unsafe { libc::pthread_atfork(Some(before_fork), Some(after_fork), Some(after_fork)) };
        FORK_HANDLERS.store(REGISTERED, Ordering::Release);
        return;
    }
    while FORK_HANDLERS.load(Ordering::Acquire) != REGISTERED {
        core::hint::spin_loop();
    }
}

/// Takes the lock before `fork`, so that no thread holds it while the process is copied.
extern "C" fn before_fork() {
    SMALL.lock();
}

/// Gives it back after `fork`, in the parent and in the child (whose only thread is the one
/// that took it).
extern "C" fn after_fork() {
    SMALL.unlock();
}

/// Whether `layout` gets a mapping of its own: the same answer at allocation and at release.
/// A mapping starts on a page, and no Linux page is smaller than 4 KiB.
fn is_large(layout: Layout) -> bool {
    layout.size() >= LARGE && layout.align() <= 4096
}

/// A mapping of its own for a large `layout`, zeroed; null if the kernel refused.
fn map_large(layout: Layout) -> *mut u8 {
    round_to_pages(layout.size()).and_then(|bytes| sys::map_anonymous(bytes, 0)).unwrap_or(ptr::null_mut())
}

fn page_size() -> usize {
    // The aux vector's page size (4 KiB on x86-64, up to 64 KiB on aarch64); no system call.
    // SAFETY: getauxval only reads the process's aux vector.
    match unsafe { libc::getauxval(libc::AT_PAGESZ) } {
        0 => 4096,
        size => size as usize,
    }
}

fn round_to_pages(bytes: usize) -> Option<usize> {
    let page = page_size();
    bytes.checked_add(page - 1).map(|b| b & !(page - 1))
}

/// Resizes a mapping of ours; null if the kernel would not (then the old one stands).
///
/// # Safety
/// `addr..addr + old` is a mapping of ours; if it moves, nothing may use the old addresses.
unsafe fn remap(addr: *mut u8, old: usize, new: usize, may_move: bool) -> *mut u8 {
    let flags = if may_move { libc::MREMAP_MAYMOVE as u64 } else { 0 };
    // SAFETY: the caller's promise.
    let to = unsafe { sys::raw(libc::SYS_mremap, [addr as u64, old as u64, new as u64, flags, 0, 0]) };
    if sys::is_err(to) {
        ptr::null_mut()
    } else {
        to as *mut u8
    }
}

/// Where dlmalloc gets its segments: anonymous mappings of this library's own.
struct Pages;

// SAFETY: every region returned is a fresh mapping of at least the size asked for, and
// regions are released only as dlmalloc asks, with the sizes it was given.
unsafe impl dlmalloc::Allocator for Pages {
    fn alloc(&self, size: usize) -> (*mut u8, usize, u32) {
        match round_to_pages(size).and_then(|bytes| Some((sys::map_anonymous(bytes, 0)?, bytes))) {
            Some((p, bytes)) => (p, bytes, 0),
            None => (ptr::null_mut(), 0, 0),
        }
    }

    fn remap(&self, ptr: *mut u8, oldsize: usize, newsize: usize, can_move: bool) -> *mut u8 {
        // SAFETY: dlmalloc remaps only segments `alloc` gave it, and moves one only when
        // `can_move` says it no longer uses the old addresses.
        unsafe { remap(ptr, oldsize, newsize, can_move) }
    }

    fn free_part(&self, ptr: *mut u8, oldsize: usize, newsize: usize) -> bool {
        // SAFETY: dlmalloc gives back the unused tail of a segment of ours.
        unsafe {
            !remap(ptr, oldsize, newsize, false).is_null() || sys::unmap(ptr.add(newsize), oldsize - newsize)
        }
    }

    fn free(&self, ptr: *mut u8, size: usize) -> bool {
        // SAFETY: dlmalloc gives back a whole segment of ours that it no longer uses.
        unsafe { sys::unmap(ptr, size) }
    }

    fn can_release_part(&self, _flags: u32) -> bool {
        true
    }

    fn allocates_zeros(&self) -> bool {
        true
    }

    fn page_size(&self) -> usize {
        page_size()
    }
}

// SAFETY: small blocks come from dlmalloc under its lock, with the layouts Rust gives; large
// ones are whole mappings of at least their size, page-aligned (so aligned for any layout
// `is_large` admits), zeroed by the kernel, and unmapped with the size their layout names.
// `is_large` depends only on the layout, so a block is released the way it was made.
unsafe impl GlobalAlloc for Heap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if is_large(layout) {
            return map_large(layout);
        }
        // SAFETY: a layout Rust made (non-zero size, power-of-two alignment).
        SMALL.with(|d| unsafe { d.malloc(layout.size(), layout.align()) })
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if is_large(layout) {
            // A fresh mapping is zero already.
            return map_large(layout);
        }
        // SAFETY: as in `alloc`.
        SMALL.with(|d| unsafe { d.calloc(layout.size(), layout.align()) })
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if is_large(layout) {
            let bytes = round_to_pages(layout.size()).expect("mapped with this size");
            // SAFETY: `ptr` is the mapping `alloc` made for this layout, and the caller is done
            // with it.
            unsafe { sys::unmap(ptr, bytes) };
            return;
        }
        // SAFETY: `ptr` came from dlmalloc with this layout.
        SMALL.with(|d| unsafe { d.free(ptr, layout.size(), layout.align()) })
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller promises `new_size`, rounded to the alignment, fits an isize.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (is_large(layout), is_large(new_layout)) {
            (false, false) => {
                // SAFETY: `ptr` came from dlmalloc with `layout`.
                SMALL.with(|d| unsafe { d.realloc(ptr, layout.size(), layout.align(), new_size) })
            }
            (true, true) => {
                let (Some(old), Some(new)) = (round_to_pages(layout.size()), round_to_pages(new_size)) else {
                    return ptr::null_mut();
                };
                if old == new {
                    return ptr;
                }
                // SAFETY: `ptr` is our mapping of `old` bytes; on a move the caller uses only
                // the pointer returned.
                unsafe { remap(ptr, old, new, true) }
            }
            _ => {
                // Across the boundary: a new block, the contents copied, the old one released.
                // SAFETY: `new_layout` is valid (see above).
                let to = unsafe { self.alloc(new_layout) };
                if !to.is_null() {
                    // SAFETY: both blocks hold at least the bytes copied and do not overlap.
                    unsafe {
                        ptr::copy_nonoverlapping(ptr, to, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                }
                to
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(p: *mut u8, n: usize, seed: u8) {
        for i in 0..n {
            // SAFETY: the test owns n bytes at p.
            unsafe { *p.add(i) = seed.wrapping_add(i as u8) };
        }
    }

    fn holds(p: *const u8, n: usize, seed: u8) -> bool {
        // SAFETY: the test owns n bytes at p.
        (0..n).all(|i| unsafe { *p.add(i) } == seed.wrapping_add(i as u8))
    }

    #[test]
    fn blocks_small_and_large_are_aligned_distinct_and_keep_what_is_written() {
        let sizes = [1, 8, 24, 100, 4096, LARGE - 1, LARGE, 3 * LARGE + 5, 1 << 20];
        let aligns = [1, 8, 16, 64, 4096];
        let mut blocks = Vec::new();
        for (k, &size) in sizes.iter().enumerate() {
            for &align in &aligns {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: a valid non-zero layout.
                let p = unsafe { Heap.alloc(layout) };
                assert!(!p.is_null(), "{size} bytes at {align}");
                assert_eq!(p as usize % align, 0, "{size} bytes at {align}");
                fill(p, size, k as u8);
                blocks.push((p, layout, k as u8));
            }
        }
        for &(p, layout, seed) in &blocks {
            assert!(holds(p, layout.size(), seed), "{layout:?} was overwritten");
            // SAFETY: allocated above with this layout.
            unsafe { Heap.dealloc(p, layout) };
        }
    }

    #[test]
    fn zeroed_blocks_are_zero_even_where_freed_memory_is_reused() {
        for size in [64, 1000, LARGE, 2 * LARGE] {
            let layout = Layout::from_size_align(size, 8).unwrap();
            // SAFETY: valid layouts; each block is released once.
            unsafe {
                let dirty = Heap.alloc(layout);
                fill(dirty, size, 7);
                Heap.dealloc(dirty, layout);
                let p = Heap.alloc_zeroed(layout);
                assert!((0..size).all(|i| *p.add(i) == 0), "{size} bytes not zeroed");
                Heap.dealloc(p, layout);
            }
        }
    }

    #[test]
    fn realloc_keeps_the_contents_across_the_large_boundary_both_ways() {
        let mut layout = Layout::from_size_align(100, 16).unwrap();
        // SAFETY: each block is used with the layout it has, and freed once at the end.
        unsafe {
            let mut p = Heap.alloc(layout);
            fill(p, 100, 3);
            for size in [5000, LARGE + 1, 4 * LARGE, 3 * LARGE, 200, 50] {
                p = Heap.realloc(p, layout, size);
                assert!(!p.is_null());
                let kept = layout.size().min(size).min(100);
                assert!(holds(p, kept, 3), "the first {kept} bytes lost at {size}");
                layout = Layout::from_size_align(size, 16).unwrap();
            }
            Heap.dealloc(p, layout);
        }
    }

    #[test]
    fn threads_allocate_at_once_without_sharing_a_block() {
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                std::thread::spawn(move || {
                    let mut live = Vec::new();
                    for i in 0..2000usize {
                        let size = [16, 200, 3000, LARGE + 100][i % 4];
                        let layout = Layout::from_size_align(size, 8).unwrap();
                        // SAFETY: a valid layout; freed below with it.
                        let p = unsafe { Heap.alloc(layout) };
                        fill(p, size, t);
                        live.push((p as usize, layout));
                        if live.len() > 16 {
                            let (p, layout) = live.remove(i % 16);
                            assert!(holds(p as *const u8, layout.size(), t), "another thread wrote here");
                            // SAFETY: allocated above with this layout.
                            unsafe { Heap.dealloc(p as *mut u8, layout) };
                        }
                    }
                    for (p, layout) in live {
                        assert!(holds(p as *const u8, layout.size(), t));
                        // SAFETY: as above.
                        unsafe { Heap.dealloc(p as *mut u8, layout) };
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    /// In a child process of this test (single-threaded, so nothing else moves the heap):
    /// allocations of every size leave the program's `malloc` heap as it was.
    #[test]
    fn nothing_comes_from_the_program_s_heap() {
        // SAFETY: the child only allocates through `Heap`, reads `sbrk` and mallinfo2, and
        // leaves with `_exit`.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let before = unsafe { (libc::sbrk(0) as usize, libc::mallinfo2().uordblks) };
            let mut ok = true;
            for size in [8, 100, 5000, LARGE, 1 << 20] {
                let layout = Layout::from_size_align(size, 8).unwrap();
                let p = unsafe { Heap.alloc_zeroed(layout) };
                ok &= !p.is_null();
                let after = unsafe { (libc::sbrk(0) as usize, libc::mallinfo2().uordblks) };
                ok &= after == before;
            }
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child made above.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the heap moved: {status:#x}");
    }

    /// A thread that allocates all the time while another forks: each child allocates in turn,
    /// which a lock copied while held would hang.
    #[test]
    fn a_child_forked_while_another_thread_allocates_can_allocate() {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let busy = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let layout = Layout::from_size_align(48, 8).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: allocated and released with the same layout.
                    unsafe { Heap.dealloc(Heap.alloc(layout), layout) };
                }
            })
        };
        for _ in 0..50 {
            // SAFETY: the child allocates through `Heap` and leaves with `_exit`.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                let layout = Layout::from_size_align(48, 8).unwrap();
                unsafe {
                    Heap.dealloc(Heap.alloc(layout), layout);
                    libc::_exit(0);
                }
            }
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            let mut status = 0;
            // SAFETY: polls the child made above; kills it if it hangs.
            while unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == 0 {
                if std::time::Instant::now() > deadline {
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    panic!("a forked child hung on the heap's lock");
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        }
        stop.store(true, Ordering::Relaxed);
        busy.join().unwrap();
    }
}
