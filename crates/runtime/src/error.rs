//! The runtime's errors, each naming the problem and the numbers involved.

use std::any::Any;
use std::io;

use corehop_topology::{CpuId, OsCpu};

/// Why a runtime call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The CPU is not one the runtime (or the machine, at build time) has.
    #[error("{cpu} is not one of the available CPUs ({})", list(available))]
    UnknownCpu {
        /// The CPU asked for (an index into the machine's CPU list).
        cpu: CpuId,
        /// The CPUs there are to choose from.
        available: Vec<CpuId>,
    },
    /// The machine has the CPU, but this process may not run on it (affinity mask, cpuset).
    #[error("{cpu} (kernel CPU {os_id}) is not in this process's allowed CPUs {}", OsCpu::list(allowed))]
    CpuNotAllowed {
        /// The CPU asked for (an index into the machine's CPU list).
        cpu: CpuId,
        /// The kernel's number for that CPU.
        os_id: OsCpu,
        /// The kernel CPU numbers this process may run on.
        allowed: Vec<OsCpu>,
    },
    /// The same CPU was chosen twice.
    #[error("{cpu} was chosen more than once")]
    DuplicateCpu {
        /// The CPU that appears more than once.
        cpu: CpuId,
    },
    /// An empty CPU list was given (to the builder or to `hop_any`).
    #[error("no CPUs were given: at least one is needed")]
    NoCpus,
    /// The call is only meaningful inside a task (`hop`, `on`, `hop_any`).
    #[error(
        "not inside a corehop task: hop/on move a running task, call them from code run by spawn_on/block_on"
    )]
    NotInTask,
    /// Blocking on a task from one of the runtime's own workers could deadlock the worker.
    #[error("block_on called from a worker of the same runtime; use corehop_runtime::on inside tasks")]
    BlockingInTask,
    /// Waiting for a delegated result inside a delegated operation: that would block the worker
    /// serving it, perhaps on its own inbox.
    #[error(
        "waiting for a submitted operation inside a delegated operation would block its worker; wait in a task or another thread"
    )]
    WaitInOperation,
    /// The runtime is shutting down: no new tasks, and hops of running tasks are refused.
    #[error("the runtime is shut down")]
    ShutDown,
    /// A hop inside a `no_hop_zone` (e.g. while a lock guard is held).
    #[error(
        "hop to {cpu} refused: the task is inside a no_hop_zone (it holds something tied to this thread)"
    )]
    HopForbidden {
        /// Where the task wanted to go.
        cpu: CpuId,
    },
    /// Pinning a thread to a CPU failed.
    #[error("could not pin a thread to {cpu} (kernel CPU {os_id}): {source}")]
    Pin {
        /// The CPU the thread was to run on.
        cpu: CpuId,
        /// The kernel's number for that CPU.
        os_id: OsCpu,
        /// The OS error from setting the thread's affinity.
        source: io::Error,
    },
    /// The task stack size asked for is too small to run a task at all.
    #[error("a task stack of {size} bytes is too small: at least {min} bytes (Builder::stack_size)")]
    StackTooSmall {
        /// The stack size asked for, in bytes.
        size: usize,
        /// The smallest stack the runtime accepts, in bytes ([`MIN_STACK_SIZE`](crate::MIN_STACK_SIZE)).
        min: usize,
    },
    /// The task stack size asked for is more than a task's stack may reserve.
    #[error("a task stack of {size} bytes is too large: at most {max} bytes (Builder::stack_size)")]
    StackTooLarge {
        /// The stack size asked for, in bytes.
        size: usize,
        /// The largest stack the runtime accepts, in bytes ([`MAX_STACK_SIZE`](crate::MAX_STACK_SIZE)).
        max: usize,
    },
    /// Allocating a task stack failed.
    #[error("could not allocate a {size}-byte task stack: {source}")]
    Stack {
        /// The stack size asked for, in bytes.
        size: usize,
        /// The OS error from mapping the stack.
        source: io::Error,
    },
    /// Starting a worker thread failed.
    #[error("could not start the worker thread for {cpu}: {source}")]
    Thread {
        /// The CPU the worker was for.
        cpu: CpuId,
        /// The OS error from starting the thread.
        source: io::Error,
    },
    /// Finding out what the machine is failed.
    #[error("could not discover the machine: {0}")]
    Topology(#[from] corehop_topology::TopologyError),
}

fn list(cpus: &[CpuId]) -> String {
    if cpus.is_empty() {
        return "none".into();
    }
    cpus.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", ")
}

/// Why a task gave no value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JoinError {
    /// The task's closure panicked; the payload is what `panic!` was given.
    #[error("task panicked: {message}")]
    Panicked {
        /// The panic message, if the payload was a string; a placeholder otherwise.
        message: String,
        /// The value the task panicked with.
        payload: Box<dyn Any + Send + 'static>,
    },
    /// The runtime shut down before the task started; its closure never ran.
    #[error("task cancelled: the runtime shut down before it started")]
    Cancelled,
}

impl JoinError {
    pub(crate) fn from_panic(payload: Box<dyn Any + Send + 'static>) -> JoinError {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(non-string panic payload)".into());
        JoinError::Panicked { message, payload }
    }

    /// Whether the task panicked.
    pub fn is_panic(&self) -> bool {
        matches!(self, JoinError::Panicked { .. })
    }

    /// Whether the task was cancelled.
    pub fn is_cancelled(&self) -> bool {
        matches!(self, JoinError::Cancelled)
    }

    /// The panic payload, to re-raise with `std::panic::resume_unwind`; `Err(self)` otherwise.
    pub fn into_panic(self) -> Result<Box<dyn Any + Send + 'static>, JoinError> {
        match self {
            JoinError::Panicked { payload, .. } => Ok(payload),
            other => Err(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_problem() {
        let e = Error::UnknownCpu { cpu: CpuId(7), available: vec![CpuId(0), CpuId(1)] };
        assert_eq!(e.to_string(), "cpu7 is not one of the available CPUs (cpu0, cpu1)");
        let e = Error::CpuNotAllowed {
            cpu: CpuId(1),
            os_id: OsCpu(5),
            allowed: vec![OsCpu(0), OsCpu(1), OsCpu(3)],
        };
        assert_eq!(e.to_string(), "cpu1 (kernel CPU 5) is not in this process's allowed CPUs 0-1,3");
        assert!(JoinError::from_panic(Box::new("boom")).to_string().contains("boom"));
        assert!(JoinError::from_panic(Box::new(String::from("bang"))).to_string().contains("bang"));
        assert!(JoinError::from_panic(Box::new(3u8)).to_string().contains("non-string"));
    }
}
