//! Discovery: this host's machine, read from sysfs and procfs.
//!
//! Everything is read below two roots — the sysfs root (`/sys`) and the procfs root (`/proc`)
//! — so tests point discovery at a fake tree. What is read:
//!
//! ```text
//! <sys>/devices/system/cpu/online                         which CPUs exist and are up
//! <sys>/devices/system/cpu/cpuN/topology/                 physical_package_id, die_id, core_id,
//!                                                         core_cpus_list | thread_siblings_list
//! <sys>/devices/system/cpu/cpuN/cache/indexM/             level, type, size, coherency_line_size,
//!                                                         shared_cpu_list
//! <sys>/devices/system/cpu/cpuN/acpi_cppc/highest_perf    speed, best source (x86, Arm servers)
//! <sys>/devices/system/cpu/cpuN/cpu_capacity              speed, next (Arm, some x86)
//! <sys>/devices/system/cpu/cpuN/cpufreq/cpuinfo_max_freq  speed, last resort
//! <sys>/devices/cpu_core/cpus, <sys>/devices/cpu_atom/cpus   Intel hybrid: P- and E-cores
//! <proc>/self/status  Cpus_allowed_list                   the affinity mask
//! <proc>/self/cgroup + <sys>/fs/cgroup/...                the cgroup cpuset (v2 or v1)
//! <proc>/cpuinfo      flags                               waitpkg (UMONITOR/UMWAIT)
//! ```
//!
//! The machine holds only the CPUs this process may use (online ∩ affinity ∩ cpuset), renumbered
//! densely in kernel-id order; speeds are relative to the fastest *online* CPU, so a process
//! confined to little cores still sees that they are slow. A missing file never fails
//! discovery: a default is used and a note says so ([`Discovery::notes`], also appended to
//! [`Machine::source`]).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::TopologyError;
use crate::{
    format_cpu_list, parse_cpu_list, parse_size, Cache, CacheKind, CoreClass, Cpu, CpuId, Machine, OsCpu,
};

/// Where discovery reads from and which CPUs it may keep.
#[derive(Debug, Clone)]
pub struct DiscoverOptions {
    /// The sysfs mount, normally `/sys`.
    pub sysfs_root: PathBuf,
    /// The procfs mount (normally `/proc`) for the affinity mask, the cgroup and CPU flags;
    /// `None` reads nothing from procfs: every online CPU is allowed and waitpkg is off.
    pub proc_root: Option<PathBuf>,
    /// Kernel CPU ids the caller allows, overriding the affinity mask and cpuset.
    pub allowed: Option<Vec<usize>>,
}

impl DiscoverOptions {
    /// This host: `/sys` and `/proc`, allowed set from the affinity mask and cgroup cpuset.
    pub fn host() -> DiscoverOptions {
        DiscoverOptions { sysfs_root: "/sys".into(), proc_root: Some("/proc".into()), allowed: None }
    }

    /// A sysfs tree alone (e.g. a test fixture): every online CPU allowed.
    pub fn sysfs(root: impl Into<PathBuf>) -> DiscoverOptions {
        DiscoverOptions { sysfs_root: root.into(), proc_root: None, allowed: None }
    }
}

/// Which sysfs file the relative speeds came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpeedSource {
    /// `acpi_cppc/highest_perf`: the firmware's performance scale.
    Cppc,
    /// `cpu_capacity`: the kernel's capacity (1024 = fastest), accounts for IPC on Arm.
    Capacity,
    /// `cpufreq/cpuinfo_max_freq`: the highest clock; blind to IPC differences.
    MaxFreq,
    /// Nothing usable: every CPU is taken to be equally fast.
    None,
}

impl fmt::Display for SpeedSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SpeedSource::Cppc => "acpi_cppc/highest_perf",
            SpeedSource::Capacity => "cpu_capacity",
            SpeedSource::MaxFreq => "cpufreq/cpuinfo_max_freq",
            SpeedSource::None => "none (all CPUs taken as equal)",
        })
    }
}

