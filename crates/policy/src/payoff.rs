//! Moves that pay: choosing online between ways of placing work, with *not moving* as a
//! first-class choice that every other way must beat.
//!
//! Every policy that moves work (offload a call, send an operation to its object's core, split
//! a pipeline, spin instead of sleeping) has arms: arm 0 ([`STAY`]) is "do not move", the
//! others are ways of moving. The driver runs the workload in epochs, tells the sampler how
//! much work each epoch got done and how long it took, and asks which arm to use next. The
//! sampler (the epoch sampling of selective-os-offload's threshold tuner, generalised to arms)
//!
//! - starts in [`STAY`], so a program that never runs long enough to learn anything pays
//!   nothing (or, with [`ArmSampler::starting_in`], in an arm that itself keeps work in place
//!   until moving it measured cheaper);
//! - samples a candidate arm for one *short* epoch between two epochs of the incumbent and
//!   scores it against their mean, so slow drifts in the workload cancel out, or against the
//!   median of the incumbent's recent epochs if that is higher: a slow spell of the host in
//!   the epochs around a trial does not make the trial win;
//! - moves to a candidate only when it beats the incumbent by more than a margin twice in a
//!   row (the winner of a round is tried once more before it takes over: one lucky epoch does
//!   not move anything; an arm's first trial, shorter still, only measures what it risks);
//!   the margin is at least the noise a trial's score shows, estimated from how much the
//!   incumbent's own epochs differ from one another, so that on a machine whose epochs vary
//!   by 10 % a 3 % "gain" does not move anything either, towards [`STAY`] or away from it;
//!   and always keeps [`STAY`] among the candidates of a moving incumbent (it never sits
//!   out), so it falls back when moving stops paying (phase changes);
//! - after a switch, weighs the new incumbent's first run of epochs against the last epochs
//!   of the arm it replaced, and goes back if the new one ran slower beyond their noise: a
//!   trial is short and a lucky one can win twice, but a run of full epochs shows what the
//!   switch really did;
//! - spends at most a fixed share of the elapsed time on the losses of its trials (the
//!   *regret budget*): a trial of any arm, [`STAY`] included, is started only when the loss
//!   it could cause, at the worst slowdown seen so far, fits in the budget, and what it did
//!   lose is booked as the time the program fell behind in it; an arm that lost is tried
//!   again after twice as many rounds each time it loses (back-off).
//!
//! So a policy built on it never loses more than about the budget (0.5 % by default) to not
//! moving, on any workload, beyond what the noise of its epochs hides (a difference smaller
//! than that moves nothing either way), and finds the moving arm where moving pays. The
//! default leaves room under the 2 % an adaptive policy may lose to not moving for an arm that
//! learns in its own way (the offload policy's measured arm spends up to 1 % on its probes)
//! and for noise.
//!
//! ```text
//!  warm-up (STAY) ─▶ run incumbent ─▶ round: inc, c1, inc, c2, …, inc ─▶ best beats inc? ─yes─▶ switch
//!                        ▲                 (trials only within the regret budget)  │no          │
//!                        ├─────────────── run twice as long (up to a cap) ◀────────┘             │
//!                        └── first run slower than the arm it replaced? take back ◀─────────────┘
//! ```
//!
//! # Examples
//! ```
//! use corehop_policy::payoff::{ArmSampler, PayoffConfig, STAY};
//! // Two arms: stay, or move. Moving makes the workload 30 % faster.
//! let mut sampler = ArmSampler::new(2, PayoffConfig::default()).unwrap();
//! for _ in 0..400 {
//!     let epoch = sampler.next_epoch();
//!     let rate = if epoch.arm == STAY { 1.0 } else { 1.3 };
//!     let length = epoch.length(1_000_000);
//!     sampler.epoch_end(rate * length as f64, length);
//! }
//! assert_eq!(sampler.incumbent(), 1);
//! ```

use serde::{Deserialize, Serialize};

/// Arm 0: do not move.
pub const STAY: usize = 0;

/// At most this many arms (a sampling round visits each).
pub const MAX_ARMS: usize = 16;

/// How the sampler trades learning for loss.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PayoffConfig {
    /// A candidate must beat the incumbent's rate by more than this fraction to take over (or
    /// by more than a trial's measured noise, if that is larger).
    pub margin: f64,
    /// Epochs at the incumbent before the first round (the workload's start is noisy).
    pub warmup_epochs: u32,
    /// Epochs at the incumbent between rounds after a change; doubles while nothing changes.
    pub run_epochs: u32,
    /// Cap on the doubled run.
    pub max_run_epochs: u32,
    /// A trial epoch lasts `1 / trial_divisor` of a normal epoch; an arm's first trial, whose
    /// cost nothing has measured yet, a quarter of that.
    pub trial_divisor: u32,
    /// Share of the elapsed time the trials' losses may cost, at most.
    pub regret_budget: f64,
    /// The slowdown a first trial of an arm is assumed to risk, before any was measured.
    pub assumed_slowdown: f64,
    /// A losing arm sits out at most this many rounds (the back-off doubles up to it).
    pub max_backoff_rounds: u32,
}

