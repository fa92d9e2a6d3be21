"""oreline.train.comm_timing: comm_ms is the wall time during which a collective was in flight, so
overlapping spans count once; a take empties the window. (On 2 ranks the spans come from DDP's
comm hook and the loop's all-reduces: tests/train/test_distributed.py checks comm_ms > 0 there.)"""

from __future__ import annotations

from oreline.train.comm_timing import CommTimer


def test_take_returns_the_union_of_the_spans_since_the_last_take():
    timer = CommTimer()
    for start, end in [(10.0, 11.0), (10.5, 12.0), (13.0, 14.0), (13.2, 13.8)]:
        timer.add(start, end)
    assert timer.take() == 3.0  # [10, 12] and [13, 14], not the 4.1 s their sum would be
    assert timer.take() == 0.0


def test_a_span_on_one_process_records_nothing():
    timer = CommTimer()
    with timer.span():  # no process group: the loop's all-reduces are no-ops and are not timed
        pass
    assert timer.take() == 0.0
