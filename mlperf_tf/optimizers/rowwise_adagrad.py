"""Provides `AdamWRowWiseAdagrad`: AdamW on dense weights, row-wise Adagrad on embedding tables.

Recommendation models train their dense layers with Adam and their embedding tables with a
sparse optimizer that touches only the rows a batch looked up: TorchRec's fused FBGEMM
`EXACT_ROWWISE_ADAGRAD` (the MLPerf `dlrmv4` reference's `RowWiseAdagrad`), which keeps one
accumulator per row instead of Adam's two moments per element (a 9.4 M x 512 table would carry
2 x 19 GB of Adam state; row-wise Adagrad's is 38 MB).
"""

from __future__ import annotations

from collections.abc import Iterable

import tensorflow as tf

from mlperf_tf.optimizers.adamw import AdamW
from mlperf_tf.optimizers.base import (
    check_number,
    compile_exclusion_patterns,
    document_base_keyword_args,
    matches_any,
    tf_variable,
    variable_path,
)
from mlperf_tf.parallel.layout import layout_of
from mlperf_tf.sparse import merge_duplicate_rows


def rowwise_adagrad_rows(rows, g, accumulator, lr, epsilon):
    """Row-wise Adagrad on gathered rows: (new rows, new accumulator entries).

    FBGEMM's `EXACT_ROWWISE_ADAGRAD` (weight decay 0): with g the row's summed gradient
    (duplicates of an id in the batch added first), a = a + mean(g**2) over the row's elements,
    row = row - lr * g / (sqrt(a) + eps).

    Args:
      rows: `[n, dim]` current rows.
      g: `[n, dim]` their gradients (each id once).
      accumulator: `[n]` their accumulators.
      lr: learning rate (scalar).
      epsilon: eps added to sqrt(a).
    """
    accumulator = accumulator + tf.reduce_mean(tf.square(g), axis=-1)  # [n]
    scale = lr / (tf.sqrt(accumulator) + epsilon)  # [n]
    return rows - scale[:, None] * g, accumulator


