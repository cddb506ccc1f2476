//! Components: long-running service loops on dedicated or shared CPUs, connected by channels
//! in shared memory, that can be moved between CPUs and restarted after a crash without losing
//! or reordering a message (the multiserver design of "When Slower is Faster").
//!
//! # Shape
//!
//! ```text
//!   cpu0 host thread (pinned)            cpu1 host thread (pinned)
//!   ┌──────────────────────────┐         ┌──────────────────────────┐
//!   │ driver ──spsc──▶ ip ─────┼──spsc──▶│ tcp ──spsc──▶ sink       │
//!   └──────────────────────────┘         └──────────────────────────┘
//! ```
//!
//! A [`Component`] is a service object: `handle` one input message, staging outputs in an
//! [`Outbox`]; a source (no input) produces in `poll`. Each CPU in use has one **host**, a
//! thread pinned to it that runs all components placed there round-robin in the order they
//! were added, a batch each (two while more than a batch waits, so a backlog drains).
//! Components are not fibers: they never block and never hop, so a plain loop over them is
//! the cheapest scheduler there is, and components that share a CPU switch without the kernel.
//! It also settles the paper's "notification fallback": a component that would poll can never
//! starve a neighbour on its CPU, because the host polls only when *all* its components are
//! idle; when it parks, senders wake it through its futex word (the notification), and a
//! dedicated host that is polling costs its senders one load.
//!
//! # Time and speed
//!
//! The host timestamps each batch ([`crate::sys::now_ns`], the TSC) and charges it to the
//! component, as the paper did around its work. An emulated slow CPU (speed `s`, from
//! `Cpu::emulated_speed` or [`Pipeline::set_speed`]) throttles by duty cycle: after a batch
//! that took `w`, the host stalls `w · (1/s − 1)`, the cycles a throttled core throws away,
//! charged to the component too.
//!
//! # Idling
//!
//! A host with nothing to do first registers with its inputs and blocked outputs, so that the
//! next message or room leaves a token in its park word (the channels' doorbells, below). Then
//! [`Idle::Poll`] spins on that word, [`Idle::Park`] sleeps at once, and [`Idle::PollThenPark`]
//! spins for the adaptive budget of [`corehop_policy::spin`] and then sleeps. The budget is
//! fitted to the idle gaps (until the ring, not until the host is back) and to what a sleep
//! costs: the host's wake-up plus the waker's futex call, slowed with the waker's CPU. A
//! spinning host reads only its park word, never a channel's indices: polling a queue pulled
//! its line from the CPU working on it, once per message. A consumer rings a blocked producer
//! every 32 messages it takes. A host with nothing placed on it always sleeps.
//!
//! # Moves and restarts lose nothing
//!
//! Messages live in the channels, which stay put; a component owns none of them except the
//! outputs it has staged and a message to re-deliver. Hence:
//!
//! - **Move** ([`Pipeline::move_component`]): the old host takes the component out at the top
//!   of its loop (quiesce: no handler is running, its last batch was flushed as far as the
//!   output had room), stops being woken for its input, and passes it with whatever is still
//!   staged to the new host, which starts being woken for the input and resumes. Only one
//!   host holds the component at a time and the hand-over is a synchronised queue, so the
//!   new host sees every write of the old; the input's FIFO order and the staged outputs'
//!   order are unchanged.
//! - **Crash**: a panic in `handle` or `poll` is caught at the component boundary. The outputs
//!   staged for the failed message are discarded, a fresh instance is built by the
//!   component's factory, and the message is delivered to it once more (messages are `Clone`
//!   descriptors; the copy is kept for exactly this). If the fresh instance panics on it too,
//!   it is a *poison* message: dropped and counted in [`ComponentSample::poisoned`]. So every
//!   input message yields its outputs exactly once, in order, or is accounted as poisoned.
//!
//! Limits: one input channel (fan-in through an MPSC channel) and at most one output channel
//! per component; at most 64 CPUs per pipeline.
mod channel;
mod host;
mod slot;

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use corehop_policy::components::{Action, ControllerError, Layout, Observation};
use corehop_topology::{CpuId, Machine, OsCpu};
use crossbeam_utils::CachePadded;

