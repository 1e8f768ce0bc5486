"""Time to train of the mini presets, old checkout vs new, in interleaved pairs.

MLPerf scores time to train (`run_start` to `run_stop`), so this runs whole `mlperf-tf run`s. The
machine is shared: each pair runs the old and the new checkout back to back on the same preset, in
alternating order (old first in even pairs, new first in odd ones), so a load change hits both
alike; every run reports the 1-minute load average before it. Two modes:

- `--mode=fixed` (default): a fixed amount of work, `--max_train_steps` = the steps to the preset's
  first eval that usually succeeds (`FIRST_GOOD_EVAL`), with the target out of reach so that no
  run ends early (status aborted: the budget ended). A mini run reaches its target at different
  evals from run to run (ResNet-50: epoch 4 or 8), so only equal work compares code speed.
- `--mode=target`: to the target (or the budget), as a user runs it; report these separately.

Each checkout is a folder with its own `.venv` (`python -m venv --system-site-packages .venv` and
`.venv/bin/pip install --no-deps -e .`, plus `-e examples/efficientnet` for that preset), e.g. the
base commit via `git worktree add --detach /tmp/base <commit>`. Per run it prints and writes (JSON
lines, `--out/results.jsonl`) the time to train from the MLPerf log, the run's status and evals,
and the new checkout's `time_breakdown.json` when there is one (steady train share).

  python tools/costs/bench_time_to_train.py --old=/tmp/base --new=. --pairs=3 --out=/tmp/ttt-bench
  python tools/costs/bench_time_to_train.py --old=/tmp/base --new=. --presets=resnet50 --pairs=1
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tools import harness as tool_args  # noqa: E402

# The eval (epoch_num: epochs, or samples for BERT) at which each mini preset usually first reaches
# its target (README tables of the presets); the fixed work runs to that eval's step.
FIRST_GOOD_EVAL = {
    "resnet50": 4,  # top-1 0.914-0.978 at epoch 4
    "ssd": 10,  # mAP 0.40-0.42 at epoch 10
    "transformer": 4,  # BLEU 27 at epoch 4
    "bert": 64000,  # masked-LM accuracy 0.172-0.177 at 64k samples
    "efficientnet": 8,  # top-1 0.85-0.94 at epoch 8
}
EXTRA_FLAGS = {"efficientnet": ["--submission_division=open"]}
# The target of a fixed-work run (every mini preset here is higher-is-better).
UNREACHABLE = 1e9


def fixed_steps(name: str) -> int:
    """The step of `name`'s mini eval at `FIRST_GOOD_EVAL[name]` (prepares the mini data)."""
    from mlperf_tf import registry  # noqa: PLC0415 (only this process needs TF)
    from mlperf_tf.runner import schedule  # noqa: PLC0415

    cls = registry.get(name)
    config = cls.preset("mini")
    if config.data_dir == cls.preset("mini").data_dir and not os.path.isdir(config.data_dir):
        cls.prepare_mini(config.data_dir)
    points = schedule(cls(config))
    return next(p.step for p in points if p.epoch_num >= FIRST_GOOD_EVAL[name])


def _records(log_path: str) -> list[dict]:
    with open(log_path, encoding="utf-8") as handle:
        return [json.loads(x.split(":::MLLOG", 1)[1]) for x in handle if ":::MLLOG" in x]


def _first_step_seconds(output_path: str) -> float | None:
    """The progress line's "first step done in X s" (old runs: tracing included), or None."""
    with open(output_path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            match = re.search(r"first step done in ([0-9.]+) s", line)
            if match:
                return float(match.group(1))
    return None


def one_run(checkout: str, name: str, model_dir: str, steps: int) -> dict:
    """Runs one mini preset from `checkout`; its time to train, status, evals and breakdown."""
    command = [
        os.path.join(checkout, ".venv", "bin", "mlperf-tf"), "run", f"--benchmark={name}",
        "--preset=mini", f"--model_dir={model_dir}", *EXTRA_FLAGS.get(name, []),
    ]  # fmt: skip
    if steps:
        # Fixed work: every run trains exactly `steps`; a target reached at an earlier eval
        # (SSD's mini now and then at epoch 5) must not end it early, so it is out of reach.
        command += [f"--max_train_steps={steps}", f"--config.quality_target={UNREACHABLE}"]
    load = os.getloadavg()
    begin = time.monotonic()
    with open(os.path.join(os.path.dirname(model_dir), f"{os.path.basename(model_dir)}.out"),
              "w", encoding="utf-8") as out:  # fmt: skip
        code = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT, cwd=checkout)
    result = {"preset": name, "checkout": checkout, "exit": code, "load_before": load,
              "first_step_s": _first_step_seconds(out.name),
              "wall_s": round(time.monotonic() - begin, 1), "load_after": os.getloadavg()}  # fmt: skip
    log = os.path.join(model_dir, "mlperf_log.txt")
    if not os.path.exists(log):
        return result
    records = _records(log)
    times = {r["key"]: r for r in records if r["key"] in ("run_start", "run_stop")}
    if "run_start" in times and "run_stop" in times:
        result["ttt_s"] = (times["run_stop"]["time_ms"] - times["run_start"]["time_ms"]) / 1000
        result["status"] = times["run_stop"]["metadata"].get("status")
    result["evals"] = [
        (r["metadata"].get("epoch_num"), r["value"]) for r in records if r["key"] == "eval_accuracy"
    ]
    side = os.path.join(model_dir, "time_breakdown.json")
    if os.path.exists(side):
        with open(side, encoding="utf-8") as handle:
            result["breakdown"] = json.load(handle)
    return result


