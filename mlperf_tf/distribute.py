"""Provides `resolve_strategy`: the tf.distribute strategy for `--distribution`, with bounded start-up.

`auto` picks TPU when `--tpu` is given, MultiWorkerMirroredStrategy when TF_CONFIG names more than
one task, MirroredStrategy when there are several GPUs or `--num_cpu_devices` > 1, and one device
otherwise. Connecting to a TPU or to peer workers runs with a deadline: an address that cannot be
reached is a `UserError` within `timeout_s`, not a hang.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable

import tensorflow as tf
from absl import logging

from mlperf_tf.errors import UserError

DISTRIBUTIONS = ("auto", "tpu", "multi_worker", "mirrored", "one_device")
CLUSTER_RESOLVERS = ("auto", "tf_config", "slurm", "kubernetes", "tpu")


# Bounds of --num_cpu_devices: TF builds thread pools and a device object per logical device, so
# 100,000 of them spent 10+ minutes in set-up here; a test needs a handful.
CPU_DEVICES_PER_CORE = 16
CPU_DEVICE_MEMORY_MB = 64


def max_cpu_devices() -> int:
    """The most logical CPU devices this host may be split into (per core and per memory)."""
    cores = os.cpu_count() or 1
    try:
        memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    except (ValueError, OSError, AttributeError):  # not POSIX: bound by cores only
        memory_mb = cores * CPU_DEVICES_PER_CORE * CPU_DEVICE_MEMORY_MB
    return max(1, min(cores * CPU_DEVICES_PER_CORE, memory_mb // CPU_DEVICE_MEMORY_MB))


def check_cpu_device_count(num_devices: int) -> None:
    """Raises UserError unless `num_devices` is in [1, `max_cpu_devices()`] (no TF needed)."""
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices <= 0:
        raise UserError(f"--num_cpu_devices ({num_devices!r}) must be a positive integer.")
    limit = max_cpu_devices()
    if num_devices > limit:
        raise UserError(
            f"--num_cpu_devices={num_devices} is more than this host can hold ({limit}: "
            f"{CPU_DEVICES_PER_CORE} per core of {os.cpu_count()}, one per "
            f"{CPU_DEVICE_MEMORY_MB} MB of memory)"
        )


def split_cpu(num_devices: int) -> None:
    """Splits the host CPU into `num_devices` logical devices (for replica tests without GPUs).

    Must run before TF initializes its devices; afterwards it only checks that the split is there.

    Raises:
      UserError: `num_devices` is not positive, or TF was already initialized with fewer devices.
    """
    check_cpu_device_count(num_devices)
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices
        )
    except RuntimeError:
        existing = len(tf.config.list_logical_devices("CPU"))
        if existing < num_devices:
            raise UserError(
                f"--num_cpu_devices={num_devices}: TF was initialized with {existing} CPU "
                "device(s) already; set it before any TF op runs."
            ) from None


def parse_tf_config() -> dict:
    """Returns TF_CONFIG as a dict ({} when unset).

    Raises:
      UserError: TF_CONFIG is not JSON or lacks `cluster`/`task`.
    """
    text = os.environ.get("TF_CONFIG", "")
    if not text:
        return {}
    try:
        tf_config = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"TF_CONFIG is not valid JSON ({e.msg} at char {e.pos})") from None
    if not isinstance(tf_config, dict) or "cluster" not in tf_config or "task" not in tf_config:
        raise UserError("TF_CONFIG must be a JSON object with 'cluster' and 'task'")
    return tf_config


def _slurm_tasks() -> int:
    try:
        return int(os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get("SLURM_NTASKS") or 0)
    except ValueError:
        return 0


def pick_cluster_resolver(kind: str = "auto", *, tpu: str = "") -> str:
    """Which resolver `--cluster_resolver=auto` means here: `tpu` when `--tpu` is given,
    `tf_config` when TF_CONFIG is set, `slurm` inside a Slurm step of several tasks (SLURM_PROCID
    and SLURM_STEP_NUM_TASKS/SLURM_NTASKS > 1), else "" (one host). Other kinds pass through.

    Raises:
      UserError: an unknown kind.
    """
    if kind not in CLUSTER_RESOLVERS:
        raise UserError(f"--cluster_resolver={kind!r} is not one of {', '.join(CLUSTER_RESOLVERS)}")
    if kind != "auto":
        return kind
    if tpu:
        return "tpu"
    if os.environ.get("TF_CONFIG"):
        return "tf_config"
    if "SLURM_PROCID" in os.environ and _slurm_tasks() > 1:
        return "slurm"
    return ""


def check_resolver_environment(cluster_resolver: str) -> None:
    """Raises UserError when an explicitly named resolver lacks what it reads (no TF needed)."""
    if cluster_resolver == "tf_config" and not os.environ.get("TF_CONFIG"):
        raise UserError(
            "--cluster_resolver=tf_config: TF_CONFIG is not set (it names the cluster and this "
            "task); set it, or use --cluster_resolver=auto for a one-host run"
        )
    if cluster_resolver == "slurm" and "SLURM_PROCID" not in os.environ:
        raise UserError("--cluster_resolver=slurm: SLURM_PROCID is not set (run under srun)")
    if cluster_resolver == "tf_config":
        parse_tf_config()  # a TF_CONFIG that is not JSON fails here


def cluster_config(kind: str, *, port_base: int = 8888) -> dict:
    """The cluster of this task as a TF_CONFIG-shaped dict, from TF's own resolver of `kind`.

    `tf_config` reads TF_CONFIG; `slurm` uses TF's `SlurmClusterResolver` (workers on the step's
    nodes, ports `port_base`, `port_base + 1`, ... per node; no GPU assignment on CPU hosts);
    `kubernetes` uses TF's `KubernetesClusterResolver` (pods labelled `job-name=worker`; needs
    the `kubernetes` package and in-cluster credentials). So no user writes TF_CONFIG by hand.

    Raises:
      UserError: the environment lacks what the resolver needs.
    """
    resolvers = tf.distribute.cluster_resolver
    if kind == "tf_config":
        check_resolver_environment(kind)
        return parse_tf_config()
    if kind == "slurm":
        if "SLURM_PROCID" not in os.environ:
            raise UserError("--cluster_resolver=slurm: SLURM_PROCID is not set (run under srun)")
        gpus = len(tf.config.list_physical_devices("GPU"))
        # TF's resolver also deals out GPUs per task and divides by zero on CPU-only nodes:
        # there it is given nominal GPUs that it does not set (auto_set_gpu=False).
        gpu_args = (
            {"gpus_per_node": gpus} if gpus else {"gpus_per_node": 1 << 16, "gpus_per_task": 1}
        )
        try:
            resolver = resolvers.SlurmClusterResolver(
                port_base=port_base, auto_set_gpu=bool(gpus), **gpu_args
            )
            spec = resolver.cluster_spec().as_dict()
        except (RuntimeError, KeyError, ValueError) as e:
            raise UserError(f"--cluster_resolver=slurm: {e}") from None
    elif kind == "kubernetes":
        try:
            resolver = resolvers.KubernetesClusterResolver({"worker": ["job-name=worker"]})
            spec = resolver.cluster_spec().as_dict()
        except ImportError:
            raise UserError(
                "--cluster_resolver=kubernetes needs the `kubernetes` package (pip install "
                "kubernetes)"
            ) from None
        except Exception as e:  # the client's API and config errors have no common base
            raise UserError(f"--cluster_resolver=kubernetes: {type(e).__name__}: {e}") from None
    else:
        raise UserError(f"--cluster_resolver={kind!r} names no multi-worker cluster")
    task_type = resolver.task_type or "worker"
    task_id = int(resolver.task_id or 0)
    return {"cluster": spec, "task": {"type": task_type, "index": task_id}}


def _num_tasks(tf_config: dict) -> int:
    cluster = tf_config.get("cluster", {})
    return sum(len(cluster.get(kind, [])) for kind in ("chief", "worker"))


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """True on the task that writes logs and checkpoints: the chief, or worker 0 without one."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "task_type", None):
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    has_chief = "chief" in resolver.cluster_spec().as_dict()
    return task_type == "chief" or (not has_chief and task_type == "worker" and task_id == 0)