pub use channel::{Mpsc, Receiver, Sender, Spsc};
pub use corehop_policy::components::{ComponentId, Idle};
pub use corehop_policy::spin::SpinConfig;

use channel::{Chan, Signals};
use host::{Control, HostConfig, Shared};
use slot::{ComponentStats, Runnable, Slot};

/// A long-running service loop with state.
///
/// The runtime calls `handle` for each input message, in order, from one host thread at a
/// time (which thread may change when the component is moved). A panic inside is caught; see
/// the module docs for what happens to the message.
pub trait Component: Send + 'static {
    /// Input message: a small descriptor (indexes, lengths, an `Arc`), cloned once per
    /// delivery so that it can be re-delivered after a crash. `()` for a source.
    type In: Clone + Send + 'static;
    /// Output message. Use `()` for a sink.
    type Out: Send + 'static;

    /// Handles one message; outputs go to `out` and leave when the handler returns.
    fn handle(&mut self, msg: Self::In, out: &mut Outbox<Self::Out>);

    /// Spontaneous work of a source (a component without input): produce up to `out.room()`
    /// messages. Return false when there will never be more (until a restart).
    fn poll(&mut self, out: &mut Outbox<Self::Out>) -> bool {
        let _ = out;
        false
    }
}

/// Outputs a component stages while handling one message; the host moves them into the
/// output channel when the handler has returned (so a crash mid-handler emits nothing).
pub struct Outbox<M> {
    staged: std::collections::VecDeque<M>,
    room: usize,
}

impl<M> Default for Outbox<M> {
    /// An outbox with unlimited room, for running a handler outside a pipeline (tests).
    fn default() -> Self {
        Outbox { staged: std::collections::VecDeque::new(), room: usize::MAX }
    }
}

impl<M> Outbox<M> {
    /// What was staged, in order (for running a handler outside a pipeline).
    pub fn into_staged(self) -> Vec<M> {
        self.staged.into()
    }

    /// Stages `msg`. More than [`Outbox::room`] is allowed; the component then waits until
    /// the consumer has made space before it gets more input.
    pub fn push(&mut self, msg: M) {
        self.staged.push_back(msg);
    }

    /// How many more messages fit in the output channel now (`usize::MAX` for a sink).
    pub fn room(&self) -> usize {
        self.room.saturating_sub(self.staged.len())
    }
}

/// Bad input or a failure of the components runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ComponentError {
    /// A CPU id past the end of the machine's CPU list.
    #[error("{cpu} is not one of the machine's {cpus} CPUs")]
    UnknownCpu {
        /// The CPU asked for (dense id, not the kernel's number).
        cpu: CpuId,
        /// How many CPUs the machine has.
        cpus: usize,
    },
    /// The machine has more CPUs than a pipeline supports.
    #[error("a pipeline can use at most {max} CPUs; the machine has {cpus}")]
    TooManyCpus {
        /// How many CPUs the machine has.
        cpus: usize,
        /// The most a pipeline supports.
        max: usize,
    },
    /// An emulated speed that is not in (0, 1].
    #[error("speed {speed} for {cpu} is outside (0, 1]")]
    BadSpeed {
        /// The CPU it was for.
        cpu: CpuId,
        /// The speed given, as a fraction of full speed.
        speed: f64,
    },
    /// A channel capacity outside 1..=[`MAX_CHANNEL_CAPACITY`] was asked for.
    #[error("a channel's capacity must be between 1 and {MAX_CHANNEL_CAPACITY} messages, got {0}")]
    Capacity(usize),
    /// A batch size of 0 was asked for.
    #[error("the batch size must be at least 1")]
    ZeroBatch,
    /// A component was given a channel made by a different [`PipelineBuilder`].
    #[error("component {name}: its {end} channel belongs to another pipeline builder")]
    ForeignChannel {
        /// The component's name.
        name: String,
        /// Which of its channels: `"input"` or `"output"`.
        end: &'static str,
    },
    /// Building the first instance of a component panicked.
    #[error("component {name}: its factory panicked")]
    FactoryPanicked {
        /// The component's name.
        name: String,
    },
    /// A component id this pipeline did not hand out.
    #[error("there is no {0}")]
    UnknownComponent(ComponentId),
    /// A host thread could not be started or pinned.
    #[error("could not start the host of {cpu} (kernel cpu {os_cpu}): {source}")]
    Host {
        /// The host's CPU (dense id).
        cpu: CpuId,
        /// The kernel's number for that CPU.
        os_cpu: OsCpu,
        /// The OS error from starting or pinning the thread.
        #[source]
        source: std::io::Error,
    },
    /// A host thread was gone before it answered (when starting, or during a move).
    #[error("the pipeline's hosts have stopped")]
    Stopped,
    /// A layout or controller input that `corehop_policy::components` rejected.
    #[error(transparent)]
    Layout(#[from] ControllerError),
}

