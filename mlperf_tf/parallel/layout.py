"""Provides `Layout`: how one variable lies on the device mesh, and the per-replica shards it implies.

A variable is split along one of its dimensions over some mesh axes (Megatron's weights over
`model`, an expert layer's over `expert`), replicated along the others, and its gradient is
summed over the axes whose replicas read different batches but hold the same shard (`data`, and
`expert` unless it is split over it). DTensor's `Layout` names, per dimension, the mesh axis a
tensor is split over; here one split dimension suffices for every layer the suite has.

How a split variable is held (the mechanism, in replica context, as weight-update sharding's
slots are held): it is an ordinary mirrored variable of the *shard's* shape, whose per-replica
components hold different shards. A replica reads its own component in replica context (what a
`MirroredVariable` does), takes its gradient there, and the runner's `GradientSummer` sums the
gradient over the layout's `sum_over` axes only and updates each component with its replica's
gradient (`strategy.extended.update` with per-replica arguments). Optimizer slots made from the
variable (`add_variable_from_reference`) take its shard shape and are split alike. TF refuses
trainable sync-on-read variables, hence mirrored ones; nothing here ever relies on the
components being equal.

Whole tensors: `assign_whole` gives each replica its shard of a whole value (initial weights,
a restore), `whole_value` joins the shards (a save: concatenated where this process holds them
all, all-gathered over the shard group where it spans workers by the collective bound with
`set_gatherer`, `mlperf_tf.collectives.whole.gathered_value`); `save_whole`
makes a variable's checkpoint entry the whole tensor, so checkpoints do not depend on the mesh.
"""

from __future__ import annotations

import dataclasses
import math

import keras
import numpy as np
import tensorflow as tf

from mlperf_tf.errors import UserError
from mlperf_tf.parallel.context import resolve
from mlperf_tf.parallel.mesh import AXES, GRADIENT_AXES, DeviceMesh

_ATTRIBUTE = "mlperf_tf_layout"
_DECLARED = "mlperf_tf_declared_layout"
_GATHERER = "mlperf_tf_gatherer"  # the collective that joins shards across workers (`set_gatherer`)


