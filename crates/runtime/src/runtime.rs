//! The runtime: its builder, its pinned workers and the life of a task.
//!
//! # Start-up
//! [`Builder::build`] checks the chosen CPUs against the machine, starts one worker thread per
//! CPU and waits until each has pinned itself (a CPU the process may not use fails here, with
//! [`Error::CpuNotAllowed`]).
//!
//! # A task's life
//! ```text
//! spawn_on(cpu, f) ──push──► mailbox of cpu ──pop──► worker resumes the fiber
//!                                  ▲                        │ hop(other): fiber suspends,
//!                                  └──── push to other ◄────┘ worker pushes it on
//!                                                           │ f returns: result to the
//!                                                           ▼ JoinHandle, stack to the pool
//! ```
//! Under [`Mechanism::Affinity`] a hop never leaves the worker thread: the thread re-pins
//! itself to the target CPU (V1), and the worker goes back home once the task finishes.
//!
//! # Idle workers
//! [`Wake::Spin`] polls the mailbox (V4), [`Wake::Park`] sleeps on a futex at once,
//! [`Wake::SpinThenPark`] polls for a budget from `corehop_policy::spin` fitted to the recent
//! idle gaps and wake-up costs, then sleeps.
//!
//! # Shutdown
//! [`Runtime::shutdown`] (also run on drop) has a defined outcome for every task:
//! - tasks that have not started yet are **cancelled**: their closure never runs and the
//!   joiner gets [`JoinError::Cancelled`];
//! - tasks already running **finish**: their hops are refused from then on (`hop` returns
//!   [`Error::ShutDown`] and the task stays where it is), except the way back of an `on()`
//!   already under way, so that `on` either did not run its closure or returns its value;
//! - new `spawn_on` calls fail with [`Error::ShutDown`];
//! - `shutdown` returns when every task has finished and every worker has exited.

use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering as StdOrdering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;

use corehop_policy::pick::Candidate;
use corehop_policy::spin::{SpinBudget, SpinConfig};
use corehop_topology::{CpuId, Machine, OsCpu};
use corosensei::stack::{DefaultStack, Stack};
use crossbeam_queue::ArrayQueue;
use crossbeam_utils::CachePadded;

use crate::context::{self, TaskCtx};
use crate::error::{Error, JoinError};
use crate::fiber::{self, Fiber, Resume, Step, Suspend, Suspender, SENDS_ITSELF};
use crate::mailbox::{Hint, LaneWriter, Linked, Mail, Mailbox, Payload, Reader, Taken, PAYLOAD_WORDS};
use crate::overflow::{self, Guard};
use crate::submit::Inbox;
use crate::sync::AtomicPtr;
use crate::sys;
use crate::worker::{self, StartError, Started};

/// How a hop moves a task to another CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mechanism {
    /// V1: the OS thread running the task moves itself with `sched_setaffinity`; the kernel
    /// migrates it. The fiber never changes threads. Slow (a migration per hop) but simple.
    Affinity,
    /// V2/V3: the suspended fiber is handed to the target CPU's worker through its mailbox.
    #[default]
    Handoff,
}

/// What an idle worker does while its mailbox is empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Wake {
    /// V4: poll the mailbox; fastest hand-off, burns the CPU while idle.
    Spin,
    /// Sleep on a futex at once; every hand-off to an idle worker pays a wake-up.
    Park,
    /// Poll for an adaptive budget (about what a wake-up costs, fitted to recent idle gaps),
    /// then sleep.
    #[default]
    SpinThenPark,
}

/// The smallest task stack [`Builder::stack_size`] accepts: room for a task's start and a few
/// small frames. Real tasks want more: printing a panic with a backtrace alone can take tens
/// of KiB.
pub const MIN_STACK_SIZE: usize = 16 * 1024;

/// The largest task stack [`Builder::stack_size`] accepts (1 GiB of address space a task,
/// committed only as it is used).
pub const MAX_STACK_SIZE: usize = 1 << 30;

