"""Provides what the R2E-Gym tasks are as the reference runs them: `task_from_row`, a row of the
reference's JSONL as the task `environments.R2EGymEnvironment` takes; `TOOL_SCHEMAS`, OpenHands'
CodeActAgent tools as OpenHands declares them; `EDITOR_PROGRAM`, its `str_replace_editor` as a
small program run inside the task's container; and the reward, R2E-Gym's (`parse_log_pytest`,
`tests_pass`): the task's tests run in its container, their statuses equal to the expected ones.

Sources (read, not copied):
  - rows: NeMo-RL `tools/create_r2e_gym_easy_subset_jsonl.py` (`convert_row`: each row is
    `{"responses_create_params": {"metadata": {"instance_id", "problem_statement",
    "base_commit", "repo", "instance_dict" (a JSON string: R2E-Gym-Subset's columns
    `repo_name`, `docker_image`, `commit_hash`, `expected_output_json`, ... and SWE-bench's
    `FAIL_TO_PASS` / `PASS_TO_PASS`, empty for R2E-Gym)}}, "agent_ref": ...}`);
  - tools: OpenHands `openhands/agenthub/codeact_agent/tools/{bash,str_replace_editor,finish,
    think}.py` (names, parameters); the editor's answers follow openhands-aci's editor;
  - reward: R2E-Gym's runtime `_calculate_reward_r2e` (run `bash /root/run_tests.sh` in
    `/testbed`, parse the pytest log, compare every test's status with `expected_output_json`,
    keys cut at " - ") and its `parse_log_pytest`.
"""

from __future__ import annotations

import dataclasses
import json
import re

from mlperf_tf.errors import DataError

REPO_PATH = "/testbed"  # where an R2E-Gym image holds the repository
ALT_PATH = "/root"  # where its `run_tests.sh` (and the hidden tests) live
TEST_COMMAND = f"bash {ALT_PATH}/run_tests.sh"
# R2E-Gym's runtime `setup_env` for its images, each step best-effort (`|| true`): the repo's
# virtualenv linked where its tools look, stale bytecode removed, `run_tests.sh` and the tests
# moved out of the repository to `/root` (the tests linked back as `r2e_tests`). Its `uv pip
# install chardet` is left out (no network in the container; R2E-Gym's newer images have it).
SETUP_STEPS = (
    f"ln -s {REPO_PATH}/.venv {ALT_PATH}/.venv",
    f"mkdir -p {ALT_PATH}/.local/bin",
    f"ln -s {REPO_PATH}/.venv/bin/python {ALT_PATH}/.local/bin/python",
    f"ln -s {REPO_PATH}/.venv/bin/python {ALT_PATH}/.local/bin/python3",
    f"find {REPO_PATH}/.venv/bin -type f -executable -exec ln -sf {{}} {ALT_PATH}/.local/bin/ \\;",
    "find . -name '*.pyc' -delete",
    "find . -name '__pycache__' -exec rm -rf {} +",
    "find /r2e_tests -name '*.pyc' -delete",
    "find /r2e_tests -name '__pycache__' -exec rm -rf {} +",
    f"mv {REPO_PATH}/run_tests.sh {ALT_PATH}/run_tests.sh",
    f"mv {REPO_PATH}/r2e_tests {ALT_PATH}/r2e_tests",
    f"mv /r2e_tests {ALT_PATH}/r2e_tests",
    f"ln -s {ALT_PATH}/r2e_tests {REPO_PATH}/r2e_tests",
)
SETUP_SCRIPT = "\n".join(f"{step} >/dev/null 2>&1 || true" for step in SETUP_STEPS)

EDITOR_COMMANDS = ("view", "create", "str_replace", "insert", "undo_edit")


# OpenHands CodeActAgent's tools (`diversify_tool_names: false` in the reference's Gym config:
# these exact names), as OpenAI function schemas: what the chat template renders into the first
# turn (`TOOL_SCHEMAS`). Names, parameters, types and required ones as OpenHands declares them;
# the descriptions are this suite's own short ones (OpenHands' long texts are not copied), and
# `security_risk`-style fields the reference's agent does not use are left out.
def _tool(name: str, description: str, required: tuple, **properties) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": list(required)},
    }}  # fmt: skip


def _param(kind: str, description: str, **more) -> dict:
    return {"type": kind, "description": description, **more}


