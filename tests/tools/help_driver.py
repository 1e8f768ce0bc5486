"""Runs `--help` of tools in this one process (`python -m tests.tools.help_driver PATH...`).

Prints one JSON line per tool: its path, the exit code `--help` ended with (None: it returned
without exiting), whether it printed a usage, the error if it raised, and the seconds it took.
Each tool gets `--timeout` seconds (an alarm) so that one that starts real work instead of
printing its help cannot hold the rest up. The test runs every tool through this and retries
any failure in a process of its own (a tool may set TensorFlow up at import in a way that only
works first, e.g. logical CPU devices).
"""

import contextlib
import io
import json
import runpy
import signal
import sys
import time


class _TimeoutError(Exception):
    pass


def _alarm(signum, frame):
    raise _TimeoutError()


def run_help(path: str, timeout: int) -> dict:
    out = io.StringIO()
    code, error = None, None
    begin = time.monotonic()
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    argv = sys.argv
    try:
        sys.argv = [path, "--help"]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except _TimeoutError:
        error = f"no help within {timeout} s (it started work?)"
    except BaseException as e:  # noqa: BLE001 (reported, not raised: the next tool still runs)
        error = f"{type(e).__name__}: {e}"
    finally:
        signal.alarm(0)
        sys.argv = argv
    text = out.getvalue()
    return {
        "path": path,
        "code": code,
        "usage": "usage:" in text.lower(),
        "error": error,
        "seconds": round(time.monotonic() - begin, 2),
    }


def main(argv: list[str]) -> int:
    timeout = 60
    if argv and argv[0].startswith("--timeout="):
        timeout, argv = int(argv[0].split("=", 1)[1]), argv[1:]
    for path in argv:
        print(json.dumps(run_help(path, timeout)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
