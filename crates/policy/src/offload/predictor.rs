//! The run-length predictor (selective-os-offload §III.A).
//!
//! A table keyed by the predictor key remembers, per key, the run length seen last time and
//! a 2-bit confidence counter: +1 when that last value was within ±5 % of the next actual
//! run, −1 otherwise. A key whose entry is missing or has confidence 0 gets the *global*
//! prediction instead: the mean of the last three runs of any key, because run lengths
//! cluster. The table is either fully associative (tagged, least-recently-used eviction;
//! 200 entries in the paper) or direct mapped (tagless, indexed by the key's low bits, so
//! keys that collide share an entry; 1500 entries).
//!
//! Beside the paper's two forms, a third for run lengths measured in *time*
//! ([`TableForm::Timed`]): times never repeat exactly, so "within ±5 %" rarely holds and the
//! paper's form falls back to the global mean most of the time, which a few long calls (an
//! fsync) drag up. The timed form keys a call by its kind, call site, size bucket (log2) and
//! whether it names a descriptor, and keeps each key's last nine runs. It predicts their
//! lower tercile, which ignores the spikes that interrupts and preemption add, or their
//! median where that has lately been the closer guess (a key whose runs take two lengths at
//! random). A new key falls back to its kind's runs, then to any call's: a kind says more
//! about a call's length than whatever call came before it.
//!
//! Its decisions at a threshold N ([`RunLengthPredictor::above_call`]) are chosen as a
//! branch predictor's tournament chooses: per key, between the prediction and the plain
//! majority of the key's runs at N, whichever has lately been right where they differ, and
//! between that and what followed the sides of the key's last two runs before (a key whose
//! runs take turns, as `find`'s two stats of each entry do); and over all calls, between the
//! keys' decisions and the plain majority of all calls at N (which decides first, until the
//! keys have earned their place, for all but a key whose last runs lie far on one side of N).
//! On a key or a program where runs land on either side of N at random, the decisions then
//! stay within a learning cost of the better of always and never moving, where the prediction
//! alone fell up to 19 points below it (docs/performance.md, "run-length predictor").
//!
//! A process's keys are its own call sites, but what its call kinds and calls as a whole ran,
//! and whether its keys or the plain majority decided better, say as much about the next
//! process of the same run on the same machine: [`RunLengthPredictor::learned`] hands that
//! on, and [`RunLengthPredictor::start_from`] starts a new process's predictor from it (the
//! paper's predictor lived in the kernel, one for every process). A short process then does
//! not lose its first calls to a cold start. A process that starts from nothing takes its
//! first calls to run [`COLD_RUN`] (3 µs), as first calls do, until its own runs say more.
//!
//! Units are whatever the caller observes in (the runtime uses nanoseconds, the simulator
//! cycles); the predictor only compares and averages them.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, DefaultHasher};

use serde::{Deserialize, Serialize};

use super::{CallDesc, CallKind, OffloadError, NAMED_KINDS};

/// Entries of the paper's fully-associative table.
pub const PAPER_FULLY_ASSOCIATIVE: usize = 200;
/// Entries of the paper's direct-mapped table.
pub const PAPER_DIRECT_MAPPED: usize = 1500;
/// The saturating confidence counter's top value (2 bits).
pub const CONFIDENCE_MAX: u8 = 3;
/// A fresh entry starts at this confidence: one observation is trusted until contradicted.
pub const CONFIDENCE_NEW: u8 = 1;
/// "Close enough" for the confidence counter and for accuracy reports, in percent.
pub const TOLERANCE_PERCENT: u64 = 5;
/// How many recent runs (of any key) the global prediction averages.
pub const GLOBAL_HISTORY: usize = 3;

/// How the predictor table is organised.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TableForm {
    /// Tagged entries, any key anywhere, the least recently used evicted (a CAM in hardware).
    FullyAssociative {
        /// Table size.
        entries: usize,
    },
    /// Tagless: entry `key % entries`; colliding keys share (and disturb) one entry.
    DirectMapped {
        /// Table size.
        entries: usize,
    },
    /// For times: tagged entries at `key % entries` (a colliding key replaces the entry),
    /// each the key's last nine runs; predictions are their lower tercile or median, with the
    /// call kind's and then any call's as the fallbacks, and decisions at a threshold chosen
    /// against the majority's (module docs). Allocates only when built.
    Timed {
        /// Table size.
        entries: usize,
    },
}

impl TableForm {
    /// The paper's 200-entry fully-associative table.
    pub const PAPER_FA: TableForm = TableForm::FullyAssociative { entries: PAPER_FULLY_ASSOCIATIVE };
    /// The paper's 1500-entry direct-mapped table.
    pub const PAPER_DM: TableForm = TableForm::DirectMapped { entries: PAPER_DIRECT_MAPPED };
    /// The timed form with as many entries as the paper's direct-mapped table.
    pub const TIMED: TableForm = TableForm::Timed { entries: PAPER_DIRECT_MAPPED };

    /// How many entries the table has.
    pub fn entries(self) -> usize {
        match self {
            TableForm::FullyAssociative { entries }
            | TableForm::DirectMapped { entries }
            | TableForm::Timed { entries } => entries,
        }
    }

    /// A short label: `fa200`, `dm1500`, `time1500`.
    pub fn label(self) -> String {
        match self {
            TableForm::FullyAssociative { entries } => format!("fa{entries}"),
            TableForm::DirectMapped { entries } => format!("dm{entries}"),
            TableForm::Timed { entries } => format!("time{entries}"),
        }
    }
}

/// Where a prediction came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The key's own last run, with confidence above zero.
    Local,
    /// The mean of the last runs of any key (entry missing or not confident).
    Global,
    /// Nothing observed yet: the prediction is 0.
    Cold,
}

/// A predicted run length and its source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prediction {
    /// The predicted run length.
    pub run: u64,
    /// Where the prediction came from.
    pub source: Source,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    key: u64,
    last: u64,
    confidence: u8,
}

/// No slot, in [`Recency`].
const NO_SLOT: u32 = u32::MAX;

/// The slots of a fully associative table from the most to the least recently observed: a
/// doubly linked list over slot numbers, so that a hit and an eviction cost the same whatever
/// the table's size. A scan for the oldest slot cost about 1 µs a call over 200 entries once a
/// program's keys outnumbered them.
#[derive(Clone, Debug)]
struct Recency {
    newer: Vec<u32>,
    older: Vec<u32>,
    newest: u32,
    oldest: u32,
}

impl Recency {
    fn new(slots: usize) -> Recency {
        Recency { newer: vec![NO_SLOT; slots], older: vec![NO_SLOT; slots], newest: NO_SLOT, oldest: NO_SLOT }
    }

    /// The least recently observed slot (`None` while the list is empty).
    fn oldest(&self) -> Option<usize> {
        (self.oldest != NO_SLOT).then_some(self.oldest as usize)
    }

    /// Makes `slot` the most recent, linking it in if it was not yet.
    fn touch(&mut self, slot: usize) {
        let s = slot as u32;
        if self.newest == s {
            return;
        }
        let (newer, older) = (self.newer[slot], self.older[slot]);
        // Linked in: unlink it (the newest has no newer slot, and was handled above).
        if newer != NO_SLOT {
            self.older[newer as usize] = older;
            if older == NO_SLOT {
                self.oldest = newer;
            } else {
                self.newer[older as usize] = newer;
            }
        }
        self.newer[slot] = NO_SLOT;
        self.older[slot] = self.newest;
        if self.newest == NO_SLOT {
            self.oldest = s;
        } else {
            self.newer[self.newest as usize] = s;
        }
        self.newest = s;
    }
}

/// How many recent runs of a key (or a call kind) the timed form keeps.
const HISTORY: usize = 9;

/// Words of a [`Recent`]: the runs in arrival order (a ring), the same runs sorted, how many
/// there are, the ring's next slot, how far off each of its two candidate predictions has
/// recently been, and its vote at the threshold decisions are made at.
const RECENT_WORDS: usize = 2 * HISTORY + 5;
const SORTED: usize = HISTORY;
const LEN: usize = 2 * HISTORY;
const NEXT: usize = 2 * HISTORY + 1;
const MISS_TERCILE: usize = 2 * HISTORY + 2;
const MISS_MEDIAN: usize = 2 * HISTORY + 3;
/// Bits 0–15: how often runs ended above the threshold, in 1/65536 (decayed); bits 16–17: a
/// two-bit counter that trusts the prediction (2, 3) or that majority (0, 1); bit 18: set;
/// bits 19–20: the sides of the last two runs (the newer in bit 19); bits 21–28: a two-bit
/// counter per such history, saying which side came next (2, 3: above); bits 29–30: a
/// two-bit counter that trusts those (2, 3) or the runs' decision (0, 1).
const VOTE: usize = 2 * HISTORY + 4;
const VOTE_SET: u32 = 1 << 18;
const SIDES_SHIFT: u32 = 19;
const NEXT_SIDE_SHIFT: u32 = 21;
const TRUST_SIDES_SHIFT: u32 = 29;
/// The share above keeps `1 - 1/2^ABOVE_DECAY_SHIFT` of itself per run: it follows the last 16
/// runs or so, more than the nine of the prediction, so a key whose runs fall on both sides at
/// random gets its majority right more often.
const ABOVE_DECAY_SHIFT: u32 = 4;

