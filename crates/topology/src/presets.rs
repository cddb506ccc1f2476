//! Built-in machines: the papers' machines and two of today's.
//!
//! | preset | paper / origin | what it is |
//! | --- | --- | --- |
//! | `switch-c` | fast-core-switching `sim_C` | one complex core (uniprocessor baseline) |
//! | `switch-cc` | `sim_CC` | two complex cores at 3 GHz |
//! | `switch-ss` | `sim_SS` | two simple cores at 3 GHz |
//! | `switch-cs` | `sim_CS` | complex + simple core, both 3 GHz |
//! | `switch-cs-quarter` | `sim_Cs` | complex 3 GHz + simple 750 MHz |
//! | `switch-cc-quarter` | `sim_Cc` | complex 3 GHz + complex 750 MHz |
//! | `switch-cccc` | `sim_CCCC` | four complex cores |
//! | `switch-ccss` | `sim_CCSS` | two complex + two simple cores, all 3 GHz |
//! | `switch-ccss-quarter` | `sim_CCss` | two complex 3 GHz + two simple 750 MHz |
//! | `o2-16core` | o2-coretime §5 | 4 quad-core 2 GHz AMD Opteron chips |
//! | `offload-2core` | selective-os-offload Table II | 2 in-order 3.5 GHz UltraSPARC cores |
//! | `multiserver-xeon` | slower-is-faster §4 | dual quad-core Xeon E5520, hyper-threaded |
//! | `smt-2way` | smt-asymmetric-multiprocessing §4 | one hyper-threaded Pentium 4 core |
//! | `hybrid-laptop` | today | 2 P-cores with SMT + 4 E-cores |
//! | `biglittle-phone` | today | 4 little + 4 big Arm cores, per-cluster L2 |
//!
//! **fast-core-switching** (§4): "C" is an Alpha EV6-like complex core with 64 KB 2-way L1
//! I and D caches; "S" an EV4-like simple core with 8 KB L1 I and D caches; both share a
//! 3.5 MB L2. Upper case runs at 3 GHz, lower case at 750 MHz: a quarter speed. The first
//! letter(s) are the application core(s), the rest the OS ("service") cores; here CPU ids follow
//! the letters (cpu0 is the first letter), whereas the paper numbered the slower core 0. The
//! paper gives no single speed ratio of S to C; a simple core is set to 0.5 of a complex one
//! at the same clock, from the unmodified-kernel rows of its macrobenchmarks (Web: 4562 vs
//! 10467 req/s on `sim_SS` vs `sim_CC`, 0.44; Table 9: 1079 vs 2087, 0.52). So C = 1.0,
//! S = 0.5, c = 0.25, s = 0.125; complex cores are [`CoreClass::Big`], simple ones
//! [`CoreClass::Little`].
//!
//! **o2-coretime**: 16 cores on four chips; each core has its own L1 and L2 (64 KB L1 D and
//! I, 512 KB L2 — "16 512 Kbyte L2 caches"), each chip a 2 MB L3 shared by its four cores.
//!
//! **selective-os-offload**: one user core and one OS core, in-order, 32 KB L1 I and D and a
//! private 1 MB L2 each (directory-based MESI between them).
//!
//! **slower-is-faster-multiserver**: two Xeon E5520 (Nehalem-EP) sockets, 4 cores × 2
//! hyper-threads each; 32 KB L1 I and D and 256 KB L2 per core, 8 MB L3 per socket. The paper
//! slows cores by frequency scaling and throttling: use emulation overrides for that.
//!
//! **smt-asymmetric-multiprocessing**: a Pentium 4 with Hyper-Threading, two logical CPUs on
//! one core. The paper gives no cache sizes; these are a Northwood's (8 KB L1 D, 512 KB L2),
//! the trace cache is left out.
//!
//! **hybrid-laptop**: an Alder Lake-U-like part cut to 2 P-cores (SMT, 48 KB L1 D, 32 KB L1 I,
//! 1.25 MB L2) + 4 E-cores (32 KB L1 D, 64 KB L1 I, a 2 MB L2 per 4-core cluster), 12 MB L3;
//! E-cores at 0.6 of a P-core.
//!
//! **biglittle-phone**: a classic big.LITTLE phone, little cluster first as phones number it:
//! 4 Cortex-A53-like (32 KB L1 I and D, 512 KB cluster L2, speed 0.4) then 4
//! Cortex-A73-like (64 KB L1 I and D, 2 MB cluster L2, speed 1.0).

