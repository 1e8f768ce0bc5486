"""Tests of `mlperf_tf.parallel.pipeline`: the schedules' tick tables obey the stages'
dependencies, their bubble is (P - 1) / (M + P - 1), and 1F1B holds fewer micro-batches."""

import pytest

from mlperf_tf.errors import UserError
from mlperf_tf.parallel import pipeline


def _tick_of(schedule):
    ticks = {}
    for t, row in enumerate(schedule.ticks):
        for s, action in enumerate(row):
            if action is not None:
                assert (s, action.kind, action.micro) not in ticks
                ticks[(s, action.kind, action.micro)] = t
    return ticks


@pytest.mark.parametrize("kind", pipeline.SCHEDULES)
@pytest.mark.parametrize(("stages", "micro"), [(1, 3), (2, 1), (2, 4), (3, 2), (4, 8), (4, 3)])
def test_every_action_once_after_its_inputs(kind, stages, micro):
    schedule = pipeline.Schedule.build(kind, stages=stages, micro_batches=micro)
    ticks = _tick_of(schedule)
    assert len(ticks) == 2 * stages * micro
    for s in range(stages):
        for m in range(micro):
            if s > 0:  # the forward waits for the stage before
                assert ticks[(s, "F", m)] > ticks[(s - 1, "F", m)]
            if s < stages - 1:  # the backward waits for the stage after
                assert ticks[(s, "B", m)] > ticks[(s + 1, "B", m)]
            assert ticks[(s, "B", m)] > ticks[(s, "F", m)]
    # No interleaving: 2 (M + P - 1) ticks, the bubble the formula predicts.
    assert len(schedule.ticks) == 2 * (micro + stages - 1)
    expected = (stages - 1) / (micro + stages - 1)
    assert schedule.bubble == pytest.approx(expected)
    assert schedule.predicted_bubble == pytest.approx(expected)


def test_in_flight_gpipe_holds_all_1f1b_at_most_p_minus_s():
    gpipe = pipeline.Schedule.build("gpipe", stages=4, micro_batches=8)
    one_f_one_b = pipeline.Schedule.build("1f1b", stages=4, micro_batches=8)
    assert [gpipe.in_flight(s) for s in range(4)] == [8, 8, 8, 8]
    assert [one_f_one_b.in_flight(s) for s in range(4)] == [4, 3, 2, 1]
    # Fewer micro-batches than stages: 1F1B cannot hold more than there are.
    few = pipeline.Schedule.build("1f1b", stages=4, micro_batches=2)
    assert max(few.in_flight(s) for s in range(4)) == 2


def test_stage_bounds_and_errors():
    assert pipeline.stage_bounds(32, 4) == [(0, 8), (8, 16), (16, 24), (24, 32)]
    with pytest.raises(UserError, match=r"--pipeline_parallel=3 must divide model.num_hidden_"):
        pipeline.stage_bounds(32, 3)
    with pytest.raises(UserError, match="pipeline_schedule"):
        pipeline.Schedule.build("interleaved", stages=2, micro_batches=2)


def test_a_declared_map_splits_unevenly_and_other_p_split_equally():
    """DeepSeek-V3's recipe map at P = 4 (16+16+16+13 of 61 layers); an undeclared P takes
    equal runs when it divides the layers."""
    maps = ("16+16+16+13", "3+2")
    assert pipeline.stage_bounds(61, 4, maps) == [(0, 16), (16, 32), (32, 48), (48, 61)]
    assert pipeline.stage_bounds(5, 2, maps) == [(0, 3), (3, 5)]
    assert pipeline.stage_bounds(4, 4, ("3+1",)) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    # Every layer in exactly one stage, in order.
    bounds = pipeline.stage_bounds(61, 16, ("+".join(["4"] * 15 + ["1"]),))
    assert [i for first, end in bounds for i in range(first, end)] == list(range(61))
    assert bounds[-1] == (60, 61)


def test_an_undeclared_p_not_dividing_or_a_map_of_other_layers_is_one_line():
    with pytest.raises(UserError) as error:
        pipeline.stage_bounds(61, 2, ("16+16+16+13", "8+8+8+8+8+8+8+5"))
    message = str(error.value)
    assert message.startswith("--pipeline_parallel=2 must divide model.num_hidden_layers (61)")
    assert "declared: 16+16+16+13, 8+8+8+8+8+8+8+5" in message and "\n" not in message
    with pytest.raises(UserError, match=r"map 2\+1 sums to 3, not model.num_hidden_layers \(4\)"):
        pipeline.stage_bounds(4, 2, ("2+1",))
    for bad in (("2+0",), ("2+x",), ("2+1", "1+2"), ("",)):
        with pytest.raises(UserError, match="model.pipeline_layers"):
            pipeline.stage_bounds(3, 2, bad)


@pytest.mark.parametrize("kind", pipeline.SCHEDULES)
def test_in_flight_without_the_table_is_the_tables(kind):
    for stages in range(1, 6):
        for micro_batches in range(1, 8):
            table = pipeline.Schedule.build(kind, stages=stages, micro_batches=micro_batches)
            for s in range(stages):
                got = pipeline.in_flight(kind, stages=stages, micro_batches=micro_batches, stage=s)
                assert got == table.in_flight(s), (kind, stages, micro_batches, s)
    with pytest.raises(UserError, match="pipeline_schedule"):
        pipeline.in_flight("interleaved", stages=2, micro_batches=2, stage=0)
