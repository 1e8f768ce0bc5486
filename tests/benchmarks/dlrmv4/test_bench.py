"""`mlperf-tf bench --benchmark=dlrmv4` reports the embedding lookup's share of the training step
(`DlrmV4Benchmark.timed_step_parts`, timed alone after each window: `mlperf_tf.bench`), here
with the tables split over 2 replicas of the `expert` axis, so the all-to-alls are in both."""

from __future__ import annotations

import json

import pytest

from mlperf_tf import cli

FAST = ["--windows=2", "--steps_per_window=2", "--warmup_steps=1", "--peak_seconds=0"]
PART = "embedding lookup"


# Extended (CI runs it after README's default run); the default run covers its case by
# qwen35_397b_grpo/test_bench_shares.py (the bench's accounting of a step's declared parts) and
# mlperf_tf/test_bench.py (bench on smoke runs).
@pytest.mark.extended
def test_bench_reports_the_lookups_share_of_the_step(capsys):
    args = ["bench", "--benchmark=dlrmv4", "--preset=smoke", "--num_cpu_devices=2",
            "--expert_parallel=2", *FAST]  # fmt: skip
    assert cli.main([*args, "--json"]) == 0
    out = capsys.readouterr()
    result = json.loads(out.out)
    assert result["expert_parallel"] == 2 and result["replicas"] == 2
    share, ms = result["part_shares"][PART], result["part_ms"][PART]
    assert 0 < share < 1, result
    # The share is the median of each window's lookup / step time, both a step's ms.
    steps = [1e3 * result["global_batch_size"] / r for r in result["window_samples_per_s"]]
    assert 0 < ms < max(steps)
    assert f"{PART} " in out.err.splitlines()[-1]  # the last window's progress line
