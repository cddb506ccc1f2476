//! Machine description files (TOML).
//!
//! Two ways to list the CPUs, one per file (see `machines/README.md` for the full format):
//!
//! ```toml
//! name = "tiny hybrid"
//! emulate = "2=0.25"          # optional: emulation overrides, dense ids
//!
//! [[cores]]                    # compact: groups of identical cores
//! count = 2
//! threads = 2
//! class = "big"
//! caches = [{ level = 1, kind = "data", size = "48K", per = "core" }]
//!
//! [[cores]]
//! count = 4
//! class = "little"
//! speed = 0.6
//! caches = [{ level = 2, size = "2M", per = "group" }]
//!
//! [[caches]]                   # shared by all groups
//! level = 3
//! size = "12M"
//! per = "machine"
//! ```
//!
//! or one entry per CPU, which is what [`Machine::to_toml_string`] writes:
//!
//! ```toml
//! name = "two cores"
//! cpus = [
//!   { os_id = 0, core = 0, package = 0, class = "big", speed = 1.0 },
//!   { os_id = 1, core = 1, package = 0, class = "little", speed = 0.5, emulated_speed = 0.25 },
//! ]
//! caches = [{ level = 2, kind = "unified", size = "1M", line = 64, cpus = "0-1" }]
//! ```

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use serde::Deserialize;

