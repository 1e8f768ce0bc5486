"""Agreement of `mlperf-tf check` with the official verdicts recorded for a log corpus.

Usage: python tools/corpus/compliance_agreement.py [CORPUS_DIR] (default ../shared/compliance-corpus/modern)

Prints, for the corpus's verdicts.jsonl: agreement with the recorded ruleset given, agreement with
the ruleset picked from the log (and the picks that differ), and --strict false alarms on the real
logs the official checker passes.
"""

import argparse
import json
import os
import pathlib
import sys

from compliance import checker
from mlperf_tf.errors import UserError

REPO = str(pathlib.Path(__file__).resolve().parents[2])


def _official_pass(row):
    if "official_pass" in row:
        return row["official_pass"]
    return row["official"] == "pass"


def main(argv: list[str] | None = None):
    default = os.path.join(
        os.environ.get(
            "MLPERF_TF_COMPLIANCE_CORPUS", os.path.join(REPO, "..", "shared", "compliance-corpus")
        ),
        "modern",
    )
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", nargs="?", default=default, help="folder with verdicts.jsonl")
    corpus = parser.parse_args(argv).corpus
    with open(os.path.join(corpus, "verdicts.jsonl")) as handle:
        rows = [json.loads(line) for line in handle]
    paths = [os.path.join(corpus, row["path"]) for row in rows]
    given, picked, strict = [], [], []
    with checker.OfficialRunner() as runner:
        for path, row in zip(paths, rows):
            given.append(checker.check_log(path, ruleset=row["ruleset"], runner=runner))
            try:
                picked.append(checker.check_log(path, runner=runner))
            except UserError as error:
                picked.append(error)
            strict.append(
                checker.check_log(path, ruleset=row["ruleset"], strict=True, runner=runner)
            )
    agree_given = sum(r.passed == _official_pass(row) for r, row in zip(given, rows))
    agree_picked = 0
    for r, row in zip(picked, rows):
        if isinstance(r, UserError):
            print(f"  no pick: {row['path']}: {r}")
            continue
        ok = r.passed == _official_pass(row)
        agree_picked += ok
        if r.ruleset != row["ruleset"] or not ok:
            print(
                f"  picked {r.ruleset} (recorded {row['ruleset']}, verdict "
                f"{'agrees' if ok else 'DIFFERS'}): {row['path']}: {r.ruleset_reason}"
            )
    real_pass = [
        (r, row)
        for r, row in zip(strict, rows)
        if row.get("kind", "real" if "/real/" in "/" + row["path"] else "mutated") == "real"
        and _official_pass(row)
    ]
    alarms = [(r, row) for r, row in real_pass if not r.passed]
    for r, row in alarms:
        print(
            f"  strict false alarm: {row['path']}: "
            + "; ".join(f"{f.check}: {f.message[:120]}" for f in r.errors)
        )
    print(f"with the recorded ruleset: {agree_given}/{len(rows)} agree")
    print(
        f"ruleset picked from the log: {agree_picked}/{len(rows)} agree, "
        f"{sum(isinstance(r, UserError) for r in picked)} refused (ask for --ruleset)"
    )
    print(
        f"--strict false alarms on real logs the official checker passes: "
        f"{len(alarms)}/{len(real_pass)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