@document_base_keyword_args
class AdamWRowWiseAdagrad(AdamW):
    """`AdamW` (PyTorch's formula) on dense variables; row-wise Adagrad on the embedding tables.

    Variables whose Keras `path` matches a `sparse_variables` pattern are tables `[rows, dim]`:
    their gradient (an `IndexedSlices` of the looked-up rows, or dense) is reduced to one
    gradient per distinct row, and only those rows and their accumulators change
    (`rowwise_adagrad_rows`); the other rows are not read or written. Every other variable gets
    `AdamW.formula`. Both use the same (scheduled) learning rate, as the reference ramps the
    dense and the fused sparse learning rates in lockstep.

    Args:
      learning_rate: a float or a `LearningRateSchedule` (both channels).
      beta_1, beta_2, epsilon: the dense Adam's (`AdamW`).
      sparse_epsilon: eps of the row-wise Adagrad (>= 0).
      sparse_variables: regular expressions (`re.search` on the path) naming the tables.
      dense_clipnorm: clip the dense variables' summed gradients to this global norm, leaving
        the tables' out of the norm and unclipped (the DLRMv4 reference's clip: its fused
        tables update inside the backward pass); None: no clip.
      {{base_keyword_args}}
    """

    config_arguments = ("beta_1", "beta_2", "epsilon", "sparse_epsilon", "dense_clipnorm")

    def __init__(
        self,
        learning_rate=1e-3,
        *,
        sparse_variables: Iterable[str] = ("embedding",),
        sparse_epsilon: float = 1e-8,
        dense_clipnorm: float | None = None,
        weight_decay: float = 0.0,
        name: str = "adamw_rowwise_adagrad",
        **kwargs,
    ):
        super().__init__(learning_rate, weight_decay=weight_decay, name=name, **kwargs)
        self.sparse_epsilon = check_number("sparse_epsilon", sparse_epsilon)
        self.dense_clipnorm = (
            None if dense_clipnorm is None else check_number("dense_clipnorm", dense_clipnorm)
        )
        self.sparse_patterns = compile_exclusion_patterns("sparse_variables", sparse_variables)

    def get_config(self):
        """Every constructor argument, the sparse patterns included."""
        config = super().get_config()
        config["sparse_variables"] = list(self.sparse_patterns)
        return config

    def _all_reduce_sum_gradients(self, grads_and_vars):
        """Keras' cross-replica sum of the gradients, then the dense-only clip
        (`clip_summed_gradients`)."""
        grads_and_vars = super()._all_reduce_sum_gradients(grads_and_vars)
        grads, variables = zip(*grads_and_vars) if grads_and_vars else ((), ())
        return list(zip(self.clip_summed_gradients(list(grads), list(variables)), variables))

    def clip_summed_gradients(self, grads, variables):
        """The dense-only clip: the summed (full-batch) dense gradients scaled to at most
        `dense_clipnorm` in global norm, the tables' untouched. Keras' update path calls it
        after its sum; the suite's gradient summer (split tables) after its own.

        Raises:
          ValueError: a clipped (dense) variable is split over replicas (its norm would be
            one shard's).
        """
        if not self.dense_clipnorm:
            return grads
        dense = [i for i, (g, v) in enumerate(zip(grads, variables)) if g is not None
                 and not self.is_sparse(v)]  # fmt: skip
        for i in dense:
            if layout_of(variables[i]).split:
                raise ValueError(
                    f"dense_clipnorm: {variable_path(variables[i])} is split over replicas"
                )
        clipped, _ = tf.clip_by_global_norm([grads[i] for i in dense], self.dense_clipnorm)
        grads = list(grads)
        for i, g in zip(dense, clipped):
            grads[i] = g
        return grads

    def is_sparse(self, variable) -> bool:
        """Whether `variable` is a table updated by row-wise Adagrad."""
        return matches_any(self.sparse_patterns, variable_path(variable))

    def build(self, var_list):
        """Creates Adam's two moments for each dense variable and one `[rows]` accumulator for
        each table (Adam's slots are not created for the tables)."""
        if self.built:
            return
        super(AdamW, self).build(var_list)  # the base's weight-decay bookkeeping, no slots
        self._slot = {}  # variable index -> position in its slot lists
        self._momentums, self._velocities, self._row_accumulators = [], [], []
        # By index: `update_step` may get a replica's component (the gradient summer's update),
        # whose name is not the Keras path.
        self._sparse_indices = set()
        for variable in var_list:
            index = self._get_variable_index(variable)
            if self.is_sparse(variable):
                self._sparse_indices.add(index)
                if len(variable.shape) != 2:
                    raise ValueError(
                        f"sparse variable {variable_path(variable)} must be [rows, dim], "
                        f"got shape {tuple(variable.shape)}"
                    )
                self._slot[index] = len(self._row_accumulators)
                accumulator = self.add_variable(
                    shape=(variable.shape[0],),
                    dtype=variable.dtype,
                    initializer="zeros",
                    name=f"{variable_path(variable).replace('/', '_')}_row_accumulator",
                )
                # A sharded table (`layers.sharded_embedding`) gives its per-row slot its
                # layout and its placement-free checkpoint entry.
                attach = getattr(variable, "attach_row_slot", None)
                if attach is not None:
                    attach(accumulator)
                self._row_accumulators.append(accumulator)
            else:
                self._slot[index] = len(self._momentums)
                self._momentums.append(self.add_variable_from_reference(variable, "momentum"))
                self._velocities.append(self.add_variable_from_reference(variable, "velocity"))

    def update_step(self, gradient, variable, learning_rate):
        """One step of one variable (update context, summed gradient)."""
        index = self._get_variable_index(variable)
        slot = self._slot[index]
        if index not in self._sparse_indices:
            m, v = self._momentums[slot], self._velocities[slot]
            self.update_with(index, gradient, variable, learning_rate, m, v)
            return
        accumulator = self._row_accumulators[slot]
        rows, g = unique_row_gradient(gradient)
        table, state = tf_variable(variable), tf_variable(accumulator)
        new_rows, new_acc = rowwise_adagrad_rows(
            tf.gather(table, rows),  # [n, dim]: only the touched rows are read ...
            tf.cast(g, variable.dtype),
            tf.gather(state, rows),  # [n]
            tf.cast(learning_rate, variable.dtype),
            self.sparse_epsilon,
        )
        # ... and written.
        state.scatter_update(tf.IndexedSlices(new_acc, rows))
        table.scatter_update(tf.IndexedSlices(new_rows, rows))

    def sharded_update(self, variables):
        """None: the row-wise update is not split into flat pieces."""
        del variables
        return None


def unique_row_gradient(gradient):
    """(distinct row ids `[n]`, their summed gradients `[n, dim]`) of a table's gradient.

    An `IndexedSlices` lists a row once per lookup; its duplicates are summed (FBGEMM's
    deduplication before the row-wise update). A dense gradient gives its nonzero rows.
    """
    if isinstance(gradient, tf.IndexedSlices):
        merged = merge_duplicate_rows(gradient)
        return tf.cast(merged.indices, tf.int64), merged.values
    gradient = tf.convert_to_tensor(gradient)
    ids = tf.where(tf.reduce_any(tf.not_equal(gradient, 0), axis=-1))[:, 0]  # [n]
    return ids, tf.gather(gradient, ids)
