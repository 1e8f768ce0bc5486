"""Tests of the R2E-Gym environment end to end on a stand-in container runtime: an executable
`apptainer` (and `docker`) first on PATH that implements the subcommands `container_commands`
uses (instance start / exec / stop, `--version`; run / exec / kill, `info`) over a
per-instance temporary folder unpacked from the task's
"image" (a tar of `/testbed` holding a tiny repository with a bug, its tests and
`run_tests.sh`, which R2E-Gym's setup moves to `/root`), mapping the container's absolute paths into that folder.
On it: a scripted rollout with OpenHands' tools (view, str_replace, execute_bash running the
tests, finish) earns reward 1, a wrong edit 0; the editor's other commands and its errors;
a hanging command cut at the tool timeout and answered in text; the agent timeout making a
rollout invalid; a container that fails to start, a one-line error. And the reference rows'
conversion into tasks, and R2E-Gym's log parser and reward against a transcription."""

import dataclasses
import hashlib
import io
import json
import os
import sys
import tarfile
import time
import types

import pytest

from benchmarks.qwen35_397b_grpo import config, environments, prepare, r2egym
from benchmarks.qwen35_397b_grpo import input as input_lib
from mlperf_tf.errors import DataError, UserError
from mlperf_tf.rl.chat import ByteChat
from mlperf_tf.rl.generation import Generated
from mlperf_tf.rl.rollout import run_rollouts
from mlperf_tf.rl.tool_calls import format_tool_call
from tests.tiny_chat import write_chat_checkpoint

FAKE_RUNTIME = r"""#!{python}
# A stand-in for apptainer or docker (by its name): a container is a folder unpacked from the
# image (a tar); the container's /testbed and /root map into it (arguments, stdin, output).
import os, re, shutil, subprocess, sys, tarfile
STATE = os.environ["FAKE_RUNTIME_STATE"]
args = sys.argv[1:]
docker = os.path.basename(sys.argv[0]) == "docker"

def start(image, name):
    try:
        with tarfile.open(image) as t:
            t.extractall(os.path.join(STATE, name), filter="data")
    except Exception as e:
        sys.stderr.write(f"FATAL:   could not open image {image}: {e}\n")
        sys.exit(255)

def run(root, pwd, argv):
    if not os.path.isdir(root) or os.path.exists(os.path.join(root, "noexec")):
        sys.stderr.write("FATAL:   no instance found\n")
        sys.exit(255)
    paths = re.compile(r"(?<![\w.-])/(testbed|root)(?=[/\s'\"]|$)")
    into = lambda s: paths.sub(lambda m: root + "/" + m.group(1), s)
    if argv[:2] == ["sh", "-c"] and "--norc" in argv[2]:  # a session: lines in, output as it comes
        session(root, into(pwd), argv, into)
    data = into(sys.stdin.buffer.read().decode()).encode()
    done = subprocess.run([into(a) for a in argv], input=data, cwd=into(pwd),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    sys.stdout.write(done.stdout.decode().replace(root + "/", "/"))
    sys.exit(done.returncode)

def session(root, cwd, argv, into):
    import select, threading
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, cwd=cwd)
    def pump():
        for line in sys.stdin.buffer:
            proc.stdin.write(into(line.decode()).encode())
            proc.stdin.flush()
        proc.stdin.close()
    threading.Thread(target=pump, daemon=True).start()
    fd, rest, root = proc.stdout.fileno(), b"", (root + "/").encode()
    while True:  # whole lines at once; a partial line after 50 ms of silence (a prompt)
        ready = select.select([fd], [], [], 0.05)[0]
        data = os.read(fd, 65536) if ready else None
        if data == b"":
            break
        if data:
            head, sep, rest = (rest + data).rpartition(b"\n")
            chunk = head + sep
        else:
            chunk, rest = rest, b""
        sys.stdout.buffer.write(chunk.replace(root, b"/"))
        sys.stdout.buffer.flush()
    sys.stdout.buffer.write(rest.replace(root, b"/"))
    sys.stdout.buffer.flush()
    os._exit(proc.wait())  # not sys.exit: the pump thread holds stdin's lock

if args in (["--version"], ["info"]):
    print("stand-in runtime")
elif args[:2] == ["instance", "start"]:
    start(args[-2], args[-1])
elif args[:2] == ["instance", "stop"] or (docker and args[0] == "kill"):
    shutil.rmtree(os.path.join(STATE, args[-1]))
elif docker and args[0] == "run":  # run -d --rm --network none --name N -w DIR IMAGE sleep inf
    image = args[args.index("-w") + 2]
    start(os.path.join(os.environ["FAKE_DOCKER_IMAGES"], image.replace("/", "_") + ".tar"),
          args[args.index("--name") + 1])
elif docker and args[0] == "exec":  # exec -i -w DIR NAME argv...
    at = args.index("-w")
    run(os.path.join(STATE, args[at + 2]), args[at + 1], args[at + 3:])
elif args[0] == "exec":  # exec --pwd DIR instance://NAME argv...
    at = next(i for i, a in enumerate(args) if a.startswith("instance://"))
    run(os.path.join(STATE, args[at][len("instance://"):]), args[args.index("--pwd") + 1],
        args[at + 1:])
else:
    sys.stderr.write(f"stand-in runtime: unsupported {args}\n")
    sys.exit(2)
"""

