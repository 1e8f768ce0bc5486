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
order (`tools/harness.py`); reported: tokens/s (median, pooled), the ratio mlperf_tf /
keras_hub (pooled, median of per-round ratios, each round) and CPU seconds per step.

`--ceiling` adds a third contestant, `matmuls_only`: the step's matrix products alone (every
projection, both attention products and the output projection, each with its two backward
products), on fixed tensors, with nothing else (no softmax, norm, rotary, loss or optimizer).
A train step in fp32 cannot be faster than that on the same CPU, so the two sides' ratios to it
bound what any speed-up of either can reach.

    python tools/peers/bench_llama.py [--shape=mini|wide|both] [--steps=2] [--rounds=5] [--xla=ours]
                                [--ceiling] [--dtype=fp32|bf16]

`--dtype=bf16` sets Keras' `mixed_bfloat16` policy (as `mlperf-tf run --dtype=bf16` does) before
either model is built, so both sides compute in bf16 with fp32 weights (`matmuls_only` stays
fp32). On a CPU with AVX512_BF16 (`lscpu`) oneDNN runs bf16 products natively; without it bf16
is emulated and slower.
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

from benchmarks.llama31_8b import config as config_lib  # noqa: E402
from benchmarks.llama31_8b.benchmark import Llama31Benchmark  # noqa: E402
from mlperf_tf import precision  # noqa: E402
from mlperf_tf.benchmark import RunContext  # noqa: E402
from tools import harness  # noqa: E402
from tools.peers.bench_fit import mlperf_tf_contestant  # noqa: E402


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


def llama3_backbone(c, **options):
    """keras-hub's `Llama3Backbone` of the shape of `c` (a `llama31_8b` `ModelConfig`), with
    keras-hub's `options` (e.g. `dtype`); the numerics test of the model builds it too."""
    import keras_hub  # noqa: PLC0415 (the peers extra)

    return keras_hub.models.Llama3Backbone(
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
        **options,
    )


def keras_hub_contestant(benchmark: Llama31Benchmark, *, jit_compile="auto"):
    """`Llama3CausalLM` of the benchmark's model shape, trained by `model.fit` (`jit_compile`:
    Keras' "auto" means no XLA on a CPU-only machine)."""
    import keras_hub  # noqa: PLC0415 (the peers extra)

    backbone = llama3_backbone(benchmark.config.model)
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

    return harness.keras_fit_run(model, batches.map(to_keras_hub))


def step_matmuls(config: config_lib.LlamaConfig) -> list[tuple[int, int, int, int]]:
    """The matrix products of one train step's forward pass as (batch, m, k, n): [batch, m, k] x
    [batch, k, n]; each has two backward products of the same FLOPs (dX = dY Wᵀ, dW = Xᵀ dY)."""
    c, b, s = config.model, config.global_batch_size, config.data.max_sequence_length
    t, d, e = b * s, c.hidden_size, c.head_dim
    q, kv = c.num_attention_heads * e, c.num_key_value_heads * e
    per_layer = [
        (1, t, d, q), (1, t, d, kv), (1, t, d, kv),  # query, key, value projections
        (b * c.num_attention_heads, s, e, s),  # scores: all s x s, as both sides compute them
        (b * c.num_attention_heads, s, s, e),  # probabilities x values
        (1, t, q, d),  # attention output projection
        (1, t, d, c.intermediate_size), (1, t, d, c.intermediate_size),  # SwiGLU gate, up
        (1, t, c.intermediate_size, d),  # SwiGLU down
    ]  # fmt: skip
    return per_layer * c.num_hidden_layers + [(1, t, d, c.vocab_size)]


def matmuls_only_contestant(config: config_lib.LlamaConfig):
    """`run(steps)` of `step_matmuls`' forward and backward products on fixed random tensors
    (distinct per product, as the layers' weights are), in one `tf.function`."""
    products = []
    for batch, m, k, n in step_matmuls(config):
        products.append(
            tuple(
                tf.Variable(tf.random.normal([batch, *shape])) for shape in ((m, k), (k, n), (m, n))
            )
        )

    @tf.function
    def one_step():
        total = tf.constant(0.0)
        for x, w, dy in products:
            y = tf.matmul(x, w)
            dx = tf.matmul(dy, w, transpose_b=True)
            dw = tf.matmul(x, dy, transpose_a=True)
            total += y[0, 0, 0] + dx[0, 0, 0] + dw[0, 0, 0]  # each product's result is used
        return total

    def run(steps: int) -> None:
        for _ in range(steps):
            one_step().numpy()

    return run


def measure(
    shape: str, steps: int, rounds: int, xla: str = "none", ceiling: bool = False, dtype="fp32"
) -> None:
    config = shape_config(shape)
    policy = precision.set_policy(dtype)
    keras.utils.set_random_seed(0)
    make = lambda: Llama31Benchmark(config).with_context(RunContext(num_replicas=1))  # noqa: E731
    contestants = {
        "mlperf_tf": mlperf_tf_contestant(make(), xla=xla in ("ours", "both")),
        "keras_hub": keras_hub_contestant(make(), jit_compile=True if xla == "both" else "auto"),
    }
    if ceiling:
        contestants["matmuls_only"] = matmuls_only_contestant(config)
    c = config.model
    model = (
        f"{shape}: {c.num_hidden_layers} layers, hidden {c.hidden_size}, heads "
        f"{c.num_attention_heads}/{c.num_key_value_heads} of {c.head_dim}, SwiGLU "
        f"{c.intermediate_size}, vocab {c.vocab_size}"
    )
    harness.compare_tokens(
        contestants, config, steps=steps, rounds=rounds, model=model,
        note=f"; XLA: {xla}; policy {policy}",
    )  # fmt: skip


def main(argv=None) -> int:
    parser = harness.rounds_parser(__doc__.splitlines()[0], steps=2)
    parser.add_argument("--shape", choices=("mini", "wide", "both"), default="both")
    parser.add_argument(
        "--xla", choices=("none", "ours", "both"), default="none",
        help="none: neither side compiled (keras-hub's fit default on a CPU); ours: our step "
        "with --xla; both: ours with --xla and keras-hub's fit with jit_compile=True",
    )  # fmt: skip
    parser.add_argument(
        "--ceiling", action="store_true",
        help="add `matmuls_only`: the step's matrix products alone, the fp32 bound of both sides",
    )  # fmt: skip
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    args = harness.parse_rounds(parser, argv)
    for shape in ("mini", "wide") if args.shape == "both" else (args.shape,):
        measure(shape, args.steps, args.rounds, args.xla, args.ceiling, args.dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
