"""The simulator's count of evaluations against the runner's own schedule: for every benchmark
the simulator knows, at the global batches of its published runs, the evaluations `simulate`
charges (`EvalCadence.evaluations` of the cached declaration) equal those of the benchmark's
`eval_schedule()` up to the step the target falls in, for targets before, at and after the
first evaluation. The schedule is the runner's code, run on the `mlperf` preset's config at
that batch; nothing here restates a rule."""

import dataclasses
import functools
import math

import pytest

from mlperf_tf import registry
from mlperf_tf.facts import EvalCadence
from mlperf_tf.simulate import model, validate


def _published_batches() -> list[tuple[str, int]]:
    batches = {(p["benchmark"], p["global_batch"]) for p in validate.load_points()["points"]}
    return sorted(batches)


def _case(name: str, batch: int):
    return pytest.param(name, batch, id=f"{name}-{batch}")


# The Transformer has no published point: its `mlperf` preset's batch.
CASES = [_case(n, b) for n, b in [*_published_batches(), ("transformer", 32768)]]


@functools.cache
def _runner(name: str, batch: int, **changes):
    """The benchmark at the `mlperf` preset with the global batch (and `changes`) replaced."""
    cls = registry.get(name)
    config = cls.preset("mlperf")
    if name == "qwen35_397b_grpo":  # a step's rollouts are its prompts x their generations
        prompts = batch // config.grpo.num_generations_per_prompt
        changes = {
            "grpo": dataclasses.replace(config.grpo, num_prompts_per_step=prompts),
            **changes,
        }
    config = dataclasses.replace(config, global_batch_size=batch, **changes)
    if name == "transformer":  # no prepared data here: the synthetic sizes of the same config
        config = dataclasses.replace(config, data_dir="")
    return cls(config)


def _runner_count(points, target: float, key) -> int:
    """Evaluations the runner makes to reach `target`: those before it and the one at or after
    it (the run stops there)."""
    before = sum(1 for p in points if key(p) < target)
    assert before < len(points), "the schedule ends before the target: raise the budget"
    return before + 1


def _targets(first: int, every: int, last: int) -> list[int]:
    """Target steps around the first evaluation and on and off the grid after it."""
    steps = {
        1,
        first - 1,
        first,
        first + 1,
        first + every - 1,
        first + every,
        first + 3 * every + 1,
    }
    steps |= {first + k * every // 3 for k in range(1, 30)}
    return sorted(s for s in steps if 1 <= s < last)


@pytest.mark.parametrize("name, batch", CASES)
def test_the_simulated_evaluations_are_the_runners(name, batch):
    facts = model.benchmark_facts(name)
    cadence = model.eval_cadence(facts)
    train = int(facts["train_examples"])
    benchmark = _runner(name, batch)
    points = sorted(benchmark.eval_schedule(), key=lambda p: p.step)
    if name == "transformer":
        # Its steps count tokens, the simulator's pairs: compare at equal epochs, off whole
        # ones (there the simulator's ceil(samples / batch) steps pass the runner's epoch).
        for epochs in (0.5, 0.99, 1.01, 1.5, 2.2, 3.7, 4.9):
            target = math.ceil(epochs * train / batch)
            expected = _runner_count(points, epochs, key=lambda p: p.epoch_num)
            assert cadence.evaluations(batch, train, target) == expected, epochs
        return
    _assert_same_counts(cadence, points, batch, train)


def _assert_same_counts(cadence: EvalCadence, points, batch: int, train: int) -> None:
    """The cadence's first evaluation is the schedule's, and its count is the runner's at every
    target of `_targets`."""
    first, every = cadence.first_and_every(batch, train)
    assert points[0].step == first
    for target in _targets(first, every, points[-1].step):
        expected = _runner_count(points, target, key=lambda p: p.step)
        assert cadence.evaluations(batch, train, target) == expected, target


def test_a_published_point_is_charged_the_runners_count():
    """BERT's 4,096-chip v0.7 point (batch 8,192, every 500,000 samples: 62 steps): as many
    evaluations as the runner makes up to its target, each timed (it was one, at one a
    'epoch' of 4,587,520 samples)."""
    point = next(p for p in validate.load_points()["points"] if p["id"] == "v3-bert-4096-v07")
    r = validate._predict(point, validate.systems.load(point["system"]), logged=False)
    target = math.ceil(r.samples_to_target / 8192)
    points = _runner("bert", 8192).eval_schedule()
    assert points[0].step == math.ceil(500_000 / 8192) == 62
    assert r.evaluations == _runner_count(points, target, key=lambda p: p.step) > 1


@pytest.mark.parametrize("name, batch, changes, first_eval_samples", [
    # The DLRMv4 RCP runs evaluate from the first interval on: the config's 0.
    ("dlrmv4", 16384, {"data": "first_eval_samples=0"}, 0),
    # The NeMo DeepSeek-V3 runs evaluate every step: one sample rounds up to the first step.
    ("deepseekv3_671b", 15360, {"first_eval_samples": 1}, 0),
])  # fmt: skip
def test_a_point_that_evaluated_from_the_start_is_the_runner_so_configured(
    name, batch, changes, first_eval_samples
):
    """`simulate(first_eval_samples=...)` (a published point's `first_eval_samples`) counts as
    the runner counts with its config's first evaluation moved there."""
    facts = model.benchmark_facts(name)
    cadence = model.eval_cadence(facts, first_eval_samples)
    cls = registry.get(name)
    config = cls.preset("mlperf")
    if "data" in changes:
        key, value = changes["data"].split("=")
        changes = {"data": dataclasses.replace(config.data, **{key: int(value)})}
    runner = cls(dataclasses.replace(config, global_batch_size=batch, **changes))
    points = sorted(runner.eval_schedule(), key=lambda p: p.step)
    _assert_same_counts(cadence, points, batch, int(facts["train_examples"]))


def test_a_cadence_declares_samples_or_epochs_and_a_known_rounding():
    with pytest.raises(ValueError, match="one of"):
        EvalCadence()
    with pytest.raises(ValueError, match="one of"):
        EvalCadence(every_samples=1.0, every_epochs=1.0)
    with pytest.raises(ValueError, match="first_rounding"):
        EvalCadence(every_samples=1.0, first_rounding="up")
    cadence = EvalCadence(every_samples=100.0, first=(2.5, 3840.0))
    assert EvalCadence.from_dict(cadence.as_dict()) == cadence
