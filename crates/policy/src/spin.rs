//! How long an idle worker should spin before it sleeps (`Wake::SpinThenPark`).
//!
//! This is the ski-rental problem of spin-or-block: spinning costs CPU time while nothing
//! arrives; sleeping costs a wake-up (`W`, a futex wake plus the scheduler bringing the thread
//! back) when work does arrive. Spinning for exactly `W` and then sleeping never costs more
//! than twice the best choice made in hindsight (the classic 2-competitive rule), so that is the
//! budget with no history. With history, [`SpinBudget`] picks the budget that would have cost
//! least over the recent idle gaps, the way adaptive competitive spinning does: when gaps are
//! short (the target "went idle moments ago") it spins long enough to catch them, when they are
//! long it stops wasting the core.
//!
//! The cost of one idle gap `g` under budget `B` is `g` if `g <= B` (spun, caught it) and
//! `B + W` otherwise (spun in vain, then paid the wake-up). The *fitted* budget minimises the
//! sum over the window; candidates are 0 and the observed gaps up to `max_factor * W`. The
//! budget used is the fit times `slack` (capped at `max_factor * W`): the fit sits exactly on
//! the longest gap it catches, and a gap a little longer next time would pay a whole wake-up.
//! And the budget never drops below `min_fraction * W`: a short spin costs little, catches work
//! that comes back within moments even after a run of long idle periods, and keeps two workers
//! that pass work back and forth from locking each other into sleeping (once both sleep, each
//! sees the other's wake-up time as its own idle gap, which makes sleeping look right).
//!
//! Pure: observations (gap and wake-up costs in nanoseconds) in, a budget in nanoseconds out.
//!
//! # Examples
//! ```
//! use corehop_policy::spin::{SpinBudget, SpinConfig};
//! let mut s = SpinBudget::new(SpinConfig::default());
//! s.observe_wake_cost(8_000);
//! for _ in 0..16 {
//!     s.observe_idle_gap(300); // the target keeps coming back after 0.3 µs
//! }
//! assert_eq!(s.fitted_ns(), 300);
//! assert!(s.budget_ns() >= 300 && s.budget_ns() < 8_000);
//! for _ in 0..16 {
//!     s.observe_idle_gap(5_000_000); // now it stays idle for 5 ms at a time
//! }
//! assert_eq!(s.fitted_ns(), 0); // sleeping at once would have been best...
//! assert_eq!(s.budget_ns(), s.wake_cost_ns() / 4); // ...but a short spin stays
//! ```

use serde::{Deserialize, Serialize};

/// Tuning of [`SpinBudget`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SpinConfig {
    /// How many recent idle gaps the budget is fitted to.
    pub window: usize,
    /// The wake-up cost assumed until one is observed, in ns.
    pub initial_wake_cost_ns: u64,
    /// Never spin longer than this many wake-up costs.
    pub max_factor: u64,
    /// Weight of a new wake-up cost observation in its moving average, 1/2^shift.
    pub wake_cost_shift: u32,
    /// The budget is the fitted one times this (at least 1.0), for jitter in the gaps.
    pub slack: f64,
    /// Always spin at least this fraction of a wake-up's cost (0.0 ..= 1.0).
    pub min_fraction: f64,
}

/// No history: spin as long as a wake-up costs (about 5 µs for a futex wake on a VM).
pub const DEFAULT_WAKE_COST_NS: u64 = 5_000;

impl Default for SpinConfig {
    fn default() -> Self {
        SpinConfig {
            window: 16,
            initial_wake_cost_ns: DEFAULT_WAKE_COST_NS,
            max_factor: 4,
            wake_cost_shift: 3,
            slack: 2.0,
            min_fraction: 0.25,
        }
    }
}

/// The adaptive spin budget of one idle worker.
#[derive(Debug, Clone)]
pub struct SpinBudget {
    config: SpinConfig,
    wake_cost_ns: u64,
    gaps: Vec<u64>,
    /// The gaps in order, rebuilt by each refit (kept to refit without allocating).
    sorted: Vec<u64>,
    next: usize,
    fitted_ns: u64,
    budget_ns: u64,
    /// Observations recorded since the last refit.
    stale: bool,
}

impl SpinBudget {
    /// A budget with no history: spins for the initial wake-up cost.
    pub fn new(config: SpinConfig) -> Self {
        let config =
            SpinConfig { window: config.window.max(1), max_factor: config.max_factor.max(1), ..config };
        SpinBudget {
            config,
            wake_cost_ns: config.initial_wake_cost_ns,
            gaps: Vec::with_capacity(config.window),
            sorted: Vec::with_capacity(config.window),
            next: 0,
            fitted_ns: config.initial_wake_cost_ns,
            budget_ns: config.initial_wake_cost_ns,
            stale: false,
        }
    }

