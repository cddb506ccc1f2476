//! SMT modes, application classes and the hybrid mode scheduler.
//!
//! On an SMT core the hardware contexts share one core's throughput. Some applications run
//! better alone on the core (class [`Class::Uni`]), some gain from a sibling ([`Class::Smt`]),
//! some do not care ([`Class::Any`]). Two modes follow (paper: smt-asymmetric-multiprocessing):
//!
//! - [`Mode::Amp`] reserves one context of every SMT core for service work (offloaded calls,
//!   component work: the paper's interrupt bottom halves); applications run only on the other
//!   context, never interrupted. With no service work pending the reserved context sleeps and
//!   gives the whole core to the application, so AMP behaves like a uniprocessor.
//! - [`Mode::Smp`] treats every context alike: applications and service work anywhere.
//!
//! [`SmtLayout`] turns a [`Machine`] into sibling groups and answers where each kind of work may
//! run in each mode. [`Classifier`] classes an application from measured progress. [`Hybrid`]
//! keeps one queue per mode and alternates the modes in time slices, so each application runs
//! in the mode it prefers.
//!
//! ```
//! use corehop_policy::smt::{Class, Hybrid, HybridConfig, Mode};
//!
//! let mut hybrid = Hybrid::new(HybridConfig { slice_ns: 1_000_000, switch_ns: 0, start: Mode::Amp }).unwrap();
//! hybrid.admit(1, Class::Uni).unwrap(); // prefers AMP
//! hybrid.admit(2, Class::Smt).unwrap(); // prefers SMP
//! assert_eq!(hybrid.running(), vec![1]);
//! let switch = hybrid.tick(1_000_000).expect("slice over, the SMP queue is waiting");
//! assert_eq!(switch.to, Mode::Smp);
//! assert_eq!(hybrid.running(), vec![2]);
//! ```

use std::collections::{BTreeMap, VecDeque};

use corehop_topology::{CpuId, Machine};
use serde::{Deserialize, Serialize};

/// How the contexts of an SMT core are used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Asymmetric: one context per SMT core is reserved for service work.
    Amp,
    /// Symmetric: every context runs anything.
    Smp,
}

impl Mode {
    /// Both modes, AMP first.
    pub const ALL: [Mode; 2] = [Mode::Amp, Mode::Smp];

    /// The other mode.
    pub fn other(self) -> Mode {
        match self {
            Mode::Amp => Mode::Smp,
            Mode::Smp => Mode::Amp,
        }
    }

    fn index(self) -> usize {
        match self {
            Mode::Amp => 0,
            Mode::Smp => 1,
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Amp => "AMP",
            Mode::Smp => "SMP",
        })
    }
}

/// What an application prefers on an SMT core.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    /// Runs best with the core to itself (paper: pro-UNI / pro-AMP).
    Uni,
    /// Gains from sharing the core with a sibling (paper: pro-SMP).
    Smt,
    /// Indifferent.
    Any,
}

impl Class {
    /// The mode this class prefers; `None` for [`Class::Any`].
    pub fn preferred_mode(self) -> Option<Mode> {
        match self {
            Class::Uni => Some(Mode::Amp),
            Class::Smt => Some(Mode::Smp),
            Class::Any => None,
        }
    }
}

impl std::fmt::Display for Class {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Class::Uni => "UNI",
            Class::Smt => "SMT",
            Class::Any => "ANY",
        })
    }
}

/// The kind of a piece of work, for placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Work {
    /// An application task.
    App,
    /// Service work: an offloaded call, a component's step, an interrupt bottom half.
    Service,
}

/// Why an SMT decision could not be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ModeError {
    /// AMP mode on a machine without SMT.
    #[error("AMP mode needs an SMT core (a core with two or more hardware contexts); machine {machine:?} has none")]
    NoSmtCore {
        /// The machine's name.
        machine: String,
    },
    /// No co-run sample to classify from.
    #[error("classification needs at least one co-run sample")]
    NoSamples,
    /// A progress rate that is not finite and positive.
    #[error("progress rate {what} must be finite and > 0, got {value}")]
    BadRate {
        /// Whose.
        what: &'static str,
        /// Its value.
        value: f64,
    },
    /// A classification margin outside [0, 1).
    #[error("classification margin must be in [0, 1), got {0}")]
    BadMargin(f64),
    /// A hybrid time slice of 0.
    #[error("the hybrid time slice must be > 0 ns")]
    ZeroSlice,
    /// An application admitted twice.
    #[error("application {0} is already admitted")]
    DuplicateApp(AppId),
    /// An application never admitted.
    #[error("application {0} is not admitted")]
    UnknownApp(AppId),
}

