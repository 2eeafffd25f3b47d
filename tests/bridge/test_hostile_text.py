"""Issue 40 (2): text a run sends to people's terminals. A hostile workload (OSC 52 to write the clipboard,
clear-screen, cursor moves, a fake green "✓ pass", bidi overrides, 8-bit CSI/OSC) in its progress, its logs and
its report, served by a real `kakeya runner watch` on a `git daemon` bus; and a progress record forged straight
onto the bus by a pusher (a client never trusts that a runner cleaned). What reaches the stdout of `kakeya
wait` (plain lines, and the live bar on a pseudo-terminal), `kakeya status` and `kakeya results`, real
subprocesses, holds none of it; nor what the runner stored for showing (its heartbeats' progress, verdict.json,
result.json, summary.md)."""

from __future__ import annotations

import json
import os
import pty
import pwd
import re
import select
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

import pytest
import yaml

from bridge.bus.bus import Bus
from bridge.bus.records import CLAIM_PATH, Update, claim_ref, done_ref, req_ref, results_path, utcnow
from bridge.cli.main import main
from bridge.run.isolation import bwrap_available
from bridge.wire import git as G
from tests.bridge.bus_support import Daemon, Env, git, runner_process, stop, wait_for
from tests.bridge.test_sandbox import TEST_USER, as_user, ensure_user

ROOT = hasattr(os, "geteuid") and os.geteuid() == 0

EVIL = (
    "\x1b]52;c;cHduZWQ=\x07"  # OSC 52: write the reader's clipboard
    "\x1b[2J\x1b[H\x1b[7;7H\x1b[3A"  # clear the screen, move the cursor
    "\x1b[32m\u2713 pass\x1b[0m"  # a fake green pass
    " \u202egnp.exe\u202c"  # a bidi override
    " \x9b2J\x9d0;title\x9c\r"  # 8-bit CSI and OSC, a carriage return
)
# What none of the bytes a person or an agent is shown may hold: ESC, C0 but tab and newline, DEL, C1 (UTF-8),
# the bidi controls and zero-width characters.
FORBIDDEN = re.compile(
    rb"[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]|\xe2\x80[\x8b-\x8f\xa8-\xae]|\xe2\x81[\xa6-\xa9]"
)
# On a terminal the live bar draws with escape sequences of its own; these are the run's
HOSTILE_SEQUENCES = [
    b"\x1b]52",
    b"\x1b[2J",
    b"\x1b[7;7H",
    b"\x1b[3A",
    b"\x1b[32m",
    "\u202e".encode(),
    b"\xc2\x9b",
]

HOSTILE_PY = textwrap.dedent("""
    import json, os, sys, time

    evil = json.loads(sys.argv[1])
    for i in range(6):
        with open(os.environ["KAKEYA_PROGRESS"] + ".tmp", "w") as fh:
            json.dump({"done": i + 1, "total": 6, "what": evil}, fh)
        os.replace(os.environ["KAKEYA_PROGRESS"] + ".tmp", os.environ["KAKEYA_PROGRESS"])
        print(f"step {i} {evil}", flush=True)
        print(f"warn {evil}", file=sys.stderr, flush=True)
        time.sleep(0.6)
    env = {"python": "3", "os": "test", "machine": "x", "hostname": "h", "cpu_count": 1, "memory_bytes": None,
           "versions": {"python": "3"}}
    report = {"kind": "probe", "schema_version": 1, "created_at": "2026-01-01T00:00:00+00:00",
              "environment": env, "subject": os.environ.get("KAKEYA_SUBJECT"),
              "probe": {"python": "3", "os": evil, "cpu_count": 1, "memory_bytes": None,
                        "packages": {"torch": None, "transformers": None, "mlx": None, "mlx_lm": None},
                        "accelerators": {"cuda": {"available": False, "devices": []}, "mps": {"available": False},
                                         "metal": {"available": False}},
                        "mlx_default_device": None}}
    with open(os.environ["KAKEYA_REPORT"], "w") as fh:
        json.dump(report, fh, ensure_ascii=False)
""")
HOSTILE = {
    "name": "hostile",
    "description": "a workload that writes terminal escapes everywhere it can",
    "runners": ["cpu"],
    "timeout_s": 60,
    "argv": ["{python}", "hostile.py", json.dumps(EVIL)],
    "report": {"kind": "probe", "schema_version": 1},
    "gate": [{"check": "eq", "path": "/probe/os", "value": "test"}],
}


def kakeya(world: Env, *args: str, **kw) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "bridge.cli", *args], cwd=world.project, capture_output=True, timeout=120, **kw
    )


def assert_clean(data: bytes, what: str) -> None:
    hit = FORBIDDEN.search(data)
    assert hit is None, (
        f"{what} shows {hit.group()!r}: ...{data[max(0, hit.start() - 60) : hit.end() + 60]!r}"
    )


