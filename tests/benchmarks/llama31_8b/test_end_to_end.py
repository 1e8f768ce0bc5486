"""The llama31_8b mini acceptance run (slow) and a gradient-accumulation run. The smoke-run checks
every benchmark shares are in tests/benchmarks/test_contract.py."""

import pytest
from mlperf_logging.mllog import constants as C

from benchmarks.llama31_8b import config as lc
from benchmarks.llama31_8b.benchmark import Llama31Benchmark
from compliance import checker
from tests import e2e


def test_gradient_accumulation_run(tmp_path):
    """Two micro batches of 4 per step: the runner accumulates; the log says so."""
    e2e.assert_accumulation_logged(Llama31Benchmark(lc.smoke()), tmp_path)


@pytest.mark.slow
def test_mini_preset_trains_below_the_bigram_baseline_and_the_checker_explains_it(tmp_path):
    """The acceptance run: `mlperf-tf run --benchmark=llama31_8b --preset=mini` (minutes)."""
    log, minutes = e2e.run_mini("llama31_8b", tmp_path)
    records = e2e.log_records(log)
    values = [r["value"] for r in records if r["key"] == C.EVAL_ACCURACY]
    assert all("samples_count" in r["metadata"] for r in records if r["key"] == C.EVAL_ACCURACY)
    assert values[-1] < 4.31  # the bigram model's log perplexity on the same eval windows
    for ruleset in ("5.1.0", "6.0.0"):
        report = checker.check_log(log, ruleset=ruleset, quality="skip")
        assert report.passed, report.format_text()
        checks = sorted(f.check for f in report.warnings if f.source == "official")
        reached = values[-1] <= lc.mini().quality_target
        assert checks == (["scaled"] if reached else ["scaled", "target"]), checks
    print(f"llama31_8b mini: {minutes:.1f} min, log perplexity {values}")
