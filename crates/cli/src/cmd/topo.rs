//! `corehop topo`: a machine as corehop sees it.
//!
//! By default this host, discovered from sysfs and restricted to the CPUs this process may use;
//! `--machine FILE` or `--preset NAME` show a description instead. The tree reads like
//! `lstopo --of console`: packages, then the caches their cores share, then cores with their
//! private caches, then the hardware threads (CPUs) with class and speed.

use std::path::PathBuf;

use anyhow::Context;
use corehop_topology::{
    discover_with, format_cpu_list, format_size, presets, Cache, CacheKind, CpuId, DiscoverOptions,
    Discovery, Machine,
};
use serde::Serialize;

use corehop_bench::report::{self, Table};

/// Show a machine: packages, cores, SMT siblings, caches, core classes, speeds and the CPUs
/// this process may use.
///
/// Without options it discovers this host from /sys (affinity mask and cgroup cpuset applied).
#[derive(clap::Args)]
pub struct Args {
    /// Print JSON instead of the tree: {"machine": {name, source, cpus: [{id, os_id, core,
    /// package, class, speed, emulated_speed}], caches: [{level, kind, size_bytes, line_bytes,
    /// cpus}], waitpkg}, "discovery": null | {online, allowed, allowed_from, speed_source,
    /// class_source, notes}}. CPU ids in `cpus`/`caches` are dense machine ids; `os_id`,
    /// `online` and `allowed` are the kernel's numbers.
    #[arg(long)]
    pub json: bool,

    /// Show the machine described in this TOML file instead of this host (format:
    /// machines/README.md).
    #[arg(long, value_name = "FILE.toml", conflicts_with = "preset")]
    pub machine: Option<PathBuf>,

    /// Show a built-in machine instead of this host (see --list-presets), e.g. switch-cs,
    /// o2-16core, multiserver-xeon, hybrid-laptop.
    #[arg(long, value_name = "NAME")]
    pub preset: Option<String>,

    /// Discover from a copy of another machine's sysfs tree instead of /sys (procfs is then
    /// not read: every online CPU counts as allowed).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["machine", "preset"])]
    pub sysfs: Option<PathBuf>,

    /// Emulation overrides: run some CPUs at a fraction of their speed, e.g. "1=0.25" or
    /// "1=0.25,2-3=0.5" (dense CPU ids as printed; fractions in (0, 1]). Shown, and kept in the
    /// file --save writes.
    #[arg(long, value_name = "CPU=FRACTION,...")]
    pub emulate: Option<String>,

    /// Also write the machine shown (emulation included) to this TOML file, to edit it or load
    /// it later with --machine (e.g. in `corehop sim`).
    #[arg(long, value_name = "FILE.toml")]
    pub save: Option<PathBuf>,

    /// List the built-in machines and the paper each comes from, then exit.
    #[arg(long)]
    pub list_presets: bool,
}

#[derive(Serialize)]
struct Output<'a> {
    machine: &'a Machine,
    discovery: Option<DiscoveryJson<'a>>,
}

#[derive(Serialize)]
struct DiscoveryJson<'a> {
    online: &'a [usize],
    allowed: &'a [usize],
    allowed_from: &'a str,
    speed_source: String,
    class_source: &'a str,
    notes: &'a [String],
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.list_presets {
        print!("{}", preset_table());
        return Ok(());
    }
    let (mut machine, discovery) = load(&args)?;
    if let Some(emulate) = &args.emulate {
        machine.apply_emulation(emulate).context("--emulate")?;
    }
    if let Some(path) = &args.save {
        std::fs::write(path, machine.to_toml_string())
            .with_context(|| format!("cannot write the machine to {}", path.display()))?;
    }
    if args.json {
        let discovery = discovery.as_ref().map(|d| DiscoveryJson {
            online: &d.online,
            allowed: &d.allowed,
            allowed_from: &d.allowed_from,
            speed_source: d.speed_source.to_string(),
            class_source: &d.class_source,
            notes: &d.notes,
        });
        report::print_json(&Output { machine: &machine, discovery })?;
    } else {
        print!("{}", render(&machine, discovery.as_ref()));
        if let Some(path) = &args.save {
            println!("saved to {}", path.display());
        }
    }
    Ok(())
}

