//! Scenario files: TOML in, a validated [`Scenario`] (or a [`ScenarioError`] naming the file,
//! the key and the problem) out; `--set` overrides and sweeps.
//!
//! ```toml
//! name = "switch-micro"          # optional, defaults to the file stem
//! seed = 1                       # the RNG seed; same seed, same output
//!
//! [run]                          # optional limits; by default a run ends when its work is done,
//! horizon_us = 1000.0            # or after 100 million events (each operation's latency is
//! max_events = 10_000_000        # kept: about 10 bytes an event); at most a billion
//!
//! [machine]
//! preset = "switch-cs"           # a topology preset (or `file = "machine.toml"`)
//! emulate = "1=0.25"             # optional emulated speeds, as `corehop topo --emulate`
//!
//! [costs]                        # optional: overrides of the preset's CostModel
//! mem_latency_ns = 25
//!
//! [workload]
//! kind = "switch"                # which model runs; the other keys belong to the model
//!
//! [[sweep]]                      # optional: one run per value (several sweeps: every combination)
//! key = "workload.mechanism"
//! values = ["spin", "wakeup"]
//! ```
//!
//! How a file becomes scenarios: parse it into a TOML table, apply `--set key=value`
//! overrides (dotted keys), then for each point of the sweep set the swept keys and validate.
//! Validation deserialises a canonical rendering of the table (with the preset's costs merged
//! in), so that every serde error comes with a byte span; the span is mapped back to the dotted
//! key it sits in, which is what the error names.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use corehop_topology::{excerpt, presets, Machine, MESSAGE_CHARS, VALUE_CHARS};

use crate::engine::{ns_to_ps, Limits};
use crate::machine::{CostModel, SimMachine};

/// The most points one sweep runs ([`ScenarioDoc::expand`] builds them all first).
pub const MAX_POINTS: usize = 100_000;

/// A scenario that cannot be used: which file, which key, what is wrong.
///
/// Its message quotes at most a few hundred characters of the key and of the problem
/// ([`corehop_topology::excerpt`]): both may come from a file of one long line.
#[derive(Debug, Error, PartialEq)]
#[error("{file}: {}: {}", excerpt(key, VALUE_CHARS), excerpt(&problem.to_string(), MESSAGE_CHARS))]
pub struct ScenarioError {
    /// The scenario file (or `<text>` when parsed from a string).
    pub file: String,
    /// The dotted key the problem is in (`workload.calls[1].length`), or `line N` for syntax.
    pub key: String,
    /// What is wrong with it.
    pub problem: Problem,
}

/// What is wrong with a scenario value.
#[derive(Debug, Error, PartialEq)]
pub enum Problem {
    /// The file could not be read; the OS error's text.
    #[error("cannot read the file: {0}")]
    Io(String),
    /// The text is not TOML; the parser's message.
    #[error("not valid TOML: {0}")]
    Syntax(String),
    /// A key no part of the scenario knows ("unknown field `x`, expected ...").
    #[error("unknown key: {0}")]
    UnknownKey(String),
    /// A latency, length or count below zero.
    #[error("must not be negative, got {0}")]
    Negative(String),
    /// A CPU index the machine does not have.
    #[error("CPU {cpu} is out of range: machine {machine} has {count} CPUs (0..={})", count.saturating_sub(1))]
    CpuOutOfRange {
        /// The CPU given (dense index into the machine's CPU list).
        cpu: usize,
        /// How many CPUs the machine has.
        count: usize,
        /// The machine's name.
        machine: String,
    },
    /// A `[workload] kind` no model is registered under.
    #[error("unknown workload kind {kind:?}; known kinds: {}", known.join(", "))]
    UnknownKind {
        /// The kind given.
        kind: String,
        /// Every registered kind ([`crate::MODELS`]).
        known: Vec<&'static str>,
    },
    /// The `[machine]` table names no usable machine (unknown preset, unreadable or invalid
    /// machine file, bad `emulate`); the topology crate's message.
    #[error("bad machine: {0}")]
    Machine(String),
    /// A `--set` assignment or a sweep that cannot be applied (no `=`, an empty part in the
    /// dotted key, a key that runs through a value that is not a table, a sweep without values).
    #[error("bad --set or sweep {0}")]
    Override(String),
    /// Anything else: a wrong type, a missing key, an inconsistent value.
    #[error("{0}")]
    Invalid(String),
}

/// One swept key and its values.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sweep {
    /// The dotted key it sets (`workload.mechanism`).
    pub key: String,
    /// The values it takes, one run each, in order.
    pub values: Vec<toml::Value>,
}

