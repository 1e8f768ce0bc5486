"""Provides the argument checks every `tools/` script makes: positive numbers, comma lists and
output folders, each failing through `parser.error` (usage, then one line naming the flag)."""

from __future__ import annotations

import argparse

from mlperf_tf import listflags, paths
from mlperf_tf.errors import UserError


def require_positive(parser: argparse.ArgumentParser, args: argparse.Namespace, *names: str):
    """Exits through `parser.error` (usage, the flag and its value) if any `--name` is not > 0."""
    for name in names:
        if getattr(args, name) <= 0:
            parser.error(f"--{name} ({getattr(args, name)}) must be positive")


def comma_list(parser: argparse.ArgumentParser, text: str, flag: str, kind=str) -> list:
    """`listflags.parse_list` (no empty elements, spaces, wrong types or duplicates) for a tool."""
    try:
        return list(listflags.parse_list(text, flag, kind))
    except UserError as e:
        parser.error(str(e))


def output_dir(parser: argparse.ArgumentParser, path: str, flag: str) -> None:
    """`paths.try_output_dir` for a tool: the folder is tried (created, written, put back)."""
    try:
        paths.try_output_dir(path, flag)
    except UserError as e:
        parser.error(str(e))
