"""Do the train loop's two traces train alike? The loop's first trace against its retrace, on the
same data, bitwise.

`Trainer.loop` is a `tf.function` whose first trace makes a variable (the stop flag's,
`mlperf_tf.preemption.StopRequest`), so TensorFlow traces it a second time and runs that second
trace. Making the flag's variable before the trace (the reverted `StopRequest.arm` of 2026-12-07)
runs the first trace instead and saves the second trace's warm-up time; ResNet-50's mini then
evaluated lower at its first eval in 4 runs (docs/benchmarks/resnet50.md). This runs one
benchmark preset for N steps twice, in two processes, one running each trace, with TensorFlow's
op determinism on (a fixed seed, deterministic kernels and input; input time is not measured),
the CPU defaults the `mlperf-tf` command sets (oneDNN on: unset, TensorFlow picks slower kernels
on AMD CPUs), and compares every model and optimizer variable afterwards.

    python tools/studies/loop_trace_ab.py [--benchmark=resnet50] [--preset=smoke] [--steps=6]
        [--seed=7]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

# One process's run, bounded: the mini's 176 steps took 3 min here under op determinism.
RUN_TIMEOUT_S = 3600


def _train(benchmark: str, preset: str, steps: int, seed: int, first_trace: bool, out: str):
    """One run in this process; writes its variables to `out` (.npz)."""
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # what `mlperf-tf` sets, before TF loads
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    tf.config.experimental.enable_op_determinism()
    from mlperf_tf import registry, runner  # noqa: PLC0415
    from mlperf_tf.runner import controller as controller_lib  # noqa: PLC0415
    from mlperf_tf.runner.actions import Action  # noqa: PLC0415

    build_loops = controller_lib.Controller._build_loops

    def build_loops_then_make_the_flag(self):
        build_loops(self)
        self.stop_request._variable()  # what `arm` did: the loop's first trace makes no variable

    if first_trace:
        controller_lib.Controller._build_loops = build_loops_then_make_the_flag

    class Keep(Action):
        def attach(self, controller):
            self.controller = controller

    keep = Keep()
    bench = registry.get(benchmark)
    with tempfile.TemporaryDirectory() as model_dir:
        config = runner.RunConfig(model_dir=model_dir, max_train_steps=steps, seed=seed)
        runner.run(bench(bench.preset(preset)), config, actions=[keep])
    controller = keep.controller
    values = {"model/" + v.path: v.numpy() for v in controller.model.variables}
    values.update({"optimizer/" + v.path: v.numpy() for v in controller.optimizer.variables})
    traces = len(controller.trainer.loop._list_all_concrete_functions())
    np.savez(out, **values)
    print(f"{'first' if first_trace else 'second'} trace run: {traces} trace(s) of the loop, "
          f"{len(values)} variables")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--benchmark", default="resnet50")
    parser.add_argument("--preset", default="smoke")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seed", type=int, default=7, help="non-zero: op determinism needs one")
    parser.add_argument("--_one", choices=("first", "second"), help=argparse.SUPPRESS)
    parser.add_argument("--_out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._one:
        _train(args.benchmark, args.preset, args.steps, args.seed, args._one == "first", args._out)
        return 0
    import numpy as np  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        outs = {}
        for which in ("second", "first"):
            outs[which] = os.path.join(tmp, f"{which}.npz")
            subprocess.run(
                [sys.executable, __file__, f"--benchmark={args.benchmark}",
                 f"--preset={args.preset}", f"--steps={args.steps}", f"--seed={args.seed}",
                 f"--_one={which}", f"--_out={outs[which]}"],
                check=True, timeout=RUN_TIMEOUT_S,
            )  # fmt: skip
        second, first = np.load(outs["second"]), np.load(outs["first"])
        differing = []
        for name in second.files:
            a, b = second[name].astype(np.float64), first[name].astype(np.float64)
            if a.shape != b.shape or not np.array_equal(a, b):
                scale = float(np.max(np.abs(a))) if a.size else 0.0
                diff = float(np.max(np.abs(a - b))) if a.shape == b.shape else float("inf")
                differing.append((diff / (scale or 1.0), name))
        print(f"{args.benchmark} {args.preset}, {args.steps} steps, seed {args.seed}: "
              f"{len(differing)} of {len(second.files)} variables differ between the loop's "
              "first trace and its retrace")  # fmt: skip
        for relative, name in sorted(differing, reverse=True)[:20]:
            print(f"  {name}: max difference {relative:.3g} of its largest value")
    return 0


if __name__ == "__main__":
    sys.exit(main())