impl Sweep {
    /// Parses `key=a,b,c` (each value as TOML, else as a string).
    pub fn parse(arg: &str) -> Result<Sweep, String> {
        let (key, values) = arg
            .split_once('=')
            .ok_or_else(|| format!("{:?}: expected key=a,b,c", excerpt(arg, VALUE_CHARS)))?;
        let values: Vec<toml::Value> = values.split(',').map(|v| parse_value(v.trim())).collect();
        if key.trim().is_empty() || values.is_empty() {
            return Err(format!("{:?}: expected key=a,b,c", excerpt(arg, VALUE_CHARS)));
        }
        Ok(Sweep { key: key.trim().to_string(), values })
    }
}

/// A scenario file as a TOML table, before validation: overrides and sweeps apply here.
///
/// It serialises (file name, folder and table), so that a sweep can send it to another
/// process or machine and validate it there.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScenarioDoc {
    file: String,
    stem: String,
    dir: Option<std::path::PathBuf>,
    table: toml::Table,
}

/// One run of a sweep: the swept settings and the validated scenario.
#[derive(Debug, Clone)]
pub struct Point {
    /// (key, value) of every swept key at this point, in sweep order.
    pub settings: Vec<(String, toml::Value)>,
    /// The scenario with those settings applied, validated.
    pub scenario: Scenario,
}

impl ScenarioDoc {
    /// Reads and parses a scenario file.
    ///
    /// # Examples
    /// ```
    /// use std::path::Path;
    /// use corehop_sim::{Problem, ScenarioDoc};
    /// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scenarios/switch-micro.toml");
    /// let mut doc = ScenarioDoc::load(Path::new(path))?;
    /// doc.set("workload.iterations=100")?; // as `corehop sim --set`
    /// let points = doc.expand(&[])?; // one validated scenario per combination of its sweeps
    /// let combinations: usize = doc.sweeps()?.iter().map(|s| s.values.len()).product();
    /// assert_eq!(points.len(), combinations);
    /// assert_eq!(points[0].scenario.name, "switch-micro"); // its `name` key
    ///
    /// let missing = ScenarioDoc::load(Path::new("no-such-scenario.toml")).unwrap_err();
    /// assert!(matches!(missing.problem, Problem::Io(_)));
    /// # Ok::<(), corehop_sim::ScenarioError>(())
    /// ```
    pub fn load(path: &Path) -> Result<ScenarioDoc, ScenarioError> {
        let file = path.display().to_string();
        let text =
            corehop_topology::read_text_file(path, corehop_topology::MAX_DESCRIPTION_BYTES).map_err(|e| {
                ScenarioError {
                    file: file.clone(),
                    key: "(file)".into(),
                    problem: Problem::Io(e.to_string()),
                }
            })?;
        let mut doc = ScenarioDoc::parse(&file, &text)?;
        doc.stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        doc.dir = path.parent().map(Path::to_path_buf);
        Ok(doc)
    }

