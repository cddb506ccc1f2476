use corehop_runtime::{sys, yield_now, Runtime, Wake};
fn main() {
    let rt = Runtime::builder().wake(Wake::Spin).cpus([corehop_topology::CpuId(0)]).build().unwrap();
    let a = rt.cpus()[0];
    let y = rt
        .block_on(a, move || {
            let n: u64 = std::env::var("N").ok().and_then(|v| v.parse().ok()).unwrap_or(50_000_000);
            let t0 = sys::now_ns();
            for _ in 0..n {
                yield_now().unwrap();
            }
            (sys::now_ns() - t0) as f64 / n as f64
        })
        .unwrap();
    println!("yield {y:.1} ns");
}
