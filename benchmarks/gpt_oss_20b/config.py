"""Provides `GptOssConfig`, the GPT-OSS 20B pretraining benchmark's frozen config, and its presets.

The MLPerf reference is AMD's Primus/Megatron run (`mlcommons/training`
`small_llm_moe_pretraining/primus/`: `conf/gpt_oss_20B-pretrain.yaml` over Primus'
`primus/configs/models/megatron/gpt_oss_20B.yaml` <- `deepseek_v2_base.yaml` <- `llama_base.yaml`;
README.md of this package says which file sets each value). Learning rate and warm-up per batch
size come from the reference convergence points (`mlperf_logging/rcp_checker/training_6.0.0/
rcps_gpt_oss_20b.json`, the same file in 6.1.0).
"""

from __future__ import annotations

import dataclasses
import os

from mlperf_tf import paths
from mlperf_tf.config import ConfigError
from mlperf_tf.data import c4
from mlperf_tf.lm import pretraining
from mlperf_tf.lm.config import MINI_SHAPE, DecoderConfig
from mlperf_tf.lm.pretraining import MAX_STEPS_DEFAULT, PretrainingOptimizerConfig
from mlperf_tf.spmd import MoEConfig

# What the closed rules of 6.0.0 and 6.1.0 fix (closed_gpt_oss_20b.yaml).
MAX_STEPS = MAX_STEPS_DEFAULT  # 1,200,000
MLPERF_SEQUENCE_LENGTH = c4.REFERENCE_SEQUENCE_LENGTH  # 8,192
EVAL_SAMPLES = c4.EVAL_WINDOWS  # 1,024
EVAL_EVERY_SAMPLES = pretraining.EVAL_EVERY_SAMPLES  # config_*.sh EVAL_SAMPLES_INTERVAL
TARGET_LOG_PERPLEXITY = 3.34

RCP_FILE = "rcp_checker/training_6.0.0/rcps_gpt_oss_20b.json"
# Llama 3's <|end_of_text|>: the document separator of the C4 windows, masked out of the loss.
LLAMA3_END_OF_TEXT_ID = 128_001
# Megatron's `window_attn_skip_freq` of the reference, one entry per layer (1: sliding window).
REFERENCE_WINDOW_PATTERN = (1, 0) * 12


def is_window_layer(window_attn_skip_freq, layer_number: int) -> bool:
    """Whether 1-based layer `layer_number` uses sliding-window attention, as Megatron decides it
    (`megatron/core/transformer/utils.py` `is_layer_window_attention`): an int N makes every
    N-th layer full and the others sliding; a list gives each layer (1: sliding, 0: full)."""
    if isinstance(window_attn_skip_freq, int):
        return layer_number % window_attn_skip_freq != 0
    return bool(window_attn_skip_freq[layer_number - 1])


