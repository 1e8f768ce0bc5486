"""Provides the scaffolding every benchmark's `prepare` command line shares: one parser, one error style.

Every `benchmarks/<name>/prepare.py` builds its parser with `parser` (the shared `--out_dir` and
`--mini` flags; argparse mistakes become `UserError`s), raises `UserError` (or `DataError`) for bad
input, and ends with `module_main(main)`. So `mlperf-tf prepare NAME ...` and
`python -m benchmarks.NAME.prepare ...` both report any problem as one line, `error: ...`, exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import NoReturn

from mlperf_tf.errors import UserError


class ArgumentParser(argparse.ArgumentParser):
    """An argparse parser whose errors (a missing or malformed flag) are `UserError`s.

    A parsed `--out_dir` is checked before any work: a file, or a folder under a file, is an error.
    """

    def error(self, message: str) -> NoReturn:
        raise UserError(message)

    def parse_args(self, args=None, namespace=None):  # noqa: D102 - argparse's, plus the check
        parsed = super().parse_args(args, namespace)
        if getattr(parsed, "out_dir", None):
            check_out_dir(parsed.out_dir)
        return parsed


def check_out_dir(path: str) -> None:
    """Raises UserError when `path` cannot become a folder: it, or a folder above it, is a file."""
    probe = os.path.abspath(path)
    while probe and not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if os.path.exists(probe) and not os.path.isdir(probe):
        raise UserError(f"--out_dir {path!r}: {probe!r} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"--out_dir {path!r}: the folder {probe!r} is not writable")


def parser(name: str, description: str, *, mini_help: str) -> ArgumentParser:
    """The parser of `mlperf-tf prepare NAME`, with the flags every benchmark has.

    Args:
      name: the benchmark's registry name (for the usage line).
      description: what the command converts.
      mini_help: what `--mini` writes instead (the offline mini dataset).
    """
    result = ArgumentParser(prog=f"mlperf-tf prepare {name}", description=description)
    result.add_argument("--out_dir", required=True, help="the data folder to write")
    result.add_argument("--mini", action="store_true", help=mini_help)
    return result


# The most shards, workers or vocabulary entries a conversion may ask for: beyond it a value
# means nothing (and would spin up that many files or processes).
MOST = 1_000_000


def require_positive(args: argparse.Namespace, names: Sequence[str], *, most: int = MOST) -> None:
    """Raises UserError naming the first of `names` whose value is not an integer in [1, most]."""
    for name in names:
        value = getattr(args, name)
        if value is not None and not 1 <= value <= most:
            raise UserError(f"--{name} ({value}) must be a positive integer (at most {most:,})")


def module_main(main: Callable[[list[str]], int | None]) -> NoReturn:
    """Runs `main(sys.argv[1:])` as a program: a `UserError` is one line `error: ...`, exit 2."""
    try:
        code = main(sys.argv[1:])
    except UserError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        code = 2
    sys.exit(code or 0)


@contextlib.contextmanager
def staged_folder(data_dir: str) -> Iterator[str]:
    """A temporary sibling folder of `data_dir` to write a dataset into, renamed to `data_dir`
    when the block ends without an error and removed when it raises: an interrupted `prepare`
    leaves no half-written dataset for a later run to read (the CLI prepares mini data only
    where `data_dir` does not exist).

    The caller checks `data_dir` first; an existing empty folder is replaced.
    """
    data_dir = os.path.abspath(data_dir)
    parent = os.path.dirname(data_dir)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=os.path.basename(data_dir) + ".partial-", dir=parent)
    try:
        yield staging
        os.chmod(staging, 0o755)  # mkdtemp makes it private; a dataset is not secret
        os.replace(staging, data_dir)
    finally:
        if os.path.exists(staging):
            shutil.rmtree(staging, ignore_errors=True)
