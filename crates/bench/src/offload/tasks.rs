//! The file server of `files`, on the task runtime, with exception-less offload: FlexSC's
//! idea (a system call goes to a syscall core while the application core runs other threads)
//! in user space, with tasks for threads and the service CPU's worker for the syscall core.
//!
//! [`CONNECTIONS`] loopback connections, each served by a task on the application CPU, and
//! each driven by a closed-loop client task on the same CPU (as in `files`, the client shares
//! the application CPU, so what the server moves away is time the clients get). The server
//! task reads a request (8 bytes: file index, sequence number), opens the file (`openat`),
//! `fstat`s it, sends an 8-byte length and the file (`sendfile`), and closes it. The policy
//! decides each of those `recv`, `openat`, `fstat`, `send` and `sendfile` calls, as in
//! `files`: a call kept local runs on the application CPU; a call moved runs on the service
//! CPU, where the task goes (a hop: it joins the service worker's queue) while the
//! application CPU runs the other tasks. The task stays there while its calls keep moving,
//! so a request's consecutive moved calls cost one hop, not a round trip each (io_uring's
//! linked submissions, IOSQE_IO_LINK, batch dependent calls the same way), and it comes
//! back before its next local call or at the end of the request. Sockets are non-blocking, and the two tasks of a
//! connection tell each other when they have sent (a counter each: the readiness an event
//! loop would get from epoll, without its system call), so a task reads only what has been
//! sent; a call that would still block yields and tries again.

use std::ffi::CString;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::Context;
use corehop_policy::offload::{CallCost, CallDesc, CallKind, Decision, OffloadPolicy};
use corehop_runtime::service::{
    thread_cpu_ns, thread_schedstat, OffloadStats, SchedStat, SysCall, SysResult,
};
use corehop_runtime::sys::{self, Errno};
use corehop_runtime::{yield_now, CpuId, OsCpu, Runtime, Wake};
use rand::{Rng, SeedableRng};

use super::files::SIZES;
use super::{Run, Served};

/// Connections served at once, each by its own task (and driven by its own client task).
pub const CONNECTIONS: usize = 16;

/// Call sites, for the predictor's keys.
const SITE_OPENAT: u64 = 1;
const SITE_FSTAT: u64 = 2;
const SITE_SEND: u64 = 3;
const SITE_SENDFILE: u64 = 4;
const SITE_RECV: u64 = 5;

/// How long an epoch of a tuned or adaptive policy lasts, as in `files`.
const EPOCH_NS: u64 = 20_000_000;

/// The policy and what it did, shared by the server tasks. They all run on the application
/// CPU's worker, one at a time, and hold the lock only between two yields.
struct Offload {
    policy: OffloadPolicy,
    stats: OffloadStats,
    profile: Option<Vec<(CallDesc, u64)>>,
    epoch_start_ns: u64,
    epoch_units: u64,
    /// A task's hop from the application CPU to the service CPU and back, measured in this
    /// runtime before the run, plus what other programs on the two CPUs add to it lately
    /// ([`Contention`], watched only for a policy that learns what calls cost): what a move
    /// costs the application CPU while it has other tasks to run.
    round_trip_ns: u64,
    contention: Option<Contention>,
}

/// What a hop waits, on average, for a worker that another program keeps off its CPU: the
/// share of the time each worker waited for its CPU, times half its wait each time, from the
/// scheduler's figures for the two worker threads ([`thread_schedstat`]), read every
/// [`EPOCH_NS`] and averaged over epochs (a quarter each).
///
/// The round trip from before the run (2-3 µs here) is not what a hop costs under another
/// program's load: a hop then waits for the busy loop's turn on the CPU to end, 0.2-8 ms.
/// With it, the measured arm moved every call under such load, at 0.6-0.8 of not moving.
/// Measuring trips again in the run did not do instead: mid-run trips also wait behind the
/// tasks moved before them, which costs the application CPU nothing, and N's floor in
/// `predicted` then kept it at 0.7 of `size` on the idle host (docs/performance.md,
/// forty-ninth session).
struct Contention {
    /// The two workers' threads.
    workers: [i32; 2],
    /// Their figures at the last reading, and when that was.
    last: Option<([SchedStat; 2], u64)>,
    /// The average wait, ns.
    wait_ns: u64,
}

