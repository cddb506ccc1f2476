//! `corehop._corehop`: the simulator for Python. Scenarios load from TOML files, TOML text or
//! dicts; runs release the GIL; a sweep's points run on a thread pool (the same runner as
//! `corehop sim --jobs`) and stream back as they finish. The pure-Python layer (sweeps over
//! grids and samples, DataFrames, Parquet, Ray) lives in `python/corehop`.
#![forbid(unsafe_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use corehop_sim::{models, CostModel, Problem, Report, ScenarioDoc};
use corehop_topology::presets;

pyo3::create_exception!(
    corehop,
    ScenarioError,
    PyValueError,
    "A scenario that cannot be used. `file`, `key` (the dotted key, e.g. `workload.iterations`) \
     and `problem` say where and what; the message is the one `corehop sim` prints."
);

type PyScenarioError = ScenarioError;

/// The Python exception for a simulator error, with `file`, `key` and `problem` attributes.
fn scenario_error(py: Python<'_>, e: &corehop_sim::ScenarioError) -> PyErr {
    let err = PyScenarioError::new_err(e.to_string());
    let value = err.value(py);
    for (name, text) in [("file", e.file.clone()), ("key", e.key.clone()), ("problem", e.problem.to_string())]
    {
        // Setting an attribute on a fresh exception instance cannot fail.
        let _ = value.setattr(name, text);
    }
    err
}

fn to_py_err(e: corehop_sim::ScenarioError) -> PyErr {
    Python::attach(|py| scenario_error(py, &e))
}

/// A Python value as a TOML value; `key` (dotted) names it in the error.
fn to_toml(file: &str, key: &str, v: &Bound<'_, PyAny>) -> Result<toml::Value, corehop_sim::ScenarioError> {
    let bad = |what: String| corehop_sim::ScenarioError {
        file: file.to_string(),
        key: if key.is_empty() { "(top level)".into() } else { key.to_string() },
        problem: Problem::Invalid(what),
    };
    if v.is_instance_of::<PyBool>() {
        return Ok(toml::Value::Boolean(v.extract::<bool>().map_err(|e| bad(e.to_string()))?));
    }
    if let Ok(s) = v.cast::<PyString>() {
        return Ok(toml::Value::String(s.to_str().map_err(|e| bad(e.to_string()))?.to_string()));
    }
    if v.is_instance_of::<PyFloat>() {
        return Ok(toml::Value::Float(v.extract::<f64>().map_err(|e| bad(e.to_string()))?));
    }
    if v.is_instance_of::<PyInt>() || v.hasattr("__index__").unwrap_or(false) {
        // Python ints and anything else that is an integer (NumPy's).
        return match v.extract::<i64>() {
            Ok(i) => Ok(toml::Value::Integer(i)),
            Err(_) => Err(bad(format!("{v} does not fit a 64-bit integer"))),
        };
    }
    if let Ok(d) = v.cast::<PyDict>() {
        let mut table = toml::Table::new();
        for (k, item) in d.iter() {
            let k: String = k.extract().map_err(|_| bad(format!("a dict key must be a string, got {k}")))?;
            let sub = if key.is_empty() { k.clone() } else { format!("{key}.{k}") };
            table.insert(k, to_toml(file, &sub, &item)?);
        }
        return Ok(toml::Value::Table(table));
    }
    if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() {
        let items = v
            .try_iter()
            .map_err(|e| bad(e.to_string()))?
            .enumerate()
            .map(|(i, item)| to_toml(file, &format!("{key}[{i}]"), &item.map_err(|e| bad(e.to_string()))?))
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(toml::Value::Array(items));
    }
    if v.hasattr("__float__").unwrap_or(false) {
        // NumPy floats and other real numbers.
        return Ok(toml::Value::Float(v.extract::<f64>().map_err(|e| bad(e.to_string()))?));
    }
    let type_name = v.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "object".into());
    Err(bad(format!(
        "a Python {type_name} cannot be a scenario value (use a bool, int, float, str, list or dict)"
    )))
}

fn toml_to_py<'py>(py: Python<'py>, v: &toml::Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        toml::Value::String(s) => s.into_pyobject(py)?.into_any(),
        toml::Value::Integer(i) => i.into_pyobject(py)?.into_any(),
        toml::Value::Float(f) => f.into_pyobject(py)?.into_any(),
        toml::Value::Boolean(b) => PyBool::new(py, *b).to_owned().into_any(),
        toml::Value::Datetime(d) => d.to_string().into_pyobject(py)?.into_any(),
        toml::Value::Array(items) => {
            PyList::new(py, items.iter().map(|i| toml_to_py(py, i)).collect::<PyResult<Vec<_>>>()?)?
                .into_any()
        }
        toml::Value::Table(t) => table_to_py(py, t)?.into_any(),
    })
}