impl Default for PayoffConfig {
    fn default() -> PayoffConfig {
        PayoffConfig {
            margin: 0.02,
            warmup_epochs: 4,
            run_epochs: 4,
            max_run_epochs: 64,
            trial_divisor: 4,
            regret_budget: 0.005,
            assumed_slowdown: 4.0,
            max_backoff_rounds: 64,
        }
    }
}

/// A [`PayoffConfig`] that cannot work.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("payoff sampler: bad {field}: {reason}")]
pub struct PayoffError {
    /// The offending field (or `arms`).
    pub field: &'static str,
    /// Why.
    pub reason: String,
}

impl PayoffConfig {
    /// Checks every field's range.
    pub fn validate(&self) -> Result<(), PayoffError> {
        let bad = |field, reason: String| Err(PayoffError { field, reason });
        if !(self.margin.is_finite() && self.margin >= 0.0) {
            return bad("margin", format!("need a finite margin >= 0, got {}", self.margin));
        }
        if self.run_epochs == 0 || self.run_epochs > self.max_run_epochs {
            return bad(
                "run_epochs",
                format!("need 1 <= run_epochs <= max_run_epochs, got {}", self.run_epochs),
            );
        }
        if self.trial_divisor == 0 {
            return bad("trial_divisor", "must be at least 1".into());
        }
        if !(self.regret_budget.is_finite() && self.regret_budget > 0.0 && self.regret_budget < 1.0) {
            return bad("regret_budget", format!("need 0 < budget < 1, got {}", self.regret_budget));
        }
        if !(self.assumed_slowdown.is_finite() && self.assumed_slowdown > 1.0) {
            return bad(
                "assumed_slowdown",
                format!("need a finite slowdown > 1, got {}", self.assumed_slowdown),
            );
        }
        if self.max_backoff_rounds == 0 {
            return bad("max_backoff_rounds", "must be at least 1".into());
        }
        Ok(())
    }
}

/// What the driver runs next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Epoch {
    /// The arm to use.
    pub arm: usize,
    /// Whether this is a (short) trial of a candidate rather than the incumbent.
    pub trial: bool,
    /// What a trial's length is divided by.
    pub divisor: u32,
}

impl Epoch {
    /// This epoch's length, given a normal epoch's (trials are shorter), at least 1.
    pub fn length(&self, normal: u64) -> u64 {
        if self.trial {
            (normal / u64::from(self.divisor)).max(1)
        } else {
            normal.max(1)
        }
    }
}

/// What the last completed round found: each tried arm's rate over the incumbent's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoundReport {
    /// The incumbent during the round.
    pub incumbent: usize,
    /// (arm, its rate / the incumbent's around it) for each arm tried.
    pub ratios: Ratios,
    /// The incumbent after the round.
    pub chosen: usize,
}

/// A round's (arm, rate or ratio) pairs, in the order tried: at most one an arm, and the
/// confirmation of a winner. In place, not on the heap: the preload library ends epochs inside
/// the program's calls, some of them in signal handlers, where allocating or freeing could
/// find the heap half-changed by the code the handler interrupted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Ratios {
    items: [(usize, f64); MAX_ARMS + 1],
    len: usize,
}

impl Ratios {
    fn push(&mut self, item: (usize, f64)) {
        if let Some(slot) = self.items.get_mut(self.len) {
            *slot = item;
            self.len += 1;
        }
    }

    fn last_mut(&mut self) -> Option<&mut (usize, f64)> {
        self.len.checked_sub(1).map(|last| &mut self.items[last])
    }
}

impl std::ops::Deref for Ratios {
    type Target = [(usize, f64)];

    fn deref(&self) -> &[(usize, f64)] {
        &self.items[..self.len]
    }
}

/// The arms a round has still to try, a bit each (arm `a` is bit `a`), lowest first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Queue(u32);

impl Queue {
    fn pop(&mut self) -> Option<usize> {
        let arm = (self.0 != 0).then(|| self.0.trailing_zeros() as usize);
        self.0 &= self.0.wrapping_sub(1);
        arm
    }
}

