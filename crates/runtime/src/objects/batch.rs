//! Batched operations: many operations, each run where its object lives, with one request per
//! CPU instead of a round trip per operation.
//!
//! [`Objects::read_batch`] and [`Objects::run_batch`] route every operation as
//! [`Objects::read`] and [`Objects::run`] do, but an operation whose object lives on another
//! CPU does not move its caller there: the operations bound for each CPU travel together, as
//! one [`submit`](crate::submit()) of at most [`MAX_GROUP_OPS`], which that CPU's worker runs
//! in order between its tasks. The caller runs the operations that stay where it is while
//! those requests are served, then waits for them, yielding its CPU to its other tasks (see
//! [`crate::submit`]). One hop then carries many operations, and its cost per operation is a
//! share of one request's: the placer weighs that share, measured, against the cache saving it
//! measured, so a route that pays only when batched is followed only by batches.
use std::hash::Hash;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use super::{route, Back, Countdown, Handle, LockedCell, ObjectError, Objects, Ran, Table};
use crate::sys;

/// Operations one request to one CPU carries at most: a worker serving a request runs it to
/// the end before its next task, so a request is kept short.
pub const MAX_GROUP_OPS: usize = 256;

/// How an operation of a batch is applied to its object's cell (exclusive for writes, shared
/// for reads of a replicated object); `true` asks for shared access. A function item, so
/// that it inlines.
trait Apply<T, F, R>: Fn(&LockedCell<T>, F, bool) -> R + Copy + Send + 'static {}
impl<T, F, R, A: Fn(&LockedCell<T>, F, bool) -> R + Copy + Send + 'static> Apply<T, F, R> for A {}

/// What a CPU sends back for one request: each operation's value and run time (ns), in order,
/// and how long the whole request took there.
struct GroupOut<R> {
    results: Vec<(R, u64)>,
    total_ns: u64,
}

/// Operations bound for one CPU, and where their values go.
struct Group<F> {
    cpu: usize,
    ops: Vec<(usize, F)>,
    positions: Vec<usize>,
}

/// A request's operations (object ids and operations), taken once: by the owner's worker
/// when it serves the request, or by the caller when the owner has not started it within
/// [`ObjectsConfig::take_back_after`](super::ObjectsConfig::take_back_after).
type Claim<F> = Arc<Mutex<Option<Vec<(usize, F)>>>>;

fn claim<F>(claim: &Claim<F>) -> Option<Vec<(usize, F)>> {
    claim.lock().unwrap_or_else(|e| e.into_inner()).take()
}

/// The request a group becomes: run on the target CPU's worker, outside any task; `None` if
/// the caller took the operations back.
fn serve<T, F, R>(
    table: Table<T>,
    ops: Claim<F>,
    apply: impl Apply<T, F, R>,
) -> impl FnOnce() -> Option<GroupOut<R>> + Send + 'static
where
    T: Send + Sync + 'static,
    F: Send + 'static,
    R: Send + 'static,
{
    move || {
        let start = sys::now_ns();
        let ops = claim(&ops)?;
        // Handles cloned here, on the CPU that uses them: a clone on the caller's CPU would
        // bounce each object's reference count between the two CPUs.
        let handles: Vec<Handle<T>> = {
            let table = table.read().unwrap_or_else(|e| e.into_inner());
            ops.iter().map(|(id, _)| table[*id].clone()).collect()
        };
        handles.iter().for_each(|h| h.prefetch());
        let mut results = Vec::with_capacity(ops.len());
        let mut last = sys::now_ns();
        for ((_, op), object) in ops.into_iter().zip(&handles) {
            let value = apply(&object.cell, op, false);
            let now = sys::now_ns();
            results.push((value, now.saturating_sub(last)));
            last = now;
        }
        Some(GroupOut { results, total_ns: sys::now_ns().saturating_sub(start) })
    }
}

/// How a request ended for its caller.
enum Outcome<F, R> {
    Served(GroupOut<R>),
    TakenBack(Vec<(usize, F)>),
}

/// Waits for a request, yielding, and takes its operations back if its CPU has not started it
/// `take_back_ns` after `sent_ns` (that CPU is not running: the host descheduled it).
fn wait_or_take_back<F, R>(
    pending: crate::Pending<Option<GroupOut<R>>>,
    ops: &Claim<F>,
    sent_ns: u64,
    take_back_ns: Option<u64>,
) -> Result<Outcome<F, R>, crate::Error> {
    if let Some(after) = take_back_ns {
        while !pending.is_done() {
            if sys::now_ns().saturating_sub(sent_ns) >= after {
                if let Some(ops) = claim(ops) {
                    // The request still runs there later, as a no-op.
                    drop(pending);
                    return Ok(Outcome::TakenBack(ops));
                }
                break;
            }
            if crate::yield_now().is_err() {
                break;
            }
        }
    }
    match pending.wait()? {
        Some(out) => Ok(Outcome::Served(out)),
        None => unreachable!("only this caller takes a request's operations back, and it did not"),
    }
}

