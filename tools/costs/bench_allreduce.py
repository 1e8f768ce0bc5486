"""Measures gradient summation on logical CPU devices: time per all-reduce of ResNet-50's and
BERT-base's gradient sets per algorithm, pack size and device count; the optimizer step with
and without weight-update sharding; optimizer-slot memory per replica; and fitted alpha/beta.

Each device count runs in its own process (the CPU split is fixed per process); within one,
the choices are interleaved round by round so that load on this shared machine hits all alike.
`--workers=2` measures two MultiWorkerMirroredStrategy workers on 127.0.0.1 instead (one
replica each: TF gives a CPU-only worker one device), timed on worker 0; every wait is bounded
and the workers are killed by process group when one fails or the time runs out.
Times are medians over rounds, with the spread (min-max) beside them. `auto` is the strategy's
own reduction (MirroredStrategy on CPUs: `ReductionToOneDevice`, a sum on one device).

The alpha/beta fit: a ring all-reduce (`--all_reduce=ring`, one tensor) of several sizes; t =
alpha + beta * bytes by least squares, bytes being the size of the buffer reduced (not the bytes
on the wire). On a CPU these say little about a TPU pod; they are the `cpu-local` inputs of the
scaling simulator.

    python tools/costs/bench_allreduce.py [--devices=4,8 | --workers=2] [--models=resnet50,bert_base]
        [--opt_models=resnet50] [--rounds=5] [--pack_mb=0,4,32] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

from tools import harness  # noqa: E402

ALGORITHMS = ("auto", "ring", "hierarchical", "torus2d")
FIT_SIZES = (4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20)  # bytes


def bert_base_shapes() -> list[tuple[int, ...]]:
    """BERT-base's trainable variable shapes (Devlin et al. 2018: 12 layers, hidden 768, 12 heads,
    intermediate 3072, vocab 30522, 512 positions), with the pre-training heads: 110M values."""
    h, inter, vocab = 768, 3072, 30522
    shapes = [(vocab, h), (512, h), (2, h), (h,), (h,)]  # embeddings + LayerNorm
    for _ in range(12):
        shapes += [(h, h), (h,)] * 4  # q, k, v, attention output
        shapes += [(h,), (h,)]  # LayerNorm
        shapes += [(h, inter), (inter,), (inter, h), (h,)]  # feed-forward
        shapes += [(h,), (h,)]  # LayerNorm
    shapes += [(h, h), (h,)]  # pooler
    shapes += [(h, h), (h,), (h,), (h,), (vocab,)]  # masked-LM transform, LayerNorm, output bias
    shapes += [(h, 2), (2,)]  # next-sentence head
    return shapes


def resnet50_shapes() -> list[tuple[int, ...]]:
    """ResNet-50's trainable variable shapes, from this suite's model (25.6M values)."""
    from mlperf_tf import registry  # noqa: PLC0415

    cls = registry.get("resnet50")
    model = cls(cls.presets["mlperf"]()).build_model()
    return [tuple(v.shape) for v in model.trainable_variables]


SHAPES = {"resnet50": resnet50_shapes, "bert_base": bert_base_shapes}
# The optimizer each model trains with in MLPerf (LARS: ResNet-50; LAMB: BERT).
OPTIMIZERS = {"resnet50": "lars", "bert_base": "lamb"}


def _strategy(args):
    """The strategy of this child: MirroredStrategy over `num_devices` logical CPUs, or (with
    TF_CONFIG set by the parent) a MultiWorkerMirroredStrategy worker; and whether it reports."""
    import tensorflow as tf  # noqa: PLC0415

    if args.workers > 1:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        return strategy, strategy.cluster_resolver.task_id == 0
    n = args.num_devices
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
    strategy = tf.distribute.MirroredStrategy(
        [f"CPU:{i}" for i in range(n)], cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
    return strategy, True


def _child(args) -> None:
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    from mlperf_tf.collectives import GradientSummer, Settings  # noqa: PLC0415
    from mlperf_tf.collectives.packing import Packing  # noqa: PLC0415
    from mlperf_tf.optimizers import LAMB, LARS  # noqa: PLC0415

    strategy, reports = _strategy(args)
    n = strategy.num_replicas_in_sync
    layout = {"workers": args.workers} if args.workers > 1 else {}

    def emit(**record):
        if reports:
            print(json.dumps({"devices": n, **layout, **record}), flush=True)

    def per_replica(shapes):
        return strategy.experimental_distribute_values_from_function(
            lambda ctx: [tf.fill(s, 1e-3 * (ctx.replica_id_in_sync_group + 1)) for s in shapes]
        )

    def summing_step(shapes, algorithm, pack_mb):
        if algorithm == "auto":

            def summed(grads):
                return tf.distribute.get_replica_context().all_reduce("sum", grads)

        else:
            summer = GradientSummer(strategy, Settings(all_reduce=algorithm, pack_mb=pack_mb))
            summer.packing = Packing(
                shapes, [tf.float32] * len(shapes), num_shards=n, pack_mb=pack_mb
            )

            def summed(grads):
                return summer.sum_gradients(grads)

        def replica(grads):
            # The function's inputs carry no device, and under MWMS the strategy's all-reduce
            # then has no destination ("destinations can not be empty"): place them here.
            grads = [tf.identity(g) for g in grads]
            # One scalar per replica back to the host, so that no sum is pruned.
            return tf.add_n([tf.reshape(s, [-1])[0] for s in summed(grads)])

        @tf.function
        def step(grads):
            # Per-replica scalars (strategy.reduce in a tf.function fails under MWMS:
            # "destinations can not be empty"); `timed` fetches every local one.
            return strategy.run(replica, args=(grads,))

        return step

    def timed(fn, *a):
        begin = time.perf_counter()
        for value in strategy.experimental_local_results(fn(*a)):
            value.numpy()
        return time.perf_counter() - begin

    # 1. Gradient sets.
    for model in args.models:
        shapes = SHAPES[model]()
        nbytes = 4 * sum(math.prod(s) for s in shapes)
        grads = per_replica(shapes)
        choices = {}
        for algorithm in ALGORITHMS:
            if algorithm == "torus2d" and n < 2:
                continue
            for pack_mb in [0.0] if algorithm == "auto" else args.pack_mb:
                step = summing_step(shapes, algorithm, pack_mb)
                timed(step, grads)  # trace and warm up
                choices[(algorithm, pack_mb)] = (step, [])
        for _ in range(args.rounds):
            for step, times in choices.values():
                times.append(timed(step, grads))
        for (algorithm, pack_mb), (_, times) in choices.items():
            emit(kind="allreduce", model=model, bytes=nbytes, tensors=len(shapes),
                 algorithm=algorithm, pack_mb=pack_mb, median_s=statistics.median(times),
                 min_s=min(times), max_s=max(times))  # fmt: skip
        del grads, choices

    # 2. Optimizer step (ring sum + update) with and without sharding, per model: LARS on
    # ResNet-50's shapes, LAMB on BERT-base's.
    for model in args.opt_models:
        shapes = SHAPES[model]()
        grads = per_replica(shapes)
        steps = {}
        # One set of weights for both choices (their values do not change the step's time):
        # BERT-base's LAMB on 4 replicas did not fit in this machine's memory with two sets.
        with strategy.scope():
            variables = [keras.Variable(tf.fill(s, 0.01), name=f"w{i}") for i, s in enumerate(shapes)]  # fmt: skip
        for sharding in (False, True):
            with strategy.scope():
                optimizer = (
                    LARS(0.1, weight_decay=1e-4) if OPTIMIZERS[model] == "lars"
                    else LAMB(1e-3, weight_decay=0.01)
                )  # fmt: skip
                summer = GradientSummer(
                    strategy,
                    Settings(
                        all_reduce="ring", pack_mb=args.opt_pack_mb, weight_update_sharding=sharding
                    ),  # fmt: skip
                )
                optimizer.build([] if sharding else variables)
                summer.build(optimizer, variables)
            slots = 1 if OPTIMIZERS[model] == "lars" else 2  # LARS: momentum; LAMB: m, v
            slot_bytes = (
                summer.slot_bytes_per_replica()
                if sharding
                else slots * sum(math.prod(s) * 4 for s in shapes)
            )

            def make(summer=summer, optimizer=optimizer, variables=variables):
                def replica(x):
                    summer.apply(optimizer, x, variables)

                @tf.function
                def optimizer_step(g):
                    strategy.run(replica, args=(g,))
                    return tf.identity(optimizer.iterations)

                return optimizer_step

            step = make()
            timed(step, grads)
            steps[sharding] = (step, [], slot_bytes, summer)
        for _ in range(args.rounds):
            for step, times, _, _ in steps.values():
                times.append(timed(step, grads))
        for sharding, (_, times, slot_bytes, summer) in steps.items():
            emit(kind="optimizer_step", model=model, optimizer=OPTIMIZERS[model],
                 sharding=sharding, median_s=statistics.median(times), min_s=min(times),
                 max_s=max(times), slot_bytes_per_replica=slot_bytes,
                 sent_bytes_per_replica=summer.bytes_sent_per_replica())  # fmt: skip
        del grads, steps, variables

    # 3. alpha/beta: ring all-reduce of one tensor of each size.
    fits = {}
    for size in FIT_SIZES:
        shape = [(size // 4,)]
        fits[size] = (summing_step(shape, "ring", 0.0), per_replica(shape), [])
        timed(fits[size][0], fits[size][1])
    for _ in range(args.rounds):
        for step, grads, times in fits.values():
            times.append(timed(step, grads))
    sizes = list(fits)
    medians = [statistics.median(fits[s][2]) for s in sizes]
    mean_x, mean_y = statistics.fmean(sizes), statistics.fmean(medians)
    beta = sum((x - mean_x) * (y - mean_y) for x, y in zip(sizes, medians)) / sum(
        (x - mean_x) ** 2 for x in sizes
    )
    emit(kind="fit", algorithm="ring", alpha_s=max(mean_y - beta * mean_x, 0.0),
         beta_s_per_byte=beta, sizes_bytes=sizes, median_s=medians)  # fmt: skip


def _child_command(args, **extra) -> list[str]:
    flags = {"rounds": args.rounds, "models": ",".join(args.models),
             "opt_models": ",".join(args.opt_models),
             "pack_mb": ",".join(str(p) for p in args.pack_mb), "opt_pack_mb": args.opt_pack_mb,
             **extra}  # fmt: skip
    return [sys.executable, os.path.abspath(__file__), "--child",
            *(f"--{k}={v}" for k, v in flags.items())]  # fmt: skip


def _run_workers(args) -> list[dict]:
    """`args.workers` MultiWorkerMirroredStrategy workers on 127.0.0.1; worker 0's records."""
    command = _child_command(args, workers=args.workers)
    workers = harness.run_workers(command, args.workers, timeout_s=args.timeout_s)
    for worker in workers:
        if worker.returncode is None:
            sys.exit(
                f"error: worker {worker.index} did not finish in --timeout_s={args.timeout_s:g}"
            )
        if worker.returncode:
            sys.exit(f"error: worker {worker.index} failed:\n{worker.stderr[-3000:]}")
    return harness.json_records(workers[0].stdout)


