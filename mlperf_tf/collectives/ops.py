"""Provides `Collectives`: all-reduce, reduce-scatter, all-gather, all-to-all and broadcast over replica groups.

Runs in replica context on TF's public collective ops (`tf.raw_ops.Collective*V2`), so one
replica can talk to a subset of the replicas (a mesh row or column) under MirroredStrategy and
MultiWorkerMirroredStrategy alike. Three facts of TF 2.20 shape this module:

* A collective op without an `ordering_token` never completes (it times out); each op here gets
  a per-device resource handle as its token, which also orders the collectives of one device in
  program order (the same on every replica, so no two devices wait on each other crosswise).
* `CollectiveReduceScatterV2` has only an NCCL implementation ("did not find collective
  implementation" on CPUs). A true reduce-scatter is built from `CollectiveAllToAllV2` (which
  the CPU runtime has) plus a local sum: each replica sends (n-1)/n of its bytes, as a ring
  reduce-scatter does, where all-reduce-then-slice would send 2(n-1)/n.
* Group and instance keys are process-wide. Keys here are hashes of the group's members and of
  the op's purpose and shape, far above the small keys tf.distribute numbers from 1, so
  strategies built one after another in a process do not collide with them or with each other.

A replica's rank in a group is the position of its replica id among the members' ids: TF ranks
group members by device name (task, then device index), and replica ids follow that order.
"""

from __future__ import annotations

import dataclasses
import itertools
import zlib

import tensorflow as tf

# Keys live in [2**24, 2**30): tf.distribute's own keys start at 1 and count up.
_KEY_BASE = 1 << 24
_KEY_SPAN = (1 << 30) - _KEY_BASE


def _key(*parts) -> int:
    return _KEY_BASE + zlib.crc32(repr(parts).encode()) % _KEY_SPAN


@dataclasses.dataclass
class Traffic:
    """Bytes this replica sends, per kind of collective, counted at trace time (per step)."""

    sent: dict[str, float] = dataclasses.field(default_factory=dict)

    def add(self, kind: str, nbytes: float) -> None:
        self.sent[kind] = self.sent.get(kind, 0.0) + nbytes

    @property
    def total(self) -> float:
        return sum(self.sent.values())


def static_replica_id(context) -> int | None:
    """The replica id of `context` (a `ReplicaContext`) as a Python int, or None where it is
    only known at run time (TPU replicas): the collectives here need it at trace time to pick
    the replica's groups. MirroredStrategy and MultiWorkerMirroredStrategy give a constant."""
    replica = tf.get_static_value(context.replica_id_in_sync_group)
    return None if replica is None else int(replica)


def replica_collectives(*, num_replicas: int, timeout_s: float) -> Collectives:
    """The one `Collectives` of the current replica context (made on first use, then shared).

    Collectives issued by different parts of one step (an MoE layer's all-to-alls, their
    gradients, the gradient sum) must share one ordering token per replica, so that every
    replica runs them in the same program order; with a token each, replicas may start them in
    different orders and wait on each other forever. The object lives on the replica context
    (one per `strategy.run` call per replica). Its timeout is the largest `timeout_s` of its
    callers so far.

    Raises:
      ValueError: no replica context with a static replica id.
    """
    context = tf.distribute.get_replica_context()
    replica = None if context is None else static_replica_id(context)
    if replica is None:
        raise ValueError("collectives run in a replica context with static replica ids")
    ops = getattr(context, "mlperf_tf_collectives", None)
    if ops is None or ops.num_replicas != num_replicas:
        ops = Collectives(
            replica=replica, num_replicas=num_replicas, timeout_s=timeout_s, traffic=Traffic()
        )
        # The token is made now, in the replica step's own graph: a first collective inside a
        # nested function or loop body (`loop_function`) then captures it, where a token made
        # there could not be used outside.
        ops._ordering_token()
        context.mlperf_tf_collectives = ops
    # The first caller makes the object; a later caller's bound is not dropped (an MoE layer
    # built without one must not leave the gradient sum's collectives unbounded, nor the
    # reverse): ops made from here on wait at most the largest timeout asked for.
    ops.timeout_s = max(ops.timeout_s, float(timeout_s))
    return ops


