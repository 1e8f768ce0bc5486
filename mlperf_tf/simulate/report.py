"""Provides the generated tables and plots of `docs/scaling/` (`python -m mlperf_tf.simulate.report`).

Writes `docs/scaling/studies.md` (all-reduce algorithms at scale, failed chips on TPU-v3 meshes,
weight-update sharding) and one PNG per (benchmark, system) with published points. Every number
comes from `model.simulate` with the committed system files; which benchmarks, systems and scales
each table and plot shows is data (`data/studies.json`), not code.
"""

from __future__ import annotations

import functools
import json
import os
import sys

from mlperf_tf.simulate import model, plot, systems, validate

STUDIES = os.path.join(os.path.dirname(__file__), "data", "studies.json")


@functools.cache
def studies() -> dict:
    """The cases of the tables and plots (`data/studies.json`)."""
    with open(STUDIES, encoding="utf-8") as f:
        return json.load(f)


def _row(r: model.Result, *cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def algorithms_table() -> list[str]:
    cases = studies()["algorithms"]
    lines = [
        f"### {cases['title']}",
        "",
        "| benchmark | system | chips | layout | algorithm | all-reduce ms (α / β) | step ms "
        "| samples/s | scaling eff. |",
        "|---|---|---:|---|---|---:|---:|---:|---:|",
    ]
    for benchmark, per_chip in cases["benchmarks"]:
        for name, counts in cases["systems"]:
            system = systems.load(name)
            for chips in counts:
                for algorithm in system.algorithms:
                    r = model.simulate(
                        benchmark=benchmark,
                        system=system,
                        chips=chips,
                        global_batch=per_chip * chips,
                        algorithm=algorithm,
                    )
                    lines.append(
                        _row(
                            r,
                            benchmark,
                            name,
                            chips,
                            r.layout,
                            algorithm,
                            f"{r.allreduce_s * 1e3:.2f} ({r.allreduce_latency_s * 1e3:.2f} / "
                            f"{r.allreduce_bandwidth_s * 1e3:.2f})",
                            f"{r.step_time_s * 1e3:.1f}",
                            f"{r.samples_per_s:,.0f}",
                            f"{r.scaling_efficiency:.2f}",
                        )
                    )
    return lines + [""]


def failed_chips_table() -> list[str]:
    cases = studies()["failed_chips"]
    lines = [
        f"### {cases['title']}",
        "",
        "| benchmark | chips | failed | all-reduce ms | step ms | samples/s | throughput cost "
        "| of which all-reduce | time to train min |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    system = systems.load(cases["system"])
    for benchmark, batch, sharding in cases["benchmarks"]:
        for chips in cases["chips"]:
            healthy = None
            for failed in cases["failed"]:
                r = model.simulate(
                    benchmark=benchmark,
                    system=system,
                    chips=chips,
                    global_batch=batch,
                    failed_chips=failed,
                    weight_update_sharding=sharding,
                )
                healthy = healthy or r
                cost = 1 - r.samples_per_s / healthy.samples_per_s
                comm_part = (r.exposed_comm_s - healthy.exposed_comm_s) / r.step_time_s
                lines.append(
                    _row(
                        r,
                        benchmark,
                        chips,
                        failed,
                        f"{r.allreduce_s * 1e3:.2f}",
                        f"{r.step_time_s * 1e3:.1f}",
                        f"{r.samples_per_s:,.0f}",
                        f"{cost:.1%}",
                        f"{comm_part:.1%}",
                        f"{r.time_to_train_min:.2f}",
                    )
                )
    return lines + [""]


def sharding_table() -> list[str]:
    cases = studies()["sharding"]
    lines = [
        f"### {cases['title']}",
        "",
        "| benchmark | chips | sharding | update ms | step ms | time to train min |",
        "|---|---:|---|---:|---:|---:|",
    ]
    system = systems.load(cases["system"])
    for benchmark, batch in cases["benchmarks"]:
        for chips in cases["chips"]:
            for sharding in (False, True):
                r = model.simulate(
                    benchmark=benchmark,
                    system=system,
                    chips=chips,
                    global_batch=batch,
                    weight_update_sharding=sharding,
                )
                lines.append(
                    _row(
                        r,
                        benchmark,
                        chips,
                        "yes" if sharding else "no",
                        f"{r.weight_update_s * 1e3:.2f}",
                        f"{r.step_time_s * 1e3:.1f}",
                        f"{r.time_to_train_min:.3f}",
                    )
                )
    return lines + [""]


def studies_text() -> str:
    """The content of `docs/scaling/studies.md`."""
    return "\n".join(
        [
            "<!-- Generated by `python -m mlperf_tf.simulate.report`; do not edit. -->",
            "",
            *algorithms_table(),
            *failed_chips_table(),
            *sharding_table(),
        ]
    )


def main(argv: list[str]) -> int:
    del argv
    os.makedirs(validate.DOCS_DIR, exist_ok=True)
    text = studies_text()
    with open(os.path.join(validate.DOCS_DIR, "studies.md"), "w", encoding="utf-8") as f:
        f.write(text)
    for benchmark, name, batch in studies()["plots"]:
        system = systems.load(name)
        out = os.path.join(validate.DOCS_DIR, f"{benchmark}-{name}.png")
        plot.scaling_plot(
            benchmark=benchmark,
            system=system,
            chips=[1],
            global_batch=batch,
            preset="mlperf",
            out=out,
        )
        print(f"wrote {out}")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
