//! Building synthetic machines from groups of identical cores.
//!
//! The presets, the `[[cores]]` form of machine files and tests all describe a machine the
//! same way: groups of identical cores (count, SMT threads, package, class, speed), each with
//! the caches its cores own, plus caches shared across groups. CPUs are numbered group by
//! group, core by core, SMT siblings adjacent; kernel ids equal dense ids.

use crate::{Cache, CacheKind, CoreClass, Cpu, CpuId, Machine, OsCpu, TopologyError};

/// Which CPUs one cache serves; the cache is repeated once per unit.
#[derive(Debug, Clone, PartialEq)]
pub enum Per {
    /// One per hardware thread.
    Cpu,
    /// One per physical core (shared by its SMT siblings).
    Core,
    /// One for the whole core group (a cluster, e.g. a big.LITTLE cluster's L2). Only for
    /// caches of a [`CoreGroup`].
    Group,
    /// One per package (socket, chip).
    Package,
    /// One for all the CPUs it applies to.
    Machine,
    /// Exactly these CPUs (dense ids). Only for machine-level caches.
    Cpus(Vec<usize>),
}

/// A cache to attach to a core group or to the whole machine.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheSpec {
    /// 1, 2, 3, ...
    pub level: u8,
    /// What it holds.
    pub kind: CacheKind,
    /// Its size in bytes.
    pub size_bytes: u64,
    /// Its line size in bytes.
    pub line_bytes: u32,
    /// Which CPUs share one instance of it.
    pub per: Per,
}

impl CacheSpec {
    /// A cache with 64-byte lines.
    pub fn new(level: u8, kind: CacheKind, size_bytes: u64, per: Per) -> CacheSpec {
        CacheSpec { level, kind, size_bytes, line_bytes: 64, per }
    }
}

/// `count` identical cores with `threads` SMT threads each.
#[derive(Debug, Clone, PartialEq)]
pub struct CoreGroup {
    /// How many cores.
    pub count: usize,
    /// SMT threads per core.
    pub threads: usize,
    /// The package (socket) the cores sit in.
    pub package: usize,
    /// Big or little.
    pub class: CoreClass,
    /// Relative speed in (0, 1], 1.0 being the fastest core.
    pub speed: f64,
    /// Emulation override for every CPU of the group.
    pub emulated_speed: Option<f64>,
    /// Caches of these cores ([`Per::Cpu`], [`Per::Core`], [`Per::Group`], [`Per::Package`]
    /// or [`Per::Machine`], the last two over this group's CPUs only).
    pub caches: Vec<CacheSpec>,
}

impl CoreGroup {
    /// `count` uniform single-threaded full-speed cores on package 0, without caches.
    pub fn new(count: usize) -> CoreGroup {
        CoreGroup {
            count,
            threads: 1,
            package: 0,
            class: CoreClass::Uniform,
            speed: 1.0,
            emulated_speed: None,
            caches: Vec::new(),
        }
    }
    /// Sets the SMT threads per core.
    pub fn threads(mut self, threads: usize) -> CoreGroup {
        self.threads = threads;
        self
    }
    /// Sets the package (socket).
    pub fn package(mut self, package: usize) -> CoreGroup {
        self.package = package;
        self
    }
    /// Sets the core class.
    pub fn class(mut self, class: CoreClass) -> CoreGroup {
        self.class = class;
        self
    }
    /// Sets the relative speed, in (0, 1].
    pub fn speed(mut self, speed: f64) -> CoreGroup {
        self.speed = speed;
        self
    }
    /// Adds a cache with 64-byte lines.
    pub fn cache(mut self, level: u8, kind: CacheKind, size_bytes: u64, per: Per) -> CoreGroup {
        self.caches.push(CacheSpec::new(level, kind, size_bytes, per));
        self
    }
}

/// Builds a [`Machine`] from core groups and caches; [`MachineBuilder::build`] validates it.
///
/// # Examples
/// ```
/// use corehop_topology::{CacheKind, CoreClass, CoreGroup, MachineBuilder, Per};
/// const K: u64 = 1024;
/// let machine = MachineBuilder::new("tiny hybrid")
///     .group(CoreGroup::new(2).threads(2).class(CoreClass::Big)
///         .cache(1, CacheKind::Data, 48 * K, Per::Core))
///     .group(CoreGroup::new(4).class(CoreClass::Little).speed(0.6)
///         .cache(2, CacheKind::Unified, 2048 * K, Per::Group))
///     .cache(3, CacheKind::Unified, 12 * 1024 * K, Per::Machine)
///     .build()
///     .unwrap();
/// assert_eq!(machine.cpus().len(), 8);
/// assert_eq!(machine.cores().len(), 6);
/// ```
#[derive(Debug, Clone)]
pub struct MachineBuilder {
    name: String,
    source: String,
    groups: Vec<CoreGroup>,
    caches: Vec<CacheSpec>,
    waitpkg: bool,
}

