"""Tests of the benchmark's environments: generated repair tasks (deterministic, the bug exposed
by the tests), the expert trajectory earning reward 1 and doing nothing 0, malformed / unknown /
crashing / hanging tool calls answered as observations, the tests restored before the reward,
and the R2E-Gym side: runtime discovery's one-line error, the container commands, the task image
lookup and the prompt templates' SHA-256 check."""

import hashlib
import os

import pytest

from benchmarks.qwen35_397b_grpo import config, environments, tasks
from mlperf_tf.errors import UserError
from mlperf_tf.rl.tool_calls import format_tool_call

ENV = config.EnvironmentConfig(kind="repair", tool_timeout_s=5.0, test_timeout_s=10.0)


def test_tasks_are_deterministic_and_distinct():
    a, b = tasks.make_tasks(40, seed=1), tasks.make_tasks(40, seed=1)
    assert a == b
    held_out = tasks.make_tasks(40, seed=2)
    assert len({t.files[tasks.SOLUTION] + t.files[tasks.TESTS] for t in a + held_out}) > 60
    assert all(t.buggy_line in t.files[tasks.SOLUTION] for t in a)


def _brute_force_edit(before, after):
    """Every substring of `before` tried by length, then by start: the shortest unique one whose
    replacement gives `after` (a span covering the change), within one line if any is."""
    for newline_ok in (False, True):
        for length in range(1, len(before) + 1):
            for i in range(len(before) - length + 1):
                old = before[i : i + length]
                if before.count(old) != 1 or (not newline_ok and "\n" in old):
                    continue
                prefix, suffix = before[:i], before[i + length :]
                if after.startswith(prefix) and after.endswith(suffix):
                    new = after[len(prefix) : len(after) - len(suffix)]
                    if len(prefix) + len(suffix) <= len(after):
                        return old, new
    return None


def test_the_expert_edit_is_the_shortest_unique_substring_around_the_bug():
    for task in tasks.make_tasks(60, seed=7):
        bad = task.files[tasks.SOLUTION]
        good = bad.replace(task.buggy_line, task.fixed_line, 1)
        old, new = task.edit()
        assert bad.count(old) == 1 and bad.replace(old, new, 1) == good
        assert len(old) == len(_brute_force_edit(bad, good)[0]), (old, new)
        assert len(old) <= 4  # a few bytes, not a line
    assert tasks.shortest_unique_edit("ab ab+", "ab ab-") == ("+", "-")
    assert tasks.shortest_unique_edit("x = 1\nx = 1\n", "x = 1\nx = 2\n") == ("\nx = 1", "\nx = 2")
    with pytest.raises(ValueError):
        tasks.shortest_unique_edit("same", "same")


def _play(env, task, turns):
    env.reset(task)
    answers = []
    for turn in turns:
        answer = env.act(turn)
        answers.append(answer)
        if answer.done:
            break
    return answers, env.reward()


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_expert_trajectory_earns_the_reward_and_doing_nothing_does_not(seed):
    task = tasks.make_task(seed)
    env = environments.RepairEnvironment(ENV)
    try:
        answers, reward = _play(env, task, tasks.expert_turns(task))
        assert reward == 1.0
        assert answers[-1].done and "passed" in answers[2].observation
        assert "[exit code 0]" in answers[2].observation
        _, reward = _play(env, task, [format_tool_call("finish", {})])
        assert reward == 0.0  # the injected bug fails the tests
    finally:
        env.close()


