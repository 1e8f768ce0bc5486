"""DeepSeek-V3's selection bias moves once per optimizer step inside the compiled step
(`LanguageModelBenchmark.after_update`), on the step's choices per expert summed over its
micro-batches and replicas, as Megatron-LM's `_update_router_expert_bias`
(`megatron/core/distributed/finalize_model_grads.py`) and `get_updated_expert_bias`
(`megatron/core/transformer/moe/moe_utils.py`) do: checked against a NumPy transcription of that
update applied after each single step, at 4 steps a host loop, and split over data, expert and
pipeline axes against one device on the same tokens.

The rate is 0.1 (the reference's is 1e-3) so that the bias, not the router's small initial
scores, decides the choices: each step's load then depends on the steps before, and an update
once per host loop (rate x steps on the loop's mean load) ends elsewhere."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.deepseekv3_671b.benchmark import DeepseekV3Benchmark
from mlperf_tf.layers import moe
from tests import pipeline_runs
from tests.numerics import assert_close

pytestmark = pytest.mark.numerics

RATE = 0.1
STEPS = 4


# The default tests' model: a dense and an MoE layer, no MTP (tracing the smoke model's three
# layers and MTP costs about twice the CPU); the slow ones run the whole smoke model.
SMALL = {"model__num_hidden_layers": 2, "model__mtp_layers": 0}


def _bench(rate: float = RATE, accumulation: int = 2, **overrides):
    return pipeline_runs.benchmark_of(
        DeepseekV3Benchmark, gradient_accumulation_steps=accumulation,
        model__moe__bias_update_rate=rate, **overrides,
    )  # fmt: skip


def _tokens(bench, steps: int) -> np.ndarray:
    """[steps x micro-batches, micro-batch, seq + 1] random tokens: every micro-batch its own."""
    cfg = bench.config
    micro = cfg.global_batch_size // cfg.gradient_accumulation_steps
    seq, vocab = cfg.data.max_sequence_length, cfg.model.vocab_size
    rng = np.random.default_rng(7)
    return rng.integers(0, vocab, (steps * cfg.gradient_accumulation_steps, micro, seq + 1))


def _dataset_fn(tokens: np.ndarray):
    """Input context -> each batch shard's rows of every micro-batch in turn (the strategy hands
    consecutive elements to consecutive replicas), so a split run reads the same tokens as one
    device."""

    def fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        shards = context.num_replicas_in_sync
        per = tokens.shape[1] // shards
        parts = tokens.reshape(tokens.shape[0] * shards, per, tokens.shape[2]).astype(np.int32)
        return tf.data.Dataset.from_tensor_slices(parts).map(
            lambda t: {"input_ids": t[:, :-1], "labels": t[:, 1:]}
        )

    return fn


def _megatron_update(bias: np.ndarray, tokens_per_expert: np.ndarray, rate: float) -> np.ndarray:
    """`get_updated_expert_bias`: bias + sign(mean over experts - tokens) x rate, per layer."""
    average = tokens_per_expert.sum(-1, keepdims=True) / tokens_per_expert.shape[-1]
    return bias + np.sign(average - tokens_per_expert) * rate


def _biases(run) -> np.ndarray:
    """[MoE layers, experts] of a run's selection biases, in model order."""
    return np.stack([v for k, v in run.non_trainable.items() if k.endswith("router_bias")])


@pytest.fixture(scope="module")
def one_device():
    """(benchmark, tokens, run): `STEPS` steps of the small model in one host loop on one
    device (2 micro-batches a step), shared by the NumPy check and the D2 comparison."""
    bench = _bench(**SMALL)
    tokens = _tokens(bench, STEPS)
    run = pipeline_runs.train(
        bench, num_devices=1, steps=STEPS, steps_per_loop=STEPS, dataset_fn=_dataset_fn(tokens)
    )
    return bench, tokens, run