BUGGY = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a + b\n"
# The hidden tests print pytest's short summary (`-rA`), which R2E-Gym's parser reads.
RUN_TESTS_PY = """import sys
sys.path.insert(0, ".")
import calc
def test_add():
    assert calc.add(2, 3) == 5
def test_sub():
    assert calc.sub(5, 3) == 2
print("=" * 20, "short test summary info", "=" * 20)
for name, test in [("test_add", test_add), ("test_sub", test_sub)]:
    try:
        test()
        print(f"PASSED r2e_tests/test_calc.py::{name}")
    except Exception as e:
        print(f"FAILED r2e_tests/test_calc.py::{name} - {type(e).__name__}")
"""
EXPECTED = {"test_add": "PASSED", "test_sub": "PASSED"}
ISSUE = "sub(5, 3) returns 8 instead of 2."


def reference_row(instance_id, expected=EXPECTED, problem=ISSUE):
    """A row in the reference's schema (NeMo-RL `create_r2e_gym_easy_subset_jsonl.py`)."""
    instance = {
        "instance_id": instance_id, "repo_name": "calc", "commit_hash": "c" * 40,
        "docker_image": f"namanjain12/calc_final:{'c' * 40}", "FAIL_TO_PASS": [],
        "PASS_TO_PASS": [], "expected_output_json": json.dumps(expected),
        "problem_statement": problem, "repo": "calc-org/calc",
    }  # fmt: skip
    meta = {
        "instance_id": instance_id, "base_commit": "b" * 40, "dataset_name": "R2E-Gym/R2E-Gym-Subset",
        "split": "train", "problem_statement": problem, "hints_text": "", "version": "",
        "created_at": "", "instance_dict": json.dumps(instance), "repo": "calc-org/calc",
    }  # fmt: skip
    return {
        "responses_create_params": {"input": [], "metadata": meta, "model": "default",
                                    "temperature": 1.0, "top_p": 1.0},
        "agent_ref": {"type": "responses_api_agents", "name": "swe_agents_train"},
    }  # fmt: skip