def test_agent_mistakes_are_observations():
    task = tasks.make_task(6)
    quick = config.EnvironmentConfig(kind="repair", tool_timeout_s=1.0, test_timeout_s=1.5)
    env = environments.RepairEnvironment(quick)
    try:
        env.reset(task)
        turn = env.act("<tool_call>\n<function=view>\n")
        assert not turn.done and turn.errors == 1 and "malformed" in turn.observation
        turn = env.act(format_tool_call("rm_rf", {}))
        assert "unknown tool" in turn.observation and turn.errors == 1
        turn = env.act(format_tool_call("view", {"path": "missing.py"}))
        assert "FileNotFoundError" in turn.observation
        turn = env.act(format_tool_call("view", {"nope": "x"}))
        assert "bad arguments" in turn.observation
        turn = env.act(format_tool_call("view", {"path": "../../../etc/passwd"}))
        assert "outside" in turn.observation
        # A solution that hangs at import: the test run is killed at the tool timeout.
        hang = "import time\ntime.sleep(60)\n" + task.files[tasks.SOLUTION]
        with open(env.sandbox.path(tasks.SOLUTION), "w") as f:
            f.write(hang)
        turn = env.act(format_tool_call("run_tests", {}))
        assert "timed out" in turn.observation
        assert env.reward() == 0.0
    finally:
        env.close()


def test_edited_tests_do_not_count():
    task = tasks.make_task(7)
    env = environments.RepairEnvironment(ENV)
    try:
        env.reset(task)
        turn = env.act(format_tool_call("str_replace", {"path": tasks.TESTS, "old_str": "assert",
                                                        "new_str": "pass  #"}))  # fmt: skip
        assert "must not be edited" in turn.observation
        with open(env.sandbox.path(tasks.TESTS), "w") as f:  # behind the tools' back
            f.write("def test_nothing():\n    pass\n")
        assert env.reward() == 0.0
    finally:
        env.close()


def test_no_container_runtime_is_one_line():
    with pytest.raises(UserError, match="container runtime") as info:
        environments.find_container_runtime(which=lambda name: None)
    assert "\n" not in str(info.value)
    # A docker client without its daemon does not count.
    with pytest.raises(UserError, match="does not answer"):
        environments.find_container_runtime(
            which=lambda name: "/usr/bin/docker" if name == "docker" else None,
            probe=lambda name, exe: False,
        )
    found = environments.find_container_runtime(
        which=lambda name: f"/opt/{name}", probe=lambda name, exe: name == "singularity"
    )
    assert found == "/opt/singularity"


def test_container_commands():
    start, exec_prefix, stop = environments.container_commands(
        "/usr/bin/apptainer", "/sif/t.sif", "job1"
    )
    assert start[:3] == ["/usr/bin/apptainer", "instance", "start"]
    assert "--containall" in start and start[-2:] == ["/sif/t.sif", "job1"]
    assert exec_prefix[-1] == "instance://job1" and stop[-2:] == ["stop", "job1"]
    start, exec_prefix, stop = environments.container_commands("/bin/docker", "img:1", "job2")
    assert start[start.index("--network") + 1] == "none" and "img:1" in start
    assert exec_prefix == [
        "/bin/docker",
        "exec",
        "-i",
        "-w",
        "/testbed",
        "job2",
    ]  # stdin: the editor


def test_task_image_layouts(tmp_path):
    (tmp_path / "r2egym").mkdir()
    (tmp_path / "r2egym" / "a.sif").write_text("")
    (tmp_path / "b.sif").write_text("")
    assert environments.task_image(str(tmp_path), "a").endswith("r2egym/a.sif")
    assert environments.task_image(str(tmp_path), "b").endswith("b.sif")
    with pytest.raises(UserError, match="cannot start"):
        environments.task_image(str(tmp_path), "c")


def test_prompt_templates_are_checked(tmp_path, monkeypatch):
    folder = tmp_path / config.PROMPT_DIR
    folder.mkdir(parents=True)
    for name in config.PROMPT_SHA256:
        (folder / name).write_text(f"template {name}")
    with pytest.raises(UserError, match="SHA-256"):
        environments.load_prompt_templates(str(tmp_path))
    digests = {
        name: hashlib.sha256(f"template {name}".encode()).hexdigest()
        for name in config.PROMPT_SHA256
    }
    monkeypatch.setattr(config, "PROMPT_SHA256", digests)
    templates = environments.load_prompt_templates(str(tmp_path))
    assert templates["user_prompt.j2"] == "template user_prompt.j2"
    os.remove(folder / "user_prompt.j2")
    with pytest.raises(UserError, match="cannot read"):
        environments.load_prompt_templates(str(tmp_path))
