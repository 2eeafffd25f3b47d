"""`kakeya mcp`: a Model Context Protocol server over stdio (the official `mcp` SDK), for any MCP client.

Tools: presets, preset, request (with `wait`: MCP progress notifications from the bus's progress events),
wait, status, results (verdict, summary, the result's fields, plots as image content), logs, cancel, runners,
gate_pr, evidence_for. Resources: kakeya://presets, kakeya://presets/<name>, kakeya://results/<id> (the
finished requests of the last two days). Every tool's input schema is its argument model's JSON Schema with
the preset registry written in: the preset names, the runner labels, and each preset's parameters
(`Preset.params_schema`: real minimum/maximum/enum/pattern). The tools call what the CLI verbs call
(bridge/client/client.py, bridge/client/follow.py, bridge/evidence/service.py), never the `kakeya` command;
a KakeyaError or a bad argument is a tool result with isError and the message (the problem named), never a
crash.

    kakeya mcp --project DIR [--remote R]   # the bus and presets are those `kakeya request` uses in DIR
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import mcp_types as T
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from bridge.bus.presence import read_presences
from bridge.bus.progress import bar, say
from bridge.bus.records import RUNNERS_PREFIX, utcnow
from bridge.bus.trust import trusted_signers
from bridge.cli.commands._common import label_note, out_dir, unsent_warning
from bridge.client.client import Client
from bridge.client.follow import follow_all
from bridge.client.logs import snapshot
from bridge.client.rows import row_dict
from bridge.config import MAX_TTL, load_config, project_root
from bridge.core.errors import InvalidRequest, KakeyaError, problems
from bridge.core.text import clean, clean_json
from bridge.evidence import service
from bridge.presets.preset import Preset
from bridge.presets.registry import get_preset, load_registry
from bridge.results.render import verdict_line

PNG = b"\x89PNG\r\n\x1a\n"
MAX_IMAGES, MAX_IMAGE_BYTES = 8, 2 * 1024 * 1024  # plots given as image content; larger ones by path only
MAX_TEXT = 20_000  # characters of summary.md in a tool result
Progress = Callable[[dict[str, Any]], None]


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NoArgs(_Args):
    pass


class PresetArgs(_Args):
    name: str = Field(description="the preset's name")


class RequestArgs(_Args):
    preset: str = Field(description="the preset to run")
    params: dict[str, JsonValue] = Field(default={}, description="the preset's parameters (defaults filled)")
    runner: str | list[str] | None = Field(
        default=None,
        description="runner label, or labels in order of preference (the first with a live runner wins); "
        "default: the preset's labels in order",
    )
    subject: str | None = Field(default=None, description="the commit to run (default: HEAD, a clean tree)")
    idempotency_key: str | None = Field(
        default=None, description="retry safely: the same key and content returns the first request"
    )
    queue_timeout_s: float | None = Field(
        default=None, gt=0, le=MAX_TTL.total_seconds(), description="expire unless started within this"
    )
    wait: bool = Field(
        default=False, description="follow it until done (progress notifications), then results"
    )
    timeout_s: float | None = Field(default=None, gt=0, description="with wait: stop waiting after this")


class IdArgs(_Args):
    id: str = Field(
        description="the request id, a unique prefix of it (20261125T1615...) or its six-hex suffix (663f0b)"
    )


class WaitArgs(IdArgs):
    timeout_s: float | None = Field(
        default=None, gt=0, description="stop waiting after this (the run goes on)"
    )


class LogsArgs(IdArgs):
    tail_chars: int = Field(
        default=20_000, ge=1, le=1_000_000, description="at most the last N of each stream"
    )


class StatusArgs(_Args):
    id: str | None = Field(
        default=None,
        description="one request: its id, a unique prefix or its six-hex suffix (default: live and recent ones)",
    )


class CancelArgs(IdArgs):
    reason: str = Field(default="", max_length=500)


class RunnersArgs(_Args):
    all: bool = Field(default=False, description="also runners that stopped or aged out")


class GateArgs(_Args):
    subject: str = Field(default="HEAD", description="the commit: a full sha, or a rev of the project")
    require: list[str] | None = Field(
        default=None,
        description="'PRESET[@LABEL] [PARAM OP VALUE ...]' entries (default: .github/kakeya-required.yml)",
    )
    allow_unsigned: bool = Field(
        default=False, description="accept unsigned evidence on a shared bus with no allowed-signers file"
    )


class EvidenceArgs(GateArgs):
    request_missing: bool = Field(default=False, description="request every missing run at once")
    wait: bool = Field(default=False, description="follow the requested and pending runs, then judge again")
    timeout_s: float | None = Field(default=None, gt=0, description="with wait: stop waiting after this")


TOOLS: dict[str, tuple[type[_Args], str]] = {
    "presets": (NoArgs, "The preset allowlist: each preset's labels, parameters (JSON Schema) and gate."),
    "preset": (PresetArgs, "One preset: description, runner labels, parameters (JSON Schema), gate checks."),
    "request": (
        RequestArgs,
        "Ask a runner for a run of a preset on a commit; with wait, follow it to the end.",
    ),
    "wait": (WaitArgs, "Follow a request until it is done (progress notifications), then its results."),
    "status": (StatusArgs, "The state of one request, or of the live and recent ones."),
    "results": (IdArgs, "A finished request's verdict, gate checks, summary and plots (images)."),
    "logs": (
        LogsArgs,
        "A run's stdout/stderr: while it runs, what its heartbeats carried so far; once done, the final "
        "logs (redacted, control characters removed).",
    ),
    "cancel": (CancelArgs, "Cancel a request (a running one is stopped and ends as cancelled)."),
    "runners": (RunnersArgs, "The runners present on the bus: labels, host, accelerator, what they serve."),
    "gate_pr": (GateArgs, "Re-gate the evidence the bus holds for a commit, like the pull-request check."),
    "evidence_for": (
        EvidenceArgs,
        "What evidence a commit needs, what the bus holds, what is pending; optionally request what is "
        "missing and wait for all of it.",
    ),
}


def input_schema(name: str, registry: Mapping[str, Preset]) -> dict[str, Any]:
    """The JSON Schema of tool `name`'s arguments, with the registry written in: preset names as an enum,
    runner labels as an enum, and (request) each preset's parameters as `Preset.params_schema`."""
    model, _ = TOOLS[name]
    schema = model.model_json_schema()
    schema.pop("title", None)
    props = schema.get("properties", {})
    for prop in props.values():
        prop.pop("title", None)
    names = sorted(registry)
    labels = sorted({lb for p in registry.values() for lb in p.runners})
    if name == "preset":
        props["name"]["enum"] = names
    if name == "request":
        props["preset"]["enum"] = names
        label = {"type": "string", "enum": labels}
        props["runner"]["anyOf"] = [label, {"type": "array", "items": label, "minItems": 1}, {"type": "null"}]
        schema["allOf"] = [
            {
                "if": {"properties": {"preset": {"const": n}}, "required": ["preset"]},
                "then": {"properties": {"params": registry[n].params_schema()}},
            }
            for n in names
        ]
    if name in ("gate_pr", "evidence_for"):
        props["require"]["description"] += "; presets: " + ", ".join(
            f"{n} (on {', '.join(registry[n].runners)})" for n in names
        )
    return schema