fn load(args: &Args) -> anyhow::Result<(Machine, Option<Discovery>)> {
    if let Some(path) = &args.machine {
        return Ok((Machine::from_toml_file(path)?, None));
    }
    if let Some(name) = &args.preset {
        return Ok((presets::by_name(name)?, None));
    }
    let options = match &args.sysfs {
        Some(root) => DiscoverOptions::sysfs(root),
        None => DiscoverOptions::host(),
    };
    let discovery = discover_with(&options).context("discovering this machine")?;
    Ok((discovery.machine.clone(), Some(discovery)))
}

fn preset_table() -> Table {
    let mut table = Table::new(["preset", "cpus", "cores", "packages", "what it is"])
        .title("Built-in machines (corehop topo --preset NAME)")
        .align(4, report::Align::Left);
    for name in presets::names() {
        let machine = presets::by_name(name).expect("every listed preset builds");
        table.row([
            name.to_string(),
            machine.cpus().len().to_string(),
            machine.cores().len().to_string(),
            machine.package_count().to_string(),
            presets::describe(name).unwrap_or_default().to_string(),
        ]);
    }
    table.note(
        "fast-core-switching letters: C/S = complex/simple core at 3 GHz, c/s = at 750 MHz (quarter speed).",
    );
    table
}

fn cpus_text(cpus: &[CpuId]) -> String {
    let dense: Vec<usize> = cpus.iter().map(|c| c.0).collect();
    format!("cpu{}", format_cpu_list(&dense))
}

fn cache_label(cache: &Cache) -> String {
    let kind = match cache.kind {
        CacheKind::Data => "d",
        CacheKind::Instruction => "i",
        CacheKind::Unified => "",
    };
    format!("L{}{kind} {}", cache.level, format_size(cache.size_bytes))
}

