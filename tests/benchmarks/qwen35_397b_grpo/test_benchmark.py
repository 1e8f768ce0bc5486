"""Tests of the benchmark's declared facts: the `mlperf` preset's logged keys and evaluation
schedule against the 6.1.0 rules' formulas, sizes without allocating, the RCP batches, and the
one-line errors (a batch with no RCP, a prompt over the length limit)."""

import dataclasses
import math

import pytest

from benchmarks.qwen35_397b_grpo import config, environments
from benchmarks.qwen35_397b_grpo.benchmark import Qwen35GrpoBenchmark
from mlperf_tf.config import ConfigError
from mlperf_tf.errors import UserError
from mlperf_tf.rl.generation import ByteChat
from mlperf_tf.rl.rollout import run_rollouts
from tests.benchmarks.qwen35_397b_grpo.test_config import _rcps, _rules


def test_mlperf_preset_logs_the_rules_values():
    bench = Qwen35GrpoBenchmark(Qwen35GrpoBenchmark.preset("mlperf"))
    h = bench.logged_hparams()
    assert h["global_batch_size"] == 256 and h["num_prompts_per_step"] == 16
    assert h["num_generations_per_prompt"] == 16 and h["eval_samples"] == 251
    assert h["opt_base_learning_rate"] == 1e-6 and h["opt_gradient_clip_norm"] == 0.125
    assert (h["opt_name"], h["opt_learning_rate_decay_schedule"]) == ("adamw", "constant")
    assert h["max_sequence_length"] == 65536 and h["init_checkpoint_step"] == 0
    points = bench.eval_schedule()
    assert [p.step for p in points] == list(range(18, 31))
    assert [p.samples_count for p in points[:2]] == [4608, 4864]
    assert bench.scaled_settings() == {}
    assert 396e9 < bench.parameter_count() < 398e9


def test_mini_preset_fails_no_rule_but_the_sequence_length():
    """The 6.1.0 rules' own CHECK expressions (closed_qwen35_397b_grpo.yaml) on the mini's
    logged values and evaluation schedule: only `max_sequence_length` fails."""
    bench = Qwen35GrpoBenchmark(Qwen35GrpoBenchmark.preset("mini"))
    h = bench.logged_hparams()
    rules = _rules()
    s = {"target_accuracy": 0.69}
    v = {"value": h["global_batch_size"]}
    exec(rules["global_batch_size"]["POST"], {"math": math, "s": s, "v": v})  # noqa: S102
    s["num_prompts_per_step"] = h["num_prompts_per_step"]
    scope = {"math": math, "s": s, "is_integer": lambda x: isinstance(x, int)}
    failed = []
    for name, rule in rules.items():
        checks = rule.get("CHECK", [])
        if name == "eval_accuracy" or not checks:
            continue
        for check in [checks] if isinstance(checks, str) else checks:
            if not eval(check, {**scope, "v": {"value": h[name]}}):  # noqa: S307
                failed.append(name)
    assert failed == ["max_sequence_length"]
    assert set(bench.scaled_settings()) == {"max_sequence_length"}
    points = bench.eval_schedule()
    assert points[0].samples_count == s["validation_start_samples"] == 33 * 128
    assert [p.samples_count for p in points] == [
        s["validation_start_samples"] + i * 128 for i in range(len(points))
    ]
    assert config.MINI_TARGET_PASS_AT_4 > s["target_accuracy"]
    assert bench.config.model.weight_scale == config.MINI_WEIGHT_SCALE > 1


def test_rcp_batches_are_the_files():
    assert tuple(sorted(r["BS"] for r in _rcps().values())) == config.RCP_BATCH_SIZES


def test_a_batch_without_rcp_is_one_line():
    grpo = dataclasses.replace(config.GrpoConfig(), num_prompts_per_step=8)
    with pytest.raises(ConfigError, match="convergence points") as info:
        dataclasses.replace(config.mlperf(), global_batch_size=128, grpo=grpo)
    assert "\n" not in str(info.value)


def test_a_prompt_over_the_limit_is_one_line():
    env = environments.SyntheticEnvironment()
    with pytest.raises(UserError, match="prompt is"):
        run_rollouts(None, [env], ["x" * 100], chat=ByteChat(), max_turns=1, max_turn_tokens=4,
                     max_length=50, temperature=1.0, top_p=1.0, seed=0)  # fmt: skip


def test_cli_run_of_the_mini_writes_no_mini_dataset(tmp_path, monkeypatch):
    """`mlperf-tf run --preset=mini` of a mini that reads no data folder (its tasks are
    generated) goes on to the run's preflight without calling `prepare_mini` (it has none:
    the first real mini run stopped there)."""
    from mlperf_tf import cli, runner

    class PreflightError(Exception):
        pass

    def preflight(benchmark, run_config):
        raise PreflightError

    def no_mini_dataset(data_dir):
        raise AssertionError(f"prepare_mini({data_dir!r}) called")

    monkeypatch.setattr(runner, "preflight", preflight)
    monkeypatch.setattr(Qwen35GrpoBenchmark, "prepare_mini", staticmethod(no_mini_dataset))
    with pytest.raises(PreflightError):
        cli.main(["run", "--benchmark=qwen35_397b_grpo", "--preset=mini",
                  f"--model_dir={tmp_path}"])  # fmt: skip
