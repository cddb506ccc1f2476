//! The measured policy: a kind of call moves only once moving it has been *measured* to cost
//! its caller less than running it in place.
//!
//! For every call key (the call, its call site, the power of two its size falls in, and
//! whether it names a descriptor) it keeps two estimates of what the call costs its caller:
//! run here (the run itself), and moved (from the decision to the result: the hand-off, any
//! queue, the run over there and the caller's wake-up). Each key starts local. Now and then a
//! call of the key takes the other side (a *probe*), so both estimates stay current and a
//! phase change shows; probes of a side that keeps losing come twice as rarely each time (up
//! to once in [`MeasuredConfig::max_backoff`] calls). A probe is taken only while the time
//! probes lost, plus what this one may lose, fits in [`MeasuredConfig::budget`] of the time
//! the calls took.
//! Before a key's moved cost is known, a probe is assumed to lose the prior cost of a move
//! (a hand-off plus a wake-up on the machine at hand), since the call runs as long there.
//! A key changes sides only when its estimates say so and two probes in a row each beat the
//! side it is on: one probe is one sample of a side sampled rarely. A call that took more than
//! twice what its side is expected to cost (a commit the host held up) counts as twice that, in
//! the estimates, the probes' losses and the risk of the next probe.
//!
//! So a kind of call never moves on a guess: the hop and wake-up costs of this machine,
//! whatever they are today, are in the figures it compares, and "do not move" is the default
//! of every key.

use serde::{Deserialize, Serialize};

use super::{CallDesc, Decision, Draw, Draws, OffloadError};

/// Keys tracked at once (direct-mapped; a colliding key takes the slot over and starts again).
pub const MEASURED_SLOTS: usize = 256;

/// Of the calls of settled keys, about one in this many is learned from, for this many calls
/// (see [`Measured::observe`]).
const SETTLED_LEARN_EVERY: u32 = 8;

/// A side's estimate is settled from this many samples on (its weight is down to 1/32).
const SETTLED_SAMPLES: u32 = 32;

/// How the measured policy learns.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MeasuredConfig {
    /// What a move is assumed to add to a call before one was measured (driver units: ns in
    /// the runtime): about a hand-off plus a wake-up.
    pub move_prior: u64,
    /// What the very first move is assumed to add, before any was measured: where service
    /// threads start on first need (the preload library), starting one. A driver whose
    /// service cores already run sets it to `move_prior`.
    pub first_move_prior: u64,
    /// Moving must be cheaper than staying by more than this fraction.
    pub margin: f64,
    /// A key that moves goes back once moving costs more than staying by this fraction: the
    /// most a move may lose against not moving. Below `margin`, so that a key whose two costs
    /// are close does not flap between the sides.
    pub revert_loss: f64,
    /// Share of the time spent in calls that probes may lose, at most.
    pub budget: f64,
    /// Samples of a side before it is compared.
    pub min_samples: u32,
    /// A losing side is probed at least once in this many calls of its key.
    pub max_backoff: u32,
}

impl Default for MeasuredConfig {
    fn default() -> MeasuredConfig {
        MeasuredConfig {
            move_prior: 20_000,
            first_move_prior: 200_000,
            margin: 0.05,
            revert_loss: 0.02,
            budget: 0.01,
            min_samples: 3,
            max_backoff: 1024,
        }
    }
}

impl MeasuredConfig {
    fn validate(&self) -> Result<(), OffloadError> {
        let bad = |field: &'static str, reason: String| Err(OffloadError::BadTuner { field, reason });
        if !(self.margin.is_finite() && self.margin >= 0.0) {
            return bad("margin", format!("need a finite margin >= 0, got {}", self.margin));
        }
        if !(self.revert_loss.is_finite() && self.revert_loss >= 0.0) {
            return bad("revert_loss", format!("need a finite revert_loss >= 0, got {}", self.revert_loss));
        }
        if !(self.budget.is_finite() && self.budget > 0.0 && self.budget < 1.0) {
            return bad("budget", format!("need 0 < budget < 1, got {}", self.budget));
        }
        if self.min_samples == 0 || self.max_backoff == 0 {
            return bad("min_samples", "min_samples and max_backoff must be at least 1".into());
        }
        Ok(())
    }
}

/// What one call cost its caller, as the driver measured it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallCost {
    /// Whether the call ran on a service core.
    pub moved: bool,
    /// How long the call itself ran, wherever it ran.
    pub run: u64,
    /// How long the caller waited for it, from the decision to the result (for a local call,
    /// its run).
    pub caller: u64,
}

impl CallCost {
    /// A call run in place for `run`.
    pub fn local(run: u64) -> CallCost {
        CallCost { moved: false, run, caller: run }
    }

    /// A call that ran `run` on a service core while its caller waited `caller`.
    pub fn moved(run: u64, caller: u64) -> CallCost {
        CallCost { moved: true, run, caller }
    }
}

