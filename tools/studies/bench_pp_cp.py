"""The training step under pipeline (and context) parallelism against the unsplit layout at the
same global batch and devices, in interleaved rounds (issue 47).

Each round runs `mlperf-tf bench --json` once per layout, in an order that alternates between
rounds (so a change of the machine's load falls on every layout alike), one TensorFlow job at a
time; the table gives per layout the median step over the rounds' medians, the spread, the
pipeline bubble the stages measured beside the schedule's prediction, and the load.

    python tools/studies/bench_pp_cp.py --benchmark=llama31_8b --preset=smoke \\
        --devices=4 --layouts=p1,p2 [--rounds=3] [--micro_batch_size=1] [--schedule=1f1b]

A layout is `p<P>` or `c<C>` (`--pipeline_parallel`, `--context_parallel`; joined with `x`,
e.g. `p2xc2`), the rest of the devices on the data axis.

What a CPU can and cannot show. The "devices" are logical CPUs sharing the host's cores (2
here), so a stage's idle time in the bubble is not idle hardware: the other stages use the
cores meanwhile, and P = 2 cannot be faster than P = 1 for the compute it does (the same FLOPs
per replica, plus the exchanges and the bubble's bookkeeping). What it does show: that the
schedule runs in one compiled step at every layout, the step's overhead of the exchanges
(an all-to-all of one micro-batch's activations per tick through host memory) and of the
unrolled schedule (more, smaller ops: M + P - 1 ticks forward and backward), and the measured
bubble against the schedule's (P - 1) / (M + P - 1): with cores shared, a stage's "busy" time
stretches when another stage computes beside it, so the measured bubble reads below the
prediction by how much the stages overlapped. Speed-up from pipelining (memory per chip that
lets a larger model or batch fit, fewer bytes all-reduced per chip) needs real chips.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

FLAGS_OF = {"p": "--pipeline_parallel", "c": "--context_parallel"}


def layout_flags(layout: str) -> list[str]:
    """`p2xc2` -> ["--pipeline_parallel=2", "--context_parallel=2"] ("p1": none)."""
    out = []
    for part in layout.lower().split("x"):
        if part[:1] not in FLAGS_OF or not part[1:].isdigit():
            raise SystemExit(f"error: --layouts: {part!r} is not p<P> or c<C>")
        if int(part[1:]) > 1:
            out.append(f"{FLAGS_OF[part[0]]}={int(part[1:])}")
    return out


def bench(args, layout: str) -> dict:
    command = [
        sys.executable, "-m", "mlperf_tf.cli", "bench", f"--benchmark={args.benchmark}",
        f"--preset={args.preset}", f"--num_cpu_devices={args.devices}", "--json",
        f"--windows={args.windows}", f"--steps_per_window={args.steps}",
        f"--warmup_steps={args.warmup}", "--peak_seconds=0",
        f"--micro_batch_size={args.micro_batch_size}", f"--pipeline_schedule={args.schedule}",
        *layout_flags(layout), *args.extra,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"error: {' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--benchmark", default="llama31_8b")
    parser.add_argument("--preset", default="smoke")
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--layouts", default="p1,p2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="steps per window")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--micro_batch_size", type=int, default=0)
    parser.add_argument("--schedule", default="1f1b")
    parser.add_argument("extra", nargs="*", help="more bench flags, e.g. --config.KEY=VALUE")
    args = parser.parse_args()
    layouts = args.layouts.split(",")
    results: dict[str, list[dict]] = {layout: [] for layout in layouts}
    for r in range(args.rounds):
        order = layouts if r % 2 == 0 else layouts[::-1]
        for layout in order:
            result = bench(args, layout)
            results[layout].append(result)
            print(f"round {r + 1} {layout}: step {result['step_time_ms']:.1f} ms, load "
                  f"{result['load_average'][0]:.1f}", file=sys.stderr, flush=True)  # fmt: skip
    print(f"{args.benchmark} {args.preset}, {args.devices} logical CPUs, global batch "
          f"{results[layouts[0]][0]['global_batch_size']}, {args.rounds} interleaved rounds "
          f"(cores: {os.cpu_count()})\n")  # fmt: skip
    print("| layout | step ms, median of rounds (min, max) | / first layout | bubble measured "
          "(predicted) | load |")  # fmt: skip
    print("|---|---|---|---|---|")
    first = None
    for layout in layouts:
        steps = [x["step_time_ms"] for x in results[layout]]
        median = statistics.median(steps)
        first = first or median
        measured = [x["pipeline_bubble_measured"] for x in results[layout]
                    if x.get("pipeline_bubble_measured") is not None]  # fmt: skip
        predicted = results[layout][0].get("pipeline_bubble_predicted")
        bubble = (f"{100 * statistics.median(measured):.1f}% ({100 * predicted:.1f}%)"
                  if measured else "-")  # fmt: skip
        loads = [x["load_average"][0] for x in results[layout]]
        print(f"| {layout} | {median:.1f} ({min(steps):.1f}, {max(steps):.1f}) | "
              f"{median / first:.2f} | {bubble} | {min(loads):.1f}-{max(loads):.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