/// The most messages a channel holds: its queue is allocated whole when it is made.
pub const MAX_CHANNEL_CAPACITY: usize = 1 << 20;

const MAX_CPUS: usize = 64;
/// Messages a component handles per turn before the host moves to the next one.
pub const DEFAULT_BATCH: usize = 32;

fn check_speed(machine: &Machine, cpu: CpuId, speed: f64) -> Result<(), ComponentError> {
    if cpu.0 >= machine.cpus().len() {
        return Err(ComponentError::UnknownCpu { cpu, cpus: machine.cpus().len() });
    }
    if !(speed > 0.0 && speed <= 1.0) {
        return Err(ComponentError::BadSpeed { cpu, speed });
    }
    Ok(())
}

/// A component's queue gauge, whatever its message type.
trait Gauge: Send + Sync {
    fn len(&self) -> usize;
    fn capacity(&self) -> usize;
}

impl<M: Send> Gauge for Chan<M> {
    fn len(&self) -> usize {
        Chan::len(self)
    }
    fn capacity(&self) -> usize {
        Chan::capacity(self)
    }
}

struct Info {
    name: String,
    stats: Arc<CachePadded<ComponentStats>>,
    input: Option<Arc<dyn Gauge>>,
}

/// Assembles a pipeline: channels, components and their CPUs, idle mode, speeds.
///
/// # Examples
/// ```
/// use corehop_runtime::components::{Component, Outbox, Pipeline};
/// use corehop_topology::{CoreClass, Cpu, CpuId, Machine};
///
/// struct Double;
/// impl Component for Double {
///     type In = u64;
///     type Out = u64;
///     fn handle(&mut self, x: u64, out: &mut Outbox<u64>) {
///         out.push(2 * x);
///     }
/// }
///
/// let os_cpu = corehop_runtime::sys::current_os_cpu().unwrap();
/// let cpu = Cpu { id: CpuId(0), os_id: os_cpu, core: 0, package: 0, class: CoreClass::Uniform,
///                 speed: 1.0, emulated_speed: None };
/// let machine = Machine { name: "here".into(), source: "doc".into(), cpus: vec![cpu],
///                         caches: vec![], waitpkg: false };
/// let mut b = Pipeline::builder(&machine).unwrap();
/// let (to_double, double_in) = b.spsc::<u64>(64).unwrap();
/// let (double_out, results) = b.spsc::<u64>(64).unwrap();
/// b.component("double", CpuId(0), || Double).input(double_in).output(double_out).add().unwrap();
/// let pipeline = b.build().unwrap();
/// to_double.try_send(21).unwrap();
/// let answer = loop {
///     if let Some(x) = results.try_recv() { break x; }
///     std::thread::yield_now();
/// };
/// assert_eq!(answer, 42);
/// pipeline.stop();
/// ```
pub struct PipelineBuilder {
    machine: Machine,
    signals: Arc<Signals>,
    idle: Idle,
    spin: SpinConfig,
    batch: usize,
    speeds: Vec<f64>,
    slots: Vec<(CpuId, Box<dyn Runnable>)>,
    infos: Vec<Info>,
}

