//! The machine data model.

use serde::{Deserialize, Serialize};

use crate::{format_cpu_list, TopologyError};

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

/// The kernel's number for a CPU: what `sched_setaffinity`, `sched_getcpu`, `taskset` and
/// `/sys/devices/system/cpu/cpuN` use. Every kernel CPU number in corehop's API has this type;
/// an index into a [`Machine`] is a [`CpuId`].
///
/// Displays as the bare number (`3`), as the kernel writes CPU lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OsCpu(pub usize);

impl std::fmt::Display for OsCpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl OsCpu {
    /// `cpus` as the kernel writes a CPU list (`0-3,8`).
    pub fn list(cpus: &[OsCpu]) -> String {
        format_cpu_list(&cpus.iter().map(|c| c.0).collect::<Vec<_>>())
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
    pub os_id: OsCpu,
    /// Dense index of the physical core, unique across packages; SMT siblings share it.
    pub core: usize,
    /// Dense index of the package (socket).
    pub package: usize,
    /// Core class.
    pub class: CoreClass,
    /// Relative speed of the hardware, in (0, 1]: 1.0 for the fastest core of the machine.
    /// Discovery normalises to the fastest online CPU (so a process confined to little cores
    /// still sees them as slow); a description may also use a reference core it does not
    /// have, as `switch-ss` does (two simple cores at 0.5 of a complex one) so that machines
    /// of one family compare.
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
    /// Data only.
    Data,
    /// Instructions only.
    Instruction,
    /// Both.
    Unified,
}

/// One cache and the CPUs that share it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cache {
    /// 1, 2, 3, ...
    pub level: u8,
    /// What it holds.
    pub kind: CacheKind,
    /// Its size in bytes.
    pub size_bytes: u64,
    /// Its line size in bytes.
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
    /// A machine of alike CPUs on the kernel's `os_ids` (dense ids in that order), grouped
    /// `threads_per_core` to a core, one package, no caches: the usual test and emulation layout.
    pub fn uniform(name: impl Into<String>, os_ids: &[OsCpu], threads_per_core: usize) -> Machine {
        let threads = threads_per_core.max(1);
        let cpus = os_ids
            .iter()
            .enumerate()
            .map(|(i, &os_id)| Cpu {
                id: CpuId(i),
                os_id,
                core: i / threads,
                package: 0,
                class: CoreClass::Uniform,
                speed: 1.0,
                emulated_speed: None,
            })
            .collect();
        let name = name.into();
        Machine { source: format!("uniform:{name}"), name, cpus, caches: Vec::new(), waitpkg: false }
    }

    /// All CPUs, in dense-id order.
    pub fn cpus(&self) -> &[Cpu] {
        &self.cpus
    }

    /// The CPU with this dense id, if it exists.
    pub fn cpu(&self, id: CpuId) -> Option<&Cpu> {
        self.cpus.get(id.0)
    }

    /// The dense id of the CPU the kernel calls `os_id`, if this machine has it.
    pub fn cpu_by_os_id(&self, os_id: OsCpu) -> Option<CpuId> {
        self.cpus.iter().find(|c| c.os_id == os_id).map(|c| c.id)
    }

    /// The CPUs that share `id`'s physical core (including `id`), sorted.
    pub fn smt_siblings(&self, id: CpuId) -> Vec<CpuId> {
        let Some(cpu) = self.cpu(id) else { return Vec::new() };
        self.cpus.iter().filter(|c| c.core == cpu.core && c.package == cpu.package).map(|c| c.id).collect()
    }

    /// Caches that `id` uses, in the order the machine lists them (presets and discovery
    /// list them lowest level first).
    pub fn caches_of(&self, id: CpuId) -> impl Iterator<Item = &Cache> {
        self.caches.iter().filter(move |c| c.cpus.contains(&id))
    }

    /// The physical cores, in dense-index order.
    pub fn cores(&self) -> Vec<Core> {
        let mut cores: Vec<Core> = Vec::new();
        for cpu in &self.cpus {
            match cores.iter_mut().find(|core| core.index == cpu.core) {
                Some(core) => core.cpus.push(cpu.id),
                None => cores.push(Core {
                    index: cpu.core,
                    package: cpu.package,
                    class: cpu.class,
                    cpus: vec![cpu.id],
                }),
            }
        }
        cores.sort_by_key(|core| core.index);
        cores
    }

    /// How many packages (sockets, chips) the CPUs are on.
    pub fn package_count(&self) -> usize {
        self.cpus.iter().map(|c| c.package + 1).max().unwrap_or(0)
    }

