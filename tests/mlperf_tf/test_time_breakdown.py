"""Tests of the init-phase warm-up and of the per-run time breakdown (`time_breakdown.json`)."""

import dataclasses
import json
import os
import time

import keras
import pytest
import tensorflow as tf

from mlperf_tf import runner, time_breakdown
from tests.numerics import assert_close
from tests.tiny_benchmark import TinyBenchmark, smoke, weights

pytestmark = pytest.mark.numerics


class _DropoutBatchNormTiny(TinyBenchmark):
    """The tiny benchmark with state the warm-up could disturb: batch-norm statistics, dropout
    seed-generator state, Adam slots and a learning rate that depends on `iterations`."""

    def build_model(self):
        size = self.config.image_size
        inputs = keras.Input([size, size, 1])
        x = keras.layers.Conv2D(4, 3, padding="same")(inputs)
        x = keras.layers.BatchNormalization(momentum=0.5)(x)
        x = keras.layers.Activation("relu")(x)
        x = keras.layers.Flatten()(x)
        x = keras.layers.Dropout(0.3)(x)
        return keras.Model(inputs, keras.layers.Dense(self.config.num_classes)(x))

    def build_optimizer(self, train_steps):
        schedule = keras.optimizers.schedules.PolynomialDecay(0.01, train_steps, 0.001)
        return keras.optimizers.Adam(schedule)


class _Controller(runner.Action):
    """Keeps the controller, and the tracing counts of its steps as of `run_start`."""

    def attach(self, controller):
        self.controller = controller
        self.traces_at_run_start = _traces(controller)


def _traces(controller):
    return (
        controller.trainer.loop.experimental_get_tracing_count(),
        controller.evaluator.step.experimental_get_tracing_count(),
    )


def _run(tmp_path, name, *, benchmark_class=TinyBenchmark, actions=(), **kwargs):
    run_config = runner.RunConfig(model_dir=str(tmp_path / name), steps_per_loop=3, **kwargs)
    return runner.run(benchmark_class(smoke()), run_config, actions=actions)


@pytest.mark.parametrize("distribution,devices", [("one_device", 0), ("mirrored", 2)])
def test_the_warm_up_leaves_the_weights_training_starts_from(tmp_path, distribution, devices):
    kwargs = dict(distribution=distribution, num_cpu_devices=devices, max_train_steps=7)
    _same_state_with_and_without_warm_up(tmp_path, _DropoutBatchNormTiny, **kwargs)


def test_the_warm_up_restores_each_replicas_shard_of_sharded_slots(tmp_path):
    # SGD with momentum: each replica keeps its 1/2 shard of the momentum (different values).
    kwargs = dict(distribution="mirrored", num_cpu_devices=2, max_train_steps=7,
                  weight_update_sharding=True)  # fmt: skip
    seen = _same_state_with_and_without_warm_up(tmp_path, TinyBenchmark, **kwargs)
    assert seen[True].controller.summer.sharded and len(_slots(seen[True].controller)) >= 4


def _same_state_with_and_without_warm_up(tmp_path, benchmark_class, **kwargs):
    seen = {True: _Controller(), False: _Controller()}
    results = {
        warm_up: _run(
            tmp_path,
            f"w{warm_up}",
            benchmark_class=benchmark_class,
            warm_up=warm_up,
            actions=[seen[warm_up]],
            **kwargs,
        )  # fmt: skip
        for warm_up in (True, False)
    }
    warm, cold = results[True], results[False]
    assert warm.steps == cold.steps == 7
    assert seen[True].controller.warm_up_s > 0 and seen[False].controller.warm_up_s == 0
    for a, b in zip(weights(warm.model), weights(cold.model), strict=True):
        assert_close(a, b, rtol=1e-6)
    # The optimizer's state too: iterations (7, not 8), Adam's slots.
    optimizers = [seen[w].controller.optimizer for w in (True, False)]
    assert [int(o.iterations.numpy()) for o in optimizers] == [7, 7]
    for a, b in zip(*(o.variables for o in optimizers), strict=True):
        assert_close(a.numpy(), b.numpy(), rtol=1e-6)
    for a, b in zip(*(_slots(seen[w].controller) for w in (True, False)), strict=True):
        assert_close(a, b, rtol=1e-6)
    # Non-trivial: the warm-up's own step (all-ones batch) would have moved these weights.
    untrained = benchmark_class(smoke()).build_model()
    assert max(abs(a - b).max() for a, b in zip(weights(warm.model), weights(untrained))) > 1e-3
    return seen


def _slots(controller):
    """Each replica's component of the sharded slots (none without weight-update sharding)."""
    summer = controller.summer
    if summer is None or not summer.sharded:
        return []
    strategy = controller.strategy
    return [
        c.numpy() for group in summer.slots for v in group
        for c in strategy.experimental_local_results(v)
    ]  # fmt: skip


@pytest.mark.parametrize(
    "data,distribution,devices",
    [("synthetic", "one_device", 0), ("read", "one_device", 0), ("read", "mirrored", 2)],
)
def test_the_first_real_loop_and_every_eval_reuse_the_warm_up_trace(
    tmp_path, data, distribution, devices
):
    """Synthetic input and input read from `data_dir` (the tiny benchmark's records are made, not
    read, but the runner distributes them as read ones: through TF's per-device pipelines,
    whose iterators the warm-up's must match, else the first timed step traces again)."""
    seen = _Controller()
    config = dataclasses.replace(smoke(), data_dir=str(tmp_path) if data == "read" else "")
    run_config = runner.RunConfig(model_dir=str(tmp_path / "trace"), steps_per_loop=3,
                                  distribution=distribution, num_cpu_devices=devices)  # fmt: skip
    runner.run(TinyBenchmark(config), run_config, actions=[seen])  # two evals
    controller = seen.controller
    assert controller.warm_up_s > 0
    # Each step traced in the warm-up only: the train loop twice (its first trace makes the stop
    # flag's variable, and tf.function traces again; the runner keeps that: controller.py
    # `_build_loops`), the eval step once.
    assert seen.traces_at_run_start == (2, 1)
    assert _traces(controller) == seen.traces_at_run_start


