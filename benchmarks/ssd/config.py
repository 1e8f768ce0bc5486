"""Provides the SSD-ResNet34 config dataclasses and its presets `mlperf`, `mini` and `smoke`."""

from __future__ import annotations

import dataclasses

from mlperf_tf import paths
from mlperf_tf.config import BenchmarkConfig, ConfigError, require
from mlperf_tf.optimizers import registry

NAME = "ssd"

# COCO 2017: train images with at least one annotation (the reference skips empty images;
# MLPerf logs train_samples=117266) and all val images.
COCO_TRAIN_EXAMPLES = 117266
COCO_EVAL_EXAMPLES = 5000

# The 80 COCO category ids in the annotation files (1..90 with gaps); contiguous class k
# (1..80; 0 is background) is COCO_CATEGORY_IDS[k - 1].
COCO_CATEGORY_IDS = (
    (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 27)
    + (28, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 46, 47, 48, 49, 50, 51, 52)
    + (53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 67, 70, 72, 73, 74, 75, 76, 77, 78)
    + (79, 80, 81, 82, 84, 85, 86, 87, 88, 89, 90)
)

# The mini dataset (`prepare.prepare_mini`): canvases with scikit-learn's 8x8 digits pasted on
# them; COCO category id d + 1 is digit d.
MINI_TRAIN_EXAMPLES = 2000
MINI_EVAL_EXAMPLES = 250
MINI_CATEGORY_IDS = tuple(range(1, 11))