/// A running mean that outliers cannot drag far: the first eight samples are averaged
/// geometrically, later ones are clipped to twice the mean and weigh 1/n, down to 1/32.
///
/// Clipped, because commits' `fsync`s here run at about 1 ms, with one in 25 held up 5 to 30
/// times longer by the host: weighing 1/8 and clipped at 8× the mean, such samples moved a
/// key's two estimates across each other and a key that paid to move went back for hundreds of
/// calls (docs/performance.md, twenty-second session).
///
/// Geometrically at first, because an outlier among the first few samples would otherwise set
/// the estimate for hundreds of calls: in `bench offload`'s file server, where the client
/// shares the server's CPU and preempts it, a socket call's first five runs averaged 333 µs
/// against 3 µs typical, a move at 67 µs looked five times cheaper, and the key moved thousands
/// of calls at 40-60 µs each (docs/performance.md, twenty-eighth session). The geometric mean
/// of those five runs is about 20 µs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CostEstimate {
    mean: f64,
    samples: u32,
}

impl CostEstimate {
    /// Adds one sample.
    pub fn add(&mut self, sample: u64) {
        let sample = sample as f64;
        self.samples = self.samples.saturating_add(1);
        if self.samples <= 8 {
            // The mean of the logarithms; a sample of 0 counts as 1 (ns). `libm`'s, not
            // `f64::ln`: that one needs libm.so, one more library for the preload to load.
            let n = f64::from(self.samples);
            let log_mean = if self.samples == 1 { 0.0 } else { libm::log(self.mean.max(1.0)) };
            self.mean = libm::exp(log_mean + (libm::log(sample.max(1.0)) - log_mean) / n);
        } else {
            self.mean += (sample.min(self.mean * 2.0) - self.mean) / f64::from(self.samples.min(32));
        }
    }

    /// The mean, once there is a sample.
    pub fn mean(&self) -> Option<f64> {
        (self.samples > 0).then_some(self.mean)
    }

    /// How many samples it has seen.
    pub fn samples(&self) -> u32 {
        self.samples
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Slot {
    /// The key's tag ([`tag`]); 0: empty.
    tag: u64,
    local: CostEstimate,
    moved: CostEstimate,
    /// Whether the next call of this key is a probe of the side not preferred.
    probe: bool,
    /// Calls of this key until the next probe is considered.
    countdown: u32,
    /// What `countdown` restarts from after a probe.
    backoff: u32,
    /// Whether the key moves (see [`Slot::wants_moving`]).
    moving: bool,
    /// Whether the last probe, on its own, found the side not preferred cheaper (see
    /// [`Measured::learn_into`]).
    probe_won: bool,
}

/// A key's tag: never 0, which marks an empty slot.
fn tag(key: u64) -> u64 {
    key.wrapping_add(1).max(1)
}

/// Words a [`Slot`] takes in a [`Slots`] table.
const SLOT_WORDS: usize = 6;

/// The slots as plain words, all zero when empty, so the table comes from zeroed memory
/// (`calloc`) that the OS maps on first touch: a process pays in page faults for the slots
/// its keys use, not for the table. `vec!` of a struct writes every element: 12 KB, three or
/// four page faults in every process of a shell pipeline that makes a call, most of which use
/// a handful of slots.
#[derive(Clone, Debug)]
struct Slots(Box<[u64]>);

impl Slots {
    fn new() -> Slots {
        Slots(vec![0; MEASURED_SLOTS * SLOT_WORDS].into_boxed_slice())
    }

    fn get(&self, index: usize) -> Slot {
        let w = &self.0[index * SLOT_WORDS..][..SLOT_WORDS];
        let estimate =
            |mean: u64, samples: u64| CostEstimate { mean: f64::from_bits(mean), samples: samples as u32 };
        Slot {
            tag: w[0],
            local: estimate(w[1], w[3] & 0xffff_ffff),
            moved: estimate(w[2], w[3] >> 32),
            countdown: w[4] as u32,
            backoff: (w[4] >> 32) as u32,
            probe: w[5] & 1 != 0,
            moving: w[5] & 2 != 0,
            probe_won: w[5] & 4 != 0,
        }
    }

    fn set(&mut self, index: usize, slot: Slot) {
        let w = &mut self.0[index * SLOT_WORDS..][..SLOT_WORDS];
        w[0] = slot.tag;
        w[1] = slot.local.mean.to_bits();
        w[2] = slot.moved.mean.to_bits();
        w[3] = u64::from(slot.local.samples) | u64::from(slot.moved.samples) << 32;
        w[4] = u64::from(slot.countdown) | u64::from(slot.backoff) << 32;
        w[5] = u64::from(slot.probe) | u64::from(slot.moving) << 1 | u64::from(slot.probe_won) << 2;
    }

    fn iter(&self) -> impl Iterator<Item = Slot> + '_ {
        (0..MEASURED_SLOTS).map(|i| self.get(i))
    }
}

impl Slot {
    /// A key's slot as it starts: local, its first probe after `min_samples` calls.
    fn new(tag: u64, config: &MeasuredConfig) -> Slot {
        Slot { tag, countdown: config.min_samples, backoff: 1, ..Slot::default() }
    }

