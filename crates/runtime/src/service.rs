//! Service cores: CPUs dedicated to OS work, and the per-caller offload path to them.
//!
//! Service cores come in two forms, behind the same [`ServiceCores`] / [`Offloader`] API:
//!
//! - **Service threads** ([`ServiceConfig::build`]): one thread pinned on each service CPU. Work
//!   reaches it as a closure (or a [`SysCall`] value, which is a closure over a raw system
//!   call) left on the caller's stack, whose address travels in a request slot of the thread's
//!   mailbox, whose door is a lane of call slots (`corehop_sys::handoff`: request and
//!   completion one cache line each, the lines prefetched the moment the doorbell names them). The caller waits (spin, then futex) and
//!   continues with the result when it is done, as if it had hopped to the service core and
//!   back. Works from any thread. An idle service thread polls for an adaptive budget
//!   (`corehop_policy::spin`, fitted to the gaps between requests), then sleeps, so a quiet
//!   program does not keep the service CPU busy; [`CoreStats::polled_ns`] says what polling
//!   cost.
//! - **Hops** ([`ServiceConfig::build`] on runtime CPUs): the service CPUs are workers of a
//!   [`crate::Runtime`], and the calling *task* itself moves there with [`crate::on`] and back
//!   (the papers' core switch). Called from outside a task, or when the hop is refused (a
//!   [`crate::no_hop_zone`], shutdown), the work runs locally instead and is counted in
//!   [`CoreStats::fallbacks`].
//!
//! The calling thread's identity never matters to the work: the typed wrappers cover only
//! calls whose meaning does not depend on the calling thread, and the result, including the
//! error number, comes back as a value.
//!
//! [`Offloader`] is one caller's view: it owns an [`OffloadPolicy`] and asks it, per call,
//! whether to run locally or on a service core (chosen with [`corehop_policy::pick`], with the
//! chosen core's expected queue delay passed to the policy). It times every call and feeds the
//! run length back to the policy (the predictor learns), and it turns the application's own
//! progress reports ([`Offloader::progress`]) into the tuner's per-epoch feedback.
//!
//! ```text
//!   app thread ── Offloader::read(fd, buf) ──▶ policy.decide(call, queue delay)
//!        │ Local: raw syscall here, time it          │ Offload: Job ──▶ service thread (CPU s)
//!        └────────── policy.observe(call, cost) ◀────┘       runs, times, signals Done
//! ```
//!
//! Rules: a closure sent to a service core must not depend on thread identity (thread-locals,
//! `gettid`, signal masks) and must not hold a lock taken on the calling thread. Work sent from
//! a service thread runs inline there, so nested offloads cannot deadlock.
//!
//! # Examples
//! ```
//! use corehop_runtime::service::{Offloader, ServiceConfig, ServiceCores};
//! use corehop_policy::offload::OffloadPolicy;
//!
//! let cpu = corehop_runtime::sys::affinity().unwrap()[0];
//! let cores = ServiceConfig::on_cpus([cpu]).build().unwrap();
//! let mut off = Offloader::new(&cores, OffloadPolicy::Always);
//! let mut buf = [0u8; 16];
//! let err = off.read(-1, &mut buf).unwrap_err(); // bad fd, run on the service core
//! assert_eq!(err.0, libc::EBADF);
//! assert_eq!(off.stats().offloaded, 1);
//! ```

use std::cell::Cell;
use std::ffi::CStr;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::RawFd;
use std::panic;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use corehop_policy::offload::{CallCost, CallDesc, CallKind, Decision, OffloadPolicy};
use corehop_policy::pick::{Candidate, Pick, PickState};
use corehop_policy::spin::{SpinBudget, SpinConfig};
use corehop_topology::{CpuId, OsCpu};
use crossbeam_utils::CachePadded;

use crate::mailbox::{Letter, Mailbox, Reader, Stop};
use crate::sys::{self, Errno};
use crate::worker;

mod call;
mod scoped;

pub use call::{SysCall, SysResult};
use scoped::Lane;

/// The longest a caller spins for its result before sleeping on a futex.
pub const DEFAULT_CALLER_SPIN: Duration = Duration::from_micros(50);
/// An idle service thread's first polling budget (its guess of a wake-up's cost) before it has
/// measured the gaps between requests.
pub const DEFAULT_IDLE_SPIN: Duration = Duration::from_micros(50);
/// Weight of the newest run in a service core's mean run length (1/8).
const MEAN_RUN_SHIFT: u32 = 3;

/// What went wrong starting service cores.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The configuration lists no CPU.
    #[error("no service CPUs given")]
    NoCpus,
    /// A CPU appears twice.
    #[error("service core on {cpu} is listed twice")]
    Duplicate {
        /// The CPU listed twice.
        cpu: ServiceCpu,
    },
    /// A CPU outside this process's affinity mask.
    #[error("service CPU {cpu} is not one this process may run on (allowed: {})", OsCpu::list(allowed))]
    CpuNotAllowed {
        /// The CPU asked for.
        cpu: OsCpu,
        /// The CPUs this process may use.
        allowed: Vec<OsCpu>,
    },
    /// The thread could not be started.
    #[error("could not start the service thread for CPU {cpu}: {source}")]
    Start {
        /// The CPU it was to run on.
        cpu: OsCpu,
        /// What the OS said.
        source: io::Error,
    },
}

