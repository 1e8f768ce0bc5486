"""Runs the suite's own checks (`compliance.suite_checks`, strict) over a sample of published logs.

Usage: python tools/corpus/survey_suite_checks.py GIT_DIR ROUND [GIT_DIR ROUND ...] [--per_benchmark N]

GIT_DIR is a git directory of an MLCommons results repository (e.g. a `fetch` snapshot of
`mlcommons/training_results_v5.1`), ROUND its ruleset ("5.1.0"). Logs are read with `git show`
from HEAD (nothing is written to the repository). For each benchmark it takes up to N result
logs, one per system folder first (so every submitter is seen before a second log of one), and
prints the number checked and each log with a strict suite-check error (its first), e.g. a
`pairing` false alarm. The official checker is not run here (seconds a log): a log flagged here
is then checked by `mlperf-tf check --strict` by hand (a false alarm is one whose official
verdict is PASS). Blobs a snapshot lacks (files of 4 MiB and more) are counted as absent.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

from compliance import checker, logfile
from compliance import keys as C
from compliance.suite_checks import ERROR, suite_checks

_RESULT = re.compile(r"^[^/]+/results/([^/]+)/([^/]+)/result_[^/]*\.txt$")


def sample(git_dir: str, per_benchmark: int) -> dict[str, list[str]]:
    """{benchmark folder: up to `per_benchmark` paths}, round-robin over system folders."""
    names = subprocess.run(
        ["git", "-C", git_dir, "ls-tree", "-r", "--name-only", "HEAD"],
        capture_output=True, text=True, check=True,
    ).stdout.split("\n")  # fmt: skip
    by_bench: dict[str, dict[str, list[str]]] = collections.defaultdict(
        lambda: collections.defaultdict(list)
    )
    for name in sorted(names):
        match = _RESULT.match(name)
        if match:
            system, bench = match.groups()
            by_bench[bench][system].append(name)
    chosen: dict[str, list[str]] = {}
    for bench, systems in sorted(by_bench.items()):
        queues = [list(paths) for _, paths in sorted(systems.items())]
        picked: list[str] = []
        while len(picked) < per_benchmark and any(queues):
            for queue in queues:
                if queue and len(picked) < per_benchmark:
                    picked.append(queue.pop(0))
        chosen[bench] = picked
    return chosen


def errors_of(git_dir: str, path: str, ruleset: str, tmp: str) -> list[str] | None:
    """The strict suite-check errors of one log, or None when its blob is not in the snapshot."""
    shown = subprocess.run(["git", "-C", git_dir, "show", f"HEAD:{path}"], capture_output=True)
    if shown.returncode != 0:
        return None
    local = os.path.join(tmp, "log.txt")
    with open(local, "wb") as f:
        f.write(shown.stdout)
    scan = logfile.scan_log(local)
    records = logfile.parse_records(scan, ruleset)
    benchmark = next((r.value for r in records if r.key == C.SUBMISSION_BENCHMARK), None)
    batch = next((r.value for r in records if r.key == C.GLOBAL_BATCH_SIZE), None)
    target = checker.quality_target(
        ruleset,
        benchmark if isinstance(benchmark, str) else None,
        global_batch_size=batch if isinstance(batch, int | float) else None,
    )
    findings = suite_checks(
        records,
        benchmark=benchmark if isinstance(benchmark, str) else None,
        ruleset=ruleset,
        target=target,
        strict=True,
    )
    return [f"{f.check}: {f.message}" for f in findings if f.level == ERROR]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pairs", nargs="+", help="GIT_DIR ROUND pairs")
    parser.add_argument("--per_benchmark", type=int, default=10)
    args = parser.parse_args(argv)
    if len(args.pairs) % 2:
        parser.error("give GIT_DIR ROUND pairs")
    if args.per_benchmark <= 0:
        parser.error(f"--per_benchmark ({args.per_benchmark}) must be positive")
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for git_dir, ruleset in zip(args.pairs[::2], args.pairs[1::2]):
            for bench, paths in sample(git_dir, args.per_benchmark).items():
                checked = missing = 0
                flagged: list[str] = []
                for path in paths:
                    errors = errors_of(git_dir, path, ruleset, tmp)
                    if errors is None:
                        missing += 1
                        continue
                    checked += 1
                    if errors:
                        flagged.append(f"  {path}: {errors[0]}")
                bad += len(flagged)
                print(
                    f"{ruleset} {bench}: {checked} checked, {len(flagged)} with strict errors"
                    + (f", {missing} blobs absent" if missing else "")
                )
                for line in flagged:
                    print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
