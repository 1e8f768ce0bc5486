"""Provides `efficientnet`: EfficientNet-B0..B7 (Tan & Le 2019) as a Keras 3 functional model.

The network is B0's stage table (MBConv blocks with squeeze-and-excitation and swish) scaled by
the compound coefficients of the config: every stage's filters by `width_coefficient` (rounded to
multiples of 8, never down by more than 10 %), its repeats by `depth_coefficient` (rounded up).
Batch norm is the suite's cross-replica batch norm, so the BN group size of "Training
EfficientNets at Supercomputer Scale" (distributed BN) is one config field.
"""

from __future__ import annotations

import dataclasses
import math

import keras

from mlperf_tf.layers import CrossReplicaBatchNormalization
from mlperf_tf.seeds import LayerSeeds
from mlperf_tf_efficientnet.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """One stage of B0 (Table 1 of Tan & Le 2019); `expand` is MBConv's expansion ratio."""

    kernel: int
    repeats: int
    filters_in: int
    filters_out: int
    expand: int
    stride: int


# EfficientNet-B0: (kernel, repeats, in, out, expand, stride) per stage, after a 32-filter stem.
B0_STAGES = (
    StageSpec(3, 1, 32, 16, 1, 1),
    StageSpec(3, 2, 16, 24, 6, 2),
    StageSpec(5, 2, 24, 40, 6, 2),
    StageSpec(3, 3, 40, 80, 6, 2),
    StageSpec(5, 3, 80, 112, 6, 1),
    StageSpec(5, 4, 112, 192, 6, 2),
    StageSpec(3, 1, 192, 320, 6, 1),
)
STEM_FILTERS = 32
HEAD_FILTERS = 1280
SE_RATIO = 0.25  # squeeze to a quarter of the block's *input* filters
FILTER_DIVISOR = 8

# EfficientNets use variance-scaling initializers (fan-out, untruncated normal for convolutions).
_CONV_INIT = {"scale": 2.0, "mode": "fan_out", "distribution": "untruncated_normal"}
_DENSE_INIT = {"scale": 1.0 / 3.0, "mode": "fan_out", "distribution": "uniform"}


def round_filters(filters: int, width_coefficient: float, divisor: int = FILTER_DIVISOR) -> int:
    """Scales `filters` by the width coefficient, to a multiple of `divisor`, never below 90 %."""
    scaled = filters * width_coefficient
    rounded = max(divisor, int(scaled + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * scaled:
        rounded += divisor
    return int(rounded)


def round_repeats(repeats: int, depth_coefficient: float) -> int:
    """Scales a stage's block count by the depth coefficient, rounding up."""
    return int(math.ceil(depth_coefficient * repeats))


class StochasticDepth(keras.layers.Layer):
    """Drops a residual branch per example with probability `rate` in training (Huang et al. 2016).

    Surviving branches are scaled by 1/(1 - rate), so inference uses the branch unchanged.
    """

    def __init__(self, rate: float, *, seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"`rate` ({rate!r}) must be in [0, 1).")
        self.rate = rate
        self.seed = seed
        self._seed_generator = keras.random.SeedGenerator(seed)

    def call(self, inputs, training=None):
        if not training or self.rate == 0.0:
            return inputs
        keep = 1.0 - self.rate
        shape = (keras.ops.shape(inputs)[0], 1, 1, 1)  # one draw per example
        noise = keras.random.uniform(shape, seed=self._seed_generator, dtype=inputs.dtype)
        mask = keras.ops.floor(keep + noise)
        return inputs / keep * mask

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "seed": self.seed}


def efficientnet(config: ModelConfig, *, image_size: int, seed: int = 0) -> keras.Model:
    """Builds the EfficientNet of `config` (channels-last) mapping images to logits.

    Layer names contain "bn" exactly for batch-norm layers, so LARS' default exclusions (bias,
    bn, gamma, beta) leave batch norm and biases out of weight decay and layer adaptation.

    Args:
      config: width/depth coefficients, dropout, stochastic depth, batch-norm settings.
      image_size: side of the square RGB input images, in pixels.
      seed: base seed of the initializers and of stochastic depth.

    Returns:
      A `keras.Model` from float images `[batch, image_size, image_size, 3]` to logits
      `[batch, num_classes]` in the policy's compute dtype.

    Raises:
      ValueError: `image_size` is not a positive integer.
    """
    if not isinstance(image_size, int) or image_size < 1:
        raise ValueError(f"`image_size` ({image_size!r}) must be a positive integer.")
    seeds = LayerSeeds(seed)
    width = config.width
    inputs = keras.Input(shape=(image_size, image_size, 3), name="images")
    x = _conv(inputs, round_filters(STEM_FILTERS, width), 3, 2, "stem_conv", seeds)
    x = _bn_act(x, config, "stem")

    stages = [
        (spec, round_repeats(spec.repeats, config.depth)) for spec in B0_STAGES
    ]  # fmt: skip
    total_blocks = sum(repeats for _, repeats in stages)
    block = 0
    for stage, (spec, repeats) in enumerate(stages):
        filters_in = round_filters(spec.filters_in, width)
        filters_out = round_filters(spec.filters_out, width)
        for index in range(repeats):
            # Stochastic depth grows linearly with the block index (the reference's schedule).
            drop = config.drop_connect_rate * block / total_blocks
            x = _mbconv(
                x,
                spec=spec,
                filters_in=filters_in if index == 0 else filters_out,
                filters_out=filters_out,
                stride=spec.stride if index == 0 else 1,
                drop_rate=drop,
                name=f"block{stage + 1}{chr(ord('a') + index) if index < 26 else index}",
                config=config,
                seeds=seeds,
            )
            block += 1

    x = _conv(x, round_filters(HEAD_FILTERS, width), 1, 1, "top_conv", seeds)
    x = _bn_act(x, config, "top")
    x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)  # [batch, channels]
    if config.dropout:
        x = keras.layers.Dropout(config.dropout, seed=seeds(), name="top_dropout")(x)
    logits = keras.layers.Dense(
        config.num_classes,
        kernel_initializer=keras.initializers.VarianceScaling(**_DENSE_INIT, seed=seeds()),
        bias_initializer="zeros",
        name="predictions",
    )(x)  # [batch, num_classes]
    return keras.Model(inputs, logits, name=f"efficientnet-{config.variant}")