/// Where a service core serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ServiceCpu {
    /// A service thread pinned on this kernel CPU ([`ServiceConfig::build`]).
    Thread(OsCpu),
    /// A runtime worker the calling task hops to ([`ServiceConfig::build`] on runtime CPUs).
    Hop(CpuId),
}

impl std::fmt::Display for ServiceCpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServiceCpu::Thread(cpu) => write!(f, "kernel CPU {cpu}"),
            ServiceCpu::Hop(cpu) => write!(f, "runtime {cpu}"),
        }
    }
}

/// Which CPUs serve, how work is spread over them, and how waiting is done. `C` is how the
/// CPUs are named: kernel numbers ([`OsCpu`]) for service threads, a runtime's CPUs
/// ([`CpuId`]) for hop cores.
#[derive(Clone, Debug)]
pub struct ServiceConfig<C = OsCpu> {
    /// The service cores' CPUs.
    pub cpus: Vec<C>,
    /// How a caller chooses among several service cores (WC / AF / PA, fast-core-switching §9.2).
    pub pick: Pick,
    /// The longest a caller spins for a result before sleeping; it spins less when its recent
    /// answers came sooner (`corehop_sys::handoff::Waiting`).
    pub caller_spin: Duration,
    /// An idle service thread's first polling budget before it sleeps; the budget then adapts
    /// to the gaps between requests (zero: never poll, sleep at once).
    pub idle_spin: Duration,
}

impl<C> ServiceConfig<C> {
    /// Service cores on `cpus`, work-conserving with affinity, default spin budgets; set the
    /// fields you need, then [`ServiceConfig::build`] (as `Runtime::builder()…build()`).
    pub fn on_cpus(cpus: impl IntoIterator<Item = C>) -> ServiceConfig<C> {
        ServiceConfig {
            cpus: cpus.into_iter().collect(),
            pick: Pick { work_conserving: true, affinity: true, prefer_affinity: false },
            caller_spin: DEFAULT_CALLER_SPIN,
            idle_spin: DEFAULT_IDLE_SPIN,
        }
    }

    /// The first CPU listed twice, if any.
    fn duplicate(&self) -> Option<&C>
    where
        C: PartialEq,
    {
        self.cpus.iter().enumerate().find(|&(i, cpu)| self.cpus[..i].contains(cpu)).map(|(_, cpu)| cpu)
    }
}

impl ServiceConfig<OsCpu> {
    /// Starts one pinned service thread per CPU.
    pub fn build(self) -> Result<ServiceCores, ServiceError> {
        ServiceCores::start(self)
    }
}

impl ServiceConfig<CpuId> {
    /// Service cores that are CPUs of a [`crate::Runtime`]: offloaded work runs by hopping the
    /// calling task there and back ([`crate::on`]). The spin settings do not apply (the
    /// runtime's wake-up settings do).
    pub fn build(self) -> Result<ServiceCores, ServiceError> {
        ServiceCores::on_runtime_cpus(self)
    }
}

/// What one service core has done so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoreStats {
    /// Where the service core serves.
    pub cpu: ServiceCpu,
    /// Calls (or closures) it ran.
    pub jobs: u64,
    /// Sum of the jobs' run times.
    pub busy_ns: u64,
    /// CPU time of the service thread (spinning included), from the kernel's schedstat; None
    /// for hop-based service cores (their CPU is a runtime worker's).
    pub thread_cpu_ns: Option<u64>,
    /// Hop-based cores: work that ran locally because the caller could not hop there.
    pub fallbacks: u64,
    /// Thread cores: time the idle service thread spent polling for work, in ns (the CPU that
    /// polling cost); None for hop-based cores.
    pub polled_ns: Option<u64>,
    /// Thread cores: time callers spent spinning for answers, in ns (the callers' polling
    /// cost); None for hop-based cores.
    pub caller_spun_ns: Option<u64>,
}

/// A core's counters, each on the line of the side that writes it: callers count what they
/// send, the service thread what it ran, so the hand-off moves no counter line.
#[derive(Default)]
struct Load {
    /// Written by callers: jobs sent, and how long callers spun for answers.
    sent: CachePadded<Sent>,
    /// Written by the service thread (hop cores: by the callers).
    done: CachePadded<Done>,
}

#[derive(Default)]
struct Sent {
    jobs: AtomicU64,
    spun_ns: AtomicU64,
}

#[derive(Default)]
struct Done {
    /// Running mean of job run times.
    mean_run_ns: AtomicU64,
    jobs: AtomicU64,
    busy_ns: AtomicU64,
    polled_ns: AtomicU64,
    tid: AtomicI32,
    fallbacks: AtomicU64,
}

impl Load {
    /// Jobs sent and not yet finished.
    fn pending(&self) -> usize {
        let done = self.done.jobs.load(Ordering::Relaxed) + self.done.fallbacks.load(Ordering::Relaxed);
        self.sent.jobs.load(Ordering::Relaxed).saturating_sub(done) as usize
    }

