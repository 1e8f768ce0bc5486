"""Checks every registered benchmark against the `Benchmark` contract, through the runner.

Parametrized over `registry.available()`: a benchmark registered by entry point gets these checks
for free. Each uses the benchmark's `smoke` preset (synthetic data, seconds): a run whose MLPerf
log passes the official checker (quality aside) and holds the benchmark's hparams, an eval whose
padding is masked, and a resumed run that continues from its checkpoint. The log is checked for
the round a run emits for by default (`mlperf_tf.rounds.default_ruleset`). A benchmark that no
MLPerf round has (a plug-in's, e.g. `examples/efficientnet`) cannot be a closed-division result:
its smoke run is an open-division run, and its log is judged as `mlperf-tf check` judges it, by
the newest round's common and open-division rules.
"""

import dataclasses
import importlib
import json
import os
from unittest import mock

import keras
import pytest
from absl import logging
from mlperf_logging.mllog import constants as C

from mlperf_tf import registry, rounds, runner
from mlperf_tf.errors import UserError
from tests import e2e
from tests.tiny_benchmark import TinyBenchmark

NAMES = sorted(registry.available())


def _in_a_round(benchmark_class) -> bool:
    """Whether some MLPerf round this suite knows has rules for the benchmark."""
    return bool(rounds.rounds_with(benchmark_class))


def _ruleset(benchmark_class) -> str:
    """The round a default run emits for; "" (no round-specific keys) for a non-MLPerf one."""
    return rounds.resolve_ruleset(benchmark_class, "")


@pytest.fixture(scope="module", params=NAMES)
def smoke_run(request, tmp_path_factory):
    """(benchmark class, RunResult) of one smoke run per registered benchmark."""
    benchmark_class = registry.get(request.param)
    model_dir = tmp_path_factory.mktemp(f"smoke_{request.param}")
    result = runner.run(
        benchmark_class(benchmark_class.preset("smoke")),
        runner.RunConfig(
            model_dir=str(model_dir),
            distribution="one_device",
            steps_per_loop=8,
            submission_division="closed" if _in_a_round(benchmark_class) else "open",
        ),
    )
    return benchmark_class, result


def test_registry_lists_the_builtins():
    assert {"resnet50", "ssd", "transformer", "bert"} <= set(NAMES)


def test_smoke_run_trains_its_budget_and_evaluates_on_its_schedule(smoke_run):
    benchmark_class, result = smoke_run
    benchmark = benchmark_class(benchmark_class.preset("smoke"))
    schedule = runner.schedule(benchmark)
    assert result.cause in (runner.StopCause.BUDGET_ENDED, runner.StopCause.TARGET_REACHED)
    if result.cause is runner.StopCause.BUDGET_ENDED:
        assert result.steps == schedule[-1].step
        assert [epoch for epoch, _ in result.evals] == [p.epoch_num for p in schedule]
    assert result.evals and all(value == value for _, value in result.evals)  # no NaN


def test_smoke_log_passes_the_official_checker_quality_aside(smoke_run):
    benchmark_class, result = smoke_run
    if _in_a_round(benchmark_class):
        # The round `mlperf-tf run` emits for by default: the newest with the benchmark.
        e2e.assert_passes_quality_aside(result.mlperf_log, (_ruleset(benchmark_class),))
        return
    # In no round: the checker picks the round (as `mlperf-tf check` does) and judges the log
    # by that round's common and open-division rules, saying so.
    report = e2e.assert_passes_quality_aside(result.mlperf_log, (None,))
    name = benchmark_class.mlperf_benchmark
    assert any(f"'{name}' is not an MLPerf benchmark" in str(f) for f in report.findings), [
        str(f) for f in report.findings
    ]


def _jsonable(value):
    return json.loads(json.dumps(value))


