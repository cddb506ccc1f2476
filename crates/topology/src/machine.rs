//! The machine data model.

use serde::{Deserialize, Serialize};

/// Dense index of a CPU inside one [`Machine`] (0..machine.cpus().len()).
///
/// The kernel's number for the same CPU is [`Cpu::os_id`]; the two differ when the process
/// may use only some CPUs (affinity mask, cgroup cpuset) or when a description says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CpuId(pub usize);

impl std::fmt::Display for CpuId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cpu{}", self.0)
    }
}

/// The kind of core a CPU belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CoreClass {
    /// All cores alike (no big/little distinction known).
    #[default]
    Uniform,
    /// A big / performance (P) / complex core.
    Big,
    /// A little / efficiency (E) / simple core.
    Little,
}

/// One hardware thread the OS can schedule on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cpu {
    /// Dense id inside this machine.
    pub id: CpuId,
    /// The kernel's CPU number (what `sched_setaffinity` takes).
    pub os_id: usize,
    /// Dense index of the physical core; SMT siblings share it.
    pub core: usize,
    /// Dense index of the package (socket).
    pub package: usize,
    /// Core class.
    pub class: CoreClass,
    /// Relative speed of the hardware, 1.0 for the fastest core of the machine.
    pub speed: f64,
    /// Emulation override: fraction of full speed this CPU is made to run at (duty cycling in
    /// the runtime, a slower clock in the simulator). `None` runs it as it is.
    pub emulated_speed: Option<f64>,
}

impl Cpu {
    /// The speed work really runs at: the hardware speed times any emulation override.
    pub fn effective_speed(&self) -> f64 {
        self.speed * self.emulated_speed.unwrap_or(1.0)
    }
}

/// What a cache holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheKind {
    Data,
    Instruction,
    Unified,
}

/// One cache and the CPUs that share it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cache {
    /// 1, 2, 3, ...
    pub level: u8,
    pub kind: CacheKind,
    pub size_bytes: u64,
    pub line_bytes: u32,
    /// CPUs (dense ids) that share this cache, sorted.
    pub cpus: Vec<CpuId>,
}

/// A machine: the CPUs this process may use and what they share.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// A human name ("this host", "o2-16core", ...).
    pub name: String,
    /// Where the description came from ("sysfs:/sys", "preset:cs", "file:x.toml").
    pub source: String,
    /// CPUs in dense-id order: `cpus[i].id == CpuId(i)`.
    pub cpus: Vec<Cpu>,
    /// Every cache of every level.
    pub caches: Vec<Cache>,
    /// Whether the CPU offers user-level monitor/wait (x86 `waitpkg`: UMONITOR/UMWAIT).
    pub waitpkg: bool,
}

impl Machine {
    /// All CPUs, in dense-id order.
    pub fn cpus(&self) -> &[Cpu] {
        &self.cpus
    }

    /// The CPU with this dense id, if it exists.
    pub fn cpu(&self, id: CpuId) -> Option<&Cpu> {
        self.cpus.get(id.0)
    }

    /// The dense id of the CPU the kernel calls `os_id`, if this machine has it.
    pub fn cpu_by_os_id(&self, os_id: usize) -> Option<CpuId> {
        self.cpus.iter().find(|c| c.os_id == os_id).map(|c| c.id)
    }

    /// The CPUs that share `id`'s physical core (including `id`), sorted.
    pub fn smt_siblings(&self, id: CpuId) -> Vec<CpuId> {
        let Some(cpu) = self.cpu(id) else { return Vec::new() };
        self.cpus.iter().filter(|c| c.core == cpu.core && c.package == cpu.package).map(|c| c.id).collect()
    }

    /// Caches that `id` uses, lowest level first.
    pub fn caches_of(&self, id: CpuId) -> impl Iterator<Item = &Cache> {
        self.caches.iter().filter(move |c| c.cpus.contains(&id))
    }
}
