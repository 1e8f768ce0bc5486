"""Measures ResNet-50 train-step throughput of this benchmark against Keras' and the Model Garden's.

Contestants, all ResNet-50 with 1000 classes on one fixed synthetic batch (no input cost), at the
same batch and image size, without XLA (the fast CPU setting; XLA is the TPU path):

  mlperf_tf     `ResNet50Benchmark` (the `mlperf` preset: LARS, label smoothing, grouped BN)
                trained by the suite's own runner loop (`mlperf_tf.runner.Trainer`).
  keras_fit     `keras.applications.ResNet50(weights=None)` trained with `model.fit` (SGD with
                momentum), timed from its first step's start to its last step's end
                (`harness.keras_fit_run`: what each `fit` call costs besides its steps is
                left out, as a user's epoch-long call amortizes it).
  model_garden  the Model Garden's `official.vision` ResNet-50 (tf_keras) in a custom training
                loop with its LARS optimizer; skipped when tf-models-official (the `peers` extra)
                is not installed.
  mlperf_tf_unfused  (ablation, only when named in `--contestants`) `mlperf_tf` with the batch
                norms' fused-kernel fast path off (`fused=False`: Keras 3's separate ops).

One warm-up call per contestant (tracing), then `--rounds` rounds in which every contestant runs
`--steps` steps, in a rotating order: the contestants are interleaved in one process, so machine
load hits all of them alike. Reported: the median images/s over the rounds, the pooled images/s
(all images over all time), and the ratios to `mlperf_tf` (pooled, and the median of the
per-round ratios). On a loaded machine, raise `--rounds`.

With `--profile=DIR`, each contestant instead runs `--steps` steps under TF's profiler after its
warm-up, and the op time per step is printed by category and by op type (`tools/profile_ops.py`).

    python tools/peers/bench_resnet50.py [--batch=32] [--image_size=128] [--steps=3] [--rounds=3]
        [--contestants=mlperf_tf,keras_fit,model_garden] [--profile=DIR]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # what `mlperf-tf` sets (see design.md)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.resnet50 import config as rc  # noqa: E402
from benchmarks.resnet50.benchmark import ResNet50Benchmark  # noqa: E402
from mlperf_tf import config as config_lib  # noqa: E402
from mlperf_tf.benchmark import RunContext  # noqa: E402
from mlperf_tf.layers import CrossReplicaBatchNormalization  # noqa: E402
from tools import harness, profile_ops  # noqa: E402

NUM_CLASSES = 1000


def synthetic_batch(batch: int, image_size: int, seed: int = 0):
    """One random batch: images float32 [batch, size, size, 3], labels int32 [batch]."""
    rng = np.random.default_rng(seed)
    images = rng.normal(size=[batch, image_size, image_size, 3]).astype(np.float32)
    labels = rng.integers(0, NUM_CLASSES, batch).astype(np.int32)
    return images, labels


def mlperf_tf_parts(batch: int, image_size: int, *, fused: bool = True) -> dict:
    """This suite's benchmark, model and a `run(steps)` of the runner's compiled host loop."""
    config = config_lib.override(
        rc.mlperf(),
        {"global_batch_size": str(batch), "data.image_size": str(image_size), "data_dir": ""},
    )
    bench = ResNet50Benchmark(config)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")  # what --distribution=auto picks here
    bench = bench.with_context(RunContext(num_replicas=strategy.num_replicas_in_sync))

    def set_fused(model):
        for layer in model.layers:
            if isinstance(layer, CrossReplicaBatchNormalization):
                layer.fused = fused  # before the first trace

    parts = harness.runner_parts(strategy, bench, adjust_model=set_fused)
    return {"run": parts.run, "model": parts.model, "benchmark": bench}


def mlperf_tf_contestant(batch: int, image_size: int, *, fused: bool = True):
    """This suite: the benchmark's model/optimizer/loss in the runner's compiled host loop."""
    return mlperf_tf_parts(batch, image_size, fused=fused)["run"]


def keras_fit_contestant(batch: int, image_size: int):
    """keras.applications.ResNet50 with model.fit (Keras' CPU default: no XLA)."""
    model = keras.applications.ResNet50(
        weights=None,
        input_shape=(image_size, image_size, 3),
        classes=NUM_CLASSES,
        classifier_activation=None,
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    images, labels = synthetic_batch(batch, image_size)
    dataset = tf.data.Dataset.from_tensors((images, labels)).repeat().prefetch(1)
    return harness.keras_fit_run(model, dataset)


def model_garden_contestant(batch: int, image_size: int):
    """The Model Garden's ResNet-50 (official.vision, tf_keras) in a custom loop with its LARS."""
    import tf_keras
    from official.modeling.optimization import lars
    from official.vision.modeling import classification_model
    from official.vision.modeling.backbones import resnet

    input_specs = tf_keras.layers.InputSpec(shape=[None, image_size, image_size, 3])
    backbone = resnet.ResNet(model_id=50, input_specs=input_specs)
    model = classification_model.ClassificationModel(backbone, NUM_CLASSES, input_specs=input_specs)
    optimizer = lars.LARS(learning_rate=0.1, momentum=0.9, weight_decay_rate=1e-4)
    images, labels = synthetic_batch(batch, image_size)
    dataset = tf.data.Dataset.from_tensors((images, labels)).repeat().prefetch(1)
    iterator = iter(dataset)

    def classifier_loss(model, batch):
        x, y = batch
        logits = model(x, training=True)
        return tf.reduce_mean(
            tf_keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
        )

    return harness.custom_loop(model, optimizer, iterator, classifier_loss)


def add_step_shape(parser: argparse.ArgumentParser) -> None:
    """Adds `--batch` and `--image_size`, the ResNet-50 train step's shape: declared once for this
    tool and the studies that time its contestants, so that their defaults measure one step."""
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--image_size", type=int, default=128)


def main(argv=None) -> int:
    parser = harness.rounds_parser(__doc__.splitlines()[0], steps=3, rounds=3)
    add_step_shape(parser)
    parser.add_argument("--contestants", default=",".join(DEFAULT_CONTESTANTS))
    parser.add_argument("--profile", default="", help="profile each contestant into this folder")
    args = harness.parse_rounds(parser, argv, "batch", "image_size")
    wanted = [n for n in args.contestants.split(",") if n]
    unknown = sorted(set(wanted) - set(BUILDERS))
    if unknown or not wanted:
        parser.error(f"--contestants ({args.contestants!r}): choose from {', '.join(BUILDERS)}")

    contestants = {}
    for name in wanted:
        try:
            contestants[name] = BUILDERS[name](args.batch, args.image_size)
        except ImportError as e:
            print(f"{name}: skipped (tf-models-official not importable: {e})")
    reference = "mlperf_tf" if "mlperf_tf" in contestants else next(iter(contestants))

    harness.warm_up(contestants)
    if args.profile:
        return profile(contestants, args)
    result = harness.interleaved_rounds(
        contestants, steps=args.steps, rounds=args.rounds, samples_per_step=args.batch
    )
    print(
        f"\nResNet-50 train step, batch {args.batch}, {args.image_size} px, synthetic data, "
        f"{args.steps} steps x {args.rounds} rounds; TF {tf.__version__}, Keras "
        f"{keras.__version__}, TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS')}"
    )
    print(harness.report(result, reference, unit="images"))
    return 0


def profile(contestants: dict, args) -> int:
    """Profiles `args.steps` steps of each contestant and prints op time per step."""
    profiles = {}
    for name, run in contestants.items():
        logdir = os.path.join(args.profile, name)
        profiles[name] = profile_ops.profile_ops(run, args.steps, logdir)
        print(f"profiled {name}: {profiles[name]['wall_s']:.2f} s/step", flush=True)
    print(
        f"\nResNet-50 train step, batch {args.batch}, {args.image_size} px, {args.steps} profiled "
        f"steps each; TF {tf.__version__}, load average {os.getloadavg()[0]:.1f}\n"
    )
    print(profile_ops.markdown_table(profiles, "by_category", top=12) + "\n")
    print(profile_ops.markdown_table(profiles, "by_type", top=25))
    return 0


BUILDERS = {
    "mlperf_tf": mlperf_tf_contestant,
    "keras_fit": keras_fit_contestant,
    "model_garden": model_garden_contestant,
    "mlperf_tf_unfused": lambda batch, image_size: mlperf_tf_contestant(
        batch, image_size, fused=False
    ),
}
DEFAULT_CONTESTANTS = ("mlperf_tf", "keras_fit", "model_garden")


if __name__ == "__main__":
    sys.exit(main())
