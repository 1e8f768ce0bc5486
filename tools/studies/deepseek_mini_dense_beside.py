"""Trains the dense `llama31_8b` mini and the `gpt_oss_20b` mini on the `deepseekv3_671b` mini's
data and batch (the shared C4 mini corpus in 64-token windows, 64 windows a step) for as many
steps as the DeepSeek-V3 mini's base and continuation together (300 + 426 = 726), from their
initializers, and prints each one's evaluations: the models beside the MoE at equal steps
(issue 54: "give the dense llama31_8b mini and gpt_oss_20b mini at equal steps beside it").

    python tools/studies/deepseek_mini_dense_beside.py [--steps=726] [--out_dir=/tmp/dense_beside]
        [--benchmarks=llama31_8b,gpt_oss_20b]

Each run is `mlperf-tf run --preset=mini` with the data, the sequence length, the batch and
the sample budget (a mini's budget is its own steps x its batch of 8) overridden (their own learning rates, schedules and eval sets of 1,024 windows, evaluated on
their cadence and at the last step); the DeepSeek-V3 mini's own numbers are its README's
(base 3.7915 after 300 steps, 3.382 at the rules' first eval 426 steps later).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

# The DeepSeek-V3 mini's data and batch (benchmarks/deepseekv3_671b/config.py).
SEQUENCE, BATCH = 64, 64


def evaluations(log_path: str) -> list[tuple[int, float]]:
    """(samples_count or epoch_num, eval_accuracy) of every evaluation in an MLPerf log."""
    points = []
    with open(log_path) as f:
        for line in f:
            if '"key": "eval_accuracy"' not in line:
                continue
            record = json.loads(line.split(":::MLLOG ", 1)[1])
            meta = record["metadata"]
            points.append((int(meta.get("samples_count", meta.get("epoch_num", 0))),
                           float(record["value"])))  # fmt: skip
    return points


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=726)
    parser.add_argument("--out_dir", default="/tmp/dense_beside")
    parser.add_argument("--benchmarks", default="llama31_8b,gpt_oss_20b")
    args = parser.parse_args(argv)
    from mlperf_tf.data import c4  # noqa: PLC0415 (the help needs no TensorFlow)

    data_dir = c4.mini_windows_dir(SEQUENCE)
    for name in args.benchmarks.split(","):
        model_dir = os.path.join(args.out_dir, name)
        command = [
            sys.executable, "-m", "mlperf_tf.cli", "run", f"--benchmark={name}", "--preset=mini",
            f"--model_dir={model_dir}", f"--max_train_steps={args.steps}",
            f"--config.data_dir={data_dir}", f"--config.data.max_sequence_length={SEQUENCE}",
            f"--config.global_batch_size={BATCH}", f"--config.train_examples={args.steps * BATCH}",
        ]  # fmt: skip
        begin = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - begin
        if done.returncode != 0:
            print(f"{name}: exit {done.returncode}\n{done.stderr[-2000:]}")
            continue
        points = evaluations(os.path.join(model_dir, "mlperf_log.txt"))
        # The logged samples_count is the eval point's (the schedule's); the last eval is at
        # --steps, where the run's budget ends.
        shown = ", ".join(f"{v:.4f} (samples_count {s})" for s, v in points)
        print(
            f"{name}: evals {shown}; the last after {args.steps} steps of {BATCH} x {SEQUENCE} "
            f"({seconds:.0f} s wall, load {os.getloadavg()[0]:.1f})"
        )


if __name__ == "__main__":
    main()