/// A discovered machine and how it was found.
#[derive(Debug, Clone)]
pub struct Discovery {
    /// The machine: the CPUs this process may use.
    pub machine: Machine,
    /// Online CPUs (kernel ids), allowed or not.
    pub online: Vec<usize>,
    /// Online CPUs this process may use (kernel ids): the machine's CPUs.
    pub allowed: Vec<usize>,
    /// Where `allowed` came from, e.g. "affinity mask ∩ cgroup cpuset (/sys/fs/cgroup/x)".
    pub allowed_from: String,
    /// Where the core speeds came from.
    pub speed_source: SpeedSource,
    /// How core classes were decided.
    pub class_source: String,
    /// Files that were missing or unreadable and the default used instead.
    pub notes: Vec<String>,
}

/// Discovers this host (see [`DiscoverOptions::host`]).
pub fn discover() -> Result<Machine, TopologyError> {
    Ok(discover_with(&DiscoverOptions::host())?.machine)
}

/// Discovers the machine a sysfs tree at `root` describes, every online CPU allowed.
pub fn discover_at(root: &Path) -> Result<Machine, TopologyError> {
    Ok(discover_with(&DiscoverOptions::sysfs(root))?.machine)
}

/// Discovers a machine with full control over the roots and the allowed set, and reports
/// how each part was found.
pub fn discover_with(options: &DiscoverOptions) -> Result<Discovery, TopologyError> {
    let mut notes = Vec::new();
    let cpu_dir = options.sysfs_root.join("devices/system/cpu");
    if !cpu_dir.is_dir() {
        return Err(TopologyError::NoCpus {
            root: options.sysfs_root.clone(),
            reason: format!("{} is not a directory", cpu_dir.display()),
        });
    }
    let online = online_cpus(&cpu_dir, &mut notes)?;
    if online.is_empty() {
        return Err(TopologyError::NoCpus {
            root: options.sysfs_root.clone(),
            reason: "no CPU is online".into(),
        });
    }
    let (allowed, allowed_from) = allowed_cpus(options, &mut notes);
    let used: Vec<usize> = match &allowed {
        Some(allowed) => online.iter().copied().filter(|cpu| allowed.binary_search(cpu).is_ok()).collect(),
        None => online.clone(),
    };
    if used.is_empty() {
        return Err(TopologyError::NothingAllowed {
            online: format_cpu_list(&online),
            allowed: format_cpu_list(allowed.as_deref().unwrap_or_default()),
        });
    }

    let (speeds, speed_source) = speeds(&cpu_dir, &online);
    let (classes, class_source) = classes(&options.sysfs_root, &online, &speeds);

    // Dense packages and cores over the used CPUs, in kernel-id order.
    let places: Vec<Place> = used.iter().map(|&cpu| place(&cpu_dir, cpu, &mut notes)).collect();
    let mut packages: Vec<i64> = places.iter().map(|p| p.package).collect();
    packages.sort_unstable();
    packages.dedup();
    let mut cores: BTreeMap<CoreKey, usize> = BTreeMap::new();
    let mut cpus = Vec::with_capacity(used.len());
    for (index, (&os_id, place)) in used.iter().zip(&places).enumerate() {
        let next = cores.len();
        let core = *cores.entry(place.core_key.clone()).or_insert(next);
        cpus.push(Cpu {
            id: CpuId(index),
            os_id: OsCpu(os_id),
            core,
            package: packages.binary_search(&place.package).unwrap_or(0),
            class: classes[&os_id],
            speed: speeds[&os_id],
            emulated_speed: None,
        });
    }
    harmonise_core_classes(&mut cpus, &mut notes);
    let caches = caches(&cpu_dir, &used, &mut notes);

    let waitpkg = match &options.proc_root {
        Some(proc_root) => match std::fs::read_to_string(proc_root.join("cpuinfo")) {
            Ok(text) => cpuinfo_has_flag(&text, "waitpkg"),
            Err(_) => {
                notes.push(format!("{}/cpuinfo unreadable: waitpkg taken as absent", proc_root.display()));
                false
            }
        },
        None => false,
    };
    notes.sort();
    notes.dedup();
    let mut source = format!(
        "sysfs:{} (speeds: {speed_source}; classes: {class_source}; allowed: {allowed_from})",
        options.sysfs_root.display()
    );
    if !notes.is_empty() {
        source.push_str(&format!("; notes: {}", notes.join("; ")));
    }
    let machine = Machine { name: "this host".to_string(), source, cpus, caches, waitpkg };
    machine.validate()?;
    Ok(Discovery { machine, online, allowed: used, allowed_from, speed_source, class_source, notes })
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|text| text.trim().to_string())
}

