"""Memory legality in `simulate` (issue 48): a layout whose bytes per chip exceed the chip's HBM
is not legal; the fastest-layout search skips it, a pinned one is a one-line error. Every
published layout must fit; an absurd one must not. No TensorFlow: the decoder's sizes come from
the benchmark facts cache (`mlperf_tf.parallel.memory.DecoderSizes`)."""

import subprocess
import sys

import pytest

from mlperf_tf import cli
from mlperf_tf.errors import UserError
from mlperf_tf.parallel import memory
from mlperf_tf.simulate import cache, model, systems, validate

DECODERS = ("llama31_8b", "gpt_oss_20b", "llama2_70b_lora")


def test_the_cache_carries_each_decoders_sizes_and_they_count_its_parameters():
    for name in DECODERS:
        facts = cache.benchmark_facts(name, "mlperf")
        sizes = memory.DecoderSizes.from_dict(facts["decoder"])
        assert sizes.parameter_count() == facts["parameters"], name
        # The stage count over one stage is every weight: the sizes are consistent.
        one = memory._stage_parameters(
            sizes, 0, sizes.num_hidden_layers, tensor=1, expert=1, first_stage=True,
            last_stage=True,
        )  # fmt: skip
        assert one == pytest.approx(sizes.parameters, rel=1e-6), name


def test_every_published_decoder_layout_fits_its_chips():
    """Every published point of a decoder benchmark on a system that states its memory is
    predicted (its layout, given or searched, is legal) and holds a positive count that fits."""
    checked = 0
    for point in validate.load_points()["points"]:
        system = systems.load(point["system"])
        if point["benchmark"] not in DECODERS or not system.memory_capacity:
            continue
        r = validate._predict(point, system, logged=False)
        assert 0 < r.memory_per_chip_gb * 1e9 <= memory.HEADROOM * system.memory_capacity, point
        checked += 1
    assert checked >= 40


def test_memory_matches_a_hand_count_of_dells_fsdp_gpt_oss_run():
    """Dell's 8-B200 gpt_oss_20b run (the log: tp1 pp1 cp1 ep1, micro-batch 2, MXFP8, FSDP),
    counted by hand from the model card's sizes with full recomputation."""
    b200 = systems.load("b200-dgx")
    r = model.simulate(
        benchmark="gpt_oss_20b", system=b200, chips=8, global_batch=16, precision="fp8",
        weight_update_sharding=True, fsdp=True, micro_batch_size=2,
    )  # fmt: skip
    sizes = memory.DecoderSizes.from_dict(cache.benchmark_facts("gpt_oss_20b")["decoder"])
    n, d = sizes.parameters, 8
    state = n * 1 / d + n * 2 / d + n * 16 / d  # fp8 weights, bf16 grads, fp32 optimizer
    h, f, q, kv, layers, k, e = 2880, 2880, 64 * 64, 8 * 64, 24, 4, 32
    layer = 2 * h * 2 + 2 * h + q + (2 * q + 2 * kv) * 2 + k * (h + 4 * f + f + 2 * h) + 4 * e
    tokens = 2 * 8192
    activations = tokens * (layers * 2 * h * 2 + layer) + tokens * h * 2  # + the embedding out
    assert r.memory_per_chip_gb * 1e9 == pytest.approx(state + activations, rel=1e-9)


def test_fsdp_divides_weights_and_gradients_by_the_data_groups():
    sizes = memory.DecoderSizes.from_dict(cache.benchmark_facts("llama31_8b")["decoder"])
    kw = dict(seq=8192, micro_batch=1, micro_batches=1, **memory.precision_bytes("fp8"))
    lay = memory.ChipLayout(data=8, shard_moments=True)
    plain = memory.decoder_memory(sizes, layout=lay, **kw)
    fsdp = memory.decoder_memory(sizes, layout=lay, shard_weights=True, **kw)
    assert fsdp.weights == pytest.approx(plain.weights / 8)
    assert fsdp.gradients == pytest.approx(plain.gradients / 8)
    assert (fsdp.moments, fsdp.activations) == (plain.moments, plain.activations)
    assert plain.weights == pytest.approx(sizes.parameters * 1.0)  # FP8: a byte a weight
    assert memory.decoder_memory(
        sizes, layout=lay, seq=8192, micro_batch=1, micro_batches=1
    ).weights == pytest.approx(sizes.parameters * 4)  # the suite's own default: float32


def test_an_absurd_layout_is_refused_and_the_search_goes_around_it():
    h100 = systems.load("h100-dgx")
    with pytest.raises(UserError, match="does not fit a chip of h100-dgx"):
        model.simulate(benchmark="llama2_70b_lora", system=h100, chips=1, global_batch=8)
    with pytest.raises(UserError, match="weights 41, gradients 41, optimizer 41"):
        model.simulate(
            benchmark="gpt_oss_20b", system=h100, chips=8, global_batch=16,
            weight_update_sharding=True, expert_parallel=1, model_parallel=1,
        )  # fmt: skip
    r = model.fastest(
        benchmark="gpt_oss_20b", system=h100, chips=8, global_batch=16, weight_update_sharding=True
    )
    assert r.memory_per_chip_gb * 1e9 <= memory.HEADROOM * h100.memory_capacity
    assert r.expert_parallel * r.model_parallel * r.pipeline_parallel > 1  # not plain dp


def test_a_pinned_layout_that_does_not_fit_is_one_line_naming_it(capsys):
    code = cli.main(["simulate", "--benchmark=llama31_8b", "--system=h100-dgx", "--chips=1",
                     "--global_batch=8", "--model_parallel=1"])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and "\n" not in err, err
    assert "--model_parallel=1" in err and "h100-dgx" in err and "--fsdp" in err, err


def test_a_pinned_axis_that_is_not_enough_names_a_layout_that_keeps_it(capsys):
    """NVIDIA's 72-GB200 gpt_oss_20b run (cp2 ep4, batch 36): pinning only its context axis
    leaves the optimizer unsharded and too big for the chip; the one-line error then names the
    fastest legal layout that keeps --context_parallel=2, and that layout does run."""
    argv = ["simulate", "--benchmark=gpt_oss_20b", "--system=gb200-nvl72", "--chips=72",
            "--global_batch=36"]  # fmt: skip
    code = cli.main([*argv, "--context_parallel=2"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and "\n" not in err, err
    assert "does not fit a chip of gb200-nvl72" in err, err
    kept = err.split("Keeping --context_parallel=2, the fastest legal layout of 72 chips is ")[1]
    flags = kept.split(" (or give no layout flag")[0].split()
    assert "--context_parallel=2" in flags and len(flags) > 1, err
    assert cli.main([*argv, *flags]) == 0
    assert "parallel: " in capsys.readouterr().out


def test_simulate_counts_memory_without_tensorflow():
    """A fresh interpreter predicts a decoder's bytes per chip and never imports TF or Keras."""
    code = (
        "import sys\n"
        "from mlperf_tf.simulate import model, systems\n"
        "r = model.simulate(benchmark='gpt_oss_20b', system=systems.load('b200-dgx'), chips=8,"
        " global_batch=16, weight_update_sharding=True, precision='fp8')\n"
        "assert r.memory_per_chip_gb > 0\n"
        "print(sorted({'tensorflow', 'keras'} & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out
