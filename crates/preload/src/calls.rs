//! The kinds of calls this library intercepts, as counted and reported.

/// One intercepted function family. `fstatat` covers `newfstatat`; the `_chk`, `64` and
/// legacy `__xstat` entry points count as the call they stand for.
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
    /// The name in the summary line (the system call's name as strace prints it).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Read => "read",
            Kind::Write => "write",
            Kind::Pread => "pread64",
            Kind::Pwrite => "pwrite64",
            Kind::Readv => "readv",
            Kind::Writev => "writev",
            Kind::Open => "open",
            Kind::Openat => "openat",
            Kind::Stat => "stat",
            Kind::Lstat => "lstat",
            Kind::Fstat => "fstat",
            Kind::Fstatat => "newfstatat",
            Kind::Statx => "statx",
            Kind::Fsync => "fsync",
            Kind::Fdatasync => "fdatasync",
            Kind::Sendfile => "sendfile",
            Kind::Sendto => "sendto",
            Kind::Recvfrom => "recvfrom",
            Kind::Poll => "poll",
            Kind::Select => "select",
        }
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