impl PipelineBuilder {
    fn new(machine: &Machine) -> Result<Self, ComponentError> {
        let n = machine.cpus().len();
        if n > MAX_CPUS {
            return Err(ComponentError::TooManyCpus { cpus: n, max: MAX_CPUS });
        }
        let speeds: Vec<f64> = machine.cpus().iter().map(|c| c.emulated_speed.unwrap_or(1.0)).collect();
        for (i, &s) in speeds.iter().enumerate() {
            check_speed(machine, CpuId(i), s)?;
        }
        Ok(PipelineBuilder {
            machine: machine.clone(),
            signals: Signals::new(n),
            idle: Idle::default(),
            spin: SpinConfig::default(),
            batch: DEFAULT_BATCH,
            speeds,
            slots: Vec::new(),
            infos: Vec::new(),
        })
    }

    /// How hosts wait for work (default [`Idle::PollThenPark`]).
    pub fn idle(&mut self, idle: Idle) -> &mut Self {
        self.idle = idle;
        self
    }

    /// Tuning of the adaptive spin budget of [`Idle::PollThenPark`].
    pub fn spin(&mut self, spin: SpinConfig) -> &mut Self {
        self.spin = spin;
        self
    }

    /// Messages a component handles per turn (default [`DEFAULT_BATCH`]); twice as many while
    /// more than this wait in its input.
    pub fn batch(&mut self, batch: usize) -> Result<&mut Self, ComponentError> {
        if batch == 0 {
            return Err(ComponentError::ZeroBatch);
        }
        self.batch = batch;
        Ok(self)
    }

    /// Runs `cpu` at `speed` of its full speed (duty-cycle emulation), overriding the machine.
    pub fn speed(&mut self, cpu: CpuId, speed: f64) -> Result<&mut Self, ComponentError> {
        check_speed(&self.machine, cpu, speed)?;
        self.speeds[cpu.0] = speed;
        Ok(self)
    }

    fn chan<M: Send>(&self, capacity: usize) -> Result<Arc<Chan<M>>, ComponentError> {
        if !(1..=MAX_CHANNEL_CAPACITY).contains(&capacity) {
            return Err(ComponentError::Capacity(capacity));
        }
        Ok(Chan::new(capacity, self.signals.clone()))
    }

    /// A bounded channel with one producer and one consumer.
    pub fn spsc<M: Send>(&self, capacity: usize) -> Result<(Sender<M, Spsc>, Receiver<M>), ComponentError> {
        let chan = self.chan(capacity)?;
        Ok((Sender::new(chan.clone()), Receiver { chan }))
    }

    /// A bounded channel with any number of producers (clone the sender) and one consumer.
    pub fn mpsc<M: Send>(&self, capacity: usize) -> Result<(Sender<M, Mpsc>, Receiver<M>), ComponentError> {
        let chan = self.chan(capacity)?;
        Ok((Sender::new(chan.clone()), Receiver { chan }))
    }

