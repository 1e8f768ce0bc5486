"""Tests of the GPT-OSS model at tiny shapes: parameter counts against a built model, the window
pattern, top-k-then-softmax routing, the sorted dropless dispatch against the capacity buffers,
and the whole model against a NumPy transcription of the reference's formulas (Megatron's GPT
with QK-norm, sliding windows and a dropless top-k-then-softmax MoE)."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from benchmarks.gpt_oss_20b import config as config_lib
from benchmarks.gpt_oss_20b import model as model_lib
from mlperf_tf.layers import moe
from tests.numerics import assert_close


def _model(config=None, seed=0):
    keras.utils.set_random_seed(seed)
    return model_lib.build_model(config or config_lib.tiny())


def _count(model) -> int:
    return sum(int(np.prod(v.shape)) for v in model.weights)


@pytest.mark.parametrize("qk_norm, tie", [(True, False), (False, False), (True, True)])
def test_parameter_counts_from_the_config_equal_the_built_model(qk_norm, tie):
    config = dataclasses.replace(config_lib.tiny(), qk_norm=qk_norm, tie_word_embeddings=tie)
    model = _model(config)
    assert config.parameter_count() == _count(model)
    m = config.moe
    per_expert = 3 * config.hidden_size * m.filter_size
    idle = config.num_hidden_layers * (m.num_experts - m.top_k) * per_expert
    assert config.active_parameter_count() == _count(model) - idle
    expert_weights = sum(
        int(np.prod(w.shape)) for layer in model.moe_layers for w in layer.expert_weights
    )
    assert expert_weights == config.num_hidden_layers * m.num_experts * per_expert


def test_the_built_layers_are_windowed_as_megatron_picks():
    config = dataclasses.replace(config_lib.tiny(), num_hidden_layers=4)
    model = _model(config)
    windows = [layer.attention.sliding_window for layer in model.decoder_layers]
    reference = [config_lib.is_window_layer([1, 0, 1, 0], n) for n in range(1, 5)]
    assert windows == [5, 0, 5, 0] and [bool(w) for w in windows] == reference


def test_routing_is_top_k_on_the_logits_then_a_softmax_over_the_k():
    logits = tf.constant([[3.0, 1.0, 2.0, -1.0], [0.0, 0.5, -2.0, 4.0]])
    routing = moe.route(logits, top_k=2, capacity=2, router_softmax="after")
    np.testing.assert_array_equal(routing.expert, [[0, 2], [3, 1]])
    want = np.exp([[3.0, 2.0], [4.0, 0.5]])
    want /= want.sum(-1, keepdims=True)
    assert_close(routing.gates, want, rtol=1e-6)
    assert bool(tf.reduce_all(routing.kept))  # dropless: capacity = tokens


def test_sorted_dispatch_equals_the_capacity_buffers_in_the_model():
    config = config_lib.tiny()
    buffered = dataclasses.replace(config, moe=dataclasses.replace(config.moe, dispatch="buffer"))
    ours, theirs = _model(config), _model(buffered)
    assert type(ours.moe_layers[0]) is moe.SortedMoEFeedForward
    assert type(theirs.moe_layers[0]) is moe.MoEFeedForward
    for a, b in zip(ours.weights, theirs.weights, strict=True):
        b.assign(a)
    ids = tf.random.stateless_uniform([2, 16], [3, 4], 0, 128, tf.int32)
    with tf.GradientTape(persistent=True) as tape:
        a = ours(ids, training=True)
        b = theirs(ids, training=True)
        la, lb = tf.reduce_sum(tf.square(a)), tf.reduce_sum(tf.square(b))
    assert_close(a, b, rtol=1e-5)
    for ga, gb in zip(tape.gradient(la, ours.weights), tape.gradient(lb, theirs.weights),
                      strict=True):  # fmt: skip
        assert_close(tf.convert_to_tensor(ga), tf.convert_to_tensor(gb), rtol=1e-5)


# ---- the reference's formulas in NumPy ------------------------------------------------------------


def _rms(x, scale, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def _rope(x, theta):
    """Megatron's non-interleaved RoPE on x [seq, heads, d]: pairs (i, i + d/2)."""
    seq, _, d = x.shape
    inv = theta ** (-np.arange(0, d, 2) / d)
    angles = np.arange(seq)[:, None] * inv[None, :]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _attention(x, w, c, window):
    """GQA over one sequence x [seq, h]; query head i uses kv head i // (heads / kv_heads);
    key j is visible to query i when j <= i and i - j <= window - 1 (Megatron (W - 1, 0))."""
    seq, d = x.shape[0], c.head_dim
    q = (x @ w["q"]).reshape(seq, c.num_attention_heads, d)
    k = (x @ w["k"]).reshape(seq, c.num_key_value_heads, d)
    v = (x @ w["v"]).reshape(seq, c.num_key_value_heads, d)
    q, k = _rms(q, w["q_norm"], c.rms_norm_eps), _rms(k, w["k_norm"], c.rms_norm_eps)
    q, k = _rope(q, c.rope_theta), _rope(k, c.rope_theta)
    group = c.num_attention_heads // c.num_key_value_heads
    i, j = np.arange(seq)[:, None], np.arange(seq)[None, :]
    visible = (j <= i) & ((i - j < window) if window else True)
    out = np.zeros((seq, c.num_attention_heads, d))
    for head in range(c.num_attention_heads):
        scores = q[:, head] @ k[:, head // group].T / np.sqrt(d)
        scores = np.where(visible, scores, -np.inf)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        out[:, head] = (p / p.sum(-1, keepdims=True)) @ v[:, head // group]
    return out.reshape(seq, -1) @ w["o"]


def _moe(x, w, c):
    """Dropless: each token's top-k logits, a softmax over them, the gate-weighted SwiGLU
    experts (silu(x W_gate) * x W_up) W_down, no bias."""
    logits = x @ w["router"]
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        top = np.argsort(-logits[t], kind="stable")[: c.moe.top_k]
        gates = np.exp(logits[t, top] - logits[t, top].max())
        gates /= gates.sum()
        for e, g in zip(top, gates, strict=True):
            gate = x[t] @ w["gate"][e]
            hidden = gate / (1 + np.exp(-gate)) * (x[t] @ w["up"][e])
            out[t] += g * hidden @ w["down"][e]
    return out


def _numpy_logits(model, ids, c):
    x = model.token_embedding.embeddings.numpy().astype(np.float64)[ids]
    for index, layer in enumerate(model.decoder_layers):
        a, m = layer.attention, layer.mlp
        w = {
            "q": a.q_proj.kernel.numpy(), "k": a.k_proj.kernel.numpy(),
            "v": a.v_proj.kernel.numpy(), "o": a.o_proj.kernel.numpy(),
            "q_norm": a.q_norm.scale.numpy(), "k_norm": a.k_norm.scale.numpy(),
            "router": m.router_kernel.numpy(), "gate": m.w_gate.numpy(),
            "up": m.w_up.numpy(), "down": m.w_down.numpy(),
        }  # fmt: skip
        w = {k: v.astype(np.float64) for k, v in w.items()}
        h = _rms(x, layer.attention_norm.scale.numpy(), c.rms_norm_eps)
        x = x + _attention(h, w, c, c.layer_window(index))
        x = x + _moe(_rms(x, layer.mlp_norm.scale.numpy(), c.rms_norm_eps), w, c)
    x = _rms(x, model.final_norm.scale.numpy(), c.rms_norm_eps)
    return x @ model.lm_head.kernel.numpy()


def test_the_model_equals_a_numpy_transcription_of_the_references_formulas():
    c = dataclasses.replace(config_lib.tiny(), num_hidden_layers=3, rope_theta=10.0)
    model = _model(c, seed=1)
    # Non-trivial norm scales, so that a missing or misplaced norm shows.
    rng = np.random.default_rng(0)
    for v in model.weights:
        if v.path.endswith("scale"):
            v.assign(rng.uniform(0.5, 1.5, v.shape).astype(np.float32))
    ids = np.random.default_rng(1).integers(0, c.vocab_size, 12)
    got = model(tf.constant(ids[None]), training=False)[0].numpy()
    want = _numpy_logits(model, ids, c)
    assert_close(got, want, rtol=2e-5)