use crate::{CacheKind, CoreClass, CoreGroup, Machine, MachineBuilder, Per, TopologyError};

const K: u64 = 1024;
const M: u64 = 1024 * 1024;

/// Every preset name, in the order of the table in the module docs.
pub fn names() -> &'static [&'static str] {
    &[
        "switch-c",
        "switch-cc",
        "switch-ss",
        "switch-cs",
        "switch-cs-quarter",
        "switch-cc-quarter",
        "switch-cccc",
        "switch-ccss",
        "switch-ccss-quarter",
        "o2-16core",
        "offload-2core",
        "multiserver-xeon",
        "smt-2way",
        "hybrid-laptop",
        "biglittle-phone",
    ]
}

/// A one-line description of a preset, for listings.
pub fn describe(name: &str) -> Option<&'static str> {
    Some(match name {
        "switch-c" => "fast-core-switching sim_C: one 3 GHz complex core",
        "switch-cc" => "fast-core-switching sim_CC: two 3 GHz complex cores",
        "switch-ss" => "fast-core-switching sim_SS: two 3 GHz simple cores",
        "switch-cs" => "fast-core-switching sim_CS: complex app core + simple OS core, 3 GHz",
        "switch-cs-quarter" => "fast-core-switching sim_Cs: complex app core + 750 MHz simple OS core",
        "switch-cc-quarter" => "fast-core-switching sim_Cc: complex app core + 750 MHz complex OS core",
        "switch-cccc" => "fast-core-switching sim_CCCC: four 3 GHz complex cores",
        "switch-ccss" => "fast-core-switching sim_CCSS: two complex + two simple cores, 3 GHz",
        "switch-ccss-quarter" => "fast-core-switching sim_CCss: two complex + two 750 MHz simple cores",
        "o2-16core" => "O2/CoreTime: four quad-core 2 GHz Opteron chips, L3 per chip",
        "offload-2core" => "selective OS offload: in-order user core + OS core, private L2s",
        "multiserver-xeon" => "slower-is-faster: 2 x quad-core Xeon E5520 with hyper-threading",
        "smt-2way" => "SMT AMP/SMP: one hyper-threaded Pentium 4 core",
        "hybrid-laptop" => "today's laptop: 2 P-cores with SMT + 4 E-cores",
        "biglittle-phone" => "today's phone: 4 little + 4 big Arm cores, L2 per cluster",
        _ => return None,
    })
}

/// The preset called `name` (see the module docs for what each is).
///
/// # Examples
/// ```
/// use corehop_topology::presets;
/// let machine = presets::by_name("o2-16core").unwrap();
/// assert_eq!(machine.cpus().len(), 16);
/// let error = presets::by_name("cray-1").unwrap_err().to_string();
/// assert!(error.contains("switch-cs"));
/// ```
pub fn by_name(name: &str) -> Result<Machine, TopologyError> {
    let builder = match name {
        "switch-c" => switching(name, "C"),
        "switch-cc" => switching(name, "CC"),
        "switch-ss" => switching(name, "SS"),
        "switch-cs" => switching(name, "CS"),
        "switch-cs-quarter" => switching(name, "Cs"),
        "switch-cc-quarter" => switching(name, "Cc"),
        "switch-cccc" => switching(name, "CCCC"),
        "switch-ccss" => switching(name, "CCSS"),
        "switch-ccss-quarter" => switching(name, "CCss"),
        "o2-16core" => o2_16core(),
        "offload-2core" => offload_2core(),
        "multiserver-xeon" => multiserver_xeon(),
        "smt-2way" => smt_2way(),
        "hybrid-laptop" => hybrid_laptop(),
        "biglittle-phone" => biglittle_phone(),
        _ => return Err(TopologyError::UnknownPreset { name: name.to_string(), known: names().to_vec() }),
    };
    builder.source(format!("preset:{name}")).build()
}

/// A machine named on a command line or in a scenario: a preset name, or a path to a machine
/// file (anything ending in `.toml` or containing a `/`).
///
/// # Examples
/// ```
/// use corehop_topology::presets;
/// assert_eq!(presets::load("smt-2way").unwrap().cpus().len(), 2);
/// assert!(presets::load("machines/absent.toml").unwrap_err().to_string().contains("absent.toml"));
/// assert!(presets::load("absent").unwrap_err().to_string().contains("known presets"));
/// ```
pub fn load(spec: &str) -> Result<Machine, TopologyError> {
    if spec.ends_with(".toml") || spec.contains('/') {
        Machine::from_toml_file(spec)
    } else {
        by_name(spec)
    }
}

