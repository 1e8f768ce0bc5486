"""`peer_failure` turns the collective errors of a failed peer into one line naming the task."""

import tensorflow as tf

from mlperf_tf import peers

TF_CONFIG = {
    "cluster": {"worker": ["127.0.0.1:5001", "127.0.0.1:5002"]},
    "task": {"type": "worker", "index": 0},
}
# The text worker 0 got (TF 2.20) when worker 1 was frozen with SIGSTOP, and the same when killed.
HEARTBEATS = """Graph execution error:

Detected at node CollectiveReduceV2 defined at (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main

Collective ops is aborted by: Error reported from /job:worker/task:1: The following tasks are \
unhealthy (stopped sending heartbeats):
/job:worker/replica:0/task:1
The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. \
preemption, eviction) to debug further.
The error could be from a previous operation. Restart your program to reset.
\t [[{{node CollectiveReduceV2}}]] [Op:__inference__gathered_step_1331]"""


def test_missing_heartbeats_name_the_task_and_its_address():
    error = tf.errors.UnavailableError(None, None, HEARTBEATS)
    message = peers.peer_failure(error, TF_CONFIG)
    assert message == (
        "worker 1 at 127.0.0.1:5002 stopped sending heartbeats (frozen, killed or unreachable)"
    )


def test_the_own_task_is_never_named_as_the_failed_one():
    text = HEARTBEATS.replace("task:1", "task:0")
    config = dict(TF_CONFIG, task={"type": "worker", "index": 1})
    message = peers.peer_failure(tf.errors.UnavailableError(None, None, text), config)
    assert message.startswith("worker 0 at 127.0.0.1:5001 ")


def test_a_collective_timeout_names_the_timeout_and_the_peers():
    error = tf.errors.DeadlineExceededError(None, None, "Collective has timed out waiting")
    message = peers.peer_failure(error, TF_CONFIG, collective_timeout=5.0)
    assert "--collective_timeout=5 s" in message and "worker 1 at 127.0.0.1:5002" in message
    assert "worker 0" not in message


def test_other_errors_and_single_host_runs_are_not_peer_failures():
    assert peers.peer_failure(tf.errors.InvalidArgumentError(None, None, "bad"), TF_CONFIG) is None
    assert peers.peer_failure(tf.errors.UnavailableError(None, None, HEARTBEATS), {}) is None
    assert peers.peer_failure(ValueError("stopped sending heartbeats"), TF_CONFIG) is None
