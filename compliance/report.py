"""Provides `write_report`: a PNG and a Markdown summary of one MLPerf run, drawn with matplotlib.

The PNG has two panels: eval accuracy against minutes since run_start with the run's own target
(the one it logged, else the official one) as a line and MLPerf's where it differs, and training throughput (samples/s) of each block (or epoch). The Markdown page gives the
verdict, the time to train, when the target was reached, the evaluations and the findings.
Matplotlib is used through its object API with the Agg canvas: no pyplot, no global backend.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from typing import Any

from compliance import checker, logfile, scoring
from compliance import keys as C
from compliance.checker import Report
from compliance.suite_checks import Target
from mlperf_tf import time_breakdown
from mlperf_tf.errors import UserError

_MAX_TABLE_ROWS = 60
_MAX_FINDINGS = 30


@dataclasses.dataclass(frozen=True)
class ReportFiles:
    """What `write_report` wrote for one log."""

    log: str
    png: str
    markdown: str


@dataclasses.dataclass(frozen=True)
class RunSeries:
    """The numbers a report plots, from one log's records.

    Attributes:
      evals: (minutes since run_start, accuracy, epoch_num or None) per eval_accuracy.
      throughput: (minutes since run_start at the block's end, samples per second) per block.
      throughput_unit: what the throughput counts: "samples/s" (epochs x train_samples), or
        "epochs/s" without train_samples, or "epoch_num units/s" for BERT logs, whose epoch
        numbers count samples, steps or nothing, depending on the submitter.
      time: run_start/run_stop of the run.
    """

    evals: tuple[tuple[float, float, float | None], ...]
    throughput: tuple[tuple[float, float], ...]
    throughput_unit: str
    time: scoring.RunTime


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def run_series(records: Sequence[logfile.Record], benchmark: str | None) -> RunSeries:
    """Extracts the evaluations and the per-block throughput of a run."""
    time = scoring.run_time(records)
    times = [r.time_s for r in records if r.time_s is not None and r.time_s > 0]
    start_s = next((r.time_s for r in records if r.key == C.RUN_START and r.time_s), None)
    start_s = start_s if start_s is not None else (min(times) if times else 0.0)

    def minutes(record: logfile.Record) -> float:
        return (record.time_s - start_s) / 60.0

    evals = tuple(
        (minutes(r), _number(r.value), _number(r.metadata.get(C.EPOCH_NUM)))
        for r in records
        if r.key == C.EVAL_ACCURACY and _number(r.value) is not None and r.time_s is not None
    )
    train_samples = next((_number(r.value) for r in records if r.key == C.TRAIN_SAMPLES), None)
    if benchmark == "bert":
        per_epoch, unit = 1.0, "epoch_num units/s"
    elif train_samples:
        per_epoch, unit = train_samples, "samples/s"
    else:  # e.g. 0.6.0 logs, without train_samples
        per_epoch, unit = 1.0, "epochs/s"
    keys = (C.BLOCK_START, C.BLOCK_STOP)
    if not any(r.key == C.BLOCK_START for r in records):
        keys = (C.EPOCH_START, C.EPOCH_STOP)
    throughput = []
    open_start = None
    for record in records:
        if record.key == keys[0]:
            open_start = record
        elif record.key == keys[1] and open_start is not None:
            count = (
                _number(open_start.metadata.get(C.EPOCH_COUNT)) if keys[0] == C.BLOCK_START else 1
            )
            if (
                count
                and per_epoch
                and record.time_s is not None
                and open_start.time_s is not None
                and record.time_s > open_start.time_s
            ):
                rate = count * per_epoch / (record.time_s - open_start.time_s)
                throughput.append((minutes(record), rate))
            open_start = None
    return RunSeries(evals, tuple(throughput), unit, time)


@dataclasses.dataclass(frozen=True)
class Targets:
    """The targets a report draws.

    Attributes:
      run: the target the run aimed at: the one it logged (`# mlperf-tf target {...}`), else
        the official one.
      official: MLPerf's target from the round's rules (None where the rules have none).
      run_source: where `run` comes from ("the run's log" or "MLPerf's rules").
    """

    run: Target | None
    official: Target | None
    run_source: str

    @property
    def differ(self) -> bool:
        return (
            self.run is not None
            and self.official is not None
            and self.run.value != self.official.value
        )


def targets_of(report: Report, scan: logfile.LogScan) -> Targets:
    """The run's own target (as logged) and MLPerf's, for `report`'s log."""
    official = _target_of(report, logfile.parse_records(scan, report.ruleset))
    logged = checker.logged_target(scan)
    if logged is not None:
        return Targets(logged, official, "the run's log")
    return Targets(official, official, "MLPerf's rules")


def _target_of(report: Report, records: Sequence[logfile.Record]) -> Target | None:
    division = next((r.value for r in records if r.key == C.SUBMISSION_DIVISION), "closed")
    gbs = next((_number(r.value) for r in records if r.key == C.GLOBAL_BATCH_SIZE), None)
    return checker.quality_target(
        report.ruleset,
        report.benchmark,
        division=division if division in ("closed", "open") else "closed",
        global_batch_size=gbs,
    )


def plot_figure(
    series: RunSeries, targets: Targets, title: str, breakdown: dict[str, Any] | None = None
):
    """The report's figure: accuracy vs time with the target lines, and throughput per block.

    The run's own target is the red line; MLPerf's, where it differs, a grey one. With the run's
    time breakdown (`mlperf_tf.time_breakdown`), a third panel draws it as one stacked bar.

    Returns:
      A matplotlib Figure on an Agg canvas.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 8.5 if breakdown else 6.5), dpi=100)
    FigureCanvasAgg(figure)
    if breakdown:
        ratios = {"height_ratios": [3, 3, 1.2]}
        accuracy_axes, throughput_axes, breakdown_axes = figure.subplots(3, 1, gridspec_kw=ratios)
        draw_breakdown(breakdown_axes, [("this run", breakdown)])
    else:
        accuracy_axes, throughput_axes = figure.subplots(2, 1)
    figure.suptitle(title, fontsize=10)
    if series.evals:
        accuracy_axes.plot(
            [m for m, _, _ in series.evals], [a for _, a, _ in series.evals], "o-", label="eval"
        )
    else:
        accuracy_axes.text(0.5, 0.5, "no eval_accuracy in the log", ha="center", va="center")
    if targets.run is not None:
        label = "target" if not targets.differ else "run's target"
        accuracy_axes.axhline(
            targets.run.value,
            color="tab:red",
            linestyle="--",
            label=f"{label} {targets.run.value:g}",
        )
    if targets.differ:
        accuracy_axes.axhline(
            targets.official.value,
            color="tab:gray",
            linestyle="-.",
            label=f"MLPerf target {targets.official.value:g}",
        )
    if series.time.minutes is not None:
        accuracy_axes.axvline(
            series.time.minutes, color="tab:gray", linestyle=":", label="run_stop"
        )
    accuracy_axes.set_xlabel("minutes since run_start")
    accuracy_axes.set_ylabel("eval accuracy")
    accuracy_axes.grid(True, alpha=0.3)
    if accuracy_axes.get_legend_handles_labels()[0]:
        accuracy_axes.legend(loc="lower right", fontsize=8)
    if series.throughput:
        throughput_axes.plot(
            [m for m, _ in series.throughput], [r for _, r in series.throughput], "s-"
        )
    else:
        throughput_axes.text(0.5, 0.5, "no block/epoch timing in the log", ha="center", va="center")
    throughput_axes.set_xlabel("minutes since run_start (end of block)")
    throughput_axes.set_ylabel(series.throughput_unit)
    throughput_axes.grid(True, alpha=0.3)
    figure.tight_layout()
    return figure


def draw_breakdown(axes, runs: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """One horizontal stacked bar per (label, breakdown): seconds of each part of the run."""
    for row, (_, breakdown) in enumerate(runs):
        left = 0.0
        for index, key in enumerate(time_breakdown.PARTS):
            seconds = max(0.0, float(breakdown.get(key) or 0.0))
            label = time_breakdown.LABELS[key] if row == 0 else None
            axes.barh(row, seconds, left=left, color=f"C{index}", label=label)
            left += seconds
    axes.set_yticks(range(len(runs)), [label for label, _ in runs])
    axes.set_xlabel("seconds from run_start to run_stop")
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=6, fontsize=8)


def breakdown_table(breakdown: dict[str, Any]) -> list[str]:
    """Markdown rows of the run's time breakdown: each part's seconds and share."""
    total = float(breakdown.get(time_breakdown.TOTAL) or 0.0)
    lines = ["## Where the time went", "", "| part | seconds | share |", "|---|---:|---:|"]
    for key in time_breakdown.PARTS:
        seconds = float(breakdown.get(key) or 0.0)
        share = f"{100 * seconds / total:.1f} %" if total > 0 else "-"
        lines.append(f"| {time_breakdown.LABELS[key]} | {seconds:.1f} | {share} |")
    lines.append(f"| **time to train** | **{total:.1f}** | 100 % |")
    warm_up = breakdown.get("warm_up_s")
    if isinstance(warm_up, int | float) and warm_up > 0:
        lines += ["", f"Warm-up before run_start (init time, not counted): {warm_up:.1f} s."]
    return [*lines, ""]


def _markdown(
    report: Report,
    series: RunSeries,
    targets: Targets,
    png_name: str,
    log_name: str,
    breakdown: dict[str, Any] | None = None,
) -> str:
    verdict = "PASS" if report.passed else "FAIL"
    official = (
        "crashed" if report.official_crashed else "PASS" if report.official_passed else "FAIL"
    )
    lines = [
        f"# {log_name}",
        "",
        f"- Log: `{report.path}`",
        f"- Benchmark: {report.benchmark or 'unknown'}; ruleset {report.ruleset} "
        f"({report.ruleset_reason})",
        f"- Verdict: **{verdict}** (official checker: {official}; quality {report.quality}; "
        f"{len(report.errors)} error(s), {len(report.warnings)} warning(s))",
    ]
    if series.time.minutes is not None:
        lines.append(
            f"- Time to train: {series.time.minutes:.3f} min (run_start to run_stop, status "
            f"{series.time.status or 'none'})"
        )
    else:
        lines.append("- Time to train: unknown (no run_start or no run_stop: crashed run?)")
    shown = [(targets.run, f"Target ({targets.run_source})")]
    if targets.differ:
        shown.append((targets.official, "MLPerf's target (not this run's)"))
    for target, name in shown:
        if target is None:
            lines.append("- Target: none in the official rules for this benchmark and ruleset")
            continue
        reached = [(m, a, e) for m, a, e in series.evals if target.reached(a)]
        if reached:
            m, a, e = reached[0]
            at = f"epoch {e:g}, " if e is not None else ""
            lines.append(f"- {name} {target.value:g}: reached at {at}{m:.3f} min ({a:.4f})")
        else:
            best = max((a for _, a, _ in series.evals), default=None)
            lines.append(
                f"- {name} {target.value:g}: not reached (best "
                f"{'none' if best is None else f'{best:.4f}'})"
            )
    if series.throughput:
        rates = [r for _, r in series.throughput]
        lines.append(
            f"- Throughput: mean {sum(rates) / len(rates):,.1f} {series.throughput_unit} over "
            f"{len(rates)} block(s)"
        )
    lines += ["", f"![eval accuracy and throughput]({png_name})", ""]
    if breakdown:
        lines += breakdown_table(breakdown)
    if series.evals:
        lines += ["## Evaluations", "", "| epoch | minutes | accuracy |", "|---:|---:|---:|"]
        for m, a, e in series.evals[:_MAX_TABLE_ROWS]:
            lines.append(f"| {'' if e is None else f'{e:g}'} | {m:.3f} | {a:.4f} |")
        if len(series.evals) > _MAX_TABLE_ROWS:
            lines.append(f"| ... | {len(series.evals) - _MAX_TABLE_ROWS} more | |")
        lines.append("")
    findings = report.errors + report.warnings + report.notes
    if findings:
        lines += ["## Findings", ""]
        for finding in findings[:_MAX_FINDINGS]:
            where = f"line {finding.line}: " if finding.line else ""
            text = finding.message.split("\n")[0]
            lines.append(f"- {finding.level} [{finding.source}:{finding.check}] {where}{text}")
        if len(findings) > _MAX_FINDINGS:
            lines.append(f"- ... {len(findings) - _MAX_FINDINGS} more")
        lines.append("")
    return "\n".join(lines)


def _unique_stem(stem: str, taken: set[str]) -> str:
    candidate, n = stem, 1
    while candidate in taken:
        n += 1
        candidate = f"{stem}_{n}"
    taken.add(candidate)
    return candidate


def _write(path: str, report: Report, out_dir: str, stem: str) -> ReportFiles:
    scan = logfile.scan_log(path)
    records = logfile.parse_records(scan, report.ruleset)
    series = run_series(records, report.benchmark)
    targets = targets_of(report, scan)
    try:
        os.makedirs(out_dir, exist_ok=True)
        png = os.path.join(out_dir, f"{stem}.png")
        markdown = os.path.join(out_dir, f"{stem}.md")
        title = f"{report.benchmark or '?'} ({report.ruleset}): {os.path.basename(path)}"
        breakdown = time_breakdown.from_log(path)
        plot_figure(series, targets, title, breakdown).savefig(png)
        with open(markdown, "w", encoding="utf-8") as handle:
            handle.write(_markdown(report, series, targets, os.path.basename(png), stem, breakdown))
    except OSError as error:
        raise UserError(f"{out_dir}: cannot write the report: {error.strerror or error}") from None
    return ReportFiles(log=path, png=png, markdown=markdown)


def write_report(
    path: str, out_dir: str, *, stem: str | None = None, **check_kwargs: Any
) -> ReportFiles:
    """Checks one log and writes `<stem>.png` and `<stem>.md` into `out_dir`.

    Args:
      path: the log file.
      out_dir: the output folder (created).
      stem: the output file name without extension; default the log's.
      **check_kwargs: passed to `compliance.checker.check_log` (ruleset, quality, ...).

    Returns:
      The files written.

    Raises:
      UserError: the log cannot be checked, or `out_dir` cannot be written.
    """
    report = checker.check_log(path, **check_kwargs)
    return _write(path, report, out_dir, stem or os.path.splitext(os.path.basename(path))[0])


def write_reports(
    paths: Sequence[str], out_dir: str, *, jobs: int = 2, **check_kwargs: Any
) -> list[ReportFiles | UserError]:
    """Writes a report per log (see `write_report`); file names are made unique.

    The logs are checked `jobs` at a time; the plots are drawn one after the other (matplotlib is
    not thread-safe).

    Returns:
      Per log, in order: its ReportFiles, or the UserError that stopped it.
    """
    taken: set[str] = set()
    stems = [_unique_stem(os.path.splitext(os.path.basename(p))[0], taken) for p in paths]
    results: list[ReportFiles | UserError] = []
    for path, stem, report in zip(
        paths, stems, checker.check_logs(paths, jobs=jobs, **check_kwargs)
    ):
        if isinstance(report, UserError):
            results.append(report)
            continue
        try:
            results.append(_write(path, report, out_dir, stem))
        except UserError as error:
            results.append(error)
    return results


def write_breakdowns(paths: Sequence[str], out_dir: str) -> str | None:
    """Writes `time_breakdown.png` (a stacked bar per run) and `time_breakdown.md` (a table).

    Returns:
      The Markdown file's path, or None when no log has a time breakdown.

    Raises:
      UserError: `out_dir` cannot be written.
    """
    taken: set[str] = set()
    runs = []
    for path in paths:
        breakdown = time_breakdown.from_log(path)
        if breakdown:
            # The runner names every log mlperf_log.txt: its folder tells runs apart.
            name = os.path.join(os.path.basename(os.path.dirname(os.path.abspath(path))),
                                os.path.basename(path))  # fmt: skip
            runs.append((_unique_stem(name, taken), breakdown))
    if not runs:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 1.5 + 0.45 * len(runs)), dpi=100)
    FigureCanvasAgg(figure)
    draw_breakdown(figure.subplots(), runs)
    figure.tight_layout()
    header = "| run | " + " | ".join(time_breakdown.LABELS[k] for k in time_breakdown.PARTS)
    lines = ["# Where the time went (seconds)", "", "![time breakdown](time_breakdown.png)", ""]
    lines += [header + " | time to train | train share |", "|---" * 9 + "|"]
    for name, b in runs:
        total = float(b[time_breakdown.TOTAL])
        cells = " | ".join(f"{float(b[k]):.1f}" for k in time_breakdown.PARTS)
        share = f"{100 * float(b['train']) / total:.1f} %" if total > 0 else "-"
        lines.append(f"| {name} | {cells} | {total:.1f} | {share} |")
    markdown = os.path.join(out_dir, "time_breakdown.md")
    try:
        os.makedirs(out_dir, exist_ok=True)
        figure.savefig(os.path.join(out_dir, "time_breakdown.png"))
        with open(markdown, "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
    except OSError as error:
        raise UserError(f"{out_dir}: cannot write the report: {error.strerror or error}") from None
    return markdown