TOOL_SCHEMAS = (
    _tool("execute_bash", "Run a bash command in the task's persistent shell.", ("command",),
          command=_param("string", "The command; empty to read more output of a running one."),
          is_input=_param("string", "'true' to send the command as input to the running one "
                          "(C-c, C-z, C-d are keys).", enum=["true", "false"]),
          timeout=_param("number", "Seconds before a hard stop (default: none).")),
    _tool("str_replace_editor", "View, create and edit files.", ("command", "path"),
          command=_param("string", "The operation.", enum=list(EDITOR_COMMANDS)),
          path=_param("string", "An absolute path."),
          file_text=_param("string", "`create`: the file's text."),
          old_str=_param("string", "`str_replace`: the exact text to replace, once in the file."),
          new_str=_param("string", "`str_replace`, `insert`: the new text."),
          insert_line=_param("integer", "`insert`: the line after which to insert."),
          view_range=_param("array", "`view`: [first, last] line.", items={"type": "integer"})),
    _tool("think", "Think before acting; changes nothing.", ("thought",),
          thought=_param("string", "The thought.")),
    _tool("finish", "End the task.", ("message",),
          message=_param("string", "A summary of what was done.")),
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class R2ETask:
    """One R2E-Gym task: what the environment needs to start, prompt and score it.

    Attributes:
      instance_id: `<owner>__<repo>-<commit>`; the SIF image is `<instance_id>.sif`.
      docker_image: R2E-Gym's image name (the SIF's source).
      repo: `owner/name`; repo_name: R2E-Gym's short name (which log parser).
      problem_statement: the issue the agent is given.
      base_commit: the commit the repository is at.
      expected_output: test name -> status ("PASSED", "FAILED", ...) of the fixed repository.
      fail_to_pass, pass_to_pass: SWE-bench's lists (empty for R2E-Gym: `expected_output`
        defines the reward).
      test_command: what the reward runs in `REPO_PATH`.
    """

    instance_id: str
    docker_image: str
    repo: str
    repo_name: str
    problem_statement: str
    base_commit: str
    expected_output: dict
    fail_to_pass: tuple = ()
    pass_to_pass: tuple = ()
    test_command: str = TEST_COMMAND


def task_from_row(row: dict, where: str = "row") -> R2ETask:
    """The task of one reference JSONL row (`where` names it in errors: `file:line`).

    Raises:
      DataError: a field is missing or not of its type (one line naming it and `where`).
    """
    try:
        meta = row["responses_create_params"]["metadata"]
        instance = meta["instance_dict"]
        instance = json.loads(instance) if isinstance(instance, str) else instance
        expected = instance["expected_output_json"]
        expected = json.loads(expected) if isinstance(expected, str) else expected
        task = R2ETask(
            instance_id=meta["instance_id"], docker_image=instance["docker_image"],
            repo=meta.get("repo", instance.get("repo", "")), repo_name=instance["repo_name"],
            problem_statement=meta["problem_statement"],
            base_commit=meta.get("base_commit") or "", expected_output=expected,
            fail_to_pass=tuple(instance.get("FAIL_TO_PASS", ())),
            pass_to_pass=tuple(instance.get("PASS_TO_PASS", ())),
        )  # fmt: skip
    except KeyError as e:
        raise DataError(f"{where}: no {e.args[0]!r} (not a reference R2E-Gym row)") from None
    except (TypeError, json.JSONDecodeError) as e:
        raise DataError(f"{where}: not a reference R2E-Gym row ({e})") from None
    if not isinstance(expected, dict) or not expected:
        raise DataError(f"{where}: `expected_output_json` is not a non-empty object")
    if instance.get("instance_id", task.instance_id) != task.instance_id:
        raise DataError(f"{where}: instance_dict's instance_id differs from the metadata's")
    return task


def task_to_json(task: R2ETask) -> str:
    return json.dumps(dataclasses.asdict(task), sort_keys=True)


def task_from_json(line: str) -> R2ETask:
    fields = json.loads(line)
    for name in ("fail_to_pass", "pass_to_pass"):
        fields[name] = tuple(fields[name])
    return R2ETask(**fields)


# ---- The reward ------------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_log_pytest(log: str) -> dict[str, str]:
    """Test name -> status from a pytest log's short test summary (`-rA`), as R2E-Gym's parser
    reads it: the name is the part after the file (`::` joined by "."), a failure's message
    (after " - ") cut; nothing before "short test summary info" counts."""
    if "short test summary info" not in log:
        return {}
    statuses = {}
    for line in log.split("short test summary info", 1)[1].strip().split("\n"):
        for status in ("PASSED", "FAILED", "ERROR"):
            if status in line:
                name = ".".join(line.split("::")[1:])
                statuses[name if status == "PASSED" else name.split(" - ")[0]] = status
                break
    return statuses


def tests_pass(log: str, expected: dict) -> bool:
    """R2E-Gym's reward: the log's tests are exactly the expected ones, each with its status
    (names without color codes, cut at " - ")."""

    def clean(statuses):
        return {_ANSI.sub("", k).split(" - ")[0]: v for k, v in statuses.items()}

    got, want = clean(parse_log_pytest(_ANSI.sub("", log))), clean(expected)
    if len(got) != len(want):
        return False
    return all(want.get(name) == status for name, status in got.items() if name)


# ---- OpenHands' file editor, run inside the container ------------------------------------------

# Read by `python3 -c` inside the container; the request is one JSON object on stdin
# ({"command", "path", ...}); prints the observation. The previous contents of each edited file
# are kept under /tmp/.mlperf_editor (`undo_edit`), in the container, as OpenHands' editor keeps
# its history in the runtime. Messages follow openhands-aci's editor.
EDITOR_PROGRAM = r"""
import hashlib, json, os, subprocess, sys
req = json.load(sys.stdin)
cmd, path = req["command"], req["path"]
HIST = os.path.join("/tmp/.mlperf_editor", hashlib.sha1(path.encode()).hexdigest())

def numbered(text, start=1):
    return "\n".join(f"{i:6}\t{line}" for i, line in enumerate(text.split("\n"), start))

def snippet(text, line, context=4):
    lines = text.split("\n")
    lo = max(0, line - context)
    return numbered("\n".join(lines[lo:line + context + 1]), lo + 1)

def save_history(old):
    os.makedirs(HIST, exist_ok=True)
    with open(os.path.join(HIST, str(len(os.listdir(HIST)))), "w") as f:
        f.write(old)

def main():
    if not path.startswith("/"):
        return (f"ERROR:\nInvalid `path` parameter: {path}. The path should be an absolute path, "
                "starting with `/`.")
    if cmd == "create":
        if os.path.exists(path):
            return (f"ERROR:\nInvalid `path` parameter: {path}. File already exists at: {path}. "
                    "Cannot overwrite files using command `create`.")
        if "file_text" not in req:
            return "ERROR:\nParameter `file_text` is required for command: create."
        os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
        with open(path, "w") as f:
            f.write(req["file_text"])
        save_history("")
        return f"File created successfully at: {path}"
    if not os.path.exists(path):
        return (f"ERROR:\nInvalid `path` parameter: {path}. The path {path} does not exist. "
                "Please provide a valid path.")
    if os.path.isdir(path):
        if cmd != "view":
            return (f"ERROR:\nInvalid `path` parameter: {path}. The path {path} is a directory "
                    f"and only the `view` command can be used on directories.")
        out = subprocess.run(["find", path, "-maxdepth", "2", "-not", "-path", "*/.*"],
                             capture_output=True, text=True).stdout
        return (f"Here's the files and directories up to 2 levels deep in {path}, excluding "
                f"hidden items:\n{out}")
    with open(path) as f:
        text = f.read()
    if cmd == "view":
        rng = req.get("view_range")
        if rng:
            lines = text.split("\n")
            lo, hi = int(rng[0]), int(rng[1])
            if lo < 1 or lo > len(lines) or (hi != -1 and hi < lo):
                return (f"ERROR:\nInvalid `view_range` parameter: {rng}. It should be within the "
                        f"range of lines of the file: [1, {len(lines)}].")
            hi = len(lines) if hi == -1 else min(hi, len(lines))
            return (f"Here's the result of running `cat -n` on {path}:\n"
                    + numbered("\n".join(lines[lo - 1:hi]), lo))
        return f"Here's the result of running `cat -n` on {path}:\n" + numbered(text)
    if cmd == "str_replace":
        old, new = req.get("old_str"), req.get("new_str") or ""
        if old is None:
            return "ERROR:\nParameter `old_str` is required for command: str_replace."
        count = text.count(old)
        if count == 0:
            return (f"ERROR:\nNo replacement was performed, old_str `{old}` did not appear "
                    f"verbatim in {path}.")
        if count > 1:
            lines = [i + 1 for i, line in enumerate(text.split("\n")) if old in line]
            return (f"ERROR:\nNo replacement was performed. Multiple occurrences of old_str "
                    f"`{old}` in lines {lines}. Please ensure it is unique.")
        save_history(text)
        at = text.split(old)[0].count("\n")
        text = text.replace(old, new, 1)
        with open(path, "w") as f:
            f.write(text)
        return (f"The file {path} has been edited. Here's the result of running `cat -n` on a "
                f"snippet of {path}:\n{snippet(text, at + new.count(chr(10)))}\nReview the "
                "changes and make sure they are as expected. Edit the file again if necessary.")
    if cmd == "insert":
        if "new_str" not in req or "insert_line" not in req:
            return "ERROR:\nParameters `insert_line` and `new_str` are required for command: insert."
        lines = text.split("\n")
        line = int(req["insert_line"])
        if line < 0 or line > len(lines):
            return (f"ERROR:\nInvalid `insert_line` parameter: {line}. It should be within the "
                    f"range of lines of the file: [0, {len(lines)}]")
        save_history(text)
        text = "\n".join(lines[:line] + req["new_str"].split("\n") + lines[line:])
        with open(path, "w") as f:
            f.write(text)
        return (f"The file {path} has been edited. Here's the result of running `cat -n` on a "
                f"snippet of the edited file:\n{snippet(text, line)}\nReview the changes and "
                "make sure they are as expected (correct indentation, no duplicate lines, etc). "
                "Edit the file again if necessary.")
    if cmd == "undo_edit":
        saved = sorted(os.listdir(HIST), key=int) if os.path.isdir(HIST) else []
        if not saved:
            return f"ERROR:\nNo edit history found for {path}."
        last = os.path.join(HIST, saved[-1])
        with open(last) as f:
            old = f.read()
        os.remove(last)
        with open(path, "w") as f:
            f.write(old)
        return (f"Last edit to {path} undone successfully. Here's the result of running "
                f"`cat -n` on {path}:\n" + numbered(old))
    return (f"ERROR:\nUnrecognized command {cmd}. The allowed commands for the "
            "str_replace_editor tool are: `view`, `create`, `str_replace`, `insert`, `undo_edit`.")

print(main())
"""
