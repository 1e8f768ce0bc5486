"""A pytest plug-in that reports each test's CPU time, which other jobs on the machine barely move.

Wall times (`--durations`) on a shared machine measure the load more than the test; the CPU seconds
a test spends (this process and the subprocesses it waited for, user + system) stay close to a
quiet machine's. A test that keeps both cores busy takes about half its CPU time in wall time on a
quiet 2-core machine; a single-threaded one about all of it.

Usage:
  python -m pytest -p tools.dev.cpu_durations [--cpu-durations=N] [pytest arguments]
"""

from __future__ import annotations

import resource

import pytest


def _cpu_seconds() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def pytest_addoption(parser):
    parser.addoption(
        "--cpu-durations", type=int, default=30, help="print the N tests with the most CPU time"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = _cpu_seconds()
    yield
    item.config.stash.setdefault(_KEY, []).append((_cpu_seconds() - start, item.nodeid))


_KEY = pytest.StashKey[list]()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    times = sorted(config.stash.get(_KEY, []), reverse=True)
    count = config.getoption("--cpu-durations")
    total = sum(t for t, _ in times)
    terminalreporter.write_sep(
        "=", f"CPU time: {total:.1f} s in {len(times)} tests; slowest {count}"
    )
    for seconds, nodeid in times[:count]:
        terminalreporter.write_line(f"{seconds:8.2f}s cpu  {nodeid}")
