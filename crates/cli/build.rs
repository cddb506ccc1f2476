//! Two things for `corehop`:
//!
//! - Links the unwinder statically (libgcc_eh), as the preload library does, so that it does
//!   not load libgcc_s.so, which Rust's std otherwise needs: loading it (and the CPUID probes of
//!   its constructor, 3.5 µs each under KVM) was 130-145 µs of each `corehop run`'s start here
//!   (docs/performance.md). With the unwinder inside, the linker's --as-needed drops libgcc_s.
//! - Builds the preload library's start-up stub (`crates/preload-stub`, x86-64 Linux) into
//!   OUT_DIR and tells the binary where (`COREHOP_STUB_BUILT`; empty if it could not be
//!   built, and `corehop run` then preloads the library itself). It is compiled here with
//!   rustc, not as a workspace member, because it needs `panic = abort` and no dependency.
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let target = std::env::var("TARGET").unwrap_or_default();
    if target.ends_with("-linux-gnu") {
        println!("cargo:rustc-link-lib=static:+whole-archive,-bundle=gcc_eh");
    }
    let stub = if target == "x86_64-unknown-linux-gnu" { build_stub(&target) } else { None };
    let path = stub.map(|p| p.display().to_string()).unwrap_or_default();
    println!("cargo:rustc-env=COREHOP_STUB_BUILT={path}");
}

fn build_stub(target: &str) -> Option<PathBuf> {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    let source = manifest.join("../preload-stub/src/lib.rs");
    // The stub's source and the files of corehop-sys it includes by path.
    println!("cargo:rerun-if-changed={}", source.display());
    for shared in
        ["watch.rs", "trampoline.rs", "stub_state.rs", "next_symbol.rs", "hidden_env.rs", "lifetimes.rs"]
    {
        println!("cargo:rerun-if-changed={}", manifest.join("../sys/src").join(shared).display());
    }
    println!("cargo:rerun-if-changed=build.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR")?).join("libcorehop_preload_stub.so");
    // Two load segments (code and data) and no RELRO: each segment is an mmap, and RELRO an
    // mprotect, of the dynamic loader in every process; the data segment starts a page, so
    // that its 2 KB are one page fault, not two. `--no-rosegment` and
    // `-z separate-loadable-segments` are lld's (rustc's default linker here); with GNU ld,
    // `-z noseparate-code` gives the two segments.
    let layouts: [&[&str]; 2] = [
        &["-Wl,--no-rosegment", "-Wl,-z,separate-loadable-segments", "-Wl,-z,norelro", "-nostartfiles"],
        &["-Wl,-z,noseparate-code", "-Wl,-z,norelro", "-nostartfiles"],
    ];
    for layout in layouts {
        if compile(target, &source, &out, layout) {
            return Some(out);
        }
    }
    println!("cargo:warning=the preload stub did not build; `corehop run` will preload the whole library");
    None
}

fn compile(target: &str, source: &Path, out: &Path, link_args: &[&str]) -> bool {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let mut command = Command::new(rustc);
    command
        .args(["--edition", "2021", "--crate-type", "cdylib", "--crate-name", "corehop_preload_stub"])
        .args(["-C", "panic=abort", "-C", "opt-level=3", "-C", "codegen-units=1", "-C", "debuginfo=0"])
        // The standard library's own debug information: loaded by no process, read by none.
        .args(["-C", "strip=debuginfo"])
        .args(["--target", target])
        .arg("-o")
        .arg(out)
        .arg(source);
    for arg in link_args {
        command.arg("-C").arg(format!("link-arg={arg}"));
    }
    matches!(command.output(), Ok(output) if output.status.success())
}