    /// What a call of this key cost its caller (`cost`), clipped at twice the most the key's
    /// side it ran on is expected to cost: the larger of that side's estimate and the preferred
    /// side's (`preferred`); before the side has one, the preferred side's plus what a move
    /// costs (`move_cost`, see [`Measured::move_cost`]). A commit held up 5 to 30 times by the
    /// host is the host's doing, not the side's: as a first sample of moving, it made the
    /// estimate, the probes' regret and the risk of the next probe say "moving loses" for
    /// hundreds of commits: in a model of SQLite's commits (`tests/held_up_commits.rs`), 6-9
    /// runs in 40 kept the commit key in place for most of the run. Unclipped while nothing
    /// is known.
    fn clipped(&self, cost: CallCost, preferred: Option<f64>, move_cost: f64) -> f64 {
        let side = if cost.moved { self.moved.mean() } else { self.local.mean() };
        let expected = match (side, preferred) {
            (Some(side), Some(preferred)) => side.max(preferred),
            (None, Some(preferred)) => preferred + move_cost,
            (Some(side), None) => side,
            (None, None) => f64::INFINITY,
        };
        (cost.caller as f64).min(2.0 * expected)
    }

    /// Whether this key moves (when no probe is due).
    fn prefers_moving(&self) -> bool {
        self.moving
    }

    /// Whether the estimates say the key should move, with hysteresis: a key starts moving
    /// once moving is cheaper by the margin, and goes back once moving costs more than staying
    /// by the revert loss (fsync-like calls vary by tens of percent from one call to the next;
    /// a move may lose at most that much against not moving).
    fn wants_moving(&self, config: &MeasuredConfig) -> bool {
        match (self.local.mean(), self.moved.mean()) {
            (Some(local), Some(moved)) if self.moved.samples() >= config.min_samples => {
                if self.moving {
                    moved <= local * (1.0 + config.revert_loss)
                } else {
                    moved * (1.0 + config.margin) < local
                }
            }
            _ => false,
        }
    }

    /// What a probe's cost must beat the preferred side's estimate by to count as a win: the
    /// margin to start moving, the revert loss to go back.
    fn probe_edge(&self, config: &MeasuredConfig) -> f64 {
        if self.moving {
            config.revert_loss
        } else {
            config.margin
        }
    }

    fn moves(&self) -> bool {
        self.prefers_moving() != self.probe
    }

    /// Whether a call that cost `cost` is one more of this key's settled routine: no probe, run
    /// on the side it prefers, whose estimate is settled, and no probe due within the next
    /// [`SETTLED_LEARN_EVERY`] calls.
    fn routine(&self, key_tag: u64, cost: CallCost) -> bool {
        let side = if self.moving { &self.moved } else { &self.local };
        self.tag == key_tag
            && !self.probe
            && cost.moved == self.moving
            && side.samples() >= SETTLED_SAMPLES
            && self.countdown > SETTLED_LEARN_EVERY
    }

    /// Whether some call of this key may move next: it prefers moving or a probe is due.
    fn active(&self) -> bool {
        self.probe || self.prefers_moving()
    }
}

/// The per-call measured policy (see the module docs).
#[derive(Clone, Debug)]
pub struct Measured {
    config: MeasuredConfig,
    slots: Slots,
    /// Time the observed calls took, and the time probes are estimated to have lost.
    elapsed: f64,
    regret: f64,
    probes: u64,
    /// Slots whose next call may move (see [`Measured::moves_nothing`]).
    active: u32,
    /// What a move added to a call's cost, over every key whose cost in place was known when
    /// it moved (negative where the caller gets on with other work meanwhile): what a first
    /// probe of another key is expected to lose, in place of [`MeasuredConfig::move_prior`].
    extra: RunningMean,
    /// What a move cost its caller beyond the call's own run (the hand-off, any queue, the
    /// wake-ups), over every moved call: a call that runs here in less would lose, moved, unless
    /// its move came cheaper than moves here do, so it is not probed. Empty before the first
    /// move, which is a probe taken without it.
    handoff: RunningMean,
    /// Which routine calls are learned from (see [`Measured::observe`]).
    draws: Draws,
}

/// A running mean of signed samples: the first eight averaged, later ones weighing 1/8.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct RunningMean {
    mean: f64,
    samples: u32,
}

impl RunningMean {
    pub(crate) fn add(&mut self, sample: f64) {
        self.samples = self.samples.saturating_add(1);
        self.mean += (sample - self.mean) / f64::from(self.samples.min(8));
    }

    pub(crate) fn mean(&self) -> Option<f64> {
        (self.samples > 0).then_some(self.mean)
    }

    /// Takes `share` of the mean off it.
    pub(crate) fn ease(&mut self, share: f64) {
        self.mean -= self.mean * share;
    }
}

impl Measured {
    /// A measured policy; every key starts local.
    pub fn new(config: MeasuredConfig) -> Result<Measured, OffloadError> {
        config.validate()?;
        Ok(Measured {
            config,
            slots: Slots::new(),
            elapsed: 0.0,
            regret: 0.0,
            probes: 0,
            active: 0,
            extra: RunningMean::default(),
            handoff: RunningMean::default(),
            draws: Draws::default(),
        })
    }

