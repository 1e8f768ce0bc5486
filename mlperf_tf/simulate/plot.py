"""Provides `scaling_plot`: samples/s and time to train against chips, one line per algorithm.

Published points of the same benchmark and system (`data/published.json`) are overlaid as
markers: times to train on the right panel, throughputs on the left (measured ones, or a
log's epochs x epoch size / time to train, which includes its evaluations).
"""

from __future__ import annotations

import json
import os

from mlperf_tf.errors import UserError
from mlperf_tf.simulate import model
from mlperf_tf.simulate.systems import System

PUBLISHED = os.path.join(os.path.dirname(__file__), "data", "published.json")


def default_chip_counts(system: System) -> list[int]:
    """Chip counts that fit the system, doubling from its smallest to its largest."""
    topo = system.topology
    if system.kind == "torus":
        low, high = int(topo.get("min_chips", 1)), 1
        for d in topo["max_shape"]:
            high *= int(d)
    elif system.kind == "switched":
        low = int(topo["chips_per_node"])
        high = low * int(topo.get("max_nodes", 64))
    else:
        low, high = 1, int(topo.get("max_chips", 8))
    counts, c = [], low
    while c <= high:
        counts.append(c)
        c *= 2
    return counts


def _published(benchmark: str, system: str) -> list[dict]:
    with open(PUBLISHED, encoding="utf-8") as f:
        points = json.load(f)["points"]
    return [p for p in points if p["benchmark"] == benchmark and p["system"] == system]


def scaling_plot(
    *,
    benchmark: str,
    system: System,
    chips: list[int],
    global_batch: int | None,
    preset: str,
    out: str,
) -> str:
    """Draws the two panels into the PNG `out`; returns its path.

    With one chip count given, the sweep covers every count the system allows (doubling);
    configurations that do not fit (e.g. a fixed batch smaller than the chips) are left out.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted(set(chips)) if len(chips) > 1 else default_chip_counts(system)
    fig, (ax_rate, ax_time) = plt.subplots(1, 2, figsize=(11, 4.2))
    drawn = 0
    for algorithm in system.algorithms:
        xs, rates, times = [], [], []
        for n in counts:
            try:
                r = model.simulate(
                    benchmark=benchmark,
                    system=system,
                    chips=n,
                    global_batch=global_batch,
                    algorithm=algorithm,
                    preset=preset,
                )
            except UserError:
                continue
            xs.append(n)
            rates.append(r.samples_per_s)
            times.append(r.time_to_train_min)
        if xs:
            ax_rate.plot(xs, rates, marker=".", label=f"predicted, {algorithm}")
            ax_time.plot(xs, times, marker=".", label=f"predicted, {algorithm}")
            drawn += 1
    if not drawn:
        plt.close(fig)
        raise UserError(f"no chip count in {counts} fits '{system.name}' with this batch")
    facts = model.benchmark_facts(benchmark, preset)
    for p in _published(benchmark, system.name):
        label = f"{p['id']} (published)"
        if "minutes" in p:
            ax_time.scatter([p["chips"]], [p["minutes"]], marker="x", color="k", zorder=3)
            ax_time.annotate(p["id"], (p["chips"], p["minutes"]), fontsize=6)
            if p.get("epochs_logged"):
                rate = p["epochs_logged"] * facts["train_examples"] / (p["minutes"] * 60)
                ax_rate.scatter([p["chips"]], [rate], marker="x", color="k", zorder=3)
        if "samples_per_s" in p:
            ax_rate.scatter([p["chips"]], [p["samples_per_s"]], marker="*", color="r", zorder=3)
            ax_rate.annotate(label, (p["chips"], p["samples_per_s"]), fontsize=6)
    for ax, ylabel in ((ax_rate, "samples/s"), (ax_time, "time to train (min)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("chips")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{benchmark} on {system.name} (x: published, from docs/scaling.md)")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
