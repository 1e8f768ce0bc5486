"""Measures spatial partitioning: activation bytes per replica and step time for K = 1, 2, 4 (or KxL tiles).

Each case is a fresh process (synthetic data, MirroredStrategy over `--devices` logical CPU
devices, the mesh `data = devices / K, spatial = K`) that builds the runner's `Trainer` and
reports: the activation bytes one replica holds for the backward pass (the sum of every
layer output's per-replica shape x the images per batch shard x 4 bytes: a slab's rows, or the
whole tensor after a gather; per image it is about 1/K of the unsplit model's, so at a fixed
global batch the per-replica total stays about the same: K lets a group of K replicas hold the
batch one replica held, or the same replicas hold K times the images), the median wall and CPU seconds of a step after two warm-up
steps, and the images per batch shard (a global batch of `devices / K` images gives each group
of K replicas one image: fewer images than replicas). Cases run in rounds, the load average
is printed with each.

usage: python tools/costs/bench_spatial.py [--benchmark=resnet50|ssd] [--parts=1,2,4,2x2]
           [--global_batch=8] [--image_size=128] [--steps=5] [--rounds=1] [--devices=4]

On a 2-core host the 4 logical devices share the cores, so step times say what the collectives
and the smaller convolutions cost, not what K devices would gain. A benchmark without a
convolutional trunk (`--benchmark=bert`) is refused with one `error:` line.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

from tools import harness
from tools.harness import require_positive  # noqa: E402


def activation_bytes(model, images: int) -> int:
    """Bytes of every layer output of `model` (nested models included) for `images` images."""
    import numpy as np

    total = 0
    for layer in model.layers:
        if hasattr(layer, "layers") and layer.layers:  # a nested model: its layers count
            total += activation_bytes(layer, images)
            continue
        if type(layer).__name__ == "InputLayer":
            continue
        outputs = layer.output if isinstance(layer.output, (list, tuple)) else [layer.output]
        for out in outputs:
            total += images * int(np.prod(out.shape[1:])) * 4
    return total


def child(args) -> dict:
    """In this process: one case (K = args.parts) measured."""
    import tensorflow as tf

    from mlperf_tf import config as config_lib
    from mlperf_tf import distribute, registry
    from mlperf_tf.benchmark import RunContext
    from mlperf_tf.parallel import input as parallel_input
    from mlperf_tf.parallel import mesh as parallel_mesh

    cls = registry.get(args.benchmark)
    size_key = "data.image_size" if args.benchmark == "resnet50" else "model.image_size"
    config = config_lib.override(
        cls.preset("smoke"),
        {"global_batch_size": str(args.global_batch), size_key: str(args.image_size)},
    )
    strategy = distribute.resolve_strategy("auto", num_cpu_devices=args.devices)
    mesh = parallel_mesh.build_mesh(args.devices, spatial_partition=str(args.parts))
    benchmark = cls(config).with_context(RunContext(num_replicas=args.devices, mesh=mesh))
    parallel_mesh.check_supported(mesh, cls.name, benchmark.parallel_axes)
    parts = harness.runner_parts(
        strategy, benchmark, dataset_fn=parallel_input.for_mesh(benchmark.train_dataset, mesh)
    )
    trainer, iterator, model = parts.trainer, parts.iterator, parts.model
    one = tf.constant(1)
    for _ in range(2):
        trainer.loop(iterator, one)[0].numpy()
    walls, cpus = [], []
    for _ in range(args.steps):
        w, c = time.perf_counter(), time.process_time()
        loss = float(trainer.loop(iterator, one)[0].numpy())
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    images = benchmark.per_replica_batch_size
    return {
        "images_per_batch_shard": images,
        "activation_mib_per_replica": activation_bytes(model, images) / 2**20,
        "input_mib_per_replica": images * args.image_size**2 * 3 * 4 / 2**20,
        "step_s": statistics.median(walls),
        "step_cpu_s": statistics.median(cpus),
        "loss": loss,
    }


def measure(case: tuple[str, int], args) -> dict | None:
    """`child`'s measurements of one (K, global batch) in a fresh process; None if it failed."""
    parts, global_batch = case
    flags = [
        f"--parts={parts}", f"--global_batch={global_batch}", f"--benchmark={args.benchmark}",
        f"--image_size={args.image_size}", f"--steps={args.steps}", f"--devices={args.devices}",
    ]  # fmt: skip
    try:
        return harness.run_child(__file__, flags)
    except RuntimeError as e:
        print(f"K={parts} global batch {global_batch}: {str(e).splitlines()[-1]}", flush=True)
        return None


def supported_axes(name: str) -> tuple[str, ...]:
    """The mesh axes benchmark `name` supports at its smoke preset.

    Read from an instance: the contract's `parallel_axes` is a class attribute by default and a
    property where the axes follow the config (MoE layers add "expert"), so the class attribute
    alone can be a `property` object.
    """
    from mlperf_tf import registry  # noqa: PLC0415

    cls = registry.get(name)
    return tuple(cls(cls.preset("smoke")).parallel_axes)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmark", default="resnet50")
    parser.add_argument("--parts", default="1,2,4")
    parser.add_argument("--global_batch", type=int, default=8)
    parser.add_argument("--image_size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--smallest", action="store_true", help="also run devices/K images")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    require_positive(parser, args, "global_batch", "image_size", "steps", "rounds", "devices")
    if args.child:
        harness.child_main(lambda: child(args))
        return
    if "spatial" not in supported_axes(args.benchmark):
        parser.error(
            f"--benchmark={args.benchmark} has no convolutional trunk to split "
            f"(--spatial_partition needs one of: resnet50, ssd)"
        )
    from mlperf_tf.errors import UserError  # noqa: PLC0415
    from mlperf_tf.parallel.mesh import parse_spatial  # noqa: PLC0415

    parts = args.parts.split(",")
    try:
        sizes = {k: parse_spatial(k)[0] * parse_spatial(k)[1] for k in parts}
    except UserError as e:
        parser.error(f"{e} (--parts)")
    cases = [(k, args.global_batch) for k in parts]
    if args.smallest:
        cases += [(k, args.devices // sizes[k]) for k in parts if sizes[k] > 1]
    results = harness.case_rounds(
        cases, lambda case: measure(case, args), rounds=args.rounds,
        label=lambda case: f"K={case[0]} global batch {case[1]}",
    )  # fmt: skip
    print(
        "| K | global batch | images per group | activation MiB per replica (per image) | "
        "input MiB per replica | step s (CPU s), median | runs |"
    )
    print("|---|---|---|---|---|---|---|")
    for (k, batch), values in results.items():
        values = [v for v in values if v is not None]
        if not values:
            continue
        first = values[0]
        print(
            f"| {k} | {batch} | {first['images_per_batch_shard']} | "
            f"{first['activation_mib_per_replica']:.2f} "
            f"({first['activation_mib_per_replica'] / first['images_per_batch_shard']:.3f}) | "
            f"{first['input_mib_per_replica']:.2f} | {harness.median_of(values, 'step_s'):.3f} "
            f"({harness.median_of(values, 'step_cpu_s'):.3f}) | {len(values)} |"
        )


if __name__ == "__main__":
    main()
