"""Tests of the benchmark's settings: the reference's numbers and GBS rules against the 6.1.0
rules and RCP file in the installed `mlperf_logging`, and one-line errors for bad settings."""

import json
import os

import mlperf_logging
import pytest
import yaml

from benchmarks.qwen35_397b_grpo import config
from mlperf_tf.config import ConfigError


def _rcps():
    path = os.path.join(os.path.dirname(mlperf_logging.__file__), config.RCP_FILE)
    with open(path) as f:
        return json.load(f)


def _rules():
    path = os.path.join(
        os.path.dirname(mlperf_logging.__file__),
        "compliance_checker/training_6.1.0/closed_qwen35_397b_grpo.yaml",
    )
    with open(path) as f:
        return {entry["KEY"]["NAME"]: entry["KEY"] for entry in yaml.safe_load(f) if "KEY" in entry}


@pytest.mark.parametrize("gbs", [256, 512, 1024])
def test_gbs_rules_match_the_rcps(gbs):
    (rcp,) = [r for r in _rcps().values() if r["BS"] == gbs]
    hp = rcp["Hyperparams"]
    assert config.learning_rate(gbs) == pytest.approx(hp["opt_base_learning_rate"], rel=1e-9)
    assert config.gradient_clip(gbs) == pytest.approx(hp["opt_gradient_clip_norm"], rel=1e-9)
    grpo = config.GrpoConfig(num_prompts_per_step=hp["num_prompts_per_step"])
    assert grpo.global_batch_size == gbs
    # The RCPs converge at the first scheduled validation (README section 5).
    assert config.first_validation_step(gbs) * gbs == min(rcp["Epochs to converge"])


def test_first_validation_steps_of_the_readme():
    assert [config.first_validation_step(g) for g in (256, 512, 1024)] == [18, 10, 7]


def test_defaults_are_the_rules_values():
    rules = _rules()
    grpo = config.GrpoConfig()
    assert "v['value'] == 16" in rules["num_generations_per_prompt"]["CHECK"][0]
    assert grpo.num_generations_per_prompt == 16
    assert str(config.EVAL_SAMPLES) in rules["eval_samples"]["CHECK"]
    assert str(config.MLPERF_SEQUENCE_LENGTH) in rules["max_sequence_length"]["CHECK"]
    assert (grpo.training_temperature, grpo.training_top_p) == (1.0, 1.0)
    assert (grpo.validation_temperature, grpo.validation_top_p) == (0.1, 0.95)
    loss = grpo.loss
    assert (loss.ratio_clip_min, loss.ratio_clip_max, loss.force_on_policy_ratio) == (
        0.2, 0.28, True,
    )  # fmt: skip
    assert loss.truncated_importance_sampling_type == "seq-mask-tis"
    assert (
        loss.truncated_importance_sampling_ratio_min,
        loss.truncated_importance_sampling_ratio,
    ) == (0.999, 1.002)
    assert grpo.seq_logprob_error_threshold == 2.0
    opt = config.OptimizerConfig()
    assert (opt.opt_adamw_weight_decay, opt.opt_adamw_beta_1, opt.opt_adamw_beta_2) == (
        0.0, 0.9, 0.999,
    )  # fmt: skip


@pytest.mark.parametrize(
    "cls,field,value",
    [
        (config.GrpoConfig, "num_generations_per_prompt", 1),
        (config.GrpoConfig, "validation_top_p", 0.0),
        (config.GrpoConfig, "num_prompts_per_step", 0),
        (config.EnvironmentConfig, "kind", "docker"),
        (config.EnvironmentConfig, "tool_timeout_s", -1.0),
        (config.OptimizerConfig, "opt_adamw_beta_1", 1.5),
        (config.ModelConfig, "weight_scale", 0.0),
        (config.RolloutConfig, "decode_rows", 12),
    ],
)
def test_bad_settings_are_one_line_errors(cls, field, value):
    with pytest.raises(ConfigError, match=field) as info:
        cls(**{field: value})
    assert "\n" not in str(info.value)
