"""Provides α–β cost models of all-reduce on rings, N-d tori/meshes and NVLink+network clusters.

Every model charges `alpha` seconds per message step (latency of one hop plus software) and
`bytes / bandwidth` for the bytes a link carries, where the bandwidth is per link and per direction
(Hockney's α–β model, as in Thakur, Rabenseifner & Gropp, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 2005). An all-reduce is a reduce-scatter followed by
an all-gather; on p participants each moves (p-1)/p of the data, in p-1 steps.

- Ring on p chips, one direction: 2(p-1)α + 2(p-1)/p · n/B. Two rings, one per direction
  (every link is full duplex), halve the bandwidth term: 2(p-1)α + (p-1)/p · n/B.
- N-d torus or mesh (Ying et al. 2018, "Image Classification at Supercomputer Scale", the 2-D
  gradient summation): reduce-scatter along dim 1, then along dim 2 on the 1/p1 shard, ..., then
  all-gather in reverse. A dim of length L with wrap-around is a bidirectional ring; without it (a
  line, as in a mesh slice), the ring folds onto the line and uses each link once per direction,
  so it runs as a one-direction ring: half the bandwidth of the torus dim.
- Hierarchical (Jia et al. 2018; NCCL/Horovod on DGX clusters): reduce-scatter inside a node over
  NVLink, all-reduce of the 1/g shard across nodes (each GPU over its own share of the network),
  all-gather inside the node.

Failed chips on a torus/mesh ("fault-tolerant all-reduce around failed chips on 2-D meshes",
Google's MLPerf v0.7 TPU-v3 submission notes): a ring along a line with a hole detours through a
neighbouring line. Each detour adds 2 hops and shares the neighbour's links with that line's own
ring, so the bottleneck link of that dim phase carries two streams:
the bandwidth term of every phase whose lines cross a hole is multiplied by 1 + (detours that can
share one line), and its latency term by 2 extra hops per hole on the worst line.
"""

from __future__ import annotations

import dataclasses
import itertools
import math


@dataclasses.dataclass(frozen=True)
class Link:
    """One link class of a topology.

    Attributes:
      bandwidth: bytes/s per link and per direction.
      alpha: seconds per message step (hop latency plus software overhead).
    """

    bandwidth: float
    alpha: float

    def __post_init__(self):
        if self.bandwidth <= 0:
            raise ValueError(f"link bandwidth ({self.bandwidth}) must be positive")
        if self.alpha < 0:
            raise ValueError(f"link alpha ({self.alpha}) must be >= 0")


@dataclasses.dataclass(frozen=True)
class Cost:
    """The time of one collective, split into its α (latency) and β (bandwidth) parts, in seconds."""

    latency_s: float
    bandwidth_s: float

    @property
    def total_s(self) -> float:
        return self.latency_s + self.bandwidth_s

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.latency_s + other.latency_s, self.bandwidth_s + other.bandwidth_s)

    def issued(self, times: float) -> Cost:
        """The same bytes sent in `times` collectives of 1/times each (a step's micro-batches):
        the latency paid `times` times, the bandwidth time unchanged."""
        return Cost(self.latency_s * times, self.bandwidth_s)


ZERO = Cost(0.0, 0.0)


def ring_reduce_scatter(nbytes: float, p: int, link: Link, *, bidirectional: bool) -> Cost:
    """Reduce-scatter of `nbytes` per participant on a ring of `p` (the all-gather costs the same).

    Returns:
      (p-1)α latency and (p-1)/p · nbytes / B bandwidth time, halved when two rings run in
      opposite directions (`bidirectional`).
    """
    if p <= 1:
        return ZERO
    per_direction = link.bandwidth * (2 if bidirectional else 1)
    return Cost((p - 1) * link.alpha, (p - 1) / p * nbytes / per_direction)


def ring_allreduce(nbytes: float, p: int, link: Link, *, bidirectional: bool = False) -> Cost:
    """All-reduce on a ring of `p`: 2(p-1)α + 2(p-1)/p · n/B (n/B halved when bidirectional)."""
    rs = ring_reduce_scatter(nbytes, p, link, bidirectional=bidirectional)
    return rs + rs


