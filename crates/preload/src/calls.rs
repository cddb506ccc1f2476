//! The kinds of calls this library intercepts, as counted and reported.

use corehop_policy::offload::CallKind;

/// One intercepted function family, a dense index for the per-kind counters (the policy's
/// [`CallKind`] has no such index and no named statx). `fstatat` covers `newfstatat`; the
/// `_chk`, `64` and legacy `__xstat` entry points count as the call they stand for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Read,
    Write,
    Pread,
    Pwrite,
    Readv,
    Writev,
    Open,
    Openat,
    Stat,
    Lstat,
    Fstat,
    Fstatat,
    Statx,
    Fsync,
    Fdatasync,
    Sendfile,
    Sendto,
    Recvfrom,
    Poll,
    Select,
}

/// Every kind, in `Kind as usize` order.
pub const KINDS: [Kind; 20] = [
    Kind::Read,
    Kind::Write,
    Kind::Pread,
    Kind::Pwrite,
    Kind::Readv,
    Kind::Writev,
    Kind::Open,
    Kind::Openat,
    Kind::Stat,
    Kind::Lstat,
    Kind::Fstat,
    Kind::Fstatat,
    Kind::Statx,
    Kind::Fsync,
    Kind::Fdatasync,
    Kind::Sendfile,
    Kind::Sendto,
    Kind::Recvfrom,
    Kind::Poll,
    Kind::Select,
];

impl Kind {
    /// The policy crate's kind. statx has no named kind there, so it goes by its number.
    pub fn call_kind(self) -> CallKind {
        match self {
            Kind::Read => CallKind::Read,
            Kind::Write => CallKind::Write,
            Kind::Pread => CallKind::Pread,
            Kind::Pwrite => CallKind::Pwrite,
            Kind::Readv => CallKind::Readv,
            Kind::Writev => CallKind::Writev,
            Kind::Open => CallKind::Open,
            Kind::Openat => CallKind::Openat,
            Kind::Stat => CallKind::Stat,
            Kind::Lstat => CallKind::Lstat,
            Kind::Fstat => CallKind::Fstat,
            Kind::Fstatat => CallKind::Newfstatat,
            Kind::Statx => CallKind::Other(libc::SYS_statx as u32),
            Kind::Fsync => CallKind::Fsync,
            Kind::Fdatasync => CallKind::Fdatasync,
            Kind::Sendfile => CallKind::Sendfile,
            Kind::Sendto => CallKind::Sendto,
            Kind::Recvfrom => CallKind::Recvfrom,
            Kind::Poll => CallKind::Poll,
            Kind::Select => CallKind::Select,
        }
    }

    /// The name in the summary line: the system call's name as strace prints it, which the
    /// policy crate knows for every kind but statx.
    pub fn name(self) -> &'static str {
        self.call_kind().name().unwrap_or("statx")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_listed_in_discriminant_order_with_distinct_names() {
        for (i, kind) in KINDS.iter().enumerate() {
            assert_eq!(*kind as usize, i);
        }
        let mut names: Vec<_> = KINDS.iter().map(|k| k.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), KINDS.len());
    }
}