# The reference's mixture of experts (`gpt_oss_20B-pretrain.yaml`): 32 experts of width 2,880 in
# every layer (`moe_layer_freq: 1`), top-4 on the logits then a softmax over the four
# (`moe_router_pre_softmax: false`, score function softmax), dropless
# (`moe_expert_capacity_factor: null`), no auxiliary loss (`moe_aux_loss_coeff: 0.0`,
# `moe_z_loss_coeff: null`), no shared expert (`moe_shared_expert_intermediate_size: null`).
# Each expert runs on its routed rows only ("sorted"; the benchmark switches to the capacity
# buffers where shapes must be static).
REFERENCE_MOE = MoEConfig(
    num_experts=32,
    every=1,
    top_k=4,
    capacity_factor=0.0,
    eval_capacity_factor=0.0,
    router_softmax="after",
    z_loss_coef=0.0,
    balance_loss_coef=0.0,
    filter_size=2880,
    dispatch="sorted",
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig(DecoderConfig):
    """The decoder's shape (`mlperf_tf.lm.DecoderConfig`); the defaults are the reference's
    GPT-OSS 20B: QK-norm, sliding windows, untied embeddings, every feed-forward `moe`.

    `sliding_window` counts the keys a windowed layer's query sees, itself included: Megatron's
    `window_size: [128, 0]` is 128 earlier tokens and the token itself, 129. `window_skip_freq`
    is Megatron's `window_attn_skip_freq` as an int (every N-th layer, 1-based, attends fully);
    the reference writes it as the list `REFERENCE_WINDOW_PATTERN`, which 2 equals (tested).
    """

    # Where GPT-OSS 20B differs from DecoderConfig's defaults (its 8 key/value heads and untied
    # embeddings are the base's too).
    vocab_size: int = 128_256
    hidden_size: int = 2880
    num_hidden_layers: int = 24
    num_attention_heads: int = 64
    head_dim: int = 64
    intermediate_size: int = 2880
    rms_norm_eps: float = 1e-6
    rope_theta: float = 150_000.0
    max_position_embeddings: int = 131_072
    initializer_range: float = 0.008
    qk_norm: bool = True
    sliding_window: int = 129
    window_skip_freq: int = 2
    moe: MoEConfig = REFERENCE_MOE

    def __post_init__(self):
        super().__post_init__()
        if not self.moe.enabled or self.moe.every != 1:
            raise ConfigError(
                f"`model.moe` (num_experts {self.moe.num_experts}, every {self.moe.every}): "
                "GPT-OSS has experts in every layer (num_experts >= 1, every 1)."
            )


def gpt_oss_20b() -> ModelConfig:
    """GPT-OSS 20B as the reference trains it (README.md of this package)."""
    return ModelConfig()


def tiny(vocab_size: int = 128) -> ModelConfig:
    """A 2-layer GPT-OSS for tests and `smoke` (GQA 4/2 heads of 8, 4 experts top-2, window 5)."""
    return ModelConfig.tiny(
        vocab_size,
        intermediate_size=32,
        sliding_window=5,
        moe=dataclasses.replace(REFERENCE_MOE, num_experts=4, top_k=2, filter_size=32),
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig(PretrainingOptimizerConfig):
    """AdamW and its schedule as the C4 pretraining rules fix them
    (`mlperf_tf.lm.pretraining.PretrainingOptimizerConfig`; `rcp_hparams` gives the learning
    rate and warm-up of a batch size when they are left unset)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig(pretraining.PretrainingDataConfig):
    """Packed token windows (TFRecords under `data_dir`, `mlperf_tf.data.c4`).

    `eod_token_id`: the end-of-document token; positions whose input is it are left out of the
    loss (Megatron's `eod_mask_loss`; -1: none left out).
    """

    eod_token_id: int = LLAMA3_END_OF_TEXT_ID

    def __post_init__(self):
        super().__post_init__()
        if self.eod_token_id < -1:
            raise ConfigError(f"`data.eod_token_id` ({self.eod_token_id}) must be >= -1.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class GptOssConfig(pretraining.PretrainingConfig):
    """GPT-OSS pretraining (MLPerf `gpt_oss_20b`). Sizes are in sequences (token windows).

    The training budget is `optimizer.max_steps` steps of `global_batch_size` unless a preset
    says fewer (`train_examples`); a run stops at the target long before. Evaluations run every
    `eval_every_samples` training sequences rounded up to whole steps (`ceil(12288 / GBS) x GBS`).
    """

    model: ModelConfig = dataclasses.field(default_factory=gpt_oss_20b)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)

    def __post_init__(self):
        super().__post_init__()
        seq, m = self.data.max_sequence_length, self.model
        windowed = any(m.layer_window(i) for i in range(m.num_hidden_layers))
        if windowed and m.sliding_window > seq:
            raise ConfigError(
                f"`model.sliding_window` ({m.sliding_window}) must be at most the sequence "
                f"(`data.max_sequence_length` {seq}): a longer window is full attention."
            )
        if self.data.eod_token_id >= m.vocab_size:
            raise ConfigError(
                f"`data.eod_token_id` ({self.data.eod_token_id}) is outside the vocabulary "
                f"(`model.vocab_size` {m.vocab_size})."
            )


def rcp_hparams(global_batch_size: int) -> tuple[float, int]:
    """(base LR, warm-up steps) of the reference convergence point for `global_batch_size`:
    BS 16 (4e-4, 128), 32 (8e-4, 128), 64 (1e-3, 192) (`pretraining.rcp_lr_and_warmup`).

    Raises:
      ConfigError: no RCP has this batch size.
    """
    return pretraining.rcp_lr_and_warmup(RCP_FILE, "gpt_oss_20b", global_batch_size)


# ---- presets ------------------------------------------------------------------------------------


def mlperf() -> GptOssConfig:
    """The MLPerf closed-division run: GPT-OSS 20B at sequence 8,192, batch 16 (RCP: LR 4e-4,
    warm-up 128 steps; the reference's micro batch 2), C4 prepared by `mlperf-tf prepare
    gpt_oss_20b` (the same files as `llama31_8b`'s).

    Command: `mlperf-tf run --benchmark=gpt_oss_20b --preset=mlperf --dtype=bf16
    --model_dir=DIR --config.data_dir=C4_TFRECORDS`. Hardware: 8+ accelerators of >= 80 GB with
    expert parallelism (the reference: 8 MI355X, EP 8). Expected: log perplexity 3.34 after
    about 195,000 sequences (the BS-16 RCP's mean).
    """
    return GptOssConfig(
        **pretraining.preset_sizes(
            batch=16, eval_batch=16, train_steps=MAX_STEPS, target=TARGET_LOG_PERPLEXITY
        ),
        model=gpt_oss_20b(),
        data=DataConfig(),
        data_dir=os.path.join(paths.data_root(), "llama31-c4"),
    )


def mini() -> GptOssConfig:
    """A 4-layer GPT-OSS (hidden 256, GQA 4/2 heads of 64, 8 experts of 256 top-2, window 32 on
    layers 1 and 3) on the shared C4-format mini corpus (`mlperf_tf.data.c4`, the same data and
    eval set as `llama31_8b`'s mini).

    Command: `mlperf-tf run --benchmark=gpt_oss_20b --preset=mini --model_dir=/tmp/gptoss_mini`
    (writes the mini corpus on first use). Hardware: 2 CPU cores. Keeps every setting the closed
    rules fix but the sequence length (256): AdamW 0.9/0.95/1e-5/0.1, clip 1.0, 1,024 eval
    sequences, max_steps 1,200,000 with the cosine over them. Expected: log perplexity 3.34
    (the real target) in under 10 minutes; README.md ("mini") gives the measured steps.
    """
    seq = c4.MINI_SEQUENCE_LENGTH
    return pretraining.mini_preset(
        GptOssConfig,
        model=ModelConfig(
            **MINI_SHAPE,
            vocab_size=c4.MINI_VOCAB_SIZE,
            num_hidden_layers=4,
            intermediate_size=256,
            sliding_window=33,  # the reference's 129 of 8,192 keys; 33 of 256 keeps it local
            max_position_embeddings=seq,
            initializer_range=0.02,
            moe=dataclasses.replace(REFERENCE_MOE, num_experts=8, top_k=2, filter_size=256),
        ),
        data=DataConfig(max_sequence_length=seq, shuffle_buffer=4096, eod_token_id=c4.MINI_EOS_ID),
        target=TARGET_LOG_PERPLEXITY,
        eval_every_steps=250,
    )


def smoke() -> GptOssConfig:
    """Synthetic tokens and a 2-layer GPT-OSS with a 128-token vocabulary: a few steps, seconds.

    Command: `mlperf-tf run --benchmark=gpt_oss_20b --preset=smoke --model_dir=/tmp/gptoss_smoke`.
    Hardware: any CPU. Expected: well under a minute; the perplexity is meaningless.
    """
    return pretraining.smoke_preset(
        GptOssConfig, model=tiny(128), data=DataConfig(max_sequence_length=32, eod_token_id=2),
        target=TARGET_LOG_PERPLEXITY,
    )  # fmt: skip