    /// Its settings.
    pub fn config(&self) -> &MeasuredConfig {
        &self.config
    }

    fn index(key: u64) -> usize {
        (key % MEASURED_SLOTS as u64) as usize
    }

    /// Where `call` runs. Deterministic: the same state gives the same answer.
    pub fn decide(&self, call: &CallDesc) -> Decision {
        let key = call.timed_key();
        let slot = self.slots.get(Self::index(key));
        if slot.tag == tag(key) && slot.moves() {
            Decision::Offload
        } else {
            Decision::Local
        }
    }

    /// Whether every call stays local now, whatever it is (no key prefers moving and no
    /// probe is due): a driver may then skip [`Measured::decide`].
    pub fn moves_nothing(&self) -> bool {
        self.active == 0
    }

    /// What the last call of `call`'s key cost; it ran where [`Measured::decide`] said.
    ///
    /// Of a settled key's routine calls (no probe, on the side it prefers, no probe due soon)
    /// about one in eight, drawn at random, is learned from and stands for eight calls: of the
    /// key's calls towards its next probe, and of the time the probe budget is a share of. The
    /// others write nothing. So a key is probed about as often as before, and its estimate,
    /// which weighs a sample 1/32 by then, follows a change eight times more slowly; its probes
    /// catch a change first. Learning from every call, the policy's state moved between the
    /// CPUs of a task file server's tasks on every request and cost it 2-3 % against `always`,
    /// which moved the same calls (docs/performance.md, "Thirty-fourth session").
    pub fn observe(&mut self, call: &CallDesc, cost: CallCost) {
        let draw = self.draws.next();
        self.observe_drawn(call, cost, draw);
    }

    /// [`Measured::observe`] with the call's draw made by an adaptive policy, whose own stream
    /// serves both (one word written a call, not two).
    pub(crate) fn observe_drawn(&mut self, call: &CallDesc, cost: CallCost, draw: Draw) {
        let key = call.timed_key();
        let index = Self::index(key);
        let slot = self.slots.get(index);
        let weight = if slot.routine(tag(key), cost) {
            if !draw.one_in(SETTLED_LEARN_EVERY) {
                return;
            }
            SETTLED_LEARN_EVERY
        } else {
            1
        };
        let before = slot.active();
        // A new key, or one that takes the slot of another, starts afresh.
        let mut learned = if slot.tag == tag(key) { slot } else { Slot::new(tag(key), &self.config) };
        self.learn_into(&mut learned, cost, weight);
        self.slots.set(index, learned);
        self.active = self.active + u32::from(learned.active()) - u32::from(before);
    }

    /// Learns from one call that stands for `weight` calls of its key.
    fn learn_into(&mut self, slot: &mut Slot, cost: CallCost, weight: u32) {
        let config = self.config;
        self.elapsed += cost.caller as f64 * f64::from(weight);
        if cost.moved {
            self.handoff.add(cost.caller.saturating_sub(cost.run) as f64);
        }
        let preferred_moving = slot.prefers_moving();
        let preferred = if preferred_moving { slot.moved.mean() } else { slot.local.mean() };
        let caller = slot.clipped(cost, preferred, self.move_cost());
        if let (true, Some(local)) = (cost.moved, slot.local.mean()) {
            self.extra.add(caller - local);
        }
        let edge = slot.probe_edge(&config);
        if cost.moved {
            slot.moved.add(caller as u64);
        } else {
            slot.local.add(caller as u64);
        }
        let flip = slot.wants_moving(&config) != preferred_moving;
        if std::mem::take(&mut slot.probe) {
            self.probes += 1;
            self.regret += preferred.map_or(0.0, |p| (caller - p).max(0.0));
            // The key changes sides only when the estimates say so and two probes in a row each
            // beat the preferred side on their own: a probe is one sample of a side sampled
            // rarely, and one fast fsync among slow ones pulled a moving commit key back
            // (docs/performance.md, sixteenth session). A probe that won is repeated soon, to
            // confirm it, with the back-off kept: where a side's calls spread, one in five of
            // its probes may win by chance, and starting the back-off over at each such win
            // kept the key probing every few calls. One that did not win backs off.
            let won = preferred.is_some_and(|p| caller * (1.0 + edge) < p);
            let flipped = flip && won && slot.probe_won;
            slot.moving ^= flipped;
            // A win counts toward the next change of sides, not toward the way back.
            slot.probe_won = won && !flipped;
            slot.backoff = match (flipped, won) {
                (true, _) => 1,
                (false, true) => slot.backoff,
                (false, false) => slot.backoff.saturating_mul(2).min(config.max_backoff),
            };
            slot.countdown = if won && !flipped { 1 } else { slot.backoff };
            return;
        }
        if flip && slot.backoff > 1 {
            // The preferred side's own calls say the other is cheaper now (a phase change):
            // probe the other side soon, and change sides once two probes confirm it.
            slot.backoff = 1;
            slot.countdown = slot.countdown.min(1);
        }
        slot.countdown = slot.countdown.saturating_sub(weight);
        if slot.countdown > 0 || slot.local.samples() < config.min_samples {
            return;
        }
        let handoff = self.handoff.mean().unwrap_or(0.0);
        if !slot.moving && slot.local.mean().is_some_and(|local| local <= handoff * (1.0 + config.margin)) {
            // Moved, it would cost what a hand-off here costs, more than it costs here: a probe
            // wins only on a move cheaper than moves here are. A lone probe is seldom that: it
            // wakes a sleeping service thread and its caller. With the fastest hand-off seen as
            // the bar instead, one lucky probe let the file server's calls of 20-60 µs be
            // probed at 50-150 µs each, up to the whole budget (docs/performance.md,
            // "Forty-third session").
            slot.countdown = slot.backoff;
            return;
        }
        let risk = if self.moved_any() {
            Self::probe_risk(slot, &config, self.extra.mean())
        } else {
            config.first_move_prior as f64
        };
        if self.regret + risk <= config.budget * self.elapsed {
            slot.probe = true;
        } else {
            // Look again after a few more calls have added to the budget.
            slot.countdown = slot.backoff;
        }
    }