    fn expected_delay_ns(&self) -> u64 {
        self.pending() as u64 * self.done.mean_run_ns.load(Ordering::Relaxed)
    }

    /// A job of `run` ns finished on a hop core (callers may race, which at worst loses one
    /// sample of the running mean).
    fn record(&self, run: u64) {
        let done = &self.done;
        let mean = done.mean_run_ns.load(Ordering::Relaxed);
        let mean = if mean == 0 { run } else { mean - (mean >> MEAN_RUN_SHIFT) + (run >> MEAN_RUN_SHIFT) };
        done.mean_run_ns.store(mean, Ordering::Relaxed);
        done.jobs.fetch_add(1, Ordering::Relaxed);
        done.busy_ns.fetch_add(run, Ordering::Relaxed);
    }
}

struct Core {
    cpu: ServiceCpu,
    /// Thread cores: the service thread's mailbox, whose door is its call slots; its list
    /// takes the order to stop, the one thing it takes besides calls.
    mailbox: Option<Arc<Mailbox<Letter<Stop>, Lane>>>,
    load: Arc<Load>,
    thread: Option<JoinHandle<()>>,
}

thread_local! {
    /// Set on service threads: work sent from one runs inline (no self-deadlock).
    static ON_SERVICE_THREAD: Cell<bool> = const { Cell::new(false) };
    /// This thread's slot in every lane: a caller that keeps its slot keeps its lines warm.
    static SLOT_HINT: usize = NEXT_SLOT_HINT.fetch_add(1, Ordering::Relaxed);
}

static NEXT_SLOT_HINT: AtomicUsize = AtomicUsize::new(0);

/// Not inlined so the flag is read from the thread that asks, every time.
#[inline(never)]
fn on_service_thread() -> bool {
    ON_SERVICE_THREAD.with(Cell::get)
}

/// A set of running service cores. Dropping it stops and joins the service threads.
pub struct ServiceCores {
    cores: Vec<Core>,
    pick: Pick,
    caller_spin: Duration,
    shared_pick: Mutex<PickState>,
}

impl ServiceCores {
    fn start(config: ServiceConfig) -> Result<ServiceCores, ServiceError> {
        if config.cpus.is_empty() {
            return Err(ServiceError::NoCpus);
        }
        if let Some(&cpu) = config.duplicate() {
            return Err(ServiceError::Duplicate { cpu: ServiceCpu::Thread(cpu) });
        }
        let allowed =
            sys::affinity().map_err(|source| ServiceError::Start { cpu: config.cpus[0], source })?;
        if let Some(&cpu) = config.cpus.iter().find(|cpu| !allowed.contains(cpu)) {
            return Err(ServiceError::CpuNotAllowed { cpu, allowed });
        }
        let mut cores = Vec::with_capacity(config.cpus.len());
        for &cpu in &config.cpus {
            cores.push(Core::start(cpu, config.idle_spin)?);
        }
        Ok(ServiceCores::new(cores, &config))
    }

    fn on_runtime_cpus(config: ServiceConfig<CpuId>) -> Result<ServiceCores, ServiceError> {
        if config.cpus.is_empty() {
            return Err(ServiceError::NoCpus);
        }
        if let Some(&cpu) = config.duplicate() {
            return Err(ServiceError::Duplicate { cpu: ServiceCpu::Hop(cpu) });
        }
        let cores = config
            .cpus
            .iter()
            .map(|&cpu| Core { cpu: ServiceCpu::Hop(cpu), mailbox: None, load: Arc::default(), thread: None })
            .collect();
        Ok(ServiceCores::new(cores, &config))
    }

    fn new<C>(cores: Vec<Core>, config: &ServiceConfig<C>) -> ServiceCores {
        let (pick, caller_spin) = (config.pick, config.caller_spin);
        ServiceCores { cores, pick, caller_spin, shared_pick: Mutex::new(PickState::default()) }
    }

    /// The kernel CPUs of the service threads (none for hop cores).
    pub fn os_cpus(&self) -> Vec<OsCpu> {
        self.cores
            .iter()
            .filter_map(|c| if let ServiceCpu::Thread(cpu) = c.cpu { Some(cpu) } else { None })
            .collect()
    }

    /// Where the service cores serve.
    pub fn cpus(&self) -> Vec<ServiceCpu> {
        self.cores.iter().map(|c| c.cpu).collect()
    }

    /// Per-core counters.
    pub fn stats(&self) -> Vec<CoreStats> {
        self.cores
            .iter()
            .map(|c| CoreStats {
                cpu: c.cpu,
                jobs: c.load.done.jobs.load(Ordering::Relaxed),
                busy_ns: c.load.done.busy_ns.load(Ordering::Relaxed),
                thread_cpu_ns: c
                    .thread
                    .as_ref()
                    .and_then(|_| thread_cpu_ns(c.load.done.tid.load(Ordering::Relaxed))),
                fallbacks: c.load.done.fallbacks.load(Ordering::Relaxed),
                polled_ns: c.thread.as_ref().map(|_| c.load.done.polled_ns.load(Ordering::Relaxed)),
                caller_spun_ns: c.thread.as_ref().map(|_| c.load.sent.spun_ns.load(Ordering::Relaxed)),
            })
            .collect()
    }