use crate::builder::expand_cache;
use crate::{
    format_cpu_list, format_size, parse_cpu_list, parse_size, CacheKind, CacheSpec, CoreClass, CoreGroup,
    Cpu, CpuId, Machine, MachineBuilder, OsCpu, Per, TopologyError,
};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MachineFile {
    name: Option<String>,
    #[serde(default)]
    waitpkg: bool,
    cpus: Option<Vec<CpuEntry>>,
    cores: Option<Vec<GroupEntry>>,
    #[serde(default)]
    caches: Vec<CacheEntry>,
    emulate: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CpuEntry {
    os_id: Option<usize>,
    core: Option<usize>,
    #[serde(default)]
    package: usize,
    #[serde(default)]
    class: CoreClass,
    #[serde(default = "full_speed")]
    speed: f64,
    emulated_speed: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupEntry {
    count: usize,
    #[serde(default = "one")]
    threads: usize,
    #[serde(default)]
    package: usize,
    #[serde(default)]
    class: CoreClass,
    #[serde(default = "full_speed")]
    speed: f64,
    emulated_speed: Option<f64>,
    #[serde(default)]
    caches: Vec<CacheEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CacheEntry {
    level: u8,
    #[serde(default = "unified")]
    kind: CacheKind,
    size: SizeEntry,
    #[serde(default = "line")]
    line: u32,
    per: Option<PerEntry>,
    cpus: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum SizeEntry {
    Bytes(u64),
    Text(String),
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum PerEntry {
    Cpu,
    Core,
    Group,
    Package,
    Machine,
}

fn full_speed() -> f64 {
    1.0
}
fn one() -> usize {
    1
}
fn unified() -> CacheKind {
    CacheKind::Unified
}
fn line() -> u32 {
    64
}

impl CacheEntry {
    fn to_spec(&self) -> Result<CacheSpec, TopologyError> {
        let size_bytes = match &self.size {
            SizeEntry::Bytes(bytes) => *bytes,
            SizeEntry::Text(text) => parse_size(text)?,
        };
        let per = match (self.per, &self.cpus) {
            (Some(_), Some(_)) => return Err(self.sharing_error("has both `per` and `cpus`; give one")),
            (None, None) => {
                return Err(self.sharing_error("needs `per` (cpu, core, group, package, machine) or `cpus`"))
            }
            (None, Some(list)) => Per::Cpus(parse_cpu_list(list)?),
            (Some(per), None) => match per {
                PerEntry::Cpu => Per::Cpu,
                PerEntry::Core => Per::Core,
                PerEntry::Group => Per::Group,
                PerEntry::Package => Per::Package,
                PerEntry::Machine => Per::Machine,
            },
        };
        Ok(CacheSpec { level: self.level, kind: self.kind, size_bytes, line_bytes: self.line, per })
    }

    fn sharing_error(&self, problem: &str) -> TopologyError {
        TopologyError::Inconsistent(format!("the L{} {} cache {problem}", self.level, self.kind))
    }
}

/// A TOML error as one line that names where it is: the `toml` crate's own message quotes
/// the offending line whole, which for a file of one long line (a binary, a minified blob)
/// would be the whole file.
fn syntax_error(text: &str, e: &toml::de::Error) -> TopologyError {
    TopologyError::Syntax(match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!("line {line}, column {column}: {}", crate::excerpt(e.message(), crate::MESSAGE_CHARS))
        }
        None => crate::excerpt(e.message(), crate::MESSAGE_CHARS).into_owned(),
    })
}

impl Machine {
    /// Reads a machine description (either form, see the module docs), applies its `emulate`
    /// overrides and validates it. `source` becomes `"toml"`.
    pub fn from_toml_str(text: &str) -> Result<Machine, TopologyError> {
        let file: MachineFile = toml::from_str(text).map_err(|e| syntax_error(text, &e))?;
        let name = file.name.clone().unwrap_or_else(|| "unnamed machine".to_string());
        let mut machine = match (file.cpus, file.cores) {
            (Some(_), Some(_)) => {
                return Err(TopologyError::Inconsistent(
                    "list the CPUs either as `cpus` (one entry each) or as `cores` (groups), not both".into(),
                ))
            }
            (None, None) => return Err(TopologyError::Empty),
            (Some(cpus), None) => from_cpu_entries(&name, &cpus, &file.caches)?,
            (None, Some(groups)) => {
                let mut builder = MachineBuilder::new(name.as_str());
                for group in &groups {
                    builder = builder.group(CoreGroup {
                        count: group.count,
                        threads: group.threads,
                        package: group.package,
                        class: group.class,
                        speed: group.speed,
                        emulated_speed: group.emulated_speed,
                        caches: group.caches.iter().map(CacheEntry::to_spec).collect::<Result<_, _>>()?,
                    });
                }
                for cache in &file.caches {
                    builder = builder.cache_spec(cache.to_spec()?);
                }
                builder.build()?
            }
        };
        machine.waitpkg = file.waitpkg;
        machine.source = "toml".to_string();
        if let Some(emulate) = &file.emulate {
            machine.apply_emulation(emulate)?;
        }
        Ok(machine)
    }

    /// Reads a machine file; errors name the file. `source` becomes `"file:<path>"`.
    pub fn from_toml_file(path: impl AsRef<Path>) -> Result<Machine, TopologyError> {
        let path = path.as_ref();
        let text = read_text_file(path, MAX_DESCRIPTION_BYTES)
            .map_err(|error| TopologyError::Io { path: path.to_path_buf(), error })?;
        let mut machine = Machine::from_toml_str(&text).map_err(|e| e.in_file(path))?;
        machine.source = format!("file:{}", path.display());
        Ok(machine)
    }

    /// Writes the machine as a description file, one line per CPU and per cache, that
    /// [`Machine::from_toml_str`] reads back into an equal machine (apart from `source`,
    /// which is written as a comment).
    pub fn to_toml_string(&self) -> String {
        let quote = |text: &str| toml::Value::String(text.to_string()).to_string();
        let mut out = String::new();
        out.push_str("# corehop machine description (format: machines/README.md)\n");
        out.push_str(&format!("# source: {}\n", self.source.replace('\n', " ")));
        out.push_str(&format!("name = {}\n", quote(&self.name)));
        out.push_str(&format!("waitpkg = {}\n", self.waitpkg));
        out.push_str("cpus = [\n");
        for cpu in &self.cpus {
            out.push_str(&format!(
                "  {{ os_id = {}, core = {}, package = {}, class = \"{}\", speed = {:?}",
                cpu.os_id, cpu.core, cpu.package, cpu.class, cpu.speed
            ));
            if let Some(speed) = cpu.emulated_speed {
                out.push_str(&format!(", emulated_speed = {speed:?}"));
            }
            out.push_str(" },\n");
        }
        out.push_str("]\n");
        out.push_str("caches = [\n");
        for cache in &self.caches {
            let cpus: Vec<usize> = cache.cpus.iter().map(|c| c.0).collect();
            out.push_str(&format!(
                "  {{ level = {}, kind = \"{}\", size = \"{}\", line = {}, cpus = \"{}\" }},\n",
                cache.level,
                cache.kind,
                format_size(cache.size_bytes),
                cache.line_bytes,
                format_cpu_list(&cpus)
            ));
        }
        out.push_str("]\n");
        out
    }
}

/// The one-entry-per-CPU form: dense ids follow the list order; `core` and `package` numbers
/// may be sparse or per package (as the kernel numbers them) and are made dense here.
fn from_cpu_entries(
    name: &str,
    entries: &[CpuEntry],
    caches: &[CacheEntry],
) -> Result<Machine, TopologyError> {
    let mut packages: Vec<usize> = entries.iter().map(|e| e.package).collect();
    packages.sort_unstable();
    packages.dedup();
    let mut cores: BTreeMap<(usize, usize), usize> = BTreeMap::new();
    let mut cpus = Vec::with_capacity(entries.len());
    for (index, entry) in entries.iter().enumerate() {
        let package = packages.binary_search(&entry.package).unwrap_or(0);
        let next_core = cores.len();
        let core = *cores.entry((package, entry.core.unwrap_or(usize::MAX - index))).or_insert(next_core);
        cpus.push(Cpu {
            id: CpuId(index),
            os_id: OsCpu(entry.os_id.unwrap_or(index)),
            core,
            package,
            class: entry.class,
            speed: entry.speed,
            emulated_speed: entry.emulated_speed,
        });
    }
    let everyone: Vec<usize> = (0..cpus.len()).collect();
    let mut expanded = Vec::new();
    for cache in caches {
        let spec = cache.to_spec()?;
        if spec.per == Per::Group {
            return Err(cache.sharing_error("cannot be per group in a file that lists `cpus`"));
        }
        expand_cache(&spec, &cpus, &everyone, &mut expanded)?;
    }
    let machine =
        Machine { name: name.to_string(), source: String::new(), cpus, caches: expanded, waitpkg: false };
    machine.validate()?;
    Ok(machine)
}

/// The largest machine description or scenario read: a machine of [`crate::MAX_CPUS`] CPUs,
/// one line each and every cache listed, is about a megabyte.
pub const MAX_DESCRIPTION_BYTES: u64 = 16 << 20;

/// Reads a UTF-8 text file of at most `max_bytes`. A longer one, or one that never ends (a
/// device such as `/dev/zero`), is an error of kind [`std::io::ErrorKind::FileTooLarge`] once
/// `max_bytes + 1` bytes have come, not an allocation as large as the file. Pipes and other
/// files without a size are read as far as they go, so `<(command)` works.
pub fn read_text_file(path: &Path, max_bytes: u64) -> std::io::Result<String> {
    let too_large = || {
        std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            format!("longer than the {} read at most", crate::format_size(max_bytes)),
        )
    };
    let file = std::fs::File::open(path)?;
    // A file that says its size is refused before any of it is read.
    if file.metadata()?.len() > max_bytes {
        return Err(too_large());
    }
    let mut text = String::new();
    if file.take(max_bytes.saturating_add(1)).read_to_string(&mut text)? as u64 > max_bytes {
        return Err(too_large());
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_text_file_is_read_up_to_its_bound_and_no_further() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ten.txt");
        std::fs::write(&file, "0123456789").unwrap();
        assert_eq!(read_text_file(&file, 10).unwrap(), "0123456789");
        let refused = read_text_file(&file, 9).unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::FileTooLarge);
        assert!(refused.to_string().contains("read at most"), "{refused}");
        // A device that never ends, and says it has no size.
        let endless = read_text_file(Path::new("/dev/zero"), 1 << 10).unwrap_err();
        assert_eq!(endless.kind(), std::io::ErrorKind::FileTooLarge);
        // A pipe is read as far as it goes.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "printf piped"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(child.stdout.as_ref().unwrap());
        let piped = read_text_file(Path::new(&format!("/proc/self/fd/{fd}")), 1 << 10).unwrap();
        child.wait().unwrap();
        assert_eq!(piped, "piped");
    }

    const GROUPS: &str = r#"
name = "tiny hybrid"
emulate = "2=0.25"

[[cores]]
count = 2
threads = 2
class = "big"
caches = [{ level = 1, kind = "data", size = "48K", per = "core" }]

[[cores]]
count = 4
class = "little"
speed = 0.6
caches = [{ level = 2, size = "2M", per = "group" }]

[[caches]]
level = 3
size = "12M"
per = "machine"
"#;

    #[test]
    fn group_form_loads() {
        let machine = Machine::from_toml_str(GROUPS).unwrap();
        assert_eq!(machine.name, "tiny hybrid");
        assert_eq!(machine.cpus().len(), 8);
        assert_eq!(machine.cores().len(), 6);
        assert_eq!(machine.smt_siblings(CpuId(1)), vec![CpuId(0), CpuId(1)]);
        assert_eq!(machine.cpus[5].class, CoreClass::Little);
        assert_eq!(machine.cpus[5].speed, 0.6);
        assert_eq!(machine.cpus[2].emulated_speed, Some(0.25));
        let l2 = machine.llc_of(CpuId(4)).unwrap();
        assert_eq!(l2.level, 3);
        assert_eq!(machine.caches.iter().filter(|c| c.level == 1).count(), 2);
        let cluster = machine.caches.iter().find(|c| c.level == 2).unwrap();
        assert_eq!(cluster.cpus, (4..8).map(CpuId).collect::<Vec<_>>());
    }

    #[test]
    fn cpu_form_loads_with_kernel_style_numbers() {
        let machine = Machine::from_toml_str(
            r#"
name = "two sockets, one core each"
cpus = [
  { os_id = 0, core = 0, package = 0 },
  { os_id = 8, core = 0, package = 1 },
  { os_id = 4, core = 0, package = 0 },
]
caches = [{ level = 3, size = "8M", per = "package" }]
"#,
        )
        .unwrap();
        assert_eq!(machine.cores().len(), 2);
        assert_eq!(machine.smt_siblings(CpuId(0)), vec![CpuId(0), CpuId(2)]);
        assert_eq!(machine.cpu_by_os_id(OsCpu(8)), Some(CpuId(1)));
        assert_eq!(machine.caches.len(), 2);
    }

    fn error_of(text: &str) -> String {
        Machine::from_toml_str(text).unwrap_err().to_string()
    }

    #[test]
    fn bad_files_name_the_problem() {
        assert!(
            error_of("name = \"x\"\nspeeed = 1\n[[cores]]\ncount = 1\n").contains("unknown field `speeed`")
        );
        assert!(error_of("[[cores]]\ncount = 1\nspeed = 0\n").contains("speed 0"));
        assert!(error_of("[[cores]]\ncount = 1\nspeed = -1.0\n").contains("speed -1"));
        assert!(error_of("[[cores]]\ncount = 1\nemulated_speed = 1.5\n").contains("emulated speed 1.5"));
        assert!(error_of("[[cores]]\ncount = 2\n[[caches]]\nlevel = 2\nsize = \"1M\"\ncpus = \"1-2\"\n")
            .contains("lists cpu2"));
        assert!(error_of("cpus = [{ os_id = 3 }, { os_id = 3 }]\n").contains("os_id) 3 is listed twice"));
        assert!(matches!(Machine::from_toml_str("name = \"empty\"\n"), Err(TopologyError::Empty)));
        assert!(matches!(Machine::from_toml_str("cpus = []\n"), Err(TopologyError::Empty)));
        assert!(error_of("cpus = [{}]\n[[cores]]\ncount = 1\n").contains("not both"));
        assert!(error_of("[[cores]]\ncount = 1\ncaches = [{ level = 1, size = \"32X\", per = \"core\" }]\n")
            .contains("bad size \"32X\""));
        assert!(error_of("[[cores]]\ncount = 1\ncaches = [{ level = 1, size = \"32K\" }]\n")
            .contains("needs `per`"));
        assert!(error_of("[[cores]]\ncount = 1\nemulate = \"5=0.5\"\n").contains("unknown field `emulate`"));
        assert!(error_of("emulate = \"5=0.5\"\n[[cores]]\ncount = 1\n").contains("cpu5 does not exist"));
        assert!(error_of("[[cores]]\ncount = \"two\"\n").contains("invalid type"));
        assert!(
            error_of("name = \"x\"\nspeeed = 1\n").starts_with("line 2, column 1: unknown field `speeed`")
        );
    }

    #[test]
    fn a_syntax_error_on_a_long_line_is_one_short_line() {
        let message = error_of(&format!("name = \"x\"\n{}", "a".repeat(1 << 20)));
        assert!(message.starts_with("line 2, column "), "{message}");
        assert!(message.len() < 200 && !message.contains('\n'), "{} bytes: {message:.200}", message.len());
    }

    #[test]
    fn file_errors_name_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let path = dir.join("broken.toml");
        std::fs::write(&path, "[[cores]]\ncount = 1\nsped = 1\n").unwrap();
        let message = Machine::from_toml_file(&path).unwrap_err().to_string();
        assert!(message.contains("broken.toml") && message.contains("unknown field `sped`"), "{message}");
        let missing = Machine::from_toml_file(dir.join("missing.toml")).unwrap_err().to_string();
        assert!(missing.contains("missing.toml"), "{missing}");
    }

    fn arbitrary_machine() -> impl Strategy<Value = Machine> {
        let group = (1usize..4, 1usize..3, 0usize..3, 0u8..3, 1u32..=1000, proptest::option::of(1u32..=100));
        (proptest::collection::vec(group, 1..4), any::<bool>(), "[a-z \"\\\\]{0,12}").prop_map(
            |(groups, waitpkg, name)| {
                let mut builder = MachineBuilder::new(name).waitpkg(waitpkg);
                for (count, threads, package, class, speed, emulated) in groups {
                    let class = [CoreClass::Uniform, CoreClass::Big, CoreClass::Little][class as usize];
                    let mut group = CoreGroup::new(count)
                        .threads(threads)
                        .package(package)
                        .class(class)
                        .speed(f64::from(speed) / 1000.0)
                        .cache(1, CacheKind::Data, 32 << 10, Per::Core)
                        .cache(2, CacheKind::Unified, 1 << 20, Per::Group);
                    group.emulated_speed = emulated.map(|e| f64::from(e) / 100.0);
                    builder = builder.group(group);
                }
                builder.cache(3, CacheKind::Unified, 3 << 20, Per::Package).build().unwrap()
            },
        )
    }

    proptest! {
        #[test]
        fn save_then_load_gives_the_same_machine(machine in arbitrary_machine()) {
            let mut loaded = Machine::from_toml_str(&machine.to_toml_string()).unwrap();
            loaded.source = machine.source.clone();
            prop_assert_eq!(loaded, machine);
        }
    }
}
