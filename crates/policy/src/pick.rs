//! Which of several CPUs a hop should go to (the fast-core-switching paper, §9.2).
//!
//! When a set of CPUs could serve a hop (several service cores), the paper's `SelectOSCore`
//! is controlled by three settings, kept here under their corehop names:
//!
//! - **work-conserving** (WC): do not send work to a busy CPU while another candidate is idle;
//! - **affinity** (AF): go back to the CPU chosen last time (its caches are warm) instead of
//!   cycling round-robin over the set for load balance;
//! - **prefer-affinity** (PA): when AF and WC disagree (the previous CPU is busy but another is
//!   idle), keep the previous CPU anyway.
//!
//! Pure: the caller passes what it knows about the candidates (queue length, idle flag) and a
//! [`PickState`] that carries the previous choice and the round-robin cursor between calls.
//!
//! # Examples
//! ```
//! use corehop_policy::pick::{Candidate, Pick, PickState};
//! use corehop_topology::CpuId;
//! let cands = [Candidate::busy(CpuId(2), 3), Candidate::idle(CpuId(3))];
//! let mut state = PickState::default();
//! let wc = Pick { work_conserving: true, affinity: true, prefer_affinity: false };
//! assert_eq!(wc.pick(&cands, &mut state), Some(CpuId(3)));
//! ```

use corehop_topology::CpuId;
use serde::{Deserialize, Serialize};

/// The three policy settings of §9.2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Pick {
    /// WC: never pick a busy CPU while a candidate is idle (unless PA keeps the previous one).
    pub work_conserving: bool,
    /// AF: return to the previous choice when it is still a candidate; otherwise round-robin.
    pub affinity: bool,
    /// PA: with AF and WC, the previous CPU wins even when it is busy and another is idle.
    pub prefer_affinity: bool,
}

/// What the caller knows about one CPU that could serve the hop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Candidate {
    /// The CPU.
    pub cpu: CpuId,
    /// Work queued or running there.
    pub queue_len: usize,
    /// Nothing running or queued there.
    pub idle: bool,
}

impl Candidate {
    /// An idle CPU (empty queue).
    pub fn idle(cpu: CpuId) -> Self {
        Candidate { cpu, queue_len: 0, idle: true }
    }

    /// A busy CPU with `queue_len` items queued or running.
    pub fn busy(cpu: CpuId, queue_len: usize) -> Self {
        Candidate { cpu, queue_len, idle: false }
    }
}

/// What a caller carries from one pick to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct PickState {
    /// The CPU picked last time (what AF sticks to).
    pub previous: Option<CpuId>,
    /// The round-robin cursor: index into the candidate list of the next round-robin pick.
    pub cursor: usize,
}

impl Pick {
    /// Static binding to one CPU of the set, round-robin, no work conservation.
    pub const ROUND_ROBIN: Pick = Pick { work_conserving: false, affinity: false, prefer_affinity: false };