def _run_children(args) -> list[dict]:
    if args.workers > 1:
        return _run_workers(args)
    records = []
    for n in args.devices:
        command = _child_command(args, num_devices=n)
        out = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout_s)
        records += harness.json_records(out.stdout)
        if out.returncode:  # what was measured before the failure, then the error
            print(_table(records))
            sys.exit(f"error: the {n}-device run failed (exit {out.returncode}):\n"
                     f"{out.stderr[-3000:]}")  # fmt: skip
    return records


def _replicas(record) -> str:
    workers = record.get("workers")
    return f"{record['devices']} ({workers} workers)" if workers else str(record["devices"])


def _table(records) -> str:
    lines = []
    for model in sorted({r["model"] for r in records if r["kind"] == "allreduce"}):
        lines.append(f"\n{model}: time per all-reduce of the gradient set (median, min-max)")
        lines.append("| replicas | algorithm | pack_mb | ms | spread ms | vs auto |")
        lines.append("|---|---|---|---|---|---|")
        for n in sorted({r["devices"] for r in records}):
            rows = [r for r in records if r["kind"] == "allreduce" and r["model"] == model
                    and r["devices"] == n]  # fmt: skip
            base = next((r["median_s"] for r in rows if r["algorithm"] == "auto"), None)
            for r in rows:
                ratio = f"{r['median_s'] / base:.2f}x" if base else "-"
                lines.append(
                    f"| {_replicas(r)} | {r['algorithm']} | {r['pack_mb']:g} | {1e3 * r['median_s']:.1f} | "
                    f"{1e3 * r['min_s']:.1f}-{1e3 * r['max_s']:.1f} | {ratio} |"
                )
    lines.append("\nOptimizer step (ring sum + update), slots per replica")
    lines.append("| model | optimizer | replicas | sharding | ms | spread ms | vs unsharded | "
                 "slot MiB/replica | sent MiB/replica |")  # fmt: skip
    lines.append("|---|---|---|---|---|---|---|---|---|")
    steps = [r for r in records if r["kind"] == "optimizer_step"]
    for r in steps:
        base = next(b["median_s"] for b in steps if b["model"] == r["model"]
                    and b["devices"] == r["devices"] and not b["sharding"])  # fmt: skip
        lines.append(
            f"| {r['model']} | {r['optimizer']} | {_replicas(r)} | {r['sharding']} | "
            f"{1e3 * r['median_s']:.1f} | {1e3 * r['min_s']:.1f}-{1e3 * r['max_s']:.1f} | "
            f"{r['median_s'] / base:.2f}x | {r['slot_bytes_per_replica'] / 2**20:.1f} | "
            f"{r['sent_bytes_per_replica'] / 2**20:.1f} |"
        )
    lines.append("\nFitted ring all-reduce t = alpha + beta * bytes")
    for r in records:
        if r["kind"] == "fit":
            lines.append(
                f"replicas={_replicas(r)}: alpha={r['alpha_s'] * 1e6:.0f} us, "
                f"beta={r['beta_s_per_byte'] * 1e9:.3f} ns/byte"
            )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", default="4,8", help="logical device counts, comma-separated")
    parser.add_argument("--models", default="resnet50,bert_base")
    parser.add_argument("--pack_mb", default="0,4,32", help="pack sizes (MiB), comma-separated")
    parser.add_argument(
        "--opt_models",
        default="resnet50",
        help="models whose optimizer step is timed (LARS: resnet50, LAMB: bert_base)",
    )
    parser.add_argument("--opt_pack_mb", type=float, default=32.0)
    parser.add_argument("--workers", type=int, default=1,
                        help="N > 1: N MultiWorkerMirroredStrategy workers on 127.0.0.1 instead of --devices")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print the alpha/beta fits as JSON")
    parser.add_argument("--timeout_s", type=float, default=3000.0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--num_devices", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.opt_models = [m for m in args.opt_models.split(",") if m]
    unknown = [m for m in args.models + args.opt_models if m not in SHAPES]
    if unknown:
        sys.exit(f"error: --models: unknown {unknown}; known: {', '.join(SHAPES)}")
    args.pack_mb = [float(p) for p in args.pack_mb.split(",")]
    args.devices = [int(d) for d in args.devices.split(",")]
    if args.child:
        _child(args)
        return
    load = os.getloadavg()
    records = _run_children(args)
    if args.json:
        fits = {str(r["devices"]): {"alpha_s": r["alpha_s"], "beta_s_per_byte": r["beta_s_per_byte"],
                                    "algorithm": r["algorithm"], "sizes_bytes": r["sizes_bytes"],
                                    "median_s": r["median_s"]}
                for r in records if r["kind"] == "fit"}  # fmt: skip
        print(json.dumps({"system": "cpu-local", "per_device_count": fits,
                          "load_average_at_start": load, "records": records}, indent=1))  # fmt: skip
        return
    print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(_table(records))
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
