"""Would ResNet-50's 1x1 convolutions be faster as plain MatMuls? Times both, kernel by kernel.

A 1x1, stride-1 convolution on NHWC data is a MatMul of the activations seen as
[batch*height*width, channels] with the kernel seen as [channels_in, channels_out]; its two
gradients are MatMuls too (`dy @ w^T`, `x^T @ dy`). oneDNN runs the convolution through its
blocked-layout kernels (with reorders on the way in and out) and the MatMul through its GEMM,
so the two can differ. Almost half of ResNet-50's FLOPs are in these layers, and
`tools/studies/bench_conv_floor.py` shows the convolutions bound any other speed-up, so this is the
one kernel-level change open to a step built from TF ops.

For every 1x1 stride-1 `Conv2D` of this suite's ResNet-50 this times, in one process, the three
convolution kernels (forward, input gradient, filter gradient) and the three MatMuls that compute
the same values, alternating the two per layer so load drifts hit both alike, and repeats the
whole pass `--rounds` times. Reported per distinct shape (median over rounds) and per round
for the total: `conv / matmul` (> 1: the MatMul is faster).

    python tools/studies/bench_pointwise_matmul.py [--batch=32] [--image_size=128] [--repeats=5]
        [--rounds=3]
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # what `mlperf-tf` sets (see design.md)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tools.harness import require_positive  # noqa: E402
from tools.peers import bench_resnet50  # noqa: E402
from tools.studies import bench_conv_floor  # noqa: E402


def pointwise_shapes(convs: list[dict]) -> collections.Counter:
    """How many of the 1x1 stride-1 convolutions have each (batch, height, width, channels_in,
    channels_out)."""
    shapes = collections.Counter()
    for conv in convs:
        if conv["kernel"][:2] == [1, 1] and conv["strides"] == [1, 1, 1, 1]:
            shapes[(*conv["input"], conv["kernel"][3])] += 1
    return shapes


def kernel_seconds(shape: tuple, repeats: int) -> dict:
    """{"conv": s, "matmul": s}: the forward and both gradients of one such layer, each way."""
    *image_shape, channels_out = shape
    channels_in = image_shape[-1]
    image = tf.random.normal(image_shape)
    kernel = tf.random.normal([1, 1, channels_in, channels_out]) * 0.05
    dy_image = tf.random.normal([*image_shape[:-1], channels_out])
    # The same tensors as the MatMul sees them: rows = batch * height * width.
    x, w, dy = (tf.reshape(t, [-1, t.shape[-1]]) for t in (image, kernel, dy_image))
    same = {"strides": [1, 1, 1, 1], "padding": "SAME"}  # as the model's layers
    ways = {
        "conv": [
            lambda: tf.nn.conv2d(image, kernel, **same),
            lambda: tf.raw_ops.Conv2DBackpropInput(
                input_sizes=image.shape, filter=kernel, out_backprop=dy_image, **same
            ),
            lambda: tf.raw_ops.Conv2DBackpropFilter(
                input=image, filter_sizes=kernel.shape, out_backprop=dy_image, **same
            ),
        ],
        "matmul": [
            lambda: tf.matmul(x, w),
            lambda: tf.matmul(dy, w, transpose_b=True),
            lambda: tf.matmul(x, dy, transpose_a=True),
        ],
    }
    for conv, matmul in zip(*ways.values()):  # the timings compare like with like
        conv_value, matmul_value = conv(), matmul()
        difference = np.abs(np.reshape(conv_value, matmul_value.shape) - matmul_value).max()
        if difference > 1e-4 * np.abs(matmul_value).max():  # fp32 sums in another order
            raise AssertionError(f"{shape}: the MatMul does not compute the convolution's value")
    return {
        way: sum(bench_conv_floor.time_call(tf.function(k), repeats) for k in kernels)
        for way, kernels in ways.items()
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench_resnet50.add_step_shape(parser)
    parser.add_argument("--repeats", type=int, default=5, help="calls timed per kernel")
    parser.add_argument("--rounds", type=int, default=3, help="passes over all the layers")
    args = parser.parse_args(argv)
    require_positive(parser, args, "batch", "image_size", "repeats", "rounds")

    model = bench_resnet50.mlperf_tf_parts(args.batch, args.image_size)["model"]
    shapes = pointwise_shapes(bench_conv_floor.conv_kernels(model, args.batch))
    load_before = os.getloadavg()
    per_shape = collections.defaultdict(lambda: collections.defaultdict(list))
    totals = []
    for round_index in range(args.rounds):
        total = {"conv": 0.0, "matmul": 0.0}
        for shape, count in shapes.items():
            for way, seconds in kernel_seconds(shape, args.repeats).items():
                per_shape[shape][way].append(seconds)
                total[way] += count * seconds
        totals.append(total)
        print(
            f"round {round_index + 1}/{args.rounds}: conv {total['conv']:.3f} s, matmul "
            f"{total['matmul']:.3f} s, conv/matmul {total['conv'] / total['matmul']:.2f}",
            flush=True,
        )
    print(
        f"\nResNet-50's 1x1 stride-1 convolutions ({sum(shapes.values())} layers), batch "
        f"{args.batch}, {args.image_size} px, fp32; TF {tf.__version__}; load average "
        f"{load_before[0]:.1f} -> {os.getloadavg()[0]:.1f}"
    )
    print("| input -> channels out | layers | conv ms | matmul ms | conv/matmul |")
    print("|---|---|---|---|---|")
    for shape, count in shapes.items():
        conv, matmul = (statistics.median(per_shape[shape][way]) for way in ("conv", "matmul"))
        print(
            f"| {'x'.join(map(str, shape[:-1]))} -> {shape[-1]} | {count} | {conv * 1e3:.1f} | "
            f"{matmul * 1e3:.1f} | {conv / matmul:.2f} |"
        )
    ratios = [total["conv"] / total["matmul"] for total in totals]
    best = sum(
        count * min(statistics.median(per_shape[shape][way]) for way in ("conv", "matmul"))
        for shape, count in shapes.items()
    )
    conv_total = sum(count * statistics.median(per_shape[s]["conv"]) for s, count in shapes.items())
    print(
        f"\nall these layers: conv/matmul per round {' '.join(f'{r:.2f}' for r in ratios)}, "
        f"median {statistics.median(ratios):.2f}; the faster way per shape would save "
        f"{(conv_total - best) * 1e3:.0f} ms of {conv_total * 1e3:.0f} ms per step"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