// A round's ratios are kept in place (see `Ratios`), not boxed.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
enum Phase {
    /// Running the incumbent; a round starts when `left` reaches 0.
    Run { left: u32 },
    /// A round: `queue` holds the candidates still to try; `before` is the rate of the
    /// incumbent epoch just run; `trying` the candidate whose trial runs now.
    Round {
        queue: Queue,
        before: Option<f64>,
        trying: Option<(usize, f64)>,
        ratios: Ratios,
        /// Set in a confirmation round: the candidate that won the round before, and its ratio.
        confirming: Option<(usize, f64)>,
    },
}

/// The epoch sampler over `arms` arms. Feed [`ArmSampler::epoch_end`] once per epoch and ask
/// [`ArmSampler::next_epoch`] what to run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ArmSampler {
    config: PayoffConfig,
    arms: usize,
    incumbent: usize,
    phase: Phase,
    run_epochs: u32,
    /// Per arm: rounds still to sit out, and the back-off it gets if it loses again.
    sit_out: Vec<u32>,
    backoff: Vec<u32>,
    /// Per arm: the worst slowdown (incumbent rate / its rate, up to `assumed_slowdown`) a
    /// trial of it has shown (`assumed_slowdown` until one has), and whether one has.
    worst_slowdown: Vec<f64>,
    measured: Vec<bool>,
    /// Time elapsed, and the time the trials are estimated to have lost, in the driver's unit.
    elapsed: u64,
    regret: f64,
    /// The length of the last incumbent epoch (a trial lasts a `trial_divisor`-th of it).
    last_epoch: u64,
    /// The length of the trial being scored.
    trial_len: u64,
    rounds: u32,
    switches: u32,
    last_round: Option<RoundReport>,
    /// The running mean of the relative difference between the incumbent's consecutive full
    /// epochs: the noise of an epoch's rate.
    epoch_noise: f64,
    /// The rates of the incumbent's last full epochs (none right after a switch).
    recent: Recent,
    /// Since a switch, until the new incumbent's first run ends: the arm it replaced.
    replaced: Option<Replaced>,
    /// Switches taken back because the new incumbent lost its first run.
    taken_back: u32,
}

/// The share of its time a stretch of epochs that ran at `ratio` of the incumbent's rate lost:
/// the work it did not do, in the incumbent's time. At most all of it.
fn lost_share(ratio: f64) -> f64 {
    (1.0 - ratio).clamp(0.0, 1.0)
}

/// See [`ArmSampler::round_soon`]: the epochs a driver prepares a round in.
pub const ROUND_SOON: u32 = 2;

/// How many of the incumbent's epochs [`Recent`] keeps.
const RECENT: usize = 8;

/// The rates of an incumbent's last [`RECENT`] full epochs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Recent {
    rates: [f64; RECENT],
    len: usize,
    next: usize,
}

impl Recent {
    fn push(&mut self, rate: f64) {
        self.rates[self.next] = rate;
        self.next = (self.next + 1) % RECENT;
        self.len = (self.len + 1).min(RECENT);
    }

    /// The latest, if any.
    fn last(&self) -> Option<f64> {
        (self.len > 0).then(|| self.rates[(self.next + RECENT - 1) % RECENT])
    }

    /// Their median, if there are any (on a copy: no allocation).
    fn median(&self) -> Option<f64> {
        let mut rates = self.rates;
        let rates = &mut rates[..self.len];
        rates.sort_unstable_by(f64::total_cmp);
        let middle = self.len / 2;
        match self.len {
            0 => None,
            n if n % 2 == 1 => Some(rates[middle]),
            _ => Some((rates[middle - 1] + rates[middle]) / 2.0),
        }
    }

    /// Their mean, if there are any (while fewer than [`RECENT`], they fill the first slots).
    fn mean(&self) -> Option<f64> {
        (self.len > 0).then(|| self.rates[..self.len].iter().sum::<f64>() / self.len as f64)
    }
}

/// The arm a switch replaced, and the mean rate of its last full epochs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
struct Replaced {
    arm: usize,
    rate: f64,
    epochs: usize,
}

/// Weight of a new sample in the running mean of [`ArmSampler::epoch_noise`].
const NOISE_WEIGHT: f64 = 1.0 / 8.0;

impl ArmSampler {
    /// A sampler over `arms` arms (arm 0 is [`STAY`]), starting in [`STAY`].
    pub fn new(arms: usize, config: PayoffConfig) -> Result<ArmSampler, PayoffError> {
        config.validate()?;
        if !(1..=MAX_ARMS).contains(&arms) {
            return Err(PayoffError {
                field: "arms",
                reason: format!("need 1..={MAX_ARMS} arms, got {arms}"),
            });
        }
        Ok(ArmSampler {
            config,
            arms,
            incumbent: STAY,
            phase: Phase::Run { left: config.warmup_epochs },
            run_epochs: config.run_epochs,
            sit_out: vec![0; arms],
            backoff: vec![1; arms],
            worst_slowdown: vec![config.assumed_slowdown; arms],
            measured: vec![false; arms],
            elapsed: 0,
            regret: 0.0,
            last_epoch: 0,
            trial_len: 0,
            rounds: 0,
            switches: 0,
            last_round: None,
            epoch_noise: 0.0,
            recent: Recent::default(),
            replaced: None,
            taken_back: 0,
        })
    }

