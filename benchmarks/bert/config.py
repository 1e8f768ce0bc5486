"""Provides `BertConfig`, the BERT pretraining benchmark's frozen config, and its presets."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Literal

from mlperf_tf import paths
from mlperf_tf.config import SMOKE_BATCH, BenchmarkConfig, ConfigError, require, smoke_sizes
from mlperf_tf.optimizers import registry

# MLPerf's rule for the BERT eval cadence, in training samples (see README.md, "Evaluation").
EvalRule = Literal["v0.7", "v1.0"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The encoder's shape; field names are those of google-research/bert's `bert_config.json`.

    The defaults are BERT-large (MLPerf's model): 24 layers, hidden 1024, 16 heads.
    """

    vocab_size: int = 30522
    hidden_size: int = 1024
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    intermediate_size: int = 4096
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_epsilon: float = 1e-12

    def __post_init__(self):
        require(
            self,
            prefix="model.",
            positive_int=(
                "vocab_size",
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "intermediate_size",
                "max_position_embeddings",
                "type_vocab_size",
            ),
            fraction=("hidden_dropout_prob", "attention_probs_dropout_prob"),
        )
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"`model.hidden_size` ({self.hidden_size}) must be divisible by "
                f"`model.num_attention_heads` ({self.num_attention_heads})."
            )


def bert_large() -> ModelConfig:
    """BERT-large: 24 layers, hidden 1024, 16 heads, intermediate 4096 (MLPerf's model)."""
    return ModelConfig()


def bert_base() -> ModelConfig:
    """BERT-base: 12 layers, hidden 768, 12 heads, intermediate 3072."""
    return ModelConfig(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072
    )


def bert_tiny(vocab_size: int = 30522) -> ModelConfig:
    """BERT-tiny (Turc et al.'s L-2/H-128): 2 layers, hidden 128, 2 heads, intermediate 512."""
    return ModelConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=512,
    )