impl MachineBuilder {
    /// An empty machine called `name`.
    pub fn new(name: impl Into<String>) -> MachineBuilder {
        let name = name.into();
        MachineBuilder {
            source: format!("builder:{name}"),
            name,
            groups: Vec::new(),
            caches: Vec::new(),
            waitpkg: false,
        }
    }
    /// Where the description came from (shown by `corehop topo`).
    pub fn source(mut self, source: impl Into<String>) -> MachineBuilder {
        self.source = source.into();
        self
    }
    /// Adds a group of cores; CPUs get dense ids in the order groups are added.
    pub fn group(mut self, group: CoreGroup) -> MachineBuilder {
        self.groups.push(group);
        self
    }
    /// Adds a machine-level cache (any [`Per`] but [`Per::Group`]).
    pub fn cache(mut self, level: u8, kind: CacheKind, size_bytes: u64, per: Per) -> MachineBuilder {
        self.caches.push(CacheSpec::new(level, kind, size_bytes, per));
        self
    }
    /// Adds a machine-level cache described in full.
    pub fn cache_spec(mut self, spec: CacheSpec) -> MachineBuilder {
        self.caches.push(spec);
        self
    }
    /// Whether the CPUs have user-level monitor/wait (UMWAIT).
    pub fn waitpkg(mut self, waitpkg: bool) -> MachineBuilder {
        self.waitpkg = waitpkg;
        self
    }

    /// Expands the groups into CPUs and caches and validates the result.
    pub fn build(self) -> Result<Machine, TopologyError> {
        let mut packages: Vec<usize> = self.groups.iter().map(|g| g.package).collect();
        packages.sort_unstable();
        packages.dedup();
        let dense_package = |package: usize| packages.binary_search(&package).unwrap_or(0);

        let mut cpus = Vec::new();
        let mut caches = Vec::new();
        let mut next_core = 0;
        for (index, group) in self.groups.iter().enumerate() {
            let cpus_so_far =
                u128::from(group.count as u64) * u128::from(group.threads as u64) + cpus.len() as u128;
            if cpus_so_far > crate::MAX_CPUS as u128 {
                return Err(TopologyError::TooManyCpus {
                    what: format!(
                        "the CPU count after core group {index} ({} x {} threads)",
                        group.count, group.threads
                    ),
                    value: cpus_so_far,
                });
            }
            if group.count == 0 || group.threads == 0 {
                return Err(TopologyError::Inconsistent(format!(
                    "core group {index} needs count >= 1 and threads >= 1 (has {} x {})",
                    group.count, group.threads
                )));
            }
            let first_cpu = cpus.len();
            for _ in 0..group.count {
                for _ in 0..group.threads {
                    let id = cpus.len();
                    cpus.push(Cpu {
                        id: CpuId(id),
                        os_id: OsCpu(id),
                        core: next_core,
                        package: dense_package(group.package),
                        class: group.class,
                        speed: group.speed,
                        emulated_speed: group.emulated_speed,
                    });
                }
                next_core += 1;
            }
            let members: Vec<usize> = (first_cpu..cpus.len()).collect();
            for spec in &group.caches {
                if let Per::Cpus(_) = spec.per {
                    return Err(TopologyError::Inconsistent(format!(
                        "core group {index}: a group's cache cannot list CPUs; use per core, group or package"
                    )));
                }
                expand_cache(spec, &cpus, &members, &mut caches)?;
            }
        }
        let everyone: Vec<usize> = (0..cpus.len()).collect();
        for spec in &self.caches {
            if spec.per == Per::Group {
                return Err(TopologyError::Inconsistent(
                    "a machine-level cache cannot be per group; attach it to the core group".into(),
                ));
            }
            expand_cache(spec, &cpus, &everyone, &mut caches)?;
        }
        let machine = Machine { name: self.name, source: self.source, cpus, caches, waitpkg: self.waitpkg };
        machine.validate()?;
        Ok(machine)
    }
}