/// A miss score keeps `1 - 1/2^MISS_DECAY_SHIFT` of itself per run: it follows the last 16 or so.
const MISS_DECAY_SHIFT: u32 = 4;
/// A miss score stays below this: a miss is at most 32 × 256 (a log2 in 1/256ths), and the
/// score settles at 16 of them.
const MISS_BOUND: u32 = 1 << 20;

/// How far from the threshold, as a factor, all of a key's last runs must lie for the key to
/// decide while the plain majority does for the rest. A `file` reading a pipe waited 4-18 ms
/// in each of its nine reads, after a process whose calls all ran below 5 µs: the majority
/// said "below" to every read, and the keys earned their place only by the eighth
/// (docs/performance.md, "Sixty-first session").
const FAR: u64 = 4;

/// A two-bit counter (0-3) moved one step up when only `up` holds, one down when only `down`
/// does: a tournament's choice between two guesses, or a side's count of runs.
fn two_bit(counter: u32, up: bool, down: bool) -> u32 {
    match (up, down) {
        (true, false) => (counter + 1).min(3),
        (false, true) => counter.saturating_sub(1),
        _ => counter,
    }
}

/// log2 of `x` in 1/256ths (`x` ≥ 1; the fraction is the mantissa's linear interpolation, so
/// off by at most 0.086): a prediction's miss in the units that decide an offload, ratios.
fn log2_256(x: u32) -> u32 {
    let x = x.max(1);
    let whole = 31 - x.leading_zeros();
    let fraction = if whole >= 8 { (x >> (whole - 8)) & 0xff } else { (x << (8 - whole)) & 0xff };
    whole * 256 + fraction
}

/// The last [`HISTORY`] runs of something, each saturated to 32 bits (4.3 s in ns) to keep
/// the table small. A push takes the oldest run out of the sorted copy and puts the new one in
/// by shifting, so a prediction (asked several times a call) is a load and a push costs no
/// sort. Plain words, all zero when empty, so that a table of them can come from zeroed
/// memory (see [`Timed`]).
#[derive(Clone, Copy, Debug, Default)]
struct Recent([u32; RECENT_WORDS]);

impl Recent {
    fn push(&mut self, run: u64) {
        let run = u32::try_from(run).unwrap_or(u32::MAX);
        self.score(run);
        let w = &mut self.0;
        let len = w[LEN] as usize;
        let next = w[NEXT] as usize;
        let sorted = SORTED..SORTED + HISTORY;
        let mut end = len;
        if len == HISTORY {
            // Take the oldest run out of the sorted copy (plain loops: nine words do not
            // pay for a call to memmove).
            let oldest = w[next];
            let mut at = w[sorted.clone()].iter().position(|&r| r == oldest).unwrap_or(HISTORY - 1);
            while at + 1 < HISTORY {
                w[SORTED + at] = w[SORTED + at + 1];
                at += 1;
            }
            end = HISTORY - 1;
        }
        // Insertion: shift the larger runs up one.
        let mut at = end;
        while at > 0 && w[SORTED + at - 1] > run {
            w[SORTED + at] = w[SORTED + at - 1];
            at -= 1;
        }
        w[SORTED + at] = run;
        w[next] = run;
        w[NEXT] = ((next + 1) % HISTORY) as u32;
        w[LEN] = (end + 1) as u32;
    }

    /// Whether the next run will end above `n`: by its runs ([`Recent::above_by_runs`]), or,
    /// where that has been wrong more often lately, by what followed the sides of the last two
    /// runs before (a two-level predictor, as for branches: a key whose runs take turns, short
    /// then long, is wrong every time by its runs and right every time by its turns).
    fn above(&self, n: u64) -> Option<bool> {
        let by_runs = self.above_by_runs(n)?;
        let vote = self.0[VOTE];
        Some(if (vote >> TRUST_SIDES_SHIFT) & 3 >= 2 { Self::by_sides(vote) } else { by_runs })
    }

    /// By the typical run (below), or, where that has been wrong more often than the plain
    /// majority of this key's runs at `n`, by the majority (a tournament, as branch predictors
    /// choose between two of their own).
    fn above_by_runs(&self, n: u64) -> Option<bool> {
        let typical = self.typical()? > n;
        let vote = self.0[VOTE];
        if vote & VOTE_SET == 0 || (vote >> 16) & 3 >= 2 {
            Some(typical)
        } else {
            Some(vote & 0xffff >= 0x8000)
        }
    }

    /// The side of `n` every one of the key's last runs, at least two, ended on by more than a
    /// factor of [`FAR`]: a side its decisions then keep to before the keys have earned their
    /// place over the plain majority (see [`Timed::above`]).
    fn far_side(&self, n: u64) -> Option<bool> {
        let w = &self.0;
        let len = w[LEN] as usize;
        if len < 2 {
            None
        } else if u64::from(w[SORTED]) > n.saturating_mul(FAR) {
            Some(true)
        } else if u64::from(w[SORTED + len - 1]).saturating_mul(FAR) < n {
            Some(false)
        } else {
            None
        }
    }

    /// What came next, lately, after the sides of the last two runs.
    fn by_sides(vote: u32) -> bool {
        let sides = (vote >> SIDES_SHIFT) & 3;
        (vote >> (NEXT_SIDE_SHIFT + 2 * sides)) & 3 >= 2
    }

    /// Learns `run`, counting for the votes at `n` which guesses were right.
    fn push_at(&mut self, run: u64, n: u64) {
        let ended_above = run > n;
        let vote = self.0[VOTE];
        let share = vote & 0xffff;
        let vote = if vote & VOTE_SET == 0 {
            // The first run at this key: the majority is that run's side; trust the prediction;
            // every history says that side comes next, weakly, and is not trusted yet.
            let (share, sides, next_side) = if ended_above { (0xffff, 3, 2 * 0x55) } else { (0, 0, 0x55) };
            share | 2 << 16 | sides << SIDES_SHIFT | next_side << NEXT_SIDE_SHIFT | 1 << TRUST_SIDES_SHIFT
        } else {
            let by_prediction = self.typical().is_some_and(|t| t > n);
            let by_majority = share >= 0x8000;
            let trust = two_bit((vote >> 16) & 3, by_prediction == ended_above, by_majority == ended_above);
            let target = if ended_above { 0xffff } else { 0 };
            let share = if target > share {
                share + ((target - share) >> ABOVE_DECAY_SHIFT)
            } else {
                share - ((share - target) >> ABOVE_DECAY_SHIFT)
            };
            let by_runs = self.above_by_runs(n).unwrap_or(false);
            let by_sides = Self::by_sides(vote);
            let trust_sides =
                two_bit((vote >> TRUST_SIDES_SHIFT) & 3, by_sides == ended_above, by_runs == ended_above);
            let sides = (vote >> SIDES_SHIFT) & 3;
            let next = two_bit((vote >> (NEXT_SIDE_SHIFT + 2 * sides)) & 3, ended_above, !ended_above);
            let next_side = (vote >> NEXT_SIDE_SHIFT) & 0xff & !(3 << (2 * sides)) | next << (2 * sides);
            let sides = (sides << 1 | u32::from(ended_above)) & 3;
            share
                | trust << 16
                | sides << SIDES_SHIFT
                | next_side << NEXT_SIDE_SHIFT
                | trust_sides << TRUST_SIDES_SHIFT
        };
        self.0[VOTE] = vote | VOTE_SET;
        self.push(run);
    }

    /// Scores the two candidate predictions against the run that came: how far each was off,
    /// as a ratio (log2), decayed.
    fn score(&mut self, run: u32) {
        let w = &mut self.0;
        let len = w[LEN] as usize;
        if len == 0 {
            return;
        }
        let actual = log2_256(run);
        for (miss, at) in [(MISS_TERCILE, (len - 1) / 3), (MISS_MEDIAN, (len - 1) / 2)] {
            let off = log2_256(w[SORTED + at]).abs_diff(actual);
            w[miss] = w[miss] - (w[miss] >> MISS_DECAY_SHIFT) + off;
        }
    }

    /// Whether the words could have come from pushes: what a [`Learned`] read from outside
    /// the process must hold before a predictor indexes by them.
    fn is_sound(&self) -> bool {
        let w = &self.0;
        let len = w[LEN] as usize;
        len <= HISTORY
            && (w[NEXT] as usize) < HISTORY
            && w[SORTED..SORTED + len].is_sorted()
            && w[MISS_TERCILE] <= MISS_BOUND
            && w[MISS_MEDIAN] <= MISS_BOUND
    }

