//! Asynchronous delegation: many operations in flight to other CPUs, served there in batches.
//!
//! [`on`](crate::on) moves the calling task to a CPU and back: one round trip per operation,
//! with the caller idle meanwhile. [`submit`] instead hands an operation to `cpu`'s worker and
//! returns at once with a [`Pending`]; the caller goes on and collects the value later with
//! [`Pending::wait`] or `.await`. [`submit_batch`] sends many operations in one go, to one or
//! several CPUs, one request per CPU (and per [`MAX_BLOCK_OPS`] operations): the serving
//! worker takes a batch as one queue entry, runs it in order, and publishes its end with one
//! store, so a batch moves a line in and a line out instead of a round trip per operation
//! (the flat-combining and delegation servers of ffwd and RCL work this way).
//!
//! ```
//! use corehop_runtime::{Runtime, Wake};
//! let rt = Runtime::builder().wake(Wake::Park).build().unwrap();
//! let cpu = *rt.cpus().last().unwrap();
//! // From any thread: start an operation on `cpu`, do something else, then collect it.
//! let pending = rt.submit(cpu, || (1..=10u64).sum::<u64>()).unwrap();
//! let squares = rt.submit_batch((0..100u64).map(|i| (cpu, move || i * i))).unwrap();
//! assert_eq!(pending.wait().unwrap(), 55);
//! assert_eq!(squares.wait().unwrap()[9], 81);
//! ```
//!
//! # Waiting
//! - **Inside a task**, waiting yields the worker to the other tasks ([`crate::yield_now`])
//!   between looks at the result, so the worker keeps serving its tasks and its own inbox.
//!   Inside a [`crate::no_hop_zone`], where the task may not yield, it serves its worker's
//!   inbox itself between looks (so waiting for work sent to its own CPU still finishes).
//! - **On any other thread**, waiting spins for a few microseconds, then sleeps on a futex.
//! - **In async code**, a `Pending` is a [`Future`]: the worker wakes the stored waker when
//!   the result is in, so tokio and other executors can `.await` work on a pinned CPU.
//! - **Inside an operation** (which runs on a worker outside any task), waiting would block
//!   that worker, perhaps for its own inbox: it fails with [`Error::WaitInOperation`]. An
//!   operation may still send more work with [`Runtime::submit`], but one that fills its own
//!   CPU's inbox waits for room that only its own worker could make.
//!
//! # Order, back-pressure, cancellation, shutdown
//! Operations sent to one CPU run in submission order, by that CPU's worker, between its
//! tasks; results come back in submission order. Each worker's inbox holds a bounded number
//! of requests; when it is full, `submit` waits (as above) until there is room, instead of
//! allocating more. Dropping a `Pending` does not withdraw the operation: it still runs, and
//! its result is dropped. A request that reaches a worker after that worker has exited (the
//! runtime shut down) is cancelled: its operations are dropped unrun and waiting gives
//! [`Error::ShutDown`]; a running runtime serves every request, including those its tasks
//! send while it shuts down. A panic in an operation resumes in the waiter.
//!
//! Under [`crate::Mechanism::Affinity`] a task runs on its home worker's thread wherever it
//! hops, so that worker serves nothing until the task ends: do not wait there for work sent
//! to the task's home CPU.

mod block;
mod inbox;

use std::future::Future;
use std::panic::resume_unwind;
use std::pin::Pin;
use std::ptr;
use std::sync::Arc;
use std::task::{Context, Poll};

use corehop_topology::CpuId;

use self::block::{Block, Completion, Item, Outcome, Results};
pub(crate) use self::inbox::Inbox;
use crate::context;
use crate::error::Error;
use crate::runtime::{Runtime, Shared};
use crate::sys;

/// Operations one request carries at most: a larger batch to one CPU goes as several
/// requests, so that a worker serving one still gets back to its tasks in bounded time.
pub const MAX_BLOCK_OPS: usize = 1024;

/// How long a thread that is not a task spins on a result before it sleeps: a little more
/// than a futex wake-up costs, so a result that comes within a wake-up's time is not slept on.
const SPIN_BEFORE_PARK_NS: u64 = 20_000;

/// Starts `f` on `cpu`'s worker and returns at once, from inside a task of the runtime; see
/// the [module docs](self) for how waiting, ordering and shutdown work.
///
/// Errors: [`Error::NotInTask`] outside a task (use [`Runtime::submit`] there),
/// [`Error::UnknownCpu`] for a CPU without a worker.
pub fn submit<F, T>(cpu: CpuId, f: F) -> Result<Pending<T>, Error>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let ctx = context::task().ok_or(Error::NotInTask)?;
    submit_to(&ctx.shared, cpu, f)
}

