"""The `extended` marker's rule (tests/README.md, "Time budget"): an extended test is left out of
README's `pytest -q` only because a cheaper default test covers its case, so each one names that
test in the comment just above its mark, and CI runs them all after the default run."""

import ast
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


def _extended_marks():
    """(where, the comment above) of every extended mark in the test files but this one."""
    for path in _test_files():
        if path.endswith("test_markers.py"):
            continue
        with open(path) as f:
            lines = f.read().splitlines()
        for i, line in enumerate(lines):
            if EXTENDED.search(line) and "EXTENDED = {" not in line:
                where = f"{os.path.relpath(path, processes.REPO_ROOT)}:{i + 1}"
                yield where, _comment_above(lines, i).lower()


def test_every_extended_test_names_the_default_test_that_covers_it():
    unnamed = [
        where
        for where, comment in _extended_marks()
        if "extended" not in comment or "default run covers" not in comment
    ]
    assert not unnamed, f"extended tests without the default test that covers them: {unnamed}"


def test_ci_runs_the_extended_tests_and_the_default_run_leaves_them_out():
    with open(os.path.join(processes.REPO_ROOT, "pyproject.toml")) as f:
        pyproject = f.read()
    with open(os.path.join(processes.REPO_ROOT, ".ci", "run")) as f:
        ci = f.read()
    assert "-m 'not slow and not extended'" in pyproject
    assert 'pytest -q -m "extended and not slow"' in ci


def _marks(decorators) -> set[str]:
    """The slow and extended `pytest.mark`s in decorators or a module's `pytestmark`."""
    return {
        node.attr
        for decorator in decorators
        for node in ast.walk(decorator)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"
        and node.attr in ("slow", "extended")
    }


def _default_tests():
    """{test function name} and {test file name} that README's default run runs: a function not
    marked slow or extended (itself or by its module's `pytestmark`; a parametrization with
    some cases marked still runs the others)."""
    names, files = set(), set()
    for path in _test_files():
        with open(path) as f:
            tree = ast.parse(f.read())
        module_marks = _marks(
            node.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            and any(getattr(t, "id", "") == "pytestmark" for t in node.targets)
        )
        if module_marks:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                whole = [d.func if isinstance(d, ast.Call) else d for d in node.decorator_list]
                if not _marks(d for d in whole if isinstance(d, ast.Attribute)):
                    names.add(node.name)
                    files.add(os.path.basename(path))
    return names, files


FILE = re.compile(r"(test_\w+)\.py")
TEST = re.compile(r"\b(test_\w+)")


def test_the_named_covers_are_default_tests():
    """A cover that is itself slow or extended (or renamed away) covers nothing in the default
    run: every `test_...` function and `test_....py` file a cover comment names is in it."""
    names, files = _default_tests()
    wrong = []
    for where, comment in _extended_marks():
        covers = comment.split("default run covers", 1)[-1]
        named_files = FILE.findall(covers)
        named_tests = TEST.findall(FILE.sub("", covers))
        wrong += [f"{where} {n}.py" for n in named_files if f"{n}.py" not in files]
        wrong += [f"{where} {n}" for n in named_tests if n not in names]
    assert not wrong, f"covers that README's default run does not run: {wrong}"
