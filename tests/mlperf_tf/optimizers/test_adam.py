"""Tests for mlperf_tf.optimizers.adam: FusedAdam against a NumPy Adam and Keras' Adam."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.optimizers import FusedAdam, WarmupRsqrtDecay
from tests import strategies
from tests.mlperf_tf.optimizers import golden

pytestmark = pytest.mark.numerics

SETTINGS = {"beta_1": 0.9, "beta_2": 0.997, "epsilon": 1e-9}


def schedule():
    return WarmupRsqrtDecay(2.0, warmup_steps=3, factor=16**-0.5)


def numpy_adam(weights, batches, *, beta_1, beta_2, epsilon):
    """Adam (Kingma & Ba, Algorithm 1, with the bias corrections folded into the rate, as Keras
    and TF's kernel write it) on the golden problem in float64; returns the final weights."""
    w = [np.asarray(x, np.float64) for x in weights]
    m = [np.zeros_like(x) for x in w]
    v = [np.zeros_like(x) for x in w]
    lr_of = schedule()
    for t, (x, y) in enumerate(batches, start=1):
        grads, _, _ = golden.forward_backward(w, x, y)
        alpha = float(lr_of(t - 1)) * np.sqrt(1 - beta_2**t) / (1 - beta_1**t)
        for i, g in enumerate(grads):
            m[i] = beta_1 * m[i] + (1 - beta_1) * g
            v[i] = beta_2 * v[i] + (1 - beta_2) * g**2
            w[i] = w[i] - alpha * m[i] / (np.sqrt(v[i]) + epsilon)
    return w


def test_matches_the_adam_formula_and_keras_adam():
    weights, batches = golden.problem()
    _, fused = golden.run_keras(FusedAdam(schedule(), **SETTINGS), weights, batches)
    _, stock = golden.run_keras(keras.optimizers.Adam(schedule(), **SETTINGS), weights, batches)
    expected = numpy_adam(weights, batches, **SETTINGS)
    for got, keras_value, want in zip(fused, stock, expected):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
        # Keras' separate float32 ops round more often (here up to 5e-6 from float64, where the
        # fused kernel stays within 1e-6); the two agree to float32 rounding, not bit for bit.
        np.testing.assert_allclose(keras_value, want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got, keras_value, rtol=1e-4, atol=1e-5)
    assert not all(np.array_equal(a, b) for a, b in zip(fused, weights))  # it did train


def test_two_replicas_equal_one_on_the_same_global_batch():
    weights, batches = golden.problem(seed=2, steps=3)
    _, one = golden.run_keras(lambda: FusedAdam(schedule(), **SETTINGS), weights, batches)
    _, two = golden.run_keras(
        lambda: FusedAdam(schedule(), **SETTINGS), weights, batches, strategies.mirrored(2)
    )
    for a, b in zip(one, two):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_sparse_gradients_take_keras_update():
    table = keras.Variable(np.ones((5, 2), np.float32))
    fused, stock = FusedAdam(0.1, **SETTINGS), keras.optimizers.Adam(0.1, **SETTINGS)
    other = keras.Variable(np.ones((5, 2), np.float32))
    fused.build([table])
    stock.build([other])
    rows = tf.IndexedSlices(tf.constant([[1.0, -2.0]]), tf.constant([3]), tf.constant([5, 2]))
    fused.apply_gradients([(rows, table)])
    stock.apply_gradients([(rows, other)])
    np.testing.assert_array_equal(table.numpy(), other.numpy())
    assert table.numpy()[3, 0] < 1.0 and table.numpy()[0, 0] == 1.0


def test_config_round_trips_and_keras_adam_checkpoints_restore(tmp_path):
    optimizer = FusedAdam(schedule(), **SETTINGS)
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(restored) is FusedAdam
    assert restored.get_config() == optimizer.get_config()
    # Same slots as Keras' Adam: a checkpoint written with it restores into FusedAdam.
    weights, batches = golden.problem(seed=4, steps=2)
    stock = keras.optimizers.Adam(schedule(), **SETTINGS)
    net, _ = golden.run_keras(stock, weights, batches)
    path = tf.train.Checkpoint(model=net, optimizer=stock).write(str(tmp_path / "ckpt"))
    fresh = golden.model(weights)
    optimizer.build(fresh.trainable_variables)
    tf.train.Checkpoint(model=fresh, optimizer=optimizer).read(path).assert_consumed()
    assert int(optimizer.iterations) == 2
    for a, b in zip(optimizer.variables, stock.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_amsgrad_takes_keras_update():
    weights, batches = golden.problem(seed=3, steps=3)
    _, fused = golden.run_keras(FusedAdam(0.01, amsgrad=True), weights, batches)
    _, stock = golden.run_keras(keras.optimizers.Adam(0.01, amsgrad=True), weights, batches)
    for a, b in zip(fused, stock):
        np.testing.assert_array_equal(a, b)


def test_step_scalars_are_built_once_per_step_not_per_variable():
    variables = [keras.Variable(np.ones((3,), np.float32) * i) for i in range(1, 6)]
    optimizer = FusedAdam(schedule(), **SETTINGS)
    optimizer.build(variables)

    @tf.function
    def step():
        optimizer.apply([tf.ones((3,)) for _ in variables], variables)

    graph = step.get_concrete_function().graph
    types = [op.type for op in graph.get_operations()]
    assert types.count("ResourceApplyAdam") == 5
    assert types.count("Pow") == 2  # beta_1**t and beta_2**t, shared by the 5 variables
    step()
    step()  # the second step must see t = 2, not a cached t = 1
    stock = [keras.Variable(np.ones((3,), np.float32) * i) for i in range(1, 6)]
    reference = keras.optimizers.Adam(schedule(), **SETTINGS)
    for _ in range(2):
        reference.apply([tf.ones((3,)) for _ in stock], stock)
    for a, b in zip(variables, stock):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)
