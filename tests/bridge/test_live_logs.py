"""Issue 41 (8): `kakeya logs ID [-f]`: a run's output while it runs, carried by its heartbeats on a real bus,
then its final logs; redacted, capped, printable."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time

import anyio
import pytest
import yaml

from bridge.bus import livelog
from bridge.bus.bus import Bus
from bridge.bus.livelog import LiveFile, printable
from bridge.bus.progress import Tracker
from bridge.bus.records import done_ref
from bridge.cli.main import main
from bridge.core.logs import Redactor
from bridge.wire import git as G
from tests.bridge.bus_support import (
    WRITE_REPORT_PY,
    Daemon,
    Env,
    git,
    make_runner,
    runner_process,
    stop,
    wait_for,
)

SECRET = "hunter2-s3cret-value"

# Prints a line every `pause` s (the secret and a terminal escape among them), then waits for the test's
# release file, prints one more line and its report.
TALK_PY = WRITE_REPORT_PY + textwrap.dedent("""
    import os, sys, time

    n, pause = int(sys.argv[1]), float(sys.argv[2])
    for i in range(n):
        print(f"line {i + 1} of {n}", flush=True)
        print(f"warn {i + 1}", file=sys.stderr, flush=True)
        if i == 1:
            print("token=" + os.environ["SECRET"] + " \\x1b]0;pwned\\x07\\x1b[31mred\\x1b[0m \\u202eevil", flush=True)
        time.sleep(pause)
    release = os.path.join(os.environ["MARKS"], "release")
    for _ in range(600):
        if os.path.exists(release):
            break
        time.sleep(0.05)
    print("after the release", flush=True)
    write_report()
""")

# Floods both streams: many lines, then one long line with no end.
BOMB_PY = WRITE_REPORT_PY + textwrap.dedent("""
    import sys, time

    for burst in range(8):
        sys.stdout.write("".join(f"bomb {burst} {i} " + "x" * 60 + "\\n" for i in range(3000)))
        sys.stdout.flush()
        sys.stderr.write("e" * 200000)
        sys.stderr.flush()
        time.sleep(0.7)
    write_report()
""")


def preset(name: str, script: str, params: dict, argv: list[str]) -> dict:
    return {
        "name": name,
        "description": "talks",
        "runners": ["cpu"],
        "timeout_s": 90,
        "argv": ["{python}", script, *argv],
        "params": params,
        "env": {"SECRET": "${ENV:KAKEYA_TEST_SECRET}", "MARKS": "${ENV:KAKEYA_TEST_MARKS}"},
        "secrets": ["SECRET"],
        "report": {"kind": "probe", "schema_version": 1},
        "gate": [{"check": "min", "path": "/probe/cpu_count", "value": 1}],
    }


@pytest.fixture(name="talk")
def talk_fixture(world: Env, monkeypatch: pytest.MonkeyPatch) -> Env:
    monkeypatch.setenv("KAKEYA_TEST_SECRET", SECRET)
    n = {"type": "int", "min": 1, "max": 50, "default": 6}
    pause = {"type": "float", "min": 0, "max": 5, "default": 0.6}
    (world.presets / "talk.yaml").write_text(
        yaml.safe_dump(preset("talk", "talk.py", {"n": n, "pause": pause}, ["{n}", "{pause}"]))
    )
    (world.presets / "bomb.yaml").write_text(yaml.safe_dump(preset("bomb", "bomb.py", {}, [])))
    (world.project / "talk.py").write_text(TALK_PY)
    (world.project / "bomb.py").write_text(BOMB_PY)
    git(world.project, "add", "-A")
    git(world.project, "commit", "-q", "-m", "talkers")
    return world


class Reader(threading.Thread):
    """Reads a process's stream as it comes (text, all of it)."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream, self.text = stream, ""

    def run(self) -> None:
        for line in self.stream:
            self.text += line


def mcp_logs(url: str, rid: str, **more: object) -> dict:
    """The MCP tool `logs`, through the server's own dispatcher (tests/bridge/test_mcp.py drives it over stdio)."""
    from mcp import Client

    from bridge.cli.mcp import Tools, build

    async def call() -> dict:
        async with Client(build(Tools(remote=url))) as client:
            got = await client.call_tool("logs", {"id": rid, **more})
            assert not got.is_error, got
            return got.structured_content

    return anyio.run(call)


def request(url: str, capsys, *more: str) -> str:
    assert main(["request", *more, "--runner", "cpu", "--remote", url]) == 0
    return capsys.readouterr().out.strip()


