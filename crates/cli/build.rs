//! Links the unwinder statically (libgcc_eh) into `corehop`, as the preload library does, so
//! that it does not load libgcc_s.so, which Rust's std otherwise needs: loading it (and the
//! CPUID probes of its constructor, 3.5 µs each under KVM) was 130-145 µs of each
//! `corehop run`'s start here (docs/performance.md). With the unwinder inside, the linker's
//! --as-needed drops libgcc_s.
fn main() {
    let target = std::env::var("TARGET").unwrap_or_default();
    if target.ends_with("-linux-gnu") {
        println!("cargo:rustc-link-lib=static:+whole-archive,-bundle=gcc_eh");
    }
}