/// The lstopo-like tree, the allowed set and the waitpkg line.
fn render(machine: &Machine, discovery: Option<&Discovery>) -> String {
    let mut out = String::new();
    let cores = machine.cores();
    out.push_str(&format!(
        "Machine \"{}\": {}, {}, {}\n",
        machine.name,
        count(machine.cpus().len(), "CPU"),
        count(cores.len(), "core"),
        count(machine.package_count(), "package")
    ));
    // Discovery details follow below the tree; the source's first word is enough here.
    let source = match discovery {
        Some(_) => machine.source.split(" (").next().unwrap_or_default(),
        None => machine.source.as_str(),
    };
    out.push_str(&format!("  source: {source}\n"));
    // Each cache is printed at the smallest scope holding all its CPUs.
    let within = |cache: &Cache, cpus: &[CpuId]| cache.cpus.iter().all(|c| cpus.contains(c));
    let all: Vec<CpuId> = machine.cpus().iter().map(|c| c.id).collect();
    let package_cpus: Vec<Vec<CpuId>> =
        (0..machine.package_count()).map(|p| machine.package_cpus(p)).collect();
    let shared_label = |cache: &Cache| format!("{} shared by {}", cache_label(cache), cpus_text(&cache.cpus));
    // Widest first, as lstopo nests them: L3 above the cluster L2s.
    let mut by_level: Vec<&Cache> = machine.caches.iter().collect();
    by_level.sort_by_key(|cache| std::cmp::Reverse(cache.level));
    for &cache in &by_level {
        if !package_cpus.iter().any(|cpus| within(cache, cpus)) && within(cache, &all) {
            out.push_str(&format!("  {}\n", shared_label(cache)));
        }
    }
    for (package, cpus) in package_cpus.iter().enumerate() {
        out.push_str(&format!("  Package {package}\n"));
        for &cache in &by_level {
            let core_local = cores.iter().any(|core| within(cache, &core.cpus));
            if within(cache, cpus) && !core_local {
                out.push_str(&format!("    {}\n", shared_label(cache)));
            }
        }
        for core in cores.iter().filter(|core| core.package == package) {
            let private: Vec<String> = machine
                .caches
                .iter()
                .filter(|cache| within(cache, &core.cpus))
                .map(|cache| {
                    if cache.cpus.len() < core.cpus.len() {
                        format!("{} ({})", cache_label(cache), cpus_text(&cache.cpus))
                    } else {
                        cache_label(cache)
                    }
                })
                .collect();
            let caches = if private.is_empty() { String::new() } else { format!("  {}", private.join(" ")) };
            out.push_str(&format!("    Core {} ({}){caches}\n", core.index, core.class));
            for &id in &core.cpus {
                let cpu = &machine.cpus()[id.0];
                let mut line = format!("      {} (os {})  speed {:.2}", cpu.id, cpu.os_id, cpu.speed);
                if let Some(emulated) = cpu.emulated_speed {
                    line.push_str(&format!("  emulated x{emulated} -> runs at {:.3}", cpu.effective_speed()));
                }
                out.push_str(&line);
                out.push('\n');
            }
        }
    }
    if let Some(discovery) = discovery {
        out.push_str(&format!(
            "Allowed: os cpus {} of online {}, from {}\n",
            format_cpu_list(&discovery.allowed),
            format_cpu_list(&discovery.online),
            discovery.allowed_from
        ));
        out.push_str(&format!(
            "Speeds from {}; classes: {}\n",
            discovery.speed_source, discovery.class_source
        ));
        for note in &discovery.notes {
            out.push_str(&format!("  note: {note}\n"));
        }
    }
    out.push_str(&waitpkg_line(machine));
    out.push('\n');
    out
}