    /// The same sampler, starting in `arm` instead of [`STAY`] (an arm that is itself "stay
    /// unless moving measured cheaper"); [`STAY`] is still among the candidates of every round.
    /// An arm out of range is ignored.
    pub fn starting_in(mut self, arm: usize) -> ArmSampler {
        if arm < self.arms {
            self.incumbent = arm;
        }
        self
    }

    /// What the driver expects a trial of `arm` to run at: `slowdown` × the incumbent's time
    /// (from a model of the arm, e.g. measured costs of its moves). It stands for the arm's
    /// risk until a trial of it is measured, in place of [`PayoffConfig::assumed_slowdown`];
    /// it is clamped to [1, 1000] and ignored if not finite.
    pub fn expect_slowdown(&mut self, arm: usize, slowdown: f64) {
        if arm < self.arms && !self.measured[arm] && slowdown.is_finite() {
            self.worst_slowdown[arm] = slowdown.clamp(1.0, 1000.0);
        }
    }

    /// The arm in force (what the sampler settled on, not a trial).
    pub fn incumbent(&self) -> usize {
        self.incumbent
    }

    /// Completed rounds, and how many of them changed the incumbent.
    pub fn rounds(&self) -> (u32, u32) {
        (self.rounds, self.switches)
    }

    /// Switches taken back: the new incumbent's first run was slower than the arm it replaced.
    pub fn taken_back(&self) -> u32 {
        self.taken_back
    }

    /// What the last completed round found.
    pub fn last_round(&self) -> Option<&RoundReport> {
        self.last_round.as_ref()
    }

    /// The estimated share of the elapsed time lost to trials so far.
    pub fn regret_share(&self) -> f64 {
        if self.elapsed == 0 {
            0.0
        } else {
            self.regret / self.elapsed as f64
        }
    }

    /// The epoch to run now.
    pub fn next_epoch(&self) -> Epoch {
        match &self.phase {
            Phase::Round { trying: Some((arm, _)), .. } => {
                Epoch { arm: *arm, trial: true, divisor: self.trial_divisor(*arm) }
            }
            _ => Epoch { arm: self.incumbent, trial: false, divisor: self.config.trial_divisor },
        }
    }

    /// Whether a round may begin within the next [`ROUND_SOON`] epochs, or is under way: only
    /// then does a driver's model of the arms it has not run (their tables, their expected
    /// slowdown) serve a decision.
    pub fn round_soon(&self) -> bool {
        match self.phase {
            Phase::Run { left } => left <= ROUND_SOON,
            Phase::Round { .. } => true,
        }
    }

    /// What a trial of `arm` divides a normal epoch by: more for a first trial.
    fn trial_divisor(&self, arm: usize) -> u32 {
        if self.measured[arm] {
            self.config.trial_divisor
        } else {
            self.config.trial_divisor.saturating_mul(4)
        }
    }

    /// The epoch from [`ArmSampler::next_epoch`] ended: it got `work` done in `duration`
    /// (any units, the same every time; the rate `work / duration` is what is compared).
    /// A zero duration is ignored.
    pub fn epoch_end(&mut self, work: f64, duration: u64) {
        if duration == 0 {
            return;
        }
        self.elapsed = self.elapsed.saturating_add(duration);
        let rate = if work.is_finite() && work >= 0.0 { work / duration as f64 } else { 0.0 };
        if !self.next_epoch().trial {
            self.last_epoch = duration;
            self.note_noise(rate);
        }
        let phase = std::mem::replace(&mut self.phase, Phase::Run { left: 0 });
        self.phase = match phase {
            Phase::Run { left } if left > 1 => Phase::Run { left: left - 1 },
            Phase::Run { .. } if self.take_back_a_losing_switch() => Phase::Run { left: self.run_epochs },
            Phase::Run { .. } => self.start_round(rate),
            Phase::Round { queue, before, trying: Some((arm, _)), mut ratios, confirming } => {
                // The trial ended; the next epoch runs the incumbent again, to score it.
                ratios.push((arm, rate));
                self.trial_len = duration;
                Phase::Round { queue, before, trying: None, ratios, confirming }
            }
            Phase::Round { mut queue, before, trying: None, mut ratios, confirming } => {
                // An incumbent epoch ended: score the trial before it against its neighbours, or
                // the incumbent's median if that is higher. Where the host holds up a unit of
                // work now and then (a durable commit 5-30 times its usual time), one of the
                // two neighbours is often slow, and a trial of an arm no faster won against
                // their mean (tests/held_up_commits.rs).
                if let (Some(before), Some(last)) = (before, ratios.last_mut()) {
                    let around = ((before + rate) / 2.0).max(self.recent.median().unwrap_or(0.0));
                    last.1 = if around > 0.0 { last.1 / around } else { 0.0 };
                    let first = !self.measured[last.0];
                    self.charge_trial(last.0, last.1, self.trial_len);
                    if first {
                        // A first trial lasts a sixteenth of an epoch, a unit of work or two
                        // where units are long: it measures what the arm risks, and a later
                        // round scores the arm.
                        last.1 = last.1.min(1.0);
                    }
                }
                match self.next_candidate(&mut queue) {
                    Some(arm) => Phase::Round {
                        queue,
                        before: Some(rate),
                        trying: Some((arm, 0.0)),
                        ratios,
                        confirming,
                    },
                    None => self.conclude(ratios, confirming, rate),
                }
            }
        };
    }