def strings(value: object) -> list[str]:
    """Every string in a decoded JSON value, keys too."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *strings(v)]]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def on_a_terminal(world: Env, *args: str) -> tuple[subprocess.Popen[bytes], bytearray]:
    """`kakeya ARGS` with its stdout on a pseudo-terminal (rich draws its live bar there); what it wrote."""
    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "160"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "bridge.cli", *args],
        cwd=world.project,
        stdout=slave,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    os.close(slave)
    seen = bytearray()

    def read() -> None:
        while True:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the terminal's other end closed
                    break
                if not chunk:
                    break
                seen.extend(chunk)
            elif proc.poll() is not None:
                break
        os.close(master)

    threading.Thread(target=read, daemon=True).start()
    return proc, seen


def with_hostile(world: Env) -> None:
    (world.presets / "hostile.yaml").write_text(yaml.safe_dump(HOSTILE))
    (world.project / "hostile.py").write_text(HOSTILE_PY)
    git(world.project, "add", "-A")
    git(world.project, "commit", "-q", "-m", "hostile")


def hostile_runner(world: Env, url: str, who: str) -> tuple[subprocess.Popen[bytes], Path | None]:
    """`kakeya runner watch` serving the hostile preset: as root (the suite's `none`), or as an unprivileged
    user in its default sandbox (auto: bubblewrap), its presets and work directory its own."""
    if who == "root":
        return runner_process(world, url, "r1", "--poll", "0.2", "--lease", "3"), None
    if not (ROOT and bwrap_available()):
        pytest.skip("a runner as another user needs root and bubblewrap (CI has both)")
    user = ensure_user(TEST_USER)
    home = Path(tempfile.mkdtemp(prefix="kakeya-esc-"))
    (home / "presets").mkdir()
    shutil.copy(world.presets / "hostile.yaml", home / "presets" / "hostile.yaml")
    home.chmod(0o755)
    ids = pwd.getpwnam(user)
    for path in [home, *home.rglob("*")]:
        os.chown(path, ids.pw_uid, ids.pw_gid)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAKEYA_")} | {
        "KAKEYA_PRESETS": str(home / "presets"),
        "KAKEYA_MIN_FREE": "0",
        "HOME": str(home),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    argv = [sys.executable, "-m", "bridge.cli", "runner", "watch", "--poll", "0.2", "--lease", "3"]
    flags = ["--labels", "cpu", "--name", "r1", "--remote", url, "--workdir", str(home / "runner")]
    log = (home / "runner.log").open("ab")
    proc = subprocess.Popen(as_user(user, [*argv, *flags]), env=env, cwd=home, stdout=log, stderr=log)
    return proc, home


@pytest.mark.parametrize("who", ["root", "unprivileged"])
def test_a_hostile_runs_escapes_reach_no_terminal_and_are_not_stored_for_showing(
    world: Env, daemon: Daemon, capsys, who: str
):
    with_hostile(world)
    url = daemon.repo()
    assert main(["request", "hostile", "--runner", "cpu", "--remote", url]) == 0
    rid = capsys.readouterr().out.strip()
    plain = subprocess.Popen(
        [sys.executable, "-m", "bridge.cli", "wait", rid, "--remote", url, "--out", "plain-out"],
        cwd=world.project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    live, drawn = on_a_terminal(world, "wait", rid, "--remote", url, "--out", "live-out")
    runner, home = hostile_runner(world, url, who)
    try:

        def shown() -> bytes | None:
            out = kakeya(world, "status", "--remote", url).stdout
            return out if b"gnp.exe" in out else None

        status = wait_for(shown, 40, "the workload's progress in kakeya status", step=0.3)
        assert isinstance(status, bytes)
        assert_clean(status, "kakeya status")
        assert b"\xe2\x9c\x93 pass gnp.exe" in status  # the words stay, the escapes go
        out, err = plain.communicate(timeout=60)
        assert live.wait(60) == 1
    finally:
        stop(runner)
        if home:
            shutil.rmtree(home, ignore_errors=True)
    assert plain.returncode == 1  # the gate failed: /probe/os is not "test"
    assert b"gnp.exe" in out and b"  | s" in out  # progress lines and the log echo were shown
    assert_clean(out, "kakeya wait (plain lines)")
    assert_clean(err, "kakeya wait's stderr")
    wait_for(lambda: b"ran, gate failed" in drawn, 10, "the live wait's last lines")
    assert b"gnp.exe" in drawn
    for seq in HOSTILE_SEQUENCES:
        assert seq not in drawn, f"the live bar drew {seq!r}"
    for args in (["status", rid], ["results", rid, "--summary"], ["status"]):
        done = kakeya(world, *args, "--remote", url)
        assert_clean(done.stdout + done.stderr, f"kakeya {' '.join(args)}")
    # What the runner stored for showing: each heartbeat's progress (the claim commits the done commit keeps),
    # the gate's reasons in verdict.json and result.json, summary.md.
    bus = Bus(url, world.project)
    done_sha = bus.ls_remote(done_ref(rid)).refs[done_ref(rid)]
    bus.fetch([done_ref(rid)])
    claims = [
        G.read_path(world.project, c, CLAIM_PATH) for c in git(world.project, "rev-list", done_sha).split()
    ]
    progress = [json.loads(c)["progress"] for c in claims if c and json.loads(c).get("progress")]
    assert any(p["workload"] and "gnp.exe" in p["workload"]["what"] for p in progress)
    assert any("gnp.exe" in line for p in progress for line in p["log_tail"])
    for p in progress:
        assert_clean("\n".join(strings(p)).encode(), "a heartbeat's progress")
    files = G.read_dir(world.project, done_sha, results_path(rid))
    ran = json.loads(files["result.json"])
    assert ran["isolation"].startswith("bwrap") if who == "unprivileged" else ran["isolation"] == "none", ran
    for name in ("verdict.json", "result.json", "summary.md", "report.html"):
        text = "\n".join(strings(json.loads(files[name]))) if name.endswith(".json") else files[name].decode()
        assert "gnp.exe" in text or name == "result.json"
        assert_clean(text.encode(), name)


def forge_progress(url: str, world: Env, rid: str) -> None:
    """A claim on request `rid` whose progress record a pusher wrote by hand (no runner, no model)."""
    bus = Bus(url, world.project)
    refs = bus.ls_remote(req_ref("cpu", rid)).refs
    req = refs[req_ref("cpu", rid)]
    bus.fetch([req_ref("cpu", rid)])
    now = utcnow().isoformat()
    claim = {
        "schema_version": 1,
        "id": rid,
        "runner": f"r1{EVIL}",
        "labels": ["cpu"],
        "host": f"host{EVIL}",
        "pid": 1,
        "claimed_at": now,
        "lease_until": "2099-01-01T00:00:00+00:00",
        "lease_s": 3600,
        "progress": {
            "phase": "running",
            "started_at": now,
            "at": now,
            "elapsed_s": 1.0,
            "log_tail": [f"stdout: {EVIL}", f"stderr: {EVIL}"],
            "workload": {"done": 1, "total": 2, "what": EVIL},
            "scheduler": f"pending {EVIL}",
        },
    }
    data = json.dumps(claim, ensure_ascii=False).encode()
    sha = G.child_commit(world.project, req, {CLAIM_PATH: data}, "forged claim", "Mallory <m@example.com>")
    assert bus.swap([Update(claim_ref(rid), sha, None)], atomic=False)


def test_a_progress_record_forged_on_the_bus_reaches_no_terminal(world: Env, daemon: Daemon, capsys):
    url = daemon.repo()
    assert main(["request", "work", "--runner", "cpu", "--remote", url]) == 0
    rid = capsys.readouterr().out.strip()
    forge_progress(url, world, rid)
    table = kakeya(world, "status", "--remote", url)
    assert b"gnp.exe" in table.stdout and table.returncode == 0
    one = kakeya(world, "status", rid, "--remote", url)
    waited = kakeya(world, "wait", rid, "--remote", url, "--timeout", "2")
    assert waited.returncode == 4 and b"gnp.exe" in waited.stdout
    as_json = kakeya(world, "wait", rid, "--remote", url, "--timeout", "2", "--json")
    status_json = kakeya(world, "status", rid, "--remote", url, "--json")
    for name, proc in (("status", table), ("status ID", one), ("wait", waited), ("wait --json", as_json)):
        assert_clean(proc.stdout + proc.stderr, f"kakeya {name}")
    # an agent decodes the JSON: what it gets holds no escape either
    for name, proc in (("wait --json", as_json), ("status ID --json", status_json)):
        for line in proc.stdout.splitlines():
            assert_clean("\n".join(strings(json.loads(line))).encode(), f"kakeya {name}, decoded")
    live, drawn = on_a_terminal(world, "wait", rid, "--remote", url, "--timeout", "2")
    assert live.wait(30) == 4
    wait_for(lambda: b"gnp.exe" in drawn, 10, "the live bar's words")
    for seq in HOSTILE_SEQUENCES:
        assert seq not in drawn, f"the live bar drew {seq!r}"


def test_what_the_mcp_server_hands_an_agent_is_clean(world: Env, daemon: Daemon, capsys):
    from bridge.cli import mcp

    url = daemon.repo()
    assert main(["request", "work", "--runner", "cpu", "--remote", url]) == 0
    rid = capsys.readouterr().out.strip()
    forge_progress(url, world, rid)
    content, data = mcp.Tools(remote=url).call("status", {"id": rid}, lambda e: None)
    text = "\n".join(strings(data) + [c.text for c in content])
    assert "gnp.exe" in text
    assert_clean(text.encode(), "the MCP status tool")
    # a progress notification's line, from a running event of that record
    event = {"event": "running", "id": rid, "workload": {"done": 1, "total": 2, "what": EVIL}, "elapsed_s": 1}
    assert_clean(mcp.event_line(event).encode(), "an MCP progress notification")
