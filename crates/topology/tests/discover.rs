//! Discovery on fake sysfs/procfs trees: a hybrid laptop, an Arm big.LITTLE phone and a
//! two-socket SMT server, plus allowed-set restrictions and missing files.

use std::path::{Path, PathBuf};

use corehop_topology::{
    discover, discover_at, discover_with, CacheKind, CoreClass, CpuId, DiscoverOptions, Machine, SpeedSource,
    TopologyError,
};
use tempfile::TempDir;

/// A fake root with `sys/` and `proc/` below it, written file by file.
struct FakeRoot {
    dir: TempDir,
}

impl FakeRoot {
    fn new() -> FakeRoot {
        FakeRoot { dir: tempfile::tempdir().unwrap() }
    }
    fn sys(&self) -> PathBuf {
        self.dir.path().join("sys")
    }
    fn proc(&self) -> PathBuf {
        self.dir.path().join("proc")
    }
    fn write(&self, relative: &str, content: &str) {
        let path = self.dir.path().join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, format!("{content}\n")).unwrap();
    }
    fn cpu_file(&self, cpu: usize, file: &str, content: &str) {
        self.write(&format!("sys/devices/system/cpu/cpu{cpu}/{file}"), content);
    }
    fn online(&self, list: &str) {
        self.write("sys/devices/system/cpu/online", list);
    }
    /// Topology files as the kernel writes them.
    fn topology(&self, cpu: usize, package: usize, core_id: usize, siblings: &str) {
        self.cpu_file(cpu, "topology/physical_package_id", &package.to_string());
        self.cpu_file(cpu, "topology/die_id", "0");
        self.cpu_file(cpu, "topology/core_id", &core_id.to_string());
        self.cpu_file(cpu, "topology/core_cpus_list", siblings);
        self.cpu_file(cpu, "topology/thread_siblings_list", siblings);
    }
    fn cache(&self, cpu: usize, index: usize, level: u8, kind: &str, size: &str, shared: &str) {
        let dir = format!("cache/index{index}");
        self.cpu_file(cpu, &format!("{dir}/level"), &level.to_string());
        self.cpu_file(cpu, &format!("{dir}/type"), kind);
        self.cpu_file(cpu, &format!("{dir}/size"), size);
        self.cpu_file(cpu, &format!("{dir}/coherency_line_size"), "64");
        self.cpu_file(cpu, &format!("{dir}/shared_cpu_list"), shared);
    }
}

fn ids(range: std::ops::Range<usize>) -> Vec<CpuId> {
    range.map(CpuId).collect()
}

fn sizes_of(machine: &Machine, cpu: usize) -> Vec<(u8, CacheKind, u64, usize)> {
    machine.caches_of(CpuId(cpu)).map(|c| (c.level, c.kind, c.size_bytes, c.cpus.len())).collect()
}

/// 2 P-cores × 2 threads (cpu0-3) + 4 E-cores (cpu4-7), Alder Lake style, with cppc.
fn hybrid_laptop(with_pmu_dirs: bool) -> FakeRoot {
    let root = FakeRoot::new();
    root.online("0-7");
    for cpu in 0..8 {
        if cpu < 4 {
            let first = cpu & !1;
            let siblings = format!("{first}-{}", first + 1);
            root.topology(cpu, 0, first * 4, &siblings);
            root.cache(cpu, 0, 1, "Data", "48K", &siblings);
            root.cache(cpu, 1, 1, "Instruction", "32K", &siblings);
            root.cache(cpu, 2, 2, "Unified", "1280K", &siblings);
            // Favoured cores: the first P-core boosts a little higher.
            root.cpu_file(cpu, "acpi_cppc/highest_perf", if cpu < 2 { "70" } else { "68" });
        } else {
            root.topology(cpu, 0, 8 + cpu, &cpu.to_string());
            root.cache(cpu, 0, 1, "Data", "32K", &cpu.to_string());
            root.cache(cpu, 1, 1, "Instruction", "64K", &cpu.to_string());
            root.cache(cpu, 2, 2, "Unified", "2048K", "4-7");
            root.cpu_file(cpu, "acpi_cppc/highest_perf", "39");
        }
        root.cache(cpu, 3, 3, "Unified", "12288K", "0-7");
        root.cpu_file(cpu, "cpu_capacity", "1024");
        root.cpu_file(cpu, "cpufreq/cpuinfo_max_freq", if cpu < 4 { "4400000" } else { "3300000" });
    }
    if with_pmu_dirs {
        root.write("sys/devices/cpu_core/cpus", "0-3");
        root.write("sys/devices/cpu_atom/cpus", "4-7");
    }
    root
}

