//! System calls described as plain values, and the predictor key (the paper's AState).

use serde::{Deserialize, Serialize};

/// Which system call. The named kinds are the calls the papers switch cores on
/// (fast-core-switching §3.6) plus the stat family; anything else is `Other(number)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CallKind {
    /// `read(2)`
    Read,
    /// `write(2)`
    Write,
    /// `pread64(2)`
    Pread,
    /// `pwrite64(2)`
    Pwrite,
    /// `readv(2)`
    Readv,
    /// `writev(2)`
    Writev,
    /// `open(2)`
    Open,
    /// `openat(2)`
    Openat,
    /// `stat(2)`
    Stat,
    /// `fstat(2)`
    Fstat,
    /// `lstat(2)`
    Lstat,
    /// `newfstatat(2) (fstatat)`
    Newfstatat,
    /// `fsync(2)`
    Fsync,
    /// `fdatasync(2)`
    Fdatasync,
    /// `sendfile(2)`
    Sendfile,
    /// `sendto(2)`
    Sendto,
    /// `recvfrom(2)`
    Recvfrom,
    /// `poll(2), ppoll`
    Poll,
    /// `select(2), pselect6`
    Select,
    /// `statx(2)`
    Statx,
    /// Any other call, by its system-call number (or, where only a name is known, by
    /// [`CallKind::id_of_name`]).
    Other(u32),
}

/// The named kinds in a fixed order (used by parsers and tables).
pub const NAMED_KINDS: [CallKind; 20] = [
    CallKind::Read,
    CallKind::Write,
    CallKind::Pread,
    CallKind::Pwrite,
    CallKind::Readv,
    CallKind::Writev,
    CallKind::Open,
    CallKind::Openat,
    CallKind::Stat,
    CallKind::Fstat,
    CallKind::Lstat,
    CallKind::Newfstatat,
    CallKind::Fsync,
    CallKind::Fdatasync,
    CallKind::Sendfile,
    CallKind::Sendto,
    CallKind::Recvfrom,
    CallKind::Poll,
    CallKind::Select,
    CallKind::Statx,
];

impl CallKind {
    /// The name strace prints for this call (`Other` has none).
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            CallKind::Read => "read",
            CallKind::Write => "write",
            CallKind::Pread => "pread64",
            CallKind::Pwrite => "pwrite64",
            CallKind::Readv => "readv",
            CallKind::Writev => "writev",
            CallKind::Open => "open",
            CallKind::Openat => "openat",
            CallKind::Stat => "stat",
            CallKind::Fstat => "fstat",
            CallKind::Lstat => "lstat",
            CallKind::Newfstatat => "newfstatat",
            CallKind::Fsync => "fsync",
            CallKind::Fdatasync => "fdatasync",
            CallKind::Sendfile => "sendfile",
            CallKind::Sendto => "sendto",
            CallKind::Recvfrom => "recvfrom",
            CallKind::Poll => "poll",
            CallKind::Select => "select",
            CallKind::Statx => "statx",
            CallKind::Other(_) => return None,
        })
    }

    /// The kind for a call name as strace or a CSV trace spells it; unknown names become
    /// `Other` with a stable id derived from the name, so equal names share a key.
    pub fn from_name(name: &str) -> CallKind {
        let canonical = match name {
            "pread" => "pread64",
            "pwrite" => "pwrite64",
            "sendfile64" => "sendfile",
            "fstatat" | "fstatat64" => "newfstatat",
            "pselect6" | "_newselect" => "select",
            "ppoll" => "poll",
            other => other,
        };
        NAMED_KINDS
            .iter()
            .copied()
            .find(|kind| kind.name() == Some(canonical))
            .unwrap_or(CallKind::Other(CallKind::id_of_name(name)))
    }

    /// A stable 32-bit id for a call known only by name (FNV-1a), kept above the range of
    /// real system-call numbers so the two never meet.
    pub fn id_of_name(name: &str) -> u32 {
        let mut hash: u32 = 0x811c_9dc5;
        for byte in name.bytes() {
            hash = (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193);
        }
        hash | 0x8000_0000
    }

    /// Whether the call's `size` is a byte count the 4 KB rule can look at.
    pub fn moves_bytes(self) -> bool {
        matches!(
            self,
            CallKind::Read
                | CallKind::Write
                | CallKind::Pread
                | CallKind::Pwrite
                | CallKind::Readv
                | CallKind::Writev
                | CallKind::Sendfile
                | CallKind::Sendto
                | CallKind::Recvfrom
        )
    }

    /// The named kind's place in [`NAMED_KINDS`] (a dense index for per-kind counters), or
    /// `None` for `Other`.
    pub fn index(self) -> Option<usize> {
        NAMED_KINDS.iter().position(|&k| k == self)
    }

    fn code(self) -> u64 {
        match self {
            CallKind::Other(nr) => 0x1_0000_0000 | u64::from(nr),
            named => named.index().map_or(0, |i| i as u64 + 1),
        }
    }
}