/// Appends the caches `spec` describes over `members` (dense ids) of `cpus`.
pub(crate) fn expand_cache(
    spec: &CacheSpec,
    cpus: &[Cpu],
    members: &[usize],
    out: &mut Vec<Cache>,
) -> Result<(), TopologyError> {
    let by_key = |key: &dyn Fn(&Cpu) -> usize| {
        let mut keyed: Vec<(usize, Vec<CpuId>)> = Vec::new();
        for &m in members {
            let k = key(&cpus[m]);
            match keyed.iter_mut().find(|(existing, _)| *existing == k) {
                Some((_, set)) => set.push(CpuId(m)),
                None => keyed.push((k, vec![CpuId(m)])),
            }
        }
        keyed.into_iter().map(|(_, set)| set).collect::<Vec<_>>()
    };
    let sets: Vec<Vec<CpuId>> = match &spec.per {
        Per::Cpu => members.iter().map(|&m| vec![CpuId(m)]).collect(),
        Per::Core => by_key(&|cpu| cpu.core),
        Per::Package => by_key(&|cpu| cpu.package),
        Per::Group | Per::Machine => vec![members.iter().map(|&m| CpuId(m)).collect()],
        Per::Cpus(list) => {
            let mut list = list.clone();
            list.sort_unstable();
            list.dedup();
            if let Some(&bad) = list.iter().find(|&&c| c >= cpus.len()) {
                let cache = Cache {
                    level: spec.level,
                    kind: spec.kind,
                    size_bytes: spec.size_bytes,
                    line_bytes: spec.line_bytes,
                    cpus: list.iter().map(|&c| CpuId(c)).collect(),
                };
                return Err(TopologyError::CacheUnknownCpu {
                    cache: cache.to_string(),
                    cpu: bad,
                    cpus: cpus.len(),
                });
            }
            vec![list.into_iter().map(CpuId).collect()]
        }
    };
    for mut set in sets {
        set.sort_unstable();
        out.push(Cache {
            level: spec.level,
            kind: spec.kind,
            size_bytes: spec.size_bytes,
            line_bytes: spec.line_bytes,
            cpus: set,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = 1024;

    #[test]
    fn groups_expand_into_cores_threads_and_caches() {
        let machine = MachineBuilder::new("two sockets")
            .group(CoreGroup::new(2).threads(2).package(0).cache(1, CacheKind::Data, 32 * K, Per::Core))
            .group(CoreGroup::new(2).threads(2).package(1).cache(1, CacheKind::Data, 32 * K, Per::Core))
            .cache(3, CacheKind::Unified, 8 * 1024 * K, Per::Package)
            .build()
            .unwrap();
        assert_eq!(machine.cpus().len(), 8);
        assert_eq!(machine.cores().len(), 4);
        assert_eq!(machine.package_count(), 2);
        assert_eq!(machine.smt_siblings(CpuId(5)), vec![CpuId(4), CpuId(5)]);
        assert_eq!(machine.caches.len(), 6);
        let l3 = machine.llc_of(CpuId(5)).unwrap();
        assert_eq!(l3.level, 3);
        assert_eq!(l3.cpus, (4..8).map(CpuId).collect::<Vec<_>>());
        assert_eq!(machine.private_cache_bytes(CpuId(5)), 32 * K);
    }

    #[test]
    fn sparse_package_numbers_become_dense() {
        let machine = MachineBuilder::new("gap")
            .group(CoreGroup::new(1).package(3))
            .group(CoreGroup::new(1).package(7))
            .build()
            .unwrap();
        assert_eq!(machine.cpus[0].package, 0);
        assert_eq!(machine.cpus[1].package, 1);
    }

    #[test]
    fn cpu_counts_past_the_limit_are_refused_before_allocating() {
        for (count, threads) in [(1_000_000_000, 1_000), (usize::MAX, usize::MAX), (crate::MAX_CPUS + 1, 1)] {
            let built = MachineBuilder::new("huge").group(CoreGroup::new(count).threads(threads)).build();
            assert!(matches!(built, Err(TopologyError::TooManyCpus { .. })), "{count} x {threads}");
        }
        let two = MachineBuilder::new("two groups")
            .group(CoreGroup::new(crate::MAX_CPUS))
            .group(CoreGroup::new(1))
            .build();
        assert!(matches!(two, Err(TopologyError::TooManyCpus { .. })));
        assert!(MachineBuilder::new("max").group(CoreGroup::new(crate::MAX_CPUS)).build().is_ok());
        let file = Machine::from_toml_str("[[cores]]\ncount = 1000000000\nthreads = 1000\n");
        assert!(file.unwrap_err().to_string().contains("at most 8192 CPUs"));
    }

    #[test]
    fn bad_groups_and_caches_are_typed_errors() {
        assert!(matches!(MachineBuilder::new("none").build(), Err(TopologyError::Empty)));
        assert!(matches!(
            MachineBuilder::new("zero").group(CoreGroup::new(0)).build(),
            Err(TopologyError::Inconsistent(m)) if m.contains("count >= 1")
        ));
        assert!(matches!(
            MachineBuilder::new("fast").group(CoreGroup::new(1).speed(1.5)).build(),
            Err(TopologyError::BadSpeed { cpu: 0, .. })
        ));
        assert!(matches!(
            MachineBuilder::new("far")
                .group(CoreGroup::new(2))
                .cache(2, CacheKind::Unified, K, Per::Cpus(vec![1, 2]))
                .build(),
            Err(TopologyError::CacheUnknownCpu { cpu: 2, cpus: 2, .. })
        ));
        assert!(MachineBuilder::new("g")
            .group(CoreGroup::new(2))
            .cache(2, CacheKind::Unified, K, Per::Group)
            .build()
            .is_err());
    }
}
