"""Provides `DeepseekV3Config`, the DeepSeek-V3 671B pretraining benchmark's frozen config, and its
presets.

The MLPerf reference is NVIDIA's Megatron-Bridge run (`mlcommons/training`
`llm_moe_pretraining/nemo/`: `pretrain_deepseek_v3_671b.py` over Megatron-Bridge's
`deepseek_v3_pretrain_config`, `config_GB300_64x4x{240,256,288}xtp1pp4cp1.sh`); the model's
dimensions are DeepSeek's (`deepseek-ai/DeepSeek-V3` `inference/configs/config_671B.json`) but
for the vocabulary, the Llama 3.1 tokenizer's 128,256 (README.md of this package says which file
sets each value). The rules are `closed_deepseekv3_671b.yaml` (6.0.0 and 6.1.0 of
`mlperf-logging`); the convergence points `rcps_deepseekv3_671b.json`.
"""

from __future__ import annotations

import dataclasses
import math
import os

from benchmarks.deepseekv3_671b import prepare
from mlperf_tf import paths, rcps
from mlperf_tf.config import ConfigError, require
from mlperf_tf.data import c4
from mlperf_tf.lm import pretraining
from mlperf_tf.lm.config import DecoderConfig
from mlperf_tf.lm.pretraining import PretrainingOptimizerConfig
from mlperf_tf.spmd import MoEConfig

# What the closed rules of 6.0.0 and 6.1.0 fix (closed_deepseekv3_671b.yaml).
MLPERF_SEQUENCE_LENGTH = 4096
MIN_GLOBAL_BATCH_SIZE = 15_360
REFERENCE_BATCH = 16_384  # the LR's reference batch: 2.4e-5 x sqrt(GBS / 16,384)
REFERENCE_LR = 2.4e-5
WARMUP_STEPS = 4
SCHEDULE_STEPS = 12_000  # warm-up + decay steps
# The reference logs `train_samples` as this constant whatever its schedule
# (llm_moe_pretraining/nemo/pretrain_deepseek_v3_671b.py; its RCP logs): the count MLPerf's C4
# LLM references have logged since GPT-3's (NeMo's and MaxText's gpt3 loggers log the same).
REFERENCE_TRAIN_SAMPLES = 1_574_207_408
END_LR = 1e-8  # config_GB300_*.sh MIN_LR
TARGET_LOG_PERPLEXITY = 3.6
EVAL_SAMPLES = c4.EVAL_WINDOWS  # 1,024, the first validation sequences, unshuffled
MOE_AUX_LOSS_COEFF = 0.01
RCP_FILE = "rcp_checker/training_6.1.0/rcps_deepseekv3_671b.json"
# The reference's first eval: after floor(42 + 24,576 / GBS) steps (START_EVAL_AT_ITER).
FIRST_EVAL_STEPS = 42
FIRST_EVAL_SAMPLES = 24_576
# Llama 3's <|end_of_text|>: the document separator of the C4 windows. The reference does not
# mask it (`eod_mask_loss=False` in `pretrain_deepseek_v3_671b.py`).
LLAMA3_VOCAB_SIZE = 128_256
# The reference's pipeline stages (Megatron-Bridge `recipes/deepseek/deepseek_v3.py`,
# `_deepseek_v3_common`'s `layout_map` of `pipeline_model_parallel_layout` without virtual
# stages): the first stage also holds the embedding and the last the MTP depth and the loss, so
# the last holds fewer decoder layers. PP4 is the reference run's (config_GB300_64x4x*xtp1pp4cp1).
RECIPE_PIPELINE_LAYERS = (
    "16+16+16+13",  # PP4
    "+".join(["8"] * 7 + ["5"]),  # PP8
    "+".join(["4"] * 15 + ["1"]),  # PP16
)


def first_eval_step(global_batch_size: int) -> int:
    """The step of the first evaluation at a batch: floor(42 + 24,576 / GBS) (the rules'
    FIRST_CHECK, the reference's START_EVAL_AT_ITER)."""
    return math.floor(FIRST_EVAL_STEPS + FIRST_EVAL_SAMPLES / global_batch_size)


def reference_learning_rate(global_batch_size: int) -> float:
    """The rules' base learning rate: 2.4e-5 x sqrt(GBS / 16,384)."""
    return REFERENCE_LR * math.sqrt(global_batch_size / REFERENCE_BATCH)


def rcp_hparams(global_batch_size: int) -> tuple[float, int]:
    """(base LR, warm-up steps) at a batch with a reference convergence point (15,360, 16,384,
    18,432): the rules' formula and 4 steps (the RCPs round the LR to 5 digits; the checker
    wants the formula within 1e-9).

    Raises:
      ConfigError: no RCP has this batch size.
    """
    rcps.at_batch(RCP_FILE, "deepseekv3_671b", global_batch_size, settings=rcps.LR_AND_WARMUP)
    return reference_learning_rate(global_batch_size), WARMUP_STEPS


