"""Measures a step's handling of an embedding table's gradient by the gradient summer, made dense
(before issue 56's item 1) against summed as rows (after), at a table far larger than a step
touches.

Two logical CPUs, data-parallel (`--all_reduce=ring`: `mlperf_tf.collectives.GradientSummer`),
one table `[rows, dim]` fp32 (replicated: each replica holds it whole, as a data group of
DLRMv4's split tables holds its shard) under row-wise Adagrad
(`AdamWRowWiseAdagrad`). Each step, each replica gets the gradient of `--lookups` random
lookups (an `IndexedSlices`, ids uniform over the table) and the summer sums and applies it:

* `dense`: the gradient made dense (`tf.convert_to_tensor`) before the summer, as the summer did
  with every gradient: a `[rows, dim]` tensor, its ring all-reduce, and row-wise Adagrad's scan
  of it for the nonzero rows;
* `rows`: the `IndexedSlices` itself: its ids and rows all-gathered
  (`collectives.rows.all_gather_rows`), duplicates merged, the touched rows updated.

Only the gradient's handling is in the step (no model): what the change moves. Reported: the
bytes one replica sends a step (the summer's traffic, counted from the traced collectives), the
largest tensor the step forms, and the step time of interleaved rounds (`tools.harness.compare`,
median and per-round ratios, the load average beside them).

    python tools/costs/bench_table_gradients.py [--rows=1000000] [--dim=64] [--lookups=4096]
        [--steps=5] [--rounds=5]
"""

from __future__ import annotations

import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

import tensorflow as tf  # noqa: E402

from tools import harness  # noqa: E402

REPLICAS = 2


def contestant(rows: int, dim: int, lookups: int, *, dense: bool):
    """(`run(steps)`, the summer) of one path: its own table, optimizer and summer."""
    import keras  # noqa: PLC0415

    from mlperf_tf.collectives import GradientSummer, Settings  # noqa: PLC0415
    from mlperf_tf.optimizers.rowwise_adagrad import AdamWRowWiseAdagrad  # noqa: PLC0415
    from mlperf_tf.parallel.mesh import DeviceMesh  # noqa: PLC0415

    strategy = harness.mirrored_cpus(REPLICAS)
    with strategy.scope():
        table = keras.Variable(tf.random.stateless_uniform([rows, dim], seed=[0, 1]) * 0.01,
                               name="embedding_table")  # fmt: skip
        optimizer = AdamWRowWiseAdagrad(0.01, sparse_variables=("embedding",))
        optimizer.build([table])
    summer = GradientSummer(strategy, Settings(all_reduce="ring"), DeviceMesh(data=REPLICAS))
    with strategy.scope():
        summer.build(optimizer, [table])

    def replica():
        ids = tf.random.uniform([lookups], 0, rows, dtype=tf.int64)  # [lookups]
        values = tf.random.normal([lookups, dim])  # [lookups, dim]
        grad = tf.IndexedSlices(values, ids, tf.constant([rows, dim], tf.int64))
        summer.apply(optimizer, [tf.convert_to_tensor(grad) if dense else grad], [table])

    @tf.function
    def steps(n):
        for _ in tf.range(n):
            strategy.run(replica)

    def run(n: int) -> None:
        steps(tf.constant(n))
        float(table[0, 0])  # wait for the updates

    return run, summer


def main(argv=None) -> None:
    parser = harness.rounds_parser(__doc__.splitlines()[0], steps=5)
    parser.add_argument("--rows", type=int, default=1_000_000, help="table rows")
    parser.add_argument("--dim", type=int, default=64, help="table width")
    parser.add_argument("--lookups", type=int, default=4096, help="lookups per replica a step")
    args = harness.parse_rounds(parser, argv, "rows", "dim", "lookups")
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    runs, summers = {}, {}
    for name in ("dense", "rows"):
        runs[name], summers[name] = contestant(args.rows, args.dim, args.lookups,
                                               dense=name == "dense")  # fmt: skip
    table_mb = args.rows * args.dim * 4 / 2**20
    harness.compare(
        runs, steps=args.steps, rounds=args.rounds, samples_per_step=REPLICAS * args.lookups,
        reference="rows", unit="lookups",
        title=f"table gradient of {REPLICAS} x {args.lookups} lookups, table {args.rows} x "
        f"{args.dim} fp32 ({table_mb:.0f} MiB), {REPLICAS} replicas, ring; TF {tf.__version__}",
    )  # fmt: skip
    for name, summer in summers.items():
        sent = summer.bytes_sent_per_replica() / 2**20
        formed = table_mb if name == "dense" else REPLICAS * args.lookups * args.dim * 4 / 2**20
        print(f"{name}: {sent:.2f} MiB sent per replica a step; largest gradient tensor "
              f"{formed:.2f} MiB")  # fmt: skip
    print(f"load average {harness.load_average()}")


if __name__ == "__main__":
    main()