impl Contention {
    fn new(workers: [i32; 2]) -> Contention {
        Contention { workers, last: None, wait_ns: 0 }
    }

    /// Reads the workers' figures if an epoch has passed since the last reading.
    fn update(&mut self, now: u64) {
        if self.last.is_some_and(|(_, at)| now.saturating_sub(at) < EPOCH_NS) {
            return;
        }
        let [Some(app), Some(service)] = self.workers.map(thread_schedstat) else { return };
        let stats = [app, service];
        if let Some((before, at)) = self.last {
            let wall = now.saturating_sub(at);
            let wait: u64 = before.iter().zip(&stats).map(|(b, s)| expected_wait(b, s, wall)).sum();
            self.wait_ns = (3 * self.wait_ns + wait) / 4;
        }
        self.last = Some((stats, now));
    }
}

/// What a hop arriving at a random moment of `wall` ns waited, on average, for a thread that
/// went from `before` to `after`: the share of the time it waited for its CPU, times half of
/// one such wait.
fn expected_wait(before: &SchedStat, after: &SchedStat, wall: u64) -> u64 {
    let waited = after.run_delay_ns.saturating_sub(before.run_delay_ns);
    let runs = after.runs.saturating_sub(before.runs);
    if wall == 0 || runs == 0 {
        return 0;
    }
    let share = (waited as f64 / wall as f64).min(1.0);
    (share * waited as f64 / runs as f64 / 2.0) as u64
}

/// A server task's way to make a call: where the policy says. A moved call takes the task to
/// the service CPU, and the task stays there while its calls keep moving: consecutive moved
/// calls (a request's recv, openat, fstat, send and sendfile) run there back to back, one
/// round trip for the lot, while the application CPU runs the other tasks.
#[derive(Clone)]
struct Calls {
    shared: Arc<Mutex<Offload>>,
    app: CpuId,
    service: CpuId,
}

impl Calls {
    fn lock(&self) -> MutexGuard<'_, Offload> {
        self.shared.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `f`, described as `desc`, locally or on the service CPU as the policy decides.
    /// The task returns on whichever CPU the call ran on.
    ///
    /// # Safety
    /// As for [`Calls::go`].
    unsafe fn call<R: Send + 'static>(
        &self,
        desc: CallDesc,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> anyhow::Result<R> {
        let decision = {
            let mut offload = self.lock();
            offload.stats.calls += 1;
            offload.policy.decide(&desc, 0)
        };
        let t0 = sys::now_ns();
        let (result, cost) = match decision {
            Decision::Local => {
                // SAFETY: this function's contract.
                unsafe { self.go(self.app) }?;
                let start = sys::now_ns();
                let result = f();
                let run = sys::now_ns().saturating_sub(start);
                self.lock().stats.local_run_ns += run;
                (result, CallCost::local(run))
            }
            Decision::Offload => {
                // What the move costs the application CPU, the one the policy keeps busy: while
                // other tasks wait to run there, the hop there and back, charged to the call
                // that leaves (the hop back comes at the next local call or the request's end,
                // which no call is charged for; what the task waited beyond the hops at the
                // service CPU, the application CPU spent on the other tasks), and nothing more
                // to a call made once the task is away; with nothing else to run, that CPU
                // idles for the whole wait, and for the hop back, about half a round trip.
                let leaves = corehop_runtime::current_cpu() == self.app;
                let idles_meanwhile = leaves && !corehop_runtime::others_waiting();
                // SAFETY: this function's contract.
                unsafe { self.go(self.service) }?;
                let start = sys::now_ns();
                let result = f();
                let end = sys::now_ns();
                let run = end.saturating_sub(start);
                let waited = end.saturating_sub(t0);
                let mut offload = self.lock();
                let hops = offload.round_trip_ns + offload.contention.as_ref().map_or(0, |c| c.wait_ns);
                let caller = if idles_meanwhile {
                    waited + offload.round_trip_ns / 2
                } else if leaves {
                    hops
                } else {
                    start.saturating_sub(t0).min(hops)
                };
                offload.stats.offloaded += 1;
                offload.stats.remote_run_ns += run;
                offload.stats.remote_wait_ns += start.saturating_sub(t0);
                offload.stats.remote_total_ns += waited;
                (result, CallCost::moved(run, caller))
            }
        };
        let mut offload = self.lock();
        offload.policy.observe(&desc, cost);
        if let Some(profile) = &mut offload.profile {
            profile.push((desc, cost.run));
        }
        Ok(result)
    }

