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
    let os_ids: Vec<usize> = machine.cpus().iter().map(|c| c.os_id.0).collect();
    assert_eq!(os_ids, vec![2, 3, 10, 11, 12]);
    assert_eq!(machine.cpu_by_os_id(corehop_topology::OsCpu(10)), Some(CpuId(2)));
    assert_eq!(machine.cpu_by_os_id(corehop_topology::OsCpu(0)), None);
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
    assert_eq!(found.machine.cpus()[0].os_id.0, 4);
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

/// Writes `machine` as the sysfs tree a kernel would show for it: topology, caches, classes
/// as hybrid PMU lists, speeds as `acpi_cppc/highest_perf` in thousandths.
fn write_as_sysfs(machine: &Machine, root: &FakeRoot) {
    let os = |cpus: &[CpuId]| {
        let ids: Vec<usize> = cpus.iter().map(|c| machine.cpus()[c.0].os_id.0).collect();
        corehop_topology::format_cpu_list(&ids)
    };
    let os_ids: Vec<usize> = machine.cpus().iter().map(|c| c.os_id.0).collect();
    root.online(&corehop_topology::format_cpu_list(&os_ids));
    for cpu in machine.cpus() {
        let siblings = os(&machine.smt_siblings(cpu.id));
        root.topology(cpu.os_id.0, cpu.package * 10, cpu.core, &siblings);
        root.cpu_file(cpu.os_id.0, "acpi_cppc/highest_perf", &format!("{}", (cpu.speed * 1000.0).round()));
        for (index, cache) in machine.caches_of(cpu.id).enumerate() {
            let kind = match cache.kind {
                CacheKind::Data => "Data",
                CacheKind::Instruction => "Instruction",
                CacheKind::Unified => "Unified",
            };
            let size = corehop_topology::format_size(cache.size_bytes);
            root.cache(cpu.os_id.0, index, cache.level, kind, &size, &os(&cache.cpus));
        }
    }
    let of_class = |class: CoreClass| {
        let ids: Vec<usize> = machine.cpus().iter().filter(|c| c.class == class).map(|c| c.os_id.0).collect();
        corehop_topology::format_cpu_list(&ids)
    };
    root.write("sys/devices/cpu_core/cpus", &of_class(CoreClass::Big));
    root.write("sys/devices/cpu_atom/cpus", &of_class(CoreClass::Little));
}

mod round_trip {
    use super::*;
    use corehop_topology::{CoreGroup, MachineBuilder, Per};
    use proptest::prelude::*;

