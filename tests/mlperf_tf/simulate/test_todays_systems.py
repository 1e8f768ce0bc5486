"""Tests of `simulate` on the systems MLPerf runs on today (issue 48): number formats, NVL72 trays,
pipeline and context parallelism, the fastest layout, calibration declared by the benchmarks,
`--from_log`, `--validate`, and the MLPerf v6.0 published points as a check that was never fitted."""

import json
import os
import re
import statistics

import numpy as np
import pytest
from mlperf_logging import benchmark_meta

from mlperf_tf import cli
from mlperf_tf.simulate import model, systems, validate

MAX_EFFICIENCY = 0.75  # of the dense peak of the calibrating run's format
V6_MEDIAN, V6_EACH = 0.25, 0.35  # issue 48's bounds on the MLPerf v6.0 points


def _run(capsys, *args):
    code = cli.main(["simulate", *args])
    out = capsys.readouterr()
    return code, out.out, out.err.strip()


# ---- systems and formats ------------------------------------------------------------------------
def test_no_built_in_system_names_a_benchmark():
    names = set(model.cache._flops_table())
    for name in systems.available():
        with open(os.path.join(systems.SYSTEMS_DIR, name + ".json"), encoding="utf-8") as f:
            text = f.read()
        for benchmark in names:
            assert not re.search(rf"\b{benchmark}\b", text), (name, benchmark)


@pytest.mark.parametrize(
    "name, formats",
    [
        ("gb200-nvl72", {"bf16": 2.5e15, "fp8": 5e15, "fp4": 10e15}),
        ("gb300-nvl72", {"bf16": 2.5e15, "fp8": 5e15, "fp4": 15e15}),
        ("b200-dgx", {"bf16": 2.25e15, "fp8": 4.5e15, "fp4": 9e15}),
        ("mi355x", {"bf16": 2.5166e15, "fp8": 5.0332e15, "fp4": 10.0663e15}),
        # MI355X's at 2.2 / 2.4 GHz: AMD's stated 2.3 / 4.6 / 9.2 PFLOP/s
        ("mi350x", {"bf16": 2.3069e15, "fp8": 4.6138e15, "fp4": 9.2274e15}),
        ("h100-dgx", {"bf16": 989e12, "fp8": 1979e12}),
    ],
)
def test_dense_peaks_per_format_are_the_cited_ones(name, formats):
    system = systems.load(name)
    for fmt, peak in formats.items():
        assert system.peak(fmt) == pytest.approx(peak), fmt
    assert system.peak("mxfp4" if "fp4" in formats else "bf16") > 0
    assert "peak_flops_by_format" in " ".join(system.sources) or "peak_flops" in " ".join(
        system.sources
    )


@pytest.mark.parametrize(
    "chips, domains, per_domain", [(4, 1, 4), (32, 1, 32), (72, 1, 72), (144, 2, 72), (512, 8, 64)]
)
def test_nvl72_takes_whole_trays_and_spans_domains_beyond_72(chips, domains, per_domain):
    layout = systems.load("gb200-nvl72").layout(chips)
    assert (layout.nodes, layout.chips_per_node) == (domains, per_domain)


def test_bad_input_is_one_line_naming_the_setting_and_what_would_work(capsys):
    gb = ["--system=gb200-nvl72", "--benchmark=llama31_8b"]
    cases = [
        ([*gb, "--chips=6"], "--chips (6) does not fit 'gb200-nvl72'", "multiple of 4"),
        (["--system=a100-dgx", "--benchmark=bert", "--chips=8", "--precision=fp8"],
         "--precision=fp8", "bf16"),
        (["--system=a100-dgx", "--benchmark=llama31_8b", "--chips=8",
          "--attention_precision=fp8"], "--attention_precision=fp8: 'a100-dgx' has", "bf16"),
        ([*gb, "--chips=72", "--global_batch=72", "--pipeline_parallel=3"],
         "--pipeline_parallel (3) must divide the 32 blocks", "use one of 1, 2, 4, 8, 16, 32"),
        ([*gb, "--chips=8", "--global_batch=8", "--context_parallel=3"],
         "--context_parallel (3) must divide the 8192 tokens", ""),
        # 64 samples over 72 chips: no power-of-two split gives data groups dividing 64.
        (["--system=gb300-nvl72", "--benchmark=gpt_oss_20b", "--chips=72", "--global_batch=64"],
         "no legal layout of 72 chips at --global_batch=64", "use a larger batch"),
        ([*gb, "--chips=16", "--global_batch=16", "--pipeline_parallel=2",
          "--micro_batch_size=3", "--model_parallel=1", "--context_parallel=1"],
         "--micro_batch_size (3) must divide", ""),
    ]  # fmt: skip
    for args, message, hint in cases:
        code, _, err = _run(capsys, *args)
        assert code == 2 and err.startswith("error: ") and "\n" not in err, (args, err)
        assert message in err and hint in err, (args, err)


