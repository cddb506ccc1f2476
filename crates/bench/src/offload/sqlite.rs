//! TPC-B-like transactions on SQLite with durable commits.
//!
//! SQLite's own I/O goes through libc, not through our wrappers, so the offload points are
//! the statements: each statement of a transaction is one call the policy decides on, keyed by
//! the statement (its id is the call site), and runs where the policy says, with the
//! connection moved there for its duration. COMMIT, where SQLite writes and fsyncs its
//! rollback journal and the database, is described to the policies as an `fsync`; the other
//! statements as `Other(id)` calls. So `size4096` (RWThresh) moves exactly the commits,
//! `always` everything, `static` and the predictors whatever measures long.

use std::path::Path;

use anyhow::Context;
use corehop_policy::offload::{CallDesc, CallKind};
use corehop_runtime::service::Offloader;
use corehop_runtime::sys;
use rand::{Rng, SeedableRng};
use rusqlite::{params, Connection};

use super::Run;

/// Rows per table at scale 1 (TPC-B: 1 branch, 10 tellers, 100 000 accounts; we keep 10 000
/// accounts so setup stays quick).
const TELLERS: i64 = 10;
const ACCOUNTS: i64 = 10_000;

const STATEMENTS: [(u32, &str); 5] = [
    (1, "UPDATE accounts SET abalance = abalance + ?1 WHERE aid = ?2"),
    (2, "SELECT abalance FROM accounts WHERE aid = ?1"),
    (3, "UPDATE tellers SET tbalance = tbalance + ?1 WHERE tid = ?2"),
    (4, "UPDATE branches SET bbalance = bbalance + ?1 WHERE bid = 1"),
    (5, "INSERT INTO history (tid, bid, aid, delta, mtime, filler) VALUES (?1, 1, ?2, ?3, ?4, 'xxxxxxxxxxxxxxxxxxxxxx')"),
];
const COMMIT_SITE: u64 = 6;

/// Creates the database in `dir` (durable settings), returns its path.
pub fn create(dir: &Path) -> anyhow::Result<std::path::PathBuf> {
    let path = dir.join("tpcb.sqlite");
    let conn = open(&path)?;
    conn.execute_batch(
        "CREATE TABLE branches (bid INTEGER PRIMARY KEY, bbalance INTEGER, filler TEXT);
         CREATE TABLE tellers (tid INTEGER PRIMARY KEY, bid INTEGER, tbalance INTEGER, filler TEXT);
         CREATE TABLE accounts (aid INTEGER PRIMARY KEY, bid INTEGER, abalance INTEGER, filler TEXT);
         CREATE TABLE history (tid INTEGER, bid INTEGER, aid INTEGER, delta INTEGER, mtime INTEGER, filler TEXT);
         BEGIN;
         INSERT INTO branches VALUES (1, 0, 'branch');",
    )?;
    for tid in 1..=TELLERS {
        conn.execute("INSERT INTO tellers VALUES (?1, 1, 0, 'teller')", params![tid])?;
    }
    {
        let mut insert = conn.prepare("INSERT INTO accounts VALUES (?1, 1, 0, ?2)")?;
        let filler = "a".repeat(84);
        for aid in 1..=ACCOUNTS {
            insert.execute(params![aid, filler])?;
        }
    }
    conn.execute_batch("COMMIT;")?;
    Ok(path)
}

fn open(path: &Path) -> anyhow::Result<Connection> {
    let conn = Connection::open(path).with_context(|| format!("opening {}", path.display()))?;
    // Durable commits: a rollback journal written and fsynced on every COMMIT.
    conn.execute_batch("PRAGMA journal_mode = DELETE; PRAGMA synchronous = FULL;")?;
    Ok(conn)
}

fn desc(site: u64, commit: bool) -> CallDesc {
    let kind = if commit { CallKind::Fsync } else { CallKind::Other(site as u32) };
    CallDesc::new(kind, -1, 0, site)
}

/// Runs `txns` transactions through `off`; `seed` fixes the accounts and amounts.
pub fn run(path: &Path, off: &mut Offloader<'_>, txns: usize, seed: u64) -> anyhow::Result<Run> {
    let mut conn = open(path)?;
    let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
    let mut latencies = Vec::with_capacity(txns);
    let start = sys::now_ns();
    for _ in 0..txns {
        let (aid, tid, delta) =
            (rng.gen_range(1..=ACCOUNTS), rng.gen_range(1..=TELLERS), rng.gen_range(-5000..=5000i64));
        let t0 = sys::now_ns();
        conn.execute_batch("BEGIN")?;
        for (id, sql) in STATEMENTS {
            let c = &mut conn;
            let r: rusqlite::Result<()> = off.call(desc(u64::from(id), false), move || {
                let mut stmt = c.prepare_cached(sql)?;
                match id {
                    1 => stmt.execute(params![delta, aid]).map(drop),
                    2 => stmt.query_row(params![aid], |row| row.get::<_, i64>(0)).map(drop),
                    3 => stmt.execute(params![delta, tid]).map(drop),
                    4 => stmt.execute(params![delta]).map(drop),
                    _ => stmt.execute(params![tid, aid, delta, t0 as i64]).map(drop),
                }
            });
            r.with_context(|| format!("statement {id}"))?;
        }
        let c = &mut conn;
        off.call(desc(COMMIT_SITE, true), move || c.execute_batch("COMMIT")).context("COMMIT")?;
        latencies.push((sys::now_ns() - t0) as f64);
        off.progress(1);
    }
    Ok(Run { ops: txns as u64, wall_ns: sys::now_ns() - start, latencies_ns: latencies })
}
