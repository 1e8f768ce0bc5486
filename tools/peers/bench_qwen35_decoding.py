"""Measures our rollout decoding against keras-hub's Qwen3.5-MoE `generate` at the GRPO mini's shape.

Both sides continue `--batch` random byte prompts of `--prompt` tokens by `--new` tokens, sampled
at temperature 1 (top-p 1: the GRPO training rollouts' setting), every row to the limit (no end
token), with a model of `qwen35_397b_grpo`'s `mini` shape (`config.mini_model()`: 3 Gated
DeltaNet layers and 1 gated-attention layer of width 128, 4 experts top-2 and a shared expert
in every layer):

  mlperf_tf  `mlperf_tf.rl.generation.CompiledGenerator` made as the benchmark's rollouts make it
             (`input.generator` of the mini config: the decoding step compiled by XLA over a
             fixed-capacity key/value cache and the DeltaNet state, in groups of rows; the
             prefill a bucket at a time).
  keras_hub  `keras_hub.models.Qwen3_5MoeCausalLM.generate` (keras-hub >= 0.32, the peers extra;
             no preprocessor; `RandomSampler`), of the same shape: its backbone is built from the
             Hugging Face config our importer checks against (`checkpoint.hf_config`) by
             keras-hub's own converter, so the two are the same architecture (the test
             `test_moe_model_logits_equal_keras_hub_qwen3_5_moe` shows equal logits on equal
             weights). Here the weights are each side's random initial values: decoding's cost
             does not depend on them, and no end token is sampled.

Rounds interleave the sides (`tools/harness.py`); reported: generated tokens/s, the ratio
mlperf_tf / keras_hub (pooled, median of per-round ratios, each round), CPU seconds per step.
The first call of each side (tracing) is the warm-up, outside the rounds.

    python tools/peers/bench_qwen35_decoding.py [--batch=16] [--prompt=200] [--new=64]
        [--steps=1] [--rounds=3]
"""

from __future__ import annotations

import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.qwen35_397b_grpo import checkpoint  # noqa: E402
from benchmarks.qwen35_397b_grpo import config as grpo_config  # noqa: E402
from benchmarks.qwen35_397b_grpo import input as grpo_input  # noqa: E402
from mlperf_tf.lm.hybrid import build_hybrid_decoder  # noqa: E402
from mlperf_tf.rl.chat import ByteChat  # noqa: E402
from tools import harness  # noqa: E402


def prompts_of(batch: int, prompt: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [[int(t) for t in rng.integers(0, 256, size=prompt)] for _ in range(batch)]


def ours(batch: int, prompt: int, new: int):
    """The benchmark's compiled generator on a `mini_model`, as a `run(steps)`."""
    config = grpo_config.mini()
    keras.utils.set_random_seed(0)
    model = build_hybrid_decoder(config.model)
    generator = grpo_input.generator(model, config)  # the rollouts' own (XLA, row groups)
    prompts = prompts_of(batch, prompt)

    def steps(count: int) -> None:
        for s in range(count):
            generator(prompts, seeds=[s * batch + i for i in range(batch)], max_new_tokens=new,
                      eos_id=-1, pad_id=ByteChat.PAD, temperature=1.0, top_p=1.0)  # fmt: skip

    return steps


def keras_hubs(batch: int, prompt: int, new: int):
    """keras-hub's `Qwen3_5MoeCausalLM` of the same shape, `generate` as a `run(steps)`."""
    import keras_hub  # noqa: PLC0415 (the peers extra)
    from keras_hub.src.utils.transformers import convert_qwen3_5_moe  # noqa: PLC0415

    model_config = grpo_config.mini_model()
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.Qwen3_5MoeBackbone(
        **convert_qwen3_5_moe.convert_backbone_config(checkpoint.hf_config(model_config)),
        dtype="float32",
    )
    lm = keras_hub.models.Qwen3_5MoeCausalLM(backbone=backbone, preprocessor=None)
    lm.compile(sampler=keras_hub.samplers.RandomSampler(temperature=1.0))
    length = prompt + new
    ids = np.zeros((batch, length), np.int32)
    ids[:, :prompt] = np.asarray(prompts_of(batch, prompt), np.int32)
    mask = np.zeros((batch, length), bool)
    mask[:, :prompt] = True
    inputs = {"token_ids": ids, "padding_mask": mask}

    def steps(count: int) -> None:
        for _ in range(count):
            out = lm.generate(inputs, stop_token_ids=None)
            assert int(np.sum(out["padding_mask"])) == batch * length  # every row to the limit

    return steps


def main(argv=None) -> None:
    parser = harness.rounds_parser(__doc__.split("\n")[0], steps=1, rounds=3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=200)
    parser.add_argument("--new", type=int, default=64)
    args = harness.parse_rounds(parser, argv, "batch", "prompt", "new")
    sides = {"mlperf_tf": ours(args.batch, args.prompt, args.new),
             "keras_hub": keras_hubs(args.batch, args.prompt, args.new)}  # fmt: skip
    harness.compare(
        sides, steps=args.steps, rounds=args.rounds, samples_per_step=args.batch * args.new,
        reference="keras_hub", unit="tokens",
        title=f"qwen35_397b_grpo mini decoding against keras-hub {keras_hub_version()}, batch "
        f"{args.batch}, prompt {args.prompt}, {args.new} new tokens; TF {tf.__version__}, "
        f"Keras {keras.__version__}",
    )  # fmt: skip


def keras_hub_version() -> str:
    import keras_hub  # noqa: PLC0415

    return keras_hub.__version__


if __name__ == "__main__":
    main()
