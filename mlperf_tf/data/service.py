"""Provides tf.data service support: `mlperf-tf data-service` servers and `distribute` for pipelines.

The tf.data service moves a pipeline's preprocessing off the training host: a dispatcher hands
out work and N workers run the pipeline, streaming finished batches to the trainer. Start the
servers with `mlperf-tf data-service --port 5050 --workers 4` (or `python -m
mlperf_tf.data.service ...`) and train with `--data_service=grpc://HOST:5050`.
"""

from __future__ import annotations

import math
import re
import socket
import sys
import threading
from collections.abc import Sequence

import tensorflow as tf

from mlperf_tf.errors import UserError

# grpc://HOST:PORT, HOST a name, an IPv4 address or a bracketed IPv6 address.
_ADDRESS = re.compile(r"^grpc://(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.\-]+):(?P<port>\d{1,5})$")
_PROCESSING_MODES = ("distributed_epoch", "parallel_epochs")
# Seconds to wait for the dispatcher's TCP port before reporting it unreachable.
_CONNECT_TIMEOUT_S = 10.0


def parse_address(service_address: str) -> tuple[str, int]:
    """Splits `grpc://HOST:PORT` into (host, port).

    Raises:
      UserError: the address is not of that form or the port is out of range.
    """
    match = _ADDRESS.match(service_address or "")
    port = int(match.group("port")) if match else 0
    if not match or not 0 < port < 65536:
        raise UserError(
            f"tf.data service address '{service_address}' must look like grpc://HOST:PORT "
            "(e.g. grpc://127.0.0.1:5050)"
        )
    return match.group("host").strip("[]"), port


