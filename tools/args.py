"""Provides `require_positive`: the argument check every `tools/` benchmark script makes."""

from __future__ import annotations

import argparse


def require_positive(parser: argparse.ArgumentParser, args: argparse.Namespace, *names: str):
    """Exits through `parser.error` (usage, the flag and its value) if any `--name` is not > 0."""
    for name in names:
        if getattr(args, name) <= 0:
            parser.error(f"--{name} ({getattr(args, name)}) must be positive")
