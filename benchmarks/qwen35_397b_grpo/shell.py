"""Provides `Shell`: OpenHands CodeActAgent's `execute_bash` as the reference's agent has it, one
bash session per rollout inside the task's container, kept between calls.

What persists, as in OpenHands' session (`openhands/runtime/utils/bash.py`, `BashSession`: a
tmux pane): the working directory, variables and functions, background processes, and a command
still running. A call returns when its command ends, or when it has printed nothing new for
`no_change_timeout_s` (OpenHands' `NO_CHANGE_TIMEOUT_SECONDS`, 30), or at the call's own
`timeout` (OpenHands' hard timeout); in both cases the command keeps running and the agent sees
OpenHands' words for it. While it runs, a new command is not executed (OpenHands' message
again); `is_input=true` sends text to it, or a key: `C-c` interrupts it, `C-z` stops it
(SIGINT / SIGTSTP to its process group); an empty command waits for more of its output.

How, without tmux: one `bash` started through the runtime's exec with pipes; `set -m` gives each
command its own process group (the keys reach the command, not the session); each command is
sent as one line, `eval '<the command>'; printf <marker>` (bash reads the whole line before it
runs it, so a command reading its input gets only what `is_input` sends later), and the marker
(a random token, the exit code, the shell's pid and `$PWD`) ends its output. The keys are sent
by a second exec that finds the session's children in `/proc`.

Not reproduced: a terminal. `C-d` (end of input) cannot be sent through a pipe: it is answered
in text. Programs that need a terminal (`top`, `less`, an editor) see none, as under any exec.
A command running inside the shell itself (a builtin loop) has no process group of its own:
`C-c` then restarts the session in its last directory (said in the observation). OpenHands'
refusal of several commands in one call (it splits them with `bashlex`) is not reproduced:
they run as one script.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import signal
import subprocess
import threading
import time

# OpenHands BashSession's NO_CHANGE_TIMEOUT_SECONDS.
NO_CHANGE_TIMEOUT_S = 30.0
# Output a call keeps: the first and last halves of this many bytes (a flood is cut in the
# middle, as the observation is anyway: `R2EGymEnvironment` clips it to
# `env.max_observation_chars`).
MAX_BUFFER_BYTES = 1 << 20
_POLL_S = 0.05
# The session's bash, started with SIGINT, SIGTSTP and SIGQUIT at their default actions: a
# process that ignores SIGINT (an xdist test worker does; Apptainer's exec hands dispositions
# down) would hand the ignore on to bash and every command, and a non-interactive bash can
# neither trap nor reset a signal ignored when it started. The container's `python3` resets
# them (the editor needs it anyway); without one, bash starts as it is.
_RESET_AND_EXEC = (
    "import os, signal\n"
    "for s in (signal.SIGINT, signal.SIGTSTP, signal.SIGQUIT): signal.signal(s, signal.SIG_DFL)\n"
    "os.execvp('bash', ['bash', '--noprofile', '--norc'])"
)
_SESSION = (
    f"command -v python3 >/dev/null && exec python3 -c {shlex.quote(_RESET_AND_EXEC)}; "
    "exec bash --noprofile --norc"
)
_SIGNALS = {"C-c": "INT", "C-z": "TSTP"}

# OpenHands' observations (the agent learns to read them): the suffixes of a command still
# running and the prefix of a continued one.
HINT = (
    "You may wait longer to see additional output by sending empty command '', send other "
    "commands to interact with the current process, or send keys to interrupt/kill the command."
)
CONTINUED = "[Below is the output of the previous command.]\n"
NOT_EXECUTED = (
    '[Your command "{command}" is NOT executed. The previous command is still running - You '
    "CANNOT send new commands until the previous command is completed. By setting `is_input` "
    "to `true`, you can interact with the current process: You may wait longer to see "
    "additional output of the previous command by sending empty command '', send other "
    'commands to interact with the current process, or send keys ("C-c", "C-z", "C-d") to '
    "interrupt/kill the previous command before sending your new command.]"
)
NO_COMMAND_RUNNING = "ERROR: No previous running command to interact with."
NO_COMMAND_TO_WAIT_FOR = "ERROR: No previous running command to retrieve logs from."


class ShellError(Exception):
    """The session could not be started (the runtime does not exec, or bash is missing)."""


class Shell:
    """One persistent bash session through `exec_prefix` (a runtime's exec into the container,
    e.g. `apptainer exec --pwd /testbed instance://NAME`).

    `run(command, is_input=, timeout=, wait_s=)` is `execute_bash`: it returns the observation
    text and never raises for what the command does. `close` kills the session.

    Raises:
      ShellError: (from the constructor, or `run` restarting an exited session) the session
        does not start.
    """

    def __init__(self, exec_prefix: list[str], *, cwd: str,
                 no_change_timeout_s: float = NO_CHANGE_TIMEOUT_S, side_timeout_s: float = 30.0):  # fmt: skip
        self.exec_prefix = list(exec_prefix)
        self.cwd = cwd
        self.no_change_timeout_s = no_change_timeout_s
        self.side_timeout_s = side_timeout_s
        self.pid = ""  # the session shell's pid as the container sees it
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Condition()
        self._buffer = bytearray()
        self._shown = 0  # where the next observation's text starts in `_buffer`
        self._token: bytes | None = None  # the marker of the command running, if any
        self._eof = False
        self._start()

    # ---- the session -------------------------------------------------------------------------
    def _start(self) -> None:
        """Starts a session in `cwd` with job control on and SIGINT handled."""
        proc = subprocess.Popen(
            [*self.exec_prefix, "sh", "-c", _SESSION], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        with self._lock:
            self._proc, self._eof = proc, False
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()
        # `trap : INT`: a non-interactive bash whose foreground job dies of SIGINT ends itself
        # too, unless it has a handler (the job still gets the default action).
        self._submit(f"set -m; trap : INT; cd {shlex.quote(self.cwd)}")
        text = self._wait(None, wait_s=self.side_timeout_s, soft=False)
        if self._token is not None or self._eof:
            self.close()
            why = " ".join(text.split())[:200]
            raise ShellError(f"the container's bash session did not start: {why}")
        with self._lock:
            self._buffer.clear()
            self._shown = 0

    def _read(self, proc: subprocess.Popen) -> None:
        fd = proc.stdout.fileno()
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:
                data = b""
            with self._lock:
                if proc is not self._proc:  # an old session's last output: not this one's
                    return
                if not data:
                    self._eof = True
                    self._lock.notify_all()
                    return
                self._buffer += data
                over = len(self._buffer) - self._shown - MAX_BUFFER_BYTES
                if over > 0:
                    cut = self._shown + MAX_BUFFER_BYTES // 2
                    note = f"\n[... {over:,} bytes of output left out ...]\n".encode()
                    self._buffer[cut : cut + over] = note
                self._lock.notify_all()

    def _submit(self, command: str) -> None:
        token = f"__MLPERF_SHELL_{secrets.token_hex(8)}__"
        line = (f"eval {shlex.quote(command)}; "
                f"printf '\\n%s %s %s %s\\n' {token} \"$?\" \"$$\" \"$PWD\"\n")  # fmt: skip
        with self._lock:
            self._buffer.clear()
            self._shown = 0
            self._token = token.encode()
        self._send(line.encode())

    def _send(self, data: bytes) -> None:
        try:
            self._proc.stdin.write(data)
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the session has ended: `_wait` sees its end and starts another

    def close(self) -> None:
        """Kills the session: its commands' process groups (background jobs included, by a
        second exec), then the exec client's. A process that left them (`setsid`) is ended by
        the container's stop."""
        if self.pid and self._proc is not None and self._proc.poll() is None:
            self._signal("KILL")
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)

    # ---- execute_bash ------------------------------------------------------------------------
    def run(self, command: str, *, is_input: bool = False, timeout: float | None = None,
            wait_s: float) -> str:  # fmt: skip
        """OpenHands' `execute_bash(command, is_input, timeout)`: the observation. `wait_s`
        bounds the call whatever the command does (the rollout's agent timeout)."""
        command = command.strip()
        if self._token is None:
            if command == "":
                return NO_COMMAND_TO_WAIT_FOR
            if is_input:
                return NO_COMMAND_RUNNING
            self._submit(command)
            return self._wait(timeout, wait_s=wait_s)
        if not is_input and command:
            with self._lock:
                text = self._take_text()
            return self._join(CONTINUED, text, NOT_EXECUTED.format(command=command))
        key = ""
        if re.fullmatch(r"C-[a-z]", command):
            key = command
            if key == "C-d":
                return ("ERROR: C-d (end of input) cannot be sent: this shell has no terminal. "
                        "Send C-c to interrupt the command.")  # fmt: skip
            if key not in _SIGNALS:
                return f"ERROR: the key {key} cannot be sent (keys: C-c, C-z)."
            if not self._signal(_SIGNALS[key]):
                with self._lock:
                    text = self._take_text()
                self.close()
                self._start()
                return self._join("", text, f"[{key} reached no process of the command: it ran "
                                  f"in the shell itself; a new session was started in {self.cwd}.]")  # fmt: skip
            if key == "C-c":
                self._after_interrupt()
        elif command:
            self._send((command + "\n").encode())
        return self._wait(timeout, wait_s=wait_s, continued=True, key=key)

    def _after_interrupt(self) -> None:
        """A command list whose job dies of SIGINT is abandoned by bash (it reads the next
        line; the rest of the line, the marker, never runs): when no marker comes and the
        session has no process left, the marker is sent as the next line, with bash's 130."""
        deadline = time.monotonic() + 1.0
        with self._lock:
            while self._token is not None and self._buffer.find(self._token) < 0:
                if self._eof or time.monotonic() >= deadline:
                    break
                self._lock.wait(_POLL_S)
            if self._token is None or self._buffer.find(self._token) >= 0 or self._eof:
                return
            token = self._token.decode()
        if self._signal("0") == 0:
            self._send(f'printf \'\\n%s %s %s %s\\n\' {token} 130 "$$" "$PWD"\n'.encode())

    @staticmethod
    def _join(prefix: str, text: str, suffix: str) -> str:
        """An observation: the continuation prefix and output (when there is output), then
        the suffix on its own line."""
        head = text.rstrip()
        head = f"{prefix}{head}" if head else ""
        return f"{head}\n{suffix}" if head else suffix

    def _take_text(self) -> str:
        """The output since the last observation (the lock held)."""
        text = bytes(self._buffer[self._shown :])
        self._shown = len(self._buffer)
        return text.decode(errors="replace")

    def _wait(self, timeout: float | None, *, wait_s: float, continued: bool = False,
              soft: bool = True, key: str = "") -> str:  # fmt: skip
        """Waits for the marker, the session's end, the no-change or the hard timeout, or
        `wait_s`; returns the observation of the output since the last one."""
        begin = last_change = time.monotonic()
        prefix = CONTINUED if continued else ""
        with self._lock:
            seen = len(self._buffer)
            while True:
                at = self._buffer.find(self._token) if self._token else -1
                if at >= 0 and self._buffer.find(b"\n", at) >= 0:
                    return self._completed(at, prefix, key)
                if self._eof:
                    text = self._take_text()
                    break
                now = time.monotonic()
                if len(self._buffer) != seen:
                    seen, last_change = len(self._buffer), now
                if timeout is None and soft and now - last_change >= self.no_change_timeout_s:
                    why = (
                        f"The command has no new output after {self.no_change_timeout_s:g} seconds."
                    )
                    return self._still_running(prefix, why)
                limit = wait_s if timeout is None else min(timeout, wait_s)
                if now - begin >= limit:
                    return self._still_running(
                        prefix, f"The command timed out after {limit:g} seconds."
                    )
                self._lock.wait(_POLL_S)
        if not soft:  # starting: the caller reports it
            return text
        code = self._proc.wait(10) if self._proc is not None else None
        self._start()
        return self._join(prefix, text, f"[Current working directory: {self.cwd}]\n"
                          f"[Command finished with exit code {code}]\n[The shell exited; a new "
                          f"session was started in {self.cwd}.]")  # fmt: skip

    def _completed(self, at: int, prefix: str, key: str) -> str:
        """The observation of a command that ended (its marker at `at`), as `R2EGymEnvironment`
        answers every command: its output, the directory and the exit code."""
        match = re.match(rb"\S+ (\d+) (\d+) (.*)\n", bytes(self._buffer[at:]))
        text = bytes(self._buffer[self._shown : at]).decode(errors="replace")
        text = text[:-1] if text.endswith("\n") else text  # the marker's own newline
        code = int(match.group(1)) if match else -1
        if match:
            self.pid = match.group(2).decode()
            self.cwd = match.group(3).decode(errors="replace") or self.cwd
        self._buffer.clear()
        self._shown = 0
        self._token = None
        sent = f" CTRL+{key[-1].upper()} was sent." if key else ""
        return self._join(prefix, text, f"[Current working directory: {self.cwd}]\n"
                          f"[Command finished with exit code {code}]{sent}")  # fmt: skip

    def _still_running(self, prefix: str, why: str) -> str:
        text = self._take_text()
        return self._join(prefix, text, f"[{why} {HINT}]")

    def _signal(self, name: str) -> int:
        """Sends SIG`name` ("0": none, a count) to the process groups of the session's
        children (each command's own, `set -m`), by a second exec; how many children it found
        (0 when the command runs in the shell itself or the exec fails)."""
        script = ("n=0; for d in /proc/[0-9]*; do s=$(cat $d/stat 2>/dev/null) || continue; "
                  f"set -- ${{s##*) }}; if [ \"$2\" = {self.pid} ]; then "
                  f"kill -{name} -- -$3 2>/dev/null; n=$((n+1)); fi; done; echo $n")  # fmt: skip
        try:
            done = subprocess.run([*self.exec_prefix, "bash", "-c", script], capture_output=True,
                                  stdin=subprocess.DEVNULL, timeout=self.side_timeout_s)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return 0
        last = done.stdout.strip().splitlines()[-1:]
        return int(last[0]) if last and last[0].isdigit() else 0