/// Starts every operation of `ops` on its CPU's worker and returns at once, from inside a
/// task: one request per CPU (and per [`MAX_BLOCK_OPS`] operations); each CPU runs its
/// operations in the order given, and [`PendingBatch::wait`] gives the results in that order.
///
/// Errors: as for [`submit`]; an unknown CPU anywhere in `ops` fails before anything is sent.
pub fn submit_batch<F, T, I>(ops: I) -> Result<PendingBatch<T>, Error>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
    I: IntoIterator<Item = (CpuId, F)>,
{
    let ctx = context::task().ok_or(Error::NotInTask)?;
    submit_batch_to(&ctx.shared, ops)
}

impl Runtime {
    /// [`submit`] from any thread: starts `f` on `cpu`'s worker and returns at once.
    pub fn submit<F, T>(&self, cpu: CpuId, f: F) -> Result<Pending<T>, Error>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        submit_to(self.shared(), cpu, f)
    }

    /// [`submit_batch`] from any thread.
    pub fn submit_batch<F, T, I>(&self, ops: I) -> Result<PendingBatch<T>, Error>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
        I: IntoIterator<Item = (CpuId, F)>,
    {
        submit_batch_to(self.shared(), ops)
    }
}

fn submit_to<F, T>(shared: &Shared, cpu: CpuId, f: F) -> Result<Pending<T>, Error>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let worker = shared.worker_of(cpu)?;
    let block = Arc::new(Block::new([Item::Op(f)]));
    send(shared, worker, block.clone());
    Ok(Pending { block: Some(block), cpu })
}

fn submit_batch_to<F, T, I>(shared: &Shared, ops: I) -> Result<PendingBatch<T>, Error>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
    I: IntoIterator<Item = (CpuId, F)>,
{
    let ops = ops.into_iter();
    let mut order = Vec::with_capacity(ops.size_hint().0);
    // The blocks in the order they were opened, each with its worker; none is sent before
    // every CPU has been checked.
    let mut blocks: Vec<(usize, Vec<Item<F, T>>)> = Vec::new();
    // Per worker, the block it is filling.
    let mut filling: Vec<Option<usize>> = vec![None; shared.workers.len()];
    for (cpu, op) in ops {
        let worker = shared.worker_of(cpu)?;
        let at = match filling[worker] {
            Some(at) if blocks[at].1.len() < MAX_BLOCK_OPS => at,
            _ => {
                blocks.push((worker, Vec::new()));
                filling[worker] = Some(blocks.len() - 1);
                blocks.len() - 1
            }
        };
        order.push(at);
        blocks[at].1.push(Item::Op(op));
    }
    let blocks = blocks
        .into_iter()
        .map(|(worker, items)| {
            // A lone operation travels as `submit` sends it: its item inside the block, so
            // the worker reads one allocation instead of two.
            let block: Arc<dyn Results<T>> = match <[_; 1]>::try_from(items) {
                Ok(one) => Arc::new(Block::new(one)),
                Err(items) => Arc::new(Block::new(items)),
            };
            send(shared, worker, block.clone());
            block
        })
        .collect();
    Ok(PendingBatch { blocks, order, taken: false })
}

/// Queues `request` in `worker`'s inbox (waiting for room while it is full) and wakes the
/// worker.
fn send(shared: &Shared, worker: usize, request: inbox::Request) {
    let slot = &shared.workers[worker];
    slot.inbox.push(request, pause);
    slot.mailbox.notify();
}

/// Who is waiting, which decides how.
#[derive(Clone, Copy)]
enum Waiter {
    Task,
    Thread,
}

impl Waiter {
    fn here() -> Result<Waiter, Error> {
        if context::task().is_some() {
            Ok(Waiter::Task)
        } else if context::here().is_some() {
            // A worker thread outside a task runs delegated operations only.
            Err(Error::WaitInOperation)
        } else {
            Ok(Waiter::Thread)
        }
    }

    /// Waits until `completion` has an outcome.
    fn wait(self, completion: &Completion) -> Outcome {
        match self {
            Waiter::Task => loop {
                if let Some(outcome) = completion.outcome() {
                    return outcome;
                }
                pause();
            },
            Waiter::Thread => {
                let start = sys::now_ns();
                loop {
                    if let Some(outcome) = completion.outcome() {
                        return outcome;
                    }
                    for _ in 0..32 {
                        sys::cpu_relax();
                    }
                    if sys::now_ns().saturating_sub(start) >= SPIN_BEFORE_PARK_NS {
                        return completion.park_until_done();
                    }
                }
            }
        }
    }
}

