"""Tests of `CrossReplicaBatchNormalization` and `model_bn_span` against NumPy and Keras' BN."""

import json
import time
from unittest import mock

import keras
import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.collectives.ops import Collectives
from mlperf_tf.config import ConfigError
from mlperf_tf.layers import CrossReplicaBatchNormalization, model_bn_span
from mlperf_tf.layers.batch_norm import group_moments, table_group_sum
from tests import processes
from tests.mlperf_tf.layers import mwms_worker
from tests.numerics import assert_close

pytestmark = pytest.mark.numerics

REPLICAS = 4
SHAPE = (2, 3, 3, 4)  # per-replica batch [B, H, W, C]
EPS = 1e-3
MOMENTUM = 0.75
MWMS_TIMEOUT_S = 120  # both workers together; a peer that never comes is bounded by this
COLLECTIVE_TIMEOUT_S = 60  # a group all-reduce in this process fails instead of hanging


@pytest.fixture(scope="module")
def strategy():
    """One 4-replica MirroredStrategy for the module, reducing without collective ops.

    Every default MirroredStrategy in a process numbers its collectives from the same keys, so
    a second one over the same devices whose first all-reduce has another shape aborts (and
    poisons) collectives in the whole process. `ReductionToOneDevice` has no keys; the default
    collective implementation is covered by the multi-worker test, in its own processes.
    """
    devices = tf.config.list_logical_devices("CPU")
    assert len(devices) >= REPLICAS, "tests/conftest.py should split the CPU into 4 devices"
    return tf.distribute.MirroredStrategy(
        [f"CPU:{i}" for i in range(REPLICAS)],
        cross_device_ops=tf.distribute.ReductionToOneDevice(),
    )


def _replica_inputs(seed=0, replicas=REPLICAS, shape=SHAPE, dtype=np.float32):
    """Per-replica inputs with different means and scales per replica, and loss weights."""
    rng = np.random.RandomState(seed)
    x = np.stack([rng.normal(3.0 * r - 4.0, 1.0 + r, shape) for r in range(replicas)])
    w = rng.normal(0.0, 1.0, (replicas,) + shape)
    return x.astype(dtype), w.astype(np.float32)


def _per_replica(strategy, array):
    """A distributed value whose replica `r` holds `array[r]`."""
    return strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(array[ctx.replica_id_in_sync_group])
    )


def _train_step(strategy, layer, x, w):
    """One training call per replica; returns outputs, input gradients of sum(y * w) [R, ...]."""

    def replica_fn(xr, wr):
        with tf.GradientTape() as tape:
            tape.watch(xr)
            y = layer(xr, training=True)
            loss = tf.reduce_sum(tf.cast(y, tf.float32) * wr)
        return y, tape.gradient(loss, xr)

    step = tf.function(lambda a, b: strategy.run(replica_fn, args=(a, b)))
    y, grad = step(_per_replica(strategy, x), _per_replica(strategy, w))
    local = strategy.experimental_local_results
    return np.stack([t.numpy() for t in local(y)]), np.stack([t.numpy() for t in local(grad)])


def _local_copies(strategy, variable):
    """Each replica's copy of a mirrored Keras variable, [R, C]."""
    return np.stack([v.numpy() for v in strategy.experimental_local_results(variable.value)])


def _make_layer(strategy, group_size, channels=SHAPE[-1], **kwargs):
    with strategy.scope():
        layer = CrossReplicaBatchNormalization(
            group_size=group_size,
            momentum=MOMENTUM,
            epsilon=EPS,
            collective_timeout_s=COLLECTIVE_TIMEOUT_S,
            **kwargs,
        )
        layer.build((None,) + SHAPE[1:-1] + (channels,))
        rng = np.random.RandomState(7)
        layer.gamma.assign(rng.uniform(0.5, 1.5, channels).astype(np.float32))
        layer.beta.assign(rng.normal(0.0, 1.0, channels).astype(np.float32))
        # Non-trivial moving statistics: the update of each must be checked, not assumed.
        layer.moving_mean.assign(rng.normal(2.0, 1.0, channels).astype(np.float32))
        layer.moving_variance.assign(rng.uniform(0.5, 2.0, channels).astype(np.float32))
    return layer


def _numpy_bn(x, gamma, beta):
    """Training-mode BN of a batch in float64: (output, mean, biased variance)."""
    x = x.astype(np.float64)
    axes = tuple(range(x.ndim - 1))
    mean, var = x.mean(axes), x.var(axes)
    return (x - mean) / np.sqrt(var + EPS) * gamma + beta, mean, var