    /// How long to spin before sleeping, in ns.
    pub fn budget_ns(&self) -> u64 {
        self.budget_ns
    }

    /// The budget that would have cost least over the recent gaps (before `slack`), in ns.
    pub fn fitted_ns(&self) -> u64 {
        self.fitted_ns
    }

    /// The current estimate of a wake-up's cost, in ns.
    pub fn wake_cost_ns(&self) -> u64 {
        self.wake_cost_ns
    }

    /// One idle period ended after `gap_ns` (from the worker finding nothing to do until work
    /// arrived), whether it was caught spinning or slept through. Refits at once.
    pub fn observe_idle_gap(&mut self, gap_ns: u64) {
        self.record_idle_gap(gap_ns);
        self.refit_if_stale();
    }

    /// A sleeping worker took `cost_ns` from being woken to running again. Refits at once.
    pub fn observe_wake_cost(&mut self, cost_ns: u64) {
        self.record_wake_cost(cost_ns);
        self.refit_if_stale();
    }

    /// [`SpinBudget::observe_idle_gap`] without the refit, which costs O(window²): a worker
    /// records the gap when work arrives and refits later, once it is idle again and has
    /// spun a while, so the refit never delays the work that just arrived.
    pub fn record_idle_gap(&mut self, gap_ns: u64) {
        if self.gaps.len() < self.config.window {
            self.gaps.push(gap_ns);
        } else {
            self.gaps[self.next] = gap_ns;
        }
        self.next = (self.next + 1) % self.config.window;
        self.stale = true;
    }

    /// [`SpinBudget::observe_wake_cost`] without the refit.
    pub fn record_wake_cost(&mut self, cost_ns: u64) {
        let shift = self.config.wake_cost_shift.min(16);
        let old = self.wake_cost_ns as i128;
        let new = old + ((cost_ns as i128 - old) >> shift);
        self.wake_cost_ns = new.max(1) as u64;
        self.stale = true;
    }

    /// Whether something was recorded since the last refit.
    pub fn is_stale(&self) -> bool {
        self.stale
    }

    /// Brings the budget up to date with what was recorded; cheap if nothing was.
    pub fn refit_if_stale(&mut self) {
        if !self.stale {
            return;
        }
        self.stale = false;
        if self.gaps.is_empty() {
            self.fitted_ns = self.wake_cost_ns;
            self.budget_ns = self.wake_cost_ns;
        } else {
            self.refit();
        }
    }