/// The hardware contexts of one physical core.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SmtGroup {
    /// Package (socket) index.
    pub package: usize,
    /// Core index inside the machine.
    pub core: usize,
    /// The contexts, sorted; the last one is the reserved context when there are two or more.
    pub cpus: Vec<CpuId>,
}

impl SmtGroup {
    /// The context reserved for service work in AMP mode: the highest-numbered sibling (Linux
    /// numbers the second contexts of all cores after the first ones, so this keeps the
    /// application contexts contiguous). `None` on a single-context core.
    pub fn reserved(&self) -> Option<CpuId> {
        (self.cpus.len() >= 2).then(|| *self.cpus.last().expect("len >= 2"))
    }

    /// Whether the core has more than one context.
    pub fn is_smt(&self) -> bool {
        self.cpus.len() >= 2
    }
}

/// A machine seen as SMT sibling groups, and the placement rules of the two modes.
///
/// The rules, per CPU:
///
/// | mode | application task | service work |
/// | --- | --- | --- |
/// | AMP | every context except the reserved ones | only reserved contexts |
/// | SMP | everywhere | everywhere |
///
/// Single-context cores are application cores in AMP mode: they have no context to spare.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SmtLayout {
    machine: String,
    groups: Vec<SmtGroup>,
}

impl SmtLayout {
    /// Groups `machine`'s CPUs by physical core (package, core), in first-CPU order.
    pub fn from_machine(machine: &Machine) -> SmtLayout {
        let mut by_core: BTreeMap<(usize, usize), Vec<CpuId>> = BTreeMap::new();
        for cpu in machine.cpus() {
            by_core.entry((cpu.package, cpu.core)).or_default().push(cpu.id);
        }
        let mut groups: Vec<SmtGroup> = by_core
            .into_iter()
            .map(|((package, core), mut cpus)| {
                cpus.sort();
                SmtGroup { package, core, cpus }
            })
            .collect();
        groups.sort_by_key(|g| g.cpus[0]);
        SmtLayout { machine: machine.name.clone(), groups }
    }

    /// The sibling groups, one per physical core.
    pub fn groups(&self) -> &[SmtGroup] {
        &self.groups
    }

    /// Whether any core has two or more contexts.
    pub fn has_smt(&self) -> bool {
        self.groups.iter().any(SmtGroup::is_smt)
    }

    /// Checks that `mode` can run here: AMP needs at least one SMT core.
    pub fn check(&self, mode: Mode) -> Result<(), ModeError> {
        match mode {
            Mode::Amp if !self.has_smt() => Err(ModeError::NoSmtCore { machine: self.machine.clone() }),
            _ => Ok(()),
        }
    }

    /// Contexts reserved for service work in AMP mode, one per SMT core.
    pub fn reserved(&self) -> Vec<CpuId> {
        self.groups.iter().filter_map(SmtGroup::reserved).collect()
    }

    /// Whether `cpu` is a reserved context.
    pub fn is_reserved(&self, cpu: CpuId) -> bool {
        self.group_of(cpu).and_then(SmtGroup::reserved) == Some(cpu)
    }

    /// The group `cpu` belongs to.
    pub fn group_of(&self, cpu: CpuId) -> Option<&SmtGroup> {
        self.groups.iter().find(|g| g.cpus.contains(&cpu))
    }

    /// Whether `work` may run on `cpu` in `mode` (see the table on [`SmtLayout`]).
    pub fn allowed(&self, cpu: CpuId, work: Work, mode: Mode) -> bool {
        if self.group_of(cpu).is_none() {
            return false;
        }
        match (mode, work) {
            (Mode::Smp, _) => true,
            (Mode::Amp, Work::App) => !self.is_reserved(cpu),
            (Mode::Amp, Work::Service) => self.is_reserved(cpu),
        }
    }