class Tools:
    """The tools, as plain functions of validated arguments (run in a worker thread): each returns its
    content blocks and structured result; errors are KakeyaError."""

    def __init__(self, remote: str | None = None, root: Path | None = None):
        self.remote = remote
        self.root = root or project_root()

    def registry(self) -> dict[str, Preset]:
        return load_registry()

    def client(self) -> Client:
        return Client(load_config(self.root), self.root, remote=self.remote)

    def call(self, name: str, arguments: Mapping[str, Any], progress: Progress) -> tuple[list[Any], Any]:
        if name not in TOOLS:
            raise InvalidRequest(f"unknown tool {name!r} (tools: {', '.join(TOOLS)})")
        model, _ = TOOLS[name]
        try:
            args = model.model_validate(dict(arguments))
        except ValidationError as exc:
            raise InvalidRequest(f"tool {name}: {problems(exc, 'arguments')}") from None
        data = clean_json(
            getattr(self, name)(args, progress)
        )  # a run's text and the bus's: bridge/core/text.py
        return [text(json.dumps(data, indent=2))], data

    # --- the tools ---------------------------------------------------------------------------------

    def presets(self, args: NoArgs, progress: Progress) -> Any:
        return {"presets": [p.summary() for p in self.registry().values()]}

    def preset(self, args: PresetArgs, progress: Progress) -> Any:
        return get_preset(self.registry(), args.name).summary()

    def request(self, args: RequestArgs, progress: Progress) -> Any:
        registry = self.registry()
        preset = get_preset(registry, args.preset)
        c = self.client()
        manifest = c.request(
            preset.name,
            args.params,
            args.runner or preset.runners,
            subject=args.subject,
            expires_s=args.queue_timeout_s,
            registry=registry,
            idempotency_key=args.idempotency_key,
        )
        if c.unsent:  # on stderr, as the CLI says it
            say(unsent_warning(c.unsent))
        note = label_note(c.label_choice)
        out: dict[str, Any] = {
            "id": manifest.id,
            "runner": manifest.runner,
            "subject": manifest.subject,
            "expires_at": manifest.expires_at.isoformat(),
            "reused": c.reused,  # an idempotent retry: the request made earlier with this key
            **({"label_note": note} if note and not c.reused else {}),
        }
        if args.wait:
            out["result"] = self.outcome(c, manifest.id, args.timeout_s, progress)
        return out

    def wait(self, args: WaitArgs, progress: Progress) -> Any:
        c = self.client()
        return self.outcome(c, c.resolve_id(args.id), args.timeout_s, progress)

    def status(self, args: StatusArgs, progress: Progress) -> Any:
        c = self.client()
        if args.id:
            return row_dict(c.status_one(c.resolve_id(args.id)))
        return {"requests": [row_dict(r) for r in c.status(fetch=True)]}

    def results(self, args: IdArgs, progress: Progress) -> Any:
        c = self.client()
        return self.result(c, c.resolve_id(args.id))

    def logs(self, args: LogsArgs, progress: Progress) -> Any:
        c = self.client()
        return snapshot(c, c.resolve_id(args.id), args.tail_chars)

    def cancel(self, args: CancelArgs, progress: Progress) -> Any:
        c = self.client()
        rid = c.resolve_id(args.id)
        return {"id": rid, "was": c.cancel(rid, args.reason), "cancelled": True}

    def runners(self, args: RunnersArgs, progress: Progress) -> Any:
        c = self.client()
        snap = c.bus.ls_remote(RUNNERS_PREFIX)
        now = utcnow()
        seen = read_presences(c.bus, snap.runners, trusted_signers(c.root) if c.in_repo else None)
        shown = [s for s in seen if args.all or s.state(now) not in ("stopped", "stale")]
        return {"runners": [s.as_dict(now) for s in shown]}

    def gate_pr(self, args: GateArgs, progress: Progress) -> Any:
        registry = self.registry()
        c = self.client()
        reqs = service.requirements(c, args.require, registry)
        subject = service.subject_sha(c, args.subject)
        outcomes = service.judge(
            c, subject, reqs, registry, service.signers_for(c, None, args.allow_unsigned)
        )
        return {
            "subject": subject,
            "passed": all(o.passed for o in outcomes),
            "outcomes": [o.as_dict() for o in outcomes],
        }

    def evidence_for(self, args: EvidenceArgs, progress: Progress) -> Any:
        registry = self.registry()
        c = self.client()
        reqs = service.requirements(c, args.require, registry)
        subject = service.subject_sha(c, args.subject)
        signers = service.signers_for(c, None, args.allow_unsigned)
        outcomes = service.judge(c, subject, reqs, registry, signers)
        pending = service.pending(c, subject, outcomes, registry)
        made = (
            service.request_missing(c, subject, outcomes, registry, pending) if args.request_missing else {}
        )
        requested = {req: m.id for req, m in made.items()}
        if args.wait and (pending or requested):
            self.follow(c, [*pending.values(), *requested.values()], args.timeout_s, progress)
            outcomes = service.judge(c, subject, reqs, registry, signers)
        return {
            "subject": subject,
            "passed": all(o.passed for o in outcomes),
            "pending": pending,
            "requested": requested,
            "outcomes": [o.as_dict() for o in outcomes],
        }

    # --- shared ------------------------------------------------------------------------------------

    def follow(self, c: Client, ids: list[str], timeout: float | None, progress: Progress) -> dict[str, Any]:
        """Follow `ids` to their ends, each event a progress notification; the last event."""
        last: dict[str, Any] = {}
        for last in follow_all(c, ids, timeout):
            progress(last)
        return last

    def outcome(self, c: Client, rid: str, timeout: float | None, progress: Progress) -> dict[str, Any]:
        """Follow one request to its end: its results when it finished, else how it ended (a request that
        expired or was cancelled before any runner claimed it has no results: its state says so)."""
        last = self.follow(c, [rid], timeout, progress)
        if last.get("event") == "finished":
            return self.result(c, rid)
        return {"id": rid, "state": last.get("event"), "ended": last}

    def result(self, c: Client, rid: str) -> dict[str, Any]:
        """Fetch a finished request's files into out/<id> (as `kakeya results`) and say what they hold."""
        out = out_dir(c.root, None, rid)
        result = c.results(rid, out)
        return {
            "id": rid,
            "line": verdict_line(rid, result),
            "status": result.status,
            "verdict": result.verdict,
            "reason": result.reason,
            "out": str(out),
            "checks": read_json(out / "verdict.json"),
            "plots": [str(p) for p in sorted(out.rglob("*.png"))],
        }


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None