@dataclasses.dataclass(frozen=True)
class Layout:
    """A variable's place on the mesh.

    Attributes:
      split_axis: the variable's dimension cut into shards (None: replicated everywhere).
      split_over: the mesh axes whose replicas hold different shards, outermost first.
      sum_over: the mesh axes its gradient is summed over (`GRADIENT_AXES`: the batch axes and
        the spatial axis, whose slabs hold partial gradients, less the axes it is split over).
    """

    split_axis: int | None = None
    split_over: tuple[str, ...] = ()
    sum_over: tuple[str, ...] = GRADIENT_AXES

    def __post_init__(self):
        for axis in self.split_over + self.sum_over:
            if axis not in AXES:
                raise ValueError(f"unknown mesh axis '{axis}' (axes: {', '.join(AXES)})")
        if (self.split_axis is None) != (not self.split_over):
            raise ValueError("a layout names both a split dimension and the axes it is split over")

    @property
    def split(self) -> bool:
        return self.split_axis is not None

    def num_shards(self, mesh: DeviceMesh) -> int:
        return math.prod(getattr(mesh, axis) for axis in self.split_over)

    def shard_index(self, mesh: DeviceMesh, replica: int) -> int:
        """Which shard `replica` holds (row-major over `split_over`)."""
        index = 0
        for axis in self.split_over:
            index = index * getattr(mesh, axis) + mesh.index(replica, axis)
        return index

    def shard_shape(self, whole_shape, mesh: DeviceMesh) -> tuple[int, ...]:
        """The shape one replica holds.

        Raises:
          ValueError: the split dimension does not divide by the number of shards.
        """
        shape = tuple(int(d) for d in whole_shape)
        if not self.split:
            return shape
        n = self.num_shards(mesh)
        if shape[self.split_axis] % n:
            raise ValueError(f"dimension {self.split_axis} of {shape} does not split into {n}")
        return tuple(d // n if i == self.split_axis else d for i, d in enumerate(shape))

    def sum_axes(self, mesh: DeviceMesh) -> tuple[str, ...]:
        """The `sum_over` axes that have more than one replica on `mesh`: layouts with equal
        ones sum their gradients over the same groups (one all-reduce serves them all)."""
        return tuple(axis for axis in self.sum_over if getattr(mesh, axis) > 1)

    def sum_group(self, mesh: DeviceMesh, replica: int) -> list[int]:
        """The replicas `replica`'s gradient is summed with."""
        return mesh.group(replica, *self.sum_over)

    def shard_group(self, mesh: DeviceMesh, replica: int) -> list[int]:
        """The replicas that hold the other shards of `replica`'s copy (itself if replicated)."""
        return mesh.group(replica, *self.split_over)


REPLICATED = Layout()
# An expert-parallel MoE layer's expert weights (`mlperf_tf.layers.moe`): dimension 0 (the
# experts) split over `expert`; each gradient summed over the replicas that hold the same experts
# and read other batches or slabs (`data`, `spatial`), never over `expert` (other experts) nor
# `model` (the shards of a model group compute the same gradient of a weight they replicate).
EXPERT_SPLIT = Layout(split_axis=0, split_over=("expert",), sum_over=("data", "context", "spatial"))


def model_split(axis: int) -> Layout:
    """Megatron's layout: dimension `axis` split over `model`, gradient summed over the batch axes."""
    return Layout(split_axis=axis, split_over=("model",))


def set_layout(variable, layout: Layout) -> None:
    """Records `layout` on `variable` (a Keras variable)."""
    setattr(variable, _ATTRIBUTE, layout)


def layout_of(variable) -> Layout:
    """The variable's layout (`REPLICATED` unless `set_layout` said otherwise)."""
    return getattr(variable, _ATTRIBUTE, REPLICATED)


def declare_layout(variable, layout: Layout) -> None:
    """Records the layout `variable`'s layer gives it on any mesh, split or not.

    `layout_of` says how a variable *is* held (replicated when the mesh does not split it, as at
    M = 1); this says how its layer would split it, which the TPU path reads on the unsplit
    model to annotate it (`mlperf_tf.parallel.tpu`). Nothing on the CPU path reads it.
    """
    setattr(variable, _DECLARED, layout)


def declared_layout(variable) -> Layout:
    """The layout `declare_layout` recorded (else the variable's `layout_of`)."""
    return getattr(variable, _DECLARED, None) or layout_of(variable)


def check_divides(mesh: DeviceMesh | None = None, /, **dimensions: int) -> None:
    """Refuses a `--model_parallel` that does not divide a dimension it splits.

    Args:
      mesh: the run's mesh (None: the ambient one, `mlperf_tf.parallel.current_mesh()`; no check
        outside a run).
      **dimensions: name -> size, e.g. `num_heads=16` (the name is the config field).

    Raises:
      UserError: one line naming the first dimension that does not divide.
    """
    mesh = resolve(mesh)
    if mesh is None:
        return
    for name, size in dimensions.items():
        if size % mesh.model:
            raise UserError(
                f"--model_parallel={mesh.model} must divide {name} ({size}): each model shard "
                "holds an equal part of it"
            )


def whole_shape(variable, mesh: DeviceMesh) -> tuple[int, ...]:
    """`variable`'s whole shape on `mesh` (a split variable holds one shard of it per replica)."""
    shape = list(variable.shape)
    layout = layout_of(variable)
    if layout.split:
        shape[layout.split_axis] *= layout.num_shards(mesh)
    return tuple(shape)


# ---- per-replica shards ------------------------------------------------------------------------
def _slices(whole, layout: Layout, mesh: DeviceMesh) -> list:
    if not layout.split:
        return [whole]
    return tf.split(whole, layout.num_shards(mesh), axis=layout.split_axis)


def _local_replica_ids(strategy) -> list[int]:
    ids = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(ctx.replica_id_in_sync_group)
    )
    return [int(v) for v in strategy.experimental_local_results(ids)]


