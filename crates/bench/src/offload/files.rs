//! A static-file server over loopback: one server thread (using the offload path) and one
//! closed-loop client, both on the application CPU, so whatever the server offloads leaves the
//! application CPU to the client.
//!
//! Protocol: the client sends 8 bytes (file index, sequence number); the server opens the file
//! (`openat`), `fstat`s it, sends an 8-byte length, then the file with `sendfile`, and closes
//! it. The request stream is fixed by the seed; the server stops after the last request.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::Path;

use anyhow::Context;
use corehop_policy::offload::OffloadPolicy;
use corehop_runtime::service::{thread_cpu_ns, Offloader, ServiceCores};
use corehop_runtime::sys::{self, Errno, OsCpu};
use rand::{Rng, SeedableRng};

use super::{Run, Served};

/// File sizes served: around and across the 4 KB rule.
pub const SIZES: [usize; 8] = [512, 2 << 10, 4 << 10, 8 << 10, 16 << 10, 64 << 10, 128 << 10, 256 << 10];

/// Writes the served files (one per size in [`SIZES`]) into `dir`.
pub fn create(dir: &Path) -> anyhow::Result<()> {
    for (i, size) in SIZES.iter().enumerate() {
        let bytes: Vec<u8> = (0..*size).map(|b| (b * 31 + i) as u8).collect();
        std::fs::write(dir.join(format!("f{i}")), bytes)?;
    }
    Ok(())
}

fn errno(what: &str, e: Errno) -> anyhow::Error {
    anyhow::anyhow!("{what}: {e}")
}

/// Serves `requests` requests; the server thread uses `policy` through an Offloader on
/// `cores` (recording a profile if `profile`). Returns the client's view and the server's.
pub fn run(
    dir: &Path,
    cores: &ServiceCores,
    policy: OffloadPolicy,
    profile: bool,
    app_cpu: usize,
    requests: usize,
    seed: u64,
) -> anyhow::Result<(Run, Served)> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding a loopback port")?;
    let addr = listener.local_addr()?;
    let dir_c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())?;
    std::thread::scope(|scope| {
        let server = scope.spawn(move || -> anyhow::Result<Served> {
            sys::pin_current_thread(OsCpu(app_cpu))?;
            let cpu0 = thread_cpu_ns(sys::gettid()).unwrap_or(0);
            let (stream, _) = listener.accept()?;
            stream.set_nodelay(true)?;
            let sock = stream.as_raw_fd();
            let dirfd = std::fs::File::open(dir_c.to_str()?)?;
            let mut off = Offloader::new(cores, policy).with_epochs(std::time::Duration::from_millis(20));
            if profile {
                off = off.with_profile();
            }
            for _ in 0..requests {
                let mut req = [0u8; 8];
                let mut got = 0;
                while got < req.len() {
                    let n = off.recv(sock, &mut req[got..], 0).map_err(|e| errno("recv", e))?;
                    anyhow::ensure!(n > 0, "client hung up early");
                    got += n;
                }
                let index = u32::from_le_bytes(req[..4].try_into()?) as usize;
                let name = std::ffi::CString::new(format!("f{index}"))?;
                let fd = off
                    .openat(dirfd.as_raw_fd(), &name, libc::O_RDONLY | libc::O_CLOEXEC, 0)
                    .map_err(|e| errno("openat", e))?;
                // SAFETY: `fd` was just opened and is owned here; the File closes it once.
                let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
                let size = off.fstat(fd).map_err(|e| errno("fstat", e))?.st_size as usize;
                let header = (size as u64).to_le_bytes();
                let sent = off.send(sock, &header, 0).map_err(|e| errno("send", e))?;
                anyhow::ensure!(sent == header.len(), "short header send");
                let mut left = size;
                while left > 0 {
                    let n = off.sendfile(sock, fd, None, left).map_err(|e| errno("sendfile", e))?;
                    anyhow::ensure!(n > 0, "sendfile made no progress");
                    left -= n;
                }
                drop(file);
                off.progress(1);
            }
            let cpu_ns = thread_cpu_ns(sys::gettid()).unwrap_or(0).saturating_sub(cpu0);
            let ended_on = super::ended_on(off.policy());
            Ok(Served { stats: off.stats(), cpu_ns, profile: off.take_profile(), ended_on })
        });
        let client = scope.spawn(move || -> anyhow::Result<(Run, u64)> {
            sys::pin_current_thread(OsCpu(app_cpu))?;
            let cpu0 = thread_cpu_ns(sys::gettid()).unwrap_or(0);
            let mut stream = TcpStream::connect(addr)?;
            stream.set_nodelay(true)?;
            let mut rng = rand_pcg::Pcg64::seed_from_u64(seed);
            let mut latencies = Vec::with_capacity(requests);
            let mut body = vec![0u8; SIZES[SIZES.len() - 1]];
            let start = sys::now_ns();
            for seq in 0..requests {
                let index = rng.gen_range(0..SIZES.len());
                let t0 = sys::now_ns();
                let mut req = [0u8; 8];
                req[..4].copy_from_slice(&(index as u32).to_le_bytes());
                req[4..].copy_from_slice(&(seq as u32).to_le_bytes());
                stream.write_all(&req)?;
                let mut header = [0u8; 8];
                stream.read_exact(&mut header)?;
                let size = u64::from_le_bytes(header) as usize;
                anyhow::ensure!(size == SIZES[index], "asked for {} bytes, told {size}", SIZES[index]);
                stream.read_exact(&mut body[..size])?;
                anyhow::ensure!(body[size - 1] == ((size - 1) * 31 + index) as u8, "wrong bytes served");
                latencies.push((sys::now_ns() - t0) as f64);
            }
            let run = Run { ops: requests as u64, wall_ns: sys::now_ns() - start, latencies_ns: latencies };
            Ok((run, thread_cpu_ns(sys::gettid()).unwrap_or(0).saturating_sub(cpu0)))
        });
        let client = client.join().map_err(|_| anyhow::anyhow!("client thread panicked"))?;
        let server = server.join().map_err(|_| anyhow::anyhow!("server thread panicked"))?;
        let ((run, client_cpu), mut served) = (client?, server?);
        served.cpu_ns += client_cpu;
        Ok((run, served))
    })
}
