"""Tests of the EfficientNet plug-in (`examples/efficientnet`), installed as a user would install it.

The package is pip-installed into a temporary folder (not into the suite), so these tests show
that a benchmark outside the suite's packages joins through the entry point alone: it is listed,
its smoke preset runs through `mlperf-tf run`, and its log gets a clean verdict.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from tests import processes

PACKAGE_SOURCE = os.path.join(processes.REPO_ROOT, "examples", "efficientnet")


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory):
    """The plug-in pip-installed into a fresh folder, which is then put on sys.path."""
    target = tmp_path_factory.mktemp("efficientnet_site")
    processes.pip_install_target(PACKAGE_SOURCE, target)
    sys.path.insert(0, str(target))
    yield target
    sys.path.remove(str(target))
    for name in [m for m in sys.modules if m.startswith("mlperf_tf_efficientnet")]:
        del sys.modules[name]


def _trainable(model) -> int:
    return sum(int(np.prod(w.shape)) for w in model.trainable_weights)


@pytest.mark.parametrize(
    "variant, reference",
    [("b0", keras.applications.EfficientNetB0), ("b3", keras.applications.EfficientNetB3)],
)
def test_variants_match_keras_applications_parameter_counts(plugin_site, variant, reference):
    """B0 and B3 (one config field apart) have exactly the trainable parameters of Keras'
    reference EfficientNets: the stage table, compound scaling and rounding are Tan & Le's."""
    from mlperf_tf_efficientnet import config, model
    from mlperf_tf_efficientnet.benchmark import EfficientNetBenchmark

    ours = model.efficientnet(config.ModelConfig(variant=variant), image_size=32)
    theirs = reference(weights=None, input_shape=(32, 32, 3))
    assert _trainable(ours) == _trainable(theirs)
    assert ours.output_shape == (None, 1000)
    # The declared count (from the stage table, no weights) is the built model's.
    declared = EfficientNetBenchmark(
        config.EfficientNetConfig(model=config.ModelConfig(variant=variant))
    ).parameter_count()
    assert declared == _trainable(ours)


def test_round_filters_follows_the_reference_rule(plugin_site):
    from mlperf_tf_efficientnet.model import round_filters, round_repeats

    assert round_filters(32, 1.0) == 32
    assert round_filters(32, 1.1) == 32  # 35.2 rounds to 32, within 10 %
    assert round_filters(1280, 2.0) == 2560
    assert round_filters(16, 1.4) == 24  # 22.4 -> 24 (nearest multiple of 8)
    assert round_repeats(3, 3.1) == 10  # ceil(9.3)


def test_stochastic_depth_drops_whole_examples_and_keeps_the_mean(plugin_site):
    from mlperf_tf_efficientnet.model import StochasticDepth

    layer = StochasticDepth(0.5, seed=3)
    x = np.ones((2000, 2, 2, 3), np.float32)
    assert np.array_equal(np.asarray(layer(x, training=False)), x)
    y = np.asarray(layer(x, training=True))
    per_example = y.reshape(2000, -1)
    # Each example is either dropped whole (0) or kept and scaled by 1/(1 - rate) = 2.
    assert set(np.unique(per_example)) <= {0.0, 2.0}
    assert np.all(per_example.min(axis=1) == per_example.max(axis=1))
    assert abs(y.mean() - 1.0) < 0.1


def test_bad_variant_is_a_config_error_naming_it(plugin_site):
    from mlperf_tf_efficientnet import config

    from mlperf_tf.config import ConfigError

    with pytest.raises(ConfigError, match="b9"):
        config.ModelConfig(variant="b9")


# 20 s: by default a third-party plug-in is listed and run through the CLI by
# tests/mlperf_tf/test_cli.py (test_third_party_benchmark_is_listed_and_runs), and `.ci/run` runs
# this plug-in's contract cases (smoke run, official checker, resume) with it installed.
@pytest.mark.slow
def test_plugin_is_listed_runs_through_the_cli_and_its_log_is_judged(plugin_site, tmp_path):
    env = processes.python_env(PYTHONPATH=f"{plugin_site}{os.pathsep}{processes.REPO_ROOT}")
    listed = subprocess.run(
        [sys.executable, "-m", "mlperf_tf.cli", "list"], cwd=processes.REPO_ROOT, env=env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert any(
        line.startswith("efficientnet") and "mini" in line for line in listed.stdout.splitlines()
    ), listed.stdout
    ran = subprocess.run(
        [sys.executable, "-m", "mlperf_tf.cli", "run", "--benchmark=efficientnet",
         "--preset=smoke", f"--model_dir={tmp_path}", "--steps_per_loop=4",
         "--submission_division=open"],
        cwd=processes.REPO_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    log_path = tmp_path / "mlperf_log.txt"
    records = [
        json.loads(line.split(":::MLLOG", 1)[1])
        for line in log_path.read_text().splitlines()
        if ":::MLLOG" in line
    ]
    values = {r["key"]: r["value"] for r in records}
    assert values["submission_benchmark"] == "efficientnet"
    assert values["submission_division"] == "open"
    assert values["opt_name"] == "lars"
    assert records[-1]["key"] == "run_stop"
    checked = subprocess.run(
        [sys.executable, "-m", "mlperf_tf.cli", "check", str(log_path), "--quality=skip"],
        cwd=processes.REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    verdict = checked.stdout + checked.stderr
    # Not an MLPerf benchmark: judged as an open-division log by the round's common rules.
    assert checked.returncode == 0, verdict
    assert verdict.startswith("PASS"), verdict
    assert "Traceback" not in verdict and "crash" not in verdict.lower(), verdict
    assert "'efficientnet' is not an MLPerf benchmark" in verdict, verdict


def test_simulate_and_list_read_what_the_plugin_declares(plugin_site):
    """`list --json` gives its declared parameter count and `simulate` its FLOPs (traced: it
    declares none), its stated convergence and its data-parallel-only shape, with no cache
    written and nothing in `mlperf_tf/` naming it."""
    from mlperf_tf_efficientnet.benchmark import EfficientNetBenchmark

    env = processes.python_env(PYTHONPATH=f"{plugin_site}{os.pathsep}{processes.REPO_ROOT}")
    base = [sys.executable, "-m", "mlperf_tf.cli"]
    listed = subprocess.run(base + ["list", "--json"], cwd=processes.REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    entry = next(e for e in json.loads(listed.stdout) if e["name"] == "efficientnet")
    mlperf = EfficientNetBenchmark(EfficientNetBenchmark.preset("mlperf"))
    assert entry["parameters"] == mlperf.parameter_count() > 28_000_000  # B5
    sim = base + ["simulate", "--benchmark=efficientnet", "--preset=smoke", "--system=cpu-local",
                  "--chips=2", "--json"]  # fmt: skip
    done = subprocess.run(sim, cwd=processes.REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["compute_s"] > 0 and result["epochs_to_target"] == 350.0
    assert "Wongpanich" in result["convergence_source"]
    refused = subprocess.run(sim + ["--model_parallel=2"], cwd=processes.REPO_ROOT, env=env,
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert refused.returncode != 0 and "Transformer-family" in refused.stderr