    /// Moves the calling task to `cpu` (nothing if it is there already).
    ///
    /// # Safety
    /// As for `corehop_runtime::hop`: the calling task holds nothing tied to its OS thread.
    unsafe fn go(&self, cpu: CpuId) -> anyhow::Result<()> {
        if corehop_runtime::current_cpu() != cpu {
            // SAFETY: this function's contract (the policy's guard is dropped before it).
            unsafe { corehop_runtime::hop(cpu) }?;
        }
        Ok(())
    }

    /// A request served: progress for a tuned or adaptive policy's epochs.
    fn progress(&self) {
        let mut offload = self.lock();
        offload.epoch_units += 1;
        let now = sys::now_ns();
        if let Some(contention) = &mut offload.contention {
            contention.update(now);
        }
        let elapsed = now.saturating_sub(offload.epoch_start_ns);
        if offload.policy.wants_epochs() && offload.policy.epoch_over(elapsed, offload.epoch_units, EPOCH_NS)
        {
            let units = offload.epoch_units as f64;
            offload.policy.epoch_end(units, elapsed);
            offload.stats.epochs += 1;
            (offload.epoch_start_ns, offload.epoch_units) = (now, 0);
        }
    }
}

/// What the two tasks of a connection have sent: requests by the client, bytes by the server;
/// and whether one of them failed, so that the other stops waiting for it.
#[derive(Default)]
struct Sent {
    requests: AtomicU32,
    bytes: AtomicU64,
    failed: AtomicBool,
}

impl Sent {
    /// Yields until `counter` has gone past `seen` (the peer has sent more).
    fn wait_past<T: PartialOrd>(&self, counter: impl Fn() -> T, seen: T) -> anyhow::Result<()> {
        while counter() <= seen {
            anyhow::ensure!(!self.failed.load(Ordering::Relaxed), "the other end of the connection failed");
            yield_now()?;
        }
        Ok(())
    }

    /// `result`, after telling the peer if it is an error.
    fn unless_failed<T>(&self, result: anyhow::Result<T>) -> anyhow::Result<T> {
        if result.is_err() {
            self.failed.store(true, Ordering::Relaxed);
        }
        result
    }
}

/// The median of 201 round trips of the calling task to `service` and back (`on`), in ns.
fn round_trip(service: CpuId) -> Result<u64, corehop_runtime::Error> {
    let mut trips = (0..201)
        .map(|_| {
            let t0 = sys::now_ns();
            corehop_runtime::on(service, || ())?;
            Ok(sys::now_ns().saturating_sub(t0))
        })
        .collect::<Result<Vec<u64>, corehop_runtime::Error>>()?;
    trips.sort_unstable();
    Ok(trips[trips.len() / 2])
}

fn errno(what: &str, e: Errno) -> anyhow::Error {
    anyhow::anyhow!("{what}: {e}")
}