def _strategy_of(tf_var):
    """The strategy `tf_var` was made under (a distributed variable knows it), else the current
    one: the runner saves and restores checkpoints outside `strategy.scope()`, where the current
    strategy is the default one, which sees a single component."""
    return getattr(tf_var, "distribute_strategy", None) or tf.distribute.get_strategy()


def assign_whole(variable, whole, mesh: DeviceMesh | None) -> None:
    """Gives each replica's component of `variable` its shard of `whole` (cross-replica context).

    Args:
      variable: a Keras (or tf) variable created under the strategy, of the shard's shape.
      whole: the whole tensor (the same on every worker).
      mesh: the run's mesh (None: unsplit).
    """
    layout = layout_of(variable)
    tf_var = variable.value if isinstance(variable, keras.Variable) else variable
    strategy = _strategy_of(tf_var)
    whole = tf.cast(whole, tf_var.dtype)
    if not layout.split or layout.num_shards(mesh) == 1:
        tf_var.assign(whole)
        return
    parts = _slices(whole, layout, mesh)
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: parts[layout.shard_index(mesh, ctx.replica_id_in_sync_group)]
    )
    strategy.extended.update(tf_var, lambda v, x: v.assign(x), args=(values,), group=False)


def assign_shards(variable, read_shard, mesh: DeviceMesh | None) -> None:
    """Gives each local replica's component of `variable` the shard `read_shard(index)` returns
    (cross-replica context): a loader that reads each shard alone (a slice of a file) never
    holds the whole tensor, unlike `assign_whole`.

    Args:
      variable: a Keras (or tf) variable created under the strategy, of the shard's shape.
      read_shard: shard index (`Layout.shard_index`; 0 when not split) -> the shard's value.
      mesh: the run's mesh (None: unsplit).
    """
    layout = layout_of(variable)
    tf_var = variable.value if isinstance(variable, keras.Variable) else variable
    if mesh is None or not layout.split or layout.num_shards(mesh) == 1:
        tf_var.assign(tf.cast(read_shard(0), tf_var.dtype))
        return
    strategy = _strategy_of(tf_var)
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.cast(
            read_shard(layout.shard_index(mesh, ctx.replica_id_in_sync_group)), tf_var.dtype
        )
    )
    strategy.extended.update(tf_var, lambda v, x: v.assign(x), args=(values,), group=False)


def assign_whole_row(variable, index: int, row, mesh: DeviceMesh | None) -> None:
    """Writes `row` as entry `index` of `variable`'s whole first dimension (cross-replica
    context): each local replica whose shard holds that entry gets its part, so a stacked
    [E, ...] weight (one expert of a Hugging Face checkpoint) is filled one entry at a time and
    never whole. Split over the first dimension (experts over `expert`), the replicas of the
    shard holding entry `index` write all of `row`; split over another (an expert's width over
    `model`), every replica writes its slice of `row`.

    Args:
      variable: a Keras (or tf) variable created under the strategy, of the shard's shape.
      index: the entry of the whole first dimension.
      row: its whole value (the whole shape less the first dimension).
      mesh: the run's mesh (None: unsplit).
    """
    layout = layout_of(variable)
    tf_var = _tf_variable(variable)
    strategy = _strategy_of(tf_var)
    # Each component by itself: a distributed variable's `[index]` is a read, with no `assign`.
    components = strategy.experimental_local_results(tf_var)
    if mesh is None or not layout.split or layout.num_shards(mesh) == 1:
        for component in components:
            component[index].assign(tf.cast(row, component.dtype))
        return
    ids = _local_replica_ids(strategy) if strategy.num_replicas_in_sync > 1 else [0]
    for replica, component in zip(ids, components, strict=True):
        shard = layout.shard_index(mesh, replica)
        width = int(component.shape[layout.split_axis])
        if layout.split_axis == 0:
            if shard * width <= index < (shard + 1) * width:
                component[index - shard * width].assign(tf.cast(row, component.dtype))
            continue
        part = tf.split(row, layout.num_shards(mesh), axis=layout.split_axis - 1)[shard]
        component[index].assign(tf.cast(part, component.dtype))


