"""bench/decode_timeline.py's step split, on made-up events (the profile itself needs a GPU):
steps start at their upload kernel, so a step's period includes the boundary gap; without that
kernel the split falls back to idle gaps; a leading partial step is dropped."""

from bench.decode_timeline import split_steps, step_rows

UP = "_mapped_read_kernel"
EVENTS = [(0, 1, "tail of an earlier step"), (2, 3, UP), (4, 10, "graph"), (11, 12, "Memcpy DtoH"),
          (30, 31, UP), (32, 40, "graph"), (41, 42, "Memcpy DtoH")]


def test_steps_start_at_the_upload_and_the_period_includes_the_boundary():
    steps = split_steps(EVENTS, 15.0, UP)
    assert [s[0][2] for s in steps] == [UP, UP] and [len(s) for s in steps] == [3, 3]
    rows = step_rows(steps)
    assert rows[0] == {"kernels": 3, "busy_us": 8, "span_us": 10, "idle_us": 2, "period_us": 28}
    assert rows[1]["period_us"] is None  # the last step: no next start


def test_without_the_upload_kernel_steps_split_at_idle_gaps():
    steps = split_steps(EVENTS, 15.0, "")
    assert [len(s) for s in steps] == [4, 3]
    steps = split_steps([e for e in EVENTS if e[2] != UP], 15.0, UP)
    assert [len(s) for s in steps] == [3, 2]
