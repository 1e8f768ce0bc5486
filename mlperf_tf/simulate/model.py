"""Provides `simulate()`: one benchmark on one system at one scale, step time to time to train.

Per training step (all times in seconds):

    compute   = per-chip batch x training FLOPs per sample / (peak x efficiency)
                (forward 1/3, backward 2/3: the 3x convention of `mlperf_tf.flops`)
    allreduce = the α–β time of the chosen algorithm on the system's layout
                (gradient bytes = parameters x `gradient_bytes`)
    exposed   = allreduce - min(overlap_fraction x allreduce, backward): the part of the
                all-reduce that the backward pass cannot hide
    update    = parameters x optimizer bytes per parameter / memory bandwidth, divided by the
                chips with weight-update sharding (Kumar et al. 2020: each chip updates 1/p of the
                weights between the reduce-scatter and the all-gather, at no extra traffic)
    device    = compute + exposed + update + step overhead (x replicas where they share cores)
    input     = global batch / (hosts x per-host input rate)
    step      = max(device, input)          (input is prefetched: the slower of the two wins)

Time to train = steps to target x step + evaluations x (eval forward passes + eval overhead),
with epochs to target from `convergence.curve` at the global batch. Per-sample FLOPs, the
parameter count, the preset sizes and the benchmark's declarations (`simulator_shape()`,
`convergence`) come from the committed cache (`mlperf_tf/simulate/data/flops.json`), so no
TensorFlow is imported: FLOPs traced from the model, or declared by the benchmark
(`Benchmark.training_flops_per_sample`, e.g. Llama 3.1 8B's from its config). A registered
benchmark missing from the cache is counted on the fly (importing TensorFlow).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from typing import Any

from mlperf_tf import paths
from mlperf_tf.errors import UserError
from mlperf_tf.facts import SimulatorShape
from mlperf_tf.simulate import collectives, convergence, parallelism
from mlperf_tf.simulate.systems import System

FLOPS_CACHE = os.path.join(os.path.dirname(__file__), "data", "flops.json")


def _flops_table() -> dict[str, Any]:
    """The committed FLOPs cache, updated with the user's (plug-in benchmarks) when it exists."""
    table = dict(_committed_flops())
    user = paths.user_flops_cache()
    if os.path.isfile(user):
        try:
            with open(user, encoding="utf-8") as f:
                table.update(json.load(f))
        except (OSError, ValueError) as e:
            raise UserError(f"the FLOPs cache {user!r} cannot be read: {e}") from None
    return table


@functools.cache
def _committed_flops() -> dict[str, Any]:
    with open(FLOPS_CACHE, encoding="utf-8") as f:
        return json.load(f)


def benchmark_facts(benchmark: str, preset: str = "mlperf") -> dict[str, Any]:
    """The FLOPs, parameters, sizes and declarations of a benchmark preset (see `mlperf_tf.flops`):
    cached, or for a registered benchmark the cache does not hold, counted now.

    Raises:
      UserError: the benchmark is neither cached nor registered, or has no such preset.
    """
    table = _flops_table()
    if benchmark not in table:
        table = {benchmark: _counted_now(benchmark, preset)}
    if preset not in table[benchmark]:
        raise UserError(
            f"benchmark '{benchmark}' has no preset '{preset}' "
            f"(presets: {', '.join(sorted(table[benchmark]))})"
        )
    return table[benchmark][preset]


@functools.cache
def _counted_now(benchmark: str, preset: str) -> dict[str, Any]:
    """{preset: entry} of a registered benchmark that no cache holds (imports TensorFlow; a
    small model is traced, so `python -m mlperf_tf.flops --write NAME` once saves the time)."""
    from mlperf_tf import flops, registry

    if benchmark not in registry.available():
        cached = ", ".join(sorted(_flops_table()))
        raise UserError(
            f"unknown benchmark '{benchmark}' for simulate (cached: {cached}; registered: "
            f"{', '.join(registry.available())})"
        )
    return flops.build_cache([benchmark], presets=[preset])[benchmark]


