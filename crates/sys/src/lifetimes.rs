//! Which programs end before the start-up stub could do anything for them: a table, shared by
//! every process under `corehop run` through a file in the user's cache directory, of how the
//! processes of each program (by the file name it was started as) ended.
//!
//! Why: preloading any library costs a process here about 80-90 µs (the loader opens, maps and
//! relocates one more object), and a process that ends within the stub's 40 ms never loads
//! corehop's library, so the stub was pure cost to it. A shell script that starts 200 short
//! commands ran 7-12 % slower for that alone (docs/performance.md, "Sixty-seventh session").
//! A program whose processes have ended that way [`SHORT_RUNS`] times, and never otherwise,
//! is started as it would be plainly: its environment as the program gave it, no stub. Every
//! [`RECHECK_EVERY`]th start of it still gets the stub, so a program that has begun to run
//! longer is seen to. A process that lived longer, loaded the library, or started a program or
//! a process of its own (whose programs a plain start would take out from under corehop) marks
//! its program for good.
//!
//! Only `core`: the stub (`no_std`) includes this file by path, maps the table read-only and
//! writes what [`Table`] asks for; any bit pattern in it is a valid table (another process, or
//! a damaged file, can at worst cost a program its stub or give it one).

use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Slots in the table: one per program seen (a program that finds none free among its
/// [`PROBES`] is started as before, with the stub).
pub const SLOT_COUNT: usize = 4096;
/// The table's size in bytes: the file is at least this long, and only ever grows.
pub const TABLE_BYTES: usize = SLOT_COUNT * 8;
/// The file's name in corehop's cache directory (a new layout gets a new name).
pub const FILE_NAME: &str = "lifetimes-v1";

/// Short ends a program needs, and no other, before it is started plainly.
pub const SHORT_RUNS: u64 = 2;
/// One start in this many of a program started plainly gets the stub again, to see whether
/// its processes still end as they did.
pub const RECHECK_EVERY: u64 = 16;
/// Slots looked at for a program, from its hash on: past that it finds no room.
const PROBES: usize = 8;

/// How a process of a program ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// Within the stub's wait, before it loaded the library, having started nothing.
    Short,
    /// Later, or after the library was loaded.
    Long,
    /// It started a program or a process (noted when it did, whenever it ends).
    Starter,
}

// A slot: the program's tag in the high bits, then what its processes did.
const LONG: u64 = 1 << 0;
const STARTER: u64 = 1 << 1;
const SHORTS_SHIFT: u32 = 2;
const SHORTS_MAX: u64 = 15;
const SKIPS_SHIFT: u32 = 6;
const SKIPS_MASK: u64 = (1 << 14) - 1;
const FIELDS: u64 = (1 << 20) - 1;

/// A program's key: the FNV-1a hash of the last component of `path` (the name a program is
/// started as, and the one it sees as its own: `execvp("ls")` and `/usr/bin/ls` are both
/// `ls`), or `None` for an empty one.
pub fn key(path: &[u8]) -> Option<u64> {
    let name = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
    if name.is_empty() {
        return None;
    }
    let hash =
        name.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    Some(hash)
}

/// A write a [`Table`] asks for: `word` into slot `index` (at byte `index * 8` of the file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Write {
    /// The slot.
    pub index: usize,
    /// Its new value.
    pub word: u64,
}

/// A table over `SLOT_COUNT` shared words (see the module's text), read only: each change
/// is a [`Write`] for the caller to make (the stub writes the file with `pwrite`, whose
/// failures are return values, where a store into a shared mapping of a file on a full disk
/// raises SIGBUS). Two processes changing one slot at once may lose one change: the table
/// is advice.
pub struct Table<'a> {
    slots: &'a [AtomicU64; SLOT_COUNT],
}

