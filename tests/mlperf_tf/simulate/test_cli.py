"""Tests of `mlperf-tf simulate`: output, JSON keys, plot, and one-line errors with exit 2."""

import json

from mlperf_tf import cli

REQUIRED_KEYS = {
    "step_time_s",
    "compute_s",
    "allreduce_s",
    "exposed_comm_s",
    "samples_per_s",
    "epochs_to_target",
    "time_to_train_min",
}


def test_every_registered_benchmark_simulates_with_the_required_json_keys(capsys):
    for name in ("resnet50", "ssd", "transformer", "bert"):
        code = cli.main(
            ["simulate", f"--benchmark={name}", "--system=tpu-v3", "--chips=256,1024", "--json"]
        )
        lines = capsys.readouterr().out.strip().splitlines()
        assert code == 0 and len(lines) == 2, name
        for line in lines:
            record = json.loads(line)
            assert REQUIRED_KEYS <= set(record), name
            assert record["step_time_s"] >= record["compute_s"] > 0


def test_table_output_names_the_convergence_source(capsys):
    code = cli.main(["simulate", "--benchmark=bert", "--system=a100-dgx", "--chips=64"])
    out = capsys.readouterr().out
    assert code == 0 and "hierarchical" in out and "RCP mlperf_logging" in out


def test_a_batch_outside_the_rcps_says_what_was_assumed(capsys):
    """GRPO's RCPs are at 256, 512 and 1,024 rollouts: at 16 the output names the held value,
    at 4,096 the extrapolation, at 512 nothing (a plan at a batch no reference run used is a
    guess, and says so)."""
    from mlperf_tf.simulate import convergence

    curve = convergence.curve("qwen35_397b_grpo")
    assert curve.batches == (256, 512, 1024)
    notes = {}
    for batch in (16, 512, 4096):
        code = cli.main(["simulate", "--benchmark=qwen35_397b_grpo", "--system=gb300-nvl72",
                         "--chips=256", f"--global_batch={batch}", "--json"])  # fmt: skip
        assert code == 0
        notes[batch] = json.loads(capsys.readouterr().out)["convergence_source"]
    assert notes[512] == curve.source
    assert "below its smallest, 256" in notes[16] and "held" in notes[16]
    assert "above its largest, 1024" in notes[4096] and "extrapolated" in notes[4096]


def test_errors_are_one_line_exit_2(capsys):
    cases = [
        (["--benchmark=resnet50", "--system=tpu-v9", "--chips=16"], "unknown system 'tpu-v9'"),
        (["--benchmark=resnet50", "--system=tpu-v3", "--chips=1000"], "does not fit"),
        (
            ["--benchmark=resnet50", "--system=tpu-v3", "--chips=64", "--global_batch=32"],
            "smaller than the 64",
        ),
        (["--benchmark=resnet50", "--system=tpu-v3"], "--chips"),
        (["--benchmark=resnet50", "--system=tpu-v3", "--chips=x"], "not an integer"),
    ]
    for args, message in cases:
        assert cli.main(["simulate", *args]) == 2, args
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and message in err and "\n" not in err, (args, err)


def test_plot_writes_a_png(tmp_path, capsys):
    out = tmp_path / "scaling.png"
    code = cli.main(
        ["simulate", "--benchmark=resnet50", "--system=tpu-v3", "--chips=16,256,4096",
         "--global_batch=65536", f"--plot={out}"]
    )  # fmt: skip
    assert code == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(out) in capsys.readouterr().out
