"""Measures the training step of a language model under context parallelism (`--context_parallel`)
against the unsplit layout, at the same global batch on the same logical CPU devices, in
interleaved rounds (the pipeline's cases belong here too: `--layouts` names each case).

Layouts on 4 logical CPU devices, every one at the same global batch of sequences:

| case | mesh | per replica |
|---|---|---|
| `c1` | data 4 | B/4 whole sequences |
| `c2` | data 2 x context 2 | B/2 sequences, 2 of their 4 zig-zag chunks; k/v gathered over 2 |
| `p1` | data 4 | B/4 whole sequences, the whole model (the same as `c1`) |
| `p2` | data 2 x pipeline 2 | B/2 sequences in micro-batches of `--micro_batch_size` through half the layers (1F1B) |

For the pipeline, the same limits hold: a stage's idle tick is not idle hardware (the other
stages use the cores), so the ratio is the exchanges' and the unrolled schedule's overhead;
`mlperf-tf bench --pipeline_parallel=P` reports the bubble the stages measured beside the
schedule's (P - 1) / (M + P - 1) (on shared cores it counts the exchanges' latency as idle).

What a CPU can show: that the split runs, its collectives' overhead on one host (the all-gather
of k and v and its backward all-reduce per layer, the weight-total all-reduce), and that the
attention work per replica is balanced (zig-zag) at equal tokens per replica: c1 and c2 hold the
same tokens per replica, c2 computes each query against twice the keys but for half the
sequences, so the attention FLOPs per replica are equal and the matmuls are the same sizes.
What it cannot show: any speed-up or the memory it buys. The 4 "devices" share the machine's
cores, so a layout never computes faster; and what context parallelism is for, a sequence whose
activations do not fit one chip (each member holds S/C tokens' activations), only shows against
a layout that holds the whole sequence on one replica at the same data groups, which on logical
devices is time-sliced on the same cores too. The printed ratio is overhead, not speed-up.

    python tools/studies/bench_pp_cp.py [--layouts=c1,c2|p1,p2] [--seq_length=256] [--batch=8]
        [--steps=3] [--rounds=5] [--micro_batch_size=1] [--layers=4]
"""

from __future__ import annotations

import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

from tools import harness  # noqa: E402

NUM_DEVICES = 4
# Case name -> the mesh flags of `mlperf_tf.parallel.mesh.build_mesh`.
LAYOUTS = {
    "c1": {},
    "c2": {"context_parallel": 2},
    "p1": {},
    "p2": {"pipeline_parallel": 2},
    "p4": {"pipeline_parallel": 4},
}


def make_contestant(strategy, base, flags: dict, micro_batch_size: int = 0):
    """A `run(steps)` callable: the runner's `Trainer` training `base` on the mesh of `flags`
    (its batches routed over the mesh, each gradient summed by the runner's summer)."""
    from mlperf_tf.benchmark import RunContext  # noqa: PLC0415
    from mlperf_tf.collectives import GradientSummer, Settings  # noqa: PLC0415
    from mlperf_tf.parallel.input import for_mesh  # noqa: PLC0415
    from mlperf_tf.parallel.mesh import build_mesh  # noqa: PLC0415

    mesh = build_mesh(NUM_DEVICES, **flags)
    context = RunContext(num_replicas=NUM_DEVICES, seed=1, mesh=mesh, static_shapes=True,
                         micro_batch_size=micro_batch_size)  # fmt: skip
    benchmark = base.with_context(context)
    parts = harness.runner_parts(
        strategy, benchmark, dataset_fn=for_mesh(benchmark.train_dataset, mesh),
        summer=GradientSummer(strategy, Settings(all_reduce="ring"), mesh),
    )  # fmt: skip
    return parts.run


def main(argv=None) -> None:
    parser = harness.rounds_parser(__doc__.splitlines()[0], steps=3)
    parser.add_argument("--layouts", default="c1,c2", help=f"cases of {', '.join(LAYOUTS)}")
    parser.add_argument("--seq_length", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8, help="global batch (sequences)")
    parser.add_argument(
        "--micro_batch_size",
        type=int,
        default=1,
        help="sequences per pipeline micro-batch (0: the data group's batch)",
    )
    parser.add_argument("--layers", type=int, default=4, help="decoder layers (P divides them)")
    args = harness.parse_rounds(parser, argv, "seq_length", "batch")
    layouts = harness.comma_list(parser, args.layouts, "--layouts")
    for name in layouts:
        if name not in LAYOUTS:
            parser.error(f"--layouts: {name!r} is not one of {', '.join(LAYOUTS)}")

    import tensorflow as tf  # noqa: PLC0415

    from benchmarks.llama31_8b.benchmark import Llama31Benchmark  # noqa: PLC0415
    from mlperf_tf import config as config_lib  # noqa: PLC0415

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_DEVICES
    )
    strategy = harness.mirrored_cpus(NUM_DEVICES)
    config = config_lib.override(
        Llama31Benchmark.preset("smoke"),
        {
            "data.max_sequence_length": str(args.seq_length),
            "model.max_position_embeddings": str(max(args.seq_length, 131072)),
            "global_batch_size": str(args.batch),
            "model.num_hidden_layers": str(args.layers),
        },
    )
    base = Llama31Benchmark(config)
    contestants = {
        name: make_contestant(strategy, base, LAYOUTS[name], args.micro_batch_size)
        for name in layouts
    }
    harness.warm_up(contestants)
    result = harness.interleaved_rounds(
        contestants, steps=args.steps, rounds=args.rounds, samples_per_step=args.batch
    )
    print(f"llama31_8b smoke model, sequence {args.seq_length}, global batch {args.batch}, "
          f"{NUM_DEVICES} logical CPU devices; load {harness.load_average()}")  # fmt: skip
    print(harness.report(result, reference=layouts[0], unit="sequences"))


if __name__ == "__main__":
    main()
