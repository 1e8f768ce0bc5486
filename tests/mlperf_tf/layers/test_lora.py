"""Tests of `mlperf_tf.layers.lora`: PEFT's form, Keras' `enable_lora` at dropout 0, the
initializers, freezing, counts and config errors."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.config import ConfigError
from mlperf_tf.layers import lora


def _adapter(units=6, rank=2, alpha=8.0, dropout=0.0, seed=1):
    layer = lora.LoraAdapter(units, rank=rank, alpha=alpha, dropout=dropout, seed=seed)
    layer.build((None, 5))
    return layer


def test_b_starts_at_zero_so_the_delta_is_zero():
    layer = _adapter()
    x = tf.random.stateless_normal([3, 4, 5], [1, 2])
    np.testing.assert_array_equal(layer(x, training=False).numpy(), 0.0)
    assert np.abs(layer.lora_a.numpy()).max() > 0


def test_a_is_uniform_within_peft_bound():
    """PEFT's kaiming_uniform(a=sqrt(5)) on [r, in]: bound 1/sqrt(in); fails for he_uniform."""
    layer = lora.LoraAdapter(4, rank=64, alpha=64.0, seed=3)
    layer.build((None, 400))
    a = layer.lora_a.numpy()
    bound = 1.0 / np.sqrt(400)
    assert np.abs(a).max() <= bound
    assert np.abs(a).max() > 0.95 * bound  # 25,600 draws fill the interval
    # Uniform on +-b has variance b^2 / 3.
    np.testing.assert_allclose(a.var(), bound**2 / 3, rtol=0.05)


def test_equals_keras_enable_lora_at_dropout_zero():
    """y = x W + (alpha / r) x A B: Keras' Dense.enable_lora with the same W, A, B."""
    rank, alpha = 3, 12.0
    dense = keras.layers.Dense(7, use_bias=False)
    dense.build((None, 5))
    dense.enable_lora(rank, lora_alpha=alpha)
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(5, rank)), rng.normal(size=(rank, 7))
    dense.lora_kernel_a.assign(a)
    dense.lora_kernel_b.assign(b)
    adapter = lora.LoraAdapter(7, rank=rank, alpha=alpha)
    adapter.build((None, 5))
    adapter.lora_a.assign(a)
    adapter.lora_b.assign(b)
    x = tf.constant(rng.normal(size=(2, 3, 5)), tf.float32)
    ours = tf.matmul(x, dense._kernel) + adapter(x)
    np.testing.assert_allclose(ours.numpy(), dense(x).numpy(), rtol=1e-5, atol=1e-5)
    # and the closed form
    want = x.numpy() @ dense._kernel.numpy() + alpha / rank * x.numpy() @ a @ b
    np.testing.assert_allclose(ours.numpy(), want, rtol=1e-5, atol=1e-5)


def test_dropout_on_the_adapter_input_only_in_training():
    layer = _adapter(dropout=0.5)
    layer.lora_b.assign(np.ones((2, 6)))
    x = tf.ones([64, 5])
    eval_out = layer(x, training=False).numpy()
    train_out = layer(x, training=True).numpy()
    np.testing.assert_allclose(eval_out, eval_out[0:1].repeat(64, 0), rtol=1e-6)
    assert not np.allclose(train_out, eval_out)  # rows see different masks


def test_dropout_is_keras_dropout_with_the_scales_on_b():
    """The adapter draws its mask itself and scales B instead of x and the product: the same
    function as PEFT's form written with Keras' `Dropout` (same seed, so the same mask)."""
    rate, alpha, rank = 0.3, 8.0, 2
    layer = _adapter(rank=rank, alpha=alpha, dropout=rate, seed=7)
    layer.lora_b.assign(np.random.default_rng(0).normal(size=(rank, 6)))
    x = tf.random.stateless_normal([4, 16, 5], [3, 4])
    dropped = keras.layers.Dropout(rate, seed=7)(x, training=True).numpy()
    assert 0.1 < np.mean(dropped == 0) < 0.5  # a mask was drawn
    want = alpha / rank * dropped @ layer.lora_a.numpy() @ layer.lora_b.numpy()
    got = layer(x, training=True).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    # A second call draws a new mask (the seed generator advanced).
    assert not np.allclose(layer(x, training=True).numpy(), got)


def test_freeze_base_leaves_only_adapters_trainable():
    inputs = keras.Input((5,))
    base = keras.layers.Dense(6, use_bias=True)
    adapter = lora.LoraAdapter(6, rank=2, alpha=4.0)
    outputs = keras.layers.Add()([base(inputs), adapter(inputs)])
    model = keras.Model(inputs, outputs)
    trainable, total = lora.freeze_base(model)
    assert trainable == 2 * (5 + 6)
    assert total == trainable + 5 * 6 + 6
    names = sorted(v.path.rsplit("/", 1)[-1] for v in model.trainable_variables)
    assert names == ["lora_a", "lora_b"]
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    # Adam's two slots for A and B only: no state for the frozen kernel and bias.
    slots = [v for v in optimizer.variables if len(v.shape) > 0]
    assert sum(int(np.prod(v.shape)) for v in slots) == 2 * trainable


def test_trainable_parameters_from_shapes():
    config = lora.LoraConfig(rank=16, alpha=32)
    projections = [("qkv_proj", 8192, 10240), ("o_proj", 8192, 8192), ("gate_proj", 8192, 28672)]
    assert lora.trainable_parameters(config, projections * 80) == 44_564_480


@pytest.mark.parametrize(
    "kwargs, field",
    [({"rank": 0}, "lora.rank"), ({"alpha": -1.0}, "lora.alpha"), ({"dropout": 1.0}, "lora.dropout"),
     ({"targets": ()}, "lora.targets")],
)  # fmt: skip
def test_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        lora.LoraConfig(**kwargs)


def test_check_targets():
    with pytest.raises(ConfigError, match="q_proj"):
        lora.check_targets(lora.LoraConfig(targets=("q_proj",)), ["qkv_proj", "o_proj"])
    lora.check_targets(lora.LoraConfig(), ["qkv_proj", "o_proj"])