    /// The CPUs of package `package`, in dense-id order.
    pub fn package_cpus(&self, package: usize) -> Vec<CpuId> {
        self.cpus.iter().filter(|c| c.package == package).map(|c| c.id).collect()
    }

    /// The last-level cache `id` uses: the highest-level data or unified cache listing it.
    pub fn llc_of(&self, id: CpuId) -> Option<&Cache> {
        self.caches_of(id).filter(|c| c.kind != CacheKind::Instruction).max_by_key(|c| c.level)
    }

    /// The nearest data or unified cache that `a` and `b` share (lowest level), if any: what
    /// a hop from `a` to `b` finds still warm.
    pub fn shared_cache(&self, a: CpuId, b: CpuId) -> Option<&Cache> {
        self.caches_of(a)
            .filter(|c| c.kind != CacheKind::Instruction && c.cpus.contains(&b))
            .min_by_key(|c| c.level)
    }

    /// Bytes of data cache that only `id`'s core uses (its SMT siblings included): what an
    /// object placed on this core can keep to itself.
    pub fn private_cache_bytes(&self, id: CpuId) -> u64 {
        let siblings = self.smt_siblings(id);
        self.caches_of(id)
            .filter(|c| c.kind != CacheKind::Instruction && c.cpus.iter().all(|cpu| siblings.contains(cpu)))
            .map(|c| c.size_bytes)
            .sum()
    }

    /// Checks the invariants every consumer may rely on: at least one CPU; `cpus[i].id == i`;
    /// kernel ids unique; speeds and emulated speeds in (0, 1]; core and package indexes dense,
    /// each core on one package with one class; every cache non-empty, sorted, with a level
    /// and a size, listing only CPUs that exist.
    pub fn validate(&self) -> Result<(), TopologyError> {
        let inconsistent = |message: String| Err(TopologyError::Inconsistent(message));
        if self.cpus.is_empty() {
            return Err(TopologyError::Empty);
        }
        let mut os_ids = std::collections::BTreeSet::new();
        for (index, cpu) in self.cpus.iter().enumerate() {
            if cpu.id != CpuId(index) {
                return inconsistent(format!("cpu at position {index} has id {}", cpu.id));
            }
            if !os_ids.insert(cpu.os_id) {
                return Err(TopologyError::Duplicate { what: "kernel CPU id (os_id)", value: cpu.os_id.0 });
            }
            if !(cpu.speed > 0.0 && cpu.speed <= 1.0) {
                return Err(TopologyError::BadSpeed { cpu: index, speed: cpu.speed });
            }
            if let Some(speed) = cpu.emulated_speed {
                if !(speed > 0.0 && speed <= 1.0) {
                    return Err(TopologyError::BadEmulatedSpeed { cpu: index, speed });
                }
            }
        }
        let cores = self.cores();
        for (index, core) in cores.iter().enumerate() {
            if core.index != index {
                return inconsistent(format!("core indexes must be dense; core {index} is missing"));
            }
            for &cpu in &core.cpus {
                let cpu = &self.cpus[cpu.0];
                if cpu.package != core.package || cpu.class != core.class {
                    return inconsistent(format!(
                        "SMT siblings of core {index} disagree on package or class ({} vs {})",
                        core.cpus[0], cpu.id
                    ));
                }
            }
        }
        for package in 0..self.package_count() {
            if self.package_cpus(package).is_empty() {
                return inconsistent(format!("package indexes must be dense; package {package} has no CPUs"));
            }
        }
        for cache in &self.caches {
            let name = cache.to_string();
            if cache.level == 0 || cache.size_bytes == 0 || cache.line_bytes == 0 {
                return inconsistent(format!("{name} needs a level >= 1, a size and a line size"));
            }
            if cache.cpus.is_empty() {
                return inconsistent(format!("{name} lists no CPUs"));
            }
            if let Some(bad) = cache.cpus.iter().find(|cpu| cpu.0 >= self.cpus.len()) {
                return Err(TopologyError::CacheUnknownCpu {
                    cache: name,
                    cpu: bad.0,
                    cpus: self.cpus.len(),
                });
            }
            if cache.cpus.windows(2).any(|pair| pair[0] >= pair[1]) {
                return inconsistent(format!("{name} must list its CPUs sorted and once each"));
            }
        }
        Ok(())
    }
}

