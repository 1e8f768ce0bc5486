"""What does compiling the rollouts' decoding buy? `qwen35_397b_grpo` rollout generation at the
`mini` model's shape: `mlperf_tf.rl.generation.CompiledGenerator` (compiled prefill per length
bucket, one compiled step over a fixed-capacity key/value cache and the DeltaNet state) as a
graph (`compiled`), with the step compiled by XLA (`xla`), and with XLA in groups of `--rows`
rows a step call (`xla_rows`: the `mini`'s decoding), against the eager `generate` (`--eager`;
the same model, the same seeds, the same tokens), in generated tokens/s.

A step is one batch of `--batch` prompts of `--prompt` tokens continued by `--new` tokens (no
end-of-turn: every row runs to the limit, so no group is ever skipped: this measures the
groups' smaller working set only), sampled at temperature 1; rounds alternate the contestants.

    python tools/costs/bench_grpo_decoding.py [--batch=16] [--prompt=200] [--new=64] [--steps=1]
        [--rounds=3] [--rows=16] [--eager]
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

from benchmarks.qwen35_397b_grpo import config as grpo_config  # noqa: E402
from mlperf_tf.lm.hybrid import build_hybrid_decoder  # noqa: E402
from mlperf_tf.rl.chat import ByteChat  # noqa: E402
from mlperf_tf.rl.generation import CompiledGenerator, generate  # noqa: E402
from tools import harness  # noqa: E402


def contestants(batch: int, prompt: int, new: int, rows: int, eager: bool) -> dict:
    """The generators of one mini model (its MoE on capacity buffers, as the mini's), each a
    `run(steps)`."""
    config = grpo_config.mini()
    keras.utils.set_random_seed(0)
    model = build_hybrid_decoder(config.model)
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(0, 256, size=prompt)) for _ in range(batch)]
    r = config.rollout
    kw = dict(max_new_tokens=new, eos_id=-1, pad_id=ByteChat.PAD, temperature=1.0, top_p=1.0)

    def run(generator):
        def steps(count: int) -> None:
            for s in range(count):
                generator(prompts, seeds=[s * batch + i for i in range(batch)], **kw)

        return steps

    def compiled(**options):
        return CompiledGenerator(
            model, capacity=r.generation_capacity(), bucket=r.prefill_bucket, **options
        )

    out = {
        "compiled": run(compiled()),
        "xla": run(compiled(jit_compile=True)),
        "xla_rows": run(compiled(jit_compile=True, step_rows=rows)),
    }
    if eager:
        out["eager"] = run(lambda p, **k: generate(model, p, **k))
    return out


def main(argv=None) -> None:
    parser = harness.rounds_parser(__doc__.split("\n")[0], steps=1, rounds=3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=200)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--rows", type=int, default=16, help="xla_rows: rows a step call takes")
    parser.add_argument("--eager", action="store_true", help="also the eager path (slow)")
    args = harness.parse_rounds(parser, argv, "batch", "prompt", "new", "rows")
    harness.compare(
        contestants(args.batch, args.prompt, args.new, args.rows, args.eager),
        steps=args.steps, rounds=args.rounds,
        samples_per_step=args.batch * args.new, reference="compiled", unit="tokens",
        title=f"qwen35_397b_grpo mini decoding, batch {args.batch}, prompt {args.prompt}, "
        f"{args.new} new tokens; TF {tf.__version__}, Keras {keras.__version__}",
    )  # fmt: skip


if __name__ == "__main__":
    main()
