"""Provides `Trainer`: one compiled host loop of `steps_per_loop` optimizer steps.

The replica math (loss, eval outputs) lives in `Benchmark`; the Trainer accumulates micro-batch
gradients and hands them to `sum_and_apply`, the one place where per-replica gradients are summed
across replicas and applied. Swap that method (subclass `Trainer` and pass it to `run`) to change
how gradients are summed (e.g. hierarchical all-reduce) or where the update runs (weight-update
sharding).
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

from mlperf_tf.benchmark import Benchmark
from mlperf_tf.collectives.ops import loop_function, replica_collectives
from mlperf_tf.errors import UserError
from mlperf_tf.parallel.mesh import DeviceMesh
from mlperf_tf.runner.pipeline import PipelineStep
from mlperf_tf.sparse import merge_duplicate_rows


def replica_function(fn, *, xla: bool):
    """`fn` compiled with XLA per replica when `xla`, else `fn` itself (inlined into the caller).

    The one place the runner chooses XLA-or-not, for the Trainer and the Evaluator alike. Without
    XLA the function is inlined into the loop's graph: a nested `tf.function` would refuse the
    all-reduce of cross-replica batch norm ("merge_call ... in a tf.function").
    """
    return tf.function(fn, jit_compile=True, reduce_retracing=True) if xla else fn


def bind_collective_timeout(benchmark: Benchmark) -> None:
    """Gives this replica step's collectives the run's `--collective_timeout` (replica context).

    The model axis's all-reduces (`mlperf_tf.layers.tensor_parallel.ModelAxis`) are those of the
    replica context (`collectives.ops.replica_collectives`), which wait at most the largest
    timeout asked for there: asked here first, before the step's first collective, the run's
    bound reaches every layer without each model passing it down; made here, in the replica
    step's graph, the replica's ordering token is also captured (not made) by a compiled
    (`--xla`) stage schedule. Nothing without model, context or pipeline parallelism
    (expert-parallel layers get it from their config, `RunContext`).
    """
    mesh = benchmark.mesh
    if mesh.model > 1 or mesh.context > 1 or mesh.pipeline > 1:
        replica_collectives(
            num_replicas=mesh.size, timeout_s=benchmark.context.collective_timeout_s
        )


def group_loss_scale(mesh: DeviceMesh) -> float:
    """The factor on a replica's loss before its gradient, for the mesh axes whose replicas share
    a batch (the runner's, so no benchmark counts them).

    Every replica of a group (spatial x model) computes its batch shard's share of the loss
    (`Benchmark.compute_loss`). A replicated weight's gradient is summed over the gradient axes
    (`mlperf_tf.parallel.mesh.GRADIENT_AXES`): over `spatial`, whose K members each hold the
    partial gradient of their tiles of the same images, so each counts 1/K; not over `model`,
    whose members compute the same gradient (a split weight's shard is its own). So 1/K.
    """
    return 1.0 / mesh.spatial


def annotated(partition, strategy, model, batch):
    """The context a replica computes `model` on `batch` in: `batch` itself without a TPU
    partition, else `partition.annotated` (the images split over the replica's cores, the
    weights annotated per their layouts). Used by the Trainer and the Evaluator."""
    if partition is None:
        return contextlib.nullcontext(batch)
    return partition.annotated(strategy, model, batch)


class Trainer:
    """Runs `num_steps` optimizer steps per call of `loop` (one traced `tf.function`).

    Args:
      strategy: the run's tf.distribute strategy.
      benchmark: supplies `compute_loss` (replica context) and the gradient clip norm.
      model: the Keras model, built under `strategy.scope()`.
      optimizer: the Keras optimizer, built under `strategy.scope()`.
      xla: compile each replica's forward/backward pass with XLA. `apply_gradients` stays outside
        it: its cross-replica sum is a merge_call, which XLA cannot hold on CPU/GPU.
      pipeline_schedule: "1f1b" or "gpipe", the micro-batches' order through the stages of a
        `pipeline` axis (`mlperf_tf.parallel.pipeline.Schedule`).
    """

    def __init__(self, *, strategy, benchmark: Benchmark, model, optimizer, xla: bool,
                 pipeline_schedule: str = "1f1b"):  # fmt: skip
        self.strategy = strategy
        self.benchmark = benchmark
        self.model = model
        self.optimizer = optimizer
        self.accumulation = benchmark.config.gradient_accumulation_steps
        self.clip_norm = benchmark.gradient_clip_norm()
        if xla and hasattr(optimizer, "capture"):
            raise UserError(
                f"optimizer {type(optimizer).__name__} captures layer activations, which cannot "
                "leave an XLA-compiled step: run it without --xla"
            )
        self.loss_scale = group_loss_scale(benchmark.mesh)
        self._grads = replica_function(self._replica_grads, xla=xla)
        # With a `pipeline` axis the micro-batches run through the stages in one schedule
        # (`mlperf_tf.runner.pipeline`) instead of one after the other.
        self.pipeline = None
        if benchmark.mesh.pipeline > 1:
            self.pipeline = PipelineStep(
                benchmark=benchmark, model=model, optimizer=optimizer,
                micro_batches=self.accumulation, schedule=pipeline_schedule,
                loss_scale=self.loss_scale, mesh=benchmark.mesh,
                timeout_s=benchmark.context.collective_timeout_s, xla=xla,
            )  # fmt: skip
        # Set by the controller before the first loop (see `mlperf_tf.preemption.StopRequest`).
        self.stop_request = None
        # Set by the controller when --all_reduce/--pack_mb/--weight_update_sharding ask for
        # the collectives' sum (`mlperf_tf.collectives.GradientSummer`); None: Keras' own sum.
        self.summer = None
        # Set by the controller on TPU with --spatial_partition/--model_parallel: the replica
        # step annotates the batch and the weights for XLA's SPMD partitioner
        # (`mlperf_tf.parallel.tpu.TpuPartition`); None: nothing is annotated.
        self.partition = None
        # `tf.timestamp` fails inside a graph once op determinism is on
        # (`tf.config.experimental.enable_op_determinism`, which the fault tests use); such runs
        # report no input wait rather than fail.
        self.time_input = _timestamps_allowed()
        self.loop = tf.function(self._loop)
        self.summed_gradients = tf.function(self._summed_gradients)

    def _summed_gradients(self, batch) -> list[tf.Tensor]:
        """The cross-replica sum of the gradients of one distributed `batch` (one per
        `model.trainable_variables`), computed as a step computes them, but neither clipped nor
        applied (cross-replica context; `summed_gradients` is its `tf.function`).

        For tests and tools that compare gradients, e.g. a split model's against the unsplit one's,
        through the runner's loss scaling rather than a copy of it.
        """
        per_replica = self.strategy.run(lambda b: self._grads(b)[1], args=(batch,))
        return [self.strategy.reduce(tf.distribute.ReduceOp.SUM, g, axis=None) for g in per_replica]

    def _replica_grads(self, batch):
        variables = self.model.trainable_variables
        # An optimizer that needs layer inputs and output gradients (K-FAC) records them during
        # the forward pass and takes the gradient itself (`mlperf_tf.optimizers.kfac`).
        capture = getattr(self.optimizer, "capture", contextlib.nullcontext)
        with tf.GradientTape() as tape:
            with capture(), annotated(self.partition, self.strategy, self.model, batch) as batch:
                loss, metrics = self.benchmark.compute_loss_and_metrics(
                    self.model, batch, training=True
                )
                grad_loss = loss * self.loss_scale if self.loss_scale != 1.0 else loss
                scaled = self.optimizer.scale_loss(grad_loss)
        if hasattr(self.optimizer, "capture"):
            return loss, self.optimizer.gradients(tape, scaled, variables), metrics
        return loss, tape.gradient(scaled, variables), metrics

    def _replica_step(self, micro_batches):
        bind_collective_timeout(self.benchmark)
        total_loss = 0.0
        total_grads = None
        total_metrics = {}
        if self.pipeline is not None:  # all micro-batches through the stages, one schedule
            # Timed, the schedule is a function of its own per replica (`loop_function`): its
            # timestamps, stateful ops without a resource, would otherwise be chained across
            # the replicas in program order and wait on each other's exchanges (a deadlock).
            run = loop_function(self.pipeline) if self.pipeline.timed else self.pipeline
            total_loss, total_grads, total_metrics = run(micro_batches)
            micro_batches = ()
        for batch in micro_batches:  # Python loop: the accumulation count is static
            loss, grads, metrics = self._grads(batch)
            total_loss += loss
            for name, value in metrics.items():
                total_metrics[name] = total_metrics.get(name, 0.0) + tf.cast(value, tf.float32)
            if total_grads is None:
                total_grads = list(grads)
            else:
                total_grads = [_add_gradients(a, g) for a, g in zip(total_grads, grads)]
        if self.accumulation > 1:
            total_grads = [_scale_gradient(g, 1.0 / self.accumulation) for g in total_grads]
            total_loss /= self.accumulation
        self.sum_and_apply(total_grads)
        # What `Benchmark.after_update` reads: sums over the micro-batches, before the mean.
        sums = {k: total_metrics[k] for k in self.benchmark.update_metrics()}
        metrics = {k: v / float(self.accumulation) for k, v in total_metrics.items()}
        return total_loss, metrics, sums

    def sum_and_apply(self, grads: list[tf.Tensor]) -> None:
        """Sums this replica's `grads` across replicas, clips the sum, and applies it (replica context).

        The seam for gradient summation: every optimizer update of a run goes through here. Each
        replica's loss is its share of the global mean, so the cross-replica *sum* of `grads` is the
        full-batch gradient. Keras 3 sums across replicas inside `apply_gradients`; clipping must
        see that sum, not each replica's part (see `_summed_shares`).

        Args:
          grads: one gradient per `model.trainable_variables`, of this replica's micro batches.
        """
        if self.summer is not None:
            variables = self.model.trainable_variables
            self.summer.apply(self.optimizer, grads, variables, clip_norm=self.clip_norm)
            return
        if self.clip_norm or any(isinstance(g, tf.IndexedSlices) for g in grads):
            grads = self._summed_shares(grads)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))

    def _summed_shares(self, grads):
        """`grads` summed over replicas, each sparse row once, clipped to `clip_norm` (global
        norm), and handed back as this replica's share of that sum (replica context).

        Keras sums across replicas inside `apply_gradients`, after its clip (per replica: not
        the reference's clip of the full-batch gradient) and without merging an embedding's
        sparse gradient (`IndexedSlices`): it joins the replicas' rows, and each lookup of a
        row is one more row, to which Keras' sparse Adam gives sum(g_i^2) for (sum g_i)^2
        (`mlperf_tf.sparse.merge_duplicate_rows`). So this sums first (every gradient when it
        clips, else the sparse ones only), merges each sparse gradient's duplicate rows, clips,
        and hands Keras shares its sum restores: a dense gradient's sum / replicas, a sparse
        one's rows r, r + R, ... on replica r of R, so the joined rows are each row once. One
        extra all-reduce, none with a single replica.
        """
        context = tf.distribute.get_replica_context()
        replicas = context.num_replicas_in_sync if context else 1
        chosen = [i for i, g in enumerate(grads)
                  if self.clip_norm or isinstance(g, tf.IndexedSlices)]  # fmt: skip
        summed = [grads[i] for i in chosen]
        if replicas > 1:
            summed = context.all_reduce(tf.distribute.ReduceOp.SUM, summed)
        summed = [merge_duplicate_rows(g) for g in summed]
        if self.clip_norm:  # `chosen` is every gradient
            summed, _ = tf.clip_by_global_norm(summed, self.clip_norm)
        if replicas > 1:
            replica = context.replica_id_in_sync_group
            summed = [_share(g, replica, replicas) for g in summed]
        out = list(grads)
        for i, g in zip(chosen, summed, strict=True):
            out[i] = g
        return out

    def _loop(self, iterator, num_steps):
        """Runs up to `num_steps` steps; returns (mean loss, steps run, seconds waited for input,
        mean metrics).

        The metrics (`Benchmark.train_metric_shapes`) are averaged over replicas and steps.

        A stop request (`stop_request`, set by a signal) is read before each step and cuts the
        loop short at a step boundary; on several workers they agree on it, so all stop together.
        The input wait is the time between asking the iterator for the step's batches and having
        them (two `tf.timestamp`s; stateful ops run in program order), summed over the steps.
        """
        loss_sum = tf.constant(0.0, tf.float32)
        done = tf.constant(0, tf.int32)
        shapes = self.benchmark.train_metric_shapes()
        if self.pipeline is not None:
            shapes = {**shapes, **self.pipeline.metric_shapes()}
        metric_sums = {name: tf.zeros(shape, tf.float32) for name, shape in shapes.items()}
        waited = tf.constant(0.0, tf.float64)
        for _ in tf.range(num_steps):
            if self.stop_request is not None and self.stop_request.should_stop(self.strategy):
                break
            if self.time_input:
                asked = tf.timestamp()
                with tf.control_dependencies([asked]):
                    micro_batches = [next(iterator) for _ in range(self.accumulation)]
                batches = tf.nest.flatten(micro_batches, expand_composites=True)
                with tf.control_dependencies(batches):
                    waited += tf.timestamp() - asked
            else:
                micro_batches = [next(iterator) for _ in range(self.accumulation)]
            per_replica_loss, per_replica_metrics, per_replica_sums = self.strategy.run(
                self._replica_step, args=(micro_batches,)
            )
            # Outside the gradient: what it changes is no input of the update, and its writes
            # follow this step's reads of the same variables (automatic control dependencies).
            if per_replica_sums:
                self.benchmark.after_update(self.model, {
                    name: self.strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)
                    for name, value in per_replica_sums.items()
                })  # fmt: skip
            # Each replica's loss is its batch shard's share of the global mean, the same on
            # every replica of a group (spatial x model): the sum over replicas counts each
            # batch once per group member (context members hold shares that sum to it).
            loss = self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None)
            loss /= self.benchmark.mesh.loss_copies
            loss_sum += tf.cast(loss, tf.float32)
            metric_sums = {
                name: total
                + self.strategy.reduce(
                    tf.distribute.ReduceOp.MEAN, per_replica_metrics[name], axis=None
                )
                for name, total in metric_sums.items()
            }
            done += 1
        steps = tf.cast(tf.maximum(done, 1), tf.float32)
        return loss_sum / steps, done, waited, {k: v / steps for k, v in metric_sums.items()}


def _timestamps_allowed() -> bool:
    """Whether `tf.timestamp` may run (not under op determinism, where TF refuses it: the public
    API has no getter for that setting, so this asks the op itself, once)."""
    try:
        tf.timestamp()
    except tf.errors.FailedPreconditionError:
        return False
    return True


def _add_gradients(a, b):
    """a + b of two micro batches' gradients; sparse ones (an embedding lookup's
    `IndexedSlices`, which have no `+`) are joined, rows of both kept."""
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
        return tf.IndexedSlices(
            tf.concat([a.values, b.values], 0), tf.concat([a.indices, b.indices], 0), a.dense_shape
        )
    if isinstance(a, tf.IndexedSlices) or isinstance(b, tf.IndexedSlices):
        return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)
    return a + b


def _share(g, replica, replicas: int):
    """Replica `replica`'s share of a gradient summed over `replicas`, such that the replicas'
    shares sum (`tf.distribute`'s all-reduce) to it: a dense one's g / replicas; a sparse
    one's (`IndexedSlices`, rows distinct) rows replica, replica + replicas, ..., since a
    sparse all-reduce joins rows rather than adding them."""
    if isinstance(g, tf.IndexedSlices):
        keep = tf.range(replica, tf.shape(g.indices)[0], replicas)  # [rows / replicas]
        return tf.IndexedSlices(
            tf.gather(g.values, keep), tf.gather(g.indices, keep), g.dense_shape
        )
    return _scale_gradient(g, 1.0 / replicas)


def _scale_gradient(g, factor: float):
    """g x factor, for dense and sparse (`IndexedSlices`) gradients."""
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(g.values * factor, g.indices, g.dense_shape)
    return g * factor