#[test]
fn hybrid_laptop_p_cores_with_smt_and_e_cores() {
    let root = hybrid_laptop(true);
    let found = discover_with(&DiscoverOptions::sysfs(root.sys())).unwrap();
    let machine = &found.machine;
    assert_eq!(machine.cpus().len(), 8);
    assert_eq!(machine.cores().len(), 6);
    assert_eq!(machine.package_count(), 1);
    assert_eq!(machine.smt_siblings(CpuId(1)), ids(0..2));
    assert_eq!(machine.smt_siblings(CpuId(3)), ids(2..4));
    assert_eq!(machine.smt_siblings(CpuId(5)), vec![CpuId(5)]);
    assert_eq!(found.speed_source, SpeedSource::Cppc);
    assert!(found.class_source.contains("hybrid PMU"));
    let classes: Vec<CoreClass> = machine.cpus().iter().map(|c| c.class).collect();
    assert_eq!(classes[..4], [CoreClass::Big; 4]);
    assert_eq!(classes[4..], [CoreClass::Little; 4]);
    assert_eq!(machine.cpus()[0].speed, 1.0);
    assert_eq!(machine.cpus()[2].speed, 68.0 / 70.0);
    assert_eq!(machine.cpus()[7].speed, 39.0 / 70.0);
    assert_eq!(
        sizes_of(machine, 0),
        vec![
            (1, CacheKind::Data, 48 << 10, 2),
            (1, CacheKind::Instruction, 32 << 10, 2),
            (2, CacheKind::Unified, 1280 << 10, 2),
            (3, CacheKind::Unified, 12 << 20, 8),
        ]
    );
    let e_l2 = machine.caches_of(CpuId(6)).find(|c| c.level == 2).unwrap();
    assert_eq!(e_l2.cpus, ids(4..8));
    assert_eq!(machine.llc_of(CpuId(6)).unwrap().level, 3);
    assert_eq!(machine.private_cache_bytes(CpuId(6)), 32 << 10);
    assert!(!machine.waitpkg);
    assert!(found.notes.is_empty(), "{:?}", found.notes);
}

#[test]
fn hybrid_without_pmu_dirs_classes_come_from_speed() {
    let root = hybrid_laptop(false);
    let found = discover_with(&DiscoverOptions::sysfs(root.sys())).unwrap();
    assert!(found.class_source.contains("speed"));
    let classes: Vec<CoreClass> = found.machine.cpus().iter().map(|c| c.class).collect();
    assert_eq!(classes[..4], [CoreClass::Big; 4], "68/70 is still a P-core");
    assert_eq!(classes[4..], [CoreClass::Little; 4]);
}

/// 4 Cortex-A55-like (cpu0-3) + 4 Cortex-A78-like (cpu4-7): cpu_capacity, per-cluster L2.
fn biglittle_phone() -> FakeRoot {
    let root = FakeRoot::new();
    root.online("0-7");
    for cpu in 0..8 {
        let cluster = if cpu < 4 { "0-3" } else { "4-7" };
        // Arm numbers cores per cluster: core_id repeats; the siblings list keeps them apart.
        root.topology(cpu, 0, cpu % 4, &cpu.to_string());
        root.cache(cpu, 0, 1, "Data", if cpu < 4 { "32K" } else { "64K" }, &cpu.to_string());
        root.cache(cpu, 1, 1, "Instruction", if cpu < 4 { "32K" } else { "64K" }, &cpu.to_string());
        root.cache(cpu, 2, 2, "Unified", if cpu < 4 { "512K" } else { "2048K" }, cluster);
        root.cpu_file(cpu, "cpu_capacity", if cpu < 4 { "446" } else { "1024" });
        root.cpu_file(cpu, "cpufreq/cpuinfo_max_freq", if cpu < 4 { "2000000" } else { "2800000" });
    }
    root
}

#[test]
fn biglittle_phone_from_cpu_capacity_with_cluster_l2() {
    let root = biglittle_phone();
    let found = discover_with(&DiscoverOptions::sysfs(root.sys())).unwrap();
    let machine = &found.machine;
    assert_eq!(found.speed_source, SpeedSource::Capacity);
    assert_eq!(machine.cores().len(), 8, "per-cluster core ids must not merge cores");
    assert!(machine.cpus()[..4].iter().all(|c| c.class == CoreClass::Little && c.speed == 446.0 / 1024.0));
    assert!(machine.cpus()[4..].iter().all(|c| c.class == CoreClass::Big && c.speed == 1.0));
    let l2s: Vec<&[CpuId]> =
        machine.caches.iter().filter(|c| c.level == 2).map(|c| c.cpus.as_slice()).collect();
    assert_eq!(l2s, vec![&ids(0..4)[..], &ids(4..8)[..]]);
    assert_eq!(machine.llc_of(CpuId(5)).unwrap().size_bytes, 2 << 20);
}

