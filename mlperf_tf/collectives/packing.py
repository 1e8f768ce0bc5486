"""Provides `Packing`: tensors fused into buckets of about M MiB, laid out as [N, K] matrices.

A tensor of n elements is flattened, zero-padded to N * k elements (k = ceil(n / N)) and
viewed as [N, k]: row s is its shard s. A bucket concatenates such views along the columns,
[N, K] with K the sum of its tensors' k, so row s of a bucket is shard s of every tensor in it;
a reduce-scatter of the bucket hands each replica its shard of each tensor. Tensors of one
dtype only share a bucket; buckets fill in the variables' order up to `pack_mb` MiB (a larger
tensor gets a bucket of its own); `pack_mb=0` means one bucket (one collective) per tensor.
"""

from __future__ import annotations

import dataclasses
import math

import tensorflow as tf

MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Slot:
    """Where tensor `index` lives: its bucket, its columns there, its shape."""

    index: int
    bucket: int
    offset: int
    cols: int
    shape: tuple[int, ...]
    size: int


class Packing:
    """The bucket plan for tensors of fixed shapes (decided once, at trace time).

    Args:
      shapes: the tensors' static shapes, in order.
      dtypes: their dtypes.
      num_shards: N, the replicas the tensors are sharded over.
      pack_mb: target bucket size in MiB; 0: one bucket per tensor.
    """

    def __init__(self, shapes, dtypes, *, num_shards: int, pack_mb: float):
        self.num_shards = num_shards
        self.slots: list[Slot] = []
        self.bucket_dtypes: list[tf.DType] = []
        self.bucket_cols: list[int] = []
        limit = pack_mb * MIB
        open_bucket: dict[tf.DType, int] = {}
        for index, (shape, dtype) in enumerate(zip(shapes, dtypes, strict=True)):
            dtype = tf.as_dtype(dtype)
            shape = tuple(int(d) for d in shape)
            size = math.prod(shape)
            cols = max(1, -(-size // num_shards))
            nbytes = cols * num_shards * dtype.size
            bucket = open_bucket.get(dtype)
            if (
                bucket is None
                or not limit
                or (self.bucket_cols[bucket] * num_shards * dtype.size + nbytes > limit)
            ):
                bucket = len(self.bucket_cols)
                self.bucket_cols.append(0)
                self.bucket_dtypes.append(dtype)
                if limit:
                    open_bucket[dtype] = bucket
            self.slots.append(Slot(index, bucket, self.bucket_cols[bucket], cols, shape, size))
            self.bucket_cols[bucket] += cols

    @property
    def num_buckets(self) -> int:
        return len(self.bucket_cols)

    def bucket_bytes(self, bucket: int) -> int:
        return self.bucket_cols[bucket] * self.num_shards * self.bucket_dtypes[bucket].size

    def shard_elements(self) -> int:
        """Elements of one replica's shard of all tensors (padding included)."""
        return sum(self.bucket_cols)

    def pack(self, tensors) -> list[tf.Tensor]:
        """The buckets ([N, K] each) holding `tensors`."""
        parts: list[list[tf.Tensor]] = [[] for _ in self.bucket_cols]
        for slot, t in zip(self.slots, tensors, strict=True):
            parts[slot.bucket].append(self.as_rows(t, slot))
        return [p[0] if len(p) == 1 else tf.concat(p, axis=1) for p in parts]

    def as_rows(self, t, slot: Slot):
        """`t` flattened, zero-padded and viewed as [N, k]."""
        flat = tf.reshape(t, [-1])
        pad = slot.cols * self.num_shards - slot.size
        if pad:
            flat = tf.pad(flat, [[0, pad]])
        return tf.reshape(flat, [self.num_shards, slot.cols])

    def unpack(self, buckets) -> list[tf.Tensor]:
        """The tensors back from their [N, K] buckets."""
        out = []
        for slot in self.slots:
            rows = buckets[slot.bucket][:, slot.offset : slot.offset + slot.cols]
            out.append(tf.reshape(tf.reshape(rows, [-1])[: slot.size], slot.shape))
        return out

    def split_shards(self, shards) -> list[tf.Tensor]:
        """Each tensor's [k] shard from the buckets' [K] shards."""
        return [shards[s.bucket][s.offset : s.offset + s.cols] for s in self.slots]

    def join_shards(self, parts) -> list[tf.Tensor]:
        """The buckets' [K] shards from each tensor's [k] shard."""
        grouped: list[list[tf.Tensor]] = [[] for _ in self.bucket_cols]
        for slot, p in zip(self.slots, parts, strict=True):
            grouped[slot.bucket].append(p)
        return [g[0] if len(g) == 1 else tf.concat(g, axis=0) for g in grouped]