fn table_to_py<'py>(py: Python<'py>, t: &toml::Table) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in t {
        d.set_item(k, toml_to_py(py, v)?)?;
    }
    Ok(d)
}

fn json_to_py<'py>(py: Python<'py>, v: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        serde_json::Value::Null => py.None().into_bound(py),
        serde_json::Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        serde_json::Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i.into_pyobject(py)?.into_any(),
            (None, Some(u)) => u.into_pyobject(py)?.into_any(),
            _ => n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any(),
        },
        serde_json::Value::String(s) => s.into_pyobject(py)?.into_any(),
        serde_json::Value::Array(items) => {
            PyList::new(py, items.iter().map(|i| json_to_py(py, i)).collect::<PyResult<Vec<_>>>()?)?
                .into_any()
        }
        serde_json::Value::Object(map) => {
            let d = PyDict::new(py);
            for (k, v) in map {
                d.set_item(k, json_to_py(py, v)?)?;
            }
            d.into_any()
        }
    })
}

/// A report as a dict: the shape of one run's `report` in `corehop sim --json`.
fn report_to_py<'py>(py: Python<'py>, r: &Report) -> PyResult<Bound<'py, PyAny>> {
    let value = serde_json::to_value(r).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    json_to_py(py, &value)
}

/// A scenario document: a TOML table plus where it came from, before validation.
///
/// Immutable: `with_values` returns a new one. Pickles (for Ray and process pools).
#[pyclass(name = "Scenario", module = "corehop", frozen)]
#[derive(Clone)]
struct PyScenario {
    doc: ScenarioDoc,
}

/// One point's settings: (dotted key, value) in sweep order.
type Settings = Vec<(String, toml::Value)>;

impl PyScenario {
    fn settings(&self, values: &Bound<'_, PyAny>) -> PyResult<Settings> {
        let mut out = Settings::new();
        if values.is_none() {
            return Ok(out);
        }
        let items: Vec<(String, Bound<'_, PyAny>)> = if let Ok(d) = values.cast::<PyDict>() {
            d.iter().map(|(k, v)| Ok((k.extract::<String>()?, v))).collect::<PyResult<_>>()?
        } else {
            values
                .try_iter()?
                .map(|kv| kv?.extract::<(String, Bound<'_, PyAny>)>())
                .collect::<PyResult<_>>()?
        };
        for (key, v) in items {
            let value = to_toml(self.doc.file(), &key, &v).map_err(to_py_err)?;
            out.push((key, value));
        }
        Ok(out)
    }
}

/// A copy of `doc` with `settings` set.
fn with_settings(doc: &ScenarioDoc, settings: &Settings) -> Result<ScenarioDoc, corehop_sim::ScenarioError> {
    let mut doc = doc.clone();
    for (key, value) in settings {
        doc.set_value(key, value.clone())?;
    }
    Ok(doc)
}

/// Applies `settings`, validates and runs the one scenario they make.
fn run_one(doc: &ScenarioDoc, settings: &Settings) -> Result<Report, corehop_sim::ScenarioError> {
    let doc = with_settings(doc, settings)?;
    let points = doc.expand(&[])?;
    let [point] = &points[..] else {
        let swept: Vec<String> = doc.sweeps()?.into_iter().map(|s| s.key).collect();
        return Err(corehop_sim::ScenarioError {
            file: doc.file().to_string(),
            key: "sweep".into(),
            problem: Problem::Invalid(format!(
                "the scenario sweeps {} ({} points): run it with corehop.sweep(), or give each swept key one value",
                swept.join(", "),
                points.len()
            )),
        });
    };
    models::run_scenario(&point.scenario, &mut |_| {})
}

#[pymethods]
impl PyScenario {
    /// Loads a scenario file (TOML). A machine `file = ...` in it is found next to it.
    #[staticmethod]
    fn load(path: PathBuf) -> PyResult<Self> {
        Ok(PyScenario { doc: ScenarioDoc::load(&path).map_err(to_py_err)? })
    }

    /// Parses scenario TOML text; `name` stands for the file in errors.
    #[staticmethod]
    #[pyo3(signature = (text, name = "<text>"))]
    fn from_toml(text: &str, name: &str) -> PyResult<Self> {
        Ok(PyScenario { doc: ScenarioDoc::parse(name, text).map_err(to_py_err)? })
    }

    /// A scenario from a dict shaped like the TOML file (nested dicts for tables).
    #[staticmethod]
    #[pyo3(signature = (data, name = "<dict>"))]
    fn from_dict(data: &Bound<'_, PyDict>, name: &str) -> PyResult<Self> {
        match to_toml(name, "", data.as_any()).map_err(to_py_err)? {
            toml::Value::Table(table) => Ok(PyScenario { doc: ScenarioDoc::from_table(name, table) }),
            _ => unreachable!("a dict converts to a table"),
        }
    }

    /// A copy with dotted keys set, e.g. `{"workload.iterations": 500}` (a dict, or a list of
    /// (key, value) pairs). A key the file sweeps is pinned to the one value.
    fn with_values(&self, values: &Bound<'_, PyAny>) -> PyResult<Self> {
        let settings = self.settings(values)?;
        Ok(PyScenario { doc: with_settings(&self.doc, &settings).map_err(to_py_err)? })
    }

    /// The file name (or stand-in) errors mention.
    #[getter]
    fn file(&self) -> &str {
        self.doc.file()
    }

    /// The document as a dict (as the TOML file reads, with values set).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        table_to_py(py, self.doc.table())
    }

    /// The document as TOML text.
    fn to_toml(&self) -> String {
        self.doc.to_toml()
    }

    /// The sweeps the document declares (`[[sweep]]`): a list of (key, values).
    fn sweeps<'py>(&self, py: Python<'py>) -> PyResult<Vec<(String, Bound<'py, PyAny>)>> {
        self.doc
            .sweeps()
            .map_err(to_py_err)?
            .into_iter()
            .map(|s| Ok((s.key, toml_to_py(py, &toml::Value::Array(s.values))?)))
            .collect()
    }

