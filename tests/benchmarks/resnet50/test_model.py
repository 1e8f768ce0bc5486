"""Tests the ResNet v1.5 model: parameter count, v1.5 strides, init, batch norm, dtype policy."""

import re

import keras
import numpy as np
import pytest

from benchmarks.resnet50 import config as rc
from benchmarks.resnet50 import model as model_lib
from mlperf_tf.layers import CrossReplicaBatchNormalization
from mlperf_tf.optimizers.lars import DEFAULT_LARS_EXCLUDE

pytestmark = pytest.mark.numerics

TINY = rc.ModelConfig(num_classes=10, block_layers=(1, 1, 1, 1), base_width=8)


def _count(variables):
    return sum(int(np.prod(v.shape)) for v in variables)


def test_resnet50_has_25557032_parameters():
    model = model_lib.resnet(rc.ModelConfig(num_classes=1000), image_size=224)
    # The usual ResNet-50 count (torchvision's, and the MLPerf reference's): weights, batch-norm
    # gamma and beta, classifier bias; no convolution biases.
    assert _count(model.trainable_variables) == 25_557_032
    # Batch norm's moving mean and variance: 2 x 26,560 channels.
    assert _count(model.non_trainable_variables) == 53_120
    assert model.output_shape == (None, 1000)


def test_v15_puts_the_stride_on_the_3x3_convolution():
    model = model_lib.resnet(rc.ModelConfig(num_classes=10), image_size=64)
    for stage in (3, 4, 5):
        first = f"conv{stage}_block1"
        assert model.get_layer(f"{first}_1_conv").strides == (1, 1)
        assert model.get_layer(f"{first}_2_conv").strides == (2, 2)
        assert model.get_layer(f"{first}_2_conv").kernel_size == (3, 3)
        assert model.get_layer(f"{first}_0_conv").strides == (2, 2)  # projection shortcut
    assert model.get_layer("conv2_block1_2_conv").strides == (1, 1)
    # 64 px: stem /4, three strided stages /8 -> 2x2 before the pool.
    assert model.get_layer("conv5_block3_out").output.shape[1:3] == (2, 2)


def test_convolutions_have_no_bias_and_he_normal_init():
    model = model_lib.resnet(TINY, image_size=32, seed=3)
    convs = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    assert convs
    for conv in convs:
        assert not conv.use_bias
        assert isinstance(conv.kernel_initializer, keras.initializers.HeNormal)
    kernel = model.get_layer("conv2_block1_1_conv").kernel.numpy()
    fan_in = np.prod(kernel.shape[:-1])
    # He normal: std sqrt(2 / fan_in) (truncated normal, so a little less); loose bounds.
    assert 0.5 * np.sqrt(2 / fan_in) < kernel.std() < 1.2 * np.sqrt(2 / fan_in)


def test_layers_get_distinct_seeded_initializations():
    a = model_lib.resnet(TINY, image_size=32, seed=1)
    b = model_lib.resnet(TINY, image_size=32, seed=1)
    c = model_lib.resnet(TINY, image_size=32, seed=2)
    wa = a.get_layer("conv2_block1_1_conv").kernel.numpy()
    np.testing.assert_array_equal(wa, b.get_layer("conv2_block1_1_conv").kernel.numpy())
    assert not np.allclose(wa, c.get_layer("conv2_block1_1_conv").kernel.numpy())
    # Same-shaped layers of one model must not share their initial values.
    k1 = a.get_layer("conv2_block1_0_conv").kernel.numpy()
    k2 = a.get_layer("conv2_block1_3_conv").kernel.numpy()
    assert k1.shape == k2.shape and not np.allclose(k1, k2)


def test_last_batch_norm_gamma_of_each_block_starts_at_zero():
    model = model_lib.resnet(TINY, image_size=32)
    for layer in model.layers:
        if not isinstance(layer, CrossReplicaBatchNormalization):
            continue
        gamma = layer.gamma.numpy()
        if re.search(r"_3_bn$", layer.name):
            np.testing.assert_array_equal(gamma, 0.0)
        else:
            np.testing.assert_array_equal(gamma, 1.0)
    off = model_lib.resnet(
        rc.ModelConfig(**{**TINY.__dict__, "zero_init_last_gamma": False}), image_size=32
    )
    np.testing.assert_array_equal(off.get_layer("conv2_block1_3_bn").gamma.numpy(), 1.0)


def test_batch_norm_is_cross_replica_with_the_configured_settings():
    cfg = rc.ModelConfig(**{**TINY.__dict__, "bn_group_size": 2, "bn_momentum": 0.8})
    model = model_lib.resnet(cfg, image_size=32)
    bns = [layer for layer in model.layers if "bn" in layer.name]
    assert bns and all(isinstance(layer, CrossReplicaBatchNormalization) for layer in bns)
    assert {(b.group_size, b.momentum, b.epsilon) for b in bns} == {(2, 0.8, 1e-5)}
    assert not any(
        isinstance(layer, keras.layers.BatchNormalization)
        for layer in model.layers
        if layer not in bns
    )


def test_lars_exclusions_select_exactly_batch_norm_and_biases():
    model = model_lib.resnet(TINY, image_size=32)
    for variable in model.trainable_variables:
        excluded = any(re.search(p, variable.path) for p in DEFAULT_LARS_EXCLUDE)
        is_bn_or_bias = len(variable.shape) == 1
        assert excluded == is_bn_or_bias, variable.path


@pytest.mark.bfloat16
def test_tiny_forward_shapes_and_bfloat16_policy():
    previous = keras.mixed_precision.global_policy()
    try:
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
        model = model_lib.resnet(TINY, image_size=32)
        logits = model(np.zeros([2, 32, 32, 3], np.float32), training=False)
        assert logits.shape == (2, 10)
        assert logits.dtype == "bfloat16"
        assert all(v.dtype == "float32" for v in model.variables)
    finally:
        keras.mixed_precision.set_global_policy(previous)


def test_bad_image_size_raises():
    with pytest.raises(ValueError, match="image_size"):
        model_lib.resnet(TINY, image_size=0)
