//! The threshold tuner: the offload threshold N chosen online by epoch sampling
//! (selective-os-offload §III.B).
//!
//! ```text
//!  sample N ─▶ sample N·f ─▶ sample N/f ─▶ best beats N by > margin? ─yes─▶ N := best, run base epochs
//!     ▲                                            │no
//!     │                                            ▼
//!     └──────── run `run_epochs` epochs ◀── keep N, double run_epochs, narrow f
//! ```
//!
//! Each epoch the driver reports one feedback number (higher is better: the application's own
//! progress rate, measured by the runtime; no hardware counters needed) and gets the N to use
//! for the next epoch. When an alternate wins, N moves there and the run between samplings goes
//! back to the base. When N stays, the run doubles (less sampling overhead, as in the paper)
//! and the step adapts: if an alternate was clearly worse, N sits near an optimum and the step
//! `f` narrows towards `min_step` (finer search); if all three were within the margin, the
//! curve is flat here (e.g. N above every call: nothing moves either way) and the step widens
//! towards `max_step` to look further.

use serde::{Deserialize, Serialize};

use super::OffloadError;

/// How the tuner searches.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TunerConfig {
    /// N to start from (the paper: 1 000 when the program spends over 10 % in the kernel,
    /// else 10 000).
    pub initial: u64,
    /// Smallest N ever tried (≥ 1 so the multiplicative step can climb back).
    pub min: u64,
    /// Largest N ever tried.
    pub max: u64,
    /// First multiplicative step: the alternates are N·step and N/step.
    pub step: f64,
    /// The step never narrows below this.
    pub min_step: f64,
    /// The step never widens beyond this.
    pub max_step: f64,
    /// An alternate must beat N's feedback by more than this fraction (0.01 = the paper's 1 %).
    pub margin: f64,
    /// Epochs to run between samplings after N changed (the paper: 100 M / 25 M = 4).
    pub run_epochs: u32,
    /// Cap on the doubled run length.
    pub max_run_epochs: u32,
}

impl Default for TunerConfig {
    fn default() -> TunerConfig {
        TunerConfig {
            initial: 10_000,
            min: 1,
            max: 100_000_000,
            step: 2.0,
            min_step: 1.1,
            max_step: 16.0,
            margin: 0.01,
            run_epochs: 4,
            max_run_epochs: 64,
        }
    }
}

impl TunerConfig {
    /// Checks every field's range.
    pub fn validate(&self) -> Result<(), OffloadError> {
        let bad = |field: &'static str, reason: String| Err(OffloadError::BadTuner { field, reason });
        if self.min == 0 || self.min > self.max {
            return bad("min", format!("need 1 <= min <= max, got min {} max {}", self.min, self.max));
        }
        if !(self.min..=self.max).contains(&self.initial) {
            return bad("initial", format!("{} is outside [{}, {}]", self.initial, self.min, self.max));
        }
        if !(self.min_step > 1.0 && self.step >= self.min_step && self.step.is_finite()) {
            return bad(
                "step",
                format!("need step >= min_step > 1, got {} and {}", self.step, self.min_step),
            );
        }
        if !(self.margin >= 0.0 && self.margin.is_finite()) {
            return bad("margin", format!("need a finite margin >= 0, got {}", self.margin));
        }
        if self.run_epochs == 0 || self.run_epochs > self.max_run_epochs {
            return bad(
                "run_epochs",
                format!("need 1 <= run_epochs <= max_run_epochs, got {}", self.run_epochs),
            );
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Phase {
    /// Sampling candidate `index` (0 = N, 1 = above, 2 = below); earlier scores kept.
    Sample { index: usize, scores: [f64; 3] },
    /// Running at N; `left` epochs to go before the next sampling.
    Run { left: u32 },
}

/// What the last completed sampling round decided.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Round {
    /// The Ns sampled: N, N·step, N/step.
    pub candidates: [u64; 3],
    /// Their feedback.
    pub scores: [f64; 3],
    /// The N chosen.
    pub chosen: u64,
}

/// The epoch-sampling tuner. Feed [`ThresholdTuner::epoch_end`] once per epoch.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ThresholdTuner {
    config: TunerConfig,
    threshold: u64,
    step: f64,
    run_epochs: u32,
    candidates: [u64; 3],
    phase: Phase,
    rounds: u32,
    last_round: Option<Round>,
}

impl ThresholdTuner {
    /// A tuner starting at `config.initial`.
    pub fn new(config: TunerConfig) -> Result<ThresholdTuner, OffloadError> {
        config.validate()?;
        let mut tuner = ThresholdTuner {
            config,
            threshold: config.initial,
            step: config.step,
            run_epochs: config.run_epochs,
            candidates: [config.initial; 3],
            phase: Phase::Sample { index: 0, scores: [0.0; 3] },
            rounds: 0,
            last_round: None,
        };
        tuner.candidates = tuner.candidates_around(config.initial);
        Ok(tuner)
    }