/// Two sockets × 4 cores × 2 threads; the kernel numbers second threads 8-15 (cpu n and n+8
/// are siblings), socket 0 = cpus 0-3,8-11.
fn two_socket_server() -> FakeRoot {
    let root = FakeRoot::new();
    root.online("0-15");
    for cpu in 0..16 {
        let first = cpu % 8;
        let socket = first / 4;
        let siblings = format!("{first},{}", first + 8);
        root.topology(cpu, socket, first % 4, &siblings);
        root.cache(cpu, 0, 1, "Data", "32K", &siblings);
        root.cache(cpu, 1, 1, "Instruction", "32K", &siblings);
        root.cache(cpu, 2, 2, "Unified", "256K", &siblings);
        root.cache(cpu, 3, 3, "Unified", "8192K", if socket == 0 { "0-3,8-11" } else { "4-7,12-15" });
        root.cpu_file(cpu, "cpufreq/cpuinfo_max_freq", "2267000");
    }
    root.write(
        "proc/cpuinfo",
        "processor\t: 0\nflags\t\t: fpu sse2 waitpkg\n\nprocessor\t: 1\nflags\t\t: fpu sse2 waitpkg\n",
    );
    root
}

#[test]
fn two_socket_server_siblings_and_per_socket_l3() {
    let root = two_socket_server();
    let found = discover_with(&DiscoverOptions::sysfs(root.sys())).unwrap();
    let machine = &found.machine;
    assert_eq!((machine.cpus().len(), machine.cores().len(), machine.package_count()), (16, 8, 2));
    assert_eq!(found.speed_source, SpeedSource::MaxFreq);
    assert!(machine.cpus().iter().all(|c| c.class == CoreClass::Uniform && c.speed == 1.0));
    assert_eq!(machine.smt_siblings(CpuId(1)), vec![CpuId(1), CpuId(9)]);
    assert_eq!(machine.cpus()[12].package, 1);
    let l3 = machine.llc_of(CpuId(9)).unwrap();
    assert_eq!(l3.cpus, [ids(0..4), ids(8..12)].concat());
    assert_eq!(machine.caches.iter().filter(|c| c.level == 3).count(), 2);
    assert_eq!(machine.caches.iter().filter(|c| c.level == 1).count(), 16);
    assert!(!machine.waitpkg, "no procfs given: waitpkg is not read");
}

#[test]
fn allowed_set_renumbers_densely_and_trims_caches() {
    let root = two_socket_server();
    let options =
        DiscoverOptions { allowed: Some(vec![12, 2, 3, 10, 11, 99]), ..DiscoverOptions::sysfs(root.sys()) };
    let found = discover_with(&options).unwrap();
    let machine = &found.machine;
    assert_eq!(found.allowed, vec![2, 3, 10, 11, 12]);
    assert_eq!(found.allowed_from, "given by the caller");
    let os_ids: Vec<usize> = machine.cpus().iter().map(|c| c.os_id).collect();
    assert_eq!(os_ids, vec![2, 3, 10, 11, 12]);
    assert_eq!(machine.cpu_by_os_id(10), Some(CpuId(2)));
    assert_eq!(machine.cpu_by_os_id(0), None);
    assert_eq!(machine.smt_siblings(CpuId(0)), vec![CpuId(0), CpuId(2)]);
    assert_eq!(machine.smt_siblings(CpuId(4)), vec![CpuId(4)], "cpu12's sibling 4 is not allowed");
    assert_eq!(machine.cores().len(), 3);
    assert_eq!(machine.package_count(), 2);
    assert_eq!(machine.cpus()[4].package, 1);
    assert_eq!(machine.llc_of(CpuId(1)).unwrap().cpus, ids(0..4));
    assert_eq!(machine.llc_of(CpuId(4)).unwrap().cpus, vec![CpuId(4)]);
    machine.validate().unwrap();
}