    /// Learns from an incumbent epoch's `rate` how much such rates differ between epochs, and
    /// keeps it among the recent ones.
    fn note_noise(&mut self, rate: f64) {
        if let Some(last) = self.recent.last() {
            let mean = (last + rate) / 2.0;
            if mean > 0.0 {
                self.epoch_noise += NOISE_WEIGHT * ((rate - last).abs() / mean - self.epoch_noise);
            }
        }
        self.recent.push(rate);
    }

    /// The margin a candidate's score must clear to count as a win: the configured one,
    /// or the standard deviation of a trial's score if the incumbent's epochs show it larger. Two
    /// epochs' rates differ on average by 1.13 σ (σ: one epoch's relative noise); a trial
    /// lasts a `trial_divisor`-th of an epoch, so its noise is about σ √divisor, and its score
    /// (over the mean of the two incumbent epochs around it) has σ √(divisor + ½).
    pub fn margin(&self) -> f64 {
        let sigma = self.epoch_noise / 1.128;
        let trial = sigma * (f64::from(self.config.trial_divisor) + 0.5).sqrt();
        self.config.margin.max(trial)
    }

    /// At the end of the first run after a switch: whether the new incumbent ran slower than
    /// the arm it replaced, by more than the margin and twice the spread of the difference of
    /// their mean rates. If so it goes back to that arm, and the loser sits out as an arm that
    /// lost a round does. A workload that slowed down just then costs a switch back, which the
    /// next rounds undo if it was wrong.
    fn take_back_a_losing_switch(&mut self) -> bool {
        let Some(replaced) = self.replaced.take() else { return false };
        let sigma = self.epoch_noise / 1.128;
        let spread = sigma * (1.0 / self.recent.len as f64 + 1.0 / replaced.epochs as f64).sqrt();
        let now = match self.recent.mean() {
            Some(now) if now * (1.0 + self.config.margin + 2.0 * spread) < replaced.rate => now,
            _ => {
                // The switch held: the arm's back-off starts again.
                self.backoff[self.incumbent] = 1;
                return false;
            }
        };
        // What the run lost counts against the budget, as a trial's loss does.
        let run = (self.last_epoch * self.recent.len as u64) as f64;
        self.regret += run * lost_share(now / replaced.rate);
        let lost = self.incumbent;
        self.sit_out[lost] = self.backoff[lost];
        self.backoff[lost] = (self.backoff[lost] * 2).min(self.config.max_backoff_rounds);
        self.switch_to(replaced.arm);
        self.taken_back += 1;
        true
    }

    /// Makes `arm` the incumbent, with a first run of the base length.
    fn switch_to(&mut self, arm: usize) {
        self.incumbent = arm;
        self.run_epochs = self.config.run_epochs;
        // The new incumbent's rates are another level: its noise starts from its own.
        self.recent = Recent::default();
    }

    /// Begins a round after an incumbent epoch that ran at `rate`, if any candidate may be
    /// tried within the regret budget; otherwise runs on.
    fn start_round(&mut self, rate: f64) -> Phase {
        let mut queue = Queue(((1u32 << self.arms) - 1) & !(1 << self.incumbent));
        for arm in 0..self.arms {
            if arm != self.incumbent && arm != STAY {
                self.sit_out[arm] = self.sit_out[arm].saturating_sub(1);
            }
        }
        match self.next_candidate(&mut queue) {
            Some(arm) => Phase::Round {
                queue,
                before: Some(rate),
                trying: Some((arm, 0.0)),
                ratios: Ratios::default(),
                confirming: None,
            },
            None => Phase::Run { left: self.run_epochs },
        }
    }

