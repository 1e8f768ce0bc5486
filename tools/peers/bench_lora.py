"""Measures our LoRA fine-tuning step (`llama2_70b_lora`) against keras-hub's `LlamaCausalLM`
with Keras' `enable_lora`, trained by `model.fit`.

Both sides: the mini preset's base shape (4 layers, hidden 256, GQA 4/2 heads of 64, SwiGLU 512,
vocab 1,024, plain RoPE), sequence 256, batch 8, rank 16, the base frozen, the same synthetic
prompt/summary batches, the loss over the summary tokens (keras-hub: sparse cross-entropy with
sample weights 0 on the prompt), the suite's AdamW on the benchmark's cosine schedule, clip 0.3.

  mlperf_tf  `benchmarks.llama2_70b_lora` in the runner's `Trainer` (fused qkv: one A shared by
             q, k, v; adapters on qkv and o; dropout 0.1 on the adapter input).
  keras_hub  `LlamaBackbone.enable_lora(16, ["query", "key", "value", "attention_output"])`:
             Keras' `EinsumDense.enable_lora` on q, k, v apart (three A matrices) and o, no
             dropout, A @ B merged into each kernel on every call.

  mlperf_tf_dropout0  our step at `lora.dropout` 0: the function keras-hub computes (its form has
             no adapter dropout), so the pair shows what the reference's dropout costs.

Rounds interleave the sides (`tools/harness.py`); reported: tokens/s, the ratio mlperf_tf /
keras_hub (pooled, median of per-round ratios, each round), and CPU seconds per step.
`--intra_op_threads=1` runs every op on one thread (TF's inter- and intra-op pools of 1): on a
shared, loaded machine the CPU time is then the work itself, not threads spinning for a core.

    python tools/peers/bench_lora.py [--steps=2] [--rounds=5] [--intra_op_threads=N]
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

from benchmarks.llama2_70b_lora import config as config_lib  # noqa: E402
from benchmarks.llama2_70b_lora.benchmark import LoraBenchmark  # noqa: E402
from mlperf_tf.benchmark import RunContext  # noqa: E402
from tools import harness  # noqa: E402
from tools.peers.bench_fit import mlperf_tf_contestant  # noqa: E402

KERAS_HUB_TARGETS = ["query", "key", "value", "attention_output"]


def bench_config(dropout: float | None = None) -> config_lib.LoraBenchmarkConfig:
    """The mini preset on synthetic data (no base checkpoint: speed does not depend on it);
    `dropout` replaces the adapters' dropout rate."""
    config = dataclasses.replace(
        config_lib.mini(), data_dir="", base_checkpoint="", dataset_train_samples=1
    )
    if dropout is not None:
        config = dataclasses.replace(config, lora=dataclasses.replace(config.lora, dropout=dropout))
    return config


def keras_hub_contestant(benchmark: LoraBenchmark):
    """`LlamaCausalLM` of the benchmark's base shape with `enable_lora(rank)`, by `model.fit`."""
    import keras_hub  # noqa: PLC0415 (the peers extra)

    c = benchmark.config.model
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=c.vocab_size, num_layers=c.num_hidden_layers,
        num_query_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
        hidden_dim=c.hidden_size, intermediate_dim=c.intermediate_size,
        rope_max_wavelength=c.rope_theta, layer_norm_epsilon=c.rms_norm_eps,
    )  # fmt: skip
    backbone.enable_lora(benchmark.config.lora.rank, target_layer_names=KERAS_HUB_TARGETS)
    model = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    optimizer = benchmark.build_optimizer(benchmark.train_steps)
    optimizer.global_clipnorm = benchmark.config.gradient_clip_norm
    model.compile(
        optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    batches = benchmark.train_dataset(tf.distribute.InputContext())

    def to_keras_hub(batch):
        ids, labels = batch["input_ids"], batch["labels"]
        weights = tf.cast(labels >= 0, tf.float32)
        return {"token_ids": ids, "padding_mask": tf.ones_like(ids)}, tf.maximum(labels, 0), weights

    trainable = sum(int(v.shape.num_elements()) for v in model.trainable_variables)
    print(f"keras_hub trainable parameters: {trainable:,}")
    return harness.keras_fit_run(model, batches.map(to_keras_hub))


def measure(steps: int, rounds: int) -> None:
    config = bench_config()
    keras.utils.set_random_seed(0)

    def make(c=config):
        return LoraBenchmark(c).with_context(RunContext(num_replicas=1))

    print(f"mlperf_tf trainable parameters: {make().trainable_parameter_count():,}")
    contestants = {
        "mlperf_tf": mlperf_tf_contestant(make()),
        "mlperf_tf_dropout0": mlperf_tf_contestant(make(bench_config(dropout=0.0))),
        "keras_hub": keras_hub_contestant(make()),
    }
    c = config.model
    model = f"LoRA r{config.lora.rank}: {c.num_hidden_layers} layers, hidden {c.hidden_size}"
    harness.compare_tokens(contestants, config, steps=steps, rounds=rounds, model=model)


def main(argv=None) -> int:
    parser = harness.rounds_parser(__doc__.splitlines()[0], steps=2)
    parser.add_argument(
        "--intra_op_threads", type=int, default=0,
        help="threads of TF's op pools (0: TF's default, one per core)",
    )  # fmt: skip
    args = harness.parse_rounds(parser, argv)
    if args.intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.intra_op_threads)
    measure(args.steps, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
