"""Tests of the runner on the tiny benchmark: replica equivalence, XLA, non-finite loss, schedule."""

import dataclasses
import gc
import json
import os
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf
from mlperf_logging.mllog import constants as C

from mlperf_tf import config as config_lib
from mlperf_tf import runner
from mlperf_tf.benchmark import RunContext
from mlperf_tf.parallel import DeviceMesh
from tests import e2e
from tests.numerics import assert_close
from tests.tiny_benchmark import TinyBenchmark, smoke, weights


def _run(tmp_path, name, cfg=None, actions=(), stop_request=None, **run_kwargs):
    benchmark = TinyBenchmark(cfg or smoke())
    run_config = runner.RunConfig(model_dir=str(tmp_path / name), steps_per_loop=3, **run_kwargs)
    return runner.run(benchmark, run_config, actions=actions, stop_request=stop_request)


def _log_lines(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in f if ":::MLLOG" in line]


def test_two_replicas_equal_one_device_on_the_same_global_batch(tmp_path):
    one = _run(tmp_path, "one", distribution="one_device", max_train_steps=4)
    two = _run(tmp_path, "two", distribution="mirrored", num_cpu_devices=2, max_train_steps=4)
    assert one.steps == two.steps == 4
    for a, b in zip(weights(one.model), weights(two.model), strict=True):
        assert_close(a, b, rtol=1e-5)
    # And the weights did move: equality is not the trivial "nothing trained".
    untrained = TinyBenchmark(smoke()).build_model()
    moved = [np.abs(a - b).max() for a, b in zip(weights(one.model), weights(untrained))]
    assert max(moved) > 1e-3


_HOOKS: list[tuple[str, bool]] = []