fn online_cpus(cpu_dir: &Path, notes: &mut Vec<String>) -> Result<Vec<usize>, TopologyError> {
    if let Some(text) = read_trimmed(&cpu_dir.join("online")) {
        return parse_cpu_list(&text);
    }
    notes.push("cpu/online missing: every cpuN directory taken as online".into());
    let entries = std::fs::read_dir(cpu_dir)
        .map_err(|error| TopologyError::Io { path: cpu_dir.to_path_buf(), error })?;
    let mut cpus: Vec<usize> = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.strip_prefix("cpu")?.parse().ok())
        .collect();
    cpus.sort_unstable();
    Ok(cpus)
}

/// The affinity mask intersected with the cgroup cpuset, or what the caller gave; `None`
/// allows every CPU.
fn allowed_cpus(options: &DiscoverOptions, notes: &mut Vec<String>) -> (Option<Vec<usize>>, String) {
    if let Some(allowed) = &options.allowed {
        let mut allowed = allowed.clone();
        allowed.sort_unstable();
        allowed.dedup();
        return (Some(allowed), "given by the caller".into());
    }
    let Some(proc_root) = &options.proc_root else {
        return (None, "all online CPUs (no procfs given)".into());
    };
    let mut allowed: Option<Vec<usize>> = None;
    let mut from = Vec::new();
    let status = proc_root.join("self/status");
    match std::fs::read_to_string(&status).ok().and_then(|text| affinity_from_status(&text)) {
        Some(mask) => {
            allowed = Some(mask);
            from.push("affinity mask".to_string());
        }
        None => notes.push(format!("no Cpus_allowed_list in {}: affinity not applied", status.display())),
    }
    let cgroup = std::fs::read_to_string(proc_root.join("self/cgroup")).unwrap_or_default();
    match cgroup_cpuset(&cgroup, &options.sysfs_root.join("fs/cgroup")) {
        Some((set, file)) => {
            allowed = Some(match allowed {
                Some(mask) => mask.into_iter().filter(|cpu| set.binary_search(cpu).is_ok()).collect(),
                None => set,
            });
            from.push(format!("cgroup cpuset ({})", file.display()));
        }
        None => notes.push("no cgroup cpuset file found: cpuset not applied".into()),
    }
    match allowed {
        Some(allowed) => (Some(allowed), from.join(" ∩ ")),
        None => (None, "all online CPUs (no affinity or cpuset found)".into()),
    }
}

/// `Cpus_allowed_list` of a `/proc/<pid>/status` text.
pub fn affinity_from_status(status: &str) -> Option<Vec<usize>> {
    let line = status.lines().find_map(|line| line.strip_prefix("Cpus_allowed_list:"))?;
    parse_cpu_list(line).ok()
}

