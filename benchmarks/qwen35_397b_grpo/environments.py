"""Provides the benchmark's two environments on `mlperf_tf.rl.environment.Environment`:
`RepairEnvironment`, the generated repair tasks (`tasks.py`) in the local sandbox, and
`R2EGymEnvironment`, the reference's R2E-Gym tasks, each in its container image started by
Apptainer/Singularity or Docker as a subprocess; and `load_prompt_templates`, the reference's
OpenHands prompts read from the user's NeMo Gym checkout and checked by SHA-256.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

from benchmarks.qwen35_397b_grpo import config as config_lib
from benchmarks.qwen35_397b_grpo import r2egym
from benchmarks.qwen35_397b_grpo import shell as shell_lib
from benchmarks.qwen35_397b_grpo.tasks import SOLUTION, TESTS, RepairTask
from mlperf_tf.errors import UserError
from mlperf_tf.rl.environment import Environment
from mlperf_tf.rl.sandbox import Sandbox

# Runs every test_* function of the tests file; a failure prints its traceback and exits 1.
_RUN_TESTS = f"""
import sys, traceback
sys.path.insert(0, ".")
import {TESTS[:-3]} as tests
failed = 0
for name, test in sorted(vars(tests).items()):
    if name.startswith("test_") and callable(test):
        try:
            test()
            print(name, "passed")
        except Exception:
            failed += 1
            print(name, "FAILED")
            traceback.print_exc(limit=2)
sys.exit(1 if failed else 0)
"""


# Finished test runs by (solution.py, test_solution.py, timeout): `RepairEnvironment._pytest`.
_RESULTS: dict = {}
_MAX_RESULTS = 4096


class RepairEnvironment(Environment):
    """A generated repair task in a `Sandbox`: a fresh copy per rollout; tools `view`,
    `str_replace`, `run_tests`; the reward runs the task's original tests (a copy the agent
    cannot have edited) against the agent's `solution.py` under the test timeout."""

    def __init__(self, env: config_lib.EnvironmentConfig, *, validation: bool = False):
        self.env = env
        self.test_timeout_s = env.validation_test_timeout_s if validation else env.test_timeout_s
        self.sandbox: Sandbox | None = None
        self.task: RepairTask | None = None

    def reset(self, task: RepairTask) -> str:
        self.close()
        self.task = task
        with tempfile.TemporaryDirectory() as source:
            for name, text in task.files.items():
                with open(os.path.join(source, name), "w") as f:
                    f.write(text)
            self.sandbox = Sandbox(
                source, timeout_s=self.env.tool_timeout_s, cpu_s=self.env.tool_cpu_s,
                memory_mb=self.env.tool_memory_mb,
                max_output_chars=self.env.max_observation_chars,
            )  # fmt: skip
        return task.prompt()

    def tools(self):
        return {"view": self.view, "str_replace": self.str_replace, "run_tests": self.run_tests}

    def view(self, path: str) -> str:
        with open(self.sandbox.path(path)) as f:
            lines = f.read().splitlines()
        return "\n".join(f"{i + 1:4d}  {line}" for i, line in enumerate(lines))

    def str_replace(self, path: str, old_str: str, new_str: str) -> str:
        if os.path.basename(path) == TESTS:
            return f"error: {TESTS} must not be edited"
        full = self.sandbox.path(path)
        with open(full) as f:
            text = f.read()
        count = text.count(old_str)
        if count != 1:
            return f"error: old_str occurs {count} times in {path} (it must occur once)"
        with open(full, "w") as f:
            f.write(text.replace(old_str, new_str, 1))
        return f"edited {path}"

    def _pytest(self, timeout_s: float):
        """The tests' `test_*` functions in a fresh interpreter (pytest's start-up would be most
        of a rollout's environment time); exit code 0 when all pass.

        The tests are deterministic functions of the two files, so a finished run's result is
        kept by their exact contents (`_RESULTS`, bounded) and a rollout that reaches the same
        files again (the group's other rollouts, the reward after `run_tests`) reuses it: at
        a low sampling temperature most of an evaluation's runs are repeats. A run killed at
        its timeout is never reused."""
        with open(self.sandbox.path(SOLUTION)) as f, open(self.sandbox.path(TESTS)) as g:
            key = (f.read(), g.read(), timeout_s)
        if key in _RESULTS:
            return _RESULTS[key]
        argv = [sys.executable, "-I", "-c", _RUN_TESTS]
        result = self.sandbox.run(argv, timeout_s=timeout_s)
        if not result.timed_out:
            if len(_RESULTS) >= _MAX_RESULTS:
                _RESULTS.pop(next(iter(_RESULTS)))  # the oldest
            _RESULTS[key] = result
        return result

    def run_tests(self) -> str:
        return self._pytest(self.env.tool_timeout_s).observation()

    def reward(self) -> float:
        with open(self.sandbox.path(TESTS), "w") as f:  # the task's own tests, restored
            f.write(self.task.files[TESTS])
        result = self._pytest(self.test_timeout_s)
        return 1.0 if result.returncode == 0 else 0.0

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None


