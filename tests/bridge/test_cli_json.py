"""Every verb speaks JSON for agents (issue 33 item 2): `--json` on every verb, each line of its stdout one JSON
object; an error (usage errors included) is `{"event": "error", "code": ..., "message": ..., "hint": ...}` on
stdout with the error's exit code, and still one line on stderr; a timed-out wait ends with a `timeout` event
and exit 4. Every verb's --help ends with an example and every positional has help."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from bridge.cli.commands import doctor
from bridge.cli.main import build_parser, main, verbs
from bridge.core.errors import EXIT_CODES, KakeyaError, WaitTimeout
from tests.bridge.bus_support import Env, free_port, git

ROOT = Path(__file__).resolve().parents[2]
# verbs with no output to shape: `runner watch` serves until stopped (its log on stderr), `mcp` speaks the MCP
# protocol on stdout
NO_JSON = {"runner watch", "mcp", "serve"}  # servers: they speak their own protocol


def call(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[dict[str, Any]], str]:
    """main(argv) with --json: its exit code, each stdout line parsed as JSON (any other line fails), stderr."""
    code = main([*argv, "--json"])
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines, f"kakeya {' '.join(argv)} --json printed nothing on stdout"
    return code, [json.loads(line) for line in lines], err


def error(capsys: pytest.CaptureFixture[str], code: str, exit_code: int, *argv: str) -> dict[str, Any]:
    """The error object an error path prints with --json: its code and exit code, and one line on stderr."""
    got, objs, err = call(capsys, *argv)
    assert got == exit_code, (argv, objs, err)
    last = objs[-1]
    assert (last["event"], last["code"], last["exit_code"]) == ("error", code, exit_code), (argv, last)
    assert last["message"] and err.strip().splitlines()[-1] == f"kakeya: error: {last['message']}"
    return last


def test_every_verb_has_json_help_with_an_example_and_helped_positionals():
    parser = build_parser()
    assert f"exit codes: {EXIT_CODES}" in " ".join(parser.format_help().split())
    readme = (ROOT / "README.md").read_text()
    assert "4 timeout" in readme and "exit code" in readme.lower()
    leaves = [
        (path, p)
        for path, p in verbs(parser)
        if not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)
    ]
    assert {"exec", "run", "results", "cancel", "doctor", "bus gc", "gate check", "wait"} <= dict(
        leaves
    ).keys()
    for path, p in verbs(parser):
        last = p.format_help().rstrip().splitlines()[-1]
        assert last.strip().startswith(f"kakeya {path}"), f"`kakeya {path} --help` ends with {last!r}"
    for path, p in leaves:
        for action in p._actions:
            if not action.option_strings:
                assert action.help, f"`kakeya {path}`: positional {action.dest} has no help"
        if path not in NO_JSON:
            assert "--json" in p._option_string_actions, f"`kakeya {path}` has no --json"


def test_every_verb_prints_json_lines(world: Env, capsys, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(doctor, "check_engine", lambda: "not checked here")  # a subprocess importing torch
    code, objs, _ = call(capsys, "exec", "work", "-p", "tag=e", "--out", str(world.tmp / "e"))
    assert code == 0 and [o["event"] for o in objs] == ["verdict"]
    assert (objs[0]["status"], objs[0]["verdict"], objs[0]["checks"]["status"]) == (
        "succeeded",
        "pass",
        "pass",
    )
    report = objs[0]["out"] + "/report.json"

    code, objs, _ = call(capsys, "run", "strict", "-p", "tag=r")
    assert code == 1 and [o["event"] for o in objs] == ["requested", "verdict"]
    rid = objs[0]["id"]
    assert objs[1] == {
        **objs[1],
        "id": rid,
        "verdict": "fail",
        "exit_code": 1,
        "out": str(world.project / "out" / rid),
    }

    code, objs, _ = call(capsys, "request", "work", "--runner", "gpu")
    assert code == 0 and objs[0]["event"] == "requested"
    pending = objs[0]["id"]
    doctor_code = main(["doctor"])  # whatever this host lacks: --json exits the same
    capsys.readouterr()
    for argv, exit_code, check in [
        (("status",), 0, lambda o: {r["id"] for r in o[0]} == {rid, pending}),
        (("status", rid[-6:]), 0, lambda o: o[0]["id"] == rid and o[0]["verdict"] == "fail"),
        (("results", rid, "--out", "res"), 0, lambda o: o[0]["out"] == str(world.project / "res" / rid)),
        (("wait", rid), 1, lambda o: [e["event"] for e in o] == ["finished", "verdict"]),
        (("runners",), 0, lambda o: o == [[]]),
        (("presets",), 0, lambda o: "work" in {p["name"] for p in o[0]}),
        (("presets", "show", "work"), 0, lambda o: o[0]["name"] == "work"),
        (("gate", "check", report, "--preset", "work"), 0, lambda o: o[0]["status"] == "pass"),
        (
            ("gate", "compare", report, report, "--metric", "/probe/cpu_count", "--max-regression", "5"),
            0,
            bool,
        ),
        (
            ("gate", "pr", "--subject", "HEAD", "--require", "work@cpu"),
            1,
            lambda o: o[0][0]["status"] == "missing",
        ),
        (
            ("cancel", pending, "--reason", "r"),
            0,
            lambda o: o[0]["was"] == "requested" and not o[0]["already"],
        ),
        (("bus", "gc", "--older-than", "0", "--dry-run"), 0, lambda o: o[0]["event"] == "gc"),
        (("bus", "compact", "--older-than", "0", "--dry-run"), 0, lambda o: o[0]["refs"]),
        (("bus", "migrate", "--dry-run"), 0, lambda o: o[0]["event"] == "migrate"),
        (
            ("doctor",),
            doctor_code,
            lambda o: o[-1]["event"] == "doctor" and {"git", "bus"} <= {c.get("name") for c in o},
        ),
    ]:
        code, objs, _ = call(capsys, *argv)
        assert check(objs) and code == exit_code, (argv, code, objs)


def test_errors_are_json_with_a_stable_code_and_exit_code(world: Env, capsys):
    assert error(capsys, "unknown-preset", 2, "request", "wrok", "--runner", "cpu")["message"].startswith(
        "unknown preset 'wrok'; did you mean 'work'?"
    )
    error(capsys, "bad-param", 2, "request", "work", "--runner", "cpu", "-p", "mode=fly")
    error(capsys, "bad-param", 2, "exec", "work", "-p", "oops")
    error(capsys, "wrong-label", 2, "run", "cpuonly", "--runner", "gpu")
    error(capsys, "usage", 2, "status", "--no-such-flag")
    error(capsys, "usage", 2, "bus", "gc", "--older-than", "soon")
    error(capsys, "unknown-remote", 2, "status", "--remote", "nosuch")
    error(capsys, "not-found", 1, "status", "20260101T000000.000Z-work-abcdef")
    error(capsys, "bad-id", 2, "results", "refs/heads/../x")  # invalid: exit 2, as docs/cli-json.md says
    error(capsys, "bad-id", 2, "status", "zzzzzz")
    unreachable = f"git://127.0.0.1:{free_port()}/bus.git"
    assert error(capsys, "bus-unreachable", 1, "status", "--remote", unreachable)["hint"]

    _, objs, _ = call(capsys, "run", "work", "-p", "tag=d")
    error(capsys, "already-done", 1, "cancel", objs[0]["id"])
    _, objs, _ = call(capsys, "request", "work", "--runner", "gpu")
    queued = objs[0]["id"]
    error(capsys, "not-done", 1, "results", queued)
    # no live runner: exit 3; a timeout: exit 4 and a last `timeout` event naming the request and its state
    assert error(capsys, "no-runner", 3, "wait", queued, "--no-runner-timeout", "0")["hint"]
    code, objs, err = call(capsys, "request", "work", "--runner", "gpu", "--wait", "--timeout", "0.3")
    assert code == 4 and objs[0]["event"] == "requested" and objs[1]["event"] == "queued"
    assert objs[-1] == {
        **objs[-1],
        "event": "timeout",
        "code": "timeout",
        "exit_code": 4,
        "id": objs[0]["id"],
        "state": "requested",
    }
    assert "timed out after 0.3 s" in err

    # a dirty tracked file blocks a request, with its own code and a hint
    (world.project / "work.py").write_text("changed\n")
    assert error(capsys, "dirty-tree", 2, "request", "work", "--runner", "cpu")["hint"]
    git(world.project, "checkout", "work.py")


def test_error_classes_have_stable_codes():
    assert (WaitTimeout.exit_code, WaitTimeout.code, WaitTimeout("t", id="x").as_json()["event"]) == (
        4,
        "timeout",
        "timeout",
    )
    from bridge.core.caps import Unsafe
    from bridge.run.slurm import SlurmError

    assert (SlurmError.code, Unsafe.code, KakeyaError("m", code="c", hint="h").as_json()["hint"]) == (
        "slurm-error",
        "unsafe",
        "h",
    )
    assert str(KakeyaError("plain")) == "plain" and KakeyaError("plain").as_json()["code"] == "error"