/// One call as the decision code sees it: what, on which descriptor, how many bytes, from
/// where in the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CallDesc {
    /// Which call.
    pub kind: CallKind,
    /// The file descriptor, or -1 for calls without one (open, stat).
    pub fd: i32,
    /// Bytes asked for (read/write count, total of an iovec, sendfile count); 0 when the call
    /// moves no buffer.
    pub size: u64,
    /// Where the call was made: a return address, a statement id, any stable number.
    pub site: u64,
}

impl CallDesc {
    /// A description from its parts.
    pub fn new(kind: CallKind, fd: i32, size: u64, site: u64) -> CallDesc {
        CallDesc { kind, fd, size, site }
    }

    /// The predictor key: a hash of the call, its arguments and its call site (the paper's
    /// AState, an XOR-hash of argument registers). Equal descriptions give equal keys.
    pub fn key(&self) -> u64 {
        let mut state = mix(self.kind.code());
        for word in [self.fd as u32 as u64, self.size, self.site] {
            state = mix(state ^ word);
        }
        state
    }
}

impl CallDesc {
    /// The timed predictor's key: the call's kind, its call site, the power of two its size
    /// falls in, and whether it names a descriptor (not which one, nor the exact size: a loop
    /// reading one file after another with one buffer is one key). `statx(AT_FDCWD, path)`
    /// walks a path, `statx(fd, "", AT_EMPTY_PATH)` does not: under one name and one call
    /// site, `ls -lR` makes both, 7 µs and 0.5 µs here.
    pub fn timed_key(&self) -> u64 {
        let bucket = 64 - u64::from(self.size.leading_zeros());
        let no_descriptor = u64::from(self.fd < 0) << 7;
        mix(mix(self.kind.code() ^ 0x7469_6d65) ^ self.site) ^ (bucket | no_descriptor)
    }
}

/// The SplitMix64 finaliser: every input bit affects every output bit, so the low bits a
/// direct-mapped table indexes by are well spread.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_round_trip() {
        for kind in NAMED_KINDS {
            assert_eq!(CallKind::from_name(kind.name().unwrap()), kind);
        }
        assert_eq!(CallKind::from_name("pselect6"), CallKind::Select);
        assert_eq!(CallKind::from_name("fstatat64"), CallKind::Newfstatat);
    }

    #[test]
    fn unknown_names_get_stable_distinct_ids() {
        let mmap = CallKind::from_name("mmap");
        assert_eq!(mmap, CallKind::from_name("mmap"));
        assert_ne!(mmap, CallKind::from_name("munmap"));
        assert!(matches!(mmap, CallKind::Other(id) if id >= 0x8000_0000));
    }

    #[test]
    fn key_depends_on_every_field() {
        let base = CallDesc::new(CallKind::Read, 3, 4096, 7);
        assert_ne!(base.key(), CallDesc { kind: CallKind::Write, ..base }.key());
        assert_ne!(base.key(), CallDesc { fd: 4, ..base }.key());
        assert_ne!(base.key(), CallDesc { size: 4097, ..base }.key());
        assert_ne!(base.key(), CallDesc { site: 8, ..base }.key());
        assert_ne!(
            CallDesc::new(CallKind::Read, 0, 0, 0).key(),
            CallDesc::new(CallKind::Other(0), 0, 0, 0).key()
        );
    }

    proptest! {
        #[test]
        fn equal_descriptions_have_equal_keys(fd in any::<i32>(), size in any::<u64>(), site in any::<u64>()) {
            let a = CallDesc::new(CallKind::Pread, fd, size, site);
            prop_assert_eq!(a.key(), a.clone().key());
        }
    }
}
