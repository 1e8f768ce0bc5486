"""Tests of compliance.suite_checks on hand-made records."""

import pytest

from compliance.logfile import Record
from compliance.suite_checks import Target, suite_checks

TARGET = Target(0.759, True, "v['value'] >= 0.759")


def rec(key, value=None, t=0.0, line=1, **metadata):
    return Record(key, value, metadata, t, line)


def _evals(epochs, *, start_line=10, key_meta="epoch_num"):
    out = []
    for i, epoch in enumerate(epochs):
        out.append(rec("eval_accuracy", 0.5, t=100.0 + i, line=start_line + i, **{key_meta: epoch}))
    return out


def _checks(records, **kwargs):
    kwargs.setdefault("target", None)
    return [(f.check, f.level) for f in suite_checks(records, **kwargs)]


@pytest.mark.parametrize(
    "bench, ruleset, epochs, late",
    [
        ("resnet", "1.0.0", [4, 8, 12], False),
        ("resnet", "1.0.0", [3, 7, 11, 15], False),  # offset 3, epochs counted from 1
        ("resnet", "1.0.0", [0, 4, 8], False),
        ("resnet", "1.0.0", [4, 8, 16], True),
        ("resnet", "1.0.0", [9, 13], True),  # first eval later than epoch 4 (+1)
        ("ssd", "0.7.0", [40, 50, 55, 60], False),
        ("ssd", "0.7.0", [41, 51, 56], False),  # numbering from 1
        ("ssd", "0.7.0", [40, 50, 60], True),  # 10 epochs apart after epoch 50
        ("ssd", "1.0.0", [5, 10, 15], False),
        ("ssd", "1.0.0", [5, 15], True),
        ("transformer", "0.7.0", [1, 2, 3], False),
        ("transformer", "0.7.0", [1, 3], True),
    ],
)
def test_eval_cadence(bench, ruleset, epochs, late):
    checks = _checks(_evals(epochs), benchmark=bench, ruleset=ruleset)
    assert (("eval_cadence", "warning") in checks) is late


def test_bert_cadence_in_samples():
    # v1.0 at global batch 6912: every floor(0.05 * (230.23 * 6912 + 3e6) / 25000) * 25000 =
    # 225,000 samples (Google's published run evaluated every 228,096); a gap is late beyond one
    # 25,000-sample rounding unit and one global batch more (256,912).
    gbs = [rec("global_batch_size", 6912, line=2)]
    ok = gbs + _evals([228_096, 456_192, 684_288])
    late = gbs + _evals([250_000, 500_000, 757_000])
    assert _checks(ok, benchmark="bert", ruleset="1.0.0") == []
    assert _checks(late, benchmark="bert", ruleset="1.0.0") == [("eval_cadence", "warning")]
    placeholder = gbs + _evals([1, 1, 1])
    assert _checks(placeholder, benchmark="bert", ruleset="1.0.0") == [("eval_cadence", "info")]


def test_out_of_order_evals_are_sorted_for_the_cadence_but_flagged():
    records = _evals([10, 5, 15, 20])
    assert _checks(records, benchmark="ssd", ruleset="1.0.0") == [("monotonic", "warning")]


def test_timestamps_that_go_back_are_flagged_zero_placeholders_are_not():
    records = [
        rec("submission_org", "x", t=0.0, line=1),  # a 0 placeholder: ignored
        rec("init_start", t=10.0, line=2),
        rec("init_stop", t=12.0, line=3),
        rec("run_start", t=11.0, line=4),
        rec("run_stop", t=13.0, line=5, status="aborted"),
    ]
    findings = suite_checks(records, benchmark=None, ruleset="1.0.0", target=None)
    assert [(f.check, f.lines) for f in findings] == [("monotonic", (4,))]


def test_pairing_of_blocks_epochs_and_evals():
    records = [
        rec("run_start", line=1),
        rec("block_start", line=2, first_epoch_num=1, epoch_count=2),
        rec("epoch_start", line=3, epoch_num=1),
        rec("epoch_start", line=4, epoch_num=2),  # epoch 1 never stopped
        rec("epoch_stop", line=5, epoch_num=2),
        rec("block_stop", line=6, first_epoch_num=3),  # closes the block of epoch 1
        rec("eval_stop", line=7, epoch_num=2),  # no eval_start
        rec("run_stop", line=8, status="aborted"),
    ]
    findings = [f for f in suite_checks(records, benchmark=None, ruleset="1.0.0", target=None)]
    assert [(f.check, f.line) for f in findings] == [
        ("pairing", 6),
        ("pairing", 4),
        ("pairing", 7),
    ]