# ---- the step model's new axes ------------------------------------------------------------------
def test_pipeline_splits_compute_and_adds_the_1f1b_bubble():
    """P stages of a group: compute / P x (1 + (P - 1) / m), m = group batch / micro-batch."""
    b200 = systems.load("b200-dgx")
    kw = dict(benchmark="llama31_8b", system=b200, global_batch=32, precision="fp8")
    plain = model.simulate(chips=8, **kw)  # 8 groups of 4 samples
    for stages, micro in ((2, 1), (4, 2), (8, 4)):
        piped = model.simulate(chips=8 * stages, pipeline_parallel=stages, micro_batch_size=micro,
                               **kw)  # fmt: skip
        m = 4 / micro
        assert piped.pipeline_bubble == pytest.approx((stages - 1) / m)
        assert piped.compute_s == pytest.approx(plain.compute_s / stages * (1 + (stages - 1) / m))
        assert piped.pipeline_s > 0


def test_context_parallelism_splits_each_sample_and_pays_its_ring():
    b200 = systems.load("b200-dgx")
    kw = dict(benchmark="llama31_8b", system=b200, global_batch=8, precision="fp8")
    plain = model.simulate(chips=8, **kw)
    split = model.simulate(chips=32, context_parallel=4, **kw)
    assert split.compute_s == pytest.approx(plain.compute_s / 4)
    assert split.context_parallel_s > 0 and plain.context_parallel_s == 0
    # Keys and values go around the ring: 3 (C - 1) passes per block of a shard's tokens.
    blocks = model.shape_of(model.benchmark_facts("llama31_8b")).blocks
    nbytes = 1 * blocks.tokens_per_sample / 4 * 2 * blocks.hidden * 2
    ring = 3 * blocks.blocks * 3 * (b200.link.alpha + nbytes / b200.link.bandwidth)
    assert split.context_parallel_s == pytest.approx((1 - b200.overlap_fraction) * ring)


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "fp4"])
def test_attention_runs_in_bf16_and_causal_half_whatever_the_linear_format(fmt):
    """Linear GEMMs at the run's peak (FP4 and BF16: the FP8 calibration carried at Transformer
    Engine's profiled layer rates on a B300, MXFP8 8.507 ms over NVFP4's 6.439 and BF16's
    12.227, not 3 x and 1 / 2); the
    declared attention products at the BF16 peak, half of them computed (causal). Per chip:
    batch x ((F - A) / R + A / 2 / peak_bf16) / e."""
    gb300 = systems.load("gb300-nvl72")
    kw = dict(benchmark="llama2_70b_lora", system=gb300, chips=8, global_batch=8)
    r = model.simulate(precision=fmt, **kw)
    facts = model.benchmark_facts("llama2_70b_lora")
    shape = model.shape_of(facts)
    flops, attention = facts["training_flops_per_sample"], shape.attention_flops
    # Attention's 3 x 4 S^2 x heads x head size x layers of Llama 2 70B at S = 8,192.
    assert attention == pytest.approx(3 * 4 * 8192**2 * 64 * 128 * 80)
    assert shape.causal
    efficiency = model.constants(gb300, "llama2_70b_lora", shape, fmt).efficiency
    peak, bf16 = gb300.peak(fmt), gb300.peak("bf16")
    rate = {"fp4": 5e15 * 8.507 / 6.439, "bf16": 5e15 * 8.507 / 12.227}.get(fmt, peak)
    assert r.compute_s == pytest.approx(
        ((flops - attention) / rate + attention * 0.5 / bf16) / efficiency
    )
    if fmt == "fp8":  # half the square at half the FP8 peak: as if all of it ran in FP8
        assert r.compute_s == pytest.approx(flops / (peak * efficiency))
    assert r.mfu == pytest.approx(r.samples_per_s * flops / (8 * peak))  # MFU: model FLOPs
    assert r.attention_precision == "bf16"  # the reference's default