def test_smoke_log_holds_the_benchmarks_hparams(smoke_run):
    benchmark_class, result = smoke_run
    config = benchmark_class.preset("smoke")
    benchmark = benchmark_class(config)
    records = e2e.log_records(result.mlperf_log)
    logged = {r["key"]: r for r in records}
    expected = {
        C.SUBMISSION_BENCHMARK: benchmark_class.mlperf_benchmark,
        C.GLOBAL_BATCH_SIZE: config.global_batch_size,
        C.GRADIENT_ACCUMULATION_STEPS: config.gradient_accumulation_steps,
        C.SEED: 0,
    }
    hparams = rounds.adapt_hparams(
        benchmark_class.renamed_keys, _ruleset(benchmark_class), benchmark.mlperf_hparams()
    )
    expected.setdefault(C.TRAIN_SAMPLES, hparams.get(C.TRAIN_SAMPLES, benchmark.train_samples()))
    expected.setdefault(C.EVAL_SAMPLES, hparams.get(C.EVAL_SAMPLES, benchmark.eval_samples()))
    for key, value in {**hparams, **expected}.items():
        assert key in logged, f"{key} missing from the log"
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict):
            value, metadata = value
            assert _jsonable(metadata).items() <= logged[key]["metadata"].items(), key
        assert logged[key]["value"] == _jsonable(value), key
    for key in (
        C.SUBMISSION_ORG,
        C.SUBMISSION_PLATFORM,
        C.SUBMISSION_DIVISION,
        C.SUBMISSION_STATUS,
    ):
        assert [r["key"] for r in records].count(key) == 1, key


# GRPO's and the Transformer's cases (42 s of rollouts; 15-39 s of beam search) are extended (CI
# runs them after README's default run): the default run covers their padded evaluations by
# qwen35_397b_grpo/test_benchmark.py's test_a_padded_validation_batch_counts_only_its_real_tasks
# (pass@k through the evaluator, rollouts' rewards fixed) and transformer/test_benchmark.py's
# real-data eval step, beside the other benchmarks' cases here.
EVAL_PADDING_EXTENDED = {"qwen35_397b_grpo", "transformer"}


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.extended) if n in EVAL_PADDING_EXTENDED else n
     for n in NAMES],
)  # fmt: skip
def test_eval_padding_is_masked(name):
    """The eval value is the same whether or not the last eval batch is padded."""
    benchmark_class = registry.get(name)
    config = benchmark_class.preset("smoke")
    count = config.eval_examples
    assert count > 2, "the smoke eval set is too small to pad"
    whole = benchmark_class(dataclasses.replace(config, eval_batch_size=count))
    keras.utils.set_random_seed(0)
    model = whole.build_model()
    # count - 1 per batch: the second batch holds one real example and count - 2 padding ones.
    padded = benchmark_class(dataclasses.replace(config, eval_batch_size=count - 1))
    assert padded.eval_steps(1) == 2
    assert runner.evaluate_only(padded, model) == pytest.approx(
        runner.evaluate_only(whole, model), rel=1e-5, abs=1e-6
    )


@pytest.mark.parametrize("name", NAMES)
def test_declared_facts_are_well_formed_and_cached_as_declared(name):
    """The facts a benchmark declares (`Benchmark` docstring): its rounds have its rule files,
    its RCP entries exist, its simulator shape matches the axes it runs, and the simulator's
    committed cache holds what it declares now (regenerate it with
    `python -m mlperf_tf.flops --write --builtin NAME` after changing a declaration)."""
    from mlperf_tf import facts
    from mlperf_tf.simulate import cache, convergence, model

    benchmark_class = registry.get(name)
    for ruleset in benchmark_class.supported_rounds():
        assert rounds.has_benchmark(ruleset, benchmark_class.mlperf_benchmark), ruleset
    declared = benchmark_class.convergence
    if declared is not None:
        curve = convergence.curve_of(declared, name)
        assert curve.batches and all(v > 0 for v in curve.values)
    cached = cache._flops_table().get(name, {})
    for preset in benchmark_class.presets:
        benchmark = benchmark_class(benchmark_class.preset(preset))
        shape = benchmark.simulator_shape()
        assert isinstance(shape, facts.SimulatorShape)
        # What `bench` counts its rate in: one word, singular ("image", "sequence", ...).
        assert benchmark.sample_unit.isalpha() and not benchmark.sample_unit.endswith("s")
        # `parallel_axes` is read on an instance (a class attribute or a property).
        assert isinstance(benchmark.parallel_axes, tuple) and "data" in benchmark.parallel_axes
        # The simulator models tensor parallelism exactly where `run` offers it.
        assert (shape.blocks is not None) == ("model" in benchmark.parallel_axes), preset
        assert not shape.convs or "spatial" in benchmark.parallel_axes, preset
        if preset in cached:
            assert model.shape_of(cached[preset]) == shape, preset
            assert facts.convergence_from_dict(cached[preset]["convergence"]) == declared
            flops = benchmark.training_flops_per_sample()
            if flops is not None:
                assert cached[preset]["training_flops_per_sample"] == flops, preset
            assert cached[preset]["trainable_parameters"] == (
                benchmark.trainable_parameter_count() or cached[preset]["trainable_parameters"]
            )


