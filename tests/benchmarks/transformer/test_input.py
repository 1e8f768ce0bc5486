"""Tests of the Transformer input: length buckets with static shapes, max length methods, eval."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.transformer import input as input_lib
from mlperf_tf.data import tfrecord

BUCKETS = (4, 8, 12)


def write_pairs(tmp_path, lengths, *, prefix="train", with_index=False, num_shards=2):
    """Pairs whose source has `n` ids and target `n // 2 + 1` ids (both end with EOS)."""
    examples = []
    for i, n in enumerate(lengths):
        source = [3 + (i + k) % 20 for k in range(n - 1)] + [input_lib.EOS_ID]
        target = [5 + k for k in range(n // 2)] + [input_lib.EOS_ID]
        features = {"inputs": source, "targets": target}
        if with_index:
            features["index"] = i
        examples.append(tfrecord.make_example(features))
    return tfrecord.write_sharded(examples, str(tmp_path), prefix=prefix, num_shards=num_shards)


def _in_order(dataset):
    """`dataset` with tf.data's deterministic order (what a test of epoch boundaries needs)."""
    options = tf.data.Options()
    options.deterministic = True
    return dataset.with_options(options)


def test_parse_pair_eagerly_and_in_a_map(tmp_path):
    files = write_pairs(tmp_path, [3, 5], with_index=True, num_shards=1)
    record = next(iter(tf.data.TFRecordDataset(files)))
    eager = input_lib.parse_pair(record)
    assert eager["inputs"].numpy().tolist() == [3, 4, 1]
    assert eager["targets"].numpy().tolist() == [5, 1]
    assert int(eager["index"]) == 0
    mapped = next(iter(tf.data.TFRecordDataset(files).skip(1).map(input_lib.parse_pair)))
    assert mapped["inputs"].dtype == tf.int32 and mapped["inputs"].shape == [5]
    assert int(mapped["index"]) == 1


@pytest.mark.parametrize("method", ["discard", "truncate"])
def test_fit_to_max_length_eagerly_and_in_a_map(method):
    example = {"inputs": tf.range(1, 8), "targets": tf.range(1, 4), "index": tf.constant(-1)}
    eager = input_lib._fit_to_max_length(example, 5, method)
    mapped = next(
        iter(
            tf.data.Dataset.from_tensors(example).map(
                lambda e: input_lib._fit_to_max_length(e, 5, method)
            )
        )
    )
    for out in (eager, mapped):
        assert out["inputs"].shape == [5] and out["targets"].shape == [5]
        assert out["inputs"].numpy().tolist() == [1, 2, 3, 4, 5]
        assert out["targets"].numpy().tolist() == [1, 2, 3, 0, 0]
        assert int(out["length"]) == 5
        assert bool(out["keep"]) == (method == "truncate")


def test_bucket_batch_sizes():
    assert input_lib.bucket_batch_sizes((8, 12, 16, 24, 32), 4096, 8) == [512, 336, 256, 168, 128]
    assert input_lib.bucket_batch_sizes((3, 7), 20, 1) == [6, 2]
    with pytest.raises(ValueError, match="holds no batch"):
        input_lib.bucket_batch_sizes((16,), 100, 8)


def train_dataset(files, **overrides):
    """`input_lib.train_dataset` of `files` at the tests' small sizes (48 tokens a replica, pairs
    of at most 12 ids in BUCKETS, discarded above), one pipeline, unless `overrides` say else."""
    settings = dict(
        input_context=None, tokens_per_replica=48, max_length=12, method="discard",
        bucket_lengths=BUCKETS, batch_multiple=1, shuffle_buffer=4, seed=0,
    )  # fmt: skip
    return input_lib.train_dataset(files, **{**settings, **overrides})


def collect(dataset, num_batches):
    shapes = collections.Counter()
    batches = []
    for batch in dataset.take(num_batches):
        assert batch["inputs"].shape == batch["targets"].shape
        shapes[tuple(batch["inputs"].shape)] += 1
        batches.append({k: v.numpy() for k, v in batch.items()})
    return shapes, batches


@pytest.mark.parametrize("method", ["discard", "truncate"])
def test_train_batches_are_static_per_bucket(tmp_path, method):
    lengths = [2, 3, 4, 5, 7, 8, 9, 12, 14, 20] * 20
    files = write_pairs(tmp_path, lengths)
    dataset = train_dataset(files, method=method, batch_multiple=2, shuffle_buffer=64)
    shapes, batches = collect(dataset, 60)
    # Batches per bucket: 48 // 4 = 12, 48 // 8 = 6 and 48 // 12 = 4 pairs.
    assert set(shapes) <= {(12, 4), (6, 8), (4, 12)}
    assert len(shapes) == 3
    for batch in batches:
        length = batch["inputs"].shape[1]
        lower = {4: 0, 8: 4, 12: 8}[length]
        real = np.maximum((batch["inputs"] > 0).sum(1), (batch["targets"] > 0).sum(1))
        assert (real > lower).all() and (real <= length).all()
    long_rows = [row for b in batches for row in b["inputs"] if (row > 0).sum() == 12]
    pairs_at_cap = [row for row in long_rows if row[-1] != input_lib.EOS_ID]
    if method == "discard":
        assert not pairs_at_cap  # pairs of 14 and 20 ids were dropped
    else:
        assert pairs_at_cap  # ... or cut to 12 (their EOS is gone)


