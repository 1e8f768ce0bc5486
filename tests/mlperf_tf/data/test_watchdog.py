"""`StallWatchdog`: a train loop that gets no batch for `timeout_s` is reported once, in one line."""

import threading
import time

import pytest
import tensorflow as tf

from mlperf_tf.data.watchdog import StallWatchdog
from tests import processes

ADDRESS_NOBODY_SERVES = f"grpc://127.0.0.1:{processes.free_ports(1)[0]}"


def _watchdog(timeout_s=0.3):
    stalls, fired = [], threading.Event()

    def on_stall(message):
        stalls.append(message)
        fired.set()

    watchdog = StallWatchdog(
        address=ADDRESS_NOBODY_SERVES, timeout_s=timeout_s, on_stall=on_stall, poll_s=0.05
    )
    return watchdog, stalls, fired


def test_a_loop_without_batches_is_reported_once_naming_the_dispatcher():
    watchdog, stalls, fired = _watchdog()
    with watchdog.watching():
        assert fired.wait(30), "no stall reported"
        fired.clear()
        assert not fired.wait(0.5)  # once only
    assert len(stalls) == 1
    assert stalls[0].startswith(f"no batch from the tf.data service at {ADDRESS_NOBODY_SERVES}")
    assert "--data_service_timeout_s=0.3" in stalls[0] and "does not answer" in stalls[0]
    assert "\n" not in stalls[0]


def _after_a_while(element, seconds=0.1):
    waited = tf.py_function(lambda: time.sleep(seconds) or True, [], tf.bool)
    with tf.control_dependencies([waited]):
        return {key: tf.identity(value) for key, value in element.items()}


def test_batches_arriving_keep_it_quiet_and_elements_pass_unchanged():
    watchdog, stalls, _ = _watchdog(timeout_s=1.0)
    # A batch every 0.1 s (slower than the poll, a tenth of the timeout) for 2 s: twice the
    # timeout in all, so only the batches' stamps keep it quiet.
    slow = tf.data.Dataset.range(20).map(lambda x: {"x": x, "y": 2 * x}).map(_after_a_while)
    batches = iter(watchdog.stamped(slow))
    # Making the iterator and its first batch is tracing, which the runner never watches (its first
    # loop is unarmed); on a busy machine it alone can take longer than the timeout.
    elements = [next(batches)]
    with watchdog.watching():
        elements += list(batches)
    assert [int(e["y"]) for e in elements] == [2 * i for i in range(20)]
    assert not stalls


def test_outside_loops_and_in_unarmed_loops_nothing_is_watched():
    watchdog, stalls, fired = _watchdog(timeout_s=0.2)
    assert not fired.wait(0.6)
    with watchdog.watching(armed=False):
        assert not fired.wait(0.6)
    assert not stalls


def test_the_timeout_must_be_positive():
    with pytest.raises(ValueError, match="timeout_s"):
        StallWatchdog(address=ADDRESS_NOBODY_SERVES, timeout_s=0, on_stall=print)