/// Serves `requests` requests over [`CONNECTIONS`] connections with tasks on `app_cpu`, calls
/// moved by `policy` going to `service_cpu` (kernel CPU numbers; they may be the same), and
/// every call recorded if `profile`. Returns the clients' view and the server's.
pub fn run(
    dir: &Path,
    policy: OffloadPolicy,
    profile: bool,
    app_cpu: OsCpu,
    service_cpu: OsCpu,
    requests: usize,
    seed: u64,
) -> anyhow::Result<(Run, Served)> {
    let machine = corehop_topology::discover().map_err(|e| anyhow::anyhow!("{e}"))?;
    let dense = |os: OsCpu| {
        machine
            .cpus()
            .iter()
            .find(|c| c.os_id == os)
            .map(|c| c.id)
            .with_context(|| format!("kernel CPU {os} is not one this process may use"))
    };
    let (app, service) = (dense(app_cpu)?, dense(service_cpu)?);
    let cpus = if app == service { vec![app] } else { vec![app, service] };
    // The service worker polls: a moved call should not wait for a wake-up.
    let rt = Runtime::builder().machine(machine.clone()).cpus(cpus).wake(Wake::Spin).build()?;

    let listener = TcpListener::bind("127.0.0.1:0").context("binding a loopback port")?;
    let addr = listener.local_addr()?;
    let mut pairs = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        let client = TcpStream::connect(addr)?;
        let (server, _) = listener.accept()?;
        for stream in [&client, &server] {
            stream.set_nodelay(true)?;
            stream.set_nonblocking(true)?;
            // Room for the largest file both ways, so no answer waits for a window update.
            for option in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
                let bytes: libc::c_int = 1 << 20;
                // SAFETY: a valid socket, and a pointer to an int of the size given.
                let r = unsafe {
                    libc::setsockopt(
                        stream.as_raw_fd(),
                        libc::SOL_SOCKET,
                        option,
                        (&raw const bytes).cast(),
                        size_of::<libc::c_int>() as libc::socklen_t,
                    )
                };
                anyhow::ensure!(r == 0, "setsockopt: {}", std::io::Error::last_os_error());
            }
        }
        pairs.push((client, server));
    }
    let dirfd = Arc::new(std::fs::File::open(dir).with_context(|| format!("opening {}", dir.display()))?);
    // The request stream, fixed by the seed; connection c carries requests c, c + C, ...
    let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
    let indices: Vec<usize> = (0..requests).map(|_| rng.gen_range(0..SIZES.len())).collect();
    let worker_tid = rt.block_on(app, sys::gettid)?;
    let contention = if policy.learns() {
        Some(Contention::new([worker_tid, rt.block_on(service, sys::gettid)?]))
    } else {
        None
    };
    let calls = Calls {
        shared: Arc::new(Mutex::new(Offload {
            policy,
            stats: OffloadStats::default(),
            profile: profile.then(Vec::new),
            epoch_start_ns: sys::now_ns(),
            epoch_units: 0,
            round_trip_ns: rt.block_on(app, move || round_trip(service))??,
            contention,
        })),
        app,
        service,
    };

    let cpu0 = thread_cpu_ns(worker_tid).unwrap_or(0);
    let start = sys::now_ns();
    let mut servers = Vec::with_capacity(CONNECTIONS);
    let mut clients = Vec::with_capacity(CONNECTIONS);
    for (c, (client, server)) in pairs.into_iter().enumerate() {
        let mine: Vec<(u32, usize)> = indices
            .iter()
            .enumerate()
            .skip(c)
            .step_by(CONNECTIONS)
            .map(|(seq, &i)| (seq as u32, i))
            .collect();
        let (calls, dirfd, count) = (calls.clone(), dirfd.clone(), mine.len());
        let sent = Arc::new(Sent::default());
        let sent_too = Arc::clone(&sent);
        servers.push(rt.spawn_on(app, move || {
            sent.unless_failed(serve(&server, dirfd.as_raw_fd(), &calls, count, &sent))
        })?);
        clients.push(rt.spawn_on(app, move || sent_too.unless_failed(drive(client, &mine, &sent_too)))?);
    }
    // Every task joined before any error is reported: a task that fails tells its peer, which
    // then fails too, but a task cancelled by an early shutdown could not.
    let latencies: Vec<anyhow::Result<Vec<f64>>> =
        clients.into_iter().map(|h| h.join().map_err(|e| anyhow::anyhow!("client task: {e}"))?).collect();
    let wall_ns = sys::now_ns() - start;
    let served: Vec<anyhow::Result<()>> =
        servers.into_iter().map(|h| h.join().map_err(|e| anyhow::anyhow!("server task: {e}"))?).collect();
    served.into_iter().collect::<anyhow::Result<()>>()?;
    let latencies: Vec<f64> = latencies.into_iter().collect::<anyhow::Result<Vec<_>>>()?.concat();
    let cpu_ns = thread_cpu_ns(worker_tid).unwrap_or(0).saturating_sub(cpu0);
    drop(rt);
    let mut offload = calls.lock();
    let served = Served {
        stats: offload.stats,
        cpu_ns,
        profile: offload.profile.take().unwrap_or_default(),
        ended_on: super::ended_on(&offload.policy),
    };
    Ok((Run { ops: requests as u64, wall_ns, latencies_ns: latencies }, served))
}

