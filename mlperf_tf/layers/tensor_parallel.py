"""Provides Megatron's tensor-parallel layers (Shoeybi et al. 2019) over the mesh's `model` axis.

A block of an attention model is split as Megatron splits it: its first projection is
column-parallel (each of the M model shards computes its 1/M of the output features: its heads,
its part of the feed-forward width), the second row-parallel (each shard multiplies its 1/M of
the input features, and the partial sums are all-reduced). Between them nothing is
communicated. Two operators carry the collectives (Megatron's f and g), each on the `model` axis
of the replica's group (`DeviceMesh.group(replica, "model")`):

| operator | forward | backward |
|---|---|---|
| `ModelAxis.copy` (f), before a column-parallel block | identity | all-reduce (sum) of the input gradient |
| `ModelAxis.reduce` (g), after a row-parallel projection | all-reduce (sum) of the partial outputs | identity |

So a block issues one all-reduce forward and one backward. Activations outside the blocks (the
residual stream, layer norms) are the same on every shard of a group, and so are the gradients
of the replicated weights; the split weights are `mlperf_tf.parallel.layout` shards.

Also here: the vocabulary-parallel embedding (rows split over `model`: a masked local lookup,
then g) and the vocabulary-parallel cross-entropy, which computes a softmax cross-entropy from
the [tokens, vocab/M] logit shards with three all-reduces of [tokens] vectors (max, sum of
exponentials, picked and summed logits) and never gathers the full logits.

With `mesh.model == 1` (or no mesh) every operator is the identity and the layers are plain
layers: same weights, same math. Collectives need a static replica id (MirroredStrategy,
MultiWorkerMirroredStrategy) and run in replica context.
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from mlperf_tf.collectives.axis_group import AxisGroup
from mlperf_tf.layers.matmul import token_matmul
from mlperf_tf.parallel.context import resolve
from mlperf_tf.parallel.layout import REPLICATED, Layout, add_split_weight, model_split
from mlperf_tf.parallel.mesh import DeviceMesh


class ModelAxis(AxisGroup):
    """The `model` axis of the mesh as seen from one replica, with Megatron's f (`copy`) and g
    (`reduce`): an `AxisGroup` over `model` (its collectives, their names, ordering token and
    timeout are `AxisGroup`'s: those of the replica context, whose timeout the runner's replica
    steps set to the run's `--collective_timeout`, `mlperf_tf.runner.trainer.bind_collective_timeout`).

    Args:
      mesh: the run's mesh (None: the ambient one, `mlperf_tf.parallel.current_mesh()`; no
        model parallelism outside a run).
      owner: the layer that issues the collectives (its `path` prefixes their instance keys),
        or a string unique in the model.
      timeout_s: the least timeout of its collectives in seconds (0: the replica context's).
    """

    def __init__(self, mesh: DeviceMesh | None, owner, timeout_s: float = 0.0):
        super().__init__("model", owner=owner, mesh=mesh, timeout_s=timeout_s)


def _bias_initializer(initializer):
    return keras.initializers.get(initializer)


class _SplitDense(keras.layers.Layer):
    """What the two Megatron projections share: a `Dense`-like kernel [in, units] and bias
    [units] made as `mlperf_tf.parallel.layout` shards of the subclass's `kernel_layout` and
    `bias_layout` over `model`."""

    kernel_layout: Layout
    bias_layout: Layout

    def __init__(
        self,
        units: int,
        *,
        mesh: DeviceMesh | None = None,
        use_bias: bool = True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.units = units
        self.mesh = resolve(mesh)
        self.use_bias = use_bias
        # Built here, as Dense builds its initializers, so the seeds drawn are the same.
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = _bias_initializer(bias_initializer)
        self.axis = ModelAxis(mesh, self)

    def build(self, input_shape):
        """`input_shape`: the whole input's shape ([..., in]), not the shard's."""
        self.kernel = add_split_weight(
            self, name="kernel", shape=(input_shape[-1], self.units),
            initializer=self.kernel_initializer, layout=self.kernel_layout, mesh=self.mesh,
        )  # fmt: skip
        if self.use_bias:
            self.bias = add_split_weight(
                self, name="bias", shape=(self.units,), initializer=self.bias_initializer,
                layout=self.bias_layout, mesh=self.mesh,
            )  # fmt: skip
        super().build(input_shape)

    def _add_bias(self, y):
        return y + tf.cast(self.bias, self.compute_dtype) if self.use_bias else y


class ColumnParallelDense(_SplitDense):
    """`Dense` whose output features are split over `model`: kernel [in, units/M], bias [units/M].

    Collectives: f (`ModelAxis.copy`) on the input unless `copy_input=False` (the block applied
    it once for several projections): none forward, one all-reduce of the input gradient over
    `model` backward. The output is this shard's [..., units/M].
    """

    kernel_layout = model_split(1)
    bias_layout = model_split(0)

    def __init__(self, units: int, *, activation=None, copy_input: bool = True, **kwargs):
        super().__init__(units, **kwargs)
        self.activation = keras.activations.get(activation)
        self.copy_input = copy_input

    def call(self, x):
        if self.copy_input:
            x = self.axis.copy(x)
        y = self._add_bias(token_matmul(x, tf.cast(self.kernel, self.compute_dtype)))
        return self.activation(y) if self.activation is not None else y


class RowParallelDense(_SplitDense):
    """`Dense` whose input features are split over `model`: kernel [in/M, units], bias [units]
    (replicated, added once after the sum).

    Collectives: g (`ModelAxis.reduce`): one all-reduce of the [..., units] partial products
    over `model` forward, none backward. The input is this shard's [..., in/M].
    """

    kernel_layout = model_split(0)
    bias_layout = REPLICATED

    def call(self, x):
        y = self.axis.reduce(token_matmul(x, tf.cast(self.kernel, self.compute_dtype)))
        return self._add_bias(y)


def vocab_parallel_lookup(table, ids, axis: ModelAxis):
    """Embedding rows of `ids` from a [vocab/M, hidden] table shard (row-split over `model`).

    Ids outside this shard's rows read a zero row; g (`axis.reduce`) sums the shards' lookups:
    one all-reduce of [..., hidden] over `model` forward, none backward.
    """
    if axis.size == 1:
        return tf.gather(table, ids)
    rows = table.shape[0]
    local = ids - axis.index() * rows
    inside = tf.logical_and(local >= 0, local < rows)
    found = tf.gather(table, tf.where(inside, local, tf.zeros_like(local)))
    found = found * tf.cast(inside, found.dtype)[..., None]
    return axis.reduce(found)


def vocab_parallel_cross_entropy(logits, targets, *, vocab_size: int, smoothing: float,
                                 axis: ModelAxis):  # fmt: skip
    """Per-token softmax cross-entropy against label-smoothed targets, from vocabulary-split
    logits, minus the entropy of the smoothed target (0 for a perfect prediction).

    Each shard holds the logits of its vocab/M ids, [..., vocab/M]; with z the full logits and
    q the smoothed target (1 - smoothing on the true id, low = smoothing / (vocab - 1) on the
    others):

        xent = logsumexp(z) - sum_v q_v z_v
             = logsumexp(z) - low * sum_v z_v - (confidence - low) * z_target

    Collectives over `model` (forward; backward none, since everything after them is the same
    on every shard and g's backward is the identity): a max of [...] (the shift, without
    gradient), and one all-reduce of the stacked [3, ...] sums of exp(z - max), z and the picked
    z_target. The full [..., vocab] logits are never formed. With one shard it is the same
    formula on the whole logits.

    Args:
      logits: [..., vocab/M] this shard's logits (cast to float32).
      targets: int [...], the true ids (global ids).
      vocab_size: the whole vocabulary.
      smoothing: label smoothing in [0, 1) (0: plain cross-entropy).
      axis: the model axis.

    Returns:
      float32 [...] per-token losses, the same on every shard.
    """
    logits = tf.cast(logits, tf.float32)
    width = logits.shape[-1]
    confidence = 1.0 - smoothing
    low = smoothing / (vocab_size - 1) if vocab_size > 1 else 0.0
    shift = axis.max(tf.reduce_max(logits, axis=-1))  # [...]
    local = targets - axis.index() * width
    inside = tf.logical_and(local >= 0, local < width)
    index = tf.where(inside, local, tf.zeros_like(local))[..., None]
    picked = tf.gather(logits, index, batch_dims=targets.shape.rank)[..., 0]
    picked = picked * tf.cast(inside, tf.float32)
    sums = [tf.reduce_sum(tf.exp(logits - shift[..., None]), -1), picked]
    if low:
        sums.append(tf.reduce_sum(logits, -1))
    summed = tf.unstack(axis.reduce(tf.stack(sums)))
    xent = tf.math.log(summed[0]) + shift - (confidence - low) * summed[1]
    if low:
        xent -= low * summed[2]
        entropy = -(confidence * math.log(confidence)) - (vocab_size - 1) * low * math.log(low)
        xent -= entropy
    return xent


class VocabParallelEmbedding(keras.layers.Layer):
    """`keras.layers.Embedding` (weight `embeddings` [vocab, hidden], same initializer draw) whose
    vocabulary rows are split over `model`: each shard holds [vocab/M, hidden].

    Collectives: `vocab_parallel_lookup`'s g, one all-reduce of [..., hidden] over `model`
    forward, none backward.
    """

    def __init__(self, vocab_size: int, hidden_size: int, *, mesh: DeviceMesh | None = None,
                 embeddings_initializer="uniform", **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.mesh = resolve(mesh)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.axis = ModelAxis(mesh, self)

    def build(self, input_shape=None):
        self.embeddings = add_split_weight(
            self, name="embeddings", shape=(self.vocab_size, self.hidden_size),
            initializer=self.embeddings_initializer, layout=model_split(0), mesh=self.mesh,
        )  # fmt: skip
        super().build(input_shape)

    def call(self, ids):
        table = tf.cast(self.embeddings, self.compute_dtype)
        return vocab_parallel_lookup(table, tf.cast(ids, tf.int32), self.axis)