/// Task stack size unless [`Builder::stack_size`] says otherwise (lazily committed memory).
pub const DEFAULT_STACK_SIZE: usize = 256 * 1024;
/// Finished tasks' stacks kept for reuse, so spawning does not mmap every time.
const STACK_POOL_SIZE: usize = 64;

/// Configures and starts a [`Runtime`].
#[derive(Debug, Clone)]
pub struct Builder {
    machine: Option<Machine>,
    cpus: Option<Vec<CpuId>>,
    mechanism: Mechanism,
    wake: Wake,
    stack_size: usize,
    spin: SpinConfig,
}

impl Builder {
    /// The machine whose CPUs the runtime uses. Default: the discovered host.
    pub fn machine(mut self, machine: Machine) -> Self {
        self.machine = Some(machine);
        self
    }

    /// The CPUs (dense ids of the machine) to run a worker on. Default: all of them.
    pub fn cpus(mut self, cpus: impl IntoIterator<Item = CpuId>) -> Self {
        self.cpus = Some(cpus.into_iter().collect());
        self
    }

    /// How hops move tasks. Default: [`Mechanism::Handoff`].
    pub fn mechanism(mut self, mechanism: Mechanism) -> Self {
        self.mechanism = mechanism;
        self
    }

    /// What idle workers do. Default: [`Wake::SpinThenPark`].
    pub fn wake(mut self, wake: Wake) -> Self {
        self.wake = wake;
        self
    }

    /// Bytes of stack per task (plus a guard page). Default: [`DEFAULT_STACK_SIZE`]; at least
    /// [`MIN_STACK_SIZE`] and at most [`MAX_STACK_SIZE`], or `build` fails with
    /// [`Error::StackTooSmall`] or [`Error::StackTooLarge`].
    pub fn stack_size(mut self, bytes: usize) -> Self {
        self.stack_size = bytes;
        self
    }

    /// Tuning of the spin budget of [`Wake::SpinThenPark`].
    pub fn spin_config(mut self, config: SpinConfig) -> Self {
        self.spin = config;
        self
    }

    /// Checks the configuration and starts the workers.
    pub fn build(self) -> Result<Runtime, Error> {
        if self.stack_size < MIN_STACK_SIZE {
            return Err(Error::StackTooSmall { size: self.stack_size, min: MIN_STACK_SIZE });
        }
        if self.stack_size > MAX_STACK_SIZE {
            return Err(Error::StackTooLarge { size: self.stack_size, max: MAX_STACK_SIZE });
        }
        overflow::install();
        let machine = match self.machine {
            Some(m) => m,
            None => default_machine()?,
        };
        let cpus = self.cpus.unwrap_or_else(|| machine.cpus().iter().map(|c| c.id).collect());
        if cpus.is_empty() {
            return Err(Error::NoCpus);
        }
        let mut index = vec![None; machine.cpus().len()];
        let mut workers = Vec::with_capacity(cpus.len());
        let mut readers = Vec::with_capacity(cpus.len());
        for &cpu in &cpus {
            let Some(info) = machine.cpu(cpu) else {
                return Err(Error::UnknownCpu {
                    cpu,
                    available: machine.cpus().iter().map(|c| c.id).collect(),
                });
            };
            if index[cpu.0].replace(workers.len()).is_some() {
                return Err(Error::DuplicateCpu { cpu });
            }
            let (mailbox, reader) = Mailbox::new(self.wake != Wake::Spin, cpus.len(), Some(workers.len()));
            workers.push(WorkerSlot {
                cpu,
                os_id: info.os_id,
                mailbox,
                inbox: Inbox::new(),
                running: CachePadded::new(AtomicBool::new(false)),
            });
            readers.push(reader);
        }
        let cpus_len = cpus.len();
        let shared = Arc::new(Shared {
            machine,
            cpus,
            index,
            workers,
            mechanism: self.mechanism,
            wake: self.wake,
            stack_size: self.stack_size,
            spin: self.spin,
            stacks: ArrayQueue::new(STACK_POOL_SIZE),
            live: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
        });
        let runtime = Runtime { shared: shared.clone(), threads: Mutex::new(Vec::new()) };
        // SAFETY: once for these mailboxes, made just above.
        let lanes = unsafe { LaneWriter::all(cpus_len) };
        for (i, (reader, lane)) in readers.into_iter().zip(lanes).enumerate() {
            let shared = shared.clone();
            let (cpu, os_id) = (runtime.shared.workers[i].cpu, runtime.shared.workers[i].os_id);
            let started = worker::start_pinned(format!("corehop-{cpu}"), Some(os_id), move |started| {
                worker_main(shared, i, reader, lane, started)
            });
            // On an error, dropping `runtime` shuts down the workers already started.
            match started {
                Ok(handle) => runtime.lock_threads().push(handle),
                Err(StartError::Pin(source)) if source.raw_os_error() == Some(libc::EINVAL) => {
                    let allowed = sys::affinity_of(std::process::id() as i32).unwrap_or_default();
                    return Err(Error::CpuNotAllowed { cpu, os_id, allowed });
                }
                Err(StartError::Pin(source)) => return Err(Error::Pin { cpu, os_id, source }),
                Err(e @ (StartError::Spawn(_) | StartError::Died)) => {
                    return Err(Error::Thread { cpu, source: e.into_io() })
                }
            }
        }
        Ok(runtime)
    }
}

