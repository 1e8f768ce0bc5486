"""Provides the all-reduce algorithms `ring`, `hierarchical` and `torus2d` on a replica mesh.

Every algorithm works on a bucket laid out as an [N, K] matrix (N = replicas; row s is shard s
of every tensor in the bucket, see `packing`), in replica context, and offers three calls:

* `all_reduce(x)`: the sum of x over all replicas, [N, K] on every replica;
* `reduce_scatter(x)`: row `shard` of that sum, [K] (for weight-update sharding);
* `all_gather(s)`: every replica's [K] row, back in [N, K] order.

Bytes each replica sends for a bucket of S bytes (ring formulas; TF's CPU collectives are rings):

| algorithm    | all_reduce                                   | reduce_scatter        |
|--------------|----------------------------------------------|-----------------------|
| ring         | 2(N-1)/N S                                   | (N-1)/N S             |
| hierarchical | 2(C-1)/C S + leaders 2(R-1)/R S + bcast S    | all_reduce, then slice|
| torus2d      | (C-1)/C S + 2(R-1)/R S/C + (C-1)/C S         | (C-1)/C S + (R-1)/R S/C |

(R x C mesh; `hierarchical` sums within a row, then across the rows' first replicas, then
broadcasts within each row, as in Jia et al. 2018; `torus2d` reduce-scatters along the row,
all-reduces along the column and all-gathers along the row, as in Ying et al. 2018.)
"""

from __future__ import annotations

import tensorflow as tf

from mlperf_tf.collectives.mesh import Mesh
from mlperf_tf.collectives.ops import Collectives


class Algorithm:
    """Base: the replica's place on the mesh and its collectives."""

    name = ""

    def __init__(self, mesh: Mesh, collectives: Collectives):
        self.mesh = mesh
        self.ops = collectives
        self.replica = collectives.replica
        self.everyone = list(range(mesh.size))

    @property
    def shard(self) -> int:
        """The row of an [N, K] bucket that `reduce_scatter` leaves on this replica."""
        return self.replica

    def all_reduce(self, x, name: str):
        raise NotImplementedError

    def reduce_scatter(self, x, name: str):
        """Default: all-reduce, then keep this replica's row (moves the all-reduce's bytes)."""
        return self.all_reduce(x, name)[self.shard]

    def all_gather(self, s, name: str):
        return tf.reshape(self.ops.all_gather(s, self.everyone, name), [self.mesh.size, -1])


class Ring(Algorithm):
    """One ring over all replicas (TF's ring all-reduce); reduce-scatter by all-to-all."""

    name = "ring"

    def all_reduce(self, x, name):
        return self.ops.all_reduce(x, self.everyone, name)

    def reduce_scatter(self, x, name):
        return self.ops.reduce_scatter(x, self.everyone, name)


class Hierarchical(Algorithm):
    """Sum within the row, across the rows' leaders (column 0), then broadcast within the row."""

    name = "hierarchical"

    def all_reduce(self, x, name):
        row = self.mesh.row_of(self.replica)
        leader = row[0]
        summed = self.ops.all_reduce(x, row, name + "/row")
        if self.replica == leader:
            summed = self.ops.all_reduce(summed, self.mesh.col_of(leader), name + "/leaders")
        with tf.control_dependencies([summed]):  # broadcasts take no ordering token
            return self.ops.broadcast(summed, row, leader, name + "/bcast")


class Torus2D(Algorithm):
    """Reduce-scatter along the row, all-reduce along the column, all-gather along the row."""

    name = "torus2d"

    @property
    def shard(self) -> int:
        # The row scatter leaves chunk c (the column index) of C; the column scatter splits it
        # into R pieces, piece r (the row index): row c * R + r of the [N, K] bucket.
        return (self.replica % self.mesh.cols) * self.mesh.rows + self.replica // self.mesh.cols

    def _row_col(self):
        return self.mesh.row_of(self.replica), self.mesh.col_of(self.replica)

    def all_reduce(self, x, name):
        row, col = self._row_col()
        n, k = self.mesh.size, x.shape[1]
        chunks = tf.reshape(x, [self.mesh.cols, self.mesh.rows * k])
        part = self.ops.reduce_scatter(chunks, row, name + "/row_rs")  # [R * K]
        part = self.ops.all_reduce(part, col, name + "/col_ar")
        return tf.reshape(self.ops.all_gather(part, row, name + "/row_ag"), [n, k])

    def reduce_scatter(self, x, name):
        row, col = self._row_col()
        k = x.shape[1]
        chunks = tf.reshape(x, [self.mesh.cols, self.mesh.rows * k])
        part = self.ops.reduce_scatter(chunks, row, name + "/row_rs")  # [R * K]
        return self.ops.reduce_scatter(tf.reshape(part, [self.mesh.rows, k]), col, name + "/col_rs")

    def all_gather(self, s, name):
        row, col = self._row_col()
        part = self.ops.all_gather(s, col, name + "/col_ag")  # [R * K]
        return tf.reshape(self.ops.all_gather(part, row, name + "/row_ag"), [self.mesh.size, -1])


ALGORITHM_CLASSES = {cls.name: cls for cls in (Ring, Hierarchical, Torus2D)}
