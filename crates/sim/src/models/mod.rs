//! Workload models, one module per paper experiment family, and the `kind` → model registry.
//!
//! Each model module exposes a [`ModelEntry`] constant; [`MODELS`] lists them. To add one, see
//! "How to add a model" in the crate documentation.
pub mod objects;
pub mod offload;
pub mod pipeline;
pub mod smt;
pub mod switch;

use crate::engine::{run, Model, Ps, Sim};
use crate::scenario::{Problem, Scenario, ScenarioError};
use crate::stats::Report;

/// The most tasks or threads a scenario may ask for, all together: each is a few hundred bytes
/// of state, allocated up front, so a typo (`tasks = 1e8`) is an error instead of an
/// allocation failure.
pub const MAX_TASKS: usize = 1_000_000;

/// The most objects (directories) a scenario may ask for: each is some hundred bytes of the
/// model's and the placer's state.
pub const MAX_OBJECTS: usize = 1 << 21;

/// Builds a model from a scenario and runs it; the callback gets the simulated time now and then.
pub type RunModel = fn(&Scenario, &mut dyn FnMut(Ps)) -> Result<Report, ScenarioError>;

/// How a model is found and run from a scenario's `[workload] kind`.
pub struct ModelEntry {
    /// The `kind` string that selects this model.
    pub kind: &'static str,
    /// One line for listings: what the model reproduces.
    pub about: &'static str,
    /// Builds the model from the scenario (validating its `[workload]`) and runs it.
    pub run: RunModel,
    /// Checks the scenario's `[workload]` as `run` would, without running it.
    pub check: fn(&Scenario) -> Result<(), ScenarioError>,
}

impl ModelEntry {
    /// The entry of model `M` under `kind`: its `run` builds `M` from the scenario and
    /// simulates it.
    pub const fn of<M: FromScenario>(kind: &'static str, about: &'static str) -> ModelEntry {
        ModelEntry { kind, about, run: build_and_simulate::<M>, check: M::check }
    }
}

/// A model that builds itself from a scenario.
pub trait FromScenario: Model + Sized {
    /// Builds the model from a scenario, checking its `[workload]`.
    fn from_scenario(scenario: &Scenario) -> Result<Self, ScenarioError>;

    /// Checks the scenario as [`FromScenario::from_scenario`] does; by default, by building
    /// the model and dropping it (a model whose build is heavy checks without it).
    fn check(scenario: &Scenario) -> Result<(), ScenarioError> {
        Self::from_scenario(scenario).map(drop)
    }
}

fn build_and_simulate<M: FromScenario>(
    scenario: &Scenario,
    progress: &mut dyn FnMut(Ps),
) -> Result<Report, ScenarioError> {
    let mut model = M::from_scenario(scenario)?;
    Ok(simulate(scenario, &mut model, false, progress).0)
}

/// Every model, by kind.
pub const MODELS: &[ModelEntry] =
    &[switch::ENTRY, offload::ENTRY, objects::ENTRY, smt::ENTRY, pipeline::ENTRY];

/// The model registered for `kind`.
pub fn find(kind: &str) -> Option<&'static ModelEntry> {
    MODELS.iter().find(|m| m.kind == kind)
}

/// Runs `scenario` with the model its `kind` names. `progress` gets the simulated time now
/// and then (for progress bars).
///
/// # Examples
/// ```
/// use corehop_sim::{models, ScenarioDoc};
/// let text = r#"
///     [machine]
///     preset = "switch-cs"
///     [workload]
///     kind = "switch"
///     mechanism = "spin"
///     iterations = 50
/// "#;
/// let scenario = ScenarioDoc::parse("example.toml", text)?.validate()?;
/// let report = models::run_scenario(&scenario, &mut |_now_ps| {})?;
/// assert_eq!((report.kind.as_str(), report.ops), ("switch", 50));
/// assert_eq!(report.headline().unwrap().unit, "ns"); // the switch model's "ns per call"
/// // Same scenario, same seed: the same report.
/// assert_eq!(models::run_scenario(&scenario, &mut |_| {})?, report);
///
/// let unknown = ScenarioDoc::parse("bad.toml", &text.replace("\"switch\"", "\"nope\""))?.validate()?;
/// assert_eq!(models::run_scenario(&unknown, &mut |_| {}).unwrap_err().key, "workload.kind");
/// # Ok::<(), corehop_sim::ScenarioError>(())
/// ```
pub fn run_scenario(scenario: &Scenario, progress: &mut dyn FnMut(Ps)) -> Result<Report, ScenarioError> {
    (entry_of(scenario)?.run)(scenario, progress)
}

/// Checks `scenario` as [`run_scenario`] would before it runs anything: a sweep checks every
/// point first, so that its last point's mistake does not wait for the others to run.
pub fn check_scenario(scenario: &Scenario) -> Result<(), ScenarioError> {
    (entry_of(scenario)?.check)(scenario)
}

fn entry_of(scenario: &Scenario) -> Result<&'static ModelEntry, ScenarioError> {
    find(&scenario.kind).ok_or_else(|| {
        scenario.error(
            "workload.kind",
            Problem::UnknownKind {
                kind: scenario.kind.clone(),
                known: MODELS.iter().map(|m| m.kind).collect(),
            },
        )
    })
}

/// Runs an already built `model` on the scenario's machine, seed and limits; returns the
/// report and the final simulation state (its ledger, and trace if `trace` is set, are there
/// for tests to inspect).
pub fn simulate<M: Model>(
    scenario: &Scenario,
    model: &mut M,
    trace: bool,
    progress: &mut dyn FnMut(Ps),
) -> (Report, Sim<M::Event>) {
    let mut sim = Sim::new(scenario.machine.clone(), scenario.seed);
    if trace {
        sim.stats.cores.enable_trace();
    }
    let stop = run(model, &mut sim, scenario.limits, progress);
    let report =
        Report::collect(&scenario.name, &scenario.kind, scenario.seed, stop, &sim, model.report(&sim));
    (report, sim)
}
