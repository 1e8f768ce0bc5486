"""Every tool under `tools/` answers `--help` with its usage and exit code 0, doing no work.

All tools run in one child process (`help_driver`: TensorFlow and the suite are imported once),
each bounded by an alarm; a tool that fails there is tried again alone, so that a tool whose
import-time set-up only works first in a process is judged on its own.
"""

import json
import pathlib
import subprocess
import sys

from tests import processes

TOOLS = pathlib.Path(processes.REPO_ROOT) / "tools"


def _scripts() -> list[str]:
    """The tools that are scripts (they run under `__main__`), wherever they sit under tools/."""
    return sorted(
        str(p)
        for p in TOOLS.rglob("*.py")
        if 'if __name__ == "__main__"' in p.read_text(encoding="utf-8")
    )


def _driver(paths: list[str], timeout: int) -> list[dict]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.tools.help_driver", "--timeout=60", *paths],
        cwd=processes.REPO_ROOT, env=processes.python_env(PYTHONPATH=processes.REPO_ROOT),
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return rows


def test_every_tool_prints_its_help_and_exits_0():
    scripts = _scripts()
    assert len(scripts) >= 30, scripts  # the discovery finds the tools
    rows = {r["path"]: r for r in _driver(scripts, timeout=600)}
    failed = [p for p in scripts if p not in rows or rows[p]["code"] != 0 or not rows[p]["usage"]]
    for path in failed:  # alone, in a fresh process
        rows.update({r["path"]: r for r in _driver([path], timeout=180)})
    bad = {p: rows.get(p) for p in scripts if not (rows.get(p, {}).get("code") == 0
                                                   and rows[p]["usage"])}  # fmt: skip
    assert not bad, bad