    /// Runs `f` on a service core (always; no policy) and returns its result. A panic in `f`
    /// is re-raised here.
    pub fn run<'a, R: Send + 'a>(&self, f: impl FnOnce() -> R + Send + 'a) -> R {
        let index = if self.cores.len() == 1 {
            0
        } else {
            let mut state = self.shared_pick.lock().unwrap_or_else(|p| p.into_inner());
            self.pick(&mut state)
        };
        self.run_on(index, f).0
    }

    /// The median round trip of an empty closure to a service core and back, over `samples`
    /// (the hop cost offload must beat: a same-run baseline for benchmarks).
    pub fn round_trip_ns(&self, samples: usize) -> u64 {
        let mut times: Vec<u64> = (0..samples.max(1))
            .map(|_| {
                let t0 = sys::now_ns();
                self.run(|| ());
                sys::now_ns().saturating_sub(t0)
            })
            .collect();
        times.sort_unstable();
        times[times.len() / 2]
    }

    /// The cores as the pick sees them; each is named by its index (`pick` needs only tell
    /// them apart).
    fn candidates(&self) -> Vec<Candidate> {
        self.cores
            .iter()
            .enumerate()
            .map(|(index, c)| match c.load.pending() {
                0 => Candidate::idle(CpuId(index)),
                n => Candidate::busy(CpuId(index), n),
            })
            .collect()
    }

    fn pick(&self, state: &mut PickState) -> usize {
        if self.cores.len() == 1 {
            return 0;
        }
        self.pick.pick(&self.candidates(), state).map_or(0, |index| index.0)
    }

    /// Runs `f` on core `index`; returns its result with the queue wait and run time (ns).
    fn run_on<'a, R: Send + 'a>(&self, index: usize, f: impl FnOnce() -> R + Send + 'a) -> (R, u64, u64) {
        if on_service_thread() {
            let t0 = sys::now_ns();
            let r = f();
            return (r, 0, sys::now_ns().saturating_sub(t0));
        }
        let core = &self.cores[index];
        if let ServiceCpu::Hop(cpu) = core.cpu {
            return Self::hop_and_run(core, cpu, f);
        }
        let lane = core.mailbox.as_ref().expect("a thread core has a mailbox").door();
        core.load.sent.jobs.fetch_add(1, Ordering::Relaxed);
        let spin_ns = self.caller_spin.as_nanos().min(u64::MAX as u128) as u64;
        let (out, completion, spun_ns) = scoped::run_there(lane, SLOT_HINT.with(|h| *h), spin_ns, f);
        core.load.sent.spun_ns.fetch_add(spun_ns, Ordering::Relaxed);
        match out {
            Ok(r) => (r, completion.wait_ns, completion.run_ns),
            Err(payload) => panic::resume_unwind(payload),
        }
    }
}

impl ServiceCores {
    /// Hop cores: the task moves to `cpu`, runs `f`, and comes back. If it cannot hop, `f`
    /// runs here. Returns the result, the hop overhead (as the wait) and the run time.
    fn hop_and_run<R: Send>(core: &Core, cpu: CpuId, f: impl FnOnce() -> R + Send) -> (R, u64, u64) {
        let mut work = Some(f);
        let t0 = sys::now_ns();
        core.load.sent.jobs.fetch_add(1, Ordering::Relaxed);
        let hopped = crate::on(cpu, || {
            let f = work.take().expect("runs once");
            let start = sys::now_ns();
            let r = f();
            (r, sys::now_ns().saturating_sub(start))
        });
        match hopped {
            Ok((r, run)) => {
                core.load.record(run);
                (r, sys::now_ns().saturating_sub(t0).saturating_sub(run), run)
            }
            Err(_) => {
                // `on` did not run the closure, so the work is still here: run it locally.
                core.load.done.fallbacks.fetch_add(1, Ordering::Relaxed);
                let f = work.take().expect("`on` failed before running the closure");
                let start = sys::now_ns();
                let r = f();
                (r, 0, sys::now_ns().saturating_sub(start))
            }
        }
    }
}