@pytest.mark.numerics
@pytest.mark.parametrize("fmt", ["fp8", "fp4"])
def test_fp8_attention_runs_the_attention_products_at_cudnns_fp8_rate(fmt):
    """`attention_precision="fp8"` (a run's FP8 dot-product attention, NeMo's `FP8_DPA`): the
    declared attention products at 1.5 x the BF16 peak (cuDNN's FP8 flash attention against
    its BF16 one, `FP8_ATTENTION_SPEEDUP`; not the FP8 peak's 2 x), half computed (causal);
    the linear GEMMs stay at their rate R (FP8: the peak; FP4: the FP8 peak x 8.507 / 6.439,
    Transformer Engine's profiled layer), so per chip batch x ((F - A) / R + A / 2 /
    (1.5 peak_bf16)) / e."""
    gb300 = systems.load("gb300-nvl72")
    kw = dict(benchmark="llama2_70b_lora", system=gb300, chips=8, global_batch=8, precision=fmt)
    bf16, fp8 = model.simulate(**kw), model.simulate(attention_precision="fp8", **kw)
    facts = model.benchmark_facts("llama2_70b_lora")
    shape = model.shape_of(facts)
    flops, attention = facts["training_flops_per_sample"], shape.attention_flops
    efficiency = model.constants(gb300, "llama2_70b_lora", shape, fmt).efficiency
    peak = gb300.peak(fmt)
    # GB300's dense BF16 peak x cuDNN's FP8 / BF16 attention ratio x Blackwell Ultra's faster
    # softmax (1.35 x a B200's FP8 attention), at most the FP8 peak
    rate = min(1.5 * 1.35 * 2.5e15, 5e15)
    linear = 5e15 * 8.507 / 6.439 if fmt == "fp4" else peak
    timed = (flops - attention) / linear + attention * 0.5 / rate
    assert fp8.compute_s == pytest.approx(timed / efficiency)
    # What FP8 attention saves: half the causal square's FLOPs at 1 / BF16 - 1 / FP8 rate.
    saved = attention * 0.5 * (1 / 2.5e15 - 1 / rate) / efficiency
    assert bf16.compute_s - fp8.compute_s == pytest.approx(saved)
    assert (fp8.attention_precision, fp8.precision) == ("fp8", fmt)
    assert fp8.mfu == pytest.approx(fp8.samples_per_s * flops / (8 * peak))  # model FLOPs


def test_attention_precision_flag_and_the_published_points_that_enable_it(capsys):
    """The flag reaches the step (printed, and in --json); the points whose logs or configs turn
    on FP8 attention (DeepSeek-V3's `config_common_mxfp8.sh` FP8_DPA=True, Dell's llama31_8b log
    `fp8_dot_product_attention=1`, the llama2_70b_lora runs' logs and configs, the v5.1
    llama31_8b NVFP4 runs' logs) are simulated with it, and only those."""
    args = ["--benchmark=llama31_8b", "--system=b200-dgx", "--chips=8", "--global_batch=8",
            "--model_parallel=1", "--weight_update_sharding", "--json"]  # fmt: skip
    base = json.loads(_run(capsys, *args)[1])
    fp8 = json.loads(_run(capsys, *args, "--attention_precision=fp8")[1])
    assert (base["attention_precision"], fp8["attention_precision"]) == ("bf16", "fp8")
    assert fp8["compute_s"] < base["compute_s"]
    code, out, _ = _run(capsys, *args[:-1], "--attention_precision=fp8")
    assert code == 0 and "attention fp8" in out
    points = validate.load_points()["points"]
    fp8_points = {p["id"] for p in points if p.get("attention_precision") == "fp8"}
    assert fp8_points == {
        "v6-gb300-deepseek-256", "v6-gb300-deepseek-512", "v6-gb200-deepseek-512",
        "v6-gb200-deepseek-2048", "v6-gb200-deepseek-4096", "v6-b200-llama-8-dell",
    } | LORA_FP8_ATTENTION | LLAMA_NVFP4  # fmt: skip
    bf16_points = {p["id"] for p in points if p.get("attention_precision") == "bf16"}
    assert bf16_points == LORA_BF16_ATTENTION
    assert {p.get("attention_precision") for p in points} == {None, "fp8", "bf16"}