    /// The run a call of this key typically needs: the lower tercile of the last runs, or their
    /// median while the median has recently been the closer of the two. Run lengths in time
    /// are skewed to the right (an interrupt, a preemption, a cold cache lengthens a run;
    /// nothing shortens one) and those spikes do not repeat with the key, so a low quantile
    /// predicts the next run better than the median or the mean (docs/performance.md,
    /// "run-length predictor"). A key whose runs really take two lengths at random is the
    /// exception: there the tercile says "short" while most runs are long, and the median,
    /// the majority of its last runs, is right more often.
    fn typical(&self) -> Option<u64> {
        let w = &self.0;
        let len = w[LEN] as usize;
        if len == 0 {
            return None;
        }
        let at = if w[MISS_MEDIAN] < w[MISS_TERCILE] { (len - 1) / 2 } else { (len - 1) / 3 };
        Some(u64::from(w[SORTED + at]))
    }
}

/// Words of a slot of the timed table: the key's tag (two words, 0: empty), its [`Recent`]
/// words, and the observation it was last seen at ([`Timed::observed`]).
const SLOT_WORDS: usize = 2 + RECENT_WORDS + 1;
/// Where a slot keeps the observation it was last seen at.
const SEEN: usize = 2 + RECENT_WORDS;
/// A key or kind not observed for this many observations is *idle*: its runs no longer keep
/// a driver from skipping the predictor ([`RunLengthPredictor::all_below_lately`]). One
/// `open` of 8 µs at a program's start otherwise kept every later call of a `dd` of
/// one-byte blocks on the library's full path, at 1.5 times the program's plain time.
const IDLE_AFTER: u32 = 16_384;
/// Observations between two looks for keys and kinds gone idle (a look reads every used slot).
const IDLE_CHECK_EVERY: u32 = IDLE_AFTER / 4;

/// The state of the timed form: per key (tagged, direct mapped) and per call kind.
#[derive(Clone, Debug)]
struct Timed {
    /// Slot `key % slots`, [`SLOT_WORDS`] words each. Plain `u32`s, all zero when empty, so
    /// `vec!` takes the table from zeroed memory (`calloc`) that the OS maps on first touch:
    /// a process pays in page faults for the slots its keys use, not for the table, and
    /// nothing is allocated after start-up (the preload library runs this inside interposed
    /// calls). `vec!` of tuples or of arrays longer than 16 words writes every element
    /// instead: 33 pages, about 70 µs a process here, which each of a shell pipeline's short
    /// processes paid.
    words: Vec<u32>,
    kinds: Vec<Recent>,
    /// Every call's runs: the last fallback, for a call of a new key and kind.
    any: Recent,
    /// How often any call ran above the threshold, in 1/65536, decayed by 1/256 a call.
    above_share: u32,
    /// Calls scored since the start from what another process learned ([`Timed::start_from`];
    /// `u32::MAX` for a process that started from nothing).
    since_start: u32,
    /// Whether no call has been seen and nothing handed on: the plain majority then follows
    /// [`COLD_RUN`].
    cold: bool,
    /// Whether the keys' decisions or the plain majority of all calls have been right more
    /// often lately: a counter in `-TRUST_KEYS..=TRUST_KEYS`, the keys' while it is >= 0.
    trust_keys: i32,
    /// A bit per slot of `words` that ever held a key: a count of the slots that say "above"
    /// reads only those, so the table's untouched pages stay unmapped.
    used: Vec<u64>,
    /// How many used slots, kinds and `any` say "above" at `counted_at` (kept exact as they
    /// learn), so that a caller can tell in one load that no call would move.
    above_slots: u32,
    /// How many used slots' runs all lie far above `counted_at` ([`Recent::far_side`]), kept
    /// exact the same way: while the plain majority decides, only these can say "above" to a
    /// call the majority would not move.
    far_above_slots: u32,
    counted_at: Option<u64>,
    /// Observations since `above_slots` was last counted anew.
    since_count: u32,
    /// Observations so far (wrapping): the clock of the slots' [`SEEN`] words.
    observed: u32,
    /// Per kind, like [`SEEN`]: the observation it was last seen at.
    kinds_seen: Vec<u32>,
    /// The threshold at which no key or kind that is not idle said "above", when last
    /// counted; `None` once an observation may have made one say so.
    none_above_lately: Option<u64>,
}

/// The bound of [`Timed::trust_keys`]: a constant rule takes over after this many more
/// right decisions than the keys', and hands back after as many more wrong.
const TRUST_KEYS: i32 = 32;
/// Where [`Timed::trust_keys`] starts: the plain majority decides until the keys have been
/// right this many more times where the two differ. Keys that have seen one or two runs
/// cost more than they gain on a program whose calls say little about their length; from
/// 0, the decisions fell below the best constant rule at 4 of 40 points of the recorded
/// traces, by 1 to 3 calls each (docs/performance.md, twenty-second session).
const KEYS_START: i32 = -6;
/// [`Timed::above_share`] keeps `1 - 1/2^ANY_DECAY_SHIFT` of itself per call.
const ANY_DECAY_SHIFT: u32 = 8;
/// How many of a process's own calls the plain majority handed on by another process weighs
/// as. At the full 256 a new program after another (`file` after the program it reads) took
/// its first ten or so calls by the other's majority; at 64 the mean over the out-of-sample
/// traces rose from 88.7 to 89.4 %, every other set's unchanged (32 read 89.5 % but put
/// `gcc`'s run five calls below the better constant; docs/performance.md, sixty-fifth session).
const INHERITED_WEIGHT: u32 = 64;
/// What the plain majority takes a call to run before any has been seen. A process's first
/// calls run long (cold caches, first-touch faults): the first call of each of the 30 checked-in
/// traces ran 1.9-207 µs, on fast days and slow. So below this threshold the majority starts
/// at "above", at the tie, and the first calls that run shorter turn it; at or above it, it
/// starts firmly at "below", as every majority did before. Starting all at "below" cost the
/// first six or so calls of every slow trace at N = 1 and 2 µs (docs/performance.md,
/// forty-sixth session). In nanoseconds; a caller counting cycles gets a prior of 3000
/// cycles, which its first calls correct as they would any other.
const COLD_RUN: u64 = 3_000;
/// Observations between two counts of the slots above a threshold that has moved (a count
/// reads every used slot; between counts the one at the older threshold stays exact).
const RECOUNT_EVERY: u32 = 64;

impl Timed {
    fn new(entries: usize) -> Timed {
        Timed {
            words: vec![0; entries * SLOT_WORDS],
            kinds: vec![Recent::default(); NAMED_KINDS.len() + 1],
            any: Recent::default(),
            above_share: 0,
            since_start: u32::MAX,
            cold: true,
            trust_keys: KEYS_START,
            used: vec![0; entries.div_ceil(64)],
            above_slots: 0,
            far_above_slots: 0,
            counted_at: None,
            since_count: 0,
            observed: 0,
            kinds_seen: vec![0; NAMED_KINDS.len() + 1],
            none_above_lately: None,
        }
    }

    /// Whether no call would be found above `n` now, by [`Timed::above`]: the plain majority
    /// of all calls is below while it decides, and otherwise no key, kind or `any` says
    /// above. Exact without reading the table: every slot that learns updates the count.
    fn all_below(&self, n: u64) -> bool {
        if self.trust_keys < 0 {
            // No slot is counted before the first observation, and none is far above then.
            !self.majority_above(n) && self.far_above_slots == 0 && self.counted_at.is_none_or(|at| at <= n)
        } else {
            // "Above" only gets rarer as the threshold rises.
            self.above_slots == 0 && self.counted_at.is_some_and(|at| at <= n)
        }
    }

    /// How many of `slot` (the words of a key's slot), `kind`'s runs and `any` say above `n`.
    fn above_among(&self, slot: std::ops::Range<usize>, kind: Option<CallKind>, n: u64) -> u32 {
        let says = |r: &Recent| u32::from(r.above(n) == Some(true));
        says(&Self::recent_of(&self.words[slot]))
            + kind.map_or(0, |k| says(&self.kinds[Self::kind_slot(k)]))
            + says(&self.any)
    }

    /// Whether the words of a key's slot lie far above `n` (0 or 1, to count).
    fn far_above(slot: &[u32], n: u64) -> u32 {
        u32::from(Self::recent_of(slot).far_side(n) == Some(true))
    }

    /// Counts anew, at `n`, the slots that say above it.
    fn count_above(&mut self, n: u64) {
        let says = |r: &Recent| u32::from(r.above(n) == Some(true));
        let count = self.kinds.iter().map(says).sum::<u32>()
            + says(&self.any)
            + self.used_slots().map(|slot| says(&Self::recent_of(slot))).sum::<u32>();
        let far = self.used_slots().map(|slot| Self::far_above(slot, n)).sum::<u32>();
        (self.above_slots, self.far_above_slots, self.counted_at, self.since_count) =
            (count, far, Some(n), 0);
    }

    fn key_of(call: &CallDesc) -> u64 {
        call.timed_key()
    }

    /// A key's tag: never 0, which marks an empty slot.
    fn tag(key: u64) -> u64 {
        key.wrapping_add(1).max(1)
    }

    fn kind_slot(kind: CallKind) -> usize {
        kind.index().unwrap_or(NAMED_KINDS.len())
    }

    fn slots(&self) -> impl Iterator<Item = &[u32]> {
        self.words.chunks_exact(SLOT_WORDS)
    }

