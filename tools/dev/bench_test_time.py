"""Wall and CPU time of test modules in two source trees, side by side (old checkout vs new).

Each case (a tree and a pytest target) runs `python -m pytest -q -n 0` in a fresh process with
`PYTHONPATH` at its tree; rounds interleave the trees, the order reversed every other round, with
the load average printed around each run. Wall time minus CPU time (the process and the
subprocesses it waited for) is time nobody computed: waits. The tests README's "Time budget" says
what this measured.

usage: python tools/dev/bench_test_time.py --trees=/tmp/old,. [--rounds=2] [--timeout_s=1800]
           tests/mlperf_tf/test_runner_spatial.py [more pytest targets ...]

Pass a tree made with `git archive BASE | tar -x -C /tmp/old` as the old one.
"""

from __future__ import annotations

import argparse
import pathlib
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # for `tools.harness`

from tools import harness  # noqa: E402


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_case(tree: str, target: str, timeout_s: float) -> dict:
    """One pytest run of `target` under `tree`: wall and CPU seconds and whether it passed."""
    command = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", target]
    cpu_before, begin = _children_cpu_s(), time.perf_counter()
    try:
        done = subprocess.run(
            command, cwd=tree, env=harness.child_env(tree), capture_output=True, text=True,
            timeout=timeout_s, check=False,
        )  # fmt: skip
        passed = done.returncode == 0
    except subprocess.TimeoutExpired:
        passed = False
    return {
        "wall_s": time.perf_counter() - begin,
        "cpu_s": _children_cpu_s() - cpu_before,
        "passed": passed,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="+", help="pytest targets (modules or node ids)")
    parser.add_argument("--trees", required=True, help="comma-separated repository roots")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout_s", type=float, default=1800.0)
    args = parser.parse_args(argv)
    harness.require_positive(parser, args, "rounds", "timeout_s")
    trees = harness.comma_list(parser, args.trees, "--trees")
    for tree in trees:
        if not (pathlib.Path(tree) / "mlperf_tf").is_dir():
            parser.error(f"--trees: {tree!r} is not a repository root (no mlperf_tf/ in it)")
    cases = [(tree, target) for target in args.targets for tree in trees]
    results = harness.case_rounds(
        cases,
        lambda case: run_case(case[0], case[1], args.timeout_s),
        rounds=args.rounds,
        label=lambda case: f"{case[0]} {case[1]}",
    )
    print("\n| target | tree | wall s (median) | CPU s | idle s | passed |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for (tree, target), runs in results.items():
        wall = statistics.median(r["wall_s"] for r in runs)
        cpu = statistics.median(r["cpu_s"] for r in runs)
        passed = sum(r["passed"] for r in runs)
        print(f"| {target} | {tree} | {wall:.1f} | {cpu:.1f} | {wall - cpu:.1f} | "
              f"{passed}/{len(runs)} |")  # fmt: skip
    print(f"\nload average at the end: {harness.load_average()}")


if __name__ == "__main__":
    main()
