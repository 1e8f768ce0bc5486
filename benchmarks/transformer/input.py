"""Provides the Transformer's input pipelines: token-count batches in length buckets, and eval.

Training batches hold about `tokens_per_replica` token slots each. A pair's length is the longer
of its source and target ids (EOS included); pairs longer than `max_sequence_length` are dropped
(`discard`) or cut (`truncate`). Bucket i takes the pairs of length in
(bucket_lengths[i-1], bucket_lengths[i]] and pads both sides to exactly bucket_lengths[i], in
batches of `floor(tokens_per_replica / bucket_lengths[i])` pairs (rounded down to a multiple of
`batch_multiple`) with `drop_remainder`, so every bucket has one static shape `[batch, length]`.
The mini preset's buckets (8, 12, 16, 24, 32) with 2048 tokens give shapes [256, 8], [168, 12],
[128, 16], [80, 24] and [64, 32].

Eval batches are `[batch, eval_max_length]`, padded with all-zero examples to a fixed number of
batches (`mlperf_tf.data.pipeline.eval_pipeline`), each example carrying its `index` in the
eval references file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import tensorflow as tf

from mlperf_tf.data import pipeline

EOS_ID = 1
FIRST_WORD_ID = 3  # ids 0, 1, 2 are pad, EOS and unk
# Examples per batch of the shared training pipeline before they are regrouped into buckets:
# amortizes its per-batch bad-record bookkeeping.
_READ_BATCH = 64


def parse_pair(serialized: tf.Tensor) -> dict[str, tf.Tensor]:
    """A TFRecord with `inputs`/`targets` int64 lists (and an optional `index`) -> int32 tensors.

    Returns:
      {"inputs": [src_len], "targets": [tgt_len], "index": scalar (-1 when absent)}, int32.
    """
    features = tf.io.parse_single_example(
        serialized,
        {
            "inputs": tf.io.VarLenFeature(tf.int64),
            "targets": tf.io.VarLenFeature(tf.int64),
            "index": tf.io.FixedLenFeature([], tf.int64, default_value=-1),
        },
    )
    return {
        "inputs": tf.cast(tf.sparse.to_dense(features["inputs"]), tf.int32),
        "targets": tf.cast(tf.sparse.to_dense(features["targets"]), tf.int32),
        "index": tf.cast(features["index"], tf.int32),
    }


def bucket_batch_sizes(
    bucket_lengths: Sequence[int], tokens_per_replica: int, batch_multiple: int = 1
) -> list[int]:
    """Pairs per batch in each bucket: floor(tokens / length), down to a multiple of batch_multiple.

    Raises:
      ValueError: a bucket would hold no pair (the token budget is too small for its length).
    """
    if batch_multiple <= 0:
        raise ValueError(f"`batch_multiple` ({batch_multiple}) must be positive.")
    sizes = []
    for length in bucket_lengths:
        size = (tokens_per_replica // length) // batch_multiple * batch_multiple
        if size <= 0:
            raise ValueError(
                f"`tokens_per_replica` ({tokens_per_replica}) holds no batch of "
                f"{batch_multiple} pairs of length {length}; raise global_batch_size."
            )
        sizes.append(size)
    return sizes


def _fit_to_max_length(example: Mapping[str, tf.Tensor], max_length: int, method: str) -> dict:
    """Per-example training transform: static [max_length] ids, the pair length and a keep flag."""
    inputs, targets = example["inputs"], example["targets"]
    length = tf.maximum(tf.size(inputs), tf.size(targets))
    if method == "discard":
        keep = length <= max_length
    else:  # truncate
        keep = tf.constant(True)
    inputs, targets = inputs[:max_length], targets[:max_length]
    pad_in = max_length - tf.size(inputs)
    pad_tgt = max_length - tf.size(targets)
    return {
        "inputs": tf.ensure_shape(tf.pad(inputs, [[0, pad_in]]), [max_length]),
        "targets": tf.ensure_shape(tf.pad(targets, [[0, pad_tgt]]), [max_length]),
        "length": tf.minimum(length, max_length),
        "keep": keep,
    }


def bucketize(
    examples: tf.data.Dataset,
    *,
    bucket_lengths: Sequence[int],
    batch_sizes: Sequence[int],
) -> tf.data.Dataset:
    """Groups {"inputs", "targets", "length"} examples into per-bucket `[batch, length]` batches.

    Args:
      examples: examples whose ids are padded to any length >= their `length`.
      bucket_lengths: increasing padded lengths; every example's `length` must be <= the last.
      batch_sizes: pairs per batch of each bucket.

    Returns:
      Batches {"inputs", "targets"} int32 `[batch_sizes[i], bucket_lengths[i]]`.
    """
    if len(bucket_lengths) != len(batch_sizes):
        raise ValueError(
            f"`bucket_lengths` ({list(bucket_lengths)}) and `batch_sizes` ({list(batch_sizes)}) "
            "must have the same length."
        )

    def trim(example):
        length = example["length"]
        return {"inputs": example["inputs"][:length], "targets": example["targets"][:length]}

    # Bucket i holds lengths in [boundaries[i-1], boundaries[i]) = (L[i-1], L[i]] and is padded
    # to boundaries[i] - 1 = L[i]; the extra last bucket (length > L[-1]) never fills.
    return examples.map(trim, num_parallel_calls=tf.data.AUTOTUNE).bucket_by_sequence_length(
        element_length_func=lambda example: tf.shape(example["inputs"])[0],
        bucket_boundaries=[length + 1 for length in bucket_lengths],
        bucket_batch_sizes=list(batch_sizes) + [1],
        pad_to_bucket_boundary=True,
        drop_remainder=True,
    )


def train_dataset(
    files: Sequence[str],
    *,
    input_context: tf.distribute.InputContext | None,
    tokens_per_replica: int,
    max_length: int,
    method: str,
    bucket_lengths: Sequence[int],
    batch_multiple: int,
    shuffle_buffer: int,
    seed: int,
    cache: bool = False,
    skip_bad_records: bool = False,
) -> tf.data.Dataset:
    """An endless dataset of per-replica training batches, bucketed by length.

    Reading, sharding, shuffling (of serialized records) and the bad-record checks are
    `mlperf_tf.data.pipeline.training_pipeline`'s, with batches of examples of static shape
    [max_length]; they are unbatched, filtered (`discard`) and regrouped into buckets.

    Args:
      files: training TFRecord files.
      input_context: the dataset function's input context, or None.
      tokens_per_replica: token slots per batch (batch x padded length).
      max_length: MLPerf's max_sequence_length.
      method: "discard" drops longer pairs, "truncate" cuts them.
      bucket_lengths: padded lengths of the buckets, increasing, the last one `max_length`.
      batch_multiple: batch sizes are rounded down to a multiple of this.
      shuffle_buffer: records in the shuffle buffer.
      seed: shuffle seed.
      cache: keep the parsed pairs in memory after the first epoch (`training_pipeline`).
      skip_bad_records: skip and report corrupt records instead of failing.

    Returns:
      Batches {"inputs", "targets"}: int32 [batch, length], one static shape per bucket.
    """
    if method not in ("discard", "truncate"):
        raise ValueError(f"`method` ({method!r}) must be 'discard' or 'truncate'.")
    if bucket_lengths[-1] != max_length:
        raise ValueError(
            f"the last bucket length ({bucket_lengths[-1]}) must be `max_length` ({max_length})."
        )
    batch_sizes = bucket_batch_sizes(bucket_lengths, tokens_per_replica, batch_multiple)
    read = pipeline.training_pipeline(
        files,
        input_context=input_context,
        parse_fn=parse_pair,
        transform_fn=lambda example: _fit_to_max_length(example, max_length, method),
        batch_size=_READ_BATCH,
        shuffle_buffer=shuffle_buffer,
        seed=seed,
        cache=cache,
        skip_bad_records=skip_bad_records,
    )
    examples = read.unbatch().filter(lambda example: example["keep"])
    batches = bucketize(examples, bucket_lengths=bucket_lengths, batch_sizes=batch_sizes)
    return batches.prefetch(tf.data.AUTOTUNE)


def _fit_eval(example: Mapping[str, tf.Tensor], eval_max_length: int) -> dict:
    """Per-example eval transform: static [eval_max_length] ids (truncated if longer)."""

    def fit(ids):
        ids = ids[:eval_max_length]
        return tf.ensure_shape(
            tf.pad(ids, [[0, eval_max_length - tf.size(ids)]]), [eval_max_length]
        )

    return {
        "inputs": fit(example["inputs"]),
        "targets": fit(example["targets"]),
        "index": example["index"],
    }


def eval_dataset(
    files: Sequence[str],
    *,
    input_context: tf.distribute.InputContext | None,
    batch_size: int,
    num_batches: int,
    eval_max_length: int,
    skip_bad_records: bool = False,
) -> tf.data.Dataset:
    """Exactly `num_batches` eval batches of this pipeline's shard, in file order.

    Returns:
      Batches {"inputs", "targets": int32 [batch, eval_max_length], "index": int32 [batch],
      "valid": float32 [batch]} (padding examples: all zeros, `valid` 0).
    """
    return pipeline.eval_pipeline(
        files,
        input_context=input_context,
        parse_fn=parse_pair,
        transform_fn=lambda example: _fit_eval(example, eval_max_length),
        batch_size=batch_size,
        num_batches=num_batches,
        skip_bad_records=skip_bad_records,
    )


def synthetic_pairs(
    num_pairs: int, *, vocab_size: int, max_length: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Random id sequences (a copy task: targets = inputs), zero-padded to `max_length`.

    Returns:
      (inputs, targets): int32 [num_pairs, max_length], each row 1..max_length ids ending in EOS.
    """
    if vocab_size <= FIRST_WORD_ID:
        raise ValueError(f"`vocab_size` ({vocab_size}) must exceed {FIRST_WORD_ID}.")
    rng = np.random.default_rng(seed)
    ids = np.zeros([num_pairs, max_length], np.int32)
    for row in range(num_pairs):
        length = int(rng.integers(1, max_length + 1))
        ids[row, : length - 1] = rng.integers(FIRST_WORD_ID, vocab_size, size=length - 1)
        ids[row, length - 1] = EOS_ID
    return ids, ids.copy()


