"""Executing one preset (bridge/run/execute.py): real subprocesses, process trees, capped logs, redaction, report checks."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bridge.cli.main import main
from bridge.config import Config
from bridge.core.errors import InvalidRequest
from bridge.core.logs import CappedLog, Redactor
from bridge.core.result import RunContext
from bridge.presets.preset import Preset
from bridge.results.outcome import write_outcome
from bridge.run.execute import execute
from bridge.run.isolation import bwrap_available
from tests.bridge.bus_support import pid_alive

REPORT = {"kind": "probe", "schema_version": 1}


def preset(argv, params=None, **over) -> Preset:
    data = {
        "name": "t",
        "description": "test",
        "runners": ["cpu"],
        "timeout_s": 20,
        "argv": argv,
        "params": params or {},
        "report": REPORT,
    }
    data.update(over)
    return Preset.model_validate(data)


def script(checkout: Path, name: str, body: str) -> str:
    (checkout / name).write_text(textwrap.dedent(body))
    return name


@pytest.fixture
def checkout(tmp_path):
    path = tmp_path / "checkout"
    path.mkdir()
    return path


def run(p, checkout, tmp_path, values=None, **kw):
    kw.setdefault(
        "config", Config(isolation="none")
    )  # pids and paths of the host (the sandbox: test_sandbox.py)
    kw.setdefault("environ", {"PATH": os.environ["PATH"], "HOME": str(tmp_path)})
    return execute(p, p.validate_params(values or {}), checkout, tmp_path / "out", **kw)


def test_injection_values_arrive_as_one_literal_argument(checkout, tmp_path):
    canary = tmp_path / "canary"
    script(
        checkout,
        "echo_args.py",
        """
        import json, os, sys
        json.dump({"argv": sys.argv[1:]}, open(os.environ["KAKEYA_REPORT"], "w"))
    """,
    )
    p = preset(
        ["{python}", "echo_args.py", "{v}"],
        {"v": {"type": "str", "pattern": "(?s).*", "max_length": 200, "default": "x"}},
    )
    values = [
        f"; touch {canary}",
        f"$(touch {canary})",
        f"`touch {canary}`",
        f"a touch {canary}",
        "--help",
        f"x' ; touch {canary} '",
        f"| touch {canary}",
    ]
    for value in values:
        result = run(p, checkout, tmp_path, {"v": value})
        report = json.loads((tmp_path / "out" / "report.json").read_text())
        assert report["argv"] == [value], value
        assert result.status == "succeeded"
    with pytest.raises(InvalidRequest, match="control characters"):  # a newline never gets this far
        p.validate_params({"v": f"a\ntouch {canary}"})
    assert not canary.exists()


def test_environment_is_scrubbed_and_checkout_is_on_pythonpath(checkout, tmp_path):
    (checkout / "pkg").mkdir()
    (checkout / "pkg" / "__init__.py").write_text("MARK = 'from-checkout'\n")
    script(
        checkout,
        "env.py",
        """
        import json, os, pkg
        json.dump({"env": dict(os.environ), "mark": pkg.MARK, "cwd": os.getcwd()},
                  open(os.environ["KAKEYA_REPORT"], "w"))
    """,
    )
    p = preset(["{python}", "env.py"], env={"HF_HUB_OFFLINE": "1", "WHERE": "${ENV:MODELS_AT}"})
    environ = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "AWS_SECRET": "leak", "MODELS_AT": "/m"}
    result = run(
        p,
        checkout,
        tmp_path,
        environ=environ,
        context=RunContext(request_id="r1", subject="abc123", runner_name="n", runner_labels=["cpu"]),
    )
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    env = report["env"]
    assert "AWS_SECRET" not in env and "MODELS_AT" not in env
    assert env["WHERE"] == "/m" and env["HF_HUB_OFFLINE"] == "1"
    assert env["PYTHONPATH"] == str(checkout.resolve()) and report["mark"] == "from-checkout"
    assert env["KAKEYA_SUBJECT"] == "abc123" and env["KAKEYA_RUN_DIR"] == str((tmp_path / "out").resolve())
    assert report["cwd"] == str(checkout.resolve())
    saved = json.loads((tmp_path / "out" / "result.json").read_text())
    assert saved["request_id"] == "r1" and saved["subject"] == "abc123" and saved["status"] == "succeeded"
    assert saved["preset_hash"] == p.content_hash and saved["host"]["cpu_count"] >= 1
    assert result.verdict == "fail"  # a probe report without its body fails its schema


def test_missing_env_placeholder_fails_before_anything_starts(checkout, tmp_path):
    canary = tmp_path / "ran"
    p = preset(["{python}", "-c", f"open({str(canary)!r}, 'w')"], env={"X": "${ENV:NOT_SET_ANYWHERE}"})
    result = run(p, checkout, tmp_path)
    assert result.status == "error" and "NOT_SET_ANYWHERE is not set" in result.reason
    assert not canary.exists()
    assert json.loads((tmp_path / "out" / "result.json").read_text())["status"] == "error"


def test_timeout_kills_the_whole_tree_grandchildren_included(checkout, tmp_path):
    pids = tmp_path / "pids"
    inner = (
        "import os, subprocess, sys, time\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "d = subprocess.Popen([sys.executable, '-c', 'import os, time; os.setsid(); time.sleep(600)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{g.pid}} {{d.pid}}')\n"
        "time.sleep(600)\n"
    )
    (checkout / "tree.py").write_text(
        f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {inner!r}])\ntime.sleep(600)\n"
    )
    p = preset(["{python}", "tree.py"], timeout_s=3)
    start = time.monotonic()
    result = run(p, checkout, tmp_path)
    assert result.status == "timed-out" and "time limit of 3 s" in result.reason
    assert time.monotonic() - start < 15
    tree = [int(x) for x in pids.read_text().split()]
    assert len(tree) == 3
    deadline = time.monotonic() + 5
    while any(pid_alive(pid) for pid in tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in tree if pid_alive(pid)]


def test_exited_program_leaves_no_background_process(checkout, tmp_path):
    pidfile = tmp_path / "bg"
    script(
        checkout,
        "bg.py",
        f"""
        import subprocess, sys, json, os
        g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(pidfile)!r}, "w").write(str(g.pid))
        json.dump({{}}, open(os.environ["KAKEYA_REPORT"], "w"))
    """,
    )
    run(preset(["{python}", "bg.py"]), checkout, tmp_path)
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(pid)


def test_fifty_megabytes_of_output_stay_under_the_cap_with_head_and_tail(checkout, tmp_path):
    script(
        checkout,
        "loud.py",
        """
        import sys
        out = sys.stdout.buffer
        out.write(b"HEAD-MARKER\\n")
        line = b"x" * 99 + b"\\n"
        for _ in range(500_000):
            out.write(line)
        out.write(b"TAIL-MARKER\\n")
        sys.stderr.write("err-only\\n")
    """,
    )
    cap = 1024 * 1024
    result = run(
        preset(["{python}", "loud.py"]),
        checkout,
        tmp_path,
        config=Config(isolation="none", log_cap_bytes=cap),
    )
    log = (tmp_path / "out" / "logs" / "stdout.log").read_bytes()
    assert len(log) <= cap + 200
    assert log.startswith(b"HEAD-MARKER") and log.rstrip().endswith(b"TAIL-MARKER")
    assert b"kakeya cut" in log
    assert (tmp_path / "out" / "logs" / "stderr.log").read_bytes() == b"err-only\n"
    assert result.status == "error" and "no report" in result.reason


def test_secrets_appear_in_no_file_written(checkout, tmp_path):
    secret = "s3cr3t-TOKEN-value-1234"
    script(
        checkout,
        "leak.py",
        """
        import json, os, sys
        s = os.environ["HF_TOKEN"]
        print("token is", s)
        sys.stdout.flush()
        # split across two writes, to straddle reads
        sys.stdout.write(s[:7]); sys.stdout.flush(); sys.stdout.write(s[7:] + "\\n")
        print(s, file=sys.stderr)
        json.dump({"leaked": s, "note": "x" + s}, open(os.environ["KAKEYA_REPORT"], "w"))
        open(os.path.join(os.environ["KAKEYA_RUN_DIR"], "extra.txt"), "w").write(s)
    """,
    )
    p = preset(
        ["{python}", "leak.py", "{v}"],
        {"v": {"type": "str", "pattern": ".*", "max_length": 64, "default": "x"}},
        env={"HF_TOKEN": "${ENV:HF_TOKEN}"},
        secrets=["HF_TOKEN"],
    )
    environ = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "HF_TOKEN": secret}
    run(p, checkout, tmp_path, {"v": secret}, environ=environ)
    files = [f for f in (tmp_path / "out").rglob("*") if f.is_file()]
    assert {f.name for f in files} >= {
        "stdout.log",
        "stderr.log",
        "report.json",
        "result.json",
        "summary.md",
        "report.html",
        "extra.txt",
    }
    for f in files:
        assert secret.encode() not in f.read_bytes(), f
    assert b"[REDACTED]" in (tmp_path / "out" / "logs" / "stdout.log").read_bytes()
    assert "[REDACTED]" in json.loads((tmp_path / "out" / "result.json").read_text())["argv"]


def test_capped_log_catches_a_secret_split_across_chunks(tmp_path):
    log = CappedLog(tmp_path / "x.log", 1 << 20, Redactor(["abcdef"]))
    for chunk in (b"..ab", b"c", b"de", b"f..abcdefabc", b"def"):
        log.write(chunk)
    log.close()
    assert (tmp_path / "x.log").read_bytes() == b"..[REDACTED]..[REDACTED][REDACTED]"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("pass", "wrote no report"),
        ("open(os.environ['KAKEYA_REPORT'], 'w').write('{not json')", "not valid JSON"),
        ("open(os.environ['KAKEYA_REPORT'], 'w').write('[1, 2]')", "not a JSON object"),
        ("open(os.environ['KAKEYA_REPORT'], 'w').write('{\"a\": NaN}')", "non-finite"),
    ],
)
def test_bad_reports_end_in_error_with_the_reason(checkout, tmp_path, body, reason):
    p = preset(["{python}", "-c", f"import os\n{body}"])
    result = run(p, checkout, tmp_path)
    assert result.status == "error" and reason in result.reason
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "error" in summary and reason in summary


def test_nonzero_exit_is_failed_and_unstartable_is_error(checkout, tmp_path):
    result = run(preset(["{python}", "-c", "import sys; sys.exit(3)"]), checkout, tmp_path)
    assert (result.status, result.exit_code, result.reason) == ("failed", 3, "exited with code 3")
    result = run(preset(["/nonexistent/program"]), checkout, tmp_path)
    assert result.status == "error" and "could not start '/nonexistent/program'" in result.reason


def test_should_stop_cancels_or_errors(checkout, tmp_path):
    p = preset(["{python}", "-c", "import time; time.sleep(60)"])
    calls = []

    def stop():
        calls.append(1)
        return "cancelled" if len(calls) > 3 else None

    result = run(p, checkout, tmp_path, should_stop=stop)
    assert result.status == "cancelled"
    result = run(p, checkout, tmp_path, should_stop=lambda: "lease lost to runner b")
    assert result.status == "error" and result.reason == "lease lost to runner b"


def test_write_outcome_records_why_nothing_ran(tmp_path):
    result = write_outcome(
        tmp_path / "o",
        "rejected",
        "unknown preset 'x'",
        preset_name="x",
        params={"a": "1"},
        context=RunContext(request_id="r9"),
    )
    saved = json.loads((tmp_path / "o" / "result.json").read_text())
    assert saved["status"] == "rejected" and saved["request_id"] == "r9" and result.exit_code is None
    assert "unknown preset 'x'" in (tmp_path / "o" / "summary.md").read_text()


def test_exec_command_runs_the_probe_preset(tmp_path, capsys, monkeypatch):
    out = tmp_path / "probe-out"
    assert main(["exec", "probe", "--out", str(out), "--summary"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("exec: probe succeeded, verdict pass\n# probe: succeeded")
    assert printed.endswith(f"summary: {out}/summary.md\n")
    report = json.loads((out / "report.json").read_text())
    assert report["kind"] == "probe" and report["probe"]["cpu_count"] == os.cpu_count()
    assert report["probe"]["packages"]["torch"] is not None
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["status"] == "pass"
    assert main(["exec", "probe", "-p", "x=1"]) == 2
    assert "unknown parameter 'x'" in capsys.readouterr().err


def test_exec_as_a_real_subprocess(tmp_path):
    import subprocess

    kakeya = Path(sys.executable).parent / "kakeya"
    proc = subprocess.run([str(kakeya), "exec", "nope"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("kakeya: error: unknown preset 'nope'")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_gate_that_raises_keeps_the_runs_provenance(checkout, tmp_path, monkeypatch):
    import gates

    script(checkout, "ok.py", WRITE_PROBE)

    def broken(*_a, **_k):
        raise RuntimeError("a gate bug")

    monkeypatch.setattr(gates, "evaluate", broken)
    result = run(preset(["{python}", "ok.py"]), checkout, tmp_path)
    assert result.status == "error" and result.reason == "gating failed: RuntimeError: a gate bug"
    assert result.exit_code == 0 and result.argv == [sys.executable, "ok.py"]
    assert result.started_at and result.ended_at and result.duration_s is not None
    saved = json.loads((tmp_path / "out" / "result.json").read_text())
    assert saved["exit_code"] == 0 and saved["argv"] and saved["started_at"]


WRITE_PROBE = """
    import json, os
    json.dump({"kind": "probe"}, open(os.environ["KAKEYA_REPORT"], "w"))
