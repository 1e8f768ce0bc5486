"""Provides the BERT input: MLPerf pretraining TFRecords (or synthetic batches) to per-replica batches.

Records hold the seven keys of the MLPerf reference's `create_pretraining_data.py` (see
prepare.py): `input_ids`, `input_mask`, `segment_ids` (int64 [max_seq_length]),
`masked_lm_positions`, `masked_lm_ids` (int64 [max_predictions_per_seq]), `masked_lm_weights`
(float [max_predictions_per_seq]) and `next_sentence_labels` (int64 [1]). Examples come out with
int32 ids/masks/labels (`next_sentence_labels` as a scalar) and float32 weights.
"""

from __future__ import annotations

import tensorflow as tf

from benchmarks.bert.config import BertConfig
from mlperf_tf.data.parsed import ParsedInput

INT_KEYS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids")


def feature_spec(max_seq_length: int, max_predictions_per_seq: int) -> dict:
    """`tf.io.parse_single_example` features of an MLPerf BERT record."""
    s, p = max_seq_length, max_predictions_per_seq
    return {
        "input_ids": tf.io.FixedLenFeature([s], tf.int64),
        "input_mask": tf.io.FixedLenFeature([s], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([s], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([p], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([p], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([p], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }


def make_parse_fn(config: BertConfig):
    """Returns serialized record -> example dict (int32 ids, float32 weights, scalar label).

    A record whose lengths differ from the config's fails to parse (a bad record).
    """
    spec = feature_spec(config.data.max_seq_length, config.data.max_predictions_per_seq)

    def parse(serialized: tf.Tensor) -> dict[str, tf.Tensor]:
        raw = tf.io.parse_single_example(serialized, spec)
        # int32: TPUs and XLA prefer it, and ids fit (vocab 30522, positions < 512).
        example = {key: tf.cast(raw[key], tf.int32) for key in INT_KEYS}
        example["masked_lm_weights"] = raw["masked_lm_weights"]
        example["next_sentence_labels"] = tf.cast(raw["next_sentence_labels"][0], tf.int32)
        return example

    return parse


def synthetic_example(config: BertConfig, seed: int) -> dict[str, tf.Tensor]:
    """A random example with the real structure: a padded sentence pair and its masked slots.

    The true length is in [max_seq_length/2, max_seq_length]; segment B starts halfway;
    `masked_lm_positions` are distinct positions inside the sequence, with weight 1 for all but
    the last slot (padding, weight 0), as real records have.
    """
    s, p = config.data.max_seq_length, config.data.max_predictions_per_seq
    vocab = config.model.vocab_size
    # [5, 2] stateless seeds; `seed` may be a Python int or a scalar tensor (in a map).
    seeds = tf.stack([tf.fill([5], tf.cast(seed, tf.int32)), tf.range(5, dtype=tf.int32)], axis=1)
    length = tf.random.stateless_uniform([], seeds[0], s // 2, s + 1, tf.int32)
    ids = tf.random.stateless_uniform([s], seeds[1], 5, vocab, tf.int32)
    mask = tf.cast(tf.range(s) < length, tf.int32)
    segments = tf.cast(tf.range(s) >= length // 2, tf.int32) * mask
    # Distinct positions in [1, length): the first p of a random permutation, sorted.
    scores = tf.random.stateless_uniform([s], seeds[2])
    scores = tf.where((tf.range(s) >= 1) & (tf.range(s) < length), scores, -1.0)
    positions = tf.sort(tf.math.top_k(scores, k=p).indices)
    weights = tf.cast(tf.range(p) < max(1, p - 1), tf.float32)
    labels = tf.random.stateless_uniform([p], seeds[3], 5, vocab, tf.int32)
    nsp = tf.random.stateless_uniform([], seeds[4], 0, 2, tf.int32)
    return {
        "input_ids": ids * mask,
        "input_mask": mask,
        "segment_ids": segments,
        "masked_lm_positions": positions * tf.cast(weights > 0, tf.int32),
        "masked_lm_ids": labels * tf.cast(weights > 0, tf.int32),
        "masked_lm_weights": weights,
        "next_sentence_labels": nsp,
    }


# The standard input hooks (`Benchmark.input_module`), made from the two functions above.
INPUT = ParsedInput(what="BERT", make_parse_fn=make_parse_fn, synthetic_example=synthetic_example)
