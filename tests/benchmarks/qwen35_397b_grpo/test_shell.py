"""`shell.Shell` (OpenHands' persistent `execute_bash` session) on this machine's bash, with no
container (an empty exec prefix): the cases `test_r2egym.py` does not reach through the stand-in
runtime. Every wait is bounded (`wait_s`, the no-change timeout of 1 s)."""

import os
import time

import pytest

from benchmarks.qwen35_397b_grpo import shell as shell_lib


@pytest.fixture
def session(tmp_path):
    shell = shell_lib.Shell([], cwd=str(tmp_path), no_change_timeout_s=1.0)
    yield shell
    shell.close()


def test_keys_reach_the_command_not_the_session(session, tmp_path):
    assert "no new output" in session.run("sleep 30", wait_s=20)
    stopped = session.run("C-z", is_input=True, wait_s=20)
    assert "[Command finished with exit code 148] CTRL+Z was sent." in stopped
    assert "sleep 30" in session.run("jobs; kill %1", wait_s=20)
    # A loop of builtins runs in the session's shell itself: C-c starts a new session.
    # (in the directory the last finished command left: a `cd` inside the loop is not known)
    session.run("cd /", wait_s=20)
    assert "no new output" in session.run("while true; do :; done", wait_s=20)
    note = session.run("C-c", is_input=True, wait_s=20)
    assert (
        note == "[C-c reached no process of the command: it ran in the shell itself; a new "
        "session was started in /.]"
    )
    assert session.run("pwd", wait_s=20).startswith("/\n[Current working directory: /]")
    assert "no new output" in session.run("cat", wait_s=20)
    assert session.run("C-d", is_input=True, wait_s=20).startswith("ERROR: C-d (end of input)")
    assert "exit code 130" in session.run("C-c", is_input=True, wait_s=20)
    assert (
        session.run("C-x", is_input=True, wait_s=20) == "ERROR: No previous running command "
        "to interact with."
    )


def test_output_is_bounded_and_only_the_commands_marker_ends_it(session):
    flood = session.run("head -c 3000000 /dev/zero | tr '\\0' x; echo", wait_s=60)
    assert "bytes of output left out" in flood
    assert len(flood) < 1.1 * shell_lib.MAX_BUFFER_BYTES
    assert flood.endswith("[Command finished with exit code 0]")
    spoof = session.run("printf '\\n__MLPERF_SHELL_00__ 0 1 /nowhere\\n'; echo real", wait_s=20)
    assert "real\n" in spoof and "[Current working directory: /nowhere]" not in spoof


def test_a_session_that_cannot_start_is_an_error():
    with pytest.raises(shell_lib.ShellError, match="did not start"):
        shell_lib.Shell(["false"], cwd="/", side_timeout_s=5.0)


def test_close_ends_the_sessions_background_jobs(tmp_path):
    shell = shell_lib.Shell([], cwd=str(tmp_path), no_change_timeout_s=1.0)
    try:
        pid = int(shell.run("sleep 301 & echo $!", wait_s=20).split("\n")[0])
        os.kill(pid, 0)  # running
    finally:
        shell.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
        with open(f"/proc/{pid}/stat") as f:
            if f.read().split(") ")[-1].startswith("Z"):  # killed, not yet reaped
                break
        time.sleep(0.05)
    else:
        assert not os.path.exists(f"/proc/{pid}"), "the background job outlived its session"
