import pytest

from gates.pointer import PathError, join, resolve, split

DOC = {
    "a": {"b/c": 1, "m~n": 2, "": 3},
    "rungs": [{"d": 0.1, "xs": [1, 2]}, {"d": 0.2, "xs": [3]}],
    "e": [],
    "s": "x",
}


def test_escapes_round_trip():
    assert split("/a/b~1c") == ["a", "b/c"]
    assert split("/a/m~0n") == ["a", "m~n"]
    assert join(["a", "b/c", "m~n"]) == "/a/b~1c/m~0n"
    assert split("") == []
    with pytest.raises(ValueError, match="must start with '/'"):
        split("a/b")


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("", [("", DOC)]),
        ("/a/b~1c", [("/a/b~1c", 1)]),
        ("/a/m~0n", [("/a/m~0n", 2)]),
        ("/a/", [("/a/", 3)]),
        ("/rungs/1/d", [("/rungs/1/d", 0.2)]),
        ("/rungs/*/d", [("/rungs/0/d", 0.1), ("/rungs/1/d", 0.2)]),
        ("/rungs/*/xs/*", [("/rungs/0/xs/0", 1), ("/rungs/0/xs/1", 2), ("/rungs/1/xs/0", 3)]),
    ],
)
def test_resolve(path, expected):
    assert resolve(DOC, path) == expected


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/a/x", "/a/x is missing (no key 'x' in /a)"),
        ("/nope", "/nope is missing (no key 'nope' in the document root)"),
        ("/rungs/2/d", "/rungs/2 is missing (/rungs is an array of 2 items)"),
        ("/rungs/01/d", "/rungs/01 is missing"),
        ("/rungs/-/d", "/rungs/- is missing"),
        ("/e/*", "/e is an empty array, so '*' matched nothing"),
        ("/a/*", "/a is an object, not an array"),
        ("/s/x", "/s/x is missing (/s is a string)"),
        ("/rungs/*/zz", "/rungs/0/zz is missing (no key 'zz' in /rungs/0)"),
    ],
)
def test_resolve_failures_name_the_break(path, message):
    with pytest.raises(PathError) as exc:
        resolve(DOC, path)
    assert message in str(exc.value)
