"""Provides synthetic datasets: one fixed random batch repeated forever, with no input cost.

`smoke` presets and speed measurements use them to run a model without data on disk and without
the input pipeline competing for the CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import tensorflow as tf


def random_example(specs: Mapping[str, tf.TensorSpec], seed: int = 0, *, maxval: int = 2) -> dict:
    """A random example matching `specs` (fully defined shapes): floats ~ N(0, 1), ints in
    [0, maxval), bools at random, strings empty. Deterministic in `seed` (an int or a scalar
    tensor, e.g. inside `tf.data.Dataset.map`)."""
    out = {}
    for index, (key, spec) in enumerate(sorted(specs.items())):
        if not spec.shape.is_fully_defined():
            raise ValueError(f"synthetic feature '{key}' needs a fixed shape, got {spec.shape}")
        op_seed = tf.stack([tf.cast(seed, tf.int32), tf.constant(index, tf.int32)])
        shape = spec.shape.as_list()
        if spec.dtype.is_floating:
            value = tf.random.stateless_normal(shape, op_seed, dtype=tf.float32)
        elif spec.dtype.is_integer:
            value = tf.random.stateless_uniform(
                shape, op_seed, minval=0, maxval=maxval, dtype=tf.int64
            )
        elif spec.dtype == tf.bool:
            value = tf.random.stateless_uniform(shape, op_seed) < 0.5
        elif spec.dtype == tf.string:
            value = tf.fill(shape, "")
        else:
            raise ValueError(f"synthetic feature '{key}' has unsupported dtype {spec.dtype}")
        out[key] = tf.cast(value, spec.dtype)
    return out


def synthetic_dataset(
    example: Mapping[str, Any] | Callable[[int], Mapping[str, Any]],
    *,
    batch_size: int,
    seed: int = 0,
) -> tf.data.Dataset:
    """An endless dataset that yields the same batch forever.

    Args:
      example: one example (dict of tensors/arrays, no batch dimension), repeated `batch_size`
        times; or a function `seed -> example`, called with `seed, seed + 1, ...` for the
        batch's examples (so they differ, e.g. random images with random labels).
      batch_size: examples per batch (per replica).
      seed: first seed passed to `example` when it is a function.

    Returns:
      A dataset of dicts of `[batch_size, ...]` tensors with static shapes.

    Raises:
      ValueError: `batch_size` is not positive, or examples are not dicts.
    """
    if not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"`batch_size` ({batch_size!r}) must be a positive integer.")
    if callable(example):
        examples = [dict(example(seed + i)) for i in range(batch_size)]
        if not examples or not isinstance(examples[0], dict):
            raise ValueError("the synthetic `example` function must return a dict of tensors")
        batch = {k: tf.stack([tf.convert_to_tensor(e[k]) for e in examples]) for k in examples[0]}
    else:
        if not isinstance(example, Mapping):
            raise ValueError(f"synthetic `example` must be a dict or a function, got {example!r}")
        batch = {}
        for key, value in example.items():
            value = tf.convert_to_tensor(value)
            batch[key] = tf.tile(value[tf.newaxis], [batch_size] + [1] * value.shape.rank)
    # from_tensors + repeat: the batch is a constant of the dataset graph, so no per-step work.
    dataset = tf.data.Dataset.from_tensors(batch).repeat()
    options = tf.data.Options()
    options.deterministic = True
    return dataset.with_options(options).prefetch(1)


def synthetic_eval_dataset(
    example: Callable[[tf.Tensor], Mapping[str, Any]],
    *,
    count: int,
    batch_size: int,
    num_batches: int,
    seed: int = 0,
) -> tf.data.Dataset:
    """A synthetic eval set: `count` examples `example(seed + i)`, padded to `num_batches` batches.

    The synthetic counterpart of a real eval set: `count` (the config's `eval_examples`) real
    examples, then padding marked `valid` 0 (`pipeline.pad_eval_dataset`), so the eval covers the
    whole set once whatever the batch size. At most `batch_size * num_batches` examples are used.
    """
    from mlperf_tf.data.pipeline import pad_eval_dataset  # noqa: PLC0415 (pipeline imports this)

    count = min(count, batch_size * num_batches)
    examples = tf.data.Dataset.range(count).map(
        lambda i: dict(example(seed + tf.cast(i, tf.int32)))
    )
    return pad_eval_dataset(examples, batch_size=batch_size, num_batches=num_batches)


def without_autotune(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset` with tf.data's autotuner off, for synthetic input.

    A synthetic pipeline has no input cost to tune, and on TF 2.20 releasing an autotuned
    iterator waits, idle, for the autotuner's thread, whose sleep grows as the iterator ages
    (`mlperf_tf/data/README.md`, with the waits measured).
    """
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


# Seeds of two batch shards' synthetic data lie this far apart, so that a benchmark whose examples
# take consecutive seeds (`synthetic_dataset` with a function) never shares an example between them.
SHARD_SEED_STRIDE = 100_003


def per_batch_shard(
    make: Callable[[int], tf.data.Dataset], *, seed: int, input_context=None
) -> tf.data.Dataset:
    """One pipeline's endless synthetic batches with a different batch for each batch shard.

    A synthetic dataset repeats one batch, and a pipeline hands its batches to its local
    replicas in turn, so without this every data-parallel replica would train on the same batch
    and a cross-replica gradient sum would never be really exercised. Batch shard `j` (the
    pipeline's `j`-th replica in sync, counting the pipelines before it) gets `make(seed + j *
    SHARD_SEED_STRIDE)`; shard 0 gets `make(seed)`, so a one-replica run is unchanged.

    Args:
      make: seed -> an endless dataset of per-replica batches.
      seed: the run's seed.
      input_context: the pipeline's `tf.distribute.InputContext` (None: one replica).
    """
    if input_context is None:
        return make(seed)
    local = input_context.num_replicas_in_sync // input_context.num_input_pipelines
    first = input_context.input_pipeline_id * local
    datasets = [make(seed + (first + j) * SHARD_SEED_STRIDE) for j in range(max(1, local))]
    if len(datasets) == 1:
        return datasets[0]
    order = tf.data.Dataset.range(len(datasets)).repeat()
    return tf.data.Dataset.choose_from_datasets(datasets, order)
