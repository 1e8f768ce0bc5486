"""Provides the ResNet v1.5 Keras model (ResNet-50 and reduced variants) of the MLPerf benchmark."""

from __future__ import annotations

import keras

from benchmarks.resnet50.config import ModelConfig
from mlperf_tf.config import ConfigError
from mlperf_tf.layers import CrossReplicaBatchNormalization
from mlperf_tf.seeds import LayerSeeds
from mlperf_tf.spmd import SpatialBuilder, SpatialLayout, stem_refusal

# Stride of each stage's first bottleneck (the first stage follows the stem's max pool).
_STAGE_STRIDES = (1, 2, 2, 2)
_EXPANSION = 4  # a bottleneck's output has 4x the filters of its 3x3 convolution


def resnet(
    config: ModelConfig, *, image_size: int, seed: int = 0, layout: SpatialLayout | None = None
) -> keras.Model:
    """Builds ResNet v1.5 as a channels-last Keras functional model.

    v1.5 (the MLPerf/Model Garden variant) puts the stride of a downsampling bottleneck on its
    3x3 convolution instead of the first 1x1. Convolutions have no bias and He-normal
    (fan-in, truncated normal) initialization; the classifier is a dense layer with N(0, 0.01)
    weights. Every batch norm is `mlperf_tf.layers.CrossReplicaBatchNormalization` with
    `config.bn_group_size`, momentum and epsilon from `config`, and, with
    `config.zero_init_last_gamma`, the last batch norm of each residual branch starts at
    gamma = 0. Layers follow the global Keras dtype policy (bf16/fp16-ready); the logits come
    out in the policy's compute dtype.

    Layer names contain "bn" exactly for batch-norm layers and "conv"/"fc" otherwise, so that
    LARS' default exclusion patterns (bias, bn, gamma, beta) select the right variables.

    Spatial partitioning (`layout` with K x L > 1 tiles; L = 1: slabs of rows): each replica
    cuts its tile from the whole images, the convolutions and the max pool exchange halo rows
    and columns (`mlperf_tf.layers.spatial`), batch norm spans the K L tiles of
    `bn_group_size` batch shards, and the global average pool sums over the tiles, so the
    logits are the whole model's on every member of the group. A stage whose rows (columns) no
    longer split into K (L) parts of a multiple of its stride runs whole (the tiles are
    gathered before it). Same variables (names, shapes, initializers) as the unsplit model.

    Args:
      config: the model config (`block_layers=(3, 4, 6, 3)`, `base_width=64` is ResNet-50).
      image_size: side of the square RGB input images, in pixels.
      seed: base seed of the initializers (each layer gets its own derived seed).
      layout: the spatial layout; None or K = 1: the whole image on each replica.

    Returns:
      A `keras.Model` mapping float images `[batch, image_size, image_size, 3]` to logits
      `[batch, num_classes]`.

    Raises:
      ValueError: `image_size` is not a positive integer.
      ConfigError: no block's input splits into K x L tiles (`spatial.stem_refusal`). An image
        whose stem does not split (`image_size` not a multiple of 4 max(K, L)) runs whole up to
        the first stage that does.
    """
    if not isinstance(image_size, int) or image_size < 1:
        raise ValueError(f"`image_size` ({image_size!r}) must be a positive integer.")
    if len(config.block_layers) > len(_STAGE_STRIDES):
        raise ValueError(
            f"`block_layers` ({config.block_layers!r}) has more than {len(_STAGE_STRIDES)} stages."
        )
    seeds = LayerSeeds(seed)
    build = SpatialBuilder(layout)
    inputs = keras.Input(shape=(image_size, image_size, 3), name="images")
    x = _stem(build, inputs, config, seeds, image_size=image_size)
    for stage, num_blocks in enumerate(config.block_layers):
        for block in range(num_blocks):
            x = _stage_block(build, x, config, seeds, stage=stage, block=block)
    if build.parts > 1 and not build.ever_split:
        raise ConfigError(stem_refusal(build.layout, size=image_size, setting="data.image_size"))
    x = build.global_average_pool(x, name="avg_pool")  # [batch, channels], whole
    logits = keras.layers.Dense(
        config.num_classes,
        kernel_initializer=keras.initializers.RandomNormal(stddev=0.01, seed=seeds()),
        bias_initializer="zeros",
        name="fc",
    )(x)  # [batch, num_classes]
    return keras.Model(inputs, logits, name="resnet")


