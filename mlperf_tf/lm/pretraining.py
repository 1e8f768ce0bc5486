"""Provides `PretrainingBenchmark`: what the MLPerf C4 pretraining benchmarks share.

`llama31_8b` and `gpt_oss_20b` follow one set of closed rules but for the model and the target
(`closed_gpt_oss_20b.yaml` equals `closed_llama31_8b.yaml` but for the log perplexity): AdamW
with its MLPerf-named fields, linear warm-up then cosine decay to 0.1x over a fixed 1,200,000
steps, the learning rate and warm-up of the reference convergence point of the batch size,
evals every `eval_every_samples` sequences with `samples_count`, the C4 windows of 8,192 tokens.
A benchmark subclasses it with its model and its `reference_hparams` (its RCP file;
`mlperf_tf.benchmark.RcpLearningRate`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import keras
from mlperf_logging.mllog import constants as C

from mlperf_tf import flops, rcps
from mlperf_tf.benchmark import EvalPoint, RcpLearningRate, sample_eval_schedule
from mlperf_tf.config import BenchmarkConfig, ConfigError, require, require_adamw
from mlperf_tf.data import c4
from mlperf_tf.lm.benchmark import LanguageModelBenchmark
from mlperf_tf.lm.config import DecoderConfig
from mlperf_tf.optimizers import WarmupCosineDecay, registry

# What the closed rules fix (5.1.0-6.1.0 `closed_llama31_8b.yaml`, 6.0.0-6.1.0
# `closed_gpt_oss_20b.yaml`).
MAX_STEPS_DEFAULT = 1_200_000
EVAL_EVERY_SAMPLES = 12_288  # NeMo's `--eval_every`, Primus' EVAL_SAMPLES_INTERVAL (sequences)
END_LR_FRACTION = 0.1  # NeMo's and Primus' min_lr = 0.1 x max_lr
# MLPerf log keys of those rules that `mlperf_logging.mllog.constants` spells differently or lacks.
MAX_STEPS = "max_steps"
DECAY_SCHEDULE = "cosine with linear warmup"


@dataclasses.dataclass(frozen=True, kw_only=True)
class PretrainingOptimizerConfig:
    """AdamW and its schedule; fields are named after the MLPerf log keys they become.

    `opt_base_learning_rate` 0 and `opt_learning_rate_warmup_steps` -1 mean "the reference
    convergence point's for the global batch size" (`rcp_hparams`); `opt_end_learning_rate` -1
    means `END_LR_FRACTION` x the base rate (the references' `min_lr`).
    """

    opt_name: str = "adamw"
    opt_params: tuple[str, ...] = ()
    opt_base_learning_rate: float = 0.0
    opt_end_learning_rate: float = -1.0
    opt_learning_rate_warmup_steps: int = -1
    max_steps: int = MAX_STEPS_DEFAULT  # the schedule's length; decay steps are max_steps - warmup
    opt_adamw_beta_1: float = 0.9
    opt_adamw_beta_2: float = 0.95
    opt_adamw_epsilon: float = 1e-5
    opt_adamw_weight_decay: float = 0.1

    def __post_init__(self):
        registry.check_opt_name(self.opt_name)
        require_adamw(self, positive_int=("max_steps",))
        rcps.check_warmup_steps(self.opt_learning_rate_warmup_steps)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PretrainingDataConfig:
    """Packed token windows (TFRecords under `data_dir`, written by `mlperf_tf.data.c4`)."""

    max_sequence_length: int = c4.REFERENCE_SEQUENCE_LENGTH
    train_pattern: str = "train/*.tfrecord"
    eval_pattern: str = "eval/*.tfrecord"
    shuffle_buffer: int = 1024  # windows

    def __post_init__(self):
        if isinstance(self.max_sequence_length, bool) or self.max_sequence_length < 2:
            raise ConfigError(
                f"`data.max_sequence_length` ({self.max_sequence_length!r}) must be >= 2."
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class PretrainingConfig(BenchmarkConfig):
    """A C4 pretraining benchmark's config; a benchmark subclasses it with its model's defaults.

    Sizes are in sequences (token windows). Evaluations run every `eval_every_samples` training
    sequences rounded up to whole steps (the references' `ceil(eval_every / gbs)`).
    """

    gradient_clip_norm: float = 1.0
    model: DecoderConfig = dataclasses.field(default_factory=DecoderConfig)
    optimizer: PretrainingOptimizerConfig = dataclasses.field(
        default_factory=PretrainingOptimizerConfig
    )
    data: PretrainingDataConfig = dataclasses.field(default_factory=PretrainingDataConfig)
    eval_every_samples: int = EVAL_EVERY_SAMPLES

    def __post_init__(self):
        super().__post_init__()
        require(self, positive_int=("eval_every_samples",))
        if self.data.max_sequence_length > self.model.max_position_embeddings:
            raise ConfigError(
                f"`data.max_sequence_length` ({self.data.max_sequence_length}) exceeds "
                f"`model.max_position_embeddings` ({self.model.max_position_embeddings})."
            )


def preset_sizes(*, batch: int, eval_batch: int, train_steps: int, target: float) -> dict[str, Any]:
    """The sizes every C4 pretraining preset sets: `train_steps` steps of `batch` sequences as
    one "epoch" (the run's budget; the schedule's length is `optimizer.max_steps`), the rules'
    1,024 eval windows, the log-perplexity `target`."""
    return {
        "global_batch_size": batch,
        "eval_batch_size": eval_batch,
        "train_examples": train_steps * batch,
        "eval_examples": c4.EVAL_WINDOWS,
        "max_epochs": 1.0,
        "quality_target": target,
    }


def smoke_preset(config_class: type, *, model: DecoderConfig, data, target: float):
    """A `config_class` of a few steps on synthetic tokens (no `data_dir`): batch 8, 6 steps, an
    eval every 3 steps, LR 1e-3 after 2 warm-up steps; `model` and `data` are the benchmark's."""
    optimizer_class = {f.name: f for f in dataclasses.fields(config_class)}["optimizer"]
    return config_class(
        **preset_sizes(batch=8, eval_batch=256, train_steps=6, target=target),
        model=model,
        optimizer=optimizer_class.default_factory(
            opt_base_learning_rate=1e-3, opt_learning_rate_warmup_steps=2
        ),
        data=data,
        data_dir="",
        eval_every_samples=8 * 3,
    )


# The mini presets' budget: 2,000 steps of batch 8 (the cosine stays over `max_steps`).
MINI_TRAIN_STEPS = 2000


def mini_preset(
    config_class: type, *, model: DecoderConfig, data, target: float, eval_every_steps: int,
    train_steps: int = MINI_TRAIN_STEPS,
):  # fmt: skip
    """A `config_class` on the shared C4-format mini corpus (`mlperf_tf.data.c4.mini_data_dir`):
    batch 8, `train_steps` steps (the run's budget; the cosine stays over `max_steps`), an eval
    of the rules' 1,024 windows at batch 64 every `eval_every_steps` steps, LR 2e-3 after 50
    warm-up steps (not fixed by the rules: the BS-128 RCP's peak LR suits a small model better
    than BS 16's 4e-4); `model` and `data` are the benchmark's."""
    optimizer_class = {f.name: f for f in dataclasses.fields(config_class)}["optimizer"]
    batch = 8
    return config_class(
        **preset_sizes(batch=batch, eval_batch=64, train_steps=train_steps, target=target),
        model=model,
        optimizer=optimizer_class.default_factory(
            opt_base_learning_rate=2e-3, opt_learning_rate_warmup_steps=50
        ),
        data=data,
        data_dir=c4.mini_data_dir(),
        eval_every_samples=batch * eval_every_steps,
    )


def rcp_lr_and_warmup(rcp_file: str, benchmark: str, global_batch_size: int) -> tuple[float, int]:
    """(base LR, warm-up steps) of `benchmark`'s reference convergence point for the batch size:
    warm-up steps are the RCP's warm-up samples over the batch, rounded up.

    Raises:
      ConfigError: no RCP has this batch size (no interpolation: the rules accept the RCPs'
        hyperparameters, or ones a submitter borrows and justifies).
    """
    h = rcps.at_batch(rcp_file, benchmark, global_batch_size, settings=rcps.LR_AND_WARMUP)
    return float(h["opt_base_learning_rate"]), math.ceil(
        int(h["opt_learning_rate_warmup_samples"]) / global_batch_size
    )


class PretrainingBenchmark(RcpLearningRate, LanguageModelBenchmark):
    """A causal LM pretrained on C4 under the closed C4 pretraining rules (see the module).

    The config has `optimizer` (a `PretrainingOptimizerConfig`), `data.max_sequence_length`,
    `eval_every_samples`, `gradient_clip_norm` and `global_batch_size`.
    """

    def decoder_shape(self) -> flops.DecoderShape:
        """`config.model` (a `mlperf_tf.lm.DecoderConfig`) as `mlperf_tf.flops` counts a decoder:
        MoE blocks' router and active (top-k) experts only, windowed layers at their window."""
        m = self.config.model
        return flops.DecoderShape(
            vocab_size=m.vocab_size,
            hidden_size=m.hidden_size,
            num_layers=m.num_hidden_layers,
            num_attention_heads=m.num_attention_heads,
            num_key_value_heads=m.num_key_value_heads,
            head_dim=m.head_dim,
            intermediate_size=m.intermediate_size,
            moe_layers=m.moe.count(m.num_hidden_layers),
            num_experts=m.moe.num_experts,
            experts_per_token=m.moe.top_k,
            expert_intermediate_size=m.moe.filter_size,
            sliding_window=m.sliding_window,
            sliding_layers=m.sliding_layers(),
        )

    # ---- sizes and schedule --------------------------------------------------------------------
    def end_learning_rate(self) -> float:
        """`opt_end_learning_rate`, or 0.1 x the base LR (the references' `min_lr`) when -1."""
        end = self.config.optimizer.opt_end_learning_rate
        return end if end >= 0 else END_LR_FRACTION * self.learning_rate_and_warmup()[0]

    def decay_steps(self) -> int:
        """`opt_learning_rate_decay_steps`: max_steps - warm-up (the rules check this sum)."""
        return max(1, self.config.optimizer.max_steps - self.learning_rate_and_warmup()[1])

    def eval_schedule(self) -> list[EvalPoint]:
        """Every `eval_every_samples` sequences (rounded up to whole steps) and at the end."""
        return sample_eval_schedule(
            global_batch_size=self.config.global_batch_size,
            train_steps=self.train_steps,
            every_samples=self.config.eval_every_samples,
            # The reference logs `samples_count` in the block and eval events.
            log_samples_count=True,
        )

    def training_flops_per_sample(self) -> float:
        """Training FLOPs of one sequence from the config (`flops.decoder_training_flops_per_sample`
        of `decoder_shape()`: attention counted, windowed layers at their window, MoE blocks'
        active experts only)."""
        seq = self.config.data.max_sequence_length
        return flops.decoder_training_flops_per_sample(self.decoder_shape(), seq)

    def scaled_settings(self) -> dict[str, str]:
        """`max_sequence_length` when below the rules' 8,192 (the mini and smoke presets)."""
        seq = self.config.data.max_sequence_length
        if seq == c4.REFERENCE_SEQUENCE_LENGTH:
            return {}
        return {
            C.MAX_SEQUENCE_LENGTH: f"sequence {seq} instead of "
            f"{c4.REFERENCE_SEQUENCE_LENGTH}: a scaled-down preset"
        }

    # ---- building ------------------------------------------------------------------------------
    def learning_rate_schedule(self) -> WarmupCosineDecay:
        lr, warmup = self.learning_rate_and_warmup()
        return WarmupCosineDecay(
            lr,
            warmup_steps=warmup,
            decay_steps=self.decay_steps(),
            end_learning_rate=self.end_learning_rate(),
        )

    def build_optimizer(self, train_steps: int) -> keras.optimizers.Optimizer:
        """AdamW (registry `adamw`, or `opt_name`) on the warm-up + cosine schedule.

        The schedule runs over `optimizer.max_steps`, not `train_steps`: the rules fix it.
        """
        del train_steps
        opt = self.config.optimizer
        return registry.build(opt.opt_name, self.learning_rate_schedule(), opt, opt.opt_params)

    # ---- host side -----------------------------------------------------------------------------
    def train_samples(self) -> int:
        """`train_samples`: the sequences of the whole schedule (max_steps x batch)."""
        return self.config.optimizer.max_steps * self.config.global_batch_size

    def mlperf_hparams(self) -> dict[str, Any]:
        """The keys the C4 pretraining rules fix (closed_llama31_8b.yaml, closed_gpt_oss_20b.yaml);
        the runner adds the round's disclosure keys (`Benchmark.round_hparams`)."""
        opt = self.config.optimizer
        lr, warmup = self.learning_rate_and_warmup()
        if opt.opt_name == "adamw":
            optimizer_keys = {
                C.OPT_NAME: "adamw",
                C.OPT_ADAMW_BETA_1: opt.opt_adamw_beta_1,
                C.OPT_ADAMW_BETA_2: opt.opt_adamw_beta_2,
                C.OPT_ADAMW_EPSILON: opt.opt_adamw_epsilon,
                C.OPT_ADAMW_WEIGHT_DECAY: opt.opt_adamw_weight_decay,
            }
        else:
            optimizer_keys = registry.mlperf_hparams(opt.opt_name, opt, opt.opt_params)
        return {
            **optimizer_keys,
            C.OPT_BASE_LR: lr,
            C.OPT_END_LR: self.end_learning_rate(),
            C.OPT_LR_WARMUP_STEPS: warmup,
            C.OPT_LR_DECAY_STEPS: self.decay_steps(),
            C.OPT_LR_DECAY_SCHEDULE: DECAY_SCHEDULE,
            C.OPT_GRADIENT_CLIP_NORM: float(self.config.gradient_clip_norm),
            C.MAX_SEQUENCE_LENGTH: self.config.data.max_sequence_length,
            MAX_STEPS: opt.max_steps,
        }
