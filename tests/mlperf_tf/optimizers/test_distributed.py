"""LARS and LAMB under MirroredStrategy, in fp16 with loss scaling, and compiled with XLA."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.optimizers import LAMB, LARS
from tests import strategies
from tests.mlperf_tf.optimizers import golden
from tests.numerics import assert_close

pytestmark = pytest.mark.numerics

GLOBAL_BATCH = 8
FEATURES = 6
_RNG = np.random.default_rng(3)
X = _RNG.normal(size=(GLOBAL_BATCH, FEATURES)).astype("float32")
Y = _RNG.normal(size=(GLOBAL_BATCH, 2)).astype("float32")


def make_optimizer(kind):
    if kind == "lars":
        return LARS(0.1, momentum=0.9, weight_decay=0.01, eeta=0.1)
    return LAMB(0.05, weight_decay=0.01)


def make_model(dtype=None):
    # Dense kernels are adapted, biases and LayerNorm excluded: both code paths run.
    return keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(16, activation="relu", dtype=dtype),
            keras.layers.LayerNormalization(dtype=dtype),
            keras.layers.Dense(2, dtype=dtype),
        ]
    )


def per_replica_loss(model, x, y):
    # Summed over the local examples and divided by the GLOBAL batch: the replicas' gradients
    # add up (inside apply_gradients) to the gradient of the global mean.
    error = tf.cast(model(x, training=True), tf.float32) - y
    return tf.reduce_sum(tf.square(error)) / GLOBAL_BATCH


def train_steps(strategy, kind, initial_weights, num_steps=2):
    with strategy.scope():
        model = make_model()
        model.set_weights(initial_weights)
        optimizer = make_optimizer(kind)
        optimizer.build(model.trainable_variables)
    step = golden.train_step(strategy, model, optimizer, per_replica_loss)
    dataset = tf.data.Dataset.from_tensors((X, Y)).repeat(num_steps)
    for x, y in strategy.experimental_distribute_dataset(dataset):
        step(x, y)
    return [v.numpy() for v in model.trainable_variables]


@pytest.mark.parametrize("kind", ["lars", "lamb"])
def test_two_replicas_equal_one_device_on_the_same_global_batch(kind):
    initial = make_model().get_weights()
    single = train_steps(tf.distribute.OneDeviceStrategy("CPU:0"), kind, initial)
    mirrored = train_steps(strategies.mirrored(2), kind, initial)
    for a, b, w in zip(mirrored, single, initial):
        assert not np.allclose(b, w)  # the step did something
        assert_close(a, b, rtol=1e-5)


@pytest.mark.parametrize("kind", ["lars", "lamb"])
def test_fp16_with_loss_scaling_reduces_the_loss(kind):
    model = make_model(dtype="mixed_float16")
    inner = (
        LARS(0.1, momentum=0.9, weight_decay=1e-4, eeta=0.1)
        if kind == "lars"
        else LAMB(0.02, weight_decay=1e-4)
    )
    optimizer = keras.optimizers.LossScaleOptimizer(inner)
    x, y = tf.constant(X), tf.constant(Y)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = per_replica_loss(model, x, y)
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    losses = [float(step()) for _ in range(30)]
    assert model.layers[0].compute_dtype == "float16"
    assert all(np.isfinite(losses))
    assert losses[-1] < 0.5 * losses[0], losses


def make_train_step(model, optimizer, jit_compile):
    @tf.function(jit_compile=jit_compile)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = per_replica_loss(model, x, y)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return step


@pytest.mark.parametrize("kind", ["lars", "lamb"])
def test_update_compiles_with_xla_and_matches_the_graph_step(kind):
    initial = make_model().get_weights()
    x, y = tf.constant(X), tf.constant(Y)
    results = []
    for jit_compile in (False, True):
        model = make_model()
        model.set_weights(initial)
        optimizer = make_optimizer(kind)
        optimizer.build(model.trainable_variables)
        step = make_train_step(model, optimizer, jit_compile)
        for _ in range(3):
            step(x, y)
        if jit_compile:
            # The step really went through XLA: its HLO exists.
            assert "HloModule" in step.experimental_get_compiler_ir(x, y)(stage="hlo")
        results.append([v.numpy() for v in model.trainable_variables])
    for a, b in zip(*results):
        assert_close(a, b, rtol=1e-5)