def _mbconv(x, *, spec, filters_in, filters_out, stride, drop_rate, name, config, seeds):
    """Inverted residual: 1x1 expand -> depthwise kxk -> squeeze-excite -> 1x1 project (+ skip)."""
    shortcut = x
    expanded = filters_in * spec.expand
    if spec.expand != 1:
        x = _conv(x, expanded, 1, 1, f"{name}_expand_conv", seeds)
        x = _bn_act(x, config, f"{name}_expand")
    x = keras.layers.DepthwiseConv2D(
        spec.kernel,
        strides=stride,
        padding="same",
        use_bias=False,
        depthwise_initializer=keras.initializers.VarianceScaling(**_CONV_INIT, seed=seeds()),
        name=f"{name}_dwconv",
    )(x)
    x = _bn_act(x, config, f"{name}")
    x = _squeeze_excite(x, expanded, max(1, int(filters_in * SE_RATIO)), name, seeds)
    x = _conv(x, filters_out, 1, 1, f"{name}_project_conv", seeds)
    x = _batch_norm(x, config, f"{name}_project_bn")
    if stride == 1 and filters_in == filters_out:
        if drop_rate > 0:
            x = StochasticDepth(drop_rate, seed=seeds(), name=f"{name}_drop")(x)
        x = keras.layers.Add(name=f"{name}_add")([x, shortcut])
    return x


def _squeeze_excite(x, channels, squeezed, name, seeds):
    """Channel gates from the global average: reduce to `squeezed`, swish, expand, sigmoid."""
    gate = keras.layers.GlobalAveragePooling2D(keepdims=True, name=f"{name}_se_squeeze")(x)
    # gate: [batch, 1, 1, squeezed], then [batch, 1, 1, channels]
    gate = _conv(gate, squeezed, 1, 1, f"{name}_se_reduce", seeds, activation="swish", bias=True)
    gate = _conv(gate, channels, 1, 1, f"{name}_se_expand", seeds, activation="sigmoid", bias=True)
    return keras.layers.Multiply(name=f"{name}_se_excite")([x, gate])


def _conv(x, filters, kernel_size, stride, name, seeds, *, activation=None, bias=False):
    """A "same" convolution with EfficientNet's fan-out initializer: without a bias where batch
    norm follows, with one in squeeze-excite (whose 1 x 1 input makes "same" the same as
    Keras' default "valid")."""
    return keras.layers.Conv2D(
        filters,
        kernel_size,
        strides=stride,
        padding="same",
        activation=activation,
        use_bias=bias,
        kernel_initializer=keras.initializers.VarianceScaling(**_CONV_INIT, seed=seeds()),
        name=name,
    )(x)


def _batch_norm(x, config: ModelConfig, name: str):
    return CrossReplicaBatchNormalization(
        group_size=config.bn_group_size,
        axis=-1,
        momentum=config.bn_momentum,
        epsilon=config.bn_epsilon,
        name=name,
    )(x)


def _bn_act(x, config: ModelConfig, name: str):
    x = _batch_norm(x, config, f"{name}_bn")
    return keras.layers.Activation("swish", name=f"{name}_activation")(x)