class SyntheticEnvironment(Environment):
    """The `smoke` preset's task: no tools; the rollout's reward is 1 when the bytes of its
    first turn sum to an even number (a reward that depends on what the policy wrote, with
    variance inside every group, in microseconds)."""

    def reset(self, task: str) -> str:
        self.first_turn = None
        return task

    def tools(self):
        return {}

    def act(self, text: str):
        if self.first_turn is None:
            self.first_turn = text
        return super().act(text)

    def reward(self) -> float:
        return float(sum((self.first_turn or "").encode()) % 2 == 0)


# ---- R2E-Gym in containers -----------------------------------------------------------------------

RUNTIMES = ("apptainer", "singularity", "docker")


def find_container_runtime(which=shutil.which, probe=None) -> str:
    """The first container runtime on PATH that answers (`apptainer`/`singularity` `--version`,
    `docker info`: a client without its daemon does not count).

    Raises:
      UserError: none found (one line naming what was looked for).
    """
    probe = probe or _probe
    tried = []
    for name in RUNTIMES:
        exe = which(name)
        if exe is None:
            continue
        if probe(name, exe):
            return exe
        tried.append(f"{name} at {exe} does not answer")
    detail = f" ({'; '.join(tried)})" if tried else ""
    raise UserError(
        "`env.kind` 'r2e_gym' needs a container runtime: none of apptainer, singularity, docker "
        f"works here{detail}; install one, or use `--config.env.kind=repair`."
    )


