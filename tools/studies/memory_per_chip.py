"""Prints (or writes into the benchmark's README) the memory a chip holds to train an LLM's
`mlperf` preset under the first layout that fits 80, 192 and 288 GB chips
(`LanguageModelBenchmark.memory_table`, `mlperf_tf.parallel.memory`); the README's table is
checked against this output by `tests/mlperf_tf/parallel/test_memory.py`.

    python tools/studies/memory_per_chip.py --benchmark=llama31_8b [--write]
"""

from __future__ import annotations

import argparse
import pathlib
import re

from mlperf_tf import registry

REPO = pathlib.Path(__file__).resolve().parents[2]
HEADING = "## Memory per chip (`mlperf` preset)"


NONE_FITS = (
    '\n"None fits": not on this benchmark\'s axes with every activation kept; runs at that size '
    "recompute activations (Megatron's `--recompute-activations`) or split the sequence "
    "(`--context_parallel`), which this estimate does not count.\n"
)


MOMENTS_NOTE = (
    "\nThe Adam moments column is the worst stage's: divided by P on a pipeline layout (the "
    "stage map), and by the data axis under `--weight_update_sharding`. The suite's runs hold "
    "exactly that at every P > 1: the update is sharded by the stage map over the pipeline axis "
    "with or without `--weight_update_sharding` (without it each stage's replicas hold their "
    "stage's moments whole; `mlperf_tf/parallel/README.md`, pipeline section), but for a model "
    "with a variable that two stages read (a tied embedding, or one an MTP head on the last "
    "stage reads) under the flag, whose moments are then divided evenly over P x data. The "
    "weights and gradients columns are the stage's too, which "
    "the suite's mirrored variables do not give: every chip holds the whole model's.\n"
)


def section(benchmark) -> str:
    table = benchmark.memory_table()
    return (
        f"{HEADING}\n\n"
        "Computed by `LanguageModelBenchmark.memory_table` (`mlperf_tf/parallel/memory.py` says "
        "what it counts: float32 weights and gradients as Keras' mixed precision keeps them, "
        "Adam's two float32 moments, bfloat16 activations of a fused attention kernel without "
        "recomputation, one sequence per micro-batch, 1F1B's in-flight micro-batches on the "
        "worst stage; no framework workspace). Per chip size, the first layout on this "
        "benchmark's axes, fewest chips per model copy first, that fills at most 90 % of the "
        "chip; GB = 1e9 bytes. Regenerate: `python tools/studies/memory_per_chip.py "
        f"--benchmark={benchmark.name} --write`.\n\n{table}\n"
        + (NONE_FITS if "none" in table else "")
        + MOMENTS_NOTE
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--benchmark", required=True)
    parser.add_argument("--write", action="store_true", help="replace the README's section")
    args = parser.parse_args(argv)
    cls = registry.get(args.benchmark)
    benchmark = cls(cls.preset("mlperf"))
    text = section(benchmark)
    if not args.write:
        print(text)
        return
    readme = REPO / "benchmarks" / args.benchmark / "README.md"
    old = readme.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(HEADING) + r".*?(?=\n## |\Z)", re.S)
    new = pattern.sub(lambda _: text.rstrip("\n") + "\n", old) if HEADING in old else (
        old.rstrip("\n") + "\n\n" + text
    )  # fmt: skip
    readme.write_text(new, encoding="utf-8")
    print(f"wrote {readme}")


if __name__ == "__main__":
    main()