/// The host as sysfs describes it, restricted to the CPUs this process may use.
fn default_machine() -> Result<Machine, Error> {
    Ok(corehop_topology::discover()?)
}

/// A running corehop runtime: one pinned worker thread per chosen CPU.
///
/// # Examples
/// ```
/// use corehop_runtime::{current_cpu, hop, Runtime, Wake};
/// let rt = Runtime::builder().wake(Wake::Park).build().unwrap();
/// let (first, last) = (rt.cpus()[0], *rt.cpus().last().unwrap());
/// let seen = rt
///     .block_on(first, move || {
///         let here = current_cpu();
///         // SAFETY: the task holds nothing tied to its first thread (only a `CpuId`).
///         unsafe { hop(last) }.unwrap();
///         (here, current_cpu())
///     })
///     .unwrap();
/// assert_eq!(seen, (first, last));
/// ```
pub struct Runtime {
    shared: Arc<Shared>,
    threads: Mutex<Vec<thread::JoinHandle<()>>>,
}

impl Runtime {
    /// A builder with the defaults (discovered machine, all CPUs, Handoff, SpinThenPark).
    pub fn builder() -> Builder {
        Builder {
            machine: None,
            cpus: None,
            mechanism: Mechanism::default(),
            wake: Wake::default(),
            stack_size: DEFAULT_STACK_SIZE,
            spin: SpinConfig::default(),
        }
    }

    /// The machine the runtime's CPU ids refer to.
    pub fn machine(&self) -> &Machine {
        &self.shared.machine
    }

    /// The CPUs with a worker, in the order given to the builder.
    pub fn cpus(&self) -> &[CpuId] {
        &self.shared.cpus
    }

    /// How a hop moves a task between CPUs in this runtime.
    pub fn mechanism(&self) -> Mechanism {
        self.shared.mechanism
    }

    /// How an idle worker waits for work in this runtime.
    pub fn wake(&self) -> Wake {
        self.shared.wake
    }

