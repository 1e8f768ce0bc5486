"""Tests of systems as data: the built-in files, layouts, and the one-line errors."""

import json

import pytest

from mlperf_tf.errors import UserError
from mlperf_tf.simulate import systems


def test_every_built_in_system_loads_and_cites_its_sources():
    names = systems.available()
    assert {"tpu-v3", "tpu-v4", "v100-dgx", "a100-dgx", "cpu-local"} <= set(names)
    for name in names:
        system = systems.load(name)
        assert system.name == name
        assert system.peak_flops > 0 and system.sources, name


def test_tpu_v3_slices_pod_and_multipod():
    v3 = systems.load("tpu-v3")
    pod = v3.layout(1024)
    assert pod.shape == (32, 32) and pod.wraps == (True, True)
    half = v3.layout(512)
    assert sorted(half.shape) == [16, 32] and sum(half.wraps) == 1  # only the 32 dim wraps
    multipod = v3.layout(4096)
    assert multipod.shape == (128, 32) and multipod.wraps == (False, True)
    assert v3.layout(16).wraps == (False, False)  # a small slice is a mesh
    assert v3.layout(1024, wraparound="off").wraps == (False, False)
    assert v3.layout(16, wraparound="on").wraps == (True, True)


def test_tpu_v4_is_3d_with_wraparound_from_whole_cubes():
    v4 = systems.load("tpu-v4")
    assert v4.layout(64).shape == (4, 4, 4) and all(v4.layout(64).wraps)
    assert not any(v4.layout(32).wraps)
    assert v4.layout(4096).shape == (16, 16, 16)


def test_impossible_meshes_and_unknown_systems_are_one_line_errors():
    v3 = systems.load("tpu-v3")
    for chips in (1000, 8192, 2, 0):
        with pytest.raises(UserError) as e:
            v3.layout(chips)
        assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="multiple of 8"):
        systems.load("a100-dgx").layout(12)
    with pytest.raises(UserError, match=r"unknown system 'tpu-v9' \(systems: .*tpu-v3"):
        systems.load("tpu-v9")


def test_switched_layout_nodes():
    a100 = systems.load("a100-dgx")
    assert (a100.layout(64).nodes, a100.layout(64).chips_per_node) == (8, 8)
    assert (a100.layout(4).nodes, a100.layout(4).chips_per_node) == (1, 4)


def test_system_file_json_and_yaml(tmp_path):
    data = json.loads(open(systems.os.path.join(systems.SYSTEMS_DIR, "tpu-v3.json")).read())
    data["name"] = "my-pod"
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data))
    assert systems.load_file(str(path)).name == "my-pod"
    yaml_path = tmp_path / "mine.yaml"
    yaml_path.write_text(
        "name: tiny\npeak_flops: 1.0e12\nmemory_bandwidth: 1.0e11\n"
        "compute_efficiency: {default: 0.5}\ntopology: {kind: local, max_chips: 8}\n"
        "link: {bandwidth: 1.0e9, alpha: 1.0e-5}\n"
    )
    tiny = systems.load_file(str(yaml_path))
    assert tiny.kind == "local" and tiny.link.bandwidth == 1e9


def test_bad_system_files_are_one_line_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UserError, match="is not valid"):
        systems.load_file(str(bad))
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"name": "x", "peak_flops": 1}))
    with pytest.raises(UserError, match="lacks memory_bandwidth"):
        systems.load_file(str(partial))
    with pytest.raises(UserError, match="missing.json' does not exist"):
        systems.load_file(str(tmp_path / "missing.json"))
