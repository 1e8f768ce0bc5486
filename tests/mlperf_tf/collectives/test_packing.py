"""Tests of gradient packing: buckets of about M MiB, [N, K] layout, exact round trips."""

import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.collectives.packing import MIB, Packing

pytestmark = pytest.mark.numerics

SHAPES = [(3, 5), (7,), (1,), (64, 64), (2, 3, 4)]


def _tensors():
    rng = np.random.default_rng(0)
    return [tf.constant(rng.normal(size=s), tf.float32) for s in SHAPES]


def test_one_bucket_per_tensor_without_packing():
    packing = Packing(SHAPES, [tf.float32] * 5, num_shards=4, pack_mb=0)
    assert packing.num_buckets == 5
    buckets = packing.pack(_tensors())
    assert [b.shape[0] for b in buckets] == [4] * 5
    assert buckets[0].shape == (4, 4)  # 15 values padded to 16


def test_buckets_fill_up_to_the_size_and_round_trip():
    limit_mb = 1024 * 4 / MIB  # 1 KiB... 1024 floats
    packing = Packing(SHAPES, [tf.float32] * 5, num_shards=4, pack_mb=limit_mb)
    # (3,5)+(7,)+(1,) fit in one bucket; (64,64) = 4096 floats is alone; (2,3,4) opens a new one.
    assert packing.num_buckets == 3
    assert [s.bucket for s in packing.slots] == [0, 0, 0, 1, 2]
    for b in range(packing.num_buckets):
        assert packing.bucket_bytes(b) <= max(limit_mb * MIB, 4096 * 4)
    tensors = _tensors()
    for got, want in zip(packing.unpack(packing.pack(tensors)), tensors, strict=True):
        np.testing.assert_array_equal(got, want)


def test_row_s_of_a_bucket_is_shard_s_of_each_tensor():
    packing = Packing(SHAPES, [tf.float32] * 5, num_shards=4, pack_mb=1.0)
    tensors = _tensors()
    buckets = packing.pack(tensors)
    for shard in range(4):
        parts = packing.split_shards([b[shard] for b in buckets])
        for part, slot, t in zip(parts, packing.slots, tensors, strict=True):
            flat = np.pad(np.ravel(t), (0, slot.cols * 4 - slot.size))
            np.testing.assert_array_equal(part, flat[shard * slot.cols : (shard + 1) * slot.cols])
        joined = packing.join_shards(parts)
        for j, b in zip(joined, buckets, strict=True):
            np.testing.assert_array_equal(j, b[shard])


def test_dtypes_do_not_share_a_bucket():
    packing = Packing([(4,), (4,), (4,)], [tf.float32, tf.float64, tf.float32], num_shards=2,
                      pack_mb=1.0)  # fmt: skip
    assert [s.bucket for s in packing.slots] == [0, 1, 0]
    assert packing.bucket_dtypes == [tf.float32, tf.float64]
