//! Starting a program that corehop waits for with exactly the environment it is given, in
//! that order, by `posix_spawnp`.
//!
//! `Command` hands a spawned program its environment in key order once any variable changes,
//! and keeping the order through it takes a hook between fork and exec, which makes it fork
//! instead of `posix_spawn` (0.6 to 1 ms more a spawn here). So under `--stats`, `--compare`
//! or `--record-trace` a program listed its variables in another order than plainly. Here the
//! program starts as `Command` would start it, with the signal mask, the SIGPIPE action and
//! the standard descriptors corehop was started with ([`crate::inherited`]), and with its
//! stdout and stderr in pipes if they are to be captured.
//!
//! The `unsafe` here is libc's spawn, wait, pipe and signal calls, each block with why its
//! arguments are valid. The spawn's: every pointer handed to `posix_spawnp` points into memory
//! this module owns for the call (the words and variables as `CString`s, their null-terminated
//! pointer arrays, the initialised file actions and attributes), or is `environ`, which
//! nothing in corehop changes after its start.

use std::ffi::{c_char, CString, OsStr};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

/// A started program.
pub struct Child {
    pid: libc::pid_t,
    stdout: Option<File>,
    stderr: Option<File>,
}

/// Starts `words` (the first found in `PATH` as `execvp` finds it) with `environment` (none:
/// corehop's own, as it is); `capture`: stdout and stderr go to pipes read by
/// [`Child::wait_with_output`]. A file the kernel cannot run is `ENOEXEC`, as from `Command`.
pub fn spawn(words: &[&OsStr], environment: Option<&[CString]>, capture: bool) -> io::Result<Child> {
    let invalid = || io::Error::new(io::ErrorKind::InvalidInput, "a word with a NUL byte in it");
    let words: Vec<CString> =
        words.iter().map(|w| CString::new(w.as_bytes()).map_err(|_| invalid())).collect::<Result<_, _>>()?;
    if words.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no program to start"));
    }
    let argv = null_terminated(&words);
    let envp = environment.map(null_terminated);
    let pipes = if capture { Some((pipe()?, pipe()?)) } else { None };
    let signals = crate::inherited::started_with();
    let closed = signals.closed & if capture { 0b001 } else { 0b111 };
    let mut actions = FileActions::new()?;
    if let Some(((_, out), (_, err))) = &pipes {
        actions.dup2(raw(out), 1)?;
        actions.dup2(raw(err), 2)?;
    }
    for fd in (0..3).filter(|fd| closed & (1 << fd) != 0) {
        actions.close(fd)?;
    }
    let attributes = Attributes::new(signals.blocked, default_signals())?;
    let mut pid: libc::pid_t = 0;
    // SAFETY: `argv` and `envp` end in a null pointer and point at NUL-terminated strings
    // owned by `words` and the caller, alive for the call; `environ` is the process's own
    // environment (the module docs); the file actions and attributes were initialised by
    // `new` and are destroyed only when dropped, after the call.
    let rc = unsafe {
        libc::posix_spawnp(
            &mut pid,
            argv[0],
            &actions.0,
            &attributes.0,
            argv.as_ptr() as *const *mut c_char,
            envp.as_ref().map_or(environ(), |e| e.as_ptr() as *const *mut c_char),
        )
    };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    // The write ends close here: the program holds its own copies.
    let files = pipes.map(|((out, _), (err, _))| (File::from(out), File::from(err)));
    let (stdout, stderr) = files.map_or((None, None), |(out, err)| (Some(out), Some(err)));
    Ok(Child { pid, stdout, stderr })
}

impl Child {
    /// The program's process id.
    pub fn id(&self) -> u32 {
        self.pid as u32
    }

