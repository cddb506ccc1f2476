//! The pinned worker thread the runtime's pools are built on: service cores, SMT contexts and
//! component hosts each start theirs here, so start-up is done one way: spawn a named thread,
//! pin it to its kernel CPU, let it set itself up, and only then hand it back, or say why not.

use std::io;
use std::sync::mpsc;
use std::thread::{self, JoinHandle};

use crate::sys::{self, OsCpu};

/// Why a pinned worker did not start.
#[derive(Debug)]
pub(crate) enum StartError {
    /// The thread could not be created.
    Spawn(io::Error),
    /// The thread could not be pinned to its CPU (it has exited).
    Pin(io::Error),
    /// The thread ended before it reported that it was set up.
    Died,
}

impl StartError {
    /// The error as the OS error a pool reports (a thread that died says so).
    pub(crate) fn into_io(self) -> io::Error {
        match self {
            StartError::Spawn(e) | StartError::Pin(e) => e,
            StartError::Died => io::Error::other("the worker thread ended while starting"),
        }
    }
}

/// Given to a worker's body: [`Started::report`] tells the starter the worker is set up.
pub(crate) struct Started(mpsc::Sender<io::Result<()>>);

impl Started {
    /// The worker is ready: [`start_pinned`] returns.
    pub(crate) fn report(self) {
        // The starter waits for this; if it is gone there is no one to tell.
        let _ = self.0.send(Ok(()));
    }
}

/// Starts thread `name`, pinned to `cpu` (not pinned if `None`), running `body`, and waits
/// until `body` calls [`Started::report`]. If pinning fails, `body` does not run.
pub(crate) fn start_pinned(
    name: String,
    cpu: Option<OsCpu>,
    body: impl FnOnce(Started) + Send + 'static,
) -> Result<JoinHandle<()>, StartError> {
    let (tx, rx) = mpsc::channel();
    let handle = thread::Builder::new()
        .name(name)
        .spawn(move || {
            if let Some(Err(e)) = cpu.map(sys::pin_current_thread) {
                let _ = tx.send(Err(e));
                return;
            }
            body(Started(tx));
        })
        .map_err(StartError::Spawn)?;
    match rx.recv() {
        Ok(Ok(())) => Ok(handle),
        Ok(Err(e)) => {
            let _ = handle.join();
            Err(StartError::Pin(e))
        }
        Err(_) => {
            let _ = handle.join();
            Err(StartError::Died)
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_worker_runs_on_its_cpu_once_set_up() {
        let cpu = sys::affinity().unwrap()[0];
        let (tx, rx) = mpsc::channel();
        let handle = start_pinned("corehop-test".into(), Some(cpu), move |started| {
            let here = sys::current_os_cpu().unwrap();
            started.report();
            tx.send(here).unwrap();
        })
        .unwrap();
        assert_eq!(rx.recv().unwrap(), cpu);
        handle.join().unwrap();
    }

    #[test]
    fn a_worker_that_cannot_pin_or_set_up_is_an_error() {
        let missing = OsCpu(libc::CPU_SETSIZE as usize - 1);
        if !sys::affinity().unwrap().contains(&missing) {
            let e =
                start_pinned("corehop-test".into(), Some(missing), |_| panic!("must not run")).unwrap_err();
            assert!(matches!(e, StartError::Pin(_)), "{e:?}");
        }
        let e = start_pinned("corehop-test".into(), None, drop).unwrap_err();
        assert!(matches!(e, StartError::Died), "{e:?}");
    }
}
