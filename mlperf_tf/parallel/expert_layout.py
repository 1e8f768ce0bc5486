"""Provides variable layouts over the device mesh and `LayoutSummer`, the gradient sum they need.

A `Layout` says how one variable lies on the mesh (DTensor's `Layout`, JAX's `PartitionSpec`):
the mesh axis its first dimension is split over (None: every replica holds all of it), and the
axes its gradient is summed over. Replicas that hold the same part of a variable and read
different batches sum its gradient; replicas that hold different parts must not. So:

| layout | split | gradient summed over |
|---|---|---|
| `REPLICATED` (every variable without one) | none | every replica (Keras' own sum) |
| `EXPERT_LAYOUT` (an expert-parallel MoE layer's expert weights) | `expert` | `data` |

A split variable is an ordinary (mirrored) variable of its *local* shape, whose per-replica
copies hold different parts: the optimizer's update runs per copy with that copy's gradient
(`LayoutSummer`), so they stay different, and so do their optimizer slots. `load_whole` and
`gather_whole` convert between those copies and the whole tensor (single-process strategies:
they read and write the copies directly).

This is the minimal piece MoE needs, written before the tensor-parallel branch's
`mlperf_tf/parallel/layout.py` landed (issue 27). That module's `Layout(split_axis=0,
split_over=("expert",), sum_over=("data",))` is `EXPERT_LAYOUT`, its `GradientSummer` group
view does `LayoutSummer`'s sum, and its whole-tensor checkpoints are what this module lacks: when
both are on one branch, this module folds into that one (the MoE layer needs only `set_layout`
and a layout per expert weight).
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import tensorflow as tf

from mlperf_tf.collectives.ops import Traffic, replica_collectives
from mlperf_tf.collectives.summer import apply_gradients
from mlperf_tf.parallel.mesh import AXES, DeviceMesh


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a variable lies on the mesh.

    Attributes:
      split: the mesh axis the variable's first dimension is split over (None: not split).
      sum_axes: the mesh axes its gradient is summed over.
    """

    split: str | None = None
    sum_axes: tuple[str, ...] = AXES


REPLICATED = Layout()
EXPERT_LAYOUT = Layout(split="expert", sum_axes=("data",))


def set_layout(variable, layout: Layout) -> None:
    """Marks `variable` (a Keras variable) with `layout`."""
    variable.mesh_layout = layout


def layout_of(variable) -> Layout:
    """`variable`'s layout (`REPLICATED` unless one was set)."""
    return getattr(variable, "mesh_layout", REPLICATED)


def has_split(variables) -> bool:
    """Whether any of `variables` is split over a mesh axis."""
    return any(layout_of(v).split is not None for v in variables)


def _tf_variable(variable):
    return variable.value if isinstance(variable, keras.Variable) else variable


def _copies(strategy, variable) -> list:
    """The per-replica copies of `variable`, in replica order (one process)."""
    return list(strategy.experimental_local_results(_tf_variable(variable)))


def _check_local(strategy, mesh: DeviceMesh) -> None:
    if strategy.num_replicas_in_sync != mesh.size or len(strategy.extended.worker_devices) != (
        mesh.size
    ):
        raise NotImplementedError(
            "whole-tensor load/gather of split variables is implemented for one process"
        )


def load_whole(strategy, mesh: DeviceMesh, variable, whole) -> None:
    """Sets every replica's copy of `variable` to its part of `whole` (cross-replica context)."""
    layout = layout_of(variable)
    copies = _copies(strategy, variable)
    if layout.split is None:
        for copy in copies:
            copy.assign(whole)
        return
    _check_local(strategy, mesh)
    parts = getattr(mesh, layout.split)
    pieces = np.split(np.asarray(whole), parts, axis=0)
    for replica, copy in enumerate(copies):
        copy.assign(pieces[mesh.index(replica, layout.split)])


def gather_whole(strategy, mesh: DeviceMesh, variable) -> np.ndarray:
    """The whole value of `variable` (its parts joined in axis order) as a NumPy array."""
    layout = layout_of(variable)
    copies = _copies(strategy, variable)
    if layout.split is None:
        return copies[0].numpy()
    _check_local(strategy, mesh)
    parts = [
        copies[mesh.replica(**{layout.split: i})].numpy()
        for i in range(getattr(mesh, layout.split))
    ]
    return np.concatenate(parts, axis=0)


