"""An efficiency per number format: a calibration stated in FP8 carried to FP4 runs (and back)
at the rate ratio Transformer Engine's GEMM profile measures, not the ratio of the peaks; a
calibrating run in two formats (NVFP4 healed to FP8) fitted over its mixed steps."""

import json

import pytest

from mlperf_tf import cli
from mlperf_tf.facts import Calibration
from mlperf_tf.simulate import model, systems, validate

# Transformer Engine's GEMM profiling guide, one layer's 12 GEMMs on a B300 (5 / 15 PFLOP/s
# dense FP8 / FP4, 8 TB/s), ms: kernels alone ("pre-quantized") and with training's
# quantization ("autocast").
MXFP8_KERNELS, MXFP8_AUTOCAST = 7.324, 8.507
NVFP4_KERNELS, NVFP4_AUTOCAST = 3.754, 6.439
BF16_AUTOCAST = 12.227  # no quantization: the kernels alone


@pytest.mark.numerics
def test_the_profiled_layer_on_the_chip_it_was_measured_on_and_on_a_b200():
    """On GB300 (B300: the figure's peaks and bandwidth) the layer takes the autocast times;
    on a B200 (4.5 / 9 PFLOP/s, 8 TB/s) the kernels scale with the peaks and the quantization
    with the bandwidth, so NVFP4 is 1.04 x MXFP8 there, not 2 x."""
    gb300, b200 = systems.load("gb300-nvl72"), systems.load("b200-dgx")
    assert model.layer_gemm_s(gb300, "fp8") == pytest.approx(MXFP8_AUTOCAST * 1e-3)
    assert model.layer_gemm_s(gb300, "fp4") == pytest.approx(NVFP4_AUTOCAST * 1e-3)
    fp8 = MXFP8_KERNELS * 5 / 4.5 + (MXFP8_AUTOCAST - MXFP8_KERNELS)
    fp4 = NVFP4_KERNELS * 15 / 9 + (NVFP4_AUTOCAST - NVFP4_KERNELS)
    assert model.layer_gemm_s(b200, "fp8") == pytest.approx(fp8 * 1e-3)
    assert model.layer_gemm_s(b200, "fp4") == pytest.approx(fp4 * 1e-3)
    assert fp8 / fp4 == pytest.approx(1.042, abs=1e-3)
    rate = model.linear_rate(b200, "fp4", "fp8", b200.peak("fp4"))
    assert rate == pytest.approx(4.5e15 * fp8 / fp4)
    # The same format, a format outside the profile, or no declared base: the format's peak.
    assert model.linear_rate(b200, "fp8", "fp8", 4.5e15) == 4.5e15
    assert model.linear_rate(b200, "fp16", "fp8", 2.25e15) == 2.25e15  # fp16: not profiled
    assert model.linear_rate(b200, "fp4", None, 9e15) == 9e15
    h100 = systems.load("h100-dgx")  # no FP4: nothing to carry
    assert model.linear_rate(h100, "fp8", "fp8", h100.peak("fp8")) == h100.peak("fp8")


@pytest.mark.numerics
def test_a_bf16_run_of_an_fp8_calibration_runs_at_the_profiled_bf16_rate():
    """BF16 layers of an FP8 calibration (and FP8 layers of a BF16 one) at the profiled layer's
    ratio on the chip, BF16's kernels at its peak (nothing to quantize): 1.437 x on GB300 (the
    figure: 12.227 / 8.507), on a B200 (2.25 / 4.5 PFLOP/s, 8 TB/s) 1.458 x, on an H100 (0.989 /
    1.979 PFLOP/s, 3.35 TB/s) 1.449 x; not the peaks' 2 x."""
    gb300, b200, h100 = (systems.load(n) for n in ("gb300-nvl72", "b200-dgx", "h100-dgx"))
    assert model.layer_gemm_s(gb300, "bf16") == pytest.approx(BF16_AUTOCAST * 1e-3)
    bf16 = BF16_AUTOCAST * 2.5 / 2.25
    fp8 = MXFP8_KERNELS * 5 / 4.5 + (MXFP8_AUTOCAST - MXFP8_KERNELS)
    assert model.layer_gemm_s(b200, "bf16") == pytest.approx(bf16 * 1e-3)
    assert bf16 / fp8 == pytest.approx(1.458, abs=1e-3)
    rate = model.linear_rate(b200, "bf16", "fp8", b200.peak("bf16"))
    assert rate == pytest.approx(4.5e15 * fp8 / bf16)
    assert model.linear_rate(b200, "fp8", "bf16", b200.peak("fp8")) == pytest.approx(
        2.25e15 * bf16 / fp8
    )
    h_bf16 = BF16_AUTOCAST * 2.5 / (h100.peak("bf16") / 1e15)
    h_kernels = MXFP8_KERNELS * 5 / (h100.peak("fp8") / 1e15)
    h_fp8 = h_kernels + (MXFP8_AUTOCAST - MXFP8_KERNELS) * 8 / (h100.memory_bandwidth / 1e12)
    assert h_bf16 / h_fp8 == pytest.approx(1.449, abs=2e-3)
    assert model.layer_gemm_s(h100, "bf16") / model.layer_gemm_s(h100, "fp8") == pytest.approx(
        h_bf16 / h_fp8
    )