    /// Starts `f` as a task on `cpu`'s worker.
    pub fn spawn_on<F, T>(&self, cpu: CpuId, f: F) -> Result<JoinHandle<T>, Error>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.shared.spawn_on(cpu, f)
    }

    /// Runs `f` as a task on `cpu` and waits for its value, from a thread that is not one of
    /// this runtime's workers. A panic in `f` resumes in the caller; a task cancelled by
    /// shutdown gives [`Error::ShutDown`].
    pub fn block_on<F, T>(&self, cpu: CpuId, f: F) -> Result<T, Error>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        if context::is_worker_of(&self.shared) {
            return Err(Error::BlockingInTask);
        }
        match self.spawn_on(cpu, f)?.join() {
            Ok(v) => Ok(v),
            Err(JoinError::Panicked { payload, .. }) => resume_unwind(payload),
            Err(JoinError::Cancelled) => Err(Error::ShutDown),
        }
    }

    /// Runs `f` on `cpu` and returns its value: inside a task of this runtime by hopping there
    /// and back ([`crate::on`]); from any other thread as [`Runtime::block_on`].
    pub fn on<F, T>(&self, cpu: CpuId, f: F) -> Result<T, Error>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        match context::task() {
            Some(ctx) if ptr::eq(&*ctx.shared, &*self.shared) => crate::on(cpu, f),
            _ => self.block_on(cpu, f),
        }
    }

    /// What `corehop_policy::pick` needs to know about `cpus`: work queued or running on
    /// each and whether it is idle. The calling task does not count against its own CPU.
    pub fn candidates(&self, cpus: &[CpuId]) -> Result<Vec<Candidate>, Error> {
        self.shared.candidates(cpus)
    }

    /// Whether shutdown has begun.
    pub fn is_shut_down(&self) -> bool {
        self.shared.shutdown.load(StdOrdering::SeqCst)
    }

    /// Shuts the runtime down with the outcome described in the module docs, and waits for
    /// the workers to exit. Idempotent. Called from inside one of its own tasks it only
    /// begins the shutdown (a worker cannot wait for itself); dropping the runtime waits.
    pub fn shutdown(&self) {
        self.shared.shutdown.store(true, StdOrdering::SeqCst);
        self.shared.wake_all();
        if context::is_worker_of(&self.shared) {
            return;
        }
        for handle in self.lock_threads().drain(..) {
            // A worker never panics (task panics are caught in the fiber); if one did, the
            // panic has been reported and there is nothing left to clean up.
            let _ = handle.join();
        }
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    fn lock_threads(&self) -> std::sync::MutexGuard<'_, Vec<thread::JoinHandle<()>>> {
        self.threads.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("cpus", &self.shared.cpus)
            .field("mechanism", &self.shared.mechanism)
            .field("wake", &self.shared.wake)
            .finish()
    }
}

/// The one owner of a task's result; dropping it detaches the task (it still runs).
pub struct JoinHandle<T> {
    slot: Arc<JoinSlot<T>>,
    cpu: CpuId,
}

struct JoinSlot<T> {
    result: Mutex<Option<Result<T, JoinError>>>,
    done: Condvar,
}

impl<T> JoinSlot<T> {
    fn finish(&self, result: Result<T, JoinError>) {
        *self.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(result);
        self.done.notify_all();
    }
}

impl<T> JoinHandle<T> {
    /// Blocks the calling OS thread until the task finished; its value, or why there is none.
    /// (Called inside a task this blocks that task's worker too.)
    pub fn join(self) -> Result<T, JoinError> {
        let mut result = self.slot.result.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(r) = result.take() {
                return r;
            }
            result = self.slot.done.wait(result).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Whether the task has finished (a `join` would not block).
    pub fn is_finished(&self) -> bool {
        self.slot.result.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// The CPU the task was spawned on.
    pub fn cpu(&self) -> CpuId {
        self.cpu
    }
}

impl<T> std::fmt::Debug for JoinHandle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinHandle").field("cpu", &self.cpu).field("finished", &self.is_finished()).finish()
    }
}

