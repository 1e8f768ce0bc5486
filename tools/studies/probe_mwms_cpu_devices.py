"""Checks whether MultiWorkerMirroredStrategy can run 2 workers x 2 logical CPU devices.

Starts 2 workers on 127.0.0.1; each splits its CPU into 2 logical devices before it creates the
strategy, then prints its replica count, its local devices and the sum of an all-reduce of
(replica id + 1) over all replicas. Two ways to name the cluster: TF_CONFIG (TF's
`TFConfigClusterResolver`), and a `SimpleClusterResolver` that claims 2 accelerators per worker
(`num_accelerators={"CPU": 2}`; TF only reads its "GPU" and "TPU" counts). Every wait is bounded;
the workers are killed by process group.

    python tools/studies/probe_mwms_cpu_devices.py [--timeout_s=120]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

from tools import harness  # noqa: E402

LOGICAL_DEVICES = 2


def _worker(resolver_kind: str) -> None:
    import tensorflow as tf  # noqa: PLC0415

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * LOGICAL_DEVICES
    )
    if resolver_kind == "tf_config":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        config = json.loads(os.environ["TF_CONFIG"])
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(config["cluster"]),
            task_type="worker",
            task_id=config["task"]["index"],
            num_accelerators={"CPU": LOGICAL_DEVICES},
            rpc_layer="grpc",
        )
        strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)

    def replica():
        context = tf.distribute.get_replica_context()
        value = tf.cast(context.replica_id_in_sync_group + 1, tf.float32)
        return context.all_reduce("sum", value)

    summed = strategy.experimental_local_results(tf.function(lambda: strategy.run(replica))())
    print(json.dumps({
        "logical_cpus": [d.name for d in tf.config.list_logical_devices("CPU")],
        "num_replicas_in_sync": strategy.num_replicas_in_sync,
        "worker_devices": list(strategy.extended.worker_devices),
        "all_reduce_sum": [float(s) for s in summed],
    }), flush=True)  # fmt: skip


def _probe(resolver_kind: str, timeout_s: float) -> list[str]:
    command = [sys.executable, os.path.abspath(__file__), f"--worker={resolver_kind}"]
    results = []
    for worker in harness.run_workers(command, 2, timeout_s=timeout_s):
        if worker.returncode is None:
            results.append(f"worker {worker.index}: no answer in {timeout_s:g} s")
            continue
        records = [line for line in worker.stdout.splitlines() if line.startswith("{")]
        tail = (worker.stdout + worker.stderr).strip().splitlines()[-1:] or ["(no output)"]
        shown = records[-1] if records else tail[0]
        results.append(f"worker {worker.index} (exit {worker.returncode}): {shown}")
    return results


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout_s", type=float, default=120.0)
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args.worker)
        return
    import tensorflow as tf  # noqa: PLC0415

    print(f"TF {tf.__version__}")
    for kind in ("tf_config", "simple_resolver_cpu_accelerators"):
        for line in _probe(kind, args.timeout_s):
            print(f"{kind}: {line}")


if __name__ == "__main__":
    main()
