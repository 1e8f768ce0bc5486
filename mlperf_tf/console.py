"""Provides `quiet_stderr`: TensorFlow's known start-up noise kept off the console, real errors kept.

A CPU run of TensorFlow prints `E ... cuda_platform.cc] failed call to cuInit` (no GPU driver, which
is expected on a CPU) and `W ... slack.cc] Could not find a final prefetch` (a tf.data optimization
that does not apply) from C++, before anything of ours; a new user reads that as failure. Those
lines come from C++ loggers that `TF_CPP_MIN_LOG_LEVEL` does not fully govern, and raising that level
to 3 would also hide real errors. So the process's stderr (file descriptor 2, which C++ writes to)
goes through a small filter process that drops only lines matching `NOISE` and forwards every other
byte unchanged. A separate process rather than a thread: if TensorFlow aborts (a `CHECK` failure),
its last words are already in the pipe and the filter still forwards them.

`--verbosity` (absl's flag) given on the command line turns the filter off.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys

# Lines that say nothing is wrong on a CPU host. Each pattern names the C++ file that logs it, so
# that a real error with similar words elsewhere still shows.
NOISE = (
    r"cuda_platform\.cc:\d+\] failed call to cuInit",
    r"cuda_diagnostics\.cc:\d+\]",
    r"slack\.cc:\d+\] Could not find a final `prefetch`",
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR",
    r"Unable to register cu(DNN|FFT|BLAS) factory",
    r"computation_placer\.cc:\d+\] computation placer already registered",
    r"TF-TRT Warning: Could not find TensorRT",
    r"oneDNN custom operations are on",
    r"This TensorFlow binary is optimized to use available CPU instructions",
    r"To enable the following instructions: .* rebuild TensorFlow",
)
_CLOSE_TIMEOUT_S = 10.0
# Written by `close`: the filter exits once it has forwarded everything before it, without
# waiting for end-of-file (a child process may still hold the pipe).
_CLOSE_LINE = b"\x00mlperf-tf console filter: close\x00\n"


def is_noise(line: str, patterns: tuple[str, ...] = NOISE) -> bool:
    """True when `line` is one of the known harmless start-up messages."""
    return any(re.search(p, line) for p in patterns)


def verbosity_requested(argv: list[str]) -> bool:
    """True when `argv` sets absl's `--verbosity`/`-v`: the user asked for TensorFlow's messages."""
    return any(a in ("-v", "--verbosity") or a.startswith(("--verbosity=", "-v=")) for a in argv)


class StderrFilter:
    """Routes file descriptor 2 through a filter process until `close` (see the module docstring).

    Use `quiet_stderr()`; `close()` is idempotent and waits (bounded) until every line written
    before it has reached the terminal, so call it before `os._exit`.
    """

    def __init__(self):
        sys.stderr.flush()
        self._original = os.dup(2)
        read_end, write_end = os.pipe()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "mlperf_tf.console"],
            stdin=read_end,
            stdout=self._original,
            stderr=self._original,
            close_fds=True,
        )
        os.close(read_end)
        os.dup2(write_end, 2)
        os.close(write_end)
        self.closed = False

    def close(self) -> None:
        """Restores fd 2 and waits for the filter to forward what it has (at most a few seconds)."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(ValueError, OSError):
            sys.stderr.flush()
        with contextlib.suppress(OSError):
            os.write(2, _CLOSE_LINE)
        os.dup2(self._original, 2)
        os.close(self._original)
        try:
            self._process.wait(timeout=_CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass  # a filter that is still starting on a loaded host goes on forwarding after us


class DropLibraryInfo(logging.Filter):
    """Drops INFO (and lower) records logged from inside TensorFlow's or Keras' own modules.

    TensorFlow logs some timings through absl's logger directly (e.g. the checkpoint saver's
    "Sharding callback duration"), so filtering by logger name is not enough: this filters by
    the file that logged. Warnings and errors still pass.
    """

    _PARTS = (f"{os.sep}tensorflow{os.sep}", f"{os.sep}keras{os.sep}")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        return not any(part in record.pathname for part in self._PARTS)


def drop_library_info(handler: logging.Handler) -> None:
    """Adds `DropLibraryInfo` to `handler` and to TF's own logger, once each.

    TF's logger may carry its own handler (mirrored runs printed "Reduce to ... then broadcast
    to ..." through it), so the filter sits on that logger too. A second `run` in one process
    adds nothing.
    """
    for target in (handler, logging.getLogger("tensorflow")):
        if not any(isinstance(f, DropLibraryInfo) for f in target.filters):
            target.addFilter(DropLibraryInfo())


def quiet_stderr(argv: list[str]) -> StderrFilter | None:
    """Starts the stderr filter unless `argv` asks for verbosity; returns it (or None)."""
    if verbosity_requested(argv):
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0")
        return None
    return StderrFilter()


# A C++ log line of TF that carries a Python error (an op such as tf.data's `PyFunc` failed in
# Python code, e.g. a host-side generator), when the next line starts its traceback.
_CPP_LOG_LINE = re.compile(
    rb"^\d{4}-\d\d-\d\d [\d:.]+: [IWE] \S+\.cc:\d+\] (?:.*status: )?UNKNOWN: [\w.]*Error: "
)
_TRACEBACK = b"Traceback (most recent call last):"
# What such a block holds after its first line: the traceback's frames and source (indented),
# blank lines, the exception's own line ("package.Error: ..."), and the ops' names ("\t [[...]]").
_IN_BLOCK = re.compile(rb"^(\s|$|Traceback |[\w.]+: )")
_MAX_BLOCK_LINES = 1000


class ErrorCopies:
    """Drops TF's C++ copies of a Python error raised inside an op (each op it aborts logs it
    again, traceback and all): the error itself reaches the run's own handling, which reports
    it (`mlperf_tf.data.pipeline.host_error_message`: a `UserError` of a host-side generator in
    one line; any other error with its traceback, once). `feed` takes a line (bytes) and
    returns the lines to forward, unchanged.
    """

    def __init__(self):
        self.pending: bytes | None = None  # a log line that may start a block
        self.dropping = 0  # lines dropped in the current block (0: not in one)

    def feed(self, line: bytes) -> list[bytes]:
        if self.pending is not None:
            first, self.pending = self.pending, None
            if line.startswith(_TRACEBACK):
                self.dropping = 1
                return []
            return [first, *self.feed(line)]
        if self.dropping:
            if _IN_BLOCK.match(line) and self.dropping < _MAX_BLOCK_LINES:
                self.dropping += 1
                return []
            self.dropping = 0
        if _CPP_LOG_LINE.match(line):
            self.pending = line
            return []
        return [line]

    def flush(self) -> list[bytes]:
        pending, self.pending = self.pending, None
        return [] if pending is None else [pending]


def _filter_main() -> None:
    """The filter process: copies stdin to stdout line by line, dropping `NOISE` and TF's C++
    copies of a Python error (`ErrorCopies`)."""
    # Ctrl-C reaches the whole process group: the filter must outlive the run's last message.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    copies = ErrorCopies()
    for raw in iter(source.readline, b""):
        if raw == _CLOSE_LINE:
            break
        for line in copies.feed(raw):
            if not is_noise(line.decode("utf-8", "replace")):
                sink.write(line)
        sink.flush()
    for line in copies.flush():
        sink.write(line)
    sink.flush()


if __name__ == "__main__":
    _filter_main()
