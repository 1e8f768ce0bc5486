"""Tests of `mlperf_tf.lm.rope`: YaRN against a per-dimension NumPy transcription of the paper's
code and against keras-hub's `RotaryEmbedding(rope_type="yarn")`; Llama 3.1 scaling's regimes."""

import math

import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.lm import RotaryEmbedding, apply_rope
from mlperf_tf.lm.rope import yarn_inverse_frequencies
from tests.numerics import assert_close

pytestmark = pytest.mark.numerics


def _yarn_reference(dim, base, factor, original, beta_fast, beta_slow, truncate):
    """jquesnelle/yarn `scaled_rope/LlamaYaRNScaledRotaryEmbedding.py` (and Hugging Face's
    `_compute_yarn_parameters`), one dimension pair at a time."""

    def correction_dim(rotations):
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    out = []
    for i in range(dim // 2):
        pos_freq = base ** (2 * i / dim)
        extrapolation, interpolation = 1.0 / pos_freq, 1.0 / (factor * pos_freq)
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        mask = 1.0 - ramp  # the extrapolation share
        out.append(interpolation * (1 - mask) + extrapolation * mask)
    return np.array(out), 0.1 * math.log(factor) + 1.0


@pytest.mark.parametrize(
    ("dim", "base", "factor", "original", "truncate"),
    [
        (64, 150_000.0, 32.0, 4096, False),
        (128, 10_000.0, 4.0, 2048, True),
        (16, 500.0, 8, 64, False),
    ],
)
def test_yarn_is_the_papers_formula(dim, base, factor, original, truncate):
    got, attention = yarn_inverse_frequencies(
        dim, theta=base, factor=factor, original_max_position=original, beta_fast=32.0,
        beta_slow=1.0, truncate=truncate,
    )  # fmt: skip
    expected, expected_attention = _yarn_reference(dim, base, factor, original, 32.0, 1.0, truncate)
    assert_close(got, expected, rtol=1e-12, scale=float(np.max(expected)))
    assert attention == pytest.approx(expected_attention)
    plain = 1.0 / base ** (np.arange(0, dim, 2) / dim)
    ratio = got / plain
    # The three regimes: the fastest pair kept, the slowest divided by the factor, a ramp between.
    assert ratio[0] == pytest.approx(1.0) and ratio[-1] == pytest.approx(1 / factor)
    assert ((ratio < 1 - 1e-9) & (ratio > 1 / factor + 1e-9)).any()


def test_yarn_tables_equal_keras_hubs_rotary_embedding():
    """GPT-OSS's settings (factor 32, betas 32/1, original 4,096, no truncation) at head 64, base
    150,000: keras-hub's cos/sin carry the same attention factor; the rotated vectors agree."""
    keras_hub_layers = pytest.importorskip("keras_hub.layers")
    hub = keras_hub_layers.RotaryEmbedding(
        max_wavelength=150_000.0, scaling_factor=32.0, rope_type="yarn", beta_fast=32.0,
        beta_slow=1.0, original_max_position_embeddings=4096, truncate=False,
    )  # fmt: skip
    rope = RotaryEmbedding(
        64, theta=150_000.0, rope_type="yarn", scaling_factor=32.0,
        original_max_position=4096, beta_fast=32.0, beta_slow=1.0, truncate=False,
    )  # fmt: skip
    x = tf.constant(np.random.default_rng(0).normal(size=(2, 300, 3, 64)), tf.float32)
    cos, sin = rope.tables(300)
    assert_close(apply_rope(x, cos, sin), hub(x), rtol=1e-5)


def test_plain_rope_at_factor_one_and_the_llama3_type():
    plain = RotaryEmbedding(8, theta=100.0).inverse_frequencies
    assert_close(plain, 1.0 / 100.0 ** (np.arange(0, 8, 2) / 8), rtol=1e-15)
    for kind in ("llama3", "yarn"):
        same = RotaryEmbedding(8, theta=100.0, rope_type=kind, scaling_factor=1.0)
        assert_close(same.inverse_frequencies, plain, rtol=1e-15)
        assert same.attention_factor == 1.0
    with pytest.raises(ValueError, match="rope_type"):
        RotaryEmbedding(8, theta=100.0, rope_type="ntk")


def test_rotation_preserves_norms_and_relative_positions():
    """RoPE's defining property: q_m . k_n depends on m - n only."""
    rope = RotaryEmbedding(16, theta=50.0)
    cos, sin = rope.tables(12)
    rng = np.random.default_rng(1)
    q = np.broadcast_to(rng.normal(size=(1, 1, 16)), (1, 12, 16)).astype(np.float32)
    k = np.broadcast_to(rng.normal(size=(1, 1, 16)), (1, 12, 16)).astype(np.float32)
    rq, rk = (
        apply_rope(tf.constant(q), cos, sin).numpy(),
        apply_rope(tf.constant(k), cos, sin).numpy(),
    )
    assert_close(np.linalg.norm(rq, axis=-1), np.linalg.norm(q, axis=-1), rtol=1e-5)
    assert_close(rq[0, 5] @ rk[0, 2], rq[0, 9] @ rk[0, 6], rtol=1e-5)
    assert not np.isclose(rq[0, 5] @ rk[0, 2], rq[0, 5] @ rk[0, 3])
