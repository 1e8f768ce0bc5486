"""Measures gradient summation on logical CPU devices: time per all-reduce of ResNet-50's and
BERT-base's gradient sets per algorithm, pack size and device count; the optimizer step with
and without weight-update sharding; optimizer-slot memory per replica; and fitted alpha/beta.

Each device count runs in its own process (the CPU split is fixed per process); within one,
the choices are interleaved round by round so that load on this shared machine hits all alike.
Times are medians over rounds, with the spread (min-max) beside them. `auto` is the strategy's
own reduction (MirroredStrategy on CPUs: `ReductionToOneDevice`, a sum on one device).

The alpha/beta fit: a ring all-reduce (`--all_reduce=ring`, one tensor) of several sizes; t =
alpha + beta * bytes by least squares, bytes being the size of the buffer reduced (not the bytes
on the wire). On a CPU these say little about a TPU pod; they are the `cpu-local` inputs of the
scaling simulator.

    python tools/bench_allreduce.py [--devices=4,8] [--models=resnet50,bert_base] [--rounds=5]
        [--pack_mb=0,4,32] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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


def _child(args) -> None:
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    from mlperf_tf.collectives import GradientSummer, Settings  # noqa: PLC0415
    from mlperf_tf.collectives.packing import Packing  # noqa: PLC0415
    from mlperf_tf.optimizers import LARS  # noqa: PLC0415

    n = args.num_devices
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
    strategy = tf.distribute.MirroredStrategy(
        [f"CPU:{i}" for i in range(n)], cross_device_ops=tf.distribute.ReductionToOneDevice()
    )

    def emit(**record):
        print(json.dumps({"devices": n, **record}), flush=True)

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
            # One scalar per replica back to the host, so that no sum is pruned.
            return tf.add_n([tf.reshape(s, [-1])[0] for s in summed(grads)])

        @tf.function
        def step(grads):
            return strategy.reduce("sum", strategy.run(replica, args=(grads,)), None)

        return step

    def timed(fn, *a):
        begin = time.perf_counter()
        fn(*a).numpy()
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

    # 2. Optimizer step (sum + LARS update) with and without sharding, on ResNet-50's shapes.
    shapes = SHAPES["resnet50"]() if "resnet50" in args.models else [(1000, 1000)] * 4
    grads = per_replica(shapes)
    steps = {}
    for sharding in (False, True):
        with strategy.scope():
            variables = [keras.Variable(tf.fill(s, 0.01), name=f"w{i}") for i, s in enumerate(shapes)]  # fmt: skip
            optimizer = LARS(0.1, weight_decay=1e-4)
            summer = GradientSummer(
                strategy,
                Settings(
                    all_reduce="ring", pack_mb=args.opt_pack_mb, weight_update_sharding=sharding
                ),  # fmt: skip
            )
            optimizer.build([] if sharding else variables)
            summer.build(optimizer, variables)
        slot_bytes = (
            summer.slot_bytes_per_replica()
            if sharding
            else sum(math.prod(s) * 4 for s in shapes)  # LARS: one momentum slot per variable
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
        emit(kind="optimizer_step", optimizer="lars", sharding=sharding,
             median_s=statistics.median(times), min_s=min(times), max_s=max(times),
             slot_bytes_per_replica=slot_bytes,
             sent_bytes_per_replica=summer.bytes_sent_per_replica())  # fmt: skip
    del grads, steps

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


def _run_children(args) -> list[dict]:
    records = []
    for n in args.devices:
        command = [sys.executable, os.path.abspath(__file__), "--child", f"--num_devices={n}",
                   f"--rounds={args.rounds}", f"--models={','.join(args.models)}",
                   f"--pack_mb={','.join(str(p) for p in args.pack_mb)}",
                   f"--opt_pack_mb={args.opt_pack_mb}"]  # fmt: skip
        out = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout_s)
        if out.returncode:
            sys.exit(f"error: the {n}-device run failed:\n{out.stderr[-3000:]}")
        records += [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return records


def _table(records) -> str:
    lines = []
    for model in sorted({r["model"] for r in records if r["kind"] == "allreduce"}):
        lines.append(f"\n{model}: time per all-reduce of the gradient set (median, min-max)")
        lines.append("| devices | algorithm | pack_mb | ms | spread ms | vs auto |")
        lines.append("|---|---|---|---|---|---|")
        for n in sorted({r["devices"] for r in records}):
            rows = [r for r in records if r["kind"] == "allreduce" and r["model"] == model
                    and r["devices"] == n]  # fmt: skip
            base = next((r["median_s"] for r in rows if r["algorithm"] == "auto"), None)
            for r in rows:
                ratio = f"{r['median_s'] / base:.2f}x" if base else "-"
                lines.append(
                    f"| {n} | {r['algorithm']} | {r['pack_mb']:g} | {1e3 * r['median_s']:.1f} | "
                    f"{1e3 * r['min_s']:.1f}-{1e3 * r['max_s']:.1f} | {ratio} |"
                )
    lines.append("\nLARS step on ResNet-50's shapes (ring sum + update), slots per replica")
    lines.append("| devices | sharding | ms | spread ms | slot MiB/replica | sent MiB/replica |")
    lines.append("|---|---|---|---|---|---|")
    for r in records:
        if r["kind"] == "optimizer_step":
            lines.append(
                f"| {r['devices']} | {r['sharding']} | {1e3 * r['median_s']:.1f} | "
                f"{1e3 * r['min_s']:.1f}-{1e3 * r['max_s']:.1f} | "
                f"{r['slot_bytes_per_replica'] / 2**20:.1f} | "
                f"{r['sent_bytes_per_replica'] / 2**20:.1f} |"
            )
    lines.append("\nFitted ring all-reduce t = alpha + beta * bytes")
    for r in records:
        if r["kind"] == "fit":
            lines.append(
                f"devices={r['devices']}: alpha={r['alpha_s'] * 1e6:.0f} us, "
                f"beta={r['beta_s_per_byte'] * 1e9:.3f} ns/byte"
            )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", default="4,8", help="logical device counts, comma-separated")
    parser.add_argument("--models", default="resnet50,bert_base")
    parser.add_argument("--pack_mb", default="0,4,32", help="pack sizes (MiB), comma-separated")
    parser.add_argument("--opt_pack_mb", type=float, default=32.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print the alpha/beta fits as JSON")
    parser.add_argument("--timeout_s", type=float, default=3000.0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--num_devices", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    unknown = [m for m in args.models if m not in SHAPES]
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