@pytest.mark.numerics
def test_an_fp4_run_of_an_fp8_calibration_runs_its_linear_flops_at_the_profiled_rate():
    """llama31_8b (calibrated in FP8) on 8 B200 at batch 16 in FP4 against FP8: only the
    linear FLOPs (all but the declared attention products) change rate, from the FP8 peak to
    4.5 PFLOP/s x t8 / t4; per chip 2 samples: 2 (F - A) (1 / R4 - 1 / P8) / e."""
    b200 = systems.load("b200-dgx")
    kw = dict(benchmark="llama31_8b", system=b200, chips=8, global_batch=16, model_parallel=1)
    fp8, fp4 = model.simulate(precision="fp8", **kw), model.simulate(precision="fp4", **kw)
    facts = model.benchmark_facts("llama31_8b")
    shape = model.shape_of(facts)
    efficiency = model.constants(b200, "llama31_8b", shape, "fp4").efficiency
    assert efficiency == model.constants(b200, "llama31_8b", shape, "fp8").efficiency
    linear = facts["training_flops_per_sample"] - shape.attention_flops
    r4 = 4.5e15 * model.layer_gemm_s(b200, "fp8") / model.layer_gemm_s(b200, "fp4")
    saved = 2 * linear * (1 / 4.5e15 - 1 / r4) / efficiency
    assert fp8.compute_s - fp4.compute_s == pytest.approx(saved)
    assert fp4.mfu == pytest.approx(
        fp4.samples_per_s * facts["training_flops_per_sample"] / (8 * 9e15)
    )


def test_the_lora_calibration_is_fitted_over_its_nvfp4_and_fp8_steps():
    """The calibrating run's log: NVFP4 until `healing_iter` 350, FP8 after, run_stop at step
    432. The benchmark declares it (`run_formats`), the published point carries the same steps
    (`precision_steps`), and its prediction is each format's share of the steps at that
    format's time to train; the efficiency (a fraction of the FP8 peak) is at most 0.75."""
    facts = model.benchmark_facts("llama2_70b_lora")
    calibration = model.shape_of(facts).calibration_for("blackwell")
    assert calibration.run_formats == (("fp4", 350), ("fp8", 82))
    assert calibration.precision == "fp8" and calibration.compute_efficiency <= 0.75
    points = {p["id"]: p for p in validate.load_points()["points"]}
    point = points["b200-lora-8-nebius-v51"]
    assert point["precision_steps"] == dict(calibration.run_formats)
    b200 = systems.load("b200-dgx")
    mixed = validate._predict(point, b200, logged=False)
    times = {}
    for fmt in ("fp4", "fp8"):
        one = dict(point, precision=fmt)
        del one["precision_steps"]
        times[fmt] = validate._predict(one, b200, logged=False).time_to_train_min
    assert times["fp4"] < times["fp8"]
    assert mixed.time_to_train_min == pytest.approx((350 * times["fp4"] + 82 * times["fp8"]) / 432)
    assert mixed.time_to_train_min == pytest.approx(point["minutes"], rel=2e-3)


def test_run_formats_survive_the_cache_round_trip():
    calibration = Calibration(("blackwell",), 0.5, "fp8", "x", run_formats=(("fp4", 3), ("fp8", 1)))
    assert Calibration.from_dict(calibration.as_dict()) == calibration
    assert "run_formats" not in Calibration(("blackwell",), 0.5).as_dict()


