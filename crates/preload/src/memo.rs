//! What the library remembers per descriptor number, so that a call need not ask the kernel
//! again what its descriptor is.
//!
//! - Descriptors a service thread refused because they could block (pipes, sockets,
//!   terminals): their later calls stay with the caller at once, without a round trip to be
//!   refused again. A stale entry only keeps calls local, which is always correct; entries
//!   are cleared when the library sees the number closed or reassigned (below) or returned by
//!   an `open`.
//! - Descriptors on which positioned calls (`pread`, `pwrite`) cannot block: a regular file on
//!   a file system that answers from memory or disk, or a block device. A service thread checks
//!   such a descriptor once ([`Positioned`]) instead of before every call. Each number has a
//!   generation, advanced whenever the library sees the number closed or reassigned (`close`,
//!   `dup2`, `dup3`, `close_range`, the same through `syscall`, and an `open` that returns
//!   it), and a check counts only for the generation it started in. A number closed behind the
//!   library's back (glibc's own `fclose` and `closefrom`, inline assembly, io_uring) keeps its
//!   entry; a positioned call on a pipe, socket or terminal fails at once with ESPIPE, so that
//!   is harmless unless the number now names a file on FUSE or tracefs.
//!
//! Descriptors past [`TRACKED`] are not remembered.

use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};

/// Descriptors 0..TRACKED are remembered.
pub const TRACKED: usize = 1024;

static BLOCKING: [AtomicU64; TRACKED / 64] = [const { AtomicU64::new(0) }; TRACKED / 64];

fn slot(fd: i32) -> Option<(&'static AtomicU64, u64)> {
    let fd = usize::try_from(fd).ok().filter(|&fd| fd < TRACKED)?;
    Some((&BLOCKING[fd / 64], 1 << (fd % 64)))
}

/// Remembers that `fd` may block.
pub fn mark(fd: i32) {
    if let Some((word, bit)) = slot(fd) {
        arm();
        word.fetch_or(bit, Relaxed);
    }
}

/// Forgets that `fd` may block.
fn clear(fd: i32) {
    if let Some((word, bit)) = slot(fd) {
        if word.load(Relaxed) & bit != 0 {
            word.fetch_and(!bit, Relaxed);
        }
    }
}

/// Whether `fd` was seen to block.
pub fn may_block(fd: i32) -> bool {
    slot(fd).is_some_and(|(word, bit)| word.load(Relaxed) & bit != 0)
}

/// Set once anything is recorded here: a descriptor marked, or a service thread about to start
/// (which records checks). Kept by a fork child, which inherits the records. Until then a
/// close has nothing to forget and touches none of it.
static ARMED: AtomicBool = AtomicBool::new(false);

/// Something is about to be recorded: closes must forget from now on.
pub fn arm() {
    if !ARMED.load(SeqCst) {
        ARMED.store(true, SeqCst);
    }
}

/// Per descriptor: its generation, advanced at each close or reassignment seen.
static GENERATION: [AtomicU32; TRACKED] = [const { AtomicU32::new(0) }; TRACKED];
/// Per descriptor: 1 + the generation in which positioned calls on it were found not to block
/// (0: never). A check that began in an older generation writes a value that matches none.
static SAFE_IN: [AtomicU32; TRACKED] = [const { AtomicU32::new(0) }; TRACKED];

/// What is known of positioned calls on a descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Positioned {
    /// They cannot block; no check is needed.
    Safe,
    /// Not known: check, and [`remember_positioned_safe`] with this generation if they cannot.
    Unknown(u32),
    /// Past [`TRACKED`]: check every time.
    Untracked,
}

fn index(fd: i32) -> Option<usize> {
    usize::try_from(fd).ok().filter(|&fd| fd < TRACKED)
}

/// What is known of positioned calls on `fd`.
pub fn positioned(fd: i32) -> Positioned {
    let Some(fd) = index(fd) else { return Positioned::Untracked };
    let generation = GENERATION[fd].load(SeqCst);
    if SAFE_IN[fd].load(SeqCst) == generation.wrapping_add(1) {
        Positioned::Safe
    } else {
        Positioned::Unknown(generation)
    }
}

/// Records that positioned calls on `fd` cannot block, as found by a check that began when
/// [`positioned`] returned `generation`: if `fd` was closed or reassigned since, the record
/// names a generation that has passed and never matches.
pub fn remember_positioned_safe(fd: i32, generation: u32) {
    if let Some(fd) = index(fd) {
        SAFE_IN[fd].store(generation.wrapping_add(1), SeqCst);
    }
}

/// `fd` is being closed or given another file: what was known of it no longer holds. Called
/// before the call that does it and again after, so that a check that ran in between (on the
/// old file) does not count for the new one.
pub fn reassigned(fd: i32) {
    if !ARMED.load(SeqCst) {
        return;
    }
    if let Some(index) = index(fd) {
        GENERATION[index].fetch_add(1, SeqCst);
        clear(fd);
    }
}

/// [`reassigned`] for every descriptor from `first` to `last` (inclusive).
pub fn reassigned_range(first: u32, last: u32) {
    if !ARMED.load(SeqCst) {
        return;
    }
    let end = last.min(TRACKED as u32 - 1);
    for fd in first..=end {
        reassigned(fd as i32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_positioned_check_counts_only_for_the_file_it_checked() {
        arm();
        let Positioned::Unknown(generation) = positioned(9) else { panic!("fresh") };
        remember_positioned_safe(9, generation);
        assert_eq!(positioned(9), Positioned::Safe);
        reassigned(9);
        let Positioned::Unknown(generation) = positioned(9) else { panic!("closed") };
        // A check that began before a close (on the old file) ends after it: not recorded.
        reassigned(9);
        remember_positioned_safe(9, generation);
        assert!(matches!(positioned(9), Positioned::Unknown(_)));
        reassigned_range(8, 10);
        assert!(matches!(positioned(10), Positioned::Unknown(_)));
        assert_eq!(positioned(-1), Positioned::Untracked);
        assert_eq!(positioned(TRACKED as i32), Positioned::Untracked);
        reassigned_range(TRACKED as u32 - 1, u32::MAX);
    }

    #[test]
    fn marks_and_clears_only_tracked_descriptors() {
        assert!(!may_block(5));
        mark(5);
        mark(70);
        mark(-1);
        mark(TRACKED as i32);
        assert!(may_block(5) && may_block(70));
        assert!(!may_block(6) && !may_block(-1) && !may_block(TRACKED as i32));
        clear(5);
        assert!(!may_block(5) && may_block(70));
        // A close forgets the mark: the number may name a regular file next.
        reassigned(70);
        assert!(!may_block(70));
    }
}