    /// Waits for the program to end.
    pub fn wait(self) -> io::Result<ExitStatus> {
        let mut status = 0;
        loop {
            // SAFETY: `status` is a valid out-parameter; `pid` is our child, not yet reaped.
            if unsafe { libc::waitpid(self.pid, &mut status, 0) } == self.pid {
                return Ok(ExitStatus::from_raw(status));
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Reads the captured stdout and stderr to their ends (both at once, so that neither
    /// pipe fills while the other is read), then waits for the program.
    pub fn wait_with_output(mut self) -> io::Result<(ExitStatus, Vec<u8>, Vec<u8>)> {
        let read_all = |file: Option<File>| -> io::Result<Vec<u8>> {
            let mut bytes = Vec::new();
            if let Some(mut file) = file {
                file.read_to_end(&mut bytes)?;
            }
            Ok(bytes)
        };
        let (out, err) = (self.stdout.take(), self.stderr.take());
        let (stdout, stderr) = std::thread::scope(|scope| {
            let stderr = scope.spawn(|| read_all(err));
            let stdout = read_all(out);
            (stdout, stderr.join().unwrap_or_else(|_| Err(io::Error::other("reading stderr panicked"))))
        });
        let status = self.wait()?;
        Ok((status, stdout?, stderr?))
    }
}

/// Null-terminated pointers to `strings`.
pub fn null_terminated(strings: &[CString]) -> Vec<*const c_char> {
    strings.iter().map(|s| s.as_ptr()).chain([std::ptr::null()]).collect()
}

fn environ() -> *const *mut c_char {
    extern "C" {
        static environ: *const *mut c_char;
    }
    // SAFETY: a read of libc's pointer to the environment, which corehop does not change.
    unsafe { environ }
}

/// A pipe (read end, write end), both closed on exec.
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just opened and are owned here alone.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn raw(fd: &OwnedFd) -> i32 {
    std::os::fd::AsRawFd::as_raw_fd(fd)
}

/// Checks a `posix_spawn*` return code.
fn check(rc: i32) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

/// Initialised file actions, destroyed when dropped.
struct FileActions(libc::posix_spawn_file_actions_t);

impl FileActions {
    fn new() -> io::Result<FileActions> {
        // SAFETY: zeroed storage for the object `init` initialises.
        let mut actions = FileActions(unsafe { std::mem::zeroed() });
        // SAFETY: `actions.0` is valid storage; on failure nothing needs destroying (and
        // `destroy` of an all-zero object frees nothing).
        check(unsafe { libc::posix_spawn_file_actions_init(&mut actions.0) })?;
        Ok(actions)
    }

    fn dup2(&mut self, from: i32, to: i32) -> io::Result<()> {
        // SAFETY: an initialised object; the descriptors are checked by the spawn.
        check(unsafe { libc::posix_spawn_file_actions_adddup2(&mut self.0, from, to) })
    }

    fn close(&mut self, fd: i32) -> io::Result<()> {
        // SAFETY: as for `dup2`.
        check(unsafe { libc::posix_spawn_file_actions_addclose(&mut self.0, fd) })
    }
}

impl Drop for FileActions {
    fn drop(&mut self) {
        // SAFETY: initialised by `new`, destroyed once.
        unsafe { libc::posix_spawn_file_actions_destroy(&mut self.0) };
    }
}

/// The signals the program starts with at their default action (bit `s - 1` for signal
/// `s`): all but those ignored now, which it inherits as from a shell, and SIGPIPE unless it
/// was ignored at corehop's start (Rust's runtime ignores it since). Without this, glibc's
/// `posix_spawn` sets its two internal signals (32 and 33) to be ignored in the child unless
/// they are in this set, and the program kept them ignored after the exec.
///
/// Asked once: what corehop ignores does not change after its start (its own handlers only
/// replace default actions), and each spawn of `--compare` and the run suite would otherwise
/// pay 62 system calls.
fn default_signals() -> u64 {
    static DEFAULT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *DEFAULT.get_or_init(|| {
        let pipe_ignored = crate::inherited::started_with().pipe_ignored;
        let mut bits = 0u64;
        for signal in (1..=64).filter(|&s| s != libc::SIGKILL && s != libc::SIGSTOP) {
            let ignored =
                if signal == libc::SIGPIPE { pipe_ignored } else { crate::inherited::ignored(signal) };
            if !ignored {
                bits |= 1 << (signal - 1);
            }
        }
        bits
    })
}

/// A signal set of `bits` (bit `s - 1` for signal `s`), written directly: `sigaddset`
/// refuses glibc's internal signals.
fn signal_set(bits: u64) -> libc::sigset_t {
    // SAFETY: an all-zero `sigset_t` is the empty set; on Linux its first 64 bits are the
    // signals 1 to 64, signal `s` at bit `s - 1` (glibc's `__sigmask`), and the type is at
    // least that large and aligned for a `u64`.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        (&mut set as *mut libc::sigset_t).cast::<u64>().write(bits);
        set
    }
}

/// Spawn attributes: the signal mask `blocked` and the signals `default` set to their default
/// action (both bit `s - 1` for signal `s`).
struct Attributes(libc::posix_spawnattr_t);

impl Attributes {
    fn new(blocked: u64, default: u64) -> io::Result<Attributes> {
        const _: () = assert!(std::mem::size_of::<libc::sigset_t>() >= 8);
        // SAFETY: zeroed storage for the object `init` initialises.
        let mut attributes = Attributes(unsafe { std::mem::zeroed() });
        let (mask, default) = (signal_set(blocked), signal_set(default));
        // SAFETY: `attributes.0` is valid storage, initialised first; the sets are complete
        // values; every call gets the initialised object.
        unsafe {
            check(libc::posix_spawnattr_init(&mut attributes.0))?;
            check(libc::posix_spawnattr_setsigmask(&mut attributes.0, &mask))?;
            check(libc::posix_spawnattr_setsigdefault(&mut attributes.0, &default))?;
            let flags = libc::POSIX_SPAWN_SETSIGMASK | libc::POSIX_SPAWN_SETSIGDEF;
            check(libc::posix_spawnattr_setflags(&mut attributes.0, flags as libc::c_short))?;
        }
        Ok(attributes)
    }
}

impl Drop for Attributes {
    fn drop(&mut self) {
        // SAFETY: initialised by `new`, destroyed once.
        unsafe { libc::posix_spawnattr_destroy(&mut self.0) };
    }
}