    /// The slots that ever held a key ([`Timed::used`]): the only pages of the table a count
    /// over them touches.
    fn used_slots(&self) -> impl Iterator<Item = &[u32]> {
        self.used.iter().enumerate().flat_map(move |(w, &bits)| {
            let mut bits = bits;
            std::iter::from_fn(move || {
                (bits != 0).then(|| {
                    let at = (w * 64 + bits.trailing_zeros() as usize) * SLOT_WORDS;
                    bits &= bits - 1;
                    &self.words[at..at + SLOT_WORDS]
                })
            })
        })
    }

    /// The words of `key`'s slot.
    fn slot(&self, key: u64) -> std::ops::Range<usize> {
        let at = (key % (self.words.len() / SLOT_WORDS) as u64) as usize * SLOT_WORDS;
        at..at + SLOT_WORDS
    }

    fn tag_of(slot: &[u32]) -> u64 {
        u64::from(slot[0]) | u64::from(slot[1]) << 32
    }

    fn recent_of(slot: &[u32]) -> Recent {
        Recent(slot[2..SEEN].try_into().expect("a slot holds a Recent"))
    }

    /// `key`'s runs, if its slot holds them (not another key's).
    fn runs_of(&self, key: u64) -> Option<Recent> {
        let slot = &self.words[self.slot(key)];
        (Self::tag_of(slot) == Self::tag(key)).then(|| Self::recent_of(slot))
    }

    fn predict(&self, key: u64, kind: Option<CallKind>) -> Prediction {
        if let Some(run) = self.runs_of(key).and_then(|r| r.typical()) {
            return Prediction { run, source: Source::Local };
        }
        match kind.and_then(|k| self.kinds[Self::kind_slot(k)].typical()).or_else(|| self.any.typical()) {
            Some(run) => Prediction { run, source: Source::Global },
            None => Prediction { run: 0, source: Source::Cold },
        }
    }

    /// Whether the next call of `key` will run longer than `n`: by the key's own runs, else
    /// its kind's, else those of any call; or, while that has lately been wrong more often
    /// than the plain majority of all calls at `n`, by that majority (so the decisions do not
    /// fall below the better of always and never moving for long), unless the key's last runs
    /// all lie far on one side of `n`.
    fn above(&self, key: u64, kind: Option<CallKind>, n: u64) -> bool {
        if self.trust_keys >= 0 {
            return self.above_by_keys(key, kind, n);
        }
        self.runs_of(key).and_then(|r| r.far_side(n)).unwrap_or_else(|| self.majority_above(n))
    }

    /// Whether the plain majority of all calls says above `n`.
    fn majority_above(&self, n: u64) -> bool {
        if self.cold {
            COLD_RUN > n
        } else {
            self.above_share >= 0x8000
        }
    }

    fn above_by_keys(&self, key: u64, kind: Option<CallKind>, n: u64) -> bool {
        if let Some(above) = self.runs_of(key).and_then(|r| r.above(n)) {
            return above;
        }
        kind.and_then(|k| self.kinds[Self::kind_slot(k)].above(n))
            .or_else(|| self.any.above(n))
            .unwrap_or(false)
    }

    /// Scores the keys' decision and the majority's at `n` against a run of `key` that ended
    /// above `n` or not.
    fn score(&mut self, key: u64, kind: Option<CallKind>, n: u64, ended_above: bool) {
        let by_keys = self.above_by_keys(key, kind, n) == ended_above;
        let by_majority = self.majority_above(n) == ended_above;
        if by_keys && !by_majority {
            self.trust_keys = (self.trust_keys + 1).min(TRUST_KEYS);
        } else if by_majority && !by_keys {
            self.trust_keys = (self.trust_keys - 1).max(-TRUST_KEYS);
        }
        if self.cold {
            (self.above_share, self.cold) = (if COLD_RUN > n { 0x8000 } else { 0 }, false);
        }
        let target = if ended_above { 0xffff } else { 0 };
        // A share handed on weighs as INHERITED_WEIGHT of this process's calls, which take over
        // at 1/(calls + weight) until that is the decay's own 1/256 (a shift: this runs inside
        // every interposed call the library decides).
        let divisor = self.since_start.saturating_add(INHERITED_WEIGHT);
        let early = divisor < 1 << ANY_DECAY_SHIFT;
        let step = |gap: u32| if early { gap / divisor } else { gap >> ANY_DECAY_SHIFT };
        if early {
            self.since_start += 1;
        }
        self.above_share = if target > self.above_share {
            self.above_share + step(target - self.above_share)
        } else {
            self.above_share - step(self.above_share - target)
        };
    }

    /// Learns that `key` ran for `run`; with `n`, also whether that was above the threshold
    /// decisions are made at.
    fn observe(&mut self, key: u64, kind: Option<CallKind>, run: u64, n: Option<u64>) {
        if let Some(n) = n {
            self.score(key, kind, n, run > n);
        }
        let tag = Self::tag(key);
        let range = self.slot(key);
        let before = self.counted_at.map(|at| {
            (self.above_among(range.clone(), kind, at), Self::far_above(&self.words[range.clone()], at))
        });
        let index = range.start / SLOT_WORDS;
        self.used[index / 64] |= 1 << (index % 64);
        let slot = &mut self.words[range.clone()];
        if Self::tag_of(slot) != tag {
            // A new key, or one that takes the slot of another (direct mapped).
            slot.fill(0);
            slot[0] = tag as u32;
            slot[1] = (tag >> 32) as u32;
        }
        let learn = |recent: &mut Recent| match n {
            Some(n) => recent.push_at(run, n),
            None => recent.push(run),
        };
        let mut recent = Self::recent_of(slot);
        learn(&mut recent);
        slot[2..SEEN].copy_from_slice(&recent.0);
        self.observed = self.observed.wrapping_add(1);
        slot[SEEN] = self.observed;
        if let Some(kind) = kind {
            learn(&mut self.kinds[Self::kind_slot(kind)]);
            self.kinds_seen[Self::kind_slot(kind)] = self.observed;
        }
        learn(&mut self.any);
        // Both counts usually stand at the same threshold: count this key's slots once then.
        let after = self.counted_at.map(|at| (at, self.above_among(range.clone(), kind, at)));
        if let Some(at) = self.none_above_lately {
            let above = match after {
                Some((counted, above)) if counted == at => above,
                _ => self.above_among(range.clone(), kind, at),
            };
            if above > 0 {
                self.none_above_lately = None;
            }
        }
        if let (Some((at, after)), Some((before, far_before))) = (after, before) {
            self.above_slots = self.above_slots + after - before;
            self.far_above_slots =
                self.far_above_slots + Self::far_above(&self.words[range], at) - far_before;
        }
        self.since_count = self.since_count.saturating_add(1);
        let n = n.or(self.counted_at).unwrap_or(0);
        if self.counted_at.is_none() || (self.counted_at != Some(n) && self.since_count >= RECOUNT_EVERY) {
            self.count_above(n);
        }
        if self.observed.is_multiple_of(IDLE_CHECK_EVERY) && self.above_slots > 0 {
            self.count_above_lately(n);
        }
    }

    fn learned(&self) -> Learned {
        let mut words = [0; LEARNED_WORDS];
        let recents = self.kinds.iter().chain([&self.any]);
        for (to, recent) in words.chunks_exact_mut(RECENT_WORDS).zip(recents) {
            to.copy_from_slice(&recent.0);
        }
        words[LEARNED_WORDS - 2] = self.above_share;
        words[LEARNED_WORDS - 1] = self.trust_keys as u32;
        Learned(words)
    }

    fn start_from(&mut self, learned: &Learned) {
        let mut recents =
            learned.0.chunks_exact(RECENT_WORDS).map(|w| Recent(w.try_into().expect("whole Recents")));
        for kind in &mut self.kinds {
            *kind = recents.next().expect("a Recent per kind");
        }
        self.any = recents.next().expect("a Recent for any call");
        (self.above_share, self.cold, self.since_start) = (learned.0[LEARNED_WORDS - 2], false, 0);
        self.trust_keys = learned.0[LEARNED_WORDS - 1] as i32;
        // The kinds' and any call's runs are new: the count of those above starts anew (none
        // is counted before a first observation).
        self.none_above_lately = None;
        if let Some(at) = self.counted_at {
            self.count_above(at);
        }
    }

    /// Sets [`Timed::none_above_lately`]: whether, at `n`, every key and kind that says
    /// "above" is idle. Reads every used slot, as [`Timed::count_above`] does.
    fn count_above_lately(&mut self, n: u64) {
        let busy = |seen: u32| self.observed.wrapping_sub(seen) < IDLE_AFTER;
        let says = |r: &Recent| r.above(n) == Some(true);
        let above = says(&self.any)
            || self.kinds.iter().zip(&self.kinds_seen).any(|(r, &seen)| busy(seen) && says(r))
            || self.used_slots().any(|slot| busy(slot[SEEN]) && says(&Self::recent_of(slot)));
        self.none_above_lately = (!above).then_some(n);
    }

