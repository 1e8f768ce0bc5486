"""qwen35_397b_grpo under expert and tensor parallelism: GRPO update steps on fixed rollout
batches (4 logical devices) end at the unsplit run's weights (E2: the unsplit run dispatches
every expert on its replica's tokens, the split one sends the tokens to the experts' replicas by
all-to-all; M2: the heads of the attention and the DeltaNet, the shared expert and the
vocabulary split over `model`), and the compiled generator on the split model (2 logical
devices) gives the unsplit model's tokens for fixed seeds, also to two threads generating at
once; `run --model_parallel=2` as a process exits after `run_stop`; layouts the model cannot
take are one-line errors."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.qwen35_397b_grpo.benchmark import Qwen35GrpoBenchmark
from mlperf_tf.benchmark import RunContext
from mlperf_tf.errors import UserError
from mlperf_tf.parallel.context import use_mesh
from mlperf_tf.parallel.mesh import DeviceMesh
from mlperf_tf.rl.generation import CompiledGenerator
from mlperf_tf.rl.grpo import PolicyLossConfig
from mlperf_tf.rl.split_decoding import for_generation
from tests import e2e, tensor_parallel

pytestmark = pytest.mark.numerics

ROWS, LENGTH = 2, 24  # rollouts per replica, tokens per rollout


class FixedRolloutsBenchmark(Qwen35GrpoBenchmark):
    """The benchmark reading fixed synthetic rollout batches instead of generating them: each
    batch shard its own (seeded by its input pipeline), so the replicas of the expert axis,
    which the unsplit run has as data replicas, read different rollouts."""

    def train_dataset(self, input_context):
        shard = input_context.input_pipeline_id
        rng = np.random.default_rng(100 + shard)
        vocab = self.config.model.vocab_size
        batches = []
        for _ in range(tensor_parallel.STEPS):
            ids = rng.integers(0, vocab, size=(ROWS, LENGTH + 1))
            mask = (rng.random((ROWS, LENGTH)) < 0.7).astype(np.float32)
            batches.append({
                "input_ids": ids[:, :-1].astype(np.int32),
                "targets": ids[:, 1:].astype(np.int32),
                "token_mask": mask,
                # Near the tiny model's (close to uniform) log-probs: importance weights != 1.
                "generation_logprobs": (-np.log(vocab) + 0.05 * rng.standard_normal(
                    (ROWS, LENGTH))).astype(np.float32),
                "advantages": rng.standard_normal(ROWS).astype(np.float32),
                "sample_mask": np.ones(ROWS, np.float32),
                "rewards": rng.integers(0, 2, ROWS).astype(np.float32),
                # The step's valid tokens over every shard: a share of each shard's loss.
                "valid_tokens": np.full(ROWS, 4 * ROWS * LENGTH * 0.7, np.float32),
                "trajectory_age": np.zeros(ROWS, np.float32),
            })  # fmt: skip
        return tf.data.Dataset.from_tensor_slices(
            {k: np.stack([b[k] for b in batches]) for k in batches[0]}
        ).repeat()


def _benchmark() -> FixedRolloutsBenchmark:
    """The smoke preset at rollouts of LENGTH + 1 tokens, ROWS rollouts per shard of 4, the
    importance weights untruncated (every rollout counts: the reference's 0.999 / 1.002 bounds
    would mask the synthetic ones) and the log-prob error mask loose; a vocabulary of 260 (the
    byte chat's 259 ids, one more so that M = 2 splits it)."""
    config = Qwen35GrpoBenchmark.preset("smoke")
    config = dataclasses.replace(config, model=dataclasses.replace(config.model, vocab_size=260))
    grpo = dataclasses.replace(
        config.grpo, num_prompts_per_step=2 * ROWS, seq_logprob_error_threshold=100.0,
        loss=PolicyLossConfig(truncated_importance_sampling_type=""),
    )  # fmt: skip
    rollout = dataclasses.replace(config.rollout, max_length=LENGTH + 1)
    config = dataclasses.replace(config, global_batch_size=4 * ROWS, grpo=grpo, rollout=rollout)
    return FixedRolloutsBenchmark(config)


@pytest.mark.slow  # 150-240 s each at load 8-10 (1.5-2 min of CPU): tracing on 4 replicas
@pytest.mark.parametrize(("expert_parallel", "model_parallel"), [(2, 1), (1, 2), (2, 2)],
                         ids=["E2", "M2", "E2xM2"])  # fmt: skip
def test_parallel_grpo_equals_the_unsplit_run(expert_parallel, model_parallel):
    """3 Adam steps of the GRPO loss on the smoke model (3 DeltaNet + 1 gated attention layers,
    4 experts top-2 dropless with a shared expert, router frozen) split on 4 logical devices
    against the unsplit run of the same batch shards: losses, first-step whole gradients and
    final whole weights at a scale-aware 1e-5. E2: the routed experts over `expert` (every
    replica reads its own rollouts); M2: the attention's and the DeltaNet's heads, the shared
    expert and the vocabulary over `model` (the log-probs from vocabulary shards)."""
    got = tensor_parallel.assert_split_equals_unsplit(
        _benchmark(), num_devices=4, model_parallel=model_parallel,
        expert_parallel=expert_parallel, optimizer="own", steps=3, rtol=1e-5,
    )  # fmt: skip
    assert any(np.max(np.abs(g)) > 0 for g in got.grads)


def test_an_expert_axis_that_does_not_divide_the_experts_is_one_line():
    bench = Qwen35GrpoBenchmark(
        Qwen35GrpoBenchmark.preset("smoke"), context=RunContext(mesh=DeviceMesh(expert=3))
    )
    with pytest.raises(UserError, match=r"--expert_parallel=3 must divide .*num_experts` \(4\)"):
        bench.build_model()


def test_a_model_axis_that_does_not_divide_the_deltanet_heads_is_one_line():
    """The tiny model's DeltaNet has 2 key heads (and 4 query heads: M = 4 splits those)."""
    config = Qwen35GrpoBenchmark.preset("smoke")
    config = dataclasses.replace(config, model=dataclasses.replace(config.model, vocab_size=260))
    bench = Qwen35GrpoBenchmark(config, context=RunContext(mesh=DeviceMesh(model=4)))
    with pytest.raises(UserError, match=r"--model_parallel=4 must divide .*linear_num_key_heads"):
        bench.build_model()


def _generated(bench, *, devices: int, temperature: float, keep_cache: bool = False,
               **mesh) -> list:  # fmt: skip
    """The compiled generator's rollouts of 3 fixed prompts by the model `bench` builds on
    `devices` logical CPUs split as `mesh` (Keras' seed 1: the same whole weights on every
    mesh), decoding through `for_generation` (the split model in replica context). With
    `keep_cache`, a session's two turns (the second continues each row's kept cache by its
    generated tokens and 3 more, `HybridDecoderModel.extend` at per-row positions): both
    turns' rollouts."""
    strategy, mesh, bench = tensor_parallel.on_mesh(bench, devices, **mesh)
    with strategy.scope(), use_mesh(mesh):
        model = bench.build_model()
    generator = CompiledGenerator(for_generation(model, mesh, strategy), capacity=48, bucket=16,
                                  keep_cache=keep_cache)  # fmt: skip
    session = generator.session()
    prompts = [[5, 17, 33, 9, 120], [200, 3], [44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54]]
    args = dict(max_new_tokens=8, eos_id=-1, pad_id=0, temperature=temperature, top_p=1.0,
                seeds=[11, 12, 13])  # fmt: skip
    first = session(prompts, **args)
    if not keep_cache:
        return first
    turn = [p + f.tokens + [7, 8, 9] for p, f in zip(prompts, first, strict=True)]
    return first + session(turn, **args)


@pytest.mark.slow  # 70 s each at load 10 (35 s of CPU): tracing the prefill and the step
@pytest.mark.parametrize(("expert_parallel", "model_parallel"), [(2, 1), (1, 2)],
                         ids=["E2", "M2"])  # fmt: skip
def test_split_generation_gives_the_unsplit_tokens(expert_parallel, model_parallel):
    """The compiled generator (prefill, then one compiled step a token over the fixed-capacity
    cache) on the model split over 2 logical devices gives the unsplit model's tokens, greedy
    and sampled at temperature 1 with fixed seeds, and their log-probs within 1e-5."""
    bench = _benchmark()
    for temperature in (0.0, 1.0):
        _assert_same_generation(bench, temperature, expert_parallel, model_parallel)


def _assert_same_generation(bench, temperature, expert_parallel, model_parallel, **kwargs):
    ref = _generated(bench, devices=1, temperature=temperature, **kwargs)
    got = _generated(bench, devices=2, temperature=temperature, expert_parallel=expert_parallel,
                     model_parallel=model_parallel, **kwargs)  # fmt: skip
    assert [g.tokens for g in got] == [r.tokens for r in ref]
    for g, r in zip(got, ref, strict=True):
        np.testing.assert_allclose(g.logprobs, r.logprobs, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # 36-39 s each at load 8-9
@pytest.mark.parametrize(("expert_parallel", "model_parallel"), [(2, 1), (1, 2)],
                         ids=["E2", "M2"])  # fmt: skip
def test_split_generation_with_kept_caches_gives_the_unsplit_tokens(expert_parallel,
                                                                   model_parallel):  # fmt: skip
    """A multi-turn session (`keep_cache`: the second turn appended to each row's kept cache
    at its own length, then the per-row step) on the split model: the unsplit model's tokens
    of both turns, sampled at temperature 1 with fixed seeds, and their log-probs."""
    _assert_same_generation(_benchmark(), 1.0, expert_parallel, model_parallel, keep_cache=True)


@pytest.mark.slow  # 17-63 s at load 6-10 (tracing the split prefill and step)
def test_two_threads_generating_on_the_split_model_take_turns():
    """Two threads generating at once with one compiled generator on the model split over
    `model` (as the training rollouts' and the evaluation's pipelines do in a run): each gets
    the tokens it gets alone, for 3 rounds. Without the split model's lock their collectives
    share instance keys and TensorFlow pairs them crosswise (measured: "BufRendezvous::
    ProvideBuf already called", every collective of the process failing after it). Every
    collective waits at most 60 s (`tensor_parallel.on_mesh`), the threads 300 s."""
    strategy, mesh, bench = tensor_parallel.on_mesh(_benchmark(), 2, model_parallel=2)
    with strategy.scope(), use_mesh(mesh):
        model = bench.build_model()
    generator = CompiledGenerator(for_generation(model, mesh, strategy), capacity=48, bucket=16)
    prompts = {"a": [[5, 17, 33, 9, 120], [200, 3], [44, 45, 46]], "b": [[7, 8], [1, 2, 3], [99]]}
    args = dict(max_new_tokens=8, eos_id=-1, pad_id=0, temperature=1.0, top_p=1.0,
                seeds=[11, 12, 13])  # fmt: skip
    alone = {k: [g.tokens for g in generator(p, **args)] for k, p in prompts.items()}
    for _ in range(3):
        got, errors = {}, []

        def generate(key, got=got, errors=errors):
            try:
                got[key] = [g.tokens for g in generator(prompts[key], **args)]
            except tf.errors.OpError as error:
                errors.append(error)

        threads = [threading.Thread(target=generate, args=(k,), daemon=True) for k in prompts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        assert not any(t.is_alive() for t in threads) and not errors
        assert got == alone


@pytest.mark.slow  # 190 s at load 6, 6-10 min at load 9-12 (tracing on 2 replicas, rollouts)
def test_a_model_parallel_smoke_run_exits_after_run_stop(tmp_path):
    """`mlperf-tf run --model_parallel=2` on 2 logical CPUs, as a user runs it (its own process
    and process group): it trains its 2 steps, evaluates, logs `tensor_parallelism` 2 and the
    steps' trajectory ages within the setting, and the process exits within 300 s of
    `run_stop` (it seemed to hang there once; the release of tf.data's iterators takes 6-138 s,
    measured in 8 runs, README "Parallelism"). A run that does not is killed (its process
    group, by its pid)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    model_dir = tmp_path / "m"
    out_path = tmp_path / "out.log"
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    command = [sys.executable, "-m", "mlperf_tf.cli", "run", "--benchmark=qwen35_397b_grpo",
               "--preset=smoke", "--num_cpu_devices=2", "--model_parallel=2",
               "--steps_per_loop=1", f"--model_dir={model_dir}"]  # fmt: skip
    with open(out_path, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   cwd=root, start_new_session=True)  # fmt: skip
    try:
        stopped = None
        deadline = time.monotonic() + 1500
        while process.poll() is None:
            now = time.monotonic()
            if stopped is None and "run_stop status" in out_path.read_text():
                stopped = now
            assert now < deadline, "no run_stop in 1,500 s"
            assert stopped is None or now - stopped < 300, "not exited 300 s after run_stop"
            time.sleep(1)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
    output = out_path.read_text()
    assert process.returncode == 0, output[-2000:]
    records = e2e.log_records(model_dir / "mlperf_log.txt")
    logged = {r["key"]: r["value"] for r in records}
    assert logged["tensor_parallelism"] == 2 and logged["expert_parallelism"] == 1
    ages = [float(a) for a in re.findall(r"avg_trajectory_age (\S+)", output)]
    assert len(ages) == 2 and ages[0] == 0.0 and ages[1] <= 1.0
    assert sum(r["key"] == "eval_accuracy" for r in records) == 2
