//! SMT modes live: AMP (one context per SMT core reserved for service work) and SMP (every
//! context runs anything), switchable at run time.
//!
//! The placement rules are `corehop_policy::smt::SmtLayout`'s; this module only enforces them
//! with threads. One worker thread is pinned per hardware context. Each physical core has
//! three application queues (AMP-only, SMP-only, either mode) and one service queue:
//!
//! ```text
//!           core k                              worker of context c, in mode M
//!   ┌──────────────────────┐          ┌──────────────────────────────────────────────┐
//!   │ service   [s s s]    │──────────▶ 1. service work, if SMT layout allows it on c  │
//!   │ app[M]    [t t]      │──────────▶ 2. one step of a task from app[M], then app[any]│
//!   │ app[any]  [t]        │          │ 3. nothing allowed: sleep on c's mailbox door  │
//!   └──────────────────────┘          └──────────────────────────────────────────────┘
//! ```
//!
//! Application tasks are resumable closures run one [`Step`] at a time; a task that
//! continues goes to the back of its queue, so contexts share tasks round robin (paper §5.4:
//! no pinning of tasks to contexts). A task belongs to exactly one queue or is in exactly one
//! worker's hands, and a mode switch moves no task: it only changes which contexts may take
//! from which queue. That is why a switch can neither lose nor duplicate a task.
//!
//! **Sleeping.** A context with nothing it may run sleeps on the door of its mailbox, so a
//! reserved context without service work really gives the core to its sibling (the paper's
//! idle-task `halt`). Like every worker of the runtime it reads one mailbox
//! (`crate::mailbox`), but its work is in the core's queues, which several contexts take
//! from (a mailbox has one reader); the mailbox brings only the order to stop, and its door is
//! a `corehop_sys::park::Parker`, corehop's one park/wake protocol (loom-checked there): a
//! producer pushes, then leaves a token in the door; the context, having found nothing,
//! parks: it consumes a token and looks again, or sleeps until one comes. A producer that
//! skips a context because of the mode it read is covered by `set_mode`, which publishes the
//! mode, then rings every door.
//!
//! **With the hop runtime.** Tasks of a [`crate::Runtime`] built on the same machine reach the
//! AMP rules through [`service_call`]: it delegates a call (`crate::on`) to the reserved sibling
//! of the task's core in AMP mode and runs it in place in SMP mode.
//!
//! **Switching to AMP.** [`SmtRuntime::set_mode`] publishes the mode, rings every door, then
//! waits until no reserved context is inside an application step started under SMP. A worker
//! marks itself `RunningApp` *before* it reads the mode, so after `set_mode(Mode::Amp)`
//! returns no application code runs on a reserved context until the mode changes again.
#![forbid(unsafe_code)]

use std::cell::Cell;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use corehop_policy::smt::{Mode, ModeError, SmtLayout, Work};
use corehop_topology::{CpuId, Machine, OsCpu};

use crate::mailbox::{Letter, Mailbox, Reader, Stop};
use crate::sys;
use crate::worker::StartError;

/// Runs `call` where `layout` places service work raised by the calling task in `mode`: in AMP
/// on the reserved sibling of the task's core (delegated with [`crate::on`], the task comes
/// back), in SMP right here. For tasks of a [`crate::Runtime`] whose machine `layout` was built
/// from. Errors: [`crate::Error::NotInTask`] outside a task, and those of `on`.
///
/// ```no_run
/// use corehop_policy::smt::{Mode, SmtLayout};
/// use corehop_runtime::{smt::service_call, Runtime};
/// # let machine: corehop_topology::Machine = corehop_topology::presets::by_name("smt-2way").unwrap();
/// let rt = Runtime::builder().machine(machine.clone()).build()?;
/// let layout = SmtLayout::from_machine(&machine);
/// let ran_on = rt.block_on(rt.cpus()[0], move || service_call(&layout, Mode::Amp, corehop_runtime::current_cpu))??;
/// assert_eq!(ran_on, rt.cpus()[1]);
/// # Ok::<(), corehop_runtime::Error>(())
/// ```
pub fn service_call<R: Send>(
    layout: &SmtLayout,
    mode: Mode,
    call: impl FnOnce() -> R + Send,
) -> Result<R, crate::Error> {
    let here = crate::try_current_cpu().filter(|_| crate::in_task()).ok_or(crate::Error::NotInTask)?;
    match layout.place_service(here, mode) {
        Some(target) if target != here => crate::on(target, call),
        _ => Ok(call()),
    }
}

/// What one step of an application task reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// More to do: queue the task again (it may continue on another context).
    Continue,
    /// Finished.
    Done,
}

