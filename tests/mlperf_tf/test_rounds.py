"""Each round's official rules against the keys this suite's benchmarks emit for that round.

For every benchmark and every round that has it, a log is built from what the runner emits (the
runner's own keys, the benchmark's `mlperf_hparams()` adapted by `rounds.adapt_hparams`, and
`rounds.init_events`) around one block and one evaluation at the target, and the official checker
judges it with that round's rules. The same log under a round whose events it lacks fails: the
test can fail.
"""

import json
import os

import pytest
import yaml
from mlperf_logging.mllog import constants as C

from compliance import checker
from mlperf_tf import registry, rounds
from mlperf_tf.benchmark import RunContext
from tests.compliance import logs

# MLPerf benchmark name -> the benchmark class the registry holds under the suite's name.
_CLASSES = {
    cls.mlperf_benchmark: cls
    for cls in map(
        registry.get, ("resnet50", "bert", "ssd", "transformer", "llama31_8b", "llama2_70b_lora")
    )
}


def _class(benchmark: str):
    return _CLASSES[benchmark]


def _hparams(benchmark: str) -> dict:
    """The hyperparameters the runner logs for `benchmark`'s mlperf preset: the runner's own
    assembly (`Benchmark.logged_hparams`: the config's batch keys, the benchmark's, the
    round-level ones), so this test follows the runner instead of a copy of it."""
    cls = _class(benchmark)
    return cls(cls.preset("mlperf")).with_context(RunContext(num_replicas=1)).logged_hparams()


@pytest.fixture(scope="module")
def emitted_hparams():
    return {name: _hparams(name) for name in _CLASSES}


def _log(path, benchmark, ruleset, hparams, *, with_init_events=True, adapt=True):
    """The runner's sequence of records for `ruleset`, with one eval at the round's target."""
    t = logs.T0_MS
    out = []

    def add(key, value=None, metadata=None, event_type="POINT_IN_TIME"):
        nonlocal t
        out.append(logs.line(key, value, time_ms=t, metadata=metadata, event_type=event_type))
        t += 1000

    add(C.CACHE_CLEAR, True)
    add(C.INIT_START, event_type="INTERVAL_START")
    for key, value in [
        (C.SUBMISSION_BENCHMARK, benchmark),
        (C.SUBMISSION_ORG, "mlperf-tf tests"),
        (C.SUBMISSION_DIVISION, "closed"),
        (C.SUBMISSION_STATUS, "research"),
        (C.SUBMISSION_PLATFORM, "cpu"),
        (C.SEED, 0),
    ]:
        add(key, value)
    if with_init_events:
        for event in rounds.init_events(benchmark, ruleset):
            add(event.key, event.value, event.metadata)
    if adapt:
        hparams = rounds.adapt_hparams(_class(benchmark).renamed_keys, ruleset, hparams)
    for key, value in hparams.items():
        if isinstance(value, tuple):
            add(key, value[0], value[1])
        else:
            add(key, value)
    add(C.INIT_STOP, event_type="INTERVAL_END")
    add(C.RUN_START, event_type="INTERVAL_START")
    add(C.BLOCK_START, None, {"first_epoch_num": 1, "epoch_count": 1}, "INTERVAL_START")
    add(C.BLOCK_STOP, None, {"first_epoch_num": 1}, "INTERVAL_END")
    add(C.EVAL_START, None, {C.EPOCH_NUM: 1}, "INTERVAL_START")
    target = checker.quality_target(
        ruleset, benchmark, global_batch_size=hparams[C.GLOBAL_BATCH_SIZE]
    )
    add(C.EVAL_ACCURACY, target.value, {C.EPOCH_NUM: 1, C.SAMPLES_COUNT: 1})
    add(C.EVAL_STOP, None, {C.EPOCH_NUM: 1}, "INTERVAL_END")
    add(C.RUN_STOP, None, {C.STATUS: C.SUCCESS}, "INTERVAL_END")
    return logs.write_log(path, out)


def _rounds(benchmark: str) -> tuple[str, ...]:
    return rounds.rounds_with(_class(benchmark))


CASES = [(b, r) for b in _CLASSES for r in _rounds(b)]