impl Drop for ServiceCores {
    fn drop(&mut self) {
        // No caller is left (they borrow `self`): each thread takes the order once woken.
        for core in &self.cores {
            if let Some(mailbox) = &core.mailbox {
                mailbox.push(Letter::new(Stop));
            }
        }
        for core in &mut self.cores {
            if let Some(thread) = core.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

impl Core {
    fn start(cpu: OsCpu, idle_spin: Duration) -> Result<Core, ServiceError> {
        let (mailbox, mut orders) = Mailbox::with_door(Lane::new(), true, 0, None);
        let load = Arc::new(Load::default());
        let thread = {
            let (mailbox, load) = (mailbox.clone(), load.clone());
            worker::start_pinned(format!("corehop-service-{cpu}"), Some(cpu), move |started| {
                ON_SERVICE_THREAD.with(|f| f.set(true));
                load.done.tid.store(sys::gettid(), Ordering::Relaxed);
                started.report();
                Core::serve(mailbox.door(), &mut orders, &load, idle_spin);
            })
            .map_err(|e| ServiceError::Start { cpu, source: e.into_io() })?
        };
        Ok(Core { cpu: ServiceCpu::Thread(cpu), mailbox: Some(mailbox), load, thread: Some(thread) })
    }

    /// The service thread: serves the calls its doorbell names; idle, polls for an adaptive
    /// budget, then sleeps on its mailbox until a caller rings, until the order to stop comes.
    fn serve(lane: &Lane, orders: &mut Reader<Letter<Stop>, Lane>, load: &Load, idle_spin: Duration) {
        let mut idle = IdlePoll::new(idle_spin);
        // Per slot, where the last request's closure lived: a caller in a loop sends the next
        // from the same place on its stack, so it is prefetched the moment the doorbell rings,
        // before the request line naming it has arrived (a wrong guess wastes a prefetch).
        let last_job: [Cell<usize>; corehop_sys::handoff::SLOTS] = Default::default();
        // What ran, counted here and published to `load` with plain stores (this thread is
        // their only writer) before the answer, so a caller that has its answer sees its job
        // counted.
        let (jobs, busy_ns, mean_run_ns) = (Cell::new(0u64), Cell::new(0u64), Cell::new(0u64));
        let publish = || {
            load.done.mean_run_ns.store(mean_run_ns.get(), Ordering::Relaxed);
            load.done.busy_ns.store(busy_ns.get(), Ordering::Relaxed);
            load.done.jobs.store(jobs.get(), Ordering::Relaxed);
        };
        let run = |slot: usize, request: &scoped::Request, idle: &mut IdlePoll| {
            last_job[slot].set(request.job_addr());
            let completion = scoped::execute(request);
            idle.woke_for(request.sent_ns(), completion.wait_ns);
            let (run, mean) = (completion.run_ns, mean_run_ns.get());
            mean_run_ns.set(if mean == 0 {
                run
            } else {
                mean - (mean >> MEAN_RUN_SHIFT) + (run >> MEAN_RUN_SHIFT)
            });
            jobs.set(jobs.get() + 1);
            busy_ns.set(busy_ns.get() + run);
            publish();
            completion
        };
        loop {
            if lane.has_work() {
                lane.serve(
                    |mut slots| {
                        while slots != 0 {
                            let job = last_job[slots.trailing_zeros() as usize].get();
                            slots &= slots - 1;
                            if job != 0 {
                                sys::prefetch_lines_for_write(job, 2);
                            }
                        }
                    },
                    |slot, request| run(slot, request, &mut idle),
                );
                if orders.has_mail() {
                    return;
                }
                continue;
            }
            let came = idle.poll(lane);
            load.done.polled_ns.store(idle.polled_ns, Ordering::Relaxed);
            if !came {
                if orders.has_mail() {
                    return;
                }
                idle.sleep(orders);
            }
        }
    }
}

/// How an idle service thread waits: it polls for a budget fitted to the recent gaps between
/// requests and to the wake-ups it measured (`corehop_policy::spin`, the ski-rental rule), then
/// sleeps. A program that calls often finds it awake; a quiet one does not keep a CPU busy.
struct IdlePoll {
    budget: SpinBudget,
    /// When the thread went idle before its last sleep, until the next request arrives.
    slept_at: Option<u64>,
    /// Time spent polling, in ns: the CPU polling cost.
    polled_ns: u64,
}

impl IdlePoll {
    fn new(first_budget: Duration) -> IdlePoll {
        let wake_cost_ns = first_budget.as_nanos().min(u64::MAX as u128) as u64;
        let config = if wake_cost_ns == 0 {
            SpinConfig { initial_wake_cost_ns: 0, min_fraction: 0.0, max_factor: 1, ..SpinConfig::default() }
        } else {
            SpinConfig { initial_wake_cost_ns: wake_cost_ns, ..SpinConfig::default() }
        };
        IdlePoll { budget: SpinBudget::new(config), slept_at: None, polled_ns: 0 }
    }

    /// Polls `lane` for the budget; true if work came.
    fn poll(&mut self, lane: &Lane) -> bool {
        let budget = self.budget.budget_ns();
        if budget == 0 {
            return false;
        }
        let start = sys::now_ns();
        let mut polls = 0u32;
        let mut polled = 0;
        while !lane.has_work() {
            polls = polls.wrapping_add(1);
            // The clock costs more than a poll: read it only now and then.
            if polls.is_multiple_of(64) {
                polled = sys::now_ns().saturating_sub(start);
                if polled >= budget {
                    break;
                }
            }
            sys::cpu_relax();
        }
        self.polled_ns = self.polled_ns.saturating_add(polled);
        if lane.has_work() {
            self.budget.record_idle_gap(polled);
            return true;
        }
        self.slept_at = Some(start);
        false
    }

    /// Nothing came within the budget: refits it (no caller waits on that now) and sleeps
    /// until a caller rings.
    fn sleep(&mut self, orders: &mut Reader<Letter<Stop>, Lane>) {
        self.budget.refit_if_stale();
        orders.park();
    }

    /// A request sent at `sent_ns` started after waiting `wait_ns`: if it is the first after a
    /// sleep, it measured the gap and the wake-up.
    fn woke_for(&mut self, sent_ns: u64, wait_ns: u64) {
        if let Some(slept) = self.slept_at.take() {
            self.budget.record_idle_gap(sent_ns.saturating_sub(slept));
            self.budget.record_wake_cost(wait_ns);
        }
    }
}

/// CPU time of thread `tid` of this process in ns (first field of its schedstat).
pub fn thread_cpu_ns(tid: i32) -> Option<u64> {
    thread_schedstat(tid).map(|s| s.cpu_ns)
}

/// What the scheduler reports of one thread (`/proc/self/task/TID/schedstat`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedStat {
    /// Time it ran, ns.
    pub cpu_ns: u64,
    /// Time it was ready to run but waited for its CPU, ns.
    pub run_delay_ns: u64,
    /// Times it was put on a CPU.
    pub runs: u64,
}

/// The scheduler's figures for thread `tid` of this process.
pub fn thread_schedstat(tid: i32) -> Option<SchedStat> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    let mut fields = text.split_whitespace().map(|f| f.parse::<u64>().ok());
    Some(SchedStat { cpu_ns: fields.next()??, run_delay_ns: fields.next()??, runs: fields.next()?? })
}

/// What one caller's offloading did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffloadStats {
    /// Calls made through the offloader.
    pub calls: u64,
    /// Of those, run on a service core.
    pub offloaded: u64,
    /// Run time of the calls kept local.
    pub local_run_ns: u64,
    /// Run time of the offloaded calls on the service cores.
    pub remote_run_ns: u64,
    /// Time offloaded calls waited before running (queue plus wake-up).
    pub remote_wait_ns: u64,
    /// What the caller spent in offloaded calls, end to end (run + wait + hop back).
    pub remote_total_ns: u64,
    /// Epochs reported to the threshold tuner.
    pub epochs: u64,
}