    /// Checks the document as one scenario (machine, costs, limits; not yet the workload, which
    /// its model checks when it runs). Raises ScenarioError.
    fn validate(&self) -> PyResult<()> {
        self.doc.validate().map(drop).map_err(to_py_err)
    }

    /// Runs the scenario (with `values` set first) and returns its report as a dict. The
    /// GIL is released while the simulation runs.
    #[pyo3(signature = (values = None))]
    fn run<'py>(&self, py: Python<'py>, values: Option<&Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyAny>> {
        let settings = match values {
            Some(v) => self.settings(v)?,
            None => Settings::new(),
        };
        let doc = &self.doc;
        let report = py.detach(|| run_one(doc, &settings)).map_err(|e| scenario_error(py, &e))?;
        report_to_py(py, &report)
    }

    /// Runs one simulation per entry of `points` (each a dict or list of (key, value) pairs)
    /// on `jobs` threads (0: every CPU this process may use) and returns an iterator of
    /// (index, result) in completion order: a report dict, or the exception that point
    /// raised (ScenarioError, or RuntimeError if the model panicked). Dropping the iterator
    /// skips the points not yet started.
    #[pyo3(signature = (points, jobs = 0))]
    fn run_points(&self, points: &Bound<'_, PyAny>, jobs: usize) -> PyResult<PointResults> {
        let settings: Vec<Settings> =
            points.try_iter()?.map(|p| self.settings(&p?)).collect::<PyResult<_>>()?;
        let total = settings.len();
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let doc = self.doc.clone();
        let stop_workers = stop.clone();
        std::thread::Builder::new()
            .name("corehop-sweep".into())
            .spawn(move || {
                corehop_sim::map_points(&settings, jobs, |i, s| {
                    if stop_workers.load(Ordering::Relaxed) {
                        return;
                    }
                    let result = catch_unwind(AssertUnwindSafe(|| run_one(&doc, s))).map_err(|panic| {
                        panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_else(|| "unknown panic".into())
                    });
                    if tx.send((i, result)).is_err() {
                        stop_workers.store(true, Ordering::Relaxed);
                    }
                });
            })
            .map_err(|e| PyRuntimeError::new_err(format!("cannot start the sweep thread: {e}")))?;
        Ok(PointResults { rx: Mutex::new(rx), stop, remaining: Mutex::new(total) })
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (String,))> {
        let state =
            serde_json::to_string(&slf.get().doc).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        Ok((slf.get_type().getattr("_from_state")?, (state,)))
    }