/// The effective cpuset of the cgroup a `/proc/self/cgroup` text names, looked up under the
/// cgroup mount `cgroup_root` (normally `/sys/fs/cgroup`). Tries cgroup v2
/// (`cpuset.cpus.effective`, also under a hybrid `unified/` mount) then v1
/// (`cpuset/…/cpuset.effective_cpus`), walking up to the nearest ancestor that has the file,
/// because a cgroup without the cpuset controller inherits its parent's set.
pub fn cgroup_cpuset(proc_cgroup: &str, cgroup_root: &Path) -> Option<(Vec<usize>, PathBuf)> {
    let mut candidates: Vec<(PathBuf, &str, &str)> = Vec::new();
    for line in proc_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        let relative = path.trim_start_matches('/');
        if controllers.is_empty() {
            candidates.push((cgroup_root.to_path_buf(), relative, "cpuset.cpus.effective"));
            candidates.push((cgroup_root.join("unified"), relative, "cpuset.cpus.effective"));
        } else if controllers.split(',').any(|c| c == "cpuset") {
            for mount in ["cpuset", "cpuset,cpu", "cpu,cpuset"] {
                candidates.push((cgroup_root.join(mount), relative, "cpuset.effective_cpus"));
            }
        }
    }
    // v1 first when present: on hybrid hosts the v2 tree has no cpuset controller.
    candidates.sort_by_key(|(_, _, file)| *file != "cpuset.effective_cpus");
    for (mount, relative, file) in candidates {
        let mut dir = mount.join(relative);
        loop {
            let path = dir.join(file);
            if let Some(set) = read_trimmed(&path).and_then(|text| parse_cpu_list(&text).ok()) {
                if !set.is_empty() {
                    return Some((set, path));
                }
            }
            if dir == mount || !dir.pop() {
                break;
            }
        }
    }
    None
}

/// Whether every `flags` line of a `/proc/cpuinfo` text lists `flag` (and there is one).
pub fn cpuinfo_has_flag(cpuinfo: &str, flag: &str) -> bool {
    let mut flag_lines = cpuinfo
        .lines()
        .filter_map(|line| line.split_once(':'))
        .filter(|(key, _)| key.trim() == "flags")
        .map(|(_, value)| value)
        .peekable();
    flag_lines.peek().is_some() && flag_lines.all(|flags| flags.split_whitespace().any(|f| f == flag))
}

/// Relative speeds of the online CPUs from the best source every one of them has.
fn speeds(cpu_dir: &Path, online: &[usize]) -> (BTreeMap<usize, f64>, SpeedSource) {
    let sources = [
        (SpeedSource::Cppc, "acpi_cppc/highest_perf"),
        (SpeedSource::Capacity, "cpu_capacity"),
        (SpeedSource::MaxFreq, "cpufreq/cpuinfo_max_freq"),
    ];
    for (source, file) in sources {
        let raw: Option<Vec<f64>> = online
            .iter()
            .map(|cpu| {
                read_trimmed(&cpu_dir.join(format!("cpu{cpu}/{file}")))?
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && *v > 0.0)
            })
            .collect();
        if let Some(raw) = raw {
            let max = raw.iter().copied().fold(0.0, f64::max);
            return (online.iter().zip(&raw).map(|(&cpu, &value)| (cpu, value / max)).collect(), source);
        }
    }
    (online.iter().map(|&cpu| (cpu, 1.0)).collect(), SpeedSource::None)
}

/// Below this fraction of the fastest speed a CPU counts as little when no hybrid PMU says.
const LITTLE_BELOW: f64 = 0.8;

/// Core classes: from Intel's hybrid PMU directories when present, else from speeds.
fn classes(
    sysfs_root: &Path,
    online: &[usize],
    speeds: &BTreeMap<usize, f64>,
) -> (BTreeMap<usize, CoreClass>, String) {
    let list = |name: &str| {
        read_trimmed(&sysfs_root.join(format!("devices/{name}/cpus"))).and_then(|t| parse_cpu_list(&t).ok())
    };
    if let (Some(big), Some(little)) = (list("cpu_core"), list("cpu_atom")) {
        let class_of = |cpu: &usize| {
            if big.contains(cpu) {
                CoreClass::Big
            } else if little.contains(cpu) {
                CoreClass::Little
            } else {
                CoreClass::Uniform
            }
        };
        return (
            online.iter().map(|cpu| (*cpu, class_of(cpu))).collect(),
            "hybrid PMU (cpu_core, cpu_atom)".into(),
        );
    }
    if speeds.values().any(|&speed| speed < LITTLE_BELOW) {
        let classes = speeds
            .iter()
            .map(|(&cpu, &speed)| {
                (cpu, if speed < LITTLE_BELOW { CoreClass::Little } else { CoreClass::Big })
            })
            .collect();
        return (classes, format!("speed (little below {LITTLE_BELOW} of the fastest)"));
    }
    (online.iter().map(|&cpu| (cpu, CoreClass::Uniform)).collect(), "uniform (all speeds alike)".into())
}