def test_run_stop_status_against_the_target():
    evals = [rec("eval_accuracy", 0.80, line=5, epoch_num=4)]
    success = [rec("run_start", line=1), *evals, rec("run_stop", line=9, status="success")]
    aborted = [rec("run_start", line=1), *evals, rec("run_stop", line=9, status="aborted")]
    low = [rec("run_start", line=1), rec("eval_accuracy", 0.5, line=5, epoch_num=4)]
    low_success = [*low, rec("run_stop", line=9, status="success")]
    kwargs = {"benchmark": None, "ruleset": "1.0.0", "target": TARGET}
    assert _checks(success, **kwargs) == []
    assert _checks(aborted, **kwargs) == [("run_stop_status", "warning")]
    assert _checks(aborted, quality="skip", **kwargs) == []
    # A success that did not reach the target fails in every mode.
    for quality in ("enforce", "skip"):
        for strict in (False, True):
            checks = _checks(low_success, quality=quality, strict=strict, **kwargs)
            assert checks == [("run_stop_status", "error")]
    assert _checks(low, **kwargs) == [("crashed_run", "warning")]
    assert _checks(low, strict=True, **kwargs) == [("crashed_run", "error")]


def test_many_problems_give_few_findings():
    records = [rec("block_stop", line=n, first_epoch_num=n) for n in range(1, 10_000)]
    findings = suite_checks(records, benchmark=None, ruleset="1.0.0", target=None)
    assert len(findings) == 1
    assert findings[0].message.startswith("9999 unpaired block")
    assert len(findings[0].lines) == 20


def test_strict_errors_are_the_problems_not_what_published_logs_do():
    legit = [
        rec("run_start", t=100.0, line=1),
        rec("block_start", t=101.0, line=2, first_epoch_num=1, epoch_count=1),
        rec("block_start", t=101.0, line=3, first_epoch_num=1, epoch_count=1),  # per-epoch start
        rec("epoch_start", t=101.0, line=4, epoch_num=0),
        rec("epoch_stop", t=150.0, line=5, epoch_num=2_548_994),  # BERT counts samples
        rec("block_stop", t=150.0, line=6, first_epoch_num=1),
        rec("eval_start", t=151.0, line=7, epoch_num=10),
        rec("eval_start", t=151.5, line=8, epoch_num=5),  # asynchronous evals
        rec("eval_stop", t=152.0, line=9, epoch_num=5),
        rec("eval_stop", t=150.9, line=10, epoch_num=10),  # another rank's clock, 1.1 s behind
        rec("block_start", t=153.0, line=11, first_epoch_num=2, epoch_count=1),  # stopped at target
        rec("run_stop", t=160.0, line=12, status="aborted"),
    ]
    findings = suite_checks(legit, benchmark=None, ruleset="1.0.0", target=None, strict=True)
    assert {f.check for f in findings} == {"monotonic", "pairing"}
    assert all(f.level == "warning" for f in findings)

    wrong = [
        rec("run_start", t=100.0, line=1),
        rec("block_start", t=90.0, line=2, first_epoch_num=1, epoch_count=1),  # before run_start
        rec("block_stop", t=101.0, line=3, first_epoch_num=1),
        rec("eval_start", t=101.5, line=8, epoch_num=1),
        rec("eval_stop", t=101.6, line=9, epoch_num=1),
        rec("eval_stop", t=102.0, line=4, epoch_num=1),  # a second stop: nothing is open
        rec("epoch_start", t=103.0, line=5, epoch_num=4),
        rec("epoch_stop", t=104.0, line=6, epoch_num=2),  # closes a later epoch
        rec("run_stop", t=99.0, line=7, status="aborted"),  # before run_start
    ]
    findings = suite_checks(wrong, benchmark=None, ruleset="1.0.0", target=None, strict=True)
    errors = [(f.check, f.line) for f in findings if f.level == "error"]
    assert errors == [("timing", 7), ("timing", 2), ("pairing", 6), ("pairing", 4)]
    relaxed = suite_checks(wrong, benchmark=None, ruleset="1.0.0", target=None)
    assert not [f for f in relaxed if f.level == "error"]