struct Epoch {
    length_ns: u64,
    start_ns: u64,
    units: u64,
}

/// One caller's offload path: a policy, a pick state, and counters. Not shared between
/// threads: give each thread its own (the predictor is per caller, as per core in hardware).
pub struct Offloader<'s> {
    cores: &'s ServiceCores,
    policy: OffloadPolicy,
    pick_state: PickState,
    stats: OffloadStats,
    epoch: Option<Epoch>,
    profile: Option<Vec<(CallDesc, u64)>>,
    /// Short local calls until the policy is shown one again (see [`OBSERVE_SHORT_EVERY`]).
    until_observed: u32,
}

/// A local call shorter than [`SHORT_CALL_NS`] is shown to the policy one time in this many:
/// learning from every one of them cost the file server 2–5 % of its throughput
/// (docs/performance.md). Long calls, the ones a move may pay for, and moved calls are
/// always shown.
pub const OBSERVE_SHORT_EVERY: u32 = 16;
/// About a futex wake-up on a small VM: a call shorter than that rarely pays for a move.
pub const SHORT_CALL_NS: u64 = 20_000;

/// A call site from the caller's source location: the address of its static `Location`,
/// one per call site in the program (hashing its file and line cost 200 instructions a call).
fn site_of(location: &'static panic::Location<'static>) -> u64 {
    std::ptr::from_ref(location) as usize as u64
}

impl<'s> Offloader<'s> {
    /// An offloader deciding with `policy`, sending to `cores`.
    pub fn new(cores: &'s ServiceCores, policy: OffloadPolicy) -> Offloader<'s> {
        Offloader {
            cores,
            policy,
            pick_state: PickState::default(),
            stats: OffloadStats::default(),
            epoch: None,
            profile: None,
            until_observed: 0,
        }
    }

    /// Record every call's description and run length: a trace (for `corehop predict`) and
    /// the input of a static profile ([`corehop_policy::offload::StaticProfile::from_profile`]).
    pub fn with_profile(mut self) -> Offloader<'s> {
        self.profile = Some(Vec::new());
        self
    }

    /// The (call, run ns) pairs recorded since [`Offloader::with_profile`] (then empty).
    pub fn take_profile(&mut self) -> Vec<(CallDesc, u64)> {
        self.profile.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Feed the policy's threshold tuner every `length` of wall time, with the progress
    /// rate reported through [`Offloader::progress`] as the feedback. An epoch ends at a
    /// progress report, never inside a call: it spans whole units, so a trial of a few
    /// transactions is not scored with part of one more in its time but not in its count.
    pub fn with_epochs(mut self, length: Duration) -> Offloader<'s> {
        self.epoch =
            Some(Epoch { length_ns: length.as_nanos().max(1) as u64, start_ns: sys::now_ns(), units: 0 });
        self
    }

    /// The policy deciding (with what it has learnt so far).
    pub fn policy(&self) -> &OffloadPolicy {
        &self.policy
    }

    /// What this offloader did so far.
    pub fn stats(&self) -> OffloadStats {
        self.stats
    }

    /// The application made `units` of progress (transactions, requests, bytes…).
    pub fn progress(&mut self, units: u64) {
        if let Some(epoch) = &mut self.epoch {
            epoch.units += units;
        }
        self.maybe_end_epoch();
    }

