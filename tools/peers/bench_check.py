"""Wall time of `mlperf-tf check LOG` against the official checker's command line on the same log.

Usage: python tools/peers/bench_check.py LOG RULESET [--rounds N] [--batch DIR] [--source]

Interleaved: each round runs `mlperf-tf check LOG --ruleset RULESET`, `mlperf-tf check LOG` (the
round found from the log) and `python -m mlperf_logging.compliance_checker --usage training
--ruleset RULESET LOG`, as fresh processes the way a user runs them, in an order that rotates
from round to round. Prints, per round, each wall time and the ratios ours / official; then the
median, min and max of each command, the median of the per-round ratios and the pooled ratio (sum
of our times over the sum of the official times), the same for CPU time (user + system of every
process of the command: what counts when the machine is busy), and the load average before and
after.

Our packages are byte-compiled first (into their git-ignored __pycache__), as `pip install` does
for an installed package, so that both sides load bytecode: this machine sets
PYTHONDONTWRITEBYTECODE=1, under which an editable checkout compiles our modules from source on
every run while the official package's bytecode is installed. `--source` removes that bytecode
instead and measures the checkout as it runs there.

With --batch DIR, also `mlperf-tf check <every *.txt in DIR> --jobs 2` (one process) against one
`mlperf-tf check LOG` process per log, per log.

A single `check LOG` runs the official check in its own process when no core is idle by the load
average, else in a child that imports the checker while the parent reads the log
(`compliance.runner.has_idle_core`); the script counts which, by the same rule just before each run.
"""

import argparse
import compileall
import glob
import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from compliance import runner
from compliance.runner import stock_command

REPO = str(pathlib.Path(__file__).resolve().parents[2])
PACKAGES = ("mlperf_tf", "compliance")
OURS_GIVEN = "check --ruleset"
OURS_FOUND = "check (found)"
OFFICIAL = "official CLI"


def _wall(command, cwd, cpu=None) -> float:
    """Seconds `command` took; its CPU seconds (its processes', user + system) go to `cpu`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    begin = time.perf_counter()
    subprocess.run(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=False)  # fmt: skip
    wall = time.perf_counter() - begin
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if cpu is not None:
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return wall


def _summary(name, times):
    return (f"{name}: median {statistics.median(times):.3f} s (min {min(times):.3f}, "
            f"max {max(times):.3f}, n={len(times)})")  # fmt: skip


def _prepare_bytecode(source: bool) -> str:
    for package in PACKAGES:
        root = os.path.join(REPO, package)
        if source:
            for folder in glob.glob(os.path.join(root, "**", "__pycache__"), recursive=True):
                shutil.rmtree(folder)
        else:
            compileall.compile_dir(root, quiet=1)
    if source:
        return "our modules compiled from source at every run (no bytecode)"
    return "our modules byte-compiled beforehand, as an installed package is"


def _ratios(times, ours):
    return [a / b for a, b in zip(times[ours], times[OFFICIAL], strict=True)]


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log")
    parser.add_argument("ruleset")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--batch", default="")
    parser.add_argument("--source", action="store_true",
                        help="remove our bytecode instead of compiling it")  # fmt: skip
    args = parser.parse_args(argv)
    log = os.path.abspath(args.log)
    cli = os.path.join(os.path.dirname(sys.executable), "mlperf-tf")
    ours = [cli] if os.path.exists(cli) else [sys.executable, "-m", "mlperf_tf.cli"]
    commands = {
        OURS_GIVEN: [*ours, "check", log, "--ruleset", args.ruleset],
        OURS_FOUND: [*ours, "check", log],
        OFFICIAL: stock_command(log, args.ruleset),
    }
    print(_prepare_bytecode(args.source))
    print(f"load average before: {os.getloadavg()}")
    times = {name: [] for name in commands}
    cpu = {name: [] for name in commands}
    idle_core_rounds = 0
    names = list(commands)
    with tempfile.TemporaryDirectory() as cwd:
        for i in range(args.rounds):
            order = names[i % len(names) :] + names[: i % len(names)]
            for name in order:
                if name != OFFICIAL:  # the rule `check` itself applies at its start
                    idle_core_rounds += runner.has_idle_core()
                times[name].append(_wall(commands[name], cwd, cpu[name]))
            print(f"round {i + 1}: " + ", ".join(f"{n} {times[n][-1]:.3f} s" for n in names)
                  + f"; ratios {times[OURS_GIVEN][-1] / times[OFFICIAL][-1]:.2f}, "
                  f"{times[OURS_FOUND][-1] / times[OFFICIAL][-1]:.2f}", flush=True)  # fmt: skip
        for name, values in times.items():
            print(_summary(name, values))
        print(f"our checks started with an idle core (standby child) {idle_core_rounds} of "
              f"{2 * args.rounds} times; the others ran the check in their own process")  # fmt: skip
        for name, values in cpu.items():
            print(
                f"{name}: CPU (user + system, every process) median {statistics.median(values):.3f} s"
            )
        for ours_name in (OURS_GIVEN, OURS_FOUND):
            ratios = _ratios(times, ours_name)
            pooled = sum(times[ours_name]) / sum(times[OFFICIAL])
            print(f"{ours_name} / official: median of per-round ratios "
                  f"{statistics.median(ratios):.2f} (min {min(ratios):.2f}, max "
                  f"{max(ratios):.2f}), pooled {pooled:.2f}, ratio of medians "
                  f"{statistics.median(times[ours_name]) / statistics.median(times[OFFICIAL]):.2f};"
                  f" CPU pooled {sum(cpu[ours_name]) / sum(cpu[OFFICIAL]):.2f}")  # fmt: skip
        if args.batch:
            # Absolute: the commands run in a temporary folder.
            logs = sorted(glob.glob(os.path.join(os.path.abspath(args.batch), "*.txt")))
            batch, single = [], []
            one_process = [*ours, "check", *logs, "--jobs", "2"]
            for i in range(max(1, args.rounds // 5)):
                runs = [
                    ("batch", lambda: _wall(one_process, cwd)),
                    ("single", lambda: sum(_wall([*ours, "check", log], cwd) for log in logs)),
                ]
                for name, run in runs if i % 2 == 0 else reversed(runs):
                    (batch if name == "batch" else single).append(run() / len(logs))
            print(_summary(f"check DIR --jobs 2, per log ({len(logs)} logs)", batch))
            print(_summary("one `check LOG` process per log, per log", single))
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
