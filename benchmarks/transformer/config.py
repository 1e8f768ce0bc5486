"""Provides the Transformer benchmark's config dataclasses and its `mlperf`, `mini` and `smoke` presets.

Batch sizes are in tokens, as in MLPerf's translation logs (NVIDIA/fairseq log
`global_batch_size` = max tokens per step over all GPUs): `global_batch_size` is the number of
token slots (batch x padded length, counting the longer of source and target) in one optimizer
step over all replicas. `train_examples`/`eval_examples` count sentence pairs (MLPerf's
`train_samples`/`eval_samples`); where prepared data has a `metadata.json`, the benchmark reads
the real counts from it.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from mlperf_tf import paths
from mlperf_tf.config import BenchmarkConfig, ConfigError, require
from mlperf_tf.optimizers import registry
from mlperf_tf.spmd import MoEConfig

NAME = "transformer"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Transformer shape and decoding settings (see `model.TransformerParams`)."""

    vocab_size: int = 33708  # the reference's WMT en-de subword vocabulary
    hidden_size: int = 1024
    num_layers: int = 6
    num_heads: int = 16
    filter_size: int = 4096
    dropout: float = 0.1
    attention_dropout: float = 0.1
    relu_dropout: float = 0.1
    beam_size: int = 4  # 1 decodes greedily
    alpha: float = 0.6  # length-penalty exponent of the beam search
    extra_decode_length: int = 50  # decoded positions = eval source length + this
    # Mixture-of-experts feed-forward blocks (ST-MoE); num_experts=0 keeps the dense model.
    moe: MoEConfig = MoEConfig()


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """Adam with linear warmup and rsqrt decay; fields are named after their MLPerf log keys.

    The learning rate at step s is `opt_base_learning_rate * hidden_size**-0.5 *
    min(1, s / W) / sqrt(max(s, W))` with W = `opt_learning_rate_warmup_steps`
    (`mlperf_tf.optimizers.WarmupRsqrtDecay` with `factor=hidden_size**-0.5`).
    """

    # adam (Keras 3 has no lazy, sparse Adam), or any registered optimizer
    # (`mlperf_tf.optimizers.registry`) on the same schedule, with `opt_params` "key=value"s.
    opt_name: str = "adam"
    opt_params: tuple[str, ...] = ()
    opt_base_learning_rate: float = 2.0
    opt_learning_rate_warmup_steps: int = 16000
    opt_adam_beta_1: float = 0.9
    opt_adam_beta_2: float = 0.997
    opt_adam_epsilon: float = 1e-9
    label_smoothing: float = 0.1

    def __post_init__(self):
        registry.check_opt_name(self.opt_name, native=("adam",))


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Sequence lengths and length buckets.

    A pair's length is the longer of its source and target (ids, EOS included). Training batches
    come from length buckets (`buckets`: the `bucket_lengths` below `max_sequence_length`, then
    `max_sequence_length` itself): bucket i holds pairs of length in (L[i-1], L[i]], padded to
    exactly L[i], in batches of `floor(tokens_per_replica / L[i])` pairs rounded down to a
    multiple of `batch_multiple`. So every bucket has one static shape [batch, length] (each
    traces once, and compiles once under XLA). `cache_train` keeps the parsed training pairs in
    memory after the first epoch (small sets: the mini data), so later epochs skip the reading
    and parsing; the shuffle still differs every epoch.
    """

    max_sequence_length: int = 256  # MLPerf's max_sequence_length
    max_length_method: Literal["truncate", "discard"] = "discard"
    bucket_lengths: tuple[int, ...] = (16, 32, 48, 64, 96, 128, 192, 256)
    batch_multiple: int = 8  # TPU-friendly batch sizes
    eval_max_length: int = 256  # eval sources are padded (or truncated) to this
    shuffle_buffer: int = 100000
    cache_train: bool = False

    @property
    def buckets(self) -> tuple[int, ...]:
        """The padded lengths of the buckets: `bucket_lengths` capped by `max_sequence_length`."""
        below = tuple(b for b in self.bucket_lengths if b < self.max_sequence_length)
        return below + (self.max_sequence_length,)

    # The mini data's held-out split and vocabulary seed: the data's, fixed per preset (not the
    # run's seed), so every run sees the same split. The held-out size is `eval_examples`.
    split_seed: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransformerConfig(BenchmarkConfig):
    """The Transformer benchmark's config (sizes in tokens for batches, pairs for examples)."""

    model: ModelConfig = ModelConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    data: DataConfig = DataConfig()

    def __post_init__(self):
        super().__post_init__()
        d = self.data
        if (
            list(d.bucket_lengths) != sorted(set(d.bucket_lengths))
            or min(d.bucket_lengths, default=1) <= 0
        ):
            raise ConfigError(
                f"`data.bucket_lengths` ({d.bucket_lengths!r}) must be increasing and positive."
            )
        require(d, prefix="data.", positive_int=("max_sequence_length", "eval_max_length"))
        require(self.model, prefix="model.", positive_int=("beam_size",))
        if self.global_batch_size < d.max_sequence_length:
            raise ConfigError(
                f"`global_batch_size` ({self.global_batch_size} tokens) must hold at least one "
                f"pair of `data.max_sequence_length` ({d.max_sequence_length})."
            )
        if self.model.hidden_size % self.model.num_heads:
            raise ConfigError(
                f"`model.hidden_size` ({self.model.hidden_size}) must be divisible by "
                f"`model.num_heads` ({self.model.num_heads})."
            )