"""

SEE_PY = """
    import json, os, sys
    seen = {}
    for path in sys.argv[1:]:
        seen[path] = os.path.exists(path)
    open("written-by-the-run.txt", "w").write("x")
    seen["files"] = sorted(os.listdir("."))
    json.dump({"kind": "probe", "seen": seen}, open(os.environ["KAKEYA_REPORT"], "w"))
"""


@pytest.mark.skipif(
    not bwrap_available(), reason="bubblewrap is not usable here (apt-get install bubblewrap)"
)
def test_kakeya_exec_in_the_sandbox_gets_a_copy_of_the_working_tree_and_nothing_beside_it(tmp_path):
    from tests.bridge.bus_support import git

    project = tmp_path / "project"
    project.mkdir()
    (project / ".gitignore").write_text(".venv/\nout/\n")
    script(project, "see.py", SEE_PY)
    git(project, "init", "-q")
    git(project, "add", "-A")
    git(project, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "x")
    (project / "new.txt").write_text("untracked, not ignored")
    for ignored in (".venv", "out"):
        (project / ignored).mkdir()
        (project / ignored / "big").write_text("not copied")
    beside = tmp_path / "runner-secret"
    beside.write_text("s")
    argv = ["{python}", "see.py", str(beside), str(project)]
    result = run(preset(argv), project, tmp_path, config=Config(isolation="bwrap", run_user="64123"))
    assert result.status == "succeeded" and result.isolation.startswith("bwrap"), result.reason
    seen = json.loads((tmp_path / "out" / "report.json").read_text())["seen"]
    assert seen["files"] == [".gitignore", "new.txt", "see.py", "written-by-the-run.txt"]
    assert seen[str(beside)] is False and seen[str(project)] is False
    assert not (project / "written-by-the-run.txt").exists()  # the run wrote in its own copy


def test_an_executor_gets_one_frozen_setup_and_its_outcome_is_gated(checkout, tmp_path):
    import dataclasses

    from bridge.run.execute import LocalExecutor, RunSetup

    script(checkout, "ok.py", WRITE_PROBE)
    seen: list[RunSetup] = []

    class Recording(LocalExecutor):
        def launch(self, setup: RunSetup):
            seen.append(setup)
            return super().launch(setup)

    p = preset(["{python}", "ok.py", "{n}"], {"n": {"type": "int", "min": 0, "max": 9, "default": 3}})
    result = run(p, checkout, tmp_path, executor=Recording())
    (setup,) = seen
    assert setup.argv == (sys.executable, "ok.py", "3") and setup.timeout_s == 20
    assert setup.env["KAKEYA_RUN_DIR"] == str(setup.run_dir) and setup.provenance["params"] == {"n": 3}
    with pytest.raises(dataclasses.FrozenInstanceError):
        setup.timeout_s = 99  # type: ignore[misc]
    with pytest.raises(TypeError):
        setup.env["X"] = "y"  # type: ignore[index]
    assert result.status == "succeeded" and result.exit_code == 0 and result.verdict is not None
