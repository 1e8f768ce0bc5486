"""Tests the ResNet-50 config: presets, typed overrides and validation."""

import dataclasses

import pytest

from benchmarks.resnet50 import config as rc
from mlperf_tf import paths
from mlperf_tf.config import ConfigError, override


@pytest.mark.parametrize("preset", [rc.mlperf, rc.mini, rc.smoke])
def test_presets_build_and_document_command(preset):
    cfg = preset()
    assert isinstance(cfg, rc.ResNet50Config)
    assert "mlperf-tf run --benchmark=resnet50" in preset.__doc__
    assert cfg.global_batch_size % cfg.gradient_accumulation_steps == 0


def test_mlperf_preset_is_the_mlcommons_tf2_reference():
    cfg = rc.mlperf()
    opt = cfg.optimizer
    assert (cfg.global_batch_size, cfg.gradient_accumulation_steps) == (4096, 1)
    assert (cfg.train_examples, cfg.eval_examples) == (1281167, 50000)
    assert cfg.quality_target == 0.759
    assert (cfg.eval_every_epochs, cfg.eval_offset_epochs, cfg.max_epochs) == (4, 2, 42)
    assert opt.opt_name == "lars"
    assert opt.lars_opt_base_learning_rate == 10.0
    assert opt.lars_opt_end_learning_rate == 1e-4
    assert opt.lars_opt_learning_rate_decay_poly_power == 2
    assert opt.lars_opt_learning_rate_warmup_epochs == 5
    assert opt.lars_opt_weight_decay == 2e-4
    assert opt.lars_opt_momentum == 0.9 and opt.lars_epsilon == 0.0
    assert opt.label_smoothing == 0.1
    assert cfg.model.num_classes == 1000 and cfg.model.block_layers == (3, 4, 6, 3)
    assert cfg.model.bn_momentum == 0.9 and cfg.model.zero_init_last_gamma
    assert cfg.data.image_size == 224 and cfg.data.crop_padding == 32
    assert cfg.data.label_offset == 1


def test_mini_uses_the_mini_data_dir_and_sizes(monkeypatch, tmp_path):
    monkeypatch.setenv(paths.DATA_ENV, str(tmp_path))
    cfg = rc.mini()
    assert cfg.data_dir == paths.mini_data_dir("resnet50")
    assert cfg.data_dir.startswith(str(tmp_path))
    assert (cfg.train_examples, cfg.eval_examples) == (1437, 360)
    assert cfg.quality_target == 0.90
    assert cfg.model.num_classes == 10


def test_smoke_is_synthetic():
    assert rc.smoke().synthetic
    assert not rc.mini().synthetic


def test_overrides_parse_to_field_types():
    cfg = override(
        rc.mlperf(),
        {
            "optimizer.opt_name": "sgd",
            "optimizer.sgd_opt_base_learning_rate": "2.048",
            "data.area_range": "0.1,1.0",
            "model.bn_group_size": "4",
            "data.random_flip": "false",
            "eval_offset_epochs": "3",
        },
    )
    assert cfg.optimizer.opt_name == "sgd"
    assert cfg.optimizer.base_learning_rate == 2.048
    assert cfg.data.area_range == (0.1, 1.0)
    assert cfg.model.bn_group_size == 4
    assert cfg.data.random_flip is False
    assert cfg.eval_offset_epochs == 3


def test_optimizer_properties_follow_opt_name():
    lars = rc.OptimizerConfig()
    sgd = dataclasses.replace(lars, opt_name="sgd")
    assert lars.warmup_epochs == lars.lars_opt_learning_rate_warmup_epochs
    assert sgd.warmup_epochs == sgd.opt_learning_rate_warmup_epochs
    assert sgd.weight_decay == sgd.sgd_opt_weight_decay
    assert lars.momentum == lars.lars_opt_momentum


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        ("optimizer.opt_name", "adafactor", "must be a registered optimizer"),
        ("optimizer.lars_opt_weight_decay", "-1", "lars_opt_weight_decay"),
        ("optimizer.lars_opt_momentum", "1.0", "lars_opt_momentum"),
        ("optimizer.label_smoothing", "1.5", "label_smoothing"),
        ("model.bn_group_size", "0", "bn_group_size"),
        ("model.block_layers", "3,0,6", "block_layers"),
        ("model.bn_momentum", "1.0", "bn_momentum"),
        ("data.area_range", "0.5,0.1", "area_range"),
        ("data.area_range", "0.5,1.5", "area_range"),
        ("data.mean_rgb", "1,2", "mean_rgb"),
        ("data.stddev_rgb", "1,0,1", "stddev_rgb"),
        ("eval_offset_epochs", "4", "eval_offset_epochs"),
        ("eval_every_epochs", "0", "eval_every_epochs"),
        ("model.nope", "1", "unknown config key"),
    ],
)
def test_bad_values_raise_config_error_naming_the_key(key, value, fragment):
    with pytest.raises(ConfigError, match=fragment):
        override(rc.mlperf(), {key: value})