def divide_shards(variable, divisor: float) -> None:
    """Divides each local replica's component of `variable` by `divisor` in place
    (cross-replica context), each its own shard: `variable.assign(variable / divisor)` there
    would read one component and write it into all, every shard becoming the first."""
    tf_var = _tf_variable(variable)
    for component in _strategy_of(tf_var).experimental_local_results(tf_var):
        component.assign(component / divisor)


def whole_value(variable, mesh: DeviceMesh, *, gather: bool | None = None):
    """`variable`'s whole tensor, joined from the shards of its replicas (cross-replica context).

    When this process holds every shard of some copy (the shard group of its first replica lies
    on its devices: one host, or a model axis inside each worker) they are concatenated here, no
    collective. When a shard group spans workers (`--model_parallel` across
    MultiWorkerMirroredStrategy processes) each replica all-gathers its shard over its group
    (the gather bound with `set_gatherer`, `mlperf_tf.collectives.whole.gathered_value`): a
    collective, so every worker must call this for the same variables in
    the same order, as every worker already takes part in a checkpoint save. Which case applies
    depends only on the mesh and the per-worker replica count, the same on every worker.

    Args:
      variable: a Keras (or tf) variable created under the strategy, of the shard's shape.
      mesh: the run's mesh.
      gather: force (True) or forbid (False) the collective gather; None: gather only when
        the shards are not all on this process.

    Returns:
      The whole tensor (the same on every worker).
    """
    layout = layout_of(variable)
    tf_var = _tf_variable(variable)
    if not layout.split or layout.num_shards(mesh) == 1:
        return tf.convert_to_tensor(tf_var)
    strategy = _strategy_of(tf_var)
    components = strategy.experimental_local_results(tf_var)
    # Global replica ids of the local components (a worker's first one need not be 0).
    ids = _local_replica_ids(strategy) if strategy.num_replicas_in_sync > 1 else [0]
    by_replica = dict(zip(ids, components, strict=True))
    owners = layout.shard_group(mesh, ids[0])  # shards 0..n-1 of this process's first copy
    local = all(r in by_replica for r in owners)
    if gather is None:
        gather = not local
    if gather:
        gatherer = getattr(variable, _GATHERER, None)
        if gatherer is None:
            raise ValueError(
                f"{_name(variable)}: joining shards held by other workers needs a collective "
                "gather bound to the variable (`mlperf_tf.collectives.bind_gathers`)"
            )
        return gatherer(mesh)
    if not local:
        raise ValueError(f"{_name(variable)}: shards on replicas {owners} are not all local")
    return tf.concat([tf.convert_to_tensor(by_replica[r]) for r in owners], axis=layout.split_axis)


def set_gatherer(variable, gather) -> None:
    """Binds how `whole_value` joins `variable`'s shards when some are on other workers: a
    collective, which this package does not issue (`mlperf_tf.collectives` imports it, never
    the reverse); the runner binds `mlperf_tf.collectives.whole.gathered_value` with the run's
    timeout (`collectives.bind_gathers`).

    Args:
      variable: a split variable.
      gather: a callable taking the mesh and returning the whole tensor (cross-replica context;
        every worker calls it for the same variables in the same order).
    """
    setattr(variable, _GATHERER, gather)


def _tf_variable(variable):
    return variable.value if isinstance(variable, keras.Variable) else variable


def _name(variable) -> str:
    return getattr(variable, "path", None) or variable.name


