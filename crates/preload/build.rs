//! Links the unwinder statically (libgcc_eh) into the library, so that a program under
//! `corehop run` does not load libgcc_s.so, which Rust's std otherwise needs: loading it is
//! most of what the library costs a short-lived process (docs/performance.md, "preload
//! start-up"). With the unwinder inside, the linker's --as-needed drops libgcc_s.
fn main() {
    let target = std::env::var("TARGET").unwrap_or_default();
    if target.ends_with("-linux-gnu") {
        println!("cargo:rustc-link-lib=static:+whole-archive,-bundle=gcc_eh");
    }
}