def initialize_split(strategy, mesh: DeviceMesh, variables, seed: int) -> None:
    """Gives the parts of each split variable different initial values (cross-replica context).

    A mirrored variable starts with one value on every replica, so expert i of every expert
    group would start equal; this draws the whole tensor with the variable's own initializer
    (`variable.mesh_initializer`, a Keras initializer) and hands out its parts.
    """
    for i, variable in enumerate(variables):
        layout = layout_of(variable)
        if layout.split is None:
            continue
        initializer = getattr(variable, "mesh_initializer", None)
        if initializer is None:
            continue
        shape = (variable.shape[0] * getattr(mesh, layout.split), *variable.shape[1:])
        config = initializer.get_config()
        if "seed" in config:
            config["seed"] = seed + i
        whole = type(initializer).from_config(config)(shape, dtype=variable.dtype)
        load_whole(strategy, mesh, variable, keras.ops.convert_to_numpy(whole))


class LayoutSummer:
    """Sums each gradient over its layout's axes and applies the optimizer (replica context).

    Keras' `apply_gradients` sums every gradient over every replica, which would add different
    experts' gradients together. Here each gradient is all-reduced over
    `mesh.group(replica, *layout.sum_axes)` (one `CollectiveReduceV2` per variable), global-norm
    clipping sees whole-tensor norms (a split variable's squares are summed over its split axis),
    and the update runs per replica copy in one `merge_call` (as `GradientSummer`'s does).

    Args:
      mesh: the run's mesh.
      timeout_s: the collectives' timeout (0: none).
    """

    sharded = False  # no weight-update sharding (the runner's warm-up and checkpoints ask)

    def __init__(self, mesh: DeviceMesh, *, timeout_s: float = 0.0):
        self.mesh = mesh
        self.timeout_s = timeout_s
        self.traffic: dict[int, Traffic] = {}

    def apply(self, optimizer, grads, variables, *, clip_norm: float | None = None):
        """Sums `grads` per layout, clips, applies `optimizer` to `variables` (replica context)."""
        ops, replica = self._ops()
        summed = self._sum(ops, replica, grads, variables)
        if clip_norm:
            summed = self._clip(ops, replica, summed, variables, clip_norm)
        context = tf.distribute.get_replica_context()
        context.merge_call(apply_gradients, args=(optimizer, summed, variables))

    def sum(self, grads, variables) -> list[tf.Tensor]:
        """Each of `grads` summed over its variable's layout's axes (replica context)."""
        ops, replica = self._ops()
        return self._sum(ops, replica, grads, variables)

    def _ops(self):
        # The replica's shared collectives: ordered after the MoE layers' all-to-alls.
        ops = replica_collectives(num_replicas=self.mesh.size, timeout_s=self.timeout_s)
        self.traffic[ops.replica] = ops.traffic
        return ops, ops.replica

    def _sum(self, ops, replica, grads, variables):
        summed = []
        for i, (g, v) in enumerate(zip(grads, variables, strict=True)):
            members = self.mesh.group(replica, *layout_of(v).sum_axes)
            summed.append(ops.all_reduce(tf.convert_to_tensor(g), members, f"layout_grad{i}"))
        return summed

    def _clip(self, ops, replica, grads, variables, clip_norm):
        replicated, split = tf.constant(0.0), {}
        for g, v in zip(grads, variables, strict=True):
            square = tf.reduce_sum(tf.square(tf.cast(g, tf.float32)))
            axis = layout_of(v).split
            if axis is None:
                replicated += square
            else:
                split[axis] = split.get(axis, tf.constant(0.0)) + square
        total = replicated
        for axis, square in sorted(split.items()):
            members = self.mesh.group(replica, axis)
            total += ops.all_reduce(tf.reshape(square, [1]), members, f"layout_norm/{axis}")[0]
        norm = tf.sqrt(total)
        scale = clip_norm / tf.maximum(norm, clip_norm)
        return [g * tf.cast(scale, g.dtype) for g in grads]