    /// [`Timed::all_below`], except that a key or kind idle for [`IDLE_AFTER`] observations
    /// does not count: what a driver that skips the predictor while it holds gets wrong is the
    /// next call of such a key, until it is observed again.
    fn all_below_lately(&self, n: u64) -> bool {
        self.all_below(n) || (self.trust_keys >= 0 && self.none_above_lately.is_some_and(|at| at <= n))
    }
}

/// Words of a [`Learned`]: the recent runs of each call kind and of any call, the plain
/// majority's share above N and the trust in the keys.
pub const LEARNED_WORDS: usize = (NAMED_KINDS.len() + 2) * RECENT_WORDS + 2;

/// What a timed predictor learned that holds beyond its process (see the module docs): plain
/// words, so that processes can hand it on through a file, checked when read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Learned([u32; LEARNED_WORDS]);

impl Learned {
    /// The words to hand on.
    pub fn words(&self) -> &[u32; LEARNED_WORDS] {
        &self.0
    }

    /// Words handed on by [`Learned::words`]; `None` if they are not [`LEARNED_WORDS`] long
    /// or could not have come from a predictor (another build's layout, a damaged file).
    pub fn from_words(words: &[u32]) -> Option<Learned> {
        let words: [u32; LEARNED_WORDS] = words.try_into().ok()?;
        let recents_sound = words[..LEARNED_WORDS - 2]
            .chunks_exact(RECENT_WORDS)
            .all(|w| Recent(w.try_into().expect("whole Recents")).is_sound());
        let trust = words[LEARNED_WORDS - 1] as i32;
        (recents_sound && words[LEARNED_WORDS - 2] <= 0xffff && (-TRUST_KEYS..=TRUST_KEYS).contains(&trust))
            .then_some(Learned(words))
    }
}

/// The run-length predictor. Pure: `predict` reads, `observe` learns.
#[derive(Clone, Debug)]
pub struct RunLengthPredictor {
    form: TableForm,
    entries: Vec<Option<Entry>>,
    /// Fully associative only: key → slot (the CAM lookup). A fixed hasher: the keys are the
    /// program's own calls, and a random one costs every process a `getrandom` at start-up.
    slots: HashMap<u64, usize, BuildHasherDefault<DefaultHasher>>,
    /// Fully associative only: which slot to evict.
    recency: Recency,
    recent: [u64; GLOBAL_HISTORY],
    recent_len: usize,
    /// The timed form's state (`None` for the paper's forms).
    timed: Option<Timed>,
}

/// Whether `predicted` is within ±[`TOLERANCE_PERCENT`] of `actual`.
pub fn within_tolerance(predicted: u64, actual: u64) -> bool {
    let diff = u128::from(predicted.abs_diff(actual));
    diff * 100 <= u128::from(actual) * u128::from(TOLERANCE_PERCENT)
}

impl RunLengthPredictor {
    /// A predictor with the given table; a table of zero entries is an error.
    pub fn new(form: TableForm) -> Result<RunLengthPredictor, OffloadError> {
        let entries = form.entries();
        if entries == 0 {
            return Err(OffloadError::EmptyTable);
        }
        Ok(RunLengthPredictor {
            form,
            // The timed form keeps its own table.
            entries: vec![None; if matches!(form, TableForm::Timed { .. }) { 0 } else { entries }],
            slots: HashMap::with_capacity_and_hasher(
                if matches!(form, TableForm::FullyAssociative { .. }) { entries } else { 0 },
                BuildHasherDefault::default(),
            ),
            recency: Recency::new(if matches!(form, TableForm::FullyAssociative { .. }) {
                entries
            } else {
                0
            }),
            recent: [0; GLOBAL_HISTORY],
            recent_len: 0,
            timed: match form {
                TableForm::Timed { entries } => Some(Timed::new(entries)),
                _ => None,
            },
        })
    }

    /// The predicted run length of `call`: by its key ([`CallDesc::key`]) in the paper's
    /// forms, by kind, call site, size bucket and descriptor-or-path in the timed one.
    pub fn predict_call(&self, call: &CallDesc) -> Prediction {
        match &self.timed {
            Some(timed) => timed.predict(Timed::key_of(call), Some(call.kind)),
            None => self.predict(call.key()),
        }
    }

    /// Whether `call` will run longer than `n`, the threshold the caller decides at. The
    /// paper's forms compare the predicted run with `n`. The timed form does too, unless
    /// the call's key (or, for a new key, its kind, or any call) has been on one side of `n`
    /// more reliably than its predicted run said: then it follows that majority. So on a key
    /// whose runs land on either side at random it does no worse than always or never
    /// moving it. Learn with [`RunLengthPredictor::observe_call`] at the same `n`.
    pub fn above_call(&self, call: &CallDesc, n: u64) -> bool {
        match &self.timed {
            Some(timed) => timed.above(Timed::key_of(call), Some(call.kind), n),
            None => self.predict(call.key()).run > n,
        }
    }

    /// Whether [`RunLengthPredictor::above_call`] would say no for every call at any
    /// threshold from `n` up: a driver may then skip asking. Always false for the paper's
    /// forms, which keep no such count.
    pub fn all_below(&self, n: u64) -> bool {
        self.timed.as_ref().is_some_and(|timed| timed.all_below(n))
    }

    /// [`RunLengthPredictor::all_below`], not counting keys and call kinds that have not been
    /// observed lately (16 384 to 20 480 observations): a driver that skips asking while this holds runs
    /// the next call of such a key where it is, until that call is observed again.
    pub fn all_below_lately(&self, n: u64) -> bool {
        self.timed.as_ref().is_some_and(|timed| timed.all_below_lately(n))
    }

    /// Learn that `call` ran for `run`, where decisions are made at threshold `n` (see
    /// [`RunLengthPredictor::above_call`]; the paper's forms ignore `n`).
    pub fn observe_call(&mut self, call: &CallDesc, run: u64, n: u64) {
        match &mut self.timed {
            Some(timed) => {
                timed.observe(Timed::key_of(call), Some(call.kind), run, Some(n));
                self.remember_global(run);
            }
            None => self.observe(call.key(), run),
        }
    }

    /// What this predictor learned that holds beyond its process (`None` for the paper's
    /// forms, whose table is all they learn).
    pub fn learned(&self) -> Option<Learned> {
        self.timed.as_ref().map(Timed::learned)
    }

    /// Starts from what another process's predictor learned, keeping this one's keys (a
    /// process starts with none). Nothing for the paper's forms.
    pub fn start_from(&mut self, learned: &Learned) {
        if let Some(timed) = &mut self.timed {
            timed.start_from(learned);
        }
    }

    /// The table's form.
    pub fn form(&self) -> TableForm {
        self.form
    }

    /// The predicted run length for the call with this key.
    pub fn predict(&self, key: u64) -> Prediction {
        if let Some(timed) = &self.timed {
            return match timed.predict(key, None) {
                Prediction { source: Source::Cold, .. } => self.global(),
                local => local,
            };
        }
        match self.slot_of(key).and_then(|slot| self.entries[slot]) {
            Some(entry) if entry.confidence > 0 => Prediction { run: entry.last, source: Source::Local },
            _ => self.global(),
        }
    }

    /// The mean of the last (up to three) observed runs of any key.
    pub fn global(&self) -> Prediction {
        if self.recent_len == 0 {
            return Prediction { run: 0, source: Source::Cold };
        }
        let sum: u128 = self.recent[..self.recent_len].iter().map(|&r| u128::from(r)).sum();
        Prediction { run: (sum / self.recent_len as u128) as u64, source: Source::Global }
    }

    /// The entry's confidence for this key (None when the table has no entry for it).
    pub fn confidence(&self, key: u64) -> Option<u8> {
        self.slot_of(key).and_then(|slot| self.entries[slot]).map(|entry| entry.confidence)
    }

    /// Learn that the call with this key ran for `run`.
    pub fn observe(&mut self, key: u64, run: u64) {
        if let Some(timed) = &mut self.timed {
            timed.observe(key, None, run, None);
            self.remember_global(run);
            return;
        }
        match self.slot_of(key) {
            Some(slot) => {
                if matches!(self.form, TableForm::FullyAssociative { .. }) {
                    self.recency.touch(slot);
                }
                let entry = self.entries[slot].get_or_insert(Entry { key, last: run, confidence: 0 });
                if within_tolerance(entry.last, run) {
                    entry.confidence = (entry.confidence + 1).min(CONFIDENCE_MAX);
                } else {
                    entry.confidence = entry.confidence.saturating_sub(1);
                }
                entry.key = key;
                entry.last = run;
            }
            None => self.insert(key, run),
        }
        self.remember_global(run);
    }

    /// Number of live entries.
    pub fn len(&self) -> usize {
        match &self.timed {
            Some(timed) => timed.slots().filter(|slot| Timed::tag_of(slot) != 0).count(),
            None => self.entries.iter().filter(|e| e.is_some()).count(),
        }
    }

