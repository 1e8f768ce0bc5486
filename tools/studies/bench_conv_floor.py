"""Measures how far any ResNet-50 train step can get ahead of the Model Garden's: its conv floor.

Both models run the same oneDNN convolution kernels on the same shapes (`benchmarks/resnet50/
README.md`, "Where the time goes"), so a step can only be cheaper by what is not convolution.
This times, in one process on the same machine:

  conv floor    every `Conv2D` of this suite's ResNet-50 in isolation, each of its three kernels
                (forward, input gradient, filter gradient; no input gradient for the stem, whose
                input is the data) as its own `tf.function`, median of `--repeats` calls, summed
                over the layers: the step time if batch norm, ReLU, adds, pooling, the classifier,
                the loss and the optimizer cost nothing and the convolutions ran back to back;
  mlperf_tf, model_garden, keras_fit  the full train steps of `tools/peers/bench_resnet50.py`,
                interleaved (`tools/harness.py`; the Model Garden's skipped without the
                `peers` extra).

Reported: the floor, each full step, the non-convolution share of our step, and for each peer
the bound `peer step / conv floor` on the speed-up over it that any change outside the
convolution kernels can buy. (A bound, not a proof: in the full step two ops may share the
cores, which the isolated kernels never do.)

    python tools/studies/bench_conv_floor.py [--batch=32] [--image_size=128] [--repeats=5]
        [--steps=2] [--rounds=6]
"""

from __future__ import annotations

import os
import pathlib
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # what `mlperf-tf` sets (see design.md)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from tools import harness
from tools.peers import bench_resnet50  # noqa: E402

# The peers of `tools/peers/bench_resnet50.py` and the speed-up issue 14 asks over each.
PEER_GOALS = {"model_garden": 1.1, "keras_fit": 1.6}


def conv_kernels(model: keras.Model, batch: int) -> list[dict]:
    """Each Conv2D's shapes: {"name", "input": [b, h, w, c], "kernel", "strides", "padding",
    "input_is_data"}."""
    convs = []
    for layer in model.layers:
        if not isinstance(layer, keras.layers.Conv2D):
            continue
        if layer.data_format != "channels_last" or tuple(layer.dilation_rate) != (1, 1):
            raise ValueError(f"{layer.name}: only channels-last, undilated convolutions are timed")
        convs.append(
            {
                "name": layer.name,
                "input": [batch, *layer.input.shape[1:]],
                "kernel": list(layer.kernel.shape),
                "strides": [1, *layer.strides, 1],
                "padding": layer.padding.upper(),
                # Layers are in topological order: the first convolution is the stem, whose
                # input is the (padded) image, and no one needs the image's gradient.
                "input_is_data": not convs,
            }
        )
    return convs


def time_call(fn, repeats: int) -> float:
    """Median seconds of `repeats` calls of a traced `fn` (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        fn()
        times.append(time.perf_counter() - begin)
    return statistics.median(times)


def layer_seconds(conv: dict, repeats: int) -> float:
    """Seconds of one convolution's kernels, each run alone (`conv` from `conv_kernels`)."""
    x = tf.random.normal(conv["input"])
    w = tf.random.normal(conv["kernel"]) * 0.05
    kwargs = {"strides": conv["strides"], "padding": conv["padding"]}
    dy = tf.random.normal(tf.nn.conv2d(x, w, **kwargs).shape)
    kernels = [
        lambda: tf.nn.conv2d(x, w, **kwargs),
        lambda: tf.raw_ops.Conv2DBackpropFilter(
            input=x, filter_sizes=w.shape, out_backprop=dy, **kwargs
        ),
    ]
    if not conv["input_is_data"]:
        kernels.append(
            lambda: tf.raw_ops.Conv2DBackpropInput(
                input_sizes=x.shape, filter=w, out_backprop=dy, **kwargs
            )
        )
    return sum(time_call(tf.function(kernel), repeats) for kernel in kernels)


def conv_floor(convs: list[dict], repeats: int) -> tuple[float, list[tuple[str, float]]]:
    """(total seconds, [(layer, seconds of its kernels)]) of the convolutions run one by one."""
    per_layer = [(conv["name"], layer_seconds(conv, repeats)) for conv in convs]
    return sum(seconds for _, seconds in per_layer), per_layer


def main(argv=None) -> int:
    parser = harness.rounds_parser(__doc__.splitlines()[0], steps=2, rounds=6)
    bench_resnet50.add_step_shape(parser)
    parser.add_argument("--repeats", type=int, default=5, help="calls timed per conv kernel")
    args = harness.parse_rounds(parser, argv, "batch", "image_size", "repeats")

    ours = bench_resnet50.mlperf_tf_parts(args.batch, args.image_size)
    contestants = {"mlperf_tf": ours["run"]}
    for peer in PEER_GOALS:
        try:
            contestants[peer] = bench_resnet50.BUILDERS[peer](args.batch, args.image_size)
        except ImportError as e:
            print(f"{peer}: skipped (tf-models-official not importable: {e})")
    convs = conv_kernels(ours["model"], args.batch)
    harness.warm_up(contestants)
    load_before = os.getloadavg()
    # The floor is timed between two halves of the rounds, so load drifts hit both alike.
    first = harness.interleaved_rounds(
        contestants, steps=args.steps, rounds=(args.rounds + 1) // 2, samples_per_step=args.batch
    )
    floor, per_layer = conv_floor(convs, args.repeats)
    second = harness.interleaved_rounds(
        contestants, steps=args.steps, rounds=args.rounds // 2, samples_per_step=args.batch
    )
    step = {
        name: statistics.median([args.batch / r for r in first.rates[name] + second.rates[name]])
        for name in contestants
    }
    print(
        f"\nResNet-50 (this suite's layers), batch {args.batch}, {args.image_size} px, fp32, no "
        f"XLA; TF {tf.__version__}; {len(convs)} convolutions; load average "
        f"{load_before[0]:.1f} -> {os.getloadavg()[0]:.1f}"
    )
    print("| | seconds per step (median) |\n|---|---|")
    print(f"| conv floor: the {len(convs)} convolutions' kernels alone | {floor:.3f} |")
    for name, seconds in step.items():
        print(f"| {name} full train step | {seconds:.3f} |")
    print(
        f"\nnon-convolution share of our step: {1 - floor / step['mlperf_tf']:.1%}; "
        f"our step / floor: {step['mlperf_tf'] / floor:.2f}"
    )
    for peer, goal in PEER_GOALS.items():
        if peer in step:
            print(
                f"{peer}: bound on any non-convolution speed-up {step[peer] / floor:.2f}x "
                f"({peer} step / conv floor); issue 14's {goal}x needs our step at "
                f"{step[peer] / goal:.3f} s, {step[peer] / goal - floor:+.3f} s from the floor"
            )
    slowest = sorted(per_layer, key=lambda item: -item[1])[:5]
    print("costliest layers (all three kernels): " + ", ".join(
        f"{n} {s * 1e3:.1f} ms" for n, s in slowest))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
