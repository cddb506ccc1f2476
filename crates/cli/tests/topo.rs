//! `corehop topo` run as a program: tree, JSON, presets, files, emulation, bad input.

mod common;

use std::path::Path;

/// `corehop topo ARGS`: its stdout.
fn stdout_of(args: &[&str]) -> String {
    common::stdout_of(&[&["topo"], args].concat())
}

/// `corehop topo ARGS`, which must fail: its stderr.
fn error_of(args: &[&str]) -> String {
    common::error_of(&[&["topo"], args].concat())
}

#[test]
fn this_host_as_a_tree() {
    if !Path::new("/sys/devices/system/cpu").is_dir() {
        common::skip("this host has no /sys/devices/system/cpu");
        return;
    }
    let text = stdout_of(&[]);
    assert!(text.starts_with("Machine \"this host\": "), "{text}");
    assert!(text.contains("  Package 0\n"), "{text}");
    assert!(text.contains("(os 0)"), "{text}");
    assert!(text.contains("Allowed: os cpus "), "{text}");
    assert!(text.contains("User-level monitor/wait (waitpkg): "), "{text}");
}

#[test]
fn this_host_as_json() {
    if !Path::new("/sys/devices/system/cpu").is_dir() {
        common::skip("this host has no /sys/devices/system/cpu");
        return;
    }
    let json: serde_json::Value = serde_json::from_str(&stdout_of(&["--json"])).unwrap();
    let cpus = json["machine"]["cpus"].as_array().unwrap();
    assert!(!cpus.is_empty());
    for (index, cpu) in cpus.iter().enumerate() {
        assert_eq!(cpu["id"], index);
        for key in ["os_id", "core", "package", "class", "speed", "emulated_speed"] {
            assert!(cpu.get(key).is_some(), "cpu lacks {key}: {cpu}");
        }
    }
    let discovery = &json["discovery"];
    assert_eq!(discovery["allowed"].as_array().unwrap().len(), cpus.len());
    assert!(discovery["allowed_from"].is_string());
    assert!(json["machine"]["waitpkg"].is_boolean());
}

#[test]
fn preset_with_emulation_as_tree_and_json() {
    let text = stdout_of(&["--preset", "switch-cs-quarter", "--emulate", "0=0.5"]);
    assert!(text.contains("Machine \"switch-cs-quarter\": 2 CPUs, 2 cores, 1 package"), "{text}");
    assert!(text.contains("L2 3584K shared by cpu0-1"), "{text}");
    assert!(text.contains("cpu0 (os 0)  speed 1.00  emulated x0.5 -> runs at 0.500"), "{text}");
    assert!(text.contains("cpu1 (os 1)  speed 0.12"), "{text}");
    assert!(!text.contains("Allowed:"), "a preset has no allowed set: {text}");

    let json: serde_json::Value =
        serde_json::from_str(&stdout_of(&["--preset", "multiserver-xeon", "--json"])).unwrap();
    assert_eq!(json["machine"]["cpus"].as_array().unwrap().len(), 16);
    assert_eq!(json["machine"]["source"], "preset:multiserver-xeon");
    assert!(json["discovery"].is_null());
}

#[test]
fn list_presets_names_every_preset() {
    let text = stdout_of(&["--list-presets"]);
    for name in corehop_topology::presets::names() {
        assert!(text.contains(name), "{name} missing: {text}");
    }
}

#[test]
fn save_then_show_the_saved_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("saved.toml");
    let path_text = path.to_str().unwrap();
    let shown = stdout_of(&["--preset", "hybrid-laptop", "--emulate", "6=0.25", "--save", path_text]);
    assert!(shown.contains("saved to"), "{shown}");
    let reloaded = stdout_of(&["--machine", path_text]);
    // The same tree apart from the source line.
    let tree = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| !l.contains("source:") && !l.starts_with("saved to"))
            .map(String::from)
            .collect()
    };
    assert_eq!(tree(&reloaded), tree(&shown));
    assert!(reloaded.contains(&format!("source: file:{path_text}")), "{reloaded}");
}

#[test]
fn a_copied_sysfs_tree_can_be_shown() {
    let dir = tempfile::tempdir().unwrap();
    let cpu_dir = dir.path().join("devices/system/cpu");
    std::fs::create_dir_all(&cpu_dir).unwrap();
    std::fs::write(cpu_dir.join("online"), "0-1\n").unwrap();
    for cpu in 0..2 {
        let topology = cpu_dir.join(format!("cpu{cpu}/topology"));
        std::fs::create_dir_all(&topology).unwrap();
        std::fs::write(topology.join("physical_package_id"), "0\n").unwrap();
        std::fs::write(topology.join("core_id"), "0\n").unwrap();
        std::fs::write(topology.join("thread_siblings_list"), "0-1\n").unwrap();
    }
    let text = stdout_of(&["--sysfs", dir.path().to_str().unwrap()]);
    assert!(text.contains("2 CPUs, 1 core, 1 package"), "{text}");
    assert!(text.contains("all online CPUs (no procfs given)"), "{text}");
    assert!(text.contains("note: "), "missing cache files are noted: {text}");
}

#[test]
fn bad_input_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.toml");
    std::fs::write(&broken, "name = \"x\"\n[[cores]]\ncount = 2\nspeed = 0\n").unwrap();
    let message = error_of(&["--machine", broken.to_str().unwrap()]);
    assert!(message.contains("broken.toml") && message.contains("speed 0"), "{message}");

    let unknown_key = dir.path().join("typo.toml");
    std::fs::write(&unknown_key, "[[cores]]\ncount = 2\nthreds = 2\n").unwrap();
    let message = error_of(&["--machine", unknown_key.to_str().unwrap()]);
    assert!(message.contains("typo.toml") && message.contains("unknown field `threds`"), "{message}");

    let message = error_of(&["--machine", dir.path().join("absent.toml").to_str().unwrap()]);
    assert!(message.contains("absent.toml"), "{message}");

    let message = error_of(&["--preset", "cray-1"]);
    assert!(message.contains("unknown preset \"cray-1\"") && message.contains("switch-cs"), "{message}");

    let message = error_of(&["--preset", "switch-cc", "--emulate", "5=0.5"]);
    assert!(message.contains("--emulate") && message.contains("cpu5 does not exist"), "{message}");

    let message = error_of(&["--preset", "switch-cc", "--emulate", "1=2"]);
    assert!(message.contains("outside (0, 1]"), "{message}");

    let message = error_of(&["--sysfs", dir.path().to_str().unwrap()]);
    assert!(message.contains("no CPUs found"), "{message}");

    assert!(!message.contains("panicked"));
}
