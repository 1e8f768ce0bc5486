"""Tests of the `mlperf-tf` command: listing, bad input as one-line errors, third-party benchmarks."""

import os
import subprocess
import sys

import pytest

from mlperf_tf import cli, registry
from mlperf_tf import config as config_lib
from tests import processes
from tests.refusals import the_error_line


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["run", "--benchmark=nosuch", "--model_dir=/tmp/x"], "unknown benchmark 'nosuch'"),
        (["run", "--benchmark=resnet50", "--preset=huge", "--model_dir=/tmp/x"], "no preset 'huge'"),
        (["run", "--benchmark=resnet50", "--model_dir=/tmp/x", "--no_such_flag=1"], "no_such_flag"),
        (["run", "--benchmark=resnet50", "--model_dir=/tmp/x", "--config.nope=1"], "'nope'"),
        (["run", "--benchmark=resnet50", "--model_dir=/tmp/x", "--config.global_batch_size=x"],
         "expects an int"),
        (["run", "--benchmark=resnet50", "--model_dir=/tmp/x", "--data_dir=/no/such/dir"],
         "/no/such/dir"),
        (["run", "--benchmark=resnet50", "--model_dir=/tmp/x", "--distribution=cloud"],
         "distribution"),
        (["run", "--model_dir=/tmp/x"], "--benchmark is required"),
        (["frobnicate"], "unknown command 'frobnicate'"),
        (["prepare", "nosuch"], "unknown benchmark 'nosuch'"),
    ],
)  # fmt: skip
def test_bad_input_is_one_error_line_and_exit_code_2(argv, needle, capsys):
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert needle in the_error_line(err, code, 2), err


def test_list_prints_every_builtin_with_its_presets(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert {"resnet50", "ssd", "transformer", "bert"} <= set(registry.available())
    for name in registry.available():
        line = next(line for line in out.splitlines() if line.startswith(name))
        assert "smoke" in line and "mini" in line and "mlperf" in line, line


def test_config_overrides_split_from_absl_flags():
    rest, overrides = config_lib.split_config_overrides(
        ["--preset=mini", "--config.optimizer.lars_opt_weight_decay=2e-4", "--xla"]
    )
    assert rest == ["--preset=mini", "--xla"]
    assert overrides == {"optimizer.lars_opt_weight_decay": "2e-4"}
    with pytest.raises(ValueError, match="--config.key=value"):
        config_lib.split_config_overrides(["--config.novalue"])


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory):
    """A third-party package, pip-installed into a folder, registering `tiny` by entry point."""
    return processes.install_plugin(
        tmp_path_factory, "tiny_plugin", "from tests.tiny_benchmark import TinyBenchmark\n",
        "mlperf_tf.benchmarks", "tiny = tiny_plugin:TinyBenchmark",
    )  # fmt: skip


# Extended (CI runs it after README's default run); the default run covers its case by the
# contract's cases of the installed example (test_contract.py -k efficientnet; CI's plug-in
# stage).
@pytest.mark.extended
def test_third_party_benchmark_is_listed_and_runs(installed_plugin, tmp_path):
    env = {"PYTHONPATH": f"{installed_plugin}{os.pathsep}{processes.REPO_ROOT}"}
    listed = subprocess.run(
        [sys.executable, "-m", "mlperf_tf.cli", "list"], cwd=processes.REPO_ROOT,
        env=processes.python_env(**env), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert any(line.startswith("tiny") and "smoke" in line for line in listed.stdout.splitlines())
    ran = subprocess.run(
        [sys.executable, "-m", "mlperf_tf.cli", "run", "--benchmark=tiny", "--preset=smoke",
         f"--model_dir={tmp_path}", "--steps_per_loop=5"],
        cwd=processes.REPO_ROOT, env=processes.python_env(**env), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    log_path = str(tmp_path / "mlperf_log.txt")
    assert f"MLPerf log: {log_path}" in ran.stdout
    with open(log_path, encoding="utf-8") as f:
        assert '"key": "run_stop"' in f.read()
