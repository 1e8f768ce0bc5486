"""Provides the scaffolding every benchmark's `prepare` command line shares: one parser, one error style.

Every `benchmarks/<name>/prepare.py` builds its parser with `parser` (the shared `--out_dir` and
`--mini` flags; argparse mistakes become `UserError`s), raises `UserError` (or `DataError`) for bad
input, and ends with `module_main(main)`. So `mlperf-tf prepare NAME ...` and
`python -m benchmarks.NAME.prepare ...` both report any problem as one line, `error: ...`, exit 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from mlperf_tf.errors import UserError


class ArgumentParser(argparse.ArgumentParser):
    """An argparse parser whose errors (a missing or malformed flag) are `UserError`s."""

    def error(self, message: str) -> NoReturn:
        raise UserError(message)


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


def require_positive(args: argparse.Namespace, names: Sequence[str]) -> None:
    """Raises UserError naming the first of `names` whose value is not a positive integer."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UserError(f"--{name} ({value}) must be a positive integer")


def module_main(main: Callable[[list[str]], int | None]) -> NoReturn:
    """Runs `main(sys.argv[1:])` as a program: a `UserError` is one line `error: ...`, exit 2."""
    try:
        code = main(sys.argv[1:])
    except UserError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        code = 2
    sys.exit(code or 0)
