"""Measures the extra cost per training step of K-FAC over its base optimizer (SGD-momentum).

One train step is the runner's protocol (forward and backward under `capture()` for K-FAC,
`gradients`, `apply_gradients`) in a `tf.function`, on the resnet50 benchmark's model
(ResNet-50 v1.5 layout; `--block_layers` and `--base_width` shrink it) with synthetic images.
Each timed round runs `--steps` steps, a multiple of the inverse interval, so that the factor
updates (every 10 steps by default) and the eigendecompositions (every 100) are amortised as in
training. The optimizers are interleaved round by round and each ratio is taken within a round;
CPU time of the process is reported next to wall time because the machine may be shared.

    python tools/costs/bench_kfac.py [--steps=100] [--repeats=3] [--batch_size=32] [--image_size=32]
        [--block_layers=1,1,1,1] [--base_width=16] [--factor_interval=10] [--inverse_interval=100]
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.resnet50 import config as resnet_config  # noqa: E402
from benchmarks.resnet50 import model as model_lib  # noqa: E402
from mlperf_tf.optimizers import KFAC  # noqa: E402
from tools import harness  # noqa: E402


def build(name: str, args) -> tuple:
    """A fresh model and optimizer, and its compiled train step."""
    model_config = resnet_config.ModelConfig(
        num_classes=10,
        block_layers=tuple(int(b) for b in args.block_layers.split(",")),
        base_width=args.base_width,
    )
    model = model_lib.resnet(model_config, image_size=args.image_size, seed=0)
    if name == "sgd":
        optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    else:
        optimizer = KFAC(
            0.01,
            momentum=0.9,
            factor_update_interval=args.factor_interval,
            inverse_update_interval=args.inverse_interval,
        )
        optimizer.register_model(model)
    optimizer.build(model.trainable_variables)
    images = tf.random.stateless_normal(
        [args.batch_size, args.image_size, args.image_size, 3], [1, 2]
    )
    labels = tf.random.stateless_uniform([args.batch_size], [3, 4], maxval=10, dtype=tf.int32)
    variables = model.trainable_variables
    capture = getattr(optimizer, "capture", None)

    def loss_fn():
        logits = model(images, training=True)
        losses = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        return tf.reduce_mean(losses)

    @tf.function
    def steps(n):
        for _ in tf.range(n):
            with tf.GradientTape() as tape:
                if capture:
                    with capture():
                        loss = loss_fn()
                else:
                    loss = loss_fn()
            if capture:
                grads = optimizer.gradients(tape, loss, variables)
            else:
                grads = tape.gradient(loss, variables)
            optimizer.apply_gradients(zip(grads, variables))
        return loss

    return model, optimizer, steps


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--image_size", type=int, default=32)
    parser.add_argument("--block_layers", default="1,1,1,1")
    parser.add_argument("--base_width", type=int, default=16)
    parser.add_argument("--factor_interval", type=int, default=10)
    parser.add_argument("--inverse_interval", type=int, default=100)
    args = parser.parse_args(argv)
    if args.steps % args.inverse_interval:
        parser.error(f"--steps ({args.steps}) must be a multiple of --inverse_interval")
    runs = {name: build(name, args) for name in ("sgd", "kfac")}
    blocks = len(runs["kfac"][1]._blocks)
    contestants = {name: functools.partial(_run, run[2]) for name, run in runs.items()}
    title = (
        f"model: resnet50 layout, block_layers={args.block_layers}, base_width={args.base_width}, "
        f"{sum(int(v.numpy().size) for v in runs['sgd'][0].trainable_variables)} parameters, "
        f"{blocks} K-FAC layers; batch {args.batch_size} at {args.image_size} px; "
        f"factors every {args.factor_interval}, inverses every {args.inverse_interval}, "
        f"{args.steps} steps per round, {args.repeats} rounds"
    )
    # Warm-up: tracing and one full cycle of factor and inverse updates.
    harness.compare(
        contestants, steps=args.steps, rounds=args.repeats, samples_per_step=args.batch_size,
        reference="sgd", unit="images", title=title, warm_up_steps=args.steps,
    )  # fmt: skip


def _run(steps_fn, steps: int) -> None:
    float(steps_fn(tf.constant(steps)))


if __name__ == "__main__":
    main()
