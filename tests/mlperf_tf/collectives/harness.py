"""Provides `train`: 10 steps of the tiny benchmark on a MirroredStrategy, with or without a
`GradientSummer`, for the exactness tests (also run as a script for the 8-device sweep).

usage: python -m tests.mlperf_tf.collectives.harness NUM_DEVICES
prints one JSON line per case: {"case": ..., "max_rel_error": ...}
"""

from __future__ import annotations

import itertools
import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf

from mlperf_tf.benchmark import RunContext
from mlperf_tf.collectives import GradientSummer, Settings
from mlperf_tf.optimizers import LAMB, LARS
from mlperf_tf.optimizers.adam import FusedAdam
from mlperf_tf.optimizers.adamw import AdamW
from tests.tiny_benchmark import TinyBenchmark, smoke, weights

STEPS = 10
OPTIMIZERS = ("sgd", "lars", "lamb")


def make_optimizer(name: str):
    """One of `OPTIMIZERS` (the sweep's), or "adam" (the Transformer's fused Adam) or "adamw"
    (with weight decay and an exclusion)."""
    if name == "sgd":
        return keras.optimizers.SGD(0.05, momentum=0.9)
    if name == "lars":
        return LARS(0.5, momentum=0.9, weight_decay=1e-3, eeta=0.01)
    if name == "adam":
        return FusedAdam(1e-3)
    if name == "adamw":
        return AdamW(1e-3, weight_decay=0.1, exclude_from_weight_decay=("bias",))
    return LAMB(0.01, weight_decay=0.01)


def train(strategy, optimizer_name: str, settings: Settings | None, *, clip_norm=None,
          steps: int = STEPS):  # fmt: skip
    """Weights after `steps` steps and the summer; `settings=None` is Keras' own sum (the
    reference, with the runner's clipping of the summed gradient)."""
    context = RunContext(num_replicas=strategy.num_replicas_in_sync)
    benchmark = TinyBenchmark(smoke(), context=context)
    keras.utils.set_random_seed(1)
    summer = GradientSummer(strategy, settings) if settings else None
    with strategy.scope():
        model = benchmark.build_model()
        optimizer = make_optimizer(optimizer_name)
        variables = model.trainable_variables
        optimizer.build([] if summer and summer.sharded else variables)
        if summer:
            summer.build(optimizer, variables)
    data = iter(strategy.distribute_datasets_from_function(benchmark.train_dataset))

    def replica_step(batch):
        with tf.GradientTape() as tape:
            loss = benchmark.compute_loss(model, batch)
        grads = tape.gradient(loss, variables)
        if summer:
            summer.apply(optimizer, grads, variables, clip_norm=clip_norm)
        else:
            context = tf.distribute.get_replica_context()
            if clip_norm:
                n = context.num_replicas_in_sync
                grads = context.all_reduce("sum", grads)
                grads, _ = tf.clip_by_global_norm(grads, clip_norm)
                grads = [g / n for g in grads]
            optimizer.apply_gradients(zip(grads, variables))
        return loss

    @tf.function
    def step(iterator):
        strategy.run(replica_step, args=(next(iterator),))

    for _ in range(steps):
        step(data)
    return weights(model), summer


def max_rel_error(a, b) -> float:
    return max(
        float(np.max(np.abs(x - y)) / max(float(np.max(np.abs(y))), 1e-12))
        for x, y in zip(a, b, strict=True)
    )


def cases():
    for algorithm, pack_mb, sharding in itertools.product(
        ("auto", "ring", "hierarchical", "torus2d"), (0.0, 0.001), (False, True)
    ):
        yield Settings(all_reduce=algorithm, pack_mb=pack_mb, weight_update_sharding=sharding,
                       timeout_s=60)  # fmt: skip


def main(argv):
    num_devices = int(argv[0])
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices
    )
    devices = [f"CPU:{i}" for i in range(num_devices)]
    strategy = tf.distribute.MirroredStrategy(
        devices, cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
    for optimizer_name in OPTIMIZERS:
        reference, _ = train(strategy, optimizer_name, None)
        for settings in cases():
            if settings.uses_keras_sum:
                continue
            got, summer = train(strategy, optimizer_name, settings)
            case = {"optimizer": optimizer_name, "mesh": str(summer.mesh),
                    **summer.metadata()}  # fmt: skip
            print(json.dumps({"case": case, "max_rel_error": max_rel_error(got, reference)}),
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main(sys.argv[1:])
