"""Tests of the Llama 3.1 model: shapes, parameter counts, rotary scaling, causality, and logits
equal to keras-hub's Llama 3 backbone at a tiny configuration with the same weights."""

import dataclasses
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from benchmarks.llama31_8b import config as config_lib
from benchmarks.llama31_8b import model as M
from benchmarks.llama31_8b.benchmark import Llama31Benchmark
from mlperf_tf.lm import RotaryEmbedding
from tests.keras_hub_weights import copy_decoder_into
from tests.numerics import assert_close
from tools.peers.bench_llama import llama3_backbone

pytestmark = pytest.mark.numerics

TINY = config_lib.tiny(vocab_size=96)


def _tokens(batch=2, seq=12, vocab=96, seed=0):
    return tf.constant(np.random.default_rng(seed).integers(0, vocab, (batch, seq)), tf.int32)


def test_logits_shape_and_parameter_count_from_config():
    keras.utils.set_random_seed(0)
    model = M.build_model(TINY)
    assert model(_tokens()).shape == (2, 12, 96)
    assert model.count_params() == TINY.parameter_count()
    mini = config_lib.mini().model
    assert M.build_model(mini).count_params() == mini.parameter_count()


def test_mlperf_preset_parameter_count_is_llama31_8b_without_allocating():
    benchmark = Llama31Benchmark(Llama31Benchmark.preset("mlperf"))
    count = benchmark.parameter_count()
    assert count == 8_030_261_248  # Meta's model card: 8.03 B
    assert float(f"{count:.3g}") == 8.03e9


def _meta_apply_scaling(freqs, *, factor, low, high, old_context):
    """Meta's `apply_scaling` (llama-models, `reference_impl/model.py`), one frequency at a time."""
    low_wavelen, high_wavelen = old_context / low, old_context / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(freq)
        elif wavelen > low_wavelen:
            out.append(freq / factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            out.append((1 - smooth) * freq / factor + smooth * freq)
    return np.array(out)


def test_rotary_scaling_is_llama31s_formula():
    c = config_lib.llama31_8b()
    plain = 1.0 / (c.rope_theta ** (np.arange(0, c.head_dim, 2) / c.head_dim))
    expected = _meta_apply_scaling(plain, factor=8.0, low=1.0, high=4.0, old_context=8192)
    actual = RotaryEmbedding.from_config(c).inverse_frequencies
    assert_close(actual, expected, rtol=1e-12)
    # All three regimes occur at head 128: kept, divided by 8, interpolated.
    ratio = expected / plain
    assert (ratio == 1).any() and np.isclose(ratio, 1 / 8).any()
    assert ((ratio > 1 / 8 + 1e-9) & (ratio < 1 - 1e-9)).any()


def test_attention_is_causal():
    keras.utils.set_random_seed(1)
    model = M.build_model(TINY)
    a = _tokens(seed=2)
    b = tf.concat([a[:, :6], _tokens(seq=6, seed=3)], axis=1)  # same prefix, other suffix
    assert_close(model(b)[:, :6], model(a)[:, :6], rtol=1e-5)
    assert not np.allclose(model(b)[:, 6:], model(a)[:, 6:])


def _copy_into_keras_hub(ours, config):
    """A keras-hub `Llama3Backbone` of `config` carrying our weights, and our lm_head kernel."""
    pytest.importorskip("keras_hub")
    hub = llama3_backbone(config, rope_position_scaling_factor=1.0, dtype="float32")
    return copy_decoder_into(hub, ours, hidden_size=config.hidden_size, head_dim=config.head_dim)


@pytest.mark.peers
def test_logits_equal_keras_hub_llama3_backbone_with_the_same_weights():
    """keras-hub's `Llama3Backbone` (its Llama 3.1 rope scaling, GQA by repeated keys, einsum
    projections) with our weights, times our untied output kernel, gives our logits."""
    # Head 16 (keras-hub's is hidden / heads) so that the scaling's three frequency regimes
    # occur at original context 32 with base 10,000.
    config = dataclasses.replace(TINY, hidden_size=64, head_dim=16, rope_theta=10_000.0)
    keras.utils.set_random_seed(4)
    ours = M.build_model(config)
    # Norm scales away from 1 so that a swapped or missing scale shows.
    for variable in ours.trainable_variables:
        if variable.path.endswith("/scale"):
            variable.assign(np.random.default_rng(5).uniform(0.5, 1.5, variable.shape))
    hub = _copy_into_keras_hub(ours, config)
    tokens = _tokens(batch=2, seq=40, seed=6)
    hidden = hub({"token_ids": tokens, "padding_mask": tf.ones_like(tokens)})
    expected = tf.matmul(hidden, ours.lm_head.kernel)
    assert_close(ours(tokens), expected, rtol=1e-5)
    assert_close(ours.hidden_states(tokens), hidden, rtol=1e-5)
