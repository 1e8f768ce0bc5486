"""Tests of the SSD-ResNet34 model: MLPerf's feature maps, head shapes, backbone checkpoints."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from benchmarks.ssd import config, model
from benchmarks.ssd.benchmark import SSDBenchmark
from mlperf_tf.errors import DataError, UserError

pytestmark = pytest.mark.numerics

# A thin, shallow SSD300: the real layout and anchor count at a fraction of the compute.
TINY = config.ModelConfig(num_classes=5, width_scale=0.125, backbone_blocks=(1, 1, 1))


def test_mlperf_feature_maps_and_anchor_count():
    assert model.feature_sizes(config.ModelConfig()) == (38, 19, 10, 5, 3, 1)
    assert model.default_boxes(config.ModelConfig()).num_anchors == 8732


def test_too_small_image_is_rejected():
    with pytest.raises(ValueError, match="too small"):
        model.feature_sizes(dataclasses.replace(config.ModelConfig(), image_size=128))


def test_ssd300_outputs_8732_boxes_and_classes():
    ssd = model.build_ssd(TINY)
    codes, logits = ssd(tf.zeros([2, 300, 300, 3]), training=False)
    assert codes.shape == (2, 8732, 4) and logits.shape == (2, 8732, 5)
    feature_maps = [ssd.get_layer(f"loc{k}").output.shape[1] for k in range(6)]
    assert feature_maps == [38, 19, 10, 5, 3, 1]


def test_backbone_is_resnet34_without_conv5_and_stride_1_conv4():
    backbone = model.build_backbone(config.ModelConfig())
    assert backbone.output.shape[1:] == (38, 38, 256)
    blocks = {
        layer.name.rsplit("_", 1)[0] for layer in backbone.layers if layer.name.endswith("_conv1")
    }
    assert len([b for b in blocks if b.startswith("layer1")]) == 3
    assert len([b for b in blocks if b.startswith("layer2")]) == 4
    assert len([b for b in blocks if b.startswith("layer3")]) == 6
    assert not any(name.startswith("layer4") for name in blocks)
    assert backbone.get_layer("layer3_0_conv1").strides == (1, 1)
    assert backbone.get_layer("layer3_0_downsample_conv").strides == (1, 1)
    assert backbone.get_layer("layer2_0_conv1").strides == (2, 2)
    # ResNet-34 up to conv4_x: 0.22M (stem+conv2) + 1.12M (conv3) + 7.1M (conv4) parameters.
    assert 8.0e6 < backbone.count_params() < 8.6e6


def test_extra_layers_have_no_batch_norm_unless_asked():
    names = [layer.name for layer in model.build_ssd(TINY).layers]
    assert not any(n.startswith("extra") and "bn" in n for n in names)
    with_bn = dataclasses.replace(TINY, extra_batch_norm=True)
    assert any("extra1_bn1" == layer.name for layer in model.build_ssd(with_bn).layers)


def _bench(path, **model_fields):
    cfg = config.smoke()
    return SSDBenchmark(
        dataclasses.replace(
            cfg, model=dataclasses.replace(cfg.model, backbone_checkpoint=str(path), **model_fields)
        )
    )


def test_backbone_checkpoint_restores_weights(tmp_path):
    source = model.build_ssd(config.smoke().model)
    path = tmp_path / "backbone.weights.h5"
    source.get_layer("backbone").save_weights(str(path))
    bench = _bench(path)
    target = bench.build_model()
    kernel = lambda m: m.get_layer("backbone").get_layer("conv1").kernel.numpy()  # noqa: E731
    assert not np.allclose(kernel(source), kernel(target))
    head_before = target.get_layer("loc0").kernel.numpy()
    bench.restore_initial_weights(target)
    np.testing.assert_array_equal(kernel(source), kernel(target))
    np.testing.assert_array_equal(head_before, target.get_layer("loc0").kernel.numpy())


def test_missing_backbone_checkpoint_is_a_data_error(tmp_path):
    bench = _bench(tmp_path / "nope.weights.h5")
    with pytest.raises(DataError, match="nope.weights.h5"):
        bench.restore_initial_weights(bench.build_model())


def test_mismatched_backbone_checkpoint_is_a_user_error(tmp_path):
    other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    path = tmp_path / "other.weights.h5"
    other.save_weights(str(path))
    bench = _bench(path)
    with pytest.raises(UserError, match="other.weights.h5"):
        bench.restore_initial_weights(bench.build_model())
    # A backbone of another width: same layers, other shapes.
    wider = model.build_backbone(dataclasses.replace(config.smoke().model, width_scale=0.25))
    wider.save_weights(str(path))
    with pytest.raises(UserError, match="does not fit"):
        bench.restore_initial_weights(bench.build_model())
