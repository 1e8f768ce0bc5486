"""Provides the language models' small layers: `RMSNorm`, `Linear`, the one projection class of
every block (tensor-parallel through `ModelAxis`, with a hook for adapters), and `tied_logits`,
the output projection through an embedding table (the decoder's, the Transformer's, BERT's)."""

from __future__ import annotations

import keras
import tensorflow as tf

from mlperf_tf.layers.matmul import token_matmul
from mlperf_tf.layers.tensor_parallel import ModelAxis
from mlperf_tf.parallel.layout import REPLICATED, add_split_weight, model_split

PARALLEL_KINDS = ("column", "row", "replicated", None)


def tied_logits(states, table, axis: ModelAxis):
    """Vocabulary logits of `states` [..., hidden] through the embedding `table` [vocab, hidden]
    (tied input and output embeddings): one 2-D MatMul against the transposed table
    (`token_matmul`). Under tensor parallelism the table is this shard's [vocab/M, hidden] rows
    and the logits this shard's [..., vocab/M]; f on the states (`axis.copy`: none forward, one
    all-reduce of their gradient over `model` backward). `table` in the compute dtype."""
    return token_matmul(axis.copy(states), table, transpose_b=True)


class RMSNorm(keras.layers.Layer):
    """RMS normalization x / sqrt(mean(x^2) + eps) * scale over the last axis, in float32
    (Zhang & Sennrich 2019); its weight `scale` starts at 1 and is replicated under tensor
    parallelism.

    On the residual stream (the same on every shard) its gradient is the same on every shard.
    A norm of a shard's own heads (QK-norm) sees only part of the tensor: `sharded_input=True`
    reads the scale through f (`ModelAxis.copy`), so its gradient is summed over `model`.
    """

    def __init__(self, epsilon: float, *, sharded_input: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = epsilon
        self.sharded_input = sharded_input
        self.axis = ModelAxis(None, self) if sharded_input else None

    def build(self, input_shape):
        self.scale = self.add_weight(name="scale", shape=(input_shape[-1],), initializer="ones")

    def call(self, x):
        x = tf.cast(x, tf.float32)
        variance = tf.reduce_mean(tf.square(x), axis=-1, keepdims=True)
        x = x * tf.math.rsqrt(variance + self.epsilon)
        scale = tf.cast(self.scale, tf.float32)
        if self.sharded_input:
            scale = self.axis.copy(scale)
        return tf.cast(x * scale, self.compute_dtype)


class Linear(keras.layers.Layer):
    """A projection [..., in] -> [..., units] as one 2-D MatMul (`token_matmul`), optional bias.

    Its `kernel` is [in, units] (Keras' Dense layout), normal with `stddev` (or
    `kernel_initializer`); `bias` [units] starts at 0. Under tensor parallelism (the ambient
    mesh's `model` axis, M > 1) `parallel` says how it is split:

    - "column": kernel [in, units/M], bias [units/M]; the output is this shard's [..., units/M];
      no collective (the block applies f, `ModelAxis.copy`, to the input once).
    - "row": kernel [in/M, units], bias [units] replicated and added after the sum; the input is
      this shard's [..., in/M]; g: one all-reduce of the [..., units] partial sums forward.
    - "replicated": the whole kernel (and bias) on every shard, read through f (identity
      forward, an all-reduce of its gradient backward: each shard uses part of its output, e.g.
      the key/value heads of its query heads when there are fewer than M, and the sum is the
      whole gradient, the same on every shard).
    - None: not split (and no collective).

    Extending it (LoRA): `call` is `project(x)` (this shard's product, before the row sum and
    the bias), then the sum and the bias. A subclass or adapter overrides `project` and adds its
    own term, e.g. `super().project(x) + token_matmul(token_matmul(x, a), b) * scale`: for
    "row" the adapter's partial products are summed with the kernel's by the same g; for
    "column" it returns this shard's units. `build` makes `kernel` (and `bias`) only.
    """

    def __init__(self, units: int, *, stddev: float | None = None, kernel_initializer=None,
                 use_bias: bool = False, parallel: str | None = None,
                 **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        if parallel not in PARALLEL_KINDS:
            raise ValueError(f"parallel {parallel!r} must be one of {PARALLEL_KINDS}")
        if (stddev is None) == (kernel_initializer is None):
            raise ValueError("Linear takes one of `stddev` and `kernel_initializer`")
        self.units = units
        self.stddev = stddev
        self.kernel_initializer = (
            keras.initializers.RandomNormal(stddev=stddev)
            if kernel_initializer is None
            else keras.initializers.get(kernel_initializer)
        )
        self.use_bias = use_bias
        self.parallel = parallel
        self.axis = ModelAxis(None, self)

    def build(self, input_shape):
        """`input_shape`: the whole input's ([..., in]), also for a row-parallel projection."""
        layout = {"column": model_split(1), "row": model_split(0)}.get(self.parallel, REPLICATED)
        self.kernel = add_split_weight(
            self, name="kernel", shape=(input_shape[-1], self.units),
            initializer=self.kernel_initializer, layout=layout, mesh=None,
        )  # fmt: skip
        if self.use_bias:
            bias_layout = model_split(0) if self.parallel == "column" else REPLICATED
            self.bias = add_split_weight(
                self, name="bias", shape=(self.units,), initializer="zeros", layout=bias_layout,
                mesh=None,
            )  # fmt: skip
        self.built = True

    def read(self, weight):
        """`weight` in the compute dtype, through f when the projection is replicated."""
        value = tf.cast(weight, self.compute_dtype)
        return self.axis.copy(value) if self.parallel == "replicated" else value

    def project(self, x):
        """This shard's product [..., units or units/M] (row: a partial sum), before the row
        all-reduce and the bias: the method an adapter extends."""
        return token_matmul(x, self.read(self.kernel))

    def call(self, x):
        y = self.project(x)
        if self.parallel == "row":
            y = self.axis.reduce(y)
        if self.use_bias:
            y = y + self.read(self.bias)
        return y