def test_every_listed_round_has_the_benchmark_in_the_official_rules():
    installed = checker.available_rulesets()
    for benchmark, ruleset in CASES:
        assert ruleset in installed, ruleset
        assert checker.has_rules(ruleset, benchmark), (benchmark, ruleset)
        with open(
            os.path.join(checker.rules_dir(), f"training_{ruleset}", "closed_common.yaml")
        ) as f:
            common = yaml.safe_load(f)
        allowed = next(
            e["KEY"]["CHECK"] for e in common if e["KEY"]["NAME"] == C.SUBMISSION_BENCHMARK
        )
        assert f"'{benchmark}'" in allowed, (benchmark, ruleset)
    # BERT's rule file is still shipped in 5.1.0 but the round does not accept the benchmark.
    assert "5.1.0" not in _rounds("bert") and checker.has_rules("5.1.0", "bert")
    assert rounds.default_ruleset(_class("resnet")) == "4.0.0"
    assert rounds.default_ruleset(_class("bert")) == "5.0.0"
    assert rounds.default_ruleset(_class("ssd")) == "1.1.0"
    assert rounds.default_ruleset(_class("transformer")) == "0.7.0"
    # Derived from the rule files where the benchmark declares none: the same rounds the suite
    # listed by hand before (SSD declares its own: the rule file of 2.0.0+ is RetinaNet's).
    assert _rounds("resnet") == rounds.rounds_with_rules("resnet")[:8]
    assert _rounds("llama31_8b") == ("5.1.0", "6.0.0", "6.1.0")
    assert "2.0.0" in rounds.rounds_with_rules("ssd") and "2.0.0" not in _rounds("ssd")


def test_initialized_tensors_are_the_rule_files_lists():
    assert len(rounds.initialized_tensors("resnet", "1.1.0")) == 161
    assert rounds.initialized_tensors("resnet", "1.1.0")[:3] == (
        "bn0_beta",
        "bn0_gamma",
        "conv0_weight",
    )
    assert len(rounds.initialized_tensors("bert", "2.0.0")) == 398
    assert "cls/seq_relationship/output_bias" in rounds.initialized_tensors("bert", "2.1.0")
    assert len(rounds.initialized_tensors("ssd", "1.1.0")) == 119
    assert rounds.initialized_tensors("resnet", "1.0.0") == ()
    assert rounds.initialized_tensors("resnet", "3.0.0") == ()
    assert rounds.initialized_tensors("transformer", "1.0.0") == ()  # no such rule file
    for name, ruleset in CASES:
        tensors = rounds.initialized_tensors(name, ruleset)
        assert len(set(tensors)) == len(tensors)  # each logged once: the rules compare sorted lists


def test_renamed_keys_follow_the_round():
    both = {"a": 1, rounds.OPT_EPSILON: 1e-6, rounds.OPT_LAMB_EPSILON: 1e-6}
    assert list(rounds.adapt_hparams(_class("bert").renamed_keys, "2.0.0", both)) == [
        "a",
        rounds.OPT_EPSILON,
    ]
    assert list(rounds.adapt_hparams(_class("bert").renamed_keys, "2.1.0", both)) == [
        "a",
        rounds.OPT_LAMB_EPSILON,
    ]
    old_only = {rounds.OPT_EPSILON: 1e-6, "b": 2}
    assert list(rounds.adapt_hparams(_class("bert").renamed_keys, "5.0.0", old_only)) == [
        rounds.OPT_LAMB_EPSILON,
        "b",
    ]
    assert rounds.adapt_hparams(_class("resnet").renamed_keys, "2.1.0", both) == both