def _add(tar, name, text, mode=0o644):
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    """(sif_dir, the stand-in apptainer's path) with PATH and the stand-ins' folders set; the
    stand-in docker is beside it, its image of the calc task in FAKE_DOCKER_IMAGES."""
    bin_dir, state, sif_dir = tmp_path / "bin", tmp_path / "state", tmp_path / "sif"
    for folder in (bin_dir, state, sif_dir / "r2egym"):
        folder.mkdir(parents=True)
    for name in ("apptainer", "docker"):
        fake = bin_dir / name
        fake.write_text(FAKE_RUNTIME.replace("{python}", sys.executable))
        fake.chmod(0o755)
    os.symlink(sys.executable, bin_dir / "python3")  # the container's python3
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_RUNTIME_STATE", str(state))
    monkeypatch.setenv("FAKE_DOCKER_IMAGES", str(sif_dir))
    image = sif_dir / "r2egym" / "calc__calc-1.sif"
    with tarfile.open(image, "w") as tar:
        _add(tar, "testbed/calc.py", BUGGY)
        # As in R2E-Gym's images: the tests in the repository (`reset` moves them to /root).
        _add(tar, "testbed/r2e_tests/run_tests.py", RUN_TESTS_PY)
        _add(tar, "testbed/run_tests.sh", "python3 r2e_tests/run_tests.py\n", 0o755)
        _add(tar, "root/.keep", "")
    os.symlink(image, sif_dir / (_task().docker_image.replace("/", "_") + ".tar"))
    (sif_dir / "calc__broken-2.sif").write_text("not an image")
    with tarfile.open(sif_dir / "calc__noexec-4.sif", "w") as tar:
        _add(tar, "noexec", "")  # the stand-in refuses to exec in it
    return str(sif_dir), str(bin_dir / "apptainer")


def _env(runtime, **changes):
    settings = dict(kind="r2e_gym", tool_timeout_s=5.0, test_timeout_s=10.0)
    settings.update(changes)
    return environments.R2EGymEnvironment(
        config.EnvironmentConfig(**settings), sif_dir=runtime[0], runtime=runtime[1]
    )


def _edit(**arguments):
    return format_tool_call("str_replace_editor", arguments)


FIX = _edit(command="str_replace", path="/testbed/calc.py",
            old_str="def sub(a, b):\n    return a + b", new_str="def sub(a, b):\n    return a - b")  # fmt: skip
WRONG = _edit(command="str_replace", path="/testbed/calc.py",
              old_str="def sub(a, b):\n    return a + b", new_str="def sub(a, b):\n    return b - a")  # fmt: skip
TEST = format_tool_call("execute_bash", {"command": "bash /root/run_tests.sh"})
FINISH = format_tool_call("finish", {"message": "fixed sub"})


class Script:
    """A scripted policy for `run_rollouts`: rollout i's turn t is `turns[i][t]` (its task found
    by the instance id the test puts in the issue; the turn by the tool responses so far)."""

    def __init__(self, turns_by_issue, chat=None):
        self.turns = turns_by_issue
        self.chat = chat or CHAT

    def __call__(self, prompts, *, max_new_tokens, **unused):
        outs = []
        for tokens in prompts:
            text = self.chat.decode(tokens)
            turns = next(t for issue, t in self.turns.items() if issue in text)
            ids = self.chat.encode(turns[text.count("<tool_response>")])[:max_new_tokens]
            outs.append(Generated(ids, [0.0] * len(ids), "tool_call"))
        return outs


CHAT = ByteChat()


def _task(instance_id="calc__calc-1", problem=ISSUE):
    return r2egym.task_from_row(reference_row(instance_id, problem=problem))


def test_scripted_rollouts_earn_the_reward_and_a_wrong_edit_does_not(runtime):
    view = _edit(command="view", path="/testbed/calc.py")
    good, bad = _task(problem=f"[good] {ISSUE}"), _task(problem=f"[bad] {ISSUE}")
    script = Script({"[good]": [view, FIX, TEST, FINISH], "[bad]": [view, WRONG, TEST, FINISH]})
    envs = [_env(runtime), _env(runtime)]
    try:
        rollouts = run_rollouts(
            script, envs, [good, bad], chat=CHAT, max_turns=6, max_turn_tokens=400,
            max_length=20_000, temperature=1.0, top_p=1.0, seed=0,
        )  # fmt: skip
        assert [r.reward for r in rollouts] == [1.0, 0.0]
        assert [r.turns for r in rollouts] == [4, 4]
        assert not any(r.truncated or r.invalid or r.errors for r in rollouts)
        text = CHAT.decode(rollouts[0].tokens)
        assert "Here's the result of running `cat -n` on /testbed/calc.py:" in text
        assert "     6\t    return a + b" in text  # cat -n's numbering
        assert "The file /testbed/calc.py has been edited." in text
        assert "PASSED r2e_tests/test_calc.py::test_sub" in text
        assert "[Command finished with exit code 0]" in text
        assert "FAILED r2e_tests/test_calc.py::test_sub" in CHAT.decode(rollouts[1].tokens)
    finally:
        for env in envs:
            env.close()
    assert not os.listdir(os.environ["FAKE_RUNTIME_STATE"])  # every instance stopped