@pytest.mark.numerics
def test_fp8_attention_on_blackwell_ultra_runs_at_its_faster_softmax():
    """FP8 attention at 1.5 x the BF16 rate (cuDNN's figure) on GB200, times 1.35 on GB300
    (Blackwell Ultra's doubled exponential units: NVIDIA's DeepSeek-V3 FP8 attention
    forward), at most the FP8 peak; BF16 attention the same on both."""
    gb200, gb300 = systems.load("gb200-nvl72"), systems.load("gb300-nvl72")
    assert (gb200.fp8_attention_factor, gb300.fp8_attention_factor) == (1.0, 1.35)
    shape = model.shape_of(model.benchmark_facts("deepseekv3_671b"))
    for system, rate in ((gb200, 1.5 * 2.5e15), (gb300, min(1.5 * 1.35 * 2.5e15, 5e15))):
        const = model.constants(system, "deepseekv3_671b", shape, "fp8", attention_precision="fp8")
        assert const.attention_scale == pytest.approx(0.5 * 5e15 / rate)
        const = model.constants(system, "deepseekv3_671b", shape, "fp8", attention_precision="bf16")
        assert const.attention_scale == pytest.approx(0.5 * 5e15 / 2.5e15)


@pytest.mark.numerics
def test_recompute_mlp_runs_the_dense_feed_forwards_forward_again_on_the_first_stage():
    """`--recompute_mlp` (Megatron's `recompute_modules: ['mlp']`, which skips MoE layers; the
    GB200 DeepSeek-V3 configs' `RECOMPUTE_MODULES="mlp"`): the 3 dense blocks' SwiGLU forward,
    3 x 2 x 3 x 7,168 x 18,432 FLOPs a token, once more on the first pipeline stage, which
    sets the tick: a chip's share of the samples x those FLOPs x P / (peak x e), x (1 + bubble).
    """
    shape = model.shape_of(model.benchmark_facts("deepseekv3_671b"))
    assert shape.dense_mlp_flops == pytest.approx(3 * 2 * 3 * 7168 * 18432 * 4096)
    gb200 = systems.load("gb200-nvl72")
    kw = dict(benchmark="deepseekv3_671b", system=gb200, chips=512, global_batch=15360,
              precision="fp8", model_parallel=2, pipeline_parallel=4, virtual_stages=4,
              expert_parallel=32, context_parallel=1, weight_update_sharding=True)  # fmt: skip
    plain, again = model.simulate(**kw), model.simulate(recompute_mlp=True, **kw)
    efficiency = model.constants(gb200, "deepseekv3_671b", shape, "fp8").efficiency
    extra = 15360 / 512 * shape.dense_mlp_flops * 4 / (5e15 * efficiency)
    assert again.compute_s - plain.compute_s == pytest.approx(extra * (1 + plain.pipeline_bubble))
    # A dense model's `mlp` is every block's feed-forward: 2 samples a chip, no pipeline.
    kw = dict(benchmark="llama31_8b", system=gb200, chips=8, global_batch=16, precision="fp8",
              model_parallel=1)  # fmt: skip
    plain, again = model.simulate(**kw), model.simulate(recompute_mlp=True, **kw)
    llama = model.shape_of(model.benchmark_facts("llama31_8b"))
    blocks = llama.blocks
    ffn = blocks.blocks * blocks.ffn_flops_per_token * blocks.tokens_per_sample
    efficiency = model.constants(gb200, "llama31_8b", llama, "fp8").efficiency
    assert again.compute_s - plain.compute_s == pytest.approx(2 * ffn / (5e15 * efficiency))


def test_recompute_mlp_and_fp4_reach_the_step_from_the_command_line(capsys):
    """`--recompute_mlp` lengthens the compute term, `--precision=fp4` shortens it (a B200:
    1.04 x FP8's linear rate), both as `simulate()` computes them."""
    args = ["simulate", "--benchmark=llama31_8b", "--system=b200-dgx", "--chips=8",
            "--global_batch=16", "--model_parallel=1", "--weight_update_sharding", "--json"]  # fmt: skip
    runs = {}
    for extra in ((), ("--recompute_mlp",), ("--precision=fp4",), ("--precision=fp8",)):
        assert cli.main([*args, *extra]) == 0
        runs[extra] = json.loads(capsys.readouterr().out)
    base = runs[()]
    assert runs[("--recompute_mlp",)]["compute_s"] > base["compute_s"]
    fp4, fp8 = runs[("--precision=fp4",)], runs[("--precision=fp8",)]
    assert fp8["compute_s"] / 1.1 < fp4["compute_s"] < fp8["compute_s"]
    assert (fp4["precision"], fp4["peak_flops"]) == ("fp4", 9e15)
