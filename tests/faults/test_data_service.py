"""A tf.data service worker killed or frozen mid-epoch; then the last one too.

A dispatcher and two workers, each in its own process on 127.0.0.1, feed a ResNet-50 smoke run.
When one worker fails TF's service client goes on with the other (measured: no pause); when the
last one fails no batch comes, and the run must end within `--data_service_timeout_s` with one
`error:` line naming the dispatcher, exit code `EXIT_DATA_SERVICE_FAILED`, `run_stop` aborted and a
checkpoint of the last completed step. Every wait is bounded; processes are killed by pid.
"""

import json
import os
import signal
import time

import pytest
import tensorflow as tf
from mlperf_logging.mllog import constants as C

from mlperf_tf import errors
from tests import processes
from tests.refusals import the_error_line

TIMEOUT_S = 240
STALL_TIMEOUT_S = 10


def _read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _steps(log) -> int:
    return _read(log).count("next eval in")


def _start_service(tmp_path):
    """The dispatcher and two workers, each its own process; their processes and address."""
    (port,) = processes.free_ports(1)
    address = f"grpc://127.0.0.1:{port}"
    log = str(tmp_path / "dispatcher.out")
    dispatcher = processes.start(
        ["-m", "mlperf_tf.data.service", f"--port={port}", "--workers=0",
         "--worker_timeout_s=3"], log,
    )  # fmt: skip
    procs = [dispatcher]
    processes.wait_until(lambda: "dispatcher at" in _read(log) or dispatcher.poll() is not None,
                         TIMEOUT_S, "the dispatcher")  # fmt: skip
    for index in range(2):
        log = str(tmp_path / f"worker{index}.out")
        procs.append(processes.start(
            ["-m", "mlperf_tf.data.service", f"--dispatcher={address}", "--workers=1"], log))  # fmt: skip
        processes.wait_until(lambda log=log: "joined" in _read(log), TIMEOUT_S, f"worker {index}")
    return procs, address


# Extended or slow (CI runs the kill after README's default run): the default run covers
# the service by mlperf_tf/data/test_service.py (a run on the service's workers, the same batches).
@pytest.mark.parametrize(
    "fault",
    [pytest.param("kill", marks=pytest.mark.extended),
     pytest.param("freeze", marks=pytest.mark.slow)],
)  # fmt: skip
def test_the_run_goes_on_with_one_worker_and_stops_clearly_with_none(tmp_path, fault):
    signum = signal.SIGKILL if fault == "kill" else signal.SIGSTOP
    procs, address = _start_service(tmp_path)
    log = str(tmp_path / "trainer.out")
    try:
        trainer = processes.start(
            ["-m", "mlperf_tf.cli", "run", "--benchmark=resnet50", "--preset=smoke",
             f"--model_dir={tmp_path / 'model'}", "--config.max_epochs=100000",
             "--steps_per_loop=4", f"--data_service={address}",
             f"--data_service_timeout_s={STALL_TIMEOUT_S}",
             f"--mlperf_log={tmp_path / 'mlperf_log.txt'}"], log,
        )  # fmt: skip
        procs.append(trainer)
        processes.wait_until(lambda: _steps(log) >= 2 or trainer.poll() is not None,
                             TIMEOUT_S, "training")  # fmt: skip
        assert trainer.poll() is None, _read(log)[-3000:]
        os.kill(procs[2].pid, signum)
        # One worker left: the run goes on (well past what the prefetch buffers hold).
        at_fault = _steps(log)
        processes.wait_until(lambda: _steps(log) >= at_fault + 20 or trainer.poll() is not None,
                             TIMEOUT_S, "training with one worker")  # fmt: skip
        assert trainer.poll() is None, _read(log)[-3000:]
        began = time.monotonic()
        os.kill(procs[1].pid, signum)
        code = processes.wait(trainer, TIMEOUT_S, log)
        seconds = time.monotonic() - began
    finally:
        for proc in reversed(procs):
            processes.kill(proc)
    text = _read(log)
    print(f"{fault}: {at_fault} loops before, the last worker's fault ended the run after "
          f"{seconds:.1f} s (load {os.getloadavg()[0]:.1f})")  # fmt: skip
    line = the_error_line(text, code, errors.EXIT_DATA_SERVICE_FAILED)
    assert f"no batch from the tf.data service at {address}" in line
    assert "the dispatcher answers" in line
    assert "a checkpoint of step" in line, line
    saved = int(line.split("a checkpoint of step ")[1].split()[0])
    latest = tf.train.latest_checkpoint(str(tmp_path / "model" / "ckpt"))
    assert latest.endswith(f"ckpt-{saved}")
    records = [json.loads(line.split(":::MLLOG ", 1)[1])
               for line in _read(tmp_path / "mlperf_log.txt").splitlines() if ":::MLLOG" in line]  # fmt: skip
    assert records[-1]["key"] == C.RUN_STOP and records[-1]["metadata"]["status"] == C.ABORTED
    assert seconds >= STALL_TIMEOUT_S