def test_editor_commands_and_mistakes_are_answered(runtime):
    env = _env(runtime)
    try:
        env.reset(_task())
        ls = env.act(format_tool_call("execute_bash", {"command": "ls -F /testbed /root"}))
        assert "run_tests.sh" not in ls.observation.split("/root:")[0]  # moved out by the setup
        assert "r2e_tests@" in ls.observation and "run_tests.sh*" in ls.observation
        turn = env.act(_edit(command="str_replace", path="/testbed/calc.py",
                             old_str="return a + b", new_str="x"))  # fmt: skip
        assert "Multiple occurrences of old_str `return a + b` in lines [2, 6]" in turn.observation
        turn = env.act(_edit(command="str_replace", path="/testbed/calc.py", old_str="nope"))
        assert "did not appear verbatim in /testbed/calc.py" in turn.observation
        turn = env.act(_edit(command="view", path="calc.py"))
        assert "should be an absolute path" in turn.observation
        turn = env.act(_edit(command="view", path="/testbed/missing.py"))
        assert "does not exist" in turn.observation
        turn = env.act(_edit(command="view", path="/testbed/calc.py", view_range="[5, -1]"))
        assert turn.observation.endswith(
            "     5\tdef sub(a, b):\n     6\t    return a + b\n     7\t"
        )
        turn = env.act(_edit(command="view", path="/testbed"))
        assert "/testbed/calc.py" in turn.observation and "2 levels deep" in turn.observation
        env.act(_edit(command="create", path="/testbed/new.py", file_text="x = 1\n"))
        turn = env.act(_edit(command="create", path="/testbed/new.py", file_text="y"))
        assert "File already exists" in turn.observation
        turn = env.act(_edit(command="insert", path="/testbed/new.py", insert_line="1",
                             new_str="y = 2"))  # fmt: skip
        assert "has been edited" in turn.observation
        cat = format_tool_call("execute_bash", {"command": "cat new.py"})
        assert env.act(cat).observation.startswith("x = 1\ny = 2\n")
        turn = env.act(_edit(command="undo_edit", path="/testbed/new.py"))
        assert "undone successfully" in turn.observation
        assert env.act(cat).observation.startswith("x = 1\n[Current")
        turn = env.act(_edit(command="undo_edit", path="/testbed/calc.py"))
        assert "No edit history found" in turn.observation
        turn = env.act(_edit(command="delete", path="/testbed/calc.py"))
        assert "Unrecognized command delete" in turn.observation
        turn = env.act(_edit(command="insert", path="/testbed/calc.py", insert_line="two",
                             new_str="y"))  # fmt: skip
        assert turn.errors == 1 and "ValueError" in turn.observation
        turn = env.act(_edit(path="/testbed/calc.py"))
        assert turn.errors == 1 and "bad arguments" in turn.observation
        turn = env.act(format_tool_call("think", {"thought": "the sign is wrong"}))
        assert turn.observation == "Your thought has been logged."
        turn = env.act(format_tool_call("execute_bash", {"command": "ls", "is_input": "true"}))
        assert "No previous running command" in turn.observation
        turn = env.act("<tool_call>\n<function=execute_bash>\n")
        assert turn.errors == 1 and "malformed" in turn.observation
        turn = env.act(format_tool_call("browser", {}))
        assert "unknown tool 'browser'" in turn.observation
        # The shell's working directory persists between calls (OpenHands' one session).
        env.act(format_tool_call("execute_bash", {"command": "mkdir -p sub && cd sub"}))
        turn = env.act(format_tool_call("execute_bash", {"command": "echo bye; exit 124"}))
        assert turn.observation.startswith("bye\n")
        assert "[Current working directory: /testbed/sub]" in turn.observation
        assert "[Command finished with exit code 124]" in turn.observation  # not a timeout
        assert "[The shell exited; a new session was started in /testbed/sub.]" in turn.observation
        turn = env.act(format_tool_call("execute_bash", {"command": "exit 3"}))
        assert "[Command finished with exit code 3]" in turn.observation
        assert env.reward() == 0.0  # the bug is still there
    finally:
        env.close()