def torus_allreduce(
    nbytes: float,
    shape: tuple[int, ...],
    wraps: tuple[bool, ...],
    link: Link,
    *,
    failed_chips: int = 0,
) -> Cost:
    """Dimension-by-dimension all-reduce on an N-d torus/mesh (Ying et al. 2018's 2-D algorithm).

    Args:
      nbytes: gradient bytes per chip.
      shape: the slice's chips per dim, e.g. (32, 32).
      wraps: per dim, whether it has wrap-around links (a torus dim) or not (a mesh line).
      link: the chip-to-chip link.
      failed_chips: holes in the mesh; their lines' rings detour through a neighbouring line.

    Returns:
      The reduce-scatter phases (first dim on n bytes, the next on n/L1, ...) plus the
      all-gathers, in the order of dims that costs least.
    """
    if len(shape) != len(wraps):
        raise ValueError(f"shape {shape} and wraps {wraps} differ in length")
    # The first dim reduces all n bytes, later ones only what is left: start with the fastest
    # dims (a wrapped dim has two rings). Tori have at most 3 dims: try every order.
    return min(
        (
            _torus_allreduce_in_order(nbytes, order, shape, link, failed_chips)
            for order in itertools.permutations(zip(shape, wraps))
        ),
        key=lambda c: c.total_s,
    )


def _torus_allreduce_in_order(nbytes, order, shape, link, failed_chips) -> Cost:
    contention = detour_contention(shape, failed_chips)
    cost = ZERO
    shard = float(nbytes)
    for length, wrap in order:
        phase = ring_reduce_scatter(shard, length, link, bidirectional=wrap)
        if failed_chips and length > 1:
            # A line with a hole closes its ring through a neighbour line (2 extra hops per
            # hole), whose links then carry two rings' chunks in lock-step: the phase is paced
            # by those shared links.
            holes_per_line = math.ceil(failed_chips / max(1, math.prod(shape) // length))
            phase = Cost(
                phase.latency_s + 2 * holes_per_line * link.alpha,
                phase.bandwidth_s * contention,
            )
        cost = cost + phase + phase  # reduce-scatter now, the matching all-gather later
        shard /= length
    return cost


def detour_contention(shape: tuple[int, ...], failed_chips: int) -> float:
    """How many rings share the busiest link when `failed_chips` holes are routed around.

    With holes spread so that no two sit in adjacent lines, each detour borrows one neighbour
    line: 2 rings on its links. More holes than half the lines of the smallest dim force
    detours to stack: 1 + ceil(holes / (lines / 2)).
    """
    if failed_chips <= 0:
        return 1.0
    lines = min(shape)
    return 1.0 + math.ceil(failed_chips / max(1, lines // 2))


def hierarchical_allreduce(
    nbytes: float, *, gpus_per_node: int, nodes: int, intra: Link, inter: Link
) -> Cost:
    """NVLink reduce-scatter, network all-reduce of the 1/g shard, NVLink all-gather.

    `inter.bandwidth` is what one GPU gets of the network (its NIC, or the node's NICs / g): the
    g shard all-reduces run at once, one per GPU.
    """
    rs = ring_reduce_scatter(nbytes, gpus_per_node, intra, bidirectional=False)
    across = ring_allreduce(nbytes / gpus_per_node, nodes, inter, bidirectional=False)
    return rs + across + rs


def flat_ring_allreduce(
    nbytes: float, *, gpus_per_node: int, nodes: int, intra: Link, inter: Link
) -> Cost:
    """One ring through every GPU of a cluster (NCCL's ring), as g parallel rings, one per NIC.

    Each of the g rings carries n/g bytes and crosses every node boundary once, so its bandwidth
    term is set by the NIC share: 2(p-1)/p · (n/g) / B_inter; its latency grows with all
    p = g·nodes GPUs: 2(p-1) steps, paced by the slowest (network) hop.
    """
    p = gpus_per_node * nodes
    if nodes == 1:
        return ring_allreduce(nbytes, p, intra)
    steps = 2 * (p - 1)
    bandwidth_s = 2 * (p - 1) / p * (nbytes / gpus_per_node) / inter.bandwidth
    return Cost(steps * inter.alpha, bandwidth_s)
