"""Provides helpers for tests that start processes: free ports, bounded waits, cleanup by pid, a
deadline on a call in this process and a snapshot of a folder tree."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports on 127.0.0.1 that were free a moment ago."""
    sockets, ports = [], []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
        ports.append(s.getsockname()[1])
    for s in sockets:
        s.close()
    return ports


def python_env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra)
    return env


def start(args: list[str], log_path: str, **env) -> subprocess.Popen:
    """Starts `python args...` in the repo with its output in `log_path`."""
    log = open(log_path, "w")  # noqa: SIM115 (closed with the process by the caller's cleanup)
    return subprocess.Popen(
        [sys.executable, *args], cwd=REPO_ROOT, env=python_env(**env), stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def wait(process: subprocess.Popen, timeout_s: float, log_path: str) -> int:
    """Waits at most `timeout_s` for `process`; on timeout kills it and fails with its output."""
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill(process)
        with open(log_path, encoding="utf-8", errors="replace") as f:
            tail = f.read()[-3000:]
        raise AssertionError(
            f"process {process.args} timed out after {timeout_s}s:\n{tail}"
        ) from None


def kill(process: subprocess.Popen) -> None:
    """SIGKILLs the process group started by `start` (children too); safe to call twice."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


def run(args: list[str], log_path: str, timeout_s: float, **env) -> tuple[int, str]:
    """Runs `python args...` to its end (at most `timeout_s`; its process group killed by pid
    in any case): (exit code, output)."""
    proc = start(args, log_path, **env)
    try:
        code = wait(proc, timeout_s, log_path)
    finally:
        kill(proc)
    with open(log_path, encoding="utf-8", errors="replace") as f:
        return code, f.read()


def run_ok(args: list[str], log_path: str, timeout_s: float, **env) -> str:
    """`run`, failing with the output's tail unless the exit code is 0; the output."""
    code, text = run(args, log_path, timeout_s, **env)
    assert code == 0, text[-3000:]
    return text


def run_worker_processes(
    worker_args, tmp_path, timeout_s: float, count: int = 2
) -> list[tuple[int, str]]:
    """Runs `count` MultiWorkerMirroredStrategy workers on 127.0.0.1 (TF_CONFIG on free ports):
    `python worker_args(index)...` each, output in `tmp_path/worker<index>.out`; waits at most
    `timeout_s` for each and kills every worker's process group by pid in any case.

    Returns:
      Per worker, (exit code, output).
    """
    ports = free_ports(count)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs, logs = [], []
    try:
        for index in range(count):
            tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
            logs.append(str(tmp_path / f"worker{index}.out"))
            procs.append(start(worker_args(index), logs[-1], TF_CONFIG=tf_config))
        codes = [wait(proc, timeout_s, log) for proc, log in zip(procs, logs, strict=True)]
    finally:
        for proc in procs:
            kill(proc)
    results = []
    for code, log in zip(codes, logs, strict=True):
        with open(log, encoding="utf-8", errors="replace") as f:
            results.append((code, f.read()))
    return results


def run_workers(worker_args, tmp_path, timeout_s: float, count: int = 2) -> list[str]:
    """`run_worker_processes`, failing with the output of a worker that does not exit 0.

    Returns:
      The workers' log paths.
    """
    for code, text in run_worker_processes(worker_args, tmp_path, timeout_s, count):
        assert code == 0, text[-3000:]
    return [str(tmp_path / f"worker{index}.out") for index in range(count)]


def wait_until(predicate, timeout_s: float, what: str, poll_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(poll_s)


def pip_install_target(source, target) -> None:
    """Installs the package folder `source` into the folder `target` as a user would (pip, no
    dependencies, no index): how the plug-in tests put a third-party package beside the suite."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--no-build-isolation", "--target", str(target), str(source)],
        check=True, timeout=300, capture_output=True, cwd=str(target),
    )  # fmt: skip


def install_plugin(tmp_path_factory, package: str, init_source: str, group: str, entry: str):
    """A third-party plug-in as a user installs one: the one-module package `package` (its
    `__init__.py` is `init_source`) with a setup.py registering `entry` ("name = module:attr")
    in the entry-point `group`, pip-installed (`pip_install_target`) into a fresh folder, which
    is returned (put it on the path to find the plug-in)."""
    source = tmp_path_factory.mktemp(f"{package}_src")
    (source / package).mkdir()
    (source / package / "__init__.py").write_text(init_source)
    (source / "setup.py").write_text(
        "from setuptools import setup\n"
        f"setup(name={package.replace('_', '-')!r}, version='0.1', packages=[{package!r}],\n"
        f"      entry_points={{{group!r}: [{entry!r}]}})\n"
    )
    target = tmp_path_factory.mktemp(f"{package}_site")
    pip_install_target(source, target)
    return target


@contextlib.contextmanager
def deadline(seconds: int):
    """A hang inside the block (a FIFO opened for reading, /dev/zero read to its end) raises
    TimeoutError after `seconds` (SIGALRM, main thread only): the test fails, not the suite."""

    def expired(*_):
        raise TimeoutError(f"no answer within {seconds} s: the command hung on its input")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def file_tree(root) -> dict[str, tuple[int, int]]:
    """Every path below `root` (links not followed) with its size and mtime: equal snapshots
    before and after a call show that it wrote nothing there."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            stat = os.lstat(path)
            found[os.path.relpath(path, root)] = (stat.st_size, stat.st_mtime_ns)
    return found
