"""Provides the init-phase warm-up: the train and eval steps traced (and compiled) before `run_start`.

MLPerf's timing rule (`mlcommons/training_policies`, `training_rules.adoc`, "Run Results"): "Prior
to starting the clock, a system may use a maximum of 20 minutes of model initialization time. Model
initialization time begins when the system first begins to construct or execute the model" and
"The clock must start before any part of the system touches the dataset". So the model may be
*executed* before `run_start`, but not on training or eval data: the warm-up runs one train step and
one eval step on synthetic batches of the real batches' shapes and dtypes (all ones: valid token
ids, labels, masks and weights), read from the `element_spec` of the pipelines the runner built
(building a pipeline reads no record; its first record is read by the first `next`).

Executing the step changes state, and training must start from exactly the state it would have had
without the warm-up: `StateSnapshot` copies every variable the step can write (the model's weights,
batch-norm statistics and Keras seed-generator states; the optimizer's slots, learning-rate state,
loss scale and `iterations`; the sharded slots of `--weight_update_sharding`) to host memory before
and writes them back after. The real pipelines are not iterated, so the data order is unchanged.
The traced `tf.function`s are reused by the first real loop and eval: the synthetic batches are
distributed as the run distributes its pipelines, and an iterator of the same type and element spec
does not retrace them (`tests/mlperf_tf/test_time_breakdown.py` checks both, for synthetic and
read input).
"""

from __future__ import annotations

import time

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from mlperf_tf.data import synthetic


class SpecRecorder:
    """Wraps a `dataset_fn` to remember the element spec of the per-replica dataset it returns.

    The spec is read from the dataset object the benchmark built, never by iterating it.
    """

    def __init__(self, dataset_fn):
        self.dataset_fn = dataset_fn
        self.element_spec = None

    def __call__(self, input_context):
        dataset = self.dataset_fn(input_context)
        self.element_spec = dataset.element_spec
        return dataset


def synthetic_dataset(distribute, element_spec):
    """An endless distributed dataset of all-ones batches of `element_spec` (per replica), with
    the autotuner off, distributed by `distribute` (dataset_fn -> distributed dataset): the way
    the run distributes the pipeline it stands for, so that its iterator has the same type
    spec and the traced steps are reused (a plain or per-replica iterator where the run reads
    through TF's per-device pipelines, as read input is, would trace the steps again in the
    first timed step and the first eval).

    A dimension the spec leaves open (dynamic shapes, without --xla on CPU) gets size 1 in the
    values but stays open in the dataset's spec, so the steps are traced for the real spec.
    """

    def ones(spec):
        return tf.ones([1 if d is None else d for d in spec.shape.as_list()], spec.dtype)

    def as_spec(value, spec):
        return tf.compat.v1.placeholder_with_default(value, spec.shape)

    def dataset_fn(_):
        dataset = tf.data.Dataset.from_tensors(tf.nest.map_structure(ones, element_spec))
        if any(not s.shape.is_fully_defined() for s in tf.nest.flatten(element_spec)):
            dataset = dataset.map(lambda x: tf.nest.map_structure(as_spec, x, element_spec))
        return synthetic.without_autotune(dataset.repeat())

    return distribute(dataset_fn)


class StateSnapshot:
    """A host copy of variables (each replica's component of distributed ones), for `restore`."""

    def __init__(self, strategy, variables):
        self.components = []
        for variable in variables:
            if isinstance(variable, keras.Variable):
                variable = variable.value  # the tf.Variable (a distributed one in a scope)
            self.components.extend(strategy.experimental_local_results(variable))
        self.values = [np.array(component.numpy(), copy=True) for component in self.components]

    def restore(self) -> None:
        """Writes the copied values back into every component."""
        for component, value in zip(self.components, self.values, strict=True):
            component.assign(value)


def run_state_variables(model, optimizer, summer) -> list:
    """Every variable a train step may write: model, optimizer, and sharded optimizer slots."""
    variables = list(model.variables) + list(optimizer.variables)
    if summer is not None and summer.holds_slots:
        variables += [slot for slots in summer.slots for slot in slots]  # per replica: a shard
        if summer.stage_slots is not None:  # per replica: its stage's pieces
            variables += summer.stage_slots.variables()
    return variables


def warm_up(*, strategy, trainer, evaluator, train_spec, eval_spec, distribute_train,
            distribute_eval, variables) -> float:  # fmt: skip
    """Runs one train step and one eval step on synthetic batches, then restores `variables`.

    Args:
      strategy: the run's strategy.
      trainer: the run's `Trainer`; its `loop` is traced (and with XLA compiled) here.
      evaluator: the run's `Evaluator`; its step is traced here.
      train_spec: per-replica element spec of the training pipeline.
      eval_spec: per-replica element spec of the eval pipeline.
      distribute_train, distribute_eval: how the run distributes each pipeline (dataset_fn ->
        distributed dataset); the synthetic batches go the same way (`synthetic_dataset`).
      variables: what the train step may write (`run_state_variables`), restored afterwards.

    Returns:
      The seconds the warm-up took (init time, before `run_start`).
    """
    begin = time.monotonic()
    snapshot = StateSnapshot(strategy, variables)
    try:
        trainer.loop(
            iter(synthetic_dataset(distribute_train, train_spec)), tf.constant(1, tf.int32)
        )
        evaluator.step(iter(synthetic_dataset(distribute_eval, eval_spec)))
    except (tf.errors.OpError, ValueError, TypeError) as error:
        # A step that cannot run on an all-ones batch (e.g. an assertion on the values) is
        # traced by the first timed step instead: the run goes on, only its time says so.
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        logging.warning("warm-up failed (%s: %s); the first timed step will trace",
                        type(error).__name__, first_line)  # fmt: skip
    finally:
        snapshot.restore()
    seconds = time.monotonic() - begin
    logging.info("warm-up: train and eval steps traced before run_start in %.1f s", seconds)
    return seconds
