"""Provides `AxisGroup`: this replica's group along some axes of the run's mesh, and the collectives the layers issue on it.

Megatron-core's `parallel_state` gives each layer its process group by name ("my tensor-parallel
group"); this is that idea on the suite's one `DeviceMesh`. Every layer that splits work asks the
same question: which replicas differ from me only along these axes, what is my rank among them,
and what do I exchange with them. The answer is one type, used by the tensor-parallel layers
(`model`), the spatial layers (`spatial`), the mixture-of-experts layer (`expert`) and batch norm
(the replicas sharing a batch, widened over a block of batch shards).

All its collectives are those of the replica context (`ops.replica_collectives`), so they share:

* one ordering token per replica: every collective of a step (tensor-parallel all-reduces, halo
  exchanges, MoE all-to-alls, batch-norm sums, the gradient sum) runs in program order, the same
  on every replica, so no two replicas wait on each other crosswise;
* one timeout: the largest asked for in that replica context (the run's `--collective_timeout`,
  which the runner asks for first; a layer's own `timeout_s` can only raise it);
* one naming scheme: instance names `{axes}/{owner path}/{what}/{k}`, k counting the calls with
  that prefix in the replica context (`Collectives.unique_name`): the same on every replica,
  which each trace their calls in the same order, and new in every call, so a layer called twice
  in one step (micro-batches, a decoding loop) issues two instances.

It lives in `collectives/` (not `parallel/`) because it issues collectives: `collectives` already
reads the mesh (`parallel.mesh`, TensorFlow-free), and `parallel` stays free of collectives.

Collectives need replica ids known at trace time (MirroredStrategy, MultiWorkerMirroredStrategy,
inside a `tf.function`); a group of one member issues none and every operation is the identity.
"""

from __future__ import annotations

import itertools

import tensorflow as tf

from mlperf_tf.collectives.ops import Collectives, replica_collectives, static_replica_id
from mlperf_tf.parallel.context import resolve
from mlperf_tf.parallel.mesh import AXES, BATCH_AXES, DeviceMesh


def _check_axes(axes) -> tuple[str, ...]:
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    for axis in axes:
        if axis not in AXES:
            raise ValueError(f"unknown mesh axis '{axis}' (axes: {', '.join(AXES)})")
    return axes


def group_members(
    mesh: DeviceMesh, replica: int, axes: tuple[str, ...], batch_shards: int = 1
) -> list[int]:
    """The replicas that differ from `replica` only along `axes` (and, with `batch_shards` > 1,
    within its block of `batch_shards` consecutive batch shards), in id order: rank order.

    Raises:
      ValueError: `batch_shards` does not divide the mesh's batch shards.
    """
    if batch_shards == 1:
        return mesh.group(replica, *axes)
    if mesh.batch_shards % batch_shards:
        raise ValueError(
            f"a block of {batch_shards} batch shards must divide the mesh's "
            f"{mesh.batch_shards} ({mesh})"
        )
    block = mesh.batch_shard(replica) // batch_shards
    return [
        r
        for r in mesh.group(replica, *axes, *BATCH_AXES)
        if mesh.batch_shard(r) // batch_shards == block
    ]


