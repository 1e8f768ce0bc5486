"""The ST-MoE paper's claims on the Transformer-mini data (issue 28 item 4, `docs/moe.md`).

Runs the study's `mlperf-tf run` commands one at a time (never two TensorFlow jobs at once),
each seed of each variant of each claim into its own folder, and prints the tables from the
runs' progress output (`progress.txt`: the absl progress, eval and run_stop lines):

* (a) `a`: 8-expert top-2 Transformer-mini (experts of width 256, every 2nd block: the dense
  model's active FLOPs) against the dense model, to the mini target (BLEU 0.25) within
  `--a_steps` steps;
* (b) `b`: router z-loss 0 vs 1e-3 at a raised learning rate (`--lr`), `--b_steps` steps;
* (c) `c`: training capacity factor 1.0 / 1.25 / 2.0 / 0 (dropless), `--c_steps` steps.

Per run: steps to the target (or the status), eval BLEU per epoch, the final loop's loss and
auxiliary losses, the peak and final dropped fraction, the largest router logit, and whether the
loss spiked or diverged. A **spike** is a loop whose mean loss exceeds `--spike_ratio` (1.5)
times the lowest loop-mean loss so far, counted after step `--spike_after` (50); **diverged**
means the run stopped at a non-finite loss or ended above its first loop's loss. The progress
line's loss and `moe/*` values are means over the loop's steps (`--steps_per_loop`), so
`max_router_logit` is the largest loop mean of the per-step maxima.

Each run's folder holds `progress.txt`, `run.json` (the command, the `uptime` load averages
before and after, wall seconds) and the run's model_dir (`mlperf_log.txt`, `tensorboard/` with
the per-layer expert loads, `time_breakdown.json`). A finished run is not rerun; `--report`
only reprints the tables of an existing `--out`.

    python tools/studies/moe_study.py --claims=b,c,a --seeds=1,2,3 --out=DIR [--lr=8.0]
        [--stop_at=HH:MM] [--skip=a/dense/1] [--dry_run] [--report]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

MOE = (
    "--config.model.moe.num_experts=8",
    "--config.model.moe.every=2",
    "--config.model.moe.top_k=2",
    "--config.model.moe.filter_size=256",
)

_STEP = re.compile(r"\bstep (\d+)/(\d+) \| epoch ([\d.]+) \|(.*)$")
_EVAL = re.compile(r"\beval at epoch ([\d.]+): ([-\w.+]+) \(target")
_STOP = re.compile(r"\brun_stop status=(\w+) after (\d+) steps, ([\d.]+) s: ([^|]*)")
_FIELD = re.compile(r"\b(loss|moe/[\w/]+) ([-\w.+]+)")


@dataclass
class Variant:
    """One configuration of a claim: its label and the flags it adds to the common ones."""

    claim: str
    label: str
    flags: tuple[str, ...]
    steps: int
    steps_per_loop: int


def variants(args) -> dict[str, list[Variant]]:
    """The study's variants per claim, with the step budgets of `args`."""
    lr = f"--config.optimizer.opt_base_learning_rate={args.lr:g}"
    return {
        "a": [
            Variant("a", "dense", (), args.a_steps, 25),
            Variant("a", "moe8_top2", MOE, args.a_steps, 25),
        ],
        "b": [
            Variant(
                "b", f"z{z}", (lr, *MOE, f"--config.model.moe.z_loss_coef={z}"), args.b_steps, 5
            )
            for z in ("0", "0.001")
        ],
        "c": [
            Variant(
                "c", f"cf{cf}", (*MOE, f"--config.model.moe.capacity_factor={cf}"), args.c_steps, 25
            )
            for cf in ("1.0", "1.25", "2.0", "0")
        ],
    }


def command(mlperf_tf: str, variant: Variant, seed: int, model_dir: str) -> list[str]:
    """The `mlperf-tf run` command of one seed of `variant`."""
    return [
        mlperf_tf, "run", "--benchmark=transformer", "--preset=mini", f"--model_dir={model_dir}",
        f"--seed={seed}", f"--max_train_steps={variant.steps}",
        f"--steps_per_loop={variant.steps_per_loop}", *variant.flags,
    ]  # fmt: skip


def run_dir(out: str, variant: Variant, seed: int) -> str:
    return os.path.join(out, variant.claim, variant.label, f"seed{seed}")


