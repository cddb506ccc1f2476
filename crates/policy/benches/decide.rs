//! What each offload policy costs a call that stays where it is (criterion): the driver's
//! pattern of `corehop_runtime::service::Offloader`, over a file server's calls (receive, open,
//! fstat, send, sendfile), none of which pays for a move. `never` is the floor; `measured` and
//! `adaptive` (the default of `corehop run --offload`) add their bookkeeping. Each iteration is
//! one epoch of 1500 calls, and the policy lives on across iterations, as in a long run.

use corehop_policy::offload::{
    Adaptive, CallCost, CallDesc, CallKind, Decision, Measured, MeasuredConfig, OffloadPolicy, Predicted,
    StaticProfile, TableForm, DEFAULT_SIZE_THRESHOLD,
};
use corehop_policy::payoff::PayoffConfig;
use criterion::{criterion_group, criterion_main, Criterion};

/// Calls an epoch: about what a 20 ms epoch of `corehop bench offload`'s file server makes.
const EPOCH_CALLS: usize = 1500;
/// The move cost the policies start from, in ns.
const MOVE_PRIOR: u64 = 20_000;
/// The driver shows a policy one short local call in this many, and every long one.
const SHOW_SHORT_EVERY: u32 = 16;

fn measured() -> OffloadPolicy {
    let config =
        MeasuredConfig { move_prior: MOVE_PRIOR, first_move_prior: MOVE_PRIOR, ..MeasuredConfig::default() };
    OffloadPolicy::Measured(Box::new(Measured::new(config).expect("measured")))
}

fn adaptive() -> OffloadPolicy {
    let arms = vec![
        measured(),
        OffloadPolicy::Always,
        OffloadPolicy::SizeThreshold { bytes: DEFAULT_SIZE_THRESHOLD },
        OffloadPolicy::StaticProfile(StaticProfile::of_kinds([CallKind::Sendfile], MOVE_PRIOR)),
        OffloadPolicy::Predicted(Box::new(
            Predicted::fixed(TableForm::TIMED, MOVE_PRIOR).expect("predicted"),
        )),
    ];
    OffloadPolicy::Adaptive(Box::new(Adaptive::new(arms, PayoffConfig::default()).expect("adaptive")))
}

/// One request's calls: (kind, size, run in ns).
const REQUEST: [(CallKind, u64, u64); 5] = [
    (CallKind::Recvfrom, 8, 2_000),
    (CallKind::Openat, 0, 3_000),
    (CallKind::Fstat, 0, 1_000),
    (CallKind::Sendto, 8, 5_000),
    (CallKind::Sendfile, 65_536, 30_000),
];

/// Runs one epoch of calls through `policy` as the offloader does, every call local.
fn epoch(policy: &mut OffloadPolicy, until_shown: &mut u32, jitter: &mut u64) -> usize {
    let mut stayed = 0;
    for i in 0..EPOCH_CALLS {
        let (kind, size, run) = REQUEST[i % REQUEST.len()];
        let call = CallDesc::new(kind, 5, size, 0x1000 + 64 * (i % REQUEST.len()) as u64);
        if policy.keeps_all_local() || policy.decide(&call, 0) == Decision::Local {
            stayed += 1;
        }
        *jitter = jitter.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let run = run + (*jitter >> 54);
        if run >= MOVE_PRIOR || *until_shown == 0 {
            *until_shown = SHOW_SHORT_EVERY - 1;
            policy.observe(&call, CallCost::local(run));
        } else {
            *until_shown -= 1;
        }
    }
    if policy.wants_epochs() {
        policy.epoch_end((EPOCH_CALLS / REQUEST.len()) as f64, 20_000_000);
    }
    stayed
}

fn policies(c: &mut Criterion) {
    let mut group = c.benchmark_group("stay_epoch_1500_calls");
    for (name, make) in [
        ("never", (|| OffloadPolicy::Never) as fn() -> OffloadPolicy),
        ("measured", measured),
        ("adaptive", adaptive),
    ] {
        let mut policy = make();
        let (mut until_shown, mut jitter) = (0, 1);
        group.bench_function(name, |b| {
            b.iter(|| std::hint::black_box(epoch(&mut policy, &mut until_shown, &mut jitter)))
        });
    }
    group.finish();
}

criterion_group!(benches, policies);
criterion_main!(benches);
