"""Where a parallel test run's wall clock goes: a pytest plug-in that writes each test's worker,
start, end and CPU time (setup, call and teardown) as one JSON line, and a report of such a file
(each worker's first start, last end and busy share; the gaps between its tests; the modules
that took longest; what each worker ran last).

README's run (`pytest -q`: two xdist workers, `--dist loadscope`) ends when its slower worker
ends: a worker idle at the end, or a module that lands late, costs wall clock that per-test
durations do not show.

Usage:
  python -m pytest -p tools.dev.pytest_timeline --timeline=FILE [pytest arguments]
  python tools/dev/pytest_timeline.py FILE [--top=N]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import time


def _cpu_seconds() -> float:
    usage = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


def pytest_addoption(parser):
    parser.addoption("--timeline", default="", help="append each test's times to this file")


def _protocol_wrapper():
    import pytest  # noqa: PLC0415 (the report needs no pytest)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        path = item.config.getoption("--timeline")
        start, cpu = time.time(), _cpu_seconds()
        yield
        if path:
            line = {"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "test": item.nodeid,
                    "start": start, "end": time.time(), "cpu": _cpu_seconds() - cpu}  # fmt: skip
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")

    return pytest_runtest_protocol


try:  # as a plug-in
    pytest_runtest_protocol = _protocol_wrapper()
except ImportError:  # the report alone
    pass


def report(path: str, top: int) -> None:
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if not rows:
        raise SystemExit(f"{path}: no tests recorded")
    begin, end = min(r["start"] for r in rows), max(r["end"] for r in rows)
    print(f"{len(rows)} tests, {end - begin:.1f} s from the first start to the last end")
    by_worker = collections.defaultdict(list)
    for r in rows:
        by_worker[r["worker"]].append(r)
    for worker, tests in sorted(by_worker.items()):
        tests.sort(key=lambda r: r["start"])
        busy = sum(r["end"] - r["start"] for r in tests)
        gaps = sum(max(0.0, b["start"] - a["end"]) for a, b in zip(tests, tests[1:]))
        print(f"{worker}: {len(tests)} tests, starts +{tests[0]['start'] - begin:.1f} s, ends "
              f"+{tests[-1]['end'] - begin:.1f} s, busy {busy:.1f} s, gaps {gaps:.1f} s, "
              f"CPU {sum(r['cpu'] for r in tests):.1f} s")  # fmt: skip
        for r in tests[-3:]:
            print(
                f"    last: +{r['start'] - begin:7.1f} s {r['end'] - r['start']:6.1f} s {r['test'][:110]}"
            )
    modules = collections.Counter()
    for r in rows:
        modules[r["test"].split("::")[0]] += r["end"] - r["start"]
    print(f"modules by wall seconds (top {top}):")
    for name, seconds in modules.most_common(top):
        print(f"  {seconds:7.1f} s  {name}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    report(args.file, args.top)


if __name__ == "__main__":
    main()