/// A task as it travels between mailboxes. Line aligned, so that no other heap block shares
/// its line: a hop only reads it (with our x86-64 switch), so both CPUs keep a copy, unless
/// a neighbour's writes took it away.
#[repr(align(64))]
pub(crate) struct Task {
    link: AtomicPtr<Task>,
    fiber: Fiber,
    /// The task's context, at the bottom of its stack, once it has started: the worker that
    /// resumes it installs it as the thread's current task.
    ctx: Cell<usize>,
}

// SAFETY: `link` is always the same field and only the mailbox uses it.
unsafe impl Linked for Task {
    fn link(&self) -> &AtomicPtr<Self> {
        &self.link
    }

    /// The top of the task's stack (the payload's first word: a context's stack pointer, or
    /// the stack hint a worker sends), and its base.
    fn hint(task: &Task, payload: &Payload) -> Hint {
        Hint([payload[0].load(StdOrdering::Relaxed), task.fiber.base()])
    }

    /// The lines a hop's target touches, fetched together rather than one miss after another.
    /// For writing, the lines a hop writes on both CPUs: the stack from just below where the
    /// task suspended (room for the calls it makes next) through the frame around the hop,
    /// and with corosensei's switch the base line, where it links each resume to its worker
    /// (ours keeps nothing there that a hop writes). For reading, the task itself, which a hop
    /// only reads: taking it for writing would move it away from the CPU that still holds a
    /// shared copy.
    ///
    /// Nothing else: a hop writes no other line of the task (its context lives at the bottom
    /// of the stack, read only; where it runs is a thread-local), and every line fetched for
    /// writing is one the other CPU must give up. The frames further up are left where they
    /// are: a task that hops to do some work and hops back (delegation, an offloaded system
    /// call) calls down from the hop's frame and returns up through its callers only on the
    /// way back. How many lines pay is measured in docs/performance.md ("stack prefetch").
    fn prefetch(task: *const Task, hint: Hint) {
        // Line aligned, so its lines start at its address.
        for line in 0..size_of::<Task>().div_ceil(LINE) {
            sys::prefetch_for_read(task as usize + line * LINE);
        }
        let [stack, base] = hint.0;
        if stack != 0 && base > stack {
            let first = (stack & !(LINE - 1)) - STACK_LINES_BELOW * LINE;
            let last = (first + STACK_LINES * LINE).min(base);
            sys::prefetch_lines_for_write(first, (last - first).div_ceil(LINE));
            #[cfg(not(corehop_own_switch))]
            if last < base {
                sys::prefetch_for_write(base - 16);
            }
        }
    }
}

const LINE: usize = 64;
/// The stack a hop's target prefetches: `STACK_LINES` lines from `STACK_LINES_BELOW` below
/// the line where the task suspended, i.e. that line, the one above and two below.
const STACK_LINES_BELOW: usize = 2;
const STACK_LINES: usize = 4;

pub(crate) struct WorkerSlot {
    pub(crate) cpu: CpuId,
    pub(crate) os_id: OsCpu,
    pub(crate) mailbox: Arc<Mailbox<Task>>,
    /// Operations delegated to this worker with `submit`, served between tasks.
    pub(crate) inbox: Inbox,
    /// Whether the worker is running a task now (written only by the worker, on its own line).
    running: CachePadded<AtomicBool>,
}

/// What the workers, the tasks and the `Runtime` handle share.
pub(crate) struct Shared {
    machine: Machine,
    cpus: Vec<CpuId>,
    /// Machine CPU id -> worker index.
    index: Vec<Option<usize>>,
    pub(crate) workers: Vec<WorkerSlot>,
    pub(crate) mechanism: Mechanism,
    wake: Wake,
    stack_size: usize,
    spin: SpinConfig,
    stacks: ArrayQueue<DefaultStack>,
    /// Tasks spawned and not finished.
    live: AtomicUsize,
    pub(crate) shutdown: AtomicBool,
}

impl Shared {
    /// The worker index of `cpu`, or the error naming the CPUs there are.
    pub(crate) fn worker_of(&self, cpu: CpuId) -> Result<usize, Error> {
        self.worker_index(cpu).ok_or_else(|| Error::UnknownCpu { cpu, available: self.cpus.clone() })
    }