def _keras_input_grad(x, w, gamma, beta):
    """Input gradient of sum(y * w) through a single-device Keras BN over the whole batch `x`."""
    bn = keras.layers.BatchNormalization(momentum=MOMENTUM, epsilon=EPS)
    bn.build(x.shape)
    bn.gamma.assign(gamma)
    bn.beta.assign(beta)
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        loss = tf.reduce_sum(bn(xt, training=True) * w)
    return tape.gradient(loss, xt).numpy()


@pytest.mark.parametrize("group_size", [1, 2, 4])
def test_grouped_statistics_and_gradients_match_group_batch(group_size, strategy):
    layer = _make_layer(strategy, group_size)
    gamma, beta = layer.gamma.numpy(), layer.beta.numpy()
    mm0, mv0 = layer.moving_mean.numpy(), layer.moving_variance.numpy()
    x, w = _replica_inputs(seed=group_size)

    y, grad = _train_step(strategy, layer, x, w)

    moving_mean = _local_copies(strategy, layer.moving_mean)
    moving_var = _local_copies(strategy, layer.moving_variance)
    for g in range(REPLICAS // group_size):
        members = slice(g * group_size, (g + 1) * group_size)
        group_batch = x[members].reshape((-1,) + SHAPE[1:])  # the group's concatenated batch
        ref_y, mean, var = _numpy_bn(group_batch, gamma, beta)
        assert_close(y[members].reshape(ref_y.shape), ref_y, rtol=1e-5)
        for r in range(g * group_size, (g + 1) * group_size):
            assert_close(moving_mean[r], MOMENTUM * mm0 + (1 - MOMENTUM) * mean, rtol=1e-5)
            assert_close(moving_var[r], MOMENTUM * mv0 + (1 - MOMENTUM) * var, rtol=1e-5)
        ref_grad = _keras_input_grad(
            group_batch.astype(np.float32), w[members].reshape(group_batch.shape), gamma, beta
        )
        assert_close(grad[members].reshape(ref_grad.shape), ref_grad, rtol=1e-4)
    # Groups really differ (replica means differ), so a wrong row would be caught above.
    if group_size < REPLICAS:
        assert not np.allclose(moving_mean[0], moving_mean[-1])


@pytest.mark.parametrize("group_size, expected_calls", [(1, 0), (2, 1), (4, 1)])
def test_one_group_all_reduce_per_layer_call_and_no_merge_call(
    group_size, expected_calls, strategy
):
    """One group collective in the forward pass, one more for its gradient; no `merge_call`
    (whose per-layer thread hand-offs made tracing a full-depth ResNet-50 take minutes)."""
    layer = _make_layer(strategy, group_size)
    x, w = _replica_inputs()
    forward = tf.function(lambda a: strategy.run(lambda xr: layer(xr, training=True), args=(a,)))
    context = tf.distribute.ReplicaContext
    with (
        mock.patch.object(
            Collectives, "all_reduce", autospec=True, side_effect=Collectives.all_reduce
        ) as all_reduce,
        mock.patch.object(
            context, "merge_call", autospec=True, side_effect=context.merge_call
        ) as merge_call,
    ):
        forward(_per_replica(strategy, x))  # traced once per replica
        assert all_reduce.call_count == expected_calls * REPLICAS
        groups = {tuple(call.args[2]) for call in all_reduce.call_args_list}
        expected_groups = {tuple(range(g, g + group_size)) for g in range(0, REPLICAS, group_size)}
        assert groups == (expected_groups if expected_calls else set())
        all_reduce.reset_mock()
        _train_step(strategy, layer, x, w)
        assert all_reduce.call_count == 2 * expected_calls * REPLICAS
        assert merge_call.call_count == 0


def test_layer_called_twice_in_one_step(strategy):
    """Two calls of one layer in one traced step (gradient accumulation's micro-batches) are
    two collective instances: each call normalizes its own inputs over its group."""
    layer = _make_layer(strategy, 2)
    gamma, beta = layer.gamma.numpy(), layer.beta.numpy()
    x, w = _replica_inputs(seed=11)

    def replica_fn(xr, wr):
        with tf.GradientTape() as tape:
            tape.watch(xr)
            y1 = layer(xr, training=True)
            y2 = layer(xr * 2.0 + 1.0, training=True)
            loss = tf.reduce_sum((y1 + y2) * wr)
        return y1, y2, tape.gradient(loss, xr)

    step = tf.function(lambda a, b: strategy.run(replica_fn, args=(a, b)))
    outputs = step(_per_replica(strategy, x), _per_replica(strategy, w))
    y1, y2, grad = (
        np.stack([t.numpy() for t in strategy.experimental_local_results(o)]) for o in outputs
    )
    for g in range(2):
        members = slice(2 * g, 2 * g + 2)
        group_batch = x[members].reshape((-1,) + SHAPE[1:])
        for y, batch in ((y1, group_batch), (y2, group_batch * 2.0 + 1.0)):
            ref_y, _, _ = _numpy_bn(batch, gamma, beta)
            assert_close(y[members].reshape(ref_y.shape), ref_y, rtol=1e-5)
        # d/dx of BN(x) + BN(2x + 1) = grad_BN(x) + 2 grad_BN(2x + 1), both over the group.
        group_w = w[members].reshape(group_batch.shape)
        ref_grad = _keras_input_grad(group_batch, group_w, gamma, beta) + 2.0 * _keras_input_grad(
            group_batch * 2.0 + 1.0, group_w, gamma, beta
        )
        assert_close(grad[members].reshape(ref_grad.shape), ref_grad, rtol=1e-4)


def test_large_means_do_not_cancel_the_variance(strategy):
    """Inputs with mean 1000 and std 1 at the first step (moving mean 0): Chan's combination of
    per-replica means and squared deviations keeps the group variance; summed squares, the
    formula before it, lose it to fp32 rounding (the control below)."""
    rng = np.random.RandomState(4)
    x = rng.normal(1000.0, 1.0, (REPLICAS,) + SHAPE).astype(np.float32)
    w = np.ones_like(x)
    layer = _make_layer(strategy, 2)
    with strategy.scope():  # the first step's moving statistics
        layer.moving_mean.assign(np.zeros(SHAPE[-1], np.float32))
        layer.moving_variance.assign(np.ones(SHAPE[-1], np.float32))
    gamma, beta = layer.gamma.numpy(), layer.beta.numpy()
    y, grad = _train_step(strategy, layer, x, w)
    moving_var = _local_copies(strategy, layer.moving_variance)
    for g in range(2):
        members = slice(2 * g, 2 * g + 2)
        group_batch = x[members].reshape((-1,) + SHAPE[1:])
        ref_y, _, var = _numpy_bn(group_batch, gamma, beta)
        # fp32 x near 1000 is itself rounded to ~6e-5 (relative 6e-8 of 1000, 6e-5 of std 1).
        assert_close(y[members].reshape(ref_y.shape), ref_y, rtol=1e-3)
        assert_close(moving_var[2 * g], MOMENTUM + (1 - MOMENTUM) * var, rtol=1e-4)
        ref_grad = _keras_input_grad(
            group_batch, w[members].reshape(group_batch.shape), gamma, beta
        )
        assert_close(grad[members].reshape(ref_grad.shape), ref_grad, rtol=1e-3)

    # The control: E[x^2] - E[x]^2 from the same fp32 sums is off by more than 1e-3.
    group_batch = tf.constant(x[:2].reshape((-1,) + SHAPE[1:]))
    mean = tf.reduce_mean(group_batch, axis=(0, 1, 2))
    naive_var = tf.reduce_mean(tf.square(group_batch), axis=(0, 1, 2)) - tf.square(mean)
    exact = x[:2].astype(np.float64).reshape((-1,) + SHAPE[1:]).var((0, 1, 2))
    assert np.max(np.abs(naive_var.numpy() - exact)) > 1e-3
    _, var = group_moments(group_batch, axis=-1, group_sum=lambda t: t)
    assert_close(var, exact, rtol=1e-4)


@pytest.mark.parametrize("dtype", ["float16", pytest.param("bfloat16", marks=pytest.mark.bfloat16)])
def test_half_precision_inputs_keep_fp32_statistics(dtype, strategy):
    policy = "mixed_float16" if dtype == "float16" else "mixed_bfloat16"
    layer = _make_layer(strategy, 2, dtype=policy)
    assert layer.moving_mean.dtype == "float32" and layer.gamma.dtype == "float32"
    gamma, beta = layer.gamma.numpy(), layer.beta.numpy()
    mm0 = layer.moving_mean.numpy()
    # |x| ~ 300: a sum of squares in fp16 would overflow (fp16 max 65504).
    x, w = _replica_inputs(seed=3)
    x = (x * 10.0 + 300.0).astype(tf.as_dtype(dtype).as_numpy_dtype)

    y, _ = _train_step(strategy, layer, tf.constant(x).numpy(), w)

    assert y.dtype == tf.as_dtype(dtype).as_numpy_dtype
    moving_mean = _local_copies(strategy, layer.moving_mean)
    x64 = x.astype(np.float64)
    for g in range(2):
        ref_y, mean, _ = _numpy_bn(x64[2 * g : 2 * g + 2].reshape((-1,) + SHAPE[1:]), gamma, beta)
        assert_close(y[2 * g : 2 * g + 2].astype(np.float64).reshape(ref_y.shape), ref_y, rtol=0.05)
        assert_close(moving_mean[2 * g], MOMENTUM * mm0 + (1 - MOMENTUM) * mean, rtol=1e-5)


def test_masked_inputs_count_only_unmasked_positions(strategy):
    shape = (2, 5, 3)  # [B, T, C]
    with strategy.scope():
        layer = CrossReplicaBatchNormalization(group_size=4, epsilon=EPS, center=False, scale=False)
        layer.build((None, 5, 3))
    x, _ = _replica_inputs(seed=5, shape=shape)
    mask = np.random.RandomState(6).uniform(size=(REPLICAS, 2, 5)) < 0.6
    fn = tf.function(
        lambda a, m: strategy.run(lambda xr, mr: layer(xr, training=True, mask=mr), args=(a, m))
    )
    y = fn(_per_replica(strategy, x), _per_replica(strategy, mask))
    y = np.stack([t.numpy() for t in strategy.experimental_local_results(y)])
    kept = x.astype(np.float64)[mask]  # [N, C]
    ref = (x - kept.mean(0)) / np.sqrt(kept.var(0) + EPS)
    assert_close(y, ref, rtol=1e-5)


def test_group_size_not_dividing_replicas_fails_at_build(strategy):
    with strategy.scope():
        with pytest.raises(ConfigError, match=r"`group_size` \(3\).*replicas in sync \(4\)"):
            keras.Sequential([keras.Input((3, 3, 4)), CrossReplicaBatchNormalization(group_size=3)])
    # A layer built without a strategy fails when called under one.
    layer = CrossReplicaBatchNormalization(group_size=8)
    layer.build((None, 3, 3, 4))
    x, w = _replica_inputs()
    with pytest.raises(ValueError, match=r"`group_size` \(8\).*replicas in sync \(4\)"):
        _train_step(strategy, layer, x, w)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"group_size": 0}, "group_size"),
        ({"group_size": 2.0}, "group_size"),
        ({"group_size": 2, "synchronized": True}, "synchronized"),
        ({"group_size": 2, "renorm": True}, "renorm"),
        ({"fused": 1}, "fused"),
        ({"collective_timeout_s": -1.0}, "collective_timeout_s"),
        ({"collective_timeout_s": "60"}, "collective_timeout_s"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        CrossReplicaBatchNormalization(**kwargs)


def test_plain_keras_bn_outside_replica_context_and_in_inference(strategy):
    x = np.random.RandomState(1).normal(2.0, 3.0, (4, 3, 3, 4)).astype(np.float32)
    layer = CrossReplicaBatchNormalization(group_size=4, momentum=MOMENTUM)
    reference = keras.layers.BatchNormalization(momentum=MOMENTUM)
    for bn in (layer, reference):
        bn.build(x.shape)
        bn.gamma.assign(np.arange(1, 5, dtype=np.float32))
    # No strategy: the default context is plain BN, whatever the group size (fused kernel: equal
    # up to rounding).
    assert_close(layer(x, training=True), reference(x, training=True), rtol=1e-5)
    assert_close(layer.moving_mean.numpy(), reference.moving_mean.numpy(), rtol=1e-5)
    assert_close(layer(x, training=False), reference(x, training=False), rtol=1e-5)
    # Cross-replica context under a strategy: plain BN too.
    with strategy.scope():
        crbn = CrossReplicaBatchNormalization(group_size=4)
        crbn.build(x.shape)
        out = crbn(x, training=True)
    _, mean, _ = _numpy_bn(x, 1.0, 0.0)
    assert_close(crbn.moving_mean.numpy(), 0.01 * mean, rtol=1e-5)
    assert out.shape == x.shape
    # Inference in replica context uses the moving statistics, no collective.
    xs, _ = _replica_inputs()
    y = strategy.run(
        tf.function(lambda a: crbn(a, training=False)), args=(_per_replica(strategy, xs),)
    )
    mm, mv = crbn.moving_mean.numpy(), crbn.moving_variance.numpy()
    assert_close(
        strategy.experimental_local_results(y)[2], (xs[2] - mm) / np.sqrt(mv + 1e-3), rtol=1e-5
    )


def _bn_train_and_grads(layer, x, w):
    """Training output, moving statistics and gradients (x, gamma, beta) of sum(y * w)."""
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = layer(xt, training=True)
        loss = tf.reduce_sum(tf.cast(y, tf.float32) * w)
    grads = tape.gradient(loss, [xt, layer.gamma.value, layer.beta.value])
    return [np.asarray(t, np.float64) for t in [y, layer.moving_mean, layer.moving_variance]] + [
        g.numpy().astype(np.float64) for g in grads
    ]


def _op_types(fn, *args):
    return {op.type for op in tf.function(fn).get_concrete_function(*args).graph.get_operations()}


@pytest.mark.parametrize("shape", [(4, 3, 3, 4), (1, 1, 1, 4)])
def test_fused_path_matches_keras_bn_and_numpy(shape):
    """The fused kernel's output, gradients and (biased) moving variance equal Keras' BN."""
    rng = np.random.RandomState(3)
    x = rng.normal(2.0, 3.0, shape).astype(np.float32)
    w = rng.normal(0.0, 1.0, shape).astype(np.float32)
    results = {}
    for name, layer in [
        ("fused", CrossReplicaBatchNormalization(momentum=MOMENTUM, epsilon=EPS)),
        ("unfused", CrossReplicaBatchNormalization(momentum=MOMENTUM, epsilon=EPS, fused=False)),
        ("keras", keras.layers.BatchNormalization(momentum=MOMENTUM, epsilon=EPS)),
    ]:
        layer.build(shape)
        layer.gamma.assign(np.linspace(0.5, 1.5, shape[-1]).astype(np.float32))
        layer.beta.assign(np.linspace(-1.0, 1.0, shape[-1]).astype(np.float32))
        layer.moving_variance.assign(np.full(shape[-1], 2.0, np.float32))
        results[name] = _bn_train_and_grads(layer, x, w) + [
            layer(x, training=False).numpy().astype(np.float64)
        ]
    for got, want in zip(results["unfused"], results["keras"]):
        np.testing.assert_array_equal(got, want)  # fused=False is Keras' own code path
    for got, want in zip(results["fused"], results["keras"]):
        assert_close(got, want, rtol=1e-4)
    ref_y, mean, var = _numpy_bn(x, np.linspace(0.5, 1.5, shape[-1]), np.linspace(-1, 1, shape[-1]))
    assert_close(results["fused"][0], ref_y, rtol=1e-4)
    assert_close(results["fused"][1], (1 - MOMENTUM) * mean, rtol=1e-5)
    assert_close(results["fused"][2], MOMENTUM * 2.0 + (1 - MOMENTUM) * var, rtol=1e-5)


@pytest.mark.bfloat16
def test_fused_path_bf16_inputs_keep_fp32_statistics():
    x = np.random.RandomState(4).normal(1.0, 2.0, (8, 2, 2, 3)).astype(np.float32)
    layer = CrossReplicaBatchNormalization(momentum=MOMENTUM, epsilon=EPS, dtype="mixed_bfloat16")
    layer.build(x.shape)
    y = layer(tf.cast(x, tf.bfloat16), training=True)
    assert y.dtype == tf.bfloat16 and layer.moving_mean.dtype == "float32"
    ref_y, mean, _ = _numpy_bn(x, 1.0, 0.0)
    assert_close(tf.cast(y, tf.float32), ref_y, rtol=0.05)
    assert_close(layer.moving_mean.numpy(), (1 - MOMENTUM) * mean, rtol=0.02)


def test_float64_inputs_are_normalized_in_float64():
    """FusedBatchNormV3 has no fp64 kernel; the layer once cast fp64 inputs to fp32 for it, so a
    float64 model's BN (the float64 exactness tests of spatial partitioning) was rounded to
    fp32 (~1e-7 here). Keras' ops keep fp64: output and input gradient to 1e-12."""
    rng = np.random.RandomState(5)
    x = rng.normal(1.0, 2.0, (4, 3, 3, 5))
    w = rng.normal(0.0, 1.0, x.shape)
    layer = CrossReplicaBatchNormalization(momentum=MOMENTUM, epsilon=EPS, dtype="float64")
    layer.build(x.shape)
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = layer(xt, training=True)
        loss = tf.reduce_sum(y * w)
    dx = tape.gradient(loss, xt)
    assert y.dtype == tf.float64 and dx.dtype == tf.float64
    ref_y, mean, var = _numpy_bn(x, 1.0, 0.0)
    assert_close(y.numpy(), ref_y, rtol=1e-12)
    # BN's input gradient: (w - mean(w) - xhat mean(w xhat)) / sqrt(var + eps), means per channel.
    xhat, axes = (x - mean) / np.sqrt(var + EPS), (0, 1, 2)
    ref_dx = (w - w.mean(axes) - xhat * (w * xhat).mean(axes)) / np.sqrt(var + EPS)
    assert_close(dx.numpy(), ref_dx, rtol=1e-12)
    assert_close(layer.moving_variance.numpy(), MOMENTUM + (1 - MOMENTUM) * var, rtol=1e-12)


def test_fused_kernel_only_where_statistics_are_local(strategy):
    """group_size 1 (and inference) run FusedBatchNormV3; a group > 1 keeps its all-reduce."""
    x = tf.zeros((2, 3, 3, 4))
    local, grouped = _make_layer(strategy, 1), _make_layer(strategy, 2)
    masked = CrossReplicaBatchNormalization()
    masked.build((None, 3, 4))

    def replica_types(layer, training):
        return _op_types(lambda a: strategy.run(lambda b: layer(b, training=training), (a,)), x)

    assert "FusedBatchNormV3" in replica_types(local, True)
    assert "FusedBatchNormV3" in replica_types(grouped, False)
    assert "FusedBatchNormV3" not in replica_types(grouped, True)
    unfused = CrossReplicaBatchNormalization(fused=False)
    assert "FusedBatchNormV3" not in _op_types(lambda a: unfused(a, training=True), x)
    mask = tf.ones((2, 3))
    assert "FusedBatchNormV3" not in _op_types(
        lambda a, m: masked(a, training=True, mask=m), tf.zeros((2, 3, 4)), mask
    )


def test_same_variables_checkpoint_and_config_as_keras_bn(tmp_path):
    reference = keras.layers.BatchNormalization(momentum=0.9, name="bn")
    reference.build((None, 4))
    for i, v in enumerate(reference.weights):
        v.assign(np.full(4, i + 1.5, np.float32))
    layer = CrossReplicaBatchNormalization(group_size=2, momentum=0.9, name="bn")
    layer.build((None, 4))
    assert [v.path for v in layer.weights] == [v.path for v in reference.weights]
    assert [v.name for v in layer.weights] == ["gamma", "beta", "moving_mean", "moving_variance"]
    path = tf.train.Checkpoint(layer=reference).write(str(tmp_path / "ckpt"))
    tf.train.Checkpoint(layer=layer).read(path).assert_consumed()
    for got, want in zip(layer.weights, reference.weights):
        np.testing.assert_array_equal(got.numpy(), want.numpy())

    positional = CrossReplicaBatchNormalization(
        1, 0.5, group_size=2
    )  # Keras' order: axis, momentum
    assert (positional.axis, positional.momentum, positional.group_size) == (1, 0.5, 2)

    config = layer.get_config()
    assert config["group_size"] == 2 and config["fused"] is True
    assert config["collective_timeout_s"] == 0.0
    assert set(reference.get_config()) <= set(config)
    clone = keras.layers.deserialize(keras.layers.serialize(layer))
    assert isinstance(clone, CrossReplicaBatchNormalization) and clone.group_size == 2
    assert clone.momentum == 0.9


def test_compiles_under_xla_single_device():
    layer = CrossReplicaBatchNormalization(group_size=2)
    layer.build((None, 3, 3, 4))
    x = tf.constant(np.random.RandomState(2).normal(1.0, 2.0, (4, 3, 3, 4)).astype(np.float32))

    @tf.function(jit_compile=True)
    def step(xx):
        with tf.GradientTape() as tape:
            tape.watch(xx)
            y = layer(xx, training=True)
        return y, tape.gradient(tf.reduce_sum(y * y), [xx, layer.gamma.value])

    assert "ENTRY" in step.experimental_get_compiler_ir(x)(stage="hlo")  # XLA compiled it
    y, _ = step(x)
    ref_y, mean, _ = _numpy_bn(x.numpy(), 1.0, 0.0)
    assert_close(y, ref_y, rtol=1e-4)
    assert_close(layer.moving_mean.numpy(), 0.01 * mean, rtol=1e-5)


def test_grouped_statistics_compile_under_xla():
    """The grouped path as TPU replicas run it (tensor replica ids), compiled by XLA.

    XLA has no collectives on the CPU, so the all-reduce is simulated inside one compiled
    function: a first pass collects every replica's table, a second gives each replica their sum.
    """
    x, _ = _replica_inputs(seed=9)
    group_size = 2

    def moments(xs, r, all_reduce):
        group_sum = table_group_sum(
            all_reduce, group_size=group_size, replica_id=tf.constant(r), num_replicas=REPLICAS
        )
        return group_moments(
            xs[r], axis=-1, group_sum=group_sum, rank=r % group_size, group_size=group_size
        )

    @tf.function(jit_compile=True)
    def simulated(xs):
        tables = []
        for r in range(REPLICAS):
            moments(xs, r, lambda t: tables.append(t) or t)
        total = tf.add_n(tables)  # [G, 3, C]: what the all-reduce returns to every replica
        return [moments(xs, r, lambda t: total) for r in range(REPLICAS)]

    assert "ENTRY" in simulated.experimental_get_compiler_ir(tf.constant(x))(stage="hlo")
    for r, (mean, var) in enumerate(simulated(tf.constant(x))):
        g = r // group_size
        group_batch = x[g * group_size : (g + 1) * group_size].reshape((-1,) + SHAPE[1:])
        _, ref_mean, ref_var = _numpy_bn(group_batch, 1.0, 0.0)
        assert_close(mean, ref_mean, rtol=1e-5)
        assert_close(var, ref_var, rtol=1e-5)


def test_multi_worker_mirrored_group_spans_both_workers(tmp_path):
    """Two MultiWorkerMirroredStrategy workers on 127.0.0.1, one CPU replica each, group size 2."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in processes.free_ports(2)]}
    procs, logs = [], []
    try:
        for index in range(2):
            tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
            logs.append(str(tmp_path / f"worker{index}.log"))
            args = [
                "-m",
                "tests.mlperf_tf.layers.mwms_worker",
                str(tmp_path / f"worker{index}.npz"),
            ]
            procs.append(processes.start(args, logs[-1], TF_CONFIG=tf_config))
        deadline = time.monotonic() + MWMS_TIMEOUT_S
        for proc, log in zip(procs, logs):
            code = processes.wait(proc, max(1.0, deadline - time.monotonic()), log)
            with open(log, encoding="utf-8", errors="replace") as f:
                assert code == 0, f.read()[-3000:]
    finally:
        for proc in procs:
            processes.kill(proc)

    results = [np.load(tmp_path / f"worker{index}.npz") for index in range(2)]
    xs, ws = zip(*(mwms_worker.replica_data(r) for r in range(2)))
    group_batch = np.concatenate(xs)  # replicas 0 and 1 form one group across the two workers
    ref_y, mean, var = _numpy_bn(group_batch, 1.0, 0.0)
    ref_grad = _keras_input_grad(group_batch, np.concatenate(ws), np.ones(5, "f"), np.zeros(5, "f"))
    n = mwms_worker.SHAPE[0]
    momentum = mwms_worker.MOMENTUM
    for index, result in enumerate(results):
        assert int(result["num_replicas"]) == 2 and int(result["replica_id"]) == index
        rows = slice(index * n, (index + 1) * n)
        assert_close(result["y"], ref_y[rows], rtol=1e-5)
        assert_close(result["grad"], ref_grad[rows], rtol=1e-4)
        assert_close(result["moving_mean"], (1 - momentum) * mean, rtol=1e-5)
        assert_close(result["moving_variance"], momentum + (1 - momentum) * var, rtol=1e-5)


def test_model_bn_span():
    assert model_bn_span(32, 1) == 32
    assert model_bn_span(32, 4) == 128
    for bad in [(0, 2), (32, 0), (32, 2.0), (-8, 1), (True, 2)]:
        with pytest.raises(ConfigError, match="must be a positive integer"):
            model_bn_span(*bad)
