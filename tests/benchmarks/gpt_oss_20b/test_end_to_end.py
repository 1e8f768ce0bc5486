"""gpt_oss_20b end to end: a smoke run judged by the official checker of 6.0.0 and 6.1.0 (only
the scaled sequence length and, unreached, the target), a gradient-accumulation run, bad input
at the command line, and the mini acceptance run (slow)."""

import dataclasses

import pytest
from mlperf_logging.mllog import constants as C

from benchmarks.gpt_oss_20b import config as config_lib
from benchmarks.gpt_oss_20b.benchmark import GptOssBenchmark
from compliance import checker
from mlperf_tf import cli, runner
from tests import e2e


@pytest.fixture(scope="module")
def smoke_log(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("gptoss_smoke")
    config = dataclasses.replace(config_lib.smoke(), gradient_accumulation_steps=2)
    result = runner.run(
        GptOssBenchmark(config),
        runner.RunConfig(model_dir=str(model_dir), distribution="one_device", ruleset="6.1.0"),
    )
    return result


@pytest.mark.parametrize("ruleset", ["6.0.0", "6.1.0"])
def test_smoke_log_fails_only_the_scaled_sequence_and_the_target(smoke_log, ruleset):
    report = checker.check_log(smoke_log.mlperf_log, ruleset=ruleset, quality="skip")
    assert report.passed, report.format_text()
    checks = sorted(f.check for f in report.warnings if f.source == "official")
    assert checks == ["scaled", "target"], report.format_text()


def test_smoke_run_logs_accumulation_samples_count_and_disclosure(smoke_log):
    records = e2e.log_records(smoke_log.mlperf_log)
    values = {r["key"]: r["value"] for r in records}
    assert values[C.GRADIENT_ACCUMULATION_STEPS] == 2 and values["expert_parallelism"] == 1
    assert values["submission_benchmark"] == "gpt_oss_20b"
    evals = [r for r in records if r["key"] == C.EVAL_ACCURACY]
    assert evals and all("samples_count" in r["metadata"] for r in evals)
    assert smoke_log.steps == 6


def test_bad_input_at_the_command_line_is_one_error_line(tmp_path, capsys):
    code = cli.main([
        "run", "--benchmark=gpt_oss_20b", "--preset=smoke", f"--model_dir={tmp_path}",
        "--config.model.moe.top_k=9",
    ])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error:") and "top_k" in err[-1], err


@pytest.mark.slow
def test_mini_preset_reaches_the_real_target_and_the_checker_names_only_the_sequence(tmp_path):
    """The acceptance run: `mlperf-tf run --benchmark=gpt_oss_20b --preset=mini` (minutes)."""
    log, minutes = e2e.run_mini("gpt_oss_20b", tmp_path)
    records = e2e.log_records(log)
    values = [r["value"] for r in records if r["key"] == C.EVAL_ACCURACY]
    assert values[-1] <= 3.34, values
    for ruleset in ("6.0.0", "6.1.0"):
        report = checker.check_log(log, ruleset=ruleset, quality="skip")
        assert report.passed, report.format_text()
        checks = sorted(f.check for f in report.warnings if f.source == "official")
        assert checks == ["scaled"], checks
    print(f"gpt_oss_20b mini: {minutes:.1f} min, log perplexity {values}")
