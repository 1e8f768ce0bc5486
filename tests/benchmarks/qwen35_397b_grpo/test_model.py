"""Tests of the Qwen3.5 model: parameter counts of the full shape from the config alone (~397 B
total, ~17 B active, the model card's figures), the same count against a built tiny model of
every kind of layer, its layer pattern, a frozen router, and a forward and gradient pass."""

import dataclasses
import os
import tempfile

import keras
import numpy as np
import pytest
import tensorflow as tf

from benchmarks.qwen35_397b_grpo import config
from benchmarks.qwen35_397b_grpo import model as model_lib
from benchmarks.qwen35_397b_grpo.benchmark import Qwen35GrpoBenchmark
from mlperf_tf.lm.gated_deltanet import GatedDeltaNet
from mlperf_tf.lm.hybrid import build_hybrid_decoder
from tests import tensor_parallel


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


@pytest.mark.numerics
def test_scaled_policy_computes_the_unscaled_model():
    """The mini's parametrization (`model.ScaledPolicy`): weights stored divided by s, the same
    logits (training, cached decoding and `extend` paths) as the plain model of the same initial weights,
    gradients of the stored values s times the plain ones; an unscaled model's saved weights
    load into it as the same function."""
    plain_config = config.tiny(vocab_size=259)
    scaled_config = dataclasses.replace(plain_config, weight_scale=50.0)
    tf.keras.utils.set_random_seed(3)
    plain = model_lib.build_model(plain_config)
    tf.keras.utils.set_random_seed(3)
    scaled = model_lib.build_model(scaled_config)
    assert isinstance(scaled, model_lib.ScaledPolicy)
    for p, s in zip(plain.trainable_variables, scaled.trainable_variables, strict=True):
        np.testing.assert_allclose(s.numpy() * 50.0, p.numpy(), rtol=1e-6, atol=1e-12)
    ids = tf.constant(np.random.default_rng(1).integers(0, 256, size=(2, 11)), tf.int32)
    np.testing.assert_allclose(scaled(ids).numpy(), plain(ids).numpy(), rtol=1e-4, atol=1e-6)
    valid = tf.ones([2, 11], bool)
    got, _ = scaled.decode(ids, scaled.empty_cache(2), valid)
    want, _ = plain.decode(ids, plain.empty_cache(2), valid)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-6)
    at, count = tf.zeros([2], tf.int32), tf.constant([11, 11])  # the kept-cache path's
    got, _ = scaled.extend(ids, scaled.empty_cache(2, 16), at, count)
    want, _ = plain.extend(ids, plain.empty_cache(2, 16), at, count)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-6)

    def grads(m):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(m(ids)))
        return [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, m.trainable_variables)]

    for g_plain, g_scaled in zip(grads(plain), grads(scaled), strict=True):
        # float32 rounding (the products s x w/s) differs; a missed scale would be 49x off
        error = np.linalg.norm(g_scaled - 50.0 * g_plain) / np.linalg.norm(50.0 * g_plain)
        assert error < 1e-3, error
    for v in plain.trainable_variables:  # new weights: a plain model's file loads scaled
        v.assign(v * 1.5)
    path = os.path.join(tempfile.mkdtemp(), "plain.weights.h5")
    plain.save_weights(path)
    model_lib.load_base_weights(scaled, path)
    np.testing.assert_allclose(scaled(ids).numpy(), plain(ids).numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    ("expert_parallel", "model_parallel", "weight_scale"),
    # slow: the other two pairs (each ~4 s at load 3)
    tensor_parallel.crossed_split_cases({"plain": 1.0, "scaled": 20.0}, default=("scaled", "plain")),
)  # fmt: skip
def test_the_base_loads_into_a_split_policy_as_into_the_unsplit_one(
    tmp_path, weight_scale, expert_parallel, model_parallel
):
    """The mini's base (a plain model's `.weights.h5`, `sft.train_base`) loaded on 2 logical
    devices split over `expert` or `model`: every variable holds the unsplit load's whole
    tensor, bit for bit, the scaled policy's each divided by s on its own shard (Keras'
    `load_weights` alone cannot fill shard-shaped variables: "could not be loaded")."""
    smoke = Qwen35GrpoBenchmark.preset("smoke")
    plain = dataclasses.replace(smoke.model, vocab_size=260)  # M = 2 splits the vocabulary
    keras.utils.set_random_seed(3)
    path = str(tmp_path / "base.weights.h5")
    model_lib.build_model(plain).save_weights(path)
    bench = Qwen35GrpoBenchmark(
        dataclasses.replace(smoke, model=dataclasses.replace(plain, weight_scale=weight_scale))
    )
    tensor_parallel.assert_split_import_is_whole(
        bench, lambda model: model_lib.load_base_weights(model, path),
        min_split=8 if model_parallel > 1 else 3, expert_parallel=expert_parallel,
        model_parallel=model_parallel,
    )  # fmt: skip