/// Where and under which mode a step runs, given to every step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepCx {
    /// The context (dense CPU id) running this step.
    pub cpu: CpuId,
    /// The mode this step was started under.
    pub mode: Mode,
}

/// What a context is doing, as last published by its worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContextState {
    /// Looking for work.
    Looking,
    /// Inside (or about to enter) an application step.
    RunningApp,
    /// Running service work.
    RunningService,
    /// Asleep in `futex_wait` (using no CPU).
    Sleeping,
    /// The worker has exited.
    Stopped,
}

impl ContextState {
    fn from_u8(v: u8) -> ContextState {
        match v {
            0 => ContextState::Looking,
            1 => ContextState::RunningApp,
            2 => ContextState::RunningService,
            3 => ContextState::Sleeping,
            _ => ContextState::Stopped,
        }
    }
}

/// Counters of one context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextStats {
    /// The context (dense CPU id, not the kernel's number).
    pub cpu: CpuId,
    /// The kernel's id of the worker thread (for `/proc/self/task/<tid>`).
    pub tid: i32,
    /// Whether this is a reserved (service) context in AMP mode.
    pub reserved: bool,
    /// Application steps run.
    pub app_steps: u64,
    /// Service items run.
    pub service_runs: u64,
    /// Times the worker slept on its futex (counted as it wakes).
    pub sleeps: u64,
    /// Application steps that panicked (the task is dropped, the worker goes on).
    pub panics: u64,
}

/// Why the SMT runtime could not start or act.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SmtError {
    /// The layout refuses the mode (e.g. AMP on a machine without an SMT core).
    #[error(transparent)]
    Policy(#[from] ModeError),
    /// [`SmtBuilder::build`] was called without [`SmtBuilder::machine`].
    #[error("no machine given: call SmtBuilder::machine with a discovered or described machine")]
    NoMachine,
    /// A worker could not be pinned to its hardware context.
    #[error("cannot pin the worker of {cpu} to kernel CPU {os_id}: {source}")]
    Pin {
        /// The context (dense CPU id).
        cpu: CpuId,
        /// The kernel's number for that context.
        os_id: OsCpu,
        /// The OS error from setting the thread's affinity.
        source: std::io::Error,
    },
    /// A worker thread could not be started, or exited before it reported in.
    #[error("cannot start a worker thread: {0}")]
    Spawn(std::io::Error),
    /// [`SmtRuntime::set_mode`] was called from one of the runtime's own workers, which it
    /// would have to wait for.
    #[error("set_mode was called from inside a task; call it from outside the runtime's workers")]
    FromWorker,
}

type AppTask = Box<dyn FnMut(StepCx) -> Step + Send>;
type ServiceItem = Box<dyn FnOnce() + Send>;

/// The queues of one physical core.
struct CoreQueues {
    /// Indexed by `queue_index(Some(Mode::Amp))`, `(Some(Mode::Smp))`, `(None)`.
    app: [Mutex<VecDeque<AppTask>>; 3],
    service: Mutex<VecDeque<ServiceItem>>,
}

fn queue_index(home: Option<Mode>) -> usize {
    match home {
        Some(Mode::Amp) => 0,
        Some(Mode::Smp) => 1,
        None => 2,
    }
}

/// A context: its mailbox and its counters.
struct Context {
    cpu: CpuId,
    os_id: OsCpu,
    group: usize,
    reserved: bool,
    /// Its own orders (stop) and its park word: its work is in the core's shared queues.
    mailbox: Arc<Mailbox<Letter<Stop>>>,
    state: AtomicU8,
    tid: AtomicU32,
    app_steps: AtomicU64,
    service_runs: AtomicU64,
    sleeps: AtomicU64,
    panics: AtomicU64,
}

impl Context {
    fn ring(&self) {
        self.mailbox.unpark();
    }

    fn set_state(&self, state: ContextState) {
        self.state.store(state as u8, SeqCst);
    }
}

struct Shared {
    layout: SmtLayout,
    mode: AtomicU8,
    cores: Vec<CoreQueues>,
    contexts: Vec<Context>,
    /// Tasks and service items submitted but not finished, for [`SmtRuntime::wait_idle`].
    outstanding: Mutex<u64>,
    idle: Condvar,
    next_seq: AtomicU64,
}

