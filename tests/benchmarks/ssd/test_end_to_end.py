"""Runs the SSD presets through the runner and checks their MLPerf logs with the official rules."""

import os

import pytest
from mlperf_logging.mllog import constants as C

from benchmarks.ssd import config
from benchmarks.ssd.benchmark import SSDBenchmark
from mlperf_tf import runner
from tests import e2e


def test_smoke_run_logs_pass_the_official_checker_quality_aside(tmp_path):
    bench = SSDBenchmark(config.smoke())
    result = runner.run(
        bench,
        runner.RunConfig(model_dir=str(tmp_path), distribution="one_device", steps_per_loop=10),
    )
    assert result.status == C.ABORTED  # random images: the budget ends first
    assert [epoch for epoch, _ in result.evals] == [5, 10]
    assert all(0.0 <= value < 1.0 for _, value in result.evals)
    lines = e2e.log_records(result.mlperf_log)
    values = {line["key"]: line["value"] for line in lines}
    assert values[C.SUBMISSION_BENCHMARK] == "ssd"
    assert values[C.MODEL_BN_SPAN] == 4
    assert values[C.MAX_SAMPLES] == 1
    assert values[C.OPT_LR_DECAY_BOUNDARY_EPOCHS] == [40, 50]
    assert values[C.TRAIN_SAMPLES] == 8 and values[C.EVAL_SAMPLES] == 6
    e2e.assert_passes_quality_aside(result.mlperf_log, ("0.7.0", "1.0.0"), "closed_ssd.yaml")


@pytest.mark.slow
def test_mini_preset_reaches_its_target_and_passes_the_official_checker(tmp_path):
    """The acceptance run: `mlperf-tf run --benchmark=ssd --preset=mini` (minutes)."""
    log, minutes = e2e.run_mini("ssd", tmp_path)
    stops = [line for line in e2e.log_records(log) if line["key"] == C.RUN_STOP]
    assert stops[0]["metadata"][C.STATUS] == C.SUCCESS
    accuracies = [line["value"] for line in e2e.log_records(log) if line["key"] == C.EVAL_ACCURACY]
    assert accuracies[-1] >= 0.23
    e2e.assert_official_pass(log, ("0.7.0", "1.0.0"))
    assert minutes < 15, f"mini took {minutes:.1f} min (machine load: {os.getloadavg()})"
