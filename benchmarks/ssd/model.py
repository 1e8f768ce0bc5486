"""Provides the SSD-ResNet34 Keras model of MLPerf's object-detection benchmark.

The reference (MLCommons training `single_stage_detector`, v0.6-v1.0): torchvision's ResNet-34
without conv5_x, the first block of conv4_x at stride 1 (its 3x3 convolution and its 1x1
projection), so the backbone ends at stride 8 (38x38 for a 300x300 input); five extra blocks
(1x1 conv, ReLU, 3x3 conv, ReLU), three at stride 2 with padding 1 and two unpadded at stride 1,
give the 19, 10, 5, 3, 1 maps; a 3x3 box head (4 codes per default box) and a 3x3 class head
(`num_classes` logits per default box) on each of the six maps. Convolutions are padded
explicitly as in PyTorch (symmetric), so feature-map cells sit where the default boxes expect.
"""

from __future__ import annotations

import keras
from keras import layers

from benchmarks.ssd import anchors as anchors_lib
from benchmarks.ssd.config import ModelConfig
from mlperf_tf.config import ConfigError
from mlperf_tf.layers import CrossReplicaBatchNormalization
from mlperf_tf.spmd import SpatialBuilder, SpatialLayout, stem_refusal

# torchvision ResNet-34 widths of conv2_x, conv3_x, conv4_x.
_STAGE_WIDTHS = (64, 128, 256)
_STEM_WIDTH = 64


def scaled(channels: int, width_scale: float) -> int:
    """`channels * width_scale`, at least 8 (the thin variants of mini/smoke)."""
    return max(8, int(round(channels * width_scale)))