    #[staticmethod]
    fn _from_state(state: &str) -> PyResult<Self> {
        let doc = serde_json::from_str(state).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(PyScenario { doc })
    }

    fn __repr__(&self) -> String {
        format!("Scenario({:?})", self.doc.file())
    }
}

type PointResult = (usize, Result<Result<Report, corehop_sim::ScenarioError>, String>);

/// The results of `Scenario.run_points`, as they finish: (index, report dict or exception).
#[pyclass(module = "corehop")]
struct PointResults {
    rx: Mutex<Receiver<PointResult>>,
    stop: Arc<AtomicBool>,
    remaining: Mutex<usize>,
}

#[pymethods]
impl PointResults {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<(usize, Bound<'py, PyAny>)>> {
        {
            let remaining = self.remaining.lock().expect("not poisoned");
            if *remaining == 0 {
                return Ok(None);
            }
        }
        loop {
            // Wait without the GIL, a little at a time so that Ctrl-C gets through.
            match py.detach(|| self.rx.lock().expect("not poisoned").recv_timeout(Duration::from_millis(100)))
            {
                Ok((i, result)) => {
                    *self.remaining.lock().expect("not poisoned") -= 1;
                    let value = match result {
                        Ok(Ok(report)) => report_to_py(py, &report)?,
                        Ok(Err(e)) => scenario_error(py, &e).into_value(py).into_bound(py).into_any(),
                        Err(panic) => PyRuntimeError::new_err(format!("the simulation panicked: {panic}"))
                            .into_value(py)
                            .into_bound(py)
                            .into_any(),
                    };
                    return Ok(Some((i, value)));
                }
                Err(RecvTimeoutError::Timeout) => {
                    if let Err(e) = py.check_signals() {
                        self.stop.store(true, Ordering::Relaxed);
                        return Err(e);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(PyRuntimeError::new_err("the sweep thread ended early"));
                }
            }
        }
    }

    /// Points not yet reported.
    fn __len__(&self) -> usize {
        *self.remaining.lock().expect("not poisoned")
    }
}

impl Drop for PointResults {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The workload models: a list of (kind, what it models).
#[pyfunction(name = "models")]
fn list_models() -> Vec<(&'static str, &'static str)> {
    models::MODELS.iter().map(|m| (m.kind, m.about)).collect()
}

/// The machine presets: a list of (name, what it is).
#[pyfunction(name = "presets")]
fn list_presets() -> Vec<(&'static str, &'static str)> {
    presets::names().iter().map(|&n| (n, presets::describe(n).unwrap_or(""))).collect()
}

/// A machine preset as data: the dict a machine TOML file holds (CPUs, cores, caches,
/// classes, speeds). Raises ScenarioError naming the preset if there is none by that name.
#[pyfunction(name = "preset")]
fn machine_preset<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyDict>> {
    let machine = presets::by_name(name).map_err(|e| {
        scenario_error(
            py,
            &corehop_sim::ScenarioError {
                file: "<preset>".into(),
                key: "machine.preset".into(),
                problem: Problem::Machine(e.to_string()),
            },
        )
    })?;
    let table: toml::Table =
        toml::from_str(&machine.to_toml_string()).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    table_to_py(py, &table)
}

/// The simulator's cost model for a preset (cache and memory latencies, hop paths, ...), as
/// the `[costs]` table a scenario overrides.
#[pyfunction]
fn cost_model<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyDict>> {
    machine_preset(py, name)?;
    let table = toml::Table::try_from(CostModel::for_preset(name))
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    table_to_py(py, &table)
}

/// The number of CPUs this process may run on (affinity mask and cgroup quota).
#[pyfunction]
fn available_threads() -> usize {
    corehop_sim::available_threads()
}

/// corehop's deterministic simulator of asymmetric multicores (native part).
#[pymodule]
fn _corehop(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyScenario>()?;
    m.add_class::<PointResults>()?;
    m.add("ScenarioError", m.py().get_type::<PyScenarioError>())?;
    m.add_function(wrap_pyfunction!(list_models, m)?)?;
    m.add_function(wrap_pyfunction!(list_presets, m)?)?;
    m.add_function(wrap_pyfunction!(machine_preset, m)?)?;
    m.add_function(wrap_pyfunction!(cost_model, m)?)?;
    m.add_function(wrap_pyfunction!(available_threads, m)?)?;
    m.add("MAX_POINTS", corehop_sim::MAX_POINTS)?;
    Ok(())
}