fn mode_from_u8(v: u8) -> Mode {
    if v == 0 {
        Mode::Amp
    } else {
        Mode::Smp
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Tasks run outside every lock, so a poisoned lock only means a panic inside VecDeque
    // code; the data is still consistent.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn mode(&self) -> Mode {
        mode_from_u8(self.mode.load(SeqCst))
    }

    fn group_of(&self, cpu: CpuId) -> usize {
        self.contexts.iter().find(|c| c.cpu == cpu).map_or(0, |c| c.group)
    }

    /// Wakes the contexts of `group` that may run `work` now (a reserved context is not woken
    /// for application work in AMP: waking it would take issue slots from its sibling for
    /// nothing). A context that sleeps through a mode change is woken by `set_mode`.
    fn ring_group(&self, group: usize, work: Work) {
        let mode = self.mode();
        self.contexts
            .iter()
            .filter(|c| c.group == group && self.layout.allowed(c.cpu, work, mode))
            .for_each(Context::ring);
    }

    fn finish_one(&self) {
        let mut n = lock(&self.outstanding);
        *n -= 1;
        if *n == 0 {
            self.idle.notify_all();
        }
    }
}

thread_local! {
    static IN_WORKER: Cell<bool> = const { Cell::new(false) };
}

/// Builds an [`SmtRuntime`].
pub struct SmtBuilder {
    machine: Option<Machine>,
    mode: Mode,
    pin: bool,
}

impl SmtBuilder {
    /// The machine to run on: discovered, or a description whose CPUs are declared SMT
    /// siblings (so AMP can be exercised on hardware without SMT). Required.
    pub fn machine(mut self, machine: Machine) -> SmtBuilder {
        self.machine = Some(machine);
        self
    }

    /// The starting mode (default SMP, which every machine supports).
    pub fn mode(mut self, mode: Mode) -> SmtBuilder {
        self.mode = mode;
        self
    }

    /// Whether to pin each worker to its context's kernel CPU (default true). Turning it off
    /// keeps the scheduling logic but lets the kernel place the threads.
    pub fn pin(mut self, pin: bool) -> SmtBuilder {
        self.pin = pin;
        self
    }

    /// Starts one pinned worker per CPU of the machine.
    pub fn build(self) -> Result<SmtRuntime, SmtError> {
        let machine = self.machine.ok_or(SmtError::NoMachine)?;
        let layout = SmtLayout::from_machine(&machine);
        layout.check(self.mode)?;
        let mut contexts = Vec::new();
        let mut orders = Vec::new();
        let mut cores = Vec::new();
        for (group, g) in layout.groups().iter().enumerate() {
            cores.push(CoreQueues {
                app: std::array::from_fn(|_| Mutex::new(VecDeque::new())),
                service: Mutex::new(VecDeque::new()),
            });
            for &cpu in &g.cpus {
                let (mailbox, reader) = Mailbox::new(true, 0, None);
                orders.push(reader);
                contexts.push(Context {
                    cpu,
                    os_id: machine.cpu(cpu).map_or(OsCpu(cpu.0), |c| c.os_id),
                    group,
                    reserved: layout.is_reserved(cpu),
                    mailbox,
                    state: AtomicU8::new(ContextState::Looking as u8),
                    tid: AtomicU32::new(0),
                    app_steps: AtomicU64::new(0),
                    service_runs: AtomicU64::new(0),
                    sleeps: AtomicU64::new(0),
                    panics: AtomicU64::new(0),
                });
            }
        }
        let shared = Arc::new(Shared {
            layout,
            mode: AtomicU8::new(if self.mode == Mode::Amp { 0 } else { 1 }),
            cores,
            contexts,
            outstanding: Mutex::new(0),
            idle: Condvar::new(),
            next_seq: AtomicU64::new(0),
        });
        let mut runtime = SmtRuntime { shared: shared.clone(), workers: Vec::new() };
        for (index, mut orders) in orders.into_iter().enumerate() {
            let ctx = &shared.contexts[index];
            let theirs = shared.clone();
            let started = crate::worker::start_pinned(
                format!("corehop-smt-{}", ctx.cpu),
                self.pin.then_some(ctx.os_id),
                move |started| {
                    started.report();
                    worker(&theirs, index, &mut orders);
                },
            );
            match started {
                Ok(handle) => runtime.workers.push(handle),
                Err(StartError::Pin(source)) => {
                    return Err(SmtError::Pin { cpu: ctx.cpu, os_id: ctx.os_id, source })
                }
                Err(e) => return Err(SmtError::Spawn(e.into_io())),
            }
        }
        Ok(runtime)
    }
}

