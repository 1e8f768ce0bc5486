"""Times the Transformer's eval decoding with and without retiring decided sentences.

The mini preset's eval is beam search (beam 4, GNMT length penalty) of the 500 held-out pairs in
batches of `eval_batch_size`, `eval_max_length + extra_decode_length` positions. Without
`retire_finished` every batch runs until all its sentences are decided (an untrained model:
to the length cap); with it, a decided sentence leaves the loop (`beam_search.py`). This
decodes the eval set both ways with the weights of a mini run's checkpoint, in alternating
order per round (a shared machine's load hits both alike), checks that the decoded ids are
equal, and prints the seconds per pass, their ratio and the BLEU of each:

  python tools/costs/bench_transformer_eval.py --checkpoint=/tmp/tr_mini/ckpt/ckpt-700 --rounds=3

The checkpoint is a runner checkpoint (`<model_dir>/ckpt/ckpt-N`); the model's weights are
restored through the optimizer's variables as the runner saves them. Without `--checkpoint` the
model is the untrained one (every sentence decodes to the length cap).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

from tools import harness  # noqa: E402
from tools.harness import require_positive  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", default="", help="runner checkpoint prefix (ckpt-N)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--preset", default="mini")
    args = parser.parse_args(argv)
    require_positive(parser, args, "rounds")
    if args.checkpoint and not os.path.exists(args.checkpoint + ".index"):
        parser.error(f"--checkpoint ({args.checkpoint}): no {args.checkpoint}.index")
    import numpy as np  # noqa: PLC0415 (after the flags: --help without TF)
    import tensorflow as tf  # noqa: PLC0415

    from benchmarks.transformer import beam_search, bleu, prepare  # noqa: PLC0415
    from mlperf_tf import registry  # noqa: PLC0415

    cls = registry.get("transformer")
    benchmark = cls(cls.preset(args.preset))
    model = benchmark.build_model()
    if args.checkpoint:
        # The runner's checkpoint reaches the layers' variables through the optimizer's.
        optimizer = benchmark.build_optimizer(1)
        optimizer.build(model.trainable_variables)
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
        checkpoint.restore(args.checkpoint).expect_partial().assert_existing_objects_matched()
    batches = list(benchmark.eval_dataset(None))
    m = benchmark.config.model

    def decoder(retire: bool):
        @tf.function
        def decode(inputs):
            return beam_search.translate(
                model, inputs, beam_size=m.beam_size, alpha=m.alpha,
                max_decode_length=benchmark.max_decode_length, eos_id=prepare.EOS_ID,
                retire_finished=retire,
            )  # fmt: skip

        return decode

    decoders = {"whole batch": decoder(False), "retiring": decoder(True)}
    for decode in decoders.values():  # trace outside the timing
        decode(batches[0]["inputs"])
    outputs = {}

    def contestant(name):
        def run(passes: int) -> None:
            for _ in range(passes):
                outputs[name] = [decoders[name](b["inputs"]).numpy() for b in batches]

        return run

    result = harness.interleaved_rounds(
        {name: contestant(name) for name in decoders},
        steps=1, rounds=args.rounds, samples_per_step=len(batches),
    )  # fmt: skip
    equal = all(np.array_equal(a, b) for a, b in zip(*outputs.values()))

    def score(decoded) -> float:
        state = {}
        for batch, ids in zip(batches, decoded):
            for row in np.flatnonzero(batch["valid"].numpy() > 0):
                state[int(batch["index"][row])] = (ids[row], batch["targets"][row].numpy())
        return bleu.uncased_bleu(*benchmark.translations(state))

    print(
        f"decoded ids equal: {equal}; BLEU "
        + ", ".join(f"{n} {score(o):.4f}" for n, o in outputs.items())
    )
    print(f"eval passes of {len(batches)} batches:")
    print(harness.report(result, "whole batch", unit="batches"))
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