    fn arbitrary_machine() -> impl Strategy<Value = Machine> {
        let group = (1usize..4, 1usize..3, 0usize..3, 0u8..3, 100u32..=1000);
        proptest::collection::vec(group, 1..4).prop_map(|groups| {
            let mut builder = MachineBuilder::new("this host");
            for (index, (count, threads, package, class, thousandths)) in groups.into_iter().enumerate() {
                let class = [CoreClass::Uniform, CoreClass::Big, CoreClass::Little][class as usize];
                // The first group is the fastest, as discovery normalises to the fastest CPU.
                let speed = if index == 0 { 1.0 } else { f64::from(thousandths) / 1000.0 };
                builder = builder.group(
                    CoreGroup::new(count)
                        .threads(threads)
                        .package(package)
                        .class(class)
                        .speed(speed)
                        .cache(1, CacheKind::Data, 32 << 10, Per::Core)
                        .cache(1, CacheKind::Instruction, 32 << 10, Per::Core)
                        .cache(2, CacheKind::Unified, 1 << 20, Per::Group),
                );
            }
            builder.cache(3, CacheKind::Unified, 4 << 20, Per::Package).build().unwrap()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]

        /// A machine written as a sysfs tree is discovered as the same machine, and a random
        /// allowed subset gives a valid machine of exactly those CPUs.
        #[test]
        fn discovery_reads_back_what_sysfs_says(machine in arbitrary_machine(), keep in any::<u64>()) {
            let root = FakeRoot::new();
            write_as_sysfs(&machine, &root);
            let mut found = discover_at(&root.sys()).unwrap();
            found.source = machine.source.clone();
            // Kernel order lists caches by level, then data before instruction.
            let mut expected = machine.clone();
            expected.caches.sort_by_key(|c| (c.level, c.kind as u8, c.cpus[0]));
            found.caches.sort_by_key(|c| (c.level, c.kind as u8, c.cpus[0]));
            prop_assert_eq!(&found, &expected);

            let allowed: Vec<usize> = (0..machine.cpus().len()).filter(|i| keep >> (i % 64) & 1 == 1).collect();
            let options = DiscoverOptions { allowed: Some(allowed.clone()), ..DiscoverOptions::sysfs(root.sys()) };
            match discover_with(&options) {
                Ok(restricted) => {
                    let machine = &restricted.machine;
                    machine.validate().unwrap();
                    let os_ids: Vec<usize> = machine.cpus().iter().map(|c| c.os_id.0).collect();
                    prop_assert_eq!(os_ids, allowed);
                    for cache in &machine.caches {
                        prop_assert!(cache.cpus.iter().all(|c| c.0 < machine.cpus().len()));
                    }
                }
                Err(error) => {
                    prop_assert!(allowed.is_empty(), "{}", error);
                    prop_assert!(matches!(error, TopologyError::NothingAllowed { .. }), "{}", error);
                }
            }
        }
    }
}

#[test]
fn siblings_on_both_sides_of_the_little_line_share_one_class() {
    let root = FakeRoot::new();
    root.online("0-3");
    for cpu in 0..4 {
        let first = cpu & !1;
        root.topology(cpu, 0, first, &format!("{first}-{}", first + 1));
        // cpu1 reads slower than its sibling cpu0 and than the 0.8 line.
        root.cpu_file(cpu, "cpu_capacity", ["1024", "800", "1024", "1024"][cpu]);
    }
    let found = discover_with(&DiscoverOptions::sysfs(root.sys())).unwrap();
    assert_eq!(found.machine.cpus()[1].class, found.machine.cpus()[0].class);
    assert!(found.notes.iter().any(|n| n.contains("differ in class")), "{:?}", found.notes);
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

#[test]
fn a_real_kvm_guest_snapshot() {
    let found = discover_with(&DiscoverOptions::sysfs(fixture("kvm-2cpu/sys"))).unwrap();
    let machine = &found.machine;
    assert_eq!((machine.cpus().len(), machine.cores().len(), machine.package_count()), (2, 2, 1));
    assert_eq!(found.speed_source, SpeedSource::Capacity);
    assert!(machine.cpus().iter().all(|c| c.class == CoreClass::Uniform && c.speed == 1.0));
    assert_eq!(
        sizes_of(machine, 1)[..3],
        [
            (1, CacheKind::Data, 32 << 10, 1),
            (1, CacheKind::Instruction, 32 << 10, 1),
            (2, CacheKind::Unified, 1 << 20, 1),
        ]
    );
    let l3 = machine.shared_cache(CpuId(0), CpuId(1)).unwrap();
    assert_eq!((l3.level, l3.size_bytes, l3.line_bytes), (3, 32 << 20, 64));
    assert!(found.notes.is_empty(), "{:?}", found.notes);
}

#[test]
fn a_real_cpuinfo_without_waitpkg() {
    let cpuinfo = std::fs::read_to_string(fixture("cpuinfo-kvm-epyc.txt")).unwrap();
    assert!(!corehop_topology::cpuinfo_has_flag(&cpuinfo, "waitpkg"));
    assert!(corehop_topology::cpuinfo_has_flag(&cpuinfo, "avx2"));
    assert!(!corehop_topology::cpuinfo_has_flag(&cpuinfo, "avx51"), "whole flags only, not prefixes");
}