    fn maybe_end_epoch(&mut self) {
        let Some(epoch) = &mut self.epoch else { return };
        let now = sys::now_ns();
        let elapsed = now.saturating_sub(epoch.start_ns);
        if self.policy.epoch_over(elapsed, epoch.units, epoch.length_ns) {
            let units = epoch.units as f64;
            epoch.start_ns = now;
            epoch.units = 0;
            self.policy.epoch_end(units, elapsed);
            self.stats.epochs += 1;
        }
    }

    /// Runs `f`, described to the policy as `desc`, locally or on a service core as the
    /// policy decides; what the call cost goes back to the policy (for a short local call,
    /// one time in [`OBSERVE_SHORT_EVERY`]).
    pub fn call<'a, R: Send + 'a>(&mut self, desc: CallDesc, f: impl FnOnce() -> R + Send + 'a) -> R {
        self.stats.calls += 1;
        // A queue at the service core only ever makes a policy keep more calls local, so a
        // call that stays local with no queue stays local: decided without touching the
        // service core's line (a cache miss that costs more than most local calls).
        let mut state = self.pick_state;
        let decision =
            if self.policy.keeps_all_local() { Decision::Local } else { self.policy.decide(&desc, 0) };
        let target = match decision {
            Decision::Local => None,
            Decision::Offload => {
                let index = self.cores.pick(&mut state);
                let queue_delay = self.cores.cores[index].load.expected_delay_ns();
                // With no queue the answer is the one just given.
                (queue_delay == 0 || self.policy.decide(&desc, queue_delay) == Decision::Offload)
                    .then_some(index)
            }
        };
        match target {
            None => {
                let t0 = sys::now_ns();
                let r = f();
                let run = sys::now_ns().saturating_sub(t0);
                self.stats.local_run_ns += run;
                if run >= SHORT_CALL_NS || self.profile.is_some() || self.until_observed == 0 {
                    self.until_observed = OBSERVE_SHORT_EVERY - 1;
                    self.learn(&desc, CallCost::local(run));
                } else {
                    self.until_observed -= 1;
                }
                r
            }
            Some(index) => {
                self.pick_state = state;
                let t0 = sys::now_ns();
                let (r, wait, run) = self.cores.run_on(index, f);
                let caller = sys::now_ns().saturating_sub(t0);
                self.stats.offloaded += 1;
                self.stats.remote_run_ns += run;
                self.stats.remote_wait_ns += wait;
                self.stats.remote_total_ns += caller;
                self.learn(&desc, CallCost::moved(run, caller));
                r
            }
        }
    }

    fn learn(&mut self, desc: &CallDesc, cost: CallCost) {
        self.policy.observe(desc, cost);
        if let Some(profile) = &mut self.profile {
            profile.push((*desc, cost.run));
        }
    }

    /// Runs a system-call value where the policy says; `site` tells call sites apart.
    pub fn syscall(&mut self, mut call: SysCall<'_>, site: u64) -> SysResult {
        let desc = call.desc(site);
        self.call(desc, move || call.execute())
    }

    #[track_caller]
    fn here(&mut self, call: SysCall<'_>) -> SysResult {
        let site = site_of(panic::Location::caller());
        self.syscall(call, site)
    }

    /// `read(2)`; the call site (source location) is part of the predictor key.
    #[track_caller]
    pub fn read(&mut self, fd: RawFd, buf: &mut [u8]) -> Result<usize, Errno> {
        self.here(SysCall::Read { fd, buf }).map(|n| n as usize)
    }

    /// `write(2)`, run where the policy says: here, or on a service core.
    #[track_caller]
    pub fn write(&mut self, fd: RawFd, buf: &[u8]) -> Result<usize, Errno> {
        self.here(SysCall::Write { fd, buf }).map(|n| n as usize)
    }

    /// `pread(2)`, run where the policy says: here, or on a service core.
    #[track_caller]
    pub fn pread(&mut self, fd: RawFd, buf: &mut [u8], offset: i64) -> Result<usize, Errno> {
        self.here(SysCall::Pread { fd, buf, offset }).map(|n| n as usize)
    }

    /// `pwrite(2)`, run where the policy says: here, or on a service core.
    #[track_caller]
    pub fn pwrite(&mut self, fd: RawFd, buf: &[u8], offset: i64) -> Result<usize, Errno> {
        self.here(SysCall::Pwrite { fd, buf, offset }).map(|n| n as usize)
    }

    /// `readv(2)`, run where the policy says: here, or on a service core.
    #[track_caller]
    pub fn readv<'b>(&mut self, fd: RawFd, bufs: &'b mut [IoSliceMut<'b>]) -> Result<usize, Errno> {
        self.here(SysCall::Readv { fd, bufs }).map(|n| n as usize)
    }

    /// `writev(2)`, run where the policy says: here, or on a service core.
    #[track_caller]
    pub fn writev<'b>(&mut self, fd: RawFd, bufs: &'b [IoSlice<'b>]) -> Result<usize, Errno> {
        self.here(SysCall::Writev { fd, bufs }).map(|n| n as usize)
    }

