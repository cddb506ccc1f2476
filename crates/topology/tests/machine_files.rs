//! The example machine files in `machines/` load, and equal their presets where they name one.

use std::path::Path;

use corehop_topology::{presets, Machine};

#[test]
fn every_machine_file_loads_and_matches_its_preset() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../machines");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|ext| ext != "toml") {
            continue;
        }
        let mut machine = Machine::from_toml_file(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(machine.source.starts_with("file:"));
        if let Ok(preset) = presets::by_name(&machine.name) {
            machine.source = preset.source.clone();
            assert_eq!(machine, preset, "{} differs from its preset", path.display());
        }
        checked += 1;
    }
    assert!(checked >= 2, "expected the example files in {}", dir.display());
}

#[test]
fn presets_survive_a_save_and_load() {
    for name in presets::names() {
        let preset = presets::by_name(name).unwrap();
        let mut loaded = Machine::from_toml_str(&preset.to_toml_string()).unwrap();
        loaded.source = preset.source.clone();
        assert_eq!(loaded, preset, "{name}");
    }
}
