"""Loads the llama2_70b_lora base from a suite checkpoint as one of two MultiWorkerMirroredStrategy
workers with the model axis across them (M = 2, one replica per worker on a CPU host), through
`LoraBenchmark.restore_initial_weights` as a run does before `run_start`.

usage: TF_CONFIG=... python -m tests.benchmarks.llama2_70b_lora.load_worker BASE_DIR OUT_NPZ

Saves this worker's component of every base (non-adapter) variable with its split axis (-1 for a
replicated one), and the elements it read from the checkpoint (`SuiteCheckpoint.read` counted):
a worker must read only its shards.
"""

import dataclasses
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.llama2_70b_lora import checkpoint  # noqa: E402
from benchmarks.llama2_70b_lora import config as config_lib  # noqa: E402
from benchmarks.llama2_70b_lora.benchmark import LoraBenchmark  # noqa: E402
from mlperf_tf.benchmark import RunContext  # noqa: E402
from mlperf_tf.layers import lora as lora_lib  # noqa: E402
from mlperf_tf.parallel import layout as layout_lib  # noqa: E402
from mlperf_tf.parallel.context import use_mesh  # noqa: E402
from mlperf_tf.parallel.mesh import build_mesh  # noqa: E402

TIMEOUT_S = 60


def config(base_dir: str) -> config_lib.LoraBenchmarkConfig:
    """The smoke preset reading its base from `base_dir` (the test's reference uses it too)."""
    return dataclasses.replace(config_lib.smoke(), base_checkpoint=base_dir)


def is_base_weight(variable) -> bool:
    """A weight of the base model (not an adapter's, not a dropout's seed state)."""
    return not lora_lib.is_adapter_variable(variable) and "seed_generator" not in variable.path


def main(base_dir: str, out_path: str) -> None:
    read_elements = []
    original = checkpoint.SuiteCheckpoint.read

    def counted(self, name, index=None):
        value = original(self, name, index)
        read_elements.append(int(np.prod(np.shape(value))))
        return value

    checkpoint.SuiteCheckpoint.read = counted
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=TIMEOUT_S)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    mesh = build_mesh(strategy.num_replicas_in_sync, model_parallel=2)
    context = RunContext(num_replicas=mesh.size, seed=1, mesh=mesh,
                         collective_timeout_s=TIMEOUT_S)  # fmt: skip
    benchmark = LoraBenchmark(config(base_dir)).with_context(context)
    keras.utils.set_random_seed(1)
    with strategy.scope(), use_mesh(mesh):
        model = benchmark.build_model()
    benchmark.restore_initial_weights(model)
    arrays = {"read_elements": np.asarray(sum(read_elements))}
    base = [v for v in model.variables if is_base_weight(v)]
    for i, v in enumerate(base):
        layout = layout_lib.layout_of(v)
        (local,) = strategy.experimental_local_results(v.value)
        arrays[f"value_{i}"] = local.numpy()
        arrays[f"axis_{i}"] = np.asarray(layout.split_axis if layout.split else -1)
        arrays[f"path_{i}"] = np.asarray(v.path.split("/", 1)[1])
    np.savez(out_path, **arrays)
    print(f"done replicas={mesh.size} read={sum(read_elements)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
