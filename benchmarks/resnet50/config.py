"""Provides the ResNet-50 config dataclasses and its presets `mlperf`, `mini` and `smoke`."""

from __future__ import annotations

import dataclasses

from mlperf_tf import paths
from mlperf_tf.config import BenchmarkConfig, ConfigError, require
from mlperf_tf.optimizers import registry

NAME = "resnet50"

# ImageNet-2012 sizes (the MLPerf reference's `NUM_IMAGES`).
IMAGENET_TRAIN_EXAMPLES = 1281167
IMAGENET_EVAL_EXAMPLES = 50000

# The mini dataset: scikit-learn's 1797 digits, split once into train and held-out images by
# `prepare.prepare_mini` (a stratified split with a fixed seed).
MINI_TRAIN_EXAMPLES = 1437
MINI_EVAL_EXAMPLES = 360


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """ResNet v1.5 shape and batch-norm settings.

    Attributes:
      num_classes: logits of the classifier (1000 for ImageNet).
      block_layers: bottleneck blocks per stage; (3, 4, 6, 3) is ResNet-50.
      base_width: filters of the first stage's 3x3 convolutions (64 in ResNet-50); stage k
        uses `base_width * 2**k`, and each bottleneck's output has 4x that.
      bn_momentum: decay of the batch-norm moving averages (the MLPerf reference: 0.9).
      bn_epsilon: batch-norm variance epsilon (the MLPerf reference: 1e-5).
      bn_group_size: replicas whose batches one batch-norm group normalizes over (1 = local BN;
        MLPerf's `model_bn_span` is this times the per-replica batch).
      zero_init_last_gamma: start the last batch-norm gamma of every residual block at 0, so
        each block starts as the identity (Goyal et al. 2017; the MLPerf reference does it).
    """

    num_classes: int = 1000
    block_layers: tuple[int, ...] = (3, 4, 6, 3)
    base_width: int = 64
    bn_momentum: float = 0.9
    bn_epsilon: float = 1e-5
    bn_group_size: int = 1
    zero_init_last_gamma: bool = True

    def __post_init__(self):
        require(
            self,
            prefix="model.",
            positive_int=("num_classes", "base_width", "bn_group_size"),
            positive=("bn_epsilon",),
            fraction=("bn_momentum",),
        )
        if not self.block_layers or any(not isinstance(n, int) or n < 1 for n in self.block_layers):
            raise ConfigError(
                f"`model.block_layers` ({self.block_layers!r}) must be positive integers."
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """The optimizer and its schedule; fields are named after their MLPerf log keys.

    `opt_name` picks LARS (the `lars_*` fields) or SGD with momentum (the `sgd_*` fields and
    `opt_learning_rate_warmup_epochs`), or any optimizer of the registry
    (`mlperf_tf.optimizers.registry`: neumann, nlcg, kfac, or a plug-in's), which runs on the
    `lars_*` schedule with its own hyperparameters from `opt_params` ("key=value" strings) or
    the fields above of the same names; all use a linear warmup from 0 and then a polynomial
    decay to the end learning rate over the remaining steps (MLPerf's
    `*_opt_learning_rate_decay_steps` is derived from the run length, not set here).

    Weight decay adds `wd * w` to the gradient of every convolution and dense kernel, never to
    batch-norm parameters or biases: inside the update for LARS, as an L2 term `wd/2 * |w|^2`
    in the loss for SGD.

    Attributes:
      label_smoothing: of the one-hot targets of the cross entropy (MLPerf: 0.1).
      lars_eeta: LARS' trust coefficient (not an MLPerf log key; the reference uses 0.001).
    """

    opt_name: str = "lars"
    opt_params: tuple[str, ...] = ()
    label_smoothing: float = 0.1

    lars_opt_base_learning_rate: float = 10.0
    lars_opt_end_learning_rate: float = 1e-4
    lars_opt_learning_rate_decay_poly_power: float = 2.0
    lars_opt_learning_rate_warmup_epochs: float = 5.0
    lars_opt_momentum: float = 0.9
    lars_opt_weight_decay: float = 2e-4
    lars_epsilon: float = 0.0
    lars_eeta: float = 0.001

    sgd_opt_base_learning_rate: float = 0.1
    sgd_opt_end_learning_rate: float = 1e-4
    sgd_opt_learning_rate_decay_poly_power: float = 2.0
    opt_learning_rate_warmup_epochs: float = 5.0
    sgd_opt_momentum: float = 0.9
    sgd_opt_weight_decay: float = 1e-4

    def __post_init__(self):
        registry.check_opt_name(self.opt_name, native=("lars", "sgd"))
        numbers = [
            f.name
            for f in dataclasses.fields(self)
            if f.name.startswith(("lars_", "sgd_", "opt_l"))
        ]
        momenta = ("lars_opt_momentum", "sgd_opt_momentum")
        require(
            self,
            prefix="optimizer.",
            non_negative=[
                n
                for n in numbers
                if n not in momenta + ("lars_eeta",) and not n.endswith("base_learning_rate")
            ],
            positive=("lars_eeta", *(n for n in numbers if n.endswith("base_learning_rate"))),
            fraction=("label_smoothing", *momenta),
        )

    @property
    def _prefix(self) -> str:
        """The schedule fields' prefix: `sgd` for SGD, `lars` for LARS and registry optimizers."""
        return "sgd" if self.opt_name == "sgd" else "lars"

    @property
    def base_learning_rate(self) -> float:
        return getattr(self, f"{self._prefix}_opt_base_learning_rate")

    @property
    def end_learning_rate(self) -> float:
        return getattr(self, f"{self._prefix}_opt_end_learning_rate")

    @property
    def poly_power(self) -> float:
        return getattr(self, f"{self._prefix}_opt_learning_rate_decay_poly_power")

    @property
    def warmup_epochs(self) -> float:
        if self.opt_name != "sgd":
            return self.lars_opt_learning_rate_warmup_epochs
        return self.opt_learning_rate_warmup_epochs

    @property
    def momentum(self) -> float:
        return getattr(self, f"{self._prefix}_opt_momentum")

    @property
    def weight_decay(self) -> float:
        return getattr(self, f"{self._prefix}_opt_weight_decay")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Input pipeline settings (`input.py`).

    Attributes:
      image_size: side of the square training and eval images, in pixels (224 for ImageNet).
      crop_padding: eval center crop keeps `image_size / (image_size + crop_padding)` of the
        shorter side before resizing (32 at 224: "resize 256, center-crop 224").
      area_range: fraction of the image area a random training crop covers (min, max).
      aspect_ratio_range: width/height of the random crop (min, max).
      min_object_covered: fraction of the labelled bounding box a crop must contain.
      crop_max_attempts: random crops tried before falling back to the center crop.
      random_flip: flip training images left-right with probability 0.5.
      mean_rgb, stddev_rgb: per-channel normalization, in 0..255 pixel units.
      label_offset: subtracted from `image/class/label` to give a 0-based class. ImageNet
        TFRecords written by `prepare.py` (like the TPU tools' `imagenet_to_gcs.py`) store
        1..1000, hence the default 1; use 0 for records that store 0..999.
      train_pattern, eval_pattern: file globs inside `data_dir`.
      shuffle_buffer: examples in the training shuffle buffer (per input pipeline).
      cache_train: cache the training records in memory after the first epoch (small sets).
    """

    image_size: int = 224
    crop_padding: int = 32
    area_range: tuple[float, ...] = (0.05, 1.0)
    aspect_ratio_range: tuple[float, ...] = (0.75, 1.33)
    min_object_covered: float = 0.1
    crop_max_attempts: int = 100
    random_flip: bool = True
    mean_rgb: tuple[float, ...] = (123.675, 116.28, 103.53)
    stddev_rgb: tuple[float, ...] = (58.395, 57.12, 57.375)
    label_offset: int = 1
    train_pattern: str = "train-*"
    eval_pattern: str = "validation-*"
    shuffle_buffer: int = 10000
    cache_train: bool = False

    def __post_init__(self):
        require(
            self,
            prefix="data.",
            positive_int=("image_size", "shuffle_buffer", "crop_max_attempts"),
            non_negative_int=("crop_padding",),
        )
        for name in ("area_range", "aspect_ratio_range"):
            low_high = getattr(self, name)
            if len(low_high) != 2 or not 0 < low_high[0] <= low_high[1]:
                raise ConfigError(
                    f"`data.{name}` ({low_high!r}) must be (min, max), 0 < min <= max."
                )
        if self.area_range[1] > 1.0:
            raise ConfigError(f"`data.area_range` ({self.area_range!r}) must end at <= 1.")
        for name in ("mean_rgb", "stddev_rgb"):
            if len(getattr(self, name)) != 3:
                raise ConfigError(f"`data.{name}` ({getattr(self, name)!r}) needs 3 values (RGB).")
        if any(s <= 0 for s in self.stddev_rgb):
            raise ConfigError(f"`data.stddev_rgb` ({self.stddev_rgb!r}) must be positive.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResNet50Config(BenchmarkConfig):
    """The ResNet-50 benchmark config (the defaults are the `mlperf` preset's).

    MLPerf evaluates every 4 epochs (`eval_every_epochs`), the first after 1, 2, 3 or 4
    (`eval_offset_epochs`; 0 means after `eval_every_epochs`): whole epochs, so both are ints.
    """

    global_batch_size: int = 4096
    eval_batch_size: int = 4096
    train_examples: int = IMAGENET_TRAIN_EXAMPLES
    eval_examples: int = IMAGENET_EVAL_EXAMPLES
    max_epochs: float = 42.0
    quality_target: float = 0.759
    eval_every_epochs: int = 4
    eval_offset_epochs: int = 2
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)

    def __post_init__(self):
        super().__post_init__()
        require(self, positive_int=("eval_every_epochs",), non_negative_int=("eval_offset_epochs",))


def mlperf() -> ResNet50Config:
    """The MLCommons TF2 reference recipe (v1.0, TPU-v3-64, global batch 4096, LARS).

    Command: `mlperf-tf run --benchmark=resnet50 --preset=mlperf --model_dir=DIR
    --config.data_dir=/path/to/imagenet-tfrecords`. Hardware: a TPU-v3-64-class system (or
    8+ GPUs: see the README for the 2048 = 1024 x 2 accumulation variant). Expected: top-1
    >= 0.759 after about 38-42 epochs (MLPerf's reference converges in ~35-41).
    Source: mlcommons/training `image_classification/README.md` (TF2 reference flags:
    `--batch_size=4096 --base_learning_rate=10.0 --warmup_epochs=5 --weight_decay=0.0002
    --momentum=0.9 --lars_epsilon=0 --label_smoothing=0.1 --train_epochs=42
    --epochs_between_evals=4 --eval_offset_epochs=2`), `lars_util.py` (end LR 1e-4, power 2).
    """
    return ResNet50Config()


def mini() -> ResNet50Config:
    """ResNet-50 on scikit-learn's bundled 8x8 digits at 32 px, written as ImageNet TFRecords.

    Command: `mlperf-tf run --benchmark=resnet50 --preset=mini --model_dir=/tmp/resnet50_mini`
    (writes the data on first use into `mlperf_tf.paths.mini_data_dir("resnet50")`).
    Hardware: a 2-core CPU. Expected: held-out top-1 >= 0.90 at the first eval (epoch 4;
    measured 0.91-0.98 over 4 runs, which differ in data order), run_start to run_stop 2.3-3.5
    minutes on 2 cores shared at load average 12-15; if epoch 4 falls short, epoch 8 decides. The logged hyperparameters are legal under the closed
    ResNet rules of MLPerf 0.7.0 and 1.0.0 (end LR 1e-4, power 2, epsilon 0, weight decay
    1e-4 * 2^k).
    """
    return ResNet50Config(
        global_batch_size=32,
        eval_batch_size=120,
        train_examples=MINI_TRAIN_EXAMPLES,
        eval_examples=MINI_EVAL_EXAMPLES,
        max_epochs=20.0,
        quality_target=0.90,
        eval_offset_epochs=0,
        data_dir=paths.mini_data_dir(NAME),
        model=ModelConfig(num_classes=10),
        optimizer=OptimizerConfig(
            lars_opt_base_learning_rate=2.0,
            lars_opt_learning_rate_warmup_epochs=1.0,
            lars_opt_weight_decay=1e-4,
        ),
        data=DataConfig(
            image_size=32,
            crop_padding=4,
            area_range=(0.5, 1.0),
            random_flip=False,
            shuffle_buffer=2000,
            cache_train=True,
        ),
    )


def smoke() -> ResNet50Config:
    """A tiny ResNet (one bottleneck per stage, width 8) on synthetic 32 px images.

    Command: `mlperf-tf run --benchmark=resnet50 --preset=smoke --model_dir=/tmp/resnet50_smoke`.
    Hardware: any CPU; seconds. Quality: meaningless (random data); the run ends `aborted`
    after its epoch budget. It exercises every code path of a real run and its MLPerf log.
    """
    return ResNet50Config(
        global_batch_size=16,
        eval_batch_size=16,
        train_examples=64,
        eval_examples=40,
        max_epochs=8.0,
        eval_offset_epochs=0,
        data_dir="",
        model=ModelConfig(num_classes=10, block_layers=(1, 1, 1, 1), base_width=8),
        optimizer=OptimizerConfig(
            lars_opt_base_learning_rate=1.0, lars_opt_learning_rate_warmup_epochs=1.0
        ),
        data=DataConfig(image_size=32, crop_padding=4),
    )