def load_average() -> list[float]:
    """The 1, 5 and 15-minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


def finished(folder: str) -> bool:
    """Whether the run in `folder` printed its run_stop line."""
    path = os.path.join(folder, "progress.txt")
    return os.path.exists(path) and parse_progress(open(path).read()).status is not None


def run_one(mlperf_tf: str, variant: Variant, seed: int, out: str, dry_run: bool) -> None:
    """Runs one seed of `variant` into its folder (a half-done earlier attempt is moved aside)."""
    folder = run_dir(out, variant, seed)
    model_dir = os.path.join(folder, "model")
    cmd = command(mlperf_tf, variant, seed, model_dir)
    print(" ".join(cmd), flush=True)
    if dry_run:
        return
    if os.path.exists(folder):  # an unfinished earlier attempt: kept aside, never deleted
        n = 1
        while os.path.exists(f"{folder}.partial{n}"):
            n += 1
        os.rename(folder, f"{folder}.partial{n}")
    os.makedirs(folder)
    info = {"command": cmd, "load_before": load_average(), "start_utc": _utc()}
    begin = time.monotonic()
    with open(os.path.join(folder, "progress.txt"), "w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
    info.update(
        returncode=rc,
        seconds=round(time.monotonic() - begin, 1),
        load_after=load_average(),
        end_utc=_utc(),
    )
    with open(os.path.join(folder, "run.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(f"  -> rc {rc}, {info['seconds']} s, load {info['load_after']}", flush=True)


def _utc() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%H:%M:%S")


@dataclass
class Progress:
    """What one run's progress output says."""

    loops: list[dict] = field(default_factory=list)  # {"step", "epoch", "loss", "moe/...": float}
    evals: list[tuple[float, int, float]] = field(default_factory=list)  # (epoch, step, BLEU)
    status: str | None = None
    steps: int | None = None
    seconds: float | None = None
    reason: str = ""


def parse_progress(text: str) -> Progress:
    """Reads the progress, eval and run_stop lines of an `mlperf-tf run` output.

    An eval's step is the step of the progress line before it (evals run between loops).
    """
    p = Progress()
    for line in text.splitlines():
        if m := _STEP.search(line):
            row = {"step": int(m.group(1)), "epoch": float(m.group(3))}
            for name, value in _FIELD.findall(m.group(4)):
                row[name] = float(value)
            p.loops.append(row)
        elif m := _EVAL.search(line):
            step = p.loops[-1]["step"] if p.loops else 0
            p.evals.append((float(m.group(1)), step, float(m.group(2))))
        elif m := _STOP.search(line):
            p.status, p.steps, p.seconds = m.group(1), int(m.group(2)), float(m.group(3))
            p.reason = m.group(4).strip()
    return p


def spikes(loops: list[dict], *, ratio: float, after: int) -> list[int]:
    """Steps of the loops whose loss exceeds `ratio` x the lowest loop loss so far (after `after`)."""
    found, low = [], math.inf
    for row in loops:
        loss = row["loss"]
        if row["step"] > after and (not math.isfinite(loss) or loss > ratio * low):
            found.append(row["step"])
        if math.isfinite(loss):
            low = min(low, loss)
    return found


def max_rise(loops: list[dict], *, after: int) -> float:
    """The largest ratio of a loop's loss to the lowest loop loss so far, after step `after`
    (how close the run came to a spike; NaN when no loop is past `after`)."""
    rise, low = math.nan, math.inf
    for row in loops:
        loss = row["loss"]
        if row["step"] > after and math.isfinite(loss) and math.isfinite(low):
            rise = loss / low if math.isnan(rise) else max(rise, loss / low)
        if math.isfinite(loss):
            low = min(low, loss)
    return rise


