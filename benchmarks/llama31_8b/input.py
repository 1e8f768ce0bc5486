"""Provides the Llama input: packed token windows (TFRecords or synthetic) to per-replica batches.

A record holds one window `tokens` (int64 [max_sequence_length + 1]) of the packed token stream
(documents joined by the end-of-text token, see prepare.py). As Megatron's GPT dataset does,
consecutive windows share one token: a window's inputs are `tokens[:-1]` and its labels
`tokens[1:]`. Examples come out as int32 `input_ids` and `labels` [max_sequence_length].
"""

from __future__ import annotations

import os

import tensorflow as tf

from benchmarks.llama31_8b.config import LlamaConfig
from mlperf_tf.data import eval_pipeline, list_files, training_pipeline

TOKENS = "tokens"


def feature_spec(max_sequence_length: int) -> dict:
    """`tf.io.parse_single_example` features of one window record."""
    return {TOKENS: tf.io.FixedLenFeature([max_sequence_length + 1], tf.int64)}


def split_window(tokens: tf.Tensor) -> dict[str, tf.Tensor]:
    """A window [..., seq + 1] -> {"input_ids": [..., seq], "labels": [..., seq]} (int32)."""
    tokens = tf.cast(tokens, tf.int32)
    return {"input_ids": tokens[..., :-1], "labels": tokens[..., 1:]}


def make_parse_fn(config: LlamaConfig):
    """Returns serialized record -> example dict; a window of another length fails to parse."""
    spec = feature_spec(config.data.max_sequence_length)

    def parse(serialized: tf.Tensor) -> dict[str, tf.Tensor]:
        return split_window(tf.io.parse_single_example(serialized, spec)[TOKENS])

    return parse


def train_files(config: LlamaConfig) -> list[str]:
    return list_files(
        os.path.join(config.data_dir, config.data.train_pattern), what="Llama train TFRecord"
    )


def eval_files(config: LlamaConfig) -> list[str]:
    return list_files(
        os.path.join(config.data_dir, config.data.eval_pattern), what="Llama eval TFRecord"
    )


def train_dataset(
    config: LlamaConfig,
    *,
    input_context: tf.distribute.InputContext | None,
    batch_size: int,
    seed: int,
    skip_bad_records: bool = False,
) -> tf.data.Dataset:
    """Endless shuffled per-replica training batches of this pipeline's shard of the files."""
    return training_pipeline(
        train_files(config),
        input_context=input_context,
        parse_fn=make_parse_fn(config),
        transform_fn=None,
        batch_size=batch_size,
        shuffle_buffer=config.data.shuffle_buffer,
        seed=seed,
        skip_bad_records=skip_bad_records,
    )


def eval_dataset(
    config: LlamaConfig,
    *,
    input_context: tf.distribute.InputContext | None,
    batch_size: int,
    num_batches: int,
    skip_bad_records: bool = False,
) -> tf.data.Dataset:
    """Exactly `num_batches` per-replica eval batches (in file order, unshuffled, as the
    reference reads its validation set), with `valid`."""
    return eval_pipeline(
        eval_files(config),
        input_context=input_context,
        parse_fn=make_parse_fn(config),
        transform_fn=None,
        batch_size=batch_size,
        num_batches=num_batches,
        skip_bad_records=skip_bad_records,
    )


def synthetic_example(config: LlamaConfig, seed) -> dict[str, tf.Tensor]:
    """A window of uniformly random token ids (seed: int or scalar tensor)."""
    op_seed = tf.stack([tf.cast(seed, tf.int32), tf.constant(7, tf.int32)])
    tokens = tf.random.stateless_uniform(
        [config.data.max_sequence_length + 1],
        op_seed,
        minval=0,
        maxval=config.model.vocab_size,
        dtype=tf.int32,
    )
    return split_window(tokens)


def synthetic_train_dataset(config: LlamaConfig, *, batch_size: int, seed: int) -> tf.data.Dataset:
    """One fixed random batch repeated forever (no input cost)."""
    from mlperf_tf.data import synthetic_dataset  # noqa: PLC0415 (as bert/input.py)

    return synthetic_dataset(
        lambda s: synthetic_example(config, s), batch_size=batch_size, seed=seed
    )


def synthetic_eval_dataset(
    config: LlamaConfig, *, batch_size: int, num_batches: int, seed: int
) -> tf.data.Dataset:
    """`num_batches` batches of random windows (`eval_examples` of them, the rest padding)."""
    from mlperf_tf.data import synthetic  # noqa: PLC0415

    return synthetic.synthetic_eval_dataset(
        lambda s: synthetic_example(config, s),
        count=config.eval_examples,
        batch_size=batch_size,
        num_batches=num_batches,
        seed=seed + 1_000_000,
    )
