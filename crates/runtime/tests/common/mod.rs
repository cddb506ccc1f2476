//! What the runtime's integration tests share.

use std::io::Write;

/// Records that the calling test could not run here, and why: the line goes to stdout and to
/// `skipped-tests.txt` in cargo's scratch directory for tests, which `scripts/test.sh` prints
/// and counts at the end, so a skip is never mistaken for a pass.
pub fn skip(reason: &str) {
    println!("skipped: {reason}");
    // The test harness names each test's thread after the test.
    let test = std::thread::current().name().unwrap_or("?").to_string();
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("skipped-tests.txt");
    if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(file, "{} {test}: {reason}", env!("CARGO_PKG_NAME"));
    }
}
