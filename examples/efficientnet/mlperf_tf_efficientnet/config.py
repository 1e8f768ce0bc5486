"""Provides the EfficientNet config dataclasses and its presets `mlperf`, `mini` and `smoke`.

The benchmark trains on the same ImageNet TFRecords, with the same input pipeline, optimizer
fields and eval schedule as the suite's ResNet-50, so its config extends `ResNet50Config` and
replaces only the model: a new image classifier is a new model, not a new pipeline.
"""

from __future__ import annotations

import dataclasses

from benchmarks.resnet50 import config as resnet_config
from mlperf_tf import paths
from mlperf_tf.config import ConfigError, require_positive_int

NAME = "efficientnet"

# Compound scaling (Tan & Le 2019, Table 2 and the reference `efficientnet_builder.py`):
# variant -> (width coefficient, depth coefficient, resolution, dropout rate).
VARIANTS: dict[str, tuple[float, float, int, float]] = {
    "b0": (1.0, 1.0, 224, 0.2),
    "b1": (1.0, 1.1, 240, 0.2),
    "b2": (1.1, 1.2, 260, 0.3),
    "b3": (1.2, 1.4, 300, 0.3),
    "b4": (1.4, 1.8, 380, 0.4),
    "b5": (1.6, 2.2, 456, 0.4),
    "b6": (1.8, 2.6, 528, 0.5),
    "b7": (2.0, 3.1, 600, 0.5),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """EfficientNet shape and batch-norm settings.

    Attributes:
      variant: `b0` ... `b7`; sets the width/depth coefficients, the dropout rate and (through
        `EfficientNetConfig.image_size`) the resolution. One field turns B0 into B7.
      width_coefficient, depth_coefficient, dropout_rate: override the variant's value when
        not None.
      drop_connect_rate: stochastic-depth drop rate of the last block (0.2 in the reference);
        block k of n drops its branch with probability `drop_connect_rate * k / n`.
      bn_momentum, bn_epsilon: the reference's 0.99 and 1e-3.
      bn_group_size: replicas whose batches one batch norm normalizes over (distributed BN).
    """

    variant: str = "b0"
    num_classes: int = 1000
    width_coefficient: float | None = None
    depth_coefficient: float | None = None
    dropout_rate: float | None = None
    drop_connect_rate: float = 0.2
    bn_momentum: float = 0.99
    bn_epsilon: float = 1e-3
    bn_group_size: int = 1

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ConfigError(
                f"`model.variant` ({self.variant!r}) must be one of {', '.join(VARIANTS)}."
            )
        require_positive_int("model.num_classes", self.num_classes)
        require_positive_int("model.bn_group_size", self.bn_group_size)
        for name in ("width_coefficient", "depth_coefficient"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"`model.{name}` ({value!r}) must be positive.")
        for name in ("dropout_rate", "drop_connect_rate"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise ConfigError(f"`model.{name}` ({value!r}) must be in [0, 1).")
        if not 0.0 <= self.bn_momentum < 1.0:
            raise ConfigError(f"`model.bn_momentum` ({self.bn_momentum!r}) must be in [0, 1).")
        if self.bn_epsilon <= 0:
            raise ConfigError(f"`model.bn_epsilon` ({self.bn_epsilon!r}) must be positive.")

    @property
    def width(self) -> float:
        return self.width_coefficient or VARIANTS[self.variant][0]

    @property
    def depth(self) -> float:
        return self.depth_coefficient or VARIANTS[self.variant][1]

    @property
    def dropout(self) -> float:
        if self.dropout_rate is not None:
            return self.dropout_rate
        return VARIANTS[self.variant][3]

    @property
    def resolution(self) -> int:
        """The variant's published input resolution, in pixels."""
        return VARIANTS[self.variant][2]


@dataclasses.dataclass(frozen=True, kw_only=True)
class EfficientNetConfig(resnet_config.ResNet50Config):
    """The EfficientNet benchmark config: ResNet-50's ImageNet settings with another model.

    Attributes:
      image_size: training and eval resolution in pixels; 0 means the variant's (224 for B0,
        600 for B7). It replaces `data.image_size`, which the benchmark sets from it.
    """

    image_size: int = 0
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.image_size, int) or self.image_size < 0:
            raise ConfigError(f"`image_size` ({self.image_size!r}) must be an integer >= 0.")

    @property
    def resolution(self) -> int:
        return self.image_size or self.model.resolution


def from_resnet(
    preset: resnet_config.ResNet50Config, *, model: ModelConfig, **changes
) -> EfficientNetConfig:
    """An EfficientNet config with `model` and every setting of the ResNet-50 config `preset`
    (sizes, schedule, optimizer, data) but those in `changes`: a preset on ResNet-50's data
    says only where it differs."""
    settings = {f.name: getattr(preset, f.name) for f in dataclasses.fields(preset)}
    return EfficientNetConfig(**{**settings, **changes, "model": model})


def mlperf() -> EfficientNetConfig:
    """The large-batch recipe of "Training EfficientNets at Supercomputer Scale".

    Source: Wongpanich, Pham, Demmel, Tan, Le, You, Kumar (2020), arXiv:2011.00071: global
    batch 65,536 on 1,024 TPU-v3 cores (a 2,048-core pod), LARS with warm-up and polynomial
    decay, distributed batch norm and label smoothing; 83 % ImageNet top-1 in 1 h 4 min (the
    abstract). Of B0-B7 only B5 and up publish a top-1 above 83 % (83.6 % for B5 in Tan & Le
    2019, Table 2), so this preset is B5 at its 456 px and the target is the paper's 0.83.
    The paper's exact learning rate, warm-up and epoch count could not be read offline here:
    the values below are the TPU reference implementation's flags
    (`tensorflow/tpu` `models/official/efficientnet/main.py`: `--optimizer=lars`,
    `lars_weight_decay=1e-5`, `lars_epsilon=0`, `label_smoothing=0.1`, `lr_warmup_epochs=5`,
    350 epochs, and its linear rule `base_learning_rate * batch / 256` with 0.016, i.e. 4.096
    at 65,536). Check them against the paper before a real run. BN groups span 128 examples per group (`batch_norm_batch_size` there):
    `model.bn_group_size` = 128 / per-replica batch (2 with 64 examples on each of 1,024
    replicas).

    Command: `mlperf-tf run --benchmark=efficientnet --preset=mlperf --model_dir=DIR
    --config.data_dir=/path/to/imagenet-tfrecords --submission_division=open`.
    Hardware: a TPU-v3-2048 (1,024 chips) class system. Expected: top-1 >= 0.83.
    """
    return EfficientNetConfig(
        global_batch_size=65536,
        eval_batch_size=65536,
        max_epochs=350.0,
        quality_target=0.83,
        eval_offset_epochs=0,
        model=ModelConfig(variant="b5", bn_group_size=2),
        # ResNet-50's LARS defaults already are the TPU flags' warm-up (5 epochs), epsilon (0)
        # and label smoothing (0.1), with polynomial power 2; these three differ.
        optimizer=resnet_config.OptimizerConfig(
            lars_opt_base_learning_rate=0.016 * 65536 / 256,
            lars_opt_end_learning_rate=0.0,
            lars_opt_weight_decay=1e-5,
        ),
    )


def mini() -> EfficientNetConfig:
    """EfficientNet-B0 on ResNet-50's offline mini data (scikit-learn's digits) at 32 px.

    Command: `mlperf-tf run --benchmark=efficientnet --preset=mini --model_dir=/tmp/effnet_mini
    --submission_division=open` (writes the digits as ImageNet TFRecords on first use).
    Hardware: a 2-core CPU. Expected: held-out top-1 >= 0.85 at the epoch-8 eval (measured
    0.850, 0.944, 0.922 for seeds 0, 1, 2; 0.967-0.978 at epoch 12), 72 s from run_start to
    run_stop at load average 1-4; epochs 12 and 16 decide when epoch 8 falls short.
    """
    # ResNet-50's mini data, batch, optimizer and eval cadence; a longer budget and its own
    # target, data directory and model.
    return from_resnet(
        resnet_config.mini(),
        max_epochs=16.0,
        quality_target=0.85,
        data_dir=paths.mini_data_dir(NAME),
        image_size=32,
        model=ModelConfig(num_classes=10, drop_connect_rate=0.0, dropout_rate=0.0, bn_momentum=0.9),
    )


def smoke() -> EfficientNetConfig:
    """A narrow, shallow EfficientNet on synthetic 32 px images: seconds on any CPU.

    Command: `mlperf-tf run --benchmark=efficientnet --preset=smoke --model_dir=/tmp/effnet_smoke
    --submission_division=open`. Quality: meaningless (random data); the run ends `aborted`.
    """
    # ResNet-50's smoke sizes, optimizer and synthetic 32 px data; another model.
    return from_resnet(
        resnet_config.smoke(),
        image_size=32,
        model=ModelConfig(num_classes=10, width_coefficient=0.25, depth_coefficient=0.34),
    )
