"""Measures SSD step costs side by side, as ratios: the loss (matching + mining) and eval decoding.

Runs, interleaved in one process so machine load cancels out:
  model    forward + backward of the model with a trivial loss (the floor),
  train    forward + backward with the SSD loss (matching, smooth-L1, mined cross-entropy),
  loss     the SSD loss alone on fixed outputs, eager-graph vs `jit_compile=True`,
  detect   the eval decoding (softmax, top-k, per-class NMS), graph vs XLA.

Usage: python tools/costs/bench_ssd.py [--preset=mini] [--batch=8] [--repeats=5] [--steps=3]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.ssd import input as input_lib  # noqa: E402
from benchmarks.ssd import loss as loss_lib  # noqa: E402
from benchmarks.ssd import postprocess  # noqa: E402
from benchmarks.ssd.benchmark import SSDBenchmark  # noqa: E402


def _time(fn, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        out = fn()
    tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, out)
    return (time.perf_counter() - start) / steps


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="mini", choices=["mini", "smoke", "mlperf"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)

    bench = SSDBenchmark(SSDBenchmark.preset(args.preset))
    cfg = bench.config
    model = bench.build_model()
    examples = [input_lib.synthetic_example(cfg, i) for i in range(args.batch)]
    batch = {
        k: tf.constant(np.stack([e[k] for e in examples])) for k in ("image", "boxes", "classes")
    }
    variables = model.trainable_variables

    @tf.function
    def model_only():
        with tf.GradientTape() as tape:
            codes, logits = model(batch["image"], training=True)
            total = tf.reduce_mean(tf.cast(codes, tf.float32)) + tf.reduce_mean(
                tf.cast(logits, tf.float32)
            )
        return tape.gradient(total, variables)

    @tf.function
    def train():
        with tf.GradientTape() as tape:
            total = bench.compute_loss(model, batch)
        return tape.gradient(total, variables)

    codes, logits = model(batch["image"], training=False)

    def loss_fn():
        return loss_lib.ssd_loss(
            codes, logits, batch["boxes"], batch["classes"], bench.default_boxes
        ).total

    def detect_fn():
        return postprocess.detect(codes, logits, bench.default_boxes)["scores"]

    cases = {
        "model": model_only,
        "train": train,
        "loss": tf.function(loss_fn),
        "loss_xla": tf.function(loss_fn, jit_compile=True),
        "detect": tf.function(detect_fn),
        "detect_xla": tf.function(detect_fn, jit_compile=True),
    }
    for fn in cases.values():  # trace and compile outside the timing
        fn()
    times = {name: [] for name in cases}
    for _ in range(args.repeats):
        for name, fn in cases.items():
            times[name].append(_time(fn, args.steps))
    med = {name: float(np.median(t)) for name, t in times.items()}
    print(f"preset={args.preset} batch={args.batch} anchors={bench.default_boxes.num_anchors} "
          f"load={os.getloadavg()[0]:.1f}")  # fmt: skip
    for name, t in med.items():
        print(f"  {name:10s} {t * 1e3:9.1f} ms/step")
    print(f"  train / model       = {med['train'] / med['model']:.3f}  (loss overhead in a step)")
    print(f"  loss_xla / loss     = {med['loss_xla'] / med['loss']:.3f}")
    print(f"  detect_xla / detect = {med['detect_xla'] / med['detect']:.3f}")


if __name__ == "__main__":
    main()
