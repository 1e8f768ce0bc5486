"""Provides `GradientSummer`: the runner's cross-replica gradient sum and optimizer apply.

Replaces the sum that Keras' `apply_gradients` does (through the strategy's cross-device ops)
with the chosen algorithm on the replica mesh, optionally on packed buckets, and optionally
with the weight update sharded across replicas:

    unsharded: pack -> all-reduce per bucket -> unpack -> [clip] -> optimizer.apply_gradients
    sharded:   pack -> reduce-scatter per bucket -> [clip] -> shard update -> all-gather -> assign

`apply` runs in replica context (inside `strategy.run`); the optimizer apply and the weight
assignment happen in one `merge_call`, where the summed values are identical on every replica,
so Keras sums nothing again.

On a device mesh with more than the data axis (`--model_parallel`, `--expert_parallel`,
`--spatial_partition`), each variable's gradient is summed over its layout's `sum_over` axes
only (`mlperf_tf.parallel.layout`): variables with the same axes form one `SumGroup`, whose
gradients are packed together and summed by the algorithm over that group's members
(`GroupView`, on an R x C view of the group's size); each replica's component of a split
variable is updated with its own summed gradient. So a tensor-parallel weight (split over
`model`), an expert weight (split over `expert`, summed over `data` and `spatial`) and a
replicated weight (summed over every batch axis) go through one sum and one update. Global norms
(clipping, an optimizer's `whole_norm_terms`) add the squares of a split variable's shards over
the axes it is split over, once for replicated variables. Weight-update sharding is one more
layout on the same groups: each sum group's members hold 1/n pieces of its variables' summed
gradients and optimizer slots (so expert weights are sharded over the data axis, replicated ones
over data x expert), and the optimizer's declared rule (`sharding.rule_for`) updates the pieces
with the whole-variable norms it asks for: squares summed over the split axes, then over the
sum group. On a `pipeline` axis the pieces follow the stage map (`build(stages=...)`,
`stages.py`): each stage's replicas sum and update their stage's variables only, hold only
their slots, and exchange the new weights over the pipeline group.

An embedding table's sparse gradient (`IndexedSlices`) whose optimizer updates it by rows
(`is_sparse`, row-wise Adagrad) is summed as rows in the unsharded path (`rows.py`: ids and
rows all-gathered over the sum group, duplicates merged) and applied as rows, never made into
the dense table; the others are made dense.

The step's collectives use the replica's shared `replica_collectives()`, the one ordering token
an expert-parallel MoE layer's all-to-alls (forward and gradient) also take, so every replica
issues them all in one program order.
"""

from __future__ import annotations

import dataclasses
import json
import os

import keras
import tensorflow as tf
from absl import logging

from mlperf_tf.collectives.algorithms import ALGORITHM_CLASSES
from mlperf_tf.collectives.mesh import Mesh, default_mesh, resolve_mesh
from mlperf_tf.collectives.ops import (
    Collectives,
    GroupView,
    Traffic,
    replica_collectives,
    static_replica_id,
)
from mlperf_tf.collectives.packing import Packing
from mlperf_tf.collectives.rows import all_gather_rows
from mlperf_tf.collectives.sharding import check_optimizer, declared_rule, rule_for
from mlperf_tf.collectives.stages import StageMap, StageSlots, exchange
from mlperf_tf.errors import UserError
from mlperf_tf.parallel.layout import REPLICATED, layout_of
from mlperf_tf.parallel.mesh import DeviceMesh


@dataclasses.dataclass(frozen=True)
class Settings:
    """The gradient-summation choices of a run (the RunConfig fields, resolved)."""

    all_reduce: str = "auto"
    mesh: str = ""
    pack_mb: float = 0.0
    weight_update_sharding: bool = False
    # Seconds a collective may wait for its peers before DeadlineExceededError (0: no limit,
    # as tf.distribute's default; TF's heartbeat still ends a multi-worker run whose peer died).
    # Not on by default: TF starts one sleeping thread per collective execution for a timeout,
    # so a 600 s timeout kept ~800 threads per step of ResNet-50 alive until the process could
    # start no more ("Resource temporarily unavailable").
    timeout_s: float = 0.0

    @property
    def uses_keras_sum(self) -> bool:
        """`auto` without packing or sharding keeps Keras' own sum (the strategy's ops)."""
        return self.all_reduce == "auto" and not self.pack_mb and not self.weight_update_sharding


def _num_workers(strategy) -> int:
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None:
        return 1
    spec = resolver.cluster_spec().as_dict()
    return max(1, sum(len(spec.get(kind, [])) for kind in ("chief", "worker")))


def _tf_variable(variable):
    return variable.value if isinstance(variable, keras.Variable) else variable


@dataclasses.dataclass(frozen=True)
class SumGroup:
    """Variables whose gradients are summed over the same mesh axes, and how they are summed.

    Attributes:
      axes: the mesh axes (of more than one replica) the gradients are summed over; () for a
        group of one replica, which sums nothing.
      indices: the variables' positions in the list `GradientSummer.build` saw.
      packing: their buckets (rows: the group's replicas).
      mesh: the algorithm's R x C view of the group's replicas.
      stage: the pipeline stage whose replicas sum and update these variables (a stage-sharded
        update, `build(stages=...)`); None: every replica.
      whole: the members each hold the whole summed gradient and slots of every variable (the
        stage-local update without `--weight_update_sharding`: all-reduced, not scattered over
        the group; `packing` has one shard); False: each holds its 1/n piece.
    """

    axes: tuple[str, ...]
    indices: tuple[int, ...]
    packing: Packing
    mesh: Mesh
    stage: int | None = None
    whole: bool = False


