//! Builds examples/dirlookup.c with `cc` against the freshly built libcorehop.so and runs it.
use std::path::{Path, PathBuf};
use std::process::Command;

/// target/<profile>/deps/, where cargo builds libcorehop.so next to this test (a plain
/// `cargo build` also copies it one level up).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent().expect("target/<profile>/deps/<test>").to_path_buf()
}

#[test]
fn dirlookup_example_runs_and_finds_every_name() {
    if Command::new("cc").arg("--version").output().is_err() {
        eprintln!("skipped: no C compiler (`cc`) on this machine");
        return;
    }
    let lib = lib_dir();
    assert!(lib.join("libcorehop.so").exists(), "libcorehop.so not in {}", lib.display());
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Removed when the test ends, pass or fail.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let out = dir.path().join("dirlookup");
    let status = Command::new("cc")
        .args(["-O2", "-Wall", "-Werror", "-I"])
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("examples/dirlookup.c"))
        .arg("-L")
        .arg(&lib)
        .args(["-lcorehop", "-lpthread", "-o"])
        .arg(&out)
        .status()
        .expect("running cc");
    assert!(status.success(), "cc failed");
    // 256 directories of 32 KB = 8 MB: more than the private caches of small machines.
    let run = Command::new(&out)
        .args(["256", "3000"])
        .env("LD_LIBRARY_PATH", &lib)
        .output()
        .expect("running dirlookup");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "dirlookup failed: {stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    let field = |key: &str| -> String {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key}: ")))
            .unwrap_or_else(|| panic!("no `{key}:` line in {stdout}"))
            .to_string()
    };
    let threads: i64 = field("threads").parse().unwrap();
    assert_eq!(field("directories"), "256");
    assert_eq!(field("lookups").parse::<i64>().unwrap(), threads * 3000);
    assert_eq!(field("found"), field("lookups"));
    assert_eq!(field("errors"), "0");
    assert_eq!(field("misuse reported"), "yes");
    let placement = field("placement");
    let total: usize =
        placement.split(' ').map(|kv| kv.split('=').nth(1).unwrap().parse::<usize>().unwrap()).sum();
    assert_eq!(total, 256, "every directory is registered exactly once: {placement}");
}