    /// `open(2)`; returns the new descriptor (the caller owns it).
    #[track_caller]
    pub fn open(&mut self, path: &CStr, flags: i32, mode: u32) -> Result<RawFd, Errno> {
        self.here(SysCall::Open { path, flags, mode }).map(|fd| fd as RawFd)
    }

    /// `openat(2)`, run where the policy says: here, or on a service core.
    #[track_caller]
    pub fn openat(&mut self, dirfd: RawFd, path: &CStr, flags: i32, mode: u32) -> Result<RawFd, Errno> {
        self.here(SysCall::Openat { dirfd, path, flags, mode }).map(|fd| fd as RawFd)
    }

    /// `stat(2)`, run where the policy says: here, or on a service core.
    #[track_caller]
    pub fn stat(&mut self, path: &CStr) -> Result<libc::stat, Errno> {
        let mut out = zeroed_stat();
        self.here(SysCall::Stat { path, out: &mut out }).map(|_| out)
    }

    /// `fstat(2)`, run where the policy says: here, or on a service core.
    #[track_caller]
    pub fn fstat(&mut self, fd: RawFd) -> Result<libc::stat, Errno> {
        let mut out = zeroed_stat();
        self.here(SysCall::Fstat { fd, out: &mut out }).map(|_| out)
    }

    /// `lstat(2)`, run where the policy says: here, or on a service core.
    #[track_caller]
    pub fn lstat(&mut self, path: &CStr) -> Result<libc::stat, Errno> {
        let mut out = zeroed_stat();
        self.here(SysCall::Lstat { path, out: &mut out }).map(|_| out)
    }

    /// `newfstatat(2)`, run where the policy says: here, or on a service core.
    #[track_caller]
    pub fn fstatat(&mut self, dirfd: RawFd, path: &CStr, flags: i32) -> Result<libc::stat, Errno> {
        let mut out = zeroed_stat();
        self.here(SysCall::Newfstatat { dirfd, path, out: &mut out, flags }).map(|_| out)
    }

    /// `fsync(2)`, run where the policy says: here, or on a service core.
    #[track_caller]
    pub fn fsync(&mut self, fd: RawFd) -> Result<(), Errno> {
        self.here(SysCall::Fsync { fd }).map(drop)
    }

    /// `fdatasync(2)`, run where the policy says: here, or on a service core.
    #[track_caller]
    pub fn fdatasync(&mut self, fd: RawFd) -> Result<(), Errno> {
        self.here(SysCall::Fdatasync { fd }).map(drop)
    }

    /// `sendfile(2)`, run where the policy says: here, or on a service core.
    #[track_caller]
    pub fn sendfile(
        &mut self,
        out_fd: RawFd,
        in_fd: RawFd,
        offset: Option<&mut i64>,
        count: usize,
    ) -> Result<usize, Errno> {
        self.here(SysCall::Sendfile { out_fd, in_fd, offset, count }).map(|n| n as usize)
    }

    /// `send` on a connected socket (`sendto` without an address).
    #[track_caller]
    pub fn send(&mut self, fd: RawFd, buf: &[u8], flags: i32) -> Result<usize, Errno> {
        self.here(SysCall::Sendto { fd, buf, flags, addr: None }).map(|n| n as usize)
    }

    /// `recv` on a connected socket (`recvfrom` without an address).
    #[track_caller]
    pub fn recv(&mut self, fd: RawFd, buf: &mut [u8], flags: i32) -> Result<usize, Errno> {
        self.here(SysCall::Recvfrom { fd, buf, flags, addr: None }).map(|n| n as usize)
    }

    /// `poll(2)`, run where the policy says: here, or on a service core.
    #[track_caller]
    pub fn poll(&mut self, fds: &mut [libc::pollfd], timeout_ms: i32) -> Result<usize, Errno> {
        self.here(SysCall::Poll { fds, timeout_ms }).map(|n| n as usize)
    }

    /// `select(2)` over the sets given; returns how many descriptors are ready (the sets and
    /// the timeout are updated in place, as the kernel does). An `nfds` above `FD_SETSIZE`,
    /// the descriptors an `fd_set` holds, is `EINVAL`.
    #[track_caller]
    pub fn select(
        &mut self,
        nfds: i32,
        read: Option<&mut libc::fd_set>,
        write: Option<&mut libc::fd_set>,
        except: Option<&mut libc::fd_set>,
        timeout: Option<&mut libc::timeval>,
    ) -> Result<usize, Errno> {
        self.here(SysCall::Select { nfds, read, write, except, timeout }).map(|n| n as usize)
    }

    /// Any closure, described to the policy as an `Other` call from this source location.
    #[track_caller]
    pub fn offload<'a, R: Send + 'a>(&mut self, f: impl FnOnce() -> R + Send + 'a) -> R {
        let site = site_of(panic::Location::caller());
        self.call(CallDesc::new(CallKind::Other(u32::MAX), -1, 0, site), f)
    }
}

fn zeroed_stat() -> libc::stat {
    // SAFETY: `struct stat` is plain old data; all zeroes is a valid value.
    unsafe { std::mem::zeroed() }
}
