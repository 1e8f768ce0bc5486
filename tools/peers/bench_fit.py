"""Measures any benchmark's train step in the suite's runner against Keras `model.fit` of the same model.

For a benchmark with no Model Garden trainer at matching settings, the nearest default a user
would run is Keras' own loop. Contestants, on the benchmark's synthetic batches (one per step,
no input cost beyond the synthetic pipeline), or on its real training data when
`--config.data_dir=DIR` is given:

  mlperf_tf  `build_model`, `build_optimizer`, `compute_loss` in the runner's `Trainer` (the
             compiled host loop of `mlperf-tf run`), one `tf.range` loop per call.
  keras_fit  a fresh `build_model()` wrapped in a `keras.Model` whose `train_step` is Keras'
             default one (tape, `compute_loss`, `optimizer.apply_gradients`, metrics update)
             with the benchmark's loss, compiled with the benchmark's optimizer and Keras'
             default `jit_compile`, and trained by `model.fit(steps_per_epoch=N)` per call,
             timed from its first step's start to its last step's end
             (`harness.keras_fit_run`: a call's own set-up and teardown are left out).

Rounds interleave the contestants in a rotating order (one warm-up call each first;
`tools/harness.py`); reported: samples per second in the preset's batch unit (images, or
token slots for the Transformer; median, pooled), the ratio mlperf_tf / keras_fit (pooled, the
median of per-round ratios and each round's) and process CPU seconds per step, which other
jobs' load distorts far less than wall time.

    python tools/peers/bench_fit.py --benchmark=transformer --preset=mini [--steps=2] [--rounds=6]
        [--config.KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from mlperf_tf import config as config_lib  # noqa: E402
from mlperf_tf import registry  # noqa: E402
from mlperf_tf.benchmark import RunContext  # noqa: E402
from mlperf_tf.config import split_config_overrides  # noqa: E402
from tools import harness  # noqa: E402
from tools.harness import require_positive  # noqa: E402


def make_benchmark(name: str, preset: str, overrides: dict[str, str]):
    """The benchmark on one replica, on synthetic data unless `--config.data_dir` is given."""
    benchmark_class = registry.get(name)
    config = config_lib.override(benchmark_class.preset(preset), {"data_dir": "", **overrides})
    return benchmark_class(config).with_context(RunContext(num_replicas=1))


def mlperf_tf_contestant(benchmark, build_optimizer=None, *, xla: bool = False):
    """The runner's loop (`xla`: `--xla`'s compiled replica step); `build_optimizer(benchmark)`
    replaces the benchmark's (ablations)."""
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    parts = harness.runner_parts(strategy, benchmark, xla=xla, build_optimizer=build_optimizer)
    return parts.run


class _FitModel(keras.Model):
    """Keras' default train step around a benchmark's model and loss (TF backend)."""

    def __init__(self, benchmark, inner: keras.Model):
        super().__init__()
        self.benchmark = benchmark
        self.inner = inner

    def call(self, inputs, training=False):
        return self.inner(inputs, training=training)

    def train_step(self, data):
        with tf.GradientTape() as tape:
            loss = self.benchmark.compute_loss(self.inner, data, training=True)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


def keras_fit_contestant(benchmark):
    model = _FitModel(benchmark, benchmark.build_model())
    model.compile(optimizer=benchmark.build_optimizer(benchmark.train_steps))
    dataset = benchmark.train_dataset(tf.distribute.InputContext())
    return harness.keras_fit_run(model, dataset)


def main(argv=None) -> int:
    argv, overrides = split_config_overrides(list(sys.argv[1:] if argv is None else argv))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmark", required=True)
    parser.add_argument("--preset", default="mini")
    parser.add_argument("--steps", type=int, default=2, help="steps per contestant per round")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    require_positive(parser, args, "steps", "rounds")
    keras.utils.set_random_seed(0)
    contestants = {
        "mlperf_tf": mlperf_tf_contestant(make_benchmark(args.benchmark, args.preset, overrides)),
        "keras_fit": keras_fit_contestant(make_benchmark(args.benchmark, args.preset, overrides)),
    }
    batch = make_benchmark(args.benchmark, args.preset, overrides).config.global_batch_size
    title = (
        f"{args.benchmark} ({args.preset}) train step, global batch {batch} (the preset's unit), "
        f"{args.steps} steps x {args.rounds} rounds; TF {tf.__version__}, Keras "
        f"{keras.__version__}\n"
    )
    harness.compare(
        contestants, steps=args.steps, rounds=args.rounds, samples_per_step=batch,
        reference="mlperf_tf", title=title,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
