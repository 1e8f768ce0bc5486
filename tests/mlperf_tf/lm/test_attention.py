"""Tests of `mlperf_tf.lm.Attention`'s options against references: a NumPy transcription of
grouped-query attention with every option (biases, QK-norm, sliding window, sinks), the fused
q/k/v projection against the separate ones, and keras-hub's `GptOssAttention` (sinks, biases,
YaRN, its sliding window) with the same weights; the core `attend` with the Transformer's and
BERT's options (a key-padding mask, an additive bias, a float32 scale, dropout, cross-attention
lengths) against NumPy."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.lm import Attention, RotaryEmbedding, attend, fuse_qkv, multi_head_attend, split_qkv
from tests.numerics import assert_close

pytestmark = pytest.mark.numerics

H, KV, D, HIDDEN = 4, 2, 8, 24


def _layer(**options):
    keras.utils.set_random_seed(3)
    layer = Attention(
        hidden_size=HIDDEN, num_heads=H, num_kv_heads=KV, head_dim=D, stddev=0.3,
        output_stddev=0.3, norm_epsilon=1e-5, **options,
    )  # fmt: skip
    layer.build((None, None, HIDDEN))
    rng = np.random.default_rng(4)
    for v in layer.weights:  # biases, norm scales and sinks away from their initial 0 / 1
        if len(v.shape) == 1:
            v.assign(rng.normal(1.0 if v.path.endswith("scale") else 0.0, 0.5, v.shape))
    return layer


def _rope(seq):
    rope = RotaryEmbedding(D, theta=100.0)
    cos, sin = rope.tables(seq)
    return rope, cos, sin


def _rotate(x, inv, seq):
    """x [seq, d] rotated pairs (i, i + d/2) by position (the Hugging Face layout)."""
    angles = np.arange(seq)[:, None] * inv[None, :]
    cos, sin = np.cos(angles), np.sin(angles)
    x1, x2 = x[:, : D // 2], x[:, D // 2 :]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _reference(x, weights, *, inv, window=0, qk_norm=False, sinks=None, eps=1e-5):
    """Grouped-query causal attention of one sequence x [seq, hidden], head by head (float64)."""
    seq = x.shape[0]
    q = x @ weights["q"] + weights.get("bq", 0)
    k = x @ weights["k"] + weights.get("bk", 0)
    v = x @ weights["v"] + weights.get("bv", 0)
    heads = []
    for h in range(H):
        g = h // (H // KV)  # the key/value head of query head h
        qh, kh, vh = q[:, h * D : (h + 1) * D], k[:, g * D : (g + 1) * D], v[:, g * D : (g + 1) * D]
        if qk_norm:
            qh = qh / np.sqrt(np.mean(qh**2, -1, keepdims=True) + eps) * weights["q_scale"]
            kh = kh / np.sqrt(np.mean(kh**2, -1, keepdims=True) + eps) * weights["k_scale"]
        qh, kh = _rotate(qh, inv, seq), _rotate(kh, inv, seq)
        scores = qh @ kh.T / math.sqrt(D)
        i, j = np.arange(seq)[:, None], np.arange(seq)[None, :]
        visible = (j <= i) & ((i - j < window) if window else True)
        scores = np.where(visible, scores, -np.inf)
        if sinks is not None:
            scores = np.concatenate([scores, np.full((seq, 1), sinks[h])], axis=1)
        probs = np.exp(scores - scores.max(1, keepdims=True))
        probs = probs / probs.sum(1, keepdims=True)
        heads.append(probs[:, :seq] @ vh)
    return np.concatenate(heads, axis=1) @ weights["o"] + weights.get("bo", 0)


def _weights(layer):
    w = {}
    if layer.fused_qkv:
        kernel = layer.qkv_proj.kernel.numpy().astype(np.float64)
        w["q"], w["k"], w["v"] = split_qkv(kernel, num_heads=H, num_kv_heads=KV, head_dim=D)
        if layer.qkv_proj.use_bias:
            bias = layer.qkv_proj.bias.numpy().astype(np.float64)
            w["bq"], w["bk"], w["bv"] = split_qkv(bias, num_heads=H, num_kv_heads=KV, head_dim=D)
    else:
        for name in "qkv":
            proj = getattr(layer, f"{name}_proj")
            w[name] = proj.kernel.numpy().astype(np.float64)
            if proj.use_bias:
                w[f"b{name}"] = proj.bias.numpy().astype(np.float64)
    w["o"] = layer.o_proj.kernel.numpy().astype(np.float64)
    if layer.o_proj.use_bias:
        w["bo"] = layer.o_proj.bias.numpy().astype(np.float64)
    if layer.qk_norm:
        w["q_scale"] = layer.q_norm.scale.numpy().astype(np.float64)
        w["k_scale"] = layer.k_norm.scale.numpy().astype(np.float64)
    return w


OPTIONS = {
    "plain": {},
    "bias": {"use_bias": True},
    "qk_norm": {"qk_norm": True},
    "window": {"sliding_window": 3},
    "sinks": {"sinks": True},
    "fused_all": {
        "fused_qkv": True, "use_bias": True, "qk_norm": True, "sliding_window": 4, "sinks": True
    },
}  # fmt: skip


@pytest.mark.parametrize("name", list(OPTIONS))
def test_attention_equals_the_numpy_transcription(name):
    options = OPTIONS[name]
    layer = _layer(**options)
    seq = 10
    rope, cos, sin = _rope(seq)
    x = np.random.default_rng(5).normal(size=(2, seq, HIDDEN)).astype(np.float32)
    got = layer(tf.constant(x), cos, sin).numpy()
    w = _weights(layer)
    sinks = layer.sinks.numpy().astype(np.float64) if layer.use_sinks else None
    for b in range(2):
        expected = _reference(
            x[b].astype(np.float64), w, inv=rope.inverse_frequencies,
            window=options.get("sliding_window", 0), qk_norm=layer.qk_norm, sinks=sinks,
        )  # fmt: skip
        assert_close(got[b], expected, rtol=1e-5)


def test_each_option_changes_the_output():
    """The options are not no-ops at these shapes (so the transcription tests test them)."""
    seq = 10
    _, cos, sin = _rope(seq)
    x = tf.constant(np.random.default_rng(6).normal(size=(1, seq, HIDDEN)), tf.float32)
    plain = _layer()(x, cos, sin).numpy()
    for name in ("qk_norm", "window", "sinks"):
        other = _layer(**OPTIONS[name])(x, cos, sin).numpy()
        assert np.max(np.abs(other - plain)) > 1e-3, name
    # A window of the whole sequence is full causal attention.
    assert_close(_layer(sliding_window=seq)(x, cos, sin), plain, rtol=1e-6)


def test_fused_qkv_equals_separate_projections_with_the_same_weights():
    separate = _layer(use_bias=True)
    fused = _layer(use_bias=True, fused_qkv=True)
    kernels = [getattr(separate, f"{n}_proj").kernel.numpy() for n in "qkv"]
    biases = [getattr(separate, f"{n}_proj").bias.numpy() for n in "qkv"]
    fused.qkv_proj.kernel.assign(fuse_qkv(*kernels, num_kv_heads=KV, head_dim=D))
    fused.qkv_proj.bias.assign(fuse_qkv(*biases, num_kv_heads=KV, head_dim=D))
    fused.o_proj.kernel.assign(separate.o_proj.kernel)
    fused.o_proj.bias.assign(separate.o_proj.bias)
    _, cos, sin = _rope(7)
    x = tf.constant(np.random.default_rng(7).normal(size=(2, 7, HIDDEN)), tf.float32)
    assert_close(fused(x, cos, sin), separate(x, cos, sin), rtol=1e-6)
    assert fused.qkv_proj.kernel.shape == (HIDDEN, (H + 2 * KV) * D)
    # Megatron's grouped order: [kv, group + 2, d] along the output axis.
    grouped = fuse_qkv(*kernels, num_kv_heads=KV, head_dim=D).reshape(HIDDEN, KV, H // KV + 2, D)
    assert_close(grouped[:, 1, -2], kernels[1][:, D:], rtol=0)  # key head 1
    back = split_qkv(fused.qkv_proj.kernel.numpy(), num_heads=H, num_kv_heads=KV, head_dim=D)
    for a, b in zip(back, kernels, strict=True):
        assert_close(a, b, rtol=0)


@pytest.mark.peers
def test_sinks_biases_yarn_and_window_equal_keras_hub_gpt_oss_attention():
    """keras-hub's `GptOssAttention` (sinks, biases, YaRN with its fixed betas 32/1 and original
    context 4,096, `sliding_window=w` seeing w + 1 keys) with our weights. Its mask argument is
    the causal mask (it applies only the window itself)."""
    keras_hub = pytest.importorskip("keras_hub")
    from keras_hub.src.models.gpt_oss.gpt_oss_attention import GptOssAttention  # noqa: PLC0415

    w, seq, factor = 4, 12, 32.0
    layer = _layer(use_bias=True, sinks=True, sliding_window=w + 1)
    hub = GptOssAttention(
        num_query_heads=H, num_key_value_heads=KV, rope_max_wavelength=150_000.0,
        rope_scaling_factor=factor, sliding_window=w, head_dim=D, dtype="float32",
    )  # fmt: skip
    hub.build((None, None, HIDDEN))
    hub.query_dense.kernel.assign(layer.q_proj.kernel.numpy().reshape(HIDDEN, H, D))
    hub.query_dense.bias.assign(layer.q_proj.bias.numpy().reshape(H, D))
    hub.key_dense.kernel.assign(layer.k_proj.kernel.numpy().reshape(HIDDEN, KV, D))
    hub.key_dense.bias.assign(layer.k_proj.bias.numpy().reshape(KV, D))
    hub.value_dense.kernel.assign(layer.v_proj.kernel.numpy().reshape(HIDDEN, KV, D))
    hub.value_dense.bias.assign(layer.v_proj.bias.numpy().reshape(KV, D))
    hub.output_dense.kernel.assign(layer.o_proj.kernel.numpy().reshape(H, D, HIDDEN))
    hub.output_dense.bias.assign(layer.o_proj.bias.numpy())
    hub.sinks.assign(layer.sinks.numpy())
    rope = RotaryEmbedding(
        D, theta=150_000.0, rope_type="yarn", scaling_factor=factor, original_max_position=4096,
        truncate=False,
    )  # fmt: skip
    assert rope.attention_factor > 1
    cos, sin = rope.tables(seq)
    x = tf.constant(np.random.default_rng(8).normal(size=(2, seq, HIDDEN)), tf.float32)
    causal = tf.broadcast_to(
        tf.linalg.band_part(tf.ones([seq, seq], tf.bool), -1, 0), [2, seq, seq]
    )
    assert_close(layer(x, cos, sin), hub(x, attention_mask=causal), rtol=1e-5)
    del keras_hub


def _softmax_attention(q, k, v, logits_fn):
    """NumPy: softmax(logits_fn(q k^T)) v over the last two axes."""
    logits = logits_fn(np.einsum("...qd,...kd->...qk", q, k))
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    return np.einsum("...qk,...kd->...qd", probs / probs.sum(-1, keepdims=True), v)


def test_attend_with_padding_mask_bias_and_scale_equals_numpy():
    """Cross-attention shapes (5 queries, 7 keys), grouped heads (2 key/value heads of 3 query
    heads), a key-padding mask ([batch, 1, 1, 1, keys]), an additive bias and a float32 scale
    of the scores: the formula, with masked keys getting no weight."""
    rng = np.random.default_rng(11)
    q = rng.normal(size=(2, 2, 3, 5, 4)).astype(np.float32)
    k, v = (rng.normal(size=(2, 2, 7, 4)).astype(np.float32) for _ in range(2))
    keep = np.ones((2, 7), bool)
    keep[1, 4:] = False
    # BERT's -10000 on padding, plus an arbitrary per-key term to see that the bias is added.
    bias = np.where(keep, 0.0, -10000.0) + rng.normal(size=(2, 7))
    bias = bias.astype(np.float32)[:, None, None, None, :]
    got = attend(tf.constant(q), tf.constant(k), tf.constant(v), mask=keep[:, None, None, None],
                 bias=bias, scale=0.5)  # fmt: skip
    k5, v5 = k[:, :, None], v[:, :, None]
    expected = _softmax_attention(
        q, k5, v5, lambda s: np.where(keep[:, None, None, None], s * 0.5, -1e9) + bias
    )
    assert_close(got, expected, rtol=1e-5)
    # Masked keys get no weight: changing their values changes nothing.
    v_changed = v.copy()
    v_changed[1, :, 4:] = 100.0
    again = attend(tf.constant(q), tf.constant(k), tf.constant(v_changed),
                   mask=keep[:, None, None, None])  # fmt: skip
    first = attend(tf.constant(q), tf.constant(k), tf.constant(v), mask=keep[:, None, None, None])
    assert_close(again, first, rtol=1e-6)


def test_multi_head_attend_is_attend_with_groups_of_one_and_applies_dropout():
    rng = np.random.default_rng(12)
    q, k, v = (tf.constant(rng.normal(size=(2, 3, 6, 4)), tf.float32) for _ in range(3))
    causal = np.tril(np.ones((6, 6), bool))[None, None]  # [1, 1, q, k]
    got = multi_head_attend(q, k, v, mask=causal)
    expected = _softmax_attention(
        q.numpy(), k.numpy(), v.numpy(), lambda s: np.where(causal, s, -1e9)
    )
    assert_close(got, expected, rtol=1e-5)
    seen = []

    def dropout(probs, training):
        seen.append((tuple(probs.shape), training))
        return probs * 0.0

    zeros = multi_head_attend(q, k, v, mask=causal, dropout=dropout, training=True)
    assert seen == [((2, 3, 6, 6), True)] and not np.any(zeros.numpy())


def test_gated_attention_with_partial_rope_matches_keras_hub_qwen3_5():
    """Qwen3.5's gated attention (output gate, QK-norm, RoPE on 4 of 16 features, GQA 4/2)
    against keras-hub's `Qwen3_5Attention` with the same weights; its (1 + w) norms get w = our
    scale - 1."""
    pytest.importorskip("keras_hub")  # a peer (the `peers` extra)
    from keras_hub.src.models.qwen3_5.qwen3_5_attention import Qwen3_5Attention

    heads, kv, d, hidden, rotary, seq = 4, 2, 16, 24, 4, 7
    keras.utils.set_random_seed(11)
    ours = Attention(
        hidden_size=hidden, num_heads=heads, num_kv_heads=kv, head_dim=d, stddev=0.3,
        output_stddev=0.3, norm_epsilon=1e-6, qk_norm=True, output_gate=True,
    )  # fmt: skip
    ours.build((None, None, hidden))
    rng = np.random.default_rng(12)
    ours.q_norm.scale.assign(rng.uniform(0.5, 1.5, size=d))
    ours.k_norm.scale.assign(rng.uniform(0.5, 1.5, size=d))
    hub = Qwen3_5Attention(
        num_query_heads=heads, num_key_value_heads=kv, head_dim=d,
        partial_rotary_factor=rotary / d, rope_max_wavelength=10_000, layer_norm_epsilon=1e-6,
    )  # fmt: skip
    hub.build((None, None, hidden))
    hub._query_dense.kernel.assign(ours.q_proj.kernel.numpy().reshape(hidden, heads, 2 * d))
    hub._key_dense.kernel.assign(ours.k_proj.kernel.numpy().reshape(hidden, kv, d))
    hub._value_dense.kernel.assign(ours.v_proj.kernel.numpy().reshape(hidden, kv, d))
    hub._output_dense.kernel.assign(ours.o_proj.kernel.numpy().reshape(heads, d, hidden))
    hub._query_norm.scale.assign(ours.q_norm.scale.numpy() - 1.0)
    hub._key_norm.scale.assign(ours.k_norm.scale.numpy() - 1.0)
    x = rng.normal(size=(2, seq, hidden)).astype(np.float32)
    causal = np.tril(np.ones((seq, seq), bool))[None].repeat(2, 0)
    want = hub(x, attention_mask=causal).numpy()
    cos, sin = RotaryEmbedding(rotary, theta=10_000.0).tables(seq)
    assert_close(ours(x, cos, sin).numpy(), want, rtol=2e-5)
    ungated = Attention(
        hidden_size=hidden, num_heads=heads, num_kv_heads=kv, head_dim=d, stddev=0.3,
        output_stddev=0.3, norm_epsilon=1e-6, qk_norm=True,
    )  # fmt: skip
    assert ungated.q_proj.units * 2 == ours.q_proj.units


@pytest.mark.numerics
@pytest.mark.parametrize("xla", [False, True])
def test_decoding_step_writes_one_slot_a_row(xla):
    """A decoding step's cache write (`_write_cache_rows`, one new token, a scatter) against
    NumPy: row b's slot position[b] takes its new key and value, every other slot and a row
    whose position is past the capacity keep theirs; the shared-position write alike."""
    from mlperf_tf.lm import attention  # noqa: PLC0415

    rng = np.random.default_rng(0)
    cache = [rng.normal(size=[3, 2, 5, 4]).astype(np.float32) for _ in range(2)]
    new = [rng.normal(size=[3, 2, 1, 4]).astype(np.float32) for _ in range(2)]
    position = np.array([4, 0, 5], np.int32)  # row 2 is past the 5 slots: unchanged
    write = tf.function(attention._write_cache_rows, jit_compile=xla)
    got = write(tuple(map(tf.constant, cache)), *map(tf.constant, new), tf.constant(position))
    shared = tf.function(attention._write_cache, jit_compile=xla)
    got_shared = shared(tuple(map(tf.constant, cache)), *map(tf.constant, new), tf.constant(2))
    for index in range(2):
        want, want_shared = cache[index].copy(), cache[index].copy()
        for row, slot in enumerate(position):
            if slot < 5:
                want[row, :, slot] = new[index][row, :, 0]
        want_shared[:, :, 2] = new[index][:, :, 0]
        np.testing.assert_array_equal(got[index].numpy(), want)
        np.testing.assert_array_equal(got_shared[index].numpy(), want_shared)