# The v5.1 llama31_8b runs whose 10 logs print NVFP4 linear layers (`fp4: true`, `fp4_recipe:
# nvfp4`, `fp8: false`) and FP8 attention (`fp8_dot_product_attention: true`): the calibrating
# Nebius run among them (issue 48, session 11).
LLAMA_NVFP4 = {
    "b200-llama-8-nebius-v51", "b200-llama-16-nebius-v51", "b200-llama-32-nebius-v51",
    "b200-llama-8-oracle-v51", "b200-llama-8-supermicro-v51-as-4126gs-nb",
    "b200-llama-8-supermicro-v51-sys-422gs-nb",
}  # fmt: skip


# The llama2_70b_lora points by the attention their run used, as read from its log
# (`fp8_dot_product_attention: 0|1`) or its config (`FP8_DPA`); the rest had no config to read.
LORA_FP8_ATTENTION = {
    "b200-lora-8-nebius-v51", "b200-lora-16-nebius-v51", "b200-lora-32-nebius-v51",
    "b200-lora-8-dell-v51", "h200-lora-8-dell-v51", "b200-lora-8-dell-v51-1xxe9685lx8b",
    "b200-lora-8-dell-v51-1xxe9780x8b2", "b200-lora-16-dell-v51", "b200-lora-8-gigacomput-v51",
    "h200-lora-16-krai-v51", "h200-lora-32-krai-v51", "h200-lora-64-krai-v51",
    "b200-lora-8-lenovo-v51", "b200-lora-8-lenovo-v51-sr780av38xb2", "b200-lora-8-supermicro-v51",
    "b200-lora-8-supermicro-v51-asa126gstnbr", "b200-lora-8-supermicro-v51-sys422gsnbrt",
    "b200-lora-8-university-v51", "b200-lora-64-university-v51",
}  # fmt: skip
LORA_BF16_ATTENTION = {
    "h200-lora-8-cisco-v51", "h200-lora-16-cisco-v51", "h100-lora-128-cisco-v51",
    "h100-lora-64-cisco-v51", "h200-lora-8-dell-v51-1xxe9680x8h2", "h200-lora-8-quanta-clo-v51",
    "mi355x-lora-8-amd-v51",
}  # fmt: skip


def test_every_lora_point_says_where_its_attention_format_was_read():
    """Each llama2_70b_lora point names the log or config its attention format came from, or says
    that none was found (and then keeps the reference's default); the calibrating run is fitted
    with the FP8 attention its log prints."""
    lora = [p for p in validate.load_points()["points"] if p["benchmark"] == "llama2_70b_lora"]
    assert len(lora) == 32
    for p in lora:
        note = p["attention_note"]
        if "attention_precision" in p:
            # A log's `result_*.txt` or a config's `.sh`, by path.
            assert "result_*.txt" in note or ".sh" in note, p["id"]
            assert note.startswith("FP8" if p["attention_precision"] == "fp8" else "BF16"), p["id"]
        else:
            assert "config not found" in note, p["id"]
    calibrating = [p for p in lora if p["role"].startswith("calibrate")]
    assert [p["attention_precision"] for p in calibrating] == ["fp8"]
    shape = model.shape_of(model.benchmark_facts("llama2_70b_lora"))
    [calibration] = shape.calibration
    assert calibration.precision == "fp8" and calibration.compute_efficiency <= 0.75