#[test]
fn cgroup_v2_cpuset_and_affinity_restrict_the_machine() {
    let root = two_socket_server();
    root.write("proc/self/status", "Name:\tcorehop\nCpus_allowed:\tffff\nCpus_allowed_list:\t0-5\n");
    root.write("proc/self/cgroup", "0::/app.slice/job.scope");
    // The job's own cgroup has no cpuset controller: its parent's set applies.
    root.write("sys/fs/cgroup/app.slice/job.scope/cgroup.procs", "1");
    root.write("sys/fs/cgroup/app.slice/cpuset.cpus.effective", "4-7,12-15");
    root.write("sys/fs/cgroup/cpuset.cpus.effective", "0-15");
    let options = DiscoverOptions { proc_root: Some(root.proc()), ..DiscoverOptions::sysfs(root.sys()) };
    let found = discover_with(&options).unwrap();
    assert_eq!(found.allowed, vec![4, 5]);
    assert!(found.allowed_from.contains("affinity mask"), "{}", found.allowed_from);
    assert!(found.allowed_from.contains("app.slice/cpuset.cpus.effective"), "{}", found.allowed_from);
    assert_eq!(found.machine.package_count(), 1);
    assert_eq!(found.machine.cpus()[0].os_id, 4);
    assert!(found.machine.waitpkg, "every flags line lists waitpkg");
    assert!(found.machine.source.contains("cgroup cpuset"));
}

#[test]
fn cgroup_v1_cpuset_restricts_the_machine() {
    let root = two_socket_server();
    root.write("proc/self/status", "Cpus_allowed_list:\t0-15\n");
    root.write("proc/self/cgroup", "4:memory:/docker/abc\n3:cpuset:/docker/abc\n0::/\n");
    root.write("sys/fs/cgroup/cpuset/docker/abc/cpuset.effective_cpus", "8-11");
    let options = DiscoverOptions { proc_root: Some(root.proc()), ..DiscoverOptions::sysfs(root.sys()) };
    let found = discover_with(&options).unwrap();
    assert_eq!(found.allowed, vec![8, 9, 10, 11]);
    assert_eq!(found.machine.cores().len(), 4);
    assert!(found.machine.cpus().iter().all(|c| c.package == 0));
}

#[test]
fn missing_files_degrade_to_defaults_with_notes() {
    let root = FakeRoot::new();
    // No online file, no topology, no caches, no speed source: just two cpu directories.
    root.cpu_file(0, "uevent", "");
    root.cpu_file(1, "uevent", "");
    root.write("sys/devices/system/cpu/cpufreq/policy0", "");
    root.write("proc/self/status", "Name:\tx\n");
    let options = DiscoverOptions { proc_root: Some(root.proc()), ..DiscoverOptions::sysfs(root.sys()) };
    let found = discover_with(&options).unwrap();
    let machine = &found.machine;
    assert_eq!(machine.cpus().len(), 2);
    assert_eq!(machine.cores().len(), 2);
    assert!(machine.caches.is_empty());
    assert_eq!(found.speed_source, SpeedSource::None);
    assert!(machine.cpus().iter().all(|c| c.speed == 1.0 && c.class == CoreClass::Uniform));
    for expected in ["cpu/online missing", "Cpus_allowed_list", "cpuset not applied", "cpuinfo unreadable"] {
        assert!(
            found.notes.iter().any(|n| n.contains(expected)),
            "no note about {expected}: {:?}",
            found.notes
        );
    }
    assert!(machine.source.contains("notes:"));
}

#[test]
fn bad_trees_and_empty_allowed_sets_are_errors() {
    let empty = FakeRoot::new();
    let error = discover_at(&empty.sys()).unwrap_err();
    assert!(matches!(error, TopologyError::NoCpus { .. }), "{error}");
    assert!(error.to_string().contains("devices/system/cpu"));

    let root = two_socket_server();
    let options = DiscoverOptions { allowed: Some(vec![40, 41]), ..DiscoverOptions::sysfs(root.sys()) };
    let error = discover_with(&options).unwrap_err();
    assert!(matches!(error, TopologyError::NothingAllowed { .. }));
    assert!(error.to_string().contains("0-15") && error.to_string().contains("40-41"), "{error}");

    root.online("0-3,x");
    assert!(matches!(discover_at(&root.sys()), Err(TopologyError::CpuList { .. })));
}

#[test]
fn this_host_is_discovered() {
    let host = Path::new("/sys/devices/system/cpu");
    if !host.is_dir() {
        println!("skipped: this host has no /sys/devices/system/cpu");
        return;
    }
    let machine = discover().unwrap();
    machine.validate().unwrap();
    assert!(!machine.cpus().is_empty());
    assert!(machine.source.starts_with("sysfs:/sys"));
}
