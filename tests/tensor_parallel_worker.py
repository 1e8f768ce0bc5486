"""Runs tensor-parallel BERT smoke steps as one of two MultiWorkerMirroredStrategy workers: the
model axis spans the two processes (M = 2, one replica per worker on a CPU host).

usage: TF_CONFIG=... python -m tests.tensor_parallel_worker OUT_NPZ STEPS
Saves the step losses and this worker's component of every trainable variable (its shard of a
split one, with the split dimension, -1 for a replicated one), in model order.

usage: TF_CONFIG=... python -m tests.tensor_parallel_worker OUT_NPZ eval
Evaluates the Transformer smoke model (beam search, `test_tensor_parallel_eval`'s weights) and
saves its hypotheses by eval index and its BLEU.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from mlperf_tf.benchmark import RunContext  # noqa: E402
from mlperf_tf.collectives import GradientSummer, Settings  # noqa: E402
from mlperf_tf.collectives.ops import replica_collectives  # noqa: E402
from mlperf_tf.parallel import layout as layout_lib  # noqa: E402
from mlperf_tf.parallel.context import use_mesh  # noqa: E402
from mlperf_tf.parallel.input import for_mesh  # noqa: E402
from mlperf_tf.parallel.mesh import build_mesh  # noqa: E402
from tests.tensor_parallel import make_optimizer  # noqa: E402

TIMEOUT_S = 60


def bert_benchmark():
    """BERT smoke with dropout off and 4 heads (as the single-process exactness tests)."""
    from tests.benchmarks.bert.test_tensor_parallel import benchmark  # noqa: PLC0415

    return benchmark()


def main(out_path: str, steps: int) -> None:
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=TIMEOUT_S)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    mesh = build_mesh(strategy.num_replicas_in_sync, model_parallel=2)
    context = RunContext(num_replicas=mesh.size, seed=1, mesh=mesh, static_shapes=True,
                         collective_timeout_s=TIMEOUT_S)  # fmt: skip
    benchmark = bert_benchmark().with_context(context)
    keras.utils.set_random_seed(1)
    summer = GradientSummer(strategy, Settings(all_reduce="ring", timeout_s=TIMEOUT_S), mesh)
    with strategy.scope(), use_mesh(mesh):
        model = benchmark.build_model()
        optimizer = make_optimizer("lamb", benchmark)
        variables = model.trainable_variables
        optimizer.build(variables)
        summer.build(optimizer, variables)
        layout_lib.split_slots(optimizer, mesh)
    data = iter(strategy.distribute_datasets_from_function(for_mesh(benchmark.train_dataset, mesh)))

    def replica_step(batch):
        replica_collectives(num_replicas=mesh.size, timeout_s=TIMEOUT_S)  # as the runner binds
        with tf.GradientTape() as tape:
            loss = benchmark.compute_loss(model, batch, training=True)
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]
        summer.apply(optimizer, grads, variables)
        return loss

    @tf.function
    def step(iterator):
        loss = strategy.run(replica_step, args=(next(iterator),))
        return strategy.reduce("sum", loss, axis=None) / mesh.group_size

    losses = [float(step(data)) for _ in range(steps)]
    arrays = {"losses": np.asarray(losses)}
    for i, v in enumerate(variables):
        layout = layout_lib.layout_of(v)
        (local,) = strategy.experimental_local_results(v.value)
        arrays[f"value_{i}"] = local.numpy()
        arrays[f"axis_{i}"] = np.asarray(layout.split_axis if layout.split else -1)
    np.savez(out_path, **arrays)
    print(f"done steps={steps} replicas={mesh.size}", flush=True)


def evaluate_transformer(out_path: str) -> None:
    from benchmarks.transformer import config as config_lib  # noqa: PLC0415
    from benchmarks.transformer.benchmark import TransformerBenchmark  # noqa: PLC0415
    from mlperf_tf.runner.evaluator import Evaluator  # noqa: PLC0415
    from tests.benchmarks.transformer import test_tensor_parallel_eval as eval_test  # noqa: PLC0415

    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=TIMEOUT_S)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    mesh = build_mesh(strategy.num_replicas_in_sync, model_parallel=2)
    context = RunContext(num_replicas=mesh.size, seed=1, mesh=mesh, collective_timeout_s=TIMEOUT_S)
    benchmark = TransformerBenchmark(config_lib.smoke(), context=context)
    keras.utils.set_random_seed(1)
    with strategy.scope(), use_mesh(mesh):
        model = benchmark.build_model()
        eval_test.set_diverse_weights(model, mesh)
    data = strategy.distribute_datasets_from_function(for_mesh(benchmark.eval_dataset, mesh))
    evaluator = Evaluator(strategy=strategy, benchmark=benchmark, model=model, dataset=data,
                          xla=False)  # fmt: skip
    state, bleu = eval_test.evaluate(evaluator, benchmark)
    arrays = {f"hypothesis_{i}": hypothesis for i, (hypothesis, _) in state.items()}
    np.savez(out_path, bleu=np.asarray(bleu), **arrays)
    print(f"done eval pairs={len(state)} bleu={bleu}", flush=True)


if __name__ == "__main__":
    if sys.argv[2] == "eval":
        evaluate_transformer(sys.argv[1])
    else:
        main(sys.argv[1], int(sys.argv[2]))