def test_round_level_keys_come_from_the_run_for_every_benchmark():
    """6.1's disclosure keys are the runner's, from the mesh, dtype policy and config: a
    benchmark with no 6.1 round gets them too (the runner drops them for older rounds)."""
    from mlperf_tf.benchmark import RunContext
    from mlperf_tf.parallel.mesh import DeviceMesh

    benchmark_class = registry.get("resnet50")
    mesh = DeviceMesh(data=2, spatial=2)
    bench = benchmark_class(benchmark_class.preset("smoke"), context=RunContext(mesh=mesh))
    keys = bench.round_hparams()
    assert set(keys) == set(rounds.ROUND_KEYS)
    assert keys["context_parallelism"] == 2 and keys["tensor_parallelism"] == 1
    assert keys["micro_batch_size"] == bench.per_replica_batch_size
    # The pipeline and context axes, and --micro_batch_size, as the run's mesh has them.
    staged = DeviceMesh(data=1, pipeline=2, context=2, model=2, expert=1)
    run = RunContext(mesh=staged, micro_batch_size=1)
    keys = benchmark_class(benchmark_class.preset("smoke"), context=run).round_hparams()
    assert (keys["pipeline_parallelism"], keys["context_parallelism"]) == (2, 2)
    assert (keys["tensor_parallelism"], keys["expert_parallelism"]) == (2, 1)
    assert keys["micro_batch_size"] == 1
    odd = dataclasses.replace(run, micro_batch_size=bench.per_replica_batch_size * 2 + 1)
    with pytest.raises(UserError, match=r"--micro_batch_size \(\d+\) must divide the batch"):
        benchmark_class(benchmark_class.preset("smoke"), context=odd).round_hparams()
    assert keys["config_filename"] == "benchmarks/resnet50/config.py"
    assert os.path.isfile(
        os.path.join(os.path.dirname(e2e.__file__), "..", keys["config_filename"])
    )
    policy = keras.mixed_precision.global_policy()
    try:
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
        assert {keys_[k] for keys_ in [bench.round_hparams()] for k in rounds.PRECISION_KEYS} == {
            "bfloat16"
        }
    finally:
        keras.mixed_precision.set_global_policy(policy)
    assert set(rounds.ROUND_KEYS).isdisjoint(rounds.adapt_hparams((), "5.0.0", keys))
    assert rounds.adapt_hparams((), "6.1.0", keys) == keys


@pytest.mark.parametrize(
    "module", ["llama31_8b", "llama2_70b_lora", "bert", "flux1"], ids=lambda module: module
)
def test_prepare_mini_runs_the_packages_prepare_mini_and_logs_its_summary(module, tmp_path):
    """`Benchmark.prepare_mini`'s default (these benchmarks' own): the `prepare_mini` of the
    `prepare` module beside the benchmark, whose summary it logs; a package without one (the
    tests' tiny benchmark) has no mini dataset."""
    prepare = importlib.import_module(f"benchmarks.{module}.prepare")
    with (
        mock.patch.object(prepare, "prepare_mini", return_value={"files": 3}) as written,
        mock.patch.object(logging, "info") as info,
    ):
        registry.get(module).prepare_mini(str(tmp_path))
    written.assert_called_once_with(str(tmp_path))
    info.assert_called_once_with("%s: mini dataset in %s: %s", module, str(tmp_path), {"files": 3})
    with pytest.raises(NotImplementedError, match="benchmark 'tiny' has no mini dataset"):
        TinyBenchmark.prepare_mini(str(tmp_path))


def test_undeclared_presets_default_to_the_config_modules_functions():
    """A benchmark that leaves out `mlperf_benchmark` and `presets` gets its name and its config
    module's `mlperf`/`mini`/`smoke`; without such functions, a `TypeError` names what is
    missing when the class is defined (not an `AttributeError` from inside the registry)."""
    from benchmarks.bert import config as bert_config
    from mlperf_tf.benchmark import Benchmark
    from tests import tiny_benchmark

    class Defaults(Benchmark):
        name = "bert_again"
        config_class = bert_config.BertConfig

    assert Defaults.mlperf_benchmark == "bert_again"
    assert Defaults.presets == {
        preset: getattr(bert_config, preset) for preset in ("mlperf", "mini", "smoke")
    }
    with pytest.raises(TypeError, match=r"'tiny_again' declares no `presets`.* mlperf, mini "):

        class NoPresets(Benchmark):  # tests/tiny_benchmark.py has only `smoke`
            name = "tiny_again"
            config_class = tiny_benchmark.TinyConfig
