"""DLRMv4 on 2 and 4 data-parallel replicas ends where 1 replica does on the same global batches:
the tables' row-wise Adagrad sees the touched rows of every replica (Keras' cross-replica sum of
`IndexedSlices` concatenates them; the optimizer sums duplicates), and the dense clip sees the
summed gradient."""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from benchmarks.dlrmv4 import config as config_lib
from benchmarks.dlrmv4 import input as input_lib
from benchmarks.dlrmv4.benchmark import DlrmV4Benchmark
from mlperf_tf.benchmark import RunContext
from mlperf_tf.parallel.mesh import DeviceMesh
from tests import strategies

pytestmark = pytest.mark.numerics

STEPS = 3


def _config():
    smoke = config_lib.smoke()
    model = dataclasses.replace(smoke.model, input_dropout=0.0, linear_dropout=0.0)
    # A clip that binds (the smoke's dense gradient norm is above 0.05).
    optimizer = dataclasses.replace(smoke.optimizer, opt_gradient_clip_norm=0.05)
    return dataclasses.replace(smoke, model=model, optimizer=optimizer)


def _batches(config):
    examples = [input_lib.synthetic_example(config.model, s) for s in range(STEPS * 16)]
    stacked = {k: tf.stack([e[k] for e in examples]).numpy() for k in examples[0]}
    return [{k: v[16 * s : 16 * (s + 1)] for k, v in stacked.items()} for s in range(STEPS)]


def _train(replicas: int):
    config = _config()
    strategy = strategies.mirrored(replicas)
    context = RunContext(num_replicas=replicas, seed=1, mesh=DeviceMesh(data=replicas))
    benchmark = DlrmV4Benchmark(config).with_context(context)
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = benchmark.build_model()
        optimizer = benchmark.build_optimizer(STEPS)
        optimizer.build(model.trainable_variables)

    def replica_step(batch):
        with tf.GradientTape() as tape:
            loss = benchmark.compute_loss(model, batch, training=True)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def step(batch):
        return strategy.reduce("sum", strategy.run(replica_step, args=(batch,)), axis=None)

    per = 16 // replicas
    for batch in _batches(config):
        shards = strategy.experimental_distribute_values_from_function(
            lambda ctx, b=batch: {
                k: v[per * ctx.replica_id_in_sync_group : per * (ctx.replica_id_in_sync_group + 1)]
                for k, v in b.items()
            }
        )
        step(shards)
    return {v.path: v.numpy() for v in model.weights}


# Extended or slow (CI runs 2 after README's default run): the default run covers replicas by
# test_sharded_tables.py (2 replicas, the tables split, end with one replica's weights).
@pytest.mark.parametrize(
    "replicas",
    [pytest.param(2, marks=pytest.mark.extended), pytest.param(4, marks=pytest.mark.slow)],
)  # fmt: skip
def test_data_parallel_replicas_end_with_one_replicas_weights(replicas):
    one, many = _train(1), _train(replicas)
    for path, want in one.items():
        scale = max(1e-3, float(np.abs(want).max()))
        np.testing.assert_allclose(many[path], want, rtol=0, atol=2e-5 * scale, err_msg=path)
