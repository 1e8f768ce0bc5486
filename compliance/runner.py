"""Provides `OfficialRunner`: the official checker run on one log at a time, each in a fresh process.

The official checker keeps module-level state and runs Python from its rule files, so no two logs
may share its interpreter (compliance/README.md, "Isolation"). Where the OS can fork, a process
that imported the checker but never ran a check forks a child per log
(compliance/official_worker.py). This module imports only the standard library and
`mlperf_tf.errors`: the CLI builds a runner before it imports the rest of the checker, so that for a single `check LOG` the checker's
process is already importing the official code while this process reads the log.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from compliance.options import DEFAULT_TIMEOUT_S, USAGE, WORKER_MEMORY_LIMIT_BYTES
from mlperf_tf.errors import UserError

if TYPE_CHECKING:
    from compliance import logfile

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "official_worker.py")


def stock_command(log_path, ruleset: str, *, log_output=None) -> list[str]:
    """The official checker's own command line for one log: `python -m
    mlperf_logging.compliance_checker --usage training --ruleset R [--log_output F] LOG`, what a
    person runs and what the tests and tools compare this suite's verdicts with (its log file
    goes to the current folder unless `log_output` names one)."""
    output = ["--log_output", str(log_output)] if log_output else []
    return [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", USAGE,
            "--ruleset", ruleset, *output, str(log_path)]  # fmt: skip


def has_idle_core() -> bool:
    """Whether a core is idle besides this process's (1-minute load average, usable cores).

    A fork that imports the official checker while this process reads the log pays off only
    when it runs beside this process; on a busy machine it is CPU time spent twice (page copies,
    a second import), and a check in this process is faster (compliance/README.md, "Speed").
    """
    try:
        cores = len(os.sched_getaffinity(0))
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every OS
        return True
    return load + 1 <= cores


def single_threaded() -> bool:
    """Whether this process has one thread, native ones included, so that a fork of it is sound.

    `threading.active_count()` sees Python threads only: a process that imported TensorFlow (a
    test run, a notebook) has dozens of native pool threads, and a fork of it that then imported
    and ran the checker crashed now and then ("SystemError: error return without exception set",
    seen in the full test suite). Linux lists every thread in /proc/self/task.
    """
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:  # no /proc: Python's own count is the best there is
        return threading.active_count() == 1


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    # The worker imports mlperf_logging from wherever this process found it.
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


class OfficialRunner:
    """Runs the official checker on logs, each in a fresh process.

    Where the OS can fork, one server interpreter per runner imports the checker once and forks a
    child per log: every child starts from the checker's pristine module state (the server never
    checks anything itself), for a few milliseconds instead of an interpreter start-up. With
    `in_process`, this process is that server (no second interpreter to start: what a single
    `check LOG` costs); only for a process without other threads, which never runs a check
    itself. Then the runner forks its first child at once, which imports the checker while this
    process reads the log, and waits for its request (`official_worker.start_standby`); later
    checks are forks of this process, which then imports the checker itself. Elsewhere each log
    gets a new interpreter. Use it as a context manager; one thread at a time.

    `final_check_here` (with `in_process`, for a command that exits after its checks): the
    check submitted with `final=True` runs in this process itself, as the official command line
    runs its one check, with no fork and no second import of the checker; checks after it get
    new interpreters. That costs the least CPU time, which is what counts when no core is idle
    (`has_idle_core`); with an idle core the standby child's overlap is faster.
    """

    def __init__(
        self,
        *,
        use_fork: bool | None = None,
        in_process: bool = False,
        final_check_here: bool = False,
    ):
        self._use_fork = hasattr(os, "fork") if use_fork is None else use_fork
        self._in_process = in_process and self._use_fork
        self._final_check_here = final_check_here and self._in_process
        self._tmp = tempfile.TemporaryDirectory(prefix="mlperf_tf_check_")
        self._server = None  # the server's subprocess.Popen, once started
        self._count = 0
        self._standby = None  # an official_worker.Standby, until the first check takes it
        if self._in_process and not self._final_check_here and single_threaded():
            from compliance import official_worker

            self._standby = official_worker.start_standby()

    def __enter__(self) -> OfficialRunner:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Stops the server or an unused standby child (by its pid); removes the temporary files."""
        if self._standby is not None:
            self._standby.cancel()
            self._standby = None
        if self._server is not None:
            import subprocess

            self._server.stdin.close()
            try:
                self._server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._server.kill()
                self._server.wait()
            self._server.stdout.close()
            self._server = None
        self._tmp.cleanup()

    def _start_server(self):
        import subprocess

        errors = open(os.path.join(self._tmp.name, "server.err"), "w")  # noqa: SIM115
        with errors:
            return subprocess.Popen(
                [sys.executable, "-P", _WORKER, "--serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
                cwd=self._tmp.name,
                env=_worker_env(),
            )

    def _send(self, request: dict[str, Any]) -> None:
        if self._server is None or self._server.poll() is not None:
            self._server = self._start_server()
        self._server.stdin.write(json.dumps(request) + "\n")
        self._server.stdin.flush()

    def _receive(self, wait_s: float) -> dict[str, Any] | None:
        import select

        ready, _, _ = select.select([self._server.stdout], [], [], wait_s)
        reply = self._server.stdout.readline() if ready else ""
        if not reply:  # the server hung or died: never reuse it
            self._server.kill()
            self._server.wait()
            self._server = None
            return None
        return json.loads(reply)

    def run(self, scan: logfile.LogScan, ruleset: str, **options) -> dict[str, Any]:
        """Runs the official checker on the token lines of `scan`: `submit`, with its keyword
        options (`timeout` in seconds, `memory_limit` in bytes, ...), then waits.

        Returns:
          The worker's JSON result (see compliance/official_worker.py).

        Raises:
          UserError: the checker did not finish within `timeout` seconds, ran out of memory, or
            its process failed.
        """
        return self.submit(scan, ruleset, **options)()

    def submit(
        self,
        scan: logfile.LogScan,
        ruleset: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        memory_limit: int = WORKER_MEMORY_LIMIT_BYTES,
        skip_missing_rules: bool = False,
        final: bool = False,
    ) -> Callable[[], dict[str, Any]]:
        """Starts the official checker on `scan`; returns a function that waits for its result.

        The caller can do its own work on the log meanwhile (in a separate process where the OS
        can fork). The returned function raises as `run` does. `skip_missing_rules`: see
        `official_worker.run` (for benchmarks that no round has). `final`: no check follows on
        this runner (see `final_check_here`).
        """
        self._count += 1
        path = scan.path
        log_copy = os.path.join(self._tmp.name, f"log{self._count}.txt")
        out = os.path.join(self._tmp.name, f"result{self._count}.json")
        with open(log_copy, "w", encoding="latin-1", newline="") as handle:
            handle.writelines(scan.lines)
        request = {
            "log": log_copy,
            "ruleset": ruleset,
            "usage": USAGE,
            "memory_limit": memory_limit,
            "timeout": timeout,
            "out": out,
            "skip_missing_rules": skip_missing_rules,
        }

        def cleanup() -> None:
            for name in (log_copy, out):
                if os.path.exists(name):
                    os.remove(name)

        try:
            finish = self._start(path, request, final=final)
        except BaseException:
            cleanup()
            raise

        def wait() -> dict[str, Any]:
            try:
                result = finish()
            finally:
                cleanup()
            if result.get("out_of_memory"):
                raise UserError(
                    f"{path}: the official checker ran out of memory "
                    f"(limit {memory_limit / 2**30:g} GiB)"
                )
            return result

        return wait

    def _start(
        self, path: str, request: dict[str, Any], *, final: bool
    ) -> Callable[[], dict[str, Any]]:
        """Starts one check the way this runner can (here, in a new interpreter, in a fork of a
        standby or of this process, or on the server); returns a function that waits for it."""
        timeout, out = request["timeout"], request["out"]
        if final and self._final_check_here:
            result = self._check_here(path, request)
            return lambda: result
        if not self._use_fork:
            result = self._run_new_interpreter(
                path, request["log"], request["ruleset"], timeout, request["memory_limit"],
                request["skip_missing_rules"],
            )  # fmt: skip
            return lambda: result
        if self._standby is not None or (self._in_process and single_threaded()):
            from compliance import official_worker

            if self._standby is not None:  # it has been importing the checker meanwhile
                pid, self._standby = self._standby.check(request), None
            else:
                # The first check leaves the checker's import to the child, to overlap it
                # with this process's own work; later ones share it.
                pid = official_worker.start_fork(request, preloaded=self._count > 1)
            return lambda: self._forked_result(path, out, official_worker.wait_fork(pid), timeout)
        self._send(request)
        # The child stops itself with SIGALRM at `timeout`; the margin covers a slow machine.
        return lambda: self._forked_result(path, out, self._receive(timeout + 60), timeout)

    def _check_here(self, path: str, request: dict[str, Any]) -> dict[str, Any]:
        from compliance import official_worker

        # From now on this process is not pristine: no check may be forked from it.
        self._final_check_here = False
        self._use_fork = False
        try:
            return official_worker.check_here(request)
        except official_worker.CheckTimeout:
            raise UserError(
                f"{path}: the official checker did not finish within {request['timeout']:g} s"
            ) from None

    def _forked_result(self, path, out, reply, timeout) -> dict[str, Any]:
        if reply is None:
            raise UserError(f"{path}: the official checker's server process failed")
        if reply["signal"] == signal.SIGALRM:
            raise UserError(
                f"{path}: the official checker did not finish within {timeout:g} s"
            ) from None
        if reply["signal"] is not None:
            raise UserError(f"{path}: the official checker was killed by signal {reply['signal']}")
        try:
            with open(out) as handle:
                return json.load(handle)
        except (OSError, ValueError):
            raise UserError(
                f"{path}: the official checker process failed (exit code {reply['exit_code']})"
            ) from None

    def _run_new_interpreter(self, path, log_copy, ruleset, timeout, memory_limit, skip_missing):
        import subprocess

        command = [sys.executable, "-P", _WORKER, log_copy, ruleset, USAGE, str(memory_limit)]
        if skip_missing:
            command.append("skip_missing_rules")
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=self._tmp.name,
                env=_worker_env(),
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise UserError(
                f"{path}: the official checker did not finish within {timeout:g} s"
            ) from None
        try:
            result = json.loads(done.stdout)
        except ValueError:
            result = None
        if not isinstance(result, dict):
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise UserError(f"{path}: the official checker process failed: {last}")
        return result
