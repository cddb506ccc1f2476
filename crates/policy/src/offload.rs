//! Which OS work to move to a service core (selective-os-offload; fast-core-switching §3.6).
//!
//! A call arrives as a [`CallDesc`] value; an [`OffloadPolicy`] answers [`Decision::Local`] or
//! [`Decision::Offload`]; after the call the driver reports how long it ran and how long its
//! caller waited ([`OffloadPolicy::observe`], a [`CallCost`]) and, once per epoch, how well the application progressed
//! ([`OffloadPolicy::epoch_end`]). Times are in the driver's unit (runtime: ns, sim: cycles).
//!
//! The policies, in the papers' terms:
//!
//! | policy | paper | offloads when |
//! | --- | --- | --- |
//! | `Never` | baseline | never |
//! | `Always` | — | always |
//! | `SizeThreshold` | RWThresh (4 KB) | a byte-moving call asks for at least `bytes`; the other named calls (open, stat family, fsync, poll, …) always; `Other` calls never |
//! | `StaticProfile` | SI | the call's kind is in a set chosen from a profile (mean run ≥ 2 × hop cost) |
//! | `Predicted` | HI / DI | the run-length predictor expects more than N (N optionally tuned; never below the measured cost of a move) |
//! | `Measured` | — | moving the call's key was measured to cost its caller less than running it here ([`Measured`]) |
//! | `Adaptive` | the tuner's epoch sampling, over policies | the arm the [`crate::payoff`] sampler settled on: it starts in `Measured` when that is its first arm, else in `Never`, and falls back to `Never` when that pays |
//!
//! Queue-aware: the policies that have a run-length estimate (`StaticProfile`, `Predicted`)
//! keep a call local when the service core's expected queue delay would eat the gain, i.e.
//! when the estimate does not clear the threshold plus the queue delay. `Always` and
//! `SizeThreshold` ignore the queue, as the papers' baselines do.
//!
//! # Examples
//! ```
//! use corehop_policy::offload::{CallCost, CallDesc, CallKind, Decision, OffloadPolicy};
//!
//! let mut policy: OffloadPolicy = "predicted:fa:5000".parse().unwrap();
//! let call = CallDesc::new(CallKind::Fsync, 3, 0, 42);
//! assert_eq!(policy.decide(&call, 0), Decision::Local); // nothing learnt yet
//! policy.observe(&call, CallCost::local(80_000));
//! assert_eq!(policy.decide(&call, 0), Decision::Offload); // last run 80 µs > N
//! assert_eq!(policy.decide(&call, 100_000), Decision::Local); // the queue eats the gain
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::payoff::{ArmSampler, PayoffConfig, PayoffError};

mod call;
mod measured;
mod predictor;
mod tuner;

pub use call::{CallDesc, CallKind, NAMED_KINDS};
use measured::RunningMean;
pub use measured::{CallCost, CostEstimate, Measured, MeasuredConfig, MEASURED_SLOTS};
pub use predictor::{
    within_tolerance, Learned, Prediction, RunLengthPredictor, Source, TableForm, CONFIDENCE_MAX,
    CONFIDENCE_NEW, GLOBAL_HISTORY, LEARNED_WORDS, PAPER_DIRECT_MAPPED, PAPER_FULLY_ASSOCIATIVE,
    TOLERANCE_PERCENT,
};
pub use tuner::{Round, ThresholdTuner, TunerConfig};

/// The 4 KB rule of fast-core-switching §3.6.
pub const DEFAULT_SIZE_THRESHOLD: u64 = 4096;
/// A call is worth moving statically when its mean run is at least this many hop costs.
pub const STATIC_PROFILE_HOPS: u64 = 2;

/// Typed errors of the offload decisions.
#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum OffloadError {
    /// A predictor table of zero entries.
    #[error("a predictor table needs at least one entry")]
    EmptyTable,
    /// A threshold tuner setting out of range.
    #[error("threshold tuner: bad {field}: {reason}")]
    BadTuner {
        /// The setting.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// A policy spec that does not parse.
    #[error("bad offload policy {spec:?}: {reason} (expected never | always | size[:BYTES] | static:CALL,CALL… | predicted[:fa|dm|time][:N|tuned] | measured[:MOVE_NS] | adaptive[:ARM+ARM…])")]
    BadSpec {
        /// The spec.
        spec: String,
        /// Why.
        reason: String,
    },
    /// The adaptive policy's sampler settings are bad.
    #[error(transparent)]
    Payoff(#[from] PayoffError),
}

/// The progress units a normal epoch covers at least (a trial, its share of them): see
/// [`OffloadPolicy::epoch_over`].
pub const MIN_EPOCH_UNITS: u64 = 16;

/// The arms of `adaptive` when none are named: besides never, the measured policy (where it
/// starts), move everything, the 4 KB rule, and the calls predicted to run longer than 20 µs
/// (about what a futex wake-up costs on a small VM). The tables allocate only when built.
pub const DEFAULT_ADAPTIVE_ARMS: &str = "measured+always+size+predicted:time:20000";

/// What to do with one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Run it on the calling core.
    Local,
    /// Run it on a service core; the caller waits for it.
    Offload,
}

/// Calls chosen ahead of time (the paper's static instrumentation).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StaticProfile {
    /// Offloaded kinds with their profiled mean run length.
    pub kinds: BTreeMap<String, u64>,
    /// The hop cost the profile was judged against (the threshold is twice this).
    pub hop_cost: u64,
}

impl StaticProfile {
    /// Chooses the kinds whose mean run is at least [`STATIC_PROFILE_HOPS`] × `hop_cost`.
    pub fn from_profile(samples: impl IntoIterator<Item = (CallKind, u64)>, hop_cost: u64) -> StaticProfile {
        let mut sums: BTreeMap<String, (u128, u64)> = BTreeMap::new();
        for (kind, run) in samples {
            let slot = sums.entry(kind_label(kind)).or_default();
            slot.0 += u128::from(run);
            slot.1 += 1;
        }
        let kinds = sums
            .into_iter()
            .map(|(kind, (sum, count))| (kind, (sum / u128::from(count)) as u64))
            .filter(|&(_, mean)| mean >= STATIC_PROFILE_HOPS.saturating_mul(hop_cost))
            .collect();
        StaticProfile { kinds, hop_cost }
    }

    /// A profile naming the kinds outright (their mean runs unknown, taken as the threshold).
    pub fn of_kinds(kinds: impl IntoIterator<Item = CallKind>, hop_cost: u64) -> StaticProfile {
        let mean = STATIC_PROFILE_HOPS.saturating_mul(hop_cost);
        StaticProfile { kinds: kinds.into_iter().map(|k| (kind_label(k), mean)).collect(), hop_cost }
    }

    fn expected_run(&self, kind: CallKind) -> Option<u64> {
        // A named kind is looked up by its static name: no allocation on the decision path.
        match kind.name() {
            Some(name) => self.kinds.get(name).copied(),
            None => self.kinds.get(&kind_label(kind)).copied(),
        }
    }
}

fn kind_label(kind: CallKind) -> String {
    match kind {
        CallKind::Other(id) => format!("other:{id}"),
        named => named.name().unwrap_or_default().to_string(),
    }
}

/// The predictor-driven policy: offload when the predicted run exceeds N.
#[derive(Clone, Debug)]
pub struct Predicted {
    /// The run-length predictor it asks.
    pub predictor: RunLengthPredictor,
    threshold: u64,
    tuner: Option<ThresholdTuner>,
    /// What a move added to its caller's wait beyond the run, over the moved calls: N never
    /// sits below it, so a machine whose moves cost more than assumed moves less. A plain
    /// mean, not an outlier-proof [`CostEstimate`]: under another program's load on the
    /// service CPU, one move in two or three waits milliseconds for the service thread's turn
    /// and the rest microseconds, and it is the mean a move costs. With the geometric start
    /// and clipped steps of a `CostEstimate`, N stayed near the fast moves and the policy ran
    /// at 0.55-0.58 of never moving (docs/performance.md, forty-ninth session). It eases by
    /// [`MOVE_COST_EASE`] with each call that stays, so that one move the host held up cannot
    /// keep N above the calls that pay to move for good.
    move_cost: RunningMean,
    /// Whether N is floored at `move_cost` (the default; off gives the paper's bare rule).
    move_cost_floor: bool,
    /// Which calls the predictor learns.
    learning: Learning,
}

