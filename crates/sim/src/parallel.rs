//! Running many independent simulations at once: a sweep's points on every local core.
//!
//! Each point is a whole simulation with its own seed, so points share nothing and can run in
//! any order on any thread; results come back in point order, identical to a serial run.
//! `corehop sim --jobs` and the Python package both run sweeps through here.

use rayon::prelude::*;

use crate::scenario::{Point, ScenarioError};
use crate::stats::Report;

/// The number of CPUs this process may run on (its affinity mask and cgroup quota), at least 1.
pub fn available_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// Calls `f(index, item)` for every item on `threads` threads (0: [`available_threads`]) and
/// returns the results in item order. With one thread, or one item, everything runs on the
/// calling thread in order. `f` runs concurrently on several items; a panic in `f` reaches
/// the caller once the items already started are done.
pub fn map_points<T, R, F>(items: &[T], threads: usize, f: F) -> Vec<R>
where
    T: Sync,
    R: Send,
    F: Fn(usize, &T) -> R + Sync,
{
    let threads = if threads == 0 { available_threads() } else { threads };
    if threads <= 1 || items.len() <= 1 {
        return items.iter().enumerate().map(|(i, item)| f(i, item)).collect();
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.min(items.len()))
        .thread_name(|i| format!("corehop-sim-{i}"))
        .build()
        .expect("a thread pool of a few threads can be built");
    // One point per task: points differ in cost by orders of magnitude, so let idle threads
    // take single points rather than halves of what is left.
    pool.install(|| items.par_iter().with_max_len(1).enumerate().map(|(i, item)| f(i, item)).collect())
}

/// Runs every point's scenario on `threads` threads (0: every available CPU) and returns one
/// result per point, in point order: the same reports, byte for byte, as running them one
/// after another. `done(index)` is called as each point finishes (in completion order), e.g.
/// to advance a progress bar.
pub fn run_points(
    points: &[Point],
    threads: usize,
    done: impl Fn(usize) + Sync,
) -> Vec<Result<Report, ScenarioError>> {
    map_points(points, threads, |i, point| {
        let report = crate::models::run_scenario(&point.scenario, &mut |_| {});
        done(i);
        report
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ScenarioDoc, Sweep};

    const OFFLOAD: &str = include_str!("../../../scenarios/offload-threshold.toml");

    fn points() -> Vec<Point> {
        let mut doc = ScenarioDoc::parse("offload-threshold.toml", OFFLOAD).unwrap();
        doc.set("workload.iterations=300").unwrap();
        doc.expand(&[Sweep::parse("seed=1,2").unwrap()]).unwrap()
    }

    fn json(results: &[Result<Report, ScenarioError>]) -> String {
        let reports: Vec<&Report> = results.iter().map(|r| r.as_ref().unwrap()).collect();
        serde_json::to_string(&reports).unwrap()
    }

    #[test]
    fn parallel_reports_equal_serial_ones_in_point_order() {
        let points = points();
        assert_eq!(points.len(), 48);
        let serial = run_points(&points, 1, |_| {});
        let finished = std::sync::Mutex::new(Vec::new());
        let parallel = run_points(&points, 4, |i| finished.lock().unwrap().push(i));
        assert_eq!(json(&serial), json(&parallel));
        let mut finished = finished.into_inner().unwrap();
        finished.sort_unstable();
        assert_eq!(finished, (0..points.len()).collect::<Vec<_>>(), "every point reported done once");
        // The points differ (the sweep is not 48 copies of one run).
        let first = serial[0].as_ref().unwrap();
        assert!(serial.iter().any(|r| r.as_ref().unwrap().model != first.model));
    }

    #[test]
    fn a_failing_point_does_not_stop_the_others() {
        let mut points = points();
        points.truncate(3);
        // A workload the model rejects at build time: the error comes back for that point only.
        let mut bad = ScenarioDoc::parse("offload-threshold.toml", OFFLOAD).unwrap();
        bad.set("workload.app_cpus=[7]").unwrap();
        let bad = bad.validate().unwrap();
        points[1].scenario = bad;
        let results = run_points(&points, 2, |_| {});
        assert!(results[0].is_ok() && results[2].is_ok());
        let e = results[1].as_ref().unwrap_err();
        assert_eq!(e.key, "workload.app_cpus[0]", "{e}");
    }

    #[test]
    fn map_points_keeps_item_order() {
        let items: Vec<u64> = (0..200).collect();
        for threads in [0, 1, 3] {
            let out = map_points(&items, threads, |i, x| (i as u64, x * x));
            assert!(out.iter().enumerate().all(|(i, &(j, sq))| j == i as u64 && sq == (i * i) as u64));
        }
    }
}