    /// Every CPU where `work` may run in `mode`, sorted.
    pub fn cpus_for(&self, work: Work, mode: Mode) -> Vec<CpuId> {
        let mut cpus: Vec<CpuId> = self
            .groups
            .iter()
            .flat_map(|g| g.cpus.iter().copied())
            .filter(|&c| self.allowed(c, work, mode))
            .collect();
        cpus.sort();
        cpus
    }

    /// Where to run the `seq`-th application task in `mode`: round robin over the allowed
    /// contexts (the paper's section 5.4 finds pinning tasks to contexts unfair; rotating is
    /// free on SMT because siblings share every cache). `None` if no CPU may run it.
    pub fn place_app(&self, mode: Mode, seq: u64) -> Option<CpuId> {
        let cpus = self.cpus_for(Work::App, mode);
        (!cpus.is_empty()).then(|| cpus[(seq % cpus.len() as u64) as usize])
    }

    /// Where to run service work raised by code on `origin`: in AMP mode the reserved sibling
    /// of `origin`'s core (its data is in the shared L1), else the first reserved context; in
    /// SMP mode `origin` itself. `None` if AMP is impossible here.
    pub fn place_service(&self, origin: CpuId, mode: Mode) -> Option<CpuId> {
        match mode {
            Mode::Smp => self.group_of(origin).map(|_| origin),
            Mode::Amp => self
                .group_of(origin)
                .and_then(SmtGroup::reserved)
                .or_else(|| self.groups.iter().find_map(SmtGroup::reserved)),
        }
    }
}

/// One application's progress rate (work per unit time, any unit) alone on a core and while
/// sharing it with a sibling.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CoRun {
    /// Its rate alone on the core.
    pub alone: f64,
    /// Its rate with the sibling busy.
    pub shared: f64,
}

impl CoRun {
    /// `shared / alone`: 1.0 means the sibling cost nothing, 0.5 means half speed.
    pub fn relative(&self) -> f64 {
        self.shared / self.alone
    }

    fn check(&self, who: &'static str) -> Result<(), ModeError> {
        for (what, value) in [(who, self.alone), (who, self.shared)] {
            if !value.is_finite() || value <= 0.0 {
                return Err(ModeError::BadRate { what, value });
            }
        }
        Ok(())
    }
}

/// One measurement: the application and a partner, each alone and then co-running on the two
/// contexts of one core.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// The application.
    pub app: CoRun,
    /// Its partner.
    pub partner: CoRun,
}

/// The verdict of a [`Classifier`], with the figures behind it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Classification {
    /// The class it falls in.
    pub class: Class,
    /// Mean over samples of `app.relative() + partner.relative()`: the core's total progress
    /// when shared, relative to giving it to each application in turn (1.0).
    pub weighted_speedup: f64,
    /// Mean of the application's own `relative()`.
    pub own: f64,
    /// Mean of the partners' `relative()`: the slowdown this application inflicts.
    pub partners: f64,
}

/// Classes applications by measurement, as the paper does: an application is SMT-class when
/// co-running it makes more total progress than time-sharing the core, counting both its own
/// slowdown and the slowdown it causes its partner; UNI-class when less; ANY within `margin`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Classifier {
    /// Relative band around 1.0 inside which an application is [`Class::Any`].
    pub margin: f64,
}

impl Default for Classifier {
    fn default() -> Self {
        Classifier { margin: Classifier::DEFAULT_MARGIN }
    }
}

impl Classifier {
    /// ±5 %: below the run-to-run noise of the paper's measurements.
    pub const DEFAULT_MARGIN: f64 = 0.05;

    /// A classifier that calls an application [`Class::Any`] when its weighted speedup lies
    /// within `margin` of 1.0.
    pub fn new(margin: f64) -> Result<Classifier, ModeError> {
        if !(0.0..1.0).contains(&margin) {
            return Err(ModeError::BadMargin(margin));
        }
        Ok(Classifier { margin })
    }

