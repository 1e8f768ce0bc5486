"""Every tool under `tools/` answers `--help` with its usage, and `tools/` imports nothing from `tests/`.

In-process: importing a tool and calling its `main(["--help"])` costs the TensorFlow import once
for all of them, where 30-odd fresh processes would cost it 30-odd times. The scripts that import
no TensorFlow also run as the command lines the README gives, in fresh processes, bounded by a
timeout (the repository-root bootstrap of a script in a subfolder is what they check).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import pathlib
import signal
import subprocess
import sys
from unittest import mock

import pytest

TOOLS = pathlib.Path(__file__).resolve().parents[2] / "tools"
GROUPS = ("peers", "costs", "studies", "corpus", "dev")
HELP_SECONDS = 60  # one tool's --help in-process, the TensorFlow import included
PROCESS_SECONDS = 60


def _scripts() -> list[pathlib.Path]:
    """The tools: modules in a group folder that run as scripts."""
    return sorted(
        p
        for group in GROUPS
        for p in (TOOLS / group).glob("*.py")
        if 'if __name__ == "__main__":' in p.read_text(encoding="utf-8")
    )


@contextlib.contextmanager
def _deadline(seconds: float):
    """Fails the test (TimeoutError) if the block runs past `seconds`: a tool whose import or
    `--help` hangs must not hang the suite. SIGALRM, so only in the main thread (pytest's)."""

    def expire(signum, frame):
        raise TimeoutError(f"--help took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _module(path: pathlib.Path) -> str:
    return ".".join(path.relative_to(TOOLS.parent).with_suffix("").parts)


def test_every_tool_is_in_a_group_and_the_readme():
    loose = sorted(p.name for p in TOOLS.glob("*.py"))
    assert loose == ["__init__.py", "harness.py", "profile_ops.py"], loose
    readme = (TOOLS / "README.md").read_text(encoding="utf-8")
    missing = [
        str(p.relative_to(TOOLS)) for p in _scripts() if str(p.relative_to(TOOLS)) not in readme
    ]
    assert not missing, f"tools/README.md does not describe: {missing}"
    assert len(_scripts()) >= 30


def test_no_tool_imports_from_tests():
    offenders = [
        str(p.relative_to(TOOLS))
        for p in TOOLS.rglob("*.py")
        for line in p.read_text(encoding="utf-8").splitlines()
        if line.strip().startswith(("from tests", "import tests"))
    ]
    assert not offenders, offenders


@pytest.mark.parametrize("path", _scripts(), ids=lambda p: str(p.relative_to(TOOLS)))
def test_help_in_process(path):
    out = io.StringIO()
    # A tool may set environment defaults at import (TF log level, oneDNN): kept to the test.
    with _deadline(HELP_SECONDS), mock.patch.dict(os.environ), contextlib.redirect_stdout(out):
        main = importlib.import_module(_module(path)).main
        with pytest.raises(SystemExit) as exit_info:
            main(["--help"])
    assert exit_info.value.code == 0, out.getvalue()
    assert out.getvalue().startswith("usage:"), out.getvalue()[:300]


def _imports_tensorflow(path: pathlib.Path) -> bool:
    text = path.read_text(encoding="utf-8")
    heavy = ("import tensorflow", "import keras", "from mlperf_tf", "from benchmarks")
    return any(line.startswith(heavy) for line in text.splitlines())


@pytest.mark.parametrize(
    "path",
    [p for p in _scripts() if not _imports_tensorflow(p)],
    ids=lambda p: str(p.relative_to(TOOLS)),
)
def test_help_as_a_script(path):
    done = subprocess.run(
        [sys.executable, str(path), "--help"], capture_output=True, text=True,
        timeout=PROCESS_SECONDS, cwd=TOOLS.parent, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage:"), done.stdout[:300]


def test_spatial_refuses_a_benchmark_without_a_trunk_in_one_line(capsys):
    """`bench_spatial --benchmark=transformer` once raised TypeError: the Transformer's
    `parallel_axes` is a property (its axes follow the config), not a class tuple."""
    from tools.costs import bench_spatial

    with pytest.raises(SystemExit) as exit_info:
        bench_spatial.main(["--benchmark=transformer"])
    assert exit_info.value.code == 2
    assert "--benchmark=transformer has no convolutional trunk" in capsys.readouterr().err
    assert "spatial" in bench_spatial.supported_axes("resnet50")
