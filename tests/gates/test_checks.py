import pytest

from gates import Check, parse_checks


def test_parse_valid_checks():
    checks = parse_checks(
        [
            {"check": "min", "path": "/probe/cpu_count", "value": 1},
            {"check": "max", "path": "/rungs/*/recall_delta", "value": 0.05},
            {"check": "between", "path": "/x", "value": [0, 1.5]},
            {"check": "eq", "path": "/summary/kv_bounded", "value": True},
            {"check": "all_true", "path": "/rungs/*/exact"},
        ]
    )
    assert [c.check for c in checks] == ["min", "max", "between", "eq", "all_true"]
    assert checks[1] == Check(check="max", path="/rungs/*/recall_delta", value=0.05)
    assert parse_checks(None) == []


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"check": "min"}, "gate checks must be a list"),
        ([{"check": "median", "path": "/a", "value": 1}], "gate check #1"),
        ([{"check": "min", "path": "a/b", "value": 1}], "is not a JSON pointer"),
        ([{"check": "min", "path": "/a/~2", "value": 1}], "is not a JSON pointer"),
        ([{"check": "min", "path": "", "value": 1}], "is not a JSON pointer"),
        ([{"check": "min", "path": "/a", "value": "1"}], "needs a finite number"),
        ([{"check": "max", "path": "/a", "value": True}], "needs a finite number"),
        ([{"check": "max", "path": "/a", "value": float("nan")}], "needs a finite number"),
        ([{"check": "min", "path": "/a"}], "needs a finite number"),
        ([{"check": "between", "path": "/a", "value": [2, 1]}], "needs value [low, high]"),
        ([{"check": "between", "path": "/a", "value": [0, float("inf")]}], "needs value [low, high]"),
        ([{"check": "between", "path": "/a", "value": 1}], "needs value [low, high]"),
        ([{"check": "eq", "path": "/a"}], "needs a value"),
        ([{"check": "eq", "path": "/a", "value": float("nan")}], "needs a finite value"),
        ([{"check": "all_true", "path": "/a", "value": True}], "takes no value"),
        ([{"check": "min", "path": "/a", "value": 1, "note": "x"}], "Extra inputs are not permitted"),
        ([{"check": "min", "path": "/a", "value": 1}, "min /a 1"], "gate check #2"),
    ],
)
def test_malformed_checks_are_rejected(raw, message):
    with pytest.raises(ValueError) as exc:
        parse_checks(raw)
    assert message in str(exc.value)
