"""Exactness of the gradient summer: 10 steps of the tiny benchmark with each algorithm, with and
without packing and sharding, end at the weights of Keras' own sum (1e-5 relative).

The default run covers every algorithm and optimizer on 4 logical devices with a few
combinations; the full sweep (4 and 8 devices, every combination) runs in subprocesses under
`slow`.
"""

import json
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.collectives import GradientSummer, Settings
from mlperf_tf.errors import UserError
from tests import processes, strategies
from tests.mlperf_tf.collectives import harness

pytestmark = pytest.mark.numerics

RTOL = 1e-5


@pytest.fixture(scope="module")
def strategy():
    return strategies.mirrored(4)


@pytest.fixture(scope="module")
def references(strategy):
    cache = {}

    def get(optimizer_name, clip_norm=None):
        key = (optimizer_name, clip_norm)
        if key not in cache:
            cache[key] = harness.train(strategy, optimizer_name, None, clip_norm=clip_norm)[0]
        return cache[key]

    return get


SLOW = pytest.mark.slow
# Extended (CI runs it after README's default run): Adam's element-wise rule; the default run
# covers it by AdamW's case.
EXTENDED = pytest.mark.extended


@pytest.mark.parametrize(
    ("optimizer", "algorithm", "pack_mb", "sharding"),
    [("lars", "ring", 0.001, True),
     ("lamb", "hierarchical", 0.0, True),
     ("sgd", "torus2d", 0.001, True),
     ("lamb", "torus2d", 0.001, False),
     pytest.param("sgd", "ring", 0.0, False, marks=SLOW),
     pytest.param("sgd", "hierarchical", 0.001, False, marks=SLOW),
     pytest.param("lars", "torus2d", 0.0, True, marks=SLOW),
     pytest.param("lamb", "auto", 0.001, True, marks=SLOW),
     # Adam and AdamW declare their sharded rule: element-wise updates (no norms), the
     # optimizer's formula on each piece.
     pytest.param("adam", "ring", 0.001, True, marks=EXTENDED),
     ("adamw", "ring", 0.001, True)],
)  # fmt: skip
def test_four_devices_match_the_plain_sum(strategy, references, optimizer, algorithm, pack_mb,
                                          sharding):  # fmt: skip
    settings = Settings(all_reduce=algorithm, pack_mb=pack_mb, weight_update_sharding=sharding,
                        timeout_s=60)  # fmt: skip
    got, summer = harness.train(strategy, optimizer, settings)
    want = references(optimizer)
    assert harness.max_rel_error(got, want) < RTOL
    # Training moved the weights, so the comparison is not between two initializations.
    initial, _ = harness.train(strategy, optimizer, settings, steps=0)
    assert harness.max_rel_error(initial, want) > 1e-3
    assert str(summer.mesh) == "2x2"


@pytest.mark.parametrize("sharding", [pytest.param(False, marks=SLOW), True])
def test_clipping_uses_the_summed_gradient(strategy, references, sharding):
    settings = Settings(all_reduce="torus2d", pack_mb=0.001, weight_update_sharding=sharding,
                        timeout_s=60)  # fmt: skip
    got, _ = harness.train(strategy, "lamb", settings, clip_norm=0.05)
    assert harness.max_rel_error(got, references("lamb", 0.05)) < RTOL
    # The clip is active: the unclipped run ends elsewhere.
    assert harness.max_rel_error(references("lamb"), references("lamb", 0.05)) > 1e-3


def test_sharding_keeps_one_nth_of_the_slots_per_replica(strategy):
    _, full = harness.train(strategy, "lamb", Settings(all_reduce="ring"), steps=0)
    _, sharded = harness.train(strategy, "lamb", Settings(weight_update_sharding=True), steps=0)
    values = sum(s.size for s in full.packing.slots)
    assert not full.slots
    # LAMB: two slots; each replica holds ceil(n / 4) of each tensor's values.
    assert sharded.slot_bytes_per_replica() == 2 * 4 * sum(s.cols for s in sharded.packing.slots)
    assert sharded.slot_bytes_per_replica() <= 2 * 4 * (values / 4 + len(sharded.packing.slots))


def test_bytes_sent_by_each_algorithm(strategy):
    """Ring formulas per replica (N=4, 2x2 mesh): the reduce-scatter moves half of all-reduce."""
    sent = {}
    for algorithm, sharding in (("ring", False), ("ring", True), ("hierarchical", False),
                                ("torus2d", False)):  # fmt: skip
        settings = Settings(all_reduce=algorithm, pack_mb=64.0, weight_update_sharding=sharding)
        _, summer = harness.train(strategy, "sgd", settings, steps=1)
        sent[algorithm, sharding] = summer.bytes_sent_per_replica()
    size = 4 * sum(s.cols * 4 for s in summer.packing.slots)  # one padded fp32 bucket, bytes
    assert sent["ring", False] == pytest.approx(2 * 3 / 4 * size)
    # Sharded ring: reduce-scatter (3/4 S) + all-gather (3/4 S) = one all-reduce's bytes.
    assert sent["ring", True] == pytest.approx(2 * 3 / 4 * size)
    # torus2d: row RS 1/2 S + column AR 2 * 1/2 * S/2 + row AG 1/2 S.
    assert sent["torus2d", False] == pytest.approx(1.5 * size)
    # hierarchical: row AR S, leaders' AR (S on half of the replicas), broadcast S on leaders.
    assert sent["hierarchical", False] == pytest.approx(size + 0.5 * size + 0.5 * size)