/// What [`Predicted`]'s measured cost of a move loses with each call that stays: e^-1 in
/// 16384 calls, a tenth of a second of a busy program, then moves show it again. In 4096, a
/// file server's long sends came back to moves that lose every few tens of milliseconds, 1 %
/// of its throughput (docs/performance.md, forty-ninth session).
const MOVE_COST_EASE: f64 = 1.0 / 16384.0;

/// The timed predictor learns from every one of the first calls, and then, while no call
/// would move, from about one call in [`LEARN_EVERY_STAYING`], at gaps of random length (a
/// loop of that many calls is not always sampled at the same one). Learning costs about
/// 50 ns a call, 5 % of a task file server whose calls all stayed where they were
/// (docs/performance.md, "Twenty-ninth session"); a key whose runs grow still shows it in
/// its sampled runs, and once one would move, every call is learned again.
const LEARN_ALL_FIRST: u32 = 1024;
const LEARN_EVERY_STAYING: u32 = 8;

/// Which calls a [`Predicted`] policy's predictor learns (see [`LEARN_EVERY_STAYING`]).
#[derive(Clone, Debug)]
struct Learning {
    /// Calls observed so far, up to [`LEARN_ALL_FIRST`].
    observed: u32,
    /// Whether the calls that stay are a sample already (see
    /// [`OffloadPolicy::shown_a_sample_of_staying_calls`]): then every one is learned.
    shown_a_sample: bool,
    /// Calls to pass over before the next one is learned while no call would move.
    until_learned: u32,
    /// xorshift32 state for the gaps between learned calls (fixed seed: the simulator
    /// replays the same decisions).
    gaps: u32,
}

impl Default for Learning {
    fn default() -> Learning {
        Learning { observed: 0, shown_a_sample: false, until_learned: 0, gaps: 0x9E37_79B9 }
    }
}

impl Learning {
    /// Whether the call just observed is learned, `all_below` saying whether no call would
    /// move now.
    fn learns_now(&mut self, all_below: bool) -> bool {
        if self.shown_a_sample {
            return true;
        }
        if self.observed < LEARN_ALL_FIRST {
            self.observed += 1;
            return true;
        }
        if !all_below {
            return true;
        }
        if self.until_learned > 0 {
            self.until_learned -= 1;
            return false;
        }
        self.gaps ^= self.gaps << 13;
        self.gaps ^= self.gaps >> 17;
        self.gaps ^= self.gaps << 5;
        // 0 to 2 × LEARN_EVERY_STAYING - 2 calls passed over: one in LEARN_EVERY_STAYING learned.
        self.until_learned = self.gaps % (2 * LEARN_EVERY_STAYING - 1);
        true
    }
}

impl Predicted {
    /// A fixed threshold N.
    pub fn fixed(form: TableForm, threshold: u64) -> Result<Predicted, OffloadError> {
        Ok(Predicted {
            predictor: RunLengthPredictor::new(form)?,
            threshold,
            tuner: None,
            move_cost: RunningMean::default(),
            move_cost_floor: true,
            learning: Learning::default(),
        })
    }

    /// N tuned online from `config.initial`.
    pub fn tuned(form: TableForm, config: TunerConfig) -> Result<Predicted, OffloadError> {
        let tuner = ThresholdTuner::new(config)?;
        Ok(Predicted {
            predictor: RunLengthPredictor::new(form)?,
            threshold: tuner.current(),
            tuner: Some(tuner),
            move_cost: RunningMean::default(),
            move_cost_floor: true,
            learning: Learning::default(),
        })
    }

    /// Whether N is floored at the measured cost of a move (on by default); off, the
    /// predictor decides by N alone, as in the paper.
    pub fn with_move_cost_floor(mut self, on: bool) -> Predicted {
        self.move_cost_floor = on;
        self
    }

    /// N as set or tuned.
    pub fn threshold(&self) -> u64 {
        self.threshold
    }

    /// N in force now: the threshold, or the measured cost of a move if that is higher.
    pub fn effective_threshold(&self) -> u64 {
        match self.move_cost.mean() {
            Some(cost) if self.move_cost_floor => self.threshold.max(cost as u64),
            _ => self.threshold,
        }
    }

    /// The tuner of N, if N is tuned.
    pub fn tuner(&self) -> Option<&ThresholdTuner> {
        self.tuner.as_ref()
    }

    /// The predicted run of `call`.
    pub fn predict(&self, call: &CallDesc) -> Prediction {
        self.predictor.predict_call(call)
    }

    /// Whether the predictor learns the call just made at threshold `n` (see
    /// [`LEARN_EVERY_STAYING`]).
    fn learns_now(&mut self, n: u64) -> bool {
        let all_below = self.predictor.all_below(n);
        self.learning.learns_now(all_below)
    }
}

/// Never, or another policy when it pays: the [`crate::payoff`] sampler chooses between
/// `Never` (arm 0) and the moving policies from the application's own progress per epoch.
#[derive(Clone, Debug)]
pub struct Adaptive {
    arms: Vec<OffloadPolicy>,
    sampler: ArmSampler,
    /// Per arm, what the calls of this epoch would have cost their callers under it, by the
    /// measured arm's estimates: an arm's first trial is weighed against that, not a guess.
    expected: Vec<f64>,
    /// About one call in this many is tallied this epoch (see [`TALLIED_PER_EPOCH`]).
    tally_every: u32,
    /// Calls tallied this epoch.
    tallied: u32,
    /// Which calls are tallied; the arm in force gets the other half of each draw.
    draws: Draws,
    /// Whether an epoch has ended. Before that only the arm in force learns: no round starts
    /// before the warm-up's epochs have passed, and a process that ends within its first
    /// epoch (most of a shell pipeline's) would pay for the others' learning and gain nothing.
    past_first_epoch: bool,
}

/// Adaptive tallies the expected cost of about this many calls an epoch, drawn at random
/// ([`Draws`]), and the arms not in force learn from those: a sample serves the ratio
/// of arms' costs, and their tables, as well as every call. A tally asks every arm to decide
/// and costs 100-150 ns; at one call in 8 that was 1-2 % of a task file server's calls of 2 µs,
/// which make 10 000 an epoch (docs/performance.md, "Thirtieth session"). An epoch of few
/// calls tallies each of them. Drawn, not counted: a count written on every call cost that
/// server 2 %, its line moving between the CPUs its tasks call from ("Thirty-fourth session").
const TALLIED_PER_EPOCH: u32 = 128;

/// A policy's own stream of random draws, one per call observed: whether a call is among one
/// in so many. A count of the calls would do, but written on every call by threads on two
/// CPUs it moved between their caches on every call; the stream is one word, and the adaptive
/// policy hands its draw on to its arm, so a call writes one word of policy state
/// (docs/performance.md, "Thirty-fourth session"). The policy's own, so that its choices
/// depend on what it was shown alone, as the simulator needs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Draws(u64);

/// One draw of [`Draws`]: 64 random bits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Draw(u64);

impl Draws {
    /// The next draw (xorshift64*: a few instructions, and no pattern of calls aliases with it).
    pub(crate) fn next(&mut self) -> Draw {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        Draw(x.wrapping_mul(0x2545_f491_4f6c_dd1d))
    }
}

impl Default for Draws {
    fn default() -> Draws {
        Draws(0x9e37_79b9_7f4a_7c15)
    }
}

impl Draw {
    /// Whether this call is among about one in `every`, by the draw's high half.
    pub(crate) fn one_in(self, every: u32) -> bool {
        every <= 1 || (self.0 >> 32).is_multiple_of(u64::from(every))
    }

    /// The same draw with its halves swapped, for a second choice independent of the first.
    fn other(self) -> Draw {
        Draw(self.0.rotate_left(32))
    }
}

/// One call in this many is tallied until an epoch's calls were counted,
const FIRST_TALLY_EVERY: u32 = 8;
/// and one in this many at most, however many calls an epoch has.
const MAX_TALLY_EVERY: u32 = 64;