    /// Classes an application from co-run samples (with one or more partners).
    pub fn classify(&self, samples: &[Sample]) -> Result<Classification, ModeError> {
        Classifier::new(self.margin)?;
        if samples.is_empty() {
            return Err(ModeError::NoSamples);
        }
        let (mut own, mut partners) = (0.0, 0.0);
        for s in samples {
            s.app.check("app")?;
            s.partner.check("partner")?;
            own += s.app.relative();
            partners += s.partner.relative();
        }
        let n = samples.len() as f64;
        let (own, partners) = (own / n, partners / n);
        let weighted_speedup = own + partners;
        Ok(Classification { class: self.band(weighted_speedup), weighted_speedup, own, partners })
    }

    /// Classes an application from its progress rates measured in each mode under the same
    /// service load; the paper found this comparison sufficient (section 5.1). The ratio
    /// `smp / amp` plays the role of the weighted speedup.
    pub fn classify_modes(&self, amp: f64, smp: f64) -> Result<Class, ModeError> {
        Classifier::new(self.margin)?;
        CoRun { alone: amp, shared: smp }.check("mode")?;
        Ok(self.band(smp / amp))
    }

    fn band(&self, speedup: f64) -> Class {
        if speedup > 1.0 + self.margin {
            Class::Smt
        } else if speedup < 1.0 - self.margin {
            Class::Uni
        } else {
            Class::Any
        }
    }
}

/// An application's id, chosen by the caller.
pub type AppId = u64;

/// Settings of the [`Hybrid`] scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HybridConfig {
    /// Time slice per application in its mode, in ns: a mode lasts `slice_ns` times the number
    /// of applications in its queue, so each application gets about the same share of time.
    pub slice_ns: u64,
    /// What a mode switch costs before the new mode's applications run, in ns; the slice
    /// starts after it (else a switch as long as a slice would leave no time to run at all).
    pub switch_ns: u64,
    /// The mode to start in.
    pub start: Mode,
}

impl Default for HybridConfig {
    fn default() -> Self {
        HybridConfig { slice_ns: 10_000_000, switch_ns: 0, start: Mode::Amp }
    }
}

/// A mode change decided by [`Hybrid::tick`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Switch {
    /// The mode before.
    pub from: Mode,
    /// The mode after.
    pub to: Mode,
    /// When it was decided (the `now` given to `tick`).
    pub at: u64,
}

/// The hybrid mode scheduler: one queue of applications per mode; the modes alternate in time
/// slices and only the current mode's applications run.
///
/// A UNI application queues for AMP, an SMT application for SMP, an ANY application for
/// whichever queue is shorter when it is admitted (balancing the two modes' load, the
/// difficulty the paper's section 5.2 names). A mode with an empty queue is skipped; with both
/// queues empty the mode stays. Every admitted application is in exactly one queue at all
/// times: switching modes only changes which queue runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Hybrid {
    config: HybridConfig,
    mode: Mode,
    mode_since: u64,
    queues: [VecDeque<AppId>; 2],
    classes: BTreeMap<AppId, Class>,
    switches: u64,
}

impl Hybrid {
    /// A hybrid scheduler with `config`.
    pub fn new(config: HybridConfig) -> Result<Hybrid, ModeError> {
        if config.slice_ns == 0 {
            return Err(ModeError::ZeroSlice);
        }
        Ok(Hybrid {
            config,
            mode: config.start,
            mode_since: 0,
            queues: [VecDeque::new(), VecDeque::new()],
            classes: BTreeMap::new(),
            switches: 0,
        })
    }

    /// Adds `app` with `class`; returns the mode it will run in.
    pub fn admit(&mut self, app: AppId, class: Class) -> Result<Mode, ModeError> {
        if self.classes.contains_key(&app) {
            return Err(ModeError::DuplicateApp(app));
        }
        let mode = self.mode_for(class);
        self.classes.insert(app, class);
        self.queues[mode.index()].push_back(app);
        Ok(mode)
    }