    /// The worker index of `cpu`, if it has a worker.
    #[inline]
    pub(crate) fn worker_index(&self, cpu: CpuId) -> Option<usize> {
        self.index.get(cpu.0).copied().flatten()
    }

    /// The CPU of worker `worker`.
    pub(crate) fn cpu_of(&self, worker: usize) -> CpuId {
        self.workers[worker].cpu
    }

    /// Running-or-queued work per CPU: 0, 1 or 2 (a task running, something queued). The
    /// calling task does not count against its own CPU.
    pub(crate) fn candidates(&self, cpus: &[CpuId]) -> Result<Vec<Candidate>, Error> {
        let here = context::task().and(context::here());
        cpus.iter()
            .map(|&cpu| {
                let worker = &self.workers[self.worker_of(cpu)?];
                let running = worker.running.load(StdOrdering::Relaxed) && here != Some(cpu);
                let queue_len = usize::from(running) + usize::from(worker.mailbox.has_mail());
                Ok(Candidate { cpu, queue_len, idle: queue_len == 0 })
            })
            .collect()
    }

    pub(crate) fn spawn_on<F, T>(self: &Arc<Self>, cpu: CpuId, f: F) -> Result<JoinHandle<T>, Error>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let worker = self.worker_of(cpu)?;
        // Count the task before looking at the flag (and shutdown sets the flag before
        // looking at the count), so workers never exit while a spawn is getting through.
        self.live.fetch_add(1, StdOrdering::SeqCst);
        if self.shutdown.load(StdOrdering::SeqCst) {
            self.task_finished();
            return Err(Error::ShutDown);
        }
        let stack = match self.stacks.pop() {
            Some(stack) => stack,
            None => match DefaultStack::new(self.stack_size) {
                Ok(stack) => stack,
                Err(source) => {
                    self.task_finished();
                    return Err(Error::Stack { size: self.stack_size, source });
                }
            },
        };
        let slot = Arc::new(JoinSlot { result: Mutex::new(None), done: Condvar::new() });
        let (task_slot, shared) = (slot.clone(), self.clone());
        let guard = Guard::of(stack.limit().get(), stack.base().get());
        // The task's address first: its body hands it to mailboxes on every hop.
        let task = Box::<Task>::new_uninit();
        let node = task.as_ptr() as usize;
        let body = move |suspender: &Suspender, input: Resume| {
            if input == Resume::Cancel {
                task_slot.finish(Err(JoinError::Cancelled));
                return;
            }
            let ctx = TaskCtx {
                suspender: *suspender,
                shared,
                no_hop: Cell::new(0),
                until_sample: Cell::new(0),
                guard,
                node,
            };
            context::set_task(&ctx);
            // SAFETY: `node` is this task, alive while it runs; its worker holds it by a raw
            // pointer meanwhile, so this shared reference aliases no unique one.
            unsafe { (*(node as *const Task)).ctx.set(&raw const ctx as usize) };
            let result = catch_unwind(AssertUnwindSafe(f)).map_err(JoinError::from_panic);
            task_slot.finish(result);
        };
        let task = Box::write(
            task,
            Task { link: AtomicPtr::new(ptr::null_mut()), fiber: Fiber::new(stack, body), ctx: Cell::new(0) },
        );
        self.workers[worker].mailbox.push(task);
        Ok(JoinHandle { slot, cpu })
    }

    fn task_finished(&self) {
        if self.live.fetch_sub(1, StdOrdering::SeqCst) == 1 && self.shutdown.load(StdOrdering::SeqCst) {
            self.wake_all();
        }
    }

    fn finished(&self) -> bool {
        self.shutdown.load(StdOrdering::SeqCst) && self.live.load(StdOrdering::SeqCst) == 0
    }

    fn wake_all(&self) {
        self.workers.iter().for_each(|w| w.mailbox.unpark());
    }
}

