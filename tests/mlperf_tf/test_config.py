"""Tests of typed config overrides and the eval schedule."""

import dataclasses
from typing import Literal

import pytest

from mlperf_tf import config as config_lib
from mlperf_tf.benchmark import epoch_eval_schedule
from mlperf_tf.config import BenchmarkConfig, ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class Optimizer:
    name: Literal["lars", "sgd"] = "lars"
    lars_opt_weight_decay: float = 1e-4
    exclude: tuple[str, ...] = ("bias", "gamma")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cfg(BenchmarkConfig):
    optimizer: Optimizer = Optimizer()
    use_bn: bool = True
    checkpoint: str | None = None


def _cfg():
    return Cfg(global_batch_size=8, eval_batch_size=8, train_examples=80, eval_examples=16,
               max_epochs=2)  # fmt: skip


def test_overrides_parse_to_the_field_types():
    cfg = config_lib.override(
        _cfg(),
        {"optimizer.lars_opt_weight_decay": "5e-5", "optimizer.name": "sgd", "use_bn": "false",
         "global_batch_size": "16", "optimizer.exclude": "bias,beta", "checkpoint": "/x"},
    )  # fmt: skip
    assert cfg.optimizer.lars_opt_weight_decay == 5e-5
    assert cfg.optimizer.name == "sgd"
    assert cfg.use_bn is False
    assert cfg.global_batch_size == 16
    assert cfg.optimizer.exclude == ("bias", "beta")
    assert cfg.checkpoint == "/x"
    assert _cfg().optimizer.name == "lars"  # frozen: the original is untouched


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("optimizer.lars_weight_decay", "1", "unknown config key 'optimizer.lars_weight_decay'"),
        ("nope", "1", "unknown config key 'nope'"),
        ("global_batch_size", "many", "expects an int"),
        ("use_bn", "maybe", "expects a bool"),
        ("optimizer.name", "adam", "must be one of"),
        ("optimizer", "x", "is a group"),
        ("global_batch_size", "0", "must be a positive integer"),
    ],
)
def test_bad_overrides_are_one_line_config_errors(key, value, message):
    with pytest.raises(ConfigError, match=message) as info:
        config_lib.override(_cfg(), {key: value})
    assert "\n" not in str(info.value)


def test_accumulation_must_divide_the_batch():
    with pytest.raises(ConfigError, match="divisible"):
        config_lib.override(_cfg(), {"gradient_accumulation_steps": "3"})


def test_epoch_schedule_with_offset_numbers_blocks_from_one():
    points = epoch_eval_schedule(steps_per_epoch=10, max_epochs=10, every_epochs=4,
                                 offset_epochs=1)  # fmt: skip
    # The offset is the epoch of the first eval (MLPerf ResNet's `eval_offset_epochs`).
    assert [(p.step, p.epoch_num, p.first_epoch_num, p.epoch_count) for p in points] == [
        (10, 1, 1, 1), (50, 5, 2, 4), (90, 9, 6, 4), (100, 10, 10, 1),
    ]  # fmt: skip
    no_offset = epoch_eval_schedule(steps_per_epoch=10, max_epochs=10, every_epochs=4)
    assert [p.epoch_num for p in no_offset] == [4, 8, 10]
    with pytest.raises(ValueError, match="every_epochs"):
        epoch_eval_schedule(steps_per_epoch=1, max_epochs=1, every_epochs=0)
    with pytest.raises(ValueError, match="offset_epochs"):
        epoch_eval_schedule(steps_per_epoch=1, max_epochs=9, every_epochs=4, offset_epochs=4)


def test_smoke_sizes_are_the_shared_few_steps_on_synthetic_data():
    sizes = config_lib.smoke_sizes(eval_batch_size=4, eval_examples=12, quality_target=0.5)
    config = BenchmarkConfig(**sizes)
    assert config.synthetic
    assert config.steps_per_epoch == config_lib.SMOKE_STEPS
    assert (config.eval_batch_size, config.eval_examples, config.quality_target) == (4, 12, 0.5)
