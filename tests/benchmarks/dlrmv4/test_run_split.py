"""`mlperf-tf run --benchmark=dlrmv4 --preset=smoke --num_cpu_devices=2 --expert_parallel=2`
through `runner.run` (what the CLI calls): the tables split over the mesh's `expert` axis train,
evaluate, checkpoint and log `expert_parallelism` 2, the log passes the 6.1.0 check with only the
declared scaled settings, and every step's loss, each eval and the final weights equal those of
the `--num_cpu_devices=2` data-parallel run (whole tables, the same two data groups).

The test harness's loop (`test_sharded_tables.py`) checks the split's numerics in depth; this
checks the CLI path: the runner's mesh, input routing, gradient summer, eval and checkpoint."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from mlperf_logging.mllog import constants as C

from benchmarks.dlrmv4 import model as model_lib
from benchmarks.dlrmv4.benchmark import DlrmV4Benchmark
from compliance import checker
from mlperf_tf import runner
from mlperf_tf.errors import UserError
from tests import e2e

pytestmark = pytest.mark.numerics

# Losses are ~0.7 and the weights ~0.1-1: the split run sums the same products in another order
# (all-to-alls and a per-replica shard instead of a whole-table gather), so they agree to float32
# rounding of their own scale.
RTOL = 1e-5


class _Losses(runner.Action):
    """Each host loop's loss (one step a loop)."""

    def __init__(self):
        self.losses = []

    def after_loop(self, output):
        self.losses.append(output.loss)


def _benchmark() -> DlrmV4Benchmark:
    """The smoke preset with dropout off (its masks are drawn per replica)."""
    config = DlrmV4Benchmark.preset("smoke")
    model = dataclasses.replace(config.model, input_dropout=0.0, linear_dropout=0.0)
    return DlrmV4Benchmark(dataclasses.replace(config, model=model))


def _run(model_dir, expert: int):
    """(the run's result, its per-step losses, its final weights with the tables whole)."""
    losses = _Losses()
    config = runner.RunConfig(
        model_dir=str(model_dir), num_cpu_devices=2, expert_parallel=expert, steps_per_loop=1,
        collective_timeout=60,
    )  # fmt: skip
    result = runner.run(_benchmark(), config, actions=[losses])
    return result, losses.losses, model_lib.numpy_weights(result.model)


@pytest.mark.slow  # 90-160 s at load 4-7; default covers: test_sharded_tables' split tables
# against whole ones, test_bench at --expert_parallel=2 (the runner's mesh and summer)
def test_the_cli_run_with_tables_split_equals_the_data_parallel_run(tmp_path):
    got, got_losses, got_weights = _run(tmp_path / "e2", expert=2)
    ref, ref_losses, ref_weights = _run(tmp_path / "dp", expert=1)

    # It trained (the whole stream: 128 samples of 16), evaluated on the grid, checkpointed.
    assert got.steps == ref.steps == 8 and len(got_losses) == 8
    assert got_losses[-1] < got_losses[0]
    assert [e for e, _ in got.evals] == [e for e, _ in ref.evals] == [64, 128]
    assert tf.train.latest_checkpoint(str(tmp_path / "e2" / "ckpt")).endswith("-8")
    plan = got.model.tables.plan
    assert plan.shards == 2 and ref.model.tables.plan.shards == 1

    # The log: expert parallelism 2, and the 6.1.0 check finds only the declared scaled settings
    # (and the rules' AUC 0.75, which a smoke run on random data does not reach).
    records = e2e.log_records(got.mlperf_log)
    values = {r["key"]: r["value"] for r in records}
    assert values["expert_parallelism"] == 2 and values[C.GLOBAL_BATCH_SIZE] == 16
    report = checker.check_log(got.mlperf_log, ruleset="6.1.0", quality="skip")
    assert report.passed, report.format_text()
    assert {f.check for f in report.warnings if f.source == "official"} == {"scaled", "target"}

    # Same data groups, same math: losses, evals and weights at float32 rounding of their scale.
    np.testing.assert_allclose(got_losses, ref_losses, rtol=RTOL, atol=RTOL)
    np.testing.assert_allclose([v for _, v in got.evals], [v for _, v in ref.evals], atol=1e-4)
    assert sorted(got_weights) == sorted(ref_weights)
    for path, want in ref_weights.items():
        scale = max(1e-3, float(np.abs(want).max()))
        np.testing.assert_allclose(got_weights[path], want, rtol=0, atol=RTOL * scale, err_msg=path)


@pytest.mark.parametrize(
    ("settings", "flag"),
    [({"model_parallel": 2}, "--model_parallel"), ({"expert_parallel": 2}, "embedding_memory_gb")],
)
def test_a_layout_the_tables_cannot_take_is_one_line(tmp_path, settings, flag):
    """Tensor parallelism (the tables' layer has no `model` split: refused before any set-up),
    and tables whose share of one of E = 2 replicas exceeds `model.embedding_memory_gb` (at
    the model's build, before any step): one line naming the setting."""
    bench = _benchmark()
    model = dataclasses.replace(bench.config.model, embedding_memory_gb=1e-5)
    bench = DlrmV4Benchmark(dataclasses.replace(bench.config, model=model))  # 10 KiB
    config = runner.RunConfig(model_dir=str(tmp_path), num_cpu_devices=2, **settings)
    with pytest.raises(UserError, match=flag) as e:
        runner.run(bench, config)
    assert "\n" not in str(e.value)