/// A connection's server task: `count` requests.
fn serve(stream: &TcpStream, dirfd: RawFd, calls: &Calls, count: usize, sent: &Sent) -> anyhow::Result<()> {
    // SAFETY, for every `call` and `go` below, which may leave the task on another OS thread:
    // across them the task holds descriptors, numbers and references to shared state, no lock
    // guard and no reference into a thread-local.
    let sock = stream.as_raw_fd();
    for served in 1..=count as u32 {
        sent.wait_past(|| sent.requests.load(Ordering::Acquire), served - 1)?;
        // The request is there (the client counted it sent): read it where the policy says.
        let mut request = [0u8; 8];
        let mut got = 0;
        while got < request.len() {
            let want = request.len() - got;
            let desc = CallDesc { kind: CallKind::Recvfrom, fd: sock, size: want as u64, site: SITE_RECV };
            let (result, bytes) = unsafe {
                calls.call(desc, move || {
                    let mut bytes = [0u8; 8];
                    let result =
                        SysCall::Recvfrom { fd: sock, buf: &mut bytes[..want], flags: 0, addr: None }
                            .execute();
                    (result, bytes)
                })
            }?;
            anyhow::ensure!(result != Ok(0), "the client hung up early");
            let n = moved(result, "recv")?;
            request[got..got + n].copy_from_slice(&bytes[..n]);
            got += n;
        }
        let index = u32::from_le_bytes(request[..4].try_into()?) as usize;
        anyhow::ensure!(index < SIZES.len(), "request for file {index}, there are {}", SIZES.len());
        let name = CString::new(format!("f{index}"))?;
        let flags = libc::O_RDONLY | libc::O_CLOEXEC;
        let desc = SysCall::Openat { dirfd, path: &name, flags, mode: 0 }.desc(SITE_OPENAT);
        let fd = unsafe {
            calls.call(desc, move || SysCall::Openat { dirfd, path: &name, flags, mode: 0 }.execute())
        }?
        .map_err(|e| errno("openat", e))? as RawFd;
        // SAFETY: `fd` was just opened and is owned here; the File closes it once.
        let file = unsafe { std::fs::File::from_raw_fd(fd) };
        let desc = CallDesc { kind: CallKind::Fstat, fd, size: 0, site: SITE_FSTAT };
        let size = unsafe { calls.call(desc, move || fstat_size(fd)) }?.map_err(|e| errno("fstat", e))?;
        let header = (size as u64).to_le_bytes();
        let mut header_sent = 0;
        while header_sent < header.len() {
            let desc = SysCall::Sendto { fd: sock, buf: &header[header_sent..], flags: 0, addr: None }
                .desc(SITE_SEND);
            let from = header_sent;
            let result = unsafe {
                calls.call(desc, move || {
                    SysCall::Sendto { fd: sock, buf: &header[from..], flags: libc::MSG_NOSIGNAL, addr: None }
                        .execute()
                })
            }?;
            let n = moved(result, "send")?;
            header_sent += n;
            sent.bytes.fetch_add(n as u64, Ordering::Release);
        }
        let mut left = size;
        while left > 0 {
            let desc =
                SysCall::Sendfile { out_fd: sock, in_fd: fd, offset: None, count: left }.desc(SITE_SENDFILE);
            let result = unsafe {
                calls.call(desc, move || {
                    SysCall::Sendfile { out_fd: sock, in_fd: fd, offset: None, count: left }.execute()
                })
            }?;
            let n = moved(result, "sendfile")?;
            left -= n;
            // The client reads as the answer goes out: a socket buffer may hold less than a file.
            sent.bytes.fetch_add(n as u64, Ordering::Release);
        }
        drop(file);
        calls.progress();
        // Back to the application CPU between requests: the task runs its own code (and
        // waits for the next request) there, as a thread of FlexSC's runs on its core.
        unsafe { calls.go(calls.app) }?;
    }
    Ok(())
}

