"""Tests of `mlperf_tf.rl.sandbox.Sandbox`: a private copy, the wall-clock limit killing the
command's whole process group, the CPU-time and memory limits, no network under `unshare -n`,
paths kept inside the copy, long output cut, and a missing program as an observation."""

import os
import socket
import sys
import time

import pytest

from mlperf_tf.rl.sandbox import Sandbox, can_unshare_network


def test_each_sandbox_is_a_private_copy(tmp_path):
    (tmp_path / "a.txt").write_text("original")
    with Sandbox(str(tmp_path)) as one, Sandbox(str(tmp_path)) as two:
        with open(one.path("a.txt"), "w") as f:
            f.write("edited")
        assert open(two.path("a.txt")).read() == "original"
        assert (tmp_path / "a.txt").read_text() == "original"
        root = one.root
    assert not os.path.exists(root)


def test_timeout_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    with Sandbox(timeout_s=1.5) as box:
        start = time.monotonic()
        result = box.run([sys.executable, "-c", script])
        assert time.monotonic() - start < 10
    assert result.timed_out and result.returncode is None
    assert "timed out" in result.observation()
    child = int(pidfile.read_text())
    time.sleep(0.2)
    assert not _alive(child)  # the grandchild died with the group


def _alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie (dead, not yet reaped by its new parent)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_cpu_and_memory_limits():
    with Sandbox(timeout_s=30, cpu_s=1, memory_mb=200) as box:
        spin = box.run([sys.executable, "-c", "while True: pass"])
        assert not spin.timed_out and spin.returncode != 0  # SIGXCPU/SIGKILL at 1 s of CPU
        hog = box.run([sys.executable, "-c", "x = bytearray(500 * 2**20)"])
        assert hog.returncode != 0 and "MemoryError" in hog.output


@pytest.mark.skipif(not can_unshare_network(), reason="unshare -n does not work here")
def test_no_network_under_unshare():
    # A server on this machine's loopback is unreachable from the new namespace.
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)"
    try:
        with Sandbox() as box:
            assert box.network_isolated
            result = box.run([sys.executable, "-c", code])
        assert result.returncode != 0, result.output
        with Sandbox(isolate_network=False) as box:
            assert box.run([sys.executable, "-c", code]).returncode == 0
    finally:
        server.close()


def test_paths_stay_inside_and_failures_are_observations():
    with Sandbox(max_output_chars=100) as box:
        with pytest.raises(ValueError, match="outside"):
            box.path("../../etc/passwd")
        flood = box.run([sys.executable, "-c", "print('x' * 10000)"])
        assert len(flood.output) < 200 and "cut" in flood.output
        missing = box.run(["/no/such/program"])
        assert missing.returncode == 127 and "/no/such/program" in missing.output