    /// Whether nothing was observed yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn slot_of(&self, key: u64) -> Option<usize> {
        match self.form {
            TableForm::FullyAssociative { .. } => self.slots.get(&key).copied(),
            TableForm::DirectMapped { entries } => {
                let slot = (key % entries as u64) as usize;
                self.entries[slot].map(|_| slot)
            }
            TableForm::Timed { .. } => None,
        }
    }

    /// Fully associative miss (direct mapped never misses an occupied slot, and fills an
    /// empty one here too).
    fn insert(&mut self, key: u64, run: u64) {
        let slot = match self.form {
            TableForm::DirectMapped { entries } | TableForm::Timed { entries } => {
                (key % entries as u64) as usize
            }
            TableForm::FullyAssociative { .. } => {
                // Slots fill in order and are only ever reused, so the filled ones are the
                // first `slots.len()`.
                let slot = if self.slots.len() < self.entries.len() {
                    self.slots.len()
                } else {
                    let victim = self.recency.oldest().expect("a full table has entries");
                    if let Some(old) = self.entries[victim] {
                        self.slots.remove(&old.key);
                    }
                    victim
                };
                self.slots.insert(key, slot);
                self.recency.touch(slot);
                slot
            }
        };
        self.entries[slot] = Some(Entry { key, last: run, confidence: CONFIDENCE_NEW });
    }

    fn remember_global(&mut self, run: u64) {
        if self.recent_len < GLOBAL_HISTORY {
            self.recent[self.recent_len] = run;
            self.recent_len += 1;
        } else {
            self.recent.rotate_left(1);
            self.recent[GLOBAL_HISTORY - 1] = run;
        }
    }
}

#[cfg(test)]
mod recent_tests {
    use super::{Recent, HISTORY};
    use proptest::prelude::*;

    proptest! {
        /// The kept sorted copy always equals the last runs, sorted: the typical run is their
        /// lower tercile or their median.
        #[test]
        fn typical_is_a_low_quantile_of_the_last_runs(runs in proptest::collection::vec(0u64..1000, 1..40)) {
            let mut recent = Recent::default();
            for (i, &run) in runs.iter().enumerate() {
                recent.push(run);
                let start = (i + 1).saturating_sub(HISTORY);
                let mut last: Vec<u64> = runs[start..=i].to_vec();
                last.sort_unstable();
                let (tercile, median) = (last[(last.len() - 1) / 3], last[(last.len() - 1) / 2]);
                let typical = recent.typical().unwrap();
                prop_assert!(typical == tercile || typical == median, "{typical} of {last:?}");
            }
        }
    }