def test_the_bias_moves_every_step_of_a_host_loop_as_megatron_s_update(one_device):
    """4 steps in one host loop (micro-batches 2) against 4 single-step loops with the bias
    moved between them by the NumPy update on each step's choices (`moe/tokens_per_expert`,
    summed over the 2 micro-batches): the same biases and weights."""
    bench, tokens, got = one_device
    accumulation = bench.config.gradient_accumulation_steps
    top_k, seq = bench.config.model.moe.top_k, bench.config.data.max_sequence_length
    choices = top_k * bench.config.global_batch_size * seq  # per layer and step

    def numpy_update(model, metrics):
        # The loop's metric: its one step's mean over the micro-batches.
        counts = np.asarray(metrics[moe.TOKENS_PER_EXPERT]) * accumulation  # [layers, E]
        np.testing.assert_array_equal(counts.sum(-1), choices)
        for layer, layer_counts in zip(model.moe_layers, counts, strict=True):
            layer.router_bias.assign(
                _megatron_update(layer.router_bias.numpy(), layer_counts, RATE)
            )

    # The reference's step does not move the bias (rate 0): the NumPy update does, after it.
    ref = pipeline_runs.train(
        _bench(rate=0.0, **SMALL), num_devices=1, steps=STEPS, dataset_fn=_dataset_fn(tokens),
        between_loops=numpy_update,
    )  # fmt: skip
    expected = _biases(ref)
    assert_close(_biases(got), expected, rtol=1e-6)
    # The per-step updates: a bias of 2 or 0 steps' rate where signs alternated, which one
    # update of 4 x rate on the loop's mean load cannot give.
    steps_moved = np.round(np.abs(expected) / RATE).astype(int)
    assert set(steps_moved.ravel()) - {0, 4}, steps_moved
    for name, value in ref.weights.items():
        assert_close(got.weights[name], value, rtol=1e-5, err_msg=name)


def _assert_split_equals(ref, bench, tokens, steps: int, **split) -> None:
    """`steps` steps in one host loop on 2 devices split as `split`, each replica reading its
    own half of every micro-batch: the biases (some moved) and weights of `ref`, one device
    reading the whole micro-batches."""
    got = pipeline_runs.train(
        bench, num_devices=2, steps=steps, steps_per_loop=steps, dataset_fn=_dataset_fn(tokens),
        **split,
    )  # fmt: skip
    assert got.trainer.benchmark.mesh.batch_shards == 2
    assert np.any(_biases(ref) != 0.0)
    assert_close(_biases(got), _biases(ref), rtol=1e-6)
    for name, value in ref.weights.items():
        assert_close(got.weights[name], value, rtol=1e-5, err_msg=name)


def test_d2_moves_the_bias_on_the_load_summed_over_replicas(one_device):
    """D2 at 4 steps a loop against one device (the small model)."""
    bench, tokens, ref = one_device
    _assert_split_equals(ref, bench, tokens, STEPS)


@pytest.mark.slow  # expert-split variables and the collectives' summer: about a minute of CPU
def test_e2_moves_the_bias_on_the_load_summed_over_replicas():
    """E2 (the routed experts split, the tokens exchanged by all-to-all) at 3 steps a loop,
    the whole smoke model (MTP's MoE layer too), against one device."""
    bench = _bench()
    tokens = _tokens(bench, 3)
    ref = pipeline_runs.train(
        bench, num_devices=1, steps=3, steps_per_loop=3, dataset_fn=_dataset_fn(tokens)
    )
    _assert_split_equals(ref, bench, tokens, 3, expert_parallel=2)


@pytest.mark.slow  # a pipelined run: about a minute of CPU
def test_pipelined_each_stage_s_layers_move_on_that_stage_s_load():
    """P2 of 3 layers as 2 + 1 (a dense and an MoE layer on the first stage; an MoE layer and
    MTP's on the last, `DecoderStage`): each stage's MoE rows of the choices, combined over the
    stages, move its layers' biases as on one device."""
    bench = _bench(model__pipeline_layers="2+1")
    tokens = _tokens(bench, 3)
    ref = pipeline_runs.train(
        bench, num_devices=1, steps=3, steps_per_loop=3, dataset_fn=_dataset_fn(tokens)
    )
    got = pipeline_runs.train(
        bench, num_devices=2, pipeline=2, steps=3, steps_per_loop=3, dataset_fn=_dataset_fn(tokens)
    )
    biases = _biases(ref)
    assert biases.shape[0] == 3 and np.all(np.any(biases != 0.0, axis=1))  # every MoE layer
    assert_close(_biases(got), biases, rtol=1e-6)
