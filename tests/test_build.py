"""The Bazel BUILD file names every module and every test file of the tree."""

import os
import re

from tools.dev import update_build


def _quoted_paths(text):
    return set(re.findall(r'"([\w/.-]+\.py)"', text))


def test_build_lists_every_module_and_test_file():
    with open(os.path.join(update_build.REPO_ROOT, "BUILD"), encoding="utf-8") as f:
        listed = _quoted_paths(f.read())
    wanted = set()
    for top in (*update_build.PACKAGES, "tests"):
        wanted.update(update_build.python_files(top))
    missing = sorted(wanted - listed)
    assert not missing, f"missing from BUILD (run `python tools/dev/update_build.py`): {missing}"
    stale = sorted(p for p in listed if not os.path.exists(os.path.join(update_build.REPO_ROOT, p)))
    assert not stale, f"BUILD names files that do not exist: {stale}"


def test_every_test_file_is_a_py_test_target():
    with open(os.path.join(update_build.REPO_ROOT, "BUILD"), encoding="utf-8") as f:
        text = f.read()
    tests = [
        p for p in update_build.python_files("tests") if os.path.basename(p).startswith("test_")
    ]
    for test in tests:
        assert re.search(r'py_test\(\s*name = "[^"]+",\s*srcs = \["' + re.escape(test), text), test