class _TrainsItsBase(TinyBenchmark):
    """Trains a small model with a Keras optimizer in `prepare_initial_weights`, as a mini's
    first run trains its base, and records where the two starting-weight hooks run."""

    def prepare_initial_weights(self):
        _HOOKS.append(("prepare", tf.distribute.has_strategy()))
        base = keras.Sequential([keras.layers.Dense(1)])
        base.build((None, 2))
        optimizer = keras.optimizers.Adam(1e-2)

        @tf.function
        def step(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(base(x) ** 2)
            grads = tape.gradient(loss, base.trainable_variables)
            optimizer.apply_gradients(zip(grads, base.trainable_variables))
            return loss

        step(tf.ones([4, 2]))  # under a strategy's scope: no replica context, an AttributeError

    def restore_initial_weights(self, model):
        _HOOKS.append(("restore", tf.distribute.has_strategy()))


def test_a_base_trains_outside_the_strategy_before_the_weights_are_restored(tmp_path):
    _HOOKS.clear()
    run_config = runner.RunConfig(model_dir=str(tmp_path), distribution="one_device",
                                  max_train_steps=1)  # fmt: skip
    assert runner.run(_TrainsItsBase(smoke()), run_config).steps == 1
    assert _HOOKS == [("prepare", False), ("restore", True)]


def test_gradient_accumulation_equals_the_full_batch(tmp_path):
    full = _run(tmp_path, "full", distribution="one_device", max_train_steps=3)
    accumulated_cfg = dataclasses.replace(smoke(), gradient_accumulation_steps=2)
    accumulated = _run(
        tmp_path, "acc", cfg=accumulated_cfg, distribution="one_device", max_train_steps=3
    )
    for a, b in zip(weights(full.model), weights(accumulated.model), strict=True):
        assert_close(a, b, rtol=1e-5)


def test_train_step_compiles_with_xla(tmp_path):
    result = _run(tmp_path, "xla", distribution="one_device", xla=True, max_train_steps=2)
    assert result.steps == 2
    assert all(np.isfinite(w).all() for w in weights(result.model))


class _StaticShapesSeen(TinyBenchmark):
    """Records `static_shapes` each time the runner traces its step."""

    seen: list[bool] = []

    def compute_loss(self, model, batch, training=True):
        _StaticShapesSeen.seen.append(self.static_shapes)
        return super().compute_loss(model, batch, training)


@pytest.mark.parametrize("xla", [False, True])
def test_the_runner_binds_static_shapes_exactly_under_xla(tmp_path, xla):
    _StaticShapesSeen.seen = []
    run_config = runner.RunConfig(
        model_dir=str(tmp_path / "run"),
        steps_per_loop=2,
        distribution="one_device",
        xla=xla,
        max_train_steps=2,
    )
    result = runner.run(_StaticShapesSeen(smoke()), run_config)
    assert result.steps == 2
    assert _StaticShapesSeen.seen and set(_StaticShapesSeen.seen) == {xla}


def test_non_finite_loss_aborts_with_a_clear_reason(tmp_path):
    cfg = config_lib.override(smoke(), {"learning_rate": "1e30"})
    result = _run(tmp_path, "nan", cfg=cfg, distribution="one_device")
    assert result.status == C.ABORTED
    assert result.cause is runner.StopCause.NON_FINITE_LOSS
    assert "non-finite loss" in result.reason
    run_stop = [e for e in _log_lines(result.mlperf_log) if e["key"] == C.RUN_STOP]
    assert run_stop[-1]["metadata"]["status"] == C.ABORTED
    # No eval ran on the diverged weights: the block was closed and the run stopped.
    assert result.evals == []


def test_reaching_the_target_stops_with_success(tmp_path):
    cfg = dataclasses.replace(smoke(), quality_target=0.0, max_epochs=5)
    result = _run(tmp_path, "ok", cfg=cfg, distribution="one_device")
    assert result.status == C.SUCCESS
    assert result.cause is runner.StopCause.TARGET_REACHED
    assert len(result.evals) == 1  # stopped at the first eval, not at the budget
    assert result.steps == TinyBenchmark(cfg).steps_per_epoch


def test_log_has_the_full_event_sequence_in_order(tmp_path):
    result = _run(tmp_path, "log", distribution="one_device")
    keys = [e["key"] for e in _log_lines(result.mlperf_log)]
    required = [C.CACHE_CLEAR, C.INIT_START, C.SUBMISSION_BENCHMARK, C.SEED, C.GLOBAL_BATCH_SIZE,
                C.TRAIN_SAMPLES, C.EVAL_SAMPLES, C.INIT_STOP, C.RUN_START, C.BLOCK_START,
                C.BLOCK_STOP, C.EVAL_START, C.EVAL_ACCURACY, C.EVAL_STOP, C.RUN_STOP]  # fmt: skip
    positions = [keys.index(k) for k in required]
    assert positions == sorted(positions), keys
    for key in (C.SUBMISSION_ORG, C.SUBMISSION_PLATFORM, C.SUBMISSION_DIVISION,
                C.SUBMISSION_STATUS):  # fmt: skip
        assert keys.count(key) == 1
    # Two epochs, eval every epoch: two blocks with MLPerf's 1-based epoch numbering.
    blocks = [e["metadata"] for e in _log_lines(result.mlperf_log) if e["key"] == C.BLOCK_START]
    assert [(b["first_epoch_num"], b["epoch_count"]) for b in blocks] == [(1, 1), (2, 1)]


def test_restarted_run_keeps_the_previous_log(tmp_path):
    first = _run(tmp_path, "again", distribution="one_device", max_train_steps=2)
    with open(first.mlperf_log, encoding="utf-8") as f:
        first_text = f.read()
    _run(tmp_path, "again", distribution="one_device", max_train_steps=4)
    with open(first.mlperf_log + ".1", encoding="utf-8") as f:
        assert f.read() == first_text


def test_bad_run_settings_are_user_errors(tmp_path):
    from mlperf_tf.errors import UserError

    with pytest.raises(UserError, match="steps_per_loop"):
        runner.RunConfig(model_dir=str(tmp_path), steps_per_loop=0)
    with pytest.raises(UserError, match="model_dir"):
        runner.RunConfig(model_dir="")
    with pytest.raises(UserError, match="resume_input"):
        runner.RunConfig(model_dir=str(tmp_path), resume_input="rewind")
    for flag, value, message in (
        ("pipeline_parallel", 0, r"--pipeline_parallel \(0\) must be a positive integer"),
        ("context_parallel", -2, r"--context_parallel \(-2\) must not be negative"),
        ("micro_batch_size", -1, r"--micro_batch_size \(-1\) must not be negative"),
    ):
        with pytest.raises(UserError, match=message):
            runner.RunConfig(model_dir=str(tmp_path), **{flag: value})
    # The batch is split over the data groups that the context axis leaves (the smoke batch of 8
    # over C = 3: 6 replicas are 2 data groups).
    from mlperf_tf import splits

    assert splits.data_groups(6, runner.RunConfig(model_dir=str(tmp_path), context_parallel=3)) == 2
    # The defaults size no axis: every existing run keeps its mesh.
    assert runner.RunConfig(model_dir=str(tmp_path)).mesh_flags() == {
        "model_parallel": 1, "expert_parallel": 1, "spatial_partition": "1",
        "pipeline_parallel": 1, "context_parallel": 1,
    }  # fmt: skip


def test_global_norm_clipping_applies_to_the_summed_gradient(tmp_path, monkeypatch):
    # With a clip far below the gradient norm, SGD moves each weight by lr * clip * g/|g|: one
    # replica and two replicas (each clipping its own half would differ) end the same.
    monkeypatch.setattr(TinyBenchmark, "gradient_clip_norm", lambda self: 1e-3)
    one = _run(tmp_path, "one", distribution="one_device", max_train_steps=2)
    two = _run(tmp_path, "two", distribution="mirrored", num_cpu_devices=2, max_train_steps=2)
    for a, b in zip(weights(one.model), weights(two.model), strict=True):
        assert_close(a, b, rtol=1e-5)
    keras.utils.set_random_seed(0)  # the runner's seed: the same initial weights
    initial = TinyBenchmark(smoke()).build_model()
    # Each step's gradient has global norm 1e-3 after clipping; with momentum 0.9 two steps of
    # SGD(lr) move the weights by at most lr * 1e-3 * (1 + 1.9) in global norm.
    moved = [a - b for a, b in zip(weights(one.model), weights(initial))]
    distance = np.sqrt(sum(float(np.sum(d**2)) for d in moved))
    assert 0.05 * 1e-3 * 0.9 < distance <= 0.05 * 1e-3 * 2.9 * (1 + 1e-4)


# Extended (CI runs it after README's default run); the default run covers its case by
# resnet50/test_benchmark.py's grouped batch norm on two replicas equals one replica.
@pytest.mark.extended
def test_grouped_cross_replica_batch_norm_trains_through_the_runner(tmp_path):
    # The forward pass all-reduces BN statistics in replica context: the runner must keep it in
    # the loop's graph (a nested tf.function refuses the merge_call).
    from benchmarks.resnet50 import config as resnet_config
    from benchmarks.resnet50.benchmark import ResNet50Benchmark

    cfg = config_lib.override(resnet_config.smoke(), {"model.bn_group_size": "2"})
    result = e2e.run_two_steps_on_two_replicas(ResNet50Benchmark(cfg), tmp_path)
    assert result.steps == 2
    spans = [e["value"] for e in _log_lines(result.mlperf_log) if e["key"] == C.MODEL_BN_SPAN]
    assert spans == [2 * cfg.global_batch_size // 2]


class _Recorder(runner.Action):
    """Records every hook call; optionally stops after the first loop."""

    def __init__(self, stop_after_first_loop=False):
        self.calls = []
        self.stop_after_first_loop = stop_after_first_loop

    def attach(self, controller):
        self.calls.append(("attach", type(controller).__name__))

    def block_begin(self, point):
        self.calls.append(("block_begin", point.step))

    def after_loop(self, output):
        self.calls.append(("after_loop", output.step, output.steps))
        if self.stop_after_first_loop:
            return runner.Stop(runner.StopCause.INTERRUPTED, "recorder says stop")
        return None

    def block_end(self, point):
        self.calls.append(("block_end", point.step))

    def eval_begin(self, point):
        self.calls.append(("eval_begin", point.step))

    def after_eval(self, output):
        self.calls.append(("after_eval", output.point.step, output.target))

    def at_end(self, end):
        self.calls.append(("at_end", end.stop.cause, end.step))


def test_actions_are_called_with_each_loop_and_eval_in_order(tmp_path):
    recorder = _Recorder()
    benchmark = TinyBenchmark(smoke())  # 10 steps per epoch, evals after epochs 1 and 2
    run_config = runner.RunConfig(model_dir=str(tmp_path), steps_per_loop=4,
                                  distribution="one_device")  # fmt: skip
    result = runner.run(benchmark, run_config, actions=[recorder])
    assert result.cause is runner.StopCause.BUDGET_ENDED
    assert recorder.calls == [
        ("attach", "Controller"),
        ("block_begin", 10), ("after_loop", 1, 1), ("after_loop", 4, 3), ("after_loop", 8, 4),
            ("after_loop", 10, 2),
        ("block_end", 10), ("eval_begin", 10), ("after_eval", 10, 2.0),
        ("block_begin", 20), ("after_loop", 14, 4), ("after_loop", 18, 4), ("after_loop", 20, 2),
        ("block_end", 20), ("eval_begin", 20), ("after_eval", 20, 2.0),
        ("at_end", runner.StopCause.BUDGET_ENDED, 20),
    ]  # fmt: skip


def test_iterators_are_released_after_run_stop_not_before(tmp_path):
    """Releasing a tf.data iterator can wait out its pipeline's threads (56 s for the
    Transformer mini's training iterator, 14 s for an eval's): that wait must fall after
    `run_stop`, outside the MLPerf clock."""
    seen = {"evals": []}

    class WatchIterators(runner.Action):
        def attach(self, controller):
            seen["controller"] = controller

        def block_begin(self, point):
            seen.setdefault("train", weakref.ref(seen["controller"].train_iterator))

        def after_eval(self, output):
            seen["evals"].append(weakref.ref(seen["controller"].evaluator.spent_iterators[-1]))

        def at_end(self, end):
            refs = [seen["train"], *seen["evals"]]
            seen["alive_at_run_stop"] = [ref() is not None for ref in refs]

    _run(tmp_path, "iter", distribution="one_device", actions=[WatchIterators()])
    gc.collect()
    assert seen["alive_at_run_stop"] == [True, True, True]  # training, and the two evals' ones
    assert seen["train"]() is None and all(ref() is None for ref in seen["evals"])
    assert seen["controller"].train_iterator is None


def test_an_action_can_stop_the_run_after_a_loop(tmp_path):
    recorder = _Recorder(stop_after_first_loop=True)
    result = _run(tmp_path, "stop", distribution="one_device", actions=[recorder])
    assert result.cause is runner.StopCause.INTERRUPTED and result.steps == 1  # a 1-step first loop
    assert result.reason == "recorder says stop"
    assert result.evals == []  # the block was closed without an eval
    keys = [e["key"] for e in _log_lines(result.mlperf_log)]
    assert keys[-2:] == [C.BLOCK_STOP, C.RUN_STOP]


def test_a_stop_request_interrupts_between_loops_and_saves(tmp_path):
    request = runner.StopRequest()

    class RequestAfterFirstLoop(runner.Action):
        def after_loop(self, output):
            request.request("SIGTERM")

    result = _run(tmp_path, "req", distribution="one_device", checkpoint_every_loops=0,
                  actions=[RequestAfterFirstLoop()], stop_request=request)  # fmt: skip
    assert result.cause is runner.StopCause.INTERRUPTED
    assert result.reason == "SIGTERM" and result.steps == 1  # the first loop is one step
    run_stop = [e for e in _log_lines(result.mlperf_log) if e["key"] == C.RUN_STOP]
    assert run_stop[-1]["metadata"]["status"] == C.ABORTED
    # Interrupted weights are good weights: the final checkpoint holds them.
    assert os.path.basename(tf.train.latest_checkpoint(str(tmp_path / "req" / "ckpt"))) == "ckpt-1"


def test_stop_causes_map_to_mlperf_status_and_checkpoint_policy():
    statuses = {cause: cause.status for cause in runner.StopCause}
    assert statuses == {
        runner.StopCause.TARGET_REACHED: C.SUCCESS,
        runner.StopCause.BUDGET_ENDED: C.ABORTED,
        runner.StopCause.NON_FINITE_LOSS: C.ABORTED,
        runner.StopCause.BAD_DATA: C.ABORTED,
        runner.StopCause.INTERRUPTED: C.ABORTED,
        runner.StopCause.PEER_FAILED: C.ABORTED,
        runner.StopCause.SAVE_FAILED: C.ABORTED,
        runner.StopCause.DATA_SERVICE_FAILED: C.ABORTED,
    }
    assert [c for c in runner.StopCause if not c.keeps_weights] == [
        runner.StopCause.NON_FINITE_LOSS,
        runner.StopCause.SAVE_FAILED,
    ]


def test_the_runner_binds_a_run_context_and_leaves_the_benchmark_alone(tmp_path):
    benchmark = TinyBenchmark(smoke())
    seen = []

    class SeeBenchmark(runner.Action):
        def attach(self, controller):
            seen.append(controller.benchmark)

    run_config = runner.RunConfig(model_dir=str(tmp_path), distribution="mirrored",
                                  num_cpu_devices=2, seed=7, max_train_steps=1,
                                  skip_bad_records=True)  # fmt: skip
    runner.run(benchmark, run_config, actions=[SeeBenchmark()])
    assert benchmark.context == RunContext()  # the caller's object is untouched
    assert seen[0].context == RunContext(
        num_replicas=2, seed=7, skip_bad_records=True, mesh=DeviceMesh(data=2)
    )
    assert seen[0].config is benchmark.config


def test_no_runner_function_is_longer_than_60_lines():
    import ast
    import pathlib

    folder = pathlib.Path(runner.__file__).parent
    lengths = {}
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lengths[f"{path.name}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert len(lengths) > 20
    assert max(lengths.values()) <= 60, sorted(lengths.items(), key=lambda kv: -kv[1])[:3]


class _KeepController(runner.Action):
    def attach(self, controller):
        self.controller = controller


def _smoke(benchmark_name, **overrides):
    from mlperf_tf import registry  # noqa: PLC0415

    benchmark_class = registry.get(benchmark_name)
    return benchmark_class(config_lib.override(benchmark_class.preset("smoke"), overrides))


def _collective_timeouts(concrete_function) -> list[float]:
    """`timeout_seconds` of every collective op in a traced function and the functions it calls."""
    graph = concrete_function.graph.as_graph_def()
    bodies = [graph.node] + [f.node_def for f in graph.library.function]
    return [
        n.attr["timeout_seconds"].f
        for nodes in bodies
        for n in nodes
        if n.op.startswith("Collective")
    ]


def _model_parallel_run(tmp_path, name, *, steps=2, **overrides):
    """A `--model_parallel=2` smoke run of `name` (config `overrides`) on 2 logical CPUs through
    runner.run, warm-up included, every collective bounded by `--collective_timeout=60`; asserts
    it trained `steps` steps (`--max_train_steps`: fewer if the config's budget ends first),
    evaluated once, logged from run_start to run_stop and saved. Its result and controller."""
    config = runner.RunConfig(
        model_dir=str(tmp_path / "m"), num_cpu_devices=2, model_parallel=2, max_train_steps=steps,
        collective_timeout=60,
    )  # fmt: skip
    keep = _KeepController()
    result = runner.run(_smoke(name, **overrides), config, actions=[keep])
    assert result.steps == steps and len(result.evals) == 1
    keys = [line["key"] for line in _log_lines(result.mlperf_log)]
    assert "run_start" in keys and "eval_accuracy" in keys and keys[-1] == "run_stop"
    assert os.listdir(tmp_path / "m" / "ckpt")
    return result, keep.controller


# Extended (CI runs it after README's default run); the default run covers its case by
# transformer/test_tensor_parallel.py (split = unsplit) and the llama31_8b M2 run through the
# runner (test_layout_resume.py).
@pytest.mark.extended
def test_a_model_parallel_transformer_run_trains_evaluates_and_logs(tmp_path):
    # Its beam-search eval deadlocked (each replica's decoding loop ran in a loop frame of its own
    # name, so the shards' all-reduces never met): now it decodes, BLEU is computed and logged.
    # Every collective, the model axis's too, is bounded by --collective_timeout.
    # Samples and epochs are those of data parallelism (tests/benchmarks/test_sample_counts.py):
    # the smoke epoch is 32 pairs, 8 a step, so the one-epoch budget is 4 steps, not 4 / M = 2
    # (it counted a step's pairs per replica, and logged epoch_num 2.0 where M = 1 logged 1.0).
    result, controller = _model_parallel_run(tmp_path, "transformer", steps=4, max_epochs="1")
    assert 0.0 <= result.evals[0][1] <= 1.0
    evals = [r for r in _log_lines(result.mlperf_log) if r["key"] == C.EVAL_ACCURACY]
    assert [e["metadata"]["epoch_num"] for e in evals] == [1]
    # --collective_timeout reaches the model axis's all-reduces (`ModelAxis`) in the training
    # step (forward and backward) and in the eval step (encoder, and the decoding loop's
    # function): before, the runner built them unbounded (timeout 0), and a hang was silent.
    train = controller.trainer.loop.get_concrete_function(
        iter(controller.train_data), tf.constant(1, tf.int32)
    )
    evaluate = controller.evaluator.step.get_concrete_function(iter(controller.evaluator.dataset))
    for traced in (train, evaluate):
        timeouts = _collective_timeouts(traced)
        assert len(timeouts) > 10 and set(timeouts) == {60.0}


# Extended (CI runs it after README's default run); the default run covers its case by
# bert/test_tensor_parallel.py (split = unsplit) and the llama31_8b M2 run saved and resumed
# through the runner (test_layout_resume.py).
@pytest.mark.extended
def test_a_model_parallel_bert_run_trains_evaluates_saves_and_logs(tmp_path):
    # With BERT's padding-skipping (dynamic-shape) encoder the first real step after the warm-up
    # failed on collective shapes [177,32] vs [256,32]; the runner now asks for static shapes
    # under model parallelism. Every collective is bounded by the timeout.
    _, controller = _model_parallel_run(tmp_path, "bert")
    assert controller.warm_up_s > 0 and controller.benchmark.static_shapes


@pytest.mark.slow  # 68 s; guards behaviour that was right when written (the warm-up's snapshot)
def test_the_warm_up_restores_each_model_shard_of_the_split_weights(tmp_path):
    # The warm-up's snapshot copies every replica's component of a split variable (they differ
    # between the model shards): a run with it ends where the run without it does.
    from mlperf_tf.parallel import layout as layout_lib  # noqa: PLC0415

    ends = {}
    for warm_up in (True, False):
        keep = _KeepController()
        config = runner.RunConfig(
            model_dir=str(tmp_path / f"w{warm_up}"), num_cpu_devices=2, model_parallel=2,
            max_train_steps=2, collective_timeout=60, warm_up=warm_up,
        )  # fmt: skip
        runner.run(_smoke("bert"), config, actions=[keep])
        controller = keep.controller
        mesh = controller.benchmark.mesh
        split = [v for v in controller.model.variables if layout_lib.layout_of(v).split]
        components = controller.strategy.experimental_local_results(split[0].value)
        assert split and abs(components[0].numpy() - components[1].numpy()).max() > 0
        ends[warm_up] = [
            layout_lib.whole_value(v, mesh).numpy() for v in controller.model.variables
        ]
    for a, b in zip(ends[True], ends[False], strict=True):
        assert_close(a, b, rtol=1e-6)
