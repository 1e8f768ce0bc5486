"""Runs each benchmark's smoke preset through the CLI for every MLPerf round that has it, and
checks each log with the stock official checker (its own command line, unmodified).

Usage: python tools/dev/check_rounds.py [OUT_DIR] [--benchmarks resnet50,bert,...]

A smoke run trains on random data, so it stops `aborted` below the MLPerf target: the only
official failure allowed is the accuracy target (`Failed checks for eval_accuracy`), which is what
`mlperf-tf check --quality=skip` sets aside; everything else must pass. Prints one line per
(benchmark, round) and exits 1 if any log has another official failure.
"""

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile

from compliance.runner import stock_command
from mlperf_tf import registry, rounds

REPO = str(pathlib.Path(__file__).resolve().parents[2])
_TARGET = "Failed checks for eval_accuracy"


def official(log: str, ruleset: str) -> tuple[bool, list[str]]:
    """(passes apart from the accuracy target, the other failure lines) by the stock CLI."""
    with tempfile.TemporaryDirectory() as cwd:
        done = subprocess.run(
            stock_command(log, ruleset, log_output=os.path.join(cwd, "cc.log")),
            capture_output=True, text=True, cwd=cwd, timeout=300,
        )  # fmt: skip
    text = done.stdout + done.stderr
    if done.returncode == 0:
        return True, []
    items = [line[len("WARNING - ") :].strip() for line in text.splitlines()
             if line.startswith("WARNING - ")]  # fmt: skip
    other = [item for item in items if not item.startswith(_TARGET)]
    if "Traceback" in text:
        other.append(text.strip().splitlines()[-1])
    return not other, other


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=tempfile.mkdtemp(prefix="rounds_"))
    parser.add_argument(
        "--benchmarks", default="", help="comma list of registry names (default: all registered)"
    )
    args = parser.parse_args(argv)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
    bad = 0
    for name in args.benchmarks.split(",") if args.benchmarks else registry.available():
        for ruleset in rounds.rounds_with(registry.get(name)):
            model_dir = os.path.join(args.out, f"{name}_{ruleset}")
            run = subprocess.run(
                [sys.executable, "-m", "mlperf_tf.cli", "run", f"--benchmark={name}",
                 "--preset=smoke", f"--model_dir={model_dir}", f"--ruleset={ruleset}"],
                capture_output=True, text=True, env=env, cwd=REPO, timeout=1200,
            )  # fmt: skip
            log = os.path.join(model_dir, "mlperf_log.txt")
            if run.returncode != 0 or not os.path.exists(log):
                print(f"{name} {ruleset}: run failed: {run.stderr.strip().splitlines()[-1:]}")
                bad += 1
                continue
            ok, other = official(log, ruleset)
            bad += not ok
            print(f"{name} {ruleset}: {'PASS (target aside)' if ok else 'FAIL'} {other[:3]}")
            sys.stdout.flush()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
