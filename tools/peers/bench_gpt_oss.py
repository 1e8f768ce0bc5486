"""Measures our GPT-OSS train step against keras-hub's `GptOssCausalLM` trained by `model.fit`.

Both sides train a GPT-OSS of the `mini` preset's shape (4 layers, hidden 256, GQA 4/2 heads of
64, vocab 1,024, sequence 256, batch 8) with `--experts` experts of width 256 and top-`--top_k`
routing (top-k on the router logits, then a softmax over the k), on synthetic batches, with the
same loss (mean next-token cross-entropy), the same optimizer (the suite's `AdamW` on the
benchmark's schedule) and a global-norm clip of 1.0:

  mlperf_tf  `benchmarks.gpt_oss_20b` in the runner's `Trainer`: each expert runs on the rows
             routed to it (`MoEConfig.dispatch="sorted"`).
  keras_hub  `keras_hub.models.GptOssCausalLM` (`GptOssBackbone`, no preprocessor), compiled with
             the same optimizer (`global_clipnorm=1.0`) and trained by `model.fit`: every expert
             runs on every token (`GptOssExperts`), weighted by a dense [tokens, experts] score.

The architectures differ where keras-hub's is OpenAI's gpt-oss (sinks, biases, clamped SwiGLU,
no QK-norm: README.md of the benchmark); the work that scales with the experts is the MoE.
Rounds interleave the sides (`tools/harness.py`); reported: tokens/s, the ratio
mlperf_tf / keras_hub (pooled, median of per-round ratios, each round), CPU seconds per step.

    python tools/peers/bench_gpt_oss.py [--experts=8] [--top_k=2] [--steps=2] [--rounds=5]
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

from benchmarks.gpt_oss_20b import config as config_lib  # noqa: E402
from benchmarks.gpt_oss_20b.benchmark import GptOssBenchmark  # noqa: E402
from mlperf_tf.benchmark import RunContext  # noqa: E402
from tools import harness  # noqa: E402
from tools.peers.bench_fit import mlperf_tf_contestant  # noqa: E402


def shape_config(experts: int, top_k: int) -> config_lib.GptOssConfig:
    """The mini preset on synthetic data with `experts` experts, top-`top_k`."""
    mini = config_lib.mini()
    moe = dataclasses.replace(mini.model.moe, num_experts=experts, top_k=top_k)
    return dataclasses.replace(mini, data_dir="", model=dataclasses.replace(mini.model, moe=moe))


def keras_hub_contestant(benchmark: GptOssBenchmark):
    """`GptOssCausalLM` of the benchmark's shape, trained by `model.fit` (no XLA on a CPU)."""
    import keras_hub  # noqa: PLC0415 (the peers extra)

    c = benchmark.config.model
    backbone = keras_hub.models.GptOssBackbone(
        vocabulary_size=c.vocab_size, num_layers=c.num_hidden_layers,
        num_query_heads=c.num_attention_heads, hidden_dim=c.hidden_size,
        intermediate_dim=c.moe.filter_size, num_key_value_heads=c.num_key_value_heads,
        num_experts=c.moe.num_experts, top_k=c.moe.top_k, rope_max_wavelength=c.rope_theta,
        layer_norm_epsilon=c.rms_norm_eps, sliding_window=c.sliding_window - 1,
        head_dim=c.head_dim,
    )  # fmt: skip
    model = keras_hub.models.GptOssCausalLM(backbone=backbone, preprocessor=None)
    optimizer = benchmark.build_optimizer(benchmark.train_steps)
    optimizer.global_clipnorm = 1.0
    model.compile(
        optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    batches = benchmark.train_dataset(tf.distribute.InputContext())

    def to_keras_hub(batch):
        ids = batch["input_ids"]
        return {"token_ids": ids, "padding_mask": tf.ones_like(ids)}, batch["labels"]

    return harness.keras_fit_run(model, batches.map(to_keras_hub))


def measure(experts: int, top_k: int, steps: int, rounds: int) -> None:
    config = shape_config(experts, top_k)
    keras.utils.set_random_seed(0)
    make = lambda: GptOssBenchmark(config).with_context(RunContext(num_replicas=1))  # noqa: E731
    contestants = {
        "mlperf_tf": mlperf_tf_contestant(make(), xla=False),
        "keras_hub": keras_hub_contestant(make()),
    }
    c = config.model
    model = (
        f"{c.num_hidden_layers} layers, hidden {c.hidden_size}, {experts} experts of "
        f"{c.moe.filter_size} top-{top_k}"
    )
    harness.compare_tokens(contestants, config, steps=steps, rounds=rounds, model=model)


def main(argv=None) -> int:
    parser = harness.rounds_parser(__doc__.splitlines()[0], steps=2)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top_k", type=int, default=2)
    args = harness.parse_rounds(parser, argv, "experts", "top_k")
    if args.top_k > args.experts:
        parser.error(f"--top_k ({args.top_k}) must be at most --experts ({args.experts})")
    measure(args.experts, args.top_k, args.steps, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
