"""Measures ResNet-50's model FLOPs utilization (MFU) on this machine: model FLOP/s over matmul peak.

Both halves are measured here, interleaved so that machine load hits them alike:

- the train step: `ResNet50Benchmark` (the `mlperf` recipe: LARS, label smoothing, batch norm) in
  the runner's `Trainer`, at `--batch` and `--image_size`, fp32, no XLA, synthetic data;
- the peak: a chain of square fp32 matmuls (`mlperf_tf.bench.MatmulPeak`) right after each step
  window.

Model FLOPs per image are the convolutions and the classifier of the Keras model, counted from
each layer's shapes (a multiply-add is 2; training = 3x the forward pass: the backward pass does
two products per forward product), or `mlperf_tf.flops.training_flops_per_sample` when the suite
has it; the two are printed side by side when both exist. Element-wise work (batch norm, ReLU)
is not model FLOPs.

MFU is reported two ways: by wall time (the definition: model FLOP/s / peak FLOP/s), and by
process CPU time (model FLOPs per CPU-second / matmul FLOPs per CPU-second), which other jobs'
load distorts far less on a shared machine.

    python tools/costs/mfu.py [--batch=32] [--image_size=224] [--windows=4] [--steps=1]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from mlperf_tf import bench  # noqa: E402
from tools.harness import require_positive  # noqa: E402
from tools.peers import bench_resnet50  # noqa: E402

TRAINING_PER_FORWARD = 3.0


def layer_forward_flops(model: keras.Model) -> float:
    """Forward FLOPs per example of the model's Conv2D and Dense layers, from their shapes."""
    total = 0.0
    for layer in model.layers:
        if isinstance(layer, keras.layers.Conv2D):
            _, height, width, out_channels = layer.output.shape
            kh, kw, in_per_group, _ = layer.kernel.shape
            total += 2.0 * height * width * out_channels * kh * kw * in_per_group
        elif isinstance(layer, keras.layers.Dense):
            total += 2.0 * layer.kernel.shape[0] * layer.kernel.shape[1]
    return total


def suite_flops(benchmark) -> float | None:
    """`mlperf_tf.flops`' count for the benchmark, when that module exists."""
    try:
        from mlperf_tf import flops
    except ImportError:
        return None
    return float(flops.training_flops_per_sample(benchmark))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--steps", type=int, default=1, help="train steps per window")
    parser.add_argument("--peak_seconds", type=float, default=2.0)
    args = parser.parse_args(argv)
    require_positive(parser, args, "batch", "image_size", "windows", "steps")

    parts = bench_resnet50.mlperf_tf_parts(args.batch, args.image_size)
    run, model, benchmark = parts["run"], parts["model"], parts["benchmark"]
    counted = TRAINING_PER_FORWARD * layer_forward_flops(model)
    from_suite = suite_flops(benchmark)
    per_image = from_suite or counted
    print(
        f"training GFLOP per image: {counted / 1e9:.2f} (layer shapes)"
        + (f", {from_suite / 1e9:.2f} (mlperf_tf.flops)" if from_suite else "")
    )
    load_before = os.getloadavg()
    run(1)  # warm-up: tracing
    matmul = bench.MatmulPeak(device="/cpu:0")
    matmul.measure(0.2)  # warm-up: tracing

    step_wall, step_cpu, peak_wall, peak_cpu = [], [], [], []
    for window in range(args.windows):
        wall, cpu = time.perf_counter(), time.process_time()
        run(args.steps)
        step_wall.append((time.perf_counter() - wall) / args.steps)
        step_cpu.append((time.process_time() - cpu) / args.steps)
        peak = matmul.measure(args.peak_seconds)
        peak_wall.append(peak)
        peak_cpu.append(matmul.measure(args.peak_seconds, cpu_time=True))
        print(
            f"window {window + 1}/{args.windows}: step {step_wall[-1]:.2f} s "
            f"(CPU {step_cpu[-1]:.2f} s), matmul peak {peak / 1e9:.1f} GFLOP/s",
            flush=True,
        )

    flops_per_step = per_image * args.batch
    mfu_wall = [flops_per_step / s / p for s, p in zip(step_wall, peak_wall)]
    mfu_cpu = [flops_per_step / c / p for c, p in zip(step_cpu, peak_cpu)]
    print(
        f"\nResNet-50 (mlperf recipe) train step, batch {args.batch}, {args.image_size} px, fp32, "
        f"no XLA; TF {tf.__version__}; load average {load_before[0]:.1f} -> "
        f"{os.getloadavg()[0]:.1f}"
    )
    print(f"model FLOPs per step: {flops_per_step / 1e9:.1f} GFLOP")
    print(
        f"step: median {statistics.median(step_wall):.2f} s wall, "
        f"{statistics.median(step_cpu):.2f} s CPU; matmul peak: best {max(peak_wall) / 1e9:.1f}, "
        f"median {statistics.median(peak_wall) / 1e9:.1f} GFLOP/s"
    )
    print(
        f"MFU by wall time (per window, step over the adjacent peak): median "
        f"{100 * statistics.median(mfu_wall):.1f}% (min {100 * min(mfu_wall):.1f}, max "
        f"{100 * max(mfu_wall):.1f}); against the best peak "
        f"{100 * flops_per_step / statistics.median(step_wall) / max(peak_wall):.1f}%"
    )
    print(
        f"MFU by CPU time: median {100 * statistics.median(mfu_cpu):.1f}% "
        f"(min {100 * min(mfu_cpu):.1f}, max {100 * max(mfu_cpu):.1f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