impl Adaptive {
    /// `Never` and `moving` (none of them adaptive), sampled with `config`. It starts in
    /// `Never`, or in the first moving arm if that is [`Measured`]: that arm keeps every call
    /// where it is until moving it measured cheaper, and loses at most its own probe budget.
    pub fn new(moving: Vec<OffloadPolicy>, config: PayoffConfig) -> Result<Adaptive, OffloadError> {
        let mut arms = vec![OffloadPolicy::Never];
        arms.extend(moving);
        let mut sampler = ArmSampler::new(arms.len(), config)?;
        if matches!(arms.get(1), Some(OffloadPolicy::Measured(_))) {
            sampler = sampler.starting_in(1);
        }
        Ok(Adaptive {
            expected: vec![0.0; arms.len()],
            tally_every: FIRST_TALLY_EVERY,
            tallied: 0,
            draws: Draws::default(),
            past_first_epoch: false,
            arms,
            sampler,
        })
    }

    /// The arms learn from `call`: the arm in force from every call, a measured arm only from
    /// the calls it placed itself (its epochs), the others from the calls tallied after the
    /// first epoch while a round is near or under way ([`ArmSampler::round_soon`], and see
    /// [`TALLIED_PER_EPOCH`]); with a measured arm, each arm's expected cost of those calls
    /// adds to the epoch's tally.
    ///
    /// A measured arm that also learned from other arms' trials took their moves as its own
    /// probes, outside its probe budget: one trial of `always` gave every key a few moved
    /// samples, and with durable commits varying by tens of percent, some keys started moving
    /// on noise (SQLite in `bench offload`: tuned 0.90-0.97 of the best fixed rule, 1.03-1.04
    /// once the measured arm learned from its own calls only).
    fn observe(&mut self, call: &CallDesc, cost: CallCost) {
        let draw = self.draws.next();
        let active = self.sampler.next_epoch().arm;
        self.arms[active].observe_as_arm(call, cost, draw.other());
        if !draw.one_in(self.tally_every) {
            return;
        }
        self.tallied = self.tallied.saturating_add(1);
        // Between rounds nothing reads the tallies: an epoch's expected costs are dropped at
        // its end, and an arm's table serves only its trials. Tallied in every epoch, the
        // arms' learning made the adaptive policy cost a staying call 2.5 times what it does
        // now (`cargo bench -p corehop-policy`; docs/performance.md, "Forty-third session").
        if !self.past_first_epoch || !self.sampler.round_soon() {
            return;
        }
        // The arms not in force learn from these calls only: their tables serve their trials,
        // and a predictor learning from every call cost a loop of cheap calls more than all
        // the rest of the library (docs/performance.md, "Twenty-seventh session").
        for (i, arm) in self.arms.iter_mut().enumerate() {
            if i != active && !matches!(arm, OffloadPolicy::Measured(_)) {
                arm.observe(call, cost);
            }
        }
        let Some(OffloadPolicy::Measured(measured)) = self.arms.get(1) else { return };
        let (local, moved) = measured.expected_costs(call, cost);
        for (arm, expected) in self.arms.iter().zip(&mut self.expected) {
            *expected += if arm.decide(call, 0) == Decision::Offload { moved } else { local };
        }
    }

    /// The epoch ended: score it, and tell the sampler how much slower than the incumbent
    /// each arm was expected to run it (its risk until a trial of it is measured).
    ///
    /// The epoch lasted `duration`; under another arm its calls would have cost their callers
    /// the difference of the two arms' expected costs more (the tallied calls stand for
    /// `tally_every` times as many). The program's own work between calls is the same under
    /// every arm, so an arm is expected to take `(duration + difference) / duration` of it.
    /// The ratio of the calls' costs alone ignored that work: on the task file server it put
    /// `never` 20 to 80 times slower than `measured`, which kept any trial of it out of the
    /// regret budget for the first 5 to 20 s of a run, however much faster not moving ran
    /// (docs/performance.md, "Forty-seventh session"). With several threads calling at once
    /// the costs of all of them add up against one duration: the estimate errs towards risk.
    fn epoch_end(&mut self, work: f64, duration: u64) {
        let incumbent = self.expected[self.sampler.incumbent()];
        if incumbent > 0.0 && duration > 0 {
            let (scale, duration) = (f64::from(self.tally_every), duration as f64);
            for (arm, &expected) in self.expected.iter().enumerate() {
                self.sampler.expect_slowdown(arm, 1.0 + (expected - incumbent) * scale / duration);
            }
        }
        self.expected.iter_mut().for_each(|e| *e = 0.0);
        if !self.sampler.next_epoch().trial {
            // A trial is shorter than the epochs that follow it: only a full one sets the rate.
            let calls = self.tallied.saturating_mul(self.tally_every);
            self.tally_every = (calls / TALLIED_PER_EPOCH).clamp(1, MAX_TALLY_EVERY);
        }
        self.tallied = 0;
        self.past_first_epoch = true;
        self.sampler.epoch_end(work, duration);
    }

    /// The arms, `Never` first.
    pub fn arms(&self) -> &[OffloadPolicy] {
        &self.arms
    }

    /// The sampler (what it settled on, its last round, its regret).
    pub fn sampler(&self) -> &ArmSampler {
        &self.sampler
    }

    fn active(&self) -> &OffloadPolicy {
        &self.arms[self.sampler.next_epoch().arm]
    }

    /// Where the sampler stands, in words: the arm in force, the rounds, the last round's
    /// ratios to the incumbent, and the share of time its trials lost.
    pub fn describe(&self) -> String {
        let s = &self.sampler;
        let (rounds, switches) = s.rounds();
        let mut text = format!(
            "{} after {rounds} rounds ({switches} switches, {} taken back, trials lost {:.2} % of the time)",
            self.arms[s.incumbent()].label(),
            s.taken_back(),
            s.regret_share() * 100.0
        );
        if let OffloadPolicy::Measured(m) = &self.arms[s.incumbent()] {
            let (moving, keys) = m.moving_keys();
            let (probes, lost) = m.probes();
            text.push_str(&format!(
                "; {moving} of {keys} call keys move, {probes} probes lost {:.2} % of the calls' time",
                lost * 100.0
            ));
        }
        if let Some(round) = s.last_round() {
            let ratios: Vec<String> =
                round.ratios.iter().map(|&(arm, r)| format!("{} x{r:.2}", self.arms[arm].label())).collect();
            text.push_str(&format!(
                "; last round vs {}: {}",
                self.arms[round.incumbent].label(),
                ratios.join(", ")
            ));
        }
        text
    }
}

/// An offload policy: one of the papers' decision rules.
#[derive(Clone, Debug)]
pub enum OffloadPolicy {
    /// Every call runs on the caller (the baseline).
    Never,
    /// Every call goes to a service core.
    Always,
    /// The 4 KB rule (RWThresh).
    SizeThreshold {
        /// Byte-moving calls go across from this size on.
        bytes: u64,
    },
    /// The kinds chosen from a profile (SI).
    StaticProfile(StaticProfile),
    /// Boxed: the predictor table and tuner are much larger than the other variants.
    Predicted(Box<Predicted>),
    /// Each kind of call moves once moving it measured cheaper for its caller.
    Measured(Box<Measured>),
    /// Never, or one of several moving policies while it pays.
    Adaptive(Box<Adaptive>),
}

impl OffloadPolicy {
    /// Decide for one call. `queue_delay` is the expected wait at the service core the call
    /// would go to (0 when it is idle). A longer queue never turns `Local` into `Offload`, so
    /// a driver may decide with 0 first and look at the queue only for calls that would move.
    pub fn decide(&self, call: &CallDesc, queue_delay: u64) -> Decision {
        let offload = match self {
            OffloadPolicy::Never => false,
            OffloadPolicy::Always => true,
            OffloadPolicy::SizeThreshold { bytes } => match call.kind {
                CallKind::Other(_) => false,
                kind if kind.moves_bytes() => call.size >= *bytes,
                _ => true,
            },
            OffloadPolicy::StaticProfile(profile) => profile.expected_run(call.kind).is_some_and(|run| {
                run >= (STATIC_PROFILE_HOPS.saturating_mul(profile.hop_cost)).saturating_add(queue_delay)
            }),
            OffloadPolicy::Predicted(p) => {
                let n = p.effective_threshold().saturating_add(queue_delay);
                // `all_below` is exact, and a few loads where `above_call` hashes the call.
                !p.predictor.all_below(n) && p.predictor.above_call(call, n)
            }
            OffloadPolicy::Measured(m) => m.decide(call) == Decision::Offload,
            OffloadPolicy::Adaptive(a) => return a.active().decide(call, queue_delay),
        };
        if offload {
            Decision::Offload
        } else {
            Decision::Local
        }
    }