def _bash(command, **arguments):
    return format_tool_call("execute_bash", {"command": command, **arguments})


def test_a_silent_command_runs_on_in_the_session_until_the_agent_interrupts_it(runtime):
    """OpenHands' session: a command silent for the no-change timeout returns while it runs
    on; a new command is then not executed; C-c (`is_input`) ends it; the session lives on,
    with its variables and background jobs; text sent with `is_input` reaches a command
    reading its input; a call's `timeout` returns at it, and an empty command waits on."""
    env = _env(runtime, no_change_timeout_s=1.0)
    try:
        env.reset(_task())
        start = time.monotonic()
        turn = env.act(_bash("export NAME=calc; echo begun; sleep 60"))
        assert time.monotonic() - start < 8
        assert turn.observation.startswith("begun\n[The command has no new output after 1 seconds.")
        assert not turn.done and not turn.invalid
        turn = env.act(_bash("echo alive"))
        assert 'Your command "echo alive" is NOT executed' in turn.observation
        turn = env.act(_bash("C-c", is_input="true"))
        assert "[Command finished with exit code 130] CTRL+C was sent." in turn.observation
        turn = env.act(_bash("sleep 30 & echo $NAME; cd r2e_tests"))
        assert turn.observation.startswith("calc\n[Current working directory: /testbed/r2e_tests]")
        turn = env.act(_bash("jobs; read -r who; echo Hello $who"))
        assert "Running" in turn.observation and "sleep 30" in turn.observation
        assert "no new output after 1 seconds" in turn.observation
        turn = env.act(_bash("John", is_input="true"))
        assert turn.observation.startswith("[Below is the output of the previous command.]\n")
        assert "Hello John\n[Current working directory: /testbed/r2e_tests]" in turn.observation
        turn = env.act(_bash("sleep 2; echo late", timeout="0.5"))
        assert "[The command timed out after 0.5 seconds." in turn.observation
        turn = env.act(_bash("", timeout="30"))  # a hard timeout: no no-change return
        assert "late\n[Current working directory" in turn.observation
        turn = env.act(_bash(""))
        assert turn.observation == "ERROR: No previous running command to retrieve logs from."
    finally:
        env.close()


def test_the_agent_timeout_makes_the_rollout_invalid(runtime):
    """An agent timeout of 1.5 s: the second 1 s wait for a silent command runs into it."""
    env = _env(runtime, no_change_timeout_s=1.0, agent_timeout_s=1.5)
    hang, wait = _bash("sleep 60"), _bash("")
    try:
        [rollout] = run_rollouts(
            Script({"[slow]": [hang, wait, wait, FINISH]}), [env],
            [_task(problem=f"[slow] {ISSUE}")], chat=CHAT, max_turns=6, max_turn_tokens=400,
            max_length=20_000, temperature=1.0, top_p=1.0, seed=0,
        )  # fmt: skip
        # Cut at the second turn (or the first, on a loaded machine): never allowed to finish.
        assert rollout.invalid and rollout.truncated and rollout.turns in (1, 2)
        assert env.timed_out and env.reward() == 0.0
    finally:
        env.close()