fn worker_main(
    shared: Arc<Shared>,
    index: usize,
    mut reader: Reader<Task>,
    lane: LaneWriter,
    started: Started,
) {
    let slot = &shared.workers[index];
    let parent = fiber::parent_cell();
    // SAFETY (for the senders' use by tasks): the worker is switched out while a task that
    // sends on one of its lanes runs, and it sends on none of them then.
    let senders: Vec<_> = shared.workers.iter().map(|w| unsafe { w.mailbox.sender(&lane) }).collect();
    // SAFETY: `senders` lives until `leave_worker` below, and the worker uses its lanes only
    // between tasks.
    unsafe { context::enter_worker(&shared, slot.cpu, index, parent, &senders) };
    started.report();
    let mut idle = Idle { budget: SpinBudget::new(shared.spin), caught_gap: None };
    let inbox = &slot.inbox;
    loop {
        inbox.serve();
        while let Some(taken) = reader.pop() {
            run_slice(&shared, index, &lane, parent, taken);
            if inbox.has_requests() {
                inbox.serve();
            }
        }
        if inbox.has_requests() {
            continue;
        }
        if shared.finished() {
            break;
        }
        // What a spinning wait found is taken at once, without `pop`'s search: on a hop's path.
        if let Some(taken) = idle.wait(&shared, &mut reader, inbox).and_then(|mail| reader.take(mail)) {
            run_slice(&shared, index, &lane, parent, taken);
        }
    }
    // Requests that come from now on are cancelled: no task is left to send any, and a thread
    // that does learns that the runtime has shut down.
    inbox.close();
    context::leave_worker();
}

/// Runs the task taken until it hops away or finishes, then passes it on. Inlined into the
/// worker's loop, which then goes on where the task left it without a `ret`: the return
/// predictor holds the task's return addresses at that point, and would get it wrong.
#[inline(always)]
fn run_slice(shared: &Shared, index: usize, lane: &LaneWriter, parent: *mut usize, taken: Taken<'_, Task>) {
    let slot = &shared.workers[index];
    let Taken { node: task, payload } = taken;
    let input = if !task.fiber.started() && shared.shutdown.load(StdOrdering::SeqCst) {
        Resume::Cancel
    } else {
        Resume::Run
    };
    slot.running.store(true, StdOrdering::Relaxed);
    // Fibers that send themselves arrive on lanes only, each with its context as payload.
    let from = payload.filter(|_| SENDS_ITSELF);
    let task = Box::into_raw(task);
    // SAFETY: the task is ours (taken from our mailbox) until it sends itself, and `from` is
    // how it last suspended; after `Sent` we do not touch it. (One that has not started yet
    // installs its context itself.)
    let step = unsafe {
        context::install_task((*task).ctx.get() as *const TaskCtx);
        Fiber::resume(&raw mut (*task).fiber, input, from, parent)
    };
    // Pass the task on first (the hop's latency), then tidy up.
    match step {
        // The task is the target's now.
        Step::Suspended(Suspend::Sent { worker }) => shared.workers[worker].mailbox.sent(lane),
        Step::Suspended(Suspend::Hop { worker, stack }) => {
            // SAFETY: it suspended without sending itself, so it is still ours.
            let task = unsafe { Box::from_raw(task) };
            let mailbox = &shared.workers[worker].mailbox;
            if SENDS_ITSELF {
                // Its lane was full. A lane's payload is a context to those readers: the
                // list it is.
                mailbox.push(task);
            } else {
                let mut payload = [0; PAYLOAD_WORDS];
                payload[0] = stack;
                mailbox.send(lane, task, payload);
            }
        }
        Step::Finished => {
            // SAFETY: a finished fiber is still ours.
            let task = unsafe { Box::from_raw(task) };
            if let Some(stack) = task.fiber.into_stack() {
                // A full pool just frees the stack.
                let _ = shared.stacks.push(stack);
            }
            shared.task_finished();
        }
    }
    context::install_task(ptr::null());
    slot.running.store(false, StdOrdering::Relaxed);
    if shared.mechanism == Mechanism::Affinity
        && context::here() != Some(slot.cpu)
        && sys::pin_current_thread(slot.os_id).is_ok()
    {
        // Back home after an Affinity hop. (Should re-pinning fail, `here` keeps saying where
        // the thread really is.)
        context::set_here(slot.cpu, index);
    }
}