def test_validate_ruleset_names_the_rounds_that_have_the_benchmark():
    from mlperf_tf.benchmark import Benchmark

    resnet = _class("resnet")
    rounds.validate_ruleset(resnet, "2.0.0")
    assert rounds.resolve_ruleset(resnet, "") == "4.0.0"
    assert rounds.resolve_ruleset(resnet, "2.0.0") == "2.0.0"
    # Third-party, declaring nothing: no round's rules have it, so no round's keys.
    mine = type("Mine", (Benchmark,), {"mlperf_benchmark": "my_benchmark"})
    assert rounds.resolve_ruleset(mine, "") == ""
    assert rounds.init_events("my_benchmark", "") == ()
    with pytest.raises(ValueError, match=r"'1.0.0'.*transformer.*0.7.0"):
        rounds.validate_ruleset(_class("transformer"), "1.0.0")
    with pytest.raises(ValueError, match="rounds with it: 0.7.0, 1.0.0, 1.1.0"):
        rounds.validate_ruleset(_class("ssd"), "2.0.0")  # RetinaNet from v2.0


def test_each_round_passes_the_keys_emitted_for_it(tmp_path, emitted_hparams):
    paths, expected = [], []
    for benchmark, ruleset in CASES:
        paths.append(_log(tmp_path / f"{benchmark}_{ruleset}.txt", benchmark, ruleset,
                          emitted_hparams[benchmark]))  # fmt: skip
        expected.append((benchmark, ruleset))
    with checker.OfficialRunner() as runner:
        reports = [
            checker.check_log(path, ruleset=ruleset, runner=runner)
            for path, (_, ruleset) in zip(paths, expected)
        ]
    failures = [
        (case, [m for m in r.official_messages])
        for case, r in zip(expected, reports)
        if not r.official_passed
    ]
    assert failures == []


@pytest.mark.parametrize(
    ("name", "ruleset"), [("resnet", "2.0.0"), ("bert", "1.1.0"), ("ssd", "1.1.0")]
)
def test_without_the_init_events_the_round_fails(tmp_path, emitted_hparams, name, ruleset):
    path = _log(tmp_path / "log.txt", name, ruleset, emitted_hparams[name],
                with_init_events=False)  # fmt: skip
    report = checker.check_log(path, ruleset=ruleset)
    assert not report.official_passed
    assert any("weights_initialization" in m for m in report.official_messages)


def test_bert_epsilon_under_another_rounds_name_fails(tmp_path, emitted_hparams):
    old_names = rounds.adapt_hparams(_class("bert").renamed_keys, "2.0.0", emitted_hparams["bert"])
    assert rounds.OPT_LAMB_EPSILON not in old_names
    path = _log(tmp_path / "log.txt", "bert", "3.0.0", old_names, adapt=False)
    report = checker.check_log(path, ruleset="3.0.0")
    assert not report.official_passed
    assert any("opt_lamb_epsilon" in m for m in report.official_messages)


def test_the_runner_emits_the_rounds_events_and_its_own_target(tmp_path):
    from mlperf_tf import runner
    from mlperf_tf.errors import UserError
    from tests.tiny_benchmark import TinyBenchmark, smoke  # MLPerf benchmark "resnet"

    def run(ruleset):
        config = runner.RunConfig(
            model_dir=str(tmp_path / (ruleset or "default")), steps_per_loop=3, ruleset=ruleset
        )
        return runner.run(TinyBenchmark(smoke()), config).mlperf_log

    with open(run("2.0.0")) as f:
        lines = f.read().splitlines()
    keys = [
        json.loads(line.split(":::MLLOG ", 1)[1])["key"] for line in lines if ":::MLLOG" in line
    ]
    tensors = [
        json.loads(line.split(":::MLLOG ", 1)[1])["metadata"]["tensor"]
        for line in lines
        if '"weights_initialization"' in line
    ]
    assert tensors == list(rounds.initialized_tensors("resnet", "2.0.0"))
    first, last = (
        keys.index("weights_initialization"),
        len(keys) - 1 - keys[::-1].index("weights_initialization"),
    )
    assert keys.index(C.INIT_START) < first and last < keys.index(C.INIT_STOP)
    assert '# mlperf-tf target {"quality_target": 2.0}' in lines
    with open(run("")) as f:  # the newest round with resnet, 4.0.0, asks for no tensors
        assert "weights_initialization" not in f.read()
    with pytest.raises(
        UserError, match=r"--ruleset: ruleset '5.0.0' has no MLPerf 'resnet'.*4.0.0"
    ):
        run("5.0.0")
    assert not (tmp_path / "5.0.0").exists()  # refused before anything started
