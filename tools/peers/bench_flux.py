"""Measures our FLUX.1 train step against keras-hub's `FluxBackbone` trained by `model.fit`.

Both sides train the mini preset's MMDiT (2 double and 4 single blocks, hidden 128, 4 heads, 64
image tokens of 4 features, 8 text tokens of 32, batch 32) on the same synthetic batches, with the
same loss (the velocity's mean squared error on the noised latent), the same optimizer (the suite's
`AdamW` 0.9/0.95/1e-8, weight decay 0.1, warm-up then constant) and a global-norm clip of 1.0:

  mlperf_tf  `benchmarks.flux1` in the runner's `Trainer` (the compiled loop of `mlperf-tf run`).
  keras_hub  `keras_hub.models.FluxBackbone` (peers extra) of the same shape, compiled with the
             same optimizer (`global_clipnorm=1.0`) and `mse`, trained by `model.fit` on the
             same batches noised and patched in the input pipeline.

Rounds interleave the sides in a rotating order (`tools/harness.py`); reported: images/s
(median, pooled), the ratio mlperf_tf / keras_hub (pooled, median of per-round ratios, each round).

    python tools/peers/bench_flux.py [--steps=5] [--rounds=5]
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.flux1 import config as config_lib  # noqa: E402
from benchmarks.flux1 import model as model_lib  # noqa: E402
from benchmarks.flux1.benchmark import FluxBenchmark  # noqa: E402
from mlperf_tf.benchmark import RunContext  # noqa: E402
from tools import harness  # noqa: E402
from tools.peers.bench_fit import mlperf_tf_contestant  # noqa: E402


def keras_hub_contestant(benchmark: FluxBenchmark):
    """`FluxBackbone` of the benchmark's shape trained by `model.fit` (no XLA on a CPU)."""
    import keras_hub  # noqa: PLC0415 (the peers extra)

    c, d = benchmark.config.model, benchmark.config.data
    grid = d.latent_size // config_lib.PATCH
    n = grid * grid
    backbone = keras_hub.models.FluxBackbone(
        input_channels=c.in_channels, hidden_size=c.hidden_size, mlp_ratio=c.mlp_ratio,
        num_heads=c.num_heads, depth=c.depth, depth_single_blocks=c.depth_single_blocks,
        axes_dim=list(c.axes_dim), theta=c.theta, use_bias=c.qkv_bias,
        image_shape=(n, c.in_channels), text_shape=(d.t5_length, c.context_in_dim),
        image_ids_shape=(n, 3), text_ids_shape=(d.t5_length, 3), y_shape=(c.vec_in_dim,),
    )  # fmt: skip
    optimizer = benchmark.build_optimizer(benchmark.train_steps)
    optimizer.global_clipnorm = 1.0
    backbone.compile(optimizer=optimizer, loss="mse")
    ids = model_lib.position_ids(d.t5_length, grid, grid)

    def to_keras_hub(batch):
        b = tf.shape(batch["t"])[0]
        x0, noise, t = batch["latents"], batch["noise"], batch["t"]
        t4 = t[:, None, None, None]
        inputs = {
            "image": model_lib.pack_latents((1.0 - t4) * x0 + t4 * noise),
            "image_ids": tf.broadcast_to(ids[d.t5_length :], [b, n, 3]),
            "text": batch["t5"],
            "text_ids": tf.broadcast_to(ids[: d.t5_length], [b, d.t5_length, 3]),
            "y": batch["clip"],
            "timesteps": t,
            "guidance": tf.zeros_like(t),
        }
        return inputs, model_lib.pack_latents(noise - x0)

    batches = benchmark.train_dataset(tf.distribute.InputContext())
    return harness.keras_fit_run(backbone, batches.map(to_keras_hub))


def measure(steps: int, rounds: int) -> None:
    config = dataclasses.replace(config_lib.mini(), data_dir="")
    keras.utils.set_random_seed(0)
    make = lambda: FluxBenchmark(config).with_context(RunContext(num_replicas=1))  # noqa: E731
    contestants = {
        "mlperf_tf": mlperf_tf_contestant(make()),
        "keras_hub": keras_hub_contestant(make()),
    }
    c = config.model
    harness.compare(
        contestants, steps=steps, rounds=rounds, samples_per_step=config.global_batch_size,
        reference="mlperf_tf", unit="images",
        title=(
            f"mini: {c.depth} double + {c.depth_single_blocks} single blocks, hidden "
            f"{c.hidden_size}, {c.num_heads} heads, batch {config.global_batch_size}; {steps} "
            f"steps x {rounds} rounds; TF {tf.__version__}, Keras {keras.__version__}"
        ),
    )  # fmt: skip


def main(argv=None) -> int:
    parser = harness.rounds_parser(__doc__.splitlines()[0], steps=5)
    args = harness.parse_rounds(parser, argv)
    measure(args.steps, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