def text(body: str) -> T.TextContent:
    return T.TextContent(type="text", text=clean(body, multiline=True))


def result_content(data: Mapping[str, Any]) -> list[Any]:
    """What a finished request's results add to a tool result: its summary, and its plots as images (real
    PNG files only, at most MAX_IMAGES of at most MAX_IMAGE_BYTES each: a run's files are untrusted)."""
    out: list[Any] = [text(data["line"])]
    summary = Path(data["out"]) / "summary.md"
    if summary.is_file():
        out.append(text(summary.read_text(errors="replace")[:MAX_TEXT]))
    for png in data["plots"][:MAX_IMAGES]:
        raw = Path(png).read_bytes()[: MAX_IMAGE_BYTES + 1]
        if raw.startswith(PNG) and len(raw) <= MAX_IMAGE_BYTES:
            out.append(
                T.ImageContent(type="image", data=base64.b64encode(raw).decode(), mime_type="image/png")
            )
    return out


def event_line(e: Mapping[str, Any]) -> str:
    """One line for a progress notification (its text cleaned: bridge/core/text.py)."""
    return clean(event_words(e))


def event_words(e: Mapping[str, Any]) -> str:
    kind, rid = e["event"], e["id"]
    if kind == "queued" and "position" in e:
        who = f"live runners: {', '.join(e['runners'])}" if e["runners"] else "no live runner"
        return f"{rid}: queued, position {e['position']} on {e['label']}; {who}"
    if kind == "claimed":
        return f"{rid}: claimed by {e['runner']} on {e['host']}"
    if kind in ("running", "gating", "queued"):
        w = e.get("workload")
        work = f" {bar(w['done'], w['total'])}{' ' + w['what'] if w['what'] else ''}" if w else ""
        return f"{rid}: {kind}{work} ({e['elapsed_s']:.0f} s)"
    if kind == "no-runner":
        return f"{rid}: no live runner serves label {e['label']!r}; still waiting"
    if kind == "finished":
        return f"{rid}: done"
    return f"{rid}: {kind}"