/// "1 core", "6 cores".
fn count(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

fn waitpkg_line(machine: &Machine) -> String {
    if machine.waitpkg {
        "User-level monitor/wait (waitpkg): yes - an idle worker can wait with UMONITOR/UMWAIT".to_string()
    } else {
        "User-level monitor/wait (waitpkg): no - the runtime's spin-then-park sleeps with futex".to_string()
    }
}

/// The tour's first stop: this host in a few lines.
pub fn tour() -> anyhow::Result<()> {
    let discovery = discover_with(&DiscoverOptions::host()).context("discovering this machine")?;
    let machine = &discovery.machine;
    print!("{}", tour_table(machine));
    println!(
        "allowed: os cpus {} from {}; speeds from {}",
        format_cpu_list(&discovery.allowed),
        discovery.allowed_from,
        discovery.speed_source
    );
    let smt = machine.cores().iter().any(|core| core.cpus.len() > 1);
    let classes: std::collections::BTreeSet<String> =
        machine.cpus().iter().map(|c| c.class.to_string()).collect();
    // What a hop from cpu0 to its nearest other CPU can keep warm: their smallest shared cache.
    let nearest = machine
        .caches_of(CpuId(0))
        .filter(|cache| cache.cpus.len() > 1 && cache.kind != CacheKind::Instruction)
        .min_by_key(|cache| cache.level)
        .map(|cache| format!("cpu0 shares its {} with {}", cache_label(cache), cpus_text(&cache.cpus)))
        .unwrap_or_else(|| "cpu0 shares no cache with another CPU".into());
    println!(
        "Takeaway: {} CPUs on {} cores ({}, {}); {}; {}.",
        machine.cpus().len(),
        machine.cores().len(),
        if smt { "with SMT" } else { "no SMT" },
        if classes.len() > 1 { "mixed core classes" } else { "one core class" },
        nearest,
        waitpkg_line(machine).replace("User-level monitor/wait (waitpkg)", "waitpkg")
    );
    Ok(())
}

/// One row per run of alike CPUs (same package, class, speed and caches), so that a
/// 128-CPU server stays a few lines.
fn tour_table(machine: &Machine) -> Table {
    let header =
        ["cpus", "os ids", "cores", "package", "class", "speed", "own data cache", "last-level cache"];
    let mut table = Table::new(header)
        .title("This machine, as corehop sees it (corehop topo for the full tree)")
        .align(1, report::Align::Left)
        .align(4, report::Align::Left)
        .align(7, report::Align::Left);
    let mut rows: Vec<(Vec<String>, Vec<CpuId>)> = Vec::new();
    for cpu in machine.cpus() {
        let llc = machine
            .llc_of(cpu.id)
            .map(|c| format!("{} shared by {}", cache_label(c), cpus_text(&c.cpus)))
            .unwrap_or_else(|| "-".into());
        let key = vec![
            cpu.package.to_string(),
            cpu.class.to_string(),
            format!("{:.2}", cpu.speed),
            format_size(machine.private_cache_bytes(cpu.id)),
            llc,
        ];
        match rows.last_mut() {
            Some((last, cpus)) if *last == key => cpus.push(cpu.id),
            _ => rows.push((key, vec![cpu.id])),
        }
    }
    for (key, cpus) in rows {
        let os_ids: Vec<usize> = cpus.iter().map(|id| machine.cpus()[id.0].os_id.0).collect();
        let mut cores: Vec<usize> = cpus.iter().map(|id| machine.cpus()[id.0].core).collect();
        cores.dedup();
        let mut row = vec![cpus_text(&cpus), format_cpu_list(&os_ids), cores.len().to_string()];
        row.extend(key);
        table.row(row);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_places_caches_at_their_scope() {
        let mut machine = presets::by_name("hybrid-laptop").unwrap();
        machine.apply_emulation("5=0.5").unwrap();
        let text = render(&machine, None);
        assert!(text.contains("Machine \"hybrid-laptop\": 8 CPUs, 6 cores, 1 package\n"), "{text}");
        assert!(text.contains("  Package 0\n    L3 12M shared by cpu0-7\n"), "{text}");
        assert!(text.contains("    L2 2M shared by cpu4-7\n"), "{text}");
        assert!(text.contains("    Core 0 (big)  L1d 48K L1i 32K L2 1280K\n"), "{text}");
        assert!(text.contains("      cpu1 (os 1)  speed 1.00\n"), "{text}");
        assert!(text.contains("      cpu5 (os 5)  speed 0.60  emulated x0.5 -> runs at 0.300\n"), "{text}");
        assert!(text.contains("waitpkg): no"), "{text}");
    }

    #[test]
    fn tour_runs_on_this_host() {
        if !std::path::Path::new("/sys/devices/system/cpu").is_dir() {
            println!("skipped: this host has no /sys/devices/system/cpu");
            return;
        }
        tour().unwrap();
    }

    #[test]
    fn tour_table_folds_alike_cpus() {
        let text = tour_table(&presets::by_name("multiserver-xeon").unwrap()).render();
        assert_eq!(text.lines().count(), 5, "title, header, rule, one row per socket: {text}");
        assert!(text.contains("cpu0-7   0-7"), "{text}");
        assert!(text.contains("L3 8M shared by cpu8-15"), "{text}");
        let text = tour_table(&presets::by_name("hybrid-laptop").unwrap()).render();
        assert!(text.contains("big") && text.contains("little") && text.contains("1328K"), "{text}");
    }

    #[test]
    fn multi_package_caches_go_under_their_package() {
        let text = render(&presets::by_name("o2-16core").unwrap(), None);
        assert_eq!(text.matches("  Package ").count(), 4);
        assert!(text.contains("  Package 1\n    L3 2M shared by cpu4-7\n"), "{text}");
    }
}
