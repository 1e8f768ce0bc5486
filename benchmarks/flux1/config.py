"""Provides `FluxConfig`, the FLUX.1 text-to-image benchmark's frozen config, and its presets.

The MLPerf reference is torchtitan's `experiments/flux` at the commit `mlcommons/training`
pins as `text_to_image/torchtitan` (9603aa83): the model is `model/model.py:FluxModelArgs`
(FLUX.1-schnell, `context_in_dim` 4,096 from the config's `encoder.context_in_dim`), the
objective and eval `train.py`, the settings `train_configs/flux_schnell_mlperf_preprocessed.toml`.
Learning rate and warm-up per batch size come from the reference convergence points
(`mlperf_logging/rcp_checker/training_6.1.0/rcps_flux1.json`). README.md says where each
setting comes from.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from mlperf_tf import paths, rcps
from mlperf_tf.config import (
    SMOKE_BATCH,
    BenchmarkConfig,
    ConfigError,
    require,
    require_adamw,
    smoke_sizes,
)

# What the closed rules of 5.1.0-6.1.0 and the reference fix.
TRAIN_SAMPLES = 1_099_776  # the CC12M subset (text_to_image/README.md)
EVAL_SAMPLES = 29_696  # the COCO-2014 subset
EVAL_EVERY_SAMPLES = 262_144  # closed_flux1.yaml `evaluation_frequency`; toml `eval.eval_freq`
TARGET_EVAL_LOSS = 0.586
EVAL_TIMESTEPS = 8  # a validation sample's timestep is k / 8, k in 0..7 (README "Quality")
RCP_FILE = "rcp_checker/training_6.1.0/rcps_flux1.json"
# The 2x2 patching (utils.py pack_latents) and the autoencoder's 8x downscale (README: 256->32).
PATCH = 2
AUTOENCODER_DOWNSCALE = 8
# torch.nn.RMSNorm(dim) with eps=None uses torch.finfo(dtype).eps (float32 parameters).
TORCH_FLOAT32_EPS = float(np.finfo(np.float32).eps)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The MMDiT's shape; the defaults are FLUX.1-schnell (`FluxModelArgs`, no guidance input).

    `in_channels` counts a patch's features: latent channels x 2 x 2.
    """

    in_channels: int = 64
    vec_in_dim: int = 768  # CLIP ViT-L pooled
    context_in_dim: int = 4096  # T5-XXL
    hidden_size: int = 3072
    mlp_ratio: float = 4.0
    num_heads: int = 24
    depth: int = 19  # double-stream blocks
    depth_single_blocks: int = 38
    axes_dim: tuple[int, ...] = (16, 56, 56)
    theta: int = 10_000
    qkv_bias: bool = True
    norm_epsilon: float = 1e-6  # the LayerNorms (no affine)
    qk_norm_epsilon: float = TORCH_FLOAT32_EPS
    init_std: float = 0.02  # MLPEmbedder.init_weights
    time_embedding_dim: int = 256

    def __post_init__(self):
        require(
            self,
            prefix="model.",
            positive_int=("in_channels", "vec_in_dim", "context_in_dim", "hidden_size",
                          "num_heads", "theta", "time_embedding_dim"),
            non_negative_int=("depth", "depth_single_blocks"),
            positive=("mlp_ratio", "norm_epsilon", "qk_norm_epsilon", "init_std"),
        )  # fmt: skip
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"`model.hidden_size` ({self.hidden_size}) must be divisible by "
                f"`model.num_heads` ({self.num_heads})."
            )
        head_dim = self.hidden_size // self.num_heads
        axes = tuple(self.axes_dim)
        if len(axes) != 3 or sum(axes) != head_dim or any(a <= 0 or a % 2 for a in axes):
            raise ConfigError(
                f"`model.axes_dim` ({axes}) must be three positive even sizes summing to the "
                f"head dimension ({head_dim}): the 3-axis rotary positions."
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def mlp_hidden(self) -> int:
        return int(self.hidden_size * self.mlp_ratio)

    def parameter_count(self) -> int:
        """Parameters of this shape from the config alone (nothing is allocated).

        Embedders: img_in (c x h + h), txt_in (t x h + h), time_in and vector_in MLPEmbedders
        (in x h + h + h x h + h). A double block, per stream: modulation (h x 6h + 6h), qkv
        (h x 3h [+ 3h]), the q and k RMSNorm scales (2 d), proj (h x h + h), MLP (h x m + m +
        m x h + h). A single block: modulation (h x 3h + 3h), linear1 (h x (3h + m) + 3h + m),
        linear2 ((h + m) x h + h), 2 d. The last layer: adaLN (h x 2h + 2h), linear (h x c + c).
        The LayerNorms have no parameters.
        """
        h, m, d, c = self.hidden_size, self.mlp_hidden, self.head_dim, self.in_channels
        qkv_bias = 3 * h if self.qkv_bias else 0
        embed = (c * h + h) + (self.context_in_dim * h + h)
        embed += 2 * (h * h + h) + (self.time_embedding_dim + self.vec_in_dim) * h + 2 * h
        stream = (h * 6 * h + 6 * h) + (h * 3 * h + qkv_bias) + 2 * d + (h * h + h)
        stream += h * m + m + m * h + h
        single = (h * 3 * h + 3 * h) + (h * (3 * h + m) + 3 * h + m) + ((h + m) * h + h) + 2 * d
        last = (h * 2 * h + 2 * h) + (h * c + c)
        return embed + self.depth * 2 * stream + self.depth_single_blocks * single + last

    def forward_flops(self, image_tokens: int, text_tokens: int) -> float:
        """Forward FLOPs of one sample (a multiply-add is 2): every projection's weights per
        token that passes through it, plus attention's scores and context products over the
        joint sequence (2 x 2 x L^2 x h per block)."""
        h, m, c = self.hidden_size, self.mlp_hidden, self.in_channels
        length = image_tokens + text_tokens
        per_stream_token = 3 * h * h + h * h + 2 * h * m  # qkv, proj, MLP
        double = 2.0 * per_stream_token * length + 4.0 * length * length * h
        single = 2.0 * (h * (3 * h + m) + (h + m) * h) * length + 4.0 * length * length * h
        embed = 2.0 * (c * h * image_tokens + self.context_in_dim * h * text_tokens)
        last = 2.0 * h * c * image_tokens
        return embed + self.depth * double + self.depth_single_blocks * single + last


def flux_schnell() -> ModelConfig:
    """FLUX.1-schnell: 19 double and 38 single blocks, hidden 3,072, 24 heads (11.9 B)."""
    return ModelConfig()


def tiny(*, in_channels: int = 16, vec: int = 8, context: int = 16) -> ModelConfig:
    """A one-double, one-single block MMDiT for tests and `smoke` (hidden 32, 2 heads of 16)."""
    return ModelConfig(
        in_channels=in_channels, vec_in_dim=vec, context_in_dim=context, hidden_size=32,
        num_heads=2, depth=1, depth_single_blocks=1, axes_dim=(4, 6, 6),
    )  # fmt: skip


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """AdamW and the warm-up-then-constant schedule; fields named after their MLPerf log keys.

    `opt_base_learning_rate` 0 and `opt_learning_rate_warmup_steps` -1 mean "the reference
    convergence point's for the global batch size" (`rcp_hparams`).
    """

    opt_base_learning_rate: float = 0.0
    opt_learning_rate_warmup_steps: int = -1
    opt_adamw_beta_1: float = 0.9
    opt_adamw_beta_2: float = 0.95
    opt_adamw_epsilon: float = 1e-8
    opt_adamw_weight_decay: float = 0.1

    def __post_init__(self):
        require_adamw(self)
        rcps.check_warmup_steps(self.opt_learning_rate_warmup_steps)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Preprocessed embeddings (TFRecords under `data_dir`, written by prepare.py) and how a
    training sample is made from them.

    Attributes:
      image_size: image side in pixels; the latent is image_size / latent_downscale a side and
        the 2x2 patching needs that even.
      latent_downscale: the autoencoder's downscale (8); 1 where the image is the latent (mini).
      latent_channels: channels of the latent (FLUX's autoencoder: 16).
      t5_length, t5_width: the T5 token encodings per caption ([256, 4096]).
      clip_width: the pooled CLIP vector (768).
      autoencoder_shift, autoencoder_scale: latent = (sample - shift) x scale (the toml's
        `encoder.autoencoder_shift/scale`).
      cfg_prob: probability that a training sample's encodings are replaced by the empty
        caption's (the toml's `training.classifer_free_guidance_prob`).
    """

    image_size: int = 256
    latent_downscale: int = AUTOENCODER_DOWNSCALE
    latent_channels: int = 16
    t5_length: int = 256
    t5_width: int = 4096
    clip_width: int = 768
    autoencoder_shift: float = 0.1159
    autoencoder_scale: float = 0.3611
    cfg_prob: float = 0.1
    train_pattern: str = "train/*.tfrecord"
    eval_pattern: str = "eval/*.tfrecord"
    empty_encodings: str = "empty_encodings.npz"
    shuffle_buffer: int = 1024

    def __post_init__(self):
        require(
            self,
            prefix="data.",
            positive_int=("image_size", "latent_downscale", "latent_channels", "t5_length",
                          "t5_width", "clip_width", "shuffle_buffer"),
            fraction=("cfg_prob",),
        )  # fmt: skip
        step = self.latent_downscale * PATCH
        if self.image_size % step:
            raise ConfigError(
                f"`data.image_size` ({self.image_size}) must be a multiple of {step}: the "
                f"latent (1/{self.latent_downscale} a side) is cut into 2x2 patches."
            )

    @property
    def latent_size(self) -> int:
        return self.image_size // self.latent_downscale

    @property
    def image_tokens(self) -> int:
        return (self.latent_size // PATCH) ** 2


@dataclasses.dataclass(frozen=True, kw_only=True)
class FluxConfig(BenchmarkConfig):
    """FLUX.1 training by rectified flow (MLPerf `flux1`). Sizes are in samples (images).

    Evaluations run every `eval_every_samples` training samples rounded up to whole steps
    (the reference's `ceil(eval_freq / gbs)`), over the whole eval set.
    """

    gradient_clip_norm: float = 1.0
    model: ModelConfig = dataclasses.field(default_factory=flux_schnell)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    eval_every_samples: int = EVAL_EVERY_SAMPLES
    # Steps of the Euler sampler for the grid of generated images written at the end of a run
    # (0: none; the mini preset writes one).
    sample_grid_steps: int = 0

    def __post_init__(self):
        super().__post_init__()
        require(self, positive_int=("eval_every_samples",))
        require(self, non_negative_int=("sample_grid_steps",))
        patch_features = self.data.latent_channels * PATCH * PATCH
        checks = (
            ("model.in_channels", self.model.in_channels, patch_features,
             "data.latent_channels x 2 x 2"),
            ("model.context_in_dim", self.model.context_in_dim, self.data.t5_width,
             "data.t5_width"),
            ("model.vec_in_dim", self.model.vec_in_dim, self.data.clip_width, "data.clip_width"),
        )  # fmt: skip
        for name, value, want, what in checks:
            if value != want:
                raise ConfigError(f"`{name}` ({value}) must equal {what} ({want}).")


def rcp_hparams(global_batch_size: int) -> tuple[float, int]:
    """(base LR, warm-up steps) of the reference convergence point for `global_batch_size`.

    Raises:
      ConfigError: no RCP has this batch size (the rules accept the RCPs' hyperparameters;
        a batch between them has none to borrow).
    """
    h = rcps.at_batch(RCP_FILE, "flux1", global_batch_size, settings=rcps.LR_AND_WARMUP)
    return float(h["opt_base_learning_rate"]), int(h["opt_learning_rate_warmup_steps"])


def eval_interval_samples(every_samples: int, global_batch_size: int) -> int:
    """Samples between evaluations: `every_samples` rounded up to whole steps (6.1.0's
    `evaluation_frequency` rule: ceil(262,144 / GBS) x GBS; 262,144 for every RCP batch)."""
    return math.ceil(every_samples / global_batch_size) * global_batch_size


# ---- presets ------------------------------------------------------------------------------------


def mlperf() -> FluxConfig:
    """The MLPerf closed-division run: FLUX.1-schnell on the preprocessed CC12M embeddings at
    batch 512 (RCP: LR 2e-4, 1,600 warm-up steps), eval on the COCO-2014 subset.

    Command: `mlperf-tf prepare flux1 --src=PREPROCESSED --out=DIR` then `mlperf-tf run
    --benchmark=flux1 --preset=mlperf --dtype=bf16 --model_dir=RUN --config.data_dir=DIR`.
    Hardware: 8+ accelerators of >= 80 GB (README.md: memory). Expected: eval loss 0.586 after
    about 7.3 M samples (the BS-512 RCP's mean).
    """
    return FluxConfig(
        global_batch_size=512,
        eval_batch_size=512,
        train_examples=TRAIN_SAMPLES,
        eval_examples=EVAL_SAMPLES,
        max_epochs=12.0,
        quality_target=TARGET_EVAL_LOSS,
        data_dir=os.path.join(paths.data_root(), "flux1"),
    )


# The mini data set (prepare.prepare_mini writes exactly these shapes).
MINI_IMAGE_SIZE = 16
MINI_EVAL_SAMPLES = 256  # held-out digits, 32 per timestep
MINI_TRAIN_SAMPLES = 1797 - MINI_EVAL_SAMPLES
MINI_T5_LENGTH = 8
MINI_T5_WIDTH = 32
MINI_CLIP_WIDTH = 32
MINI_TARGET = 0.33  # README.md ("mini"): untrained 1.630, mean velocity 1.236


def mini() -> FluxConfig:
    """A 2-double, 4-single block MMDiT (hidden 128, 4 heads) on scikit-learn's digits.

    The 8x8 digits are upsampled to 16x16 and are the latent themselves (one channel, no
    autoencoder); captions ("a handwritten digit seven") go through small frozen random text
    encoders standing in for T5 and CLIP (prepare.py). Command: `mlperf-tf run
    --benchmark=flux1 --preset=mini --model_dir=/tmp/flux_mini`. Hardware: 2 CPU cores.
    Expected: see README.md ("mini"); a grid of generated digits in the model dir at the end.
    """
    batch = 32
    return FluxConfig(
        global_batch_size=batch,
        eval_batch_size=MINI_EVAL_SAMPLES,
        train_examples=MINI_TRAIN_SAMPLES,
        eval_examples=MINI_EVAL_SAMPLES,
        max_epochs=40.0,
        quality_target=MINI_TARGET,
        data_dir=paths.mini_data_dir("flux1"),
        model=ModelConfig(
            in_channels=4,
            vec_in_dim=MINI_CLIP_WIDTH,
            context_in_dim=MINI_T5_WIDTH,
            hidden_size=128,
            num_heads=4,
            depth=2,
            depth_single_blocks=4,
            axes_dim=(8, 12, 12),
        ),  # fmt: skip
        optimizer=OptimizerConfig(opt_base_learning_rate=1e-3, opt_learning_rate_warmup_steps=100),
        data=DataConfig(
            image_size=MINI_IMAGE_SIZE,
            latent_downscale=1,
            latent_channels=1,
            t5_length=MINI_T5_LENGTH,
            t5_width=MINI_T5_WIDTH,
            clip_width=MINI_CLIP_WIDTH,
            autoencoder_shift=0.0,
            autoencoder_scale=1.0,
            shuffle_buffer=2048,
        ),  # fmt: skip
        eval_every_samples=batch * 250,
        sample_grid_steps=8,
    )


def smoke() -> FluxConfig:
    """Synthetic latents and a one-double, one-single block MMDiT: a few steps, seconds.

    Command: `mlperf-tf run --benchmark=flux1 --preset=smoke --model_dir=/tmp/flux_smoke`.
    Hardware: any CPU. Expected: well under a minute; the loss is meaningless.
    """
    return FluxConfig(
        **smoke_sizes(eval_batch_size=16, eval_examples=32, quality_target=TARGET_EVAL_LOSS),
        model=tiny(),
        optimizer=OptimizerConfig(opt_base_learning_rate=1e-3, opt_learning_rate_warmup_steps=2),
        data=DataConfig(
            image_size=8,
            latent_downscale=1,
            latent_channels=4,
            t5_length=4,
            t5_width=16,
            clip_width=8,
        ),  # fmt: skip
        eval_every_samples=SMOKE_BATCH * 3,
    )