def test_a_container_that_fails_to_start_is_one_line(runtime):
    env = _env(runtime)
    with pytest.raises(UserError, match="'calc__broken-2': its container did not start") as info:
        env.reset(_task("calc__broken-2"))
    assert "\n" not in str(info.value) and "could not open image" in str(info.value)
    with pytest.raises(UserError, match="cannot start"):
        env.reset(_task("calc__absent-3"))
    with pytest.raises(UserError, match="'calc__noexec-4': its container does not run commands"):
        env.reset(_task("calc__noexec-4"))
    assert not os.listdir(os.environ["FAKE_RUNTIME_STATE"])  # stopped
    # The stand-in is found on PATH as the runtime (it answers `--version`).
    assert environments.find_container_runtime() == runtime[1]


def parse_log_pytest_numpy_free(log):
    """R2E-Gym's `parse_log_pytest`, transcribed for the test (r2egym/repo_analysis/
    execution_log_parser.py): statuses after the short test summary."""
    if "short test summary info" not in log:
        return {}
    out = {}
    for line in log.split("short test summary info")[1].strip().split("\n"):
        if "PASSED" in line:
            out[".".join(line.split("::")[1:])] = "PASSED"
        elif "FAILED" in line:
            out[".".join(line.split("::")[1:]).split(" - ")[0]] = "FAILED"
        elif "ERROR" in line:
            out[".".join(line.split("::")[1:]).split(" - ")[0]] = "ERROR"
    return out


def test_log_parser_and_reward_match_r2e_gym():
    log = (
        "collected 4 items\ntests/t.py::test_a PASSED\n== short test summary info ==\n"
        "PASSED tests/t.py::test_a\nFAILED tests/t.py::TestK::test_b - AssertionError: 1\n"
        "ERROR tests/t.py::test_c - ImportError\nPASSED tests/t.py::test_d[x - y]\n"
    )
    assert r2egym.parse_log_pytest(log) == parse_log_pytest_numpy_free(log)
    assert r2egym.parse_log_pytest(log)["TestK.test_b"] == "FAILED"
    assert r2egym.parse_log_pytest("no summary") == {}
    want = {"test_a": "PASSED", "TestK.test_b": "FAILED", "test_c": "ERROR", "test_d[x": "PASSED"}
    assert r2egym.tests_pass(log, want)
    assert not r2egym.tests_pass(log, {**want, "test_c": "PASSED"})
    assert not r2egym.tests_pass(log, {**want, "test_e": "PASSED"})  # a test that did not run
    colored = log.replace("PASSED tests/t.py::test_a", "\x1b[32mPASSED\x1b[0m tests/t.py::test_a")
    assert r2egym.tests_pass(colored, want)


def test_rows_convert_to_tasks():
    task = _task()
    assert task.instance_id == "calc__calc-1" and task.repo == "calc-org/calc"
    assert task.expected_output == EXPECTED and task.problem_statement == ISSUE
    assert task.test_command == "bash /root/run_tests.sh" and task.base_commit == "b" * 40
    assert r2egym.task_from_json(r2egym.task_to_json(task)) == task
    row = reference_row("x")
    del row["responses_create_params"]["metadata"]["instance_dict"]
    with pytest.raises(DataError, match="f.jsonl:3: no 'instance_dict'"):
        r2egym.task_from_row(row, "f.jsonl:3")
    with pytest.raises(DataError, match="expected_output_json"):
        r2egym.task_from_row(reference_row("x", expected={}))


def test_the_mlperf_preset_validates_on_every_prepared_row_in_order(tmp_path):
    """The reference validates on all 256 rows of its validation file (its README, section 3;
    its RCP logs' pass@4 are 256ths), not the 251 of the pinned rules' `eval_samples`."""
    ids = [f"calc__calc-{i}" for i in range(config.VAL_ROWS)]
    lines = [r2egym.task_to_json(_task(i)) for i in ids]
    (tmp_path / "val.jsonl").write_text("".join(line + "\n" for line in lines))
    cfg = dataclasses.replace(config.mlperf(), data_dir=str(tmp_path))
    held_out = input_lib._tasks(cfg, cfg.rollout.eval_tasks, 0, validation=True)
    assert [t.instance_id for t in held_out] == ids
    assert cfg.eval_examples == cfg.rollout.eval_tasks == config.VAL_ROWS == 256


