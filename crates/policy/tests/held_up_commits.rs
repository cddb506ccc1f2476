//! The measured policy on a model of SQLite's durable transactions, whose commits the host now
//! and then holds up: it moves the commit key where moving pays and keeps it in place where
//! moving loses, in every one of many seeded runs, not just on average.
//!
//! The same for the default adaptive policy, which samples arms (never, always, the measured
//! policy and others) by the transactions each 20 ms epoch completes.
//!
//! A transaction is six small writes (3 µs; a move adds 2.5 µs) and a commit whose run is
//! log-normal about 1.4 ms, one in 25 held up 5 to 30 times longer, as `fsync` runs on the
//! development VM (docs/performance.md, "Thirty-seventh session"). A moved commit costs its
//! caller `gain` times its run. Each run's cost is compared with the oracle's, which moves
//! exactly the calls whose move pays.

use corehop_policy::offload::{CallCost, CallDesc, CallKind, Decision, OffloadPolicy};

/// A xorshift generator: the model needs reproducible draws, not good ones.
struct Draws(u64);

impl Draws {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Log-normal about `median` (Box-Muller).
    fn log_normal(&mut self, median: f64, sigma: f64) -> f64 {
        let (u, v) = (self.uniform().max(1e-12), self.uniform());
        let normal = (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos();
        median * (sigma * normal).exp()
    }
}

const TRANSACTIONS: usize = 1000;
const SEEDS: u64 = 40;
/// What a move adds to a small write (ns).
const HANDOFF_NS: f64 = 2_500.0;
/// An adaptive policy's epoch, as `corehop run` and `bench offload` have it (ns).
const EPOCH_NS: u64 = 20_000_000;

/// The cost of one run of `TRANSACTIONS` under the policy `spec` over the oracle's.
fn cost_over_oracle(spec: &str, seed: u64, sigma: f64, gain: f64) -> f64 {
    let mut draws = Draws(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut policy: OffloadPolicy = spec.parse().unwrap();
    let write = CallDesc::new(CallKind::from_name("pwrite64"), 5, 4096, 0x1111);
    let commit = CallDesc::new(CallKind::from_name("fdatasync"), 5, 0, 0x2222);
    let (mut total, mut oracle) = (0.0, 0.0);
    let (mut epoch_start, mut epoch_units) = (0.0, 0);
    let mut call = |policy: &mut OffloadPolicy, total: &mut f64, desc: &CallDesc, run: f64, moved: f64| {
        let cost = match policy.decide(desc, 0) {
            Decision::Local => CallCost::local(run as u64),
            // What ran on the service core: the caller's wait less the hand-off.
            Decision::Offload => CallCost::moved((moved - HANDOFF_NS).max(0.0) as u64, moved as u64),
        };
        *total += cost.caller as f64;
        oracle += run.min(moved);
        policy.observe(desc, cost);
    };
    for _ in 0..TRANSACTIONS {
        for _ in 0..6 {
            let run = draws.log_normal(3_000.0, 0.2);
            call(&mut policy, &mut total, &write, run, run + HANDOFF_NS);
        }
        let mut run = draws.log_normal(1_400_000.0, sigma);
        if draws.uniform() < 0.04 {
            run *= 5.0 + 25.0 * draws.uniform();
        }
        call(&mut policy, &mut total, &commit, run, gain * run);
        epoch_units += 1;
        let elapsed = (total - epoch_start) as u64;
        if policy.wants_epochs() && policy.epoch_over(elapsed, epoch_units, EPOCH_NS) {
            policy.epoch_end(epoch_units as f64, elapsed);
            (epoch_start, epoch_units) = (total, 0);
        }
    }
    total / oracle
}

/// The mean and the worst of the runs' costs over the oracle's, over `SEEDS` seeds.
fn runs(spec: &str, sigma: f64, gain: f64) -> (f64, f64) {
    let ratios: Vec<f64> = (1..=SEEDS).map(|seed| cost_over_oracle(spec, seed, sigma, gain)).collect();
    (ratios.iter().sum::<f64>() / ratios.len() as f64, ratios.iter().copied().fold(0.0, f64::max))
}

/// Asserts that `measured` over `SEEDS` runs at each spread in `sigmas`, a moved commit
/// costing `gain` of its run, stays below `mean_below` of the oracle on average and
/// `worst_below` in its worst run.
fn assert_measured(sigmas: [f64; 2], gain: f64, mean_below: f64, worst_below: f64) {
    for sigma in sigmas {
        let (mean, worst) = runs("measured", sigma, gain);
        assert!(mean < mean_below, "spread {sigma}: mean {mean:.4} of the oracle");
        assert!(worst < worst_below, "spread {sigma}: worst run {worst:.4} of the oracle");
    }
}

#[test]
fn a_commit_that_pays_to_move_moves_though_the_host_holds_some_up() {
    // Before samples were clipped and a lucky probe kept its back-off, 6-9 runs in 40 left
    // the commit key in place for most of the run (up to 1.24 of the oracle); means 1.05-1.06.
    assert_measured([0.1, 0.3], 0.8, 1.03, 1.12);
}

#[test]
fn a_commit_that_loses_when_moved_stays_though_the_host_holds_some_up() {
    // Before, a run could end with the commit key moved, at 1.27 of the oracle.
    assert_measured([0.3, 0.5], 1.3, 1.02, 1.05);
}

#[test]
fn the_default_policy_keeps_up_with_the_best_fixed_rule_though_the_host_holds_some_up() {
    // Before, its trials, a sixteenth or a quarter of a 20 ms epoch (one to four commits),
    // won or lost by which of them and of the epochs around them the host held up: 13-17
    // runs in 40 lost over 15 % where moving the commit pays, most of them fallen to `never`
    // (up to 1.24 of the oracle), and 3-4 where it loses, moved to `always`; means 1.02-1.08.
    for (sigma, gain) in [(0.1, 0.8), (0.3, 0.8), (0.3, 1.3), (0.5, 1.3)] {
        let best =
            ["never", "always"].map(|rule| runs(rule, sigma, gain).0).into_iter().fold(f64::MAX, f64::min);
        let (mean, worst) = runs("adaptive", sigma, gain);
        let at = format!("spread {sigma}, moved at {gain} of the run");
        assert!(mean < best * 1.02, "{at}: mean {mean:.4} of the oracle, the best fixed rule {best:.4}");
        assert!(
            worst < best * 1.08,
            "{at}: worst run {worst:.4} of the oracle, the best fixed rule {best:.4}"
        );
    }
}