def save_whole(variable, mesh: DeviceMesh | None, whole_shape, *, to_whole=None,
               from_whole=None) -> None:  # fmt: skip
    """Makes `variable`'s checkpoint entry its whole tensor: joined at save, split at restore.

    Uses the hooks `tf.train.Checkpoint` calls on objects that serialize themselves
    (`_serialize_to_tensors` / `_restore_from_tensors`, which Keras 3's TF variables implement),
    set on this one variable. A restored tensor whose shape is not `whole_shape` is a one-line
    `UserError` (a checkpoint of another model).

    `to_whole` / `from_whole`: for a variable that stores its whole tensor in another
    arrangement (`mlperf_tf.layers.sharded_embedding`: each table's rows on their shard, padded),
    the maps from the joined storage to the whole tensor and back; the hooks are then set at
    any shard count, one included.
    """
    layout = layout_of(variable)
    split = mesh is not None and layout.split and layout.num_shards(mesh) > 1
    if not split and to_whole is None:
        return
    whole_shape = tuple(int(d) for d in whole_shape)
    name = _name(variable)

    def serialize():
        stored = (
            whole_value(variable, mesh) if split else tf.convert_to_tensor(_tf_variable(variable))
        )
        return {"VARIABLE_VALUE": stored if to_whole is None else to_whole(stored)}

    def restore(restored_tensors):
        value = restored_tensors["VARIABLE_VALUE"]
        if tuple(value.shape) != whole_shape:
            raise UserError(
                f"checkpoint tensor {name} has shape {list(value.shape)}, the model needs "
                f"{list(whole_shape)}"
            )
        value = tf.cast(value, variable.dtype)
        stored = value if from_whole is None else from_whole(value)
        if split:
            assign_whole(variable, stored, mesh)
        else:
            _tf_variable(variable).assign(stored)
        return variable.value

    variable._serialize_to_tensors = serialize  # noqa: SLF001 (Trackable's own hook)
    variable._restore_from_tensors = restore  # noqa: SLF001


def add_split_weight(
    layer: keras.layers.Layer,
    *,
    name: str,
    shape,
    initializer,
    layout: Layout,
    mesh: DeviceMesh | None = None,
    dtype=None,
):
    """A weight of `layer` whose whole shape is `shape`, held as shards per `layout` on `mesh`.

    The whole initial value is drawn once with the layer's (seeded) `initializer` and each
    replica gets its slice, so every mesh starts from the same weights (what the exactness tests
    compare). Without a split (no mesh, or one shard) it is `layer.add_weight` itself. Either
    way `layout` is recorded as the weight's declared layout (`declare_layout`). `mesh` None:
    the ambient one (`mlperf_tf.parallel.current_mesh()`).
    """
    initializer = keras.initializers.get(initializer)
    mesh = resolve(mesh)
    if mesh is None or layout.num_shards(mesh) == 1:
        variable = layer.add_weight(name=name, shape=shape, initializer=initializer, dtype=dtype)
        declare_layout(variable, layout)
        return variable
    variable = layer.add_weight(
        name=name, shape=layout.shard_shape(shape, mesh), initializer="zeros", dtype=dtype
    )
    set_layout(variable, layout)
    declare_layout(variable, layout)
    whole = initializer(tuple(shape), dtype=variable.dtype)
    assign_whole(variable, whole, mesh)
    save_whole(variable, mesh, shape)
    return variable


def splits_weights(mesh: DeviceMesh | None) -> bool:
    """Whether `mesh` splits weights into shards (its `model` or `expert` axis above 1): what
    needs whole tensors joined or split, where an unsplit mesh reads and writes them as they
    are."""
    return mesh is not None and (mesh.model > 1 or mesh.expert > 1)


def split_slots(optimizer, mesh: DeviceMesh | None) -> None:
    """Gives the optimizer's slots of split variables their variable's layout and whole-tensor
    checkpoint entries (call after `optimizer.build`). Slots are found as Keras names them:
    `add_variable_from_reference` names a slot `<variable path with _>_<slot>`, with the
    variable's (shard) shape."""
    if not splits_weights(mesh):
        return
    by_prefix = {}
    for v in getattr(optimizer, "_trainable_variables", []):
        layout = layout_of(v)
        if layout.split and layout.num_shards(mesh) > 1:
            by_prefix[v.path.replace("/", "_") + "_"] = v
    for slot in optimizer.variables:
        for prefix, v in by_prefix.items():
            if slot.name.startswith(prefix) and tuple(slot.shape) == tuple(v.shape):
                layout = layout_of(v)
                set_layout(slot, layout)
                whole = list(slot.shape)
                whole[layout.split_axis] *= layout.num_shards(mesh)
                save_whole(slot, mesh, whole)
                break


def bytes_per_replica(variables) -> int:
    """Bytes of `variables` one replica holds (shard shapes for split ones)."""
    return int(sum(np.prod(v.shape) * tf.as_dtype(v.dtype).size for v in variables))
