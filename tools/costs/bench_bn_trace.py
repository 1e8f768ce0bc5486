"""Times tracing and the first training step of ResNet-50 per batch-norm group size.

Each measurement is a fresh process (synthetic data, MirroredStrategy over `--devices` logical
CPU devices) that builds the runner's `Trainer` and times, in wall and CPU seconds, (1) tracing
its loop (`get_concrete_function`), (2) the first call (graph optimization, collective set-up,
one step) and (3) a second call (one step). CPU seconds of the process say more than wall
seconds on a shared host. Rounds interleave the group sizes (and the source trees, with
`--trees`), and the load average is printed before and after each measurement.

usage: python tools/costs/bench_bn_trace.py [--group_sizes=1,2,4] [--rounds=2] [--devices=4]
           [--block_layers=3,4,6,3] [--base_width=16] [--timeout_s=1800] [--trees=.,/tmp/old]

`--trees`: source trees (repository roots) to run, by PYTHONPATH; the default is this checkout.
A run that passes `--timeout_s` is reported as "> timeout" (it had not finished its first step).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time


def child(group_size: int, args) -> dict:
    """In this process: builds the run's Trainer and times its loop's trace and first call."""
    import tensorflow as tf

    from benchmarks.resnet50 import config as resnet_config
    from benchmarks.resnet50.benchmark import ResNet50Benchmark
    from mlperf_tf import config as config_lib
    from mlperf_tf import distribute
    from mlperf_tf.benchmark import RunContext
    from mlperf_tf.runner import Trainer

    overrides = {
        "model.bn_group_size": str(group_size),
        "model.block_layers": args.block_layers,
        "model.base_width": str(args.base_width),
    }
    config = config_lib.override(resnet_config.smoke(), overrides)
    strategy = distribute.resolve_strategy("auto", num_cpu_devices=args.devices)
    benchmark = ResNet50Benchmark(config).with_context(
        RunContext(num_replicas=strategy.num_replicas_in_sync)
    )
    with strategy.scope():
        model = benchmark.build_model()
        optimizer = benchmark.build_optimizer(benchmark.train_steps)
        optimizer.build(model.trainable_variables)
    trainer = Trainer(
        strategy=strategy, benchmark=benchmark, model=model, optimizer=optimizer, xla=False
    )
    iterator = iter(strategy.distribute_datasets_from_function(benchmark.train_dataset))
    one = tf.constant(1)
    marks = [(time.perf_counter(), time.process_time())]
    trainer.loop.get_concrete_function(iterator, one)  # tracing only
    marks.append((time.perf_counter(), time.process_time()))
    trainer.loop(iterator, one)[0].numpy()  # graph optimization, collective set-up, one step
    marks.append((time.perf_counter(), time.process_time()))
    trainer.loop(iterator, one)[0].numpy()
    marks.append((time.perf_counter(), time.process_time()))
    (w0, c0), (w1, c1), (w2, c2), (w3, _) = marks
    return {
        "trace_s": w1 - w0, "trace_cpu_s": c1 - c0, "first_call_s": w2 - w1,
        "first_call_cpu_s": c2 - c1, "second_call_s": w3 - w2,
    }  # fmt: skip


def measure(case: tuple[str, int], args) -> dict | None:
    """`child`'s timings in a fresh process of the case's tree, or None past `--timeout_s`."""
    from tools import harness  # noqa: PLC0415

    tree, group_size = case
    flags = [
        f"--group_sizes={group_size}", f"--devices={args.devices}",
        f"--block_layers={args.block_layers}", f"--base_width={args.base_width}",
    ]  # fmt: skip
    return harness.run_child(__file__, flags, tree=tree, timeout_s=args.timeout_s)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group_sizes", default="1,2,4")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--block_layers", default="3,4,6,3")
    parser.add_argument("--base_width", type=int, default=16)
    parser.add_argument("--timeout_s", type=float, default=1800.0)
    parser.add_argument("--trees", default=".")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    group_sizes = [int(g) for g in args.group_sizes.split(",")]
    if args.child:  # in the tree under test (PYTHONPATH), which may have no tools.harness
        print(json.dumps(child(group_sizes[0], args)), flush=True)
        return
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root
    from tools import harness  # noqa: PLC0415

    cases = [(t, g) for t in args.trees.split(",") for g in group_sizes]
    results = harness.case_rounds(
        cases, lambda case: measure(case, args), rounds=args.rounds,
        label=lambda case: f"tree {case[0]} group_size {case[1]}",
    )  # fmt: skip
    print("| tree | bn_group_size | trace s (CPU s) | first call s (CPU s) | runs |")
    print("|---|---|---|---|---|")
    for (tree, group_size), values in results.items():
        done = [v for v in values if v is not None]
        if len(done) < len(values):
            print(f"| {tree} | {group_size} | > {args.timeout_s:.0f} in all | | {len(values)} |")
            continue
        trace, trace_cpu, first, first_cpu = (
            harness.median_of(done, key)
            for key in ("trace_s", "trace_cpu_s", "first_call_s", "first_call_cpu_s")
        )
        print(
            f"| {tree} | {group_size} | {trace:.1f} ({trace_cpu:.1f}) | "
            f"{first:.1f} ({first_cpu:.1f}) | {len(done)} |"
        )


if __name__ == "__main__":
    main()
