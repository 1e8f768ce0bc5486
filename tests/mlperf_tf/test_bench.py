"""Tests `mlperf-tf bench` on the smoke presets: its numbers agree with each other, bad input is one line."""

import dataclasses
import json
import statistics

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.resnet50 import prepare
from mlperf_tf import bench, cli, flops, registry

FAST = ["--windows=2", "--steps_per_window=1", "--warmup_steps=1", "--peak_seconds=0.05"]


def _bench_json(capsys, *args):
    assert cli.main(["bench", *args, *FAST, "--json"]) == 0
    out = capsys.readouterr()
    assert "window 2/2:" in out.err  # progress lines go to stderr with --json
    return json.loads(out.out)


def test_resnet50_smoke_windows_median_spread_and_step_time(capsys):
    result = _bench_json(capsys, "--benchmark=resnet50", "--preset=smoke")
    rates = result["window_samples_per_s"]
    assert len(rates) == 2 and all(r > 0 for r in rates)
    assert result["samples_per_s"] == pytest.approx(statistics.median(rates))
    assert result["samples_per_s_min"] <= result["samples_per_s"] <= result["samples_per_s_max"]
    assert result["replicas"] == 1 and result["strategy"] == "OneDeviceStrategy"
    assert result["samples_per_s_per_replica"] == pytest.approx(result["samples_per_s"])
    assert result["global_batch_size"] == 16  # the smoke preset's batch
    assert result["step_time_ms"] == pytest.approx(1e3 * 16 / result["samples_per_s"])
    assert result["input_samples_per_s"] is None  # synthetic preset: no input measurement
    assert result["flops_per_sample"] == pytest.approx(
        flops.training_flops_per_sample("resnet50", "smoke")
    )
    assert result["peak_flops_per_s"] > 0
    assert result["mfu"] == pytest.approx(
        result["flops_per_sample"] * result["samples_per_s"] / result["peak_flops_per_s"]
    )
    line = bench.BenchResult(**result).summary()  # what the command prints without --json
    assert line.startswith("bench resnet50 (smoke, fp32, no XLA, OneDeviceStrategy x1")
    assert "images/s median" in line and "load average" in line  # its sample_unit


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(registry.available()))
def test_every_registered_benchmark_benches_on_its_smoke_preset(capsys, name):
    result = _bench_json(capsys, f"--benchmark={name}", "--preset=smoke")
    assert result["benchmark"] == name and min(result["window_samples_per_s"]) > 0
    assert result["mfu"] > 0  # mlperf_tf.flops counts every built-in model


def _smoke(name):
    benchmark_class = registry.get(name)
    return benchmark_class(benchmark_class.preset("smoke"))


def test_gpt_oss_reports_tokens_and_mfu_on_active_experts_and_windowed_attention(capsys):
    """MFU counts the FLOPs the benchmark declares: a token's top-k experts (not all of them)
    and its sliding-window layers at their window (not the whole sequence)."""
    result = _bench_json(capsys, "--benchmark=gpt_oss_20b", "--preset=smoke")
    bench = _smoke("gpt_oss_20b")
    seq = bench.sequence_length()
    assert result["sample_unit"] == "sequence" and result["tokens_per_sample"] == seq
    assert result["tokens_per_s"] == pytest.approx(result["samples_per_s"] * seq)
    shape = bench.decoder_shape()
    declared = bench.training_flops_per_sample()
    assert result["flops_per_sample"] == pytest.approx(declared)
    assert declared == pytest.approx(flops.decoder_training_flops_per_sample(shape, seq))
    every_expert = dataclasses.replace(shape, experts_per_token=shape.num_experts)
    full_attention = dataclasses.replace(shape, sliding_layers=0)
    assert shape.experts_per_token < shape.num_experts and shape.sliding_window < seq
    assert declared < flops.decoder_training_flops_per_sample(every_expert, seq)
    assert declared < flops.decoder_training_flops_per_sample(full_attention, seq)
    assert result["mfu"] == pytest.approx(
        result["flops_per_sample"] * result["samples_per_s"] / result["peak_flops_per_s"]
    )


# Extended (CI runs it after README's default run); the default run covers its case by
# test_gpt_oss_reports_tokens_and_mfu_on_active_experts_and_windowed_attention (the rate and MFU
# report).
@pytest.mark.extended
def test_flux_reports_images_per_second_and_mfu(capsys):
    assert cli.main(["bench", "--benchmark=flux1", "--preset=smoke", *FAST, "--json"]) == 0
    out = capsys.readouterr()
    result = json.loads(out.out)
    assert "images/s" in out.err  # the progress lines count the benchmark's unit
    assert result["sample_unit"] == "image" and result["tokens_per_s"] is None
    assert result["flops_per_sample"] == pytest.approx(
        flops.training_flops_per_sample(_smoke("flux1"))
    )
    assert result["flops_per_sample"] > 0 and result["peak_flops_per_s"] > 0
    assert result["mfu"] == pytest.approx(
        result["flops_per_sample"] * result["samples_per_s"] / result["peak_flops_per_s"]
    )