def test_scaling_efficiency_never_exceeds_one():
    """Sharded updates, tensor, expert, context and pipeline splits: at most 1 (the share of the
    step a chip spends on its own work); equal to N chips over N lone chips where the chips split
    nothing and update every weight each (data parallelism without weight-update sharding)."""
    b200, gb300 = systems.load("b200-dgx"), systems.load("gb300-nvl72")
    cases = [
        dict(benchmark="gpt_oss_20b", system=b200, chips=8, global_batch=16,
             weight_update_sharding=True),
        dict(benchmark="gpt_oss_20b", system=gb300, chips=72, global_batch=36,
             expert_parallel=4, context_parallel=2, weight_update_sharding=True),
        dict(benchmark="llama2_70b_lora", system=gb300, chips=72, global_batch=9,
             context_parallel=8, weight_update_sharding=True),
        dict(benchmark="llama31_8b", system=b200, chips=64, global_batch=8, model_parallel=2,
             pipeline_parallel=4, weight_update_sharding=True),
        dict(benchmark="resnet50", system=systems.load("tpu-v3"), chips=1024, global_batch=65536,
             weight_update_sharding=True),
    ]  # fmt: skip
    for kw in cases:
        r = model.simulate(**kw)
        own = r.compute_s / (1 + r.pipeline_bubble) + r.weight_update_s + r.overhead_s
        assert r.scaling_efficiency == pytest.approx(own / r.step_time_s), kw
        assert 0 < r.scaling_efficiency <= 1, kw
    # Unsharded (the equality holds without weight-update sharding), in FP8: bf16 weights
    # without a sharded update would not fit a B200 (166 GB).
    plain = model.simulate(benchmark="llama31_8b", system=b200, chips=16, global_batch=32,
                           precision="fp8")  # fmt: skip
    lone = plain.samples_per_s / (plain.single_chip_samples_per_s * 16)
    assert plain.scaling_efficiency == pytest.approx(lone)
    sharded = model.simulate(**cases[0])  # the ratio to lone chips would exceed 1 here
    assert sharded.samples_per_s / (sharded.single_chip_samples_per_s * 8) > 1


def test_mfu_is_against_the_peak_of_the_format_used():
    b200 = systems.load("b200-dgx")
    kw = dict(benchmark="llama31_8b", system=b200, chips=8, global_batch=16,
              weight_update_sharding=True)  # fmt: skip
    for fmt in ("bf16", "fp8", "fp4"):
        r = model.simulate(precision=fmt, **kw)
        flops = model.benchmark_facts("llama31_8b")["training_flops_per_sample"]
        assert r.peak_flops == b200.peak(fmt)
        assert r.mfu == pytest.approx(r.samples_per_s * flops / (8 * b200.peak(fmt)))


def test_without_a_layout_the_fastest_legal_one_is_chosen_and_printed(capsys):
    args = ["--benchmark=gpt_oss_20b", "--system=gb200-nvl72", "--chips=72", "--global_batch=36",
            "--weight_update_sharding"]  # fmt: skip
    code, out, err = _run(capsys, *args, "--json")
    assert code == 0, err
    chosen = json.loads(out)
    assert chosen["global_batch"] == 36  # below the 72 chips: some chips share samples
    assert chosen["model_parallel"] * chosen["context_parallel"] * chosen["pipeline_parallel"] > 1
    pinned = {k: chosen[k] for k in validate._LAYOUT}
    system = systems.load("gb200-nvl72")
    same = model.simulate(benchmark="gpt_oss_20b", system=system, chips=72, global_batch=36,
                          weight_update_sharding=True, **pinned)  # fmt: skip
    assert same.time_to_train_min == pytest.approx(chosen["time_to_train_min"])
    plain = dict(benchmark="gpt_oss_20b", system=system, chips=72, global_batch=72,
                 weight_update_sharding=True)  # fmt: skip
    assert chosen["time_to_train_min"] > 0 and model.simulate(**plain).time_to_train_min > 0
    code, out, _ = _run(capsys, *args)
    assert "the fastest legal layout" in out and validate.layout_text(same) in out


