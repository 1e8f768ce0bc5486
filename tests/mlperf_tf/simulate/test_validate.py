"""Tests of the published-points check: the committed constants are the calibration's."""

import json
import os

import pytest

from mlperf_tf.simulate import systems, validate


def test_published_points_cover_seeds_and_several_scales():
    points = validate.load_points()["points"]
    assert len(points) >= 12
    sources = {p["source"].split(" ")[0] for p in points}
    assert {"ying2018", "jia2018", "v0.6", "v0.7"} <= sources
    chips = {p["chips"] for p in points if p["system"] == "tpu-v3" and p["benchmark"] == "resnet50"}
    assert len(chips) >= 5 and max(chips) == 4096


def test_calibration_reproduces_the_constants_in_the_system_files():
    points = validate.load_points()["points"]
    loaded = {name: systems.load(name) for name in {p["system"] for p in points}}
    committed = dict(loaded)
    for _, name, field, key, value in validate.calibrate(points, loaded):
        # Efficiencies are the benchmarks' declarations (SimulatorShape.calibration) for the
        # system's family; other constants the system file's.
        current = validate.committed_constant(committed[name], field, key)
        assert current == pytest.approx(value, abs=2e-4), (name, field, key)


def test_committed_validation_table_is_up_to_date():
    points = validate.load_points()["points"]
    loaded = {name: systems.load(name) for name in {p["system"] for p in points}}
    table = validate.rows(points, loaded)
    stats = validate.summary(table)
    with open(os.path.join(validate.DOCS_DIR, "validation.md"), encoding="utf-8") as f:
        assert f.read() == validate.markdown(table, stats)
    with open(os.path.join(validate.DOCS_DIR, "validation.json"), encoding="utf-8") as f:
        assert json.load(f)["summary"] == pytest.approx(stats)
    # Calibration points fit exactly (with their logged epochs where they have them).
    for row in table:
        if row["role"].startswith("calibrate:"):
            assert abs(row.get("error_logged", row["error_rcp"])) < 0.01, row["id"]


def test_committed_studies_are_up_to_date():
    from mlperf_tf.simulate import report

    with open(os.path.join(validate.DOCS_DIR, "studies.md"), encoding="utf-8") as f:
        assert f.read() == report.studies_text()
