//! The two CPUs of a two-CPU benchmark (`bench switch`, `bench delegate`): the flags that name
//! them, the check that both exist and differ, and what the JSON report says of them.

use anyhow::{bail, Context};
use corehop_runtime::{sys, CpuId, OsCpu, Runtime, Wake};
use corehop_topology::Machine;
use serde::Serialize;

/// `--from` and `--to`.
#[derive(clap::Args, Debug, Clone)]
pub struct PairArgs {
    /// CPU (dense id, see `corehop topo`) the measuring task runs on.
    #[arg(long, default_value_t = 0)]
    pub from: usize,
    /// CPU (dense id) of the other side: where the task hops, or whose worker serves it.
    #[arg(long, default_value_t = 1)]
    pub to: usize,
}

impl Default for PairArgs {
    fn default() -> PairArgs {
        PairArgs { from: 0, to: 1 }
    }
}

/// A checked pair: the machine the runtime sees, and both CPUs of it.
pub(crate) struct Pair {
    pub(crate) machine: Machine,
    pub(crate) from: CpuId,
    pub(crate) to: CpuId,
}

impl PairArgs {
    /// The machine the runtime sees by default (discovered, restricted to allowed CPUs), once
    /// `--from` and `--to` are checked to be two different CPUs of it; `what` needs them.
    pub(crate) fn check(&self, what: &str) -> anyhow::Result<Pair> {
        let machine = Runtime::builder()
            .wake(Wake::Park)
            .build()
            .map(|rt| rt.machine().clone())
            .context("starting a runtime")?;
        let n = machine.cpus().len();
        for (flag, cpu) in [("--from", self.from), ("--to", self.to)] {
            if cpu >= n {
                bail!("{flag} {cpu}: this machine has CPUs 0..{} (dense ids, see `corehop topo`)", n - 1);
            }
        }
        if self.from == self.to {
            bail!("--from and --to are both {}: {what} needs two different CPUs", self.from);
        }
        Ok(Pair { machine, from: CpuId(self.from), to: CpuId(self.to) })
    }
}

/// The machine and the CPU pair a two-CPU benchmark ran on, and the clock it read.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct MachineInfo {
    pub(crate) name: String,
    source: String,
    cpus: usize,
    pub(crate) from_cpu: usize,
    pub(crate) to_cpu: usize,
    pub(crate) from_os_cpu: OsCpu,
    pub(crate) to_os_cpu: OsCpu,
    pub(crate) clock: String,
}

impl Pair {
    /// The kernel's numbers of the `--from` and the `--to` CPU.
    pub(crate) fn os_ids(&self) -> (OsCpu, OsCpu) {
        let os = |cpu: CpuId| self.machine.cpus()[cpu.0].os_id;
        (os(self.from), os(self.to))
    }

    /// What the JSON report says of the machine and the pair.
    pub(crate) fn info(&self) -> MachineInfo {
        let clock = match sys::clock_source() {
            sys::ClockSource::Tsc { ticks_per_ns } => format!("tsc ({ticks_per_ns:.3} GHz)"),
            sys::ClockSource::Monotonic => "clock_gettime(CLOCK_MONOTONIC)".into(),
        };
        let (from_os_cpu, to_os_cpu) = self.os_ids();
        MachineInfo {
            name: self.machine.name.clone(),
            source: self.machine.source.clone(),
            cpus: self.machine.cpus().len(),
            from_cpu: self.from.0,
            to_cpu: self.to.0,
            from_os_cpu,
            to_os_cpu,
            clock,
        }
    }
}