/// Identifies a physical core across the machine.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum CoreKey {
    /// (package, the lowest kernel id among its SMT siblings): the kernel's own grouping.
    FirstSibling(i64, usize),
    /// (package, die, core_id) when no siblings list exists.
    Ids(i64, i64, i64),
}

struct Place {
    package: i64,
    core_key: CoreKey,
}

fn place(cpu_dir: &Path, cpu: usize, notes: &mut Vec<String>) -> Place {
    let topology = cpu_dir.join(format!("cpu{cpu}/topology"));
    let mut number =
        |file: &str, default: i64| match read_trimmed(&topology.join(file)).and_then(|t| t.parse().ok()) {
            Some(value) => value,
            None => {
                notes.push(format!("topology/{file} missing: {default} used"));
                default
            }
        };
    // Some Arm firmware reports package -1; it is still one package.
    let package = number("physical_package_id", 0).max(0);
    let siblings = ["core_cpus_list", "thread_siblings_list"]
        .iter()
        .find_map(|file| read_trimmed(&topology.join(file)).and_then(|t| parse_cpu_list(&t).ok()))
        .filter(|list| list.contains(&cpu));
    let core_key = match siblings {
        Some(list) => CoreKey::FirstSibling(package, list[0]),
        None => {
            let die = read_trimmed(&topology.join("die_id")).and_then(|t| t.parse().ok()).unwrap_or(0);
            let core_id = number("core_id", cpu as i64);
            CoreKey::Ids(package, die, core_id)
        }
    };
    Place { package, core_key }
}

/// SMT siblings share one core and so one class; should speeds put them on both sides of the
/// big/little line, the core takes its first sibling's class.
fn harmonise_core_classes(cpus: &mut [Cpu], notes: &mut Vec<String>) {
    let mut first_class: BTreeMap<usize, CoreClass> = BTreeMap::new();
    for cpu in cpus.iter_mut() {
        let class = *first_class.entry(cpu.core).or_insert(cpu.class);
        if cpu.class != class {
            notes.push(format!("SMT siblings of core {} differ in class: {class} used", cpu.core));
            cpu.class = class;
        }
    }
}

