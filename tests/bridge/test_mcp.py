"""`kakeya mcp` driven by the MCP SDK's own client over stdio (a real `kakeya mcp` subprocess) against a real
bus (`git daemon`) and a real runner process: the tools and their registry-made input schemas, a request
that waits with progress notifications, results with a plot as image content, gate_pr and evidence_for,
resources; hostile arguments (an unknown preset, a parameter out of its bounds or pattern, an unknown
argument) are tool errors naming the problem. And the preset parameters' JSON Schema agrees with the
registry's own validation on every shipped preset."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import jsonschema
import pytest
import yaml

pytest.importorskip("mcp")
from mcp import Client, StdioServerParameters  # noqa: E402

from bridge.cli.main import main
from bridge.cli.mcp import TOOLS, Tools, build, input_schema
from bridge.core.errors import InvalidRequest
from bridge.presets.registry import load_registry
from tests.bridge.bus_support import WRITE_REPORT_PY, Daemon, Env, git, probe_preset, runner_process, stop  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PNG_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
# says its progress three times, a heartbeat apart; writes a real PNG and a fake one next to its report
PLOT_PY = WRITE_REPORT_PY + textwrap.dedent(f"""
    import base64, time
    run = os.environ["KAKEYA_RUN_DIR"]
    for i in range(3):
        with open(os.environ["KAKEYA_PROGRESS"], "w") as fh:
            json.dump({{"done": i + 1, "total": 3, "what": f"step {{i + 1}}"}}, fh)
        time.sleep(1.2)
    with open(os.path.join(run, "plot.png"), "wb") as fh:
        fh.write(base64.b64decode("{PNG_B64}"))
    with open(os.path.join(run, "fake.png"), "wb") as fh:
        fh.write(b"<script>not a png</script>")
    write_report()
