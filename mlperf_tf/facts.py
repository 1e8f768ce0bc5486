"""Provides the value types of the facts a benchmark declares about itself for the simulator.

A benchmark declares them through the `Benchmark` contract (`mlperf_tf/benchmark.py`:
`simulator_shape()`, `convergence`); `python -m mlperf_tf.flops --write` stores them, as plain
dicts, beside the FLOP counts in the simulator's cache, and `mlperf_tf.simulate` reads them back
with `from_dict` without importing TensorFlow. Pure Python: nothing here imports TF or a benchmark.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple


@dataclasses.dataclass(frozen=True)
class Blocks:
    """A Transformer-family model as tensor and expert parallelism see it.

    Attributes:
      blocks: transformer blocks (encoder + decoder layers).
      allreduces_per_block: forward all-reduces per block under tensor parallelism (2:
        attention and feed-forward; 3 for a decoder block with cross-attention, averaged over
        the model).
      hidden: model width (the all-reduced activations are tokens x hidden).
      tokens_per_sample: tokens of one sample of the global batch (the Transformer's batch
        counts tokens: 1).
      ffn_parameters: weights of one block's feed-forward (what an MoE layer has per expert).
      ffn_flops_per_token: forward FLOPs of one block's feed-forward per token.
    """

    blocks: int
    allreduces_per_block: float
    hidden: int
    tokens_per_sample: int
    ffn_parameters: int
    ffn_flops_per_token: float


@dataclasses.dataclass(frozen=True)
class Conv:
    """Convolutions of one feature-map size: `count` layers of kernel `kernel` (and `stride`)
    reading `width` x `channels` activations at height `height` (for halos: rows of width x
    channels, and columns of height x channels)."""

    count: int
    kernel: int
    height: int
    width: int
    channels: int
    stride: int = 1


@dataclasses.dataclass(frozen=True)
class Experts:
    """The mixture-of-experts layers of a model built with them (GPT-OSS), as the simulator
    splits them over `--expert_parallel`: each MoE layer holds `num_experts` feed-forwards of
    `Blocks.ffn_parameters` weights each and sends every token to `top_k` of them.

    Attributes:
      num_experts: experts per MoE layer.
      top_k: experts per token.
      every: an MoE layer every N-th block (1: every block).
      capacity_factor: slots per expert over the even share (0: dropless).
    """

    num_experts: int
    top_k: int
    every: int = 1
    capacity_factor: float = 0.0


# Number formats a system can list a dense peak for (`--precision`); the aliases name the same
# products (AMD's MXFP4 and NVIDIA's NVFP4 are both 4-bit floats with block scales).
FORMATS = ("fp32", "tf32", "fp16", "bf16", "fp8", "fp4")
FORMAT_ALIASES = {
    "mxfp4": "fp4",
    "nvfp4": "fp4",
    "mxfp8": "fp8",
    "bfloat16": "bf16",
    "float16": "fp16",
}


def is_moe_layer(index: int, *, num_experts: int, every: int, first_dense: int) -> bool:
    """Whether block `index` (0-based) of a decoder is a mixture-of-experts layer: every
    `every`-th block after the first `first_dense` when the model has experts (`MoEConfig`'s
    rule, here without TensorFlow for the simulator's memory count)."""
    return num_experts > 0 and index >= first_dense and (index + 1) % every == 0


def normalize_format(name: str) -> str:
    """The canonical name of a number format (`mxfp4` -> `fp4`); unknown names come back
    lower-cased, for the caller to refuse with the formats it has."""
    name = str(name).strip().lower()
    return FORMAT_ALIASES.get(name, name)


@dataclasses.dataclass(frozen=True)
class Calibration:
    """The simulator's constants of one benchmark on one family of systems, and the published
    result they come from (docs/scaling.md: at most one MLPerf result per benchmark calibrates;
    the rest are tests).

    Attributes:
      families: the system families it holds for (`System.family`: "blackwell", "hopper",
        "tpu-v3", ...); the first entry naming a system's family wins.
      compute_efficiency: the fraction of the dense peak of `precision` that the model's
        products sustain (a physically plausible value is at most 0.75); None: the system's
        default.
      precision: the number format of the calibrating run's products (its log's
        `lowest_numerical_precision`, or the submitter's config).
      source: the published result (round and path) it was fitted to, or "assumed: why".
      overlap_fraction: the part of the gradient all-reduce hidden under the backward pass, where
        this benchmark's runs differ from the system's (None: the system's).
      per_chip_batch: the default per-chip batch when no global batch is given (None: the
        system's).
      input_samples_per_s_per_host: the input pipeline's rate per host (None: unbounded).
    """

    families: tuple[str, ...]
    compute_efficiency: float | None = None
    precision: str = "bf16"
    source: str = ""
    overlap_fraction: float | None = None
    per_chip_batch: int | None = None
    input_samples_per_s_per_host: float | None = None

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["families"] = list(self.families)
        return {k: v for k, v in data.items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Calibration:
        data = dict(data)
        data["families"] = tuple(data["families"])
        return cls(**data)


@dataclasses.dataclass(frozen=True)
class SimulatorShape:
    """What each kind of parallelism splits and sends, for `mlperf-tf simulate`, and the
    simulator's constants of the benchmark.

    Attributes:
      blocks: the transformer blocks that tensor parallelism (`--model_parallel`) splits and
        whose feed-forwards MoE layers replace (`--expert_parallel`); None: the model has none
        (the simulator refuses those flags for it, as `run` does).
      convs: the convolutions whose halos spatial partitioning (`--spatial_partition`)
        exchanges, by feature-map size, the input layer first; (): none (refused).
      batch_norms: batch-norm layers whose statistics a spatial group sums.
      experts: the model's own mixture-of-experts layers (None: dense; the simulator's
        `--config.model.moe.*` then adds experts to `blocks`, as `run` does to a dense
        Transformer or Llama).
      precision: the number format the benchmark's reference trains in (`simulate
        --precision`'s default).
      calibration: the simulator's constants per system family (`Calibration`); (): the
        systems' defaults, uncalibrated.
      attention_flops: of the training FLOPs per sample, those of attention's score and
        context products (Q·Kᵀ, P·V and their gradients) as the count makes them (the full
        S x S square). They run in BF16 whatever `--precision` the linear layers use:
        Transformer Engine's FP8 and NVFP4 recipes quantize the GEMMs of its Linear modules,
        and FP8 attention is a separate switch, off by default (`DelayedScaling(fp8_dpa=
        False)`). 0: none declared (every FLOP in the run's format).
      causal: the attention is causal, so flash attention computes half of the counted
        square (FlashAttention-2, Dao 2023, sec. 3.1: blocks above the diagonal are skipped).
    """

    blocks: Blocks | None = None
    convs: tuple[Conv, ...] = ()
    batch_norms: int = 0
    experts: Experts | None = None
    precision: str = "bf16"
    calibration: tuple[Calibration, ...] = ()
    attention_flops: float = 0.0
    causal: bool = False

    def as_dict(self) -> dict[str, Any]:
        """Plain dicts; `experts`, `precision` and `calibration` only where declared (the
        entries of the cache that declare none keep their form)."""
        data = dataclasses.asdict(self)
        if self.experts is None:
            del data["experts"]
        if self.precision == "bf16":
            del data["precision"]
        if self.calibration:
            data["calibration"] = [c.as_dict() for c in self.calibration]
        else:
            del data["calibration"]
        if not self.attention_flops:
            del data["attention_flops"], data["causal"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> SimulatorShape:
        """The shape of `as_dict`'s output (None or {}: a data-parallel-only model)."""
        data = data or {}
        blocks = data.get("blocks")
        return cls(
            blocks=Blocks(**blocks) if blocks else None,
            convs=tuple(Conv(**c) for c in data.get("convs", ())),
            batch_norms=int(data.get("batch_norms", 0)),
            experts=Experts(**data["experts"]) if data.get("experts") else None,
            precision=str(data.get("precision", "bf16")),
            calibration=tuple(Calibration.from_dict(c) for c in data.get("calibration", ())),
            attention_flops=float(data.get("attention_flops", 0.0)),
            causal=bool(data.get("causal", False)),
        )

    def calibration_for(self, family: str) -> Calibration | None:
        """The first declared calibration that holds for `family` (None: none does)."""
        for entry in self.calibration:
            if family in entry.families:
                return entry
        return None


@dataclasses.dataclass(frozen=True)
class Rcp:
    """MLPerf's reference convergence points of a benchmark, in the installed mlperf-logging.

    Attributes:
      file: the RCP file under `mlperf_logging/rcp_checker/`, e.g.
        "training_4.0.0/rcps_resnet.json" (the newest round whose references match the model).
      prefix: the key prefix of the entries that are this model's ("resnet_ref_").
      in_samples: the entries count samples (BERT, LLMs), not epochs.
    """

    file: str
    prefix: str
    in_samples: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"rcp": dataclasses.asdict(self)}


@dataclasses.dataclass(frozen=True)
class StatedConvergence:
    """Epochs to target at some global batches where no RCP exists, and where they come from.

    Attributes:
      points: (global batch, epochs) pairs, smallest batch first; interpolated like RCPs.
      source: where the points come from (a stated model, not a measurement: say so).
    """

    points: tuple[tuple[int, float], ...]
    source: str

    def as_dict(self) -> dict[str, Any]:
        return {"stated": {"points": [list(p) for p in self.points], "source": self.source}}


def convergence_from_dict(data: dict[str, Any] | None) -> Rcp | StatedConvergence | None:
    """The declaration of `Rcp.as_dict` or `StatedConvergence.as_dict` (None: none declared)."""
    if not data:
        return None
    if "rcp" in data:
        return Rcp(**data["rcp"])
    stated = data["stated"]
    return StatedConvergence(
        tuple((int(b), float(e)) for b, e in stated["points"]), stated["source"]
    )


class RenamedKey(NamedTuple):
    """A log key that MLPerf renamed from one round on (BERT's `opt_epsilon`, `opt_lamb_epsilon`
    from 2.1.0): the runner logs the name of the run's round."""

    old: str
    new: str
    since: str