# --- resources ----------------------------------------------------------------------------------------


def resources(tools: Tools) -> list[T.Resource]:
    out = [T.Resource(name="presets", uri="kakeya://presets", mime_type="application/json")]
    out += [
        T.Resource(
            name=f"preset {n}",
            uri=f"kakeya://presets/{n}",
            description=p.description,
            mime_type="application/json",
        )  # fmt: skip
        for n, p in tools.registry().items()
    ]
    finished = [r for r in tools.client().status() if r.refs.get("done")]
    out += [
        T.Resource(
            name=f"result {r.id}",
            uri=f"kakeya://results/{r.id}",
            description=f"{r.preset}: {r.state}",
            mime_type="application/json",
        )  # fmt: skip
        for r in finished
    ]
    return out


def read_resource(tools: Tools, uri: str) -> list[T.TextResourceContents]:
    def doc(body: Any) -> T.TextResourceContents:
        body = clean_json(body)
        return T.TextResourceContents(uri=uri, mime_type="application/json", text=json.dumps(body, indent=2))

    if uri == "kakeya://presets":
        return [doc([p.summary() for p in tools.registry().values()])]
    if uri.startswith("kakeya://presets/"):
        return [doc(get_preset(tools.registry(), uri.removeprefix("kakeya://presets/")).summary())]
    if uri.startswith("kakeya://results/"):
        data = tools.result(tools.client(), uri.removeprefix("kakeya://results/"))
        summary = Path(data["out"]) / "summary.md"
        return [doc(data)] + (
            [
                T.TextResourceContents(
                    uri=uri, mime_type="text/markdown", text=clean(summary.read_text(errors="replace"), True)
                )
            ]
            if summary.is_file()
            else []
        )
    raise InvalidRequest(
        f"unknown resource {uri!r} (kakeya://presets, kakeya://presets/NAME, kakeya://results/ID)"
    )