def shape_of(facts: dict[str, Any]) -> SimulatorShape:
    """The benchmark's declared `simulator_shape()` in a cache entry."""
    return SimulatorShape.from_dict(facts.get("shape"))


def _family(kind: str) -> list[str]:
    """The cached benchmarks whose `mlperf` shape declares `kind` ("blocks" or "convs")."""
    return [
        name
        for name, presets in _flops_table().items()
        if (presets.get("mlperf") or {}).get("shape", {}).get(kind)
    ]


@dataclasses.dataclass(frozen=True)
class Result:
    """One simulated configuration. Times in seconds unless the name says minutes."""

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
    model_parallel: int
    spatial_partition: str
    expert_parallel: int
    model_parallel_s: float
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

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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
) -> Result:
    """Predicts one configuration (see the module docstring for the model).

    Args:
      benchmark: a cached benchmark name (resnet50, ssd, transformer, bert).
      system: the machine.
      chips: chips (GPUs, TPU chips, logical devices) taking part, failed ones included.
      global_batch: samples per step; default the system's per-chip batch x working chips (or
        the preset's global batch), capped at the largest batch of the convergence data.
      algorithm: all-reduce algorithm; default the system's first (torus2d on a torus,
        hierarchical on a switched cluster, ring on a local machine).
      weight_update_sharding: each chip updates 1/p of the weights.
      failed_chips: holes in a torus/mesh that the all-reduce routes around; their share of the
        batch moves to the working chips.
      wraparound: torus wrap-around links: auto, on or off.
      preset: which preset's model and sizes.
      epochs_to_target: override the convergence curve (e.g. a published run's own epochs).
      model_parallel: M chips share a batch and split every weight (tensor parallelism).
      spatial_partition: K (or KxL) chips share a batch and split every image into K slabs
        of rows (K x L tiles); the FLOPs of a group's batch divide over its K x L chips.
      expert_parallel: E chips split each MoE layer's experts (with `moe`).
      moe: a mixture-of-experts config (`model.moe` of the Transformer-family benchmarks).

    Raises:
      UserError: an unknown benchmark or algorithm, chips that do not fit the system, failed
        chips off a torus or not fewer than the chips, a batch smaller than the data-parallel
        groups, or a parallel flag that does not divide the chips or fit the benchmark.
    """
    facts = benchmark_facts(benchmark, preset)
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
    working = chips - failed_chips
    batch_given = global_batch is not None
    if global_batch is None:
        per_chip_default = system.per_chip_batch.get(
            benchmark, system.per_chip_batch.get("default", 0)
        )
        global_batch = per_chip_default * working or int(facts["global_batch_size"])
        # No larger than the largest batch with convergence data (beyond it epochs are guesses).
        curve = convergence.curve(benchmark, preset)
        global_batch = max(min(global_batch, curve.batches[-1]), working)
    moe = moe or parallelism.Moe()
    shape = shape_of(facts)
    split, (spatial_rows, spatial_cols) = _check_parallel(
        benchmark, shape, layout, working, model_parallel, spatial_partition, expert_parallel, moe
    )
    groups = working // split  # data-parallel replicas of one shard
    if global_batch < groups:
        what = "working chips" if split == 1 else f"data-parallel groups ({working} / {split})"
        raise UserError(f"--global_batch ({global_batch}) is smaller than the {groups} {what}")
    # With holes (--failed_chips) the failed chips' samples move to others: uneven by design.
    if global_batch % groups and batch_given and not failed_chips:
        what = "working chips" if split == 1 else f"data-parallel groups ({working} / {split})"
        raise UserError(
            f"--global_batch ({global_batch}) does not split evenly over the {groups} {what}: "
            f"use a multiple of {groups}"
        )
    flops = float(facts["training_flops_per_sample"])
    params = float(facts["trainable_parameters"])
    expert_params = 0.0
    if moe.num_experts:
        b = parallelism.blocks_of(
            shape, "config.model.moe.num_experts", benchmark, _family("blocks")
        )
        layers = moe.layers(b.blocks)
        # Each MoE layer holds num_experts feed-forwards instead of one; a token runs top_k of
        # them (its capacity padding computed too).
        expert_params = layers * moe.num_experts * b.ffn_parameters
        params += expert_params - layers * b.ffn_parameters
        flops += 3 * layers * b.tokens_per_sample * b.ffn_flops_per_token * (moe.slots - 1)
    per_chip_batch = global_batch / groups  # samples per group (each chip does 1/split of them)

    step = _step(
        system=system,
        benchmark=benchmark,
        layout=layout,
        algorithm=algorithm,
        per_chip_batch=per_chip_batch,
        global_batch=global_batch,
        flops=flops,
        params=params,
        sharding=weight_update_sharding,
        failed_chips=failed_chips,
        working=working,
        parallel=_Parallel(
            split=split,
            model=model_parallel,
            rows=spatial_rows,
            cols=spatial_cols,
            experts=expert_parallel,
            moe=moe,
            expert_params=expert_params,
            shape=shape,
        ),
    )
    single = _step(
        system=system,
        benchmark=benchmark,
        layout=system.layout(1) if system.kind != "torus" else None,
        algorithm=algorithm,
        per_chip_batch=per_chip_batch / split,
        global_batch=per_chip_batch / split,
        flops=flops,
        params=params,
        sharding=False,
        failed_chips=0,
        working=1,
    )
    samples_per_s = global_batch / step["step_time_s"]
    single_rate = per_chip_batch / split / single["step_time_s"]

    epoch_examples = float(facts["train_examples"])
    if epochs_to_target is not None:
        epochs, source = float(epochs_to_target), "given"
    else:
        curve = convergence.curve(benchmark, preset)
        epochs = curve.at(global_batch) / (epoch_examples if curve.in_samples else 1.0)
        source = curve.source
    samples = epochs * epoch_examples
    steps = math.ceil(samples / global_batch)
    evals = math.ceil(epochs / float(facts["eval_every_epochs"]))
    per_batch, constant = facts.get("skipped_evals_rule", (0.0, 0.0))  # e.g. llama2_70b_lora
    evals = max(1, evals - int(per_batch * global_batch + constant))
    eval_flops = float(facts["forward_flops_per_sample"]) * float(facts["eval_examples"])
    compute_rate = _chip_flops(system, benchmark, working) * working
    eval_s = evals * (eval_flops / compute_rate + system.eval_overhead_s)
    time_to_train_s = steps * step["step_time_s"] + eval_s

    return Result(
        benchmark=benchmark,
        system=system.name,
        chips=chips,
        failed_chips=failed_chips,
        layout=layout.describe(),
        algorithm=algorithm,
        weight_update_sharding=weight_update_sharding,
        global_batch=int(global_batch),
        per_chip_batch=per_chip_batch / split,
        parameters=int(params),
        model_parallel=model_parallel,
        spatial_partition=str(spatial_partition),
        expert_parallel=expert_parallel,
        single_chip_samples_per_s=single_rate,
        samples_per_s=samples_per_s,
        scaling_efficiency=samples_per_s / (single_rate * chips),
        epochs_to_target=epochs,
        samples_to_target=samples,
        convergence_source=source,
        eval_s=eval_s,
        time_to_train_min=time_to_train_s / 60.0,
        **step,
    )