def test_train_dataset_validates_arguments(tmp_path):
    files = write_pairs(tmp_path, [3, 4])
    with pytest.raises(ValueError, match="method"):
        train_dataset(files, method="cut")
    with pytest.raises(ValueError, match="last bucket"):
        train_dataset(files, max_length=16)


def test_train_dataset_shards_per_input_pipeline(tmp_path):
    files = write_pairs(tmp_path, [3] * 40, num_shards=2)
    seen = []
    for pipeline_id in range(2):
        context = tf.distribute.InputContext(
            num_input_pipelines=2, input_pipeline_id=pipeline_id, num_replicas_in_sync=2
        )
        dataset = train_dataset(
            files, input_context=context, tokens_per_replica=16, max_length=4, bucket_lengths=(4,),
            shuffle_buffer=1,
        )  # fmt: skip
        first = next(iter(dataset))["inputs"].numpy()
        assert first.shape == (4, 4)
        seen.append(first[:, 0].tolist())
    assert seen[0] != seen[1]  # different files, different first ids


def test_eval_dataset_is_padded_and_indexed(tmp_path):
    files = write_pairs(tmp_path, [3, 5, 9, 4, 6], prefix="eval", with_index=True, num_shards=1)
    dataset = input_lib.eval_dataset(
        files, input_context=None, batch_size=2, num_batches=3, eval_max_length=6
    )
    batches = [{k: v.numpy() for k, v in b.items()} for b in dataset]
    assert len(batches) == 3
    for batch in batches:
        assert batch["inputs"].shape == (2, 6) and batch["targets"].shape == (2, 6)
    index = np.concatenate([b["index"] for b in batches])
    valid = np.concatenate([b["valid"] for b in batches])
    assert index[:5].tolist() == [0, 1, 2, 3, 4] and valid.tolist() == [1, 1, 1, 1, 1, 0]
    assert batches[1]["inputs"][0].tolist() == [5, 6, 7, 8, 9, 10]  # 9 ids truncated to 6


def test_steps_per_epoch_from_the_length_histogram():
    histogram = {3: 24, 6: 12, 10: 8, 20: 5}
    common = dict(bucket_lengths=BUCKETS, batch_sizes=[12, 6, 4], max_length=12)
    # 24/12 + 12/6 + 8/4 = 6 batches; truncate adds 5 pairs of the last bucket (1.25 batches).
    assert input_lib.steps_per_epoch(histogram, num_replicas=1, method="discard", **common) == 6
    assert input_lib.steps_per_epoch(histogram, num_replicas=1, method="truncate", **common) == 7
    assert input_lib.steps_per_epoch(histogram, num_replicas=2, method="discard", **common) == 3


def test_synthetic_data_shapes():
    inputs, targets = input_lib.synthetic_pairs(5, vocab_size=10, max_length=6, seed=0)
    assert inputs.shape == (5, 6)
    np.testing.assert_array_equal(inputs, targets)
    for row in inputs:
        ids = row[row > 0].tolist()
        assert ids[-1] == input_lib.EOS_ID and all(3 <= i < 10 for i in ids[:-1])
    batch = next(
        iter(
            input_lib.synthetic_train_dataset(
                tokens_per_replica=24, max_length=6, vocab_size=10, seed=0
            )
        )
    )
    assert batch["inputs"].shape == (4, 6)
    context = tf.distribute.InputContext(
        num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=2
    )
    batches = list(
        input_lib.synthetic_eval_dataset(
            input_context=context, num_examples=5, batch_size=2, num_batches=2,
            eval_max_length=6, vocab_size=10, seed=0,
        )
    )  # fmt: skip
    index = np.concatenate([b["index"].numpy() for b in batches])
    valid = np.concatenate([b["valid"].numpy() for b in batches])
    assert index[valid > 0].tolist() == [1, 3]


@pytest.mark.parametrize("shuffle_buffer", [64, 16])
def test_cached_training_pairs_reshuffle_every_epoch_and_keep_every_pair(tmp_path, shuffle_buffer):
    """`cache=True` (the mini preset) parses once; every epoch still holds each pair once, in a
    new order, also with a shuffle buffer smaller than the data (the mini preset's 8,192 of
    26,731 pairs)."""
    files = write_pairs(tmp_path, [3 + i % 9 for i in range(48)], with_index=True)
    epochs = {}
    for cache in (False, True):
        dataset = train_dataset(
            files, tokens_per_replica=12, bucket_lengths=(12,), shuffle_buffer=shuffle_buffer,
            seed=3, cache=cache,
        )  # fmt: skip
        # Training pipelines let a ready element pass a slow one (`options.deterministic` off),
        # which may carry a pair across an epoch's end; epochs are whole only in order.
        rows = [
            tuple(r) for b in _in_order(dataset).take(96).as_numpy_iterator() for r in b["inputs"]
        ]
        epochs[cache] = [rows[:48], rows[48:96]]
    for first, second in (epochs[True], epochs[False]):
        assert sorted(first) == sorted(second) and first != second
    assert sorted(epochs[True][0]) == sorted(epochs[False][0])  # the same pairs