/// Bytes a non-blocking call moved: 0 (after yielding) when it would have blocked.
fn moved(result: SysResult, what: &str) -> anyhow::Result<usize> {
    match result {
        Ok(n) => Ok(n as usize),
        Err(e) if e.0 == libc::EAGAIN => {
            yield_now()?;
            Ok(0)
        }
        Err(e) => Err(errno(what, e)),
    }
}

/// The size of the open file `fd`.
fn fstat_size(fd: RawFd) -> Result<usize, Errno> {
    // SAFETY: `stat` is a plain C struct, for which all zeroes is a valid value.
    let mut out: libc::stat = unsafe { std::mem::zeroed() };
    SysCall::Fstat { fd, out: &mut out }.execute()?;
    Ok(out.st_size as usize)
}

/// Fills `buf` from the non-blocking socket `sock`: waits (yielding) until `available` says
/// the peer (whose connection state is `sent`) has sent more than `received` bytes, reads, and counts what it read there; a read
/// that still finds nothing (the bytes are on their way through the kernel) yields.
fn receive(
    sock: RawFd,
    buf: &mut [u8],
    sent: &Sent,
    available: impl Fn() -> u64,
    received: &mut u64,
) -> anyhow::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        sent.wait_past(&available, *received)?;
        let result = SysCall::Recvfrom { fd: sock, buf: &mut buf[got..], flags: 0, addr: None }.execute();
        match result {
            Ok(0) => anyhow::bail!("the peer hung up early"),
            Ok(n) => {
                got += n as usize;
                *received += n as u64;
            }
            Err(e) if e.0 == libc::EAGAIN => yield_now()?,
            Err(e) => return Err(errno("recv", e)),
        }
    }
    Ok(())
}

