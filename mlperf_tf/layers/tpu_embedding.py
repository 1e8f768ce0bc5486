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
  blocks, `draw_rows`; sharding-aware: one SparseCore shard drawn alone), combiner `sum`
  (every feature here is one id a sample, or a sequence fed one position a row);
* each lookup a `FeatureConfig`: a sequence (a user's history) with `max_sequence_length` = the
  padded length, fed as a `tf.RaggedTensor` of the true lengths (only real ids reach the
  engine; the padding comes back as zero rows); a single id a sample as a dense `[B]` tensor.
  TPUEmbeddingV2 itself gets `engine_feature_configs` (`output_shape` of the per-replica batch)
  and each sequence one position a row (`sparse_core_layout.position_rows`);
* the plan (`plan_engine`): the tables stacked as the engine stacks them and its id buffers
  sized for the batch shape (`sparse_core_layout`), so that checkpoints map the engine's stacked
  layout to whole tables (`TpuEmbeddingTables.checkpoint_entries`) and back;
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
`HostEngine`, the same contract and storage on the host (the stacked SparseCore layout, each
id's stacked row gathered, and the slot program applied to the touched rows), to drive the TPU
path of a model through the runner on a stand-in strategy.
"""

from __future__ import annotations

import dataclasses
import math

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.tpu.ops import gen_xla_ops
from tensorflow.python.trackable import base as base_trackable

from mlperf_tf.errors import UserError
from mlperf_tf.layers import sparse_core_layout as scl
from mlperf_tf.layers.sharded_embedding import draw_rows, draw_rows_at
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
    at `seed` (`draw_rows`), so both paths start from the same tables.

    Sharding-aware (TPUEmbeddingV2 passes `shard_info` to an initializer that takes it,
    `_create_variables`): called for one SparseCore shard, it draws that shard's rows alone
    (every n-th row of the table from `rotation` on: `sparse_core_layout.shard_rows`) from the
    same blocks (`draw_rows_at`), never the whole table; called with the engine's padded
    shape, the padding is zero.

    Attributes:
      seed, bound: the draw's (`draw_rows`).
      rows, dim: the table's own shape (the engine pads both).
      rotation: the table's SparseCore shard rotation (`sparse_core_shard_rotation`), set once
        the tables are stacked (`plan_engine`).
      cores_per_chip: SparseCores a chip has (set with `rotation`; 0: no chip known). TF asks
        for a chip's shards one after another (`_create_variables`); the first call draws all
        of them in one pass over the table's blocks (a shard is every n-th row, so each holds
        rows of every block) and keeps the others for their calls: each block drawn once a
        chip, the peak that chip's share of the table and one block.
    """

    seed: int
    bound: float
    rows: int
    dim: int
    rotation: int = 0
    cores_per_chip: int = 0
    _kept: dict = dataclasses.field(default_factory=dict, init=False, compare=False, repr=False)

    def __call__(self, shape, dtype=tf.float32, shard_info=None):
        padded_rows, width = (int(d) for d in shape)
        if shard_info is None:
            values = draw_rows(self.seed, self.bound, 0, self.rows, self.dim, dtype)
            return tf.pad(values, [[0, padded_rows - self.rows], [0, width - self.dim]])
        size, offset = int(shard_info.shape[0]), int(shard_info.offset[0])
        values = self._kept.pop((padded_rows, size, offset), None)
        if values is None:
            shard = offset // size  # the SparseCore's index among all n
            first = shard - shard % max(1, self.cores_per_chip)  # the chip's first
            cores = range(first, first + max(1, self.cores_per_chip))
            index = np.concatenate([
                scl.shard_rows(rows=self.rows, padded_rows=padded_rows, shard_size=size,
                               shard_offset=core * size, rotation=self.rotation)
                for core in cores
            ])  # fmt: skip
            drawn = tf.split(draw_rows_at(self.seed, self.bound, index, self.dim, dtype),
                             len(cores))  # fmt: skip  # [size, dim] a core
            for core, part in zip(cores, drawn, strict=True):
                self._kept[(padded_rows, size, core * size)] = part
            values = self._kept.pop((padded_rows, size, offset))
        return tf.pad(values, [[0, 0], [0, width - self.dim]])


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
      UserError: a table the SparseCore cannot hold: more rows than its int32 ids address,
        values other than float32, or a width the engine pads (not a multiple of 8: the
        slot program would see the padded row, and row-wise Adagrad's mean over it differs).
    """
    if tf.as_dtype(dtype) != tf.float32:
        raise UserError(f"the TPU embedding tables hold float32 values, not {dtype}")
    if dim % scl.XLA_PAD:
        raise UserError(
            f"the TPU embedding tables' width {dim} is not a multiple of {scl.XLA_PAD}: the "
            "SparseCore pads rows to one, and row-wise Adagrad's mean over a padded row differs"
        )
    out = {}
    for k, (name, n) in enumerate(rows.items()):
        if n > MAX_TABLE_ROWS:
            raise UserError(
                f"table {name}: {n} rows, more than the TPU embedding engine's int32 ids address "
                f"({MAX_TABLE_ROWS}); hash it into fewer rows"
            )
        out[name] = tf.tpu.experimental.embedding.TableConfig(
            vocabulary_size=int(n), dim=int(dim), name=name, combiner="sum",
            initializer=TableInitializer(seed + k, float(bounds[name]), int(n), int(dim)),
            optimizer=optimizer,
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


def engine_feature_configs(features: dict, batch: int) -> dict:
    """TPUEmbeddingV2's `FeatureConfig`s of `features` (`feature_configs`: the same tables) for
    a per-replica batch: `output_shape` `[batch, length]` for a sequence (fed one position a
    row, `sparse_core_layout.position_rows`), `[batch]` for one id a sample. TPUEmbeddingV2
    counts a feature's rows by `output_shape` alone (it must be set; `max_sequence_length` is
    not read), and keras-rs' conversion gives it the per-replica batch too
    (`keras_rs/.../tensorflow/config_conversion.py` `keras_to_tf_tpu_feature_config`)."""
    out = {}
    for name, f in features.items():
        shape = [batch, f.max_sequence_length] if f.max_sequence_length else [batch]
        out[name] = tf.tpu.experimental.embedding.FeatureConfig(
            table=f.table, output_shape=shape, name=name
        )
    return out


@dataclasses.dataclass(frozen=True)
class EnginePlan:
    """What an engine is made of: the lookups (`features`, the serving configs), the same for
    TPUEmbeddingV2 (`engine_features`), the tables' SparseCore layout (`layouts`, table name ->
    `SparseCoreTableLayout`), the id buffers (`buffers`) and the chips the tables split over."""

    features: dict
    engine_features: dict
    layouts: dict
    buffers: scl.SparseCoreBuffers
    chips: int


def plan_engine(features: dict, *, batch: int, chips: int, sc_per_chip: int = scl.SC_PER_CHIP,
                setting: str = "the batch") -> EnginePlan:  # fmt: skip
    """The engine of `features` (`feature_configs`) for `batch` samples a replica on `chips`:
    the tables stacked as TPUEmbeddingV2 stacks them (`sparse_core_layout.layouts_of`), the id
    buffers no batch of that shape overflows (`buffer_limits`), and each table's initializer
    given its shards' rotation (so that it draws a SparseCore shard alone). Allocates nothing.

    Raises:
      UserError: a shape the engine cannot take (`buffer_limits`), naming `setting`.
    """
    engine_features = engine_feature_configs(features, batch)
    layouts = scl.layouts_of(engine_features, chips=chips, sc_per_chip=sc_per_chip)
    samples = {n: (f.table.name, math.prod(f.output_shape)) for n, f in
               engine_features.items()}  # fmt: skip
    buffers = scl.buffer_limits(layouts, samples, sc_per_chip=sc_per_chip, setting=setting)
    for table in {f.table.name: f.table for f in features.values()}.values():
        rotation = layouts[table.name].sparse_core_shard_rotation
        table.initializer = dataclasses.replace(table.initializer, rotation=rotation,
                                                cores_per_chip=sc_per_chip)  # fmt: skip
    return EnginePlan(features, engine_features, layouts, buffers, chips)


# ---- engines -----------------------------------------------------------------------------------
class HostEngine:
    """The SparseCore engine's contract on the host, its storage TPUEmbeddingV2's: each stacked
    table (and its accumulator slot) one variable `[n x R, width]` in the SparseCore layout of
    the plan (rows interleaved over the SparseCores, `sparse_core_layout`), drawn at the start
    shard by shard by the tables' sharding-aware initializers as TPUEmbeddingV2 calls them
    (`initial_stack`); the lookup gathers each id's stacked row (zero past a sequence's
    length, as TF's CPU lookup `cpu_embedding_lookup`), and `apply_gradients` runs the
    `CustomOptimizer`'s program on each touched row, its gradient summed over the batch first.
    The variables are the layer's non-trainable Keras weights."""

    def __init__(self, layer: TpuEmbeddingTables, plan: EnginePlan, optimizer):
        self.features, self.optimizer, self.layouts = plan.features, optimizer, plan.layouts
        tables = {f.table.name: f.table for f in plan.features.values()}
        self.variables = {}  # stacked table -> (table, accumulator)
        for stack, members in scl.stacks(plan.layouts).items():
            inits = {m.table_name: tables[m.table_name].initializer for m in members}
            shape = scl.stack_shape(members)
            table = layer.add_weight(
                shape=shape, name=stack, trainable=False,
                initializer=lambda s, dtype=None, m=members, i=inits: scl.initial_stack(
                    m, i, chips=plan.chips),
            )  # fmt: skip
            slot = layer.add_weight(
                shape=shape, name=f"{stack}_{ACCUMULATOR}", trainable=False, initializer="zeros"
            )
            self.variables[stack] = (table, slot)

    def _stacked(self, feature):
        layout = self.layouts[feature.table.name]
        return layout, self.variables[layout.stacked_table_name]

    def lookup(self, inputs):
        out = {}
        for name, f in self.features.items():
            layout, (table, _) = self._stacked(f)
            ids, dim = inputs[name], f.table.dim
            if isinstance(ids, tf.RaggedTensor):
                rows = tf.gather(table, scl.stacked_rows(layout, ids.flat_values))[:, :dim]
                out[name] = tf.RaggedTensor.from_row_splits(rows, ids.row_splits).to_tensor(
                    shape=[None, f.max_sequence_length, dim]
                )  # [B, T, dim], zero past each length
            else:
                out[name] = tf.gather(table, scl.stacked_rows(layout, ids))[..., :dim]
        return out, inputs

    def apply_gradients(self, gradients, inputs):
        """The custom program on each stacked table's touched rows (duplicates summed)."""
        by_stack = {}  # stacked table -> ([stacked rows], [gradients])
        for name, f in self.features.items():
            layout, _ = self._stacked(f)
            ids, grads = _flat_rows(inputs[name], gradients[name], f.table.dim)
            rows, grads_ = by_stack.setdefault(layout.stacked_table_name, ([], []))
            rows.append(scl.stacked_rows(layout, ids))
            grads_.append(grads)
        lr = tf.convert_to_tensor(self.optimizer.learning_rate(), tf.float32)
        hyper = [tf.constant(h, tf.float32) for h in self.optimizer.hyperparameters]
        for stack, (rows, grads) in by_stack.items():
            table, slot = (tf_variable(v) for v in self.variables[stack])
            unique, index = tf.unique(tf.concat(rows, 0))  # [n], [m]
            g = tf.math.unsorted_segment_sum(tf.concat(grads, 0), index, tf.size(unique))
            # The program's Python body: eager calls of varying row counts need no retracing.
            program = getattr(self.optimizer.custom_computation, "python_function", None)
            new, (acc,) = (program or self.optimizer.custom_computation)(
                g, tf.gather(table, unique), (tf.gather(slot, unique),), lr, hyper
            )
            slot.scatter_update(tf.IndexedSlices(acc, unique))
            table.scatter_update(tf.IndexedSlices(new, unique))

    def read_stacks(self) -> dict:
        """Stacked table -> (its value, its accumulator's), `[n x R, width]` each."""
        return {n: (t.value, s.value) for n, (t, s) in self.variables.items()}

    def assign_stacks(self, values: dict, slot: bool) -> None:
        """Assigns stacked values (stacked table -> `[n x R, width]`) to the tables, or with
        `slot` to their accumulators."""
        for name, value in values.items():
            tf_variable(self.variables[name][int(slot)]).assign(value)


def _flat_rows(ids, gradient, dim):
    """(ids `[m]` int32, their activations' gradients `[m, dim]`) of one feature's lookups:
    a ragged sequence's real ids (its padding got no id), or one id a sample."""
    if isinstance(ids, tf.RaggedTensor):
        lengths = ids.row_lengths()
        mask = tf.sequence_mask(lengths, tf.shape(gradient)[1])  # [B, T]
        return tf.cast(ids.flat_values, tf.int32), tf.boolean_mask(gradient, mask)
    return tf.reshape(tf.cast(ids, tf.int32), [-1]), tf.reshape(gradient, [-1, dim])


class SparseCoreEngine:
    """TPUEmbeddingV2 (`_RowWiseTPUEmbeddingV2`) under the ambient TPUStrategy, its buffers the
    plan's (`SparseCoreEmbeddingConfig`), sequences fed one position a row. Not run."""

    def __init__(self, layer: TpuEmbeddingTables, plan: EnginePlan, optimizer):
        del layer
        self.plan = plan
        self.embedding = _row_wise_embedding_class()(
            plan.engine_features, optimizer, sparse_core_embedding_config=plan.buffers.config()
        )
        # The checkpoint mapping and the initializers' rotations are the plan's layout: the
        # engine's own stacking must have made the same.
        made = self.embedding.embedding_layouts
        if {n: t.SerializeToString() for n, t in made.items()} != {
            n: t.SerializeToString() for n, t in plan.layouts.items()
        }:
            raise RuntimeError("TPUEmbeddingV2 stacked the tables unlike `layouts_of`")
        self.embedding.build()

    def lookup(self, inputs):
        features = self.plan.engine_features
        if tf.distribute.in_cross_replica_context():
            # The model's build on a dummy batch (outside the TPU step): shapes only.
            return _zero_activations(inputs, features), None
        feed = {
            n: scl.position_rows(x, features[n].output_shape[1])
            if isinstance(x, tf.RaggedTensor) else x
            for n, x in inputs.items()
        }  # fmt: skip
        return self.embedding(feed)

    def apply_gradients(self, gradients, preserved):
        self.embedding.apply_gradients(gradients, preserved_outputs=preserved)

    def _sharded(self, stack: str, slot: bool):
        state = self.embedding.variables[stack]
        return state[ACCUMULATOR if slot else "parameters"]

    def read_stacks(self) -> dict:
        """Stacked table -> (value, accumulator), each its chips' shards joined in device
        order (the sharded variable's `values`; a cross-replica read of it is refused)."""
        out = {}
        for stack in scl.stacks(self.plan.layouts):
            out[stack] = tuple(
                tf.concat([v.read_value() for v in self._sharded(stack, slot).values], 0)
                for slot in (False, True)
            )
        return out

    def assign_stacks(self, values: dict, slot: bool) -> None:
        """Assigns stacked values, each chip its even share of rows."""
        for stack, value in values.items():
            shards = self._sharded(stack, slot).values
            for shard, part in zip(shards, tf.split(value, len(shards)), strict=True):
                shard.assign(part)


def _zero_activations(inputs, features):
    """Zero activations of `output_shape` (`[B, T, dim]` a sequence, `[B, dim]` a single id),
    the batch read from `inputs`."""
    out = {}
    for name, f in features.items():
        shape = [tf.shape(inputs[name])[0], *list(f.output_shape)[1:], f.table.dim]
        out[name] = tf.zeros(tf.stack(shape), tf.float32)
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


def make_engine(layer, plan: EnginePlan, optimizer):
    """The engine of a TPU run: TPUEmbeddingV2 (`SparseCoreEngine`); tests replace it."""
    return SparseCoreEngine(layer, plan, optimizer)


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
    builds the model before the optimizer). Before it, the tables are stacked as the engine
    stacks them (`sparse_core_layout.layouts_of`, one chip a replica) and its id buffers sized
    for the batch (`buffer_limits`): a shape the engine cannot take is a one-line error here.

    Checkpoints (`checkpoint_entries`) hold the tables whole, `[sum of rows, dim]` in the
    order of `rows`, and their accumulators `[sum of rows]`, as `ShardedEmbeddings` saves
    them: mapped from the engine's stacked layout at save and back at restore.

    Args:
      rows, dim, bounds, seed: the tables as `ShardedEmbeddings` takes them.
      features: feature name -> `Feature`.
      epsilon: row-wise Adagrad's eps.
      batch_size: samples a replica looks up in a step (the engine's shapes and buffers).
      memory_limit_bytes, limit_setting: the most one replica may hold of the tables and their
        slot (0: unchecked; `check_memory`), checked before any table is made.
      batch_setting: the setting a batch the engine cannot take is named by.
    """

    def __init__(self, rows: dict[str, int], dim: int, *, bounds: dict[str, float],
                 features: dict[str, Feature], epsilon: float, batch_size: int, seed: int = 0,
                 memory_limit_bytes: int = 0, limit_setting: str = "memory_limit_bytes",
                 batch_setting: str = "batch_size", **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        strategy = tf.distribute.get_strategy()
        chips = strategy.num_replicas_in_sync
        check_memory(rows, dim, shards=chips, limit_bytes=memory_limit_bytes,
                     setting=limit_setting)  # fmt: skip
        self.rows, self.dim, self.seed = dict(rows), int(dim), int(seed)
        self.features, self.epsilon = dict(features), float(epsilon)
        self.optimizer_ = None
        self.tpu_optimizer = rowwise_adagrad_optimizer(self._learning_rate, self.epsilon)
        self.tables = table_configs(self.rows, self.dim, bounds=bounds, seed=self.seed,
                                    optimizer=self.tpu_optimizer)  # fmt: skip
        self.feature_configs = feature_configs(self.tables, self.features)
        self.plan = plan_engine(self.feature_configs, batch=int(batch_size), chips=chips,
                                sc_per_chip=_sparse_cores_per_chip(strategy),
                                setting=f"`{batch_setting}` ({batch_size} a replica)")  # fmt: skip
        self.layouts = self.plan.layouts
        self.trap = self.add_weight(shape=(1,), initializer="zeros", name="gradient_trap")
        self.engine = make_engine(self, self.plan, self.tpu_optimizer)
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
        """Table name -> its whole value `[rows, dim]` (NumPy; cross-replica context)."""
        return {n: t.numpy() for n, t in self._whole(slot=False).items()}

    def _whole(self, slot: bool) -> dict:
        """Table name -> its whole table (`[rows, dim]`) or accumulator (`slot`: `[rows]`)."""
        stacked = self.engine.read_stacks()
        out = {}
        for stack, members in scl.stacks(self.layouts).items():
            out.update(scl.from_stacked(stacked[stack][int(slot)], members, per_row=slot))
        return out

    def canonical(self, slot: bool = False):
        """Every table whole in the order of `rows`, `[sum of rows, dim]`, or with `slot` their
        accumulators `[sum of rows]`: `ShardedEmbeddings`' checkpoint entries."""
        whole = self._whole(slot)
        return tf.concat([whole[n] for n in self.rows], axis=0)

    def assign_canonical(self, value, slot: bool = False) -> None:
        """Assigns `canonical`'s form to the engine's tables (or accumulators), each stacked
        table mapped to the engine's layout."""
        parts = dict(zip(self.rows, tf.split(value, list(self.rows.values())), strict=True))
        self.engine.assign_stacks({
            stack: scl.to_stacked({m.table_name: parts[m.table_name] for m in members}, members)
            for stack, members in scl.stacks(self.layouts).items()
        }, slot)  # fmt: skip

    def checkpoint_entries(self) -> tuple:
        """(tables, accumulators): checkpoint entries of the canonical forms (`canonical`),
        written from the engine's layout and restored into it."""
        total = sum(self.rows.values())
        return tuple(
            WholeEntry(read=lambda s=slot: self.canonical(s),
                       write=lambda v, s=slot: self.assign_canonical(v, s),
                       shape=(total, self.dim) if not slot else (total,))
            for slot in (False, True)
        )  # fmt: skip

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


class WholeEntry(base_trackable.Trackable):
    """A checkpoint entry whose tensor is computed at save (`read`) and handed back at restore
    (`write`): how a variable kept in another arrangement is saved in the suite's whole form
    (TF's own `SparseCoreStackedTableTrackable` restores stacked tables this way).

    Raises (at restore):
      UserError: a tensor of another shape than `shape` (a checkpoint of another model).
    """

    def __init__(self, *, read, write, shape):
        self._read, self._write, self._shape = read, write, tuple(shape)

    def _serialize_to_tensors(self):
        return {base_trackable.VARIABLE_VALUE_KEY: self._read()}

    def _restore_from_tensors(self, restored_tensors):
        value = restored_tensors[base_trackable.VARIABLE_VALUE_KEY]
        if tuple(value.shape) != self._shape:
            raise UserError(
                f"checkpoint tensor of TPU tables has shape {list(value.shape)}, the model "
                f"needs {list(self._shape)}"
            )
        self._write(tf.cast(value, tf.float32))
        return tf.no_op()


def _sparse_cores_per_chip(strategy) -> int:
    """SparseCores a chip has: the TPU's own count (`tpu_hardware_feature`), or TPUEmbeddingV2's
    fallback of 4 when it reports none (and off a TPU)."""
    extended = getattr(strategy, "extended", None)
    feature = getattr(extended, "tpu_hardware_feature", None)
    return int(getattr(feature, "num_embedding_devices_per_chip", 0) or scl.SC_PER_CHIP)


__all__ = [
    "ACCUMULATOR",
    "EnginePlan",
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
    "engine_feature_configs",
    "make_engine",
    "plan_engine",
    "rowwise_adagrad_optimizer",
    "rowwise_adagrad_program",
    "rowwise_adagrad_update",
    "table_configs",
    "tpu_optimizer",
    "WholeEntry",
]
