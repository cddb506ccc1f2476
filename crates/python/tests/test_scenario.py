"""Scenarios from files, text and dicts; runs; listings; errors that name the key."""

import pickle

import pytest

import corehop

SWITCH = {
    "seed": 3,
    "machine": {"preset": "switch-cs"},
    "workload": {"kind": "switch", "mechanism": "spin", "iterations": 50},
}


def test_a_dict_runs_like_the_same_toml(scenarios):
    from_dict = corehop.run(SWITCH)
    text = 'seed = 3\n[machine]\npreset = "switch-cs"\n[workload]\nkind = "switch"\nmechanism = "spin"\niterations = 50\n'
    assert corehop.Scenario.from_toml(text).run() == from_dict
    assert (from_dict["ops"], from_dict["hops"], from_dict["seed"]) == (50, 100, 3)
    assert from_dict["model"]["metrics"][0]["name"] == "ns per call"
    assert [c["cpu"] for c in from_dict["cpus"]] == [0, 1]


def test_file_values_and_the_cli_json_agree(scenarios, cli):
    import json
    import subprocess

    micro = corehop.load(scenarios / "switch-micro.toml", {"workload.iterations": 40})
    values = {"machine.preset": "switch-ss", "workload.mechanism": "wakeup"}
    ours = corehop.run(micro, values)
    out = subprocess.run(
        [cli, "sim", str(scenarios / "switch-micro.toml"), "--json", "--set", "workload.iterations=40"]
        + [f"--set={k}={v}" for k, v in values.items()],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    (run,) = json.loads(out)["runs"]
    assert run["report"] == ours


def test_values_are_set_without_changing_the_original(scenarios):
    base = corehop.load(scenarios / "switch-micro.toml")
    pinned = base.with_values({"workload.iterations": 7, "machine.preset": "switch-cc"})
    assert base.to_dict()["workload"].get("iterations") != 7
    assert pinned.to_dict()["workload"]["iterations"] == 7
    # A swept key given one value is pinned: the sweep has one value left.
    assert dict(pinned.sweeps())["machine.preset"] == ["switch-cc"]
    with pytest.raises(corehop.ScenarioError, match=r"sweeps machine.preset, workload.mechanism \(6 points\)"):
        pinned.run()
    assert pinned.run({"workload.mechanism": "none"})["ops"] == 7


def test_models_presets_and_preset_data():
    kinds = [k for k, _ in corehop.models()]
    assert {"switch", "offload", "objects", "smt", "pipeline"} <= set(kinds)
    names = dict(corehop.presets())
    assert "o2-16core" in names and names["o2-16core"]
    machine = corehop.preset("switch-cs-quarter")
    assert machine["name"] == "switch-cs-quarter"
    assert len(machine["cpus"]) == 2
    assert sorted(c["speed"] for c in machine["cpus"])[0] < 1.0
    costs = corehop.cost_model("switch-cs")
    assert costs["mem_latency_ns"] > 0 and "hop" in costs
    with pytest.raises(corehop.ScenarioError, match="cray-1") as e:
        corehop.preset("cray-1")
    assert e.value.key == "machine.preset"


@pytest.mark.parametrize(
    "values, key, problem",
    [
        ({"workload.iteratons": 5}, "workload.iteratons", "unknown key"),
        ({"workload.iterations": "many"}, "workload.iterations", "invalid type"),
        ({"workload.iterations": -5}, "workload.iterations", "negative"),
        ({"machine.preset": "cray-1"}, "machine.preset", "unknown preset"),
        ({"costs.mem_latncy_ns": 3}, "costs.mem_latncy_ns", "unknown key"),
        ({"workload.app_cpus": [9]}, "workload.app_cpus[0]", "out of range"),
        ({"workload.iterations": {1, 2}}, "workload.iterations", "cannot be a scenario value"),
        ({"workload.calls": [{"name": None}]}, "workload.calls[0].name", "nonetype"),
    ],
)
def test_bad_input_raises_naming_the_key(values, key, problem):
    with pytest.raises(corehop.ScenarioError) as e:
        corehop.run(SWITCH, values)
    assert isinstance(e.value, ValueError)
    assert e.value.key == key
    assert problem in str(e.value).lower() or problem in e.value.problem.lower()
    assert str(e.value).startswith(f"<dict>: {key}: ")


def test_files_that_cannot_be_read_or_parsed(tmp_path):
    with pytest.raises(corehop.ScenarioError, match="cannot read the file"):
        corehop.load(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("seed = 1\n[machine\n")
    with pytest.raises(corehop.ScenarioError) as e:
        corehop.load(bad)
    assert e.value.key == "line 2"
    with pytest.raises(TypeError):
        corehop.load(42)


def test_scenarios_pickle_with_their_values(scenarios):
    s = corehop.load(scenarios / "offload-threshold.toml", {"workload.iterations": 200})
    back = pickle.loads(pickle.dumps(s))
    assert back.file == s.file and back.to_dict() == s.to_dict()
    values = {"workload.latency_cycles": 100, "workload.threshold_cycles": 1000}
    assert back.run(values) == s.run(values)


def test_numpy_values_are_accepted():
    np = pytest.importorskip("numpy")
    report = corehop.run(SWITCH, {"workload.iterations": np.int64(20), "costs.mem_latency_ns": np.float64(30.0)})
    assert report["ops"] == 20


def test_integers_too_large_for_toml_are_refused():
    with pytest.raises(corehop.ScenarioError, match="does not fit a 64-bit integer") as e:
        corehop.run(SWITCH, {"workload.iterations": 2**70})
    assert e.value.key == "workload.iterations"
