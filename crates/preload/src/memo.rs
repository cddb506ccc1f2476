//! Descriptors a service thread refused because they could block (pipes, sockets, terminals):
//! their later calls stay with the caller at once, without a round trip to be refused again.
//!
//! A stale entry only keeps calls local, which is always correct, so entries are cleared when
//! an intercepted `open` returns that number and otherwise kept. Descriptors past
//! [`TRACKED`] are not remembered.

use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

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
        word.fetch_or(bit, Relaxed);
    }
}

/// Forgets `fd` (it now names a newly opened file).
pub fn clear(fd: i32) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
        clear(70);
    }
}
