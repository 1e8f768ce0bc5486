"""Provides `train`: a few steps of a language-model benchmark through the runner's `Trainer` on a
data x pipeline (x model x expert) mesh of logical CPUs, returning the losses and whole weights,
for the exactness tests of pipeline parallelism (the pipelined run against the unpipelined run
of the same batch shards and micro-batches)."""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from mlperf_tf import checkpoints
from mlperf_tf import config as config_lib
from mlperf_tf.collectives import GradientSummer, Settings
from mlperf_tf.optimizers.adam import FusedAdam
from mlperf_tf.parallel import layout as layout_lib
from mlperf_tf.parallel.context import use_mesh
from mlperf_tf.parallel.input import for_mesh
from mlperf_tf.runner.pipeline import summer_stages
from mlperf_tf.runner.trainer import Trainer
from tests.tensor_parallel import on_mesh


@dataclasses.dataclass
class Run:
    losses: list[float]
    weights: dict[str, np.ndarray]  # whole, by Keras path, after the steps
    slots: dict[str, np.ndarray]  # the optimizer's variables, whole, by name
    trainer: Trainer
    restored: dict[str, np.ndarray]  # whole weights right after `restore_from` ({}: none)
    saved: dict[str, np.ndarray]  # whole weights when `save_to` was written ({}: not saved)
    non_trainable: dict[str, np.ndarray]  # whole, by Keras path, after the steps (MoE biases)


def benchmark_of(benchmark_class, preset: str = "smoke", **overrides):
    """`benchmark_class` on `preset` with `--config.*` style `overrides` (dots as "__")."""
    cfg = config_lib.override(
        benchmark_class.preset(preset), {k.replace("__", "."): str(v) for k, v in overrides.items()}
    )
    return benchmark_class(cfg)


def train(benchmark, *, num_devices: int, pipeline: int = 1, model_parallel: int = 1,
          expert_parallel: int = 1, context_parallel: int = 1, steps: int = 2,
          schedule: str = "1f1b",
          summer: bool = False, clip_norm: float | None = None, xla: bool = False,
          save_to: str = "", restore_from: str = "", save_after: int | None = None,
          weight_update_sharding: bool = False, dataset_fn=None,
          steps_per_loop: int = 1, between_loops=None) -> Run:  # fmt: skip
    """`steps` Adam steps of `benchmark` through the `Trainer` on `num_devices` logical CPUs:
    `pipeline` x `expert_parallel` x `context_parallel` x `model_parallel`, the rest data.
    `summer`: the collectives' `GradientSummer` instead of Keras' sum (needed with model or
    expert parallelism); `weight_update_sharding`: its sharded update (the optimizer holds no
    slots: the summer's pieces, saved whole as `sharded_slots`, as the runner saves them). The
    checkpoint is the runner's (`checkpoints.run_checkpoint`), read from `restore_from` before
    the steps and written to `save_to` after `save_after` of them (None: after all), the run
    going on after it. `dataset_fn`: input context -> per-replica batches (default the
    benchmark's `train_dataset`); the steps run `steps_per_loop` to a `Trainer.loop`, and
    `between_loops(model, metrics)` (host) after each loop."""
    strategy, mesh, benchmark = on_mesh(
        benchmark, num_devices, model_parallel=model_parallel, expert_parallel=expert_parallel,
        pipeline_parallel=pipeline, context_parallel=context_parallel,
    )  # fmt: skip
    if clip_norm is not None:
        benchmark.gradient_clip_norm = lambda: clip_norm
    gradient_summer = None
    if summer or model_parallel > 1 or expert_parallel > 1 or weight_update_sharding:
        settings = Settings(
            all_reduce="ring", timeout_s=60, weight_update_sharding=weight_update_sharding
        )
        gradient_summer = GradientSummer(strategy, settings, mesh)
    with strategy.scope(), use_mesh(mesh):
        model = benchmark.build_model()
        opt = FusedAdam(1e-3)
        variables = model.trainable_variables
        parts = {}
        if gradient_summer is not None:  # first: it decides who holds the slots, as the runner
            stages = summer_stages(
                strategy=strategy, benchmark=benchmark, model=model, summer=gradient_summer
            )
            gradient_summer.build(opt, variables, stages=stages)
            if gradient_summer.sharded:
                parts["sharded_slots"] = gradient_summer.checkpointable()
            elif gradient_summer.holds_slots:  # stage-local: under the optimizer's own keys
                parts["optimizer_slots"] = gradient_summer.optimizer_slots()
        opt.build([] if gradient_summer is not None and gradient_summer.holds_slots else variables)
        layout_lib.split_slots(opt, mesh)
        # The runner's one format (variables by Keras path). Not `tf.train.Checkpoint(model=...)`:
        # Keras 3 does not track layers held in a list (`DecoderModel.decoder_layers`) for TF's
        # checkpoint, so a positional one holds the decoder blocks only through the optimizer's
        # references, which a sharded update's optimizer (built without variables) has not.
        checkpoint = checkpoints.run_checkpoint(model=model, optimizer=opt, **parts)
        trainer = Trainer(strategy=strategy, benchmark=benchmark, model=model, optimizer=opt,
                          xla=xla, pipeline_schedule=schedule)  # fmt: skip
    if restore_from:  # outside the scope, as the runner restores
        checkpoint.read(restore_from).assert_consumed()
    restored = _whole(strategy, variables, mesh) if restore_from else {}
    trainer.summer = gradient_summer
    dataset_fn = dataset_fn or benchmark.train_dataset
    data = iter(strategy.distribute_datasets_from_function(for_mesh(dataset_fn, mesh)))
    losses, saved = [], {}
    save_after = steps if save_after is None else save_after
    for step in range(0, steps + 1, steps_per_loop):
        if save_to and step == save_after:
            # Outside the scope, as the runner saves (a sharded update's slots gather).
            checkpoint.write(save_to)
            saved = _whole(strategy, variables, mesh)
        if step == steps:
            break
        loss, done, _, metrics = trainer.loop(data, tf.constant(steps_per_loop, tf.int32))
        assert int(done) == steps_per_loop
        losses.append(float(loss))
        if between_loops is not None:
            between_loops(model, metrics)
    weights = _whole(strategy, variables, mesh)
    non_trainable = _whole(strategy, model.non_trainable_variables, mesh)
    with strategy.scope():
        slots = {v.name: np.asarray(layout_lib.whole_value(v, mesh)) for v in opt.variables}
    return Run(losses, weights, slots, trainer, restored, saved, non_trainable)


def _whole(strategy, variables, mesh) -> dict[str, np.ndarray]:
    """Each variable's whole value (a split one joined over its shards), by Keras path."""
    with strategy.scope():
        return {v.path: np.asarray(layout_lib.whole_value(v, mesh)) for v in variables}
