"""Samples, epochs and `samples_count` do not depend on the layout: a step reads one batch per
batch shard (data x expert), whatever the model and spatial axes add.

The Transformer counted a step's pairs per replica, so under `--model_parallel=M` its epochs ran
M times fast (smoke, 4 steps: `epoch_num` 2.0 at M = 2 where M = 1 logged 1.0; M = 4 stopped at
step 2 on its epoch budget). Here each benchmark's smoke preset is bound to every layout it
supports, at the same batch shards, and what the runner counts with (steps per epoch, step
budget, per-replica batch times batch shards, the eval schedule with its epoch numbers and sample
counts, MLPerf's train and eval samples) must be that of data parallelism alone. The logged
`epoch_num` of the Transformer at M = 2 is checked through the runner by
tests/mlperf_tf/test_runner.py (test_a_model_parallel_transformer_run_trains_evaluates_and_logs).
"""

from __future__ import annotations

import dataclasses

import pytest

from mlperf_tf import config as config_lib
from mlperf_tf import registry
from mlperf_tf.benchmark import RunContext
from mlperf_tf.parallel.mesh import build_mesh, check_supported

MOE = {"model.moe.num_experts": "4", "model.moe.every": "2"}
# (benchmark, config overrides, layouts as `build_mesh` flags); each layout at 1 and 2 batch shards.
CASES = [
    ("transformer", {}, [{"model_parallel": 2}, {"model_parallel": 4}]),
    (
        "transformer",
        MOE,
        [
            {"expert_parallel": 2},
            {"expert_parallel": 4},
            {"expert_parallel": 2, "model_parallel": 2},
        ],
    ),
    ("bert", {}, [{"model_parallel": 2}, {"model_parallel": 4}]),
    ("llama31_8b", {}, [{"model_parallel": 2}, {"model_parallel": 4}]),
    ("llama31_8b", MOE, [{"expert_parallel": 2}, {"expert_parallel": 2, "model_parallel": 2}]),
    (
        "resnet50",
        {},
        [{"spatial_partition": "2"}, {"spatial_partition": "4"}, {"spatial_partition": "2x2"}],
    ),
    ("ssd", {}, [{"spatial_partition": "2"}, {"spatial_partition": "2x2"}]),
    (
        "gpt_oss_20b",
        {},
        [
            {"model_parallel": 2},
            {"expert_parallel": 2},
            {"expert_parallel": 2, "model_parallel": 2},
        ],
    ),
    ("llama2_70b_lora", {}, [{"model_parallel": 2}]),
    ("flux1", {}, [{"model_parallel": 2}]),
]


def _counts(benchmark) -> dict:
    """What the runner counts samples and epochs with."""
    return {
        "steps_per_epoch": benchmark.steps_per_epoch,
        "train_steps": benchmark.train_steps,
        "samples_per_step": benchmark.per_replica_batch_size * benchmark.mesh.batch_shards,
        "train_samples": benchmark.train_samples(),
        "eval_samples": benchmark.eval_samples(),
        "schedule": [dataclasses.astuple(p) for p in benchmark.eval_schedule()],
    }


def _bind(benchmark, batch_shards: int, **flags):
    split = 1
    for flag in ("model_parallel", "expert_parallel"):
        split *= flags.get(flag, 1)
    rows, _, cols = flags.get("spatial_partition", "1").partition("x")
    split *= int(rows) * int(cols or 1)
    # The expert axis reads different batches: it is part of the batch shards.
    replicas = batch_shards * split // flags.get("expert_parallel", 1)
    mesh = build_mesh(replicas, **flags)
    assert mesh.batch_shards == batch_shards
    check_supported(mesh, benchmark.name, benchmark.parallel_axes)  # a layout it runs
    return benchmark.with_context(RunContext(num_replicas=replicas, mesh=mesh))


@pytest.mark.parametrize("batch_shards", [1, 2])
@pytest.mark.parametrize(
    "name, overrides, layout",
    [(name, overrides, layout) for name, overrides, layouts in CASES for layout in layouts],
    ids=lambda v: ",".join(f"{k}={v}" for k, v in v.items()) if isinstance(v, dict) else str(v),
)
def test_samples_and_epochs_are_those_of_data_parallelism(name, overrides, layout, batch_shards):
    cls = registry.get(name)
    benchmark = cls(config_lib.override(cls.preset("smoke"), overrides))
    batch_shards *= layout.get("expert_parallel", 1)  # the expert axis reads different batches
    data_parallel = _bind(benchmark, batch_shards)
    split = _bind(benchmark, batch_shards, **layout)
    assert split.mesh.axes_used()  # a layout beyond data parallelism
    assert _counts(split) == _counts(data_parallel)
