"""The `same` gate check: every matched object's named members are present and equal (the throughput
gate's parity digests)."""

from __future__ import annotations

import pytest

from gates.checks import Check, parse_checks, run_check


def _check(value: object = ("greedy", "speculative")) -> Check:
    return parse_checks([{"check": "same", "path": "/prompts/*/digests/*", "value": list(value)}])[0]  # type: ignore[call-overload]


def _report(*pairs: tuple[str, str]) -> dict[str, object]:
    return {"prompts": [{"digests": [{"greedy": g, "speculative": s, "batch": 1} for g, s in pairs]}]}


def test_equal_pairs_pass_and_one_unequal_pair_fails_naming_it() -> None:
    assert run_check(_report(("a", "a"), ("b", "b")), _check()).status == "pass"
    bad = run_check(_report(("a", "a"), ("b", "c")), _check())
    assert bad.status == "fail" and bad.at == "/prompts/0/digests/1" and bad.count == 2


@pytest.mark.parametrize(
    "report",
    [
        {"prompts": [{"digests": [{"greedy": "a"}]}]},  # a member missing
        {"prompts": [{"digests": ["a"]}]},  # not an object
        {"prompts": [{"digests": []}]},  # nothing to compare: no evidence
        {"prompts": []},
        {"prompts": [{"digests": [{"greedy": None, "speculative": 0}]}]},  # null is not 0
        {"prompts": [{"digests": [{"greedy": 1, "speculative": True}]}]},  # true is not 1
    ],
)
def test_hostile_or_missing_values_fail(report: dict[str, object]) -> None:
    assert run_check(report, _check()).status == "fail"


@pytest.mark.parametrize("value", [["greedy"], [], ["greedy", ""], "greedy", [1, 2]])
def test_the_check_needs_two_member_names(value: object) -> None:
    with pytest.raises(ValueError, match="same"):
        parse_checks([{"check": "same", "path": "/x", "value": value}])