class _Stamped(TinyBenchmark):
    """Records when each training and eval record is produced (host time, seconds)."""

    read_at: list = []  # noqa: RUF012 (a per-test class attribute, reset by the test)

    def _stamp(self, dataset):
        def stamp(x):
            _Stamped.read_at.append(time.time())
            return x

        return dataset.map(
            lambda batch: {**batch, "valid": tf.py_function(stamp, [batch["valid"]], tf.float32)}
        ).map(lambda batch: {**batch, "valid": tf.ensure_shape(batch["valid"], [16])})

    def train_dataset(self, input_context):
        return self._stamp(super().train_dataset(input_context))

    def eval_dataset(self, input_context):
        return self._stamp(super().eval_dataset(input_context))


def test_no_record_is_read_before_run_start(tmp_path):
    """MLPerf: "The clock must start before any part of the system touches the dataset"."""
    _Stamped.read_at = []
    result = _run(tmp_path, "stamped", benchmark_class=_Stamped, distribution="one_device",
                  max_train_steps=4)  # fmt: skip
    with open(result.mlperf_log, encoding="utf-8") as f:
        records = [json.loads(x.split(":::MLLOG", 1)[1]) for x in f if ":::MLLOG" in x]
    run_start = next(r["time_ms"] for r in records if r["key"] == "run_start") / 1000
    assert _Stamped.read_at, "the stamps were not recorded"
    assert min(_Stamped.read_at) >= run_start - 0.01


def test_every_run_writes_a_breakdown_that_adds_up(tmp_path):
    result = _run(tmp_path, "parts", distribution="one_device", checkpoint_every_loops=1)
    path = tmp_path / "parts" / time_breakdown.FILE_NAME
    data = json.loads(path.read_text())
    parts = [data[key] for key in time_breakdown.PARTS]
    assert all(value >= 0 for value in parts if value is not data["other"])
    assert sum(parts) == pytest.approx(data["time_to_train_s"], abs=0.01)
    assert data["eval"] > 0 and data["checkpoint"] > 0 and data["train"] > 0
    assert data["steps"] == result.steps and data["status"] == "aborted"
    # The MLPerf log's run_start..run_stop is the same interval (ms clock vs monotonic).
    with open(result.mlperf_log, encoding="utf-8") as f:
        lines = f.read().splitlines()
    records = [json.loads(x.split(":::MLLOG", 1)[1]) for x in lines if ":::MLLOG" in x]
    times = {r["key"]: r["time_ms"] for r in records if r["key"] in ("run_start", "run_stop")}
    logged = (times["run_stop"] - times["run_start"]) / 1000
    assert data["time_to_train_s"] == pytest.approx(logged, abs=0.05)
    # The log carries it as a comment (the checker skips it), and `from_log` finds it.
    assert any(line.startswith("# mlperf-tf time_breakdown {") for line in lines)
    assert time_breakdown.from_log(result.mlperf_log)["train"] == data["train"]


def test_without_warm_up_the_first_steps_tracing_is_counted_as_compile(tmp_path):
    seen = _Controller()
    _run(tmp_path, "cold", distribution="one_device", warm_up=False, actions=[seen])
    data = json.loads((tmp_path / "cold" / time_breakdown.FILE_NAME).read_text())
    steady = data["steady_step_s"]
    assert data["compile"] > 5 * steady  # tracing the loop costs far more than a tiny step
    assert seen.controller.warm_up_s == 0.0


def test_compute_splits_the_first_loop_and_the_input_wait():
    parts = time_breakdown.compute(
        total_s=20.0, loops=[(1, 5.0, 0.5), (4, 4.5, 0.5), (5, 5.0, 0.0)], eval_s=3.0,
        checkpoint_s=1.0,
    )  # fmt: skip
    # Steady step: (4.0 + 5.0) / 9 = 1.0 s; first loop 5.0 = 0.5 wait + 1.0 step + 3.5 compile.
    assert parts["steady_step_s"] == pytest.approx(1.0)
    assert parts["compile"] == pytest.approx(3.5)
    assert parts["input_wait"] == pytest.approx(1.0)
    assert parts["input_wait_first_loop_s"] == pytest.approx(0.5)
    assert parts["train"] == pytest.approx(14.5 - 1.0 - 3.5)
    assert parts["other"] == pytest.approx(20.0 - 10.0 - 3.5 - 3.0 - 1.0 - 1.0)
    line = time_breakdown.one_line(parts)
    assert line.startswith("time to train 20.0 s: train 10.0 s (50 %), compile 3.5 s")


def test_a_side_file_of_another_run_is_not_taken(tmp_path):
    log = tmp_path / "mlperf_log.txt"
    log.write_text(':::MLLOG {"key": "run_start", "time_ms": 1000, "value": null}\n')
    data = time_breakdown.compute(total_s=1.0, loops=[(1, 1.0, 0.0)], eval_s=0, checkpoint_s=0)
    time_breakdown.write(str(tmp_path), {**data, "run_start_ms": 999})
    assert time_breakdown.from_log(str(log)) is None
    time_breakdown.write(str(tmp_path), {**data, "run_start_ms": 1000})
    assert time_breakdown.from_log(str(log))["time_to_train_s"] == 1.0
    assert os.path.exists(tmp_path / time_breakdown.FILE_NAME)