    /// The chosen threshold N (what the tuner settled on, not the value being sampled).
    pub fn threshold(&self) -> u64 {
        self.threshold
    }

    /// The N to apply during the current epoch (a candidate while sampling).
    pub fn current(&self) -> u64 {
        match self.phase {
            Phase::Sample { index, .. } => self.candidates[index],
            Phase::Run { .. } => self.threshold,
        }
    }

    /// Whether a sampling round is under way.
    pub fn is_sampling(&self) -> bool {
        matches!(self.phase, Phase::Sample { .. })
    }

    /// Epochs between samplings right now.
    pub fn run_epochs(&self) -> u32 {
        self.run_epochs
    }

    /// The multiplicative step of the next round.
    pub fn step(&self) -> f64 {
        self.step
    }

    /// Completed sampling rounds.
    pub fn rounds(&self) -> u32 {
        self.rounds
    }

    /// What the last completed round decided.
    pub fn last_round(&self) -> Option<Round> {
        self.last_round
    }

    /// Report the feedback of the epoch that just ended (higher is better); returns the N
    /// to apply during the next epoch. Non-finite feedback counts as the worst possible.
    pub fn epoch_end(&mut self, feedback: f64) -> u64 {
        let feedback = if feedback.is_finite() { feedback } else { f64::NEG_INFINITY };
        self.phase = match self.phase {
            Phase::Sample { index, mut scores } => {
                scores[index] = feedback;
                if index < 2 {
                    Phase::Sample { index: index + 1, scores }
                } else {
                    self.conclude(scores);
                    Phase::Run { left: self.run_epochs }
                }
            }
            Phase::Run { left } if left > 1 => Phase::Run { left: left - 1 },
            Phase::Run { .. } => {
                self.candidates = self.candidates_around(self.threshold);
                Phase::Sample { index: 0, scores: [0.0; 3] }
            }
        };
        self.current()
    }

    fn conclude(&mut self, scores: [f64; 3]) {
        let base = scores[0];
        let margin = self.config.margin * base.abs();
        let best = (1..3).max_by(|&a, &b| scores[a].total_cmp(&scores[b])).expect("two alternates");
        let moved = scores[best] > base + margin && self.candidates[best] != self.threshold;
        if moved {
            self.threshold = self.candidates[best];
            self.run_epochs = self.config.run_epochs;
        } else {
            self.run_epochs = (self.run_epochs * 2).min(self.config.max_run_epochs);
            let flat = scores[1..].iter().all(|&s| s >= base - margin);
            self.step = if flat {
                (self.step * self.step).min(self.config.max_step)
            } else {
                self.step.sqrt().max(self.config.min_step)
            };
        }
        self.rounds += 1;
        self.last_round = Some(Round { candidates: self.candidates, scores, chosen: self.threshold });
    }

