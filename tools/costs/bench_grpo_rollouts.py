"""Where does a `qwen35_397b_grpo` mini rollout batch's time go? Runs the held-out evaluation
of `--tasks` tasks (the mini's validation batches: 32 tasks x 4 rollouts) with the mini base and
the mini's generator `--passes` times in one process, timing the generator's prefill calls and
decoding-step calls (the first pass includes their tracing); the rest is the host loop and the
sandbox's tools and tests. Prints each pass's pass@4, seconds and load average.

    python tools/costs/bench_grpo_rollouts.py [--tasks=32] [--passes=2] [--bucketed_prefill]
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


def timed(fn, spent: dict, key: str):
    """`fn`, adding its wall time (until its first output is on the host) to `spent[key]`."""

    def call(*args, **kwargs):
        begin = time.time()
        out = fn(*args, **kwargs)
        out[0].numpy()
        spent[key] += time.time() - begin
        spent[key + " calls"] += 1
        return out

    return call


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--bucketed_prefill", action="store_true",
                        help="one prefill trace per length bucket (not the mini's chunks)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.tasks < 1 or args.passes < 1:
        parser.error("--tasks and --passes must be positive")

    from benchmarks.qwen35_397b_grpo import config as config_lib  # noqa: PLC0415
    from benchmarks.qwen35_397b_grpo import sft  # noqa: PLC0415
    from benchmarks.qwen35_397b_grpo.benchmark import Qwen35GrpoBenchmark  # noqa: PLC0415
    from benchmarks.qwen35_397b_grpo.model import load_base_weights  # noqa: PLC0415
    from tools import harness  # noqa: PLC0415

    config = config_lib.mini()
    rollout = dataclasses.replace(
        config.rollout, eval_tasks=args.tasks, chunked_prefill=not args.bucketed_prefill
    )
    config = dataclasses.replace(
        config, rollout=rollout, eval_batch_size=min(config.eval_batch_size, args.tasks)
    )
    bench = Qwen35GrpoBenchmark(config)
    model = bench.build_model()
    load_base_weights(model, os.path.join(config_lib.mini_base_dir(), sft.WEIGHTS))
    bench.bind_model(model)
    generator = bench._policy_model()
    spent = {}
    generator._prefill = timed(generator._prefill, spent, "prefill")
    generator._chunk = timed(generator._chunk, spent, "prefill")
    generator._step = timed(generator._step, spent, "step")
    for index in range(args.passes):
        spent.update({"prefill": 0.0, "prefill calls": 0, "step": 0.0, "step calls": 0})
        begin = time.time()
        value = sft.held_out_pass_at_k(generator, config)
        print(f"pass {index + 1}: pass@4 {value:.3f} on {args.tasks} tasks, "
              f"{time.time() - begin:.0f} s: prefill {spent['prefill']:.0f} s "
              f"({spent['prefill calls']} calls), decoding steps {spent['step']:.0f} s "
              f"({spent['step calls']} calls); load {harness.load_average()}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
