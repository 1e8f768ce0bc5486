"""Provides the Llama input: packed token windows (TFRecords or synthetic) to per-replica batches.

A record holds one window `tokens` (int64 [max_sequence_length + 1]) of the packed token stream
(documents joined by the end-of-text token, see prepare.py). As Megatron's GPT dataset does,
consecutive windows share one token: a window's inputs are `tokens[:-1]` and its labels
`tokens[1:]`. Examples come out as int32 `input_ids` and `labels` [max_sequence_length].
"""

from __future__ import annotations

import tensorflow as tf

from benchmarks.llama31_8b.config import LlamaConfig
from mlperf_tf.data.parsed import ParsedInput

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


# The standard input hooks (`Benchmark.input_module`), made from the two functions above.
INPUT = ParsedInput(what="Llama", make_parse_fn=make_parse_fn, synthetic_example=synthetic_example)