def check_reachable(service_address: str, *, timeout_s: float = _CONNECT_TIMEOUT_S) -> None:
    """Fails fast when nothing listens at the dispatcher's address.

    The tf.data service client retries an unreachable dispatcher forever, which would hang a run;
    a TCP connect with a timeout turns that into an error.

    Raises:
      UserError: the address is malformed or its port does not accept a connection.
    """
    host, port = parse_address(service_address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as e:
        raise UserError(
            f"cannot reach the tf.data service dispatcher at '{service_address}' ({e}); "
            "start one with `mlperf-tf data-service --port PORT --workers N`"
        ) from None


def distribute(
    dataset: tf.data.Dataset,
    service_address: str,
    *,
    job_name: str,
    processing_mode: str = "distributed_epoch",
    check_address: bool = True,
) -> tf.data.Dataset:
    """Runs `dataset`'s processing on the tf.data service and reads its elements from there.

    With `processing_mode="distributed_epoch"` (the default) the dispatcher splits the
    dataset's source (the file list of `training_pipeline`/`eval_pipeline`) among the workers, so
    one epoch through the service holds each element exactly once, as locally. With
    `"parallel_epochs"` every worker runs the whole dataset (each produces its own shuffled
    epochs).

    Consumers that pass the same `job_name` share one job and split its elements between them;
    so give each input pipeline its own name (e.g. `f"train-{input_pipeline_id}"`) when each
    builds a different shard, and the same name only for identical datasets.

    Args:
      dataset: the pipeline to run on the workers (its files must be readable by them).
      service_address: the dispatcher, `grpc://HOST:PORT`.
      job_name: the job's name (see above).
      processing_mode: "distributed_epoch" or "parallel_epochs".
      check_address: check up front that the dispatcher accepts connections.

    Returns:
      A dataset with the same elements, produced by the service.

    Raises:
      UserError: the address is malformed or unreachable.
      ValueError: `job_name` is empty or `processing_mode` unknown.
    """
    parse_address(service_address)
    if not job_name:
        raise ValueError(f"`job_name` ({job_name!r}) must be a non-empty string.")
    if processing_mode not in _PROCESSING_MODES:
        raise ValueError(
            f"`processing_mode` ({processing_mode!r}) must be one of {_PROCESSING_MODES}."
        )
    if check_address:
        check_reachable(service_address)
    policy = (
        tf.data.experimental.service.ShardingPolicy.DYNAMIC
        if processing_mode == "distributed_epoch"
        else tf.data.experimental.service.ShardingPolicy.OFF
    )
    # The service drops the pipeline's final prefetch, so prefetch slack has nothing to act on.
    options = tf.data.Options()
    options.experimental_slack = False
    distributed = dataset.with_options(options).apply(
        tf.data.experimental.service.distribute(
            processing_mode=policy, service=service_address, job_name=job_name
        )
    )
    return distributed.prefetch(tf.data.AUTOTUNE)


class Servers:
    """A running dispatcher (None when the workers joined another) and its workers (in this
    process); `stop()` shuts them down."""

    def __init__(self, dispatcher, workers, address: str):
        self.dispatcher = dispatcher
        self.workers = list(workers)
        self.address = address

    def join(self) -> None:
        """Blocks until the dispatcher stops (Ctrl-C)."""
        self.dispatcher.join()

    def stop(self) -> None:
        """Shuts the servers down (they stop when their last reference goes away)."""
        self.workers.clear()
        self.dispatcher = None

    def __enter__(self) -> Servers:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(
    port: int,
    num_workers: int,
    *,
    host: str = "127.0.0.1",
    block: bool = True,
    stream=None,
    dispatcher_address: str = "",
    worker_timeout_s: float = 0.0,
) -> Servers | None:
    """Starts a tf.data service dispatcher on `port` (all interfaces) and `num_workers` workers.

    Workers pick free ports and register with the dispatcher under `host`, the name that
    trainers use to reach them (use the machine's network name for other hosts). With
    `dispatcher_address` no dispatcher is started: the workers join that one (workers on other
    hosts, or in their own processes so that one can fail alone).

    Args:
      port: the dispatcher's TCP port; 0 picks a free one (see the returned `address`).
      num_workers: worker servers to start in this process (0: the dispatcher only).
      host: the host name that the dispatcher and workers advertise.
      block: serve until interrupted (Ctrl-C), then return None; if False, return the servers.
      stream: where to print the address line (default stdout).
      dispatcher_address: `grpc://HOST:PORT` of a running dispatcher for the workers to join.
      worker_timeout_s: seconds without a worker's heartbeat after which the dispatcher drops
        it and stops assigning it work (0: TensorFlow's default).

    Returns:
      The running `Servers` when `block` is False, else None.

    Raises:
      ValueError: `port`, `num_workers` or `worker_timeout_s` is out of range, or
        `num_workers` is 0 with a `dispatcher_address`.
      UserError: `dispatcher_address` is malformed or unreachable.
    """
    _check_serve_arguments(port, num_workers, dispatcher_address, worker_timeout_s)
    service = tf.data.experimental.service
    dispatcher = None
    if dispatcher_address:
        check_reachable(dispatcher_address)
        dispatcher_host, bound_port = parse_address(dispatcher_address)
    else:
        timeout_ms = int(worker_timeout_s * 1000) or None
        dispatcher = service.DispatchServer(
            service.DispatcherConfig(port=port, worker_timeout_ms=timeout_ms)
        )
        dispatcher_host, bound_port = host, int(dispatcher.target.rsplit(":", 1)[1])
    workers = [
        service.WorkerServer(
            service.WorkerConfig(
                dispatcher_address=f"{dispatcher_host}:{bound_port}",
                worker_address=f"{host}:%port%",
                port=0,
            )
        )
        for _ in range(num_workers)
    ]
    address = f"grpc://{dispatcher_host}:{bound_port}"
    stream = stream if stream is not None else sys.stdout
    if dispatcher is None:
        print(f"{num_workers} tf.data service worker(s) joined {address}", file=stream)
    else:
        print(f"tf.data service dispatcher at {address} with {num_workers} worker(s)", file=stream)
    stream.flush()
    servers = Servers(dispatcher, workers, address)
    if not block:
        return servers
    _serve_until_interrupted(servers)
    return None


def _check_serve_arguments(
    port: int, num_workers: int, dispatcher_address: str, worker_timeout_s: float
) -> None:
    """`serve`'s argument checks (see its Raises)."""
    if not isinstance(port, int) or not 0 <= port < 65536:
        raise ValueError(f"`port` ({port!r}) must be an integer in [0, 65535].")
    if not isinstance(num_workers, int) or num_workers < (1 if dispatcher_address else 0):
        raise ValueError(
            f"`num_workers` ({num_workers!r}) must be a non-negative integer "
            "(positive when joining a dispatcher)."
        )
    if worker_timeout_s < 0:
        raise ValueError(f"`worker_timeout_s` ({worker_timeout_s!r}) must be >= 0.")


def _serve_until_interrupted(servers: Servers) -> None:
    """Serves until Ctrl-C, then stops the servers."""
    try:
        # join() blocks in C++; waiting on an Event keeps Ctrl-C responsive.
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        servers.stop()


_MOST_WORKERS = 1024  # worker servers in one process
_MOST_S = 366 * 24 * 3600.0


def main(argv: Sequence[str]) -> int:
    """`mlperf-tf data-service --port P --workers N [--host H] [--dispatcher grpc://H:P]`."""
    from mlperf_tf.prepare_cli import ArgumentParser  # noqa: PLC0415 (errors as UserErrors)

    parser = ArgumentParser(
        prog="mlperf-tf data-service",
        description="Start a tf.data service dispatcher and N workers; train with "
        "--data_service=grpc://HOST:PORT. SECURITY: TF's data service listens on every network "
        "interface, without authentication or encryption: anyone who can reach its ports can "
        "join as a worker or read the data. Run it on a private network or behind a firewall.",
    )
    parser.add_argument("--port", type=int, default=5050, help="dispatcher port (0: any free)")
    parser.add_argument(
        "--workers", type=int, default=2, help="worker servers to start (0: the dispatcher only)"
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="host name the servers advertise to trainers"
    )
    parser.add_argument(
        "--dispatcher",
        default="",
        help="grpc://HOST:PORT of a running dispatcher: start only workers that join it",
    )
    parser.add_argument(
        "--worker_timeout_s",
        type=float,
        default=0.0,
        help="seconds without a worker heartbeat before the dispatcher drops it (0: TF's default)",
    )
    args = parser.parse_args(list(argv))
    if not 0 <= args.port < 65536:
        parser.error(f"--port ({args.port}) must be in [0, 65535]")
    least = 1 if args.dispatcher else 0
    if not least <= args.workers <= _MOST_WORKERS:
        parser.error(f"--workers ({args.workers}) must be in [{least}, {_MOST_WORKERS}]")
    if not (math.isfinite(args.worker_timeout_s) and 0 <= args.worker_timeout_s <= _MOST_S):
        parser.error(f"--worker_timeout_s ({args.worker_timeout_s}) must be in [0, {_MOST_S:g}]")
    if args.dispatcher:
        try:
            parse_address(args.dispatcher)
        except UserError as e:
            parser.error(f"--dispatcher: {e}")
    serve(
        args.port,
        args.workers,
        host=args.host,
        block=True,
        dispatcher_address=args.dispatcher,
        worker_timeout_s=args.worker_timeout_s,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
