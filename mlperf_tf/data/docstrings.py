"""Provides the mini presets' offline English corpus: docstrings of installed Python code.

The mini presets of the language benchmarks (BERT, Llama) need English text that exists on
every machine without a download. The docstrings of the standard library (and of installed
packages such as numpy and keras) are that: read with `ast`, nothing is imported or run. Code,
doctests and one-word fragments are dropped, so what remains is prose. The file lists are
sorted, so the corpus, hence each mini dataset, is the same wherever the same versions are
installed.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import sysconfig
from collections.abc import Iterable

# Folders of the standard library that hold tests, vendored copies or old tools, not its docs.
STDLIB_SKIP_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "lib2to3"}
)
# Folders of an installed package that hold tests or demos.
PACKAGE_SKIP_DIRS = frozenset(
    {"tests", "test", "testing", "site-packages", "idlelib", "turtledemo"}
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'`])")
_MIN_LETTERS = 3


def python_files(
    root: str, *, skip_dirs: Iterable[str], skip_test_files: bool = False
) -> list[str]:
    """The .py files under `root` (sorted), outside folders named in `skip_dirs`;
    `skip_test_files` leaves out `*_test.py` too."""
    skip = frozenset(skip_dirs)
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip)
        files.extend(
            os.path.join(dirpath, f)
            for f in sorted(filenames)
            if f.endswith(".py") and not (skip_test_files and f.endswith("_test.py"))
        )
    return sorted(files)


def stdlib_python_files() -> list[str]:
    """The standard library's .py files (tests and site-packages excluded), sorted."""
    return python_files(sysconfig.get_paths()["stdlib"], skip_dirs=STDLIB_SKIP_DIRS)


def package_python_files(package: str) -> list[str]:
    """An installed package's .py files (tests excluded), sorted; [] if it is not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return []
    root = list(spec.submodule_search_locations)[0]
    return python_files(root, skip_dirs=PACKAGE_SKIP_DIRS, skip_test_files=True)


def module_docstrings(path: str) -> list[str]:
    """The docstrings of a module and its classes and functions, in line order; [] for a file
    this Python cannot read or parse (it is simply not part of the corpus)."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return []
    nodes = [tree] + [
        n
        for n in ast.walk(tree)
        if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    nodes.sort(key=lambda n: getattr(n, "lineno", 0))
    return [d for n in nodes if (d := ast.get_docstring(n))]


def docstring_sentences(docstring: str) -> list[str]:
    """Prose sentences of one docstring: paragraphs joined, code and doctests dropped."""
    sentences = []
    for paragraph in re.split(r"\n\s*\n", docstring):
        lines = [ln.strip() for ln in paragraph.splitlines()]
        if any(ln.startswith((">>>", "...", "$ ", "%")) for ln in lines):
            continue  # examples and code blocks are not English prose
        text = " ".join(ln for ln in lines if ln)
        for sentence in _SENTENCE_END.split(text):
            sentence = sentence.strip()
            if sum(c.isalpha() for c in sentence) >= _MIN_LETTERS:
                sentences.append(sentence)
    return sentences


def file_sentences(path: str) -> list[str]:
    """The prose sentences of all docstrings of one .py file (one document of the corpus)."""
    return [s for d in module_docstrings(path) for s in docstring_sentences(d)]