class AxisGroup:
    """This replica's group along `axes` of the mesh, with the collectives the layers need.

    Made once per layer (at construction, before any replica context); the replica, its rank and
    the members are read at call time, in replica context.

    Args:
      axes: a mesh axis name or a tuple of them (`mlperf_tf.parallel.mesh.AXES`); () with
        `batch_shards` for a block of batch shards only.
      owner: the layer that issues the collectives (its `path`, read at call time, names them),
        or a string unique in the model.
      mesh: the run's mesh (None: the ambient one, `mlperf_tf.parallel.current_mesh()`; no split
        outside a run).
      batch_shards: also span this many consecutive batch shards (data x expert index): batch
        norm's group of `batch_shards` batches and every replica that shares them.
      timeout_s: the least timeout of its collectives in seconds (0: the replica context's).
    """

    def __init__(
        self, axes, *, owner, mesh: DeviceMesh | None = None, batch_shards: int = 1,
        timeout_s: float = 0.0,
    ):  # fmt: skip
        self.axes = _check_axes(axes)
        if isinstance(batch_shards, bool) or not isinstance(batch_shards, int) or batch_shards < 1:
            raise ValueError(f"`batch_shards` ({batch_shards!r}) must be a positive integer")
        self.mesh = resolve(mesh)
        self.owner = owner
        self.batch_shards = batch_shards
        self.timeout_s = float(timeout_s)
        if self.mesh is None:
            self.size = 1
        else:
            self.size = len(group_members(self.mesh, 0, self.axes, batch_shards))

    def __repr__(self) -> str:
        return f"AxisGroup({'+'.join(self.axes) or '-'}, size={self.size}, mesh={self.mesh})"

    # ---- where this replica is -----------------------------------------------------------------
    def _owner_name(self) -> str:
        if isinstance(self.owner, str):
            return self.owner
        return getattr(self.owner, "path", None) or getattr(self.owner, "name", str(self.owner))

    def replica(self) -> int:
        """This replica's id in sync (replica context, known at trace time).

        Raises:
          ValueError: no replica context with a static replica id, or one of another mesh size.
        """
        context = tf.distribute.get_replica_context() if tf.distribute.has_strategy() else None
        replica = None if context is None else static_replica_id(context)
        if replica is None:
            raise ValueError(
                f"'{self._owner_name()}' splits work over the mesh's "
                f"{'+'.join(self.axes) or 'batch'} axis: it runs in replica context with a "
                "static replica id (inside strategy.run of MirroredStrategy or "
                "MultiWorkerMirroredStrategy)"
            )
        if self.mesh is not None and context.num_replicas_in_sync != self.mesh.size:
            raise ValueError(
                f"'{self._owner_name()}' was built for {self.mesh} ({self.mesh.size} replicas) "
                f"but runs on {context.num_replicas_in_sync}"
            )
        return replica

    def members(self, replica: int | None = None) -> list[int]:
        """The group of `replica` (default: this replica), in rank order."""
        if self.mesh is None:
            return [0 if replica is None else replica]
        replica = self.replica() if replica is None else replica
        return group_members(self.mesh, replica, self.axes, self.batch_shards)

    def rank(self, replica: int | None = None) -> int:
        """The position of `replica` (default: this replica) in its group; 0 in a group of one
        (which needs no replica context)."""
        if self.size == 1:
            return 0
        replica = self.replica() if replica is None else replica
        return self.members(replica).index(replica)

    def index(self) -> int:
        """This replica's rank (for one axis: its index along it, e.g. its `model` shard)."""
        return self.rank()

    def _ops(self) -> tuple[Collectives, list[int]]:
        replica = self.replica()
        ops = replica_collectives(num_replicas=self.mesh.size, timeout_s=self.timeout_s)
        return ops, group_members(self.mesh, replica, self.axes, self.batch_shards)

    def _name(self, ops: Collectives, what: str) -> str:
        return ops.unique_name(f"{'+'.join(self.axes) or 'batch'}/{self._owner_name()}/{what}")

    # ---- collectives ---------------------------------------------------------------------------
    def all_reduce(self, x, what: str = "sum"):
        """Sum of `x` over the group (no gradient of its own: forward-only uses)."""
        if self.size == 1:
            return x
        ops, members = self._ops()
        return ops.all_reduce(x, members, self._name(ops, what))

    def sum(self, x, what: str = "sum"):
        """Sum of `x` over the group; its gradient is the sum of the upstream gradient over the
        group (batch norm's statistics, global pooling over tiles). One all-reduce forward, one
        backward."""
        if self.size == 1:
            return x
        ops, members = self._ops()
        return ops.differentiable_all_reduce(x, members, self._name(ops, what))

    def copy(self, x):
        """Megatron's f: identity forward; backward, the all-reduce of the gradient over the
        group (before a column-parallel block)."""
        return self._one_way(x, "copy", reduce_forward=False)

    def reduce(self, x):
        """Megatron's g: all-reduce (sum) over the group forward; identity backward (after a
        row-parallel projection)."""
        return self._one_way(x, "reduce", reduce_forward=True)

    def _one_way(self, x, what: str, *, reduce_forward: bool):
        """Megatron's f and g, which are conjugate: one all-reduce over the group in one direction
        of autodiff (forward when `reduce_forward`, else backward, named `<what>/bwd`) and the
        identity in the other."""
        if self.size == 1:
            return x
        ops, members = self._ops()
        name = self._name(ops, what)

        @tf.custom_gradient
        def one_way(t):
            if reduce_forward:
                return ops.all_reduce(t, members, name), tf.identity

            def grad(upstream):
                return ops.all_reduce(upstream, members, name + "/bwd")

            return tf.identity(t), grad

        return one_way(x)

    def max(self, x):
        """Element-wise maximum over the group (no gradient: for numerical shifts only).

        An all-reduce of each member's value placed in its own row of an [n, ...] zero tensor,
        then a local max: n times `x`'s bytes, and shapes may be dynamic.
        """
        x = tf.stop_gradient(x)
        if self.size == 1:
            return x
        ops, members = self._ops()
        rows = tf.one_hot(members.index(ops.replica), self.size, dtype=x.dtype)
        table = rows[(...,) + (None,) * x.shape.rank] * x[None]
        return tf.reduce_max(ops.all_reduce(table, members, self._name(ops, "max")), 0)

    def gather_last(self, x):
        """The members' [..., n] tensors concatenated along the last axis in rank order:
        [..., size n] (forward only; e.g. beam search's full-vocabulary logits). One all-reduce
        of the zero-padded [..., size n] tensor: shapes may be dynamic."""
        if self.size == 1:
            return x
        ops, members = self._ops()
        index = members.index(ops.replica)
        width = x.shape[-1]
        placed = tf.pad(
            x, [[0, 0]] * (x.shape.rank - 1) + [[index * width, (self.size - 1 - index) * width]]
        )
        return ops.all_reduce(placed, members, self._name(ops, "gather"))

    def all_gather(self, x, what: str = "all_gather"):
        """`x` ([k, ...]) of every member stacked in rank order: [size k, ...]. Forward only
        (e.g. the experts gathered whole for evaluation)."""
        if self.size == 1:
            return x
        ops, members = self._ops()
        flat = ops.all_gather(tf.reshape(x, [-1]), members, self._name(ops, what))
        return _stacked(flat, x)

    def gather(self, x, what: str = "gather"):
        """`all_gather` with its gradient: the adjoint of every member holding the whole
        [size k, ...] tensor, i.e. the all-reduce of the upstream gradient over the group, then
        this member's k rows. One all-gather forward, one all-reduce backward."""
        if self.size == 1:
            return x
        ops, members = self._ops()
        name = self._name(ops, what)
        rank = members.index(ops.replica)
        backward_calls = itertools.count()

        @tf.custom_gradient
        def gathered(t):
            whole = _stacked(ops.all_gather(tf.reshape(t, [-1]), members, name), t)
            k = t.shape[0] if t.shape[0] is not None else tf.shape(t)[0]

            def grad(upstream):
                summed = ops.all_reduce(upstream, members, f"{name}/grad{next(backward_calls)}")
                return summed[rank * k : (rank + 1) * k]

            return whole, grad

        return gathered(x)

    def all_to_all(self, x, what: str = "all_to_all"):
        """Row `j` of `x` ([size, ...]) goes to the member of rank `j`; returns [size, ...]
        whose row `i` came from the member of rank `i`. Its gradient is the same exchange of
        the upstream gradient (the expert dispatch and combine of MoE layers)."""
        if self.size == 1:
            return x
        ops, members = self._ops()
        return ops.differentiable_all_to_all(x, members, self._name(ops, what))

    # ---- spatial tiles -------------------------------------------------------------------------
    def tile(self, replica: int | None = None) -> tuple[int, int]:
        """(tile row i < K, tile column j < L) of `replica` (default: this one) in a group over
        the `spatial` axis (`--spatial_partition=KxL`, tiles row-major)."""
        if self.axes != ("spatial",) or self.batch_shards != 1:
            raise ValueError(f"tiles are a group over the spatial axis, not {self}")
        if self.size == 1:
            return (0, 0)
        return divmod(self.rank(replica), self.mesh.spatial_cols)

    def halo(self, x, *, top: int, bottom: int, edge_value: float = 0.0, axis: int = 1):
        """The `top` rows above and `bottom` rows below this replica's tile `x` ([b, h, w, c]);
        with `axis=2` the `top` columns left and `bottom` columns right of it.

        One all-to-all forward over the tile column (`axis=1`: the K members above and below)
        or the tile row (`axis=2`: the L members left and right): this tile's first `bottom`
        rows to the neighbour above, its last `top` rows to the one below. One backward: the
        gradients of the received rows back to their owners, added to their tiles' rows. At the
        image's edges the rows are `edge_value` (the op's padding: 0, or -inf for max pooling).

        Returns:
          (above [b, top, w, c], below [b, bottom, w, c]); for `axis=2`, (left [b, h, top, c],
          right [b, h, bottom, c]).
        """
        if axis not in (1, 2):
            raise ValueError(f"halo exchange along axis {axis}: 1 (rows) or 2 (columns)")
        i, j = self.tile()
        ops, members = self._ops()
        cols = self.mesh.spatial_cols
        if axis == 2:  # columns are rows of the transposed tile
            swap = [0, 2, 1, 3]
            line = members[i * cols : (i + 1) * cols]
            left, right = _exchange(
                tf.transpose(x, swap), ops, line, j, self._name(ops, "halo_cols"),
                top=top, bottom=bottom, edge_value=edge_value,
            )  # fmt: skip
            return tf.transpose(left, swap), tf.transpose(right, swap)
        line = members[j::cols]
        return _exchange(
            x, ops, line, i, self._name(ops, "halo"), top=top, bottom=bottom, edge_value=edge_value
        )