def loop_function(fn):
    """`fn` run as a function call of its own on each replica: for a `tf.while_loop` (a decoding
    loop) that issues collectives in replica context (inside `strategy.run`).

    Under MirroredStrategy every replica's ops are traced into one graph, so each replica's loop
    is its own `While` op, named `while` on replica 0 and `replica_1/while` on replica 1. TF
    lowers a loop to a control-flow frame named after its op and keys each execution of a
    collective by (group, instance, frame id, iteration): the frame ids differ, so the replicas'
    all-reduces in a loop never meet (measured: a 2-replica all-reduce inside a loop times out).
    Automatic control dependencies also chain stateful ops that take no resource input, so the
    second replica's loop would wait for the first one's to end. Here `fn` becomes a function of
    its own, never inlined into the step (`_noinline`), in which the loop's op has the same name
    on every replica and runs in a frame of the same id; the call takes a resource of the
    replica as an input, so the replicas' calls are not chained. Each call of `loop_function`
    traces `fn` anew (for the calling replica: its replica id and variables). The loop must still
    run the same number of iterations on every member of a collective (e.g. a stop condition on
    values that are the same on all of them).

    Args:
      fn: a function of tensors (nests allowed) run in replica context.

    Returns:
      A function with `fn`'s arguments and results.
    """
    anchor = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[], shared_name="mlperf_tf_loop")
    device = anchor.device

    def call(anchor, args, kwargs):
        del anchor
        with tf.device(device):
            return fn(*args, **kwargs)

    # `experimental_attributes` is tf.function's public way to set the function's attributes.
    own = tf.function(call, autograph=False, experimental_attributes={"_noinline": True})
    return lambda *args, **kwargs: own(anchor, args, kwargs)


class Collectives:
    """Collectives of one replica (replica context), over groups given as lists of replica ids.

    Args:
      replica: this replica's id in sync (a Python int).
      num_replicas: replicas in sync.
      timeout_s: every collective fails with DeadlineExceededError after this many seconds
        instead of waiting forever for a peer (0: no limit; see the README on threads).
      traffic: where the bytes this replica sends are counted (ring formulas per op).
    """

    def __init__(self, *, replica: int, num_replicas: int, timeout_s: float, traffic: Traffic):
        self.replica = replica
        self.num_replicas = num_replicas
        self.timeout_s = float(timeout_s)
        self.traffic = traffic
        self._token = None
        self._names: dict[str, int] = {}

    def unique_name(self, prefix: str) -> str:
        """`prefix/k`, k counting this object's calls with `prefix`: an instance name that is
        the same on every replica when each replica issues its collectives in the same order
        (a counter shared by the replicas' threads would differ between them)."""
        k = self._names.get(prefix, 0)
        self._names[prefix] = k + 1
        return f"{prefix}/{k}"

    def _ordering_token(self):
        """One resource handle per replica trace, on the replica's device: TF's collectives
        need one, and auto control dependencies run the ops that share it one at a time in
        program order. (A new handle per op would not order them: with pack_mb=0 ResNet-50's
        ~800 collectives per replica then all wait at once, each holding a thread, until the
        process cannot start more threads.)"""
        if self._token is None:
            self._token = tf.raw_ops.VarHandleOp(
                dtype=tf.float32, shape=[], shared_name="mlperf_tf_collectives"
            )
        return self._token

    def _group(self, members: list[int]) -> tuple[int, int, int]:
        if self.replica not in members:
            raise ValueError(f"replica {self.replica} is not in the group {members}")
        size = len(members)
        return size, _key("group", self.num_replicas, tuple(members)), members.index(self.replica)

    def _common(self, members, kind, name, x):
        size, group_key, _ = self._group(members)
        # One instance per (group, op kind, purpose, shape): a key reused with another kind or
        # shape fails the whole process's collectives.
        instance_key = _key("instance", group_key, kind, name, tuple(x.shape), x.dtype.name)
        return {
            "group_size": size,
            "group_key": group_key,
            "instance_key": instance_key,
            "timeout_seconds": self.timeout_s,
        }

    def rank(self, members: list[int]) -> int:
        """This replica's position in the group `members`."""
        return self._group(members)[2]

    def all_reduce(self, x, members: list[int], name: str):
        """Sum of `x` over `members` (TF's ring all-reduce on CPUs): 2(n-1)/n of x's bytes."""
        n = len(members)
        if n == 1:
            return x
        self.traffic.add("all_reduce", 2 * (n - 1) / n * _nbytes(x))
        return tf.raw_ops.CollectiveReduceV2(
            input=x, ordering_token=[self._ordering_token()], merge_op="Add", final_op="Id",
            communication_hint="ring", **self._common(members, "reduce", name, x),
        )  # fmt: skip

    def differentiable_all_reduce(self, x, members: list[int], name: str):
        """`all_reduce`, with its gradient: the all-reduce of the upstream gradient over
        `members` (TF registers no gradient for `CollectiveReduceV2`)."""
        return self._self_adjoint(self.all_reduce, x, members, name)

    def reduce_scatter(self, x, members: list[int], name: str):
        """Row `rank` of the sum of `x` ([n, k]) over `members`, as a [k] tensor.

        All-to-all (row j goes to the member of rank j) then a local sum: (n-1)/n of x's bytes.
        """
        n = len(members)
        if x.shape[0] != n:
            raise ValueError(f"reduce_scatter input's first dimension {x.shape} must be {n}")
        if n == 1:
            return x[0]
        self.traffic.add("reduce_scatter", (n - 1) / n * _nbytes(x))
        received = tf.raw_ops.CollectiveAllToAllV2(
            input=x,
            ordering_token=[self._ordering_token()],
            **self._common(members, "all_to_all", name, x),
        )  # [n, k]: row i is member i's row for this replica
        return tf.reduce_sum(tf.reshape(received, x.shape), axis=0)

    def all_to_all(self, x, members: list[int], name: str):
        """Row `j` of `x` ([n, ...]) goes to the member of rank `j`; returns [n, ...] whose row
        `i` came from the member of rank `i` (`CollectiveAllToAllV2`, which CPUs have). Sends
        (n-1)/n of x's bytes (its own row stays). The experts' token exchange
        (`mlperf_tf.layers.moe`) and the halo exchange of spatial partitioning
        (`mlperf_tf.layers.spatial`: TF's collectives have no point-to-point send in replica
        context) are built on it."""
        n = len(members)
        if x.shape[0] != n:
            raise ValueError(f"all_to_all input's first dimension {x.shape} must be {n}")
        if n == 1:
            return x
        self.traffic.add("all_to_all", (n - 1) / n * _nbytes(x))
        received = tf.raw_ops.CollectiveAllToAllV2(
            input=x,
            ordering_token=[self._ordering_token()],
            **self._common(members, "all_to_all", name, x),
        )
        return tf.reshape(received, tf.shape(x))

    def differentiable_all_to_all(self, x, members: list[int], name: str):
        """`all_to_all` with its gradient: the all-to-all of the upstream gradient over the same
        members (the exchange is its own inverse: row j of rank i goes to row i of rank j, and
        back)."""
        return self._self_adjoint(self.all_to_all, x, members, name)

    def _self_adjoint(self, collective, x, members: list[int], name: str):
        """`collective(x)` with a gradient: the same collective of the upstream gradient over
        the same members (a sum and an exchange are their own adjoints, and TF registers no
        gradient for either op).

        Each backward pass of one forward op gets its own instance (`name/grad0`, `/grad1`,
        ...), so a gradient taken twice in one step does not reuse a key in the same frame.
        """
        backward_calls = itertools.count()

        @tf.custom_gradient
        def forward(t):
            def grad(upstream):
                return collective(upstream, members, f"{name}/grad{next(backward_calls)}")

            return collective(t, members, name), grad

        return forward(x)

    def all_gather(self, x, members: list[int], name: str):
        """`x` ([k]) of every member, concatenated in rank order: [n * k]; sends (n-1) x's bytes
        per member in a ring, i.e. (n-1)/n of the result's bytes."""
        n = len(members)
        if n == 1:
            return x
        self.traffic.add("all_gather", (n - 1) * _nbytes(x))
        gathered = tf.raw_ops.CollectiveGatherV2(
            input=x,
            ordering_token=[self._ordering_token()],
            **self._common(members, "gather", name, x),
        )
        return tf.reshape(gathered, [n * x.shape[0]])

    def broadcast(self, x, members: list[int], root: int, name: str):
        """`x` of replica `root` on every member (the others' `x` gives only shape and dtype)."""
        if len(members) == 1:
            return x
        common = self._common(members, "broadcast", name, x)
        if self.replica == root:
            self.traffic.add("broadcast", _nbytes(x))
            return tf.raw_ops.CollectiveBcastSendV2(input=x, communication_hint="auto", **common)
        return tf.raw_ops.CollectiveBcastRecvV2(
            shape=tf.shape(x), T=x.dtype, communication_hint="auto", **common
        )