@dataclasses.dataclass(frozen=True)
class _Parallel:
    """How the chips split the model: `split` chips share a batch (model x spatial)."""

    split: int = 1
    model: int = 1
    rows: int = 1
    cols: int = 1
    experts: int = 1
    moe: parallelism.Moe = parallelism.Moe()
    expert_params: float = 0.0
    shape: SimulatorShape = SimulatorShape()


def _check_parallel(benchmark, shape, layout, working, model_parallel, spatial, experts, moe):
    """Validates the parallel flags as `mlperf-tf run` does; returns (split, (K, L) tiles)."""
    if (model_parallel, str(spatial), experts) != (1, "1", 1):
        from mlperf_tf.parallel import mesh  # imports TensorFlow: only when a flag is given

        mesh.check_flags(
            model_parallel=model_parallel, expert_parallel=experts, spatial_partition=str(spatial)
        )
        rows, cols = mesh.parse_spatial(str(spatial))
    else:
        rows, cols = 1, 1
    if model_parallel > 1:
        parallelism.blocks_of(shape, "model_parallel", benchmark, _family("blocks"))
    if rows * cols > 1:
        convs = parallelism.convs_of(shape, benchmark, _family("convs"))
        parallelism.check_splits(convs, rows, cols)
    if experts > 1:
        parallelism.blocks_of(shape, "expert_parallel", benchmark, _family("blocks"))
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
    return split, (rows, cols)