/// A physical core: one or more SMT hardware threads.
#[derive(Debug, Clone, PartialEq)]
pub struct Core {
    /// Dense core index ([`Cpu::core`]).
    pub index: usize,
    /// The package (socket) it sits in.
    pub package: usize,
    /// Big or little.
    pub class: CoreClass,
    /// Its hardware threads, in dense-id order.
    pub cpus: Vec<CpuId>,
}

impl std::fmt::Display for CoreClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CoreClass::Uniform => "uniform",
            CoreClass::Big => "big",
            CoreClass::Little => "little",
        })
    }
}

impl std::fmt::Display for CacheKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CacheKind::Data => "data",
            CacheKind::Instruction => "instruction",
            CacheKind::Unified => "unified",
        })
    }
}

/// `L2 unified cache of cpu0-3`, for messages.
impl std::fmt::Display for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cpus: Vec<usize> = self.cpus.iter().map(|c| c.0).collect();
        write!(f, "L{} {} cache of cpu {}", self.level, self.kind, format_cpu_list(&cpus))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CoreGroup, MachineBuilder, Per};

    #[test]
    fn uniform_keeps_kernel_ids_and_groups_siblings() {
        let m = Machine::uniform("t", &[OsCpu(4), OsCpu(5), OsCpu(6), OsCpu(7)], 2);
        assert!(m.validate().is_ok());
        assert_eq!(m.cpu_by_os_id(OsCpu(6)), Some(CpuId(2)));
        assert_eq!(m.smt_siblings(CpuId(2)), [CpuId(2), CpuId(3)]);
        assert!(m.cpus().iter().all(|c| c.effective_speed() == 1.0 && c.class == CoreClass::Uniform));
        assert_eq!(
            Machine::uniform("t", &[OsCpu(0), OsCpu(1)], 0).cores().len(),
            2,
            "0 threads per core means 1"
        );
    }

    fn smt_pair() -> Machine {
        MachineBuilder::new("pair")
            .group(CoreGroup::new(2).threads(2).class(CoreClass::Big))
            .cache(2, CacheKind::Unified, 1 << 20, Per::Machine)
            .build()
            .unwrap()
    }

    fn problem(change: impl FnOnce(&mut Machine)) -> String {
        let mut machine = smt_pair();
        change(&mut machine);
        machine.validate().unwrap_err().to_string()
    }

    #[test]
    fn validate_names_each_broken_invariant() {
        smt_pair().validate().unwrap();
        assert!(problem(|m| m.cpus[1].id = CpuId(7)).contains("position 1 has id cpu7"));
        assert!(problem(|m| m.cpus[1].os_id = OsCpu(0)).contains("os_id) 0 is listed twice"));
        assert!(problem(|m| m.cpus[2].speed = f64::NAN).contains("cpu2 has speed NaN"));
        assert!(problem(|m| m.cpus[3].emulated_speed = Some(0.0)).contains("cpu3 has emulated speed 0"));
        assert!(problem(|m| m.cpus[1].class = CoreClass::Little).contains("disagree on package or class"));
        assert!(problem(|m| m.cpus.iter_mut().skip(2).for_each(|c| c.core = 5)).contains("core 1 is missing"));
        assert!(problem(|m| m.cpus.iter_mut().for_each(|c| c.package = 1)).contains("package 0 has no CPUs"));
        assert!(problem(|m| m.caches[0].cpus.reverse()).contains("sorted and once each"));
        assert!(problem(|m| m.caches[0].cpus.clear()).contains("lists no CPUs"));
        assert!(problem(|m| m.caches[0].cpus.push(CpuId(4))).contains("lists cpu4"));
        assert!(problem(|m| m.caches[0].level = 0).contains("level >= 1"));
        assert!(matches!(Machine { cpus: Vec::new(), ..smt_pair() }.validate(), Err(TopologyError::Empty)));
    }

    #[test]
    fn queries_follow_the_structure() {
        let machine = smt_pair();
        let cores = machine.cores();
        assert_eq!(cores.len(), 2);
        assert_eq!(cores[1].cpus, vec![CpuId(2), CpuId(3)]);
        assert_eq!(machine.smt_siblings(CpuId(9)), Vec::<CpuId>::new());
        assert_eq!(machine.private_cache_bytes(CpuId(0)), 0, "the only cache is shared by both cores");
        assert_eq!(machine.shared_cache(CpuId(0), CpuId(3)).unwrap().level, 2);
        assert_eq!(machine.caches[0].to_string(), "L2 unified cache of cpu 0-3");
    }
}
