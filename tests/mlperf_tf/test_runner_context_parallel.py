"""`--context_parallel` through the runner (`runner.run`, what `mlperf-tf run` calls): the smoke
Llama at C = 2 on 4 logical CPUs (data = 2) logs the evals, `samples_count` and epochs of C = 1
on 2 (data = 2), its eval log perplexities and whole weights at the unsplit run's, and
`context_parallelism` 2 among the disclosure keys (slow: two runs, ~1 min each idle)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf import registry, runner
from tests.numerics import assert_close

pytestmark = [pytest.mark.slow, pytest.mark.numerics]


def _run(model_dir, *, devices: int, context_parallel: int):
    """The run's weights by variable path and its MLPerf log events (key, value, metadata)."""
    assert len(tf.config.list_logical_devices("CPU")) >= 4  # the test session's (conftest)
    llama = registry.get("llama31_8b")
    config = runner.RunConfig(
        model_dir=str(model_dir), num_cpu_devices=devices, context_parallel=context_parallel,
        collective_timeout=120,
    )  # fmt: skip
    result = runner.run(llama(llama.preset("smoke")), config)
    weights = {v.path: np.asarray(v) for v in result.model.variables}
    with open(config.mlperf_log_path, encoding="utf-8") as f:
        events = [json.loads(line.split(":::MLLOG", 1)[1]) for line in f if ":::MLLOG" in line]
    return weights, [(e["key"], e["value"], e["metadata"]) for e in events]


def test_context_parallel_2_logs_and_ends_as_context_parallel_1(tmp_path):
    ref_weights, ref_log = _run(tmp_path / "c1", devices=2, context_parallel=1)
    got_weights, got_log = _run(tmp_path / "c2", devices=4, context_parallel=2)

    def evals(log):
        return [(m["epoch_num"], m["samples_count"], v) for k, v, m in log if k == "eval_accuracy"]

    got, ref = evals(got_log), evals(ref_log)
    assert [e[:2] for e in got] == [e[:2] for e in ref] and len(ref) == 2
    assert_close([e[2] for e in got], [e[2] for e in ref], rtol=1e-5, err_msg="eval")
    keys = {k: v for k, v, _ in got_log}
    assert (keys["context_parallelism"], keys["pipeline_parallelism"]) == (2, 1)
    assert {k: v for k, v, _ in ref_log}["context_parallelism"] == 1
    assert keys["micro_batch_size"] == 4  # the 8-sequence batch over 2 data groups
    assert sorted(got_weights) == sorted(ref_weights)
    scale = max(float(np.max(np.abs(w))) for w in ref_weights.values())
    for path, expected in ref_weights.items():
        np.testing.assert_allclose(
            got_weights[path], expected, rtol=1e-5, atol=1e-5 * scale, err_msg=path
        )
