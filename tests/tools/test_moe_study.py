"""tools/studies/moe_study.py: its parser reads the runner's own progress lines, and its tables are right.

The lines are written by the runner's `ProgressLine` action (not copied text), so a change of the
progress format fails here, not silently in the study's tables.
"""

from __future__ import annotations

import json
import logging
import math
import os

import pytest

from mlperf_tf.benchmark import EvalPoint
from mlperf_tf.runner.actions import EvalOutput, LoopOutput, ProgressLine, RunEnd, Stop
from mlperf_tf.runner.config import StopCause
from tools.studies import moe_study


def _progress_text(caplog, losses, *, dropped, logits, evals, stop: StopCause, every=5) -> str:
    """The progress output of a run with loop-mean `losses` (one loop per `every` steps)."""
    action = ProgressLine()
    last_step = every * len(losses)
    with caplog.at_level(logging.INFO):
        for i, loss in enumerate(losses):
            step = every * (i + 1)
            metrics = {
                "moe/aux_loss": 0.04,
                "moe/balance_loss": 2.0 + i / 100,
                "moe/z_loss": 4.5 - i / 10,
                "moe/dropped": dropped[i],
                "moe/max_router_logit": logits[i],
                "moe/load": [0.5, 0.5],  # a vector: not on the progress line
            }
            action.after_loop(
                LoopOutput(step=step, steps=every, loss=loss, seconds=1.0, samples_per_second=9.0,
                           last_step=last_step, epoch=step / 10, first=i == 0, metrics=metrics)
            )  # fmt: skip
            if step in evals:
                point = EvalPoint(step=step, epoch_num=step // 10, first_epoch_num=0, epoch_count=1)
                action.after_eval(EvalOutput(point=point, value=evals[step], target=0.25))
        action.at_end(RunEnd(stop=Stop(stop, "why"), step=last_step, seconds=12.5))
    return "\n".join(r.getMessage() for r in caplog.records)


def test_parse_and_summarize_the_runner_lines(caplog):
    losses = [8.0, 6.0, 5.0, 4.0, 3.0, 3.5, 4.6, 3.2, 2.9, 2.8]  # step 35 (4.6 > 1.5 x 3.0) spikes
    dropped = [0.0, 0.05, 0.22, 0.1, 0.0, 0.0, 0.01, 0.0, 0.0, 1e-5]
    logits = [0.9, 1.5, 2.5, 6.25, 3.0, 3.0, 3.0, 3.0, 3.0, 2.0]
    text = _progress_text(caplog, losses, dropped=dropped, logits=logits,
                          evals={20: 0.07, 40: 0.125}, stop=StopCause.BUDGET_ENDED)  # fmt: skip
    p = moe_study.parse_progress(text)
    assert [row["step"] for row in p.loops] == list(range(5, 55, 5))
    assert [row["loss"] for row in p.loops] == losses
    assert p.evals == [(2.0, 20, 0.07), (4.0, 40, 0.125)]
    assert (p.status, p.steps, p.seconds) == ("aborted", 50, 12.5)
    s = moe_study.summarize(p, ratio=1.5, after=20)
    assert s["bleu"] == {2: 0.07, 4: 0.125}
    assert s["to_target"] is None and s["status"] == "aborted"
    assert s["loss"] == 2.8 and s["dropped"] == 1e-5
    assert (s["peak_dropped"], s["peak_dropped_step"]) == (0.22, 15)
    assert (s["max_logit"], s["final_logit"]) == (6.25, 2.0)
    assert (s["spikes"], s["first_spike"]) == (1, 35)
    assert s["max_rise"] == pytest.approx(4.6 / 3.0)
    assert not s["diverged"]
    # The rise at step 30 (3.5 < 1.5 x 3.0) is no spike; a lower ratio finds it too.
    assert moe_study.spikes(p.loops, ratio=1.1, after=20) == [30, 35]


def test_non_finite_loss_is_diverged_and_a_spike(caplog):
    losses = [8.0, 5.0, 4.0, float("nan")]
    text = _progress_text(caplog, losses, dropped=[0] * 4, logits=[1] * 4, evals={},
                          stop=StopCause.NON_FINITE_LOSS)  # fmt: skip
    s = moe_study.summarize(moe_study.parse_progress(text), ratio=1.5, after=0)
    assert math.isnan(s["loss"])
    assert s["diverged"] and s["first_spike"] == 20


def test_success_counts_steps_to_target(caplog):
    text = _progress_text(caplog, [8.0, 4.0], dropped=[0, 0], logits=[1, 1], evals={10: 0.3},
                          stop=StopCause.TARGET_REACHED)  # fmt: skip
    s = moe_study.summarize(moe_study.parse_progress(text))
    assert (s["status"], s["to_target"], s["final_bleu"]) == ("success", 10, 0.3)


def test_report_from_an_existing_folder_gives_seed_statistics(tmp_path, caplog, capsys):
    """`--report` reprints the tables of a results folder without running anything."""
    finals = {1: 3.0, 2: 4.0, 3: 6.5}
    for seed, final in finals.items():
        caplog.clear()
        # Seed 3's loss rises from 4.0 to 6.5 after step 50: a spike.
        text = _progress_text(caplog, [8.0] * 10 + [4.0, final], dropped=[0.1] * 11 + [0.02 * seed],
                              logits=[1] * 11 + [seed], evals={60: 0.1 * seed},
                              stop=StopCause.BUDGET_ENDED)  # fmt: skip
        folder = tmp_path / "c" / "cf1.0" / f"seed{seed}"
        os.makedirs(folder)
        (folder / "progress.txt").write_text(text)
        (folder / "run.json").write_text(json.dumps({"load_before": [2.5], "load_after": [3.0]}))
    assert moe_study.main(["--claims=c", "--seeds=1,2,3", f"--out={tmp_path}", "--report"]) == 0
    out = capsys.readouterr().out
    assert "/mlperf-tf run" not in out  # nothing ran
    per_run = [line for line in out.splitlines() if " | aborted @ 60 | " in line]
    assert len(per_run) == 3 and all("| 2.5-3.0 |" in line for line in per_run)
    across = [line for line in out.splitlines() if line.startswith("| cf1.0 | 3 | -")]
    assert len(across) == 1
    # loss: mean 4.5 of 3.0, 4.0, 6.5; final dropped mean 0.04 of 0.02, 0.04, 0.06.
    assert "| 4.500 [3.000, 6.500] |" in across[0]
    assert "| 0.040 [0.020, 0.060] |" in across[0]
    assert "| 0.200 [0.100, 0.300] |" in across[0]  # BLEU at epoch 6
    assert across[0].endswith("| 1/3 | 0/3 |")  # runs spiked, runs diverged
    # A claim without runs says so; the other variants' missing seeds are left out.
    assert "cf2.0" not in out


def test_bad_flags_are_one_line_errors(tmp_path, capsys):
    for flag, says in [("--claims=d", "unknown claim"), ("--seeds=1,x", "--seeds"),
                       ("--stop_at=8h", "--stop_at"), ("--b_steps=0", "--b_steps")]:  # fmt: skip
        with pytest.raises(SystemExit):
            moe_study.main([flag, f"--out={tmp_path}", "--report"])
        assert says in capsys.readouterr().err


def test_dry_run_prints_the_study_commands(tmp_path, capsys):
    moe_study.main(["--claims=b", "--seeds=2", f"--out={tmp_path}", "--dry_run", "--lr=12"])
    lines = [line for line in capsys.readouterr().out.splitlines() if " run " in line]
    assert len(lines) == 2
    for line, z in zip(lines, ("0", "0.001")):
        assert "--seed=2" in line and "--max_train_steps=200" in line
        assert "--config.optimizer.opt_base_learning_rate=12" in line
        assert f"--config.model.moe.z_loss_coef={z}" in line
        assert "--config.model.moe.num_experts=8" in line
    assert not os.listdir(tmp_path)  # a dry run creates no folder