    /// Tells the policy that its driver shows it only a sample of the calls that stay while
    /// [`OffloadPolicy::keeps_all_local`] holds (the preload library times one such call in
    /// 16 to 1024): a predicted policy, in an adaptive one or alone, then learns from every
    /// call it is shown instead of sampling them again.
    pub fn shown_a_sample_of_staying_calls(&mut self) {
        match self {
            OffloadPolicy::Predicted(p) => p.learning.shown_a_sample = true,
            OffloadPolicy::Adaptive(a) => {
                a.arms.iter_mut().for_each(OffloadPolicy::shown_a_sample_of_staying_calls)
            }
            _ => {}
        }
    }

    /// What the policy's timed predictor learned that holds beyond its process (the first
    /// one, in an adaptive policy's arms): see [`RunLengthPredictor::learned`].
    pub fn learned(&self) -> Option<Learned> {
        match self {
            OffloadPolicy::Predicted(p) => p.predictor.learned(),
            OffloadPolicy::Adaptive(a) => a.arms.iter().find_map(OffloadPolicy::learned),
            _ => None,
        }
    }

    /// Starts every timed predictor of the policy from what another process's learned.
    pub fn start_from(&mut self, learned: &Learned) {
        match self {
            OffloadPolicy::Predicted(p) => p.predictor.start_from(learned),
            OffloadPolicy::Adaptive(a) => a.arms.iter_mut().for_each(|arm| arm.start_from(learned)),
            _ => {}
        }
    }

    /// Whether every call stays local now, whatever it is: `Never`, a timed [`Predicted`]
    /// policy whose keys, kinds and calls as a whole all run below its N (keys and kinds not
    /// observed lately aside, see [`RunLengthPredictor::all_below_lately`]), a [`Measured`]
    /// policy with no key moving and no probe due, or an adaptive policy running such an arm
    /// (not a trial of another). A driver may skip [`OffloadPolicy::decide`] then: it is a few
    /// loads, where deciding hashes the call.
    pub fn keeps_all_local(&self) -> bool {
        match self {
            OffloadPolicy::Never => true,
            OffloadPolicy::Predicted(p) => p.predictor.all_below_lately(p.effective_threshold()),
            OffloadPolicy::Measured(m) => m.moves_nothing(),
            OffloadPolicy::Adaptive(a) => a.active().keeps_all_local(),
            _ => false,
        }
    }

    /// The call ran where [`OffloadPolicy::decide`] said and cost what `cost` says.
    pub fn observe(&mut self, call: &CallDesc, cost: CallCost) {
        match self {
            OffloadPolicy::Predicted(p) => {
                let n = p.effective_threshold();
                if cost.moved || p.learns_now(n) {
                    p.predictor.observe_call(call, cost.run, n);
                }
                if cost.moved {
                    p.move_cost.add(cost.caller.saturating_sub(cost.run) as f64);
                } else {
                    p.move_cost.ease(MOVE_COST_EASE);
                }
            }
            OffloadPolicy::Measured(m) => m.observe(call, cost),
            OffloadPolicy::Adaptive(a) => a.observe(call, cost),
            _ => {}
        }
    }

    /// [`OffloadPolicy::observe`] for the arm in force of an adaptive policy, which made the
    /// call's draw: a measured arm uses it instead of drawing from its own stream.
    fn observe_as_arm(&mut self, call: &CallDesc, cost: CallCost, draw: Draw) {
        match self {
            OffloadPolicy::Measured(m) => m.observe_drawn(call, cost, draw),
            other => other.observe(call, cost),
        }
    }

    /// How long the next epoch should last, given a normal epoch's length: an adaptive
    /// policy's trials are shorter.
    pub fn epoch_length(&self, normal: u64) -> u64 {
        match self {
            OffloadPolicy::Adaptive(a) => a.sampler.next_epoch().length(normal),
            _ => normal.max(1),
        }
    }

    /// Whether an epoch that began `elapsed` ago, in which the application made `units` of
    /// progress, is over, given a normal epoch's length: it must last its length (see
    /// [`OffloadPolicy::epoch_length`]) and cover [`MIN_EPOCH_UNITS`] scaled the same way. A
    /// trial that covers a handful of transactions scores their noise (durable commits vary
    /// by tens of percent), not the arm.
    pub fn epoch_over(&self, elapsed: u64, units: u64, normal: u64) -> bool {
        let length = self.epoch_length(normal);
        let normal = normal.max(1);
        let needed = (u128::from(MIN_EPOCH_UNITS) * u128::from(length)).div_ceil(u128::from(normal)).max(1);
        elapsed >= length && u128::from(units) >= needed
    }

    /// An epoch ended in which the application got `work` done (transactions, requests,
    /// calls: any unit, always the same) in `duration`. A tuned `Predicted` moves N; an
    /// `Adaptive` policy weighs its arms.
    pub fn epoch_end(&mut self, work: f64, duration: u64) {
        match self {
            OffloadPolicy::Predicted(p) => {
                if let Some(tuner) = &mut p.tuner {
                    p.threshold = tuner.epoch_end(work / duration.max(1) as f64);
                }
            }
            OffloadPolicy::Adaptive(a) => a.epoch_end(work, duration),
            _ => {}
        }
    }

    /// Whether this policy learns from `observe` (drivers can skip timing otherwise).
    pub fn learns(&self) -> bool {
        match self {
            OffloadPolicy::Predicted(_) | OffloadPolicy::Measured(_) => true,
            OffloadPolicy::Adaptive(a) => a.arms.iter().any(OffloadPolicy::learns),
            _ => false,
        }
    }

    /// Whether this policy wants [`OffloadPolicy::epoch_end`] (drivers can skip epochs
    /// otherwise).
    pub fn wants_epochs(&self) -> bool {
        match self {
            OffloadPolicy::Predicted(p) => p.tuner.is_some(),
            OffloadPolicy::Adaptive(_) => true,
            _ => false,
        }
    }

    /// The policy in force now, for reports: an adaptive policy's settled arm, else itself.
    pub fn settled(&self) -> &OffloadPolicy {
        match self {
            OffloadPolicy::Adaptive(a) => &a.arms[a.sampler.incumbent()],
            other => other,
        }
    }

    /// A short name for tables: `never`, `always`, `size4096`, `static`, `pred-fa200-N5000`, ….
    pub fn label(&self) -> String {
        match self {
            OffloadPolicy::Never => "never".into(),
            OffloadPolicy::Always => "always".into(),
            OffloadPolicy::SizeThreshold { bytes } => format!("size{bytes}"),
            OffloadPolicy::StaticProfile(_) => "static".into(),
            OffloadPolicy::Predicted(p) => match p.tuner {
                Some(_) => format!("pred-{}-tuned", p.predictor.form().label()),
                None => format!("pred-{}-N{}", p.predictor.form().label(), p.threshold),
            },
            OffloadPolicy::Measured(_) => "measured".into(),
            OffloadPolicy::Adaptive(_) => "adaptive".into(),
        }
    }
}

impl fmt::Display for OffloadPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

/// Parses `never`, `always`, `size[:BYTES]`, `static:CALL,CALL…` (kinds by strace name,
/// hop cost 0 so every listed kind moves) and `predicted[:fa|dm][:N|tuned]` (default
/// `fa`, N from [`TunerConfig::default`], tuned). Sizes of `fa`/`dm` are the paper's.
/// `measured[:MOVE_NS]` is [`Measured`] with the prior cost of a move (default 20 µs).
/// `adaptive[:ARM+ARM…]` samples never against the arms, each a spec of the above
/// (default [`DEFAULT_ADAPTIVE_ARMS`]).
impl FromStr for OffloadPolicy {
    type Err = OffloadError;