    /// Whether any call has moved yet.
    fn moved_any(&self) -> bool {
        self.handoff.mean().is_some()
    }

    /// What a move adds to a call of a key whose moves were not measured yet: what moves of
    /// other keys added (`extra`), at least the prior. Where moves cost far more than the
    /// prior (a closed-loop server whose service thread and caller both sleep between calls),
    /// a first move clipped at the prior was booked at a fraction of its cost, and the other
    /// arms, projected at the prior, looked nearly free to try (docs/performance.md,
    /// "Forty-second session").
    fn move_cost(&self) -> f64 {
        let prior = self.config.move_prior as f64;
        self.extra.mean().map_or(prior, |extra| extra.max(prior))
    }

    /// What a probe of the side `slot` does not prefer may lose: for a key never moved, what
    /// moves of other keys added (`extra`), or the prior before any was measured.
    fn probe_risk(slot: &Slot, config: &MeasuredConfig, extra: Option<f64>) -> f64 {
        let local = slot.local.mean().unwrap_or(0.0);
        if slot.prefers_moving() {
            (local - slot.moved.mean().unwrap_or(local)).max(0.0)
        } else {
            match slot.moved.mean() {
                Some(moved) => (moved - local).max(0.0),
                None => extra.map_or(config.move_prior as f64, |extra| extra.max(0.0)),
            }
        }
    }

    /// What `call` is expected to cost its caller run here and moved, from its key's
    /// estimates; `cost` (what the call just cost) stands in for a side not measured yet, plus
    /// what moves of other keys measured to add (at least the prior) for the moved side.
    pub fn expected_costs(&self, call: &CallDesc, cost: CallCost) -> (f64, f64) {
        let key = call.timed_key();
        let slot = self.slots.get(Self::index(key));
        let known = slot.tag == tag(key);
        let here_now = if cost.moved { cost.run } else { cost.caller } as f64;
        let local = slot.local.mean().filter(|_| known).unwrap_or(here_now);
        let moved = match slot.moved.mean().filter(|_| known) {
            Some(moved) => moved,
            None if cost.moved => cost.caller as f64,
            None => local + self.move_cost(),
        };
        (local, moved)
    }

    /// Probes taken, and the share of the calls' time they are estimated to have lost.
    pub fn probes(&self) -> (u64, f64) {
        (self.probes, if self.elapsed > 0.0 { self.regret / self.elapsed } else { 0.0 })
    }

