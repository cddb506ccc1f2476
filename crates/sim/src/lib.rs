//! A deterministic discrete-event simulator of asymmetric multicores that runs corehop's own
//! policies on machines you do not have.
//!
//! # Tour
//!
//! - [`engine`]: integer virtual time in picoseconds, an event queue with a stable tie-break
//!   (time, then scheduling order), a seeded RNG, the [`Model`] trait and the run loop. Same
//!   scenario + same seed → byte-identical results.
//! - [`machine`]: a `corehop_topology::Machine` plus a [`CostModel`] (cache and memory
//!   latencies, cross-core line transfer, SMT interference, interrupt and IPI costs, wake-up
//!   delay, the software path of each hop [`Mechanism`]), with per-preset values. Work is in
//!   nanoseconds at full speed and takes `work / speed` on a CPU; memory stalls do not scale.
//! - [`stats`]: what every model measures the same way — per-CPU busy/idle ([`CoreLedger`]),
//!   hops, queueing delay, completed operations — and [`RunQueues`], CPUs that run one job at a
//!   time with a FIFO each. [`Report`] is the result of a run (its JSON is `corehop sim --json`).
//! - [`dist`]: [`Distribution`] (fixed, uniform, exponential, lognormal, empirical) from TOML.
//! - [`scenario`]: TOML scenario files, `--set` overrides, sweeps, and [`ScenarioError`]s that
//!   name the file, the dotted key and the problem.
//! - [`models`]: one workload model per paper experiment family, found by `[workload] kind`.
//! - [`parallel`]: a sweep's points on every local core, results in point order and identical
//!   to a serial run ([`run_points`]).
//!
//! ```
//! use corehop_sim::{models, ScenarioDoc};
//! let text = r#"
//!     seed = 7
//!     [machine]
//!     preset = "switch-cs"
//!     [workload]
//!     kind = "switch"
//!     mechanism = "spin"
//!     iterations = 100
//! "#;
//! let scenario = ScenarioDoc::parse("example.toml", text)?.validate()?;
//! let report = models::run_scenario(&scenario, &mut |_| {})?;
//! assert_eq!((report.ops, report.hops), (100, 200));
//! # Ok::<(), corehop_sim::ScenarioError>(())
//! ```
//!
//! # How to add a model
//!
//! A model is a state machine driven by its own events. To add `kind = "mything"`:
//!
//! 1. **Config.** In `models/mything.rs`, a `#[derive(Deserialize)]
//!    #[serde(deny_unknown_fields)]` struct for the `[workload]` table (without `kind`; give
//!    optional keys `#[serde(default)]`). Get it with [`Scenario::workload`]: a typo or a wrong
//!    type then comes back as a [`ScenarioError`] naming `workload.<key>`. Check what serde
//!    cannot: CPU ids with [`Scenario::check_cpu`], distributions with
//!    [`Scenario::check_distribution`], anything else with [`Scenario::error`] and a
//!    [`Problem`]. Never panic on input.
//! 2. **Events.** A small `Copy` enum (task/job ids as `u32`, not boxes): the engine stores
//!    millions of them.
//! 3. **State + [`Model`].** `start` schedules the first events; `on_event` advances the state
//!    and schedules more with [`Sim::schedule_in`] / [`Sim::schedule_at`]; `report` returns a
//!    [`ModelReport`] whose *first* metric is the headline (what a sweep's pivot table and plot
//!    show). Use the shared pieces rather than your own:
//!    - [`Sim::exec`] for how long work takes on a CPU (speed, emulation, SMT interference);
//!    - [`SimMachine::hop`] for the timing of a hop (source path, transit, target path);
//!      [`SimMachine::capacity_stall`], [`SimMachine::wake_delay`] and [`Sim::machine`]'s
//!      [`CostModel`] for cache, memory and wake-up costs;
//!    - [`RunQueues`] for CPUs that serve one job at a time (it keeps the busy/idle ledger
//!      and the queueing-delay samples for you); or flip [`CoreLedger::set_busy`] /
//!      [`CoreLedger::set_idle`] yourself if your CPUs behave differently;
//!    - [`Stats::record_hop`] for every hop and [`Stats::record_op`] (or [`Stats::record_op_at`]) for every
//!      completed operation (throughput and latency come from these);
//!    - [`Sim::rng`] for all randomness (never another source), [`Distribution::sample`];
//!      give each task or client its own stream with [`Sim::split_rng`] at start, so that a
//!      sweep over mechanisms or policies runs them all on the same random workload.
//! 4. **Decisions come from `corehop_policy`.** Call the same pure policy the runtime calls, at
//!    the same decision point (e.g. `corehop_policy::pick::Pick::pick` for the target CPU, as
//!    [`models::switch`] does), feeding it the observations it expects in nanoseconds.
//!    A "never move anything" setting is the baseline.
//! 5. **Register.** Step 1's checks go in `impl` [`FromScenario`] `for MyThing`; then
//!    `pub const ENTRY: ModelEntry = ModelEntry::of::<MyThing>(kind, about)` (its `run` builds
//!    the model and calls [`models::simulate`]); add `mything::ENTRY` to [`models::MODELS`].
//! 6. **Scenario + tests.** A `scenarios/<paper-experiment>.toml` opening with a comment on what
//!    it reproduces; inline tests with a hand-computed tiny case (exact picoseconds), a bad-input
//!    case per check, and the invariants (see `tests/` for the property-test pattern: no job
//!    lost or duplicated, no work on a CPU that does not exist, busy + idle = elapsed).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod dist;
pub mod engine;
pub mod machine;
pub mod models;
pub mod parallel;
pub mod scenario;
pub mod stats;

pub use dist::{Distribution, WeightedChoice};
pub use engine::{ns_to_ps, ps_to_ns, run, Limits, Model, Ps, Sim, Stop, PS_PER_NS};
pub use machine::{CostModel, HopTiming, Mechanism, SimMachine};
pub use models::{FromScenario, ModelEntry, MODELS};
pub use parallel::{available_threads, map_points, run_points};
pub use scenario::{
    Point, Problem, Scenario, ScenarioDoc, ScenarioError, Sweep, DEFAULT_MAX_EVENTS, MAX_EVENTS, MAX_POINTS,
};
pub use stats::{CoreLedger, Metric, ModelReport, Ops, Report, RunQueues, Samples, Stats, Summary};
