"""The follower's events (bridge/client/follow.py) as a typed union: each kind dumps to the JSON object agents read
(`wait --json`, tests/bridge/test_progress.py checks the lines end to end), reads back to the same model, and
a line of no kind, or with a field missing or too many, is refused."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from bridge.client.follow import (
    Cancelled,
    Cancelling,
    Claimed,
    Expired,
    Finished,
    NoRunnerSeen,
    Queued,
    Running,
    Stale,
    parse_event,
)

AT = {"id": "20261125-170000-abcd", "at": "2026-11-25T17:00:00.000+00:00"}
LINES = {
    Queued: {"event": "queued", **AT, "label": "cpu", "position": 2, "ahead": 1, "runners": ["r1"],
             "created_at": AT["at"]},
    NoRunnerSeen: {"event": "no-runner", **AT, "label": "h200", "waited_s": 0.0, "seen": ["r1 (stale)"]},
    Claimed: {"event": "claimed", **AT, "runner": "r1", "host": "box", "claimed_at": AT["at"], "takeover_of": None},
    Running: {"event": "queued", **AT, "runner": "r1", "phase": "queued", "started_at": AT["at"],
              "progress_at": AT["at"], "elapsed_s": 1.5, "workload": {"done": 1, "total": 4, "what": "ctx"},
              "log_tail": ["x"], "scheduler": "pending (Resources)"},
    Stale: {"event": "stale", **AT, "runner": "r1", "lease_until": AT["at"]},
    Cancelling: {"event": "cancelling", **AT},
    Finished: {"event": "finished", **AT, "done": "a" * 40},
    Cancelled: {"event": "cancelled", **AT, "state": "cancelled"},
    Expired: {"event": "expired", **AT, "state": "expired", "expires_at": AT["at"]},
}  # fmt: skip


@pytest.mark.parametrize("kind", list(LINES), ids=lambda k: k.__name__)
def test_each_kind_reads_and_dumps_the_same_json(kind: type) -> None:
    line = json.dumps(LINES[kind])
    event = parse_event(line)
    assert type(event) is kind
    assert json.dumps(event.dump()) == line  # the same keys, values and order as the line agents read


def test_running_and_queued_in_the_labels_queue_are_two_shapes_of_queued() -> None:
    running = dict(LINES[Running], event="running", phase="running", scheduler=None)
    assert type(parse_event(running)) is Running
    assert type(parse_event(LINES[Queued])) is Queued


@pytest.mark.parametrize(
    "bad",
    [
        {"event": "exploded", **AT},  # no such kind
        {k: v for k, v in LINES[Finished].items() if k != "done"},  # a field missing
        dict(LINES[Cancelling], extra="x"),  # a field too many
        dict(LINES[Queued], position="first"),  # a field of the wrong type
        {"event": "finished"},  # no id, no time
    ],
)
def test_a_line_of_no_kind_is_refused(bad: dict) -> None:
    with pytest.raises(ValidationError):
        parse_event(json.dumps(bad))


def test_wait_sets_the_exit_code_of_a_request_that_will_never_run() -> None:
    """`wait` ends on a cancelled or expired request with exit_code on its last line; the follower's own
    event has none (the JSON agents read from `kakeya evidence --wait` does not change)."""
    event = parse_event(LINES[Expired])
    assert "exit_code" not in event.dump()
    last = event.model_copy(update={"exit_code": 1}).dump()
    assert last == {**LINES[Expired], "exit_code": 1} and parse_event(last) == event.model_copy(
        update={"exit_code": 1}
    )
