"""Provides `System`: a machine described as data (a JSON or YAML file), and its chip layouts.

Built-in systems live in `mlperf_tf/simulate/systems/NAME.json`, each with its numbers and the
documents they come from (`sources`); `--system_file=PATH` reads a user's own in the same format
(see `docs/scaling.md` for every field). Three topology kinds:

- `torus`: chips on an N-d torus/mesh of point-to-point links (TPU pods). A slice holds a power of
  two chips; its shape fills the dims as evenly as `max_shape` allows, and a dim has wrap-around
  links when its length is in [`wrap_min`, `wrap_max`] and a multiple of `wrap_multiple`, and the
  slice has at least `wrap_min_chips` chips.
- `switched`: nodes of `chips_per_node` GPUs on NVLink/NVSwitch, nodes on a network (DGX clusters).
  With `domain_chips` (GB200/GB300 NVL72), a node is a compute tray and up to `domain_chips` GPUs
  of whole trays share one NVLink domain: a run takes any number of trays, and one larger than a
  domain spans ceil(chips / domain_chips) domains joined by the network.
- `local`: logical devices of one process (the CPU tests), one ring with a measured α and β.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

from mlperf_tf.errors import UserError
from mlperf_tf.facts import FORMATS, Calibration, normalize_format
from mlperf_tf.simulate.collectives import Link

SYSTEMS_DIR = os.path.join(os.path.dirname(__file__), "systems")
TOPOLOGY_KINDS = ("torus", "switched", "local")
ALGORITHMS_BY_KIND = {
    "torus": ("torus2d", "ring"),
    "switched": ("hierarchical", "ring"),
    "local": ("ring",),
}


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where `chips` chips sit: the torus shape and wrap-around, or nodes x chips per node."""

    chips: int
    shape: tuple[int, ...] = ()
    wraps: tuple[bool, ...] = ()
    nodes: int = 1
    chips_per_node: int = 1

    def describe(self) -> str:
        if self.shape:
            dims = "x".join(str(d) for d in self.shape)
            kind = "torus" if all(self.wraps) else ("mesh" if not any(self.wraps) else "torus/mesh")
            return f"{dims} {kind}"
        if self.chips != self.nodes * self.chips_per_node:  # domains of uneven size
            return f"{self.nodes} domain(s) of <={-(-self.chips // self.nodes)}"
        return f"{self.nodes} node(s) x {self.chips_per_node}"