    /// Starts describing a component called `name` on `cpu`; `factory` builds it now and again
    /// after each crash.
    pub fn component<C: Component>(
        &mut self,
        name: &str,
        cpu: CpuId,
        factory: impl FnMut() -> C + Send + 'static,
    ) -> ComponentSpec<'_, C> {
        ComponentSpec {
            builder: self,
            name: name.to_string(),
            cpu,
            factory: Box::new(factory),
            input: None,
            output: None,
        }
    }

    /// Spawns one pinned host per CPU of the machine and starts the components.
    pub fn build(self) -> Result<Pipeline, ComponentError> {
        let PipelineBuilder { machine, signals, idle, spin, batch, speeds, slots, infos } = self;
        let (shared, inboxes) = Shared::new(&speeds, signals);
        let placement: Vec<CpuId> = slots.iter().map(|(cpu, _)| *cpu).collect();
        let mut per_host: Vec<Vec<Box<dyn Runnable>>> = (0..speeds.len()).map(|_| Vec::new()).collect();
        for (cpu, slot) in slots {
            per_host[cpu.0].push(slot);
        }
        let mut pipeline = Pipeline {
            shared: shared.clone(),
            machine: machine.clone(),
            threads: Vec::new(),
            placement: Mutex::new(placement),
            infos,
        };
        for (index, (slots, inbox)) in per_host.into_iter().zip(inboxes).enumerate() {
            let cpu = &machine.cpus()[index];
            let cfg = HostConfig { index, idle, spin, batch };
            let shared = shared.clone();
            let started = crate::worker::start_pinned(format!("corehop-comp-{}", cpu.id), Some(cpu.os_id), {
                move |started| host::run(cfg, shared, inbox, slots, started)
            });
            match started {
                Ok(handle) => pipeline.threads.push(handle),
                Err(crate::worker::StartError::Died) => return Err(ComponentError::Stopped),
                Err(e) => {
                    return Err(ComponentError::Host { cpu: cpu.id, os_cpu: cpu.os_id, source: e.into_io() })
                }
            }
        }
        Ok(pipeline)
    }
}

/// One component being described; finish with [`ComponentSpec::add`].
pub struct ComponentSpec<'a, C: Component> {
    builder: &'a mut PipelineBuilder,
    name: String,
    cpu: CpuId,
    factory: Box<dyn FnMut() -> C + Send>,
    input: Option<Receiver<C::In>>,
    output: Option<Arc<Chan<C::Out>>>,
}

impl<C: Component> ComponentSpec<'_, C> {
    /// The channel the component consumes.
    pub fn input(mut self, rx: Receiver<C::In>) -> Self {
        self.input = Some(rx);
        self
    }

    /// The channel the component's outputs go to.
    pub fn output<K>(mut self, tx: Sender<C::Out, K>) -> Self {
        self.output = Some(tx.chan);
        self
    }

    /// Adds the component; its id is its index in [`Layout::cpu_of`] and samples.
    pub fn add(self) -> Result<ComponentId, ComponentError> {
        let ComponentSpec { builder, name, cpu, mut factory, input, output } = self;
        if cpu.0 >= builder.machine.cpus().len() {
            return Err(ComponentError::UnknownCpu { cpu, cpus: builder.machine.cpus().len() });
        }
        let ours = |signals: &Arc<Signals>| Arc::ptr_eq(signals, &builder.signals);
        if input.as_ref().is_some_and(|rx| !ours(rx.chan.signals())) {
            return Err(ComponentError::ForeignChannel { name, end: "input" });
        }
        if output.as_ref().is_some_and(|tx| !ours(tx.signals())) {
            return Err(ComponentError::ForeignChannel { name, end: "output" });
        }
        let comp = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&mut factory))
            .map_err(|_| ComponentError::FactoryPanicked { name: name.clone() })?;
        let id = ComponentId(builder.slots.len());
        let stats: Arc<CachePadded<ComponentStats>> = Arc::default();
        let input = input.map(|rx| rx.chan);
        let gauge = input.clone().map(|c| c as Arc<dyn Gauge>);
        let slot = Slot {
            id,
            factory,
            comp: Some(comp),
            input,
            output,
            outbox: Outbox::default(),
            redeliver: None,
            exhausted: false,
            stats: stats.clone(),
        };
        builder.slots.push((cpu, Box::new(slot)));
        builder.infos.push(Info { name, stats, input: gauge });
        Ok(id)
    }
}

