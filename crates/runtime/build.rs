//! Sets `corehop_own_switch` where tasks use our own x86-64 stack switch (see `fiber`): on
//! x86-64, unless `--cfg corehop_portable_fibers` asks for corosensei or `--cfg loom` models
//! the mailbox (loom's atomics are not the plain words the switch writes).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(corehop_own_switch)");
    println!("cargo::rerun-if-changed=build.rs");
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let portable = std::env::var_os("CARGO_CFG_COREHOP_PORTABLE_FIBERS").is_some();
    let loom = std::env::var_os("CARGO_CFG_LOOM").is_some();
    if arch == "x86_64" && !portable && !loom {
        println!("cargo::rustc-cfg=corehop_own_switch");
    }
}
