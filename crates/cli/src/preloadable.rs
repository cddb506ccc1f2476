//! Whether the dynamic loader would preload a library into a program: not into a statically
//! linked executable (no `PT_INTERP`: no loader runs), nor into one whose exec changes its
//! credentials (set-user-ID or set-group-ID: the loader drops `LD_PRELOAD`). Such a program
//! under `corehop run --offload` would only see corehop's variables, which it would not see
//! plainly, so it starts with its plain environment.
//!
//! Two ELF headers are all this reads; an ELF crate would bring a parser of everything else.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// `PT_INTERP`: the segment naming the program's dynamic loader.
const PT_INTERP: u32 = 3;
/// Program headers read at most (ELF's `e_phnum` is 16 bits; real executables have about 15).
const MAX_HEADERS: usize = 256;

/// Whether an exec of `path` runs the dynamic loader with `LD_PRELOAD` honoured. `true` for
/// anything this cannot tell (a script, an unreadable file): the loader of what runs it
/// decides, as before.
pub fn preloads(path: &Path) -> bool {
    let Ok(meta) = std::fs::metadata(path) else { return true };
    // SAFETY (both): plain getters of this process's effective ids.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if (meta.mode() & libc::S_ISUID != 0 && meta.uid() != euid)
        || (meta.mode() & libc::S_ISGID != 0 && meta.gid() != egid)
    {
        return false;
    }
    let Ok(mut file) = std::fs::File::open(path) else { return true };
    // Linkers put the program headers right after the ELF header; an image whose headers lie
    // past the first page is one this cannot tell.
    let mut head = Vec::with_capacity(4096);
    if file.by_ref().take(4096).read_to_end(&mut head).is_err() {
        return true;
    }
    has_interpreter(&head).unwrap_or(true)
}

/// Whether the ELF image starting with `head` has a `PT_INTERP` header; `None` if `head` is not
/// an executable ELF image whose program headers it holds.
fn has_interpreter(head: &[u8]) -> Option<bool> {
    if head.get(..4)? != b"\x7fELF" {
        return None;
    }
    let wide = match head.get(4)? {
        1 => false,
        2 => true,
        _ => return None,
    };
    let little = match head.get(5)? {
        1 => true,
        2 => false,
        _ => return None,
    };
    let word = |at: usize, bytes: usize| -> Option<u64> {
        let b = head.get(at..at.checked_add(bytes)?)?;
        Some(b.iter().enumerate().fold(0u64, |v, (i, &x)| {
            let shift = if little { 8 * i } else { 8 * (bytes - 1 - i) };
            v | (u64::from(x) << shift)
        }))
    };
    // e_type: ET_EXEC (2) or ET_DYN (3, a PIE, or a shared object run as a program).
    if !matches!(word(16, 2)?, 2 | 3) {
        return None;
    }
    let (phoff, phentsize, phnum) = if wide {
        (word(32, 8)?, word(54, 2)?, word(56, 2)?)
    } else {
        (word(28, 4)?, word(42, 2)?, word(44, 2)?)
    };
    let (phoff, phentsize) = (usize::try_from(phoff).ok()?, usize::try_from(phentsize).ok()?);
    if phentsize < 4 {
        return None;
    }
    let mut found = false;
    for i in 0..usize::try_from(phnum).ok()?.min(MAX_HEADERS) {
        found |= word(phoff.checked_add(i.checked_mul(phentsize)?)?, 4)? == u64::from(PT_INTERP);
    }
    Some(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_and_sh_load_a_library_a_static_image_does_not() {
        assert!(preloads(&std::env::current_exe().unwrap()));
        assert!(preloads(Path::new("/bin/sh")));
        // A 64-bit little-endian executable with one header, a PT_LOAD, and then a PT_INTERP.
        let mut image = vec![0u8; 64 + 2 * 56];
        image[..6].copy_from_slice(b"\x7fELF\x02\x01");
        image[16] = 2;
        image[32] = 64; // e_phoff
        image[54] = 56; // e_phentsize
        image[56] = 1; // e_phnum
        image[64] = 1; // PT_LOAD
        image[64 + 56] = 3; // PT_INTERP, past e_phnum
        assert_eq!(has_interpreter(&image), Some(false));
        image[56] = 2;
        assert_eq!(has_interpreter(&image), Some(true));
        // Cut short, not ELF, or headers out of the image: cannot tell.
        assert_eq!(has_interpreter(&image[..100]), None);
        assert_eq!(has_interpreter(b"#!/bin/sh\n"), None);
        image[32] = 255;
        assert_eq!(has_interpreter(&image), None);
    }
}