impl<K: Hash + Eq, T: Send + Sync + 'static> Objects<K, T> {
    /// Runs read-only operations, each where its object lives, and returns their values in the
    /// order given. Inside a corehop task, the operations for each other CPU go there as one
    /// request (of at most [`MAX_GROUP_OPS`]) instead of a hop each, the others run here
    /// meanwhile, and the task waits for the requests by yielding to its CPU's other tasks.
    /// On any other thread each operation runs as [`Objects::read_handle`] runs it.
    ///
    /// Operations on one object run in the order given; operations on different objects may
    /// run in any order, on several CPUs at once. A panic in an operation resumes here; the
    /// requests still in flight then run on, and their values are dropped.
    ///
    /// Errors: [`ObjectError::Hop`] if an object's CPU has no worker in the caller's runtime
    /// (then nothing has run), or if the runtime shut down before serving a request (then the
    /// operations that stayed here have run, and that request's have not).
    pub fn read_batch<'a, F, R>(
        &self,
        ops: impl IntoIterator<Item = (&'a Handle<T>, F)>,
    ) -> Result<Vec<R>, ObjectError>
    where
        F: FnOnce(&T) -> R + Send + 'static,
        R: Send + 'static,
    {
        fn apply<T, F: FnOnce(&T) -> R, R>(cell: &LockedCell<T>, op: F, shared: bool) -> R {
            if shared {
                cell.shared(op)
            } else {
                cell.exclusive(|v| op(v))
            }
        }
        self.batch(ops, false, apply::<T, F, R>)
    }

    /// Runs writing operations, each where its object lives, as [`Objects::read_batch`] runs
    /// read-only ones; see there.
    pub fn run_batch<'a, F, R>(
        &self,
        ops: impl IntoIterator<Item = (&'a Handle<T>, F)>,
    ) -> Result<Vec<R>, ObjectError>
    where
        F: FnOnce(&mut T) -> R + Send + 'static,
        R: Send + 'static,
    {
        fn apply<T, F: FnOnce(&mut T) -> R, R>(cell: &LockedCell<T>, op: F, _shared: bool) -> R {
            cell.exclusive(op)
        }
        self.batch(ops, true, apply::<T, F, R>)
    }

    fn batch<'a, F, R>(
        &self,
        ops: impl IntoIterator<Item = (&'a Handle<T>, F)>,
        write: bool,
        apply: impl Apply<T, F, R>,
    ) -> Result<Vec<R>, ObjectError>
    where
        F: Send + 'static,
        R: Send + 'static,
    {
        let ops = ops.into_iter();
        if self.all_stay() {
            // Every operation runs here, in order, with no request to build: as cheap as a
            // plain loop, sampled as single operations are.
            let mut countdown = Countdown::take(self.sample_every());
            let _zone = super::OpZone::enter();
            let results = ops
                .map(|(object, op)| {
                    object.prefetch();
                    let replicated = route::is_replicated(object.route.load(Ordering::Relaxed));
                    if !countdown.next() {
                        return apply(&object.cell, op, !write && replicated);
                    }
                    let t0 = sys::now_ns();
                    let value = apply(&object.cell, op, !write && replicated);
                    let t1 = sys::now_ns();
                    let ran = Ran {
                        index: self.here(),
                        routed: false,
                        batched: false,
                        hop_ns: 0,
                        back: Back::Stay,
                    };
                    self.account(object, &ran, t0, t1, write, countdown.weight());
                    value
                })
                .collect();
            countdown.put_back();
            return Ok(results);
        }
        if !crate::in_task() {
            // No worker of ours to hand a request to without waiting on it in place.
            return ops
                .map(|(object, op)| {
                    self.operate(object, write, move |cell, replicated| apply(cell, op, !write && replicated))
                })
                .collect();
        }
        let start = sys::now_ns();
        let here = crate::try_current_cpu().and_then(|cpu| self.cpus.iter().position(|c| c.id == cpu));
        let domain = here.map(|i| self.cpus[i].domain);
        let moving = self.moving.load(Ordering::Relaxed);
        let mut local = Vec::new();
        let mut groups: Vec<Group<F>> = Vec::new();
        // Per CPU index, the group filling for it.
        let mut filling: Vec<Option<usize>> = vec![None; self.cpus.len()];
        let mut objects: Vec<&Handle<T>> = Vec::with_capacity(ops.size_hint().0);
        for (position, (object, op)) in ops.enumerate() {
            objects.push(object);
            let code = route::followed(object.route.load(Ordering::Acquire), moving, true);
            match route::target(code, domain) {
                Some(cpu) if Some(cpu) != here => {
                    let at = match filling[cpu] {
                        Some(at) if groups[at].ops.len() < MAX_GROUP_OPS => at,
                        _ => {
                            groups.push(Group { cpu, ops: Vec::new(), positions: Vec::new() });
                            filling[cpu] = Some(groups.len() - 1);
                            groups.len() - 1
                        }
                    };
                    groups[at].ops.push((object.id.0, op));
                    groups[at].positions.push(position);
                }
                target => {
                    // Run here: its data is fetched while the rest of the batch is sorted.
                    object.prefetch();
                    local.push((position, object, op, target.is_some(), route::is_replicated(code)))
                }
            }
        }
        // Every CPU checked before anything is sent or run.
        if let Some(ctx) = crate::context::task() {
            for g in &groups {
                let cpu = self.cpus[g.cpu].id;
                ctx.shared.worker_of(cpu).map_err(|source| ObjectError::Hop { cpu, source })?;
            }
        }
        let mut sent = Vec::with_capacity(groups.len());
        for g in groups {
            let cpu = self.cpus[g.cpu].id;
            let ops: Claim<F> = Arc::new(Mutex::new(Some(g.ops)));
            let pending = crate::submit(cpu, serve(Arc::clone(&self.all), Arc::clone(&ops), apply))
                .map_err(|source| ObjectError::Hop { cpu, source })?;
            sent.push((g.cpu, g.positions, pending, ops));
        }
        let sent_ns = sys::now_ns();
        let send_ns = sys::now_ns().saturating_sub(start);
        let mut results: Vec<Option<R>> = objects.iter().map(|_| None).collect();
        let mut countdown = Countdown::take(self.sample_every());
        {
            let _zone = crate::no_hop_zone();
            for (position, object, op, routed, replicated) in local {
                let sampled = countdown.next();
                let t0 = if sampled { sys::now_ns() } else { 0 };
                let value = apply(&object.cell, op, !write && replicated);
                if sampled {
                    let ran = Ran { index: here, routed, batched: false, hop_ns: 0, back: Back::Stay };
                    self.account(object, &ran, t0, sys::now_ns(), write, countdown.weight());
                }
                results[position] = Some(value);
            }
        }
        let mut remote = 0;
        let mut outs = Vec::with_capacity(sent.len());
        let mut failed = None;
        for (cpu, positions, pending, ops) in sent {
            match wait_or_take_back(pending, &ops, sent_ns, self.take_back_ns) {
                Ok(Outcome::Served(out)) => {
                    remote += positions.len();
                    outs.push((cpu, positions, out));
                }
                Ok(Outcome::TakenBack(ops)) => {
                    let _zone = crate::no_hop_zone();
                    for ((_, op), position) in ops.into_iter().zip(positions) {
                        let object = objects[position];
                        let sampled = countdown.next();
                        let t0 = if sampled { sys::now_ns() } else { 0 };
                        results[position] = Some(apply(&object.cell, op, false));
                        if sampled {
                            let ran = Ran {
                                index: here,
                                routed: false,
                                batched: false,
                                hop_ns: 0,
                                back: Back::Stay,
                            };
                            self.account(object, &ran, t0, sys::now_ns(), write, countdown.weight());
                        }
                    }
                }
                Err(source) => {
                    failed.get_or_insert(ObjectError::Hop { cpu: self.cpus[cpu].id, source });
                }
            }
        }
        if let Some(error) = failed {
            return Err(error);
        }
        let collect_start = sys::now_ns();
        let mut owner_overhead_ns = 0;
        let mut timed = Vec::new();
        for (cpu, positions, out) in outs {
            let run_ns: u64 = out.results.iter().map(|(_, ns)| ns).sum();
            owner_overhead_ns += out.total_ns.saturating_sub(run_ns);
            for (position, (value, ns)) in positions.into_iter().zip(out.results) {
                if countdown.next() {
                    timed.push((cpu, position, ns));
                }
                results[position] = Some(value);
            }
        }
        if remote > 0 {
            // A remote operation's move costs its share of the CPU time the requests took
            // beyond the operations themselves: building and sending them here, unpacking
            // them there, and collecting their values here. Waiting costs nothing: this CPU
            // ran its other tasks meanwhile.
            let end = sys::now_ns();
            let spent = send_ns + end.saturating_sub(collect_start) + owner_overhead_ns;
            let hop_ns = spent / remote as u64;
            for (cpu, position, ns) in timed {
                let ran = Ran { index: Some(cpu), routed: true, batched: true, hop_ns, back: Back::Stay };
                self.account(objects[position], &ran, end.saturating_sub(ns), end, write, countdown.weight());
            }
        }
        countdown.put_back();
        self.let_others_run();
        Ok(results.into_iter().map(|v| v.expect("every operation of a batch ran")).collect())
    }
}
