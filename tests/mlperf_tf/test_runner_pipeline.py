"""Pipeline parallelism through the runner's `Trainer` (`mlperf_tf.runner.pipeline`): the smoke
Llama's layers in P stages on logical CPUs, its micro-batches in the 1F1B or GPipe schedule in
one compiled step, against the unpipelined run of the same batch shards and micro-batches
(losses and whole weights at a scale-aware 1e-5; measured: ~4e-9, float32 rounding of the
gradients' summation order), and checkpoints across P."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.deepseekv3_671b.benchmark import DeepseekV3Benchmark
from benchmarks.gpt_oss_20b.benchmark import GptOssBenchmark
from benchmarks.llama31_8b.benchmark import Llama31Benchmark
from mlperf_tf import checkpoints, runner
from mlperf_tf.benchmark import RunContext
from mlperf_tf.errors import UserError
from mlperf_tf.parallel.memory import ChipLayout
from mlperf_tf.parallel.mesh import DeviceMesh
from tests import noise_floor, pipeline_runs
from tests.numerics import assert_close
from tests.tiny_benchmark import weights

pytestmark = pytest.mark.numerics


def _assert_same(got: pipeline_runs.Run, ref: pipeline_runs.Run, rtol: float = 1e-5):
    assert_close(got.losses, ref.losses, rtol=rtol, err_msg="losses")
    scale = max(float(np.max(np.abs(w))) for w in ref.weights.values())
    assert got.weights.keys() == ref.weights.keys()
    for name, expected in ref.weights.items():
        np.testing.assert_allclose(
            got.weights[name], expected, rtol=rtol, atol=rtol * scale, err_msg=name
        )


def _llama(**overrides):
    return pipeline_runs.benchmark_of(Llama31Benchmark, gradient_accumulation_steps=2, **overrides)


@pytest.fixture(scope="module")
def llama_d2():
    """The unpipelined reference: data 2 on 2 devices, 2 micro-batches per step, clip 1."""
    return pipeline_runs.train(_llama(), num_devices=2, summer=True, clip_norm=1.0)


@pytest.mark.parametrize("schedule", ["1f1b", pytest.param("gpipe", marks=pytest.mark.slow)])
def test_d2_x_p2_equals_the_unpipelined_run(llama_d2, schedule):
    """Data 2 x pipeline 2 on 4 devices (one layer per stage) ends at data 2's weights, clipped
    to the whole model's norm; every replica's copy is the same, and the loss is reported once
    per batch shard."""
    got = pipeline_runs.train(
        _llama(), num_devices=4, pipeline=2, schedule=schedule, summer=True, clip_norm=1.0
    )
    _assert_same(got, llama_d2)
    assert got.losses[1] < got.losses[0]
    assert got.trainer.pipeline.schedule.kind == schedule
    assert got.trainer.pipeline.schedule.micro_batches == 2


@pytest.mark.slow
def test_keras_sum_and_four_stages():
    """P = 4 (4 layers, one per stage) under Keras' own sum (a sparse embedding gradient made
    dense on every stage) against one device with the summer's dense sum."""
    bench = _llama(**{"model.num_hidden_layers": 4})
    ref = pipeline_runs.train(bench, num_devices=1, summer=True, clip_norm=1.0)
    got = pipeline_runs.train(bench, num_devices=4, pipeline=4, clip_norm=1.0)
    _assert_same(got, ref)


@pytest.mark.slow
def test_p2_x_m2_equals_tensor_parallel_alone():
    """Pipeline 2 x model 2 (4 devices, data 1) against model 2 alone on 2 devices."""
    bench = _llama(**{"model.num_attention_heads": 4})
    ref = pipeline_runs.train(bench, num_devices=2, model_parallel=2, clip_norm=1.0)
    got = pipeline_runs.train(bench, num_devices=4, pipeline=2, model_parallel=2, clip_norm=1.0)
    _assert_same(got, ref)


