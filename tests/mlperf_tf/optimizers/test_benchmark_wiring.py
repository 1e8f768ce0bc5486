"""Registry optimizers picked by a benchmark config's `opt_name`, trained through the runner."""

import json
import os
import subprocess
import sys

import pytest
from mlperf_logging.mllog import constants as C

from benchmarks.resnet50 import config as resnet_config
from benchmarks.resnet50.benchmark import ResNet50Benchmark
from mlperf_tf import config as config_lib
from mlperf_tf import runner
from mlperf_tf.errors import UserError
from tests import processes
from tests.mlperf_tf.optimizers.test_registry import installed_optimizer  # noqa: F401


def _log(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in f if ":::MLLOG" in line]


def _resnet(opt_name, params=""):
    overrides = {"optimizer.opt_name": opt_name}
    if params:
        overrides["optimizer.opt_params"] = params
    return ResNet50Benchmark(config_lib.override(resnet_config.smoke(), overrides))


@pytest.mark.parametrize(
    "opt_name, params, logged",
    [  # fmt: skip
        # Extended (CI runs it after README's default run); the default run covers its case by
        # test_kfac.py (the optimizer's steps) and the contract's resnet50 smoke run (the wiring).
        pytest.param(
            "kfac",
            "kfac_factor_update_interval=1,kfac_inverse_update_interval=1",
            "kfac_damping",
            marks=pytest.mark.extended,
        ),
        # About a minute each on a loaded 2-core machine: the hook-free ones are slow tests.
        pytest.param(
            "neumann", "neumann_reset_interval=2", "neumann_norm_scope", marks=pytest.mark.slow
        ),
        pytest.param("nlcg", "nlcg_beta_rule=PR", "nlcg_beta_rule", marks=pytest.mark.slow),
    ],
)
def test_registry_optimizer_trains_resnet50_on_two_replicas(tmp_path, opt_name, params, logged):
    result = runner.run(
        _resnet(opt_name, params),
        runner.RunConfig(
            model_dir=str(tmp_path),
            distribution="mirrored",
            num_cpu_devices=2,
            steps_per_loop=2,
            max_train_steps=2,
        ),  # fmt: skip
    )
    assert result.steps == 2
    events = {e["key"]: e["value"] for e in _log(result.mlperf_log)}
    assert events[C.OPT_NAME] == opt_name and logged in events
    assert events[C.OPT_BASE_LR] == resnet_config.smoke().optimizer.lars_opt_base_learning_rate


def test_kfac_refuses_xla_with_a_user_error(tmp_path):
    with pytest.raises(UserError, match="without --xla"):
        runner.run(
            _resnet("kfac"),
            runner.RunConfig(model_dir=str(tmp_path), xla=True, max_train_steps=1),
        )


# Extended (CI runs it after README's default run); the default run covers its case by
# test_registry.py's third-party optimizer found and built, and the contract's resnet50 smoke run
# (the registry's LARS through the runner).
@pytest.mark.extended
def test_third_party_optimizer_runs_through_a_benchmark(installed_optimizer, tmp_path):  # noqa: F811
    env = {"PYTHONPATH": f"{installed_optimizer}{os.pathsep}{processes.REPO_ROOT}"}
    ran = subprocess.run(
        [sys.executable, "-m", "mlperf_tf.cli", "run", "--benchmark=resnet50", "--preset=smoke",
         f"--model_dir={tmp_path}", "--steps_per_loop=1", "--max_train_steps=2",
         "--config.optimizer.opt_name=tiny_sgd", "--config.optimizer.opt_params=tiny_scale=0.25"],
        cwd=processes.REPO_ROOT, env=processes.python_env(**env), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    events = {e["key"]: e["value"] for e in _log(str(tmp_path / "mlperf_log.txt"))}
    assert events[C.OPT_NAME] == "tiny_scaled_sgd" and events["tiny_scale"] == 0.25


@pytest.mark.parametrize(
    "benchmark_name, native", [("ssd", "sgd"), ("transformer", "adam"), ("bert", "lamb")]
)
def test_every_benchmark_builds_and_logs_a_registry_optimizer(benchmark_name, native):
    from mlperf_tf import registry as benchmarks

    cls = benchmarks.get(benchmark_name)
    overrides = {"optimizer.opt_name": "nlcg", "optimizer.opt_params": "nlcg_beta_rule=PR"}
    bench = cls(config_lib.override(cls.preset("smoke"), overrides))
    optimizer = bench.build_optimizer(bench.train_steps)
    assert type(optimizer).__name__ == "NLCG" and optimizer.beta_rule == "PR"
    hparams = bench.mlperf_hparams()
    assert hparams[C.OPT_NAME] == "nlcg" and hparams["nlcg_beta_rule"] == "PR"
    native_hparams = cls(cls.preset("smoke")).mlperf_hparams()
    # (SSD logs no opt_name of its own.)
    assert native_hparams.get(C.OPT_NAME, native) == native
    assert "nlcg_beta_rule" not in native_hparams
    with pytest.raises(config_lib.ConfigError, match="must be a registered optimizer"):
        config_lib.override(cls.preset("smoke"), {"optimizer.opt_name": "adafactor"})