def _stem(build, inputs, config, seeds, *, image_size: int):
    """7x7/2 convolution (explicit padding, as the reference), batch norm, ReLU, 3x3/2 max pool;
    split into tiles if both the convolution and the pool split, else whole until a stage does."""
    stem_splits = build.image_splits(image_size, ((7, 2, 3),)) and build.image_splits(
        image_size // 2, ((3, 2, "same"),)
    )
    x = build.start(inputs, split=stem_splits)
    x = _conv(build, x, config.base_width, 7, 2, "conv1_conv", seeds, padding=3)
    x = _batch_norm(build, x, config, "conv1_bn")
    x = keras.layers.ReLU(name="conv1_relu")(x)
    return build.max_pool(x, 3, stride=2, padding="same", name="pool1_pool")


def _stage_block(build, x, config, seeds, *, stage: int, block: int):
    """Block `block` of stage `stage`: the first of a stage projects (and strides)."""
    stride = _STAGE_STRIDES[stage] if block == 0 else 1
    name = f"conv{stage + 2}_block{block + 1}"
    x = build.keep_split(x, ((3, stride, "same"), (1, stride, "same")), name=name)
    return _bottleneck(
        build, x, filters=config.base_width * 2**stage, stride=stride, projection=block == 0,
        name=name, config=config, seeds=seeds,
    )  # fmt: skip


def _bottleneck(build, x, *, filters, stride, projection, name, config, seeds):
    """One v1.5 bottleneck: 1x1 -> 3x3 (with the stride) -> 1x1 (4x filters), plus shortcut."""
    if projection:
        shortcut = _conv(build, x, filters * _EXPANSION, 1, stride, f"{name}_0_conv", seeds)
        shortcut = _batch_norm(build, shortcut, config, f"{name}_0_bn")
    else:
        shortcut = x
    y = _conv(build, x, filters, 1, 1, f"{name}_1_conv", seeds)
    y = _batch_norm(build, y, config, f"{name}_1_bn")
    y = keras.layers.ReLU(name=f"{name}_1_relu")(y)
    y = _conv(build, y, filters, 3, stride, f"{name}_2_conv", seeds)
    y = _batch_norm(build, y, config, f"{name}_2_bn")
    y = keras.layers.ReLU(name=f"{name}_2_relu")(y)
    y = _conv(build, y, filters * _EXPANSION, 1, 1, f"{name}_3_conv", seeds)
    y = _batch_norm(build, y, config, f"{name}_3_bn", zero_gamma=config.zero_init_last_gamma)
    y = keras.layers.Add(name=f"{name}_add")([y, shortcut])
    return keras.layers.ReLU(name=f"{name}_out")(y)


def _conv(build, x, filters, kernel_size, stride, name, seeds, padding="same"):
    return build.conv(
        x,
        filters,
        kernel_size,
        stride=stride,
        padding=padding,
        use_bias=False,
        kernel_initializer=keras.initializers.HeNormal(seed=seeds()),
        name=name,
    )


def _batch_norm(build, x, config: ModelConfig, name: str, *, zero_gamma: bool = False):
    return CrossReplicaBatchNormalization(
        group_size=build.batch_norm_group(config.bn_group_size),
        axis=-1,
        momentum=config.bn_momentum,
        epsilon=config.bn_epsilon,
        gamma_initializer="zeros" if zero_gamma else "ones",
        name=name,
    )(x)
