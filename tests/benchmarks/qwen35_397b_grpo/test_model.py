"""Tests of the Qwen3.5 model: parameter counts of the full shape from the config alone (~397 B
total, ~17 B active, the model card's figures), the same count against a built tiny model of
every kind of layer, its layer pattern, a frozen router, and a forward and gradient pass."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.qwen35_397b_grpo import config
from mlperf_tf.lm.gated_deltanet import GatedDeltaNet
from mlperf_tf.lm.hybrid import build_hybrid_decoder


def test_full_model_sizes_without_allocating():
    c = config.qwen35_397b()
    total, active = c.parameter_count(), c.active_parameter_count()
    assert 396e9 < total < 398e9, total
    assert 16.5e9 < active < 17.5e9, active
    assert c.linear_layers() == 45  # 15 blocks of 3 DeltaNet layers + 1 attention layer
    assert [c.is_linear(i) for i in range(4)] == [True, True, True, False]


@pytest.mark.parametrize("shared", [0, 16])
def test_tiny_model_count_matches_its_weights(shared):
    c = dataclasses.replace(config.tiny(), shared_expert_size=shared)
    model = build_hybrid_decoder(c)
    built = sum(int(np.prod(w.shape)) for w in model.weights if "router_bias" not in w.path)
    assert c.parameter_count() == built
    kinds = [type(layer.attention) for layer in model.decoder_layers]
    assert kinds.count(GatedDeltaNet) == 3


def test_router_is_frozen_and_the_rest_trains():
    c = config.tiny()
    model = build_hybrid_decoder(c)
    frozen = [w.path for w in model.weights if not w.trainable]
    assert frozen and all("router" in p for p in frozen)
    tokens = tf.constant(np.random.default_rng(0).integers(0, c.vocab_size, size=(2, 9)))
    with tf.GradientTape() as tape:
        logits = model(tokens)
        loss = tf.reduce_mean(tf.square(logits))
    assert logits.shape == (2, 9, c.vocab_size)
    grads = tape.gradient(loss, model.trainable_variables)
    missing = [v.path for v, g in zip(model.trainable_variables, grads) if g is None]
    assert not missing, missing