def test_prepare_writes_the_tasks_in_order(tmp_path):
    specs = []
    for index, name in enumerate(("t.jsonl", "v.jsonl")):
        data = "".join(json.dumps(reference_row(f"{name}-{i}")) + "\n" for i in range(4))
        (tmp_path / name).write_bytes(data.encode())
        specs.append((name, hashlib.sha256(data.encode()).hexdigest(), 4, len(data.encode()),
                      f"out{index}.jsonl"))  # fmt: skip
    prepare.prepare(str(tmp_path), str(tmp_path / "out"), files=specs)
    lines = (tmp_path / "out" / "out0.jsonl").read_text().splitlines()
    assert [r2egym.task_from_json(x).instance_id for x in lines] == [
        f"t.jsonl-{i}" for i in range(4)
    ]


def test_the_user_template_is_rendered_for_the_task(runtime):
    # The variables NeMo Gym's openhands/user_prompt.j2 uses (this is not its text).
    template = (
        "<uploaded_files>\n{{ workspace_path }}\n</uploaded_files>\n"
        "{% set language = instance.repo_language | default('') %}[{{ language }}]\n"
        "{{ instance.problem_statement }}\n"
        "{% if instance.base_commit %}base {{ instance.base_commit }}{% endif %}\n"
    )
    task = _task()
    want = f"<uploaded_files>\n/testbed\n</uploaded_files>\n[]\n{ISSUE}\nbase {'b' * 40}\n"
    assert environments.render_user_prompt(template, task) == want
    env = environments.R2EGymEnvironment(
        config.EnvironmentConfig(kind="r2e_gym"), sif_dir=runtime[0], runtime=runtime[1],
        user_template=template,
    )  # fmt: skip
    try:
        assert env.reset(task) == want
    finally:
        env.close()
    with pytest.raises(UserError, match="does not render: 'dict object' has no attribute"):
        environments.render_user_prompt("{{ instance.hints }}", task)
    # The system template takes no variables: one it asks for is a one-line error.
    assert environments.render_system_prompt("You are OpenHands.\n") == "You are OpenHands.\n"
    with pytest.raises(UserError, match="^prompt template system_prompt.j2 does not render: 'x'"):
        environments.render_system_prompt("{{ x }}")


def test_the_same_rollout_through_docker(runtime):
    """Docker runs R2E-Gym's image by its name (`docker_image`), `exec -i -w`."""
    env = environments.R2EGymEnvironment(
        config.EnvironmentConfig(kind="r2e_gym", tool_timeout_s=5.0, test_timeout_s=10.0),
        sif_dir="/nonexistent", runtime=os.path.join(os.path.dirname(runtime[1]), "docker"),
    )  # fmt: skip
    try:
        env.reset(_task())
        for turn in (FIX, TEST):
            assert not env.act(turn).errors
        assert env.act(FINISH).done and env.reward() == 1.0
    finally:
        env.close()
    assert not os.listdir(os.environ["FAKE_RUNTIME_STATE"])