/// A running set of pinned workers, one per hardware context, applying the AMP/SMP rules.
///
/// ```no_run
/// use corehop_policy::smt::Mode;
/// use corehop_runtime::smt::{SmtRuntime, Step};
/// use corehop_topology::{CoreClass, Cpu, CpuId, Machine, OsCpu};
///
/// // Kernel CPUs 0 and 1 declared SMT siblings of one core (real ones, or emulated).
/// let cpu = |i: usize| Cpu {
///     id: CpuId(i), os_id: OsCpu(i), core: 0, package: 0,
///     class: CoreClass::Uniform, speed: 1.0, emulated_speed: None,
/// };
/// let machine = Machine {
///     name: "one SMT core".into(), source: "example".into(),
///     cpus: vec![cpu(0), cpu(1)], caches: vec![], waitpkg: false,
/// };
/// let rt = SmtRuntime::builder().machine(machine).mode(Mode::Amp).build()?;
/// let mut left = 100;
/// rt.spawn(None, move |_cx| { left -= 1; if left == 0 { Step::Done } else { Step::Continue } });
/// rt.submit_service(corehop_topology::CpuId(0), || { /* runs on the reserved sibling */ });
/// rt.set_mode(Mode::Smp)?;
/// rt.wait_idle();
/// # Ok::<(), corehop_runtime::smt::SmtError>(())
/// ```
pub struct SmtRuntime {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl SmtRuntime {
    /// A builder in SMP mode with pinning on; it needs a machine ([`SmtBuilder::machine`]).
    pub fn builder() -> SmtBuilder {
        SmtBuilder { machine: None, mode: Mode::Smp, pin: true }
    }

    /// The sibling groups and placement rules in force.
    pub fn layout(&self) -> &SmtLayout {
        &self.shared.layout
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.shared.mode()
    }

    /// Switches mode. Queued tasks stay queued (none is lost or run twice); when switching to
    /// AMP this returns once no reserved context is still inside an application step, which
    /// takes at most one step's time.
    pub fn set_mode(&self, mode: Mode) -> Result<(), SmtError> {
        if IN_WORKER.with(Cell::get) {
            return Err(SmtError::FromWorker);
        }
        self.shared.layout.check(mode)?;
        self.shared.mode.store(if mode == Mode::Amp { 0 } else { 1 }, SeqCst);
        self.shared.contexts.iter().for_each(Context::ring);
        if mode == Mode::Amp {
            for ctx in self.shared.contexts.iter().filter(|c| c.reserved) {
                while ContextState::from_u8(ctx.state.load(SeqCst)) == ContextState::RunningApp
                    && self.shared.mode() == Mode::Amp
                {
                    std::thread::yield_now();
                }
            }
        }
        Ok(())
    }

    /// Queues an application task; `home` restricts it to one mode's phases (the hybrid's
    /// per-mode queues), `None` runs it in either mode. The task is run one step at a time on
    /// the contexts that may run applications in the current mode.
    pub fn spawn(&self, home: Option<Mode>, task: impl FnMut(StepCx) -> Step + Send + 'static) {
        let shared = &self.shared;
        let seq = shared.next_seq.fetch_add(1, SeqCst);
        let mode = home.unwrap_or_else(|| shared.mode());
        // Any application CPU of `mode` picks the core; SMP allows every CPU, so this exists.
        let cpu = shared.layout.place_app(mode, seq).or_else(|| shared.layout.place_app(Mode::Smp, seq));
        let group = cpu.map_or(0, |c| shared.group_of(c));
        *lock(&shared.outstanding) += 1;
        lock(&shared.cores[group].app[queue_index(home)]).push_back(Box::new(task));
        shared.ring_group(group, Work::App);
    }

    /// Queues service work raised by code on `origin` (an offloaded call's completion, a
    /// component's step, a bottom half); it runs where the layout places service work in the
    /// current mode: the reserved sibling in AMP.
    pub fn submit_service(&self, origin: CpuId, work: impl FnOnce() + Send + 'static) {
        let shared = &self.shared;
        let mode = shared.mode();
        let target = shared.layout.place_service(origin, mode).unwrap_or(origin);
        let group = shared.group_of(target);
        *lock(&shared.outstanding) += 1;
        lock(&shared.cores[group].service).push_back(Box::new(work));
        shared.ring_group(group, Work::Service);
    }

    /// Runs `call` as service work for code on `origin` and waits for its result (an offloaded
    /// call). Where the layout would place it on `origin` itself (SMP mode) it runs inline,
    /// so a task calling this never waits for its own context.
    pub fn offload<R: Send + 'static>(&self, origin: CpuId, call: impl FnOnce() -> R + Send + 'static) -> R {
        let mode = self.shared.mode();
        match self.shared.layout.place_service(origin, mode) {
            Some(target) if target != origin => {}
            _ => return call(),
        }
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.submit_service(origin, move || {
            let _ = tx.send(call());
        });
        rx.recv().expect("service work runs to completion before the runtime shuts down")
    }