    /// Removes `app` (it finished or left).
    pub fn retire(&mut self, app: AppId) -> Result<Class, ModeError> {
        let class = self.classes.remove(&app).ok_or(ModeError::UnknownApp(app))?;
        for q in &mut self.queues {
            q.retain(|&a| a != app);
        }
        Ok(class)
    }

    /// Changes `app`'s class (e.g. after a measurement) and moves it to its new mode's queue if
    /// the class asks for another mode; returns the mode it is now in.
    pub fn reclassify(&mut self, app: AppId, class: Class) -> Result<Mode, ModeError> {
        let current = self.mode_of(app).ok_or(ModeError::UnknownApp(app))?;
        self.classes.insert(app, class);
        let target = class.preferred_mode().unwrap_or(current);
        if target != current {
            self.queues[current.index()].retain(|&a| a != app);
            self.queues[target.index()].push_back(app);
        }
        Ok(target)
    }

    /// Advances time to `now` (ns, monotonic); switches mode when the current mode's slice is
    /// over and the other queue has work, or at once when the current queue is empty.
    pub fn tick(&mut self, now: u64) -> Option<Switch> {
        let other = self.mode.other();
        if self.queues[other.index()].is_empty() {
            return None;
        }
        let due = self.queues[self.mode.index()].is_empty() || now >= self.slice_end();
        due.then(|| self.switch_to(other, now))
    }

    /// When the current slice ends (ns): the switch cost plus one slice per application of the
    /// current mode after the last switch. `tick` at or after this time switches if the other
    /// queue has work.
    pub fn slice_end(&self) -> u64 {
        let apps = self.queues[self.mode.index()].len().max(1) as u64;
        let switch = if self.switches > 0 { self.config.switch_ns } else { 0 };
        self.mode_since.saturating_add(switch).saturating_add(self.config.slice_ns.saturating_mul(apps))
    }

    fn switch_to(&mut self, to: Mode, now: u64) -> Switch {
        let from = self.mode;
        self.mode = to;
        self.mode_since = now;
        self.switches += 1;
        Switch { from, to, at: now }
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Applications that run now (the current mode's queue), in queue order.
    pub fn running(&self) -> Vec<AppId> {
        self.queue(self.mode)
    }

    /// The queue of `mode`.
    pub fn queue(&self, mode: Mode) -> Vec<AppId> {
        self.queues[mode.index()].iter().copied().collect()
    }

    /// The mode `app` runs in, if admitted.
    pub fn mode_of(&self, app: AppId) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| self.queues[m.index()].contains(&app))
    }

    /// `app`'s class, if admitted.
    pub fn class_of(&self, app: AppId) -> Option<Class> {
        self.classes.get(&app).copied()
    }

    /// Mode switches so far.
    pub fn switches(&self) -> u64 {
        self.switches
    }

