"""Tests for mlperf_tf.optimizers.kfac: golden values against a NumPy K-FAC, replicas, conv."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.optimizers import KFAC
from tests import strategies
from tests.mlperf_tf.optimizers import golden
from tests.numerics import assert_close

pytestmark = pytest.mark.numerics


def numpy_kfac(weights, batches, *, lr, momentum, damping, decay, fi, ii, kl_clip, wd=0.0):
    """The algorithm of the `KFAC` docstring on the two Dense layers, SGD-momentum base."""
    w = [np.asarray(p, np.float64) for p in weights]
    velocity = [np.zeros_like(p) for p in w]
    factors = [[None, None], [None, None]]
    eig = [[(np.ones(5), np.eye(5)), (np.ones(3), np.eye(3))],
           [(np.ones(4), np.eye(4)), (np.ones(2), np.eye(2))]]  # fmt: skip
    for step, (x, y) in enumerate(batches):
        grads, inputs, dzs = golden.forward_backward(w, x, y)
        examples = len(x)
        if step % fi == 0:
            for layer, (a, dz) in enumerate(zip(inputs, dzs)):
                a = np.concatenate([a, np.ones((len(a), 1))], axis=1)
                new = [a.T @ a / len(a), examples**2 * dz.T @ dz / len(a)]
                d = 0.0 if step < fi else decay
                factors[layer] = [
                    new[i]
                    if factors[layer][i] is None
                    else d * factors[layer][i] + (1 - d) * new[i]
                    for i in range(2)
                ]
        if step % ii == 0:
            for layer in range(2):
                eig[layer] = []
                for f in factors[layer]:
                    values, vectors = np.linalg.eigh(f)
                    eig[layer].append((np.maximum(values, 0.0), vectors))
        pre = []
        for layer in range(2):
            g = np.concatenate([grads[2 * layer], grads[2 * layer + 1][None]], axis=0)
            (d_a, q_a), (d_g, q_g) = eig[layer]
            v = (q_a.T @ g @ q_g) / (d_a[:, None] * d_g[None, :] + damping)
            pre.append((q_a @ v @ q_g.T, g))
        if kl_clip:
            vg = abs(lr**2 * sum(np.sum(p * g) for p, g in pre))
            nu = min(1.0, np.sqrt(kl_clip / vg))
            pre = [(nu * p, g) for p, g in pre]
        new_grads = []
        for p, _ in pre:
            new_grads += [p[:-1], p[-1]]
        for i in (0, 2):  # the kernels; biases are excluded from weight decay
            new_grads[i] = new_grads[i] + wd * w[i]
        for i, g in enumerate(new_grads):
            velocity[i] = momentum * velocity[i] - lr * g
            w[i] = w[i] + velocity[i]
    return w


def run_kfac(make, weights, batches, strategy=None):
    """Trains with the K-FAC step protocol (capture, gradients, apply_gradients)."""
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        net = golden.model(weights)
        optimizer = make()
        assert optimizer.register_model(net) == 2
        optimizer.build(net.trainable_variables)

    @tf.function
    def step(x, y):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                with optimizer.capture():
                    loss = golden.loss_fn(net, x, y)
            grads = optimizer.gradients(tape, loss, net.trainable_variables)
            optimizer.apply_gradients(zip(grads, net.trainable_variables))

        strategy.run(replica_step, args=(x, y))

    for x, y in golden.replica_batches(strategy, batches):
        step(x, y)
    return optimizer, [v.numpy() for v in net.trainable_variables]


SETTINGS = dict(lr=0.05, momentum=0.9, damping=0.05, decay=0.8, fi=2, ii=3, kl_clip=0.0, wd=0.0)


def make(**overrides):
    s = {**SETTINGS, **overrides}
    return KFAC(
        s["lr"],
        momentum=s["momentum"],
        damping=s["damping"],
        factor_decay=s["decay"],
        factor_update_interval=s["fi"],
        inverse_update_interval=s["ii"],
        kl_clip=s["kl_clip"],
        weight_decay=s["wd"],
    )


@pytest.mark.parametrize("overrides", [{}, {"kl_clip": 1e-4}, {"fi": 1, "ii": 1}, {"wd": 0.05}])
def test_matches_numpy_kfac(overrides):
    weights, batches = golden.problem(seed=6, steps=7)
    expected = numpy_kfac(weights, batches, **{**SETTINGS, **overrides})
    _, got = run_kfac(lambda: make(**overrides), weights, batches)
    for a, b in zip(got, expected):
        assert_close(a, b, rtol=1e-5)


def test_preconditioning_changes_the_trajectory():
    weights, batches = golden.problem(seed=6, steps=4)
    _, kfac = run_kfac(make, weights, batches)
    _, sgd = golden.run_keras(keras.optimizers.SGD(0.05, momentum=0.9), weights, batches)
    assert max(np.abs(a - b).max() for a, b in zip(kfac, sgd)) > 1e-3


def test_two_replicas_equal_one_device():
    weights, batches = golden.problem(seed=7, steps=5)
    _, one = run_kfac(lambda: make(kl_clip=1e-3), weights, batches)
    _, two = run_kfac(lambda: make(kl_clip=1e-3), weights, batches, strategies.mirrored(2))
    for a, b in zip(one, two):
        assert_close(a, b, rtol=1e-5)


def test_conv2d_factors_use_patches_and_other_layers_fall_back():
    # Conv2D + BatchNorm + Dense: the conv and dense are preconditioned, batch norm is not.
    keras.utils.set_random_seed(1)
    net = keras.Sequential(
        [
            keras.Input((6, 6, 2)),
            keras.layers.Conv2D(3, 3, strides=2, padding="same", activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Flatten(),
            keras.layers.Dense(2),
        ]
    )
    optimizer = KFAC(0.1, factor_update_interval=1, inverse_update_interval=1, kl_clip=0.0)
    assert optimizer.register_model(net) == 2
    optimizer.build(net.trainable_variables)
    x = tf.random.stateless_normal([4, 6, 6, 2], seed=[1, 2])
    before = [v.numpy() for v in net.trainable_variables]
    with tf.GradientTape() as tape:
        with optimizer.capture():
            loss = tf.reduce_mean(tf.square(net(x, training=True)))
    grads = optimizer.gradients(tape, loss, net.trainable_variables)
    optimizer.apply_gradients(zip(grads, net.trainable_variables))
    conv = optimizer._blocks[0]
    patches = tf.image.extract_patches(x, [1, 3, 3, 1], [1, 2, 2, 1], [1, 1, 1, 1], "SAME")
    a = np.concatenate([patches.numpy().reshape(-1, 18), np.ones((36, 1))], axis=1)
    assert_close(conv.a_factor.numpy(), a.T @ a / 36, rtol=1e-5)
    assert conv.g_factor.numpy().shape == (3, 3)
    # Batch norm's gamma moved by plain SGD-momentum: -lr * g on the first step.
    gamma_index = [i for i, v in enumerate(net.trainable_variables) if "gamma" in v.path][0]
    assert_close(
        net.trainable_variables[gamma_index].numpy(),
        before[gamma_index] - 0.1 * grads[gamma_index].numpy(),
        rtol=1e-5,
    )
    # The layers' own calls are restored after capture.
    assert "call" not in net.layers[0].__dict__


def test_config_round_trip():
    optimizer = KFAC(0.1, base_optimizer="lars", damping=0.003, inverse_update_interval=50)
    config = optimizer.get_config()
    again = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert isinstance(again, KFAC) and again.get_config() == config
    assert config["base_optimizer"] == "lars" and config["damping"] == 0.003


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"base_optimizer": "adam"}, "base_optimizer"),
        ({"damping": 0.0}, "damping"),
        ({"factor_decay": 1.0}, "factor_decay"),
        ({"inverse_update_interval": 0}, "inverse_update_interval"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        KFAC(0.1, **kwargs)


def test_apply_without_the_capture_protocol_is_refused():
    weights, _ = golden.problem(seed=6, steps=1)
    net = golden.model(weights)
    optimizer = make()
    optimizer.register_model(net)
    grads = [tf.zeros_like(v) for v in net.trainable_variables]
    with pytest.raises(ValueError, match="capture"):
        optimizer.apply_gradients(zip(grads, net.trainable_variables))