def _conv_out(size: int, *, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def feature_sizes(config: ModelConfig) -> tuple[int, ...]:
    """Side of each detection level's feature map for `config.image_size` (PyTorch arithmetic).

    Raises:
      ValueError: a level would be empty (the image is too small for the extra layers).
    """
    size = _conv_out(config.image_size, kernel=7, stride=2, padding=3)  # conv1
    size = _conv_out(size, kernel=3, stride=2, padding=1)  # max pool
    size = _conv_out(size, kernel=3, stride=2, padding=1)  # conv3_x; conv4_x keeps stride 1
    sizes = [size]
    for stride, padding in zip(config.extra_strides, config.extra_paddings):
        size = _conv_out(size, kernel=3, stride=stride, padding=padding)
        if size < 1:
            raise ValueError(
                f"`model.image_size` ({config.image_size}) is too small for the extra layers "
                f"(strides {config.extra_strides}, paddings {config.extra_paddings}): "
                f"feature maps {sizes} then {size}."
            )
        sizes.append(size)
    return tuple(sizes)


def default_boxes(config: ModelConfig) -> anchors_lib.DefaultBoxes:
    """The default boxes matching the model's feature maps (8732 for the SSD300 config)."""
    return anchors_lib.default_boxes(
        image_size=config.image_size,
        feature_sizes=feature_sizes(config),
        steps=config.anchor_steps,
        scales=config.anchor_scales,
        aspect_ratios=config.anchor_aspect_ratios,
    )


class _Builder:
    """Creates named layers of one model with the config's batch norm and initializers, on
    tiles (slabs of rows) while the activations split (`SpatialBuilder`, K = 1: plain Keras
    layers)."""

    def __init__(self, config: ModelConfig, slabs: SpatialBuilder):
        self.config = config
        self.slabs = slabs

    def batch_norm(self, name: str) -> layers.Layer:
        return CrossReplicaBatchNormalization(
            group_size=self.slabs.batch_norm_group(self.config.bn_group_size),
            momentum=self.config.bn_momentum,
            epsilon=self.config.bn_epsilon,
            name=name,
        )

    def conv(
        self, x, filters, kernel, *, stride=1, padding=0, use_bias=False, init=None, name,
        split=None,
    ):  # fmt: skip
        """PyTorch-style convolution: symmetric zero padding, then a 'valid' convolution (on a
        slab with its halo rows when `split`; default: whether the activations are split)."""
        return self.slabs.conv(
            x,
            filters,
            kernel,
            stride=stride,
            padding=padding,
            use_bias=use_bias,
            kernel_initializer=init or keras.initializers.VarianceScaling(2.0, "fan_out"),
            name=name,
            split=split,
        )

    def basic_block(self, x, filters: int, *, stride: int, project: bool, name: str):
        """ResNet v1 basic block: 3x3-BN-ReLU-3x3-BN, plus the (projected) shortcut, ReLU."""
        x = self.slabs.keep_split(x, ((3, stride, 1), (1, stride, 0)), name=name)
        shortcut = x
        if project:
            shortcut = self.conv(x, filters, 1, stride=stride, name=f"{name}_downsample_conv")
            shortcut = self.batch_norm(f"{name}_downsample_bn")(shortcut)
        y = self.conv(x, filters, 3, stride=stride, padding=1, name=f"{name}_conv1")
        y = self.batch_norm(f"{name}_bn1")(y)
        y = layers.ReLU(name=f"{name}_relu1")(y)
        y = self.conv(y, filters, 3, padding=1, name=f"{name}_conv2")
        y = self.batch_norm(f"{name}_bn2")(y)
        y = layers.Add(name=f"{name}_add")([y, shortcut])
        return layers.ReLU(name=f"{name}_out")(y)


def build_backbone(config: ModelConfig, slabs: SpatialBuilder | None = None) -> keras.Model:
    """MLPerf's modified ResNet-34 up to conv4_x: `[B, S, S, 3]` -> `[B, S/8, S/8, 256*width]`.

    Layer names follow torchvision's (`conv1`, `layer1_0_conv1`, ...) so a converted ImageNet
    checkpoint maps one to one. With `slabs` of K x L > 1 tiles the input is the whole image and
    the output this replica's tile (`[B, S/8/K, S/8/L, C]`), or the whole map where it stopped
    splitting (`slabs.split` says which).

    A stem that does not split into K x L tiles (SSD300's 300 px at K or L = 2: 75 rows after
    the max pool) runs whole on every member, and the tiles start at the first block whose input
    splits (at 300 px, K = 2: conv3_x's second block, 38 rows).
    """
    slabs = slabs or SpatialBuilder(None)
    b = _Builder(config, slabs)
    width = config.width_scale
    size = config.image_size
    stem_splits = slabs.image_splits(size, ((7, 2, 3),)) and slabs.image_splits(
        size // 2, ((3, 2, 1),)
    )
    inputs = keras.Input((size, size, 3), name="image")
    x = slabs.start(inputs, split=stem_splits)  # else whole until a block splits
    x = b.conv(x, scaled(_STEM_WIDTH, width), 7, stride=2, padding=3, name="conv1")
    x = b.batch_norm("bn1")(x)
    x = layers.ReLU(name="relu")(x)
    # Inputs are >= 0 after the ReLU, so zero padding equals PyTorch's -inf padding here.
    x = slabs.max_pool(x, 3, stride=2, padding=1, name="maxpool")
    channels = scaled(_STEM_WIDTH, width)
    for stage, (blocks, stage_width) in enumerate(zip(config.backbone_blocks, _STAGE_WIDTHS)):
        filters = scaled(stage_width, width)
        # conv3_x (stage 1) downsamples; conv4_x (stage 2) keeps stride 1 in MLPerf's version.
        stride = 2 if stage == 1 else 1
        for block in range(blocks):
            first = block == 0
            x = b.basic_block(
                x,
                filters,
                stride=stride if first else 1,
                project=first and (stride != 1 or channels != filters),
                name=f"layer{stage + 1}_{block}",
            )
        channels = filters
    return keras.Model(inputs, x, name="backbone")


def build_ssd(config: ModelConfig, layout: SpatialLayout | None = None) -> keras.Model:
    """The SSD-ResNet34 model.

    Spatial partitioning (`layout` with K x L > 1 tiles; L = 1: slabs of rows): the backbone,
    the extra blocks and the heads run on tiles while a level's rows (columns) split into K (L)
    parts of a multiple of the stride (halo-exchange convolutions and max pool, batch norm over
    the tiles and the BN group), and whole after; each level's head output maps are gathered
    over the group, then flattened (position-major anchors), so the loss, the box matching and
    the anchors see every image once, whole, on every member.

    Raises:
      ConfigError: no layer splits into the layout's tiles (`spatial.stem_refusal`; SSD300's
        300 px at K or L = 4).

    Returns:
      A Keras model mapping normalized images `[B, S, S, 3]` to `(box_codes [B, A, 4],
      class_logits [B, A, num_classes])` in the compute dtype, anchors in `default_boxes`
      order. The backbone is the nested model named "backbone".
    """
    sizes = feature_sizes(config)  # validates the image size
    if len(sizes) != len(config.anchor_aspect_ratios):
        raise ValueError(
            f"the model has {len(sizes)} detection levels {sizes} but the anchors are given for "
            f"{len(config.anchor_aspect_ratios)} (`model.anchor_aspect_ratios`)."
        )
    slabs = SpatialBuilder(layout)
    b = _Builder(config, slabs)
    # One instance for the extra blocks and heads, made here: an unseeded initializer draws its
    # seed when made, so where it is made fixes the initial weights.
    xavier = keras.initializers.GlorotUniform()  # the reference: xavier_uniform_
    inputs = keras.Input((config.image_size, config.image_size, 3), name="image")
    backbone = build_backbone(config, slabs)
    features = _extra_blocks(config, b, backbone(inputs), xavier)
    if slabs.parts > 1 and not slabs.ever_split:
        raise ConfigError(
            stem_refusal(slabs.layout, size=config.image_size, setting="model.image_size")
        )
    box_codes, class_logits = _heads(config, b, features, xavier)
    return keras.Model(inputs, (box_codes, class_logits), name="ssd_resnet34")


def _extra_blocks(config: ModelConfig, b: _Builder, x, init) -> list:
    """The backbone's output and the extra blocks' outputs, each with whether it is split.

    Returns:
      `[(feature [B, H, W, C], split into tiles), ...]`: the detection levels, largest first.
    """
    slabs, width, bn = b.slabs, config.width_scale, config.extra_batch_norm
    features = [(x, slabs.split)]
    extras = zip(
        config.extra_mid_channels,
        config.extra_channels,
        config.extra_strides,
        config.extra_paddings,
    )
    for k, (mid, out, stride, padding) in enumerate(extras):
        name = f"extra{k + 1}"
        x = slabs.keep_split(x, ((1, 1, 0), (3, stride, padding)), name=name)
        x = b.conv(x, scaled(mid, width), 1, use_bias=not bn, init=init, name=f"{name}_conv1")
        if bn:
            x = b.batch_norm(f"{name}_bn1")(x)
        x = layers.ReLU(name=f"{name}_relu1")(x)
        x = b.conv(
            x,
            scaled(out, width),
            3,
            stride=stride,
            padding=padding,
            use_bias=not bn,
            init=init,
            name=f"{name}_conv2",
        )
        if bn:
            x = b.batch_norm(f"{name}_bn2")(x)
        x = layers.ReLU(name=f"{name}_relu2")(x)
        features.append((x, slabs.split))
    return features


def _heads(config: ModelConfig, b: _Builder, features: list, init):
    """Each level's box and class heads, whole on every member, flattened and joined.

    Returns:
      `(box_codes [B, A, 4], class_logits [B, A, num_classes])`, anchors position-major.
    """
    slabs = b.slabs
    box_codes, class_logits = [], []
    for level, ((feature, split), ratios) in enumerate(zip(features, config.anchor_aspect_ratios)):
        per_cell = anchors_lib.boxes_per_location(ratios)
        head = dict(padding=1, use_bias=True, init=init, split=split)
        loc = b.conv(feature, per_cell * 4, 3, name=f"loc{level}", **head)
        conf = b.conv(feature, per_cell * config.num_classes, 3, name=f"conf{level}", **head)
        # The whole map on every member (tiles gathered), then [B, H, W, boxes * k] ->
        # [B, H * W * boxes, k]: position-major, box-minor anchors.
        loc = slabs.whole(loc, name=f"loc{level}_gather", split=split)
        conf = slabs.whole(conf, name=f"conf{level}_gather", split=split)
        box_codes.append(layers.Reshape((-1, 4), name=f"loc{level}_flat")(loc))
        class_logits.append(
            layers.Reshape((-1, config.num_classes), name=f"conf{level}_flat")(conf)
        )
    box_codes = layers.Concatenate(axis=1, name="box_codes")(box_codes)
    class_logits = layers.Concatenate(axis=1, name="class_logits")(class_logits)
    return box_codes, class_logits