def _nbytes(x) -> float:
    """Bytes of `x` at trace time; 0 for a data-dependent shape (packed tokens), which is not
    known until it runs."""
    elements = x.shape.num_elements()
    return 0.0 if elements is None else float(elements * x.dtype.size)


class GroupView:
    """`Collectives` of one replica over a sub-group of the replicas, addressed by position.

    The all-reduce algorithms (`algorithms.py`) lay replicas 0..n-1 out on their R x C mesh;
    on a device mesh with model (or other) axes the gradient of a variable is summed over its
    data axis only, whose members are not 0..n-1. This view maps the algorithm's positions to
    those members' replica ids (rank order is kept: positions follow the ids' order).

    Args:
      ops: the replica's collectives over all replicas.
      members: the replica ids of the group, ascending; `ops.replica` is one of them.
    """

    def __init__(self, ops: Collectives, members: list[int]):
        self.ops = ops
        self.members = list(members)
        self.replica = self.members.index(ops.replica)
        self.num_replicas = len(self.members)
        self.traffic = ops.traffic

    def _ids(self, positions):
        return [self.members[p] for p in positions]

    def rank(self, members):
        return self.ops.rank(self._ids(members))

    def all_reduce(self, x, members, name):
        return self.ops.all_reduce(x, self._ids(members), name)

    def reduce_scatter(self, x, members, name):
        return self.ops.reduce_scatter(x, self._ids(members), name)

    def all_gather(self, x, members, name):
        return self.ops.all_gather(x, self._ids(members), name)

    def broadcast(self, x, members, root, name):
        return self.ops.broadcast(x, self._ids(members), self.members[root], name)