# --- the server ---------------------------------------------------------------------------------------


def build(tools: Tools) -> Server:
    async def list_tools(ctx: Any, params: Any) -> T.ListToolsResult:
        registry = await anyio.to_thread.run_sync(tools.registry)
        return T.ListToolsResult(
            tools=[
                T.Tool(name=name, description=desc, input_schema=input_schema(name, registry))
                for name, (_, desc) in TOOLS.items()
            ]
        )

    async def call_tool(ctx: Any, params: T.CallToolRequestParams) -> T.CallToolResult:
        count = 0

        def progress(event: dict[str, Any]) -> None:  # from the worker thread
            nonlocal count
            count += 1
            anyio.from_thread.run(ctx.session.report_progress, float(count), None, event_line(event))

        def work() -> T.CallToolResult:
            try:
                content, data = tools.call(params.name, params.arguments or {}, progress)
            except KakeyaError as exc:  # the message names the problem; `code` and `hint` where it has them
                error = {"error": type(exc).__name__, "message": clean(str(exc))}
                error.update({k: v for k in ("code", "hint") if (v := getattr(exc, k, None))})
                return T.CallToolResult(
                    content=[text(f"{type(exc).__name__}: {exc}")], structured_content=error, is_error=True
                )
            done = data.get("result") if params.name == "request" else data
            if params.name in ("request", "wait", "results") and done and "line" in done:
                content += result_content(done)
            return T.CallToolResult(content=content, structured_content=data)

        return await anyio.to_thread.run_sync(work)

    async def list_resources(ctx: Any, params: Any) -> T.ListResourcesResult:
        return T.ListResourcesResult(resources=await anyio.to_thread.run_sync(resources, tools))

    async def list_templates(ctx: Any, params: Any) -> T.ListResourceTemplatesResult:
        return T.ListResourceTemplatesResult(
            resource_templates=[
                T.ResourceTemplate(name="preset", uri_template="kakeya://presets/{name}"),
                T.ResourceTemplate(name="result", uri_template="kakeya://results/{id}"),
            ]
        )

    async def read(ctx: Any, params: T.ReadResourceRequestParams) -> T.ReadResourceResult:
        try:
            contents = await anyio.to_thread.run_sync(read_resource, tools, str(params.uri))
        except KakeyaError as exc:  # an error the client sees with its message, not "internal error"
            raise MCPError(T.INVALID_PARAMS, f"{type(exc).__name__}: {exc}") from None
        return T.ReadResourceResult(contents=contents)

    return Server(
        "kakeya",
        instructions="Request hardware runs of allowlisted presets through the Kakeya bus and gate their "
        "evidence. `presets` lists what can run; `request` with wait=true follows a run to its verdict.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read,
    )


def serve(remote: str | None = None, root: Path | None = None) -> None:
    """Serve MCP on stdin/stdout until the client closes it."""
    tools = Tools(remote, root)
    server = build(tools)

    async def main() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    anyio.run(main)