    /// Chooses a CPU among `candidates` (none if the list is empty) and records it in `state`.
    pub fn pick(&self, candidates: &[Candidate], state: &mut PickState) -> Option<CpuId> {
        let n = candidates.len();
        if n == 0 {
            return None;
        }
        let previous = state.previous.and_then(|p| candidates.iter().position(|c| c.cpu == p));
        let sticky = if self.affinity { previous } else { None };
        let mut choice = match sticky {
            Some(i) => i,
            None => {
                let i = state.cursor % n;
                state.cursor = (i + 1) % n;
                i
            }
        };
        let keep_for_affinity = self.prefer_affinity && sticky == Some(choice);
        if self.work_conserving && !candidates[choice].idle && !keep_for_affinity {
            // The first idle candidate after the tentative choice, in cyclic order, so that
            // round-robin still spreads work over the idle ones.
            if let Some(idle) = (1..n).map(|k| (choice + k) % n).find(|&i| candidates[i].idle) {
                choice = idle;
                if sticky.is_none() {
                    state.cursor = (idle + 1) % n;
                }
            }
        }
        state.previous = Some(candidates[choice].cpu);
        Some(candidates[choice].cpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn all_settings() -> impl Iterator<Item = Pick> {
        (0..8).map(|b| Pick {
            work_conserving: b & 1 != 0,
            affinity: b & 2 != 0,
            prefer_affinity: b & 4 != 0,
        })
    }

    #[test]
    fn empty_set_picks_nothing() {
        for p in all_settings() {
            assert_eq!(p.pick(&[], &mut PickState::default()), None);
        }
    }

    #[test]
    fn round_robin_cycles() {
        let cands: Vec<_> = (0..3).map(|i| Candidate::busy(CpuId(i + 4), 1)).collect();
        let mut s = PickState::default();
        let picks: Vec<_> = (0..6).map(|_| Pick::ROUND_ROBIN.pick(&cands, &mut s).unwrap().0).collect();
        assert_eq!(picks, [4, 5, 6, 4, 5, 6]);
    }

    #[test]
    fn affinity_sticks_and_falls_back_to_round_robin() {
        let af = Pick { affinity: true, ..Pick::default() };
        let cands = [Candidate::idle(CpuId(1)), Candidate::idle(CpuId(2))];
        let mut s = PickState { previous: Some(CpuId(2)), cursor: 0 };
        assert_eq!(af.pick(&cands, &mut s), Some(CpuId(2)));
        assert_eq!(af.pick(&cands, &mut s), Some(CpuId(2)));
        // Previous CPU no longer a candidate: round-robin, then stick to the new one.
        let mut s = PickState { previous: Some(CpuId(9)), cursor: 1 };
        assert_eq!(af.pick(&cands, &mut s), Some(CpuId(2)));
        assert_eq!(af.pick(&cands, &mut s), Some(CpuId(2)));
    }

    #[test]
    fn work_conserving_leaves_a_busy_previous_cpu_unless_prefer_affinity() {
        let cands = [Candidate::busy(CpuId(1), 2), Candidate::idle(CpuId(2))];
        let prev = PickState { previous: Some(CpuId(1)), cursor: 0 };
        let wc_af = Pick { work_conserving: true, affinity: true, prefer_affinity: false };
        assert_eq!(wc_af.pick(&cands, &mut prev.clone()), Some(CpuId(2)));
        let pa = Pick { prefer_affinity: true, ..wc_af };
        assert_eq!(pa.pick(&cands, &mut prev.clone()), Some(CpuId(1)));
    }

    #[test]
    fn work_conserving_with_all_busy_still_picks() {
        let cands = [Candidate::busy(CpuId(0), 1), Candidate::busy(CpuId(1), 5)];
        let wc = Pick { work_conserving: true, ..Pick::default() };
        let mut s = PickState::default();
        assert_eq!(wc.pick(&cands, &mut s), Some(CpuId(0)));
        assert_eq!(wc.pick(&cands, &mut s), Some(CpuId(1)));
    }

    fn candidates() -> impl Strategy<Value = Vec<Candidate>> {
        proptest::collection::btree_set(0usize..32, 1..8).prop_flat_map(|cpus| {
            let cpus: Vec<_> = cpus.into_iter().collect();
            let n = cpus.len();
            proptest::collection::vec((0usize..4, any::<bool>()), n).prop_map(move |loads| {
                cpus.iter()
                    .zip(loads)
                    .map(|(&c, (q, idle))| Candidate {
                        cpu: CpuId(c),
                        queue_len: if idle { 0 } else { q + 1 },
                        idle,
                    })
                    .collect()
            })
        })
    }

    proptest! {
        #[test]
        fn picks_respect_the_settings(
            cands in candidates(),
            bits in 0u8..8,
            prev in proptest::option::of(0usize..32),
            cursor in 0usize..100,
        ) {
            let p = Pick { work_conserving: bits & 1 != 0, affinity: bits & 2 != 0, prefer_affinity: bits & 4 != 0 };
            let before = PickState { previous: prev.map(CpuId), cursor };
            let mut s = before;
            let chosen = p.pick(&cands, &mut s).unwrap();
            let c = cands.iter().find(|c| c.cpu == chosen);
            prop_assert!(c.is_some(), "picked a CPU outside the set");
            let c = c.unwrap();
            prop_assert_eq!(s.previous, Some(chosen));
            let any_idle = cands.iter().any(|c| c.idle);
            let prev_in_set = before.previous.filter(|p| cands.iter().any(|c| c.cpu == *p));
            if p.work_conserving && any_idle && !(p.affinity && p.prefer_affinity && prev_in_set.is_some()) {
                prop_assert!(c.idle, "work-conserving picked a busy CPU while one was idle");
            }
            if p.affinity {
                if let Some(prev) = prev_in_set {
                    let prev_idle = cands.iter().any(|c| c.cpu == prev && c.idle);
                    if !p.work_conserving || prev_idle || p.prefer_affinity {
                        prop_assert_eq!(chosen, prev, "affinity did not stick");
                    }
                }
            }
        }

        #[test]
        fn round_robin_visits_every_candidate_once_per_cycle(cands in candidates(), cursor in 0usize..100) {
            let mut s = PickState { previous: None, cursor };
            let mut seen: Vec<_> = (0..cands.len()).map(|_| Pick::ROUND_ROBIN.pick(&cands, &mut s).unwrap()).collect();
            seen.sort();
            let mut all: Vec<_> = cands.iter().map(|c| c.cpu).collect();
            all.sort();
            prop_assert_eq!(seen, all);
        }
    }
}