/// Every distinct cache of the used CPUs, restricted to them, lowest level first.
fn caches(cpu_dir: &Path, used: &[usize], notes: &mut Vec<String>) -> Vec<Cache> {
    let dense = |os_id: &usize| used.binary_search(os_id).ok().map(CpuId);
    let mut found: Vec<Cache> = Vec::new();
    for &cpu in used {
        let cache_dir = cpu_dir.join(format!("cpu{cpu}/cache"));
        let Ok(entries) = std::fs::read_dir(&cache_dir) else {
            notes.push(format!("cpu{cpu}/cache missing: no caches listed for it"));
            continue;
        };
        let mut indexes: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("index")))
            .collect();
        indexes.sort();
        for index in indexes {
            let read = |file: &str| read_trimmed(&index.join(file));
            let (Some(level), Some(size)) = (
                read("level").and_then(|l| l.parse::<u8>().ok()),
                read("size").and_then(|s| parse_size(&s).ok()),
            ) else {
                notes.push(format!("cpu{cpu}/cache/{}: no level or size, skipped", index.display()));
                continue;
            };
            let kind = match read("type").as_deref() {
                Some("Data") => CacheKind::Data,
                Some("Instruction") => CacheKind::Instruction,
                _ => CacheKind::Unified,
            };
            let line_bytes = read("coherency_line_size").and_then(|l| l.parse().ok()).unwrap_or_else(|| {
                notes.push("cache coherency_line_size missing: 64 used".into());
                64
            });
            let shared = read("shared_cpu_list").and_then(|l| parse_cpu_list(&l).ok()).unwrap_or_else(|| {
                notes.push("cache shared_cpu_list missing: cache taken as private".into());
                vec![cpu]
            });
            // The kernel lists the CPU itself; keep it even if a broken tree does not.
            let mut cpus: Vec<CpuId> = shared.iter().chain([&cpu]).filter_map(dense).collect();
            cpus.sort_unstable();
            cpus.dedup();
            let cache = Cache { level, kind, size_bytes: size, line_bytes, cpus };
            if !found.contains(&cache) {
                found.push(cache);
            }
        }
    }
    let kind_order = |kind: CacheKind| match kind {
        CacheKind::Data => 0,
        CacheKind::Instruction => 1,
        CacheKind::Unified => 2,
    };
    found.sort_by_key(|c| (c.level, kind_order(c.kind), c.cpus.first().copied()));
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waitpkg_is_read_from_cpuinfo_flags() {
        let with =
            "processor\t: 0\nflags\t\t: fpu vme waitpkg avx2\n\nprocessor\t: 1\nflags\t\t: fpu waitpkg\n";
        let without = "processor\t: 0\nflags\t\t: fpu vme avx2 waitpkgx\n";
        let mixed = "flags\t: waitpkg\nflags\t: fpu\n";
        assert!(cpuinfo_has_flag(with, "waitpkg"));
        assert!(!cpuinfo_has_flag(without, "waitpkg"));
        assert!(!cpuinfo_has_flag(mixed, "waitpkg"));
        assert!(!cpuinfo_has_flag("Features\t: fp asimd\n", "waitpkg"));
        assert!(!cpuinfo_has_flag("", "waitpkg"));
    }

    #[test]
    fn affinity_is_read_from_status() {
        let status = "Name:\tcat\nCpus_allowed:\tf\nCpus_allowed_list:\t0-2,5\nMems_allowed:\t1\n";
        assert_eq!(affinity_from_status(status), Some(vec![0, 1, 2, 5]));
        assert_eq!(affinity_from_status("Name:\tcat\n"), None);
    }

    #[test]
    fn speeds_fall_back_to_the_next_source_and_classes_follow() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let cpu_dir = dir.join("devices/system/cpu");
        for (cpu, capacity, freq) in [(0, "1024", "3000000"), (1, "410", "1800000")] {
            std::fs::create_dir_all(cpu_dir.join(format!("cpu{cpu}/cpufreq"))).unwrap();
            std::fs::write(cpu_dir.join(format!("cpu{cpu}/cpu_capacity")), capacity).unwrap();
            std::fs::write(cpu_dir.join(format!("cpu{cpu}/cpufreq/cpuinfo_max_freq")), freq).unwrap();
        }
        // cppc only on one CPU: not usable, capacity wins.
        std::fs::create_dir_all(cpu_dir.join("cpu0/acpi_cppc")).unwrap();
        std::fs::write(cpu_dir.join("cpu0/acpi_cppc/highest_perf"), "255").unwrap();
        let (speeds, source) = speeds(&cpu_dir, &[0, 1]);
        assert_eq!(source, SpeedSource::Capacity);
        assert_eq!(speeds[&1], 410.0 / 1024.0);
        let (classes, _) = classes(dir, &[0, 1], &speeds);
        assert_eq!((classes[&0], classes[&1]), (CoreClass::Big, CoreClass::Little));
        std::fs::remove_file(cpu_dir.join("cpu1/cpu_capacity")).unwrap();
        let (speeds, source) = super::speeds(&cpu_dir, &[0, 1]);
        assert_eq!(source, SpeedSource::MaxFreq);
        assert_eq!(speeds[&1], 0.6);
    }
}
