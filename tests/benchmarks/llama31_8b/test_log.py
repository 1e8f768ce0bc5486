"""The official checker over llama31_8b logs: the `mlperf` preset's keys pass every round with only
the target at stake, and a scaled-down run's log (smoke; the mini is the same) draws exactly two
findings, `max_sequence_length` and the target, each explained in one line by `check`."""

import pytest

from benchmarks.llama31_8b.benchmark import Llama31Benchmark
from compliance import checker
from mlperf_tf import runner
from tests.mlperf_tf.test_rounds import _hparams, _log

RULESETS = ("5.1.0", "6.0.0", "6.1.0")


@pytest.mark.parametrize("ruleset", RULESETS)
@pytest.mark.parametrize("value, passes", [(3.29, True), (3.31, False)])
def test_mlperf_preset_log_fails_only_on_a_missed_target(tmp_path, ruleset, value, passes):
    """A log of the `mlperf` preset's keys as the runner emits them (the rules read no weights,
    so none are trained: the log is shrunk to one block and one eval of value `value`)."""
    path = tmp_path / "log.txt"
    _log(path, "llama31_8b", ruleset, _hparams("llama31_8b"))
    text = path.read_text().replace('"value": 3.3,', f'"value": {value},')
    path.write_text(text)
    report = checker.check_log(str(path), ruleset=ruleset)
    assert report.official_passed == passes, report.format_text()
    errors = [f for f in report.errors if f.source == "official"]
    assert [f.check for f in errors] == ([] if passes else ["target"])


@pytest.fixture(scope="module")
def smoke_log(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("llama_smoke")
    result = runner.run(
        Llama31Benchmark(Llama31Benchmark.preset("smoke")),
        runner.RunConfig(model_dir=str(model_dir), distribution="one_device", steps_per_loop=8),
    )
    return result.mlperf_log


@pytest.mark.parametrize("ruleset", ["5.1.0", "6.0.0"])
def test_a_scaled_down_log_draws_exactly_the_sequence_length_and_the_target(smoke_log, ruleset):
    enforced = checker.check_log(smoke_log, ruleset=ruleset)
    official = [f for f in enforced.errors if f.source == "official"]
    assert sorted(f.check for f in official) == ["official", "target"], enforced.format_text()
    assert "max_sequence_length" in next(f.message for f in official if f.check == "official")
    # --quality=skip (a run with its own scale and target): both explained, one line each.
    skipped = checker.check_log(smoke_log, ruleset=ruleset, quality="skip")
    assert skipped.passed, skipped.format_text()
    explained = [f for f in skipped.warnings if f.check in ("scaled", "target")]
    assert sorted(f.check for f in explained) == ["scaled", "target"]
    scaled = next(f for f in explained if f.check == "scaled")
    assert scaled.message.startswith("max_sequence_length scaled down by the run (sequence 32")
    assert "v['value'] == 8192" in scaled.message and "\n" not in scaled.message