def summarize(p: Progress, *, ratio: float = 1.5, after: int = 50) -> dict:
    """One run's table row (NaN where the run did not produce the value)."""
    nan = math.nan
    last = p.loops[-1] if p.loops else {}
    dropped = [(row.get("moe/dropped", nan), row["step"]) for row in p.loops]
    peak_drop = max(dropped, default=(nan, 0), key=lambda d: -1 if math.isnan(d[0]) else d[0])
    logits = [row["moe/max_router_logit"] for row in p.loops if "moe/max_router_logit" in row]
    first_loss = p.loops[0]["loss"] if p.loops else nan
    nonfinite = "non-finite" in p.reason or not math.isfinite(last.get("loss", nan))
    spiked = spikes(p.loops, ratio=ratio, after=after)
    return {
        "status": p.status or "unfinished",
        "steps": p.steps if p.steps is not None else (last.get("step") or 0),
        "to_target": p.steps if p.status == "success" else None,
        "bleu": {int(round(epoch)): bleu for epoch, _, bleu in p.evals},
        "final_bleu": p.evals[-1][2] if p.evals else nan,
        "loss": last.get("loss", nan),
        "aux": last.get("moe/aux_loss", nan),
        "balance": last.get("moe/balance_loss", nan),
        "z": last.get("moe/z_loss", nan),
        "dropped": last.get("moe/dropped", nan),
        "peak_dropped": peak_drop[0],
        "peak_dropped_step": peak_drop[1],
        "max_logit": max(logits, default=nan),
        "final_logit": logits[-1] if logits else nan,
        "spikes": len(spiked),
        "max_rise": max_rise(p.loops, after=after),
        "first_spike": spiked[0] if spiked else None,
        "diverged": bool(p.loops) and (nonfinite or last["loss"] > first_loss),
        "seconds": p.seconds,
    }


def _num(x, fmt="{:.3f}") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return fmt.format(x)


COLUMNS = {
    # key: (header, format)
    "loss": ("loss", "{:.3f}"),
    "aux": ("aux", "{:.4f}"),
    "balance": ("balance", "{:.3f}"),
    "z": ("z-loss", "{:.3f}"),
    "dropped": ("dropped", "{:.3f}"),
    "peak_dropped": ("peak dropped", "{:.3f}"),
    "peak_dropped_step": ("at step", "{:d}"),
    "max_logit": ("max logit", "{:.2f}"),
    "final_logit": ("final logit", "{:.2f}"),
    "spikes": ("spikes", "{:d}"),
    "max_rise": ("max loss / running min", "{:.3f}"),
}
# The columns of each claim's tables (every run's summary has them all).
CLAIM_COLUMNS = {
    "a": ("loss", "aux", "balance", "dropped", "max_logit"),
    "b": ("loss", "z", "max_logit", "final_logit", "peak_dropped", "peak_dropped_step", "dropped",
          "max_rise", "spikes"),
    "c": ("loss", "dropped", "peak_dropped", "peak_dropped_step", "balance", "max_logit"),
}  # fmt: skip
# Per-run values that a mean over seeds does not summarize.
_NOT_AVERAGED = ("final_logit", "peak_dropped_step", "spikes")