def test_logs_follow_shows_the_lines_while_it_runs_then_the_final_logs(talk: Env, daemon: Daemon, capsys):
    url = daemon.repo()
    rid = request(url, capsys, "talk")
    logs = subprocess.Popen(
        [sys.executable, "-m", "bridge.cli", "logs", rid[-6:], "-f", "--remote", url],
        cwd=talk.project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = Reader(logs.stdout), Reader(logs.stderr)
    out.start()
    err.start()
    runner = runner_process(talk, url, "r1", "--poll", "0.2", "--lease", "3")
    bus = Bus(url, talk.project)
    try:
        wait_for(lambda: "line 4 of 6" in out.text, 60, "live lines in `kakeya logs -f`")
        wait_for(lambda: "warn 3" in err.text, 10, "live stderr lines")
        # seen while the run still runs: it waits for the release file, and no done commit is on the bus
        assert done_ref(rid) not in bus.ls_remote(done_ref(rid)).refs
        assert logs.poll() is None
        assert "after the release" not in out.text
        live = mcp_logs(url, rid[-6:])  # an agent's view meanwhile: the MCP tool `logs`
        assert live["state"] in ("claimed", "running") and live["source"] == "live" and live["done"] is None
        assert (
            "line 4 of 6" in live["stdout"] and "warn 2" in live["stderr"] and "[REDACTED]" in live["stdout"]
        )
        (talk.marks / "release").write_text("")
        assert logs.wait(60) == 0
    finally:
        stop(runner)
    out.join(5)
    err.join(5)
    text = out.text
    # every line once, in order, the one printed after the release from the final logs (or a last beat)
    lines = [f"line {i} of 6" for i in range(1, 7)] + ["after the release"]
    assert [text.count(ln) for ln in lines] == [1] * 7
    assert [text.index(ln) for ln in lines] == sorted(text.index(ln) for ln in lines)
    assert "[REDACTED]" in text and SECRET not in text and SECRET not in err.text
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text and "pwned" not in text
    assert "red evil" in text
    assert [err.text.count(f"warn {i}\n") for i in range(1, 7)] == [1] * 6
    assert "kakeya: [done: " in err.text and " (succeeded)]" in err.text

    # the same request, done: the final logs (no -f needed), as JSON events
    assert main(["logs", rid, "--remote", url, "--json"]) == 0
    events = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert [e["event"] for e in events] == ["log", "log", "end"]
    final = {e["stream"]: e for e in events if e["event"] == "log"}
    assert final["stdout"]["source"] == "final" and final["stdout"]["start"] == 0
    assert (
        final["stdout"]["text"].startswith("line 1 of 6\n") and "after the release" in final["stdout"]["text"]
    )
    assert "[REDACTED]" in final["stdout"]["text"] and "\x1b" not in final["stdout"]["text"]
    assert events[-1]["state"] == "done" and events[-1]["id"] == rid and events[-1]["done"]
    assert events[-1]["status"] == "succeeded"
    done = mcp_logs(url, rid, tail_chars=30)
    assert (done["source"], done["state"], done["cut"]) == ("final", "done", ["stdout", "stderr"])
    assert done["stdout"].endswith("after the release\n") and len(done["stdout"]) == 30

    # and on the bus: heartbeat commits carried the chunks (live.json), the secret never among them
    store = Bus(url, talk.project)
    store.fetch_ids([events[-1]["done"]], "commits")
    repo = G.repo_having(store.repos(), events[-1]["done"])
    carried = livelog.live_files(store.repos(), events[-1]["done"], [])
    assert len({c.start for f in carried for c in f.chunks if c.stream == "stdout"}) >= 2  # several beats
    assert all(SECRET not in c.text for f in carried for c in f.chunks)
    assert repo


def test_a_line_bomb_is_capped_per_heartbeat_and_in_total(
    talk: Env, daemon: Daemon, capsys, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(livelog, "TOTAL_BYTES", 40 * 1024)
    url = daemon.repo()
    rid = request(url, capsys, "bomb")
    runner = make_runner(url, talk)
    served = runner.once()
    assert served is not None and served.status == "succeeded"
    bus = Bus(url, talk.project)
    done = bus.ls_remote(done_ref(rid)).refs[done_ref(rid)]
    bus.fetch_ids([done], "commits")
    files = livelog.live_files(bus.repos(), done, [])
    assert files, "no heartbeat carried the logs"
    distinct = {(c.stream, c.start, c.end): c for f in files for c in f.chunks}.values()
    for stream in ("stdout", "stderr"):
        sent = [c for c in distinct if c.stream == stream]
        assert sent and all(len(c.text.encode()) <= livelog.BEAT_BYTES for c in sent)
        assert sum(c.end - c.start for c in sent) <= 40 * 1024
    assert set(files[-1].cut) == {"stdout", "stderr"}  # both ran out of their total

    # what a reader shows: the cut said, the final logs after it, capped by the runner's own log cap
    assert main(["logs", rid, "--remote", url, "--json"]) == 0
    events = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    final = {e["stream"]: e for e in events if e["event"] == "log"}
    assert "bomb 7 2999 " in final["stdout"]["text"] and len(final["stderr"]["text"]) > 1_000_000


def test_printable_and_the_live_file_refuse_what_a_bus_should_not_carry():
    assert printable("a\x1b[2Jb\x1b]8;;http://x\x1b\\c\rd\x00e\u202ef\u200bg\th\n") == "abc\nde" + "fg\th\n"
    too_long = {
        "started_at": "2026-01-01T00:00:00+00:00",
        "chunks": [{"stream": "stdout", "start": 0, "end": 1, "text": "x" * (livelog.BEAT_BYTES + 1)}],
    }
    with pytest.raises(ValueError):
        LiveFile.model_validate(too_long)
    three = {**too_long, "chunks": [{"stream": "stdout", "start": 0, "end": 1, "text": "x"}] * 3}
    with pytest.raises(ValueError):
        LiveFile.model_validate(three)


def test_logs_of_a_queued_request_say_so_and_end(talk: Env, daemon: Daemon, capsys):
    url = daemon.repo()
    rid = request(url, capsys, "talk")
    t0 = time.monotonic()
    assert main(["logs", rid, "--remote", url, "--json"]) == 0
    events = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert [e["event"] for e in events] == ["waiting", "end"] and events[-1]["done"] is None
    assert time.monotonic() - t0 < 30


def test_a_forged_heartbeat_chain_is_read_capped_and_shown_printable(tmp_path):
    """What a bus holds is hostile: a live.json over the cap is never read, an invalid one is skipped, a
    chunk that goes back over what was shown is not shown again, and escape sequences never reach the
    terminal."""
    repo = tmp_path / "r"
    git(tmp_path, "init", "-q", str(repo))
    ok = LiveFile.model_validate(
        {
            "started_at": "2026-01-01T00:00:00+00:00",
            "chunks": [
                {"stream": "stdout", "start": 0, "end": 20, "text": "a\x1b]52;c;cHduZWQ=\x07b\x1b[2J\n"}
            ],
        }
    )
    again = ok.model_copy(update={"chunks": [ok.chunks[0].model_copy(update={"start": 5, "end": 30})]})
    shas = []
    for body in (ok.dump(), b'{"chunks": "x"}', b"x" * (livelog.LIVE_CAP + 1), again.dump()):
        (repo / ".kakeya").mkdir(exist_ok=True)
        (repo / ".kakeya" / "live.json").write_bytes(body)
        git(repo, "add", "-A")
        git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "beat")
        shas.append(git(repo, "rev-parse", "HEAD"))
    files = livelog.live_files([repo], shas[-1], [])
    assert [f.chunks[0].end for f in files] == [20, 30]  # the invalid and the oversized one: skipped
    shown = livelog.Shown()
    events = shown.live(files)
    assert [(e["event"], e["text"]) for e in events] == [("log", "ab\n")]  # the overlapping chunk: not again
    assert livelog.live_files([repo], shas[-1], [shas[1]]) == files[1:]


def test_logs_written_unredacted_are_redacted_before_a_heartbeat_carries_them(tmp_path):
    """A Slurm job writes its logs without the run's secrets (bridge/run/slurm_job.py): the runner's live log and
    its progress tail redact them with the run's redactor (bridge/run/slurm_runner.py sets it)."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "stdout.log").write_text(f"key {SECRET}\nsecond line\n")
    tracker = Tracker(tmp_path)
    tracker.live.redact = Redactor([SECRET])
    live = LiveFile.model_validate_json(tracker.live.take() or b"")
    assert live.chunks[0].text == "key [REDACTED]\nsecond line\n"
    assert tracker.record().log_tail == ["stdout: key [REDACTED]", "stdout: second line"]
    assert tracker.live.take() is not None  # not acknowledged: the next beat carries it again
    tracker.live.ack()
    assert tracker.live.take() is None