/// A connection's client task: sends each request (sequence number, file index) once the
/// last is answered, checks the answer, and returns the latencies in ns.
fn drive(stream: TcpStream, requests: &[(u32, usize)], sent: &Sent) -> anyhow::Result<Vec<f64>> {
    let sock = stream.as_raw_fd();
    let mut body = vec![0u8; SIZES[SIZES.len() - 1]];
    let mut latencies = Vec::with_capacity(requests.len());
    let mut received = 0;
    for (&(seq, index), n) in requests.iter().zip(1..) {
        let t0 = sys::now_ns();
        let mut request = [0u8; 8];
        request[..4].copy_from_slice(&(index as u32).to_le_bytes());
        request[4..].copy_from_slice(&seq.to_le_bytes());
        let mut sent_bytes = 0;
        while sent_bytes < request.len() {
            let result = SysCall::Sendto {
                fd: sock,
                buf: &request[sent_bytes..],
                flags: libc::MSG_NOSIGNAL,
                addr: None,
            }
            .execute();
            sent_bytes += moved(result, "send")?;
        }
        sent.requests.store(n, Ordering::Release);
        let available = || sent.bytes.load(Ordering::Acquire);
        let mut header = [0u8; 8];
        receive(sock, &mut header, sent, available, &mut received)?;
        let size = u64::from_le_bytes(header) as usize;
        anyhow::ensure!(size == SIZES[index], "asked for {} bytes, told {size}", SIZES[index]);
        receive(sock, &mut body[..size], sent, available, &mut received)?;
        anyhow::ensure!(body[size - 1] == ((size - 1) * 31 + index) as u8, "wrong bytes served");
        latencies.push((sys::now_ns() - t0) as f64);
    }
    Ok(latencies)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_policy_serves_every_request_with_the_right_bytes() {
        let dir = tempfile::tempdir().unwrap();
        super::super::files::create(dir.path()).unwrap();
        let allowed = sys::affinity().unwrap();
        let (app, service) = (allowed[0], *allowed.last().unwrap());
        for (policy, offloaded) in [(OffloadPolicy::Never, false), (OffloadPolicy::Always, true)] {
            let (run, served) = run(dir.path(), policy, true, app, service, 100, 7).unwrap();
            assert_eq!((run.ops, run.latencies_ns.len()), (100, 100));
            // openat, fstat, at least one send and one sendfile per request, all recorded.
            assert!(served.stats.calls >= 400, "{:?}", served.stats);
            assert_eq!(served.profile.len() as u64, served.stats.calls);
            let expected = if offloaded { served.stats.calls } else { 0 };
            assert_eq!(served.stats.offloaded, expected, "{:?}", served.stats);
        }
    }

    #[test]
    fn a_hop_waits_half_a_wait_for_a_cpu_as_often_as_the_worker_waited() {
        let at = |run_delay_ns, runs| SchedStat { cpu_ns: 0, run_delay_ns, runs };
        // Half of 20 ms waiting, in two waits of 5 ms: a hop waits 2.5 ms one time in two.
        assert_eq!(expected_wait(&at(1_000, 10), &at(10_001_000, 12), 20_000_000), 1_250_000);
        // Alone on its CPU, and in a window with no reading: nothing.
        assert_eq!(expected_wait(&at(1_000, 10), &at(1_000, 10), 20_000_000), 0);
        assert_eq!(expected_wait(&at(1_000, 10), &at(5_000, 11), 0), 0);
    }

    #[test]
    fn the_scheduler_s_figures_for_a_worker_are_read_every_epoch() {
        let mut contention = Contention::new([sys::gettid(), sys::gettid()]);
        contention.update(1);
        let first = contention.last.expect("this thread's schedstat").0;
        assert!(first[0].runs >= 1, "{first:?}");
        // Within an epoch: not read again; after one, read again.
        contention.update(EPOCH_NS);
        assert_eq!(contention.last.map(|(_, at)| at), Some(1));
        contention.update(EPOCH_NS + 1);
        assert_eq!(contention.last.map(|(_, at)| at), Some(EPOCH_NS + 1));
    }

    #[test]
    fn a_failing_server_task_stops_its_client_instead_of_leaving_it_waiting() {
        // No files to serve: every server task's openat fails; the run ends with that error.
        let empty = tempfile::tempdir().unwrap();
        let allowed = sys::affinity().unwrap();
        let (app, service) = (allowed[0], *allowed.last().unwrap());
        for policy in [OffloadPolicy::Never, OffloadPolicy::Always] {
            let err = run(empty.path(), policy, false, app, service, 40, 7).err().expect("no files, no run");
            let message = format!("{err:#}");
            assert!(message.contains("openat") || message.contains("other end"), "{message}");
        }
    }
}
