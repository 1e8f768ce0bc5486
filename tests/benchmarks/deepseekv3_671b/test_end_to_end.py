"""deepseekv3_671b end to end: bad input at the command line, and the mini acceptance run (slow):
the base trained and exported untimed, imported through the shared importer, continued to the
target, its log judged by the official checkers of 6.0.0 and 6.1.0."""

import math

import pytest
from mlperf_logging.mllog import constants as C

from benchmarks.deepseekv3_671b import config as config_lib
from compliance import checker
from mlperf_tf import cli
from tests import e2e


@pytest.mark.parametrize(
    "flag, setting",
    [
        ("--config.model.moe.topk_groups=5", "topk_groups"),
        ("--config.model.moe.top_k=9", "top_k"),
    ],
)
def test_bad_input_at_the_command_line_is_one_error_line(tmp_path, capsys, flag, setting):
    code = cli.main(
        ["run", "--benchmark=deepseekv3_671b", "--preset=smoke", f"--model_dir={tmp_path}", flag]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error:") and setting in err[-1], err


@pytest.mark.slow
def test_mini_continues_from_its_base_to_the_target(tmp_path):
    """The acceptance run: `mlperf-tf run --benchmark=deepseekv3_671b --preset=mini` (its first
    run trains the base, before run_start) at the rules' LR and eval cadence. The official
    checkers of 6.0.0 and 6.1.0 fail nothing but the scaled `max_sequence_length` and
    `global_batch_size` (and the rules' 3.6, when the mini's declared target is above it)."""
    log, minutes, values = e2e.run_mini_to_success("deepseekv3_671b", tmp_path)
    target = config_lib.MINI_TARGET_LOG_PERPLEXITY
    assert values[-1] <= target, values
    records = e2e.log_records(log)
    first = next(r for r in records if r["key"] == C.EVAL_ACCURACY)
    batch = config_lib.MINI_BATCH
    assert first["metadata"]["samples_count"] == batch * math.floor(42 + 24576 / batch)
    for ruleset in ("6.0.0", "6.1.0"):
        report = checker.check_log(log, ruleset=ruleset, quality="skip")
        assert report.passed, report.format_text()
        official = [f for f in report.errors + report.warnings if f.source == "official"]
        scaled = sorted(f.message.split()[0] for f in official if f.check == "scaled")
        assert scaled == [C.GLOBAL_BATCH_SIZE, C.MAX_SEQUENCE_LENGTH], report.format_text()
        others = [f for f in official if f.check != "scaled"]
        if target > config_lib.TARGET_LOG_PERPLEXITY:  # the rules' 3.6 is not the mini's
            others = [f for f in others if f.check != "target"]
        assert not others, report.format_text()
    print(f"deepseekv3_671b mini: {minutes:.1f} min, log perplexity {values}")