def mlperf() -> TransformerConfig:
    """MLPerf v0.6/v0.7 Transformer-big on WMT17 en->de, scored on newstest2014.

    Command: `mlperf-tf run --benchmark=transformer --preset=mlperf --model_dir=DIR
    --config.data_dir=WMT_TFRECORDS` (data from `python -m benchmarks.transformer.prepare`).
    Hardware: 8 accelerators (4096 tokens each, the reference's Transformer-big batch) or a TPU
    slice. Expected: uncased BLEU 25 (logged 0.25) in about 3-6 epochs (MLPerf v0.7 results).
    Hyperparameters: tensorflow/models `official/legacy/transformer/model_params.py` BIG_PARAMS
    (learning_rate 2.0, warmup 16000, Adam 0.9/0.997/1e-9, label smoothing 0.1, beam 4,
    alpha 0.6, max_length 256 with too-long pairs dropped).
    """
    return TransformerConfig(
        global_batch_size=32768,
        eval_batch_size=64,
        train_examples=4590101,  # WMT17 en-de training pairs (MLPerf's train_samples)
        eval_examples=3003,  # newstest2014
        max_epochs=10,
        quality_target=0.25,
    )


def mini_model() -> ModelConfig:
    """The mini's Transformer: 2+2 layers, hidden 128, filter 512, 4 heads, 4000 subwords (1.4M
    parameters), decoding up to 8 positions past the source."""
    return ModelConfig(
        vocab_size=4000,
        hidden_size=128,
        num_layers=2,
        num_heads=4,
        filter_size=512,
        extra_decode_length=8,
    )


def mini() -> TransformerConfig:
    """English->German UI messages from this machine's gettext catalogs; a small Transformer.

    Command: `mlperf-tf run --benchmark=transformer --preset=mini --model_dir=/tmp/tr_mini`
    (the data is written on first use from /usr/share/locale/de/LC_MESSAGES/*.mo).
    Hardware: 2 CPU cores. Expected: held-out uncased BLEU >= 0.25 (MLPerf's target value) after
    about 4 epochs of ~175 steps, under 15 minutes (README.md has the measured curve).
    Model: `mini_model`. The optimizer is the reference's but for a 400-step warm-up.
    """
    return TransformerConfig(
        global_batch_size=2048,
        eval_batch_size=250,
        train_examples=26731,  # replaced by metadata.json's count once the data is prepared
        eval_examples=500,  # the held-out pairs
        max_epochs=10,
        quality_target=0.25,
        data_dir=paths.mini_data_dir(NAME),
        model=mini_model(),
        optimizer=OptimizerConfig(opt_learning_rate_warmup_steps=400),
        data=DataConfig(
            max_sequence_length=32,
            bucket_lengths=(8, 12, 16, 24, 32),
            eval_max_length=32,
            # The first epoch's shuffle emits its first pair after this many parsed ones, and the
            # wait counts in the time to train (the whole 26,731-pair set: 12.4 s to the first
            # batch at load ~3.5; 8,192: 3.7 s; 2,048: first loop's input wait 0.42 s vs 1.1 s
            # at 8,192, idle machine). Still a permutation per epoch, over records that prepare
            # wrote in a seeded random order; the reference shuffles only its files
            # (tensorflow/models official/nlp/transformer/data_pipeline.py, "Shuffling").
            shuffle_buffer=2048,
            cache_train=True,
        ),
    )


def smoke() -> TransformerConfig:
    """Synthetic ids through a tiny model: checks the plumbing in seconds.

    Command: `mlperf-tf run --benchmark=transformer --preset=smoke --model_dir=/tmp/tr_smoke`.
    Hardware: any CPU; seconds. Quality: meaningless (random ids): the run evaluates after each
    of its 2 epochs and ends "aborted", since random ids do not reach MLPerf's 0.25.
    """
    return TransformerConfig(
        global_batch_size=64,
        eval_batch_size=8,
        train_examples=32,
        eval_examples=8,
        max_epochs=2,
        quality_target=0.25,
        data_dir="",
        # The mini's 2+2 layers of 4 heads, narrower, on a 64-id vocabulary.
        model=dataclasses.replace(
            mini_model(), vocab_size=64, hidden_size=32, filter_size=64, extra_decode_length=4
        ),
        optimizer=OptimizerConfig(opt_learning_rate_warmup_steps=4),
        data=DataConfig(
            max_sequence_length=8,
            bucket_lengths=(8,),
            batch_multiple=1,
            eval_max_length=8,
            shuffle_buffer=16,
        ),
    )
