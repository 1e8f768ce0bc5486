"""Provides `LlamaConfig`, the Llama 3.1 8B pretraining benchmark's frozen config, and its presets.

The MLPerf reference is NeMo's (`mlcommons/training` `small_llm_pretraining/nemo/`, read at
commit aa344c7): `pretrain_llama31.py` (model `Llama31Config8B` at sequence 8,192, AdamW via
`distributed_fused_adam_with_cosine_annealing` with `min_lr = 0.1 * max_lr`, `max_steps`
1,200,000, an eval every 12,288 sequences on 1,024 sequences) and its README (C4 `c4/en` 3.0.1;
target log perplexity 3.3). Learning rate and warm-up per batch size come from the reference
convergence points (`mlperf_logging/rcp_checker/training_5.1.0/rcps_llama31_8b.json`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Literal

from mlperf_tf import paths
from mlperf_tf.data import c4
from mlperf_tf.lm import pretraining
from mlperf_tf.lm.config import MINI_SHAPE, DecoderConfig
from mlperf_tf.lm.pretraining import MAX_STEPS_DEFAULT, PretrainingOptimizerConfig

# What the closed rules of 5.1.0, 6.0.0 and 6.1.0 fix (closed_llama31_8b.yaml).
MAX_STEPS = MAX_STEPS_DEFAULT  # 1,200,000
MLPERF_SEQUENCE_LENGTH = c4.REFERENCE_SEQUENCE_LENGTH  # 8,192
EVAL_SAMPLES = c4.EVAL_WINDOWS  # 1,024
EVAL_EVERY_SAMPLES = pretraining.EVAL_EVERY_SAMPLES  # the reference's `--eval_every` (sequences)
TARGET_LOG_PERPLEXITY = 3.3

RCP_FILE = "rcp_checker/training_5.1.0/rcps_llama31_8b.json"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig(DecoderConfig):
    """The decoder's shape; the defaults are Llama 3.1 8B (MLPerf's model).

    A `mlperf_tf.lm.DecoderConfig` (field names from Hugging Face's `LlamaConfig` and its
    `rope_scaling`) with Llama 3.1 8B's defaults: Llama 3.1's frequency scaling ("rope_type":
    "llama3"; factor 1 turns it off), untied embeddings, no biases, SwiGLU, Megatron's scaled
    init (`initializer_range` 0.02 as NeMo's `Llama31Config8B`). Mixture-of-experts blocks
    (`--config.model.moe.*`, the Transformer's settings): every `moe.every`-th block's SwiGLU
    MLP becomes `moe.num_experts` SwiGLU experts (Mixtral's form) of width `moe.filter_size` (0:
    `intermediate_size`); num_experts=0 keeps Llama dense.
    """

    # Where Llama 3.1 8B differs from DecoderConfig's defaults, which are its shape (hidden
    # 4,096, 32 layers, GQA 32/8 heads of 128, SwiGLU 14,336, RMSNorm eps 1e-5, init 0.02,
    # scaling's low/high frequency factors 1 and 4 over 8,192 original positions).
    vocab_size: int = 128_256
    rope_theta: float = 500_000.0
    rope_type: Literal["default", "llama3", "yarn"] = "llama3"
    rope_scaling_factor: float = 8.0
    max_position_embeddings: int = 131_072


def llama31_8b() -> ModelConfig:
    """Llama 3.1 8B: 32 layers, hidden 4,096, GQA 32/8 heads of 128, SwiGLU 14,336."""
    return ModelConfig()


def tiny(vocab_size: int = 128) -> ModelConfig:
    """A 2-layer Llama for tests and `smoke` (GQA 4/2 heads of 8, scaling kept)."""
    return ModelConfig.tiny(vocab_size, intermediate_size=64, rope_original_max_position=32)


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig(PretrainingOptimizerConfig):
    """AdamW and its schedule as the C4 pretraining rules fix them
    (`mlperf_tf.lm.pretraining.PretrainingOptimizerConfig`; `rcp_hparams` gives the learning
    rate and warm-up of a batch size when they are left unset)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig(pretraining.PretrainingDataConfig):
    """Packed token windows (TFRecords under `data_dir`, written by prepare.py)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class LlamaConfig(pretraining.PretrainingConfig):
    """Llama 3.1 pretraining (MLPerf `llama31_8b`). Sizes are in sequences (token windows).

    The training budget is `optimizer.max_steps` steps of `global_batch_size` (one "epoch" is
    the whole budget: `train_examples` = max_steps x batch, `max_epochs` 1); a run stops at the
    target long before. Evaluations run every `eval_every_samples` training sequences (rounded
    up to whole steps, as the reference's `ceil(eval_every / gbs)`).
    """

    model: ModelConfig = dataclasses.field(default_factory=llama31_8b)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)


def rcp_hparams(global_batch_size: int) -> tuple[float, int]:
    """(base LR, warm-up steps) of the reference convergence point for `global_batch_size`
    (`pretraining.rcp_lr_and_warmup`: BS 96's 16,348 warm-up samples give 171 steps; the other
    four divide evenly).

    Raises:
      ConfigError: no RCP has this batch size.
    """
    return pretraining.rcp_lr_and_warmup(RCP_FILE, "llama31_8b", global_batch_size)


# ---- presets ------------------------------------------------------------------------------------


def mlperf() -> LlamaConfig:
    """The MLPerf closed-division run: Llama 3.1 8B at sequence 8,192, batch 32 (RCP: LR 8e-4,
    warm-up 128 steps), C4 prepared by `mlperf-tf prepare llama31_8b`.

    Command: `mlperf-tf run --benchmark=llama31_8b --preset=mlperf --dtype=bf16
    --model_dir=DIR --config.data_dir=C4_TFRECORDS`. Hardware: 8+ accelerators of >= 80 GB
    (the 8B model with AdamW state is ~128 GB in fp32; see README.md). Expected: log perplexity
    3.3 after about 180,000 sequences (the BS-32 RCP's mean).
    """
    return LlamaConfig(
        **pretraining.preset_sizes(
            batch=32, eval_batch=32, train_steps=MAX_STEPS, target=TARGET_LOG_PERPLEXITY
        ),
        model=llama31_8b(),
        data=DataConfig(max_sequence_length=8192),
        data_dir=os.path.join(paths.data_root(), "llama31-c4"),
    )


# The mini data set's shapes: `mlperf_tf.data.c4.prepare_mini` writes exactly these.
MINI_VOCAB_SIZE = c4.MINI_VOCAB_SIZE
MINI_SEQ_LENGTH = c4.MINI_SEQUENCE_LENGTH
MINI_TARGET = TARGET_LOG_PERPLEXITY


def mini() -> LlamaConfig:
    """A 4-layer Llama (hidden 256, GQA 4/2 heads of 64) on English text of an installed package.

    Command: `mlperf-tf run --benchmark=llama31_8b --preset=mini --model_dir=/tmp/llama_mini`
    (writes the data to `mlperf_tf.data.c4.mini_data_dir()` on first use, shared with
    `gpt_oss_20b`). Hardware:
    2 CPU cores. Keeps every setting the closed rules fix but the sequence length (256): AdamW
    0.9/0.95/1e-5/0.1, clip 1.0, 1,024 eval sequences, max_steps 1,200,000 with the cosine
    over them, the BS-16 RCP's LR and warm-up. Expected: see README.md ("mini").
    """
    return pretraining.mini_preset(
        LlamaConfig,
        model=ModelConfig(
            **MINI_SHAPE,
            vocab_size=MINI_VOCAB_SIZE,
            num_hidden_layers=3,
            intermediate_size=512,
            rope_original_max_position=MINI_SEQ_LENGTH,
            max_position_embeddings=MINI_SEQ_LENGTH,
        ),
        data=DataConfig(max_sequence_length=MINI_SEQ_LENGTH, shuffle_buffer=4096),
        target=MINI_TARGET,
        eval_every_steps=500,
    )


def smoke() -> LlamaConfig:
    """Synthetic tokens and a 2-layer Llama with a 128-token vocabulary: a few steps, seconds.

    Command: `mlperf-tf run --benchmark=llama31_8b --preset=smoke --model_dir=/tmp/llama_smoke`.
    Hardware: any CPU. Expected: well under a minute; the perplexity is meaningless.
    """
    return pretraining.smoke_preset(
        LlamaConfig, model=tiny(128), data=DataConfig(max_sequence_length=32),
        target=TARGET_LOG_PERPLEXITY,
    )  # fmt: skip