# ---- calibration belongs to the benchmark -------------------------------------------------------
def test_every_calibration_is_plausible_and_names_its_source():
    points = validate.load_points()["points"]
    calibrating = {p["path"] for p in points if p["role"].startswith("calibrate")}
    for name, presets in model.cache._flops_table().items():
        shape = model.shape_of(presets["mlperf"])
        for entry in shape.calibration:
            if entry.compute_efficiency is not None:
                assert 0 < entry.compute_efficiency <= MAX_EFFICIENCY, (name, entry)
            assert entry.source.startswith("assumed") or any(
                path in entry.source for path in calibrating
            ), (name, entry.source)


def test_at_most_one_mlperf_v5_1_result_calibrates_each_benchmark():
    points = validate.load_points()["points"]
    for benchmark in {p["benchmark"] for p in points}:
        v51 = [p for p in points if p["benchmark"] == benchmark and p["source"] == "v5.1"
               and p["role"].startswith("calibrate")]  # fmt: skip
        assert len(v51) <= 1, (benchmark, [p["id"] for p in v51])
    assert not [p for p in points if p["source"] == "v6.0" and p["role"] != "test"]


# ---- the MLPerf v6.0 check ----------------------------------------------------------------------
def _v6_rows():
    points = [p for p in validate.load_points()["points"] if p["source"] == "v6.0"]
    loaded = {name: systems.load(name) for name in {p["system"] for p in points}}
    return points, validate.rows(points, loaded)


def test_v6_points_cover_the_published_configurations():
    points, _ = _v6_rows()
    configs = {(p["benchmark"], p["system"], p["chips"], p["global_batch"]) for p in points}
    assert {("gpt_oss_20b", "gb300-nvl72", 72, 36), ("gpt_oss_20b", "gb300-nvl72", 512, 64),
            ("gpt_oss_20b", "gb200-nvl72", 72, 36), ("llama2_70b_lora", "gb300-nvl72", 72, 9),
            ("llama2_70b_lora", "gb300-nvl72", 8, 8), ("llama2_70b_lora", "gb300-nvl72", 512, 64),
            ("llama31_8b", "gb300-nvl72", 72, 72),
            ("flux1", "gb300-nvl72", 32, 1024), ("flux1", "gb300-nvl72", 72, 2304)} <= configs  # fmt: skip
    assert all("/results/" in p["path"] for p in points)
    # Every point is MLPerf's score of its folder, never one run's file.
    assert all(p["runs"] > 1 and not p["path"].endswith(".txt") for p in points)


def test_v6_points_of_every_run_are_mlperf_scores():
    """Every v6.0 point's `minutes` is the result summarizer's score: the mean of its runs with
    the fastest and the slowest dropped, times the folder's scaling.json factor."""
    scored = [p for p in validate.load_points()["points"] if p["source"] == "v6.0"]
    assert scored
    for p in scored:
        runs = np.sort(np.asarray(p["run_minutes"]))
        # Every run MLPerf requires of the benchmark (mlperf_logging.benchmark_meta: 10, or 3
        # for deepseekv3_671b, whose olympic mean is then the middle run).
        required = benchmark_meta._ALL_RESULT_FILE_COUNTS["training"][p["benchmark"]]
        assert len(runs) == p["runs"] == required, p["id"]
        score = runs[1:-1].mean() * p.get("scaling_factor", 1.0)
        assert p["minutes"] == pytest.approx(score, abs=1e-4), p["id"]