impl<'a> Table<'a> {
    /// The table in `slots`; `None` unless there are exactly [`SLOT_COUNT`].
    pub fn new(slots: &'a [AtomicU64]) -> Option<Table<'a>> {
        Some(Table { slots: slots.try_into().ok()? })
    }

    /// The write that notes how a process of program `key` ended (or that it started
    /// something); `None` if there is nothing to change or no room.
    pub fn note(&self, key: u64, end: End) -> Option<Write> {
        let (index, word) = self.slot(key, true)?;
        let new = match end {
            End::Long => word | LONG,
            End::Starter => word | STARTER,
            End::Short => {
                let shorts = ((word >> SHORTS_SHIFT) & SHORTS_MAX).saturating_add(1).min(SHORTS_MAX);
                word & !(SHORTS_MAX << SHORTS_SHIFT) | shorts << SHORTS_SHIFT
            }
        };
        (new != word).then_some(Write { index, word: new })
    }

    /// Whether to start program `key` plainly this time: its processes have ended short
    /// [`SHORT_RUNS`] times and never otherwise, and this is not one of the starts in
    /// [`RECHECK_EVERY`] that gets the stub to check; with the write that counts the start.
    pub fn starts_plainly(&self, key: u64) -> (bool, Option<Write>) {
        let Some((index, word)) = self.slot(key, false) else { return (false, None) };
        let shorts = (word >> SHORTS_SHIFT) & SHORTS_MAX;
        if word & (LONG | STARTER) != 0 || shorts < SHORT_RUNS {
            return (false, None);
        }
        let skips = ((word >> SKIPS_SHIFT) + 1) & SKIPS_MASK;
        let word = word & !(SKIPS_MASK << SKIPS_SHIFT) | skips << SKIPS_SHIFT;
        (!skips.is_multiple_of(RECHECK_EVERY), Some(Write { index, word }))
    }

    /// The slot of program `key` and what it holds: the one holding its tag among the
    /// [`PROBES`] from its hash on, or (`claim`) the first empty one there, as holding the tag.
    fn slot(&self, key: u64, claim: bool) -> Option<(usize, u64)> {
        let tag = tag(key);
        let mut empty = None;
        for probe in 0..PROBES {
            let index = (key as usize).wrapping_add(probe) % SLOT_COUNT;
            let word = self.slots[index].load(Relaxed);
            if word & !FIELDS == tag {
                return Some((index, word));
            }
            if word == 0 && empty.is_none() {
                empty = Some(index);
            }
        }
        empty.filter(|_| claim).map(|index| (index, tag))
    }
}

/// How many starts of a slot's program were plain between two readings of the slot, `before`
/// and `after` (a report's figure: a slot that changed programs in between counts none).
pub fn plain_starts_between(before: u64, after: u64) -> u64 {
    if after & !FIELDS == 0 || (before != 0 && before & !FIELDS != after & !FIELDS) {
        return 0;
    }
    let skips = |word: u64| (word >> SKIPS_SHIFT) & SKIPS_MASK;
    let first = skips(before);
    // The count wraps; the checked starts are the multiples of RECHECK_EVERY passed.
    let passed = skips(after).wrapping_sub(first) & SKIPS_MASK;
    let checked = (first + passed) / RECHECK_EVERY - first / RECHECK_EVERY;
    passed - checked
}

/// The part of a slot that names program `key`: never 0, the empty slot.
fn tag(key: u64) -> u64 {
    (key | 1 << 63) & !FIELDS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Vec<AtomicU64> {
        (0..SLOT_COUNT).map(|_| AtomicU64::new(0)).collect()
    }

    /// A table whose writes are made as soon as it asks for them, as the stub makes them.
    struct Written<'a> {
        table: Table<'a>,
        slots: &'a [AtomicU64],
    }