    /// Blocks until every task and service item submitted so far has finished.
    pub fn wait_idle(&self) {
        let mut n = lock(&self.shared.outstanding);
        while *n > 0 {
            n = self.shared.idle.wait(n).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// What the context `cpu` is doing now (`None` for a CPU not in the machine).
    pub fn context_state(&self, cpu: CpuId) -> Option<ContextState> {
        self.shared
            .contexts
            .iter()
            .find(|c| c.cpu == cpu)
            .map(|c| ContextState::from_u8(c.state.load(SeqCst)))
    }

    /// Counters per context, in CPU order.
    pub fn stats(&self) -> Vec<ContextStats> {
        self.shared
            .contexts
            .iter()
            .map(|c| ContextStats {
                cpu: c.cpu,
                tid: c.tid.load(SeqCst) as i32,
                reserved: c.reserved,
                app_steps: c.app_steps.load(SeqCst),
                service_runs: c.service_runs.load(SeqCst),
                sleeps: c.sleeps.load(SeqCst),
                panics: c.panics.load(SeqCst),
            })
            .collect()
    }
}

impl Drop for SmtRuntime {
    /// Stops the workers; queued work that has not started is dropped. Dropped on a worker
    /// (a task held the last handle), it stops them without joining its own thread.
    fn drop(&mut self) {
        self.shared.contexts.iter().for_each(|c| c.mailbox.push(Letter::new(Stop)));
        let me = std::thread::current().id();
        for w in self.workers.drain(..) {
            if w.thread().id() != me {
                let _ = w.join();
            }
        }
    }
}

/// The loop of the worker pinned to context `index`.
fn worker(shared: &Shared, index: usize, orders: &mut Reader<Letter<Stop>>) {
    IN_WORKER.with(|w| w.set(true));
    let me = &shared.contexts[index];
    me.tid.store(sys::gettid() as u32, SeqCst);
    let core = &shared.cores[me.group];
    while !orders.has_mail() {
        if run_service(shared, me, core) || run_app_step(shared, me, core) {
            continue;
        }
        // Nothing allowed: sleep until rung (at once if rung since the last park).
        me.set_state(ContextState::Sleeping);
        if orders.park() {
            me.sleeps.fetch_add(1, SeqCst);
        }
        me.set_state(ContextState::Looking);
    }
    me.set_state(ContextState::Stopped);
}

fn run_service(shared: &Shared, me: &Context, core: &CoreQueues) -> bool {
    if !shared.layout.allowed(me.cpu, Work::Service, shared.mode()) {
        return false;
    }
    let Some(item) = lock(&core.service).pop_front() else { return false };
    me.set_state(ContextState::RunningService);
    if catch_unwind(AssertUnwindSafe(item)).is_err() {
        me.panics.fetch_add(1, SeqCst);
    }
    me.service_runs.fetch_add(1, SeqCst);
    me.set_state(ContextState::Looking);
    shared.finish_one();
    true
}

fn run_app_step(shared: &Shared, me: &Context, core: &CoreQueues) -> bool {
    if !shared.layout.allowed(me.cpu, Work::App, shared.mode()) {
        return false;
    }
    // Announce first, read the mode again second: `set_mode(Amp)` either sees this
    // announcement (and waits for the step) or this worker sees AMP (and backs off).
    me.set_state(ContextState::RunningApp);
    let mode = shared.mode();
    if !shared.layout.allowed(me.cpu, Work::App, mode) {
        me.set_state(ContextState::Looking);
        return false;
    }
    let taken = [Some(mode), None].into_iter().find_map(|home| {
        let q = queue_index(home);
        lock(&core.app[q]).pop_front().map(|t| (q, t))
    });
    let Some((queue, mut task)) = taken else {
        me.set_state(ContextState::Looking);
        return false;
    };
    let cx = StepCx { cpu: me.cpu, mode };
    let step = catch_unwind(AssertUnwindSafe(|| task(cx)));
    me.app_steps.fetch_add(1, SeqCst);
    me.set_state(ContextState::Looking);
    match step {
        Ok(Step::Continue) => {
            lock(&core.app[queue]).push_back(task);
            // A sibling that may run applications may be asleep with nothing else to run.
            shared.ring_group(me.group, Work::App);
        }
        // Drop the task before reporting it finished: it may hold the last handle to the
        // runtime, whose drop must not run after a waiter has moved on.
        Ok(Step::Done) => {
            drop(task);
            shared.finish_one();
        }
        Err(_) => {
            drop(task);
            me.panics.fetch_add(1, SeqCst);
            shared.finish_one();
        }
    }
    true
}
