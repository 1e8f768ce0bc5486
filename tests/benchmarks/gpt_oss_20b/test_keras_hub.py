"""The GPT-OSS model against keras-hub's `GptOssBackbone` pieces at a tiny configuration, with
the same weights, where keras-hub's model can be made to compute the reference's formulas:
attention with its sinks and biases neutralized and RoPE at scaling factor 1, and the router's
choice and weights. What cannot be neutralized (QK-norm is absent in keras-hub, its experts are
the clamped SwiGLU with biases, its windowed layers are the odd ones) is listed in README.md and
the last test pins the window parity."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from benchmarks.gpt_oss_20b import config as config_lib
from benchmarks.gpt_oss_20b import model as model_lib
from mlperf_tf.layers import moe
from tests.numerics import assert_close

pytestmark = pytest.mark.peers
keras_hub = pytest.importorskip("keras_hub")
from keras_hub.src.models.gpt_oss import gpt_oss_decoder  # noqa: E402
from keras_hub.src.models.gpt_oss.gpt_oss_attention import GptOssAttention  # noqa: E402


def _model(**changes):
    keras.utils.set_random_seed(0)
    return model_lib.build_model(dataclasses.replace(config_lib.tiny(), **changes))


def test_attention_equals_keras_hubs_with_sinks_and_biases_neutralized():
    """Layer 0 (windowed: 5 keys, Megatron's (4, 0)) without QK-norm (keras-hub has none) against
    `GptOssAttention(sliding_window=4)`: zero biases, sink logits of -1e30 (their softmax share
    is exactly 0), RoPE at scaling factor 1 (YaRN's ramp and temperature off)."""
    model = _model(qk_norm=False, rope_theta=150_000.0)
    c, ours = model.config, model.decoder_layers[0].attention
    h, heads, kv, d = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    assert ours.sliding_window == 5
    hub = GptOssAttention(
        num_query_heads=heads, num_key_value_heads=kv, rope_max_wavelength=c.rope_theta,
        rope_scaling_factor=1.0, sliding_window=ours.sliding_window - 1, head_dim=d,
        dtype="float32",
    )  # fmt: skip
    hub.build((None, None, h))
    hub.query_dense.kernel.assign(ours.q_proj.kernel.numpy().reshape(h, heads, d))
    hub.key_dense.kernel.assign(ours.k_proj.kernel.numpy().reshape(h, kv, d))
    hub.value_dense.kernel.assign(ours.v_proj.kernel.numpy().reshape(h, kv, d))
    hub.output_dense.kernel.assign(ours.o_proj.kernel.numpy().reshape(heads, d, h))
    for bias in (hub.query_dense.bias, hub.key_dense.bias, hub.value_dense.bias,
                 hub.output_dense.bias):  # fmt: skip
        bias.assign(tf.zeros_like(bias))
    hub.sinks.assign(tf.fill([heads], -1e30))
    seq = 12
    x = tf.constant(np.random.default_rng(2).normal(size=(2, seq, h)), tf.float32)
    cos, sin = model.rotary_tables(seq)
    causal = tf.broadcast_to(
        tf.linalg.band_part(tf.ones([seq, seq], tf.bool), -1, 0), [2, seq, seq]
    )
    got, want = ours(x, cos, sin), hub(x, attention_mask=causal)
    assert_close(got, want, rtol=1e-5)
    # The window matters at this length: full attention differs.
    full = _model(qk_norm=False, rope_theta=150_000.0).decoder_layers[1].attention
    for a, b in zip(full.weights, ours.weights, strict=True):
        a.assign(b)
    gap = float(tf.reduce_max(tf.abs(full(x, cos, sin) - want)))
    assert gap > 0.05 * float(tf.reduce_max(tf.abs(want)))


def test_router_choice_and_weights_equal_keras_hubs():
    """The MoE layer's router of the built model against `GptOssTopKRouter` (its Dense bias at
    0): the same experts and, to float32 rounding, the same softmax-over-top-k weights."""
    model = _model()
    layer = model.moe_layers[0]
    c = model.config
    hub = gpt_oss_decoder.GptOssTopKRouter(
        num_experts=c.moe.num_experts, top_k=c.moe.top_k, dtype="float32"
    )
    hub.build((None, c.hidden_size))
    hub.router_dense.kernel.assign(layer.router_kernel)
    hub.router_dense.bias.assign(tf.zeros_like(hub.router_dense.bias))
    x = tf.constant(np.random.default_rng(3).normal(size=(64, c.hidden_size)), tf.float32)
    routing = moe.route(
        layer.router_logits(x, training=False), top_k=c.moe.top_k, capacity=64,
        router_softmax=c.moe.router_softmax,
    )  # fmt: skip
    ours = np.zeros((64, c.moe.num_experts), np.float32)
    np.put_along_axis(ours, routing.expert.numpy(), routing.gates.numpy(), axis=1)
    theirs = hub(x).numpy()
    np.testing.assert_array_equal(ours > 0, theirs > 0)  # the same choices
    assert_close(ours, theirs, rtol=1e-6)


def test_keras_hubs_backbone_windows_the_odd_layers_the_reference_the_even_ones():
    hub = keras_hub.models.GptOssBackbone(
        vocabulary_size=32, num_layers=4, num_query_heads=4, hidden_dim=16, intermediate_dim=16,
        num_key_value_heads=2, num_experts=2, top_k=1, sliding_window=4, dtype="float32",
    )  # fmt: skip
    hub_windowed = [bool(layer.sliding_window) for layer in hub.transformer_layers]
    ours = dataclasses.replace(config_lib.tiny(), num_hidden_layers=4)
    windowed = [bool(ours.layer_window(i)) for i in range(4)]
    assert windowed == [True, False, True, False]
    assert hub_windowed == [False, True, False, True]