    fn mode_for(&self, class: Class) -> Mode {
        class.preferred_mode().unwrap_or_else(|| {
            let (cur, other) = (self.mode, self.mode.other());
            if self.queues[other.index()].len() < self.queues[cur.index()].len() {
                other
            } else {
                cur
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corehop_topology::{CoreClass, Cpu};
    use proptest::prelude::*;

    /// A machine whose `cores[i]` contexts are CPUs of core i (dense ids in order given).
    fn machine(contexts_per_core: &[usize]) -> Machine {
        let mut cpus = Vec::new();
        for (core, &n) in contexts_per_core.iter().enumerate() {
            for _ in 0..n {
                let id = cpus.len();
                cpus.push(Cpu {
                    id: CpuId(id),
                    os_id: corehop_topology::OsCpu(id),
                    core,
                    package: 0,
                    class: CoreClass::Uniform,
                    speed: 1.0,
                    emulated_speed: None,
                });
            }
        }
        Machine { name: "test".into(), source: "test".into(), cpus, caches: Vec::new(), waitpkg: false }
    }

    #[test]
    fn layout_reserves_the_last_sibling_of_each_smt_core() {
        let layout = SmtLayout::from_machine(&machine(&[2, 2, 1]));
        assert!(layout.has_smt());
        assert_eq!(layout.reserved(), vec![CpuId(1), CpuId(3)]);
        assert_eq!(layout.cpus_for(Work::App, Mode::Amp), vec![CpuId(0), CpuId(2), CpuId(4)]);
        assert_eq!(layout.cpus_for(Work::Service, Mode::Amp), vec![CpuId(1), CpuId(3)]);
        assert_eq!(layout.cpus_for(Work::App, Mode::Smp).len(), 5);
        assert_eq!(layout.place_service(CpuId(2), Mode::Amp), Some(CpuId(3)));
        assert_eq!(layout.place_service(CpuId(4), Mode::Amp), Some(CpuId(1)), "single-context core borrows");
        assert_eq!(layout.place_service(CpuId(4), Mode::Smp), Some(CpuId(4)));
    }

    #[test]
    fn amp_needs_an_smt_core() {
        let layout = SmtLayout::from_machine(&machine(&[1, 1]));
        assert!(!layout.has_smt());
        assert_eq!(layout.check(Mode::Amp), Err(ModeError::NoSmtCore { machine: "test".into() }));
        assert_eq!(layout.check(Mode::Smp), Ok(()));
        assert_eq!(layout.place_service(CpuId(0), Mode::Amp), None);
        assert!(!layout.allowed(CpuId(9), Work::App, Mode::Smp), "unknown CPU");
    }

    fn corun(alone: f64, shared: f64) -> CoRun {
        CoRun { alone, shared }
    }

    #[test]
    fn classifier_classes_synthetic_applications() {
        let c = Classifier::default();
        // FP-bound, fills the core alone: both slow to ~45 % when sharing (like ART).
        let art = Sample { app: corun(10.0, 4.5), partner: corun(10.0, 4.5) };
        assert_eq!(c.classify(&[art]).unwrap().class, Class::Uni);
        // Latency-bound, leaves issue slots free: both keep ~65 % (like MESA).
        let mesa = Sample { app: corun(8.0, 5.2), partner: corun(8.0, 5.2) };
        assert_eq!(c.classify(&[mesa]).unwrap().class, Class::Smt);
        // Exactly time-sharing.
        let flat = Sample { app: corun(3.0, 1.5), partner: corun(5.0, 2.6) };
        assert_eq!(c.classify(&[flat]).unwrap().class, Class::Any);
    }

    #[test]
    fn classifier_counts_the_partners_slowdown() {
        // The application itself barely slows down (90 %) but crushes its partner (10 %): the
        // core makes no more progress than time-sharing, so it is not SMT-class.
        let bully = Sample { app: corun(10.0, 9.0), partner: corun(10.0, 1.0) };
        let verdict = Classifier::default().classify(&[bully]).unwrap();
        assert!((verdict.own - 0.9).abs() < 1e-9 && (verdict.partners - 0.1).abs() < 1e-9);
        assert_eq!(verdict.class, Class::Any);
        let worse = Sample { app: corun(10.0, 8.0), partner: corun(10.0, 0.5) };
        assert_eq!(Classifier::default().classify(&[worse]).unwrap().class, Class::Uni);
    }

    #[test]
    fn classifier_by_modes() {
        let c = Classifier::default();
        assert_eq!(c.classify_modes(1.0 / 176.33, 1.0 / 207.67), Ok(Class::Uni)); // Art, table 5
        assert_eq!(c.classify_modes(1.0 / 743.67, 1.0 / 574.67), Ok(Class::Smt)); // Mesa
        assert_eq!(c.classify_modes(1.0, 1.01), Ok(Class::Any));
    }

    #[test]
    fn classifier_rejects_bad_input() {
        let c = Classifier::default();
        assert_eq!(c.classify(&[]), Err(ModeError::NoSamples));
        let zero = Sample { app: corun(0.0, 1.0), partner: corun(1.0, 1.0) };
        assert_eq!(c.classify(&[zero]), Err(ModeError::BadRate { what: "app", value: 0.0 }));
        let nan = Sample { app: corun(1.0, 1.0), partner: corun(1.0, f64::NAN) };
        assert!(matches!(c.classify(&[nan]), Err(ModeError::BadRate { what: "partner", .. })));
        assert_eq!(Classifier::new(1.0), Err(ModeError::BadMargin(1.0)));
        assert_eq!(Classifier::new(-0.1), Err(ModeError::BadMargin(-0.1)));
        assert!(matches!(c.classify_modes(1.0, f64::INFINITY), Err(ModeError::BadRate { .. })));
    }

    #[test]
    fn hybrid_alternates_and_skips_empty_modes() {
        let mut h = Hybrid::new(HybridConfig { slice_ns: 100, switch_ns: 0, start: Mode::Amp }).unwrap();
        assert_eq!(h.tick(1_000), None, "nothing to run: mode stays");
        assert_eq!(h.admit(1, Class::Smt), Ok(Mode::Smp));
        let s = h.tick(1_000).expect("AMP queue empty: switch at once");
        assert_eq!((s.from, s.to), (Mode::Amp, Mode::Smp));
        assert_eq!(h.admit(2, Class::Uni), Ok(Mode::Amp));
        assert_eq!(h.admit(3, Class::Uni), Ok(Mode::Amp));
        assert_eq!(h.tick(1_099), None);
        assert_eq!(h.tick(1_100).map(|s| s.to), Some(Mode::Amp));
        assert_eq!(h.running(), vec![2, 3]);
        assert_eq!(h.slice_end(), 1_300, "two applications: two slices");
        assert_eq!(h.tick(1_299), None);
        assert_eq!(h.tick(1_300).map(|s| s.to), Some(Mode::Smp));
        assert_eq!(h.switches(), 3);
    }

    #[test]
    fn hybrid_slices_start_after_the_switch_cost() {
        let mut h = Hybrid::new(HybridConfig { slice_ns: 100, switch_ns: 100, start: Mode::Amp }).unwrap();
        h.admit(1, Class::Uni).unwrap();
        h.admit(2, Class::Smt).unwrap();
        assert_eq!(h.slice_end(), 100, "no switch yet: no switch cost");
        assert_eq!(h.tick(100).map(|s| s.to), Some(Mode::Smp));
        assert_eq!(h.slice_end(), 300);
        assert_eq!(h.tick(299), None);
        assert_eq!(h.tick(300).map(|s| s.to), Some(Mode::Amp));
    }

    #[test]
    fn hybrid_places_any_in_the_shorter_queue_and_reclassifies() {
        let mut h = Hybrid::new(HybridConfig::default()).unwrap();
        h.admit(1, Class::Uni).unwrap();
        h.admit(2, Class::Uni).unwrap();
        assert_eq!(h.admit(3, Class::Any), Ok(Mode::Smp));
        assert_eq!(h.admit(4, Class::Any), Ok(Mode::Smp));
        assert_eq!(h.admit(5, Class::Any), Ok(Mode::Amp), "tie goes to the current mode");
        assert_eq!(h.reclassify(5, Class::Smt), Ok(Mode::Smp));
        assert_eq!(h.queue(Mode::Smp), vec![3, 4, 5]);
        assert_eq!(h.reclassify(4, Class::Any), Ok(Mode::Smp), "ANY stays where it is");
        assert_eq!(h.class_of(4), Some(Class::Any));
        assert_eq!(h.retire(1), Ok(Class::Uni));
        assert_eq!(h.retire(1), Err(ModeError::UnknownApp(1)));
        assert_eq!(h.admit(2, Class::Smt), Err(ModeError::DuplicateApp(2)));
        assert_eq!(h.reclassify(9, Class::Smt), Err(ModeError::UnknownApp(9)));
        assert_eq!(
            Hybrid::new(HybridConfig { slice_ns: 0, switch_ns: 0, start: Mode::Smp }).err(),
            Some(ModeError::ZeroSlice)
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Admit(AppId, Class),
        Retire(AppId),
        Reclassify(AppId, Class),
        Tick(u64),
    }

    fn class() -> impl Strategy<Value = Class> {
        prop_oneof![Just(Class::Uni), Just(Class::Smt), Just(Class::Any)]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..12u64, class()).prop_map(|(a, c)| Op::Admit(a, c)),
            (0..12u64).prop_map(Op::Retire),
            (0..12u64, class()).prop_map(|(a, c)| Op::Reclassify(a, c)),
            (0..500u64).prop_map(Op::Tick),
        ]
    }

    proptest! {
        /// Mode switches (and everything else) lose and duplicate no application; the running
        /// set is always the current mode's queue; a classed application is in its mode.
        #[test]
        fn hybrid_loses_and_duplicates_nothing(ops in proptest::collection::vec(op(), 1..200)) {
            let mut h = Hybrid::new(HybridConfig { slice_ns: 50, switch_ns: 7, start: Mode::Amp }).unwrap();
            let mut admitted = std::collections::BTreeSet::new();
            let mut now = 0;
            for op in ops {
                match op {
                    Op::Admit(a, c) => { if h.admit(a, c).is_ok() { prop_assert!(admitted.insert(a)); } }
                    Op::Retire(a) => prop_assert_eq!(h.retire(a).is_ok(), admitted.remove(&a)),
                    Op::Reclassify(a, c) => prop_assert_eq!(h.reclassify(a, c).is_ok(), admitted.contains(&a)),
                    Op::Tick(dt) => {
                        now += dt;
                        let before = h.mode();
                        if let Some(s) = h.tick(now) {
                            prop_assert_eq!(s.from, before);
                            prop_assert!(!h.running().is_empty());
                        }
                    }
                }
                let mut all: Vec<AppId> = Mode::ALL.iter().flat_map(|&m| h.queue(m)).collect();
                all.sort();
                prop_assert_eq!(all, admitted.iter().copied().collect::<Vec<_>>());
                prop_assert_eq!(h.running(), h.queue(h.mode()));
                for &a in &admitted {
                    let class = h.class_of(a).unwrap();
                    if let Some(m) = class.preferred_mode() { prop_assert_eq!(h.mode_of(a), Some(m)); }
                }
            }
        }

        /// Over time every waiting application runs: the mode alternates while both queues have work.
        #[test]
        fn hybrid_serves_both_queues(uni in 1..5usize, smt in 1..5usize, slice in 1..1000u64) {
            let mut h = Hybrid::new(HybridConfig { slice_ns: slice, switch_ns: slice / 2, start: Mode::Smp }).unwrap();
            for a in 0..uni { h.admit(a as AppId, Class::Uni).unwrap(); }
            for a in 0..smt { h.admit((100 + a) as AppId, Class::Smt).unwrap(); }
            let mut seen = std::collections::BTreeSet::new();
            for _ in 0..4 {
                seen.extend(h.running());
                prop_assert!(h.tick(h.slice_end()).is_some());
            }
            prop_assert_eq!(seen.len(), uni + smt);
        }

        /// On any machine with SMT siblings, AMP never places an application task on a reserved
        /// context, always places service work on one, and SMP uses every context.
        #[test]
        fn amp_keeps_apps_off_reserved_contexts(
            cores in proptest::collection::vec(1..5usize, 1..9), seq in 0..1000u64, origin in 0..40usize,
        ) {
            let m = machine(&cores);
            let layout = SmtLayout::from_machine(&m);
            let reserved = layout.reserved();
            prop_assert_eq!(reserved.len(), cores.iter().filter(|&&n| n >= 2).count());
            if let Some(cpu) = layout.place_app(Mode::Amp, seq) {
                prop_assert!(!reserved.contains(&cpu));
            }
            for cpu in m.cpus() {
                prop_assert!(!(layout.allowed(cpu.id, Work::App, Mode::Amp) && reserved.contains(&cpu.id)));
                prop_assert!(layout.allowed(cpu.id, Work::App, Mode::Smp));
            }
            let origin = CpuId(origin % m.cpus().len());
            match layout.place_service(origin, Mode::Amp) {
                Some(cpu) => {
                    prop_assert!(reserved.contains(&cpu));
                    if layout.group_of(origin).unwrap().is_smt() {
                        prop_assert_eq!(m.cpu(cpu).unwrap().core, m.cpu(origin).unwrap().core);
                    }
                }
                None => prop_assert!(reserved.is_empty()),
            }
            prop_assert_eq!(layout.place_app(Mode::Smp, seq).is_some(), true);
        }
    }
}