/// Lets something else run for a moment while waiting: a task yields its worker (or, where it
/// may not, serves that worker's inbox itself), another thread yields the CPU.
fn pause() {
    let Some((ctx, on)) = context::task_at() else {
        std::thread::yield_now();
        return;
    };
    if crate::yield_now().is_ok() {
        return;
    }
    // Inside a no-hop zone: serve the inbox of the worker this task runs on, as that worker
    // would, outside the task (an operation never runs as part of a task).
    let inbox = &ctx.shared.workers[on.at()].inbox;
    if inbox.has_requests() {
        context::install_task(ptr::null());
        inbox.serve();
        context::set_task(ctx);
    }
    sys::cpu_relax();
}

/// The result of an operation started with [`submit`]: [`Pending::wait`] for it, or `.await` it.
///
/// Dropping it leaves the operation to run; its result is dropped.
///
/// # Examples
/// Awaiting work on a pinned CPU from tokio (or any executor):
/// ```
/// use corehop_runtime::{Runtime, Wake};
/// let rt = Runtime::builder().wake(Wake::Park).build().unwrap();
/// let cpu = *rt.cpus().last().unwrap();
/// let tokio = tokio::runtime::Builder::new_current_thread().build().unwrap();
/// let sum = tokio.block_on(async {
///     let a = rt.submit(cpu, || 20u32).unwrap();
///     let b = rt.submit(cpu, || 22u32).unwrap();
///     a.await.unwrap() + b.await.unwrap()
/// });
/// assert_eq!(sum, 42);
/// ```
#[must_use = "an operation's result is dropped unless waited for"]
pub struct Pending<T> {
    /// `None` once the result has been taken.
    block: Option<Arc<dyn Results<T>>>,
    cpu: CpuId,
}

impl<T> Pending<T> {
    /// Waits for the operation's value (see the [module docs](self) for how). A panic in the
    /// operation resumes here.
    ///
    /// Errors: [`Error::ShutDown`] if the operation was cancelled unrun,
    /// [`Error::WaitInOperation`] inside another delegated operation.
    pub fn wait(mut self) -> Result<T, Error> {
        let waiter = Waiter::here()?;
        let outcome = waiter.wait(self.block().completion());
        self.take(outcome)
    }

    /// Whether the operation has finished (or been cancelled): `wait` would not wait.
    pub fn is_done(&self) -> bool {
        self.block.as_ref().is_none_or(|b| b.completion().outcome().is_some())
    }

    /// The CPU the operation runs on.
    pub fn cpu(&self) -> CpuId {
        self.cpu
    }

    fn block(&self) -> &Arc<dyn Results<T>> {
        self.block.as_ref().expect("a Pending's result is taken once")
    }

    fn take(&mut self, outcome: Outcome) -> Result<T, Error> {
        let block = self.block.take().expect("a Pending's result is taken once");
        if outcome == Outcome::Cancelled {
            return Err(Error::ShutDown);
        }
        let mut result = None;
        // SAFETY: this Pending is the block's only client, the outcome came from an acquire
        // of its state, and `block.take()` above makes this the only take.
        unsafe { block.take(&mut |r| result = Some(r)) };
        match result.expect("a single operation's block holds one result") {
            Ok(value) => Ok(value),
            Err(payload) => resume_unwind(payload),
        }
    }
}

impl<T> Future for Pending<T> {
    type Output = Result<T, Error>;

    /// Ready once the operation has finished; until then the waker is stored, and the worker
    /// that runs the operation wakes it. Polling again after `Ready` panics.
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.block().completion().register(cx.waker()) {
            Some(outcome) => Poll::Ready(self.take(outcome)),
            None => Poll::Pending,
        }
    }
}

impl<T> std::fmt::Debug for Pending<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending").field("cpu", &self.cpu).field("done", &self.is_done()).finish()
    }
}

/// The results of operations started with [`submit_batch`], in submission order.
///
/// Dropping it leaves the operations to run; their results are dropped.
#[must_use = "the operations' results are dropped unless waited for"]
pub struct PendingBatch<T> {
    /// One per request sent.
    blocks: Vec<Arc<dyn Results<T>>>,
    /// Per operation, in submission order, the index of its block.
    order: Vec<usize>,
    taken: bool,
}