def _probe(name: str, exe: str) -> bool:
    argv = [exe, "info"] if name == "docker" else [exe, "--version"]
    try:
        return subprocess.run(argv, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def task_image(sif_dir: str, instance_id: str) -> str:
    """The task's SIF image in either layout the reference accepts
    (`<dir>/r2egym/<id>.sif` or `<dir>/<id>.sif`).

    Raises:
      UserError: neither exists (the task's environment cannot start).
    """
    for path in (os.path.join(sif_dir, "r2egym", f"{instance_id}.sif"),
                 os.path.join(sif_dir, f"{instance_id}.sif")):  # fmt: skip
        if os.path.isfile(path):
            return path
    raise UserError(
        f"task {instance_id!r}: no image {instance_id}.sif under `env.sif_dir` ({sif_dir}) or "
        "its r2egym/ folder; its environment cannot start."
    )


def container_commands(runtime: str, image: str, name: str, workdir: str = "/testbed"):
    """(start, exec prefix, stop) argv lists keeping one container alive for a rollout.

    Apptainer/Singularity: an instance (`instance start --containall --net --network none`,
    then `exec instance://NAME`); Docker: a detached container with no network (`run -d
    --network none ... sleep infinity`, then `exec -i -w`: the editor's request is on stdin).
    """
    kind = os.path.basename(runtime)
    if kind == "docker":
        start = [runtime, "run", "-d", "--rm", "--network", "none", "--name", name, "-w",
                 workdir, image, "sleep", "infinity"]  # fmt: skip
        return start, [runtime, "exec", "-i", "-w", workdir, name], [runtime, "kill", name]
    start = [runtime, "instance", "start", "--containall", "--writable-tmpfs", "--net",
             "--network", "none", image, name]  # fmt: skip
    exec_prefix = [runtime, "exec", "--pwd", workdir, f"instance://{name}"]
    return start, exec_prefix, [runtime, "instance", "stop", name]


class R2EGymEnvironment(Environment):
    """An R2E-Gym task (`r2egym.R2ETask`, a row of the reference's JSONL) in its container,
    kept alive for the rollout (an Apptainer/Singularity instance or a Docker container), with
    OpenHands CodeActAgent's tools, each one command run through the runtime's exec:

    - `execute_bash(command, is_input, timeout)`: OpenHands' persistent session
      (`shell.Shell`: one bash in the container for the rollout; directory, variables and
      background processes persist; a command silent for `env.no_change_timeout_s` or past
      the call's `timeout` keeps running, and `is_input` talks to it or sends C-c / C-z; the
      agent timeout bounds every call).
    - `str_replace_editor(command, path, ...)`: `r2egym.EDITOR_PROGRAM` run by the
      container's `python3`, the request on stdin (no file is copied in or out).
    - `think(thought)`: logged, answered as OpenHands answers it; `finish(message)`: ends.

    `reset` first runs R2E-Gym's setup (`r2egym.SETUP_SCRIPT`: the tests and `run_tests.sh`
    moved out of the repository to /root). The reward runs the task's `run_tests.sh` in the
    container under the test timeout and compares the tests' statuses with the expected ones
    (`r2egym.tests_pass`). The agent
    timeout (`env.agent_timeout_s`) is started at `reset`; a rollout cut by it is invalid
    (`Turn.invalid`) and its tests are not run.
    """

    def __init__(self, env: config_lib.EnvironmentConfig, *, sif_dir: str, runtime: str = "",
                 validation: bool = False, user_template: str | None = None):  # fmt: skip
        self.env = env
        self.user_template = user_template
        self.sif_dir = sif_dir
        self.runtime = runtime or find_container_runtime()
        self.test_timeout_s = env.validation_test_timeout_s if validation else env.test_timeout_s
        self.exec_prefix: list[str] | None = None
        self.stop: list[str] | None = None
        self.task: r2egym.R2ETask | None = None
        self.shell: shell_lib.Shell | None = None

    def reset(self, task: r2egym.R2ETask) -> str:
        """Starts the task's container; returns the prompt: the reference's user template
        rendered for the task (`render_user_prompt`) when the environment has it, else the issue.

        Raises:
          UserError: the container does not start (one line naming the task and why).
        """
        self.close()
        self.task = task
        if os.path.basename(self.runtime) == "docker":  # R2E-Gym's image by its name
            image = task.docker_image
        else:  # the reference's SIF of the task
            image = task_image(self.sif_dir, task.instance_id)
        name = f"mlperf-{uuid.uuid4().hex[:12]}"
        start, self.exec_prefix, stop = container_commands(self.runtime, image, name)
        try:
            done = subprocess.run(start, capture_output=True, timeout=self.env.agent_timeout_s)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise UserError(
                f"task {task.instance_id!r}: its container did not start ({e})"
            ) from None
        if done.returncode:
            why = " ".join(done.stderr.decode(errors="replace").split())[:200]
            raise UserError(f"task {task.instance_id!r}: its container did not start: {why}")
        self.stop = stop
        self.start_agent_clock(self.env.agent_timeout_s)
        code, out = self._run(["bash", "-c", r2egym.SETUP_SCRIPT], self.env.test_timeout_s)
        if code != 0:  # every step is best-effort: only a runtime that cannot exec lands here
            why = " ".join(out.split())[:200]
            self.close()
            raise UserError(
                f"task {task.instance_id!r}: its container does not run commands: {why}"
            )
        try:
            self.shell = shell_lib.Shell(
                self.exec_prefix, cwd=r2egym.REPO_PATH,
                no_change_timeout_s=self.env.no_change_timeout_s,
                side_timeout_s=self.env.tool_timeout_s,
            )  # fmt: skip
        except shell_lib.ShellError as e:
            self.close()
            raise UserError(f"task {task.instance_id!r}: {e}") from None
        if self.user_template is None:
            return task.problem_statement
        return render_user_prompt(self.user_template, task)

    def _run(self, argv: list[str], timeout_s: float, stdin: bytes = b""):
        """(returncode, output) of one exec; returncode None when cut at `timeout_s` (by the
        container's `timeout`, or by the host 5 s later: the exec client's process group is
        killed, a stand-in runtime's children too). A command that exits 124 or 137 by itself
        before the limit keeps its code."""
        wrapped = ["timeout", "--kill-after=2", f"{timeout_s:.3f}", *argv]
        began = time.monotonic()
        proc = subprocess.Popen(self.exec_prefix + wrapped, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            out, _ = proc.communicate(stdin, timeout=timeout_s + 5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            return None, out.decode(errors="replace")
        cut = proc.returncode in (124, 137) and time.monotonic() - began >= timeout_s
        return (None if cut else proc.returncode), out.decode(errors="replace")

    def _clip(self, text: str) -> str:
        limit = self.env.max_observation_chars
        if len(text) <= limit:
            return text
        half = limit // 2
        return text[:half] + "\n<response clipped>\n" + text[-half:]

    def execute_bash(self, command: str, is_input: str = "false", timeout: str = "") -> str:
        hard = float(timeout) if str(timeout).strip() else None
        if hard is not None and not hard > 0:
            raise ValueError(f"`timeout` must be a positive number of seconds, not {timeout}")
        observation = self.shell.run(
            command, is_input=str(is_input).strip().lower() == "true", timeout=hard,
            wait_s=self.time_left(self.env.agent_timeout_s),
        )  # fmt: skip
        return self._clip(observation)

    def str_replace_editor(self, command: str, path: str, file_text: str | None = None,
                           old_str: str | None = None, new_str: str | None = None,
                           insert_line: str | None = None, view_range: str | None = None) -> str:  # fmt: skip
        request = {"command": command, "path": path}
        for key, value in (("file_text", file_text), ("old_str", old_str), ("new_str", new_str)):
            if value is not None:
                request[key] = value
        if insert_line is not None:
            request["insert_line"] = int(insert_line)
        if view_range is not None:
            lo_hi = json.loads(view_range)
            if not (isinstance(lo_hi, list) and len(lo_hi) == 2):
                raise ValueError(f"`view_range` must be a list of two integers, not {view_range}")
            request["view_range"] = [int(x) for x in lo_hi]
        if command not in r2egym.EDITOR_COMMANDS:
            return (f"ERROR:\nUnrecognized command {command}. The allowed commands for the "
                    "str_replace_editor tool are: `view`, `create`, `str_replace`, `insert`, "
                    "`undo_edit`.")  # fmt: skip
        limit = self.time_left(self.env.tool_timeout_s)
        code, out = self._run(["python3", "-c", r2egym.EDITOR_PROGRAM], limit,
                              json.dumps(request).encode())  # fmt: skip
        if code is None:
            return f"ERROR:\nThe editor timed out after {limit:g} seconds."
        if code:
            return f"ERROR:\nThe editor failed (exit code {code}): {self._clip(out.strip())}"
        return self._clip(out.rstrip("\n"))

    def think(self, thought: str) -> str:
        return "Your thought has been logged."

    def tools(self):
        return {"execute_bash": self.execute_bash, "str_replace_editor": self.str_replace_editor,
                "think": self.think}  # fmt: skip

    def reward(self) -> float:
        """1.0 when the task's tests, run in the container, give the expected statuses; 0.0
        otherwise, or when the test run is cut at the test timeout. A rollout cut by the agent
        timeout is invalid (`Turn.invalid`): its tests are not run (0.0, never counted)."""
        if self.timed_out or self.exec_prefix is None:
            return 0.0
        command = f"cd {r2egym.REPO_PATH} && {self.task.test_command}"
        code, out = self._run(["bash", "-c", command], self.test_timeout_s)
        if code is None:
            return 0.0
        return 1.0 if r2egym.tests_pass(out, self.task.expected_output) else 0.0

    def close(self) -> None:
        if self.shell is not None:
            self.shell.close()
            self.shell = None
        if self.stop is not None:
            try:
                subprocess.run(self.stop, capture_output=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                pass  # a container that will not stop must not stop the run
            self.stop = None
        self.exec_prefix = None


def load_prompt_templates(gym_root: str) -> dict[str, str]:
    """The reference's system and user prompt templates from a NeMo-RL checkout (`gym_root`:
    its root), each checked against the SHA-256 the reference README gives.

    Raises:
      UserError: a template is missing or differs (one line naming it and both digests).
    """
    templates = {}
    for name, want in config_lib.PROMPT_SHA256.items():
        path = os.path.join(gym_root, config_lib.PROMPT_DIR, name)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise UserError(f"prompt template {path}: cannot read it ({e.strerror})") from None
        got = hashlib.sha256(data).hexdigest()
        if got != want:
            raise UserError(f"prompt template {path}: SHA-256 {got}, expected {want}")
        templates[name] = data.decode("utf-8")
    return templates


def render_user_prompt(template: str, task: r2egym.R2ETask) -> str:
    """The reference's user prompt for `task`: NeMo Gym's `user_prompt.j2` (a Jinja template
    of `workspace_path`, the repository's folder in the container, and `instance`, the task's
    fields: `problem_statement`, `base_commit`, ...).

    Raises:
      UserError: jinja2 is missing, or the template does not render (one line).
    """
    return _render_strictly(template, "user_prompt.j2", workspace_path=r2egym.REPO_PATH,
                            instance=dataclasses.asdict(task))  # fmt: skip


def render_system_prompt(template: str) -> str:
    """The reference's system prompt: NeMo Gym's `system_prompt.j2` (OpenHands CodeActAgent's
    role, workflow and rules), rendered with no variables (one it asks for is an error).

    Raises:
      UserError: jinja2 is missing, or the template does not render (one line).
    """
    return _render_strictly(template, "system_prompt.j2")


def _render_strictly(template: str, name: str, **variables) -> str:
    """`template` rendered strictly (an unknown variable is an error, not an empty string)."""
    try:
        import jinja2  # noqa: PLC0415 (only the reference's templates need it)
    except ImportError:
        raise UserError(
            "the reference's prompt templates need jinja2: pip install jinja2"
        ) from None
    try:
        return jinja2.Template(
            template, undefined=jinja2.StrictUndefined, keep_trailing_newline=True
        ).render(**variables)
    except jinja2.TemplateError as e:
        raise UserError(f"prompt template {name} does not render: {e}") from None
