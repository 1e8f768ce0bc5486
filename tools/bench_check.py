"""Wall time of `mlperf-tf check LOG` against the official checker's command line on the same log.

Usage: python tools/bench_check.py LOG RULESET [--rounds N] [--batch DIR]

Interleaved: each round runs both commands one after the other (order alternating), as fresh
processes, the way a user runs them. With --batch DIR, also `mlperf-tf check <every log in DIR>
--jobs 2` (one process) against one `mlperf-tf check LOG` process per log, per log. Prints the
median, min and max of each, the ratio of medians, and the load average before and after.
"""

import argparse
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _wall(command, cwd) -> float:
    begin = time.perf_counter()
    subprocess.run(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=False)  # fmt: skip
    return time.perf_counter() - begin


def _summary(name, times):
    return (f"{name}: median {statistics.median(times):.3f} s (min {min(times):.3f}, "
            f"max {max(times):.3f}, n={len(times)})")  # fmt: skip


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log")
    parser.add_argument("ruleset")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--batch", default="")
    args = parser.parse_args(argv[1:])
    cli = os.path.join(os.path.dirname(sys.executable), "mlperf-tf")
    ours = [cli, "check", os.path.abspath(args.log)] if os.path.exists(cli) else [
        sys.executable, "-m", "mlperf_tf.cli", "check", os.path.abspath(args.log)]  # fmt: skip
    official = [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
                "--ruleset", args.ruleset, os.path.abspath(args.log)]  # fmt: skip
    print(f"load average before: {os.getloadavg()}")
    times = {"mlperf-tf check": [], "official CLI": []}
    with tempfile.TemporaryDirectory() as cwd:
        for i in range(args.rounds):
            pair = [("mlperf-tf check", ours), ("official CLI", official)]
            for name, command in pair if i % 2 == 0 else reversed(pair):
                times[name].append(_wall(command, cwd))
        for name, values in times.items():
            print(_summary(name, values))
        ratio = statistics.median(times["mlperf-tf check"]) / statistics.median(
            times["official CLI"]
        )
        print(f"ratio of medians (ours / official): {ratio:.2f}")
        if args.batch:
            logs = sorted(glob.glob(os.path.join(args.batch, "*.txt")))
            batch, single = [], []
            one_process = [cli, "check", *logs, "--jobs", "2"]
            for i in range(max(1, args.rounds // 5)):
                runs = [
                    ("batch", lambda: _wall(one_process, cwd)),
                    ("single", lambda: sum(_wall([cli, "check", log], cwd) for log in logs)),
                ]
                for name, run in runs if i % 2 == 0 else reversed(runs):
                    (batch if name == "batch" else single).append(run() / len(logs))
            print(_summary(f"check DIR --jobs 2, per log ({len(logs)} logs)", batch))
            print(_summary("one `check LOG` process per log, per log", single))
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