# DeepSeekMoE as the reference trains it: 256 routed experts of width 2,048 and one shared
# expert of 2,048 in layers 3-60 (`n_dense_layers` 3), top-8 of sigmoid scores chosen with the
# learned selection bias among 4 of 8 groups (`n_expert_groups`, `n_limited_groups`), the
# chosen scores normalized and times 2.5 (`route_scale`), dropless, the sequence-wise auxiliary
# loss at 0.01 (`moe_aux_loss_coeff` of the reference, Megatron's `seq_aux_loss`), the bias
# moved by 1e-3 per step (Megatron's `moe_router_bias_update_rate`), router in float32.
REFERENCE_MOE = MoEConfig(
    num_experts=256,
    every=1,
    first_dense=3,
    top_k=8,
    capacity_factor=0.0,
    eval_capacity_factor=0.0,
    router_softmax="sigmoid",
    z_loss_coef=0.0,
    balance_loss_coef=MOE_AUX_LOSS_COEFF,
    balance_loss="sequence",
    filter_size=2048,
    shared_filter_size=2048,
    num_groups=8,
    topk_groups=4,
    routed_scaling=2.5,
    bias_update_rate=1e-3,
    dispatch="sorted",
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig(DecoderConfig):
    """The decoder's shape (`mlperf_tf.lm.DecoderConfig`); the defaults are the reference's
    DeepSeek-V3 671B at the Llama 3.1 vocabulary: MLA, DeepSeekMoE after 3 dense layers, one
    MTP depth at weight 0.1, YaRN RoPE (factor 40 over 4,096), RMSNorm 1e-6, untied embeddings.

    `num_key_value_heads` and `head_dim` are unused by MLA (kept equal to the heads and the
    position-free width so the base's checks hold).
    """

    vocab_size: int = LLAMA3_VOCAB_SIZE
    hidden_size: int = 7168
    num_hidden_layers: int = 61
    num_attention_heads: int = 128
    num_key_value_heads: int = 128
    head_dim: int = 128
    intermediate_size: int = 18_432
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    rope_type: str = "yarn"
    rope_scaling_factor: float = 40.0
    rope_original_max_position: int = 4096
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    max_position_embeddings: int = 163_840
    initializer_range: float = 0.006
    attention: str = "mla"
    q_lora_rank: int = 1536
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    mtp_layers: int = 1
    mtp_loss_weight: float = 0.1
    moe: MoEConfig = REFERENCE_MOE
    pipeline_layers: tuple[str, ...] = RECIPE_PIPELINE_LAYERS
    # The `mini`'s parametrization (`mlperf_tf.lm.parametrization.ScaledWeights`): trainable
    # weights stored divided by this and multiplied back in the forward pass, so AdamW at the
    # rules' learning rate moves the effective weights as AdamW at `weight_scale` times it
    # would. 1: the plain model (the `mlperf` preset's).
    weight_scale: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        require(self, prefix="model.", positive=("weight_scale",))
        if self.attention != "mla" or not self.moe.enabled:
            raise ConfigError(
                f"`model.attention` ({self.attention!r}) and `model.moe.num_experts` "
                f"({self.moe.num_experts}): DeepSeek-V3 has MLA and DeepSeekMoE."
            )


def deepseek_v3_671b() -> ModelConfig:
    """DeepSeek-V3 671B as the reference trains it (README.md of this package)."""
    return ModelConfig()


def tiny(vocab_size: int = 128) -> ModelConfig:
    """A 3-layer DeepSeek-V3 for tests and `smoke`: hidden 32, 4 heads (MLA latents 16/8, nope
    8, rope 4, v 8), layer 0 dense, 8 experts of 16 in 4 groups (top-2 within 2 groups), one
    shared expert, one MTP depth."""
    return ModelConfig(
        vocab_size=vocab_size, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=4, head_dim=8, intermediate_size=64, q_lora_rank=16,
        kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
        max_position_embeddings=256, rope_original_max_position=64, initializer_range=0.02,
        moe=dataclasses.replace(
            REFERENCE_MOE, num_experts=8, first_dense=1, top_k=2, filter_size=16,
            shared_filter_size=16, num_groups=4, topk_groups=2,
        ),
        pipeline_layers=(),  # 3 layers: the 671B's maps do not apply
    )  # fmt: skip


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig(PretrainingOptimizerConfig):
    """AdamW and its schedule as `closed_deepseekv3_671b.yaml` fixes them: epsilon 1e-8, 4
    warm-up steps, cosine over 12,000 - 4 steps to 1e-8 (the reference's MIN_LR); the base
    rate 0 means the rules' 2.4e-5 x sqrt(GBS / 16,384) (`rcp_hparams`)."""

    opt_adamw_epsilon: float = 1e-8
    opt_end_learning_rate: float = END_LR
    max_steps: int = SCHEDULE_STEPS


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig(pretraining.PretrainingDataConfig):
    """Packed token windows of 4,096 (TFRecords under `data_dir`, `mlperf_tf.data.c4`); the
    reference masks no end-of-document position (`eod_mask_loss=False`)."""

    max_sequence_length: int = MLPERF_SEQUENCE_LENGTH


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeepseekV3Config(pretraining.PretrainingConfig):
    """DeepSeek-V3 pretraining continued from a checkpoint (MLPerf `deepseekv3_671b`). Sizes
    are in sequences.

    `init_checkpoint`: the Hugging Face folder (`model.safetensors.index.json` and its shards)
    the run starts from, loaded before `run_start` ("": start from the initializers, the
    `smoke` preset). `first_eval_samples`: sequences before the first eval (-1: the rules'
    GBS x floor(42 + 24,576 / GBS)); then an eval every `eval_every_samples` rounded up to
    whole steps (the rules: every step, which 1 gives at any batch).
    """

    model: ModelConfig = dataclasses.field(default_factory=deepseek_v3_671b)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    init_checkpoint: str = ""
    first_eval_samples: int = -1

    def __post_init__(self):
        super().__post_init__()
        if self.first_eval_samples < -1 or self.first_eval_samples == 0:
            raise ConfigError(
                f"`first_eval_samples` ({self.first_eval_samples}) must be positive, or -1 "
                "(the rules')."
            )


# ---- presets ------------------------------------------------------------------------------------


def mlperf() -> DeepseekV3Config:
    """The MLPerf closed-division run: DeepSeek-V3 671B at sequence 4,096, batch 15,360 (the
    smallest the rules allow; LR 2.3238e-5, 4 warm-up steps, the reference's micro batch 1),
    from MLCommons' checkpoint (Hugging Face layout, Llama 3.1 vocabulary), on the C4 windows
    of `mlperf-tf prepare deepseekv3_671b --sequence_length=4096`.

    Command: `mlperf-tf run --benchmark=deepseekv3_671b --preset=mlperf --dtype=bf16
    --expert_parallel=64 --model_dir=DIR --config.data_dir=C4_TFRECORDS
    --config.init_checkpoint=CKPT`. Hardware: 256 accelerators of >= 192 GB (the reference:
    64 x 4 GB300, TP1 PP4 CP1 EP64); README.md gives memory per chip. Expected: log perplexity
    3.6 after about 1.5-2 M sequences (the RCPs' means at 15,360 - 18,432).
    """
    return DeepseekV3Config(
        **pretraining.preset_sizes(
            batch=MIN_GLOBAL_BATCH_SIZE, eval_batch=EVAL_SAMPLES, train_steps=SCHEDULE_STEPS,
            target=TARGET_LOG_PERPLEXITY,
        ),
        model=deepseek_v3_671b(),
        data=DataConfig(),
        data_dir=os.path.join(paths.data_root(), "llama31-c4-4096"),
        eval_every_samples=1,  # every step at any batch (rounded up to whole steps)
    )  # fmt: skip


# The `mini`: the rules' learning rate and eval cadence at a small batch and a short sequence,
# so that the rules' first eval (GBS x floor(42 + 24,576 / GBS) sequences) comes within minutes
# on 2 CPU cores. README.md ("mini") gives the measurements behind each number.
MINI_SEQUENCE_LENGTH = (
    64  # windows of the shared mini corpus at this length (`c4.mini_windows_dir`)
)
MINI_BATCH = 64  # first eval after floor(42 + 24,576 / 64) = 426 steps, 27,264 sequences
# s of the parametrization: AdamW at the rules' 2.4e-5 sqrt(64 / 16,384) = 1.5e-6 moves the
# effective weights as at 1.5e-3 (the base's peak rate, `prepare.MINI_BASE_LR`).
MINI_WEIGHT_SCALE = 1000.0
# The rules' own 3.6: at 64 tokens the base is above it (3.783) and the rules' first eval below
# (3.385); at 32 tokens it was out of reach (3.70 at the first eval). README.md "mini".
MINI_TARGET_LOG_PERPLEXITY = TARGET_LOG_PERPLEXITY
MINI_EXTRA_STEPS = 100  # the budget: evals after every step this far past the first


def mini_model(sequence_length: int = MINI_SEQUENCE_LENGTH) -> ModelConfig:
    """The mini's DeepSeek-V3: 4 layers of hidden 192 (layer 0 dense, 384 wide), 4 MLA heads
    (query latent 96, key/value latent 64, nope 32, rope 16, v 32), 8 routed experts of 96 in
    4 groups (top-2 within 2 groups, x 2.5) and a shared expert of 96, one MTP depth; positions
    up to `sequence_length` (YaRN over a quarter of it); the plain parametrization (s = 1).

    The width is what 2 AVX2 cores train to the first eval within the mini's 10 minutes: the
    step is bound by its FLOPs, and hidden 256 (experts of 128) took 696 s on a Zen 1 EPYC, 192
    510 s (README.md "mini")."""
    seq = sequence_length
    return ModelConfig(
        vocab_size=c4.MINI_VOCAB_SIZE, hidden_size=192, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, head_dim=32, intermediate_size=384,
        q_lora_rank=96, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16,
        v_head_dim=32, max_position_embeddings=seq, rope_original_max_position=seq // 4,
        initializer_range=0.02,
        moe=dataclasses.replace(
            REFERENCE_MOE, num_experts=8, first_dense=1, top_k=2, filter_size=96,
            shared_filter_size=96, num_groups=4, topk_groups=2,
        ),
        pipeline_layers=(),  # 4 layers: equal stages at P = 2 and 4
    )  # fmt: skip


def mini() -> DeepseekV3Config:
    """A 4-layer DeepSeek-V3 (`mini_model`, weights parametrized at `MINI_WEIGHT_SCALE`) on the
    shared C4-format mini corpus (`mlperf_tf.data.c4`, `llama31_8b`'s mini text and vocabulary)
    cut into windows of `MINI_SEQUENCE_LENGTH`, at batch `MINI_BATCH`, from the base checkpoint
    `prepare` trains, with everything else the rules': AdamW 0.9/0.95/1e-8/0.1, clip 1.0,
    LR 2.4e-5 sqrt(64 / 16,384), 4 warm-up steps, cosine over 11,996 steps to 1e-8, the first
    eval after floor(42 + 24,576 / 64) = 426 steps, then after every step.

    Command: `mlperf-tf run --benchmark=deepseekv3_671b --preset=mini --model_dir=/tmp/dsv3_mini`.
    Hardware: 2 CPU cores. Expected: log perplexity `MINI_TARGET_LOG_PERPLEXITY` at the first
    eval; README.md ("mini") gives the measured times.
    """
    seq, batch = MINI_SEQUENCE_LENGTH, MINI_BATCH
    steps = first_eval_step(batch) + MINI_EXTRA_STEPS
    config = pretraining.mini_preset(
        DeepseekV3Config, model=mini_model(seq), target=MINI_TARGET_LOG_PERPLEXITY,
        data=DataConfig(max_sequence_length=seq, shuffle_buffer=4096), eval_every_steps=1,
        train_steps=steps,
    )  # fmt: skip
    optimizer = dataclasses.replace(
        config.optimizer, opt_base_learning_rate=reference_learning_rate(batch),
        opt_learning_rate_warmup_steps=WARMUP_STEPS,
    )  # fmt: skip
    return dataclasses.replace(
        config, **pretraining.preset_sizes(
            batch=batch, eval_batch=256, train_steps=steps, target=MINI_TARGET_LOG_PERPLEXITY
        ),
        model=dataclasses.replace(config.model, weight_scale=MINI_WEIGHT_SCALE),
        optimizer=optimizer, eval_every_samples=1, first_eval_samples=-1,
        data_dir=c4.mini_windows_dir(seq), init_checkpoint=prepare.mini_base_dir(),
    )  # fmt: skip


def smoke() -> DeepseekV3Config:
    """Synthetic tokens and a 3-layer DeepSeek-V3 (MLA, group-limited routing, a shared expert,
    MTP) with a 128-token vocabulary: a few steps, seconds, from the initializers.

    Command: `mlperf-tf run --benchmark=deepseekv3_671b --preset=smoke --model_dir=/tmp/dsv3`.
    Hardware: any CPU. Expected: well under a minute; the perplexity is meaningless.
    """
    config = pretraining.smoke_preset(
        DeepseekV3Config, model=tiny(128), data=DataConfig(max_sequence_length=32),
        target=TARGET_LOG_PERPLEXITY,
    )  # fmt: skip
    optimizer = dataclasses.replace(config.optimizer, opt_learning_rate_warmup_steps=WARMUP_STEPS)
    return dataclasses.replace(config, optimizer=optimizer, first_eval_samples=8 * 3)
