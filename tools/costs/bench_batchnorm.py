"""Measures the train-step time of grouped cross-replica BN against Keras' synchronized BN.

A stack of ResNet bottleneck blocks is trained on fixed synthetic batches under a MirroredStrategy
over logical CPU devices, once with `CrossReplicaBatchNormalization(group_size=<all replicas>)` and
once with `keras.layers.BatchNormalization(synchronized=True)` (plus local BN as a reference).
Repetitions of the variants are interleaved in one run so that machine noise cancels in the ratio.

    python tools/costs/bench_batchnorm.py [--replicas=2] [--blocks=4] [--repeats=31] [--steps=5]
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from mlperf_tf.layers import CrossReplicaBatchNormalization  # noqa: E402
from tools import harness  # noqa: E402

VARIANTS = ("grouped", "keras_sync", "keras_local")


def make_bn(variant: str, replicas: int):
    """A batch-norm layer of `variant` (one of VARIANTS), with MLPerf ResNet's momentum."""
    if variant == "grouped":
        return CrossReplicaBatchNormalization(group_size=replicas, momentum=0.9, epsilon=1e-5)
    return keras.layers.BatchNormalization(
        momentum=0.9, epsilon=1e-5, synchronized=(variant == "keras_sync")
    )


def bottleneck_stack(variant, replicas, *, blocks, width, image_size):
    """ResNet v1.5 bottleneck blocks (1x1, 3x3, 1x1 convs, each followed by BN) + a linear head."""
    inputs = keras.Input((image_size, image_size, 4 * width))
    x = inputs
    for _ in range(blocks):
        shortcut = x
        y = keras.layers.Conv2D(width, 1, use_bias=False)(x)
        y = keras.layers.ReLU()(make_bn(variant, replicas)(y))
        y = keras.layers.Conv2D(width, 3, padding="same", use_bias=False)(y)
        y = keras.layers.ReLU()(make_bn(variant, replicas)(y))
        y = keras.layers.Conv2D(4 * width, 1, use_bias=False)(y)
        y = make_bn(variant, replicas)(y)
        x = keras.layers.ReLU()(keras.layers.Add()([y, shortcut]))
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(10)(x))


def make_train_loop(strategy, model, optimizer, global_batch):
    """A tf.function running `steps` SGD steps on fixed per-replica batches; returns the loss."""
    loss_fn = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="sum_over_batch_size"
    )

    def replica_step(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = loss_fn(labels, logits) * (
                tf.cast(tf.shape(images)[0], tf.float32) / global_batch
            )
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_loop(images, labels, steps):
        loss = tf.constant(0.0)
        for _ in tf.range(steps):
            per_replica = strategy.run(replica_step, args=(images, labels))
            loss = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        return loss

    return train_loop


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2, help="logical CPU devices")
    parser.add_argument("--blocks", type=int, default=4, help="bottleneck blocks")
    parser.add_argument("--width", type=int, default=16, help="bottleneck width (output 4x)")
    parser.add_argument("--image_size", type=int, default=16, help="spatial size in pixels")
    parser.add_argument("--per_replica_batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5, help="train steps per timed call")
    parser.add_argument("--repeats", type=int, default=31, help="timed calls per variant")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument(
        "--cross_device_ops",
        choices=("reduce_to_one", "collective"),
        default="reduce_to_one",
        help="MirroredStrategy's all-reduce: ReductionToOneDevice (what mlperf_tf.distribute uses "
        "on CPUs) or the default ring collectives",
    )
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    for name in variants:
        if name not in VARIANTS:
            parser.error(f"--variants: {name!r} is not one of {', '.join(VARIANTS)}")
    if args.replicas < 1 or args.steps < 1 or args.repeats < 1:
        parser.error("--replicas, --steps and --repeats must be positive")

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas
    )
    # One strategy for the whole run: MirroredStrategies in one process share collective keys.
    cross_device_ops = (
        tf.distribute.ReductionToOneDevice() if args.cross_device_ops == "reduce_to_one" else None
    )
    strategy = tf.distribute.MirroredStrategy(
        [f"CPU:{i}" for i in range(args.replicas)], cross_device_ops=cross_device_ops
    )
    global_batch = args.per_replica_batch * args.replicas
    rng = np.random.RandomState(0)
    shape = (args.per_replica_batch, args.image_size, args.image_size, 4 * args.width)
    batches = [
        (rng.normal(size=shape).astype(np.float32), rng.randint(0, 10, shape[0]).astype(np.int32))
        for _ in range(args.replicas)
    ]
    images = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(batches[ctx.replica_id_in_sync_group][0])
    )
    labels = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(batches[ctx.replica_id_in_sync_group][1])
    )

    loops = {}
    for name in variants:
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = bottleneck_stack(
                name, args.replicas, blocks=args.blocks, width=args.width,
                image_size=args.image_size,
            )  # fmt: skip
            optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
            optimizer.build(model.trainable_variables)
        loops[name] = make_train_loop(strategy, model, optimizer, global_batch)

    runs = {name: functools.partial(_run, loops[name], images, labels) for name in variants}
    # Trace, then one untimed call of the timed length.
    harness.warm_up(runs, steps=args.steps)
    result = harness.interleaved_rounds(
        runs, steps=args.steps, rounds=args.repeats, samples_per_step=global_batch
    )
    times = {name: [global_batch / r for r in rates] for name, rates in result.rates.items()}

    print(
        f"replicas={args.replicas} blocks={args.blocks} width={args.width} "
        f"image={args.image_size}px per_replica_batch={args.per_replica_batch} "
        f"steps={args.steps} repeats={args.repeats} cross_device_ops={args.cross_device_ops}"
    )
    median = {name: statistics.median(t) for name, t in times.items()}
    for name in variants:
        ms = " ".join(f"{1e3 * t:.1f}" for t in times[name])
        print(f"{name:12s} median {1e3 * median[name]:8.2f} ms/step; all: {ms}")
    for other in ("keras_sync", "keras_local"):
        if "grouped" in times and other in times:
            # Paired ratios: the two calls of one repeat ran back to back under the same load.
            ratios = sorted(g / o for g, o in zip(times["grouped"], times[other]))
            q1, q2, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
            print(
                f"grouped / {other} step time: median of paired ratios {q2:.3f} "
                f"(quartiles {q1:.3f}-{q3:.3f}); ratio of medians "
                f"{median['grouped'] / median[other]:.3f}; ratio of minima "
                f"{min(times['grouped']) / min(times[other]):.3f}; < 1 means grouped is faster"
            )


def _run(loop, images, labels, steps: int) -> None:
    float(loop(images, labels, tf.constant(steps)))


if __name__ == "__main__":
    main()