    fn from_str(spec: &str) -> Result<OffloadPolicy, OffloadError> {
        let bad = |reason: &str| OffloadError::BadSpec { spec: spec.to_string(), reason: reason.to_string() };
        let trimmed = spec.trim();
        if trimmed.len() >= 8 && trimmed[..8].eq_ignore_ascii_case("adaptive") {
            let arms = match &trimmed[8..] {
                "" => DEFAULT_ADAPTIVE_ARMS,
                rest => rest.strip_prefix(':').ok_or_else(|| bad("unknown policy"))?,
            };
            let moving = arms
                .split('+')
                .map(|arm| match arm.parse::<OffloadPolicy>() {
                    Ok(OffloadPolicy::Adaptive(_)) => Err(bad("an adaptive arm cannot itself be adaptive")),
                    Ok(OffloadPolicy::Never) => Err(bad("never is always an arm; name the moving ones")),
                    Ok(policy) => Ok(policy),
                    Err(e) => Err(bad(&format!("arm {arm:?}: {e}"))),
                })
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(OffloadPolicy::Adaptive(Box::new(Adaptive::new(moving, PayoffConfig::default())?)));
        }
        let mut parts = spec.trim().split(':');
        let head = parts.next().unwrap_or_default().to_ascii_lowercase();
        let rest: Vec<&str> = parts.collect();
        let number = |text: &str, what: &str| {
            text.trim()
                .replace('_', "")
                .parse::<u64>()
                .map_err(|_| bad(&format!("{what} {text:?} is not a whole number")))
        };
        match (head.as_str(), rest.as_slice()) {
            ("never", []) => Ok(OffloadPolicy::Never),
            ("always", []) => Ok(OffloadPolicy::Always),
            ("size", []) => Ok(OffloadPolicy::SizeThreshold { bytes: DEFAULT_SIZE_THRESHOLD }),
            ("size", [bytes]) => Ok(OffloadPolicy::SizeThreshold { bytes: number(bytes, "size")? }),
            ("static", [list]) => {
                let kinds: BTreeSet<CallKind> = list
                    .split(',')
                    .map(str::trim)
                    .filter(|name| !name.is_empty())
                    .map(|name| match CallKind::from_name(name) {
                        CallKind::Other(_) => Err(bad(&format!("unknown call {name:?}"))),
                        kind => Ok(kind),
                    })
                    .collect::<Result<_, _>>()?;
                if kinds.is_empty() {
                    return Err(bad("static needs at least one call name"));
                }
                Ok(OffloadPolicy::StaticProfile(StaticProfile::of_kinds(kinds, 0)))
            }
            ("predicted", args) if args.len() <= 2 => {
                let mut form = TableForm::PAPER_FA;
                let mut threshold = None;
                for (i, arg) in args.iter().enumerate() {
                    match arg.to_ascii_lowercase().as_str() {
                        "fa" if i == 0 => form = TableForm::PAPER_FA,
                        "dm" if i == 0 => form = TableForm::PAPER_DM,
                        "time" if i == 0 => form = TableForm::TIMED,
                        "tuned" => threshold = None,
                        n => threshold = Some(number(n, "threshold N")?),
                    }
                }
                match threshold {
                    Some(n) => Predicted::fixed(form, n),
                    None => Predicted::tuned(form, TunerConfig::default()),
                }
                .map(|p| OffloadPolicy::Predicted(Box::new(p)))
            }
            ("measured", []) => {
                Ok(OffloadPolicy::Measured(Box::new(Measured::new(MeasuredConfig::default())?)))
            }
            ("measured", [prior]) => {
                let move_prior = number(prior, "move cost")?;
                let first_move_prior = MeasuredConfig::default().first_move_prior.max(move_prior);
                let config = MeasuredConfig { move_prior, first_move_prior, ..MeasuredConfig::default() };
                Ok(OffloadPolicy::Measured(Box::new(Measured::new(config)?)))
            }
            ("never" | "always" | "size" | "static" | "predicted" | "measured", _) => {
                Err(bad("wrong number of ':' parts"))
            }
            _ => Err(bad("unknown policy")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn read(size: u64) -> CallDesc {
        CallDesc::new(CallKind::Read, 3, size, 1)
    }

    #[test]
    fn adaptive_tallies_about_as_many_calls_an_epoch_however_many_it_sees() {
        let OffloadPolicy::Adaptive(mut a) = "adaptive".parse().unwrap() else { unreachable!() };
        // The warm-up's epochs: no trial, so each one sets the rate for the next.
        assert_eq!(a.tally_every, FIRST_TALLY_EVERY);
        // Calls are drawn at random: the rate follows a count within its spread.
        for (calls, every) in [(100_000, MAX_TALLY_EVERY..=MAX_TALLY_EVERY), (2_560, 14..=26), (50, 1..=1)] {
            for _ in 0..calls {
                a.observe(&read(100), CallCost::local(1_000));
            }
            a.epoch_end(calls as f64, 20_000_000);
            assert!(every.contains(&a.tally_every), "after an epoch of {calls} calls: {}", a.tally_every);
        }
    }

    #[test]
    fn the_program_s_own_work_counts_in_what_an_arm_risks() {
        // Moving a call costs its caller 10 ns where running it costs 200 ns, but the calls
        // take a tenth of the program's time, and `never` runs 20 % faster (the other CPU was
        // no help). By the calls' costs alone `never` looked 20 times slower than `measured`
        // once that moved them, and no trial of it fitted in the regret budget in these 200
        // epochs; with the program's own work counted it risks about 1.2 times, and is tried
        // in the first round.
        use crate::payoff::STAY;
        let OffloadPolicy::Adaptive(mut a) = "adaptive".parse().unwrap() else { unreachable!() };
        let (normal, calls) = (20_000_000, 10_000);
        let mut tried_never = None;
        for epoch in 0..200 {
            let e = a.sampler().next_epoch();
            if e.arm == STAY && e.trial {
                tried_never = tried_never.or(Some(epoch));
            }
            // The program's start: a long first epoch, in which `measured` learns to move.
            let length = if epoch == 0 { 10 * normal } else { e.length(normal) };
            let mut moved = 0;
            for i in 0..calls * length / normal {
                let call = CallDesc::new(CallKind::Fstat, 3, 0, i % 4);
                let cost = match a.active().decide(&call, 0) {
                    Decision::Local => CallCost::local(200),
                    Decision::Offload => {
                        moved += 1;
                        CallCost::moved(200, 10)
                    }
                };
                a.observe(&call, cost);
            }
            if epoch == 1 {
                assert!(moved * 2 > calls * length / normal, "measured moved most calls: {moved}");
            }
            let rate = if e.arm == STAY { 1.2 } else { 1.0 };
            a.epoch_end(rate * length as f64, length);
        }
        let first = tried_never.expect("never was tried");
        assert!(first <= 8, "never was first tried at epoch {first}");
        assert_eq!(a.sampler().incumbent(), STAY, "{}", a.describe());
    }

    #[test]
    fn an_adaptive_policy_chooses_by_what_it_was_shown_alone() {
        // Two policies shown the same calls, and a third shown others in between on the same
        // thread (as the simulator's tasks are): the two end alike, call for call.
        let mut twins: Vec<OffloadPolicy> = (0..2).map(|_| "adaptive".parse().unwrap()).collect();
        let mut other: OffloadPolicy = "adaptive".parse().unwrap();
        let mut decisions = [vec![], vec![]];
        for i in 0..200_000u64 {
            let call = CallDesc::new(CallKind::Fsync, 3, 0, i % 3);
            let run = 5_000 + i * 7_919 % 3_000;
            for (twin, seen) in twins.iter_mut().zip(&mut decisions) {
                let d = twin.decide(&call, 0);
                seen.push(d);
                twin.observe(
                    &call,
                    match d {
                        Decision::Local => CallCost::local(run),
                        Decision::Offload => CallCost::moved(run, 1_500),
                    },
                );
                if i % 1_000 == 999 {
                    twin.epoch_end(1_000.0, 20_000_000);
                }
                other.observe(&read(i % 5_000), CallCost::local(run));
            }
        }
        assert_eq!(decisions[0], decisions[1]);
        assert!(decisions[0].contains(&Decision::Offload), "moving paid, and it moved");
    }

    #[test]
    fn size_threshold_is_the_4kb_rule() {
        let p: OffloadPolicy = "size".parse().unwrap();
        assert_eq!(p.decide(&read(4095), 0), Decision::Local);
        assert_eq!(p.decide(&read(4096), 0), Decision::Offload);
        // Calls without a byte count (fsync, open) always move under RWThresh.
        assert_eq!(p.decide(&CallDesc::new(CallKind::Fsync, 3, 0, 1), 0), Decision::Offload);
        // Calls outside the papers' list never switch.
        assert_eq!(p.decide(&CallDesc::new(CallKind::Other(39), -1, 1 << 20, 1), 0), Decision::Local);
        assert_eq!(
            "size:256".parse::<OffloadPolicy>().unwrap().decide(&read(300), 1_000_000),
            Decision::Offload
        );
    }

    #[test]
    fn static_profile_keeps_kinds_with_mean_at_least_twice_the_hop() {
        let samples = [
            (CallKind::Fsync, 9_000),
            (CallKind::Fsync, 11_000), // mean 10 000 ≥ 2 × 5 000
            (CallKind::Read, 1_000),
            (CallKind::Read, 12_000), // mean 6 500 < 10 000
            (CallKind::Stat, 10_000), // exactly 2 ×
        ];
        let profile = StaticProfile::from_profile(samples, 5_000);
        assert_eq!(profile.kinds.keys().cloned().collect::<Vec<_>>(), vec!["fsync", "stat"]);
        let p = OffloadPolicy::StaticProfile(profile);
        assert_eq!(p.decide(&CallDesc::new(CallKind::Fsync, 3, 0, 0), 0), Decision::Offload);
        assert_eq!(p.decide(&read(1 << 20), 0), Decision::Local);
        // Queue-aware: 10 000 does not clear 2 × 5 000 + 1 queued.
        assert_eq!(p.decide(&CallDesc::new(CallKind::Stat, -1, 0, 0), 1), Decision::Local);
    }

    #[test]
    fn predicted_offloads_above_n_and_respects_the_queue() {
        let mut p: OffloadPolicy = "predicted:dm:1000".parse().unwrap();
        let call = read(100);
        p.observe(&call, CallCost::local(1500));
        assert_eq!(p.decide(&call, 0), Decision::Offload);
        assert_eq!(p.decide(&call, 499), Decision::Offload);
        assert_eq!(p.decide(&call, 500), Decision::Local);
        p.observe(&call, CallCost::local(1000));
        // 1500 missed 1000: confidence 0, so the global mean (1250) still says offload.
        assert_eq!(p.decide(&call, 0), Decision::Offload);
        p.observe(&call, CallCost::local(1000));
        assert_eq!(p.decide(&call, 0), Decision::Local, "1000 is not above N = 1000");
        assert!(!OffloadPolicy::Never.learns());
    }

    #[test]
    fn tuned_policy_follows_the_tuner() {
        let mut p: OffloadPolicy = "predicted:fa:tuned".parse().unwrap();
        let OffloadPolicy::Predicted(inner) = &p else { panic!("parsed to {p:?}") };
        assert_eq!(inner.threshold(), TunerConfig::default().initial);
        p.epoch_end(1.0, 1);
        let OffloadPolicy::Predicted(inner) = &p else { unreachable!() };
        assert_eq!(inner.threshold(), TunerConfig::default().initial * 2, "now sampling above");
    }

    #[test]
    fn a_queue_never_makes_a_call_move() {
        let policies = ["never", "always", "size", "static:fsync,read", "predicted:time:5000", "adaptive"];
        for spec in policies {
            let mut policy: OffloadPolicy = spec.parse().unwrap();
            for (i, run) in [100u64, 3_000, 9_000, 50_000].into_iter().enumerate() {
                policy.observe(&CallDesc::new(CallKind::Fsync, 3, 0, i as u64), CallCost::local(run));
            }
            for site in 0..4 {
                for size in [0, 512, 4096, 1 << 20] {
                    let call = CallDesc::new(CallKind::Fsync, 3, size, site);
                    for delay in [1, 1_000, 100_000] {
                        if policy.decide(&call, delay) == Decision::Offload {
                            assert_eq!(policy.decide(&call, 0), Decision::Offload, "{spec} {call:?} {delay}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn specs_parse_and_label() {
        for (spec, label) in [
            ("never", "never"),
            ("ALWAYS", "always"),
            ("size:8_192", "size8192"),
            ("static:fsync,read", "static"),
            ("predicted", "pred-fa200-tuned"),
            ("predicted:dm", "pred-dm1500-tuned"),
            ("predicted:2000", "pred-fa200-N2000"),
            ("predicted:dm:5000", "pred-dm1500-N5000"),
            ("adaptive", "adaptive"),
            ("adaptive:always+predicted:dm:5000", "adaptive"),
            ("measured", "measured"),
            ("measured:40000", "measured"),
        ] {
            assert_eq!(spec.parse::<OffloadPolicy>().unwrap().label(), label, "{spec}");
        }
    }

    #[test]
    fn bad_specs_name_the_problem() {
        for (spec, needle) in [
            ("sometimes", "unknown policy"),
            ("size:lots", "\"lots\" is not a whole number"),
            ("static:frobnicate", "unknown call \"frobnicate\""),
            ("static:", "at least one call"),
            ("predicted:fa:10:20", "wrong number"),
            ("never:1", "wrong number"),
            ("adaptive:never", "never is always an arm"),
            ("adaptive:adaptive", "cannot itself be adaptive"),
            ("adaptive:sometimes", "arm \"sometimes\""),
            ("adaptivefoo", "unknown policy"),
        ] {
            let err = spec.parse::<OffloadPolicy>().unwrap_err();
            assert!(err.to_string().contains(needle), "{spec}: {err}");
        }
    }

    #[test]
    fn an_epoch_covers_its_share_of_progress_units_as_well_as_its_length() {
        let fixed = OffloadPolicy::Never;
        assert!(!fixed.epoch_over(1000, MIN_EPOCH_UNITS - 1, 1000), "long enough, too few units");
        assert!(!fixed.epoch_over(999, MIN_EPOCH_UNITS, 1000), "enough units, too short");
        assert!(fixed.epoch_over(1000, MIN_EPOCH_UNITS, 1000));
        // An adaptive policy's first epochs run its incumbent; a trial's share is smaller.
        let mut adaptive: OffloadPolicy = "adaptive".parse().unwrap();
        assert!(!adaptive.epoch_over(1000, MIN_EPOCH_UNITS - 1, 1000));
        while adaptive.epoch_length(1000) == 1000 {
            adaptive.epoch_end(1000.0, 1000);
        }
        let trial = adaptive.epoch_length(1000);
        let share = (MIN_EPOCH_UNITS * trial).div_ceil(1000);
        assert!(share < MIN_EPOCH_UNITS);
        assert!(!adaptive.epoch_over(trial, share - 1, 1000));
        assert!(adaptive.epoch_over(trial, share, 1000));
    }

    /// Drives `policy` over epochs of 100 calls; a call costs `cost(decision)` time units.
    fn drive(policy: &mut OffloadPolicy, epochs: usize, cost: impl Fn(Decision) -> u64) -> (u64, usize) {
        let (mut time, mut offloaded) = (0, 0);
        for _ in 0..epochs {
            let calls = policy.epoch_length(100);
            let mut epoch_time = 0;
            for i in 0..calls {
                let call = CallDesc::new(CallKind::Fstat, 3, 0, i % 4);
                let d = policy.decide(&call, 0);
                offloaded += usize::from(d == Decision::Offload);
                let caller = cost(d);
                epoch_time += caller;
                let outcome = if d == Decision::Offload {
                    CallCost::moved(1300, caller)
                } else {
                    CallCost::local(caller)
                };
                policy.observe(&call, outcome);
            }
            time += epoch_time;
            policy.epoch_end(calls as f64, epoch_time);
        }
        (time, offloaded)
    }

    #[test]
    fn adaptive_settles_on_never_where_offloading_only_costs() {
        let mut p: OffloadPolicy = "adaptive".parse().unwrap();
        // An fstat takes 1.3 us here and 4.5 us offloaded (cp -r under `always`).
        let (time, _) = drive(&mut p, 3000, |d| if d == Decision::Offload { 4500 } else { 1300 });
        // Whatever arm it settles on moves nothing (a trial may be under way at the end).
        for site in 0..4 {
            assert_eq!(p.settled().decide(&CallDesc::new(CallKind::Fstat, 3, 0, site), 0), Decision::Local);
        }
        let never = 3000 * 100 * 1300;
        assert!(time as f64 <= never as f64 * 1.02, "{time} vs never {never}");
    }

    /// Drives `policy` for `total` time units in epochs of `epoch` time units (as the
    /// runtime does); the `i`-th call is `call(i)` and costs `cost(decision)`. Returns
    /// (calls, time, calls moved).
    fn drive_timed(
        policy: &mut OffloadPolicy,
        total: u64,
        epoch: u64,
        call: impl Fn(u64) -> CallDesc,
        cost: impl Fn(Decision) -> CallCost,
    ) -> (u64, u64, u64) {
        let (mut calls, mut time, mut moved) = (0, 0, 0);
        let (mut epoch_start, mut epoch_calls) = (0, 0);
        while time < total {
            let call = call(calls);
            let d = policy.decide(&call, 0);
            let outcome = cost(d);
            policy.observe(&call, outcome);
            (calls, time, moved) =
                (calls + 1, time + outcome.caller, moved + u64::from(d == Decision::Offload));
            if time - epoch_start >= policy.epoch_length(epoch) {
                policy.epoch_end((calls - epoch_calls) as f64, time - epoch_start);
                (epoch_start, epoch_calls) = (time, calls);
            }
        }
        (calls, time, moved)
    }

    #[test]
    fn adaptive_does_not_try_an_arm_its_measurements_say_would_lose_far() {
        let mut p: OffloadPolicy = "adaptive".parse().unwrap();
        // A moved fstat costs its caller 60 µs here (a cold service thread, two wake-ups):
        // one trial of `always` at the assumed 4× slowdown would lose many times the budget.
        // 2 s in epochs of 20 ms, as `corehop run` does.
        let fstat = |i: u64| CallDesc::new(CallKind::Fstat, 3, 0, i % 4);
        let (calls, time, moved) = drive_timed(&mut p, 2_000_000_000, 20_000_000, fstat, |d| match d {
            Decision::Offload => CallCost::moved(1300, 60_000),
            Decision::Local => CallCost::local(1300),
        });
        let slowdown = time as f64 / (calls * 1300) as f64;
        assert!(slowdown <= 1.012, "lost {:.2} % ({moved} calls moved)", (slowdown - 1.0) * 100.0);
    }

    #[test]
    fn adaptive_projects_untried_arms_at_what_moves_measured_to_cost() {
        // The bench's measured arm: a move is assumed to add 10 µs (a hop and a caller's
        // spin). On a closed-loop file server one added 150 µs: the service thread and then
        // the caller were asleep. Twelve kinds of call of 60 µs, half of them of 8 KB, in
        // epochs of 20 ms: projected at the prior, a trial of the size rule looked nearly free
        // and lost more than the trials' whole budget (0.58 % of a 500 ms run).
        let measured =
            MeasuredConfig { move_prior: 10_000, first_move_prior: 10_000, ..MeasuredConfig::default() };
        for total in [150_000_000, 300_000_000, 500_000_000, 2_000_000_000] {
            let arms = vec![
                OffloadPolicy::Measured(Box::new(Measured::new(measured).unwrap())),
                OffloadPolicy::SizeThreshold { bytes: DEFAULT_SIZE_THRESHOLD },
            ];
            let mut p =
                OffloadPolicy::Adaptive(Box::new(Adaptive::new(arms, PayoffConfig::default()).unwrap()));
            let kinds = |i: u64| CallDesc::new(NAMED_KINDS[(i % 12) as usize], 3, (i % 2) << 13, i % 12);
            let (calls, time, _) = drive_timed(&mut p, total, 20_000_000, kinds, |d| match d {
                Decision::Offload => CallCost::moved(60_000, 210_000),
                Decision::Local => CallCost::local(60_000),
            });
            let OffloadPolicy::Adaptive(a) = &p else { unreachable!() };
            let trials = a.sampler().regret_share();
            assert!(trials <= PayoffConfig::default().regret_budget, "{total} ns: {}", a.describe());
            let slowdown = time as f64 / (calls * 60_000) as f64;
            assert!(slowdown <= 1.02, "{total} ns: lost {:.2} %", (slowdown - 1.0) * 100.0);
        }
    }

    #[test]
    fn adaptive_moves_where_offloading_only_gains() {
        let mut p: OffloadPolicy = "adaptive:always".parse().unwrap();
        drive(&mut p, 1000, |d| if d == Decision::Offload { 1000 } else { 1300 });
        assert_eq!(p.settled().label(), "always");
    }

    /// Feeds `p` fsyncs of 900 µs that cost their caller `moved_caller` when moved, checking
    /// that it never keeps all local while moving one; then it must move them.
    fn moves_long_calls(p: &mut OffloadPolicy, calls: usize, moved_caller: u64) {
        let call = CallDesc::new(CallKind::Fsync, 3, 0, 1);
        for _ in 0..calls {
            let d = p.decide(&call, 0);
            assert!(d == Decision::Local || !p.keeps_all_local());
            let cost = if d == Decision::Offload {
                CallCost::moved(900_000, moved_caller)
            } else {
                CallCost::local(900_000)
            };
            p.observe(&call, cost);
        }
        assert_eq!(p.decide(&call, 0), Decision::Offload);
        assert!(!p.keeps_all_local());
    }

    #[test]
    fn keeps_all_local_only_when_no_call_can_move() {
        assert!(OffloadPolicy::Never.keeps_all_local());
        assert!(!OffloadPolicy::Always.keeps_all_local());
        let mut p: OffloadPolicy = "adaptive".parse().unwrap();
        assert!(p.keeps_all_local(), "measured starts with nothing moving");
        moves_long_calls(&mut p, 100, 700_000);

        let mut p: OffloadPolicy = "predicted:time:5000".parse().unwrap();
        let stat = CallDesc::new(CallKind::Fstat, 3, 0, 2);
        for _ in 0..50 {
            assert_eq!(p.decide(&stat, 0), Decision::Local);
            p.observe(&stat, CallCost::local(400));
        }
        assert!(p.keeps_all_local(), "every call seen is short");
        moves_long_calls(&mut p, 50, 905_000);
    }

    #[test]
    fn adaptive_starts_measured_and_moves_what_measured_cheaper() {
        let mut p: OffloadPolicy = "adaptive".parse().unwrap();
        assert_eq!(p.settled().label(), "measured");
        // Moved, a call costs its caller 1000 instead of 1300: the measured arm finds it in a
        // few ten thousand calls (its first probe waits for 1 % of the calls' time to cover a
        // service thread's start, 200 µs).
        drive(&mut p, 400, |d| if d == Decision::Offload { 1000 } else { 1300 });
        for site in 0..4 {
            assert_eq!(p.decide(&CallDesc::new(CallKind::Fstat, 3, 0, site), 0), Decision::Offload);
        }
    }

    #[test]
    fn arms_not_in_force_learn_only_after_the_first_epoch_and_near_a_round() {
        let OffloadPolicy::Adaptive(mut a) = "adaptive:measured+predicted:time:20000".parse().unwrap() else {
            panic!("adaptive")
        };
        let source = |a: &Adaptive, call: &CallDesc| match &a.arms[2] {
            OffloadPolicy::Predicted(p) => p.predict(call).source,
            _ => panic!("arm 2 is predicted"),
        };
        let call = CallDesc::new(CallKind::Read, 3, 4096, 7);
        for _ in 0..100 {
            a.observe(&call, CallCost::local(5_000));
        }
        assert_eq!(source(&a, &call), Source::Cold, "a process inside its first epoch pays for one arm");
        let mut epochs = 0;
        loop {
            a.epoch_end(100.0, 100_000);
            epochs += 1;
            for _ in 0..10 {
                a.observe(&call, CallCost::local(5_000));
            }
            if a.sampler.round_soon() {
                break;
            }
            assert_eq!(
                source(&a, &call),
                Source::Cold,
                "no round near, epoch {epochs}: nothing to learn for"
            );
        }
        assert!(epochs > 1, "the warm-up outlasts the epochs a round is prepared in");
        assert_eq!(source(&a, &call), Source::Local);
    }

    #[test]
    fn the_measured_arm_learns_only_from_the_calls_it_placed() {
        let OffloadPolicy::Adaptive(mut a) = "adaptive:measured+always".parse().unwrap() else {
            panic!("adaptive")
        };
        let measured_keys = |a: &Adaptive| match &a.arms[1] {
            OffloadPolicy::Measured(m) => m.moving_keys().1,
            _ => panic!("arm 1 is measured"),
        };
        // Run epochs until the sampler tries `always` (arm 2).
        let mut epochs = 0;
        while a.sampler.next_epoch().arm != 2 {
            a.epoch_end(100.0, 100_000);
            epochs += 1;
            assert!(epochs < 10_000, "no trial of always");
        }
        // What `always` moved during its trial is not the measured arm's to learn from: it
        // would take those moves as its own probes, outside its budget.
        let call = CallDesc::new(CallKind::Fsync, 3, 0, 1);
        for _ in 0..10 {
            a.observe(&call, CallCost::moved(900_000, 500_000));
        }
        assert_eq!(measured_keys(&a), 0);
        while a.sampler.next_epoch().arm != 1 {
            a.epoch_end(100.0, 100_000);
        }
        a.observe(&call, CallCost::local(900_000));
        assert_eq!(measured_keys(&a), 1);
    }

    #[test]
    fn a_predicted_policy_that_moves_nothing_learns_from_a_sample_of_its_calls() {
        let OffloadPolicy::Predicted(mut p) = "predicted:time:100000".parse().unwrap() else {
            unreachable!()
        };
        let n = p.effective_threshold();
        let short = |site| CallDesc::new(CallKind::Read, 3, 100, site);
        let learned = |p: &mut Predicted, calls| (0..calls).filter(|_| p.learns_now(n)).count();
        assert_eq!(learned(&mut p, LEARN_ALL_FIRST), LEARN_ALL_FIRST as usize, "every one at first");
        for site in 0..64 {
            p.predictor.observe_call(&short(site), 2_000, n);
        }
        assert!(p.predictor.all_below(n));
        let sampled = learned(&mut p, 80_000);
        assert!((9_000..11_000).contains(&sampled), "{sampled} of 80 000");
        // Once a call would move, every call is learned again.
        let long = CallDesc::new(CallKind::Fsync, 3, 0, 99);
        while p.predictor.all_below(n) {
            p.predictor.observe_call(&long, 900_000, n);
        }
        assert_eq!(learned(&mut p, 100), 100);
        // A driver that shows the policy a sample already gets every one of them learned.
        let mut shown: OffloadPolicy = "predicted:time:100000".parse().unwrap();
        shown.shown_a_sample_of_staying_calls();
        let OffloadPolicy::Predicted(mut shown) = shown else { unreachable!() };
        assert_eq!(learned(&mut shown, 2 * LEARN_ALL_FIRST), 2 * LEARN_ALL_FIRST as usize);
    }

    #[test]
    fn a_predicted_policy_past_its_first_calls_still_moves_a_key_that_turns_long() {
        let mut p: OffloadPolicy = "predicted:time:100000".parse().unwrap();
        for i in 0..5_000u64 {
            p.observe(&CallDesc::new(CallKind::Read, 3, 100, i % 50), CallCost::local(2_000));
        }
        assert!(p.keeps_all_local());
        let fsync = CallDesc::new(CallKind::Fsync, 3, 0, 7);
        let calls = (1..=1_000).find(|_| {
            p.observe(&fsync, CallCost::local(900_000));
            p.decide(&fsync, 0) == Decision::Offload
        });
        // Seven of its runs outvote the majority of all calls; about one call in eight is learned.
        assert!(calls.is_some_and(|c| (7..=200).contains(&c)), "moved after {calls:?} calls");
    }

    const FSYNC: CallDesc = CallDesc { kind: CallKind::Fsync, fd: 3, size: 0, site: 1 };

    /// A `predicted` policy at N = 5 µs whose fsync key ran `run` here until it moved, and
    /// whose moves then added `extras` to its caller's wait, one move each.
    fn moved_fsync(run: u64, extras: impl IntoIterator<Item = u64>) -> OffloadPolicy {
        let mut p: OffloadPolicy = "predicted:time:5000".parse().unwrap();
        // Once the key's runs have outvoted the plain majority of all calls, it moves.
        for _ in 0..10 {
            p.observe(&FSYNC, CallCost::local(run));
        }
        assert_eq!(p.decide(&FSYNC, 0), Decision::Offload);
        for extra in extras {
            p.observe(&FSYNC, CallCost::moved(run, run + extra));
        }
        p
    }

    fn effective_threshold(p: &OffloadPolicy) -> u64 {
        let OffloadPolicy::Predicted(inner) = p else { unreachable!() };
        inner.effective_threshold()
    }

    #[test]
    fn predicted_n_never_sits_below_the_measured_cost_of_a_move() {
        // Moves of this machine turn out to add 50 µs to the caller's wait.
        let p = moved_fsync(30_000, [50_000; 4]);
        assert_eq!(p.decide(&FSYNC, 0), Decision::Local);
        assert_eq!(effective_threshold(&p), 50_000);
    }

    #[test]
    fn predicted_n_sits_at_the_mean_cost_of_moves_held_up_one_time_in_two() {
        // Moves wait 2 µs and 2 ms by turns, as under another program's load on the service
        // CPU: about 1 ms a move, which a 100 µs call loses.
        let p = moved_fsync(100_000, (0..16).map(|i| if i % 2 == 0 { 2_000 } else { 2_000_000 }));
        assert_eq!(p.decide(&FSYNC, 0), Decision::Local);
        assert!(effective_threshold(&p) > 500_000, "N {}", effective_threshold(&p));
    }

    #[test]
    fn one_move_the_host_held_up_stops_a_call_that_pays_for_a_while_only() {
        // Moves add 5 µs, then one is held up for 20 ms: N goes above the fsync's run.
        let mut p = moved_fsync(1_000_000, [5_000; 16].into_iter().chain([20_000_000]));
        assert_eq!(p.decide(&FSYNC, 0), Decision::Local);
        let (fsync, read) = (FSYNC, CallDesc::new(CallKind::Read, 3, 100, 2));
        // Between fsyncs, the program's other calls stay where they are.
        let back = (1..=1000).find(|_| {
            for _ in 0..100 {
                p.observe(&read, CallCost::local(2_000));
            }
            let moves = p.decide(&fsync, 0) == Decision::Offload;
            p.observe(
                &fsync,
                if moves { CallCost::moved(1_000_000, 1_005_000) } else { CallCost::local(1_000_000) },
            );
            moves
        });
        assert!(back.is_some_and(|fsyncs| fsyncs > 1), "moved again after {back:?} fsyncs");
    }

    proptest! {
        #[test]
        fn never_and_always_ignore_everything(size in any::<u64>(), queue in any::<u64>(), fd in any::<i32>()) {
            let call = CallDesc::new(CallKind::Write, fd, size, 0);
            prop_assert_eq!(OffloadPolicy::Never.decide(&call, queue), Decision::Local);
            prop_assert_eq!(OffloadPolicy::Always.decide(&call, queue), Decision::Offload);
        }

        #[test]
        fn more_queue_never_turns_local_into_offload(
            runs in proptest::collection::vec(0u64..100_000, 1..20),
            n in 0u64..50_000,
            q1 in 0u64..50_000,
            extra in 0u64..50_000,
        ) {
            let mut p = OffloadPolicy::Predicted(Box::new(Predicted::fixed(TableForm::PAPER_FA, n).unwrap()));
            let call = read(64);
            for run in runs {
                p.observe(&call, CallCost::local(run));
            }
            if p.decide(&call, q1) == Decision::Local {
                prop_assert_eq!(p.decide(&call, q1 + extra), Decision::Local);
            }
        }
    }
}
