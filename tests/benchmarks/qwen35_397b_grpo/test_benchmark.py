"""Tests of the benchmark's declared facts: the `mlperf` preset's logged keys and evaluation
schedule against the 6.1.0 rules' formulas, sizes without allocating, the RCP batches, and the
one-line errors (a batch with no RCP, a prompt over the length limit)."""

import dataclasses
import json
import math
import types

import numpy as np
import pytest

from benchmarks.qwen35_397b_grpo import config, environments
from benchmarks.qwen35_397b_grpo.benchmark import (
    AgeGuard,
    GenerationWarmUp,
    Qwen35GrpoBenchmark,
    tracked_stats,
)
from mlperf_tf.benchmark import RunContext
from mlperf_tf.config import ConfigError
from mlperf_tf.errors import UserError
from mlperf_tf.mllog import MLPerfLogger
from mlperf_tf.parallel.mesh import DeviceMesh
from mlperf_tf.rl.chat import ByteChat
from mlperf_tf.rl.rollout import run_rollouts
from mlperf_tf.runner.actions import LoopOutput
from tests.benchmarks.qwen35_397b_grpo.test_config import _rcps, _rules


def test_mlperf_preset_logs_the_rules_values():
    bench = Qwen35GrpoBenchmark(Qwen35GrpoBenchmark.preset("mlperf"))
    h = bench.logged_hparams()
    assert h["global_batch_size"] == 256 and h["num_prompts_per_step"] == 16
    assert h["num_generations_per_prompt"] == 16
    assert h["opt_base_learning_rate"] == 1e-6 and h["opt_gradient_clip_norm"] == 0.125
    assert (h["opt_name"], h["opt_learning_rate_decay_schedule"]) == ("adamw", "constant")
    assert h["max_sequence_length"] == 65536 and h["init_checkpoint_step"] == 0
    points = bench.eval_schedule()
    assert [p.step for p in points] == list(range(18, 31))
    assert [p.samples_count for p in points[:2]] == [4608, 4864]
    assert 396e9 < bench.parameter_count() < 398e9
    # Every held-out row, as the reference validates (its RCP logs' pass@4 are 256ths); the
    # one key off the pinned rules (251), noted so that `check` names it.
    assert h["eval_samples"] == 256 == bench.config.rollout.eval_tasks
    assert bench.eval_steps(1) * bench.config.eval_batch_size >= 256
    assert list(bench.scaled_settings()) == ["eval_samples"]
    assert "251" in bench.scaled_settings()["eval_samples"]
    # Logged beside the rules' keys, as the reference's RCP logs have them (GBS256/seed_1.out:
    # seq-mask-tis, 1.002, 0.999, an end rate of 1e-6); its generation backend and layout are
    # vLLM's at TP8 EP8, ours this run's mesh.
    assert (
        h["truncated_importance_sampling_type"], h["truncated_importance_sampling_ratio"],
        h["truncated_importance_sampling_ratio_min"], h["opt_end_learning_rate"],
    ) == ("seq-mask-tis", 1.002, 0.999, 1e-6)  # fmt: skip
    assert h["generation_backend"] == "tensorflow"
    split = Qwen35GrpoBenchmark(
        bench.config, context=RunContext(mesh=DeviceMesh(data=2, expert=4, model=2))
    ).logged_hparams()
    assert [split[f"generation_{a}_parallelism"] for a in ("tensor", "expert", "pipeline")] == [
        2, 4, 1,
    ]  # fmt: skip


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