/// The fast-core-switching configurations, one letter per core.
fn switching(name: &str, letters: &str) -> MachineBuilder {
    let mut builder = MachineBuilder::new(name);
    for letter in letters.chars() {
        let complex = letter.eq_ignore_ascii_case(&'c');
        let quarter = letter.is_ascii_lowercase();
        let (class, speed, l1) =
            if complex { (CoreClass::Big, 1.0, 64 * K) } else { (CoreClass::Little, 0.5, 8 * K) };
        builder = builder.group(
            CoreGroup::new(1)
                .class(class)
                .speed(if quarter { speed / 4.0 } else { speed })
                .cache(1, CacheKind::Data, l1, Per::Core)
                .cache(1, CacheKind::Instruction, l1, Per::Core),
        );
    }
    builder.cache(2, CacheKind::Unified, 3584 * K, Per::Machine)
}

fn o2_16core() -> MachineBuilder {
    let mut builder = MachineBuilder::new("o2-16core");
    for chip in 0..4 {
        builder = builder.group(
            CoreGroup::new(4)
                .package(chip)
                .cache(1, CacheKind::Data, 64 * K, Per::Core)
                .cache(1, CacheKind::Instruction, 64 * K, Per::Core)
                .cache(2, CacheKind::Unified, 512 * K, Per::Core),
        );
    }
    builder.cache(3, CacheKind::Unified, 2 * M, Per::Package)
}

fn offload_2core() -> MachineBuilder {
    MachineBuilder::new("offload-2core").group(
        CoreGroup::new(2)
            .cache(1, CacheKind::Data, 32 * K, Per::Core)
            .cache(1, CacheKind::Instruction, 32 * K, Per::Core)
            .cache(2, CacheKind::Unified, M, Per::Core),
    )
}

fn multiserver_xeon() -> MachineBuilder {
    let mut builder = MachineBuilder::new("multiserver-xeon");
    for socket in 0..2 {
        builder = builder.group(
            CoreGroup::new(4)
                .threads(2)
                .package(socket)
                .cache(1, CacheKind::Data, 32 * K, Per::Core)
                .cache(1, CacheKind::Instruction, 32 * K, Per::Core)
                .cache(2, CacheKind::Unified, 256 * K, Per::Core),
        );
    }
    builder.cache(3, CacheKind::Unified, 8 * M, Per::Package)
}

fn smt_2way() -> MachineBuilder {
    MachineBuilder::new("smt-2way").group(
        CoreGroup::new(1).threads(2).cache(1, CacheKind::Data, 8 * K, Per::Core).cache(
            2,
            CacheKind::Unified,
            512 * K,
            Per::Core,
        ),
    )
}

fn hybrid_laptop() -> MachineBuilder {
    MachineBuilder::new("hybrid-laptop")
        .group(
            CoreGroup::new(2)
                .threads(2)
                .class(CoreClass::Big)
                .cache(1, CacheKind::Data, 48 * K, Per::Core)
                .cache(1, CacheKind::Instruction, 32 * K, Per::Core)
                .cache(2, CacheKind::Unified, 1280 * K, Per::Core),
        )
        .group(
            CoreGroup::new(4)
                .class(CoreClass::Little)
                .speed(0.6)
                .cache(1, CacheKind::Data, 32 * K, Per::Core)
                .cache(1, CacheKind::Instruction, 64 * K, Per::Core)
                .cache(2, CacheKind::Unified, 2 * M, Per::Group),
        )
        .cache(3, CacheKind::Unified, 12 * M, Per::Machine)
}

