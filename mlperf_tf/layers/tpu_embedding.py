"""Provides the TPU path of embedding tables: `TpuEmbeddingTables`, the tables of a
`ShardedEmbeddings` held by TF's SparseCore API (`tf.tpu.experimental.embedding.TPUEmbeddingV2`),
with row-wise Adagrad as a `CustomOptimizer` slot program.

Why this API (the README of `benchmarks/dlrmv4`, "Tables on TPU", compares it with keras-rs'
`DistributedEmbedding` from their sources): TPUEmbeddingV2 is the only one of TF 2.20's two
TPU embedding engines that takes a user optimizer (`CustomOptimizer`, `tpu_embedding_v2_utils.py`
l. 220: "a per-row update function ... auto scaled for the entire table", TPU v5p and later);
the older `TPUEmbedding` (TPU v2-v4) and keras-rs' optimizer mapping offer SGD, Adagrad,
AdagradMomentum, Adam and FTRL only, none of them row-wise.

What the mapping does (`table_configs`, `feature_configs`, `tpu_optimizer`):

* each table a `TableConfig` of its rows and width, named (SparseCore needs names), its
  initial values the ones `ShardedEmbeddings` draws (`TableInitializer`: U(+-bound) by row
  blocks, `draw_rows`), combiner `sum` (every feature here is one id a sample, or a sequence,
  which no combiner reduces);
* each lookup a `FeatureConfig`: a sequence (a user's history) with `max_sequence_length` = the
  padded length, fed as a `tf.RaggedTensor` of the true lengths (only real ids reach the
  engine; the padding comes back as zero rows); a single id a sample as a dense `[B]` tensor;
* the optimizer: `AdamWRowWiseAdagrad`'s table channel as a `CustomOptimizer` whose program
  (`rowwise_adagrad_program`) is FBGEMM's exact row-wise Adagrad on one row, its one slot the
  row's accumulator, its learning rate the Keras optimizer's scheduled one (read at each apply,
  as keras-rs' `config_conversion.keras_to_tf_tpu_optimizer` does for a schedule).

Costs the API imposes, honestly: a slot has the table's shape (`tpu_embedding_v3.py`
`_create_variables`: `slot_creator` makes every slot `variable_shape`), so the row's one
accumulator is stored `dim` times (all equal): as much memory as the table, where FBGEMM keeps
one float a row. TF 2.20's `TPUEmbeddingV2.apply_gradients` dispatches SGD, Adagrad,
AdagradMomentum, Adam and FTRL and raises for anything else ("Unsupported optimizer in
minibatching mode"), although the op a custom program needs,
`XlaSparseDenseMatmulGradWithCsrInput(tables, hyperparameters, custom_computation)`, is in
its `gen_xla_ops`: `_RowWiseTPUEmbeddingV2` applies a `CustomOptimizer` table through that op.

Not run on a TPU: there is none here. The engine is replaceable (`make_engine`); the tests use
`HostEngine`, the same contract on the host (TF's CPU serving lookup, `cpu_embedding_lookup`,
and the slot program applied to the touched rows), to drive the TPU path of a model through the
runner on a stand-in strategy.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf
from tensorflow.python.tpu.ops import gen_xla_ops

from mlperf_tf.errors import UserError
from mlperf_tf.layers.sharded_embedding import draw_rows
from mlperf_tf.optimizers.base import tf_variable
from mlperf_tf.optimizers.rowwise_adagrad import AdamWRowWiseAdagrad, rowwise_adagrad_rows

ACCUMULATOR = "row_accumulator"  # the custom optimizer's one slot
# SparseCore's ids are int32 (`sorted_token_ids` of every `XlaSparseDenseMatmul*` op).
MAX_TABLE_ROWS = 2**31 - 1


def rowwise_adagrad_update(
    gradient, embedding_table, slot_variables, learning_rate, hyperparameters
):
    """Row-wise Adagrad as a TPUEmbeddingV2 `CustomOptimizer` program: (new rows, (new
    accumulator,)).

    FBGEMM's `EXACT_ROWWISE_ADAGRAD` (`rowwise_adagrad_rows`): a = a + mean(g**2) over the
    row, row = row - lr / (sqrt(a) + eps) * g, with g the row's gradient summed over the
    batch. The API calls it on one row (`[dim]`) and its slot has the row's shape, so the
    accumulator is kept in every entry of the row (all equal); any leading shape works, which
    is how the tests run it on `[n, dim]` rows.

    Args:
      gradient: `[..., dim]` the rows' summed gradients.
      embedding_table: `[..., dim]` the rows.
      slot_variables: (accumulator `[..., dim]`,), each row's value repeated.
      learning_rate: scalar.
      hyperparameters: (epsilon,).
    """
    (accumulator,) = slot_variables
    (epsilon,) = hyperparameters
    shape = tf.shape(embedding_table)
    dim = shape[-1]
    rows, accumulators = rowwise_adagrad_rows(
        tf.reshape(embedding_table, [-1, dim]), tf.reshape(gradient, [-1, dim]),
        tf.reshape(accumulator, [-1, dim])[:, 0], learning_rate, epsilon,
    )  # fmt: skip
    accumulator = tf.broadcast_to(tf.reshape(accumulators, tf.concat([shape[:-1], [1]], 0)), shape)
    return tf.reshape(rows, shape), (accumulator,)


rowwise_adagrad_program = tf.function(rowwise_adagrad_update, autograph=False)


def rowwise_adagrad_optimizer(learning_rate, epsilon: float):
    """Row-wise Adagrad as a TPUEmbeddingV2 `CustomOptimizer`: the program
    `rowwise_adagrad_program`, one slot (`ACCUMULATOR`, zeros), epsilon its hyperparameter.

    Args:
      learning_rate: a float, or a callable read at each apply (a schedule's current value).
      epsilon: eps added to sqrt(accumulator).
    """
    return tf.tpu.experimental.embedding.CustomOptimizer(
        custom_computation=rowwise_adagrad_program,
        learning_rate=learning_rate,
        slot_names=[ACCUMULATOR],
        # As TF's own slots and its `CustomOptimizer` example: an initializer of a partition.
        slot_initializers=[tf.constant_initializer(0.0, support_partition=True)],
        hyperparameters=[float(epsilon)],
    )


def check_table_optimizer(optimizer) -> AdamWRowWiseAdagrad:
    """`optimizer`, if its table channel is one the TPU path expresses (row-wise Adagrad).

    Raises:
      UserError: an optimizer without a row-wise table channel.
    """
    if not isinstance(optimizer, AdamWRowWiseAdagrad):
        raise UserError(
            f"the TPU embedding tables take row-wise Adagrad (`AdamWRowWiseAdagrad`); "
            f"{type(optimizer).__name__} has no table channel the TPU path can express"
        )
    return optimizer


def tpu_optimizer(optimizer):
    """The table channel of a Keras `optimizer` as a TPU embedding optimizer, its learning
    rate the optimizer's own (its schedule at its iteration, read at each apply).

    Raises:
      UserError: an optimizer with no row-wise table channel (`check_table_optimizer`).
    """
    check_table_optimizer(optimizer)
    return rowwise_adagrad_optimizer(lambda: optimizer.learning_rate, optimizer.sparse_epsilon)


@dataclasses.dataclass(frozen=True)
class TableInitializer:
    """A table's initial value as `ShardedEmbeddings` draws it: U(-bound, bound) by row blocks
    at `seed` (`draw_rows`), so both paths start from the same tables. Not sharding-aware:
    TPUEmbeddingV2 slices the SparseCore shards out of the whole (`_create_variables`)."""

    seed: int
    bound: float

    def __call__(self, shape, dtype=tf.float32):
        rows, dim = (int(d) for d in shape)
        return draw_rows(self.seed, self.bound, 0, rows, dim, dtype)


@dataclasses.dataclass(frozen=True)
class Feature:
    """One lookup: its table and, for a sequence, its padded length (0: one id a sample)."""

    table: str
    sequence_length: int = 0


def table_configs(rows: dict[str, int], dim: int, *, bounds: dict[str, float], seed: int,
                  optimizer=None, dtype="float32") -> dict:  # fmt: skip
    """`TableConfig`s of tables given as `ShardedEmbeddings` takes them (table k seeded
    `seed + k`, in order).

    Raises:
      UserError: a table the SparseCore cannot hold: more rows than its int32 ids address, or
        values other than float32.
    """
    if tf.as_dtype(dtype) != tf.float32:
        raise UserError(f"the TPU embedding tables hold float32 values, not {dtype}")
    out = {}
    for k, (name, n) in enumerate(rows.items()):
        if n > MAX_TABLE_ROWS:
            raise UserError(
                f"table {name}: {n} rows, more than the TPU embedding engine's int32 ids address "
                f"({MAX_TABLE_ROWS}); hash it into fewer rows"
            )
        out[name] = tf.tpu.experimental.embedding.TableConfig(
            vocabulary_size=int(n), dim=int(dim), name=name, combiner="sum",
            initializer=TableInitializer(seed + k, float(bounds[name])), optimizer=optimizer,
        )  # fmt: skip
    return out


def check_memory(rows: dict[str, int], dim: int, *, shards: int, limit_bytes: int,
                 setting: str) -> None:  # fmt: skip
    """Refuses tables whose share on one of `shards` replicas, with the row-wise accumulator
    slot (table-sized on this API), exceeds `limit_bytes` (0: unchecked).

    Raises:
      UserError: the share does not fit; names `setting`.
    """
    need = -(-sum(rows.values()) // max(1, shards)) * dim * 4 * 2  # table + slot, fp32
    if limit_bytes and need > limit_bytes:
        raise UserError(
            f"`{setting}` ({limit_bytes / 2**30:g} GiB): the TPU embedding tables and their "
            f"table-sized row-wise Adagrad slot need {need / 2**30:.3g} GiB per replica over "
            f"{shards} replicas; use more TPU chips"
        )


def feature_configs(tables: dict, features: dict[str, Feature]) -> dict:
    """`FeatureConfig`s of `features` (name -> `Feature`) over `tables` (`table_configs`)."""
    out = {}
    for name, f in features.items():
        if f.table not in tables:
            raise UserError(f"feature {name}: no table {f.table} (tables: {', '.join(tables)})")
        out[name] = tf.tpu.experimental.embedding.FeatureConfig(
            table=tables[f.table], max_sequence_length=int(f.sequence_length), name=name
        )
    return out


# ---- engines -----------------------------------------------------------------------------------
class HostEngine:
    """The SparseCore engine's contract on the host: TF's CPU lookup of the same configs
    (`tpu_embedding_for_serving.cpu_embedding_lookup`, what `TPUEmbeddingForServing` serves
    with) and, on `apply_gradients`, the `CustomOptimizer`'s program on each touched row, its
    gradient summed over the batch first. Its tables and slots are the layer's
    (non-trainable) Keras weights, in the slot shape TPUEmbeddingV2 gives them."""

    def __init__(self, layer: TpuEmbeddingTables, features: dict, optimizer):
        self.layer, self.features, self.optimizer = layer, features, optimizer
        self.variables = {}  # table name -> (table, accumulator)
        for config in {id(f.table): f.table for f in features.values()}.values():
            shape = (config.vocabulary_size, config.dim)
            table = layer.add_weight(
                shape=shape, name=config.name, trainable=False,
                initializer=lambda s, dtype=None, c=config: c.initializer(s, dtype or "float32"),
            )  # fmt: skip
            slot = layer.add_weight(
                shape=shape, name=f"{config.name}_{ACCUMULATOR}", trainable=False,
                initializer="zeros",
            )  # fmt: skip
            self.variables[config.name] = (table, slot)

    def lookup(self, inputs):
        from tensorflow.python.tpu.tpu_embedding_for_serving import cpu_embedding_lookup

        tables = {f.table: self.variables[f.table.name][0] for f in self.features.values()}
        return cpu_embedding_lookup(inputs, None, tables, self.features), inputs

    def apply_gradients(self, gradients, inputs):
        """The custom program on each table's touched rows (duplicates summed)."""
        by_table = {}  # table name -> ([ids], [gradients])
        for name, f in self.features.items():
            ids, grads = _flat_rows(inputs[name], gradients[name], f.table.dim)
            by_table.setdefault(f.table.name, ([], []))
            by_table[f.table.name][0].append(ids)
            by_table[f.table.name][1].append(grads)
        lr = tf.convert_to_tensor(self.optimizer.learning_rate(), tf.float32)
        hyper = [tf.constant(h, tf.float32) for h in self.optimizer.hyperparameters]
        for name, (ids, grads) in by_table.items():
            table, slot = (tf_variable(v) for v in self.variables[name])
            unique, index = tf.unique(tf.concat(ids, 0))  # [n], [m]
            g = tf.math.unsorted_segment_sum(tf.concat(grads, 0), index, tf.size(unique))
            # The program's Python body: eager calls of varying row counts need no retracing.
            program = getattr(self.optimizer.custom_computation, "python_function", None)
            rows, (acc,) = (program or self.optimizer.custom_computation)(
                g, tf.gather(table, unique), (tf.gather(slot, unique),), lr, hyper
            )
            slot.scatter_update(tf.IndexedSlices(acc, unique))
            table.scatter_update(tf.IndexedSlices(rows, unique))


def _flat_rows(ids, gradient, dim):
    """(ids `[m]` int32, their activations' gradients `[m, dim]`) of one feature's lookups:
    a ragged sequence's real ids (its padding got no id), or one id a sample."""
    if isinstance(ids, tf.RaggedTensor):
        lengths = ids.row_lengths()
        mask = tf.sequence_mask(lengths, tf.shape(gradient)[1])  # [B, T]
        return tf.cast(ids.flat_values, tf.int32), tf.boolean_mask(gradient, mask)
    return tf.reshape(tf.cast(ids, tf.int32), [-1]), tf.reshape(gradient, [-1, dim])


class SparseCoreEngine:
    """TPUEmbeddingV2 (`_RowWiseTPUEmbeddingV2`) under the ambient TPUStrategy. Not run."""

    def __init__(self, layer: TpuEmbeddingTables, features: dict, optimizer):
        del layer
        self.embedding = _row_wise_embedding_class()(features, optimizer)
        self.embedding.build()

    def lookup(self, inputs):
        if tf.distribute.in_cross_replica_context():
            # The model's build on a dummy batch (outside the TPU step): shapes only.
            return _zero_activations(inputs, self.embedding._feature_config), None
        return self.embedding(inputs)

    def apply_gradients(self, gradients, preserved):
        self.embedding.apply_gradients(gradients, preserved_outputs=preserved)


def _zero_activations(inputs, features):
    """Zero activations of `inputs`' shapes (`[B, T, dim]` a sequence, `[B, dim]` a single id)."""
    out = {}
    for name, f in features.items():
        batch = tf.shape(inputs[name])[0]
        shape = [batch, f.max_sequence_length, f.table.dim] if f.max_sequence_length else [
            batch, f.table.dim]  # fmt: skip
        out[name] = tf.zeros(shape, tf.float32)
    return out


def _row_wise_embedding_class():
    """TPUEmbeddingV2 with `CustomOptimizer` tables applied through
    `XlaSparseDenseMatmulGradWithCsrInput` (TF 2.20's `apply_gradients` raises for them)."""
    from tensorflow.python.tpu import tpu_embedding_v3

    class _RowWiseTPUEmbeddingV2(tpu_embedding_v3.TPUEmbeddingV2):
        def apply_gradients(self, gradients, preserved_outputs):
            # As TF's: stacked on the core, then the SparseCore's backward ops flagged for its
            # pipelining passes (`EmbeddingPipeliningContext`).
            gradients = self._stack_gradients(gradients)
            context = tpu_embedding_v3.EmbeddingPipeliningContext(
                tpu_embedding_v3._PIPELINE_MODE_BACKWARD, self._pipelining
            )
            context.Enter()
            try:
                self._apply_custom(gradients, preserved_outputs)
            finally:
                context.Exit()

        def _apply_custom(self, gradients, preserved_outputs):
            for name, tables in self._stacked_table_to_tables.items():
                optimizer = tables[0].optimizer
                if not isinstance(optimizer, tf.tpu.experimental.embedding.CustomOptimizer):
                    raise UserError(f"table {name}: not a row-wise Adagrad table")
                state = self.variables[name]
                slot_names = optimizer._slot_names()
                lr = optimizer.learning_rate
                table, slots = custom_optimizer_update(
                    optimizer, csr=preserved_outputs[name], gradients=gradients[name],
                    table=state["parameters"].read_value(),
                    slots=[state[s].read_value() for s in slot_names],
                    learning_rate=lr() if callable(lr) else lr, table_name=name,
                )  # fmt: skip
                state["parameters"].assign(table)
                for s, value in zip(slot_names, slots, strict=True):
                    state[s].assign(value)

    return _RowWiseTPUEmbeddingV2


def concrete_program(optimizer, dim: int):
    """The `CustomOptimizer`'s program as the op's `custom_computation` attribute: a concrete
    function of 1 + tables + hyperparameters arguments, each `f32[1, dim]` (the gradient row,
    the table's and each slot's row, the learning rate and each hyperparameter broadcast),
    returning the updated table and slot rows: what `XlaSparseDenseMatmulGradWithCsrInputOp`
    compiles it with (`tensorflow/core/tpu/kernels/sparse_core_xla_ops.cc`, `Compile`:
    "For all the arguments, we use the float type and the shape is {1, feature_width}")."""
    row = tf.TensorSpec([1, dim], tf.float32)
    slots = tuple(row for _ in optimizer._slot_names())
    hyper = tuple(row for _ in optimizer.hyperparameters)
    return optimizer.custom_computation.get_concrete_function(row, row, slots, row, hyper)


def custom_optimizer_update(optimizer, *, csr, gradients, table, slots, learning_rate,
                            table_name: str):  # fmt: skip
    """The SparseCore's update of one table by a `CustomOptimizer`: the program on every
    touched row (`XlaSparseDenseMatmulGradWithCsrInput`); (new table, [new slots]).

    Args:
      optimizer: the `CustomOptimizer`.
      csr: the lookup's preserved CSR tensors (`row_pointers`, `sorted_sample_ids`,
        `sorted_token_ids`, `sorted_gains`, `num_minibatches_per_physical_sparse_core`).
      gradients: `[samples, dim]` the activations' gradients (stacked per table).
      table, slots: the table's and its slots' values.
      learning_rate: scalar.
    """
    hyper = [tf.cast(learning_rate, tf.float32)]
    hyper += [tf.constant(h, tf.float32) for h in optimizer.hyperparameters]
    updated = gen_xla_ops.xla_sparse_dense_matmul_grad_with_csr_input(
        row_pointers=csr.row_pointers,
        sorted_sample_ids=csr.sorted_sample_ids,
        sorted_token_ids=csr.sorted_token_ids,
        sorted_gains=csr.sorted_gains,
        activation_gradients=gradients,
        tables=[table, *slots],
        hyperparameters=hyper,
        num_minibatches_per_physical_sparse_core=csr.num_minibatches_per_physical_sparse_core,
        custom_computation=concrete_program(optimizer, int(table.shape[-1])),
        table_name=table_name,
    )
    return updated[0], list(updated[1:])


def make_engine(layer, features, optimizer):
    """The engine of a TPU run: TPUEmbeddingV2 (`SparseCoreEngine`); tests replace it."""
    return SparseCoreEngine(layer, features, optimizer)


# ---- the layer ---------------------------------------------------------------------------------
class TpuEmbeddingTables(keras.layers.Layer):
    """Embedding tables on TPU's embedding engine, declared as a `ShardedEmbeddings` is.

    `call(inputs)` takes a dict feature name -> ids (a `tf.RaggedTensor` `[B, (l)]` for a
    sequence feature, `[B]` otherwise) and returns feature name -> activations (`[B, T, dim]`,
    zero past each length; `[B, dim]`). The backward pass hands the activations' gradients to
    the engine, which updates the touched rows and their accumulators by row-wise Adagrad at
    the bound optimizer's learning rate (`bind_optimizer`, before the first training step):
    the tables are not Keras trainable weights, so the dense optimizer never sees them
    (keras-rs' gradient trap: a zero-gradient dummy weight carries the custom gradient,
    `keras_rs/src/layers/embedding/tensorflow/distributed_embedding.py`
    `_tpu_embedding_lookup_v2`).

    The engine is made here, in the strategy's scope (TPUEmbeddingV2 must be), with the
    optimizer's epsilon; the learning rate is read from the optimizer bound later (the runner
    builds the model before the optimizer).

    Args:
      rows, dim, bounds, seed: the tables as `ShardedEmbeddings` takes them.
      features: feature name -> `Feature`.
      epsilon: row-wise Adagrad's eps.
      memory_limit_bytes, limit_setting: the most one replica may hold of the tables and their
        slot (0: unchecked; `check_memory`), checked before any table is made.
    """

    def __init__(self, rows: dict[str, int], dim: int, *, bounds: dict[str, float],
                 features: dict[str, Feature], epsilon: float, seed: int = 0,
                 memory_limit_bytes: int = 0, limit_setting: str = "memory_limit_bytes",
                 **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        check_memory(rows, dim, shards=tf.distribute.get_strategy().num_replicas_in_sync,
                     limit_bytes=memory_limit_bytes, setting=limit_setting)  # fmt: skip
        self.rows, self.dim, self.seed = dict(rows), int(dim), int(seed)
        self.features, self.epsilon = dict(features), float(epsilon)
        self.optimizer_ = None
        self.tpu_optimizer = rowwise_adagrad_optimizer(self._learning_rate, self.epsilon)
        self.tables = table_configs(self.rows, self.dim, bounds=bounds, seed=self.seed,
                                    optimizer=self.tpu_optimizer)  # fmt: skip
        self.feature_configs = feature_configs(self.tables, self.features)
        self.trap = self.add_weight(shape=(1,), initializer="zeros", name="gradient_trap")
        self.engine = make_engine(self, self.feature_configs, self.tpu_optimizer)
        self.built = True

    def bind_optimizer(self, optimizer) -> None:
        """Takes the tables' learning rate from `optimizer` (its schedule at its iteration).

        Raises:
          UserError: an optimizer whose table channel is not row-wise Adagrad, or whose eps
            is not the one the engine was made with.
        """
        check_table_optimizer(optimizer)
        if optimizer.sparse_epsilon != self.epsilon:
            raise UserError(
                f"the optimizer's sparse_epsilon {optimizer.sparse_epsilon:g} is not the TPU "
                f"tables' {self.epsilon:g}"
            )
        self.optimizer_ = optimizer

    def _learning_rate(self):
        if self.optimizer_ is None:
            raise RuntimeError("TpuEmbeddingTables: bind_optimizer() before a training step")
        return self.optimizer_.learning_rate

    def table_values(self) -> dict:
        """Table name -> its whole value (a `HostEngine`'s; SparseCore tables are stacked and
        sharded in the engine's own layout)."""
        if not isinstance(self.engine, HostEngine):
            raise NotImplementedError("whole tables are read back from the host engine only")
        return {n: t.numpy() for n, (t, _) in self.engine.variables.items()}

    def call(self, inputs):
        names = list(self.features)
        engine = self.engine

        @tf.custom_gradient
        def trap(dummy):
            activations, preserved = engine.lookup({n: inputs[n] for n in names})

            def grad(*upstream):
                engine.apply_gradients(dict(zip(names, upstream, strict=True)), preserved)
                return tf.zeros_like(dummy)

            return [activations[n] for n in names], grad

        return dict(zip(names, trap(self.trap.value), strict=True))


__all__ = [
    "ACCUMULATOR",
    "Feature",
    "HostEngine",
    "SparseCoreEngine",
    "TableInitializer",
    "TpuEmbeddingTables",
    "feature_configs",
    "check_memory",
    "check_table_optimizer",
    "concrete_program",
    "custom_optimizer_update",
    "make_engine",
    "rowwise_adagrad_optimizer",
    "rowwise_adagrad_program",
    "rowwise_adagrad_update",
    "table_configs",
    "tpu_optimizer",
]
