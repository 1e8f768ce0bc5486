"""The `extended` marker's rule (tests/README.md, "Time budget"): an extended test is left out of
README's `pytest -q` only because a cheaper default test covers its case, so each one names that
test in the comment just above its mark, and CI runs them all after the default run."""

import os
import re

from tests import processes

EXTENDED = re.compile(
    r"pytest\.mark\.extended|marks=pytest\.mark\.extended|= pytest\.mark\.extended"
)


def _test_files():
    for folder, _, files in os.walk(os.path.join(processes.REPO_ROOT, "tests")):
        for name in files:
            if name.startswith("test_") and name.endswith(".py"):
                yield os.path.join(folder, name)


def _comment_above(lines, index):
    """The comment block that ends on or above `lines[index]`, skipping decorator and
    parametrize lines between it and the mark (at most 12 lines up)."""
    text = []
    for line in reversed(lines[max(0, index - 12) : index + 1]):
        stripped = line.strip()
        if stripped.startswith("#"):
            text.append(stripped.lstrip("# "))
        elif text:
            break
    return " ".join(reversed(text))


def test_every_extended_test_names_the_default_test_that_covers_it():
    unnamed = []
    for path in _test_files():
        if path.endswith("test_markers.py"):
            continue
        with open(path) as f:
            lines = f.read().splitlines()
        for i, line in enumerate(lines):
            if EXTENDED.search(line) and "EXTENDED = {" not in line:
                comment = _comment_above(lines, i)
                comment = comment.lower()
                if "extended" not in comment or "default run covers" not in comment:
                    unnamed.append(f"{os.path.relpath(path, processes.REPO_ROOT)}:{i + 1}")
    assert not unnamed, f"extended tests without the default test that covers them: {unnamed}"


def test_ci_runs_the_extended_tests_and_the_default_run_leaves_them_out():
    with open(os.path.join(processes.REPO_ROOT, "pyproject.toml")) as f:
        pyproject = f.read()
    with open(os.path.join(processes.REPO_ROOT, ".ci", "run")) as f:
        ci = f.read()
    assert "-m 'not slow and not extended'" in pyproject
    assert 'pytest -q -m "extended and not slow"' in ci