    #[test]
    fn the_quantile_that_has_been_closer_is_the_typical_run() {
        // Short runs with rare spikes: the tercile, which ignores them.
        let mut spiky = Recent::default();
        for i in 0..60u64 {
            spiky.push(if i % 7 == 3 { 40_000 } else { 1_000 + i });
        }
        assert!(spiky.typical().unwrap() < 2_000);
        // Two lengths at random, long two times in three: the median, which says long.
        let mut two = Recent::default();
        for i in 0..60u64 {
            two.push(if i % 3 == 1 { 500 } else { 3_000 });
        }
        assert_eq!(two.typical(), Some(3_000));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fa(entries: usize) -> RunLengthPredictor {
        RunLengthPredictor::new(TableForm::FullyAssociative { entries }).unwrap()
    }

    fn dm(entries: usize) -> RunLengthPredictor {
        RunLengthPredictor::new(TableForm::DirectMapped { entries }).unwrap()
    }

    /// Replays `(key, actual)` and returns the prediction made before each step.
    fn replay(p: &mut RunLengthPredictor, trace: &[(u64, u64)]) -> Vec<(u64, Source)> {
        trace
            .iter()
            .map(|&(key, run)| {
                let pred = p.predict(key);
                p.observe(key, run);
                (pred.run, pred.source)
            })
            .collect()
    }

    #[test]
    fn hand_built_trace_exact_per_step() {
        use Source::*;
        // key 1 steady at 1000, key 2 jumps around, key 1 drifts within 5 % then jumps.
        let trace =
            [(1, 1000), (1, 1000), (2, 300), (2, 900), (2, 100), (1, 1040), (1, 5000), (1, 5000), (2, 100)];
        let mut p = fa(4);
        let got = replay(&mut p, &trace);
        let want = vec![
            (0, Cold),      // nothing seen yet
            (1000, Local),  // new entry starts at confidence 1; 1000 hit → 2
            (1000, Global), // key 2 unseen: mean(1000, 1000)
            (300, Local),   // key 2's first run; 900 misses → confidence 0
            (733, Global),  // key 2 not confident: mean(1000, 300, 900); 100 misses, stays 0
            (1000, Local),  // key 1 at 2; 1040 is within 5 % → 3
            (1040, Local),  // 5000 misses → 2
            (5000, Local),  // 5000 hits → 3
            (3680, Global), // key 2 still 0: mean(1040, 5000, 5000); 100 hits its last → 1
        ];
        assert_eq!(got, want);
        assert_eq!(p.confidence(1), Some(3));
        assert_eq!(p.confidence(2), Some(1));
    }

    #[test]
    fn confidence_saturates_at_three_and_recovers_after_one_miss() {
        let mut p = fa(2);
        for _ in 0..10 {
            p.observe(9, 500);
        }
        assert_eq!(p.confidence(9), Some(CONFIDENCE_MAX));
        p.observe(9, 2000);
        assert_eq!(p.confidence(9), Some(2));
        assert_eq!(p.predict(9), Prediction { run: 2000, source: Source::Local });
    }

    #[test]
    fn fully_associative_evicts_least_recently_used() {
        let mut p = fa(2);
        p.observe(1, 10);
        p.observe(2, 20);
        p.observe(1, 10); // 1 is now more recent than 2
        p.observe(3, 30); // evicts 2
        assert_eq!(p.len(), 2);
        assert_eq!(p.confidence(2), None);
        assert_eq!(p.predict(1), Prediction { run: 10, source: Source::Local });
        assert_eq!(p.predict(3), Prediction { run: 30, source: Source::Local });
    }

    proptest::proptest! {
        /// The table holds exactly the keys a plain least-recently-used list would: the
        /// `entries` most recently observed distinct keys.
        #[test]
        fn fully_associative_keeps_the_most_recently_observed_keys(
            entries in 1usize..6,
            keys in proptest::collection::vec(0u64..10, 0..200),
        ) {
            let mut p = fa(entries);
            let mut model: Vec<u64> = Vec::new(); // most recent last
            for &key in &keys {
                p.observe(key, 100);
                model.retain(|&k| k != key);
                model.push(key);
                if model.len() > entries {
                    model.remove(0);
                }
                for k in 0..10 {
                    proptest::prop_assert_eq!(p.confidence(k).is_some(), model.contains(&k), "key {}", k);
                }
            }
        }
    }

    #[test]
    fn direct_mapped_keys_that_collide_share_an_entry() {
        let mut p = dm(10);
        p.observe(3, 100);
        // 13 maps to slot 3 too: the tagless table predicts key 3's run for it.
        assert_eq!(p.predict(13), Prediction { run: 100, source: Source::Local });
        p.observe(13, 900);
        assert_eq!(p.confidence(3), Some(0));
        assert_eq!(p.predict(3).source, Source::Global);
    }

    #[test]
    fn the_timed_form_predicts_typical_runs_by_key_then_by_kind() {
        let mut p = RunLengthPredictor::new(TableForm::TIMED).unwrap();
        let fsync = |site| CallDesc::new(CallKind::Fsync, 3, 0, site);
        assert_eq!(p.predict_call(&fsync(1)).source, Source::Cold);
        for run in [1_000, 900_000, 1_100, 1_050] {
            p.observe_call(&fsync(1), run, 10_000); // one outlier among four
        }
        assert_eq!(p.predict_call(&fsync(1)), Prediction { run: 1_050, source: Source::Local });
        // Another site of the same kind: the kind's typical run, not the last call of any kind.
        p.observe_call(&CallDesc::new(CallKind::Read, 3, 4096, 9), 50, 10_000);
        assert_eq!(p.predict_call(&fsync(2)), Prediction { run: 1_050, source: Source::Global });
        // Only the last nine runs count: a phase of long calls takes over.
        for _ in 0..9 {
            p.observe_call(&fsync(1), 50_000, 10_000);
        }
        assert_eq!(p.predict_call(&fsync(1)).run, 50_000);
        // Sizes in one power of two share a key; which descriptor does not matter, whether
        // there is one does (`statx(AT_FDCWD, path)` walks a path, `statx(fd, "")` does not).
        let read = |fd, size| CallDesc::new(CallKind::Read, fd, size, 9);
        assert_eq!(read(3, 4096).timed_key(), read(7, 8000).timed_key());
        assert_ne!(read(3, 4096).timed_key(), read(3, 9000).timed_key());
        let statx = |fd| CallDesc::new(CallKind::Statx, fd, 0, 9);
        assert_eq!(statx(3).timed_key(), statx(4).timed_key());
        assert_ne!(statx(3).timed_key(), statx(-100).timed_key());
        assert_eq!(p.predict_call(&read(8, 5000)).run, 50);
        assert_eq!(TableForm::TIMED.label(), "time1500");
    }

    #[test]
    fn the_timed_table_is_direct_mapped_with_tags() {
        let mut p = RunLengthPredictor::new(TableForm::Timed { entries: 16 }).unwrap();
        // Keys 0 and u64::MAX are keys like any other (a tag of 0 would mean "empty").
        p.observe(0, 10);
        p.observe(u64::MAX, 20);
        assert_eq!(p.predict(0), Prediction { run: 10, source: Source::Local });
        assert_eq!(p.predict(u64::MAX), Prediction { run: 20, source: Source::Local });
        // 17 takes key 1's slot: key 1 is forgotten, not answered with 17's runs.
        p.observe(1, 100);
        p.observe(17, 1700);
        assert_eq!(p.predict(17), Prediction { run: 1700, source: Source::Local });
        assert_ne!(p.predict(1).source, Source::Local);
    }

    #[test]
    fn empty_table_is_an_error() {
        assert!(matches!(
            RunLengthPredictor::new(TableForm::DirectMapped { entries: 0 }),
            Err(OffloadError::EmptyTable)
        ));
    }

    #[test]
    fn tolerance_is_five_percent_both_ways() {
        assert!(within_tolerance(105, 100));
        assert!(within_tolerance(95, 100));
        assert!(!within_tolerance(106, 100));
        assert!(!within_tolerance(94, 100));
        assert!(within_tolerance(0, 0));
        assert!(!within_tolerance(1, 0));
        assert!(within_tolerance(u64::MAX, u64::MAX));
    }

    proptest! {
        #[test]
        fn invariants_hold_on_any_trace(
            trace in proptest::collection::vec((0u64..64, 0u64..1_000_000), 0..300),
            entries in 1usize..40,
            direct in any::<bool>(),
        ) {
            let form = if direct { TableForm::DirectMapped { entries } } else { TableForm::FullyAssociative { entries } };
            let mut p = RunLengthPredictor::new(form).unwrap();
            let mut last_of = HashMap::new();
            for &(key, run) in &trace {
                let pred = p.predict(key);
                if pred.source == Source::Local && !direct {
                    // A fully-associative local prediction is exactly that key's last run.
                    prop_assert_eq!(Some(&pred.run), last_of.get(&key));
                }
                p.observe(key, run);
                last_of.insert(key, run);
                prop_assert!(p.len() <= entries);
                prop_assert!(p.confidence(key).unwrap() <= CONFIDENCE_MAX);
            }
            if let Some(&(_, run)) = trace.last() {
                // The global prediction is bounded by the runs it averages.
                let g = p.global().run;
                let tail: Vec<u64> = trace.iter().rev().take(GLOBAL_HISTORY).map(|&(_, r)| r).collect();
                prop_assert!(g >= *tail.iter().min().unwrap() && g <= *tail.iter().max().unwrap());
                prop_assert!(run <= 1_000_000);
            }
        }
    }

    proptest! {
        /// The count of slots above a threshold stays what a fresh count gives, and while it
        /// says no call would move, no call of a seen key, a new key or any kind would.
        #[test]
        fn all_below_means_no_call_would_move(
            trace in proptest::collection::vec((0u64..48, 0usize..4, 0u64..16_000, 0usize..3), 1..400),
            entries in 1usize..70,
        ) {
            let kinds = [CallKind::Read, CallKind::Fstat, CallKind::Fsync, CallKind::Other(7)];
            let thresholds = [1000, 2000, 3000];
            let mut p = RunLengthPredictor::new(TableForm::Timed { entries }).unwrap();
            for &(site, kind, run, n) in &trace {
                let n = thresholds[n];
                let call = CallDesc::new(kinds[kind], 3, 0, site);
                p.observe_call(&call, run, n);
                let timed = p.timed.as_ref().unwrap();
                let mut fresh = timed.clone();
                fresh.count_above(timed.counted_at.unwrap());
                prop_assert_eq!(timed.above_slots, fresh.above_slots);
                prop_assert_eq!(timed.far_above_slots, fresh.far_above_slots);
                for n in thresholds {
                    if p.all_below(n) {
                        for site in 0..64 {
                            for kind in kinds {
                                prop_assert!(!p.above_call(&CallDesc::new(kind, 3, 0, site), n));
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn all_below_follows_the_runs() {
        let mut p = RunLengthPredictor::new(TableForm::TIMED).unwrap();
        let short = CallDesc::new(CallKind::Fstat, 3, 0, 1);
        let long = CallDesc::new(CallKind::Fsync, 3, 0, 2);
        assert!(!p.all_below(1000), "before any run, the first calls are taken to run COLD_RUN");
        assert!(p.all_below(COLD_RUN), "... so nothing moves at N from COLD_RUN up");
        for _ in 0..20 {
            p.observe_call(&short, 300, 1000);
        }
        assert!(p.all_below(1000));
        assert!(p.all_below(5000), "a higher threshold moves no more");
        for _ in 0..20 {
            p.observe_call(&long, 900_000, 1000);
        }
        assert!(!p.all_below(1000));
        assert!(p.above_call(&long, 1000));
    }

    #[test]
    fn a_cold_process_takes_its_first_calls_to_run_long_until_they_say_otherwise() {
        let (low, high) = (COLD_RUN / 3, COLD_RUN * 2);
        let open = CallDesc::new(CallKind::Openat, 3, 0, 1);
        let mut p = RunLengthPredictor::new(TableForm::TIMED).unwrap();
        assert!(p.above_call(&open, low), "a first call runs long");
        assert!(!p.above_call(&open, high), "... but not that long");
        // One short call, and the plain majority says "below", for a call of any other key too.
        p.observe_call(&open, low / 2, low);
        assert!(!p.above_call(&CallDesc::new(CallKind::Fstat, 4, 0, 2), low));
        // Long calls keep it at "above".
        let mut p = RunLengthPredictor::new(TableForm::TIMED).unwrap();
        for _ in 0..3 {
            p.observe_call(&open, high, low);
        }
        assert!(p.above_call(&CallDesc::new(CallKind::Fstat, 4, 0, 2), low));
    }

    #[test]
    fn a_key_far_from_n_decides_before_the_keys_have_earned_their_place() {
        // `file` reading a pipe (out-of-sample/file.csv): the process before it handed on a
        // firm "below" (its stats all ran under N), then each read waits milliseconds.
        let n = 5_000;
        let mut first = timed();
        for i in 0..24 {
            first.observe_call(&CallDesc::new(CallKind::Stat, -1, 0, 0x100 + i % 3), 400 + 50 * i, n);
        }
        let mut next = timed();
        next.start_from(&first.learned().unwrap());
        assert!(next.timed.as_ref().unwrap().trust_keys < 0, "the plain majority decides");
        let read = CallDesc::new(CallKind::Read, 0, 8192, 0x4000);
        let mut moved = Vec::new();
        for ms in [17, 5, 6, 17, 14, 7, 10, 4, 4] {
            moved.push(next.above_call(&read, n));
            next.observe_call(&read, ms * 1_000_000, n);
        }
        // The first read and the one after it cannot know; every one after two long runs does.
        assert_eq!(moved, [false, false, true, true, true, true, true, true, true]);
        assert!(!next.all_below(n), "a driver must not skip asking");
        assert!(!next.above_call(&CallDesc::new(CallKind::Stat, -1, 0, 0x101), n), "stats still stay");
    }

    #[test]
    fn a_majority_handed_on_gives_way_to_the_new_process_own_calls() {
        // A program whose reads wait milliseconds hands on a firm "above"; the next program's
        // calls all run under N. The handed-on majority counts, but as a few dozen of the new
        // process's calls, not as the last 256.
        let n = 1_000;
        let mut first = timed();
        let read = CallDesc::new(CallKind::Read, 0, 8192, 0x4000);
        for _ in 0..200 {
            first.observe_call(&read, 10_000_000, n);
        }
        let mut next = timed();
        next.start_from(&first.learned().unwrap());
        let majority = |p: &RunLengthPredictor| p.timed.as_ref().unwrap().majority_above(n);
        assert!(majority(&next), "what the process before learned holds at first");
        let stat = CallDesc::new(CallKind::Stat, -1, 0, 0x100);
        let mut turned_after = None;
        for call in 1..=64 {
            next.observe_call(&stat, 900, n);
            if turned_after.is_none() && !majority(&next) {
                turned_after = Some(call);
            }
        }
        let turned_after = turned_after.expect("the new process's own calls turn the majority");
        assert!((16..=48).contains(&turned_after), "turned after {turned_after} calls");
        // A process that started from nothing keeps the slower decay of a long run.
        let mut alone = timed();
        for _ in 0..200 {
            alone.observe_call(&read, 10_000_000, n);
        }
        for _ in 0..48 {
            alone.observe_call(&stat, 900, n);
        }
        assert!(majority(&alone), "48 calls do not outweigh the process's own 200");
    }

    #[test]
    fn a_key_near_n_leaves_the_decision_to_the_majority() {
        let n = 5_000;
        let mut p = timed();
        let (stat, read) = (CallDesc::new(CallKind::Stat, -1, 0, 1), CallDesc::new(CallKind::Read, 0, 64, 2));
        for _ in 0..40 {
            p.observe_call(&stat, 300, n);
        }
        assert!(p.all_below(n));
        p.observe_call(&read, 30_000, n);
        p.observe_call(&read, 30_000, n);
        assert!(p.timed.as_ref().unwrap().trust_keys < 0 && p.above_call(&read, n) && !p.all_below(n));
        // A run within a factor of FAR of N: the key is not far any more.
        p.observe_call(&read, 3 * n, n);
        assert!(p.timed.as_ref().unwrap().trust_keys < 0, "the plain majority still decides");
        assert!(!p.above_call(&read, n) && p.all_below(n));
    }

    #[test]
    fn a_long_key_gone_idle_no_longer_keeps_calls_from_passing_by() {
        let mut p = RunLengthPredictor::new(TableForm::TIMED).unwrap();
        let open = CallDesc::new(CallKind::Openat, 3, 0, 1);
        let read = CallDesc::new(CallKind::Read, 3, 1, 2);
        // Opens among many reads: the keys are right where the plain majority is not, so they
        // decide.
        for _ in 0..20 {
            p.observe_call(&open, 8000, 1000);
            for _ in 0..20 {
                p.observe_call(&read, 100, 1000);
            }
        }
        assert!(p.above_call(&open, 1000));
        assert!(!p.all_below(1000) && !p.all_below_lately(1000), "the open key was seen lately");
        for _ in 0..IDLE_AFTER + IDLE_CHECK_EVERY {
            p.observe_call(&read, 100, 1000);
        }
        assert!(!p.all_below(1000), "all_below stays exact");
        assert!(p.all_below_lately(1000), "the open key and its kind are idle");
        assert!(p.above_call(&open, 1000), "what it predicts is unchanged");
        p.observe_call(&open, 8000, 1000);
        assert!(!p.all_below_lately(1000), "seen again, it counts at once");
    }

    /// A run of `n` calls of several keys: each key's runs are one of two lengths, drawn at
    /// random with its own odds (a xorshift generator: the same trace every time).
    fn two_length_keys(seed: u64, keys: &[(u64, u64, u32)], n: usize) -> Vec<(CallDesc, u64)> {
        let mut x = seed | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        (0..n)
            .map(|_| {
                let (short, long, percent_long) = keys[(next() % keys.len() as u64) as usize];
                let site = short; // one call site per key
                let run = if next() % 100 < u64::from(percent_long) { long } else { short };
                (CallDesc::new(CallKind::Fstat, 3, 0, site), run + next() % (run / 10 + 1))
            })
            .collect()
    }

    /// Decisions at `n` over `trace`, asking before telling: (right, best constant rule).
    fn decide_all(trace: &[(CallDesc, u64)], n: u64) -> (f64, f64) {
        let mut p = RunLengthPredictor::new(TableForm::TIMED).unwrap();
        let mut right = 0;
        for (call, run) in trace {
            right += usize::from(p.above_call(call, n) == (*run > n));
            p.observe_call(call, *run, n);
        }
        let above = trace.iter().filter(|(_, run)| *run > n).count();
        let len = trace.len() as f64;
        (right as f64 / len, above.max(trace.len() - above) as f64 / len)
    }

    #[test]
    fn a_key_of_two_random_lengths_is_decided_by_its_majority() {
        // Long seven times in ten: the lower tercile of nine runs says "short" about half the
        // time (right about 48 %); always moving is right 70 %.
        let trace = two_length_keys(7, &[(500, 3_000, 70)], 6_000);
        let (right, constant) = decide_all(&trace, 2_000);
        assert!(right >= constant - 0.01, "right {right}, best constant {constant}");
    }

    #[test]
    fn a_key_whose_runs_take_turns_is_decided_by_its_pattern() {
        // `find` stats each entry twice from one call site: a short run, then a long one. The
        // key's majority and its typical run are both right half the time at best; the side of
        // its last two runs says what comes next.
        for pattern in [&[300u64, 2_500][..], &[300, 300, 2_500], &[2_500, 2_500, 300]] {
            let trace: Vec<(CallDesc, u64)> = (0..3_000)
                .map(|i| {
                    (CallDesc::new(CallKind::Fstat, 8, 0, 42), pattern[i % pattern.len()] + i as u64 % 7)
                })
                .collect();
            let (right, constant) = decide_all(&trace, 1_000);
            assert!(right > 0.97, "{pattern:?}: right {right}, best constant {constant}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// However a few keys' runs fall around the threshold, the decisions stay within a
        /// learning cost of the better of always and never moving. (4 points: a key long half
        /// the time cannot be learned, and the constant chosen afterwards wins by the luck of
        /// the draw. 3 points held for 4500 cases; a key long 52 % of the time, the first case
        /// in the regressions file, then came 3.2 points below.)
        #[test]
        fn decisions_stay_near_the_best_constant_rule(
            seed in any::<u64>(),
            keys in proptest::collection::vec((100u64..5_000, 1u64..20, 0u32..=100), 1..6),
            n in 200u64..20_000,
        ) {
            let keys: Vec<(u64, u64, u32)> = keys.iter().map(|&(short, times, p)| (short, short * times, p)).collect();
            let trace = two_length_keys(seed, &keys, 4_000);
            let (right, constant) = decide_all(&trace, n);
            prop_assert!(right >= constant - 0.04, "right {right}, best constant {constant}, keys {keys:?}, n {n}");
        }
    }

    fn timed() -> RunLengthPredictor {
        RunLengthPredictor::new(TableForm::Timed { entries: 64 }).unwrap()
    }

    #[test]
    fn a_process_that_starts_from_what_another_learned_decides_its_first_calls_by_it() {
        let n = 5_000;
        // The first process: every fstat ran 8 µs, above N, from one call site.
        let mut first = timed();
        for _ in 0..50 {
            first.observe_call(&CallDesc::new(CallKind::Fstat, 3, 0, 0x4000), 8_000, n);
        }
        let learned = first.learned().expect("the timed form hands on what it learned");
        assert_eq!(Learned::from_words(learned.words()), Some(learned.clone()));
        // The next process calls fstat from another site (another program, another load
        // address): a fresh predictor says "below" (N is above COLD_RUN), one started from the
        // first says "above".
        let call = CallDesc::new(CallKind::Fstat, 4, 0, 0x9000);
        let mut next = timed();
        assert!(!next.above_call(&call, n));
        next.start_from(&learned);
        assert!(next.above_call(&call, n));
        assert!(!next.all_below(n), "a driver must not skip asking a predictor that would move");
        // What it learned of its own still counts: its fstats now run 200 ns.
        for _ in 0..30 {
            next.observe_call(&call, 200, n);
        }
        assert!(!next.above_call(&call, n));
        // The paper's forms learn only their table: nothing to hand on.
        assert!(fa(8).learned().is_none());
    }

    #[test]
    fn words_that_no_predictor_could_have_written_are_refused() {
        let good = timed().learned().unwrap();
        assert!(Learned::from_words(&good.words()[1..]).is_none(), "too short");
        let mut words = *good.words();
        words[LEN] = HISTORY as u32 + 1;
        assert!(Learned::from_words(&words).is_none(), "more runs than a Recent keeps");
        let mut words = *good.words();
        words[LEARNED_WORDS - 1] = (TRUST_KEYS + 1) as u32;
        assert!(Learned::from_words(&words).is_none(), "trust out of its range");
        let mut words = *good.words();
        (words[LEN], words[SORTED], words[SORTED + 1]) = (2, 9, 3);
        assert!(Learned::from_words(&words).is_none(), "unsorted runs");
    }

    proptest! {
        /// Whatever words are read back, a predictor started from the ones accepted decides
        /// and learns without panicking.
        #[test]
        fn any_accepted_words_are_safe_to_start_from(
            words in proptest::collection::vec(any::<u32>(), LEARNED_WORDS),
            runs in proptest::collection::vec((0u64..4, 0u64..100_000), 0..64),
            mostly_sound in any::<bool>(),
        ) {
            let mut words = words;
            if mostly_sound {
                // Mostly-sound words: each Recent's counts and scores in range, runs sorted.
                for recent in words[..LEARNED_WORDS - 2].chunks_exact_mut(RECENT_WORDS) {
                    recent[LEN] %= HISTORY as u32 + 1;
                    recent[NEXT] %= HISTORY as u32;
                    recent[SORTED..SORTED + HISTORY].sort_unstable();
                    recent[MISS_TERCILE] %= MISS_BOUND;
                    recent[MISS_MEDIAN] %= MISS_BOUND;
                }
                words[LEARNED_WORDS - 2] &= 0xffff;
                words[LEARNED_WORDS - 1] = ((words[LEARNED_WORDS - 1] % 65) as i32 - TRUST_KEYS) as u32;
            }
            if let Some(learned) = Learned::from_words(&words) {
                let mut p = timed();
                p.start_from(&learned);
                for &(site, run) in &runs {
                    let call = CallDesc::new(CallKind::Read, 3, 64, site);
                    let _ = p.above_call(&call, 1_000);
                    let _ = p.predict_call(&call);
                    p.observe_call(&call, run, 1_000);
                }
                prop_assert!(Learned::from_words(p.learned().unwrap().words()).is_some());
            }
        }
    }
}