def test_each_loop_logs_the_references_tracked_stats(tmp_path):
    """Two `tracked_stats` events a host loop, as the reference's logs hold a step's: the loss
    and reward, then the step's time split into generation the update waited for and the rest;
    per-step means over a loop of 2 steps, at the loop's last step and its samples."""
    bench = Qwen35GrpoBenchmark(Qwen35GrpoBenchmark.preset("mini"))
    action, guard, _ = bench.run_actions()
    assert isinstance(guard, AgeGuard)  # the async schedule's (test_age.py)
    path = tmp_path / "log.txt"
    mllog = MLPerfLogger(str(path))
    action.attach(types.SimpleNamespace(mllog=mllog))
    output = LoopOutput(
        step=4, steps=2, loss=-0.5, seconds=10.0, samples_per_second=25.6, last_step=37,
        epoch=0.1, input_wait_s=6.0,
        metrics={"reward": np.float32(0.25), "is_oob_ratio": 0.0,
                 "global_valid_toks": np.float32(400.0), "global_valid_seqs": 120.0},
    )  # fmt: skip
    action.after_loop(output)
    mllog.close()
    lines = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in path.read_text().splitlines()]
    stats = [r for r in lines if r["key"] == "tracked_stats"]
    assert [r["value"] for r in stats] == [
        {"reduced_train_loss": -0.5, "reward": 0.25, "global_valid_toks": 400.0,
         "global_valid_seqs": 120.0},
        {"train_step_time": 5.0, "policy_training_time": 2.0, "exposed_generation_time": 3.0,
         "weight_sync_time": 0.0, "valid_tokens_per_sec_per_gpu": 80.0},  # one chip
    ]  # fmt: skip
    for record in stats:
        assert record["metadata"]["samples_count"] == 4 * bench.config.global_batch_size
        assert record["metadata"]["step"] == 4
    # The reference's formula on its own numbers (GBS256/seed_1.out, step 1): 256 GPUs.
    step_1 = LoopOutput(
        step=1, steps=1, loss=0.0, seconds=471.2140495249769, samples_per_second=0.5, last_step=30,
        epoch=0.0, input_wait_s=0.0,
        metrics={"reward": 0.0, "global_valid_toks": 1280272.0, "global_valid_seqs": 250.0},
    )  # fmt: skip
    per_gpu = tracked_stats(step_1, chips=256)[1]["valid_tokens_per_sec_per_gpu"]
    assert per_gpu == pytest.approx(10.613143867508809, rel=1e-9)


def test_the_step_counts_the_references_valid_tokens_and_rollouts():
    """`global_valid_toks` and `global_valid_seqs` of two micro-batches as the runner reduces a
    step's metrics (their mean over micro-batches and batch shards): the step's policy tokens
    and the rollouts the overlong filter kept (3 of 4)."""
    bench = Qwen35GrpoBenchmark(
        dataclasses.replace(Qwen35GrpoBenchmark.preset("smoke"), gradient_accumulation_steps=2)
    )
    model = bench.build_model()
    rng = np.random.default_rng(0)
    rows, length = 2, 6
    found = []
    for mask in ([1.0, 0.0], [1.0, 1.0]):
        ids = rng.integers(0, bench.config.model.vocab_size, (rows, length + 1))
        batch = {
            "input_ids": ids[:, :-1].astype(np.int32), "targets": ids[:, 1:].astype(np.int32),
            "token_mask": np.ones((rows, length), np.float32),
            "generation_logprobs": np.full((rows, length), -5.0, np.float32),
            "advantages": np.array([0.5, -0.5], np.float32),
            "sample_mask": np.array(mask, np.float32), "rewards": np.zeros(rows, np.float32),
            "valid_tokens": np.full(rows, 18.0, np.float32),
            "trajectory_age": np.zeros(rows, np.float32),
        }  # fmt: skip
        _, metrics = bench.compute_loss_and_metrics(model, batch)
        found.append({k: float(metrics[k]) for k in ("global_valid_toks", "global_valid_seqs")})
    step = {k: np.mean([f[k] for f in found]) for k in found[0]}
    assert step == {"global_valid_toks": 18.0, "global_valid_seqs": 3.0}


def test_a_padded_validation_batch_counts_only_its_real_tasks(monkeypatch):
    """pass@k through the runner's evaluator is the same whether or not the last validation
    batch is padded (the padding tasks repeat a real one and are marked invalid), and equals
    pass@k of the rewards themselves. The rollouts are replaced by rewards fixed by each
    rollout's id (its task's index times k plus its generation), which padding does not move;
    the contract's padded evaluation (extended) decodes them."""
    from benchmarks.qwen35_397b_grpo import input as input_lib
    from mlperf_tf import runner

    def rollouts(model, envs, group, *, ids, **kwargs):
        assert len(ids) == len(group)
        return [types.SimpleNamespace(reward=float(i % 5 in (0, 3)), invalid=False) for i in ids]

    monkeypatch.setattr(input_lib, "run_rollouts", rollouts)
    smoke = Qwen35GrpoBenchmark.preset("smoke")
    smoke = dataclasses.replace(
        smoke, eval_examples=5, rollout=dataclasses.replace(smoke.rollout, eval_tasks=5)
    )
    k = smoke.grpo.num_val_generations_per_prompt
    rewards = np.array([i % 5 in (0, 3) for i in range(5 * k)]).reshape(5, k)
    expected = rewards.any(axis=1).mean()
    assert 0 < expected < 1
    whole = Qwen35GrpoBenchmark(dataclasses.replace(smoke, eval_batch_size=5))
    model = whole.build_model()
    padded = Qwen35GrpoBenchmark(dataclasses.replace(smoke, eval_batch_size=4))
    assert padded.eval_steps(1) == 2
    assert runner.evaluate_only(whole, model) == pytest.approx(expected)
    assert runner.evaluate_only(padded, model) == pytest.approx(expected)