    /// The fit: one sort and one pass, not one sum over the window per candidate. It runs in a
    /// spinning worker's loop, where a task that arrives meanwhile waits for it.
    fn refit(&mut self) {
        let wake = self.wake_cost_ns;
        let cap = wake.saturating_mul(self.config.max_factor);
        self.sorted.clear();
        self.sorted.extend_from_slice(&self.gaps);
        self.sorted.sort_unstable();
        let n = self.sorted.len() as u128;
        // Under budget `b`, a gap `g <= b` costs `g` and a longer one `b + W`. Budget 0 first;
        // then each distinct gap, once every gap up to it is summed. Ties go to the shorter
        // budget (same cost, less CPU burnt): a later candidate must cost strictly less.
        let mut best = (self.sorted.iter().filter(|&&g| g > 0).count() as u128 * wake as u128, 0);
        let mut caught = (0u128, 0u128); // (sum, count) of the gaps up to the candidate
        for (i, &g) in self.sorted.iter().enumerate() {
            caught = (caught.0 + g as u128, caught.1 + 1);
            let last_of_its_value = self.sorted.get(i + 1) != Some(&g);
            if g > cap {
                break;
            }
            if last_of_its_value {
                let cost = caught.0 + (n - caught.1) * (g as u128 + wake as u128);
                if cost < best.0 {
                    best = (cost, g);
                }
            }
        }
        self.fitted_ns = best.1;
        let floor = (wake as f64 * self.config.min_fraction) as u64;
        self.budget_ns = ((best.1 as f64 * self.config.slack) as u64).max(floor).min(cap).max(best.1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fit_after(gaps: &[u64], wake: u64) -> u64 {
        let mut s = SpinBudget::new(SpinConfig { initial_wake_cost_ns: wake, ..SpinConfig::default() });
        for &g in gaps {
            s.observe_idle_gap(g);
        }
        assert_eq!(s.budget_ns(), (s.fitted_ns() * 2).max(wake / 4).min(wake * 4));
        s.fitted_ns()
    }

    #[test]
    fn recording_defers_the_refit_to_the_same_result() {
        let gaps = [300, 5_000_000, 450, 200, 9_000];
        let mut eager = SpinBudget::new(SpinConfig::default());
        let mut lazy = eager.clone();
        for &g in &gaps {
            eager.observe_idle_gap(g);
            lazy.record_idle_gap(g);
        }
        eager.observe_wake_cost(20_000);
        lazy.record_wake_cost(20_000);
        assert!(lazy.is_stale());
        assert_eq!(lazy.budget_ns(), SpinConfig::default().initial_wake_cost_ns, "no refit yet");
        lazy.refit_if_stale();
        assert!(!lazy.is_stale());
        assert_eq!((lazy.fitted_ns(), lazy.budget_ns()), (eager.fitted_ns(), eager.budget_ns()));
    }

    #[test]
    fn no_history_spins_for_one_wake_cost() {
        let mut s = SpinBudget::new(SpinConfig::default());
        assert_eq!(s.budget_ns(), DEFAULT_WAKE_COST_NS);
        s.observe_wake_cost(DEFAULT_WAKE_COST_NS + 800);
        assert_eq!(s.budget_ns(), s.wake_cost_ns());
        assert_eq!(s.wake_cost_ns(), DEFAULT_WAKE_COST_NS + 100);
    }

    #[test]
    fn short_gaps_are_caught_long_gaps_are_slept_through() {
        assert_eq!(fit_after(&[200, 400, 300, 250], 5_000), 400);
        assert_eq!(fit_after(&[1_000_000; 8], 5_000), 0);
        // Mostly short with a rare long one: still worth spinning for the short ones.
        assert_eq!(fit_after(&[300, 300, 300, 1_000_000], 5_000), 300);
        // Gaps just beyond the wake cost: spinning for them would cost more than sleeping.
        assert_eq!(fit_after(&[30_000; 8], 5_000), 0);
    }

    #[test]
    fn the_window_forgets_old_gaps() {
        let mut gaps = vec![200; 16];
        gaps.extend([2_000_000; 16]);
        assert_eq!(fit_after(&gaps, 5_000), 0);
        gaps.extend([700; 16]);
        assert_eq!(fit_after(&gaps, 5_000), 700);
    }

    #[test]
    fn degenerate_config_is_clamped() {
        let config = SpinConfig {
            window: 0,
            max_factor: 0,
            slack: f64::NAN,
            min_fraction: f64::NAN,
            ..SpinConfig::default()
        };
        let mut s = SpinBudget::new(config);
        s.observe_idle_gap(10);
        s.observe_idle_gap(20);
        assert_eq!((s.fitted_ns(), s.budget_ns()), (20, 20));
        s.observe_wake_cost(0);
        assert!(s.wake_cost_ns() >= 1);
    }

    proptest! {
        #[test]
        fn budget_is_bounded_and_no_worse_than_the_fixed_rules(
            gaps in proptest::collection::vec(0u64..10_000_000, 1..40),
            wake in 1u64..100_000,
        ) {
            let config = SpinConfig { initial_wake_cost_ns: wake, ..SpinConfig::default() };
            let mut s = SpinBudget::new(config);
            for &g in &gaps {
                s.observe_idle_gap(g);
            }
            let b = s.fitted_ns();
            prop_assert!(b <= s.budget_ns() && s.budget_ns() <= wake * config.max_factor);
            prop_assert!(s.budget_ns() >= (wake as f64 * config.min_fraction) as u64);
            let window = &gaps[gaps.len().saturating_sub(config.window)..];
            prop_assert!(b == 0 || window.contains(&b));
            let cost = |budget: u64| -> u128 {
                window.iter().map(|&g| if g <= budget { g as u128 } else { (budget + wake) as u128 }).sum()
            };
            // Never worse over the window than always sleeping or the 2-competitive rule.
            prop_assert!(cost(b) <= cost(0));
            prop_assert!(cost(b) <= cost(wake));
            // And the best of the candidates by the definition (0 and each gap up to the cap),
            // the shortest of equals.
            let cap = wake * config.max_factor;
            let best = std::iter::once(0)
                .chain(window.iter().copied().filter(|&g| g <= cap))
                .min_by_key(|&c| (cost(c), c))
                .unwrap();
            prop_assert_eq!(b, best);
        }

        #[test]
        fn many_equal_gaps_fit_as_one(gap in 0u64..50_000, copies in 1usize..16, wake in 1u64..100_000) {
            let mut s = SpinBudget::new(SpinConfig { initial_wake_cost_ns: wake, ..SpinConfig::default() });
            for _ in 0..copies {
                s.observe_idle_gap(gap);
            }
            // Catching them all costs `gap` each; sleeping at once costs `W` each (nothing for
            // gaps of 0, which any budget catches).
            let expected = if gap > 0 && gap < wake { gap } else { 0 };
            prop_assert_eq!(s.fitted_ns(), expected);
        }
    }
}