class _WholeView:
    """An algorithm seen by a `SumGroup.whole` group: its "reduce-scatter" is the all-reduce of
    the one-shard bucket ([1, K]: every member keeps the whole sum), its "all-gather" moves
    nothing (every member already holds the whole new value), its shard is 0. So the sharded
    update's code (pack, scatter, update the pieces, gather, unpack) runs the stage-local update
    unchanged, with pieces that are whole variables."""

    shard = 0

    def __init__(self, algorithm, size: int):
        self.algorithm = algorithm
        self.ops = algorithm.ops
        self.size = size

    def reduce_scatter(self, x, name: str):
        # x: [1, K] -> [K], summed over the group; as [size, ceil(K / size)] for the algorithms
        # that lay a bucket out over the group's members (torus2d).
        if self.size == 1:
            return x[0]
        k = int(x.shape[1])
        cols = -(-k // self.size)
        flat = tf.pad(tf.reshape(x, [-1]), [[0, cols * self.size - k]])
        summed = self.algorithm.all_reduce(tf.reshape(flat, [self.size, cols]), name)
        return tf.reshape(summed, [-1])[:k]

    def all_gather(self, s, name: str):
        del name
        return s[None]  # [1, K]


class GradientSummer:
    """Sums per-replica gradients with `settings.all_reduce` and applies the optimizer.

    Args:
      strategy: the run's strategy (MirroredStrategy, MultiWorkerMirroredStrategy, ...).
      settings: the choices.

    Raises:
      UserError: a mesh that does not fit the replica count, or torus2d on one replica.
    """

    def __init__(self, strategy, settings: Settings, device_mesh: DeviceMesh | None = None):
        self.strategy = strategy
        self.settings = settings
        replicas = strategy.num_replicas_in_sync
        self.device_mesh = device_mesh if device_mesh is not None else DeviceMesh(data=replicas)
        if self.device_mesh.size != replicas:
            raise ValueError(f"{self.device_mesh} does not have the strategy's {replicas} replicas")
        workers = _num_workers(strategy)
        algorithm = settings.all_reduce
        if algorithm == "auto":
            algorithm = "hierarchical" if workers > 1 else "ring"
        self.algorithm = algorithm
        # The all-reduce's R x C view is of the replicas one gradient is summed over.
        self.mesh: Mesh = resolve_mesh(
            settings.mesh, self.device_mesh.batch_shards, algorithm=algorithm,
            num_workers=workers,
        )  # fmt: skip
        self.workers = workers
        self.layouts = []
        self.shapes: list[tuple[int, ...]] = []  # the variables' (a split one's: its shard's)
        self.dtypes: list[tf.DType] = []
        self.groups: list[SumGroup] = []
        self.traffic: dict[int, Traffic] = {}  # per replica id, filled when the step is traced
        self.rule = None
        self.slots: list[list[tf.Variable]] = []
        # A stage-sharded update (`build(stages=...)`): each variable's stage, and the slots.
        self.owners: list[int] | None = None
        # The stage-local update without `--weight_update_sharding` (`build`): each stage's
        # replicas hold their stage's slots whole.
        self.stage_local = False
        self.shared: tuple[int, ...] = ()  # variables several stages read (stage-local update)
        self.paths: list[str] = []  # the variables' Keras paths (the slots' checkpoint keys)
        self.stage_slots: StageSlots | None = None
        self.packing: Packing | None = None
        self._gather_slots = None  # the traced `_gather_slots_fn`, made at the first save

    def metadata(self) -> dict:
        """The choices, for the suite's own run metadata (not MLPerf keys)."""
        out = {
            "all_reduce": self.algorithm,
            "mesh": str(self.mesh),
            "pack_mb": self.settings.pack_mb,
            "weight_update_sharding": self.settings.weight_update_sharding,
        }
        if self.owners is not None:  # sharded by the stage map over `pipeline` (`stages.py`)
            out["update_stages"] = self.device_mesh.pipeline
        if self.device_mesh.pipeline > 1:  # what is stage-local (the same at P = 1 always)
            out["optimizer_state"] = self.optimizer_state()
        return out

    def optimizer_state(self) -> str:
        """What one replica holds of the optimizer's slots (after `build`), for the log."""
        if self.stage_local:
            return "its pipeline stage's, whole"
        if self.owners is not None:
            return "its pipeline stage's, divided over its sum group (data, ...)"
        if self.sharded:
            return "1/n of every variable's, n its sum group"
        return "every variable's, whole"

    @property
    def sharded(self) -> bool:
        """`--weight_update_sharding`: slots and update divided over each sum group."""
        return self.settings.weight_update_sharding

    @property
    def holds_slots(self) -> bool:
        """Whether the summer keeps the optimizer's slots (sharded, or stage-local), so that
        the optimizer is built without any (known after `build`)."""
        return self.sharded or self.stage_local

    def build(self, optimizer, variables, *, stages: StageMap | None = None) -> None:
        """Makes the shard slots (one [k] copy per replica); call under `strategy.scope()`.

        Args:
          optimizer: the run's optimizer; build it after this, without slots when
            `holds_slots` (only its settings and rule are read here).
          variables: the trainable variables, in the order `apply` will see them.
          stages: on a `pipeline` axis, the stage map (`StageMap`, from
            `mlperf_tf.runner.pipeline.stage_owners`: each variable's stage and the variables
            several stages read). The update is sharded by it over that axis (`stages.py`): with
            weight-update sharding in pieces over each stage's sum group (a map with shared
            variables is not taken: even pieces over every gradient axis, as before); without
            it whole on each of the stage's replicas (the stage-local update, when the
            optimizer declares its rule on pieces, `sharding.declared_rule`; a shared
            variable's gradient summed over `pipeline` first). None: with weight-update
            sharding even pieces over every gradient axis; without it every replica updates
            every variable.

        Raises:
          UserError: sharding with an optimizer that has no sharded rule.
        """
        self.layouts = [layout_of(v) for v in variables]
        self.shapes = [tuple(v.shape) for v in variables]
        self.dtypes = [tf.as_dtype(v.dtype) for v in variables]
        # Keras variables' paths (a plain tf.Variable, as some callers build, has its name).
        self.paths = [getattr(v, "path", None) or v.name for v in variables]
        shared = stages.shared if stages is not None else ()
        stages = stages.owners if stages is not None else None
        if shared and self.sharded:  # the flag's update takes no shared variable: even pieces
            stages = None
        on_stages = stages is not None and self.device_mesh.pipeline > 1
        self.rule = None
        if on_stages and not self.sharded:
            self.rule = declared_rule(optimizer, variables)
            if self.rule is None:
                logging.warning(
                    "%s declares no update on pieces (`sharded_update`): every replica keeps "
                    "every variable's optimizer slots at --pipeline_parallel=%d",
                    type(optimizer).__name__, self.device_mesh.pipeline,
                )  # fmt: skip
        self.stage_local = on_stages and not self.sharded and self.rule is not None
        staged = on_stages and (self.sharded or self.stage_local)
        self.owners = list(stages) if staged else None
        self.shared = shared if staged else ()
        by_axes: dict[tuple, list[int]] = {}
        for i, layout in enumerate(self.layouts):
            axes = layout.sum_axes(self.device_mesh)
            if staged:  # (stage, the axes but `pipeline`): the owner stage's members sum it
                axes = (self.owners[i], tuple(a for a in axes if a != "pipeline"))
            by_axes.setdefault(axes, []).append(i)
        if not by_axes:
            by_axes[REPLICATED.sum_axes(self.device_mesh)] = []
        split = [v.path for v, layout in zip(variables, self.layouts, strict=True)
                 if layout.split and layout.num_shards(self.device_mesh) > 1]  # fmt: skip
        if split and getattr(optimizer, "uses_layer_norms", False) and not self.holds_slots:
            if getattr(optimizer, "whole_norm_terms", None) is None:
                raise UserError(
                    f"optimizer {type(optimizer).__name__} uses layer-wise norms but cannot take "
                    f"them whole for variables split across replicas ({split[0]}, ...): use "
                    "LARS, LAMB or Adam with --model_parallel"
                )
        self.groups = []
        for key, indices in sorted(by_axes.items()):
            stage, axes = key if staged else (None, key)
            mesh = self._group_mesh(axes)
            packing = Packing(
                [variables[i].shape for i in indices],
                [variables[i].dtype for i in indices],
                num_shards=1 if self.stage_local else mesh.size,
                pack_mb=self.settings.pack_mb,
            )
            self.groups.append(
                SumGroup(axes, tuple(indices), packing, mesh, stage, whole=self.stage_local)
            )
        # The one group's packing (weight-update sharding has one group).
        self.packing = self.groups[0].packing if len(self.groups) == 1 else None
        check_optimizer(optimizer, f"--all_reduce={self.algorithm}")
        if not self.holds_slots:
            return
        # The optimizer's slots laid out over each sum group: variable i's slots are [k] pieces,
        # one per member of its group (the data axis, and the expert axis for replicated
        # weights), each replica holding its own; stage-local, one whole piece per variable.
        if self.rule is None:
            self.rule = rule_for(optimizer, variables)
        self.slots = [[] for _ in variables]
        if staged:  # per stage, its groups' pieces, in one buffer per slot name and dtype
            pieces = [[] for _ in range(self.device_mesh.pipeline)]
            for group in self.groups:
                for slot in group.packing.slots:
                    index = group.indices[slot.index]
                    pieces[group.stage].append((index, slot.cols, variables[index].dtype))
            self.stage_slots = StageSlots(self.rule.slot_names, pieces)
            return
        for group in self.groups:
            for slot in group.packing.slots:
                index = group.indices[slot.index]
                self.slots[index] = [
                    tf.Variable(
                        tf.zeros([slot.cols], variables[index].dtype),
                        trainable=False,
                        name=f"shard_{name}_{index}",
                        synchronization=tf.VariableSynchronization.ON_READ,
                        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
                    )
                    for name in self.rule.slot_names
                ]

    def bytes_sent_per_replica(self) -> float:
        """Mean bytes one replica sends per step (counted when the step was traced)."""
        if not self.traffic:
            return 0.0
        return sum(t.total for t in self.traffic.values()) / len(self.traffic)

    def slot_bytes_per_replica(self) -> int:
        """Bytes of optimizer slots one replica holds for the sharded update."""
        if self.stage_slots is not None:
            return self.stage_slots.bytes_per_replica()
        return sum(
            int(s.shape.num_elements()) * s.dtype.size for group in self.slots for s in group
        )

    def _group_mesh(self, axes: tuple[str, ...]) -> Mesh:
        """The R x C view of a sum group over `axes`: the run's (`--mesh`) when it has the
        group's size, else the default one of that size."""
        size = 1
        for axis in axes:
            size *= getattr(self.device_mesh, axis)
        if size == self.mesh.size:
            return self.mesh
        workers = self.workers if size % self.workers == 0 else 1
        return default_mesh(size, num_workers=workers)

    def _replica_collectives(self, traffic: Traffic | None = None) -> Collectives:
        """This replica's collectives (replica context). `traffic`: where to count the bytes
        sent; None: the step's collectives, the replica's shared `replica_collectives()` (the
        MoE layers' ordering token), counted in `self.traffic`."""
        replica = static_replica_id(tf.distribute.get_replica_context())
        if replica is None:
            raise ValueError("GradientSummer needs a static replica id (MirroredStrategy-like)")
        if traffic is None:
            ops = replica_collectives(
                num_replicas=self.device_mesh.size, timeout_s=self.settings.timeout_s
            )
            self.traffic[replica] = ops.traffic
            return ops
        return Collectives(
            replica=replica,
            num_replicas=self.device_mesh.size,
            timeout_s=self.settings.timeout_s,
            traffic=traffic,
        )

    def _algorithm(self, ops: Collectives, group: SumGroup):
        """The algorithm over `group`'s replicas that include `ops.replica` (by position)."""
        members = self.device_mesh.group(ops.replica, *group.axes)
        view = ops if len(members) == self.device_mesh.size else GroupView(ops, members)
        algorithm = ALGORITHM_CLASSES[self.algorithm](group.mesh, view)
        return _WholeView(algorithm, group.mesh.size) if group.whole else algorithm

    @staticmethod
    def _row_gradients(optimizer, grads, variables) -> frozenset[int]:
        """The gradients summed as rows: sparse ones (`IndexedSlices`, an embedding lookup's)
        of variables the optimizer updates row by row (it declares `is_sparse`, as row-wise
        Adagrad does). Others are made dense: their optimizers update every row anyway."""
        takes_rows = getattr(optimizer, "is_sparse", None)
        if takes_rows is None:
            return frozenset()
        return frozenset(
            i for i, (g, v) in enumerate(zip(grads, variables, strict=True))
            if isinstance(g, tf.IndexedSlices) and takes_rows(v)
        )  # fmt: skip

    def _sum(self, ops: Collectives, grads, rows: frozenset[int] = frozenset()) -> list:
        """Each gradient summed over its sum group (replica context), packed as planned; those
        in `rows` (`IndexedSlices`) as rows (`rows.all_gather_rows`), never made dense."""
        grads = [g if i in rows else tf.convert_to_tensor(g) for i, g in enumerate(grads)]
        summed = list(grads)
        groups = self.groups or [  # not built: one group of every variable on `self.packing`
            SumGroup(REPLICATED.sum_axes(self.device_mesh), tuple(range(len(grads))),
                     self.packing, self.mesh)
        ]  # fmt: skip
        for group in groups:
            if group.mesh.size == 1:  # a group of this replica alone
                continue
            algorithm = self._algorithm(ops, group)
            prefix = "grad" if len(groups) == 1 else f"grad[{','.join(group.axes)}]"
            dense = [i for i in group.indices if i not in rows]
            packing = group.packing
            if len(dense) < len(group.indices):  # the dense ones packed without the rows
                packing = Packing(
                    [grads[i].shape for i in dense], [grads[i].dtype for i in dense],
                    num_shards=group.mesh.size, pack_mb=self.settings.pack_mb,
                )  # fmt: skip
            if dense:
                buckets = packing.pack([grads[i] for i in dense])
                reduced = [algorithm.all_reduce(b, f"{prefix}{i}") for i, b in enumerate(buckets)]
                for i, g in zip(dense, packing.unpack(reduced), strict=True):
                    summed[i] = g
            for i in sorted(rows.intersection(group.indices)):
                summed[i] = all_gather_rows(algorithm.ops, algorithm.everyone, grads[i],
                                            f"{prefix}rows{i}")  # fmt: skip
        return summed

    def _split_axes(self, index: int) -> tuple[str, ...] | None:
        """The mesh axes variable `index` is split over (None: replicated, or one shard)."""
        layout = self.layouts[index] if self.layouts else None
        if layout is None or not layout.split or layout.num_shards(self.device_mesh) == 1:
            return None
        return layout.split_over

    def _whole_squares(self, ops, squares, name: str):
        """Per-variable sums of squares ([k] each, or None) -> sums over the whole tensors:
        the split variables' are all-reduced over their shard groups (one all-reduce per
        split, of a stacked table, in the order of the split axes: the same on every
        replica), the replicated ones are already whole."""
        by_axes: dict[tuple[str, ...], list[int]] = {}
        for i, sq in enumerate(squares):
            axes = None if sq is None else self._split_axes(i)
            if axes is not None:
                by_axes.setdefault(axes, []).append(i)
        out = list(squares)
        for g, (axes, indices) in enumerate(sorted(by_axes.items())):
            members = self.device_mesh.group(ops.replica, *axes)
            table = ops.all_reduce(tf.stack([squares[i] for i in indices]), members, f"{name}{g}")
            for row, i in enumerate(indices):
                out[i] = table[row]
        return out

    def _global_norm(self, ops, grads):
        """The global L2 norm of the whole (summed) gradients (replica context)."""
        squares = [tf.reshape(tf.reduce_sum(tf.square(tf.cast(_values(g), tf.float32))), [1])
                   for g in grads]  # fmt: skip
        return tf.sqrt(tf.add_n(self._whole_squares(ops, squares, "clip_norm")))[0]

    def _whole_norms(self, ops, optimizer, grads, variables):
        """Per variable, the whole-tensor norms its update needs ([k], or None: the optimizer
        computes them from its own shard, which is the whole tensor when not split)."""
        terms_fn = getattr(optimizer, "whole_norm_terms", None)
        norms = [None] * len(variables)
        if terms_fn is None:
            return norms
        squares = [None] * len(variables)
        for i, (g, v) in enumerate(zip(grads, variables, strict=True)):
            if self._split_axes(i) is None:
                continue
            terms = terms_fn(g, v)
            if terms is not None:
                squares[i] = tf.stack(
                    [tf.reduce_sum(tf.square(tf.cast(t, tf.float32))) for t in terms]
                )
        for i, sq in enumerate(self._whole_squares(ops, squares, "norms")):
            if sq is not None:
                norms[i] = tf.sqrt(sq)
        return norms

    def checkpointable(self) -> ShardedSlots:
        """The sharded slots as one object for `tf.train.Checkpoint` (saved at full size)."""
        return ShardedSlots(self)

    def slot_paths(self) -> dict[str, str]:
        """Per slot, the key the optimizer would save it under (`checkpoints.optimizer_paths`:
        Keras' `add_variable_from_reference` name below the optimizer's, `<variable path with
        "/" as "_">_<slot name>`), mapped to its `full_slots` key."""
        return {
            f"{path.replace('/', '_')}_{name}": self._slot_key(name, i)
            for i, path in enumerate(self.paths)
            for name in self.rule.slot_names
        }

    def optimizer_slots(self) -> dict[str, tf.Module]:
        """The stage-local update's slots as the optimizer's own checkpoint entries, whole
        (`slot_paths`): a run at P > 1 without `--weight_update_sharding` saves its moments
        where the same run at P = 1 saves its optimizer's, so either resumes the other."""
        book = _SlotBook(self)
        return {path: _SlotEntry(book, key) for path, key in self.slot_paths().items()}

    @staticmethod
    def _slot_key(name: str, index: int) -> str:
        return f"{name}_{index}"

    def full_slots(self) -> dict[str, tf.Tensor]:
        """Every slot at its variable's full shape, all-gathered from the replicas' shards
        (cross-replica context; a collective: every worker must call it)."""
        if not self.rule.slot_names:  # SGD without momentum: nothing to save
            return {}
        if self._gather_slots is None:
            self._gather_slots = tf.function(self._gather_slots_fn)
        return self._gather_slots()

    def _gather_slots_fn(self):
        def replica():
            ops = self._replica_collectives(traffic=Traffic())  # not the step's bytes
            full = {}
            stage = self._stage(ops.replica)
            slots = self._slots_of(stage)
            for group in self._groups_of(stage):
                algorithm = self._algorithm(ops, group)
                prefix = self._prefix(group)
                for position, name in enumerate(self.rule.slot_names):
                    parts = [tf.convert_to_tensor(slots[i][position]) for i in group.indices]
                    joined = group.packing.join_shards(parts)
                    gathered = [algorithm.all_gather(s, f"{prefix}slots/{name}{i}")
                                for i, s in enumerate(joined)]  # fmt: skip
                    values = group.packing.unpack(gathered)
                    for i, value in zip(group.indices, values, strict=True):
                        key = self._slot_key(name, i)
                        full[key] = self._whole_slot(ops, i, value, f"slots/whole/{key}")
            if stage is not None:  # the other stages' slots: one all-gather per name and dtype
                for name in self.rule.slot_names:
                    keys = [self._slot_key(name, i) for i in range(len(self.owners))]
                    values = [full.get(key) for key in keys]
                    shapes = [self._whole_shape(i) for i in range(len(keys))]
                    dtypes = [self.dtypes[i] for i in range(len(keys))]
                    owned = {i: v for i, v in enumerate(values) if v is not None}
                    values = exchange(ops, self._stage_members(ops), stage, owned, self.owners,
                                      shapes, dtypes, f"slots/stages/{name}")  # fmt: skip
                    full.update(zip(keys, values, strict=True))
            return full

        # Identical on every replica: the first local copy is the whole value.
        return self.strategy.experimental_local_results(self.strategy.run(replica))[0]

    def _whole_slot(self, ops, index: int, value, name: str):
        """A split variable's slot ([its shard's shape] on this replica) joined over its shard
        group into the whole variable's shape, as its weight is saved (`layout.whole_value`);
        a replicated variable's passes unchanged."""
        axes = self._split_axes(index)
        if axes is None:
            return value
        layout = self.layouts[index]
        members = layout.shard_group(self.device_mesh, ops.replica)
        front = tf.experimental.numpy.moveaxis(value, layout.split_axis, 0)  # [k, ...]
        flat = ops.all_gather(tf.reshape(front, [-1]), members, name)  # shard by shard
        whole = tf.reshape(flat, [len(members) * front.shape[0], *front.shape[1:]])
        return tf.experimental.numpy.moveaxis(whole, 0, layout.split_axis)

    def _whole_shape(self, index: int) -> list[int]:
        """Variable `index`'s whole shape (its shard's, times its shards along the split)."""
        shape = list(self.shapes[index])
        if self._split_axes(index) is not None:
            layout = self.layouts[index]
            shape[layout.split_axis] *= layout.num_shards(self.device_mesh)
        return shape

    def _slot_shard(self, replica: int, index: int, whole):
        """This replica's shard of a slot saved whole (`_whole_slot`'s inverse)."""
        if self._split_axes(index) is None:
            return whole
        layout = self.layouts[index]
        n = layout.num_shards(self.device_mesh)
        shard = layout.shard_index(self.device_mesh, replica)
        return tf.split(whole, n, axis=layout.split_axis)[shard]

    def load_full_slots(self, full: dict[str, tf.Tensor]) -> None:
        """Sets each replica's slot shards from full-size slots (cross-replica context).

        The shards are cut for this run's replica count, mesh, algorithm and packing, which
        need not be those of the run that saved them.
        """

        def replica(full):
            ops = self._replica_collectives(traffic=Traffic())  # runs no collective
            stage = self._stage(ops.replica)
            slots = self._slots_of(stage)
            for group in self._groups_of(stage):
                algorithm = self._algorithm(ops, group)
                for i, slot in zip(group.indices, group.packing.slots, strict=True):
                    for variable, name in zip(slots[i], self.rule.slot_names, strict=True):
                        whole = tf.cast(full[self._slot_key(name, i)], variable.dtype)
                        value = self._slot_shard(ops.replica, i, whole)
                        variable.assign(group.packing.as_rows(value, slot)[algorithm.shard])
            if stage is not None:
                self.stage_slots.commit(stage, slots)

        tf.function(lambda full: self.strategy.run(replica, args=(full,)))(full)

    def sum_gradients(self, grads):
        """Each of `grads` summed over its variable's sum group, packed as planned (replica
        context; no update)."""
        return self._sum(self._replica_collectives(), grads)

    def apply(self, optimizer, grads, variables, *, clip_norm: float | None = None):
        """Sums `grads` over replicas, clips them (global norm), applies `optimizer` (replica context).

        Args:
          optimizer: the run's Keras optimizer (built; with sharding, built without slots).
          grads: this replica's gradients (losses already divided by the global batch).
          variables: the trainable variables, in the order `build` saw them.
          clip_norm: clip the summed gradients to this global norm (None or 0: no clipping).
        """
        context = tf.distribute.get_replica_context()
        if not self.holds_slots:
            ops = self._replica_collectives()
            grads = self._sum(ops, grads, rows=self._row_gradients(optimizer, grads, variables))
            if clip_norm:
                norm = self._global_norm(ops, grads)
                grads, _ = tf.clip_by_global_norm(grads, clip_norm, use_norm=norm)
            # An optimizer's own clip of the summed gradients (row-wise Adagrad's dense-only
            # clip), which Keras' path runs after its sum and `update_step` alone would skip.
            clip_summed = getattr(optimizer, "clip_summed_gradients", None)
            if clip_summed is not None:
                grads = clip_summed(grads, variables)
            norms = self._whole_norms(ops, optimizer, grads, variables)
            context.merge_call(_apply_gradients, args=(optimizer, grads, variables, norms))
            return
        ops = self._replica_collectives()
        n = len(variables)
        g_parts, w_parts = [None] * n, [None] * n
        plans = []  # per sum group: (group, its algorithm, its name prefix)
        stage = self._stage(ops.replica)
        if self.shared:  # read by several stages: each stage's part summed on every stage first
            grads = list(grads)
            for i in self.shared:
                grads[i] = ops.all_reduce(tf.convert_to_tensor(grads[i]),
                                          self._stage_members(ops), f"shared{i}/stages")  # fmt: skip
        for group in self._groups_of(stage):
            algorithm = self._algorithm(ops, group)
            prefix = self._prefix(group)
            plans.append((group, algorithm, prefix))
            buckets = group.packing.pack([tf.convert_to_tensor(grads[i]) for i in group.indices])
            shards = [algorithm.reduce_scatter(b, f"{prefix}grad{i}")
                      for i, b in enumerate(buckets)]  # fmt: skip
            for i, g in zip(group.indices, group.packing.split_shards(shards), strict=True):
                g_parts[i] = g
            for i, slot in zip(group.indices, group.packing.slots, strict=True):
                w = _tf_variable(variables[i]).read_value()
                w_parts[i] = group.packing.as_rows(w, slot)[algorithm.shard]
        if clip_norm:
            squares = [None if g is None else
                       tf.reshape(tf.reduce_sum(tf.square(tf.cast(g, tf.float32))), [1])
                       for g in g_parts]  # fmt: skip
            squares = self._sharded_whole_squares(ops, squares, "clip_norm")
            square = tf.add_n([
                self._over_group(plan, tf.add_n([squares[i] for i in plan[0].indices]),
                                 "clip_norm")
                for plan in plans if plan[0].indices
            ] or [tf.zeros([1])])  # fmt: skip
            if stage is not None:  # the other stages' squares: one scalar all-reduce
                square = ops.all_reduce(square, self._stage_members(ops), "clip_norm/stages")
            norm = tf.sqrt(square[0])
            scale = clip_norm / tf.maximum(norm, clip_norm)
            g_parts = [None if g is None else g * tf.cast(scale, g.dtype) for g in g_parts]
        slots = self._slots_of(stage)
        new_parts = self._sharded_update(optimizer, ops, plans, w_parts, g_parts, slots)
        values = [None] * n
        for group, algorithm, prefix in plans:
            joined = group.packing.join_shards([new_parts[i] for i in group.indices])
            gathered = [algorithm.all_gather(s, f"{prefix}weights{i}")
                        for i, s in enumerate(joined)]  # fmt: skip
            for i, value in zip(group.indices, group.packing.unpack(gathered), strict=True):
                values[i] = value
        if stage is not None:  # this stage's slots back into its buffers; the others' weights
            self.stage_slots.commit(stage, slots)
            values = self._from_stages(ops, stage, values, variables, "weights/stages")
        context.merge_call(_assign_weights, args=(optimizer, values, variables))

    # ---- a stage-sharded update (`build(stages=...)`, `stages.py`) -------------------------------
    def _stage(self, replica: int) -> int | None:
        """`replica`'s pipeline stage under a stage-sharded update, else None."""
        return None if self.owners is None else self.device_mesh.index(replica, "pipeline")

    def _groups_of(self, stage: int | None) -> list[SumGroup]:
        """The sum groups a replica of `stage` sums and updates (all without a stage map)."""
        return [g for g in self.groups if stage is None or g.stage == stage]

    def _stage_members(self, ops) -> list[int]:
        return self.device_mesh.group(ops.replica, "pipeline")

    def _slots_of(self, stage: int | None):
        """Per variable index, its slot pieces on this replica (replica context)."""
        if stage is None:
            return self.slots
        return self.stage_slots.pieces(stage)

    def _from_stages(self, ops, stage: int, owned_values, variables, name: str):
        """Every variable's tensor from its owner stage (`stages.exchange`)."""
        owned = {i: owned_values[i] for i, s in enumerate(self.owners) if s == stage}
        return exchange(
            ops, self._stage_members(ops), stage, owned, self.owners,
            [v.shape for v in variables], [v.dtype for v in variables], name,
        )  # fmt: skip

    def _prefix(self, group: SumGroup) -> str:
        """The collectives' name prefix of a sum group ("" when there is one group)."""
        return "" if len(self.groups) == 1 else f"[{','.join(group.axes)}]"

    @staticmethod
    def _over_group(plan, x, name: str):
        """`x` summed over the members of `plan`'s sum group (which hold the other pieces);
        `x` itself when each member holds the whole variables (`SumGroup.whole`)."""
        group, algorithm, prefix = plan
        if group.whole:
            return x
        return algorithm.ops.all_reduce(x, list(range(group.mesh.size)), prefix + name)

    def _sharded_whole_squares(self, ops, squares, name):
        """`_whole_squares` for weight-update pieces: a split variable's piece-of-a-shard
        squares are summed over its shard group here, and over its sum group by the caller."""
        return self._whole_squares(ops, squares, name + "/model")

    def _sharded_update(self, optimizer, ops, plans, w_parts, g_parts, slots):
        """The optimizer's rule on every piece this replica holds (`slots`: per variable index,
        its slot pieces): phase 1, the whole norms its terms need (summed over the split axes,
        then one [terms, 2] all-reduce per sum group), phase 2."""
        step = optimizer.iterations + 1
        states, partials = [], []
        for i, (w, g) in enumerate(zip(w_parts, g_parts, strict=True)):
            if w is None:  # another stage's variable
                states.append(None)
                partials.append(None)
                continue
            g = tf.cast(g, w.dtype)
            state, terms = self.rule.direction(i, w, g, slots[i], step)
            states.append(state)
            partials.append(
                None
                if terms is None
                else tf.stack([tf.reduce_sum(tf.square(tf.cast(t, tf.float32))) for t in terms])
            )
        partials = self._sharded_whole_squares(ops, partials, "norms")
        norms = [None] * len(w_parts)
        for plan in plans:
            needed = [i for i in plan[0].indices if partials[i] is not None]
            if not needed:
                continue
            # One small all-reduce per sum group: [tensors adapted, terms] sums of squares.
            table = tf.sqrt(self._over_group(plan, tf.stack([partials[i] for i in needed]),
                                             "norms"))  # fmt: skip
            for row, i in enumerate(needed):
                norms[i] = table[row]
        lr = optimizer.learning_rate
        new_parts = []
        for i, (w, state) in enumerate(zip(w_parts, states, strict=True)):
            if w is None:
                new_parts.append(None)
                continue
            norm = None if norms[i] is None else tf.cast(norms[i], w.dtype)
            new_parts.append(self.rule.finish(i, state, w, slots[i], tf.cast(lr, w.dtype), norm))
        return new_parts


class ShardedSlots(tf.Module):
    """A `GradientSummer`'s sharded optimizer slots in a `tf.train.Checkpoint`, at full size.

    Why not checkpoint the slot variables themselves: each is a sync-on-read variable holding a
    different [k] shard on each replica, and a checkpoint of one keeps a single copy (the first
    replica's), so a resumed run would restart its slots wrong. Here a save all-gathers the
    shards (the weights' path) and writes each slot in its variable's shape; a restore gives each
    replica its shard of that. A resumed run then continues exactly, and the checkpoint does not
    depend on the replica count, mesh, algorithm or pack size. Every worker must take part in a
    save (the gather is a collective), as every worker already must for mirrored variables.

    The hooks are `tf.train.Checkpoint`'s own for objects that serialize themselves
    (`_serialize_to_tensors` / `_restore_from_tensors`, as Keras 3's TF variables override them).
    Holding full-size copies in variables instead would keep the memory that sharding saves.
    """

    def __init__(self, summer: GradientSummer):
        super().__init__(name="sharded_slots")
        self._summer = summer  # a plain object: not tracked, so the shards are not saved as such

    def _serialize_to_tensors(self):
        return self._summer.full_slots()

    def _restore_from_tensors(self, restored_tensors):
        self._summer.load_full_slots(dict(restored_tensors))


class _SlotBook:
    """The whole slots of one save, gathered once for all its `_SlotEntry`s; and a restore's,
    given to the summer once every entry has its tensor."""

    def __init__(self, summer: GradientSummer):
        self.summer = summer
        self.full: dict[str, tf.Tensor] | None = None
        self.served: set[str] = set()  # the keys the gathered `full` has handed out
        self.restored: dict[str, tf.Tensor] = {}

    def value(self, key: str) -> tf.Tensor:
        # A save asks each entry once: a key asked again is the next save's (the slots may
        # have moved since), so the slots are gathered again.
        if self.full is None or key in self.served:
            self.full, self.served = self.summer.full_slots(), set()
        self.served.add(key)
        return self.full[key]

    def receive(self, key: str, value) -> None:
        self.restored[key] = value
        if len(self.restored) == len(self.summer.slot_paths()):
            self.summer.load_full_slots(self.restored)
            self.restored, self.full = {}, None


class _SlotEntry(tf.Module):
    """One whole slot in a checkpoint under the key of the optimizer's own slot variable
    (`GradientSummer.optimizer_slots`): saved and restored as a variable's value, so the
    checkpoint is the one an optimizer holding its slots writes."""

    def __init__(self, book: _SlotBook, key: str):
        super().__init__(name=None)
        self._book = book  # plain objects: not tracked
        self._key = key

    def _serialize_to_tensors(self):
        return {"VARIABLE_VALUE": self._book.value(self._key)}

    def _restore_from_tensors(self, restored_tensors):
        self._book.receive(self._key, restored_tensors["VARIABLE_VALUE"])


def _values(g):
    """A gradient's stored values: a sparse one's rows (distinct after a sum as rows, so their
    squares are the dense gradient's), a dense one itself."""
    return g.values if isinstance(g, tf.IndexedSlices) else g


def _apply_gradients(strategy, optimizer, grads, variables, norms):
    # Cross-replica context, as in Keras' own update after its sum: each replica's copy of a
    # variable is updated with that replica's summed gradient by `update_step` (identical on
    # every replica, except for split variables, whose components are different shards).
    # `norms`: per variable None, or the whole-tensor norms its update needs (per replica).
    learning_rate = optimizer.learning_rate
    for grad, variable, norm in zip(grads, variables, norms, strict=True):
        if norm is None:
            strategy.extended.update(
                _tf_variable(variable),
                lambda var, g: optimizer.update_step(g, var, learning_rate),
                args=(grad,),
                group=False,
            )
        else:
            strategy.extended.update(
                _tf_variable(variable),
                lambda var, g, n: optimizer.update_step_with_norms(g, var, learning_rate, n),
                args=(grad, norm),
                group=False,
            )
    optimizer.iterations.assign_add(1)


def _assign_weights(strategy, optimizer, values, variables):
    for variable, value in zip(variables, values, strict=True):
        strategy.extended.update(
            _tf_variable(variable), lambda var, x: var.assign(x), args=(value,), group=False
        )
    optimizer.iterations.assign_add(1)


METADATA_FILE = "gradient_summation.json"


def record_choices(summer: GradientSummer, model_dir: str, *, chief: bool) -> None:
    """Logs the run's gradient-summation choices and, on the chief, writes them next to the
    MLPerf log as the suite's own metadata (`<model_dir>/gradient_summation.json`): MLPerf has
    no keys for them, and none are invented in `:::MLLOG` lines."""
    metadata = summer.metadata()
    logging.info("gradient summation: %s", metadata)
    if chief:
        with open(os.path.join(model_dir, METADATA_FILE), "w", encoding="utf-8") as f:
            json.dump(metadata, f, indent=1)
