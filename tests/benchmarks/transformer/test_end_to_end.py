"""Runs the Transformer presets through the runner and checks their MLPerf logs with the official rules."""

import pytest
from mlperf_logging.mllog import constants as C

from benchmarks.transformer import config as config_lib
from benchmarks.transformer.benchmark import TransformerBenchmark
from compliance import checker
from mlperf_tf import runner
from tests import e2e


def _assert_passes_quality_aside(log_path):
    report = checker.check_log(log_path, ruleset="0.7.0", quality="skip")
    assert report.passed, [str(f) for f in report.errors]
    assert any("closed_transformer.yaml" in f for f in report.rule_files)
    assert not report.official_crashed
    return report


def test_smoke_run_logs_pass_the_official_checker_quality_aside(tmp_path):
    bench = TransformerBenchmark(config_lib.smoke())
    result = runner.run(
        bench,
        runner.RunConfig(
            model_dir=str(tmp_path), distribution="mirrored", num_cpu_devices=2, steps_per_loop=4
        ),
    )
    assert result.status == C.ABORTED  # random ids: the budget ends before BLEU 0.25
    assert [epoch for epoch, _ in result.evals] == [1, 2]
    assert all(0.0 <= value < 0.25 for _, value in result.evals)
    lines = e2e.log_records(result.mlperf_log)
    values = {line["key"]: line["value"] for line in lines}
    metadata = {line["key"]: line["metadata"] for line in lines}
    assert values[C.SUBMISSION_BENCHMARK] == "transformer"
    assert values[C.OPT_NAME] == "adam"
    assert values[C.OPT_ADAM_EPSILON] == 1e-9
    assert values[C.GLOBAL_BATCH_SIZE] == 64  # tokens
    assert values[C.MAX_SEQUENCE_LENGTH] == 8
    assert metadata[C.MAX_SEQUENCE_LENGTH]["method"] == "discard"
    assert values[C.TRAIN_SAMPLES] == 32 and values[C.EVAL_SAMPLES] == 8
    # 64 tokens over 2 replicas = 4 pairs of 8 per replica, 8 per step: 32 pairs = 4 steps.
    assert result.steps == 8
    _assert_passes_quality_aside(result.mlperf_log)


@pytest.mark.slow
def test_mini_preset_reaches_its_target_and_passes_the_official_checker(tmp_path):
    """The acceptance run: `mlperf-tf run --benchmark=transformer --preset=mini` (minutes)."""
    log, minutes = e2e.run_mini("transformer", tmp_path)
    stops = [line for line in e2e.log_records(log) if line["key"] == C.RUN_STOP]
    assert stops[0]["metadata"][C.STATUS] == C.SUCCESS
    scores = [line["value"] for line in e2e.log_records(log) if line["key"] == C.EVAL_ACCURACY]
    assert scores[-1] >= config_lib.mini().quality_target
    _assert_passes_quality_aside(log)
    print(f"mini: BLEU {scores} in {minutes:.1f} min")
