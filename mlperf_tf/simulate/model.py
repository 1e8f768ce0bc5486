"""Provides `simulate()`: one benchmark on one system at one scale, step time to time to train.

Per training step (all times in seconds):

    compute   = per-chip batch x training FLOPs per sample / (peak[precision] x efficiency)
                x (1 + pipeline bubble)
                (attention's score and context products, where the benchmark declares them,
                at the peak of the attention's format instead, `--attention_precision`: BF16
                unless a run turns on FP8 dot-product attention, then 1.5x the BF16 rate
                (`FP8_ATTENTION_SPEEDUP`, cuDNN's figures); half of them for a causal
                model: Transformer Engine quantizes Linear GEMMs only, flash attention skips
                the masked blocks; `SimulatorShape.attention_flops`; the output projections
                onto the vocabulary, where declared, at the peak of `--output_precision`,
                default the run's format; `SimulatorShape.output_flops`)
                (forward 1/3, backward 2/3: the 3x convention of `mlperf_tf.flops`; the peak is
                the dense peak of the run's number format, `--precision`; the efficiency is the
                benchmark's calibration for the system's family, `SimulatorShape.calibration`)
    bubble    = (P - 1) / (V m) for a 1F1B pipeline of P stages, V chunks a stage
                (`--virtual_stages`, interleaved) and m micro-batches per step
                (Narayanan et al. 2021, sec. 2.2: the idle share of an unbalanced-free schedule)
    allreduce = the α–β time of the chosen algorithm on the system's layout
                (gradient bytes = parameters x `gradient_bytes`; an expert's over the chips
                holding it; x 1.5 under `--fsdp`: the weights gathered twice)
    exposed   = allreduce - min(overlap_fraction x allreduce, backward / m): the part of the
                all-reduce that the backward pass cannot hide; a run accumulating m
                micro-batches starts the reduction only in the last one's backward
                (Megatron-core `register_grad_ready`), m = 1 where it does not accumulate
    update    = parameters x optimizer bytes per parameter / memory bandwidth, divided by the
                chips with weight-update sharding (Kumar et al. 2020: each chip updates 1/p of the
                weights between the reduce-scatter and the all-gather, at no extra traffic)
    parallel  = tensor-parallel all-reduces + halos + expert all-to-alls + context-parallel K/V
                ring passes (the part the attention does not hide) + pipeline sends; where
                a run accumulates micro-batches, each layer's collectives pay their latency
                once per micro-batch (`Stages.issues`)
    experts   = micro-batches x the chip's expert weights x 3 reads x 2 bytes / memory bandwidth
                (`expert_weight_streaming`)
    tables    = a chip's samples x the bytes its lookups move through memory / bandwidth + the
                ids', rows' and gradients' all-to-alls (`SimulatorShape.embeddings`)
    device    = compute + exposed + update + parallel + experts + tables + step overhead
                (x replicas where they share cores)
    input     = global batch / (hosts x per-host input rate)
    step      = max(device, input)          (input is prefetched: the slower of the two wins)
                or, for a benchmark whose samples are rollouts (`SimulatorShape.rollouts`),
                max(generation of the slowest rollout, training) + refit (`rollout_times`,
                `_rollout_step`; generator and trainer memory checked, `rollout_memory`)

Time to train = steps to target x step + evaluations x (eval forward passes + eval overhead),
with epochs to target from `convergence.curve` at the global batch and the evaluations those
of the runner's schedule up to the target (the benchmark's declared `eval_cadence()`). Per-sample FLOPs, the
parameter count, the preset sizes and the benchmark's declarations (`simulator_shape()`,
`convergence`) come from the committed cache (`mlperf_tf/simulate/data/flops.json`), so no
TensorFlow is imported: FLOPs traced from the model, or declared by the benchmark
(`Benchmark.training_flops_per_sample`, e.g. Llama 3.1 8B's from its config). A registered
benchmark missing from the cache is counted on the fly (importing TensorFlow).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from mlperf_tf.errors import UserError
from mlperf_tf.facts import EvalCadence, SimulatorShape, normalize_format
from mlperf_tf.parallel import memory as memory_lib
from mlperf_tf.parallel import mesh as mesh_lib
from mlperf_tf.parallel.mesh import DeviceMesh
from mlperf_tf.parallel.pipeline import stage_bounds
from mlperf_tf.simulate import cache, collectives, convergence, parallelism
from mlperf_tf.simulate.cache import FLOPS_CACHE, benchmark_facts, shape_of  # noqa: F401 (the API)
from mlperf_tf.simulate.systems import System


@dataclasses.dataclass(frozen=True)
class Result:
    """One simulated configuration. Times in seconds unless the name says minutes.

    `parameters` counts the model's weights (every expert of a mixture of experts, or the
    trainable ones where the benchmark declares no count); `active_parameters` those one token
    multiplies (a MoE layer's top-k experts; the dense model's every weight);
    `trainable_parameters` those that get gradients (all-reduced and updated: a LoRA run's
    adapters). `mfu` is the model FLOPs the chips sustain over their dense peak in `precision`
    (`peak_flops`, per chip). `scaling_efficiency` is the share of the step each chip spends on
    the work it would do alone (its products without the pipeline bubble, its weight update,
    the step overhead); the rest is communication, bubble or input waits, so it is at most 1.
    It is not `samples_per_s` over `chips` x `single_chip_samples_per_s`: a lone chip updates
    every weight, N chips sharing the update (weight-update sharding, tensor or expert splits)
    update 1/N each, which that ratio would count as more than perfect scaling.
    """

    benchmark: str
    system: str
    chips: int
    failed_chips: int
    layout: str
    algorithm: str
    weight_update_sharding: bool
    global_batch: int
    per_chip_batch: float
    parameters: int
    active_parameters: int
    trainable_parameters: int
    model_parallel: int
    spatial_partition: str
    expert_parallel: int
    pipeline_parallel: int
    context_parallel: int
    micro_batch_size: int
    precision: str
    peak_flops: float
    mfu: float
    calibration_source: str
    model_parallel_s: float
    context_parallel_s: float
    pipeline_s: float
    pipeline_bubble: float
    halo_s: float
    all_to_all_s: float
    compute_s: float
    allreduce_s: float
    allreduce_latency_s: float
    allreduce_bandwidth_s: float
    exposed_comm_s: float
    weight_update_s: float
    overhead_s: float
    input_limit_s: float
    input_bound: bool
    step_time_s: float
    samples_per_s: float
    single_chip_samples_per_s: float
    scaling_efficiency: float
    epochs_to_target: float
    samples_to_target: float
    convergence_source: str
    eval_s: float
    time_to_train_min: float
    evaluations: int = 0
    memory_per_chip_gb: float = 0.0
    expert_weights_s: float = 0.0
    embedding_lookup_s: float = 0.0
    embedding_all_to_all_s: float = 0.0
    rollout_decode_s: float = 0.0
    rollout_prefill_s: float = 0.0
    rollout_environment_s: float = 0.0
    exposed_generation_s: float = 0.0
    refit_s: float = 0.0
    virtual_stages: int = 1
    slowest_rollout_s: float = 0.0  # a step's generation (streamed mean rollouts + the slowest)
    rollout_streamed_s: float = 0.0  # of which the mean rollouts streamed before the slowest
    logprob_s: float = 0.0  # the trainer's log-probability pass before its update
    generator_memory_gb: float = 0.0
    attention_precision: str = "bf16"
    output_precision: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class _Workload:
    """What one sample costs and what the chips hold, after the MoE config is applied.

    Attributes:
      flops: training FLOPs per sample (a MoE layer's top-k experts, capacity padding included).
      params: trainable parameters (what the all-reduce sums and the optimizer updates).
      parameters, active_parameters: the counts `Result` reports.
      expert_params: the experts' share of `params` (split over the expert axis).
      moe: the mixture of experts (num_experts 0: dense).
      shape: the benchmark's declared `simulator_shape()`.
    """

    flops: float
    params: float
    parameters: float
    active_parameters: float
    expert_params: float = 0.0
    moe: parallelism.Moe = parallelism.Moe()
    shape: SimulatorShape = SimulatorShape()


@dataclasses.dataclass(frozen=True)
class Constants:
    """The numbers of one benchmark on one system, resolved once: its calibration for the
    system's family (`SimulatorShape.calibration`) or the system's defaults, in the run's format.
    """

    precision: str
    peak: float
    efficiency: float
    overlap: float
    input_rate: float
    per_chip_batch: int
    source: str
    attention_scale: float = 1.0
    attention_precision: str = "bf16"
    output_scale: float = 1.0
    output_precision: str = ""
    linear_scale: float = 1.0

    @property
    def chip_flops(self) -> float:
        return self.peak * self.efficiency


def constants(
    system: System,
    benchmark: str,
    shape: SimulatorShape,
    precision: str | None = None,
    attention_precision: str | None = None,
    output_precision: str | None = None,
) -> Constants:
    """The constants of `benchmark` on `system` in `precision` (None: the benchmark's reference
    format, or the chip's native one where it lacks that), its attention products in
    `attention_precision` (None: the reference's, `SimulatorShape.attention_precision`, or the
    chip's 16-bit format where it lacks that), its output projections in `output_precision`
    (None: the run's format).

    Raises:
      UserError: a `precision`, `attention_precision` or `output_precision` the chip has no
        peak for.
    """
    calibration = shape.calibration_for(system.family)
    if precision is None:
        precision = shape.precision if shape.precision in system.formats else system.native_format
    peak = system.peak(precision)
    attention = _attention_format(system, shape, attention_precision)
    output = precision if output_precision is None else output_precision
    output_peak = system.peak(output, flag="--output_precision")
    if benchmark in system.compute_efficiency:
        source = f"system file: compute_efficiency.{benchmark}"
    elif calibration is not None and calibration.compute_efficiency is not None:
        source = calibration.source
    else:
        source = f"uncalibrated: '{system.name}' default"
    base = normalize_format(calibration.precision) if calibration is not None else None
    return Constants(
        precision=normalize_format(precision),
        peak=peak,
        efficiency=system.efficiency(benchmark, calibration),
        overlap=system.overlap(benchmark, calibration),
        input_rate=system.input_rate_per_host(benchmark, calibration),
        per_chip_batch=system.default_per_chip_batch(benchmark, calibration),
        source=source,
        attention_scale=_attention_scale(system, shape, peak, attention),
        attention_precision=attention,
        # the time of an output FLOP over a FLOP at the run's peak
        output_scale=peak / linear_rate(system, output, base, output_peak),
        output_precision=normalize_format(output),
        linear_scale=peak / linear_rate(system, precision, base, peak),
    )


# The 12 GEMMs of one transformer layer (hidden 4,096, intermediate 16,384, 15,872 tokens) on
# an NVIDIA B300, from Transformer Engine's GEMM profiling guide (NVIDIA/TransformerEngine
# docs/features/low_precision_training/gemm_profiling/gemm_profiling.rst, the guide's draft,
# commit ce616e1): per format, the kernels alone ("pre-quantized") and the quantization that
# training adds ("autocast" minus pre-quantized: casts, block scales, NVFP4's Hadamard
# transforms and stochastic rounding), in ms. BF16 12.227 ms autocast, nothing to quantize
# (its pre-quantized 12.835 times the same kernels again); MXFP8 8.507 (7.324 kernels); NVFP4
# 6.439 (3.754): MXFP8 1.44 x BF16 and NVFP4 1.32 x MXFP8 in training, against the peaks' 2 x
# and 3 x. The guide as merged (docs/examples/gemm_profiling/, commit 1609c890e) has BF16
# 12.758, MXFP8 8.984 (7.161), NVFP4 6.453 (3.764): not adopted, docs/scaling.md "Issue 48,
# session 11" says why.
LAYER_GEMM_MS = {
    "bf16": (12.227, 0.0),
    "fp8": (7.324, 8.507 - 7.324),
    "fp4": (3.754, 6.439 - 3.754),
}
# The B300's dense peaks in those formats and its HBM bandwidth (gb300-nvl72.json's figures).
LAYER_GEMM_PEAK = {"bf16": 2.5e15, "fp8": 5e15, "fp4": 15e15}
LAYER_GEMM_BANDWIDTH = 8e12


def layer_gemm_s(system: System, fmt: str) -> float:
    """The profiled layer's GEMM time on `system` in `fmt` ("bf16", "fp8" or "fp4"): the
    kernels at the chip's peak in the format, the quantization at its memory bandwidth (both
    memory- and compute-bound parts scaled from the B300 they were measured on)."""
    kernels, quantize = LAYER_GEMM_MS[fmt]
    return 1e-3 * (
        kernels * LAYER_GEMM_PEAK[fmt] / system.peak(fmt)
        + quantize * LAYER_GEMM_BANDWIDTH / system.memory_bandwidth
    )


def linear_rate(system: System, fmt: str, base: str | None, peak: float) -> float:
    """The FLOP/s (before the calibrated efficiency) of linear layers run in `fmt` by a
    benchmark whose efficiency is a fraction of the `base` format's peak: a calibration in one
    of the profiled formats (BF16, FP8, FP4) carried to layers in another at the profiled
    layer's rate ratio on this chip (`layer_gemm_s`: FP4 over FP8 1.04 x on B200, 1.32 x on
    GB300; FP8 over BF16 1.44-1.46 x on Blackwell, 1.45 x on H100; not the 2 or 3 x of the peaks;
    docs/scaling.md, "Efficiency per number format" and "Issue 48, session 11"); any other
    format at its `peak` (the calibrated fraction of its own peak)."""
    fmt = normalize_format(fmt)
    pair = {fmt, base}
    if (
        base is None
        or fmt == base
        or not pair <= set(LAYER_GEMM_MS)
        or not pair <= set(system.formats)
    ):
        return peak
    return system.peak(base) * layer_gemm_s(system, base) / layer_gemm_s(system, fmt)


def _attention_format(system: System, shape: SimulatorShape, given: str | None) -> str:
    """The format of the attention products: `given` (checked against the chip), else the
    reference's where the chip has it, else the chip's 16-bit one (BF16, or its native format
    where it has no BF16: V100 fp16, P40 fp32)."""
    if given is not None:
        system.peak(given, flag="--attention_precision")
        return normalize_format(given)
    if shape.attention_precision in system.formats:
        return shape.attention_precision
    return "bf16" if "bf16" in system.formats else system.native_format


# cuDNN's FP8 flash attention against its BF16 one: "up to 2x" (BF16) and "up to 3x" (FP8)
# faster than PyTorch's eager attention on an H200 (NVIDIA, "Accelerating Transformers with
# NVIDIA cuDNN 9", 2024): 1.5x, not the 2x of the FP8 peak (the softmax and the scaling run
# at one rate in either format).
FP8_ATTENTION_SPEEDUP = 1.5


def _attention_scale(system: System, shape: SimulatorShape, peak: float, fmt: str) -> float:
    """The time of one counted attention FLOP over that of one FLOP in the run's format: the
    products run at the peak of `fmt`, half of them computed where the attention is causal
    (`SimulatorShape.attention_flops`). An 8-bit attention (a run's FP8 dot-product
    attention, e.g. NeMo's `FP8_DPA=True`: cuDNN's FP8 flash attention) runs at
    `FP8_ATTENTION_SPEEDUP` x the BF16 attention's rate, where the chip has BF16, times the
    chip's `fp8_attention_factor` (a B300's faster softmax; at most its 8-bit peak)."""
    computed = 0.5 if shape.causal else 1.0
    rate = system.peak(fmt)
    if fmt != "bf16" and "bf16" in system.formats and rate > system.peak("bf16"):
        speedup = FP8_ATTENTION_SPEEDUP * system.fp8_attention_factor  # a B300's softmax
        rate = min(rate, speedup * system.peak("bf16"))
    return computed * peak / rate


def simulate(
    *,
    benchmark: str,
    system: System,
    chips: int,
    global_batch: int | None = None,
    algorithm: str | None = None,
    weight_update_sharding: bool = False,
    failed_chips: int = 0,
    wraparound: str = "auto",
    preset: str = "mlperf",
    epochs_to_target: float | None = None,
    model_parallel: int = 1,
    spatial_partition: str = "1",
    expert_parallel: int = 1,
    moe: parallelism.Moe | None = None,
    pipeline_parallel: int = 1,
    context_parallel: int = 1,
    micro_batch_size: int | None = None,
    precision: str | None = None,
    fsdp: bool = False,
    virtual_stages: int = 1,
    recompute_attention: bool = False,
    attention_precision: str | None = None,
    output_precision: str | None = None,
    recompute_mlp: bool = False,
    first_eval_samples: float | None = None,
) -> Result:
    """Predicts one configuration (see the module docstring for the model).

    Args:
      benchmark: a cached or registered benchmark name.
      system: the machine.
      chips: chips (GPUs, TPU chips, logical devices) taking part, failed ones included.
      global_batch: samples per step; default `_default_batch`.
      algorithm: all-reduce algorithm; default the system's first.
      weight_update_sharding: each chip updates 1/p of the weights.
      failed_chips: holes in a torus/mesh that the all-reduce routes around (their share of the
        batch moves to the working chips).
      wraparound: torus wrap-around links: auto, on or off.
      preset: which preset's model and sizes.
      epochs_to_target: override the convergence curve (e.g. a published run's own epochs).
      model_parallel, spatial_partition, expert_parallel: the mesh flags of `mlperf-tf run`
        (`mlperf_tf.parallel.mesh.DeviceMesh`): M chips split every weight, K (KxL) chips split
        every image, E chips split each MoE layer's experts.
      moe: experts added to a dense Transformer-family benchmark (`--config.model.moe.*`); a
        benchmark that declares its own (`SimulatorShape.experts`) uses those.
      pipeline_parallel: P chips hold consecutive 1/P of the blocks (a 1F1B pipeline).
      context_parallel: C chips share each sample, 1/C of its tokens each (ring attention).
      micro_batch_size: samples per pipeline micro-batch (default 1).
      virtual_stages: model chunks per pipeline stage (an interleaved 1F1B schedule; 1: plain).
      precision: the number format of the products (default: the benchmark's reference).
      fsdp: weights and gradients sharded over the data-parallel groups too (FSDP; Megatron's
        `optim_grads_params`): in the memory count, and the weights gathered before the forward
        and again before the backward (`_step`).
      recompute_attention: the attention's score and context products run their forward once
        more in the backward (Megatron's selective recomputation, `recompute_modules:
        ['core_attn']`, as Dell's gpt_oss_20b log prints it).
      recompute_mlp: the feed-forwards that are not mixtures of experts run their forward
        once more in the backward (Megatron's `recompute_modules: ['mlp']`, which skips MoE
        layers: `SimulatorShape.dense_mlp_flops`; the v6.0 GB200 DeepSeek-V3 configs'
        `RECOMPUTE_MODULES="mlp"`).
      attention_precision: the number format of the attention's score and context products
        (default: the reference's, BF16 for every benchmark here; "fp8" where a run turns on
        FP8 dot-product attention).
      output_precision: the number format of the output projections onto the vocabulary, where
        the benchmark declares them (`SimulatorShape.output_flops`; default: the run's
        `precision`; "bf16" for a run that keeps its LM head out of FP8, as NeMo does without
        `FP8_OUTPUT_PROJ`).

    Raises:
      UserError: an unknown benchmark or algorithm, chips that do not fit the system, failed
        chips off a torus or not fewer than the chips, a batch smaller than the data-parallel
        groups, a parallel flag that does not divide the chips or fit the benchmark, or a
        layout whose bytes per chip exceed the chip's memory (`_check_memory`).
      first_eval_samples: the first evaluation after this many samples, on the interval's
        grid, none skipped (0: after one interval), where a run did not follow the
        benchmark's declared first evaluation (`eval_cadence`; the DLRMv4 reference's RCP
        runs evaluated from the start); None: the declared one.
    """
    facts = benchmark_facts(benchmark, preset)
    layout, algorithm = _check_system(system, chips, algorithm, failed_chips, wraparound)
    working = chips - failed_chips
    shape = shape_of(facts)
    const = constants(system, benchmark, shape, precision, attention_precision, output_precision)
    weight_update_sharding = weight_update_sharding or shape.weight_update_sharding
    moe = _moe_of(benchmark, shape, moe or parallelism.Moe())
    stages = parallelism.Stages.checked(
        shape, benchmark, working, pipeline_parallel, context_parallel, micro_batch_size,
        cache.family("blocks"), virtual_stages,
        accumulate="decoder" in facts,  # its memory is counted a micro-batch at a time
    )  # fmt: skip
    mesh = _check_parallel(
        benchmark, shape, layout, working // stages.size, model_parallel, spatial_partition,
        expert_parallel, moe,
    )  # fmt: skip
    if stages.size > 1 and layout.chips > 1:
        what = "--model_parallel x --spatial_partition x --context_parallel x --pipeline_parallel"
        for size in (mesh.group_size * stages.size, mesh.group_size * stages.pipeline):
            parallelism.check_fits(layout, size, f"{what} ({size})")
    batch_given = global_batch is not None
    if global_batch is None:
        global_batch = _default_batch(const, benchmark, preset, facts, working // stages.size)
    if shape.rollouts is None:  # rollouts: instances share a batch, trainers split samples
        _check_batch(global_batch, mesh, batch_given=batch_given, failed_chips=failed_chips)
    else:
        _check_groups(benchmark, shape, global_batch)
    stages.check_batch(global_batch / mesh.batch_shards)
    work = _workload(benchmark, facts, shape, moe)
    if shape.rollouts is not None:  # a rollout's training FLOPs at its mean length (MFU's too)
        work = dataclasses.replace(work, flops=shape.rollouts.training_flops_per_sample())
    per_group = global_batch / mesh.batch_shards  # a group's samples
    memory = _check_memory(
        system, facts, shape, mesh, stages, per_group=per_group, trainable=work.params,
        sharding=weight_update_sharding, fsdp=fsdp, precision=const.precision,
        model_parallel=model_parallel, expert_parallel=expert_parallel,
    )  # fmt: skip
    split = mesh.group_size * stages.size  # chips that share a group's samples
    step = _step(
        system=system, const=const, layout=layout, algorithm=algorithm,
        per_chip_batch=per_group, global_batch=global_batch, work=work, mesh=mesh,
        sharding=weight_update_sharding, failed_chips=failed_chips, stages=stages,
        fsdp=fsdp, recompute_attention=recompute_attention, recompute_mlp=recompute_mlp,
    )  # fmt: skip
    if shape.rollouts is not None:
        step = _rollout_step(system, const, layout, shape.rollouts, global_batch, working, step)
    samples_per_s = global_batch / step["step_time_s"]
    single_rate = _single_chip_rate(system, const, algorithm, work, per_group / split)
    eval_tables_s = parallelism.embedding_eval_s(  # an evaluation's lookups and all-to-alls
        system, layout if layout.chips > 1 else None, shape.embeddings, working,
        float(facts["eval_examples"]) / working,
    )  # fmt: skip
    eval_rollouts_s = fill_s = None
    if shape.rollouts is not None:
        eval_rollouts_s, fill_s = _rollout_run_extras(
            system, const, layout, shape.rollouts, global_batch, working, facts
        )
    train = _time_to_train(
        system, const, benchmark, preset, facts, global_batch, step["step_time_s"], working,
        epochs_to_target, eval_tables_s, eval_rollouts_s, fill_s or 0.0, first_eval_samples,
    )  # fmt: skip
    mfu = samples_per_s * work.flops / (working * const.peak)
    return Result(
        benchmark=benchmark, system=system.name, chips=chips, failed_chips=failed_chips,
        layout=layout.describe(), algorithm=algorithm,
        weight_update_sharding=weight_update_sharding, global_batch=int(global_batch),
        per_chip_batch=per_group / split, parameters=int(work.parameters),
        active_parameters=int(work.active_parameters), trainable_parameters=int(work.params),
        model_parallel=model_parallel, spatial_partition=str(spatial_partition),
        expert_parallel=expert_parallel, pipeline_parallel=stages.pipeline,
        context_parallel=stages.context, micro_batch_size=stages.micro_batch_size,
        virtual_stages=stages.virtual,
        precision=const.precision, attention_precision=const.attention_precision,
        output_precision=const.output_precision,
        peak_flops=const.peak, mfu=mfu,
        calibration_source=const.source,
        single_chip_samples_per_s=single_rate, samples_per_s=samples_per_s,
        scaling_efficiency=_own_work_s(step) / step["step_time_s"], **train, **step,
        memory_per_chip_gb=memory.total / memory_lib.GB if memory else 0.0,
    )  # fmt: skip


def _check_memory(
    system, facts, shape, mesh, stages, *, per_group, trainable, sharding, fsdp, precision,
    model_parallel, expert_parallel,
) -> memory_lib.ChipMemory | None:  # fmt: skip
    """The bytes the worst chip of the layout holds (`mlperf_tf.parallel.memory.decoder_memory`
    with Megatron's mixed-precision state in the run's format, `precision_bytes`), for a
    benchmark whose cache entry carries its decoder's sizes; None for the others.

    Weight-update sharding divides the optimizer state (fp32 master weights and moments) over
    the data-parallel groups (Megatron's distributed optimizer), `fsdp` the weights and
    gradients too, over the chips that hold the same dense weights (`batch_shards`: data x
    expert, as Megatron shards them); a mixture of experts' experts' state over the chips that
    hold the same experts, the data axis alone (Megatron's expert-data-parallel group:
    `_expert_moments`). Activations: the least a run can keep, with full recomputation (each
    layer's input, and one layer's activations during its backward), for one micro-batch of
    `--micro_batch_size` samples (a run accumulates the rest), times the 1F1B schedule's
    micro-batches in flight on the first stage: a layout is refused only if no memory plan fits
    it; or, where the benchmark declares that its reference keeps them
    (`SimulatorShape.recompute` False), Megatron's activations without recomputation. The step
    model does not charge the recomputation (the runs recompute little: Dell's gpt_oss_20b log
    recomputes `core_attn` alone).

    Raises:
      UserError: the bytes exceed `memory.HEADROOM` of the system's `memory_capacity`.
    """
    if "decoder" not in facts or not system.memory_capacity or shape.blocks is None:
        return None
    if shape.rollouts is not None:  # two pools, not one layout: `rollout_memory` checks them
        return None
    config = memory_lib.DecoderSizes.from_dict(facts["decoder"])
    layout = memory_lib.ChipLayout(
        tensor=model_parallel, pipeline=stages.pipeline, expert=expert_parallel,
        context=stages.context, data=mesh.batch_shards, shard_moments=sharding,
    )  # fmt: skip
    frozen = trainable < config.parameters
    chip = memory_lib.decoder_memory(
        config, seq=shape.blocks.tokens_per_sample, micro_batch=stages.micro_batch_size,
        micro_batches=max(1, round(stages.micro_batches(per_group))), layout=layout,
        trainable_parameters=trainable if frozen else None, shard_weights=fsdp,
        recompute=shape.recompute, **memory_lib.precision_bytes(precision),
    )  # fmt: skip
    if sharding and expert_parallel > 1 and not frozen:
        extra = _expert_moments(config, chip.stage, layout, mesh.data)
        chip = dataclasses.replace(chip, moments=chip.moments + extra)
    usable = memory_lib.HEADROOM * system.memory_capacity
    if chip.total > usable:
        gb = memory_lib.GB
        how = "even recomputing every activation"
        if not shape.recompute:
            how = "as its reference keeps its activations"
        raise UserError(
            f"--model_parallel={model_parallel} --context_parallel={stages.context} "
            f"--pipeline_parallel={stages.pipeline} --expert_parallel={expert_parallel}"
            f"{' --weight_update_sharding' if sharding else ''}{' --fsdp' if fsdp else ''} does "
            f"not fit a chip of {system.name} {how}: "
            f"{chip.total / gb:.0f} GB (weights "
            f"{chip.weights / gb:.0f}, gradients {chip.gradients / gb:.0f}, optimizer "
            f"{chip.moments / gb:.0f}, activations {chip.activations / gb:.0f}) over "
            f"{usable / gb:.0f} GB ({memory_lib.HEADROOM:.0%} of {system.memory_capacity / gb:.0f}"
            f"); shard more (--weight_update_sharding, --fsdp, --pipeline_parallel, "
            f"--model_parallel, --context_parallel) or use more chips"
        )
    return chip


def _expert_moments(config, stage: int, layout, data: int) -> float:
    """The optimizer bytes of the experts on one chip of `stage` beyond what dividing them over
    the data x expert chips counts: Megatron's distributed optimizer shards an expert's state
    over the chips holding that expert (the data axis alone), E times fewer."""
    first, end = stage_bounds(config.num_hidden_layers, layout.pipeline, config.pipeline_layers)[
        stage
    ]
    h, moe = config.hidden_size, config.moe
    per_layer = config.moe_layer_parameters() - h * moe.num_experts  # the router is replicated
    held = sum(moe.is_moe(i) for i in range(first, end)) * per_layer / layout.expert
    moments = memory_lib.OPTIMIZER_BYTES
    return held * moments * (1.0 / max(1, data) - 1.0 / layout.data)


def _own_work_s(step: dict[str, Any]) -> float:
    """Seconds of a step a chip spends on its own work (`Result.scaling_efficiency`)."""
    return (
        step["compute_s"] / (1.0 + step["pipeline_bubble"])
        + step["weight_update_s"]
        + step["overhead_s"]
        + step.get("embedding_lookup_s", 0.0)
    )


def _single_chip_rate(system: System, const: Constants, algorithm: str, work, batch: float):
    """Samples/s of one chip alone on a chip's share of a group's batch: no layout to
    all-reduce over, the whole model and its experts held."""
    alone = dataclasses.replace(work, expert_params=0.0, moe=parallelism.Moe())
    single = _step(
        system=system, const=const, algorithm=algorithm,
        layout=system.layout(1) if system.kind != "torus" else None,
        per_chip_batch=batch, global_batch=batch, work=alone, mesh=DeviceMesh(),
        sharding=False, failed_chips=0, stages=parallelism.Stages(),
    )  # fmt: skip
    return batch / single["step_time_s"]


def _check_system(system: System, chips: int, algorithm, failed_chips: int, wraparound: str):
    """(layout of `chips`, the all-reduce algorithm) after checking them against `system`."""
    layout = system.layout(chips, wraparound=wraparound)
    algorithm = algorithm or system.default_algorithm
    if algorithm not in system.algorithms:
        raise UserError(
            f"--all_reduce ({algorithm!r}) is not available on '{system.name}' "
            f"({system.kind}: {', '.join(system.algorithms)})"
        )
    if failed_chips < 0 or failed_chips >= chips:
        raise UserError(f"--failed_chips ({failed_chips}) must be in [0, {chips - 1}]")
    if failed_chips and system.kind != "torus":
        raise UserError(
            f"--failed_chips needs a torus/mesh system; '{system.name}' is {system.kind}"
        )
    return layout, algorithm


def _default_batch(const: Constants, benchmark: str, preset: str, facts, working: int) -> int:
    """The batch the benchmark's reference runs where it declares one
    (`SimulatorShape.reference_batch`), else the per-chip batch (the benchmark's for the
    system's family, or the system's) x working data-parallel chips (or the preset's global
    batch), no larger than the largest batch with convergence data (beyond it epochs are
    guesses)."""
    reference = shape_of(facts).reference_batch  # the benchmark's own, where it declares one
    if reference:
        return reference
    global_batch = const.per_chip_batch * working or int(facts["global_batch_size"])
    curve = convergence.curve(benchmark, preset)
    return max(min(global_batch, curve.batches[-1]), working)


def _check_groups(benchmark: str, shape: SimulatorShape, global_batch: int | None) -> None:
    """A batch of rollouts is whole groups (`Rollouts.group_size`: GRPO's rollouts of one
    prompt), whatever the layout.

    Raises:
      UserError: it is not.
    """
    group = shape.rollouts.group_size if shape.rollouts is not None else 1
    if global_batch is not None and global_batch % group:
        raise UserError(
            f"--global_batch ({global_batch}) must be whole groups of the {group} rollouts "
            f"'{benchmark}' generates from one prompt: e.g. {max(1, global_batch // group) * group}"
        )


def _check_batch(global_batch: int, mesh: DeviceMesh, *, batch_given: bool, failed_chips: int):
    """Refuses a global batch smaller than the data-parallel groups, or (given) uneven over them.

    With holes (--failed_chips) the failed chips' samples move to others: uneven by design.
    """
    groups, split = mesh.batch_shards, mesh.group_size
    what = "working chips" if split == 1 else f"data-parallel groups ({mesh.size} / {split})"
    if global_batch < groups:
        raise UserError(
            f"--global_batch ({global_batch}) is smaller than the {groups} {what}: use a larger "
            "batch, or split each sample over chips (model, context, pipeline or spatial "
            "parallelism)"
        )
    if global_batch % groups and batch_given and not failed_chips:
        raise UserError(
            f"--global_batch ({global_batch}) does not split evenly over the {groups} {what}: "
            f"use a multiple of {groups}"
        )


def _moe_of(benchmark: str, shape: SimulatorShape, flags: parallelism.Moe) -> parallelism.Moe:
    """The experts of the run: those the benchmark declares (`SimulatorShape.experts`), else
    the ones `--config.model.moe.*` adds to a dense model.

    Raises:
      UserError: experts added by flag to a benchmark that declares its own.
    """
    declared = shape.experts
    if declared is None:
        return flags
    if flags.num_experts:
        raise UserError(
            f"--config.model.moe.num_experts ({flags.num_experts}): benchmark '{benchmark}' "
            f"declares its own experts ({declared.num_experts} per MoE layer); the flag adds "
            "experts to a dense benchmark"
        )
    return parallelism.Moe(
        num_experts=declared.num_experts,
        every=declared.every,
        top_k=declared.top_k,
        capacity_factor=declared.capacity_factor,
        first_dense=declared.first_dense,
    )


def _workload(benchmark: str, facts: dict[str, Any], shape, moe) -> _Workload:
    """FLOPs and parameters of one sample with the experts of `moe` (see `_Workload`)."""
    flops = float(facts["training_flops_per_sample"])
    params = float(facts["trainable_parameters"])
    parameters = float(facts.get("parameters", params))
    active = float(facts.get("active_parameters", parameters))
    if not moe.num_experts:
        return _Workload(flops, params, parameters, active, shape=shape)
    b = parallelism.blocks_of(
        shape, "config.model.moe.num_experts", benchmark, cache.family("blocks")
    )
    layers = moe.layers(b.blocks)
    expert_params = layers * moe.num_experts * b.ffn_parameters
    if shape.experts is not None:  # declared: the counts already hold every expert
        return _Workload(flops, params, parameters, active, expert_params, moe, shape)
    # Each MoE layer holds num_experts feed-forwards instead of one; a token runs top_k of them
    # (its capacity padding computed too).
    params += expert_params - layers * b.ffn_parameters
    parameters += expert_params - layers * b.ffn_parameters
    active += layers * (moe.top_k - 1) * b.ffn_parameters
    flops += 3 * layers * b.tokens_per_sample * b.ffn_flops_per_token * (moe.slots - 1)
    return _Workload(flops, params, parameters, active, expert_params, moe, shape)


def eval_cadence(facts: dict[str, Any], first_eval_samples: float | None = None) -> EvalCadence:
    """The benchmark's declared evaluation cadence (`Benchmark.eval_cadence`) in its cache
    entry (an older cache: one every `eval_every_epochs`), its first evaluation moved to
    `first_eval_samples` where given (on the grid, none skipped)."""
    declared = facts.get("eval_cadence")
    if declared is None:
        return EvalCadence(every_epochs=float(facts["eval_every_epochs"]))
    cadence = EvalCadence.from_dict(declared)
    if first_eval_samples is None or cadence.every_epochs:
        return cadence
    first = (0.0, float(first_eval_samples)) if first_eval_samples else (0.0, 0.0)
    return dataclasses.replace(
        cadence, first=first, first_rounding="ceil", first_on_grid=True, skipped=(0.0, 0.0)
    )


def _time_to_train(
    system, const, benchmark, preset, facts, global_batch, step_s, working, epochs_to_target,
    eval_tables_s=0.0, eval_rollouts_s=None, fill_s=0.0, first_eval_samples=None,
) -> dict[str, Any]:  # fmt: skip
    """Epochs and samples to the target, the evaluations' time and the time to train; each
    evaluation its forward FLOPs, the system's eval overhead and `eval_tables_s` (its embedding
    lookups, `parallelism.embedding_eval_s`), or, where its samples are generated rollouts,
    `eval_rollouts_s` and the overhead; `fill_s` once (an asynchronous rollout run's first
    generation, which no training overlaps: `_rollout_run_extras`)."""
    epoch_examples = float(facts["train_examples"])
    if epochs_to_target is not None:
        epochs, source = float(epochs_to_target), "given"
    else:
        curve = convergence.curve(benchmark, preset)
        epochs = curve.at(global_batch) / (epoch_examples if curve.in_samples else 1.0)
        source = curve.source + curve.range_note(global_batch)
    samples = epochs * epoch_examples
    steps = math.ceil(samples / global_batch)
    evals = eval_cadence(facts, first_eval_samples).evaluations(
        global_batch, int(epoch_examples), steps
    )
    eval_flops = float(facts["forward_flops_per_sample"]) * float(facts["eval_examples"])
    compute_rate = _chip_flops(system, const, working) * working
    one = eval_flops * const.linear_scale / compute_rate + eval_tables_s
    if eval_rollouts_s is not None:
        one = eval_rollouts_s
    eval_s = evals * (one + system.eval_overhead_s)
    return {
        "epochs_to_target": epochs,
        "samples_to_target": samples,
        "convergence_source": source,
        "eval_s": eval_s,
        "evaluations": evals,
        "time_to_train_min": (steps * step_s + eval_s + fill_s) / 60.0,
    }


def _check_parallel(
    benchmark, shape, layout, working, model_parallel, spatial, experts, moe
) -> DeviceMesh:
    """Validates the parallel flags as `mlperf-tf run` does; returns the working chips' mesh."""
    mesh_lib.check_flags(
        model_parallel=model_parallel, expert_parallel=experts, spatial_partition=str(spatial)
    )
    rows, cols = mesh_lib.parse_spatial(str(spatial))
    if model_parallel > 1:
        parallelism.blocks_of(shape, "model_parallel", benchmark, cache.family("blocks"))
    if rows * cols > 1:
        convs = parallelism.convs_of(shape, benchmark, cache.family("convs"))
        parallelism.check_splits(convs, rows, cols)
    if experts > 1 and shape.embeddings is not None and shape.experts is None:
        raise UserError(
            f"--expert_parallel ({experts}): '{benchmark}' shares its embedding tables over "
            "every chip in the simulator (ids and rows by all-to-all, as TorchRec plans them); "
            "leave the flag out"
        )
    if experts > 1:
        parallelism.blocks_of(shape, "expert_parallel", benchmark, cache.family("blocks"))
        if not moe.num_experts or moe.num_experts % experts:
            raise UserError(
                f"--expert_parallel ({experts}) must divide --config.model.moe.num_experts "
                f"({moe.num_experts})"
            )
    split = model_parallel * rows * cols
    if working % (split * experts):
        raise UserError(
            f"--model_parallel={model_parallel} x --spatial_partition={spatial} x "
            f"--expert_parallel={experts} needs a multiple of {split * experts} chips; "
            f"{working} work"
        )
    parallelism.check_fits(layout, split, f"--model_parallel x --spatial_partition ({split})")
    return mesh_lib.build_mesh(
        working, model_parallel=model_parallel, expert_parallel=experts,
        spatial_partition=str(spatial),
    )  # fmt: skip


def _chip_flops(system: System, const: Constants, working: int) -> float:
    rate = const.chip_flops
    return rate / working if system.shared_compute else rate


def allreduce_cost(
    system: System, layout, algorithm: str, nbytes: float, failed_chips: int = 0
) -> collectives.Cost:
    """The α–β all-reduce time of `nbytes` per chip with `algorithm` on `layout`."""
    if layout is None or layout.chips <= 1:
        return collectives.ZERO
    if system.kind == "torus":
        if algorithm == "torus2d":
            return collectives.torus_allreduce(
                nbytes, layout.shape, layout.wraps, system.link, failed_chips=failed_chips
            )
        # One ring snaking through every chip (a Hamiltonian cycle of the slice), run in both
        # directions; a hole breaks it into a folded line with detours like a torus line.
        cost = collectives.ring_allreduce(nbytes, layout.chips, system.link, bidirectional=True)
        if failed_chips:
            factor = collectives.detour_contention(layout.shape, failed_chips)
            cost = collectives.Cost(
                cost.latency_s + 4 * failed_chips * system.link.alpha, cost.bandwidth_s * factor
            )
        return cost
    if system.kind == "switched":
        per_node, nodes = layout.chips_per_node, layout.nodes
        return parallelism.switched_allreduce(system, nbytes, per_node, nodes, algorithm)
    return collectives.ring_allreduce(nbytes, layout.chips, system.link)


def _gradient_cost(
    system: System, layout, algorithm: str, stride: int, held: float, failed_chips: int
) -> collectives.Cost:
    """The all-reduce of `held` weights' gradients over their replicas, every `stride`-th
    chip of `layout` (`parallelism.data_layout`)."""
    if layout is None:
        return collectives.ZERO
    replicas = parallelism.data_layout(system, layout, stride)
    return allreduce_cost(system, replicas, algorithm, held * system.gradient_bytes, failed_chips)


def _step(
    *,
    system: System,
    const: Constants,
    layout,
    algorithm: str,
    per_chip_batch: float,
    global_batch: float,
    work: _Workload,
    mesh: DeviceMesh,
    sharding: bool,
    failed_chips: int,
    stages: parallelism.Stages,
    fsdp: bool = False,
    recompute_attention: bool = False,
    recompute_mlp: bool = False,
) -> dict[str, Any]:
    """The step's parts (seconds) of the chips of `mesh` x `stages` (each stage and context
    shard a `mesh` of its own); `per_chip_batch` is a group's batch.

    Under `fsdp` the gradient collective carries 1.5 x an all-reduce's bytes: the weights are
    all-gathered before the forward and again before the backward and the gradients
    reduce-scattered, three half all-reduces where data parallelism runs two (ZeRO stage 3,
    Rajbhandari et al. 2020, sec. 7.2.2), with the same overlap. `recompute_attention` adds
    one more forward of the attention products (a third of their counted training FLOPs)."""
    split, working = mesh.group_size * stages.size, mesh.size * stages.size
    bubble = stages.bubble(per_chip_batch)
    attention = work.shape.attention_flops  # counted in work.flops, timed at its own peak
    # linear FLOPs at the run's format's rate, attention's and the LM head's at their own
    timed = work.flops * const.linear_scale + attention * (
        const.attention_scale - const.linear_scale
    )
    timed += work.shape.output_flops * (const.output_scale - const.linear_scale)
    if recompute_attention:  # the score and context products' forward, again in the backward
        timed += attention / 3.0 * const.attention_scale
    compute = per_chip_batch * timed / split / _chip_flops(system, const, working)
    compute *= stages.imbalance(work.shape.blocks)  # the longest stage sets the tick
    if recompute_mlp:  # the dense feed-forwards' forward again, on the first stage (they are
        # the first blocks), a longest one: P x their share of a chip's work
        extra = work.shape.recomputed_mlp_flops * const.linear_scale * stages.pipeline
        compute += per_chip_batch * extra / split / _chip_flops(system, const, working)
    backward = compute * 2.0 / 3.0
    compute *= 1.0 + bubble
    # Each chip holds 1/(M P) of the weights (experts: 1/(E P) of them); the gradient all-reduce
    # runs over the replicas of one shard, every (split / C)-th chip: the data-parallel groups
    # and the context shards, which hold the same weights. An expert's replicas are E times
    # fewer and E times farther apart (Megatron's expert-data-parallel group: the data axis
    # alone), so on a switched system its gradients go over those (fewer chips a node share
    # the network) and, sharded, its update over them; on a torus with the dense ones.
    dense = work.params - work.expert_params
    if work.shape.embeddings is not None:  # sharded tables: updated where they live (their
        dense -= work.shape.embeddings.parameters  # rows' traffic is the lookups' below)
    held_dense = dense / mesh.model / stages.pipeline
    held_experts = work.expert_params / mesh.expert / stages.pipeline
    held = held_dense + held_experts
    stride = split // stages.context
    apart = system.kind == "switched" and mesh.expert > 1 and held_experts > 0
    together = held_dense if apart else held
    cost = _gradient_cost(system, layout, algorithm, stride, together, failed_chips)
    if apart:
        cost += _gradient_cost(
            system, layout, algorithm, stride * mesh.expert, held_experts, failed_chips
        )
    if fsdp:  # gather (forward), gather (backward), reduce-scatter: 3 halves of an all-reduce
        cost = collectives.Cost(1.5 * cost.latency_s, 1.5 * cost.bandwidth_s)
    allreduce = cost.total_s
    # Accumulating micro-batches, a bucket's gradients are final only in the last one's
    # backward, and only then is its reduction started (Megatron-core's
    # `_ParamAndGradBuffer.register_grad_ready`: "only ... when processing the last
    # microbatch"): that backward, 1/m of the step's, is what can hide it.
    exposed = allreduce - min(const.overlap * allreduce, backward / stages.issues(per_chip_batch))
    per_byte = system.optimizer_bytes_per_parameter / system.memory_bandwidth
    update = held * per_byte
    if sharding:
        update = held_dense * per_byte / max(1, working // stride)
        expert_stride = stride * (mesh.expert if apart else 1)
        update += held_experts * per_byte / max(1, working // expert_stride)
    model_s = halo_s = a2a_s = context_s = pipeline_s = 0.0
    experts_s = expert_weight_streaming(system, work, mesh, stages, per_chip_batch)
    own = per_chip_batch / split  # a chip's samples
    lookup_s = parallelism.embedding_memory_s(system, work.shape.embeddings, own)
    table_s = 0.0
    if layout is not None and layout.chips > 1:
        table_s = parallelism.embedding_all_to_all_cost(
            system, layout, work.shape.embeddings, working, own
        ).total_s
    if layout is not None and layout.chips > 1:
        blocks = stages.local_blocks(work.shape.blocks)  # a stage's blocks, a shard's tokens
        issues = stages.issues(per_chip_batch)  # each micro-batch pays a collective's latency
        model_s = (
            parallelism.tensor_parallel_cost(system, layout, blocks, mesh.model, per_chip_batch)
            .issued(issues)
            .total_s
        )
        context_s = (1.0 - const.overlap) * stages.context_cost(
            system, layout, blocks, mesh.group_size, per_chip_batch
        ).issued(issues).total_s
        pipeline_s = stages.pipeline_cost(
            system, layout, blocks, mesh.group_size, per_chip_batch
        ).total_s
        halo_s = parallelism.halo_cost(
            system, layout, work.shape, mesh.spatial_rows, per_chip_batch, cols=mesh.spatial_cols
        ).total_s
        a2a_s = parallelism.moe_all_to_all_cost(
            system, layout, blocks, work.moe, mesh.expert, per_chip_batch / mesh.group_size,
            whole=work.shape.blocks,
        ).issued(issues).total_s  # fmt: skip
    # Logical devices sharing the cores also dispatch their replicas' ops one after another.
    overhead = system.step_overhead_s * (working if system.shared_compute else 1)
    device = compute + exposed + update + overhead + model_s + halo_s + a2a_s + context_s
    device += pipeline_s + experts_s + lookup_s + table_s
    hosts = max(1, math.ceil(working / system.chips_per_host))
    input_limit = global_batch / (hosts * const.input_rate)
    return {
        "compute_s": compute,
        "allreduce_s": allreduce,
        "allreduce_latency_s": cost.latency_s,
        "allreduce_bandwidth_s": cost.bandwidth_s,
        "exposed_comm_s": exposed,
        "model_parallel_s": model_s,
        "context_parallel_s": context_s,
        "pipeline_s": pipeline_s,
        "pipeline_bubble": bubble,
        "halo_s": halo_s,
        "all_to_all_s": a2a_s,
        "expert_weights_s": experts_s,
        "embedding_lookup_s": lookup_s,
        "embedding_all_to_all_s": table_s,
        "weight_update_s": update,
        "overhead_s": overhead,
        "input_limit_s": input_limit,
        "input_bound": input_limit > device,
        "step_time_s": max(device, input_limit),
    }


# The layouts `fastest` tries: powers of two up to these (and dividing what they split).
_SEARCH = {
    "model_parallel": 8,
    "context_parallel": 16,
    "pipeline_parallel": 8,
    "expert_parallel": 64,
}


def rollout_times(
    system: System, const: Constants, layout, r, global_batch: float, chips: int
) -> dict[str, float]:
    """The parts of one reinforcement-learning step whose samples are generated rollouts
    (`facts.Rollouts`), in seconds:

    - generation: the pool of `r.generation_chips` x chips in instances of `r.instance_chips`
      runs the step's `global_batch` rollouts, `r.in_flight` of them at once (c = in flight /
      instances on each); a rollout is its decoding, its prefills and its environment turns
      one after another; with all in flight the step waits for its slowest
      (`Rollouts.slowest`: the expected longest of the batch's rollouts, its turns in
      proportion, within the turn and context limits), with fewer slots than rollouts the
      rollouts stream through them and the last slot frees after `r.stream_rollouts` mean
      rollouts and the slowest:
      decode = its generated tokens x a decoding step of the instance (`Rollouts.
      decode_step_s`): (the weights read per decoding step, experts touched by c sequences
      included, + c x (key/value cache over the mean context + recurrent state)) / (instance
      chips x memory bandwidth) + the step's latency beyond its bytes (`Rollouts.
      decode_step_latency_s`: kernels and collectives, paid once a step); prefill = c x (its
      context - its generated tokens) x 2 x active weights / (instance chips x sustained
      FLOP/s); environment = its turns x seconds a turn;
    - training: the trainer's FLOPs of the rollouts (`Rollouts.trainer_flops_per_sample`: 3
      or, recomputing the forward, 4 forward passes over the rollouts' context tokens, the
      weights' products and the causal attention's) on the other chips, at the sustained
      FLOP/s; logprob: its log-probability pass before that (`Rollouts.
      logprob_flops_per_sample`, one forward pass; 0 without one);
    - refit: the weights (bf16, every expert) sent to every generator instance, each chip
      receiving its 1/instance share (all of them with `r.refit_whole`), over the network when
      the run spans several nodes (NVLink domains), else over the chips' links.

    The decode, prefill and environment returned are the slowest rollout's; `generation_s`
    adds the streamed mean rollouts (`mean_rollout_s` each) before it.

    Raises:
      UserError: `chips` too few for one generator instance and a training chip, or a
        generator or training chip whose bytes exceed the chip's memory
        (`rollout_memory`).
    """
    instances = max(1, round(chips * r.generation_chips / r.instance_chips))
    pool = instances * r.instance_chips  # whole instances, the share of the chips
    trainers = chips - pool
    if trainers < 1:
        raise UserError(
            f"--chips ({chips}) leaves no chip to train beside the generators: rollouts are "
            f"generated on instances of {r.instance_chips} chips ({r.generation_chips:.0%} of "
            f"the chips) and trained on the rest; use more than {pool}"
        )
    c = r.in_flight(global_batch) / instances  # rollouts per instance at once
    generated, turns, context = r.slowest(global_batch)  # the rollout the step waits for
    memory = rollout_memory(system, r, c, context, trainers)
    mean_context = r.prompt_tokens + (r.context_tokens - r.prompt_tokens) / 2
    step = r.decode_step_s(c, mean_context, r.instance_chips * system.memory_bandwidth)
    prefill_rate = c * 2 * r.active_parameters * const.linear_scale
    prefill_rate /= r.instance_chips * const.chip_flops  # seconds a prefilled token

    def one(generated: float, turns: float, context: float) -> tuple[float, float, float]:
        """(decode, prefill, environment) seconds of one rollout of these sizes."""
        return (generated * step, (context - generated) * prefill_rate,
                turns * r.environment_s_per_turn)  # fmt: skip

    decode, prefill, environment = one(generated, turns, context)
    mean = sum(one(r.generated_tokens, r.turns, r.context_tokens))
    streamed = r.stream_rollouts(global_batch) * mean
    train = r.trainer_flops_per_sample() * global_batch * const.linear_scale
    train /= trainers * const.chip_flops
    logprob = r.logprob_flops_per_sample() * global_batch * const.linear_scale
    logprob /= trainers * const.chip_flops
    link = system.network if layout is not None and layout.nodes > 1 else system.link
    refit = (r.weight_bytes + r.expert_bytes) / link.bandwidth
    if not r.refit_whole:
        refit /= r.instance_chips
    return {
        "decode_s": decode, "prefill_s": prefill, "environment_s": environment,
        "mean_rollout_s": mean, "streamed_s": streamed,
        "generation_s": streamed + decode + prefill + environment, "training_s": train,
        "logprob_s": logprob, "refit_s": refit,
        "generation_chips": float(pool), "generator_memory": memory,
    }  # fmt: skip


def rollout_memory(system: System, r, concurrency: float, context: float, trainers: int) -> float:
    """The bytes a generator chip holds (its 1/instance share of the bf16 weights, every
    expert, and of the key/value cache and recurrent state of the instance's `concurrency`
    rollouts, each at `context` tokens: the slowest's, what the cache must hold by the step's
    end), after checking it and the training chips' share of the model's state (bf16 weights
    and gradients and 16 bytes of fp32 optimizer state a weight, sharded over every training
    chip: the least a trainer can hold) against the system's memory (`memory.HEADROOM` of it;
    systems without a stated capacity are not checked).

    Raises:
      UserError: either exceeds the usable memory.
    """
    gb = memory_lib.GB
    weights = r.weight_bytes + r.expert_bytes
    cache_bytes = concurrency * (r.kv_bytes_per_token * context + r.state_bytes)
    generator = (weights + cache_bytes) / r.instance_chips
    trainer = weights / parallelism.ACTIVATION_BYTES * (2 + 2 + 16) / trainers
    usable = memory_lib.HEADROOM * system.memory_capacity
    if not system.memory_capacity:
        return generator
    for what, held in (("generator", generator), ("training", trainer)):
        if held > usable:
            raise UserError(
                f"--system={system.name}: a {what} chip would hold {held / gb:.0f} GB "
                f"(generator: weights {weights / r.instance_chips / gb:.0f}, cache of "
                f"{concurrency:.1f} rollouts at {context:,.0f} tokens "
                f"{cache_bytes / r.instance_chips / gb:.0f}; training: weights, gradients and "
                f"optimizer over {trainers} chips {trainer / gb:.0f}) over {usable / gb:.0f} GB "
                f"({memory_lib.HEADROOM:.0%} of {system.memory_capacity / gb:.0f}); use a "
                f"system with more memory a chip{' or more chips' if what == 'training' else ''}"
            )
    return generator


def _rollout_step(system, const, layout, r, global_batch, chips, step) -> dict[str, Any]:
    """The step of a benchmark whose samples are rollouts (`rollout_times`): with rollouts at
    most one step old (`r.max_age` 1) the generation of step k+1 runs beside the training of
    step k, so the step is the longer of the two plus the refit (generation waits for the new
    weights) and what is exposed of the generation is the part training does not cover; with
    `max_age` 0 the three add up. The training's own communication (`step`'s all-reduce, its
    tensor-parallel all-reduces and expert all-to-alls, update and overhead) is added to its
    compute."""
    t = rollout_times(system, const, layout, r, global_batch, chips)
    train = t["training_s"] + step["exposed_comm_s"] + step["weight_update_s"] + step["overhead_s"]
    train += step["model_parallel_s"] + step["all_to_all_s"]  # the training split's traffic
    train += t["logprob_s"]  # the trainer's forward pass before it, on the same chips
    if r.max_age >= 1:
        step_s = max(t["generation_s"], train) + t["refit_s"]
        exposed = max(0.0, t["generation_s"] - train)
    else:
        step_s = t["generation_s"] + train + t["refit_s"]
        exposed = t["generation_s"]
    return {
        **step, "compute_s": t["training_s"], "step_time_s": step_s,
        "rollout_decode_s": t["decode_s"], "rollout_prefill_s": t["prefill_s"],
        "rollout_environment_s": t["environment_s"], "exposed_generation_s": exposed,
        "refit_s": t["refit_s"], "slowest_rollout_s": t["generation_s"],
        "logprob_s": t["logprob_s"], "rollout_streamed_s": t["streamed_s"],
        "generator_memory_gb": t["generator_memory"] / memory_lib.GB,
    }  # fmt: skip


def _rollout_run_extras(system, const, layout, r, global_batch, chips, facts):
    """(an evaluation's seconds or None, the run's pipeline fill in seconds) of a rollout
    benchmark (`facts.Rollouts`): an evaluation generates `eval_generations` rollouts of each
    of its `eval_examples` samples at once on the generation pool and waits for the slowest
    (`rollout_times`' generation; None where the benchmark declares none: forward passes);
    with rollouts up to `max_age` >= 1 steps old the first step's are generated before any
    training, one generation of a step that nothing overlaps; with `drain_before_eval` each
    evaluation first waits for the rollouts in flight (the slowest of the batch's, or of
    `concurrency`, at once)."""
    evaluation = None
    step_generation = rollout_times(system, const, layout, r, global_batch, chips)["generation_s"]
    if r.eval_generations:
        rollouts = float(facts["eval_examples"]) * r.eval_generations
        evaluation = rollout_times(system, const, layout, r, rollouts, chips)["generation_s"]
        if r.drain_before_eval:  # the rollouts in flight (begun at the refit) finish first
            in_flight = r.in_flight(global_batch)
            evaluation += rollout_times(system, const, layout, r, in_flight, chips)["generation_s"]
    fill = step_generation if r.max_age >= 1 else 0.0
    return evaluation, fill


def expert_weight_streaming(
    system: System, work: _Workload, mesh: DeviceMesh, stages: parallelism.Stages,
    group_batch: float,
) -> float:  # fmt: skip
    """Seconds a chip spends reading its experts' weights from memory in one step.

    Each micro-batch runs every expert the chip holds (a dropless layer's grouped products see
    tokens in each), and the products read each expert's weights once forward and twice backward
    (the input gradient and the weight gradient), bf16: 3 x 2 bytes per weight per micro-batch,
    at the memory bandwidth. The fewer chips split the experts, the more weights each streams
    per token it computes: what keeps a mixture of experts of many small experts from running
    on a small expert axis at the compute rate (its products are bound by memory there).
    """
    if not work.expert_params:
        return 0.0
    held = work.expert_params / mesh.expert / stages.pipeline  # 1/(E P) of the experts
    micro = stages.micro_batches(group_batch)
    return micro * held * 3 * parallelism.ACTIVATION_BYTES / system.memory_bandwidth


def fastest(**kwargs) -> Result:
    """The fastest legal layout of `simulate(**kwargs)` (by time to train), as a submitter
    would choose it: data parallelism where the batch allows, else tensor, context, pipeline
    and expert parallelism over the chips the batch cannot feed. Layout arguments given in
    `kwargs` are kept; the others are searched. A layout whose bytes per chip exceed the chip's
    memory is not legal (`_check_memory`: decoders on systems that state their memory).

    Raises:
      UserError: no layout is legal (the error of plain data parallelism says why).
    """
    fixed = {k: kwargs.pop(k) for k in list(kwargs) if k in _SEARCH}
    shape = shape_of(benchmark_facts(kwargs["benchmark"], kwargs.get("preset", "mlperf")))
    constants(  # a format the chip lacks is the user's error, not every layout's
        kwargs["system"], kwargs["benchmark"], shape, kwargs.get("precision"),
        kwargs.get("attention_precision"), kwargs.get("output_precision"),
    )  # fmt: skip
    _check_groups(kwargs["benchmark"], shape, kwargs.get("global_batch"))  # not a layout's
    moe = kwargs.get("moe") or parallelism.Moe()
    searched = dict(_SEARCH)
    if shape.blocks is None:  # nothing for tensor, context or pipeline parallelism to split
        searched = {flag: 1 for flag in searched}
    if shape.experts is None and not moe.num_experts:
        searched["expert_parallel"] = 1
    sizes = {
        flag: [fixed[flag]] if flag in fixed else [2**i for i in range(most.bit_length())]
        for flag, most in searched.items()
    }
    working = kwargs["chips"] - kwargs.get("failed_chips", 0)
    best, first_error = None, None
    for tp in sizes["model_parallel"]:
        for cp in sizes["context_parallel"]:
            for pp in sizes["pipeline_parallel"]:
                for ep in sizes["expert_parallel"]:
                    product = tp * cp * pp * ep
                    searched_only = dict(zip(_SEARCH, (tp, cp, pp, ep)))
                    plain = all(v == 1 for k, v in searched_only.items() if k not in fixed)
                    if not plain and (product < 1 or working % product):  # skip, unless it is
                        continue  # the layout the flags pin (its error is the one to show)
                    try:
                        r = simulate(
                            model_parallel=tp, context_parallel=cp, pipeline_parallel=pp,
                            expert_parallel=ep, **kwargs,
                        )  # fmt: skip
                    except UserError as e:
                        first_error = first_error or e
                        continue
                    if best is None or r.time_to_train_min < best.time_to_train_min:
                        best = r
    if best is None and not any(len(v) > 1 for v in sizes.values()):
        raise first_error  # nothing to search (a model without blocks): the plain error
    if best is None:
        searched_axes = ", ".join(f"--{k}" for k, v in sizes.items() if len(v) > 1) or "none"
        raise UserError(
            f"no legal layout of {kwargs['chips']} chips at --global_batch="
            f"{kwargs.get('global_batch')} (searched {searched_axes}, powers of two); the plain "
            f"one: {first_error}"
        )
    return best