    fn candidates_around(&self, n: u64) -> [u64; 3] {
        let clamp = |x: f64| (x.round() as u64).clamp(self.config.min, self.config.max);
        [n, clamp(n as f64 * self.step), clamp(n as f64 / self.step)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(tuner: &mut ThresholdTuner, epochs: usize, feedback: impl Fn(u64) -> f64) {
        for _ in 0..epochs {
            let n = tuner.current();
            tuner.epoch_end(feedback(n));
        }
    }

    /// Concave in N with its optimum at 3000.
    fn curve(n: u64) -> f64 {
        let x = (n as f64 - 3000.0) / 3000.0;
        100.0 * (1.0 - x * x)
    }

    #[test]
    fn converges_on_a_concave_curve_from_below_and_above() {
        for initial in [500, 1000, 20_000] {
            let mut t = ThresholdTuner::new(TunerConfig { initial, ..TunerConfig::default() }).unwrap();
            run(&mut t, 300, curve);
            let n = t.threshold();
            assert!((2600..=3400).contains(&n), "from {initial} settled at {n}");
        }
    }

    #[test]
    fn samples_above_and_below_in_order_then_runs() {
        let mut t = ThresholdTuner::new(TunerConfig { initial: 1000, ..TunerConfig::default() }).unwrap();
        assert_eq!(t.current(), 1000);
        assert_eq!(t.epoch_end(1.0), 2000);
        assert_eq!(t.epoch_end(5.0), 500);
        // 2000 beat 1000 by far more than 1 %: N moves, base run length.
        assert_eq!(t.epoch_end(0.5), 2000);
        assert_eq!(t.threshold(), 2000);
        assert!(!t.is_sampling());
        assert_eq!(t.run_epochs(), 4);
        for _ in 0..3 {
            assert_eq!(t.epoch_end(0.0), 2000);
        }
        assert_eq!(t.epoch_end(0.0), 2000);
        assert!(t.is_sampling());
    }

    #[test]
    fn at_an_optimum_n_stays_the_interval_lengthens_and_the_step_narrows() {
        let mut t = ThresholdTuner::new(TunerConfig { initial: 1000, ..TunerConfig::default() }).unwrap();
        let mut runs = vec![];
        for _ in 0..4 {
            // One alternate better by only 0.5 % (inside the 1 % margin), the other clearly worse.
            t.epoch_end(100.0);
            t.epoch_end(100.5);
            t.epoch_end(90.0);
            assert_eq!(t.threshold(), 1000);
            runs.push(t.run_epochs());
            let epochs = t.run_epochs() as usize;
            run(&mut t, epochs, |_| 0.0);
        }
        assert_eq!(runs, vec![8, 16, 32, 64]);
        assert!((t.step() - TunerConfig::default().min_step).abs() < 0.2);
    }

    #[test]
    fn on_a_flat_curve_the_step_widens_until_it_finds_a_slope() {
        // Nothing changes above N = 5000 (say, every call is shorter); below, lower is better.
        let feedback = |n: u64| if n >= 5000 { 1.0 } else { 2.0 - n as f64 / 5000.0 };
        let mut t = ThresholdTuner::new(TunerConfig { initial: 40_000, ..TunerConfig::default() }).unwrap();
        run(&mut t, 3, feedback);
        assert_eq!((t.threshold(), t.step()), (40_000, 4.0), "flat: N stays, the step squares");
        let epochs = t.run_epochs() as usize;
        run(&mut t, epochs + 3, feedback);
        assert_eq!((t.threshold(), t.step()), (40_000, 16.0), "N/4 = 10 000 is still flat");
        let epochs = t.run_epochs() as usize;
        run(&mut t, epochs + 3, feedback);
        assert_eq!(t.threshold(), 2_500, "N/16 reaches the slope");
        run(&mut t, 300, feedback);
        assert!(t.threshold() < 100, "and the slope leads down: {}", t.threshold());
    }

    #[test]
    fn bad_configs_are_typed_errors() {
        for (config, field) in [
            (TunerConfig { min: 0, ..TunerConfig::default() }, "min"),
            (TunerConfig { initial: 0, min: 1, ..TunerConfig::default() }, "initial"),
            (TunerConfig { step: 1.0, ..TunerConfig::default() }, "step"),
            (TunerConfig { margin: f64::NAN, ..TunerConfig::default() }, "margin"),
            (TunerConfig { run_epochs: 0, ..TunerConfig::default() }, "run_epochs"),
        ] {
            match ThresholdTuner::new(config) {
                Err(OffloadError::BadTuner { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: expected an error, got {other:?}"),
            }
        }
    }

    proptest! {
        #[test]
        fn n_stays_in_bounds_on_any_feedback(
            feedback in proptest::collection::vec(prop_oneof![any::<f64>(), -1e6f64..1e6], 1..200),
            initial in 1u64..1_000_000,
        ) {
            let config = TunerConfig { initial, min: 1, max: 1_000_000, ..TunerConfig::default() };
            let mut t = ThresholdTuner::new(config).unwrap();
            for f in feedback {
                let next = t.epoch_end(f);
                prop_assert!((1..=1_000_000).contains(&next));
                prop_assert!((1..=1_000_000).contains(&t.threshold()));
                prop_assert!(t.run_epochs() <= config.max_run_epochs);
            }
        }
    }
}
