"""Runs the ResNet-50 presets through the runner and checks their MLPerf logs with the official rules."""

import os

import pytest
from mlperf_logging.mllog import constants as C

from benchmarks.resnet50 import config as rc
from benchmarks.resnet50.benchmark import ResNet50Benchmark
from mlperf_tf import runner
from tests import e2e


def test_smoke_run_logs_pass_the_official_checker_quality_aside(tmp_path):
    bench = ResNet50Benchmark(rc.smoke())
    result = runner.run(
        bench,
        runner.RunConfig(model_dir=str(tmp_path), distribution="one_device", steps_per_loop=8),
    )
    assert result.status == C.ABORTED  # random data: the budget ends first
    assert [epoch for epoch, _ in result.evals] == [4, 8]
    lines = e2e.log_records(result.mlperf_log)
    values = {line["key"]: line["value"] for line in lines}
    assert values[C.SUBMISSION_BENCHMARK] == "resnet"
    assert values[C.OPT_NAME] == "lars"
    assert values[C.MODEL_BN_SPAN] == 16
    assert values[C.GRADIENT_ACCUMULATION_STEPS] == 1
    assert values[C.TRAIN_SAMPLES] == 64 and values[C.EVAL_SAMPLES] == 40
    blocks = [
        {k: line["metadata"][k] for k in (C.FIRST_EPOCH_NUM, C.EPOCH_COUNT)}
        for line in lines
        if line["key"] == C.BLOCK_START
    ]
    assert blocks == [
        {C.FIRST_EPOCH_NUM: 1, C.EPOCH_COUNT: 4},
        {C.FIRST_EPOCH_NUM: 5, C.EPOCH_COUNT: 4},
    ]
    e2e.assert_passes_quality_aside(
        result.mlperf_log, ("0.7.0", "1.0.0"), "closed_resnet_lars.yaml"
    )


@pytest.mark.slow
def test_mini_preset_reaches_its_target_and_passes_the_official_checker(tmp_path):
    """The acceptance run: `mlperf-tf run --benchmark=resnet50 --preset=mini` (minutes)."""
    log, minutes = e2e.run_mini("resnet50", tmp_path)
    stops = [line for line in e2e.log_records(log) if line["key"] == C.RUN_STOP]
    assert stops[0]["metadata"][C.STATUS] == C.SUCCESS
    accuracies = [line["value"] for line in e2e.log_records(log) if line["key"] == C.EVAL_ACCURACY]
    assert accuracies[-1] >= 0.90
    e2e.assert_official_pass(log, ("0.7.0", "1.0.0"))
    print(f"mini: {minutes:.1f} min, accuracies {accuracies}, load {os.getloadavg()}")