def synthetic_train_dataset(
    *, tokens_per_replica: int, max_length: int, vocab_size: int, seed: int
) -> tf.data.Dataset:
    """One fixed random batch [tokens_per_replica // max_length, max_length], repeated forever."""
    batch = max(1, tokens_per_replica // max_length)
    inputs, targets = synthetic_pairs(
        batch, vocab_size=vocab_size, max_length=max_length, seed=seed
    )
    dataset = tf.data.Dataset.from_tensors({"inputs": inputs, "targets": targets}).repeat()
    return dataset.prefetch(1)


def synthetic_eval_dataset(
    *,
    input_context: tf.distribute.InputContext | None,
    num_examples: int,
    batch_size: int,
    num_batches: int,
    eval_max_length: int,
    vocab_size: int,
    seed: int,
) -> tf.data.Dataset:
    """The synthetic eval set (`num_examples` random pairs), sharded and padded like real eval."""
    inputs, targets = synthetic_pairs(
        num_examples, vocab_size=vocab_size, max_length=eval_max_length, seed=seed
    )
    examples = tf.data.Dataset.from_tensor_slices(
        {"inputs": inputs, "targets": targets, "index": np.arange(num_examples, dtype=np.int32)}
    )
    if input_context is not None and input_context.num_input_pipelines > 1:
        examples = examples.shard(
            input_context.num_input_pipelines, input_context.input_pipeline_id
        )
    return pipeline.pad_eval_dataset(examples, batch_size=batch_size, num_batches=num_batches)


def steps_per_epoch(
    length_histogram: Mapping[int, int],
    *,
    bucket_lengths: Sequence[int],
    batch_sizes: Sequence[int],
    num_replicas: int,
    max_length: int,
    method: str,
) -> int:
    """Optimizer steps that consume one epoch of pairs, given the pair-length histogram.

    Each step takes one batch per batch shard (`num_replicas`: the replicas that read different
    batches, `Benchmark.batch_shards`; a model group's replicas share one); a bucket with `n`
    pairs and batches of `b` fills `n / b` batches, so an epoch is `sum(n_i / b_i) /
    num_replicas` steps (at least 1).
    """
    batches = 0.0
    for length, count in length_histogram.items():
        length = int(length)
        if length > max_length:
            if method == "discard":
                continue
            length = max_length
        bucket = next(i for i, bound in enumerate(bucket_lengths) if length <= bound)
        batches += count / batch_sizes[bucket]
    return max(1, int(round(batches / max(1, num_replicas))))