@pytest.mark.parametrize(
    "bench, system, chips, batch",
    [
        ("gpt_oss_20b", "gb200-nvl72", 72, 36),
        ("gpt_oss_20b", "gb200-nvl72", 512, 64),
        ("llama2_70b_lora", "gb200-nvl72", 72, 9),
        ("llama2_70b_lora", "gb200-nvl72", 512, 64),
        ("flux1", "gb200-nvl72", 32, 1024),
        ("flux1", "gb300-nvl72", 72, 2304),
        ("llama31_8b", "gb300-nvl72", 512, 256),
        ("llama2_70b_lora", "mi355x", 8, 8),
    ],
)
def test_published_configurations_are_accepted_as_published(capsys, bench, system, chips, batch):
    code, _, err = _run(capsys, f"--benchmark={bench}", f"--system={system}",
                        f"--chips={chips}", f"--global_batch={batch}")  # fmt: skip
    assert code == 0, err


def test_v6_points_cover_every_benchmark():
    _, rows = _v6_rows()
    assert len(rows) >= 14
    assert {r["benchmark"] for r in rows} == {
        "gpt_oss_20b",
        "llama2_70b_lora",
        "llama31_8b",
        "flux1",
        "deepseekv3_671b",
    }


def _calibrated(rows):
    """The points of a benchmark calibrated on its own MLPerf result, in any format (an FP4
    run's linear layers at the FP8 calibration's profiled FP4 rate, its attention at its own)."""
    out = []
    for r in rows:
        shape = model.shape_of(model.benchmark_facts(r["benchmark"]))
        entry = shape.calibration_for(systems.load(r["system"]).family)
        if entry and not entry.source.startswith("assumed"):
            out.append(r)
    return out


def test_v6_points_of_calibrated_benchmarks_are_within_the_issue_bound():
    """Computed from the predictions, never fitted: the v6.0 points calibrate nothing. The
    8-GPU GB300 LoRA run in FP4 is among them (+32 %: FP4 at 1.32 x FP8 on GB300, Transformer
    Engine's profiled layer, not 3 x; -25 % at the peaks' ratio), Dell's FP4 llama31_8b run
    with FP8 attention (+9 %) and NVIDIA's 8- and 72-GPU GB300 llama31_8b runs in FP4 (+8 %,
    +16 %). The 512-GPU GB300 LoRA point is the worst, +34.8 %."""
    _, rows = _v6_rows()
    rows = _calibrated(rows)
    assert "v6-b200-llama-8-dell" in {r["id"] for r in rows}
    assert len(rows) >= 8 and "fp4" in {r["precision"] for r in rows}
    worst = max(rows, key=lambda r: abs(r["error_rcp"]))
    assert abs(worst["error_rcp"]) <= V6_EACH, (worst["id"], worst["error_rcp"])


def test_v6_median_error_is_within_the_issue_bound():
    """The median absolute error over every v6.0 point (22.9 % over 19, each MLPerf's score of
    every run it requires)."""
    _, rows = _v6_rows()
    errors = [abs(r["error_rcp"]) for r in rows]
    assert statistics.median(errors) <= V6_MEDIAN, statistics.median(errors)


def test_v6_each_error_is_within_the_issue_bound():
    """Since the gradient reduction of a run accumulating micro-batches hides only under the
    last one's backward (issue 48, session 12), the 4,096-GPU GB200 DeepSeek-V3 run is -33 %
    (-38 % before): every v6.0 point is within 35 %."""
    _, rows = _v6_rows()
    worst = max(rows, key=lambda r: abs(r["error_rcp"]))
    assert abs(worst["error_rcp"]) <= V6_EACH, (worst["id"], worst["error_rcp"])


def test_the_mi355x_point_is_predicted_uncalibrated_and_says_so():
    """AMD's v5.1 MI355X LoRA result tests a system no benchmark calibrates on: its prediction
    uses the system's stated default efficiency, and the result names that."""
    (point,) = [p for p in validate.load_points()["points"]
                if p["system"] == "mi355x" and p["benchmark"] == "llama2_70b_lora"]  # fmt: skip
    r = model.simulate(benchmark=point["benchmark"], system=systems.load("mi355x"),
                       chips=point["chips"], global_batch=point["global_batch"],
                       precision=point["precision"])  # fmt: skip
    assert r.calibration_source.startswith("uncalibrated")
    assert r.peak_flops == systems.load("mi355x").peak("fp8")