fn biglittle_phone() -> MachineBuilder {
    MachineBuilder::new("biglittle-phone")
        .group(
            CoreGroup::new(4)
                .class(CoreClass::Little)
                .speed(0.4)
                .cache(1, CacheKind::Data, 32 * K, Per::Core)
                .cache(1, CacheKind::Instruction, 32 * K, Per::Core)
                .cache(2, CacheKind::Unified, 512 * K, Per::Group),
        )
        .group(
            CoreGroup::new(4)
                .class(CoreClass::Big)
                .cache(1, CacheKind::Data, 64 * K, Per::Core)
                .cache(1, CacheKind::Instruction, 64 * K, Per::Core)
                .cache(2, CacheKind::Unified, 2 * M, Per::Group),
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CpuId;

    #[test]
    fn every_preset_builds_valid_and_is_described() {
        for name in names() {
            let machine = by_name(name).unwrap();
            machine.validate().unwrap();
            assert_eq!(machine.name, *name);
            assert_eq!(machine.source, format!("preset:{name}"));
            assert!(describe(name).is_some(), "{name} has no description");
            let fastest = machine.cpus().iter().map(|c| c.speed).fold(0.0, f64::max);
            // Two simple cores keep their speed relative to the family's complex core.
            let expected = if *name == "switch-ss" { 0.5 } else { 1.0 };
            assert_eq!(fastest, expected, "{name}: fastest core");
        }
        assert!(describe("nope").is_none());
    }

    #[test]
    fn unknown_preset_lists_the_known_ones() {
        let error = by_name("switch-xx").unwrap_err();
        let message = error.to_string();
        assert!(matches!(error, TopologyError::UnknownPreset { .. }));
        for name in names() {
            assert!(message.contains(name), "{message}");
        }
    }

    #[test]
    fn switching_configurations_follow_the_papers_letters() {
        let speeds = |name: &str| -> Vec<(CoreClass, f64)> {
            by_name(name).unwrap().cpus().iter().map(|c| (c.class, c.speed)).collect()
        };
        use CoreClass::{Big, Little};
        assert_eq!(speeds("switch-cc"), vec![(Big, 1.0), (Big, 1.0)]);
        assert_eq!(speeds("switch-ss"), vec![(Little, 0.5), (Little, 0.5)]);
        assert_eq!(speeds("switch-cs"), vec![(Big, 1.0), (Little, 0.5)]);
        assert_eq!(speeds("switch-cs-quarter"), vec![(Big, 1.0), (Little, 0.125)]);
        assert_eq!(speeds("switch-cc-quarter"), vec![(Big, 1.0), (Big, 0.25)]);
        assert_eq!(speeds("switch-ccss-quarter").len(), 4);
        let cs = by_name("switch-cs").unwrap();
        assert_eq!(cs.caches_of(CpuId(1)).find(|c| c.level == 1).unwrap().size_bytes, 8 * K);
        let l2 = cs.llc_of(CpuId(0)).unwrap();
        assert_eq!((l2.level, l2.size_bytes, l2.cpus.len()), (2, 3584 * K, 2));
    }

    #[test]
    fn paper_machines_have_their_shape() {
        let o2 = by_name("o2-16core").unwrap();
        assert_eq!((o2.cpus().len(), o2.cores().len(), o2.package_count()), (16, 16, 4));
        let l3 = o2.llc_of(CpuId(5)).unwrap();
        assert_eq!((l3.size_bytes, l3.cpus.clone()), (2 * M, (4..8).map(CpuId).collect()));
        // "The total amount of cache space is 16 Mbytes (four 2 Mbyte L3 caches and 16 512
        // Kbyte L2 caches)".
        let l2_l3: u64 = o2.caches.iter().filter(|c| c.level >= 2).map(|c| c.size_bytes).sum();
        assert_eq!(l2_l3, 16 * M);

        let xeon = by_name("multiserver-xeon").unwrap();
        assert_eq!((xeon.cpus().len(), xeon.cores().len(), xeon.package_count()), (16, 8, 2));
        assert_eq!(xeon.smt_siblings(CpuId(3)), vec![CpuId(2), CpuId(3)]);
        let level = |a, b| xeon.shared_cache(CpuId(a), CpuId(b)).map(|c| c.level);
        assert_eq!((level(2, 3), level(2, 5), level(2, 9)), (Some(1), Some(3), None));

        let smt = by_name("smt-2way").unwrap();
        assert_eq!(smt.smt_siblings(CpuId(0)), vec![CpuId(0), CpuId(1)]);

        let offload = by_name("offload-2core").unwrap();
        assert_eq!(offload.private_cache_bytes(CpuId(1)), 32 * K + M);

        let laptop = by_name("hybrid-laptop").unwrap();
        assert_eq!(laptop.cpus().len(), 8);
        assert_eq!(laptop.smt_siblings(CpuId(0)).len(), 2);
        assert_eq!(laptop.cpus()[4].class, CoreClass::Little);

        let phone = by_name("biglittle-phone").unwrap();
        let cluster = phone.caches.iter().find(|c| c.level == 2 && c.cpus.contains(&CpuId(6))).unwrap();
        assert_eq!(cluster.cpus, (4..8).map(CpuId).collect::<Vec<_>>());
        assert_eq!(phone.cpus()[0].class, CoreClass::Little);
    }
}
