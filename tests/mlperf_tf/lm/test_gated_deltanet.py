"""Tests of `mlperf_tf.lm.GatedDeltaNet`: the chunked form against the token-at-a-time recurrence
(written in NumPy here from the paper's update), the whole layer against keras-hub's
`Qwen3_5GatedDeltaNet` (a port of Hugging Face's) with the same weights in its training path and
its cached decoding, and decoding through our cache (prefill then one token at a time) against
the whole-sequence forward; the parameter count from the shape against the built layer."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.lm import gated_deltanet
from mlperf_tf.lm.gated_deltanet import GatedDeltaNet
from tests.numerics import assert_close

pytestmark = pytest.mark.numerics

SHAPE = dict(hidden_size=24, num_key_heads=2, num_value_heads=4, key_head_dim=8, value_head_dim=6)


def np_gated_delta_rule(q, k, v, g, beta):
    """The paper's recurrence, one token at a time, float64: q, k [B, T, H, dk]."""
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / np.sqrt(q.shape[-1])
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    b, t, h, dk = q.shape
    state = np.zeros((b, h, dk, v.shape[-1]))
    out = np.zeros(v.shape)
    for i in range(t):
        state = state * np.exp(g[:, i])[..., None, None]
        memory = np.einsum("bhkv,bhk->bhv", state, k[:, i])
        delta = (v[:, i] - memory) * beta[:, i, :, None]
        state = state + np.einsum("bhk,bhv->bhkv", k[:, i], delta)
        out[:, i] = np.einsum("bhkv,bhk->bhv", state, q[:, i])
    return out, state


def _core_inputs(seed, length=11, heads=3, dk=4, dv=5):
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=(2, 2, length, heads, dk))
    v = rng.normal(size=(2, length, heads, dv))
    g = -rng.uniform(0.01, 1.0, size=(2, length, heads))
    beta = rng.uniform(0.1, 0.9, size=(2, length, heads))
    return q, k, v, g, beta


@pytest.mark.parametrize("chunk_size", [1, 4, 16])
def test_chunked_and_recurrent_forms_equal_the_recurrence(chunk_size):
    inputs = _core_inputs(1)
    want, want_state = np_gated_delta_rule(*inputs)
    out, state = gated_deltanet.chunked_gated_delta_rule(*inputs, chunk_size=chunk_size)
    assert_close(out.numpy(), want, rtol=1e-5)
    assert_close(state.numpy(), want_state, rtol=1e-5)
    out, state = gated_deltanet.recurrent_gated_delta_rule(*inputs)
    assert_close(out.numpy(), want, rtol=1e-5)
    assert_close(state.numpy(), want_state, rtol=1e-5)


def test_chunked_form_continues_from_a_state():
    q, k, v, g, beta = _core_inputs(2, length=9)
    want, _ = np_gated_delta_rule(q, k, v, g, beta)
    _, state = gated_deltanet.chunked_gated_delta_rule(
        q[:, :5], k[:, :5], v[:, :5], g[:, :5], beta[:, :5], chunk_size=4
    )
    out, _ = gated_deltanet.chunked_gated_delta_rule(
        q[:, 5:], k[:, 5:], v[:, 5:], g[:, 5:], beta[:, 5:], chunk_size=4, initial_state=state
    )
    assert_close(out.numpy(), want[:, 5:], rtol=1e-5)


def _layer(chunk_size=4):
    keras.utils.set_random_seed(5)
    layer = GatedDeltaNet(**SHAPE, chunk_size=chunk_size, stddev=0.3)
    layer.build((None, None, SHAPE["hidden_size"]))
    rng = np.random.default_rng(6)  # scales away from 1 so the test sees them
    layer.norm.scale.assign(rng.uniform(0.5, 1.5, size=layer.norm.scale.shape))
    layer.dt_bias.assign(rng.normal(size=layer.dt_bias.shape))
    return layer


def _hub_layer(ours):
    from keras_hub.src.models.qwen3_5.qwen3_5_gated_delta_net import Qwen3_5GatedDeltaNet

    hub = Qwen3_5GatedDeltaNet(
        hidden_size=SHAPE["hidden_size"], linear_num_key_heads=SHAPE["num_key_heads"],
        linear_num_value_heads=SHAPE["num_value_heads"],
        linear_key_head_dim=SHAPE["key_head_dim"],
        linear_value_head_dim=SHAPE["value_head_dim"], linear_conv_kernel_dim=4,
    )  # fmt: skip
    hub.build((None, None, SHAPE["hidden_size"]))
    for name in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"):
        getattr(hub, name).kernel.assign(getattr(ours, name).kernel.numpy())
    hub.conv1d_weight.assign(ours.conv_kernel.numpy())
    hub.dt_bias.assign(ours.dt_bias.numpy())
    hub.A_log.assign(ours.A_log.numpy())
    hub.norm.scale.assign(ours.norm.scale.numpy())
    return hub


def test_layer_matches_keras_hub_training_and_decoding():
    pytest.importorskip("keras_hub")  # a peer (the `peers` extra)
    ours = _layer()
    hub = _hub_layer(ours)
    x = np.random.default_rng(7).normal(size=(2, 10, SHAPE["hidden_size"])).astype(np.float32)
    want = hub(x).numpy()  # its chunked path (chunks of 64)
    assert_close(ours(x).numpy(), want, rtol=2e-5)
    # keras-hub's cached decoding: a prefill of 6, then 4 single tokens.
    conv_dim = ours.conv_dim
    hub_cache = (
        np.zeros((2, conv_dim, 3), np.float32),
        np.zeros((2, SHAPE["num_value_heads"], SHAPE["key_head_dim"], SHAPE["value_head_dim"]),
                 np.float32),
    )  # fmt: skip
    hub_out, hub_cache = hub(x[:, :6], cache=hub_cache)
    steps = [hub_out.numpy()]
    for t in range(6, 10):
        out, hub_cache = hub(x[:, t : t + 1], cache=hub_cache)
        steps.append(out.numpy())
    assert_close(np.concatenate(steps, axis=1), want, rtol=2e-5)


def test_our_cached_decoding_equals_the_forward():
    ours = _layer(chunk_size=3)
    x = np.random.default_rng(8).normal(size=(2, 9, SHAPE["hidden_size"])).astype(np.float32)
    want = ours(x).numpy()
    out, cache = ours(x[:, :5], cache=ours.empty_cache(2))
    steps = [out.numpy()]
    for t in range(5, 9):
        out, cache = ours(x[:, t : t + 1], cache=cache)
        steps.append(out.numpy())
    assert_close(np.concatenate(steps, axis=1), want, rtol=2e-5)


def test_gradients_flow_through_the_chunked_form():
    ours = _layer()
    x = tf.constant(np.random.default_rng(9).normal(size=(1, 7, SHAPE["hidden_size"])), tf.float32)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(ours(x) ** 2)
    grads = tape.gradient(loss, ours.trainable_variables)
    assert all(gr is not None and np.isfinite(gr.numpy()).all() for gr in grads)
    assert all(np.abs(gr.numpy()).max() > 0 for gr in grads)


def test_parameter_count_from_the_shape():
    ours = _layer()
    built = sum(int(np.prod(w.shape)) for w in ours.weights)
    assert GatedDeltaNet.parameter_count(**SHAPE) == built
