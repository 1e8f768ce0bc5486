"""Fixtures of the compliance tests: the shared corpus of real MLPerf logs, when it is present."""

import json
import os
import pathlib

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
# In CI the repository is cloned fresh with shared/ beside it.
CORPUS_DIR = pathlib.Path(
    os.environ.get("MLPERF_TF_COMPLIANCE_CORPUS", REPO_ROOT.parent / "shared" / "compliance-corpus")
)


def fuzz_examples(default: int) -> int:
    """Hypothesis examples for the fuzz tests: MLPERF_TF_FUZZ_EXAMPLES (set by --fuzz-examples)."""
    return int(os.environ.get("MLPERF_TF_FUZZ_EXAMPLES", default))


@pytest.fixture(scope="session")
def corpus_dir() -> pathlib.Path:
    if not (CORPUS_DIR / "verdicts.jsonl").is_file():
        pytest.skip(f"needs the compliance corpus at {CORPUS_DIR} (../shared/compliance-corpus)")
    return CORPUS_DIR


@pytest.fixture(scope="session")
def corpus_rows(corpus_dir):
    with open(corpus_dir / "verdicts.jsonl") as handle:
        return [json.loads(line) for line in handle]


@pytest.fixture(scope="session")
def corpus_reports(corpus_dir, corpus_rows):
    """Every corpus file checked once, with its recorded ruleset, quality enforced, not strict."""
    from compliance.checker import check_logs

    paths = [str(corpus_dir / row["path"]) for row in corpus_rows]
    reports = {}
    for ruleset in sorted({row["ruleset"] for row in corpus_rows}):
        chosen = [p for p, row in zip(paths, corpus_rows) if row["ruleset"] == ruleset]
        for path, report in zip(chosen, check_logs(chosen, ruleset=ruleset, jobs=2)):
            reports[path] = report
    return [reports[p] for p in paths]
