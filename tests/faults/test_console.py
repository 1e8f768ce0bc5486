"""The console filter drops TensorFlow's known start-up noise and passes everything else."""

import subprocess
import sys

from mlperf_tf import cli, console
from tests import processes

NOISE = (
    "2026-11-23 05:38:34.103286: E external/local_xla/xla/stream_executor/cuda/cuda_platform.cc:51]"
    " failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
    "W0000 00:00:1795412334.118131    8036 slack.cc:103] Could not find a final `prefetch` in the "
    "input pipeline to which to introduce slack.",
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
)
REAL = "E0000 collective_ops.cc:12] Collective ops is aborted by: a real error"


def test_known_noise_is_recognized_and_real_errors_are_not():
    assert all(console.is_noise(line) for line in NOISE)
    assert not console.is_noise(REAL)
    assert not console.is_noise("error: --model_dir='x' is a file, not a folder")


def test_verbosity_flag_turns_the_filter_off():
    assert console.verbosity_requested(["--benchmark=x", "--verbosity=0"])
    assert console.verbosity_requested(["-v", "1"])
    assert not console.verbosity_requested(["--benchmark=x"])
    assert console.quiet_stderr(["--verbosity=1"]) is None


def test_the_filter_process_drops_noise_written_to_fd_2_and_keeps_order():
    lines = [*NOISE, REAL, "last line"]
    code = (
        "import os\n"
        "from mlperf_tf import console\n"
        "f = console.StderrFilter()\n"
        f"for line in {lines!r}:\n"
        "    os.write(2, (line + '\\n').encode())\n"
        "f.close()\n"
        "os.write(2, b'after close\\n')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=processes.REPO_ROOT, env=processes.python_env(),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [REAL, "last line", "after close"]


def test_prepare_into_a_file_is_one_line(tmp_path, capsys):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    code = cli.main(["prepare", "resnet50", "--mini", f"--out_dir={a_file / 'sub'}"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"error: --out_dir '{a_file / 'sub'}': '{a_file}' is a file, not a folder" in err
    assert "Traceback" not in err


# TF's C++ copies of a UserError raised in a host-side generator (from a GRPO run whose task's
# container did not start; paths shortened): each op the error aborts logs it with its traceback.
COPIES = [
    "2026-12-07 09:47:27.727118: W tensorflow/core/framework/op_kernel.cc:1842] UNKNOWN: "
    "UserError: task 'x': its container did not start: boom",
    "Traceback (most recent call last):",
    "",
    '  File "/tf/python/ops/script_ops.py", line 269, in __call__',
    "    ret = func(*args)",
    "          ^^^^^^^^^^^",
    "",
    "mlperf_tf.errors.UserError: task 'x': its container did not start: boom",
    "",
    "",
    "\t [[{{node PyFunc}}]]",
    "2026-12-07 09:47:27.735166: I tensorflow/core/framework/local_rendezvous.cc:407] Local "
    "rendezvous is aborting with status: UNKNOWN: UserError: task 'x': its container did not "
    "start: boom",
    "Traceback (most recent call last):",
    '  File "/work/benchmarks/qwen35_397b_grpo/input.py", line 130, in rollout_steps',
    "mlperf_tf.errors.UserError: task 'x': its container did not start: boom",
    "\t [[{{node PyFunc}}]]",
    "\t [[MultiDeviceIteratorGetNextFromShard]]",
]


def test_tfs_copies_of_a_python_error_are_dropped_and_the_rest_kept():
    copies = console.ErrorCopies()
    alone = ("2026-12-07 09:47:28.000001: W tensorflow/core/framework/op_kernel.cc:1842] UNKNOWN: "
             "ValueError: a line with no traceback after it")  # fmt: skip
    lines = [*COPIES, "I1207 09:47:28 controller.py:1] run_stop status=aborted", alone,
             "error: task 'x': its container did not start: boom"]  # fmt: skip
    kept = [out for line in lines for out in copies.feed(f"{line}\n".encode())]
    kept += copies.flush()
    assert [k.decode().rstrip("\n") for k in kept] == lines[len(COPIES) :]
