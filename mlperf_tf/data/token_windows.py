"""Provides the language-model input of packed token windows (TFRecords or synthetic) as examples.

A record holds one window `tokens` (int64 [max_sequence_length + 1]) of the packed token stream
(documents joined by the end-of-text token, `mlperf_tf.data.c4`). As Megatron's GPT dataset
does, consecutive windows share one token: a window's inputs are `tokens[:-1]` and its labels
`tokens[1:]`. Examples come out as int32 `input_ids` and `labels` [max_sequence_length].

The functions take a benchmark config with `data.max_sequence_length` and `model.vocab_size`;
a benchmark's `input.py` makes its `ParsedInput` hooks from them.
"""

from __future__ import annotations

import tensorflow as tf

TOKENS = "tokens"


def feature_spec(max_sequence_length: int) -> dict:
    """`tf.io.parse_single_example` features of one window record."""
    return {TOKENS: tf.io.FixedLenFeature([max_sequence_length + 1], tf.int64)}


def split_window(tokens: tf.Tensor) -> dict[str, tf.Tensor]:
    """A window [..., seq + 1] -> {"input_ids": [..., seq], "labels": [..., seq]} (int32)."""
    tokens = tf.cast(tokens, tf.int32)
    return {"input_ids": tokens[..., :-1], "labels": tokens[..., 1:]}


def make_parse_fn(config):
    """Returns serialized record -> example dict; a window of another length fails to parse."""
    spec = feature_spec(config.data.max_sequence_length)

    def parse(serialized: tf.Tensor) -> dict[str, tf.Tensor]:
        return split_window(tf.io.parse_single_example(serialized, spec)[TOKENS])

    return parse


def synthetic_example(config, seed) -> dict[str, tf.Tensor]:
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