def _line(r: dict, side: str) -> str:
    ttt = f"{r['ttt_s']:7.1f} s" if "ttt_s" in r else "   ---   "
    text = f"  {side:3s} {ttt} {r.get('status', '?'):8s} load {r['load_before'][0]:5.2f}"
    if r.get("first_step_s") is not None:
        text += f" first step {r['first_step_s']:.1f} s"
    b = r.get("breakdown")
    if b:
        share = 100 * b["train"] / b["time_to_train_s"] if b["time_to_train_s"] else 0
        text += f" | train {share:4.1f} %, compile {b['compile']:.1f}, eval {b['eval']:.1f}, "
        text += f"ckpt {b['checkpoint']:.1f}, input {b['input_wait']:.1f}, other {b['other']:.1f}"
    evals = r.get("evals") or []
    return text + f" | evals {[(e, round(v, 3)) for e, v in evals]}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", required=True, help="checkout with .venv: the base commit")
    parser.add_argument("--new", required=True, help="checkout with .venv: the change")
    parser.add_argument("--presets", default=",".join(FIRST_GOOD_EVAL))
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--mode", choices=("fixed", "target"), default="fixed")
    parser.add_argument("--out", default="/tmp/bench_time_to_train")
    args = parser.parse_args(argv)
    if args.pairs <= 0:
        parser.error(f"--pairs ({args.pairs}) must be positive")
    names = tool_args.comma_list(parser, args.presets, "--presets")
    tool_args.output_dir(parser, args.out, "--out")
    unknown = sorted(set(names) - set(FIRST_GOOD_EVAL))
    if unknown:
        parser.error(f"--presets: unknown {unknown} (known: {', '.join(FIRST_GOOD_EVAL)})")
    sides = {"old": os.path.abspath(args.old), "new": os.path.abspath(args.new)}
    for side, checkout in sides.items():
        if not os.path.isfile(os.path.join(checkout, ".venv", "bin", "mlperf-tf")):
            parser.error(f"--{side} ({checkout}) has no .venv/bin/mlperf-tf (see the docstring)")
    os.makedirs(args.out, exist_ok=True)
    results_path = os.path.join(args.out, "results.jsonl")
    summary = {}
    for name in names:
        steps = fixed_steps(name) if args.mode == "fixed" else 0
        print(f"{name} ({args.mode}, max_train_steps={steps or '-'}):", flush=True)
        for pair in range(args.pairs):
            order = ("old", "new") if pair % 2 == 0 else ("new", "old")
            for side in order:
                model_dir = os.path.join(args.out, f"{name}-{args.mode}-{side}-{pair}")
                if os.path.exists(model_dir):
                    model_dir += f"-{int(time.time())}"
                result = one_run(sides[side], name, model_dir, steps)
                result.update(side=side, pair=pair, mode=args.mode, steps=steps)
                with open(results_path, "a", encoding="utf-8") as handle:
                    handle.write(json.dumps(result) + "\n")
                summary.setdefault((name, side), []).append(result.get("ttt_s"))
                print(_line(result, side), flush=True)
    print(f"\nmedian time to train ({args.mode}), new/old; `uptime`: {os.getloadavg()}")
    for name in names:
        old = [t for t in summary.get((name, "old"), []) if t]
        new = [t for t in summary.get((name, "new"), []) if t]
        if old and new:
            old_m, new_m = statistics.median(old), statistics.median(new)
            print(
                f"  {name:12s} old {old_m:7.1f} s  new {new_m:7.1f} s  new/old {new_m / old_m:.3f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