@pytest.mark.slow
def test_gpt_oss_expert_x_pipeline_equals_expert_alone():
    """GPT-OSS smoke (MoE in every block, sinks, windows): E2 x P2 against E2 on 2 devices,
    the MoE auxiliary losses of both stages in the gradient and the metrics whole."""
    bench = pipeline_runs.benchmark_of(GptOssBenchmark, gradient_accumulation_steps=2)
    ref = pipeline_runs.train(bench, num_devices=2, expert_parallel=2, clip_norm=1.0)
    got = pipeline_runs.train(bench, num_devices=4, expert_parallel=2, pipeline=2, clip_norm=1.0)
    _assert_same(got, ref)


@pytest.mark.slow
def test_a_checkpoint_at_p2_resumes_at_p1_and_the_reverse(tmp_path, llama_d2):
    """One step at P = 2, saved, one more at P = 1 (and the reverse) end at the unbroken run."""
    bench = _llama()
    for first, second, name in ((2, 1, "p2"), (1, 2, "p1")):
        path = str(tmp_path / name)
        pipeline_runs.train(bench, num_devices=2 * first, pipeline=first, steps=1, summer=True,
                            clip_norm=1.0, save_to=path)  # fmt: skip
        resumed = pipeline_runs.train(bench, num_devices=2 * second, pipeline=second, steps=1,
                                      summer=True, clip_norm=1.0, restore_from=path)  # fmt: skip
        for key, expected in llama_d2.weights.items():
            np.testing.assert_allclose(resumed.weights[key], expected, rtol=1e-5, atol=1e-7)


def test_p_not_dividing_the_layers_is_one_line():
    bench = _llama().with_context(RunContext(num_replicas=3, mesh=DeviceMesh(pipeline=3)))
    with pytest.raises(UserError, match=r"--pipeline_parallel=3 must divide") as error:
        bench.build_model()
    assert "\n" not in str(error.value)


def _llama_uneven():
    """The smoke Llama at 3 layers with the declared P = 2 map 2 + 1 (`pipeline_layers`)."""
    return _llama(model__num_hidden_layers=3, model__pipeline_layers="2+1")


def test_a_declared_uneven_split_is_the_stages_layers():
    """Cheap (no training): at P = 2 the stages run layers [0, 2) and [2, 3), and send one
    activation shape, so the exchange is that of equal stages; the unsplit model is the same."""
    bench = _llama_uneven().with_context(RunContext(num_replicas=2, mesh=DeviceMesh(pipeline=2)))
    model = bench.build_model()
    stages = [bench.pipeline_stage(model, s, 2) for s in range(2)]
    assert [(p.first, p.end) for p in stages] == [(0, 2), (2, 3)]
    batch = {"input_ids": tf.zeros([2, 32], tf.int32)}
    assert stages[0].activation_shape(batch) == stages[1].activation_shape(batch) == [2, 32, 32]


def test_an_undeclared_uneven_p_names_the_maps():
    bench = _llama_uneven().with_context(RunContext(num_replicas=4, mesh=DeviceMesh(pipeline=4)))
    with pytest.raises(UserError, match=r"--pipeline_parallel=4 must divide .*declared: 2\+1\)$"):
        bench.build_model()


@pytest.mark.slow  # two runs: 42 s (2026-12-06, load 8)
def test_d2_x_p2_with_an_uneven_declared_split_equals_the_unpipelined_run():
    """Data 2 x pipeline 2 on 4 devices with 3 layers as 2 + 1 ends at data 2's weights."""
    ref = pipeline_runs.train(_llama_uneven(), num_devices=2, summer=True, clip_norm=1.0)
    got = pipeline_runs.train(
        _llama_uneven(), num_devices=4, pipeline=2, summer=True, clip_norm=1.0
    )
    part = got.trainer.benchmark.pipeline_stage(got.trainer.model, 1, 2)
    assert (part.first, part.end) == (2, 3)
    _assert_same(got, ref)
    assert got.losses[1] < got.losses[0]