    /// The next candidate of the round that is not sitting out and whose trial fits in the
    /// regret budget. [`STAY`] is never made to sit out: not moving is always worth checking,
    /// as soon as the budget allows.
    fn next_candidate(&self, queue: &mut Queue) -> Option<usize> {
        while let Some(arm) = queue.pop() {
            if arm != STAY && self.sit_out[arm] > 0 {
                continue;
            }
            if self.trial_fits(arm) {
                return Some(arm);
            }
        }
        None
    }

    /// Whether a trial of `arm` at its worst slowdown seen keeps the trials' losses within the
    /// budget of the time elapsed (a trial lasts a `trial_divisor`-th of the last epoch).
    fn trial_fits(&self, arm: usize) -> bool {
        let trial = self.last_epoch as f64 / f64::from(self.trial_divisor(arm));
        let risk = trial * (self.worst_slowdown[arm] - 1.0).max(0.0);
        self.regret + risk <= self.config.regret_budget * self.elapsed as f64
    }

    /// Books what a trial of `arm` that lasted `trial` and ran at `ratio` of the incumbent's
    /// rate cost: the time the program fell behind in it, at most the trial's own length. The
    /// slowdown it showed, the arm's risk from now on, counts up to the assumed one: slower
    /// than that, a trial says more about the host than about the arm.
    ///
    /// It was booked as the time the trial's arm would take to catch up, `trial × (1/ratio -
    /// 1)`, without bound: under another program's load on both CPUs a 4 ms trial in which
    /// the program got the CPU for one request of 120 scored 0.008 and booked 460 ms, and no
    /// round could start for the next 90 s (docs/performance.md, "Forty-eighth session").
    fn charge_trial(&mut self, arm: usize, ratio: f64, trial: u64) {
        let assumed = self.config.assumed_slowdown;
        let slowdown = if ratio > 0.0 { (1.0 / ratio).clamp(1.0, assumed) } else { assumed };
        self.regret += trial as f64 * lost_share(ratio.max(0.0));
        self.worst_slowdown[arm] =
            if self.measured[arm] { self.worst_slowdown[arm].max(slowdown) } else { slowdown };
        self.measured[arm] = true;
    }