    /// Keys that move now, of the keys seen.
    pub fn moving_keys(&self) -> (usize, usize) {
        let seen = self.slots.iter().filter(|s| s.local.samples() + s.moved.samples() > 0);
        let (mut moving, mut all) = (0, 0);
        for slot in seen {
            all += 1;
            moving += usize::from(slot.prefers_moving());
        }
        (moving, all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offload::CallKind;

    /// Runs `calls` calls alternating between `keys`; a call costs `local(key)` in place and
    /// `moved(key)` moved. Returns the total cost.
    fn drive(
        m: &mut Measured,
        calls: usize,
        keys: &[CallDesc],
        local: impl Fn(usize, usize) -> u64,
        moved: impl Fn(usize, usize) -> u64,
    ) -> u64 {
        let mut total = 0;
        for i in 0..calls {
            let k = i % keys.len();
            let cost = match m.decide(&keys[k]) {
                Decision::Local => CallCost::local(local(k, i)),
                Decision::Offload => CallCost::moved(local(k, i), moved(k, i)),
            };
            total += cost.caller;
            m.observe(&keys[k], cost);
        }
        total
    }

    fn fsync() -> CallDesc {
        CallDesc::new(CallKind::Fsync, 3, 0, 7)
    }

    fn fstat() -> CallDesc {
        CallDesc::new(CallKind::Fstat, 3, 0, 9)
    }

    proptest::proptest! {
        /// A slot reads back as it was written, whatever its fields.
        #[test]
        fn a_slot_reads_back_as_written(
            tag in proptest::prelude::any::<u64>(),
            means in proptest::prelude::any::<(u32, u32)>(),
            samples in proptest::prelude::any::<(u32, u32)>(),
            counts in proptest::prelude::any::<(u32, u32)>(),
            flags in proptest::prelude::any::<(bool, bool, bool)>(),
            index in 0..MEASURED_SLOTS,
        ) {
            let slot = Slot {
                tag,
                local: CostEstimate { mean: f64::from(means.0) / 3.0, samples: samples.0 },
                moved: CostEstimate { mean: -f64::from(means.1), samples: samples.1 },
                countdown: counts.0,
                backoff: counts.1,
                probe: flags.0,
                moving: flags.1,
                probe_won: flags.2,
            };
            let mut slots = Slots::new();
            proptest::prop_assert_eq!(slots.get(index), Slot::default(), "a new table is empty");
            slots.set(index, slot);
            proptest::prop_assert_eq!(slots.get(index), slot);
            proptest::prop_assert_eq!(slots.iter().filter(|s| *s != Slot::default()).count(), usize::from(slot != Slot::default()));
        }
    }

    #[test]
    fn a_moving_key_goes_back_once_moving_loses_more_than_two_percent() {
        let config = MeasuredConfig::default();
        let estimate = |mean: u64| {
            let mut e = CostEstimate::default();
            (0..config.min_samples).for_each(|_| e.add(mean));
            e
        };
        let slot = |local, moved, moving| {
            let s = Slot { local: estimate(local), moved: estimate(moved), moving, ..Slot::default() };
            s.wants_moving(&config)
        };
        // Starts moving only once moving is cheaper by the 5 % margin...
        assert!(!slot(10_000, 9_600, false));
        assert!(slot(10_000, 9_400, false));
        // ...keeps moving while it loses at most 2 %, and goes back beyond.
        assert!(slot(10_000, 10_150, true));
        assert!(!slot(10_000, 10_300, true));
        assert!(Measured::new(MeasuredConfig { revert_loss: f64::NAN, ..config }).is_err());
    }

    #[test]
    fn moves_nothing_where_moving_only_costs() {
        let mut m = Measured::new(MeasuredConfig::default()).unwrap();
        // fstat: 1.3 µs here, 2.5 µs moved (a hand-off more than the call).
        let total = drive(&mut m, 200_000, &[fstat()], |_, _| 1300, |_, _| 2500);
        assert_eq!(m.decide(&fstat()), Decision::Local);
        assert!(m.probes().0 > 0 && m.slots.iter().all(|s| !s.prefers_moving()));
        let never = 200_000 * 1300;
        assert!(
            total as f64 <= never as f64 * 1.011,
            "lost {:.3} %",
            (total as f64 / never as f64 - 1.0) * 100.0
        );
        assert!(m.probes().0 > 0, "it kept checking");
    }

    #[test]
    fn a_call_cheaper_than_a_hand_off_here_is_not_probed() {
        let mut m = Measured::new(MeasuredConfig::default()).unwrap();
        // A moved fsync: 900 µs on the service core, 930 µs for its caller. Hand-offs cost
        // 30 µs here, so fstat, 1.3 µs here, is never moved to see what moving costs.
        m.observe(&fsync(), CallCost::moved(900_000, 930_000));
        let fstat_moves = |m: &mut Measured| {
            (0..100_000)
                .filter(|_| {
                    let decision = m.decide(&fstat());
                    m.observe(&fstat(), CallCost::local(1300));
                    decision == Decision::Offload
                })
                .count()
        };
        assert_eq!(fstat_moves(&mut m), 0);
        // One lucky hand-off of 0.5 µs (the service thread happened to be awake) is not what
        // moves cost here: fstat is still not probed.
        m.observe(&fsync(), CallCost::moved(900_000, 900_500));
        assert_eq!(fstat_moves(&mut m), 0);
        // Hand-offs of 0.5 µs from now on (calls moving often enough to keep it awake):
        // fstat might gain, and is probed again.
        for _ in 0..30 {
            m.observe(&fsync(), CallCost::moved(900_000, 900_500));
        }
        assert!(fstat_moves(&mut m) > 0);
    }

    #[test]
    fn moves_what_is_cheaper_moved_and_keeps_the_rest() {
        let mut m = Measured::new(MeasuredConfig::default()).unwrap();
        // The commit's fsync waits 900 µs here and 700 µs moved; fstat only loses.
        let keys = [fsync(), fstat()];
        drive(&mut m, 20_000, &keys, |k, _| [900_000, 1300][k], |k, _| [700_000, 2500][k]);
        assert_eq!(m.decide(&fsync()), Decision::Offload);
        assert_eq!(m.decide(&fstat()), Decision::Local);
        assert_eq!(m.moving_keys(), (1, 2));
        assert!(!m.moves_nothing());
        let fresh = Measured::new(MeasuredConfig::default()).unwrap();
        assert!(fresh.moves_nothing());
    }

    #[test]
    fn a_settled_key_learns_from_a_few_of_its_calls_and_is_probed_as_often() {
        let mut m = Measured::new(MeasuredConfig { move_prior: 500, ..MeasuredConfig::default() }).unwrap();
        // fsync: 10 µs here, 2 µs moved, every call the same, so the estimates are too.
        drive(&mut m, 30_000, &[fsync()], |_, _| 10_000, |_, _| 2_000);
        assert!(m.decide(&fsync()) == Decision::Offload);
        let slot = |m: &Measured| m.slots.get(Measured::index(fsync().timed_key()));
        let (probes_before, _) = m.probes();
        let (mut written, mut probes) = (0, 0);
        for _ in 0..8_000 {
            let before = slot(&m);
            let cost = match m.decide(&fsync()) {
                Decision::Local => CallCost::local(10_000),
                Decision::Offload => CallCost::moved(10_000, 2_000),
            };
            probes += usize::from(before.probe);
            m.observe(&fsync(), cost);
            written += usize::from(slot(&m) != before);
        }
        // About one in eight routine calls learned (and wrote), each standing for eight calls.
        assert!((600..=1_500).contains(&written), "slot written on {written} of 8000 calls");
        assert_eq!(m.probes().0 - probes_before, probes as u64);
        // Backed off to once in 1024 calls: about eight probes, as if every call had counted.
        assert!((4..=12).contains(&probes), "{probes} probes in 8000 calls");
        assert!(m.decide(&fsync()) == Decision::Offload, "still moving");
    }

    #[test]
    fn follows_a_phase_change_both_ways() {
        let mut m = Measured::new(MeasuredConfig::default()).unwrap();
        let keys = [fsync()];
        // Moving pays, then costs, then pays again.
        let moved = |_: usize, i: usize| if (20_000..40_000).contains(&i) { 1_500_000 } else { 600_000 };
        drive(&mut m, 20_000, &keys, |_, _| 900_000, moved);
        assert_eq!(m.decide(&fsync()), Decision::Offload);
        let mut i = 20_000;
        let mut step = |m: &mut Measured, n: usize| {
            for _ in 0..n {
                let cost = match m.decide(&fsync()) {
                    Decision::Local => CallCost::local(900_000),
                    Decision::Offload => CallCost::moved(900_000, moved(0, i)),
                };
                m.observe(&fsync(), cost);
                i += 1;
            }
        };
        step(&mut m, 20_000);
        assert_eq!(m.decide(&fsync()), Decision::Local);
        step(&mut m, 20_000);
        assert_eq!(m.decide(&fsync()), Decision::Offload);
    }

    #[test]
    fn one_fast_probe_does_not_pull_a_moving_key_back() {
        let config = MeasuredConfig { first_move_prior: 20_000, ..MeasuredConfig::default() };
        let mut m = Measured::new(config).unwrap();
        drive(&mut m, 2_000, &[fsync()], |_, _| 1_000_000, |_, _| 940_000);
        assert_eq!(m.moving_keys().0, 1, "moving saves 6 %");
        // The next probe in place is one fast fsync among slow ones: alone it would pull the
        // key's estimate in place below the moved one.
        let probes = std::cell::Cell::new(0);
        let run = |m: &mut Measured, calls: usize, local: &dyn Fn(usize) -> u64| {
            let mut stayed = 0;
            for _ in 0..calls {
                let cost = match m.decide(&fsync()) {
                    Decision::Local => {
                        probes.set(probes.get() + 1);
                        CallCost::local(local(probes.get()))
                    }
                    Decision::Offload => CallCost::moved(1_000_000, 940_000),
                };
                m.observe(&fsync(), cost);
                stayed += usize::from(m.moving_keys().0 == 0);
            }
            stayed
        };
        let calls_back = run(&mut m, 5_000, &|probe| if probe == 1 { 300_000 } else { 1_000_000 });
        assert_eq!(calls_back, 0, "the key never went back");
        assert!(probes.get() >= 2, "the outlier was probed again");
        // Staying becomes cheaper for good: the key goes back.
        run(&mut m, 20_000, &|_| 500_000);
        assert_eq!(m.moving_keys().0, 0);
    }

    #[test]
    fn a_key_that_pays_to_move_stays_moved_through_a_heavy_tail() {
        // fsync as SQLite's commits ran it here: about 1 ms, one call in 25 held up 5-30x by
        // the host; moved 10 % cheaper. Samples that far out once dragged either side's estimate
        // across the other, and the key went back for hundreds of calls at a time.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            state >> 33
        };
        let mut fsync_ns = move |mean: f64| {
            let r = next();
            let core = mean * (0.85 + 0.3 * (r % 1000) as f64 / 1000.0);
            let tail = if r % 25 == 0 { 5.0 + (r / 25 % 26) as f64 } else { 1.0 };
            (core * tail) as u64
        };
        let mut m =
            Measured::new(MeasuredConfig { first_move_prior: 20_000, ..MeasuredConfig::default() }).unwrap();
        let (mut moved, mut calls) = (0, 0);
        for i in 0..20_000 {
            let cost = match m.decide(&fsync()) {
                Decision::Local => CallCost::local(fsync_ns(1_000_000.0)),
                Decision::Offload => {
                    let caller = fsync_ns(900_000.0);
                    CallCost::moved(caller, caller)
                }
            };
            if i >= 2_000 {
                calls += 1;
                moved += usize::from(cost.moved);
            }
            m.observe(&fsync(), cost);
        }
        assert!(moved * 100 >= calls * 97, "moved {moved} of {calls} calls");
    }

    #[test]
    fn a_short_process_never_pays_for_starting_a_service_thread() {
        let mut m = Measured::new(MeasuredConfig::default()).unwrap();
        // 10 ms of 2 µs calls: 1 % of it is less than a service thread's start.
        drive(&mut m, 5_000, &[fstat()], |_, _| 2000, |_, _| 2500);
        assert_eq!(m.probes().0, 0);
        // Where the service cores already run, the first move is priced like any other.
        let config = MeasuredConfig { first_move_prior: 20_000, ..MeasuredConfig::default() };
        let mut m = Measured::new(config).unwrap();
        drive(&mut m, 5_000, &[fstat()], |_, _| 2000, |_, _| 2500);
        assert!(m.probes().0 > 0);
    }

    #[test]
    fn a_new_key_is_probed_at_what_moves_measured_to_cost_here() {
        // A prior of 1 ms a move: priced at it, a probe of a 2 µs call needs 100 ms of calls.
        let config = MeasuredConfig {
            move_prior: 1_000_000,
            first_move_prior: 1_000_000,
            ..MeasuredConfig::default()
        };
        let open = CallDesc::new(CallKind::Openat, 3, 0, 11);
        let calls_until_moving = |m: &mut Measured| {
            (0..20_000).find(|_| {
                drive(m, 1, &[open], |_, _| 2000, |_, _| 500);
                m.decide(&open) == Decision::Offload && m.slots.get(Measured::index(open.timed_key())).moving
            })
        };
        // fsync's moves measured 100 µs cheaper than its runs in place...
        let mut m = Measured::new(config).unwrap();
        drive(&mut m, 20_000, &[fsync()], |_, _| 900_000, |_, _| 800_000);
        assert_eq!(m.decide(&fsync()), Decision::Offload);
        // ... so a first probe of openat risks nothing measured, and openat moves at once.
        let learned = calls_until_moving(&mut m).expect("openat never moved");
        // Without a measured move, the same openat waits for the prior to be paid for.
        let mut fresh = Measured::new(config).unwrap();
        fresh.handoff.add(0.0);
        let unlearned = calls_until_moving(&mut fresh);
        assert!(learned < 100, "{learned} calls");
        assert!(unlearned.is_none_or(|n| n > 10 * learned), "{unlearned:?} against {learned}");
    }

    #[test]
    fn a_single_call_learns_nothing_and_moves_nothing() {
        let mut m = Measured::new(MeasuredConfig::default()).unwrap();
        assert_eq!(m.decide(&fsync()), Decision::Local);
        m.observe(&fsync(), CallCost::local(1_000_000));
        assert_eq!(m.decide(&fsync()), Decision::Local);
        assert_eq!(m.probes().0, 0);
    }

    #[test]
    fn an_outlier_among_the_first_runs_does_not_make_a_dear_move_look_cheap() {
        // A socket call on a CPU its peer shares: 3 µs, 30 µs when the peer preempts it, and
        // 1.6 ms the first time (the peer was starting). Moved, it costs 60 µs every time.
        let config =
            MeasuredConfig { move_prior: 10_000, first_move_prior: 10_000, ..MeasuredConfig::default() };
        let mut m = Measured::new(config).unwrap();
        let local = |_: usize, i: usize| match i {
            0 => 1_600_000,
            i if i % 10 == 0 => 30_000,
            _ => 3_000,
        };
        let mut moved = 0;
        for i in 0..10_000 {
            let cost = match m.decide(&fstat()) {
                Decision::Local => CallCost::local(local(0, i)),
                Decision::Offload => CallCost::moved(3_000, 60_000),
            };
            moved += usize::from(cost.moved);
            m.observe(&fstat(), cost);
        }
        assert!(moved <= 20, "moved {moved} calls at twenty times their usual cost");
        assert_eq!(m.decide(&fstat()), Decision::Local);
    }

    #[test]
    fn one_outlier_does_not_drag_the_estimate() {
        let mut e = CostEstimate::default();
        for _ in 0..16 {
            e.add(1000);
        }
        e.add(10_000_000);
        assert!(e.mean().unwrap() < 2000.0, "{:?}", e.mean());
    }

    #[test]
    fn bad_settings_are_errors() {
        let bad = MeasuredConfig { budget: 0.0, ..MeasuredConfig::default() };
        assert!(Measured::new(bad).is_err());
        let bad = MeasuredConfig { margin: f64::NAN, ..MeasuredConfig::default() };
        assert!(Measured::new(bad).is_err());
    }
}