def test_a_rollout_cut_by_the_agent_timeout_stops_the_run_in_one_line(monkeypatch):
    """The reference README: no rollout may be cut by the agent timeout (it is no sample, and
    the timeout is to be set so that none is): the training and validation batches refuse
    one, naming where and the setting; `test_r2egym.py` cuts one for real."""
    from benchmarks.qwen35_397b_grpo import input as input_lib

    def rollouts(model, envs, group, **kwargs):
        return [types.SimpleNamespace(reward=0.0, invalid=i == 1) for i in range(len(group))]

    monkeypatch.setattr(input_lib, "run_rollouts", rollouts)
    smoke = Qwen35GrpoBenchmark.preset("smoke")
    with pytest.raises(UserError) as e:
        next(input_lib.validation_batches(None, smoke, batch_tasks=3, seed=0))
    assert str(e.value) == (
        "validation tasks 1-3: 1 of 6 rollouts were cut by the agent timeout (1800 s), and the "
        "rules count no such rollout; raise --config.env.agent_timeout_s so that every rollout "
        "ends by itself"
    )
    with pytest.raises(UserError, match=r"^training step 1: 1 of 4 rollouts were cut"):
        next(input_lib.rollout_steps(None, smoke, seed=0))


def test_the_mlperf_presets_chat_is_checked_before_loading(tmp_path):
    """The `mlperf` preset's rollouts speak the checkpoint's own tokenizer and chat template
    with the reference's prompts (`input.make_chat`): what is missing for them is one line
    before the checkpoint's weights are read; the minis speak bytes."""
    mlperf = Qwen35GrpoBenchmark.preset("mlperf")
    missing = str(tmp_path / "no")
    for changes, message in (
        ({"init_checkpoint": ""}, "set --config.init_checkpoint to the Hugging Face folder"),
        ({"init_checkpoint": missing}, r"^`env.gym_root` is empty"),
        ({"init_checkpoint": missing, "env": dataclasses.replace(mlperf.env, kind="repair")},
         f"^{missing}: no tokenizer.json"),
    ):  # fmt: skip
        bench = Qwen35GrpoBenchmark(dataclasses.replace(mlperf, **changes))
        with pytest.raises(UserError, match=message) as e:
            bench.prepare_initial_weights()
        assert "\n" not in str(e.value)
    Qwen35GrpoBenchmark(Qwen35GrpoBenchmark.preset("smoke")).prepare_initial_weights()  # bytes


@pytest.mark.parametrize("preset", ["smoke", "mini"])
def test_the_generators_warm_up_covers_the_runs_batches_and_settings(preset):
    """`GenerationWarmUp` (before `run_start`) asks the compiled generator for a step's
    rollouts at the training sampling and a validation batch's at the validation sampling,
    shrinking as multi-turn rollouts finish (the mini's 6 turns; the smoke's one turn does
    not shrink); nothing with the runner's warm-up off or an eager policy."""
    calls = []

    class Policy:
        def warm_up(self, batches, **kw):
            calls.append((batches, kw))

    bench = Qwen35GrpoBenchmark(Qwen35GrpoBenchmark.preset(preset))
    c = bench.config
    controller = types.SimpleNamespace(run_config=types.SimpleNamespace(warm_up=True))
    for policy, warm_up in ((Policy(), False), (object(), True), (Policy(), True)):
        bench._policy = policy
        controller.run_config.warm_up = warm_up
        GenerationWarmUp(bench).attach(controller)
    val = c.eval_batch_size * c.grpo.num_val_generations_per_prompt
    assert calls == [(
        [(c.global_batch_size, 1.0, 1.0), (val, 0.1, 0.95)],
        {"token": 0, "shrinking": preset == "mini"},
    )]  # fmt: skip
    assert GenerationWarmUp in {type(a) for a in bench.run_actions()}
