"""Tests of the shared MLPerf rule formulas, and that the checker uses the same ones."""

import pytest

from compliance import suite_checks
from mlperf_tf import rules


@pytest.mark.parametrize(
    "batch,samples",
    # The MLCommons reference README's table (its 8192 row says 175,000, which the formula
    # above it does not give: 0.05 * (230.23 * 8192 + 3e6) = 244,302 -> 225,000).
    [(256, 150_000), (1024, 150_000), (1536, 150_000), (2048, 150_000), (3072, 175_000)]
    + [(4096, 175_000), (6912, 225_000), (8192, 225_000)],
)
def test_bert_eval_interval_v1_formula_rounds_down(batch, samples):
    assert rules.bert_eval_interval_samples("v1.0", batch) == samples


def test_bert_eval_interval_v07_and_errors():
    assert rules.bert_eval_interval_samples("v0.7", 8192) == 500_000
    with pytest.raises(ValueError, match="eval_rule"):
        rules.bert_eval_interval_samples("v2.0", 8192)
    with pytest.raises(ValueError, match="global_batch_size"):
        rules.bert_eval_interval_samples("v1.0", 0)


@pytest.mark.parametrize("batch", [8, 256, 3072, 6912, 8192, 65536])
def test_the_checker_expects_the_interval_the_benchmark_schedules(batch):
    # One rounding rule on both sides: the checker's cadence is the benchmark's interval.
    assert suite_checks._bert_eval_interval_samples("1.0.0", float(batch)) == (
        rules.bert_eval_interval_samples("v1.0", batch)
    )
    assert suite_checks._bert_eval_interval_samples("0.7.0", float(batch)) == (
        rules.bert_eval_interval_samples("v0.7", batch)
    )