def test_optimizer_without_a_sharded_rule_is_a_one_line_error(strategy):
    import keras  # noqa: PLC0415

    summer = GradientSummer(strategy, Settings(weight_update_sharding=True))
    with strategy.scope():
        variable = keras.Variable(tf.zeros([3]))
        optimizer = keras.optimizers.Adam()
    with pytest.raises(
        UserError,
        match=r"supports Keras' SGD and the suite's .*, not keras\.src\.optimizers\.adam\.Adam ",
    ):
        summer.build(optimizer, [variable])
    with strategy.scope():
        decayed = keras.optimizers.SGD(0.1, weight_decay=0.01)
    with pytest.raises(UserError, match="weight_decay"):
        summer.build(decayed, [variable])


def test_kfac_declares_no_sharded_rule_though_it_is_a_lars(strategy):
    # K-FAC subclasses LARS but preconditions in `apply`, which the sharded update bypasses: it
    # opts out of LARS' rule (and its whole norms), so sharding it is an error, not a silent LARS.
    from mlperf_tf.optimizers.kfac import KFAC  # noqa: PLC0415

    summer = GradientSummer(strategy, Settings(weight_update_sharding=True))
    with strategy.scope():
        variable = tf.Variable(tf.zeros([3]))
        optimizer = KFAC(0.1, base_optimizer="lars")
    with pytest.raises(UserError, match=r"not mlperf_tf\.optimizers\.kfac\.KFAC ") as error:
        summer.build(optimizer, [variable])
    assert "\n" not in str(error.value)


def _sweep(num_devices):
    command = [sys.executable, "-m", "tests.mlperf_tf.collectives.harness", str(num_devices)]
    out = subprocess.run(command, cwd=processes.REPO_ROOT, env=processes.python_env(),
                         capture_output=True, text=True, timeout=1800)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
@pytest.mark.parametrize("num_devices", [4, 8])
def test_full_sweep(num_devices):
    results = _sweep(num_devices)
    # 3 optimizers x (4 algorithms x 2 pack sizes x 2 sharding - auto's plain case).
    assert len(results) == 3 * 15
    bad = [r for r in results if not r["max_rel_error"] < RTOL]
    assert not bad, bad
    assert {r["case"]["mesh"] for r in results} == {"2x2" if num_devices == 4 else "2x4"}
    assert np.isfinite([r["max_rel_error"] for r in results]).all()


def _sum_groups(strategy, device_mesh, algorithm):
    """Per replica, the sums of (replica id + 1) of a replicated [2] variable and of an [1, 2]
    variable that is expert-split when the mesh has an expert axis."""
    from mlperf_tf.parallel import layout  # noqa: PLC0415

    with strategy.scope():
        replicated = keras.Variable(np.zeros([2], np.float32), name="replicated")
        expert = keras.Variable(np.zeros([1, 2], np.float32), name="expert")
    if device_mesh.expert > 1:
        layout.set_layout(expert, layout.EXPERT_SPLIT)
    summer = GradientSummer(strategy, Settings(all_reduce=algorithm, timeout_s=60), device_mesh)
    summer.build(None, [replicated, expert])

    def replica():
        value = tf.cast(
            tf.distribute.get_replica_context().replica_id_in_sync_group + 1, tf.float32
        )
        return summer.sum_gradients([tf.fill([2], value), tf.fill([1, 2], value)])

    out = tf.function(lambda: strategy.run(replica))()
    return (
        [float(v[0]) for v in strategy.experimental_local_results(out[0])],
        [float(v[0, 0]) for v in strategy.experimental_local_results(out[1])],
    )


@pytest.mark.parametrize("algorithm", ["ring", "hierarchical"])
def test_each_sum_group_runs_on_a_view_of_its_own_size(strategy, algorithm):
    """data 2 x spatial 2: a replicated weight's gradient is summed over all 4 replicas (the
    slabs hold partial gradients; before, the algorithm's view had `batch_shards` = 2 replicas
    and replicas 2 and 3 were asked to join a ring of [0, 1]); data 2 x expert 2: an
    expert-split weight's over the 2 replicas of its data axis only, the replicated one's over
    all 4, each group on a view of its own size."""
    from mlperf_tf.parallel.mesh import DeviceMesh  # noqa: PLC0415

    spatial = _sum_groups(strategy, DeviceMesh(data=2, spatial=2), algorithm)
    assert spatial == ([10.0] * 4, [10.0] * 4)
    expert = _sum_groups(strategy, DeviceMesh(data=2, expert=2), algorithm)
    assert expert == ([10.0] * 4, [4.0, 6.0, 4.0, 6.0])