""")


def test_the_param_schema_agrees_with_the_registry_on_every_shipped_preset():
    for preset in load_registry(ROOT / "presets").values():
        schema = preset.params_schema()
        jsonschema.Draft202012Validator.check_schema(schema)
        check = jsonschema.Draft202012Validator(schema)
        defaults = {n: s.default for n, s in preset.params.items() if s.default is not None}
        assert not list(check.iter_errors(defaults)), preset.name
        preset.validate_params(defaults)
        for name, spec in preset.params.items():
            bad: list[Any] = []
            if spec.type in ("int", "float"):
                bad = [spec.max + 1, spec.min - 1, True]
            elif spec.type == "int_list":
                bad = [[spec.max + 1], [], [spec.min] * (spec.max_items + 1)]
            elif spec.type == "enum":
                bad = ["not-a-choice"]
            elif spec.type in ("str", "model"):
                bad = ["a\nb", "../../etc/passwd", "x" * 5000]
            for value in bad:  # each refused by the schema and by the registry alike
                if not list(check.iter_errors({**defaults, name: value})):
                    raise AssertionError(f"{preset.name}.{name}: schema allows {value!r}")
                with pytest.raises(InvalidRequest):
                    preset.validate_params({**defaults, name: value})
        assert list(check.iter_errors({**defaults, "nope": 1}))  # no unknown parameter


def test_every_tool_schema_is_valid_json_schema(world: Env):
    registry = load_registry()
    for name in TOOLS:
        jsonschema.Draft202012Validator.check_schema(input_schema(name, registry))
    request = jsonschema.Draft202012Validator(input_schema("request", registry))
    assert not list(request.iter_errors({"preset": "work", "params": {"tag": "ok", "seconds": 3}}))
    assert list(request.iter_errors({"preset": "work", "params": {"seconds": 500}}))  # over its maximum
    assert list(request.iter_errors({"preset": "ghost"}))


def write_plot_preset(env: Env) -> None:
    (env.project / "plot.py").write_text(PLOT_PY)
    gate = [{"check": "min", "path": "/probe/cpu_count", "value": 1}]
    preset = probe_preset("plot", "a run with progress and a plot", ["{python}", "plot.py"], gate=gate)
    (env.presets / "plot.yaml").write_text(yaml.safe_dump(preset))


async def session(env: Env, url: str, script: Any) -> Any:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "bridge.cli", "mcp", "--project", str(env.project), "--remote", url],
        cwd=str(env.tmp),  # as a desktop client would: elsewhere; --project says where
        env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT))},
    )
    async with Client(params, read_timeout_seconds=120) as client:
        return await script(client)


def test_an_mcp_client_drives_kakeya_mcp_over_stdio(world: Env, daemon: Daemon):
    write_plot_preset(world)
    (world.project / ".github").mkdir()
    (world.project / ".github" / "kakeya-required.yml").write_text("required:\n  - plot@cpu\n")
    git(world.project, "add", "-A")
    git(world.project, "commit", "-qm", "plot")
    head = git(world.project, "rev-parse", "HEAD")
    url = daemon.repo()
    transcript: list[str] = []

    async def script(client: Any) -> dict[str, Any]:
        tools = (await client.list_tools()).tools
        transcript.append("tools: " + ", ".join(t.name for t in tools))
        got: dict[str, Any] = {"tools": {t.name: t for t in tools}}
        got["bad_preset"] = await client.call_tool("request", {"preset": "plott"})
        got["bad_param"] = await client.call_tool("request", {"preset": "work", "params": {"seconds": 500}})
        got["bad_pattern"] = await client.call_tool(
            "request", {"preset": "work", "params": {"tag": "A;rm -rf"}}
        )
        got["bad_arg"] = await client.call_tool("status", {"id": "x", "sudo": True})
        got["gate_before"] = await client.call_tool("gate_pr", {"subject": head, "allow_unsigned": True})
        events: list[tuple[float, str | None]] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            events.append((progress, message))
            transcript.append(f"progress {progress:g}: {message}")

        got["request"] = await client.call_tool(
            "request", {"preset": "plot", "wait": True, "timeout_s": 90}, progress_callback=on_progress
        )
        got["events"] = events
        rid = got["request"].structured_content["id"]
        got["results"] = await client.call_tool("results", {"id": rid})
        got["status"] = await client.call_tool("status", {"id": rid})
        got["gate_after"] = await client.call_tool("gate_pr", {"subject": head, "allow_unsigned": True})
        got["evidence"] = await client.call_tool("evidence_for", {"subject": head, "allow_unsigned": True})
        got["runners"] = await client.call_tool("runners", {})
        got["resources"] = [str(r.uri) for r in (await client.list_resources()).resources]
        got["resource"] = await client.read_resource(f"kakeya://results/{rid}")
        got["preset"] = await client.read_resource("kakeya://presets/work")
        return got

    runner = runner_process(world, url, "m1")
    try:
        got = anyio.run(session, world, url, script)
    finally:
        stop(runner)
    (world.tmp / "transcript.txt").write_text("\n".join(transcript))  # for the record (docs/agents.md)

    tools = got["tools"]
    assert set(tools) == set(TOOLS)
    request_schema = tools["request"].input_schema
    assert request_schema["properties"]["preset"]["enum"] == ["cpuonly", "plot", "strict", "work"]
    work = next(
        c["then"] for c in request_schema["allOf"] if c["if"]["properties"]["preset"]["const"] == "work"
    )
    seconds = work["properties"]["params"]["properties"]["seconds"]
    assert (seconds["type"], seconds["minimum"], seconds["maximum"]) == ("number", 0, 120)

    for key, words in (
        ("bad_preset", "unknown preset 'plott'; did you mean 'plot'?"),
        ("bad_param", "parameter seconds=500 must be between 0.0 and 120.0"),
        ("bad_pattern", "parameter tag='A;rm -rf' must match the pattern"),
        ("bad_arg", "sudo"),
    ):
        assert got[key].is_error and words in got[key].content[0].text, (key, got[key].content[0].text)

    assert got["gate_before"].structured_content["passed"] is False
    request = got["request"]
    assert not request.is_error, request.content[0].text
    rid = request.structured_content["id"]
    assert request.structured_content["result"]["status"] == "succeeded"
    messages = [m for _, m in got["events"]]
    assert [p for p, _ in got["events"]] == sorted({p for p, _ in got["events"]})  # increasing
    assert any("claimed by m1" in (m or "") for m in messages), messages
    assert any("running" in (m or "") and "step" in (m or "") for m in messages), messages
    assert messages[-1] == f"{rid}: done"

    results = got["results"]
    images = [c for c in results.content if c.type == "image"]
    assert len(images) == 1 and base64.b64decode(images[0].data) == base64.b64decode(PNG_B64)  # fake.png: no
    assert results.structured_content["verdict"] == "pass"
    assert any(c.type == "text" and "Gate" in c.text for c in results.content)
    assert got["status"].structured_content["state"] == "succeeded"
    assert got["gate_after"].structured_content["passed"] is True
    assert got["evidence"].structured_content["outcomes"][0]["request_id"] == rid
    assert [r["name"] for r in got["runners"].structured_content["runners"]] == ["m1"]
    assert f"kakeya://results/{rid}" in got["resources"] and "kakeya://presets/plot" in got["resources"]
    assert json.loads(got["resource"].contents[0].text)["verdict"] == "pass"
    assert json.loads(got["preset"].contents[0].text)["params"]["properties"]["mode"]["enum"] == [
        "count", "sleep", "once"]  # fmt: skip


def test_the_tools_and_resources_in_process(world: Env, daemon: Daemon):
    """The same server, connected in process (the SDK's direct dispatcher): the tools the stdio test does
    not call, evidence_for requesting and following with progress, idempotent retries, resources."""
    write_plot_preset(world)
    git(world.project, "add", "-A")
    git(world.project, "commit", "-qm", "plot")
    head = git(world.project, "rev-parse", "HEAD")
    url = daemon.repo()
    progress: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    async def script(client: Any) -> dict[str, Any]:
        got: dict[str, Any] = {}
        for name, args in (
            ("presets", {}),
            ("preset", {"name": "plot"}),
            ("queued", {"preset": "work", "runner": ["gpu", "cpu"], "idempotency_key": "k", "queue_timeout_s": 600}),
            ("again", {"preset": "work", "runner": ["gpu", "cpu"], "idempotency_key": "k"}),
            ("other", {"preset": "work", "params": {"tag": "zz"}, "runner": ["gpu", "cpu"], "idempotency_key": "k"}),
        ):  # fmt: skip
            got[name] = await client.call_tool(
                "request" if name in ("queued", "again", "other") else name, args
            )
        queued = got["queued"].structured_content["id"]
        got["waited"] = await client.call_tool(
            "request", {"preset": "work", "runner": "gpu", "wait": True, "timeout_s": 0.5}
        )  # no gpu runner: the wait times out, the request stays
        got["one"] = await client.call_tool("status", {"id": queued})
        got["bad_arg"] = await client.call_tool("status", {"id": 5})
        got["cancel"] = await client.call_tool("cancel", {"id": queued, "reason": "test"})
        got["status"] = await client.call_tool("status", {})
        got["unknown"] = await client.call_tool("nope", {})
        runner = runner_process(world, url, "p1")
        try:
            got["evidence"] = await client.call_tool(
                "evidence_for",
                {"subject": head, "require": ["plot@cpu"], "request_missing": True, "wait": True,
                 "allow_unsigned": True},
                progress_callback=on_progress,
            )  # fmt: skip
            rid = got["evidence"].structured_content["requested"]["plot@cpu"]
            got["wait"] = await client.call_tool("wait", {"id": rid, "timeout_s": 60})
            got["results"] = await client.call_tool("results", {"id": rid})
            got["gate"] = await client.call_tool(
                "gate_pr", {"subject": head, "require": ["plot@cpu", "work@gpu"], "allow_unsigned": True}
            )
            got["runners"] = await client.call_tool("runners", {"all": True})
        finally:
            stop(runner)
        got["resources"] = [str(r.uri) for r in (await client.list_resources()).resources]
        got["templates"] = [
            t.uri_template for t in (await client.list_resource_templates()).resource_templates
        ]
        got["presets_doc"] = await client.read_resource("kakeya://presets")
        got["preset_doc"] = await client.read_resource("kakeya://presets/plot")
        got["result_doc"] = await client.read_resource(f"kakeya://results/{rid}")
        try:
            await client.read_resource("kakeya://elsewhere")
        except Exception as exc:  # noqa: BLE001 - the SDK's error for a failed read
            got["bad_resource"] = str(exc)
        return got

    async def connect() -> dict[str, Any]:
        async with Client(build(Tools(remote=url))) as client:
            return await script(client)

    got = anyio.run(connect)
    assert main(["mcp", "--project", str(world.tmp / "nowhere")]) == 2
    assert [p["name"] for p in got["presets"].structured_content["presets"]] == [
        "cpuonly",
        "plot",
        "strict",
        "work",
    ]
    assert got["preset"].structured_content["params"] == {
        "type": "object", "properties": {}, "required": [], "additionalProperties": False}  # fmt: skip
    queued = got["queued"].structured_content
    assert queued["runner"] == "gpu"  # no live runner yet: the first label
    assert got["again"].structured_content["id"] == queued["id"]
    assert got["other"].is_error and f"was used for request {queued['id']}" in got["other"].content[0].text
    assert got["cancel"].structured_content == {"id": queued["id"], "was": "requested", "cancelled": True}
    waited = got["waited"]
    assert waited.is_error and "timed out after 0.5 s waiting for" in waited.content[0].text
    assert got["one"].structured_content["state"] == "requested"
    assert (
        got["bad_arg"].is_error
        and "tool status: id: Input should be a valid string" in got["bad_arg"].content[0].text
    )
    assert sorted(r["state"] for r in got["status"].structured_content["requests"]) == [
        "cancelled",
        "requested",
    ]
    assert got["unknown"].is_error and "unknown tool 'nope'" in got["unknown"].content[0].text
    evidence = got["evidence"].structured_content
    assert evidence["passed"] is True and evidence["pending"] == {}
    rid = evidence["requested"]["plot@cpu"]
    assert any(m.startswith(f"{rid}: running") for m in progress) and progress[-1] == f"{rid}: done"
    assert got["wait"].structured_content["verdict"] == "pass"
    assert any(c.type == "image" for c in got["wait"].content)
    assert any(c.type == "image" for c in got["results"].content)
    gate = got["gate"].structured_content
    assert gate["passed"] is False and [o["status"] for o in gate["outcomes"]] == ["pass", "missing"]
    assert json.loads(got["preset_doc"].contents[0].text)["name"] == "plot"
    assert "p1" in [r["name"] for r in got["runners"].structured_content["runners"]]
    assert f"kakeya://results/{rid}" in got["resources"]
    assert got["templates"] == ["kakeya://presets/{name}", "kakeya://results/{id}"]
    assert len(json.loads(got["presets_doc"].contents[0].text)) == 4
    assert got["result_doc"].contents[1].mime_type == "text/markdown"
    assert "unknown resource 'kakeya://elsewhere'" in got["bad_resource"]


def test_mcp_takes_ids_as_the_cli_does_and_a_bad_one_is_bad_id(world: Env, daemon: Daemon):
    """Over stdio: status, wait, results and cancel take a unique prefix of an id or its six-hex suffix (as
    `kakeya status ID` does); a string that is no id is code `bad-id`, one that matches nothing `not-found`."""
    url = daemon.repo()

    async def script(client: Any) -> dict[str, Any]:
        got: dict[str, Any] = {}
        made = await client.call_tool("request", {"preset": "work", "runner": "gpu"})  # no gpu runner: queued
        rid = made.structured_content["id"]
        suffix, prefix = rid.rsplit("-", 1)[1], rid[:15]
        got["rid"] = rid
        got["by_suffix"] = await client.call_tool("status", {"id": suffix})
        got["by_prefix"] = await client.call_tool("status", {"id": prefix})
        got["wait"] = await client.call_tool("wait", {"id": suffix, "timeout_s": 0.5})
        got["results"] = await client.call_tool("results", {"id": prefix})
        got["cancel"] = await client.call_tool("cancel", {"id": suffix, "reason": "by suffix"})
        got["bad"] = await client.call_tool("status", {"id": "zz/../x"})
        got["bad_results"] = await client.call_tool("results", {"id": "refs/heads/kakeya"})
        got["none"] = await client.call_tool("status", {"id": "fda52c" if suffix != "fda52c" else "fda52d"})
        return got

    got = anyio.run(session, world, url, script)
    rid = got["rid"]
    for key in ("by_suffix", "by_prefix"):
        assert not got[key].is_error, got[key].content[0].text
        assert (
            got[key].structured_content["id"] == rid and got[key].structured_content["state"] == "requested"
        )
    assert (
        got["wait"].is_error and f"waiting for {rid}" in got["wait"].content[0].text
    )  # resolved, then waited
    assert got["results"].structured_content["code"] == "not-done", got["results"].content[0].text
    assert got["cancel"].structured_content == {"id": rid, "was": "requested", "cancelled": True}
    for key in ("bad", "bad_results"):
        assert got[key].is_error and got[key].structured_content["code"] == "bad-id", got[key].content[0].text
    assert got["none"].structured_content["code"] == "not-found"


def test_outside_a_git_project_mcp_and_bus_verbs_refuse_and_write_nothing(world: Env, tmp_path: Path, capsys):
    """`kakeya mcp` started elsewhere (as MCP clients start servers), and every verb that would read or write a
    bus, outside a git checkout: one line, `not in a git project: pass --project DIR`, exit 2, and no
    .kakeya/ (no client.git, no embedded bus) in that directory. With --project DIR they work from anywhere."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "bridge.cli", "mcp"],
        cwd=elsewhere,
        env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT))},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        f"kakeya: error: not in a git project: pass --project DIR ({elsewhere} is not in a git checkout)"
    ]
    os.chdir(elsewhere)
    bus = str(world.project / ".kakeya" / "bus.git")
    for argv in (
        ["status"],
        ["status", "--remote", bus],
        ["status", "abcdef", "--json"],
        ["request", "work", "--runner", "cpu"],
        ["results", "abcdef"],
        ["wait", "abcdef"],
        ["cancel", "abcdef"],
        ["runners"],
        ["run", "work"],
        ["bus", "gc", "--older-than", "30"],
        ["gate", "pr", "--subject", "HEAD", "--require", "work@cpu"],
        ["evidence", "HEAD"],
        ["history", "work@cpu"],
        ["mcp", "--project", str(elsewhere)],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "not in a git project: pass --project DIR" in err and len(err.splitlines()) == 1, (argv, err)
    assert not (elsewhere / ".kakeya").exists() and list(elsewhere.iterdir()) == []
    # --project names the checkout from anywhere
    assert main(["status", "--project", str(world.project), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert list(elsewhere.iterdir()) == []
