"""Runs the BERT presets through the runner and checks their MLPerf logs with the official rules."""

import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest
from mlperf_logging.mllog import constants as C

from benchmarks.bert import config as bc
from benchmarks.bert.benchmark import MAX_PREDICTIONS_PER_SEQ, OPT_EPSILON, BertBenchmark
from compliance import checker
from mlperf_tf import runner

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _log_lines(path):
    with open(path) as f:
        return [json.loads(line.split(":::MLLOG", 1)[1]) for line in f if ":::MLLOG" in line]


def _assert_passes_quality_aside(log):
    for ruleset in ("0.7.0", "1.0.0"):
        report = checker.check_log(log, ruleset=ruleset, quality="skip")
        assert report.passed, (ruleset, [str(f) for f in report.errors])
        assert any("closed_bert.yaml" in f for f in report.rule_files)
        assert not report.official_crashed
        failures = [m for m in report.official_messages if "ERROR" in m or "TRACEBACK" in m]
        assert all("eval_accuracy" in m or "FAILED" in m for m in failures), failures


def test_smoke_run_logs_pass_the_official_checker_quality_aside(tmp_path):
    bench = BertBenchmark(bc.smoke())
    result = runner.run(
        bench,
        runner.RunConfig(model_dir=str(tmp_path), distribution="one_device", steps_per_loop=8),
    )
    assert result.status == C.ABORTED  # random data: the budget ends first
    # epoch_num counts samples: evals every 3 steps of 8 sequences.
    assert [epoch for epoch, _ in result.evals] == [24, 48]
    lines = _log_lines(result.mlperf_log)
    values = {line["key"]: line["value"] for line in lines}
    assert values[C.SUBMISSION_BENCHMARK] == "bert"
    assert values[C.OPT_NAME] == "lamb"
    assert values[OPT_EPSILON] == 1e-6
    assert values[C.START_WARMUP_STEP] == 0 and values[C.NUM_WARMUP_STEPS] == 2
    assert values[C.OPT_LR_TRAINING_STEPS] == 6
    assert values[C.MAX_SEQUENCE_LENGTH] == 32 and values[MAX_PREDICTIONS_PER_SEQ] == 5
    assert values[C.TRAIN_SAMPLES] == 48 and values[C.EVAL_SAMPLES] == 16
    blocks = [
        {k: line["metadata"][k] for k in (C.FIRST_EPOCH_NUM, C.EPOCH_COUNT)}
        for line in lines
        if line["key"] == C.BLOCK_START
    ]
    assert blocks == [
        {C.FIRST_EPOCH_NUM: 0, C.EPOCH_COUNT: 24},
        {C.FIRST_EPOCH_NUM: 24, C.EPOCH_COUNT: 24},
    ]
    _assert_passes_quality_aside(result.mlperf_log)


def test_gradient_accumulation_run(tmp_path):
    """Two micro batches of 4 per step: the runner accumulates; the log says so."""
    config = dataclasses.replace(bc.smoke(), gradient_accumulation_steps=2, train_examples=16)
    result = runner.run(
        BertBenchmark(config),
        runner.RunConfig(model_dir=str(tmp_path), distribution="one_device", xla=True),
    )
    values = {line["key"]: line["value"] for line in _log_lines(result.mlperf_log)}
    assert values[C.GRADIENT_ACCUMULATION_STEPS] == 2
    assert result.steps == 2


@pytest.mark.slow
def test_mini_preset_passes_the_official_checker(tmp_path):
    """The acceptance run: `mlperf-tf run --benchmark=bert --preset=mini` (minutes)."""
    env = dict(os.environ, MLPERF_TF_DATA=str(tmp_path / "data"), PYTHONPATH=REPO)
    model_dir = tmp_path / "run"
    begin = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "mlperf_tf.cli", "run", "--benchmark=bert", "--preset=mini",
         f"--model_dir={model_dir}"],
        check=True, env=env, cwd=REPO, timeout=3600,
    )  # fmt: skip
    minutes = (time.monotonic() - begin) / 60
    log = str(model_dir / "mlperf_log.txt")
    accuracies = [line["value"] for line in _log_lines(log) if line["key"] == C.EVAL_ACCURACY]
    assert accuracies and accuracies[-1] >= bc.mini().quality_target
    _assert_passes_quality_aside(log)
    print(f"bert mini: {minutes:.1f} min, masked-LM accuracy {accuracies}")
