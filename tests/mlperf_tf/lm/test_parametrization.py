"""Tests of `mlperf_tf.lm.parametrization.ScaledWeights`: a model whose weights are stored / s
computes the plain model's function (every scaled method, nested calls scaled once), its
gradients are s times the plain ones, and AdamW moves its effective weights as AdamW at s times
the rate moves the plain model's (decoupled weight decay at the rate given, not s times it)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.config import ConfigError
from mlperf_tf.lm.parametrization import ScaledWeights, scaled_class

S = 50.0


class Tiny(keras.Model):
    """Embedding -> dense -> logits; `twice` calls `call` (a nested forward)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.embed = keras.layers.Embedding(16, 8)
        self.hidden = keras.layers.Dense(8, activation="tanh")
        self.out = keras.layers.Dense(16)

    def build(self, input_shape=None):
        self.embed.build((None, None))
        self.hidden.build((None, None, 8))
        self.out.build((None, None, 8))

    def call(self, ids, training=False):
        return self.out(self.hidden(self.embed(ids)))

    def twice(self, ids):
        return self(ids) + self.out(self.embed(ids))


class ScaledTiny(ScaledWeights, Tiny):
    scaled_methods = ("call", "twice")


def _pair():
    keras.utils.set_random_seed(5)
    plain = Tiny()
    plain.build()
    keras.utils.set_random_seed(5)
    scaled = ScaledTiny(weight_scale=S)
    scaled.build()
    return plain, scaled


IDS = tf.constant(np.random.default_rng(0).integers(0, 16, size=(3, 7)), tf.int32)


@pytest.mark.numerics
def test_stored_weights_are_the_plain_ones_over_s_and_compute_the_same_function():
    plain, scaled = _pair()
    for p, s in zip(plain.trainable_variables, scaled.trainable_variables, strict=True):
        np.testing.assert_allclose(s.numpy() * S, p.numpy(), rtol=1e-6)
    np.testing.assert_allclose(scaled(IDS).numpy(), plain(IDS).numpy(), rtol=1e-5, atol=1e-6)
    # `twice` calls `call` inside its scope: scaled once, not s^2
    np.testing.assert_allclose(
        scaled.twice(IDS).numpy(), plain.twice(IDS).numpy(), rtol=1e-5, atol=1e-6
    )
    # inside tf.function too
    np.testing.assert_allclose(
        tf.function(scaled.twice)(IDS).numpy(), plain.twice(IDS).numpy(), rtol=1e-5, atol=1e-6
    )


@pytest.mark.numerics
def test_gradients_are_s_times_and_adamw_moves_as_at_s_times_the_rate():
    plain, scaled = _pair()

    def grads(model):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(model.twice(IDS)))
        return [tf.convert_to_tensor(g) for g in tape.gradient(loss, model.trainable_variables)]

    for g_plain, g_scaled in zip(grads(plain), grads(scaled), strict=True):
        np.testing.assert_allclose(g_scaled.numpy(), S * g_plain.numpy(), rtol=1e-4, atol=1e-6)
    lr, wd = 1e-3, 0.1
    opt_plain = keras.optimizers.AdamW(S * lr, weight_decay=wd / S, epsilon=1e-12)
    opt_scaled = keras.optimizers.AdamW(lr, weight_decay=wd, epsilon=1e-12)
    for _ in range(3):
        opt_plain.apply_gradients(zip(grads(plain), plain.trainable_variables))
        opt_scaled.apply_gradients(zip(grads(scaled), scaled.trainable_variables))
    # AdamW at lr with decay wd on the stored form = AdamW at s lr with decay wd / s (the same
    # lr x wd) on the plain form
    for p, s in zip(plain.trainable_variables, scaled.trainable_variables, strict=True):
        np.testing.assert_allclose(s.numpy() * S, p.numpy(), rtol=1e-4, atol=1e-6)


def test_store_scaled_after_loading_plain_weights_and_the_class_factory():
    plain, scaled = _pair()
    for v in plain.trainable_variables:
        v.assign(v * 1.5)
    for p, s in zip(plain.trainable_variables, scaled.trainable_variables, strict=True):
        s.assign(p)
    scaled.store_scaled()
    np.testing.assert_allclose(scaled(IDS).numpy(), plain(IDS).numpy(), rtol=1e-5, atol=1e-6)
    for p, e in zip(plain.trainable_variables, scaled.effective_values(), strict=True):
        np.testing.assert_allclose(np.asarray(e), p.numpy(), rtol=1e-6)
    made = scaled_class(Tiny, ("call",))(weight_scale=S)
    assert isinstance(made, ScaledWeights) and type(made).__name__ == "ScaledTiny"
    with pytest.raises(ConfigError, match="weight_scale"):
        ScaledTiny(weight_scale=0.0)
