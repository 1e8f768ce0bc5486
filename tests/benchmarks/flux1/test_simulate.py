"""flux1 at scale (`mlperf-tf simulate --benchmark=flux1`, issue 42 item 4): the B200 fraction of
peak for flux1 is calibrated on one published MLPerf 5.1 result (University of Florida, 16 GPUs),
and every other published B200 flux1 result of 5.1 is a test of the prediction (RCP epochs: the
simulator as a user runs it). The v6.0 GB300 results are tests of their own, with the other
benchmarks' (tests/mlperf_tf/simulate/test_todays_systems.py)."""

from mlperf_tf.simulate import systems, validate

TEST_TOLERANCE = 0.20  # each test point: |predicted / published - 1| (RCP epochs)
MEDIAN_TOLERANCE = 0.10  # their median
LOGGED_TOLERANCE = 0.05  # each test point with its runs' logged epochs (the step model alone)


def _flux_rows():
    points = [
        p
        for p in validate.load_points()["points"]
        if p["benchmark"] == "flux1" and p["source"] == "v5.1"
    ]
    loaded = {name: systems.load(name) for name in {p["system"] for p in points}}
    return points, validate.rows(points, loaded)


def test_calibrates_on_at_most_two_results_of_one_submitter():
    points, _ = _flux_rows()
    calibrating = [p for p in points if p["role"].startswith("calibrate")]
    assert 1 <= len(calibrating) <= 2
    assert len({p["path"].split("/")[0] for p in calibrating}) == 1
    assert all(p["source"] == "v5.1" for p in points)


def test_published_b200_results_are_predicted_within_tolerance():
    _, rows = _flux_rows()
    tests = [r for r in rows if r["role"] == "test"]
    assert len(tests) >= 6 and len({r["path"].split("/")[0] for r in tests}) >= 3
    errors = sorted(abs(r["error_rcp"]) for r in tests)
    assert errors[-1] < TEST_TOLERANCE, [(r["id"], r["error_rcp"]) for r in tests]
    assert errors[len(errors) // 2] < MEDIAN_TOLERANCE
    assert max(abs(r["error_logged"]) for r in tests) < LOGGED_TOLERANCE