/// Counters of one component at one instant (cumulative since start).
#[derive(Debug, Clone, PartialEq)]
pub struct ComponentSample {
    /// The name it was added under.
    pub name: String,
    /// The CPU whose host runs it now.
    pub cpu: CpuId,
    /// Time spent working, duty-cycle stalls included, ns.
    pub busy_ns: u64,
    /// Input messages handled to completion.
    pub handled: u64,
    /// Messages a source produced.
    pub produced: u64,
    /// Panics caught (each followed by a restart).
    pub crashes: u64,
    /// Messages dropped because they crashed a fresh instance too.
    pub poisoned: u64,
    /// The factory panicked on restart: the component no longer runs.
    pub dead: bool,
    /// Messages waiting in its input now (0 for a source).
    pub queue_len: usize,
    /// The input channel's capacity in messages (0 for a source).
    pub queue_capacity: usize,
}

/// Counters of one host (CPU) at one instant (cumulative since start).
#[derive(Debug, Clone, PartialEq)]
pub struct HostSample {
    /// The host's CPU.
    pub cpu: CpuId,
    /// The emulated speed in force, as a fraction of full speed (1.0 = not throttled).
    pub speed: f64,
    /// Time working, duty-cycle stalls included, ns.
    pub busy_ns: u64,
    /// Time polling while idle, ns.
    pub spin_ns: u64,
    /// Time asleep in the kernel, ns.
    pub parked_ns: u64,
    /// Times it slept on its futex (counted as it wakes).
    pub parks: u64,
    /// Futex wakes other threads issued to it.
    pub wakes: u64,
}

/// A snapshot of a running pipeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// When it was taken: [`crate::sys::now_ns`], ns on the `CLOCK_MONOTONIC` time line.
    pub at_ns: u64,
    /// One per component, indexed by [`ComponentId`].
    pub components: Vec<ComponentSample>,
    /// One per CPU of the machine, indexed by [`CpuId`].
    pub hosts: Vec<HostSample>,
}

impl Sample {
    /// One [`Observation`] per component for the window from `earlier` to `self`, for
    /// [`corehop_policy::components::Controller::observe`].
    pub fn observations_since(&self, earlier: &Sample) -> Vec<Observation> {
        let window_ns = self.at_ns.saturating_sub(earlier.at_ns);
        self.components
            .iter()
            .zip(&earlier.components)
            .map(|(now, then)| Observation {
                busy_ns: now.busy_ns.saturating_sub(then.busy_ns),
                window_ns,
                queue_start: then.queue_len,
                queue_end: now.queue_len,
                queue_capacity: now.queue_capacity,
                done: (now.handled + now.produced).saturating_sub(then.handled + then.produced),
            })
            .collect()
    }
}

/// A running set of components. Dropping it stops the hosts.
pub struct Pipeline {
    shared: Arc<Shared>,
    machine: Machine,
    threads: Vec<JoinHandle<()>>,
    placement: Mutex<Vec<CpuId>>,
    infos: Vec<Info>,
}

impl Pipeline {
    /// A builder for components on `machine`'s CPUs, each at its `emulated_speed` (or full
    /// speed), idling [`Idle::PollThenPark`]; [`PipelineBuilder::build`] starts them. (As
    /// `Runtime::builder` and `SmtRuntime::builder`.)
    pub fn builder(machine: &Machine) -> Result<PipelineBuilder, ComponentError> {
        PipelineBuilder::new(machine)
    }

    /// The machine the pipeline was built for.
    pub fn machine(&self) -> &Machine {
        &self.machine
    }

    fn placement(&self) -> std::sync::MutexGuard<'_, Vec<CpuId>> {
        self.placement.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn speed_of(&self, cpu: usize) -> f64 {
        f64::from_bits(self.shared.hosts[cpu].speed_bits.load(Ordering::Relaxed))
    }