def _chip_flops(system: System, benchmark: str, working: int) -> float:
    rate = system.peak_flops * system.efficiency(benchmark)
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
        fn = (
            collectives.hierarchical_allreduce
            if algorithm == "hierarchical"
            else collectives.flat_ring_allreduce
        )
        return fn(
            nbytes,
            gpus_per_node=layout.chips_per_node,
            nodes=layout.nodes,
            intra=system.link,
            inter=system.network,
        )
    return collectives.ring_allreduce(nbytes, layout.chips, system.link)


def _step(
    *,
    system: System,
    benchmark: str,
    layout,
    algorithm: str,
    per_chip_batch: float,
    global_batch: float,
    flops: float,
    params: float,
    sharding: bool,
    failed_chips: int,
    working: int,
    parallel: _Parallel = _Parallel(),
) -> dict[str, Any]:
    split = parallel.split
    compute = per_chip_batch * flops / split / _chip_flops(system, benchmark, working)
    backward = compute * 2.0 / 3.0
    # Each chip holds 1/M of the weights (experts: 1/E of them); the gradient all-reduce runs
    # over the replicas of one shard, every split-th chip.
    dense = params - parallel.expert_params
    held = dense / parallel.model + parallel.expert_params / max(1, parallel.experts)
    replicas = parallelism.data_layout(system, layout, split) if layout is not None else None
    cost = allreduce_cost(system, replicas, algorithm, held * system.gradient_bytes, failed_chips)
    allreduce = cost.total_s
    exposed = allreduce - min(system.overlap(benchmark) * allreduce, backward)
    update = held * system.optimizer_bytes_per_parameter / system.memory_bandwidth
    if sharding:
        update /= max(1, working // split)
    model_s = halo_s = a2a_s = 0.0
    if layout is not None and layout.chips > 1:
        blocks = parallel.shape.blocks
        model_s = parallelism.tensor_parallel_cost(
            system, layout, blocks, parallel.model, per_chip_batch
        ).total_s
        halo_s = parallelism.halo_cost(
            system, layout, parallel.shape, parallel.rows, per_chip_batch, cols=parallel.cols
        ).total_s
        a2a_s = parallelism.moe_all_to_all_cost(
            system, layout, blocks, parallel.moe, parallel.experts, per_chip_batch / split
        ).total_s
    # Logical devices sharing the cores also dispatch their replicas' ops one after another.
    overhead = system.step_overhead_s * (working if system.shared_compute else 1)
    device = compute + exposed + update + overhead + model_s + halo_s + a2a_s
    hosts = max(1, math.ceil(working / system.chips_per_host))
    input_limit = global_batch / (hosts * system.input_rate_per_host(benchmark))
    return {
        "compute_s": compute,
        "allreduce_s": allreduce,
        "allreduce_latency_s": cost.latency_s,
        "allreduce_bandwidth_s": cost.bandwidth_s,
        "exposed_comm_s": exposed,
        "model_parallel_s": model_s,
        "halo_s": halo_s,
        "all_to_all_s": a2a_s,
        "weight_update_s": update,
        "overhead_s": overhead,
        "input_limit_s": input_limit,
        "input_bound": input_limit > device,
        "step_time_s": max(device, input_limit),
    }