    /// Parses scenario text; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<ScenarioDoc, ScenarioError> {
        let table: toml::Table = toml::from_str(text).map_err(|e| ScenarioError {
            file: file.to_string(),
            key: e
                .span()
                .map(|s| format!("line {}", line_of(text, s.start)))
                .unwrap_or_else(|| "(file)".into()),
            problem: Problem::Syntax(e.message().to_string()),
        })?;
        Ok(ScenarioDoc { file: file.to_string(), stem: "scenario".into(), dir: None, table })
    }

    /// The file name errors mention.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// The document as TOML text (with any `--set` values applied).
    pub fn to_toml(&self) -> String {
        toml::to_string(&self.table).expect("a TOML table serialises")
    }

    /// The document as a TOML table.
    pub fn table(&self) -> &toml::Table {
        &self.table
    }

    /// A document from a TOML table (e.g. built from another language's data); `file` names
    /// it in errors.
    pub fn from_table(file: &str, table: toml::Table) -> ScenarioDoc {
        ScenarioDoc { file: file.to_string(), stem: "scenario".into(), dir: None, table }
    }

    /// Applies `key=value` (dotted key; the value as TOML, else as a string).
    pub fn set(&mut self, assignment: &str) -> Result<(), ScenarioError> {
        let Some((key, value)) = assignment.split_once('=') else {
            return Err(
                self.error(assignment, Problem::Override(format!("{assignment:?}: expected key=value")))
            );
        };
        self.set_value(key.trim(), parse_value(value.trim()))
    }

    /// Sets the dotted `key` to `value`, creating tables on the way. A key the file sweeps is
    /// pinned to this one value: every run uses it, and it is validated with each run.
    pub fn set_value(&mut self, key: &str, value: toml::Value) -> Result<(), ScenarioError> {
        if let Some(toml::Value::Array(sweeps)) = self.table.get_mut("sweep") {
            for sweep in sweeps.iter_mut().filter_map(toml::Value::as_table_mut) {
                if sweep.get("key").and_then(toml::Value::as_str) == Some(key) {
                    sweep.insert("values".into(), toml::Value::Array(vec![value.clone()]));
                }
            }
        }
        set_path(&mut self.table, key, value).map_err(|why| self.error(key, Problem::Override(why)))
    }

    /// The sweeps the file declares (`[[sweep]]`), in file order.
    pub fn sweeps(&self) -> Result<Vec<Sweep>, ScenarioError> {
        match self.table.get("sweep") {
            None => Ok(Vec::new()),
            Some(v) => v.clone().try_into::<Vec<Sweep>>().map_err(|e| {
                self.error(
                    "sweep",
                    Problem::Invalid(format!(
                        "{} (expected [[sweep]] key = ..., values = [...])",
                        e.message()
                    )),
                )
            }),
        }
    }

    /// Every point of the file's sweeps followed by `extra` (an extra sweep of a key the file
    /// already sweeps replaces it); one point with no settings when nothing is swept.
    ///
    /// # Examples
    /// ```
    /// use corehop_sim::{ScenarioDoc, Sweep};
    /// let doc = ScenarioDoc::parse(
    ///     "example.toml",
    ///     r#"
    ///     [machine]
    ///     preset = "switch-cs"
    ///     [workload]
    ///     kind = "switch"
    ///     mechanism = "spin"
    ///     [[sweep]]
    ///     key = "workload.mechanism"
    ///     values = ["none", "spin"]
    /// "#,
    /// )?;
    /// let tasks = Sweep::parse("workload.tasks=1,2,3").unwrap(); // as `corehop sim --sweep`
    /// let points = doc.expand(&[tasks])?;
    /// assert_eq!(points.len(), 2 * 3);
    /// let (key, value) = &points[1].settings[1]; // mechanism "none", the second tasks value
    /// assert_eq!((key.as_str(), value.as_integer()), ("workload.tasks", Some(2)));
    /// # Ok::<(), corehop_sim::ScenarioError>(())
    /// ```
    ///
    /// A sweep of more than [`MAX_POINTS`] points is an error.
    pub fn expand(&self, extra: &[Sweep]) -> Result<Vec<Point>, ScenarioError> {
        let mut sweeps = self.sweeps()?;
        for s in extra {
            match sweeps.iter_mut().find(|old| old.key == s.key) {
                Some(old) => old.values = s.values.clone(),
                None => sweeps.push(s.clone()),
            }
        }
        if let Some(empty) = sweeps.iter().find(|s| s.values.is_empty()) {
            return Err(self.error(&empty.key, Problem::Override("sweep has no values".into())));
        }
        // Every point is built (a scenario each) before the first one runs.
        let count = sweeps.iter().try_fold(1usize, |n, s| n.checked_mul(s.values.len()));
        if count.is_none_or(|n| n > MAX_POINTS) {
            let keys: Vec<&str> = sweeps.iter().map(|s| s.key.as_str()).collect();
            let sizes: Vec<String> = sweeps.iter().map(|s| s.values.len().to_string()).collect();
            return Err(self.error(
                &keys.join(", "),
                Problem::Override(format!(
                    "of {} points: at most {MAX_POINTS} run in one sweep",
                    sizes.join(" × ")
                )),
            ));
        }
        let mut combos: Vec<Vec<(String, toml::Value)>> = vec![Vec::new()];
        for s in &sweeps {
            combos = combos
                .into_iter()
                .flat_map(|c| {
                    s.values.iter().map(move |v| {
                        let mut c = c.clone();
                        c.push((s.key.clone(), v.clone()));
                        c
                    })
                })
                .collect();
        }
        combos
            .into_iter()
            .map(|settings| {
                let mut doc = self.clone();
                doc.table.remove("sweep");
                for (k, v) in &settings {
                    doc.set_value(k, v.clone())?;
                }
                Ok(Point { scenario: doc.validate()?, settings })
            })
            .collect()
    }

    /// Validates the document as one scenario (the `[[sweep]]` list is ignored).
    pub fn validate(&self) -> Result<Scenario, ScenarioError> {
        let mut table = self.table.clone();
        table.remove("sweep");
        let top: Top = from_canonical(&self.file, &table)?;
        let machine = self.machine(&top.machine)?;

        // Merge the scenario's [costs] over the preset's and check the result.
        let mut costs = toml::Table::try_from(CostModel::for_preset(&machine.name)).expect("costs serialise");
        if let Some(toml::Value::Table(user)) = table.get("costs") {
            merge(&mut costs, user);
        }
        table.insert("costs".into(), toml::Value::Table(costs));
        let with_costs: TopCosts = from_canonical(&self.file, &table)?;
        let costs = with_costs.costs;
        if let Some((key, problem)) = costs.problems().into_iter().next() {
            return Err(self.error(&format!("costs.{key}"), problem));
        }
        for (key, v) in [("run.horizon_us", top.run.horizon_us)] {
            if let Some(v) = v.filter(|v| !v.is_finite() || *v < 0.0) {
                return Err(self.error(key, Problem::Negative(v.to_string())));
            }
        }
        let max_events = top.run.max_events.unwrap_or(DEFAULT_MAX_EVENTS);
        if !(1..=MAX_EVENTS).contains(&max_events) {
            return Err(self.error(
                "run.max_events",
                Problem::Invalid(format!("must be between 1 and {MAX_EVENTS}, got {max_events}")),
            ));
        }
        let kind = top.workload.kind.clone();
        let mut workload = table.get("workload").and_then(|w| w.as_table()).cloned().unwrap_or_default();
        workload.remove("kind");
        Ok(Scenario {
            file: self.file.clone(),
            name: top.name.unwrap_or_else(|| self.stem.clone()),
            seed: top.seed,
            limits: Limits {
                horizon: top.run.horizon_us.map(|us| ns_to_ps(us * 1e3)),
                max_events: Some(max_events),
            },
            machine: SimMachine::new(machine, costs),
            kind,
            workload,
        })
    }

    fn machine(&self, spec: &MachineSpec) -> Result<Machine, ScenarioError> {
        let mut machine = match (&spec.preset, &spec.file) {
            (Some(name), None) => presets::by_name(name)
                .map_err(|e| self.error("machine.preset", Problem::Machine(e.to_string())))?,
            (None, Some(file)) => {
                let path = match &self.dir {
                    Some(dir) => dir.join(file),
                    None => file.into(),
                };
                Machine::from_toml_file(&path)
                    .map_err(|e| self.error("machine.file", Problem::Machine(e.to_string())))?
            }
            _ => {
                return Err(
                    self.error("machine", Problem::Invalid("give exactly one of `preset` or `file`".into()))
                )
            }
        };
        if let Some(emulate) = &spec.emulate {
            machine
                .apply_emulation(emulate)
                .map_err(|e| self.error("machine.emulate", Problem::Machine(e.to_string())))?;
        }
        Ok(machine)
    }

    fn error(&self, key: &str, problem: Problem) -> ScenarioError {
        ScenarioError { file: self.file.clone(), key: key.to_string(), problem }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Top {
    name: Option<String>,
    #[serde(default = "default_seed")]
    seed: u64,
    #[serde(default)]
    run: RunSpec,
    machine: MachineSpec,
    /// Checked in a second pass, with the preset's costs merged in.
    #[serde(rename = "costs")]
    _costs: Option<toml::Table>,
    workload: WorkloadKind,
}

#[derive(Deserialize)]
struct TopCosts {
    costs: CostModel,
}

fn default_seed() -> u64 {
    1
}

/// The event budget of a run whose `[run]` sets none: five times the largest scenario shipped
/// (`o2-16core`, 20 million), so that a mistyped count (`iterations = 1e14`) stops with a note
/// instead of filling memory with every operation's latency.
pub const DEFAULT_MAX_EVENTS: u64 = 100_000_000;
/// The largest event budget a scenario may ask for (about 10 GB of latencies at worst).
pub const MAX_EVENTS: u64 = 1_000_000_000;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RunSpec {
    /// Stop at this simulated time (µs).
    horizon_us: Option<f64>,
    /// Stop after this many events.
    max_events: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MachineSpec {
    preset: Option<String>,
    file: Option<String>,
    emulate: Option<String>,
}

/// Only `kind` here; the rest of `[workload]` belongs to the model.
#[derive(Deserialize)]
struct WorkloadKind {
    kind: String,
}

/// A validated scenario: what a model is built from.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The file name errors mention.
    pub file: String,
    /// The `name` key, else the file stem (`"scenario"` for parsed text).
    pub name: String,
    /// The RNG seed (`seed`, default 1): same scenario and seed, same report.
    pub seed: u64,
    /// When the run stops (`[run]`); by default when no event is left.
    pub limits: Limits,
    /// The topology and cost model (`[machine]`, `[costs]`).
    pub machine: SimMachine,
    /// The `[workload] kind`: which model runs.
    pub kind: String,
    /// The rest of `[workload]`, for the model ([`Scenario::workload`]).
    workload: toml::Table,
}

impl Scenario {
    /// Deserialises the `[workload]` table (without `kind`) into the model's configuration
    /// type. Give the type `#[serde(deny_unknown_fields)]` so a typo is an error that names
    /// the key.
    pub fn workload<T: DeserializeOwned>(&self) -> Result<T, ScenarioError> {
        #[derive(Deserialize)]
        struct Wrap<T> {
            workload: T,
        }
        let mut table = toml::Table::new();
        table.insert("workload".into(), toml::Value::Table(self.workload.clone()));
        from_canonical::<Wrap<T>>(&self.file, &table).map(|w| w.workload)
    }

    /// An error about `key` of this scenario.
    pub fn error(&self, key: &str, problem: Problem) -> ScenarioError {
        ScenarioError { file: self.file.clone(), key: key.to_string(), problem }
    }

    /// Checks that `cpu` (read from `key`) exists on the machine.
    pub fn check_cpu(&self, key: &str, cpu: usize) -> Result<usize, ScenarioError> {
        let count = self.machine.cpu_count();
        if cpu < count {
            Ok(cpu)
        } else {
            Err(self
                .error(key, Problem::CpuOutOfRange { cpu, count, machine: self.machine.name().to_string() }))
        }
    }

    /// Checks a distribution read from `key` (see [`crate::Distribution::problem`]).
    pub fn check_distribution(&self, key: &str, d: &crate::Distribution) -> Result<(), ScenarioError> {
        match d.problem() {
            None => Ok(()),
            Some(problem) => Err(self.error(key, problem)),
        }
    }

    /// Checks `workload.app_cpus` (at least one; each a CPU of the machine, listed once) and
    /// `workload.service_cpus` (each a CPU of the machine, none an application CPU).
    pub fn check_app_and_service_cpus(
        &self,
        app_cpus: &[usize],
        service_cpus: &[usize],
    ) -> Result<(), ScenarioError> {
        if app_cpus.is_empty() {
            return Err(self.error("workload.app_cpus", Problem::Invalid("needs at least one CPU".into())));
        }
        for (i, &cpu) in app_cpus.iter().enumerate() {
            self.check_cpu(&format!("workload.app_cpus[{i}]"), cpu)?;
            if app_cpus[..i].contains(&cpu) {
                let problem = Problem::Invalid(format!("CPU {cpu} listed twice"));
                return Err(self.error(&format!("workload.app_cpus[{i}]"), problem));
            }
        }
        for (i, &cpu) in service_cpus.iter().enumerate() {
            self.check_cpu(&format!("workload.service_cpus[{i}]"), cpu)?;
            if app_cpus.contains(&cpu) {
                let problem = Problem::Invalid(format!("CPU {cpu} is also in workload.app_cpus"));
                return Err(self.error(&format!("workload.service_cpus[{i}]"), problem));
            }
        }
        Ok(())
    }

    /// The mix of `workload.calls`, given each call type's run length and weight: at least
    /// one type, each length a valid distribution, each weight finite and > 0.
    pub fn call_mix<'a>(
        &self,
        calls: impl IntoIterator<Item = (&'a crate::Distribution, f64)>,
    ) -> Result<crate::dist::WeightedChoice, ScenarioError> {
        let mut mix = crate::dist::WeightedChoice::default();
        for (i, (length, weight)) in calls.into_iter().enumerate() {
            self.check_distribution(&format!("workload.calls[{i}].length"), length)?;
            mix.push(weight).map_err(|p| self.error(&format!("workload.calls[{i}].weight"), p))?;
        }
        if mix.is_empty() {
            return Err(self.error("workload.calls", Problem::Invalid("needs at least one call type".into())));
        }
        Ok(mix)
    }
}

/// Deserialises `table` through its canonical TOML text so that an error has a span, and
/// turns the span into the dotted key it sits in.
fn from_canonical<T: DeserializeOwned>(file: &str, table: &toml::Table) -> Result<T, ScenarioError> {
    let text = toml::to_string(table).expect("a TOML table serialises");
    toml::from_str::<T>(&text).map_err(|e| {
        let message = e.message().to_string();
        let key = e
            .span()
            .map(|s| key_at(&text, s.start))
            .filter(|k| !k.is_empty())
            .unwrap_or_else(|| "(top level)".into());
        let problem = if message.starts_with("unknown field") || message.starts_with("unknown variant") {
            if message.starts_with("unknown field") {
                Problem::UnknownKey(message)
            } else {
                Problem::Invalid(message)
            }
        } else if let Some(rest) = message.strip_prefix("invalid value: integer `-") {
            Problem::Negative(format!("-{}", rest.split('`').next().unwrap_or_default()))
        } else {
            Problem::Invalid(message)
        };
        ScenarioError { file: file.to_string(), key, problem }
    })
}

/// The dotted key at byte `offset` of canonical TOML text (as `toml::to_string` writes it:
/// `[a.b]` and `[[a.list]]` headers, one `key = value` per line).
fn key_at(text: &str, offset: usize) -> String {
    let mut header = String::new();
    let mut array_counts: Vec<(String, usize)> = Vec::new();
    let mut line_start = 0;
    for line in text.split_inclusive('\n') {
        let line_end = line_start + line.len();
        let trimmed = line.trim();
        if let Some(h) = trimmed.strip_prefix("[[").and_then(|h| h.strip_suffix("]]")) {
            let h = h.trim().to_string();
            let n = match array_counts.iter_mut().find(|(k, _)| *k == h) {
                Some((_, n)) => {
                    *n += 1;
                    *n
                }
                None => {
                    array_counts.retain(|(k, _)| !k.starts_with(&format!("{h}.")));
                    array_counts.push((h.clone(), 0));
                    0
                }
            };
            header = format!("{h}[{n}]");
        } else if let Some(h) = trimmed.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            // A sub-table of the current element of an array of tables keeps its index.
            header = indexed(h.trim(), &array_counts);
        }
        if offset < line_end {
            let key = match trimmed.split_once('=') {
                Some((k, _)) if !trimmed.starts_with('[') => k.trim().trim_matches('"').to_string(),
                _ => return header,
            };
            return if header.is_empty() { key } else { format!("{header}.{key}") };
        }
        line_start = line_end;
    }
    header
}

