"""Prints the published times to train of one benchmark in an MLCommons results repository.

Usage: python tools/corpus/published_times.py GIT_DIR BENCHMARK [--json]

GIT_DIR is a git directory of `mlcommons/training_results_vX.Y` (e.g. a `fetch` snapshot); logs
and system descriptions are read from HEAD with `git show`. For every system folder with
`results/<system>/<BENCHMARK>/result_*.txt` it prints the accelerator, nodes x accelerators per
node (from `systems/<system>.json`), the logged `global_batch_size`, the runs that logged
`run_stop` with status success, and the time to train in minutes: `run_stop - run_start` of each
run, MLPerf's olympic mean (the fastest and slowest run dropped, the rest averaged; RCP score
normalization is not applied). Feeds `docs/scaling.md`'s table of published points.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys

from compliance.logfile import parse_line

_RESULT = re.compile(r"^([^/]+)/results/([^/]+)/([^/]+)/result_[^/]*\.txt$")


def _git(git_dir: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", git_dir, *args], capture_output=True)


def run_minutes(text: str) -> tuple[float | None, int | None]:
    """(minutes from run_start to a successful run_stop or None, global batch) of one log."""
    start = stop = batch = None
    for line in text.splitlines():
        if ":::MLLOG" not in line:
            continue
        parsed = parse_line(line, "5.1.0")
        if parsed is None:
            continue
        key, value, metadata, time_ms = parsed
        if key == "run_start" and start is None:
            start = time_ms
        elif key == "run_stop" and metadata.get("status") == "success":
            stop = time_ms
        elif key == "global_batch_size":
            batch = value
    if start is None or stop is None:
        return None, batch
    return (stop - start) / 60_000.0, batch


def olympic_mean(values: list[float]) -> float:
    """MLPerf's olympic mean: drop the fastest and the slowest, average the rest."""
    ordered = sorted(values)
    return statistics.mean(ordered[1:-1] if len(ordered) > 2 else ordered)


def table(git_dir: str, benchmark: str) -> list[dict]:
    names = _git(git_dir, "ls-tree", "-r", "--name-only", "HEAD").stdout.decode().split("\n")
    runs: dict[tuple[str, str], list[str]] = {}
    for name in names:
        match = _RESULT.match(name)
        if match and match.group(3) == benchmark:
            runs.setdefault((match.group(1), match.group(2)), []).append(name)
    rows = []
    for (submitter, system), paths in sorted(runs.items()):
        described = _git(git_dir, "show", f"HEAD:{submitter}/systems/{system}.json")
        info = json.loads(described.stdout) if described.returncode == 0 else {}
        minutes, batches = [], set()
        for path in paths:
            shown = _git(git_dir, "show", f"HEAD:{path}")
            if shown.returncode:
                continue
            value, batch = run_minutes(shown.stdout.decode("latin-1"))
            batches.add(batch)
            if value is not None:
                minutes.append(value)
        try:
            chips = int(info.get("number_of_nodes", 0)) * int(info.get("accelerators_per_node", 0))
        except ValueError:
            chips = 0
        rows.append(
            {
                "path": f"{submitter}/results/{system}/{benchmark}",
                "accelerator": info.get("accelerator_model_name", "?"),
                "chips": chips,
                "global_batch": sorted(b for b in batches if b is not None),
                "runs": len(paths),
                "converged": len(minutes),
                "minutes": olympic_mean(minutes) if minutes else None,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("git_dir")
    parser.add_argument("benchmark")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    for row in table(args.git_dir, args.benchmark):
        if args.json:
            print(json.dumps(row))
        else:
            minutes = f"{row['minutes']:.2f}" if row["minutes"] is not None else "-"
            print(
                f"{row['path']:<58} {row['accelerator'][:40]:<40} {row['chips']:>5} "
                f"{row['global_batch']!s:>8} {row['converged']}/{row['runs']} {minutes:>8}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
