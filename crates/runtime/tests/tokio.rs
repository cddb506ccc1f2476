//! Async Rust awaiting work delegated to pinned CPUs: a `Pending` is a `Future`, woken by the
//! worker that ran the operation, under tokio's schedulers. (Tokio does not build under
//! `--cfg loom`, so neither does this file.)
#![cfg(not(loom))]

use corehop_runtime::{current_cpu, Runtime, Wake};

fn runtime() -> Runtime {
    Runtime::builder().wake(Wake::SpinThenPark).build().expect("runtime on this host")
}

#[tokio::test(flavor = "current_thread")]
async fn tokio_awaits_operations_delegated_to_pinned_cpus() {
    let rt = runtime();
    let (a, b) = (rt.cpus()[0], *rt.cpus().last().unwrap());
    // Several in flight at once, awaited together.
    let (x, y, batch) = tokio::join!(
        rt.submit(a, current_cpu).unwrap(),
        rt.submit(b, || (1..=100u64).sum::<u64>()).unwrap(),
        rt.submit_batch((0..64u32).map(|i| (if i % 2 == 0 { a } else { b }, move || (i, current_cpu()))))
            .unwrap(),
    );
    assert_eq!((x.unwrap(), y.unwrap()), (a, 5050));
    for (i, (value, cpu)) in batch.unwrap().into_iter().enumerate() {
        assert_eq!((value as usize, cpu), (i, if i % 2 == 0 { a } else { b }));
    }
}

#[test]
fn a_tokio_task_is_woken_when_slow_delegated_work_finishes() {
    let rt = runtime();
    let b = *rt.cpus().last().unwrap();
    let tokio = tokio::runtime::Builder::new_current_thread().build().unwrap();
    // The operation outlasts the first poll, so the waker must be stored and woken.
    let got = tokio.block_on(async {
        let pending = rt.submit(b, || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            current_cpu()
        });
        pending.unwrap().await
    });
    assert_eq!(got.unwrap(), b);
    // Awaited one after another on a spawned tokio task as well.
    let rt = std::sync::Arc::new(rt);
    let r = rt.clone();
    let sum = tokio.block_on(async move {
        tokio::spawn(async move {
            let mut sum = 0u64;
            for i in 0..200u64 {
                sum += r.submit(b, move || i).unwrap().await.unwrap();
            }
            sum
        })
        .await
        .unwrap()
    });
    assert_eq!(sum, (0..200).sum::<u64>());
}
