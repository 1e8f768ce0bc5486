"""Runs the tiny benchmark in its own process, for multi-process runner tests.

usage: python -m tests.run_tiny MODEL_DIR WEIGHTS_NPZ [RunConfig field=value ...]
Saves the final weights to WEIGHTS_NPZ (one array per weight, in model order).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dataclasses  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import logging as absl_logging  # noqa: E402

from mlperf_tf import errors, preemption, runner  # noqa: E402
from tests.tiny_benchmark import TinyBenchmark, smoke, weights  # noqa: E402


class _Tiny(TinyBenchmark):
    """The tiny benchmark; TINY_OPTIMIZER=sgd|lars|lamb picks the collectives tests' optimizer."""

    def build_optimizer(self, train_steps):
        name = os.environ.get("TINY_OPTIMIZER")
        if not name:
            return super().build_optimizer(train_steps)
        from tests.mlperf_tf.collectives.harness import make_optimizer  # noqa: PLC0415

        return make_optimizer(name)


def main(argv):
    model_dir, weights_path, *fields = argv
    tf.config.experimental.enable_op_determinism()
    absl_logging.set_verbosity(absl_logging.INFO)  # the progress lines, as the CLI prints them
    types = {f.name: f.type for f in dataclasses.fields(runner.RunConfig)}
    kwargs = {}
    for item in fields:
        key, _, value = item.partition("=")
        kind = types[key]
        parse = {"bool": lambda v: v == "True", "int": int, "float": float}.get(kind, str)
        kwargs[key] = parse(value)
    cfg = dataclasses.replace(
        smoke(),
        max_epochs=float(os.environ.get("TINY_MAX_EPOCHS", "2")),
        eval_every_epochs=float(os.environ.get("TINY_EVAL_EVERY_EPOCHS", "1")),
    )
    stop = preemption.StopRequest()
    with preemption.handle_stop_signals(stop):  # as the CLI does
        run_config = runner.RunConfig(model_dir=model_dir, **kwargs)
        result = runner.run(_Tiny(cfg), run_config, stop_request=stop)
    np.savez(weights_path, *weights(result.model))
    print(
        f"done status={result.status} steps={result.steps} cause={result.cause.value}", flush=True
    )
    if result.cause is runner.StopCause.INTERRUPTED:
        sys.exit(errors.EXIT_INTERRUPTED)


if __name__ == "__main__":
    main(sys.argv[1:])