def _stacked(flat, like):
    """The flat all-gather of the members' `like`-shaped tensors as [members x k, ...]."""
    if like.shape[1:].is_fully_defined():
        return tf.reshape(flat, [-1, *like.shape[1:]])
    return tf.reshape(flat, tf.concat([[-1], tf.shape(like)[1:]], 0))


def _exchange(x, ops: Collectives, members, rank, name, *, top, bottom, edge_value):
    """`AxisGroup.halo` along axis 1 among `members` (neighbours in rank order; this replica is
    `members[rank]`), collective instances named `name`, `name_grad0`, ..."""
    n, h = len(members), x.shape[1]
    if max(top, bottom) > h:
        raise ValueError(f"halo rows {top}/{bottom} exceed the slab's {h} rows")
    rows = max(top, bottom)
    backward_calls = itertools.count()

    def edge(count, like):
        shape = tf.concat([tf.shape(like)[:1], [count], tf.shape(like)[2:]], 0)
        return tf.fill(shape, tf.constant(edge_value, like.dtype))

    def to_neighbours(for_above, for_below, like):
        """[n, b, rows, w, c]: row rank-1 carries `for_above`, row rank+1 `for_below`."""
        zeros = tf.zeros_like(like[:, :0])  # [b, 0, w, c]

        def padded(t):
            return tf.concat([t, tf.zeros_like(like[:, : rows - t.shape[1]])], 1)

        chunks = [padded(zeros)] * n
        if rank > 0:
            chunks[rank - 1] = padded(for_above)
        if rank < n - 1:
            chunks[rank + 1] = padded(for_below)
        return tf.stack(chunks)

    @tf.custom_gradient
    def exchanged(slab):
        received = ops.all_to_all(
            to_neighbours(slab[:, :bottom], slab[:, h - top :], slab), members, name
        )  # row i came from rank i
        above = received[rank - 1][:, :top] if rank > 0 else edge(top, slab)
        below = received[rank + 1][:, :bottom] if rank < n - 1 else edge(bottom, slab)

        def grad(d_above, d_below):
            # d_above belongs to the last `top` rows of the member above; d_below to the first
            # `bottom` rows of the member below.
            returned = ops.all_to_all(
                to_neighbours(d_above, d_below, slab),
                members,
                f"{name}_grad{next(backward_calls)}",
            )
            d_slab = tf.zeros_like(slab)
            if rank > 0:  # the member above sent the gradient of my first `bottom` rows
                first = returned[rank - 1][:, :bottom]
                d_slab += tf.concat([first, tf.zeros_like(slab[:, bottom:])], 1)
            if rank < n - 1:  # the member below: of my last `top` rows
                last = returned[rank + 1][:, :top]
                d_slab += tf.concat([tf.zeros_like(slab[:, : h - top]), last], 1)
            return d_slab

        return (above, below), grad

    return exchanged(x)


def batch_norm_group(mesh: DeviceMesh, group_size: int, *, owner, timeout_s: float = 0.0):
    """The `AxisGroup` of a batch-norm group of `group_size` replicas on `mesh`: the replicas
    that share a batch (`spatial` x `model`: they hold tiles or copies of the same examples),
    over `group_size / (spatial x model)` consecutive batch shards.

    Raises:
      ValueError: `group_size` is not a multiple of the replicas sharing a batch.
    """
    shared = mesh.group_size
    if group_size % shared:
        raise ValueError(
            f"batch-norm `group_size` ({group_size}) of '{getattr(owner, 'name', owner)}' must be a multiple of the "
            f"{shared} replicas that share a batch on {mesh}"
        )
    return AxisGroup(
        ("spatial", "model"), owner=owner, mesh=mesh, batch_shards=group_size // shared,
        timeout_s=timeout_s,
    )  # fmt: skip


__all__ = ["AxisGroup", "batch_norm_group", "group_members"]