    /// Ends a round whose last incumbent epoch ran at `rate`. A round's winner is tried once
    /// more (a confirmation round) before it takes over.
    fn conclude(&mut self, ratios: Ratios, confirming: Option<(usize, f64)>, rate: f64) -> Phase {
        // Not moving needs the same margin: a fall to STAY on noise loses as much as a move
        // does, and where trials cannot resolve a difference, neither can they show that
        // moving lost. With the configured margin alone, in a model of durable commits a
        // third of the runs fell to STAY and stayed there, up to 24 % below moving them
        // (tests/held_up_commits.rs).
        let needed = 1.0 + self.margin();
        let best = ratios.iter().copied().filter(|&(_, r)| r > needed).max_by(|a, b| a.1.total_cmp(&b.1));
        if let (Some((arm, ratio)), None) = (best, confirming) {
            if self.trial_fits(arm) {
                return Phase::Round {
                    queue: Queue::default(),
                    before: Some(rate),
                    trying: Some((arm, 0.0)),
                    ratios,
                    confirming: Some((arm, ratio)),
                };
            }
        }
        // In a confirmation round the winner must win again; it counts with its lower ratio.
        let best = match confirming {
            Some((arm, first)) => ratios
                .iter()
                .rev()
                .find(|&&(a, _)| a == arm)
                .filter(|&&(_, second)| second > needed)
                .map(|&(_, second)| (arm, first.min(second))),
            None => best,
        };
        for &(arm, ratio) in ratios.iter() {
            if arm == STAY || Some(arm) == best.map(|b| b.0) {
                continue;
            }
            if ratio < 1.0 / (1.0 + self.config.margin) {
                // Lost: sit out twice as long as last time.
                self.sit_out[arm] = self.backoff[arm];
                self.backoff[arm] = (self.backoff[arm] * 2).min(self.config.max_backoff_rounds);
            }
        }
        let previous = self.incumbent;
        if let Some((arm, _)) = best {
            // The winner's back-off starts again once its first run held (or now, with nothing
            // to weigh that run against): an arm whose switches are taken back sits out longer
            // each time, however often its trials win.
            self.replaced =
                self.recent.mean().map(|rate| Replaced { arm: previous, rate, epochs: self.recent.len });
            if self.replaced.is_none() {
                self.backoff[arm] = 1;
            }
            self.sit_out[previous] = 0;
            self.switch_to(arm);
            self.switches += 1;
        } else {
            self.run_epochs = (self.run_epochs * 2).min(self.config.max_run_epochs);
        }
        self.rounds += 1;
        self.last_round = Some(RoundReport { incumbent: previous, ratios, chosen: self.incumbent });
        Phase::Run { left: self.run_epochs }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Runs `epochs` epochs of normal length 1000 against `rate(arm, epoch)`; returns the work
    /// done and the time taken.
    fn drive(sampler: &mut ArmSampler, epochs: usize, rate: impl Fn(usize, usize) -> f64) -> (f64, u64) {
        let mut i = 0;
        drive_epochs(sampler, epochs, |epoch| {
            i += 1;
            rate(epoch.arm, i - 1)
        })
    }

    /// Runs `epochs` epochs of 1000 units (trials shorter), each at `rate(epoch)`; returns the
    /// work done and the time taken.
    fn drive_epochs(
        sampler: &mut ArmSampler,
        epochs: usize,
        mut rate: impl FnMut(Epoch) -> f64,
    ) -> (f64, u64) {
        let (mut work, mut time) = (0.0, 0);
        for _ in 0..epochs {
            let epoch = sampler.next_epoch();
            let length = epoch.length(1000);
            let done = rate(epoch) * length as f64;
            sampler.epoch_end(done, length);
            work += done;
            time += length;
        }
        (work, time)
    }

    fn sampler(arms: usize) -> ArmSampler {
        ArmSampler::new(arms, PayoffConfig::default()).unwrap()
    }

    #[test]
    fn converges_to_stay_where_moving_only_costs() {
        let mut s = sampler(3);
        // Arm 1 runs at 1/3.5 of the speed (cp -r under `always`), arm 2 at 0.9.
        let (work, time) = drive(&mut s, 2000, |arm, _| [1.0, 1.0 / 3.5, 0.9][arm]);
        assert_eq!(s.incumbent(), STAY);
        // Within the regret budget of never having tried (1 %, plus a little rounding).
        assert!(work / time as f64 >= 0.985, "rate {}", work / time as f64);
        assert!(s.regret_share() <= 0.0105, "regret {}", s.regret_share());
    }

    /// Multiplicative noise of up to ±`amplitude`, fixed by the epoch's index.
    fn noise(epoch: usize, amplitude: f64) -> f64 {
        let mut x = (epoch as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        x ^= x >> 29;
        x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x ^= x >> 32;
        1.0 + amplitude * ((x % 2001) as f64 / 1000.0 - 1.0)
    }

    #[test]
    fn a_tie_hidden_in_noisy_epochs_moves_nothing() {
        let mut s = sampler(2);
        // Moving changes nothing, and epochs vary by up to ±12 %: a few trials look 2 % better
        // by chance, but not by more than the noise the incumbent's epochs show, twice.
        drive(&mut s, 3000, |_, i| noise(i, 0.12));
        assert_eq!(s.incumbent(), STAY);
        assert_eq!(s.rounds().1, 0, "switched on noise: {:?}", s.last_round());
        assert!(s.margin() > 0.05, "margin {}", s.margin());
    }

    #[test]
    fn a_gain_above_the_noise_still_moves() {
        let mut s = sampler(2);
        drive(&mut s, 1000, |arm, i| [1.0, 1.4][arm] * noise(i, 0.12));
        assert_eq!(s.incumbent(), 1);
    }

    #[test]
    fn converges_to_the_moving_arm_where_moving_only_gains() {
        let mut s = sampler(3);
        drive(&mut s, 600, |arm, _| [1.0, 1.25, 1.1][arm]);
        assert_eq!(s.incumbent(), 1);
        assert!(s.rounds().1 >= 1);
    }

    #[test]
    fn follows_a_phase_change_back_to_stay() {
        let mut s = sampler(2);
        // Moving pays for the first 800 epochs, then costs 30 %.
        drive(&mut s, 800, |arm, _| [1.0, 1.3][arm]);
        assert_eq!(s.incumbent(), 1);
        drive(&mut s, 800, |arm, _| [1.0, 0.7][arm]);
        assert_eq!(s.incumbent(), STAY, "{:?}", s.last_round());
        // And forward again when moving pays once more.
        drive(&mut s, 3000, |arm, _| [1.0, 1.3][arm]);
        assert_eq!(s.incumbent(), 1, "{:?}", s.last_round());
    }

    #[test]
    fn a_flat_difference_within_the_margin_does_not_move() {
        let mut s = sampler(2);
        drive(&mut s, 1000, |arm, _| [1.0, 1.01][arm]);
        assert_eq!(s.incumbent(), STAY);
    }

    #[test]
    fn one_lucky_trial_does_not_switch() {
        let mut s = sampler(2);
        // The moving arm is no better, except that its first trial happens to run 30 % faster.
        let mut lucky = true;
        drive_epochs(
            &mut s,
            3000,
            |epoch| if epoch.arm == 1 && std::mem::take(&mut lucky) { 1.3 } else { 1.0 },
        );
        assert!(s.rounds().0 > 0);
        assert_eq!(s.rounds().1, 0, "no switch: {:?}", s.last_round());
    }

    #[test]
    fn a_switch_that_loses_its_first_run_is_taken_back() {
        let mut s = sampler(2);
        // The moving arm runs 30 % faster for a trial's length and at 0.6 over a full epoch (a
        // cache it fills, then thrashes): every trial of it wins.
        let (work, time) = drive_epochs(&mut s, 3000, |epoch| match (epoch.arm, epoch.trial) {
            (STAY, _) => 1.0,
            (_, true) => 1.3,
            (_, false) => 0.6,
        });
        // Each switch costs a run of four epochs at 0.6, and the loser sits out longer each time
        // (without taking switches back: 0.86).
        assert!(work / time as f64 >= 0.99, "rate {}", work / time as f64);
        assert!(s.taken_back() >= 1);
        assert_eq!(s.incumbent(), STAY);
    }

    #[test]
    fn a_trial_the_host_held_up_costs_its_length_and_stops_nothing() {
        // The first trial gets almost nothing done (the program lost the CPU to another for
        // its length); otherwise arm 1 runs 30 % faster than staying.
        let mut s = sampler(2);
        let mut first_trial = true;
        let (work, time) = drive_epochs(&mut s, 600, |epoch| {
            if epoch.trial && std::mem::take(&mut first_trial) {
                0.001
            } else {
                [1.0, 1.3][epoch.arm]
            }
        });
        // Booked as the time the program fell behind (before: 999 times the trial's length,
        // which kept any other round out of the budget for about 100 000 epochs).
        assert!(s.regret_share() <= PayoffConfig::default().regret_budget, "regret {}", s.regret_share());
        assert_eq!(s.incumbent(), 1, "{:?}", s.last_round());
        assert!(work / time as f64 > 1.2, "rate {}", work / time as f64);
    }

    #[test]
    fn a_short_run_never_tries_anything() {
        let mut s = sampler(3);
        drive(&mut s, 15, |arm, _| [1.0, 0.1, 0.1][arm]);
        assert_eq!(s.rounds().0, 0);
        assert_eq!(s.regret_share(), 0.0);
    }

    #[test]
    fn bad_configs_are_typed_errors() {
        assert_eq!(ArmSampler::new(0, PayoffConfig::default()).unwrap_err().field, "arms");
        assert_eq!(ArmSampler::new(MAX_ARMS + 1, PayoffConfig::default()).unwrap_err().field, "arms");
        let bad = PayoffConfig { regret_budget: 0.0, ..PayoffConfig::default() };
        assert_eq!(ArmSampler::new(2, bad).unwrap_err().field, "regret_budget");
        let bad = PayoffConfig { margin: f64::NAN, ..PayoffConfig::default() };
        assert_eq!(ArmSampler::new(2, bad).unwrap_err().field, "margin");
    }

    proptest! {
        /// Whatever the arms' rates (fixed per arm, moving arms possibly far worse), the
        /// sampler never loses more than the budget plus the margin to staying put.
        #[test]
        fn never_loses_more_than_the_budget_to_staying(rates in proptest::collection::vec(0.05f64..3.0, 1..5)) {
            let mut all = vec![1.0];
            all.extend(rates);
            let mut s = ArmSampler::new(all.len(), PayoffConfig::default()).unwrap();
            let (work, time) = drive(&mut s, 3000, |arm, _| all[arm]);
            let rate = work / time as f64;
            prop_assert!(rate >= 1.0 - 0.01 - 0.02 - 1e-9, "rate {} with arms {:?}", rate, all);
            prop_assert!(s.incumbent() < all.len());
        }

        /// Zero, negative or non-finite feedback never panics or picks an arm out of range.
        #[test]
        fn odd_feedback_is_harmless(feedback in proptest::collection::vec(prop_oneof![Just(f64::NAN), Just(-1.0), Just(0.0), 0.0f64..10.0], 1..300)) {
            let mut s = ArmSampler::new(3, PayoffConfig::default()).unwrap();
            for (i, f) in feedback.into_iter().enumerate() {
                let e = s.next_epoch();
                prop_assert!(e.arm < 3);
                s.epoch_end(f, (i % 3) as u64 * 100);
            }
        }
    }
}