def task_id(strategy: tf.distribute.Strategy) -> int:
    """This task's index among the workers (0 for single-host strategies)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    return int(getattr(resolver, "task_id", 0) or 0) if resolver is not None else 0


def _with_deadline(fn: Callable, timeout_s: float, what: str):
    """Runs `fn` in a daemon thread; raises UserError naming `what` if it has not returned in time."""
    result: dict = {}

    def target():
        try:
            result["value"] = fn()
        except Exception as e:  # re-raised in the caller's thread below
            result["error"] = e

    thread = threading.Thread(target=target, daemon=True, name=f"connect-{what}")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise UserError(f"{what} could not be reached within {timeout_s:g} s")
    if "error" in result:
        error = result["error"]
        raise UserError(f"{what} failed to start: {type(error).__name__}: {error}") from None
    return result["value"]


def needs_static_shapes(strategy: tf.distribute.Strategy, *, xla: bool) -> bool:
    """Whether steps under `strategy` must keep static shapes: XLA-compiled, or on TPUs (which
    compile every step with XLA). The runner tells the benchmark through `RunContext`."""
    return xla or is_tpu(strategy)


def is_tpu(strategy: tf.distribute.Strategy) -> bool:
    """Whether `strategy` runs on TPUs (TPUStrategy, either API)."""
    tpu_strategies = (tf.distribute.TPUStrategy, tf.distribute.experimental.TPUStrategy)
    return isinstance(strategy, tpu_strategies)


def resolve_strategy(
    distribution: str = "auto",
    *,
    tpu: str = "",
    num_cpu_devices: int = 0,
    timeout_s: float = 120.0,
    collective_timeout: float = 0.0,
    cluster_resolver: str = "auto",
    port_base: int = 8888,
    tpu_cores_per_replica: int = 1,
) -> tf.distribute.Strategy:
    """Creates the strategy that `--distribution` asks for.

    Args:
      distribution: one of `DISTRIBUTIONS`.
      tpu: TPU name or grpc address for TPUClusterResolver ("local" for a TPU VM).
      num_cpu_devices: if > 0, split the CPU into this many logical devices first.
      timeout_s: deadline for reaching a TPU or the peer workers.
      collective_timeout: seconds a multi-worker collective may wait for its peers (0: no limit;
        the coordination service's heartbeat check still ends it when a peer dies or freezes).
      cluster_resolver: where the cluster comes from (see `pick_cluster_resolver`).
      port_base: first worker port on a node for the Slurm resolver.
      tpu_cores_per_replica: on TPU, logical cores per replica (K x L x M of
        `--spatial_partition` and `--model_parallel`; `mlperf_tf.parallel.tpu`): above 1 the
        strategy gets a device assignment of such replicas and XLA's SPMD partitioning.

    Raises:
      UserError: an unknown distribution, a bad TF_CONFIG, or an unreachable TPU/peer.
    """
    if distribution not in DISTRIBUTIONS:
        raise UserError(f"--distribution={distribution!r} is not one of {', '.join(DISTRIBUTIONS)}")
    if num_cpu_devices:
        split_cpu(num_cpu_devices)
    kind = pick_cluster_resolver(cluster_resolver, tpu=tpu)
    if kind == "tpu" and distribution in ("auto", "tpu"):
        distribution = "tpu"
    tf_config = cluster_config(kind, port_base=port_base) if kind not in ("", "tpu") else {}
    if distribution == "auto":
        distribution = _auto_distribution(tpu, tf_config, num_cpu_devices)
        logging.info("--distribution=auto resolved to %s", distribution)
    if distribution == "tpu":
        return _tpu_strategy(tpu, timeout_s, tpu_cores_per_replica)
    if distribution == "multi_worker":
        return _multi_worker_strategy(
            kind, tf_config, num_cpu_devices=num_cpu_devices, timeout_s=timeout_s,
            collective_timeout=collective_timeout,
        )  # fmt: skip
    if distribution == "mirrored":
        return _mirrored_strategy(num_cpu_devices)
    gpus = tf.config.list_logical_devices("GPU")
    return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")


def _auto_distribution(tpu: str, tf_config: dict, num_cpu_devices: int) -> str:
    """What `--distribution=auto` means here: a TPU if named, several workers if the cluster
    has them, several local devices if there are, else one device."""
    if tpu:
        return "tpu"
    if _num_tasks(tf_config) > 1:
        return "multi_worker"
    if len(tf.config.list_physical_devices("GPU")) > 1 or num_cpu_devices > 1:
        return "mirrored"
    return "one_device"


def _multi_worker_strategy(
    kind: str, tf_config: dict, *, num_cpu_devices: int, timeout_s: float,
    collective_timeout: float,
) -> tf.distribute.MultiWorkerMirroredStrategy:  # fmt: skip
    """A MultiWorkerMirroredStrategy over the cluster `tf_config` names, once every peer is up."""
    if not tf_config:
        raise UserError(
            "--distribution=multi_worker needs TF_CONFIG or --cluster_resolver=slurm|"
            "kubernetes to name the cluster"
        )
    if num_cpu_devices > 1 and not tf.config.list_physical_devices("GPU"):
        # TF 2.20 gives a worker without GPUs/TPUs one device, whatever the CPU split
        # (measured: tools/studies/probe_mwms_cpu_devices.py; see mlperf_tf/collectives/README.md).
        logging.warning(
            "--num_cpu_devices=%d: MultiWorkerMirroredStrategy uses one CPU device per "
            "worker; each worker is one replica",
            num_cpu_devices,
        )
    wait_for_peers(tf_config, timeout_s)
    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=collective_timeout or None
    )
    if kind in ("", "tf_config"):
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    # TF's Slurm and Kubernetes resolvers found the cluster; hand it over as resolved.
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(tf_config["cluster"]),
        task_type=tf_config["task"]["type"],
        task_id=tf_config["task"]["index"],
        num_accelerators={"GPU": len(tf.config.list_physical_devices("GPU"))},
        rpc_layer="grpc",
    )
    return tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver, communication_options=options
    )


def _mirrored_strategy(num_cpu_devices: int) -> tf.distribute.MirroredStrategy:
    """A MirroredStrategy over the local GPUs, else over the first `num_cpu_devices` CPUs."""
    gpus = tf.config.list_logical_devices("GPU")
    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    if num_cpu_devices:
        cpus = cpus[:num_cpu_devices]
    devices = [d.name for d in gpus] or cpus
    # Without GPUs the CPU devices share one host: NCCL is unavailable, so reduce on the host.
    cross_device_ops = None if gpus else tf.distribute.ReductionToOneDevice()
    return tf.distribute.MirroredStrategy(devices, cross_device_ops=cross_device_ops)


def _split_address(address: str) -> tuple[str, int]:
    host, _, port = address.removeprefix("grpc://").rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"address {address!r} is not host:port")
    return host.strip("[]"), int(port)


def wait_for_peers(tf_config: dict, timeout_s: float) -> None:
    """Rendezvous of all tasks before TF starts: returns when every peer's port accepts TCP.

    MultiWorkerMirroredStrategy's constructor blocks forever, holding the GIL, when a peer never
    comes, so no Python-level timeout can interrupt it. Instead each task first listens on its own
    TF_CONFIG port with a plain socket and probes every peer's port until all answer (a peer's
    listener, or its TF server once that peer moved on, both accept), then closes its listener and
    lets TF bind the port.

    Raises:
      UserError: some peer's port did not accept a connection within `timeout_s`.
    """
    cluster = tf_config["cluster"]
    task = tf_config["task"]
    addresses = [
        (kind, i, addr)
        for kind in ("chief", "worker")
        for i, addr in enumerate(cluster.get(kind, []))
    ]
    own = [a for kind, i, a in addresses if kind == task.get("type") and i == task.get("index")]
    if not own:
        raise UserError(f"TF_CONFIG task {task} is not in its cluster {cluster}")
    host, port = _split_address(own[0])
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("", port))
    except OSError as e:
        listener.close()
        raise UserError(f"cannot listen on this task's address {own[0]}: {e.strerror}") from None
    listener.listen(16)
    listener.settimeout(0.05)
    deadline = time.monotonic() + timeout_s
    pending = [(kind, i, addr) for kind, i, addr in addresses if addr != own[0]]
    try:
        while pending:
            try:  # answer peers' probes, then drop the connection
                conn, _ = listener.accept()
                conn.close()
            except (TimeoutError, OSError):
                pass
            still = []
            for kind, i, addr in pending:
                try:
                    with socket.create_connection(_split_address(addr), timeout=0.5):
                        pass
                except OSError:
                    still.append((kind, i, addr))
            pending = still
            if pending and time.monotonic() > deadline:
                names = ", ".join(f"{kind}:{i} at {addr}" for kind, i, addr in pending)
                raise UserError(f"peer task(s) {names} not reachable within {timeout_s:g} s")
            if pending:
                time.sleep(0.2)
        # Keep answering a little longer so that slower peers see this task before TF binds.
        linger_until = time.monotonic() + 1.0
        while time.monotonic() < linger_until:
            try:
                conn, _ = listener.accept()
                conn.close()
            except (TimeoutError, OSError):
                pass
    finally:
        listener.close()


def wait_for_address(address: str, timeout_s: float, what: str) -> None:
    """Returns when `address` (host:port, optionally grpc://) accepts TCP; UserError at the deadline."""
    host_port = _split_address(address)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(host_port, timeout=1.0):
                return
        except OSError as e:
            if time.monotonic() > deadline:
                raise UserError(
                    f"{what} at {address} not reachable within {timeout_s:g} s ({e.strerror or e})"
                ) from None
            time.sleep(0.5)


def _tpu_strategy(tpu: str, timeout_s: float, cores_per_replica: int = 1) -> tf.distribute.Strategy:
    if tpu.startswith("grpc://"):
        # TF's own connect retries without a deadline: probe the worker first.
        wait_for_address(tpu, timeout_s, "TPU worker")

    def connect():
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or None)
        tf.config.experimental_connect_to_cluster(resolver)
        topology = tf.tpu.experimental.initialize_tpu_system(resolver)
        if cores_per_replica == 1:
            return tf.distribute.TPUStrategy(resolver)
        # Spatial partitioning / tensor parallelism: each replica spans the mesh's spatial x
        # model axes as logical cores (not run here: there is no TPU; see the parallel README).
        from mlperf_tf.parallel import tpu as tpu_lib  # noqa: PLC0415 (only for this path)

        return tf.distribute.TPUStrategy(
            resolver,
            experimental_device_assignment=tpu_lib.device_assignment(topology, cores_per_replica),
            experimental_spmd_xla_partitioning=True,
        )

    return _with_deadline(connect, timeout_s, f"TPU {tpu or '(default)'!r}")