def model_config_from_json(path: str) -> ModelConfig:
    """Reads a google-research `bert_config.json` into a `ModelConfig`.

    Keys our model does not use (`hidden_act` other than gelu aside) are ignored.

    Raises:
      ConfigError: the file is missing or not JSON, or `hidden_act` is not "gelu".
    """
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"cannot read bert_config_file '{path}': {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"bert_config_file '{path}' is not a JSON object")
    act = raw.get("hidden_act", "gelu")
    if act != "gelu":
        raise ConfigError(f"bert_config_file '{path}': hidden_act {act!r} is not supported (gelu)")
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    return ModelConfig(**{k: v for k, v in raw.items() if k in names})


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """LAMB and its learning-rate schedule; fields are named after their MLPerf log keys, and
    the defaults are the MLPerf reference's (the `mlperf` preset's).

    The schedule is the MLPerf reference's (optimization.py): a polynomial decay of
    `opt_base_learning_rate` to 0 over `opt_learning_rate_training_steps`, overridden during
    warmup by a linear ramp that reaches the base rate `num_warmup_steps` steps after
    `start_warmup_step` (negative: the ramp started before step 0, as when resuming from a
    checkpoint).
    """

    # lamb (the reference), or any registered optimizer (`mlperf_tf.optimizers.registry`) on the
    # same schedule and clipping, with `opt_params` "key=value"s.
    opt_name: str = "lamb"
    opt_params: tuple[str, ...] = ()
    opt_base_learning_rate: float = 0.00288293
    opt_epsilon: float = 1e-6
    opt_lamb_beta_1: float = 0.88
    opt_lamb_beta_2: float = 0.88
    opt_lamb_weight_decay_rate: float = 0.0166629
    # 0 means the run's step budget (`max_epochs` * steps per epoch).
    opt_learning_rate_training_steps: int = 0
    num_warmup_steps: int = 287
    start_warmup_step: int = -76
    opt_lamb_learning_rate_decay_poly_power: float = 1.0

    def __post_init__(self):
        registry.check_opt_name(self.opt_name, native=("lamb",))
        require(
            self,
            prefix="optimizer.",
            positive=("opt_base_learning_rate",),
            non_negative_int=("opt_learning_rate_training_steps", "num_warmup_steps"),
            fraction=("opt_lamb_beta_1", "opt_lamb_beta_2"),
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Pretraining TFRecords: where they are (under `data_dir`) and their fixed shapes."""

    max_seq_length: int = 512
    max_predictions_per_seq: int = 76
    train_pattern: str = "train/*.tfrecord"  # glob under data_dir
    eval_pattern: str = "eval/*.tfrecord"  # glob under data_dir
    shuffle_buffer: int = 1000  # examples; the reference shuffles files, then 100 records

    def __post_init__(self):
        if self.max_seq_length < 8:
            raise ConfigError(f"`data.max_seq_length` ({self.max_seq_length!r}) must be >= 8.")
        if not 1 <= self.max_predictions_per_seq <= self.max_seq_length:
            raise ConfigError(
                f"`data.max_predictions_per_seq` ({self.max_predictions_per_seq!r}) must be in "
                f"[1, max_seq_length={self.max_seq_length}]."
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class BertConfig(BenchmarkConfig):
    """BERT pretraining (MLPerf language/bert). Sizes are in sequences (examples).

    `train_examples` is the training budget in samples (MLPerf's `train_samples`), so one
    "epoch" is the whole budget and `max_epochs` is normally 1. The eval cadence is in samples
    (`eval_rule`, `eval_every_samples`), so the epoch-based `eval_every_epochs` and
    `eval_offset_epochs` are unused.
    """

    # The reference clips the global gradient norm (of the mean gradient) to 1.0 before LAMB.
    gradient_clip_norm: float = 1.0

    model: ModelConfig = dataclasses.field(default_factory=bert_large)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    # A google-research bert_config.json; when set it replaces `model`.
    bert_config_file: str = ""
    # A TF1 BERT checkpoint prefix (e.g. .../model.ckpt-28252) to start from; "" = random init.
    init_checkpoint: str = ""
    # Which MLPerf round's eval cadence to follow when `eval_every_samples` is 0.
    eval_rule: EvalRule = "v1.0"
    eval_every_samples: int = 0  # 0: from `eval_rule` and the global batch size

    def __post_init__(self):
        super().__post_init__()
        require(self, non_negative_int=("eval_every_samples",))
        if self.data.max_seq_length > self.model.max_position_embeddings and not (
            self.bert_config_file
        ):
            raise ConfigError(
                f"`data.max_seq_length` ({self.data.max_seq_length}) exceeds "
                f"`model.max_position_embeddings` ({self.model.max_position_embeddings})."
            )


# ---- presets ------------------------------------------------------------------------------------


def mlperf() -> BertConfig:
    """MLPerf v0.7 reference hyperparameters for BERT-large from the MLPerf TF1 checkpoint.

    Command: `mlperf-tf run --benchmark=bert --preset=mlperf --model_dir=DIR
    --config.data_dir=WIKI_TFRECORDS --config.init_checkpoint=.../model.ckpt-28252
    --config.bert_config_file=.../bert_config.json`.
    Hardware: a TPU v3-8192 pod slice class machine (global batch 8192). Expected: masked-LM
    accuracy >= 0.712 in about 3.5M-4.6M samples (the v0.7 Google submission reached it within
    560 steps); data prepared by the MLPerf reference (500 shards + eval_10k).
    """
    return BertConfig(
        global_batch_size=8192,
        eval_batch_size=1000,
        train_examples=560 * 8192,
        eval_examples=10000,
        max_epochs=1.0,
        quality_target=0.712,
        model=bert_large(),
        # The reference's LAMB (OptimizerConfig's defaults) decaying over its 560 steps.
        optimizer=OptimizerConfig(opt_learning_rate_training_steps=560),
        data=DataConfig(max_seq_length=512, max_predictions_per_seq=76),
        # The MLPerf TFRecords (train/part-*, eval/eval_10k) made by the reference scripts;
        # they cannot be made offline, so there is no prepare step for them here.
        data_dir=os.path.join(paths.data_root(), "bert-wiki"),
        eval_rule="v0.7",
    )


def small_lamb(*, learning_rate: float, warmup_steps: int) -> OptimizerConfig:
    """LAMB of the `mini` and `smoke` presets: the common betas 0.9/0.999 and weight decay 0.01
    (the reference's 0.88/0.88 and 0.0166629 are tuned for batch 8,192), a warm-up of
    `warmup_steps` from step 0 and the decay over the run's step budget."""
    return OptimizerConfig(
        opt_base_learning_rate=learning_rate,
        opt_lamb_beta_1=0.9,
        opt_lamb_beta_2=0.999,
        opt_lamb_weight_decay_rate=0.01,
        num_warmup_steps=warmup_steps,
        start_warmup_step=0,
    )


# The mini dataset's shapes: prepare_mini writes exactly these (see prepare.py).
MINI_VOCAB_SIZE = 4096
MINI_SEQ_LENGTH = 64
MINI_MAX_PREDICTIONS = 10
MINI_EVAL_EXAMPLES = 2048


def mini() -> BertConfig:
    """A tiny BERT on the Python standard library's docstrings (offline English text).

    Command: `mlperf-tf run --benchmark=bert --preset=mini --model_dir=/tmp/bert_mini`
    (writes the data to `mlperf_tf.paths.mini_data_dir("bert")` on first use, 1-2 minutes).
    Hardware: 2 CPU cores. Expected: about 3 minutes on an idle machine (data included; 6-10
    minutes on a loaded one); the target 0.17 held-out masked-LM accuracy is reached at the
    second eval (64,000 samples, 1000 steps; the unigram baseline, always predicting ".", is
    0.057). See README.md for the measured runs.
    """
    return BertConfig(
        global_batch_size=64,
        eval_batch_size=256,
        train_examples=64 * 2000,
        eval_examples=MINI_EVAL_EXAMPLES,
        max_epochs=1.0,
        quality_target=0.17,
        model=dataclasses.replace(
            bert_tiny(MINI_VOCAB_SIZE),
            max_position_embeddings=MINI_SEQ_LENGTH,
            # No dropout: a few thousand steps over ~36k sequences do not overfit, and dropout
            # slowed the masked-LM accuracy down (0.136 vs 0.175 after 1000 steps).
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        ),
        optimizer=small_lamb(learning_rate=0.01, warmup_steps=100),
        data=DataConfig(
            max_seq_length=MINI_SEQ_LENGTH,
            max_predictions_per_seq=MINI_MAX_PREDICTIONS,
            shuffle_buffer=2000,
        ),
        data_dir=paths.mini_data_dir("bert"),
        eval_every_samples=64 * 500,
    )


def smoke() -> BertConfig:
    """Synthetic data and a 2-layer BERT with a 128-word vocabulary: a few steps, seconds.

    Command: `mlperf-tf run --benchmark=bert --preset=smoke --model_dir=/tmp/bert_smoke`.
    Hardware: any CPU. Expected: well under a minute; the accuracy is meaningless (random data).
    """
    return BertConfig(
        **smoke_sizes(eval_batch_size=8, eval_examples=16, quality_target=0.99),
        model=dataclasses.replace(
            bert_tiny(128), hidden_size=32, intermediate_size=64, max_position_embeddings=32
        ),
        optimizer=small_lamb(learning_rate=1e-3, warmup_steps=2),
        data=DataConfig(max_seq_length=32, max_predictions_per_seq=5),
        eval_every_samples=SMOKE_BATCH * 3,
    )
