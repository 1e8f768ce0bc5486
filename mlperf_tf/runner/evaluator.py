"""Provides `Evaluator`: runs the eval set, gathers per-replica outputs and reduces them on the host."""

from __future__ import annotations

import tensorflow as tf

from mlperf_tf.benchmark import Benchmark
from mlperf_tf.parallel import input as parallel_input
from mlperf_tf.runner.trainer import annotated, bind_collective_timeout, replica_function

# Prefix of the per-output masks that mark the rows of each mesh group's first replica.
_LEADER = "__mesh_group_leader__/"


class Evaluator:
    """Evaluates the model on the benchmark's eval set; `evaluate()` returns the quality value.

    Args:
      strategy: the run's tf.distribute strategy.
      benchmark: supplies `eval_step` (replica context) and the host-side reduction.
      model: the Keras model being trained.
      dataset: the distributed eval dataset (`strategy.distribute_datasets_from_function`).
      xla: compile each replica's eval step with XLA (chosen by `replica_function`).
    """

    def __init__(self, *, strategy, benchmark: Benchmark, model, dataset, xla: bool):
        self.strategy = strategy
        self.benchmark = benchmark
        self.model = model
        self.dataset = dataset
        self.steps = benchmark.eval_steps(strategy.num_replicas_in_sync)
        self._replica_eval = replica_function(self._replica, xla=xla)
        # Set by the controller on TPU with --spatial_partition/--model_parallel (see
        # `Trainer.partition`).
        self.partition = None
        # One traced step for every eval (each eval's iterator has the same spec: no retracing);
        # the warm-up traces it before `run_start` (`mlperf_tf.runner.warmup`).
        self.step = tf.function(self._gathered_step)
        # Each eval's iterator, kept until `release_spent_iterators`: releasing a tf.data iterator
        # can wait for its pipeline's threads to wind down (4.4 s and 14.2 s after two of the
        # Transformer mini's four evals on TF 2.20), and an eval's time counts in time-to-train.
        # A spent iterator has yielded its whole padded pass, so it holds no batches.
        self.spent_iterators: list = []

    def _replica(self, batch):
        bind_collective_timeout(self.benchmark)
        with annotated(self.partition, self.strategy, self.model, batch) as batch:
            outputs = self.benchmark.eval_step(self.model, batch)
        # Scalars get a leading axis so that gathering concatenates one value per replica.
        outputs = {k: tf.reshape(v, [1]) if v.shape.rank == 0 else v for k, v in outputs.items()}
        group = self.benchmark.mesh.group_size
        if group > 1:
            # The replicas of a mesh group (spatial x model) evaluated the same batch: only the
            # first of each group (ids are consecutive within a group) is counted on the host.
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            # int32, not bool: across workers `strategy.gather` is a collective gather, which
            # takes no bool (measured: a model axis over 2 MultiWorkerMirroredStrategy workers).
            leader = tf.cast(tf.equal(tf.math.floormod(replica, group), 0), tf.int32)
            for key in list(outputs):
                outputs[_LEADER + key] = tf.fill(tf.shape(outputs[key])[:1], leader)
        return outputs

    def _gathered_step(self, iterator):
        outputs = self.strategy.run(self._replica_eval, args=(next(iterator),))
        gathered = {k: self.strategy.gather(v, axis=0) for k, v in outputs.items()}
        return {
            k: tf.boolean_mask(v, gathered[_LEADER + k] > 0) if _LEADER + k in gathered else v
            for k, v in gathered.items()
            if not k.startswith(_LEADER)
        }

    def evaluate(self) -> float:
        """One pass over the eval set (host loop); the benchmark's `eval_result` of it."""
        iterator = iter(self.dataset)
        state = self.benchmark.eval_begin()
        for _ in range(self.steps):
            outputs = self.step(iterator)
            state = self.benchmark.eval_reduce(state, {k: v.numpy() for k, v in outputs.items()})
        self.spent_iterators.append(iterator)
        return float(self.benchmark.eval_result(state))

    def release_spent_iterators(self) -> None:
        """Lets the evals' iterators go (and wait out their threads): after the run's clock."""
        self.spent_iterators.clear()


def evaluate_only(benchmark: Benchmark, model) -> float:
    """Evaluates `model` on the benchmark's eval set on the default strategy (tests, tools)."""
    strategy = tf.distribute.get_strategy()
    benchmark.bind_model(model)
    data = strategy.distribute_datasets_from_function(
        parallel_input.for_mesh(benchmark.eval_dataset, benchmark.mesh)
    )
    return Evaluator(
        strategy=strategy, benchmark=benchmark, model=model, dataset=data, xla=False
    ).evaluate()
