"""Provides `gathered_value`: a split variable's whole tensor by a collective all-gather of its
shards, for saves whose shard groups span workers, and `bind_gathers`, which binds it to the
variables (`mlperf_tf.parallel.layout.set_gatherer`).

`mlperf_tf.parallel` describes where shards lie and joins them where one process holds them
all; joining shards held by other workers is a collective, so it lives here, on the suite's
`Collectives` (one key scheme, the timeout), and `parallel` imports nothing of this package.
"""

from __future__ import annotations

import functools

import keras
import tensorflow as tf

from mlperf_tf.collectives.ops import Collectives, Traffic, static_replica_id
from mlperf_tf.parallel import layout as layout_lib
from mlperf_tf.parallel.mesh import DeviceMesh

_GATHER = "mlperf_tf_gather"  # ((mesh, timeout), the variable's traced gather function)


def bind_gathers(variables, timeout_s: float) -> None:
    """Binds `gathered_value` to the split `variables` (their saves join shards held by other
    workers with it), bounded by `timeout_s` seconds (`--collective_timeout`: a worker whose
    peer never joins a save fails with an error instead of waiting forever; 0: no limit)."""
    for variable in variables:
        if layout_lib.layout_of(variable).split:
            layout_lib.set_gatherer(
                variable, functools.partial(_gather, variable, timeout_s=float(timeout_s))
            )


def _gather(variable, mesh: DeviceMesh, *, timeout_s: float):
    return gathered_value(variable, mesh, timeout_s=timeout_s)


def gathered_value(variable, mesh: DeviceMesh, *, timeout_s: float = 0.0):
    """`variable`'s whole tensor by a collective all-gather of its shards (cross-replica context).

    Each replica all-gathers its component over its shard group (`Layout.shard_group`: the
    model axis for Megatron weights, the expert axis for `EXPERT_SPLIT`) with
    `Collectives.all_gather`, in a `tf.function` under the variable's strategy; the first local
    replica's result is returned (every copy along the unsplit axes is the same). The function
    is traced once per variable (at its first save) and kept on it; variables are not passed to
    one shared function because a `tf.function` given a distributed variable as an argument
    reuses its trace for another variable of that shape and reads the first one (measured,
    TF 2.20). A collective: every worker must call it.

    Args:
      variable: a split variable (a Keras or tf variable made under the strategy).
      mesh: the run's mesh.
      timeout_s: seconds the gather may wait for its peers (0: no limit).

    Raises:
      tf.errors.DeadlineExceededError: a peer did not join within `timeout_s`.
    """
    layout = layout_lib.layout_of(variable)
    tf_var = _tf_variable(variable)
    cached = getattr(variable, _GATHER, None)
    if cached is None or cached[0] != (mesh, float(timeout_s)):
        cached = ((mesh, float(timeout_s)), _gather_function(tf_var, layout, mesh, timeout_s))
        setattr(variable, _GATHER, cached)
    return cached[1]()


def _gather_function(tf_var, layout: layout_lib.Layout, mesh: DeviceMesh, timeout_s: float):
    strategy = _strategy_of(tf_var)
    axis, n = layout.split_axis, layout.num_shards(mesh)
    name = f"whole/{tf_var.name}"

    def replica():
        replica_id = static_replica_id(tf.distribute.get_replica_context())
        if replica_id is None:
            raise ValueError("gathering shards needs static replica ids (MirroredStrategy-like)")
        ops = Collectives(
            replica=replica_id, num_replicas=mesh.size, timeout_s=timeout_s, traffic=Traffic()
        )
        members = layout.shard_group(mesh, replica_id)
        if [layout.shard_index(mesh, r) for r in members] != list(range(n)):
            # Rank order (ascending ids) must be shard order for the concatenation below.
            raise ValueError(f"the shard group {members} is not in shard order")
        shard = tf.convert_to_tensor(tf_var)  # this replica's component
        front = tf.experimental.numpy.moveaxis(shard, axis, 0)  # [k, ...]
        flat = ops.all_gather(tf.reshape(front, [-1]), members, name)  # shard by shard
        whole = tf.reshape(flat, [n * front.shape[0], *front.shape[1:]])
        return tf.experimental.numpy.moveaxis(whole, 0, axis)

    # A partial, not a closure: tf.function keys its retracing statistics by a function's code,
    # which every variable's closure would share (a warning per variable past the fifth).
    return tf.function(functools.partial(_first_local_result, strategy, replica), autograph=False)


def _first_local_result(strategy, fn):
    return strategy.experimental_local_results(strategy.run(fn))[0]


def _strategy_of(tf_var):
    return getattr(tf_var, "distribute_strategy", None) or tf.distribute.get_strategy()


def _tf_variable(variable):
    return variable.value if isinstance(variable, keras.Variable) else variable