@pytest.mark.slow
def test_xla_compiles_the_stages():
    """With --xla each stage's forward pass and gradient are compiled (the exchanges stay
    outside: XLA has no collectives on CPUs): P2 on 2 devices against one device without XLA
    (measured: 2.5e-7, XLA's fused float32 arithmetic)."""
    bench = _llama()
    ref = pipeline_runs.train(bench, num_devices=1, summer=True, clip_norm=1.0)
    got = pipeline_runs.train(bench, num_devices=2, pipeline=2, summer=True, clip_norm=1.0,
                              xla=True)  # fmt: skip
    _assert_same(got, ref)


def _stage_shares(run: pipeline_runs.Run, data: int) -> list[int]:
    """Per stage, the slot elements its replicas must hold: its variables' even pieces over
    the data axis (ceil(n / D) each), once per Adam moment (a Python transcription)."""
    summer = run.trainer.summer
    variables = run.trainer.model.trainable_variables
    shares = [0] * run.trainer.benchmark.mesh.pipeline
    for variable, stage in zip(variables, summer.owners, strict=True):
        shares[stage] += -(-int(np.prod(variable.shape)) // data) * 2
    return shares


# Extended (CI runs it after README's default run); the default run covers its case by
# test_d2_x_p2_equals_the_unpipelined_run and collectives/test_stage_local.py (stage-local Adam).
@pytest.mark.extended
def test_stage_sharded_update_holds_the_stage_s_moments_and_ends_at_the_unpipelined_run(
    llama_d2,
):
    """With --weight_update_sharding on D2 x P2 the update is sharded by the stage map: the
    embedding and layer 0 on stage 0, layer 1, the final norm and the head on stage 1; each
    replica holds its stage's Adam moments split over the data axis (counted on every replica's
    buffers: the largest stage's share, not the whole model's), and the run ends at data 2's
    weights, clipped to the whole model's norm."""
    got = pipeline_runs.train(_llama(), num_devices=4, pipeline=2, summer=True, clip_norm=1.0,
                              weight_update_sharding=True)  # fmt: skip
    _assert_same(got, llama_d2)
    summer = got.trainer.summer
    paths = [v.path for v in got.trainer.model.trainable_variables]
    by_stage = {s: [p for p, o in zip(paths, summer.owners, strict=True) if o == s] for s in (0, 1)}
    assert any("token_embedding" in p for p in by_stage[0])
    assert all("decoder_1" not in p and "lm_head" not in p for p in by_stage[0])
    assert any("lm_head" in p for p in by_stage[1]) and any("final_norm" in p for p in by_stage[1])
    shares = _stage_shares(got, data=2)
    whole = sum(int(np.prod(v.shape)) for v in got.trainer.model.trainable_variables) * 2
    strategy = got.trainer.strategy
    for buffer in summer.stage_slots.variables():
        held = [int(np.prod(c.shape)) for c in strategy.experimental_local_results(buffer)]
        assert held == [held[0]] * 4
    held = sum(
        int(np.prod(strategy.experimental_local_results(b)[0].shape))
        for b in summer.stage_slots.variables()
    )
    assert held == max(shares)
    assert held < 0.75 * whole / 2  # the data axis alone would hold half of the whole
    assert summer.slot_bytes_per_replica() == 4 * held
    # What `parallel/memory.py` predicts for the worst chip's stage: its Adam moments (float32)
    # against the elements that stage's buffers hold (equal but for the pieces' rounding up).
    predicted = got.trainer.benchmark.memory_per_chip(
        ChipLayout(pipeline=2, data=2, shard_moments=True)
    )
    np.testing.assert_allclose(predicted.moments, 4 * shares[predicted.stage], rtol=0.01)


# Extended (CI runs it after README's default run); the default run covers its case by
# test_d2_x_p2_equals_the_unpipelined_run and collectives/test_stage_local.py (stage-local Adam
# saves the unsharded format).
@pytest.mark.extended
def test_without_the_flag_each_stage_holds_its_moments_whole_and_saves_the_p1_format(
    tmp_path, llama_d2
):
    """Without --weight_update_sharding, D2 x P2's update is stage-local too: each replica holds
    its stage's Adam moments whole (the largest stage's elements, counted on every replica's
    buffers against a transcription of the stage map; not divided by data), the run ends at
    data 2's weights, `memory.py` predicts those moments, and the checkpoint holds them under
    the optimizer's own keys (what the P = 1 run without the flag saves), none apart."""
    path = str(tmp_path / "p2")
    got = pipeline_runs.train(_llama(), num_devices=4, pipeline=2, summer=True, clip_norm=1.0,
                              save_to=path)  # fmt: skip
    _assert_same(got, llama_d2)
    summer = got.trainer.summer
    assert summer.stage_local and not summer.sharded
    shares = _stage_shares(got, data=1)
    strategy = got.trainer.strategy
    held = [0] * 4
    for buffer in summer.stage_slots.variables():
        for replica, component in enumerate(strategy.experimental_local_results(buffer)):
            held[replica] += int(np.prod(component.shape))
    assert held == [max(shares)] * 4
    whole = sum(int(np.prod(v.shape)) for v in got.trainer.model.trainable_variables) * 2
    assert max(shares) < 0.75 * whole
    predicted = got.trainer.benchmark.memory_per_chip(ChipLayout(pipeline=2, data=2))
    np.testing.assert_allclose(predicted.moments, 4 * shares[predicted.stage], rtol=0.01)
    stored = _checkpoint(path)
    assert not any(k.startswith("sharded_slots") for k in stored)
    optimizer = checkpoints.read_part(path, checkpoints.OPTIMIZER_PART)
    assert set(optimizer) == {"iteration", "learning_rate", *summer.slot_paths()}
    for key in summer.slot_paths():
        assert np.abs(optimizer[key]).max() > 0, key  # every moment moved, none left at zero


@pytest.mark.slow
def test_stage_sharded_update_of_p2_alone_and_of_gpt_oss_e2_x_p2():
    """P2 on 2 devices (no data axis: each stage updates its variables whole) against one
    device, and GPT-OSS E2 x P2 (expert weights and replicated ones in their own sum groups on
    each stage) against E2 alone."""
    bench = _llama()
    ref = pipeline_runs.train(bench, num_devices=1, summer=True, clip_norm=1.0)
    got = pipeline_runs.train(bench, num_devices=2, pipeline=2, summer=True, clip_norm=1.0,
                              weight_update_sharding=True)  # fmt: skip
    _assert_same(got, ref)
    assert got.trainer.summer.slot_bytes_per_replica() == 4 * max(_stage_shares(got, data=1))
    bench = pipeline_runs.benchmark_of(GptOssBenchmark, gradient_accumulation_steps=2)
    ref = pipeline_runs.train(bench, num_devices=2, expert_parallel=2, clip_norm=1.0)
    got = pipeline_runs.train(bench, num_devices=4, expert_parallel=2, pipeline=2, clip_norm=1.0,
                              weight_update_sharding=True)  # fmt: skip
    _assert_same(got, ref)


def _checkpoint(path: str) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(path)
    keys = [k for k, _ in tf.train.list_variables(path) if k != "_CHECKPOINTABLE_OBJECT_GRAPH"]
    return {k: np.asarray(reader.get_tensor(k)) for k in keys}


def _assert_same_checkpoint(got: dict, want: dict):
    assert got.keys() == want.keys()
    assert any(k.startswith("sharded_slots/") for k in want)
    for key, expected in want.items():
        scale = float(np.max(np.abs(expected))) if expected.size else 0.0
        np.testing.assert_allclose(got[key], expected, rtol=1e-5, atol=1e-6 * scale, err_msg=key)


@pytest.mark.slow
def test_a_stage_sharded_checkpoint_is_the_p1_sharded_one_and_restores_across_p(tmp_path):
    """The stage-sharded slots are saved whole (`sharded_slots`, the format of every sharded
    update): after one step, the D2 x P2 checkpoint holds the D2 (P = 1, sharded over the data
    axis) checkpoint's every tensor, weights and Adam moments (measured: <= 2e-9); each restores
    at the other P and is saved again unchanged (the slots cut into the other layout's pieces
    and joined back)."""
    bench = _llama()
    saved = {}
    for stages in (2, 1):
        path = str(tmp_path / f"p{stages}")
        pipeline_runs.train(bench, num_devices=2 * stages, pipeline=stages, steps=1, summer=True,
                            clip_norm=1.0, save_to=path, weight_update_sharding=True)  # fmt: skip
        saved[stages] = _checkpoint(path)
    _assert_same_checkpoint(saved[2], saved[1])
    for first, second in ((2, 1), (1, 2)):
        path = str(tmp_path / f"p{first}_at_p{second}")
        pipeline_runs.train(bench, num_devices=2 * second, pipeline=second, steps=0, summer=True,
                            clip_norm=1.0, restore_from=str(tmp_path / f"p{first}"),
                            save_to=path, weight_update_sharding=True)  # fmt: skip
        _assert_same_checkpoint(_checkpoint(path), saved[first])


def _deepseek(layers: int = 2, **overrides):
    """The smoke DeepSeek-V3 at 2 layers (a dense first stage, an MoE last stage with MTP)."""
    return pipeline_runs.benchmark_of(
        DeepseekV3Benchmark, gradient_accumulation_steps=2, model__num_hidden_layers=layers,
        **overrides,
    )  # fmt: skip


@pytest.mark.slow  # about a minute of CPU a run
@pytest.mark.parametrize(("expert_parallel", "devices"), [(1, 2), (2, 2)], ids=["D2xP2", "E2xP2"])
def test_deepseek_with_mtp_on_the_last_stage_equals_the_unpipelined_run(expert_parallel, devices):
    """DeepSeek-V3 (MLA, 8 experts in groups, the sequence-wise balance loss, one MTP depth)
    at P = 2 on 4 devices against the unpipelined run on 2: the MTP depth on the last stage
    embeds the shifted tokens with that stage's copy of the embedding (its gradient summed with
    the first stage's over the axis); the metrics, MTP loss and per-layer MoE rows of both
    stages, equal the unpipelined run's."""
    bench = _deepseek()
    ref = pipeline_runs.train(bench, num_devices=devices, expert_parallel=expert_parallel,
                              summer=True, clip_norm=1.0)  # fmt: skip
    got = pipeline_runs.train(bench, num_devices=2 * devices, expert_parallel=expert_parallel,
                              pipeline=2, summer=True, clip_norm=1.0)  # fmt: skip
    _assert_same(got, ref)
    assert got.losses[1] < got.losses[0]


@pytest.mark.slow  # two runs of about a minute of CPU
def test_a_variable_read_by_two_stages_falls_back_to_the_even_sharded_update():
    """DeepSeek-V3's embedding is read by the first stage (the tokens) and the last (MTP's
    shifted tokens): the stage map has no owner for it, so `--weight_update_sharding` shards
    the whole update evenly over every gradient axis, the pipeline's included; D2 x P2 so
    sharded ends at D2's weights (unsharded), clipped to the whole model's norm."""
    bench = _deepseek()
    ref = pipeline_runs.train(bench, num_devices=2, summer=True, clip_norm=1.0)
    got = pipeline_runs.train(bench, num_devices=4, pipeline=2, summer=True, clip_norm=1.0,
                              weight_update_sharding=True)  # fmt: skip
    assert got.trainer.summer.owners is None  # the fallback, not the stage map
    _assert_same(got, ref)


@pytest.mark.slow  # two runs of about a minute of CPU
def test_deepseek_with_the_recipe_s_uneven_shape_equals_the_unpipelined_run():
    """The recipe's shape in small: 3 layers as the declared 2 + 1 (a dense and an MoE layer on
    the first stage; one MoE layer, MTP and the loss on the last) at D2 x P2 against D2."""
    bench = _deepseek(layers=3, model__pipeline_layers="2+1")
    ref = pipeline_runs.train(bench, num_devices=2, summer=True, clip_norm=1.0)
    got = pipeline_runs.train(bench, num_devices=4, pipeline=2, summer=True, clip_norm=1.0)
    part = got.trainer.benchmark.pipeline_stage(got.trainer.model, 1, 2)
    assert (part.first, part.end) == (2, 3)
    _assert_same(got, ref)
    assert got.losses[1] < got.losses[0]


@pytest.mark.slow  # two runs of about a minute of CPU
def test_p2_x_c2_equals_the_unsplit_run():
    """Pipeline 2 x context 2 on 4 devices (each stage's two members holding zig-zag chunks of
    every sequence, the activations sent to the next stage's member of the same context index)
    against one device: the losses and whole weights, clipped to the whole model's norm."""
    bench = _llama()
    ref = pipeline_runs.train(bench, num_devices=1, summer=True, clip_norm=1.0)
    got = pipeline_runs.train(bench, num_devices=4, pipeline=2, context_parallel=2, summer=True,
                              clip_norm=1.0)  # fmt: skip
    _assert_same(got, ref)


_UNPIPELINED = """
from benchmarks.{module}.benchmark import {cls}
from tests import noise_floor, pipeline_runs
bench = pipeline_runs.benchmark_of({cls}, gradient_accumulation_steps=2)
weights = pipeline_runs.train(bench, num_devices=2, summer=True, clip_norm=1.0,
                              expert_parallel={e}).weights
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("benchmark_class", "module", "expert"),
    [(Llama31Benchmark, "llama31_8b", 1), (GptOssBenchmark, "gpt_oss_20b", 2)],
    ids=["llama_d2xp2", "gpt_oss_e2xp2"],
)  # fmt: skip
def test_p2_stays_within_the_noise_floor_of_the_unpipelined_run(
    tmp_path, benchmark_class, module, expert
):
    """P = 2 beside the unpipelined run (Llama: D2; GPT-OSS: E2, whose routing amplifies
    rounding) and the same unpipelined run with oneDNN off in a subprocess: the pipeline may not
    move the weights further from the unpipelined run than a change of kernels does (x 10, and
    at least 1e-6 of the largest weight)."""
    script = _UNPIPELINED.format(module=module, cls=benchmark_class.__name__, e=expert)
    off = noise_floor.onednn_off_weights(script, tmp_path, devices=2)
    bench = pipeline_runs.benchmark_of(benchmark_class, gradient_accumulation_steps=2)
    ref = pipeline_runs.train(
        bench, num_devices=2, summer=True, clip_norm=1.0, expert_parallel=expert
    )
    got = pipeline_runs.train(
        bench, num_devices=4, pipeline=2, summer=True, clip_norm=1.0, expert_parallel=expert
    )
    noise_floor.assert_within_noise_floor(got.weights, ref.weights, off, what=f"P=2 {module}")


@pytest.mark.slow  # five runner runs
def test_the_runner_resumes_across_p_without_the_flag(tmp_path):
    """Through `runner.run` and its `Checkpointer`, no --weight_update_sharding: 1 step at P = 2
    (stage-local moments, saved under the optimizer's keys), a restart at P = 1 (the optimizer's
    own slots) for 1 more, and the reverse, end at 2 unbroken steps at P = 1 (data 1 in all)."""

    def run(folder: str, steps: int, pipeline: int):
        config = runner.RunConfig(
            model_dir=str(tmp_path / folder), steps_per_loop=1, max_train_steps=steps,
            distribution="mirrored", num_cpu_devices=pipeline, pipeline_parallel=pipeline,
            collective_timeout=120,
        )  # fmt: skip
        return runner.run(Llama31Benchmark(Llama31Benchmark.preset("smoke")), config)

    # The session's 4 logical CPUs (conftest) made now: else the first run's split (1 device)
    # would be the process's, and the P = 2 runs could not have 2.
    assert len(tf.config.list_logical_devices("CPU")) >= 2
    unbroken = run("unbroken", 2, 1)
    for first, second in ((2, 1), (1, 2)):
        folder = f"p{first}_then_p{second}"
        assert run(folder, 1, first).steps == 1
        resumed = run(folder, 2, second)
        assert resumed.steps == 2
        for got, want in zip(weights(resumed.model), weights(unbroken.model), strict=True):
            assert_close(got, want, rtol=1e-5)