/// An idle worker's waiting strategy and, for SpinThenPark, its budget.
struct Idle {
    budget: SpinBudget,
    /// A gap caught while spinning, recorded at the next idle period: even recording must
    /// not delay the task that just arrived.
    caught_gap: Option<u64>,
}

/// Polls between clock reads while spinning (a TSC read costs about as much as 8 polls).
const POLLS_PER_CLOCK_READ: u32 = 8;

impl Idle {
    /// Waits for mail; returns where a spinning wait found it (after a park: `None`, and the
    /// caller pops).
    /// Returns `None` too as soon as `inbox` has requests.
    fn wait(&mut self, shared: &Shared, reader: &mut Reader<Task>, inbox: &Inbox) -> Option<Mail> {
        match shared.wake {
            Wake::Spin => loop {
                if let Some(mail) = reader.poll() {
                    return Some(mail);
                }
                if shared.finished() || inbox.has_requests() {
                    return None;
                }
                sys::cpu_relax();
            },
            Wake::Park => {
                reader.park();
                None
            }
            Wake::SpinThenPark => self.spin_then_park(shared, reader, inbox),
        }
    }

    fn spin_then_park(&mut self, shared: &Shared, reader: &mut Reader<Task>, inbox: &Inbox) -> Option<Mail> {
        if let Some(gap) = self.caught_gap.take() {
            self.budget.record_idle_gap(gap);
        }
        let start = sys::now_ns();
        let mut budget = self.budget.budget_ns();
        let (mut polls, mut spun) = (0u32, 0);
        loop {
            if let Some(mail) = reader.poll() {
                // The gap as of the last clock read (short by at most a few polls): reading
                // the clock now would delay the task that just arrived.
                self.caught_gap = Some(spun);
                return Some(mail);
            }
            if shared.finished() || inbox.has_requests() {
                return None;
            }
            polls += 1;
            if polls.is_multiple_of(POLLS_PER_CLOCK_READ) {
                spun = sys::now_ns().saturating_sub(start);
                if spun >= budget {
                    // Out of budget: fit it to what was recorded, and go on if it grew. Only
                    // here, where no work waits for the refit (none came within the budget);
                    // earlier, a task that comes back while it runs would wait for it.
                    self.budget.refit_if_stale();
                    budget = self.budget.budget_ns();
                    if spun >= budget {
                        break;
                    }
                }
            }
            sys::cpu_relax();
        }
        // Sleep until there is mail (a stale notification makes `park` return at once).
        loop {
            reader.park();
            if reader.has_mail() || shared.finished() || inbox.has_requests() {
                break;
            }
        }
        let woke = sys::now_ns();
        let woken_at = reader.mailbox().woken_at_ns();
        // Recorded only: the refit happens when the next spin runs out of budget, not before
        // this work.
        if woken_at >= start {
            self.budget.record_wake_cost(woke.saturating_sub(woken_at));
            self.budget.record_idle_gap(woken_at - start);
        } else if reader.has_mail() {
            self.budget.record_idle_gap(woke.saturating_sub(start));
        }
        None
    }
}

#[cfg(all(test, corehop_own_switch))]
mod tests {
    use super::*;

    /// A task is one line, which a hop only reads (corosensei's task is bigger).
    #[test]
    fn a_task_is_one_line() {
        assert_eq!((size_of::<Task>(), align_of::<Task>()), (LINE, LINE));
    }
}
