"""Runs tests under the oneDNN settings CI uses and reports how much of each tolerance they use.

Each `tests.numerics.assert_close` call logs max |actual - expected| / allowed (1.0 fails) when
$TESTS_NUMERICS_LOG is set; this tool runs pytest once per setting (default oneDNN, oneDNN capped
to AVX2, oneDNN off) with that log and prints, per test, the largest share used in each setting,
largest first. A share near 1 is a tolerance with no margin on some CPU.

Usage:
  python tools/dev/numerics_margins.py [--top=N] [pytest arguments, default `-m numerics`]
  e.g. python tools/dev/numerics_margins.py tests/benchmarks/transformer/test_model.py
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tools import harness as tool_args  # noqa: E402

SETTINGS = {
    "default": {},
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    "onednn_off": {"TF_ENABLE_ONEDNN_OPTS": "0"},
}


def run(setting: str, pytest_args: list[str], log_dir: str, keep: str) -> dict[str, float]:
    """Runs pytest under `setting`; returns the largest share used per test id.

    Keeps pytest's output in `keep`/<setting>.out (written as it runs) when `keep` is given.
    """
    log = os.path.join(log_dir, f"{setting}.log")
    env = {**os.environ, **SETTINGS[setting], "TESTS_NUMERICS_LOG": log}
    command = [sys.executable, "-m", "pytest", "-q", *pytest_args]
    output = os.path.join(keep or log_dir, f"{setting}.out")  # written as pytest runs
    with open(output, "w", encoding="utf-8") as out:
        code = subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    with open(output, encoding="utf-8") as out:
        lines = out.read().splitlines()
    tail = lines[-1:] or ["(no output)"]
    print(f"{setting}: pytest exit {code}: {tail[0]}", flush=True)
    if code not in (0, 5):
        print("\n".join(line for line in lines if line.startswith("FAILED")))
    shares: dict[str, float] = collections.defaultdict(float)
    if os.path.exists(log):
        with open(log, encoding="utf-8") as f:
            for line in f:
                share, _, test = line.split(" ", 2)
                shares[test.strip()] = max(shares[test.strip()], float(share))
    return shares


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--top", type=int, default=30, help="rows to print")
    parser.add_argument("--keep", default="", help="folder for each setting's pytest output")
    parser.add_argument(
        "--settings", default=",".join(SETTINGS), help="comma-separated subset of " + str(SETTINGS)
    )
    args, pytest_args = parser.parse_known_args(argv)
    pytest_args = pytest_args or ["-m", "numerics and not slow and not extended"]
    settings = tool_args.comma_list(parser, args.settings, "--settings")
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        parser.error(f"--settings: unknown {unknown} (known: {', '.join(SETTINGS)})")
    if args.keep:
        tool_args.output_dir(parser, args.keep, "--keep")
        os.makedirs(args.keep, exist_ok=True)
    with tempfile.TemporaryDirectory() as log_dir:
        results = {setting: run(setting, pytest_args, log_dir, args.keep) for setting in settings}
    tests = set().union(*results.values())
    rows = sorted(tests, key=lambda t: -max(r.get(t, 0.0) for r in results.values()))
    print("share of tolerance used (1.0 fails): " + " ".join(f"{s:>10}" for s in results))
    for test in rows[: args.top]:
        print(" ".join(f"{results[s].get(test, 0.0):10.3g}" for s in results) + f"  {test}")


if __name__ == "__main__":
    main()