def test_mirrored_replicas_and_overrides_reach_the_benchmark(capsys):
    result = _bench_json(
        capsys,
        "--benchmark=resnet50",
        "--preset=smoke",
        "--distribution=mirrored",
        "--num_cpu_devices=2",
        "--config.global_batch_size=8",
    )
    assert result["replicas"] == 2 and result["global_batch_size"] == 8
    assert result["samples_per_s_per_replica"] == pytest.approx(result["samples_per_s"] / 2)


# Extended (CI runs it after README's default run); the default run covers its case by
# data/test_pipeline.py (the real-record pipeline) and this module's windows and rates on smoke
# runs.
@pytest.mark.extended
def test_input_pipeline_rate_on_real_records(capsys, tmp_path):
    rng = np.random.default_rng(0)
    with tf.io.TFRecordWriter(str(tmp_path / "train-00000-of-00001")) as writer:
        for i in range(8):
            image = rng.integers(0, 256, [40, 40, 3], dtype=np.uint8)
            jpeg = tf.io.encode_jpeg(image).numpy()
            example = prepare.image_example(jpeg, label=1 + i % 2, wnid="n0", file_name="x.JPEG")
            writer.write(example.SerializeToString())
    result = _bench_json(
        capsys,
        "--benchmark=resnet50",
        "--preset=smoke",
        "--input_batches=3",
        f"--config.data_dir={tmp_path}",
    )
    assert result["input_samples_per_s"] > 0
    assert len(result["window_samples_per_s"]) == 2  # training itself stays on synthetic data


def test_summary_line_without_json(capsys, monkeypatch):
    """Without --json the command prints the result's one line (its text is checked on a
    measured result above): here a result with the first test's settings, not measured again."""
    result = bench.BenchResult(
        benchmark="resnet50", preset="smoke", dtype="fp32", xla=False,
        strategy="OneDeviceStrategy", replicas=1, expert_parallel=1, global_batch_size=16,
        steps_per_window=1, sample_unit="image", window_samples_per_s=[10.0, 12.0],
        samples_per_s=11.0, samples_per_s_min=10.0, samples_per_s_max=12.0,
        samples_per_s_per_replica=11.0, step_time_ms=1e3 * 16 / 11.0, warmup_s=1.0,
    )  # fmt: skip
    monkeypatch.setattr(bench, "run", lambda *args: result)
    assert cli.main(["bench", "--benchmark=resnet50", "--preset=smoke", *FAST]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == result.summary()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--preset=smoke"], "--benchmark is required"),
        (["--benchmark=nope"], "nope"),
        (["--benchmark=resnet50", "--preset=huge"], "huge"),
        (["--benchmark=resnet50", "--windows=0"], "--windows (0)"),
        (["--benchmark=resnet50", "--dtype=fp8"], "fp8"),
        (["--benchmark=resnet50", "--num_cpu_devices=-1"], "num_cpu_devices"),
        (["--benchmark=resnet50", "--config.no_such_key=1"], "no_such_key"),
        (["--benchmark=resnet50", "--no_such_flag"], "no_such_flag"),
    ],
)
def test_bad_input_is_one_error_line(capsys, args, message):
    assert cli.main(["bench", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err


def test_missing_data_fails_before_the_timed_windows(capsys, tmp_path):
    """A preset whose data is not there (e.g. `--preset=mini` before its first run) stops in
    seconds, saying how to bench without it, instead of after minutes of windows."""
    missing = tmp_path / "not-prepared"
    args = ["bench", "--benchmark=resnet50", "--preset=smoke", f"--config.data_dir={missing}"]
    assert cli.main([*args, *FAST]) == 2
    captured = capsys.readouterr()
    assert "window" not in captured.out and "warm-up" not in captured.out
    error = captured.err.strip()
    assert error.startswith("error: ") and str(missing) in error and "--config.data_dir=" in error


def test_matmul_peak_is_a_plausible_cpu_rate():
    peak = bench.matmul_peak(device="/cpu:0", seconds=0.05, size=128)
    assert 1e6 < peak < 1e14  # FLOP/s: above a 1990s PC, below any CPU socket today


@pytest.mark.slow
def test_pipeline_reports_its_measured_bubble_beside_the_predicted_one(capsys):
    """Two stages of the smoke Llama on 2 devices (data 1: 8 sequences per replica, micro
    batch 1, so M = 8): the schedule predicts 1 / 9; the stages' measured idle share is a
    fraction (on shared CPU cores mostly the exchanges' latency: not a speed claim)."""
    result = _bench_json(
        capsys, "--benchmark=llama31_8b", "--preset=smoke", "--distribution=mirrored",
        "--num_cpu_devices=2", "--pipeline_parallel=2", "--micro_batch_size=1",
    )  # fmt: skip
    assert result["pipeline_bubble_predicted"] == pytest.approx(1 / 9)
    assert 0 < result["pipeline_bubble_measured"] < 1
