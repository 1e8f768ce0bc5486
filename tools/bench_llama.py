"""Measures our Llama 3.1 train step against keras-hub's `Llama3CausalLM` trained by `model.fit`.

Both sides train the same architecture (Llama 3 blocks: RMSNorm, rotary positions with Llama 3.1
scaling, grouped-query attention, SwiGLU, untied output) on the same synthetic batch shape, with
the same loss (mean next-token cross-entropy over all tokens), the same optimizer (the suite's
`AdamW`, 0.9/0.95/1e-5, weight decay 0.1, on the benchmark's warm-up + cosine schedule) and a
global-norm clip of 1.0:

  mlperf_tf  `benchmarks.llama31_8b` in the runner's `Trainer` (the compiled loop of
             `mlperf-tf run`).
  keras_hub  `keras_hub.models.Llama3CausalLM` (backbone `Llama3Backbone`, no preprocessor),
             compiled with the same optimizer (`global_clipnorm=1.0`) and
             `SparseCategoricalCrossentropy(from_logits=True)`, trained by `model.fit`.

Two shapes: `mini` (the mini preset's model: 3 layers, hidden 256, GQA 4/2 heads of 64, SwiGLU
512, vocab 1,024, sequence 256, batch 8) and `wide` (2 layers, hidden 1,024, GQA 8/2 heads of
128, SwiGLU 2,816, vocab 1,024, sequence 256, batch 4). Rounds interleave the sides in a rotating
order (`tools/interleave.py`); reported: tokens/s (median, pooled), the ratio mlperf_tf /
keras_hub (pooled, median of per-round ratios, each round) and CPU seconds per step.

    python tools/bench_llama.py [--shape=mini|wide|both] [--steps=2] [--rounds=5] [--xla=ours]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.llama31_8b import config as config_lib  # noqa: E402
from benchmarks.llama31_8b.benchmark import Llama31Benchmark  # noqa: E402
from mlperf_tf.benchmark import RunContext  # noqa: E402
from tools import interleave  # noqa: E402
from tools.args import require_positive  # noqa: E402
from tools.bench_fit import mlperf_tf_contestant  # noqa: E402


def shape_config(shape: str) -> config_lib.LlamaConfig:
    """The synthetic-data config of one measured shape."""
    mini = config_lib.mini()
    if shape == "mini":
        return dataclasses.replace(mini, data_dir="")
    model = dataclasses.replace(
        mini.model,
        hidden_size=1024,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        intermediate_size=2816,
    )
    return dataclasses.replace(mini, data_dir="", model=model, global_batch_size=4)


def keras_hub_contestant(benchmark: Llama31Benchmark, *, jit_compile="auto"):
    """`Llama3CausalLM` of the benchmark's model shape, trained by `model.fit` (`jit_compile`:
    Keras' "auto" means no XLA on a CPU-only machine)."""
    import keras_hub  # noqa: PLC0415 (the peers extra)

    c = benchmark.config.model
    backbone = keras_hub.models.Llama3Backbone(
        vocabulary_size=c.vocab_size,
        num_layers=c.num_hidden_layers,
        num_query_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        hidden_dim=c.hidden_size,
        intermediate_dim=c.intermediate_size,
        rope_max_wavelength=c.rope_theta,
        rope_frequency_adjustment_factor=c.rope_scaling_factor,
        rope_low_freq_factor=c.rope_low_freq_factor,
        rope_high_freq_factor=c.rope_high_freq_factor,
        rope_pretraining_sequence_length=c.rope_original_max_position,
        layer_norm_epsilon=c.rms_norm_eps,
    )
    model = keras_hub.models.Llama3CausalLM(backbone=backbone, preprocessor=None)
    optimizer = benchmark.build_optimizer(benchmark.train_steps)
    optimizer.global_clipnorm = 1.0
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=jit_compile,
    )
    batches = benchmark.train_dataset(tf.distribute.InputContext())

    def to_keras_hub(batch):
        ids = batch["input_ids"]
        return {"token_ids": ids, "padding_mask": tf.ones_like(ids)}, batch["labels"]

    return interleave.keras_fit_run(model, batches.map(to_keras_hub))


def measure(shape: str, steps: int, rounds: int, xla: str = "none") -> None:
    config = shape_config(shape)
    keras.utils.set_random_seed(0)
    make = lambda: Llama31Benchmark(config).with_context(RunContext(num_replicas=1))  # noqa: E731
    contestants = {
        "mlperf_tf": mlperf_tf_contestant(make(), xla=xla in ("ours", "both")),
        "keras_hub": keras_hub_contestant(make(), jit_compile=True if xla == "both" else "auto"),
    }
    tokens = config.global_batch_size * config.data.max_sequence_length
    interleave.warm_up(contestants)
    result = interleave.interleaved_rounds(
        contestants, steps=steps, rounds=rounds, samples_per_step=tokens
    )
    c = config.model
    print(
        f"\n{shape}: {c.num_hidden_layers} layers, hidden {c.hidden_size}, heads "
        f"{c.num_attention_heads}/{c.num_key_value_heads} of {c.head_dim}, SwiGLU "
        f"{c.intermediate_size}, vocab {c.vocab_size}, batch {config.global_batch_size} x "
        f"sequence {config.data.max_sequence_length}; {steps} steps x {rounds} rounds; TF "
        f"{tf.__version__}, Keras {keras.__version__}; XLA: {xla}\n"
    )
    print(interleave.report(result, "mlperf_tf", unit="tokens"), flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=("mini", "wide", "both"), default="both")
    parser.add_argument("--steps", type=int, default=2, help="steps per side per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--xla", choices=("none", "ours", "both"), default="none",
        help="none: neither side compiled (keras-hub's fit default on a CPU); ours: our step "
        "with --xla; both: ours with --xla and keras-hub's fit with jit_compile=True",
    )  # fmt: skip
    args = parser.parse_args(argv)
    require_positive(parser, args, "steps", "rounds")
    for shape in ("mini", "wide") if args.shape == "both" else (args.shape,):
        measure(shape, args.steps, args.rounds, args.xla)
    return 0


if __name__ == "__main__":
    sys.exit(main())