@dataclasses.dataclass(frozen=True)
class System:
    """A machine for the simulator. Units: FLOP/s, bytes/s, seconds, bytes.

    Attributes:
      name: what `--system` calls it.
      description: one line.
      peak_flops: per chip, dense, in `native_format` (the format `--precision` falls back to
        when the chip lacks the benchmark's reference format).
      family: the chip family benchmarks calibrate for (`facts.Calibration.families`).
      native_format: the format of `peak_flops`.
      peak_flops_by_format: dense peak per number format the chip's matrix units have (cited).
      memory_capacity: HBM per chip, bytes (0: not stated).
      platform_names: accelerator names an MLPerf log's `submission_platform` gives for it
        (`simulate --from_log`).
      memory_bandwidth: per chip (HBM), bytes/s: bounds the optimizer's weight update.
      compute_efficiency: fraction of the peak the model's products sustain: a "default" for
        benchmarks that declare no calibration for `family`; a user's system file may also name
        a benchmark (it then overrides the benchmark's declaration). Built-in files name none:
        each benchmark declares its constants (`SimulatorShape.calibration`).
      topology: the raw topology dict (kind and its fields).
      link: chip-to-chip link of a torus or a local ring; intra-node link of a switched system.
      network: per-GPU share of the network of a switched system.
      chips_per_host: chips one input host feeds.
      input_samples_per_s_per_host: the input pipeline's rate per host, per benchmark (+default).
      gradient_bytes: bytes per gradient element that the all-reduce moves (4 fp32, 2 bf16/fp16).
      optimizer_bytes_per_parameter: bytes read and written per parameter by the update.
      overlap_fraction: part of the all-reduce that can run under the backward pass.
      overlap_fraction_by_benchmark: per benchmark, where its runs differ from the system's
        (fraction in [0, 1]; e.g. NVIDIA's v0.7 BERT all-reduced after the backward pass).
      step_overhead_s: fixed time per step (host loop, launch, cross-replica BN, ...).
      eval_overhead_s: fixed time per evaluation besides its forward passes.
      shared_compute: all chips share one compute budget (logical devices on one CPU).
      per_chip_batch: default per-chip batch by benchmark (+default) when no global batch is given.
      sources: citations of every number.
      fp8_attention_factor: the chip's 8-bit attention rate over a B200's at the same tensor
        peaks (the benchmarks' Blackwell calibrations ran on B200s): Blackwell Ultra's doubled
        exponential units speed the softmax that bounds FP8 attention (1.0: as a B200).
    """

    name: str
    description: str
    peak_flops: float
    memory_bandwidth: float
    compute_efficiency: dict[str, float]
    topology: dict[str, Any]
    link: Link
    network: Link | None
    chips_per_host: int
    input_samples_per_s_per_host: dict[str, float]
    gradient_bytes: float
    optimizer_bytes_per_parameter: float
    overlap_fraction: float
    step_overhead_s: float
    eval_overhead_s: float
    shared_compute: bool
    per_chip_batch: dict[str, int]
    sources: dict[str, str]
    overlap_fraction_by_benchmark: dict[str, float] = dataclasses.field(default_factory=dict)
    family: str = ""
    native_format: str = "bf16"
    peak_flops_by_format: dict[str, float] = dataclasses.field(default_factory=dict)
    memory_capacity: float = 0.0
    platform_names: tuple[str, ...] = ()
    fp8_attention_factor: float = 1.0

    def peak(self, precision: str, flag: str = "--precision") -> float:
        """The dense peak FLOP/s per chip in `precision` (`flag`: the setting named in the error).

        Raises:
          UserError: the chip has no such format (the message lists its formats).
        """
        fmt = normalize_format(precision)
        peaks = self.formats
        if fmt not in peaks:
            have = ", ".join(f"{k} ({v / 1e12:,.0f} TFLOP/s)" for k, v in peaks.items())
            raise UserError(f"{flag}={precision}: '{self.name}' has {have}")
        return peaks[fmt]

    @property
    def formats(self) -> dict[str, float]:
        """{format: dense peak} (at least the native format's `peak_flops`)."""
        return {self.native_format: self.peak_flops, **self.peak_flops_by_format}

    @property
    def kind(self) -> str:
        return self.topology["kind"]

    @property
    def algorithms(self) -> tuple[str, ...]:
        return ALGORITHMS_BY_KIND[self.kind]

    @property
    def default_algorithm(self) -> str:
        return self.algorithms[0]

    def efficiency(self, benchmark: str, calibration: Calibration | None = None) -> float:
        """The fraction of the peak `benchmark` sustains here: a user's file naming it, else the
        benchmark's `calibration` for this family, else the system's default."""
        if benchmark in self.compute_efficiency:
            return float(self.compute_efficiency[benchmark])
        if calibration is not None and calibration.compute_efficiency is not None:
            return float(calibration.compute_efficiency)
        return float(self.compute_efficiency["default"])

    def overlap(self, benchmark: str, calibration: Calibration | None = None) -> float:
        """The part of the all-reduce hidden under the backward pass for `benchmark`."""
        if benchmark in self.overlap_fraction_by_benchmark:
            return float(self.overlap_fraction_by_benchmark[benchmark])
        if calibration is not None and calibration.overlap_fraction is not None:
            return float(calibration.overlap_fraction)
        return float(self.overlap_fraction)

    def input_rate_per_host(self, benchmark: str, calibration: Calibration | None = None) -> float:
        rates = self.input_samples_per_s_per_host
        if benchmark in rates:
            return float(rates[benchmark])
        if calibration is not None and calibration.input_samples_per_s_per_host is not None:
            return float(calibration.input_samples_per_s_per_host)
        return float(rates.get("default", math.inf))

    def default_per_chip_batch(self, benchmark: str, calibration: Calibration | None = None) -> int:
        if benchmark in self.per_chip_batch:
            return int(self.per_chip_batch[benchmark])
        if calibration is not None and calibration.per_chip_batch is not None:
            return int(calibration.per_chip_batch)
        return int(self.per_chip_batch.get("default", 0))

    def layout(self, chips: int, *, wraparound: str = "auto") -> Layout:
        """Places `chips` chips on this system.

        Args:
          chips: how many chips take part.
          wraparound: for a torus: "auto" (the slice's own links), "on" (every dim wraps) or
            "off" (a mesh: no dim wraps).

        Raises:
          UserError: the chips do not fit the topology (not a power of two on a torus, more than
            the largest slice, not whole nodes of a switched system, ...).
        """
        topo = self.topology
        if chips < 1:
            raise UserError(f"--chips ({chips}) must be a positive integer")
        if wraparound not in ("auto", "on", "off"):
            raise UserError(f"--wraparound ({wraparound!r}) must be auto, on or off")
        if self.kind == "torus":
            return self._torus_layout(chips, wraparound)
        if wraparound != "auto":
            raise UserError(f"--wraparound applies to torus systems; '{self.name}' is {self.kind}")
        if self.kind == "switched" and "domain_chips" in topo:
            return self._domain_layout(chips)
        if self.kind == "switched":
            per_node = int(topo["chips_per_node"])
            max_nodes = int(topo.get("max_nodes", 1 << 30))
            if chips <= per_node:
                if per_node % chips:
                    raise UserError(
                        f"--chips ({chips}) must divide the {per_node} GPUs of a '{self.name}' "
                        "node, or be a multiple of them"
                    )
                return Layout(chips=chips, nodes=1, chips_per_node=chips)
            if chips % per_node or chips // per_node > max_nodes:
                raise UserError(
                    f"--chips ({chips}) must be whole '{self.name}' nodes: a multiple of "
                    f"{per_node} up to {per_node * max_nodes}"
                )
            return Layout(chips=chips, nodes=chips // per_node, chips_per_node=per_node)
        max_chips = int(topo.get("max_chips", 1 << 30))
        if chips > max_chips:
            raise UserError(f"--chips ({chips}) exceeds the {max_chips} devices of '{self.name}'")
        return Layout(chips=chips, nodes=1, chips_per_node=chips)

    def _domain_layout(self, chips: int) -> Layout:
        """Trays of `chips_per_node` GPUs in NVLink domains of up to `domain_chips`: any divisor
        of a tray or any number of whole trays; beyond one domain, the fewest domains, filled
        evenly (512 GPUs: 8 domains of 64), joined by the network."""
        topo = self.topology
        tray, domain = int(topo["chips_per_node"]), int(topo["domain_chips"])
        most = tray * int(topo.get("max_nodes", 1 << 30))
        if (chips < tray and tray % chips) or (chips > tray and chips % tray) or chips > most:
            raise UserError(
                f"--chips ({chips}) does not fit '{self.name}': a divisor of its {tray}-GPU "
                f"trays or whole trays (a multiple of {tray}) up to {most}"
            )
        if chips <= domain:
            return Layout(chips=chips, nodes=1, chips_per_node=chips)
        domains = -(-chips // domain)
        return Layout(chips=chips, nodes=domains, chips_per_node=chips // domains)

    def _torus_layout(self, chips: int, wraparound: str) -> Layout:
        topo = self.topology
        max_shape = [int(d) for d in topo["max_shape"]]
        min_chips = int(topo.get("min_chips", 1))
        largest = math.prod(max_shape)
        if chips & (chips - 1) or not min_chips <= chips <= largest:
            raise UserError(
                f"--chips ({chips}) does not fit '{self.name}': a slice of its "
                f"{'x'.join(map(str, max_shape))} {len(max_shape)}-D torus holds a power of two "
                f"chips from {min_chips} to {largest}"
            )
        shape = [1] * len(max_shape)
        remaining = chips
        while remaining > 1:  # double the shortest dim that can still grow
            growable = [i for i in range(len(shape)) if shape[i] * 2 <= max_shape[i]]
            i = min(growable, key=lambda j: (shape[j], j))
            shape[i] *= 2
            remaining //= 2
        wrap_min = int(topo.get("wrap_min", 1 << 30))
        wrap_max = int(topo.get("wrap_max", 1 << 30))
        multiple = int(topo.get("wrap_multiple", 1))
        big_enough = chips >= int(topo.get("wrap_min_chips", 1))
        if wraparound == "auto":
            wraps = tuple(
                big_enough and wrap_min <= d <= wrap_max and d % multiple == 0 for d in shape
            )
        else:
            wraps = tuple(wraparound == "on" and d > 2 for d in shape)
        return Layout(chips=chips, shape=tuple(shape), wraps=wraps)


_REQUIRED = ("name", "peak_flops", "memory_bandwidth", "compute_efficiency", "topology", "link")


def _link(value: Any, where: str, origin: str) -> Link:
    if not isinstance(value, dict):
        raise UserError(
            f"system file {origin}: {where} must be {{bandwidth: bytes/s > 0, alpha: s >= 0}}"
        )
    return Link(
        bandwidth=_number(value.get("bandwidth"), f"{where}.bandwidth", "bytes/s", origin),
        alpha=_number(value.get("alpha"), f"{where}.alpha", "s", origin, low=0.0),
    )


# (unit, low, low allowed, high) of every numeric field: a value outside is one line naming it.
_FIELDS = {
    "peak_flops": ("FLOP/s per chip", 0.0, False, 1e21),
    "memory_bandwidth": ("bytes/s per chip", 0.0, False, 1e16),
    "gradient_bytes": ("bytes per element", 0.0, False, 64.0),
    "optimizer_bytes_per_parameter": ("bytes", 0.0, True, 1e4),
    "overlap_fraction": ("a fraction", 0.0, True, 1.0),
    "step_overhead_s": ("s", 0.0, True, 3600.0),
    "eval_overhead_s": ("s", 0.0, True, 86400.0),
}


def _number(
    value: Any, field: str, unit: str, origin: str, *, low: float = 0.0, low_ok: bool = False,
    high: float = 1e30, integer: bool = False,
) -> float:  # fmt: skip
    """`value` as a finite number in its range, or a UserError naming the field, unit and range."""
    kind = "an integer" if integer else "a number"
    bound = f"{'[' if low_ok else '('}{low:g}, {high:g}]"
    where = f"system file {origin}: {field}"
    if isinstance(value, str):  # PyYAML reads 1.0e12 (no sign in the exponent) as a string
        try:
            value = float(value.strip())
        except ValueError:
            raise UserError(f"{where} ({value!r}) must be {kind} ({unit}) in {bound}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UserError(f"{where} ({value!r}) must be {kind} ({unit}) in {bound}")
    if integer and value != int(value):
        raise UserError(f"{where} ({value!r}) must be an integer ({unit})")
    if not (math.isfinite(value) and (low <= value if low_ok else low < value) and value <= high):
        raise UserError(f"{where} ({value!r}) must be {kind} ({unit}) in {bound}")
    return int(value) if integer else float(value)


def _table(data: dict, field: str, unit: str, origin: str, **bounds) -> dict[str, Any]:
    """A {benchmark: number} field, each entry checked as `_number` does."""
    table = data.get(field, {})
    if not isinstance(table, dict):
        raise UserError(f"system file {origin}: {field} must map benchmark names to numbers")
    return {k: _number(v, f"{field}.{k}", unit, origin, **bounds) for k, v in table.items()}


def _check_topology(topology: dict, origin: str) -> None:
    counts = ("chips_per_node", "max_nodes", "max_chips", "min_chips", "wrap_min", "wrap_max",
              "wrap_multiple", "wrap_min_chips", "domain_chips")  # fmt: skip
    for key in counts:
        if key in topology:
            _number(topology[key], f"topology.{key}", "chips", origin, low=1, low_ok=True,
                    high=2**31 - 1, integer=True)  # fmt: skip
    if "max_shape" in topology:
        shape = topology["max_shape"]
        if not isinstance(shape, list) or not shape:
            raise UserError(
                f"system file {origin}: topology.max_shape ({shape!r}) must be a list of chips per "
                "dimension"
            )
        for dim in shape:
            _number(dim, "topology.max_shape", "chips", origin, low=1, low_ok=True,
                    high=2**20, integer=True)  # fmt: skip


def _fractions(value: Any, where: str) -> dict[str, float]:
    """A {benchmark: fraction in [0, 1]} table (dimensionless)."""
    if not isinstance(value, dict):
        raise UserError(f"{where} must map benchmark names to fractions in [0, 1]")
    out = {}
    for name, fraction in value.items():
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            raise UserError(f"{where}[{name}] ({fraction!r}) must be a number in [0, 1]")
        if not (math.isfinite(fraction) and 0.0 <= float(fraction) <= 1.0):
            raise UserError(f"{where}[{name}] ({fraction}) must be in [0, 1]")
        out[str(name)] = float(fraction)
    return out


def from_dict(data: dict[str, Any], origin: str) -> System:
    """Builds a `System` from a parsed system file; `origin` names the file in errors."""
    if not isinstance(data, dict):
        raise UserError(f"system file {origin} must hold a mapping, got {type(data).__name__}")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise UserError(f"system file {origin} lacks {', '.join(missing)}")
    topology = data["topology"]
    if not isinstance(topology, dict) or topology.get("kind") not in TOPOLOGY_KINDS:
        raise UserError(
            f"system file {origin}: topology.kind must be one of {', '.join(TOPOLOGY_KINDS)}"
        )
    if topology["kind"] == "torus" and not topology.get("max_shape"):
        raise UserError(f"system file {origin}: a torus topology needs max_shape")
    if topology["kind"] == "switched" and "chips_per_node" not in topology:
        raise UserError(f"system file {origin}: a switched topology needs chips_per_node")
    if topology["kind"] == "switched" and "network" not in data:
        raise UserError(f"system file {origin}: a switched topology needs network")
    efficiency = data["compute_efficiency"]
    if not isinstance(efficiency, dict) or "default" not in efficiency:
        raise UserError(f"system file {origin}: compute_efficiency needs a 'default' entry")
    _check_topology(topology, origin)
    defaults = {"gradient_bytes": 4, "optimizer_bytes_per_parameter": 24, "overlap_fraction": 0.0,
                "step_overhead_s": 0.0, "eval_overhead_s": 0.0}  # fmt: skip
    numbers = {
        name: _number(
            data.get(name, defaults.get(name)),
            name,
            unit,
            origin,
            low=low,
            low_ok=low_ok,
            high=high,
        )  # fmt: skip
        for name, (unit, low, low_ok, high) in _FIELDS.items()
    }
    native = normalize_format(data.get("native_format", "bf16"))
    by_format = data.get("peak_flops_by_format", {})
    if not isinstance(by_format, dict) or native not in FORMATS:
        raise UserError(
            f"system file {origin}: peak_flops_by_format must map formats ({', '.join(FORMATS)}) "
            f"to FLOP/s, native_format one of them"
        )
    peaks = {}
    for fmt, value in by_format.items():
        if normalize_format(fmt) not in FORMATS:
            raise UserError(
                f"system file {origin}: peak_flops_by_format.{fmt} is not a format "
                f"({', '.join(FORMATS)})"
            )
        peaks[normalize_format(fmt)] = _number(
            value, f"peak_flops_by_format.{fmt}", "FLOP/s per chip", origin, high=1e21
        )
    return System(
        family=str(data.get("family", data["name"])),
        native_format=native,
        platform_names=tuple(str(n) for n in data.get("platform_names", ())),
        peak_flops_by_format=peaks,
        memory_capacity=_number(
            data.get("memory_capacity", 0),
            "memory_capacity",
            "bytes per chip",
            origin,
            low_ok=True,
            high=1e15,
        ),  # fmt: skip
        fp8_attention_factor=_number(
            data.get("fp8_attention_factor", 1.0),
            "fp8_attention_factor",
            "a ratio",
            origin,
            high=10.0,
        ),  # fmt: skip
        name=str(data["name"]),
        description=str(data.get("description", "")),
        compute_efficiency=_table(
            data, "compute_efficiency", "a fraction of peak", origin, high=1.0
        ),  # fmt: skip
        topology=dict(topology),
        link=_link(data["link"], "link", origin),
        network=_link(data["network"], "network", origin) if "network" in data else None,
        chips_per_host=_number(
            data.get("chips_per_host", 1),
            "chips_per_host",
            "chips",
            origin,
            low=1,
            low_ok=True,
            high=2**20,
            integer=True,
        ),  # fmt: skip
        input_samples_per_s_per_host=_table(
            data, "input_samples_per_s_per_host", "samples/s", origin
        ),
        shared_compute=bool(data.get("shared_compute", False)),
        per_chip_batch=_table(
            data,
            "per_chip_batch",
            "samples",
            origin,
            low=1,
            low_ok=True,
            high=2**31 - 1,
            integer=True,
        ),  # fmt: skip
        sources=dict(data.get("sources", {})) if isinstance(data.get("sources"), dict) else {},
        overlap_fraction_by_benchmark=_fractions(
            data.get("overlap_fraction_by_benchmark", {}),
            f"{origin}: overlap_fraction_by_benchmark",
        ),
        **numbers,
    )


def available() -> list[str]:
    """Names of the built-in systems."""
    return sorted(
        os.path.splitext(f)[0] for f in os.listdir(SYSTEMS_DIR) if f.endswith((".json", ".yaml"))
    )


def load_file(path: str) -> System:
    """Reads a system from a JSON or YAML file (by extension; JSON otherwise)."""
    from mlperf_tf import paths

    text = paths.read_input(path, "--system_file")  # a FIFO or /dev/zero is refused, not read
    try:
        if path.endswith((".yaml", ".yml")):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as e:  # json.JSONDecodeError or yaml.YAMLError: both name the line
        raise UserError(f"system file {path!r} is not valid: {str(e).splitlines()[0]}") from None
    return from_dict(data, repr(path))


def load(name: str) -> System:
    """A built-in system by name.

    Raises:
      UserError: no built-in system has that name (the message lists them).
    """
    for ext in (".json", ".yaml"):
        path = os.path.join(SYSTEMS_DIR, name + ext)
        if os.path.exists(path):
            return load_file(path)
    raise UserError(f"unknown system '{name}' (systems: {', '.join(available())})")