/// `a.list.b` → `a.list[2].b` when `a.list` is an array of tables whose current index is 2.
fn indexed(path: &str, arrays: &[(String, usize)]) -> String {
    let innermost = arrays
        .iter()
        .filter(|(prefix, _)| path.starts_with(&format!("{prefix}.")))
        .max_by_key(|(p, _)| p.len());
    match innermost {
        Some((prefix, n)) => format!("{prefix}[{n}]{}", &path[prefix.len()..]),
        None => path.to_string(),
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Parses a command-line value as TOML (number, bool, array, inline table), else a string.
fn parse_value(v: &str) -> toml::Value {
    #[derive(Deserialize)]
    struct One {
        v: toml::Value,
    }
    toml::from_str::<One>(&format!("v = {v}"))
        .map(|o| o.v)
        .unwrap_or_else(|_| toml::Value::String(v.to_string()))
}

fn set_path(table: &mut toml::Table, key: &str, value: toml::Value) -> Result<(), String> {
    let parts: Vec<&str> = key.split('.').map(str::trim).collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(format!("{:?}: empty part in the dotted key", excerpt(key, VALUE_CHARS)));
    }
    let (last, parents) = parts.split_last().expect("split gives at least one part");
    let mut t = table;
    for (i, p) in parents.iter().enumerate() {
        let entry = t.entry(p.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        t = entry.as_table_mut().ok_or_else(|| format!("{} is not a table", parts[..=i].join(".")))?;
    }
    t.insert(last.to_string(), value);
    Ok(())
}

/// Recursively overlays `over` onto `base` (tables merge, everything else replaces).
fn merge(base: &mut toml::Table, over: &toml::Table) {
    for (k, v) in over {
        match (base.get_mut(k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            _ => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
        seed = 3
        [machine]
        preset = "switch-cs"
        [workload]
        kind = "switch"
        iterations = 10
    "#;

    fn doc(extra: &str) -> ScenarioDoc {
        ScenarioDoc::parse("t.toml", &format!("{BASE}\n{extra}")).unwrap()
    }

    #[test]
    fn machine_files_resolve_next_to_the_scenario() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let mut machine = presets::by_name("switch-cs").unwrap();
        machine.name = "switch-cs-copy".into();
        std::fs::write(dir.join("m.toml"), machine.to_toml_string()).unwrap();
        let scenario = "[machine]\nfile = \"m.toml\"\nemulate = \"1=0.5\"\n[workload]\nkind = \"switch\"\n";
        std::fs::write(dir.join("s.toml"), scenario).unwrap();
        let s = ScenarioDoc::load(&dir.join("s.toml")).unwrap().validate().unwrap();
        assert_eq!((s.name.as_str(), s.machine.name(), s.machine.cpu_count()), ("s", "switch-cs-copy", 2));
        assert_eq!(s.machine.cpu(1).speed, 0.25);
        // A switch-* machine gets the switch cost preset.
        assert_eq!(s.machine.costs(), &CostModel::for_preset("switch-cs"));

        std::fs::write(dir.join("both.toml"), "[machine]\nfile = \"m.toml\"\npreset = \"switch-cc\"\n")
            .unwrap();
        let e = ScenarioDoc::load(&dir.join("both.toml")).unwrap().validate().unwrap_err();
        assert_eq!(e.key, "machine");
        std::fs::write(
            dir.join("gone.toml"),
            "[machine]\nfile = \"nope.toml\"\n[workload]\nkind = \"switch\"\n",
        )
        .unwrap();
        let e = ScenarioDoc::load(&dir.join("gone.toml")).unwrap().validate().unwrap_err();
        assert_eq!(e.key, "machine.file");
        let e = doc("").expand(&[Sweep::parse("machine.emulate=5=0.5").unwrap()]).unwrap_err();
        assert_eq!(e.key, "machine.emulate");
    }

    #[test]
    fn a_document_travels_as_json_with_its_folder() {
        let tmp = tempfile::tempdir().unwrap();
        let mut machine = presets::by_name("switch-cs").unwrap();
        machine.name = "mine".into();
        std::fs::write(tmp.path().join("m.toml"), machine.to_toml_string()).unwrap();
        let path = tmp.path().join("s.toml");
        std::fs::write(&path, "seed = 4\n[machine]\nfile = \"m.toml\"\n[workload]\nkind = \"switch\"\n")
            .unwrap();
        let mut doc = ScenarioDoc::load(&path).unwrap();
        doc.set("workload.iterations=5").unwrap();
        let back: ScenarioDoc = serde_json::from_str(&serde_json::to_string(&doc).unwrap()).unwrap();
        assert_eq!(back.to_toml(), doc.to_toml());
        let (a, b) = (doc.validate().unwrap(), back.validate().unwrap());
        assert_eq!((b.name.as_str(), b.seed, b.machine.name()), ("s", 4, "mine"));
        assert_eq!(a.machine.costs(), b.machine.costs());
    }

    #[test]
    fn key_at_maps_spans_to_dotted_keys() {
        let text = "a = 1\n[w]\nx = 1\n[[w.calls]]\nn = 1\n[w.calls.len]\nf = 2\n[[w.calls]]\nn = 3\n";
        assert_eq!(key_at(text, 0), "a");
        assert_eq!(key_at(text, text.find("x =").unwrap()), "w.x");
        assert_eq!(key_at(text, text.find("f =").unwrap()), "w.calls[0].len.f");
        assert_eq!(key_at(text, text.rfind("n =").unwrap()), "w.calls[1].n");
    }

    #[test]
    fn a_run_has_an_event_budget_and_a_bound_on_it() {
        assert_eq!(doc("").validate().unwrap().limits.max_events, Some(DEFAULT_MAX_EVENTS));
        assert_eq!(doc("[run]\nmax_events = 5").validate().unwrap().limits.max_events, Some(5));
        for bad in [0, MAX_EVENTS + 1] {
            let e = doc(&format!("[run]\nmax_events = {bad}")).validate().unwrap_err();
            assert_eq!(e.key, "run.max_events", "{e}");
        }
        // A count far past any run's memory stops at the budget, with what it did until then.
        let mut d = doc("[run]\nmax_events = 1000");
        d.set("workload.iterations=100000000000000").unwrap();
        d.set("workload.mechanism=spin").unwrap();
        let report = crate::models::run_scenario(&d.validate().unwrap(), &mut |_| {}).unwrap();
        assert_eq!((report.stop, report.events), (crate::Stop::EventBudget, 1000));
    }

    #[test]
    fn a_valid_scenario_validates() {
        let s = doc("").validate().unwrap();
        assert_eq!((s.seed, s.kind.as_str(), s.machine.cpu_count()), (3, "switch", 2));
        assert_eq!(s.name, "scenario");
    }

    #[test]
    fn unknown_top_level_and_cost_keys_are_named() {
        let e = ScenarioDoc::parse("t.toml", &format!("colour = 1\n{BASE}")).unwrap().validate().unwrap_err();
        assert_eq!((e.key.as_str(), matches!(e.problem, Problem::UnknownKey(_))), ("colour", true));
        let e = doc("[costs]\nmem_latncy_ns = 3").validate().unwrap_err();
        assert_eq!(e.key, "costs.mem_latncy_ns");
        assert!(matches!(e.problem, Problem::UnknownKey(_)), "{e}");
        assert!(e.to_string().starts_with("t.toml: costs.mem_latncy_ns: unknown key"), "{e}");
    }

    #[test]
    fn negative_latency_is_named() {
        let e = doc("[costs]\nmem_latency_ns = -25").validate().unwrap_err();
        assert_eq!((e.key.as_str(), &e.problem), ("costs.mem_latency_ns", &Problem::Negative("-25".into())));
        let e = doc("[costs.hop.fastpath]\nsrc_ns = -1.5").validate().unwrap_err();
        assert_eq!(e.key, "costs.hop.fastpath.src_ns");
    }

    #[test]
    fn syntax_errors_give_the_line() {
        let e = ScenarioDoc::parse("bad.toml", "seed = 1\n[machine\n").unwrap_err();
        assert_eq!(e.key, "line 2");
        assert!(matches!(e.problem, Problem::Syntax(_)));
    }

    #[test]
    fn unknown_preset_and_missing_sections() {
        let mut d = doc("");
        d.set("machine.preset=cray-1").unwrap();
        let e = d.validate().unwrap_err();
        assert_eq!(e.key, "machine.preset");
        assert!(e.to_string().contains("switch-cs"), "{e}");
        let e = ScenarioDoc::parse("t.toml", "[machine]\npreset = \"switch-cc\"")
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("workload"), "{e}");
    }

    #[test]
    fn overrides_and_sweeps_expand() {
        let mut d = doc("[[sweep]]\nkey = \"machine.preset\"\nvalues = [\"switch-cc\", \"switch-ss\"]");
        d.set("seed=9").unwrap();
        let extra = Sweep::parse("workload.iterations=1,2,3").unwrap();
        let points = d.expand(&[extra]).unwrap();
        assert_eq!(points.len(), 6);
        assert_eq!(points[0].settings[0], ("machine.preset".to_string(), toml::Value::from("switch-cc")));
        assert_eq!(points[5].settings[1], ("workload.iterations".to_string(), toml::Value::from(3)));
        assert!(points.iter().all(|p| p.scenario.seed == 9));
        assert_eq!(points[3].scenario.machine.name(), "switch-ss");
        // A command-line sweep of a key the file sweeps replaces the file's values.
        let points = d.expand(&[Sweep::parse("machine.preset=switch-cs").unwrap()]).unwrap();
        assert_eq!(points.len(), 1);
    }

    #[test]
    fn bad_overrides_are_errors() {
        let mut d = doc("");
        assert!(matches!(d.set("noequals").unwrap_err().problem, Problem::Override(_)));
        assert!(matches!(d.set("seed.x=1").unwrap_err().problem, Problem::Override(_)));
        assert!(Sweep::parse("novalues").is_err());
    }

    #[test]
    fn an_empty_scenario_names_the_top_level() {
        let e = ScenarioDoc::parse("empty.toml", "").unwrap().validate().unwrap_err();
        assert_eq!(e.to_string(), "empty.toml: (top level): missing field `machine`");
    }

    #[test]
    fn a_sweep_of_too_many_points_is_refused_before_any_is_built() {
        let values = |n: usize| (1..=n).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
        let sweeps: Vec<Sweep> = ["seed", "workload.iterations", "workload.tasks"]
            .iter()
            .map(|key| Sweep::parse(&format!("{key}={}", values(1000))).unwrap())
            .collect();
        let e = doc("").expand(&sweeps).unwrap_err();
        assert_eq!(e.key, "seed, workload.iterations, workload.tasks");
        assert!(e.to_string().contains("of 1000 × 1000 × 1000 points: at most 100000"), "{e}");
        let few = [Sweep::parse(&format!("seed={}", values(3))).unwrap()];
        assert_eq!(doc("").expand(&few).unwrap().len(), 3);
    }

    #[test]
    fn a_long_key_or_value_is_quoted_only_in_part() {
        let long = "k".repeat(1 << 20);
        let e = ScenarioDoc::parse("t.toml", &format!("{long} = 1\n")).unwrap().validate().unwrap_err();
        assert!(matches!(e.problem, Problem::UnknownKey(_)), "{e:.300}");
        assert!(e.to_string().len() < 2 * MESSAGE_CHARS, "{} bytes: {e:.300}", e.to_string().len());
        let mut d = doc("");
        d.set(&format!("machine.preset={long}")).unwrap();
        let e = d.validate().unwrap_err().to_string();
        assert!(e.contains("unknown preset") && e.len() < 2 * MESSAGE_CHARS, "{} bytes: {e:.300}", e.len());
    }

    #[test]
    fn values_parse_as_toml_or_string() {
        assert_eq!(parse_value("3"), toml::Value::Integer(3));
        assert_eq!(parse_value("2.5"), toml::Value::Float(2.5));
        assert_eq!(parse_value("true"), toml::Value::Boolean(true));
        assert_eq!(parse_value("switch-cs"), toml::Value::String("switch-cs".into()));
        assert_eq!(parse_value("\"x y\""), toml::Value::String("x y".into()));
    }

    #[test]
    fn workload_errors_name_nested_keys() {
        #[derive(Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct W {
            iterations: u64,
            calls: Vec<C>,
        }
        #[derive(Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct C {
            name: String,
            length: crate::Distribution,
        }
        let s =
            doc("calls = [{ name = \"a\", length = 1 }, { name = \"b\", lenght = 2 }]").validate().unwrap();
        let e = s.workload::<W>().unwrap_err();
        assert_eq!(e.key, "workload.calls[1].lenght");
        let e = s.check_cpu("workload.service_cpus[0]", 7).unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.toml: workload.service_cpus[0]: CPU 7 is out of range: machine switch-cs has 2 CPUs (0..=1)"
        );
    }
}
