"""Tests of mlperf_tf.data.service on 127.0.0.1: a dispatcher, 2 workers, bounded waits."""

import gc
import io
import socket
import threading
from unittest import mock

import numpy as np
import pytest

from mlperf_tf.data import pipeline, service
from mlperf_tf.errors import UserError
from tests.mlperf_tf.data import helpers

WAIT_S = 120  # bound on any wait for the service (the host may be heavily loaded)


def _run_bounded(fn):
    """Runs fn() in a thread; fails the test if it does not finish within WAIT_S seconds."""
    result, errors = [], []

    def target():
        try:
            result.append(fn())
        except Exception as e:  # re-raised in the test's thread below
            errors.append(e)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(WAIT_S)
    assert not thread.is_alive(), f"no answer from the tf.data service within {WAIT_S}s"
    if errors:
        raise errors[0]
    return result[0]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(params=["one process", "workers joined the dispatcher"])
def servers(request):
    """A dispatcher and 2 workers: started together, or the workers apart (`--dispatcher`)."""
    if request.param == "one process":
        handles = [service.serve(0, 2, host="127.0.0.1", block=False, stream=io.StringIO())]
    else:
        dispatcher = service.serve(0, 0, block=False, stream=io.StringIO())
        assert dispatcher.workers == []
        joined = io.StringIO()
        workers = service.serve(
            0, 2, block=False, stream=joined, dispatcher_address=dispatcher.address
        )
        assert workers.dispatcher is None and workers.address == dispatcher.address
        assert f"2 tf.data service worker(s) joined {dispatcher.address}" in joined.getvalue()
        handles = [workers, dispatcher]
    try:
        yield handles[0]
    finally:
        for handle in handles:
            handle.stop()
        gc.collect()


def test_one_epoch_through_the_service_equals_the_local_pipeline(tmp_path, servers):
    # 6 files x 8 records, batches of 4: any split of whole files among the workers batches
    # without a remainder, so the epoch's multiset is exactly comparable.
    files = helpers.write_ints(tmp_path, 48, 6)

    def epoch():
        return pipeline.training_pipeline(
            files,
            input_context=None,
            parse_fn=helpers.parse_int,
            transform_fn=lambda e: {"x": e["x"], "y": e["x"] * 10},
            batch_size=4,
            num_epochs=1,
        )

    local = sorted(x for b in epoch() for x in b["x"].numpy())
    assert local == list(range(48))
    remote = service.distribute(epoch(), servers.address, job_name="train-0")
    batches = _run_bounded(lambda: list(remote))
    xs = [x for b in batches for x in b["x"].numpy()]
    assert sorted(xs) == local
    for b in batches:
        np.testing.assert_array_equal(b["y"].numpy(), 10 * b["x"].numpy())


def test_bad_addresses_are_clear_errors(tmp_path):
    files = helpers.write_ints(tmp_path, 4, 1)
    ds = pipeline.training_pipeline(
        files, input_context=None, parse_fn=helpers.parse_int, transform_fn=None, batch_size=2
    )
    for bad in ("127.0.0.1:5050", "grpc://host", "grpc://h:99999", ""):
        with pytest.raises(UserError, match="must look like grpc://HOST:PORT"):
            service.distribute(ds, bad, job_name="x")
    port = _free_port()
    with pytest.raises(UserError, match=f"cannot reach .*127.0.0.1:{port}"):
        service.distribute(ds, f"grpc://127.0.0.1:{port}", job_name="x")
    with pytest.raises(ValueError, match="job_name"):
        service.distribute(ds, "grpc://127.0.0.1:1", job_name="", check_address=False)


def test_servers_stop_and_free_the_port():
    handle = service.serve(0, 1, block=False, stream=io.StringIO())
    address = handle.address
    service.check_reachable(address)
    handle.stop()
    del handle
    gc.collect()
    with pytest.raises(UserError, match="cannot reach"):
        service.check_reachable(address, timeout_s=5)


def test_main_serves_until_interrupted(capsys):
    with mock.patch.object(threading.Event, "wait", side_effect=KeyboardInterrupt):
        assert service.main(["--port", "0", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "tf.data service dispatcher at grpc://127.0.0.1:" in out and "2 worker(s)" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["--workers", "-1"],
        ["--port", "70000"],
        ["--port", "x"],
        ["--dispatcher", "grpc://127.0.0.1:5050", "--workers", "0"],
        ["--worker_timeout_s", "-1"],
    ],
)
def test_main_rejects_bad_flags(argv):
    # A one-line error naming the flag (the CLI prints it as `error:` and exits 2).
    with pytest.raises(UserError) as raised:
        service.main(argv)
    assert "\n" not in str(raised.value)
    assert any(flag in str(raised.value) for flag in argv if flag.startswith("--"))