def _gnn_log(stop_epoch, *, start_epoch=1):
    """The epoch markers of a published GNN log (v4.0 `gnn` to v5.1 `rgat`), synthesized.

    E.g. mlcommons/training_results_v5.0 Dell/results/1xXE9680Lx8B200-SXM-180GB/rgat/result_0.txt:
    one `epoch_start` with epoch_num 1, evals every 0.05 epoch, and at the target an
    `epoch_stop` with epoch_num 0.85 (the fraction of an epoch done), then `run_stop`.
    """
    records = [
        rec("run_start", t=100.0, line=1),
        rec("epoch_start", t=101.0, line=2, epoch_num=start_epoch),
    ]
    for i, epoch in enumerate((0.05, 0.1, 0.85)):
        line = 3 + 3 * i
        records += [
            rec("eval_start", epoch, t=102.0 + i, line=line, epoch_num=epoch),
            rec("eval_accuracy", (0.6, 0.68, 0.73)[i], t=102.1 + i, line=line + 1, epoch_num=epoch),
            rec("eval_stop", epoch, t=102.2 + i, line=line + 2, epoch_num=epoch),
        ]
    return records + [
        rec("epoch_stop", t=110.0, line=12, epoch_num=stop_epoch),
        rec("run_stop", t=110.0, line=13, status="success", epoch_num=stop_epoch),
    ]


def test_gnn_fractional_epoch_stop_inside_its_epoch_is_paired():
    # The published pattern: no finding at all, strict or not (it was a strict error before).
    target = Target(0.72, True, "v['value'] >= 0.72")
    for start in (1, 0):  # counted from 1 (ceil) or from 0 (floor)
        for strict in (False, True):
            log = _gnn_log(0.85, start_epoch=start)
            findings = suite_checks(log, benchmark=None, ruleset="5.0.0", target=target,
                                    strict=strict)  # fmt: skip
            assert findings == []
    # A fractional stop of an earlier epoch than its start's still goes back: a strict error.
    log = _gnn_log(1.5, start_epoch=3)
    findings = suite_checks(log, benchmark=None, ruleset="5.0.0", target=target, strict=True)
    assert [(f.check, f.level, f.line) for f in findings] == [("pairing", "error", 12)]


def test_stops_whose_starts_are_never_logged_are_warnings():
    # NVIDIA's NeMo llama31_405b (v5.0) logs eval_stop after each eval and never eval_start;
    # Google's MaxText gpt3 (v4.0) logs no block_start for the first block (run_start opens it).
    # The official checker passes both; so must --strict.
    log = [
        rec("run_start", t=100.0, line=1),
        rec("block_stop", t=101.0, line=2, first_epoch_num=0),
        rec("eval_accuracy", 3.0, t=101.0, line=3, epoch_num=10),
        rec("eval_stop", t=101.0, line=4, epoch_num=10),
        rec("block_start", t=101.0, line=5, first_epoch_num=10, epoch_count=10),
        rec("block_stop", t=102.0, line=6, first_epoch_num=10),
        rec("eval_accuracy", 2.0, t=102.0, line=7, epoch_num=20),
        rec("eval_stop", t=102.0, line=8, epoch_num=20),
        rec("run_stop", t=102.0, line=9, status="aborted"),
    ]
    findings = suite_checks(log, benchmark=None, ruleset="5.0.0", target=None, strict=True)
    assert [(f.check, f.level, f.lines) for f in findings] == [
        ("pairing", "warning", (2,)),
        ("pairing", "warning", (4, 8)),
    ]
    # A second block_stop once block starts are logged is more stops than starts: an error.
    extra = log[:6] + [rec("block_stop", t=102.0, line=7, first_epoch_num=10)] + log[6:]
    findings = suite_checks(extra, benchmark=None, ruleset="5.0.0", target=None, strict=True)
    assert [(f.line, f.level) for f in findings if f.level == "error"] == [(7, "error")]


@pytest.mark.parametrize(
    "target, best", [(Target(0.9, True, "v >= 0.9"), 0.8), (Target(0.5, False, "v <= 0.5"), 0.6)]
)
def test_an_unreached_success_names_the_best_eval_in_the_targets_direction(target, best):
    # A loss target (lower is better, e.g. llama2_70b_lora's 0.925) names its lowest eval.
    values = (0.7, 0.8) if target.higher_is_better else (0.7, 0.6)
    evals = [rec("eval_accuracy", v, line=5 + i, epoch_num=i + 1) for i, v in enumerate(values)]
    records = [rec("run_start", line=1), *evals, rec("run_stop", line=9, status="success")]
    kwargs = {"benchmark": None, "ruleset": "1.0.0", "target": target}
    (finding,) = suite_checks(records, **kwargs)
    assert f"(best {best:g})" in finding.message, finding.message
