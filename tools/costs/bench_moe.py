"""What does expert parallelism cost? An MoE block's all-to-all bytes and step time per replica,
against a dense feed-forward block of the same active FLOPs.

On `--devices` logical CPUs (MirroredStrategy), each replica runs forward + backward + the
gradient sum (the runner's `mlperf_tf.collectives.GradientSummer`, ring, no optimizer update)
of one block on its own [tokens, hidden] batch:

* `dense`: a ReLU feed-forward block of width `--filter` (data parallel);
* `moe_E<P>`: `--experts` experts of width `--filter / --top_k`, top-k routing, capacity factor
  `--capacity_factor`, split over P replicas of the expert axis (P = 1 keeps every expert on
  every replica: no all-to-all).

Bytes are counted from the traced collectives (`Collectives.traffic`, per replica per step:
4 all-to-alls per MoE block, dispatch and combine forward and backward, (P-1)/P of the
[E, C, d] buffer each). Times are medians over rounds that alternate the contestants, so load
drifts hit them alike; on a shared CPU they say how much the exchange and the routing add, not
what an interconnect would do.

    python tools/costs/bench_moe.py [--devices=4] [--tokens=1024] [--hidden=128] [--filter=512]
        [--experts=8] [--top_k=2] [--capacity_factor=1.25] [--steps=5] [--rounds=3]
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from mlperf_tf.collectives import GradientSummer, Settings  # noqa: E402
from mlperf_tf.distribute import split_cpu  # noqa: E402
from mlperf_tf.layers import moe  # noqa: E402
from mlperf_tf.parallel.mesh import DeviceMesh  # noqa: E402
from tools import harness  # noqa: E402
from tools.harness import require_positive  # noqa: E402


def contestant(strategy, mesh: DeviceMesh | None, args):
    """(step function running `--steps` steps, summer, layer) for one configuration."""
    with strategy.scope():
        if mesh is None:
            layer = keras.Sequential(
                [
                    keras.layers.Dense(args.filter, activation="relu"),
                    keras.layers.Dense(args.hidden),
                ]
            )
            layer.build((None, args.hidden))
        else:
            layer = moe.MoEFeedForward(
                hidden_size=args.hidden, filter_size=args.filter // args.top_k,
                num_experts=args.experts, top_k=args.top_k, capacity_factor=args.capacity_factor,
                group_size=args.tokens, expert_parallel=mesh.expert,
                mesh=mesh if mesh.expert > 1 else None,
            )  # fmt: skip
            layer.build((None, args.hidden))
    variables = layer.trainable_variables
    summer = GradientSummer(
        strategy, Settings(all_reduce="ring"), mesh or DeviceMesh(data=args.devices)
    )
    summer.build(keras.optimizers.SGD(0.1), variables)
    rng = np.random.default_rng(0)
    data = rng.normal(size=(args.devices, args.tokens, args.hidden)).astype(np.float32)
    x = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(data[ctx.replica_id_in_sync_group])
    )

    def replica(x):
        with tf.GradientTape() as tape:
            y = layer(x, training=True)
            if isinstance(y, (tuple, list)):
                y = y[0]
            loss = tf.reduce_mean(tf.square(y))
        return summer.sum_gradients(tape.gradient(loss, variables))

    @tf.function
    def steps(n):
        for _ in tf.range(n):
            strategy.run(replica, args=(x,))

    return steps, summer, layer


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=1024, help="tokens per replica")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--filter", type=int, default=512, help="the dense block's width")
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top_k", type=int, default=2)
    parser.add_argument("--capacity_factor", type=float, default=1.25)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    require_positive(parser, args, "devices", "tokens", "hidden", "filter", "experts", "top_k", "steps",
                     "rounds")  # fmt: skip
    split_cpu(args.devices)
    strategy = tf.distribute.MirroredStrategy(
        [f"CPU:{i}" for i in range(args.devices)],
        cross_device_ops=tf.distribute.ReductionToOneDevice(),
    )
    contestants = {"dense": None}
    p = 1
    while p <= args.devices:
        if args.experts % p == 0 and args.devices % p == 0:
            contestants[f"moe_E{p}"] = DeviceMesh(data=args.devices // p, expert=p)
        p *= 2
    built = {name: contestant(strategy, mesh, args) for name, mesh in contestants.items()}
    runs = {name: functools.partial(_run, steps) for name, (steps, _, _) in built.items()}
    harness.warm_up(runs)  # trace, set up the collectives
    result = harness.interleaved_rounds(
        runs, steps=args.steps, rounds=args.rounds, samples_per_step=args.tokens * args.devices
    )
    times = {
        name: [result.samples_per_step / r for r in rates] for name, rates in result.rates.items()
    }
    load = os.getloadavg()
    print(
        f"tokens/replica {args.tokens}, hidden {args.hidden}, dense filter {args.filter}, "
        f"{args.experts} experts of {args.filter // args.top_k}, top-{args.top_k}, capacity "
        f"factor {args.capacity_factor}, {args.devices} devices; load {load[0]:.1f}"
    )
    base = statistics.median(times["dense"])
    print(f"{'config':10s} {'ms/step':>9s} {'vs dense':>9s} {'all-to-all MiB':>15s} "
          f"{'all-reduce MiB':>15s} {'expert params/replica':>22s}")  # fmt: skip
    for name, (_, summer, layer) in built.items():
        sent = summer.traffic.get(0)
        a2a = (sent.sent.get("all_to_all", 0.0) if sent else 0.0) / 2**20
        ar = (sent.sent.get("all_reduce", 0.0) if sent else 0.0) / 2**20
        params = sum(int(np.prod(w.shape)) for w in getattr(layer, "expert_weights", []))
        median = statistics.median(times[name])
        print(f"{name:10s} {median * 1e3:9.1f} {median / base:9.2f} {a2a:15.2f} {ar:15.2f} "
              f"{params:22d}")  # fmt: skip


def _run(steps_fn, steps: int) -> None:
    steps_fn(tf.constant(steps))


if __name__ == "__main__":
    main()