def run_table(rows: list[tuple[str, int, dict]], epochs: list[int], columns) -> str:
    """Markdown: one line per run (variant, seed), with the `columns` keys of `COLUMNS`."""
    head = ["variant", "seed", "status @ steps", "to target", *[f"BLEU ep{e}" for e in epochs],
            *[COLUMNS[k][0] for k in columns], "first spike", "diverged", "load"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, seed, s in rows:
        cells = [label, str(seed), f"{s['status']} @ {s['steps']}", _num(s["to_target"], "{:d}"),
                 *[_num(s["bleu"].get(e)) for e in epochs],
                 *[_num(s[key], COLUMNS[key][1]) for key in columns],
                 _num(s["first_spike"], "{:d}"), "yes" if s["diverged"] else "no",
                 s.get("load", "-")]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def seed_table(rows: list[tuple[str, int, dict]], epochs: list[int], columns) -> str:
    """Markdown: per variant, mean [min, max] over its finished seeds."""
    keys = [("steps to target", "to_target", "{:.0f}")]
    keys += [(f"BLEU ep{e}", ("bleu", e), "{:.3f}") for e in epochs]
    keys += [(COLUMNS[k][0], k, COLUMNS[k][1]) for k in columns if k not in _NOT_AVERAGED]
    head = ["variant", "seeds", *[k[0] for k in keys], "runs spiked", "runs diverged"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label in dict.fromkeys(r[0] for r in rows):
        runs = [s for lab, _, s in rows if lab == label and s["status"] != "unfinished"]
        if not runs:
            continue
        cells = [label, str(len(runs))]
        for _, key, fmt in keys:
            values = [s[key[0]].get(key[1]) if isinstance(key, tuple) else s[key] for s in runs]
            values = [v for v in values if v is not None and not math.isnan(v)]
            if not values:
                cells.append("-")
                continue
            missing = f" ({len(values)} of {len(runs)})" if len(values) < len(runs) else ""
            cells.append(
                f"{fmt.format(statistics.mean(values))} [{fmt.format(min(values))}, "
                f"{fmt.format(max(values))}]{missing}"
            )
        cells.append(f"{sum(s['spikes'] > 0 for s in runs)}/{len(runs)}")
        cells.append(f"{sum(s['diverged'] for s in runs)}/{len(runs)}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(out: str, claims: list[str], seeds: list[int], table: dict, args) -> str:
    """The tables of every finished (or partly run) run under `out`."""
    parts = []
    for claim in claims:
        rows = []
        for variant in table[claim]:
            for seed in seeds:
                folder = run_dir(out, variant, seed)
                path = os.path.join(folder, "progress.txt")
                if not os.path.exists(path):
                    continue
                s = summarize(
                    parse_progress(open(path).read()),
                    ratio=args.spike_ratio,
                    after=args.spike_after,
                )
                info_path = os.path.join(folder, "run.json")
                if os.path.exists(info_path):
                    info = json.load(open(info_path))
                    s["load"] = f"{info['load_before'][0]:.1f}-{info['load_after'][0]:.1f}"
                rows.append((variant.label, seed, s))
        if not rows:
            parts.append(f"## claim ({claim}): no runs in {out}")
            continue
        epochs = sorted({e for _, _, s in rows for e in s["bleu"]})
        columns = CLAIM_COLUMNS[claim]
        parts.append(f"## claim ({claim}): per run\n\n{run_table(rows, epochs, columns)}")
        parts.append(
            f"## claim ({claim}): across seeds, mean [min, max]\n\n"
            f"{seed_table(rows, epochs, columns)}"
        )
    return "\n\n".join(parts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", default="a,b,c", help="claims to run, in this order")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--out", required=True, help="results folder")
    parser.add_argument("--lr", type=float, default=16.0, help="(b)'s opt_base_learning_rate")
    parser.add_argument("--a_steps", type=int, default=875)
    parser.add_argument("--b_steps", type=int, default=200)
    parser.add_argument("--c_steps", type=int, default=350)
    parser.add_argument("--skip", default="", help="runs not to start: claim/variant/seed,...")
    parser.add_argument("--stop_at", default="", help="HH:MM UTC: start no run after this")
    parser.add_argument("--spike_ratio", type=float, default=1.5)
    parser.add_argument("--spike_after", type=int, default=50)
    parser.add_argument("--dry_run", action="store_true", help="print the commands only")
    parser.add_argument("--report", action="store_true", help="only print the tables of --out")
    parser.add_argument("--mlperf_tf", default="", help="the CLI (default: next to python)")
    args = parser.parse_args(argv)
    claims = [c for c in args.claims.split(",") if c]
    table = variants(args)
    for claim in claims:
        if claim not in table:
            parser.error(f"--claims: unknown claim {claim!r} (known: a, b, c)")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        parser.error(f"--seeds ({args.seeds}) must be integers separated by commas")
    for name in ("a_steps", "b_steps", "c_steps", "spike_ratio"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} ({getattr(args, name)}) must be positive")
    stop_at = None
    if args.stop_at:
        try:
            stop_at = datetime.datetime.strptime(args.stop_at, "%H:%M").time()
        except ValueError:
            parser.error(f"--stop_at ({args.stop_at}) must be HH:MM")
    skip = {s for s in args.skip.split(",") if s}
    mlperf_tf = args.mlperf_tf or os.path.join(os.path.dirname(sys.executable), "mlperf-tf")
    if not args.report:
        for claim in claims:
            for seed in seeds:
                for variant in table[claim]:
                    if f"{claim}/{variant.label}/{seed}" in skip:
                        continue
                    if finished(run_dir(args.out, variant, seed)):
                        continue
                    now = datetime.datetime.now(datetime.UTC).time()
                    if stop_at and now >= stop_at:
                        print(
                            f"--stop_at {args.stop_at}: not starting {claim}/{variant.label}/{seed}"
                        )
                        continue
                    run_one(mlperf_tf, variant, seed, args.out, args.dry_run)
    print(report(args.out, claims, seeds, table, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