# ---- --validate, --from_log, trainable parameters -----------------------------------------------
def test_validate_prints_every_point_and_marks_the_calibration(capsys):
    code, out, _ = _run(capsys, "--validate")
    assert code == 0
    points = validate.load_points()["points"]
    for p in points:
        assert f"| {p['id']} |" in out, p["id"]
    # "calibrate: SYSTEM FIELD": the points fitted to their total.
    assert out.count("| calibrate") == sum(p["role"].startswith("calibrate") for p in points)


def _log(tmp_path, **values):
    lines = [
        json.dumps(
            {
                "namespace": "",
                "time_ms": 1,
                "event_type": "POINT_IN_TIME",
                "key": k,
                "value": v,
                "metadata": {},
            }
        )  # fmt: skip
        for k, v in values.items()
    ]
    path = tmp_path / "result_0.txt"
    path.write_text("".join(f":::MLLOG {line}\n" for line in lines))
    return str(path)


def test_from_log_predicts_the_logged_run_with_its_disclosed_layout(tmp_path, capsys):
    log = _log(tmp_path, submission_benchmark="llama2_70b_lora",
               submission_platform="18xNVIDIA GB300", global_batch_size=9, tensor_parallelism=1,
               pipeline_parallelism=1, context_parallelism=8, expert_parallelism=1,
               lowest_numerical_precision_in_linear="nvfp4",
               lowest_numerical_precision_in_attn="fp8")  # fmt: skip
    code, out, err = _run(capsys, f"--from_log={log}", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert (r["system"], r["chips"], r["global_batch"]) == ("gb300-nvl72", 72, 9)
    assert (r["context_parallel"], r["model_parallel"], r["precision"]) == (8, 1, "fp4")
    assert r["attention_precision"] == "fp8"  # the disclosed lowest_numerical_precision_in_attn
    code, _, err = _run(capsys, f"--from_log={_log(tmp_path, submission_benchmark='x')}")
    assert code == 2 and "has no submission_platform" in err


def test_simulate_json_gives_the_lora_adapters_as_trainable_parameters(capsys):
    code, out, _ = _run(capsys, "--benchmark=llama2_70b_lora", "--system=b200-dgx", "--chips=8",
                        "--json")  # fmt: skip
    r = json.loads(out)
    # Rank-16 adapters on the fused QKV (8192 -> 8192 + 2 x 1024) and output (8192 -> 8192)
    # projections of Llama 2 70B's 80 blocks: r (d_in + d_out) each.
    layers, rank, hidden, kv = 80, 16, 8192, 1024
    adapters = layers * rank * ((hidden + hidden + 2 * kv) + (hidden + hidden))
    assert r["trainable_parameters"] == adapters == 44_564_480
    assert r["parameters"] > 1000 * r["trainable_parameters"]


def test_the_llama31_8b_calibration_is_its_nvfp4_run_with_fp8_attention():
    """The calibrating run (v5.1 Nebius, 8 B200) as its logs print it: NVFP4 linear layers and
    FP8 attention, the efficiency a fraction of the FP8 peak (at most 0.75) that reproduces
    it; the v5.1 NVFP4 points carry both formats, the v6.0 GB300 8- and 72-GPU points the FP4
    their READMEs' `_fp4` configs name."""
    points = {p["id"]: p for p in validate.load_points()["points"]}
    for name in LLAMA_NVFP4:
        assert (points[name]["precision"], points[name]["attention_precision"]) == ("fp4", "fp8")
    assert points["v6-gb300-llama-8"]["precision"] == "fp4"
    assert points["v6-gb300-llama-72"]["precision"] == "fp4"
    assert points["v6-gb300-llama-512"]["precision"] == "fp8"
    shape = model.shape_of(model.benchmark_facts("llama31_8b"))
    calibration = shape.calibration_for("blackwell")
    assert calibration.precision == "fp8" and calibration.compute_efficiency <= 0.75
    (row,) = validate.rows(
        [points["b200-llama-8-nebius-v51"]], {"b200-dgx": systems.load("b200-dgx")}
    )
    assert row["predicted_rcp"] == pytest.approx(row["published"], rel=2e-3)