impl<T> PendingBatch<T> {
    /// Waits for every operation and returns their values in submission order. A panic in an
    /// operation resumes here (the first one's, once all have finished).
    ///
    /// Errors: [`Error::ShutDown`] if any operation was cancelled unrun (the values of the
    /// others are dropped), [`Error::WaitInOperation`] inside another delegated operation.
    pub fn wait(mut self) -> Result<Vec<T>, Error> {
        let waiter = Waiter::here()?;
        // Every block waited for, so that nothing of the batch still runs when this returns.
        let mut cancelled = false;
        for block in &self.blocks {
            cancelled |= waiter.wait(block.completion()) == Outcome::Cancelled;
        }
        self.collect(cancelled)
    }

    /// How many operations the batch holds.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether the batch holds no operation.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Whether every operation has finished (or been cancelled): `wait` would not wait.
    pub fn is_done(&self) -> bool {
        self.blocks.iter().all(|b| b.completion().outcome().is_some())
    }

    /// The values in order, once every block has an outcome (acquired).
    fn collect(&mut self, cancelled: bool) -> Result<Vec<T>, Error> {
        assert!(!std::mem::replace(&mut self.taken, true), "a PendingBatch's results are taken once");
        if cancelled {
            return Err(Error::ShutDown);
        }
        let mut panic = None;
        let mut keep = |values: &mut Vec<T>, result: std::thread::Result<T>| match result {
            Ok(value) => values.push(value),
            Err(payload) => {
                panic.get_or_insert(payload);
            }
        };
        if let [only] = self.blocks.as_slice() {
            let mut values = Vec::with_capacity(self.order.len());
            // SAFETY: this batch is the block's only client, the block's outcome came from an
            // acquire of its state, and `taken` makes this the only take.
            unsafe { only.take(&mut |r| keep(&mut values, r)) };
            return match panic {
                Some(payload) => resume_unwind(payload),
                None => Ok(values),
            };
        }
        let mut per_block: Vec<std::vec::IntoIter<T>> = Vec::with_capacity(self.blocks.len());
        for block in &self.blocks {
            let mut values = Vec::new();
            // SAFETY: as above, for each block.
            unsafe { block.take(&mut |r| keep(&mut values, r)) };
            per_block.push(values.into_iter());
        }
        if let Some(payload) = panic {
            resume_unwind(payload);
        }
        Ok(self.order.iter().map(|&at| per_block[at].next().expect("one value per operation")).collect())
    }
}

impl<T> Future for PendingBatch<T> {
    type Output = Result<Vec<T>, Error>;

    /// Ready once every operation has finished; the waker is stored with each block not yet
    /// finished. Polling again after `Ready` panics.
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut cancelled = false;
        for block in &self.blocks {
            match block.completion().register(cx.waker()) {
                None => return Poll::Pending,
                Some(outcome) => cancelled |= outcome == Outcome::Cancelled,
            }
        }
        Poll::Ready(self.collect(cancelled))
    }
}

