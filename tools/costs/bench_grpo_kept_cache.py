"""Does keeping each rollout's cache across its turns make a `qwen35_397b_grpo` mini step's
rollouts faster? Runs the first training step's rollouts (`input.rollout_steps`: `--tasks`
tasks x 16 rollouts at temperature 1, the mini's generator on the mini base) with the cache
prefilled again every turn (`rollout.keep_cache` off, the path before it) and kept
(`CompiledGenerator.session()`), in interleaved rounds (the order alternates: the sandbox
reuses a finished run's test result, which helps whichever runs second), in one process.
Prints each run's seconds, the generator's prefill/append and decoding-step seconds and
calls (the first run of each includes its tracing), how many of its rollouts have the other's
tokens, and the load average.

    python tools/costs/bench_grpo_kept_cache.py [--tasks=8] [--rounds=2]
        [--weights=BASE/model.weights.h5] [--paths=prefilled,kept]

With `--paths=prefilled --rounds=1` it is the first step's training reward of a base (no
update): the proxy of whether GRPO finds an advantage from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

from tools.costs.bench_grpo_rollouts import timed  # noqa: E402

PREFILL = ("_prefill", "_chunk", "_append")  # the generator's prefill calls, either path's
STEPS = ("_step", "_row_step")  # its decoding-step calls


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=8, help="tasks of the step (x 16 rollouts)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--weights", default="", help="default: the mini base's")
    parser.add_argument("--paths", default="prefilled,kept", help="of prefilled, kept")
    args = parser.parse_args(argv)
    paths = args.paths.split(",")
    if args.tasks < 1 or args.rounds < 1 or not paths or set(paths) - {"prefilled", "kept"}:
        parser.error("--tasks and --rounds must be positive, --paths of prefilled, kept")

    import numpy as np  # noqa: PLC0415

    from benchmarks.qwen35_397b_grpo import config as config_lib  # noqa: PLC0415
    from benchmarks.qwen35_397b_grpo import input as input_lib  # noqa: PLC0415
    from benchmarks.qwen35_397b_grpo import sft  # noqa: PLC0415
    from benchmarks.qwen35_397b_grpo.benchmark import Qwen35GrpoBenchmark  # noqa: PLC0415
    from benchmarks.qwen35_397b_grpo.model import load_base_weights  # noqa: PLC0415
    from tools import harness  # noqa: PLC0415

    mini = config_lib.mini()
    grpo = dataclasses.replace(mini.grpo, num_prompts_per_step=args.tasks)
    gbs = grpo.global_batch_size
    bench = Qwen35GrpoBenchmark(dataclasses.replace(
        mini, grpo=grpo, global_batch_size=gbs,
        gradient_accumulation_steps=max(1, gbs // config_lib.MINI_MICRO_BATCH),
    ))  # fmt: skip
    model = bench.build_model()
    load_base_weights(model, args.weights or os.path.join(config_lib.mini_base_dir(), sft.WEIGHTS))
    spent: dict = {}
    generators = {}
    for keep in (False, True):
        config = dataclasses.replace(
            bench.config, rollout=dataclasses.replace(mini.rollout, keep_cache=keep)
        )
        generator = input_lib.generator(model, config)
        for name in PREFILL + STEPS:
            kind = "prefill" if name in PREFILL else "step"
            setattr(generator, name, timed(getattr(generator, name), spent, kind))
        generators["kept" if keep else "prefilled"] = (generator, config)
    batches = {}
    for index in range(args.rounds):
        order = paths if index % 2 == 0 else paths[::-1]
        for name in order:
            generator, config = generators[name]
            spent.update({"prefill": 0.0, "prefill calls": 0, "step": 0.0, "step calls": 0})
            begin = time.time()
            batch = next(input_lib.rollout_steps(generator, config, seed=0))
            seconds = time.time() - begin
            batches[name] = batch
            other = batches.get("kept" if name == "prefilled" else "prefilled")
            same = "-"
            if other is not None:  # rows (rollouts) whose tokens are the other run's
                rows = [np.array_equal(batch[k][i], other[k][i]) for k in ("input_ids",)
                        for i in range(len(batch[k]))]  # fmt: skip
                same = f"{sum(rows)}/{len(rows)} rollouts"
            tokens = int(np.asarray(batch["token_mask"]).sum())
            print(f"round {index + 1} {name}: {seconds:.0f} s; prefill {spent['prefill']:.0f} s "
                  f"({spent['prefill calls']} calls), decoding steps {spent['step']:.0f} s "
                  f"({spent['step calls']} calls); {tokens} policy tokens, mean reward "
                  f"{float(np.mean(batch['rewards'])):.3f}; same tokens as the other: {same}; "
                  f"load {harness.load_average()}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
