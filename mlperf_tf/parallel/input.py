"""Provides the mesh's input routing: each input pipeline reads its batch shard, and every replica
of the group that shares that shard (spatial x model) receives each of its batches.

A benchmark's pipeline is written for data parallelism; `for_mesh` wraps it so it sees the batch
shards (`DeviceMesh.batch_shards`) as its replicas, and repeats each batch once per replica of the
group, in replica order, which is how `distribute_datasets_from_function` hands a pipeline's
batches to its local replicas. (Kept apart from `mesh.py`, which imports no TensorFlow.)
"""

from __future__ import annotations

import tensorflow as tf

from mlperf_tf.errors import UserError
from mlperf_tf.parallel.mesh import DeviceMesh


def mesh_input_context(
    input_context: tf.distribute.InputContext, mesh: DeviceMesh
) -> tuple[tf.distribute.InputContext, int]:
    """The input context a benchmark's pipeline sees on `mesh`, and how often to repeat each batch.

    A benchmark's pipeline is written for data parallelism: pipeline `i` of `n` reads its shard
    and yields one batch per local replica, of `global / num_replicas_in_sync` examples. On a
    mesh the replicas of one group (spatial x model) share a batch, so the pipeline is told there
    are `batch_shards` replicas in sync, and each batch it yields is repeated for every replica
    of the group. When a group spans several workers (a model axis across processes), the
    workers of one group get the same pipeline id, so they read the same examples.

    Returns:
      (context, repeats): the context to pass to the benchmark's dataset function, and how many
      consecutive replicas receive each of its batches (`repeat_for_group`).
    """
    if mesh.group_size == 1:
        return input_context, 1
    pipelines = input_context.num_input_pipelines
    if mesh.size % pipelines:
        raise UserError(f"{mesh} does not split over {pipelines} input pipelines (workers)")
    local = mesh.size // pipelines  # replicas fed by one pipeline
    group = mesh.group_size
    if local % group == 0:  # whole groups on each worker
        shards_here = local // group
        pipeline_id = input_context.input_pipeline_id
        num_pipelines = pipelines
        repeats = group
    elif group % local == 0:  # a group spans several workers: they read the same batch
        shards_here = 1
        pipeline_id = input_context.input_pipeline_id * local // group
        num_pipelines = mesh.batch_shards
        repeats = local
    else:
        raise UserError(
            f"{mesh}: a worker's {local} replicas neither hold whole replica groups of "
            f"{group} nor divide one"
        )
    context = tf.distribute.InputContext(
        num_input_pipelines=num_pipelines,
        input_pipeline_id=pipeline_id,
        num_replicas_in_sync=mesh.batch_shards,
    )
    del shards_here  # implied by the context: local batches = num_replicas_in_sync / pipelines
    return context, repeats


def repeat_for_group(dataset: tf.data.Dataset, repeats: int) -> tf.data.Dataset:
    """Each element of `dataset` `repeats` times in a row (the replicas of one group, in order)."""
    if repeats == 1:
        return dataset
    return dataset.flat_map(
        lambda *element: tf.data.Dataset.from_tensors(
            element if len(element) > 1 else element[0]
        ).repeat(repeats)
    )


def for_mesh(dataset_fn, mesh: DeviceMesh):
    """`dataset_fn` (input context -> per-replica batches) as a `distribute_datasets_from_function`
    argument on `mesh`: it sees the batch shards as its replicas, and each of its batches goes to
    every replica of the group that shares it."""

    def mesh_dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        input_context, repeats = mesh_input_context(input_context, mesh)
        return repeat_for_group(dataset_fn(input_context), repeats)

    return mesh_dataset_fn


def distribute_untuned(strategy: tf.distribute.Strategy, dataset_fn):
    """`strategy.distribute_datasets_from_function(dataset_fn)` for pipelines whose tf.data
    autotuner is off (synthetic input), without the per-device pipelines TF adds behind them.

    On one host TF feeds a worker's replicas through a `MultiDeviceIterator`, whose per-device
    pipelines keep the autotuner on (no public setting turns it off), and releasing an autotuned
    iterator waits, idle, for the tuner's sleep, which grows with the iterator's age
    (`mlperf_tf/data/README.md`: 76 s after a 4-device tiny run, 0.13 s without them). Here a
    `MirroredStrategy` reads per replica (`InputReplicationMode.PER_REPLICA`, kept on the host):
    replica `r` of `R` iterates the worker's pipeline and keeps its elements `r, r + R, ...`,
    the ones `MultiDeviceIterator` deals to it, so every replica gets the same batches as before
    (the worker's pipeline runs `R` times over: cheap for synthetic input, which is why only it
    comes here). `OneDeviceStrategy` reads the pipeline itself: its one replica takes every
    element. Other strategies (several workers, TPU) keep TF's own input.
    """
    if isinstance(strategy, tf.distribute.OneDeviceStrategy):
        return dataset_fn(tf.distribute.InputContext())
    if not isinstance(strategy, tf.distribute.MirroredStrategy):
        return strategy.distribute_datasets_from_function(dataset_fn)
    replicas = strategy.num_replicas_in_sync

    def replica_dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        worker_context = tf.distribute.InputContext(num_replicas_in_sync=replicas)
        return dataset_fn(worker_context).shard(replicas, input_context.input_pipeline_id)

    options = tf.distribute.InputOptions(
        experimental_fetch_to_device=False,
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
    )
    return strategy.distribute_datasets_from_function(replica_dataset_fn, options)
