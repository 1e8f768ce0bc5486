"""Measures what the pipeline's stage map costs to build: `runner.pipeline.summer_stages` (which
traces, not runs, each stage's part and its gradient on every replica: `stage_owners`) for a
benchmark's preset at P = 2 on 2 logical CPU devices, beside the model's build, in fresh traces
(each call makes its `tf.function` anew, as a run does once at build time).

    python tools/studies/stage_map_cost.py --benchmarks=llama31_8b:2,deepseekv3_671b:3 \
        [--preset=smoke] [--repeats=3]

(`name:P`: P stages on P logical CPU devices; P must divide the preset's layers or be declared.)

Prints one line per benchmark: the model's build seconds, the stage map's seconds per trace
(median and all), and which stage owns how many variables (and how many several stages read).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402 (after the log level)


def _devices(count: int) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
    )


def measure(name: str, preset: str, pipeline: int, repeats: int) -> str:
    import keras  # noqa: PLC0415 (after the devices are set)

    from mlperf_tf import registry  # noqa: PLC0415
    from mlperf_tf.benchmark import RunContext  # noqa: PLC0415
    from mlperf_tf.collectives import GradientSummer, Settings  # noqa: PLC0415
    from mlperf_tf.parallel.context import use_mesh  # noqa: PLC0415
    from mlperf_tf.parallel.mesh import build_mesh  # noqa: PLC0415
    from mlperf_tf.runner.pipeline import summer_stages  # noqa: PLC0415

    cls = registry.get(name)
    strategy = tf.distribute.MirroredStrategy(
        [f"CPU:{i}" for i in range(pipeline)], cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
    mesh = build_mesh(pipeline, pipeline_parallel=pipeline)
    context = RunContext(num_replicas=pipeline, seed=1, mesh=mesh, collective_timeout_s=60.0)
    benchmark = cls(cls.preset(preset)).with_context(context)
    keras.utils.set_random_seed(1)
    summer = GradientSummer(strategy, Settings(all_reduce="ring"), mesh)
    with strategy.scope(), use_mesh(mesh):
        begin = time.perf_counter()
        model = benchmark.build_model()
        built = time.perf_counter() - begin
        seconds, stages = [], None
        for _ in range(repeats):
            begin = time.perf_counter()
            stages = summer_stages(strategy=strategy, benchmark=benchmark, model=model,
                                   summer=summer)  # fmt: skip
            seconds.append(time.perf_counter() - begin)
    owners = (
        "None"
        if stages is None
        else {s: stages.owners.count(s) for s in sorted(set(stages.owners))}
    )
    shared = () if stages is None else stages.shared
    return (
        f"{name} {preset} P{pipeline}: {len(model.trainable_variables)} variables, model built in "
        f"{built:.1f} s; stage map {statistics.median(seconds):.2f} s median of "
        f"{', '.join(f'{s:.2f}' for s in seconds)}; variables per stage {owners}, read by "
        f"several: {len(shared)}"
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--benchmarks", default="llama31_8b:2,deepseekv3_671b:3")
    parser.add_argument("--preset", default="smoke")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    cases = [(name, int(p)) for name, p in (c.split(":") for c in args.benchmarks.split(","))]
    _devices(max(p for _, p in cases))
    for name, pipeline in cases:
        print(measure(name, args.preset, pipeline, args.repeats), flush=True)


if __name__ == "__main__":
    main()
