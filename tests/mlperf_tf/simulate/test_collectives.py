"""Tests of the α–β all-reduce models against hand-computed cases."""

import pytest

from mlperf_tf.simulate import collectives
from mlperf_tf.simulate.collectives import Link

LINK = Link(bandwidth=1e9, alpha=1e-6)  # 1 GB/s per direction, 1 us per step
MB = 1e6


def test_ring_allreduce_hand_computed():
    # p = 4, n = 8 MB: 2(p-1) = 6 steps of 1 us; 2(p-1)/p * n / B = 1.5 * 8e6 / 1e9 = 12 ms.
    cost = collectives.ring_allreduce(8 * MB, 4, LINK)
    assert cost.latency_s == pytest.approx(6e-6)
    assert cost.bandwidth_s == pytest.approx(12e-3)
    assert cost.total_s == pytest.approx(12.006e-3)
    # Two rings in opposite directions halve the bandwidth term, not the latency.
    both = collectives.ring_allreduce(8 * MB, 4, LINK, bidirectional=True)
    assert both.bandwidth_s == pytest.approx(6e-3)
    assert both.latency_s == pytest.approx(6e-6)


def test_one_participant_costs_nothing():
    assert collectives.ring_allreduce(8 * MB, 1, LINK).total_s == 0.0


def test_2d_torus_hand_computed():
    # 4x4 torus, n = 16 MB. Dim 1 (ring of 4, both directions): RS = 3 us + 3/4 * 16e6 / 2e9
    # = 6 ms; dim 2 on the 4 MB shard: 3 us + 3/4 * 4e6 / 2e9 = 1.5 ms. All-gathers mirror them.
    cost = collectives.torus_allreduce(16 * MB, (4, 4), (True, True), LINK)
    assert cost.latency_s == pytest.approx(2 * (3e-6 + 3e-6))
    assert cost.bandwidth_s == pytest.approx(2 * (6e-3 + 1.5e-3))


def test_mesh_without_wraparound_has_half_the_bandwidth_of_the_torus():
    torus = collectives.torus_allreduce(16 * MB, (4, 4), (True, True), LINK)
    mesh = collectives.torus_allreduce(16 * MB, (4, 4), (False, False), LINK)
    assert mesh.bandwidth_s == pytest.approx(2 * torus.bandwidth_s)
    assert mesh.latency_s == pytest.approx(torus.latency_s)


def test_torus_reduces_the_wrapped_dim_first():
    # 8x4 with only the 4-dim wrapped: starting on the wrapped dim moves the big first phase
    # over two rings. Hand count, 32 MB: dim 4 (wrapped): 3/4 * 32e6 / 2e9 = 12 ms, then dim 8
    # (line) on 8 MB: 7/8 * 8e6 / 1e9 = 7 ms; x2 for the all-gathers = 38 ms.
    cost = collectives.torus_allreduce(32 * MB, (8, 4), (False, True), LINK)
    assert cost.bandwidth_s == pytest.approx(2 * (12e-3 + 7e-3))


def test_2d_beats_1d_ring_at_scale_on_latency():
    """Ying et al. 2018's point: 2(p-1) ring steps vs 2 * sum(L_i - 1) torus steps."""
    ring = collectives.ring_allreduce(100 * MB, 1024, LINK, bidirectional=True)
    torus = collectives.torus_allreduce(100 * MB, (32, 32), (True, True), LINK)
    assert ring.latency_s == pytest.approx(2 * 1023 * 1e-6)
    assert torus.latency_s == pytest.approx(2 * 2 * 31 * 1e-6)
    assert torus.total_s < ring.total_s


def test_hierarchical_hand_computed():
    # 2 nodes x 4 GPUs, n = 8 MB, NVLink 10 GB/s, network 1 GB/s.
    # RS in node: 3 * 1us + 3/4 * 8e6 / 1e10 = 0.6 ms; across: ring of 2 on 2 MB:
    # 2 * 10 us + 2 * 1/2 * 2e6 / 1e9 = 2 ms; AG in node = RS.
    intra = Link(bandwidth=1e10, alpha=1e-6)
    inter = Link(bandwidth=1e9, alpha=1e-5)
    cost = collectives.hierarchical_allreduce(
        8 * MB, gpus_per_node=4, nodes=2, intra=intra, inter=inter
    )
    assert cost.latency_s == pytest.approx(2 * 3e-6 + 2e-5)
    assert cost.bandwidth_s == pytest.approx(2 * 0.6e-3 + 2e-3)
    # The flat ring pays 2(p-1) = 14 network-paced steps instead.
    flat = collectives.flat_ring_allreduce(
        8 * MB, gpus_per_node=4, nodes=2, intra=intra, inter=inter
    )
    assert flat.latency_s == pytest.approx(14 * 1e-5)
    assert flat.bandwidth_s == pytest.approx(2 * 7 / 8 * 2e6 / 1e9)


def test_failed_chips_slow_the_phases_by_the_detour_contention():
    healthy = collectives.torus_allreduce(16 * MB, (4, 4), (True, True), LINK)
    holed = collectives.torus_allreduce(16 * MB, (4, 4), (True, True), LINK, failed_chips=1)
    assert collectives.detour_contention((4, 4), 1) == 2.0
    assert holed.bandwidth_s == pytest.approx(2 * healthy.bandwidth_s)
    # Each phase's worst line gains 2 hops per hole: 4 phases (2 RS + 2 AG) x 2 us.
    assert holed.latency_s == pytest.approx(healthy.latency_s + 4 * 2e-6)
    # More holes than half the lines stack detours.
    assert collectives.detour_contention((4, 4), 3) == 3.0


def test_bad_links_are_rejected():
    with pytest.raises(ValueError, match="bandwidth"):
        Link(bandwidth=0, alpha=0)
    with pytest.raises(ValueError, match="alpha"):
        Link(bandwidth=1, alpha=-1)