# MLPerf SSD300 layout (the reference's `dboxes300_coco` and `SSD300`).
SSD300_STEPS = (8.0, 16.0, 32.0, 64.0, 100.0, 300.0)
SSD300_SCALES = (21.0, 45.0, 99.0, 153.0, 207.0, 261.0, 315.0)
SSD300_ASPECT_RATIOS = ((2,), (2, 3), (2, 3), (2, 3), (2,), (2,))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Model shape, default boxes and batch norm (`model.py`, `anchors.py`).

    The defaults are MLPerf's SSD300 with the ResNet-34 backbone (8732 default boxes).

    Attributes:
      num_classes: class logits per default box, background (0) included: 81 for COCO.
      image_size: side of the square input in pixels (300).
      backbone_blocks: basic blocks in conv2_x, conv3_x, conv4_x ((3, 4, 6): ResNet-34).
      width_scale: multiplies every channel count (1.0; the mini/smoke variants are thinner).
      extra_mid_channels: 1x1 convolution width of each extra block.
      extra_channels: output width of each extra block (a detection level each).
      extra_strides, extra_paddings: of each extra block's 3x3 convolution ((2, 2, 2, 1, 1)
        and (1, 1, 1, 0, 0): 38 -> 19 -> 10 -> 5 -> 3 -> 1 at 300 px).
      extra_batch_norm: batch norm after the extra blocks' convolutions (the reference has none).
      anchor_steps, anchor_scales, anchor_aspect_ratios: the default boxes, in pixels
        (the reference's `steps`, `scales` and `aspect_ratios`). The aspect ratios cannot be
        set from a flag (nested tuple); change them in a preset.
      bn_momentum, bn_epsilon: batch norm (PyTorch's momentum 0.1 is Keras' 0.9).
      bn_group_size: replicas one batch-norm group spans (`model_bn_span` = this x the
        per-replica batch).
      backbone_checkpoint: a `.weights.h5` file of the backbone (`model.build_backbone`) to
        start from (the reference starts from ImageNet ResNet-34 weights); "" starts from a
        random initialization.
    """

    num_classes: int = 81
    image_size: int = 300
    backbone_blocks: tuple[int, ...] = (3, 4, 6)
    width_scale: float = 1.0
    extra_mid_channels: tuple[int, ...] = (256, 256, 128, 128, 128)
    extra_channels: tuple[int, ...] = (512, 512, 256, 256, 256)
    extra_strides: tuple[int, ...] = (2, 2, 2, 1, 1)
    extra_paddings: tuple[int, ...] = (1, 1, 1, 0, 0)
    extra_batch_norm: bool = False
    anchor_steps: tuple[float, ...] = SSD300_STEPS
    anchor_scales: tuple[float, ...] = SSD300_SCALES
    anchor_aspect_ratios: tuple[tuple[int, ...], ...] = SSD300_ASPECT_RATIOS
    bn_momentum: float = 0.9
    bn_epsilon: float = 1e-5
    bn_group_size: int = 1
    backbone_checkpoint: str = ""

    def __post_init__(self):
        require(
            self,
            prefix="model.",
            positive_int=("num_classes", "image_size", "bn_group_size"),
            positive=("width_scale", "bn_epsilon"),
            fraction=("bn_momentum",),
        )
        if self.num_classes < 2:
            raise ConfigError(
                f"`model.num_classes` ({self.num_classes}) must count background too."
            )
        if len(self.backbone_blocks) != 3 or any(
            not isinstance(n, int) or n < 1 for n in self.backbone_blocks
        ):
            raise ConfigError(
                f"`model.backbone_blocks` ({self.backbone_blocks!r}) must be 3 positive integers."
            )
        extras = len(self.extra_channels)
        for name in ("extra_mid_channels", "extra_strides", "extra_paddings"):
            if len(getattr(self, name)) != extras:
                raise ConfigError(
                    f"`model.{name}` ({getattr(self, name)!r}) needs one entry per extra block "
                    f"({extras}, as `model.extra_channels`)."
                )
        levels = extras + 1
        if len(self.anchor_steps) != levels or len(self.anchor_aspect_ratios) != levels:
            raise ConfigError(
                f"`model.anchor_steps` and `model.anchor_aspect_ratios` need one entry per "
                f"detection level ({levels}); got {len(self.anchor_steps)} and "
                f"{len(self.anchor_aspect_ratios)}."
            )
        if len(self.anchor_scales) != levels + 1:
            raise ConfigError(
                f"`model.anchor_scales` ({self.anchor_scales!r}) needs levels + 1 = "
                f"{levels + 1} values."
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class LossConfig:
    """Matching and loss (`loss.py`; the reference's `Encoder.encode` and `Loss`).

    Attributes:
      match_iou_threshold: default boxes with IoU > this to a ground-truth box are positives
        (plus the best default box of each ground-truth box).
      negative_ratio: hard-negative mining keeps this many negatives per positive (3).
      max_num_boxes: ground-truth boxes per image after padding (more are dropped).
    """

    match_iou_threshold: float = 0.5
    negative_ratio: float = 3.0
    max_num_boxes: int = 100

    def __post_init__(self):
        if not 0.0 < self.match_iou_threshold < 1.0:
            raise ConfigError(
                f"`loss.match_iou_threshold` ({self.match_iou_threshold!r}) must be in (0, 1)."
            )
        require(
            self, prefix="loss.", positive_int=("max_num_boxes",), non_negative=("negative_ratio",)
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """SGD with momentum, L2 weight decay and MLPerf SSD's warmup + step schedule.

    Fields named `opt_*` are the MLPerf log keys. The learning rate is
    `opt_base_learning_rate`, or when that is None the reference's linear scaling
    `reference_learning_rate * global_batch_size / reference_batch_size` (2.5e-3 per 32
    images). Weight decay is the reference's (PyTorch SGD `weight_decay`): `wd * w` added to
    the gradient of every variable, batch-norm and biases included.

    Attributes:
      momentum: SGD momentum (0.9).
      opt_learning_rate_warmup_steps: steps of the reference's linear warmup (MLPerf requires
        >= 1).
      opt_learning_rate_warmup_factor: f of the reference's warmup, which starts at
        `lr * (1 - 2**-f)` (0: from zero).
      opt_learning_rate_decay_boundary_epochs: the learning rate is multiplied by
        `learning_rate_decay_factor` at each of these epochs ((40, 50); MLPerf allows
        `40 * (1 + k/10)` and `50 * (1 + k/10)`).
    """

    # sgd (the reference), or any registered optimizer (`mlperf_tf.optimizers.registry`) on the
    # same schedule and loss (weight decay stays the loss' L2 term), with `opt_params` "key=value"s.
    opt_name: str = "sgd"
    opt_params: tuple[str, ...] = ()
    opt_base_learning_rate: float | None = None
    reference_learning_rate: float = 2.5e-3
    reference_batch_size: int = 32
    momentum: float = 0.9
    opt_weight_decay: float = 5e-4
    opt_learning_rate_warmup_steps: int = 500
    opt_learning_rate_warmup_factor: float = 0.0
    opt_learning_rate_decay_boundary_epochs: tuple[int, ...] = (40, 50)
    learning_rate_decay_factor: float = 0.1

    def __post_init__(self):
        registry.check_opt_name(self.opt_name, native=("sgd",))
        if self.opt_base_learning_rate is not None and not self.opt_base_learning_rate > 0:
            raise ConfigError(
                f"`optimizer.opt_base_learning_rate` ({self.opt_base_learning_rate!r}) must be "
                "positive (or None to scale the reference's)."
            )
        require(
            self,
            prefix="optimizer.",
            positive=("reference_learning_rate",),
            positive_int=("reference_batch_size",),
            fraction=("momentum",),
            non_negative=("opt_weight_decay", "opt_learning_rate_warmup_factor"),
            non_negative_int=("opt_learning_rate_warmup_steps",),
        )
        bounds = self.opt_learning_rate_decay_boundary_epochs
        if any(b <= 0 for b in bounds) or any(b2 <= b1 for b1, b2 in zip(bounds, bounds[1:])):
            raise ConfigError(
                f"`optimizer.opt_learning_rate_decay_boundary_epochs` ({bounds!r}) must be "
                "positive and increasing."
            )
        if not 0.0 <= self.learning_rate_decay_factor <= 1.0:
            raise ConfigError(
                f"`optimizer.learning_rate_decay_factor` ({self.learning_rate_decay_factor!r}) "
                "must be in [0, 1]."
            )

    def base_learning_rate(self, global_batch_size: int) -> float:
        """The learning rate after warmup, before decay, for `global_batch_size` examples."""
        if self.opt_base_learning_rate is not None:
            return self.opt_base_learning_rate
        return self.reference_learning_rate * global_batch_size / self.reference_batch_size


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Input pipeline (`input.py`) and data layout (`prepare.py`).

    Attributes:
      train_pattern, eval_pattern: TFRecord globs inside `data_dir`.
      val_annotations: the COCO instances json of the eval images (pycocotools ground truth),
        relative to `data_dir` unless absolute.
      category_ids: the dataset's category ids; contiguous class k is `category_ids[k - 1]`.
      max_samples: crop trials per chosen minimum IoU in SSD's random crop (MLPerf's
        `max_samples`: 1 in the reference, 50 allowed).
      random_flip: flip training images left-right with probability 0.5.
      color_jitter: the reference's ColorJitter (brightness 0.125, contrast 0.5, saturation
        0.5, hue 0.05).
      mean_rgb, stddev_rgb: normalization in 0..255 pixel units (ImageNet's, as torchvision).
      drop_crowd: leave `is_crowd` boxes out of the training targets.
      shuffle_buffer: training examples in the shuffle buffer (per input pipeline).
      cache_train: cache the encoded training records in memory (small datasets).
    """

    train_pattern: str = "train-*"
    eval_pattern: str = "val-*"
    val_annotations: str = "annotations/instances_val2017.json"
    category_ids: tuple[int, ...] = COCO_CATEGORY_IDS
    max_samples: int = 1
    random_flip: bool = True
    color_jitter: bool = True
    mean_rgb: tuple[float, ...] = (123.675, 116.28, 103.53)
    stddev_rgb: tuple[float, ...] = (58.395, 57.12, 57.375)
    drop_crowd: bool = True
    shuffle_buffer: int = 10000
    cache_train: bool = False

    def __post_init__(self):
        require(self, prefix="data.", positive_int=("max_samples", "shuffle_buffer"))
        if not self.category_ids or len(set(self.category_ids)) != len(self.category_ids):
            raise ConfigError(f"`data.category_ids` ({self.category_ids!r}) must be distinct ids.")
        if min(self.category_ids) < 0:
            raise ConfigError(f"`data.category_ids` ({self.category_ids!r}) must be >= 0.")
        for name in ("mean_rgb", "stddev_rgb"):
            if len(getattr(self, name)) != 3:
                raise ConfigError(f"`data.{name}` ({getattr(self, name)!r}) needs 3 values (RGB).")
        if any(s <= 0 for s in self.stddev_rgb):
            raise ConfigError(f"`data.stddev_rgb` ({self.stddev_rgb!r}) must be positive.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """Detection post-processing (`postprocess.py`; the reference's `decode_batch`).

    Attributes:
      nms_iou_threshold: per-class NMS drops boxes with IoU >= this to a kept one (0.5).
      score_threshold: boxes need a class probability > this (0.05).
      max_candidates_per_class: highest-scoring boxes per class that enter NMS (200).
      max_detections: detections kept per image (200).
    """

    nms_iou_threshold: float = 0.5
    score_threshold: float = 0.05
    max_candidates_per_class: int = 200
    max_detections: int = 200

    def __post_init__(self):
        if not 0.0 < self.nms_iou_threshold <= 1.0:
            raise ConfigError(
                f"`eval.nms_iou_threshold` ({self.nms_iou_threshold!r}) must be in (0, 1]."
            )
        require(
            self,
            prefix="eval.",
            fraction=("score_threshold",),
            positive_int=("max_candidates_per_class", "max_detections"),
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class SSDConfig(BenchmarkConfig):
    """The SSD-ResNet34 benchmark config (the defaults are the `mlperf` preset's).

    MLPerf evaluates every 5 epochs (`eval_every_epochs`).
    """

    global_batch_size: int = 256
    eval_batch_size: int = 256
    train_examples: int = COCO_TRAIN_EXAMPLES
    eval_examples: int = COCO_EVAL_EXAMPLES
    max_epochs: float = 70.0
    quality_target: float = 0.23
    eval_every_epochs: int = 5
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)

    def __post_init__(self):
        super().__post_init__()
        if len(self.data.category_ids) != self.model.num_classes - 1:
            raise ConfigError(
                f"`data.category_ids` has {len(self.data.category_ids)} ids but "
                f"`model.num_classes` ({self.model.num_classes}) needs num_classes - 1."
            )


def mlperf() -> SSDConfig:
    """MLPerf SSD-ResNet34 on COCO 2017 (closed division rules of v0.7 / v1.0).

    Command: `mlperf-tf run --benchmark=ssd --preset=mlperf --model_dir=DIR
    --config.data_dir=/path/to/coco-tfrecords
    --config.model.backbone_checkpoint=/path/to/resnet34_imagenet.weights.h5`
    (data from `python -m benchmarks.ssd.prepare --coco_dir=...`). Hardware: 8 accelerators
    (e.g. a TPU-v3-8 or 8 GPUs; global batch 256, 32 per replica). Expected: box mAP >= 0.23
    after about 45-55 epochs with an ImageNet backbone (MLPerf submissions: ~45-60).
    Hyperparameters (reference `train.py`): SGD momentum 0.9, weight decay 5e-4, LR
    2.5e-3 x 256/32 = 0.02, linear warmup, x0.1 at epochs 40 and 50, eval every 5 epochs.
    """
    return SSDConfig()


def small_model(**fields) -> ModelConfig:
    """The reduced-input SSD of the mini and smoke presets (128 px, 5 levels, 1524 boxes).

    At 128 px the backbone ends at 16x16; four stride-2 extra blocks give 8, 4, 2, 1 (the
    SSD300 layout needs >= 264 px for its two unpadded 3x3 blocks). Default boxes keep SSD300's
    recipe: steps = pixels per cell, scales spread from 8 % to 88 % of the image, aspect ratios
    2 (and 3 on the middle levels).
    """
    defaults = dict(
        num_classes=len(MINI_CATEGORY_IDS) + 1,
        image_size=128,
        width_scale=0.25,
        extra_mid_channels=(256, 256, 128, 128),
        extra_channels=(512, 512, 256, 256),
        extra_strides=(2, 2, 2, 2),
        extra_paddings=(1, 1, 1, 1),
        anchor_steps=(8.0, 16.0, 32.0, 64.0, 128.0),
        anchor_scales=(10.0, 20.0, 36.0, 56.0, 80.0, 112.0),
        anchor_aspect_ratios=((2,), (2, 3), (2, 3), (2,), (2,)),
    )
    defaults.update(fields)
    return ModelConfig(**defaults)


def mini() -> SSDConfig:
    """SSD on canvases of scikit-learn's 8x8 digits (10 classes): thin ResNet-34, 128 px input.

    Command: `mlperf-tf run --benchmark=ssd --preset=mini --model_dir=/tmp/ssd_mini` (writes the
    data on first use into `mlperf_tf.paths.mini_data_dir("ssd")`). Hardware: a 2-core CPU.
    Expected: held-out box mAP >= 0.23 at the eval after epoch 10 (20k images; 0.34-0.42 in
    the runs measured, 0.11-0.25 after epoch 5). Measured: 6.8-9.5 min from run_start to
    run_stop, 7.3-11.2 min wall including writing the data, on 2 cores shared with other jobs
    (load average 4.5-11); see README.md.

    Reduced model (not the SSD300 layout): `small_model` at 128 px (1524 default boxes), 1/4
    width with ResNet-34's depth, and batch norm in the extra blocks (the reference has none;
    from scratch, without an ImageNet backbone, it lifted the epoch-10 mAP from 0.35 to 0.41
    here). No flip (digits are not mirror-symmetric), no color jitter. Every logged
    hyperparameter is legal under closed_ssd 0.7.0 and 1.0.0 unmodified: LR 0.02 (not pinned
    by the rules), weight decay 5e-4, warmup 100 steps with factor 0, decay boundaries (20, 25)
    = (40, 50) x (1 - 5/10), max_samples 1; target 0.23, eval every 5 epochs.
    """
    return SSDConfig(
        global_batch_size=32,
        eval_batch_size=50,
        train_examples=MINI_TRAIN_EXAMPLES,
        eval_examples=MINI_EVAL_EXAMPLES,
        max_epochs=40.0,
        data_dir=paths.mini_data_dir(NAME),
        model=small_model(extra_batch_norm=True),
        loss=LossConfig(max_num_boxes=8),
        optimizer=OptimizerConfig(
            opt_base_learning_rate=0.02,
            opt_learning_rate_warmup_steps=100,
            opt_learning_rate_decay_boundary_epochs=(20, 25),
        ),
        data=DataConfig(
            val_annotations="annotations/instances_val.json",
            category_ids=MINI_CATEGORY_IDS,
            random_flip=False,
            color_jitter=False,
            shuffle_buffer=MINI_TRAIN_EXAMPLES,
            cache_train=True,
        ),
    )


def smoke() -> SSDConfig:
    """A tiny SSD (one block per stage, 1/8 width, 128 px) on synthetic images and boxes.

    Command: `mlperf-tf run --benchmark=ssd --preset=smoke --model_dir=/tmp/ssd_smoke`.
    Hardware: any CPU; seconds. Quality: meaningless (random images); the run ends `aborted`
    after 10 epochs of 2 steps, with evals after epochs 5 and 10 (MLPerf's cadence). It
    exercises every code path of a run, its eval (scored by pycocotools against the synthetic
    boxes) and its MLPerf log.
    """
    return SSDConfig(
        global_batch_size=4,
        eval_batch_size=4,
        train_examples=8,
        eval_examples=6,
        max_epochs=10.0,
        data_dir="",
        model=small_model(width_scale=0.125, backbone_blocks=(1, 1, 1)),
        loss=LossConfig(max_num_boxes=4),
        optimizer=OptimizerConfig(opt_learning_rate_warmup_steps=2),
        data=DataConfig(category_ids=MINI_CATEGORY_IDS),
    )