    fn written(slots: &[AtomicU64]) -> Written<'_> {
        Written { table: Table::new(slots).unwrap(), slots }
    }

    impl Written<'_> {
        fn write(&self, write: Option<Write>) {
            if let Some(Write { index, word }) = write {
                self.slots[index].store(word, Relaxed);
            }
        }

        fn note(&self, key: u64, end: End) {
            self.write(self.table.note(key, end));
        }

        fn starts_plainly(&self, key: u64) -> bool {
            let (plainly, write) = self.table.starts_plainly(key);
            self.write(write);
            plainly
        }
    }

    #[test]
    fn a_program_is_known_by_its_file_name() {
        assert_eq!(key(b"/usr/bin/ls"), key(b"ls"));
        assert_eq!(key(b"./tools/ls"), key(b"ls"));
        assert_ne!(key(b"ls"), key(b"cat"));
        assert_eq!(key(b""), None);
        assert_eq!(key(b"/usr/bin/"), None);
    }

    #[test]
    fn a_program_that_ended_short_twice_starts_plainly_but_one_start_in_16() {
        let slots = table();
        let t = written(&slots);
        let k = key(b"true").unwrap();
        assert!(!t.starts_plainly(k), "never seen");
        t.note(k, End::Short);
        assert!(!t.starts_plainly(k), "seen once");
        t.note(k, End::Short);
        let starts: Vec<bool> = (0..48).map(|_| t.starts_plainly(k)).collect();
        let with_stub: Vec<usize> = starts.iter().enumerate().filter(|(_, &p)| !p).map(|(i, _)| i).collect();
        assert_eq!(with_stub, [15, 31, 47]);
    }

    #[test]
    fn a_long_end_or_a_start_of_anything_keeps_the_stub_for_good() {
        let slots = table();
        let t = written(&slots);
        for (name, other) in [(&b"grep"[..], End::Long), (b"sh", End::Starter)] {
            let k = key(name).unwrap();
            t.note(k, End::Short);
            t.note(k, End::Short);
            assert!(t.starts_plainly(k));
            t.note(k, other);
            for _ in 0..40 {
                t.note(k, End::Short);
            }
            assert!((0..40).all(|_| !t.starts_plainly(k)), "{}", String::from_utf8_lossy(name));
        }
    }

    #[test]
    fn programs_that_share_a_slot_keep_apart_and_a_full_run_of_slots_turns_none_away() {
        let slots = table();
        let t = written(&slots);
        // Keys with the same home slot and different tags.
        let keys: Vec<u64> = (0..PROBES as u64 + 1).map(|i| 7 | (i + 1) << 40).collect();
        for &k in &keys[..PROBES] {
            t.note(k, End::Short);
            t.note(k, End::Short);
        }
        t.note(keys[0], End::Long);
        assert!(!t.starts_plainly(keys[0]));
        assert!(keys[1..PROBES].iter().all(|&k| t.starts_plainly(k)));
        let last = keys[PROBES];
        t.note(last, End::Short);
        t.note(last, End::Short);
        assert!(!t.starts_plainly(last), "no room: started as before");
    }

    #[test]
    fn a_report_counts_the_plain_starts_between_two_readings() {
        let slots = table();
        let t = written(&slots);
        let k = key(b"true").unwrap();
        let home = (k as usize) % SLOT_COUNT;
        let read = || slots[home].load(Relaxed);
        let empty = read();
        t.note(k, End::Short);
        t.note(k, End::Short);
        let before = read();
        let plain = (0..40).filter(|_| t.starts_plainly(k)).count() as u64;
        assert_eq!(plain_starts_between(before, read()), plain);
        assert_eq!(plain_starts_between(empty, read()), plain);
        assert_eq!(plain_starts_between(read(), read()), 0);
        assert_eq!(plain_starts_between(before ^ 1 << 40, read()), 0, "another program's slot");
    }

    #[test]
    fn any_bits_are_a_table() {
        let slots: Vec<AtomicU64> =
            (0..SLOT_COUNT as u64).map(|i| AtomicU64::new(i.wrapping_mul(0x9e37_79b9_7f4a_7c15))).collect();
        let t = written(&slots);
        for name in [&b"a"[..], b"b", b"cc", b"/bin/true"] {
            let k = key(name).unwrap();
            t.note(k, End::Short);
            let _ = t.starts_plainly(k);
        }
        assert!(Table::new(&slots[1..]).is_none());
    }

    #[test]
    fn a_write_lost_to_another_process_costs_a_count_and_nothing_else() {
        let slots = table();
        let t = written(&slots);
        let k = key(b"true").unwrap();
        t.note(k, End::Short);
        // Two processes read the slot, then both write: the second write wins.
        let (first, second) = (t.table.note(k, End::Short), t.table.note(k, End::Long));
        t.write(first);
        t.write(second);
        assert!(!t.starts_plainly(k), "the long end is kept, the short one lost");
    }
}