    /// Where each component runs and each CPU's speed, for the controller.
    pub fn layout(&self) -> Layout {
        Layout {
            cpu_of: self.placement().clone(),
            speed: (0..self.machine.cpus().len()).map(|i| self.speed_of(i)).collect(),
        }
    }

    /// Moves `component` to `to` without losing or reordering a message (see the module
    /// docs); returns once the new host runs it. Call it from outside the pipeline: a
    /// component's handler that waited here would hold up the very host that must let go.
    pub fn move_component(&self, component: ComponentId, to: CpuId) -> Result<(), ComponentError> {
        let cpus = self.machine.cpus().len();
        if to.0 >= cpus {
            return Err(ComponentError::UnknownCpu { cpu: to, cpus });
        }
        let mut placement = self.placement();
        let from = *placement.get(component.0).ok_or(ComponentError::UnknownComponent(component))?;
        if from == to {
            return Ok(());
        }
        let (done, adopted) = mpsc::channel();
        self.shared.send(from.0, Control::Evict { id: component, to: to.0, done });
        adopted.recv().map_err(|_| ComponentError::Stopped)?;
        placement[component.0] = to;
        Ok(())
    }

    /// Emulates `speed` (0 < speed <= 1) on `cpu` from its next batch on.
    pub fn set_speed(&self, cpu: CpuId, speed: f64) -> Result<(), ComponentError> {
        check_speed(&self.machine, cpu, speed)?;
        self.shared.hosts[cpu.0].speed_bits.store(speed.to_bits(), Ordering::Relaxed);
        Ok(())
    }

    /// Carries out a controller's actions in order.
    pub fn apply(&self, actions: &[Action]) -> Result<(), ComponentError> {
        for action in actions {
            match *action {
                Action::Move { component, to, .. } => self.move_component(component, to)?,
                Action::SetSpeed { cpu, speed } => self.set_speed(cpu, speed)?,
            }
        }
        Ok(())
    }

    /// Counters of every component and host now.
    pub fn sample(&self) -> Sample {
        let placement = self.placement().clone();
        let components = self
            .infos
            .iter()
            .zip(placement)
            .map(|(info, cpu)| {
                let s = &info.stats;
                ComponentSample {
                    name: info.name.clone(),
                    cpu,
                    busy_ns: s.busy_ns.load(Ordering::Relaxed),
                    handled: s.handled.load(Ordering::Relaxed),
                    produced: s.produced.load(Ordering::Relaxed),
                    crashes: s.crashes.load(Ordering::Relaxed),
                    poisoned: s.poisoned.load(Ordering::Relaxed),
                    dead: s.dead.load(Ordering::Relaxed),
                    queue_len: info.input.as_ref().map_or(0, |g| g.len()),
                    queue_capacity: info.input.as_ref().map_or(0, |g| g.capacity()),
                }
            })
            .collect();
        let hosts = self
            .shared
            .hosts
            .iter()
            .enumerate()
            .map(|(i, h)| HostSample {
                cpu: CpuId(i),
                speed: self.speed_of(i),
                busy_ns: h.stats.busy_ns.load(Ordering::Relaxed),
                spin_ns: h.stats.spin_ns.load(Ordering::Relaxed),
                parked_ns: h.stats.parked_ns.load(Ordering::Relaxed),
                parks: h.stats.parks.load(Ordering::Relaxed),
                wakes: self.shared.signals.host(i).wakes(),
            })
            .collect();
        Sample { at_ns: crate::sys::now_ns(), components, hosts }
    }

    /// Stops every host and returns the final counters, read once every host has stopped (a
    /// message handled just before the stop counts; read earlier, it could be missed).
    pub fn stop(mut self) -> Sample {
        self.shutdown();
        self.sample()
    }

    fn shutdown(&mut self) {
        for host in 0..self.shared.hosts.len() {
            self.shared.send(host, Control::Stop);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.shutdown();
    }
}
