"""The Transformer's eval (beam search, greedy decoding) on a model-parallel mesh: every model
shard's decoding loop issues the split layers' all-reduces, the shards' loops meet (they
deadlocked before `collectives.ops.loop_function`), and the translations and BLEU equal the
unsplit model's on the same whole weights."""

import dataclasses

import keras
import numpy as np
import pytest

from benchmarks.transformer import config as config_lib
from benchmarks.transformer.benchmark import TransformerBenchmark
from mlperf_tf.benchmark import RunContext
from mlperf_tf.parallel import layout as layout_lib
from mlperf_tf.parallel.context import use_mesh
from mlperf_tf.parallel.input import for_mesh
from mlperf_tf.parallel.mesh import build_mesh
from mlperf_tf.runner.evaluator import Evaluator
from tests import strategies

pytestmark = pytest.mark.numerics
WEIGHT_STD = 0.15  # at the initializer's scale the model repeats one id; at 1.5 too


def set_diverse_weights(model, mesh) -> None:
    """Other weights than the initializer's, drawn whole (the same for every split and process):
    the untrained model then translates each sentence differently and scores a BLEU above 0
    (0.005 at M=1 for beam 4), where at its initial weights it repeats one id."""
    rng = np.random.default_rng(7)
    for v in model.variables:
        layout = layout_lib.layout_of(v)
        whole = list(v.shape)
        if layout.split:
            whole[layout.split_axis] *= layout.num_shards(mesh)
        if len(whole) == 2:  # kernels and the embedding; layer norms keep 1 and 0
            layout_lib.assign_whole(v, rng.normal(0.0, WEIGHT_STD, whole), mesh)


def evaluate(evaluator, benchmark):
    """The eval state {index: (hypothesis, target)} of one pass, and its BLEU."""
    iterator, state = iter(evaluator.dataset), benchmark.eval_begin()
    for _ in range(evaluator.steps):
        outputs = evaluator.step(iterator)
        state = benchmark.eval_reduce(state, {k: v.numpy() for k, v in outputs.items()})
    return state, benchmark.eval_result(state)


def _evaluate(model_parallel: int, beam_size: int):
    """(whole weights, eval state {index: (hypothesis, target)}, BLEU) of the smoke Transformer
    at its seeded initial weights on 2 logical CPUs split as `model_parallel` model shards."""
    c = config_lib.smoke()
    c = dataclasses.replace(c, model=dataclasses.replace(c.model, beam_size=beam_size))
    mesh = build_mesh(2, model_parallel=model_parallel)
    context = RunContext(num_replicas=2, seed=1, mesh=mesh, collective_timeout_s=60)
    benchmark = TransformerBenchmark(c, context=context)
    strategy = strategies.mirrored(2)
    keras.utils.set_random_seed(1)
    with strategy.scope(), use_mesh(mesh):
        model = benchmark.build_model()
        set_diverse_weights(model, mesh)
        weights = [np.asarray(layout_lib.whole_value(v, mesh)) for v in model.variables]
    data = strategy.distribute_datasets_from_function(for_mesh(benchmark.eval_dataset, mesh))
    evaluator = Evaluator(strategy=strategy, benchmark=benchmark, model=model, dataset=data,
                          xla=False)  # fmt: skip
    return (weights, *evaluate(evaluator, benchmark))


# Beam 1 is extended (CI runs it after README's default run); the default run covers its case by
# test_model_parallel_eval_translates_as_the_unsplit_model[4] (the same split decoding loop at
# beam 4, the rules' eval) and test_beam_one_equals_greedy_on_a_transformer (beam 1 = greedy).
@pytest.mark.parametrize("beam_size", [4, pytest.param(1, marks=pytest.mark.extended)])
def test_model_parallel_eval_translates_as_the_unsplit_model(beam_size):
    ref_weights, ref, ref_bleu = _evaluate(1, beam_size)
    weights, got, bleu = _evaluate(2, beam_size)
    for a, b in zip(weights, ref_weights, strict=True):  # the same model, split or not
        np.testing.assert_array_equal(a, b)
    assert sorted(got) == sorted(ref) == list(range(8))  # every eval pair, counted once
    # Not trivial: the sentences' translations differ, and some n-grams match the references.
    assert len({tuple(ref[i][0]) for i in ref}) >= 4
    assert ref_bleu > 0
    for i in sorted(ref):
        np.testing.assert_array_equal(got[i][0], ref[i][0], err_msg=f"hypothesis {i}")
    assert bleu == ref_bleu


def test_each_replica_runs_the_decoding_loop_in_a_function_of_its_own():
    # Under MirroredStrategy the replicas' loops would be the ops `while` and `replica_1/while`
    # of one graph: TF keys a collective's executions by the loop frame (named after the op),
    # so their all-reduces never met. Each replica's loop now sits in a function of its own.
    c = config_lib.smoke()
    mesh = build_mesh(2, model_parallel=2)
    benchmark = TransformerBenchmark(
        c, context=RunContext(num_replicas=2, seed=1, mesh=mesh, collective_timeout_s=60)
    )
    strategy = strategies.mirrored(2)
    with strategy.scope(), use_mesh(mesh):
        model = benchmark.build_model()
    data = strategy.distribute_datasets_from_function(for_mesh(benchmark.eval_dataset, mesh))
    evaluator = Evaluator(strategy=strategy, benchmark=benchmark, model=model, dataset=data,
                          xla=False)  # fmt: skip
    graph = evaluator.step.get_concrete_function(iter(data)).graph.as_graph_def()
    outer_loops = [n.name for n in graph.node if n.op in ("While", "StatelessWhile")]
    assert outer_loops == []
    calls = [n for n in graph.node if n.op == "StatefulPartitionedCall"]
    assert sorted(n.device[-5:] for n in calls) == ["CPU:0", "CPU:1"]
    bodies = {f.signature.name: f for f in graph.library.function}
    for call in calls:
        loops = [n.name for n in bodies[call.attr["f"].func.name].node_def if "While" in n.op]
        assert loops == ["while"]  # the same name, so the same frame, on both replicas
        assert "_noinline" in bodies[call.attr["f"].func.name].attr
