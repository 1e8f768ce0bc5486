"""Measures what tensor parallelism (`--model_parallel=M`) costs and saves per replica: bytes of
variables and optimizer slots each replica holds, and the step time, for M = 1, 2, 4 on 4
logical CPU devices (the data axis is the rest: D = 4 / M).

Bytes are counted from the per-replica variables the model and optimizer really built under
the MirroredStrategy (split variables hold their shard's shape). The expected per-replica share
is 1/M of the split weights and their slots plus the replicated rest (layer norms, biases of
row-parallel projections, position/token-type embeddings, pooler, next-sentence head), printed
as `bound`.

Step time on one CPU is overhead, not speed-up: the 4 "devices" share the same 2 cores, so M > 1
only adds the all-reduces of activations (and the split matmuls are no faster). It is printed
as the ratio to M = 1 for that reason, not as a speed claim.

    python tools/costs/bench_tensor_parallel.py [--model=bert|llama|transformer] [--layers=12]
        [--steps=3 (0: bytes only)] [--batch_size=4] [--seq_length=64]

Defaults: BERT-base dimensions (hidden 768, 12 heads, intermediate 3072, vocab 30522 padded to
30524 so that 4 divides it) at a short sequence and batch; `--model=llama` a Llama of
hidden 1024 (16 query / 8 key-value heads of 64, intermediate 3584, vocab 32768);
`--model=transformer` the Transformer-big dimensions (hidden 1024, filter 4096, 16 heads).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

import tensorflow as tf  # noqa: E402

from tools import harness  # noqa: E402

NUM_DEVICES = 4


def _split_cpu():
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_DEVICES
    )


def make_benchmark(args):
    if args.model == "bert":
        from benchmarks.bert import config as config_lib  # noqa: PLC0415
        from benchmarks.bert.benchmark import BertBenchmark  # noqa: PLC0415

        c = config_lib.smoke()
        model = dataclasses.replace(
            config_lib.bert_tiny(30524), hidden_size=768, num_hidden_layers=args.layers,
            num_attention_heads=12, intermediate_size=3072,
            max_position_embeddings=max(args.seq_length, 32),
        )  # fmt: skip
        data = dataclasses.replace(
            c.data, max_seq_length=args.seq_length, max_predictions_per_seq=max(2, args.seq_length // 8)
        ) if hasattr(c, "data") else None  # fmt: skip
        fields = {"model": model, "global_batch_size": args.batch_size * NUM_DEVICES}
        if data is not None:
            fields["data"] = data
        return BertBenchmark(dataclasses.replace(c, **fields))
    if args.model == "llama":
        from benchmarks.llama31_8b import config as config_lib  # noqa: PLC0415
        from benchmarks.llama31_8b.benchmark import Llama31Benchmark  # noqa: PLC0415

        c = config_lib.smoke()
        model = dataclasses.replace(
            c.model, vocab_size=32768, hidden_size=1024, num_hidden_layers=args.layers,
            num_attention_heads=16, num_key_value_heads=8, head_dim=64, intermediate_size=3584,
        )  # fmt: skip
        data = dataclasses.replace(c.data, max_sequence_length=args.seq_length)
        return Llama31Benchmark(
            dataclasses.replace(
                c, model=model, data=data, global_batch_size=args.batch_size * NUM_DEVICES
            )
        )
    from benchmarks.transformer import config as config_lib  # noqa: PLC0415
    from benchmarks.transformer.benchmark import TransformerBenchmark  # noqa: PLC0415

    c = config_lib.smoke()
    model = dataclasses.replace(
        c.model, vocab_size=32768, hidden_size=1024, num_layers=args.layers, num_heads=16,
        filter_size=4096,
    )  # fmt: skip
    data = dataclasses.replace(
        c.data, max_sequence_length=args.seq_length, bucket_lengths=(args.seq_length,)
    )
    return TransformerBenchmark(
        dataclasses.replace(
            c,
            model=model,
            data=data,
            global_batch_size=args.batch_size * args.seq_length * NUM_DEVICES,
        )  # fmt: skip
    )


def measure(base, model_parallel: int, steps: int) -> dict:
    from mlperf_tf.benchmark import RunContext  # noqa: PLC0415
    from mlperf_tf.collectives import GradientSummer, Settings  # noqa: PLC0415
    from mlperf_tf.parallel import layout  # noqa: PLC0415
    from mlperf_tf.parallel.context import use_mesh  # noqa: PLC0415
    from mlperf_tf.parallel.input import for_mesh  # noqa: PLC0415
    from mlperf_tf.parallel.mesh import build_mesh  # noqa: PLC0415

    strategy = harness.mirrored_cpus(NUM_DEVICES)
    mesh = build_mesh(NUM_DEVICES, model_parallel=model_parallel)
    benchmark = base.with_context(RunContext(num_replicas=NUM_DEVICES, seed=1, mesh=mesh))
    summer = GradientSummer(strategy, Settings(all_reduce="ring"), mesh)
    with strategy.scope(), use_mesh(mesh):
        model = benchmark.build_model()
        optimizer = benchmark.build_optimizer(1000)
        variables = model.trainable_variables
        optimizer.build(variables)
        summer.build(optimizer, variables)
        layout.split_slots(optimizer, mesh)
    weights = layout.bytes_per_replica(model.variables)
    slots = layout.bytes_per_replica(optimizer.variables)
    split = [v for v in model.variables if layout.layout_of(v).split]
    split_bytes = layout.bytes_per_replica(split)
    replicated = weights - split_bytes
    data = iter(strategy.distribute_datasets_from_function(for_mesh(benchmark.train_dataset, mesh)))

    def replica_step(batch):
        with tf.GradientTape() as tape:
            loss = benchmark.compute_loss(model, batch, training=True)
        summer.apply(optimizer, tape.gradient(loss, variables), variables)
        return loss

    @tf.function
    def step():
        return strategy.reduce("sum", strategy.run(replica_step, args=(next(data),)), axis=None)

    times = [float("nan")]
    if steps:
        step()  # trace and warm up
        times = []
    for _ in range(steps):  # (none with --steps=0: bytes only)
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return {
        "weights": weights, "slots": slots, "split": split_bytes, "replicated": replicated,
        "step_s": sorted(times)[len(times) // 2],
    }  # fmt: skip


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("bert", "llama", "transformer"), default="bert")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=4, help="sequences per batch shard")
    parser.add_argument("--seq_length", type=int, default=64)
    parser.add_argument("--model_parallel", default="1,2,4")
    args = parser.parse_args(argv)
    _split_cpu()
    base = make_benchmark(args)
    rows = {}
    for m in (int(x) for x in args.model_parallel.split(",")):
        rows[m] = measure(base, m, args.steps)
        r, r1 = rows[m], rows[min(rows)]
        total, total1 = r["weights"] + r["slots"], r1["weights"] + r1["slots"]
        # Bound: 1/M of the (whole) split weights and their slots, plus the replicated rest.
        split_whole = r["split"] * m
        slot_factor = r["slots"] / max(r["weights"], 1)
        bound = (split_whole / m + r["replicated"]) * (1 + slot_factor)
        print(
            f"{args.model} M={m} D={NUM_DEVICES // m}: weights {r['weights'] / 2**20:.1f} MiB, "
            f"slots {r['slots'] / 2**20:.1f} MiB per replica (replicated {r['replicated'] / 2**20:.2f}"
            f" MiB); total/M=1 {total / total1:.3f} (1/M = {1 / m:.3f}, bound "
            f"{bound / total1:.3f}); step {r['step_s']:.2f} s, /M=1 "
            f"{r['step_s'] / r1['step_s']:.2f} (overhead on one CPU, not speed-up)",
            flush=True,
        )


if __name__ == "__main__":
    main()