impl<T> std::fmt::Debug for PendingBatch<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingBatch")
            .field("ops", &self.order.len())
            .field("requests", &self.blocks.len())
            .field("done", &self.is_done())
            .finish()
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! The hand-off of blocks through an inbox (bounded, drained in batches, closed on exit)
    //! and the completion protocol (futex sleep, waker, dropped `Pending`), model-checked.
    //! Each model is small (two or three threads, an inbox of one block) and bounded in
    //! preemptions, as the mailbox's are.

    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use loom::sync::atomic::AtomicUsize;
    use loom::thread;

    use super::block::{Block, Item, Job, Outcome, Results};
    use super::inbox::Inbox;
    use super::*;
    use crate::sync::Ordering;

    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(3);
        model.check(f);
    }

    type Op = Box<dyn FnOnce() -> u32 + Send>;

    /// A block of operations returning `values`, each counting its run in `runs`.
    fn block(values: &[u32], runs: &Arc<AtomicUsize>) -> Arc<Block<Op, u32, Vec<Item<Op, u32>>>> {
        let items = values
            .iter()
            .map(|&v| {
                let runs = runs.clone();
                Item::Op(Box::new(move || {
                    runs.fetch_add(1, Ordering::Relaxed);
                    v
                }) as Op)
            })
            .collect();
        Arc::new(Block::new(items))
    }

    fn taken(block: &dyn Results<u32>) -> Vec<u32> {
        let mut values = Vec::new();
        // SAFETY: the models call this once per block, as its only client, after an outcome.
        unsafe { block.take(&mut |r| values.push(r.unwrap())) };
        values
    }

    /// Two clients each send a block of two operations through an inbox that holds one block
    /// (so one of them meets a full inbox and backs off), and sleep on their results; the
    /// worker serves whatever is there, in batches, until both are served. Every operation runs
    /// once, each client gets its own results in order, and no sleeper is left asleep.
    #[test]
    fn loom_batch_handoff_with_back_pressure_and_sleeping_clients() {
        model(|| {
            let inbox = Arc::new(Inbox::new());
            let runs = Arc::new(AtomicUsize::new(0));
            let clients: Vec<_> = [[1, 2], [3, 4]]
                .into_iter()
                .map(|values| {
                    let (inbox, runs) = (inbox.clone(), runs.clone());
                    thread::spawn(move || {
                        let block = block(&values, &runs);
                        inbox.push(block.clone(), thread::yield_now);
                        assert_eq!(block.completion().park_until_done(), Outcome::Ran);
                        assert_eq!(taken(&*block), values);
                    })
                })
                .collect();
            let mut served = 0;
            while served < 2 {
                match inbox.serve() {
                    0 => thread::yield_now(),
                    n => served += n,
                }
            }
            clients.into_iter().for_each(|c| c.join().unwrap());
            assert_eq!(runs.load(Ordering::Relaxed), 4);
        });
    }

    /// A client polls its `Pending` as a future while the worker completes it: whichever comes
    /// first, the waker stored is woken (loom reports a lost wake-up as a deadlock of
    /// `block_on`), and the value comes out once.
    #[test]
    fn loom_a_waker_stored_during_completion_is_woken() {
        model(|| {
            let runs = Arc::new(AtomicUsize::new(0));
            let block = block(&[7], &runs);
            let server = {
                let job: Arc<dyn Job> = block.clone();
                thread::spawn(move || job.run())
            };
            let pending = Pending::<u32> { block: Some(block), cpu: CpuId(0) };
            assert_eq!(loom::future::block_on(pending).unwrap(), 7);
            server.join().unwrap();
        });
    }

    /// A future polled with one waker and then another (moved between executors): the last
    /// one stored is the one woken.
    #[test]
    fn loom_a_replaced_waker_is_the_one_woken() {
        model(|| {
            let runs = Arc::new(AtomicUsize::new(0));
            let block = block(&[9], &runs);
            let mut pending = Pending::<u32> { block: Some(block.clone()), cpu: CpuId(0) };
            // A first poll with a waker that goes nowhere.
            let noop = std::task::Waker::noop();
            let first = Pin::new(&mut pending).poll(&mut Context::from_waker(noop));
            let server = thread::spawn(move || (block as Arc<dyn Job>).run());
            let value = match first {
                Poll::Ready(value) => value,
                Poll::Pending => loom::future::block_on(pending),
            };
            assert_eq!(value.unwrap(), 9);
            server.join().unwrap();
        });
    }

    /// Counts values alive, to check that nothing a block holds leaks.
    struct Counted(Arc<AtomicUsize>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The client drops its `Pending` while the worker runs the operation: the operation runs
    /// once, and its closure and result are freed once, by whichever side lets go last.
    #[test]
    fn loom_a_pending_dropped_while_served_frees_everything_once() {
        model(|| {
            let alive = Arc::new(AtomicUsize::new(2));
            let (captured, made) = (Counted(alive.clone()), alive.clone());
            let op = move || {
                let _keep = &captured;
                Counted(made)
            };
            let block = Arc::new(Block::new([Item::Op(op)]));
            let server = {
                let job: Arc<dyn Job> = block.clone();
                thread::spawn(move || job.run())
            };
            drop(Pending::<Counted> { block: Some(block), cpu: CpuId(0) });
            server.join().unwrap();
            assert_eq!(alive.load(Ordering::Relaxed), 0);
        });
    }

    /// A client pushes a block just as the worker serves one last time and closes its inbox:
    /// the block either runs (and its waiter gets the value) or is cancelled unrun (and its
    /// waiter learns so); it never stays in the inbox with its waiter asleep.
    #[test]
    fn loom_a_push_racing_the_close_is_served_or_cancelled() {
        model(|| {
            let inbox = Arc::new(Inbox::new());
            let runs = Arc::new(AtomicUsize::new(0));
            let worker = {
                let inbox = inbox.clone();
                thread::spawn(move || {
                    inbox.serve();
                    inbox.close();
                })
            };
            let block = block(&[5], &runs);
            inbox.push(block.clone(), thread::yield_now);
            match block.completion().park_until_done() {
                Outcome::Ran => {
                    assert_eq!(taken(&*block), [5]);
                    assert_eq!(runs.load(Ordering::Relaxed), 1);
                }
                Outcome::Cancelled => assert_eq!(runs.load(Ordering::Relaxed), 0),
            }
            worker.join().unwrap();
        });
    }
}
