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