def test_the_input_pipeline_runs_prepared_tasks_with_the_reference_templates(
    runtime, tmp_path, monkeypatch
):
    """`input`'s R2E-Gym path: the tasks `prepare` wrote (in order), environments on the runtime
    found once, the user prompt rendered from the templates of a NeMo Gym checkout checked by
    their SHA-256 (the test's own templates, their digests put in the config's table)."""
    gym = tmp_path / "gym"
    prompts = gym / config.PROMPT_DIR
    prompts.mkdir(parents=True)
    texts = {"user_prompt.j2": "Repository: {{ workspace_path }}\n{{ instance.problem_statement }}",
             "system_prompt.j2": "You are a software agent.\n"}  # fmt: skip
    for name, text in texts.items():
        (prompts / name).write_text(text)
        monkeypatch.setitem(config.PROMPT_SHA256, name, hashlib.sha256(text.encode()).hexdigest())
    data = tmp_path / "data"
    data.mkdir()
    tasks = [_task(problem=f"[good] {ISSUE}"), _task(problem=f"[bad] {ISSUE}")]
    (data / "train.jsonl").write_text("".join(r2egym.task_to_json(t) + "\n" for t in tasks))
    env = config.EnvironmentConfig(kind="r2e_gym", image_dir=runtime[0], gym_root=str(gym),
                                   tool_timeout_s=5.0, test_timeout_s=10.0)  # fmt: skip
    settings = types.SimpleNamespace(env=env, data_dir=str(data))
    view = _edit(command="view", path="/testbed/calc.py")
    script = Script({"[good]": [view, FIX, TEST, FINISH], "[bad]": [view, WRONG, TEST, FINISH]})
    chosen = input_lib._tasks(settings, 2, seed=0)
    assert [t.problem_statement for t in chosen] == [t.problem_statement for t in tasks]
    envs = input_lib._environments(settings, 2, validation=False)
    try:
        rollouts = run_rollouts(
            script, envs, chosen, chat=CHAT, max_turns=6, max_turn_tokens=400,
            max_length=20_000, temperature=1.0, top_p=1.0, seed=0,
        )  # fmt: skip
    finally:
        for e in envs:
            e.close()
    assert [r.reward for r in rollouts] == [1.0, 0.0]
    assert f"Repository: /testbed\n[good] {ISSUE}" in CHAT.decode(rollouts[0].tokens)
    with pytest.raises(UserError, match="cannot read the prepared R2E-Gym tasks"):
        input_lib._tasks(settings, 1, seed=0, validation=True)  # no val.jsonl
    with pytest.raises(UserError, match="2 tasks, the run needs 3"):
        input_lib._tasks(settings, 3, seed=0)
    no_gym = types.SimpleNamespace(env=config.EnvironmentConfig(kind="r2e_gym"), data_dir="")
    with pytest.raises(UserError, match="env.gym_root"):
        input_lib._environments(no_gym, 1, validation=False)

    # A real checkpoint's chat (a model vocabulary above the byte chat's): its tokenizer and
    # template, the reference's system prompt and OpenHands' tools in the first turn, the
    # tools' answers as tool messages; the same rewards.
    folder = str(tmp_path / "checkpoint")
    write_chat_checkpoint(folder)
    settings.init_checkpoint = folder
    settings.model = types.SimpleNamespace(vocab_size=config.SMOKE_VOCAB_SIZE + 1)
    with pytest.raises(
        UserError, match=r"tokenizer has 304 ids, more than the model's vocabulary \(261\)$"
    ):
        input_lib.make_chat(settings)
    settings.model.vocab_size = 512
    chat = input_lib.make_chat(settings)
    envs = input_lib._environments(settings, 2, validation=False)
    try:
        rollouts = run_rollouts(
            Script(script.turns, chat), envs, chosen, chat=chat, max_turns=6,
            max_turn_tokens=400, max_length=20_000, temperature=1.0, top_p=1.0, seed=0,
        )  # fmt: skip
    finally:
        for e in envs:
            e.close()
    assert [r.reward for r in rollouts] == [1.0, 0.0]
    text = chat.decode(rollouts[0].tokens)
    assert text.startswith("system\nYou are a software agent.\n\n\n# Tools\n<tools>\n")
    assert [json.loads(line)["function"]["name"] for line in text.split("<tools>\n")[1]
            .split("\n</tools>")[0].splitlines()] == [t["function"]["name"] for t in r2egym.TOOL_SCHEMAS]  # fmt: skip
    assert f"user\nRepository: /testbed\n[good] {ISSUE}\nassistant\n<think>\n\n</think>\n\n" in text
    assert text.count("<tool_response>") == 3
