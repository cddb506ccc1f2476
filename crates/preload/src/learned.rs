//! What the processes of one run hand on to each other: what their run-length predictors
//! learned of call kinds ([`Learned`]), so that a short process does not lose its first calls
//! to a cold start.
//!
//! `corehop run`, when it waits for the program, makes an unnamed file for the run and names
//! it in `COREHOP_LEARNED` (as `/proc/PID/fd/N`, open while corehop waits). A process reads it
//! when it builds a policy with a timed predictor, and writes what it learned at exit. Each
//! access holds the file's lock (`flock`), taken without waiting: a process that finds it busy
//! starts fresh or hands nothing on. What a process reads is checked (a header, a checksum,
//! then [`Learned::from_words`]), so a file of another build's layout or a write cut short is
//! ignored, never trusted.

use core::ffi::CStr;

use corehop_policy::offload::{Learned, LEARNED_WORDS};

use crate::sys;

/// The file's first word.
const MAGIC: u32 = u32::from_le_bytes(*b"lrnd");
const HEADER: usize = 3;
const FILE_BYTES: usize = 4 * (HEADER + LEARNED_WORDS);

/// FNV-1a over the words' bytes: tells a whole write from a torn or foreign one.
fn checksum(words: &[u32]) -> u32 {
    words
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .fold(0x811c_9dc5, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

/// What the run's processes learned, if the file holds it.
pub fn read(path: &CStr) -> Option<Learned> {
    let mut bytes = [0u8; FILE_BYTES];
    let got =
        sys::with_locked_file(path, libc::O_RDONLY, libc::LOCK_SH, |fd| sys::read_start(fd, &mut bytes))?;
    if got != FILE_BYTES as i64 {
        return None;
    }
    let mut words = [0u32; HEADER + LEARNED_WORDS];
    for (word, b) in words.iter_mut().zip(bytes.chunks_exact(4)) {
        *word = u32::from_le_bytes(b.try_into().expect("four bytes"));
    }
    let (header, learned) = words.split_at(HEADER);
    (header == [MAGIC, LEARNED_WORDS as u32, checksum(learned)])
        .then(|| Learned::from_words(learned))
        .flatten()
}

/// Hands on what this process learned.
pub fn write(path: &CStr, learned: &Learned) {
    let header = [MAGIC, LEARNED_WORDS as u32, checksum(learned.words())];
    let mut bytes = [0u8; FILE_BYTES];
    for (b, word) in bytes.chunks_exact_mut(4).zip(header.iter().chain(learned.words())) {
        b.copy_from_slice(&word.to_le_bytes());
    }
    sys::with_locked_file(path, libc::O_WRONLY, libc::LOCK_EX, |fd| sys::write_start(fd, &bytes));
}

#[cfg(test)]
mod tests {
    use super::*;
    use corehop_policy::offload::{CallDesc, CallKind, RunLengthPredictor, TableForm};
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;

    fn learned_above(run: u64) -> Learned {
        let mut p = RunLengthPredictor::new(TableForm::TIMED).unwrap();
        for _ in 0..20 {
            p.observe_call(&CallDesc::new(CallKind::Fstat, 3, 0, 1), run, 1_000);
        }
        p.learned().unwrap()
    }

    fn c_path(path: &std::path::Path) -> CString {
        CString::new(path.as_os_str().as_bytes()).unwrap()
    }

    #[test]
    fn what_one_process_writes_the_next_reads_and_damage_is_ignored() {
        let dir = std::env::temp_dir().join(format!("corehop-learned-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("learned");
        std::fs::write(&file, b"").unwrap();
        let path = c_path(&file);
        assert_eq!(read(&path), None, "an empty file holds nothing");
        let learned = learned_above(5_000);
        write(&path, &learned);
        assert_eq!(read(&path), Some(learned.clone()));
        // A later process's write replaces it.
        let later = learned_above(200);
        write(&path, &later);
        assert_eq!(read(&path), Some(later));
        // A flipped bit fails the checksum.
        let mut bytes = std::fs::read(&file).unwrap();
        bytes[HEADER * 4 + 40] ^= 1;
        std::fs::write(&file, &bytes).unwrap();
        assert_eq!(read(&path), None);
        // Cut short.
        std::fs::write(&file, &bytes[..100]).unwrap();
        assert_eq!(read(&path), None);
        // Not a regular file, or not there: nothing read, nothing written.
        assert_eq!(read(&c_path(&dir)), None);
        write(&c_path(&dir.join("missing")), &learned);
        assert!(!dir.join("missing").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_another_process_holds_is_left_alone() {
        let file = std::env::temp_dir().join(format!("corehop-learned-lock-{}", std::process::id()));
        std::fs::write(&file, b"").unwrap();
        let path = c_path(&file);
        let learned = learned_above(5_000);
        write(&path, &learned);
        let held = sys::with_locked_file(&path, libc::O_RDONLY, libc::LOCK_EX, |_| {
            assert_eq!(read(&path), None, "a writer holds it: start fresh rather than wait");
            write(&path, &learned_above(200));
        });
        assert!(held.is_some());
        assert_eq!(read(&path), Some(learned), "the blocked write was dropped");
        std::fs::remove_file(&file).unwrap();
    }
}
